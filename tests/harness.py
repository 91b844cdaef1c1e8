"""Run a function on several ranks of a real gloo process group, and never hang.

    results = run_ranks(fn, 3, "solutions", timeout=20)

Each rank is its own process. `fn(rank, world_size, *args)` runs after
`init_process_group`, and whatever it returns comes back as a list indexed by rank.

- The ranks meet through a file store in a fresh temporary folder: no port is used, so
  parallel runs can never collide.
- Collectives time out after `timeout` seconds, and any rank still running then is
  killed. The failure says which ranks were stuck and where (a faulthandler dump), which
  is how a missing collective on one rank shows up.
- The `timeout` starts once every rank has joined the process group. Starting a rank
  (importing the test's module) and creating the group are the machine's work, not the
  code under test's: on a busy machine they took a whole 20 s limit, and a right answer
  was reported as a hang "in init_process_group". They get their own limit,
  `startup_timeout`; a start that misses it is tried once more, then RankStartupTimeout
  says so, and where each rank was.
- A deadlock is reported as soon as it is certain, not at the time limit: once every rank
  still running has waited STILL_FOR (3) seconds without using the CPU, neither sleeping on
  purpose nor reading a disk (Linux; elsewhere the time limit alone).
- A rank that raises fails the test with that rank's own error; NotImplementedError from
  an unfilled TODO comes through as NotImplementedError, the other ranks are killed at once.
"""
import datetime
import faulthandler
import gc
import io
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import pickle
import re
import signal
import sys
import tempfile
import time
import traceback
import types
import warnings

# Processes are forked from a server that has already imported torch: about 30 ms a
# rank instead of 3 s for "spawn", and safer than forking pytest itself, whose OpenMP
# threads a plain fork would copy in a broken state.
_context = multiprocessing.get_context("forkserver")
# torch._dynamo too, where the tests need it (start_forkserver): an optimizer or DistributedDataParallel imports it
# on first use, 1.5-4 s in every rank.
_context.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo"])
# The tasks whose tests import torch._dynamo (an optimizer, DDP), in a rank or in pytest's process: measured by
# `python tools/tasks_used.py --dynamo`, which runs each task's tests alone with a server that had not imported it.
# A run of other tasks' tests alone (`check.py 0.3`: pytest -m task0_3) starts the server without it: 1.5-3.5 s
# less of every such check (0.3: 10.5 s -> 6.1 s at an hour when `import torch` took 5 s). Out of date, a rank
# of such a run imports it itself when it needs it: slower, never wrong.
TASKS_NEEDING_DYNAMO = {"2.2", "4.4", "5.4", "5.5", "6.2", "6.3", "7.3", "7.4", "7.5", "8.1", "8.2", "8.4", "9.2",
                        "9.3", "9.4", "10.4", "10.5", "10.6", "10.7", "12.1", "12.3", "13.2", "13.3", "14.4", "14.5"}
# Of the others, the tasks whose ranks ask autograd for a gradient given the output's (torch.autograd.grad(out, x,
# grad), out.backward(grad)): torch imports SYMBOLIC_SHAPES (and sympy) there on first use, 0.3-0.5 s in every rank
# (Task 15.5's check: 6.5 -> 3.7 s with the server importing it). torch._dynamo imports it too. Measured with the
# table above; the server imports it while pytest's process collects the tests, 0.3 s more of a check that has no
# use for it.
SYMBOLIC_SHAPES = "torch.fx.experimental.symbolic_shapes"
TASKS_NEEDING_SYMBOLIC_SHAPES = {"9.1", "11.2", "14.3", "15.2", "15.3", "15.4", "15.5", "15.6", "16.1"}
# Not in a rank that is starting (it imports this file to find its function), where
# multiprocessing forbids starting a server.
_STARTING_A_RANK = getattr(multiprocessing.current_process(), "_inheriting", False)
# On Linux the server is forked from this process once it has imported torch (conftest.py
# imports this file first thing, before any test runs an operation: no OpenMP thread yet),
# instead of a new interpreter importing torch a second time: that import was 2-4 s of CPU
# of every pytest start, on a machine of 2 cores often the whole difference. Elsewhere (fork
# after torch is not safe on macOS) it is started at once, and imports its preload while
# this process imports torch too.
_FORK_THE_SERVER = sys.platform.startswith("linux")
# A rank computes with one thread in each of its threads, as a process that torchrun starts with
# OMP_NUM_THREADS=1 does: in its main thread (torch.set_num_threads(1), _rank_main) and in gloo's, where a
# DDP comm hook's callback runs (PowerSGD's decompress). OpenMP reads the variable once, as torch loads it,
# for every thread that is not the caller of set_num_threads; the ranks are forks of this process. With the
# machine's 2 cores there, a matmul in the callback gave other bits than in a main thread, and two ranks
# of a right answer ended "ranks INCONSISTENT" (1 ulp). For the import only: what a test starts in a new
# process gets the variable as it was.
_THREADS = os.environ.get("OMP_NUM_THREADS")
os.environ["OMP_NUM_THREADS"] = "1"
if not _STARTING_A_RANK and not _FORK_THE_SERVER:
    multiprocessing.forkserver.ensure_running()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if _THREADS is None:
    del os.environ["OMP_NUM_THREADS"]
