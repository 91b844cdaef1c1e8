"""Task 1: give every rank its own share of the data.

    python template_data_loader.py                        # the demonstration: 10 samples, 4 ranks
    python check.py 1                                     # check your work (one task: python check.py 1.2)

No data moves between ranks. Every rank builds the same list of indices (same seed,
same epoch), then keeps its own contiguous block of it:

    10 samples, 4 ranks, no shuffle:
    order   0 1 2 3 4 5 6 7 8 9          (Task 1.1)
    padded  0 1 2 3 4 5 6 7 8 9 0 1      (Task 1.2: a multiple of 4)
    rank 0: 0 1 2   rank 1: 3 4 5   rank 2: 6 7 8   rank 3: 9 0 1   (Task 1.3)

Then Task 1.4 builds the train and test DataLoaders of one rank. For training, the same
shard is taken of every global batch in turn (global_batch_size), so that step k trains on
the k-th block of the epoch's order however many ranks there are. 8 samples, global batch 4:

    1 rank:                   rank 0: 0 1 2 3 | 4 5 6 7        step 0 trains on {0 1 2 3}
    2 ranks, whole epoch:     rank 0: 0 1 | 2 3   rank 1: 4 5 | 6 7    step 0: {0 1 4 5}
    2 ranks, global batches:  rank 0: 0 1 | 4 5   rank 1: 2 3 | 6 7    step 0: {0 1 2 3}
"""
import math

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler


def ordered_indices(dataset_len, shuffle, seed, epoch):
    """The order in which this epoch visits the data set, the same on every rank.

    Without shuffle: [0, 1, ..., dataset_len - 1].
    With shuffle: torch.randperm(dataset_len, generator=g).tolist(), where g is a
    torch.Generator seeded with seed + epoch, exactly as PyTorch's DistributedSampler does.
    Every rank must get the same permutation (so the shards do not overlap) and each epoch
    a different one (so the model does not see the data in the same order every epoch).
    """
    # --- Task 1.1 begin ---
    # TODO Task 1.1: the same order on every rank; shuffled with a generator seeded by seed + epoch
    raise NotImplementedError("Task 1.1: ordered_indices() in template_data_loader.py is not done yet (docs/task1-sampler.md)")
    # --- Task 1.1 end ---


def pad_or_drop(indices, num_replicas, drop_last):
    """Make len(indices) a multiple of num_replicas, so every rank gets as many samples.

    drop_last=False: append indices taken from the front of the list, wrapping around as
    often as needed, until the length is a multiple: 10 indices on 4 ranks gain
    indices[0:2]; [7, 3] on 5 ranks becomes [7, 3, 7, 3, 7].
    drop_last=True: cut the tail off instead, down to the largest multiple.
    Returns a new list. Why: if one rank had fewer batches it would stop calling
    all_reduce while the others wait for it forever.
    """
    # --- Task 1.2 begin ---
    # TODO Task 1.2: pad with indices from the front (wrapping around), or drop the tail when drop_last
    raise NotImplementedError("Task 1.2: pad_or_drop() in template_data_loader.py is not done yet (docs/task1-sampler.md)")
    # --- Task 1.2 end ---


def shard(indices, num_replicas, rank):
    """The contiguous block of `indices` that belongs to `rank`, as a list.

    Rank r takes the r-th of num_replicas consecutive blocks. When len(indices) is a
    multiple of num_replicas (after padding) the blocks are equal: rank r takes
    positions [r*m, (r+1)*m) with m = len(indices) // num_replicas. Otherwise (the
    unpadded evaluation sampler) the first len(indices) % num_replicas ranks take one more
    than the others, as torch.tensor_split does: 10 indices on 3 ranks give 4, 3, 3.
    """
    # --- Task 1.3 begin ---
    # TODO Task 1.3: slice out this rank's contiguous block
    raise NotImplementedError("Task 1.3: shard() in template_data_loader.py is not done yet (docs/task1-sampler.md)")
    # --- Task 1.3 end ---


