"""Task 8: survive failures with checkpoints, so that a killed rank loses minutes, not the run.

    torchrun --standalone --nproc_per_node=2 --max-restarts=3 train_ddp.py --checkpoint-dir runs/ckpt
    torchrun ... train_ddp.py --checkpoint-dir runs/ckpt --checkpoint-every 50   # also every 50 steps
    pytest --impl template -m "task8_1 or task8_2"                               # check your work

After every epoch (and every --checkpoint-every steps) rank 0 writes DIR/last.pt and keeps
the one before as DIR/previous.pt. When a run starts and DIR holds a checkpoint, every rank
loads it and training continues at the same epoch and batch, so a resumed run ends with the
same parameters, bit for bit, as one that was never interrupted. docs/task8-checkpoints.md
explains each decision.

    Task 8.1  save_checkpoint  rank 0 writes the checkpoint atomically, keeping the previous one
    Task 8.2  load_checkpoint  every rank reads the newest checkpoint that is readable

The rest is given: the folder's checks, resume() (which calls load_checkpoint and refuses a
checkpoint from a run with other arguments), the batch skipping of a mid-epoch resume, the
stop on SIGUSR1 that SLURM sends before a job's time limit, and under --shard the gathering
of the full state on every rank before rank 0 saves it (full_state, load_full_state).
"""
import os
import signal
import tempfile

import torch
import torch.distributed as dist

LAST, PREVIOUS = "last.pt", "previous.pt"

# Arguments that may differ between a run and the run it resumes, because they do not change
# the trained parameters: how long to train, where things are written, how long to wait.
# Every other argument (the data, the batch, the learning rate, the seed, the implementation,
# the world size, and any flag added later) must be the same, or resuming would quietly mix
# two different experiments.
MAY_DIFFER = {"epochs", "checkpoint_dir", "checkpoint_every", "metrics", "no_plot", "timeout", "workers",
              "data_dir", "test_samples", "backend", "profile"}


class CheckpointError(ValueError):
    """A checkpoint problem the user must fix; train_ddp.py prints it as one line and exits."""


def get_rank():
    return dist.get_rank() if dist.is_initialized() else 0


def unwrap(model):
    """The plain module inside DistributedDataParallel (or any wrapper with .module): its
    state_dict has no "module." prefixes, so a checkpoint loads with or without the wrapper."""
    return model.module if hasattr(model, "module") else model


def save_checkpoint(directory, model, optimizer, epoch, step, args):
    """Rank 0 writes the training state to directory/last.pt, atomically; other ranks do nothing.

    The checkpoint is a dict with
        "model":     the plain module's state_dict (unwrap(model)), no wrapper prefixes,
        "optimizer": optimizer.state_dict() (SGD's momentum buffers: without them the
                     resumed run takes different steps),
        "epoch":     epochs completed, "step": optimizer steps completed since the start,
        "args":      args, a dict of the run's arguments.
    Every rank holds the same weights, so one writer is enough; several writing one file at
    once would leave a mix of their bytes. Atomic: write a temporary file in the same folder,
    flush and os.fsync it, then os.replace it onto last.pt, so a crash at any moment leaves
    either the old last.pt or the new one, never half a file. Before that, the old last.pt
    becomes previous.pt (also with os.replace). Returns the path written on rank 0, None on
    the other ranks. Call it on every rank (it has no collective, so any rank may skip it).
    """
    # --- Task 8.1 begin ---
    # TODO Task 8.1: rank 0: torch.save the dict to a temporary file in directory, fsync, os.replace it onto last.pt
    raise NotImplementedError("Task 8.1: save_checkpoint() in template_checkpoint.py is not done yet (docs/task8-checkpoints.md)")
    # --- Task 8.1 end ---


