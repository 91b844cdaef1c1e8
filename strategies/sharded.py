"""Sharding (--shard): Task 6's ShardedOptimizer (ZeRO-1), a feature any strategy that keeps whole
parameters can take, and Task 7's FSDP, a strategy of its own; PyTorch's with --impl ddp."""
import torch.distributed as dist

from strategies.base import Feature, Strategy, broadcast_like_ddp
from strategies.course_files import course_module
from strategies.data_parallel import TorchDDP

ALLREDUCE_WITH_FSDP = ("--shard full reduce-scatters the gradients inside FSDP; --allreduce naive/ring "
                       "replaces an all-reduce it does not use: leave --allreduce at torch")
OVERLAP_WITH_FSDP = ("--shard full reduce-scatters the gradients inside FSDP, and --sync overlap wraps the "
                     "model in Task 5's DDP, which all-reduces them whole: use one of the two")


def add_arguments(parser):
    group = parser.add_argument_group("sharding (strategies/sharded.py)")
    group.add_argument("--shard", choices=["none", "optimizer", "full"], default="none",
                       help="none: every rank holds all the state; optimizer: Task 6's ShardedOptimizer "
                       "(ZeRO-1); full: Task 7's FSDP, or PyTorch's fully_shard with --impl ddp (default: none)")


class ShardOptimizerState(Feature):
    """--shard optimizer (Task 6): each rank keeps the optimizer state of its shard only; the gradients
    are still averaged whole before step(), which then sends every rank the updated shards."""

    @classmethod
    def chosen_by(cls, args):
        return args.shard == "optimizer"

    @classmethod
    def needs(cls, args):
        return super().needs(args) + ["template_zero.py"]

    def optimizer(self, model, optimizer_cls, optimizer_kwargs):
        if self.args.impl == "ddp":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_cls, **optimizer_kwargs)
        else:
            zero = course_module(self.args.impl, "template_zero")
            optimizer = zero.ShardedOptimizer(model.parameters(), optimizer_cls, **optimizer_kwargs)
        self.trainer.print0(f"optimizer: {optimizer_cls.__name__}, its state sharded over the "
                            f"{dist.get_world_size()} ranks ({type(optimizer).__name__})")
        return optimizer


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
        return model.gather_full_params()


class TorchFullyShard(TorchDDP):
    """--impl ddp --shard full: PyTorch's fully_shard, one unit per module that holds parameters, as ours."""
    name = "fully_shard"

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp" and args.shard == "full"

    def wrap(self, model):
        from torch.distributed.fsdp import fully_shard
        broadcast_like_ddp(model)  # fully_shard does not broadcast (DDP and our FSDP do)
        for module in model.modules():
            if module is not model and any(True for _ in module.parameters(recurse=False)):
                fully_shard(module)
        return fully_shard(model)  # it reduce-scatters during backward

    def sync_line(self, stats):
        return "sync overlapped with backward by fully_shard"

    def full_parameters(self, model):
        return {name: p.full_tensor() for name, p in model.named_parameters()}


STRATEGIES = [TorchFullyShard, OurFSDP]
FEATURES = [ShardOptimizerState]
