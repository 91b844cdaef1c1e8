"""Run the tests once and say, task by task, what state the work is in. Shared by check.py
(students) and grading/grade.py (instructors).

    tasks = discover_tasks(repo)                         # from pytest.ini and the fences
    run = run_tests(repo, [t.id for t in tasks], workdir=tmp, timeout=600)
    for result in summarize(tasks, run): print(result.task.id, result.status, result.explanation)

Tasks are found, never listed here: a "taskX_Y" marker in pytest.ini is a task, and a
"# --- Task X.Y begin ---" fence (or "# TODO Task X.Y") in a template_*.py file says where it is. The pytest run
is one process group with a time limit; grading/pytest_plugin.py records each test's
outcome. The explanations are the tests' own assertion messages (and the harness's, for a
hang), shortened; HINTS adds a sentence only for errors that no test message covers.
"""
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

from grading.pytest_plugin import HARNESS_HANG, is_hang

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MARKER_LINE = re.compile(r"^\s*task(\d+)_(\d+)\s*:\s*(.*?)\s*$", re.MULTILINE)
# where a task is: its fence, or its TODO line (a template may keep either)
FENCE = re.compile(r"#\s*(?:---\s*Task (\d+)\.(\d+) begin\s*---|TODO Task (\d+)\.(\d+)\b)")
TASK_NAMED = re.compile(r"Task (\d+\.\d+)")
# an unfilled TODO's own words (the templates' NotImplementedError), also inside a test's message where the test
# caught the rank's error to say it (a NotImplementedError is a RuntimeError) and ran into another task's TODO
TODO_RAISED = re.compile(r"NotImplementedError: Task (\d+\.\d+): .*? is not done yet")
# "rank 1 raised ValueError: ...", from the harness; after "Task 9.2 (...): " where the tests' conftest.py
# named the task (tests/harness.py, named_failure)
RANK_FAILED = re.compile(r"^(Tasks? [\d., ]+(?: \(.*?\))?: )?rank (\d+) raised (\w+): (.*?)"
                         r"(?:\n\n--- rank \d+ traceback ---|\Z)", re.DOTALL)
TASK_PREFIX = re.compile(r"Tasks? [\d., ]+(?: \(.*\))?:")

# Errors that come from Python or PyTorch rather than from a test, and what they usually mean.
# (regex on "ExceptionType: message", the sentence to add)
HINTS = [
    # gloo's own refusal only: a test's message may name ReduceOp.AVG, which gloo takes since torch 2.7
    (r"Cannot use ReduceOp\.AVG",
     "This PyTorch's gloo has no ReduceOp.AVG (torch 2.7 added it): all_reduce with SUM, then divide by the "
     "world size."),
    (r"a leaf Variable that requires grad is being used in an in-place operation",
     "Write into parameters under torch.no_grad(), so that autograd does not record the copy."),
    (r"Found no NVIDIA driver|Torch not compiled with CUDA enabled|No CUDA GPUs are available",
     "The code calls CUDA on a machine without a GPU (torch.cuda.synchronize(), .cuda(), device='cuda'): "
     "use the tensors' own device, and no torch.cuda calls: a collective on CPU tensors has returned "
     "when its result is there."),
    (r"No backend type associated with device type cpu|Tensors must be CUDA",
     "NCCL reduces GPU tensors only: create the tensor on the `device` argument."),
    # gloo's "expected (6), got (2, 3)": stacked where it shows one dim more; any other size: too small or large
    (r"ProcessGroupGloo::allgather: invalid tensor size at index \d+ \(expected \((?:\d+\), got \(\d+, \d+\)|"
     r"\d+, \d+\), got \(\d+, \d+, \d+\)|\d+, \d+, \d+\), got \(\d+, \d+, \d+, \d+\))",
     "Gloo's all_gather_into_tensor takes an output of the inputs concatenated along dim 0 (world_size * n, ...), "
     "not stacked (world_size, n, ...): view it so, or all_gather into a list of tensors."),
    (r"ProcessGroupGloo::allgather: invalid tensor size",
     "Gloo's all_gather_into_tensor takes an output of exactly world_size times the input's elements, the inputs "
     "concatenated along dim 0 (world_size * n, ...)."),
    # the tests' own messages say it in full, per task (tests/wire.py, gloo_wait_only: the checker imports no torch,
    # nor tests/), and where one did ("no Future") this line is not added; it says the same for an error none covers
    (r"\A(?![\s\S]*\bno Future\b)[\s\S]*?(?:Work::getFuture not implemented|getFuture.*not (?:implemented|supported))",
     "On gloo, the Works of point-to-point messages (dist.isend, dist.irecv) and of a reduce-scatter have no Future, "
     "and polled with is_completed() they say True only once their wait() has run (a reduce-scatter's never): wait "
     "for them with work.wait()."),
    # not only a collective: dist.get_rank() in a process without a group too (trial 11, Task 8.1)
    (r"Default process group has not been initialized",
     "A torch.distributed call (a collective, dist.get_rank(), dist.get_world_size()) ran where there is no process "
     "group: before init_process_group, after destroy_process_group, or in a single process that never made one."),
    # trial 11, Task 5.1: `param in bucket.params` compares the values of tensors, element by element
    (r"Boolean value of Tensor with more than one (?:value|element) is ambiguous",
     "A tensor stood where Python wants one True or False: `if t`, `and`/`or`, or `t in a_list` / `a_list.index(t)` / "
     "`==` between tensors, which compare values element by element. To find a tensor among others, compare identity "
     "(`any(t is p for p in a_list)`, a set of `id(p)`); to test values, reduce them (`.any()`, `torch.equal`)."),
    (r"connectFullMesh failed|Timed out (?:waiting|after).*(?:store|rendezvous)",
     "The ranks could not connect to each other, which happens on a very busy machine: run the check again."),
    (r"Connection closed by peer|Connection reset by peer",
     "Another rank left the process group while this one waited in a collective: some rank skips a "
     "collective that the others call, which in training is a hang."),
    (r"^(ModuleNotFoundError|ImportError)",
     "Only the template_*.py files are used: import nothing beyond the standard library, torch and "
     "the repository's own modules."),
    (r"^(SyntaxError|IndentationError)", "The file does not parse: fix it, then run the check again."),
]


