"""Which files the tests check.

    pytest                      # solutions/ (instructors, CI)
    pytest --impl template      # your template_*.py files (students)
    pytest --impl template -m task1_2   # one task
"""
import importlib
import importlib.util
import sys

import harness  # noqa: F401  (first: it starts the server that forks the ranks, see harness.py)
import pytest
import torch


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        choices=["solutions", "template"],
        default="solutions",
        help="check solutions/ (the default: instructors and CI) or the template_*.py files "
        "at the top of the repository (students)",
    )


def load(impl, name):
    """The module `name` (for example "template_trainer") of the chosen implementation."""
    if impl == "solutions" and not HAS_SOLUTIONS:
        impl = "template"  # a student release: see HAS_SOLUTIONS
    return importlib.import_module(("solutions." if impl == "solutions" else "") + name)


# A student release (tools/student_release.py) has no solutions/. Its tests then take the
# student's own answers wherever they would take the reference answers, so a task is judged
# together with the tasks it builds on; check.py says so when one of those fails.
HAS_SOLUTIONS = importlib.util.find_spec("solutions") is not None


def load_with_reference(impl, name, *names):
    """A fresh copy of the module `name` of `impl`, with solutions/' answers swapped in for `names`:
    functions of the module ("build_buckets"), or methods of a class that the solution module
    defines ("finish_gradient_synchronization", or "DDP.finish_gradient_synchronization" where
    several classes define one). A test then judges one task alone: a wrong answer to an earlier
    task fails that task's tests, not those of every task built on it (the grader gives points
    per task).

    The copy is new at each call, so the swap never leaks into another test, even in pytest's
    own process. A function swapped in runs with solutions/' globals: a function it calls by
    name is solutions/' too, so swap in every task that the judged one does not need.
    """
    module = load(impl, name)
    if not names:
        return module
    spec = importlib.util.spec_from_file_location(f"{name}_judged_alone", module.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickle look a class's module up there
    spec.loader.exec_module(module)
    solution = load("solutions", name)
    for wanted in names:
        owner, _, attribute = wanted.rpartition(".")
        if not owner and attribute in vars(solution):
            setattr(module, attribute, getattr(solution, attribute))
            continue
        classes = [cls_name for cls_name, cls in vars(solution).items()
                   if isinstance(cls, type) and cls.__module__ == solution.__name__ and attribute in vars(cls)
                   and cls_name == (owner or cls_name)]
        if len(classes) != 1:
            raise ValueError(f"load_with_reference: '{wanted}' names {len(classes)} methods of classes in "
                             f"solutions/{name}.py ({classes}): name a function or Class.method there")
        # vars(), not getattr: a staticmethod or classmethod stays one
        setattr(getattr(module, classes[0]), attribute, vars(getattr(solution, classes[0]))[attribute])
    return module


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


def pytest_report_header(config):
    impl = config.getoption("--impl")
    where = "solutions/" if impl == "solutions" else "the template_*.py files (your code)"
    gpus = torch.cuda.device_count()
    return [f"checking: {where}", f"GPUs: {gpus or 'none (GPU tests are skipped)'}"]
