"""How train_ddp.py parallelises: one class per strategy, and the table that picks one from the flags.

    strategy = choose(args)(args)                  # ValueError: flags this strategy cannot combine with
    train_loader, test_loader = strategy.loaders(...)
    model = strategy.wrap(model)                   # broadcast, buckets, shards, ...
    optimizer = strategy.optimizer(model, optimizer_cls, optimizer_kwargs)
    trainer.train_one_epoch(model, ..., strategy.sync_gradients)   # between backward and step
    print(strategy.sync_line(stats))               # what the epoch line says about synchronising
    strategy.ranks_agree(model)                    # the end-of-run consistency check

Each class below says, for its strategy and nowhere else: the flags that choose it (chosen_by),
the flags it cannot combine with (refuses), the template files it trains with (files, for
train_ddp.py's "Task X.Y is not done yet"), how it wraps the model and the optimizer, what runs
between backward and step, and how its whole parameters are gathered. train_ddp.py's loop never
asks which one it runs. To add a strategy: a class here and its place in STRATEGIES
(docs/maintainers.md, "Adding a strategy").
"""
import importlib
import os
import re

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def course_module(impl, name):
    """template_<name>.py of --impl: yours (template) or solutions/' (solutions, and ddp for the
    given code the baseline shares, such as the evaluation loaders)."""
    return importlib.import_module(("solutions." if impl != "template" else "") + name)


def unfilled_task(impl, files, root=None):
    """The first 'Task X.Y' whose TODO still raises NotImplementedError, or None. `files`:
    file names, or (file name, function) where training uses only that function of the file."""
    if impl != "template":
        return None
    root = root or os.path.dirname(os.path.abspath(__file__))
    for name in files:
        name, function = name if isinstance(name, tuple) else (name, None)
        with open(os.path.join(root, name)) as f:
            text = f.read()
        if function:  # from its def to the next top-level def
            text = re.split(r"\n(?=def |class )", text[text.index(f"\ndef {function}(") + 1:])[0]
        found = re.search(r'raise NotImplementedError\("(Task \d+\.\d+)', text)
        if found:
            return found.group(1), name
    return None


# The flags a strategy may refuse, each with the line that says why and what to use instead.
ALLREDUCE_WITH_DDP = ("--allreduce naive/ring replaces dist.all_reduce in our own averaging, and --impl ddp "
                      "averages inside DistributedDataParallel: use --impl template or solutions")
OVERLAP_WITH_DDP = ("--sync overlap trains with Task 5's DDP (template_ddp.py), and --impl ddp brings "
                    "PyTorch's own: use --impl template or solutions with --sync overlap")
ALLREDUCE_WITH_OVERLAP = ("--sync overlap all-reduces buckets with dist.all_reduce inside Task 5's DDP: "
                          "--allreduce naive/ring works with --sync after-backward only")
ALLREDUCE_WITH_FSDP = ("--shard full reduce-scatters the gradients inside FSDP; --allreduce naive/ring "
                       "replaces an all-reduce it does not use: leave --allreduce at torch")
OVERLAP_WITH_FSDP = ("--shard full reduce-scatters the gradients inside FSDP, and --sync overlap wraps the "
                     "model in Task 5's DDP, which all-reduces them whole: use one of the two")