# Errors that a busy machine can cause in a right answer (a rank too slow to connect, a peer
# that timed out and left): the grader runs such a task again.
MAYBE_THE_MACHINE = {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError",
                     "ConnectionError", "ConnectionResetError", "BrokenPipeError", "TimeoutError", "OSError",
                     "EOFError", "RankFailed",
                     "RankStartupTimeout"}  # tests/harness.py: the ranks never got as far as the code under test
# A RuntimeError only where its message says so (gloo's lost peers and time-outs are RuntimeErrors): most come
# from the code (a shape, a dtype, autograd) and come again, and a plain wrong answer was run twice before
# check.py reported it (issue 45's trial).
_MACHINE_SAYS = re.compile(r"onnect|peer|pair closure|[Tt]imed out|[Tt]imeout|[Ss]ocket|[Bb]roken pipe|[Ss]tore\b|"
                           r"rendezvous|can't allocate memory|out of memory|Interrupted system call|"
                           r"Resource temporarily unavailable")


# A rank that died by its own code (tests/harness.py's _died): an abort, a crash in C code or an exit. Run again it
# dies again (trial 6: a receive buffer of the wrong size, aborted by gloo, was run twice); one killed from outside
# (SIGKILL: out of memory?) may be the machine's.
_DIED_OF_ITS_CODE = re.compile(r"(?:^|: )rank \d+ (was killed by SIG(ABRT|SEGV|BUS|FPE|ILL)\b|ended with exit code -?\d+ "
                               r"without)")


def maybe_the_machine(error_type, message):
    """Whether an error of this type and message can be a busy machine's doing in a right answer."""
    if error_type == "RuntimeError":
        return bool(_MACHINE_SAYS.search(message or ""))
    if error_type == "RankFailed" and _DIED_OF_ITS_CODE.search(message or ""):  # the test's "Task X.Y (...): " first
        return False
    return error_type in MAYBE_THE_MACHINE


# The harness's hang report (tests/harness.py, _raise_timeout): who was still running, who had finished,
# and where each stuck rank was (its innermost frame first).
_HANG_RANKS = re.compile(r"ranks \[([\d, ]*)\] were still running after [\d.]+ s \(ranks \[([\d, ]*)\] had finished\)")
_RANK_AT = re.compile(r"rank (\d+) was at:\s+File \"([^\"]+)\"")
# ... and when it came before the time limit: every rank still running waited, none using the CPU (harness.Stillness)
_STILL = re.compile(r"all of them waiting, without using the CPU, for the last [\d.]+ s")


def is_deadlock(message):
    """Whether a hang is one no machine can cause: none of the ranks still running used the CPU for seconds
    (harness.Stillness: they all wait, on whatever, and give nothing to each other), or a rank finished its
    whole function and every rank still running waits inside torch.distributed (a collective, a send or a
    receive) for a peer, which a finished rank never calls. These waits never end, however fast or slow the
    machine is: run again, the test hangs again (a Task 13 mistake cost 2 x 45 s, 183 s under load). A hang
    at the time limit with no rank finished, or a stuck rank that is computing, may be a slow machine."""
    found = _HANG_RANKS.search(message or "")
    if found and _STILL.search(message):
        return True
    if not found or not found[2].strip():
        return False
    stuck = [rank.strip() for rank in found[1].split(",") if rank.strip()]
    at = dict(_RANK_AT.findall(message))
    return bool(stuck) and all("/torch/distributed/" in at.get(rank, "").replace("\\", "/") for rank in stuck)


