"""How train_ddp.py parallelises: one class per strategy, and the table that picks one from the flags.

    strategy = choose(args)(args)                  # ValueError: flags this strategy cannot combine with
    train_loader, test_loader = strategy.loaders(...)   # the slice of each global batch this rank reads
    model = strategy.wrap(model)                   # broadcast, buckets, shards, splits, stages, ...
    optimizer = strategy.optimizer(model, optimizer_cls, optimizer_kwargs)
    trainer.train_one_epoch(model, ..., strategy.sync_gradients,   # between backward and step
                            forward_backward=strategy.forward_backward)
    samples, loss_sum = strategy.totals(stats, device)   # over all ranks, each image counted once
    result = strategy.evaluate(model, test_loader, device)
    print(strategy.sync_line(stats))               # what the epoch line says about synchronising
    strategy.ranks_agree(model)                    # the end-of-run consistency check

Each class below says, for its strategy and nowhere else: the flags that choose it (chosen_by),
the flags it cannot combine with (refusal), the template files it trains with (files, for
train_ddp.py's "Task X.Y is not done yet"), how it wraps the model and the optimizer, what runs
between backward and step, and how its whole parameters are gathered. train_ddp.py's loop never
asks which one it runs. To add a strategy: a class here and its place in STRATEGIES
(docs/maintainers.md, "Adding a strategy").
"""
import importlib
import logging
import os
import re
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler


def course_module(impl, name):
    """template_<name>.py of --impl: yours (template) or solutions/' (solutions, and ddp for the
    code the baseline shares with ours, such as the evaluation loaders: yours in a student
    release, which has no solutions/)."""
    return importlib.import_module(("" if uses_your_files(impl) else "solutions.") + name)


def uses_your_files(impl):
    return impl == "template" or (impl == "ddp" and not has_solutions())


def has_solutions():
    """False in a student release (tools/student_release.py), which leaves solutions/ out."""
    return os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "solutions"))


def unfilled_task(impl, files, root=None):
    """The first 'Task X.Y' whose TODO still raises NotImplementedError, or None. `files`:
    file names, or (file name, function) where training uses only that function of the file."""
    if not uses_your_files(impl):
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


