"""Communicate less often (Task 13): loss against bytes sent and against steps, for data parallelism,
Task 12's compressed gradients (bf16, PowerSGD), local SGD and DiLoCo; and the counter-example to
"averaging the weights is averaging the gradients".

    python benchmarks/local_sgd_bench.py                   # 2 gloo ranks, 3 repeats: 10 min (25 under load)
    python benchmarks/local_sgd_bench.py --split iid       # each rank's half drawn at random (default: skewed)
    python benchmarks/local_sgd_bench.py --quick           # 1 repeat, fewer steps: to see it run
    python benchmarks/local_sgd_bench.py --update-results  # rewrite benchmarks/results/local_sgd*

The task is hard enough to separate the methods and small enough for a CPU: a teacher network
labels 32-dimensional Gaussian inputs (10 classes), 20% of the training labels are replaced by
random ones, and a student MLP (32-256-256-10, 76,810 parameters, float32) learns from 200,000
examples, each rank from its own half, 32 a step, each example once (a run reads a quarter of its
half): no run can learn the noise by heart, so the test loss measures learning, not memorising. --split skewed (the default) gives each rank a
half that is mostly its own classes (on 2 ranks, 90% of rank 0's half are classes 0-4, 90% of rank
1's classes 5-9), as data held in different places is: the replicas then drift apart between averages, which separates
the methods; --split iid draws each half at random. Every method starts from the same weights and
sees the same batches (per repeat); AdamW (lr 1e-3) is the optimizer of every rank:
- dp: data parallelism, the gradients averaged every step (one flat all-reduce);
- bf16, powersgd r: Task 12's communication hooks (solutions/template_compression.py) on the
  gradients every step, as Task 5's DDP runs them with one bucket (the model is 307 kB, under DDP's
  25 MB): bf16_compress_hook, or powersgd_hook with a PowerSGDState of rank r (error feedback and
  warm start on, compression from step 3: start_powerSGD_iter=2, the course's default);
- local H: local SGD (Task 13.2) with AdamW inside, the parameters averaged every H steps;
- diloco H: DiLoCo (Task 13.3), AdamW inside, outer SGD lr 0.7, Nesterov momentum 0.9.
Bytes are measured, not computed: every dist.all_reduce a rank calls is counted with its tensor's
size (what a rank puts into the all-reduce; a ring all-reduce sends 2(N-1)/N of it per rank). The
test loss is that of rank 0's model every 64 steps, when every method has just synchronised. So
PowerSGD's P and Q, and bf16's 2-byte elements, count as they go on the wire.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from solutions.template_compression import PowerSGDState, bf16_compress_hook, powersgd_hook  # noqa: E402
from solutions.template_ddp import Bucket, launch_all_reduce  # noqa: E402
from solutions.template_local_sgd import DiLoCo, LocalSGD, all_reduce_mean  # noqa: E402
from bench_common import add_output_arguments, output_folder, run_ranks  # noqa: E402  (beside this file)

EVAL_EVERY = 64  # a multiple of every H: all methods have just synchronised there
# (name, kind, n): the lines of the figure; n is H for local and diloco, the rank for powersgd
METHODS = [("dp", "dp", 1), ("bf16", "bf16", 1), ("powersgd 1", "powersgd", 1), ("powersgd 4", "powersgd", 4),
           ("local 1", "local", 1), ("local 4", "local", 4), ("local 16", "local", 16),
           ("local 64", "local", 64), ("diloco 16", "diloco", 16), ("diloco 64", "diloco", 64)]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1536, help="training steps of each run (default: 1536)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each method, each with its own seed (3)")
    parser.add_argument("--world-size", type=int, default=2, help="gloo ranks on this machine (default: 2)")
    parser.add_argument("--split", choices=["skewed", "iid"], default="skewed",
                        help="skewed: each rank's half mostly its own classes (90%% on 2 ranks); iid: drawn at random "
                        "(default: skewed)")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 128 steps: to see it run, not for figures")
    add_output_arguments(parser, "the CSVs and the figure")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 128, 1
    if args.steps * 32 > 200000 // args.world_size:
        parser.error(f"--steps {args.steps}: each rank reads each of its {200000 // args.world_size} examples once, "
                     f"32 a step: at most {200000 // args.world_size // 32} steps")
    if args.steps % EVAL_EVERY:
        parser.error(f"--steps must be a multiple of {EVAL_EVERY} (the loss is measured every {EVAL_EVERY} steps)")
    return args


# --------------------------------------------------------------------------- the task
def make_data(n_train=200000, n_test=4000, noise=0.2):
    g = torch.Generator().manual_seed(1234)
    teacher = [torch.randn(32, 64, generator=g) / 32 ** 0.5, torch.randn(64, 10, generator=g) / 8]
    x = torch.randn(n_train + n_test, 32, generator=g)
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(1)
    flip = torch.rand(n_train, generator=g) < noise  # noisy training labels; the test labels are clean
    y[:n_train][flip] = torch.randint(0, 10, (int(flip.sum()),), generator=g)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def student():
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


class Counted:
    """Counts the bytes of every dist.all_reduce of this process."""

    def __init__(self):
        self.bytes, self._real = 0, dist.all_reduce
        dist.all_reduce = self._all_reduce

    def _all_reduce(self, tensor, *args, **kwargs):
        self.bytes += tensor.numel() * tensor.element_size()
        return self._real(tensor, *args, **kwargs)


def shard(y, rank, world_size, split, own=0.8):
    """The indices of this rank's share of the training set: every world_size-th example (iid), or
    (skewed) a share of the same size, `own` of it from this rank's block of classes."""
    if split == "iid":
        return torch.arange(rank, len(y), world_size)
    g = torch.Generator().manual_seed(99)  # the same on every rank: the shares do not overlap
    order = torch.randperm(len(y), generator=g)
    home = (y[order] * world_size // 10)  # the rank whose block each example's class is in
    size = len(y) // world_size
    shares = [[] for _ in range(world_size)]
    pools = [order[home == r].tolist() for r in range(world_size)]
    rest = []
    for r in range(world_size):  # `own` of each share from its block, the rest from the leftovers
        shares[r] = pools[r][:int(own * size)]
        rest += pools[r][int(own * size):]
    rest = torch.tensor(rest)[torch.randperm(len(rest), generator=g)].tolist()
    for r in range(world_size):
        need = size - len(shares[r])
        shares[r], rest = shares[r] + rest[:need], rest[need:]
    return torch.tensor(shares[rank])


def compressed_mean(bucket):
    """The gradients of bucket.params replaced by their average over the ranks, the way Task 5's DDP
    does it with a communication hook (Task 12): the hook gets the local gradients flat, its Future
    holds the average, which goes back into each .grad."""
    launch_all_reduce(bucket)  # with bucket.comm_hook set: support.comm_hooks.launch_comm_hook
    bucket.handle.wait()
    for param, mean in zip(bucket.params, bucket.buffer.split([p.numel() for p in bucket.params])):
        param.grad.copy_(mean.view_as(param))


def _train(rank, world_size, kind, n, seed, steps, data, counter, split):
    x, y, x_test, y_test = data
    mine = shard(y, rank, world_size, split)  # this rank's half (a third, ...) of the training set
    torch.manual_seed(seed)
    model = student()  # the same start on every rank: the same seed
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stepper = (LocalSGD(model, inner, n) if kind == "local"
               else DiLoCo(model, inner, n, outer_lr=0.7, outer_momentum=0.9) if kind == "diloco" else inner)
    if kind in ("bf16", "powersgd"):  # one bucket of every parameter, in backward's order, as DDP builds it
        bucket = Bucket(list(reversed(list(model.parameters()))))
        bucket.comm_hook = ((None, bf16_compress_hook) if kind == "bf16"
                            else (PowerSGDState(matrix_approximation_rank=n), powersgd_hook)) + (0, True)
    order = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(seed * 1000 + rank))]
    start, rows = counter.bytes, []
    for step in range(1, steps + 1):
        batch = order[(step - 1) * 32:step * 32]  # each example once
        stepper.zero_grad()
        F.cross_entropy(model(x[batch]), y[batch]).backward()
        if kind == "dp":
            all_reduce_mean([p.grad for p in model.parameters()])
        elif kind in ("bf16", "powersgd"):
            compressed_mean(bucket)
        stepper.step()
        if step % EVAL_EVERY == 0:
            with torch.no_grad():
                logits = model(x_test)
                loss = F.cross_entropy(logits, y_test).item()
                accuracy = (logits.argmax(1) == y_test).float().mean().item()
            rows.append((step, counter.bytes - start, loss, accuracy))
    return rows