@dataclasses.dataclass
class Task:
    id: str  # "2.3", as in the docs and the fences
    title: str = ""  # from the pytest.ini marker: "Task 2.3, template_trainer.py, reduce_metrics"
    file: str = ""  # "template_trainer.py", from the fence
    function: str = ""  # the function around the (first) fence
    line: int = 0  # the fence's line
    places: list = dataclasses.field(default_factory=list)  # every function fenced for it: "Class.method"

    @property
    def marker(self):
        return "task" + self.id.replace(".", "_")

    @property
    def key(self):
        return tuple(int(part) for part in self.id.split("."))

    def where(self):
        """'template_trainer.py, reduce_metrics()' or the marker's description. A task fenced in
        several functions names them all, so that "fix Task 9.4" points at both of its functions:
        'template_tensor_parallel.py, sampler_rank_and_size() and average_gradients_over_dp()'."""
        if not self.file:
            return re.sub(r"^Task \d+\.\d+,?\s*", "", self.title)
        if not self.function:
            return self.file
        methods = {}  # "Class" -> its fenced methods, in file order; a plain function has no class
        for place in self.places or [self.function]:
            owner, _, name = place.rpartition(".")
            methods.setdefault(owner or name, []).append(name if owner else "")
        names = [f"{owner}.{'/'.join(found)}()" if found[0] else f"{owner}()" for owner, found in methods.items()]
        return f"{self.file}, " + (" and ".join(names) if len(names) < 3 else
                                   ", ".join(names[:-1]) + " and " + names[-1])


def discover_tasks(repo=REPO):
    """Every task of the course, in course order: pytest.ini's taskX_Y markers, located by the fences
    (or the TODO lines) of the template_*.py files."""
    tasks = {}
    ini = os.path.join(repo, "pytest.ini")
    if os.path.exists(ini):
        with open(ini, encoding="utf-8") as f:
            for major, minor, title in MARKER_LINE.findall(f.read()):
                tasks[f"{major}.{minor}"] = Task(f"{major}.{minor}", title=title)
    for name in sorted(os.listdir(repo)):
        if not (name.startswith("template_") and name.endswith(".py")):
            continue
        with open(os.path.join(repo, name), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        for number, line in enumerate(lines, 1):
            match = FENCE.search(line)
            if not match:
                continue
            task_id = f"{match[1]}.{match[2]}" if match[1] else f"{match[3]}.{match[4]}"
            task = tasks.setdefault(task_id, Task(task_id))
            if task.file and task.file != name:  # fenced in two files: the first one names it
                continue
            place = _enclosing(lines, number)
            if not task.file:
                task.file, task.line, task.function = name, number, place.rpartition(".")[2]
            if place and place not in task.places:
                task.places.append(place)
    return sorted(tasks.values(), key=lambda task: task.key)


def _enclosing(lines, number):
    """The function around line `number` (1-based), as "function" or "Class.method"; "" if none."""
    indent = len(lines[number - 1]) - len(lines[number - 1].lstrip())
    names = []
    for above in reversed(lines[:number - 1]):
        found = re.match(r"^(\s*)(?:async\s+def|def|class) (\w+)", above)
        if found and len(found[1]) < indent:
            names.insert(0, found[2])
            indent = len(found[1])
            if not indent:
                break
    return ".".join(names[-2:])


def select_tasks(tasks, wanted):
    """The tasks named in `wanted` ("2.3", "task2_3", "Task 2.3", or "2" for all of Task 2)."""
    if not wanted:
        return list(tasks)
    chosen = []
    for word in wanted:
        text = re.sub(r"^(task\s*)", "", word.strip(), flags=re.IGNORECASE).replace("_", ".")
        matches = [t for t in tasks if t.id == text or t.id.split(".")[0] == text]
        if not matches:
            known = ", ".join(t.id for t in tasks)
            raise ValueError(f"no task {word!r}: the tasks are {known} (or a whole task, like "
                             f"{tasks[0].id.split('.')[0] if tasks else '1'})")
        chosen += [t for t in matches if t not in chosen]
    return sorted(chosen, key=lambda task: task.key)


# ----------------------------------------------------------------------------- running

@dataclasses.dataclass
class Run:
    events: list
    seconds: float
    returncode: int
    timed_out: bool  # killed at the time limit
    timeout: float
    log_path: str
    stack: str = ""  # where the pytest process was when it was killed
    repo: str = ""  # the course that was tested


def task_test_files(repo, markers):
    """The test files of `repo` that name one of `markers` ("task2_2"), relative to `repo`; "tests" if
    none does. Collecting only these, not every test file (which imports every template and solution),
    takes seconds off each check. A task's marker is always written in its file as `mark.taskX_Y`
    (tests/conftest.py refuses a test that gets one otherwise); a file that only names the marker in a
    string (tests/test_mistakes.py's lists, which run other pytests) is not collected."""
    tests = os.path.join(repo, "tests")
    if not os.path.isdir(tests):
        return ["tests"]
    named = re.compile(r"\bmark\.(?:" + "|".join(map(re.escape, markers)) + r")\b")
    found = []
    for name in sorted(os.listdir(tests)):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(tests, name), encoding="utf-8", errors="replace") as f:
                if named.search(f.read()):
                    found.append(f"tests/{name}")
    return found or ["tests"]


