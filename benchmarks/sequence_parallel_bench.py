"""What sequence parallelism saves and costs: a ViT block's saved activations per rank, the bytes sent, the step time.

    python benchmarks/sequence_parallel_bench.py                  # T = 1, 2, 4, with and without --sp (a minute)
    python benchmarks/sequence_parallel_bench.py --ranks 1,2 --steps 5

For each tensor-parallel size T it starts T gloo processes on this machine; each splits the ViT's
block (models.Block(64, 4): dim h = 64, a = 4 heads, fp32) with Task 14's solution
(solutions/template_sequence_parallel.py), without and then with sequence parallelism, and feeds it
b x s = --batch-size x 64 tokens:

    activations  the bytes that the block's backward keeps, per rank, counted by
                 torch.autograd.graph.saved_tensors_hooks during one forward: every tensor autograd
                 saves, each storage once (q, k and v are views of one qkv output), the parameters
                 (which autograd saves too) left out. Beside it, Korthikanti et al.'s count (arXiv
                 2205.05198, section 4.1) divided as they divide it: sbh(34 + 5as/h) bytes for one
                 layer without parallelism (fp16, dropout), sbh(10 + 24/t + 5as/(ht)) with tensor
                 parallelism, sbh(34 + 5as/h)/t with sequence parallelism too; and the same count for
                 this block (fp32, no dropout, attention that saves no s x s matrix): 4sbh x 16,
                 4sbh(4 + 12/t) and 4sbh x 16/t.
    sent         the collectives each rank calls in one forward and backward of the block
                 (recorded), and the bytes a ring sends per rank for them: 2(T-1)/T of an
                 all-reduce's tensor, (T-1)/T of an all-gather's result or a reduce-scatter's input.
    time         forward and backward of --depth blocks, the median over --steps steps of the
                 slowest rank and its spread (min-max), after a warm-up step, the two modes taking
                 turns step by step so that load from elsewhere hits them alike.

Writes benchmarks/results/sequence_parallel.csv (or under --out) and sequence_parallel.png.
"""
import argparse
import csv
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository root
from models import Block  # noqa: E402
from bench_common import add_output_arguments, output_folder, run_ranks  # noqa: E402  (beside this file)

DIM, HEADS, TOKENS = 64, 4, 64  # the course ViT's block: h, a, s


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated tensor-parallel sizes T (default: 1,2,4)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode (default: 10)")
    parser.add_argument("--batch-size", type=int, default=32, help="b, the images per step (default: 32)")
    parser.add_argument("--depth", type=int, default=4, help="blocks in the timed stack (default: 4, the ViT's)")
    add_output_arguments(parser, "the CSV and the figure")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    return args


def saved_bytes(module, x):
    """The bytes of what autograd saves in module(x) for backward: each storage once, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        y = module(x)
    return sum(storages.values()), y


class Sent:
    """The calls of all_reduce / all_gather / reduce_scatter on this rank, and the ring's bytes for them."""
    KINDS = ("all_reduce", "all_gather", "reduce_scatter")

    def __init__(self):
        self.calls, self.ring_bytes = 0, 0.0
        self.real = {kind: getattr(dist, kind) for kind in self.KINDS}

    def __enter__(self):
        for kind, real in self.real.items():
            setattr(dist, kind, self._counting(kind, real))
        return self

    def __exit__(self, *exc):
        for kind, real in self.real.items():
            setattr(dist, kind, real)

    def _counting(self, kind, real):
        def collective(*args, **kwargs):
            size = dist.get_world_size(kwargs.get("group"))
            if kind == "all_reduce":
                numel = args[0].numel()
                whole = 2 * numel  # reduce-scatter then all-gather of the whole tensor
            elif kind == "all_gather":
                numel = args[1].numel()  # this rank's piece
                whole = numel * size
            else:  # reduce_scatter(output, input_list)
                numel = sum(t.numel() for t in args[1])
                whole = numel
            self.calls += 1
            self.ring_bytes += (size - 1) / size * whole * 4  # fp32
            return real(*args, **kwargs)
        return collective


def korthikanti(s, b, h, a, t, mode):
    """Their bytes per rank for one layer (fp16 activations, with dropout, softmax saved)."""
    if mode == "none":
        return s * b * h * (34 + 5 * a * s / h)
    if mode == "tp":
        return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    return s * b * h * (34 + 5 * a * s / h) / t


def ours(s, b, h, t, mode):
    """The same count for this block: fp32 (4 bytes), no dropout masks, and attention that saves q, k, v and its
    output but no s x s matrix (the CPU's fused scaled_dot_product_attention). Whole on every rank without
    sequence parallelism: the two LayerNorms' inputs and the inputs of qkv and fc1 (4 sbh); split: q, k, v,
    the attention's output, proj's input, GELU's input and fc2's (12 sbh)."""
    if mode == "none":
        return 4 * s * b * h * 16
    if mode == "tp":
        return 4 * s * b * h * (4 + 12 / t)
    return 4 * s * b * h * 16 / t


