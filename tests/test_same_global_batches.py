"""Data-parallel training is single-process training on the global batch: the same run on
1, 2 and 4 ranks gives the same losses and the same model, up to float rounding.

    pytest tests/test_same_global_batches.py

It holds because the training loader gives rank r its slice of every global batch (Task 1.4,
global_batch_size), so step k trains on the same samples on any number of ranks. PyTorch's
DistributedSampler (--impl ddp) hands out indices[rank::world_size], which gives the same
global batches. With each rank reading a contiguous block of the whole epoch instead, step k
would train on other samples on each number of ranks, and the runs would part from step 1.
The gradients are averaged with dist.all_reduce here, so only the loaders are under test.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import DistributedSampler as TorchSampler

from conftest import load
from harness import run_ranks

pytestmark = pytest.mark.repo  # the solutions' loaders and PyTorch's; a student's Task 1.4 has its own test

SAMPLES, GLOBAL_BATCH, EPOCHS = 100, 8, 2  # 12 steps an epoch on 1, 2 or 4 ranks; 4 samples left over


def _train_on_rank(rank, world_size, loaders):
    if world_size > 1:
        torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    train_set = TensorDataset(torch.randn(SAMPLES, 8, generator=g), torch.randint(0, 3, (SAMPLES,), generator=g))
    if loaders == "torch":  # what train_ddp.py --impl ddp uses
        sampler = TorchSampler(train_set, world_size, rank, shuffle=True, seed=5)
        train = DataLoader(train_set, batch_size=GLOBAL_BATCH // world_size, sampler=sampler, drop_last=True)
    else:
        train, _ = load("solutions", "template_data_loader").build_loaders(
            train_set, train_set, GLOBAL_BATCH, rank, world_size, seed=5)
    torch.manual_seed(1)  # the same start on every rank, without Task 2.1's broadcast
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for epoch in range(EPOCHS):
        train.sampler.set_epoch(epoch)
        for x, y in train:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if world_size > 1:
                for param in model.parameters():
                    dist.all_reduce(param.grad)
                    param.grad /= world_size
                dist.all_reduce(loss.detach())  # every rank's batch has the same size: the mean of means
            optimizer.step()
            losses.append(loss.item() / world_size)
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow  # about 15 s: three groups of ranks start
def test_one_two_and_four_ranks_train_alike():
    one, one_params = _train_on_rank(0, 1, "solutions")  # one process, no process group: the reference
    assert len(one) == EPOCHS * (SAMPLES // GLOBAL_BATCH)
    for loaders, world_size in [("solutions", 2), ("solutions", 4), ("torch", 4)]:
        losses, params = run_ranks(_train_on_rank, world_size, loaders)[0]
        # the averaged gradients are summed in another order on each number of ranks: equal up to
        # float rounding (float32: 1e-7 relative an operation); another global batch changes a loss by 1e-2 or more
        assert losses == pytest.approx(one, rel=1e-5), (
            f"{loaders}'s loaders on {world_size} ranks: the per-step losses {losses[:4]}... differ from one "
            f"rank's {one[:4]}...: every step must train on the same global batch on any number of ranks")
        for mine, theirs in zip(params, one_params):
            assert torch.allclose(mine, theirs, rtol=1e-5, atol=1e-6), (
                f"{loaders}'s loaders on {world_size} ranks: after {len(one)} steps the weights differ from "
                f"one rank's by {(mine - theirs).abs().max().item():.1e}")
