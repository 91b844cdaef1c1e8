"""Task 12: gradient compression hooks (template_compression.py), on Task 5's DDP and on PyTorch's.

    pytest --impl template -m task12_3      # one task; see conftest.py

The reference is PyTorch's own hooks (torch.distributed.algorithms.ddp_comm_hooks): bf16 and fp16
must equal default_hooks' bit for bit, PowerSGD must equal powerSGD_hook to float rounding, on the
same buckets and the same local gradients, under PyTorch's DistributedDataParallel and under Task
5's DDP (each hook on the other's DDP too). Then what does not need a reference: the invariants
(a rank >= min(n, m) gives the exact mean; before start_powerSGD_iter, the plain mean; error
feedback's residual is what was left out, and equals PyTorch's; every rank ends with the same
gradients), what goes on the wire (the dtype, size and async_op of every all-reduce), that a hook's
Future is not complete before its all-reduce is, that the hooks work on float64 buckets, and that
PowerSGD leaves torch's random state as it found it. Each rank is a real gloo process
(tests/harness.py); nothing can hang.
"""
import os
import re
import signal

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd
from torch.nn.parallel import DistributedDataParallel

import gpu  # where the GPU tests' ranks run
from conftest import REFERENCE, call_alone, load, load_with_reference
from harness import RankFailed, RankTimeout, run_ranks
from support.comm_hooks import GradBucket, HookHandle
from wire import Wire

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T121 = "Task 12.1 (template_compression.py, compress_hook)"
T122 = "Task 12.2 (template_compression.py, orthogonalize)"
T123 = "Task 12.3 (template_compression.py, powersgd_hook)"
ANSWERS = {"12.1": "compress_hook", "12.2": "orthogonalize", "12.3": "powersgd_hook"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def judging(impl, task):
    """template_compression of `impl`: your answer to `task`, solutions/' answers to the others."""
    return load_with_reference(impl, "template_compression", *(a for t, a in ANSWERS.items() if t != task))


def _model():
    # Shapes all different: PyTorch's hook draws the first Qs grouped by shape, ours in the bucket's
    # order; with distinct shapes both orders are the same. At rank 2, the 24x8 and 16x24 weights are
    # compressed, the 4x16 weight and the biases are sent whole.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 24), nn.Tanh(), nn.Linear(24, 16), nn.Tanh(), nn.Linear(16, 4))


def _on_cpus_only():
    """In a rank that compares CPU tensors with PyTorch's powerSGD_hook: the hook calls
    torch.cuda.synchronize(device) whenever a GPU is visible, for CPU tensors too, and that raises
    "Expected a cuda device, but got: cpu" (torch 2.11 to 2.14, on a GPU node). The rank ends after
    the test, and the patch with it."""
    torch.cuda.is_available = lambda: False


def _batches(rank, steps):
    g = torch.Generator().manual_seed(10 + rank)
    return [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(steps)]


def only_over(group, task):
    """For Wire(check=...): an all-reduce over any other group than `group` fails at once, in every rank
    (rather than waiting for ranks that never join it)."""
    def check(call, used):
        if used is not group:
            over = "the whole world (group=None)" if used in (None, dist.group.WORLD) else "another group"
            raise AssertionError(
                f"{task}: an all-reduce over {over}, "
                f"not the process group the hook was given (ranks {dist.get_process_group_ranks(group)} of "
                f"{dist.get_world_size()}): pass group=... to every collective; the ranks outside the group never "
                "join, and the others would wait for them forever")
    return check


ALL_REDUCE = ("all_reduce",)  # what a hook sends its bucket with: the wire records it alone


def sent_by(wire):
    """Every all-reduce as (numel, dtype, async_op)."""
    return [(call.numel, call.dtype, call.async_op) for call in wire.calls]


def waited_in_hook(wire):
    """For every all-reduce, whether the hook called its work's wait() while the wire deferred it."""
    return [call.deferred and call.waits > 0 for call in wire.calls]


def _grad_bucket(td, tensors, index, is_last, state=None, hook=None):
    """A bucket of Task 5's DDP holding `tensors` (this rank's local gradients), as a hook gets it."""
    bucket = td.Bucket([nn.Parameter(torch.empty(t.shape)) for t in tensors])
    bucket.buffer = torch.cat([t.reshape(-1) for t in tensors])
    bucket.comm_hook = (state, hook, index, is_last)
    return GradBucket(bucket)


def _call(hook, state, bucket, wire):
    """hook(state, bucket) with its async all-reduces deferred: (value, done before they ran)."""
    wire.defer = True
    future = hook(state, bucket)
    early = bool(wire.pending) and future.done()
    wire.flush()
    value = future.wait()
    return (value[0] if isinstance(value, list) else value).clone(), early


# --------------------------------------------------------------------------- Task 12.1
def _default_group_refused(task, error, what):
    """An AssertionError to raise for a hook that failed on the default group (process_group None, as DDP
    passes it: Issue 45 met a raw AttributeError), or None for any other error."""
    if isinstance(error, (AttributeError, TypeError)) and "NoneType" in str(error):
        return AssertionError(
            f"{task}: {what} raised {type(error).__name__}: {' '.join(str(error).split())[:200]}: the process group "
            "was None, as DDP passes it for every rank (register_comm_hook(None, hook), or PowerSGDState(None)): "
            "then average over the default group, dist.group.WORLD (group = process_group if process_group is not "
            "None else dist.group.WORLD)")
    return None


def _compress_direct(rank, world_size, impl, name):
    comp, td = judging(impl, "12.1"), load("solutions", "template_ddp")
    g = torch.Generator().manual_seed(rank)
    weight = torch.randn(5, 3, generator=g) * 10.0 ** torch.randint(-6, 3, (5, 3), generator=g)
    bias = torch.randn(7, generator=g)
    bias[0] = 40000.0 + rank  # the sum over 3 ranks (120003) passes fp16's 65504; the mean does not
    out = []
    for dtype in (torch.float32, torch.float64):  # a float64 model: the Future holds the buffer's dtype
        tensors = [weight.to(dtype), bias.to(dtype)]
        theirs = getattr(default_hooks, f"{name}_compress_hook")(None, _grad_bucket(td, tensors, 0, True)).wait()
        with Wire(ALL_REDUCE) as wire:
            try:
                ours, early = _call(getattr(comp, f"{name}_compress_hook"), None, _grad_bucket(td, tensors, 0, True),
                                    wire)
            except (AttributeError, TypeError) as error:  # the same on every rank: raised at once, nothing hangs
                refused = _default_group_refused(T121, error, f"{name}_compress_hook(None, bucket)")
                if refused is None:
                    raise
                raise refused from None
        # a symptom, not a reference: the mean divided in the buffer's own dtype, then cast (and sent)
        divided_first = (torch.cat([t.reshape(-1) for t in tensors]) / world_size).to(DTYPES[name])
        dist.all_reduce(divided_first)
        out.append(dict(ours=ours, theirs=theirs.clone(), early=early, records=sent_by(wire),
                        ops=[call.op for call in wire.calls], waited=waited_in_hook(wire),
                        divided_first=divided_first.to(dtype)))
    return out


@pytest.mark.repo
@pytest.mark.parametrize("way", ["wait", "get_future", "is_completed"])
def test_a_hooks_handle_is_waited_for_as_task_5s_all_reduce_work_is(way):
    """support/comm_hooks.py's HookHandle stands for Task 5.2's all-reduce Work where a hook sends the bucket: a
    Task 5.4 that waits through get_future() or polls is_completed() (as gloo's all-reduce Work allows) finds the
    averaged gradients in bucket.buffer on the hook's path too (trial 6: HookHandle had wait() alone)."""
    class Bucket:
        buffer, params = torch.zeros(3, dtype=torch.float64), []
    bucket, future = Bucket(), torch.futures.Future()
    handle = HookHandle(future, bucket)
    assert not handle.is_completed()
    chained = handle.get_future() if way == "get_future" else None
    future.set_result([torch.arange(3.0, dtype=torch.float64)])  # as an all_reduce's own Future holds it
    if way == "wait":
        assert handle.wait()
    elif way == "get_future":
        assert torch.equal(chained.wait(), torch.arange(3.0, dtype=torch.float64))
    else:
        assert handle.is_completed()
    assert torch.equal(bucket.buffer, torch.arange(3.0, dtype=torch.float64))


@pytest.mark.task12_1
@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_compress_hooks_equal_pytorchs_bit_for_bit(impl, name):
    out = run_ranks(_compress_direct, 3, impl, name, timeout=30)
    dtype = DTYPES[name]
    for rank, got in ((rank, got) for rank, buckets in enumerate(out) for got in buckets):  # float32, float64
        assert not got["early"], (
            f"{T121}: the hook's Future was complete before its all-reduce had run: it returned before the "
            "all-reduce finished, so DDP would read numbers not summed yet. Return "
            "dist.all_reduce(..., async_op=True).get_future().then(decompress)")
        sent = [(numel, dt) for numel, dt, _ in got["records"]]
        if len(sent) == 1 and sent[0][1] in DTYPES.values() and sent[0][1] != dtype:  # trial 9: told "cast"
            pytest.fail(f"{T121} ({name}): {name}_compress_hook sent the bucket in {sent[0][1]}, not {dtype}: cast to "
                        "compress_hook's `dtype` argument (bf16_compress_hook passes torch.bfloat16, fp16_compress_hook "
                        "torch.float16), not to a dtype of your own")
        assert sent == [(got["ours"].numel(), dtype)], (
            f"{T121} ({name}): the hook sent {sent} (elements, dtype); expected one all-reduce of the whole "
            f"bucket in {dtype}, 2 bytes an element: cast before sending, that is the compression")
        assert got["records"][0][2] and not got["waited"][0], (
            f"{T121} ({name}): the hook's all-reduce was " + ("waited for in the hook (work.wait())" if got["waited"][0]
                                                             else "blocking (async_op=False)") +
            ": the hook waits until the bucket has travelled, and backward cannot go on meanwhile. Start it with "
            "async_op=True and return work.get_future().then(decompress)")
        ours, theirs = got["ours"], got["theirs"]
        assert got["ops"] == [dist.ReduceOp.SUM], (
            f"{T121} ({name}): the all-reduce used {got['ops'][0]}, PyTorch's hook ReduceOp.SUM of the tensor already "
            "divided by N: an average op divides after the sum (rounding otherwise; fp16's sum can overflow first)")
        if torch.isinf(ours).any() and not torch.isinf(theirs).any():
            pytest.fail(f"{T121} ({name}): the result holds inf where PyTorch's does not: the sum of 3 ranks "
                        "passed float16's 65504. Divide by the world size before the all-reduce, in the "
                        "compressed dtype (the mean fits where the sum does not)")
        ratio = torch.linalg.vector_norm(ours.double()) / torch.linalg.vector_norm(theirs.double())
        if abs(ratio - 3) < 0.3:
            pytest.fail(f"{T121} ({name}): the result is the SUM over the ranks, not the mean: divide by the "
                        "world size (before the all-reduce, in the compressed dtype)")
        assert ours.dtype == theirs.dtype, (
            f"{T121} ({name}): on a {theirs.dtype} bucket the Future held {ours.dtype}, expected {theirs.dtype}: "
            "copy the reduced tensor back into bucket.buffer() (copy_ casts it to the buffer's dtype) and return "
            "the buffer, not a tensor of another dtype")
        if not torch.equal(ours, theirs) and torch.equal(ours, got["divided_first"]):
            pytest.fail(f"{T121} ({name}): rank {rank}: the bucket was divided by the world size in its own dtype "
                        f"({theirs.dtype}), then cast to {dtype}: PyTorch casts first (a new tensor, "
                        f"buffer.to({dtype})) and divides that, in {dtype}; the roundings differ")
        if not torch.equal(ours, theirs):
            bad = (ours != theirs).sum().item()
            pytest.fail(f"{T121} ({name}): rank {rank}: {bad} of {ours.numel()} elements differ from PyTorch's "
                        f"{name}_compress_hook (max {(ours - theirs).abs().max().item():.3g}): in PyTorch's order, "
                        f"cast to {dtype}, divide by the world size before the all-reduce, all-reduce, cast back")


COMBOS = [("course", "course"), ("torch", "course"), ("course", "torch"), ("torch", "torch")]  # (DDP, hook)


def _train(rank, world_size, impl, task, names, steps, rank_r=2, device="cpu"):
    """{(ddp, hook, name): (gradients after each of `steps` steps, compression_stats())} for every (DDP, hook)
    of COMBOS: "course" DDP is Task 5's, "course" hook the implementation judged; "torch": PyTorch's.
    Yours first: an unfilled TODO fails at once. The gradients come back on the CPU."""
    torch.manual_seed(1000 + rank)  # a hook that draws unseeded Qs draws different ones on each rank
    td, ours = load("solutions", "template_ddp"), judging(impl, task)
    if torch.device(device).type == "cpu":
        _on_cpus_only()
    out = {}
    for name in names:
        for ddp_kind, hook_kind in COMBOS:
            model = _model().to(device)
            bucket_mb = 25 if name == "powersgd" else None  # PowerSGD: one bucket (PyTorch's hook hangs with more on gloo)
            if ddp_kind == "torch":
                ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb or 1e-9)
            else:
                ddp = td.DDP(model, bucket_size_mb=bucket_mb)
            if name == "powersgd":
                state_cls, hook = ((ours.PowerSGDState, ours.powersgd_hook) if hook_kind == "course" else
                                   (torch_powersgd.PowerSGDState, torch_powersgd.powerSGD_hook))
                state = state_cls(None, matrix_approximation_rank=rank_r, start_powerSGD_iter=2)
            else:
                state, hook = None, getattr(ours if hook_kind == "course" else default_hooks, f"{name}_compress_hook")
            ddp.register_comm_hook(state, hook)
            grads = []
            for x, y in _batches(rank, steps):
                model.zero_grad(set_to_none=True)
                F.mse_loss(ddp(x.to(device)), y.to(device)).backward()
                if ddp_kind == "course":
                    ddp.finish_gradient_synchronization()
                grads.append([p.grad.detach().clone().cpu() for p in model.parameters()])
            out[ddp_kind, hook_kind, name] = grads, (state.compression_stats() if name == "powersgd" else None)
    return out


