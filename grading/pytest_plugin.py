"""A pytest plugin that records every test's outcome as JSON lines, for check.py and the grader.

    python -m pytest -p grading.pytest_plugin --results-file results.jsonl --impl template

One line per event, flushed at once, so that whatever ran before a submission was killed
is still on disk: "collected" (a test and its task markers), "collect_error", "start",
"report" (one per phase: setup, call, teardown) and "skipped" (a test not run, below).

Once a test of a task hangs (the harness's RankTimeout or pytest-timeout), the task's
remaining tests are skipped: they would most likely hang as well, and each hang costs a
full time limit. Likewise once one raises NotImplementedError: the task is not started
(or waits for the task the error names), and its other tests would only say so again. With
--fast-first (check.py) a task's tests not marked slow run first, and once one of a task's tests
fails its slow tests are skipped: a wrong answer is told in the time of the fast tests (check.py
reports the first failure only). On SIGUSR2 the process writes its Python stack to the file named by
--stack-file, which is how a run killed from outside still says where it was.
"""
import faulthandler
import json
import re
import signal

import pytest

TASK_MARKER = re.compile(r"^task(\d+)_(\d+)$")
# "File "/tmp/x/template_trainer.py", line 126, in reduce_metrics" in a rank's traceback text
TRACEBACK_LINE = re.compile(r'File "([^"]*?([^"/\\]*template_[^"/\\]*\.py))", line (\d+), in (\w+)')


def pytest_addoption(parser):
    group = parser.getgroup("course results")
    group.addoption("--results-file", default=None,
                    help="write each test's outcome and task markers to this file, as JSON lines")
    group.addoption("--stack-file", default=None,
                    help="on SIGUSR2, write the Python stack of this process to this file")
    group.addoption("--fast-first", action="store_true",
                    help="run each task's tests not marked slow first, and skip a task's slow tests once one of "
                    "its tests failed (check.py: a wrong answer is told sooner; the grader runs every test)")


def pytest_configure(config):
    path = config.getoption("--results-file")
    if path:
        config.pluginmanager.register(_Recorder(path, config.getoption("--stack-file")), "course-results")


# the harness's RankTimeout, also when a test catches it and re-raises it with its own words
HARNESS_HANG = re.compile(r"ranks \[[\d, ]*\] were still running after")


def is_hang(exc_type, message):
    return (exc_type == "RankTimeout" or (exc_type == "Failed" and "from pytest-timeout" in (message or ""))
            or bool(HARNESS_HANG.search(message or "")))


def tasks_of(item):
    """["2.3"] for a test marked task2_3."""
    found = []
    for mark in item.iter_markers():
        match = TASK_MARKER.match(mark.name)
        if match and f"{match[1]}.{match[2]}" not in found:
            found.append(f"{match[1]}.{match[2]}")
    return found


def _where(excinfo):
    """The innermost place in a template_*.py file where the error was raised, if any."""
    for entry in reversed(excinfo.traceback):
        name = str(entry.path).replace("\\", "/").rsplit("/", 1)[-1]
        if name.startswith("template_") and name.endswith(".py"):
            return f"{name}:{entry.lineno + 1} in {entry.name}"
    # a rank's error arrives as text: the last template frame of its traceback
    frames = TRACEBACK_LINE.findall(str(excinfo.value))
    if frames:
        _, name, line, function = frames[-1]
        return f"{name}:{line} in {function}"
    return None


class _Recorder:
    def __init__(self, path, stack_path):
        self.file = open(path, "a", encoding="utf-8")
        self.stopped = {}  # task -> (why its remaining tests are skipped, the test that showed it)
        self.failed = {}  # task -> its first failed test (--fast-first)
        if stack_path and hasattr(signal, "SIGUSR2"):  # not on Windows
            self.stack_file = open(stack_path, "w", encoding="utf-8")
            faulthandler.register(signal.SIGUSR2, file=self.stack_file, all_threads=True)

    def write(self, **event):
        self.file.write(json.dumps(event) + "\n")
        self.file.flush()

    def pytest_collectreport(self, report):
        if report.failed:
            self.write(event="collect_error", nodeid=report.nodeid, message=str(report.longrepr)[-4000:])

    @pytest.hookimpl(trylast=True)  # after conftest's own checks of the items
    def pytest_collection_modifyitems(self, config, items):
        if config.getoption("--fast-first"):
            items.sort(key=lambda item: item.get_closest_marker("slow") is not None)  # stable: file order kept

    def pytest_collection_finish(self, session):
        for item in session.items:
            self.write(event="collected", nodeid=item.nodeid, tasks=tasks_of(item),
                       gpu=item.get_closest_marker("gpu") is not None)

    def pytest_runtest_logstart(self, nodeid, location):
        self.write(event="start", nodeid=nodeid)

    def pytest_runtest_setup(self, item):
        for task in tasks_of(item):
            if task in self.stopped:
                reason, message, nodeid = self.stopped[task]
                self.write(event="skipped", nodeid=item.nodeid, task=task, reason=reason, message=message,
                           after=nodeid)
                pytest.skip(f"not run: an earlier test of Task {task} showed a {reason} ({nodeid})")
        failed = [task for task in tasks_of(item) if task in self.failed]
        if failed and item.get_closest_marker("slow") and item.config.getoption("--fast-first"):
            # a plain skip: the task is failing already, by the test named here, which check.py reports
            pytest.skip(f"not run (--fast-first): Task {failed[0]} failed already ({self.failed[failed[0]]})")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        event = {"event": "report", "nodeid": item.nodeid, "when": report.when, "outcome": report.outcome,
                 "duration": round(report.duration, 3)}
        if report.skipped and isinstance(report.longrepr, tuple):
            event["message"] = str(report.longrepr[2])
        elif report.failed and call.excinfo is not None:
            excinfo = call.excinfo
            event.update(exc_type=excinfo.typename, message=str(excinfo.value)[:8000], where=_where(excinfo))
            tasks = tasks_of(item)
            if is_hang(excinfo.typename, event["message"]):
                stop, reason = tasks, "hang"
            elif excinfo.typename == "NotImplementedError":
                # "Task 1.1: ... not done yet" stops Task 1.1's tests, not those of another task
                # of this test, which may well be done
                named = re.findall(r"Task (\d+\.\d+)", event["message"])
                stop, reason = [t for t in tasks if t in named] or ([] if named else tasks), "NotImplementedError"
            else:
                stop, reason = [], None
            for task in stop:
                self.stopped.setdefault(task, (reason, event["message"], item.nodeid))
            for task in tasks_of(item):
                self.failed.setdefault(task, item.nodeid)
        elif report.failed:
            event.update(exc_type="Error", message=str(report.longrepr)[-4000:])
        self.write(**event)
        return report
