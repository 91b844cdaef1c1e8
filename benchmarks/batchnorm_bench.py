"""What plain BatchNorm does to data parallelism as each rank's slice shrinks, and what SyncBatchNorm costs.

    python benchmarks/batchnorm_bench.py --quick            # per-rank batches 4 and 32, 2 repeats: a minute or two
    python benchmarks/batchnorm_bench.py                    # per-rank batches 2, 4, 8, 32, 3 repeats
    python benchmarks/batchnorm_bench.py --update-results   # the same, into benchmarks/results/ (the page's figure)

The BatchNorm CNN (models.CNN(batchnorm=True)) trains for --epochs over --train images of the
synthetic data set, with SGD and momentum (the learning rate scaled with the global batch), three
ways, from the same initial weights and on the same global batches:

    local    2 gloo ranks, plain nn.BatchNorm2d: each rank normalises with its slice's statistics
    sync     2 gloo ranks, Task 11's SyncBatchNorm (solutions/): the global batch's statistics
    single   one process on the whole global batch (2 x the per-rank batch), plain nn.BatchNorm2d

The gradients are averaged with Task 2.2's average_gradients (solutions/). Rank 0's model is
then evaluated (eval mode: its running statistics) on --test images. Each (per-rank batch,
repeat) trains the three in a rotated order, with the repeat's own seed for the weights and the
order of the images, so a burst of load from elsewhere does not always hit the same one. A
step's time is the training loop's time over its steps, ending with a barrier (the slower
rank's). Writes batchnorm_bench.csv (one row a run) and batchnorm_bench.png (medians; whiskers:
the lowest and the highest repeat) under --out: runs/benchmarks/ by default, benchmarks/results/
with --update-results.
"""
import argparse
import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from bench_common import add_output_arguments, output_folder, run_ranks  # noqa: E402  (beside this file)

VARIANTS = ["local", "sync", "single"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", nargs="+", type=int, default=[2, 4, 8, 32],
                        help="images per rank per step (default: 2 4 8 32)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, with seeds 0, 1, ... (default: 3)")
    parser.add_argument("--train", type=int, default=1024, help="training images (default: 1024)")
    parser.add_argument("--test", type=int, default=1000, help="test images (default: 1000)")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the training images (default: 1)")
    parser.add_argument("--lr-per-image", type=float, default=0.0005,
                        help="SGD's learning rate is this times the global batch (linear scaling; 0.002 at 4 images, "
                        "0.032 at 64), momentum 0.9 (default: 0.0005)")
    parser.add_argument("--quick", action="store_true", help="--batches 4 32 --repeats 2: a minute or two")
    parser.add_argument("--replot", action="store_true",
                        help="train nothing: draw batchnorm_bench.png again from the batchnorm_bench.csv in the folder")
    add_output_arguments(parser, "batchnorm_bench.csv and batchnorm_bench.png")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    if args.quick:
        args.batches, args.repeats = [4, 32], 2
    return args


