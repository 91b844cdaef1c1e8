"""Task 8: checkpoints that survive a crash, and a resume that loses nothing (template_checkpoint.py).

    pytest --impl template -m task8_1      # save_checkpoint
    pytest --impl template -m task8_2      # load_checkpoint, and resuming train_ddp.py with it
    pytest -m slow tests/test_checkpoint.py   # train_ddp.py's error lines, and ranks killed under torchrun

The references are independent of the code under test: the files are read back with
torch.load, written for load_checkpoint with torch.save, and a resumed training is compared
with the same training run without interruption, bit for bit.
"""
import errno
import os
import pathlib
import pickle
import re
import signal
import stat
import subprocess
import sys
import time
import warnings

import pytest
import torch
from torch import nn

import train_ddp
from conftest import REFERENCE, load
from harness import run_ranks
from support.interrupt import worker_pid
from wire import COLLECTIVES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T81 = "Task 8.1 (template_checkpoint.py, save_checkpoint)"
T82 = "Task 8.2 (template_checkpoint.py, load_checkpoint)"


class Wrapper(nn.Module):
    """Stands in for DistributedDataParallel: the model is its .module, and its own
    state_dict has "module." before every key."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def trained(seed=0):
    """A small model and an SGD optimizer that has taken one step, so it holds momentum."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for param in model.parameters():  # gradients by hand: a first backward() costs seconds in a fresh process
        param.grad = torch.randn_like(param)
    optimizer.step()
    return model, optimizer


def read(path):
    return torch.load(path, weights_only=True)


def same_tensors(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------- Task 8.1
def first_save(ckpt, directory, *args):
    """save_checkpoint into an empty folder, without a process group; the errors a student meets there, told.
    (Trial 11: each was a raw exception.)"""
    fsync, bad = os.fsync, []

    def fsync_told(fd):
        try:
            return fsync(fd)
        except OSError as error:
            bad.append(error)
            raise

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "fsync", fsync_told)
            return ckpt.save_checkpoint(directory, *args)
    except TypeError as error:
        if "vars() argument must have __dict__" not in str(error) or not isinstance(args[-1], dict):
            raise
        pytest.fail(f"{T81}: save_checkpoint raised TypeError: {error}: args is already a dict of the run's "
                    "arguments (run_arguments(args) made it), not an argparse Namespace: save it as it is, dict(args), "
                    "not vars(args)")
    except KeyError as error:
        if error.args[:1] not in (("RANK",), ("LOCAL_RANK",)) or error.args[0] in os.environ:
            raise
        pytest.fail(f"{T81}: without a process group (one process, no torchrun) save_checkpoint raised KeyError: "
                    f"{error}: it read the environment variable {error.args[0]}, which torchrun sets and a "
                    "single-process run does not. Use the given get_rank() (from support.checkpoint_state), the "
                    "process group's rank, 0 without one")
    except ValueError as error:
        if "process group has not been initialized" not in str(error):
            raise
        pytest.fail(f"{T81}: without a process group (one process, no torchrun) save_checkpoint raised "
                    f"{type(error).__name__}: {error} It asked torch.distributed for the rank: use the given "
                    "get_rank() (from support.checkpoint_state), which is 0 without a process group, so that a "
                    "single-process run saves too")
    except OSError as error:
        if bad and bad[-1] is error and error.errno == errno.EBADF:
            pytest.fail(f"{T81}: os.fsync raised {error} (EBADF): the descriptor it was given was closed. "
                        "os.fdopen(fd) owns fd and closes it when its with block ends: fsync inside that block, "
                        "f.flush() then os.fsync(f.fileno())")
        moved = (getattr(error, "filename", None), getattr(error, "filename2", None))
        if (isinstance(error, FileNotFoundError) and None not in moved
                and [os.path.abspath(m) for m in moved] == [os.path.join(os.path.abspath(directory), name)
                                                            for name in ("last.pt", "previous.pt")]):
            pytest.fail(f"{T81}: the first save, into an empty folder, raised {type(error).__name__}: {error}: there "
                        "is no last.pt to keep yet. Rename last.pt to previous.pt only if it exists "
                        "(os.path.exists(last))")
        raise


@pytest.mark.task8_1
def test_save_writes_model_optimizer_epoch_step_and_args(impl, tmp_path):
    ckpt = load(impl, "template_checkpoint")
    model, optimizer = trained()
    args = {"lr": 0.1, "batch_size": 64}
    path = first_save(ckpt, str(tmp_path), Wrapper(model), optimizer, 2, 17, args)
    if sorted(os.listdir(tmp_path)) == ["previous.pt"]:  # trial 11: a raw FileNotFoundError before
        pytest.fail(f"{T81}: the first save, into an empty folder, left only previous.pt, no last.pt: the new file "
                    "was renamed onto last.pt, then last.pt to previous.pt. Rotate first (the old last.pt, if any, "
                    "becomes previous.pt), then os.replace the temporary file onto last.pt")
    if isinstance(path, (str, os.PathLike)) and not os.path.exists(path) and (tmp_path / "last.pt").exists():
        # trial 11: the temporary file's path, returned after the rename (a raw FileNotFoundError before)
        pytest.fail(f"{T81}: it wrote last.pt but returned {str(path)!r}, a path that no longer exists (the temporary "
                    "file's, renamed onto last.pt): return the path of last.pt, os.path.join(directory, LAST)")
    assert path is not None and os.path.samefile(path, tmp_path / "last.pt"), (
        f"{T81}: on rank 0 (or without a process group) it must write last.pt and return its path, got {path!r}")
    saved = read(tmp_path / "last.pt")
    assert isinstance(saved, dict), f"{T81}: the checkpoint must be a dict, got {type(saved).__name__}"
    missing = [key for key in ("model", "optimizer", "epoch", "step", "args") if key not in saved]
    assert "optimizer" not in missing, (
        f"{T81}: no 'optimizer' entry: save the optimizer state (SGD's momentum buffers), or the resumed run "
        "takes different steps from the uninterrupted one")
    assert not {"epoch", "step"} & set(missing), (
        f"{T81}: no {' or '.join(k for k in ('epoch', 'step') if k in missing)} entry: without the epoch and "
        "step the resumed run starts its data over and trains some batches twice")
    assert not missing, f"{T81}: the checkpoint lacks {missing}"
    prefixed = [key for key in saved["model"] if key.startswith("module.")]
    assert not prefixed, (
        f"{T81}: the model's keys start with 'module.' ({prefixed[:2]}): save the plain module's state_dict "
        "(unwrap(model)), so that the checkpoint loads with or without the DistributedDataParallel wrapper")
    assert same_tensors(saved["model"], model.state_dict()), f"{T81}: 'model' is not the model's state_dict"
    momentum = [s.get("momentum_buffer") for s in saved["optimizer"].get("state", {}).values()]
    expected = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    assert len(momentum) == len(expected) and all(
        m is not None and torch.equal(m, e) for m, e in zip(momentum, expected)), (
        f"{T81}: 'optimizer' does not hold the momentum buffers: save optimizer.state_dict()")
    assert (saved["epoch"], saved["step"]) == (2, 17), (
        f"{T81}: epoch and step saved as {saved['epoch']}, {saved['step']}, expected the arguments 2, 17")
    assert saved["args"] == args, f"{T81}: args saved as {saved['args']}, expected {args}"


