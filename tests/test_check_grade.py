"""check.py (students) and grading/grade.py (instructors), on prepared submissions.

    pytest -m grading       # all of them; the three that run the commands are also `slow`

The submissions are this repository with the solutions as template files, with or without
the typical mistakes of tests/mistakes.py: the solutions get full marks, the untouched
templates zero ("not started"), a mistake its task's explanation, a hang a "hang" within
the time limit while the other submissions are still graded. The fast tests feed made-up
test outcomes to the summary; the others run the real commands, several submissions per
call, on a few tasks, to stay near a minute.
"""
import csv
import json
import os
import subprocess
import sys
import time

import pytest

from grading.checker import Run, discover_tasks, explain, select_tasks, summarize
from grading.course import copy_course, untouched
from mistakes import MISTAKES, REPO, Mistake, make_submission

# about the course's tools, not a student's tasks: skipped with --impl template (conftest.py)
pytestmark = [pytest.mark.grading, pytest.mark.repo]

BY_NAME = {m.name: m for m in MISTAKES}
# The worst case for a grader: the test process itself never returns (a wait, so that it
# leaves the CPU to the submission graded beside it).
ENDLESS_WAIT = Mistake("1.1", "endless-wait", "template_data_loader.py", "    g = torch.Generator()",
                       "    import time; time.sleep(3600)\n    g = torch.Generator()", "")


def _tasks(*ids):
    return select_tasks(discover_tasks(REPO), list(ids))


def _run(*events, timed_out=False, returncode=1):
    return Run(list(events), 1.0, returncode, timed_out, 30.0, "pytest.log")


def _test(nodeid, task, outcome="passed", exc_type=None, message=None, when="call"):
    events = [{"event": "start", "nodeid": nodeid}]
    report = {"event": "report", "nodeid": nodeid, "when": when, "outcome": outcome}
    if exc_type:
        report.update(exc_type=exc_type, message=message, where="template_trainer.py:120 in reduce_metrics")
    return [{"event": "collected", "nodeid": nodeid, "tasks": [task]}] + events + [report]


# --------------------------------------------------------------------------- fast: no pytest run

def test_tasks_are_found_in_the_markers_and_the_fences_in_course_order(tmp_path):
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    task10_1: Task 10.1, later\n    task2_1: Task 2.1, template_b.py, b\n"
        "    task0_1: Task 0.1, template_a.py, a\n    gpu: needs CUDA\n")
    (tmp_path / "template_a.py").write_text(
        "def first():\n    x = 1\n    # --- Task 0.1 begin ---\n    raise NotImplementedError\n"
        "    # --- Task 0.1 end ---\n\n\nclass A:\n    def method(self):\n"
        "        # --- Task 3.2 begin ---\n        pass\n        # --- Task 3.2 end ---\n")
    (tmp_path / "template_b.py").write_text(  # a template that keeps only the TODO line
        "def b():\n    # TODO Task 2.1: do b\n    raise NotImplementedError('Task 2.1')\n")
    tasks = discover_tasks(str(tmp_path))
    assert [t.id for t in tasks] == ["0.1", "2.1", "3.2", "10.1"]
    assert (tasks[0].file, tasks[0].function, tasks[0].line) == ("template_a.py", "first", 3)
    assert tasks[2].where() == "template_a.py, A.method()"
    assert tasks[1].where() == "template_b.py, b()"
    assert tasks[3].where() == "later"  # in no template: the marker's description
    assert [t.id for t in select_tasks(tasks, ["task2_1", "0.1"])] == ["0.1", "2.1"]
    assert [t.id for t in select_tasks(tasks, ["3"])] == ["3.2"]
    with pytest.raises(ValueError, match="the tasks are 0.1, 2.1, 3.2, 10.1"):
        select_tasks(tasks, ["4.1"])


