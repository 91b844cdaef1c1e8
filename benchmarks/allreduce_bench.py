"""What an all-reduce costs: dist.all_reduce against the hand-made ones of Task 3.

    torchrun --standalone --nproc_per_node=2 benchmarks/allreduce_bench.py
    torchrun --standalone --nproc_per_node=4 benchmarks/allreduce_bench.py
    torchrun --standalone --nproc_per_node=4 benchmarks/allreduce_bench.py --max-size 4MB --repeats 5

Times four all-reduces of float32 tensors from 1 KB to 64 MB, all in one run so they meet
the same machine load: dist.all_reduce (gloo's own ring), naive_all_reduce and
ring_all_reduce from solutions/template_allreduce.py, and a "whole-buffer ring", the
ring that passes the whole tensor around instead of chunks of it. Each timing is the
slowest rank's, after a barrier; the figure is the median of --repeats timings after
--warmup, and the algorithms take turns inside every repetition so a burst of load from
elsewhere hits them all alike. Rank 0 prints the table, the target ratios, and writes
allreduce_<backend>_<N>ranks.csv and .png under --out: runs/benchmarks/ by default,
benchmarks/results/ (the figures the pages show) with --update-results.

Bandwidths as nccl-tests define them, for S bytes on N ranks in t seconds:
    algbw = S / t                     what the caller sees
    busbw = algbw * 2(N-1)/N          the link speed a perfect ring would need; comparable
                                      across N, and close to the hardware's for a good ring
"""
import argparse
import csv
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from bench_common import (add_device_arguments, add_output_arguments, device_defaults,  # noqa: E402
                          exit_without_teardown, init_distributed, output_folder)  # (beside this file)
from solutions.template_allreduce import exchange, naive_all_reduce, ring_all_reduce  # noqa: E402

UNITS = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30}


WHOLE_BUFFERS = {}