def run_tests(repo, task_ids, workdir, impl="template", timeout=600.0, test_timeout=None, wrap=None,
              fast_first=False):
    """One pytest run of the tests of `task_ids`, in its own process group, killed after `timeout` s.
    `wrap(command, env, workdir)` -> (command, env): how to run it (grading/sandbox.py); pytest
    writes only into `workdir`, and the log goes there from outside. `fast_first` (check.py, not the
    grader, which counts every test): a task's slow tests run last, and not once it failed."""
    results = os.path.join(workdir, "results.jsonl")
    stack = os.path.join(workdir, "stack.txt")
    log_path = os.path.join(workdir, "pytest.log")
    for path in (results, stack):
        if os.path.exists(path):
            os.remove(path)
    if not task_ids:
        raise ValueError("no task to run")
    markers = ["task" + task.replace(".", "_") for task in task_ids]
    command = [sys.executable, "-m", "pytest", f"--impl={impl}", "-m", " or ".join(markers),
               "-p", "grading.pytest_plugin", f"--results-file={results}", f"--stack-file={stack}",
               "-p", "no:cacheprovider", "-q", "--color=no"] + (["--fast-first"] if fast_first else [])
    # the tests' tmp_path in workdir too, not in /tmp/pytest-of-USER, where at its exit each pytest run deletes the
    # oldest of the numbered folders kept there, however large (course copies of the slow tests: 106 and 188 MB
    # folders there today): pytest's cleanup_numbered_dir took 0.9-2.3 s at the exit of 3 of 15 runs of Task 0.3's
    # tests (1 s of tests) on a busy machine, timed by an atexit wrapper
    command.append(f"--basetemp={os.path.join(workdir, 'tmp')}")
    if test_timeout:
        command.append(f"--timeout={test_timeout}")
    command += task_test_files(repo, markers)
    # PYTHONDONTWRITEBYTECODE is left as the caller has it: unset, the checks after the first read the course's
    # compiled files from __pycache__ (which git ignores) in pytest and in every rank, as docs/checking.md says
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
               PYTHONUNBUFFERED="1")
    if wrap:
        command, env = wrap(command, env, workdir)
    start = time.monotonic()
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=(os.name == "posix"))
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            if hasattr(signal, "SIGUSR2"):
                try:
                    os.kill(_pytest_pid(proc.pid), signal.SIGUSR2)  # the plugin writes where it is
                    time.sleep(0.5)
                except ProcessLookupError:
                    pass
            returncode = -9
        except BaseException:  # Ctrl-C: take the ranks down too
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc)  # also any rank or forkserver left behind
            proc.wait()
    events = []
    if os.path.exists(results):
        with open(results, encoding="utf-8") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:  # a line cut short by the kill
                    pass
    stack_text = ""
    if timed_out and os.path.exists(stack):
        with open(stack, encoding="utf-8", errors="replace") as f:
            stack_text = f.read()
    return Run(events, time.monotonic() - start, returncode, timed_out, timeout, log_path, stack_text, repo)


def _pytest_pid(pid):
    """The pytest process: `pid` itself, or under a sandbox (which would die of SIGUSR2) the
    first of its descendants that runs pytest."""
    def is_pytest(p):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                return f.read().split(b"\0")[1:3] == [b"-m", b"pytest"]
        except OSError:
            return False
    if not os.path.isdir("/proc") or is_pytest(pid):
        return pid
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    todo = [pid]
    while todo:  # breadth first: the outermost pytest, not one of its ranks
        here = todo.pop(0)
        if here != pid and is_pytest(here):
            return here
        todo += sorted(children.get(here, []))
    return pid


def _kill_group(proc):
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------- summarising

@dataclasses.dataclass
class Outcome:
    nodeid: str
    tasks: list
    state: str = "not run"  # passed, failed, skipped, hung, unfinished, not run
    exc_type: str = ""
    message: str = ""
    where: str = ""


