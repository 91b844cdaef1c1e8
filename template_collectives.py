"""Task 0: warm-up with collectives, before any training.

    python template_collectives.py                                      # a world of one
    torchrun --standalone --nproc_per_node=3 template_collectives.py    # 3 processes on CPUs (gloo)
    torchrun --standalone --nproc_per_node=gpu template_collectives.py  # one process per GPU (NCCL)
    torchrun --standalone --nproc_per_node=3 solutions/template_collectives.py  # the reference answers
    python check.py 0                                                   # check your work (one task: 0.1)

torchrun starts one copy of this script per rank, and setup_distributed() joins them
into a process group whose backend carries the tensors: gloo on CPUs, NCCL between GPUs.
The copies share no memory: they exchange tensors only through collectives, which every
rank of a group must call, in the same order, or the ranks that did call wait for the
others (a hang). Each section below
calls one collective and prints what every rank holds before and after it. Every rank
starts from the tensor of the seed example, torch.arange(2) + 1 + 2 * rank: rank 0 holds
[1, 2], rank 1 [3, 4], rank 2 [5, 6], so you can predict every result. Three are your tasks:

    Task 0.1  predict_all_reduce     what the all_reduce will give, worked out without communicating
    Task 0.2  all_gather_tensors     every rank gets every rank's tensor
    Task 0.3  overlapped_all_reduce  start an all_reduce, compute while it travels, then wait

Until you fill one in, its section prints one line saying so and the others still run.
"""
import argparse
import datetime
import re
import time

import torch
import torch.distributed as dist

# The set-up is given and is the same in template_trainer.py and its solution (only the
# Task 2 functions differ), so this file and solutions/template_collectives.py import it
# from the same name, without a copy: run from the top of the repository that name is
# template_trainer.py, run as solutions/template_collectives.py it is the one next to it.
from template_trainer import cleanup, print0, setup_distributed


def rank_tensor(rank, device="cpu"):
    """The seed example's tensor: [1, 2] on rank 0, [3, 4] on rank 1, [5, 6] on rank 2, ..."""
    return torch.arange(2, device=device) + 1 + 2 * rank


def show(title, before, after):
    """Print one block on rank 0: a line per rank, in rank order, with what it held before and after.

    Every rank calls this (all_gather_object is a collective too). Gathering the lines to
    one printer keeps them in order; ranks printing for themselves would interleave."""
    def as_text(value):
        return "-" if value is None else str(value.tolist()) if torch.is_tensor(value) else str(value)

    lines = [None] * dist.get_world_size()
    dist.all_gather_object(lines, f"{as_text(before):>18} -> {as_text(after)}")
    print0(f"\n== {title}")
    for rank, line in enumerate(lines):
        print0(f"  rank {rank}: {line}")


# ----------------------------------------------------------------------------- given
# Each demo returns (before, after): what this rank held before the collective and after.


def broadcast_demo(rank, device, src=0):
    """broadcast: every rank ends with rank src's tensor (used by Task 2.1 for the weights)."""
    tensor = rank_tensor(rank, device)
    before = tensor.clone()
    dist.broadcast(tensor, src=src)  # in place: src sends, the others overwrite theirs
    return before, tensor


def reduce_demo(rank, device, dst=0):
    """reduce: rank dst ends with the sum of every rank's tensor; the others get nothing.

    What the other ranks' tensors hold afterwards is not defined (gloo leaves partial sums
    there), so they return None rather than a value you might be tempted to use."""
    tensor = rank_tensor(rank, device)
    before = tensor.clone()
    dist.reduce(tensor, dst=dst, op=dist.ReduceOp.SUM)
    return before, tensor if rank == dst else None


def all_reduce_demo(rank, device):
    """all_reduce: every rank ends with the sum (a reduce followed by a broadcast, in effect)."""
    tensor = rank_tensor(rank, device)
    before = tensor.clone()
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return before, tensor


def reduce_scatter_demo(rank, device):
    """reduce_scatter: the sum over ranks, cut into world_size pieces; rank r keeps piece r.

    Every rank holds world_size numbers, 10 * rank + r for r = 0, 1, ...: the tens digit
    says who holds it, the ones digit which rank's piece it is. It is an all_reduce in
    which each rank receives only its piece, the first half of a ring all_reduce.
    Returns (before, None) where the backend cannot do it (gloo of PyTorch
    releases older than pytorch/pytorch#149869, 2025)."""
    world_size = dist.get_world_size()
    tensor = 10 * rank + torch.arange(world_size, device=device)
    piece = torch.empty(1, dtype=tensor.dtype, device=device)
    try:
        dist.reduce_scatter(piece, list(tensor.chunk(world_size)), op=dist.ReduceOp.SUM)
    except RuntimeError as error:  # every rank fails alike, before any communication
        if "does not support" not in str(error):
            raise
        return tensor, None
    return tensor, piece


