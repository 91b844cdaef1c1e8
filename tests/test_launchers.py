"""Who am I: launchers.py under every launcher, with made-up environments (fast), and each
launcher for real (slow: srun on the test SLURM cluster, mpirun from Open MPI and MPICH, Ray
on a two-node local cluster), every one trained with the same losses as torchrun.

    pytest tests/test_launchers.py               # the environments, a taken port, the stop message
    pytest -m slow tests/test_launchers.py       # also the real launchers (each skips where it is missing)
"""
import concurrent.futures
import csv
import datetime
import os
import re
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import launchers
from conftest import load
from launchers import LaunchError, first_host, tasks_per_node, who_am_i
from test_launch import REPO, launch_env, slurm, slurm_nodes, wait_for  # noqa: F401 (slurm_nodes: a fixture)

pytestmark = pytest.mark.repo  # the given code of every task, not a task

TINY = ["--impl", "solutions", "--data", "synthetic", "--epochs", "1", "--train-samples", "1024",
        "--test-samples", "256", "--no-plot"]

# What each launcher sets, as measured: torchrun 2.14, srun 22.05 (tests/test_launch.py's cluster),
# Open MPI 4.1 and MPICH 4.0 (Debian 12). Two processes on one node; this is rank 1.
TORCHRUN = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"}
SRUN = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
        "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "node[007-008]", "SLURM_STEP_NODELIST": "node007"}
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "1289814017"}
MPICH = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "6"}
# the SLURM batch script's own variables, which everything started from it inherits
BATCH = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "4",
         "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "node[007-008]"}


def numbers(me):
    return me.launcher, me.rank, me.local_rank, me.world_size, me.local_world_size, me.master_addr, me.master_port


# ------------------------------------------------------------------ each launcher's variables


def test_torchrun():
    assert numbers(who_am_i(TORCHRUN)) == ("torchrun", 1, 1, 2, 2, "127.0.0.1", 29500)


def test_srun_one_task_per_gpu_meets_at_the_first_node_on_a_port_from_the_job_id():
    assert numbers(who_am_i(SRUN)) == ("srun", 1, 1, 2, 2, "node007", 15007)


def test_srun_on_two_nodes_with_the_seeds_exports():
    env = {**SRUN, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
           "SLURM_STEP_NODELIST": "localhost,vm", "MASTER_ADDR": "localhost", "MASTER_PORT": "12345", "WORLD_SIZE": "2"}
    assert numbers(who_am_i(env)) == ("srun", 1, 0, 2, 1, "localhost", 12345)


def test_torchruns_rank_wins_inside_an_srun_task():
    """submit.sh: torchrun runs as srun's task 1 (the second node) and starts ranks 2 and 3 there."""
    env = {**SRUN, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "2",
           **TORCHRUN, "RANK": "3", "WORLD_SIZE": "4"}
    assert numbers(who_am_i(env))[:5] == ("torchrun", 3, 1, 4, 2)


def test_open_mpi_on_one_node_meets_on_the_loopback_at_a_port_from_its_job_id():
    assert numbers(who_am_i(OPEN_MPI)) == ("mpirun (Open MPI)", 1, 1, 2, 2, "127.0.0.1", 15000 + 1289814017 % 15000)


def test_mpich_on_one_node(monkeypatch):
    monkeypatch.setattr(os, "getppid", lambda: 4321)  # hydra's proxy on this node, the same for all its processes
    assert numbers(who_am_i(MPICH)) == ("mpirun (MPICH or Intel MPI)", 1, 1, 2, 2, "127.0.0.1", 19321)


def test_mpirun_inside_a_slurm_job_is_read_from_mpiruns_variables():
    """Every process mpirun starts in a batch script inherits the script's SLURM_PROCID=0; under
    mpirun's srun-started daemons they carry SLURM_STEP_ID and the node's number as well."""
    for mpi in (OPEN_MPI, MPICH):
        assert who_am_i({**BATCH, **mpi}).rank == 1
        assert who_am_i({**BATCH, "SLURM_STEP_ID": "0", **mpi}).rank == 1


