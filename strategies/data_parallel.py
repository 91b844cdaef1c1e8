"""Data parallelism: every rank holds the whole model and averages the gradients. Task 2.2's
averaging is the base class (strategies/base.py); here Task 3's all-reduces by hand (--allreduce),
Task 5's DDP (--sync overlap), and PyTorch's DistributedDataParallel (--impl ddp)."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from strategies.base import Strategy, average_flat, gloo_send_refusal
from strategies.course_files import course_module

# The flags a strategy may refuse, each with the line that says why and what to use instead.
ALLREDUCE_WITH_DDP = ("--allreduce naive/ring replaces dist.all_reduce in our own averaging, and --impl ddp "
                      "averages inside DistributedDataParallel: use --impl template or solutions")
OVERLAP_WITH_DDP = ("--sync overlap trains with Task 5's DDP (template_ddp.py), and --impl ddp brings "
                    "PyTorch's own: use --impl template or solutions with --sync overlap")
ALLREDUCE_WITH_OVERLAP = ("--sync overlap all-reduces buckets with dist.all_reduce inside Task 5's DDP: "
                          "--allreduce naive/ring works with --sync after-backward only")


def add_arguments(parser):
    group = parser.add_argument_group("data parallelism (strategies/data_parallel.py)")
    group.add_argument("--allreduce", choices=["torch", "naive", "ring"], default="torch",
                       help="the all-reduce that averages the gradients: torch: dist.all_reduce, in Task 2.2's "
                       "average_gradients; naive or ring: Task 3's naive_all_reduce or ring_all_reduce from "
                       "template_allreduce.py (solutions/ with --impl solutions) (default: torch)")
    group.add_argument("--sync", choices=["after-backward", "overlap"], default="after-backward",
                       help="after-backward: Task 2.2's averaging once backward is done; overlap: Task 5's DDP "
                       "(template_ddp.py), all-reducing buckets while backward runs (default: after-backward)")
    group.add_argument("--bucket-mb", type=float, default=25.0,
                       help="--sync overlap: the bucket size in MB; 0: one bucket per parameter (default: 25)")


def refusal(args):
    """What is wrong with these flags whatever the strategy, or None."""
    if args.bucket_mb < 0:
        return f"--bucket-mb {args.bucket_mb}: a bucket size is 0 (one bucket per parameter) or more"
    return None


class HandAllReduce(Strategy):
    """Task 2.2's averaging with Task 3's naive or ring all-reduce in place of dist.all_reduce.

    All gradients travel as one flat buffer, as in DDP's buckets: a hand-made collective pays its
    per-message latency (2(N-1) messages for the ring) once per step, not once per parameter. With
    2 ranks the sums are a + b whatever the algorithm, so training gives bit-identical results with
    --allreduce torch, naive or ring."""

    @classmethod
    def chosen_by(cls, args):
        return args.allreduce != "torch"

    @classmethod
    def refusal(cls, args):
        return gloo_send_refusal(args, f"--allreduce {args.allreduce}")

    @classmethod
    def needs(cls, args):  # only the all-reduce it uses: ring trains with Task 3.2 done and 3.1 not yet
        return super().needs(args) + [("template_allreduce.py", f"{args.allreduce}_all_reduce")]

    def __init__(self, args):
        super().__init__(args)
        self.sync_gradients = average_gradients_with(args.allreduce, args.impl)


def average_gradients_with(name, impl):
    """HandAllReduce's sync_gradients: Task 3's `name`_all_reduce ("naive" or "ring") on one flat buffer."""
    all_reduce = getattr(course_module(impl, "template_allreduce"), name + "_all_reduce")
    return lambda model: average_flat(model, all_reduce, dist.get_world_size())


class OurDDP(Strategy):
    """--sync overlap: Task 5's DDP broadcasts at start and all-reduces buckets while backward runs;
    what is left after backward is waiting for the last buckets (Task 5.4)."""
    name = "overlap"
    files = Strategy.files + ["template_ddp.py"]

    @classmethod
    def chosen_by(cls, args):
        return args.sync == "overlap"

    @classmethod
    def refusal(cls, args):
        return OVERLAP_WITH_DDP if args.impl == "ddp" else ALLREDUCE_WITH_OVERLAP if args.allreduce != "torch" else None

    def wrap(self, model):
        ddp_lib = course_module(self.args.impl, "template_ddp")
        return ddp_lib.DDP(model, bucket_size_mb=self.args.bucket_mb or None)

    def sync_gradients(self, model):
        model.finish_gradient_synchronization()


class TorchDDP(Strategy):
    """--impl ddp: PyTorch's DistributedDataParallel and DistributedSampler, the production baseline."""
    name = "ddp"
    sync_gradients = None  # DDP averages gradients during backward

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp"

    @classmethod
    def refusal(cls, args):
        return ALLREDUCE_WITH_DDP if args.allreduce != "torch" else OVERLAP_WITH_DDP if args.sync == "overlap" else None

    def loaders(self, train_set, test_set, batch_size, rank, world_size, seed, workers, device):
        """PyTorch's DistributedSampler hands rank r the indices [r::world_size] of the epoch's order, so
        step k trains, over all ranks, on positions [k*B, (k+1)*B) of it: the same global batches as our
        sampler (unless padding adds a step). Evaluation keeps our unpadded sampler, because PyTorch's
        pads the test set and counts some images twice."""
        data_rank, readers = self.data_ranks(rank, world_size)
        sampler = DistributedSampler(train_set, readers, data_rank, shuffle=True, seed=seed)
        train_loader = DataLoader(train_set, batch_size=batch_size // readers, sampler=sampler, drop_last=True,
                                  num_workers=workers, pin_memory=device.type == "cuda")
        _, test_loader = super().loaders(train_set, test_set, batch_size, rank, world_size, seed, workers, device)
        return train_loader, test_loader

    def wrap(self, model):
        device = next(model.parameters()).device
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)

    def sync_line(self, stats):
        return "sync overlapped with backward by DDP"

    def sync_share(self, stats):
        return ""  # nothing runs between backward and step


# Asked in this order (the first that claims the flags wins): PyTorch's before ours.
STRATEGIES = [TorchDDP, OurDDP, HandAllReduce]
