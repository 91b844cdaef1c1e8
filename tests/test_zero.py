"""Task 6: the sharded optimizer, ZeRO stage 1 (template_zero.py).

    pytest --impl template -m task6_3      # one task; see conftest.py

Real gloo ranks (tests/harness.py); every rank's result is checked. The references are
independent: the unsharded optimizer (torch.optim.SGD, Adam, AdamW) stepping a copy of the model
in the same process, and PyTorch's own torch.distributed.optim.ZeroRedundancyOptimizer.
"""
import contextlib
import copy
import functools
import gc
import itertools
import math
import os
import re
import sys
import traceback
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from conftest import REFERENCE, call_alone, load, load_with_reference
from harness import run_ranks

T61 = "Task 6.1 (template_zero.py, partition_parameters)"
T62 = "Task 6.2 (template_zero.py, ShardedOptimizer.shard_param_group)"
T63 = "Task 6.3 (template_zero.py, ShardedOptimizer.step)"

OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1}),
    "sgd-momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 0.01}),
    "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
}


class Toy(nn.Module):
    """Parameters of several sizes, many of the same size (so a split that depends on object ids
    shows), a frozen one, one forward never uses (its .grad stays None), and a head that the
    optimizer only gets later, through add_param_group."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                                    nn.Linear(16, 16), nn.Tanh())
        self.frozen = nn.Parameter(torch.randn(16), requires_grad=False)
        self.unused = nn.Parameter(torch.zeros(5))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.layers(x) + self.frozen)

    def body_parameters(self):
        return [p for name, p in self.named_parameters() if not name.startswith("head.")]


def _loss(model, step):
    g = torch.Generator().manual_seed(step)  # the same batch on every rank: the same gradients
    x, y = torch.randn(12, 8, generator=g), torch.randint(0, 4, (12,), generator=g)
    return F.cross_entropy(model(x), y)


def _step_both(pairs, step):
    """One training step of each (model, optimizer) pair, on the same batch."""
    for model, optimizer in pairs:
        optimizer.zero_grad()
        _loss(model, step).backward()
        with _watcher().watching(optimizer, model):  # a broadcast from another rank than a piece's owner fails here
            optimizer.step()


_WATCHER = []


def _watcher():
    """This rank's one _Waits (defined below) that checks the source of each piece's broadcast, made on first use."""
    if not _WATCHER:
        _WATCHER.append(_Waits())
    return _WATCHER[0]


def _state_bytes(optimizer):
    """Bytes that the tensors with one number per element in an optimizer's state (exp_avg,
    exp_avg_sq, momentum_buffer) keep alive: their memory (storage), not only their elements, so
    that a state tensor that is a view of a larger one counts whole; each memory once. Adam's step
    count, one scalar per parameter, is left out."""
    storages = {value.untyped_storage().data_ptr(): value.untyped_storage().nbytes()
                for state in optimizer.state.values() for key, value in state.items()
                if torch.is_tensor(value) and key != "step"}
    return sum(storages.values())


def _shuffle_memory(rank):
    """Rank-dependent allocations, so that objects made next get different ids (addresses) on
    different ranks, as they would in real jobs: a split that depends on ids then differs."""
    return [torch.empty(rank) for _ in range(1 + 13 * rank)]


def _ceil_div(a, b):
    return -(-a // b)


# --------------------------------------------------------------------------- Task 6.1
# a size is a number of elements (a 1-D parameter) or a shape (a tuple): a matrix has more elements than rows
SIZES = [[100], [7, 7, 7, 7, 7, 7], [256, 16, 256, 16, 128, 16, 5, 64, 4], [1, 2, 3, 50, 4, 5, 6], [262144, 64, 10],
         [3], [1, 1], [(4, 6), 10, (3, 5, 2)]]


def _numel(size):
    return size if isinstance(size, int) else math.prod(size)


def _partition(impl, sizes, world_size):
    zero = load(impl, "template_zero")
    return zero.partition_parameters([torch.zeros(n) if isinstance(n, int) else torch.zeros(*n) for n in sizes],
                                     world_size)


def _cut_every(numels, shard_size, per_parameter=False):
    """The pieces of the line cut at every multiple of shard_size (counted from the start of each parameter if
    per_parameter): the test's own, to name which shard size a wrong partition used."""
    pieces, offset = [], 0
    for index, n in enumerate(numels):
        base = 0 if per_parameter else offset
        start = 0
        while start < n:
            end = min(n, ((base + start) // shard_size + 1) * shard_size - base)
            pieces.append((index, start, end, (base + start) // shard_size))
            start = end
        offset += n
    return pieces


def _shard_size_used(pieces, numels):
    """The shard size s with which the pieces are exactly the line cut at every multiple of s, or None."""
    s = sum(end - start for _, start, end, rank in pieces if rank == 0)  # all that rank 0 owns, if cut so
    # s = T, every piece on rank 0, is no cut at all: the other checks say what is wrong with that
    return s if 0 < s < sum(numels) and _cut_every(numels, s) == pieces else None


def _partition_problem(pieces, sizes, world_size):
    """What is wrong with a partition (a message), or None."""
    shape = f"for sizes {sizes} and world_size {world_size} got {pieces!r}"
    numels = [_numel(n) for n in sizes]
    total, most = sum(numels), _ceil_div(sum(numels), world_size)
    if not (isinstance(pieces, list) and all(isinstance(p, tuple) and len(p) == 4 for p in pieces)):
        return f"return a list of (index, start, end, rank) tuples, one per piece; {shape}"
    if not all(isinstance(v, int) for p in pieces for v in p):
        return f"every value in the tuples must be an int; {shape}"
    used = _shard_size_used(pieces, numels)
    if used is not None and used != most:  # a clean cut, at the wrong multiple: say which and, if known, why
        rows = sum(n if isinstance(n, int) else n[0] for n in sizes)  # what len() counts: the first dimension
        why = (f"with floor(T / world_size) = {total // world_size} the last T % world_size elements fall past the "
               "last rank" if used == total // world_size else
               f"T // world_size + 1 = {used} is one too many when world_size divides T" if used == total // world_size + 1
               else f"T was counted with len(param), which counts rows (the first dimension: {rows} in all), not "
               "elements: param.numel() counts every element" if rows != total and used == _ceil_div(rows, world_size)
               else "")
        return (f"the pieces are cut at every multiple of {used} elements along the line, but the shard size is "
                f"S = ceil(T / world_size) = {most} (T = {total}, the sum of the parameters' numel()); "
                + (why + "; " if why else "") + shape)
    if not all(0 <= rank < world_size for _, _, _, rank in pieces):
        return (f"every piece's rank must be one of 0..{world_size - 1}: {shape}. Rank r owns elements "
                "[r * S, (r + 1) * S) of the line with S = ceil(T / world_size)")
    for index, (size, n) in enumerate(zip(sizes, numels)):
        ranges = sorted((start, end) for i, start, end, _ in pieces if i == index)
        covered = [element for start, end in ranges for element in range(start, end)]
        if not (covered == list(range(n)) and all(start < end for start, end in ranges)):
            rows_only = not isinstance(size, int) and covered == list(range(size[0]))
            return (f"every element of every parameter must be in exactly one piece, and no piece may be empty: "
                    f"params[{index}] has {n} elements, the pieces cover {ranges}; "
                    + (f"that is len(params[{index}]) = {size[0]}, its rows (shape {size}): count its elements with "
                       "numel(); " if rows_only else "") + shape)
    owned = [sum(end - start for _, start, end, rank in pieces if rank == r) for r in range(world_size)]
    if max(owned) > most:
        cut = any(len({rank for i, _, _, rank in pieces if i == index}) > 1 for index in range(len(sizes)))
        why = ("Rank r owns elements [r * S, (r + 1) * S) of the one line of all the parameters: the pieces are cut "
               "as if each parameter began the line at 0 (the offset of params[index] on the line not added)"
               if pieces == _cut_every(numels, most, per_parameter=True) else
               "Cut the parameters by element, a large parameter too: a split by whole parameters cannot divide a "
               "model whose largest parameter is most of it" if not cut else
               "Rank r owns elements [r * S, (r + 1) * S) of the line")
        return (f"unequal shards: {owned} elements per rank for sizes {sizes}; no rank may own more than "
                f"S = ceil(T / world_size) = {most}. {why}")
    return None


@pytest.mark.task6_1
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_partition_cuts_every_element_once_into_equal_shards(impl, world_size):
    # in a process of its own, with a time and a memory limit: a loop that never ends fails in seconds
    results = call_alone(_partition, [(impl, sizes, world_size) for sizes in SIZES], T61,
                         lambda args: f"partition_parameters(parameters of sizes {args[1]}, world_size={args[2]})")
    for sizes, pieces in zip(SIZES, results):
        problem = _partition_problem(pieces, sizes, world_size)
        if problem is None:
            continue
        if isinstance(pieces, list) and all(isinstance(p, tuple) and len(p) == 4 for p in pieces):
            for order in itertools.permutations(range(4)):
                if order != (0, 1, 2, 3) and _partition_problem([tuple(p[i] for i in order) for p in pieces],
                                                                sizes, world_size) is None:
                    pytest.fail(f"{T61}: the tuples hold the right numbers in another order: return "
                                f"(index, start, end, rank), got {pieces[:3]!r}... for sizes {sizes} and world_size "
                                f"{world_size}")
            if _partition_problem([(i, start, end + 1, rank) for i, start, end, rank in pieces], sizes,
                                  world_size) is None:
                pytest.fail(f"{T61}: each piece's end is one short: end is exclusive, the piece is elements "
                            f"start..end-1 (as in params[index].view(-1)[start:end]); {problem}")
        pytest.fail(f"{T61}: {problem}")


def _partition_on_rank(rank, world_size, impl):
    zero = load(impl, "template_zero")
    junk = _shuffle_memory(rank)
    params = [nn.Parameter(torch.zeros(n)) for n in [16, 16, 64, 16, 8, 16, 8, 16, 16, 32, 16, 16]]
    pieces = zero.partition_parameters(params, world_size)
    del junk
    return pieces


@pytest.mark.task6_1
def test_partition_is_the_same_on_every_rank(impl):
    pieces = run_ranks(_partition_on_rank, 3, impl)
    for rank in range(1, 3):
        assert pieces[rank] == pieces[0], (
            f"{T61}: the split must be the same on every rank (it may depend only on the sizes and the order "
            f"of params, not on object ids, sets or the rank): rank 0 got {pieces[0]}, rank {rank} {pieces[rank]}")


# --------------------------------------------------------------------------- Task 6.2
def _shard_bytes(rank, world_size, impl):
    zero = load_with_reference(impl, "template_zero", "partition_parameters", "step")
    solution = load("solutions", "template_zero")
    torch.manual_seed(0)
    model = Toy()
    reference = copy.deepcopy(model)
    try:
        optimizer = zero.ShardedOptimizer(model.body_parameters(), torch.optim.Adam, lr=0.01)
    except ValueError as error:
        if "non-leaf" not in str(error):
            raise
        raise AssertionError(  # torch.optim's refusal, said with its cause: the views are made in the graph
            f"{T62}, rank {rank}: the local optimizer refused the views ({error}): a view made from the parameter "
            "itself, param.view(-1)[start:end], is the result of an operation autograd records (a non-leaf tensor); "
            "make it from param.detach() (param.detach().view(-1)[start:end]): the same memory, outside the graph") from None
    unsharded = torch.optim.Adam(reference.body_parameters(), lr=0.01)
    listed = [p for group in optimizer.param_groups for p in group["params"]]
    out = {"listed": [id(p) for p in listed] == [id(p) for p in model.body_parameters()]}
    if not out["listed"] and optimizer.optim is not None and any(
            group is local for group, local in zip(optimizer.param_groups, optimizer.optim.param_groups)):
        raise AssertionError(
            f"{T62}, rank {rank}: self.param_groups[0] lists {len(listed)} tensors, not the group's "
            f"{len(model.body_parameters())} parameters: it is the very dict given to self.optim, whose 'params' were "
            "replaced by this rank's views. param_groups must list every parameter, as any optimizer's does: give "
            "self.optim a new dict, {**param_group, 'params': views}, and leave the group's own as it is")
    names = {id(p): name for name, p in model.named_parameters()}
    # before any step: step() broadcasts each piece of self.pieces from its owner, so a list that
    # differs between ranks would hang there, in the given step(), far from the mistake
    body = model.body_parameters()
    first = [(names[id(body[index])], start, end, owner)
             for index, start, end, owner in solution.partition_parameters(body, world_size)]
    got = [(names.get(id(piece[1]), "?"), *piece[2:5]) if isinstance(piece, tuple) and len(piece) == 5 else piece
           for piece in optimizer.pieces]
    trainable = [p for p in body if p.requires_grad]
    if got != first and got == [(names[id(trainable[index])], start, end, owner)
                                for index, start, end, owner in solution.partition_parameters(trainable, world_size)]:
        raise AssertionError(
            f"{T62}, rank {rank}: self.pieces leaves out the parameters with requires_grad=False: they are the "
            "group's parameters too, and split with the others (partition_parameters(param_group['params'])): a "
            "parameter unfrozen later (requires_grad_(True)) must be stepped, as by any optimizer; one without a "
            "gradient costs no step anyway (the local optimizer skips a view whose .grad is None)")
    if got != first:
        raise AssertionError(
            f"{T62}, rank {rank}: self.pieces must list every piece of the group, this rank's and the others', as "
            "(view, param, start, end, rank) in partition_parameters' order: step() broadcasts each piece from its "
            "owner, so every rank needs the same list (with a different one the ranks hang in step()). "
            f"Expected {first[:4]}..., got {got[:4]}...")
    for view, param, start, end, owner in optimizer.pieces:  # before any step, which would fail far from the cause
        if not (torch.is_tensor(view) and view.shape == (end - start,)
                and view.data_ptr() == param.data_ptr() + start * param.element_size()):
            raise AssertionError(
                f"{T62}, rank {rank}: the view of the piece ({names.get(id(param), '?')}, {start}, {end}, {owner}) of a "
                f"parameter of shape {tuple(param.shape)} is "
                + (f"of shape {tuple(view.shape)}, not the {end - start} elements start..end-1 of the flattened "
                   "parameter" + (": param[start:end] slices rows (dim 0), not elements" if view.dim() > 1 else "")
                   if torch.is_tensor(view) and view.shape != (end - start,) else
                   "not in the parameter's memory (a copy: clone(), torch.cat, or flatten() of a tensor that is not "
                   "contiguous), so updating it leaves the parameter as it was" if torch.is_tensor(view) else repr(view))
                + ": make it param.detach().view(-1)[start:end], a 1-D view that shares the parameter's memory")
    # the given step() gives .grad to the views in self.pieces: the local optimizer must step those very tensors
    listed_views = {id(piece[0]) for piece in optimizer.pieces}
    strangers = [p for group in optimizer.optim.param_groups for p in group["params"] if id(p) not in listed_views]
    if strangers:
        same_memory = {piece[0].data_ptr() for piece in optimizer.pieces}
        shared = sum(p.data_ptr() in same_memory for p in strangers)
        raise AssertionError(
            f"{T62}, rank {rank}: {len(strangers)} of the tensors the local optimizer steps are not views listed in "
            "self.pieces" + (f" ({shared} of them share a view's memory, but are other tensor objects: "
                             "nn.Parameter(view), view.detach() or view.view(-1) make a new one)" if shared else "")
            + ". step() gives each view in self.pieces its .grad, so the local optimizer would see tensors without a "
            "gradient and skip them: give self.optim the same view objects that self.pieces lists")
    groups = [model.body_parameters()]
    for step in range(3):
        if step == 2:  # the head joins later, with its own learning rate
            built = optimizer.optim
            optimizer.add_param_group({"params": list(model.head.parameters()), "lr": 0.005})
            unsharded.add_param_group({"params": list(reference.head.parameters()), "lr": 0.005})
            groups.append(list(model.head.parameters()))
            if optimizer.optim is not built:
                raise AssertionError(
                    f"{T62}, rank {rank}: add_param_group after __init__ built a new local optimizer (self.optim is "
                    "another object than before): it forgets the earlier groups and their state (Adam's moments). "
                    "Build self.optim on the first call only, and add each later group to it: "
                    "self.optim.add_param_group(local group)")
        _step_both([(model, optimizer), (reference, unsharded)], step)
    # a group too small to reach every rank: the last ranks own none of it, and get an empty group
    lonely = nn.Parameter(torch.zeros(1))
    optimizer.add_param_group({"params": [lonely], "lr": 0.25})
    groups.append([lonely])
    names[id(lonely)] = "lonely"
    expected = [(names[id(group[index])], start, end, owner) for group in groups
                for index, start, end, owner in solution.partition_parameters(group, world_size)]
    out["pieces"] = (expected, [(names.get(id(piece[1]), "?"), *piece[2:5]) for piece in optimizer.pieces])
    out["views"] = all(view.dim() == 1 and view.data_ptr() == param.data_ptr() + start * param.element_size()
                       for view, param, start, end, owner in optimizer.pieces)
    local = optimizer.optim
    out["elements"] = sum(p.numel() for group in local.param_groups for p in group["params"])
    out["most_elements"] = sum(_ceil_div(sum(p.numel() for p in group), world_size) for group in groups)
    out["mine"], out["full"] = _state_bytes(local), _state_bytes(unsharded)
    out["most"] = 8 * out["most_elements"]  # Adam: exp_avg and exp_avg_sq, fp32
    out["params"] = ({k: v.detach().clone() for k, v in model.named_parameters()},
                     {k: v.detach().clone() for k, v in reference.named_parameters()})
    out["groups"] = (len(optimizer.param_groups), len(local.param_groups), optimizer.param_groups[1]["lr"],
                     local.param_groups[1]["lr"], local.param_groups[2]["lr"] if len(local.param_groups) > 2 else None,
                     "betas" in optimizer.param_groups[0])
    return out


@pytest.mark.task6_2
@pytest.mark.parametrize("world_size", [2, 3])
def test_each_rank_keeps_only_its_shard_of_the_optimizer_state(impl, world_size):
    results = run_ranks(_shard_bytes, world_size, impl)
    for rank, out in enumerate(results):
        assert out["listed"], f"{T62}: param_groups must list every parameter, in order, as any optimizer's does"
        expected, got = out["pieces"]
        twice = next((piece for i, piece in enumerate(got) if piece in got[:i]), None)
        differ = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
        last = [piece for piece in expected if piece[0] == "lonely"]  # the group added last
        assert not (got == last and got != expected), (
            f"{T62}, rank {rank}: self.pieces holds only the pieces of the group added last ({len(got)} of "
            f"{len(expected)}): it was started anew when a group was added; append each group's pieces to it (step() "
            "sends the pieces it lists, so the earlier groups would never be sent)")
        assert got == expected, (
            f"{T62}, rank {rank}: self.pieces lists the piece {twice} twice ({len(got)} pieces, expected "
            f"{len(expected)}): the parameters of earlier groups were cut again when a group was added; partition "
            "this group's parameters only, param_group['params'] (every group is sharded on its own)"
            if twice is not None else
            f"{T62}, rank {rank}: self.pieces must list every piece of every group, this rank's and the others' "
            f"(step() receives those), as (view, param, start, end, rank) in partition_parameters' order: "
            f"{len(got)} pieces, expected {len(expected)}; the first difference at position {differ}: expected "
            f"{expected[differ:differ + 3]}..., got {got[differ:differ + 3]}...")
        assert got == expected, (
            f"{T62}, rank {rank}: self.pieces must list every piece of every group, this rank's and the others' "
            f"(step() receives those), as (view, param, start, end, rank) in partition_parameters' order: "
            f"expected {expected[:6]}..., got {got[:6]}...")
        assert out["views"], (
            f"{T62}: each piece's view must be param.detach().view(-1)[start:end], a 1-D view that shares the "
            "parameter's memory, so that updating it updates the parameter; a copy (clone(), torch.cat, flatten() "
            "of a non-contiguous tensor) leaves the parameter as it was")
        assert out["elements"] <= out["most_elements"], (
            f"{T62}: rank {rank}'s local optimizer holds {out['elements']} elements, more than its shard's "
            f"{out['most_elements']}: is every rank stepping every parameter, or a group added with add_param_group "
            "after __init__ not sharded? Give self.optim the views of this rank's pieces only")
        assert out["mine"] <= out["most"], (
            f"{T62}: rank {rank} holds {out['mine']} bytes of optimizer state out of {out['full']} in all, more than "
            f"its shard's {out['most']}: is every rank stepping every parameter, or a group added with "
            "add_param_group after __init__ not sharded? Give self.optim the views of this rank's pieces only")
        assert out["groups"] == (3, 3, 0.005, 0.005, 0.25, True), (
            f"{T62}: group i of self.param_groups must be group i of self.optim.param_groups, with its options, "
            "even on a rank that owns no piece of it (an empty group): (groups, local groups, lr of group 1, "
            f"its local lr, local lr of group 2, betas) = {out['groups']}")
        sharded, unsharded = out["params"]
        for key, expected_value in unsharded.items():
            # Same arithmetic on the same numbers (see the Task 6.3 test for the tolerance); a parameter the
            # local optimizer never reached is off by about lr = 1e-2.
            assert torch.allclose(sharded[key], expected_value, rtol=1e-5, atol=1e-6), (
                f"{T62}, rank {rank}: after three steps {key} differs from the unsharded Adam's by "
                f"{(sharded[key] - expected_value).abs().max():.2e}: the local optimizer must step views that share "
                "the parameters' memory (param.detach().view(-1)[start:end]), not copies")
    assert sum(out["mine"] for out in results) == results[0]["full"], (
        f"{T62}: the ranks' local optimizers together must hold the state of every element exactly once: "
        f"{[out['mine'] for out in results]} bytes on the ranks, {results[0]['full']} for the unsharded Adam. "
        "Is every rank stepping every parameter, or a group added with add_param_group after __init__ not sharded?")


# --------------------------------------------------------------------------- Task 6.3
class _Counted:
    """A collective's handle that counts the ways it was waited for: wait(), its Future taken, or is_completed()
    until True."""

    def __init__(self, work):
        self.work, self.waits = work, 0

    def wait(self, *args, **kwargs):
        self.waits += 1
        return self.work.wait(*args, **kwargs)

    def get_future(self):
        self.waits += 1
        return self.work.get_future()

    def is_completed(self):
        done = self.work.is_completed()
        self.waits += done
        return done

    def __getattr__(self, name):
        return getattr(self.work, name)


class _Waits:
    """In a rank (its own process): every handle that a collective returns (async_op=True) is
    recorded, with how often it was waited on."""

    def __init__(self):
        self.handles = []
        self.calls = []  # (name, elements it moves into this rank's tensors, op or None), for every call
        self.owners = {}  # id of a view of ShardedOptimizer.pieces: (its owner, what to call it), while it steps
        for name in ("broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_reduce",
                     "scatter", "reduce_scatter_tensor"):
            if hasattr(dist, name):
                setattr(dist, name, self._counting(getattr(dist, name), name))

    @contextlib.contextmanager
    def watching(self, optimizer, model):
        """While a ShardedOptimizer steps: a broadcast of one of its views must name the piece's owner as src."""
        names = {id(p): n for n, p in model.named_parameters()}
        self.owners = {id(piece[0]): (piece[4], (names.get(id(piece[1]), "?"), *piece[2:5]))
                       for piece in getattr(optimizer, "pieces", []) if isinstance(piece, tuple) and len(piece) == 5}
        try:
            yield
        finally:
            self.owners = {}

    def _counting(self, real, name):
        def collective(*args, **kwargs):
            first = args[0] if args else next(iter(kwargs.values()), None)
            elements = (sum(t.numel() for t in first) if isinstance(first, (list, tuple)) else
                        first.numel() if torch.is_tensor(first) else 0)
            op = kwargs.get("op", args[1] if len(args) > 1 else dist.ReduceOp.SUM) if name == "all_reduce" else None
            self.calls.append((name, elements, op))
            src = kwargs.get("src", args[1] if len(args) > 1 else None) if name == "broadcast" else None
            if src is None:  # group_src (newer torch): in the default group, a rank's group rank is its rank
                src = kwargs.get("group_src")
            if name == "broadcast" and id(first) in self.owners and src != self.owners[id(first)][0]:
                # before the collective: ranks that disagree on the source would hang in it, far from the cause
                owner, piece = self.owners[id(first)]
                raise AssertionError(
                    f"{T63}, rank {dist.get_rank()}: step() broadcast the piece {piece} with src={src}, but "
                    f"self.pieces names rank {owner} as its owner: send every piece from its owner, "
                    "dist.broadcast(view, src=rank) with the rank of that piece (not src=0, nor this rank's number: "
                    "every rank must name the same source, or the ranks hang)")
            work = real(*args, **kwargs)
            if work is None:
                return None
            self.handles.append(_Counted(work))
            return self.handles[-1]
        return collective


def _train_three_ways(rank, world_size, impl):
    """Four steps of each optimizer: ShardedOptimizer, the unsharded one, ZeroRedundancyOptimizer."""
    # here, not at the top: torch.distributed.optim takes 0.5 s to import, in every rank of every test of this file
    from torch.distributed.optim import ZeroRedundancyOptimizer
    zero = load_with_reference(impl, "template_zero", "partition_parameters", "shard_param_group")
    waits = _Waits()
    out = {"unwaited": [], "wire": []}
    for name, (optimizer_cls, kwargs) in OPTIMIZERS.items():
        junk = _shuffle_memory(rank)
        torch.manual_seed(0)  # the same model on every rank: this tests the optimizer, not a broadcast
        model = Toy()
        models = [model, copy.deepcopy(model), copy.deepcopy(model)]
        optimizers = [zero.ShardedOptimizer(models[0].body_parameters(), optimizer_cls, **kwargs),
                      optimizer_cls(models[1].body_parameters(), **kwargs),
                      ZeroRedundancyOptimizer(models[2].body_parameters(), optimizer_cls, **kwargs)]
        for step in range(4):
            for m, opt in zip(models, optimizers):
                if step == 1:  # what a learning-rate scheduler does
                    opt.param_groups[0]["lr"] *= 0.5
                if step == 2:  # a group added later, with its own learning rate
                    opt.add_param_group({"params": list(m.head.parameters()), "lr": kwargs["lr"] * 2})
                opt.zero_grad()
                _loss(m, step).backward()
                started, called = len(waits.handles), len(waits.calls)
                try:
                    with waits.watching(opt, m) if opt is optimizers[0] else contextlib.nullcontext():
                        opt.step()
                except AttributeError as error:
                    if opt is optimizers[0] and "'NoneType'" in str(error) and m.unused.grad is None:
                        raise AssertionError(
                            f"{T63}: step() raised AttributeError: {error}, on a model whose parameter 'unused' has "
                            ".grad None (forward never uses it, as torch.optim allows): give such a parameter's "
                            "views no gradient (view.grad = None), and the local optimizer skips them") from None
                    raise
                except RuntimeError as error:
                    # torch's words for a .grad of another shape: "assigned grad has data of a different size" (older),
                    # "attempting to assign a gradient of size '[0, 16]' to a tensor of size '[66]'" (2.x)
                    size = re.search(r"gradient of size '\[([^\]]*)\]'", str(error))
                    if opt is optimizers[0] and ("different size" in str(error) or size):
                        raise AssertionError(
                            f"{T63}: step() gave a view a gradient of another shape ({str(error).splitlines()[0]}): "
                            + ("it has more than one dimension, so it slices rows (dim 0) of a matrix's gradient, not "
                               "elements: " if size and "," in size.group(1) else "")
                            + "give each view param.grad.view(-1)[start:end], the 1-D slice of the flattened gradient "
                            "that matches its elements") from None
                    raise
                if opt is optimizers[0]:  # every collective step() started asynchronously, waited on?
                    mine = waits.handles[started:]
                    out["unwaited"].append((sum(h.waits == 0 for h in mine), len(mine)))
                    calls = waits.calls[called:]
                    out["wire"].append((name, step, sum(n for _, n, _ in calls), sum(c == "broadcast" for c, _, _ in calls),
                                        any(c == "all_reduce" and op == dist.ReduceOp.SUM for c, _, op in calls),
                                        sum(p.numel() for group in opt.param_groups for p in group["params"]),
                                        len(opt.pieces), len(opt.param_groups)))
        out[name] = [{k: v.detach().clone() for k, v in m.named_parameters()} for m in models]
        del junk
    return out


def _compare(results, world_size, what, advice=""):
    summed = set()  # (rank, optimizer name) whose step() all-reduced with SUM
    for rank, out in enumerate(results):
        for unwaited, started in out.pop("unwaited", []):
            assert unwaited == 0, (
                f"{T63}, rank {rank}: step() started {started} collectives with async_op=True and never waited on "
                f"{unwaited} of them: call wait() on every handle before step() returns (waiting on the last one "
                "does not wait for the others: under gloo several run at once), or the parameters may still be "
                "changing when the next forward reads them")
        for name, step, elements, broadcasts, sums, total, pieces, groups in out.pop("wire", []):
            if sums:
                summed.add((rank, name))
            # one broadcast per piece moves T elements; an all-gather of padded shards at most N more per group
            assert elements <= total + world_size * groups, (
                f"{T63}, {name}, rank {rank}: step {step} moved {elements} elements through collectives for {total} "
                "elements of parameters: each piece must go on the wire once, from its owner"
                + (f"; it issued {broadcasts} broadcasts for the {pieces} pieces of self.pieces (one each: is a loop "
                   "over self.pieces nested in another, or the broadcasts issued twice?)" if broadcasts > pieces else "")
                + ": every extra copy costs communication, as much as the model for a second round")
    for name in results[0]:
        for rank in range(1, world_size):
            for key, value in results[0][name][0].items():
                assert torch.equal(results[rank][name][0][key], value), (
                    f"{T63}, {name}{what}: ranks 0 and {rank} hold different values of {key} after step(): every rank "
                    "must get every updated piece from its owner (dist.broadcast(view, src=rank) for every piece, "
                    f"or an all-gather), after the local optimizer's step{advice}")
        for rank in range(world_size):
            sharded, unsharded, *others = results[rank][name]
            # The same fp32 arithmetic on the same numbers, so in practice bit-identical (measured: equal to
            # the last bit on this torch); the tolerance leaves room for a multi-tensor (foreach/fused) kernel
            # rounding a piece differently than the whole tensor: a few ulps (fp32 eps 1.2e-7) over four
            # steps. A parameter left unstepped, or stepped twice, is off by about lr (1e-2 .. 1e-1).
            # the frozen parameter, never stepped: world_size ** 4 times itself after four all-reduces (SUM)
            if (rank, name) in summed and not torch.allclose(sharded["frozen"], unsharded["frozen"]) and torch.allclose(
                    sharded["frozen"], unsharded["frozen"] * world_size ** 4, rtol=1e-4):
                pytest.fail(
                    f"{T63}, {name}{what}, rank {rank}: step() all-reduced with SUM, so every rank added its copy of "
                    f"each piece: the frozen parameter, which no optimizer steps, is now {world_size}**4 times what it "
                    "was after four steps. Send each piece from its owner: dist.broadcast(view, src=rank) (an "
                    "all-reduce would need every rank but the owner to zero its copy first)")
            for key, expected in unsharded.items():
                assert torch.allclose(sharded[key], expected, rtol=1e-5, atol=1e-6), (
                    f"{T63}, {name}{what}, rank {rank}: {key} differs from the unsharded {name} optimizer's by "
                    f"{(sharded[key] - expected).abs().max():.2e}, while every rank holds the same value. Give each of "
                    "this rank's views the slice param.grad.view(-1)[start:end] of its parameter's gradient, step the "
                    "local optimizer, and only then send every piece from its owner: dist.broadcast(view, src=rank) "
                    "with the rank that self.pieces names for that piece, not src=0 for all (rank 0 would send its "
                    f"stale copy of the pieces other ranks stepped), after the local optimizer's step{advice}")
                for other in others:
                    assert torch.allclose(other[key], expected, rtol=1e-5, atol=1e-6), (
                        f"the reference itself: ZeroRedundancyOptimizer disagrees with {name} on {key}")


@pytest.mark.task6_3
@pytest.mark.parametrize("world_size", [2, 3])
def test_step_matches_the_unsharded_optimizer_and_pytorchs_zero(impl, world_size):
    _compare(run_ranks(_train_three_ways, world_size, impl, timeout=40), world_size, "")


def _train_with_closure(rank, world_size, impl):
    zero = load_with_reference(impl, "template_zero", "partition_parameters", "shard_param_group")
    torch.manual_seed(0)
    model = Toy()
    reference = copy.deepcopy(model)
    optimizer = zero.ShardedOptimizer(model.body_parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    unsharded = torch.optim.SGD(reference.body_parameters(), lr=0.1, momentum=0.9)
    waits = _watcher()
    losses, calls = [], []  # calls: for each step, each call of the sharded one's closure (grad mode, where from)
    local_step_file = os.path.abspath(sys.modules[torch.optim.SGD.__module__].__file__)  # the local step calls it
    for step in range(3):
        calls.append([])
        for m, opt in [(model, optimizer), (reference, unsharded)]:
            opt.zero_grad()  # the gradients are None until the closure runs

            def closure(m=m, opt=opt, step=step):
                if opt is optimizer:
                    calls[-1].append((torch.is_grad_enabled(), any(os.path.abspath(frame.filename) == local_step_file
                                                                   for frame in traceback.extract_stack())))
                opt.zero_grad()
                loss = _loss(m, step)
                loss.backward()
                return loss
            try:
                with waits.watching(opt, m) if opt is optimizer else contextlib.nullcontext():
                    losses.append(opt.step(closure))
            except RuntimeError as error:
                if opt is optimizer and calls[-1] and not calls[-1][-1][0]:
                    raise AssertionError(
                        f"{T63}: step() called the closure with gradients disabled (step runs under @torch.no_grad()), "
                        f"so its backward() raised: {str(error).splitlines()[0]}. Call it inside "
                        "`with torch.enable_grad():`, as torch.optim's optimizers do") from None
                raise
    # what the sharded step returned, if it is not the closure's loss (torch.optim's step returns that)
    same_losses = next((repr(a) for a, b in zip(losses[::2], losses[1::2])
                        if not (torch.is_tensor(a) and torch.equal(a, b))), True)
    return {"closure": [{k: v.detach().clone() for k, v in m.named_parameters()} for m in (model, reference)],
            "losses": same_losses, "calls": calls}


@pytest.mark.task6_3
def test_step_with_a_closure(impl):
    results = run_ranks(_train_with_closure, 2, impl)
    same_losses = [out.pop("losses") for out in results]
    calls = [out.pop("calls") for out in results]
    _compare(results, 2, " with step(closure)", advice=". With a closure, call the closure first (under "
             "torch.enable_grad()): it makes the gradients that the views must get before the local step")
    for rank, steps in enumerate(calls):
        for step, made in enumerate(steps):
            assert len(made) == 1, (
                f"{T63}, rank {rank}: step(closure) called the closure {len(made)} times in step {step}, "
                + ("once more from the local optimizer's step: pass the closure to self.optim.step() no more, "
                   "since step() has called it already" if len(made) > 1 and any(inside for _, inside in made) else
                   "and torch.optim's optimizers call it once")
                + ": each call is another forward and backward (and a model with dropout would get other gradients)")
    for rank, same in enumerate(same_losses):
        assert same is True, (f"{T63}, rank {rank}: step(closure) must return the closure's loss, as any optimizer's "
                              f"step does; it returned {same}")


def _frees_gradients(rank, world_size, impl):
    zero = load_with_reference(impl, "template_zero", "partition_parameters", "shard_param_group")
    torch.manual_seed(0)
    model = Toy()
    optimizer = zero.ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=0.01)
    optimizer.zero_grad()
    _loss(model, 0).backward()
    waits = _watcher()
    with waits.watching(optimizer, model):
        optimizer.step()
    gradients = [weakref.ref(p.grad) for p in model.parameters() if p.grad is not None]
    optimizer.zero_grad()  # set_to_none: nothing should hold the gradients now
    gc.collect()
    return (sum(ref() is not None for ref in gradients), len(gradients)), _float64_step(zero, waits)


def _float64_step(zero, waits):
    """One step of a float64 model, sharded and not: the max difference, or the error step() raised; and whether
    the pieces other ranks own kept their old values here (not received) while this rank's own were stepped right."""
    torch.manual_seed(0)
    model = Toy().double()
    reference = copy.deepcopy(model)
    before = copy.deepcopy(model)
    optimizers = [zero.ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=0.01),
                  torch.optim.Adam(reference.parameters(), lr=0.01)]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (12,), generator=g)
    for m, opt in zip((model, reference), optimizers):
        F.cross_entropy(m(x), y).backward()
        try:
            with waits.watching(opt, m) if opt is optimizers[0] else contextlib.nullcontext():
                opt.step()
        except RuntimeError as error:
            return f"RuntimeError: {str(error).splitlines()[0]}", False
    difference = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
    where = {id(p): (q, r) for p, q, r in zip(model.parameters(), before.parameters(), reference.parameters())}
    own, others = [], []
    for view, param, start, end, owner in getattr(optimizers[0], "pieces", []):
        old, new = (t.detach().view(-1)[start:end] for t in where[id(param)]) if id(param) in where else (None, None)
        if old is not None:
            (own if owner == dist.get_rank() else others).append((view, old, new))
    moved = [(view, old) for view, old, new in others if not torch.equal(old, new)]  # pieces the step changed
    not_received = (bool(moved) and all(torch.equal(view, old) for view, old in moved)
                    and all((view - new).abs().max() <= 1e-12 for view, old, new in own))
    return difference, not_received


@functools.lru_cache(maxsize=None)
def _frees_gradients_results(impl):
    return run_ranks(_frees_gradients, 2, impl)


@pytest.mark.task6_3
def test_a_float64_model_steps_as_the_unsharded_optimizer(impl):
    for rank, (_, (got, not_received)) in enumerate(_frees_gradients_results(impl)):
        if isinstance(got, str):
            # torch's words for a .grad of another dtype: "assigned grad has data of a different type" (older), or
            # "attempting to assign a gradient with dtype 'float' to a tensor with grad_dtype 'Double'" (2.14)
            assert not any(words in got for words in ("different type", "assign a gradient with dtype")), (
                f"{T63}, rank {rank}: with float64 parameters step() raised {got}: give each view the slice "
                "param.grad.view(-1)[start:end] as it is, in the parameter's dtype (a .grad must have its tensor's "
                "dtype; a cast to float32 also drops the bits the float64 optimizer keeps)")
            pytest.fail(f"{T63}, rank {rank}: with float64 parameters step() raised {got}")
        # the same float64 arithmetic on the same numbers: only a multi-tensor kernel's rounding may differ
        assert got <= 1e-12, (
            f"{T63}, rank {rank}: one Adam step of a float64 model differs from torch.optim.Adam's by {got:.2e}: "
            + ("this rank's own pieces were stepped right, but the pieces other ranks own kept their old values here: "
               "nothing was received into the views. Broadcast into each view itself, in the parameters' dtype: a "
               "converted copy (view.float(), view.to(torch.float32)) receives into a temporary that is thrown away, "
               "and is a copy only when the dtype differs (a float32 model hides it)" if not_received else
               "step the pieces in the parameters' own dtype"))


@pytest.mark.task6_3
def test_zero_grad_frees_the_gradients_after_a_step(impl):
    for rank, ((alive, total), _) in enumerate(_frees_gradients_results(impl)):
        assert alive == 0, (
            f"{T63}, rank {rank}: after step() and zero_grad(), {alive} of {total} gradients are still alive: the "
            "views still hold them. Set view.grad = None for every view after the local optimizer's step, or "
            "every step keeps a second copy of the gradients")


def _state_dict_round_trip(rank, world_size, impl):
    zero = load_with_reference(impl, "template_zero", "partition_parameters", "shard_param_group")
    torch.manual_seed(0)
    model = Toy()
    reference = copy.deepcopy(model)
    optimizer = zero.ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.01)
    unsharded = torch.optim.AdamW(reference.parameters(), lr=0.01)
    for step in range(2):
        _step_both([(model, optimizer), (reference, unsharded)], step)
    optimizer.zero_grad()
    cleared = all(p.grad is None for p in model.parameters())
    saved = optimizer.state_dict()  # every rank calls it: a collective
    expected = copy.deepcopy(unsharded.state_dict())  # state_dict() holds the live tensors: copy before stepping on
    # a fresh ShardedOptimizer resumes from the unsharded optimizer's checkpoint
    resumed_model = copy.deepcopy(reference)
    resumed = zero.ShardedOptimizer(resumed_model.parameters(), torch.optim.AdamW, lr=0.5)
    resumed.load_state_dict(copy.deepcopy(expected))
    _step_both([(resumed_model, resumed), (reference, unsharded)], 2)
    return cleared, saved, expected, dict(resumed_model.named_parameters()), dict(reference.named_parameters())


@pytest.mark.task6_3
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero_grad_and_state_dict_behave_as_for_any_optimizer(impl, world_size):
    results = run_ranks(_state_dict_round_trip, world_size, impl)
    for rank, (cleared, saved, expected, resumed, reference) in enumerate(results):
        assert cleared, "zero_grad() must clear every parameter's gradient, not only this rank's shard's"
        assert saved["param_groups"] == expected["param_groups"], (saved["param_groups"], expected["param_groups"])
        assert sorted(saved["state"]) == sorted(expected["state"]), "state_dict() must hold every parameter's state"
        for index, state in expected["state"].items():
            assert sorted(saved["state"][index]) == sorted(state), (index, sorted(saved["state"][index]), sorted(state))
            for key, value in state.items():
                # the same arithmetic as the unsharded AdamW: tolerance as in the step test above
                assert saved["state"][index][key].shape == value.shape, (index, key)
                assert torch.allclose(saved["state"][index][key].to(value.dtype), value, rtol=1e-5, atol=1e-6), (
                    f"rank {rank}: state_dict()['state'][{index}]['{key}'] differs from the unsharded AdamW's")
        for key, value in reference.items():
            assert torch.allclose(resumed[key], value, rtol=1e-5, atol=1e-6), (
                f"rank {rank}: after load_state_dict() of the unsharded optimizer's state, a step gives another {key}")


def _not_contiguous(rank, world_size, impl):
    zero = load(impl, "template_zero")
    weight = nn.Parameter(torch.zeros(4, 6).t())  # a transposed view: not one block in row order
    try:
        zero.ShardedOptimizer([weight], torch.optim.SGD, lr=0.1)
    except ValueError as error:
        return str(error)
    return None


def test_a_parameter_that_is_not_contiguous_is_refused_with_what_to_do():
    for message in run_ranks(_not_contiguous, 2, REFERENCE):
        assert message is not None and "contiguous" in message, message


def _replaced_memory(rank, world_size, impl):
    zero = load(impl, "template_zero")
    torch.manual_seed(0)
    model = Toy()
    reference = copy.deepcopy(model)
    optimizer = zero.ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=0.01)
    unsharded = torch.optim.Adam(reference.parameters(), lr=0.01)
    for step in range(3):
        if step == 1:  # as some checkpoint loaders do: the parameters get new memory, the views point at the old
            for param in model.parameters():
                param.data = param.data.clone()
        _step_both([(model, optimizer), (reference, unsharded)], step)
    return max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))


