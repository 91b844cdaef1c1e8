"""Launching for real: submit.sh under SLURM, and torchrun across two "nodes".

    pytest tests/test_launch.py   # the shell scripts' syntax, shellcheck, submit.sh outside SLURM
    pytest -m slurm        # sbatch submit.sh: one node, two nodes, a failing run (needs the test cluster:
                           #   sudo tools/slurm_test_cluster.sh start)
    pytest -m multinode    # two torchrun agents on loopback as two nodes would; sbatch --nodes=2

The jobs and the two agents are slow tests (CI runs `pytest -m slow` too): each waits for a scheduler
or a rendezvous and starts torchrun and ranks that import torch: 174 s of the default run's 1189 s at
load 10-33. The default run still launches train_ddp.py under torchrun (tests/test_train_ddp.py) and
checks these scripts' syntax and their message outside SLURM (below).

Each run is a tiny synthetic training on CPUs with 2 processes. Every subprocess has a hard
deadline and is killed (its whole process group, or scancel) when it passes: nothing hangs.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.repo  # launches the solutions: about the repository, not a student's tasks

REPO = Path(__file__).resolve().parent.parent
SHELL_SCRIPTS = ["submit.sh", "submit_srun.sh", "tools/slurm_test_cluster.sh", "tools/gpu_check.sh", ".ci/run"]
TINY_RUN = ["--impl", "solutions", "--data", "synthetic", "--epochs", "1",
            "--train-samples", "2048", "--test-samples", "512", "--metrics", ""]
# The same directory and variable as tools/slurm_test_cluster.sh. Only the test cluster is
# used, never a SLURM_CONF from the environment: a test must not submit to a real cluster.
SLURM_TEST_DIR = Path(os.environ.get("SLURM_TEST_DIR", "/tmp/slurm-test-cluster"))
START_CLUSTER = "apt-get install -y slurm-wlm munge, then: sudo tools/slurm_test_cluster.sh start"


def launch_env(**extra):
    """The environment for a launch: this interpreter's torchrun first on PATH, so the job
    runs the PyTorch that pytest runs, and the agents log their ranks (LOGLEVEL=INFO)."""
    env = dict(os.environ, LOGLEVEL="INFO", **extra)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def assert_trained_with_two_ranks(log):
    """What rank 0 prints when a 2-process run trains, evaluates and ends with equal replicas:
    the final check is a broadcast and an all_reduce, which only finish if both ranks join."""
    assert re.search(r"world_size=2 backend=gloo", log), f"no header with world_size=2 in:\n{log}"
    assert "test accuracy" in log, f"no accuracy line in:\n{log}"
    assert "ranks consistent: all 2 ranks hold bit-identical parameters" in log, f"no consistency line in:\n{log}"


# ---------------------------------------------------------------- shell scripts


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shell_syntax(script):
    result = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"bash -n {script}:\n{result.stderr}"


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shellcheck(script):
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck)")
    result = subprocess.run(["shellcheck", "--shell=bash", str(REPO / script)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"shellcheck {script}:\n{result.stdout}{result.stderr}"


@pytest.mark.slow  # a new interpreter importing torch: 3.6-5 s of the default run
def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    """tools/gpu_check.sh is for GPU nodes (docs/gpu.md); the processes tests start see no GPU (conftest.py)."""
    result = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh"), str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "tools/gpu_check.sh: PyTorch sees no GPU here; run it on a GPU node (nvidia-smi lists them)"], result


def test_submit_sh_outside_slurm_says_use_sbatch():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(["bash", str(REPO / "submit.sh")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "sbatch submit.sh" in result.stderr, result


# ---------------------------------------------------------------- sbatch submit.sh


def slurm(*args, env=None, timeout=20):
    env = dict(env or os.environ, SLURM_CONF=str(SLURM_TEST_DIR / "slurm.conf"))
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def slurm_nodes():
    """How many nodes of the test cluster can run jobs, or a skip that says how to start it."""
    if not shutil.which("sbatch"):
        pytest.skip(f"SLURM is not installed: {START_CLUSTER}")
    conf = SLURM_TEST_DIR / "slurm.conf"
    if not conf.exists():
        pytest.skip(f"no test SLURM cluster ({conf} is missing): {START_CLUSTER}")
    try:
        info = slurm("sinfo", "--noheader", "--Node", "--format=%t")
    except subprocess.TimeoutExpired:
        pytest.skip(f"the test SLURM cluster ({conf}) does not answer: {START_CLUSTER}")
    usable = len(re.findall(r"^(?:idle|mix|alloc)", info.stdout, re.MULTILINE))
    if info.returncode != 0 or usable == 0:
        pytest.skip(f"the test SLURM cluster ({conf}) is not ready ({(info.stdout + info.stderr).strip()}): "
                    f"{START_CLUSTER}")
    return usable


def job_state(job_id):
    show = slurm("scontrol", "show", "job", "--oneliner", job_id)
    fields = dict(f.split("=", 1) for f in show.stdout.split() if "=" in f)
    return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "?")


def sbatch(out_dir, sbatch_args, train_args, nproc_per_node, env):
    """Submit submit.sh from the repository folder; the job id. sbatch hands its
    environment, NPROC_PER_NODE included, to the job."""
    submitted = slurm("sbatch", "--parsable", f"--chdir={REPO}", f"--output={out_dir}/slurm-%j.out",
                      "--gpus-per-node=0", "--cpus-per-task=1", "--time=5", *sbatch_args,
                      str(REPO / "submit.sh"), *train_args,
                      env=launch_env(NPROC_PER_NODE=str(nproc_per_node), **env))
    assert submitted.returncode == 0, f"sbatch failed:\n{submitted.stderr}"
    return submitted.stdout.strip().split(";")[0]


# The test jobs, all on CPUs (--gpus-per-node=0) with one CPU per node (on a 2-core machine
# a test node has just one):
# name: (the test that checks it, sbatch options, train_ddp.py arguments, NPROC_PER_NODE, environment)
JOBS = {
    # as a student would on a CPU partition: one node, 2 processes. SETUP_CMD stands in for
    # `module load`, whose scripts read unset variables: submit.sh's `set -u` must allow that.
    "one_node": ("test_sbatch_submit_sh_trains_on_two_ranks", ["--nodes=1"], TINY_RUN, 2,
                 {"SETUP_CMD": 'echo "setup ran${NOT_SET_ANYWHERE}"'}),
    # a training error (NCCL asked for on CPUs); one process is enough to fail
    "fails": ("test_sbatch_job_fails_when_training_fails", ["--nodes=1"], [*TINY_RUN, "--backend", "nccl"], 1, {}),
    # two nodes, one process each: one torchrun per node, meeting at the first node's name
    "two_nodes": ("test_sbatch_submit_sh_on_two_nodes", ["--nodes=2"], TINY_RUN, 1, {}),
}


@pytest.fixture(scope="module")
def jobs(request, slurm_nodes, tmp_path_factory):
    """Submit the jobs of the selected tests at once, so that SLURM runs the two one-node
    jobs side by side, one on each node, and the two-node job after them; cancel whatever
    is left at the end."""
    out_dir = tmp_path_factory.mktemp("slurm")
    selected = {item.originalname for item in request.session.items}
    ids = {name: sbatch(out_dir, *spec) for name, (test, *spec) in JOBS.items()
           if test in selected and (name != "two_nodes" or slurm_nodes >= 2)}
    yield {name: (job_id, out_dir) for name, job_id in ids.items()}
    if ids:
        slurm("scancel", *ids.values())


def wait_for(jobs, name, deadline=180):
    """Poll until the job ends; (state, exit code, log). Not `sbatch --wait`: it polls at
    2, 8 and 32 s. A job still running at the deadline is cancelled and the test fails."""
    job_id, out_dir = jobs[name]
    end = time.monotonic() + deadline
    state, code = job_state(job_id)
    while state in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "UNKNOWN") and time.monotonic() < end:
        time.sleep(0.5)
        state, code = job_state(job_id)
    log_file = out_dir / f"slurm-{job_id}.out"
    log = log_file.read_text() if log_file.exists() else "(no log written)"
    if state in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        slurm("scancel", job_id)
        pytest.fail(f"job {job_id} was still {state} after {deadline} s and was cancelled. Log:\n{log}")
    return state, code, log


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sbatch_submit_sh_trains_on_two_ranks(jobs):
    """sbatch submit.sh on one node with 2 processes: completes, both ranks train."""
    state, code, log = wait_for(jobs, "one_node")
    assert (state, code) == ("COMPLETED", "0:0"), f"job ended {state} with exit code {code}. Log:\n{log}"
    assert_trained_with_two_ranks(log)
    # the one torchrun agent of this one-node job started both ranks
    assert "global_ranks=[0, 1]" in log, f"the agent did not report ranks 0 and 1:\n{log}"
    assert "setup ran" in log, f"SETUP_CMD did not run:\n{log}"
    assert "submit.sh: job" in log and "finished" in log, log


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sbatch_job_fails_when_training_fails(jobs):
    """A training error must fail the job with a non-zero exit code, not end it COMPLETED."""
    state, code, log = wait_for(jobs, "fails")
    assert state == "FAILED" and code != "0:0", f"job ended {state} with exit code {code}. Log:\n{log}"
    assert "training failed with exit code" in log, log


# ---------------------------------------------------------------- two torchrun agents


def free_port():
    """A port nobody listens on now. Another process could take it before torchrun binds
    it, a tiny race; a fixed port would collide whenever two runs share the machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_ranks(log):
    """(group_rank, global_ranks, group_world_size) from a torchrun agent's INFO log."""
    found = [re.search(pattern, log) for pattern in
             (r"group_rank=(\d+)", r"global_ranks=\[([\d, ]*)\]", r"group_world_size=(\d+)")]
    assert all(found), f"the agent did not log its rendezvous result (LOGLEVEL=INFO):\n{log}"
    group_rank, global_ranks, group_world_size = (m.group(1) for m in found)
    return int(group_rank), [int(r) for r in global_ranks.split(",")], int(group_world_size)


