"""Task 3: the hand-made all-reduces against dist.all_reduce, and the bytes each rank sends.

    pytest --impl template -m task3_1     # naive_all_reduce
    pytest --impl template -m task3_2     # ring_all_reduce

Each rank runs the function under test inside `traffic()`, which counts the bytes that
pass through the process group's send and recv (every dist.send, recv, isend, irecv and
batch_isend_irecv ends there, so a student's own plain code is measured too) and makes
the collectives (all_reduce, reduce, broadcast, ...) fail: they are what is being rebuilt.
The reference is dist.all_reduce itself, called outside traffic().
"""
import contextlib
import math

import pytest
import torch
import torch.distributed as dist

from conftest import load
from harness import RankFailed, RankTimeout, run_ranks

ProcessGroup = torch._C._distributed_c10d.ProcessGroup
COLLECTIVES = ["allreduce", "allreduce_coalesced", "reduce", "broadcast", "allgather", "_allgather_base",
               "allgather_coalesced", "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
               "reduce_scatter_tensor_coalesced", "gather", "scatter", "alltoall", "alltoall_base"]
WHERE = {"naive_all_reduce": "Task 3.1 (template_allreduce.py, naive_all_reduce)",
         "ring_all_reduce": "Task 3.2 (template_allreduce.py, ring_all_reduce)"}
DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32]


DTYPE_MISMATCH = "buffer on the wire"
NOT_WAITED = "never waited for"
NO_SUCH_PEER = "which does not exist"  # a rank messaging a rank out of range, or itself (no pair to itself)


class Request:
    """A send's or recv's Work as the code under test gets it: the Work itself does the work; this
    notes in `record` whether anyone waited for it (wait(), its Future, or is_completed() seen True).
    The record does not hold the Work: a Work dropped unwaited is dropped as it would be untested."""

    def __init__(self, work, record):
        self._work, self._record = work, record

    def wait(self, *args, **kwargs):
        self._record["waited"] = True
        return self._work.wait(*args, **kwargs)

    def get_future(self):
        self._record["waited"] = True
        return self._work.get_future()

    def is_completed(self):
        done = self._work.is_completed()
        self._record["waited"] |= done
        return done

    def __getattr__(self, name):
        return getattr(self._work, name)


