"""Copies of the course (tests/mistakes.py make_submission, grading/grade.py) hold the course's
files only: never a virtual environment, data or a student's filled-in templates.

    pytest tests/test_course_copy.py

A 5.6 GB .venv inside the clone once made `pytest -m grading` copy it into every prepared
submission until the disk was full.
"""
import os
import subprocess

import pytest

from grading.course import copy_course
from grading.grade import make_grading_copy
from mistakes import make_submission

pytestmark = pytest.mark.repo

UNTOUCHED = 'def f():\n    # --- Task 9.1 begin ---\n    raise NotImplementedError("Task 9.1")\n    # --- Task 9.1 end ---\n'
FILLED = UNTOUCHED.replace('raise NotImplementedError("Task 9.1")', "return 1")


def _write(root, path, text):
    path = os.path.join(root, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


@pytest.fixture
def clone(tmp_path):
    """A tiny course clone: committed files, then a student's working tree on top of them."""
    root = str(tmp_path / "clone")
    _write(root, "template_a.py", UNTOUCHED)
    _write(root, "solutions/template_a.py", FILLED)
    _write(root, "tests/test_a.py", "committed\n")
    _write(root, ".gitignore", ".venv/\ndata/\n")
    git = ["git", "-C", root, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", root], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "course"], check=True)
    _write(root, "template_a.py", FILLED)  # the student's work
    _write(root, "tests/test_a.py", "changed\n")  # an instructor's uncommitted fix
    _write(root, ".venv/lib/torch/big.bin", "x" * 100_000)  # stands for gigabytes
    _write(root, "data/cifar-10-python.tar.gz", "x")
    _write(root, "notes.txt", "untracked\n")
    return root


def _files(root):
    return sorted(os.path.relpath(os.path.join(here, name), root).replace(os.sep, "/")
                  for here, _, names in os.walk(root) for name in names)


def _read(root, path):
    with open(os.path.join(root, path)) as f:
        return f.read()


def test_a_copy_holds_what_git_tracks_with_the_untouched_templates(clone, tmp_path):
    copy = copy_course(str(tmp_path / "copy"), clone)
    assert _files(copy) == [".gitignore", "solutions/template_a.py", "template_a.py", "tests/test_a.py"], (
        "a copy of the course must hold only the files git tracks: no .venv, data or untracked files")
    assert _read(copy, "template_a.py") == UNTOUCHED, "the templates of a copy are the committed, untouched ones"
    assert _read(copy, "tests/test_a.py") == "changed\n", "the other tracked files are the working tree's"


def test_prepared_submissions_and_grading_copies_leave_the_venv_out(clone, tmp_path):
    _write(clone, "tests/__pycache__/test_a.cpython-311.pyc", "compiled")  # Python's, of the course's files
    _write(clone, "data/__pycache__/x.cpython-311.pyc", "compiled")
    submission = make_submission(str(tmp_path / "submission"), repo=clone)
    assert ".venv" not in os.listdir(submission) and "data" not in os.listdir(submission)
    assert _read(submission, "tests/__pycache__/test_a.cpython-311.pyc") == "compiled", (
        "a prepared submission takes the compiled files of the course's folders (no copy compiles them again)")
    assert _read(submission, "template_a.py") == FILLED  # the solutions, as make_submission promises
    graded = str(tmp_path / "graded")
    make_grading_copy({}, graded, {os.path.realpath(os.path.join(clone, "tests"))}, repo=clone)
    assert _files(graded) == [".gitignore", "solutions/template_a.py", "template_a.py"], (
        "a grading copy holds the course's files, less the excluded folders")


def test_outside_git_no_virtual_environment_is_copied(tmp_path):
    root = str(tmp_path / "unpacked")
    _write(root, "template_a.py", UNTOUCHED)
    _write(root, "myenv/pyvenv.cfg", "home = /usr/bin\n")  # a venv of any name
    _write(root, "myenv/lib/big.bin", "x")
    _write(root, ".venv/lib/big.bin", "x")
    assert _files(copy_course(str(tmp_path / "copy"), root)) == ["template_a.py"]
