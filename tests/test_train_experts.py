"""train_ddp.py with a mixture of experts: --moe E (any strategy) and --ep N (Task 16's expert parallelism).

    pytest tests/test_train_experts.py               # the flags that cannot work: one line each
    pytest -m slow tests/test_train_experts.py       # train_ddp.py on 4 ranks end to end, against the references

Each rank routes its own slice of every global batch (capacity per rank's tokens), so the reference is
not one process on the global batch but the MoE run on each rank's slice in turn, its gradients averaged:
4-rank data parallelism with every rank holding all experts, Task 2's (--impl solutions --moe 4: the same
sums, the same losses to float rounding) and PyTorch's DDP (--impl ddp --moe 4: its own summation order,
which moves the losses by some 1e-4 over a few steps of SGD with momentum, and a router's choice with it).
Expert parallelism must give the former's losses to 4 decimals and stay within 5e-4 of the latter's.
"""
import re

import pytest

import train_ddp
from conftest import REFERENCE
from test_train_ddp import trained

# 258 test images: shards of 65, 65, 64, 64, 3 batches of 32 on two ranks and 2 on the others (an expert-parallel
# forward in evaluation would leave two ranks waiting in its all-to-all)
QUICK = ["--data", "synthetic", "--model", "vit", "--epochs", "1", "--train-samples", "512", "--test-samples", "258",
         "--batch-size", "128", "--no-plot"]


@pytest.mark.repo
@pytest.mark.parametrize("world_size,flags,message", [
    (4, ["--moe", "4"], "--moe 4 makes the ViT's MLPs mixtures of experts: add --model vit"),
    (4, ["--model", "vit", "--ep", "2"], "--ep 2 spreads the experts of --moe: add --moe E"),
    (4, ["--model", "vit", "--moe", "4", "--ep", "3"], "the 4 experts of --moe do not divide over 3 ranks"),
    (6, ["--model", "vit", "--moe", "8", "--ep", "4"], "--ep 4 does not divide the world size 6"),
    (4, ["--model", "vit", "--moe", "4", "--top-k", "5"], "choose 1 <= K <= E"),
    (4, ["--model", "vit", "--moe", "4", "--accumulate", "2"], "--accumulate with --moe"),
    (4, ["--model", "vit", "--moe", "4", "--ep", "2", "--impl", "ddp"], "--ep 2 cannot be combined with --impl ddp"),
    (4, ["--model", "vit", "--moe", "4", "--ep", "2", "--sync", "overlap"], "--ep 2 cannot be combined with --sync overlap"),
])
def test_a_moe_setting_that_cannot_work_is_one_line_before_any_rank_starts(world_size, flags, message, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    with pytest.raises(ValueError, match=re.escape(message)):
        train_ddp.check_flags(train_ddp.parse_args(flags))


def _train(ranks, flags, tmp_path):
    """(train loss, test loss) of the epoch on `ranks` harness ranks (test_train_ddp.trained), and the output."""
    (figures, *_), out = trained(ranks, [*QUICK, "--moe", "4", *flags], tmp_path)
    return figures["train_loss"], figures["test_loss"], out


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(900)  # three 4-rank runs of train_ddp.py: 15 s together at load 3 on 2 cores, minutes under more
def test_expert_parallel_training_gives_the_references_losses(impl, tmp_path):
    """train_ddp.py --impl solutions --data synthetic --model vit --moe 4 --ep 2 on 4 ranks,
    against Task 2's data parallelism and PyTorch's DDP on 4 ranks, every rank holding all 4 experts."""
    ours_train, ours_test, _ = _train(4, ["--impl", REFERENCE], tmp_path / "dp")
    ddp_train, ddp_test, _ = _train(4, ["--impl", "ddp"], tmp_path / "ddp")
    train_loss, test_loss, out = _train(4, ["--impl", impl, "--ep", "2"], tmp_path / "ep")
    assert "sync=expert-parallel ep=2 expert copies=2" in out, out[-3000:]
    assert "ranks consistent: all 4 ranks hold bit-identical parameters" in out, out[-3000:]
    assert re.search(r"moe: dropped \d+\.\d% of 131,072 token choices, busiest expert \d+\.\d\dx the mean", out), out[-3000:]
    assert (round(train_loss, 4), round(test_loss, 4)) == (round(ours_train, 4), round(ours_test, 4)), (
        f"--ep 2: losses {train_loss:.6f}, {test_loss:.6f}; data parallel with all experts on every rank: "
        f"{ours_train:.6f}, {ours_test:.6f}\n{out[-3000:]}")
    assert (train_loss, test_loss) == pytest.approx((ddp_train, ddp_test), rel=5e-4), (
        f"--ep 2: losses {train_loss:.6f}, {test_loss:.6f}; PyTorch's DDP: {ddp_train:.6f}, {ddp_test:.6f}")


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(600)  # four 2-rank runs of train_ddp.py
def test_moe_under_every_data_parallel_strategy_gives_task_2s_losses(tmp_path):
    """--moe 4 on 2 ranks with our overlapping DDP (--sync overlap), ZeRO-1 (--shard optimizer) and FSDP
    (--shard full), against Task 2's averaging: each rank routes its own slice in all four, so the
    losses agree to 4 decimals, the load-balancing loss's gradient included (a strategy that ran the
    template's forward_backward instead of the MoE feature's would leave it out)."""
    reference_train, reference_test, _ = _train(2, ["--impl", REFERENCE], tmp_path / "task2")
    for flags in (["--sync", "overlap"], ["--shard", "optimizer"], ["--shard", "full"]):
        train_loss, test_loss, out = _train(2, ["--impl", REFERENCE, *flags], tmp_path / flags[-1])
        assert "ranks consistent: all 2 ranks hold bit-identical parameters" in out, out[-3000:]
        assert re.search(r"moe: dropped \d+\.\d% of [\d,]+ token choices", out), out[-3000:]
        assert (round(train_loss, 4), round(test_loss, 4)) == (round(reference_train, 4), round(reference_test, 4)), (
            f"--moe 4 {' '.join(flags)}: losses {train_loss:.6f}, {test_loss:.6f}; Task 2's averaging: "
            f"{reference_train:.6f}, {reference_test:.6f}\n{out[-3000:]}")
