"""Steps per second of PyTorch's DDP, Task 5's DDP at several bucket sizes, and Task 2.2's averaging.

    torchrun --standalone --nproc_per_node=2 benchmarks/ddp_bench.py --quick   # the course CNN, under a minute
    torchrun --standalone --nproc_per_node=2 benchmarks/ddp_bench.py           # CNN and ResNet-18 (long on a CPU)
    torchrun --standalone --nproc_per_node=2 benchmarks/ddp_bench.py --models resnet18 --repeats 7
    torchrun --standalone --nproc_per_node=gpu benchmarks/ddp_bench.py --device cuda   # NCCL, a GPU a rank

Every variant trains its own copy of the same model (same seed) with SGD on the same
synthetic batch, on every rank:

    torch DDP        torch.nn.parallel.DistributedDataParallel, default settings (25 MB buckets)
    task5 <B> MB     solutions/template_ddp.py's DDP with bucket_size_mb=B (none: one per parameter)
    after-backward   Task 2.2's average_gradients: one blocking all_reduce per parameter, after backward

The variants take turns inside every repetition (in a rotated order, so none always goes
first), so a burst of load from elsewhere hits them all alike; each timing covers --steps
steps, ends with a barrier (so it is the slowest rank's), and the figure is the median over
--repeats. "exposed" is the share of step time spent after backward waiting for gradients
(finish_gradient_synchronization or average_gradients): the communication that overlap did
not hide. PyTorch's DDP waits inside backward, so it has no such figure. Rank 0 prints the
table and writes ddp_bench.csv and ddp_bench.png (bars: the medians; whiskers: the slowest and
the fastest repetition) under --out: runs/benchmarks/ by default,
benchmarks/results/ (the figures the pages show) with --update-results.
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
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from models import benchmark_model  # noqa: E402
from bench_common import (add_device_arguments, add_output_arguments, device_defaults, device_name,  # noqa: E402
                          exit_without_teardown, init_distributed, output_folder, synchronize,
                          torchvision_or_exit)  # (beside this file)
from solutions.template_ddp import DDP  # noqa: E402
from solutions.template_trainer import average_gradients  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=["cnn", "resnet18"], default=["cnn", "resnet18"],
                        help="which models (default: cnn resnet18)")
    parser.add_argument("--buckets", nargs="+", default=["none", "1", "5", "25", "100"],
                        help="Task 5 bucket sizes in MB, 'none' for one bucket per parameter (default: none 1 5 25 100)")
    parser.add_argument("--batch", type=int, default=32, help="images per rank per step (default: 32)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant per repetition (default: 2)")
    parser.add_argument("--repeats", type=int, default=15, help="repetitions; the median is reported (default: 15)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first (default: 2)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per rank (default: the CPU cores shared out among the ranks, at least 1)")
    parser.add_argument("--quick", action="store_true",
                        help="the course CNN only, --repeats 10 --steps 3 --warmup 1: under a minute")
    add_device_arguments(parser)
    add_output_arguments(parser, "rank 0's ddp_bench.csv and ddp_bench.png")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    device_defaults(args)
    if args.quick:
        args.models, args.repeats, args.steps, args.warmup = ["cnn"], 10, 3, 1
    return args


class Variant:
    def __init__(self, label, model, device, bucket_mb=""):
        self.label, self.model, self.device, self.bucket_mb = label, model, device, bucket_mb
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        self.times, self.exposed = [], []

    def step(self, images, labels):
        """One training step; returns the seconds spent after backward waiting for gradients."""
        self.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(images), labels).backward()
        synchronize(self.device)  # on a GPU: backward's kernels done, so what follows is the wait alone
        t0 = time.perf_counter()
        if isinstance(self.model, DDP):
            self.model.finish_gradient_synchronization()
        elif not isinstance(self.model, DistributedDataParallel):
            average_gradients(self.model)
        synchronize(self.device)  # a CUDA wait() only orders the streams: wait for the all-reduces themselves
        waited = time.perf_counter() - t0
        self.optimizer.step()
        return waited


def variants(model_name, buckets, device):
    def model():
        return benchmark_model(model_name).to(device)

    out = [Variant("torch DDP", DistributedDataParallel(model()), device, 25)]
    for size in buckets:
        mb = None if size == "none" else float(size)
        ddp = DDP(model(), bucket_size_mb=mb)
        out.append(Variant(f"task5 {size} MB" if mb else "task5 per-param", ddp, device, size))
        out[-1].num_buckets = len(ddp.buckets)
    out.append(Variant("after-backward", model(), device, "per-param"))
    return out


def bench(model_name, args, rank, device):
    g = torch.Generator().manual_seed(rank)
    images, labels = torch.randn(args.batch, 3, 32, 32, generator=g), torch.randint(0, 10, (args.batch,), generator=g)
    images, labels = images.to(device), labels.to(device)
    runs = variants(model_name, args.buckets, device)
    for v in runs:
        for _ in range(args.warmup):
            v.step(images, labels)
    for repeat in range(args.repeats):
        order = runs[repeat % len(runs):] + runs[:repeat % len(runs)]  # rotate: no variant always goes first
        for v in order:
            dist.barrier()
            start, waited = time.perf_counter(), 0.0
            for _ in range(args.steps):
                waited += v.step(images, labels)
            synchronize(device)
            dist.barrier()  # the slowest rank's time
            v.times.append(time.perf_counter() - start)
            v.exposed.append(waited)
    params = sum(p.numel() for p in runs[-1].model.parameters())
    rows = []
    reference = args.steps / statistics.median(runs[0].times)
    for v in runs:
        steps_per_s = args.steps / statistics.median(v.times)
        share = statistics.median(w / t for w, t in zip(v.exposed, v.times))
        rows.append({"model": model_name, "device": f"{device_name(device)}, {args.backend}", "parameters": params, "variant": v.label, "bucket_mb": v.bucket_mb,
                     "buckets": getattr(v, "num_buckets", ""), "steps_per_s": round(steps_per_s, 3),
                     "vs_torch_ddp": round(steps_per_s / reference, 3),
                     "exposed_share": "" if v.label == "torch DDP" else round(share, 3),
                     "min_s": round(min(v.times) / args.steps, 4), "max_s": round(max(v.times) / args.steps, 4)})
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model]
        colors = ["tab:gray" if r["variant"] == "torch DDP" else "tab:red" if r["variant"] == "after-backward"
                  else "tab:blue" for r in mine]
        # the spread: the slowest and the fastest repetition (min_s, max_s: seconds a step), so that a
        # difference smaller than the load's noise shows as one
        medians = [float(r["steps_per_s"]) for r in mine]
        # (at least 0: the CSV's rounding can put one repetition's figure a hair beyond the median)
        low = [max(m - 1 / float(r["max_s"]), 0) for m, r in zip(medians, mine)]
        high = [max(1 / float(r["min_s"]) - m, 0) for m, r in zip(medians, mine)]
        ax.bar(range(len(mine)), medians, color=colors, yerr=[low, high], capsize=3, ecolor="black")
        for i, r in enumerate(mine):
            ax.text(i, medians[i] + high[i], f"{float(r['vs_torch_ddp']):.2f}x", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels([r["variant"] for r in mine], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("steps/s (median; whiskers: slowest, fastest)")
        ax.set_title(f"{model} ({mine[0]['parameters'] / 1e6:.2f}M parameters): ratio to torch DDP on top")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    args = parse_args()
    torchvision_or_exit(args.models)
    device = init_distributed(args)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world_size))
    try:
        rows = []
        for model_name in args.models:
            rows += bench(model_name, args, rank, device)
            if rank == 0:
                print(f"\n{model_name}, {world_size} {args.backend} ranks on {device_name(device)}, {args.batch} images/rank/step, median of "
                      f"{args.repeats} x {args.steps} steps, load average {os.getloadavg()[0]:.1f}")
                print(f"  {'variant':<16} {'buckets':>7} {'steps/s':>8} {'vs torch DDP':>12} {'exposed':>8}")
                for r in rows:
                    if r["model"] == model_name:
                        exposed = f"{r['exposed_share']:.0%}" if r["exposed_share"] != "" else "-"
                        print(f"  {r['variant']:<16} {r['buckets']!s:>7} {r['steps_per_s']:>8.2f} "
                              f"{r['vs_torch_ddp']:>11.2f}x {exposed:>8}", flush=True)
        if rank == 0:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "ddp_bench.csv"), "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
            plot(rows, os.path.join(args.out, "ddp_bench.png"))
            print(f"\nwrote {args.out}/ddp_bench.csv and ddp_bench.png")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