@dataclasses.dataclass
class TaskResult:
    task: Task
    status: str  # done, not started, blocked, failing, hang, skipped, not run, no tests, error
    explanation: str = ""  # one or two sentences
    details: list = dataclasses.field(default_factory=list)  # further lines (where stuck ranks were)
    error_type: str = ""  # the exception behind `explanation` ("AssertionError": a test's check failed)
    maybe_the_machine: bool = False  # an error a busy machine can cause (maybe_the_machine)
    deadlock: bool = False  # a hang that running again would repeat (is_deadlock)
    passed: int = 0
    total: int = 0
    outcomes: list = dataclasses.field(default_factory=list)

    @property
    def done(self):
        return self.status == "done"

    @property
    def certain(self):
        """Whether running again would give the same status. The tests are deterministic; a
        hang, a crash or a lost connection can be a busy machine's doing; a deadlock cannot."""
        if self.status == "hang":
            return self.deadlock
        return self.status not in ("error", "not run") and not (self.status == "failing" and self.maybe_the_machine)


def outcomes_of(run):
    """One Outcome per collected test, from the plugin's events."""
    tests = {}
    for event in run.events:
        kind, nodeid = event.get("event"), event.get("nodeid")
        if kind == "collected":
            tests[nodeid] = Outcome(nodeid, event.get("tasks", []))
        elif nodeid not in tests:
            continue
        elif kind == "start":
            tests[nodeid].state = "unfinished"
        elif kind == "skipped":  # not run: an earlier test of its task hung or was not implemented
            test = tests[nodeid]
            test.state = "hung" if event["reason"] == "hang" else "failed"
            test.exc_type = "Skipped" if event["reason"] == "hang" else event["reason"]
            test.message = event["message"]
        elif kind == "report":
            test = tests[nodeid]
            if test.state in ("failed", "hung") or (test.state == "skipped" and event["when"] != "teardown"):
                continue  # keep the first failure; a skip in setup means no call phase
            if event["outcome"] == "failed":
                test.exc_type, test.message = event.get("exc_type", ""), event.get("message", "")
                test.where = event.get("where") or ""
                test.state = "hung" if is_hang(test.exc_type, test.message) else "failed"
                if event["when"] == "teardown" and test.state == "failed":
                    test.message = "(while cleaning up after the test) " + test.message
            elif event["outcome"] == "skipped":
                test.state, test.message = "skipped", event.get("message", "")
            elif event["when"] in ("call", "teardown") and test.state != "skipped":
                test.state = "passed"
    return list(tests.values())


def summarize(tasks, run, blame=True):
    """A TaskResult for each task, in course order. With blame, in a student release, a failing task's
    explanation says which tasks of its file that its tests use fail too (blame_own_answers)."""
    outcomes = outcomes_of(run)
    collect_errors = [e for e in run.events if e.get("event") == "collect_error"]
    results = [_summarize_task(task, [o for o in outcomes if task.id in o.tasks], run, collect_errors)
               for task in tasks]
    if blame and run.repo and is_release(run.repo):
        blame_own_answers(results, discover_tasks(run.repo))
    return results


def is_release(repo):
    """A student release has no solutions/: a task's tests then run the student's own answers to the other
    tasks of its file (tests/conftest.py's `load`)."""
    return not os.path.isdir(os.path.join(repo, "solutions"))


# The other tasks of its file whose answers a task's tests run (in the course solutions/', in a release the
# student's own), measured by tools/tasks_used.py: in a release with every answer but one task's, `check.py` said
# these tasks were blocked by it. Not every earlier task (2.3's tests run neither 2.1 nor 2.2), and a few later ones
# (Task 14.1's attention runs with 14.3's gather and 14.4's layers; docs/checking.md lists those).
TASKS_USED = {
    "1.3": ("1.1", "1.2"), "1.4": ("1.1", "1.2", "1.3"),
    "4.4": ("4.1", "4.2", "4.3"),
    "5.3": ("5.1", "5.2"), "5.4": ("5.1", "5.2", "5.3"), "5.5": ("5.1", "5.2", "5.3", "5.4"),
    "6.2": ("6.1", "6.3"), "6.3": ("6.1", "6.2"),
    "7.3": ("7.1", "7.2", "7.4"), "7.4": ("7.1", "7.2", "7.3"), "7.5": ("7.1", "7.2", "7.3", "7.4"),
    "8.2": ("8.1",), "8.4": ("8.1", "8.2", "8.3"),
    "9.2": ("9.1",), "9.3": ("9.1", "9.2", "9.4"), "9.4": ("9.1", "9.2", "9.3"),
    "10.2": ("10.1", "10.3"), "10.3": ("10.1", "10.2"), "10.4": ("10.1", "10.2", "10.3", "10.5", "10.6"),
    "10.5": ("10.1", "10.2", "10.3", "10.4", "10.6"), "10.6": ("10.1", "10.2", "10.3", "10.4", "10.5"),
    "10.7": ("10.1", "10.2", "10.3", "10.4", "10.5"),
    "11.2": ("11.1",), "11.3": ("11.1", "11.2"),
    "12.3": ("12.2",),
    "13.2": ("13.1",), "13.3": ("13.1",),
    "14.1": ("14.3", "14.4"), "14.2": ("14.3", "14.4"), "14.4": ("14.1", "14.2", "14.3"),
    "14.5": ("14.1", "14.2", "14.3", "14.4"),
    "15.2": ("15.1", "15.3"), "15.3": ("15.1", "15.2"), "15.4": ("15.1", "15.2", "15.3"),
    "15.6": ("15.1", "15.2", "15.3", "15.5"),
    "16.2": ("16.1", "16.3", "16.4"), "16.3": ("16.1", "16.2", "16.4"), "16.4": ("16.1", "16.2", "16.3", "16.5"),
    "16.5": ("16.1", "16.2", "16.3", "16.4"),
}