def _compare_runs(task, results, name, exact):
    """Each (DDP, hook) against PyTorch's hook on PyTorch's DDP, rank by rank, step by step."""
    hook = "powersgd_hook" if name == "powersgd" else f"{name}_compress_hook"
    for ddp_kind, hook_kind in COMBOS[:-1]:
        what = (f"your {hook} on {'Task 5' if ddp_kind == 'course' else 'PyTorch'}'s DDP" if hook_kind == "course"
                else f"PyTorch's {hook} on Task 5's DDP (the given code)") + " vs PyTorch's hook on PyTorch's DDP"
        for rank, out in enumerate(results):
            (got, stats), (reference, their_stats) = out[ddp_kind, hook_kind, name], out["torch", "torch", name]
            for step, (a, b) in enumerate(zip(got, reference)):
                for i, (x, y) in enumerate(zip(a, b)):
                    same = torch.equal(x, y) if exact else torch.allclose(x, y, rtol=1e-4, atol=1e-6)
                    assert same, (f"{task}: {what}: rank {rank}, step {step}, parameter {i}: the averaged gradients "
                                  f"differ (max {(x - y).abs().max().item():.3g})")
            assert stats is None or stats[1:] == their_stats[1:], (
                f"{task}: {what}: compression_stats() {stats} vs PyTorch's {their_stats}")


@pytest.mark.task12_1
def test_compress_hooks_under_both_ddps_equal_pytorchs(impl):
    results = run_ranks(_train, 2, impl, "12.1", ["bf16", "fp16"], 3, timeout=60)
    for name in ("bf16", "fp16"):
        _compare_runs(T121, results, name, exact=True)


# --------------------------------------------------------------------------- Task 12.2
def _orthogonalize_alone(impl, matrix, epsilon):
    comp = judging(impl, "12.2")
    ours = matrix.clone()
    view = ours[:, :]  # a view, as PowerSGD's Ps and Qs are views into one buffer
    returned = comp.orthogonalize(view, epsilon)
    theirs = matrix.clone().unsqueeze(0)
    torch_powersgd._orthogonalize_gram_schmidt(theirs, epsilon)
    return ours, theirs[0], returned is None or returned.data_ptr() == ours.data_ptr()