@contextlib.contextmanager
def traffic(where, dtype=None):
    """Count the bytes this rank sends and receives; make every collective raise. With a dtype (the
    tensor all-reduced): make a message of another dtype raise, before gloo aborts on its size."""
    counts = {"sent": 0, "received": 0, "sends": 0, "receives": 0}
    patched, requests = {}, []

    def counting(name, key):
        original = getattr(ProcessGroup, name)
        patched[name] = vars(ProcessGroup)[name]  # the attribute itself, to restore exactly

        def method(self, tensors, *args, **kwargs):
            if name == "recv_anysource" and any(t.numel() == 0 for t in tensors):
                raise AssertionError(
                    f"{where}: it received an empty tensor from any source (dist.recv or irecv without src). "
                    "gloo (torch 2.14) returns from such a receive at once, and the empty message then lands in "
                    "a later receive: a crash in gloo (\"offset < this->size\") or a hang. Name the source, "
                    "src=rank, or send nothing for an empty tensor on every rank alike")
            other = next((t.dtype for t in tensors if dtype is not None and t.dtype != dtype), None)
            if other is not None:
                raise AssertionError(
                    f"{where}: all-reducing a tensor of dtype {str(dtype)[6:]}, it "
                    f"{'sent' if key == 'sent' else 'received into'} a {DTYPE_MISMATCH} of dtype {str(other)[6:]}: "
                    "both ends of a message must agree on its dtype (gloo aborts on a size mismatch). Make every "
                    "buffer in the tensor's dtype: torch.empty_like or dtype=tensor.dtype (torch.empty(n) and "
                    "torch.zeros(shape) alone are float32), and a cache of buffers kept between calls keyed by "
                    "dtype too")
            peer = args[0] if args else kwargs.get("dstRank" if key == "sent" else "srcRank")
            if name != "recv_anysource" and isinstance(peer, int) and not 0 <= peer < self.size():
                raise AssertionError(
                    f"{where}: rank {self.rank()} of {self.size()} {'sent to' if key == 'sent' else 'received from'} "
                    f"rank {peer}, {NO_SUCH_PEER} (ranks are 0 to {self.size() - 1}): a message to a rank "
                    "that is not there waits forever. Neighbours on a ring wrap around: right = (rank + 1) % "
                    "world_size, left = (rank - 1) % world_size")
            if name != "recv_anysource" and peer == self.rank():
                raise AssertionError(
                    f"{where}: rank {peer} of {self.size()} {'sent a message to' if key == 'sent' else 'received from'} "
                    f"itself, over a connection {NO_SUCH_PEER} (gloo: 'Pair is not connected'): a rank never messages itself, its own tensor is already there. " + (
                        "Make world_size - 1 steps in each phase of the ring (none in a world of one)"
                        if "ring" in where else "Loop over the other ranks only: range(1, world_size) on rank 0"))
            counts[key] += sum(t.numel() * t.element_size() for t in tensors)
            counts["sends" if key == "sent" else "receives"] += 1
            record = {"kind": "isend" if key == "sent" else "irecv", "waited": False}
            requests.append(record)
            return Request(original(self, tensors, *args, **kwargs), record)
        return method

    def forbidden(name):
        patched[name] = vars(ProcessGroup)[name]

        def method(self, *args, **kwargs):
            raise AssertionError(f"{where}: it called a collective (ProcessGroup.{name}); build it from "
                                 "dist.send/recv, isend/irecv or batch_isend_irecv only: the all-reduce is "
                                 "what you are writing, and the tests count the bytes each rank sends")
        return method

    replacements = {"send": counting("send", "sent"), "recv": counting("recv", "received"),
                    "recv_anysource": counting("recv_anysource", "received")}
    replacements.update({name: forbidden(name) for name in COLLECTIVES if name in vars(ProcessGroup)})
    for name, method in replacements.items():
        setattr(ProcessGroup, name, method)
    short, chunk = [], torch.Tensor.chunk  # chunk(n) calls that gave fewer than n pieces

    def noting(self, chunks, *args, **kwargs):
        pieces = chunk(self, chunks, *args, **kwargs)
        if len(pieces) < chunks:
            short.append((self.numel(), chunks, len(pieces)))
        return pieces
    torch.Tensor.chunk = noting
    try:
        yield counts
    except IndexError as error:
        if not short:
            raise
        numel, asked, got = short[0]
        raise AssertionError(
            f"{where}: IndexError: {error}, after tensor.chunk({asked}) of {numel} elements gave {got} chunks, not "
            f"{asked}: chunk makes pieces of ceil(numel / n) and fewer of them when they run out; "
            "tensor_split(world_size) always makes world_size chunks (some empty)") from error
    finally:
        torch.Tensor.chunk = chunk
        for name, original in patched.items():
            setattr(ProcessGroup, name, original)
    unwaited = [record["kind"] for record in requests if not record["waited"]]
    if unwaited:  # dist.send and dist.recv wait themselves; batch_isend_irecv returns one Work per op
        raise AssertionError(
            f"{where}: it returned with {len(unwaited)} of its {len(requests)} messages {NOT_WAITED} "
            f"({unwaited[0]} among them): the Work that dist.isend, dist.irecv or batch_isend_irecv returns must be "
            "waited for (work.wait()) before the function returns. An isend's Work dropped unwaited may never be "
            "sent (its receiver then waits forever), and until an irecv's Work completes its buffer holds nothing")


def make_input(rank, shape, dtype, world_size=2):
    """Different numbers on every rank, the same on every run. int64 beyond 2**53 where there is a sum to
    make (a world of one shows a division by the world size, or any float on the way, in its float cases)."""
    g = torch.Generator().manual_seed(1000 * rank + math.prod(shape))
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype == torch.int64 and world_size > 1:  # beyond 2**53, where float64 rounds; four still fit in int64
        return torch.randint(-2 ** 60, 2 ** 60, shape, generator=g, dtype=dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)


def all_reduce_cases(rank, world_size, func_name, impl):
    """On one rank: (input, result, expected, bytes sent, bytes received, memory kept, sends) for each case."""
    all_reduce = getattr(load(impl, "template_allreduce"), func_name)
    results = []
    for shape, dtype in cases(world_size):
        tensor = make_input(rank, shape, dtype, world_size)
        before, expected, memory = tensor.clone(), tensor.clone(), tensor.data_ptr()
        dist.all_reduce(expected)
        with traffic(WHERE[func_name], tensor.dtype) as counts:
            all_reduce(tensor)
        results.append((before, tensor, expected, counts["sent"], counts["received"], tensor.data_ptr() == memory,
                        counts["sends"]))
    return results


