"""Task 15: context parallelism (template_context_parallel.py).

    pytest --impl template -m task15_2     # one task; python check.py 15 for all six

Every attention is compared in float64 with F.scaled_dot_product_attention over the WHOLE sequence
on one process (outputs, and dq, dk, dv through torch.autograd.grad), causal and not, with B and H
above 1, on 2, 3 and 4 gloo ranks. Besides the values, a rank records what goes on the wire
(tests/wire.py: each message's kind, dtype, size and peer; each collective; each receive's buffer
against the rank's own matching send, and a send waited for with fewer receives posted), when each block is
computed against when its messages were posted and waited for (Work.wait is counted), whose keys
each computed block holds (to see a ring turning the wrong way), the query-key pairs each rank
computes (causal load balance), how many other ranks' K/V blocks are alive at once (weak
references to every received buffer), whether a block is used before its receive is waited for or a
sent tensor changed before its send's wait, and what the ring saves for backward (its lse against
torch's logsumexp over the whole sequence, its out against the output returned). A wrong gradient is
compared with the whole sequence's backward given dout and out mixed up. The ViT (15.6) runs one
step against the unsplit models.ViT. The tests of one task take solutions/' answers to the others.
"""
import datetime
import math
import re
import sys
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import gpu  # where the GPU test's ranks run
from conftest import REFERENCE, keeps_its_input, load, load_with_reference, raise_if_unfilled
from support.attention import attention_block, attention_block_backward
from harness import RankFailed, RankTimeout, _student_frame, one_line, run_ranks
from wire import NO_FUTURE, POLLED_FOREVER, Wire, gloo_wait_only

FILE = "template_context_parallel.py"
T151 = f"Task 15.1 ({FILE}, merge_attention)"
T152 = f"Task 15.2 ({FILE}, block_pairs / RingAttention.forward)"
T153 = f"Task 15.3 ({FILE}, RingAttention.backward)"
T154 = f"Task 15.4 ({FILE}, token_chunks / zigzag_shard / zigzag_unshard)"
T155 = f"Task 15.5 ({FILE}, _AllToAll / ulysses_attention)"
T156 = f"Task 15.6 ({FILE}, sequence_mean / average_context_parallel_gradients)"

ANSWERS = {
    "15.1": ["merge_attention"],
    "15.2": ["block_pairs", "RingAttention.forward"],
    "15.3": ["RingAttention.backward"],
    "15.4": ["token_chunks", "zigzag_shard", "zigzag_unshard"],
    "15.5": ["_AllToAll.forward", "_AllToAll.backward", "ulysses_attention"],
    "15.6": ["_SequenceMean.forward", "_SequenceMean.backward", "average_context_parallel_gradients"],
}


def judging(impl, task):
    """template_context_parallel of `impl` with your answer to `task` and solutions/' to the others; an
    unfilled TODO of `task` raises its NotImplementedError at once, in pytest's process."""
    others = [answer for t, answers in ANSWERS.items() if t != task for answer in answers]
    module = load_with_reference(impl, "template_context_parallel", *others)
    raise_if_unfilled(module, ANSWERS[task])
    return module


def slow(*values):
    return pytest.param(*values, marks=pytest.mark.slow)


def _inputs(batch=2, heads=2, tokens=12, dim=4, seed=0):
    """q, k, v and the output gradient of the WHOLE sequence, float64, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, tokens, dim, generator=g, dtype=torch.float64) for _ in range(4)]


def _reference(q, k, v, dout, causal):
    """One process's F.scaled_dot_product_attention over the whole sequence: out, (dq, dk, dv)."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return out.detach(), torch.autograd.grad(out, (q, k, v), dout)


def _mine(x, rank, size, layout):
    """This rank's part of the whole sequence x (B, H, S, D): its contiguous S / N, or its two zig-zag
    chunks (r, 2N-1-r), written here without the code under test."""
    if layout == "contiguous":
        return x.chunk(size, dim=2)[rank]
    chunks = x.chunk(2 * size, dim=2)
    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=2)


def _close(got, expected):
    return got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-9, atol=1e-10)


# --------------------------------------------------------------------------- Task 15.1
def _blocks(case):
    """(q, k_a, v_a, k_b, v_b, causal, q_pos, a_pos, b_pos) of a merge case."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    k2, v2 = (torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64) for _ in range(2))
    if case == "large scores":  # scores near 1e4: exp() of them overflows float64
        q, k, k2 = q * 70, k * 70, k2 * 70
    if case == "one block fully masked":  # causal, the second block wholly in the queries' future
        return q, k, v, k2, v2, True, torch.arange(5, 10), torch.arange(0, 5), torch.arange(10, 16)
    if case == "some rows masked in both":  # queries 0..4, keys 3..7 and 8..13: rows 0-2 see nothing
        return q, k, v, k2, v2, True, torch.arange(0, 5), torch.arange(3, 8), torch.arange(8, 14)
    return q, k, v, k2, v2, False, None, None, None


@pytest.mark.task15_1
@pytest.mark.parametrize("case", ["plain", "large scores", "one block fully masked", "some rows masked in both"])
def test_merge_is_the_attention_over_both_blocks(impl, case):
    cp = judging(impl, "15.1")
    q, k_a, v_a, k_b, v_b, causal, q_pos, a_pos, b_pos = _blocks(case)
    out_a, lse_a = cp.attention_block(q, k_a, v_a, causal, q_pos, a_pos)
    out_b, lse_b = cp.attention_block(q, k_b, v_b, causal, q_pos, b_pos)
    whole_pos = None if a_pos is None else torch.cat([a_pos, b_pos])
    out, lse = cp.attention_block(q, torch.cat([k_a, k_b], 2), torch.cat([v_a, v_b], 2), causal, q_pos, whole_pos)
    given = [t.clone() for t in (out_a, lse_a, out_b, lse_b)]
    try:
        got_out, got_lse = cp.merge_attention(out_a, lse_a, out_b, lse_b)
    except RuntimeError as error:  # a (B, H, S) weight times a (B, H, S, D) output lines S up with D
        sizes = re.search(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)", str(error))
        if isinstance(error, NotImplementedError) or not sizes or {int(n) for n in sizes.groups()} != {
                out_a.shape[2], out_a.shape[3]}:
            raise
        pytest.fail(f"{T151}: merge_attention raised {one_line(error)} ({case}): lse is (B, H, S) = "
                    f"{tuple(lse_a.shape)} and out (B, H, S, D) = {tuple(out_a.shape)}; a weight made from lse, (B, H, "
                    "S), broadcast against out lines its S up with out's D: give it a last dim of 1 (unsqueeze(-1))")
    assert all(torch.equal(a, b) for a, b in zip(given, (out_a, lse_a, out_b, lse_b))), (
        f"{T151}: merge_attention changed its inputs in place ({case}): return new tensors")
    if torch.isnan(got_out).any() or torch.isnan(got_lse).any():
        pytest.fail(f"{T151}: NaN in the merge ({case}): where a block is fully masked for a query (lse = -inf), "
                    "exp(lse - lse_max) is exp(-inf - -inf) = NaN; such a side must weigh 0 (and a row with both "
                    "sides -inf must give out = 0, lse = -inf)" if torch.isinf(lse_a).any() or torch.isinf(lse_b).any()
                    else f"{T151}: NaN in the merge ({case}, finite lse on both sides): an overflow, exp of scores "
                    "near 1e4? Work with lse differences, never exp(lse) itself")
    assert got_out.shape == out.shape and got_lse.shape == lse.shape, (
        f"{T151}: shapes {tuple(got_out.shape)}, {tuple(got_lse.shape)}; expected {tuple(out.shape)}, {tuple(lse.shape)}")
    assert got_out.dtype == out.dtype and got_lse.dtype == lse.dtype, (
        f"{T151}: merge_attention of float64 blocks returned out in {got_out.dtype} and lse in {got_lse.dtype}: "
        "part of it was computed in another dtype (a .float(), or a tensor made with a default dtype); keep the "
        "inputs' dtype throughout")
    finite = ~torch.isinf(lse)
    if not (torch.allclose(got_lse[finite], lse[finite], rtol=1e-12, atol=1e-12)
            and torch.equal(torch.isinf(got_lse), torch.isinf(lse))):
        if torch.allclose(got_lse, torch.maximum(lse_a, lse_b)):
            pytest.fail(f"{T151}: the merged lse is the max of the two, not their log-sum-exp "
                        "log(exp(lse_a) + exp(lse_b)): the max instead of log-sum-exp forgets the smaller block's mass")
        if torch.allclose(got_lse, lse_a + lse_b):
            pytest.fail(f"{T151}: the merged lse is lse_a + lse_b, the log of the PRODUCT of the two blocks' softmax "
                        "masses; the union's mass is their sum: lse = log(exp(lse_a) + exp(lse_b)) (torch.logaddexp)")
        pytest.fail(f"{T151}: the merged lse differs from the log-sum-exp over both blocks ({case}) by up to "
                    f"{(got_lse - lse)[finite].abs().max():.3g}")
    if not torch.allclose(got_out, out, rtol=1e-10, atol=1e-12):
        if torch.allclose(got_out, (out_a + out_b) / 2):
            pytest.fail(f"{T151}: the two outputs were averaged: each must be weighted by its block's share of the "
                        "softmax, exp(lse_a - lse) and exp(lse_b - lse)")
        _name_a_wrong_merge(cp, got_out, out, out_a, lse_a, out_b, lse_b, lse, case)
        error = (got_out - out).abs().max() / out.abs().max()
        pytest.fail(f"{T151}: the merged output differs from the attention over both blocks ({case}) by up to "
                    f"{(got_out - out).abs().max():.3g}"
                    + (f", {error:.2g} of its largest value: float32's rounding (float64's is 1e-16): a part of the "
                       "merge was computed in float32 (a .float(), or a tensor made in torch's default dtype); keep "
                       "the inputs' dtype" if 1e-9 < error < 1e-5 else ""))
    # and attention_block of the whole is F.scaled_dot_product_attention (the given code, checked once here)
    if not causal:
        expected = F.scaled_dot_product_attention(q, torch.cat([k_a, k_b], 2), torch.cat([v_a, v_b], 2))
        assert torch.allclose(got_out, expected, rtol=1e-9, atol=1e-12), f"{T151}: not SDPA's result ({case})"


@pytest.mark.task15_1
def test_merge_of_bfloat16_blocks_is_bfloat16(impl):
    """bfloat16 blocks (rows masked in one side and in both): the merge returns bfloat16 out and lse, computed in
    bfloat16 or in float32 and cast back, within bfloat16's rounding of the float64 merge of the same blocks."""
    cp = judging(impl, "15.1")
    q, k_a, v_a, k_b, v_b, causal, q_pos, a_pos, b_pos = _blocks("some rows masked in both")
    out_a, lse_a = cp.attention_block(*(t.bfloat16() for t in (q, k_a, v_a)), causal, q_pos, a_pos)
    out_b, lse_b = cp.attention_block(*(t.bfloat16() for t in (q, k_b, v_b)), causal, q_pos, b_pos)
    got_out, got_lse = cp.merge_attention(out_a, lse_a, out_b, lse_b)
    assert got_out.dtype == got_lse.dtype == torch.bfloat16, (
        f"{T151}: merge_attention of bfloat16 blocks returned out in {str(got_out.dtype).replace('torch.', '')} and "
        f"lse in {str(got_lse.dtype).replace('torch.', '')}: a tensor made in torch's default dtype (torch.zeros(shape), "
        "torch.full(shape, ...)) or a .float() promoted the merge to float32; return the inputs' dtype, as "
        "attention_block over both blocks would (computing in float32 inside is fine: cast back)")
    if torch.isnan(got_out).any() or torch.isnan(got_lse).any():
        pytest.fail(f"{T151}: NaN in the merge of bfloat16 blocks (float64 ones gave none): where both sides are -inf, "
                    "lse - lse is exp(-inf - -inf) = NaN in any dtype; guard those rows")
    la, lb, oa, ob = (t.double() for t in (lse_a, lse_b, out_a, out_b))  # the merge of the same blocks, in float64
    lse = torch.logaddexp(la, lb)
    shift = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    out = torch.exp(la - shift).unsqueeze(-1) * oa + torch.exp(lb - shift).unsqueeze(-1) * ob
    assert torch.equal(torch.isinf(got_lse), torch.isinf(lse)) and torch.allclose(
        got_lse.double()[~torch.isinf(lse)], lse[~torch.isinf(lse)], rtol=2e-2, atol=2e-2) and torch.allclose(
        got_out.double(), out, rtol=2e-2, atol=2e-2), (
        f"{T151}: merge_attention of bfloat16 blocks differs from the float64 merge of the same blocks by up to "
        f"{(got_out.double() - out).abs().max():.3g} (out), beyond bfloat16's rounding (2e-2)")


def _name_a_wrong_merge(cp, got_out, out, out_a, lse_a, out_b, lse_b, lse, case):
    """A merged output that differs, said with its cause where the output is one that a known wrong weighting gives
    (computed here from the blocks' out and lse); the merged lse is right by then."""
    shift = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    share_a, share_b = torch.exp(lse_a - shift).unsqueeze(-1), torch.exp(lse_b - shift).unsqueeze(-1)
    if torch.allclose(got_out, share_b * out_a + share_a * out_b):
        pytest.fail(f"{T151}: each block's output was weighted by the OTHER block's share: out_a takes exp(lse_a - lse), "
                    "out_b takes exp(lse_b - lse)")
    if torch.allclose(got_out, torch.exp(lse_a - m).unsqueeze(-1) * out_a + torch.exp(lse_b - m).unsqueeze(-1) * out_b):
        pytest.fail(f"{T151}: the outputs were weighted by exp(lse - max(lse_a, lse_b)) and not divided by the sum of "
                    "those weights: the shares must add up to 1; subtract the merged lse, exp(lse_a - lse), not the max")
    if torch.allclose(got_out * out.shape[-1] ** 0.5, out):
        pytest.fail(f"{T151}: the merged output is 1/sqrt(D) times the attention over both blocks: the scores were "
                    "scaled already (attention_block's out is softmax(q k^T / sqrt(D)) v); the merge only weighs the "
                    "two outputs")
    one_sided = (torch.isinf(lse_a) | torch.isinf(lse_b)) & ~torch.isinf(lse)
    if one_sided.any():  # rows where one block is fully masked: are they the ones that differ?
        plain = _blocks("plain")
        a, b = cp.attention_block(*plain[:3]), cp.attention_block(plain[0], *plain[3:5])
        whole = cp.attention_block(plain[0], torch.cat([plain[1], plain[3]], 2), torch.cat([plain[2], plain[4]], 2))
        right_elsewhere = torch.allclose(got_out[~one_sided], out[~one_sided], rtol=1e-10, atol=1e-12)
        if right_elsewhere and torch.allclose(cp.merge_attention(*a, *b)[0], whole[0], rtol=1e-10, atol=1e-12):
            pytest.fail(f"{T151}: the merge is right where both blocks are visible, and wrong in the rows where one "
                        f"block is fully masked (its lse = -inf; {case}): that side must weigh exp(-inf) = 0 and the "
                        "other exp(lse_other - lse) = 1: guard the rows where the MERGED lse is -inf (both sides), "
                        "not where one side is")


# --------------------------------------------------------------------------- the recorder for the ring
class _Forget(list):
    def append(self, item):
        pass


UNMATCHED_SEND_WAIT = 2.0  # seconds: a send waited for with fewer receives posted (harness: a hang is 3 s still)


def _tag(args, kwargs):
    """The tag of a ProcessGroup.send / recv call (tensors, peer, tag)."""
    return args[0] if args else kwargs.get("tag", 0)