def whole_buffer_ring_all_reduce(tensor):
    """The ring without chunks: N-1 steps, each passing a whole tensor to the right.

    Correct, but every rank sends (N-1) tensors instead of 2(N-1)/N of one: the contrast
    that shows what chunking buys (PITFALLS.md: 'a ring that passes the whole buffer').
    Its two buffers are kept between calls, as ring_all_reduce keeps its one: a fresh
    buffer of 32 MB or more page-faults on first use, and that is not what we compare."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    key = (tensor.numel(), tensor.dtype, tensor.device)
    if key not in WHOLE_BUFFERS:
        WHOLE_BUFFERS.clear()  # one size at a time: the benchmark goes size by size
        WHOLE_BUFFERS[key] = torch.empty_like(tensor), torch.empty_like(tensor)
    passing, incoming = WHOLE_BUFFERS[key]
    passing.copy_(tensor)
    for _ in range(world_size - 1):
        exchange(passing, incoming, right, left)
        tensor += incoming
        passing, incoming = incoming, passing


ALGORITHMS = {
    "torch": lambda tensor: dist.all_reduce(tensor),
    "naive": naive_all_reduce,
    "ring": ring_all_reduce,
    "whole-buffer ring": whole_buffer_ring_all_reduce,
}


def parse_size(text):
    number = text.upper().rstrip("B").rstrip("KMG")
    unit = text.upper()[len(number):] or "B"
    return int(float(number) * UNITS[unit if unit.endswith("B") else unit + "B"])


def human(nbytes):
    for unit in ("GB", "MB", "KB"):
        if nbytes >= UNITS[unit]:
            return f"{nbytes / UNITS[unit]:g} {unit}"
    return f"{nbytes} B"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-size", default="1KB", help="smallest tensor, e.g. 1KB (default: 1KB)")
    parser.add_argument("--max-size", default="64MB", help="largest tensor, e.g. 64MB (default: 64MB)")
    parser.add_argument("--factor", type=int, default=4, help="each size is this times the last (default: 4)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per size and algorithm (default: 3)")
    parser.add_argument("--repeats", type=int, default=30,
                        help="timed calls per size and algorithm; the median is reported (default: 30)")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS),
                        help=f"comma-separated subset of {','.join(ALGORITHMS)} (default: all)")
    add_device_arguments(parser)
    add_output_arguments(parser, "the CSV and the PNG")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    device_defaults(args)
    return args


def timed(all_reduce, tensor, device):
    """Seconds the slowest rank took for one call, the same on every rank."""
    dist.barrier()  # start together: otherwise we time the wait for a late rank
    start = time.perf_counter()
    all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def check(all_reduce, numel, device):
    """Stop the benchmark if an algorithm gives a wrong sum: a fast wrong answer is no answer."""
    rank = dist.get_rank()
    values = torch.arange(numel, dtype=torch.float32, device=device) % 7 + rank
    expected = values.clone()
    dist.all_reduce(expected)
    all_reduce(values)
    assert torch.equal(values, expected), f"rank {rank}: wrong sum for {numel} numbers"


def main():
    args = parse_args()
    torch.set_num_threads(1)  # the ranks share the machine's cores
    device = init_distributed(args, timeout=datetime.timedelta(seconds=120))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    names = args.algorithms.split(",")
    if label(args) == "gloo-cuda" and names != ["torch"]:
        sys.exit("gloo sends CPU tensors only (with CUDA tensors send/recv abort the process): with --device cuda "
                 "--backend gloo time --algorithms torch alone, or use NCCL (a process a GPU) for all of them")
    sizes = []
    size = parse_size(args.min_size)
    while size <= parse_size(args.max_size):
        sizes.append(size)
        size *= args.factor

    rows = []
    for nbytes in sizes:
        tensor = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)  # zeros stay zeros: no overflow
        for name in names:
            check(ALGORITHMS[name], tensor.numel(), device)
            for _ in range(args.warmup):
                ALGORITHMS[name](tensor)
        times = {name: [] for name in names}
        for _ in range(args.repeats):
            for name in names:  # take turns, so that load from elsewhere hits all alike
                times[name].append(timed(ALGORITHMS[name], tensor, device))
        for name in names:
            seconds = statistics.median(times[name])
            algbw = nbytes / seconds / 1e9
            rows.append({"backend": label(args), "world_size": world_size, "algorithm": name, "bytes": nbytes,
                         "median_seconds": seconds, "algbw_GBps": algbw,
                         "busbw_GBps": algbw * 2 * (world_size - 1) / world_size,
                         # the spread, drawn as whiskers: under load one call can take several times the median
                         "min_seconds": min(times[name]), "max_seconds": max(times[name])})
        if rank == 0:
            print(f"  {human(nbytes)} done", file=sys.stderr, flush=True)

    if rank == 0:
        report(rows, names, sizes, world_size, args)
    dist.destroy_process_group()


def label(args):
    """gloo, nccl, or gloo-cuda: gloo carrying CUDA tensors (through the host)."""
    return args.backend + ("-cuda" if args.backend == "gloo" and args.device == "cuda" else "")


def report(rows, names, sizes, world_size, args):
    by = {(row["algorithm"], row["bytes"]): row for row in rows}
    print(f"\nall-reduce of float32 tensors, backend {label(args)}, {world_size} ranks, "
          f"median of {args.repeats} after {args.warmup} warm-up calls")
    print(f"{'size':>8} {'algorithm':>18} {'time (ms)':>10} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}")
    for nbytes in sizes:
        for name in names:
            row = by[name, nbytes]
            print(f"{human(nbytes):>8} {name:>18} {row['median_seconds'] * 1e3:>10.3f} "
                  f"{row['algbw_GBps']:>13.3f} {row['busbw_GBps']:>13.3f}")

    print("\nratios (targets in brackets)")
    if "ring" in names and "torch" in names:
        for nbytes, target in ((64 * 2**20, 0.7), (2**20, 0.5)):
            if nbytes in sizes:
                ratio = by["ring", nbytes]["algbw_GBps"] / by["torch", nbytes]["algbw_GBps"]
                print(f"  ring / dist.all_reduce algbw at {human(nbytes):>6}: {ratio:.2f}  (>= {target})")
    if "ring" in names and "whole-buffer ring" in names:
        for nbytes in sizes[-3:]:
            ratio = by["ring", nbytes]["median_seconds"] / by["whole-buffer ring", nbytes]["median_seconds"]
            print(f"  ring / whole-buffer ring time at {human(nbytes):>6}: {ratio:.2f}  "
                  f"(<= 0.6 at 4 ranks; 2(N-1)/N / (N-1) = {2 / world_size:.2f} in bytes)")

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"allreduce_{label(args)}_{world_size}ranks")
    with open(stem + ".csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(by, names, sizes, world_size, args, stem + ".png")
    print(f"\nwrote {stem}.csv and {stem}.png")


def plot(by, names, sizes, world_size, args, path):
    import matplotlib  # imported here: only rank 0 plots

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_bw) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, name in enumerate(names):
        rows = [by[name, s] for s in sizes]
        # each algorithm a little to the side, so that the whiskers (fastest, slowest call) do not hide each other
        x = [s * 2 ** (0.12 * (k - (len(names) - 1) / 2)) for s in sizes]
        ms = [float(r["median_seconds"]) * 1e3 for r in rows]
        ax_time.errorbar(x, ms, yerr=[[m - float(r["min_seconds"]) * 1e3 for m, r in zip(ms, rows)],
                                      [float(r["max_seconds"]) * 1e3 - m for m, r in zip(ms, rows)]],
                         marker="o", markersize=4, capsize=2, label=name)
        bw = [float(r["busbw_GBps"]) for r in rows]  # the fastest call has the highest bandwidth
        slowest = [b * float(r["median_seconds"]) / float(r["max_seconds"]) for b, r in zip(bw, rows)]
        fastest = [b * float(r["median_seconds"]) / float(r["min_seconds"]) for b, r in zip(bw, rows)]
        ax_bw.errorbar(x, bw, yerr=[[b - lo for b, lo in zip(bw, slowest)], [hi - b for b, hi in zip(bw, fastest)]],
                       marker="o", markersize=4, capsize=2, label=name)
    for ax in (ax_time, ax_bw):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [human(s).replace(" ", "") for s in sizes], rotation=45)
        ax.set_xlabel("tensor size")
        ax.grid(True, which="major", alpha=0.3)
    ax_time.set_yscale("log")
    ax_time.set_ylabel("time (ms, median; whiskers: fastest, slowest)")
    ax_bw.set_ylabel("bus bandwidth (GB/s) = algbw * 2(N-1)/N")
    ax_time.legend()
    fig.suptitle(f"all-reduce, {label(args)}, {world_size} ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
    exit_without_teardown()
