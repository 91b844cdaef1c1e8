"""What expert parallelism sends, costs and balances (Task 16, docs/task16-experts.md).

    python benchmarks/experts_bench.py --quick            # fewer steps and repeats: a few minutes
    python benchmarks/experts_bench.py                    # the page's figures (--update-results to keep them)

Three measurements, all with solutions/template_experts.py on gloo ranks of this machine:

bytes   the ViT's MoE layer (dim 64, 4 x 64 hidden, E experts, k = 2) on --batch images a rank (64 tokens
        each), N = 2 and 4 ranks, expert parallel: every all_to_all_single recorded (its split sizes), the
        bytes a rank sends to OTHER ranks per direction (dispatch, combine, their two backward ones and the
        count exchange), against tokens * k * dim * (N - 1) / N * 4 bytes, what an even routing without
        drops sends; capacity_factor 1.25 (the default) and 0.5 (drops). Over --repeats batches.
time    a training step (forward, backward, gradient sync, SGD) of the MoE ViT (E = 4, k = 2) on 4 ranks,
        --batch images each: experts spread (--ep 2 and --ep 4: template_experts' parallelize_moe and
        sync_moe_gradients) against every rank holding all experts (every gradient averaged in one
        all-reduce of one flat buffer, as sync_moe_gradients averages the non-expert ones) and against
        the dense ViT of the same active parameters (each MoE block's MLP one MLP of k x 256 hidden
        features). Median of --steps after 2 warm-up steps, --repeats runs in rotated order.
load    one process trains the MoE ViT (E = 4, k = 2, capacity 1.25) for --load-steps SGD steps of 64
        synthetic images, with --moe-aux-weight 0, 0.01 and 0.1: the share of token choices dropped and the
        busiest expert's load over the mean (the worst of the 2 MoE layers), every step; 2 seeds each.

Writes experts_bytes.csv, experts_time.csv, experts_load.csv and experts_params.csv under --out
(runs/benchmarks/, or benchmarks/results/ with --update-results), and prints the summaries the page shows.
"""
import argparse
import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from bench_common import add_output_arguments, output_folder, run_ranks  # noqa: E402  (beside this file)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="images per rank per step (default: 16)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run (default: 8)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (default: 3)")
    parser.add_argument("--load-steps", type=int, default=120, help="training steps of the load figure (default: 120)")
    parser.add_argument("--quick", action="store_true", help="--steps 4 --repeats 2 --load-steps 40")
    parser.add_argument("--only", choices=["bytes", "time", "load"], help="one measurement only")
    add_output_arguments(parser, "experts_*.csv")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    if args.quick:
        args.steps, args.repeats, args.load_steps = 4, 2, 40
    return args


