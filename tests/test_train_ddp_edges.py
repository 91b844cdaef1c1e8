"""train_ddp.py at its edges: what a user who stops it, or feeds it settings that train nothing, sees.

    pytest tests/test_train_ddp_edges.py           # the quick ones
    pytest -m slow tests/test_train_ddp_edges.py   # Ctrl-C, with a real signal to real processes
"""
import csv
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import data
import train_ddp
from grading.course import untouched
from strategies.course_files import unfilled_task
from support import checkpoint
from test_train_ddp import ended  # a started command's result, killed whole on a timeout

pytestmark = pytest.mark.repo  # the course's own script, not a student's task

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = ["--impl", "solutions", "--data", "synthetic", "--test-samples", "100"]


def test_training_needs_only_the_task_its_allreduce_uses(tmp_path):
    """--allreduce ring with Task 3.2 done and 3.1 not yet must train (ring needs only 3.2)."""
    template = untouched("template_allreduce.py")  # as handed out, whatever state this clone's own is in
    (tmp_path / "template_allreduce.py").write_text(template)
    ring = unfilled_task("template", [("template_allreduce.py", "ring_all_reduce")], root=str(tmp_path))
    naive = unfilled_task("template", [("template_allreduce.py", "naive_all_reduce")], root=str(tmp_path))
    assert (ring[0], naive[0]) == ("Task 3.2", "Task 3.1"), (ring, naive)
    with open(os.path.join(REPO, "solutions", "template_allreduce.py")) as f:
        solution = f.read()
    ring_done = template[:template.index("\ndef ring_all_reduce(")] + solution[solution.index("\ndef ring_all_reduce("):]
    (tmp_path / "template_allreduce.py").write_text(ring_done)
    assert unfilled_task("template", [("template_allreduce.py", "ring_all_reduce")], root=str(tmp_path)) is None
    assert unfilled_task("template", [("template_allreduce.py", "naive_all_reduce")],
                         root=str(tmp_path))[0] == "Task 3.1"


@pytest.mark.parametrize("epochs", ["0", "-1"])
def test_no_epochs_is_an_error(epochs):
    with pytest.raises(ValueError, match=f"--epochs {epochs}: train for at least one epoch"):
        train_ddp.main(train_ddp.parse_args(QUICK + ["--epochs", epochs]))


