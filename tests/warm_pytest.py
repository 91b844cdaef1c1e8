"""pytest in copies of the course, started in a fraction of a second (tests/test_mistakes.py).

    with WarmPytest() as warm:
        returncode, output = warm.run(["--impl", "template", "-m", "task2_2", "-x", "-q"], cwd=repo)

The catalogue of mistakes runs a task's tests in a fresh copy of the course for each of its ~200
entries. A fresh `python -m pytest` spent about 6 s of CPU on each, nearly all of it before the first
test: torch imported by pytest (2 s), then again, with torch._dynamo, by harness.py's forkserver
(3.3 s); the tests themselves took well under a second.

Here one server process imports torch and pytest once and starts the ranks' forkserver once (by
importing harness.py, which starts it with its own preload list), then forks one child per run. The
child runs pytest.main in the copy as `python -m pytest` would there: its conftest, harness, tests and
template files are the copy's own (the server forgets harness.py, and imports no other file of the
course), and its ranks come from the shared forkserver, which imports the test's module from the copy
(the child's sys.path and folder travel with each rank, as for any forkserver).

Forking is safe here, unlike forking pytest after a test ran (harness.py's note): the server imports
torch but never runs an operation, so there is no OpenMP thread to copy in a broken state.
"""
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class WarmPytest:
    """A server that forks a pytest per run(); close() (or the `with` block's end) stops it."""

    def __init__(self):
        self._folder = tempfile.TemporaryDirectory(prefix="warm-pytest-")
        # -c: sys.path[0] is '' (the current folder), as for `python -m pytest` in the child's folder
        code = f"import sys; sys.path.insert(0, {HERE!r}); import warm_pytest; warm_pytest.serve()"
        self._proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      cwd=self._folder.name, text=True, start_new_session=True)
        self._runs = 0

    def run(self, args, cwd, timeout=110.0, env=None):
        """(returncode, output) of `python -m pytest *args` in `cwd`. Past `timeout` s it is killed, with
        everything it started, and TimeoutError says so (as subprocess.run's timeout would)."""
        self._runs += 1
        log = os.path.join(self._folder.name, f"run{self._runs}.log")
        request = {"args": list(args), "cwd": os.path.abspath(cwd), "log": log, "timeout": timeout,
                   "env": {"PYTHONDONTWRITEBYTECODE": "1", **(env or {})}}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm pytest server ended (exit code {self._proc.wait()})")
        reply = json.loads(line)
        with open(log, encoding="utf-8", errors="replace") as f:
            output = f.read()
        os.remove(log)
        if reply["returncode"] is None:
            raise TimeoutError(f"pytest {' '.join(args)} (in {cwd}) ran past {timeout:.0f} s:\n{output[-3000:]}")
        return reply["returncode"], output

    def close(self):
        if self._proc.poll() is None:
            self._proc.stdin.close()  # the server's loop ends; its forkserver follows (its alive pipe closes)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._folder.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve():
    """The server: read requests (JSON lines) from stdin, fork a pytest for each, reply its exit code."""
    # Replies go to the client on a copy of stdout; what the forkserver and its ranks print (they keep
    # this process's stdout and stderr) goes to a file, never into a reply.
    replies = os.fdopen(os.dup(1), "w")
    log = os.open("server.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    import harness  # noqa: F401  torch, torch.distributed; starts the forkserver with harness.py's preload
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker
    import pytest  # noqa: F401
    # No file of the course stays imported or importable from here: the child imports the copy's own.
    sys.path.remove(HERE)
    del sys.modules["harness"], sys.modules["warm_pytest"]
    server = multiprocessing.forkserver._forkserver
    for line in sys.stdin:
        request = json.loads(line)
        server.ensure_running()  # started again if it ended (it is this process's child)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            # The child's harness.py calls ensure_running() again, which would wait for a forkserver that
            # is not its child: the shared one is running (the server checked it just now).
            def ensure_running():
                multiprocessing.resource_tracker.ensure_running()
            server.ensure_running = multiprocessing.forkserver.ensure_running = ensure_running
            _child(request)  # never returns
        returncode = _wait(pid, request["timeout"])
        print(json.dumps({"returncode": returncode}), file=replies, flush=True)


def _child(request):
    code = 3
    try:
        os.setsid()  # its own process group: killed as one, with whatever its tests started
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.update(request["env"])
        sys.dont_write_bytecode = os.environ.get("PYTHONDONTWRITEBYTECODE", "") != ""
        sys.argv = ["pytest", *request["args"]]
        import pytest
        code = int(pytest.main(request["args"]))
    except BaseException:  # noqa: BLE001  said in the log; the exit code says it failed
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # not the server's atexit handlers (they would remove the forkserver's socket)


def _wait(pid, timeout):
    """The child's exit code, or None after killing its process group at `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            code = None
            break
        select.select([], [], [], 0.02)
    try:
        os.killpg(pid, signal.SIGKILL)  # what the tests left running (a torchrun, a stuck subprocess)
    except (ProcessLookupError, PermissionError):
        pass
    if code is None:
        os.waitpid(pid, 0)
    return code