@pytest.mark.task8_1
def test_save_keeps_the_newest_as_last_and_the_one_before_as_previous(impl, tmp_path):
    ckpt = load(impl, "template_checkpoint")
    model, optimizer = trained()
    for epoch in (1, 2, 3):
        try:
            ckpt.save_checkpoint(str(tmp_path), model, optimizer, epoch, 10 * epoch, {})
        except AttributeError as error:  # trial 9: model.module.state_dict(), a raw AttributeError before
            if "has no attribute 'module'" not in str(error):
                raise
            pytest.fail(f"{T81}: save_checkpoint was given a plain model, not wrapped, and read model.module "
                        f"({type(error).__name__}: {error}): save unwrap(model).state_dict(); unwrap gives the "
                        "module inside a wrapper such as DistributedDataParallel, and the model itself otherwise")
    held = open_in(tmp_path)
    assert not held, (  # trial 11: mkstemp's descriptor never closed (passed)
        f"{T81}: after three saves this process still holds {len(held)} open descriptor(s) of files of the "
        f"checkpoint folder ({', '.join(sorted(set(held)))}): close the descriptor tempfile.mkstemp returns (os.fdopen(fd, "
        "'wb') in a with block closes it, or os.close(fd)). One leaks at every save: a long run ends in 'Too many "
        "open files', and the disk space of every replaced checkpoint stays in use while a descriptor holds it")
    names = sorted(os.listdir(tmp_path))
    assert names == ["last.pt", "previous.pt"], (
        f"{T81}: after three saves the folder holds {names}: keep exactly last.pt (the newest) and "
        "previous.pt (the one before), and leave no temporary file behind")
    epochs = read(tmp_path / "last.pt")["epoch"], read(tmp_path / "previous.pt")["epoch"]
    assert epochs == (3, 2), f"{T81}: last.pt and previous.pt hold epochs {epochs}, expected 3 and 2"


def open_in(folder):
    """The files of `folder` (or replaced ones, '(deleted)') that this process holds a descriptor of (Linux)."""
    held, folder = [], os.path.realpath(folder)
    for fd in (os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir itself used, closed since
            continue
        if target.startswith(folder + os.sep):
            held.append(os.path.basename(target))
    return held


class Crash(BaseException):
    """The process dying in the middle of torch.save (BaseException: no `except Exception` hides it)."""


def save_that_fails(error):
    """torch.save that writes the first bytes of the checkpoint, then raises error(): a killed process (Crash), a
    full disk (OSError)."""
    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as out:
                out.write(b"PK\x03\x04 half a checkpoint")
        else:
            f.write(b"PK\x03\x04 half a checkpoint")
            f.flush()
        raise error()
    return save


half_written_save = save_that_fails(lambda: Crash("killed in the middle of torch.save"))
full_disk_save = save_that_fails(lambda: OSError(28, "No space left on device"))  # `except Exception` sees this one


@pytest.mark.task8_1
def test_a_crash_while_saving_leaves_the_last_good_checkpoint(impl, tmp_path, monkeypatch):
    ckpt = load(impl, "template_checkpoint")
    model, optimizer = trained()
    ckpt.save_checkpoint(str(tmp_path), model, optimizer, 1, 10, {})
    monkeypatch.setattr(torch, "save", half_written_save)
    with pytest.raises(Crash):
        ckpt.save_checkpoint(str(tmp_path), model, optimizer, 2, 20, {})
    monkeypatch.undo()
    if not (tmp_path / "last.pt").exists() and (tmp_path / "previous.pt").exists():
        pytest.fail(f"{T81}: a crash in the middle of the save left no last.pt: the old last.pt was renamed to "
                    "previous.pt before the new one was complete. Write and fsync the temporary file first, then "
                    "rename last.pt to previous.pt, then the temporary file to last.pt")
    try:
        epoch = read(tmp_path / "last.pt")["epoch"]
    except Exception as error:
        pytest.fail(f"{T81}: a crash in the middle of the save left last.pt unreadable ({type(error).__name__}): "
                    "it was written in place. Write a temporary file in the same folder, then os.replace it "
                    "onto last.pt, so that last.pt is always a whole checkpoint")
    assert epoch == 1, (f"{T81}: after a crash in the middle of saving epoch 2, last.pt holds epoch {epoch}, "
                        "expected the last good one (epoch 1)")


@pytest.mark.task8_1
def test_a_failed_save_leaves_no_temporary_file(impl, tmp_path, monkeypatch):
    """Trial 9: a temporary file left behind by each failed save fills a disk that is already full."""
    ckpt = load(impl, "template_checkpoint")
    model, optimizer = trained()
    ckpt.save_checkpoint(str(tmp_path), model, optimizer, 1, 10, {})
    monkeypatch.setattr(torch, "save", full_disk_save)
    try:
        ckpt.save_checkpoint(str(tmp_path), model, optimizer, 2, 20, {})
    except OSError:
        pass
    else:
        pytest.fail(f"{T81}: torch.save raised OSError (No space left on device) and save_checkpoint returned as if "
                    "it had saved: let the error through (raise), or the run goes on believing it has a checkpoint")
    finally:
        monkeypatch.undo()
    names = sorted(os.listdir(tmp_path))
    left = [name for name in names if name not in ("last.pt", "previous.pt")]
    assert not left, (
        f"{T81}: a save that failed (torch.save raised OSError: No space left on device) left {left} in the folder: "
        "when the write fails, remove the temporary file (except Exception: os.remove(tmp); raise), or every "
        "failed save leaves a checkpoint-sized file behind, on a disk that is already full")
    epoch, last = None, "missing"
    try:  # trial 11: the clean-up removed last.pt too, and the run had no checkpoint left
        if "last.pt" in names:
            epoch = read(tmp_path / "last.pt")["epoch"]
            last = f"holding epoch {epoch}"
    except Exception as error:
        last = f"unreadable ({type(error).__name__})"
    assert epoch == 1, (
        f"{T81}: a save that failed (torch.save raised OSError: No space left on device) left the folder holding "
        f"{names}, last.pt {last}: the last good checkpoint (epoch 1) "
        "must stay last.pt. Remove only the temporary file when the write fails; last.pt is touched only by the "
        "rename that replaces it with a complete new one")


def _spy_on_the_disk(monkeypatch, events):
    """Record, in order, every os.fsync (which file, its size on disk then) and every rename."""
    fsync, replace, rename = os.fsync, os.replace, os.rename

    def spy_fsync(fd):
        info = os.fstat(fd if isinstance(fd, int) else fd.fileno())  # os.fsync takes a file object too (trial 11)
        events.append(("fsync", info.st_ino, info.st_size, stat.S_ISREG(info.st_mode)))
        return fsync(fd)

    def spy(real, kind):
        def moved(src, dst, *args, **kwargs):
            events.append((kind, os.path.abspath(src), os.path.abspath(dst), os.stat(src).st_ino))
            return real(src, dst, *args, **kwargs)
        return moved

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy(replace, "rename"))
    monkeypatch.setattr(os, "rename", spy(rename, "rename"))