@pytest.mark.task12_2
def test_orthogonalize_is_pytorchs_gram_schmidt_in_place(impl):
    g = torch.Generator().manual_seed(0)
    calls = [(impl, torch.randn(n, r, generator=g), 0) for n, r in [(24, 2), (16, 4), (5, 5), (7, 1)]]
    zero = torch.randn(6, 3, generator=g)
    zero[:, 1] = 0
    calls.append((impl, zero, 1e-8))  # an all-zero column: finite with epsilon
    small = torch.randn(6, 3, generator=g)
    small[:, 2] *= 1e-6  # a last column whose norm is near epsilon: only norm + epsilon gives PyTorch's (a trial's
    calls.append((impl, small, 1e-6))  # sqrt(sum of squares + epsilon) passed); the last, where every correct
    # order of Gram-Schmidt (classical too) agrees to rounding: a small column in the middle would leave the later
    # ones not quite orthogonal to it, each order in its own way
    results = call_alone(_orthogonalize_alone, calls, T122,
                         lambda args: f"orthogonalize(a {tuple(args[1].shape)} matrix, epsilon={args[2]})")
    for (_, matrix, epsilon), (ours, theirs, _) in zip(calls, results):  # trial 9: was told of an all-zero column
        if (matrix.shape[0] == matrix.shape[1] and not torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
                and torch.allclose(ours.double(), _gram_schmidt_columns(matrix.T).T, rtol=1e-4, atol=1e-5)):
            pytest.fail(f"{T122}: orthogonalize(a {tuple(matrix.shape)} matrix) orthonormalised the ROWS of the "
                        "matrix: its columns are matrix[:, i:i + 1] (an n x r matrix has r columns of n entries; "
                        "on a tall n x r matrix, rows leave NaNs)")
    for (_, matrix, epsilon), (ours, theirs, _) in zip(calls, results):
        where = f"orthogonalize(a {tuple(matrix.shape)} matrix, epsilon={epsilon})"
        if torch.equal(ours, matrix):
            pytest.fail(f"{T122}: {where} left the matrix unchanged: work in place on its columns "
                        "(col /= norm, then the later columns -= their component along col)")
        if torch.isnan(ours).any() and not torch.isnan(theirs).any():
            pytest.fail(f"{T122}: {where} made NaNs where PyTorch's does not: an all-zero column divided by its "
                        "norm, 0: add epsilon to the norm (col / (norm + epsilon)); epsilon > 0 is what keeps it finite")
        if torch.allclose(ours.abs(), theirs.abs(), rtol=1e-5, atol=1e-6) and not torch.allclose(ours, theirs):
            pytest.fail(f"{T122}: {where}: columns equal PyTorch's Gram-Schmidt up to their SIGNS: Gram-Schmidt "
                        "divides each column by its (positive) norm; a QR decomposition (torch.linalg.qr) may flip them")
        gram = ours.T @ ours
        norms, off_diagonal = torch.diagonal(gram).sqrt(), gram - torch.diag(torch.diagonal(gram))
        if epsilon == 0 and not torch.allclose(gram, torch.eye(matrix.shape[1]), atol=1e-5):
            if (norms < 1e-6).any():
                hint = (f"column {int((norms < 1e-6).nonzero()[0])} became all zeros: subtract the component along "
                        "column i from the LATER columns only (matrix[:, i + 1:]), not from column i itself")
            elif (off_diagonal.abs().max() < 1e-4 and (norms - 1).abs().min() > 1e-4
                  and torch.allclose(ours / norms, theirs, rtol=1e-4, atol=1e-5)):
                hint = (f"the columns are orthogonal, but their norms are {[round(n, 3) for n in norms.tolist()]}, not 1: the division by the "
                        "norm did not reach the matrix. Divide in place through a view of it (col = matrix[:, i:i + 1]; "
                        "col /= ...), not a copy")
            elif off_diagonal.abs().max() < 1e-4 and torch.allclose(ours / norms, theirs, rtol=1e-4, atol=1e-5):
                # Issue 45: a column left undivided (the last one; or divided before its turn) was told "a copy"
                bad = [i for i, norm in enumerate(norms.tolist()) if abs(norm - 1) > 1e-4]
                hint = (f"column(s) {bad} end with norm(s) {[round(norms[i].item(), 3) for i in bad]}, not 1, while the "
                        "others are right: at its turn, after the earlier columns' components were subtracted from it, "
                        "divide each column by its norm, the last column too")
            elif not torch.allclose(norms, torch.ones_like(norms), atol=1e-4):
                hint = (f"the columns' norms are {[round(n, 3) for n in norms.tolist()]}, not 1: divide each column by "
                        "its own norm, torch.linalg.vector_norm(col, dim=0) (over its n entries)")
            elif matrix.shape[1] > 2 and torch.diagonal(gram, 1).abs().max() < 1e-4:
                hint = ("each column is orthogonal to its neighbours only (columns i and i + 1), not to those further "
                        "on: subtract column i's component from EVERY later column (matrix[:, i + 1:]), not from "
                        "column i + 1 alone")
            else:
                hint = ("the columns have norm 1 but are not orthogonal: normalise column i FIRST, then subtract its "
                        "component from every later column, col_j -= (col_i . col_j) col_i (that projection needs a "
                        "column of norm 1)")
            pytest.fail(f"{T122}: {where}: the columns are not orthonormal (Q^T Q differs from I by "
                        f"{(gram - torch.eye(matrix.shape[1])).abs().max().item():.3g}): {hint}")
        assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6), (
            f"{T122}: {where} differs from PyTorch's Gram-Schmidt by {(ours - theirs).abs().max().item():.3g}: "
            + ("every matrix with epsilon=0 was right, so it is epsilon's use: divide by the norm plus epsilon, "
               "col / (torch.linalg.vector_norm(col) + epsilon), not by sqrt(sum of squares + epsilon), nor by the "
               "norm floored at epsilon" if epsilon > 0 else
               "columns in order; divide by the norm (+ epsilon); then subtract from the LATER columns only"))


def _gram_schmidt_columns(matrix):
    """Gram-Schmidt of the columns of a copy of `matrix`, in float64 (a symptom's reference, not the task's)."""
    matrix = matrix.double().clone()
    for i in range(matrix.shape[1]):
        col = matrix[:, i:i + 1]
        col /= torch.linalg.vector_norm(col)
        matrix[:, i + 1:] -= (col * matrix[:, i + 1:]).sum(dim=0, keepdim=True) * col
    return matrix


# --------------------------------------------------------------------------- Task 12.3
# Buckets of local gradients, as DDP hands them to the hook: one tensor each, then a mixed one. At
# rank 2 (min_compression_rate 2) the 12 x 6 weight is right at the line (72 numbers, r(n+m)*2 = 72): sent whole.
SHAPES = [[(24, 8)], [(24,)], [(16, 24), (16,), (12, 6), (4, 16), (4,)]]


def _powersgd_direct(rank, world_size, impl, steps, options, shapes=SHAPES, dtype=torch.float32, zeros=()):
    """Your powersgd_hook and PyTorch's on the same buckets of the same local gradients, one bucket
    after the other (each waited for: PyTorch's hook starts collectives in callbacks). The buckets
    numbered in `zeros` hold zero gradients (a frozen or unused parameter's), the same on every rank."""
    torch.manual_seed(1000 + rank)
    _on_cpus_only()
    comp, td = judging(impl, "12.3"), load("solutions", "template_ddp")
    ortho_calls = []
    real_orthogonalize = comp.orthogonalize

    def orthogonalize(matrix, epsilon=0):
        # whether it is a Q: looked up now, while the hook holds its buffers (without warm start they are gone after)
        in_q = any(q.data_ptr() <= matrix.data_ptr() < q.data_ptr() + q.element_size() * q.numel()
                   for q in ours.q_memory_dict.values())
        ortho_calls.append((in_q, matrix.detach().clone()))
        return real_orthogonalize(matrix, epsilon)

    comp.orthogonalize = orthogonalize
    ours = comp.PowerSGDState(None, **options)
    theirs = torch_powersgd.PowerSGDState(None, **options)
    g = torch.Generator().manual_seed(rank)
    out = []
    for step in range(steps):
        for index, bucket_shapes in enumerate(shapes):
            tensors = [(torch.randn(s, generator=g) * (0 if index in zeros else 1 + index)).to(dtype)
                       for s in bucket_shapes]
            last = index == len(shapes) - 1
            reference = torch_powersgd.powerSGD_hook(theirs, _grad_bucket(td, tensors, index, last)).wait()
            plain = default_hooks.allreduce_hook(None, _grad_bucket(td, tensors, index, last)).wait()
            del ortho_calls[:]
            random_state, seeds = torch.get_rng_state(), ours.rng.get_state()
            with Wire(ALL_REDUCE) as wire:
                try:
                    got, early = _call(comp.powersgd_hook, ours, _grad_bucket(td, tensors, index, last), wire)
                except Exception as error:
                    refused = _default_group_refused(T123, error, "powersgd_hook with PowerSGDState(None, ...)")
                    if refused is not None:
                        raise refused from None
                    held = {name: sorted(getattr(ours, name)) for name in ("p_memory_dict", "q_memory_dict", "error_dict")}
                    if isinstance(error, KeyError) and error.args[:1] == (index,) and held["p_memory_dict"] and any(
                            index not in held[name] for name in ("p_memory_dict", "q_memory_dict")):  # trial 9: was a raw KeyError
                        raise AssertionError(
                            f"{T123}: step {step}, bucket {index}: the hook raised KeyError: {index}, reading the state "
                            f"of bucket {index}, which has none yet (the state's dicts hold the buckets {held}): make "
                            "a bucket's P and Q buffers when THIS bucket has none (index not in state.p_memory_dict), "
                            "whatever the other buckets hold") from None
                    if dtype == torch.float32 or isinstance(error, (NotImplementedError, AssertionError)):
                        raise
                    raise AssertionError(
                        f"{T123}: on {dtype} gradients (a float64 model), step {step}, bucket {index}, the hook raised "
                        f"{type(error).__name__}: {' '.join(str(error).split())[:300]}: is something made in a fixed "
                        "dtype? P, Q and the residual take the bucket's dtype (buffer.dtype)") from None
            out.append(dict(step=step, index=index, local=torch.cat([t.reshape(-1) for t in tensors]),
                            ours=got, theirs=reference.clone(), plain=plain.clone(), early=early,
                            records=[numel for numel, _, _ in sent_by(wire) if numel],  # empty ones: no matter
                            dtypes=[sent for numel, sent, _ in sent_by(wire) if numel],
                            kept=[name for name in ("p_memory_dict", "q_memory_dict") if index in getattr(ours, name)],
                            started=[started and not waited  # async_op=True, not waited for in the hook
                                     for (numel, _, started), waited in zip(sent_by(wire), waited_in_hook(wire))
                                     if numel],
                            random_state_kept=torch.equal(random_state, torch.get_rng_state()), seeds=seeds,
                            seeds_after=ours.rng.get_state(),
                            q_inputs=[m for in_q, m in ortho_calls if in_q],
                            p_inputs=[m for in_q, m in ortho_calls if not in_q],
                            keys=[key if isinstance(key, int) else repr(key)  # what the state is keyed by
                                  for key in list(ours.error_dict) + list(ours.q_memory_dict)],
                            residual=ours.error_dict.get(index, torch.zeros(0)).clone(),
                            their_residual=theirs.error_dict.get(index, torch.zeros(0)).clone()))
    return out, ours.compression_stats(), theirs.compression_stats()


