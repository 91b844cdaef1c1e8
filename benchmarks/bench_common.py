"""What the benchmarks share: where they write, how they start their ranks, which device they
run on, and the check that torchvision works.
(Imported as bench_common: a script's own folder is on sys.path.)

A run writes under runs/benchmarks/ (ignored by git). benchmarks/results/ holds the figures
the pages show, committed: only --update-results writes there, so that a quick try never
replaces them (the grader would then report the course as modified).
"""
import datetime
import multiprocessing
import os
import queue
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")  # committed: the pages' figures
RUNS = os.path.join(ROOT, "runs", "benchmarks")  # ignored by git: every other run


def add_output_arguments(parser, what):
    parser.add_argument("--out", default=None,
                        help=f"folder for {what} (default: runs/benchmarks, or benchmarks/results with "
                        "--update-results)")
    parser.add_argument("--update-results", action="store_true",
                        help="write into benchmarks/results, replacing the committed figures that the pages show")


def output_folder(args):
    """--out, or the folder --update-results chooses."""
    if args.out and args.update_results:
        sys.exit("--out and --update-results both say where to write: give one")
    return args.out or (RESULTS if args.update_results else RUNS)


def add_device_arguments(parser):
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="where the tensors live (default: cuda with --backend nccl, else cpu)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                        help="default: nccl with --device cuda, else gloo; gloo with --device cuda carries CUDA "
                        "tensors, and several ranks can share one GPU")


def device_defaults(args):
    """Fill in --device and --backend from each other (parse_args calls it)."""
    args.device = args.device or ("cuda" if args.backend == "nccl" else "cpu")
    args.backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    return args


def init_distributed(args, timeout=datetime.timedelta(seconds=300)):
    """Join torchrun's process group as --device and --backend say; returns this rank's device,
    cuda:LOCAL_RANK (modulo the GPUs: gloo ranks may share one)."""
    import torch
    import torch.distributed as dist

    if args.device == "cpu":
        if args.backend == "nccl":
            sys.exit("--backend nccl needs GPUs: add --device cuda, or use --backend gloo")
        dist.init_process_group("gloo", timeout=timeout)
        return torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit("--device cuda: this machine has no GPU that PyTorch can use; leave --device out to run on CPUs")
    gpus = torch.cuda.device_count()
    if args.backend == "nccl" and int(os.environ.get("LOCAL_WORLD_SIZE", 1)) > gpus:
        sys.exit(f"NCCL needs a GPU for each rank and this node has {gpus}: start at most {gpus} processes a node "
                 "(--nproc_per_node=gpu), or let the ranks share the GPUs through gloo: --backend gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % gpus)
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=timeout, **({"device_id": device} if args.backend == "nccl" else {}))
    return device


def synchronize(device):
    """Wait for the GPU's queued work: without it a timer measures only the launches."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device):
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def torchvision_or_exit(model_names):
    """ResNet-18 comes from torchvision: a broken one stops the benchmark with one line, at once."""
    if "resnet18" not in model_names:
        return
    sys.path.insert(0, ROOT)
    from data import torchvision_problem

    problem = torchvision_problem()
    if problem:
        if os.environ.get("RANK", "0") == "0":
            problem = problem.replace(", or train without it: --data synthetic", "")
            print(f"{os.path.basename(sys.argv[0])}: ResNet-18 needs torchvision, and {problem}; or leave "
                  "ResNet-18 out: --models cnn", file=sys.stderr)
        sys.exit(2)


def exit_without_teardown():
    """Leave a finished torchrun benchmark as train_ddp.py does, without the interpreter's teardown:
    gloo's background threads can abort it now and then ("terminate called without an active
    exception", SIGABRT), and torchrun then reports a finished run as failed (seen in the slow suite
    with ddp_bench.py at load 5, and with reshard_bench.py at load 2)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(world_size, fn, *args, timeout=900, device="cpu"):
    """fn(rank, world_size, *args) on `world_size` processes of this machine, which meet through a file
    store (no port); returns rank 0's result. On device "cuda" each rank takes GPU rank % GPUs, with
    NCCL where every rank has a GPU of its own and gloo (carrying CUDA tensors) where they share.
    Forked: the calling process must have run no torch operation yet (nor asked about CUDA), so that
    no half-made thread pool or CUDA driver is copied into the ranks."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [context.Process(target=_rank_main, args=(rank, world_size, store, fn, args, results, device))
                 for rank in range(world_size)]
        for proc in procs:
            proc.start()
        try:
            out = _rank_0_result(results, procs, world_size, timeout)
        except BaseException:  # a rank died, or Ctrl-C: the others would wait for it in a collective
            for proc in procs:
                proc.kill()
            raise
        finally:
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.kill()
        if any(proc.exitcode for proc in procs):
            raise SystemExit(f"a rank failed on {world_size} ranks (exit codes {[p.exitcode for p in procs]})")
    return out


def _rank_0_result(results, procs, world_size, timeout):
    """What rank 0 put on `results`, or SystemExit as soon as a rank has died: the others would wait
    for it in their next collective until the process group's 300 s, and this until `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=1)
        except queue.Empty:
            failed = [rank for rank, proc in enumerate(procs) if proc.exitcode not in (None, 0)]
            if failed:
                codes = ", ".join(str(procs[rank].exitcode) for rank in failed)
                raise SystemExit(f"rank{'s' * (len(failed) > 1)} {', '.join(map(str, failed))} of {world_size} failed "
                                 f"(exit code {codes}; tracebacks above): the other ranks were stopped") from None
    raise SystemExit(f"no result from rank 0 of {world_size} after {timeout} s: the ranks were stopped")


def _rank_main(rank, world_size, store, fn, args, results, device):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share the machine's cores
    backend = "gloo"
    if device == "cpu":
        # a CPU run sees no GPU: on a GPU node PyTorch's powerSGD_hook calls torch.cuda.synchronize(device)
        # whenever CUDA is available, which fails on the CPU tensors it is given (docs/gpu.md)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        backend = "nccl" if world_size <= torch.cuda.device_count() else "gloo"
    dist.init_process_group(backend, store=dist.FileStore(store, world_size), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=300))
    try:
        out = fn(rank, world_size, *args)
        if rank == 0:
            results.put(out)
    finally:
        dist.destroy_process_group()