@pytest.mark.task8_1
def test_save_fsyncs_the_file_before_renaming_it(impl, tmp_path, monkeypatch):
    ckpt = load(impl, "template_checkpoint")
    model, optimizer = trained()
    events = []
    _spy_on_the_disk(monkeypatch, events)
    ckpt.save_checkpoint(str(tmp_path), model, optimizer, 1, 10, {})
    first = os.stat(tmp_path / "last.pt").st_ino
    ckpt.save_checkpoint(str(tmp_path), model, optimizer, 2, 20, {})  # the second save also rotates
    monkeypatch.undo()
    previous = os.stat(tmp_path / "previous.pt").st_ino if (tmp_path / "previous.pt").exists() else first
    assert previous == first, (  # trial 11: shutil.copyfile(last, previous) passed
        f"{T81}: after the second save previous.pt is another file than the first save's last.pt (inode {previous}, "
        f"not {first}): it was copied, not renamed. A copy writes the whole checkpoint again (minutes on a large "
        "model), neither atomic nor fsynced: a crash during it leaves a torn previous.pt. os.replace(last, "
        "previous) renames it, at once and atomically")
    last = os.path.abspath(tmp_path / "last.pt")
    size = os.stat(last).st_size
    onto_last = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == last]
    assert onto_last, (
        f"{T81}: last.pt was never the target of os.replace: it was written in place. Write a temporary file in "
        "the same folder, flush and os.fsync it, then os.replace it onto last.pt")
    at = onto_last[-1]
    _, src, _, inode = events[at]
    assert os.path.dirname(src) == str(tmp_path), (
        f"{T81}: the temporary file {src} is not in the checkpoint's own folder {tmp_path}: on a cluster the "
        "checkpoint folder is usually on another file system than /tmp, where os.replace fails ('Invalid "
        "cross-device link') and a copy is not atomic. Create it in the same folder: "
        "tempfile.mkstemp(dir=directory)")
    synced = [e for e in events if e[0] == "fsync"]
    assert synced, (f"{T81}: os.fsync was never called: without it the rename can reach the disk before the "
                    "data, and a power cut leaves an empty last.pt. flush() and os.fsync(f.fileno()) first")
    before = [e for e in events[:at] if e[0] == "fsync" and e[1] == inode]
    assert before, (
        f"{T81}: the new checkpoint file was not fsynced before the rename that made it last.pt (fsync calls: "
        f"{len(synced)}, {'after the rename' if any(e[1] == inode for e in synced) else 'of other files'}): "
        "os.fsync the temporary file itself, before the rename, so the data is on the disk before the name is")
    assert before[-1][3] and before[-1][2] == size, (
        f"{T81}: when the temporary file was fsynced, {before[-1][2]} of its {size} bytes had reached the file: "
        "f.flush() first (Python keeps written bytes in its own buffer until then), then os.fsync(f.fileno())")


def _save_on_each_rank(rank, world_size, impl, root):
    ckpt = load(impl, "template_checkpoint")
    model, optimizer = trained(seed=rank)
    folder = os.path.join(root, f"rank{rank}")  # a folder per rank shows who wrote
    called, real = [], {}
    for name in ("barrier", "monitored_barrier", *COLLECTIVES):  # it has none: any rank may skip it
        if hasattr(torch.distributed, name):
            real[name] = getattr(torch.distributed, name)
            setattr(torch.distributed, name, lambda *a, _name=name, **k: (called.append(_name), real[_name](*a, **k))[1])
    environ, read = os.environ, []

    class Watched(type(environ)):  # which variables it reads: a rank taken from RANK is told as such
        def __getitem__(self, key):
            read.append(key)
            return super().__getitem__(key)

        def __contains__(self, key):
            read.append(key)
            return super().__contains__(key)

    os.environ = Watched(environ._data, environ.encodekey, environ.decodekey, environ.encodevalue,
                         environ.decodevalue)
    try:
        path = ckpt.save_checkpoint(folder, model, optimizer, 1, 10, {})
    finally:
        os.environ = environ
        for name, function in real.items():
            setattr(torch.distributed, name, function)
    return path, sorted(os.listdir(folder)), called, sorted({key for key in read if "RANK" in key})


