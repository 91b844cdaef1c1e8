"""What sharding saves: bytes per rank of parameters, gradients and AdamW's state, and the step time.

    python benchmarks/memory_bench.py            # CNN and ResNet-18 on 1, 2 and 4 ranks (minutes on CPUs)
    python benchmarks/memory_bench.py --quick    # the CNN on 1 and 2 ranks, under a minute
    python benchmarks/memory_bench.py --models resnet18 --ranks 2 --steps 10
    python benchmarks/memory_bench.py --models resnet18 --batch-size 256   # the course's batch (minutes)
    python benchmarks/memory_bench.py --device cuda --ranks 1,2   # on GPUs: peak memory too

For each model and number of ranks N it starts N gloo processes on this machine, and each
trains a few steps of AdamW with every strategy in turn:

    ddp          unsharded: DistributedDataParallel (gradient_as_bucket_view=True, so the
                 gradients are the buckets, counted once) and a full AdamW on every rank
    task6        Task 6's ShardedOptimizer (ZeRO-1) from solutions/template_zero.py, over DDP;
                 skipped while that file does not exist
    zero         PyTorch's ZeroRedundancyOptimizer over DDP
    task7        Task 7's FSDP from solutions/template_fsdp.py
    fully_shard  PyTorch's fully_shard (FSDP2), one unit per module that holds parameters

The bytes are counted after a step from the tensors each rank holds: its parameters (the
shards, for FSDP), their .grad, and every tensor in its optimizer's state (the local
optimizer's, for the ZeRO ones). Gathered parameters of FSDP are freed by then, and counted if
not. Activations, communication buffers and DDP's other buffers are not counted. The step
time (forward, backward, synchronisation, step) is the median over --steps steps of the
slowest rank, after a warm-up step, the strategies taking turns step by step so that load
from elsewhere hits them alike; on a CPU machine shared with other work it is still noisy, so
the fastest and the slowest step are kept too (step_min_seconds, step_max_seconds).
With --device cuda each rank also measures each strategy alone, from an empty GPU: the peak of
torch.cuda.max_memory_allocated over two steps, above what was allocated before the model was
built (cuda_peak_bytes): activations and communication buffers included, which the count above
leaves out. Ranks take GPU rank % GPUs, with NCCL where each has its own and gloo where they share.
Writes memory_<model>.csv for each model and memory_per_rank.png (bytes per rank against N above,
what sharding saves; the step time against N below, what it costs, with whiskers from the
fastest to the slowest step) under --out (runs/benchmarks/
by default, benchmarks/results/, the figures the pages show, with --update-results); with another
--batch-size than the default 16, memory_<model>_batch<B>.csv and memory_per_rank_batch<B>.png
(the bytes do not depend on the batch, the step time does: the course trains with a global
batch of 512, 256 images a rank at N = 2).
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository root
from models import benchmark_model  # noqa: E402
from bench_common import add_output_arguments, output_folder, run_ranks, synchronize, torchvision_or_exit  # noqa: E402  (beside this file)

STRATEGIES = ["ddp", "task6", "zero", "task7", "fully_shard"]
DEFAULT_BATCH = 16
HAS_TASK6 = os.path.exists(os.path.join(ROOT, "solutions", "template_zero.py"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the CNN on 1 and 2 ranks, 3 steps: under a minute")
    parser.add_argument("--models", default="cnn,resnet18", help="comma-separated: cnn, resnet18 (default: both)")
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated numbers of ranks (default: 1,2,4)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per strategy (default: 5)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                        help=f"images per rank and step (default: {DEFAULT_BATCH})")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the ranks train (default: cpu)")
    add_output_arguments(parser, "the CSV and PNG files")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    if args.quick:
        args.models, args.ranks, args.steps = "cnn", "1,2", 3
    return args


def local(tensor):
    """The part of a tensor this rank holds: a DTensor's (fully_shard) local shard, else itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def nbytes(tensors):
    tensors = list(tensors)  # alive until the end: an id is unique only among living objects
    unique = {id(tensor): local(tensor) for tensor in tensors}  # a tensor listed twice counts once
    return sum(tensor.numel() * tensor.element_size() for tensor in unique.values())


