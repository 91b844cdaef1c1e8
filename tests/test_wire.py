"""The wire recorder itself (tests/wire.py): what the tests of every task say went on the wire.

    pytest tests/test_wire.py

It must see every kind of collective and message with its dtype, size, async_op, reduce op and
group, see whether an asynchronous handle was waited on, and put torch.distributed back as it
was, also when the code under test raises.
"""
import time

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from harness import run_ranks
from wire import COLLECTIVES, MESSAGES, NO_FUTURE, Wire, dtype_name, gloo_wait_only

pytestmark = pytest.mark.repo


def _patched():
    """What the wire replaces, as it is now."""
    return ({name: getattr(dist, name) for name in COLLECTIVES + MESSAGES if hasattr(dist, name)},
            {name: vars(ProcessGroup)[name] for name in ("send", "recv", "recv_anysource")})


def test_the_wire_puts_back_what_it_replaced_on_exit_and_on_an_exception():
    before = _patched()
    with Wire():
        assert dist.all_reduce is not before[0]["all_reduce"] and dist.send is not before[0]["send"]
        assert vars(ProcessGroup)["send"] is not before[1]["send"]
    assert _patched() == before
    with pytest.raises(ZeroDivisionError):
        with Wire():
            1 / 0
    assert _patched() == before
    with Wire(("all_reduce",)):  # only what it is asked to record
        assert dist.broadcast is before[0]["broadcast"] and vars(ProcessGroup)["send"] is before[1]["send"]
    assert _patched() == before


def _future_of(work):
    try:
        work.get_future()
        return "a Future"
    except RuntimeError as error:
        return str(error)


