"""Task 12: what gradient compression saves on the wire, what it costs in loss and in time.

    python benchmarks/compression_bench.py --quick          # the CNN, 2 ranks, 2 repeats: a few minutes
    python benchmarks/compression_bench.py                  # + ResNet-18's bytes per step, 3 repeats

Two gloo ranks on this machine (bench_common.run_ranks), Task 5's DDP (solutions/) with Task 12's
hooks (solutions/), one variant after the other, in a rotated order in every repeat:

    none                 no hook: Task 5's plain averaging all-reduce, float32
    bf16                 bf16_compress_hook: every bucket in bfloat16
    powersgd r=R [no EF] powersgd_hook, matrix_approximation_rank R (1, 2, 4), start_powerSGD_iter 2,
                         with error feedback, or without it ("no EF")

Each variant trains the course CNN from the same initial weights on the same synthetic images
(data.synthetic_cifar, a different order in each repeat) for --steps steps of SGD (lr 0.05,
momentum 0.9). Measured per variant: the bytes that rank 0's all-reduces carried in one compressed
step (a wrapper around dist.all_reduce counts numel * element_size), the loss at the end (mean of
the last 10 steps), and the median step time on this machine (loopback: communication is nearly
free here, so this is mostly what compression costs, not what it saves). Repeats give the spread.
ResNet-18 (with torchvision): the bytes of one compressed step only, no training.

Rank 0 prints the table, the alpha-beta estimate of the communication time per step at 10 and
100 Gb/s (docs/communication-cost.md's ring: 2(N-1) alpha + 2(N-1)/N S beta per all-reduce), and
writes compression_bench.csv, compression_bytes.json (bytes per step by model and variant, for
other benchmarks) and compression_bench.png under --out (runs/benchmarks/, or benchmarks/results/
with --update-results).
"""
import argparse
import csv
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench_common import add_output_arguments, output_folder, run_ranks  # noqa: E402  (beside this file)

VARIANTS = ["none", "bf16", "powersgd r=1", "powersgd r=2", "powersgd r=4",
            "powersgd r=1 no EF", "powersgd r=2 no EF", "powersgd r=4 no EF"]
LINKS = {"10 Gb/s": 10e9 / 8, "100 Gb/s": 100e9 / 8}  # bytes per second
ALPHA = 20e-6  # seconds per message on a network (an assumption; gloo over loopback here pays 0.3-0.8 ms)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="training steps per variant (default: 60)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats, each with another data order (default: 3)")
    parser.add_argument("--batch", type=int, default=32, help="images per rank per step (default: 32)")
    parser.add_argument("--no-resnet", action="store_true", help="leave out ResNet-18's bytes per step")
    parser.add_argument("--rounds", type=int, default=20,
                        help="timed rounds of the step-time comparison, every variant once a round (default: 20)")
    parser.add_argument("--quick", action="store_true", help="--repeats 2 --steps 40 --no-resnet")
    add_output_arguments(parser, "compression_bench.csv, compression_bytes.json and compression_bench.png")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    if args.quick:
        args.repeats, args.steps, args.no_resnet, args.rounds = 2, 40, True, 5
    return args


class ByteCounter:
    """Counts what this rank's all-reduces carry: a wrapper around dist.all_reduce."""

    def __init__(self, dist):
        self.dist, self.real, self.bytes, self.calls = dist, dist.all_reduce, 0, 0
        dist.all_reduce = self.all_reduce

    def all_reduce(self, tensor, *args, **kwargs):
        self.bytes += tensor.numel() * tensor.element_size()
        self.calls += 1
        return self.real(tensor, *args, **kwargs)

    def restore(self):
        self.dist.all_reduce = self.real


def _wrap(model, variant, seed):
    from solutions import template_compression as tc
    from solutions.template_ddp import DDP

    ddp = DDP(model, bucket_size_mb=25)
    state = None
    if variant == "bf16":
        ddp.register_comm_hook(None, tc.bf16_compress_hook)
    elif variant.startswith("powersgd"):
        rank = int(variant.split("r=")[1].split()[0])
        state = tc.PowerSGDState(matrix_approximation_rank=rank, start_powerSGD_iter=2, random_seed=seed,
                                 use_error_feedback="no EF" not in variant)
        ddp.register_comm_hook(state, tc.powersgd_hook)
    return ddp, state


