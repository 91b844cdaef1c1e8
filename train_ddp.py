"""Train the CIFAR-10 CNN with data parallelism.

    python train_ddp.py                                       # one process: a world of one
    torchrun --standalone --nproc_per_node=2 train_ddp.py     # 2 processes on CPUs (gloo)
    torchrun --standalone --nproc_per_node=gpu train_ddp.py   # one process per GPU (NCCL)
    torchrun --standalone --nproc_per_node=2 train_ddp.py --impl solutions --data synthetic
    torchrun --standalone --nproc_per_node=2 train_ddp.py --allreduce ring   # Task 3's all-reduce
    torchrun --standalone --nproc_per_node=2 train_ddp.py --sync overlap --accumulate 2  # Task 5's DDP
    torchrun --standalone --nproc_per_node=2 train_ddp.py --sync overlap --profile runs/profile
    torchrun --standalone --nproc_per_node=2 train_ddp.py --shard optimizer --optimizer adamw   # Task 6
    torchrun --standalone --nproc_per_node=2 train_ddp.py --shard full --optimizer adamw        # Task 7
    sbatch submit.sh                                          # several nodes under SLURM (docs/clusters.md)
    torchrun --standalone --nproc_per_node=2 --max-restarts=3 train_ddp.py --checkpoint-dir runs/ckpt
                                        # survives a killed rank (docs/task8-checkpoints.md)

--impl template (the default) trains with your template_*.py files, --impl solutions with
the reference answers in solutions/, and --impl ddp with PyTorch's own
DistributedDataParallel and DistributedSampler, the production baseline to compare with.
Every epoch rank 0 prints the losses, the global test accuracy, the throughput and the
share of step time spent synchronising gradients, and writes them to --metrics.
"""
import argparse
import csv
import datetime
import importlib
import os
import re
import runpy
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset

from data import get_datasets
from models import CNN

TASK_FILES = ["template_data_loader.py", "template_trainer.py"]
PROGRESS = {"epoch": 0, "step": 0}  # where training is, for the one line printed on Ctrl-C
MAIN_PID = os.getpid()  # DataLoader workers are forked from this process, signal handlers and all


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=["template", "solutions", "ddp"], default="template",
                        help="template: your template_*.py files; solutions: solutions/; "
                        "ddp: PyTorch's DistributedDataParallel and DistributedSampler (default: template)")
    parser.add_argument("--data", choices=["auto", "cifar10", "synthetic"], default="auto",
                        help="auto: CIFAR-10 if it is on disk or can be downloaded, else synthetic "
                        "with a notice; cifar10: CIFAR-10 or an error; synthetic: offline data (default: auto)")
    parser.add_argument("--data-dir", default="data", help="where CIFAR-10 is or goes (default: data)")
    parser.add_argument("--epochs", type=int, default=5, help="passes over the training set (default: 5)")
    parser.add_argument("--batch-size", type=int, default=512,
                        help="the GLOBAL batch, split evenly over the ranks (default: 512)")
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate (default: 0.05 with sgd, 0.001 with adamw)")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                        help="sgd: SGD with --momentum; adamw: AdamW (default: sgd)")
    parser.add_argument("--shard", choices=["none", "optimizer", "full"], default="none",
                        help="none: every rank holds all the state; optimizer: Task 6's ShardedOptimizer "
                        "(ZeRO-1); full: Task 7's FSDP, or PyTorch's fully_shard with --impl ddp (default: none)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the model, the shuffling and the synthetic data (default: 0)")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default=None,
                        help="process-group backend (default: nccl with GPUs, gloo without)")
    parser.add_argument("--workers", type=int, default=None,
                        help="DataLoader worker processes per rank (default: 0 on CPUs, 2 on GPUs)")
    parser.add_argument("--train-samples", type=int, default=None,
                        help="use only the first N training images, for quick runs (default: all)")
    parser.add_argument("--test-samples", type=int, default=None,
                        help="use only the first N test images (default: all)")
    parser.add_argument("--allreduce", choices=["torch", "naive", "ring"], default="torch",
                        help="the all-reduce that averages the gradients: torch: dist.all_reduce, in Task 2.2's "
                        "average_gradients; naive or ring: Task 3's naive_all_reduce or ring_all_reduce from "
                        "template_allreduce.py (solutions/ with --impl solutions) (default: torch)")
    parser.add_argument("--sync", choices=["after-backward", "overlap"], default="after-backward",
                        help="after-backward: Task 2.2's averaging once backward is done; overlap: Task 5's DDP "
                        "(template_ddp.py), all-reducing buckets while backward runs (default: after-backward)")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="--sync overlap: the bucket size in MB; 0: one bucket per parameter (default: 25)")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="split each rank's batch into K micro-batches whose gradients add up before one "
                        "optimizer step; the first K-1 run inside no_sync() with --sync overlap and --impl ddp "
                        "(default: 1)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="profile 3 steps of the first epoch on rank 0: DIR/trace.json (chrome://tracing or "
                        "ui.perfetto.dev) and DIR/timeline.png, backward beside the all-reduces (default: off)")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds a collective waits for the other ranks before failing: "
                        "how long a hang lasts (default: 300)")
    parser.add_argument("--metrics", default="runs/metrics.csv",
                        help="CSV file that rank 0 writes the per-epoch figures to (default: runs/metrics.csv)")
    parser.add_argument("--no-plot", action="store_true",
                        help="do not draw the metrics as a PNG beside the CSV (same name, .png) at the end")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="rank 0 saves a checkpoint here after every epoch (last.pt, previous.pt), and a run "
                        "that finds one resumes from it, also after a torchrun restart (default: no checkpoints)")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help="with --checkpoint-dir, also save every N optimizer steps, so that a failure loses at "
                        "most N steps; SIGUSR1 saves at the next step and stops (default: at epoch ends only)")
    return parser.parse_args(argv)


