"""What a resume on another number of ranks costs: save on N ranks, load on M (Task 8.3/8.4, and DCP).

    torchrun --standalone --nproc_per_node=4 benchmarks/reshard_bench.py save --dir runs/reshard
    torchrun --standalone --nproc_per_node=2 benchmarks/reshard_bench.py load --dir runs/reshard

The CNN of models.py (0.28M parameters) with AdamW after one step, so the state is three times the
parameters. `save` writes it three ways: --shard full (Task 7's FSDP, solutions/, one file a rank
under DIR/full), --shard optimizer (Task 6's ShardedOptimizer, DIR/optimizer), and PyTorch's
fully_shard with torch.distributed.checkpoint (DIR/dcp). `load` builds the same training on this
run's number of ranks and times the resume of each (the slowest rank's, after a barrier; the
median of --repeats), and prints, for ours, how many old files rank 0 opened and how many bytes it
read. docs/task8-checkpoints.md shows a result.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models import CNN  # noqa: E402
from solutions import template_checkpoint as ckpt  # noqa: E402
from solutions.template_fsdp import FSDP  # noqa: E402
from solutions.template_zero import ShardedOptimizer  # noqa: E402
from bench_common import exit_without_teardown  # noqa: E402  (beside this file)


def build(kind):
    torch.manual_seed(0)
    model = CNN()
    if kind == "full":
        model = FSDP(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    if kind == "optimizer":
        return model, ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    from torch.distributed.fsdp import fully_shard
    for module in model.modules():
        if module is not model and any(True for _ in module.parameters(recurse=False)):
            fully_shard(module)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def one_step(model, optimizer, kind):
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    F.cross_entropy(model(x), y).backward()
    if kind == "full":
        model.finish_gradient_synchronization()
    elif kind == "optimizer":
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()
    optimizer.step()


def dcp_state(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        result = fn()
        dist.barrier()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    return statistics.median(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["save", "load"], help="save on this many ranks, or load")
    parser.add_argument("--dir", required=True, help="where the checkpoints are")
    parser.add_argument("--repeats", type=int, default=5, help="timings per figure, the median is shown (default: 5)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    import torch.distributed.checkpoint as dcp
    for kind in ("full", "optimizer", "dcp"):
        model, optimizer = build(kind)
        folder = os.path.join(args.dir, kind)
        if args.action == "save":
            one_step(model, optimizer, kind)
            if rank == 0:
                os.makedirs(folder, exist_ok=True)
            dist.barrier()
            if kind == "dcp":
                seconds, _ = timed(lambda: dcp.save(dcp_state(model, optimizer), checkpoint_id=folder), args.repeats)
            else:
                seconds, _ = timed(lambda: ckpt.save_sharded(folder, model, optimizer, 0, 1, {"world_size": world_size}),
                                   args.repeats)
            if rank == 0:
                print(f"{kind:9s} saved on {world_size} ranks in {seconds * 1000:.0f} ms", flush=True)
            continue
        if kind == "dcp":
            def load():
                state = dcp_state(model, optimizer)
                dcp.load(state, checkpoint_id=folder)
                from torch.distributed.checkpoint.state_dict import set_state_dict
                set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
            seconds, _ = timed(load, args.repeats)
            read = ""
        else:
            def load():
                opened, _ = ckpt.open_sharded(folder, model, optimizer)
                opened.apply()
                return opened
            seconds, opened = timed(load, args.repeats)
            read = (f": rank 0 opened {len(opened.ranks)} of {opened.meta['world_size']} files, read "
                    f"{opened.bytes_read / 1e6:.2f} of {opened.bytes_total / 1e6:.2f} MB")
        if rank == 0:
            print(f"{kind:9s} loaded on {world_size} ranks in {seconds * 1000:.0f} ms{read}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