class Recorder:
    """In a rank: the ring's messages (a Wire), the waits on every Work, each attention_block call (whose
    keys it was given, how many query-key pairs) and the other ranks' K/V bytes alive at each receive."""

    def __init__(self, cp, k_full, v_full, size, layout, kv_numel, name=T152):
        self.cp, self.events, self.blocks, self.alive_peak, self.masks = cp, [], [], 0, []
        self.size, self.name, self.unwaited, self.dropped = size, name, {}, []
        self.received, self.kv_numel = [], kv_numel
        self.sent, self.receives = {}, {}  # by tag, in order: (shape, element size, dtype, peer...) of each send and
        # each receive's buffer
        self.send_order = weakref.WeakKeyDictionary()  # a send's Work: (its index among this rank's sends, its peer)
        self.pairs = []  # (query piece's address, its length, the keys' positions) of each computed block
        self.unwaited_recvs, self.in_flight = {}, {}  # by id(Work): a receive's buffer; a send's tensor and a copy
        every = [cp.token_chunks(r, size, k_full.shape[2] // size, layout) for r in range(size)]
        self.chunks = [(cid, pos) for chunks in every for cid, pos in chunks  # every chunk of the sequence (a wrong
                       if len(pos) and 0 <= pos.min() and pos.max() < k_full.shape[2]]  # token_chunks: said by 15.4)
        self.k_full, self.v_full, self.log, self.recvs = k_full, v_full, [], weakref.WeakKeyDictionary()
        self.owner = {int(p): r for r, chunks in enumerate(every) for _, pos in chunks for p in pos}

    def block_of(self, t):
        """("kv", owner) for a message holding a rank's keys or values (k and v stacked, or one of them), else
        ("grad", None): what else the ring sends is gradients."""
        for full in (self.k_full, self.v_full):
            for x in ([t[0]] if t.dim() == 5 else [t] if t.dim() == 4 else []):
                for _, pos in self.chunks:
                    if len(pos) == x.shape[2] and torch.equal(x, full[:, :, pos]):
                        return "kv", self.owner[int(pos[0])]
        return "grad", None

    def which_keys(self, k):
        """The global positions whose keys k holds (a chunk or a rank's whole block), or None."""
        for _, pos in self.chunks:
            if len(pos) == k.shape[2] and torch.equal(k, self.k_full[:, :, pos]):
                return pos
        return None

    def alive(self):
        """The received K/V blocks alive, in blocks; a buffer received into again (two buffers swapped each step)
        counted once."""
        buffers = {(t.untyped_storage().data_ptr(), t.storage_offset(), t.numel()): t.numel()
                   for t in (ref() for ref in self.received) if t is not None}
        return sum(buffers.values()) / self.kv_numel

    def __enter__(self):
        from torch._C._distributed_c10d import ProcessGroup, Work
        self.wire = Wire().__enter__()
        self.wire.works = _Forget()  # the Wire keeps every send's Work, and a Work keeps its tensor alive
        # the judged module's, and solutions/' (whose answers to the other tasks run with their own globals)
        self.modules = [self.cp, load("solutions", "template_context_parallel")]
        self.saved = (vars(ProcessGroup)["recv"], vars(Work)["wait"],
                      [(m.attention_block, m.attention_block_backward) for m in self.modules],
                      vars(ProcessGroup)["send"], vars(Work)["get_future"], vars(Work)["is_completed"])
        recv, wait, _, send, get_future, is_completed = self.saved
        messages = weakref.WeakSet()  # the Works of the ring's sends and receives
        block, block_backward = self.saved[2][0]
        rank = dist.get_rank()
        neighbours = dict(send=(rank + 1) % self.size, recv=(rank - 1) % self.size)

        def check_peer(kind, group, peer):
            """Said where it is posted: a message to or from another rank hangs the ring, and the hang's report
            cannot say which message it waits for."""
            peer = dist.get_global_rank(group, peer)
            if peer != neighbours[kind]:
                raise AssertionError(
                    f"{self.name}: RingAttention posted a {'send to' if kind == 'send' else 'receive from'} rank {peer}: "
                    f"rank r = {rank} of the ring sends to r + 1 = {neighbours['send']} and receives from r - 1 = "
                    f"{neighbours['recv']}, "
                    "in forward and in backward (the dK/dV too)")
            return peer

        def dropped(key, peer):  # a send's Work let go of before any wait
            if self.unwaited.pop(key, None) is not None:
                self.dropped.append(peer)

        def recorded_send(group, tensors, dst, *args, **kwargs):
            peer, tag, block = check_peer("send", group, dst), _tag(args, kwargs), self.block_of(tensors[0])
            self.sent.setdefault(tag, []).append(
                (tuple(tensors[0].shape), tensors[0].element_size(), tensors[0].dtype, peer, block[0]))
            check_sizes(tag, len(self.sent[tag]) - 1)
            work = send(group, tensors, dst, *args, **kwargs)
            self.send_order[work] = (sum(c.kind in ("send", "isend") for c in self.wire.calls) - 1, peer)
            self.in_flight[id(work)] = (weakref.ref(tensors[0]), tensors[0].detach().clone(), peer)
            self.sent_dtype = tensors[0].dtype
            self.log.append(("send", *block))
            self.unwaited[id(work)] = peer
            weakref.finalize(work, dropped, id(work), peer)
            messages.add(work)
            return work

        def check_sizes(tag, index):
            """Said before the second of a send and its matching receive is posted: gloo aborts a rank whose receive's
            buffer is smaller than the message that arrives. Every rank of the ring runs the same code, so the i-th
            message (of a tag) from r - 1 is as large as this rank's own i-th send to r + 1; the check runs before
            either rank posts the second of the pair, so no such message is sent."""
            sent, received = self.sent.get(tag, []), self.receives.get(tag, [])
            if index >= min(len(sent), len(received)):  # its match not posted yet
                return
            (shape, size, dtype, peer, kind), (buffer, buffer_size, buffer_dtype, src) = sent[index], received[index]
            numel, elements = math.prod(shape), math.prod(buffer)  # shapes, not tensors: the blocks alive are counted
            if elements * buffer_size >= numel * size:
                return
            ordinal = {1: "first", 2: "second", 3: "third"}.get(index + 1, f"{index + 1}th")
            stacked = dtype == buffer_dtype and len(shape) == len(buffer) + 1 and shape[1:] == buffer
            raise AssertionError(
                f"{self.name}: RingAttention posted its {ordinal} receive from rank {src} into a buffer of shape "
                f"{buffer}, {str(buffer_dtype).replace('torch.', '')} ({elements * buffer_size} bytes), while its "
                f"{ordinal} send to rank {peer} is of shape {shape}, {str(dtype).replace('torch.', '')} "
                f"({numel * size} bytes): every rank of the ring sends what this one does, so that message arrives as "
                f"{numel * size} bytes for a buffer of {elements * buffer_size}, and gloo aborts the rank on it "
                f"(\"Received data size doesn't match expected size\", {numel * size} vs {elements * buffer_size}); "
                + (f"the buffer is sized for one of the {shape[0]} tensors that the message stacks ("
                   + ("k alone, where k and v travel together" if kind == "kv" else
                      "dk alone, where dk and dv travel together")
                   + "): receive into a tensor like the one sent, torch.empty_like of the stacked tensor" if stacked else
                   "receive into a tensor like the one sent there (torch.empty_like of it: its shape and dtype)"))

        def recorded_recv(group, tensors, src, *args, **kwargs):
            check_peer("recv", group, src)
            sent = getattr(self, "sent_dtype", None)
            if sent is not None and tensors[0].dtype != sent:  # said here: gloo aborts the rank on the mismatch
                raise AssertionError(
                    f"{self.name}: RingAttention posted a receive into a {str(tensors[0].dtype).replace('torch.', '')} "
                    f"buffer, while its own sends are {str(sent).replace('torch.', '')}: every rank of the ring sends "
                    "what this one does, so what arrives has another element size than the buffer, and gloo aborts "
                    "the rank on a message whose size differs from its buffer's; make the buffer like the tensor sent "
                    "(torch.empty_like, not torch.empty(shape), which makes torch's default dtype)")
            tag = _tag(args, kwargs)
            buffer = tensors[0]
            if any((sent := tensor()) is not None and sent.untyped_storage().data_ptr() ==
                   buffer.untyped_storage().data_ptr() for tensor, _, _ in self.in_flight.values()):
                raise AssertionError(  # said where it is posted: what arrives would overwrite what is being sent
                    f"{self.name}: RingAttention posted a dist.irecv into the very buffer of a dist.isend still in "
                    "flight (the block this step sends on, and computes with): the block arriving overwrites the one "
                    "being sent and used (one receive buffer made once, before the loop?); receive each step into "
                    "another tensor (torch.empty_like, or two buffers swapped), free again once its send is waited "
                    "for")
            self.receives.setdefault(tag, []).append(
                (tuple(buffer.shape), buffer.element_size(), buffer.dtype, dist.get_global_rank(group, src)))
            check_sizes(tag, len(self.receives[tag]) - 1)
            self.received += [weakref.ref(t) for t in tensors]
            self.alive_peak = max(self.alive_peak, self.alive())
            work = recv(group, tensors, src, *args, **kwargs)
            self.recvs[work] = weakref.ref(tensors[0])
            self.unwaited_recvs[id(work)] = weakref.ref(tensors[0])
            messages.add(work)
            return work

        def recorded_get_future(work):
            try:
                return get_future(work)
            except RuntimeError as error:
                if work not in messages or NO_FUTURE not in str(error):
                    raise
                raise AssertionError(
                    f"{self.name}: RingAttention asked the Work of a dist.isend or dist.irecv for its Future "
                    f"(torch.futures.wait_all of the Works' get_future()?), which raised \"{error}\": "
                    f"{gloo_wait_only('irecv')}: wait for each with work.wait()") from None

        waited = weakref.WeakSet()  # weak: a Work keeps its tensor alive, and the blocks alive are counted
        polls = {}  # by id(Work): is_completed() calls on a ring message before its wait

        def recorded_is_completed(work):
            done = is_completed(work)
            if not done and work in messages and work not in waited:
                polls[id(work)] = polls.get(id(work), 0) + 1
                if polls[id(work)] == POLLED_FOREVER:  # said in the rank, at once: the loop hangs to the time limit
                    raise AssertionError(
                        f"{self.name}: RingAttention polled is_completed() {POLLED_FOREVER} times on the Work of a "
                        f"dist.isend or dist.irecv before its wait(): {gloo_wait_only('irecv')}: wait for each with "
                        "work.wait()")
            return done

        def wait_for_a_send(work):
            """A send's wait, said where it cannot end: posted as message i + 1 of this rank's while it has posted i
            receives or fewer. Every rank of the ring runs the same code, so its receiver has posted as few, and on gloo
            a send completes only once a receive that matches it is posted (a blocking dist.send is left to the hang's
            report). Given UNMATCHED_SEND_WAIT seconds first: a ring whose ranks differ in their order (odd and even)
            can wait so rightly. None: waited for as usual."""
            index, peer = self.send_order[work]
            receives = sum(c.kind in ("recv", "irecv") for c in self.wire.calls)
            if receives > index or self.wire.blocking is not None:
                return None
            try:
                return wait(work, datetime.timedelta(seconds=UNMATCHED_SEND_WAIT))
            except RuntimeError as error:
                if "imed out" not in str(error):
                    raise
            sends = [math.prod(shape) * size for messages in self.sent.values() for shape, size, *_ in messages]
            buffers = [math.prod(shape) * size for messages in self.receives.values() for shape, size, *_ in messages]
            larger = next((f" (a receive of {b} bytes takes one message, here one of {m} bytes, whatever its buffer's "
                           "size)" for b, m in zip(buffers, sends) if b > m), "")
            raise AssertionError(
                f"{self.name}: RingAttention waits for its send to rank {peer}, message {index + 1} of those it sent, "
                f"with {receives} receive{'s' if receives != 1 else ''} posted: every rank of the ring runs the same "
                f"code, so rank {peer} too has posted fewer receives than the messages sent to it{larger}, and on gloo "
                f"a send completes only once a receive that matches it is posted: the ranks wait for each other "
                f"forever (said after {UNMATCHED_SEND_WAIT:g} s); post one receive for each message sent (k and v in "
                "two messages: two receives), before waiting for the sends")

        def recorded_wait(work, *args, **kwargs):
            self.events.append(("wait", len(self.wire.calls)))
            if self.dropped:  # said before this wait, which may be for the message that send never brings
                raise AssertionError(
                    f"{self.name}: RingAttention let go of the Work of its send to rank {self.dropped[0]} without waiting "
                    "for it: wait for each Work once, a send's too (on gloo a send whose Work is dropped unfinished "
                    "is cancelled: its receiver waits for it forever)")
            self.unwaited.pop(id(work), None)
            if work in waited:  # said here: on gloo a send's second wait() never returns (measured, torch 2.14.1)
                raise AssertionError("RingAttention waited for a Work a second time: wait for each Work once (on gloo "
                                     "a send's second wait() never returns: the ring hangs there); after its wait, drop it")
            waited.add(work)
            self.unwaited_recvs.pop(id(work), None)
            result = wait_for_a_send(work) if work in self.send_order and not args and not kwargs else None
            result = wait(work, *args, **kwargs) if result is None else result
            tensor, copy, peer = self.in_flight.pop(id(work), (lambda: None, None, None))
            tensor = tensor()
            if tensor is not None and not bool(((tensor == copy) | (tensor.isnan() & copy.isnan())).all()):
                raise AssertionError(
                    f"{self.name}: RingAttention changed a tensor that it had posted in a dist.isend to rank {peer}, "
                    "before that send's wait: what its receiver gets is then the tensor as it was at some moment in "
                    "between (the sum so far, or part of this step's additions); post the send once the tensor is "
                    "final (this step's shares added in), or send a copy")
            tensor = self.recvs[work]() if work in self.recvs else None
            if tensor is not None:
                self.log.append(("arrived", *self.block_of(tensor)))
            return result

        def check_received(k, v):
            """Said where it happens: a block used before its receive's wait holds anything, and its values alone
            cannot say why."""
            storages = {t.untyped_storage().data_ptr() for t in (k, v)}
            for ref in self.unwaited_recvs.values():
                buffer = ref()
                if buffer is not None and buffer.untyped_storage().data_ptr() in storages:
                    raise AssertionError(
                        f"{self.name}: RingAttention computed with a block whose dist.irecv had not been waited for: "
                        "until that receive's wait() returns, its buffer may hold anything (gloo writes it when the "
                        "message arrives); wait for each receive (its Work, once) before using what it brings")

        def recorded_block(q, k, v, causal=False, q_pos=None, k_pos=None):
            check_received(k, v)
            self.pairs.append((q.data_ptr(), q.shape[2], self.which_keys(k)))
            self.events.append(("compute", len(self.wire.calls)))
            self.masks.append((bool(causal), None if q_pos is None else q_pos.clone(), self.which_keys(k)))
            self.blocks.append((q.shape[2] * k.shape[2], None if k_pos is None else k_pos.clone(), self.which_keys(k)))
            self.alive_peak = max(self.alive_peak, self.alive())
            return block(q, k, v, causal, q_pos, k_pos)

        def recorded_backward(dout, q, k, v, out, lse, causal=False, q_pos=None, k_pos=None):
            check_received(k, v)
            self.blocks.append((q.shape[2] * k.shape[2], None if k_pos is None else k_pos.clone(), self.which_keys(k)))
            keys = self.which_keys(k)
            self.log.append(("compute", None, None if keys is None else self.owner[int(keys[0])]))
            return block_backward(dout, q, k, v, out, lse, causal, q_pos, k_pos)

        ProcessGroup.recv, Work.wait, ProcessGroup.send = recorded_recv, recorded_wait, recorded_send
        Work.get_future, Work.is_completed = recorded_get_future, recorded_is_completed
        for module in self.modules:
            module.attention_block, module.attention_block_backward = recorded_block, recorded_backward
        return self

    def __exit__(self, *exc):
        from torch._C._distributed_c10d import ProcessGroup, Work
        ProcessGroup.recv, Work.wait, blocks, ProcessGroup.send, Work.get_future, Work.is_completed = self.saved
        for module, (block, block_backward) in zip(self.modules, blocks):
            module.attention_block, module.attention_block_backward = block, block_backward
        self.wire.__exit__(*exc)  # after: it puts back the ProcessGroup.recv that it found

    def not_waited(self):
        """(receives, sends) of the ring posted and never waited for, so far: a receive's Work still unwaited, a
        send's Work unwaited or let go of unwaited."""
        return len(self.unwaited_recvs), len(self.unwaited) + len(self.dropped)

    def take(self):
        """What happened since the last take: (messages, collectives, events, blocks, alive peak)."""
        calls = self.wire.calls[getattr(self, "_taken", 0):]
        self._taken = len(self.wire.calls)
        events, blocks, peak, masks, pairs = self.events, self.blocks, self.alive_peak, self.masks, self.pairs
        self.events, self.blocks, self.alive_peak, self.masks, self.log = [], [], self.alive(), [], []
        self.pairs = []
        messages = [(c.kind, str(c.dtype).replace("torch.", ""), c.numel, c.peer) for c in calls
                    if c.kind in ("send", "isend", "recv", "irecv")]
        collectives = [c.kind for c in calls if c.kind not in ("send", "isend", "recv", "irecv")]
        return dict(messages=messages, collectives=collectives, events=[e for e in events],
                    blocks=[(n, None if p is None else p.tolist(), None if w is None else w.tolist()) for n, p, w in blocks],
                    alive_peak=peak, masks=[(c, None if q is None else q.tolist(), None if k is None else k.tolist())
                                            for c, q, k in masks],
                    pairs=[(q, n, None if k is None else tuple(k.tolist())) for q, n, k in pairs])


def skipped_gradients(log):
    """The owner of a block that this rank sent on, computed nothing with, and moved past (the next block
    arrived) with no dK/dV sent in between, where at every step it computed it did send dK/dV in that span
    (a Recorder's log); else None."""
    spans = []  # (owner, what happened from its K/V send to the next K/V arrival)
    for i, (what, kind, owner) in enumerate(log):
        if (what, kind) == ("send", "kv"):
            end = next((j for j in range(i + 1, len(log)) if log[j][:2] == ("arrived", "kv")), None)
            if end is not None:
                spans.append((owner, log[i + 1:end]))
    def sent_grad(span):
        return any(e[:2] == ("send", "grad") for e in span)
    computed = [span for _, span in spans if any(e[0] == "compute" for e in span)]
    if not computed or not all(sent_grad(span) for span in computed):
        return None
    return next((owner for owner, span in spans if not any(e[0] == "compute" for e in span) and not sent_grad(span)),
                None)


def gradients_never_sent(log):
    """Whether this rank computed with its first block, received the next one and had sent no dK/dV at all (a
    Recorder's log): the first step's gradients stayed behind."""
    first = next((i for i, e in enumerate(log) if e[:2] == ("arrived", "kv")), None)
    return (first is not None and any(e[0] == "compute" for e in log[:first])
            and not any(e[:2] == ("send", "grad") for e in log))


def gradients_sent_n_minus_1_times(log, size):
    """Whether this rank went through the whole ring (N - 1 K/V blocks received) and sent N - 1 dK/dV blocks, each
    received too (a Recorder's log): one send short of bringing them home."""
    kinds = (("arrived", "kv"), ("send", "grad"), ("arrived", "grad"))
    count = {kind: sum(e[:2] == kind for e in log) for kind in kinds}
    return size > 1 and set(count.values()) == {size - 1}


def _rings(rank, size, impl, task, cases, backward, shape):
    """_ring for each (causal, layout) of cases, in one process group (a start of ranks is the slow part). A ring
    that sent more or fewer K/V bytes than it should stops the cases there: a message left over would be received
    by the next case's ring, which then waits forever (the first case's check says what was sent)."""
    results = []
    for causal, layout in cases:
        got = _ring(rank, size, impl, task, causal, layout, backward, shape)
        results.append(got)
        kv = 2 * got["out"].numel()
        for when, blocks in (("forward", size - 1), ("backward", 2 * size - 1)):
            sent = sum(m[2] for m in (got[when] or {}).get("messages", []) if m[0] in ("send", "isend"))
            if got[when] is not None and sent != blocks * kv:
                return results
    return results


def _ring(rank, size, impl, task, causal, layout, backward, shape):
    """One ring attention forward (and backward) on this rank: the values and what was recorded."""
    cp = judging(impl, task)
    q, k, v, dout = _inputs(*shape)
    mine = [_mine(t, rank, size, layout).clone() for t in (q, k, v, dout)]
    q_l, k_l, v_l = (t.clone().requires_grad_() for t in mine[:3])
    with Recorder(cp, k, v, size, layout, 2 * k_l.numel(), {"15.2": T152, "15.3": T153}.get(task, T154)) as rec:
        out = cp.ring_attention(q_l, k_l, v_l, None, causal, layout)
        forward = rec.take()
        forward.update(alive_after=rec.alive(), not_waited=rec.not_waited(), on_ctx=[  # what the forward left behind
            f"{name} (a {type(value).__name__} of tensors)" for name, value in vars(out.grad_fn).items()
            if isinstance(value, (list, tuple, dict))
            and any(torch.is_tensor(t) for t in (value.values() if isinstance(value, dict) else value))])
        saved = [tuple(t.shape) for t in out.grad_fn.saved_tensors]
        saved_lse = out.grad_fn.saved_tensors[4].detach().clone() if len(saved) == 5 else None
        saved_out = out.grad_fn.saved_tensors[3].detach().clone() if len(saved) == 5 else None
        extra = [name for name, value in vars(out.grad_fn).items() if torch.is_tensor(value)]
        try:
            grads = torch.autograd.grad(out, (q_l, k_l, v_l), mine[3]) if backward else None
        except (NotImplementedError, AssertionError):
            raise
        except Exception as error:  # noqa: BLE001  said with its cause where the log proves it, else as it was
            owner = skipped_gradients(rec.log)
            # where it raised, said too: a backward that sends its dK/dV later in a step and fails elsewhere before
            # that send leaves the same log as one that never sends them
            place = _student_frame(error)
            if "incorrect number of gradients" in str(error):
                raise AssertionError(
                    f"{rec.name}: RingAttention.backward: {error}: backward returns one value per input of forward "
                    "(q, k, v, group, causal, layout): dq, dk, dv, then None for each of the other three") from None
            raised = (f"{rec.name}: RingAttention.backward raised {type(error).__name__}"
                      f"{f' at {place}' if place else ''}: {error}")
            if owner is None and gradients_never_sent(rec.log):
                raise AssertionError(
                    f"{raised}, after its first step, where it computed with its own K/V block and passed the block on "
                    "with no dK/dV sent: the gradients go on with their block from the first step on, N = "
                    f"{size} sends, one at every step (step 0 too), so that after N hops they reach the block's "
                    "owner") from None
            if owner is None and gradients_sent_n_minus_1_times(rec.log, size):
                raise AssertionError(
                    f"{raised}, after the whole ring ({size - 1} K/V blocks received) with N - 1 = {size - 1} dK/dV "
                    f"blocks sent and as many received: the gradients need N = {size} sends, one at every step, the "
                    "last too: the last brings each block's summed dk, dv home to its owner (after N - 1 a rank "
                    f"holds rank {(rank + 1) % size}'s)") from None
            if owner is None:
                raise
            raise AssertionError(
                f"{raised}, after a step where it held "
                f"rank {owner}'s K/V block, computed nothing with it"
                + (" (causal: its keys lie after this rank's queries)" if causal and layout == "contiguous" and owner > rank
                   else "") + " and passed the block on without its dK/dV: the gradients go on with their block at EVERY step, also "
                "one where this rank adds nothing to them") from None
        back = rec.take() if backward else None
        if back is not None:
            back["not_waited"] = rec.not_waited()
    return dict(out=out.detach(), grads=grads, forward=forward, backward=back, saved=saved, extra=extra,
                saved_lse=saved_lse, saved_out=saved_out,
                shapes=dict(q=tuple(q_l.shape), lse=tuple(q_l.shape[:3])))


def _expected_lse(rank, size, layout, causal, shape):
    """This rank's rows of the log-sum-exp of the scaled scores over the whole sequence (torch's own ops, not the
    given attention_block), and, contiguous, that over the last block it meets alone (rank r + 1's keys)."""
    q, k, _, _ = _inputs(*shape)
    scores = q @ k.transpose(-2, -1) / shape[3] ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(shape[2], shape[2], dtype=torch.bool).triu(1), float("-inf"))
    mine = _mine(scores, rank, size, layout)  # (B, H, my rows, S)
    last = None
    if layout == "contiguous":
        last = mine.chunk(size, dim=-1)[(rank + 1) % size].logsumexp(dim=-1)
    return mine.logsumexp(dim=-1), last


def _block_alone(rank, size, causal, shape):
    """Contiguous layout: this rank's queries' attention over each rank's keys alone (torch's own ops; a row that
    sees no key of the block gives 0, as attention_block does), in the order of the owners."""
    q, k, v, _ = _inputs(*shape)
    scores = q @ k.transpose(-2, -1) / shape[3] ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(shape[2], shape[2], dtype=torch.bool).triu(1), float("-inf"))
    mine = scores.chunk(size, dim=2)[rank]
    return [torch.nan_to_num(block.softmax(dim=-1)) @ values
            for block, values in zip(mine.chunk(size, dim=-1), v.chunk(size, dim=2))]


