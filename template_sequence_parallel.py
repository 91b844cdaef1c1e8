"""Task 14: the transformer's tensor parallelism (heads and MLP split over the ranks), then sequence parallelism.

    python check.py 14                # which of these tasks are done (docs/task14-sequence-parallel.md)

Task 9 split one pair of the CNN's layers. A transformer block (models.Block) is two such pairs:
the attention's qkv (column-parallel: each rank computes the q, k and v of its own heads, and
attention runs head by head, so no collective is needed between them) then proj (row-parallel),
and the MLP's fc1 then fc2. Megatron-LM (arXiv 1909.08053) splits them so: one all-reduce per
pair in forward (g), one in backward (f). The LayerNorms and residual additions between the pairs
run whole, on the whole (B, S, dim) sequence, on every rank: T times the same work and memory.

Sequence parallelism (Korthikanti et al. 2022, arXiv 2205.05198) splits those too, along the
tokens: between the pairs each rank holds its S/T tokens, gather_sequence (an all-gather) brings
the whole sequence in before each pair and reduce_scatter_sequence (a reduce-scatter) takes the
pair's partial sums back to this rank's tokens. A reduce-scatter plus an all-gather send what one
all-reduce sends: the same bytes, and the activations between the pairs are T times smaller.

    block = parallelize_block(Block(64, 4), tp_group)                    # (B, S, dim) in and out
    block = parallelize_block(Block(64, 4), tp_group, sequence_parallel=True)   # (B, S/T, dim) in and out
    vit = parallelize_vit(ViT(), tp_group, sequence_parallel=True)        # images in, logits out
    loss.backward(); sync_sequence_parallel_gradients(vit, tp_group); optimizer.step()

Your tasks:

    Task 14.1  parallelize_attention          the heads split: qkv column-parallel (q, k AND v of each head), proj row-parallel
    Task 14.2  parallelize_mlp                fc1 column-parallel, fc2 row-parallel
    Task 14.3  gather_sequence, reduce_scatter_sequence   the sequence-parallel twins of f and g
    Task 14.4  parallelize_block              both inside a block, with or without sequence parallelism
    Task 14.5  sync_sequence_parallel_gradients, parallelize_vit   what sequence parallelism leaves to sum; the ViT

Task 9's operators and layers (copy_to_tp, ColumnParallelLinear, RowParallelLinear) are used as
they are: `python check.py 9` first. As PyTorch's parallelize_module with ColwiseParallel,
RowwiseParallel, SequenceParallel and PrepareModuleInput, which the tests compare with.
Simplified: plain tensors, not DTensors; one process group; contiguous token shards.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# Task 9's layers and operators, from the file beside this one: your template_tensor_parallel.py beside
# template_sequence_parallel.py; the reference answers' beside the reference answers (a package).
if __package__:
    from .template_tensor_parallel import ColumnParallelLinear, RowParallelLinear, copy_to_tp
else:
    from template_tensor_parallel import ColumnParallelLinear, RowParallelLinear, copy_to_tp


# ----------------------------------------------------------------------------- Task 14.1
def parallelize_attention(attn, group=None, sequence_parallel=False):
    """Split a models.Attention over the ranks of `group` by heads, in place; return `attn`.

    N = dist.get_world_size(group), r = dist.get_rank(group). Rank r holds heads [r * H / N,
    (r + 1) * H / N) of the H = attn.heads (PyTorch's ColwiseParallel on separate q, k and v
    layers holds the same). attn.qkv's output is laid out [q | k | v], each [head 0 | head 1 | ...]
    of dim / H features: it becomes a column-parallel layer (the first of _layers(sequence_parallel), below)
    whose weight and bias are the rows of rank r's heads in q, then in k, then in v, in that order
    (3 * dim / N rows, held in new tensors of that size and of the weight's dtype and device, as Task
    9's from_linear holds its slice: a view of a whole-size weight keeps all of its memory); attn.proj becomes the row-parallel layer
    (the second) from_linear of it; attn.heads becomes H / N, what this rank's qkv holds
    (Attention.forward reads the head width from it). Then attn(x) returns the unsplit module's
    output, on every rank.
    H not divisible by N: ValueError, one line that names the heads, on every rank alike, before
    any collective.
    """
    # --- Task 14.1 begin ---
    # TODO Task 14.1: refuse heads that do not divide; qkv column-parallel with the q, k and v rows of this rank's heads; proj row-parallel; attn.heads
    raise NotImplementedError("Task 14.1: parallelize_attention() in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
    # --- Task 14.1 end ---


# ----------------------------------------------------------------------------- Task 14.2
def parallelize_mlp(mlp, group=None, sequence_parallel=False):
    """Split a models.MLP over the ranks of `group`, in place; return `mlp`: fc1 becomes the
    column-parallel layer of _layers(sequence_parallel) from_linear of it (rank r: hidden features
    [r * hidden / N, (r + 1) * hidden / N)), fc2 the row-parallel one; the GELU works on each
    rank's slice alone. Then mlp(x) returns the unsplit module's output, on every rank. A hidden
    size not divisible by N is refused by Task 9's from_linear (ValueError)."""
    # --- Task 14.2 begin ---
    # TODO Task 14.2: fc1 column-parallel, fc2 row-parallel (the classes of _layers(sequence_parallel))
    raise NotImplementedError("Task 14.2: parallelize_mlp() in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
    # --- Task 14.2 end ---


# ----------------------------------------------------------------------------- Task 14.3
# Sequence parallelism's conversions, each an autograd Function as Task 9's f and g, on (B, S, dim)
# tensors cut along dim 1 (the tokens) into N contiguous shards: rank r (of `group`, N ranks) holds
# tokens [r * S / N, (r + 1) * S / N). A tensor autograd hands you is never changed in place. Neither
# backward needs the forward's input: keep none of it (saved or on ctx), or it stays alive until then.


class _GatherSequence(torch.autograd.Function):
    """Forward: the ranks' (B, S / N, dim) shards all-gathered into the whole (B, S, dim) sequence,
    in group-rank order along dim 1. Backward: with tensor_parallel_output_grad (the default), the
    reduce-scatter (SUM) of the gradient along dim 1, each rank keeping its S / N tokens: what
    follows the gather is a column-parallel layer, and every rank's gradient is one part of the
    whole. Without it, this rank's slice of the gradient and no collective: what follows is
    computed alike on every rank (Megatron-LM's tensor_parallel_output_grad=False), so each rank's
    gradient already is the whole one."""

    @staticmethod
    def forward(ctx, x, group, tensor_parallel_output_grad):
        # --- Task 14.3 begin ---
        # TODO Task 14.3: all-gather the shards along dim 1 in group-rank order; keep what backward needs in ctx
        raise NotImplementedError("Task 14.3: _GatherSequence.forward (gather_sequence) in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
        # --- Task 14.3 end ---

    @staticmethod
    def backward(ctx, grad):
        # --- Task 14.3 begin ---
        # TODO Task 14.3: the reduce-scatter of grad along dim 1, or this rank's slice without tensor_parallel_output_grad; (that, None, None)
        raise NotImplementedError("Task 14.3: _GatherSequence.backward (gather_sequence) in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
        # --- Task 14.3 end ---


class _ReduceScatterSequence(torch.autograd.Function):
    """Forward: x (B, S, dim), a partial sum on each rank, reduce-scattered (SUM) along dim 1: each
    rank gets the sum over the ranks of its S / N tokens, (B, S / N, dim), a new tensor. Backward:
    the all-gather of the (B, S / N, dim) gradients into (B, S, dim), in group-rank order: the
    sum's gradient with respect to each rank's term is the whole sum's gradient.
    S not divisible by N: ValueError, one line that names the tokens, before any collective."""

    @staticmethod
    def forward(ctx, x, group):
        # --- Task 14.3 begin ---
        # TODO Task 14.3: refuse tokens that do not divide; reduce-scatter (SUM) x along dim 1, this rank's tokens
        raise NotImplementedError("Task 14.3: _ReduceScatterSequence.forward (reduce_scatter_sequence) in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
        # --- Task 14.3 end ---

    @staticmethod
    def backward(ctx, grad):
        # --- Task 14.3 begin ---
        # TODO Task 14.3: all-gather grad along dim 1 in group-rank order; (that, None)
        raise NotImplementedError("Task 14.3: _ReduceScatterSequence.backward (reduce_scatter_sequence) in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
        # --- Task 14.3 end ---


def gather_sequence(x, group=None, tensor_parallel_output_grad=True):
    """All-gather the (B, S / N, dim) shards into (B, S, dim) in forward; in backward, reduce-scatter
    (or, with tensor_parallel_output_grad=False, keep this rank's slice)."""
    return _GatherSequence.apply(x, group, tensor_parallel_output_grad)


def reduce_scatter_sequence(x, group=None):
    """Reduce-scatter (B, S, dim) partial sums into this rank's (B, S / N, dim) in forward; all-gather in backward."""
    return _ReduceScatterSequence.apply(x, group)


def split_sequence(x, group=None):
    """This rank's tokens [r * S / N, (r + 1) * S / N) of x (B, S, dim), the same on every rank, with
    f before the slice: the slice's gradient is zero outside it, and f's all-reduce SUM of the ranks'
    zero-padded slices gives every rank x's whole gradient (Megatron's scatter_to_sequence_parallel_region
    does it with an all-gather, half the bytes: Task 9's _split_last_dim along the tokens)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if x.shape[1] % size:
        raise ValueError(f"split_sequence: {x.shape[1]} tokens do not divide over the tensor-parallel size {size}: "
                         "choose a size that divides the sequence length")
    k = x.shape[1] // size
    return copy_to_tp(x, group)[:, rank * k:(rank + 1) * k]


# ----------------------------------------------------------------------------- Task 14.4
class SequenceParallelColumnLinear(ColumnParallelLinear):
    """Task 9's ColumnParallelLinear (from_linear, weight, bias, split_dim: all its own) inside a
    sequence-parallel block: its input x is the whole (B, S, in_features) sequence, which
    gather_sequence made from the ranks' shards just before the module that holds this layer.
    Returns (B, S, out_features / N), this rank's slice of nn.Linear's output, with x's gradient
    summed over the ranks exactly once in backward."""

    def forward(self, x):
        # --- Task 14.4 begin ---
        # TODO Task 14.4: the column-parallel product of the whole sequence x, with x's gradient summed over the ranks once
        raise NotImplementedError("Task 14.4: SequenceParallelColumnLinear.forward in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
        # --- Task 14.4 end ---


class SequenceParallelRowLinear(RowParallelLinear):
    """Task 9's RowParallelLinear inside a sequence-parallel block: x is this rank's slice
    (B, S, in_features / N) of the input's features; returns (B, S / N, out_features), nn.Linear's
    whole output on this rank's tokens (contiguous shards, as reduce_scatter_sequence cuts them),
    the bias counted once. The bias, like the LayerNorms', is then the same on every rank but meets
    only this rank's tokens: Task 14.5 sums its gradient."""

    def forward(self, x):
        # --- Task 14.4 begin ---
        # TODO Task 14.4: the partial product, back to this rank's tokens summed over the ranks, and the bias once
        raise NotImplementedError("Task 14.4: SequenceParallelRowLinear.forward in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
        # --- Task 14.4 end ---


def _layers(sequence_parallel):
    """(column-parallel class, row-parallel class) of a block with or without sequence parallelism."""
    if sequence_parallel:
        return SequenceParallelColumnLinear, SequenceParallelRowLinear
    return ColumnParallelLinear, RowParallelLinear


def parallelize_block(block, group=None, sequence_parallel=False):
    """Split a models.Block over the ranks of `group`, in place; return `block`.

    Its attn and mlp split as Tasks 14.1 and 14.2 split them, with the layers of
    _layers(sequence_parallel). Without sequence parallelism the block takes and returns the whole
    (B, S, dim) on every rank: the LayerNorms and residual additions run whole on each rank, and the
    collectives are Task 9's f and g inside the layers (one all-reduce of (B, S, dim) per pair in
    forward, one in backward). With it the block takes and returns this rank's (B, S / N, dim)
    shard, and each of attn and mlp gets the whole sequence from gather_sequence at its input (a
    forward pre-hook, as PyTorch's PrepareModuleInput: Attention.forward reads the token count from
    its input; a post-hook on the norm before it is the same), and gives back its shard through the row-parallel layer's reduce-scatter: per pair,
    one all-gather and one reduce-scatter of (B, S / N, dim) pieces in forward, the same in backward,
    nothing else. Either way block(x) is the unsplit block's output (on this rank's tokens, with
    sequence parallelism). block.sequence_parallel records the choice (Task 14.5 reads it).
    """
    # --- Task 14.4 begin ---
    # TODO Task 14.4: attn and mlp split (Tasks 14.1, 14.2); with sequence parallelism, the whole sequence gathered at their inputs
    raise NotImplementedError("Task 14.4: parallelize_block() in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
    # --- Task 14.4 end ---
    block.sequence_parallel = sequence_parallel
    return block


# ----------------------------------------------------------------------------- Task 14.5
def sync_sequence_parallel_gradients(model, group=None):
    """Sum over `group` the gradients that sequence parallelism leaves partial, in place.

    `model` is any module that holds such blocks, at any depth (a models.ViT, or the tests'
    nn.ModuleDict of blocks and a loose LayerNorm): find them among model.modules().
    In a block that parallelize_block split with sequence_parallel (block.sequence_parallel True),
    the LayerNorms' weights and biases and the row-parallel layers' biases (split_dim == 1) are the
    same on every rank of the group, but each rank's gradient covers only its own S / N tokens; the
    whole gradient is their SUM. Send exactly those gradients (those that exist): one all-reduce
    (SUM) over `group` per dtype among them, and no other parameter: a column- or row-parallel
    weight (or a column-parallel bias) holds a different slice on each rank, and everything outside
    such blocks already has its whole gradient. Without sequence parallelism nothing is sent: the
    LayerNorms and biases then see every token on every rank, and f and g make their gradients whole.
    Between loss.backward() and the data-parallel average, on every rank of the group.
    """
    # --- Task 14.5 begin ---
    # TODO Task 14.5: sum over the group, one all-reduce per dtype, exactly the gradients sequence parallelism leaves partial
    raise NotImplementedError("Task 14.5: sync_sequence_parallel_gradients() in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
    # --- Task 14.5 end ---


def parallelize_vit(model, tp_group, sequence_parallel=False):
    """Split every block of a models.ViT over `tp_group` (parallelize_block), in place; return `model`.

    Without sequence parallelism that is all: the blocks take and return the whole tokens. With it,
    the first block must get this rank's tokens, split_sequence of the embedded ones (every rank
    embeds the whole image alike), and the tokens are gathered back before the final norm: the
    norm, the mean over the tokens and the head then run whole and alike on every rank (a few
    hundred features, against a block's 12 * dim^2 weights), and their gradients need no sum. That
    last gather's backward keeps this rank's slice (gather_sequence with
    tensor_parallel_output_grad=False): a reduce-scatter there would sum T equal gradients, T times
    the right one. Both as forward pre-hooks (on blocks[0] and on norm), so that the ViT's own
    forward runs unchanged. Tokens not divisible by the group's size: ValueError, one line.
    """
    size = dist.get_world_size(tp_group)
    tokens = model.pos_embed.shape[1]
    if sequence_parallel and tokens % size:
        raise ValueError(f"parallelize_vit: {tokens} tokens do not divide over the tensor-parallel size {size}: "
                         "choose a size that divides the sequence length, or leave sequence parallelism out")
    for block in model.blocks:
        parallelize_block(block, tp_group, sequence_parallel)
    if sequence_parallel:
        # --- Task 14.5 begin ---
        # TODO Task 14.5: this rank's tokens into the first block, the whole sequence back before the final norm (mind its backward)
        raise NotImplementedError("Task 14.5: parallelize_vit() in template_sequence_parallel.py is not done yet (docs/task14-sequence-parallel.md)")
        # --- Task 14.5 end ---
    return model
