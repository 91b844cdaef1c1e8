"""What goes on the wire in a rank: one recorder for every test.

    with Wire() as wire:            # torch.distributed's functions wrapped, put back on exit
        ...                         # the code under test
    wire.calls                      # a Call per collective or message, in order
    wire.take()                     # (kind, dtype, numel) of the calls since the last take()
    wire.events                     # ("launch", numel, async_op), ("wait", numel) and marks, in order
    Wire(poison=True)               # an asynchronous gather's outputs hold NaN until it is waited for

Collectives are recorded where the code under test calls them, torch.distributed's functions
(dist.all_reduce, ...: PyTorch's own helpers such as PeriodicModelAverager call them too).
Point-to-point messages are recorded where every way of sending ends up, ProcessGroup.send and
ProcessGroup.recv: dist.isend, dist.send, dist.irecv, dist.recv and dist.batch_isend_irecv all call
them. dist.isend and dist.irecv stay PyTorch's own functions, which P2POp checks its op against;
dist.send and dist.recv are wrapped to name the call. An asynchronous collective returns a Handle,
which counts its wait() calls. Used in a rank's own process (the harness's spawned ranks).
"""
import datetime
import inspect
import linecache
from dataclasses import dataclass

import torch
import torch.distributed as dist

# every collective a task could send its tensors with (the old names and torch 2.14's new ones)
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_single",
               "_all_gather_base", "all_gather_object", "reduce_scatter_tensor", "reduce_scatter_single",
               "reduce_scatter", "_reduce_scatter_base", "broadcast", "broadcast_object_list", "reduce", "gather",
               "scatter", "all_to_all_single", "all_to_all")
MESSAGES = ("send", "recv", "isend", "irecv")
GATHERS = ("all_gather", "all_gather_into_tensor")  # what such a call sends is its last tensor, the input
# the collectives whose outputs are not their input, by the argument that holds them (Wire's poison)
OUTPUTS = {"all_gather": "tensor_list", "all_gather_into_tensor": "output_tensor", "reduce_scatter": "output",
           "reduce_scatter_tensor": "output"}


def dtype_name(dtype):
    """torch.float32 -> "float32"; None (a Python object sent) -> "object"."""
    return "object" if dtype is None else str(dtype).replace("torch.", "")


@dataclass
class Call:
    kind: str  # the function: "all_reduce", ..., "send", "isend", "recv", "irecv"
    dtype: torch.dtype  # of the tensor it sends: a gather's input, else its first tensor; None: objects
    numel: int
    shape: tuple
    tensors: list  # (dtype name, numel) of every tensor it was given, in order: a gather's outputs too
    first: tuple  # (dtype name, numel) of its first argument (a list's first tensor); ("object", 0): not a tensor
    async_op: bool
    op: object  # the ReduceOp, or None
    group_size: int  # the ranks it runs over
    step: object = None  # wire.step when it was called: a test's label
    waits: int = 0  # wait() calls on its Handle
    # the other ways to wait for it: its Future taken (get_future().wait(), torch.futures.wait_all), or polled
    # until is_completed() said True
    futures: int = 0
    done_seen: bool = False
    deferred: bool = False  # held back until its wait() or the wire's flush() (Wire's defer)
    written_early: bool = False  # poisoned: its outputs were changed in place before its results came (Wire's poison)
    peer: int = None  # a message's other end, a global rank (None: any source)
    requires_grad: bool = False

    @property
    def sent(self):
        """(kind, dtype name, numel)."""
        return self.kind, dtype_name(self.dtype), self.numel

    @property
    def waited(self):
        """Whether its result was waited for: a blocking call, or an asynchronous one whose Handle's wait() was
        called, whose Future was taken (get_future().wait(), torch.futures.wait_all) or polled until is_completed()
        said True."""
        return not self.async_op or bool(self.waits or self.futures or self.done_seen)


def _tensors(values):
    return [t for v in values for t in (v if isinstance(v, (list, tuple)) else [v]) if torch.is_tensor(t)]


def _first(args, kwargs):
    first = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(first, (list, tuple)) and first and torch.is_tensor(first[0]):
        first = first[0]
    return (dtype_name(first.dtype), first.numel()) if torch.is_tensor(first) else ("object", 0)


def _version(tensor):
    """The tensor's version counter (every in-place change, its views' too, moves it); None: it keeps none."""
    try:
        return tensor._version
    except RuntimeError:  # an inference-mode tensor
        return None


