"""The pipeline's bubble, measured: GPipe and 1F1B against the theory (p - 1) / (m + p - 1).

    python benchmarks/pipeline_bench.py            # p = 2, 4 stages; m = 1, 2, 4, 8, 16; then the CNN (8 minutes)
    python benchmarks/pipeline_bench.py --quick    # p = 2; m = 1, 4; short stages; no CNN (seconds)

Part 1, the bubble. Each stage is one layer whose forward sleeps --forward-ms and whose
backward sleeps twice that (a known compute time that does not compete for the CPU, so 4
stages on 2 cores still behave like 4 devices). For every schedule, p and m, p gloo processes
run Task 10's gpipe_step or one_f_one_b_step (solutions/template_pipeline.py): a warm-up step,
then --steps timed steps. A step's time T is the slowest stage's, from a barrier to the step's
return; each stage's busy time is the time its layer actually slept; the idle share is
1 - busy / T, averaged over the stages, and the median over the steps is reported against the
theory (p - 1) / (m + p - 1), with the least and the most over the steps (the figure's whiskers).
extra_ms_per_slot is what the theory leaves out, per slot of one
forward and one backward: (T - (m + p - 1) x (forward + backward)) / (m + p - 1), the messages'
latency and the time a waiting process takes to run again. Also the peak number of micro-batches
whose activations a stage held at once, counted from the trace (GPipe: m; 1F1B: at most p - stage).

Part 2, the real CNN: the step time of the course's CNN (forward, backward; no optimizer) with
--cnn-batch images a step, split into 2 pipeline stages (1F1B and GPipe, m = 4), against plain
data parallelism on the same 2 ranks (each rank half the batch, gradients all-reduced), the
median of --steps steps after a warm-up, and the fastest and the slowest of them.

Writes pipeline_bubble.csv, pipeline_bubble.png (measured vs theory), pipeline_timeline.png
(who computes what when in one 1F1B step, p = 4, m = 8) and pipeline_cnn.csv under --out.
"""
import argparse
import csv
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository root
from solutions.template_pipeline import Stage, flat_cnn, gpipe_step, one_f_one_b_step  # noqa: E402
from bench_common import add_output_arguments, output_folder, run_ranks  # noqa: E402  (beside this file)

SCHEDULES = {"gpipe": gpipe_step, "1f1b": one_f_one_b_step}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="p = 2, m = 1 and 4, 5 ms stages, no CNN: seconds")
    parser.add_argument("--stages", default="2,4", help="comma-separated numbers of stages p (default: 2,4)")
    parser.add_argument("--microbatches", default="1,2,4,8,16", help="comma-separated m (default: 1,2,4,8,16)")
    parser.add_argument("--forward-ms", type=float, default=150.0,
                        help="a stage's forward of one micro-batch sleeps this long, its backward twice (default: 150)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per case, after a warm-up (default: 3)")
    parser.add_argument("--cnn-batch", type=int, default=64, help="images a step for the CNN comparison (default: 64)")
    parser.add_argument("--no-cnn", action="store_true", help="skip part 2, the CNN against data parallelism")
    add_output_arguments(parser, "the CSV and PNG files")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    if args.quick:
        args.stages, args.microbatches, args.forward_ms, args.steps, args.no_cnn = "2", "1,4", 5.0, 2, True
    return args


# ----------------------------------------------------------------------- a stage of known compute time
EVENTS = []  # (kind, start, end) of every sleep this process's layer ran, in order


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        start = time.perf_counter()
        time.sleep(seconds)
        EVENTS.append(("F", start, time.perf_counter()))
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        start = time.perf_counter()
        time.sleep(2 * ctx.seconds)
        EVENTS.append(("B", start, time.perf_counter()))
        return grad, None


class SleepLayer(nn.Module):
    """A layer whose forward takes `seconds` and whose backward takes twice that."""

    def __init__(self, seconds, width=16):
        super().__init__()
        self.seconds = seconds
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return _Sleep.apply(x * self.weight, self.seconds)


