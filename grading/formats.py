"""What grade.py writes for people and platforms other than the terminal, from its grades.

    gradebook(grades, tasks, path, roster=read_roster("roster.csv"))  # one row per student (Canvas, Moodle)
    feedback(grade, folder)                                          # feedback/<student>.md, to hand back
    gradescope_results(grade, policy)                                # /autograder/results/results.json
    classroom_workflow(tasks, policy)                                # .github/workflows/classroom.yml

`grades` is grade.py's list of submissions: {"student", "points", "max_points", "notes",
"tasks": [{"task", "where", "points", "max_points", "status", "explanation", "details"}]}.
The tasks and their points come from the course (pytest.ini, the fences, points.toml), so a
task added to the course appears in every one of these with no change here.
"""
import csv
import os
import re


def task_column(task_id):
    return f"Task {task_id}"


# ----------------------------------------------------------------------------- roster and gradebook

def read_roster(path):
    """[{column: value}] from a CSV file with a header: a `folder` column (the submission's
    folder name, as grade.py names students) and any others (student id, e-mail, name)."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    if not rows or "folder" not in rows[0]:
        raise ValueError(f"{path}: the roster needs a header with a 'folder' column (the submission folder's "
                         f"name), for example: folder,student_id,email")
    folders = [row["folder"].strip() for row in rows]
    twice = sorted({f for f in folders if folders.count(f) > 1})
    if twice:
        raise ValueError(f"{path}: folder names listed twice: {', '.join(twice)}")
    return [{key: (value or "").strip() for key, value in row.items() if key} for row in rows]


def gradebook(grades, task_ids, path, roster=None):
    """A wide CSV: one row per student, the roster's columns first, a column per task, the total.
    A student of the roster without a submission gets a row of zeros and the note; a submission
    missing from the roster gets a row with empty ids. Returns the warnings."""
    by_folder = {grade["student"]: grade for grade in grades}
    extra = [key for key in (roster[0] if roster else {}) if key != "folder"]
    header = ["folder"] + extra + [task_column(t) for t in task_ids] + ["total", "max_points", "notes"]
    warnings, rows = [], []
    people = roster or [{"folder": grade["student"]} for grade in grades]
    for person in people:
        grade = by_folder.get(person["folder"])
        ids = [person.get(key, "") for key in extra]
        if grade is None:
            most = max((g["max_points"] for g in grades), default="")
            rows.append([person["folder"]] + ids + [0] * len(task_ids) + [0, _number(most), "no submission"])
            continue
        points = {row["task"]: row["points"] for row in grade["tasks"]}
        rows.append([grade["student"]] + ids + [_number(points.get(t, "")) for t in task_ids] +
                    [_number(grade["points"]), _number(grade["max_points"]), "; ".join(grade["notes"])])
    if roster:
        listed = {person["folder"] for person in roster}
        for grade in grades:
            if grade["student"] not in listed:
                warnings.append(f"{grade['student']} is not in the roster: its row has no student id")
                points = {row["task"]: row["points"] for row in grade["tasks"]}
                rows.append([grade["student"]] + [""] * len(extra) + [_number(points.get(t, "")) for t in task_ids]
                            + [_number(grade["points"]), _number(grade["max_points"]), "; ".join(grade["notes"])])
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return warnings


def _number(value):
    return f"{value:g}" if isinstance(value, (int, float)) else value


# ----------------------------------------------------------------------------- feedback

def feedback(grade, folder, tracebacks=False):
    """A short Markdown file for one student: each task's points, status and the tests' own
    explanation (the hint); the notes. Tracebacks only if asked (they are in logs/)."""
    lines = [f"# Feedback: {grade['student']}", "",
             f"**{_number(grade['points'])} of {_number(grade['max_points'])} points.**", ""]
    for row in grade["tasks"]:
        lines.append(f"- **{task_column(row['task'])}** ({row['where']}): {_number(row['points'])}/"
                     f"{_number(row['max_points'])}, {row['status']}")
        if row["status"] != "done" and row["explanation"]:
            lines.append(f"  {row['explanation']}")
        if tracebacks and row["status"] != "done":
            lines += [f"  {line}" for line in row.get("details", [])]
    if grade["notes"]:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in grade["notes"]]
    if tracebacks and grade.get("log"):
        lines += ["", f"The tests' full output: {grade['log']}"]
    lines.append("")
    path = os.path.join(folder, f"{grade['student']}.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path


# ----------------------------------------------------------------------------- Gradescope

def gradescope_results(grade, policy, sandboxed):
    """Gradescope's results.json for one submission: one test per task, its points, the
    explanation as output. Visibility from points.toml's [gradescope] section."""
    settings = policy.get("gradescope", {})
    visibility = settings.get("visibility", "visible")
    tests = []
    for row in grade["tasks"]:
        output = f"{row['status']}" + (f": {row['explanation']}" if row["status"] != "done" and row["explanation"]
                                       else "")
        tests.append({"name": f"{task_column(row['task'])} ({row['where']})", "number": row["task"],
                      "score": row["points"], "max_score": row["max_points"],
                      "status": "passed" if row["status"] == "done" else "failed",
                      "output": output, "visibility": visibility})
    notes = list(grade["notes"]) + ([] if sandboxed else ["graded without the sandbox"])
    return {"score": grade["points"], "output": "\n".join(notes), "visibility": visibility,
            "stdout_visibility": settings.get("stdout_visibility", "hidden"), "tests": tests}