def unfilled_task(impl, files=TASK_FILES, root=None):
    """The first 'Task X.Y' whose TODO still raises NotImplementedError, or None. `files`:
    file names, or (file name, function) where training uses only that function of the file."""
    if impl != "template":
        return None
    root = root or os.path.dirname(os.path.abspath(__file__))
    for name in files:
        name, function = name if isinstance(name, tuple) else (name, None)
        with open(os.path.join(root, name)) as f:
            text = f.read()
        if function:  # from its def to the next top-level def
            text = re.split(r"\n(?=def |class )", text[text.index(f"\ndef {function}(") + 1:])[0]
        found = re.search(r'raise NotImplementedError\("(Task \d+\.\d+)', text)
        if found:
            return found.group(1), name
    return None


def stop_on_interrupt(signum, frame):
    """Ctrl-C (SIGINT), or SIGTERM from torchrun or SLURM passing one on: one line, exit code 130.

    Exits at once, without unwinding: a traceback per rank would bury the line, and leaving
    the process group politely can wait on ranks that are already gone."""
    if os.getpid() != MAIN_PID:  # a DataLoader worker: it stops quietly, as PyTorch's workers do
        raise KeyboardInterrupt
    tag = f"[rank {os.environ['RANK']}] " if "RANK" in os.environ else ""
    where = f"epoch {PROGRESS['epoch']} step {PROGRESS['step']}" if PROGRESS["epoch"] else "start-up"
    sys.stdout.flush()
    clear = "\r\x1b[K" if sys.stderr.isatty() else ""  # over rank 0's progress bar, if it draws one
    os.write(2, f"{clear}{tag}interrupted at {where}\n".encode())  # one write: the ranks' lines do not interleave
    os._exit(130)


class Counted:
    """The training loader, counting the steps of the epoch for PROGRESS, and telling a
    profiler (--profile) where each step ends, for its wait/warmup/active schedule."""

    def __init__(self, loader, profiler=None):
        self.loader, self.profiler = loader, profiler

    def __getattr__(self, name):  # batch_size, sampler, ...: the loader's own
        return getattr(self.loader, name)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for step, batch in enumerate(self.loader, 1):
            PROGRESS["step"] = step
            yield batch
            if self.profiler:
                self.profiler.step()


def first_n(dataset, n):
    return dataset if n is None or n >= len(dataset) else Subset(dataset, range(n))


