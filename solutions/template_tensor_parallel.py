"""Task 9: tensor parallelism: split the CNN's big layer over the ranks, then data x tensor parallel.

    python check.py 9                 # which of these tasks are done (docs/task9-tensor-parallel.md)

Data parallelism, ZeRO and FSDP all run every layer whole on every rank. Tensor parallelism
(Megatron-LM, arXiv 1909.08053) splits one layer's weight over the N ranks of a tensor-parallel
group: each rank holds and computes a slice, and two small collectives make the result exact.
The course CNN's nn.Linear(2048, 128) holds 94% of its parameters; split it by output rows
(column-parallel), the next Linear by input columns (row-parallel), and the pair needs one
all-reduce in forward and one in backward:

    x --f--> [x W1_r^T + b1_r] --ReLU--> [h_r W2_r^T] --g--> sum over r, + b2
    f: identity forward, all-reduce SUM backward     g: all-reduce SUM forward, identity backward

    tp_group = None                                    # tensor parallel over every rank
    model = parallelize_classifier(CNN(), tp_group)    # classifier[1] and [3] split, in place
    loss = F.cross_entropy(model(images), labels)      # every rank reads the SAME batch
    loss.backward(); optimizer.step()                  # nothing to average: no data parallelism

On a (dp x tp) grid of ranks, each group of tp consecutive ranks splits the layers, and the
dp groups (one rank of each tp group) train on different slices of the global batch:

    dp_group, tp_group = make_2d_groups(dp_size, tp_size)
    dp_rank, dp_world = sampler_rank_and_size(rank, world_size, tp_size)   # for the sampler
    loss.backward(); average_gradients_over_dp(model, dp_group); optimizer.step()

Your tasks:

    Task 9.1  copy_to_tp, reduce_from_tp, gather_from_tp   the operators f, g and the all-gather
    Task 9.2  ColumnParallelLinear, RowParallelLinear      from_linear (the slice) and forward
    Task 9.3  parallelize_classifier, make_2d_groups       the CNN split; the groups of the grid
    Task 9.4  sampler_rank_and_size, average_gradients_over_dp   the data-parallel half of the grid

As PyTorch's own torch.distributed.tensor.parallel (ColwiseParallel, RowwiseParallel), which
the tests compare with. Simplified: the layers hold plain tensors (PyTorch's hold DTensors that
know their placement), one process group per layer, and no sequence parallelism.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


# ----------------------------------------------------------------------------- Task 9.1
# Each operator is an autograd Function: forward and backward are written by hand, because
# their collectives differ (autograd would not know that an all-reduce's gradient is itself
# an all-reduce here and the identity there). `group` is a process group, None for the
# default one; inside it, ranks are numbered by dist.get_rank(group), not the global rank.
# A tensor handed to forward or backward belongs to autograd: never change it in place.


class _CopyToTP(torch.autograd.Function):
    """f (Megatron's copy_to_tensor_model_parallel_region): forward, the identity; backward,
    the all-reduce (SUM) of the gradient over the group. Before a column-parallel layer: every
    rank uses the whole input x, so x's gradient is the sum of every rank's contribution.
    Backward needs no tensor of forward's: keep none (no ctx.save_for_backward, no tensor on
    ctx), or x stays in memory until backward runs."""

    @staticmethod
    def forward(ctx, x, group):
        # --- Task 9.1 begin ---
        ctx.group = group
        return x
        # --- Task 9.1 end ---

    @staticmethod
    def backward(ctx, grad):
        # --- Task 9.1 begin ---
        grad = grad.clone(memory_format=torch.contiguous_format)  # a new tensor: autograd's is not ours
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None
        # --- Task 9.1 end ---


class _ReduceFromTP(torch.autograd.Function):
    """g (Megatron's reduce_from_tensor_model_parallel_region): forward, the all-reduce (SUM) of
    x over the group, into a new tensor; backward, the identity. After a row-parallel layer:
    each rank's partial product is one term of the sum, and the sum's gradient with respect to
    each term is the sum's own gradient.
    Backward needs no tensor of forward's: keep none (no ctx.save_for_backward, no tensor on
    ctx), or x stays in memory until backward runs."""

    @staticmethod
    def forward(ctx, x, group):
        # --- Task 9.1 begin ---
        out = x.clone(memory_format=torch.contiguous_format)  # x may be saved by autograd: leave it as it is
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out
        # --- Task 9.1 end ---

    @staticmethod
    def backward(ctx, grad):
        # --- Task 9.1 begin ---
        return grad, None
        # --- Task 9.1 end ---


class _GatherFromTP(torch.autograd.Function):
    """Forward: every rank's x, all-gathered and concatenated along the last dimension in group-rank
    order (x of shape (..., k) gives (..., N * k)). Backward: this rank's slice of the gradient,
    [..., r * k:(r + 1) * k] with r = dist.get_rank(group), and no reduction: every rank already
    holds the gradient of the whole output.
    Backward needs no tensor of forward's: keep none (no ctx.save_for_backward, no tensor on
    ctx), or x stays in memory until backward runs."""

    @staticmethod
    def forward(ctx, x, group):
        # --- Task 9.1 begin ---
        ctx.group = group
        pieces = [torch.empty_like(x, memory_format=torch.contiguous_format)
                  for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=-1)
        # --- Task 9.1 end ---

    @staticmethod
    def backward(ctx, grad):
        # --- Task 9.1 begin ---
        rank, size = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        return grad.chunk(size, dim=-1)[rank].contiguous(), None
        # --- Task 9.1 end ---


def copy_to_tp(x, group=None):
    """f: the identity in forward, the all-reduce (SUM over `group`) of the gradient in backward."""
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x, group=None):
    """g: the all-reduce (SUM over `group`) in forward, into a new tensor; the identity in backward."""
    return _ReduceFromTP.apply(x, group)


def gather_from_tp(x, group=None):
    """All-gather over `group` along the last dimension in forward; this rank's slice in backward."""
    return _GatherFromTP.apply(x, group)


