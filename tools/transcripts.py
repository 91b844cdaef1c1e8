"""The transcripts on the pages (what a command printed), produced by running the command.

    python tools/transcripts.py --check                        # rerun every transcript, compare (minutes)
    python tools/transcripts.py --check docs/training.md       # one page's
    python tools/transcripts.py --update docs/task8-checkpoints.md   # rewrite its blocks from fresh runs

A transcript is a ```text block whose first line is `$ ` and its command, right below a marker:

    <!-- transcript: torchrun --standalone --nproc_per_node=2 train_ddp.py --impl solutions --data synthetic -->

with options between `transcript` and the colon, each a name and one word:

    kill-rank-1-at-step 50     SIGKILL rank 1 once --checkpoint-dir's last.pt holds step 50 (torchrun's
                               --max-restarts then restarts both ranks); what happens between the kill and
                               the restart, whose order depends on timing, is abridged
    mistakes a,b               the template_*.py files are the reference answers with these mistakes of
                               tests/mistakes.py (a student's submission, for check.py)
    not-started 2.3            ... and this task's fence as the template has it (the TODO)
    exit 1                     the exit status the command must end with (default 0)
    cpu intel-avx512-amx       the kind of CPU that wrote the block's figures (cpu_kind(); --update
                               writes this machine's): on another kind --check compares all but
                               the losses, accuracies and counts, which its kernels round otherwise

Each command runs in a temporary copy of the files git knows (its runs/ and checkpoints start
empty), its output (stdout and stderr together) becomes the block. --check compares with what
the page shows after masking what depends on the machine's speed or state (images/s, the share
of step time, seconds, log time stamps, pids, ports, the Python install's path); losses,
accuracies, counts and words are compared as they are. tests/test_transcripts.py runs --check
(pytest -m slow). Transcripts that need what the tests do not have (SLURM's requeue) carry no
marker and say so in the page's text.
"""
import argparse
import difflib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from support.interrupt import worker_pid  # noqa: E402
MARKER = re.compile(r"^<!-- transcript((?: [\w.,-]+)*): ([^\n]+?) -->\n```text\n(.*?)^```$", re.M | re.S)
OPTIONS = {"kill-rank-1-at-step", "mistakes", "not-started", "exit", "cpu"}  # each takes one word
TIMEOUT = 300  # seconds a command may run before it counts as a hang

# (pattern, what it becomes) for --check: what a run on another machine, or at another time, prints differently
MASKS = [
    (r"[\d,]+ images/s", "N images/s"),
    (r"(sync|all-reduces) \d+% of step time", r"\1 N% of step time"),  # --local-sgd/--diloco say all-reduces
    (r"\(\d+\.\d s\)", "(N s)"),
    (r" in \d+ s\b", " in N s"),  # check.py's "1 of 4 tasks done in 51 s"
    (r"^([\w\[\]:]*)([IWE])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ", r"\1\2MMDD hh:mm:ss PID "),  # torch's log lines
    (r"(pid:?|process) \d+", r"\1 PID"),
    (r"binary: \S+", "binary: PYTHON"),
    (r"(127\.0\.0\.1|localhost)\]?:\d+", r"\1:PORT"),
]
# What a training run prints that another kind of CPU computes otherwise: its figures (2.0316, 86.95%, (1739/2000))
FIGURES = [(r"\d+\.\d+", "F"), (r"\(\d+/\d+\)", "(N/N)")]
ABRIDGED = "  ... (rank 1 killed: rank 0's error in its next collective, torchrun stops it and restarts both; abridged)"


def mask(text, figures=False):
    text = "".join(line.rstrip() + "\n" for line in text.splitlines())
    for pattern, replacement in MASKS + (FIGURES if figures else []):
        text = re.sub(pattern, replacement, text, flags=re.M)
    return text


