"""Task 0: the warm-up with collectives (template_collectives.py).

    pytest --impl template -m "task0_1 or task0_2 or task0_3"   # your tasks; see conftest.py

The given demos run on 1, 2 and 3 gloo ranks and each rank's tensors are checked against
values worked out here by hand; the tasks are checked against dist.all_reduce and
torch.stack of the tensors the test itself gave each rank. The last test runs the
warm-up the way docs/task0-collectives.md does, under torchrun.
"""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from conftest import load
from harness import run_ranks

T01 = "Task 0.1 (template_collectives.py, predict_all_reduce)"
T02 = "Task 0.2 (template_collectives.py, all_gather_tensors)"
T03 = "Task 0.3 (template_collectives.py, overlapped_all_reduce)"
GIVEN = ("the warm-up's given code (template_collectives.py, {}): restore it as the course gave it "
         "(`git diff template_collectives.py` shows what changed)")

WORLD_SIZES = [1, 2, 3]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def seed_tensor(rank):
    """The seed example's tensor, built here rather than taken from the code under test."""
    return torch.tensor([1 + 2 * rank, 2 + 2 * rank])


def all_reduce_sum(world_size):
    """sum over r < n of [1 + 2r, 2 + 2r] = [n + n(n-1), 2n + n(n-1)]"""
    return [world_size ** 2, world_size ** 2 + world_size]


# --------------------------------------------------------------------------- given demos
def _run_demos(rank, world_size, impl):
    collectives = load(impl, "template_collectives")
    cpu = torch.device("cpu")
    held = {name: getattr(collectives, name + "_demo")(rank, cpu)
            for name in ["broadcast", "reduce", "all_reduce", "reduce_scatter", "send_recv", "new_group"]}
    reference = seed_tensor(rank)
    dist.all_reduce(reference)  # for Task 0.1: what all_reduce really gives
    held["reference_all_reduce"] = reference
    return held


@pytest.fixture(scope="module")
def held(impl):
    """held(n)[rank][demo] = (before, after) on n ranks; each world size runs once."""
    cache = {}

    def get(world_size):
        if world_size not in cache:
            cache[world_size] = run_ranks(_run_demos, world_size, impl)
        return cache[world_size]
    return get