else:
    os.environ["OMP_NUM_THREADS"] = _THREADS


def differing_in_another_thread():
    """How many elements of 20 products p @ q.T computed in a new thread (as gloo runs a comm hook's callback)
    differ in their bits from the same products in the calling thread: 0 when OpenMP gives every thread the
    calling thread's count (the variable above), about 1245 of 25,600 on 2 cores when it does not."""
    import threading

    generator = torch.Generator().manual_seed(0)
    differing = 0
    for _ in range(20):
        p, q = torch.randn(10, 2, generator=generator), torch.randn(128, 2, generator=generator)
        main, other = torch.matmul(p, q.T), {}
        thread = threading.Thread(target=lambda: other.update(product=torch.matmul(p, q.T)))
        thread.start()
        thread.join()
        differing += int((other["product"] != main).sum())
    return differing


def freeze_inherited_objects():
    """gc.freeze() in a process forked from the server: the garbage collector leaves alone the objects
    it inherited (torch, pytest: millions), which it would otherwise walk at each full collection,
    writing to every one and so copying every page the fork shared. A test's gc.collect() took 1.3 s
    in a rank at load 8 (Task 10.6's GPipe check called it 11 times a rank: 14 of its 19 s); it now
    walks only what the rank made itself, all that a test's collection is for."""
    gc.freeze()


def _forked_server(path, args, passfds):
    """multiprocessing.util.spawnv_passfds for ForkServer.ensure_running: the server's command
    (`python -c "...main(...)"`) run in a fork of this process rather than a new interpreter.
    It keeps only what a new interpreter would have: fds 0-2 and `passfds`, no file of the
    course imported (a rank imports its test's module afresh, as from a new server: harness
    and conftest are still half imported here) and no pytest assertion rewriting (a rank's
    asserts read as in a plain import)."""
    with warnings.catch_warnings():  # Python 3.12+: torch has a thread of its own; it holds no lock of ours
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        keep = {0, 1, 2, *passfds}
        for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__  # pytest's capture objects wrote to closed fds
        course = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(course):
                del sys.modules[name]
        sys.meta_path[:] = [hook for hook in sys.meta_path if type(hook).__name__ != "AssertionRewritingHook"]
        # a script's __main__ (half run here) is imported afresh by each rank, as under `python -c`
        sys.modules["__main__"] = types.ModuleType("__main__")
        exec(args[args.index("-c") + 1], {"__name__": "__forkserver__"})
        code = 0
    except SystemExit:  # the server's normal end: every client has closed its "alive" pipe
        code = 0
    except BaseException:  # noqa: BLE001  said on stderr; the server is then missing, and ensure_running starts one
        traceback.print_exc()
    finally:
        os._exit(code)


def _needs(markexpr, tasks):
    """Whether a run of `pytest -m markexpr` may run a test of `tasks`: False only for task markers alone
    ("task0_3", "task1_1 or task1_2": check.py's runs) of none of them; False for any run while
    `tools/tasks_used.py --dynamo` measures which tasks need what (COURSE_DYNAMO_LOG)."""
    if os.environ.get("COURSE_DYNAMO_LOG"):
        return False
    if not re.fullmatch(r"\s*task\d+_\d+(?:\s+or\s+task\d+_\d+)*\s*", markexpr or ""):
        return True
    return any(f"{major}.{minor}" in tasks for major, minor in re.findall(r"task(\d+)_(\d+)", markexpr))


def needs_dynamo(markexpr):
    """Whether a run of `pytest -m markexpr` may need torch._dynamo (see _needs)."""
    return _needs(markexpr, TASKS_NEEDING_DYNAMO)