def _train(rank, world_size, variants, repeat, steps, batch):
    """Each of `variants` in turn, on the same two ranks: fresh model, DDP and hook for each."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from data import synthetic_cifar
    from models import benchmark_model

    images, labels = synthetic_cifar(num_train=2048, num_test=16)[0].tensors  # the same on every rank
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(repeat))
    rows = []
    for variant in variants:
        model = benchmark_model("cnn")
        ddp, state = _wrap(model, variant, repeat)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses, times, step_bytes, step_calls = [], [], 0, 0
        for step in range(steps):
            at = (step * world_size + rank) * batch % (len(images) - batch)
            index = order[at:at + batch]
            counter = ByteCounter(dist)
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(images[index]), labels[index])
            loss.backward()
            ddp.finish_gradient_synchronization()
            optimizer.step()
            times.append(time.perf_counter() - start)
            counter.restore()
            if step == 2:  # the first compressed step (start_powerSGD_iter=2)
                step_bytes, step_calls = counter.bytes, counter.calls
            summed = loss.detach().clone()
            dist.all_reduce(summed)
            losses.append(summed.item() / world_size)
        rows.append(dict(model="cnn", variant=variant, repeat=repeat, loss=statistics.mean(losses[-10:]),
                         step_ms=1000 * statistics.median(times[3:]), bytes=step_bytes, calls=step_calls,
                         ratio=(state.compression_stats()[0] if state else None)))
    return rows


def _bytes_only(rank, world_size, model_name, variants):
    """Bytes of one compressed step (the third) of each variant, no training: for models too slow to
    train here."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from models import benchmark_model

    g = torch.Generator().manual_seed(rank)
    images, labels = torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g)
    rows = []
    for variant in variants:
        model = benchmark_model(model_name)
        ddp, _ = _wrap(model, variant, 0)
        for step in range(3):
            counter = ByteCounter(dist)
            F.cross_entropy(ddp(images), labels).backward()
            ddp.finish_gradient_synchronization()
            counter.restore()
        rows.append(dict(model=model_name, variant=variant, bytes=counter.bytes, calls=counter.calls))
    return rows


def _time_steps(rank, world_size, model_name, variants, rounds, batch):
    """Median step time (ms) of each variant, the variants taking turns inside every round (in a
    rotated order), so that a burst of load from elsewhere hits them all alike."""
    import torch
    import torch.nn.functional as F

    from models import benchmark_model

    g = torch.Generator().manual_seed(rank)
    images, labels = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
    runs = {}
    for variant in variants:
        model = benchmark_model(model_name)
        runs[variant] = (model, _wrap(model, variant, 0)[0], torch.optim.SGD(model.parameters(), lr=0.01))
    times = {variant: [] for variant in variants}
    for round_ in range(rounds + 3):  # 3 untimed rounds first: PowerSGD starts compressing at step 2
        for variant in variants[round_ % len(variants):] + variants[:round_ % len(variants)]:
            model, ddp, optimizer = runs[variant]
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(images), labels).backward()
            ddp.finish_gradient_synchronization()
            optimizer.step()
            if round_ >= 3:
                times[variant].append(time.perf_counter() - start)
    return {variant: 1000 * statistics.median(t) for variant, t in times.items()}


def comm_seconds(nbytes, calls, world_size, bandwidth, alpha=ALPHA):
    """The ring's alpha-beta time for `calls` all-reduces carrying `nbytes` in all."""
    return 2 * (world_size - 1) * alpha * calls + 2 * (world_size - 1) / world_size * nbytes / bandwidth


def main():
    args = parse_args()  # no torch operation here: bench_common.run_ranks forks the ranks from this process
    rows = []
    started, load_at_start = time.time(), os.getloadavg()[0]
    for repeat in range(args.repeats):
        order = VARIANTS[repeat % len(VARIANTS):] + VARIANTS[:repeat % len(VARIANTS)]
        for row in run_ranks(2, _train, order, repeat, args.steps, args.batch):
            rows.append(row)
            print(f"repeat {repeat} {row['variant']:20s} loss {row['loss']:.3f}  {row['step_ms']:.1f} ms/step  "
                  f"{row['bytes']} bytes/step", flush=True)
    summary = {}
    for variant in VARIANTS:
        mine = [row for row in rows if row["variant"] == variant]
        summary[("cnn", variant)] = dict(
            bytes=mine[0]["bytes"], calls=mine[0]["calls"],
            loss=statistics.median(r["loss"] for r in mine), loss_min=min(r["loss"] for r in mine),
            loss_max=max(r["loss"] for r in mine), step_ms=statistics.median(r["step_ms"] for r in mine))
    timed = ["none", "bf16", "powersgd r=1", "powersgd r=2", "powersgd r=4"]
    for model_name, batch in [("cnn", args.batch)] + ([] if args.no_resnet else [("resnet18", 8)]):
        for variant, ms in run_ranks(2, _time_steps, model_name, timed, args.rounds, batch).items():
            summary.setdefault((model_name, variant), {})["step_ms_alternating"] = ms
            print(f"{model_name} {variant:20s} {ms:.1f} ms/step (alternating, batch {batch}/rank)", flush=True)
    if not args.no_resnet:
        for row in run_ranks(2, _bytes_only, "resnet18", ["none", "bf16", "powersgd r=1", "powersgd r=2",
                                                              "powersgd r=4"]):
            summary[("resnet18", row["variant"])].update(bytes=row["bytes"], calls=row["calls"])
    import torch

    report(summary, args, (load_at_start, os.getloadavg()[0]), time.time() - started, torch.__version__)


