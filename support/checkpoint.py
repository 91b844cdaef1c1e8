"""Given code for Task 8 (template_checkpoint.py) and train_ddp.py's --checkpoint-dir: the flags and
their checks, the folder's checks, resume() (which calls Task 8.2's load_checkpoint and refuses a
checkpoint from a run with other arguments), the batch skipping of a mid-epoch resume, the stop on
SIGUSR1 that SLURM sends before a job's time limit, and the Checkpointer that does it all in one
place. What a checkpoint holds, and the sharded files, are in support/checkpoint_state.py.

The functions that need a task's answer take `tasks`, the template_checkpoint module of --impl, and
call its save_checkpoint (8.1) and load_checkpoint (8.2) through it; template_checkpoint.py binds
itself to them (Checkpointer, resume), so the answers that run are the template's.
"""
import os
import shutil
import signal
import tempfile
import threading

import torch
import torch.distributed as dist

from support.checkpoint_state import (LAST, LAST_SHARDS, CheckpointError, Snapshot, barrier, full_state, get_rank,
                                      load_full_state, open_sharded, reshardable, save_sharded)

# Arguments that may differ between a run and the run it resumes, because they do not change
# the trained parameters: how long to train, where things are written, how long to wait.
# Every other argument (the data, the batch, the learning rate, the seed, the implementation,
# the world size, and any flag added later) must be the same, or resuming would quietly mix
# two different experiments.
MAY_DIFFER = {"epochs", "checkpoint_dir", "checkpoint_every", "metrics", "no_plot", "timeout", "workers",
              "data_dir", "test_samples", "backend", "profile"}




def add_arguments(parser):
    group = parser.add_argument_group("checkpoints (Task 8, template_checkpoint.py)")
    group.add_argument("--checkpoint-dir", default=None,
                       help="rank 0 saves a checkpoint here after every epoch (last.pt, previous.pt), and a run "
                       "that finds one resumes from it, also after a torchrun restart (default: no checkpoints)")
    group.add_argument("--checkpoint-every", type=int, default=None,
                       help="with --checkpoint-dir, also save every N optimizer steps, so that a failure loses at "
                       "most N steps; SIGUSR1 saves at the next step and stops (default: at epoch ends only)")


def refusal(args):
    """What is wrong with the checkpoint flags, or None."""
    if args.checkpoint_dir is None and args.checkpoint_every:
        return "--checkpoint-every needs --checkpoint-dir: where should the checkpoints go?"
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        return f"--checkpoint-every must be at least 1, got {args.checkpoint_every}"
    return None


def tasks_needed(args):
    """--checkpoint-dir trains with Tasks 8.1 and 8.2, and under --shard with 8.3 and 8.4 (sharded files):
    (file, function) pairs for strategies' "not done yet" check."""
    names = ["save_checkpoint", "load_checkpoint"] + (["shard_index", "read_overlaps"] if args.shard != "none" else [])
    return [("template_checkpoint.py", name) for name in names] if args.checkpoint_dir else []


def make_checkpointer(args, lib, model, optimizer, world_size, data_name, device, steps_per_epoch):
    """--checkpoint-dir: check the folder, resume from its newest checkpoint; None without it. `lib`:
    template_checkpoint of --impl, whose Checkpointer runs its answers."""
    if args.checkpoint_dir is None:
        return None
    checkpointer = lib.Checkpointer(args.checkpoint_dir, args.checkpoint_every, model, optimizer,
                                    run_arguments(args, world_size, data_name), device, steps_per_epoch)
    if checkpointer.epochs_done >= args.epochs and get_rank() == 0:  # it used to end here without a word
        print(f"{args.checkpoint_dir} holds {checkpointer.epochs_done} epochs already, --epochs {args.epochs}: "
              "nothing to train; a larger --epochs trains on from there", flush=True)
    return checkpointer


