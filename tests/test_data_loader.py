"""Task 1: the distributed sampler and the loaders (template_data_loader.py).

    pytest --impl template -m task1_1      # one task; see conftest.py

The expected values come from independent references: torch.randperm, plain slicing,
torch.tensor_split and PyTorch's own DistributedSampler.
"""
import math

import pytest
import torch
from torch.utils.data import DistributedSampler as TorchSampler
from torch.utils.data import TensorDataset

from conftest import load
from harness import run_ranks

T11 = "Task 1.1 (template_data_loader.py, ordered_indices)"
T12 = "Task 1.2 (template_data_loader.py, pad_or_drop)"
T13 = "Task 1.3 (template_data_loader.py, shard)"
T14 = "Task 1.4 (template_data_loader.py, build_loaders)"

SIZES = [0, 1, 2, 3, 5, 7, 10, 16, 31, 100]
WORLD_SIZES = [1, 2, 3, 4, 5, 8]


def use_reference(monkeypatch, data_loader, *names):
    """Swap in solutions/'s answers to the earlier tasks, so that a test judges one task alone:
    a mistake in Task 1.1 fails Task 1.1's tests, not those of every task built on it."""
    reference = load("solutions", "template_data_loader")
    for name in names:
        monkeypatch.setattr(data_loader, name, getattr(reference, name))


def randperm(n, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g).tolist()


# --------------------------------------------------------------------------- Task 1.1
@pytest.mark.task1_1
def test_order_without_shuffle(data_loader):
    for n in SIZES:
        got = data_loader.ordered_indices(n, shuffle=False, seed=0, epoch=3)
        assert got == list(range(n)), f"{T11}: without shuffle the order is list(range({n})), got {got}"


@pytest.mark.task1_1
def test_shuffle_is_randperm_seeded_with_seed_plus_epoch(data_loader):
    global_rng = torch.get_rng_state()
    for n in [1, 10, 100, 1000]:
        for seed, epoch in [(0, 0), (0, 1), (7, 0), (7, 5)]:
            got = data_loader.ordered_indices(n, shuffle=True, seed=seed, epoch=epoch)
            assert isinstance(got, list), f"{T11}: return a list of ints (use .tolist()), got {type(got).__name__}"
            other = next((i for i in got if type(i) is not int), None)
            assert other is None, (
                f"{T11}: it returned a list of {type(other).__module__}.{type(other).__name__}, not of Python ints"
                + (" (list(tensor) gives 0-dim tensors; tensor.tolist() gives ints)" if isinstance(other, torch.Tensor)
                   else "") + ": the sampler's indices must be ints, as PyTorch's are: a 0-dim tensor hashes by "
                "identity (in a set or as a dict key two equal indices count as two), and every index is a "
                "tensor object of its own")
            if got != randperm(n, seed + epoch) and n > 1:
                again = data_loader.ordered_indices(n, shuffle=True, seed=seed, epoch=epoch)
                if got != again:
                    fresh = [data_loader.ordered_indices(50, shuffle=True, seed=12345, epoch=0) for _ in range(2)]
                    kept = fresh[0] == randperm(50, 12345) and fresh[1] != fresh[0]
                    assert not kept, (
                        f"{T11}: two calls with seed={seed} epoch={epoch} gave different orders, and a seed never "
                        "used before (12345) gave the right order on its first call and another on its second: "
                        "a generator is kept between calls and drawn from again, so the order depends on how "
                        "often ordered_indices was called before, the ranks' shards overlap and a resumed run "
                        "differs: make a new torch.Generator, seeded with seed + epoch, on every call")
                assert got == again, (
                    f"{T11}: two calls with seed={seed} epoch={epoch} gave different orders: the shuffle is not "
                    "seeded, so every rank draws its own permutation and the ranks' shards overlap (some samples "
                    "trained on twice, others never): shuffle with a torch.Generator seeded with seed + epoch")
                assert epoch == 0 or got != randperm(n, seed), (
                    f"{T11}: seed={seed} epoch={epoch} gave the order of epoch 0: the epoch is left out of the "
                    "seed, so every epoch visits the data in the same order; seed the generator with seed + epoch")
            assert got == randperm(n, seed + epoch), (
                f"{T11}: with shuffle, n={n} seed={seed} epoch={epoch} must give "
                f"torch.randperm(n, generator=g).tolist() with g.manual_seed(seed + epoch), exactly as "
                f"PyTorch's DistributedSampler does; got {got[:8]}...")
    assert torch.equal(torch.get_rng_state(), global_rng), (
        f"{T11}: ordered_indices changed PyTorch's global random state (torch.manual_seed?): seed a "
        "torch.Generator of your own, or every epoch resets the randomness of the whole program")


