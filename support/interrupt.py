"""Ctrl-C, and SIGTERM passed on by torchrun or SLURM: one line per rank saying where training was;
and every rank's lines written whole, so that two ranks' lines never share one.

    whole_lines()                                     # train_ddp.py, at start: one write per line
    signal.signal(signal.SIGINT, stop_on_interrupt)
    for images, labels in Counted(loader): ...        # keeps PROGRESS up to date
    code = cannot_start(error)                        # a setting refused: said once, no restarts
"""
import os
import signal
import sys
import time

from launchers import launcher_name, rank_tag

# Launchers that end every process of a run when one fails (srun with --kill-on-bad-exit,
# which submit.sh and submit_srun.sh set). Elsewhere a SIGTERM says less.
STOPS_EVERY_RANK = ("torchrun", "srun", "mpirun (Open MPI)", "mpirun (MPICH or Intel MPI)")

PROGRESS = {"epoch": 0, "step": 0}  # where training is, for the one line printed on Ctrl-C
MAIN_PID = os.getpid()  # DataLoader workers are forked from this process, signal handlers and all


def whole_lines():
    """Each line printed to stdout or stderr leaves this process in one write, so that the lines of
    several ranks sharing a terminal or a log do not interleave.

    With PYTHONUNBUFFERED=1 (test runners, SLURM scripts and IDEs set it) print() writes the text
    and its newline separately, and two ranks warning at once give `[rank 0] ...[rank 1] ...`
    on one line and an empty line after it. Line buffering without write-through sends a line,
    newline included, when it is complete."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # not a replaced stream (pytest's capture, a notebook)
            stream.reconfigure(line_buffering=True, write_through=False)


def stop_on_interrupt(signum, frame):
    """Ctrl-C (SIGINT), or SIGTERM from torchrun or SLURM passing one on: one line, exit code 130.

    Exits at once, without unwinding: a traceback per rank would bury the line, and leaving
    the process group politely can wait on ranks that are already gone."""
    if os.getpid() != MAIN_PID:  # a DataLoader worker: it stops quietly, as PyTorch's workers do
        raise KeyboardInterrupt
    tag = rank_tag()
    where = f"epoch {PROGRESS['epoch']} step {PROGRESS['step']}" if PROGRESS["epoch"] else "start-up"
    said = f"interrupted at {where}"
    if signum == signal.SIGTERM and not PROGRESS["epoch"]:  # most often the launcher, after another rank failed
        launcher = launcher_name()
        said = ("stopped at start-up (SIGTERM): " + (f"{launcher} stops every rank when one fails, so look above "
                "for another rank's error; or the job was cancelled" if launcher in STOPS_EVERY_RANK else
                "look above for another rank's error, or for who stopped this process"))
    sys.stdout.flush()
    clear = "\r\x1b[K" if sys.stderr.isatty() else ""  # over rank 0's progress bar, if it draws one
    os.write(2, f"{clear}{tag}{said}\n".encode())  # one write: the ranks' lines do not interleave
    os._exit(130)


def stop_torchrun_restarts():
    """A setting that cannot work fails the same way at every attempt, but torchrun's --max-restarts
    retries any failure, so the error would come once per restart. A worker cannot tell torchrun
    that a failure is final; it can stop torchrun's agent, its parent process, with the SIGTERM a
    Ctrl-C or `scancel` would send. train_ddp.py calls it on local rank 0 of every node, so every
    node's agent stops once. Returns the line to print, or None: not under torchrun, or no restart
    left (then torchrun stops anyway)."""
    restarts_left = (int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0))
                     - int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    if "TORCHELASTIC_RUN_ID" not in os.environ or restarts_left < 1:
        return None
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the agent sends SIGTERM back: this rank is ending anyway
    os.kill(os.getppid(), signal.SIGTERM)
    return (f"stopping torchrun instead of restarting ({restarts_left} of --max-restarts left): every "
            "attempt would fail the same way; the SignalException traceback below is torchrun's own")


def cannot_start(error, final=False):
    """A rank's exit code when its run cannot start: 2 for a setting that cannot work (ValueError,
    said here in one line, tagged with the rank), 1 when it was said already (`final`). No restart
    follows: local rank 0 stops torchrun's agent, the other local ranks wait for it to do so."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun may stop this rank any moment: say it whole
    if not final:
        print(f"{rank_tag()}error: {error}", file=sys.stderr, flush=True)
    if os.environ.get("LOCAL_RANK", "0") != "0":
        time.sleep(1)  # meanwhile local rank 0 stops torchrun, before it sees this exit and restarts
    else:
        stopping = stop_torchrun_restarts()  # the next attempt would fail the same way
        if stopping and os.environ.get("RANK") == "0":
            print(stopping, file=sys.stderr, flush=True)
    return 1 if final else 2


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


def torchrun_workers(agent_pid):
    """The worker processes of the torchrun agent agent_pid (its children, from /proc), for the
    tools and tests that stop one rank on purpose."""
    children = []
    for task in os.listdir(f"/proc/{agent_pid}/task"):
        with open(f"/proc/{agent_pid}/task/{task}/children") as f:
            children += [int(pid) for pid in f.read().split()]
    return children


def worker_pid(agent_pid, rank):
    """The pid of the torchrun agent's worker with RANK=rank, or None (not started, or ended)."""
    for pid in torchrun_workers(agent_pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except OSError:  # it has just ended
            continue
        if env.get(b"RANK") == str(rank).encode():
            return pid
    return None
