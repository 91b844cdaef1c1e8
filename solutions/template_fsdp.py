"""Task 7: fully sharded data parallelism (FSDP, ZeRO stage 3).

    torchrun --standalone --nproc_per_node=2 train_ddp.py --shard full --optimizer adamw
    python check.py 7                 # which of these tasks are done (docs/task7-fsdp.md)

Data parallelism keeps the whole model, its gradients and its optimizer state on every rank.
FSDP keeps 1/N of each on each of the N ranks, and gathers a layer's full weights only for
the moment that layer computes:

    model = FSDP(CNN())                                # each rank keeps 1/N of every parameter
    optimizer = torch.optim.AdamW(model.parameters())  # over the shards: 1/N of the state
    loss = F.cross_entropy(model(images), labels)      # each unit: all-gather, forward, free
    loss.backward()                                    # each unit: all-gather, backward, free, reduce-scatter
    model.finish_gradient_synchronization()            # wait for the reduce-scatters
    optimizer.step()                                   # each rank updates its own shard only

A unit is a module that holds parameters itself (a Linear, a Conv2d, a BatchNorm), its
trainable and its frozen parameters in two units. A unit's parameters are flattened into one
1-D tensor, padded with zeros to a multiple of the world size and cut into world_size equal
pieces; rank r keeps piece r, the shard. Your tasks:

    Task 7.1  shard_flat                        pad a flat tensor and take this rank's piece
    Task 7.2  FlatUnit.unshard                  all-gather the shards into the full flat tensor
    Task 7.3  FlatUnit.reshard                  free the full flat tensor's memory
    Task 7.4  FlatUnit.reduce_scatter_gradient  start reducing this rank's piece of the mean gradient
    Task 7.5  FSDP.gather_full_params           the whole model, as one process would hold it

The hooks that call them at the right moments are given (FSDP._pre_forward, _post_forward,
_pre_backward and _UnshardForCompute): read them. As in fully_shard, communication overlaps
computation: while one unit computes, the next one's all-gather is already under way
(prefetch), and each unit's reduce-scatter runs while backward goes on to the units before
it, as Task 5's buckets do; finish_gradient_synchronization() waits for them. Compared with
PyTorch's torch.distributed.fsdp.fully_shard, this is simplified, on purpose:
- a unit is one module that holds parameters (fully_shard groups what you wrap, a whole
  transformer block, to send fewer and larger messages);
- a module may use only its own parameters and its children's (through their forward); a
  module that reaches into another module's parameters (self.other.weight) is not supported;
- buffers are not sharded (they are small) and, with compute_dtype, not cast;
- gradients are averaged, so every rank must run the same number of backward passes.
"""
import functools
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

# torch 2.14 renames all_gather_into_tensor and reduce_scatter_tensor (to ..._single); the old
# names work on every torch this course supports (2.11 has no new ones), so we keep them.
warnings.filterwarnings("ignore", message=r".*(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")


def shard_flat(flat, rank, world_size):
    """This rank's shard of the 1-D tensor `flat`: a new tensor of ceil(numel / world_size) elements.

    Pad `flat` at the end with zeros to the next multiple of world_size, cut it into
    world_size equal contiguous pieces, and return piece number `rank` as a copy (not a view:
    `flat` is freed once sharded). Every shard has the same size, because
    all_gather_into_tensor and reduce_scatter_tensor need equal pieces, and concatenating the
    shards of ranks 0, 1, ... gives back `flat` followed by the padding zeros.
    Example: 5 elements on 2 ranks, shards of 3: rank 0 holds flat[0:3], rank 1 flat[3:5] and a 0.
    """
    # --- Task 7.1 begin ---
    padding = -flat.numel() % world_size  # the zeros that make the length a multiple of world_size
    padded = torch.cat([flat, flat.new_zeros(padding)])
    shard_numel = padded.numel() // world_size
    return padded[rank * shard_numel:(rank + 1) * shard_numel].clone()
    # --- Task 7.1 end ---


