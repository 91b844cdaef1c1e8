"""Task 2: broadcast, gradient averaging and metric reduction (template_trainer.py).

    pytest --impl template -m task2_2      # one task; see conftest.py

Each test runs real ranks (tests/harness.py) and checks every rank's result, not only
rank 0's, against an independent reference: single-process training on the whole global
batch, PyTorch's DistributedDataParallel, or plain sums.
"""
import copy
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from conftest import load
from harness import run_ranks
from wire import Wire
from models import CNN

T21 = "Task 2.1 (template_trainer.py, broadcast_parameters)"
T22 = "Task 2.2 (template_trainer.py, average_gradients)"
T23 = "Task 2.3 (template_trainer.py, reduce_metrics)"



def on_gpu(*values):
    """Test parameters for gloo with CUDA tensors, skipped without a GPU."""
    no_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: gloo with CUDA tensors needs CUDA")
    return pytest.param(*values, marks=[pytest.mark.gpu, no_gpu])


class Awkward(nn.Module):
    """A toy model with what trips up hand-written data parallelism: a frozen parameter
    (no gradient), a trainable parameter that forward never uses (no gradient either),
    tied weights (one Parameter used by two layers) and a buffer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 6, bias=False)
        self.hidden = nn.Linear(6, 6)
        self.frozen = nn.Parameter(torch.randn(6), requires_grad=False)
        self.out = nn.Linear(6, 6, bias=False)
        self.out.weight = self.embed.weight  # tied
        self.unused = nn.Parameter(torch.zeros(3))  # requires grad, but .grad stays None
        self.register_buffer("scale", torch.rand(6) + 0.5)

    def forward(self, x):
        h = torch.tanh(self.embed(x) * self.scale + self.frozen)
        return self.out(torch.tanh(self.hidden(h)))


def _state(model):
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------- Task 2.1
def _broadcast(rank, world_size, impl, src, device):
    trainer = load(impl, "template_trainer")
    torch.manual_seed(100 + rank)  # every rank starts different, as in real life
    model = nn.Sequential(Awkward(), nn.BatchNorm1d(6)).to(device)
    model[1].running_mean.normal_()  # make the buffers differ between ranks too
    model[1].num_batches_tracked += rank  # an int64 buffer: trial 12, skipped by is_floating_point() or sent as a copy
    before = _state(model)
    params = list(model.parameters())
    sent, broadcast = [], dist.broadcast  # the memory of each tensor broadcast

    def recording(tensor, *args, **kwargs):
        sent.append(tensor.data_ptr())
        return broadcast(tensor, *args, **kwargs)
    dist.broadcast = recording
    try:
        trainer.broadcast_parameters(model, src=src)
    finally:
        dist.broadcast = broadcast
    own = {name: t.data_ptr() for name, t in model.state_dict(keep_vars=True).items()}
    # per tensor: whether dist.broadcast got the model's own tensor, and how many broadcasts there were in all
    reached = ({name: ptr in sent for name, ptr in own.items()}, len(sent), len(set(own.values())))
    same_objects = all(a is b for a, b in zip(params, model.parameters()))
    still_leaves = all(p.is_leaf for p in model.parameters())
    on_return = _state(model)
    dist.barrier()  # gloo's barrier waits for this rank's earlier collectives: broadcasts still on their way land
    return before, on_return, same_objects and still_leaves, _state(model), reached


@pytest.mark.task2_1
@pytest.mark.parametrize("world_size,src,device", [(2, 0, "cpu"), (3, 0, "cpu"), (3, 2, "cpu"), on_gpu(2, 0, "cuda")])
def test_broadcast_makes_every_rank_a_copy_of_src(impl, world_size, src, device):
    results = run_ranks(_broadcast, world_size, impl, src, device)
    expected = results[src][0]  # rank src's model before the broadcast
    buffers = {"0.scale", "1.running_mean", "1.running_var", "1.num_batches_tracked"}
    for rank, (_, after, in_place, later, (reached, sent, tensors)) in enumerate(results):
        assert in_place, f"{T21}: rank {rank}: copy into the model's own parameters, in place; do not replace them"
        for name, value in expected.items():
            if not torch.equal(after[name], value):
                kind = "buffer" if name in buffers else "parameter"
                if all(torch.equal(later[key], expected[key]) for key in expected):
                    pytest.fail(f"{T21}: on {world_size} ranks, rank {rank}'s {kind} '{name}' was not yet rank {src}'s "
                                "when broadcast_parameters returned, and was once every rank's collectives had "
                                "finished: a broadcast started with async_op=True must be waited for "
                                "(handle.wait()) before the function returns, or training starts from "
                                "half-copied weights")
                hint = ("broadcast the buffers too (model.buffers()): BatchNorm's running statistics are buffers"
                        if kind == "buffer" else f"every rank must call dist.broadcast(tensor, src={src}) for every parameter")
                if name == "1.num_batches_tracked" and not reached[name]:  # trial 12: skipped, or sent as a copy
                    hint = ("broadcast every buffer, integer ones too: BatchNorm's num_batches_tracked is an int64 "
                            "buffer (is_floating_point() is False), the count of steps each rank took")
                if not reached[name] and sent >= tensors:  # trial 12: as many broadcasts as tensors, not into this one
                    hint = (f"broadcast_parameters issued {sent} broadcasts for the model's {tensors} tensors, but "
                            f"none into '{name}' itself: it broadcast a copy of it (.float(), .to(), .clone() and "
                            "torch.tensor(...) make new memory), and the values never reached the model. Pass the "
                            "model's own tensor to dist.broadcast, which writes into it in place")
                if name == "0.frozen":
                    hint = ("a frozen parameter (requires_grad=False) is part of the model too, and each rank "
                            "initialised it with its own numbers: broadcast every parameter, trainable or not")
                # every rank holds one other rank's values: that rank was the source, not src
                fixed = [r for r in range(world_size) if r != src and all(
                    torch.equal(results[k][1][name], results[r][0][name]) for k in range(world_size))]
                if rank == src or fixed:  # the source lost its own values: they came from another rank
                    hint = (f"every rank holds rank {fixed[0]}'s values" if fixed else f"rank {src} lost its own values")
                    hint += (f": rank {src} is the source and must keep its values: pass the argument src to "
                             "dist.broadcast, not a fixed rank")
                pytest.fail(f"{T21}: after broadcast_parameters(model, src={src}) on {world_size} ranks, rank {rank}'s "
                            f"{kind} '{name}' is not bit-identical to rank {src}'s before the broadcast: {hint}")


# --------------------------------------------------------------------------- Task 2.2
# a float64 parameter's gradients, rank + 1 times this: float32 rounds FINE to 1, and the averages (1.25, 1.875 and
# 2.5 times FINE on 1, 2 and 3 ranks) are no whole numbers, so floor division (//) is told from float32 (trial 12)
FINE = 1 + 2 ** -40
PRECISE = 1.25 * FINE


def _known_gradients(rank, world_size, impl):
    trainer = load(impl, "template_trainer")
    model = Awkward()
    model.precise = nn.Parameter(torch.zeros(5, dtype=torch.float64))  # a float64 parameter among float32 ones
    for param in model.parameters():
        if param.requires_grad:
            param.grad = torch.full_like(param, float(rank + 1))
    model.precise.grad.mul_(PRECISE)
    reduced = []  # which tensors were all-reduced, by their memory
    # trial 12: what was reduced instead of a gradient that was only divided: the weight, or a copy of the gradient
    memory = {name: (p.data_ptr(), None if p.grad is None else p.grad.data_ptr()) for name, p in model.named_parameters()}
    with Wire(kinds=("all_reduce",)) as wire:  # trial 12: and whether each one started async_op=True was waited for
        all_reduce = dist.all_reduce  # the wire's

        def recording(tensor, *args, **kwargs):
            reduced.append(tensor.data_ptr())
            _same_size_on_every_rank(tensor, [None] * (len(reduced) - 1))
            return all_reduce(tensor, *args, **kwargs)
        dist.all_reduce = recording
        try:
            trainer.average_gradients(model)
        finally:
            dist.all_reduce = all_reduce
    tied = model.embed.weight.grad.data_ptr()
    grads = {name: (None if p.grad is None else p.grad.clone()) for name, p in model.named_parameters()}
    instead = {name: ("weights" if weight in reduced else "copy" if grad is not None and grad not in reduced else None)
               for name, (weight, grad) in memory.items()}
    instead["never waited"] = sum(not call.waited for call in wire.calls)
    return grads, reduced.count(tied), instead


@pytest.mark.task2_2
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_gradients_become_the_average_on_every_rank(impl, world_size):
    results = run_ranks(_known_gradients, world_size, impl)
    tied_reductions = [count for _, count, _ in results]
    instead = [what for _, _, what in results]
    results = [grads for grads, _, _ in results]
    average = sum(range(1, world_size + 1)) / world_size  # ranks hold 1, 2, ..., world_size (precise: x PRECISE)
    firsts = [{name: g.flatten()[0].item() for name, g in grads.items() if g is not None} for grads in results]
    for rank, grads in enumerate(results):
        assert grads["frozen"] is None, f"{T22}: the frozen parameter has no gradient; leave its .grad as None"
        unwaited = instead[rank]["never waited"]
        assert not unwaited, (
            f"{T22}: rank {rank} started {unwaited} all_reduce(async_op=True) and returned without waiting for "
            "their Work, so nothing made sure the sums had arrived before the gradients were divided and returned. Keep "
            "each handle and "
            "call handle.wait() before dividing and before returning")
        for name, grad in grads.items():
            if grad is None:
                continue
            value, mean = firsts[rank][name], average * (PRECISE if name == "precise" else 1)
            if abs(value - mean) > 1e-6 and abs(value - mean * world_size) < 1e-6:
                pytest.fail(f"{T22}: rank {rank}'s gradients are {world_size}x the average ({value} instead of "
                            f"{mean}): all_reduce SUM gives the sum; divide it by the world size")
            if abs(value - mean) > 1e-6 and rank > 0 and abs(firsts[0][name] - mean) < 1e-6:
                pytest.fail(f"{T22}: rank 0 has the average gradient of '{name}' ({mean}) but rank {rank} has "
                            f"{value}: every rank must receive the result (dist.all_reduce, not dist.reduce)")
            own = (rank + 1) * (PRECISE if name == "precise" else 1)  # this rank's gradient before the call
            if abs(value - mean) > 1e-6 and abs(value - own / world_size) < 1e-9 and instead[rank][name]:
                # trial 12: divided by the world size, never summed: the all_reduce went elsewhere
                pytest.fail(f"{T22}: rank {rank}'s gradient of '{name}' is its own gradient divided by the world "
                            f"size ({own} / {world_size} = {value}), never summed over the ranks: " + (
                                "average_gradients all-reduced the parameter itself (param or param.data, the "
                                "WEIGHTS), not its gradient: all_reduce param.grad"
                                if instead[rank][name] == "weights" else
                                "the all_reduce never got param.grad itself but a copy of it (.float(), .to(), "
                                ".clone() and torch.cat make new memory), and its sum went nowhere: all_reduce "
                                "param.grad in place, or copy the reduced values back into it"))
            if abs(value - mean) > 1e-6 and value == math.floor(mean):  # trial 12: param.grad //= world_size
                pytest.fail(f"{T22}: rank {rank}'s gradient of '{name}' is {value}, the average {mean} rounded down "
                            "to a whole number: // is floor division; divide with / (param.grad /= world_size)")
            assert torch.allclose(grad, torch.full_like(grad, mean)), (
                f"{T22}: rank {rank}'s gradient of '{name}' should be the average over ranks, {mean}, "
                f"got values like {value}")
        precise, exact = grads["precise"], average * PRECISE
        if precise.dtype != torch.float64 or (precise - exact).abs().max().item() > 1e-14:
            rounded = torch.tensor(exact, dtype=torch.float32).item()
            pytest.fail(f"{T22}: rank {rank}'s gradient of a float64 parameter came back as {precise.dtype} "
                        f"{precise[0].item()!r}, not the float64 average {exact!r}"
                        + (": the average rounded to float32, so it went through a float32 tensor on the way (a "
                           "buffer made without dtype=, such as torch.zeros(n)); average every gradient in its "
                           "own dtype" if precise[0].item() == rounded else ""))
        assert tied_reductions[rank] <= 1, (
            f"{T22}: rank {rank} all-reduced the gradient of the tied weight (one Parameter used by two layers) "
            f"{tied_reductions[rank]} times: model.parameters() lists it once; going through each module's "
            "parameters lists it once per layer, and each extra all_reduce sends it again for nothing")


def _train(model, optimizer, batches, sync):
    for x, y in batches:
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        sync(model)
        optimizer.step()


def _global_batches(steps=4, per_rank=5, world_size=3):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(world_size * per_rank, 6, generator=g), torch.randn(world_size * per_rank, 6, generator=g))
            for _ in range(steps)]


def _same_size_on_every_rank(tensor, calls):
    """Before an all_reduce of `tensor`: fail if another rank's all_reduce at the same point has another size (gloo
    aborts in C code on it, with no word of the cause). `calls` counts this rank's all_reduces."""
    calls.append(tensor.numel())
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([tensor.numel()]))
    sizes = [int(size) for size in sizes]
    if len(set(sizes)) > 1:
        raise AssertionError(
            f"{T22}: at its all_reduce number {len(calls)}, the ranks reduced tensors of {sizes} elements (rank 0, "
            "1, ...): they went through the gradients in different orders, so each all_reduce would add up "
            "different parameters' gradients. set(model.parameters()) orders them by memory address, another "
            "order on every rank: go through model.parameters(), in its order (it lists a tied weight once)")