def _all_runs(rank, world_size, steps, repeats, split):
    torch.set_num_threads(1)
    data = make_data()
    counter = Counted()
    rows = []
    for seed in range(repeats):
        for name, kind, n in METHODS:  # alternating: load on the machine hits every method alike
            began = time.perf_counter()
            for step, sent, loss, accuracy in _train(rank, world_size, kind, n, seed, steps, data, counter, split):
                rows.append(dict(method=name, seed=seed, step=step, bytes=sent, test_loss=loss, test_accuracy=accuracy))
            if rank == 0:
                print(f"  {name:<10} seed {seed}: test loss {rows[-1]['test_loss']:.4f}, "
                      f"accuracy {rows[-1]['test_accuracy']:.3f}, {rows[-1]['bytes'] / steps / 1e3:.1f} kB a step "
                      f"({time.perf_counter() - began:.1f} s)", flush=True)
    return rows


# --------------------------------------------------------------------------- the counter-example
COUNTER = {  # name: (optimizer, kwargs, max gradient norm or None)
    "SGD": (torch.optim.SGD, dict(lr=0.1), None),
    "SGD, momentum 0.9": (torch.optim.SGD, dict(lr=0.1, momentum=0.9), None),
    "SGD, Nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True), None),
    "SGD, weight decay 0.05": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.05), None),
    "SGD, gradients clipped to norm 0.1": (torch.optim.SGD, dict(lr=0.1), 0.1),
    "Adam": (torch.optim.Adam, dict(lr=0.01), None),
    "AdamW, weight decay 0.1": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1), None),
}