def train_once(rank, world_size, variant, batch, seed, args, train_set, test_set):
    """One run; on rank 0, its row. `single` trains on rank 0 alone, the other ranks wait."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from models import CNN
    from solutions.template_batchnorm import convert_sync_batchnorm
    from solutions.template_trainer import average_gradients

    torch.manual_seed(seed)
    model = CNN(batchnorm=True)
    if variant == "sync":
        model = convert_sync_batchnorm(model)
    global_batch = batch * world_size
    # one learning rate for every batch size diverged at the small ones (0.02: chance level at 4 images)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr_per_image * global_batch, momentum=0.9)
    images, labels = train_set.tensors
    active = variant != "single" or rank == 0
    steps, losses = 0, []
    dist.barrier()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        for first in range(0, len(order) - global_batch + 1, global_batch):  # whole global batches only
            if not active:
                continue
            indices = order[first:first + global_batch]
            if variant != "single":
                indices = indices[rank * batch:(rank + 1) * batch]  # this rank's slice
            loss = F.cross_entropy(model(images[indices]), labels[indices])
            optimizer.zero_grad()
            loss.backward()
            if variant != "single":
                average_gradients(model)
            optimizer.step()
            steps += 1
            losses.append(loss.item())
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank != 0:
        return None
    model.eval()
    test_images, test_labels = test_set.tensors
    with torch.no_grad():
        logits = torch.cat([model(chunk) for chunk in test_images.split(500)])
    tail = losses[-max(1, len(losses) // 10):]  # the last tenth of the steps
    return {"per_rank_batch": batch, "variant": variant, "seed": seed, "steps": steps,
            "test_loss": round(F.cross_entropy(logits, test_labels).item(), 5),
            "test_accuracy": round((logits.argmax(1) == test_labels).float().mean().item(), 5),
            "train_loss": round(sum(tail) / len(tail), 5), "step_ms": round(1000 * elapsed / steps, 3)}


def bench(rank, world_size, args):
    from data import synthetic_cifar

    train_set, test_set = synthetic_cifar(num_train=args.train, num_test=args.test, seed=0)
    rows = []
    for batch in args.batches:
        for seed in range(args.repeats):
            turn = seed % len(VARIANTS)
            for variant in VARIANTS[turn:] + VARIANTS[:turn]:  # rotated: none always first
                row = train_once(rank, world_size, variant, batch, seed, args, train_set, test_set)
                if rank == 0:
                    rows.append(row)
                    print(f"  batch {batch:>3} a rank  {variant:<6} seed {seed}: test accuracy "
                          f"{row['test_accuracy']:.2%}, test loss {row['test_loss']:.3f}, {row['step_ms']:.1f} ms a step",
                          flush=True)
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["per_rank_batch"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    styles = {"local": ("tab:red", "o", "2 ranks, local BatchNorm"), "sync": ("tab:blue", "s", "2 ranks, SyncBatchNorm"),
              "single": ("black", "x", "1 process, the global batch")}
    single = {(r["per_rank_batch"], r["seed"]): r["test_loss"] for r in rows if r["variant"] == "single"}
    for ax, key, label in ((axes[0], "test_accuracy", "test accuracy"),
                           (axes[1], "loss_vs_single", "test loss minus one process's (same seed)")):
        for variant, (color, marker, name) in styles.items():
            if key == "loss_vs_single" and variant == "single":
                ax.axhline(0, color="black", linestyle="--", label=name)
                continue
            values = [[r["test_loss"] - single[b, r["seed"]] if key == "loss_vs_single" else r[key]
                       for r in rows if r["per_rank_batch"] == b and r["variant"] == variant] for b in batches]
            medians = [statistics.median(v) for v in values]
            errors = [[m - min(v) for m, v in zip(medians, values)], [max(v) - m for m, v in zip(medians, values)]]
            ax.errorbar(batches, medians, yerr=errors, color=color, marker=marker, capsize=4, label=name,
                        linestyle="--" if variant == "single" else "-")
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("images per rank per step (global batch: 2x)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[1].legend()
    width = 0.38
    for offset, variant in ((-width / 2, "local"), (width / 2, "sync")):
        values = [[r["step_ms"] for r in rows if r["per_rank_batch"] == b and r["variant"] == variant] for b in batches]
        medians = [statistics.median(v) for v in values]
        errors = [[m - min(v) for m, v in zip(medians, values)], [max(v) - m for m, v in zip(medians, values)]]
        axes[2].bar([i + offset for i in range(len(batches))], medians, width, yerr=errors, capsize=4,
                    color=styles[variant][0], label=styles[variant][2])
    axes[2].set_xticks(range(len(batches)), [str(b) for b in batches])
    axes[2].set_xlabel("images per rank per step")
    axes[2].set_ylabel("ms per training step")
    axes[2].legend()
    axes[2].grid(alpha=0.3, axis="y")
    fig.suptitle("The BatchNorm CNN on synthetic data: local BatchNorm vs SyncBatchNorm vs one process "
                 "(medians; whiskers: lowest and highest repeat)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.replot:
        with open(os.path.join(args.out, "batchnorm_bench.csv")) as f:
            rows = [{k: v if k == "variant" else float(v) for k, v in row.items()} for row in csv.DictReader(f)]
        for row in rows:
            row["per_rank_batch"], row["seed"] = int(row["per_rank_batch"]), int(row["seed"])
        return plot(rows, os.path.join(args.out, "batchnorm_bench.png"))
    load = os.getloadavg()[0]
    print(f"load average before: {load:.2f}", flush=True)
    rows = run_ranks(2, bench, args, timeout=3600)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    with open(os.path.join(args.out, "batchnorm_bench.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, os.path.join(args.out, "batchnorm_bench.png"))
    print(f"wrote {os.path.join(args.out, 'batchnorm_bench.csv')} and batchnorm_bench.png")


if __name__ == "__main__":
    main()