def load_checkpoint(directory, device):
    """The newest readable checkpoint in directory, as (checkpoint, path); (None, None) if
    the folder holds none.

    Every rank calls it and reads the file itself: each rank needs the state in its own
    model and optimizer, so rank 0 alone loading it would leave the others untrained.
    Try last.pt, then previous.pt. Load with torch.load(path, map_location=device,
    weights_only=True): map_location puts the tensors on this rank's device, not on the GPU
    that saved them; weights_only refuses to run code hidden in the file (a pickle can).
    A file that cannot be read (truncated, corrupt) is reported in one line, with its path,
    and the next one is tried. If checkpoints exist but none can be read, raise
    CheckpointError: starting again from scratch without a word would throw the run away.
    """
    # --- Task 8.2 begin ---
    # TODO Task 8.2: every rank: torch.load last.pt, else previous.pt (weights_only, map_location); report bad ones
    raise NotImplementedError("Task 8.2: load_checkpoint() in template_checkpoint.py is not done yet (docs/task8-checkpoints.md)")
    # --- Task 8.2 end ---


# ----------------------------------------------------------------------------- given


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
    """Raise CheckpointError naming the first argument that differs and changes the result."""
    for key in sorted(set(saved) & set(current) - MAY_DIFFER):
        if saved[key] != current[key]:
            flag = "--" + key.replace("_", "-") if key != "world_size" else "the world size"
            raise CheckpointError(
                f"{path} was written by a run with {flag} {saved[key]}, this run has {current[key]}: "
                f"resuming would mix two experiments; use the same {flag}, or another --checkpoint-dir")


def resume(directory, model, optimizer, run_args, device, steps_per_epoch, shard="none"):
    """Restore model and optimizer from the newest readable checkpoint in directory.

    Returns (epochs completed, optimizer steps completed); (0, 0) when there is none.
    Every rank calls it (shard: --shard, how the model and optimizer are split; see
    load_full_state). A corrupt last.pt is renamed last.pt.corrupt (by rank 0, after
    every rank has tried it), so that the next save does not turn it into previous.pt over
    the good checkpoint that this run resumed from.
    """
    checkpoint, path = load_checkpoint(directory, device)
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
    check_arguments(checkpoint["args"], run_args, path)
    epoch, step = checkpoint["epoch"], checkpoint["step"]
    if not 0 <= step - epoch * steps_per_epoch < steps_per_epoch:
        raise CheckpointError(f"{path}: epoch {epoch} and step {step} do not fit {steps_per_epoch} steps an epoch")
    load_full_state(model, optimizer, checkpoint, shard)
    last = os.path.join(directory, LAST)
    if path != last and os.path.exists(last) and get_rank() == 0:
        os.replace(last, last + ".corrupt")
    where = f"epoch {epoch + 1}, batch {step - epoch * steps_per_epoch + 1}"
    if get_rank() == 0:
        print(f"resuming from {path}: {epoch} epochs and {step} steps done, continuing at {where}", flush=True)
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


# ------------------------------------------------- checkpoints under sharding (--shard, given)


