"""Task 6: shard the optimizer state over the ranks (ZeRO stage 1).

    python check.py 6                                          # check your work
    python check.py 6
    torchrun --standalone --nproc_per_node=2 train_ddp.py --shard optimizer --optimizer adamw

Data parallelism keeps a full copy of the optimizer state on every rank: with Adam, two
fp32 tensors the size of the model (exp_avg and exp_avg_sq), twice the parameters' own
memory. Yet every rank computes exactly the same update from the same averaged gradients.
ShardedOptimizer splits that work: each rank owns a shard of the parameters, keeps the
optimizer state for its shard only and updates only its shard; then every rank sends the
parameters it updated to all the others, so every rank still holds the whole model.

    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss.backward(); average_gradients(model)      # Task 2.2: gradients averaged as before
    optimizer.step()                               # own shard updated, then shared

    Task 6.1  partition_parameters  a balanced split of the parameters, the same on every rank
    Task 6.2  shard_param_group     the local optimizer gets this rank's shard of each group
    Task 6.3  step                  update the own shard, then send it to every rank

A small version of PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer, with the same
calling pattern. Simplified: the default process group only; one broadcast per parameter
(ZeroRedundancyOptimizer packs them into buckets); state_dict() gathers the whole state on
every rank instead of one rank.
"""
import torch
import torch.distributed as dist


def partition_parameters(params, world_size, loads=None):
    """Assign each parameter to a rank, balancing the number of elements per rank.

    params: a list of tensors. world_size: the number of ranks. loads: how many elements each
    rank already owns (from earlier parameter groups), a list of world_size ints, updated in
    place; None means all zero.
    Returns owners, a list as long as params: owners[i] is the rank that owns params[i].

    The split must be identical on every rank, because every rank must agree on who sends
    which parameter: it may depend only on the parameters' sizes and their order in params,
    never on this rank's number, object ids (a set of tensors is ordered by id) or randomness.
    The reference answer is greedy, as ZeroRedundancyOptimizer's: take the parameters largest
    first (ties in their order in params) and give each to the rank with the fewest elements so
    far (the lowest rank on ties). Any split is fine whose largest shard holds at most
    sum/world_size plus one parameter's worth of elements.
    """
    if loads is None:
        loads = [0] * world_size
    # --- Task 6.1 begin ---
    # TODO Task 6.1: give each parameter, largest first, to the rank with the fewest elements so far
    raise NotImplementedError("Task 6.1: partition_parameters() in template_zero.py is not done yet (docs/task6-zero.md)")
    # --- Task 6.1 end ---