def _everything(rank, world_size, _):
    out = {}
    peer = 1 - rank
    with Wire() as wire:
        x = torch.full((2, 3), float(rank + 1))
        wire.step = "collectives"
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        dist.broadcast(torch.zeros(4, dtype=torch.int64), src=0)
        dist.all_gather([torch.zeros(3) for _ in range(world_size)], torch.ones(3))
        wide = torch.float64
        dist.all_gather_into_tensor(torch.zeros(2 * world_size, dtype=wide), torch.ones(2, dtype=wide))
        dist.reduce_scatter_tensor(torch.zeros(5), torch.ones(5 * world_size))
        dist.reduce(torch.ones(7), dst=0)
        dist.all_gather_object([None] * world_size, {"rank": rank})
        wire.step = "messages"
        if rank == 0:
            dist.send(torch.ones(3), dst=peer)
            dist.recv(torch.zeros(2, dtype=torch.float64), src=peer)
        else:
            dist.recv(torch.zeros(3), src=peer)
            dist.send(torch.ones(2, dtype=torch.float64), dst=peer)
        ops = [dist.P2POp(dist.isend, torch.ones(4), peer), dist.P2POp(dist.irecv, torch.zeros(4), peer)]
        for work in dist.batch_isend_irecv(ops if rank == 0 else ops[::-1]):
            work.wait()
        wire.step = "async"
        kept = dist.all_reduce(torch.ones(6), async_op=True)
        dropped = dist.all_reduce(torch.ones(8), async_op=True)
        kept.wait()
        kept.wait()
        dropped.get_future().wait()  # waiting on the Future is not a wait() on the handle
        out["taken"] = wire.take()
        out["events"] = list(wire.events)
    out["calls"] = [(c.step, c.kind, c.dtype, c.numel, c.shape, c.tensors, c.first, c.async_op, c.op, c.group_size,
                     c.waits, c.peer) for c in wire.calls]
    # off: nothing recorded, the collective runs all the same
    with Wire() as wire:
        wire.on = False
        quiet = torch.ones(2)
        dist.all_reduce(quiet)
    out["off"] = (wire.calls, quiet.tolist())
    # deferred: an asynchronous all-reduce runs only at its wait() or at the wire's exit
    with Wire(("all_reduce",), defer=True) as wire:
        early, late = torch.full((2,), float(rank)), torch.full((3,), float(rank))
        first = dist.all_reduce(early, async_op=True)
        second = dist.all_reduce(late, async_op=True)
        out["deferred"] = [early.tolist(), late.tolist(), first.is_completed()]
        first.wait()
        out["deferred"] += [early.tolist(), late.tolist(), second.get_future().done()]
    out["deferred"] += [late.tolist(), [(c.deferred, c.waits) for c in wire.calls]]
    # poisoned: an asynchronous gather's outputs hold NaN until waited for (by wait(), its Future, or is_completed())
    with Wire(poison=True) as wire:
        shown = []
        for how in ("wait", "future", "polled"):
            pieces = [torch.zeros(2) for _ in range(world_size)]
            work = dist.all_gather(pieces, torch.full((2,), float(rank)), async_op=True)
            before = torch.cat(pieces).isnan().all().item()
            {"wait": work.wait, "future": lambda: work.get_future().wait(), "polled": work.is_completed}[how]()
            shown.append((before, torch.cat(pieces).tolist()))
        kept = torch.zeros(1)
        dist.reduce_scatter_tensor(kept, torch.ones(world_size))  # blocking: as it is
        changed = torch.zeros(1)
        work = dist.reduce_scatter_tensor(changed, torch.ones(world_size), async_op=True)
        changed.div_(2)  # before the wait: recorded, and the wait's results replace it
        work.wait()
        out["poisoned"] = (shown, kept.tolist(), changed.tolist(),
                           [(c.waits, c.futures, c.done_seen, c.written_early) for c in wire.calls])
    # poisoned, the handle keeps the real Work's ways to be waited for: gloo's reduce-scatter has no Future, and is
    # not complete before its wait() (trial 6: a Future waited for passed here and raised in training)
    with Wire(poison=True):
        piece = torch.zeros(1)
        work = dist.reduce_scatter_tensor(piece, torch.ones(world_size), async_op=True)
        try:
            work.get_future()
            future = "a Future"
        except RuntimeError as error:
            future = str(error)
        polled = [work.is_completed() for _ in range(3)]
        work.wait()
        out["reduce_scatter"] = (future, polled, piece.isnan().any().item(), work.is_completed())
    # gloo's own Works, no wire: what gloo_wait_only says of them. A reduce-scatter's: no Future, and not completed
    # though the barrier behind it has run, nor after its wait()
    work = dist.reduce_scatter_tensor(torch.zeros(1), torch.ones(world_size), async_op=True)
    dist.barrier()
    out["gloo"] = [_future_of(work), work.is_completed(), work.wait(), work.is_completed()]
    # a message's: no Future, and not completed though the message is there, until its wait()
    got = torch.zeros(3)
    work = dist.isend(torch.full((3,), 7.0), peer) if rank == 0 else dist.irecv(got, peer)
    deadline = time.monotonic() + 10
    while rank == 1 and got[-1].item() != 7.0 and time.monotonic() < deadline:
        time.sleep(0.001)
    out["gloo"] += [_future_of(work), got[-1].item() == 7.0 or rank == 0, work.is_completed(), work.wait(),
                    work.is_completed()]
    # check: a call it refuses never runs, and the wire is put back all the same
    def refuse_the_world(call, group):
        if group is None:
            raise ValueError(f"{call.kind} over the world")
    try:
        with Wire(check=refuse_the_world):
            dist.all_reduce(torch.ones(1))
    except ValueError as error:
        out["refused"] = str(error)
    out["restored"] = dist.all_reduce.__name__
    return out


