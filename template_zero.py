"""Task 6: shard the optimizer state over the ranks (ZeRO stage 1).

    python check.py 6                                          # check your work
    torchrun --standalone --nproc_per_node=2 train_ddp.py --shard optimizer --optimizer adamw
    docs/task6-zero.md                                         # the ideas, measured

Data parallelism keeps a full copy of the optimizer state on every rank: with Adam, two
fp32 tensors the size of the model (exp_avg and exp_avg_sq), twice the parameters' own
memory. Yet every rank computes exactly the same update from the same averaged gradients.
ShardedOptimizer splits that work: each rank owns a shard, 1/N of the elements of the
parameters, keeps the optimizer state for its shard only and updates only its shard; then
every rank sends the elements it updated to all the others, so every rank still holds the
whole model.

    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss.backward(); average_gradients(model)      # Task 2.2: gradients averaged as before
    optimizer.step()                               # own shard updated, then shared

    Task 6.1  partition_parameters  cut the parameters into N equal shards, the same on every rank
    Task 6.2  shard_param_group     the local optimizer gets views of this rank's pieces
    Task 6.3  step                  update the own shard, then send every piece to every rank

Calling pattern of PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer; the split is
DeepSpeed ZeRO's (by element, so one large parameter is split too; ZeroRedundancyOptimizer
gives each parameter whole to one rank). Simplified: the default process group only; one
broadcast per piece (real implementations pack them into buckets); state_dict() gathers the
whole state on every rank instead of one rank.
"""
import torch
import torch.distributed as dist


def partition_parameters(params, world_size):
    """Cut the parameters into world_size shards of equal numbers of elements, by element.

    params: a list of tensors. world_size: the number of ranks.
    Lay the parameters, flattened, end to end on one line of T elements (T = the sum of their
    numel()). Rank r owns elements [r * S, (r + 1) * S) of that line, S = ceil(T / world_size):
    the first ranks own S elements each, the last ones may own fewer, or none (T = 5, N = 4:
    2, 2, 1, 0). A parameter that crosses the border
    between two shards is cut in two (or more) pieces.

    Returns the pieces, in order along the line: a list of (index, start, end, rank) tuples, one
    for each part of a parameter that one rank owns: elements start..end-1 of
    params[index].view(-1) belong to rank. Every element of every parameter is in exactly one
    piece; no piece is empty. For sizes [6, 4] and 2 ranks (T = 10, S = 5):
    [(0, 0, 5, 0), (0, 5, 6, 1), (1, 0, 4, 1)].

    The split must be identical on every rank, because every rank must agree on who sends
    which piece: it may depend only on the parameters' sizes and their order in params,
    never on this rank's number, object ids (a set of tensors is ordered by id) or randomness.
    Any split is accepted in which every element has one owner and no rank owns more than S.
    """
    # --- Task 6.1 begin ---
    # TODO Task 6.1: lay the parameters end to end, cut the line every S = ceil(T / world_size) elements
    raise NotImplementedError("Task 6.1: partition_parameters() in template_zero.py is not done yet (docs/task6-zero.md)")
    # --- Task 6.1 end ---


