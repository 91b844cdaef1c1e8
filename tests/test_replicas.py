"""Task 4: one process, many replicas, checked against single-device training on the whole batch.

    pytest --impl template -m task4_1     # replicate
    pytest --impl template -m task4_2     # scatter
    pytest --impl template -m task4_3     # reduce_gradients
    pytest --impl template -m task4_4     # copy_weights, and whole training steps

Several replicas on the CPU stand for several devices, so all but the nn.DataParallel
comparison run without a GPU.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import load
from models import CNN

WHERE = {"4.1": "Task 4.1 (template_replicas.py, replicate)",
         "4.2": "Task 4.2 (template_replicas.py, scatter)",
         "4.3": "Task 4.3 (template_replicas.py, reduce_gradients)",
         "4.4": "Task 4.4 (template_replicas.py, copy_weights)"}


@pytest.fixture(scope="module")
def replicas(impl):
    return load(impl, "template_replicas")


def use_reference(monkeypatch, replicas, *names):
    """Swap in solutions/'s answers to the other subtasks, so that a test judges one task alone:
    a mistake in reduce_gradients fails Task 4.3, not Task 4.4 as well."""
    reference = load("solutions", "template_replicas")
    for name in names:
        monkeypatch.setattr(replicas, name, getattr(reference, name))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and on a busy machine several threads spin
    against each other (about 20 times slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Awkward(nn.Module):
    """A small model with a buffer and a frozen parameter, which a careless copy or average misses."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 4)
        self.frozen = nn.Linear(4, 3)
        self.frozen.weight.requires_grad_(False)
        self.register_buffer("scale", torch.tensor([1.5, 0.5, 2.0]))

    def forward(self, x):
        return self.frozen(torch.relu(self.linear(x))) * self.scale


def tensors(module):
    return list(module.parameters()) + list(module.buffers())


# --- Task 4.1 ------------------------------------------------------------------------------------

@pytest.mark.task4_1
def test_replicate_makes_independent_copies(replicas):
    torch.manual_seed(0)
    master = Awkward()
    master.linear.bias.requires_grad_(False)  # frozen after it was made: its constructor does not say so
    before = [t.clone() for t in tensors(master)]
    devices = ["cpu", "cpu", "cpu"]
    copies = replicas.replicate(master, devices)
    assert isinstance(copies, list) and len(copies) == len(devices), (
        f"{WHERE['4.1']}: expected a list of {len(devices)} replicas, got {type(copies).__name__} "
        f"of length {len(copies) if hasattr(copies, '__len__') else '?'}"
        + (f": one per entry of devices = {devices}, repeats too (a device may hold several replicas), not one "
           "per distinct device" if hasattr(copies, "__len__") and len(copies) == len(set(devices)) else ""))
    for i, (replica, device) in enumerate(zip(copies, devices)):
        assert replica is not master, f"{WHERE['4.1']}: replica {i} is the master itself: make a deep copy"
        for name, (mine, theirs) in enumerate(zip(tensors(replica), tensors(master))):
            assert mine.device == torch.device(device), (
                f"{WHERE['4.1']}: replica {i}'s tensor {name} is on {mine.device}, not {device}")
            assert torch.equal(mine.cpu(), theirs), f"{WHERE['4.1']}: replica {i}'s tensor {name} differs from the master's"
            assert mine.data_ptr() != theirs.data_ptr(), (
                f"{WHERE['4.1']}: replica {i} shares its memory with the master: each replica needs its own "
                "copy of the weights (copy.deepcopy), or the replicas on one device are all one model")
        assert len(tensors(replica)) == len(tensors(master)), f"{WHERE['4.1']}: replica {i} lost parameters or buffers"
        for (name, mine), theirs in zip(replica.named_parameters(), master.parameters()):
            assert mine.requires_grad == theirs.requires_grad, (
                f"{WHERE['4.1']}: replica {i}'s {name} has requires_grad={mine.requires_grad}, the master's "
                f"{theirs.requires_grad}: a replica is a copy of the master as it is, frozen parameters too (a model "
                "built anew and given the master's state_dict is not: a state_dict holds values only; "
                "copy.deepcopy keeps requires_grad)")
    pointers = {t.data_ptr() for replica in copies for t in tensors(replica)}
    assert len(pointers) == len(devices) * len(tensors(master)), (
        f"{WHERE['4.1']}: some replicas share memory with each other: make one copy per device")
    with torch.no_grad():
        copies[0].linear.weight.add_(1.0)
    assert all(torch.equal(a, b) for a, b in zip(tensors(master), before)), (
        f"{WHERE['4.1']}: changing a replica changed the master: the replicas must be copies")
    assert all(t.device.type == "cpu" for t in tensors(master)), f"{WHERE['4.1']}: the master must stay on the CPU"


