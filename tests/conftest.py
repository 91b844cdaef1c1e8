"""Which files the tests check.

    pytest                      # solutions/ (instructors, CI)
    pytest --impl template      # your template_*.py files (students)
    pytest --impl template -m task1_2   # one task
"""
import importlib

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
    return importlib.import_module(("solutions." if impl == "solutions" else "") + name)


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