def _average_gradients_of(trainer, model):
    """average_gradients(model), where Awkward's unused parameter requires grad and has no .grad; each all_reduce
    first checks that every rank reduces a tensor of the same size (trial 12: set(model.parameters()) orders them by
    memory address, another order on each rank, and gloo crashed in C code on the sizes that differed)."""
    all_reduce, calls = dist.all_reduce, []

    def same_size_everywhere(tensor, *args, **kwargs):
        _same_size_on_every_rank(tensor, calls)
        return all_reduce(tensor, *args, **kwargs)
    dist.all_reduce = same_size_everywhere
    try:
        trainer.average_gradients(model)
    except (TypeError, AttributeError) as error:
        unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
        if "NoneType" not in str(error) or not unused:
            raise
        raise AssertionError(
            f"{T22}: average_gradients raised {type(error).__name__}: {error}. The parameter {unused[0]!r} "
            "requires grad but forward never uses it, so its .grad is None after backward: skip the parameters "
            "whose .grad is None (not only those with requires_grad=False)") from error
    finally:
        dist.all_reduce = all_reduce


def _data_parallel_training(rank, world_size, impl):
    """Train Awkward on this rank's slice of each global batch, with average_gradients and,
    separately, with PyTorch's DistributedDataParallel."""
    trainer = load(impl, "template_trainer")
    torch.manual_seed(0)  # the same start everywhere: this test is about the gradients, not the broadcast
    model = Awkward()
    ddp_model = DistributedDataParallel(copy.deepcopy(model), find_unused_parameters=True)
    local = [(x.chunk(world_size)[rank], y.chunk(world_size)[rank]) for x, y in _global_batches(world_size=world_size)]
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), local,
           lambda model: _average_gradients_of(trainer, model))
    _train(ddp_model, torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9), local, lambda m: None)
    return _state(model), _state(ddp_model.module)