def optimizer_state_tensors(optimizer, seen=None):
    """Every tensor in the state of `optimizer` and of the optimizers it holds (ZeRO's local one)."""
    seen = set() if seen is None else seen
    if id(optimizer) in seen:
        return []
    seen.add(id(optimizer))
    tensors = [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    for value in vars(optimizer).values():
        for item in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(item, torch.optim.Optimizer):
                tensors += optimizer_state_tensors(item, seen)
    return tensors


def build(strategy, model_name, device):
    """(model, optimizer, what runs between backward and step, the tensors that are the parameters)."""
    from torch.nn.parallel import DistributedDataParallel
    model = benchmark_model(model_name).to(device)
    if strategy in ("ddp", "task6", "zero"):
        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        if strategy == "ddp":
            optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        elif strategy == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
        else:
            from solutions.template_zero import ShardedOptimizer
            optimizer = ShardedOptimizer(ddp.parameters(), torch.optim.AdamW, lr=1e-3)
        return ddp, optimizer, None, lambda: list(ddp.parameters())
    if strategy == "task7":
        from solutions.template_fsdp import FSDP
        fsdp = FSDP(model)
        full = lambda: [unit.full for unit in fsdp.units if unit.is_unsharded()]  # noqa: E731 (freed: none)
        return fsdp, torch.optim.AdamW(fsdp.parameters(), lr=1e-3), fsdp.finish_gradient_synchronization, \
            lambda: list(fsdp.parameters()) + full()
    from torch.distributed.fsdp import fully_shard
    for module in model.modules():
        if module is not model and any(True for _ in module.parameters(recurse=False)):
            fully_shard(module)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), None, lambda: list(model.parameters())


def timed_step(model, optimizer, finish, images, labels):
    """Seconds the slowest rank took for one training step, the same on every rank."""
    dist.barrier()  # start together: otherwise we time the wait for a late rank
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=False)  # keep the gradients, as between steps, so they are counted
    F.cross_entropy(model(images), labels).backward()
    if finish is not None:
        finish()
    optimizer.step()
    synchronize(images.device)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=images.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    return elapsed.item()


def cuda_peak(strategy, model_name, images, labels):
    """Bytes above the starting point at the peak of two steps of `strategy` alone on this GPU."""
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    model, optimizer, finish, _ = build(strategy, model_name, images.device)
    for _ in range(2):
        timed_step(model, optimizer, finish, images, labels)
    peak = torch.cuda.max_memory_allocated() - start
    del model, optimizer, finish
    return peak


def measure(strategies, model_name, steps, batch_size, device):
    """One row per strategy. The strategies take turns step by step, so that a burst of load
    from elsewhere slows them all alike; step 0 is a warm-up (allocations, DDP's first step)."""
    g = torch.Generator().manual_seed(dist.get_rank())
    images = torch.randn(batch_size, 3, 32, 32, generator=g).to(device)
    labels = torch.randint(0, 10, (batch_size,), generator=g).to(device)
    peaks = {}
    if device.type == "cuda":
        # the first steps on a GPU also allocate CUDA's workspaces (cuBLAS, cuDNN), once: a warm-up pays them,
        # else they land on the first strategy (73 MiB on the CNN's ddp row, seen on an H200)
        cuda_peak(strategies[0], model_name, images, labels)
        peaks = {s: cuda_peak(s, model_name, images, labels) for s in strategies}
    built = {strategy: build(strategy, model_name, device) for strategy in strategies}
    times = {strategy: [] for strategy in strategies}
    for step in range(steps + 1):
        for strategy, (model, optimizer, finish, _) in built.items():
            seconds = timed_step(model, optimizer, finish, images, labels)
            if step:
                times[strategy].append(seconds)
    rows = []
    for strategy, (_, optimizer, _, params) in built.items():
        row = {"param_bytes": nbytes(params()), "grad_bytes": nbytes(p.grad for p in params() if p.grad is not None),
               "optimizer_bytes": nbytes(optimizer_state_tensors(optimizer))}
        if peaks:
            row["cuda_peak_bytes"] = peaks[strategy]
        counts = torch.tensor(list(row.values()), dtype=torch.float64, device=device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)  # the rank that holds the most (padding differs)
        row = {"model": model_name, "ranks": dist.get_world_size(), "strategy": strategy,
               "batch_per_rank": batch_size, **dict(zip(row, counts.long().tolist()))}
        row["total_bytes"] = row["param_bytes"] + row["grad_bytes"] + row["optimizer_bytes"]
        row["step_seconds"] = statistics.median(times[strategy])
        # the spread over the steps, drawn as whiskers: the load from elsewhere moves a step by 10-30%
        row["step_min_seconds"], row["step_max_seconds"] = min(times[strategy]), max(times[strategy])
        rows.append(row)
    return rows