def _poisonable_outputs(kind, given):
    """The output tensors of a collective whose outputs are not its input (OUTPUTS), from its bound arguments, where
    all are floating-point (NaN can show in them); else []: the call runs as it is."""
    out = given.arguments.get(OUTPUTS.get(kind))
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    return out if out and all(torch.is_tensor(t) and t.is_floating_point() for t in out) else []


def _size(group):
    try:
        return dist.get_world_size(group)
    except (RuntimeError, ValueError, TypeError, AttributeError):  # not a group: the collective itself says so
        return -1


class Wire:
    """Records, while `on`, the calls of `kinds` (default every collective and message).

    defer=True: an asynchronous collective does not run until its wait() or flush(), so that a
    Future complete before then was completed by hand. poison=True: an asynchronous all-gather or
    reduce-scatter runs at once into buffers of the wire's own, and the caller's (floating-point)
    outputs hold NaN until its wait(), its Future taken, or is_completed() (each where the real Work
    has it: gloo's reduce-scatter has neither, gloo_wait_only): an output read before
    the wait shows as NaN every time, not by the luck of a race, and one changed in place before it is
    recorded (the Call's written_early). check(call, group), if given, runs before
    each call (raise to refuse it). recv_limit: a blocking dist.recv waits at most this many
    seconds, then raises never_came(src, tensor)."""

    def __init__(self, kinds=COLLECTIVES + MESSAGES, defer=False, check=None, recv_limit=None, never_came=None,
                 poison=False):
        self.kinds, self.defer, self.check, self.poison = kinds, defer, check, poison
        self.recv_limit, self.never_came = recv_limit, never_came
        self.calls, self.events = [], []
        self.handles = []  # what the asynchronous collectives returned, in launch order
        self.works = []  # the messages' Works, as ProcessGroup.send returned them
        self.on, self.step, self.taken = True, None, 0
        self.pending = []  # deferred collectives: (run, future)
        self.saved = {}
        self.blocking = None  # "send" or "recv" while inside dist.send / dist.recv

    # ---------------------------------------------------------------- views
    def take(self):
        """What each call since the last take() sent: [(kind, dtype name, numel)]."""
        calls, self.taken = self.calls[self.taken:], len(self.calls)
        return [call.sent for call in calls]

    def mark(self, what):
        self.events.append((what,))

    def launches(self):
        return [e for e in self.events if e[0] == "launch"]

    # ---------------------------------------------------------------- patching
    def __enter__(self):
        for kind in self.kinds:
            if kind in COLLECTIVES and hasattr(dist, kind):
                self.saved[(dist, kind)] = getattr(dist, kind)
                setattr(dist, kind, self._collective(kind, getattr(dist, kind)))
        if set(self.kinds) & set(MESSAGES):
            self._patch_messages()
        return self

    def __exit__(self, *exc):
        try:
            self.flush()
        finally:
            for (owner, name), original in self.saved.items():
                setattr(owner, name, original)
            self.saved = {}

    def _collective(self, kind, real):
        signature = inspect.signature(real)

        def collective(*args, **kwargs):
            try:
                given = signature.bind(*args, **kwargs)
            except TypeError:  # PyTorch's own error says what is wrong with the call
                return real(*args, **kwargs)
            given.apply_defaults()
            group, async_op = given.arguments.get("group"), bool(given.arguments.get("async_op", False))
            every = _tensors(list(args) + list(kwargs.values()))
            mine = _tensors(args[:2]) or every  # the tensors it was called with (as every course answer calls it)
            sent = (mine[-1] if kind in GATHERS else mine[0]) if mine else None
            call = Call(kind, None if sent is None else sent.dtype, 0 if sent is None else sent.numel(),
                        () if sent is None else tuple(sent.shape), [(dtype_name(t.dtype), t.numel()) for t in every],
                        _first(args, kwargs), async_op, given.arguments.get("op"), _size(group), self.step)
            if self.check is not None:
                self.check(call, group)
            if not self.on:
                return real(*args, **kwargs)
            self.calls.append(call)
            self.events.append(("launch", call.numel, async_op))
            if async_op and self.defer:
                call.deferred = True
                future = torch.futures.Future()
                given.arguments["async_op"] = False
                self.pending.append((lambda: real(*given.args, **given.kwargs), future, sent))
                return self._handle(call, None, future)
            outputs = _poisonable_outputs(kind, given) if async_op and self.poison else []
            if outputs:
                return self._poisoned(call, real, given, outputs)
            work = real(*args, **kwargs)
            return None if work is None else self._handle(call, work)
        return collective

    def _handle(self, call, work, future=None, deliver=None):
        handle = Handle(self, call, work, future, deliver)
        self.handles.append(handle)
        return handle

    def _poisoned(self, call, real, given, outputs):
        """Run the collective now into tensors of the wire's own, and wait for it; NaN in the caller's outputs until
        its handle delivers the results (wait(), get_future(), is_completed()). The handle keeps the real Work, and
        so its ways to be waited for: gloo's reduce-scatter only by its wait() (gloo_wait_only)."""
        own = [torch.empty_like(t) for t in outputs]
        name = OUTPUTS[call.kind]
        given.arguments[name] = own if isinstance(given.arguments[name], (list, tuple)) else own[0]
        work = real(*given.args, **given.kwargs)  # async_op=True, as the caller asked
        work.wait()
        for t in outputs:
            t.fill_(float("nan"))
        versions = [_version(t) for t in outputs]  # an in-place change before the wait moves it (NaN / 2 is NaN)

        def deliver():
            call.written_early = any(v is not None and _version(t) != v for t, v in zip(outputs, versions))
            for t, result in zip(outputs, own):
                t.copy_(result)
            return outputs
        return self._handle(call, work, None, deliver)

    def run_until(self, future):
        """Run the deferred collectives, in their order, up to the one of `future`."""
        while any(f is future for _, f, _ in self.pending):
            run, done, tensor = self.pending.pop(0)
            run()
            done.set_result([tensor])

    def flush(self):
        self.defer = False  # what the callbacks start now runs at once
        while self.pending:
            self.run_until(self.pending[-1][1])

    def _patch_messages(self):
        from torch._C._distributed_c10d import ProcessGroup
        # the class's own entries (vars, not getattr): put back as they were, they bind to the group again
        for name in ("send", "recv", "recv_anysource"):
            self.saved[(ProcessGroup, name)] = vars(ProcessGroup)[name]
        self.saved.update({(dist, name): getattr(dist, name) for name in ("send", "recv")})
        pg_send, pg_recv, pg_any, dist_send, dist_recv = (self.saved[key] for key in (
            (ProcessGroup, "send"), (ProcessGroup, "recv"), (ProcessGroup, "recv_anysource"), (dist, "send"),
            (dist, "recv")))

        def message(kind, group, tensors, peer):
            name = self.blocking if self.blocking == kind else "i" + kind
            if peer is not None:
                peer = dist.get_global_rank(group, peer)
            for tensor in tensors:
                call = Call(name, tensor.dtype, tensor.numel(), tuple(tensor.shape),
                            [(dtype_name(tensor.dtype), tensor.numel())], (dtype_name(tensor.dtype), tensor.numel()),
                            name.startswith("i"), None, group.size(),
                            self.step, peer=peer, requires_grad=tensor.requires_grad)
                if self.check is not None:
                    self.check(call, group)
                if self.on:
                    self.calls.append(call)

        def send(group, tensors, dst, *args, **kwargs):
            message("send", group, tensors, dst)
            work = pg_send(group, tensors, dst, *args, **kwargs)
            self.works.append(work)
            return work

        def recv(group, tensors, src, *args, **kwargs):
            message("recv", group, tensors, src)
            return pg_recv(group, tensors, src, *args, **kwargs)

        def recv_anysource(group, tensors, *args, **kwargs):
            message("recv", group, tensors, None)
            return pg_any(group, tensors, *args, **kwargs)

        def blocking_send(tensor, *args, **kwargs):
            self.blocking = "send"
            try:
                return dist_send(tensor, *args, **kwargs)
            finally:
                self.blocking = None

        def blocking_recv(tensor, src=None, group=None, tag=0, **kwargs):
            self.blocking = "recv"
            try:
                if self.recv_limit is None:
                    return dist_recv(tensor, src=src, group=group, tag=tag, **kwargs)
                work = dist.irecv(tensor, src=src, group=group, tag=tag, **kwargs)
            finally:
                self.blocking = None
            if work is None:
                return -1
            try:
                work.wait(datetime.timedelta(seconds=self.recv_limit))
            except RuntimeError as error:
                if "Timed out" not in str(error):
                    raise
                raise self.never_came(src, tensor) from None
            return src

        ProcessGroup.send, ProcessGroup.recv, ProcessGroup.recv_anysource = send, recv, recv_anysource
        dist.send, dist.recv = blocking_send, blocking_recv