@pytest.mark.task4_1
def test_replicate_leaves_the_master_on_the_cpu(replicas):
    """The "meta" device (shapes, no values) stands for a GPU: with CPU devices only, moving the master
    to its device is a no-op that no other check sees."""
    torch.manual_seed(0)
    master = Awkward()
    before = [t.clone() for t in tensors(master)]
    devices = ["cpu", "meta", "meta"]  # a master moved to meta could not come back: "cpu" first
    copies = replicas.replicate(master, devices)
    moved = sorted({str(t.device) for t in tensors(master)} - {"cpu"})
    assert not moved, (
        f"{WHERE['4.1']}: replicate(master, {devices}) moved the master itself to {', '.join(moved)}: "
        "module.to(device) moves a module in place (and returns it), so copy first, then move the copy: "
        "copy.deepcopy(master).to(device)")
    assert all(torch.equal(a, b) for a, b in zip(tensors(master), before)), (
        f"{WHERE['4.1']}: replicate changed the master's values")
    for i, (replica, device) in enumerate(zip(copies, devices)):
        wrong = sorted({str(t.device) for t in tensors(replica)} - {device})
        assert not wrong, f"{WHERE['4.1']}: replica {i} has tensors on {', '.join(wrong)}, not on devices[{i}] = {device}"


# --- Task 4.2 ------------------------------------------------------------------------------------

@pytest.mark.task4_2
@pytest.mark.parametrize("batch,num_devices", [(8, 2), (10, 4), (5, 4), (4, 4), (7, 3), (9, 1)])
def test_scatter_cuts_the_batch_in_order(replicas, batch, num_devices):
    images = torch.arange(batch * 2.0, dtype=torch.float64).reshape(batch, 2)  # not the default dtype: kept
    labels = torch.arange(batch)
    devices = ["cpu"] * num_devices
    chunks = replicas.scatter(images, labels, devices)
    assert isinstance(chunks, (list, tuple)), (
        f"{WHERE['4.2']}: scatter returned a {type(chunks).__name__}, not a list of (images, labels) pairs: a "
        "generator (or zip) can be read once only, and has no len()")
    sizes = [len(y) for _, y in chunks]
    assert sizes is not None and len(sizes) == num_devices, (
        f"{WHERE['4.2']}: {batch} images on {num_devices} devices gave {sizes and len(sizes)} chunks, not "
        f"{num_devices}: every device needs a chunk (torch.chunk can give fewer; torch.tensor_split does not)")
    assert max(sizes) - min(sizes) <= 1, (
        f"{WHERE['4.2']}: {batch} images on {num_devices} devices gave chunks of {sizes}: their lengths must "
        "differ by at most one (torch.tensor_split), or one device does most of the work")
    assert torch.equal(torch.cat([x for x, _ in chunks]), images) and torch.equal(torch.cat([y for _, y in chunks]), labels), (
        f"{WHERE['4.2']}: the chunks put together are not the batch, in order ({sizes}): every image once, "
        "with its own label")
    for i, ((x, y), device) in enumerate(zip(chunks, devices)):
        assert len(x) == len(y), (
            f"{WHERE['4.2']}: chunk {i} pairs {len(x)} images with {len(y)} labels: cut the images and the "
            "labels the same way")
        assert x.dtype == images.dtype, (
            f"{WHERE['4.2']}: chunk {i}'s images are {x.dtype}, the batch's {images.dtype}: only move the chunks, "
            "with .to(device); converting them is the caller's choice, not scatter's")
        assert y.dtype == labels.dtype, (
            f"{WHERE['4.2']}: chunk {i}'s labels are {y.dtype}, the batch's {labels.dtype}: only move the chunks, "
            "with .to(device) (y.to(x) would give y x's dtype too, and cross_entropy wants class indices as "
            "integers)")
        assert x.device == torch.device(device) and y.device == torch.device(device), (
            f"{WHERE['4.2']}: chunk {i} is on {x.device}/{y.device}, not on its device {device}")
    with pytest.raises(ValueError, match=f"at least {num_devices + 1}"):  # the given check, before yours
        replicas.scatter(images[:num_devices], labels[:num_devices], devices + ["cpu"])


