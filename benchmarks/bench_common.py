"""What the benchmarks share: where they write, how they start their ranks, and the check that
torchvision works.
(Imported as bench_common: a script's own folder is on sys.path.)

A run writes under runs/benchmarks/ (ignored by git). benchmarks/results/ holds the figures
the pages show, committed: only --update-results writes there, so that a quick try never
replaces them (the grader would then report the course as modified).
"""
import datetime
import multiprocessing
import os
import sys
import tempfile

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


def run_ranks(world_size, fn, *args, timeout=900):
    """fn(rank, world_size, *args) on `world_size` gloo processes of this machine, which meet through
    a file store (no port); returns rank 0's result. Forked: the calling process must have run no
    torch operation yet, so that no half-made thread pool is copied into the ranks."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [context.Process(target=_rank_main, args=(rank, world_size, store, fn, args, results))
                 for rank in range(world_size)]
        for proc in procs:
            proc.start()
        try:
            out = results.get(timeout=timeout)
        finally:
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.kill()
        if any(proc.exitcode for proc in procs):
            raise SystemExit(f"a rank failed on {world_size} ranks (exit codes {[p.exitcode for p in procs]})")
    return out


def _rank_main(rank, world_size, store, fn, args, results):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group("gloo", store=dist.FileStore(store, world_size), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=300))
    try:
        out = fn(rank, world_size, *args)
        if rank == 0:
            results.put(out)
    finally:
        dist.destroy_process_group()