def prepare_checkpoint_dir(directory):
    """Check, before any training, that rank 0 can write checkpoints into directory.

    The folder itself is created if missing, but not its parents: a mistyped path should
    fail now, in one line, not train for an hour and then fail, or write where a resubmitted
    job will not look. Every rank calls it and gets the same error.
    """
    problem = None
    if get_rank() == 0:
        parent = os.path.dirname(os.path.abspath(directory))
        if not os.path.isdir(parent):
            problem = (f"--checkpoint-dir {directory}: its parent folder {parent} does not exist "
                       "(a typo?); create it first")
        else:
            try:
                os.makedirs(directory, exist_ok=True)
                with tempfile.TemporaryFile(dir=directory):
                    pass
                for name in os.listdir(directory):  # what saves cut short by a kill left behind
                    if name.startswith(LAST + ".") and name.endswith(".tmp"):
                        os.remove(os.path.join(directory, name))
            except OSError as error:
                problem = (f"--checkpoint-dir {directory} is not writable ({error.strerror}): "
                           "choose a folder you can write to")
    if dist.is_initialized() and dist.get_world_size() > 1:
        shared = [problem]
        dist.broadcast_object_list(shared, src=0)
        problem = shared[0]
    if problem:
        raise CheckpointError(problem)


def run_arguments(args, world_size, data_name):
    """The arguments saved with a checkpoint: every flag, the world size, and the data set
    actually used (--data auto may be CIFAR-10 on one machine and synthetic on another)."""
    saved = dict(vars(args)) if not isinstance(args, dict) else dict(args)
    saved.update(world_size=world_size, data=data_name)
    return saved


def check_arguments(saved, current, path):
    """Raise CheckpointError naming the first argument that differs and changes the result.

    The world size may differ: a step trains on the same global batch (--batch-size) on any
    number of ranks, and the checkpoint holds the training position in global steps, so a run
    that lost a node continues on the same trajectory (up to the order of float sums). Returns
    the line that says so ("resuming 4-rank checkpoint on 2 ranks"), or None."""
    for key in sorted(set(saved) & set(current) - MAY_DIFFER - {"world_size"}):
        if saved[key] != current[key]:
            flag = "--" + key.replace("_", "-")
            before, now = ("its default" if value is None else value for value in (saved[key], current[key]))
            raise CheckpointError(
                f"{path} was written by a run with {flag} {before}, this run has {now}: "
                f"resuming would mix two experiments; use the same {flag}, or another --checkpoint-dir")
    before, now = saved.get("world_size"), current.get("world_size")
    if before is not None and now is not None and before != now:
        return f"resuming {before}-rank checkpoint on {now} rank{'s' if now != 1 else ''}"
    return None


