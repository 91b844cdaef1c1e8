"""The tests themselves: every typical wrong answer in mistakes.py must fail its task's tests.

    pytest -m slow        # about 2 s of CPU a mistake: each runs the task's tests in a fresh copy

Each run is `pytest` in a fresh copy of the course, forked from a server that has imported torch and
pytest and started the ranks' forkserver once (warm_pytest.py): a new `python -m pytest` spent some
5 s of CPU a mistake on those imports alone. Two mistakes run at once (the next one starts while a test
reads its own): one run's pytest and ranks often wait on each other, and a mistake that hangs waits for
its time limit with the cores idle.

A test that passes a wrong answer teaches a wrong thing, so each mistake must fail, and
the failure must say what is likely wrong (the mistake's hint).
"""
import os
import re
import shutil
import signal
import time
import xml.etree.ElementTree as ElementTree

import pytest

from grading.checker import task_test_files
from grading.course import copy_course
from mistakes import MISTAKES, REPO, RIGHT_ANSWERS, make_submission
from warm_pytest import WarmPytest


@pytest.fixture(scope="module")
def warm():
    with WarmPytest() as server:
        yield server


def files_with(marker):
    """The test files that name this task's marker: collecting only them saves seconds a mistake."""
    return task_test_files(REPO, [marker])


def _start(warm, mistake, folder):
    """The mistake's task tests started in a fresh copy of the course with the mistake planted: (the
    run's number for warm.result, the path of its JUnit report)."""
    repo = make_submission(str(folder / "repo"), [mistake])
    report = folder / "report.xml"
    run = warm.start(["--impl", "template", "-m", mistake.marker, "-x", "-q", "-p", "no:cacheprovider",
                      f"--junitxml={report}", *files_with(mistake.marker)], cwd=repo, timeout=110)
    return run, report


def _start_right(warm, right, folder):
    """The right answer's task tests started in a fresh copy of the course with it planted: (its run, the folder)."""
    repo = make_submission(str(folder / "repo"), list(right.edits))
    return warm.start(["--impl", "template", "-m", right.marker, "-q", "-p", "no:cacheprovider",
                       *files_with(right.marker)], cwd=repo, timeout=110), folder


def _next_params(request, count, name):
    """The parameter `name` (a mistake, a right answer) of the next `count` tests pytest will run, as far as they
    are tests of this function."""
    items = request.session.items
    following = []
    for item in items[items.index(request.node) + 1:][:count]:
        if getattr(item, "originalname", None) != request.node.originalname:
            break
        following.append(item.callspec.params[name])
    return following


# Runs started ahead of the one read. 48 entries (Tasks 6, 9 and 16): 146.5 and 143.0 s with none, 105.1 s with
# one, 102.6 s with two (2 cores: a third run finds no idle core)
AHEAD = 1


@pytest.fixture(scope="module")
def started_ahead():
    """{mistake or right answer: its run}, started while the test before it read its own: two runs at once keep
    both cores busy where one run's pytest waits on its ranks or its ranks on it (the catalogue's CI time, issue 45)."""
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: f"{m.task}-{m.name}")
def test_the_tests_catch_this_mistake(mistake, request, tmp_path_factory, warm, started_ahead):
    run, report = started_ahead.pop(mistake, None) or _start(warm, mistake, tmp_path_factory.mktemp("mistake"))
    for following in _next_params(request, AHEAD, "mistake"):
        if following not in started_ahead:
            started_ahead[following] = _start(warm, following, tmp_path_factory.mktemp("mistake"))
    returncode, out = warm.result(run)
    assert returncode == 1, f"the Task {mistake.task} tests let '{mistake.name}' through:\n{out[-3000:]}"
    failures = [case.find("failure") for case in ElementTree.parse(report).getroot().iter("testcase")]
    messages = [f.get("message", "") for f in failures if f is not None]
    assert messages, out[-3000:]
    assert not messages[0].startswith("NotImplementedError"), out[-3000:]
    # the hint must be in what the student reads first: the failing test's own message
    assert mistake.hint in messages[0], f"the failure does not say '{mistake.hint}': {messages[0]}"
    # and that message names the task (issue 32): the test's own words, or conftest.py's (harness.named_failure)
    assert re.search(rf"\bTasks? (?:[\d.]+, )*{re.escape(mistake.task)}\b", messages[0]), (
        f"the failure does not name Task {mistake.task}: {messages[0]}")
    shutil.rmtree(report.parent)  # its copy of the course, as pytest removes a passing test's tmp_path (pytest.ini)