def test_a_task_fenced_in_several_functions_names_them_all(tmp_path):
    """The trial of Task 9: check.py named a task by its first function only, so a failure in
    average_gradients_over_dp read 'fix Task 9.4 (..., sampler_rank_and_size())'."""
    (tmp_path / "template_a.py").write_text(
        "def first():\n    # --- Task 1.1 begin ---\n    pass\n    # --- Task 1.1 end ---\n\n\n"
        "class F:\n    @staticmethod\n    def forward(ctx):\n        # --- Task 1.1 begin ---\n        pass\n"
        "        # --- Task 1.1 end ---\n\n    @staticmethod\n    def backward(ctx):\n"
        "        # --- Task 1.1 begin ---\n        pass\n        # --- Task 1.1 end ---\n\n\n"
        "def second():\n    # --- Task 1.1 begin ---\n    pass\n    # --- Task 1.1 end ---\n\n\n"
        "def third():\n    # --- Task 1.2 begin ---\n    pass\n    # --- Task 1.2 end ---\n"
        "    # --- Task 1.2 begin ---\n    pass\n    # --- Task 1.2 end ---\n")
    one, two = discover_tasks(str(tmp_path))
    assert one.where() == "template_a.py, first(), F.forward/backward() and second()", one.where()
    assert (one.function, one.line) == ("first", 2)
    assert two.where() == "template_a.py, third()", two.where()


def test_every_marker_of_this_repository_is_a_task():
    with open(os.path.join(REPO, "pytest.ini")) as f:
        markers = {line.split(":")[0].strip() for line in f if line.strip().startswith("task")}
    assert {t.marker for t in discover_tasks(REPO)} == markers
    assert all(t.file for t in discover_tasks(REPO)), "every task should have a fenced region in a template"


def test_the_summary_names_each_state():
    tasks = _tasks("2.1", "2.2", "2.3", "1.4", "1.1")
    not_impl = "Task {}: reduce_metrics() in template_trainer.py is not done yet"
    run = _run(
        *_test("t::a", "1.1"),
        *_test("t::b", "1.4", "failed", "NotImplementedError", not_impl.format("1.1")),
        *_test("t::c", "2.1", "failed", "NotImplementedError", not_impl.format("2.1")),
        *_test("t::d", "2.1"),  # a test of code that is given passes even when the task is not started
        *_test("t::e", "2.2", "failed", "RankFailed",
               "rank 1 raised AssertionError: Task 2.2: gradients are 2x the mean\nassert False\n\n"
               "--- rank 1 traceback ---\nTraceback ..."),
        *_test("t::f", "2.3", "failed", "RankTimeout",
               "ranks [0] were still running after 15 s (ranks [1, 2] had finished). This is a hang: ...\n"
               "  rank 0 was at:\n      File \"template_trainer.py\", line 126 in reduce_metrics"),
    )
    results = {r.task.id: r for r in summarize(tasks, run)}
    assert results["1.1"].status == "done"
    assert results["1.4"].status == "blocked" and "Task 1.1" in results["1.4"].explanation
    assert results["2.1"].status == "not started"
    assert results["2.2"].status == "failing"
    assert results["2.2"].explanation == "rank 1: Task 2.2: gradients are 2x the mean"
    assert results["2.3"].status == "hang" and "This is a hang" in results["2.3"].explanation
    assert any("reduce_metrics" in line for line in results["2.3"].details)


def test_a_later_tasks_todo_said_in_a_tests_own_words_is_blocked_not_failing():
    """A student trial: 14.1's test catches the rank's RuntimeError to say it with the layers the rank holds, and a
    NotImplementedError is a RuntimeError, so the unfilled 14.3 it ran into read 'failing ... Next: fix Task 14.1'."""
    tasks = _tasks("14.1", "14.3")
    todo = "NotImplementedError: Task 14.3: _GatherSequence.forward in template_sequence_parallel.py is not done yet"
    run = _run(
        *_test("t::a", "14.1", "failed", "RankFailed", "rank 0 raised AssertionError: Task 14.1 (template_sequence_"
               "parallel.py, parallelize_attention): Attention over 2 ranks with sequence parallelism, rank 0: "
               f"{todo} (docs/task14-sequence-parallel.md)\n\n--- rank 0 traceback ---\nTraceback ..."),
        *_test("t::b", "14.3", "failed", "NotImplementedError", todo.removeprefix("NotImplementedError: ")),
    )
    results = {r.task.id: r for r in summarize(tasks, run)}
    assert results["14.1"].status == "blocked" and "need Task 14.3 first" in results["14.1"].explanation, results["14.1"]
    assert results["14.3"].status == "not started"
    mine = _run(*_test("t::a", "14.1", "failed", "RankFailed", "rank 0 raised AssertionError: Task 14.1 (...): "
                       "rank 0: " + todo.replace("14.3", "14.1")))
    assert summarize(_tasks("14.1"), mine)[0].status == "not started"
    wrong = _run(*_test("t::a", "14.1", "failed", "RankFailed", "rank 0 raised AssertionError: Task 14.1 (...): "
                        "qkv's weight holds rows 0...23 of the [q | k | v] weight"))
    assert summarize(_tasks("14.1"), wrong)[0].status == "failing"