# ----------------------------------------------------------------------------- GitHub Classroom

CLASSROOM_HEADER = """\
# GitHub Classroom autograding, one step per task with its points.
# GENERATED by `python grading/classroom.py` from pytest.ini's task markers and
# grading/points.toml: edit those and generate again (tests/test_grading_formats.py checks
# that this file is what they give).
name: Autograding Tests
'on':
- push
- repository_dispatch
permissions:
  checks: write
  actions: read
  contents: read
jobs:
  run-autograding-tests:
    runs-on: ubuntu-latest
    if: github.actor != 'github-classroom[bot]'
    steps:
    - name: Checkout code
      uses: actions/checkout@v4
    # Every later step runs only in a student's repository (a student release, which has no
    # solutions/): in the course's own repository there is nothing to grade.
    - name: Set up Python
      uses: actions/setup-python@v5
      if: hashFiles('solutions/__init__.py') == ''
      with:
        python-version: '3.11'
    - name: Install the course's requirements (PyTorch for CPUs)
      if: hashFiles('solutions/__init__.py') == ''
      run: |
        pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu
        pip install -r requirements.txt
"""


ONLY_IN_A_RELEASE = "hashFiles('solutions/__init__.py') == ''"


def _step_id(task_id):
    # the reporter reads each step's result from <ID upper-cased>_RESULTS
    return "task" + task_id.replace(".", "_")


def classroom_workflow(tasks, policy):
    """The workflow's text: a command-grader step per task (pytest on that task's marker, with
    the student's files), its points from points.toml, then the reporter that sums them."""
    lines = [CLASSROOM_HEADER.rstrip("\n")]
    timeout = int(policy.get("classroom", {}).get("timeout_minutes", 10))
    for task in tasks:
        points = policy["points"].get(task.id, policy["default"])
        title = re.sub(r"^Task \d+\.\d+,?\s*", "", task.title) or task.where()
        lines += [
            f"    - name: 'Task {task.id}: {title.replace(chr(39), chr(39) * 2)}'",
            f"      id: {_step_id(task.id)}",
            "      uses: classroom-resources/autograding-command-grader@v1",
            f"      if: {ONLY_IN_A_RELEASE}",
            "      with:",
            f"        test-name: 'Task {task.id}'",
            "        setup-command: ''",
            f"        command: python -m pytest --impl template -m {task.marker} -q -p no:cacheprovider",
            f"        timeout: {timeout}",
            f"        max-score: {points:g}",
        ]
    results = ",".join(_step_id(task.id) for task in tasks)
    lines += ["    - name: Autograding Reporter", "      uses: classroom-resources/autograding-grading-reporter@v1",
              f"      if: {ONLY_IN_A_RELEASE}", "      env:"]
    lines += [f"        {_step_id(task.id).upper()}_RESULTS: "
              f"\"${{{{steps.{_step_id(task.id)}.outputs.result}}}}\"" for task in tasks]
    lines += ["      with:", f"        runners: {results}"]
    return "\n".join(lines) + "\n"
