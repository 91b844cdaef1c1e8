"""Checkpoints under sharding: train_ddp.py --checkpoint-dir with --shard optimizer and --shard full.

    pytest tests/test_checkpoint_shard.py            # Task 6's ShardedOptimizer and Task 7's FSDP (solutions/)
    pytest -m slow tests/test_checkpoint_shard.py    # PyTorch's ZeroRedundancyOptimizer and fully_shard (--impl ddp)

The saving and the gathering (template_checkpoint.full_state, load_full_state, save_sharded) are
given code, so these tests check the repository with the solutions, not a student's tasks. The
reference is independent of the code under test: the same training run without interruption, and
a plain CNN() that the saved model must load into with strict=True (Tasks 6 and 7 save one file a
rank, last.shards/, glued together here from its index; tests/test_reshard.py resumes them on
other numbers of ranks).
"""
import os
import re
import signal
import time

import pytest
import torch

import train_ddp
from harness import run_ranks
from models import CNN
from test_checkpoint import STEPS_PER_EPOCH, TINY, finish, in_a_rank_like_torchruns, kill_rank_1_after, read, torchrun

pytestmark = pytest.mark.repo  # given code, run with the solutions: a student's Tasks 6-8 have their own tests


def read_checkpoint(folder):
    """folder's newest checkpoint as a dict: last.pt as saved; a sharded one (last.shards/, one file
    a rank) as its index, {"epoch", "step", "shards": every rank's file, in rank order}, and "model":
    the full model glued from the pieces' "param" by their index, independently of the code under test."""
    folder = str(folder)
    if os.path.exists(f"{folder}/last.pt"):
        return read(f"{folder}/last.pt")
    index = read(f"{folder}/last.shards/index.pt")
    shards = [read(f"{folder}/last.shards/{name}") for name in index["files"]]
    sizes = {name: p.numel() for name, p in CNN().named_parameters()}
    flat = {name: torch.full((numel,), float("nan")) for name, numel in sizes.items()}
    for shard in shards:
        for record in shard["flats"]:
            for name, offset, length, at in record["entries"]:
                flat[name][offset:offset + length] = record["tensors"]["param"][at:at + length]
    shapes = {name: p.shape for name, p in CNN().named_parameters()}
    model = {**{name: value.view(shapes[name]) for name, value in flat.items()}, **index["buffers"]}
    return {"epoch": index["epoch"], "step": index["step"], "shards": shards, "model": model,
            "optimizer": [shard["flats"] for shard in shards]}


def _train(impl, extra):
    """train_ddp.py's training in a harness rank, as test_checkpoint._train, with the solutions'
    trainer and loaders also for --impl ddp (as train_ddp.main does); 128 images: 4 steps an epoch."""
    in_a_rank_like_torchruns()  # one thread
    args = train_ddp.parse_args(["--impl", impl, *TINY, "--train-samples", "128", "--test-samples", "32", *extra])
    rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    return train_ddp.train(args, rank, world_size, torch.device("cpu"))


def _signal_after(steps):
    """A train_ddp.Counted that sends this process SIGUSR1 once `steps` batches have been trained
    on (as SLURM's warning before the time limit would), so the run stops mid-epoch, after that step."""
    counted = train_ddp.Counted

    class SignalAfter(counted):
        def __iter__(self):
            for number, batch in enumerate(super().__iter__(), 1):
                yield batch
                if number == steps:  # before the next batch is asked for, where the step is counted
                    os.kill(os.getpid(), signal.SIGUSR1)
    return SignalAfter


def _stop_and_resume(rank, world_size, impl, shards, root, epochs, stop_after):
    """For each --shard in shards: an uninterrupted run of `epochs` epochs; then one stopped by SIGUSR1 after
    `stop_after` steps, and the same command again, which resumes. Returns, on rank 0, for each
    shard: (stopped at, the two final checkpoints, exit codes)."""
    results = {}
    for shard in shards:
        extra = ["--shard", shard, "--optimizer", "adamw", "--epochs", str(epochs)]
        whole_code = _train(impl, [*extra, "--checkpoint-dir", f"{root}/{shard}-whole"])
        counted = train_ddp.Counted
        train_ddp.Counted = _signal_after(stop_after)
        try:
            _train(impl, [*extra, "--checkpoint-dir", f"{root}/{shard}-parts"])
        finally:
            train_ddp.Counted = counted
        torch.distributed.barrier()
        stopped = read_checkpoint(f"{root}/{shard}-parts")
        resumed_code = _train(impl, [*extra, "--checkpoint-dir", f"{root}/{shard}-parts"])
        torch.distributed.barrier()
        results[shard] = ((stopped["epoch"], stopped["step"]), read_checkpoint(f"{root}/{shard}-whole"),
                          read_checkpoint(f"{root}/{shard}-parts"), (whole_code, resumed_code))
    return results if rank == 0 else None