def test_a_run_killed_at_the_limit_names_the_test_that_was_running():
    tasks = _tasks("1.1", "1.2", "2.1")
    run = _run(*_test("t::a", "1.1"), {"event": "collected", "nodeid": "t::b", "tasks": ["1.2"]},
               {"event": "start", "nodeid": "t::b"}, {"event": "collected", "nodeid": "t::c", "tasks": ["2.1"]},
               timed_out=True, returncode=-9)
    run.stack = 'Thread 0x1 (most recent call first):\n  File "/tmp/x/repo/template_data_loader.py", line 48 in pad_or_drop\n'
    one, two, three = summarize(tasks, run)
    assert one.status == "done"
    assert two.status == "hang" and "t::b was still running" in two.explanation
    assert two.details == ["the test process was at template_data_loader.py:48 in pad_or_drop"]
    assert three.status == "not run"


def test_a_crash_is_an_error_and_the_tasks_after_it_were_not_run():
    tasks = _tasks("1.1", "2.3")
    run = _run({"event": "collected", "nodeid": "t::a", "tasks": ["1.1"]}, {"event": "start", "nodeid": "t::a"},
               {"event": "collected", "nodeid": "t::b", "tasks": ["2.3"]}, returncode=3)
    crashed, after = summarize(tasks, run)
    assert crashed.status == "error" and "died during t::a" in crashed.explanation
    assert after.status == "not run" and "exit code 3" in after.explanation
    assert not crashed.certain and not after.certain  # the grader runs both again, apart


def test_only_an_error_a_busy_machine_can_cause_is_run_again():
    """A RuntimeError of the code (a shape, autograd) comes again on a second run: check.py and the grader
    report it at once, as a rank that aborted, crashed or exited. One that says a peer left or a time-out came, a
    lost connection, or a rank killed from outside, may be the machine's, and is run again."""
    trace = "\n\n--- rank 1 traceback ---\nTraceback ..."
    messages = {
        "1.1": "rank 1 raised RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 4x3)" + trace,
        "2.1": "rank 1 raised RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer" + trace,
        "2.2": "rank 0 raised DistBackendError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out" + trace,
        "2.3": "rank 0 raised ValueError: too many values to unpack (expected 2)" + trace,
        "1.2": "rank 0 was killed by SIGKILL (exit code -9) without reporting: killed from outside (out of memory?)",
        "1.3": "Task 1.3 (t.py, f()): rank 1 was killed by SIGABRT (exit code -6) without reporting: an abort in C "
               "code (gloo aborts on a message whose size differs from its buffer's)",
        "1.4": "rank 1 ended with exit code 0 without reporting: os._exit() or sys.exit() in the code under test, or "
               "a crash in C code",
    }
    run = _run(*[event for task, message in messages.items()
                 for event in _test(f"t::{task}", task, "failed", "RankFailed", message)])
    results = {r.task.id: r for r in summarize(_tasks(*messages), run)}
    assert {task: r.status for task, r in results.items()} == dict.fromkeys(messages, "failing")
    assert {task: r.certain for task, r in results.items()} == {
        "1.1": True, "2.1": False, "2.2": False, "2.3": True, "1.2": False, "1.3": True, "1.4": True}


def test_points_all_or_nothing_or_in_proportion():
    from grading.checker import TaskResult
    from grading.grade import points_for
    task = _tasks("2.2")[0]
    policy = {"default": 10.0, "points": {"2.2": 20.0}, "partial": False}
    failing = TaskResult(task, "failing", passed=3, total=4)
    assert points_for(TaskResult(task, "done", passed=4, total=4), policy) == (20.0, 20.0)
    assert points_for(failing, policy) == (0.0, 20.0)
    assert points_for(failing, {**policy, "partial": True}) == (15.0, 20.0)
    assert points_for(TaskResult(task, "not started", passed=1, total=4), {**policy, "partial": True}) == (0.0, 20.0)
    assert points_for(TaskResult(task, "no tests"), policy) == (0.0, 0.0)