def _split_last_dim(x, group):
    """This rank's slice of x's last dimension, with f before it: the slice's gradient is zero
    outside the slice, and f's all-reduce SUM of the ranks' zero-padded slices is the whole
    gradient of x on every rank (Megatron's scatter does it with an all-gather, half the bytes)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    k = x.shape[-1] // size
    return copy_to_tp(x, group)[..., rank * k:(rank + 1) * k]


# ----------------------------------------------------------------------------- Task 9.2
def _refuse_uneven(layer, what, features, size):
    """One clear line, on every rank alike, before any collective could hang."""
    if features % size:
        raise ValueError(f"{layer}: {what} = {features} does not divide by the tensor-parallel size {size}: "
                         f"choose a size that divides {features}")


class ColumnParallelLinear(nn.Module):
    """An nn.Linear whose output features are split over the ranks of `group`.

    Rank r (of N, the group's) keeps rows [r * out / N, (r + 1) * out / N) of the weight, which
    is (out_features, in_features) as nn.Linear's, and the same slice of the bias, and computes
    y_r = f(x) W_r^T + b_r: its slice of the output's last dimension, from the whole input x.
    With gather_output=True the slices are all-gathered, so every rank returns the whole output.

        layer = ColumnParallelLinear.from_linear(linear, group, gather_output=False)
        layer.weight, layer.bias            # this rank's slices, Parameters (bias None without one)
        layer.in_features, layer.out_features   # the whole layer's, as nn.Linear's
    """

    split_dim = 0  # of the weight, (out, in): gather_full_params puts the slices together along it

    def __init__(self, weight, bias, in_features, out_features, group=None, gather_output=False):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.in_features, self.out_features = in_features, out_features
        self.group, self.gather_output = group, gather_output

    @classmethod
    def from_linear(cls, linear, group=None, gather_output=False):
        """This rank's column-parallel part of `linear` (an nn.Linear, which is left unchanged).

        N = dist.get_world_size(group), r = dist.get_rank(group): the group's, not the global ones.
        Keep rows [r * out / N, (r + 1) * out / N) of linear.weight (nn.Linear's weight is (out, in):
        the output features are its first dimension) and the same slice of linear.bias if it has
        one, as new tensors of the same dtype and device (copies: `linear` may be freed).
        out_features not divisible by N: raise ValueError with one clear line (_refuse_uneven does),
        on every rank alike, before any collective. in_features may be anything.
        Return cls(weight, bias, linear.in_features, linear.out_features, group, gather_output).
        """
        # --- Task 9.2 begin ---
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        _refuse_uneven("ColumnParallelLinear", "out_features", linear.out_features, size)
        k = linear.out_features // size
        rows = slice(rank * k, (rank + 1) * k)
        weight = linear.weight.detach()[rows].clone()
        bias = None if linear.bias is None else linear.bias.detach()[rows].clone()
        return cls(weight, bias, linear.in_features, linear.out_features, group, gather_output)
        # --- Task 9.2 end ---

    def forward(self, x):
        """x: (..., in_features), the same on every rank of the group. Returns (..., out_features / N),
        this rank's slice of nn.Linear's output; with gather_output, (..., out_features), all of it.
        f before the product (its backward sums x's gradient over the ranks); gather_from_tp after
        it when gather_output."""
        # --- Task 9.2 begin ---
        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)
        return gather_from_tp(y, self.group) if self.gather_output else y
        # --- Task 9.2 end ---

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(this rank: {self.weight.shape[0]}), bias={self.bias is not None}, gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """An nn.Linear whose input features are split over the ranks of `group`.

    Rank r (of N) keeps columns [r * in / N, (r + 1) * in / N) of the weight, and the whole bias.
    Its input is its slice x_r of the input's last dimension (what a ColumnParallelLinear before
    it returns); it computes the partial product x_r W_r^T, g sums the partial products over the
    ranks, and the bias is added once, after the sum. Every rank returns the whole output.
    With input_is_parallel=False the input is the whole x, and forward first takes this rank's
    slice of it (_split_last_dim, whose backward gives every rank x's whole gradient).

        layer = RowParallelLinear.from_linear(linear, group, input_is_parallel=True)
        layer.weight                       # this rank's columns, a Parameter
        layer.bias                         # the whole bias, on every rank, a Parameter (or None)
    """

    split_dim = 1  # of the weight, (out, in)

    def __init__(self, weight, bias, in_features, out_features, group=None, input_is_parallel=True):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.in_features, self.out_features = in_features, out_features
        self.group, self.input_is_parallel = group, input_is_parallel

    @classmethod
    def from_linear(cls, linear, group=None, input_is_parallel=True):
        """This rank's row-parallel part of `linear` (left unchanged).

        Keep columns [r * in / N, (r + 1) * in / N) of linear.weight, (out, in): the input features
        are its second dimension; r and N the group's. Keep the whole bias (a copy), or None. New
        tensors, of linear's dtype and device. in_features not divisible by N: ValueError, one clear
        line (_refuse_uneven), on every rank alike. out_features may be anything.
        Return cls(weight, bias, linear.in_features, linear.out_features, group, input_is_parallel).
        """
        # --- Task 9.2 begin ---
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        _refuse_uneven("RowParallelLinear", "in_features", linear.in_features, size)
        k = linear.in_features // size
        weight = linear.weight.detach()[:, rank * k:(rank + 1) * k].clone()
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(weight, bias, linear.in_features, linear.out_features, group, input_is_parallel)
        # --- Task 9.2 end ---

    def forward(self, x):
        """x: (..., in_features / N), this rank's slice (or, without input_is_parallel, (..., in_features),
        the whole input: take the slice with _split_last_dim). Returns (..., out_features), nn.Linear's
        whole output, on every rank: the partial product without bias, g (reduce_from_tp), then the bias."""
        # --- Task 9.2 begin ---
        if not self.input_is_parallel:
            x = _split_last_dim(x, self.group)
        y = reduce_from_tp(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias
        # --- Task 9.2 end ---

    def extra_repr(self):
        return (f"in_features={self.in_features} (this rank: {self.weight.shape[1]}), out_features={self.out_features}, "
                f"bias={self.bias is not None}, input_is_parallel={self.input_is_parallel}")


# ----------------------------------------------------------------------------- Task 9.3
def parallelize_classifier(model, tp_group):
    """Split the course CNN's classifier over `tp_group`, in place, and return the model.

    model.classifier is Flatten, Linear(2048, 128), ReLU, Linear(128, 10). Replace classifier[1] by
    its ColumnParallelLinear (each rank computes 128 / N of the hidden features; no gather: the
    ReLU works on each slice alone) and classifier[3] by its RowParallelLinear (input already split:
    input_is_parallel=True), both from_linear of the layer they replace. The convolutions stay
    replicated: every rank of the group holds them whole. One all-reduce in forward (g, after the
    row-parallel layer) and one in backward (f, before the column-parallel one).
    Start every rank from the same model (broadcast it whole BEFORE splitting), or the slices of
    different ranks come from different layers.
    """
    # --- Task 9.3 begin ---
    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group)
    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3], tp_group)
    return model
    # --- Task 9.3 end ---


def make_2d_groups(dp_size, tp_size):
    """(dp_group, tp_group): the process groups of a (dp_size x tp_size) grid that contain this rank.

    The world's ranks form dp_size rows of tp_size: the tensor-parallel groups are the rows,
    consecutive ranks [d * tp_size, (d + 1) * tp_size), as on a GPU node where they share NVLink
    (the two collectives of each layer are on the critical path, the gradient all-reduce can
    overlap); the data-parallel groups are the columns, [t, t + tp_size, t + 2 * tp_size, ...].
    Grid rank r is at row r // tp_size (its dp rank) and column r % tp_size (its tp rank).
    dist.new_group is a collective: every rank creates EVERY group, in the same order on every rank
    (all rows then all columns, say), and keeps the two that contain it (or, with
    use_local_synchronization=True, each rank creates only the two groups it is in).
    4 ranks, dp 2 x tp 2: tp groups [0, 1] and [2, 3], dp groups [0, 2] and [1, 3].
    """
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if dp_size * tp_size != world_size:
        raise ValueError(f"make_2d_groups: dp_size {dp_size} x tp_size {tp_size} is not the world size {world_size}")
    # --- Task 9.3 begin ---
    dp_group = tp_group = None
    for d in range(dp_size):
        ranks = list(range(d * tp_size, (d + 1) * tp_size))
        group = dist.new_group(ranks)
        if rank in ranks:
            tp_group = group
    for t in range(tp_size):
        ranks = list(range(t, world_size, tp_size))
        group = dist.new_group(ranks)
        if rank in ranks:
            dp_group = group
    return dp_group, tp_group
    # --- Task 9.3 end ---


# ----------------------------------------------------------------------------- Task 9.4
def sampler_rank_and_size(rank, world_size, tp_size):
    """(rank, num_replicas) to give the sampler (Task 1) on grid rank `rank` of `world_size`.

    The ranks of a tensor-parallel group compute ONE model on ONE batch together: each holds a
    slice of the layers, and g sums their partial products, which is only right if they are
    products of the same input. So the ranks of a tp group must read the same slice of each
    global batch, and the data is split over the dp groups' ranks only: dp rank d = rank // tp_size
    of world_size // tp_size. With dp 2 x tp 2, ranks 0 and 1 read slice 0, ranks 2 and 3 slice 1,
    and the global batches are those of 4-way data parallelism, or of one process.
    """
    # --- Task 9.4 begin ---
    return rank // tp_size, world_size // tp_size
    # --- Task 9.4 end ---


def average_gradients_over_dp(model, dp_group):
    """Task 2.2 on the grid: replace every .grad of `model` with its mean over `dp_group`, in place.

    all_reduce with SUM over dp_group, then divide by dist.get_world_size(dp_group); skip
    parameters without .grad. Over the dp group only: a column- or row-parallel weight holds a
    different slice on each rank of its tp group, and only the ranks of one dp group hold the
    same slice (of gradients of different data, to be averaged). The replicated parameters need
    no more: the ranks of a tp group computed them from the same batch, and f and g made their
    gradients equal. Between loss.backward() and optimizer.step(), on every rank.
    """
    # --- Task 9.4 begin ---
    dp_size = dist.get_world_size(dp_group)
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group)
        param.grad /= dp_size
    # --- Task 9.4 end ---


# ----------------------------------------------------------------------------- given
def gather_full_params(model):
    """{name: whole parameter}, as model.named_parameters() would give before splitting: each
    column-parallel weight and bias all-gathered over its group along dim 0, each row-parallel
    weight along dim 1, the rest as they are. A collective over each layer's group; new tensors.
    For checking that ranks agree (every rank then holds the same whole model) and for saving."""
    split_dim = {}
    for prefix, module in model.named_modules():
        dim = getattr(module, "split_dim", None)  # not isinstance: a layer may come from another copy of this file
        if dim is not None:
            split_dim[f"{prefix}.weight"] = (dim, module.group)
            if module.bias is not None and dim == 0:  # a column-parallel bias is split too
                split_dim[f"{prefix}.bias"] = (0, module.group)
    full = {}
    for name, param in model.named_parameters():
        if name not in split_dim:
            full[name] = param.detach().clone()
            continue
        dim, group = split_dim[name]
        pieces = [torch.empty_like(param) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, param.detach().contiguous(), group=group)
        full[name] = torch.cat(pieces, dim=dim)
    return full