class DistributedSampler(Sampler):
    """A from-scratch torch.utils.data.DistributedSampler, built from Tasks 1.1-1.3.

    shuffle, seed, drop_last and set_epoch mean what they mean in PyTorch's sampler.
    pad=False neither pads nor drops: each sample is visited exactly once over all ranks,
    and the ranks' lengths differ by at most one. Use it for evaluation, where padded
    duplicates would count some test images twice.
    num_replicas and rank default to those of the initialised process group.

    global_batch_size=None: rank r takes the r-th contiguous block of the whole epoch (the
    seed's layout, as in the example at the top). A global_batch_size B, a multiple of
    num_replicas: rank r takes the r-th block of each run of B consecutive indices in turn.
    A DataLoader with batch_size B // num_replicas then loads, at step k, over all ranks,
    exactly positions [k*B, (k+1)*B) of the epoch's order, whatever the number of ranks:
    training on 1, 2 or 4 ranks sees the same global batches (PyTorch's sampler, which
    hands out indices[rank::num_replicas], gives the same ones). With blocks of the whole
    epoch, step k would mix num_replicas distant pieces of the order instead.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False, pad=True, global_batch_size=None):
        if num_replicas is None or rank is None:
            if not dist.is_initialized():
                raise RuntimeError("DistributedSampler: no process group; pass num_replicas and rank, "
                                   "or call dist.init_process_group() first")
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        if num_replicas < 1:
            raise ValueError(f"DistributedSampler: num_replicas must be at least 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: rank must be in [0, {num_replicas - 1}], got {rank}")
        if drop_last and not pad:
            raise ValueError("DistributedSampler: pad=False keeps every sample exactly once, "
                             "so it cannot be combined with drop_last=True")
        if global_batch_size is not None and (global_batch_size < 1 or global_batch_size % num_replicas):
            raise ValueError(f"DistributedSampler: global_batch_size must be a positive multiple of "
                             f"num_replicas ({num_replicas}), got {global_batch_size}")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.pad = pad
        self.global_batch_size = global_batch_size
        self.epoch = 0

    def set_epoch(self, epoch):
        """Call at the start of every epoch, on every rank, so that each epoch shuffles differently."""
        self.epoch = epoch

    def _rank_indices(self):
        indices = ordered_indices(len(self.dataset), self.shuffle, self.seed, self.epoch)
        if self.pad:
            indices = pad_or_drop(indices, self.num_replicas, self.drop_last)
        if self.global_batch_size is None:
            return shard(indices, self.num_replicas, self.rank)
        step = self.global_batch_size
        return [i for start in range(0, len(indices), step)
                for i in shard(indices[start:start + step], self.num_replicas, self.rank)]

    def __iter__(self):
        return iter(self._rank_indices())

    def __len__(self):
        return len(self._rank_indices())


def build_loaders(train_set, test_set, global_batch_size, rank, world_size, seed=0,
                  num_workers=0, device="cpu"):
    """The (train_loader, test_loader) of one rank.

    - The global batch is what the user chooses (the seed's 512); each rank loads
      global_batch_size // world_size samples a step, so the optimizer sees the same
      batch size however many ranks there are.
    - Training: a shuffled DistributedSampler with this seed, drop_last=True and
      global_batch_size=global_batch_size, and drop_last=True in the DataLoader. Then
      every step of every rank has a full batch, and step k trains on the k-th global
      batch of the epoch's order, the same on 1, 2 or 4 ranks: only the tail that does not
      fill a global batch is left out (padding could add a step on some numbers of ranks).
    - Evaluation: an unshuffled DistributedSampler with pad=False, so every test image
      is counted exactly once over all ranks, in batches of the same per-rank size
      (the last one may be smaller).
    - pin_memory only when the device is a GPU (it speeds up copies to the GPU, and only
      costs time otherwise).
    """
    if global_batch_size < world_size:
        raise ValueError(f"the global batch ({global_batch_size}) is smaller than the world size "
                         f"({world_size}): every rank needs at least one sample a step")
    if global_batch_size % world_size:
        raise ValueError(f"the global batch ({global_batch_size}) is not divisible by the world size "
                         f"({world_size}): choose a multiple of {world_size}")
    # --- Task 1.4 begin ---
    # TODO Task 1.4: this rank's train and test DistributedSampler and DataLoader (training: global_batch_size)
    raise NotImplementedError("Task 1.4: build_loaders() in template_data_loader.py is not done yet (docs/task1-sampler.md)")
    # --- Task 1.4 end ---


def demo():
    """The seed's example: 10 samples on 4 ranks, with and without shuffle, two epochs."""
    dataset = list(range(10))
    num_replicas = 4
    failures = []
    for shuffle in (False, True):
        orders = []
        for epoch in (0, 1):
            shards = []
            for rank in range(num_replicas):
                sampler = DistributedSampler(dataset, num_replicas, rank, shuffle=shuffle, seed=0)
                sampler.set_epoch(epoch)
                shards.append(list(sampler))
            print(f"shuffle={shuffle!s:5} epoch={epoch}: " + "  ".join(f"rank {r}: {s}" for r, s in enumerate(shards)))
            seen = [i for s in shards for i in s]
            orders.append(seen)
            if len({len(s) for s in shards}) != 1:
                failures.append(f"shuffle={shuffle} epoch={epoch}: the ranks have different numbers of samples")
            if set(seen) != set(dataset):
                failures.append(f"shuffle={shuffle} epoch={epoch}: samples {sorted(set(dataset) - set(seen))} are never used")
            if len(seen) - len(set(seen)) != -len(dataset) % num_replicas:
                failures.append(f"shuffle={shuffle} epoch={epoch}: ranks overlap beyond the padding")
        if shuffle and orders[0] == orders[1]:
            failures.append("shuffle=True: both epochs have the same order; is the epoch part of the seed?")
    for failure in failures:
        print("FAILED:", failure)
    print("all checks passed" if not failures else f"{len(failures)} checks FAILED")
    return not failures


if __name__ == "__main__":
    try:
        passed = demo()
    except NotImplementedError as error:
        print(error)
        passed = False
    raise SystemExit(0 if passed else 1)
