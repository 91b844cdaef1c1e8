"""What tensor parallelism saves and costs: the CNN's classifier bytes per rank, and the step time.

    python benchmarks/parallel_bench.py                 # tp = 1, 2, 4 and DDP on 1, 2, 4 ranks (a minute or two)
    python benchmarks/parallel_bench.py --ranks 1,2 --steps 5

For each number of ranks N it starts N gloo processes on this machine; each trains a few AdamW
steps of the course CNN on the same global batch with two strategies in turn:

    tp    Task 9's tensor parallelism (solutions/template_tensor_parallel.py): classifier[1]
          column-parallel, classifier[3] row-parallel over all N ranks; every rank reads the
          whole global batch (tensor-parallel peers read the same batch) and runs the
          convolutions whole
    ddp   DistributedDataParallel: the whole model on every rank, 1/N of the global batch each

The bytes are counted after a step: the classifier's parameters (this rank's slices), their
.grad and AdamW's state for them (exp_avg, exp_avg_sq), and the same for the whole model. The
step time (forward, backward, synchronisation, AdamW step) is the median over --steps steps of the
slowest rank, after a warm-up step, the two strategies taking turns step by step so that load
from elsewhere hits them alike. Also counted: the bytes each rank all-reduces per step (tp: recorded;
ddp: its gradients, which its buckets carry), and for tp the time a rank waits inside them (the
median over the steps, of rank 0).
Writes benchmarks/results/parallel_cnn.csv (or under --out).
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
from models import CNN  # noqa: E402
from bench_common import add_output_arguments, output_folder, run_ranks  # noqa: E402  (beside this file)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated numbers of ranks (default: 1,2,4)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per strategy (default: 10)")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="the GLOBAL batch (default: 256; DDP gives each rank 1/N of it, tp every rank all of it)")
    add_output_arguments(parser, "the CSV")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    return args


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


class WireCount:
    """Counts the bytes this process all-reduces (the rank's own tensors, as the alpha-beta model's S),
    and the time spent waiting in those all-reduces."""

    def __init__(self):
        self.bytes, self.calls, self.seconds = 0, 0, 0.0
        original = dist.all_reduce

        def counted(tensor, *args, **kwargs):
            self.bytes += tensor.numel() * tensor.element_size()
            self.calls += 1
            start = time.perf_counter()
            try:
                return original(tensor, *args, **kwargs)  # blocking here (tp's f and g do not pass async_op)
            finally:
                self.seconds += time.perf_counter() - start
        dist.all_reduce = counted


def build(strategy, world_size):
    torch.manual_seed(0)
    model = CNN()
    if strategy == "tp":
        from solutions.template_tensor_parallel import parallelize_classifier
        model = parallelize_classifier(model, None)  # every rank built the same model: nothing to broadcast
        wrapped = model
    else:
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(model, gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    return model, wrapped, optimizer


def rank_main(rank, world_size, steps, batch_size):
    """This rank's rows (bench_common.run_ranks returns rank 0's)."""
    wire = WireCount()
    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g)
    built = {strategy: build(strategy, world_size) for strategy in ("tp", "ddp")}
    times = {strategy: [] for strategy in built}
    waits = {strategy: [] for strategy in built}  # seconds inside dist.all_reduce (tp's f and g; DDP's are in C++)
    wire_bytes = {}
    for step in range(steps + 1):  # step 0 warms up
        for strategy, (model, wrapped, optimizer) in built.items():
            x, y = (images, labels) if strategy == "tp" else (images.chunk(world_size)[rank], labels.chunk(world_size)[rank])
            dist.barrier()
            wire.bytes = wire.calls = 0
            wire.seconds = 0.0
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=False)
            F.cross_entropy(wrapped(x), y).backward()
            optimizer.step()
            elapsed = torch.tensor([time.perf_counter() - start])
            waited = wire.seconds  # before the timing's own all-reduce below
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step
            wire_bytes[strategy] = (wire.bytes, wire.calls - 1)  # less the timing's own all-reduce
            if step:
                times[strategy].append(elapsed.item())
                waits[strategy].append(waited)
    rows = []
    for strategy, (model, _, optimizer) in built.items():
        classifier = [p for name, p in model.named_parameters() if name.startswith("classifier")]
        everything = list(model.parameters())

        def held(params):
            state = [t for p in params for t in optimizer.state[p].values() if torch.is_tensor(t) and t.dim() > 0]
            return nbytes(params), nbytes(p.grad for p in params), nbytes(state)
        params, grads, state = held(classifier)
        model_params, model_grads, model_state = held(everything)
        if strategy == "ddp":  # DDP's reducer all-reduces its gradient buckets in C++, unseen by WireCount
            wire_bytes[strategy] = (model_grads if world_size > 1 else 0, "buckets")
        rows.append(dict(strategy=strategy, ranks=world_size, global_batch=batch_size,
                         classifier_param_bytes=params, classifier_grad_bytes=grads, classifier_adamw_bytes=state,
                         classifier_total_bytes=params + grads + state,
                         model_total_bytes=model_params + model_grads + model_state,
                         all_reduce_bytes_per_step=wire_bytes[strategy][0],
                         all_reduces_per_step=wire_bytes[strategy][1],
                         step_seconds=statistics.median(times[strategy]),
                         all_reduce_seconds=statistics.median(waits[strategy]) if strategy == "tp" else ""))
    return rows


def main():
    args = parse_args()
    rows = []
    for world_size in (int(n) for n in args.ranks.split(",")):
        print(f"{world_size} ranks ...", flush=True)
        rows += run_ranks(world_size, rank_main, args.steps, args.batch_size)
    single = next(r for r in rows if r["strategy"] == "ddp" and r["ranks"] == 1) if any(
        r["ranks"] == 1 for r in rows) else None
    ddp_time = {r["ranks"]: r["step_seconds"] for r in rows if r["strategy"] == "ddp"}
    for row in rows:
        whole = single["classifier_total_bytes"] if single else None
        row["classifier_vs_one_nth"] = row["classifier_total_bytes"] / (whole / row["ranks"]) if whole else float("nan")
        row["step_vs_ddp"] = row["step_seconds"] / ddp_time[row["ranks"]]
    print(f"\nglobal batch {args.batch_size}; classifier = its parameters + gradients + AdamW state, per rank")
    print(f"{'N':>2} {'strategy':>8} {'classifier MiB':>15} {'vs 1/N':>7} {'model MiB':>10} "
          f"{'all-reduced/step':>17} {'calls':>6} {'in them ms':>10} {'step ms':>8} {'vs ddp':>7}")
    for r in rows:
        print(f"{r['ranks']:>2} {r['strategy']:>8} {r['classifier_total_bytes'] / 2**20:15.3f} "
              f"{r['classifier_vs_one_nth']:7.2f} {r['model_total_bytes'] / 2**20:10.3f} "
              f"{r['all_reduce_bytes_per_step'] / 2**20:14.2f} MiB {r['all_reduces_per_step']:>6} "
              f"{(r['all_reduce_seconds'] * 1e3 if r['all_reduce_seconds'] != '' else float('nan')):10.1f} "
              f"{r['step_seconds'] * 1e3:8.1f} {r['step_vs_ddp']:7.2f}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "parallel_cnn.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