@pytest.mark.parametrize("exc_type,message,expected", [
    ("RuntimeError", "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
     "[127.0.0.1]:1. This is typically caused by a remote worker crashing. GLHF!", "in training is a hang"),
    ("ValueError", "Cannot use ReduceOp.AVG with Gloo", "divide by the world size"),
    ("ModuleNotFoundError", "No module named 'helpers'", "Only the template_*.py files are used"),
    ("RuntimeError", "Boolean value of Tensor with more than one value is ambiguous", "compare identity"),
    ("Failed", "Timeout (>60.0s) from pytest-timeout.", "longer than 60 s"),
    ("AssertionError", "Task 3.2 (f.py, ring): every rank sends first.\nranks [0, 1] were still running after 10 s "
     "(ranks [] had finished). This is a hang: ...\n  rank 0 was at:\n      File \"template_f.py\", line 3 in ring",
     "every rank sends first. (ranks [0, 1] were still running after 10 s"),
])
def test_errors_that_no_test_explains_get_a_hint(exc_type, message, expected):
    text, _ = explain(exc_type, message, "template_trainer.py:1 in f")
    assert expected in text and "pair.cc" not in text and "GLHF" not in text


def test_a_tests_message_that_names_avg_is_not_told_gloo_lacks_it():
    # torch 2.14's gloo takes ReduceOp.AVG: only gloo's own refusal may bring the hint
    said = "Task 11.2 (template_batchnorm.py, backward): the sums were averaged (ReduceOp.AVG), not summed"
    text, _ = explain("AssertionError", said, "template_batchnorm.py:1 in backward")
    assert "has no ReduceOp.AVG" not in text, text


# --------------------------------------------------------------------------- slow: real runs

# The grading itself is judged here; the sandbox around it (bubblewrap, which .ci/run installs) in
# tests/test_grading_formats.py, which skips with the reason where it cannot start.
SANDBOX_WHERE_IT_STARTS = ["--sandbox", "auto"]


def _python(*args, cwd=REPO, timeout=240):
    start = time.monotonic()
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - start


def _grades(out):
    with open(os.path.join(out, "grades.json")) as f:
        report = json.load(f)
    return {s["student"]: {**s, "by_task": {t["task"]: t for t in s["tasks"]}} for s in report["submissions"]}


def _untouched_templates(dest):
    """The course as committed: its template_*.py files untouched, even in a clone whose own
    templates are filled in (grading/course.py copies the committed ones)."""
    return copy_course(dest)