def needs_symbolic_shapes(markexpr):
    """Whether a run of `pytest -m markexpr` may need SYMBOLIC_SHAPES in its ranks (see _needs)."""
    return _needs(markexpr, TASKS_NEEDING_DYNAMO | TASKS_NEEDING_SYMBOLIC_SHAPES)


def imported(names=("torch._dynamo", SYMBOLIC_SHAPES)):
    """Which of `names` this process has imported."""
    return {name for name in names if name in sys.modules}


IMPORTED_AT_START = imported()  # what pytest's process had when its server started (start_forkserver)


def note_imports(before, where):
    """For `tools/tasks_used.py --dynamo`: where COURSE_DYNAMO_LOG names a file, a line there for each module this
    process (`where`: "rank" or "pytest") imported since `before`, while its server had neither."""
    log = os.environ.get("COURSE_DYNAMO_LOG")
    if log:
        with open(log, "a") as f:
            f.writelines(f"{where} {os.getpid()} imported {name}\n" for name in sorted(imported() - before))


def markexpr_of_the_command_line(argv):
    """The -m expression of a pytest command line (`python -m pytest ... -m "task0_3"`, as check.py runs it); None
    where it has none, or one this cannot read."""
    found = None
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("-m") and arg != "-m" and not arg.startswith("-m-"):
            found = arg[2:].lstrip("=")
    return found


def start_forkserver(dynamo=True, symbolic_shapes=True):
    """Start the server that forks the ranks, once, before any test runs an operation and before CUDA starts
    (at this file's import, which conftest.py makes first thing; tests/warm_pytest.py). On Linux it is a fork of
    this process, which has imported torch, and with `dynamo` torch._dynamo too (imported here, not by the server:
    pytest's own process may need it as well, and the first rank waited for the server's import otherwise);
    without it, with `symbolic_shapes` the server imports SYMBOLIC_SHAPES."""
    global IMPORTED_AT_START
    if _STARTING_A_RANK or not _FORK_THE_SERVER or multiprocessing.forkserver._forkserver._forkserver_pid:
        return  # a rank; started at import (not Linux); started already (a warm_pytest child: its server's)
    # `check.py --impl solutions X.Y`, medians of 3 alternating at load 1.1-2.2, torch._dynamo imported here
    # rather than by the server: 2.2 4.3 -> 3.6 s, 5.4 4.2 -> 3.5 s, 10.7 5.1 -> 4.4 s; 0.3 3.5 -> 3.7 s (no
    # optimizer in pytest's process); and without it at all, where no test needs it: 0.3 10.5 -> 6.1 s (3 runs
    # each, alternating, 2026-11-29 17:14, `import torch` 4.8-5.6 s and with torch._dynamo 8.3-9.2 s).
    if dynamo:
        # torch._dynamo imports triton, where it is installed (torch's CUDA wheels bring it), only to know that it is
        # there: 0.35-0.6 s of a check (8.4 and 12.3 alternating, 2026-11-30), and no test compiles anything. Marked
        # missing here, for this process and the ranks forked from it; a fresh Python (train_ddp.py) sees it as ever.
        sys.modules.setdefault("triton", None)
        import torch._dynamo  # noqa: F401
    else:
        _context.set_forkserver_preload(["torch", "torch.distributed", *([SYMBOLIC_SHAPES] if symbolic_shapes else [])])
    IMPORTED_AT_START = imported()
    multiprocessing.resource_tracker.ensure_running()  # a new interpreter, as ever: it imports nothing
    _spawn = multiprocessing.util.spawnv_passfds
    multiprocessing.util.spawnv_passfds = _forked_server
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        multiprocessing.util.spawnv_passfds = _spawn


if not _STARTING_A_RANK and _FORK_THE_SERVER and "pytest" in sys.modules:  # a pytest run: conftest.py imports this
    start_forkserver(dynamo=needs_dynamo(markexpr_of_the_command_line(sys.argv[1:])),
                     symbolic_shapes=needs_symbolic_shapes(markexpr_of_the_command_line(sys.argv[1:])))


class RankTimeout(AssertionError):
    """Some ranks were still running when the time limit came."""


class RankFailed(AssertionError):
    """A rank raised; the message holds its traceback."""