def _counter_example(rank, world_size, repeats, steps=12):
    """Per optimizer, one per repeat (its seed draws the weights and the batches): the largest difference
    of any parameter after `steps` steps between averaging the parameters after every step and
    averaging the gradients (data parallelism), float64."""
    torch.set_num_threads(1)
    return {name: [_counter_gap(rank, seed, steps, *setting) for seed in range(repeats)]
            for name, setting in COUNTER.items()}


def _counter_gap(rank, seed, steps, cls, kwargs, clip):
    final = []
    for averaging in ("gradients", "parameters"):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()
        opt = cls(model.parameters(), **kwargs)
        stepper = opt if averaging == "gradients" else LocalSGD(model, opt, sync_every=1)
        for step in range(steps):
            g = torch.Generator().manual_seed(100000 * seed + 1000 * step + rank)
            x, y = torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g,
                                                                                   dtype=torch.float64)
            stepper.zero_grad()
            F.mse_loss(model(x), y).backward()
            if averaging == "gradients":
                all_reduce_mean([p.grad for p in model.parameters()])
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            stepper.step()
        final.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return (final[0] - final[1]).abs().max().item()


# --------------------------------------------------------------------------- output
def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(rows, path, world_size, split):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, _, _ in METHODS:
        mine = [r for r in rows if r["method"] == name]
        steps = sorted({r["step"] for r in mine})
        by_step = [[r for r in mine if r["step"] == s] for s in steps]
        mean = [statistics.fmean(r["test_loss"] for r in rs) for rs in by_step]
        low = [min(r["test_loss"] for r in rs) for rs in by_step]
        high = [max(r["test_loss"] for r in rs) for rs in by_step]
        sent = [statistics.fmean(r["bytes"] for r in rs) / 2**20 for rs in by_step]
        style = ("-" if name == "dp" else "-." if name.startswith(("bf16", "powersgd"))
                 else "--" if name.startswith("local") else ":")
        for ax, xs in ((axes[0], steps), (axes[1], sent)):
            line, = ax.plot(xs, mean, style, label=name, linewidth=2 if name == "dp" else 1.5)
            ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel(f"MiB all-reduced by each rank (log scale; {world_size} gloo ranks)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel("test loss (clean labels)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[0].set_title("loss against steps: lines the mean, bands min-max of the repeats")
    axes[1].set_title(f"loss against bytes sent ({split} halves)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    args = parse_args(argv)
    out = output_folder(args)
    os.makedirs(out, exist_ok=True)
    load = os.getloadavg()[0]
    print(f"local_sgd_bench: {args.world_size} gloo ranks, {args.split} halves, {args.steps} steps, "
          f"{args.repeats} repeats; "
          f"load average {load:.1f} at the start")
    began = time.perf_counter()
    counter = run_ranks(args.world_size, _counter_example, args.repeats)
    print(f"parameters averaged every step vs gradients averaged, 12 steps, float64, largest difference "
          f"(median, min-max over {args.repeats} repeats):")
    for name, gaps in counter.items():
        print(f"  {name:<36} {statistics.median(gaps):.2g} ({min(gaps):.2g}-{max(gaps):.2g})")
    write_csv(os.path.join(out, "local_sgd_counterexample.csv"),
              [dict(optimizer=name, seed=seed, max_abs_difference=gap)
               for name, gaps in counter.items() for seed, gap in enumerate(gaps)])
    # run_ranks waits 15 minutes by default: under load 30 a run of 1536 steps took up to 90 s here
    rows = run_ranks(args.world_size, _all_runs, args.steps, args.repeats, args.split,
                     timeout=max(900, 120 * len(METHODS) * args.repeats * args.steps // 1536))
    name = f"local_sgd_{args.split}"
    write_csv(os.path.join(out, f"{name}.csv"), rows)
    plot(rows, os.path.join(out, f"{name}.png"), args.world_size, args.split)
    print(f"final test loss after {args.steps} steps (mean, min-max over {args.repeats} repeats), bytes a step:")
    for method, _, _ in METHODS:
        last = [r for r in rows if r["method"] == method and r["step"] == args.steps]
        losses = [r["test_loss"] for r in last]
        print(f"  {method:<10} {statistics.fmean(losses):.4f} ({min(losses):.4f}-{max(losses):.4f}), accuracy "
              f"{statistics.fmean(r['test_accuracy'] for r in last):.3f}, "
              f"{statistics.fmean(r['bytes'] for r in last) / args.steps / 1e3:.1f} kB a step")
    print(f"wrote {out}/{name}.csv, {name}.png, local_sgd_counterexample.csv in "
          f"{time.perf_counter() - began:.0f} s; load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