def rank_main(rank, world_size, model_names, steps, batch_size, device):
    """This rank's rows (bench_common.run_ranks returns rank 0's)."""
    device = torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device(device)
    rows = []
    strategies = [s for s in STRATEGIES if s != "task6" or HAS_TASK6]
    for model_name in model_names:
        for row in measure(strategies, model_name, steps, batch_size, device):
            rows.append(row)
            if rank == 0:
                print(f"  {model_name} {world_size} ranks {row['strategy']:>11}: {row['total_bytes'] / 2**20:8.2f} "
                      f"MiB per rank, {row['step_seconds'] * 1e3:7.1f} ms a step"
                      + (f", CUDA peak {row['cuda_peak_bytes'] / 2**20:8.2f} MiB" if "cuda_peak_bytes" in row else ""),
                      flush=True)
    return rows


def add_ratios(rows):
    """total / (unsharded total / N): 1.0 is a perfect 1/N; and the step time against DDP's."""
    base = {(r["model"], r["ranks"]): r for r in rows if r["strategy"] == "ddp"}
    single = {r["model"]: r for r in rows if r["strategy"] == "ddp" and r["ranks"] == 1}
    for row in rows:
        ddp = base[row["model"], row["ranks"]]
        unsharded = single.get(row["model"], ddp)["total_bytes"] if row["model"] in single else ddp["total_bytes"]
        row["vs_one_nth"] = row["total_bytes"] / (unsharded / row["ranks"])
        row["optimizer_vs_one_nth"] = row["optimizer_bytes"] / (ddp["optimizer_bytes"] / row["ranks"])
        row["step_vs_ddp"] = row["step_seconds"] / ddp["step_seconds"]


def report(rows, args):
    print(f"\nbytes per rank after an AdamW step (MiB), and the step time with {args.batch_size} images a rank; "
          "vs 1/N: total / (unsharded / N)")
    print(f"{'model':>9} {'N':>2} {'strategy':>11} {'params':>8} {'grads':>8} {'optim':>8} {'total':>8} "
          f"{'vs 1/N':>7} {'step ms':>8} {'vs ddp':>7}" + (f" {'CUDA peak':>9}" if args.device == "cuda" else ""))
    for r in rows:
        print(f"{r['model']:>9} {r['ranks']:>2} {r['strategy']:>11} {r['param_bytes'] / 2**20:8.2f} "
              f"{r['grad_bytes'] / 2**20:8.2f} {r['optimizer_bytes'] / 2**20:8.2f} {r['total_bytes'] / 2**20:8.2f} "
              f"{r['vs_one_nth']:7.2f} {r['step_seconds'] * 1e3:8.1f} {r['step_vs_ddp']:7.2f}"
              + (f" {r['cuda_peak_bytes'] / 2**20:9.2f}" if "cuda_peak_bytes" in r else ""))
    print("\ntargets: task6 optimizer state within 10% of 1/N (optimizer_vs_one_nth <= 1.1) at N = 2 and 4; "
          "task7 total within 10% of 1/N (vs 1/N <= 1.1); task7 step at most 1.5x ddp at N = 2 on ResNet-18")
    os.makedirs(args.out, exist_ok=True)
    suffix = "" if args.batch_size == DEFAULT_BATCH else f"_batch{args.batch_size}"
    for model in dict.fromkeys(r["model"] for r in rows):
        path = os.path.join(args.out, f"memory_{model}{suffix}.csv")
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(r for r in rows if r["model"] == model)
        print(f"wrote {path}")
    plot(rows, os.path.join(args.out, f"memory_per_rank{suffix}.png"))


