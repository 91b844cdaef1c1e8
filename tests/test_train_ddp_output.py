"""What train_ddp.py sets up for its own process: whole lines on its streams, and its threads.

    pytest tests/test_train_ddp_output.py
"""
import json
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.repo

# A rank that warns many times, with or without support.interrupt.whole_lines(): under PYTHONUNBUFFERED=1
# print() writes a line in two pieces. Past its imports it says so on the `ready` pipe and waits for
# the parent's go on its stdin, so that both ranks warn at the same moment (a barrier, not a timed wait).
WARN = """
import os, sys
sys.path.insert(0, sys.argv[4])
if sys.argv[2] == "whole":
    from support.interrupt import whole_lines
    whole_lines()
os.write(int(sys.argv[3]), b"r")
sys.stdin.read(1)
for k in range(20000):
    print(f"[rank {sys.argv[1]}] checkpoint ckpt/last.pt cannot be read (bad zip); trying previous.pt", file=sys.stderr)
"""


def shared_pipe_output(how):
    """Two processes warning at once into one pipe; their output."""
    read, write = os.pipe()
    ready_read, ready = os.pipe()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", WARN, str(rank), how, str(ready), REPO], stdin=subprocess.PIPE,
                              stdout=write, stderr=write, env=env, pass_fds=(ready,)) for rank in (0, 1)]
    os.close(write)
    os.close(ready)  # the children's copies only: a child that dies early ends the wait below (EOF)
    with os.fdopen(ready_read, "rb") as said:
        both = said.read(1) + said.read(1)
    if both != b"rr":  # one died before it could warn
        for proc in procs:
            proc.kill()
        os.close(read)
        pytest.fail(f"a warning process ended before its first line: exit codes {[p.wait() for p in procs]}")
    for proc in procs:  # both are past their imports: go
        proc.stdin.write(b"g")
        proc.stdin.close()
    with os.fdopen(read) as f:
        out = f.read()
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    return out


def test_two_ranks_warnings_never_share_a_line():
    """Issue 23: 'two warnings on one line'. Two ranks printing at once under PYTHONUNBUFFERED=1
    (set by test runners, SLURM scripts, IDEs) gave `[rank 0] ...[rank 1] ...` and an empty line:
    without whole_lines() ("plain" here), 4672 of 100000 lines measured on the 2-core machine."""
    out = shared_pipe_output("whole")
    lines = out.splitlines()
    glued = [line for line in lines if line.count("[rank ") != 1]
    assert len(lines) == 40000 and not glued, (
        f"{len(glued)} of {len(lines)} lines hold two ranks' warnings or none, e.g. {glued[:2]}")


def run_train_ddp(env, *extra):
    """A tiny run of train_ddp.py on one process; its output. Prints, at exit, whether its stdout and
    stderr still write each piece at once (write_through), which splits a print() in two."""
    probe = ("import os, runpy, sys; real = os._exit\n"
             "def leave(code):\n"
             "    sys.stdout.write(f'write_through {sys.stdout.write_through} {sys.stderr.write_through}\\n')\n"
             "    sys.stdout.flush(); real(code)\n"
             "os._exit = leave\n"
             "sys.argv = ['train_ddp.py'] + sys.argv[1:]\n"
             "runpy.run_path('train_ddp.py', run_name='__main__')\n")
    argv = [sys.executable, "-c", probe, "--impl", "solutions", "--data", "synthetic", "--epochs", "1",
            "--train-samples", "64", "--test-samples", "64", "--batch-size", "64", "--metrics", "", *extra]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in {**os.environ, "PYTHONUNBUFFERED": "1", **env}.items() if v is not None})
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


@pytest.mark.slow  # a new interpreter importing torch and training: 5-9 s of the default run
def test_train_ddp_writes_whole_lines_and_says_its_threads():
    """One run: its streams write whole lines (the fix above is in place), and OMP_NUM_THREADS=3,
    set by the user, is the thread count its header line shows."""
    out = run_train_ddp({"OMP_NUM_THREADS": "3"})
    assert "write_through False False" in out, f"train_ddp.py does not call whole_lines() before it prints:\n{out}"
    assert " threads=3 " in out.splitlines()[0], f"the header line does not show OMP_NUM_THREADS=3:\n{out}"


# What the launchers set in each of 2 processes on one node (as torchrun, as Open MPI's mpirun)
TWO_HERE = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500"}
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "1289814017"}
SRUN = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
        "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2",
        "SLURM_JOB_NODELIST": "node007", "SLURM_STEP_NODELIST": "node007"}
BATCH = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "2",
         "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "node007"}


