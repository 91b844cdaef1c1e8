"""Measure which later tasks of its file each task's tests run, and compare with grading.checker.LATER_TASKS_USED.

    python tools/later_tasks_used.py          # 10-20 minutes on 2 cores; exit status 1 if the table is out of date

In a student release a task's tests run the student's own answers to the other tasks of its file. Every
earlier task may be among them; a later one only where a test reaches it (Task 14.1's attention runs
with 14.3's gather and 14.4's layers). check.py checks those too when a task fails, and sends the student
to a failing one first, so the table must be exact: a task missing from it goes unchecked, and one too many
is blamed without cause. Run this after changing which tasks a test file calls.

How: a release (tools/student_release.py) filled with solutions/' answers, but for one later task L whose
fences hold the template's TODO again; the tasks before L of its file are checked, and those that come out
"blocked" by L (their tests met L's NotImplementedError) use L. Once for every task but the first of each file.
"""
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [REPO, HERE]

import student_release  # noqa: E402
from grading.checker import LATER_TASKS_USED, discover_tasks, run_tests, summarize  # noqa: E402

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


def main():
    workdir = tempfile.mkdtemp(prefix="later-tasks-")
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
    if measured == LATER_TASKS_USED:
        print("grading.checker.LATER_TASKS_USED is exact.")
        return 0
    print(f"grading.checker.LATER_TASKS_USED is out of date: measured\n{measured}\n(it says {LATER_TASKS_USED});"
          " update it and the list in docs/checking.md")
    return 1


if __name__ == "__main__":
    sys.exit(main())