@pytest.mark.task8_1
def test_only_rank_0_writes(impl, tmp_path):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}").mkdir()
    results = run_ranks(_save_on_each_rank, 2, impl, str(tmp_path), timeout=30)
    called = [name for _, _, calls, _ in results for name in calls]
    assert not called, (  # trial 11: a barrier inside save_checkpoint passed (every rank called it here)
        f"{T81}: save_checkpoint called dist.{called[0]}: it has no collective, as its docstring says, so that any "
        "rank may skip it (a caller that saves on rank 0 alone would wait there forever for the others); rank 0 writes "
        "and the others return None at once")
    variables = results[1][3]
    assert not (results[1][1] and variables), (  # trial 11: was told "rank 1 wrote", not why it took itself for 0
        f"{T81}: rank 1 wrote {results[1][1]}: save_checkpoint read the environment variable(s) {', '.join(variables)}, "
        "which torchrun sets but this process group (started without torchrun, as mp.spawn starts one) does not, "
        "and took a default of 0. Use the given get_rank(): the process group's own rank, 0 without one"
        + (" (LOCAL_RANK is a rank within one node: under torchrun on 2 nodes, each node's first process is local "
           "rank 0, and both would write)" if "LOCAL_RANK" in variables else ""))
    results = [result[:2] for result in results]
    assert results[1][1] or results[1][0] is None, (  # trial 11: was told "rank 1 wrote []"
        f"{T81}: rank 1 wrote nothing (right) but returned {results[1][0]!r}: return None on the ranks other than 0, "
        "as the docstring says; the path is rank 0's, the one that wrote it")
    assert results[1] == (None, []), (
        f"{T81}: rank 1 wrote {results[1][1]} (returned {results[1][0]!r}): rank 0 alone must write. Every rank "
        "holds the same weights, and several processes writing one file at once leave a mix of their bytes")
    assert results[0][1] == ["last.pt"], f"{T81}: rank 0 wrote {results[0][1]}, expected last.pt"


# --------------------------------------------------------------------------- Task 8.2
def write(path, epoch, seed=0):
    model, optimizer = trained(seed)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
             "step": 10 * epoch, "args": {"lr": 0.1}}
    torch.save(state, path)
    return state


@pytest.mark.parametrize("spelled", [str, pathlib.Path, os.path.relpath])
def test_resume_moves_aside_only_an_unreadable_last_pt(tmp_path, monkeypatch, spelled):
    """support.checkpoint.resume (given code) renames last.pt to last.pt.corrupt when load_checkpoint fell back to
    previous.pt; however load_checkpoint spells the path it returns (a pathlib.Path, a relative path: right answers
    to Task 8.2), a last.pt it read is the same file, and stays (trial 11: a good last.pt was moved aside)."""
    from support.checkpoint import resume
    ckpt = load("solutions", "template_checkpoint")
    monkeypatch.chdir(tmp_path)
    tasks = type("Tasks", (), {"load_checkpoint": staticmethod(
        lambda directory, device: (lambda state, path: (state, None if path is None else spelled(path)))(
            *ckpt.load_checkpoint(directory, device)))})
    write(tmp_path / "previous.pt", 1)
    write(tmp_path / "last.pt", 2)
    model, optimizer = trained()
    assert resume(tasks, str(tmp_path), model, optimizer, {"lr": 0.1}, "cpu", 10) == (2, 20)
    assert sorted(os.listdir(tmp_path)) == ["last.pt", "previous.pt"]
    (tmp_path / "last.pt").write_bytes(b"")  # cut short: previous.pt is read, last.pt moved aside
    assert resume(tasks, str(tmp_path), model, optimizer, {"lr": 0.1}, "cpu", 10) == (1, 10)
    assert sorted(os.listdir(tmp_path)) == ["last.pt.corrupt", "previous.pt"]


@pytest.mark.task8_2
def test_load_returns_the_newest_checkpoint_and_none_without_one(impl, tmp_path):
    ckpt = load(impl, "template_checkpoint")
    assert ckpt.load_checkpoint(str(tmp_path), "cpu") == (None, None), (
        f"{T82}: an empty folder must give (None, None): nothing to resume")
    write(tmp_path / "previous.pt", 1, seed=1)
    newest = write(tmp_path / "last.pt", 2, seed=2)
    state, path = ckpt.load_checkpoint(str(tmp_path), "cpu")
    if (isinstance(path, (str, os.PathLike)) and not os.path.exists(path)
            and os.path.exists(os.path.join(tmp_path, path))):  # trial 11: a raw FileNotFoundError before
        pytest.fail(f"{T82}: returned {str(path)!r}, the file's name, not its path: return os.path.join(directory, "
                    "name), the path of the file loaded (resume() prints it, and moves an unreadable last.pt away by "
                    "it; a bare name is looked for in the current folder)")
    assert path is not None and os.path.samefile(path, tmp_path / "last.pt"), (
        f"{T82}: returned {path!r}, expected last.pt, the newest")
    assert state["epoch"] == 2 and same_tensors(state["model"], newest["model"]), (
        f"{T82}: the checkpoint returned is not last.pt's")


@pytest.mark.task8_2
def test_a_folder_with_only_a_leftover_temporary_file_holds_no_checkpoint(impl, tmp_path, capsys):
    """Trial 9: a missing last.pt was tried and told as unreadable; with no checkpoint at all, that refused to start."""
    ckpt = load(impl, "template_checkpoint")
    (tmp_path / "last.pt.q1w2e3.tmp").write_bytes(b"PK\x03\x04 half a checkpoint")  # a crash in the first save
    try:
        result = ckpt.load_checkpoint(str(tmp_path), "cpu")
    except ValueError as error:
        pytest.fail(f"{T82}: the folder holds neither last.pt nor previous.pt, only the temporary file that a crash "
                    f"in the very first save leaves, and load_checkpoint raised {type(error).__name__}: {error}. "
                    "There is no checkpoint: return (None, None). A file that does not exist is not an unreadable "
                    "one: try last.pt, then previous.pt, each only if it exists (os.path.exists)")
    assert result == (None, None), f"{T82}: a folder without last.pt or previous.pt must give (None, None), got {result!r}"
    said = [line for line in "".join(capsys.readouterr()).splitlines() if "cannot be read" in line]
    assert not said, (f"{T82}: the folder holds neither last.pt nor previous.pt, and load_checkpoint said {said[0]!r}: "
                      "a file that does not exist is not an unreadable one; try each only if it exists")