def plot(rows, path):
    """Top row: bytes per rank against N (what sharding saves). Bottom row: the step time against N
    (what it costs): the median, whiskers from the fastest to the slowest step."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(2, len(models), figsize=(5.5 * len(models), 8.0), squeeze=False)
    for column, model in enumerate(models):
        ax, ax_time = axes[0][column], axes[1][column]
        mine = [r for r in rows if r["model"] == model]
        ranks = sorted({r["ranks"] for r in mine})
        present = [s for s in STRATEGIES if any(r["strategy"] == s for r in mine)]
        for k, strategy in enumerate(present):
            points = sorted((r["ranks"], r) for r in mine if r["strategy"] == strategy)
            n = [p[0] for p in points]
            ours = strategy.startswith("task")  # ours dashed over PyTorch's solid: where they coincide, both show
            style = dict(marker="x" if ours else "o", markersize=9 if ours else 6, linestyle="--" if ours else "-",
                         alpha=1 if ours else 0.5, label=strategy)
            ax.plot(n, [r["total_bytes"] / 2**20 for _, r in points], linewidth=2 if ours else 4, **style)
            # the step time: each strategy a little to the side, so that the whiskers do not hide each other
            median = [float(r["step_seconds"]) * 1e3 for _, r in points]
            low = [m - float(r["step_min_seconds"]) * 1e3 for m, (_, r) in zip(median, points)]
            high = [float(r["step_max_seconds"]) * 1e3 - m for m, (_, r) in zip(median, points)]
            shift = 1 + 0.04 * (k - (len(present) - 1) / 2)
            ax_time.errorbar([x * shift for x in n], median, yerr=[low, high], capsize=3, linewidth=2, **style)
        unsharded = next(r["total_bytes"] for r in mine if r["strategy"] == "ddp" and r["ranks"] == ranks[0]) / 2**20
        ax.plot(ranks, [unsharded * ranks[0] / n for n in ranks], "k:", label="1/N of unsharded")
        batch = mine[0]["batch_per_rank"]
        ax.set(title=f"{model}, AdamW: parameters + gradients + optimizer state",
               xlabel="ranks (N)", ylabel="MiB per rank", xticks=ranks)
        ax_time.set(title=f"{model}, the price: time of a step, {batch} images a rank",
                    xlabel="ranks (N)", ylabel="ms a step (median; whiskers: fastest, slowest)")
        for a in (ax, ax_time):
            a.set_xscale("log", base=2)
            a.set_xticks(ranks, [str(n) for n in ranks])
            a.minorticks_off()
            a.title.set_fontsize(9)
            a.set_ylim(bottom=0)
            a.grid(alpha=0.3)
            a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main():
    args = parse_args()
    model_names = args.models.split(",")
    torchvision_or_exit(model_names)
    rows = []
    for world_size in (int(n) for n in args.ranks.split(",")):
        print(f"{world_size} ranks:", flush=True)
        rows += run_ranks(world_size, rank_main, model_names, args.steps, args.batch_size, args.device, timeout=600,
                          device=args.device)
    if not HAS_TASK6:
        print("(no solutions/template_zero.py: the task6 rows are left out)")
    add_ratios(rows)
    report(rows, args)


if __name__ == "__main__":
    main()