class RankStartupTimeout(AssertionError):
    """The ranks did not all start and join the process group in time: the machine, not the
    code under test (which has not run yet). Deliberately not a RankTimeout: tests that turn a
    hang into a hint about the student's code must not catch it."""


# Starting a rank is a fork and the import of the test's module, then init_process_group:
# 0.3-0.9 s, measured here with eight busy processes on two cores. A start that takes 15 s
# is stuck (gloo's connection set-up can be, rarely, under load): it is tried once more.
STARTUP_TIMEOUT = 15.0


def _waiting_rank(connection):
    """A rank forked before it is needed (_pool): it waits for its run, then runs it in _rank_main. A fork of
    the server, which holds ~370 MB of torch, takes 15-30 ms here, one rank after the other, and a run waited
    for them: 11 s of a default `pytest` of 63 s. Forked while the run before works, a run's ranks are there
    when it starts: the default run's five files of most runs (collectives, allreduce, ddp, zero, fsdp) took
    8.4 s by pytest instead of 9.4 s (medians of 5, alternating, 2026-11-29). Importing the last run's test
    module in the waiting ranks as well gained nothing more (8.4 s)."""
    freeze_inherited_objects()
    torch.set_num_threads(1)  # several ranks share a few cores
    try:
        path, folder = connection.recv()
        # as the forkserver's own start sets them: sys.path and the folder of the run, not of the moment of the fork
        sys.path[:] = path
        os.chdir(folder)
        job = pickle.loads(connection.recv_bytes())  # imports the test's module, to find its function
    except EOFError:
        return  # the run that would have used this rank never came: pytest has ended
    except BaseException as error:  # the test's module did not import here
        connection.send((type(error).__name__, (str(error), traceback.format_exc())))
        return
    _rank_main(connection, *job)


def _rank_main(report, fn, rank, world_size, store_path, backend, timeout, args, dump_path,
               startup_timeout=STARTUP_TIMEOUT):
    with open(dump_path, "w") as dump:
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=False)
        report.send(("started", None))  # the test's module is imported: creating the group next
        try:
            dist.init_process_group(
                backend,
                store=dist.FileStore(store_path, world_size),
                rank=rank,
                world_size=world_size,
                # longer than the parent's deadlines (start-up, then `timeout`), so that the
                # parent sees a hang and reports where each rank was, not a bare gloo timeout
                timeout=datetime.timedelta(seconds=startup_timeout + timeout + 10),
            )
            report.send(("joined", None))
            before = imported()
            out = fn(rank, world_size, *args)
            note_imports(before, "rank")
            buffer = io.BytesIO()
            torch.save(out, buffer)  # bytes, not shared memory: safe after this process exits
            report.send(("ok", buffer.getvalue()))
            # Stay in the group until every rank is done, as a rank of a real job would still
            # be running: a rank that skipped a collective then shows as a hang of the others,
            # not as a confusing "connection closed by peer". The parent kills the ranks here once
            # it has every answer (it sends nothing: the wait's limit is for a parent gone).
            report.poll(timeout + 10)
        except BaseException as error:  # report everything, KeyboardInterrupt included
            report.send((type(error).__name__, (str(error), traceback.format_exc())))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def _where(dump_text):
    """The innermost frame of a faulthandler dump (the collective it waits in), then ours."""
    frames = [line.strip() for line in dump_text.splitlines() if line.strip().startswith("File")]
    if not frames:
        return "(no stack dump: the process did not answer)"
    # up to the rank's start: below _rank_main are the server's frames (and, where it was forked from
    # pytest, the frames of pytest importing conftest.py at that moment), no part of the test
    start = next((i for i, f in enumerate(frames) if f.endswith(" in _rank_main")), len(frames) - 1)
    frames = frames[:start + 1]
    ours = [f for f in frames if "site-packages" not in f and "/lib/python" not in f]
    return "\n      ".join(frames[:1] + [f for f in ours if f != frames[0]])


def run_ranks(fn, world_size, *args, backend="gloo", timeout=20.0, startup_timeout=STARTUP_TIMEOUT):
    """Run fn(rank, world_size, *args) on `world_size` ranks; return the results by rank.

    `timeout` counts from the moment every rank has joined the process group. Starting the
    ranks and creating the group may take `startup_timeout`; a start that takes longer is
    abandoned and tried once more (no code under test has run yet), then reported."""
    for attempt in (1, 2):
        try:
            return _run_once(fn, world_size, args, backend, timeout, startup_timeout)
        except _StartupStalled as stalled:
            if attempt == 2:
                raise RankStartupTimeout(
                    f"the ranks did not start, twice, within {startup_timeout:.0f} s each time: {stalled}. "
                    "No code under test had run yet: this is the machine (too busy, or short of memory), "
                    "not a mistake in your code. Run it again, on a quieter machine if it happens again."
                ) from None


