"""Train the CIFAR-10 CNN with data parallelism.

    python train_ddp.py                                       # one process: a world of one
    torchrun --standalone --nproc_per_node=2 train_ddp.py     # 2 processes on CPUs (gloo)
    torchrun --standalone --nproc_per_node=gpu train_ddp.py   # one process per GPU (NCCL)
    torchrun --standalone --nproc_per_node=2 train_ddp.py --impl solutions --data synthetic
    torchrun --standalone --nproc_per_node=2 train_ddp.py --allreduce ring   # Task 3's all-reduce
    torchrun --standalone --nproc_per_node=2 train_ddp.py --sync overlap --accumulate 2  # Task 5's DDP
    torchrun --standalone --nproc_per_node=2 train_ddp.py --shard optimizer --optimizer adamw   # Task 6 (full: 7)
    torchrun --standalone --nproc_per_node=4 train_ddp.py --tp 2     # Task 9: tensor x data parallel
    torchrun --standalone --nproc_per_node=2 train_ddp.py --pp 2 --microbatches 4 --schedule 1f1b   # Task 10
    torchrun --standalone --nproc_per_node=2 train_ddp.py --batchnorm sync                    # Task 11
    torchrun --standalone --nproc_per_node=2 train_ddp.py --sync overlap --compress powersgd  # Task 12
    torchrun --standalone --nproc_per_node=2 train_ddp.py --diloco 16      # Task 13 (or --local-sgd 16)
    torchrun --standalone --nproc_per_node=4 train_ddp.py --model vit --tp 2 --sp   # Task 14: a ViT, sequence parallel
    torchrun --standalone --nproc_per_node=4 train_ddp.py --model vit --cp 2   # Task 15: tokens split, 2 replicas
    torchrun --standalone --nproc_per_node=4 train_ddp.py --model vit --moe 4 --ep 2   # Task 16: experts spread
    sbatch submit.sh        # several nodes under SLURM; srun, mpirun and Ray (ray_train.py): docs/launchers.md
    torchrun --standalone --nproc_per_node=2 --max-restarts=3 train_ddp.py --checkpoint-dir runs/ckpt  # Task 8

--impl template (the default) trains with your template_*.py files, --impl solutions with
the reference answers in solutions/, and --impl ddp with PyTorch's own
DistributedDataParallel and DistributedSampler, the production baseline to compare with.
Every epoch rank 0 prints the losses, the global test accuracy, the throughput and the
share of step time spent synchronising gradients, and writes them to --metrics. How the
model is parallelised (--impl, --allreduce, --sync, --shard, --tp, --pp) is one strategy
object from strategies/: this file reads the same whatever it is.
"""
import argparse
import datetime
import os
import signal
import sys

import launchers

if __name__ == "__main__":
    # Before torch is imported: OpenMP reads the variable once, when torch loads it, for every thread
    # it will ever run. torch.set_num_threads (set_threads below) sets the calling thread's alone, and
    # gloo's threads, where PowerSGD's decompress computes, would keep OpenMP's default of every core:
    # other bits than the main thread's, and "ranks INCONSISTENT" under mpirun --bind-to none or srun.
    os.environ["OMP_NUM_THREADS"] = str(launchers.threads_per_process())

import torch
import torch.distributed as dist

import strategies
from strategies.course_files import course_module, not_done
from data import get_datasets
from support import checkpoint
from support.interrupt import PROGRESS, Counted, cannot_start, stop_on_interrupt, whole_lines
from support.plot_runs import cannot_write, earlier_rows, write_metrics, write_plot
from support.timeline import start_profiler


class NotDone(Exception):
    """A task the chosen flags need is still a TODO: said already, ends the run like a wrong setting."""