def bubble_rank(rank, world_size, microbatch_counts, seconds, steps):
    stage = Stage(nn.Sequential(*(SleepLayer(seconds) for _ in range(world_size))), rank, world_size)
    rows, timeline = [], None
    for schedule, step in SCHEDULES.items():
        for m in microbatch_counts:
            inputs, targets = torch.randn(2 * m, 16), torch.randn(2 * m, 16)
            shares, peaks, times = [], [], []
            for repeat in range(steps + 1):
                EVENTS.clear()
                dist.barrier()
                start = time.perf_counter()
                _, trace = step(stage, inputs, targets, F.mse_loss, m)
                elapsed = torch.tensor(time.perf_counter() - start, dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends when the slowest stage ends
                busy = sum(end - begin for _, begin, end in EVENTS)
                share = torch.tensor(1 - busy / elapsed.item(), dtype=torch.float64)
                dist.all_reduce(share)
                stored = peak = 0
                for kind, _ in trace:
                    stored += 1 if kind == "F" else -1
                    peak = max(peak, stored)
                if repeat:  # the first step is the warm-up (and learns the shapes)
                    shares.append(share.item() / world_size)
                    times.append(elapsed.item())
                    peaks.append(peak)
                if schedule == "1f1b" and m == 8 and world_size == 4 and repeat == steps:
                    timeline = [(kind, i, begin - start, end - start)
                                for (kind, i), (_, begin, end) in zip(trace, EVENTS)]
            all_peaks = [None] * world_size
            dist.all_gather_object(all_peaks, max(peaks))
            rows.append(dict(schedule=schedule, stages=world_size, microbatches=m,
                             measured_bubble=statistics.median(shares),
                             # the spread over the steps, drawn as whiskers
                             measured_bubble_min=min(shares), measured_bubble_max=max(shares),
                             theory_bubble=(world_size - 1) / (m + world_size - 1),
                             step_seconds=statistics.median(times),
                             # what the theory leaves out (communication, waking up), per slot of F + B
                             extra_ms_per_slot=(statistics.median(times) - (m + world_size - 1) * 3 * seconds)
                             / (m + world_size - 1) * 1e3,
                             peak_stored=" ".join(map(str, all_peaks))))
    timelines = [None] * world_size
    dist.all_gather_object(timelines, timeline)
    return rows, timelines


# ----------------------------------------------------------------------- the CNN, pipeline against data parallel
def cnn_rank(rank, world_size, batch, steps):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
    model = flat_cnn()
    stage = Stage(model, rank, world_size)
    replica = flat_cnn()

    def data_parallel():
        half = slice(rank * batch // world_size, (rank + 1) * batch // world_size)
        F.cross_entropy(replica(inputs[half]), targets[half]).backward()
        for p in replica.parameters():
            dist.all_reduce(p.grad)

    variants = {"data parallel": data_parallel,
                "pipeline 1f1b m=4": lambda: one_f_one_b_step(stage, inputs, targets, F.cross_entropy, 4),
                "pipeline gpipe m=4": lambda: gpipe_step(stage, inputs, targets, F.cross_entropy, 4)}
    times = {name: [] for name in variants}
    for repeat in range(steps + 1):
        for name, run in variants.items():  # taking turns, so that load from elsewhere hits them alike
            dist.barrier()
            start = time.perf_counter()
            run()
            elapsed = torch.tensor(time.perf_counter() - start, dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if repeat:
                times[name].append(elapsed.item())
    return [dict(variant=name, ranks=world_size, batch=batch, step_seconds=statistics.median(t),
                 min_seconds=min(t), max_seconds=max(t))  # the spread: the loaded machine moves it by 10-30%
            for name, t in times.items()]


# ----------------------------------------------------------------------- results
def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


def plot_bubble(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for p in sorted({r["stages"] for r in rows}):
        ms = sorted({r["microbatches"] for r in rows if r["stages"] == p})
        theory = [(p - 1) / (m + p - 1) for m in ms]
        line, = ax.plot(ms, theory, "-", label=f"theory (p-1)/(m+p-1), p={p}")
        for schedule, marker, side in (("gpipe", "o", 0.94), ("1f1b", "x", 1.06)):
            got = [r for m in ms for r in rows if (r["stages"], r["microbatches"], r["schedule"]) == (p, m, schedule)]
            median = [float(r["measured_bubble"]) for r in got]
            # whiskers: the step with the least and the most idle time; a little to the side, one schedule each way
            ax.errorbar([m * side for m in ms], median, fmt=marker, color=line.get_color(), capsize=2,
                        yerr=[[b - float(r["measured_bubble_min"]) for b, r in zip(median, got)],
                              [float(r["measured_bubble_max"]) - b for b, r in zip(median, got)]],
                        label=f"{schedule}, p={p}, measured")
    ax.set_xscale("log", base=2)
    counts = sorted({r["microbatches"] for r in rows})
    ax.set_xticks(counts, [str(m) for m in counts])
    ax.minorticks_off()
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("idle share of a step (median; whiskers: min, max)")
    ax.set_title("The pipeline bubble: measured against theory")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def plot_timeline(timelines, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 2.6))
    colors = {"F": "tab:blue", "B": "tab:orange"}
    for stage, events in enumerate(timelines):
        for kind, i, begin, end in events:
            ax.barh(stage, (end - begin) * 1e3, left=begin * 1e3, color=colors[kind], edgecolor="white")
            ax.text((begin + end) / 2 * 1e3, stage, f"{kind}{i}", ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(timelines)), [f"stage {s}" for s in range(len(timelines))])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step began")
    ax.set_title("One 1F1B step, p = 4, m = 8: forwards (blue), backwards (orange), idle (white)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows, timelines = [], None
    counts = [int(m) for m in args.microbatches.split(",")]
    for p in [int(p) for p in args.stages.split(",")]:
        found, lines = run_ranks(p, bubble_rank, counts, args.forward_ms / 1e3, args.steps)
        rows += found
        timelines = lines if lines[0] is not None else timelines
    print(f"\n{'schedule':>8} {'p':>2} {'m':>3} {'measured':>9} {'theory':>7} {'rel. diff':>9} {'extra ms':>8}  "
          "peak stored per stage")
    for r in sorted(rows, key=lambda r: (r["stages"], r["schedule"], r["microbatches"])):
        r["relative_difference"] = r["measured_bubble"] / r["theory_bubble"] - 1
        print(f"{r['schedule']:>8} {r['stages']:>2} {r['microbatches']:>3} {r['measured_bubble']:9.3f} "
              f"{r['theory_bubble']:7.3f} {r['relative_difference']:+9.1%} {r['extra_ms_per_slot']:8.1f}  "
              f"{r['peak_stored']}")
    suffix = "_quick" if args.quick else ""
    write_csv(os.path.join(args.out, f"pipeline_bubble{suffix}.csv"), rows)
    plot_bubble(rows, os.path.join(args.out, f"pipeline_bubble{suffix}.png"))
    if timelines:
        plot_timeline(timelines, os.path.join(args.out, "pipeline_timeline.png"))
    if not args.no_cnn:
        cnn = run_ranks(2, cnn_rank, args.cnn_batch, args.steps)
        base = next(r["step_seconds"] for r in cnn if r["variant"] == "data parallel")
        for r in cnn:
            r["vs_data_parallel"] = r["step_seconds"] / base
            print(f"{r['variant']:>20}: {r['step_seconds'] * 1e3:7.1f} ms a step ({r['vs_data_parallel']:.2f}x)")
        write_csv(os.path.join(args.out, "pipeline_cnn.csv"), cnn)


if __name__ == "__main__":
    main()