class FlatUnit:
    """The parameters of one unit as one flat, padded tensor, sharded over the ranks.

    shard  an nn.Parameter: this rank's piece (shard_flat), in the parameters' own dtype
           (fp32). The only copy of the weights that lasts; the optimizer updates it, and
           its .grad is this rank's piece of the mean gradient.
    full   the whole flat tensor, padding included, in compute_dtype. Its memory exists only
           between unshard() and reshard(); the parameters the module computes with are
           views of it (views()).
    gathering  the all-gather of a prefetch still under way (None: none)
    reducing   the reduce-scatters started in backward, [(handle, gradient piece)], that
               finish_reduce_scatters() waits for
    """

    def __init__(self, params, rank, world_size, compute_dtype=None):
        self.rank, self.world_size = rank, world_size
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        self.shard = nn.Parameter(shard_flat(flat, rank, world_size), requires_grad=params[0].requires_grad)
        self.compute_dtype = compute_dtype or flat.dtype
        self.full = torch.empty(self.shard.numel() * world_size, dtype=self.compute_dtype, device=flat.device)
        self.gathering, self.reducing = None, []
        self.reshard()

    def is_unsharded(self):
        return self.full.untyped_storage().nbytes() > 0

    def views(self, flat):
        """The parameters, in their shapes, as views of the whole flat tensor `flat`."""
        return [flat[offset:offset + numel].view(shape)
                for offset, numel, shape in zip(self.offsets, self.numels, self.shapes)]

    def unshard(self, async_op=False):
        """Fill self.full with the whole flat tensor: every rank's shard, in rank order, in
        compute_dtype. A collective: every rank calls it for the same unit at the same time.

        reshard() freed self.full's memory and kept the tensor: give the memory back first,
        self.full.untyped_storage().resize_(number of bytes), then all_gather_into_tensor into
        self.full, passing async_op on. The shards travel in compute_dtype (with bf16, half the
        bytes of fp32); send a detached copy of the shard, this is no part of autograd's graph.
        Return what all_gather_into_tensor returns: with async_op=True, a handle whose wait()
        the caller calls before reading self.full (the hooks do, to gather the next unit while
        this one computes); returning None after a blocking gather is correct too, only slower.
        """
        # --- Task 7.2 begin ---
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), async_op=async_op)
        # --- Task 7.2 end ---

    def prefetch(self):
        """Start gathering this unit without waiting: it travels while another unit computes."""
        if not self.is_unsharded():
            self.gathering = self.unshard(async_op=True)

    def wait_unsharded(self):
        """Make sure self.full holds the whole flat tensor: wait for a prefetch, or gather now."""
        if not self.is_unsharded():
            self.gathering = self.unshard()
        if self.gathering is not None:
            self.gathering.wait()
            self.gathering = None

    def free(self):
        """reshard(), once no all-gather writes into self.full any more."""
        if self.gathering is not None:
            self.gathering.wait()
            self.gathering = None
        self.reshard()

    def reshard(self):
        """Free the memory of the full flat tensor, and keep only the shard.

        Free it in place: self.full.untyped_storage().resize_(0). Keep the tensor object:
        autograd saved views of it for backward, and freeing the memory under them is what
        frees it (self.full = torch.empty(0) would free nothing while autograd holds them);
        unshard() fills the same memory again before backward needs it.
        """
        # --- Task 7.3 begin ---
        self.full.untyped_storage().resize_(0)
        # --- Task 7.3 end ---

    def reduce_scatter_gradient(self, full_grad):
        """Start reducing this rank's piece of the mean over ranks of `full_grad`; do not wait.

        full_grad: this rank's gradient of the whole flat tensor (padded length, compute_dtype).
        dist.reduce_scatter_tensor with SUM hands each rank the sum over the ranks of its own
        piece. Divide full_grad by the world size BEFORE the sum, once, as Task 5.2 does (the
        sum of the ranks' shares is then the mean that single-process training on the global
        batch gives, and a float16 sum cannot overflow where the mean would not), into a new
        tensor: autograd's full_grad is not yours to change. Start the reduce-scatter into a
        new tensor of the shard's size, in compute_dtype, with async_op=True, and return
        (handle, that tensor): it holds the mean once handle.wait() returns, which
        finish_reduce_scatters() calls, while backward goes on without waiting. (A blocking
        reduce-scatter and (None, tensor) is correct too, only slower.)
        """
        # --- Task 7.4 begin ---
        piece = torch.empty(self.shard.numel(), dtype=full_grad.dtype, device=full_grad.device)
        handle = dist.reduce_scatter_tensor(piece, full_grad / self.world_size, op=dist.ReduceOp.SUM, async_op=True)
        return handle, piece
        # --- Task 7.4 end ---

    def finish_reduce_scatters(self):
        """Wait for this unit's reduce-scatters, and add their pieces of the mean to shard.grad
        in the shard's dtype (fp32), as autograd adds up gradients (a tied unit gets one a use)."""
        for handle, piece in self.reducing:
            if handle is not None:
                handle.wait()
            if self.shard.grad is None:
                self.shard.grad = piece.to(self.shard.dtype)
            else:
                self.shard.grad += piece  # in place, as autograd accumulates
        self.reducing = []