def not_done(impl, files):
    """What to say when a task these files train with is not done yet (its TODO still raises), or None."""
    task = unfilled_task(impl, files)
    if task is None:
        return None
    return (f"{task[0]} in {task[1]} is not done yet, so training with --impl {impl} cannot start.\n"
            f"Fill it in and check it with:  python check.py {task[0][5:]}"
            + ("\nor train with the reference answers:  --impl solutions" if has_solutions() else ""))


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

    def __init__(self, args):
        self.args = args
        self.trainer = course_module(args.impl, "template_trainer")

    @classmethod
    def chosen_by(cls, args):
        return True  # the default: what no other strategy claims

    @classmethod
    def refusal(cls, args):
        """Why the other flags cannot work with this strategy (one line that says what to do), or None."""
        return None

    @classmethod
    def needs(cls, args):
        """The template files this run trains with: the strategy's, and Task 6's for --shard optimizer,
        which every strategy that keeps whole parameters can take."""
        return cls.files + (["template_zero.py"] if args.shard == "optimizer" else [])

    def data_ranks(self, rank, world_size):
        """(this rank's slice, into how many slices each global batch is cut): every rank reads its own."""
        return rank, world_size

    def loaders(self, train_set, test_set, batch_size, rank, world_size, seed, workers, device):
        """Our sampler (Task 1): the rank of data_ranks reads its slice of every global batch."""
        loader_lib = course_module(self.args.impl, "template_data_loader")
        return loader_lib.build_loaders(train_set, test_set, batch_size, *self.data_ranks(rank, world_size), seed,
                                        workers, device)

    @property
    def forward_backward(self):
        """Forward and backward of one batch (template_trainer.py's, unless the strategy runs its own)."""
        return self.trainer.forward_backward

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

    def copies(self):
        """How many ranks read each image: 1, or the ranks of a tensor-parallel group or of a pipeline,
        which all read the same slice (data_ranks) and so all count it in Task 2.3's sums."""
        return dist.get_world_size() // self.data_ranks(0, dist.get_world_size())[1]

    def totals(self, stats, device):
        """(images, loss sum) of an epoch's training over all ranks, each image counted once."""
        _, samples, loss_sum = self.trainer.reduce_metrics(0, stats["samples"], stats["loss_sum"], device)
        return samples // self.copies(), loss_sum / self.copies()

    def evaluate(self, model, loader, device):
        """Task 2.3's evaluation over all ranks, each test image counted once."""
        result = self.trainer.evaluate(model, loader, device)
        return {**result, "correct": result["correct"] // self.copies(), "total": result["total"] // self.copies()}

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
    return lambda model: average_flat(model, all_reduce, dist.get_world_size())


def average_flat(model, all_reduce, size):
    """Every .grad of model replaced by its mean over `size` ranks: one all_reduce (SUM) of one flat buffer."""
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    all_reduce(flat)
    flat /= size
    for grad, mean in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(mean.view_as(grad))


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


class OurFSDP(Strategy):
    """--shard full: Task 7's FSDP keeps 1/N of the parameters, gradients and optimizer state; it
    reduce-scatters gradients inside backward, then waits for the last ones after it."""
    name = "fsdp"
    files = Strategy.files + ["template_fsdp.py"]

    @classmethod
    def chosen_by(cls, args):
        return args.shard == "full"

    @classmethod
    def refusal(cls, args):
        return ALLREDUCE_WITH_FSDP if args.allreduce != "torch" else OVERLAP_WITH_FSDP if args.sync == "overlap" else None

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

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp" and args.shard == "full"

    def wrap(self, model):
        from torch.distributed.fsdp import fully_shard
        broadcast_from_rank_0(model)  # fully_shard does not broadcast (DDP and our FSDP do)
        for module in model.modules():
            if module is not model and any(True for _ in module.parameters(recurse=False)):
                fully_shard(module)
        return fully_shard(model)  # it reduce-scatters during backward

    def sync_line(self, stats):
        return "sync overlapped with backward by fully_shard"

    def full_parameters(self, model):
        return [p.full_tensor() for p in model.parameters()]


def broadcast_from_rank_0(model):
    """Every parameter and buffer of model as rank 0's: PyTorch's DDP does it, fully_shard and
    parallelize_module do not."""
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor, src=0)


def world_size_before_set_up():
    return int(os.environ.get("WORLD_SIZE", 1))  # torchrun's; 1 for plain python


def split_model_refusal(args, kind):
    """What --tp and --pp cannot be combined with (kind: "tp" or "pp"), or None."""
    size = getattr(args, kind)
    conflicts = {f"--shard {args.shard}": args.shard != "none", "--sync overlap": args.sync == "overlap",
                 f"--allreduce {args.allreduce}": args.allreduce != "torch",
                 "--checkpoint-dir": args.checkpoint_dir is not None, f"--tp {args.tp}": kind == "pp" and args.tp > 1}
    for flag, conflicts_with_split in conflicts.items():
        if conflicts_with_split:
            return (f"--{kind} {size} cannot be combined with {flag}: the model split by --{kind} trains with Task "
                    "2's broadcast and Task 1's sampler only (--sync after-backward, --allreduce torch, --shard none, "
                    "no --checkpoint-dir, not both --tp and --pp)")
    if world_size_before_set_up() % size:
        return (f"--{kind} {size} does not divide the world size {world_size_before_set_up()}: each group of {size} "
                f"consecutive ranks splits one model, so start a multiple of {size} processes")
    return None


