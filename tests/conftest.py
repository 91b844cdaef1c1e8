"""Which files the tests check.

    pytest                      # solutions/ (instructors, CI)
    pytest --impl template      # your template_*.py files (students)
    pytest --impl template -m task1_2   # one task
    pytest --impl=solutions             # with "=": with a space pytest takes solutions/ for the folder
                                        # to test, before it has read this file (docs/checking.md)
"""
import gc
import importlib
import importlib.util
import inspect
import io
import multiprocessing
import os
import re
import queue
import sys
import time
import traceback
import types
import weakref

import harness  # first: it starts the server that forks the ranks, see harness.py
import pytest
import torch

import gpu  # noqa: E402  (counts the GPUs before they are hidden; see gpu.py)

if not getattr(multiprocessing.current_process(), "_inheriting", False):  # pytest's, not a rank's
    if torch.cuda.is_available():
        torch.cuda.init()  # CUDA starts now, seeing the GPUs, and keeps them for this process's own tests;
        torch.cuda.device_count()  # once started, the count is cached, so it stays too
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # what the tests start sees none (gpu.py says why)


def load(impl, name):
    """The module `name` (for example "template_trainer") of the chosen implementation."""
    if impl == "solutions" and not HAS_SOLUTIONS:
        impl = "template"  # a student release: see HAS_SOLUTIONS
    return importlib.import_module(("solutions." if impl == "solutions" else "") + name)


# A student release (tools/student_release.py) has no solutions/. Its tests then take the
# student's own answers wherever they would take the reference answers, so a task is judged
# together with the tasks it builds on; check.py says so when one of those fails.
HAS_SOLUTIONS = importlib.util.find_spec("solutions") is not None
# The --impl that trains or runs with the reference answers, for what load() cannot swap: a command
# line (train_ddp.py --impl REFERENCE), a rank's impl. A test names solutions/ only through load(),
# load_with_reference() and REFERENCE, so that a release runs it (tools/student_release.py checks).
REFERENCE = "solutions" if HAS_SOLUTIONS else "template"


