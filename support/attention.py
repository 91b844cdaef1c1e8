"""Given code of Task 15: softmax attention of one query block against one key block, forward and
backward, in plain PyTorch (template_context_parallel.py imports it).

    out, lse = attention_block(q, k, v)                       # (B, H, Sq, D), (B, H, Sq)
    dq, dk, dv = attention_block_backward(dout, q, k, v, out, lse)

No F.scaled_dot_product_attention inside: these run in any dtype (the tests use float64) and the
backward is written out, as FlashAttention's, so that ring attention can call it block by block.
Scaled by 1/sqrt(D), as F.scaled_dot_product_attention.

`lse` is each query's log-sum-exp of its scores, log(sum_j exp(s_ij)): with it, the attention of a
query over several key blocks is known from each block's (out, lse) (Task 15.1), and the backward of
one block needs only the WHOLE attention's out and lse, not the other blocks (FlashAttention-2,
Dao 2023, Algorithm 2): the probability of key j is exp(s_ij - lse_i), whichever block j lies in.
"""
import math

import torch


def _scores(q, k, causal, q_pos, k_pos):
    """(B, H, Sq, Sk) scaled scores, -inf where a key lies after its query (causal, by position)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        q_pos = torch.arange(q.shape[-2], device=q.device) if q_pos is None else q_pos.to(q.device)
        k_pos = torch.arange(k.shape[-2], device=q.device) if k_pos is None else k_pos.to(q.device)
        scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    return scores


def _probabilities(scores, lse):
    """exp(s - lse), 0 in a row with no visible key (lse = -inf: exp(-inf - -inf) would be NaN)."""
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(scores - finite.unsqueeze(-1))


def attention_block(q, k, v, causal=False, q_pos=None, k_pos=None):
    """Softmax attention of queries q (B, H, Sq, D) over keys k and values v (B, H, Sk, D).

    Returns (out, lse): out (B, H, Sq, D), as F.scaled_dot_product_attention(q, k, v) would give for
    this block alone, and lse (B, H, Sq), the log-sum-exp of each query's scaled scores. With causal,
    key j is hidden from query i when k_pos[j] > q_pos[i]: q_pos and k_pos are 1-D tensors of the
    blocks' global token positions (default 0, 1, ...). A query that sees no key gets lse = -inf and
    out = 0 (never NaN)."""
    scores = _scores(q, k, causal, q_pos, k_pos)
    lse = torch.logsumexp(scores, dim=-1)  # -inf for a row of -inf
    return _probabilities(scores, lse) @ v, lse


def attention_block_backward(dout, q, k, v, out, lse, causal=False, q_pos=None, k_pos=None):
    """The gradients (dq, dk, dv) that this block contributes, given dout (B, H, Sq, D).

    out and lse are those of the query's WHOLE attention (over every key block, Task 15.1's merge), not
    this block's alone: the probabilities are recomputed as exp(s - lse), and
    ds = p * (dout v^T - rowsum(dout * out)) (FlashAttention's backward). For one block alone,
    pass the block's own out and lse. The masking is attention_block's."""
    scores = _scores(q, k, causal, q_pos, k_pos)
    p = _probabilities(scores, lse)
    dv = p.transpose(-2, -1) @ dout
    dp = dout @ v.transpose(-2, -1)
    ds = p * (dp - (dout * out).sum(dim=-1, keepdim=True))
    scale = 1 / math.sqrt(q.shape[-1])
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