# ----------------------------------------------------------------------------- bytes
def measure_bytes(rank, world_size, batch, repeats):
    """Rank 0's off-rank bytes per direction of one MoE layer's forward and backward, per batch and setting
    (E = 4, 8; capacity_factor 0.5, 1.25), and its parameter bytes with E / N experts against all E."""
    import torch
    import torch.distributed as dist

    import models
    from solutions import template_experts as ep

    sent = []  # (what, bytes to other ranks) of each all_to_all_single, in order
    real = dist.all_to_all_single

    def recording(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        rows = input_split_sizes or [input.shape[0] // world_size] * world_size
        row_bytes = input[0].numel() * input.element_size() if input.shape[0] else 0
        sent.append((input.dtype, (sum(rows) - rows[rank]) * row_bytes))
        return real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    dist.all_to_all_single = recording
    rows = []
    for num_experts, capacity_factor, repeat in [(e, c, r) for e in (4, 8) for c in (0.5, 1.25) for r in range(repeats)]:
        torch.manual_seed(0)
        moe = models.MoE(64, 256, num_experts, 2, capacity_factor)
        whole = sum(p.numel() * p.element_size() for p in moe.parameters())
        layer = ep.ExpertParallelMoE.from_moe(moe)
        del moe
        mine = sum(p.numel() * p.element_size() for p in layer.parameters())
        g = torch.Generator().manual_seed(100 * repeat + rank)
        x = torch.randn(batch, 64, 64, generator=g).requires_grad_()
        sent.clear()
        layer(x).square().sum().backward()
        counts, tokens = [b for d, b in sent if not d.is_floating_point], [b for d, b in sent if d.is_floating_point]
        even = batch * 64 * 2 * 64 * (world_size - 1) / world_size * 4  # tokens * k * dim * (N-1)/N, float32
        rows.append(dict(ranks=world_size, experts=num_experts, capacity_factor=capacity_factor, repeat=repeat,
                         count_bytes=sum(counts), dispatch=tokens[0], combine=tokens[1],
                         backward=" ".join(str(b) for b in tokens[2:]), even=even,
                         dispatch_ratio=tokens[0] / even, combine_ratio=tokens[1] / even,
                         params_mine=mine, params_whole=whole))
    dist.all_to_all_single = real
    return rows


def bytes_figures(args):
    rows = []
    for world_size in (2, 4):
        rows += run_ranks(world_size, measure_bytes, args.batch, args.repeats)
    write(args, "experts_bytes.csv", rows)
    print(f"bytes one rank sends to the others per MoE layer, {args.batch} images x 64 tokens, k = 2, dim 64 "
          "(ratio to tokens * k * dim * (N-1)/N * 4 bytes; min-max over the batches):")
    for key in sorted({(r["ranks"], r["experts"], r["capacity_factor"]) for r in rows}):
        mine = [r for r in rows if (r["ranks"], r["experts"], r["capacity_factor"]) == key]
        ratios = [r["dispatch_ratio"] for r in mine]
        print(f"  N={key[0]} E={key[1]} capacity {key[2]}: dispatch {statistics.median(r['dispatch'] for r in mine):,.0f} B "
              f"(ratio {statistics.median(ratios):.3f}, {min(ratios):.3f}-{max(ratios):.3f}), combine ratio "
              f"{statistics.median(r['combine_ratio'] for r in mine):.3f}, counts {mine[0]['count_bytes']} B; "
              f"parameters {mine[0]['params_mine']:,} of {mine[0]['params_whole']:,} B")
    return rows


# ----------------------------------------------------------------------------- time
def dense_vit(top_k):
    """The ViT whose MoE blocks have one MLP of top_k x 256 hidden features: the MoE's active parameters."""
    import models

    vit = models.ViT()
    for i, block in enumerate(vit.blocks):
        if (i + 1) % 2 == 0:
            block.mlp = models.MLP(64, 256 * top_k)
    return vit


def time_steps(rank, world_size, variant, batch, steps, seed):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import models
    from solutions import template_experts as ep
    from solutions.template_trainer import broadcast_parameters
    from strategies.base import average_flat

    torch.manual_seed(seed)
    model = dense_vit(2) if variant == "dense" else models.ViT(num_experts=4 if variant != "dense" else 0)
    broadcast_parameters(model, src=0)
    size = {"ep2": 2, "ep4": 4}.get(variant)
    if size:
        ep_group, dp_group = ep.expert_parallel_groups(size)
        ep.parallelize_moe(model, ep_group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(seed * 100 + rank)
    images, labels = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
    times = []
    for step in range(steps + 2):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels) + 0.01 * model.aux_loss()
        loss.backward()
        if size:
            ep.sync_moe_gradients(model, ep_group, dp_group)
        else:  # one all-reduce of every gradient, as sync_moe_gradients' non-expert one
            average_flat(model, dist.all_reduce, world_size)
        optimizer.step()
        dist.barrier()
        if step >= 2:
            times.append(time.perf_counter() - start)
    return dict(variant=variant, seed=seed, step_seconds=statistics.median(times),
                params=sum(p.numel() for p in model.parameters()))


VARIANTS = ["all", "ep2", "ep4", "dense"]


def time_rotated(rank, world_size, batch, steps, repeat):
    """Every variant once, in an order rotated by the repeat: a burst of load elsewhere hits each in turn."""
    order = VARIANTS[repeat % len(VARIANTS):] + VARIANTS[:repeat % len(VARIANTS)]
    return [time_steps(rank, world_size, variant, batch, steps, repeat) for variant in order]


def time_figures(args):
    rows = []
    for repeat in range(args.repeats):
        rows += run_ranks(4, time_rotated, args.batch, args.steps, repeat)
    write(args, "experts_time.csv", rows)
    print(f"step time on 4 ranks, {args.batch} images a rank (median of {args.steps} steps; min-max over "
          f"{args.repeats} runs):")
    for variant in VARIANTS:
        mine = [r["step_seconds"] for r in rows if r["variant"] == variant]
        params = next(r["params"] for r in rows if r["variant"] == variant)
        print(f"  {variant:6s} {statistics.median(mine) * 1000:7.1f} ms ({min(mine) * 1000:.1f}-{max(mine) * 1000:.1f}), "
              f"{params:,} parameters on a rank")
    return rows


# ----------------------------------------------------------------------------- load
def load_run(aux_weight, seed, steps):
    """(step, dropped share, busiest / mean) rows of one single-process training run."""
    import torch
    import torch.nn.functional as F

    import models
    from data import synthetic_cifar

    torch.set_num_threads(1)
    train, _ = synthetic_cifar(seed=0, train_samples=64 * steps, test_samples=1)
    images, labels = train.tensors
    torch.manual_seed(seed)
    vit = models.ViT(num_experts=4, top_k=2)
    layers = [m for m in vit.modules() if isinstance(m, models.MoE)]
    seen = {}
    for index, layer in enumerate(layers):
        layer.register_forward_hook(lambda m, inputs, out, index=index: seen.__setitem__(index, inputs[0]))
    optimizer = torch.optim.SGD(vit.parameters(), lr=0.05, momentum=0.9)
    rows = []
    for step in range(steps):
        x, y = images[step * 64:(step + 1) * 64], labels[step * 64:(step + 1) * 64]
        optimizer.zero_grad()
        loss = F.cross_entropy(vit(x), y) + aux_weight * vit.aux_loss()
        dropped, busiest = 0.0, 0.0
        with torch.no_grad():  # this forward's routing: the router before the step
            for index, layer in enumerate(layers):
                tokens = seen[index].reshape(-1, 64)
                routing = models.route(layer.router(tokens), 2, 1.25)
                load = torch.bincount(routing.expert.reshape(-1), minlength=4).double()
                dropped += (~routing.kept).double().mean().item() / len(layers)
                busiest = max(busiest, (load.max() / load.mean()).item())
        loss.backward()
        optimizer.step()
        rows.append(dict(aux_weight=aux_weight, seed=seed, step=step, loss=loss.item(), dropped=dropped,
                         busiest=busiest))
    return rows


AUX_WEIGHTS = (0.0, 0.01, 0.1)


def load_figures(args):
    rows = []
    for seed in (0, 1):
        for aux_weight in AUX_WEIGHTS:
            rows += load_run(aux_weight, seed, args.load_steps)
    write(args, "experts_load.csv", rows)
    last = max(1, args.load_steps // 4)
    print(f"routing over {args.load_steps} steps of 64 images (E = 4, k = 2, capacity 1.25), one process; "
          f"means over the first and the last {last} steps, each seed:")
    for aux_weight in AUX_WEIGHTS:
        for seed in (0, 1):
            mine = [r for r in rows if r["aux_weight"] == aux_weight and r["seed"] == seed]
            first, end = mine[:last], mine[-last:]
            print(f"  aux weight {aux_weight}: seed {seed}: dropped {statistics.mean(r['dropped'] for r in first):.1%} -> "
                  f"{statistics.mean(r['dropped'] for r in end):.1%}, busiest expert "
                  f"{statistics.mean(r['busiest'] for r in first):.2f} -> {statistics.mean(r['busiest'] for r in end):.2f}"
                  f"x the mean, loss {statistics.mean(r['loss'] for r in first):.3f} -> "
                  f"{statistics.mean(r['loss'] for r in end):.3f}")
    return rows


def write(args, name, rows):
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    if args.only in (None, "bytes"):
        bytes_figures(args)
    if args.only in (None, "time"):
        time_figures(args)
    if args.only in (None, "load"):  # last: it runs torch in this process, which the forked ranks must not inherit
        load_figures(args)
    print(f"({time.perf_counter() - start:.0f} s; CSVs in {args.out})")


if __name__ == "__main__":
    main()
