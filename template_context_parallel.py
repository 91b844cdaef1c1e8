"""Task 15: context parallelism: attention over a sequence split between the ranks.

    python check.py 15                # which of these tasks are done (docs/task15-context-parallel.md)

Attention needs every token's keys and values, and its cost grows with the square of the
sequence. Context parallelism splits the SEQUENCE over the N ranks of a group, attention included.
q, k, v are (B, H, S / N, D) on every rank: batch, heads, this rank's tokens, head width.

    out = ring_attention(q, k, v, group)          # ring attention (Liu et al. 2023): the K/V blocks go round
    out = ring_attention(zigzag_shard(q_whole), ..., causal=True, layout="zigzag")  # causal, balanced
                                                  # (zigzag_shard cuts this rank's part out of the WHOLE sequence)
    out = ulysses_attention(q, k, v, group)       # DeepSpeed-Ulysses: all-to-all to a split of the heads

Ring attention passes each rank's K/V block to the next rank, N - 1 times, while computing with the
block it holds; the partial attentions are merged exactly by the online softmax, which needs each
block's log-sum-exp (support/attention.py computes one block, forward and backward). Ulysses swaps
the sequence split for a head split with one all-to-all, attends on whole sequences, and swaps back.

Your tasks:

    Task 15.1  merge_attention                  two blocks' (out, lse) -> the union's: the online softmax
    Task 15.2  block_pairs, RingAttention.forward   the ring, its send posted before each block's compute
    Task 15.3  RingAttention.backward           dq here; dk, dv travel with their block back to its owner
    Task 15.4  token_chunks (zigzag), zigzag_shard, zigzag_unshard   causal load balance
    Task 15.5  _AllToAll, ulysses_attention     the all-to-all, differentiable; attention on H / N heads
    Task 15.6  sequence_mean, average_context_parallel_gradients   the ViT trained with --cp N

As PyTorch's torch.distributed.tensor.experimental.context_parallel (ring attention, CUDA only) and
DeepSpeed's DistributedAttention (Ulysses). Simplified: no FlashAttention kernel (plain PyTorch,
so it runs in float64 on a CPU), no attention mask but the causal one, the K/V block sent whole
each step (k and v stacked in one message, as the solution does, or in two).
"""
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from models import ViT
from support.attention import attention_block, attention_block_backward


