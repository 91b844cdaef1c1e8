"""Tensor and sequence parallelism of the ViT (--model vit --tp N [--sp], Task 14): every block's attention
heads and MLP split over groups of N consecutive ranks, data parallel over the world_size / N groups, as
Task 9's grid; with --sp, the tokens between the split layers split too. PyTorch's parallelize_module with
--impl ddp (ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput)."""
import torch
import torch.distributed as dist

from strategies.base import broadcast_like_ddp
from strategies.course_files import course_module
from strategies.tensor_parallel import TensorParallel, TorchTensorParallel, same_kernels_on_every_rank


def add_arguments(parser):
    group = parser.add_argument_group("sequence parallelism (strategies/sequence_parallel.py)")
    group.add_argument("--sp", action="store_true",
                       help="Task 14: with --model vit --tp N, split the tokens between the split layers over the N "
                       "ranks too (sequence parallelism: LayerNorms and residuals on S / N tokens)")


def refusal(args):
    """What is wrong with --sp whatever the strategy, or None."""
    if args.sp and (args.model != "vit" or args.tp < 2):
        return ("--sp splits the ViT's tokens over the ranks of a tensor-parallel group: it needs --model vit and "
                "--tp 2 or more")
    return None


def regroup_qkv(tensor, size, back=False):
    """A qkv weight or bias of [q | k | v] rows (each [head 0 | head 1 | ...]) with its rows regrouped per rank,
    [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (q_r: the rows of rank r's heads in q), so that a split into `size`
    contiguous blocks gives each rank the q, k and v of its heads; back=True undoes it."""
    shape = (size, 3, -1) if back else (3, size, -1)
    return tensor.reshape(*shape, *tensor.shape[1:]).transpose(0, 1).reshape(tensor.shape)


def full_vit_parameters(full, size):
    """{name: whole parameter} as an unsplit ViT names and lays them out: each block's qkv gathered from
    the ranks' [q_r k_r v_r] blocks back into [q | k | v] (the saved model loads into models.ViT)."""
    for name in list(full):
        if ".attn.qkv." in name:
            full[name] = regroup_qkv(full[name], size, back=True)
    return full


class TensorParallelViT(TensorParallel):
    """--model vit --tp N [--sp]: Task 14's split of every block (heads and MLP; with --sp, the tokens between
    them) on Task 9's grid of groups: the same data ranks, broadcast before the split, and gradient average
    over the dp group; with --sp the LayerNorm and row-parallel bias gradients are first summed over the tp group."""
    name = "tensor-parallel"
    files = TensorParallel.files + ["template_sequence_parallel.py"]

    @classmethod
    def chosen_by(cls, args):
        return args.tp > 1 and args.model == "vit"

    def __init__(self, args):
        super().__init__(args)
        self.sp = course_module(args.impl, "template_sequence_parallel")

    def start_line(self):
        return super().start_line() + (" sequence-parallel" if self.args.sp else "")

    def wrap(self, model):
        same_kernels_on_every_rank()
        self.dp_group, self.tp_group = self.tp.make_2d_groups(dist.get_world_size() // self.args.tp, self.args.tp)
        self.refuse_wrong_groups(self.dp_group, self.tp_group, next(model.parameters()).device)
        self.trainer.broadcast_parameters(model, src=0)  # whole, BEFORE the split: every slice of one layer
        return self.sp.parallelize_vit(model, self.tp_group, sequence_parallel=self.args.sp)

    def sync_gradients(self, model):
        if self.args.sp:
            self.sp.sync_sequence_parallel_gradients(model, self.tp_group)
        self.tp.average_gradients_over_dp(model, self.dp_group)

    def full_parameters(self, model):
        return full_vit_parameters(self.tp.gather_full_params(model), self.args.tp)


def torch_parallelize_block(block, mesh, sequence_parallel=False):
    """PyTorch's plan for a models.Block on a 1-D DeviceMesh, in place: qkv and fc1 ColwiseParallel, proj and fc2
    RowwiseParallel; with sequence parallelism the LayerNorms SequenceParallel, attn and mlp gathering the whole
    sequence at their input (PrepareModuleInput, Shard(1) to Replicate) and proj and fc2 reduce-scattering their
    output (output_layouts=Shard(1)): the block takes and returns this rank's tokens. The fused qkv's rows are
    regrouped first (regroup_qkv), so that ColwiseParallel's contiguous split holds each rank's heads (torchtitan
    keeps separate wq, wk and wv for the same reason)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    size = mesh.size()
    if block.attn.heads % size:
        raise ValueError(f"{block.attn.heads} heads do not divide over the tensor-parallel size {size}")
    with torch.no_grad():
        for param in block.attn.qkv.parameters():
            param.copy_(regroup_qkv(param, size))
    block.attn.heads //= size
    if not sequence_parallel:
        plan = {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
    else:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan = {"norm1": SequenceParallel(), "attn": gather, "attn.qkv": ColwiseParallel(),
                "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
                "norm2": SequenceParallel(), "mlp": gather, "mlp.fc1": ColwiseParallel(),
                "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))}
    return parallelize_module(block, mesh, plan)


def torch_parallelize_vit(model, mesh, sequence_parallel=False):
    """torch_parallelize_block on every block; with sequence parallelism the first block takes this rank's tokens
    (Replicate to Shard(1): a slice, an all-gather in backward) and the final norm the whole sequence (Shard(1) to
    Replicate: an all-gather, this rank's slice in backward), as Task 14.5's parallelize_vit."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module
    for block in model.blocks:
        torch_parallelize_block(block, mesh, sequence_parallel)
    if sequence_parallel:
        parallelize_module(model, mesh, {
            "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                           use_local_output=True),
            "norm": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                       use_local_output=True)})
    return model


class TorchTensorParallelViT(TorchTensorParallel):
    """--impl ddp --model vit --tp N [--sp]: torch_parallelize_vit on the tp dimension of a 2-D DeviceMesh,
    fully_shard on its dp dimension (Task 9's recipe for the CNN)."""
    name = "parallelize_module"

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp" and args.tp > 1 and args.model == "vit"

    def start_line(self):
        return super().start_line() + (" sequence-parallel" if self.args.sp else "")

    def wrap(self, model):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        same_kernels_on_every_rank()
        device = next(model.parameters()).device
        mesh = init_device_mesh(device.type, (dist.get_world_size() // self.args.tp, self.args.tp),
                                mesh_dim_names=("dp", "tp"))
        broadcast_like_ddp(model)
        torch_parallelize_vit(model, mesh["tp"], self.args.sp)
        return fully_shard(model, mesh=mesh["dp"])

    def full_parameters(self, model):
        return full_vit_parameters(super().full_parameters(model), self.args.tp)


STRATEGIES = [TorchTensorParallelViT, TensorParallelViT]