class _StartupStalled(Exception):
    """A start that took longer than its limit: the message says where the ranks were."""


# Ranks forked ahead of their run, each waiting in _waiting_rank: (process, this end of its pipe). Those of
# this process (_pool_pid): a process forked from it later (warm_pytest.py's runs) forks its own.
_pool, _pool_pid = [], None


def _fill_pool(count):
    """Fork ranks into the pool until it holds `count`."""
    global _pool, _pool_pid
    if _pool_pid != os.getpid():
        _pool, _pool_pid = [], os.getpid()
    while len(_pool) < count:
        ours, theirs = _context.Pipe()
        proc = _context.Process(target=_waiting_rank, args=(theirs,), daemon=True)
        proc.start()
        theirs.close()  # the rank's end is the rank's alone: once it has ended, reading ours ends too
        _pool.append((proc, ours))


def _run_once(fn, world_size, args, backend, timeout, startup_timeout):
    global _pool
    with tempfile.TemporaryDirectory(prefix="ranks-") as tmp:
        _fill_pool(world_size)
        ranks, _pool = _pool[:world_size], _pool[world_size:]
        for rank, (_, connection) in enumerate(ranks):
            connection.send((sys.path, os.getcwd()))
            # pickled by value: a tensor in `args` is the rank's copy, never memory shared with this process
            connection.send_bytes(pickle.dumps((fn, rank, world_size, os.path.join(tmp, "store"), backend, timeout,
                                                args, os.path.join(tmp, f"stack{rank}.txt"), startup_timeout)))
        _fill_pool(world_size)  # the next run's ranks (most often as many) are forked while these work
        procs = [proc for proc, _ in ranks]
        try:
            outputs = _collect(ranks, timeout, tmp, startup_timeout)
        except BaseException:
            for proc in procs:
                proc.kill()
                proc.join(timeout=5)
            raise
        # Every rank has answered and then only waits for this process to end, touching no file: each is killed
        # there and not waited for. Its end (the kernel freeing what the rank copied of the
        # server's memory) took 15 ms a rank, 5 s of the default `pytest`, which the next test need
        # not wait for; the next start reaps it (Process.start). Woken instead, a rank's store
        # could write into the folder while it is being removed.
        for proc in procs:
            proc.kill()
        return outputs