def check_demo(held, world_size, demo, expected_after):
    for rank, on_rank in enumerate(held(world_size)):
        before, after = on_rank[demo]
        after = after if after is None or not torch.is_tensor(after) else after.tolist()
        assert after == expected_after(rank), (
            f"{GIVEN.format(demo + '_demo')}: on {world_size} ranks, rank {rank} holds {after} after "
            f"{demo}, expected {expected_after(rank)}")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_broadcast_gives_every_rank_rank_0s_tensor(held, world_size):
    check_demo(held, world_size, "broadcast", lambda rank: [1, 2])


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_reduce_gives_only_rank_0_the_sum(held, world_size):
    check_demo(held, world_size, "reduce", lambda rank: all_reduce_sum(world_size) if rank == 0 else None)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_reduce_gives_every_rank_the_sum(held, world_size):
    check_demo(held, world_size, "all_reduce", lambda rank: all_reduce_sum(world_size))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_reduce_scatter_gives_rank_r_the_sum_of_pieces_r(held, world_size):
    if held(world_size)[0]["reduce_scatter"][1] is None:
        pytest.skip(f"gloo has no reduce_scatter in PyTorch {torch.__version__} (newer ones have it)")
    # rank q holds 10 q + r for r < n; rank r gets the sum over q: 10 n(n-1)/2 + n r
    check_demo(held, world_size, "reduce_scatter",
               lambda rank: [10 * world_size * (world_size - 1) // 2 + world_size * rank])


def test_reduce_scatter_missing_from_the_backend_is_reported_not_raised(impl, monkeypatch):
    """What an older gloo raises; it cannot happen with this PyTorch, so it is imitated."""
    collectives = load(impl, "template_collectives")

    def unsupported(*args, **kwargs):
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")
    monkeypatch.setattr(dist, "reduce_scatter", unsupported)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    before, after = collectives.reduce_scatter_demo(1, torch.device("cpu"))
    assert before.tolist() == [10, 11] and after is None, (
        f"{GIVEN.format('reduce_scatter_demo')}: a backend without reduce_scatter must give (before, None)")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_send_recv_passes_each_tensor_to_the_next_rank(held, world_size):
    check_demo(held, world_size, "send_recv",
               lambda rank: None if world_size == 1 else seed_tensor((rank - 1) % world_size).tolist())


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_new_group_sums_even_and_odd_ranks_separately(held, world_size):
    check_demo(held, world_size, "new_group",
               lambda rank: sum(seed_tensor(q) for q in range(rank % 2, world_size, 2)).tolist())


# --------------------------------------------------------------------------- Task 0.1
def _why_not(predicted, world_size):
    if world_size > 1 and predicted == [x / world_size for x in all_reduce_sum(world_size)]:
        return "that is the mean: all_reduce with ReduceOp.SUM adds the tensors, it does not average them"
    n = world_size
    if predicted == [n * n + 2 * n, n * n + 3 * n]:
        return "that is the sum over ranks 1 .. world_size: ranks count from 0, so rank 0's [1, 2] is in the sum"
    return "add torch.arange(2) + 1 + 2 * rank over every rank = 0 .. world_size - 1"


def _predict(collectives, world_size):
    """predict_all_reduce(world_size), called here in the test's own process, where no process group exists."""
    try:
        return collectives.predict_all_reduce(world_size)
    except (ValueError, RuntimeError) as error:
        if "process group" not in str(error).lower():
            raise
        raise AssertionError(
            f"{T01}: predict_all_reduce({world_size}) called torch.distributed ({error}): the prediction is "
            "worked out without any communication, from world_size alone, and the test calls it where no "
            "process group exists; add up rank_tensor(r) for r = 0 .. world_size - 1 yourself") from error


@pytest.mark.task0_1
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_prediction_matches_all_reduce(impl, held, world_size):
    predicted = torch.as_tensor(_predict(load(impl, "template_collectives"), world_size)).tolist()
    for rank, on_rank in enumerate(held(world_size)):  # after the prediction: no ranks start for a TODO
        actual = on_rank["reference_all_reduce"].tolist()
        assert predicted == actual, (
            f"{T01}: for world_size {world_size} you predicted {predicted}, but dist.all_reduce left {actual} "
            f"on rank {rank}: {_why_not(predicted, world_size)}")


@pytest.mark.task0_1
def test_prediction_for_larger_worlds(impl):
    collectives = load(impl, "template_collectives")
    for world_size in [4, 5, 8, 16]:
        prediction = torch.as_tensor(_predict(collectives, world_size))
        predicted = prediction.tolist()
        assert predicted == all_reduce_sum(world_size), (
            f"{T01}: for world_size {world_size} you predicted {predicted}, but all_reduce would leave "
            f"{all_reduce_sum(world_size)} on every rank: {_why_not(predicted, world_size)}")
        # rank_tensor holds integers, and the sum of integers stays an integer tensor
        assert not prediction.is_floating_point() and not prediction.is_complex(), (
            f"{T01}: the values are right, but the prediction is a {prediction.dtype} tensor: the ranks hold "
            "integer tensors and all_reduce leaves an integer tensor; return an integer one (no division, no .float())")


# --------------------------------------------------------------------------- Task 0.2
def _gather_on_rank(rank, world_size, impl):
    # an awkward shape and float values, unlike the demo, so that a 1-D answer cannot pass by luck
    collectives = load(impl, "template_collectives")
    tensor = torch.full((2, 3), 10.0 * rank) + torch.arange(3)
    gathered = collectives.all_gather_tensors(tensor)
    # and integers, as the demo's rank_tensor holds: outputs allocated in the default dtype (float32)
    # hold float tensors' values, not these
    integers = torch.arange(4).reshape(2, 2) + 100 * rank
    try:
        gathered_integers = collectives.all_gather_tensors(integers)
    except ValueError as error:  # raised by every rank alike, before anything is sent
        if "different dtypes" not in str(error):
            raise
        gathered_integers = error
    return tensor, gathered, integers, gathered_integers


def _check_integers(results, world_size):
    """The int64 tensors' gather: the outputs in the input's dtype, the rows in rank order."""
    expected = torch.stack([integers for _, _, integers, _ in results])
    for rank, (_, _, integers, got) in enumerate(results):
        if isinstance(got, ValueError):
            raise AssertionError(
                f"{T02}: gathering an int64 tensor on {world_size} ranks, dist.all_gather refused the output "
                f"list ({got}): its tensors must have the input's dtype (and device); allocate them with "
                "torch.empty_like(tensor), not torch.empty(tensor.shape), which makes float32 ones")
        assert torch.is_tensor(got) and got.dtype == integers.dtype and torch.equal(got, expected), (
            f"{T02}: gathering the int64 tensor {integers.tolist()} on {world_size} ranks, rank {rank} returned "
            f"{got.dtype if torch.is_tensor(got) else type(got).__name__} {got.tolist() if torch.is_tensor(got) else got}, "
            f"expected the int64 tensor {expected.tolist()}: the result keeps the input's dtype")


@pytest.mark.task0_2
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_gather_gives_every_rank_every_tensor(impl, world_size):
    results = run_ranks(_gather_on_rank, world_size, impl)
    expected = torch.stack([tensor for tensor, _, _, _ in results])  # each rank's own tensor, in rank order
    for rank, (_, got, _, _) in enumerate(results):
        assert torch.is_tensor(got) and got.shape == expected.shape, (
            f"{T02}: with world_size {world_size}, rank {rank} returned "
            f"{tuple(got.shape) if torch.is_tensor(got) else type(got).__name__}; expected a tensor of shape "
            f"{tuple(expected.shape)}, (world_size, *tensor.shape): torch.stack the gathered list, not torch.cat")
        if torch.equal(got, expected):
            continue
        if world_size > 1 and all(torch.equal(row, expected[-1]) for row in got):
            raise AssertionError(
                f"{T02}: every row holds rank {world_size - 1}'s tensor: your list holds one tensor "
                f"{world_size} times ([t] * n), so each rank's data overwrote the last; allocate one tensor per rank")
        if rank > 0 and torch.equal(results[0][1], expected):
            raise AssertionError(
                f"{T02}: rank 0 got every tensor but rank {rank} got {got.tolist()}: every rank must receive "
                "them all (dist.all_gather, not dist.gather)")
        raise AssertionError(f"{T02}: rank {rank} returned {got.tolist()}, expected row r to be rank r's "
                             f"tensor: {expected.tolist()}")
    _check_integers(results, world_size)


# --------------------------------------------------------------------------- Task 0.3
SENTINEL = "computed"


def _call(collectives, tensor, compute):
    try:
        return collectives.overlapped_all_reduce(tensor, compute)
    except AttributeError as error:
        if "'NoneType' object has no attribute 'wait'" not in str(error):
            raise
        raise AssertionError(
            f"{T03}: dist.all_reduce returned None, not a handle: only with async_op=True does it return "
            "at once with a handle to wait on; without it, it returns when the sum is there, so nothing "
            "could overlap") from error


def _overlap_on_rank(rank, world_size, impl, signal_path):
    """Rank 0's compute() lets the other ranks into the all_reduce, so the sum can only
    arrive after compute() has run: a rank 0 that waits before computing is never let in.
    Each rank also notes whether compute() ran before any dist.all_reduce had been started."""
    collectives = load(impl, "template_collectives")
    tensor = seed_tensor(rank)
    launched, computed_first, all_reduce = [], [], dist.all_reduce

    def recording(*args, **kwargs):
        launched.append(True)
        return all_reduce(*args, **kwargs)
    dist.all_reduce = recording
    try:
        return _overlap(rank, collectives, tensor, signal_path, lambda: computed_first.append(not launched))
    finally:
        dist.all_reduce = all_reduce
        assert not (computed_first and computed_first[0] and launched), (
            f"{T03}: rank {rank} called compute() before it started the all_reduce: the sum only set off once "
            "compute() had finished, so nothing overlapped; start the all_reduce with async_op=True first, "
            "then compute, then wait")


def _overlap(rank, collectives, tensor, signal_path, note):
    if rank == 0:
        def compute():
            note()
            open(signal_path, "w").close()
            return SENTINEL
        result = _call(collectives, tensor, compute)
        held_on_return = tensor.tolist()  # before the others could have joined, unless rank 0 waited
        dist.barrier()  # gloo's barrier waits for this rank's earlier collectives: a sum on its way is in now
        return result, held_on_return, tensor.tolist()
    deadline = time.monotonic() + 8
    while not os.path.exists(signal_path):
        assert time.monotonic() < deadline, (
            f"{T03}: rank 0 did not call compute() while its all_reduce was in flight (rank {rank} waited "
            "8 s for it): it waited for the sum first (a blocking all_reduce, or handle.wait() before "
            "compute()), so nothing could overlap; start the all_reduce with async_op=True, compute, then wait")
        time.sleep(0.01)
    time.sleep(0.3)  # join late, so that a rank 0 which never waits returns before the sum exists
    result = _call(collectives, tensor, lambda: note() or SENTINEL)
    held_on_return = tensor.tolist()
    dist.barrier()
    return result, held_on_return, tensor.tolist()


@pytest.mark.task0_3
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_async_all_reduce_overlaps_and_waits(impl, world_size, tmp_path):
    results = run_ranks(_overlap_on_rank, world_size, impl, str(tmp_path / "computed"))
    for rank, (result, held_on_return, held_later) in enumerate(results):
        assert result == SENTINEL, f"{T03}: rank {rank} returned {result!r}: return what compute() returned"
        if held_on_return == all_reduce_sum(world_size):
            continue
        said = f"{T03}: with world_size {world_size}, rank {rank} held {held_on_return} when overlapped_all_reduce returned"
        if held_later == all_reduce_sum(world_size):  # the sum came, after the function had returned
            raise AssertionError(
                f"{said}, and the sum {held_later} only later: call handle.wait() before returning, or the sum "
                "may not have arrived")
        if held_later == seed_tensor(rank).tolist():
            raise AssertionError(
                f"{said}, and still {held_later} once every rank's collectives had finished: the sum never "
                "came into the tensor you were given. all_reduce `tensor` itself, in place (not a copy such "
                "as tensor.clone() or tensor.float(), whose sum nobody reads)")
        raise AssertionError(f"{said}, and {held_later} once every rank's collectives had finished; expected the "
                             f"sum {all_reduce_sum(world_size)} (all_reduce with ReduceOp.SUM, in place)")


# --------------------------------------------------------------------------- the script
@pytest.mark.slow  # torchrun and its 2 ranks, three interpreters importing torch: 9-13 s of the default run
def test_script_runs_under_torchrun(impl):
    script = os.path.relpath(load(impl, "template_collectives").__file__, REPO)  # solutions/' or yours
    # python -m torch.distributed.run is torchrun; --standalone picks a free port itself
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # torchrun warns when it has to set it
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its ranks
        output, _ = proc.communicate()
        pytest.fail(f"torchrun {script} still ran after 60 s (a hang?); its output:\n{output[-3000:]}")
    assert proc.returncode == 0 and "Traceback" not in output, (
        f"torchrun --standalone --nproc_per_node=2 {script} failed (exit code {proc.returncode}):\n{output[-3000:]}")
    lines = output.splitlines()
    # every block is printed, or for a task not done yet, the one line that says so
    for title, task in [("broadcast", None), ("reduce(", None), ("all_reduce(", None), ("all_gather", "Task 0.2"),
                        ("reduce_scatter", None), ("send", None), ("new_group", None), ("all_reduce(async", "Task 0.3")]:
        assert any(line.startswith("== " + title) or task and line.startswith(task + ":") for line in lines), (
            f"{script}: no block for {title} in its output:\n{output[-3000:]}")
    if impl == "solutions":
        block = lines.index("== all_reduce(tensor, op=SUM): every rank gets the sum")
        assert [line.split()[-2:] for line in lines[block + 1:block + 3]] == [["[4,", "6]"]] * 2, output
        assert "all tasks done" in output, output
    else:  # an unfilled task is one line, not a traceback
        assert "all tasks done" in output or "not done yet" in output, output
