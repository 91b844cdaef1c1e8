#!/usr/bin/env bash
# Train with data parallelism on SLURM: one torchrun per node, one process per GPU.
#
#   sbatch submit.sh                                  # 1 node, 4 GPUs, your template_*.py files
#   sbatch --nodes=2 submit.sh --impl solutions       # 2 nodes; arguments go to train_ddp.py
#   sbatch --partition=gpu --account=myproject submit.sh
#   NPROC_PER_NODE=8 sbatch --gpus-per-node=0 --cpus-per-task=8 --partition=cpu submit.sh   # CPUs (gloo)
#   sbatch --time=01:00:00 submit.sh --checkpoint-dir ckpt --epochs 100   # a long run as a chain of 1-hour jobs
#   MIN_NODES=1 sbatch --nodes=2 --no-kill submit.sh --checkpoint-dir ckpt   # elastic: goes on if a node dies
#
# Run sbatch from the repository folder: the job starts there and runs ./train_ddp.py.
# The log is slurm-<jobid>.out in that folder. docs/clusters.md explains
# every setting below and what to do when a run fails.
#
# Every #SBATCH line is a default: an option given to sbatch, or its SBATCH_* environment
# variable (SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_GPUS_PER_NODE, SBATCH_TIMELIMIT), wins.
#SBATCH --job-name=ddp-cifar10
# Machines. torchrun runs once on each and learns their number from SLURM_NNODES.
#SBATCH --nodes=1
# ONE task per node: torchrun itself starts the per-GPU processes. More tasks would start
# a torchrun each, and each would start its own set of processes.
#SBATCH --ntasks-per-node=1
# GPUs on each node, one training process each. Set it to what your nodes have; 0 on a CPU partition.
#SBATCH --gpus-per-node=4
# CPUs for the single task, shared by all its training processes and their DataLoader workers.
#SBATCH --cpus-per-task=16
# Wall-clock limit: a hung run is killed after this rather than burning the allocation.
#SBATCH --time=00:30:00
# %j is the job id: every job has its own log, in the folder sbatch ran in. Append: a requeued
# job keeps its id, and its log keeps the earlier runs' lines.
#SBATCH --output=slurm-%j.out
#SBATCH --open-mode=append
# 120 s before the time limit SLURM sends USR1 to this script (B:); it passes the signal on, and
# with --checkpoint-dir every rank stops after its current step, rank 0 saves, and the job puts
# itself back in the queue (--requeue), to continue from that checkpoint. REQUEUE=0: just stop.
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
set -euo pipefail

if [[ -z ${SLURM_JOB_ID:-} ]]; then
    echo "submit.sh is a SLURM batch script: submit it with  sbatch submit.sh" \
        "(on one machine without SLURM:  torchrun --standalone --nproc_per_node=2 train_ddp.py)" >&2
    exit 2
fi

# ---- what a cluster differs in, all from the environment (sbatch passes it on) ----
# SETUP_CMD: shell commands that make python with PyTorch available on the nodes, for example
#   SETUP_CMD='module load cuda/12.4 && source ~/venvs/ddp/bin/activate' sbatch submit.sh
# It runs here, on the first node, before srun; srun hands the resulting environment to
# every node. Without it the job uses the environment sbatch was called from.
if [[ -n ${SETUP_CMD:-} ]]; then
    set +u  # module and conda scripts read unset variables
    eval "$SETUP_CMD"
    set -u
fi