def _collect(ranks, timeout, tmp, startup_timeout=STARTUP_TIMEOUT):
    """Every rank's answer, in the order of the ranks, from what each sends on its pipe."""
    world_size = len(ranks)
    procs = [proc for proc, _ in ranks]
    reading = {connection: rank for rank, (_, connection) in enumerate(ranks)}  # until its pipe ends
    outputs = {}
    started, joined = set(), set()
    deadline = time.monotonic() + startup_timeout  # until every rank has joined; then `timeout`
    stillness = None
    while len(outputs) < world_size:
        rank = None
        for connection in multiprocessing.connection.wait(list(reading), timeout=0.05):
            try:
                status, payload = connection.recv()
                rank = reading[connection]
                break
            except EOFError:  # the rank has ended: whatever it sent was read before this
                del reading[connection]
        if rank is None:  # nobody reported in the last 50 ms
            dead = _ended_silently(ranks, outputs, reading)
            if dead:
                raise RankFailed(_died(dead[0], procs[dead[0]].exitcode))
            if time.monotonic() > deadline:
                if len(joined) < world_size:
                    _raise_startup_timeout(procs, started, joined, startup_timeout, tmp)
                _raise_timeout(procs, outputs, timeout, tmp)
            if stillness and stillness.all_waiting([p.pid for r, p in enumerate(procs) if r not in outputs]):
                _raise_timeout(procs, outputs, timeout, tmp, stillness)
            continue
        if status == "started":
            started.add(rank)
            continue
        if status == "joined":
            joined.add(rank)
            if len(joined) == world_size:
                deadline = time.monotonic() + timeout
                stillness = Stillness()
            continue
        if status == "ok":
            outputs[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            continue
        message, trace = payload
        if status == "NotImplementedError":
            raise NotImplementedError(message)  # an unfilled TODO: its own message says which
        if _LOST_CONNECTION.search(message):
            # the consequence of another rank's end: a rank that raised first (its report waits in its pipe: it
            # sent it before leaving the group) or was killed by a signal is the news, if there is one
            # Up to 3 s: a rank that aborted (gloo's SIGABRT) was seen still alive 0.5 s after its peer's report,
            # under load (trial 9, Task 10.3's catalogue), and the peer's lost connection was told instead.
            for _ in range(60):
                time.sleep(0.05)
                cause = _failure_waiting(reading, outputs, rank)
                if cause:
                    other, (other_status, (other_message, other_trace)) = cause
                    if other_status == "NotImplementedError":
                        raise NotImplementedError(other_message)
                    raise RankFailed(_raised(other, other_status, other_message, other_trace) +
                                     f"\n(rank {rank} then lost its connection to it, a consequence)")
                dead = [r for r in _ended_silently(ranks, outputs, reading) if r != rank]
                if dead:
                    raise RankFailed(f"{_died(dead[0], procs[dead[0]].exitcode)} (rank {rank} then lost its "
                                     "connection to it, a consequence)")
        raise RankFailed(_raised(rank, status, message, trace))
    return [outputs[rank] for rank in range(world_size)]


def _raised(rank, status, message, trace):
    """What a rank's failure report says: the exception, then the rank's traceback."""
    return f"rank {rank} raised {status}: {message}\n\n--- rank {rank} traceback ---\n{trace}"


_LOST_CONNECTION = re.compile(r"Connection (closed|reset) by peer|pair closure")


def _failure_waiting(reading, outputs, rank):
    """(other rank, its report) for a rank other than `rank` whose pipe holds an error that is not itself a lost
    connection, else None: when both were there at once, multiprocessing's wait() gave the lower rank's first,
    and rank 0's "Connection closed by peer" hid the assertion of the rank that had closed it (measured: Task
    15.2's catalogue, once in a run of all the entries)."""
    for connection, other in list(reading.items()):
        while other != rank and other not in outputs and connection.poll():
            try:
                status, payload = connection.recv()
            except EOFError:  # the rank has ended, as _collect reads it: _ended_silently can then say so
                del reading[connection]
                break
            if status == "ok":  # kept, as _collect keeps it
                outputs[other] = torch.load(io.BytesIO(payload), weights_only=False)
            elif status not in ("started", "joined") and not _LOST_CONNECTION.search(payload[0]):
                return other, (status, payload)
    return None


def _ended_silently(ranks, outputs, reading):
    """The ranks that ended without answering, with nothing left to read from them: their pipe ended, or holds
    nothing (a child of the rank, a DataLoader's worker, may keep the pipe open). Any exit code: os._exit(0) too."""
    return [r for r, (p, connection) in enumerate(ranks) if r not in outputs and p.exitcode is not None
            and (connection not in reading or not connection.poll())]


def _died(rank, exitcode):
    """Why a rank ended without a word: killed by a signal (a negative exit code) or an exit."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        cause = {"SIGSEGV": "a segmentation fault: C code read memory it does not own (a tensor's storage freed "
                            "or resized while a collective used it, a wrong size or shape handed to gloo)",
                 "SIGABRT": "an abort in C code (gloo aborts on a message whose size differs from its buffer's)",
                 "SIGKILL": "killed from outside (out of memory?)",
                 "SIGBUS": "a bus error in C code (memory that went away under a tensor)"}.get(name, "")
        return (f"rank {rank} was killed by {name} (exit code {exitcode}) without reporting"
                + (f": {cause}" if cause else ""))
    return (f"rank {rank} ended with exit code {exitcode} without reporting: os._exit() or sys.exit() in the code "
            "under test, or a crash in C code")


def _raise_startup_timeout(procs, started, joined, startup_timeout, tmp):
    """Where the ranks were when the start-up limit came, said plainly."""
    world_size = len(procs)
    starting = [rank for rank in range(world_size) if rank not in started]
    creating = [rank for rank in sorted(started) if rank not in joined]
    if not starting and not joined:
        raise _StartupStalled(f"every rank (0-{world_size - 1}) was still waiting in init_process_group, "
                              "creating the process group")
    parts = []
    if starting:
        parts.append(f"ranks {starting} had not started yet (forking, importing the test's modules)")
    if creating:
        parts.append(f"ranks {creating} were waiting in init_process_group for the others")
    if joined:
        parts.append(f"ranks {sorted(joined)} had joined the process group")
    raise _StartupStalled("; ".join(parts))


# A deadlock ends sooner than its time limit: once every rank still running has waited this long, none of them
# using the CPU (blocked in gloo, 0-1 clock tick in 3 s, measured) and none sleeping on purpose or reading a
# disk, nothing is left that could wake them. Hangs waited 10-40 s for their limit before, each time a
# student's answer or the catalogue of mistakes had one.
STILL_FOR = 3.0


def _process_activity(pid):
    """(CPU clock ticks used so far by the process and its children, whether it is busy without using the CPU:
    its main thread sleeping on purpose (time.sleep), or a thread in disk I/O). None where /proc cannot say."""
    ticks, busy, pids = 0, False, [pid]
    try:
        while pids:
            one = pids.pop()
            with open(f"/proc/{one}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += sum(int(field) for field in fields[11:15])  # utime stime cutime cstime: every thread, ever
            for tid in os.listdir(f"/proc/{one}/task"):
                with open(f"/proc/{one}/task/{tid}/stat") as f:
                    busy = busy or f.read().rsplit(")", 1)[1].split()[0] == "D"
                with open(f"/proc/{one}/task/{tid}/children") as f:
                    pids += [int(child) for child in f.read().split()]  # DataLoader's workers, say
            if one == pid:
                with open(f"/proc/{pid}/wchan") as f:
                    busy = busy or "nanosleep" in f.read()
    except (OSError, ValueError, IndexError):
        return None
    return ticks, busy


class Stillness:
    """Whether the ranks still running have all been waiting for STILL_FOR seconds: none used more than a few
    clock ticks of CPU (a rank blocked in a collective uses 0-1 in 3 s; one computing, even at load 10 on 2
    cores, dozens), none slept on purpose or read a disk. Linux only (/proc); elsewhere the time limit alone
    ends a hang."""

    def __init__(self, still_for=None):
        self.still_for = STILL_FOR if still_for is None else still_for
        self.started = self.since = self.looked = time.monotonic()
        self.baseline = {}

    def all_waiting(self, pids):
        now = time.monotonic()
        if now - self.looked < 0.5:
            return False
        gap, self.looked = now - self.looked, now
        current = {pid: _process_activity(pid) for pid in pids}
        if any(activity is None for activity in current.values()):
            return False  # no /proc, or a rank ended just now: its report is on its way
        moved = gap > 1.5 or any(  # > 1.5 s: this process itself was not run (a paused machine): look again
            busy or ticks - self.baseline.get(pid, (-10**9,))[0] > 5 for pid, (ticks, busy) in current.items())
        if moved:
            self.since, self.baseline = now, current
            return False
        return now - self.since >= self.still_for


def _raise_timeout(procs, outputs, timeout, tmp, stillness=None):
    stuck = [rank for rank, proc in enumerate(procs) if rank not in outputs and proc.is_alive()]
    for rank in stuck:
        os.kill(procs[rank].pid, signal.SIGUSR1)
    time.sleep(0.5)  # let faulthandler write
    where = []
    for rank in stuck:
        try:
            with open(os.path.join(tmp, f"stack{rank}.txt")) as dump:
                text = dump.read()
        except OSError:
            text = ""
        where.append(f"  rank {rank} was at:\n      {_where(text)}")
    finished = sorted(outputs)
    if not finished and stillness is None:
        where.append("  (No rank finished at all: a deadlock, or a machine too busy to finish in time; "
                     "if the stacks above are not in a collective, run the test again on a quieter machine.)")
    if stillness is None:
        facts = f"ranks {stuck} were still running after {timeout:.0f} s (ranks {finished} had finished). "
    else:
        facts = (f"ranks {stuck} were still running after {time.monotonic() - stillness.started:.0f} s (ranks "
                 f"{finished} had finished), all of them waiting, without using the CPU, for the last "
                 f"{stillness.still_for:g} s: nothing left running could wake them. ")
    raise RankTimeout(
        facts + "This is a hang: usually one rank calls a collective (broadcast, all_reduce, ...) that "
        "another rank never calls, calls them in a different order, or the ranks disagree on a call's arguments "
        "(a broadcast's src, a group).\n" + "\n".join(where)
    )


# ----------------------------------------------------------------------------- naming the task
# Every failure a student can reach names the task, its function and what the test expected. A test's
# own messages do ("Task 9.2 (template_tensor_parallel.py, ...): ..."); what escapes them does not: a rank
# that raised the student's own ValueError, an IndexError in pytest's process, a rank killed by a signal,
# pytest.raises' "DID NOT RAISE". conftest.py hands every failure of a task's test to named_failure.

class TaskFailure(AssertionError):
    """An error of the code under test (an IndexError, a KeyError, ...), said as the task's failure."""


_TEMPLATE_FRAME = re.compile(r'File "[^"]*?([^"/\\]*template_[^"/\\]*\.py)", line (\d+), in (\w+)')


def _student_frame(error):
    """"template_x.py:12 in f": the innermost line of a template_*.py file where `error` was raised,
    from its traceback (pytest's process) or from a rank's traceback text (RankFailed)."""
    place = None
    tb = error.__traceback__
    while tb is not None:
        name = os.path.basename(tb.tb_frame.f_code.co_filename)
        if name.startswith("template_") and name.endswith(".py"):
            place = f"{name}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    frames = _TEMPLATE_FRAME.findall(str(error))
    if frames:
        place = "{}:{} in {}".format(*frames[-1])
    return place


def expectation(test_name):
    """What a test checks, from its name: "test_partition_refuses_more_stages_than_layers[3]" ->
    "partition refuses more stages than layers (3)"."""
    name, _, params = test_name.partition("[")
    words = name.removeprefix("test_").replace("_", " ")
    return words + (f" ({params.rstrip(']')})" if params else "")


def one_line(error, limit=200):
    """"ExceptionType: the first line of its message", cut at `limit` characters: how a rank reports an error
    of the code under test that it caught, for the test to explain in its own words."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:limit]}"


def named_failure(error, tasks, test_name):
    """`error`, escaping a test of `tasks` ("Task 9.2 (template_tensor_parallel.py, from_linear())", ...),
    as a failure whose first line names the task, where the student's code raised, and what the test
    expected; None where the error already names its task (the test's own words), or is no failure
    of the code under test (NotImplementedError: an unfilled TODO; RankStartupTimeout: the machine)."""
    if not tasks or isinstance(error, (NotImplementedError, RankStartupTimeout)):
        return None
    text = str(error)
    ids = [re.match(r"Task (\d+\.\d+)", task)[1] for task in tasks]
    named = {found for found in re.findall(r"\bTasks? (\d+\.\d+)", text.split("\n--- rank")[0])}
    if type(error).__name__ in ("Skipped", "XFailed", "Exit") or named & set(ids) or "from pytest-timeout" in text:
        return None  # the test's own words, naming its task; a time limit (grading/checker.py reads it as a hang)
    prefix = (tasks[0] if len(tasks) == 1 else "Tasks " + ", ".join(ids)) + ": "
    expected = f"What the test checks: {expectation(test_name)}."  # a name is not always a clause
    place = _student_frame(error)
    at = f" (at {place})" if place else ""
    first, _, rest = text.partition("\n")
    if isinstance(error, RankTimeout):
        return RankTimeout(f"{prefix}{first} {expected}\n{rest}")
    if isinstance(error, RankFailed):
        raised = re.match(r"rank (\d+) raised (\w+): ", text)
        if raised and raised[2] == "NotImplementedError":
            return None
        head, sep, trace = text.partition("\n\n--- rank")
        head = " ".join(head.split())
        return RankFailed(f"{prefix}{head.rstrip('.')}{at if place and place not in head else ''}. {expected}"
                          f"{chr(10) * 2 + '--- rank' + trace if sep else ''}")
    if type(error).__name__ == "Failed" and text.startswith("DID NOT RAISE"):
        # "DID NOT RAISE <class 'ValueError'>" (pytest 9.0), "DID NOT RAISE ValueError" (pytest 9.1)
        wanted = re.search(r"DID NOT RAISE \(?(?:<class ')?(?:\w+\.)*(\w+)", text)
        return AssertionError(f"{prefix}no {wanted[1] if wanted else 'exception'} was raised, where the test expected "
                              f"one (the docstring says when). {expected}")
    if isinstance(error, AssertionError) or type(error).__name__ == "Failed":
        return AssertionError(f"{prefix}{text.strip().rstrip('.') or 'a check of the test failed'}{at}. {expected}")
    return TaskFailure(f"{prefix}your code raised {type(error).__name__}: {' '.join(text.split())[:1000]}{at}. "
                       f"{expected}")