def test_srun_with_pmi2_is_read_from_slurms_variables():
    """srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE but not MPICH's local rank: SLURM says more."""
    assert numbers(who_am_i({**SRUN, "PMI_RANK": "1", "PMI_SIZE": "2"}))[:5] == ("srun", 1, 1, 2, 2)


def test_a_plain_python_in_a_batch_script_is_a_world_of_one():
    """The batch script has SLURM_PROCID=0 and SLURM_NTASKS=4 but is no srun task (no SLURM_STEP_ID)."""
    assert numbers(who_am_i(BATCH))[:5] == ("none", 0, 0, 1, 1)
    assert numbers(who_am_i({}))[:5] == ("none", 0, 0, 1, 1)
    assert numbers(who_am_i({"PMI_RANK": "0", "PMI_SIZE": "1"}))[:5] == ("none", 0, 0, 1, 1)  # an MPI singleton


# ------------------------------------------------------------------ mistakes: one line each


@pytest.mark.parametrize("env, says", [
    # the seed's recipe copied to a 2-task job with WORLD_SIZE=8 left as it was
    ({**SRUN, "WORLD_SIZE": "8"}, "WORLD_SIZE=8 is exported but srun started 2 processes"),
    ({**OPEN_MPI, "WORLD_SIZE": "4"}, "WORLD_SIZE=4 is exported but mpirun (Open MPI) started 2 processes"),
    ({**TORCHRUN, "RANK": "2"}, "rank 2 with a world size of 2 (torchrun): a rank is 0 .. world size - 1"),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, "local rank 2 of 2 processes on this machine"),
    ({"RANK": "0"}, "RANK=0 is set but WORLD_SIZE is not"),
    ({**TORCHRUN, "RANK": "one"}, "RANK='one' is not a whole number"),
    # the seed's three exports without srun: every process would take rank 0
    ({"WORLD_SIZE": "2", "MASTER_ADDR": "node007", "MASTER_PORT": "12345"},
     "WORLD_SIZE=2 is set, but nothing says which rank this process is"),
    # two nodes under mpirun: only the user knows which address the other node reaches
    ({**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": "4"}, "4 processes on several machines (mpirun (Open MPI)) and no "
                                                "meeting point: export MASTER_ADDR="),
    ({**MPICH, "PMI_SIZE": "4"}, "and no meeting point: export MASTER_ADDR="),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "says rank 1 of 2, but not where to meet: export MASTER_ADDR"),
    # MPICH's port comes from its per-node proxy: another on each node
    ({**MPICH, "PMI_SIZE": "4", "MASTER_ADDR": "node007"}, "MASTER_ADDR=node007 is set but MASTER_PORT is not"),
    # found in the held-out trial (launchtrial): each was a hang, a raw traceback, a misleading line or a silent wrong run
    ({**TORCHRUN, "MASTER_PORT": "99999"}, "MASTER_PORT=99999 is not a port (1-65535)"),
    ({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node007", "MASTER_PORT": "23456"},
     "LOCAL_WORLD_SIZE=2 of WORLD_SIZE=4 says the processes are on several machines, but LOCAL_RANK is not set"),
    # `export RANK=0` left in a batch script: every srun task would take rank 0
    ({**SRUN, "RANK": "0", "WORLD_SIZE": "2"}, "RANK=0 is exported, but srun started this process as rank 1 of 2: "
                                               "unset RANK (and LOCAL_RANK) before srun"),
    ({**OPEN_MPI, "RANK": "0", "WORLD_SIZE": "2"}, "RANK=0 is exported, but mpirun (Open MPI) started this process "
                                                   "as rank 1 of 2: unset RANK (and LOCAL_RANK) before mpirun"),
    # torchrun inside srun with 2 tasks on the node (a double launch): two torchruns, two worlds
    # an MPI that gives no local rank (PMI_RANK, PMI_SIZE alone): each process was a world of one
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "PMI_SIZE=2 says an MPI launcher started several processes, but "
                                         "MPI_LOCALRANKID is not set"),
    ({**SRUN, **TORCHRUN, "GROUP_WORLD_SIZE": "1"}, "srun started 2 processes on this machine and each ran torchrun, "
                                                    "which starts processes of its own: start one torchrun per machine, "
                                                    "or none (srun python train_ddp.py starts every process itself"),
    ({**OPEN_MPI, **TORCHRUN, "GROUP_WORLD_SIZE": "1"}, "mpirun started 2 processes on this machine and each ran "
                                                        "torchrun"),
])
def test_variables_that_cannot_work_are_one_clear_line(env, says):
    with pytest.raises(LaunchError) as error:
        who_am_i(env)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert isinstance(error.value, ValueError), "train_ddp.py prints a ValueError as one line and exits with 2"