# ----------------------------------------------------------------------------- Task 15.1
def merge_attention(out_a, lse_a, out_b, lse_b):
    """The attention of each query over the union of two key blocks, from its attention over each.

    out_a, out_b: (B, H, S, D), each block's softmax attention output; lse_a, lse_b: (B, H, S), the
    log-sum-exp of each query's scores over that block (attention_block's). Returns (out, lse) exactly
    as attention_block over the concatenated keys and values would. A side with lse = -inf (a query
    that sees no key of that block) contributes nothing; both -inf gives lse = -inf and out = 0. No
    NaN, and no overflow for scores near 1e4. New tensors in the inputs' dtype (computed in it; bfloat16 may be
    computed in float32 and cast back): the inputs are left unchanged."""
    # --- Task 15.1 begin ---
    # TODO Task 15.1: the union's lse from the two, and each side's output weighted by its share of the union's softmax; -inf sides weigh 0, never NaN
    raise NotImplementedError("Task 15.1: merge_attention in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
    # --- Task 15.1 end ---


# ----------------------------------------------------------------------------- the layouts
def token_chunks(rank, world_size, tokens, layout="contiguous"):
    """Which of the sequence's tokens `rank` holds: [(chunk id, positions)], in the order they lie in
    its (B, H, tokens, D) tensors; positions is a 1-D long tensor of their global positions.

    contiguous: one chunk, id `rank`, positions rank * tokens ... (rank + 1) * tokens - 1.
    zigzag: the sequence cut into 2N equal chunks of tokens / 2 (ids 0 ... 2N - 1); this rank holds
    chunk `rank`, then chunk 2N - 1 - rank. A chunk with a smaller id lies wholly before one with a
    larger id: block_pairs decides by ids alone."""
    if layout == "contiguous":
        return [(rank, torch.arange(rank * tokens, (rank + 1) * tokens))]
    if layout != "zigzag":
        raise ValueError(f"layout {layout!r}: choose 'contiguous' or 'zigzag'")
    # --- Task 15.4 begin ---
    # TODO Task 15.4: the zigzag layout: chunk ids rank and 2N-1-rank, tokens / 2 positions each
    raise NotImplementedError("Task 15.4: token_chunks (zigzag) in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
    # --- Task 15.4 end ---


# ----------------------------------------------------------------------------- Task 15.2
def block_pairs(q_chunks, k_chunks, causal):
    """The (query chunk, key chunk) pairs to compute: [(i, j)], indices into q_chunks and k_chunks
    (token_chunks' lists), in any order. Without causal, every pair. With causal, a pair whose key chunk
    lies wholly after its query chunk (a larger id) is left out: it would be fully masked. A pair
    with equal ids is kept; attention_block masks it by the positions."""
    # --- Task 15.2 begin ---
    # TODO Task 15.2: every (i, j) without causal; with causal, leave out key chunks with a larger id than the query chunk's
    raise NotImplementedError("Task 15.2: block_pairs in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
    # --- Task 15.2 end ---


def _pieces(x, chunks):
    """x's (B, H, tokens, D) cut into the pieces that token_chunks lists, as views."""
    return x.split([len(positions) for _, positions in chunks], dim=2)


class RingAttention(torch.autograd.Function):
    """Ring attention over the ranks of `group`, each holding q, k, v (B, H, S / N, D) for its own
    tokens (token_chunks says which, by `layout`).

    Forward: the attention of this rank's queries over EVERY rank's keys and values, as
    F.scaled_dot_product_attention(q, k, v, is_causal=causal) over the whole sequence would give for
    this rank's tokens. The K/V blocks travel round the ring, rank r sending to r + 1 and receiving from
    r - 1 (ranks of the group), point to point: N - 1 K/V blocks sent per rank, no collective. Each
    step's send and receive are posted BEFORE that step's blocks are computed and waited for after, so
    that the next block travels while this one is computed; each Work is waited for once. A rank holds
    at most 2 other ranks' K/V blocks at a time. Only the pairs of block_pairs are computed; the
    partial results are merged with merge_attention. Saves for backward only q, k, v, out and lse,
    in that order (save_for_backward), and keeps ctx.group, ctx.causal, ctx.layout: Task 15.3's
    backward is judged with the reference forward where solutions/ is there, and reads them so. (In a
    student release the tests run your own forward and backward together: write both, then check.)

    Backward: dq of this rank's queries, and dk, dv of this rank's OWN keys and values: the gradient
    that every rank's queries give them. The K/V blocks go round again, each with its dk, dv, summed
    as it travels, so that they end on the block's owner."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal, layout):
        # --- Task 15.2 begin ---
        # TODO Task 15.2: the ring: post this step's send (to r+1) and receive (from r-1), compute the block pairs you hold, merge, then wait; save q, k, v, out, lse
        raise NotImplementedError("Task 15.2: RingAttention.forward in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
        # --- Task 15.2 end ---

    @staticmethod
    def backward(ctx, dout):
        # --- Task 15.3 begin ---
        # TODO Task 15.3: the ring again: dq here, each block's dk, dv travelling with it to end on its owner; return (dq, dk, dv, None, None, None)
        raise NotImplementedError("Task 15.3: RingAttention.backward in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
        # --- Task 15.3 end ---


def ring_attention(q, k, v, group=None, causal=False, layout="contiguous"):
    """Ring attention (RingAttention) of this rank's q, k, v (B, H, S / N, D) over the whole sequence
    split over `group`: "contiguous" (rank r holds tokens r S / N ...) or "zigzag" (zigzag_shard's)."""
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"ring_attention: layout {layout!r}: choose 'contiguous' or 'zigzag'")
    return RingAttention.apply(q, k, v, group, causal, layout)


# ----------------------------------------------------------------------------- Task 15.4
def zigzag_shard(x, group=None, dim=2):
    """This rank's part of the WHOLE sequence x for layout="zigzag": x cut into 2N equal chunks along
    `dim`, chunk r then chunk 2N - 1 - r, concatenated (r, N: the group's). No communication.
    ValueError if x's length along dim does not divide into 2N chunks."""
    # --- Task 15.4 begin ---
    # TODO Task 15.4: chunk r then chunk 2N-1-r of x cut into 2N along dim; ValueError if it does not cut evenly
    raise NotImplementedError("Task 15.4: zigzag_shard in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
    # --- Task 15.4 end ---


def zigzag_unshard(x, group=None, dim=2):
    """The whole sequence, in order, on every rank, from every rank's zigzag_shard part x (a collective
    over `group`). Not differentiable (for checking and evaluation)."""
    # --- Task 15.4 begin ---
    # TODO Task 15.4: every rank's two chunks gathered, put back in sequence order
    raise NotImplementedError("Task 15.4: zigzag_unshard in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
    # --- Task 15.4 end ---


# ----------------------------------------------------------------------------- Task 15.5
class _AllToAll(torch.autograd.Function):
    """x cut into N equal pieces along scatter_dim, piece j sent to rank j of `group`; what every rank
    sent this one, concatenated along gather_dim in group-rank order. One dist.all_to_all_single (or one
    dist.all_to_all of the N pieces).
    Backward: the gradient goes the reverse way, the same all-to-all with the two dims swapped, which
    needs nothing of x: keep no tensor on ctx (x saved would stay alive until the backward)."""

    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        # --- Task 15.5 begin ---
        # TODO Task 15.5: cut x into N pieces along scatter_dim, one dist.all_to_all_single, concatenate along gather_dim
        raise NotImplementedError("Task 15.5: _AllToAll.forward in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
        # --- Task 15.5 end ---

    @staticmethod
    def backward(ctx, grad):
        # --- Task 15.5 begin ---
        # TODO Task 15.5: the reverse all-to-all (scatter and gather dims swapped); None for the other arguments
        raise NotImplementedError("Task 15.5: _AllToAll.backward in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
        # --- Task 15.5 end ---


def all_to_all(x, group=None, scatter_dim=1, gather_dim=2):
    """_AllToAll: differentiable, its backward the reverse all-to-all."""
    return _AllToAll.apply(x, group, scatter_dim, gather_dim)


def ulysses_attention(q, k, v, group=None, causal=False):
    """DeepSpeed-Ulysses attention of this rank's q, k, v (B, H, S / N, D), contiguous layout: the
    same result as ring_attention. An all-to-all gives each rank the WHOLE sequence of H / N heads
    (rank j: heads j H / N ...), F.scaled_dot_product_attention runs there, and an all-to-all brings
    every rank its own tokens of all H heads back. On the wire: all-to-alls of q, k, v and out each
    way (4 calls, or 2 with q, k and v packed in one), nothing else. H not divisible by N: ValueError,
    one line, on every rank alike, before any collective."""
    # --- Task 15.5 begin ---
    # TODO Task 15.5: refuse H % N != 0; all-to-all to whole sequences of H / N heads, attention, all-to-all back
    raise NotImplementedError("Task 15.5: ulysses_attention in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
    # --- Task 15.5 end ---


# ----------------------------------------------------------------------------- Task 15.6
class _SequenceMean(torch.autograd.Function):
    """The mean over the WHOLE sequence of x (B, S / N, dim), this rank's tokens: (B, dim), the same
    on every rank of `group`. Forward: one all-reduce (SUM) of this rank's token sum, a new (B, dim)
    tensor (x is left unchanged: the backward runs through it), then / S
    (or / S before it: the same up to rounding). Backward: every rank already holds the whole gradient of the mean (the loss after it is computed
    the same on every rank): each of its tokens gets grad / S, with no collective. It needs x's shape,
    not x: keep no tensor on ctx (x saved would stay alive until the backward)."""

    @staticmethod
    def forward(ctx, x, group):
        # --- Task 15.6 begin ---
        # TODO Task 15.6: this rank's token sum, all-reduced over group, divided by the whole sequence's length
        raise NotImplementedError("Task 15.6: _SequenceMean.forward in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
        # --- Task 15.6 end ---

    @staticmethod
    def backward(ctx, grad):
        # --- Task 15.6 begin ---
        # TODO Task 15.6: grad / S for each of this rank's tokens, no collective; None for group
        raise NotImplementedError("Task 15.6: _SequenceMean.backward in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
        # --- Task 15.6 end ---


def sequence_mean(x, group=None):
    """_SequenceMean: the mean over every rank's tokens; backward without a collective."""
    return _SequenceMean.apply(x, group)


def average_context_parallel_gradients(model, cp_size, group=None):
    """After backward, every .grad of a ContextParallelViT made the gradient of single-process training
    on the global batch, the same on every rank of `group` (the world: dp_size x cp_size ranks).

    The parameters before the pooling (patch_embed, pos_embed, blocks, norm) got, on each rank, the
    gradient from its own tokens: the sum over the cp_size ranks of a context group is its replica's
    gradient. The head got the WHOLE gradient of its replica's batch on every rank of the group (it
    saw the same pooled features). Every replica's gradient is then averaged over the dp_size
    replicas. One all-reduce (SUM) over `group`, of one flat buffer, then a division. A parameter without a
    .grad (frozen: requires_grad=False) takes no part, and its .grad stays None."""
    # --- Task 15.6 begin ---
    # TODO Task 15.6: one all-reduce of the flat gradients; the head's divided by one count, the others' by another
    raise NotImplementedError("Task 15.6: average_context_parallel_gradients in template_context_parallel.py is not done yet (docs/task15-context-parallel.md)")
    # --- Task 15.6 end ---


# ----------------------------------------------------------------------------- the ViT, given
class ContextParallelViT(nn.Module):
    """models.ViT with its tokens split over a context group of N ranks: rank r runs tokens
    r S / N ... (r + 1) S / N - 1 through the blocks, whose attention is `attention` (ring_attention or
    ulysses_attention over `group`), pools with sequence_mean, and runs the head. The submodules are
    the ViT's own (the same parameter names), which is left unchanged but for its blocks' attend."""

    def __init__(self, vit, group=None, attention="ring"):
        super().__init__()
        self.patch_embed, self.pos_embed, self.blocks, self.norm, self.head = (
            vit.patch_embed, vit.pos_embed, vit.blocks, vit.norm, vit.head)
        self.group = group
        attend = {"ring": ring_attention, "ulysses": ulysses_attention}[attention]
        for block in self.blocks:
            block.attn.attend = functools.partial(attend, group=group)

    def forward(self, images):
        x = ViT.embed(self, images)  # (B, S, dim), positions added: every rank embeds all, keeps its part
        rank, size = dist.get_rank(self.group), dist.get_world_size(self.group)
        if x.shape[1] % size:
            raise ValueError(f"ContextParallelViT: {x.shape[1]} tokens do not split over {size} ranks")
        x = x.chunk(size, dim=1)[rank]
        for block in self.blocks:
            x = block(x)
        return self.head(sequence_mean(self.norm(x), self.group))
