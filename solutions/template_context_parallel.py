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
    lse = torch.logaddexp(lse_a, lse_b)
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # both -inf: weights 0, not NaN
    weight_a = torch.exp(lse_a - finite).unsqueeze(-1)
    weight_b = torch.exp(lse_b - finite).unsqueeze(-1)
    return weight_a * out_a + weight_b * out_b, lse
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
    half = tokens // 2
    return [(chunk, torch.arange(chunk * half, (chunk + 1) * half)) for chunk in (rank, 2 * world_size - 1 - rank)]
    # --- Task 15.4 end ---


# ----------------------------------------------------------------------------- Task 15.2
def block_pairs(q_chunks, k_chunks, causal):
    """The (query chunk, key chunk) pairs to compute: [(i, j)], indices into q_chunks and k_chunks
    (token_chunks' lists), in any order. Without causal, every pair. With causal, a pair whose key chunk
    lies wholly after its query chunk (a larger id) is left out: it would be fully masked. A pair
    with equal ids is kept; attention_block masks it by the positions."""
    # --- Task 15.2 begin ---
    return [(i, j) for i, (q_id, _) in enumerate(q_chunks) for j, (k_id, _) in enumerate(k_chunks)
            if not causal or k_id <= q_id]
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
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        send_to = dist.get_global_rank(group, (rank + 1) % size) if group is not None else (rank + 1) % size
        recv_from = dist.get_global_rank(group, (rank - 1) % size) if group is not None else (rank - 1) % size
        tokens = q.shape[2]
        q_chunks = token_chunks(rank, size, tokens, layout)
        q_pieces = _pieces(q, q_chunks)
        outs, lses = [None] * len(q_chunks), [None] * len(q_chunks)
        kv = torch.stack([k, v])  # one message a step
        for step in range(size):
            if step < size - 1:
                incoming = torch.empty_like(kv)
                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]
            owner = (rank - step) % size  # whose block this is: it came from r - 1, which had it from r - 2, ...
            k_chunks = token_chunks(owner, size, tokens, layout)
            for i, j in block_pairs(q_chunks, k_chunks, causal):  # views of kv made here die here: kv can go
                out, lse = attention_block(q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],
                                           causal, q_chunks[i][1], k_chunks[j][1])
                outs[i], lses[i] = (out, lse) if outs[i] is None else merge_attention(outs[i], lses[i], out, lse)
            if step < size - 1:
                for work in works:
                    work.wait()
                kv, works = incoming, None  # a Work keeps its tensor alive: drop the finished ones too
        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.layout = group, causal, layout
        return out
        # --- Task 15.2 end ---

    @staticmethod
    def backward(ctx, dout):
        # --- Task 15.3 begin ---
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, layout = ctx.group, ctx.causal, ctx.layout
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        send_to = dist.get_global_rank(group, (rank + 1) % size) if group is not None else (rank + 1) % size
        recv_from = dist.get_global_rank(group, (rank - 1) % size) if group is not None else (rank - 1) % size
        tokens = q.shape[2]
        q_chunks = token_chunks(rank, size, tokens, layout)
        q_pieces, dout_pieces = _pieces(q, q_chunks), _pieces(dout.contiguous(), q_chunks)
        out_pieces, lse_pieces = _pieces(out, q_chunks), lse.split([len(p) for _, p in q_chunks], dim=2)
        dq = torch.zeros_like(q)
        dq_pieces = _pieces(dq, q_chunks)
        kv = torch.stack([k, v])
        for step in range(size):
            if step < size - 1:
                incoming = torch.empty_like(kv)
                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]
            owner = (rank - step) % size
            k_chunks = token_chunks(owner, size, tokens, layout)
            if step > 0:  # the dk, dv that this block has gathered so far, from r - 1
                for work in grad_works:
                    work.wait()
                dkv, grad_works = grad_incoming, None
            else:
                dkv = torch.zeros_like(kv)
            for i, j in block_pairs(q_chunks, k_chunks, causal):
                dq_b, dk_b, dv_b = attention_block_backward(
                    dout_pieces[i], q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],
                    out_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])
                dq_pieces[i].add_(dq_b)
                _pieces(dkv[0], k_chunks)[j].add_(dk_b)
                _pieces(dkv[1], k_chunks)[j].add_(dv_b)
            if size > 1:  # the block's gradients go on with it: after N sends they reach its owner
                grad_incoming = torch.empty_like(dkv)
                grad_works = [dist.isend(dkv, send_to, group=group), dist.irecv(grad_incoming, recv_from, group=group)]
            if step < size - 1:
                for work in works:
                    work.wait()
                kv, works = incoming, None
        if size > 1:
            for work in grad_works:
                work.wait()
            dkv = grad_incoming
        return dq, dkv[0], dkv[1], None, None, None
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
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if x.shape[dim] % (2 * size):
        raise ValueError(f"zigzag_shard: {x.shape[dim]} tokens do not cut into 2 x {size} equal chunks")
    chunks = x.chunk(2 * size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=dim)
    # --- Task 15.4 end ---


def zigzag_unshard(x, group=None, dim=2):
    """The whole sequence, in order, on every rank, from every rank's zigzag_shard part x (a collective
    over `group`). Not differentiable (for checking and evaluation)."""
    # --- Task 15.4 begin ---
    size = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    chunks = [None] * (2 * size)
    for rank, part in enumerate(parts):
        chunks[rank], chunks[2 * size - 1 - rank] = part.chunk(2, dim=dim)
    return torch.cat(chunks, dim=dim)
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
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        size = dist.get_world_size(group)
        send = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()  # piece j first-dim j: rank j's
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=group)
        return torch.cat(received.unbind(0), dim=gather_dim)
        # --- Task 15.5 end ---

    @staticmethod
    def backward(ctx, grad):
        # --- Task 15.5 begin ---
        return _AllToAll.apply(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None
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
    heads, size = q.shape[1], dist.get_world_size(group)
    if heads % size:
        raise ValueError(f"ulysses_attention: {heads} heads do not split over {size} ranks: "
                         "Ulysses gives each rank H / N whole heads; choose a head count that divides")
    qkv = all_to_all(torch.stack([q, k, v]), group, scatter_dim=2, gather_dim=3)  # (3, B, H / N, S, D)
    out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=causal)
    return all_to_all(out, group, scatter_dim=2, gather_dim=1)  # (B, H, S / N, D)
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
        ctx.local, ctx.tokens = x.shape[1], x.shape[1] * dist.get_world_size(group)
        total = x.sum(dim=1)
        dist.all_reduce(total, group=group)
        return total / ctx.tokens
        # --- Task 15.6 end ---

    @staticmethod
    def backward(ctx, grad):
        # --- Task 15.6 begin ---
        return (grad / ctx.tokens).unsqueeze(1).expand(-1, ctx.local, -1).contiguous(), None
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
    world = dist.get_world_size(group)
    head = {id(param) for param in model.head.parameters()}
    params = [param for param in model.parameters() if param.grad is not None]
    flat = torch.cat([param.grad.reshape(-1) for param in params])
    dist.all_reduce(flat, group=group)
    for param, grad in zip(params, flat.split([param.numel() for param in params])):
        # the head: cp_size copies of each replica's gradient in the sum; the others: its cp_size parts
        param.grad.copy_(grad.view_as(param) / (world if id(param) in head else world // cp_size))
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