def _powersgd_results(impl, world_size, steps, options, shapes=SHAPES, dtype=torch.float32, zeros=()):
    try:
        return run_ranks(_powersgd_direct, world_size, impl, steps, options, shapes, dtype, zeros, timeout=60)
    except RankFailed as failure:
        if "must match the size" in str(failure):
            raise AssertionError(f"{T123}: a tensor of the wrong size, in buckets of different sizes "
                                 f"({failure.args[0].splitlines()[0]}): the residual is kept per bucket, "
                                 "state.error_dict[bucket.index()], as the Ps and Qs are") from None
        raise


def _expected_sizes(shapes, rank_r, min_rate, last_dim=False, capped=True):
    """(numbers sent whole, P numbers, Q numbers) of one bucket, PyTorch's rule (each gradient viewed as
    (shape[0], -1)); with last_dim, a mistake's: viewed as (-1, shape[-1])."""
    whole = p = q = 0
    for shape in shapes:
        n, m = shape[0], (shape[1] if len(shape) > 1 else 1)
        if last_dim:
            n, m = torch.Size(shape[:-1]).numel(), shape[-1]
        r = min(n, m, rank_r) if capped else rank_r
        if n * m > r * (n + m) * min_rate:
            p, q = p + n * r, q + m * r
        else:
            whole += n * m
    return whole, p, q


def _records_hint(got, shapes, rank_r, min_rate, start):
    """None if the all-reduces of a compressed step are PyTorch's ([sent whole], P, Q, only Q's async), else why not."""
    whole, p, q = _expected_sizes(shapes, rank_r, min_rate)
    expected, sent = ([whole] if whole else []) + ([p, q] if p else []), got["records"]
    if sent == expected:
        if p and any(got["started"][:-1]):
            return ("an all-reduce before Q's was started with async_op=True and not waited for: P (and the tensors "
                    "sent whole) must be summed before they are used, so those all-reduces block; only Q's is "
                    "returned as a Future")
        if p and not got["started"][-1]:
            return ("the hook waited for the last all-reduce, Q's (async_op=False, or work.wait()): start it with "
                    "async_op=True and return work.get_future().then(decompress), so that backward goes on while it "
                    "travels")
        return None
    whole_u, p_u, q_u = _expected_sizes(shapes, rank_r, min_rate, capped=False)
    # trial 14 (e): was told of a late start. All sent whole here is a blocking all-reduce; a late start's plain
    # path is async_op=True
    if sent == ([whole_u] if whole_u else []) + ([p_u, q_u] if p_u else []) and (p_u or not any(got["started"])):
        return (f"expected [sent whole, P, Q] = {expected} numbers: these are the sizes with r = "
                f"matrix_approximation_rank = {rank_r} for every matrix: r = min(n, m, matrix_approximation_rank) "
                "(a matrix n x m has rank at most min(n, m)), P is n x r, Q is m x r")
    if p and sent == [got["local"].numel()]:
        return (f"the whole bucket was sent uncompressed, at step {got['step']}: compression starts at step "
                f"start_powerSGD_iter = {start} (steps 0 to {start - 1} are plain). Count the steps with "
                "state.maybe_increase_iter(bucket) on every path (the last bucket ends a step), compare with <")
    if p and sent[-1:] == [q] and sent[:-1] == [p] + ([whole] if whole else []):  # trial 9: was a bare expected
        return (f"expected [sent whole, P, Q] = {expected} numbers, in that order: the Ps were all-reduced before the "
                "tensors sent whole. The order is the docstring's (PyTorch's): the tensors sent whole, then the P "
                "buffer, then Q's")
    if p and whole and sent == [p, q, whole]:  # trial 14 (e): was a bare expected
        return (f"expected [sent whole, P, Q] = {expected} numbers, in that order: the tensors sent whole were "
                "all-reduced after Q's. Start them in the hook itself, first, before the P buffer (one started in "
                "decompress, a .then callback, runs on the communication thread, where the ranks order it "
                "differently against the next bucket's all-reduces: a hang)")
    rest = sent[1:-1] if whole and sent[:1] == [whole] else sent[:-1]
    if p and sent[-1:] == [q] and len(rest) > 1 and sum(rest) == p:  # trial 9: was told it compressed the wrong ones
        return (f"the Ps went in {len(rest)} all-reduces ({rest} numbers): all-reduce the bucket's whole P buffer, "
                "state.p_memory_dict[i], once (each P is a view into it), as Q's is")
    whole_sent = sent[:-2] if p and sent[-1:] == [q] else sent
    if whole and len(whole_sent) > 1 and sum(whole_sent) == whole:
        return (f"the tensors sent whole went in {len(whole_sent)} all-reduces ({whole_sent} numbers): concatenate "
                "them into one flat tensor, one all-reduce")
    whole_l, p_l, q_l = _expected_sizes(shapes, rank_r, min_rate, last_dim=True)
    if sent == ([whole_l] if whole_l else []) + ([p_l, q_l] if p_l else []):
        return (f"expected [sent whole, P, Q] = {expected} numbers: these are the sizes of each gradient viewed as "
                "(-1, shape[-1]): view it as (shape[0], -1), as PyTorch does (n = shape[0], m = the rest; a bias (n,) "
                "is n x 1)")
    if p and len(sent) == len(expected) and sent[:-2] == expected[:-2]:
        return (f"expected [sent whole, P, Q] = {expected} numbers: r = min(n, m, matrix_approximation_rank) (a "
                "matrix n x m has rank at most min(n, m)), P is n x r, Q is m x r")
    if p and q not in sent[-1:] and len(sent) < len(expected):
        return "P is all-reduced, but not Q: all-reduce Q = M^T P too (and divide it by N)"
    if whole not in sent or len(sent) != len(expected):
        return ("it compresses tensors that must be sent whole, or sends whole what must be compressed: compress "
                "only when n*m > r*(n+m)*min_compression_rate, strictly (1-D tensors, biases, and a matrix right at "
                "the line go whole); they go in one all-reduce together")
    return f"expected [sent whole, P, Q] = {expected} numbers"


def _parts(shapes, rank_r, min_rate):
    """[(slice of the flat bucket, compressed?)] for each tensor of a bucket."""
    parts, at = [], 0
    for shape in shapes:
        n, m = shape[0], (shape[1] if len(shape) > 1 else 1)
        r = min(n, m, rank_r)
        parts.append((slice(at, at + n * m), n * m > r * (n + m) * min_rate))
        at += n * m
    return parts


_LOCAL_LEFT = ("the compressed matrices still hold this rank's own gradients: M' = P Q^T must be written into "
               "bucket.buffer(), through the views (tensor.view(n, -1) is a view; .clone() or a new tensor is not)")


def _value_hint(got, shapes, rank_r, min_rate, start, world_size):
    """Why a compressed step's result differs from PyTorch's, where the numbers say it."""
    for part, compressed in _parts(shapes, rank_r, min_rate):
        ours, theirs = got["ours"][part], got["theirs"][part]
        if torch.allclose(ours, world_size * theirs, rtol=1e-4, atol=1e-5):
            return (f"the {'compressed matrices are' if compressed else 'tensors sent whole are'} {world_size} times "
                    "PyTorch's: the SUM over the ranks, not the mean: divide " +
                    ("Q's sum by N before M' = P Q^T" if compressed else "their sum by N"))
    compressed = [part for part, c in _parts(shapes, rank_r, min_rate) if c]
    theirs = torch.cat([got["theirs"][part] for part in compressed]) if compressed else torch.zeros(0)
    if theirs.abs().sum() > 0:  # trial 14 (e): Q divided by a fixed number was told generically
        ours = torch.cat([got["ours"][part] for part in compressed])
        scale = (ours @ theirs / (theirs @ theirs)).item()
        k = round(world_size / scale) if scale > 0 else 0
        if k >= 1 and k != world_size and abs(world_size / k - scale) < 1e-3 and torch.allclose(
                ours, scale * theirs, rtol=1e-4, atol=1e-5):
            return (f"the compressed matrices are {world_size}/{k} times PyTorch's: Q's sum was divided by {k}, not by "
                    f"N, the group's size ({world_size} here): divide by group.size()")
    if got["step"] == start:
        return ("at the first compressed step: the first Qs (state.rng's seed, torch.randn in the bucket's order), "
                "orthogonalised; P = M Q summed, orthogonalised; Q = M^T P averaged; M' = P Q^T")
    if _first_q_drawn_in(got, shapes, rank_r, min_rate) is not None:  # warm_start: the default, in these tests
        return ("at a later step (the first one agreed) the hook drew new Qs from state.rng's next seed: with "
                "state.warm_start (the default), keep each bucket's P and Q buffers (state.p_memory_dict[i], "
                "state.q_memory_dict[i]) and start from last step's averaged Q; new Qs only for a bucket that has none "
                "yet")
    return ("at a later step (the first one agreed): the warm start begins from last step's averaged Q "
            "(state.q_memory_dict), not from P; the error feedback adds the residual once")


