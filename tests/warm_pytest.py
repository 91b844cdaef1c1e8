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
import shutil
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
        self._started, self._ended = {}, {}  # by run number: the requests sent, the exit codes replied

    def run(self, args, cwd, timeout=110.0, env=None):
        """(returncode, output) of `python -m pytest *args` in `cwd`. Past `timeout` s it is killed, with
        everything it started, and TimeoutError says so (as subprocess.run's timeout would)."""
        return self.result(self.start(args, cwd, timeout, env))

    def start(self, args, cwd, timeout=110.0, env=None):
        """Start `python -m pytest *args` in `cwd` and return at once: a number for result(). Runs started
        together run at the same time (test_mistakes.py starts the next mistake's while it reads one's)."""
        self._runs += 1
        log = os.path.join(self._folder.name, f"run{self._runs}.log")
        # Its own --basetemp, removed once read: pytest's default, a numbered folder in /tmp/pytest-of-USER, is
        # left locked by a child that ends with os._exit, so none was ever cleaned (1195 of them, 3.1 GB, here)
        basetemp = os.path.join(self._folder.name, f"run{self._runs}-tmp")
        request = {"id": self._runs, "args": list(args), "cwd": os.path.abspath(cwd), "log": log, "timeout": timeout,
                   "basetemp": basetemp,
                   "env": dict(env or {})}  # PYTHONDONTWRITEBYTECODE as the client has it (.ci/run unsets it)
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        self._started[self._runs] = request
        return self._runs

    def result(self, run):
        """(returncode, output) of a start()ed run, once it has ended; TimeoutError past its time limit."""
        while run not in self._ended:
            line = self._proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the warm pytest server ended (exit code {self._proc.wait()})")
            reply = json.loads(line)
            self._ended[reply["id"]] = reply["returncode"]
        returncode, request = self._ended.pop(run), self._started.pop(run)
        with open(request["log"], encoding="utf-8", errors="replace") as f:
            output = f.read()
        os.remove(request["log"])
        shutil.rmtree(request["basetemp"], ignore_errors=True)
        if returncode is None:
            raise TimeoutError(f"pytest {' '.join(request['args'])} (in {request['cwd']}) ran past "
                               f"{request['timeout']:.0f} s:\n{output[-3000:]}")
        return returncode, output

    def close(self):
        if self._proc.poll() is None:
            self._proc.stdin.close()  # the server ends, taking its process group down: its forkserver, any rank
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
    """The server: read requests (JSON lines) from stdin, fork a pytest for each at once, and reply each
    exit code as its run ends (None for a run killed at its time limit)."""
    # Replies go to the client on a copy of stdout; what the forkserver and its ranks print (they keep
    # this process's stdout and stderr) goes to a file, never into a reply.
    replies = os.fdopen(os.dup(1), "w")
    log = os.open("server.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    import harness  # torch, torch.distributed
    harness.start_forkserver(dynamo=True)  # the server of every run: with torch._dynamo, as any task may need it
    import multiprocessing.forkserver
    import pytest  # noqa: F401
    # No file of the course stays imported or importable from here: the child imports the copy's own.
    sys.path.remove(HERE)
    del sys.modules["harness"], sys.modules["warm_pytest"]
    server = multiprocessing.forkserver._forkserver
    running = {}  # pid: (run number, deadline)
    pending = b""
    while True:
        # stdin read as bytes from its descriptor: a buffered reader could hold a second request that
        # select() would then not see
        if select.select([0], [], [], 0.02)[0]:
            chunk = os.read(0, 65536)
            if not chunk:  # the client closed stdin (close(), or it was killed): nobody reads what still runs
                for pid in running:
                    _ended(pid, deadline=0)
                # and the forkserver with any rank of a killed run: those are in this process group, not in
                # their run's, and a rank whose results pipe is full waits for a reader for ever
                os.killpg(0, signal.SIGKILL)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                running[_fork(server, request)] = (request["id"], time.monotonic() + request["timeout"])
        for pid, (run, deadline) in list(running.items()):
            returncode = _ended(pid, deadline)
            if returncode is not False:
                del running[pid]
                print(json.dumps({"id": run, "returncode": returncode}), file=replies, flush=True)


def _fork(server, request):
    """A child running the request's pytest; its pid."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker
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
    return pid


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
        args = [*request["args"], f"--basetemp={request['basetemp']}"]
        sys.argv = ["pytest", *args]
        import pytest
        code = int(pytest.main(args))
    except BaseException:  # noqa: BLE001  said in the log; the exit code says it failed
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # not the server's atexit handlers (they would remove the forkserver's socket)


def _ended(pid, deadline):
    """False while the child runs; then its exit code, or None once killed at `deadline`. Either way
    its process group is killed: what its tests left running (a torchrun, a stuck subprocess)."""
    done, status = os.waitpid(pid, os.WNOHANG)
    if not done and time.monotonic() <= deadline:
        return False
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if not done:
        os.waitpid(pid, 0)
        return None
    return os.waitstatus_to_exitcode(status)