class Strategy:
    """Task 2.2's averaging: broadcast once (Task 2.1), all-reduce every gradient after backward."""
    name = "after-backward"  # the start line's sync=
    files = ["template_data_loader.py", "template_trainer.py"]  # (file, function): only that function
    refuses = []  # (flag test, message): flags it cannot combine with

    def __init__(self, args):
        self.args = args
        self.trainer = course_module(args.impl, "template_trainer")

    @classmethod
    def chosen_by(cls, args):
        return True  # the default: what no other strategy claims

    @classmethod
    def needs(cls, args):
        """The template files this run trains with: the strategy's, and Task 6's for --shard optimizer,
        which every strategy that keeps whole parameters can take."""
        return cls.files + (["template_zero.py"] if args.shard == "optimizer" else [])

    def loaders(self, train_set, test_set, batch_size, rank, world_size, seed, workers, device):
        """Our sampler (Task 1): rank r reads the r-th slice of every global batch."""
        loader_lib = course_module(self.args.impl, "template_data_loader")
        return loader_lib.build_loaders(train_set, test_set, batch_size, rank, world_size, seed, workers, device)

    def wrap(self, model):
        self.trainer.broadcast_parameters(model, src=0)
        return model

    def sync_gradients(self, model):
        self.trainer.average_gradients(model)

    def optimizer(self, model, optimizer_cls, optimizer_kwargs):
        """--shard optimizer (Task 6): each rank keeps the optimizer state of its shard only; the gradients
        are still averaged whole before step(), which then sends every rank the updated shards."""
        if self.args.shard != "optimizer":
            return optimizer_cls(model.parameters(), **optimizer_kwargs)
        if self.args.impl == "ddp":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            return ZeroRedundancyOptimizer(model.parameters(), optimizer_cls, **optimizer_kwargs)
        zero = course_module(self.args.impl, "template_zero")
        return zero.ShardedOptimizer(model.parameters(), optimizer_cls, **optimizer_kwargs)

    def sync_line(self, stats):
        return f"sync {stats['sync_seconds'] / stats['seconds']:.0%} of step time"

    def sync_share(self, stats):
        """The CSV's sync_share: the share of step time spent between backward and step."""
        return stats["sync_seconds"] / stats["seconds"]

    def full_parameters(self, model):
        """Every parameter, whole, on every rank: what the consistency check and a checkpoint compare."""
        return list(model.parameters())

    def ranks_agree(self, model):
        """True on every rank if every rank holds bit-identical parameters."""
        flat = torch.cat([p.detach().reshape(-1) for p in self.full_parameters(model)])
        reference = flat.clone()
        dist.broadcast(reference, src=0)
        differs = torch.tensor([0 if torch.equal(flat, reference) else 1], device=flat.device)
        dist.all_reduce(differs)
        return differs.item() == 0


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
    def needs(cls, args):  # only the all-reduce it uses: ring trains with Task 3.2 done and 3.1 not yet
        return super().needs(args) + [("template_allreduce.py", f"{args.allreduce}_all_reduce")]

    def __init__(self, args):
        super().__init__(args)
        self.sync_gradients = average_gradients_with(args.allreduce, args.impl)


def average_gradients_with(name, impl):
    """HandAllReduce's sync_gradients: Task 3's `name`_all_reduce ("naive" or "ring") on one flat buffer."""
    all_reduce = getattr(course_module(impl, "template_allreduce"), name + "_all_reduce")

    def sync_gradients(model):
        grads = [param.grad for param in model.parameters() if param.grad is not None]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        all_reduce(flat)
        flat /= dist.get_world_size()
        for grad, mean in zip(grads, flat.split([grad.numel() for grad in grads])):
            grad.copy_(mean.view_as(grad))
    return sync_gradients


class OurDDP(Strategy):
    """--sync overlap: Task 5's DDP broadcasts at start and all-reduces buckets while backward runs;
    what is left after backward is waiting for the last buckets (Task 5.4)."""
    name = "overlap"
    files = Strategy.files + ["template_ddp.py"]
    refuses = [(lambda args: args.impl == "ddp", OVERLAP_WITH_DDP),
               (lambda args: args.allreduce != "torch", ALLREDUCE_WITH_OVERLAP)]

    @classmethod
    def chosen_by(cls, args):
        return args.sync == "overlap"

    def wrap(self, model):
        ddp_lib = course_module(self.args.impl, "template_ddp")
        return ddp_lib.DDP(model, bucket_size_mb=self.args.bucket_mb or None)

    def sync_gradients(self, model):
        model.finish_gradient_synchronization()