def load_with_reference(impl, name, *names, in_the_copy=False):
    """A fresh copy of the module `name` of `impl`, with solutions/' answers swapped in for `names`:
    functions of the module ("build_buckets"), or methods of a class that the solution module
    defines ("finish_gradient_synchronization", or "DDP.finish_gradient_synchronization" where
    several classes define one). A test then judges one task alone: a wrong answer to an earlier
    task fails that task's tests, not those of every task built on it (the grader gives points
    per task).

    The copy is new at each call, so the swap never leaks into another test, even in pytest's
    own process. A function swapped in runs with solutions/' globals: a function it calls by
    name is solutions/' too, so swap in every task that the judged one does not need. With
    in_the_copy it runs with the copy's globals instead (with_globals): what it calls and builds by
    name is then the copy's, the judged answer included (Task 14's blocks build the judged file's
    layers; Task 16's dispatch calls the judged all_to_all). In a student release (no solutions/)
    nothing is swapped: the copy is the student's own file, whole (another copy of it would bring
    classes of its own, and a super() in one called with an instance of the other raised TypeError).
    """
    module = load(impl, name)
    if not names:
        return module
    spec = importlib.util.spec_from_file_location(f"{name}_judged_alone", module.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickle look a class's module up there
    spec.loader.exec_module(module)
    if not HAS_SOLUTIONS:
        return module
    solution = load("solutions", name)
    for wanted in names:
        owner, _, attribute = wanted.rpartition(".")
        if not owner and attribute in vars(solution):
            holder, theirs = module, getattr(solution, attribute)
        else:
            classes = [cls_name for cls_name, cls in vars(solution).items()
                       if isinstance(cls, type) and cls.__module__ == solution.__name__ and attribute in vars(cls)
                       and cls_name == (owner or cls_name)]
            if len(classes) != 1:
                raise ValueError(f"load_with_reference: '{wanted}' names {len(classes)} methods of classes in "
                                 f"solutions/{name}.py ({classes}): name a function or Class.method there")
            # vars(), not getattr: a staticmethod or classmethod stays one
            holder, theirs = getattr(module, classes[0]), vars(getattr(solution, classes[0]))[attribute]
        setattr(holder, attribute, with_globals(theirs, module) if in_the_copy else theirs)
    return module


def with_globals(function, module):
    """`function` (or the staticmethod or classmethod around one) running with `module`'s globals."""
    kind = type(function) if isinstance(function, (staticmethod, classmethod)) else None
    inner = function.__func__ if kind else function
    rebound = types.FunctionType(inner.__code__, vars(module), inner.__name__, inner.__defaults__, inner.__closure__)
    rebound.__qualname__, rebound.__kwdefaults__ = inner.__qualname__, inner.__kwdefaults__
    return kind(rebound) if kind else rebound


STUB = re.compile(r'raise NotImplementedError\("(Task \d+\.\d+:[^"]*)"\)')


def raise_if_unfilled(module, places):
    """The NotImplementedError of the first of `places` ("function" or "Class.method" of `module`) whose
    TODO still raises it, raised here, in pytest's process: a test of an unfilled task fails at once,
    naming the task, before any rank starts."""
    for place in places:
        owner, _, name = place.rpartition(".")
        function = getattr(getattr(module, owner) if owner else module, name)
        stub = STUB.search(inspect.getsource(getattr(function, "__func__", function)))
        if stub:
            raise NotImplementedError(stub.group(1))


def keeps_its_input(op, x):
    """Whether y = op(x) keeps x alive while y is (saved for backward, or on ctx): an autograd Function whose
    backward needs nothing of its input must not hold it (Tasks 14.3, 15.5, 16.1). x's only other reference, the
    caller's, is dropped; gloo's thread may hold a finished collective's tensors a moment (measured: 1 ms). Not for
    a Function whose output is x or a view of it (Task 9.1's f): the output itself keeps x (look at its ctx there)."""
    inner = x.detach().clone().requires_grad_().clone()  # a non-leaf: no AccumulateGrad node holds it
    alive = weakref.ref(inner)
    y = op(inner)
    del inner
    deadline = time.monotonic() + 3
    while alive() is not None and time.monotonic() < deadline:
        time.sleep(0.001)
    kept = alive() is not None
    del y
    return kept


class DidNotFinish(AssertionError):
    """A function under test ran past its time or memory limit (call_alone)."""


def _alone_main(fn, calls, results, memory_bytes):
    import resource

    harness.freeze_inherited_objects()
    torch.set_num_threads(1)
    with open("/proc/self/status") as status:  # what this process already maps (torch's libraries)
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + memory_bytes
    if hard == resource.RLIM_INFINITY or cap < hard:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    for index, args in enumerate(calls):
        status, payload = "ok", None
        try:
            out = fn(*args)
            buffer = io.BytesIO()
            torch.save(out, buffer)
            payload = buffer.getvalue()
        except MemoryError:
            status = "memory"  # reported below, once the exception (and what it holds) is gone
        except BaseException as error:
            status, payload = type(error).__name__, (str(error), traceback.format_exc())
        results.put((index, status, payload))
        if status != "ok":
            return


def call_alone(fn, calls, task, describe, timeout=10.0, memory_gb=2.0):
    """[fn(*args) for args in calls], each call in one separate process with a time and a memory
    limit, for the tests of a pure function: an endless loop then fails in seconds, saying which
    call did not finish, instead of growing inside pytest's own process until the machine swaps.

    fn must be a module-level function (the process imports it by name, as run_ranks does);
    describe(args) says what was called, for the message; task names the task ("Task 6.1 (...)").
    Failures: DidNotFinish (time or memory), NotImplementedError as raised (an unfilled TODO),
    AssertionError naming the task for any other exception.
    """
    results = harness._context.Queue()
    proc = harness._context.Process(target=_alone_main, args=(fn, list(calls), results, int(memory_gb * 2**30)),
                                    daemon=True)
    proc.start()
    outputs = []
    deadline = time.monotonic() + timeout
    try:
        while len(outputs) < len(calls):
            try:
                index, status, payload = results.get(timeout=0.05)
            except queue.Empty:
                index = None
            if index is None:
                late = time.monotonic() > deadline
                if late or (not proc.is_alive() and results.empty()):
                    call = describe(calls[len(outputs)])
                    raise DidNotFinish(
                        f"{task}: {call} did not finish in {timeout:.0f} s (an endless loop? a while loop whose "
                        "condition never changes)" if late else
                        f"{task}: {call} ended its process (exit code {proc.exitcode}) without returning")
                continue
            if status == "ok":
                outputs.append(torch.load(io.BytesIO(payload), weights_only=False))
                continue
            call = describe(calls[index])
            if status == "memory":
                raise DidNotFinish(f"{task}: {call} did not finish: it used more than {memory_gb:g} GiB of memory "
                                   "(a loop that never ends, growing a list?)")
            message, trace = payload
            if status == "NotImplementedError":
                raise NotImplementedError(message)
            raise AssertionError(f"{task}: {call} raised {status}: {message}\n\n{trace}")
        return outputs
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=5)