def test_rank_and_world_size_set_by_hand_are_accepted():
    """PyTorch's env:// example exports RANK and WORLD_SIZE only: one machine, the local rank is
    the rank (so that two GPUs are two GPUs). LOCAL_RANK without LOCAL_WORLD_SIZE was refused."""
    meet = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "23456"}
    assert numbers(who_am_i({"RANK": "1", "WORLD_SIZE": "2", **meet}))[:5] == ("RANK and WORLD_SIZE", 1, 1, 2, 2)
    assert numbers(who_am_i({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", **meet}))[:4] == (
        "RANK and WORLD_SIZE", 1, 1, 2)
    assert numbers(who_am_i({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", **meet}))[
        :5] == ("RANK and WORLD_SIZE", 3, 1, 4, 2)


def test_a_rank_that_rightly_differs_from_sruns_is_accepted(monkeypatch):
    """What the exported-RANK and double-launch checks must let through: RANK equal to srun's;
    a launcher that starts one process per node under srun (its world outnumbers srun's tasks);
    Ray workers inside an srun task (the group is made already); submit.sh's torchrun, one per
    node, and an elastic job that went on after losing a node (fewer torchruns than srun tasks)."""
    meet = {"MASTER_ADDR": "node007", "MASTER_PORT": "23456"}
    assert who_am_i({**SRUN, "RANK": "1", "WORLD_SIZE": "2", **meet}).rank == 1
    per_node = {**SRUN, "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NODELIST": "node[007-008]",
                "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node007", "MASTER_PORT": "23456"}
    assert who_am_i(per_node).rank == 3
    assert who_am_i({**per_node, "TORCHELASTIC_RUN_ID": "7", "GROUP_WORLD_SIZE": "2"}).launcher == "torchrun"
    assert who_am_i({**per_node, "TORCHELASTIC_RUN_ID": "7", "GROUP_WORLD_SIZE": "1", "WORLD_SIZE": "2",
                     "RANK": "1"}).rank == 1
    monkeypatch.setattr(launchers, "group_exists", lambda: True)
    assert who_am_i({**SRUN, "RANK": "0", "WORLD_SIZE": "2", **meet}).rank == 0


def test_ray_train_refuses_workers_its_cluster_has_no_room_for():
    """Ray Train waits a minute for workers that do not fit, gives up and tries again, forever."""
    ray_train = pytest.importorskip("ray_train")
    args = ray_train.parse_args(["--workers", "4"])
    with pytest.raises(ValueError) as error:
        ray_train.check_room(args, {"CPU": 2.0, "memory": 1e9})
    assert str(error.value) == ("--workers 4 need 4 CPUs but this Ray cluster has 2: use fewer --workers, a smaller "
                                "--cpus-per-worker (it may be below 1), or more nodes (ray start)")
    ray_train.check_room(ray_train.parse_args(["--workers", "4", "--cpus-per-worker", "0.5"]), {"CPU": 2.0})
    with pytest.raises(ValueError, match="need 2 GPUs but this Ray cluster has 0"):
        ray_train.check_room(ray_train.parse_args(["--workers", "2", "--use-gpu"]), {"CPU": 2.0})


def test_several_nodes_under_mpirun_with_master_addr():
    env = {**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": "4", "MASTER_ADDR": "node007", "MASTER_PORT": "23456"}
    assert numbers(who_am_i(env)) == ("mpirun (Open MPI)", 1, 1, 4, 2, "node007", 23456)
    env.pop("MASTER_PORT")  # Open MPI's job id is the same on every node: so is the port taken from it
    assert numbers(who_am_i(env))[-1] == 15000 + 1289814017 % 15000


def test_slurm_lists():
    assert first_host("gpu[003-004,7],cpu1") == "gpu003"
    assert first_host("localhost,vm") == "localhost"
    assert first_host("node[12]") == "node12"
    assert first_host("a-b01") == "a-b01"
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4") == [4]


def test_set_torchrun_variables_writes_torchruns_names_and_nothing_for_plain_python():
    env = dict(SRUN)
    launchers.set_torchrun_variables(env)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")} \
        == {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node007",
            "MASTER_PORT": "15007"}
    assert who_am_i(env).rank == 1, "read again (setup_distributed after train_ddp.main), the same numbers"
    plain = dict(BATCH)
    launchers.set_torchrun_variables(plain)
    assert plain == BATCH


def test_launcher_name():
    assert launchers.launcher_name(TORCHRUN) == "torchrun"
    assert launchers.launcher_name({**SRUN, **TORCHRUN}) == "torchrun"
    assert launchers.launcher_name(SRUN) == "srun"
    assert launchers.launcher_name({**BATCH, **OPEN_MPI}) == "mpirun (Open MPI)"
    assert launchers.launcher_name({"RANK": "0", "WORLD_SIZE": "2"}) is None  # Ray Train, or set by hand
    assert launchers.launcher_name(BATCH) is None


@pytest.mark.parametrize("env, says", [
    (TORCHRUN, "torchrun stops every rank when one fails"),
    ({**SRUN, "RANK": "1", "WORLD_SIZE": "2"}, "srun stops every rank when one fails"),  # after set_torchrun_variables
    ({"RANK": "1", "WORLD_SIZE": "2"}, "look above for another rank's error, or for who stopped this process"),
])
def test_a_stop_at_start_up_names_the_launcher_only_when_it_is_the_one(env, says):
    """Issue 36: under srun without torchrun a SIGTERM said 'torchrun stops every rank'."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))}
    proc = subprocess.run([sys.executable, "-c", "import signal, support.interrupt as i; "
                           "i.stop_on_interrupt(signal.SIGTERM, None)"],
                          cwd=REPO, capture_output=True, text=True, timeout=30, env={**clean, **env})
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.startswith(f"[rank 1] stopped at start-up (SIGTERM): {says}"), proc.stderr
    assert ("torchrun" in proc.stderr) == (env is TORCHRUN), proc.stderr


@pytest.mark.parametrize("env, tag", [
    ({**SRUN, "RANK": "0", "WORLD_SIZE": "2"}, "[rank 1] "),  # the exported RANK is wrong: srun's rank
    ({**OPEN_MPI, "RANK": "0", "WORLD_SIZE": "2"}, "[rank 1] "),
    ({**SRUN, "RANK": "1", "WORLD_SIZE": "2"}, "[rank 1] "),  # after set_torchrun_variables
    (TORCHRUN, "[rank 1] "),
    ({"RANK": "1"}, "[rank 1] "),  # no WORLD_SIZE: the variables say no more than RANK
    ({}, ""),  # plain python
])
def test_a_lines_rank_tag_is_the_rank_the_launcher_resolved(env, tag):
    """A wrong exported RANK read "[rank 0] error: RANK=0 is exported, but srun started this
    process as rank 1": the tag came from RANK."""
    assert launchers.rank_tag(env) == tag


def test_a_refused_exported_rank_is_said_with_the_launchers_rank():
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))}
    proc = subprocess.run([sys.executable, "-c", "import launchers, support.interrupt as i; from launchers import "
                           "LaunchError\ntry:\n    launchers.who_am_i()\nexcept LaunchError as e:\n"
                           "    raise SystemExit(i.cannot_start(e))"],
                          cwd=REPO, capture_output=True, text=True, timeout=30,
                          env={**clean, **SRUN, "RANK": "0", "WORLD_SIZE": "2"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("[rank 1] error: RANK=0 is exported, but srun started this process as rank 1 "), \
        proc.stderr


# ------------------------------------------------------------------ setup_distributed


def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "MPI_LOCAL", "TORCHELASTIC_")) or name in (
                "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("impl", ["template", "solutions"])
def test_setup_distributed_uses_a_group_the_launcher_set_up(impl, monkeypatch):
    """Ray Train and torchrunx call init_process_group before the training function runs: a
    second call would fail with 'trying to initialize the default process group twice'."""
    trainer = load(impl, "template_trainer")
    clean_env(monkeypatch)
    monkeypatch.setenv("RANK", "0")  # as Ray Train sets them, with the group it made
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    group = dist.group.WORLD
    try:
        rank, local_rank, world_size, device = trainer.setup_distributed("gloo")
        expected = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU node gloo carries CUDA tensors
        assert (rank, local_rank, world_size, device.type) == (0, 0, 1, expected)
        assert dist.group.WORLD is group, "setup_distributed replaced the process group the launcher made"
    finally:
        trainer.cleanup()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_train_ddp(env, timeout=60):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        clean.pop(name, None)
    return subprocess.run([sys.executable, "train_ddp.py", *TINY, "--metrics", "", "--timeout", "10"], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env={**clean, **env})


def meet(rank, port):
    """Rank `rank` of 2 (srun's) creating the store init_process_group makes, at 127.0.0.1:`port`.
    With nobody else there, its timeout is not the point, and it is TCPStore's own floor that is
    waited: rank 0 waits whole seconds (1 s for any timeout up to 1 s, 2 s for 1 s), another rank
    tries once more after a random back-off (0.6-1.5 s seen)."""
    me = launchers.Launch("srun", rank, rank, 2, 2, "127.0.0.1", port)
    with launchers.meeting_failures_explained(me):
        dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=0.1))