@pytest.mark.task8_2
def test_a_folder_with_only_previous_pt_resumes_from_it(impl, tmp_path, capsys):
    ckpt = load(impl, "template_checkpoint")
    good = write(tmp_path / "previous.pt", 1)  # what a corrupt last.pt, moved away, leaves behind
    try:
        result = ckpt.load_checkpoint(str(tmp_path), "cpu")
    except (ValueError, OSError) as error:
        pytest.fail(f"{T82}: the folder holds only previous.pt, a good checkpoint, and load_checkpoint raised "
                    f"{type(error).__name__}: {error}: try last.pt, then previous.pt, each only if it exists")
    state, path = result if isinstance(result, tuple) and len(result) == 2 else (None, None)
    if isinstance(path, (str, os.PathLike)) and not os.path.exists(path) and isinstance(state, dict):
        # trial 9: the path of last.pt returned whichever file was loaded (a raw FileNotFoundError before)
        pytest.fail(f"{T82}: the folder holds only previous.pt, and load_checkpoint returned the path {path!r}, which "
                    f"does not exist, with a state of epoch {state.get('epoch')!r}: return the path of the file it "
                    "loaded (resume() prints it, and moves an unreadable last.pt away by it)")
    assert path is not None and os.path.samefile(path, tmp_path / "previous.pt"), (
        f"{T82}: the folder holds only previous.pt (what a corrupt last.pt, moved away, leaves behind), so "
        f"previous.pt must be used; load_checkpoint returned {result if path is None else path!r}: try last.pt, then "
        "previous.pt, each if it exists; (None, None) would start the run from scratch and throw the checkpoint away")
    assert state["epoch"] == 1 and same_tensors(state["model"], good["model"]), f"{T82}: not previous.pt's state"
    said = [line for line in "".join(capsys.readouterr()).splitlines()
            if "last.pt" in line and re.search(r"cannot be read|unreadable|corrupt", line)]
    assert not said, (
        f"{T82}: the folder holds no last.pt, and load_checkpoint said {said[0]!r}: a file that does not exist is not "
        "an unreadable one (a false alarm in every resumed run's log); try each only if it exists")


