"""Measure which other tasks of its file each task's tests run, and compare with grading.checker.TASKS_USED.

    python tools/tasks_used.py          # 20-30 minutes on 2 cores; exit status 1 if the table is out of date
    python tools/tasks_used.py --dynamo # 10-15 minutes: which tasks' tests import torch._dynamo, or sympy in a rank

In a student release a task's tests run the student's own answers to the other tasks of its file that they
use: most earlier ones (not all: 2.3's tests run neither 2.1 nor 2.2), and a few later ones (Task 14.1's
attention runs with 14.3's gather and 14.4's layers). When a task fails, check.py checks those too, blames the
failing ones and sends the student to them first, so the table must be exact: a task missing from it goes
unchecked, and one too many is blamed without cause. Run this after changing which tasks a test calls.

How: a release (tools/student_release.py) filled with solutions/' answers but for one task U, whose fences hold
the template's TODO again; the other tasks of its file are checked, and those that come out "blocked" by U
(their tests met U's NotImplementedError) use U. Once for every task. The GPU tests, skipped here, are not counted.

--dynamo: each task's tests alone (pytest -m taskX_Y, as check.py runs them) with a server that has imported
neither torch._dynamo nor harness.SYMBOLIC_SHAPES (sympy), and COURSE_DYNAMO_LOG naming a file where pytest's process
and every rank say which of them they imported; compared with tests/harness.py's TASKS_NEEDING_DYNAMO (imported in
pytest's process or a rank) and TASKS_NEEDING_SYMBOLIC_SHAPES (of the others, imported in a rank), whose tasks'
checks start the server with them.
"""
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [REPO, HERE, os.path.join(REPO, "tests")]

import student_release  # noqa: E402
from grading.checker import TASKS_USED, discover_tasks, run_tests, summarize  # noqa: E402

FENCE = re.compile(r"^[ \t]*# --- Task (\d+\.\d+) begin ---[ \t]*\n.*?^[ \t]*# --- Task \1 end ---[^\n]*\n", re.M | re.S)


def with_template_fences(solution, template, task):
    """The solution's text with every fence of `task` (a task may be fenced in several places) the template's."""
    todo = [m[0] for m in FENCE.finditer(template) if m[1] == task]
    text = FENCE.sub(lambda m: todo.pop(0) if m[1] == task else m[0], solution)
    assert not todo, f"{task}: the template and the solution have different numbers of fences"
    return text


def measure(release, workdir):
    """{task id: [the other tasks of its file that its tests run, in course order]}, for the tasks that run any."""
    used = {}
    course = discover_tasks(release)
    for name in sorted({t.file for t in course if t.file}):
        with open(os.path.join(REPO, "solutions", name)) as f:
            solution = f.read()
        with open(os.path.join(REPO, name)) as f:
            template = f.read()
        tasks = [t for t in course if t.file == name]
        for undone in tasks:
            others = [t for t in tasks if t is not undone]
            if not others:
                continue
            with open(os.path.join(release, name), "w") as f:
                f.write(with_template_fences(solution, template, undone.id))
            folder = tempfile.mkdtemp(dir=workdir)
            run = run_tests(release, [t.id for t in others], folder, fast_first=True)
            for result in summarize(others, run, blame=False):
                if result.status == "blocked" and f"Task {undone.id}" in result.explanation:
                    used.setdefault(result.task.id, []).append(undone.id)
                elif result.status != "done":
                    print(f"  {result.task.id} with {undone.id} left undone: {result.status}, {result.explanation[:200]}")
            print(f"{name}, {undone.id} undone: blocked {sorted(t for t, ids in used.items() if undone.id in ids)}",
                  flush=True)
        with open(os.path.join(release, name), "w") as f:
            f.write(solution)
    return {task: sorted(ids, key=lambda t: tuple(map(int, t.split(".")))) for task, ids in used.items()}


def measure_dynamo(workdir):
    """(the tasks whose tests, run alone, import torch._dynamo in pytest's process or in a rank, the other tasks
    whose tests import harness.SYMBOLIC_SHAPES in a rank)."""
    from harness import SYMBOLIC_SHAPES
    dynamo, symbolic_shapes = set(), set()
    for task in discover_tasks(REPO):
        folder = tempfile.mkdtemp(dir=workdir)
        log = os.path.join(folder, "dynamo.log")
        os.environ["COURSE_DYNAMO_LOG"] = log
        try:
            run_tests(REPO, [task.id], folder, impl="solutions")
        finally:
            del os.environ["COURSE_DYNAMO_LOG"]
        lines = open(log).read().splitlines() if os.path.exists(log) else []
        if any(line.endswith(" torch._dynamo") for line in lines):
            dynamo.add(task.id)
        elif any(line.startswith("rank ") and line.endswith(" " + SYMBOLIC_SHAPES) for line in lines):
            symbolic_shapes.add(task.id)
        what = "torch._dynamo" if task.id in dynamo else "sympy in a rank" if task.id in symbolic_shapes else "neither"
        print(f"{task.id}: {what}", flush=True)
    return dynamo, symbolic_shapes


def main_dynamo():
    import harness
    workdir = tempfile.mkdtemp(prefix="tasks-dynamo-")
    try:
        measured = measure_dynamo(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    key = lambda t: tuple(map(int, t.split(".")))  # noqa: E731
    stale = 0
    for name, found in zip(("TASKS_NEEDING_DYNAMO", "TASKS_NEEDING_SYMBOLIC_SHAPES"), measured):
        table = getattr(harness, name)
        if found == table:
            print(f"tests/harness.py's {name} is exact.")
        else:
            print(f"tests/harness.py's {name} is out of date: measured {sorted(found, key=key)}, it says "
                  f"{sorted(table, key=key)}")
            stale = 1
    return stale


def main():
    if sys.argv[1:] == ["--dynamo"]:
        return main_dynamo()
    workdir = tempfile.mkdtemp(prefix="tasks-used-")
    try:
        release = os.path.join(workdir, "release")
        if student_release.main([release]) != 0:
            return 2
        for name in os.listdir(os.path.join(REPO, "solutions")):
            if name.startswith("template_") and name.endswith(".py"):
                shutil.copy(os.path.join(REPO, "solutions", name), os.path.join(release, name))
        measured = {task: tuple(later) for task, later in measure(release, workdir).items()}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if measured == TASKS_USED:
        print("grading.checker.TASKS_USED is exact.")
        return 0
    print(f"grading.checker.TASKS_USED is out of date: measured\n{measured}\n(it says {TASKS_USED}); update it, and "
          "the list of later tasks used in docs/checking.md")
    return 1


if __name__ == "__main__":
    sys.exit(main())