@pytest.mark.timeout(90)
@pytest.mark.slow  # an interpreter and two stores that wait on purpose: 3 s
def test_ranks_that_do_not_meet_are_one_line():
    """The three ways meeting at MASTER_ADDR:MASTER_PORT fails (launchers.meeting_failures_explained),
    each a DistNetworkError / DistStoreError traceback before: rank 0 of an srun task cannot listen on
    MASTER_PORT (EADDRINUSE; the command itself, train_ddp.py: the port and what to change, exit 2);
    rank 0 alone (the others never started, or meet elsewhere); a rank with no rank 0 at
    MASTER_ADDR:MASTER_PORT. All three at once: the stores wait while the command imports torch."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = [free_port(), free_port()]
        while ports[1] == ports[0]:  # rank 1 must find nobody at its port, not this test's rank 0
            ports[1] = free_port()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:  # a store's wait and a subprocess let go of the GIL
            command = pool.submit(run_train_ddp, {**SRUN, "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                                                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
            alone = {rank: pool.submit(meet, rank, ports[rank]) for rank in (0, 1)}
    proc = command.result()
    assert proc.returncode == 2, proc
    assert proc.stderr == (f"[rank 0] error: port {port} on 127.0.0.1 is taken (another run or job listens on it): "
                           "export MASTER_PORT=<another free port, 15000-32767> and start again\n"), proc.stderr
    expected = {
        0: f"rank 0 waited at 127.0.0.1:{ports[0]}, but only 1 of 2 processes came (srun): did the "
           "launcher start 2, and were all of them given this MASTER_ADDR and MASTER_PORT?",
        1: f"rank 1 found no rank 0 at 127.0.0.1:{ports[1]} (srun): is rank 0 running, and is "
           "MASTER_ADDR a name of its machine that this one reaches (getent hosts 127.0.0.1)?",
    }
    for rank, says in expected.items():
        error = alone[rank].exception()  # meet() returns only by raising
        assert isinstance(error, LaunchError) and str(error) == says, repr(error)


@pytest.mark.slow  # the message itself is checked above, in a second
def test_the_seeds_world_size_in_a_smaller_job_is_one_line():
    proc = run_train_ddp({**SRUN, "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == ("error: WORLD_SIZE=8 is exported but srun started 2 processes: unset WORLD_SIZE (srun "
                           "says how many), or start 8 processes\n"), proc.stderr


@pytest.mark.slow  # the message itself is checked above, in two seconds
def test_rank_0_alone_ends_with_one_line_after_the_timeout():
    proc = run_train_ddp({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("[rank 0] error: rank 0 waited at 127.0.0.1:") and "Traceback" not in proc.stderr, \
        proc.stderr


def test_submit_srun_sh_outside_slurm_says_use_sbatch():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(["bash", str(REPO / "submit_srun.sh")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "sbatch submit_srun.sh" in result.stderr, result


def test_ray_train_without_ray_says_how_to_install_it(monkeypatch, capsys):
    """Ray is optional: without it ray_train.py says what to install, in one line, exit 2. Its
    `__main__` runs here (runpy), in pytest's process, where torch is imported already; the command
    itself, in a new interpreter (1.3-1.6 s of torch's import), is the slow test below."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where Ray is missing
    monkeypatch.setattr(sys, "argv", ["ray_train.py", *TINY])
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as end:
        runpy.run_path(str(REPO / "ray_train.py"), run_name="__main__")
    assert (end.value.code, capsys.readouterr().err) == (
        2, "error: Ray is not installed: pip install -r requirements-ray.txt\n")


@pytest.mark.slow  # the same path in-process above, at once; here the real command, its exit code and stderr
def test_ray_train_without_ray_says_how_to_install_it_as_a_command(tmp_path):
    """The same, as a command: a stand-in `ray` package that cannot be imported, in a new interpreter."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('No module named ray (a stand-in)')\n")
    proc = subprocess.run([sys.executable, "ray_train.py", *TINY], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert (proc.returncode, proc.stderr) == (2, "error: Ray is not installed: pip install -r requirements-ray.txt\n"), proc


def read_metrics(path):
    with open(path) as f:
        return [{k: row[k] for k in ("epoch", "train_loss", "test_loss", "test_accuracy")} for row in csv.DictReader(f)]


# ------------------------------------------------------------------ the real launchers (slow)
# Each trains TINY on 2 processes and must give torchrun's losses and accuracy to the last
# digit of the metrics file: the same ranks, the same shards, the same sums. One thread per
# process everywhere (torchrun sets OMP_NUM_THREADS=1 itself), so the arithmetic is the same;
# mpirun sets none, and train_ddp.py gives each of its 2 processes on the 2 cores one thread.


def run(cmd, timeout=150, **env):
    """Run a launcher in its own session; killed with everything it started after timeout s."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            env={k: v for k, v in {**os.environ, "OMP_NUM_THREADS": "1", **env}.items() if v is not None})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} still ran after {timeout} s and was killed:\n{out[-3000:]}")
    return proc.returncode, out


