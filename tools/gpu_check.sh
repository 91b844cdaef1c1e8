#!/usr/bin/env bash
# The course on a GPU node: every path that only a GPU takes, run once before the course starts.
#
#     bash tools/gpu_check.sh [LOG_DIR]      # default runs/gpu_check; under 10 minutes on one GPU
#
# Each step runs with its own time limit and writes LOG_DIR/<step>.log; a failed step does not stop
# the others, and LOG_DIR/summary.txt lists every step as ok, FAILED, TIMEOUT or not run (out of
# the time budget, GPU_CHECK_BUDGET seconds) with its seconds; GPU_CHECK_STEPS=REGEX runs only some.
# Exit code: the number of steps that did not pass (0: all passed).
#
# One GPU is enough for everything here:
#   - the GPU-marked tests (pytest -m gpu): PyTorch's SyncBatchNorm against Task 11's, the comm hooks
#     of Task 12 against PyTorch's, DiLoCo's synced copy (Task 13), Task 14 against parallelize_module, Task 15
#     against context_parallel (CUDA only), Task 16's all-to-alls, CUDA scatter, map_location, ...;
#   - train_ddp.py on 1 process with NCCL (one GPU cannot hold two NCCL ranks), each strategy;
#   - train_ddp.py on 2 processes with gloo carrying CUDA tensors (both ranks on the one GPU);
#   - the ViT (Tasks 14-16): alone on NCCL, and with gloo --tp 2 --sp (ours and parallelize_module's), --cp 2
#     --cp-impl ulysses and --moe 4 --ep 2, whose all-to-alls carry CUDA tensors; ring attention (send/recv)
#     is refused there, and runs on NCCL where there are 2 GPUs;
#   - Task 5's overlap with --profile: which kernels ran on which CUDA stream;
#   - benchmarks/allreduce_bench.py, ddp_bench.py and memory_bench.py on CUDA.
# What needs 2 or more GPUs is run when there are (NCCL with 2 ranks: Tasks 9, 10 and 14-16; nn.DataParallel
# of Task 4):
# on a multi-GPU node the NCCL steps use every GPU (--nproc_per_node=<number of GPUs>) and pytest -m gpu runs the
# tests that the summary lists as skipped on one GPU.
set -u
cd "$(dirname "$0")/.." || exit 2
LOG=${1:-runs/gpu_check}
mkdir -p "$LOG"
: >"$LOG/summary.txt"
PYTHON=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET:-570}  # seconds; a step that would start later is listed as not run
START=$SECONDS
export PYTHONUNBUFFERED=1

if ! GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())") || [ "$GPUS" -lt 1 ]; then
    echo "tools/gpu_check.sh: PyTorch sees no GPU here; run it on a GPU node (nvidia-smi lists them)" >&2
    exit 2
fi

step() {  # step NAME LIMIT COMMAND...: run COMMAND with a time limit, log it, record the outcome
    local name=$1 limit=$2 began=$SECONDS status left=$((BUDGET - (SECONDS - START)))
    shift 2
    [[ $name =~ ${GPU_CHECK_STEPS:-.} ]] || return 0  # GPU_CHECK_STEPS='gloo|bench': only the steps it matches
    if [ "$left" -lt 15 ]; then
        echo "not run  $name (the budget of ${BUDGET} s is spent)" | tee -a "$LOG/summary.txt"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left  # the whole check keeps to its budget
    timeout -k 10 "$limit" "$@" >"$LOG/$name.log" 2>&1
    status=$?
    if [ $status -eq 0 ]; then
        status="ok      "
    elif [ $status -eq 124 ] || [ $status -eq 137 ]; then
        status="TIMEOUT "
    else
        status="FAILED  "
    fi
    echo "$status $name ($((SECONDS - began)) s): ${*: -12}" | tee -a "$LOG/summary.txt"
}

TORCHRUN=("$PYTHON" -m torch.distributed.run --standalone)
TRAIN=(train_ddp.py --impl solutions --data synthetic --epochs 1 --train-samples 4096 --test-samples 1024
       --batch-size 256 --no-plot)