def _expected_mine(rank, size, layout, causal, shape):
    q, k, v, dout = _inputs(*shape)
    out, grads = _reference(q, k, v, dout, causal)
    return _mine(out, rank, size, layout), [_mine(g, rank, size, layout) for g in grads]


def _check_order(rank, size, events):
    """Each step but the last: its message posted before its block is computed, and not yet waited for."""
    last_wait, computes = 0, 0
    for kind, posted in events:
        if kind == "wait":
            last_wait = posted
            continue
        computes += 1
        if computes >= size:  # the last step has nothing left to send
            break
        assert posted > last_wait, (
            f"{T152}: rank {rank} computed block {computes} of {size} with no message of the ring in flight: "
            + ("nothing was posted yet: post the send to r + 1 and the receive from r - 1 BEFORE computing the block "
               "you hold" if posted == 0 else
               "this step's send and receive were waited for before the block's compute, so nothing could overlap: "
               "post them, compute, THEN wait (each Work once)"))


def token_chunks_of(rank, size, tokens, layout):
    """The positions of the chunks of `rank` (a list per chunk, and the whole block), as the layouts define them:
    the test's own, not the code under test's."""
    if layout == "contiguous":
        return [list(range(rank * tokens, (rank + 1) * tokens))]
    half = tokens // 2
    chunks = [list(range(c * half, (c + 1) * half)) for c in (rank, 2 * size - 1 - rank)]
    return chunks + [chunks[0] + chunks[1]]


# A block that the code dropped can still be held: a finished Work keeps its tensor alive, and after
# `for work in works: work.wait()` the loop variable holds the last Work (a send of the old block, where the
# receive was posted first; measured with gloo, torch 2.14.1)
WORK_KEEPS_ITS_TENSOR = (" (what still holds an old block: a list or dict that each received block is added to; a "
                         "view of it, such as its k and v pieces from split or "
                         "indexing kept in a variable past the step; a finished Work, which keeps its tensor alive, "
                         "also the last one that the loop variable of `for work in works: work.wait()` still holds)")


def _outside_the_sequence(blocks, length):
    """The key positions of the first recorded block (a Recorder's) that reach outside the sequence 0 ... length - 1,
    else None."""
    return next((p for _, p, _ in blocks if p and (min(p) < 0 or max(p) >= length)), None)


def _outside_said(positions, length):
    """Said of a block whose key positions reach outside the sequence."""
    return (f"masked with the key positions {positions[:3]}..., outside the sequence 0 ... {length - 1}: the block's "
            "owner was counted outside the ranks 0 ... N - 1 (token_chunks gives positions for any number): "
            + ("r - s, without % N, is negative from step r + 1 on; the owner at step s is (r - s) % N"
               if min(positions) < 0 else "take the owner % N"))