def parse_args(argv=None, more_flags=None):
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
    parser.add_argument("--lr", type=float, help="learning rate (default: 0.05 with sgd, 0.001 with adamw)")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                        help="sgd: SGD with --momentum; adamw: AdamW (default: sgd)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the model, the shuffling and the synthetic data (default: 0)")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default=None,
                        help="process-group backend (default: nccl with GPUs, gloo without)")
    parser.add_argument("--workers", type=int, default=None,
                        help="DataLoader worker processes per rank (default: 0 on CPUs, 2 on GPUs)")
    parser.add_argument("--train-samples", type=int, default=None,
                        help="use only the first N training images, for quick runs (default: all)")
    parser.add_argument("--test-samples", type=int, help="use only the first N test images (default: all)")
    parser.add_argument("--accumulate", type=int, default=1, help="split each rank's batch into K micro-batches whose "
                        "gradients add up before one optimizer step; the first K-1 run inside no_sync() with "
                        "--sync overlap and --impl ddp (default: 1)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="profile 3 steps of the first epoch on rank 0: DIR/trace.json (chrome://tracing or "
                        "ui.perfetto.dev) and DIR/timeline.png, backward beside the all-reduces (default: off)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds a collective waits for the other ranks "
                        "before failing: how long a hang lasts (default: 300)")
    parser.add_argument("--metrics", default="runs/metrics.csv",
                        help="CSV file that rank 0 writes the per-epoch figures to (default: runs/metrics.csv)")
    parser.add_argument("--no-plot", action="store_true",
                        help="do not draw the metrics as a PNG beside the CSV (same name, .png) at the end")
    checkpoint.add_arguments(parser)
    strategies.add_arguments(parser)
    if more_flags:  # ray_train.py's, which give --workers another meaning
        more_flags(parser)
    return parser.parse_args(argv)


def check_flags(args):
    """Every setting that cannot work, refused with one line before any rank starts. Returns the
    strategy class the flags choose (strategies/)."""
    if args.epochs < 1:
        raise ValueError(f"--epochs {args.epochs}: train for at least one epoch")
    if args.accumulate < 1:
        raise ValueError(f"--accumulate {args.accumulate}: the number of micro-batches per step must be 1 or more")
    if checkpoint.refusal(args):
        raise ValueError(checkpoint.refusal(args))
    for flag, path in (("--metrics", args.metrics), ("--profile", args.profile and os.path.join(args.profile, "x"))):
        problem = path and cannot_write(path)
        if problem:  # found now, not after the first epoch's training
            raise ValueError(f"{flag} {getattr(args, flag[2:])}: {problem}: choose another path")
    return strategies.choose(args)


def main(args):
    launchers.set_torchrun_variables()  # srun's, mpirun's, ... in torchrun's names: print0 works from here on
    strategy = check_flags(args)
    trainer = course_module(args.impl, "template_trainer")
    unfinished = not_done(args.impl, strategy.needs(args) + checkpoint.tasks_needed(args))
    if unfinished:
        trainer.print0(unfinished)
        raise NotDone  # as final as a wrong setting
    timeout = datetime.timedelta(seconds=args.timeout)
    rank, local_rank, world_size, device = trainer.setup_distributed(args.backend, timeout)
    try:
        return train(args, rank, world_size, device)
    finally:
        trainer.cleanup()


def train(args, rank, world_size, device):
    """One training run on this rank, in a process group already set up; returns the exit code."""
    strategy = check_flags(args)(args)
    print0 = strategy.trainer.print0
    train_loader, test_loader, about_data = load_data(args, strategy, rank, world_size, device)
    threads = set_threads()
    # Each rank seeds differently on purpose: only the broadcast (Task 2.1) or DDP's own
    # broadcast makes the replicas start equal, so forgetting it shows.
    torch.manual_seed(args.seed + rank)
    model = strategy.wrap(strategy.build_model(device))
    optimizer = strategy.optimizer(model, *optimizer_class(args))
    checkpointer = checkpoint.make_checkpointer(args, course_module(args.impl, "template_checkpoint"), model,
                                                optimizer, world_size, about_data["name"], device, len(train_loader))
    print0(f"impl={args.impl} {strategy.start_line()} accumulate={args.accumulate} {about_data['text']} "
           f"world_size={world_size} backend={dist.get_backend()} device={device.type} threads={threads} "
           f"global batch={args.batch_size} ({args.batch_size // about_data['readers']} per rank) "
           f"steps/epoch={len(train_loader)}")
    if not train_epochs(args, strategy, model, optimizer, train_loader, test_loader, checkpointer, rank, device,
                        about_data["name"]):
        return 0  # SIGUSR1: saved, ended cleanly
    same, line = strategy.consistency(model)
    print0(line)
    return 0 if same else 1


def load_data(args, strategy, rank, world_size, device):
    """(train loader, test loader, about the data) of this rank; a global batch that cannot be
    split evenly is refused, on every rank alike."""
    workers = args.workers if args.workers is not None else (2 if device.type == "cuda" else 0)
    train_set, test_set, data_name = get_datasets(args.data, args.data_dir, args.seed, args.train_samples,
                                                  args.test_samples)
    train_loader, test_loader = strategy.loaders(train_set, test_set, args.batch_size, rank, world_size,
                                                 args.seed, workers, device)
    if len(train_loader) == 0:  # every rank has as many steps, so every rank stops here
        raise ValueError(f"{len(train_set)} training images do not fill one global batch of {args.batch_size}: "
                         "use more --train-samples or a smaller --batch-size")
    _, readers = strategy.data_ranks(rank, world_size)  # how many slices each global batch is cut into
    if args.batch_size % (readers * args.accumulate):
        raise ValueError(f"the global batch {args.batch_size} does not split into {readers} ranks x "
                         f"{args.accumulate} equal micro-batches: choose a multiple of {readers * args.accumulate}")
    text = f"data={data_name} ({len(train_set)} train / {len(test_set)} test images)"
    return train_loader, test_loader, {"name": data_name, "text": text, "readers": readers}


def train_epochs(args, strategy, model, optimizer, train_loader, test_loader, checkpointer, rank, device, data_name):
    """The epochs left (all, or those after a checkpoint's), each ended by its line and its row of
    --metrics; the plot at the end. False if SIGUSR1 stopped the run (after saving a checkpoint)."""
    print0 = strategy.trainer.print0
    first_epoch = checkpointer.epochs_done + 1 if checkpointer else 1
    stop_requested = checkpointer.StopRequested if checkpointer else ()  # () catches nothing
    rows = earlier_rows(args.metrics, first_epoch) if rank == 0 and args.metrics else []  # a resumed run's history
    for epoch in range(first_epoch, args.epochs + 1):
        train_loader.sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        PROGRESS.update(epoch=epoch, step=0)
        profiler = start_profiler(args.profile, device, model) if args.profile and rank == 0 and epoch == 1 else None
        batches = checkpointer.batches(train_loader) if checkpointer else train_loader
        try:
            stats = strategy.trainer.train_one_epoch(model, Counted(batches, profiler), optimizer, device,
                                                     strategy.sync_gradients, epoch, accumulate=args.accumulate,
                                                     forward_backward=strategy.forward_backward)
        except stop_requested as stop:  # SIGUSR1: saved, now end cleanly
            print0(stop)
            return False
        if profiler:
            profiler.stop()
            print0(f"profile of 3 steps on rank 0: {args.profile}/trace.json and {args.profile}/timeline.png")
        if checkpointer:
            checkpointer.end_epoch()
        rows.append(epoch_row(args, strategy, model, test_loader, stats, epoch, device))
        if rank == 0 and args.metrics:
            write_metrics(args.metrics, rows)
    if rank == 0 and args.metrics and rows and not args.no_plot:
        print0(write_plot(args.metrics, rows, f"--impl {args.impl} --allreduce {args.allreduce}, {data_name}, "
                                              f"{dist.get_world_size()} rank(s), global batch {args.batch_size}"))
    return True


def epoch_row(args, strategy, model, test_loader, stats, epoch, device):
    """The epoch's figures over all ranks (the row of --metrics), said in the epoch line."""
    samples, loss_sum = strategy.totals(stats, device)  # the same reduction as the evaluation's counts
    result = strategy.evaluate(model, test_loader, device)
    row = {"epoch": epoch, "train_loss": loss_sum / max(samples, 1), "test_loss": result["loss"],
           "test_accuracy": result["accuracy"], "images_per_second": samples / stats["seconds"],
           "sync_share": strategy.sync_share(stats), "epoch_seconds": stats["seconds"]}
    strategy.trainer.print0(
        f"epoch {epoch}/{args.epochs}  train loss {row['train_loss']:.4f}  test loss {row['test_loss']:.4f}  "
        f"test accuracy {result['accuracy']:.2%} ({result['correct']}/{result['total']})  "
        f"{row['images_per_second']:,.0f} images/s  {strategy.sync_line(stats)}  ({stats['seconds']:.1f} s)")
    return row


def set_threads():
    """This process's intra-op threads: launchers.threads_per_process(), OMP_NUM_THREADS or the cores shared
    out between the node's processes; run as a script, the same number was given to OpenMP at the top."""
    threads = launchers.threads_per_process()
    torch.set_num_threads(threads)
    return threads


def optimizer_class(args):
    """The optimizer class and its keyword arguments, from --optimizer, --lr and --momentum."""
    if args.optimizer == "adamw":
        return torch.optim.AdamW, {"lr": 0.001 if args.lr is None else args.lr}
    return torch.optim.SGD, {"lr": 0.05 if args.lr is None else args.lr, "momentum": args.momentum}


if __name__ == "__main__":
    whole_lines()  # two ranks' lines never share one (PYTHONUNBUFFERED=1 writes a line in two pieces)
    args = parse_args()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop_on_interrupt)
    try:
        code = main(args)
    except (ValueError, NotDone) as error:  # a setting that cannot work: one line, not a traceback
        code = cannot_start(error, final=isinstance(error, NotDone))
    # The process group is destroyed and every file closed: leave without the interpreter's
    # teardown, which gloo's background threads can still abort now and then ("terminate called
    # without an active exception", SIGABRT), turning a finished run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