@pytest.mark.task2_2
@pytest.mark.parametrize("world_size", [2, 3])
def test_training_equals_single_process_training_on_the_global_batch(impl, world_size):
    results = run_ranks(_data_parallel_training, world_size, impl)
    torch.manual_seed(0)
    single = Awkward()
    _train(single, torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9),
           _global_batches(world_size=world_size), lambda m: None)
    expected = _state(single)
    for rank, (ours, ddp) in enumerate(results):
        for name, value in expected.items():
            # The mean of the ranks' mean losses is the mean loss over the global batch, so the
            # gradients agree up to float32 rounding: the sums run in another order (about 1e-7
            # relative per operation, a few hundred operations over 4 momentum steps). A missing
            # division, a skipped rank or a wrong parameter is off by 1e-2 or more.
            error = (ours[name] - value).abs().max().item()
            assert error < 1e-5, (
                f"{T22}: after 4 SGD steps on {world_size} ranks, '{name}' differs from single-process training "
                f"on the whole global batch by {error:.2e}: each step must use the gradient averaged over all ranks "
                "(all_reduce SUM, then divide by the world size)")
            assert torch.equal(ours[name], results[0][0][name]), (
                f"{T22}: rank {rank} and rank 0 hold different '{name}': every rank must end with the same averaged gradient")
            assert (ours[name] - ddp[name]).abs().max().item() < 1e-5, (
                f"{T22}: '{name}' differs from PyTorch's DistributedDataParallel trained on the same data")