def set_by_a_launcher(name):
    """A variable that tells this process of a launcher (pytest itself may run in a SLURM job, or under torchrun)."""
    return (name in {*TWO_HERE, "TORCHELASTIC_RUN_ID", "GROUP_WORLD_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"}
            or name.startswith(("SLURM_", "OMPI_", "PMI_")))


@pytest.mark.parametrize("omp, launch, cores, expected", [
    (None, {}, 4, 4),                                   # python train_ddp.py: every core
    (None, TWO_HERE, 4, 2),                             # two processes on the node share them
    (None, OPEN_MPI, 4, 2),                             # whoever started them (before main() renames)
    (None, {**TWO_HERE, "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"}, 4, 1),  # at least one
    ("3", TWO_HERE, 4, 3),                              # the user's (or torchrun's) OMP_NUM_THREADS wins
    ("", TWO_HERE, 4, 2),                               # empty: not set
    (None, {**TWO_HERE, "LOCAL_RANK": "5"}, 4, 4),      # variables that cannot work: main() says so
    (None, {**SRUN, "SLURM_CPUS_PER_TASK": "3"}, 8, 3),  # srun gave each task its CPUs, bound to them or not
    (None, {**SRUN, "SLURM_CPUS_PER_TASK": "3"}, 3, 3),
    (None, SRUN, 4, 2),                                 # srun without --cpus-per-task: shared out
    (None, {**SRUN, "SLURM_CPUS_ON_NODE": "8"}, 4, 4),  # ... bound to 4 of the step's 8 CPUs: its own
    (None, {**SRUN, "SLURM_CPUS_ON_NODE": "8"}, 8, 4),  # ... not bound: the step's 8 shared out
    (None, {**SRUN, "SLURM_CPUS_ON_NODE": "8"}, 64, 4),  # ... not bound, the whole node seen: the step's 8
    (None, {**SRUN, "SLURM_CPUS_ON_NODE": "2"}, 1, 1),  # ... as srun -n2 gave on the test cluster, bound
    (None, {**BATCH, "SLURM_CPUS_PER_TASK": "3"}, 4, 4),  # the batch script itself is one process
])
def test_threads_are_the_cores_shared_between_the_node_s_processes(monkeypatch, omp, launch, cores, expected):
    sys.path.insert(0, REPO)
    import train_ddp
    for name in [*filter(set_by_a_launcher, os.environ), "OMP_NUM_THREADS"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**launch, **({} if omp is None else {"OMP_NUM_THREADS": omp})}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    before = torch.get_num_threads()
    try:
        assert train_ddp.set_threads() == expected
        assert torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(before)


# train_ddp.py run as a script (stopped at --help, past its imports), then the threads as train() sets them, and
# the bits of products in the main thread and in a new one: gloo's threads, where PowerSGD's decompress computes.
EVERY_THREAD = """
import json, runpy, sys
sys.argv = ["train_ddp.py", "--help"]
try:
    runpy.run_path("train_ddp.py", run_name="__main__")
except SystemExit:
    pass
import train_ddp
threads = train_ddp.set_threads()
sys.path.insert(0, "tests")
from harness import differing_in_another_thread  # torch is loaded already: its import changes nothing here
differing = differing_in_another_thread()
print(json.dumps({"threads": threads, "differing": differing}))
"""


@pytest.mark.slow  # a new interpreter importing torch: 2-5 s
def test_every_thread_computes_as_the_main_thread_without_omp_num_threads():
    """mpirun --bind-to none (or srun with several CPUs a task) sets no OMP_NUM_THREADS, and each process may use
    every core. train_ddp.py gave its main thread its share of the cores while gloo's threads kept OpenMP's default
    of all of them: PowerSGD's decompress, which runs there, computed other bits, and right answers ended "ranks
    INCONSISTENT" (1 of 2 runs of `mpirun --bind-to none -np 2 ... --compress powersgd`). Run as a script, it gives
    OpenMP the same number before torch loads it."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: every thread computes with one thread whatever train_ddp.py sets")
    env = {name: value for name, value in os.environ.items()
           if not set_by_a_launcher(name) and name != "OMP_NUM_THREADS"}
    run = subprocess.run([sys.executable, "-c", EVERY_THREAD], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**env, **OPEN_MPI})
    assert run.returncode == 0, run.stdout + run.stderr
    said = json.loads(run.stdout.splitlines()[-1])
    assert said["threads"] == max(1, len(os.sched_getaffinity(0)) // 2), said
    assert said["differing"] == 0, (
        f"{said['differing']} elements of 20 products computed in a new thread differ from the main thread's: "
        "train_ddp.py must set OMP_NUM_THREADS to the threads it gives its main thread before it imports torch")
