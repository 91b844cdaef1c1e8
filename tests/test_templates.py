"""The templates are the solutions with the TODO regions emptied, and nothing else differs.

A region is fenced by "# --- Task X.Y begin ---" and "# --- Task X.Y end ---". This
catches a fix made in a solution but not in its template (or the other way round), a
missing stub, and a task with no pytest marker for students to select it.
"""
import configparser
import os
import re

import pytest

pytestmark = pytest.mark.repo  # about this repository's pristine templates, not a student's

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^[ \t]*# --- Task (\d+\.\d+) begin ---\n.*?^[ \t]*# --- Task \1 end ---\n", re.M | re.S)
TEMPLATES = sorted(name for name in os.listdir(REPO) if name.startswith("template_") and name.endswith(".py"))


def read(*parts):
    with open(os.path.join(REPO, *parts)) as f:
        return f.read()


def regions(text):
    """{task: [its fenced regions]}: a task may be fenced in several places (Task 9.1's six methods)."""
    found = {}
    for m in FENCE.finditer(text):
        found.setdefault(m.group(1), []).append(m.group(0))
    return found


def test_there_are_templates():
    assert "template_data_loader.py" in TEMPLATES and "template_trainer.py" in TEMPLATES, TEMPLATES


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_equals_solution_outside_the_task_regions(name):
    template, solution = read(name), read("solutions", name)
    counts = {task: len(found) for task, found in regions(template).items()}
    assert counts == {task: len(found) for task, found in regions(solution).items()}, (
        f"{name}: the two files fence different tasks, or a task in a different number of places")
    assert regions(template), f"{name} has no fenced task"
    assert FENCE.sub("<task>\n", template) == FENCE.sub("<task>\n", solution), (
        f"{name} and solutions/{name} differ outside the fenced task regions: change both the same way")


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_template_region_is_a_todo_and_a_raise(name):
    solved = regions(read("solutions", name))
    for task, found in regions(read(name)).items():
        for region, solution in zip(found, solved[task]):
            body = [line.strip() for line in region.splitlines()[1:-1]]
            assert len(body) == 2 and body[0].startswith(f"# TODO Task {task}:"), f"{name}, Task {task}: {body}"
            assert body[1].startswith(f'raise NotImplementedError("Task {task}:'), f"{name}, Task {task}: {body[1]}"
            assert "NotImplementedError" not in solution, f"solutions/{name}: Task {task} is not filled in: {solution}"


def test_every_task_has_a_pytest_marker():
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "pytest.ini"))
    markers = config["pytest"]["markers"]
    for name in TEMPLATES:
        for task in regions(read(name)):
            marker = "task" + task.replace(".", "_")
            assert re.search(rf"^{marker}:", markers, re.M), f"pytest.ini has no marker {marker} for Task {task} ({name})"


# ----------------------------------------------------------------------------- the copy a task is judged in
def test_a_judged_copy_in_a_release_is_the_students_file_whole(monkeypatch):
    """conftest.load_with_reference without solutions/: the answers to swap in would be another copy of the
    student's own file, with classes of its own (a super() in a method of the one, called with an instance of the
    other, raised TypeError, blamed on the task being checked). The copy is then the student's file as it is."""
    import conftest
    from test_sequence_parallel import ANSWERS, _task9_reference
    monkeypatch.setattr(conftest, "HAS_SOLUTIONS", False)
    with _task9_reference():
        judged = conftest.load_with_reference("template", "template_sequence_parallel",
                                              *[answer for t, answers in ANSWERS.items() if t != "14.5" for answer in answers])
    for function in (judged.parallelize_block, judged.SequenceParallelRowLinear.forward):
        assert function.__globals__ is vars(judged), function.__qualname__  # the copy's own, not another copy's