@pytest.fixture(scope="module")
def torchrun_metrics(tmp_path_factory):
    """The reference: torchrun with 2 processes."""
    path = tmp_path_factory.mktemp("torchrun") / "metrics.csv"
    code, out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                     "train_ddp.py", *TINY, "--metrics", str(path)])
    assert code == 0, out
    return read_metrics(path)


def assert_like_torchrun(out, metrics, reference):
    assert "world_size=2 backend=gloo" in out, out
    assert "ranks consistent: all 2 ranks hold bit-identical parameters" in out, out
    assert metrics == reference, f"not torchrun's figures:\n{metrics}\n{reference}\n{out}"


def open_mpi():
    for name in ("mpirun.openmpi", "mpirun"):
        path = shutil.which(name)
        if path and "Open MPI" in subprocess.run([path, "--version"], capture_output=True, text=True).stdout:
            return path
    pytest.skip("Open MPI's mpirun is not installed (apt-get install -y openmpi-bin)")


def mpich():
    path = shutil.which("mpirun.mpich") or shutil.which("mpiexec.hydra")
    if not path:
        pytest.skip("MPICH's mpirun is not installed (apt-get install -y mpich)")
    return path


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mpirun", ["Open MPI", "MPICH"])
def test_mpirun_trains_like_torchrun(mpirun, torchrun_metrics, tmp_path):
    """`mpirun -np 2 python train_ddp.py ...`: Open MPI as root needs --allow-run-as-root, and
    more processes than cores --oversubscribe (both as docs/clusters.md says). As a student types it: no
    OMP_NUM_THREADS, and (Open MPI) no binding, so that each process may use both cores and train_ddp.py
    must share them out itself, in gloo's threads too."""
    if mpirun == "Open MPI":
        cmd = [open_mpi(), *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "--oversubscribe", "--bind-to",
               "none"]
    else:
        cmd = [mpich()]
    code, out = run([*cmd, "-np", "2", sys.executable, "train_ddp.py", *TINY, "--metrics", str(tmp_path / "m.csv")],
                    OMP_NUM_THREADS=None)
    assert code == 0, out
    assert f" threads={max(1, len(os.sched_getaffinity(0)) // 2)} " in out, out
    assert_like_torchrun(out, read_metrics(tmp_path / "m.csv"), torchrun_metrics)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(400)
