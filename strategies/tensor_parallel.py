"""Tensor parallelism (--tp N, Task 9): the classifier's Linear layers split over groups of N
consecutive ranks, data parallel over the world_size / N groups; PyTorch's parallelize_module
with --impl ddp."""
import logging
import warnings

import torch
import torch.distributed as dist

from strategies.base import Strategy, broadcast_like_ddp, split_model_refusal
from strategies.course_files import course_module
from strategies.data_parallel import TorchDDP


def add_arguments(parser):
    group = parser.add_argument_group("tensor parallelism (strategies/tensor_parallel.py)")
    group.add_argument("--tp", type=int, default=1, metavar="N",
                       help="Task 9: split the classifier over groups of N ranks (tensor parallelism), data "
                       "parallel over world_size / N; PyTorch's parallelize_module with --impl ddp (default: 1)")


def same_kernels_on_every_rank():
    """The convolutions run whole on every rank of a tensor-parallel group, on the same images, and
    their parameters must stay bit-identical there. On a GPU, cuDNN's fastest backward adds in an
    order that varies from run to run (atomics): seen with --tp 2 on one H200, the ranks' features.*
    drifted apart within an epoch. Its deterministic kernels add in one order."""
    torch.backends.cudnn.deterministic = True


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
        same_kernels_on_every_rank()
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
        return self.tp.gather_full_params(model)


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
        same_kernels_on_every_rank()
        device = next(model.parameters()).device
        mesh = init_device_mesh(device.type, (dist.get_world_size() // self.args.tp, self.args.tp),
                                mesh_dim_names=("dp", "tp"))
        broadcast_like_ddp(model)
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
            return {name: p.full_tensor() for name, p in model.named_parameters()}
        finally:
            logger.setLevel(level)


STRATEGIES = [TorchTensorParallel, TensorParallel]
