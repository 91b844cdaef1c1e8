"""Task 8: survive failures with checkpoints, so that a killed rank loses minutes, not the run.

    torchrun --standalone --nproc_per_node=2 --max-restarts=3 train_ddp.py --checkpoint-dir runs/ckpt
    torchrun ... train_ddp.py --checkpoint-dir runs/ckpt --checkpoint-every 50   # also every 50 steps
    pytest --impl template -m "task8_1 or task8_2"                               # check your work
    torchrun --nnodes=1:2 ... train_ddp.py --checkpoint-dir ckpt     # a node lost, a node back (docs)

After every epoch (and every --checkpoint-every steps) rank 0 writes DIR/last.pt and keeps
the one before as DIR/previous.pt. When a run starts and DIR holds a checkpoint, every rank
loads it and training continues at the same epoch and batch, so a resumed run ends with the
same parameters, bit for bit, as one that was never interrupted. docs/task8-checkpoints.md
explains each decision.

    Task 8.1  save_checkpoint  rank 0 writes the checkpoint atomically, keeping the previous one
    Task 8.2  load_checkpoint  every rank reads the newest checkpoint that is readable
    Task 8.3  shard_index      what a rank's shard holds: parameter, global offset, length; padding
    Task 8.4  read_overlaps    a rank's state on M ranks, glued from the pieces N ranks saved

A checkpoint resumes on any number of ranks: a step trains on the same global batch whatever
the world size, and the position is saved in global steps. Under Task 6's ShardedOptimizer and
Task 7's FSDP each rank saves its own shard with an index (DIR/last.shards/), and a resumed
rank reads only the pieces that overlap its new shard (Tasks 8.3 and 8.4).

The rest is given: the folder's checks, resume() (which calls load_checkpoint and refuses a
checkpoint from a run with other arguments), the batch skipping of a mid-epoch resume, the
stop on SIGUSR1 that SLURM sends before a job's time limit, under --impl ddp --shard the
gathering of the full state on every rank before rank 0 saves it (full_state,
load_full_state), and the sharded files' writing and reading (save_sharded, open_sharded).
"""
import os
import shutil
import signal
import tempfile
import threading

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
    if get_rank() != 0:
        return None
    state = {"model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
             "epoch": epoch, "step": step, "args": dict(args)}
    last = os.path.join(directory, LAST)
    # The same folder, so that os.replace is a rename within one file system, which is atomic.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=LAST + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # on the disk before the rename makes it the checkpoint
        if os.path.exists(last):
            os.replace(last, os.path.join(directory, PREVIOUS))
        os.replace(tmp, last)
    except Exception:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return last
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
    unreadable = []
    for name in (LAST, PREVIOUS):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            continue
        try:
            return torch.load(path, map_location=device, weights_only=True), path
        except Exception as error:  # truncated zip, bad pickle, forbidden class: all unreadable
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0].split(". ")[0]
            then = "; trying previous.pt" if name == LAST else ""
            print(f"[rank {get_rank()}] checkpoint {path} cannot be read ({reason[:200]}){then}", flush=True)
            unreadable.append(path)
    if unreadable:
        raise CheckpointError(f"no readable checkpoint in {directory} ({', '.join(unreadable)} cannot be read): "
                              "move them away to start from scratch, or restore a good copy")
    return None, None
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


def resume(directory, model, optimizer, run_args, device, steps_per_epoch, shard="none"):
    """Restore model and optimizer from the newest readable checkpoint in directory.

    Returns (epochs completed, optimizer steps completed); (0, 0) when there is none.
    Every rank calls it (shard: --shard, how the model and optimizer are split; see
    load_full_state). A corrupt last.pt is renamed last.pt.corrupt (by rank 0, after
    every rank has tried it), so that the next save does not turn it into previous.pt over
    the good checkpoint that this run resumed from. Under Task 6's ShardedOptimizer and Task 7's
    FSDP the checkpoint is sharded (save_sharded, open_sharded) and may come from another
    number of ranks; so may a full one.
    """
    if reshardable(model, optimizer):
        return _resume_sharded(directory, model, optimizer, run_args, steps_per_epoch)
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
    resharding = check_arguments(checkpoint["args"], run_args, path)
    epoch, step = _position(checkpoint, path, steps_per_epoch)
    load_full_state(model, optimizer, checkpoint, shard)
    last = os.path.join(directory, LAST)
    if path != last and os.path.exists(last) and get_rank() == 0:
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