def cpu_kind():
    """The kind of this machine's CPU, as far as a training run's figures go: its maker and the widest vector
    units torch's kernels may use. The same run printed other losses on three machines of this course in
    2026-11 (train loss 2.0316, 2.0317 and 2.0318 after one epoch; a restarted run's test loss 0.34 against 2.78
    after three), and on one machine, oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2) turned its 2.0316 into
    2.0319: the convolutions' rounding follows the instructions they run on."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:  # not Linux
        import platform
        return f"{sys.platform}-{platform.machine()}".lower()
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", info, re.M)
    flags = set((re.search(r"^(?:flags|Features)\s*:(.*)$", info, re.M) or [None, ""])[1].split())
    maker = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(vendor[1] if vendor else "", "other")
    widest = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
    return "-".join([maker, widest] + ["amx"] * ("amx_tile" in flags))


def blocks(page):
    """(options, command, shown text, match) for every transcript of a page; options: a dict of
    the marker's `option value` pairs."""
    with open(os.path.join(REPO, page)) as f:
        text = f.read()
    for match in MARKER.finditer(text):
        words = match.group(1).split()
        options = dict(zip(words[::2], words[1::2]))
        if len(words) % 2 or not set(options) <= OPTIONS:
            raise ValueError(f"{page}: transcript marker options {match.group(1).strip()!r}: "
                             f"expected pairs of {sorted(OPTIONS)} and a value")
        yield options, match.group(2), match.group(3), match


def shown_command(command):
    """The `$ command` lines: wrapped with backslashes after about 100 characters."""
    lines, line = [], "$"
    for word in shlex.split(command):
        word = shlex.quote(word)
        if len(line) + len(word) > 100 and line != "$":
            lines.append(line + " \\")
            line = "     "
        line += " " + word
    return "\n".join(lines + [line]) + "\n"


def course_copy(options):
    """The files git knows, in a fresh temporary folder. With `mistakes a,b` (names from
    tests/mistakes.py) its template_*.py files are a student's: the reference answers with those
    mistakes, and with `not-started X.Y` that task's fence as the template has it (the TODO)."""
    dest = tempfile.mkdtemp(prefix="transcript-")
    if "mistakes" not in options and "not-started" not in options:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                                capture_output=True, text=True, timeout=60, check=True)
        for name in filter(None, listed.stdout.split("\0")):
            if os.path.isfile(os.path.join(REPO, name)):
                os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
                shutil.copy2(os.path.join(REPO, name), os.path.join(dest, name))
        return dest
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from mistakes import MISTAKES, make_submission
    names = set(options.get("mistakes", "").split(",")) - {""}
    chosen = [m for m in MISTAKES if m.name in names]
    assert {m.name for m in chosen} == names, f"no mistake named {names - {m.name for m in chosen}} in tests/mistakes.py"
    os.rmdir(dest)  # make_submission creates it
    make_submission(dest, chosen)
    for task in filter(None, options.get("not-started", "").split(",")):
        fence = re.compile(rf"^[ \t]*# --- Task {re.escape(task)} begin ---\n.*?# --- Task {re.escape(task)} end ---\n",
                           re.M | re.S)
        for name in os.listdir(REPO):
            if name.startswith("template_") and name.endswith(".py"):
                with open(os.path.join(REPO, name)) as f:
                    todo = fence.search(f.read())
                if todo:
                    with open(os.path.join(dest, name)) as f:
                        text = f.read()
                    with open(os.path.join(dest, name), "w") as f:
                        f.write(fence.sub(lambda _: todo.group(0), text, count=1))
    return dest



def checkpoint_step(path, seen):
    """The step of the checkpoint at path when it changed since `seen`, else None."""
    import torch
    try:
        stat = os.stat(path)
        if (stat.st_ino, stat.st_mtime_ns) == seen.get("id"):
            return None
        seen["id"] = (stat.st_ino, stat.st_mtime_ns)
        return torch.load(path, weights_only=True)["step"]
    except (OSError, RuntimeError, EOFError, KeyError):
        return None


def run(command, kill_at, cwd, expected_exit=0):
    """The command's output, run in cwd; with kill_at, rank 1 is killed once the checkpoint holds
    that step. Never waits more than TIMEOUT seconds."""
    words = shlex.split(command)
    # torchrun's own script, not python -m torch.distributed.run, whose log lines lack their prefix
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    head = {"python": [sys.executable], "torchrun": [torchrun] if os.path.exists(torchrun) else
            [sys.executable, "-m", "torch.distributed.run"]}
    argv = head.get(words[0], words[:1]) + words[1:]
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + TIMEOUT
    killed = None
    if kill_at is not None:
        last = os.path.join(cwd, words[words.index("--checkpoint-dir") + 1], "last.pt")
        seen = {}
        while proc.poll() is None and time.monotonic() < deadline and killed is None:
            step = checkpoint_step(last, seen)
            pid = worker_pid(proc.pid, 1) if step == kill_at else None
            if pid:
                os.kill(pid, signal.SIGKILL)
                killed = step
            time.sleep(0.02)
    try:
        out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise RuntimeError(f"{command} did not finish within {TIMEOUT} s:\n{out[-3000:]}")
    if proc.returncode != expected_exit:
        raise RuntimeError(f"{command} exited with {proc.returncode}, not {expected_exit}:\n{out[-3000:]}")
    if kill_at is not None and killed is None:
        raise Missed(f"{command}: the checkpoint never held step {kill_at}, rank 1 was not killed:\n{out[-3000:]}")
    out = "".join(line.rstrip() + "\n" for line in out.splitlines())  # torchrun's log lines end in a space
    return abridge(out) if kill_at is not None else out