class _UnshardForCompute(torch.autograd.Function):
    """Forward: gather a unit and hand out its full flat tensor, so that autograd links what the
    module computes with it back to unit.shard. Backward: the gradient of the whole flat tensor
    comes in; its reduce-scatter starts (finish_gradient_synchronization() waits for it and
    sets unit.shard.grad), and the full parameters, no longer needed, are freed again."""

    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        unit.wait_unsharded()
        # .data: a new tensor on the same memory with its own version counter, so that refilling
        # unit.full before backward is not mistaken for an in-place change of a saved tensor.
        return unit.full.data

    @staticmethod
    def backward(ctx, full_grad):
        unit = ctx.unit
        unit.reducing.append(unit.reduce_scatter_gradient(full_grad))
        unit.free()
        return None, None  # not autograd's: shard.grad is set when the reduce-scatter is done


class FSDP(nn.Module):
    """Fully sharded data parallelism: `module`'s parameters, gradients and optimizer state are
    split over the ranks, 1/world_size each (plus padding), instead of copied to every rank.

        model = FSDP(module, compute_dtype=None, prefetch=True)
        optimizer = torch.optim.AdamW(model.parameters())  # the shards, one per unit
        loss_fn(model(x), y).backward(); model.finish_gradient_synchronization(); optimizer.step()

    Every rank starts from rank 0's parameters and buffers (broadcast here, as DDP does).
    model.parameters() yields the shards only; the wrapped module's own parameters are gone
    and exist, as views of each unit's gathered flat tensor, only while the module computes.
    compute_dtype (torch.bfloat16, say): the gathered parameters, their all-gather, the
    gradients' reduce-scatter and the floating-point inputs are in that dtype; the shards and
    so the optimizer (the master weights) stay fp32.
    prefetch: while a module computes, start gathering the next module's units (the next in
    forward's order, recorded in the first forward; the one before it in backward), as
    fully_shard does, so that communication overlaps computation; it costs the memory of one
    more unit's full parameters. prefetch=False gathers each unit only when it is needed.
    """

    def __init__(self, module, compute_dtype=None, prefetch=True):
        super().__init__()
        self.module = module
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.compute_dtype = compute_dtype
        self.prefetch = prefetch
        self._order = []   # the modules that hold parameters, in the order of the first forward
        with torch.no_grad():  # every rank starts from rank 0's model (sync_module_states in FSDP1)
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=0)
        self.units = []
        self._uses = {}    # module -> [(attribute name, unit, index in unit)]
        self._names = []   # [(name in module.named_parameters(), unit, index)]: a tied one under its first name
        owner = {}         # id(parameter) -> (unit, index): a tied parameter lives in one unit only
        named = set()      # ids of the parameters in self._names
        for prefix, sub in module.named_modules():
            own = [(name, p) for name, p in sub._parameters.items() if p is not None]
            for requires_grad in (True, False):  # a flat shard is trainable or frozen, not both
                new = list({id(p): p for _, p in own if p.requires_grad == requires_grad and id(p) not in owner}.values())
                if new:
                    unit = FlatUnit(new, self.rank, self.world_size, compute_dtype)
                    self.units.append(unit)
                    owner.update({id(p): (unit, index) for index, p in enumerate(new)})
            if own:
                self._uses[sub] = [(name, *owner[id(p)]) for name, p in own]
            for name, p in own:
                if id(p) not in named:  # named_parameters() lists a tied parameter once
                    named.add(id(p))
                    self._names.append((f"{prefix}.{name}" if prefix else name, *owner[id(p)]))
        for sub, uses in self._uses.items():
            for name, _, _ in uses:
                del sub._parameters[name]  # from now on the shards are the parameters
            sub.register_forward_pre_hook(self._pre_forward)
            sub.register_forward_hook(self._post_forward)
        self.shards = nn.ParameterList([unit.shard for unit in self.units])

    def _units_of(self, module):
        return list({id(unit): unit for _, unit, _ in self._uses[module]}.values())

    def _prefetch(self, module, step):
        """Start gathering the units of the module `step` places from `module` in forward's order."""
        if not self.prefetch or module not in self._order:
            return
        index = self._order.index(module) + step
        if 0 <= index < len(self._order):
            for unit in self._units_of(self._order[index]):
                unit.prefetch()

    def _pre_forward(self, module, args):
        """Before a unit's module computes: gather its units, and give it its parameters back as views."""
        if module not in self._order:
            self._order.append(module)
        fulls = {id(unit): _UnshardForCompute.apply(unit.shard, unit) for unit in self._units_of(module)}
        self._prefetch(module, +1)  # the next module's units travel while this one computes
        for name, unit, index in self._uses[module]:
            setattr(module, name, unit.views(fulls[id(unit)])[index])

    def _post_forward(self, module, args, output):
        """After it: free the full parameters, and gather them again when backward reaches this
        module (a hook on its outputs' gradients fires just before their backward)."""
        for unit in self._units_of(module):
            unit.free()
        if torch.is_grad_enabled():
            for tensor in tree_leaves(output):
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(functools.partial(self._pre_backward, module))

    def _pre_backward(self, module, grad):
        for unit in self._units_of(module):
            unit.wait_unsharded()
        self._prefetch(module, -1)  # backward runs forward's order backwards

    def forward(self, *args, **kwargs):
        if self.compute_dtype is not None:  # inputs in the parameters' dtype, as fully_shard's MixedPrecisionPolicy
            args, kwargs = tree_map(lambda t: t.to(self.compute_dtype)
                                    if isinstance(t, torch.Tensor) and t.is_floating_point() else t, (args, kwargs))
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        """Call it between loss.backward() and optimizer.step(), on every rank.

        Waits for the reduce-scatters that backward started, as Task 5's DDP waits for its
        buckets, which sets each shard's .grad, and frees the full parameters that backward
        gathered and no gradient freed (a frozen unit, a unit that forward did not use, a
        prefetch that backward did not need).
        """
        for unit in self.units:
            unit.finish_reduce_scatters()
            if unit.is_unsharded():
                unit.free()

    def gather_full_params(self):
        """{name: full parameter}, the wrapped module's parameters as one process would hold them.

        The names, shapes and values of module.named_parameters() before wrapping (so a tied
        parameter once, under its first name), in the shards' dtype (fp32,
        also with a bf16 compute_dtype), each a new tensor that training does not change. A
        collective: every rank calls it, and every rank gets the whole model. For saving a
        checkpoint and for tests; it holds the whole model in memory, so call it rarely, and
        leaves every unit as resharded as it found it (no unit.full kept alive after it).
        Gather each unit's shards (all_gather_into_tensor, into fp32), then cut the flat
        tensor into parameters with unit.views(); self._names says which name is which view.
        """
        # --- Task 7.5 begin ---
        views = {}
        for unit in self.units:
            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, device=unit.shard.device)
            dist.all_gather_into_tensor(full, unit.shard.detach())
            views[id(unit)] = unit.views(full)
        return {name: views[id(unit)][index].clone() for name, unit, index in self._names}
        # --- Task 7.5 end ---