def ddp_loaders(train_set, test_set, batch_size, rank, world_size, seed, workers, device, reference):
    """Loaders for --impl ddp: PyTorch's DistributedSampler for training. It hands rank r the
    indices [r::world_size] of the epoch's order, so step k trains, over all ranks, on positions
    [k*B, (k+1)*B) of it: the same global batches as build_loaders gives (unless padding adds a
    step). Evaluation keeps the unpadded sampler, because PyTorch's pads the test set and
    counts some images twice."""
    from torch.utils.data import DistributedSampler

    pin_memory = device.type == "cuda"
    sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=seed)
    train_loader = DataLoader(train_set, batch_size=batch_size // world_size, sampler=sampler, drop_last=True,
                              num_workers=workers, pin_memory=pin_memory)
    _, test_loader = reference.build_loaders(train_set, test_set, batch_size, rank, world_size, seed, workers, device)
    return train_loader, test_loader


def average_gradients_with(name, impl):
    """Task 2.2's averaging, with Task 3's naive or ring all-reduce in place of dist.all_reduce.

    All gradients travel as one flat buffer, as in DDP's buckets: a hand-made collective
    pays its per-message latency (2(N-1) messages for the ring) once per step, not once
    per parameter. With 2 ranks the sums are a + b whatever the algorithm, so training
    gives bit-identical results with --allreduce torch, naive or ring."""
    package = "solutions." if impl == "solutions" else ""
    all_reduce = getattr(importlib.import_module(package + "template_allreduce"), name + "_all_reduce")

    def sync_gradients(model):
        grads = [param.grad for param in model.parameters() if param.grad is not None]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        all_reduce(flat)
        flat /= dist.get_world_size()
        for grad, mean in zip(grads, flat.split([grad.numel() for grad in grads])):
            grad.copy_(mean.view_as(grad))
    return sync_gradients


def optimizer_class(args):
    """The optimizer class and its keyword arguments, from --optimizer, --lr and --momentum."""
    if args.optimizer == "adamw":
        return torch.optim.AdamW, {"lr": 0.001 if args.lr is None else args.lr}
    return torch.optim.SGD, {"lr": 0.05 if args.lr is None else args.lr, "momentum": args.momentum}


def sharded_optimizer(impl, model, optimizer_cls, optimizer_kwargs):
    """--shard optimizer: Task 6's ShardedOptimizer, or PyTorch's ZeroRedundancyOptimizer with --impl ddp.

    Each rank keeps the optimizer state of its shard of the parameters only; the gradients are
    still averaged whole, by Task 2.2 (or DDP) before step(), which then shares the updated shards."""
    if impl == "ddp":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_cls, **optimizer_kwargs)
    zero = importlib.import_module(("solutions." if impl == "solutions" else "") + "template_zero")
    return zero.ShardedOptimizer(model.parameters(), optimizer_cls, **optimizer_kwargs)


def check_sync_flags(args):
    """Task 5's flags: one clear line for a combination that cannot work."""
    if args.sync == "overlap" and args.impl == "ddp":
        raise ValueError("--sync overlap trains with Task 5's DDP (template_ddp.py), and --impl ddp brings "
                         "PyTorch's own: use --impl template or solutions with --sync overlap")
    if args.sync == "overlap" and args.allreduce != "torch":
        raise ValueError("--sync overlap all-reduces buckets with dist.all_reduce inside Task 5's DDP: "
                         "--allreduce naive/ring works with --sync after-backward only")
    if args.accumulate < 1:
        raise ValueError(f"--accumulate {args.accumulate}: the number of micro-batches per step must be 1 or more")
    if args.bucket_mb < 0:
        raise ValueError(f"--bucket-mb {args.bucket_mb}: a bucket size is 0 (one bucket per parameter) or more")


def finish_gradient_synchronization(model):
    """--sync overlap: wait for the buckets that backward launched (Task 5.4); --shard full: for
    the reduce-scatters (Task 7)."""
    model.finish_gradient_synchronization()


def start_profiler(directory, device):
    """A torch.profiler that skips 2 steps, warms up 1, records 3 and writes DIR/trace.json and DIR/timeline.png."""
    from tools.timeline import plot_timeline

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "trace.json")

    def write(profiler):
        profiler.export_chrome_trace(path)
        plot_timeline(path, os.path.join(directory, "timeline.png"))

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities, on_trace_ready=write,
                                      schedule=torch.profiler.schedule(wait=2, warmup=1, active=3, repeat=1))
    profiler.start()
    return profiler


