"""Task 12: what gradient compression saves on the wire, what it costs in loss and in time.

    python benchmarks/compression_bench.py --quick          # the CNN, 2 ranks, 2 repeats: a few minutes
    python benchmarks/compression_bench.py                  # CNN and ResNet-18, 3 repeats: ~30 minutes (load 30)
    python benchmarks/compression_bench.py --times-only     # only the step times, CNN and ResNet-18: ~7 minutes (load 35)
    python benchmarks/compression_bench.py --models resnet18 --losses-only  # ResNet-18's losses: 5-20 minutes

Two gloo ranks on this machine (bench_common.run_ranks), Task 5's DDP (solutions/) with Task 12's
hooks (solutions/), one variant after the other, in a rotated order in every repeat:

    none                 no hook: Task 5's plain averaging all-reduce, float32
    bf16                 bf16_compress_hook: every bucket in bfloat16
    powersgd r=R [no EF] powersgd_hook, matrix_approximation_rank R (1, 2, 4), start_powerSGD_iter 2,
                         with error feedback, or without it ("no EF")

Each variant trains the model (the course CNN; torchvision's ResNet-18 for 10 classes, as
models.benchmark_model builds it) from the same initial weights on the same synthetic images
(data.synthetic_cifar, a different order in each repeat) for a fixed number of steps of SGD with
momentum 0.9: lr 0.05 for the CNN, --resnet-lr 0.01 for ResNet-18. At lr 0.05 ResNet-18's first
steps overshoot (after 20 steps every variant's loss was above the 2.30 of a uniform guess); at
0.01 "none" passes below 2.30 after about 10 steps and averages 0.77 over steps 21-30 (lr 0.02:
1.16, noisier), so 25 steps show learning; 8 variants x 3 repeats took 5 minutes at load 19 falling
to 8, and would take ~18 at load 28 (1.3 s a step for none, 2.1 s for PowerSGD r = 4 there). Measured per variant: the bytes that rank 0's all-reduces carried in one
compressed step (a wrapper around dist.all_reduce counts numel * element_size), and the loss at the
end (mean of the last 10 steps; mean, std, min and max over the repeats).

Step times are measured apart, with the variants taking turns inside every round (in a rotated
order), so that a burst of load from elsewhere hits them all alike: the median per variant and its
ratio to "none" from the same run. On loopback gloo the communication is nearly free, so this is
mostly what compression costs, not what it saves. --times-only runs only this part.

Rank 0 prints the tables, the alpha-beta estimate of the communication time per step at 10 and
100 Gb/s (docs/communication-cost.md's ring: 2(N-1) alpha + 2(N-1)/N S beta per all-reduce), and
writes under --out (runs/benchmarks/, or benchmarks/results/ with --update-results):
compression_bench.csv (bytes, losses, alpha-beta), compression_bytes.json (bytes per step by model
and variant, for other benchmarks) and compression_bench.png; compression_times.csv (step times,
with the load average and date) in every mode but --losses-only. --models runs one model alone;
the other model's rows already under --out are kept (read back from the CSVs), so the files and the
figure still hold both.
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
from bench_common import RESULTS, add_output_arguments, output_folder, run_ranks  # noqa: E402  (beside this file)

VARIANTS = ["none", "bf16", "powersgd r=1", "powersgd r=2", "powersgd r=4",
            "powersgd r=1 no EF", "powersgd r=2 no EF", "powersgd r=4 no EF"]
TIMED = ["none", "bf16", "powersgd r=1", "powersgd r=2", "powersgd r=4"]  # the step-time comparison
LINKS = {"10 Gb/s": 10e9 / 8, "100 Gb/s": 100e9 / 8}  # bytes per second
ALPHA = 20e-6  # seconds per message on a network (an assumption; gloo over loopback here pays 0.3-0.8 ms)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="the CNN's training steps per variant (default: 60)")
    parser.add_argument("--batch", type=int, default=32, help="the CNN's images per rank per step (default: 32)")
    parser.add_argument("--resnet-steps", type=int, default=25,
                        help="ResNet-18's training steps per variant (default: 25)")
    parser.add_argument("--resnet-batch", type=int, default=16,
                        help="ResNet-18's images per rank per step, in training and timing (default: 16)")
    parser.add_argument("--resnet-lr", type=float, default=0.01,
                        help="ResNet-18's SGD learning rate (default: 0.01; the CNN's is 0.05)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats, each with another data order (default: 3)")
    parser.add_argument("--models", nargs="+", choices=["cnn", "resnet18"], default=["cnn", "resnet18"],
                        help="the models to run (default: both); the other model's rows in the files under "
                             "--out are kept")
    parser.add_argument("--no-resnet", action="store_true", help="leave ResNet-18 out")
    parser.add_argument("--rounds", type=int, default=20,
                        help="timed rounds of the step-time comparison, every variant once a round (default: 20)")
    parser.add_argument("--times-only", action="store_true",
                        help="only the step-time comparison (CNN and ResNet-18): writes compression_times.csv")
    parser.add_argument("--losses-only", action="store_true",
                        help="only the bytes and losses: leaves compression_times.csv as it is")
    parser.add_argument("--quick", action="store_true", help="--repeats 2 --steps 40 --rounds 5 --no-resnet")
    add_output_arguments(parser, "compression_bench.csv, compression_bytes.json, compression_bench.png and "
                         "compression_times.csv")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    if args.quick:
        args.repeats, args.steps, args.no_resnet, args.rounds = 2, 40, True, 5
    if args.no_resnet:
        args.models = [model for model in args.models if model != "resnet18"]
    if not args.models:
        parser.error("no model left to run: --no-resnet (or --quick) leaves out the only model of --models")
    if args.times_only and args.losses_only:
        parser.error("--times-only and --losses-only leave nothing to run: give one of them")
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


def _train(rank, world_size, model_name, variants, repeat, steps, batch, lr):
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
        model = benchmark_model(model_name)
        ddp, state = _wrap(model, variant, repeat)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        losses, step_bytes, step_calls = [], 0, 0
        for step in range(steps):
            at = (step * world_size + rank) * batch % (len(images) - batch)
            index = order[at:at + batch]
            counter = ByteCounter(dist)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(images[index]), labels[index])
            loss.backward()
            ddp.finish_gradient_synchronization()
            optimizer.step()
            counter.restore()
            if step == 2:  # the first compressed step (start_powerSGD_iter=2)
                step_bytes, step_calls = counter.bytes, counter.calls
            summed = loss.detach().clone()
            dist.all_reduce(summed)
            losses.append(summed.item() / world_size)
        rows.append(dict(model=model_name, variant=variant, repeat=repeat, loss=statistics.mean(losses[-10:]),
                         bytes=step_bytes, calls=step_calls,
                         ratio=(state.compression_stats()[0] if state else None)))
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
    return {variant: [1000 * q for q in statistics.quantiles(t, n=4)] if len(t) > 1 else [1000 * t[0]] * 3
            for variant, t in times.items()}  # quartiles: [first, median, third]


def comm_seconds(nbytes, calls, world_size, bandwidth, alpha=ALPHA):
    """The ring's alpha-beta time for `calls` all-reduces carrying `nbytes` in all."""
    return 2 * (world_size - 1) * alpha * calls + 2 * (world_size - 1) / world_size * nbytes / bandwidth