@pytest.mark.slow
def test_grade_gives_full_partial_and_zero_marks(tmp_path):
    solutions = make_submission(str(tmp_path / "solutions"))
    # noise: printing, extra imports, a conftest.py and a helper of its own
    with open(os.path.join(solutions, "template_trainer.py"), "a") as f:
        f.write('\nimport collections, json\nprint("debugging output from a student")\n')
    (tmp_path / "solutions" / "conftest.py").write_text("raise SystemExit('a student conftest must not run')\n")
    templates = _untouched_templates(str(tmp_path / "templates"))
    # a student who makes the tests pass by editing them is graded with the course's tests
    (tmp_path / "templates" / "tests" / "test_trainer.py").write_text(
        "import pytest\n\n@pytest.mark.task2_3\ndef test_ok():\n    pass\n")
    counts = make_submission(str(tmp_path / "counts"), [BY_NAME["averaged-counts"]])
    skips = make_submission(str(tmp_path / "skips"), [BY_NAME["rank-0-skips"]])
    out = str(tmp_path / "out")

    # the hang first: it takes longest, and the others are graded beside it meanwhile
    done, seconds = _python("grading/grade.py", skips, solutions, templates, counts, "--tasks", "1.1", "2.3",
                            "--out", out, "--jobs", "2", "--retries", "0", *SANDBOX_WHERE_IT_STARTS)
    assert done.returncode == 0, done.stdout + done.stderr
    grades = _grades(out)
    assert (grades["solutions"]["points"], grades["solutions"]["max_points"]) == (20, 20)
    assert grades["templates"]["points"] == 0
    assert {t["status"] for t in grades["templates"]["tasks"]} == {"not started"}
    assert any("tests/test_trainer.py differs" in note for note in grades["templates"]["notes"])
    mistake = BY_NAME["averaged-counts"]
    assert grades["counts"]["points"] == 10, grades["counts"]
    wrong = grades["counts"]["by_task"][mistake.task]
    assert wrong["status"] == "failing" and wrong["points"] == 0
    assert mistake.hint in wrong["explanation"], wrong  # the failing test's own message
    # a collective that rank 0 skips: the others wait for it until the test's limit (or until rank 0 leaves)
    skipped = grades["skips"]["by_task"]["2.3"]
    assert skipped["points"] == 0 and "hang" in skipped["explanation"], skipped
    assert grades["skips"]["points"] == 10
    with open(os.path.join(out, "grades.csv")) as f:
        rows = list(csv.DictReader(f))
    assert {(r["student"], r["task"], float(r["points"])) for r in rows} >= {
        ("solutions", "total", 20.0), ("templates", "2.3", 0.0), ("counts", "1.1", 10.0), ("counts", "2.3", 0.0)}
    assert "solutions" in done.stdout and "not started" in done.stdout  # the table
    print(f"graded 4 submissions in {seconds:.0f} s")


@pytest.mark.slow
def test_grade_stops_a_submission_at_its_limit_and_grades_the_others(tmp_path):
    wait = make_submission(str(tmp_path / "wait"), [ENDLESS_WAIT])
    epoch = make_submission(str(tmp_path / "epoch"), [BY_NAME["epoch-not-in-seed"]])
    out = str(tmp_path / "out")
    limit = 25
    # The per-test limit is longer than the submission's, so that the endless wait runs into
    # the latter: the worst case, a submission killed from outside.
    done, seconds = _python("grading/grade.py", wait, epoch, "--tasks", "1.1", "2.3", "--out", out,
                            "--timeout", str(limit), "--test-timeout", "100", "--retries", "0", "--jobs", "2",
                            *SANDBOX_WHERE_IT_STARTS)
    assert done.returncode == 0, done.stdout + done.stderr
    grades = _grades(out)
    assert grades["wait"]["timed_out"] and grades["wait"]["seconds"] < limit + 10
    hang = grades["wait"]["by_task"]["1.1"]
    assert hang["status"] == "hang" and "still running" in hang["explanation"]
    assert any("ordered_indices" in line for line in hang["details"]), hang
    assert grades["wait"]["by_task"]["2.3"]["status"] == "not run"
    mistake = BY_NAME["epoch-not-in-seed"]
    wrong = grades["epoch"]["by_task"][mistake.task]
    assert wrong["status"] == "failing" and mistake.hint in wrong["explanation"], wrong
    assert grades["epoch"]["points"] == 10 and not grades["epoch"]["timed_out"]
    print(f"graded 2 submissions in {seconds:.0f} s")