# gloo's Works that only their wait() can wait for (torch 2.14.1, measured: tests/test_wire.py checks it): those of
# point-to-point messages and of a reduce-scatter have no Future, and is_completed() on them says True only once their
# wait() has run (a message's, even after it has arrived) or never (a reduce-scatter's, not even after its wait())
NO_FUTURE = "getFuture not implemented"  # in what get_future() raises on them: "Work::getFuture not implemented."
POLLED_FOREVER = 100_000  # is_completed() calls on a Work that only its wait() completes: a loop, not a check
REDUCE_SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base")


def gloo_wait_only(kind):
    """Why gloo's Work of `kind` (a Call's kind: "isend", "irecv", "send", "recv" for a point-to-point message;
    "reduce_scatter", "reduce_scatter_tensor", ... for a reduce-scatter) can be waited for by its wait() only: one
    sentence, for any message that meets a get_future() that raised or a loop on is_completed(); what to call instead
    is the caller's to add, after a colon."""
    if kind in MESSAGES:
        return ("gloo's point-to-point Works have no Future (get_future() raises on a dist.isend's or dist.irecv's "
                "Work), and polled with is_completed() they say True only once their wait() has run, even after the "
                "message has arrived, so neither a Future nor a loop on is_completed() can wait for them")
    if kind in REDUCE_SCATTERS:
        return ("gloo's reduce-scatter Work has no Future (get_future() raises), and polled with is_completed() it "
                "never says True, not even after its wait() has run, so neither a Future nor a loop on is_completed() "
                "can wait for it")
    raise ValueError(f"gloo's Work of {kind} has a Future and completes on its own")