def report(summary, args, load, seconds, version):
    os.makedirs(args.out, exist_ok=True)
    print(f"\n2 gloo ranks, torch {version}, {args.repeats} repeats of {args.steps} steps, batch {args.batch}/rank; "
          f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end; {seconds:.0f} s")
    print(f"comm: the ring's alpha-beta time of the step's all-reduces at N ranks, alpha {ALPHA * 1e6:.0f} us; "
          "saves: comm(none) - comm(variant); costs: measured step time minus none's, here (loopback)")
    header = (f"{'model':9s} {'variant':19s} {'bytes/step':>10s} {'fewer':>6s} {'loss (min-max)':>19s} {'ms/step':>8s} "
              f"{'costs':>6s}")
    for link in LINKS:
        header += f" | {link + ' N=2 saves':>19s} {'N=8 saves':>9s}"
    print(header)
    records = []
    for (model, variant), row in summary.items():
        base = summary[(model, "none")]
        fewer = base["bytes"] / row["bytes"]
        costs = row["step_ms_alternating"] - base["step_ms_alternating"] if "step_ms_alternating" in row else None
        record = dict(model=model, variant=variant, bytes_per_step=row["bytes"], all_reduces_per_step=row["calls"],
                      fewer_bytes=round(fewer, 2), loss=row.get("loss"), loss_min=row.get("loss_min"),
                      loss_max=row.get("loss_max"), step_ms_sequential=row.get("step_ms"),
                      step_ms=row.get("step_ms_alternating"), costs_ms=None if costs is None else round(costs, 2))
        line = f"{model:9s} {variant:19s} {row['bytes']:10d} {fewer:6.1f}"
        line += (f" {row['loss']:6.3f} ({row['loss_min']:.3f}-{row['loss_max']:.3f})" if "loss" in row else f" {'':19s}")
        line += f" {row['step_ms_alternating']:8.1f} {costs:6.1f}" if costs is not None else f" {'':8s} {'':6s}"
        for link, bandwidth in LINKS.items():
            key = link.split()[0] + "gbps"
            for n in (2, 8):
                ms = 1000 * comm_seconds(row["bytes"], row["calls"], n, bandwidth)
                record[f"comm_ms_{key}_n{n}"] = round(ms, 3)
                record[f"saves_ms_{key}_n{n}"] = round(1000 * comm_seconds(base["bytes"], base["calls"], n, bandwidth)
                                                       - ms, 3)
            line += f" | {record[f'comm_ms_{key}_n2']:7.2f} {record[f'saves_ms_{key}_n2']:+7.2f} ms {record[f'saves_ms_{key}_n8']:+9.2f}"
        print(line)
        records.append(record)
    with open(os.path.join(args.out, "compression_bench.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    with open(os.path.join(args.out, "compression_bytes.json"), "w") as f:  # for other benchmarks
        json.dump({"what": "bytes that one rank's all-reduces carry in one compressed step (2 ranks, "
                           "Task 5's DDP with 25 MB buckets, Task 12's hooks); all_reduces: how many",
                   "models": {model: {variant: dict(bytes=row["bytes"], all_reduces=row["calls"])
                                      for (m, variant), row in summary.items() if m == model}
                              for model in sorted({m for m, _ in summary})}}, f, indent=1)
    plot(summary, os.path.join(args.out, "compression_bench.png"))
    print(f"\nwrote {args.out}/compression_bench.csv, compression_bytes.json and compression_bench.png")


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cnn = [(variant, row) for (model, variant), row in summary.items() if model == "cnn"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    names = [variant for variant, _ in cnn]
    left.bar(names, [row["bytes"] / 1e6 for _, row in cnn], color="tab:blue")
    left.set_yscale("log")
    left.set_ylabel("MB per step (one rank's all-reduces)")
    left.set_title("CNN: bytes on the wire per step")
    losses = [row["loss"] for _, row in cnn]
    errors = [[row["loss"] - row["loss_min"] for _, row in cnn], [row["loss_max"] - row["loss"] for _, row in cnn]]
    right.bar(names, losses, yerr=errors, capsize=4, color="tab:orange")
    right.set_ylabel("training loss after the last steps")
    right.set_title("CNN: loss (median; whiskers: min and max of the repeats)")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=45)
        for label in axis.get_xticklabels():
            label.set_horizontalalignment("right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
