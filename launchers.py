"""Who am I? This process's rank, local rank, world size and local world size, and where the
ranks meet, from whichever launcher started it (docs/launchers.md).

    python train_ddp.py                               # no launcher: a world of one
    torchrun --standalone --nproc_per_node=2 train_ddp.py     # RANK, LOCAL_RANK, WORLD_SIZE, ...
    srun --ntasks-per-node=2 python train_ddp.py      # SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS
    mpirun -np 2 python train_ddp.py                  # OMPI_COMM_WORLD_* (Open MPI), PMI_* (MPICH, Intel MPI)
    python ray_train.py --workers 2                   # Ray Train sets RANK... and joins the group itself

A launcher starts N copies of the same script; the copies differ only in their environment,
and each launcher names the same four numbers differently. set_torchrun_variables() reads
them and writes them back in torchrun's names (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), so that everything after it, init_process_group's env:// included,
reads one set of names whatever started the process.

Which variables win, and why:
1. RANK (torchrun, Ray Train, torchrunx, or you): the launcher closest to the process. Under
   submit.sh torchrun runs inside an srun task: SLURM_PROCID is then the node's task number,
   and torchrun's RANK is the process's rank.
2. OMPI_COMM_WORLD_RANK, then PMI_RANK with MPI_LOCALRANKID: mpirun sets them for its own
   processes. Inside a SLURM job, mpirun's processes also carry SLURM_PROCID: the batch script's
   0, or the node's number when mpirun starts its per-node daemons with srun. (srun --mpi=pmi2
   sets PMI_RANK but not MPI_LOCALRANKID: SLURM's own variables then say more.)
3. SLURM_PROCID, only in a task that srun started (SLURM_STEP_ID is set): the batch script
   itself has SLURM_PROCID=0 and SLURM_NTASKS=N too, and a plain `python train_ddp.py` in it is
   one process, not rank 0 of N.
Lightning (SLURMEnvironment, MPIEnvironment), submitit and Accelerate read the same variables;
where this file differs, a comment says so. A mistake in them ends the run with one line
(LaunchError, a ValueError: train_ddp.py prints it and exits with code 2).
"""
import contextlib
import os
import re
import sys
from dataclasses import dataclass


class LaunchError(ValueError):
    """The launcher's variables cannot work: a message that says what to set."""


@dataclass
class Launch:
    launcher: str  # who set the variables: "torchrun", "srun", "mpirun (Open MPI)", ..., or "none"
    rank: int  # this process among all
    local_rank: int  # among the processes on this machine: it picks the GPU
    world_size: int
    local_world_size: int
    master_addr: str = None  # where rank 0 listens and every rank meets; None: nowhere needed
    master_port: int = None


