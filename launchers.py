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
   and torchrun's RANK is the process's rank. Two mistakes are told apart from that: a RANK
   exported by hand that srun or mpirun, starting every process itself, contradicts; and
   several torchruns on one machine started by srun or mpirun (a double launch).
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
    """The launcher's variables cannot work: a message that says what to set. `rank`: this
    process's rank where the launcher itself said it although another variable contradicts it
    (an exported RANK), for the line's [rank N] tag; None otherwise."""

    def __init__(self, message, rank=None):
        super().__init__(message)
        self.rank = rank


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
    elif is_srun_task(env):
        me = from_srun(env)
    else:
        me = Launch("none", 0, 0, integer(env, "WORLD_SIZE", 1), 1, *meeting_point(env, None, None))
        if me.world_size != 1:  # the seed's exports without srun, or a copied environment
            raise LaunchError(f"WORLD_SIZE={me.world_size} is set, but nothing says which rank this process is "
                              "(no RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK): start it with torchrun, "
                              "srun, mpirun or ray_train.py, which set one (docs/launchers.md)")
        mpi = next((names for names in MPI_NAMES if integer(env, names[3], 1) > 1), None)
        if mpi:  # an MPI that says the rank but not the local rank: each process would train alone
            raise LaunchError(f"{mpi[3]}={env[mpi[3]]} says an MPI launcher started several processes, but {mpi[2]} "
                              "is not set, so nothing says which GPU is this process's: start with torchrun, srun, "
                              "Open MPI's or MPICH's mpirun, or set RANK, LOCAL_RANK and WORLD_SIZE yourself")
    check(me, env)
    return me


def from_torchrun(env):
    if "WORLD_SIZE" not in env:
        raise LaunchError(f"RANK={env['RANK']} is set but WORLD_SIZE is not: set both, or start with torchrun")
    rank, world_size = integer(env, "RANK"), integer(env, "WORLD_SIZE")
    # torchrun, Ray and torchrunx set all four. Set by hand (PyTorch's env:// example exports
    # RANK and WORLD_SIZE only), the local numbers may be missing: without LOCAL_WORLD_SIZE
    # the processes are taken to share one machine, so the local rank is the rank. With it
    # below WORLD_SIZE they do not, and only LOCAL_RANK can say which GPU is this process's.
    if "LOCAL_RANK" in env:
        local_rank = integer(env, "LOCAL_RANK")
        local_size = integer(env, "LOCAL_WORLD_SIZE", local_rank + 1)  # unknown: at least this many here
    elif integer(env, "LOCAL_WORLD_SIZE", world_size) == world_size:
        local_rank, local_size = rank, world_size
    else:
        raise LaunchError(f"LOCAL_WORLD_SIZE={env['LOCAL_WORLD_SIZE']} of WORLD_SIZE={world_size} says the processes "
                          "are on several machines, but LOCAL_RANK is not set: export LOCAL_RANK (this process's "
                          "number on its machine, which picks its GPU), or start with torchrun")
    me = Launch("torchrun" if "TORCHELASTIC_RUN_ID" in env else "RANK and WORLD_SIZE", rank, local_rank, world_size,
                local_size, *meeting_point(env, None, None))
    if me.launcher == "torchrun":
        check_torchrun_inside(me, env)
    else:
        check_exported_rank(me, env)
    return me


def check_exported_rank(me, env):
    """RANK exported by hand before srun or mpirun (a copied recipe, a shell that ran a test)
    reaches every process alike, and every one would take that rank. When the launcher started
    WORLD_SIZE processes itself, its own rank is the true one. (A launcher that starts one
    process per node and sets RANK itself, or Ray inside an srun task, leaves the two apart
    rightly: their processes outnumber srun's tasks, or the group is made already.)"""
    under = srun_or_mpirun(env)
    if under and under.world_size == me.world_size and under.rank != me.rank and not group_exists():
        raise LaunchError(f"RANK={me.rank} is exported, but {under.launcher} started this process as rank {under.rank} "
                          f"of {under.world_size}: unset RANK (and LOCAL_RANK) before {under.launcher.split()[0]}, "
                          "which tells each process its own", rank=under.rank)


def check_torchrun_inside(me, env):
    """torchrun inside srun is submit.sh's way: ONE srun task per machine, each a torchrun, and
    the torchruns meet (torchrun's GROUP_WORLD_SIZE counts them). Several srun tasks or mpirun
    processes on a machine each starting a torchrun is a double launch: with --standalone every
    torchrun trains alone, as its own world, and writes the same files as the others."""
    outer = srun_or_mpirun(env)
    torchruns = integer(env, "GROUP_WORLD_SIZE", 0)  # how many met in torchrun's rendezvous
    if outer and outer.local_world_size > 1 and 0 < torchruns < outer.world_size:
        name = outer.launcher.split()[0]
        raise LaunchError(f"{name} started {outer.local_world_size} processes on this machine and each ran torchrun, "
                          f"which starts processes of its own: start one torchrun per machine, or none ({name} python "
                          "train_ddp.py starts every process itself; on SLURM: submit.sh or submit_srun.sh)")


