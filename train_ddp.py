"""Train the CIFAR-10 CNN with data parallelism.

    python train_ddp.py                                       # one process: a world of one
    torchrun --standalone --nproc_per_node=2 train_ddp.py     # 2 processes on CPUs (gloo)
    torchrun --standalone --nproc_per_node=gpu train_ddp.py   # one process per GPU (NCCL)
    torchrun --standalone --nproc_per_node=2 train_ddp.py --impl solutions --data synthetic
    torchrun --standalone --nproc_per_node=2 train_ddp.py --allreduce ring   # Task 3's all-reduce
    sbatch submit.sh                                          # several nodes under SLURM (README)
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
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset

from data import get_datasets
from models import CNN

TASK_FILES = ["template_data_loader.py", "template_trainer.py"]


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
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default: 0.05)")
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
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds a collective waits for the other ranks before failing: "
                        "how long a hang lasts (default: 300)")
    parser.add_argument("--metrics", default="runs/metrics.csv",
                        help="CSV file that rank 0 writes the per-epoch figures to (default: runs/metrics.csv)")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="rank 0 saves a checkpoint here after every epoch (last.pt, previous.pt), and a run "
                        "that finds one resumes from it, also after a torchrun restart (default: no checkpoints)")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help="with --checkpoint-dir, also save every N optimizer steps, so that a failure loses at "
                        "most N steps; SIGUSR1 saves at the next step and stops (default: at epoch ends only)")
    return parser.parse_args(argv)


def unfilled_task(impl, files=TASK_FILES):
    """The first 'Task X.Y' whose TODO still raises NotImplementedError, or None."""
    if impl != "template":
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    for name in files:
        with open(os.path.join(here, name)) as f:
            found = re.search(r'raise NotImplementedError\("(Task \d+\.\d+)', f.read())
        if found:
            return found.group(1), name
    return None


def first_n(dataset, n):
    return dataset if n is None or n >= len(dataset) else Subset(dataset, range(n))


def ddp_loaders(train_set, test_set, batch_size, rank, world_size, seed, workers, device, reference):
    """Loaders for --impl ddp: PyTorch's DistributedSampler for training. Evaluation keeps
    the unpadded sampler, because PyTorch's pads the test set and counts some images twice."""
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


def replicas_identical(model):
    """True on every rank if every rank holds bit-identical parameters."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    differs = torch.tensor([0 if torch.equal(flat, reference) else 1], device=flat.device)
    dist.all_reduce(differs)
    return differs.item() == 0


def main(args):
    if args.impl == "ddp" and args.allreduce != "torch":
        raise ValueError("--allreduce naive/ring replaces dist.all_reduce in our own averaging, and --impl ddp "
                         "averages inside DistributedDataParallel: use --impl template or solutions")
    task = unfilled_task(args.impl, TASK_FILES + (["template_allreduce.py"] if args.allreduce != "torch" else [])
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

    # Each rank seeds differently on purpose: only the broadcast (Task 2.1) or DDP's own
    # broadcast makes the replicas start equal, so forgetting it shows.
    torch.manual_seed(args.seed + rank)
    model = CNN().to(device)
    if args.impl == "ddp":
        model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        sync_gradients = None  # DDP averages gradients during backward
    else:
        trainer.broadcast_parameters(model, src=0)
        sync_gradients = trainer.average_gradients
        if args.allreduce != "torch":
            sync_gradients = average_gradients_with(args.allreduce, args.impl)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    checkpointer = make_checkpointer(args, model, optimizer, world_size, data_name, device, len(train_loader))
    first_epoch = checkpointer.epochs_done + 1 if checkpointer else 1
    stop_requested = checkpointer.StopRequested if checkpointer else ()  # () catches nothing

    print0(f"impl={args.impl} allreduce={args.allreduce} data={data_name} ({len(train_set)} train / {len(test_set)} test images) "
           f"world_size={world_size} backend={dist.get_backend()} device={device.type} "
           f"global batch={args.batch_size} ({args.batch_size // world_size} per rank) "
           f"steps/epoch={len(train_loader)}")
    rows = []
    for epoch in range(first_epoch, args.epochs + 1):
        train_loader.sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        batches = checkpointer.batches(train_loader) if checkpointer else train_loader
        try:
            stats = trainer.train_one_epoch(model, batches, optimizer, device, sync_gradients, epoch)
        except stop_requested as stop:  # SIGUSR1: saved, now end cleanly
            print0(stop)
            return 0
        if checkpointer:
            checkpointer.end_epoch()
        # the global training loss, from the same reduction as the evaluation counts
        _, samples, loss_sum = trainer.reduce_metrics(0, stats["samples"], stats["loss_sum"], device)
        result = trainer.evaluate(model, test_loader, device)
        sync = (f"sync {stats['sync_seconds'] / stats['seconds']:.0%} of step time" if sync_gradients
                else "sync overlapped with backward by DDP")
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

    same = replicas_identical(model)
    print0(f"ranks consistent: all {world_size} ranks hold bit-identical parameters" if same else
           f"ranks INCONSISTENT: the {world_size} ranks' parameters differ; is every rank broadcasting "
           "(Task 2.1) and averaging (Task 2.2) the same way?")
    return 0 if same else 1


def make_checkpointer(args, model, optimizer, world_size, data_name, device, steps_per_epoch):
    """--checkpoint-dir: check the folder, resume from its newest checkpoint (template_checkpoint.py)."""
    if args.checkpoint_dir is None:
        if args.checkpoint_every:
            raise ValueError("--checkpoint-every needs --checkpoint-dir: where should the checkpoints go?")
        return None
    if getattr(args, "shard", "none") != "none":  # a sharded state must be gathered first: not done yet
        raise ValueError("--checkpoint-dir saves the unsharded model and optimizer: it does not work with --shard yet")
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


if __name__ == "__main__":
    args = parse_args()
    try:
        sys.exit(main(args))
    except ValueError as error:  # a setting that cannot work: one line, not a traceback
        tag = f"[rank {os.environ['RANK']}] " if "RANK" in os.environ else ""
        print(f"{tag}error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