def shard_fully(model, impl, package):
    """--shard full: Task 7's FSDP, or with --impl ddp PyTorch's fully_shard, one unit per module
    that holds parameters, as ours. Returns the model and what runs between backward and step."""
    if impl == "ddp":
        from torch.distributed.fsdp import fully_shard
        with torch.no_grad():  # fully_shard does not broadcast (DDP and our FSDP do): start from rank 0's model
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor, src=0)
        for module in model.modules():
            if module is not model and any(True for _ in module.parameters(recurse=False)):
                fully_shard(module)
        return fully_shard(model), None  # fully_shard reduce-scatters during backward
    fsdp_lib = importlib.import_module(package + "template_fsdp")
    return fsdp_lib.FSDP(model), finish_gradient_synchronization


def full_parameters(model, impl):
    """--shard full: each rank holds shards only, so the bit-identity check compares the whole
    parameters, gathered."""
    if impl == "ddp":
        return [p.full_tensor() for p in model.parameters()]
    return list(model.gather_full_params().values())


def replicas_identical(model, params=None):
    """True on every rank if every rank holds bit-identical parameters (params: default model.parameters())."""
    flat = torch.cat([p.detach().reshape(-1) for p in (model.parameters() if params is None else params)])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    differs = torch.tensor([0 if torch.equal(flat, reference) else 1], device=flat.device)
    dist.all_reduce(differs)
    return differs.item() == 0


def main(args):
    if args.epochs < 1:
        raise ValueError(f"--epochs {args.epochs}: train for at least one epoch")
    if args.impl == "ddp" and args.allreduce != "torch":
        raise ValueError("--allreduce naive/ring replaces dist.all_reduce in our own averaging, and --impl ddp "
                         "averages inside DistributedDataParallel: use --impl template or solutions")
    check_sync_flags(args)
    if args.shard == "full" and args.allreduce != "torch":
        raise ValueError("--shard full reduce-scatters the gradients inside FSDP; --allreduce naive/ring "
                         "replaces an all-reduce it does not use: leave --allreduce at torch")
    if args.shard == "full" and args.sync == "overlap":
        raise ValueError("--shard full reduce-scatters the gradients inside FSDP, and --sync overlap wraps the "
                         "model in Task 5's DDP, which all-reduces them whole: use one of the two")
    needed = [("template_allreduce.py", f"{args.allreduce}_all_reduce")] if args.allreduce != "torch" else []
    task = unfilled_task(args.impl, TASK_FILES + needed + (["template_ddp.py"] if args.sync == "overlap" else [])
                         + (["template_zero.py"] if args.shard == "optimizer" else [])
                         + (["template_fsdp.py"] if args.shard == "full" else [])
                         + (["template_checkpoint.py"] if args.checkpoint_dir else []))
    if task:
        trainer = importlib.import_module("template_trainer")
        trainer.print0(f"{task[0]} in {task[1]} is not done yet, so training with --impl template cannot start.\n"
                       f"Fill it in and check it with:  python check.py {task[0][5:]}\n"
                       "or train with the reference answers:  --impl solutions")
        if int(os.environ.get("RANK", 0)) != 0:
            time.sleep(1)  # torchrun stops every rank when one exits: let rank 0 print first
        return 1
    package = "solutions." if args.impl != "template" else ""
    loader_lib = importlib.import_module(package + "template_data_loader")
    trainer = importlib.import_module(package + "template_trainer")

    timeout = datetime.timedelta(seconds=args.timeout)
    rank, local_rank, world_size, device = trainer.setup_distributed(args.backend, timeout)
    try:
        return train(args, trainer, loader_lib, rank, world_size, device)
    finally:
        trainer.cleanup()