def cases(world_size):
    """Evenly divisible lengths first (clean diagnoses), then remainders, tiny and 2-D tensors,
    each in two of the dtypes."""
    n = world_size
    shapes = [(5 * n,), (64 * n,), (5 * n + 1,), (64 * n + n - 1,), (1003,), (1,), (max(n - 1, 1),), (n + 1,),
              (0,), (3, 7), (2, 3, 5)]
    return [(shape, DTYPES[(i + k) % len(DTYPES)]) for i, shape in enumerate(shapes) for k in (0, 2)]


_runs = {}  # the sums test and the traffic test share one run, or one failure


def run(func_name, world_size, impl, timeout=10):
    """Every case on `world_size` ranks; any rank's failure or a hang is reported as this task's."""
    key = (func_name, world_size, impl)
    if key not in _runs:
        try:
            _runs[key] = run_ranks(all_reduce_cases, world_size, func_name, impl, timeout=timeout)
        except (AssertionError, NotImplementedError) as error:
            _runs[key] = as_task_failure(error, func_name, world_size)
    if isinstance(_runs[key], Exception):
        raise _runs[key]
    return _runs[key]


def as_task_failure(error, func_name, world_size):
    where = WHERE[func_name]
    if isinstance(error, RankTimeout):
        return AssertionError(
            f"{where}: the ranks hung on world size {world_size}. If every rank first calls a blocking "
            "dist.send, all of them wait for a receiver that never comes (gloo's and NCCL's send both wait "
            "for the matching receive): post each send together with its receive, as exchange() does. "
            f"Otherwise the ranks disagree about how many messages go where.\n{error}")
    if isinstance(error, RankFailed):
        tip = (" An error about sizes means the sender and the receiver disagree about a message's size: about "
               "which chunk is exchanged at some step (chunk bookkeeping), about a receive buffer sliced to another "
               "length than the chunk sent (one kept from an earlier, smaller call must grow), or about whether "
               "there is a message at all (an exchange skipped on one side, for an empty chunk say: every rank "
               "makes all 2(N-1) exchanges, empty chunks included)."
               if func_name == "ring_all_reduce" and not any(said in str(error) for said in
                                                             (DTYPE_MISMATCH, NOT_WAITED, NO_SUCH_PEER,
                                                              "tensor_split(world_size)"))
               else "")
        return AssertionError(f"{where}: a rank failed on world size {world_size}.{tip}\n{error}")
    return error


def close(got, expected):
    if got.dtype == torch.float64:  # sums in another order differ by about 1e-16; float32 rounding by 1e-7
        return torch.isclose(got, expected, rtol=1e-12, atol=1e-12)
    if got.dtype.is_floating_point:
        return torch.isclose(got, expected, rtol=1e-5, atol=1e-5)
    return got == expected


def check_sums(func_name, world_size, results):
    """Assert every case on every rank holds dist.all_reduce's sum; explain the first one that does not."""
    where = WHERE[func_name]
    for case in range(len(results[0])):
        for rank, rank_results in enumerate(results):
            before, got, expected, _, _, kept, _ = rank_results[case]
            what = f"a {tuple(got.shape)} {str(got.dtype)[6:]} tensor on {world_size} ranks, rank {rank}"
            assert got.shape == expected.shape and got.dtype == expected.dtype, (
                f"{where}: {what} came back as {tuple(got.shape)} {got.dtype}: change the tensor in place")
            assert kept or got.numel() == 0, (
                f"{where}: {what} came back in other memory: its data_ptr() changed, so the tensor was pointed "
                "at a new buffer (tensor.data = ..., tensor.set_(...)) instead of written into. Write the sum into "
                "the tensor's own memory (tensor.copy_(...), or chunks that are views of it), as dist.all_reduce "
                "does: any other view of that memory (a gradient inside a flat bucket, a parameter's .grad held "
                "elsewhere) would keep the old numbers")
            good = close(got, expected).reshape(-1)
            if good.all():
                continue
            n, wrong = got.numel(), (~good).nonzero().reshape(-1)
            first = wrong[0].item()
            detail = (f"{where}: {what} is wrong at {len(wrong)} of {n} elements (first at index {first}: "
                      f"got {got.reshape(-1)[first].item()}, dist.all_reduce gives {expected.reshape(-1)[first].item()}).")
            raise AssertionError(detail + " " + diagnose(func_name, world_size, rank, results, case, good))
        same = [torch.equal(results[0][case][1], rank_results[case][1]) for rank_results in results]
        assert all(same), (f"{where}: ranks {[r for r, s in enumerate(same) if not s]} hold sums that differ in the "
                           "last bits from rank 0's: every rank must end with bit-identical results (sum each "
                           "element once, then copy it), or the replicas of the model drift apart. A ring that "
                           "passes the whole tensor around adds in a different order on each rank")