@pytest.mark.slow  # about 5 s: a real run of the script
def test_fewer_samples_than_one_global_batch_is_one_line_and_an_error():
    proc = subprocess.run([sys.executable, "train_ddp.py", *QUICK, "--train-samples", "100", "--epochs", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "error: 100 training images do not fill one global batch of 512" in proc.stderr, out
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in out, out


def test_a_failed_download_leaves_no_folders(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10

    monkeypatch.setattr(CIFAR10, "url", "http://127.0.0.1:9/cifar-10-python.tar.gz")  # refused at once
    root = tmp_path / "nonexistent" / "deep" / "dir"
    sets, problem = data._load_cifar10(str(root), download=True)
    assert sets is None and problem
    assert not (tmp_path / "nonexistent").exists(), "a failed download must not leave the folders it made"
    kept = tmp_path / "kept"
    kept.mkdir()
    data._load_cifar10(str(kept), download=True)
    assert kept.is_dir(), "a folder that was there before stays"


def _interrupt(command, signum):
    """Start training, send `signum` to the whole process group (what Ctrl-C in a terminal does)
    once it trains, and return (exit code, output)."""
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            lines.append(proc.stdout.readline())
            if "steps/epoch=" in lines[-1] or not lines[-1]:
                break
        time.sleep(2)  # training by now (an epoch can take less than that: TRAIN runs many)
        os.killpg(proc.pid, signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, "".join(lines) + out


# 100 epochs: far more than 2 s on any machine, so the signal always finds it training (one epoch
# of the synthetic data can take under 2 s, and a run that ended first would exit 0).
TRAIN = ["train_ddp.py", *QUICK, "--batch-size", "64", "--epochs", "100"]
TRAINING = r"interrupted at epoch \d+ step \d+"  # not "at start-up": the signal came while it trained


@pytest.mark.slow
def test_ctrl_c_prints_one_line_and_exits_130():
    code, out = _interrupt([sys.executable, *TRAIN, "--workers", "2"], signal.SIGINT)  # workers get it too
    assert code == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    stopped = [line for line in out.splitlines() if "interrupted at" in line]
    assert len(stopped) == 1 and re.fullmatch(TRAINING, stopped[0]), out


@pytest.mark.slow
def test_under_torchrun_each_rank_prints_one_line():
    """torchrun passes the signal on to its workers; its own SignalException traceback is torchrun's."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    code, out = _interrupt(launch + TRAIN, signal.SIGINT)
    assert code != 0, out
    for rank in (0, 1):
        mine = [line for line in out.splitlines() if f"[rank {rank}]" in line or f"[rank{rank}]" in line]
        assert len(mine) == 1 and re.search(rf"\[rank {rank}\] {TRAINING}$", mine[0]), out
    assert "KeyboardInterrupt" not in out, out


@pytest.mark.parametrize("flag", ["--metrics", "--profile"])
def test_an_unwritable_output_path_is_refused_before_training(flag, tmp_path):
    """Issue 23: an unwritable --metrics or --profile path failed after the first epoch, with a traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=f"{flag} {blocker}/out: {blocker} is a file, not a folder"):
        train_ddp.check_flags(train_ddp.parse_args(QUICK + [flag, str(blocker / "out")]))
    assert train_ddp.check_flags(train_ddp.parse_args(QUICK + [flag, str(tmp_path / "new" / "out")]))


def test_sigterm_at_start_up_points_at_the_rank_that_failed():
    """torchrun stops every rank with SIGTERM when one exits with an error: the others used to say
    'interrupted at start-up', which reads as a Ctrl-C."""
    proc = subprocess.run([sys.executable, "-c", "import signal, support.interrupt as i; "
                           "i.stop_on_interrupt(signal.SIGTERM, None)"],
                          cwd=REPO, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "RANK": "1", "TORCHELASTIC_RUN_ID": "none"})  # as torchrun sets it
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.startswith("[rank 1] stopped at start-up (SIGTERM): torchrun stops every rank when one "
                                  "fails, so look above for another rank's error"), proc.stderr


@pytest.mark.slow  # two real runs of the script, about 10 s
def test_a_resumed_run_keeps_the_metrics_history(tmp_path):
    """Issue 23: after a resume (--checkpoint-dir, a torchrun restart, a SLURM requeue) the CSV and
    its PNG held only the new epochs."""
    metrics = tmp_path / "metrics.csv"
    run = [sys.executable, "train_ddp.py", *QUICK, "--train-samples", "256", "--batch-size", "64",
           "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics", str(metrics)]
    for epochs in ("1", "2"):
        proc = subprocess.run(run + ["--epochs", epochs], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(metrics) as f:
        rows = list(csv.DictReader(f))
    assert [row["epoch"] for row in rows] == ["1", "2"], rows
    assert float(rows[0]["train_loss"]) > 0, rows


@pytest.mark.slow  # a release made, then three interpreters importing torch: 5-6 s of the default run
def test_a_student_release_trains_with_the_students_files_only(tmp_path):
    """tools/student_release.py leaves solutions/ out: --impl solutions (train_ddp.py and check.py)
    says so in one line, and --impl ddp, which shares the evaluation loaders and counts with our code,
    takes the student's."""
    release = tmp_path / "release"
    subprocess.run([sys.executable, "tools/student_release.py", str(release)], cwd=REPO, check=True,
                   capture_output=True, timeout=60)
    quick = ["--data", "synthetic", "--train-samples", "256", "--epochs", "1", "--no-plot"]
    # the three commands side by side (each starts torch, and 2 cores take two at once: the default run's time)
    started = [subprocess.Popen([sys.executable, *command], cwd=release, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
               for command in (["train_ddp.py", "--impl", "solutions", *quick], ["train_ddp.py", "--impl", "ddp", *quick],
                               ["check.py", "--impl", "solutions"])]
    solutions, ddp, check = [ended(proc, 60) for proc in started]
    assert solutions.returncode == 2 and "--impl solutions trains with the reference answers, which this copy of the " \
        "course does not have" in solutions.stderr, solutions.stdout + solutions.stderr
    assert ddp.returncode == 1, ddp.stdout + ddp.stderr
    assert "Task 1.1 in template_data_loader.py is not done yet, so training with --impl ddp cannot start" in \
        ddp.stdout and "--impl solutions" not in ddp.stdout, ddp.stdout + ddp.stderr
    assert check.returncode == 2 and "--impl solutions checks the reference answers, which this copy of the course " \
        "does not have" in check.stderr, check.stdout + check.stderr


# ------------------------------------------------- issue 23, items 9 and 11, end to end
SMALL = [*QUICK, "--train-samples", "256", "--batch-size", "32", "--test-samples", "64", "--no-plot"]


def _script(args, timeout=180):
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--metrics", "--profile"])
def test_an_unwritable_metrics_or_profile_path_is_one_line_before_training(flag, tmp_path):
    """As --checkpoint-dir is: checked before the first step, one line, exit code 2."""
    target = tmp_path / "missing" / "deeper" / ("m.csv" if flag == "--metrics" else "profile")
    (tmp_path / "missing").write_text("a file where a folder should be")  # no folder can be made under it
    code, out = _script([sys.executable, "train_ddp.py", *SMALL, "--epochs", "1", flag, str(target)])
    assert code == 2 and "Traceback" not in out, out
    assert flag in out and "epoch 1/1" not in out, f"{flag} must be checked before training:\n{out}"


@pytest.mark.slow
@pytest.mark.parametrize("setting,error", [
    (["--epochs", "0"], "--epochs 0: train for at least one epoch"),  # refused before the process group
    (["--accumulate", "3"], "the global batch 32 does not split into 2 ranks x 3"),  # refused inside train()
])
def test_a_setting_refused_under_torchrun_is_said_once_and_not_retried(setting, error):
    """Under torchrun no rank may read as interrupted (exit 130, like a Ctrl-C) because another rank
    exited first, and with --max-restarts a setting that cannot work must stop the job, not run again
    at every restart (issue 23 item 11: it came 3 times with --max-restarts=2)."""
    code, out = _script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                         "--max-restarts=2", "train_ddp.py", *SMALL, *setting])
    assert code != 0, out
    assert "interrupted at" not in out, out
    errors = [line for line in out.splitlines() if error in line and "rank 1" not in line]
    assert len(errors) == 1, f"the error came {len(errors)} times from rank 0 (once per restart?):\n{out}"
    assert out.count("stopping torchrun instead of restarting (2 of --max-restarts left)") == 1, out


@pytest.mark.slow
def test_a_task_not_done_under_torchrun_is_said_once_and_not_retried(tmp_path):
    """A TODO is as final as a wrong flag: with --max-restarts it must not be met at every restart."""
    from mistakes import Mistake, make_submission
    stub = Mistake("2.3", "unfilled", "template_trainer.py", "    dist.all_reduce(sums, op=dist.ReduceOp.SUM)\n",
                   '    raise NotImplementedError("Task 2.3: reduce_metrics() is not done yet")\n', "")
    repo = make_submission(str(tmp_path / "repo"), [stub])
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "--max-restarts=2", "train_ddp.py", *SMALL[2:]], cwd=repo, capture_output=True,
                          text=True, timeout=180, start_new_session=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "interrupted at" not in out, out
    assert out.count("Task 2.3 in template_trainer.py is not done yet") == 1, out
    assert out.count("stopping torchrun instead of restarting (2 of --max-restarts left)") == 1, out


def test_only_a_torchrun_worker_with_restarts_left_stops_its_parent():
    """stop_torchrun_restarts() SIGTERMs the parent process (torchrun's agent) only under torchrun
    and while a restart is left; otherwise the parent (here a shell) lives on."""
    call = (f"import sys; sys.path.insert(0, {REPO!r}); from support.interrupt import stop_torchrun_restarts; "
            "print(stop_torchrun_restarts())")
    # The shell waits 0.5 s after its child unless the child stops it. os.kill() has made the SIGTERM
    # pending on the shell (blocked in wait() for the child) before the child can exit, so a stopped shell
    # never runs its sleep: the wait is a margin, not a race (it was 2 s: 1.5 s of the default run).
    def parent_after(**env):
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
        return subprocess.Popen(["bash", "-c", f"{sys.executable} -c \"{call}\"; sleep 0.5"], env={**clean, **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    restarts = {"TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_MAX_RESTARTS": "3"}
    # the three shells side by side: their sleeps overlap (the default run's time)
    started = [parent_after(), parent_after(**restarts, TORCHELASTIC_RESTART_COUNT="3"),
               parent_after(**restarts, TORCHELASTIC_RESTART_COUNT="1")]
    plain, last, stopped = [ended(proc, 60) for proc in started]
    assert plain.returncode == 0 and plain.stdout == "None\n", plain
    assert last.returncode == 0 and last.stdout == "None\n", last
    assert stopped.returncode == -signal.SIGTERM, stopped
    assert "2 of --max-restarts left" in stopped.stdout, stopped


def test_checkpoints_need_tasks_8_3_and_8_4_only_when_sharded(tmp_path):
    """--checkpoint-dir with Tasks 8.1 and 8.2 done and 8.3 not yet must train unsharded (8.3 and 8.4
    write and read the sharded files of --shard optimizer and full)."""
    fence = re.compile(r"^[ \t]*# --- Task (8\.[34]) begin ---\n.*?^[ \t]*# --- Task \1 end ---\n", re.M | re.S)
    template = {m.group(1): m.group(0) for m in fence.finditer(untouched("template_checkpoint.py"))}
    with open(os.path.join(REPO, "solutions", "template_checkpoint.py")) as f:
        solution = f.read()
    (tmp_path / "template_checkpoint.py").write_text(fence.sub(lambda m: template[m.group(1)], solution))
    plain, sharded = (train_ddp.parse_args(["--checkpoint-dir", "ckpt", *shard]) for shard in ([], ["--shard", "full"]))
    assert unfilled_task("template", checkpoint.tasks_needed(plain), root=str(tmp_path)) is None
    assert unfilled_task("template", checkpoint.tasks_needed(sharded), root=str(tmp_path)) == (
        "Task 8.3", "template_checkpoint.py")


@pytest.mark.slow  # two real runs of the script
def test_a_checkpoint_past_the_last_epoch_says_there_is_nothing_to_train(tmp_path):
    """Issue 23: with a checkpoint of 2 epochs and --epochs 1 the run ended without a word."""
    run = [sys.executable, "train_ddp.py", *QUICK, "--train-samples", "256", "--batch-size", "64", "--no-plot",
           "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics", ""]
    for epochs in ("2", "1"):
        proc = subprocess.run(run + ["--epochs", epochs], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{tmp_path / 'ckpt'} holds 2 epochs already, --epochs 1: nothing to train" in proc.stdout, proc.stdout


# --- strategies/: features in front of the strategy, the end-of-run check ------------------------

def test_a_feature_runs_in_front_of_the_strategy_the_flags_choose():
    """--shard optimizer is a feature: the chosen class is ShardOptimizerState in front of the strategy,
    so its needs() adds Task 6's file to the strategy's and every other method is the strategy's."""
    from strategies.data_parallel import OurDDP
    from strategies.sharded import ShardOptimizerState

    chosen = train_ddp.check_flags(train_ddp.parse_args(QUICK + ["--sync", "overlap", "--shard", "optimizer"]))
    assert chosen.__mro__[1] is ShardOptimizerState and issubclass(chosen, OurDDP), chosen.__mro__
    assert chosen.needs(train_ddp.parse_args(QUICK)) == OurDDP.files + ["template_zero.py"]
    assert chosen.wrap is OurDDP.wrap and chosen.name == OurDDP.name
    assert train_ddp.check_flags(train_ddp.parse_args(QUICK + ["--sync", "overlap"])) is OurDDP


def _differing(rank, world_size):
    """base.Strategy's end-of-run check on a model whose rank 1 differs in one weight and one buffer."""
    import torch
    from strategies.base import Strategy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    lines = [Strategy.consistency(Strategy.__new__(Strategy), model)]
    if rank == 1:
        with torch.no_grad():
            model[0].weight[1, 2] += 1e-7  # one float's last bits
        model[1].num_batches_tracked += 1  # an integer buffer
    lines.append(Strategy.consistency(Strategy.__new__(Strategy), model))
    return lines


def test_the_end_of_run_check_names_the_tensors_in_which_ranks_differ():
    from harness import run_ranks

    for rank, (before, after) in enumerate(run_ranks(_differing, 3)):
        assert before == (True, "ranks consistent: all 3 ranks hold bit-identical parameters"), (rank, before)
        assert after[0] is False and "ranks INCONSISTENT: the 3 ranks' parameters differ (0.weight, " \
            "1.num_batches_tracked)" in after[1], (rank, after)