def _equal(a, b, where=""):
    """The entries of two nested states that differ (tensors compared bit for bit)."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return [] if torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b) else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where} keys {sorted(map(str, a.keys() ^ b.keys()))}"]
        return [d for k in a for d in _equal(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return [f"{where} length"] if len(a) != len(b) else [d for i, (x, y) in enumerate(zip(a, b))
                                                             for d in _equal(x, y, f"{where}/{i}")]
    return [] if a == b else [where]


def _check(label, result, epochs, stop_after):
    stopped, whole, resumed, codes = result
    assert codes == (0, 0), f"{label}: the ranks' parameters differ at the end (exit codes {codes})"
    assert stopped == (0, stop_after), (
        f"{label}: the stop after SIGUSR1 saved (epoch, step) = {stopped}, expected (0, {stop_after})")
    assert (resumed["epoch"], resumed["step"]) == (epochs, 4 * epochs), (resumed["epoch"], resumed["step"])
    for checkpoint in (whole, resumed):  # the plain model, full tensors, as one process holds it
        CNN().load_state_dict(checkpoint["model"], strict=True)
        assert all(type(t) is torch.Tensor for t in checkpoint["model"].values()), \
            f"{label}: the checkpoint's model holds {set(type(t).__name__ for t in checkpoint['model'].values())}"
    differ = _equal(whole["model"], resumed["model"], "model")
    assert not differ, f"{label}: stopped after step {stop_after} and resumed, {differ} differ from the uninterrupted run"
    differ = _equal(whole["optimizer"], resumed["optimizer"], "optimizer")
    assert not differ, f"{label}: the resumed run's optimizer state differs from the uninterrupted run's at {differ}"
    return whole


# 128 images, global batch 32: 4 steps an epoch; SIGUSR1 in the middle of epoch 1. Both shardings in
# one group of processes: starting the ranks costs more than their training. The default run trains
# one epoch (stopped after step 2), the slow one two (after step 3), so the resume also starts an epoch.
def test_sharded_runs_stopped_mid_epoch_and_resumed_end_bit_identical(tmp_path):
    results = run_ranks(_stop_and_resume, 2, "solutions", ["optimizer", "full"], str(tmp_path), 1, 2, timeout=120)[0]
    for shard in ("optimizer", "full"):
        whole = _check(f"--shard {shard}", results[shard], 1, 2)
        assert len(whole["shards"]) == 2, f"--shard {shard}: one file a rank"
        # together the ranks' files hold AdamW's state for every element of every parameter
        covered = {name: 0 for name, _ in CNN().named_parameters()}
        for flats in whole["optimizer"]:
            for record in flats:
                assert {"exp_avg", "exp_avg_sq", "step"} <= set(record["tensors"]), sorted(record["tensors"])
                for name, _, length, _ in record["entries"]:
                    covered[name] += length
        sizes = {name: p.numel() for name, p in CNN().named_parameters()}
        assert covered == sizes, f"--shard {shard}: the files hold the state of {covered} elements, not {sizes}"


@pytest.mark.slow
def test_pytorch_sharded_runs_stopped_mid_epoch_and_resumed_end_bit_identical(tmp_path):
    """--impl ddp: ZeroRedundancyOptimizer (consolidate_state_dict) and fully_shard (DTensors)."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        shards = ["optimizer", "full"]
    except ImportError:  # torch before 2.6: ZeroRedundancyOptimizer only
        shards = ["optimizer"]
    results = run_ranks(_stop_and_resume, 2, "ddp", shards, str(tmp_path), 2, 3, timeout=120)[0]
    for shard in shards:
        _check(f"--impl ddp --shard {shard}", results[shard], 2, 3)


@pytest.mark.slow
def test_sharded_runs_stopped_and_resumed_over_two_epochs_end_bit_identical(tmp_path):
    results = run_ranks(_stop_and_resume, 2, "solutions", ["optimizer", "full"], str(tmp_path), 2, 3, timeout=120)[0]
    for shard in ("optimizer", "full"):
        _check(f"--shard {shard}", results[shard], 2, 3)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_torchrun_restarts_a_killed_rank_of_an_fsdp_run_and_ends_bit_identical(tmp_path):
    """--shard full --optimizer adamw --checkpoint-every 5 under torchrun --max-restarts=1: SIGKILL
    rank 1 right after a checkpoint inside epoch 2; the restarted ranks resume from it and end with
    the uninterrupted run's model and per-rank optimizer state, bit for bit."""
    extra = ["--shard", "full", "--optimizer", "adamw", "--checkpoint-every", "5"]
    code, out = finish(torchrun(tmp_path / "whole", *extra, restarts=0), time.monotonic() + 150)
    assert code == 0, out
    proc = torchrun(tmp_path / "ckpt", *extra)
    deadline = time.monotonic() + 150
    killed = kill_rank_1_after(proc, tmp_path / "ckpt", deadline, lambda epoch, step: step > STEPS_PER_EPOCH,
                               "last.shards/index.pt")
    code, out = finish(proc, deadline)
    assert killed, f"rank 1 was never killed: no checkpoint inside epoch 2 appeared in time:\n{out}"
    assert code == 0, f"torchrun failed after rank 1 was killed at {killed}:\n{out}"
    resumed = re.findall(r"resuming from \S+: (\d+) epochs and (\d+) steps done", out)
    assert resumed and int(resumed[-1][1]) > STEPS_PER_EPOCH, f"no resume inside epoch 2:\n{out}"
    whole, final = read_checkpoint(tmp_path / "whole"), read_checkpoint(tmp_path / "ckpt")
    CNN().load_state_dict(final["model"], strict=True)
    assert (final["epoch"], final["step"]) == (2, 2 * STEPS_PER_EPOCH), out
    differ = _equal(whole["model"], final["model"], "model") + _equal(whole["optimizer"], final["optimizer"], "optimizer")
    assert not differ, f"after the restart {differ} differ from the uninterrupted run:\n{out}"