def srun_or_mpirun(env):
    """What mpirun or srun says of this process when RANK is set too (torchrun or you), or None."""
    return from_mpirun(env) if mpi_names(env) else from_srun(env) if is_srun_task(env) else None


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
    me = Launch("srun", integer(env, "SLURM_PROCID"), integer(env, "SLURM_LOCALID", 0), size, srun_tasks_here(env))
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
    if port is not None and not 1 <= port <= 65535:
        raise LaunchError(f"MASTER_PORT={port} is not a port (1-65535): export MASTER_PORT=<a free port, 15000-32767>")
    return addr, port


def group_exists():
    """A process group is up (Ray Train made one). Not importing torch keeps this module light
    for support/interrupt.py; without torch.distributed imported there is no group."""
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


def threads_per_process(environ=None):
    """How many threads each operation of this process may compute with: OMP_NUM_THREADS when set
    to a number (torchrun sets 1 when it starts several processes), else in a task that srun started
    its CPUs (SLURM_CPUS_PER_TASK, or the cores it is bound to), else the cores this process may use
    shared out between the processes its launcher started on this machine; at least one. More threads
    than free cores is slower: each operation waits for its slowest thread (docs/training.md). Only os
    and the launcher's variables are read, so train_ddp.py can ask before torch is imported."""
    env = os.environ if environ is None else environ
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) >= 1:
        return int(threads)
    # srun may or may not bind a task to its CPUs (that is the cluster's setting), so the cores a task
    # sees can be its own or the whole node's: the number it was given says which share is its own.
    if is_srun_task(env) and env.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(1, int(env["SLURM_CPUS_PER_TASK"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        processes = who_am_i(env).local_world_size
    except LaunchError:  # main() says what is wrong with the variables, in one line
        processes = 1
    # Without --cpus-per-task, srun's task/affinity binds each task to cores of its own (the node's tasks then
    # see no more than the step's CPUs here, SLURM_CPUS_ON_NODE, together), and task/none leaves each the
    # step's or the node's. Measured on the test cluster, 2 tasks on 2 CPUs: 1 core each, bound; both, unbound.
    step_cpus = env.get("SLURM_CPUS_ON_NODE", "")
    if is_srun_task(env) and step_cpus.isdigit():
        if cores * processes <= int(step_cpus):
            return max(1, cores)
        cores = min(cores, int(step_cpus))
    return max(1, cores // processes)


def launcher_name(environ=None):
    """Who started this process, for messages: "torchrun", "mpirun (...)", "srun", or None
    (plain python, or a launcher that leaves no trace of its own, such as Ray)."""
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if mpi_names(env):
        return mpi_names(env)[0]
    if is_srun_task(env):
        return "srun"
    return None


def rank_tag(environ=None):
    """"[rank N] " for a line this process prints, N the rank the launcher resolved (who_am_i; where
    an exported RANK contradicts srun or mpirun, theirs), the exported RANK where the variables
    say no more, "" under plain python."""
    env = os.environ if environ is None else environ
    try:
        me = who_am_i(env)
        rank = None if me.launcher == "none" else me.rank
    except LaunchError as error:
        rank = error.rank if error.rank is not None else env.get("RANK")
    return "" if rank is None else f"[rank {rank}] "


@contextlib.contextmanager
def meeting_failures_explained(me):
    """Around init_process_group: the ranks failing to meet at MASTER_ADDR:MASTER_PORT becomes one
    line saying what to change, not a traceback from the C++ store. Three ways it fails:
    - rank 0 cannot listen on the port (EADDRINUSE): another run or job has it;
    - rank 0 waited the whole timeout and not every rank came: the launcher started fewer
      processes than the world size, or the others were told another meeting point;
    - another rank found no rank 0 there in time: rank 0 is not running, or MASTER_ADDR is not
      a name of rank 0's machine that this machine reaches."""
    import torch.distributed as dist

    try:
        yield
    except dist.DistError as error:  # DistNetworkError, DistStoreError
        text = str(error)
        where = f"{me.master_addr}:{me.master_port}"
        came = re.search(r"(\d+)/(\d+) clients joined", text)
        if "EADDRINUSE" in text or "ddress already in use" in text:
            raise LaunchError(f"port {me.master_port} on {me.master_addr} is taken (another run or job listens on it): "
                              "export MASTER_PORT=<another free port, 15000-32767> and start again") from None
        if came:
            raise LaunchError(f"rank 0 waited at {where}, but only {came.group(1)} of {me.world_size} processes came "
                              f"({me.launcher}): did the launcher start {me.world_size}, and were all of them given "
                              "this MASTER_ADDR and MASTER_PORT?") from None
        if "trying to connect" in text:
            raise LaunchError(f"rank {me.rank} found no rank 0 at {where} ({me.launcher}): is rank 0 running, and is "
                              f"MASTER_ADDR a name of its machine that this one reaches (getent hosts "
                              f"{me.master_addr})?") from None
        raise


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


def is_srun_task(env):
    """A task that srun started (SLURM_STEP_ID is set), not the batch script, which has SLURM_PROCID too."""
    return "SLURM_PROCID" in env and "SLURM_STEP_ID" in env


def srun_tasks_here(env):
    """How many tasks of this srun step run on this node."""
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1"))
    return per_node[min(integer(env, "SLURM_NODEID", 0), len(per_node) - 1)]


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