def train(args, trainer, loader_lib, rank, world_size, device):
    print0 = trainer.print0
    workers = args.workers if args.workers is not None else (2 if device.type == "cuda" else 0)
    train_set, test_set, data_name = get_datasets(args.data, args.data_dir, args.seed)
    train_set, test_set = first_n(train_set, args.train_samples), first_n(test_set, args.test_samples)
    if args.impl == "ddp":
        train_loader, test_loader = ddp_loaders(train_set, test_set, args.batch_size, rank, world_size,
                                                args.seed, workers, device, loader_lib)
    else:
        train_loader, test_loader = loader_lib.build_loaders(train_set, test_set, args.batch_size, rank,
                                                             world_size, args.seed, workers, device)
    if len(train_loader) == 0:  # every rank has as many steps, so every rank stops here
        raise ValueError(f"{len(train_set)} training images do not fill one global batch of {args.batch_size}: "
                         "use more --train-samples or a smaller --batch-size")

    # Each rank seeds differently on purpose: only the broadcast (Task 2.1) or DDP's own
    # broadcast makes the replicas start equal, so forgetting it shows.
    torch.manual_seed(args.seed + rank)
    model = CNN().to(device)
    if args.batch_size % (world_size * args.accumulate):
        raise ValueError(f"the global batch {args.batch_size} does not split into {world_size} ranks x "
                         f"{args.accumulate} equal micro-batches: choose a multiple of {world_size * args.accumulate}")
    if args.shard == "full":  # FSDP starts every rank from rank 0's model, as DDP does
        model, sync_gradients = shard_fully(model, args.impl, "solutions." if args.impl != "template" else "")
    elif args.impl == "ddp":
        model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        sync_gradients = None  # DDP averages gradients during backward
    elif args.sync == "overlap":  # Task 5: broadcasts at start, all-reduces buckets during backward
        ddp_lib = importlib.import_module(("solutions." if args.impl == "solutions" else "") + "template_ddp")
        model = ddp_lib.DDP(model, bucket_size_mb=args.bucket_mb or None)
        sync_gradients = finish_gradient_synchronization
    else:
        trainer.broadcast_parameters(model, src=0)
        sync_gradients = trainer.average_gradients
        if args.allreduce != "torch":
            sync_gradients = average_gradients_with(args.allreduce, args.impl)
    optimizer_cls, optimizer_kwargs = optimizer_class(args)
    optimizer = optimizer_cls(model.parameters(), **optimizer_kwargs)
    if args.shard == "optimizer":
        optimizer = sharded_optimizer(args.impl, model, optimizer_cls, optimizer_kwargs)
        print0(f"optimizer: {optimizer_cls.__name__}, its state sharded over the {world_size} ranks "
               f"({type(optimizer).__name__})")
    checkpointer = make_checkpointer(args, model, optimizer, world_size, data_name, device, len(train_loader))
    first_epoch = checkpointer.epochs_done + 1 if checkpointer else 1
    stop_requested = checkpointer.StopRequested if checkpointer else ()  # () catches nothing

    sync_name = "ddp" if args.impl == "ddp" else args.sync
    if args.shard == "full":  # the gradients are reduce-scattered inside backward
        sync_name = "fully_shard" if args.impl == "ddp" else "fsdp"
    print0(f"impl={args.impl} allreduce={args.allreduce} sync={sync_name} "
           f"accumulate={args.accumulate} data={data_name} ({len(train_set)} train / {len(test_set)} test images) "
           f"world_size={world_size} backend={dist.get_backend()} device={device.type} "
           f"global batch={args.batch_size} ({args.batch_size // world_size} per rank) "
           f"steps/epoch={len(train_loader)}")
    rows = []
    for epoch in range(first_epoch, args.epochs + 1):
        train_loader.sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        PROGRESS.update(epoch=epoch, step=0)
        profiler = start_profiler(args.profile, device) if args.profile and rank == 0 and epoch == 1 else None
        batches = checkpointer.batches(train_loader) if checkpointer else train_loader
        try:
            stats = trainer.train_one_epoch(model, Counted(batches, profiler), optimizer, device, sync_gradients, epoch,
                                            accumulate=args.accumulate)
        except stop_requested as stop:  # SIGUSR1: saved, now end cleanly
            print0(stop)
            return 0
        if profiler:
            profiler.stop()
            print0(f"profile of 3 steps on rank 0: {args.profile}/trace.json and {args.profile}/timeline.png")
        if checkpointer:
            checkpointer.end_epoch()
        # the global training loss, from the same reduction as the evaluation counts
        _, samples, loss_sum = trainer.reduce_metrics(0, stats["samples"], stats["loss_sum"], device)
        result = trainer.evaluate(model, test_loader, device)
        sync = (f"sync {stats['sync_seconds'] / stats['seconds']:.0%} of step time" if sync_gradients
                else f"sync overlapped with backward by {'fully_shard' if args.shard == 'full' else 'DDP'}")
        if args.shard == "full" and sync_gradients:  # Task 7 reduce-scatters inside backward, not after it
            sync = f"reduce-scatter inside backward (not timed), {sync}"
        row = {"epoch": epoch, "train_loss": loss_sum / max(samples, 1), "test_loss": result["loss"],
               "test_accuracy": result["accuracy"], "images_per_second": samples / stats["seconds"],
               "sync_share": stats["sync_seconds"] / stats["seconds"] if sync_gradients else "",
               "epoch_seconds": stats["seconds"]}
        rows.append(row)
        print0(f"epoch {epoch}/{args.epochs}  train loss {row['train_loss']:.4f}  test loss {row['test_loss']:.4f}  "
               f"test accuracy {result['accuracy']:.2%} ({result['correct']}/{result['total']})  "
               f"{row['images_per_second']:,.0f} images/s  {sync}  ({stats['seconds']:.1f} s)")
        if rank == 0 and args.metrics:
            write_metrics(args.metrics, rows)

    if rank == 0 and args.metrics and rows and not args.no_plot:
        print0(write_plot(args.metrics, rows, f"--impl {args.impl} --allreduce {args.allreduce}, {data_name}, "
                                              f"{world_size} rank(s), global batch {args.batch_size}"))
    same = replicas_identical(model, full_parameters(model, args.impl) if args.shard == "full" else None)
    print0(f"ranks consistent: all {world_size} ranks hold bit-identical parameters" if same else
           f"ranks INCONSISTENT: the {world_size} ranks' parameters differ; is every rank broadcasting "
           "(Task 2.1) and averaging (Task 2.2) the same way?")
    return 0 if same else 1


