#!/usr/bin/env bash
# Train with data parallelism on SLURM the way the course's source does: srun itself starts
# every training process, one task per GPU, and no torchrun runs. submit.sh (one torchrun per
# node) is the other way; docs/clusters.md says when to use which.
#
#   sbatch submit_srun.sh                                  # 1 node, 4 GPUs: 4 tasks
#   sbatch --nodes=2 submit_srun.sh --impl solutions       # 2 nodes x 4 tasks; arguments go to train_ddp.py
#   sbatch --ntasks-per-node=8 --gpus-per-node=0 --cpus-per-task=1 --partition=cpu submit_srun.sh   # CPUs (gloo)
#
# Run sbatch from the repository folder; the log is slurm-<jobid>.out there.
#SBATCH --job-name=ddp-srun
#SBATCH --nodes=1
# One task per GPU: srun starts this many training processes on every node.
#SBATCH --ntasks-per-node=4
# Every task sees all the GPUs of its node and takes the one its local rank names
# (SLURM_LOCALID); 0 on a CPU partition.
#SBATCH --gpus-per-node=4
# CPUs for each task (each training process and its DataLoader workers).
#SBATCH --cpus-per-task=4
#SBATCH --time=00:30:00
#SBATCH --output=slurm-%j.out
set -euo pipefail

if [[ -z ${SLURM_JOB_ID:-} ]]; then
    echo "submit_srun.sh is a SLURM batch script: submit it with  sbatch submit_srun.sh" \
        "(on one machine without SLURM:  torchrun --standalone --nproc_per_node=2 train_ddp.py)" >&2
    exit 2
fi
if [[ -n ${SETUP_CMD:-} ]]; then  # as in submit.sh: module load, a virtual environment, ...
    set +u
    eval "$SETUP_CMD"
    set -u
fi

# The seed's three exports, worked out for any number of nodes and tasks instead of its
# fixed 12345 and 8: a fixed port collides with another job on the same node, and WORLD_SIZE=8
# in a smaller job stops every task with "WORLD_SIZE=8 is exported but srun started 2 processes".
# Each task finds its own rank and local rank in SLURM_PROCID and SLURM_LOCALID (launchers.py):
# with the three exports alone every task would take rank 0.
hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
export MASTER_ADDR=${hosts%%$'\n'*}  # the first node (not `| head -n 1`: SIGPIPE under pipefail)
export MASTER_PORT=${MASTER_PORT:-$((15000 + SLURM_JOB_ID % 15000))}
export WORLD_SIZE=$SLURM_NTASKS

echo "submit_srun.sh: job $SLURM_JOB_ID, $SLURM_NTASKS task(s) on $SLURM_NNODES node(s) ($SLURM_JOB_NODELIST)," \
    "meeting at $MASTER_ADDR:$MASTER_PORT; train_ddp.py $*"

# --kill-on-bad-exit: when one task fails, srun ends the others at once instead of leaving
# them waiting in a collective. --label: each line starts with its task's rank. srun 22.05 and
# later no longer inherit --cpus-per-task from sbatch: it is passed on explicitly.
status=0
srun --kill-on-bad-exit=1 --label --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" python train_ddp.py "$@" || status=$?
if [[ $status != 0 ]]; then
    echo "submit_srun.sh: training failed with exit code $status: the first error above is the cause" >&2
    exit "$status"
fi
echo "submit_srun.sh: job $SLURM_JOB_ID finished"