def _gram_schmidt(matrix):
    """PyTorch's Gram-Schmidt of one matrix (powerSGD_hook's own, on a copy)."""
    matrix = matrix.double().clone().unsqueeze(0)
    torch_powersgd._orthogonalize_gram_schmidt(matrix)
    return matrix[0]


def _seed_skipped(got, out, start):
    """Whether, at the first compressed step, a bucket with no matrix to compress left state.rng where it was
    while the buckets with Qs drew their seeds (out: this rank's records). PyTorch draws a seed for every
    bucket that needs new Qs, with Qs or not: the next bucket's Qs come from the next seed."""
    def drew(record):
        before, after = record["seeds"], record["seeds_after"]
        return before[2] != after[2] or not np.array_equal(before[1], after[1])

    return (got["step"] == start and not got["q_inputs"] and not drew(got)
            and any(other["step"] == start and other["q_inputs"] and drew(other) for other in out))


def _q_from_unorthogonalised_p(ranks, shapes, rank_r, min_rate):
    """Whether rank 0's compressed matrices, at the first compressed step (no residual yet), are P Q^T with
    Q = M^T P taken from the summed P BEFORE it was orthogonalised (ranks: every rank's record of the bucket)."""
    first_qs = iter(ranks[0]["q_inputs"])
    compared = False
    for (part, compressed), shape in zip(_parts(shapes, rank_r, min_rate), shapes):
        q = next(first_qs, None) if compressed else None
        if not compressed:
            continue
        if q is None:
            return False
        ms = [got["local"][part].double().view(shape[0], -1) for got in ranks]
        q = _gram_schmidt(q)
        p = sum(m @ q for m in ms)
        q = sum(m.T @ p for m in ms) / len(ms)
        approximation = _gram_schmidt(p) @ q.T
        if not torch.allclose(ranks[0]["ours"][part].double().view_as(approximation), approximation,
                              rtol=1e-4, atol=1e-5):
            return False
        compared = True
    return compared


def _first_q_drawn_in(got, shapes, rank_r, min_rate):
    """The dtype whose torch.randn gave the first Q that the hook drew at this step (from state.rng's next
    seed, as PyTorch draws it), or None: torch.float64 for a float64 bucket, as its Q buffer."""
    sizes = [(shape[1] if len(shape) > 1 else 1, min(shape[0], shape[1] if len(shape) > 1 else 1, rank_r))
             for (_, compressed), shape in zip(_parts(shapes, rank_r, min_rate), shapes) if compressed]
    if not sizes or not got["q_inputs"]:
        return None
    rng = np.random.RandomState()
    rng.set_state(got["seeds"])
    seed = rng.randint(1_000_000_000)
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            first = torch.randn(*sizes[0], dtype=dtype)
        if torch.equal(got["q_inputs"][0].double(), first.double()):
            return dtype
    return None


def _whole_residual_lost(got, peers, rank_r, min_rate):
    """Whether the residual is zero on this bucket's tensors sent whole (PyTorch's is not), while some bucket of
    the same step keeps PyTorch's residual on its compressed matrices (error feedback itself works)."""
    def parts(o, compressed):
        return [part for part, c in _parts(SHAPES[o["index"]], rank_r, min_rate) if c == compressed]

    def right(o):
        return o["residual"].shape == o["their_residual"].shape and parts(o, True) and all(
            torch.allclose(o["residual"][p], o["their_residual"][p], rtol=1e-4, atol=1e-5) for p in parts(o, True))
    whole = parts(got, False)
    return (bool(whole) and got["residual"].shape == got["their_residual"].shape and all(
        not got["residual"][p].any() and got["their_residual"][p].any() for p in whole) and any(map(right, peers)))


def _residual_hint(got, buckets, peers, rank_r, min_rate):
    ours, theirs = got["residual"], got["their_residual"]
    strange = [key for key in got["keys"] if key not in range(buckets)]
    if strange:  # trial 9: told as a residual of the wrong size
        return (f"state.error_dict and state.q_memory_dict hold keys such as {strange[0]!r}, not bucket indices "
                f"(0 to {buckets - 1}): key them by bucket.index(). DDP hands the hook a new GradBucket at every "
                "step, so a key made from the object (id(bucket), its buffer's address) never finds last step's "
                "residual or Q, and the dicts grow by one entry a step")
    if ours.numel() != theirs.numel():
        return f"it holds {ours.numel()} numbers, PyTorch's {theirs.numel()}: one residual per bucket, the buffer's size"
    if _whole_residual_lost(got, peers, rank_r, min_rate):  # trial 14 (e): was told it is all zeros, keep a copy
        return ("it is zero on the tensors sent whole, where PyTorch's holds their local gradient minus their mean: "
                "the copy of \"what we wanted to send\" was taken after their mean was written back. Copy the "
                "buffer right after adding the old residual, before any all-reduce")
    if not ours.any():
        return ("it is all zeros, though compression left something out: after decompress, keep state.error_dict[i] "
                "= \"what we wanted to send\" (a copy, buffer.clone(), after adding the old residual; not the buffer "
                "itself, which M' then overwrites) minus the buffer")
    if torch.allclose(ours, -theirs, rtol=1e-4, atol=1e-5):
        return "it has the wrong sign: the residual is what we wanted to send minus what was sent (wanted - buffer)"
    return ("the residual is the copy of step 1 (the buffer plus the old residual) minus the buffer AFTER decompress "
            "wrote M' = P Q^T into it")