@pytest.mark.task1_1
def test_each_epoch_shuffles_differently(data_loader):
    orders = [tuple(data_loader.ordered_indices(50, shuffle=True, seed=0, epoch=e)) for e in range(4)]
    assert len(set(orders)) == 4, (
        f"{T11}: epochs 0-3 gave {len(set(orders))} different orders: the epoch must be part of the seed "
        "(seed + epoch), or every epoch sees the data in the same order")


def _orders_on_rank(rank, world_size, impl):
    data_loader = load(impl, "template_data_loader")
    return [data_loader.ordered_indices(40, shuffle=True, seed=3, epoch=e) for e in range(2)]


@pytest.mark.task1_1
def test_every_rank_gets_the_same_order(impl):
    orders = run_ranks(_orders_on_rank, 3, impl)
    for rank in (1, 2):
        assert orders[rank] == orders[0], (
            f"{T11}: rank {rank}'s order differs from rank 0's; every rank must compute the same order "
            "(seed it with seed + epoch only, never the rank), or the shards overlap")


# --------------------------------------------------------------------------- Task 1.2
@pytest.mark.task1_2
def test_padding_wraps_around_to_a_multiple(data_loader):
    for n in SIZES[1:]:
        indices = randperm(n, n)
        for world_size in WORLD_SIZES:
            original = list(indices)
            got = data_loader.pad_or_drop(indices, world_size, drop_last=False)
            total = math.ceil(n / world_size) * world_size
            assert indices == original, f"{T12}: do not change the list you are given; return a new one"
            assert got is not indices, (
                f"{T12}: {n} indices on {world_size} ranks, nothing to add: it returned the very list it was given, "
                "not a new one: whoever changes the result (appends, shuffles) then changes the caller's list too; "
                "return list(indices)")
            assert not (n % world_size == 0 and len(got) == n + world_size), (
                f"{T12}: {n} indices on {world_size} ranks are already a multiple of {world_size}, so nothing is "
                f"to be added, but you returned {len(got)}: a whole round of {world_size} more. The padding is "
                f"-len(indices) % num_replicas, which is 0 here; num_replicas - len(indices) % num_replicas is "
                f"{world_size}")
            assert len(got) == total, (
                f"{T12}: {n} indices on {world_size} ranks must be padded to {total}, the next multiple "
                f"of {world_size}, wrapping around the list as often as needed; got {len(got)}")
            expected = [indices[i % n] for i in range(total)]
            assert got == expected, (
                f"{T12}: pad with indices from the front of the list and wrap around as often as "
                f"needed: {n} indices on {world_size} ranks should give {expected}, got {got}")


@pytest.mark.task1_2
def test_drop_last_cuts_the_tail(data_loader):
    for n in SIZES:
        indices = randperm(n, n)
        for world_size in WORLD_SIZES:
            got = data_loader.pad_or_drop(indices, world_size, drop_last=True)
            expected = indices[: n - n % world_size]
            assert not (got == [] and n % world_size == 0 and n > 0), (
                f"{T12}: drop_last=True with {n} indices on {world_size} ranks: {n} is already a multiple of "
                f"{world_size}, so nothing is cut, but you returned an empty list. Slicing with "
                "indices[:-(len(indices) % num_replicas)] does that: when the remainder is 0 it is "
                "indices[:-0], which is indices[:0]; cut with indices[:len(indices) - remainder]")
            assert got == expected, (
                f"{T12}: drop_last=True keeps the first {len(expected)} of {n} indices (the largest multiple "
                f"of {world_size}); got {len(got)}")


@pytest.mark.task1_2
def test_padding_the_seeds_example(data_loader):
    got = data_loader.pad_or_drop(list(range(10)), 4, drop_last=False)
    assert got == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1], f"{T12}: 10 indices on 4 ranks, got {got}"
    got = data_loader.pad_or_drop([7, 3], 5, drop_last=False)
    assert got == [7, 3, 7, 3, 7], f"{T12}: 2 indices on 5 ranks must wrap around twice: [7, 3, 7, 3, 7], got {got}"