def send_recv_demo(rank, device):
    """send/recv around a ring: rank r sends its tensor to r + 1 and receives r - 1's.

    send and recv block until the other side takes part. If every rank sent first, every
    rank would wait for a receiver that is itself sending: a deadlock (with gloo even for
    two numbers). So even ranks send first and odd ranks receive first. On GPUs,
    dist.batch_isend_irecv does the same without the ordering. Returns (before, None) in a
    world of one, since a rank cannot send to itself."""
    world_size = dist.get_world_size()
    tensor = rank_tensor(rank, device)
    if world_size == 1:
        return tensor, None
    received = torch.empty_like(tensor)
    to_rank, from_rank = (rank + 1) % world_size, (rank - 1) % world_size
    if rank % 2 == 0:
        dist.send(tensor, dst=to_rank)
        dist.recv(received, src=from_rank)
    else:
        dist.recv(received, src=from_rank)
        dist.send(tensor, dst=to_rank)
    return tensor, received


def new_group_demo(rank, device):
    """new_group: an all_reduce among the even ranks and, separately, among the odd ones.

    Every rank must call new_group for every group, in the same order, even for groups it
    will not belong to: creating a group is itself collective. A collective with
    group=... then involves only that group's ranks."""
    world_size = dist.get_world_size()
    groups = [dist.new_group(ranks) for ranks in (range(0, world_size, 2), range(1, world_size, 2)) if ranks]
    tensor = rank_tensor(rank, device)
    before = tensor.clone()
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=groups[rank % 2])
    return before, tensor


# ----------------------------------------------------------------------------- your tasks


def predict_all_reduce(world_size):
    """What every rank holds after all_reduce_demo, worked out without any communication.

    Rank r starts with rank_tensor(r) = torch.arange(2) + 1 + 2 * r, for every rank
    r = 0, 1, ..., world_size - 1, and all_reduce with ReduceOp.SUM leaves their
    elementwise sum on every rank. Predict it on paper first (for 2 ranks, then 3), then
    compute it here. Returns an integer tensor of 2 elements.
    """
    # --- Task 0.1 begin ---
    # TODO Task 0.1: the sum of rank_tensor(rank) over every rank, computed here without communicating
    raise NotImplementedError("Task 0.1: predict_all_reduce() in template_collectives.py is not done yet (docs/task0-collectives.md)")
    # --- Task 0.1 end ---


def all_gather_tensors(tensor):
    """Every rank's `tensor`, stacked in rank order, returned on every rank.

    Every rank calls this with a tensor of the same shape and dtype. dist.all_gather
    writes rank r's tensor into the r-th tensor of a list that you allocate, one tensor
    per rank, with tensor's shape and dtype, on its device. Returns a tensor of shape (world_size, *tensor.shape)
    whose row r is rank r's tensor.
    """
    # --- Task 0.2 begin ---
    # TODO Task 0.2: a list of one new tensor per rank, dist.all_gather into it, then torch.stack
    raise NotImplementedError("Task 0.2: all_gather_tensors() in template_collectives.py is not done yet (docs/task0-collectives.md)")
    # --- Task 0.2 end ---


def overlapped_all_reduce(tensor, compute):
    """Sum `tensor` over all ranks in place, and run compute() while the sum travels.

    dist.all_reduce(..., async_op=True) returns a handle at once and communicates in the
    background; handle.wait() returns when the sum is in `tensor`. Start the all_reduce,
    call compute() (work that neither reads nor writes `tensor`), then wait. This overlap
    is what DistributedDataParallel does with gradients during the backward pass.
    Returns what compute() returned.
    """
    # --- Task 0.3 begin ---
    # TODO Task 0.3: dist.all_reduce with async_op=True, then compute(), then handle.wait()
    raise NotImplementedError("Task 0.3: overlapped_all_reduce() in template_collectives.py is not done yet (docs/task0-collectives.md)")
    # --- Task 0.3 end ---


# ----------------------------------------------------------------------------- sections