@pytest.mark.task4_2
def test_scatter_moves_images_and_labels_to_their_devices(replicas):
    """The "meta" device (shapes, no values) stands for a GPU, so that this runs on every machine."""
    devices = ["cpu", "meta", "cpu", "meta"]
    chunks = replicas.scatter(torch.zeros(8, 2), torch.zeros(8, dtype=torch.long), devices)
    for i, ((x, y), device) in enumerate(zip(chunks, devices)):
        assert x.device == torch.device(device), (
            f"{WHERE['4.2']}: chunk {i}'s images are on {x.device}, not on devices[{i}] = {device}")
        assert y.device == torch.device(device), (
            f"{WHERE['4.2']}: chunk {i}'s labels are on {y.device}, its images on {x.device}, devices[{i}] = "
            f"{device}: move the labels to the device too (the loss compares them with the replica's output there)")


@pytest.mark.task4_2
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU to see chunks move to their device")
def test_scatter_moves_chunks_to_their_devices(replicas):
    chunks = replicas.scatter(torch.zeros(6, 2), torch.zeros(6), ["cpu", "cuda:0", "cpu"])
    assert [x.device.type for x, _ in chunks] == ["cpu", "cuda", "cpu"], f"{WHERE['4.2']}: chunk i goes to devices[i]"
    assert [y.device.type for _, y in chunks] == ["cpu", "cuda", "cpu"], f"{WHERE['4.2']}: labels go with their images"


# --- Task 4.3 ------------------------------------------------------------------------------------

def reduce_checked(replicas, master, copies, chunk_sizes, what):
    """Call reduce_gradients, naming the cause of the errors whose cause the call proves."""
    try:
        replicas.reduce_gradients(master, copies, chunk_sizes)
    except RuntimeError as error:
        # PyTorch's words (older, newer) for a .grad of another dtype than its parameter's
        if not any(words in str(error) for words in ("assigned grad has data of a different type",
                                                      "to a tensor with grad_dtype")):
            raise
        raise AssertionError(
            f"{WHERE['4.3']}: {what}: the master's parameters are {master.linear.weight.dtype} and the .grad "
            f"given to one is not: build the average in the gradients' own dtype (sum(...), or "
            "torch.zeros_like(param); torch.zeros(param.shape) is float32)") from error


def expect_reduced(master, grads, chunk_sizes, what, stale=None):
    """The master's .grad against the weighted mean of `grads` (name -> the replicas' gradients, cloned
    before the call); `stale` is the .grad the master held before, if any."""
    total = sum(chunk_sizes)
    for name, param in master.named_parameters():
        if grads[name][0] is None:
            assert param.grad is None, (
                f"{WHERE['4.3']}: {what}: {name} has no .grad on the replicas (frozen, or unused in the forward), "
                f"so the master's .grad must stay None, not be set")
            continue
        assert param.grad is not None, (
            f"{WHERE['4.3']}: {what}: the master's {name}.grad is None, though the replicas have gradients: set "
            "it" + (" (the master has no .grad before the first step: a frozen parameter is one whose "
                    "REPLICAS have no .grad)" if stale is None else ""))
        assert param.grad.dtype == param.dtype, (
            f"{WHERE['4.3']}: {what}: the master's {name}.grad is {param.grad.dtype}, its parameter {param.dtype}")
        expected = sum(g * (n / total) for g, n in zip(grads[name], chunk_sizes))
        tolerance = 1e-12 if param.dtype == torch.float64 else 1e-6
        if torch.allclose(param.grad, expected, rtol=tolerance, atol=tolerance):
            assert param.grad.device.type == "cpu", f"{WHERE['4.3']}: the master's gradients belong on the CPU"
            continue
        plain_mean, plain_sum = sum(grads[name]) / len(grads[name]), sum(grads[name])
        ratio = param.grad[expected.abs() > 1e-3] / expected[expected.abs() > 1e-3]
        factor = ratio.mean().item() if ratio.numel() else float("nan")
        scaled = ratio.numel() > 0 and torch.allclose(param.grad, expected * factor, rtol=1e-5, atol=1e-6)
        weighted = [g * (n / total) for g, n in zip(grads[name], chunk_sizes)]
        first = next((k for k in range(1, len(weighted)) if torch.allclose(param.grad, sum(weighted[:k]), atol=1e-6)), None)
        why = ("it is the average ADDED to the .grad the master held before (that of the last step: train_step "
               "never zeroes the master's gradients): set .grad to the average, do not accumulate into it"
               if stale is not None and torch.allclose(param.grad, stale[name] + expected, atol=1e-6) else
               "it is all zeros, though the replicas' are not: weight replica i by the fraction n_i / n (integer "
               "division, n_i // n, gives 0)" if not param.grad.any() else
               "it is the plain mean: weight each replica's gradient by its share of the batch, "
               "n_i / n, because chunks of different lengths count differently in the batch's mean loss"
               if torch.allclose(param.grad, plain_mean, atol=1e-6) else
               "it is the sum: divide, weighting replica i by n_i / n" if torch.allclose(param.grad, plain_sum, atol=1e-6)
               else f"it is the weighted sum over the first {first} of the {len(chunk_sizes)} replicas only: sum over "
               "every replica in `replicas`" if first is not None
               else f"it is the weighted mean divided again by the number of replicas ({len(chunk_sizes)}): the "
               "weights n_i / n already sum to 1" if scaled and abs(factor * len(chunk_sizes) - 1) < 1e-4
               else f"it is the weighted mean times {factor:.4g}: the weights n_i / n must sum to 1 (n = "
               f"sum(chunk_sizes) = {total})" if scaled and abs(factor - 1) > 1e-4
               else f"it is the weighted mean rounded to float32 (each of its values is a float32 number), though "
               f"the gradients are {param.dtype}: build the average in the gradients' own dtype (sum(...), or "
               "torch.zeros_like(param); torch.zeros(param.shape) is float32)"
               if param.dtype == torch.float64 and torch.equal(param.grad, param.grad.float().to(param.dtype))
               else "expected sum over replicas of (n_i / n) * grad_i, largest difference "
               f"{(param.grad - expected).abs().max().item():.3g}")
        raise AssertionError(f"{WHERE['4.3']}: {what}: the master's {name}.grad is wrong: {why}")


