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

The rest is given, in support/checkpoint.py: the folder's checks, resume() (which calls
load_checkpoint and refuses a checkpoint from a run with other arguments), the batch skipping of
a mid-epoch resume, the stop on SIGUSR1 that SLURM sends before a job's time limit, and the
Checkpointer that train_ddp.py uses; in support/checkpoint_state.py: under --impl ddp --shard the
gathering of the full state on every rank before rank 0 saves it (full_state, load_full_state),
and the sharded files' writing and reading (save_sharded, which calls your shard_index, and
open_sharded, which calls your read_overlaps). They call the four functions below through this
module (the bindings at its end), so your answers are the ones that run.
"""
import functools
import os  # os, tempfile and torch: for your answers
import sys
import tempfile

import torch

from support import checkpoint as given
from support import checkpoint_state as state
# Given, and what the tasks call: CheckpointError (a problem the user must fix: one line, no
# traceback), get_rank() (0 without a process group), unwrap(model) (the module inside a wrapper
# such as DistributedDataParallel), per_element(value, param) (whether a saved value holds one number
# per element: a flat's state, not a step count).
from support.checkpoint_state import LAST, PREVIOUS, CheckpointError, get_rank, per_element, unwrap


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
    becomes previous.pt (also with os.replace). If the write fails (a full disk), remove the
    temporary file and let the error through. Returns the path written on rank 0, None on
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
        if not per_element(value, saved[0][1]["param"]):
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


# ----------------------------------------------------------------------------- given
# The machinery of support/, bound to this module: it calls the four functions above through it, so
# the answers that run are this file's (or the ones a test swapped in for another task's).
_tasks = sys.modules[__name__]
Checkpointer = functools.partial(given.Checkpointer, _tasks)
resume = functools.partial(given.resume, _tasks)
save_sharded = functools.partial(state.save_sharded, _tasks)
open_sharded = functools.partial(state.open_sharded, _tasks)
check_arguments, run_arguments = given.check_arguments, given.run_arguments
full_state, load_full_state = state.full_state, state.load_full_state