def overlap_timings(device, numel=4_000_000, size=384, repeats=8, tries=3):
    """Milliseconds for an all_reduce of `numel` floats alone, a computation alone, both one
    after the other, and both overlapped with overlapped_all_reduce; the best of `tries`
    each, since the first tries are slowed by whatever else the machine does."""
    a = torch.randn(size, size, device=device)
    compute = lambda: [a @ a for _ in range(repeats)]
    tensor = torch.ones(numel, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None  # GPU calls return early

    def best_of(fn):
        times = []
        for _ in range(tries):
            sync()
            dist.barrier()  # start together, or we time the wait for a slower rank
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        return min(times) * 1e3

    dist.all_reduce(tensor)  # the first call to a collective sets up connections: not timed
    return {"all_reduce": best_of(lambda: dist.all_reduce(tensor)),
            "compute": best_of(compute),
            "sequential": best_of(lambda: (dist.all_reduce(tensor), compute())),
            "overlapped": best_of(lambda: overlapped_all_reduce(tensor, compute))}


def sections(rank, world_size, device):
    """The warm-up's blocks, one function each, in the order they print."""

    def broadcast():
        show("broadcast(tensor, src=0): every rank gets rank 0's tensor", *broadcast_demo(rank, device))

    def reduce():
        show("reduce(tensor, dst=0, op=SUM): rank 0 gets the sum, the others nothing", *reduce_demo(rank, device))

    def all_reduce():
        before, after = all_reduce_demo(rank, device)
        show("all_reduce(tensor, op=SUM): every rank gets the sum", before, after)
        predicted = predict_all_reduce(world_size).tolist()
        print0(f"  Task 0.1: predict_all_reduce({world_size}) = {predicted}, "
               f"{'as all_reduce gave' if predicted == after.tolist() else 'but all_reduce gave ' + str(after.tolist())}")

    def all_gather():
        tensor = rank_tensor(rank, device)
        show("all_gather(tensors, tensor): every rank gets every rank's tensor (Task 0.2)",
             tensor, all_gather_tensors(tensor))

    def reduce_scatter():
        before, after = reduce_scatter_demo(rank, device)
        if after is None:
            print0(f"\n== reduce_scatter: the {dist.get_backend()} backend of PyTorch {torch.__version__} "
                   "does not support it (NCCL does, and gloo in newer PyTorch)")
            return
        show("reduce_scatter(piece, pieces, op=SUM): rank r gets the sum of every rank's piece r", before, after)

    def send_recv():
        before, after = send_recv_demo(rank, device)
        if after is None:
            print0("\n== send/recv: needs 2 ranks or more (a rank cannot send to itself)")
            return
        show("send to rank + 1, recv from rank - 1: every rank gets its left neighbour's tensor", before, after)

    def new_group():
        show("new_group(even ranks), new_group(odd ranks), all_reduce(group=...): a sum per group",
             *new_group_demo(rank, device))

    def overlap():
        ms = {name: round(value) for name, value in overlap_timings(device).items()}
        show("all_reduce(async_op=True), compute, handle.wait() (Task 0.3): the time saved",
             f"{ms['sequential']} ms in turn", f"{ms['overlapped']} ms overlapped: saved "
             f"{ms['sequential'] - ms['overlapped']} ms of at most {min(ms['all_reduce'], ms['compute'])} "
             f"(all_reduce alone {ms['all_reduce']} ms, compute alone {ms['compute']} ms)")
        print0("  (on a CPU, computation and gloo share the cores and little may be saved; on a GPU, "
               "NCCL runs beside the kernels)")

    return [broadcast, reduce, all_reduce, all_gather, reduce_scatter, send_recv, new_group, overlap]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["nccl", "gloo"], default=None,
                        help="process-group backend (default: nccl with GPUs, gloo without)")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective waits for the other ranks: how long a hang lasts (default: 60)")
    args = parser.parse_args(argv)
    rank, _, world_size, device = setup_distributed(args.backend, datetime.timedelta(seconds=args.timeout))
    not_done = []
    try:
        print0(f"{world_size} rank(s), backend {dist.get_backend()}, device {device.type}; "
               "every rank starts from torch.arange(2) + 1 + 2 * rank")
        for section in sections(rank, world_size, device):
            try:
                section()
            except NotImplementedError as error:
                # An unfilled TODO: every rank raises at the same point, so none is left
                # waiting in a collective, and the other sections can still run.
                task = re.match(r"Task (\d+)\.(\d+)", str(error))
                print0(f"\n{error}\n  check it with:  python check.py {task[1]}.{task[2]}")
                not_done.append(task[0])
    finally:
        cleanup()
    # Exit code 0 even with tasks left: they are the expected state of a fresh clone, and
    # torchrun would answer a non-zero exit with a screen of its own traceback.
    print0("\n" + (f"not done yet: {', '.join(not_done)}" if not_done else "all tasks done"))


if __name__ == "__main__":
    main()