class ShardedOptimizer(torch.optim.Optimizer):
    """Wrap any optimizer so that each rank keeps and updates only its shard of the parameters.

        ShardedOptimizer(params, optimizer_cls, **kwargs)

    params: parameters or parameter groups, as for any optimizer, the same on every rank and in
    the same order. optimizer_cls: the optimizer to run on each shard (torch.optim.SGD, Adam,
    AdamW, ...), built as optimizer_cls(<this rank's shard>, **kwargs).

    - param_groups lists every parameter, as the unsharded optimizer's would, and zero_grad()
      clears every gradient: every rank still computes all of them.
    - self.optim is the local optimizer (ZeroRedundancyOptimizer's name for it): it holds this
      rank's shard only, and self.state is its state, about 1/world_size of the full state.
    - self.param_to_rank maps each parameter to the rank that owns it.
    - step() changes every rank's parameters identically; it is a collective, so every rank
      must call it (also state_dict()).
    - Change hyperparameters in self.param_groups (a learning-rate scheduler does): step()
      passes them on to the local optimizer.
    """

    def __init__(self, params, optimizer_cls, **kwargs):
        if not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer needs a process group: call dist.init_process_group first")
        self.optimizer_cls = optimizer_cls
        self.optimizer_kwargs = kwargs
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.optim = None  # the local optimizer, built by the first add_param_group
        self.param_to_rank = {}
        self.loads = [0] * self.world_size  # elements owned by each rank, over all groups
        # Optimizer.__init__ calls self.add_param_group for each group: the sharding happens there
        super().__init__(params, defaults=kwargs)
        self.state = self.optim.state  # this rank's shard's state only

    def add_param_group(self, param_group):
        """Add a parameter group, as on any optimizer: listed whole in self.param_groups, sharded for self.optim.

        Called by __init__ for each group of params, and later by the user (for example to train
        layers that were frozen until then).
        """
        super().add_param_group(param_group)  # checks it and fills in the defaults
        param_group = self.param_groups[-1]
        self.shard_param_group(param_group)
        # The local optimizer filled in its own defaults (Adam's betas, ...): show them here too,
        # so param_groups reads as the unsharded optimizer's would.
        for key, value in self.optim.param_groups[-1].items():
            param_group.setdefault(key, value)

    def shard_param_group(self, param_group):
        """Split a new group's parameters over the ranks, and give this rank's shard to self.optim.

        param_group: the group just added to self.param_groups (a dict: "params", a list of
        tensors, and its options such as "lr"). Split its parameters with partition_parameters
        (self.loads carries the earlier groups' sizes, so the shards stay balanced over all
        groups) and record each one's owner in self.param_to_rank. The parameters this rank owns,
        with the group's own options, become a new group of the local optimizer self.optim:
        build self.optim on the first call, optimizer_cls([local group], **self.optimizer_kwargs),
        and add to it on later calls. Every group, also one added after __init__, must be
        sharded: self.optim may never see a parameter this rank does not own. A rank may own
        none of a group's parameters: give self.optim the group all the same, with an empty
        params list, so that group i of self.param_groups is group i of self.optim.param_groups.
        """
        # --- Task 6.2 begin ---
        # TODO Task 6.2: partition the group, record each owner in self.param_to_rank, give this rank's shard to self.optim
        raise NotImplementedError("Task 6.2: shard_param_group() in template_zero.py is not done yet (docs/task6-zero.md)")
        # --- Task 6.2 end ---

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        """Update this rank's shard with the local optimizer, then give every rank every parameter.

        closure and kwargs go to the local optimizer's step (returns its loss). The gradients
        must already be averaged over the ranks (Task 2.2), as for the unsharded optimizer.
        After the local step, each parameter's new value goes from its owner
        (self.param_to_rank) to every other rank: dist.broadcast from the owner, or an
        all-gather. Every rank must then hold bit-identical parameters, equal to what the
        unsharded optimizer would give. Every rank sends and receives the parameters in the
        same order (self.param_groups'), or the collectives do not match.
        """
        self._sync_param_groups()
        # --- Task 6.3 begin ---
        # TODO Task 6.3: step the local optimizer, then dist.broadcast each parameter from its owner (or all-gather)
        raise NotImplementedError("Task 6.3: step() in template_zero.py is not done yet (docs/task6-zero.md)")
        # --- Task 6.3 end ---

    def _sync_param_groups(self):
        """Pass the hyperparameters of self.param_groups (set by a scheduler, say) to the local optimizer."""
        for group, local_group in zip(self.param_groups, self.optim.param_groups):
            for key, value in group.items():
                if key != "params":
                    local_group[key] = value

    def state_dict(self):
        """The whole optimizer state, as the unsharded optimizer's state_dict() gives it, on every rank.

        A collective: every rank must call it, even if only rank 0 saves it (rank 0 alone would
        hang). Its state tensors are on the CPU. load_state_dict() takes it, or the state_dict() of
        the unsharded optimizer, on any number of ranks.
        """
        packed = super().state_dict()  # param_groups whole; state: this rank's shard, global indices
        mine = {index: {key: value.cpu() if torch.is_tensor(value) else value for key, value in state.items()}
                for index, state in packed["state"].items()}
        shards = [None] * self.world_size
        dist.all_gather_object(shards, mine)
        merged = {}
        for shard in shards:
            merged.update(shard)
        packed["state"] = dict(sorted(merged.items()))  # in parameter order, as the unsharded optimizer's
        return packed

    def load_state_dict(self, state_dict):
        """Load a whole state (from state_dict(), or an unsharded optimizer's): each rank keeps its shard's."""
        params = [param for group in self.param_groups for param in group["params"]]
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise ValueError(f"the state has {len(state_dict['param_groups'])} parameter groups, "
                             f"this optimizer {len(self.param_groups)}")
        local_index = {param: i for i, param in enumerate(p for g in self.optim.param_groups for p in g["params"])}
        local_state = {local_index[params[index]]: state for index, state in state_dict["state"].items()
                       if params[index] in local_index}
        local_groups = []
        for saved, group, local_group in zip(state_dict["param_groups"], self.param_groups, self.optim.param_groups):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError("the state's parameter groups do not match this optimizer's")
            options = {key: value for key, value in saved.items() if key != "params"}
            group.update(options)
            local_groups.append({**options, "params": [local_index[p] for p in local_group["params"]]})
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self.optim.state  # load_state_dict gave the local optimizer a new state dict: show that one
