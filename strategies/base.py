"""The default strategy, Task 2.2's averaging, which every other strategy changes in part; the
mixin a feature flag (one any strategy can take) is written as; and what several strategies share.

A strategy says, for itself and nowhere else, how train_ddp.py's run parallelises: which files it
trains with, which batches each rank reads, how it wraps the model and the optimizer, what runs
between backward and step, what the start and epoch lines say, and how its whole state is gathered
for the end-of-run check (strategies/__init__.py lists the methods in the order the run calls them).
"""
import os

import torch
import torch.distributed as dist

from models import CNN, ViT
from strategies.course_files import course_module


def add_arguments(parser):
    group = parser.add_argument_group("the model (models.py)")
    group.add_argument("--model", choices=["cnn", "vit"], default="cnn",
                       help="cnn: the course's CNN (0.28M parameters); vit: a small vision transformer, 64 tokens "
                       "of 4x4 patches (0.21M parameters; Tasks 14-16) (default: cnn)")


# Strategies cut from the CNN's own layers, and what they would have to be for the ViT.
CNN_ONLY = {"pp": "--pp {size} cuts the CNN's 10 layers into stages (Task 10)",
            "batchnorm": "--batchnorm {size} puts BatchNorm layers into the CNN (Task 11); the ViT has LayerNorms"}


def refusal(args):
    """What is wrong with --model whatever the strategy, or None."""
    if args.model == "cnn":
        return None
    for flag, why in CNN_ONLY.items():
        size = getattr(args, flag)
        if size not in (1, "none"):
            return f"{why.format(size=size)}: it cannot train --model {args.model}; leave --{flag} out, or train the CNN"
    return None


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
        """The template files this run trains with (a feature adds its own)."""
        return list(cls.files)

    def data_ranks(self, rank, world_size):
        """(this rank's slice, into how many slices each global batch is cut): every rank reads its own."""
        return rank, world_size

    def loaders(self, train_set, test_set, batch_size, rank, world_size, seed, workers, device):
        """Our sampler (Task 1): the rank of data_ranks reads its slice of every global batch."""
        loader_lib = course_module(self.args.impl, "template_data_loader")
        return loader_lib.build_loaders(train_set, test_set, batch_size, *self.data_ranks(rank, world_size), seed,
                                        workers, device)

    def build_model(self, device):
        """The model each rank starts from, before wrap(); the ranks seed differently on purpose."""
        return (ViT(num_experts=self.args.moe, top_k=self.args.top_k, capacity_factor=self.args.capacity_factor)
                if self.args.model == "vit" else CNN()).to(device)

    def wrap(self, model):
        self.trainer.broadcast_parameters(model, src=0)
        return model

    def optimizer(self, model, optimizer_cls, optimizer_kwargs):
        return optimizer_cls(model.parameters(), **optimizer_kwargs)

    @property
    def forward_backward(self):
        """Forward and backward of one batch (template_trainer.py's, unless the strategy runs its own)."""
        return self.trainer.forward_backward

    def sync_gradients(self, model):
        """What runs between backward and step (None as a class attribute: nothing, backward did it)."""
        self.trainer.average_gradients(model)

    def start_line(self):
        """The start line's words about how this run parallelises."""
        return f"allreduce={self.args.allreduce} sync={self.name}"

    def sync_line(self, stats):
        """What the epoch line says about synchronising; `stats`: this rank's train_one_epoch result."""
        return f"sync {stats['sync_seconds'] / stats['seconds']:.0%} of step time"

    def sync_share(self, stats):
        """The CSV's sync_share: the share of step time spent between backward and step."""
        return stats["sync_seconds"] / stats["seconds"]

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

    def full_parameters(self, model):
        """{name: parameter}, every parameter whole on every rank (a collective where they are split)."""
        return dict(model.named_parameters())

    def full_state(self, model):
        """{name: tensor}: the whole parameters and the buffers, what the end-of-run check compares."""
        return {**self.full_parameters(model), **dict(model.named_buffers())}

    def differing(self, model):
        """The names of the tensors of full_state in which some rank's bits differ from rank 0's, the
        same list on every rank; [] when every rank holds the same model. Two collectives."""
        state = self.full_state(model)
        data = [tensor.detach().contiguous().reshape(-1).view(torch.uint8) for tensor in state.values()]
        flat = torch.cat(data)
        reference = flat.clone()
        dist.broadcast(reference, src=0)
        differs = torch.stack([(mine != theirs).any() for mine, theirs in
                               zip(data, reference.split([len(d) for d in data]))]).int()
        dist.all_reduce(differs)  # every rank learns what any rank found
        return [name for name, count in zip(state, differs.tolist()) if count]

    def consistency(self, model):
        """The end-of-run check: (True if every rank holds the same model, the line that says so)."""
        world, differing = dist.get_world_size(), self.differing(model)
        if not differing:
            return True, ("ranks consistent: one rank, nothing to compare" if world == 1 else
                          f"ranks consistent: all {world} ranks hold bit-identical parameters")
        shown = ", ".join(differing[:3]) + (f" and {len(differing) - 3} more" if len(differing) > 3 else "")
        return False, (f"ranks INCONSISTENT: the {world} ranks' parameters differ ({shown}); is every rank "
                       "broadcasting (Task 2.1) and averaging (Task 2.2) the same way?")