def _cnn_step(rank, world_size, impl, device):
    trainer = load(impl, "template_trainer")
    # GPUs convolve in TF32 by default (10 bits of mantissa): the gradients would differ from the CPU's
    # float32 reference by up to a few percent, whatever the averaging
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    model = CNN().to(device)
    g = torch.Generator().manual_seed(1)
    images, labels = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
    local = slice(rank * 8 // world_size, (rank + 1) * 8 // world_size)
    F.cross_entropy(model(images[local].to(device)), labels[local].to(device)).backward()
    _average_gradients_of(trainer, model)
    return {name: p.grad.cpu() for name, p in model.named_parameters()}


@pytest.mark.task2_2
@pytest.mark.parametrize("device", ["cpu", on_gpu("cuda")])
def test_cnn_gradients_match_the_global_batch(impl, device):
    results = run_ranks(_cnn_step, 2, impl, device)
    torch.manual_seed(0)
    model = CNN()
    g = torch.Generator().manual_seed(1)
    images, labels = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
    F.cross_entropy(model(images), labels).backward()
    for rank, grads in enumerate(results):
        for name, p in model.named_parameters():
            assert torch.allclose(grads[name], p.grad, rtol=1e-4, atol=1e-6), (
                f"{T22}: rank {rank}'s gradient of the CNN's '{name}' is not the gradient of the whole batch")


# --------------------------------------------------------------------------- Task 2.3
# 10 test images on 3 ranks, split 4, 3, 3 as the unpadded sampler does
COUNTS = [(3, 4, 2.5), (1, 3, 4.0), (2, 3, 1.25)]


# counts past 2**24, where float32 stops holding every integer, and a loss sum float32 rounds
LARGE = [(2 ** 24 + 1, 2 ** 25 + 1, 0.1), (2, 3, 0.2), (3, 5, 0.3)]


def _reduce(rank, world_size, impl, device):
    trainer = load(impl, "template_trainer")
    return trainer.reduce_metrics(*COUNTS[rank], device=device), trainer.reduce_metrics(*LARGE[rank], device=device)


@pytest.mark.task2_3
@pytest.mark.parametrize("device", ["cpu", on_gpu("cuda")])
def test_every_rank_gets_the_global_sums(impl, device):
    both = run_ranks(_reduce, 3, impl, device, timeout=15)
    results = [small for small, _ in both]
    expected = (6, 10, 7.75)
    for rank, got in enumerate(results):
        correct, total, loss_sum = got
        right = (correct, total) == expected[:2] and abs(loss_sum - expected[2]) < 1e-9
        if not right and rank > 0 and results[0][:2] == expected[:2]:
            pytest.fail(f"{T23}: rank 0 got the sums {results[0]} but rank {rank} got {got}: every rank must get "
                        "them (dist.all_reduce; dist.reduce leaves the result on one rank only)")
        truncated = {math.floor(expected[2]), sum(math.floor(loss) for _, _, loss in COUNTS)}
        if not right and (correct, total) == expected[:2] and loss_sum in truncated:  # trial 12: an int64 tensor
            pytest.fail(f"{T23}: rank {rank} got loss_sum {loss_sum!r}, the sum over the ranks {expected[2]} with its "
                        "fractions cut off: it went through an integer tensor (dtype=torch.int64, or .long() / "
                        ".int()), which truncates the losses. Reduce loss_sum in a floating-point tensor (float64)")
        assert right, (
            f"{T23}: rank {rank} got {got}, expected the sum over the 3 ranks {expected}: sum the counts "
            "(never average them: the ranks hold different numbers of images)")
        assert isinstance(correct, int) and isinstance(total, int), (
            f"{T23}: return correct and total as Python ints, got {type(correct).__name__}, {type(total).__name__}")
        assert isinstance(loss_sum, float), (
            f"{T23}: return loss_sum as a Python float, got {type(loss_sum).__name__} {loss_sum!r}: a tensor "
            "element stays a tensor until .item() or .tolist() turns it into a number")
    expected = tuple(map(sum, zip(*LARGE)))
    for rank, (_, got) in enumerate(both):
        correct, total, loss_sum = got
        if (correct, total) == expected[:2] and abs(loss_sum - expected[2]) < 1e-12:
            continue
        # float32 keeps 24 bits: integers past 2**24 and this loss sum come back rounded, by a few 2**-24 relative
        as_float32 = all(abs(g - e) <= 2 ** -21 * abs(e) for g, e in zip(got, expected))
        pytest.fail(f"{T23}: with counts past 2**24 = {2 ** 24}, rank {rank} got {got}, expected the sums {expected}"
                    + (": they were rounded to float32, which holds integers exactly only up to 2**24; add them up "
                       "as float64 (exact up to 2**53) or as integers" if as_float32 else ""))


def _evaluate_shard(rank, world_size, impl):
    trainer = load(impl, "template_trainer")
    torch.manual_seed(0)
    model = CNN()
    images, labels = _test_set()
    shard = torch.tensor_split(torch.arange(len(labels)), world_size)[rank]
    loader = [(images[shard], labels[shard])]  # one batch: a rank's whole shard
    return trainer.evaluate(model, loader, torch.device("cpu"))


def _test_set():
    g = torch.Generator().manual_seed(2)
    return torch.randn(10, 3, 32, 32, generator=g), torch.randint(0, 10, (10,), generator=g)


@pytest.mark.task2_3
def test_parallel_evaluation_equals_single_process_evaluation(impl):
    results = run_ranks(_evaluate_shard, 3, impl, timeout=15)
    torch.manual_seed(0)
    model = CNN().eval()
    images, labels = _test_set()
    with torch.no_grad():
        logits = model(images)
    correct = (logits.argmax(1) == labels).sum().item()
    loss = F.cross_entropy(logits, labels).item()
    for rank, result in enumerate(results):
        assert (result["correct"], result["total"]) == (correct, 10), (
            f"{T23}: 10 test images on 3 ranks (4, 3, 3): rank {rank} reports {result['correct']}/{result['total']} "
            f"correct, single-process evaluation {correct}/10")
        assert abs(result["loss"] - loss) < 1e-5, f"{T23}: rank {rank}'s mean test loss {result['loss']} != {loss}"


# ------------------------------------------------------------ NCCL, on a machine with a GPU
def _nccl_world_of_one(rank, world_size, impl):
    trainer = load(impl, "template_trainer")
    model = Awkward().cuda()
    trainer.broadcast_parameters(model)
    for param in model.parameters():
        if param.requires_grad:
            param.grad = torch.ones_like(param)
    trainer.average_gradients(model)
    grads_ok = all(p.grad is None or torch.equal(p.grad, torch.ones_like(p)) for p in model.parameters())
    return grads_ok, trainer.reduce_metrics(3, 4, 1.5, device="cuda")


@pytest.mark.task2_1
@pytest.mark.task2_2
@pytest.mark.task2_3
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: NCCL needs one")
def test_nccl_world_of_one(impl):
    """NCCL puts one rank on each GPU, so one GPU is a world of one: Tasks 2.1-2.3 must
    still run there, with CUDA tensors and NCCL's own rules (no CPU tensors)."""
    [(grads_ok, sums)] = run_ranks(_nccl_world_of_one, 1, impl, backend="nccl", timeout=60)
    assert grads_ok, "Tasks 2.1-2.2 on NCCL: with one rank the average gradient is the gradient itself"
    assert sums == (3, 4, 1.5), f"Task 2.3 on NCCL: one rank's sums are its own counts, got {sums}"


# ------------------------------------------------------------------ the given set-up
def test_setup_distributed_makes_a_world_of_one_without_torchrun(trainer, monkeypatch):
    for name in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]:
        monkeypatch.delenv(name, raising=False)
    rank, local_rank, world_size, device = trainer.setup_distributed()
    try:
        assert (rank, local_rank, world_size) == (0, 0, 1)
        assert dist.get_backend() == ("nccl" if torch.cuda.is_available() else "gloo")
        assert device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    finally:
        trainer.cleanup()
    assert not dist.is_initialized(), "cleanup() must destroy the process group"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU, so NCCL can work")
def test_nccl_without_a_gpu_says_what_to_do(trainer, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="--backend gloo"):
        trainer.setup_distributed(backend="nccl")