@pytest.mark.task12_3
def test_powersgd_equals_pytorchs_hook_and_sends_r_n_plus_m(impl):
    options = dict(matrix_approximation_rank=2, start_powerSGD_iter=2, min_compression_rate=2)
    start = options["start_powerSGD_iter"]
    results = _powersgd_results(impl, 3, 5, options)
    for rank, (out, stats, torch_stats) in enumerate(results):
        for got in out:
            where = f"rank {rank}, step {got['step']}, bucket {got['index']} (shapes {SHAPES[got['index']]})"
            assert not got["early"], (
                f"{T123}: {where}: the hook's Future was complete before its all-reduce had run: it returned "
                "before the all-reduce finished. Return the Q all-reduce's get_future().then(decompress)")
            assert got["ours"].shape == got["local"].shape, (  # trial 14 (e): was a raw RuntimeError in this test
                f"{T123}: {where}: the Future's value holds {got['ours'].numel()} numbers, the bucket "
                f"{got['local'].numel()}: decompress must return bucket.buffer(), the whole bucket with M' written "
                "into it (not the Q buffer, future.value()[0], or another tensor)")
            if got["step"] < start:
                if not torch.equal(got["ours"], got["plain"]):
                    summed = torch.allclose(got["ours"], 3 * got["plain"], rtol=1e-5, atol=1e-6)
                    counted_first = (got["step"] == start - 1 and got["index"] == len(SHAPES) - 1 and all(
                        torch.equal(other["ours"], other["plain"]) for other in out
                        if other["step"] < start and other is not got))
                    late = [other for other in out if other["step"] == start - 1]
                    counted_at_first = (got["step"] == start - 1 and torch.equal(late[0]["ours"], late[0]["plain"])
                                        and not any(torch.equal(o["ours"], o["plain"]) for o in late[1:])
                                        and all(torch.equal(o["ours"], o["plain"]) for o in out
                                                if o["step"] < start - 1))
                    pytest.fail(f"{T123}: {where}: before start_powerSGD_iter ({start}) the bucket must be the plain "
                                "average (allreduce_mean), exactly: " + (
                                    "it is the SUM over the ranks: divide by N" if summed else
                                    f"at step {start - 1} only the first bucket was plain, the later ones compressed: "
                                    "the step was counted at its FIRST bucket. A step ends with its LAST bucket: "
                                    "state.maybe_increase_iter(bucket) counts it there (bucket.is_last())"
                                    if counted_at_first else
                                    f"only the last bucket of step {start - 1} was compressed: the step was counted "
                                    "before the comparison; call state.maybe_increase_iter(bucket) after comparing "
                                    "state.iter with start_powerSGD_iter" if counted_first else
                                    "count the steps with state.maybe_increase_iter(bucket) (the last bucket "
                                    "ends a step), not the buckets or the calls"))
                continue
            hint = _records_hint(got, SHAPES[got["index"]], 2, 2, start)
            if hint:
                pytest.fail(f"{T123}: {where}: the all-reduces carried {got['records']} numbers: {hint}")
            if _expected_sizes(SHAPES[got["index"]], 2, 2)[1] and not got["q_inputs"]:
                pytest.fail(f"{T123}: {where}: Q was not orthogonalised before P = M Q: call orthogonalize on "
                            "each Q (a random one, or last step's) first")
            if _seed_skipped(got, out, start) and not _expected_sizes(SHAPES[got["index"]], 2, 2)[1]:
                pytest.fail(f"{T123}: {where}: this bucket has no matrix to compress, and state.rng drew no seed for "
                            "it: draw one (torch.manual_seed(state.rng.randint(1_000_000_000))) for EVERY bucket that "
                            "needs new Qs, even one without any, once, before its Qs, as PyTorch does; otherwise the "
                            "next bucket's Qs come from this bucket's seed")
            untouched = [part for part, compressed in _parts(SHAPES[got["index"]], 2, 2)
                         if compressed and got["step"] == start and torch.equal(got["ours"][part], got["local"][part])]
            if untouched:
                pytest.fail(f"{T123}: {where}: {_LOCAL_LEFT}")
            kept = [part for part, compressed in _parts(SHAPES[got["index"]], 2, 2)
                    if not compressed and torch.equal(got["ours"][part], got["local"][part])]
            if kept:  # Issue 45: a mean computed and never written back was told about the first Qs
                pytest.fail(f"{T123}: {where}: the tensors sent whole still hold this rank's own gradients: after "
                            "their all-reduce, divide by N and copy each mean back into its tensor "
                            "(tensor.copy_(mean)), a view into bucket.buffer(); rebinding a name changes nothing")
            assert got["random_state_kept"], (
                f"{T123}: {where}: the hook changed torch's global random state (torch.manual_seed for the first Qs "
                "reseeds every later torch.rand* of the training, the same on every rank): draw the first Qs "
                "inside `with torch.random.fork_rng(devices=[]):`, which puts the state back")
        assert stats[1:] == torch_stats[1:], (
            f"{T123}: rank {rank}: compression_stats() counts (before, after) = {stats[1:]}, PyTorch's hook "
            f"counts {torch_stats[1:]}: count n*m before, and r*(n+m) or n*m after, for every tensor of a "
            "compressed step (not the plain steps before start_powerSGD_iter)")
    for got in zip(*(out for out, _, _ in results)):
        for other in got[1:]:
            if not all(torch.equal(a, b) for a, b in zip(got[0]["q_inputs"], other["q_inputs"])):
                first = got[0]["step"] == start
                pytest.fail(f"{T123}: step {got[0]['step']}, bucket {got[0]['index']}: the ranks started from "
                            "different Qs: " + (
                                "draw the same first Qs on every rank, torch.randn right after torch.manual_seed("
                                "state.rng.randint(1_000_000_000)) (inside torch.random.fork_rng)" if first else
                                "the warm start begins from last step's averaged Q (state.q_memory_dict), the same "
                                "on every rank, not from P or anything computed from this rank's gradient"))
            if not all(torch.equal(a, b) for a, b in zip(got[0]["p_inputs"], other["p_inputs"])):
                pytest.fail(f"{T123}: step {got[0]['step']}, bucket {got[0]['index']}: the Ps that were orthogonalised "
                            "differ between the ranks: P was orthogonalised before its all-reduce (each rank its own "
                            "P). All-reduce the P buffer first (the sum), then orthogonalise each P: the same P on "
                            "every rank (a sum of orthonormal Ps is not orthonormal)")  # trial 14 (e): was generic
            assert torch.equal(got[0]["ours"], other["ours"]), (
                f"{T123}: step {got[0]['step']}, bucket {got[0]['index']}: the ranks ended with different "
                "gradients: every rank must draw the same first Qs (torch.manual_seed(state.rng.randint("
                "1_000_000_000)) before torch.randn), and all-reduce both P and Q")
    for ranks in zip(*(out for out, _, _ in results)):
        got = ranks[0]
        if got["step"] < start:
            continue
        if got["step"] == start and _q_from_unorthogonalised_p(ranks, SHAPES[got["index"]], 2, 2):
            pytest.fail(f"{T123}: step {got['step']}, bucket {got['index']}: M' = P Q^T where Q = M^T P was computed "
                        "from P before P was orthogonalised: all-reduce P, orthogonalise each P, and only then "
                        "Q = M^T P (with the orthonormal P, P Q^T = P P^T M projects M)")
        if not torch.allclose(got["ours"], got["theirs"], rtol=1e-4, atol=1e-5):
            pytest.fail(f"{T123}: step {got['step']}, bucket {got['index']}: differs from PyTorch's powerSGD_hook by "
                        f"{(got['ours'] - got['theirs']).abs().max().item():.3g}: "
                        f"{_value_hint(got, SHAPES[got['index']], 2, 2, start, 3)}")
        same_residual = got["residual"].shape == got["their_residual"].shape and torch.allclose(
            got["residual"], got["their_residual"], rtol=1e-4, atol=1e-5)
        assert same_residual, (
            f"{T123}: after step {got['step']}, bucket {got['index']}: the residual of error feedback "
            f"(state.error_dict[{got['index']}]) differs from PyTorch's: "
            f"{_residual_hint(got, len(SHAPES), [o for o in results[0][0] if o['step'] == got['step']], 2, 2)}")


@pytest.mark.task12_3
def test_powersgd_error_feedback_keeps_what_was_left_out(impl):
    options = dict(matrix_approximation_rank=1, start_powerSGD_iter=2, min_compression_rate=2)
    results = _powersgd_results(impl, 2, 5, options)
    for rank, (out, _, _) in enumerate(results):
        for index in range(len(SHAPES)):
            steps = [got for got in out if got["index"] == index and got["step"] >= 2]
            true = sum(got["local"] for got in steps)
            sent = sum(got["ours"] for got in steps)
            residual = steps[-1]["residual"]
            assert residual.numel() == true.numel(), (
                f"{T123}: rank {rank}, bucket {index}: no error-feedback residual in state.error_dict[{index}] "
                "after compressed steps: keep what was left out (the buffer plus the old residual, minus the "
                "result), and add it to the next step's buffer")
            assert torch.allclose(true - sent, residual, atol=1e-4), (
                f"{T123}: rank {rank}, bucket {index}: error feedback: the sum of the local gradients minus the sum "
                f"of the results differs from the residual by {(true - sent - residual).abs().max().item():.3g}: "
                "add the residual to the buffer once, and keep (buffer with residual) - result")