def polls_is_completed(path, line):
    """Whether line `line` of `path` (a frame in a hang report's stack), or the line before it (the `while` whose
    body it is: the dump may show either), calls is_completed(): a rank stuck in a loop that gloo_wait_only says
    never ends."""
    return any("is_completed(" in linecache.getline(path, n) for n in (line, line - 1))


class Handle:
    """What an asynchronous collective returns on the wire: its Work (or, deferred, a Future the
    wire completes), counting the wait() calls in its Call and in the wire's events."""

    def __init__(self, wire, call, work, future=None, deliver=None):
        self.wire, self.call, self.work, self.future = wire, call, work, future
        self.deliver, self.delivered = deliver, None  # a poisoned collective's: fills the outputs, once

    def _deliver(self):
        if self.delivered is None:
            self.delivered = self.deliver()
        return self.delivered

    @property
    def waits(self):
        return self.call.waits

    def wait(self, *args, **kwargs):
        self.call.waits += 1
        self.wire.events.append(("wait", self.call.numel))
        if self.deliver is not None:
            self._deliver()
            return True
        if self.work is None:
            self.wire.run_until(self.future)
            return True
        return self.work.wait(*args, **kwargs)

    def _has_future(self):
        """Whether the real Work has a Future (gloo's reduce-scatter and point-to-point Works have none)."""
        try:
            self.work.get_future()
        except RuntimeError as error:
            if NO_FUTURE not in str(error):
                raise
            return False
        return True

    def get_future(self):
        self.call.futures += 1
        if self.deliver is not None:
            self.work.get_future()  # raises where the real Work has no Future, as the caller's code would see
            future = torch.futures.Future()
            future.set_result(self._deliver())
            return future
        return self.future if self.work is None else self.work.get_future()

    def is_completed(self):
        if self.deliver is not None and not self._has_future():
            # gloo's Works without a Future cannot be waited for by is_completed() (gloo_wait_only): it says what the
            # real Work says, False before its wait() (the results are not delivered) and, after it, False still (a
            # reduce-scatter's), so that a loop polling it never ends, here as there
            done = self.delivered is not None and self.work.is_completed()
            if not done:
                self.polls = getattr(self, "polls", 0) + 1
                if self.polls == POLLED_FOREVER:  # said in the rank, at once: there the loop hangs to the time limit
                    raise RuntimeError(
                        f"is_completed() polled {POLLED_FOREVER} times on an asynchronous {self.call.kind}'s Work"
                        + (" before its wait()" if self.delivered is None else " after its wait()") +
                        f": {gloo_wait_only(self.call.kind)}; wait for it with work.wait(), once, and do not poll it")
            self.call.done_seen = self.call.done_seen or done
            return done
        if self.deliver is not None:
            self._deliver()
            self.call.done_seen = True
            return True
        done = self.future.done() if self.work is None else self.work.is_completed()
        self.call.done_seen = self.call.done_seen or done
        return done

    def __getattr__(self, name):  # the Work's own
        return getattr(self.work, name)