def _check_forward(rank, size, got, causal, layout, shape):
    out, _ = _expected_mine(rank, size, layout, causal, shape)
    fwd, kv_numel = got["forward"], 2 * out.numel()
    wrong_way = [(p, w) for _, p, w in fwd["blocks"] if p is not None and w is not None and p != w]
    own = token_chunks_of(rank, size, out.shape[2], layout)
    sends = [m for m in fwd["messages"] if m[0] in ("send", "isend")]
    if sum(m[2] for m in sends) == (size - 1) * kv_numel:  # else the count is said below: one block more, never waited
        _check_all_waited(T152, rank, "forward", fwd.get("not_waited"))
    if not _close(got["out"], out):
        other_dtypes = sorted({m[1] for m in fwd["messages"]} - {"float64"})
        if other_dtypes:
            pytest.fail(f"{T152}: rank {rank} sent or received {other_dtypes[0]} messages in forward, though q, k and v "
                        "are float64: the blocks lose precision on the way (a buffer made in another dtype, or a "
                        f".to() before sending); keep the inputs' dtype (the output differs by "
                        f"{(got['out'] - out).abs().max() if got['out'].shape == out.shape else 'shape'})")
        outside = _outside_the_sequence(fwd["blocks"], shape[2])
        if outside is not None:
            pytest.fail(f"{T152}: rank {rank} computed a block {_outside_said(outside, shape[2])}")
        mine_again = [w for _, _, w in fwd["blocks"] if w is not None and w in own]
        chunks = 1 if layout == "contiguous" else 2
        if size > 1 and len(mine_again) > chunks * chunks:  # more than step 0's pairs: its own keys at a later step
            pytest.fail(f"{T152}: rank {rank} computed {len(mine_again)} blocks with its OWN keys (positions "
                        f"{mine_again[0][:3]}...), at steps after the first: the block that arrived never took the place "
                        "of the one it held; after a step's wait, the received block is the one to compute with and "
                        "to send on")
        seen = [pair for pair in fwd["pairs"] if pair[2] is not None]
        twice = next((pair for i, pair in enumerate(seen) if pair in seen[:i]), None)
        if twice is not None:
            pytest.fail(f"{T152}: rank {rank} computed the same query block with the keys of positions "
                        f"{list(twice[2][:3])}... twice ({len(fwd['blocks'])} blocks computed, {size} ranks): each "
                        f"rank's K/V block is met once, at one of the N = {size} steps; one step more computes the "
                        "last block again (as the block of another owner)")
        if wrong_way and all(p in own for p, _ in wrong_way):
            pytest.fail(f"{T152}: rank {rank} computed every block with its OWN tokens' positions as the keys' "
                        f"positions (keys of positions {wrong_way[0][1][:3]}... masked as {wrong_way[0][0][:3]}...): the "
                        "block held at step s is rank r - s's (its owner): take the key positions from "
                        "token_chunks(owner, ...), not from this rank's")
        unmasked = [(q, k) for c, q, k in fwd["masks"] if causal and not c and q is not None and k is not None
                    and max(k) > min(q)]
        if unmasked:
            pytest.fail(f"{T152}: rank {rank} computed the queries of positions {unmasked[0][0][:3]}... against the "
                        f"keys of positions {unmasked[0][1][:3]}... without the causal mask: a block with keys after "
                        "some of its queries (the diagonal block, equal chunk ids) must be masked: pass causal (and "
                        "the positions) to attention_block")
        if causal and any(c and q is None for c, q, _ in fwd["masks"]):
            pytest.fail(f"{T152}: rank {rank} called attention_block with causal but without q_pos and k_pos: it then "
                        "masks by the block's own row and column numbers, as if its queries and keys sat at the same "
                        "places; pass the global positions of the query chunk and of the key chunk (token_chunks)")
        if wrong_way:
            pytest.fail(f"{T152}: rank {rank} computed a block with the positions {wrong_way[0][0][:3]}... of one rank "
                        f"and the keys of positions {wrong_way[0][1][:3]}...: the ring turns the wrong way (or the "
                        "block's owner is counted the wrong way round): rank r sends to r + 1 and receives from r - 1, "
                        "so at step s it holds the block of rank r - s")
        seen = {j for _, _, w in fwd["blocks"] if w is not None for j in w}
        last = max(own[-1])  # with causal, every key up to this rank's last query is met (whole chunks)
        missing = sorted(j for j in range(shape[2]) if (not causal or j <= last) and j not in seen)
        if seen and missing:
            owner = next(r for r in range(size) if missing[0] in token_chunks_of(r, size, out.shape[2], layout)[-1])
            which = "causal: every key up to its last query" if causal else "every key of the sequence"
            pytest.fail(f"{T152}: rank {rank} computed no block with the keys of positions {missing[:3]}... (rank "
                        f"{owner}'s), which its queries must meet ({which})"
                        + (f": rank {owner}'s block is the one that arrives at the last step, after N - 1 = {size - 1} "
                           f"hops; the ring computes N = {size} blocks (its own first) and sends N - 1: the last step "
                           "computes the block that came and sends nothing" if owner == (rank + 1) % size else ""))
        pytest.fail(f"{T152}: rank {rank}'s output ({'causal' if causal else 'not causal'}, {layout}, {size} ranks) "
                    f"differs from F.scaled_dot_product_attention over the whole sequence by "
                    f"{(got['out'] - out).abs().max() if got['out'].shape == out.shape else 'shape'}")
    assert not fwd["collectives"], (
        f"{T152}: rank {rank}'s ring forward called {fwd['collectives']}: ring attention sends K/V blocks point to "
        "point (dist.isend / dist.irecv), never a collective over the whole K or V")
    assert sum(m[2] for m in sends) == (size - 1) * kv_numel and all(m[1] == "float64" for m in sends), (
        f"{T152}: rank {rank} sent {[(m[1], m[2]) for m in sends]} in forward; expected {size - 1} K/V blocks "
        f"({size - 1} x {kv_numel} float64 elements: k and v of its {out.shape[2]} tokens, N - 1 times)")
    assert all(m[3] == (rank + 1) % size for m in sends), (
        f"{T152}: rank {rank} sent to ranks {sorted({m[3] for m in sends})}: the ring sends to r + 1 only")
    if fwd.get("alive_after"):  # measured once forward returned: nothing of the ring is needed any more
        on_ctx = fwd.get("on_ctx")
        pytest.fail(f"{T152}: rank {rank}'s RingAttention.forward returned with {fwd['alive_after']:g} other ranks' K/V "
                    "blocks still alive" + (f", held by ctx.{on_ctx[0]}" if on_ctx else "") +
                    ": every received block must be let go of once its step is done; backward sends the blocks round "
                    "again and needs only q, k, v, out and lse (save_for_backward), so a block kept for it stays in "
                    "memory from the forward to the backward (N - 1 blocks: the whole K and V on every rank)")
    assert fwd["alive_peak"] <= 2 + 1e-9, (
        f"{T152}: rank {rank} held {fwd['alive_peak']:g} other ranks' K/V blocks at once: at most 2 (the one being "
        f"computed and the one arriving); let each go once the next has arrived{WORK_KEEPS_ITS_TENSOR}")
    assert sorted(got["saved"]) == sorted([got["shapes"]["q"]] * 4 + [got["shapes"]["lse"]]) and not got["extra"], (
        f"{T152}: RingAttention saved tensors of shapes {got['saved']} (and ctx tensors {got['extra']}) for backward: "
        "only this rank's q, k, v, out and lse (save_for_backward): the other blocks travel again in backward")
    lse, last = _expected_lse(rank, size, layout, causal, shape)
    saved_lse = got["saved_lse"]
    if saved_lse is not None and saved_lse.shape == lse.shape and not _close(saved_lse, lse):
        pytest.fail(f"{T152}: rank {rank}'s RingAttention saved an lse (the fifth of q, k, v, out, lse) that is not "
                    "the log-sum-exp of its queries' scores over the WHOLE sequence"
                    + (f": it is the last block's alone (rank {(rank + 1) % size}'s keys); save the merged lse, the "
                       "one that goes with the merged out" if last is not None and _close(saved_lse, last) else
                       f" (it differs by {(saved_lse - lse).abs().max():.3g})")
                    + ": the backward recomputes each block's probabilities as exp(s - lse) with it")
    saved_out = got.get("saved_out")
    if saved_out is not None and saved_out.shape == out.shape and not _close(saved_out, out):
        alone = next((owner for owner, block in enumerate(_block_alone(rank, size, causal, shape))
                      if layout == "contiguous" and _close(saved_out, block)), None)
        pytest.fail(f"{T152}: rank {rank}'s RingAttention saved an out (the fourth of q, k, v, out, lse) that is not "
                    "the output it returned"
                    + (f": it is the attention over rank {alone}'s keys alone, one block's partial output (a variable "
                       "named out, reused in the loop?); save the merged out, the one it returns" if alone is not None
                       else f" (it differs by {(saved_out - out).abs().max():.3g})")
                    + ": the backward's D = rowsum(dout * out) needs the whole attention's output")


def _check_all_waited(name, rank, when, not_waited):
    """Said before the values, which a receive not waited for may or may not spoil (gloo writes its buffer when the
    message arrives): a Work of the ring that the forward or backward returned without waiting for."""
    receives, sends = not_waited or (0, 0)
    if receives or sends:
        pytest.fail(f"{name}: rank {rank}'s RingAttention.{when} returned without waiting for "
                    + " and ".join(f"{n} {what}{'s' if n > 1 else ''}" for n, what in (
                        (receives, "dist.irecv"), (sends, "dist.isend")) if n)
                    + " that it posted: wait for every Work once, the last step's too (until a receive's wait() "
                    "returns, its buffer may hold anything: what it returns from it is then right or not by chance; "
                    "on gloo a send whose Work is dropped unfinished is cancelled)")


def _check_block_pairs(cp):
    """block_pairs on chunk lists written here (contiguous and zig-zag, 3 ranks), before any rank starts: a pair it
    leaves out makes a ring that fails with an error saying nothing of the cause."""
    def chunks(ids):
        return [(c, torch.arange(2 * c, 2 * c + 2)) for c in ids]
    for q_ids, k_ids in (([1], [1]), ([2], [0]), ([0], [2]), ([1, 4], [1, 4]), ([0, 5], [2, 3]), ([2, 3], [0, 5])):
        for causal in (False, True):
            got = cp.block_pairs(chunks(q_ids), chunks(k_ids), causal)
            expected = [(i, j) for i, q in enumerate(q_ids) for j, k in enumerate(k_ids) if not causal or k <= q]
            missing = [(i, j) for i, j in expected if (i, j) not in got]
            if missing:
                i, j = missing[0]
                pytest.fail(f"{T152}: block_pairs(query chunk ids {q_ids}, key chunk ids {k_ids}, causal={causal}) gave "
                            f"{got}: it left out the pair {(i, j)}, query chunk {q_ids[i]} and key chunk {k_ids[j]}"
                            + (": a pair of equal ids (the diagonal block) is kept with causal, attention_block masks "
                               "it by the positions; only a key chunk wholly AFTER the query chunk (a larger id) is "
                               "left out" if q_ids[i] == k_ids[j] else
                               ": without causal every pair is computed" if not causal else
                               ": a key chunk before the query chunk is wholly visible"))


def ring_hang_hint(text):
    """What the stuck ranks of a RankTimeout's report (the harness's stacks) say of the ring, where it proves a
    cause: every rank in a blocking send, or in a blocking receive, or a rank that finished while the others wait.
    (A message to or from the wrong rank, and a send's Work dropped, are said by the Recorder where they happen.)"""
    stacks = re.findall(r"rank \d+ was at:(.*?)(?=rank \d+ was at:|\Z)", text, re.DOTALL)
    finished = re.search(r"\(ranks \[([\d, ]*)\] had finished\)", text)
    finished = finished.group(1).strip() if finished else ""
    if finished:
        return (f"rank{'s' if ',' in finished else ''} {finished} had finished while the others still waited in the ring: a rank that leaves the "
                "ring early (a break or a return before its last send and receive) leaves its neighbours waiting for "
                "it; every rank takes part in every step, passing each block on even where it computes nothing with "
                "it (causal)")
    if stacks and all(" in blocking_send" in stack for stack in stacks):
        return ("every rank waits in a blocking dist.send, which on gloo returns only once the receiver has posted "
                "a receive that matches it: either neighbours that all send first wait for each other, or the "
                "receive posted does not match the send (another tag, peer or size); post the send and the receive "
                "(dist.isend, dist.irecv), matching (same tag), then wait for both")
    if stacks and all(" in blocking_recv" in stack for stack in stacks):
        return ("every rank waits in a blocking dist.recv: either the receive was posted before the rank's own send "
                "(each waits for a neighbour that is itself waiting to receive; post the send and the receive "
                "(dist.isend, dist.irecv), then wait for both), or it is a receive that no rank sends to (count the "
                "receives and the sends: N - 1 of each for the K/V blocks, in forward and in backward; N of each "
                "for the dK/dV)")
    return "the stacks below say where each rank waited"


def run_ring(name, fn, size, *args):
    """run_ranks(fn, size, *args), a hang said as the ring's (ring_hang_hint)."""
    try:
        return run_ranks(fn, size, *args)
    except RankTimeout as error:
        pytest.fail(f"{name}: the ring hung ({size} ranks): {ring_hang_hint(str(error))}.\n{error}")


@pytest.mark.task15_2
@pytest.mark.parametrize("size", [3, slow(2), slow(4)])
def test_ring_forward_is_attention_over_the_whole_sequence(impl, size):
    _check_block_pairs(judging(impl, "15.2"))
    shape = (2, 2, 4 * size, 4)
    cases = [(False, "contiguous"), (True, "contiguous")]
    for rank, runs in enumerate(run_ring(T152, _rings, size, impl, "15.2", cases, False, shape)):
        for (causal, _), got in zip(cases, runs):
            _check_forward(rank, size, got, causal, "contiguous", shape)
            if not causal:
                _check_order(rank, size, got["forward"]["events"])
            pairs = sum(n for n, _, _ in got["forward"]["blocks"])
            expected = (rank + 1 if causal else size) * (4 * 4)  # contiguous causal: r + 1 blocks of 4 x 4 pairs
            assert pairs == expected, (
                f"{T152}: rank {rank} computed {pairs} query-key pairs, expected {expected}"
                + (": it computed a block wholly in the future of its queries; with causal, such a block is skipped "
                   "(fully masked: no compute), though it still passes along the ring" if pairs > expected else ""))


@pytest.mark.task15_2
@pytest.mark.slow
def test_ring_holds_at_most_two_remote_blocks_on_four_ranks(impl):
    """With 4 ranks a rank receives 3 blocks: one that keeps them all holds 3."""
    judging(impl, "15.2")
    for rank, got in enumerate(run_ring(T152, _ring, 4, impl, "15.2", False, "contiguous", False, (1, 2, 8, 2))):
        _check_forward(rank, 4, got, False, "contiguous", (1, 2, 8, 2))