def test_the_wire_records_every_kind_its_size_its_handle_and_its_waits():
    results = run_ranks(_everything, 2, None, timeout=30)
    for rank, out in enumerate(results):
        peer = 1 - rank
        calls = out["calls"]
        kinds = [c[1] for c in calls]
        assert kinds[:7] == ["all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                             "reduce_scatter_tensor", "reduce", "all_gather_object"], kinds
        step, _, dtype, numel, shape, tensors, first, async_op, op, size, waits, _ = calls[0]
        assert (step, dtype, numel, shape, tensors, async_op, op, size, waits) == (
            "collectives", torch.float32, 6, (2, 3), [("float32", 6)], False, dist.ReduceOp.MAX, 2, 0), calls[0]
        assert calls[1][2:4] == (torch.int64, 4) and calls[1][8] is None  # no reduce op
        # a gather sends its input (the dtype and size a task chose); every tensor is there too,
        # and the first argument's (the output, for reduce_scatter_tensor: each view for its test)
        assert calls[2][2:4] == (torch.float32, 3) and calls[2][5] == [("float32", 3)] * 3, calls[2]
        assert calls[3][2:4] == (torch.float64, 2) and calls[3][5] == [("float64", 4), ("float64", 2)], calls[3]
        assert calls[3][6] == ("float64", 4), calls[3]
        assert calls[4][2:4] == (torch.float32, 5) and calls[4][6] == ("float32", 5), calls[4]
        assert calls[5][2:4] == (torch.float32, 7), calls[5]
        assert calls[6][2:4] == (None, 0) and calls[6][6] == ("object", 0), calls[6]
        # messages: named by the call that sent them, the peer a global rank, dist.recv's too
        messages = [(c[0], c[1], c[2], c[3], c[7], c[11]) for c in calls if c[0] == "messages"]
        blocking = [("messages", "send", torch.float32, 3, False, peer),
                    ("messages", "recv", torch.float64, 2, False, peer)]
        if rank:
            blocking = [("messages", "recv", torch.float32, 3, False, peer),
                        ("messages", "send", torch.float64, 2, False, peer)]
        batched = [("messages", "isend", torch.float32, 4, True, peer),
                   ("messages", "irecv", torch.float32, 4, True, peer)]
        assert messages == blocking + (batched if rank == 0 else batched[::-1]), messages
        # async: both launched; the kept one waited on twice, the other never (its Future is not its handle)
        assert [c[1:4] + (c[7], c[10]) for c in calls if c[0] == "async"] == [
            ("all_reduce", torch.float32, 6, True, 2), ("all_reduce", torch.float32, 8, True, 0)], calls
        assert out["events"][-4:] == [("launch", 6, True), ("launch", 8, True), ("wait", 6), ("wait", 6)], out["events"]
        assert out["taken"] == [(c[1], dtype_name(c[2]), c[3]) for c in calls], out["taken"]
        assert out["off"] == ([], [2.0, 2.0]), out["off"]
        before_wait, after_wait, at_exit = out["deferred"][:3], out["deferred"][3:6], out["deferred"][6:]
        assert before_wait == [[float(rank)] * 2, [float(rank)] * 3, False], out["deferred"]
        assert after_wait == [[1.0] * 2, [float(rank)] * 3, False], out["deferred"]  # the first only
        assert at_exit == [[1.0] * 3, [(True, 1), (True, 0)]], out["deferred"]
        gathered = [float(r) for r in range(2) for _ in range(2)]
        assert out["poisoned"] == ([(True, gathered)] * 3, [2.0], [2.0],
                                   [(1, 0, False, False), (0, 1, False, False), (0, 0, True, False),
                                    (0, 0, False, False), (1, 0, False, True)]), out["poisoned"]
        assert out["reduce_scatter"] == ("Work::getFuture not implemented.", [False] * 3, False, False), (
            out["reduce_scatter"])
        # the facts gloo_wait_only tells (torch 2.14.1): if a new torch changes them, its sentence must change too
        none = "Work::getFuture not implemented."
        assert out["gloo"] == [none, False, True, False, none, True, False, True, True], out["gloo"]
        assert NO_FUTURE in none and "never says True" in gloo_wait_only("reduce_scatter_tensor")
        assert "only once their wait() has run" in gloo_wait_only("irecv") == gloo_wait_only("isend")
        assert out["refused"] == "all_reduce over the world" and out["restored"] == "all_reduce", out