def resume(tasks, directory, model, optimizer, run_args, device, steps_per_epoch, shard="none"):
    """Restore model and optimizer from the newest readable checkpoint in directory.

    Returns (epochs completed, optimizer steps completed); (0, 0) when there is none. tasks: the
    template_checkpoint module whose load_checkpoint (Task 8.2) reads it. Every rank calls it
    (shard: --shard, how the model and optimizer are split; see load_full_state). A corrupt
    last.pt is renamed last.pt.corrupt (by rank 0, after every rank has tried it), so that the
    next save does not turn it into previous.pt over the good checkpoint that this run resumed from. Under Task 6's ShardedOptimizer and Task 7's
    FSDP the checkpoint is sharded (save_sharded, open_sharded) and may come from another
    number of ranks; so may a full one.
    """
    if reshardable(model, optimizer):
        return _resume_sharded(tasks, directory, model, optimizer, run_args, steps_per_epoch)
    checkpoint, path = tasks.load_checkpoint(directory, device)
    found = torch.tensor([-1 if checkpoint is None else checkpoint["step"]], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        low, high = found.clone(), found.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if low.item() != high.item():
            raise CheckpointError(f"the ranks found different checkpoints in {directory} (steps {low.item():.0f} "
                                  f"to {high.item():.0f}): --checkpoint-dir must be a folder every node sees")
    if checkpoint is None:
        return 0, 0
    resharding = check_arguments(checkpoint["args"], run_args, path)
    epoch, step = _position(checkpoint, path, steps_per_epoch)
    load_full_state(model, optimizer, checkpoint, shard)
    last = os.path.join(directory, LAST)
    # the same file however load_checkpoint spells its path (a pathlib.Path, a relative one): compared as text, a
    # good last.pt was moved aside. Rank 0 alone looks: another rank's look raced with its rename
    if get_rank() == 0 and os.path.exists(last) and not os.path.samefile(path, last):
        os.replace(last, last + ".corrupt")
    _say_resuming(path, epoch, step, steps_per_epoch, resharding)
    return epoch, step


def _position(checkpoint, path, steps_per_epoch):
    """(epochs, steps) done: global optimizer steps, the same on any number of ranks."""
    epoch, step = checkpoint["epoch"], checkpoint["step"]
    if not 0 <= step - epoch * steps_per_epoch < steps_per_epoch:
        raise CheckpointError(f"{path}: epoch {epoch} and step {step} do not fit {steps_per_epoch} steps an epoch")
    return epoch, step


def _say_resuming(path, epoch, step, steps_per_epoch, resharding, extra=""):
    if get_rank() == 0:
        if resharding:
            print(resharding + extra, flush=True)
        where = f"epoch {epoch + 1}, batch {step - epoch * steps_per_epoch + 1}"
        print(f"resuming from {path}: {epoch} epochs and {step} steps done, continuing at {where}", flush=True)


def _resume_sharded(tasks, directory, model, optimizer, run_args, steps_per_epoch):
    """resume() for sharded checkpoints: each rank reads the pieces that overlap its own."""
    opened, path = open_sharded(tasks, directory, model, optimizer)
    if opened is None:
        return 0, 0
    resharding = check_arguments(opened.meta["args"], run_args, path)
    epoch, step = _position(opened.meta, path, steps_per_epoch)
    opened.apply()
    last = os.path.join(directory, LAST_SHARDS)
    barrier()  # every rank has read it before rank 0 moves the corrupt one away
    if path != last and os.path.exists(last) and get_rank() == 0:
        shutil.rmtree(last + ".corrupt", ignore_errors=True)
        os.replace(last, last + ".corrupt")
    extra = (f" (rank 0 opened {len(opened.ranks)} of {opened.meta['world_size']} files and read "
             f"{opened.bytes_read / 1e6:.2f} of {opened.bytes_total / 1e6:.2f} MB)")
    _say_resuming(path, epoch, step, steps_per_epoch, resharding, extra)
    return epoch, step


class StepsFrom:
    """The batches of loader from batch `skip` on, calling after_step(batch_number) after each
    one has been trained on (when the loop asks for the next batch).

    A mid-epoch resume skips the batches that the checkpoint had already trained on; the
    sampler gives the same order as before because the order depends only on the seed and
    the epoch. Skipping reads and discards those batches: simple, and at most an epoch's
    reading. One optimizer step per batch is assumed.
    """

    def __init__(self, loader, skip=0, after_step=None):
        self.loader, self.skip, self.after_step = loader, skip, after_step

    def __getattr__(self, name):  # batch_size, sampler, dataset: the loader's
        if name == "loader":  # not set yet (a copy being made): no endless recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __len__(self):
        return len(self.loader) - self.skip

    def __iter__(self):
        batches = iter(self.loader)
        for _ in range(self.skip):
            next(batches)
        for number, batch in enumerate(batches, self.skip + 1):
            yield batch
            if self.after_step is not None:
                self.after_step(number)


class StopRequested(Exception):
    """Raised at a step boundary after SIGUSR1, once the checkpoint is written."""


class StopSignal:
    """Remember that `signum` arrived; ask at a step boundary whether any rank got it.

    The handler only sets a flag: saving inside a signal handler could interrupt a
    collective half-way. requested() all-reduces the flag (MAX), so every rank stops after
    the same step even if the signal reached them at slightly different times.
    """

    def __init__(self, signum=signal.SIGUSR1):
        self.signum, self.received = signum, False
        # Only the main thread may set a handler. Ray Train runs the training in another
        # thread (ray_train.py): there SIGUSR1 is not caught, and Ray itself stops the run.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        self.received = True

    def requested(self, device):
        flag = torch.tensor([1.0 if self.received else 0.0], device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0


class Checkpointer:
    """What train_ddp.py does with --checkpoint-dir, in one place (template_checkpoint.Checkpointer:
    this class with `tasks`, the template's module, bound).

        checkpointer = Checkpointer(args.checkpoint_dir, args.checkpoint_every, model, optimizer,
                                    run_arguments(args, world_size, data_name), device, len(train_loader))
        for epoch in range(checkpointer.epochs_done + 1, args.epochs + 1):
            train_loader.sampler.set_epoch(epoch)
            train_one_epoch(model, checkpointer.batches(train_loader), ...)  # may raise StopRequested
            checkpointer.end_epoch()

    On creation it checks the folder and resumes from the newest checkpoint. It counts
    optimizer steps, saves every `every` steps and at the end of each epoch, and after
    SIGUSR1 saves and raises StopRequested at the next step boundary.
    """
    StopRequested = StopRequested

    def __init__(self, tasks, directory, every, model, optimizer, run_args, device, steps_per_epoch):
        self.tasks, self.directory, self.every, self.model, self.optimizer = tasks, directory, every, model, optimizer
        self.run_args, self.device, self.steps_per_epoch = run_args, device, steps_per_epoch
        prepare_checkpoint_dir(directory)
        self.stop = StopSignal(signal.SIGUSR1)  # before resume(): a signal while loading is not lost
        self.shard = run_args.get("shard", "none")  # --shard: the state must be gathered before saving
        _, self.step = resume(tasks, directory, model, optimizer, run_args, device, steps_per_epoch, self.shard)
        self.saved_step = self.step

    @property
    def epochs_done(self):
        return self.step // self.steps_per_epoch

    def batches(self, loader):
        """The loader of the next epoch, without the batches a mid-epoch checkpoint already trained on."""
        return StepsFrom(loader, self.step % self.steps_per_epoch, self._after_step)

    def _after_step(self, number):
        self.step += 1
        if self.every and self.step % self.every == 0:
            self.save()
        if self.stop.requested(self.device):
            path = self.save()
            if dist.is_initialized():
                dist.barrier()  # no rank ends before the checkpoint is on disk
            raise StopRequested(f"stopped by {signal.Signals(self.stop.signum).name} after step {self.step} "
                                f"(epoch {self.epochs_done + 1}, batch {number}); the checkpoint {path} "
                                "holds it: run the same command again to continue")

    def end_epoch(self):
        path = self.save()
        if get_rank() == 0:
            print(f"checkpoint {path}: {self.epochs_done} epochs, {self.step} steps", flush=True)

    def save(self):
        sharded = reshardable(self.model, self.optimizer)  # Tasks 6 and 7: each rank writes its shard
        if self.saved_step != self.step:
            if sharded:
                save_sharded(self.tasks, self.directory, self.model, self.optimizer, self.epochs_done, self.step,
                             self.run_args)
            else:
                model, optimizer = self.model, self.optimizer
                if self.shard != "none":  # every rank helps gather the state, then rank 0 writes it
                    model, optimizer = map(Snapshot, full_state(self.model, self.optimizer, self.shard))
                self.tasks.save_checkpoint(self.directory, model, optimizer, self.epochs_done, self.step, self.run_args)
            self.saved_step = self.step
        return os.path.join(self.directory, LAST_SHARDS if sharded else LAST)