# --------------------------------------------------------------------------- Task 1.3
@pytest.mark.task1_3
def test_shard_of_the_seeds_example(data_loader):
    padded = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    expected = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1]]
    got = [data_loader.shard(padded, 4, rank) for rank in range(4)]
    assert all(isinstance(g, list) for g in got), (
        f"{T13}: return a Python list (a slice of the list you are given), got {type(got[0]).__name__}")
    assert got == expected, (
        f"{T13}: rank r takes the r-th contiguous block, positions [r*m, (r+1)*m): expected {expected}, got {got} "
        "(every rank the same shard? the rank is ignored; indices[rank::n]? that is PyTorch's strided split, "
        "here each rank takes a contiguous block)")


@pytest.mark.task1_3
def test_shards_are_contiguous_blocks(data_loader):
    for n in SIZES:
        indices = randperm(n, 1)
        for world_size in WORLD_SIZES:
            expected = [block.tolist() for block in torch.tensor_split(torch.tensor(indices, dtype=torch.long), world_size)]
            got = [data_loader.shard(indices, world_size, rank) for rank in range(world_size)]
            size = math.ceil(n / world_size)
            ceil_blocks = [indices[r * size:(r + 1) * size] for r in range(world_size)]
            assert got == expected or got != ceil_blocks, (
                f"{T13}: {n} indices on {world_size} ranks gave blocks of {[len(g) for g in got]}: blocks of "
                f"ceil(n / N) = {size} leave the last ranks fewer, or none; the lengths must differ by at most "
                f"one, the first {n % world_size} ranks taking one more: {[len(e) for e in expected]}, as "
                "torch.tensor_split gives")
            assert got == expected, (
                f"{T13}: {n} indices on {world_size} ranks: each rank takes one contiguous block, the first "
                f"{n % world_size} ranks one more than the others (as torch.tensor_split); expected {expected}, got {got}")