class TensorParallel(Strategy):
    """--tp N: Task 9's tensor parallelism. The classifier's two Linear layers are split over groups of
    N consecutive ranks (column- then row-parallel; the convolutions stay whole); the world_size / N
    groups are data parallel: the ranks of a group read the same slice of every global batch (Task
    9.4), and each gradient is averaged over the ranks that hold the same slice (Task 9.4)."""
    name = "tensor-parallel"
    files = Strategy.files + ["template_tensor_parallel.py"]

    @classmethod
    def chosen_by(cls, args):
        return args.tp > 1

    @classmethod
    def refusal(cls, args):
        return split_model_refusal(args, "tp")

    def __init__(self, args):
        super().__init__(args)
        self.tp = course_module(args.impl, "template_tensor_parallel")

    def data_ranks(self, rank, world_size):
        return self.tp.sampler_rank_and_size(rank, world_size, self.args.tp)

    def wrap(self, model):
        self.dp_group, tp_group = self.tp.make_2d_groups(dist.get_world_size() // self.args.tp, self.args.tp)
        self.refuse_wrong_groups(self.dp_group, tp_group, next(model.parameters()).device)
        self.trainer.broadcast_parameters(model, src=0)  # whole, BEFORE the split: every slice of one layer
        return self.tp.parallelize_classifier(model, tp_group)

    def refuse_wrong_groups(self, dp_group, tp_group, device):
        """make_2d_groups' groups checked before training, on every rank alike. The end's consistency check
        cannot see wrong groups: a dp group of None with --tp = the world size averages the tp peers'
        gradients of different slices, and every rank then holds the same wrong model (the gathered
        parameters agree by construction)."""
        world, rank, tp = dist.get_world_size(), dist.get_rank(), self.args.tp
        expected = {"dp": list(range(rank % tp, world, tp)), "tp": list(range(rank - rank % tp, rank - rank % tp + tp))}
        got = {name: list(range(world)) if group is None else dist.get_process_group_ranks(group)
               for name, group in (("dp", dp_group), ("tp", tp_group))}  # None is the default group
        wrong = torch.tensor([0 if got == expected else 1], device=device)  # NCCL: on the GPU
        dist.all_reduce(wrong)  # over the world: if one rank stops here, all do (no hang in a later collective)
        if wrong.item():
            shown = {name: f"None (the default group, {ranks})" if group is None else ranks
                     for (name, ranks), group in zip(got.items(), (dp_group, tp_group))}
            raise ValueError(f"make_2d_groups (Task 9.3) gave rank {rank} the dp group {shown['dp']} and the tp group "
                             f"{shown['tp']}, expected {expected['dp']} and {expected['tp']}: check it with "
                             "`python check.py 9`" if got != expected else
                             f"make_2d_groups (Task 9.3) gave wrong groups on {wrong.item()} rank(s): check it with "
                             "`python check.py 9`")

    def sync_gradients(self, model):
        self.tp.average_gradients_over_dp(model, self.dp_group)

    def full_parameters(self, model):
        return list(self.tp.gather_full_params(model).values())


class TorchTensorParallel(TorchDDP):
    """--impl ddp --tp N: PyTorch's parallelize_module (ColwiseParallel, RowwiseParallel) on the tp
    dimension of a 2-D DeviceMesh, and fully_shard on its dp dimension: the FSDP + TP recipe of
    PyTorch's tutorials. (Its composable `replicate` on the dp dimension gave parameters that differ
    from single-process training by 4e-3 after 3 steps here, torch 2.14 on gloo; fully_shard by 1.5e-8.)"""
    name = "parallelize_module"

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp" and args.tp > 1

    @classmethod
    def refusal(cls, args):
        return split_model_refusal(args, "tp")

    def data_ranks(self, rank, world_size):
        return rank // self.args.tp, world_size // self.args.tp

    def wrap(self, model):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        device = next(model.parameters()).device
        mesh = init_device_mesh(device.type, (dist.get_world_size() // self.args.tp, self.args.tp),
                                mesh_dim_names=("dp", "tp"))
        broadcast_from_rank_0(model)
        parallelize_module(model.classifier, mesh["tp"], {"1": ColwiseParallel(), "3": RowwiseParallel()})
        # fully_shard warns, once a rank, that the model returned a view (RowwiseParallel's output is its
        # DTensor's local tensor): an in-place op on it before backward would skip fully_shard's hook. Harmless
        # here: the training step and the evaluation use the logits out of place (cross_entropy, argmax).
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor",
                                category=UserWarning)
        return fully_shard(model, mesh=mesh["dp"])

    def sync_line(self, stats):
        return "sync overlapped with backward by fully_shard"

    def full_parameters(self, model):
        model.reshard()  # the root keeps its parameters gathered after a forward without backward (evaluation)
        # A weight split by tp (Shard(0)) and by fully_shard over dp (_StridedShard) takes two all-gathers, one
        # per mesh dimension, and DTensor logs on every rank that one would be faster and that "reduction orders"
        # may differ. Harmless: this runs once, for the consistency check, and an all-gather copies values
        # without reducing anything (the ranks then hold bit-identical parameters, which the check confirms).
        logger = logging.getLogger("torch.distributed.tensor._redistribute")
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            return [p.full_tensor() for p in model.parameters()]
        finally:
            logger.setLevel(level)


def pipeline_groups(pp):
    """(pipeline group, dp group) of this rank: stages of one pipeline are pp consecutive ranks, and the
    ranks that hold the same stage form a dp group. Every rank creates every group, in the same order."""
    world, rank = dist.get_world_size(), dist.get_rank()
    pipes = [dist.new_group(list(range(start, start + pp))) for start in range(0, world, pp)]
    dps = [dist.new_group(list(range(stage, world, pp))) for stage in range(pp)]
    return pipes[rank // pp], dps[rank % pp]


class PipelineParallel(Strategy):
    """--pp N: Task 10's pipeline parallelism. The CNN's 10 layers are cut into N stages held by N
    consecutive ranks; each batch is cut into --microbatches M that the --schedule (gpipe or 1f1b)
    runs through the stages. The world_size / N pipelines are data parallel: every stage of a
    pipeline reads the same slice of each global batch, and each stage's gradients are averaged over
    the ranks that hold the same stage (one flat all-reduce). Evaluation gathers the whole model on
    every rank (each stage broadcasts its layers) and evaluates as data parallelism does."""
    name = "pipeline"
    files = Strategy.files + ["template_pipeline.py"]

    @classmethod
    def chosen_by(cls, args):
        return args.pp > 1

    @classmethod
    def refusal(cls, args):
        if args.accumulate > 1:
            return ("--accumulate with --pp: the pipeline already cuts each batch into --microbatches, whose "
                    "gradients add up: use those")
        if args.microbatches < 1:
            return f"--microbatches {args.microbatches}: a batch is cut into 1 micro-batch or more"
        pipelines = max(world_size_before_set_up() // args.pp, 1)
        if args.batch_size % (pipelines * args.microbatches):
            return (f"the global batch {args.batch_size} does not split into {pipelines} pipelines x "
                    f"{args.microbatches} equal micro-batches: choose a multiple of {pipelines * args.microbatches}")
        return split_model_refusal(args, "pp")

    def __init__(self, args):
        super().__init__(args)
        self.pp = course_module(args.impl, "template_pipeline")

    def data_ranks(self, rank, world_size):
        return rank // self.args.pp, world_size // self.args.pp

    def wrap(self, model):
        pipe_group, self.dp_group = pipeline_groups(self.args.pp)
        self.trainer.broadcast_parameters(model, src=0)  # every stage cuts its layers from the same model
        self.stage = self.pp.Stage(self.pp.flat_cnn(model), dist.get_rank() % self.args.pp, self.args.pp, pipe_group)
        self.last_stage = dist.get_rank() - dist.get_rank() % self.args.pp + self.args.pp - 1  # its global rank
        self.pipe_group = pipe_group
        return self.stage.module  # this stage's layers: what the optimizer steps

    def forward_backward(self, model, images, labels, accumulate=1):
        step = {"gpipe": self.pp.gpipe_step, "1f1b": self.pp.one_f_one_b_step}[self.args.schedule]
        loss, _ = step(self.stage, images, labels, F.cross_entropy, self.args.microbatches)
        return self.loss_to_every_stage(loss) * len(labels)

    def loss_to_every_stage(self, loss):
        """The batch's mean loss, which only the last stage computes, on every stage of the pipeline (a
        one-number broadcast), so that every rank reports the same (totals counts each image once)."""
        loss = torch.tensor([0.0 if loss is None else float(loss)])
        dist.broadcast(loss, src=self.last_stage, group=self.pipe_group)
        return loss.item()

    def sync_gradients(self, model):
        average_flat(model, lambda flat: dist.all_reduce(flat, group=self.dp_group), dist.get_world_size(self.dp_group))

    def evaluate(self, model, loader, device):
        return super().evaluate(self.stage.gather_full_module(), loader, device)

    def full_parameters(self, model):
        return list(self.stage.gather_full_module().parameters())


class TorchPipeline(PipelineParallel):
    """--impl ddp --pp N: PyTorch's torch.distributed.pipelining (PipelineStage, ScheduleGPipe or
    Schedule1F1B) on the same stages, each stage wrapped in DistributedDataParallel over its dp group
    (PipelineStage runs all micro-batches but the last inside its no_sync())."""
    name = "pipelining"
    files = Strategy.files

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp" and args.pp > 1

    @classmethod
    def refusal(cls, args):
        if args.schedule == "1f1b" and args.microbatches < args.pp:
            return (f"--microbatches {args.microbatches} with --pp {args.pp}: PyTorch's Schedule1F1B refuses fewer "
                    "micro-batches than stages (ours runs them: a shorter warm-up); use --microbatches "
                    f"{args.pp} or more, or --schedule gpipe")
        return super().refusal(args)

    def wrap(self, model):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        module = super().wrap(model)
        device = next(model.parameters()).device
        if dist.get_world_size(self.dp_group) > 1:
            module = torch.nn.parallel.DistributedDataParallel(module, process_group=self.dp_group)
        stage = PipelineStage(module, self.stage.stage_index, self.args.pp, device, group=self.pipe_group)
        schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[self.args.schedule]
        self.schedule = schedule(stage, n_microbatches=self.args.microbatches, loss_fn=F.cross_entropy)
        return module

    def forward_backward(self, model, images, labels, accumulate=1):
        losses = []
        if self.stage.is_first:
            self.schedule.step(images, target=labels if self.stage.is_last else None, losses=losses)
        else:
            self.schedule.step(target=labels if self.stage.is_last else None, losses=losses)
        loss = torch.stack(losses).mean().item() if losses else None
        return self.loss_to_every_stage(loss) * len(labels)

    sync_gradients = None  # DDP averaged each stage's gradients over its dp group during the last backward

    def sync_line(self, stats):
        return "sync overlapped with backward by DDP" if self.dp_group.size() > 1 else "no data parallelism to sync"


# The flags choose the first strategy in this list that claims them.
STRATEGIES = [TorchPipeline, TorchTensorParallel, PipelineParallel, TensorParallel,
              TorchFullyShard, TorchDDP, OurFSDP, OurDDP, HandAllReduce, Strategy]


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
    group.add_argument("--tp", type=int, default=1, metavar="N",
                       help="Task 9: split the classifier over groups of N ranks (tensor parallelism), data "
                       "parallel over world_size / N; PyTorch's parallelize_module with --impl ddp (default: 1)")
    group.add_argument("--pp", type=int, default=1, metavar="N",
                       help="Task 10: cut the CNN into N pipeline stages on N ranks, data parallel over "
                       "world_size / N; PyTorch's torch.distributed.pipelining with --impl ddp (default: 1)")
    group.add_argument("--microbatches", type=int, default=4, metavar="M",
                       help="--pp: the micro-batches each rank's batch is cut into (default: 4)")
    group.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b",
                       help="--pp: GPipe (all forwards, then all backwards) or 1F1B (default: 1f1b)")
    group.add_argument("--shard", choices=["none", "optimizer", "full"], default="none",
                       help="none: every rank holds all the state; optimizer: Task 6's ShardedOptimizer "
                       "(ZeRO-1); full: Task 7's FSDP, or PyTorch's fully_shard with --impl ddp (default: none)")


def choose(args):
    """The strategy class the flags ask for; ValueError with one line if they cannot work together."""
    if args.impl == "solutions" and not has_solutions():
        raise ValueError("--impl solutions trains with the reference answers, which this copy of the course does "
                         "not have: train with --impl template (your files) or --impl ddp (PyTorch's)")
    if args.bucket_mb < 0:
        raise ValueError(f"--bucket-mb {args.bucket_mb}: a bucket size is 0 (one bucket per parameter) or more")
    strategy = next(cls for cls in STRATEGIES if cls.chosen_by(args))
    refusal = strategy.refusal(args)
    if refusal:
        raise ValueError(refusal)
    return strategy
