"""Where the GPU tests' ranks run. NCCL refuses two ranks on one GPU, so a world of N ranks uses NCCL
where there are N GPUs, and gloo carrying CUDA tensors (through the host) where the ranks share
fewer: one GPU is enough to run every GPU test, two or more to run them on NCCL too.

Every other test checks the paths that a student takes on CPUs, on a GPU node too: conftest.py
hides the GPUs (CUDA_VISIBLE_DEVICES="") from the processes tests start (torchrun, check.py, the
grader), where torchrun --nproc_per_node=2 would otherwise pick NCCL and stop on a node with one
GPU. pytest's own process and the server that forks the ranks keep them."""
import pytest
import torch

GPUS = torch.cuda.device_count()  # NVML's count: starts no CUDA driver, so forking stays safe


def backends(world_size=2):
    """pytest parameters: "nccl" (skipped without world_size GPUs) and "gloo" (skipped without a GPU)."""
    return [pytest.param("nccl", marks=pytest.mark.skipif(
                GPUS < world_size, reason=f"NCCL needs a GPU per rank: {world_size} GPUs, {GPUS} here")),
            pytest.param("gloo", marks=pytest.mark.skipif(GPUS < 1, reason="needs a GPU"))]


def use_gpu(rank):
    """This rank's GPU: rank % GPUs (ranks share them under gloo)."""
    torch.cuda.set_device(rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())