@pytest.mark.slow
@pytest.mark.parametrize("right", RIGHT_ANSWERS, ids=lambda r: f"{r.task}-{r.name}")
def test_the_tests_pass_this_right_answer(right, request, tmp_path_factory, warm, started_ahead):
    """A right answer written otherwise than the solution, which its docstring accepts on purpose (Issue 45:
    a P divided by N before it is orthogonalised; the steps counted right after the comparison)."""
    run, folder = started_ahead.pop(right, None) or _start_right(warm, right, tmp_path_factory.mktemp("right"))
    for following in _next_params(request, AHEAD, "right"):  # two at once, as the mistakes
        if following not in started_ahead:
            started_ahead[following] = _start_right(warm, following, tmp_path_factory.mktemp("right"))
    returncode, out = warm.result(run)
    assert returncode == 0, f"the Task {right.task} tests fail '{right.name}' ({right.why}):\n{out[-3000:]}"
    shutil.rmtree(folder)


@pytest.mark.slow
@pytest.mark.timeout(360)  # the run below may take its whole 300 s under load: not pytest.ini's 120 s backstop
def test_untouched_templates_fail_every_task_test_with_not_implemented(tmp_path, warm):
    """What a student sees on day one: every task test fails, quickly, saying which task to fill in."""
    repo = copy_course(str(tmp_path / "repo"))  # the committed templates, even if yours are filled in
    report = tmp_path / "report.xml"
    tasks = " or ".join(sorted({m.marker for m in MISTAKES}))
    _, out = warm.run(["--impl", "template", "-m", tasks, "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                       "tests"], cwd=repo,
                      timeout=300)  # every task's tests, 44 tasks: 100 s here under load, so the backstop is wider
    cases = ElementTree.parse(report).getroot().iter("testcase")
    outcomes = {}
    for case in cases:
        failure = case.find("failure")
        skipped = case.find("skipped")
        outcomes[case.get("name")] = ("skipped" if skipped is not None else
                                      "passed" if failure is None else failure.get("message", ""))
    ran = {name: o for name, o in outcomes.items() if o != "skipped"}
    assert len(ran) > 20, out[-2000:]
    wrong = {name: o[:120] for name, o in ran.items() if not o.startswith("NotImplementedError: Task")}
    assert not wrong, f"these task tests did not fail with the task's NotImplementedError: {wrong}"


@pytest.mark.slow
def test_task_4_4_is_judged_alone(tmp_path, warm):
    """The grader gives points per task: wrong answers to Tasks 4.1-4.3 must not fail 4.4's tests too
    (a plain mean in reduce_gradients once cost Task 4.4's points as well)."""
    wrong = [next(m for m in MISTAKES if m.task == task) for task in ("4.1", "4.2", "4.3")]
    repo = make_submission(str(tmp_path / "repo"), wrong)
    returncode, out = warm.run(["--impl", "template", "-m", "task4_4", "-q", "-p", "no:cacheprovider",
                                "tests/test_replicas.py"], cwd=repo, timeout=110)
    assert returncode == 0, (f"wrong answers to Tasks 4.1-4.3 ({', '.join(m.name for m in wrong)}) fail "
                             f"Task 4.4's tests: swap in solutions/ for the other tasks\n{out[-3000:]}")


# (a wrong answer to one task, the marker of a later task whose tests run that task's code):
# before the tests swapped in solutions/' answers to the other tasks, each of these also failed
# the later task, with that task's name on an error that was not its fault.
BUILT_ON_OTHERS = [
    ("1.2", "no-padding", "task1_4"),  # the loaders are built on the sampler (passed before too: kept as a guard)
    ("2.2", "average-on-rank-0-only", "task8_2"),  # ranks drift apart; a resume from rank 0's weights cannot match
    ("8.1", "no-optimizer-state", "task8_2"),  # the resume trained through train_ddp with the student's save
    ("5.1", "order-from-a-set", "task5_3"),  # buckets in another order on each rank: mismatched all-reduces
    ("5.1", "order-from-a-set", "task5_4"),
    ("5.2", "no-division", "task5_3"),  # the buckets carry the sum, not the mean
    ("5.3", "out-of-order", "task5_4"),  # a bucket used on one rank only: the ranks hang
    ("5.3", "register-hook", "task5_5"),  # stale gradients in the buckets
    ("5.4", "waits-on-unlaunched-buckets", "task5_5"),  # Awkward's unused parameter: AttributeError
    ("6.1", "whole-parameters", "task6_2"),  # the local optimizers hold more than their shard
    ("6.1", "floor-not-ceil", "task6_3"),  # pieces for a rank that does not exist: a gloo error
    ("6.2", "copies-not-views", "task6_3"),  # the parameters never change
    ("7.1", "uneven-shards", "task7_3"),  # gloo refuses shards of different sizes
    ("7.2", "new-full-tensor", "task7_4"),  # the module computes with the old, freed memory
    ("7.3", "empty-data", "task7_4"),  # unshard() gathers into 0 bytes: a gloo size error
    ("7.3", "keeps-its-shard", "task7_5"),  # never gathered again: computes with one shard's memory
    ("7.4", "sum-not-mean", "task7_5"),  # training diverges from fully_shard's
    ("12.2", "no-subtraction", "task12_3"),  # PowerSGD's Ps and Qs not orthonormal: not PyTorch's result
]


@pytest.mark.slow
@pytest.mark.parametrize("task,name,marker", BUILT_ON_OTHERS, ids=lambda value: str(value))
def test_tasks_built_on_others_are_judged_alone(task, name, marker, tmp_path, warm):
    """The grader gives points per task: a wrong answer to one task must cost that task's points
    only, not also those of every later task that runs its code (conftest.load_with_reference)."""
    mistake = next(m for m in MISTAKES if (m.task, m.name) == (task, name))
    repo = make_submission(str(tmp_path / "repo"), [mistake])
    returncode, out = warm.run(["--impl", "template", "-m", marker, "-q", "-p", "no:cacheprovider",
                                *files_with(marker)], cwd=repo, timeout=110)
    assert returncode == 0, (f"a wrong answer to Task {task} ({name}) fails the tests of {marker} too: judge "
                             f"that task with solutions/' answers to the others (judging(impl, task))\n{out[-3000:]}")


_RANKS_THAT_OUTLIVE_THEIR_RUN = '''
import time
from harness import run_ranks


def _sleep(rank, world_size):
    time.sleep(600)


def test_sleeps():
    run_ranks(_sleep, 2, timeout=600)
'''


@pytest.mark.slow
def test_the_warm_server_leaves_no_rank_behind(tmp_path):
    """A run killed mid-test (its client gone: a `timeout` around pytest -m slow) leaves its ranks, which the
    forkserver made in the server's process group, not the run's: the server takes that group down as it ends.
    They once stayed for ever, a rank's results pipe full with no reader."""
    repo = copy_course(str(tmp_path / "repo"))
    (tmp_path / "repo" / "tests" / "test_sleeps.py").write_text(_RANKS_THAT_OUTLIVE_THEIR_RUN)
    warm = WarmPytest()
    try:
        warm.start(["-q", "-p", "no:cacheprovider", "tests/test_sleeps.py"], cwd=repo, timeout=300)
        group, deadline = os.getpgid(warm._proc.pid), time.monotonic() + 60
        while len(_processes_in(group)) < 4 and time.monotonic() < deadline:  # server, forkserver, 2 ranks
            time.sleep(0.2)
        assert len(_processes_in(group)) >= 4, f"the ranks did not start: {_processes_in(group)}"
    finally:
        warm.close()
    deadline = time.monotonic() + 10
    while _processes_in(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _processes_in(group)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the warm server's group outlived it: {left}"


@pytest.mark.slow
def test_a_warm_run_leaves_no_temporary_folder_behind(tmp_path):
    """Each run writes its tmp_path under its own --basetemp, removed once its result is read. pytest's default
    folder in /tmp/pytest-of-USER stayed locked by a child that ends with os._exit, so none was ever cleaned."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_where.py").write_text(
        f"def test_where(tmp_path):\n    (tmp_path / 'x').write_text('x')\n"
        f"    open({str(tmp_path / 'where.txt')!r}, 'w').write(str(tmp_path))\n")
    with WarmPytest() as warm:
        returncode, out = warm.run(["-q", "-p", "no:cacheprovider", "tests/test_where.py"], cwd=tmp_path, timeout=60)
        assert returncode == 0, out
        used = (tmp_path / "where.txt").read_text()
        assert used.startswith(warm._folder.name + os.sep), f"the run's tmp_path was {used}"
        assert not os.path.exists(used), f"{used} is left after the run's result was read"


def _processes_in(group):
    """The pids of the live processes in process group `group` (zombies left out)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(pid))
    return found