@pytest.mark.task12_3
def test_powersgd_of_full_rank_is_the_exact_mean_and_waits_for_its_start(impl):
    # rank >= min(n, m), and min_compression_rate=0.5 so that every tensor is compressed but the (1,) one
    # (1 > 1 * 2 * 0.5 is false): P Q^T is then the projection of M on its own column space, the exact mean;
    # start_powerSGD_iter=3: steps 0-2 plain. The 8 x 12 weight is not exact at rank 5: without error feedback
    # and warm start it must match PyTorch's hook (its QR flips signs, P Q^T does not change). In float64, as a
    # float64 model's gradients are, and every all-reduce sends float64. Bucket 3 holds a frozen parameter's
    # zero gradient: its P is zero, finite only with orthogonalization_epsilon (NaN without, PyTorch's too).
    shapes = [[(6, 3)], [(3, 5), (7,), (1,)], [(8, 12)], [(4, 6)]]
    options = dict(matrix_approximation_rank=5, start_powerSGD_iter=3, min_compression_rate=0.5,
                   use_error_feedback=False, warm_start=False, orthogonalization_epsilon=1e-12)
    results = _powersgd_results(impl, 3, 5, options, shapes, torch.float64, zeros=(3,))
    for rank, (out, _, _) in enumerate(results):
        for got in out:
            where = f"rank {rank}, step {got['step']}, bucket {got['index']} (shapes {shapes[got['index']]}, float64)"
            if got["step"] < 3:
                assert torch.equal(got["ours"], got["plain"]), (
                    f"{T123}: {where}: before start_powerSGD_iter (3) the result must be the plain average; count "
                    "the steps with state.maybe_increase_iter(bucket) (the last bucket ends a step)")
                continue
            assert got["ours"].dtype == torch.float64, (
                f"{T123}: {where}: the Future held {got['ours'].dtype}: return bucket.buffer(), in its own dtype")
            hint = _records_hint(got, shapes[got["index"]], 5, 0.5, 3)
            if hint:
                pytest.fail(f"{T123}: {where}: matrix_approximation_rank=5: the all-reduces carried {got['records']} "
                            f"numbers: {hint}")
            names = (["the flat tensor of those sent whole"] if _expected_sizes(shapes[got["index"]], 5, 0.5)[0] else []) + [
                "the P buffer", "the Q buffer"]
            other = [f"{name} in {str(sent).replace('torch.', '')}" for name, sent in zip(names, got["dtypes"])
                     if sent != torch.float64]
            assert not other, (  # trial 14 (e): a float32 copy of the whole tensors or of P passed, or was told of Qs
                f"{T123}: {where}: the all-reduces sent {', '.join(other)}: send everything in the bucket's dtype "
                "(float64 here), no copy in another dtype: it costs precision, and a float32 copy of float64 "
                "numbers sends as many bytes as it saves")
            if got["index"] == 3 and not torch.isfinite(got["ours"]).all():
                pytest.fail(f"{T123}: {where}: a frozen parameter's zero gradient came back as NaN with "
                            "orthogonalization_epsilon=1e-12: its P is all zeros, and only norm + epsilon keeps "
                            "P / norm finite: pass state.orthogonalization_epsilon to every orthogonalize call "
                            "(each P and each Q)")
            assert not got["kept"], (
                f"{T123}: {where}: warm_start=False, but state.{' and state.'.join(got['kept'])} still hold this "
                "bucket's buffers after the step: without warm start they stay alive for nothing (new Qs are drawn "
                "next step): in decompress, del state.p_memory_dict[i] and state.q_memory_dict[i]")
            assert got["residual"].numel() == 0, (
                f"{T123}: {where}: use_error_feedback=False, but the hook kept a residual in state.error_dict: "
                "without error feedback nothing is added to the buffer, nor kept")
            if got["index"] == 2:
                drawn = _first_q_drawn_in(got, shapes[2], 5, 0)
                if drawn not in (None, torch.float64) and not torch.allclose(got["ours"], got["theirs"], rtol=1e-6,
                                                                               atol=1e-8):
                    pytest.fail(f"{T123}: {where}: differs from PyTorch's powerSGD_hook: the first Qs were drawn in "
                                f"{drawn} and copied into the float64 Q buffer: draw them in the bucket's dtype, "
                                "torch.randn(m, r, dtype=dtype), as PyTorch does (the same seed gives other numbers "
                                "in another dtype)")
                assert torch.allclose(got["ours"], got["theirs"], rtol=1e-6, atol=1e-8), (
                    f"{T123}: {where}: use_error_feedback=False, warm_start=False: differs from PyTorch's "
                    f"powerSGD_hook by {(got['ours'] - got['theirs']).abs().max().item():.3g}: without error "
                    "feedback, add no residual; without warm start, draw new first Qs (state.rng's next seed) at "
                    "every step, not last step's Qs")
                continue
            if not torch.allclose(got["ours"], got["plain"], rtol=1e-6, atol=1e-8):  # trial 14 (e): was generic
                for (part, compressed), shape in zip(_parts(shapes[got["index"]], 5, 0.5), shapes[got["index"]]):
                    ours, plain = got["ours"][part], got["plain"][part]
                    scale = (ours @ plain / (plain @ plain)).item() if plain.abs().sum() > 0 else 1.0
                    if (compressed and min(shape[0], torch.Size(shape[1:]).numel()) == 1 and abs(scale - 1) > 1e-3
                            and torch.allclose(ours, scale * plain, rtol=1e-6, atol=1e-8)):
                        pytest.fail(f"{T123}: {where}: the {shape} gradient, compressed at r = 1 (one column), came back "
                                    f"{scale:.4g} times the mean: its P (or Q) of one column was not normalised. "
                                    "orthogonalize every P and every Q, also at r = 1: it divides even a single "
                                    "column by its norm")
            assert torch.allclose(got["ours"], got["plain"], rtol=1e-6, atol=1e-8), (
                f"{T123}: {where}: with rank >= min(n, m) PowerSGD is exact, but the result differs from the "
                f"mean by {(got['ours'] - got['plain']).abs().max().item():.3g}: P = M Q (Q orthonormal), "
                "orthogonalise the summed P, Q = M^T P averaged, M' = P Q^T")


def _powersgd_in_buckets(rank, world_size, impl, warm_start, steps=4):
    """Your powersgd_hook on Task 5's DDP with one bucket a tensor (8 buckets, every Q all-reduce in
    flight before the first is waited for), and PyTorch's powerSGD_hook on the same buckets of the same
    local gradients, one bucket after the other (PyTorch's hook starts collectives in callbacks: with
    several buckets in flight on gloo it hangs). [(step, [(ours, theirs) per parameter])]."""
    import copy

    torch.manual_seed(0)
    _on_cpus_only()
    comp, td = judging(impl, "12.3"), load("solutions", "template_ddp")
    model = nn.Sequential(*(nn.Linear(32, 32) for _ in range(4)))  # Issue 45's: 4 KB weights, 128 B biases
    local = copy.deepcopy(model)
    ddp = td.DDP(model, bucket_size_mb=0.001)
    options = dict(matrix_approximation_rank=1, start_powerSGD_iter=2, warm_start=warm_start)
    ours, theirs = comp.PowerSGDState(None, **options), torch_powersgd.PowerSGDState(None, **options)
    ddp.register_comm_hook(ours, comp.powersgd_hook)
    index_of = {id(p): i for i, p in enumerate(model.parameters())}
    g = torch.Generator().manual_seed(rank)
    out = []
    for step in range(steps):
        x, y = torch.randn(8, 32, generator=g), torch.randn(8, 32, generator=g)
        model.zero_grad(set_to_none=True)
        local.zero_grad(set_to_none=True)
        try:
            F.mse_loss(ddp(x), y).backward()
            ddp.finish_gradient_synchronization()
        except (NotImplementedError, AssertionError):
            raise
        except Exception as error:  # raised here, at once: the other rank may wait in a collective for this one
            said = " ".join(str(error).split())[:300]
            forgot = isinstance(error, KeyError) or "KeyError" in said  # a callback's error comes back as a RuntimeError
            raise AssertionError(
                f"{T123}: rank {rank}, Task 5's DDP with 8 buckets in flight, warm_start={warm_start}, step {step}: "
                f"the hook raised {type(error).__name__}: {said}" + (
                    ": each bucket's decompress must forget only its OWN P and Q (state.p_memory_dict[i] and "
                    "state.q_memory_dict[i]): the other buckets' all-reduces are still in flight and read theirs"
                    if forgot and not warm_start else "")) from None
        F.mse_loss(local(x), y).backward()
        grads = [p.grad for p in local.parameters()]
        reference = [None] * len(grads)
        for index, bucket in enumerate(ddp.buckets):
            tensors = [grads[index_of[id(p)]] for p in bucket.params]
            flat = torch_powersgd.powerSGD_hook(theirs, _grad_bucket(
                td, tensors, index, index == len(ddp.buckets) - 1)).wait()
            for p, mean in zip(bucket.params, flat.split([p.numel() for p in bucket.params])):
                reference[index_of[id(p)]] = mean.view_as(p).clone()
        out.append((step, [(p.grad.clone(), want) for p, want in zip(model.parameters(), reference)],
                    (len(ours.error_dict), sorted(theirs.error_dict))))
    assert len(ddp.buckets) >= 4, f"Task 5's DDP made {len(ddp.buckets)} buckets: the test needs several"
    return out


@pytest.mark.task12_3
@pytest.mark.parametrize("warm_start", [False, True])
def test_powersgd_with_several_buckets_in_flight_equals_pytorchs(impl, warm_start):
    """Issue 45: the reference hook, warm_start=False, cleared every bucket's P and Q in the first
    bucket's decompress, and the next bucket's decompress raised KeyError (8 buckets in flight)."""
    for rank, out in enumerate(run_ranks(_powersgd_in_buckets, 2, impl, warm_start, timeout=30)):
        where = f"rank {rank}, Task 5's DDP with 8 buckets in flight, warm_start={warm_start}"
        for step, grads, (kept, their_kept) in out:
            assert kept or not their_kept, (  # trial 14 (e): error feedback tied to warm_start was told of sharing
                f"{T123}: {where}, step {step}: state.error_dict holds no residual, PyTorch's holds one for each of the buckets "
                f"for {their_kept}: use_error_feedback (on by default) and warm_start are independent: keep each "
                "bucket's residual whenever use_error_feedback is set, with or without warm start")
            for i, (ours, theirs) in enumerate(grads):
                assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5), (
                    f"{T123}: {where}, step {step}, parameter {i}: differs from PyTorch's powerSGD_hook (one bucket "
                    f"at a time, the same local gradients) by {(ours - theirs).abs().max().item():.3g}: keep the "
                    "Ps, Qs and residuals per bucket (keyed by bucket.index()), never shared between buckets")


@pytest.mark.task12_3
def test_powersgd_under_both_ddps_equals_pytorchs(impl):
    _compare_runs(T123, run_ranks(_train, 2, impl, "12.3", ["powersgd"], 5, timeout=60), "powersgd", exact=False)


def _train_on_gpu(rank, world_size, impl, task, names, steps):
    return _train(rank, world_size, impl, task, names, steps, device=gpu.use_gpu(rank))


