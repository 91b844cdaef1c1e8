"""Train with Ray Train: train_ddp.py's training, its processes started by Ray instead of torchrun.

    pip install -r requirements-ray.txt                                   # Ray is optional (about 700 MB)
    python ray_train.py --workers 2 --impl solutions --data synthetic      # Ray starts on this machine
    python ray_train.py --workers 8 --use-gpu --address auto --impl solutions   # on a running Ray cluster
    python ray_train.py --workers 2 --impl solutions --data synthetic --checkpoint-dir runs/ray-ckpt --max-failures 1

Every flag of train_ddp.py works here too, except that --workers counts Ray's workers (the
training processes) and --loader-workers is train_ddp.py's --workers (DataLoader workers per
rank). Ray Train's TorchTrainer starts one worker (a Ray actor) per training process, on
whichever node has room, sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in each, and calls init_process_group itself before train_ddp.main runs there:
setup_distributed (template_trainer.py) then uses that group as it is, because initialising
it a second time is an error. Rank 0 prints the lines it prints under torchrun, each after
Ray's "(RayTrainWorker pid=..., ip=...)", and writes the same --metrics file.

With --max-failures N, Ray starts all the workers again when one dies (FailureConfig), up to
N times; with --checkpoint-dir they resume from the course's newest checkpoint, as after a
torchrun restart. docs/clusters.md: a real Ray cluster, GPUs, what Ray adds and costs.
"""
import argparse
import os
import sys
import time

import train_ddp

HERE = os.path.dirname(os.path.abspath(__file__))
PATHS = ("data_dir", "metrics", "checkpoint_dir", "profile")  # train_ddp.py flags that name files
RAY_FLAGS = ("ray_workers", "address", "use_gpu", "cpus_per_worker", "max_failures", "storage_path")


def parse_args(argv=None):
    return train_ddp.parse_args(argv, more_flags=add_ray_flags)


def add_ray_flags(parser):
    """ray_train.py's flags after train_ddp.py's; --workers replaces train_ddp's (DataLoader workers)."""
    parser.description, parser.conflict_handler = __doc__, "resolve"
    ray_flags = parser.add_argument_group("Ray Train (ray_train.py)")
    ray_flags.add_argument("--workers", type=int, default=2, dest="ray_workers", metavar="N",
                           help="training processes, one Ray Train worker each (default: 2)")
    ray_flags.add_argument("--loader-workers", type=int, default=None, dest="workers", metavar="N",
                           help="DataLoader worker processes per rank, train_ddp.py's --workers "
                           "(default: 0 on CPUs, 2 on GPUs)")
    ray_flags.add_argument("--address", default=None, metavar="ADDR",
                           help="join the running Ray cluster at ADDR (host:port as `ray start --head` prints it, or "
                           "auto); without it Ray starts on this machine for this run only")
    ray_flags.add_argument("--use-gpu", action="store_true", help="one GPU per worker, NCCL (default: CPUs, gloo)")
    ray_flags.add_argument("--cpus-per-worker", type=float, default=1,
                           help="CPUs Ray sets aside for each worker (default: 1)")
    ray_flags.add_argument("--max-failures", type=int, default=0,
                           help="start the workers again this many times after one dies; with --checkpoint-dir they "
                           "resume its newest checkpoint (default: 0)")
    ray_flags.add_argument("--storage-path", default=None,
                           help="where Ray Train keeps the run's own state (default: runs/ray); on several nodes a "
                           "folder every node reaches")


def train_loop_per_worker(config):
    """One worker's whole run: what torchrun's worker does, in the process group Ray made."""
    os.chdir(config["cwd"])
    code = train_ddp.main(config["args"])
    if code:  # 1: the ranks' parameters differ; said already on rank 0
        raise RuntimeError(f"train_ddp.main ended with code {code}")


def check_room(args, resources):
    """Workers that the Ray cluster has no room for: Ray Train would wait for them, give up after
    a minute and try again, forever. (An autoscaling cluster, which Ray can grow, is not the
    course's case: start its nodes first.)"""
    need = {"CPU": args.ray_workers * args.cpus_per_worker, **({"GPU": args.ray_workers} if args.use_gpu else {})}
    short = [f"{need[name]:g} {name}s but this Ray cluster has {resources.get(name, 0):g}" for name in need
             if need[name] > resources.get(name, 0)]
    if short:
        raise ValueError(f"--workers {args.ray_workers} need {' and '.join(short)}: use fewer --workers, a smaller "
                         "--cpus-per-worker (it may be below 1), or more nodes (ray start)")


def main(args):
    if args.ray_workers < 1:
        raise ValueError(f"--workers {args.ray_workers}: at least one training process")
    train_ddp.check_flags(args)  # a setting that cannot work is said before Ray starts
    try:
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
    except ImportError:
        raise ValueError("Ray is not installed: pip install -r requirements-ray.txt") from None
    # The workers run in other processes, maybe on other machines: every path absolute (on
    # several machines, a folder that all of them reach, as for submit.sh).
    for name in PATHS:
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    storage = os.path.abspath(args.storage_path or os.path.join("runs", "ray"))
    # The workers import train_ddp.py and the course's modules from this folder. Ray Train
    # sends a worker's print() to its logger as well as to stdout: every line would come twice.
    path = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
    ray.init(address=args.address, runtime_env={"env_vars": {"PYTHONPATH": path, "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}})
    try:
        check_room(args, ray.cluster_resources())
    except ValueError:
        ray.shutdown()
        raise
    trainer = TorchTrainer(
        train_loop_per_worker,
        # train_ddp.py's arguments alone: its checkpoints then resume under torchrun and Ray alike
        train_loop_config={"args": argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in RAY_FLAGS}),
                           "cwd": os.getcwd()},
        scaling_config=ScalingConfig(num_workers=args.ray_workers, use_gpu=args.use_gpu,
                                     resources_per_worker={"CPU": args.cpus_per_worker,
                                                           **({"GPU": 1} if args.use_gpu else {})}),
        # Ray calls init_process_group with this backend; train_ddp.py picks the same by default
        torch_config=TorchConfig(backend=args.backend or ("nccl" if args.use_gpu else "gloo")),
        run_config=RunConfig(name=f"ray_train-{time.strftime('%Y%m%d-%H%M%S')}", storage_path=storage,
                             failure_config=FailureConfig(max_failures=args.max_failures)),
    )
    try:
        trainer.fit()
    except ray.train.TrainingFailedError as error:
        cause = str(error).strip().splitlines()
        print(f"ray_train.py: training failed ({cause[0] if cause else type(error).__name__}): "
              "the first worker error above is the cause", file=sys.stderr, flush=True)
        return 1
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    arguments = parse_args()
    try:
        sys.exit(main(arguments))
    except (ValueError, train_ddp.NotDone) as error:  # one line, as train_ddp.py says it
        if isinstance(error, ValueError):
            print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2 if isinstance(error, ValueError) else 1)