def main():
    args = parse_args()  # no torch operation here: bench_common.run_ranks forks the ranks from this process
    started, load_at_start = time.time(), os.getloadavg()[0]
    settings = {"cnn": (args.steps, args.batch, 0.05),
                "resnet18": (args.resnet_steps, args.resnet_batch, args.resnet_lr)}
    models = [(model, *settings[model]) for model in ["cnn", "resnet18"] if model in args.models]
    os.makedirs(args.out, exist_ok=True)
    summary = None
    if not args.times_only:
        rows = []
        for model_name, steps, batch, lr in models:
            for repeat in range(args.repeats):
                order = VARIANTS[repeat % len(VARIANTS):] + VARIANTS[:repeat % len(VARIANTS)]
                for row in run_ranks(2, _train, model_name, order, repeat, steps, batch, lr, timeout=1800):
                    rows.append(row)
                    print(f"{model_name} repeat {repeat} {row['variant']:20s} loss after {steps} steps "
                          f"{row['loss']:.3f}  {row['bytes']} bytes/step", flush=True)
        summary = _kept_summary(args)  # the other model's rows of an earlier run, if any
        for model_name, steps, batch, lr in models:
            for variant in VARIANTS:
                losses = [r["loss"] for r in rows if r["model"] == model_name and r["variant"] == variant]
                first = next(r for r in rows if r["model"] == model_name and r["variant"] == variant)
                summary[(model_name, variant)] = dict(
                    bytes=first["bytes"], calls=first["calls"], steps=steps, batch=batch, lr=lr, repeats=len(losses),
                    loss=statistics.mean(losses), loss_std=statistics.stdev(losses) if len(losses) > 1 else 0.0,
                    loss_min=min(losses), loss_max=max(losses))
    steps_timed = {}
    for model_name, _, batch, _ in models if not args.losses_only else []:
        quartiles = run_ranks(2, _time_steps, model_name, TIMED, args.rounds, batch)
        for variant in TIMED:
            steps_timed[(model_name, variant)] = dict(batch=batch, quartiles=quartiles[variant])
    import torch

    load = (load_at_start, os.getloadavg()[0])
    seconds = time.time() - started
    if summary is not None:
        summary = dict(sorted(summary.items(), key=lambda item: (item[0][0], VARIANTS.index(item[0][1]))))
        report(summary, args, load, seconds, torch.__version__)
    if not args.losses_only:
        step_bytes = summary or _committed_bytes()
        report_times(steps_timed, step_bytes, args, load, seconds, torch.__version__)