@pytest.mark.parametrize("shape", ["--nodes=1 --ntasks-per-node=2", "--nodes=2 --ntasks-per-node=1"])
def test_srun_without_torchrun_trains_like_torchrun(shape, slurm_nodes, torchrun_metrics, tmp_path):
    """The seed's recipe as submit_srun.sh has it (the three exports, srun python train_ddp.py,
    one task per process) on the test cluster: one node with 2 tasks, and 2 nodes with one."""
    if shape.startswith("--nodes=2") and slurm_nodes < 2:
        pytest.skip(f"the test SLURM cluster has {slurm_nodes} usable node")
    submitted = slurm("sbatch", "--parsable", f"--chdir={REPO}", f"--output={tmp_path}/slurm-%j.out",
                      "--gpus-per-node=0", "--cpus-per-task=1", "--time=5", *shape.split(),
                      str(REPO / "submit_srun.sh"), *TINY, "--metrics", str(tmp_path / "m.csv"),
                      env=launch_env(OMP_NUM_THREADS="1"))
    assert submitted.returncode == 0, f"sbatch failed:\n{submitted.stderr}"
    job = submitted.stdout.strip().split(";")[0]
    state, code, log = wait_for({"job": (job, tmp_path)}, "job", 240)
    assert (state, code) == ("COMPLETED", "0:0"), f"job {job} ended {state} with exit code {code}. Log:\n{log}"
    assert "submit_srun.sh: job" in log and "finished" in log, log
    # --label: rank 0's lines start with "0: ", and no torchrun ran
    assert "0: ranks consistent" in log and "torchrun" not in log.replace(str(tmp_path), ""), log
    assert_like_torchrun(log, read_metrics(tmp_path / "m.csv"), torchrun_metrics)