def test_parameters_given_new_memory_are_still_updated():
    """The given _follow_moved_parameters points the views at the parameters' new memory."""
    for rank, difference in enumerate(run_ranks(_replaced_memory, 2, REFERENCE)):
        assert difference <= 1e-6, f"rank {rank}: off the unsharded Adam by {difference:.2e} after param.data = ..."


# --------------------------------------------------------------------------- train_ddp.py --shard optimizer
@pytest.mark.slow
@pytest.mark.repo
@pytest.mark.e2e
def test_train_ddp_with_sharded_adamw_equals_unsharded(tmp_path):
    """train_ddp.py --shard optimizer on 2 ranks trains exactly as --shard none: ZeRO-1 changes where the
    optimizer state lives, not the arithmetic."""
    from test_train_ddp import trained
    losses = {}
    for shard in ["none", "optimizer"]:
        rows, _ = trained(2, ["--impl", REFERENCE, "--data", "synthetic", "--epochs", "2", "--train-samples", "2048",
                              "--test-samples", "500", "--batch-size", "128", "--optimizer", "adamw", "--shard", shard,
                              "--no-plot"], tmp_path / shard, timeout=150)
        losses[shard] = [(row["train_loss"], row["test_loss"]) for row in rows]
    # Same arithmetic, so in practice identical; the tolerance is the one of the step tests above.
    assert torch.allclose(torch.tensor(losses["optimizer"]), torch.tensor(losses["none"]), rtol=1e-5), losses