def _kept_rows(path, args):
    """The rows of the CSV at `path` (under --out) for the models this run leaves out, so that running
    one model does not lose the other's figures."""
    try:
        with open(path, newline="") as f:
            return [row for row in csv.DictReader(f) if row["model"] not in args.models]
    except (OSError, KeyError):
        return []


def _kept_summary(args):
    """The summary entries of the models this run leaves out, read back from compression_bench.csv."""
    return {(row["model"], row["variant"]): dict(
        bytes=int(row["bytes_per_step"]), calls=int(row["all_reduces_per_step"]), steps=int(row["steps"]),
        batch=int(row["batch_per_rank"]), lr=float(row["lr"]) if row.get("lr") else 0.05,
        repeats=int(row["repeats"]), loss=float(row["loss_mean"]), loss_std=float(row["loss_std"]),
        loss_min=float(row["loss_min"]), loss_max=float(row["loss_max"]))
        for row in _kept_rows(os.path.join(args.out, "compression_bench.csv"), args)}


def _committed_bytes():
    """Bytes per step from the committed compression_bytes.json (for --times-only's alpha-beta column)."""
    try:
        with open(os.path.join(RESULTS, "compression_bytes.json")) as f:
            models = json.load(f)["models"]
    except (OSError, ValueError, KeyError):
        return {}
    return {(model, variant): dict(bytes=row["bytes"], calls=row["all_reduces"])
            for model, variants in models.items() for variant, row in variants.items()}


def report(summary, args, load, seconds, version):
    print(f"\n2 gloo ranks, torch {version}, {args.repeats} repeats (each another data order); "
          f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end; {seconds:.0f} s")
    print(f"loss: mean of the last 10 steps, mean of the repeats (min-max); comm: the ring's alpha-beta time of "
          f"the step's all-reduces at N ranks, alpha {ALPHA * 1e6:.0f} us; saves: comm(none) - comm(variant)")
    header = f"{'model':9s} {'variant':19s} {'steps':>5s} {'bytes/step':>10s} {'fewer':>6s} {'loss (min-max)':>19s}"
    for link in LINKS:
        header += f" | {link + ' N=2 saves':>19s} {'N=8 saves':>9s}"
    print(header)
    records = []
    for (model, variant), row in summary.items():
        base = summary[(model, "none")]
        fewer = base["bytes"] / row["bytes"]
        record = dict(model=model, variant=variant, steps=row["steps"], batch_per_rank=row["batch"], lr=row["lr"],
                      repeats=row["repeats"], bytes_per_step=row["bytes"], all_reduces_per_step=row["calls"],
                      fewer_bytes=round(fewer, 2), loss_mean=round(row["loss"], 4), loss_std=round(row["loss_std"], 4),
                      loss_min=round(row["loss_min"], 4), loss_max=round(row["loss_max"], 4))
        line = (f"{model:9s} {variant:19s} {row['steps']:5d} {row['bytes']:10d} {fewer:6.1f}"
                f" {row['loss']:6.3f} ({row['loss_min']:.3f}-{row['loss_max']:.3f})")
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
    write_csv(os.path.join(args.out, "compression_bench.csv"), records)
    with open(os.path.join(args.out, "compression_bytes.json"), "w") as f:  # for other benchmarks
        json.dump({"what": "bytes that one rank's all-reduces carry in one compressed step (2 ranks, "
                           "Task 5's DDP with 25 MB buckets, Task 12's hooks); all_reduces: how many",
                   "models": {model: {variant: dict(bytes=row["bytes"], all_reduces=row["calls"])
                                      for (m, variant), row in summary.items() if m == model}
                              for model in sorted({m for m, _ in summary})}}, f, indent=1)
    plot(summary, os.path.join(args.out, "compression_bench.png"))
    print(f"wrote {args.out}/compression_bench.csv, compression_bytes.json and compression_bench.png")


def write_csv(path, records):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)


