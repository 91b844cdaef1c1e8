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

@pytest.fixture
def broken_torchvision(tmp_path):
    """A PYTHONPATH on which `import torchvision` fails as a mismatched build does."""
    package = tmp_path / "site" / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    return str(tmp_path / "site")


def _get_datasets_in_rank(rank, world_size, choice, roots, pythonpath):
    """What get_datasets(choice, root) printed for each root, in a harness rank (torch is imported there
    already: a subprocess would import it again, seconds of the default run). `pythonpath` goes first on
    sys.path and torchvision is imported afresh, as in a new process; all is put back after."""
    import contextlib
    import io

    import data
    theirs = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] == "torchvision"}
    sys.path[:0] = [pythonpath]
    printed = []
    try:
        for root in roots:
            with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(out):
                try:
                    # which set, not its images: one of each is made
                    print("NAME", data.get_datasets(choice, root, train_samples=1, test_samples=1)[2])
                except ValueError as error:
                    print("ERROR", error)
            printed.append(out.getvalue())
    finally:
        sys.path.remove(pythonpath)
        for name in [name for name in sys.modules if name.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.modules.update(theirs)
    return printed


def _get_datasets(choice, roots, pythonpath):
    """What get_datasets(choice, root) printed for each root, in one process."""
    from harness import run_ranks
    return run_ranks(_get_datasets_in_rank, 1, choice, roots, pythonpath, timeout=120)[0]


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


def test_check_env_says_what_is_installed_and_what_to_fix(tmp_path, monkeypatch, capsys):
    import torch
    import torchvision

    import check
    import data

    assert check.main(["--env", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"torch        {torch.__version__}" in out and "GPUs " in out, out
    assert f"torchvision  {torchvision.__version__}, matches torch" in out, out
    assert f"CIFAR-10     not in {tmp_path}" in out and "can run the course" in out, out
    (tmp_path / "cifar-10-batches-py").mkdir()
    check.main(["--env", "--data-dir", str(tmp_path)])
    assert f"CIFAR-10     on disk in {tmp_path}" in capsys.readouterr().out

    # a torchvision for another torch: named, with the one to install
    monkeypatch.setattr(torchvision, "__version__", "0.3.0")
    assert check.main(["--env"]) == 1
    out = capsys.readouterr().out
    assert f"goes with torchvision {data.matching_torchvision()}" in out and "To fix:" in out, out
    assert "--force-reinstall" in out, out
    # one that does not import at all
    monkeypatch.setattr(data, "torchvision_problem", lambda: "torchvision cannot be imported (RuntimeError: x). "
                        "Reinstall the torchvision that matches torch")
    assert check.main(["--env"]) == 1
    out = capsys.readouterr().out
    assert "torchvision  cannot be imported (RuntimeError: x)" in out and "Reinstall" in out, out


def test_the_readmes_start_works_when_copied_on_stock_debian_without_a_gpu():
    """Debian's and Ubuntu's Python refuse pip outside a virtual environment, and the generic
    install downloads the CUDA build: the laptop block makes the environment first, then
    installs the CPU wheels, then the requirements; the GPU-node block makes one too."""
    with open(os.path.join(REPO, "README.md")) as f:
        start = f.read().split("## Start\n", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("```", 1)[0].strip().splitlines() for block in start.split("```bash\n")[1:]]
    first = blocks[0]
    assert any("torchrun" in line and "train_ddp.py --impl solutions" in line for line in first) and \
        any(line.endswith("&& pytest") for line in first), "the two commands come first in the Start section"
    laptop = next(b for b in blocks if any("download.pytorch.org/whl/cpu" in line for line in b))
    step = {what: next(i for i, line in enumerate(laptop) if what in line)
            for what in ("python3 -m venv .venv && . .venv/bin/activate", "--index-url https://download.pytorch.org/whl/cpu",
                         "pip install -r requirements.txt")}
    assert list(step.values()) == sorted(step.values()) and min(step.values()) == 0, laptop
    gpu = [b for b in blocks if b is not laptop and b[0].startswith("python3 -m venv")]
    assert gpu and not any("whl/cpu" in line for line in gpu[0]), "a GPU-node variant, with the CUDA build"
    assert any("python check.py --env" in line for line in laptop), "the laptop block checks the set-up"


def test_the_ddp_benchmark_figure_shows_the_spread(monkeypatch, tmp_path):
    """The pages say the ratios move 10-30% under load: the bars carry the slowest and the fastest
    repetition as whiskers, read from the CSV's min_s and max_s."""
    bench = _benchmark("ddp_bench", monkeypatch)
    import matplotlib.axes

    drawn = []
    bar = matplotlib.axes.Axes.bar
    monkeypatch.setattr(matplotlib.axes.Axes, "bar", lambda self, *a, **k: drawn.append(k) or bar(self, *a, **k))
    rows = [{"model": "cnn", "parameters": 277610, "variant": "torch DDP", "steps_per_s": 50.0, "vs_torch_ddp": 1.0,
             "min_s": 0.01, "max_s": 0.04}]
    bench.plot(rows, str(tmp_path / "ddp_bench.png"))
    low, high = drawn[0]["yerr"]
    assert (low, high) == ([50.0 - 25.0], [100.0 - 50.0]) and (tmp_path / "ddp_bench.png").exists(), drawn


@pytest.mark.slow  # three pytests of their own, each collecting every test: started side by side on 2 cores
def test_pytest_takes_impl_with_a_space_or_an_equals_sign():
    """`pytest --impl solutions` stopped with "unrecognized arguments" (pytest took `solutions` for
    the folder to test before tests/conftest.py defined --impl); pytest.ini loads the option first."""
    started = {" ".join(impl): subprocess.Popen([sys.executable, "-m", "pytest", *impl, "--collect-only", "-q", "-m",
                                                 "task0_1"], cwd=REPO, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True)
               for impl in (["--impl", "solutions"], ["--impl", "template"], ["--impl=solutions"])}
    try:
        for impl, proc in started.items():
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"pytest {impl}:\n{out}"
            assert "tests/test_collectives.py::" in out, f"pytest {impl}:\n{out}"
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


_A_RANK_THAT_DIES = """
import sys, time
sys.path.insert(0, "benchmarks")
from bench_common import run_ranks


def fn(rank, world_size):
    if rank == 1:
        raise RuntimeError("rank 1 broke")
    time.sleep(600)  # rank 0 still at work, or in a collective that does not notice the dead rank
    return "unreachable"


start = time.monotonic()
try:
    run_ranks(2, fn)
except SystemExit as stop:
    print(f"stopped after {time.monotonic() - start:.0f} s: {stop}")
"""


@pytest.mark.slow
def test_a_benchmark_whose_rank_dies_stops_at_once():
    # bench_common.run_ranks waited for rank 0's result for 900 s while rank 0 waited for the dead one
    done = subprocess.run([sys.executable, "-c", _A_RANK_THAT_DIES], cwd=REPO, capture_output=True, text=True,
                          timeout=100)
    out = done.stdout + done.stderr
    assert "RuntimeError: rank 1 broke" in out, out
    assert "rank 1 of 2 failed (exit code 1; tracebacks above): the other ranks were stopped" in out, out
    assert int(out.split("stopped after ")[1].split(" s")[0]) < 60, out