def tasks_used(task, course):
    """The tasks of course whose answers task's tests run (TASKS_USED), in course order."""
    return [t for t in course if t.id in TASKS_USED.get(task.id, ())]


def tasks_used_unchecked(results, course):
    """The tasks of course that a failing or hung result's tests ran as the student wrote them (in a release)
    and that results did not check (tasks_used), in course order."""
    checked = {r.task.id for r in results}
    used = {t.id for r in results if r.status in ("failing", "hang") for t in tasks_used(r.task, course)}
    return [t for t in course if t.id in used and t.id not in checked]


def blame_own_answers(results, course, others=()):
    """Without solutions/ (a student release) a task's tests run the student's own answers to the other tasks
    of its file that they use (tasks_used): say which fail too (or were not checked), as the likely cause. A
    task whose tests use this one as well (14.1 and 14.4) may fail by this one's doing: said as either.
    others: results of tasks checked for this purpose only (check.py checks the tasks a failing one uses),
    which are read, not changed."""
    known = {r.task.id: r for r in list(results) + list(others)}
    for result in results:
        if result.status not in ("failing", "hang"):
            continue
        used = [t.id for t in tasks_used(result.task, course)]
        broken = [t for t in used if t in known and not known[t].done]
        unchecked = [t for t in used if t not in known]
        both_ways = [t for t in broken if result.task.id in TASKS_USED.get(t, ())]
        own = "This course has no solutions/, so these tests use your own answers to the other tasks"
        said = f"This task's tests said: {result.explanation.strip()}"
        if len(broken) > len(both_ways):  # said first (Issue 45): the test's own hint assumes them right
            first = [t for t in broken if t not in both_ways]
            one = len(first) == 1
            result.explanation = (f"{own}: Task {', '.join(first)} {'is' if one else 'are'} not done either and may "
                                  f"be the cause: fix {'it' if one else 'them'} first. {said}")
        elif both_ways:
            one = len(both_ways) == 1
            result.explanation = (f"{own}: Task {', '.join(both_ways)} {'is' if one else 'are'} not done either, and "
                                  f"{'its' if one else 'their'} tests use this task's answer too: either may be the "
                                  f"cause of the other's failure. {said}")
        elif unchecked:
            why = (f"{own} of {result.task.file}: if Task {', '.join(unchecked)} is wrong, that may be the cause "
                   f"(`python check.py {result.task.id.split('.')[0]}` checks them all).")
            result.explanation = result.explanation.rstrip() + ("" if result.explanation.rstrip().endswith(
                (".", "!", "?")) else ".") + " " + why  # "... (Task 14.1)" ends no sentence either


def in_fixing_order(results, course):
    """results in the order to fix them: course order, but a task after the not-done tasks its tests use that
    do not use it in turn (in a release a wrong 14.3 fails 14.1's tests: fix 14.3 first)."""
    known = {r.task.id: r for r in results}

    def order(result):
        waits_for = [known[t.id].task.key for t in tasks_used(result.task, course) if t.id in known
                     and not known[t.id].done and result.task.id not in TASKS_USED.get(t.id, ())]
        last = max([result.task.key, *waits_for])
        return last, last != result.task.key, result.task.key
    return sorted(results, key=order)