@pytest.mark.task4_3
@pytest.mark.parametrize("chunk_sizes,dtype", [([4, 4], torch.float32), ([3, 3, 2], torch.float32),
                                               ([5, 1, 1, 1], torch.float32), ([3, 3, 2], torch.float64)])
def test_reduce_gradients_is_the_weighted_mean(replicas, chunk_sizes, dtype):
    torch.manual_seed(0)
    master = Awkward().to(dtype)
    copies = [copy.deepcopy(master) for _ in chunk_sizes]  # our own copies: independent of Task 4.1
    for i, replica in enumerate(copies):
        for param in replica.parameters():
            if param.requires_grad:
                param.grad = torch.randn(param.shape, generator=torch.Generator().manual_seed(i), dtype=dtype)
    grads = {name: [None if p.grad is None else p.grad.clone() for p in
                    (dict(r.named_parameters())[name] for r in copies)] for name, _ in master.named_parameters()}
    what = f"chunks of {chunk_sizes}" + (f", {dtype}" if dtype != torch.float32 else "")
    for step in ("first", "second"):
        stale = None
        if step == "second":  # the last step's gradients: train_step never zeroes the master's
            for param in master.parameters():
                if param.requires_grad:
                    param.grad = torch.full_like(param, 100.0)
            stale = {name: param.grad.clone() for name, param in master.named_parameters() if param.grad is not None}
        for i, replica in enumerate(copies):  # every step's backward gives the replicas their gradients anew
            for name, param in replica.named_parameters():
                param.grad = None if grads[name][i] is None else grads[name][i].clone()
        reduce_checked(replicas, master, copies, chunk_sizes, f"{what}, {step} step")
        for i, replica in enumerate(copies):
            for name, param in replica.named_parameters():
                if grads[name][i] is not None and param.grad is not None:  # freed (None) once read is fine
                    assert torch.equal(param.grad, grads[name][i]), (
                        f"{WHERE['4.3']}: {what}: reduce_gradients changed replica {i}'s {name}.grad in place: read "
                        "the replicas' gradients, never write them (on the CPU, .cpu() returns the tensor itself, "
                        "not a copy)")
        expect_reduced(master, grads, chunk_sizes, f"{what}, {step} step", stale)