@pytest.mark.task8_2
def test_a_truncated_newest_checkpoint_is_reported_and_the_previous_one_used(impl, tmp_path, capsys, caplog):
    ckpt = load(impl, "template_checkpoint")
    good = write(tmp_path / "previous.pt", 1)
    write(tmp_path / "last.pt", 2)
    data = (tmp_path / "last.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(data[: len(data) // 2])  # as a write cut short by a crash
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            state, path = ckpt.load_checkpoint(str(tmp_path), "cpu")
    except ValueError as error:
        pytest.fail(f"{T82}: last.pt is truncated, so previous.pt must be used; load_checkpoint raised: {error}")
    if path is not None and os.path.basename(path) == "last.pt" and isinstance(state, dict) and state.get("epoch") == 1:
        pytest.fail(f"{T82}: last.pt is truncated and load_checkpoint loaded previous.pt (epoch 1), but returned the "
                    f"path {path!r}: return the path of the file it loaded")
    assert path is not None and os.path.samefile(path, tmp_path / "previous.pt") and state["epoch"] == 1, (
        f"{T82}: last.pt is truncated, so previous.pt must be used; returned {path!r}")
    assert same_tensors(state["model"], good["model"])
    assert (tmp_path / "last.pt").exists(), (  # trial 11: was the slow test's bare list of files
        f"{T82}: load_checkpoint removed the unreadable last.pt: leave it where it is and only say so. Every rank "
        "reads the folder (one removing it while another opens it fails that one), and resume() moves it aside as "
        "last.pt.corrupt once every rank has read, keeping it to look at and out of the rotation's way")
    out = capsys.readouterr()
    # print, logging.warning or warnings.warn: each reaches the user
    shown = out.out + out.err + caplog.text + "".join(f"{w.message}\n" for w in warned)
    lines = [line for line in shown.splitlines() if "last.pt" in line]
    assert len(lines) == 1, (f"{T82}: say in one line (print, logging.warning or warnings.warn) that last.pt "
                             f"cannot be read, naming it; shown: {shown!r}")


@pytest.mark.task8_2
def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(impl, tmp_path):
    ckpt = load(impl, "template_checkpoint")
    (tmp_path / "last.pt").write_bytes(b"PK\x03\x04 not a checkpoint")
    try:
        result = ckpt.load_checkpoint(str(tmp_path), "cpu")
    except ValueError as error:  # CheckpointError is a ValueError: train_ddp.py prints one line
        assert isinstance(error, getattr(ckpt, "CheckpointError", ())), (
            f"{T82}: last.pt cannot be read and there is no other checkpoint: load_checkpoint raised "
            f"{type(error).__name__}: raise CheckpointError (given: from support.checkpoint_state import "
            "CheckpointError), as load_checkpoint's docstring asks: the error for a checkpoint problem the user must "
            f"fix, which train_ddp.py prints as one line ({type(error).__name__}: {error})")
        assert "last.pt" in str(error), f"{T82}: the error should name the file: {error}"
        return
    pytest.fail(f"{T82}: last.pt cannot be read and there is no other checkpoint, yet load_checkpoint returned "
                f"{result!r}: raise CheckpointError; returning None would silently start from scratch")


class Payload:
    """Runs code when unpickled, as a booby-trapped checkpoint could."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


@pytest.mark.task8_2
def test_load_does_not_run_code_hidden_in_a_checkpoint(impl, tmp_path, capsys):
    ckpt = load(impl, "template_checkpoint")
    write(tmp_path / "previous.pt", 1)
    marker = tmp_path / "code-ran"
    torch.save({"model": {}, "epoch": 9, "payload": Payload(str(marker))}, tmp_path / "last.pt")
    try:
        state, path = ckpt.load_checkpoint(str(tmp_path), "cpu")
    except pickle.UnpicklingError as error:  # trial 9: `except RuntimeError` caught a truncated zip only
        assert not marker.exists(), f"{T82}: loading the checkpoint ran code stored in it: weights_only=True"
        pytest.fail(f"{T82}: last.pt holds an object that weights_only=True refuses, and load_checkpoint let "
                    f"torch.load's {type(error).__name__} out instead of trying previous.pt: a file that cannot be "
                    "read is any error torch.load raises (a truncated file is a RuntimeError, a refused object an "
                    "UnpicklingError): catch Exception, say so in one line, and try previous.pt")
    assert not marker.exists(), (
        f"{T82}: loading the checkpoint ran code stored in it: torch.load(..., weights_only=True) refuses "
        "anything but tensors and plain containers")
    assert os.path.samefile(path, tmp_path / "previous.pt"), f"{T82}: expected previous.pt, got {path!r}"
    refusal = []  # the lines after the first of torch.load's message refusing the file
    try:
        torch.load(tmp_path / "last.pt", weights_only=True)
    except Exception as error:
        refusal = [line.strip() for line in str(error).splitlines()[1:] if len(line.strip()) > 20]
    out = capsys.readouterr()
    shown = [line for line in (out.out + out.err).splitlines() if line.strip()]
    echoed = [line for line in shown if any(part in line for part in refusal)]
    assert not echoed, (  # trial 11: the whole message printed, as many lines (passed)
        f"{T82}: the report that last.pt cannot be read took {len(shown)} lines: it printed torch.load's whole "
        f"error message, whose lines go on to {echoed[-1].strip()[:80]!r}. Say it in one line, with the path and the "
        "error's first line (str(error).splitlines()[0]), as the docstring asks: a resumed run on 64 ranks prints "
        "it 64 times")


@pytest.mark.task8_2
def test_an_empty_newest_checkpoint_is_unreadable_too(impl, tmp_path):
    """Trial 11: `except (RuntimeError, pickle.UnpicklingError)` passed; an empty file is torch.load's EOFError."""
    ckpt = load(impl, "template_checkpoint")
    write(tmp_path / "previous.pt", 1)
    (tmp_path / "last.pt").write_bytes(b"")  # a rename that reached the disk before the data did, then a power cut
    try:
        state, path = ckpt.load_checkpoint(str(tmp_path), "cpu")
    except NotImplementedError:
        raise  # an unfilled TODO: its own message says which
    except EOFError as error:  # what torch.load raises for an empty file
        pytest.fail(f"{T82}: last.pt is empty (0 bytes, as a power cut leaves a file whose rename reached the disk "
                    f"before its data) and load_checkpoint let torch.load's {type(error).__name__} out instead of "
                    "trying previous.pt: any error torch.load raises means the file cannot be read (a truncated file "
                    "is a RuntimeError, a refused object an UnpicklingError, an empty file an EOFError, garbage even "
                    "a KeyError): catch Exception, say so in one line, and try previous.pt")
    except Exception as error:
        pytest.fail(f"{T82}: last.pt is empty (0 bytes) and previous.pt is good, yet load_checkpoint raised "
                    f"{type(error).__name__}: {error}: report last.pt in one line and use previous.pt")
    assert path is not None and os.path.samefile(path, tmp_path / "previous.pt") and state["epoch"] == 1, (
        f"{T82}: last.pt is empty, so previous.pt must be used; returned {path!r}")


def _load_on_every_rank(rank, world_size, impl, folder):
    ckpt = load(impl, "template_checkpoint")
    state, path = ckpt.load_checkpoint(folder, "cpu")
    return None if state is None else (state["epoch"], state["model"])


@pytest.mark.task8_2
def test_every_rank_loads_the_checkpoint(impl, tmp_path):
    expected = write(tmp_path / "last.pt", 3)
    results = run_ranks(_load_on_every_rank, 2, impl, str(tmp_path), timeout=30)
    for rank, result in enumerate(results):
        assert result is not None, (f"{T82}: rank {rank} got no checkpoint: every rank must load it itself, since "
                                    "each needs the state in its own model and optimizer")
        assert result[0] == 3 and same_tensors(result[1], expected["model"]), f"{T82}: rank {rank} got another state"


@pytest.mark.task8_2
def test_load_puts_the_tensors_on_the_device_it_is_given(impl, tmp_path):
    """map_location without a GPU: the `meta` device stands for the rank's GPU (tensors without data)."""
    ckpt = load(impl, "template_checkpoint")
    write(tmp_path / "last.pt", 1)
    state, _ = ckpt.load_checkpoint(str(tmp_path), torch.device("meta"))
    devices = {t.device.type for t in state["model"].values()}
    assert devices == {"meta"}, (
        f"{T82}: load_checkpoint(folder, device) returned the model's tensors on {sorted(devices)}, not on the "
        "device it was given: pass map_location=device to torch.load, or a checkpoint saved on cuda:0 lands on "
        "cuda:0 on every rank (or fails on a machine without that GPU)")
    write(tmp_path / "previous.pt", 1)  # trial 11: the fallback, loaded without map_location, passed
    (tmp_path / "last.pt").write_bytes(b"PK\x03\x04 half a checkpoint")
    state, path = ckpt.load_checkpoint(str(tmp_path), torch.device("meta"))
    devices = {t.device.type for t in state["model"].values()}
    assert devices == {"meta"}, (
        f"{T82}: with last.pt unreadable, load_checkpoint(folder, device) returned previous.pt's tensors on "
        f"{sorted(devices)}, not on the device it was given (last.pt's went there): pass map_location=device to "
        "every torch.load, the fallback's too")


@pytest.mark.task8_2
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: map_location from a GPU needs one")
def test_load_maps_a_gpu_checkpoint_to_the_ranks_device(impl, tmp_path):
    ckpt = load(impl, "template_checkpoint")
    torch.save({"model": {"w": torch.ones(3, device="cuda")}, "epoch": 1, "step": 1}, tmp_path / "last.pt")
    state, _ = ckpt.load_checkpoint(str(tmp_path), torch.device("cpu"))
    assert state["model"]["w"].device.type == "cpu", (
        f"{T82}: a checkpoint saved on a GPU came back on {state['model']['w'].device}: "
        "pass map_location=device to torch.load")


# ------------------------------------------- train_ddp.py resumes, in-process on 2 gloo ranks
TINY = ["--data", "synthetic", "--train-samples", "256", "--test-samples", "64", "--batch-size", "32",
        "--metrics", ""]


def in_a_rank_like_torchruns():
    """Make this harness rank train as a torchrun worker of 2 would: one thread (torchrun sets
    OMP_NUM_THREADS=1 for 2 processes a node; train_ddp.set_threads would otherwise give each of the 2
    ranks both cores, and their threads wait on each other)."""
    os.environ["OMP_NUM_THREADS"] = "1"


def _train(impl, extra):
    """train_ddp.py's training, in a rank that the harness has already put in a process group.

    Task 8.2 judged alone: the reference answers train (Tasks 1-2) and save (Task 8.1); only
    load_checkpoint is `impl`'s. (A Task 2.2 mistake once cost Task 8.2 too, blaming loading.)"""
    in_a_rank_like_torchruns()
    args = train_ddp.parse_args(["--impl", REFERENCE, *TINY, *extra])
    # train_ddp trains and saves with solutions/; load_checkpoint is impl's, swapped in this rank's process only
    load("solutions", "template_checkpoint").load_checkpoint = load(impl, "template_checkpoint").load_checkpoint
    rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    return train_ddp.train(args, rank, world_size, torch.device("cpu"))


def _interrupt_and_resume(rank, world_size, impl, root, stop_after):
    """An uninterrupted run, then a run that rank 1 sends SIGUSR1 to after `stop_after` steps,
    then the same command again, which resumes. Returns the two runs' final checkpoints."""
    trainer = load("solutions", "template_trainer")  # the one _train trains with
    _train(impl, ["--epochs", "2", "--checkpoint-dir", f"{root}/whole"])
    calls = [0]
    average = trainer.average_gradients

    def average_then_signal(model):  # train_ddp looks trainer.average_gradients up when it starts
        average(model)
        calls[0] += 1
        if rank == 1 and calls[0] == stop_after:
            os.kill(os.getpid(), signal.SIGUSR1)  # as SLURM's warning before the time limit would

    trainer.average_gradients = average_then_signal
    try:
        _train(impl, ["--epochs", "2", "--checkpoint-dir", f"{root}/parts"])
    finally:
        trainer.average_gradients = average
    stopped = read(f"{root}/parts/last.pt")
    _train(impl, ["--epochs", "2", "--checkpoint-dir", f"{root}/parts"])
    resumed = read(f"{root}/parts/last.pt")
    # a truncated newest checkpoint: the run goes back to previous.pt (epoch 1) and trains epoch 2 again
    torch.distributed.barrier()  # every rank has read it
    if rank == 0:
        last = pathlib.Path(root, "parts", "last.pt")
        last.write_bytes(last.read_bytes()[:1000])
    torch.distributed.barrier()
    _train(impl, ["--epochs", "2", "--checkpoint-dir", f"{root}/parts"])
    recovered = read(f"{root}/parts/last.pt")
    try:  # and a run with another learning rate must refuse these checkpoints
        _train(impl, ["--epochs", "3", "--checkpoint-dir", f"{root}/parts", "--lr", "0.1"])
        refused = None
    except ValueError as error:
        refused = str(error)
    return ((stopped["epoch"], stopped["step"]), read(f"{root}/whole/last.pt"), resumed, recovered,
            sorted(os.listdir(f"{root}/parts")), refused)


@pytest.mark.task8_2
@pytest.mark.slow  # 2 s; check.py runs it after 8.2's other tests, as ever
def test_train_ddp_stopped_mid_epoch_and_resumed_ends_bit_identical(impl, tmp_path):
    """256 images, global batch 32: 8 steps an epoch. SIGUSR1 after step 5 of epoch 1."""
    results = run_ranks(_interrupt_and_resume, 2, impl, str(tmp_path), 5, timeout=90)
    stopped, whole, resumed, recovered, files, refused = results[0]
    assert stopped == (0, 5), f"the stop after SIGUSR1 saved (epoch, step) = {stopped}, expected (0, 5)"
    assert (resumed["epoch"], resumed["step"]) == (2, 16), (resumed["epoch"], resumed["step"])
    differ = [k for k in whole["model"] if not torch.equal(whole["model"][k], resumed["model"][k])]
    assert not differ, (
        f"{T82}: after a stop in the middle of epoch 1 and a resume, {differ} differ from the uninterrupted run. "
        "Check that load_checkpoint returns the optimizer state and the step as saved")
    assert same_tensors(whole["optimizer"]["state"][0], resumed["optimizer"]["state"][0])
    assert (recovered["epoch"], recovered["step"]) == (2, 16) and same_tensors(whole["model"], recovered["model"]), (
        f"{T82}: with last.pt truncated, the run must resume from previous.pt and end like the uninterrupted run")
    assert files == ["last.pt", "last.pt.corrupt", "previous.pt"], (
        f"{T82}: after a resume from a truncated last.pt the folder holds {files}, expected last.pt, "
        "last.pt.corrupt (the truncated one, moved aside by resume()) and previous.pt")
    assert refused is not None, "a checkpoint written with --lr 0.05 was resumed by a run with --lr 0.1"
    assert "--lr" in refused and "\n" not in refused, refused


# ------------------------------------------------------- train_ddp.py's one-line errors (slow)
def run(args, timeout=120, **kwargs):
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, **kwargs)
    return proc.returncode, proc.stdout + proc.stderr


