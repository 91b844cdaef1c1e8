"""Context parallelism (--cp N, Task 15): each image's tokens split over groups of N consecutive ranks,
attention by ring attention or Ulysses over the group, data parallel over the world_size / N groups.

The gradient rule (docs/task15-context-parallel.md, "The ViT over a context group"): the pooled
feature is the mean over every rank's tokens, an all-reduce whose backward is the identity (every
rank of a group computes the same loss from the same pooled features, so each holds the whole
gradient of the mean already); the parameters before the pooling then hold, on each rank, the
part of the gradient from its own tokens (summed over the group: the replica's gradient), and the
head holds the replica's whole gradient on every rank of the group (not summed). One all-reduce
over the world, divided by the replicas for the first kind, by the world size for the head
(Task 15.6's average_context_parallel_gradients)."""
import torch
import torch.distributed as dist

from strategies.base import Strategy, gloo_send_refusal, split_model_refusal
from strategies.course_files import course_module
from strategies.data_parallel import TorchDDP

FILE = "template_context_parallel.py"
# what each --cp-impl trains with (unfilled_task reads these classes and functions of the file)
NEEDS = {"ring": ["merge_attention", "block_pairs", "RingAttention"],
         "ulysses": ["_AllToAll", "ulysses_attention"]}
POOLING = ["_SequenceMean", "average_context_parallel_gradients"]

# measured here, torch 2.14.1 with gloo (the issue, "Task 15")
TORCH_CP_ON_CPU = ("NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not "
                   "have a sharding strategy registered")


def add_arguments(parser):
    group = parser.add_argument_group("context parallelism (strategies/context_parallel.py)")
    group.add_argument("--cp", type=int, default=1, metavar="N",
                       help="Task 15: split each image's tokens over groups of N ranks (context parallelism, "
                       "--model vit), data parallel over world_size / N (default: 1)")
    group.add_argument("--cp-impl", choices=["ring", "ulysses"], default="ring",
                       help="--cp: the attention over the group: ring attention (K/V blocks passed round a ring) or "
                       "Ulysses (all-to-all to a split of the heads) (default: ring)")


def context_groups(cp):
    """This rank's context group: cp consecutive ranks. Every rank creates every group, in the same order."""
    world, rank = dist.get_world_size(), dist.get_rank()
    return [dist.new_group(list(range(start, start + cp))) for start in range(0, world, cp)][rank // cp]


class ContextParallel(Strategy):
    """--cp N: Task 15's context parallelism of the ViT. The N ranks of a group read the same slice of
    every global batch and each runs its 64 / N tokens of every image through the blocks; the
    world_size / N groups are data parallel. Gradients: Task 15.6's rule, one all-reduce."""
    name = "context-parallel"

    @classmethod
    def chosen_by(cls, args):
        return args.cp > 1

    @classmethod
    def refusal(cls, args):
        if args.model != "vit":
            return f"--cp {args.cp} splits the ViT's tokens over the ranks: add --model vit (the CNN has no sequence)"
        tokens, heads = 64, 4  # models.ViT()'s
        if tokens % args.cp:
            return f"--cp {args.cp} does not divide the ViT's {tokens} tokens: choose 2, 4 or 8"
        if args.cp_impl == "ulysses" and heads % args.cp:
            return (f"--cp-impl ulysses gives each of the --cp {args.cp} ranks whole heads, and the ViT has {heads}: "
                    "choose --cp 2 or 4, or --cp-impl ring")
        if args.accumulate > 1:
            return "--accumulate with --cp: not supported; leave it out"
        if getattr(args, "moe", 0):  # routing and capacity are per call: each rank would route its token shard alone
            return (f"--cp {args.cp} cannot be combined with --moe: a MoE routes the tokens of each call together, and "
                    "with --cp each rank would route a shard of every image alone; train the experts with --ep")
        for flag in ("local_sgd", "diloco"):
            if getattr(args, flag, 0):
                return (f"--cp {args.cp} cannot be combined with --{flag.replace('_', '-')}: each rank of a context "
                        "group holds part of every image, so the group steps together, after Task 15.6's all-reduce")
        return (gloo_send_refusal(args, f"--cp {args.cp} --cp-impl ring") if args.cp_impl == "ring" else None) \
            or split_model_refusal(args, "cp")

    @classmethod
    def needs(cls, args):
        return Strategy.files + [(FILE, name) for name in NEEDS[args.cp_impl] + POOLING]

    def __init__(self, args):
        super().__init__(args)
        self.cp = course_module(args.impl, "template_context_parallel")

    def data_ranks(self, rank, world_size):
        return rank // self.args.cp, world_size // self.args.cp

    def wrap(self, model):
        self.trainer.broadcast_parameters(model, src=0)  # the whole ViT, as Task 2.1
        return self.cp.ContextParallelViT(model, context_groups(self.args.cp), self.args.cp_impl)

    def sync_gradients(self, model):
        self.cp.average_context_parallel_gradients(model, self.args.cp)

    def start_line(self):
        return f"{super().start_line()} cp={self.args.cp} cp_impl={self.args.cp_impl}"


class TorchContextParallel(TorchDDP):
    """--impl ddp --cp N: PyTorch's torch.distributed.tensor.experimental.context_parallel, refused: it
    shards F.scaled_dot_product_attention's CUDA kernels only."""

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp" and args.cp > 1

    @classmethod
    def refusal(cls, args):
        if not torch.cuda.is_available():
            return (f"--impl ddp --cp {args.cp}: PyTorch's context_parallel runs on CUDA only (on a CPU it raises "
                    f"'{TORCH_CP_ON_CPU}'): train --impl template or --impl solutions here")
        return (f"--impl ddp --cp {args.cp}: PyTorch's context_parallel is not wired into train_ddp.py (it shards "
                "buffers given before the forward, and the ViT makes its tokens inside it): train --impl template "
                "or --impl solutions")


STRATEGIES = [TorchContextParallel, ContextParallel]