NCCL=("${TORCHRUN[@]}" --nproc_per_node="$GPUS")  # one rank a GPU: NCCL
GLOO=("${TORCHRUN[@]}" --nproc_per_node=2)        # two ranks sharing the GPUs: gloo carries CUDA tensors
# what must be refused in one line rather than abort: `refused PATTERN COMMAND...` fails unless
# COMMAND fails saying PATTERN (torchrun exits with 1 whatever its ranks' exit codes)
# shellcheck disable=SC2016  # (expanded by that bash, not this one)
REFUSED=(bash -c 'out=$("${@:2}" 2>&1); code=$?; echo "$out"; [ $code -ne 0 ] && grep -q "$1" <<<"$out"' refused)

"$PYTHON" - >"$LOG/environment.txt" 2>&1 <<'EOF'
import platform, torch, torchvision
nccl = torch.cuda.nccl.version()  # a tuple; an int in older releases
print(f"python {platform.python_version()}, torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
EOF
tee -a "$LOG/summary.txt" <"$LOG/environment.txt"

# the tests that need a GPU: what a student's check.py and the grader run there
step gpu-tests 300 "$PYTHON" -m pytest -m gpu -q -rs -p no:cacheprovider

# one process per GPU, NCCL: the course's own DDP, PyTorch's, and the overlap's CUDA timeline
step nccl-solutions 120 "${NCCL[@]}" "${TRAIN[@]}" --metrics "$LOG/nccl-solutions.csv"
step nccl-ddp 120 "${NCCL[@]}" "${TRAIN[@]}" --impl ddp --metrics "$LOG/nccl-ddp.csv"
step nccl-overlap-profile 120 "${NCCL[@]}" "${TRAIN[@]}" --sync overlap --profile "$LOG/profile"
step nccl-profile-streams 60 "$PYTHON" support/timeline.py --streams "$LOG/profile/trace.json"
# Task 8: save on the GPU, resume from it (torch.load with map_location)
step nccl-checkpoint-save 120 "${NCCL[@]}" "${TRAIN[@]}" --checkpoint-dir "$LOG/ckpt"
step nccl-checkpoint-resume 120 "${NCCL[@]}" "${TRAIN[@]}" --epochs 2 --checkpoint-dir "$LOG/ckpt"

# two ranks on the GPUs through gloo
step gloo-solutions 150 "${GLOO[@]}" "${TRAIN[@]}" --backend gloo
step gloo-ddp 150 "${GLOO[@]}" "${TRAIN[@]}" --backend gloo --impl ddp

# the benchmarks on CUDA
if [ "$GPUS" -ge 2 ]; then
    step allreduce-bench-nccl 150 "${NCCL[@]}" benchmarks/allreduce_bench.py --device cuda --repeats 10 --out "$LOG/bench"
fi
step allreduce-bench-gloo-cuda 150 "${GLOO[@]}" benchmarks/allreduce_bench.py --device cuda --backend gloo \
    --algorithms torch --max-size 16MB --repeats 5 --out "$LOG/bench"
step ddp-bench-nccl 180 "${NCCL[@]}" benchmarks/ddp_bench.py --device cuda --repeats 10 --out "$LOG/bench"
step memory-bench-cuda 180 "$PYTHON" benchmarks/memory_bench.py --device cuda --ranks 1 --out "$LOG/bench"

step ddp-bench-gloo-cuda 180 "${GLOO[@]}" benchmarks/ddp_bench.py --device cuda --backend gloo --quick --out "$LOG/bench"
step memory-bench-gloo-cuda 180 "$PYTHON" benchmarks/memory_bench.py --device cuda --quick --ranks 2 --out "$LOG/bench"

# each parallelism's strategy (Tasks 6, 7, 9-13), on NCCL and on gloo: the two at once, as they
# time nothing and leave most of the GPU and the cores idle (about 4 minutes instead of 7 on an H200)
strategies() {
    local backend=$1 ranks extra flags
    if [ "$backend" = nccl ]; then ranks=("${NCCL[@]}"); extra=(); else ranks=("${GLOO[@]}"); extra=(--backend gloo); fi
    for flags in "--shard optimizer --optimizer adamw" "--shard full --optimizer adamw" "--batchnorm sync" \
                 "--impl ddp --batchnorm sync" "--sync overlap --compress bf16" "--sync overlap --compress powersgd" \
                 "--impl ddp --compress powersgd" "--diloco 4" "--impl ddp --local-sgd 4"; do
        # shellcheck disable=SC2086  # (flags: several words)
        step "$backend-$(tr -d '-' <<<"$flags" | tr ' ' '-')" 150 "${ranks[@]}" "${TRAIN[@]}" "${extra[@]}" $flags
    done
    # the ViT (Tasks 14-16): one process a GPU trains it alone on one GPU, with its experts on that rank (--ep 1)
    if [ "$backend" = nccl ]; then
        step nccl-vit 150 "${ranks[@]}" "${TRAIN[@]}" --model vit
        step nccl-vit-moe 150 "${ranks[@]}" "${TRAIN[@]}" --model vit --moe 4
    fi
    if [ "$backend" = gloo ]; then
        step gloo-tp 150 "${GLOO[@]}" "${TRAIN[@]}" --backend gloo --tp 2
        # Task 14 ours and parallelize_module's; Task 15's Ulysses and Task 16's experts: all-to-alls of CUDA tensors
        step gloo-vit-tp-sp 150 "${GLOO[@]}" "${TRAIN[@]}" --backend gloo --model vit --tp 2 --sp
        step gloo-vit-tp-sp-torch 150 "${GLOO[@]}" "${TRAIN[@]}" --backend gloo --model vit --tp 2 --sp --impl ddp
        step gloo-vit-ulysses 150 "${GLOO[@]}" "${TRAIN[@]}" --backend gloo --model vit --cp 2 --cp-impl ulysses
        step gloo-vit-experts 150 "${GLOO[@]}" "${TRAIN[@]}" --backend gloo --model vit --moe 4 --ep 2
        step gloo-vit-ring-refused 60 "${REFUSED[@]}" "CPU tensors only" "${GLOO[@]}" "${TRAIN[@]}" --backend gloo \
            --model vit --cp 2
        # gloo's send/recv take CPU tensors only: Task 3's all-reduces by hand and the pipeline are refused
        step gloo-pp-refused 60 "${REFUSED[@]}" "CPU tensors only" "${GLOO[@]}" "${TRAIN[@]}" --backend gloo --pp 2
        step gloo-ring-refused 60 "${REFUSED[@]}" "CPU tensors only" "${GLOO[@]}" "${TRAIN[@]}" --backend gloo \
            --allreduce ring
    elif [ "$GPUS" -ge 2 ]; then
        step nccl-tp 150 "${TORCHRUN[@]}" --nproc_per_node=2 "${TRAIN[@]}" --tp 2
        step nccl-pp 150 "${TORCHRUN[@]}" --nproc_per_node=2 "${TRAIN[@]}" --pp 2 --microbatches 4 --schedule 1f1b
        local vit
        for vit in "--tp 2 --sp" "--tp 2 --sp --impl ddp" "--cp 2" "--cp 2 --cp-impl ulysses" "--moe 4 --ep 2"; do
            # shellcheck disable=SC2086  # (vit: several words)
            step "nccl-vit-$(tr -d '-' <<<"$vit" | tr ' ' '-')" 150 "${TORCHRUN[@]}" --nproc_per_node=2 "${TRAIN[@]}" \
                --model vit $vit
        done
    fi
}
strategies nccl &
strategies gloo
wait

FAILED=$(grep -cE "^(FAILED|TIMEOUT|not run) " "$LOG/summary.txt")
echo "$FAILED step(s) did not pass; $((SECONDS - START)) s; logs in $LOG/" | tee -a "$LOG/summary.txt"
exit "$FAILED"