@pytest.mark.multinode
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_torchrun_agents_as_two_nodes(tmp_path):
    """Two torchrun agents, one process each, meet through a c10d rendezvous exactly as the
    agents on two SLURM nodes do; only the network is loopback."""
    port = free_port()
    deadline = 180  # seconds for the whole run, with slack for a busy machine; a hang is killed
    procs, logs = [], []
    for node in range(2):
        # is_host says which agent serves the rendezvous store, as the first node of an
        # allocation does; on two real machines torchrun works it out from the host name.
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=two-agents",
               f"--rdzv_conf=is_host={int(node == 0)},join_timeout=120", "--max_restarts=0",
               "train_ddp.py", *TINY_RUN]
        logs.append(tmp_path / f"node{node}.log")
        with open(logs[-1], "w") as out:
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=launch_env(), stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    end = time.monotonic() + deadline
    try:
        for proc in procs:
            proc.wait(timeout=max(end - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        pass
    finally:
        stuck = [node for node, proc in enumerate(procs) if proc.poll() is None]
        for node in stuck:
            os.killpg(procs[node].pid, signal.SIGKILL)  # the agent and its worker
            procs[node].wait()
    texts = [log.read_text() for log in logs]
    both = "\n".join(f"--- node {n} ---\n{t}" for n, t in enumerate(texts))
    assert not stuck, f"agents {stuck} still ran after {deadline} s and were killed:\n{both}"
    assert [p.returncode for p in procs] == [0, 0], f"exit codes {[p.returncode for p in procs]}:\n{both}"

    ranks = sorted(agent_ranks(text) for text in texts)
    assert ranks == [(0, [0], 2), (1, [1], 2)], f"(group_rank, global_ranks, group_world_size): {ranks}\n{both}"
    rank0_log = texts[[agent_ranks(t)[0] for t in texts].index(0)]
    assert_trained_with_two_ranks(rank0_log)


# ---------------------------------------------------------------- sbatch on two nodes
# Last in the file on purpose: the jobs fixture submitted this job with the others, and
# it runs while the two-agent test above does, which saves a run's time.


@pytest.mark.slurm
@pytest.mark.multinode
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sbatch_submit_sh_on_two_nodes(slurm_nodes, jobs):
    """sbatch --nodes=2 submit.sh: srun starts a torchrun on each node, and they meet at the
    first node's name. The test cluster's two nodes are one machine, but SLURM, srun and
    torchrun do everything they do on two."""
    if slurm_nodes < 2:
        pytest.skip(f"the test SLURM cluster has {slurm_nodes} usable node: restart it with "
                    "sudo tools/slurm_test_cluster.sh stop && sudo tools/slurm_test_cluster.sh start")
    state, code, log = wait_for(jobs, "two_nodes")
    assert (state, code) == ("COMPLETED", "0:0"), f"job ended {state} with exit code {code}. Log:\n{log}"
    assert_trained_with_two_ranks(log)
    assert "on 2 node(s)" in log, log
    # srun --label puts the node's number before each of its lines: one agent per node,
    # each with one of the two global ranks
    ranks = []
    for node in (0, 1):
        lines = "\n".join(line.split(": ", 1)[1] for line in log.splitlines() if line.startswith(f"{node}: "))
        ranks.append(agent_ranks(lines))
    assert sorted(ranks) == [(0, [0], 2), (1, [1], 2)], f"(group_rank, global_ranks, group_world_size): {ranks}\n{log}"


# ---------------------------------------------------------------- USR1 before the time limit


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sbatch_usr1_saves_a_checkpoint_and_the_next_job_finishes_like_an_uninterrupted_run(slurm_nodes, tmp_path):
    """SLURM's warning before the time limit (scancel --signal=USR1 --batch stands in for
    --signal=B:USR1@120): submit.sh passes it on, training saves and ends, the job ends
    cleanly; the same job submitted again resumes and ends bit-identical to a run never stopped.
    (REQUEUE=0: with it SLURM would requeue the job itself, but only after a delay of minutes.)"""
    import torch

    run = ["--impl", "solutions", "--data", "synthetic", "--train-samples", "1024", "--test-samples", "256",
           "--batch-size", "16", "--epochs", "2", "--metrics", ""]  # 64 steps an epoch
    ckpt = tmp_path / "ckpt"
    train = [*run, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "10"]
    first = sbatch(tmp_path, ["--nodes=1"], train, 2, {"REQUEUE": "0"})
    reference = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train_ddp.py", *run,
         "--checkpoint-dir", str(tmp_path / "reference")], cwd=REPO, env=launch_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        end = time.monotonic() + 150
        while not (ckpt / "last.pt").exists() and time.monotonic() < end:
            time.sleep(0.1)
        assert (ckpt / "last.pt").exists(), f"job {first} wrote no checkpoint in time:\n{wait_for({'j': (first, tmp_path)}, 'j', 1)[2]}"
        signalled = slurm("scancel", "--signal=USR1", "--batch", first)
        assert signalled.returncode == 0, signalled.stderr
        state, code, log = wait_for({"first": (first, tmp_path)}, "first", 150)
        assert (state, code) == ("COMPLETED", "0:0"), f"job {first} ended {state} {code}:\n{log}"
        assert "stopped by SIGUSR1 after step" in log and "submit it again to continue" in log, log
        stopped = torch.load(ckpt / "last.pt", weights_only=True)
        assert stopped["epoch"] < 2, f"the job finished before USR1 arrived (a fast machine?):\n{log}"

        second = sbatch(tmp_path, ["--nodes=1"], train, 2, {"REQUEUE": "0"})
        state, code, log = wait_for({"second": (second, tmp_path)}, "second", 150)
        assert (state, code) == ("COMPLETED", "0:0"), f"job {second} ended {state} {code}:\n{log}"
        assert f"{stopped['step']} steps done" in log, f"job {second} did not resume at step {stopped['step']}:\n{log}"
        out, _ = reference.communicate(timeout=max(end - time.monotonic(), 30))
    finally:
        if reference.poll() is None:
            os.killpg(reference.pid, signal.SIGKILL)
            reference.wait()
    assert reference.returncode == 0, out
    final = torch.load(ckpt / "last.pt", weights_only=True)["model"]
    expected = torch.load(tmp_path / "reference" / "last.pt", weights_only=True)["model"]
    differ = [k for k in expected if not torch.equal(final[k], expected[k])]
    assert not differ, f"after the stop and the second job, {differ} differ from the uninterrupted run:\n{log}"