# launcher, then its names for rank, local rank, world size, local world size
MPI_NAMES = [
    ("mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpirun (MPICH or Intel MPI)", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS"),
]


def who_am_i(environ=None):
    """The Launch of this process, read from environ (default os.environ); changes nothing."""
    env = os.environ if environ is None else environ
    if "RANK" in env:
        me = from_torchrun(env)
    elif mpi_names(env):
        me = from_mpirun(env)
    elif "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        me = from_srun(env)
    else:
        me = Launch("none", 0, 0, integer(env, "WORLD_SIZE", 1), 1, *meeting_point(env, None, None))
        if me.world_size != 1:  # the seed's exports without srun, or a copied environment
            raise LaunchError(f"WORLD_SIZE={me.world_size} is set, but nothing says which rank this process is "
                              "(no RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK): start it with torchrun, "
                              "srun, mpirun or ray_train.py, which set one (docs/launchers.md)")
    check(me, env)
    return me


def from_torchrun(env):
    if "WORLD_SIZE" not in env:
        raise LaunchError(f"RANK={env['RANK']} is set but WORLD_SIZE is not: set both, or start with torchrun")
    return Launch("torchrun" if "TORCHELASTIC_RUN_ID" in env else "RANK and WORLD_SIZE", integer(env, "RANK"),
                  integer(env, "LOCAL_RANK", 0), integer(env, "WORLD_SIZE"), integer(env, "LOCAL_WORLD_SIZE", 1),
                  *meeting_point(env, None, None))


def mpi_names(env):
    """The MPI_NAMES row whose rank and local rank are both set, or None."""
    return next((names for names in MPI_NAMES if names[1] in env and names[2] in env), None)


def from_mpirun(env):
    launcher, rank, local_rank, size, local_size = mpi_names(env)
    me = Launch(launcher, integer(env, rank), integer(env, local_rank, 0), integer(env, size),
                integer(env, local_size, 1))
    # mpirun tells nothing about where to meet. On one node the loopback works, and a port is
    # taken from something all of this job's processes share and another job's do not: Open
    # MPI's job id (the same on every node), MPICH's per-node proxy (the processes' parent, the
    # same on one node only). Across nodes only you know which address the others can reach.
    # (Accelerate defaults to 127.0.0.1:29500: a fixed port collides when two jobs share a
    # machine. Lightning asks mpi4py, which the course does without.)
    one_node = me.local_world_size == me.world_size
    job = env.get("OMPI_MCA_ess_base_jobid") or (str(os.getppid()) if one_node else None)
    me.master_addr, me.master_port = meeting_point(env, "127.0.0.1" if one_node else None, job and port_from(job))
    return me


def from_srun(env):
    # The step's tasks, not the job's (SLURM_NTASKS): `srun -n 2` in a 4-task job starts 2.
    # (Lightning reads SLURM_NTASKS, the same number when srun starts every task of the job.)
    size = integer(env, "SLURM_STEP_NUM_TASKS") if "SLURM_STEP_NUM_TASKS" in env else integer(env, "SLURM_NTASKS")
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1"))
    node = min(integer(env, "SLURM_NODEID", 0), len(per_node) - 1)
    me = Launch("srun", integer(env, "SLURM_PROCID"), integer(env, "SLURM_LOCALID", 0), size, per_node[node])
    # The job's first host and a port from the job id, as submit.sh picks them for torchrun's
    # rendezvous: every task works them out alike, and two jobs on one node differ. (Lightning
    # takes 15000 + the job id's last four digits; this stays below the ephemeral ports too.)
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    me.master_addr, me.master_port = meeting_point(env, first_host(nodes) or None,
                                                   port_from(env.get("SLURM_JOB_ID", "0")))
    return me


def meeting_point(env, default_addr, default_port):
    """(MASTER_ADDR, MASTER_PORT): the exported ones win over a launcher's defaults."""
    addr = env.get("MASTER_ADDR") or default_addr
    port = integer(env, "MASTER_PORT") if env.get("MASTER_PORT") else default_port
    return addr, port


def group_exists():
    """A process group is up (Ray Train made one). Not importing torch keeps this module light
    for tools/interrupt.py; without torch.distributed imported there is no group."""
    return "torch.distributed" in sys.modules and sys.modules["torch.distributed"].is_initialized()


def check(me, env):
    """Numbers that cannot all be true: one line saying which and what to change."""
    size_set = env.get("WORLD_SIZE")
    if me.launcher not in ("torchrun", "RANK and WORLD_SIZE", "none") and size_set and int(size_set) != me.world_size:
        raise LaunchError(f"WORLD_SIZE={size_set} is exported but {me.launcher} started {me.world_size} processes: "
                          f"unset WORLD_SIZE ({me.launcher} says how many), or start {size_set} processes")
    if not 0 <= me.rank < me.world_size:
        raise LaunchError(f"rank {me.rank} with a world size of {me.world_size} ({me.launcher}): a rank is "
                          "0 .. world size - 1; is WORLD_SIZE exported smaller than the number of processes?")
    if not 0 <= me.local_rank < me.local_world_size <= me.world_size:
        raise LaunchError(f"local rank {me.local_rank} of {me.local_world_size} processes on this machine, "
                          f"{me.world_size} in all ({me.launcher}): the local rank must be below the processes on "
                          "this machine, and they cannot outnumber the world; check LOCAL_RANK and LOCAL_WORLD_SIZE")
    if me.world_size > 1 and me.master_addr is None and not group_exists():
        if me.launcher.startswith("mpirun"):  # the only launcher that leaves it open: across machines
            raise LaunchError(f"{me.world_size} processes on several machines ({me.launcher}) and no meeting point: "
                              "export MASTER_ADDR=<the first machine's name or address> and MASTER_PORT=<a free "
                              "port> where you start mpirun (Open MPI passes them on with -x MASTER_ADDR -x "
                              "MASTER_PORT)")
        raise LaunchError(f"{me.launcher} says rank {me.rank} of {me.world_size}, but not where to meet: export "
                          "MASTER_ADDR=<rank 0's machine> and MASTER_PORT=<a free port> (torchrun sets both)")
    if me.world_size > 1 and me.master_port is None and not group_exists():
        raise LaunchError(f"MASTER_ADDR={me.master_addr} is set but MASTER_PORT is not: export MASTER_PORT=<a free port>")


def set_torchrun_variables(environ=None):
    """who_am_i(), then its numbers written into the environment in torchrun's names, so that
    print0, env:// and whatever reads RANK see them. Returns the Launch."""
    env = os.environ if environ is None else environ
    me = who_am_i(env)
    if me.launcher == "none":  # plain python: nothing to translate, and nothing written
        return me
    env.update(RANK=str(me.rank), LOCAL_RANK=str(me.local_rank), WORLD_SIZE=str(me.world_size),
               LOCAL_WORLD_SIZE=str(me.local_world_size))
    if me.master_addr is not None and me.master_port is not None:
        env.update(MASTER_ADDR=me.master_addr, MASTER_PORT=str(me.master_port))
    return me


def launcher_name(environ=None):
    """Who started this process, for messages: "torchrun", "mpirun (...)", "srun", or None
    (plain python, or a launcher that leaves no trace of its own, such as Ray)."""
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if mpi_names(env):
        return mpi_names(env)[0]
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        return "srun"
    return None


@contextlib.contextmanager
def port_taken_explained(me):
    """Around init_process_group: rank 0 failing to listen on MASTER_PORT (EADDRINUSE, another
    run or job has it) becomes one line naming the port, not a traceback from the C++ store."""
    import torch.distributed as dist

    try:
        yield
    except dist.DistNetworkError as error:
        if "EADDRINUSE" not in str(error) and "ddress already in use" not in str(error):
            raise
        raise LaunchError(f"port {me.master_port} on {me.master_addr} is taken (another run or job listens on it): "
                          "export MASTER_PORT=<another free port, 15000-32767> and start again") from None


# ------------------------------------------------------------------ helpers


def integer(env, name, default=None):
    value = env.get(name)
    if value is None:
        if default is None:
            raise LaunchError(f"{name} is not set, and the other launcher variables need it")
        return default
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name}={value!r} is not a whole number") from None


def port_from(job_id):
    """A port from a job's id: 15000-29999, below Linux's ephemeral ports (32768 and up), which
    the kernel hands out to outgoing connections and could have given away already."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return 15000 + int(digits) % 15000


def tasks_per_node(text):
    """SLURM's task counts per node, "2(x3),1" -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match:
            counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts or [1]


def first_host(nodelist):
    """The first name of a SLURM node list: "gpu[003-004,7],cpu1" -> "gpu003". What
    `scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1` prints, without a subprocess."""
    match = re.match(r"([^,\[]*)(?:\[([^\],-]*))?", nodelist.strip())
    return match.group(1) + (match.group(2) or "") if match and match.group(0) else ""