def _summarize_task(task, tests, run, collect_errors):
    result = TaskResult(task, "done", total=len(tests), outcomes=tests,
                        passed=sum(t.state == "passed" for t in tests))
    if not tests:
        if not run.events and run.returncode not in (0, 5) and not run.timed_out:
            result.status = "error"
            result.explanation = f"pytest did not start (exit code {run.returncode}): {_last_line(run.log_path)}"
        elif collect_errors:
            short, _ = explain("Error", collect_errors[0]["message"], "")
            result.status, result.explanation = "error", f"the tests could not be collected: {short}"
        elif run.timed_out:
            result.status = "not run"
            result.explanation = f"the tests were stopped at the time limit ({run.timeout:.0f} s) before this task's"
        elif run.returncode not in (0, 1, 5):
            result.status = "error"
            result.explanation = f"pytest stopped with exit code {run.returncode} (see {run.log_path})"
        else:
            result.status, result.explanation = "no tests", "no test is marked " + task.marker
        return result
    unfinished = [t for t in tests if t.state == "unfinished"]
    hung = [t for t in tests if t.state == "hung" and t.exc_type != "Skipped"]
    failed = [t for t in tests if t.state == "failed"]
    # a test that also belongs to another task, skipped because that task hung
    not_run = [t for t in tests if t.state == "not run" or (t.state == "hung" and t.exc_type == "Skipped")]
    if unfinished and run.timed_out:
        test = unfinished[0]
        result.status = "hang"
        result.explanation = (f"{_short_id(test.nodeid)} was still running when the time limit "
                              f"({run.timeout:.0f} s) stopped the tests: an endless loop, or a wait that never ends.")
        result.details = _stack_lines(run.stack)
    elif hung:
        result.status = "hang"
        result.deadlock = is_deadlock(hung[0].message)
        result.explanation, result.details = explain(hung[0].exc_type, hung[0].message, hung[0].where)
        result.explanation = _without_task_prefix(task, result.explanation)
    elif unfinished:  # the pytest process died during a test
        result.status = "error"
        result.explanation = (f"the test process died during {_short_id(unfinished[0].nodeid)} "
                              f"(exit code {run.returncode}): a crash in C code, or os._exit/sys.exit")
    elif failed:
        started = [t for t in failed if not _not_implemented(t)]
        if not started:
            named = [TODO_RAISED.search(t.message) or TASK_NAMED.search(t.message) for t in failed]
            others = sorted({m[1] for m in named if m and m[1] != task.id}, key=lambda s: tuple(map(int, s.split("."))))
            mine = [m for m in named if not m or m[1] == task.id]
            if mine or not others:
                result.status = "not started"
                result.explanation = f"{task.where()} still raises NotImplementedError"
            else:
                result.status = "blocked"
                result.explanation = (f"its tests need Task {', '.join(others)} first "
                                      f"({failed[0].message.strip().splitlines()[0]})")
        else:
            result.status = "failing"
            first = started[0]
            result.explanation, result.details = explain(first.exc_type, first.message, first.where)
            result.explanation = _without_task_prefix(task, result.explanation)
            rank = RANK_FAILED.match(first.message.strip())
            result.error_type = rank[3] if rank else first.exc_type
            result.maybe_the_machine = maybe_the_machine(result.error_type, rank[4] if rank else first.message)
    elif not_run:
        result.status = "not run"
        result.explanation = (f"the tests were stopped at the time limit ({run.timeout:.0f} s) before this task's"
                              if run.timed_out and any(t.state == "not run" for t in not_run) else
                              f"{_short_id(not_run[0].nodeid)} was skipped: it also tests a task that hung"
                              if not_run[0].state == "hung" else
                              f"the test process stopped (exit code {run.returncode}) before this task's tests ran")
    elif result.passed == 0:
        result.status = "skipped"
        result.explanation = next((t.message for t in tests if t.message), "every test was skipped")
    return result


def _without_task_prefix(task, text):
    """"Task 2.2 (template_trainer.py, average_gradients): ..." repeats what the report's line
    already says; "Tasks 1.1-1.3: ..." does not, and stays. Only the task's own parenthesis (which may
    hold a "()"): "Task 11.1 (...), an empty slice (...): ..." keeps the case it names."""
    return re.sub(rf"^(rank \d+: )?Task {re.escape(task.id)} \((?:[^()]|\(\))*\):\s*", r"\1", text)


