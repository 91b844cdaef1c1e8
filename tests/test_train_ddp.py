"""train_ddp.py end to end: torchrun training, clear errors, and the CIFAR-10 path offline."""
import contextlib
import csv
import functools
import hashlib
import http.server
import io
import os
import pickle
import subprocess
import sys
import tarfile
import threading
import warnings

import numpy as np
import pytest
import torch

import data
import train_ddp
from conftest import REFERENCE
from harness import run_ranks
from mistakes import Mistake, make_submission

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, cwd=REPO, timeout=150):
    """Run a command in its own process group; kill all of it (torchrun's ranks too) on timeout."""
    return finish(start(args, cwd), timeout)


def start(args, cwd=REPO):
    """A command started in its own process group, its stderr into its stdout; finish() waits for it."""
    return subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def finish(proc, timeout):
    """(exit code, output) of a start()ed command; all of it is killed if it runs past `timeout` s."""
    done = ended(proc, timeout)
    return done.returncode, done.stdout


def ended(proc, timeout):
    """The CompletedProcess of a command started in its own process group (start_new_session=True);
    the whole group is killed, and the test fails, if it runs past `timeout` s."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(proc.args)} did not finish within {timeout} s (a hang?); its output:\n{out}{err or ''}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
# 16 steps an epoch of 32 images a rank: after 2 epochs 75-86% test accuracy (seeds 0 and 1, --impl solutions
# and ddp), well above _learned's 50% (and 31-32% after the first); with an optimizer step that does nothing
# (lr 0) both end-to-end tests fail. 1536 images (24 steps, 92-94%) took 0.4 s longer; 768 gave 70-80%, and
# 3072 images in batches of 128 (95-97%) twice the default run's time.
QUICK = ["--data", "synthetic", "--epochs", "2", "--train-samples", "1024", "--test-samples", "500",
         "--batch-size", "64"]


def _learned(rows, out):
    """Two epochs in the metrics, the loss falling, the test accuracy well above chance."""
    assert [int(r["epoch"]) for r in rows] == [1, 2], rows
    losses = [float(r["train_loss"]) for r in rows]
    accuracy = float(rows[-1]["test_accuracy"])
    assert losses[1] < losses[0], f"the training loss did not fall: {losses}\n{out}"
    assert accuracy > 0.5, f"test accuracy {accuracy:.2%} is not well above chance (10%)\n{out}"


@pytest.mark.e2e
@pytest.mark.slow  # torchrun and 3 interpreters importing torch: 9-14 s, the default run's longest
def test_torchrun_training_learns_and_keeps_ranks_identical(impl, tmp_path):
    """With the files under test (solutions/, or yours with --impl template), launched by torchrun."""
    metrics = tmp_path / "metrics.csv"
    code, out = run(TORCHRUN + ["train_ddp.py", "--impl", impl, *QUICK, "--metrics", str(metrics)])
    assert code == 0, out
    assert "world_size=2" in out and "ranks consistent: all 2 ranks hold bit-identical parameters" in out, out
    with open(metrics) as f:
        _learned(list(csv.DictReader(f)), out)
    assert out.count("test accuracy") == 2, "rank 0 alone prints one line per epoch"
    assert f"plot: {metrics.with_suffix('.png')}" in out and metrics.with_suffix(".png").stat().st_size, out


def _train_in_rank(rank, world_size, argv):
    """train_ddp.py's training with the flags `argv` in a harness rank (in a gloo group already), with the
    variables torchrun sets for each of its processes on one node (OMP_NUM_THREADS=1: "to avoid your system
    being overloaded"); (exit code, what it printed, then its warnings, as torchrun's output holds both). The
    environment and threads are put back after."""
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
           "LOCAL_WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1"}
    saved, threads = {name: os.environ.get(name) for name in env}, torch.get_num_threads()
    os.environ.update(env)
    try:
        args = train_ddp.parse_args(argv)
        # a rank forked from pytest's process inherits pytest's warning capture: its warnings are recorded
        # here, shown as a new interpreter would show them (once a place; no DeprecationWarning)
        with contextlib.redirect_stdout(io.StringIO()) as printed, warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("default")
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            code = train_ddp.train(args, rank, world_size, torch.device("cpu"))
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.update({name: value})
        torch.set_num_threads(threads)
    return code, printed.getvalue() + "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                                              for w in warned)


def train_in_ranks(ranks, argv, timeout=240):
    """`torchrun --nproc_per_node=ranks train_ddp.py *argv` without torchrun: train_ddp.train on `ranks`
    harness ranks; [(exit code, what it printed)] by rank. torchrun and main() are checked end to end by
    test_torchrun_training_learns_and_keeps_ranks_identical; a run here starts no interpreter (under
    torchrun one a rank and torchrun's own, each importing torch: most of such a short run's time)."""
    return run_ranks(_train_in_rank, ranks, list(argv), timeout=timeout)


def trained(ranks, argv, tmp_path, timeout=240):
    """(the figures of every epoch, what the ranks printed) of train_in_ranks(ranks, argv + --metrics in
    tmp_path, made if missing): [{"train_loss": ..., "test_loss": ..., "test_accuracy": ...}, ...]. Every rank
    must end with 0."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    metrics = tmp_path / "metrics.csv"
    runs = train_in_ranks(ranks, [*argv, "--metrics", str(metrics)], timeout=timeout)
    out = "".join(printed for _, printed in runs)
    assert [code for code, _ in runs] == [0] * ranks, out[-3000:]
    with open(metrics) as f:
        rows = list(csv.DictReader(f))
    return [{name: float(row[name]) for name in ("train_loss", "test_loss", "test_accuracy")} for row in rows], out


@pytest.mark.e2e
def test_pytorch_ddp_training_learns_and_keeps_ranks_identical(impl, tmp_path):
    """The same training with --impl ddp (PyTorch's DDP and DistributedSampler). torchrun and main() are
    the test above's: here train_ddp.train runs in 2 ranks the harness started (2 starts of torch and
    torchrun's fewer, the default run's time), as tests/test_checkpoint.py's resumed runs do."""
    if impl == "template":
        pytest.skip("--impl ddp uses PyTorch's DDP, not your code (plain pytest runs it)")
    metrics = tmp_path / "metrics.csv"
    (code0, out), (code1, out1) = train_in_ranks(2, ["--impl", "ddp", *QUICK, "--metrics", str(metrics), "--no-plot"],
                                                 timeout=150)
    assert (code0, code1) == (0, 0), out + out1
    assert "world_size=2" in out and "ranks consistent: all 2 ranks hold bit-identical parameters" in out, out
    with open(metrics) as f:
        _learned(list(csv.DictReader(f)), out)
    assert out.count("test accuracy") == 2 and out1 == "", f"rank 0 alone prints one line per epoch:\n{out1}"


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """The two commands that train_ddp.py refuses, started side by side (each starts torch, and 2 cores
    take both at once: the default run's time); each test below waits for its own."""
    stub = Mistake("2.3", "unfilled", "template_trainer.py",
                   "    dist.all_reduce(sums, op=dist.ReduceOp.SUM)\n",
                   '    raise NotImplementedError("Task 2.3: reduce_metrics() is not done yet")\n', "")
    repo = make_submission(str(tmp_path_factory.mktemp("unfilled") / "repo"), [stub])
    started = {"unfilled": start([sys.executable, "train_ddp.py", "--data", "synthetic"], cwd=repo),
               # a global batch of 0: refused on any machine
               "setting": start([sys.executable, "train_ddp.py", "--impl", REFERENCE, "--data", "synthetic",
                                 "--train-samples", "64", "--epochs", "1", "--batch-size", "0"])}
    yield started
    for proc in started.values():  # a test left out (-k): its command ends with the module
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.communicate()


@pytest.mark.repo
@pytest.mark.slow  # this and the next start two interpreters (the fixture): 2-3 s of the default run
def test_an_unfilled_task_stops_training_with_one_clear_message(refused):
    code, out = finish(refused["unfilled"], timeout=60)
    assert code == 1, out
    assert "Task 2.3 in template_trainer.py is not done yet" in out and f"--impl {REFERENCE}" in out, out
    assert "python check.py 2.3" in out, out
    assert "Traceback" not in out, out


@pytest.mark.repo
@pytest.mark.slow
def test_a_setting_that_cannot_work_gives_one_line(refused):
    """A refused setting is a ValueError out of main(), which the script's __main__ turns into one
    line and exit code 2. The script runs once, for that path (a global batch of 0, refused on any
    machine); the NCCL refusal takes the same path and is checked in this process, one start of
    torch fewer (the default run's time), as is test_compression.py's refused --compress bf16."""
    code, out = finish(refused["setting"], timeout=60)
    assert code == 2 and "smaller than the world size" in out and out.count("\n") == 1, out  # that line alone
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU, so NCCL works")
    with pytest.raises(ValueError, match="NCCL backend needs GPUs"):
        train_ddp.main(train_ddp.parse_args(["--impl", REFERENCE, "--data", "synthetic", "--train-samples", "64",
                                             "--epochs", "1", "--backend", "nccl"]))


# ------------------------------------------------- CIFAR-10, offline, in its real format
def write_tiny_cifar(root, per_batch=4, test=6):
    """CIFAR-10's own layout (cifar-10-batches-py/ of pickled batches) and its .tar.gz, tiny.

    Returns the md5 sums torchvision must expect, the archive's path and the images."""
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    images = {}
    for name in names:
        n = test if name == "test_batch" else per_batch
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 "labels": rng.integers(0, 10, n).tolist(), "batch_label": name}
        images[name] = batch
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(batch, f)
    with open(os.path.join(folder, "batches.meta"), "wb") as f:
        pickle.dump({"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                                     "ship", "truck"]}, f)
    md5 = {name: hashlib.md5(open(os.path.join(folder, name), "rb").read()).hexdigest()
           for name in names + ["batches.meta"]}
    archive = os.path.join(root, "cifar-10-python.tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    md5["archive"] = hashlib.md5(open(archive, "rb").read()).hexdigest()
    return md5, archive, images


def _use_tiny_cifar(md5, url):
    """Point torchvision's CIFAR10 at the tiny copy: its checksums and a local URL."""
    from torchvision.datasets import CIFAR10

    CIFAR10.url = url
    CIFAR10.tgz_md5 = md5["archive"]
    CIFAR10.train_list = [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)]
    CIFAR10.test_list = [["test_batch", md5["test_batch"]]]
    CIFAR10.meta = {**CIFAR10.meta, "md5": md5["batches.meta"]}


def _get_cifar(rank, world_size, choice, root, md5, url):
    import torchvision.datasets.cifar as cifar

    _use_tiny_cifar(md5, url)
    downloads = []
    fetch = cifar.download_and_extract_archive
    cifar.download_and_extract_archive = lambda *a, **k: downloads.append(a) or fetch(*a, **k)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        # at most 64 + 16 images, as --train-samples and --test-samples ask: the tiny CIFAR-10 holds 20 + 6,
        # and --data auto's synthetic fallback makes only those (what is tested is which set and what is said)
        train, test, name = data.get_datasets(choice, root, train_samples=64, test_samples=16)
    return name, len(train), len(test), train[0][0], train[0][1], test[5][1], len(downloads), printed.getvalue()


@pytest.fixture
def cifar_server(tmp_path):
    """Serve the tiny archive over HTTP on a free port, counting the downloads."""
    source = tmp_path / "source"
    md5, archive, images = write_tiny_cifar(str(source))
    downloads = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            downloads.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Handler, directory=str(source)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz"
    yield md5, url, images, downloads
    server.shutdown()


@pytest.mark.repo
def test_cifar10_is_downloaded_by_rank_0_only_and_read_by_torchvision(tmp_path, cifar_server):
    md5, url, images, requests = cifar_server
    root = str(tmp_path / "data")
    results = run_ranks(_get_cifar, 2, "cifar10", root, md5, url, timeout=60)
    downloads = [r[-2] for r in results]
    assert downloads == [1, 0], f"downloads by rank: {downloads}; rank 0 alone should download, once"
    assert requests, "the archive was not fetched from the (local) URL"
    first = images["data_batch_1"]
    pixel = torch.tensor(first["data"][0], dtype=torch.float32).reshape(3, 32, 32) / 255
    expected = (pixel - torch.tensor(data.CIFAR10_MEAN)[:, None, None]) / torch.tensor(data.CIFAR10_STD)[:, None, None]
    for name, n_train, n_test, image, label, test_label, _, _ in results:
        assert (name, n_train, n_test) == ("cifar10", 20, 6)
        assert torch.allclose(image, expected, atol=1e-6) and label == first["labels"][0]
        assert test_label == images["test_batch"]["labels"][5]


@pytest.mark.repo
def test_auto_falls_back_to_synthetic_loudly_when_cifar10_cannot_be_had(tmp_path, cifar_server):
    md5, _, _, _ = cifar_server
    dead_url = "http://127.0.0.1:9/cifar-10-python.tar.gz"  # the discard port: nothing listens there
    results = run_ranks(_get_cifar, 2, "auto", str(tmp_path / "empty"), md5, dead_url, timeout=60)
    assert [r[0] for r in results] == ["synthetic", "synthetic"]
    assert "Training on the built-in SYNTHETIC data set" in results[0][-1], "rank 0 must say so, loudly"
    assert results[1][-1] == "", "rank 0 alone prints the notice"


@pytest.mark.repo
def test_cifar10_that_cannot_be_had_is_an_error_that_says_what_to_do(tmp_path, cifar_server):
    md5, _, _, _ = cifar_server
    with pytest.raises(AssertionError, match="--data synthetic"):
        run_ranks(_get_cifar, 1, "cifar10", str(tmp_path / "empty"), md5, "http://127.0.0.1:9/x.tar.gz", timeout=60)


@pytest.mark.repo
def test_a_run_that_reads_fewer_synthetic_images_reads_the_first_ones_of_the_whole_set():
    """--train-samples / --test-samples: only the images a run reads are made, and they are the whole
    set's first ones, bit for bit (a quick run trains on the first 1024 of the images a full run reads)."""
    train, test, name = data.get_datasets("synthetic", "unused", 3, 17, 5)  # as train_ddp.py calls it
    assert (name, len(train), len(test)) == ("synthetic", 17, 5)
    whole_train, whole_test = data.synthetic_cifar(num_train=96, num_test=40, seed=3)
    for n_train, n_test in [(1, 1), (17, 40), (96, 0), (500, 7)]:
        train, test = data.synthetic_cifar(96, 40, 3, train_samples=n_train, test_samples=n_test)
        for part, whole, n in [(train, whole_train, n_train), (test, whole_test, n_test)]:
            n = min(n, len(whole))
            assert len(part) == n and all(torch.equal(mine, every[:n]) for mine, every in zip(part.tensors, whole.tensors)), (
                f"synthetic_cifar(train_samples={n_train}, test_samples={n_test}): not the first {n} images of the whole set")


@pytest.mark.repo
@pytest.mark.parametrize("flags", [["--allreduce", "ring"], ["--allreduce", "naive"], ["--pp", "2"],
                                   ["--pp", "2", "--impl", "ddp"]])
def test_send_and_recv_over_gloo_on_a_gpu_are_refused_in_one_line(flags, monkeypatch):
    """gloo sends CPU tensors only: on a GPU node, --backend gloo gives CUDA tensors, and send/recv
    abort the process ("writev ... Bad address", torch 2.11 on an H200). Refused before anything starts."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun --nproc_per_node=2 sets it
    args = train_ddp.parse_args(["--impl", REFERENCE, "--data", "synthetic", "--backend", "gloo", *flags])
    with pytest.raises(ValueError, match="gloo does for CPU tensors only") as refused:
        train_ddp.check_flags(args)
    assert f"{flags[0]} {flags[1]}" in str(refused.value) and "CUDA_VISIBLE_DEVICES=" in str(refused.value), refused.value
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    train_ddp.check_flags(args)  # on CPUs the same flags train