@pytest.mark.gpu
@pytest.mark.task12_1
@pytest.mark.parametrize("backend", gpu.backends(2))
def test_compress_hooks_on_gpus_equal_pytorchs(impl, backend):
    """The same comparison with CUDA tensors: NCCL on 2 GPUs, gloo with both ranks on one."""
    results = run_ranks(_train_on_gpu, 2, impl, "12.1", ["bf16", "fp16"], 3, backend=backend, timeout=90)
    for name in ("bf16", "fp16"):
        _compare_runs(T121, results, name, exact=True)


@pytest.mark.gpu
@pytest.mark.task12_3
@pytest.mark.parametrize("backend", gpu.backends(2))
def test_powersgd_on_gpus_equals_pytorchs(impl, backend):
    results = run_ranks(_train_on_gpu, 2, impl, "12.3", ["powersgd"], 5, backend=backend, timeout=90)
    _compare_runs(T123, results, "powersgd", exact=False)


def test_powersgd_state_refuses_a_start_before_step_2():
    comp = load("solutions", "template_compression")
    with pytest.raises(ValueError, match="start_powerSGD_iter"):
        comp.PowerSGDState(start_powerSGD_iter=1)


# --------------------------------------------------------------------------- a process group of its own
def _in_a_subgroup(rank, world_size, impl, task):
    """Ranks 0 and 2 of 3 average over their own group (as a data-parallel group of a 2-D grid does):
    N is the group's size, not the world's; rank 1 takes no part."""
    torch.manual_seed(1000 + rank)
    _on_cpus_only()
    comp, td = judging(impl, task), load("solutions", "template_ddp")
    group = dist.new_group([0, 2])  # every rank calls new_group
    if rank == 1:
        return None
    g = torch.Generator().manual_seed(rank)
    out = []
    for step in range(3):
        tensors = [torch.randn(24, 8, generator=g), torch.randn(24, generator=g)]
        if task == "12.1":
            theirs = default_hooks.bf16_compress_hook(group, _grad_bucket(td, tensors, 0, True)).wait()
            hook, state = comp.bf16_compress_hook, group
        else:
            if step == 0:
                options = dict(matrix_approximation_rank=2, start_powerSGD_iter=2)
                hook = comp.powersgd_hook
                state, their_state = comp.PowerSGDState(group, **options), torch_powersgd.PowerSGDState(group, **options)
            theirs = torch_powersgd.powerSGD_hook(their_state, _grad_bucket(td, tensors, 0, True)).wait()
        with Wire(ALL_REDUCE, check=only_over(group, T121 if task == "12.1" else T123)):
            ours = hook(state, _grad_bucket(td, tensors, 0, True)).wait()
        out.append((ours.clone(), theirs.clone()))
    return out


@pytest.mark.task12_1
def test_compress_hook_averages_over_its_process_group(impl):
    for rank, out in enumerate(run_ranks(_in_a_subgroup, 3, impl, "12.1", timeout=30)):
        for step, (ours, theirs) in enumerate(out or []):
            assert torch.equal(ours, theirs), (
                f"{T121}: rank {rank}, step {step}, in a process group of ranks 0 and 2 out of 3: differs from "
                f"PyTorch's bf16_compress_hook by {(ours - theirs).abs().max().item():.3g}: all-reduce over "
                "process_group and divide by its size (None: the whole world)")


@pytest.mark.task12_3
def test_powersgd_averages_over_its_process_group(impl):
    for rank, out in enumerate(run_ranks(_in_a_subgroup, 3, impl, "12.3", timeout=30)):
        for step, (ours, theirs) in enumerate(out or []):
            assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5), (
                f"{T123}: rank {rank}, step {step}, in a process group of ranks 0 and 2 out of 3: differs from "
                f"PyTorch's powerSGD_hook by {(ours - theirs).abs().max().item():.3g}: every all-reduce over "
                "state.process_group, divided by its size (None: the whole world)")


# --------------------------------------------------------------------------- train_ddp.py --compress
SMALL = ["--data", "synthetic", "--epochs", "1", "--train-samples", "1024", "--test-samples", "128", "--batch-size", "128"]


@pytest.mark.e2e
@pytest.mark.repo
@pytest.mark.parametrize("flags", [
    # slow, all three: a torchrun run costs 15-45 s, and the default suite must stay near a minute
    pytest.param(["--impl", REFERENCE, "--sync", "overlap", "--compress", "powersgd", "--powersgd-rank", "2"],
                 marks=pytest.mark.slow),
    pytest.param(["--impl", "ddp", "--compress", "powersgd", "--powersgd-rank", "2"], marks=pytest.mark.slow),
    pytest.param(["--impl", REFERENCE, "--sync", "overlap", "--compress", "bf16"], marks=pytest.mark.slow),
], ids=["overlap-powersgd", "ddp-powersgd", "overlap-bf16"])
def test_train_ddp_compresses_and_keeps_the_ranks_identical(flags, tmp_path):
    # here, not at the top: every rank imports this file, and train_ddp.py's imports cost each 60 ms
    from test_train_ddp import trained  # train_ddp.py's training on 2 harness ranks

    _, out = trained(2, [*flags, *SMALL, "--no-plot"], tmp_path)
    assert "ranks consistent: all 2 ranks hold bit-identical parameters" in out, out
    assert re.search(r"compression \d+\.\dx fewer (numbers|bytes)", out), out
    if "powersgd" in flags:  # 8 steps: plain averages for 2, then compressed
        assert "fewer numbers (PowerSGD rank 2: " in out, out


@pytest.mark.repo
@pytest.mark.parametrize("flags,says", [
    (["--compress", "bf16"], "add --sync overlap"),
    (["--powersgd-rank", "2"], "add --compress powersgd"),
    (["--compress", "powersgd", "--powersgd-rank", "0"], "1 or more"),
    (["--compress", "fp16", "--shard", "full"], "cannot be combined"),
    (["--compress", "fp16", "--sync", "overlap", "--tp", "2"], "cannot be combined"),
])
def test_train_ddp_refuses_what_cannot_compress_in_one_line(flags, says):
    import train_ddp

    with pytest.raises(ValueError) as refused:
        train_ddp.check_flags(train_ddp.parse_args(["--impl", REFERENCE, *SMALL, *flags]))
    assert says in str(refused.value) and "\n" not in str(refused.value), refused.value


@pytest.mark.repo
def test_a_refused_compression_stops_train_ddp_with_one_line_and_exit_2(monkeypatch):
    """What train_ddp.py's __main__ does, in this process: main() refuses, cannot_start() says it in one
    line and gives exit code 2. The real command's exit code and lone line are checked by a subprocess in
    tests/test_train_ddp.py (test_a_setting_that_cannot_work_gives_one_line): here one start of torch fewer."""
    from contextlib import redirect_stderr, redirect_stdout
    from io import StringIO
    from unittest import mock

    import train_ddp
    from support.interrupt import cannot_start

    monkeypatch.setattr(signal, "signal", lambda *handler: None)  # cannot_start ignores SIGTERM: not in pytest
    with mock.patch.dict(os.environ), redirect_stdout(StringIO()) as out, redirect_stderr(StringIO()) as err:
        with pytest.raises(ValueError) as refused:  # main() writes a launcher's variables into the environment
            train_ddp.main(train_ddp.parse_args(["--impl", REFERENCE, *SMALL, "--compress", "bf16"]))
        code = cannot_start(refused.value)
    said = out.getvalue() + err.getvalue()
    assert code == 2 and said.count("\n") == 1 and "--compress bf16 hooks into DDP's gradient buckets" in err.getvalue(), (
        code, said)


def _zero_bucket_on_rank_0(rank, world_size, impl):
    comp, td = judging(impl, "12.1"), load("solutions", "template_ddp")
    tensors = [torch.zeros(6) if rank == 0 else torch.arange(6.0) * (rank + 1)]
    theirs = default_hooks.bf16_compress_hook(None, _grad_bucket(td, [t.clone() for t in tensors], 0, True)).wait()
    ours = comp.bf16_compress_hook(None, _grad_bucket(td, tensors, 0, True)).wait()
    return (ours[0] if isinstance(ours, list) else ours).clone(), theirs.clone()


@pytest.mark.task12_1
@pytest.mark.slow
def test_a_bucket_of_zeros_is_still_all_reduced(impl):
    """Rank 0's bucket all zeros (a layer that got no gradient there): it still takes part in the all-reduce, and
    gets the mean like every rank. A hook that returns a finished Future for nothing to add passed before."""
    try:
        results = run_ranks(_zero_bucket_on_rank_0, 3, impl, timeout=30)
    except (RankTimeout, RankFailed) as error:
        raise AssertionError(
            f"{T121}: 3 ranks, rank 0's bucket all zeros: Every rank must all-reduce its bucket, also one of zeros (it "
            "adds nothing, but the others wait for it): a rank that skips one leaves the others waiting, or gloo "
            f"pairs their next collective with the wrong one.\n"
            f"{error}") from None
    for rank, (ours, theirs) in enumerate(results):
        assert torch.equal(ours, theirs), (
            f"{T121}: 3 ranks, rank 0's bucket all zeros: rank {rank} holds {ours.tolist()}, PyTorch's hook "
            f"{theirs.tolist()}: every rank gets the mean, rank 0 too")