@pytest.mark.slow
def test_check_explains_the_first_failing_task_and_the_next_step(tmp_path):
    student = make_submission(str(tmp_path / "student"), [BY_NAME["epoch-not-in-seed"]])
    with open(os.path.join(student, "template_trainer.py"), "w") as dst:
        dst.write(untouched("template_trainer.py"))  # Task 2 not started
    done, seconds = _python("check.py", "1.1", "1.2", "2.3", cwd=student, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    line = {task: next(l for l in lines if l.strip().startswith(f"Task {task}")) for task in ("1.1", "1.2", "2.3")}
    assert line["1.1"].endswith("failing") and line["1.2"].endswith("done") and line["2.3"].endswith("not started")
    failing = lines.index(line["1.1"])
    assert "epoch" in " ".join(lines[failing + 1:failing + 3])  # the test's explanation, under the task
    assert "1 of 3 tasks done" in done.stdout
    assert "Next: fix Task 1.1" in done.stdout and "python check.py 1.1" in done.stdout
    print(f"checked 3 tasks in {seconds:.0f} s")


def test_check_runs_a_hang_again_before_blaming_the_task(monkeypatch, tmp_path, capsys):
    """A right Task 2.1 once hung at start-up under load (both ranks creating the process group):
    check.py runs an uncertain task once more, as the grader does, and says what happened."""
    import check

    hang = ("ranks [0, 1] were still running after 20 s (ranks [] had finished). This is a hang: ...\n"
            "  rank 0 was at:\n      File \"distributed_c10d.py\", line 1 in init_process_group")
    runs = [_run(*_test("t::a", "2.1", "failed", "RankTimeout", hang), *_test("t::b", "1.1")),
            _run(*_test("t::a", "2.1"), returncode=0)]
    asked = []

    def fake_run_tests(repo, task_ids, workdir, impl, timeout, fast_first=False):
        asked.append(task_ids)
        return runs[len(asked) - 1]

    monkeypatch.setattr(check, "run_tests", fake_run_tests)
    assert check.main(["1.1", "2.1"]) == 0
    out = capsys.readouterr().out
    assert asked == [["1.1", "2.1"], ["2.1"]], asked  # only the uncertain task runs again
    assert "Task 2.1: hang on the first run; running it again" in out, out
    assert "2 of 2 tasks done" in out and "passed when run again; the first run: hang" in out, out

    # a start-up stall both times: not the student's to fix, and said so
    stall = "the ranks did not start, twice, within 15 s each time: every rank (0-1) was still waiting ..."
    runs[:] = [_run(*_test("t::a", "2.1", "failed", "RankStartupTimeout", stall))] * 2
    asked.clear()
    assert check.main(["2.1"]) == 1
    out = capsys.readouterr().out
    assert len(asked) == 2 and "nothing to fix in Task 2.1" in out and "could not even start" in out, out


@pytest.mark.slow  # every task's files, read 69 times: 2 s
def test_a_check_collects_the_files_that_mark_its_task_and_only_those():
    """check.py collects the files that mark a task (pytest.mark with its marker), not test_mistakes.py, whose lists only
    name the marker in a string: collecting it cost Task 8.2's check the import of the catalogue."""
    from grading.checker import task_test_files
    assert task_test_files(REPO, ["task8_2"]) == ["tests/test_checkpoint.py"]
    assert task_test_files(REPO, ["task0_1"]) == ["tests/test_collectives.py"]
    for task in discover_tasks(REPO):
        files = task_test_files(REPO, [task.marker])
        assert files != ["tests"] and "tests/test_mistakes.py" not in files, (task.id, files)


def test_a_deadlock_costs_one_time_limit_and_a_slow_hang_is_run_again(monkeypatch, capsys):
    """A Task 13.2 answer that averaged on rank 0 only hung in both of check.py's runs (2 x 45 s, 183 s under
    load): rank 1 had finished, rank 0 waited in all_reduce for it, which no machine can cause, so it is
    reported after the first run; so is one where none of the stuck ranks used the CPU for seconds, wherever
    they wait. A hang at the time limit where no rank finished, or a stuck rank not in torch.distributed
    (computing, perhaps slowly), is still run again."""
    import check
    from grading.checker import is_deadlock

    deadlock = ("Task 13.2 (template_local_sgd.py, LocalSGD.step()): ranks [0] were still running after 40 s "
                "(ranks [1] had finished). This is a hang: ...\n  rank 0 was at:\n      File "
                "\"/x/site-packages/torch/distributed/distributed_c10d.py\", line 3913 in all_reduce\n      File "
                "\"/x/template_local_sgd.py\", line 51 in all_reduce_mean")
    assert is_deadlock(deadlock)
    assert not is_deadlock(deadlock.replace("(ranks [1] had finished)", "(ranks [] had finished)"))
    assert not is_deadlock(deadlock.replace("/torch/distributed/distributed_c10d.py", "/template_local_sgd.py"))
    assert not is_deadlock(deadlock.replace("ranks [0] were", "ranks [0, 2] were"))  # rank 2: no stack said
    assert not is_deadlock("rank 1 raised ValueError: ...")
    # no rank finished, but the harness saw every stuck rank wait without the CPU (harness.Stillness): certain too
    still = deadlock.replace("(ranks [1] had finished).", "(ranks [] had finished), all of them waiting, without "
                             "using the CPU, for the last 3 s: nothing left running could wake them.")
    assert is_deadlock(still)
    # wherever they wait (Task 15's tests wait on a Work through a recorder of their own): none can wake another
    assert is_deadlock(still.replace("/torch/distributed/distributed_c10d.py", "/template_local_sgd.py"))

    runs = [_run(*_test("t::a", "2.1", "failed", "RankTimeout", deadlock))]
    asked = []

    def fake_run_tests(repo, task_ids, workdir, impl, timeout, fast_first=False):
        asked.append(task_ids)
        return runs[len(asked) - 1]

    monkeypatch.setattr(check, "run_tests", fake_run_tests)
    assert check.main(["2.1"]) == 1
    out = capsys.readouterr().out
    assert asked == [["2.1"]] and "running it again" not in out, out
    assert "hang" in out and "rank 0 waits in all_reduce()" in out, out
    assert "Next: fix the hang in Task 2.1 (" in out and "the lines above say where each rank waited" in out, out


def test_fast_first_runs_a_tasks_slow_tests_last_and_not_after_it_failed(tmp_path):
    """check.py's --fast-first (grading/pytest_plugin.py): a wrong answer is told in the time of its task's fast
    tests. Task 1.1's slow test, written first, runs after its fast ones and is skipped once one failed; Task 1.2's
    runs (nothing of 1.2 failed). Without the option (the grader) every test runs, in file order, as every other
    test of this file shows."""
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:hypothesispytest\nmarkers =\n    slow: s\n    task1_1: a\n    task1_2: b\n")
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.slow\n@pytest.mark.task1_1\ndef test_a_slow():\n    pass\n"
        "@pytest.mark.task1_1\ndef test_b_fails():\n    assert False\n"
        "@pytest.mark.task1_1\ndef test_c_passes():\n    pass\n"
        "@pytest.mark.slow\n@pytest.mark.task1_2\ndef test_d_slow_of_another_task():\n    pass\n")

    def run(*options):
        results = tmp_path / "results.jsonl"
        if results.exists():
            results.unlink()
        subprocess.run([sys.executable, "-m", "pytest", "-p", "grading.pytest_plugin", f"--results-file={results}",
                        "-p", "no:cacheprovider", "-q", *options], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=REPO), timeout=60)
        events = [json.loads(line) for line in results.read_text().splitlines()]
        return [(e["nodeid"].split("::")[1], e["outcome"]) for e in events if e.get("when") == "call"
                or (e.get("when") == "setup" and e.get("outcome") == "skipped")]

    assert run("--fast-first") == [("test_b_fails", "failed"), ("test_c_passes", "passed"),
                                   ("test_a_slow", "skipped"), ("test_d_slow_of_another_task", "passed")]