def diagnose(func_name, world_size, rank, results, case, good):
    before, got, expected, _, _, _, _ = results[rank][case]
    n = got.numel()
    if not got.dtype.is_floating_point and got.dtype.itemsize == 8:
        off = (got.double() - expected.double()).abs()
        scale = sum(rank_results[case][0].double().abs() for rank_results in results)  # what was added up
        if (off <= scale * 2.0 ** -20).all():
            return ("The int64 sums are off by no more than a float's rounding of the numbers added (about "
                    "2**60, beyond 2**53): they went through a floating-point tensor (float64 holds integers "
                    "exactly only up to 2**53, float32 up to 2**24). Keep the sum in the tensor's own dtype "
                    "(tensor.clone(), torch.zeros_like).")
    if func_name == "naive_all_reduce" and rank != 0 and close(results[0][case][1], expected).all():
        return ("Rank 0 has the sum but this rank does not: rank 0 must send the sum back to every rank, "
                "and every other rank must receive it into its tensor.")
    if world_size > 1 and torch.equal(got, before):
        return ("The tensor was not changed: write the sum into `tensor` itself, in place, as "
                "dist.all_reduce does; returning a new tensor is not enough.")
    if got.dtype == torch.float64 and torch.allclose(got, expected, rtol=1e-5, atol=1e-5):
        return ("The float64 sums are right only to float32's precision (about 1e-7 relative): they went "
                "through a float32 tensor on the way (torch.zeros(shape) or torch.empty(n) without dtype= makes "
                "one). Keep every buffer in the tensor's dtype (torch.zeros_like, torch.empty_like, .to(dtype)).")
    if world_size > 1 and got.dtype.is_floating_point and torch.allclose(got * world_size, expected, rtol=1e-4, atol=1e-4):
        return ("It holds the mean, not the SUM: all-reduce sums, and average_gradients divides by the "
                "world size afterwards.")
    if func_name == "naive_all_reduce" and rank == 0 and world_size > 2:
        for src in range(1, world_size):  # every receive into one buffer, added up after the last one landed
            if close(got, results[0][case][0] + (world_size - 1) * results[src][case][0]).all():
                return (f"Rank 0 holds its own tensor plus {world_size - 1} times rank {src}'s: the {world_size - 1} "
                        "receives all landed in one buffer before it was added to the total (irecvs posted together "
                        "into the same tensor?). Add each received tensor before the next receive overwrites the "
                        "buffer, or receive each into a buffer of its own.")
    if func_name == "naive_all_reduce":
        return ("Rank 0 must add up its own tensor and the N-1 it receives, then send that sum to every "
                "other rank.")
    tail = world_size * (n // world_size)
    wrong = (~good).nonzero().reshape(-1)
    if n % world_size and wrong.min().item() >= tail:
        return (f"Only elements from index {tail} on are wrong: {n} elements do not divide evenly over "
                f"{world_size} ranks, and the remainder of {n % world_size} belongs to no chunk. Make "
                "world_size chunks that cover every element (tensor_split gives lengths that differ by "
                "at most one).")
    if n >= world_size > 1 and 0 < good.sum().item() <= math.ceil(n / world_size):
        return ("Only one chunk's worth of elements holds the full sum: that is where the reduce-scatter "
                "phase ends. The all-gather phase must then pass each finished chunk around the ring "
                "(N-1 more steps, overwriting rather than adding).")
    return ("Check the chunk bookkeeping: in the reduce-scatter, at step s rank r sends chunk (r - s) % N "
            "and adds what it receives into chunk (r - s - 1) % N; in the all-gather it sends chunk "
            "(r + 1 - s) % N and overwrites chunk (r - s) % N with what it receives.")


# --- Task 3.1: naive_all_reduce ------------------------------------------------------------------

@pytest.mark.task3_1
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_naive_all_reduce_sums_like_dist_all_reduce(impl, world_size):
    check_sums("naive_all_reduce", world_size, run("naive_all_reduce", world_size, impl))


@pytest.mark.task3_1
@pytest.mark.parametrize("world_size", [2, 4])
def test_naive_all_reduce_goes_through_rank_0(impl, world_size):
    where, others = WHERE["naive_all_reduce"], world_size - 1
    for rank, rank_results in enumerate(run("naive_all_reduce", world_size, impl)):
        for _, tensor, _, sent, received, _, _ in rank_results:
            size = tensor.numel() * tensor.element_size()
            if rank == 0:
                assert (received, sent) == (others * size, others * size), (
                    f"{where}: on {world_size} ranks, with a tensor of {size} bytes, rank 0 received {received} "
                    f"bytes and sent {sent}; in the naive pattern it receives the N-1 other tensors and sends "
                    f"the sum back to each, {others * size} bytes each way: the bottleneck the ring removes")
            else:
                assert (sent, received) == (size, size), (
                    f"{where}: rank {rank} sent {sent} and received {received} bytes for a tensor of {size} "
                    "bytes; in the naive pattern every other rank sends its tensor to rank 0 once and "
                    "receives the sum from rank 0 once")


# --- Task 3.2: ring_all_reduce -------------------------------------------------------------------

@pytest.mark.task3_2
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ring_all_reduce_sums_like_dist_all_reduce(impl, world_size):
    check_sums("ring_all_reduce", world_size, run("ring_all_reduce", world_size, impl))


@pytest.mark.task3_2
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_all_reduce_sends_2_n_minus_1_over_n(impl, world_size):
    n = world_size
    for rank, rank_results in enumerate(run("ring_all_reduce", world_size, impl)):
        for _, tensor, _, sent, _, _, sends in rank_results:
            size = tensor.numel() * tensor.element_size()
            limit = 2 * (n - 1) * math.ceil(tensor.numel() / n) * tensor.element_size()  # 2(N-1) chunks
            assert sent <= limit or sends <= 2 * (n - 1), (
                f"{WHERE['ring_all_reduce']}: on {n} ranks rank {rank} made {sends} sends to all-reduce a tensor of "
                f"{tensor.numel()} elements ({sent} bytes in all, at most {limit} in a ring): a ring makes N-1 "
                f"reduce-scatter steps and N-1 all-gather steps, one send each, 2(N-1) = {2 * (n - 1)} here; "
                "count the steps of each loop")
            assert sent <= limit, (
                f"{WHERE['ring_all_reduce']}: on {n} ranks rank {rank} sent {sent} bytes to all-reduce a "
                f"tensor of {size} bytes, {sent / size:.2f} times the tensor; a ring sends 2(N-1) chunks of "
                f"about 1/N of it, 2(N-1)/N = {2 * (n - 1) / n:.2f} times the tensor, at most {limit} bytes "
                f"here. Passing the whole tensor around the ring costs (N-1) = {n - 1} times it: split it "
                "into world_size chunks")


# --- train_ddp.py --allreduce naive|ring ---------------------------------------------------------

def sync_like_task_2_2(rank, world_size, name, impl):
    """Gradients averaged by train_ddp's --allreduce path, and by dist.all_reduce / world_size."""
    from models import CNN
    from strategies.data_parallel import average_gradients_with

    torch.manual_seed(0)  # the same model on every rank, different data
    model = CNN()
    model.features[0].bias.requires_grad_(False)  # a frozen parameter: no .grad to average
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(rank))
    model(images).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    for grad in expected:
        dist.all_reduce(grad)
        grad /= world_size
    with traffic(WHERE[f"{name}_all_reduce"]):
        average_gradients_with(name, impl)(model)
    return [p.grad for p in model.parameters() if p.grad is not None], expected


@pytest.mark.parametrize("name", [pytest.param("naive", marks=pytest.mark.task3_1),
                                  pytest.param("ring", marks=pytest.mark.task3_2)])
def test_train_ddp_allreduce_flag_averages_gradients(impl, name):
    for rank, (got, expected) in enumerate(run_ranks(sync_like_task_2_2, 3, name, impl, timeout=10)):
        for index, (g, e) in enumerate(zip(got, expected)):
            assert torch.allclose(g, e, rtol=1e-5, atol=1e-6), (
                f"{WHERE[name + '_all_reduce']}: train_ddp.py --allreduce {name} gave rank {rank} a different "
                f"mean gradient than dist.all_reduce for parameter {index}; the other tests of this task say why")
