"""The tests themselves: every typical wrong answer in mistakes.py must fail its task's tests.

    pytest -m slow        # about 5 s a mistake: each runs the task's tests in a fresh copy

A test that passes a wrong answer teaches a wrong thing, so each mistake must fail, and
the failure must say what is likely wrong (the mistake's hint).
"""
import os
import subprocess
import sys

import pytest

from mistakes import MISTAKES, make_submission


@pytest.mark.slow
@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: f"{m.task}-{m.name}")
def test_the_tests_catch_this_mistake(mistake, tmp_path):
    repo = make_submission(str(tmp_path / "repo"), [mistake])
    command = [sys.executable, "-m", "pytest", "--impl", "template", "-m", mistake.marker, "-x", "-q",
               "-p", "no:cacheprovider", "tests"]
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=110, start_new_session=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"the Task {mistake.task} tests let '{mistake.name}' through:\n{out[-3000:]}"
    assert "NotImplementedError: Task" not in out, out[-3000:]
    assert mistake.hint in out, f"the failure does not say '{mistake.hint}':\n{out[-3000:]}"