@pytest.mark.task4_3
def test_reduce_gradients_skips_unused_parameters(replicas):
    """A parameter that requires grad but that the forward did not use has no .grad on the replicas either."""
    torch.manual_seed(0)
    master = Awkward()
    copies = [copy.deepcopy(master) for _ in range(3)]
    for i, replica in enumerate(copies):
        for name, param in replica.named_parameters():
            if param.requires_grad and name != "linear.bias":
                param.grad = torch.randn(param.shape, generator=torch.Generator().manual_seed(i))
    grads = {name: [dict(r.named_parameters())[name].grad for r in copies] for name, _ in master.named_parameters()}
    grads = {name: [None if g is None else g.clone() for g in gs] for name, gs in grads.items()}
    what = "linear.bias unused (requires_grad=True, .grad None on every replica)"
    try:
        replicas.reduce_gradients(master, copies, [3, 3, 2])
    except (AttributeError, TypeError) as error:
        if "NoneType" not in str(error):
            raise
        raise AssertionError(
            f"{WHERE['4.3']}: {what}: reduce_gradients raised {type(error).__name__}: {error}: skip every "
            "parameter whose replicas have no .grad, not only the frozen ones (requires_grad=False): a "
            "forward may leave a parameter unused") from error
    expect_reduced(master, grads, [3, 3, 2], what)


# --- Task 4.4 ------------------------------------------------------------------------------------

@pytest.mark.task4_4
def test_copy_weights_overwrites_every_replica_in_place(replicas):
    torch.manual_seed(0)
    master = Awkward()
    copies = [Awkward(), Awkward()]  # our own replicas, with other weights
    for replica in copies:  # and other buffers: a copy of the parameters alone must not pass
        replica.scale.fill_(9.0)
    pointers = [[t.data_ptr() for t in tensors(r)] for r in copies]
    before = [t.clone() for t in tensors(master)]
    try:
        replicas.copy_weights(master, copies)
    except RuntimeError as error:  # copy_'s words for a source that does not broadcast to the target
        if not any(words in str(error) for words in ("must match the size", "doesn't match the broadcast shape")):
            raise
        raise AssertionError(
            f"{WHERE['4.4']}: copy_weights raised RuntimeError: {error}: a replica's tensor was paired with a "
            "master's tensor of another shape: pair them the same way on both sides (parameters() then "
            "buffers() on both, state_dict() on both, or by name): a state_dict lists a module's own buffers "
            "before its submodules' parameters") from error
    assert all(torch.equal(a, b) for a, b in zip(tensors(master), before)), (
        f"{WHERE['4.4']}: copy_weights changed the master's weights: it only reads them, and writes into the "
        "replicas: replica_tensor.copy_(master_tensor)")
    updated = [[torch.equal(mine, theirs) for mine, theirs in zip(tensors(r), tensors(master))] for r in copies]
    for i, flags in enumerate(updated):
        earlier = [j for j in range(i) if any(updated[j])]
        later = [j for j in range(i + 1, len(updated)) if any(updated[j])]
        assert any(flags), (
            f"{WHERE['4.4']}: replica {i} holds none of the master's values after copy_weights"
            + (f", though replica {earlier[0]} before it does: copy into every replica; if the master's tensors "
               "come from an iterator (itertools.chain, a generator, zip), the first replica used it up: make a list"
               if earlier else
               f", though replica {later[0]} after it does: copy into every replica, replica 0 too (the master "
               "is the CPU model, not replica 0)" if later else ": copy into every replica"))
    names = [name for name, _ in master.named_parameters()] + [name for name, _ in master.named_buffers()]
    for i, replica in enumerate(copies):
        for name, (mine, theirs) in enumerate(zip(tensors(replica), tensors(master))):
            kind = "parameter" if name < len(list(replica.parameters())) else "buffer"
            frozen = kind == "parameter" and not theirs.requires_grad
            assert torch.equal(mine, theirs), (
                f"{WHERE['4.4']}: replica {i}'s {kind} {names[name]} does not hold the master's values: "
                + ("copy every parameter, the frozen ones too (requires_grad=False): the docstring asks for all "
                   "the master's parameters and buffers" if frozen else
                   "copy the parameters and the buffers both (model.buffers(): BatchNorm's running statistics "
                   "are buffers)"))
            assert mine.data_ptr() != theirs.data_ptr(), (
                f"{WHERE['4.4']}: replica {i}'s {kind} {names[name]} now shares the master's memory: copy_ the "
                "values into the replica's own tensors, which stay on its device (`.data = `, set_() and "
                "load_state_dict(..., assign=True) all hand the replica the master's tensors)")
            assert mine.data_ptr() == pointers[i][name], (
                f"{WHERE['4.4']}: replica {i}'s tensor {name} is not the one the replica held before (new memory): "
                "copy_ the values into the replica's own tensors, in place; a replica made anew (or a new "
                "Parameter) costs an allocation every step and leaves whoever holds the old tensors behind")
        assert all(p.grad_fn is None for p in replica.parameters()), (
            f"{WHERE['4.4']}: autograd recorded the copy: do it under torch.no_grad()")