# NPROC_PER_NODE: training processes on each node. The default is one per allocated GPU;
# on CPUs (no GPUs allocated) it is 1 unless you set it.
gpus=${SLURM_GPUS_ON_NODE:-0}
if [[ $gpus == 0 && -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
fi
nproc_per_node=${NPROC_PER_NODE:-$((gpus > 0 ? gpus : 1))}

# The rendezvous runs on the first node of the allocation: every node's torchrun meets
# there, and then sets MASTER_ADDR and MASTER_PORT for its processes itself. A port taken
# from the job id keeps two jobs that share a node apart (MASTER_PORT overrides it); it
# stays below Linux's ephemeral ports (32768 and up).
# (Not `| head -n 1`: with pipefail, a long node list could end the job with SIGPIPE.)
hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${hosts%%$'\n'*}
port=${MASTER_PORT:-$((15000 + SLURM_JOB_ID % 15000))}

if [[ ! -f train_ddp.py ]]; then
    echo "submit.sh: no train_ddp.py in $PWD: run sbatch from the repository folder" >&2
    exit 2
fi
command -v torchrun >/dev/null || {
    echo "submit.sh: torchrun not found on $(hostname): activate your PyTorch environment before sbatch," \
        "or pass it as SETUP_CMD='source ~/venv/bin/activate'" >&2
    exit 2
}

# MIN_NODES: elastic training (docs/task8-checkpoints.md). torchrun --nnodes=MIN_NODES:SLURM_NNODES
# waits for at least MIN_NODES nodes; when a node dies the others' processes fail, their torchruns
# meet again without it (--max-restarts) and resume the newest checkpoint on fewer ranks. srun must
# then not end the job step when one node's task fails (--kill-on-bad-exit=0), nor SLURM the job
# when a node fails (sbatch --no-kill). The rendezvous lives on the first node: it must survive.
# torch 2.14 shares that store with the training processes by default, which breaks a scale-up;
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 turns the sharing off (harmless on a fixed-size job).
nnodes=$SLURM_NNODES
kill_on_bad_exit=1
restarts=()
if [[ -n ${MIN_NODES:-} ]]; then
    nnodes="$MIN_NODES:$SLURM_NNODES"
    kill_on_bad_exit=0
    restarts=(--max_restarts="${MAX_RESTARTS:-3}")
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
fi

echo "submit.sh: job $SLURM_JOB_ID on $SLURM_NNODES node(s): $SLURM_JOB_NODELIST"
echo "submit.sh: rendezvous at $head_node:$port, $nproc_per_node process(es) per node," \
    "$((SLURM_NNODES * nproc_per_node)) in all; train_ddp.py $*"

# srun starts one torchrun per node (--ntasks-per-node=1). It is given the job's CPUs
# explicitly because srun 22.05 and later no longer inherit --cpus-per-task from sbatch.
# --kill-on-bad-exit ends every node's torchrun as soon as one fails, instead of leaving the
# others waiting in a collective until the time limit. --label prefixes each line of the
# log with the number of the node it came from.
# USR1 goes from here to srun, and from srun to every process of the job step on every node:
# torchrun and its training processes. torchrun must handle it rather than die of it: it does
# for the signals of its --signals-to-handle, whose default PET_SIGNALS_TO_HANDLE sets (older
# torchruns read TORCHELASTIC_SIGNALS_TO_HANDLE), and then waits for its processes to end.
export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
export TORCHELASTIC_SIGNALS_TO_HANDLE=$PET_SIGNALS_TO_HANDLE
# Without --checkpoint-dir there is nothing to continue from: the run just ends at the limit.
checkpointing=0
for arg in "$@"; do
    [[ $arg == --checkpoint-dir* ]] && checkpointing=1
done
stopping=0
forward_usr1() {
    if [[ $checkpointing == 0 ]]; then
        echo "submit.sh: USR1 (the time limit is near), but without --checkpoint-dir this run cannot continue later"
        return
    fi
    stopping=1
    echo "submit.sh: USR1 (the time limit is near): asking training to checkpoint and stop"
    kill -USR1 "$srun_pid" 2>/dev/null || true
}
trap forward_usr1 USR1

# srun runs in the background because bash runs a trap only between commands: `wait` is
# interrupted by the signal, the trap runs, and the loop waits again until srun has ended.
srun --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" --kill-on-bad-exit="$kill_on_bad_exit" --label \
    torchrun \
    --nnodes="$nnodes" \
    ${restarts[@]+"${restarts[@]}"} \
    --nproc_per_node="$nproc_per_node" \
    --rdzv_backend=c10d \
    --rdzv_endpoint="$head_node:$port" \
    --rdzv_id="$SLURM_JOB_ID" \
    train_ddp.py "$@" &
srun_pid=$!
while :; do
    status=0
    wait "$srun_pid" || status=$?
    kill -0 "$srun_pid" 2>/dev/null || break
done

if [[ $stopping == 1 ]]; then
    # torchrun ends with a non-zero code after passing a signal on, even when every rank saved
    # and ended cleanly, so the code says nothing here: the log above shows the checkpoint.
    if [[ ${REQUEUE:-1} == 1 ]]; then
        echo "submit.sh: job $SLURM_JOB_ID stopped before its time limit; requeued, it continues from the checkpoint"
        scontrol requeue "$SLURM_JOB_ID"
    else
        echo "submit.sh: job $SLURM_JOB_ID stopped before its time limit; submit it again to continue"
    fi
    exit 0
fi
if [[ $status != 0 ]]; then
    echo "submit.sh: training failed with exit code $status: the first error above is the cause" \
        "(docs/clusters.md lists the common ones)" >&2
    exit "$status"
fi
echo "submit.sh: job $SLURM_JOB_ID finished"
