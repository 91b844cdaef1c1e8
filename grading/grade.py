"""Grade students' submissions with this repository's own tests.

    python grading/grade.py submissions/*                  # one folder per student
    python grading/grade.py alice bob --out grades         # grades/grades.json, .csv and logs/
    python grading/grade.py submissions/* --tasks 2        # only Task 2 (also: 2.3, task2_3)
    python grading/grade.py submissions/* --jobs 2         # two submissions at a time
    python grading/grade.py submissions/* --roster roster.csv   # gradebook.csv with student ids
    python grading/grade.py /autograder/submission --format gradescope --out /autograder/results

Besides the table: grades.json (everything), grades.csv (a row per student and task),
gradebook.csv (a row per student, a column per task: for Canvas or Moodle; --roster adds
the students' ids), feedback/<student>.md (each task's points and the hint, to hand back)
and logs/<student>.log (pytest's output). --format gradescope also writes results.json.

A submission is a folder that holds a student's template_*.py files, anywhere inside it (a
copy of the whole repository will do). Each is graded in a fresh temporary copy of this
repository into which only those files are copied: the student's tests, conftest.py,
pytest.ini and other files are never used, and a tests/ folder that differs from ours is
reported. Each submission runs in its own process group with time limits, so one that
hangs or crashes costs at most its limit and the others are still graded.

Points per task and the limits: grading/points.toml. On Linux each submission runs in a
sandbox (grading/sandbox.py, bubblewrap): no network, none of your files, a private /tmp,
limits on processes, memory and file size. Where it cannot start, grade.py says why and
stops; --no-sandbox then runs the students' code with your permissions.
"""
import argparse
import concurrent.futures
import csv
import datetime
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script
from grading import formats, sandbox  # noqa: E402
from grading.checker import REPO, discover_tasks, run_tests, select_tasks, summarize  # noqa: E402
from grading.course import copy_course  # noqa: E402

POINTS_FILE = os.path.join(REPO, "grading", "points.toml")
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".venv", "venv", "solutions", "node_modules", "data"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", nargs="+", help="folders, one per student, holding their template_*.py files")
    parser.add_argument("--out", default="grades",
                        help="folder for grades.json, grades.csv and each submission's pytest log (default: grades)")
    parser.add_argument("--tasks", nargs="*", default=[], help="grade only these tasks, like 2.3 or 2 (default: all)")
    parser.add_argument("--points", default=POINTS_FILE, help="points and time limits (default: grading/points.toml)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds for one submission before it is killed (default: points.toml's limits)")
    parser.add_argument("--test-timeout", type=float, default=None,
                        help="seconds for one test (default: points.toml's limits)")
    parser.add_argument("--retries", type=int, default=None,
                        help="how often a failing task's tests run again (default: points.toml's limits)")
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded at the same time (default: 1; "
                        "more can make timing-sensitive tests slower)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary grading copies, and print where")
    parser.add_argument("--format", choices=["default", "gradescope"], default="default",
                        help="gradescope: also write OUT/results.json for Gradescope (one submission; "
                        "grading/gradescope/run_autograder calls this)")
    parser.add_argument("--roster", default=None,
                        help="CSV file with a 'folder' column (the submission folder's name) and the columns to "
                        "copy into gradebook.csv (student id, e-mail)")
    parser.add_argument("--tracebacks", action="store_true",
                        help="feedback files also say where each failing task stopped (default: the hint only)")
    parser.add_argument("--sandbox", choices=["on", "off", "auto"], default="on" if sys.platform.startswith("linux")
                        else "off", help="on (default on Linux): each submission runs in a sandbox, and grading stops "
                        "if none can start; auto: the sandbox where it can start; off: with your permissions")
    parser.add_argument("--no-sandbox", dest="sandbox", action="store_const", const="off",
                        help="run the students' code with your permissions (same as --sandbox off)")
    return parser.parse_args(argv)