def report_times(steps_timed, step_bytes, args, load, seconds, version):
    """The step-time table: median (quartiles) per variant, its ratio to none's from the same run, and
    what the alpha-beta model says the variant would save on a network, for comparison."""
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\nstep times: 2 gloo ranks, torch {version}, {args.rounds} rounds, the variants taking turns; "
          f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end; {date}")
    print(f"{'model':9s} {'variant':14s} {'batch':>5s} {'ms/step (quartiles)':>24s} {'vs none':>8s} {'costs':>8s}"
          f" | alpha-beta saves, N=2: {'10 Gb/s':>8s} {'100 Gb/s':>8s}")
    records = _kept_rows(os.path.join(args.out, "compression_times.csv"), args)  # the other model's
    for (model, variant), row in steps_timed.items():
        low, median, high = row["quartiles"]
        base = steps_timed[(model, "none")]["quartiles"][1]
        record = dict(model=model, variant=variant, batch_per_rank=row["batch"], rounds=args.rounds,
                      step_ms=round(median, 2), step_ms_q1=round(low, 2), step_ms_q3=round(high, 2),
                      vs_none=round(median / base, 3), costs_ms=round(median - base, 2))
        line = (f"{model:9s} {variant:14s} {row['batch']:5d} {median:8.1f} ({low:6.1f}-{high:6.1f}) "
                f"{median / base:7.2f}x {median - base:+7.1f} |{'':23s}")
        for link, bandwidth in LINKS.items():
            key = f"saves_ms_{link.split()[0]}gbps_n2"
            mine, none = step_bytes.get((model, variant)), step_bytes.get((model, "none"))
            record[key] = None
            if mine and none:
                record[key] = round(1000 * (comm_seconds(none["bytes"], none["calls"], 2, bandwidth)
                                            - comm_seconds(mine["bytes"], mine["calls"], 2, bandwidth)), 3)
            line += f" {record[key]:+8.2f}" if record[key] is not None else f" {'':8s}"
        record.update(load_start=round(load[0], 1), load_end=round(load[1], 1), date=date, torch=version)
        print(line)
        records.append(record)
    write_csv(os.path.join(args.out, "compression_times.csv"), records)
    print(f"wrote {args.out}/compression_times.csv ({seconds:.0f} s in all)")


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({model for model, _ in summary})
    fig, axes = plt.subplots(1, 1 + len(models), figsize=(6 * (1 + len(models)), 4.5))
    names = VARIANTS
    width = 0.8 / len(models)
    for i, model in enumerate(models):
        axes[0].bar([x + i * width for x in range(len(names))], [summary[(model, v)]["bytes"] / 1e6 for v in names],
                    width, label=model)
    axes[0].set_xticks([x + width * (len(models) - 1) / 2 for x in range(len(names))], names)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("MB per step (one rank's all-reduces)")
    axes[0].set_title("bytes on the wire per step")
    axes[0].legend()
    for axis, model in zip(axes[1:], models):
        rows = [summary[(model, v)] for v in names]
        means = [row["loss"] for row in rows]
        errors = [[row["loss"] - row["loss_min"] for row in rows], [row["loss_max"] - row["loss"] for row in rows]]
        axis.bar(names, means, yerr=errors, capsize=4, color="tab:orange")
        axis.axhline(means[0], color="gray", linewidth=0.8, linestyle="--")  # none's
        axis.set_ylabel(f"training loss after {rows[0]['steps']} steps")
        axis.set_title(f"{model}: loss (mean of {rows[0]['repeats']}; whiskers: min, max)")
    for axis in axes:
        axis.tick_params(axis="x", rotation=45)
        for label in axis.get_xticklabels():
            label.set_horizontalalignment("right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