def _last_line(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "no output"
    return lines[-1] if lines else "no output"


def _not_implemented(test):
    return (test.exc_type == "NotImplementedError" or test.message.startswith("NotImplementedError")
            or TODO_RAISED.search(test.message) is not None)


def _short_id(nodeid):
    return nodeid.replace("tests/", "", 1)


def _stack_lines(stack):
    """Where a faulthandler dump of the test process was: its innermost frames in the repository."""
    frames = re.findall(r'File "([^"]+)", line (\d+) in (\w+)', stack)
    ours = [(path, line, function) for path, line, function in frames
            if not path.startswith("<") and "site-packages" not in path and "/lib/python" not in path]
    return [f"the test process was at {os.path.basename(path)}:{line} in {function}"
            for path, line, function in ours[:2]]


def explain(exc_type, message, where):
    """(one or two sentences, further lines) for a failed test's exception."""
    message = (message or "").strip()
    prefix = ""
    rank = RANK_FAILED.match(message)
    if rank:  # "rank 1 raised AssertionError: ..." from the harness
        prefix, exc_type, message = f"{rank[1] or ''}rank {rank[2]}: ", rank[3], rank[4].strip()
    details = []
    hang = HARNESS_HANG.search(message)
    if hang:  # the harness's report, maybe after the test's own explanation of this hang
        own = message[:hang.start()].strip()
        if TASK_PREFIX.fullmatch(own):  # only the task's name (named_failure): the report's line is the news
            prefix, own = own + " ", ""
        harness, _, rest = message[hang.start():].partition("\n")
        details = _stuck_ranks(rest)
        facts = harness.split(". ")[0]  # "ranks [0] were still running after 15 s (ranks [1] had finished)"
        message = f"{own} ({facts})" if own else harness
        exc_type = "RankTimeout"
    elif exc_type == "Failed" and "from pytest-timeout" in message:
        limit = re.search(r"Timeout \(>([\d.]+)s\)", message)
        seconds = f"{float(limit[1]):g} s" if limit else "its time limit"
        return (f"the test ran longer than {seconds}" + (f", stopped at {where}" if where else "") +
                ": an endless loop, or a wait that never ends."), details
    elif exc_type in ("AssertionError", "Failed"):
        message = re.split(r"\n\s*assert |\nassert ", "\n" + message, maxsplit=1)[0].strip() or message
    # a rank's traceback (or call_alone's), kept in pytest's report, not in the line
    message = re.split(r"\n\n(?:--- rank |Traceback \(most recent call last\))", message)[0]
    text = " ".join(message.split())
    text = re.sub(r"\[[^\]\s]*\.(?:cc|cpp|h):\d+\] ", "", text)  # gloo's source location
    text = text.split(" This is typically caused by")[0]  # gloo's advice, shown instead in HINTS
    if exc_type not in ("AssertionError", "Failed", "RankTimeout", "RankFailed", "TaskFailure", "Error", "") or not text:
        text = f"{exc_type}: {text}" if text else exc_type
    text = prefix + _shorten(text)
    if where and exc_type not in ("AssertionError", "Failed", "RankTimeout", "TaskFailure") and where not in text:
        text += f" ({where})"
    for pattern, hint in HINTS:
        if re.search(pattern, f"{exc_type}: {message}", re.MULTILINE):
            text += ("" if text.endswith((".", "!", "?")) else ".") + " " + hint
            break
    return text, details


# A test's stand-in for a torch function, which records the call and then makes it (Task 15's recorded_wait for
# Work.wait, Task 10's counted_wait): a rank waiting inside it waits in the torch function it stands for.
_TEST_WRAPPER = re.compile(r"(?:recorded|counted|kept)_(\w+)$")


def _stuck_ranks(text):
    """One line per stuck rank from the harness's "rank N was at:" stack dumps: where it
    waited, and the lines of template_*.py files that got it there, innermost first (up to 3: a
    collective in all_reduce_mean() is a mistake of whichever caller called it on one rank only)."""
    lines = []
    for rank, block in re.findall(r"rank (\d+) was at:(.*?)(?=rank \d+ was at:|\Z)", text, re.DOTALL):
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\w+)', block)
        if not frames:
            lines.append(f"rank {rank}: {' '.join(block.split()) or 'no stack dump'}")
            continue
        path, line, function = frames[0]
        where = f"rank {rank} waits in {function}() ({os.path.basename(path)}:{line})"
        wrapper = _TEST_WRAPPER.match(function) if os.path.basename(path).startswith("test_") else None
        if wrapper:  # the innermost Python frame is the test's stand-in for the torch call the template made
            where = f"rank {rank} waits in {wrapper[1]}() (as the test records it: {os.path.basename(path)}:{line})"
        ours = [f for f in frames[1:] if os.path.basename(f[0]).startswith("template_")]
        if ours:
            where += ", called from " + " <- ".join(f"{os.path.basename(p)}:{n} in {fn}()" for p, n, fn in ours[:3])
        lines.append(where)
    return lines


def _shorten(text, limit=1500):
    """The sentences whole, the values short: they carry the hint, and check.py wraps them.

    A long run of data (a list or a tensor's values, over 80 characters) keeps its start.
    Only a text still longer than `limit` is cut, after a whole sentence."""
    text = re.sub(r"\[[\[\]\d\s,.+\-e]{80,}\]", lambda m: m[0][:60].rstrip(", ") + ", ...]", text)
    if len(text) <= limit:
        return text
    cut = text[:limit]
    end = cut.rfind(". ")
    return (cut[:end + 1] if end > limit // 2 else cut.rstrip()) + " ..."