class Snapshot:
    """A state gathered before saving, handed to save_checkpoint in place of the model or the
    optimizer: its state_dict() returns it. Under --shard no single rank holds the whole
    state, so every rank first takes part in gathering it (full_state), and only then does
    rank 0 write it with the same save_checkpoint as for unsharded training."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state


def full_state(model, optimizer, shard):
    """(model state, optimizer state) to save, gathered from the ranks. A collective under
    --shard: every rank calls it at the same step; ranks other than 0 may get None.

    model: always the plain module's state_dict with full tensors (the keys of CNN().state_dict(),
    buffers included), loadable into an unwrapped model with strict=True.
    optimizer:
      --shard none       optimizer.state_dict() (every rank holds all of it);
      --shard optimizer  the whole state, as the unsharded optimizer's state_dict() gives it:
                         ShardedOptimizer.state_dict() all-gathers it (every rank must call it);
                         ZeroRedundancyOptimizer needs consolidate_state_dict(to=0) on every rank
                         first, then rank 0 alone calls state_dict();
      --shard full       Task 7's FSDP: {"per_rank": [rank 0's optimizer.state_dict(), rank 1's, ...]},
                         each over that rank's flat shards (the layout is FSDP's, so a resume needs
                         the same world size, which resume() checks anyway); PyTorch's fully_shard:
                         its optimizer state gathered to full tensors, keyed by parameter name
                         (torch.distributed.checkpoint.state_dict with full_state_dict=True).
    """
    if shard == "optimizer":
        if hasattr(optimizer, "consolidate_state_dict"):  # ZeroRedundancyOptimizer
            optimizer.consolidate_state_dict(to=0)
            optim_state = optimizer.state_dict() if get_rank() == 0 else None
        else:  # Task 6's ShardedOptimizer: state_dict() is the collective
            optim_state = optimizer.state_dict()
        return unwrap(model).state_dict(), optim_state
    if shard == "full" and hasattr(model, "gather_full_params"):  # Task 7's FSDP
        model_state = model.gather_full_params()
        buffers = unwrap(model).named_buffers()  # not sharded: every rank holds them whole
        model_state.update((name, buffer.detach().clone()) for name, buffer in buffers)
        mine = optimizer.state_dict()  # this rank's shards' state, on the CPU to travel as an object
        mine = {"state": {index: {key: value.detach().cpu() if torch.is_tensor(value) else value
                                  for key, value in state.items()} for index, state in mine["state"].items()},
                "param_groups": mine["param_groups"]}
        per_rank = [None] * dist.get_world_size() if get_rank() == 0 else None
        dist.gather_object(mine, per_rank, dst=0)
        return model_state, ({"per_rank": per_rank} if get_rank() == 0 else None)
    if shard == "full":  # PyTorch's fully_shard: its parameters and state are DTensors
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # full tensors, on rank 0
        return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)
    return unwrap(model).state_dict(), optimizer.state_dict()


def load_full_state(model, optimizer, checkpoint, shard):
    """Put a checkpoint's full model (and its optimizer state) back into a model that may be
    sharded: the inverse of full_state, on every rank, bit for bit."""
    if shard == "full" and hasattr(model, "gather_full_params"):  # Task 7's FSDP: cut the full tensors again
        full = checkpoint["model"]
        expected = {name for name, _, _ in model._names} | {name for name, _ in unwrap(model).named_buffers()}
        if set(full) != expected:
            raise CheckpointError(f"the checkpoint's model does not fit this model: {sorted(set(full) - expected)} "
                                  f"only in the checkpoint, {sorted(expected - set(full))} only in the model")
        with torch.no_grad():
            for unit in model.units:
                names = {index: name for name, owner, index in model._names if owner is unit}
                flat = torch.cat([full[names[index]].reshape(-1) for index in range(len(unit.numels))])
                padded = torch.cat([flat, flat.new_zeros(unit.shard.numel() * unit.world_size - flat.numel())])
                piece = padded[unit.rank * unit.shard.numel():(unit.rank + 1) * unit.shard.numel()]
                unit.shard.copy_(piece)
            for name, buffer in unwrap(model).named_buffers():
                buffer.copy_(full[name])
        per_rank = checkpoint["optimizer"]["per_rank"]
        optimizer.load_state_dict(per_rank[get_rank()])
    elif shard == "full":  # PyTorch's fully_shard: every rank read the whole file and keeps its shards
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, checkpoint["model"], options=options)
        set_optimizer_state_dict(model, optimizer, checkpoint["optimizer"], options=options)
    else:  # unsharded, and --shard optimizer: both optimizers load the whole state and keep their shard's
        unwrap(model).load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])


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
        signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        self.received = True

    def requested(self, device):
        flag = torch.tensor([1.0 if self.received else 0.0], device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0


class Checkpointer:
    """What train_ddp.py does with --checkpoint-dir, in one place.

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

    def __init__(self, directory, every, model, optimizer, run_args, device, steps_per_epoch):
        self.directory, self.every, self.model, self.optimizer = directory, every, model, optimizer
        self.run_args, self.device, self.steps_per_epoch = run_args, device, steps_per_epoch
        prepare_checkpoint_dir(directory)
        self.stop = StopSignal(signal.SIGUSR1)  # before resume(): a signal while loading is not lost
        self.shard = run_args.get("shard", "none")  # --shard: the state must be gathered before saving
        _, self.step = resume(directory, model, optimizer, run_args, device, steps_per_epoch, self.shard)
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
        if self.saved_step != self.step:
            model, optimizer = self.model, self.optimizer
            if self.shard != "none":  # every rank helps gather the state, then rank 0 writes it
                model, optimizer = map(Snapshot, full_state(self.model, self.optimizer, self.shard))
            save_checkpoint(self.directory, model, optimizer, self.epochs_done, self.step, self.run_args)
            self.saved_step = self.step
        return os.path.join(self.directory, LAST)