CLI = [sys.executable, "train_ddp.py", "--impl", REFERENCE, *TINY, "--epochs", "1"]


def error_lines(out):
    return [line for line in out.splitlines() if line.startswith("error:")]


@pytest.mark.slow
@pytest.mark.repo
def test_cli_missing_parent_folder_is_one_line(tmp_path):
    code, out = run(CLI + ["--checkpoint-dir", str(tmp_path / "typo" / "ckpt")])
    assert code == 2 and "Traceback" not in out, out
    assert len(error_lines(out)) == 1 and "does not exist" in out, out


def read_only_command(folder):
    """A command prefix that makes `folder` read-only for the command, or None. chmod does not
    stop root, so as root the folder is a read-only mount in a private mount namespace."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o500)
        return []
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    return ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o ro tmpfs "{folder}" && exec "$0" "$@"']


@pytest.mark.slow
@pytest.mark.repo
def test_cli_read_only_folder_is_one_line(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    prefix = read_only_command(str(folder))
    if prefix is None:
        pytest.skip("cannot make a read-only folder here (root without unshare)")
    code, out = run(prefix + CLI + ["--checkpoint-dir", str(folder)])
    assert code == 2 and "Traceback" not in out, out
    assert len(error_lines(out)) == 1 and "not writable" in out, out


@pytest.mark.slow
@pytest.mark.repo
def test_cli_checkpoint_of_other_arguments_is_one_line(tmp_path):
    from models import CNN

    model = CNN()
    saved = dict(vars(train_ddp.parse_args(CLI[2:])), world_size=1, data="synthetic", batch_size=64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    (tmp_path / "ckpt").mkdir()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 0, "step": 3,
                "args": saved}, tmp_path / "ckpt" / "last.pt")
    code, out = run(CLI + ["--checkpoint-dir", str(tmp_path / "ckpt")])
    assert code == 2 and "Traceback" not in out, out
    assert len(error_lines(out)) == 1 and "--batch-size 64, this run has 32" in out, out


# ------------------------------------- torchrun restarts a killed rank, and nothing is lost (slow)
TORCHRUN_RUN = ["--impl", REFERENCE, "--data", "synthetic", "--train-samples", "512", "--test-samples", "256",
                "--batch-size", "32", "--epochs", "2", "--metrics", ""]  # 16 steps an epoch
STEPS_PER_EPOCH = 16


def torchrun(folder, *extra, restarts=1):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               f"--max-restarts={restarts}", "train_ddp.py", *TORCHRUN_RUN, "--checkpoint-dir", str(folder), *extra]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def finish(proc, deadline):
    """Wait for a torchrun (and its workers) until the deadline; kill all of it if it passes."""
    try:
        out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in time (a hang, or a very busy machine):\n{out}")
    return proc.returncode, out



def newest_checkpoint(folder, seen, name="last.pt"):
    """(epoch, step) of folder/name when it has changed since `seen`, else None. name: last.pt, or
    the index of a sharded checkpoint, last.shards/index.pt (written last, once every rank's file is
    complete)."""
    path = folder / name
    try:
        stat = path.stat()
        if (stat.st_ino, stat.st_mtime_ns) == seen.get("id"):
            return None
        seen["id"] = (stat.st_ino, stat.st_mtime_ns)
        state = read(path)
        return state["epoch"], state["step"]
    except (OSError, RuntimeError, EOFError):
        return None


def kill_rank_1_after(proc, folder, deadline, wanted, name="last.pt"):
    """SIGKILL torchrun's rank 1 as soon as folder/name (newest_checkpoint) holds a checkpoint whose
    (epoch, step) is `wanted`; returns that (epoch, step), or None if the run ended or the deadline
    came first."""
    seen, found = {}, None
    while proc.poll() is None and time.monotonic() < deadline:
        newest = newest_checkpoint(folder, seen, name)
        found = newest if newest and wanted(*newest) else found
        pid = worker_pid(proc.pid, 1) if found else None
        if pid:
            os.kill(pid, signal.SIGKILL)
            return found
        time.sleep(0.02)
    return None


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final checkpoint of the same training, never interrupted."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    code, out = finish(torchrun(folder, restarts=0), time.monotonic() + 150)
    assert code == 0, out
    return read(folder / "last.pt")


@pytest.mark.slow
@pytest.mark.repo
@pytest.mark.timeout(400)
@pytest.mark.parametrize("every", [None, 5], ids=["epoch-checkpoint", "mid-epoch-checkpoint"])
def test_torchrun_restarts_a_killed_rank_and_ends_bit_identical(uninterrupted, tmp_path, every):
    """SIGKILL rank 1 in epoch 2 (right after a checkpoint inside it with --checkpoint-every 5;
    else right after the epoch-1 checkpoint, as epoch 2 begins): torchrun --max-restarts=1 starts
    both ranks again, they resume from the newest checkpoint, and the final weights equal the
    uninterrupted run's, bit for bit."""
    folder = tmp_path / "ckpt"
    extra = ["--checkpoint-every", str(every)] if every else []
    proc = torchrun(folder, *extra)
    deadline = time.monotonic() + 150
    # the kill comes right after a checkpoint inside epoch 2 (--checkpoint-every), or right
    # after the epoch-1 checkpoint, as epoch 2 starts
    killed = kill_rank_1_after(proc, folder, deadline,
                               lambda epoch, step: step > STEPS_PER_EPOCH if every else epoch == 1)
    code, out = finish(proc, deadline)
    assert killed, f"rank 1 was never killed: no checkpoint of epoch 2 appeared in time:\n{out}"
    assert code == 0, f"torchrun failed after rank 1 was killed at {killed}:\n{out}"
    resumed = re.findall(r"resuming from \S+: (\d+) epochs and (\d+) steps done", out)
    assert resumed, f"the restarted ranks did not resume from a checkpoint:\n{out}"
    epochs, steps = map(int, resumed[-1])
    assert epochs == 1 and (steps > STEPS_PER_EPOCH if every else steps == STEPS_PER_EPOCH), (
        f"resumed at epoch {epochs}, step {steps}; expected inside epoch 2 (the kill came at {killed}):\n{out}")
    final = read(folder / "last.pt")
    assert (final["epoch"], final["step"]) == (2, 2 * STEPS_PER_EPOCH), out
    differ = [k for k in final["model"] if not torch.equal(final["model"][k], uninterrupted["model"][k])]
    assert not differ, f"after the restart {differ} differ from the uninterrupted run:\n{out}"


@pytest.mark.repo
def test_a_default_argument_is_named_as_such_when_it_differs():
    """Issue 23: a run without --lr against a checkpoint with --lr 0.1 was told '--lr None'."""
    ckpt = load("solutions", "template_checkpoint")
    with pytest.raises(ckpt.CheckpointError, match="written by a run with --lr its default, this run has 0.1: "):
        ckpt.check_arguments({"lr": None}, {"lr": 0.1}, "ckpt/last.pt")