class TorchDDP(Strategy):
    """--impl ddp: PyTorch's DistributedDataParallel and DistributedSampler, the production baseline."""
    name = "ddp"
    refuses = [(lambda args: args.allreduce != "torch", ALLREDUCE_WITH_DDP),
               (lambda args: args.sync == "overlap", OVERLAP_WITH_DDP)]
    sync_gradients = None  # DDP averages gradients during backward

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp"

    def loaders(self, train_set, test_set, batch_size, rank, world_size, seed, workers, device):
        """PyTorch's DistributedSampler hands rank r the indices [r::world_size] of the epoch's order, so
        step k trains, over all ranks, on positions [k*B, (k+1)*B) of it: the same global batches as our
        sampler (unless padding adds a step). Evaluation keeps our unpadded sampler, because PyTorch's
        pads the test set and counts some images twice."""
        sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=seed)
        train_loader = DataLoader(train_set, batch_size=batch_size // world_size, sampler=sampler, drop_last=True,
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


class OurFSDP(Strategy):
    """--shard full: Task 7's FSDP keeps 1/N of the parameters, gradients and optimizer state; it
    reduce-scatters gradients inside backward, then waits for the last ones after it."""
    name = "fsdp"
    files = Strategy.files + ["template_fsdp.py"]
    refuses = [(lambda args: args.allreduce != "torch", ALLREDUCE_WITH_FSDP),
               (lambda args: args.sync == "overlap", OVERLAP_WITH_FSDP)]

    @classmethod
    def chosen_by(cls, args):
        return args.shard == "full"

    def wrap(self, model):  # FSDP starts every rank from rank 0's model, as DDP does
        return course_module(self.args.impl, "template_fsdp").FSDP(model)

    def sync_gradients(self, model):
        model.finish_gradient_synchronization()

    def sync_line(self, stats):  # the reduce-scatters inside backward are not in sync_seconds
        return f"reduce-scatter inside backward (not timed), {super().sync_line(stats)}"

    def full_parameters(self, model):
        return list(model.gather_full_params().values())


class TorchFullyShard(TorchDDP):
    """--impl ddp --shard full: PyTorch's fully_shard, one unit per module that holds parameters, as ours."""
    name = "fully_shard"
    refuses = TorchDDP.refuses

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp" and args.shard == "full"

    def wrap(self, model):
        from torch.distributed.fsdp import fully_shard
        with torch.no_grad():  # fully_shard does not broadcast (DDP and our FSDP do): start from rank 0's model
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor, src=0)
        for module in model.modules():
            if module is not model and any(True for _ in module.parameters(recurse=False)):
                fully_shard(module)
        return fully_shard(model)  # it reduce-scatters during backward

    def sync_line(self, stats):
        return "sync overlapped with backward by fully_shard"

    def full_parameters(self, model):
        return [p.full_tensor() for p in model.parameters()]


# The flags choose the first strategy in this list that claims them.
STRATEGIES = [TorchFullyShard, TorchDDP, OurFSDP, OurDDP, HandAllReduce, Strategy]


def add_arguments(parser):
    """The flags that choose a strategy, in a group of train_ddp.py's --help of their own."""
    group = parser.add_argument_group("how the model is parallelised (strategies.py)")
    group.add_argument("--allreduce", choices=["torch", "naive", "ring"], default="torch",
                       help="the all-reduce that averages the gradients: torch: dist.all_reduce, in Task 2.2's "
                       "average_gradients; naive or ring: Task 3's naive_all_reduce or ring_all_reduce from "
                       "template_allreduce.py (solutions/ with --impl solutions) (default: torch)")
    group.add_argument("--sync", choices=["after-backward", "overlap"], default="after-backward",
                       help="after-backward: Task 2.2's averaging once backward is done; overlap: Task 5's DDP "
                       "(template_ddp.py), all-reducing buckets while backward runs (default: after-backward)")
    group.add_argument("--bucket-mb", type=float, default=25.0,
                       help="--sync overlap: the bucket size in MB; 0: one bucket per parameter (default: 25)")
    group.add_argument("--shard", choices=["none", "optimizer", "full"], default="none",
                       help="none: every rank holds all the state; optimizer: Task 6's ShardedOptimizer "
                       "(ZeRO-1); full: Task 7's FSDP, or PyTorch's fully_shard with --impl ddp (default: none)")


def choose(args):
    """The strategy class the flags ask for; ValueError with one line if they cannot work together."""
    if args.bucket_mb < 0:
        raise ValueError(f"--bucket-mb {args.bucket_mb}: a bucket size is 0 (one bucket per parameter) or more")
    strategy = next(cls for cls in STRATEGIES if cls.chosen_by(args))
    for refused, message in strategy.refuses:
        if refused(args):
            raise ValueError(message)
    return strategy