# ------------------------------------------------------------------ Ray (slow)


@pytest.fixture(scope="module")
def ray_cluster():
    """Two Ray nodes on this machine, one CPU each, so that the two workers land on different
    nodes (both nodes have this machine's address, so Ray Train still counts one machine)."""
    cluster_utils = pytest.importorskip("ray.cluster_utils", reason="Ray is not installed: pip install -r "
                                        "requirements-ray.txt")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes(timeout=120)
        yield cluster.address
    finally:
        cluster.shutdown()


def ray_train(address, *args, timeout=300):
    return run([sys.executable, "ray_train.py", "--address", address, "--workers", "2", *args], timeout=timeout)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(500)
def test_ray_train_on_two_nodes_trains_like_torchrun(ray_cluster, torchrun_metrics, tmp_path):
    code, out = ray_train(ray_cluster, *TINY, "--metrics", str(tmp_path / "m.csv"),
                          "--storage-path", str(tmp_path / "ray"))
    assert code == 0, out
    assert_like_torchrun(out, read_metrics(tmp_path / "m.csv"), torchrun_metrics)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)  # Ray colours its prefixes, in a file too
    rank0 = [line.split(") ", 1)[1] for line in plain.splitlines() if "RayTrainWorker" in line and "epoch 1/1" in line]
    assert len(rank0) == 1 and rank0[0].startswith("epoch 1/1  train loss"), f"rank 0's epoch line once:\n{out}"
    assert "initialize the default process group twice" not in out, out