@pytest.fixture(scope="session")
def impl(request):
    return request.config.getoption("--impl")


@pytest.fixture(scope="session")
def data_loader(impl):
    return load(impl, "template_data_loader")


@pytest.fixture(scope="session")
def trainer(impl):
    return load(impl, "template_trainer")


def pytest_runtest_setup(item):
    if item.get_closest_marker("repo") and item.config.getoption("--impl") == "template":
        pytest.skip("checks the repository itself, not your template files (run plain pytest for it)")


def pytest_collection_modifyitems(config, items):
    """check.py and the catalogue collect only the test files that name a task's marker (grading/checker.py,
    task_test_files), so a task's marker must be written in its test's file, not made up at run time."""
    texts = {}
    for item in items:
        for mark in item.iter_markers():
            if re.fullmatch(r"task\d+_\d+", mark.name):
                path = str(item.path)
                if path not in texts:
                    with open(path, encoding="utf-8", errors="replace") as f:
                        texts[path] = f.read()
                if not re.search(rf"\bmark\.{mark.name}\b", texts[path]):
                    raise pytest.UsageError(f"{item.nodeid} is marked {mark.name}, which its file does not name: "
                                            f"check.py would not collect it; write pytest.mark.{mark.name} there")


def pytest_report_header(config):
    impl = config.getoption("--impl")
    where = "solutions/" if impl == "solutions" else "the template_*.py files (your code)"
    gpus = torch.cuda.device_count()
    return [f"checking: {where}", f"GPUs: {gpus or 'none (GPU tests are skipped)'}"]


_TASKS = {}


def _task_names(item):
    """["Task 9.2 (template_tensor_parallel.py, ColumnParallelLinear.from_linear/forward() ...)"] for a test
    marked task9_2: the task and where it is, as check.py names it (grading/checker.py finds the fences)."""
    if not _TASKS:
        from grading.checker import discover_tasks
        _TASKS.update({task.id: task for task in discover_tasks(os.path.dirname(os.path.dirname(__file__)))})
    names = []
    for mark in item.iter_markers():
        found = re.fullmatch(r"task(\d+)_(\d+)", mark.name)
        if found and f"{found[1]}.{found[2]}" in _TASKS:
            task = _TASKS[f"{found[1]}.{found[2]}"]
            name = f"Task {task.id} ({task.where()})"
            if name not in names:
                names.append(name)
    return names


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A failure of a task's test that does not name the task (the student's own exception in a rank,
    an IndexError, a rank killed by a signal, "DID NOT RAISE") is said again naming it, where the
    code raised, and what the test checks (harness.named_failure); the original stays chained."""
    try:
        return (yield)
    except (Exception, pytest.fail.Exception) as error:
        named = harness.named_failure(error, _task_names(pyfuncitem), pyfuncitem.name)
        if named is None:
            raise
        raise named from error


def pytest_collection_finish(session):
    """gc.freeze(): what is imported by now (torch, pytest, the tests' modules: millions of objects)
    lives as long as this process, so no collection walks it again. Without it each full collection
    walked them all: pytest's five at the end, to find a __del__ that raised, took 0.8 s of every
    `python check.py X.Y` (then 2.5 s for Task 1.2, 1.8 s with it), and the tests' own gc.collect()."""
    gc.freeze()


def pytest_sessionfinish(session):
    """The tests' garbage collected once, then the rest frozen too: a __del__ that raises here is still
    reported by pytest (its hook is in place until the end), and the five collections pytest makes
    after this walk nothing (torch._dynamo, imported by the tests' optimizers after collection, cost
    0.15-0.6 s more at the end of a check of Tasks 8.4, 10.7 and 13.2, measured alternating)."""
    gc.collect()
    gc.freeze()
    harness.note_imports(harness.IMPORTED_AT_START, "pytest")
