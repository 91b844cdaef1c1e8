"""What a checkpoint holds and how it is written and read, given code for Task 8 (template_checkpoint.py):
the full state gathered under --shard before rank 0 saves it (full_state, load_full_state), and the
sharded files that Task 6's ShardedOptimizer and Task 7's FSDP save, one per rank, and that any
number of ranks reads back (save_sharded, open_sharded). The functions that need a task's answer
take `tasks`, the template_checkpoint module of --impl, and call tasks.shard_index (Task 8.3) and
tasks.read_overlaps (Task 8.4) through it: the answers that run are the template's (or the ones a
test swapped in)."""
import os
import shutil

import torch
import torch.distributed as dist

LAST, PREVIOUS = "last.pt", "previous.pt"


class CheckpointError(ValueError):
    """A checkpoint problem the user must fix; train_ddp.py prints it as one line and exits."""


def get_rank():
    return dist.get_rank() if dist.is_initialized() else 0


def unwrap(model):
    """The plain module inside DistributedDataParallel (or any wrapper with .module): its
    state_dict has no "module." prefixes, so a checkpoint loads with or without the wrapper."""
    return model.module if hasattr(model, "module") else model


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


# ------------------------------------------ resharded checkpoints: N ranks save, M ranks load
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


def per_element(value, param):
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


def flats(tasks, model, optimizer):
    """The flats this rank holds: what it saves, and what it loads on any number of ranks (Task 8.3's
    tasks.shard_index says what each holds)."""
    if hasattr(model, "units"):  # Task 7's FSDP: one flat a unit, its padded shard
        result = []
        for unit in model.units:
            names = [name for name, owner, _ in sorted((n for n in model._names if n[1] is unit), key=lambda n: n[2])]
            size = unit.shard.numel()
            entries, padding = tasks.shard_index(names, unit.numels, unit.rank * size, (unit.rank + 1) * size)

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


def _fsync(path):
    """Put a file's bytes, or a folder's entries (the renames inside it), on the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_synced(path, obj):
    """torch.save obj to path, on the disk before it returns. Not atomic on its own, and no need:
    it writes into last.shards.tmp/, which becomes the checkpoint only once every file is complete."""
    torch.save(obj, path)
    _fsync(path)


def shard_file(rank, world_size):
    return f"rank-{rank:05d}-of-{world_size:05d}.pt"


def save_sharded(tasks, directory, model, optimizer, epoch, step, args):
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
    barrier()
    mine = [flat for flat in flats(tasks, model, optimizer) if flat.tensors is not None]
    _save_synced(os.path.join(tmp, shard_file(rank, world_size)),
                  {"flats": [{"entries": f.entries, "padding": f.padding, "tensors": f.tensors()} for f in mine]})
    index = [(f.entries, f.padding, f.numel) for f in mine]
    indexes = [None] * world_size if rank == 0 else None
    if world_size > 1:
        dist.gather_object(index, indexes, dst=0)
    else:
        indexes = [index]
    if rank == 0:
        groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        _save_synced(os.path.join(tmp, INDEX), {
            "world_size": world_size, "files": [shard_file(r, world_size) for r in range(world_size)],
            "flats": indexes, "step": step, "epoch": epoch, "args": dict(args), "param_groups": groups,
            "buffers": {name: _cpu(b) for name, b in unwrap(model).named_buffers()}})
        _fsync(tmp)
        if os.path.exists(last):
            shutil.rmtree(previous, ignore_errors=True)
            os.replace(last, previous)
        os.replace(tmp, last)
        _fsync(directory)
    barrier()  # no rank goes on (or saves again) before the checkpoint is complete
    return last


def barrier():
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


def open_sharded(tasks, directory, model, optimizer):
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
            opened = Resharded(tasks, path, model, optimizer)
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

    def __init__(self, tasks, path, model, optimizer):
        self.tasks, self.path, self.model, self.optimizer = tasks, path, model, optimizer
        self.meta = torch.load(os.path.join(path, INDEX), weights_only=True)
        self.flats = flats(tasks, model, optimizer)
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
                                       for k, v in tensors.items() if per_element(v, record["tensors"]["param"])
                                       and not (k == "param" and flat.param_elsewhere))  # read once, counted once
            flat.put(self.tasks.read_overlaps(flat.entries, flat.numel, saved))
        with torch.no_grad():
            for name, buffer in unwrap(self.model).named_buffers():
                buffer.copy_(self.meta["buffers"][name])
        for group, options in zip(self.optimizer.param_groups, self.meta["param_groups"]):
            group.update(options)


def _overlap_numel(a, b):
    return sum(max(0, min(offset + length, o + l) - max(offset, o))
               for name, offset, length, _ in a for other, o, l, _ in b if name == other)