def abridge(out):
    """A killed run's output without what happens between the kill and the restart (tracebacks,
    torchrun's warnings, rank 0's interrupted line: their order and wording depend on timing),
    keeping torchrun's line that says which rank failed and how."""
    lines = out.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if "Traceback" in line or "closing signal" in line
                 or "failed (exitcode" in line or "interrupted at" in line)
    resumed = next(i for i, line in enumerate(lines) if line.startswith("resuming from"))
    failed = [line for line in lines[first:resumed] if "failed (exitcode" in line]
    return "".join(lines[:first] + [ABRIDGED + "\n"] + failed + lines[resumed:])


class Missed(RuntimeError):
    """The kill came too late: the checkpoint had moved past the step before it was seen."""


def produce(command, options, tries=2):
    """The transcript: `$ command` and what it prints. A kill that came too late (a very busy
    machine: the watcher saw no checkpoint at the step) is tried once more."""
    kill_at = int(options["kill-rank-1-at-step"]) if "kill-rank-1-at-step" in options else None
    for attempt in range(tries):
        cwd = course_copy(options)
        try:
            return shown_command(command) + run(command, kill_at, cwd, int(options.get("exit", 0)))
        except Missed:
            if attempt == tries - 1:
                raise
        finally:
            shutil.rmtree(cwd, ignore_errors=True)


def of_another_cpu(options):
    """Whether a block's figures were written by another kind of CPU than this one (its `cpu` option)."""
    return "cpu" in (options or {}) and options["cpu"] != cpu_kind()


def difference(shown, fresh, options=None):
    """'' when the shown transcript and a fresh one agree once masked, else a unified diff. A block whose
    figures another kind of CPU wrote (its `cpu` option) is compared without them."""
    figures = of_another_cpu(options)
    if mask(shown, figures) == mask(fresh, figures):
        return ""
    return "".join(difflib.unified_diff(mask(shown, figures).splitlines(True), mask(fresh, figures).splitlines(True),
                                        "on the page (masked)", "the command now (masked)"))


def with_this_cpu(text, match):
    """The marker of `match` with its `cpu` option set to this machine's kind (the block is rewritten here)."""
    marker = text[match.start():match.start(3)]
    marker = re.sub(r"( cpu )[\w.,-]+", lambda m: m[1] + cpu_kind(), marker, count=1)
    return text[:match.start()] + marker + text[match.start(3):]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="rerun each transcript and compare it with the page")
    what.add_argument("--update", action="store_true", help="rerun each transcript and write it into the page")
    parser.add_argument("pages", nargs="*", help="pages to do (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    pages = args.pages or ["README.md"] + sorted(os.path.join("docs", p) for p in os.listdir(os.path.join(REPO, "docs"))
                                                 if p.endswith(".md"))
    failed = 0
    for page in pages:
        found = list(blocks(page))
        fresh = []
        for options, command, shown, match in found:
            print(f"{page}: {command}", flush=True)
            fresh.append(produce(command, options))
            problem = difference(shown, fresh[-1], options)
            if args.check and of_another_cpu(options):
                print(f"  its figures are of a CPU of kind {options['cpu']}, this one is {cpu_kind()}: compared without them",
                      flush=True)
            if problem and args.check:
                print(problem, flush=True)
                failed += 1
        if args.update and found:  # the page as it is now: it may have been edited during the runs
            now = list(blocks(page))
            if [b[:2] for b in now] != [b[:2] for b in found]:
                raise SystemExit(f"{page}: its transcript markers changed during the runs; run --update again")
            with open(os.path.join(REPO, page)) as f:
                text = f.read()
            for (_, _, _, match), output in reversed(list(zip(now, fresh))):
                text = with_this_cpu(text[:match.start(3)] + output + text[match.end(3):], match)
            with open(os.path.join(REPO, page), "w") as f:
                f.write(text)
            print(f"{page}: {len(found)} transcript(s) written")
    if args.check:
        print(f"{failed} transcript(s) differ from their command's output" if failed else "transcripts: all match")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