def train_like_one_device(replicas, devices, batch_size, steps=3, lr=0.1):
    """Per-step losses and final weights: replicas on `devices`, and one CPU model on the whole batch."""
    torch.manual_seed(0)
    master = CNN()
    single = copy.deepcopy(master)
    copies = replicas.replicate(master, devices)
    optimizer = torch.optim.SGD(master.parameters(), lr=lr, momentum=0.9)
    single_optimizer = torch.optim.SGD(single.parameters(), lr=lr, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    losses, single_losses = [], []
    for _ in range(steps):
        images, labels = torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g)
        losses.append(replicas.train_step(master, copies, optimizer, images, labels, devices))
        single_optimizer.zero_grad()
        loss = F.cross_entropy(single(images), labels)
        loss.backward()
        single_optimizer.step()
        single_losses.append(loss.item())
    return master, single, copies, losses, single_losses


@pytest.mark.task4_4
@pytest.mark.parametrize("num_devices,batch_size", [(2, 8), (3, 10), (4, 6)])
def test_replicas_train_like_one_device_on_the_whole_batch(replicas, num_devices, batch_size, monkeypatch):
    use_reference(monkeypatch, replicas, "replicate", "scatter", "reduce_gradients")
    devices = ["cpu"] * num_devices
    master, single, copies, losses, single_losses = train_like_one_device(replicas, devices, batch_size)
    assert losses == pytest.approx(single_losses, rel=1e-5), (
        f"{WHERE['4.4']}: {num_devices} replicas, batch {batch_size}: losses {losses} differ from "
        f"one device's {single_losses} on the whole batch (with solutions/'s replicate, scatter and "
        "reduce_gradients): from the second step on, the replicas need the master's new weights")
    for (name, mine), theirs in zip(master.named_parameters(), single.parameters()):
        assert torch.allclose(mine, theirs, rtol=1e-4, atol=1e-6), (
            f"{WHERE['4.4']}: after 3 steps the master's {name} differs from one device's by "
            f"{(mine - theirs).abs().max().item():.2e}")
    for i, replica in enumerate(copies):
        assert all(torch.equal(a.cpu(), b) for a, b in zip(replica.parameters(), master.parameters())), (
            f"{WHERE['4.4']}: after a step replica {i} does not hold the master's new weights")


@pytest.mark.task4_4
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason=f"nn.DataParallel needs 2 or more GPUs; {torch.cuda.device_count()} visible")
def test_replicas_match_nn_data_parallel(replicas, monkeypatch):
    use_reference(monkeypatch, replicas, "replicate", "scatter", "reduce_gradients")
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    batch_size = 8 * len(devices)  # even chunks: DataParallel's scatter and ours then agree exactly
    torch.manual_seed(0)
    master = CNN()
    dp = nn.DataParallel(copy.deepcopy(master).to(devices[0]), device_ids=devices)
    copies = replicas.replicate(master, devices)
    optimizer = torch.optim.SGD(master.parameters(), lr=0.1, momentum=0.9)
    dp_optimizer = torch.optim.SGD(dp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        images, labels = torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g)
        loss = replicas.train_step(master, copies, optimizer, images, labels, devices)
        dp_optimizer.zero_grad()
        dp_loss = F.cross_entropy(dp(images.to(devices[0])), labels.to(devices[0]))
        dp_loss.backward()
        dp_optimizer.step()
        # GPU convolutions may use TF32 and other kernels than the CPU: compare loosely
        assert loss == pytest.approx(dp_loss.item(), rel=1e-3), (
            f"Task 4 (template_replicas.py): step {step + 1}: loss {loss} but nn.DataParallel's {dp_loss.item()}")
    for (name, mine), theirs in zip(master.named_parameters(), dp.module.parameters()):
        assert torch.allclose(mine, theirs.cpu(), rtol=1e-2, atol=1e-4), (
            f"Task 4 (template_replicas.py): {name} differs from nn.DataParallel's by "
            f"{(mine - theirs.cpu()).abs().max().item():.2e}")