def test_a_checks_tests_write_their_tmp_path_into_its_own_folder(tmp_path):
    """run_tests gives pytest --basetemp in its workdir: a check leaves nothing in /tmp/pytest-of-USER, and its exit
    does not wait for pytest to delete the oldest folder kept there (0.9-2.3 s of 3 checks of Task 0.3 in 15, measured
    with course copies of the slow tests there)."""
    from grading.checker import run_tests
    repo, workdir = tmp_path / "repo", tmp_path / "work"
    (repo / "tests").mkdir(parents=True)
    (repo / "grading").symlink_to(os.path.join(REPO, "grading"))  # its pytest plugin
    workdir.mkdir()
    (repo / "pytest.ini").write_text("[pytest]\naddopts = -p no:hypothesispytest\nmarkers =\n    task1_1: a\n")
    (repo / "tests" / "conftest.py").write_text("def pytest_addoption(parser):\n    parser.addoption('--impl')\n")
    (repo / "tests" / "test_x.py").write_text(
        "import pytest\n@pytest.mark.task1_1\ndef test_where(tmp_path):\n"
        f"    open({str(workdir / 'where.txt')!r}, 'w').write(str(tmp_path))\n")
    run = run_tests(str(repo), ["1.1"], str(workdir), timeout=60)
    assert run.returncode == 0, open(run.log_path).read()
    assert (workdir / "where.txt").read_text().startswith(str(workdir / "tmp") + os.sep)