def _rank(rank, world_size, batch, steps, depth):
    from solutions import template_sequence_parallel as sp
    torch.manual_seed(0)
    x_full = torch.randn(batch, TOKENS, DIM)
    out = []
    modes = [False, True] if world_size > 1 else [False]
    stacks = {}
    for sequence_parallel in modes:
        torch.manual_seed(0)
        block = sp.parallelize_block(Block(DIM, HEADS), None, sequence_parallel)
        x = (x_full.chunk(world_size, dim=1)[rank] if sequence_parallel else x_full).clone().requires_grad_()
        with Sent() as sent:
            saved, y = saved_bytes(block, x)
            y.sum().backward()
        torch.manual_seed(0)
        stacks[sequence_parallel] = (torch.nn.Sequential(*[sp.parallelize_block(Block(DIM, HEADS), None, sequence_parallel)
                                                          for _ in range(depth)]), x.detach())
        out.append(dict(T=world_size, sp=sequence_parallel, saved=saved, calls=sent.calls,
                        ring_bytes=sent.ring_bytes))
    times = {mode: [] for mode in modes}
    for step in range(steps + 1):  # the modes take turns; step 0 warms up
        for mode in modes:
            stack, x = stacks[mode]
            x = x.clone().requires_grad_()
            dist.barrier()
            start = time.perf_counter()
            stack(x).sum().backward()
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's
            if step:
                times[mode].append(elapsed.item())
    for row in out:
        t = times[row["sp"]]
        row.update(median_ms=1e3 * statistics.median(t), min_ms=1e3 * min(t), max_ms=1e3 * max(t))
    gathered = [None] * world_size
    dist.all_gather_object(gathered, out)
    return gathered


def main(argv=None):
    args = parse_args(argv)
    rows = []
    for world_size in [int(n) for n in args.ranks.split(",")]:
        per_rank = run_ranks(world_size, _rank, args.batch_size, args.steps, args.depth)
        for index, row in enumerate(per_rank[0]):
            saved = [ranks[index]["saved"] for ranks in per_rank]
            mode = "sp" if row["sp"] else ("tp" if world_size > 1 else "none")
            row = dict(row, saved=max(saved), saved_min=min(saved), mode=mode,
                       korthikanti=korthikanti(TOKENS, args.batch_size, DIM, HEADS, world_size, mode),
                       ours=ours(TOKENS, args.batch_size, DIM, world_size, mode))
            rows.append(row)
            print(f"T={world_size} {mode:4}  saved {row['saved'] / 2**20:6.2f} MiB/rank (Korthikanti fp16: "
                  f"{row['korthikanti'] / 2**20:5.2f}, for this block {row['ours'] / 2**20:5.2f})  {row['calls']} collectives, "
                  f"{row['ring_bytes'] / 2**20:5.2f} "
                  f"MiB by ring  {args.depth} blocks fwd+bwd {row['median_ms']:.1f} ms "
                  f"({row['min_ms']:.1f}-{row['max_ms']:.1f})", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "sequence_parallel.csv")
    fields = ["T", "mode", "saved", "saved_min", "korthikanti", "ours", "calls", "ring_bytes", "median_ms", "min_ms", "max_ms"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
    plot(rows, args, os.path.join(args.out, "sequence_parallel.png"))


def plot(rows, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for mode, label, marker in (("tp", "tensor parallel", "o"), ("sp", "tensor + sequence parallel", "s")):
        points = sorted((r["T"], r["saved"]) for r in rows if r["mode"] in (mode, "none"))
        formula = sorted((r["T"], r["korthikanti"]) for r in rows if r["mode"] in (mode, "none"))
        counted = sorted((r["T"], r["ours"]) for r in rows if r["mode"] in (mode, "none"))
        line, = ax.plot([t for t, _ in points], [v / 2**20 for _, v in points], marker=marker, label=f"{label}, measured")
        ax.plot([t for t, _ in formula], [v / 2**20 for _, v in formula], linestyle="--", color=line.get_color(),
                label=f"{label}: sbh(34 + 5as/h) divided as Korthikanti et al. (fp16, dropout)")
        ax.plot([t for t, _ in counted], [v / 2**20 for _, v in counted], linestyle=":", color=line.get_color(),
                label=f"{label}: their count for this block (fp32, no dropout, no s x s)")
    ax.set_xlabel("tensor-parallel size T")
    ax.set_ylabel("saved activations per rank (MiB)")
    ax.set_xticks(sorted({r["T"] for r in rows}))
    ax.set_title(f"one ViT block, b={args.batch_size} s={TOKENS} h={DIM} a={HEADS}, fp32")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