# ------------------------------- the whole sampler, with solutions/'s Tasks 1.1 and 1.2
def _torch_padded_order(n, world_size, shuffle, seed, epoch, drop_last):
    """PyTorch's sampler hands out indices[rank::world_size]: undo that to get its padded order."""
    per_rank = []
    for rank in range(world_size):
        sampler = TorchSampler(range(n), world_size, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        per_rank.append(list(sampler))
    return [per_rank[i % world_size][i // world_size] for i in range(sum(map(len, per_rank)))]


@pytest.mark.task1_3
def test_sampler_agrees_with_pytorch(data_loader, monkeypatch):
    use_reference(monkeypatch, data_loader, "ordered_indices", "pad_or_drop")
    for n in [1, 2, 5, 10, 37, 100]:
        for world_size in [1, 2, 3, 4, 7]:
            for shuffle, seed, epoch, drop_last in [(False, 0, 0, False), (True, 0, 0, False), (True, 5, 3, False),
                                                    (True, 1, 2, True), (False, 0, 1, True)]:
                if drop_last and n < world_size:
                    continue  # PyTorch's sampler then gives every rank nothing, as ours does
                shards = []
                for rank in range(world_size):
                    sampler = data_loader.DistributedSampler(range(n), world_size, rank, shuffle=shuffle,
                                                             seed=seed, drop_last=drop_last)
                    sampler.set_epoch(epoch)
                    shards.append(list(sampler))
                    assert len(sampler) == len(shards[-1]), "len(sampler) must equal the number of indices it yields"
                ours = [i for s in shards for i in s]
                theirs = _torch_padded_order(n, world_size, shuffle, seed, epoch, drop_last)
                assert ours == theirs, (
                    f"{T13}: n={n} world_size={world_size} shuffle={shuffle} seed={seed} epoch={epoch} "
                    f"drop_last={drop_last}: the ranks' shards, joined in rank order, must be PyTorch's "
                    f"padded order {theirs}, got {ours}")
                assert len({len(s) for s in shards}) == 1, f"{T13}: every rank must get as many indices"


@pytest.mark.task1_3
def test_unpadded_sampler_visits_every_sample_once(data_loader, monkeypatch):
    use_reference(monkeypatch, data_loader, "ordered_indices", "pad_or_drop")
    for n in SIZES:
        for world_size in WORLD_SIZES:
            shards = [list(data_loader.DistributedSampler(range(n), world_size, rank, shuffle=True, seed=2, pad=False))
                      for rank in range(world_size)]
            joined = sorted(i for s in shards for i in s)
            assert joined == list(range(n)), (
                f"{T13}: pad=False: {n} samples on {world_size} ranks must be visited exactly once "
                f"over all ranks, got {joined}")
            lengths = [len(s) for s in shards]
            assert max(lengths) - min(lengths) <= 1, f"{T13}: pad=False: shard lengths differ by more than one: {lengths}"


@pytest.mark.task1_3
def test_global_batch_layout_gives_every_step_the_same_batch_on_any_number_of_ranks(data_loader, monkeypatch):
    use_reference(monkeypatch, data_loader, "ordered_indices", "pad_or_drop")
    for n, global_batch in [(40, 8), (37, 8), (12, 12), (5, 4)]:
        for world_size in [1, 2, 4]:
            per_rank = global_batch // world_size
            shards = []
            for rank in range(world_size):
                sampler = data_loader.DistributedSampler(range(n), world_size, rank, shuffle=True, seed=3,
                                                         drop_last=True, global_batch_size=global_batch)
                sampler.set_epoch(2)
                shards.append(list(sampler))
            steps = n // global_batch
            # step k over all ranks, in rank order, against the k-th block of torch.randperm's order
            got = [[i for s in shards for i in s[k * per_rank:(k + 1) * per_rank]] for k in range(steps)]
            order = randperm(n, 3 + 2)
            expected = [order[k * global_batch:(k + 1) * global_batch] for k in range(steps)]
            assert got == expected, (
                f"{T13}: with global_batch_size={global_batch}, {n} samples on {world_size} ranks: rank r takes "
                f"the r-th block of every global batch (shard() of each run of {global_batch} indices); the "
                f"steps' global batches should be {expected}, got {got}")


def _default_sampler(rank, world_size, impl):
    data_loader = load(impl, "template_data_loader")
    sampler = data_loader.DistributedSampler(range(10), shuffle=False)
    return sampler.num_replicas, sampler.rank, list(sampler)


@pytest.mark.task1_3
def test_sampler_defaults_to_the_process_group(impl):
    results = run_ranks(_default_sampler, 2, impl)
    assert results == [(2, 0, [0, 1, 2, 3, 4]), (2, 1, [5, 6, 7, 8, 9])], results


def test_sampler_rejects_bad_arguments(data_loader):
    for kwargs in [dict(num_replicas=0, rank=0), dict(num_replicas=2, rank=2), dict(num_replicas=2, rank=-1)]:
        with pytest.raises(ValueError):
            data_loader.DistributedSampler(range(10), **kwargs)


# --------------------------------------------------------------------------- Task 1.4
def _indexed(n):
    """A data set whose samples are their own indices, so the loaders' output can be checked."""
    return TensorDataset(torch.arange(n), torch.arange(n) % 10)


def _loaders_of_every_rank(data_loader, world_size, global_batch, n_train=20, n_test=10, epoch=0, seed=1):
    ranks = []
    for rank in range(world_size):
        try:
            train, test = data_loader.build_loaders(_indexed(n_train), _indexed(n_test), global_batch, rank,
                                                    world_size, seed=seed)
        except ValueError as error:
            if f"global_batch_size must be a positive multiple of num_replicas ({world_size}), got " \
                    f"{global_batch // world_size}" not in str(error):
                raise
            raise AssertionError(
                f"{T14}: with a global batch of {global_batch} on {world_size} ranks, build_loaders gave the training "
                f"sampler global_batch_size={global_batch // world_size}, the per-rank batch, and the sampler "
                f"refused it ({error}): the sampler cuts every run of global_batch_size indices into the ranks' "
                "shares itself; pass it global_batch_size=global_batch_size, and the DataLoader the per-rank "
                "batch_size") from error
        train.sampler.set_epoch(epoch)
        ranks.append(([b[0].tolist() for b in train], [b[0].tolist() for b in test]))
    return ranks


@pytest.mark.task1_4
def test_each_rank_loads_its_share_of_the_global_batch(data_loader, monkeypatch):
    use_reference(monkeypatch, data_loader, "ordered_indices", "pad_or_drop", "shard")
    for world_size in [1, 2, 3]:
        ranks = _loaders_of_every_rank(data_loader, world_size, global_batch=6)
        for rank, (train_batches, _) in enumerate(ranks):
            sizes = {len(b) for b in train_batches}
            full = 6 // world_size
            assert not ({len(b) for b in train_batches[:-1]} == {full} and 0 < len(train_batches[-1]) < full), (
                f"{T14}: with a global batch of 6 on {world_size} ranks, rank {rank}'s last training batch holds "
                f"{len(train_batches[-1])} samples, the others {full}: the sampler leaves a tail that does not fill "
                "a global batch, and the training DataLoader must drop it (drop_last=True in the DataLoader too), "
                "or the last step trains on a smaller, differently weighted batch")
            assert sizes == {6 // world_size}, (
                f"{T14}: with a global batch of 6 on {world_size} ranks, every training batch of a rank "
                f"holds 6 // {world_size} = {6 // world_size} samples (drop_last=True); rank {rank} got sizes {sizes}")
        counts = [len(train) for train, _ in ranks]
        assert len(set(counts)) == 1, f"{T14}: every rank needs as many training steps, got {counts}"
        seeds = [getattr(data_loader.build_loaders(_indexed(20), _indexed(10), 6, rank, world_size, seed=1)[0].sampler,
                         "seed", None) for rank in range(world_size)]
        assert len(set(seeds)) == 1, (
            f"{T14}: build_loaders(..., seed=1) on {world_size} ranks gave the training samplers the seeds {seeds}: "
            "every rank must shuffle with the same seed, or each draws its own order and their shards overlap "
            "(some samples trained on twice an epoch, others never); pass seed=seed, the same on every rank")
        seen = {i for train, _ in ranks for batch in train for i in batch}
        assert len(seen) >= 18, f"{T14}: the ranks together should cover the training set, saw {sorted(seen)}"


@pytest.mark.task1_4
def test_every_step_trains_on_the_same_global_batch_on_any_number_of_ranks(data_loader, monkeypatch):
    """Data parallelism is single-process training on the global batch only if the global
    batches do not depend on the number of ranks."""
    use_reference(monkeypatch, data_loader, "ordered_indices", "pad_or_drop", "shard")
    n, global_batch, seed, epoch = 37, 8, 1, 3
    order = randperm(n, seed + epoch)  # the epoch's order, as PyTorch's DistributedSampler makes it
    expected = [order[k * global_batch:(k + 1) * global_batch] for k in range(n // global_batch)]
    for world_size in [1, 2, 4]:
        ranks = _loaders_of_every_rank(data_loader, world_size, global_batch, n_train=n, epoch=epoch, seed=seed)
        steps = {len(train) for train, _ in ranks}
        assert steps == {len(expected)}, (
            f"{T14}: {n} samples in global batches of {global_batch} make {len(expected)} full steps on any number "
            f"of ranks, but {world_size} ranks took {sorted(steps)}: the tail that does not fill a global batch is "
            "left out (drop_last=True in the training sampler: padding adds a step on some numbers of ranks)")
        got = [[i for train, _ in ranks for i in train[k]] for k in range(len(expected))]
        assert got == expected, (
            f"{T14}: on {world_size} rank{'s' if world_size > 1 else ''}, step k must train on positions [k*{global_batch}, (k+1)*{global_batch}) "
            f"of the epoch's order, as on one rank: {expected[:2]}..., got {got[:2]}... Give the training sampler "
            "global_batch_size=global_batch_size, so each rank takes its slice of every global batch rather than "
            "a block of the whole epoch")


@pytest.mark.task1_4
def test_training_shuffles_per_epoch(data_loader, monkeypatch):
    use_reference(monkeypatch, data_loader, "ordered_indices", "pad_or_drop", "shard")
    first = _loaders_of_every_rank(data_loader, 2, global_batch=4, epoch=0)
    second = _loaders_of_every_rank(data_loader, 2, global_batch=4, epoch=1)
    assert first[0][0] != second[0][0], f"{T14}: the training sampler must shuffle (shuffle=True), and use set_epoch"
    other_seed = _loaders_of_every_rank(data_loader, 2, global_batch=4, epoch=0, seed=2)
    assert first[0][0] != other_seed[0][0], f"{T14}: pass the seed on to the training sampler: --seed must change the order"


@pytest.mark.task1_4
def test_every_test_image_is_evaluated_exactly_once(data_loader, monkeypatch):
    use_reference(monkeypatch, data_loader, "ordered_indices", "pad_or_drop", "shard")
    _, test = data_loader.build_loaders(_indexed(12), _indexed(10), 12, 1, 3)
    assert not test.drop_last, (
        f"{T14}: the test DataLoader has drop_last=True: each rank's last, smaller test batch is never evaluated; "
        "evaluation keeps every image (drop_last only in the training loader)")
    for world_size in [1, 2, 3, 4]:
        ranks = _loaders_of_every_rank(data_loader, world_size, global_batch=12, n_test=10)
        evaluated = sorted(i for _, test in ranks for batch in test for i in batch)
        missing = sorted(set(range(10)) - set(evaluated))
        assert not missing or len(evaluated) > len(set(evaluated)), (
            f"{T14}: over {world_size} ranks test images {missing} are never evaluated, got {evaluated}: the test "
            "sampler or loader leaves some out (drop_last?); every test image is evaluated exactly once")
        assert evaluated == list(range(10)), (
            f"{T14}: over {world_size} ranks the 10 test images must be evaluated exactly once each; got {evaluated}. "
            "A padded test sampler counts some images twice: use pad=False for evaluation")
        in_order = [i for _, test in ranks for batch in test for i in batch]
        assert in_order == list(range(10)), (
            f"{T14}: over {world_size} ranks, the test images in rank order are {in_order}, not 0-9: "
            + ("some rank's test images are not in order: the test sampler shuffles; " if any(
                i >= j for _, test in ranks for b in [[i for batch in test for i in batch]] for i, j in zip(b, b[1:]))
               else "") + "evaluation uses an unshuffled sampler (shuffle=False), so that rank r evaluates the "
            "r-th contiguous block of the test set, the same images every epoch")


@pytest.mark.task1_4
def test_loaders_take_the_per_rank_batch_workers_and_pin_memory_as_given(data_loader, monkeypatch):
    """The loaders' settings, read without iterating them: no worker process is started."""
    use_reference(monkeypatch, data_loader, "ordered_indices", "pad_or_drop", "shard")
    train, test = data_loader.build_loaders(_indexed(24), _indexed(10), 12, 1, 3, num_workers=2, device="cpu")
    assert test.batch_size == 12 // 3, (
        f"{T14}: with a global batch of 12 on 3 ranks the test loader's batch_size is {test.batch_size}; evaluation "
        "uses the same per-rank batch size as training, global_batch_size // world_size = 4 (a rank holding "
        "global_batch_size images at once needs world_size times the memory)")
    for name, loader in [("train", train), ("test", test)]:
        assert loader.num_workers == 2, (
            f"{T14}: build_loaders(..., num_workers=2) gave the {name} loader num_workers={loader.num_workers}: "
            "pass the argument num_workers on to both DataLoaders")
        assert not loader.pin_memory, (
            f"{T14}: device='cpu' gave the {name} loader pin_memory=True: pinned memory only speeds up copies "
            "to a GPU, and costs time otherwise; pin_memory only when the device is a GPU")
    # as on a machine with a GPU, without one: the loaders are built, never iterated
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for device, pin in [("cpu", False), ("cuda", True), ("cuda:0", True), (torch.device("cuda", 0), True)]:
        train, test = data_loader.build_loaders(_indexed(24), _indexed(10), 12, 1, 3, device=device)
        for name, loader in [("train", train), ("test", test)]:
            assert loader.pin_memory == pin, (
                f"{T14}: on a machine with a GPU, device={device!r} gave the {name} loader "
                f"pin_memory={loader.pin_memory}: " + (
                    "pin_memory follows the device the batches go to, not whether the machine has a GPU "
                    "(torch.cuda.is_available()): a run on the CPU gains nothing from pinned memory"
                    if not pin else "every CUDA device, 'cuda', 'cuda:0' or a torch.device, is a GPU: compare "
                    "the device's type, torch.device(device).type == 'cuda', not the string"))


def test_batch_size_errors_are_clear(data_loader):
    with pytest.raises(ValueError, match="smaller than the world size"):
        data_loader.build_loaders(_indexed(8), _indexed(8), 2, 0, 4)
    with pytest.raises(ValueError, match="not divisible"):
        data_loader.build_loaders(_indexed(8), _indexed(8), 10, 0, 4)


@pytest.mark.task1_4
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: pinned memory only matters for copies to a GPU")
def test_loaders_pin_memory_for_a_gpu(data_loader, monkeypatch):
    use_reference(monkeypatch, data_loader, "ordered_indices", "pad_or_drop", "shard")
    train, test = data_loader.build_loaders(_indexed(8), _indexed(8), 4, 0, 2, device="cuda")
    assert train.pin_memory and test.pin_memory, f"{T14}: use pin_memory=True when the device is a GPU"
    train, test = data_loader.build_loaders(_indexed(8), _indexed(8), 4, 0, 2, device="cpu")
    assert not train.pin_memory, f"{T14}: pin_memory only helps copies to a GPU; leave it off on CPUs"