def load_policy(path):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
    with open(path, "rb") as f:
        policy = tomllib.load(f)
    limits = policy.get("limits", {})
    return {"default": float(policy.get("default", 10)), "partial": bool(policy.get("partial", False)),
            "points": {str(k): float(v) for k, v in policy.get("points", {}).items()},
            "test_seconds": float(limits.get("test_seconds", 60)), "retries": int(limits.get("retries", 1)),
            "submission_seconds": float(limits.get("submission_seconds", 900)),
            "sandbox": dict(policy.get("sandbox", {})), "gradescope": dict(policy.get("gradescope", {})),
            "classroom": dict(policy.get("classroom", {}))}


def points_for(result, policy):
    """(awarded, maximum) for one task."""
    maximum = policy["points"].get(result.task.id, policy["default"])
    if result.status == "no tests":  # nothing to grade it by: it counts for nobody
        return 0.0, 0.0
    if result.done:
        return maximum, maximum
    if policy["partial"] and result.status == "failing" and result.total:
        return round(maximum * result.passed / result.total, 2), maximum
    return 0.0, maximum


# ----------------------------------------------------------------------------- submissions

class Refused(Exception):
    """A submission that cannot be graded as it is: the message says why and what to do."""


def _unfinished(path):
    """How many tasks of a template file still raise their NotImplementedError."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return len(re.findall(r"raise NotImplementedError\(\s*[\"']Task \d+\.\d+", f.read()))


def find_student_files(folder, names):
    """{name: path} of each of `names` in `folder`, and notes on doubts.

    One copy of a file: that one. Several (a backup, an older clone inside the submission):
    identical ones are one; otherwise the copy with the most tasks filled in, then the newest
    (by more than a second), each with a note. Different copies that neither rule separates
    raise Refused: grading one of them would be a guess."""
    copies, notes = {}, []
    for here, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(set(files) & set(names)):
            copies.setdefault(name, []).append(os.path.join(here, name))
    found = {}
    for name, paths in sorted(copies.items()):
        paths.sort(key=lambda p: (p.count(os.sep), p))  # the shallowest first
        texts = {}
        for path in paths:
            with open(path, "rb") as f:
                texts[path] = f.read()
        if len(set(texts.values())) == 1:
            found[name] = paths[0]
            continue
        shown = ", ".join(os.path.relpath(p, folder) for p in paths)
        left = {p: _unfinished(p) for p in paths}
        fewest = min(left.values())
        candidates = [p for p in paths if left[p] == fewest]
        if len(candidates) == 1:
            found[name] = candidates[0]
            counts = ", ".join(f"{os.path.relpath(p, folder)}: {left[p]}" for p in paths)
            notes.append(f"{len(paths)} different copies of {name} ({shown}): graded "
                         f"{os.path.relpath(candidates[0], folder)}, the one with the fewest tasks left "
                         f"(tasks still raising NotImplementedError: {counts})")
            continue
        if len({texts[p] for p in candidates}) == 1:
            found[name] = candidates[0]
            continue
        times = sorted(((os.path.getmtime(p), p) for p in candidates), reverse=True)
        if times[0][0] - times[1][0] > 1.0:
            found[name] = times[0][1]
            notes.append(f"{len(paths)} different copies of {name} ({shown}) with the same tasks filled in: "
                         f"graded the newest, {os.path.relpath(times[0][1], folder)}")
            continue
        raise Refused(f"not graded: {len(paths)} different copies of {name} ({shown}), with the same tasks "
                      f"filled in and none newer: leave one copy of {name} in the submission and grade it again")
    return found, notes


def inspect_submission(root, files):
    """Notes for the instructor about what in the submission is ignored or suspicious."""
    notes = []
    ours = os.path.join(REPO, "tests")
    theirs = os.path.join(root, "tests")
    if os.path.isdir(theirs):
        for name in sorted(os.listdir(theirs)):
            mine, path = os.path.join(ours, name), os.path.join(theirs, name)
            if not os.path.isfile(path) or not name.endswith((".py", ".ini", ".cfg", ".toml")):
                continue
            if not os.path.exists(mine):
                notes.append(f"tests/{name} is not one of the course's tests: ignored")
            elif not filecmp.cmp(mine, path, shallow=False):
                notes.append(f"tests/{name} differs from the course's: graded with the course's tests")
    for name in ("pytest.ini", "conftest.py"):
        path = os.path.join(root, name)
        if os.path.isfile(path) and not (os.path.exists(os.path.join(REPO, name))
                                         and filecmp.cmp(os.path.join(REPO, name), path, shallow=False)):
            notes.append(f"{name} differs from the course's: ignored")
    for name, path in sorted(files.items()):
        with open(path, encoding="utf-8", errors="replace") as f:
            if re.search(r"^\s*(from|import)\s+solutions\b", f.read(), re.MULTILINE):
                notes.append(f"{name} imports solutions/: check it by hand")
    return notes


def make_grading_copy(submission_files, dest, exclude, repo=REPO):
    """The course's files at `dest` (grading/course.py: what git tracks, the templates untouched,
    never a .venv or data), with the student's template files in place of ours."""
    copy_course(dest, repo, exclude)
    for name, path in submission_files.items():
        shutil.copyfile(path, os.path.join(dest, name))


