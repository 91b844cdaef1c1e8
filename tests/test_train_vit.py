"""train_ddp.py --model vit: the transformer of Tasks 14-16 under every strategy that does not depend
on the model's layers.

    pytest tests/test_train_vit.py               # the flags that cannot train the ViT: one line each
    pytest -m slow tests/test_train_vit.py       # train_ddp.py's training on 1, 2 and 4 ranks, against one process

The ViT has no BatchNorm and no dropout, so every exact strategy (the all-reduces of Tasks 2-3, DDP
ours and PyTorch's, ZeRO-1, FSDP, checkpoints) must give the losses of one process on the global
batch, up to float rounding, and end with bit-identical ranks. Compression, local SGD and DiLoCo
change the training on purpose: they must train the ViT and end consistent.
"""
import pytest
import torch

import models
import train_ddp
from conftest import REFERENCE
from test_train_ddp import trained

QUICK = ["--data", "synthetic", "--model", "vit", "--epochs", "1", "--train-samples", "1024",
         "--test-samples", "256", "--batch-size", "128", "--no-plot"]


def test_the_vit_is_the_one_the_pages_describe():
    torch.manual_seed(0)
    vit = models.ViT()
    assert sum(p.numel() for p in vit.parameters()) == 207_946
    assert vit.pos_embed.shape == (1, 64, 64) and len(vit.blocks) == 4 and vit(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    names = {name for name, _ in vit.blocks[0].named_parameters()}
    assert {"norm1.weight", "attn.qkv.weight", "attn.proj.bias", "norm2.bias", "mlp.fc1.weight", "mlp.fc2.bias"} <= names
    assert vit.aux_loss().item() == 0.0  # no MoE layer: nothing to add to the loss
    assert not any(isinstance(m, (torch.nn.Dropout, torch.nn.modules.batchnorm._BatchNorm)) for m in vit.modules())


def test_the_attention_layout_is_q_k_v_each_by_head():
    """Attention's qkv output is [q | k | v], each [head 0 | head 1 | ...]: what Task 14 splits by head,
    checked against nn.MultiheadAttention, whose in_proj is laid out the same way."""
    torch.manual_seed(0)
    dim, heads = 16, 4
    ours, theirs = models.Attention(dim, heads).double(), torch.nn.MultiheadAttention(dim, heads, batch_first=True).double()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.qkv.weight)
        theirs.in_proj_bias.copy_(ours.qkv.bias)
        theirs.out_proj.weight.copy_(ours.proj.weight)
        theirs.out_proj.bias.copy_(ours.proj.bias)
    x = torch.randn(3, 5, dim, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x, x, x, need_weights=False)[0])


@pytest.mark.repo
@pytest.mark.parametrize("flags,message", [
    (["--pp", "2"], "--pp 2 cuts the CNN's 10 layers into stages (Task 10): it cannot train --model vit"),
    (["--batchnorm", "local"], "--batchnorm local puts BatchNorm layers into the CNN (Task 11)"),
    (["--batchnorm", "sync"], "leave --batchnorm out, or train the CNN"),
])
def test_a_strategy_cut_from_the_cnn_refuses_the_vit_in_one_line(flags, message, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        train_ddp.check_flags(train_ddp.parse_args(QUICK + flags))


def _train(ranks, flags, tmp_path):
    """(train loss, test loss, test accuracy) of the epoch on `ranks` ranks, and the output (torchrun and
    main() are test_train_ddp.py's: `trained` runs train_ddp.train in harness ranks)."""
    (figures, *_), out = trained(ranks, [*QUICK, *flags], tmp_path)
    return (figures["train_loss"], figures["test_loss"], figures["test_accuracy"]), out


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: one process trains the ViT on the whole global batch (solutions/' Tasks 1-2)."""
    return _train(1, ["--impl", REFERENCE], tmp_path_factory.mktemp("one"))[0]


EXACT = [
    (2, []),  # Task 2.2's all-reduce after backward
    (2, ["--allreduce", "ring"]),  # Task 3
    (2, ["--impl", "ddp"]),  # PyTorch's DistributedDataParallel
    (2, ["--sync", "overlap", "--accumulate", "2"]),  # Task 5: buckets during backward, no_sync
    (2, ["--shard", "optimizer"]),  # Task 6
    (2, ["--shard", "full"]),  # Task 7
    (4, ["--shard", "full"]),
    (2, ["--checkpoint-dir", "{tmp}/ckpt"]),  # Task 8
]
CHANGED = [
    (2, ["--sync", "overlap", "--compress", "bf16"]),  # Task 12
    (2, ["--sync", "overlap", "--compress", "powersgd"]),
    (2, ["--local-sgd", "2"]),  # Task 13
    (2, ["--diloco", "2"]),
]


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("ranks,flags", EXACT, ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_the_vit_trains_like_one_process_under_an_exact_strategy(ranks, flags, impl, one_process, tmp_path):
    if "ddp" in flags and impl == "template":
        pytest.skip("--impl ddp uses PyTorch's implementation, not your code (plain pytest runs it)")
    flags = [flag.format(tmp=tmp_path) for flag in flags]
    flags = flags if "ddp" in flags else ["--impl", impl, *flags]
    figures, out = _train(ranks, flags, tmp_path)
    assert f"ranks consistent: all {ranks} ranks hold bit-identical parameters" in out, out[-3000:]
    # 8 steps of SGD with momentum; another summation order moves the losses by 1e-6 relative here, a
    # wrong global batch or a gradient off by a factor by 1e-2 or more
    assert figures == pytest.approx(one_process, rel=5e-4), (
        f"{' '.join(flags)} on {ranks} ranks: (train loss, test loss, accuracy) {figures}; one process: "
        f"{one_process}\n{out[-3000:]}")


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("ranks,flags", CHANGED, ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_the_vit_trains_under_a_strategy_that_changes_the_training(ranks, flags, impl, tmp_path):
    (train_loss, test_loss, _), out = _train(ranks, ["--impl", impl, *flags], tmp_path)
    assert f"ranks consistent: all {ranks} ranks hold bit-identical parameters" in out, out[-3000:]
    # it learns: ln 10 = 2.30 is chance; the exact run's test loss after this epoch is 2.01, DiLoCo's 1.65
    assert train_loss < 2.30 and test_loss < 2.25, out[-3000:]