def make_checkpointer(args, model, optimizer, world_size, data_name, device, steps_per_epoch):
    """--checkpoint-dir: check the folder, resume from its newest checkpoint (template_checkpoint.py).
    Under --shard the Checkpointer gathers the full state on every rank before rank 0 writes it."""
    if args.checkpoint_dir is None:
        if args.checkpoint_every:
            raise ValueError("--checkpoint-every needs --checkpoint-dir: where should the checkpoints go?")
        return None
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ValueError(f"--checkpoint-every must be at least 1, got {args.checkpoint_every}")
    lib = importlib.import_module(("solutions." if args.impl != "template" else "") + "template_checkpoint")
    return lib.Checkpointer(args.checkpoint_dir, args.checkpoint_every, model, optimizer,
                            lib.run_arguments(args, world_size, data_name), device, steps_per_epoch)


def write_metrics(path, rows):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_plot(metrics_path, rows, title):
    """Draw the run beside its CSV (same name, .png) with tools/plot_runs.py, which also overlays
    several runs. matplotlib is imported only here: a run without it still trains."""
    path = os.path.splitext(metrics_path)[0] + ".png"
    try:
        plot_runs = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools", "plot_runs.py"))
        plot_runs["plot_runs"]([{key: [row[key] for row in rows] for key in rows[0]}], [""], path, title)
    except ImportError as error:
        return f"no plot ({error}): pip install matplotlib, or pass --no-plot"
    return f"plot: {path}"


if __name__ == "__main__":
    args = parse_args()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop_on_interrupt)
    try:
        code = main(args)
    except ValueError as error:  # a setting that cannot work: one line, not a traceback
        tag = f"[rank {os.environ['RANK']}] " if "RANK" in os.environ else ""
        print(f"{tag}error: {error}", file=sys.stderr, flush=True)
        code = 2
    # The process group is destroyed and every file closed: leave without the interpreter's
    # teardown, which gloo's background threads can still abort now and then ("terminate called
    # without an active exception", SIGABRT), turning a finished run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