class Feature:
    """A flag that any strategy can take, written as a mixin: it overrides only the Strategy methods
    it changes and calls super() for the rest. choose() puts every feature the flags ask for in front
    of the chosen strategy: class Run(ShardOptimizerState, OurDDP). --shard optimizer
    (strategies/sharded.py) is one."""

    @classmethod
    def chosen_by(cls, args):
        return False


def world_size_before_set_up():
    return int(os.environ.get("WORLD_SIZE", 1))  # torchrun's; 1 for plain python


def average_flat(model, all_reduce, size):
    """Every .grad of model replaced by its mean over `size` ranks: one all_reduce (SUM) of one flat buffer."""
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    all_reduce(flat)
    flat /= size
    for grad, mean in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(mean.view_as(grad))


def broadcast_like_ddp(model):
    """Every parameter and buffer of model as rank 0's, with the helper PyTorch's DDP broadcasts with
    at its start (buckets of 250 MB): fully_shard and parallelize_module do not broadcast."""
    from torch.distributed.utils import _sync_module_states
    _sync_module_states(model, dist.group.WORLD, 250 * 1024 * 1024, 0, set())


def gloo_send_refusal(args, flag):
    """The refusal for a strategy that sends with dist.send/recv, or None. gloo sends CPU tensors only:
    with CUDA tensors (what setup_distributed gives on a GPU node) the process aborts, "writev ... Bad
    address" (seen with torch 2.11 on an H200; its all-reduce, broadcast and all-gather do take them)."""
    if args.backend == "gloo" and torch.cuda.is_available():
        return (f"{flag} sends tensors with dist.send/recv, which gloo does for CPU tensors only, and here they "
                "are on the GPU: leave --backend out for NCCL (a process a GPU), or train on CPUs: "
                "CUDA_VISIBLE_DEVICES= torchrun ...")
    return None


def split_model_refusal(args, kind):
    """What --tp, --pp and --cp cannot be combined with (kind: "tp", "pp" or "cp"), or None."""
    size = getattr(args, kind)
    conflicts = {f"--shard {args.shard}": args.shard != "none", "--sync overlap": args.sync == "overlap",
                 f"--allreduce {args.allreduce}": args.allreduce != "torch",
                 "--checkpoint-dir": args.checkpoint_dir is not None, f"--tp {args.tp}": kind != "tp" and args.tp > 1}
    for flag, conflicts_with_split in conflicts.items():
        if conflicts_with_split:
            return (f"--{kind} {size} cannot be combined with {flag}: the model split by --{kind} trains with Task "
                    "2's broadcast and Task 1's sampler only (--sync after-backward, --allreduce torch, --shard none, "
                    "no --checkpoint-dir, no other split of the model)")
    if world_size_before_set_up() % size:
        return (f"--{kind} {size} does not divide the world size {world_size_before_set_up()}: each group of {size} "
                f"consecutive ranks splits one model, so start a multiple of {size} processes")
    return None


STRATEGIES = [Strategy]