def _ring_in_groups(rank, size, impl):
    """Ring attention (forward and backward) inside the groups [0, 1] and [2, 3] of 4 ranks, where a
    group's rank is not the global one."""
    cp = judging(impl, "15.2")
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group, grank = groups[rank // 2], rank % 2
    q, k, v, dout = _inputs(2, 2, 8, 4, seed=rank // 2)
    mine = [_mine(t, grank, 2, "contiguous") for t in (q, k, v, dout)]
    q_l, k_l, v_l = (t.clone().requires_grad_() for t in mine[:3])
    out = cp.ring_attention(q_l, k_l, v_l, group, True)
    return out.detach(), torch.autograd.grad(out, (q_l, k_l, v_l), mine[3])


@pytest.mark.task15_2
@pytest.mark.slow
def test_ring_runs_inside_groups_that_do_not_start_at_rank_0(impl):
    judging(impl, "15.2")
    global_ranks = ("dist.isend and dist.irecv take GLOBAL ranks; in a group, the neighbour's is "
                    "dist.get_global_rank(group, (r + 1) % N)")
    try:
        results = run_ranks(_ring_in_groups, 4, impl, timeout=20)
    except RankTimeout as error:
        pytest.fail(f"{T152}: ring attention inside the groups [0, 1] and [2, 3] did not finish (a send to a rank that "
                    f"never receives it): {global_ranks}\n{error}")
    except RankFailed as error:
        if "is not part of group" not in str(error):
            raise
        asked = re.search(r"Group rank (\d+) is not part of group", str(error))
        if asked and int(asked.group(1)) >= 2:
            pytest.fail(f"{T152}: ring attention inside the groups [0, 1] and [2, 3] asked dist.get_global_rank for "
                        f"rank {asked.group(1)} of a group of 2 ranks: the ring's rank and size were the world's; in a "
                        "group they are the group's, dist.get_rank(group) and dist.get_world_size(group) (dist.isend "
                        f"and dist.irecv then take the global ranks of its neighbours)\n{error}")
        pytest.fail(f"{T152}: ring attention inside the groups [0, 1] and [2, 3] sent to a rank outside its group: "
                    f"{global_ranks}\n{error}")
    for rank, (out, grads) in enumerate(results):
        q, k, v, dout = _inputs(2, 2, 8, 4, seed=rank // 2)
        expected, expected_grads = _reference(q, k, v, dout, True)
        assert _close(out, _mine(expected, rank % 2, 2, "contiguous")), (
            f"{T152}: rank {rank} (rank {rank % 2} of the group {[rank - rank % 2, rank - rank % 2 + 1]}): ring "
            "attention inside a group differs from SDPA over the group's sequence: in a group, ranks are the group's "
            "(dist.get_rank(group)), and dist.isend / dist.irecv take global ones (dist.get_global_rank)")
        for g, e in zip(grads, expected_grads):
            assert _close(g, _mine(e, rank % 2, 2, "contiguous")), f"{T152}: rank {rank}'s gradients inside a group"


# --------------------------------------------------------------------------- Task 15.3
def _shares(rank, size, causal, shape):
    """Contiguous layout: the parts of this rank's gradients that one block pair gives (support/attention.py's
    given blocks, with the whole sequence's out and lse): [dq from each owner's keys], [(dk, dv) from each
    rank's queries]. To name a sum that kept one part only; the values are judged against SDPA."""
    q, k, v, dout = _inputs(*shape)
    tokens = shape[2] // size
    whole = torch.arange(shape[2])

    def mine(x, r):
        return x.chunk(size, dim=2)[r]

    def pos(r):
        return torch.arange(r * tokens, (r + 1) * tokens)

    def backward(s, owner):
        out, lse = attention_block(mine(q, s), k, v, causal, pos(s), whole)
        return attention_block_backward(mine(dout, s), mine(q, s), mine(k, owner), mine(v, owner), out, lse, causal,
                                        pos(s), pos(owner))
    return ([backward(rank, owner)[0] for owner in range(size)],
            [backward(s, rank)[1:] for s in range(size)])


def _with_block_softmax(rank, size, causal, shape):
    """Contiguous layout: this rank's dq, dk, dv as a backward that gives attention_block_backward each block's own
    out and lse (attention_block of that block alone) instead of the whole attention's would compute them."""
    q, k, v, dout = _inputs(*shape)
    tokens = shape[2] // size

    def mine(x, r):
        return x.chunk(size, dim=2)[r]

    def pos(r):
        return torch.arange(r * tokens, (r + 1) * tokens)

    def backward(s, owner):
        if causal and owner > s:
            return [torch.zeros_like(mine(q, s))] * 3
        out, lse = attention_block(mine(q, s), mine(k, owner), mine(v, owner), causal, pos(s), pos(owner))
        return attention_block_backward(mine(dout, s), mine(q, s), mine(k, owner), mine(v, owner), out, lse, causal,
                                        pos(s), pos(owner))
    return dict(dq=sum(backward(rank, owner)[0] for owner in range(size)),
                dk=sum(backward(s, rank)[1] for s in range(size)), dv=sum(backward(s, rank)[2] for s in range(size)))


def _with_dout_and_out_as(rank, size, layout, causal, shape):
    """This rank's dq, dk, dv as the softmax attention's backward computes them over the whole sequence (torch's own
    ops, written here) when it is given other tensors for the output gradient dout and the forward's output out: by
    the names of the tensors given in their places, {(for dout, for out): {"dq": ..., "dk": ..., "dv": ...}}. With
    p = softmax(s): dv = p^T dout, ds = p * (dout v^T - rowsum(dout * out)), dq = ds k / sqrt(D),
    dk = ds^T q / sqrt(D)."""
    q, k, v, dout = _inputs(*shape)
    out, _ = _reference(q, k, v, dout, causal)
    scale = shape[3] ** -0.5
    scores = q @ k.transpose(-2, -1) * scale
    if causal:
        scores = scores.masked_fill(torch.ones(shape[2], shape[2], dtype=torch.bool).triu(1), float("-inf"))
    p = scores.softmax(dim=-1)

    def backward(g, o):
        ds = p * (g @ v.transpose(-2, -1) - (g * o).sum(dim=-1, keepdim=True))
        grads = dict(dq=ds @ k * scale, dk=ds.transpose(-2, -1) @ q * scale, dv=p.transpose(-2, -1) @ g)
        return {what: _mine(grad, rank, size, layout) for what, grad in grads.items()}
    given = dict(dout=dout, out=out)
    return {names: backward(*(given[name] for name in names))
            for names in (("dout", "dout"), ("out", "out"), ("out", "dout"))}


DOUT_AND_OUT = {  # (given for dout, given for out): what the backward did, said after "when"
    ("dout", "dout"): "the output gradient dout stands where the forward's output out belongs: the softmax backward's "
                      "term D = rowsum(dout * out) became rowsum(dout * dout); attention_block_backward takes dout "
                      "first and the out that forward saved fifth",
    ("out", "out"): "the forward's output out stands where the output gradient dout belongs (as if the gradient of the "
                    "output were out itself); attention_block_backward takes dout, backward's argument, first and the "
                    "out that forward saved fifth",
    ("out", "dout"): "dout and out are swapped; attention_block_backward takes the output gradient dout (backward's "
                     "argument) first and the out that forward saved fifth",
}


def _dout_and_out_mixed_up(got, rank, size, layout, causal, shape):
    """The (given for dout, given for out) of DOUT_AND_OUT whose gradients are this rank's dq, dk, dv (got), else
    None."""
    for names, mixed in _with_dout_and_out_as(rank, size, layout, causal, shape).items():
        if all(_close(g, mixed[what]) for g, what in zip(got, ("dq", "dk", "dv"))):
            return names
    return None


A_NEW_DQ = ("a dq made anew at each step keeps only the last step's share: create dq (and its views) once, before "
            "the loop")


def last_step_computed(back, rank, size, layout, shape):
    """Whether this rank computed a block pair with the keys of the block it holds at the last step, rank r + 1's
    (the backward's recorded blocks); True where a block's keys are not known."""
    last = set(token_chunks_of((rank + 1) % size, size, shape[2] // size, layout)[-1])
    known = [keys if keys is not None else pos for _, pos, keys in back["blocks"]]
    return any(keys is None or last & set(keys) for keys in known)


def _check_backward(rank, size, got, causal, layout, shape, task):
    name = T153 if task == "15.3" else T154
    _, grads = _expected_mine(rank, size, layout, causal, shape)
    back, kv_numel = got["backward"], 2 * grads[1].numel()
    sends = [m for m in back["messages"] if m[0] in ("send", "isend")]
    sent = sum(m[2] for m in sends)
    _check_all_waited(name, rank, "backward", back.get("not_waited"))
    for what, g, e in zip(("dq", "dk", "dv"), got["grads"], grads):
        if not _close(g, e):
            why = ""
            elsewhere = sorted({m[3] for m in sends} - {(rank + 1) % size})
            wrong_way = [(p, w) for _, p, w in back["blocks"] if p is not None and w is not None and p != w]
            other_dtypes = sorted({m[1] for m in sends} - {"float64"})
            if other_dtypes:
                why = (f": rank {rank} sent {other_dtypes[0]} messages in backward, though q, k, v and the output "
                       "gradient are float64: the gradients lose precision on the way (a buffer made in another "
                       "dtype, or a .float()); keep the inputs' dtype")
            elif (g.shape == e.shape and g.abs().max() > 0 and torch.equal(g, g.float().double())
                  and not torch.equal(e, e.float().double()) and torch.allclose(g, e, rtol=1e-5, atol=1e-6)):
                why = (f": every value of it is a float32 number, though q, k, v and the output gradient are float64: "
                       f"{what} was accumulated or returned in float32 (a buffer made with dtype=torch.float32, or "
                       "with torch.zeros(shape), torch's default dtype; or a .float()), and autograd cast it back to "
                       "q's dtype; keep the inputs' dtype (torch.zeros_like)")
            elif (outside := _outside_the_sequence(back["blocks"], shape[2])) is not None:
                why = f": rank {rank}'s backward computed a block {_outside_said(outside, shape[2])}"
            elif wrong_way:
                why = (f": rank {rank}'s backward computed a block with the key positions {wrong_way[0][0][:3]}... and "
                       f"the keys of positions {wrong_way[0][1][:3]}...: the ring turns the wrong way in backward (or "
                       "the block's owner is counted the wrong way round): at step s a rank holds the block of rank "
                       "r - s, as in forward")
            elif layout == "contiguous" and _close(g, _with_block_softmax(rank, size, causal, shape)[what]):
                why = (": each block's gradients were computed with that block's OWN out and lse (attention_block's "
                       "of the block alone): its probabilities exp(s - lse) must be those of the WHOLE attention, "
                       "with the out and lse that forward saved (attention_block_backward's docstring)")
            elif (mixed := _dout_and_out_mixed_up(got["grads"], rank, size, layout, causal, shape)) is not None:
                why = (f": rank {rank}'s dq, dk and dv are what the backward gives when {DOUT_AND_OUT[mixed]}"
                       + (" (dv, which does not use D, is right)"
                          if mixed == ("dout", "dout") and _close(got["grads"][2], grads[2]) else ""))
            elif what != "dq" and all(_close(a, b) for a, b in zip(got["grads"][1:], grads[:0:-1])):
                why = (": this rank's dk is SDPA's dv and its dv is SDPA's dk: dk and dv are swapped (in the order "
                       "they are returned, in the order they were stacked, or which of attention_block_backward's "
                       "dk, dv was added into which)")
            elif what != "dq" and sent <= (size - 1) * kv_numel:
                why = (": dk and dv were left on the rank that computed them; they belong to the block's owner, "
                       "and must travel with their K/V block round the ring to end there")
            elif what != "dq" and elsewhere:
                why = (f": rank {rank} sent to rank(s) {elsewhere} in backward: dk and dv travel WITH their K/V block, "
                       f"the same way round the ring (to r + 1 = {(rank + 1) % size}, from r - 1), so that after N "
                       "hops they reach the block's owner")
            elif what != "dq" and sent == (2 * size - 2) * kv_numel:
                why = (f": rank {rank} sent N - 1 = {size - 1} dK/dV blocks, as many as K/V blocks: the gradients need N "
                       f"= {size} sends, the last one bringing each block's summed dk, dv home to its owner (after N - 1 "
                       f"a rank holds rank {(rank + 1) % size}'s)")
            elif what == "dq" and e.abs().max() > 0 and not g.abs().max() > 0 and back["blocks"]:
                pairs = len(back["blocks"])
                why = (f": it is all zeros, though this rank computed the shares of {pairs} block pair"
                       f"{'s' if pairs > 1 else ''} (attention_block_backward): none of them reached the dq it returns; add each share into dq "
                       "itself or into views of it (split, slicing), not into copies (clone, torch.cat, a new tensor)")
                if not last_step_computed(back, rank, size, layout, shape):
                    why += (f"; or {A_NEW_DQ} (this rank's last step, with rank {(rank + 1) % size}'s block, computed "
                            "nothing)")
            elif layout == "contiguous":
                dq_shares, dkv_shares = _shares(rank, size, causal, shape)
                shares = dq_shares if what == "dq" else [dkv[what == "dv"] for dkv in dkv_shares]
                one = [i for i, share in enumerate(shares) if share.abs().max() > 0 and _close(g, share)]
                if one and what == "dq":
                    why = (f": dq holds the share of one K/V block only (rank {one[0]}'s keys): this rank's queries "
                           "meet every block in turn, and dq is the SUM of their shares: add each block's dq, do not "
                           "overwrite it" + (f"; or {A_NEW_DQ} (rank {one[0]}'s block came at the last step)"
                                             if one[0] == (rank + 1) % size else ""))
                elif one:
                    why = (f": {what} holds the share of one rank's queries only (rank {one[0]}'s): the block's dK/dV "
                           "must be SUMMED as it travels round the ring (add this rank's share to what arrived from "
                           "r - 1), not restarted from zeros at each step")
            pytest.fail(f"{name}: rank {rank}'s {what} ({'causal' if causal else 'not causal'}, {layout}, {size} "
                        f"ranks) differs from F.scaled_dot_product_attention's by "
                        f"{(g - e).abs().max() if g.shape == e.shape else 'shape'}{why}")
    assert not back["collectives"], (
        f"{name}: rank {rank}'s ring backward called {back['collectives']}: the K/V blocks and their gradients go "
        "point to point, never a collective over the whole K or V")
    assert sent == (2 * size - 1) * kv_numel and all(m[3] == (rank + 1) % size for m in sends), (
        f"{name}: rank {rank} sent {[(m[2], m[3]) for m in sends]} in backward; expected N - 1 = {size - 1} K/V "
        f"blocks and N = {size} dK/dV blocks ({kv_numel} elements each) to rank {(rank + 1) % size}")
    assert back["alive_peak"] <= 4 + 1e-9, (
        f"{name}: rank {rank} held {back['alive_peak']:g} other ranks' blocks at once in backward (K/V and dK/dV): at "
        f"most 2 of each{WORK_KEEPS_ITS_TENSOR}")


def _check_backward_ring_direction(results, cases, size, shape):
    """A rank's wrong gradients can come from another rank's backward (causal: rank 0 computes one block only): a
    backward that computed a block with another rank's positions is said first, with the rank that did."""
    for (causal, layout), runs in zip(cases, zip(*results)):
        outside = [(rank, _outside_the_sequence(got["backward"]["blocks"], shape[2])) for rank, got in enumerate(runs)
                   if got["backward"] is not None]
        outside = [(rank, p) for rank, p in outside if p is not None]
        if outside:
            pytest.fail(f"{T153}: rank {outside[0][0]}'s backward ({'causal' if causal else 'not causal'}, {layout}, "
                        f"{size} ranks) computed a block {_outside_said(outside[0][1], shape[2])}")
        wrong = [(rank, p, w) for rank, got in enumerate(runs) if got["backward"] is not None
                 for _, p, w in got["backward"]["blocks"] if p is not None and w is not None and p != w]
        if wrong and not all(all(_close(g, e) for g, e in zip(got["grads"], _expected_mine(r, size, layout, causal,
                                                                                           shape)[1]))
                             for r, got in enumerate(runs)):
            rank, p, w = wrong[0]
            pytest.fail(f"{T153}: rank {rank}'s backward ({'causal' if causal else 'not causal'}, {layout}, {size} ranks) "
                        f"computed a block with the key positions {p[:3]}... and the keys of positions {w[:3]}...: the "
                        "ring turns the wrong way in backward (or the block's owner is counted the wrong way round): "
                        "at step s a rank holds the block of rank r - s, as in forward; wrong gradients follow on "
                        "every rank")


@pytest.mark.task15_3
@pytest.mark.parametrize("size", [3, slow(2), slow(4)])
def test_ring_backward_gives_each_rank_its_own_gradients(impl, size):
    judging(impl, "15.3")
    shape = (2, 2, 4 * size, 4)
    cases = [(True, "contiguous"), (False, "contiguous")] if size != 3 else [(True, "contiguous")]
    results = run_ring(T153, _rings, size, impl, "15.3", cases, True, shape)
    _check_backward_ring_direction(results, cases, size, shape)
    for rank, runs in enumerate(results):
        for (causal, _), got in zip(cases, runs):
            _check_backward(rank, size, got, causal, "contiguous", shape, "15.3")


# --------------------------------------------------------------------------- Task 15.4
def _zigzag_and_ring(rank, size, impl, shape):
    zigzag = _zigzag(rank, size, impl)
    if any(isinstance(pos, str) for _, pos in zigzag["chunks"]):  # positions not a tensor: said by the test
        return zigzag, None
    return zigzag, _ring(rank, size, impl, "15.4", True, "zigzag", True, shape)


def _zigzag(rank, size, impl):
    cp = judging(impl, "15.4")
    x = torch.arange(2.0 * 3 * 4 * size * 2, dtype=torch.float64).view(2, 3, 4 * size, 2)  # float64, as the ring
    out = dict(chunks=[(cid, pos.tolist() if torch.is_tensor(pos) else f"a {type(pos).__name__}")
                       for cid, pos in cp.token_chunks(rank, size, 4, "zigzag")])
    out["shard"] = cp.zigzag_shard(x)
    with Wire() as wire:
        try:  # said by the test: torch's error names the dtypes, not the buffers that have them
            out["whole"] = cp.zigzag_unshard(_mine(x, rank, size, "zigzag"))
        except ValueError as error:
            if "different dtypes" not in str(error) or not wire.calls:
                raise
            out["whole"] = (wire.calls[-1].kind, sorted({dtype for dtype, _ in wire.calls[-1].tensors}))
    out["unshard_calls"] = [c.kind for c in wire.calls]
    # along another dim (tokens first: (B, S, H, D)), as the docstring's `dim` allows
    try:  # said by the test: an index error alone names no cause
        out["shard_dim1"] = cp.zigzag_shard(x.movedim(2, 1), dim=1)
        out["whole_dim1"] = cp.zigzag_unshard(_mine(x, rank, size, "zigzag").movedim(2, 1), dim=1)
    except NotImplementedError:
        raise
    except (IndexError, RuntimeError, ValueError) as error:
        out["shard_dim1"] = out["whole_dim1"] = one_line(error)
    if size == 3:  # in the groups [0] and [1, 2], where a group's rank is not the global one
        group = [dist.new_group([0]), dist.new_group([1, 2])][min(rank, 1)]
        members = [0] if rank == 0 else [1, 2]
        with Wire() as wire:
            try:
                out["in_group"] = (cp.zigzag_shard(x, group),
                                   cp.zigzag_unshard(_mine(x, members.index(rank), len(members), "zigzag"), group))
            except (RuntimeError, ValueError, IndexError) as error:
                out["in_group"] = one_line(error)
        out["in_group_sizes"] = sorted({c.group_size for c in wire.calls})
    out["uneven"] = {}
    for tokens in (2 * size + 1, 3 * size):  # 3N: N divides it, 2N does not (a check of % N lets it through)
        try:
            cp.zigzag_shard(torch.zeros(1, 1, tokens, 1))
            out["uneven"][tokens] = None
        except NotImplementedError:
            raise
        except ValueError:
            out["uneven"][tokens] = "ValueError"
        except Exception as error:  # noqa: BLE001  said by the test
            out["uneven"][tokens] = one_line(error)
    return out


@pytest.mark.task15_4
@pytest.mark.parametrize("size", [3, slow(2), slow(4)])
def test_zigzag_shard_unshard_chunks_and_the_balanced_ring(impl, size):
    judging(impl, "15.4")
    x = torch.arange(2.0 * 3 * 4 * size * 2, dtype=torch.float64).view(2, 3, 4 * size, 2)  # float64, as the ring
    shape = (2, 2, 4 * size, 4)
    results = run_ranks(_zigzag_and_ring, size, impl, shape)
    for rank, (got, _) in enumerate(results):
        mine = _mine(x, rank, size, "zigzag")
        if not torch.equal(got["shard"], mine):
            swapped = torch.cat(mine.chunk(2, dim=2)[::-1], dim=2)
            pytest.fail(f"{T154}: zigzag_shard on rank {rank} of {size}: " + (
                "the two chunks are in the wrong order: chunk r first, then chunk 2N-1-r" if torch.equal(
                    got["shard"], swapped) else f"not chunks {rank} and {2 * size - 1 - rank} of the {2 * size}"))
        expected = [(c, list(range(c * 2, c * 2 + 2))) for c in (rank, 2 * size - 1 - rank)]
        kinds = [pos for _, pos in got["chunks"] if isinstance(pos, str)]
        assert not kinds, (
            f"{T154}: token_chunks({rank}, {size}, 4, 'zigzag') gave the positions as {kinds[0] if kinds else ''}, not "
            "a tensor: positions is a 1-D long tensor of the chunk's global positions (torch.arange), as the "
            "contiguous layout's; attention_block compares them as tensors to mask")
        assert got["chunks"] == expected, (
            f"{T154}: token_chunks({rank}, {size}, 4, 'zigzag') gave {got['chunks']}; expected chunk ids {rank} and "
            f"{2 * size - 1 - rank} (in that order) with their global positions, 2 tokens each"
            + (": the right chunks in the wrong order; on every rank, odd or even, chunk r comes first, then 2N-1-r: "
               "the order they lie in this rank's tensors (zigzag_shard's)" if got["chunks"] == expected[::-1] else ""))
        parts = torch.cat([_mine(x, r, size, "zigzag") for r in range(size)], dim=2)
        if isinstance(got["whole"], tuple):
            pytest.fail(f"{T154}: zigzag_unshard on rank {rank}, given a float64 x, called {got['whole'][0]} with "
                        f"tensors of the dtypes {got['whole'][1]}, which torch refused (\"different dtypes\"): the "
                        "buffers that receive must be like x (torch.empty_like), not made in torch's default dtype")
        halves = [c for r in range(size) for c in _mine(x, r, size, "zigzag").chunk(2, dim=2)]  # r's two, in turn
        swapped = [None] * (2 * size)
        for r in range(size):  # each rank's first half put at place 2N-1-r, its second at place r
            swapped[2 * size - 1 - r], swapped[r] = halves[2 * r], halves[2 * r + 1]
        swapped = torch.cat(swapped, dim=2)
        assert torch.equal(got["whole"], x), f"{T154}: zigzag_unshard on rank {rank} did not give the whole sequence in order" + (
            ": it concatenated the ranks' parts as they lie; rank r's part is chunks r and 2N-1-r of the sequence: put "
            "each chunk back at its place" if got["whole"].shape == parts.shape and torch.equal(got["whole"], parts) else
            ": each rank's two halves went to each other's places: a part is chunk r FIRST, then chunk 2N-1-r "
            "(zigzag_shard's order), so its first half goes to place r and its second to place 2N-1-r"
            if got["whole"].shape == swapped.shape and torch.equal(got["whole"], swapped) else "")
        for tokens, raised in got["uneven"].items():
            assert raised == "ValueError", (
                f"{T154}: zigzag_shard of {tokens} tokens over {size} ranks did not raise ValueError"
                + (f" (it raised {raised})" if raised else " (it returned)") + ": the sequence must cut into 2N = "
                f"{2 * size} equal chunks" + (f"; {tokens} divides by N = {size} but not by 2N" if tokens % size == 0 else ""))
        raised = "" if torch.is_tensor(got["shard_dim1"]) else f" (it raised {got['shard_dim1']})"
        assert not raised and torch.equal(got["shard_dim1"], mine.movedim(2, 1)) and torch.equal(
            got["whole_dim1"], x.movedim(2, 1)), (
            f"{T154}: zigzag_shard / zigzag_unshard with dim=1 (tokens in dim 1) on rank {rank}{raised}: not chunks "
            f"{rank} and {2 * size - 1 - rank} along dim 1, or not the whole sequence back along it: cut, check and "
            "concatenate along `dim`, not along 2")
    if size == 3:
        _check_zigzag_in_groups(x, [got for got, _ in results])
    work = []
    for rank, (_, got) in enumerate(results):
        out, _ = _expected_mine(rank, size, "zigzag", True, shape)
        assert _close(got["out"], out), (
            f"{T154}: rank {rank}'s zig-zag causal output differs from F.scaled_dot_product_attention's over the "
            "whole sequence: its chunks are r and 2N-1-r (token_chunks), masked by their true positions; "
            "RingAttention (Tasks 15.2, 15.3) must ask token_chunks with its `layout` for this rank's chunks and for "
            "every block's owner")
        _check_backward(rank, size, got, True, "zigzag", shape, "15.4")
        work.append(len(got["forward"]["blocks"]))
    assert work == [2 * size + 1] * size, (
        f"{T154}: the ranks computed {work} chunk pairs in the zig-zag causal forward; expected 2N+1 = {2 * size + 1} "
        "on every rank (the pairs whose key chunk lies wholly after the query chunk skipped)")


def _check_zigzag_in_groups(x, results):
    """zigzag_shard and zigzag_unshard with group=, in the groups [0] and [1, 2] of 3 ranks."""
    for rank, got in enumerate(results):
        members = [0] if rank == 0 else [1, 2]
        grank, gsize = members.index(rank), len(members)
        where = f"{T154}: rank {rank} (rank {grank} of the group {members} of 3 ranks)"
        assert got["in_group_sizes"] in ([], [gsize]), (
            f"{where}: zigzag_unshard(x, group) ran a collective over {got['in_group_sizes']} ranks, not over the "
            f"{gsize} of the group it was given: pass group=group to the collective (the default group is all 3)")
        listed = re.search(r"expected length (\d+), got (\d+)", got["in_group"]) if isinstance(got["in_group"], str) else None
        assert not isinstance(got["in_group"], str), (
            f"{where}: zigzag_shard / zigzag_unshard with group= raised {got['in_group']}" + (
                f": zigzag_unshard's gather list holds one buffer per rank of the world ({len(results)}), not of the "
                f"group ({gsize}): count the group's ranks, dist.get_world_size(group)"
                if listed and listed.groups() == (str(gsize), str(len(results))) else ""))
        shard, whole = got["in_group"]
        if not torch.equal(shard, _mine(x, grank, gsize, "zigzag")):
            world_rank = torch.cat([x.chunk(2 * gsize, dim=2)[c] for c in (rank, 2 * gsize - 1 - rank)], dim=2) \
                if rank < 2 * gsize else None
            world_size = _mine(x, grank, len(results), "zigzag")  # cut into 2 x the world's size
            pytest.fail(f"{where}: zigzag_shard(x, group) is not chunks {grank} and {2 * gsize - 1 - grank} of the "
                        f"{2 * gsize}" + (f": it took chunks {rank} and {2 * gsize - 1 - rank}, by the GLOBAL rank; "
                                          "the chunks are the group's: dist.get_rank(group)"
                                          if world_rank is not None and shard.shape == world_rank.shape
                                          and torch.equal(shard, world_rank) else
                                          f": it cut x into 2 x {len(results)} chunks, by the world's size, not the "
                                          f"group's {gsize}: dist.get_world_size(group)"
                                          if shard.shape == world_size.shape and torch.equal(shard, world_size) else ""))
        assert torch.equal(whole, x), (
            f"{where}: zigzag_unshard(x, group) did not give the whole sequence of the group's parts in order")


# --------------------------------------------------------------------------- Task 15.5
def _sent_since(wire):
    """What each call since the last take() sent, [(kind, dtype name, numel)], a dist.all_to_all's numel its whole
    input list's (the wire records a list's first tensor; its outputs, as large, come first): half of its tensors."""
    calls = wire.calls[wire.taken:]
    wire.take()
    return [(c.kind, c.sent[1], sum(n for _, n in c.tensors) // 2 if c.kind == "all_to_all" else c.numel) for c in calls]


def _ulysses(rank, size, impl, heads, causal):
    cp = judging(impl, "15.5")
    out = {}
    # the all-to-all alone, on rank-valued input: element [b, h, s, d] = 1000 * rank + index
    x = (torch.arange(2.0 * 12 * 2 * 3).view(2, 12, 2, 3) + 1000 * rank).requires_grad_()
    with Wire() as wire:
        y = cp.all_to_all(x, None, 1, 2)
        out["a2a"] = y.detach()
        try:  # said by the test: autograd's shape error names no cause
            out["a2a_grad"], = torch.autograd.grad(y, x, torch.ones_like(y) * (rank + 1))
        except RuntimeError as error:
            return dict(out, a2a_error=str(error).splitlines()[0][:300])
    out["a2a_calls"] = [c.sent for c in wire.calls]
    out["a2a_kept"] = keeps_its_input(lambda t: cp.all_to_all(t, None, 1, 2), x)
    q, k, v, dout = _inputs(2, heads, 4 * size, 4)
    mine = [_mine(t, rank, size, "contiguous") for t in (q, k, v, dout)]
    q_l, k_l, v_l = (t.clone().requires_grad_() for t in mine[:3])
    shapes, sdpa = [], F.scaled_dot_product_attention

    def recorded(query, *args, **kwargs):
        shapes.append(tuple(query.shape))
        if len(shapes) == 1:  # the q, k, v the forward's attention got: whose heads they are
            out["given"] = [t.detach().clone() for t in (query, *args[:2])]
        return sdpa(query, *args, **kwargs)
    F.scaled_dot_product_attention = recorded
    try:
        with Wire() as wire:
            try:
                o = cp.ulysses_attention(q_l, k_l, v_l, None, causal)
            except ValueError as error:
                return dict(out, refused=str(error), calls=[c.sent for c in wire.calls],
                            calls_given=[c.tensors for c in wire.calls])
            except RuntimeError as error:  # heads not refused: said by _check_refused, not as a raw shape error
                if heads % size == 0 or isinstance(error, NotImplementedError):
                    raise
                return dict(out, refused=None, raised=one_line(error), calls=[c.sent for c in wire.calls])
            forward = _sent_since(wire)
            if o.shape != q_l.shape:  # said by the test, with the shapes that attention ran on
                return dict(out, refused=None, out=o.detach(), shapes=shapes)
            grads = torch.autograd.grad(o, (q_l, k_l, v_l), mine[3])
            backward = _sent_since(wire)
    finally:
        F.scaled_dot_product_attention = sdpa
    return dict(out, refused=None, out=o.detach(), grads=grads, forward=forward, backward=backward, shapes=shapes)


@pytest.mark.task15_5
@pytest.mark.parametrize("size,heads,causal", [(2, 4, True), slow(2, 4, False), slow(3, 6, True), slow(4, 4, False),
                                               slow(4, 8, True)])
def test_ulysses_is_attention_over_the_whole_sequence(impl, size, heads, causal):
    judging(impl, "15.5")
    results = run_ranks(_ulysses_and_refused, size, impl, heads, causal)
    refusing = [rank for rank, (_, refused) in enumerate(results) if refused.get("refused") is not None]
    for rank, (got, refused) in enumerate(results):
        if "a2a_error" in got and "incorrect number of gradients" in got["a2a_error"]:
            pytest.fail(f"{T155}: the backward of all_to_all(x, scatter_dim=1, gather_dim=2) on rank {rank} failed: "
                        f"{got['a2a_error']}: _AllToAll.backward returns one gradient per input of forward (x, group, "
                        "scatter_dim, gather_dim): x's, then None for each of the other three")
        if "a2a_error" in got:
            pytest.fail(f"{T155}: the backward of all_to_all(x, scatter_dim=1, gather_dim=2) on rank {rank} failed: "
                        f"{got['a2a_error']}: its backward is the reverse all-to-all, the same one with scatter_dim and "
                        "gather_dim swapped (the gradient's pieces go back along the dim they came in by)")
        _check_refused(rank, refused, refusing)
        assert got["refused"] is None, (
            f"{T155}: rank {rank}'s ulysses_attention with {heads} heads on {size} ranks (they divide) raised "
            f"ValueError: {got['refused']}; calls before it: {got['calls']}"
            + ("" if len({t[0] for c in got["calls_given"] for t in c}) < 2 else
               f": a collective was given tensors of different dtypes ({got['calls_given'][-1]}): the buffer that "
               "receives must be like the one sent (torch.empty_like), not made in torch's default dtype"))
        # the all-to-all: rank r gets heads r*6/N... of every rank's tokens, in rank order along the sequence
        xs = [torch.arange(2.0 * 12 * 2 * 3).view(2, 12, 2, 3) + 1000 * r for r in range(size)]
        h = 12 // size
        if True:
            pieces = [x[:, rank * h:(rank + 1) * h] for x in xs]  # what rank r sent this one, in rank order
            expected = torch.cat(pieces, dim=2)
            if got["a2a"].shape == expected.shape and not torch.equal(got["a2a"], expected) and torch.equal(
                    got["a2a"].flatten().sort().values, expected.flatten().sort().values):
                pytest.fail(f"{T155}: all_to_all(x, scatter_dim=1, gather_dim=2) on rank {rank}: the right elements "
                            f"arrived (heads {rank * h}..{(rank + 1) * h - 1} of every rank's tokens), in the wrong places"
                            + (": the received pieces (rank j's first along dim 0) were reshaped to the output's shape, "
                               "which interleaves them; concatenate them along gather_dim (torch.cat of the pieces), "
                               "rank 0's first" if torch.equal(got["a2a"], torch.stack(pieces).reshape(expected.shape))
                               else ": concatenate what rank 0, 1, ... sent, in that order, along gather_dim"))
            assert got["a2a"].shape == expected.shape and torch.equal(got["a2a"], expected), (
                f"{T155}: all_to_all(x, scatter_dim=1, gather_dim=2) on rank {rank}: expected heads "
                f"{rank * h}..{(rank + 1) * h - 1} of every rank's tokens, rank 0's first; got shape "
                f"{tuple(got['a2a'].shape)}: the all-to-all splits the wrong dimension, or glues the wrong one")
            grad = torch.zeros(2, 12, 2, 3)
            for r in range(size):  # rank r's gradient of the output, (r + 1) everywhere, comes back for its heads
                grad[:, r * h:(r + 1) * h] = r + 1
            assert torch.equal(got["a2a_grad"], grad), (
                f"{T155}: the all-to-all's backward on rank {rank} is not the reverse all-to-all (the gradient of "
                "each piece must return to the rank it came from)")
            assert [c[0] for c in got["a2a_calls"]] in (["all_to_all_single"] * 2, ["all_to_all"] * 2), (
                f"{T155}: the all-to-all and its backward called {got['a2a_calls']}: one all-to-all each way")
            assert not got["a2a_kept"], (
                f"{T155}: all_to_all on rank {rank} keeps its input x alive after the forward (ctx.save_for_backward(x), "
                "or x on ctx), while its backward needs none of it, only the group and the two dims: q, k and v would "
                "stay in memory twice until the backward; keep no tensor on ctx")
        out, grads = _expected_mine(rank, size, "contiguous", causal, (2, heads, 4 * size, 4))
        wrong = [s for s in got["shapes"] if s[1:3] != (heads // size, 4 * size)]
        if got["out"].shape != out.shape and not wrong:  # the way in was right (wrong: said below)
            as_attended = got["shapes"] and tuple(got["out"].shape) == got["shapes"][0]  # SDPA's output, as it came
            pytest.fail(f"{T155}: rank {rank}'s ulysses_attention returned shape {tuple(got['out'].shape)}, expected "
                        f"(B, H, S / N, D) = {tuple(out.shape)}, as q came in" + (
                            ": it is the shape of the attention's output, H / N heads of the whole sequence: no way "
                            "back; an all-to-all brings every rank its own tokens of all H heads" if as_attended else
                            ": the all-to-all back is the reverse of the one in, scattering the sequence and "
                            "gathering the heads"))
        if not _close(got["out"], out):
            other, _ = _expected_mine(rank, size, "contiguous", not causal, (2, heads, 4 * size, 4))
            q, k, v, _ = _inputs(2, heads, 4 * size, 4)
            twice = _mine(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1 / 4), rank, size,
                          "contiguous")
            if _close(got["out"], twice):
                pytest.fail(f"{T155}: rank {rank}'s Ulysses output is the attention with the scores scaled by 1/D, "
                            "not 1/sqrt(D): the scale was applied twice; F.scaled_dot_product_attention scales by "
                            "1/sqrt(D) itself")
            h = heads // size
            given = dict(zip("qkv", got.get("given", [])))
            mixed = [name for name, t in zip("qkv", (q, k, v))
                     if name in given and not torch.equal(given[name], t[:, rank * h:(rank + 1) * h])]
            if not wrong and mixed:
                packed = torch.cat([q, k, v], dim=1)[:, 3 * h * rank:3 * h * (rank + 1)]  # what rank r gets of it
                pytest.fail(f"{T155}: rank {rank}'s attention was given a {mixed[0]} that is not heads "
                            f"{rank * h}..{(rank + 1) * h - 1} of {mixed[0]} over the whole sequence" + (
                                f": q, k and v were packed along the heads (torch.cat on dim 1, {3 * heads} heads), "
                                f"so the all-to-all's cut into N = {size} pieces of {3 * h} heads falls across q, k "
                                "and v: a rank's 'q', 'k' and 'v' hold heads of the others; pack them in a new dim "
                                "(torch.stack) and cut the heads of each"
                                if all(torch.equal(given[name], piece) for name, piece in
                                       zip("qkv", packed.chunk(3, dim=1)) if name in given) else
                                ": the way in must give rank j heads j H / N ... of q, k and v, every rank's tokens "
                                "in rank order"))
            pytest.fail(f"{T155}: rank {rank}'s Ulysses output differs from F.scaled_dot_product_attention over the "
                        "whole sequence" + (f": attention ran on shape {wrong[0]}, expected (B, H / N, S, D) = "
                                            f"(2, {heads // size}, {4 * size}, 4): the all-to-all splits the wrong "
                                            "dimension (scatter the heads, gather the sequence)" if wrong else
                                            f": it is the attention {'without' if causal else 'with'} the causal mask "
                                            f"(causal={causal} was asked): pass is_causal=causal to "
                                            "F.scaled_dot_product_attention" if _close(got["out"], other) else ""))
        for what, g, e in zip(("dq", "dk", "dv"), got["grads"], grads):
            assert _close(g, e), f"{T155}: rank {rank}'s {what} differs from F.scaled_dot_product_attention's"
        for when in ("forward", "backward"):
            calls = got[when]
            numel = out.numel()
            assert {c[0] for c in calls} <= {"all_to_all_single", "all_to_all"} and all(c[1] == "float64" for c in calls) \
                and sum(c[2] for c in calls) == 4 * numel and len(calls) in (2, 4), (
                    f"{T155}: rank {rank}'s Ulysses {when} sent {calls}: expected all-to-alls of q, k, v and out "
                    f"(4 x {numel} float64 elements in all; 4 calls, or 2 with q, k and v packed in one)")


def _ulysses_in_groups(rank, size, impl):
    """Ulysses (forward and backward) inside the groups [0, 1] and [2, 3] of 4 ranks: (its output, its gradients, the
    sizes of the groups its collectives ran over), or the error as text. 6 heads: they divide by the group's 2 ranks,
    not by the world's 4."""
    cp = judging(impl, "15.5")
    group = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    q, k, v, dout = _inputs(2, 6, 8, 4, seed=rank // 2)
    mine = [_mine(t, rank % 2, 2, "contiguous") for t in (q, k, v, dout)]
    q_l, k_l, v_l = (t.clone().requires_grad_() for t in mine[:3])
    with Wire() as wire:
        try:
            out = cp.ulysses_attention(q_l, k_l, v_l, group, True)
            grads = torch.autograd.grad(out, (q_l, k_l, v_l), mine[3])
        except ValueError as error:
            return ("refused", one_line(error)), sorted({c.group_size for c in wire.calls})
        except RuntimeError as error:
            return one_line(error), sorted({c.group_size for c in wire.calls})
    return (out.detach(), grads), sorted({c.group_size for c in wire.calls})


@pytest.mark.task15_5
@pytest.mark.slow
def test_ulysses_runs_inside_the_group_it_is_given(impl):
    judging(impl, "15.5")
    for rank, (got, sizes) in enumerate(run_ranks(_ulysses_in_groups, 4, impl)):
        where = f"{T155}: rank {rank} (rank {rank % 2} of the group {[rank - rank % 2, rank - rank % 2 + 1]} of 4 ranks)"
        assert got[0] != "refused", (
            f"{where}: ulysses_attention refused 6 heads in a group of 2 ranks ({got[1]}): they divide by the group's "
            "size; the heads are split over the ranks of the group it is given, dist.get_world_size(group), not over "
            "the world's 4")
        assert sizes == [2], (
            f"{where}: Ulysses ran collectives over groups of {sizes} ranks, not over the 2 of the group it was given: "
            "pass group=group to every all-to-all (the default group is all 4)" + (f" ({got})" if isinstance(got, str) else ""))
        assert not isinstance(got, str), f"{where}: Ulysses inside a group failed: {got}"
        q, k, v, dout = _inputs(2, 6, 8, 4, seed=rank // 2)
        expected, expected_grads = _reference(q, k, v, dout, True)
        assert _close(got[0], _mine(expected, rank % 2, 2, "contiguous")), (
            f"{where}: Ulysses inside a group differs from SDPA over the group's sequence")
        for what, g, e in zip(("dq", "dk", "dv"), got[1], expected_grads):
            assert _close(g, _mine(e, rank % 2, 2, "contiguous")), f"{where}: {what} inside a group differs from SDPA's"


def _ulysses_and_refused(rank, size, impl, heads, causal):
    return _ulysses(rank, size, impl, heads, causal), _ulysses(rank, size, impl, size + 1, False)


@pytest.mark.task15_5
@pytest.mark.slow
def test_ulysses_refuses_heads_that_do_not_divide(impl):
    judging(impl, "15.5")
    results = run_ranks(_refused, 3, impl)
    for rank, got in enumerate(results):
        _check_refused(rank, got, [r for r, theirs in enumerate(results) if theirs.get("refused") is not None])


def _refused(rank, size, impl):
    return _ulysses(rank, size, impl, 4, False)


def _check_refused(rank, got, refusing=()):
    assert got["refused"] is not None and got["calls"] == [], (
        f"{T155}: rank {rank}: ulysses_attention with heads that do not divide by the ranks must raise ValueError "
        f"(one line, saying that the heads must divide by the ranks) before any collective; got "
        + (f"no ValueError: it went on and raised {got['raised']}" if got.get("raised") else
           f"{got.get('refused')!r}") + f", calls {got.get('calls')}"
        + (f" (rank{'s' if len(refusing) > 1 else ''} {', '.join(map(str, refusing))} refused: the refusal depends on "
           "nothing but H and N, the same on every rank: refuse on every rank alike, not on some)"
           if got.get("refused") is None and refusing else ""))


# --------------------------------------------------------------------------- Task 15.6
IMAGE = 12  # 36 tokens: they split over 2, 3 and 4 ranks


def _tiny_vit(seed=0):
    from models import ViT
    torch.manual_seed(seed)
    return ViT(image_size=IMAGE, patch_size=2, dim=16, depth=1, heads=4).double()


def _pooling(rank, size, impl, group=None):
    cp = judging(impl, "15.6")
    x = (torch.arange(2.0 * 3 * 4).view(2, 3, 4) + 100 * rank).double().requires_grad_()
    given = x.detach().clone()
    with Wire() as wire:
        y = cp.sequence_mean(x, group)
        forward = list(wire.calls)
    changed = not torch.equal(x.detach(), given)  # said by the test: x is the activations the backward goes through
    with Wire() as wire:
        try:  # said by the test: autograd's shape error names no cause
            grad, = torch.autograd.grad(y, x, torch.full((2, 4), 6.0, dtype=torch.float64) * (1 + torch.arange(4.0)))
        except RuntimeError as error:
            if "invalid gradient at index 0" not in str(error):
                raise
            return dict(grad_error=one_line(error, 300))
        backward = list(wire.calls)
    kept = keeps_its_input(lambda t: cp.sequence_mean(t, group), x)  # one more all-reduce, on every rank alike
    return dict(y=y.detach(), grad=grad, changed=changed, kept=kept, forward=[(*c.sent, c.op) for c in forward],
                backward=[(*c.sent, c.op) for c in backward], not_waited=[c.kind for c in forward if not c.waited])


def _check_pooling(results):
    size = len(results)
    xs = [(torch.arange(2.0 * 3 * 4).view(2, 3, 4) + 100 * r).double() for r in range(size)]
    whole = torch.cat(xs, dim=1).mean(dim=1)
    for rank, got in enumerate(results):
        if got.get("not_waited"):
            pytest.fail(f"{T156}: sequence_mean's forward on rank {rank} called {got['not_waited'][0]}(async_op=True) and "
                        "never waited for its Work: what it returned was read from the buffer before (or while) the "
                        "sum arrived; wait for it (work.wait()) before using the buffer, or call it blocking")
        if not torch.allclose(got["y"], whole):
            pytest.fail(f"{T156}: sequence_mean on rank {rank} is not the mean over every rank's tokens"
                        + (": the pooled feature was not reduced over the context group (each rank pooled its own "
                           "tokens only)" if torch.allclose(got["y"], xs[rank].sum(1) / (3 * size)) or
                           torch.allclose(got["y"], xs[rank].mean(1)) else
                           f": it is {size} times the mean: the sum over every rank's tokens was divided by this "
                           f"rank's token count (3), not by the whole sequence's S = {size} x 3"
                           if torch.allclose(got["y"], size * whole) else
                           f": it is 1/N = 1/{size} of the mean: its all-reduce averaged (ReduceOp.AVG), and the "
                           "average was divided by S again: sum (ReduceOp.SUM), then / S"
                           if torch.allclose(got["y"], whole / size) and any(
                               "AVG" in str(c[3]) for c in got["forward"]) else ""))
        expected = (6.0 * (1 + torch.arange(4.0))).double().expand(2, 4).unsqueeze(1).expand(2, 3, 4) / (3 * size)
        if got["backward"] == [] and torch.allclose(got["grad"], size * expected):
            pytest.fail(f"{T156}: sequence_mean's backward on rank {rank} gave {got['grad'][0, 0].tolist()} per token, "
                        f"N = {size} times grad / S = {expected[0, 0].tolist()}: either the gradient was divided by this "
                        f"rank's token count (3), not by the whole sequence's S = {size} x 3 that the forward divided by, "
                        f"or it was multiplied by N = {size} (the forward's all-reduce asks for no sum over the ranks on "
                        "the way back: every rank's grad / S, as it is)")
        assert [c[0] for c in got["forward"]] == ["all_reduce"], (
            f"{T156}: sequence_mean's forward called {got['forward']}: one all-reduce of this rank's token sum")
        assert got["forward"][0][2] == 2 * 4, (
            f"{T156}: sequence_mean's forward on rank {rank} all-reduced {got['forward'][0][2]} elements, x being (B, "
            "S / N, dim) = (2, 3, 4)" + (", x itself, in place: x, the activations the backward runs through, now "
                                         "holds every rank's sum" if got["changed"] else "") + ": all-reduce this "
            "rank's token SUM, a new (B, dim) = (2, 4) tensor (x.sum(dim=1)): S / N = 3 times fewer bytes")
        assert not got["kept"], (
            f"{T156}: sequence_mean on rank {rank} keeps its input x alive after the forward (ctx.save_for_backward(x), "
            "or x on ctx), while its backward needs only x's shape and S: x, (B, S / N, dim), would stay in memory "
            "until the backward; keep numbers on ctx, no tensor")
        assert not got["changed"], (
            f"{T156}: sequence_mean's forward on rank {rank} changed its input x in place: x is the activations the "
            "backward runs through; all-reduce a new tensor (this rank's token sum)")
        expected = (6.0 * (1 + torch.arange(4.0))).double().expand(2, 4).unsqueeze(1).expand(2, 3, 4) / (3 * size)
        assert torch.allclose(got["grad"], expected) and got["backward"] == [], (
            f"{T156}: sequence_mean's backward on rank {rank} gave {got['grad'][0, 0].tolist()} per token with "
            f"{got['backward']}; expected grad / S = {expected[0, 0].tolist()} and no collective: every rank already "
            "holds the whole gradient of the mean" + (" (an all-reduce in backward counts it N times)"
                                                      if got["backward"] else ""))


def _vit_step(rank, size, impl, cp_size, attention):
    cp = judging(impl, "15.6")
    group = None if cp_size == size else [dist.new_group(list(range(g, g + cp_size)))
                                          for g in range(0, size, cp_size)][rank // cp_size]
    pooling = _pooling(rank, size, impl, group)
    if "grad_error" in pooling or pooling["y"].dtype != torch.float64:  # said by the test: the ViT would raise
        return pooling, None, None
    vit = _tiny_vit()
    model = cp.ContextParallelViT(vit, group, attention)
    g = torch.Generator().manual_seed(3)
    images, labels = torch.randn(8, 3, IMAGE, IMAGE, generator=g, dtype=torch.float64), torch.randint(0, 10, (8,), generator=g)
    replicas = size // cp_size
    mine = slice(rank // cp_size * 8 // replicas, (rank // cp_size + 1) * 8 // replicas)
    F.cross_entropy(model(images[mine]), labels[mine]).backward()
    with Wire() as wire:
        cp.average_context_parallel_gradients(model, cp_size)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    grads["not_waited"] = [c.kind for c in wire.calls if not c.waited]
    # again with pos_embed frozen: its .grad stays None, every other gradient as before (a few ms)
    frozen = _tiny_vit()
    frozen.pos_embed.requires_grad_(False)
    model = cp.ContextParallelViT(frozen, group, attention)
    F.cross_entropy(model(images[mine]), labels[mine]).backward()
    with Wire() as frozen_wire:
        try:  # said by the test: a .grad of None has no reshape
            cp.average_context_parallel_gradients(model, cp_size)
            grads["frozen"] = {name: p.grad for name, p in model.named_parameters()}
        except (AttributeError, TypeError) as error:
            grads["frozen"] = one_line(error)
    grads["frozen_sent"] = [c.sent for c in frozen_wire.calls]
    if size == 3:  # with group=, in the groups [0] and [1, 2] (one replica each, cp_size 1 and 2): a module of two
        groups = [dist.new_group([0]), dist.new_group([1, 2])]  # parameters, .grad = rank + 1 (a few ms)
        small = torch.nn.Module()
        small.body, small.head = torch.nn.Linear(2, 1, bias=False).double(), torch.nn.Linear(1, 1, bias=False).double()
        for p in small.parameters():
            p.grad = torch.full_like(p, rank + 1.0)
        with Wire() as group_wire:
            cp.average_context_parallel_gradients(small, 1 if rank == 0 else 2, groups[min(rank, 1)])
        grads["in_group"] = ({name: p.grad.flatten()[0].item() for name, p in small.named_parameters()},
                             sorted({c.group_size for c in group_wire.calls}))
    return pooling, grads, [c.sent for c in wire.calls]


def _single_process_grads():
    vit = _tiny_vit()
    g = torch.Generator().manual_seed(3)
    images, labels = torch.randn(8, 3, IMAGE, IMAGE, generator=g, dtype=torch.float64), torch.randint(0, 10, (8,), generator=g)
    F.cross_entropy(vit(images), labels).backward()
    return {name: p.grad for name, p in vit.named_parameters()}


@pytest.mark.task15_6
@pytest.mark.parametrize("size,cp_size,attention", [(3, 3, "ring"), slow(2, 2, "ring"), slow(4, 2, "ring"),
                                                    slow(4, 2, "ulysses")])
def test_every_parameter_gets_its_single_process_gradient(impl, size, cp_size, attention):
    judging(impl, "15.6")
    expected = _single_process_grads()
    results = run_ranks(_vit_step, size, impl, cp_size, attention)
    for rank, (pooling, _, _) in enumerate(results):
        assert pooling.get("grad_error") or pooling["y"].dtype == torch.float64, (
            f"{T156}: sequence_mean on rank {rank} returned {str(pooling['y'].dtype).replace('torch.', '')} for a "
            "float64 x: the token sum was made or all-reduced in another dtype (a buffer made with torch.zeros(shape) "
            "is torch's default, float32; or a .float()), and the head, float64, cannot take it; keep x's dtype "
            "(x.sum(dim=1) is a new tensor already)")
        assert "grad_error" not in pooling, (
            f"{T156}: sequence_mean's backward on rank {rank} returned a gradient of the wrong shape for x (B, S / N, "
            f"dim) = (2, 3, 4) ({pooling.get('grad_error')}): the gradient of x has x's shape: each of this rank's "
            "tokens gets grad / S, the (B, dim) gradient repeated along dim 1 (unsqueeze(1).expand)")
    if cp_size == size:  # sequence_mean alone first: its mistakes then say so, not a gradient's ratio
        _check_pooling([pooling for pooling, _, _ in results])
    else:  # in context groups: pooled over every rank is the default group's doing
        world = torch.cat([(torch.arange(2.0 * 3 * 4).view(2, 3, 4) + 100 * r).double() for r in range(size)], 1)
        for rank, (pooling, _, _) in enumerate(results):
            if any(torch.allclose(pooling["y"], world.sum(dim=1) / tokens) for tokens in (3 * cp_size, 3 * size)):
                pytest.fail(f"{T156}: sequence_mean on rank {rank} (context groups of {cp_size} in {size} ranks) summed "
                            f"the tokens of all {size} ranks, not only its context group's: its all-reduce ran over the "
                            "default group; pass it the group that sequence_mean is given (group=group)")
            ours = range(rank // cp_size * cp_size, (rank // cp_size + 1) * cp_size)  # its context group
            group_sum = torch.cat([world[:, 3 * r:3 * (r + 1)] for r in ours], 1).sum(dim=1)
            per_token = (6.0 * (1 + torch.arange(4.0))).double().expand(2, 4).unsqueeze(1).expand(2, 3, 4)
            for when, got, world_s in (("forward", pooling["y"], group_sum / (3 * size)),
                                       ("backward", pooling["grad"], per_token / (3 * size))):
                if torch.allclose(got, world_s):
                    pytest.fail(f"{T156}: sequence_mean's {when} on rank {rank} (context groups of {cp_size} in {size} "
                                f"ranks) divided by S counted with the world size, {size} x 3 tokens, not with the "
                                f"context group's size, {cp_size} x 3: the sequence is split over the group only; "
                                "count its ranks with dist.get_world_size(group)")
    numel = sum(grad.numel() for grad in expected.values())
    replicas = size // cp_size
    for rank, (_, grads, sent) in enumerate(results):
        frozen, frozen_sent = grads.pop("frozen"), grads.pop("frozen_sent")
        in_group, not_waited = grads.pop("in_group", None), grads.pop("not_waited")
        assert not not_waited, (
            f"{T156}: rank {rank}'s average_context_parallel_gradients called {not_waited[0]}(async_op=True) and never "
            "waited for its Work: the gradients were copied out of the flat buffer before (or while) the sum arrived, "
            "so ranks read it at different moments; wait for it (work.wait()) before reading the buffer, or call it "
            "blocking")
        if in_group is not None:
            members = [0] if rank == 0 else [1, 2]
            expected_small = dict(zip(("body.weight", "head.weight"), (1.0, 1.0) if rank == 0 else (5.0, 2.5)))
            where = (f"{T156}: rank {rank}'s average_context_parallel_gradients(model, cp_size={len(members)}, group) "
                     f"in the group {members} of 3 ranks (one replica of {len(members)} rank"
                     f"{'s' if len(members) > 1 else ''})")
            assert in_group[1] in ([], [len(members)]), (
                f"{where} ran its all-reduce over {', '.join(map(str, in_group[1]))} ranks, not over the {len(members)} of the group it was "
                "given: pass group=group to the collective (the default group is all 3)")
            by_the_world = dict(zip(("body.weight", "head.weight"), (1 / 3, 1 / 3) if rank == 0 else (5.0, 5 / 3)))
            assert in_group[0] == expected_small, (
                f"{where}: a module whose .grads are rank + 1 got {in_group[0]}, expected {expected_small}"
                + (": divided by the world's 3 ranks, not the group's: the ranks and the replicas are those of `group`, "
                   "dist.get_world_size(group)" if all(abs(in_group[0][n] - by_the_world[n]) < 1e-12 for n in by_the_world)
                   else ""))
        assert sorted(grads) == sorted(expected), f"{T156}: parameter names {sorted(grads)} are not the ViT's"
        kinds = sorted({dtype for _, dtype, _ in sent})
        assert kinds in ([], ["float64"]), (
            f"{T156}: rank {rank}'s average_context_parallel_gradients sent the float64 gradients as {kinds} "
            f"({sent[:2]}{' ...' if len(sent) > 2 else ''}): the flat buffer was made in another dtype (torch.zeros "
            "or torch.empty without dtype= is torch's default, float32), and every gradient was rounded to it; make "
            "it like the gradients (torch.cat of them, or dtype=)")
        if replicas > 1 and all(torch.allclose(grads[name], replicas * grad, rtol=1e-8, atol=1e-12)
                                for name, grad in expected.items()):
            pytest.fail(f"{T156}: every gradient on rank {rank} is {replicas} x the single-process gradient on the "
                        f"global batch ({size} ranks, context groups of {cp_size}: {replicas} data-parallel replicas): "
                        "the replicas' gradients were summed, not averaged; after the rule of each parameter (the "
                        "head's N copies, the others' N parts), divide by the number of replicas too")
        for name, grad in grads.items():
            if torch.allclose(grad, expected[name], rtol=1e-8, atol=1e-12):
                continue
            ratio = (grad.norm() / expected[name].norm()).item()
            where = "head" if name.startswith("head.") else "before the pooling"
            why = ""
            if grad.numel() > 1 and torch.all(grad == grad.flatten()[0]):
                why = (f": every element of it is {grad.flatten()[0].item():g}: the gradient was overwritten by a number "
                       "(the divisor?), not divided by it: mind the parentheses around a conditional divisor")
            elif abs(ratio - cp_size) < 1e-6 and where == "head":
                why = (f": the head's gradients are N = {cp_size} times too large: every rank of a context group holds "
                       "the whole gradient of its replica's head already (it saw the same pooled features); summed over "
                       "the group it counts N times")
            elif abs(ratio - 1 / cp_size) < 1e-6 and where != "head":
                why = (f": the gradients of the parameters before the pooling are N = {cp_size} times too small: each "
                       "rank of a context group holds only its own tokens' part; their SUM over the group is the "
                       "replica's gradient (divide by the data-parallel replicas only)")
            others = [r for r, (_, theirs, _) in enumerate(results) if not torch.equal(theirs[name], grad)]
            if not why and others and sent == [("all_reduce", "float64", numel)]:
                why = (f": rank {others[0]} holds another gradient of {name}, though one all-reduce of one flat buffer "
                       "left the same buffer on every rank: the ranks took their pieces out of it differently; lay "
                       "the gradients out in the same order on every rank (model.parameters(), not a set or an order "
                       "by id())")
            pytest.fail(f"{T156}: rank {rank}'s gradient of {name} ({where}) is {ratio:.4g} x the single-process "
                        f"gradient on the global batch ({size} ranks, context groups of {cp_size}, {attention}){why}")
        assert sent == [("all_reduce", "float64", numel)], (
            f"{T156}: rank {rank}'s average_context_parallel_gradients sent {sent[:4]}{' ...' if len(sent) > 4 else ''} "
            f"({len(sent)} calls): expected one all-reduce of the {numel} float64 gradients flattened into one buffer "
            "(torch.cat of the flattened .grads), then its pieces divided and copied back")
        where = f"{T156}: rank {rank}'s average_context_parallel_gradients on the ViT with pos_embed frozen"
        assert not isinstance(frozen, str), (
            f"{where} (requires_grad=False: its .grad is None) raised {frozen}: a parameter without a .grad takes no "
            "part: leave it out of the flat buffer, and its .grad None")
        assert frozen["pos_embed"] is None, (
            f"{where}: its .grad is a tensor after the call, where backward left None: leave a frozen parameter's "
            ".grad as it is (None)")
        assert frozen_sent == [("all_reduce", "float64", numel - expected["pos_embed"].numel())], (
            f"{where} sent {frozen_sent}: expected one all-reduce of the {numel - expected['pos_embed'].numel()} "
            "gradients that exist (pos_embed has none)")
        wrong = [name for name, grad in frozen.items() if name != "pos_embed"
                 and not torch.allclose(grad, expected[name], rtol=1e-8, atol=1e-12)]
        assert not wrong, f"{where}: the gradients of {wrong[:3]} differ from the single-process ones (as without it)"


# --------------------------------------------------------------------------- train_ddp.py --cp
@pytest.mark.repo
@pytest.mark.parametrize("world_size,flags,message", [
    (2, ["--cp", "2"], "--cp 2 splits the ViT's tokens over the ranks: add --model vit"),
    (4, ["--model", "vit", "--cp", "3"], "--cp 3 does not divide the ViT's 64 tokens"),
    (8, ["--model", "vit", "--cp", "8", "--cp-impl", "ulysses"], "the ViT has 4: choose --cp 2 or 4"),
    (3, ["--model", "vit", "--cp", "2"], "--cp 2 does not divide the world size 3"),
    (4, ["--model", "vit", "--cp", "2", "--shard", "optimizer"], "--cp 2 cannot be combined with --shard optimizer"),
    (4, ["--model", "vit", "--cp", "2", "--local-sgd", "4"], "--cp 2 cannot be combined with --local-sgd"),
    (4, ["--model", "vit", "--cp", "2", "--tp", "2"], "--cp 2 cannot be combined with --tp 2"),  # not ignored
    (4, ["--model", "vit", "--cp", "2", "--moe", "4"], "--cp 2 cannot be combined with --moe"),
])
def test_a_context_split_that_cannot_work_is_one_line(world_size, flags, message, monkeypatch):
    import train_ddp
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    with pytest.raises(ValueError, match=re.escape(message)):
        train_ddp.check_flags(train_ddp.parse_args(flags))


@pytest.mark.repo
@pytest.mark.slow  # a new interpreter importing torch: seconds
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for CPUs")
def test_pytorchs_context_parallel_is_refused_on_a_cpu_with_exit_code_2():
    from test_train_ddp import run
    code, out = run([sys.executable, "train_ddp.py", "--impl", "ddp", "--model", "vit", "--cp", "2"], timeout=60)
    assert code == 2 and "PyTorch's context_parallel runs on CUDA only" in out and len(out.strip().splitlines()) == 1, out


def _against_pytorchs_context_parallel(rank, size):
    """The reference answers' ring and Ulysses attention and PyTorch's context_parallel (float32, the memory-efficient
    CUDA kernel) on the same whole sequences, causal and not: each rank's out, dq, dk and dv, and the layout
    PyTorch sharded the sequence in (its head-tail load balance is our zigzag), read from the shard it gave."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel
    cp = load(REFERENCE, "template_context_parallel")
    device = gpu.use_gpu(rank)
    torch.backends.cuda.matmul.allow_tf32 = False
    mesh = init_device_mesh("cuda", (size,))
    # ring attention sends with dist.isend/irecv, which gloo does for CPU tensors only: with gloo it runs on the CPU
    ring_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
    whole = [t.float() for t in _inputs(2, 4, 8 * size, 16)]
    results = {}
    for causal in (False, True):
        buffers = [t.to(device, copy=True) for t in whole]  # sharded in place by the context, along dim 2
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), context_parallel(
                mesh, buffers=buffers, buffer_seq_dims=[2] * 4, no_restore_buffers=set(buffers)):
            q, k, v = (t.detach().requires_grad_() for t in buffers[:3])
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            out = out.to_local() if hasattr(out, "to_local") else out
            theirs = [out.detach(), *torch.autograd.grad(out, (q, k, v), buffers[3])]
        layouts = [name for name in ("zigzag", "contiguous") if torch.equal(buffers[0].cpu(), _mine(whole[0], rank, size, name))]
        assert layouts, f"PyTorch's context_parallel gave rank {rank} a shard of {tuple(buffers[0].shape)} in a layout " \
                        "this test does not know (neither head-tail chunks r and 2N-1-r nor the contiguous S / N)"
        mine = [_mine(t, rank, size, layouts[0]).to(ring_device) for t in whole]
        q, k, v = (t.clone().requires_grad_() for t in mine[:3])
        out = cp.ring_attention(q, k, v, None, causal, layouts[0])
        ring = [out.detach(), *torch.autograd.grad(out, (q, k, v), mine[3])]
        mine = [_mine(t, rank, size, "contiguous").to(device) for t in whole]
        q, k, v = (t.clone().requires_grad_() for t in mine[:3])
        out = cp.ulysses_attention(q, k, v, None, causal)
        ulysses = [out.detach(), *torch.autograd.grad(out, (q, k, v), mine[3])]
        results[causal] = dict(layout=layouts[0], torch=[t.cpu() for t in theirs], ring=[t.cpu() for t in ring],
                               ulysses=[t.cpu() for t in ulysses])
    return results


@pytest.mark.gpu
@pytest.mark.repo
@pytest.mark.parametrize("backend", gpu.backends(2))
def test_solution_equals_pytorchs_context_parallel_on_gpus(backend):
    """PyTorch's context_parallel shards F.scaled_dot_product_attention's CUDA kernels only (tools/gpu_check.sh):
    the reference answers' ring and Ulysses attention against it and against one process's attention over the
    whole sequence (float64), on NCCL with 2 GPUs, and on gloo with both ranks on one GPU (there the ring runs on
    CPU tensors: gloo's send/recv take no others)."""
    size = 2
    results = run_ranks(_against_pytorchs_context_parallel, size, backend=backend, timeout=90)
    whole = [t.float().double() for t in _inputs(2, 4, 8 * size, 16)]  # the float32 inputs the ranks had
    for causal in (False, True):
        expected = _reference(*whole, causal)
        expected = [expected[0], *expected[1]]
        for rank, got in enumerate(results):
            got = got[causal]
            for who in ("torch", "ring", "ulysses"):
                layout = "contiguous" if who == "ulysses" else got["layout"]
                for name, value, full in zip(("out", "dq", "dk", "dv"), got[who], expected):
                    mine = _mine(full, rank, size, layout)
                    assert torch.allclose(value.double(), mine, rtol=1e-4, atol=1e-5), (
                        f"{who}, causal={causal}, rank {rank} ({layout} layout): {name} differs from one process's "
                        f"attention by up to {(value.double() - mine).abs().max().item():.2e}")


QUICK_VIT = ["--data", "synthetic", "--model", "vit", "--epochs", "1", "--train-samples", "512", "--test-samples", "256",
             "--batch-size", "128", "--no-plot"]


def _losses(ranks, flags, tmp_path):
    """(train loss, test loss, output) of train_ddp.py's training on `ranks` harness ranks (test_train_ddp.trained)."""
    from test_train_ddp import trained
    (figures, *_), out = trained(ranks, [*QUICK_VIT, *flags], tmp_path)
    return figures["train_loss"], figures["test_loss"], out


@pytest.fixture(scope="module")
def data_parallel_vit(impl, tmp_path_factory):
    """The reference: the same ViT, data parallel only, on 2 ranks (the 2 replicas of --cp 2 on 4 ranks)."""
    return _losses(2, ["--impl", impl], tmp_path_factory.mktemp("dp"))[:2]


@pytest.mark.slow
@pytest.mark.e2e  # no task marker: check.py would run it after Task 15.6's tests, minutes on 2 cores
@pytest.mark.parametrize("cp_impl", ["ring", "ulysses"])
def test_cp_2_on_4_ranks_trains_like_data_parallelism(impl, cp_impl, data_parallel_vit, tmp_path):
    """train_ddp.py --model vit --cp 2 on 4 ranks: 2 replicas, each image's 64 tokens on 2 ranks."""
    train_loss, test_loss, out = _losses(4, ["--impl", impl, "--cp", "2", "--cp-impl", cp_impl], tmp_path)
    assert "ranks consistent: all 4 ranks hold bit-identical parameters" in out, out[-3000:]
    assert abs(train_loss - data_parallel_vit[0]) < 1e-4 and abs(test_loss - data_parallel_vit[1]) < 1e-4, (
        f"{T156}: --cp 2 --cp-impl {cp_impl} on 4 ranks: losses {train_loss:.6f}, {test_loss:.6f}; data parallel "
        f"only: {data_parallel_vit[0]:.6f}, {data_parallel_vit[1]:.6f}\n{out[-3000:]}")