def grade_one(name, folder, tasks, policy, args, exclude):
    """Grade one submission; whatever goes wrong becomes its grade's note, never a crash."""
    try:
        return _grade_one(name, folder, tasks, policy, args, exclude)
    except Exception as error:  # noqa: BLE001 - one broken submission must not stop the others
        refused = isinstance(error, Refused)
        why = str(error) if refused else f"the grader failed: {type(error).__name__}: {error}"
        rows = [{"task": t.id, "where": t.where(), "points": 0.0,
                 "max_points": policy["points"].get(t.id, policy["default"]), "status": "refused" if refused
                 else "error", "explanation": why, "details": [], "passed": 0, "tests": 0} for t in tasks]
        return {"student": name, "path": os.path.abspath(folder), "points": 0.0,
                "max_points": sum(r["max_points"] for r in rows), "seconds": 0.0, "timed_out": False,
                "notes": [why if refused else f"not graded: {type(error).__name__}: {error}"], "log": None,
                "tasks": rows}


def _grade_one(name, folder, tasks, policy, args, exclude):
    templates = sorted(n for n in os.listdir(REPO) if n.startswith("template_") and n.endswith(".py"))
    files, notes = find_student_files(folder, templates)
    missing = [n for n in templates if n not in files]
    if files:
        root = os.path.dirname(min(files.values(), key=lambda p: p.count(os.sep)))
        notes += inspect_submission(root, files)
        missing = [n for n in missing if n in {t.file for t in tasks}]  # only files of the tasks graded
        if missing:
            notes.append(f"missing: {', '.join(missing)} (graded as the untouched template)")
    else:
        notes.append(f"no template_*.py file found in {folder}")
    workdir = tempfile.mkdtemp(prefix=f"grade-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-")
    try:
        copy = os.path.join(workdir, "repo")
        make_grading_copy(files, copy, exclude)
        wrap = _sandboxed(copy, policy) if args.sandbox == "on" else None
        # each run writes into a folder of its own, beside the copy (which the sandbox makes read-only)
        run = run_tests(copy, [t.id for t in tasks], tempfile.mkdtemp(prefix="run-", dir=workdir), impl="template",
                        timeout=args.timeout or policy["submission_seconds"],
                        test_timeout=args.test_timeout or policy["test_seconds"], wrap=wrap)
        if run.timed_out:
            notes.append(f"stopped at the time limit ({run.timeout:.0f} s)")
        results = summarize(tasks, run)
        log = os.path.join(args.out, "logs", f"{name}.log")
        shutil.copyfile(run.log_path, log)
        seconds = run.seconds
        # A busy machine can fail a correct answer (a rank too slow to connect, a time limit
        # reached by a slow rank): run such a task's tests again. A failed check of a test
        # (an assertion) compares deterministic values, so it is not run again.
        retries = policy["retries"] if args.retries is None else args.retries
        for attempt in range(retries if not run.timed_out else 0):
            uncertain = [r for r in results if not r.certain]
            # a task whose tests crashed the test process runs apart, so as not to take the others down again
            for again in ([r for r in uncertain if r.status != "error"], [r for r in uncertain if r.status == "error"]):
                if not again:
                    continue
                retry_dir = tempfile.mkdtemp(prefix="retry-", dir=workdir)
                rerun = run_tests(copy, [r.task.id for r in again], retry_dir, impl="template",
                                  timeout=args.timeout or policy["submission_seconds"],
                                  test_timeout=args.test_timeout or policy["test_seconds"], wrap=wrap)
                seconds += rerun.seconds
                with open(log, "a") as out, open(rerun.log_path) as f:
                    out.write(f"\n\n===== run {attempt + 2}: Task {', '.join(r.task.id for r in again)} =====\n")
                    out.write(f.read())
                for new in summarize([r.task for r in again], rerun):
                    old = next(r for r in results if r.task.id == new.task.id)
                    if new.done:
                        notes.append(f"Task {new.task.id} passed on run {attempt + 2} (run 1: {old.status}: "
                                     f"{old.explanation[:200]})")
                    if new.done or old.status == "not run":  # a task not run the first time: this is its grade
                        results[results.index(old)] = new
        if wrap:
            with open(log, encoding="utf-8", errors="replace") as f:
                notes += sandbox.notes_from_log(f.read(), copy, course=REPO)
    finally:
        if args.keep:
            print(f"kept the grading copy of {name}: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for result in results:
        awarded, maximum = points_for(result, policy)
        rows.append({"task": result.task.id, "where": result.task.where(), "points": awarded,
                     "max_points": maximum, "status": result.status, "explanation": result.explanation,
                     "details": result.details, "passed": result.passed, "tests": result.total})
    return {"student": name, "path": os.path.abspath(folder),
            "points": round(sum(r["points"] for r in rows), 2), "max_points": sum(r["max_points"] for r in rows),
            "seconds": round(seconds, 1), "timed_out": run.timed_out, "notes": notes,
            "log": os.path.relpath(log, args.out), "tasks": rows}


def _sandboxed(copy, policy):
    """How run_tests runs pytest in the sandbox (grading/sandbox.py), with points.toml's limits."""
    limits = sandbox.Limits.from_policy(policy["sandbox"])
    user = sandbox.new_user()

    def wrap(command, env, workdir):
        sandbox.prepare(copy, [workdir], user)
        return sandbox.wrap(command, env, copy=copy, writable=[workdir], limits=limits, user=user)
    return wrap


def student_names(paths):
    """A unique name per submission: the folder's name, with its parent's when two collide."""
    names = []
    for path in paths:
        parts = os.path.abspath(path).rstrip(os.sep).split(os.sep)
        name = parts[-1]
        if name in names or name in ("repo", "submission", "src"):
            name = "_".join(parts[-2:])
        base, n = name, 2
        while name in names:
            name, n = f"{base}_{n}", n + 1
        names.append(name)
    return names


# ----------------------------------------------------------------------------- reports

def print_table(grades):
    width = max([len("student")] + [len(g["student"]) for g in grades])
    print(f"{'student':<{width}}  {'task':<6} {'points':>7}  {'status':<12} explanation")
    for grade in grades:
        for row in grade["tasks"]:
            points = f"{row['points']:g}/{row['max_points']:g}"
            explanation = row["explanation"] if row["status"] != "done" else ""
            if len(explanation) > 80:
                explanation = explanation[:77] + "..."
            print(f"{grade['student']:<{width}}  {row['task']:<6} {points:>7}  {row['status']:<12} {explanation}")
        total = f"{grade['points']:g}/{grade['max_points']:g}"
        print(f"{grade['student']:<{width}}  {'total':<6} {total:>7}  ({grade['seconds']:.0f} s)")
        for note in grade["notes"]:
            print(f"{'':<{width}}  note: {note}")
        print()


def write_reports(grades, out, policy, tasks):
    def git(*words):
        try:
            return subprocess.run(["git", *words], cwd=REPO, capture_output=True, text=True).stdout.strip()
        except OSError:  # no git
            return ""
    commit = git("rev-parse", "HEAD")
    report = {"graded_at": datetime.datetime.now().isoformat(timespec="seconds"), "course_commit": commit or None,
              # tests changed since that commit grade differently from it
              "course_modified": bool(commit) and bool(git("status", "--porcelain", "--untracked-files=no")),
              "tasks": [t.id for t in tasks], "policy": policy, "submissions": grades}
    with open(os.path.join(out, "grades.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out, "grades.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "task", "points", "max_points", "status", "explanation", "notes"])
        for grade in grades:
            for row in grade["tasks"]:
                writer.writerow([grade["student"], row["task"], row["points"], row["max_points"], row["status"],
                                 row["explanation"], ""])
            writer.writerow([grade["student"], "total", grade["points"], grade["max_points"],
                             "timed out" if grade["timed_out"] else "", "", "; ".join(grade["notes"])])


def main(argv=None):
    args = parse_args(argv)
    policy = load_policy(args.points)
    try:
        tasks = select_tasks(discover_tasks(REPO), args.tasks)
    except ValueError as error:
        print(f"grade.py: {error}", file=sys.stderr)
        return 2
    if not tasks:
        print("grade.py: no task found: pytest.ini has no taskX_Y markers", file=sys.stderr)
        return 2
    for folder in args.submissions:
        if not os.path.isdir(folder):
            print(f"grade.py: {folder} is not a folder (unpack archives first)", file=sys.stderr)
            return 2
    unknown = sorted(set(policy["points"]) - {t.id for t in discover_tasks(REPO)})
    if unknown:
        print(f"grade.py: warning: {args.points} gives points to tasks that do not exist: {', '.join(unknown)}",
              file=sys.stderr)
    if args.format == "gradescope" and len(args.submissions) != 1:
        print("grade.py: --format gradescope grades one submission (Gradescope runs one at a time)", file=sys.stderr)
        return 2
    roster = None
    if args.roster:
        try:
            roster = formats.read_roster(args.roster)
        except (OSError, ValueError) as error:
            print(f"grade.py: {error}", file=sys.stderr)
            return 2
    if args.sandbox != "off":
        ok, why = sandbox.available()
        if not ok and args.sandbox == "on":
            print(f"grade.py: the sandbox cannot start: {why}. Install it, or grade with your own permissions: "
                  f"--no-sandbox", file=sys.stderr)
            return 2
        if not ok:
            print(f"grade.py: not sandboxed: {why}", file=sys.stderr)
        args.sandbox = "on" if ok else "off"
    elif not sys.platform.startswith("linux"):
        print("grade.py: not sandboxed (the sandbox needs Linux): the students' code runs with your permissions",
              file=sys.stderr)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    # submissions or the output kept inside this repository must not be copied into every grading copy
    exclude = {os.path.realpath(p) for p in args.submissions + [args.out]}
    names = student_names(args.submissions)
    print(f"Grading {len(names)} submission(s) on Task {', '.join(t.id for t in tasks)}"
          f"{', sandboxed' if args.sandbox == 'on' else ', NOT sandboxed'} ...", file=sys.stderr)
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(grade_one, name, folder, tasks, policy, args, exclude)
                   for name, folder in zip(names, args.submissions)]
        for future in concurrent.futures.as_completed(futures):
            grade = future.result()
            print(f"  {grade['student']}: {grade['points']:g}/{grade['max_points']:g} in {grade['seconds']:.0f} s",
                  file=sys.stderr, flush=True)
        grades = [future.result() for future in futures]
    print_table(grades)
    write_reports(grades, args.out, policy, tasks)
    for warning in formats.gradebook(grades, [t.id for t in tasks], os.path.join(args.out, "gradebook.csv"), roster):
        print(f"grade.py: warning: {warning}", file=sys.stderr)
    os.makedirs(os.path.join(args.out, "feedback"), exist_ok=True)
    for grade in grades:
        formats.feedback(grade, os.path.join(args.out, "feedback"), tracebacks=args.tracebacks)
    written = "grades.json, grades.csv, gradebook.csv, feedback/"
    if args.format == "gradescope":
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(formats.gradescope_results(grades[0], policy, sandboxed=args.sandbox == "on"), f, indent=2)
        written += ", results.json"
    print(f"Wrote {written} and logs/ in {args.out} ({time.monotonic() - start:.0f} s).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