def _resume_sharded(directory, model, optimizer, run_args, steps_per_epoch):
    """resume() for sharded checkpoints: each rank reads the pieces that overlap its own."""
    opened, path = open_sharded(directory, model, optimizer)
    if opened is None:
        return 0, 0
    resharding = check_arguments(opened.meta["args"], run_args, path)
    epoch, step = _position(opened.meta, path, steps_per_epoch)
    opened.apply()
    last = os.path.join(directory, LAST_SHARDS)
    _barrier()  # every rank has read it before rank 0 moves the corrupt one away
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
      --shard full       PyTorch's fully_shard: its optimizer state gathered to full tensors, keyed
                         by parameter name (torch.distributed.checkpoint.state_dict, full_state_dict=True).
    Task 6's ShardedOptimizer and Task 7's FSDP are saved as shards instead (save_sharded); here
    Task 7's FSDP gives its full model only (and None for the optimizer), for a plain CNN().
    """
    if shard == "optimizer":
        if hasattr(optimizer, "consolidate_state_dict"):  # ZeroRedundancyOptimizer
            optimizer.consolidate_state_dict(to=0)
            optim_state = optimizer.state_dict() if get_rank() == 0 else None
        else:  # Task 6's ShardedOptimizer: state_dict() is the collective
            optim_state = optimizer.state_dict()
        return unwrap(model).state_dict(), optim_state
    if shard == "full" and hasattr(model, "gather_full_params"):  # Task 7's FSDP: the model only
        model_state = model.gather_full_params()
        buffers = unwrap(model).named_buffers()  # not sharded: every rank holds them whole
        model_state.update((name, buffer.detach().clone()) for name, buffer in buffers)
        return model_state, None
    if shard == "full":  # PyTorch's fully_shard: its parameters and state are DTensors
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # full tensors, on rank 0
        return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)
    return unwrap(model).state_dict(), optimizer.state_dict()


def load_full_state(model, optimizer, checkpoint, shard):
    """Put a checkpoint's full model (and its optimizer state) back into a model that may be
    sharded: the inverse of full_state, on every rank, bit for bit."""
    if shard == "full" and hasattr(model, "gather_full_params"):  # Task 7's FSDP: cut the full model again
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
    elif shard == "full":  # PyTorch's fully_shard: every rank read the whole file and keeps its shards
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, checkpoint["model"], options=options)
        set_optimizer_state_dict(model, optimizer, checkpoint["optimizer"], options=options)
    else:  # unsharded, and --shard optimizer: both optimizers load the whole state and keep their shard's
        unwrap(model).load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])


# ------------------------------- resharded checkpoints: N ranks save, M ranks load (Task 8.3, 8.4)
#
# Under --shard optimizer (Task 6) and --shard full (Task 7) each rank writes the shard it holds,
# with an index of what it holds, into DIR/last.shards/: rank-00000-of-00004.pt, ... and
# index.pt (rank 0: every rank's index, the training position, the arguments, the buffers).
# A run on any number of ranks M reads index.pt, works out which saved pieces overlap the
# pieces it holds now, and opens only the files that hold them (memory-mapped: only the bytes
# it copies are read from the disk). A "flat" is a 1-D tensor a rank holds (Task 7: a unit's
# shard, padding included; Task 6: one piece of a parameter); its index lists which elements
# of which parameter it holds, as (name, offset, length, at): elements offset..offset+length-1
# of the flattened parameter `name` are at at..at+length-1 of the flat.

LAST_SHARDS, PREVIOUS_SHARDS, INDEX = "last.shards", "previous.shards", "index.pt"


def shard_index(names, numels, start, end):
    """The index of elements start..end-1 of a line of parameters laid end to end, and its padding.

    names, numels: the parameters of the line, in order (Task 7: a unit's parameters, whose
    flat tensor is this line, padded with zeros to a multiple of the world size); the line
    holds sum(numels) elements, followed by padding. A rank holds [start, end) of it, which may
    run past the parameters into the padding (the last ranks of a unit).
    Returns (entries, padding): entries, one (name, offset, length, at) for each parameter that
    [start, end) overlaps, in the line's order: its elements offset..offset+length-1 (offset
    counted from the start of THAT PARAMETER, not of the rank's shard: only a global position
    means the same thing on another number of ranks) are elements at..at+length-1 of the
    rank's flat (at counted from start). padding: how many of the end - start elements are
    padding, not data; no entry may cover them, or a reader takes zeros for the last parameter's
    values. Example: sizes [6, 4] (names "w", "b"), shards of 3 (4 ranks, padded to 12):
    rank 1, [3, 6): ([("w", 3, 3, 0)], 0); rank 2, [6, 9): ([("b", 0, 3, 0)], 0);
    rank 3, [9, 12): ([("b", 3, 1, 0)], 2).
    """
    # --- Task 8.3 begin ---
    entries = []
    offset = 0  # where this parameter begins on the line
    for name, numel in zip(names, numels):
        low, high = max(start, offset), min(end, offset + numel)
        if low < high:
            entries.append((name, low - offset, high - low, low - start))
        offset += numel
    padding = (end - start) - sum(length for _, _, length, _ in entries)
    return entries, padding
    # --- Task 8.3 end ---


def read_overlaps(wanted, numel, saved):
    """The state of a flat that a rank holds now, glued from the saved flats that overlap it.

    wanted: the new flat's index, [(name, offset, length, at)] (shard_index); numel: its size,
    padding included. saved: [(entries, tensors)], the saved flats that overlap it, from one or
    several old ranks' files and in no particular order: entries their index, tensors their
    state, {"param": the flat, "exp_avg": ..., "exp_avg_sq": ..., "step": tensor(12.)}.
    Returns {key: value} for every key of the saved tensors:
      - a key whose saved value holds one number per element of its flat (a 1-D tensor of the
        flat's size: param, exp_avg, momentum_buffer): a new 1-D tensor of numel elements,
        zero where the new flat is padding, with each wanted entry's elements copied from the
        parts of the saved entries of the same name that overlap it, glued in the order of
        their offsets in the parameter (not in the order of `saved`, which is the order the
        files happened to come in); a saved flat's padding is never data;
      - any other key (AdamW's "step", the number of steps taken): its value in a saved flat
        (every rank held the same), unchanged: without it Adam starts its bias correction
        again and the resumed run takes other steps.
    Raise CheckpointError if some wanted element is in no saved entry.
    """
    # --- Task 8.4 begin ---
    state = {}
    for key, value in (saved[0][1].items() if saved else ()):
        if not _per_element(value, saved[0][1]["param"]):
            state[key] = value.clone() if torch.is_tensor(value) else value
            continue
        flat = value.new_zeros(numel)
        for name, offset, length, at in wanted:
            parts = []
            for entries, tensors in saved:
                for saved_name, saved_offset, saved_length, saved_at in entries:
                    low, high = max(offset, saved_offset), min(offset + length, saved_offset + saved_length)
                    if saved_name == name and low < high:
                        begin = saved_at + low - saved_offset
                        parts.append((low, tensors[key][begin:begin + high - low]))
            parts.sort(key=lambda part: part[0])  # by position in the parameter
            if sum(part.numel() for _, part in parts) != length:
                raise CheckpointError(f"the checkpoint does not hold elements {offset}..{offset + length - 1} "
                                      f"of {name} ({key})")
            flat[at:at + length] = torch.cat([part for _, part in parts])
        state[key] = flat
    return state
    # --- Task 8.4 end ---


def _per_element(value, param):
    """Whether a saved state value holds one number per element of its flat (not a step count)."""
    return torch.is_tensor(value) and value.dim() == 1 and value.numel() == param.numel()


def reshardable(model, optimizer):
    """Whether this training's state is saved as shards: Task 6's ShardedOptimizer or Task 7's FSDP."""
    return hasattr(model, "units") or hasattr(optimizer, "pieces")


class Flat:
    """One 1-D tensor this rank holds, its index, and where its loaded state goes (given)."""

    def __init__(self, entries, padding, numel, tensors, put, keys=None, param_elsewhere=False):
        self.entries, self.padding, self.numel = entries, padding, numel
        self.tensors = tensors  # () -> {"param": ..., state...}: what saving writes
        self.put = put          # {"param": ..., state...} -> None: what loading does with it
        self.keys = keys        # the keys loading wants (None: all)
        self.param_elsewhere = param_elsewhere  # its "param" is loaded by another flat (Task 6's whole parameters)


def _cpu(value):
    # a copy: saving a view would write the whole storage it views (the whole parameter)
    return value.detach().cpu().clone() if torch.is_tensor(value) else value


def flats(model, optimizer):
    """The flats this rank holds: what it saves, and what it loads on any number of ranks."""
    if hasattr(model, "units"):  # Task 7's FSDP: one flat a unit, its padded shard
        result = []
        for unit in model.units:
            names = [name for name, owner, _ in sorted((n for n in model._names if n[1] is unit), key=lambda n: n[2])]
            size = unit.shard.numel()
            entries, padding = shard_index(names, unit.numels, unit.rank * size, (unit.rank + 1) * size)

            def tensors(unit=unit):
                return {"param": _cpu(unit.shard), **{k: _cpu(v) for k, v in optimizer.state.get(unit.shard, {}).items()}}

            def put(state, unit=unit):
                with torch.no_grad():
                    unit.shard.copy_(state.pop("param"))
                if state:
                    optimizer.state[unit.shard] = {k: v.to(unit.shard.device) if torch.is_tensor(v) else v
                                                   for k, v in state.items()}
            result.append(Flat(entries, padding, size, tensors, put))
        return result
    # Task 6's ShardedOptimizer: one flat a piece this rank owns; every rank also loads every
    # parameter whole (each holds the whole model), but from the saved flats' "param" only
    names = {id(param): name for name, param in unwrap(model).named_parameters()}
    result = []
    for view, param, start, end, rank in optimizer.pieces:
        if rank != optimizer.rank:
            continue

        def tensors(view=view):
            return {"param": _cpu(view), **{k: _cpu(v) for k, v in optimizer.optim.state.get(view, {}).items()}}

        def put(state, view=view):
            state.pop("param")  # the whole parameters below set it
            if state:
                optimizer.optim.state[view] = {k: v.to(view.device) if torch.is_tensor(v) else v
                                               for k, v in state.items()}
        result.append(Flat([(names[id(param)], start, end - start, 0)], 0, end - start, tensors, put,
                           param_elsewhere=True))
    for name, param in unwrap(model).named_parameters():
        def put(state, param=param):
            with torch.no_grad():
                param.view(-1).copy_(state["param"])
        result.append(Flat([(name, 0, param.numel(), 0)], 0, param.numel(), None, put, keys=("param",)))
    return result


def _write_atomic(path, obj):
    """torch.save obj to path: a temporary file in the same folder, fsynced, then renamed (Task 8.1's way)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the renames inside it are on the disk too
    finally:
        os.close(fd)


def shard_file(rank, world_size):
    return f"rank-{rank:05d}-of-{world_size:05d}.pt"


def save_sharded(directory, model, optimizer, epoch, step, args):
    """Every rank writes its flats to directory/last.shards/, rank 0 the index; atomic as a whole.

    The ranks write into last.shards.tmp/; when every rank's file is on the disk (a barrier),
    rank 0 writes index.pt, then turns last.shards into previous.shards and the new folder into
    last.shards, each with os.replace. A crash at any moment leaves a complete last.shards or
    a complete previous.shards. A collective: every rank calls it at the same step.
    Returns the folder written.
    """
    rank = get_rank()
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    last, previous = os.path.join(directory, LAST_SHARDS), os.path.join(directory, PREVIOUS_SHARDS)
    tmp = last + ".tmp"
    if rank == 0:  # what a save cut short by a kill left behind
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    _barrier()
    mine = [flat for flat in flats(model, optimizer) if flat.tensors is not None]
    _write_atomic(os.path.join(tmp, shard_file(rank, world_size)),
                  {"flats": [{"entries": f.entries, "padding": f.padding, "tensors": f.tensors()} for f in mine]})
    index = [(f.entries, f.padding, f.numel) for f in mine]
    indexes = [None] * world_size if rank == 0 else None
    if world_size > 1:
        dist.gather_object(index, indexes, dst=0)
    else:
        indexes = [index]
    if rank == 0:
        groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        _write_atomic(os.path.join(tmp, INDEX), {
            "world_size": world_size, "files": [shard_file(r, world_size) for r in range(world_size)],
            "flats": indexes, "step": step, "epoch": epoch, "args": dict(args), "param_groups": groups,
            "buffers": {name: _cpu(b) for name, b in unwrap(model).named_buffers()}})
        _fsync_dir(tmp)
        if os.path.exists(last):
            shutil.rmtree(previous, ignore_errors=True)
            os.replace(last, previous)
        os.replace(tmp, last)
        _fsync_dir(directory)
    _barrier()  # no rank goes on (or saves again) before the checkpoint is complete
    return last


def _barrier():
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _agree(ok):
    """True on every rank if ok is True on every rank."""
    flag = torch.tensor([1.0 if ok else 0.0])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return flag.item() > 0


def _overlap(a, b):
    """Whether two indexes share an element of some parameter."""
    return any(name == other and max(offset, o) < min(offset + length, o + l)
               for name, offset, length, _ in a for other, o, l, _ in b)


def open_sharded(directory, model, optimizer):
    """The newest readable sharded checkpoint in directory, opened: (Resharded, path), or (None, None).

    Every rank reads index.pt, then opens only the old ranks' files that hold a piece that
    overlaps one of its flats (memory-mapped). A file that cannot be read on any rank makes
    every rank report it and try previous.shards; if checkpoints exist but none can be read,
    CheckpointError. A collective: the ranks agree on which checkpoint they use.
    """
    failed = []
    for name in (LAST_SHARDS, PREVIOUS_SHARDS):
        path = os.path.join(directory, name)
        everywhere, nowhere = _agree(os.path.isdir(path)), _agree(not os.path.isdir(path))
        if nowhere:
            continue
        if not everywhere:
            raise CheckpointError(f"some ranks see {path} and others do not: --checkpoint-dir must be a folder "
                                  "every node sees")
        opened, problem = None, None
        try:
            opened = Resharded(path, model, optimizer)
        except Exception as error:  # a missing, truncated or corrupt file
            problem = (str(error).strip().splitlines() or [type(error).__name__])[0].split(". ")[0][:200]
            then = "; trying previous.shards" if name == LAST_SHARDS else ""
            print(f"[rank {get_rank()}] checkpoint {path} cannot be read ({problem}){then}", flush=True)
        if _agree(problem is None):
            return opened, path
        failed.append(path)
    if failed:
        raise CheckpointError(f"no readable checkpoint in {directory} ({', '.join(failed)} cannot be read): "
                              "move them away to start from scratch, or restore a good copy")
    return None, None


class Resharded:
    """A sharded checkpoint opened for this rank's flats (on any number of ranks): what it needs
    from which old rank's file, and, once apply() has run, how many bytes it read."""

    def __init__(self, path, model, optimizer):
        self.path, self.model, self.optimizer = path, model, optimizer
        self.meta = torch.load(os.path.join(path, INDEX), weights_only=True)
        self.flats = flats(model, optimizer)
        saved = [(rank, i, entries) for rank, mine in enumerate(self.meta["flats"])
                 for i, (entries, _, _) in enumerate(mine)]
        self.plan = [[(rank, i) for rank, i, entries in saved if _overlap(flat.entries, entries)]
                     for flat in self.flats]
        self.ranks = sorted({rank for needed in self.plan for rank, _ in needed})
        self.files = {}
        for rank in self.ranks:  # opened now, so that a corrupt file shows before anything is loaded
            self.files[rank] = torch.load(os.path.join(path, self.meta["files"][rank]), weights_only=True, mmap=True)
        self.bytes_read = 0
        self.bytes_total = sum(os.path.getsize(os.path.join(path, f)) for f in self.meta["files"])

    def apply(self):
        """Load every flat of this rank; the buffers; the optimizer's hyperparameters."""
        for flat, needed in zip(self.flats, self.plan):
            saved = []
            for rank, i in needed:
                record = self.files[rank]["flats"][i]
                tensors = {k: v for k, v in record["tensors"].items() if flat.keys is None or k in flat.keys}
                saved.append((record["entries"], tensors))
                self.bytes_read += sum(_overlap_numel(flat.entries, record["entries"]) * v.element_size()
                                       for k, v in tensors.items() if _per_element(v, record["tensors"]["param"])
                                       and not (k == "param" and flat.param_elsewhere))  # read once, counted once
            flat.put(read_overlaps(flat.entries, flat.numel, saved))
        with torch.no_grad():
            for name, buffer in unwrap(self.model).named_buffers():
                buffer.copy_(self.meta["buffers"][name])
        for group, options in zip(self.optimizer.param_groups, self.meta["param_groups"]):
            group.update(options)


def _overlap_numel(a, b):
    return sum(max(0, min(offset + length, o + l) - max(offset, o))
               for name, offset, length, _ in a for other, o, l, _ in b if name == other)


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
        sharded = reshardable(self.model, self.optimizer)  # Tasks 6 and 7: each rank writes its shard
        if self.saved_step != self.step:
            if sharded:
                save_sharded(self.directory, self.model, self.optimizer, self.epochs_done, self.step, self.run_args)
            else:
                model, optimizer = self.model, self.optimizer
                if self.shard != "none":  # every rank helps gather the state, then rank 0 writes it
                    model, optimizer = map(Snapshot, full_state(self.model, self.optimizer, self.shard))
                save_checkpoint(self.directory, model, optimizer, self.epochs_done, self.step, self.run_args)
            self.saved_step = self.step
        return os.path.join(self.directory, LAST_SHARDS if sharded else LAST)