def ray_workers():
    """The pids of Ray Train's worker processes (their title names the actor)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"RayTrainWorker" in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(600)
def test_ray_restarts_after_a_killed_worker_and_ends_like_an_uninterrupted_run(ray_cluster, tmp_path):
    """FailureConfig(max_failures=1): a worker killed after the first checkpoint; Ray starts both
    workers again, they resume the course's checkpoint, and the final model is bit-identical to
    an uninterrupted torchrun run's."""
    import torch

    run_args = [*TINY, "--batch-size", "16", "--epochs", "2", "--checkpoint-every", "10",
                "--metrics", ""]  # 64 steps an epoch: the kill comes after step 10 of 128
    # the uninterrupted run in harness ranks: torchrun's own start is checked elsewhere, and cost 10 s here.
    # Imported here: every rank of this file's tests imports the file, and train_ddp.py's imports cost each.
    from test_train_ddp import train_in_ranks
    reference = train_in_ranks(2, [*run_args, "--checkpoint-dir", str(tmp_path / "reference")])
    assert [code for code, _ in reference] == [0, 0], "".join(printed for _, printed in reference)[-3000:]
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "ray_train.py", "--address", ray_cluster, "--workers", "2", *run_args,
                             "--checkpoint-dir", str(ckpt), "--max-failures", "1",
                             "--storage-path", str(tmp_path / "ray")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        end = time.monotonic() + 300
        while not (ckpt / "last.pt").exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        workers = ray_workers()
        assert (ckpt / "last.pt").exists() and workers, f"no checkpoint or no worker:\n{proc.communicate()[0]}"
        os.kill(workers[-1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=max(end - time.monotonic(), 60))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    assert "resuming from" in out, f"the workers did not resume after the kill (the run ended first?):\n{out}"
    final = torch.load(ckpt / "last.pt", weights_only=True)
    expected = torch.load(tmp_path / "reference" / "last.pt", weights_only=True)
    assert (final["epoch"], final["step"]) == (expected["epoch"], expected["step"]), out
    differ = [k for k in expected["model"] if not torch.equal(final["model"][k], expected["model"][k])]
    assert not differ, f"after the kill and Ray's restart, {differ} differ from the uninterrupted run:\n{out}"