class ShardedOptimizer(torch.optim.Optimizer):
    """Wrap any elementwise optimizer so that each rank keeps and updates only its shard of the parameters.

        ShardedOptimizer(params, optimizer_cls, **kwargs)

    params: parameters or parameter groups, as for any optimizer, the same on every rank and in
    the same order. optimizer_cls: the optimizer to run on each shard (torch.optim.SGD, Adam,
    AdamW, ...: any whose update of an element depends only on that element's own gradient and
    state, so that a cut parameter is updated exactly as a whole one), built as
    optimizer_cls(<views of this rank's pieces>, **kwargs).

    - param_groups lists every parameter, as the unsharded optimizer's would, and zero_grad()
      clears every gradient: every rank still computes all of them.
    - self.optim is the local optimizer (ZeroRedundancyOptimizer's name for it): its parameters
      are views of this rank's pieces (1-D tensors sharing the parameters' memory), and
      self.state is its state, 1/world_size of the full state.
    - self.pieces lists every piece of every group, in order: (view, param, start, end, rank).
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
        self.pieces = []
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
        for param in param_group["params"]:
            if not param.is_contiguous():  # a piece is a slice of param.view(-1), which needs one block of memory
                raise ValueError(f"ShardedOptimizer cuts parameters into pieces of param.view(-1), which needs "
                                 f"contiguous parameters; one of shape {tuple(param.shape)} is not: make it "
                                 f"contiguous before building the optimizer (param.data = param.data.contiguous())")
        self.shard_param_group(param_group)
        # The local optimizer filled in its own defaults (Adam's betas, ...): show them here too,
        # so param_groups reads as the unsharded optimizer's would.
        for key, value in self.optim.param_groups[-1].items():
            param_group.setdefault(key, value)

    def shard_param_group(self, param_group):
        """Cut a new group's parameters into pieces, and give views of this rank's pieces to self.optim.

        param_group: the group just added to self.param_groups (a dict: "params", a list of
        tensors, and its options such as "lr"). Split its parameters with partition_parameters
        and append every piece, this rank's and the others', to self.pieces as
        (view, param, start, end, rank), where view = param.detach().view(-1)[start:end]: a 1-D
        tensor that shares the parameter's memory, so that updating the view updates the
        parameter (a copy would leave the parameter as it was).
        The views of the pieces this rank owns, with the group's own options, become a new group
        of the local optimizer self.optim: build self.optim on the first call,
        optimizer_cls([local group], **self.optimizer_kwargs), and add to it on later calls.
        Every group, also one added after __init__, must be sharded: self.optim may never see
        more than this rank's pieces. A rank may own no piece of a group: give self.optim the
        group all the same, with an empty params list, so that group i of self.param_groups is
        group i of self.optim.param_groups.
        """
        # --- Task 6.2 begin ---
        # TODO Task 6.2: append every piece to self.pieces with its view; this rank's views become a group of self.optim
        raise NotImplementedError("Task 6.2: shard_param_group() in template_zero.py is not done yet (docs/task6-zero.md)")
        # --- Task 6.2 end ---

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        """Update this rank's pieces with the local optimizer, then give every rank every piece.

        closure: as for any optimizer, recomputes the loss and the gradients; call it first (with
        torch.enable_grad(): step runs under no_grad) and return its loss. kwargs go to the local
        optimizer's step. The gradients must already be averaged over the ranks (Task 2.2), as
        for the unsharded optimizer.
        1. The local optimizer steps the views, and reads their .grad: give each view of this
           rank the matching slice of its parameter's gradient, param.grad.view(-1)[start:end]
           (None if param.grad is None: the optimizer then skips it, as it would the parameter).
        2. self.optim.step().
        3. Each piece's new value goes from its owner to every other rank: dist.broadcast(view,
           src=rank) for every piece in self.pieces, in that order on every rank (or the
           collectives do not match), or an all-gather. Every rank must then hold bit-identical
           parameters, equal to what the unsharded optimizer would give.
        4. Set the views' .grad back to None: they hold the gradients' memory, which zero_grad()
           must be able to free.
        """
        self._sync_param_groups()
        self._follow_moved_parameters()
        # --- Task 6.3 begin ---
        # TODO Task 6.3: closure; gradients to this rank's views; local step; broadcast every piece; clear the views' grads
        raise NotImplementedError("Task 6.3: step() in template_zero.py is not done yet (docs/task6-zero.md)")
        # --- Task 6.3 end ---

    def _sync_param_groups(self):
        """Pass the hyperparameters of self.param_groups (set by a scheduler, say) to the local optimizer."""
        for group, local_group in zip(self.param_groups, self.optim.param_groups):
            for key, value in group.items():
                if key != "params":
                    local_group[key] = value

    def _follow_moved_parameters(self):
        """Point a view at its parameter's memory again if code replaced that memory (param.data = ...,
        as some checkpoint loaders do) since the view was made: the view would update the old memory."""
        for view, param, start, end, rank in self.pieces:
            if view.data_ptr() != param.data_ptr() + start * param.element_size():
                view.set_(param.detach().view(-1)[start:end])  # the same tensor object: its state stays its own

    def _local_pieces(self):
        """This rank's pieces in the local optimizer's order, with (index in param_groups over all groups, start, end)."""
        index = {id(param): i for i, param in enumerate(p for group in self.param_groups for p in group["params"])}
        return [(view, index[id(param)], start, end) for view, param, start, end, rank in self.pieces
                if rank == self.rank]

    def state_dict(self):
        """The whole optimizer state, as the unsharded optimizer's state_dict() gives it, on every rank.

        A collective: every rank must call it, even if only rank 0 saves it (rank 0 alone would
        hang). Its state tensors are on the CPU. load_state_dict() takes it, or the state_dict() of
        the unsharded optimizer, on any number of ranks.
        """
        mine = [(index, start, end, {key: value.cpu() if torch.is_tensor(value) else value
                                     for key, value in self.optim.state[view].items()})
                for view, index, start, end in self._local_pieces() if view in self.optim.state]
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, mine)
        parts = {}  # parameter index: its pieces' states, in order along the parameter
        for index, start, end, piece_state in sorted((p for pieces in everyone for p in pieces), key=lambda p: p[:2]):
            parts.setdefault(index, []).append((end - start, piece_state))
        params = [param for group in self.param_groups for param in group["params"]]
        state = {}
        for index, pieces in sorted(parts.items()):
            first = pieces[0][1]
            # a tensor with one number per element (exp_avg, momentum_buffer): glue the pieces;
            # anything else is the same for every piece (Adam's step count): take the first
            state[index] = {key: torch.cat([piece[key] for _, piece in pieces]).view(params[index].shape)
                            if _per_element(key, value, (pieces[0][0],)) else value
                            for key, value in first.items()}
        return {"state": state, "param_groups": _numbered(self.param_groups, self.param_groups)}

    def load_state_dict(self, state_dict):
        """Load a whole state (from state_dict(), or an unsharded optimizer's): each rank keeps its pieces' slices."""
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise ValueError(f"the state has {len(state_dict['param_groups'])} parameter groups, "
                             f"this optimizer {len(self.param_groups)}")
        for saved, group in zip(state_dict["param_groups"], self.param_groups):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError("the state's parameter groups do not match this optimizer's")
            group.update({key: value for key, value in saved.items() if key != "params"})
        params = [param for group in self.param_groups for param in group["params"]]
        local_state = {}
        for local_index, (view, index, start, end) in enumerate(self._local_pieces()):
            if index in state_dict["state"]:
                local_state[local_index] = {  # one number per element: keep this piece's
                    key: value.reshape(-1)[start:end].clone() if _per_element(key, value, params[index].shape)
                    else value
                    for key, value in state_dict["state"][index].items()}
        self.optim.load_state_dict({"state": local_state,
                                    "param_groups": _numbered(self.param_groups, self.optim.param_groups)})
        self.state = self.optim.state  # load_state_dict gave the local optimizer a new state dict: show that one


def _per_element(key, value, shape):
    """Whether an optimizer's state value holds one number per element of a tensor of this shape
    (exp_avg, momentum_buffer), so that a piece of it belongs to each piece of the parameter.
    "step" is the one scalar PyTorch's optimizers keep as a tensor, shaped () like a 0-dim parameter."""
    return torch.is_tensor(value) and tuple(value.shape) == tuple(shape) and key != "step"


def _numbered(groups, params_of):
    """param_groups as state_dict() writes them: each group's options, and its parameters (those of the
    matching group of params_of) as numbers counted over all groups."""
    numbered, count = [], 0
    for group, members in zip(groups, params_of):
        options = {key: value for key, value in group.items() if key != "params"}
        numbered.append({**options, "params": list(range(count, count + len(members["params"])))})
        count += len(members["params"])
    return numbered
