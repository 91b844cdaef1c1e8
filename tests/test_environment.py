"""A broken installation is said to be one, with what to reinstall (data.py, check.py --env).

    pytest tests/test_environment.py

A torchvision built for another torch fails at import ("operator torchvision::nms does not
exist"). It was reported as a failed CIFAR-10 download, and training went on with the
synthetic data set although CIFAR-10 was on disk.
"""
import importlib
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.repo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GET_DATASETS = """
import datetime, os, sys, tempfile
import torch.distributed as dist
import data
data.synthetic_cifar = lambda seed=0: ([], [])  # which set, not its images: making them takes seconds
dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tempfile.mkdtemp(), "s"), 1), rank=0, world_size=1)
for root in sys.argv[2:]:  # one process for several cases: importing torch takes seconds
    print("CASE", root, flush=True)
    try:
        print("NAME", data.get_datasets(sys.argv[1], root)[2], flush=True)
    except ValueError as error:
        print("ERROR", error, flush=True)
dist.destroy_process_group()
"""


@pytest.fixture
def broken_torchvision(tmp_path):
    """A PYTHONPATH on which `import torchvision` fails as a mismatched build does."""
    package = tmp_path / "site" / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    return str(tmp_path / "site")


def _get_datasets(choice, roots, pythonpath):
    """What get_datasets(choice, root) printed for each root, in one process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([pythonpath, REPO])}
    done = subprocess.run([sys.executable, "-c", GET_DATASETS, choice, *roots], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    cases = (done.stdout + done.stderr).split("CASE ")
    return cases[1:] if len(cases) == len(roots) + 1 else [done.stdout + done.stderr] * len(roots)


def test_a_broken_torchvision_is_named_not_taken_for_a_failed_download(tmp_path, broken_torchvision):
    on_disk = tmp_path / "data"
    (on_disk / "cifar-10-batches-py").mkdir(parents=True)
    out, empty = _get_datasets("auto", [str(on_disk), str(tmp_path / "empty")], broken_torchvision)
    # CIFAR-10 is there: training on something else would change the experiment
    assert "ERROR --data auto: CIFAR-10 needs torchvision" in out, out
    assert "RuntimeError: operator torchvision::nms does not exist" in out and "Reinstall the torchvision" in out, out
    assert "--force-reinstall" in out and "could not be downloaded" not in out and "NAME" not in out, out
    # nothing on disk: "auto" may fall back, and says why
    assert "NAME synthetic" in empty and "torchvision is broken" in empty, empty
    assert "could not be downloaded" not in empty, empty
    assert not (tmp_path / "empty").exists(), "no download may have been tried"


def _benchmark(name, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    return importlib.import_module(name)


@pytest.mark.parametrize("name", ["allreduce_bench", "ddp_bench", "memory_bench"])
def test_benchmarks_write_under_runs_and_refresh_the_committed_results_only_when_asked(name, monkeypatch):
    # a --quick try once replaced the README's figure in benchmarks/results/ (tracked by git)
    bench = _benchmark(name, monkeypatch)
    assert bench.parse_args([]).out == os.path.join(REPO, "runs", "benchmarks")
    assert bench.parse_args(["--update-results"]).out == os.path.join(REPO, "benchmarks", "results")
    assert bench.parse_args(["--out", "elsewhere"]).out == "elsewhere"
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "elsewhere", "--update-results"])


@pytest.mark.parametrize("name", ["ddp_bench", "memory_bench"])
def test_a_benchmark_stops_at_once_on_a_broken_torchvision(name, monkeypatch, capsys):
    bench = _benchmark(name, monkeypatch)
    import data

    monkeypatch.setattr(data, "torchvision_problem", lambda: "torchvision cannot be imported (RuntimeError: x). "
                        "Reinstall the torchvision that matches torch")
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--models", "resnet18"])
    with pytest.raises(SystemExit) as stop:
        bench.main()  # before any process starts
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "ResNet-18 needs torchvision" in err and "Reinstall the torchvision" in err and "--models cnn" in err, err
