"""Task 10: pipeline parallelism (template_pipeline.py).

    pytest --impl template -m task10_1     # one task; python check.py 10 for all seven

The course's CNN, cut into 2 or 4 stages on as many gloo ranks, trains one batch in M
micro-batches; its loss and every gradient are compared with two independent references:
single-process training on the whole batch, and PyTorch's own torch.distributed.pipelining
(PipelineStage with ScheduleGPipe or Schedule1F1B) on the same split. Every point-to-point
message is recorded (direction, peer, shape, dtype), and the traces must be the schedules'
orders. The tests of one task take solutions/' answers to the other tasks (judging), so a
mistake costs one task's points.

Tolerance: the pipeline adds M losses each scaled by 1/M, and PyTorch's schedules divide the
summed gradients by M, where single-process training takes one mean: the same fp32 numbers
added in another order, which moves the results by a few units in the 7th digit. atol 1e-5
with rtol 1e-4 allows that, and nothing a mistake does (a missing 1/M doubles everything at M=2).
"""
import collections.abc
import contextlib
import functools
import gc
import inspect
import linecache
import math
import re
import sys
import time
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from conftest import HAS_SOLUTIONS, REFERENCE, load, load_with_reference, with_globals
from harness import RankFailed, RankTimeout, one_line, run_ranks
from wire import MESSAGES, NO_FUTURE, Wire, dtype_name, gloo_wait_only, polls_is_completed

T101 = "Task 10.1 (template_pipeline.py, partition)"
T102 = "Task 10.2 (template_pipeline.py, Stage._send)"
T103 = "Task 10.3 (template_pipeline.py, Stage._recv)"
T104 = "Task 10.4 (template_pipeline.py, forward_step)"
T105 = "Task 10.5 (template_pipeline.py, backward_step)"
T106 = "Task 10.6 (template_pipeline.py, gpipe_step)"
T107 = "Task 10.7 (template_pipeline.py, one_f_one_b_step)"
WHERE = {"10.1": T101, "10.2": T102, "10.3": T103, "10.4": T104, "10.5": T105, "10.6": T106, "10.7": T107}

ANSWERS = {"10.1": "partition", "10.2": "Stage._send", "10.3": "Stage._recv", "10.4": "forward_step",
           "10.5": "backward_step", "10.6": "gpipe_step", "10.7": "one_f_one_b_step"}

BATCH = 8
ATOL, RTOL = 1e-5, 1e-4


def judging(impl, task):
    """template_pipeline of `impl` for the tests of `task`: your answer to that task, solutions/' to
    the others, so that a wrong _recv (10.3) costs Task 10.3's points, not also those of 10.4-10.7.
    An answer still unfilled raises its NotImplementedError here, before any rank starts (a second
    a test saved, on the day every task is unfilled)."""
    lib = load_with_reference(impl, "template_pipeline", *(a for t, a in ANSWERS.items() if t != task))
    owner, _, name = ANSWERS[task].rpartition(".")
    source = inspect.getsource(getattr(getattr(lib, owner) if owner else lib, name))
    unfilled = re.search(r'raise NotImplementedError\("(Task 10\.\d+:[^"]*)"\)', source)
    if unfilled:
        raise NotImplementedError(unfilled.group(1))
    return lib


def slow(*values):
    return pytest.param(*values, marks=pytest.mark.slow)


def expected_ranges(num_layers, num_stages):
    """The balanced split, computed here on its own: sizes differ by one, the first stages larger."""
    sizes = [num_layers // num_stages + (1 if s < num_layers % num_stages else 0) for s in range(num_stages)]
    starts = [sum(sizes[:s]) for s in range(num_stages)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


def expected_trace(schedule, num_stages, stage, num_microbatches):
    """The order of forwards and backwards each schedule runs on a stage."""
    m = num_microbatches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(num_stages - stage - 1, m)
    trace = [("F", i) for i in range(warmup)]
    for i in range(warmup, m):
        trace += [("F", i), ("B", i - warmup)]
    return trace + [("B", i) for i in range(m - warmup, m)]


def peak_stored(trace):
    """The most micro-batches whose forward ran and whose backward had not yet, at any moment."""
    stored = peak = 0
    for kind, _ in trace:
        stored += 1 if kind == "F" else -1
        peak = max(peak, stored)
    return peak


def batch(seed=1, size=BATCH):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(size, 3, 32, 32, generator=g), torch.randint(0, 10, (size,), generator=g)


def reference_gradients(inputs, targets, seed=0):
    """Single-process training on the whole batch: the loss and {layer index: [gradients]}."""
    torch.manual_seed(seed)
    model = load("solutions", "template_pipeline").flat_cnn()  # given code (not a task): how the CNN is laid flat
    loss = F.cross_entropy(model(inputs), targets)
    loss.backward()
    return loss.item(), {i: [p.grad.clone() for p in layer.parameters()] for i, layer in enumerate(model)}


# ----------------------------------------------------------------------- recording what goes on the wire
# A blocking receive in the tests waits at most this long for its message. What a neighbour does
# before it sends (a micro-batch of the CNN) takes milliseconds, under a second at a load average
# of 15 on 2 cores, so a message 10 s late never comes: the receive that waits for it is named at
# once, as a failure with its likely cause, not as a hang after the test's whole limit (40 s, which
# check.py then runs a second time, as a hang can be the machine's doing). Shorter than the
# round-trip test's limit (15 s), so that this, not the harness's hang report, says what happened.
RECV_LIMIT = 10.0


class RecvNeverCame(RuntimeError):
    """A blocking dist.recv in a test waited RECV_LIMIT seconds for its message."""


class WrongPeer(RuntimeError):
    """A send to another rank than the peer it was given (said by the sender, at once)."""


class WorkNotKept(RuntimeError):
    """A send whose Work _send did not keep in stage.pending_sends (said by the sender, at once)."""


# why _send keeps every Work it starts (WorkNotKept's messages)
DROPPED_WORK = (" (a Work nobody keeps is cancelled when it is garbage-collected, and the neighbour waits for a "
                "message that never comes)")
KEEP_APPENDING = "append to stage.pending_sends; do not replace or empty it" + DROPPED_WORK


class RecvNotWaited(RuntimeError):
    """A receive that returned before its message arrived: its dist.irecv's Work was never waited on (said by the
    receiver, at once: a dropped Work is cancelled, and its neighbour's send then never completes)."""


@contextlib.contextmanager
def receives_waited(rank, what):
    """Within it, every receive's Work must be waited on: RecvNotWaited at its end, naming `what` (the Works are
    kept until then, so that none is cancelled before it is seen)."""
    from torch._C._distributed_c10d import ProcessGroup, Work
    recv, wait = vars(ProcessGroup)["recv"], vars(Work)["wait"]
    started, waited = [], set()

    def kept_recv(group, tensors, src, *args, **kwargs):
        work = recv(group, tensors, src, *args, **kwargs)
        started.append(work)
        return work

    def counted_wait(work, *args, **kwargs):
        waited.add(id(work))
        return wait(work, *args, **kwargs)
    ProcessGroup.recv, Work.wait = kept_recv, counted_wait
    try:
        yield
    finally:
        ProcessGroup.recv, Work.wait = recv, wait
    if any(id(work) not in waited for work in started):
        raise RecvNotWaited(f"rank {rank}'s {what} returned before its message arrived: _recv started dist.irecv and "
                            "never waited on its Work, so the tensor it returned may not hold the message yet; wait "
                            "for it before returning (dist.irecv(...).wait(), or the blocking dist.recv)")


class SentBeforeShapes(RuntimeError):
    """A stage of a schedule that sent before it called stage.learn_shapes (said by the sender, at once: the next
    stage's learn_shapes would receive that message as its shape message, and gloo aborts on its size)."""


class AnySource(RuntimeError):
    """A receive in a schedule from rank None: from any source, where the stage has no such neighbour."""


class WrongOutput(RuntimeError):
    """A stage's output sent in another shape than its layers give (said by the sender, before it sends)."""


class TooManyForwards(RuntimeError):
    """A schedule's forward started after all M had run (said by that stage, before it waits in vain)."""


class XNotTheInput(RuntimeError):
    """A later stage's forward_step that computed with x and never received its input (said by that stage)."""


class WrongShape(RuntimeError):
    """A receive into a buffer of another shape than the message's (refused before gloo sees it: gloo aborts)."""


class WrongDtype(RuntimeError):
    """A receive into a buffer of another dtype than the one asked for (refused before gloo sees it)."""


# What a receive waits for, by the course's function it waits in (frames_up, waiting_in)
RECEIVING = {"recv_backward": "the gradient of its output (recv_backward)",
             "recv_forward": "an activation (recv_forward)",
             "learn_shapes": "the shape message of learn_shapes"}


def messages_wire(expect_dtype=None, shapes=None, learned=None):
    """A Wire recording every point-to-point message of a rank (wire.py says where), on which a
    blocking dist.recv gives up after RECV_LIMIT seconds with RecvNeverCame, saying where it waited;
    with expect_dtype, a receive into a buffer of another dtype raises WrongDtype; with shapes
    ({peer: [the shapes its messages have]}), a receive of another size raises WrongShape; with
    learned (a list, empty until the stage calls learn_shapes), a send before it raises SentBeforeShapes."""
    def check(call, group):
        if learned is not None and not learned and call.kind in ("send", "isend"):
            raise SentBeforeShapes(
                f"rank {dist.get_rank()} sent a message of shape {call.shape} to rank {call.peer} before it called "
                "stage.learn_shapes: the next stage's learn_shapes receives a shape message first, and learn_shapes "
                "is what sends it, so every stage, the first included, calls stage.learn_shapes(inputs, M) before "
                "its first forward (the next stage would receive this message as its shape message: gloo aborts "
                "on a message of another size)")
        if expect_dtype is not None and call.kind in ("recv", "irecv") and call.dtype != expect_dtype:
            raise WrongDtype(f"asked to receive {expect_dtype}, it received into a {call.dtype} "
                             f"buffer of shape {call.shape}")
        if shapes is not None and call.kind in ("recv", "irecv") and call.peer is None:
            what = RECEIVING.get(waiting_in(sys._getframe(2)), "a message")
            raise AnySource(f"rank {dist.get_rank()} asked to receive {what} from rank None, from any source: this "
                            "stage has no such neighbour")
        if shapes and call.kind in ("recv", "irecv") and call.peer in shapes and math.prod(call.shape) not in [
                math.prod(shape) for shape in shapes[call.peer]]:  # a buffer of the same size but another shape is
            # right (received flat, then viewed): gloo aborts on the size only
            what = RECEIVING.get(waiting_in(sys._getframe(2)), "a message")
            raise WrongShape(f"rank {dist.get_rank()} asked to receive {what} of shape {call.shape} from rank "
                             f"{call.peer}, whose messages have the shape {' or '.join(map(str, shapes[call.peer]))}"
                             f" (gloo aborts the process on a buffer of another size than the message)")
    return Wire(MESSAGES, check=check, recv_limit=RECV_LIMIT, never_came=never_came)


def records_of(wire):
    """Every message, as (call, peer, shape, dtype, requires_grad), peer a global rank."""
    return [(c.kind, c.peer, c.shape, dtype_name(c.dtype), c.requires_grad) for c in wire.calls]


def patient(fn):
    """For a rank function: a rank whose neighbour's receive gave up (RecvNeverCame: gloo then closes
    their connection) fails with "Connection closed by peer"; it waits a moment before failing, so
    that the neighbour's report, which says what never came, is the one the test reads."""
    @functools.wraps(fn)
    def rank_function(*args):
        try:
            return fn(*args)
        except RuntimeError as error:
            if re.search(r"Connection (closed|reset) by peer|pair closure", str(error)):
                time.sleep(3)
            raise
    return rank_function


def never_came(src, tensor):
    """For a receive that never completed, RecvNeverCame saying what it waited for: from whom, in which
    function of the course."""
    names = frames_up(sys._getframe(2))  # from the caller of dist.recv
    inside = next((n for n in names if n in ("recv_backward", "recv_forward", "learn_shapes")), None)
    what = RECEIVING.get(inside, "a message")
    where = progress()
    if where and inside == "recv_forward" or (where and inside == "recv_backward" and not warmup_hint(
            "10.7", f"recv_backward {where}")):
        time.sleep(2)  # not proven wrong here: a neighbour whose counts show its mistake reports first
    return RecvNeverCame(f"rank {dist.get_rank()} waited {RECV_LIMIT:.0f} s to receive {what} of shape "
                         f"{tuple(tensor.shape)} from rank {src}, which never sent it "
                         f"(waiting in {' <- '.join(names)}{'; ' + where if where else ''})")


def frames_up(frame):
    """The names of the functions from `frame` up to the test's own code (the test's wrappers of the course's
    functions skipped: Alive and _schedule_run's counters)."""
    names = []
    while frame is not None and (frame.f_code.co_filename != __file__ or frame.f_code.co_name in WRAPPERS):
        if frame.f_code.co_filename != __file__:
            names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names


WRAPPERS = ("__call__", "counted_backward", "kept_send_forward", "kept_recv_backward", "counted_learn_shapes")


def waiting_in(frame):
    return next((n for n in frames_up(frame) if n in ("recv_backward", "recv_forward", "learn_shapes")), None)


# A receive that waits for a message never sent: the likely cause, by task and by where it waited.
NEVER_SENT = {
    ("10.4", "recv_forward"): "forward_step must send its output to the next stage (stage.send_forward(output)) "
                              "on every stage but the last",
    ("10.5", "recv_backward"): "backward_step must send the gradient of its input back to the previous stage "
                               "(stage.send_backward(input.grad)) on every stage but the first",
    ("10.6", None): "every stage must run the forward and the backward of each of the M micro-batches, in the "
                    "schedule's order (each receive has its neighbour's matching send)",
    ("10.7", None): "every stage must run the forward and the backward of each of the M micro-batches, in the "
                    "schedule's order (each receive has its neighbour's matching send)",
}


def never_sent_hint(task, text):
    """The hint for a receive that never completed, from RecvNeverCame's message (where it waited);
    None where the task's own explanation fits better (10.2, 10.3: _send's Work)."""
    waits = re.findall(r"(recv_backward|recv_forward)", text)
    for place in waits + [None]:
        if (task, place) in NEVER_SENT:
            return NEVER_SENT[(task, place)]
    return None


# Where a stuck rank waits (from the harness's stack dump), and what that says about the judged task.
WAITS_FOR = {
    "10.2": "every send must start (dist.isend) and its Work be kept in stage.pending_sends: a Work nobody keeps "
            "is cancelled, and the neighbour waits for a message that never comes",
    "10.3": "_recv must receive exactly one message, from `peer` (the global rank it is given), into a tensor of "
            "the shape and dtype it is given, and return once it has arrived",
    "10.6": NEVER_SENT[("10.6", None)], "10.7": NEVER_SENT[("10.7", None)],
}


# a point-to-point Work waited for otherwise than by its wait() (trial 6: told "the message never came", or a raw
# RuntimeError), and what to call instead
WAIT_ONLY = (f"{gloo_wait_only('irecv')}: call work.wait() on each (dist.irecv(...).wait()), or receive with the "
             "blocking dist.recv")


def _polls_completion(frames, ours):
    """Whether the innermost course frame of a stuck rank is a loop on is_completed()."""
    path = next(p for p, line, _ in frames if p.rsplit("/", 1)[-1].startswith("template_"))
    return polls_is_completed(path, int(ours[0][0]))


def hang_hint(task, text):
    """What the stuck ranks of a RankTimeout's report wait for, said for the judged task: a blocking send,
    a receive whose message never comes, sends that are never received, or no message at all (a loop)."""
    said, hints = {}, []  # what a rank does -> the ranks doing it; the likely causes, each once
    for rank, block in re.findall(r"rank (\d+) was at:(.*?)(?=rank \d+ was at:|\Z)", text, re.DOTALL):
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\w+)', block)
        names = [name for _, _, name in frames]
        ours = [(line, name) for path, line, name in frames if path.rsplit("/", 1)[-1].startswith("template_")]
        at = f"{ours[0][1]}() (template_pipeline.py:{ours[0][0]})" if ours else "the test's code"
        course = [name for _, name in ours]
        if "blocking_send" in names or (names and names[0] == "send"):
            doing = f"wait{{s}} in a blocking send, in {at}"
            hints.append("on gloo a blocking dist.send waits until its receiver posts the matching recv, so two "
                         "neighbours that both send first wait for each other: " +
                         ("_send must start a dist.isend and keep its Work in stage.pending_sends" if task == "10.2"
                          else "send with stage.send_forward / send_backward"))
        elif "wait_sends" in course and "_send" in course[course.index("wait_sends"):]:
            # trial D: wait_sends() called from inside _send, as the stack shows: its own sends, waited at once
            doing = ("wait{s} in wait_sends(), called from inside _send(), for {its} sends to complete: the "
                     "neighbour never receives them")
            hints.append("_send waits for its own sends: on gloo a send's wait blocks until the neighbour receives, "
                         "so two neighbours that both send first wait for each other: keep the Work "
                         "(stage.pending_sends.append(work)) and return; wait_sends() is called once every receive "
                         "has been posted, at the end of the step")
        elif "wait_sends" in course:
            doing = "wait{s} in wait_sends() for {its} sends to complete: the neighbour never receives them"
            # its sends were started and kept (it waits for them): not the dropped Work of WAITS_FOR, they do not match
            hints.append("the sends were started and kept, but no receive matches them: send to `peer`, the global "
                         "rank _send is given, with no tag (the receives use the default tag, 0)"
                         if task == "10.2" else WAITS_FOR.get(task))
        elif ours and _polls_completion(frames, ours):
            # trial 6: told "it never comes", though the message had come: gloo's p2p Work is completed by wait()
            doing = f"poll{{s}} is_completed() in {at}, and it never turns True"
            hints.append(WAIT_ONLY)
        elif set(course) & {"_recv", "recv_forward", "recv_backward", "learn_shapes"} or set(names) & {
                "recv", "blocking_recv", "irecv"}:
            what = next((w for n, w in (("recv_backward", "a gradient (recv_backward)"),
                                        ("recv_forward", "an activation (recv_forward)"),
                                        ("learn_shapes", "learn_shapes' shape message")) if n in course), "a message")
            doing = f"wait{{s}} to receive {what}, in {at}, and it never comes"
            hints.append(never_sent_hint(task, " ".join(course)) or WAITS_FOR.get(task))
        elif ours and frames and frames[0][0].rsplit("/", 1)[-1].startswith("template_") and re.search(
                r"\.wait\(", linecache.getline(frames[0][0], int(frames[0][1]))) and (
                "send" in frames[0][2] or "send" in linecache.getline(frames[0][0], int(frames[0][1]))):
            # Issue 45: a Work waited for at once was told "a loop that never ends"
            doing = f"wait{{s}} on a Work at once, in {at}: `{linecache.getline(frames[0][0], int(frames[0][1])).strip()}`"
            hints.append("on gloo a send's wait() blocks until the neighbour receives, so two neighbours that both "
                         "send first wait for each other: keep the Work (stage.pending_sends.append(work)) and go on; "
                         "wait_sends() waits for them once every receive has been posted")
        elif ours and frames and frames[0][0].rsplit("/", 1)[-1].startswith("template_"):
            doing = f"never finish{{es}} {at} and wait{{s}} for no message of the pipeline"
            hints.append("a loop that never ends (a while loop whose condition never changes?)")
        else:
            doing = (f"wait{{s}} in {names[0] if names else 'the test'}(){'' if ours else ' in the test'}"
                     f"{f', in {at}' if ours else ''}, for the other ranks")
        said.setdefault(doing, []).append(rank)
    if not said:
        return "No rank said where it was."
    parts = []
    for doing, ranks in said.items():
        one = len(ranks) == 1
        who = f"rank {ranks[0]}" if one else "ranks " + ", ".join(ranks[:-1]) + " and " + ranks[-1]
        parts.append(f"{who} " + doing.format(s="s" if one else "", es="es" if one else "", its="its" if one else "their"))
    likely = [hint for i, hint in enumerate(hints) if hint and hint not in hints[:i]]
    return "; ".join(parts) + "." + (" Likely: " + "; ".join(likely) + "." if likely else "")


def as_task_failure(error, task, what):
    """A rank's error or a hang, told as the task's likely mistake (the harness's report kept)."""
    where = WHERE[task]
    text = str(error)
    if isinstance(error, RankFailed) and "RecvNeverCame" in text:
        said = re.search(r"raised RecvNeverCame: ([^\n]*)", text)
        hint = (no_peer_hint(said.group(1) if said else text) or warmup_hint(task, said.group(1) if said else text)
                or never_sent_hint(task, said.group(1) if said else text) or WAITS_FOR.get(task) or (
                    "every message must be sent: forward_step sends each output, backward_step each input's gradient"))
        trace = text[text.find("--- rank"):] if "--- rank" in text else text
        # a blank line before the traceback: check.py's line ends there
        return AssertionError(f"{where}: a message was never sent ({what}): {said.group(1) if said else ''}. "
                              f"Likely: {hint}.\n\n{trace}")
    own = re.search(r"raised (?:WorkNotKept|SentBeforeShapes|RecvNotWaited): ([^\n]*)", text)
    if isinstance(error, RankFailed) and own:  # the sender's own finding, said at once: said once, the trace after
        trace = text.partition("\n\n--- rank")[2]
        return AssertionError(f"{where}: {own.group(1)} ({what}).\n\n--- rank{trace}")
    if isinstance(error, RankTimeout):
        return AssertionError(f"{where}: the ranks hung ({what}). {hang_hint(task, text)}\n{error}")
    # trial 14: these two keep the rank's traceback only, not send_backward's own message, which lists every cause
    # of a None gradient where the head names the one proven
    if "stage 0: send_backward(grad) got None" in text and task == "10.5":  # Issue 45: was told about output.grad
        return AssertionError(
            f"{where}: the first stage called send_backward ({what}): stage 0 has no previous stage, and its input "
            "(the batch) has no gradient: backward_step sends input.grad on every stage but the first (if not "
            f"stage.is_first).\n\n--- rank{text.partition(chr(10) * 2 + '--- rank')[2]}")
    if "send_backward(grad) got None" in text and task == "10.4":  # 10.3's _recv is solutions': it requires grad
        return AssertionError(
            f"{where}: backward_step found no gradient on the input forward_step returned ({what}): recv_forward's "
            "tensor requires grad (Task 10.3's answer here is the reference), so forward_step computed with another "
            "tensor than the one it returned (input.detach(), a copy, a new leaf): backward stops there and the "
            "returned input's .grad stays None. Compute stage.module(input) on the very tensor recv_forward returned, "
            f"and return that one.\n\n--- rank{text.partition(chr(10) * 2 + '--- rank')[2]}")
    if "send_backward(grad) got None" in text and task not in ("10.3", "10.4"):  # given code; the others are right
        return AssertionError(
            f"{where}: send_backward was given None ({what}): backward_step must send input.grad, the gradient of "
            "the input that forward_step returned, once output.backward(...) has run (output.grad is None: output "
            f"is no leaf).\n{error}")
    if "grad can be implicitly created only for scalar outputs" in text and task == "10.4":
        return AssertionError(
            f"{where}: backward_step's output.backward() on the last stage found a tensor of many numbers ({what}): "
            "on the last stage forward_step returns the scaled loss as its output, loss_fn(stage.module(input), "
            f"target) / num_microbatches, not the layers' output.\n{error}")
    if "does not require grad and does not have a grad_fn" in text:
        return AssertionError(
            f"{where}: backward found an output with no autograd graph ({what}): the output forward_step keeps "
            "for backward, and sends, must stay attached to the graph (do not detach it), or the earlier "
            f"stages get no gradient.\n{error}")
    said = raised_hint(task, text)  # Issue 45: raw exceptions, each told by the cause the traceback proves
    head, _, trace = text.partition("\n\n--- rank")  # a RankFailed's: the rank's words, then its traceback
    if isinstance(error, RankFailed) and said:
        if re.search(r"raised (?:AnySource|WrongShape|TooManyForwards|WrongOutput): ", head):  # the rank's own finding is in `said`: not twice
            return AssertionError(f"{where}: {said} ({what}).\n\n--- rank{trace}")
        return AssertionError(f"{where}: {said} ({what}).\n{error}")
    if isinstance(error, RankFailed):  # the rank's own words first, its traceback after
        frames = re.findall(r'File "[^"]*?(template_pipeline\.py)", line (\d+), in (\w+)', trace)
        at = f" (at template_pipeline.py:{frames[-1][1]} in {frames[-1][2]})" if frames else ""
        return AssertionError(f"{where}: a rank failed ({what}): {' '.join(head.split())}{at}\n\n--- rank{trace}")
    return AssertionError(f"{where}: a rank failed ({what}).\n{error}")


def no_peer_hint(text):
    """A receive from rank None (a stage's missing neighbour: dist.recv then takes any source): which end."""
    if "from rank None" not in text:
        return None
    if "recv_backward" in text:
        return ("the last stage has no next stage (stage.next_rank is None), so no gradient comes to it: there "
                "output is the scaled loss, and backward_step runs output.backward() without receiving (if "
                "stage.is_last)")
    if "recv_forward" in text:
        return ("the first stage has no previous stage (stage.prev_rank is None): its input is x, the micro-batch "
                "given to forward_step (if stage.is_first)")
    return None


def warmup_hint(task, text):
    """A 1F1B stage waiting for a gradient before it ran the forwards the schedule runs before that backward."""
    found = progress_of(text)
    if task != "10.7" or "recv_backward" not in text or not found:
        return None
    forwards, started, m, stage, num_stages = found
    backwards = max(started - 1, 0)  # waiting inside backward_step: the one it waits for is counted as started
    warmup = min(num_stages - stage - 1, m)
    due = min(warmup + 1 + backwards, m)  # the forwards 1F1B has run before backward number `backwards`
    if forwards >= due:
        return None
    if backwards == 0:
        return (f"stage {stage} of {num_stages} waited for its first gradient after {forwards} forward"
                f"{'' if forwards == 1 else 's'}: its warm-up is min(num_stages - stage_index - 1, M) = {warmup} "
                + ("forwards, all M of them, before its first backward. The " if due == warmup else
                   f"forwards, then one forward of the steady state: {due} before its first backward. The ") +
                "next stage sends its first gradient only after its own warm-up, so a short warm-up waits for "
                "ever (the warm-up counts from this stage to the LAST one)")
    return (f"stage {stage} of {num_stages} waited for gradient {backwards} after {forwards} forwards: 1F1B has run "
            f"{due} by then (a warm-up of {warmup}, then one forward before each backward)")


def raised_hint(task, text):
    """The likely cause of an exception a rank raised, where its message and traceback prove it; else None."""
    if NO_FUTURE in text:  # trial 6: the raw RuntimeError said nothing of why
        return WAIT_ONLY
    said = re.search(r"raised (?:TooManyForwards|WrongOutput): ([^\n]*)", text)
    if said:
        return said.group(1)
    if "raised AnySource" in text:
        said = re.search(r"raised AnySource: ([^\n]*)", text).group(1)
        return f"{said}. Likely: {no_peer_hint(said) or 'receive from a neighbour the stage has'}"
    if "raised WrongShape" in text:
        said = re.search(r"raised WrongShape: ([^\n]*)", text).group(1)
        if "every step starts with stage.learn_shapes" in said:  # _schedule_run's finding: the cause said
            return f"a receive of the wrong shape: {said}"
        got = re.search(r"of shape (\([\d, ]*\)) from", said)
        fix = (f"forward_step's output has the shape {got.group(1) if got else '(?)'} (the reference backward_step "
               "receives the gradient in output.shape), not that of this stage's layers' output, which the next "
               "stage receives: output = stage.module(input), this stage's layers only"
               + (" (the CNN's whole output, the logits: stage.whole is every stage's layers)"
                  if re.search(r"of shape \(\d+, 10\) from", said) else "")
               if "recv_backward" in said and task == "10.4" else
               "receive the gradient in the shape of this stage's output: stage.recv_backward(output.shape, "
               "output.dtype)" if "recv_backward" in said else
               "receive the activation in the shape learn_shapes found: stage.recv_forward(stage.input_shape, "
               "stage.input_dtype)" if "recv_forward" in said else "receive in the shape the neighbour sends")
        return f"a receive of the wrong shape: {said}. Likely: {fix}"
    if task == "10.4" and "'NoneType' object has no attribute 'grad'" in text and "in backward_step" in text:
        return ("backward_step found no input to send the gradient of (input is None): forward_step must return "
                "(input, output) with the input it computed with, the activation recv_forward returned on every "
                "stage but the first (x is None there)")
    if task == "10.4" and "Must specify global_rank or group_rank" in text and "in send_forward" in text:
        return ("the last stage sent its output on (send_forward to stage.next_rank, None: there is no next stage): "
                "on the last stage the output becomes the scaled loss, which stays there; send only if not "
                "stage.is_last")
    if task == "10.4" and re.search(r"'NoneType' object has no attribute '(shape|dtype)'", text) and "in forward_step" in text:
        return ("forward_step read the shape or dtype of None: x is None on every stage but the first, target on "
                "every stage but the last (only those read them); a later stage receives its input in the shape and "
                "dtype learn_shapes found: stage.recv_forward(stage.input_shape, stage.input_dtype)")
    if task == "10.4" and re.search(r"'float' object has no attribute '(detach|backward)'", text):
        return ("forward_step returned the last stage's loss as a Python float (.item()): backward_step runs "
                "output.backward() from it and the step sums output.detach(): return it as a tensor in the graph, "
                "loss_fn(stage.module(input), target) / num_microbatches")
    if task in ("10.6", "10.7") and "'NoneType' object has no attribute 'shape'" in text and "in split" in text:
        return ("split() was given None: the first stage alone gets `inputs`, the last alone `targets` (the others "
                "may pass None): split(inputs, M) only if stage.is_first, split(targets, M) only if stage.is_last")
    if task in ("10.6", "10.7") and "not NoneType" in text and "in _recv" in text:
        return ("a receive of shape None: stage.input_shape is set by stage.learn_shapes(inputs, M), which the step "
                "must call first, before any forward")
    found = progress_of(text) if task in ("10.6", "10.7") and "raised IndexError" in text else None
    if found:
        forwards, backwards, m, stage, num_stages = found
        if forwards >= m and "list index out of range" in text:
            return (f"stage {stage} of {num_stages} asked for a forward after all M = {m} forwards: the warm-up "
                    "and the steady state run M forwards in all; the warm-up is min(num_stages - stage_index - 1, "
                    "M), never more than M")
        if forwards < m and backwards >= forwards:  # every forward run had had its backward
            return (f"stage {stage} of {num_stages} started backward {backwards} after only {forwards} of the M = "
                    f"{m} forwards, with no forward left to pair: every micro-batch's forward runs before its "
                    "backward (the warm-up and the steady state run all M forwards; the cool-down only backwards)")
    return None


def run(fn, world_size, task, what, *args, timeout=25):
    try:
        return run_ranks(fn, world_size, *args, timeout=timeout)
    except (RankTimeout, RankFailed) as error:
        raise as_task_failure(error, task, what) from None


# --------------------------------------------------------------------------- Task 10.1
@pytest.mark.task10_1
def test_partition_is_balanced_and_every_layer_is_in_exactly_one_stage(impl):
    lib = judging(impl, "10.1")
    for num_layers in range(1, 14):
        for num_stages in range(1, num_layers + 1):
            try:
                got = [lib.partition(num_layers, num_stages, s) for s in range(num_stages)]
            except ValueError as error:  # a split it must make, refused: say which (was a raw ValueError)
                raise AssertionError(
                    f"{T101}: partition({num_layers}, {num_stages}, s) raised ValueError ({error}): {num_stages} "
                    f"stages for {num_layers} layers is a split to make (every stage gets at least one layer); "
                    "refuse only MORE stages than layers (num_stages > num_layers)") from None
            for r in got:  # a trial's generator was told "your code raised TypeError ... no len()" (the test's len)
                assert not isinstance(r, collections.abc.Iterator), (
                    f"{T101}: partition({num_layers}, {num_stages}, s) returned an iterator ({type(r).__name__}): "
                    "return a range of the layer indices, as the docstring says (a list serves too): an iterator is "
                    "used up by its first reader")
            layers = [i for r in got for i in r]
            assert sorted(layers) == list(range(num_layers)) and len(layers) == num_layers, (
                f"{T101}: {num_layers} layers on {num_stages} stages gave {[list(r) for r in got]}: every layer in "
                "exactly one stage (no layer twice, none left out). Each stage computes the partition on its own "
                "rank: if stage s's range does not end where stage s+1's starts, the stages disagree on who holds "
                "a layer")
            assert layers == list(range(num_layers)), (
                f"{T101}: {num_layers} layers on {num_stages} stages gave {[list(r) for r in got]}: stages hold "
                "consecutive layers in order (stage 0 the first ones)")
            sizes = [len(r) for r in got]
            assert max(sizes) - min(sizes) <= 1, (
                f"{T101}: {num_layers} layers on {num_stages} stages gave sizes {sizes}: balanced means the sizes "
                "differ by at most one (ceil for every stage leaves the last ones short)")
            # the indices, not the type: a list of them serves Stage as well as a range (a trial's list was told
            # "every stage takes the same number of layers", which it did)
            assert [list(r) for r in got] == [list(r) for r in expected_ranges(num_layers, num_stages)], (
                f"{T101}: {num_layers} layers on {num_stages} stages gave {[list(r) for r in got]}: "
                + (f"the first {num_layers % num_stages} stages take one layer more" if num_layers % num_stages > 1
                   else "the first stage takes one layer more" if num_layers % num_stages else
                   "every stage takes the same number of layers")
                + f" ({expected_ranges(num_layers, num_stages)})")


@pytest.mark.task10_1
def test_partition_refuses_more_stages_than_layers(impl):
    lib = judging(impl, "10.1")
    try:
        lib.partition(3, 4, 0)
    except ValueError:
        return
    except NotImplementedError:
        raise
    except Exception as error:  # a trial's `assert`: the student saw their own message, not what the test wants
        raise AssertionError(
            f"{T101}: partition(3, 4, 0) raised {type(error).__name__} ({error}): 3 layers on 4 stages must raise a "
            "ValueError, as the docstring says (an assert is also skipped under python -O)") from None
    pytest.fail(f"{T101}: 3 layers on 4 stages must raise a ValueError (a stage would hold no layer)")


# --------------------------------------------------------------------------- Tasks 10.2 and 10.3
@patient
def _send_batched(self, tensor, peer):
    """A right _send written another way (Megatron's): one dist.P2POp through batch_isend_irecv."""
    ops = [dist.P2POp(dist.isend, tensor.detach().contiguous(), peer)]
    self.pending_sends.extend(dist.batch_isend_irecv(ops))


def _round_trip(rank, world_size, impl, task, send=None):
    """Each stage sends an activation forward and a gradient backward, both neighbours sending
    first, then receives: what it got, and what went on the wire. `send` replaces Stage._send."""
    lib = judging(impl, task)
    if send is not None:
        lib.Stage._send = send  # judging's module is a fresh copy: this rank's only
    model = nn.Sequential(*(nn.Linear(3, 3) for _ in range(world_size)))
    stage = lib.Stage(model, rank, world_size)
    assert [id(m) for m in stage.module] == [id(model[rank])], "Stage keeps its layers (given code)"
    activation = stage.module(torch.full((2, 3), float(rank)))  # requires grad, as a real output
    waited_in_send = []  # wait_sends() called from inside _send: each send waited for the ones before it
    kept = []  # the Works stage.pending_sends held after the last send checked
    wait_sends = lib.Stage.wait_sends

    def watched_wait_sends(self):
        if sys._getframe(1).f_code.co_name == "_send":
            waited_in_send.append(len(self.pending_sends))
        return wait_sends(self)
    lib.Stage.wait_sends = watched_wait_sends

    def sent_to(peer, what):
        """A send must go to the peer it was given: said at once, not as the neighbour's receive that never comes."""
        sends = [c for c in wire.calls if c.kind in ("send", "isend")]
        if sends and sends[-1].peer != peer:
            raise WrongPeer(f"rank {rank}'s {what} (stage.{what}, which calls _send(tensor, {peer})) sent to rank "
                            f"{sends[-1].peer}, not to rank {peer}: _send must send to `peer`, the global rank it "
                            "is given")
        started = sum(c.kind == "isend" for c in wire.calls)
        # said at once, not as the neighbour's receive that never comes (a wait_sends() inside _send empties the
        # list: check_round_trip names that)
        if not waited_in_send and len(stage.pending_sends) < started and any(
                not any(work is held for held in stage.pending_sends) for work in kept):
            # trial D: the earlier Works are gone, not the new one unkept (pending_sends = [work] each send)
            raise WorkNotKept(f"rank {rank}'s {what} started {started} isend{'s' * (started > 1)} and "
                              f"stage.pending_sends holds {len(stage.pending_sends)} Work"
                              f"{'s' * (len(stage.pending_sends) != 1)}: the Works of the earlier sends are no longer "
                              f"in it: {KEEP_APPENDING}")
        kept[:] = list(stage.pending_sends)
        if not waited_in_send and len(stage.pending_sends) < started:
            raise WorkNotKept(f"rank {rank}'s {what} started {started} isend{'s' * (started > 1)} and "
                              f"stage.pending_sends holds {len(stage.pending_sends)} Work"
                              f"{'s' * (len(stage.pending_sends) != 1)}: _send did not keep the Work of its send; "
                              f"append the Work dist.isend returns to stage.pending_sends{DROPPED_WORK}")
    with messages_wire() as wire:
        if not stage.is_last:
            stage.send_forward(activation)
            sent_to(stage.next_rank, "send_forward")
        if not stage.is_first:
            stage.send_backward(torch.full((2, 3), 100.0 + rank))
            sent_to(stage.prev_rank, "send_backward")
        got = {}
        if not stage.is_first:
            with receives_waited(rank, "recv_forward"):
                received = stage.recv_forward((2, 3), torch.float32)
            got["activation"] = (received.detach().clone(), received.requires_grad, received.dtype)
        if not stage.is_last:
            with receives_waited(rank, "recv_backward"):
                received = stage.recv_backward((2, 3), torch.float32)
            got["gradient"] = (received.detach().clone(), received.requires_grad, received.dtype)
        pending = list(stage.pending_sends)
        stage.wait_sends()
    done = all(w.is_completed() for w in wire.works)
    expected_activation = model[rank - 1](torch.full((2, 3), float(rank - 1))).detach() if rank else None
    # Not only float32: learn_shapes sends an int64 message, and a model may compute in float64. Last,
    # and a receive into a buffer of another dtype is refused before gloo sees it: gloo aborts the
    # whole process on a message of another size than its buffer.
    dist.barrier()
    if not stage.is_last:
        before = list(stage.pending_sends)  # wait_sends() emptied it: the two sends below add two Works
        stage._send(torch.arange(10, dtype=torch.int64) * 3 + rank, stage.next_rank)
        first = [work for work in stage.pending_sends if not any(work is old for old in before)]
        stage._send(torch.full((2, 3), 0.1 * (rank + 1), dtype=torch.float64), stage.next_rank)
        if not waited_in_send and len(first) == 1 and not any(first[0] is work for work in stage.pending_sends):
            # trial D: on 2 ranks no stage sends twice above; here one does (pending_sends = [work] each send)
            raise WorkNotKept(f"rank {rank} sent two messages with _send, and the first one's Work is no longer in "
                              f"stage.pending_sends after the second: {KEEP_APPENDING}")
    if not stage.is_first:
        try:
            with messages_wire(expect_dtype=torch.int64):
                shape_message = stage._recv((10,), torch.int64, stage.prev_rank, requires_grad=False)
            with messages_wire(expect_dtype=torch.float64):
                wide = stage._recv((2, 3), torch.float64, stage.prev_rank, requires_grad=True)
            got["dtypes"] = (shape_message.dtype, shape_message.detach().clone(), wide.dtype, wide.detach().clone())
        except RecvNeverCame:
            raise
        except Exception as error:  # noqa: BLE001 (reported as the test's finding, in the test's words)
            got["dtypes"] = one_line(error)
    received = torch.tensor([0 if isinstance(got.get("dtypes"), str) else 1])
    dist.all_reduce(received, op=dist.ReduceOp.MIN)
    if received.item():  # else a message was refused: its send never completes
        stage.wait_sends()
        # A stage's output may be a strided view (x.t(), x[:, ::2]): gloo sends only contiguous memory.
        strided = None
        if not stage.is_last:
            try:
                stage._send(torch.arange(6.0).view(2, 3).t() + rank, stage.next_rank)
            except RuntimeError as error:
                strided = one_line(error)
        sent = torch.tensor([0 if strided else 1])
        dist.all_reduce(sent, op=dist.ReduceOp.MIN)
        if sent.item() and not stage.is_first:
            got["strided"] = stage._recv((3, 2), torch.float32, stage.prev_rank, requires_grad=False).clone()
        elif strided:
            got["strided"] = strided
        if sent.item():
            stage.wait_sends()
    if world_size == 4:
        got.update(_in_a_group(lib, rank))
    lib.Stage.wait_sends = wait_sends
    return got, expected_activation, records_of(wire), len(pending), done, stage.pending_sends == [], waited_in_send


def _in_a_group(lib, rank):
    """Trial 14: where an activation goes in a pipeline of its own group, global ranks [0, 1] and [2, 3]: `peer` is
    a global rank, which group_dst= / group_src= would take as the group's own (right on [0, 1] only). Dry: each
    point-to-point call is recorded as (kind, global peer) and completes at once, and nothing moves, so the check
    takes no side on which group carries the message (its own or the default one, both right) and cannot hang."""
    from torch._C._distributed_c10d import ProcessGroup
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both, in the same order
    piece = lib.Stage(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3)), rank % 2, 2, group=groups[rank // 2])
    calls, saved = [], {name: vars(ProcessGroup)[name] for name in ("send", "recv")}

    class Done:  # a Work already completed (what each caller does with one: wait(), is_completed())
        def wait(self, *args, **kwargs):
            return True

        def is_completed(self):
            return True

    def dry(kind):
        def call(group, tensors, peer, *args, **kwargs):
            try:
                calls.append((kind, dist.get_global_rank(group, peer)))
            except (ValueError, RuntimeError):  # a group rank the group does not have
                calls.append((kind, f"group rank {peer}, which a group of {group.size()} ranks does not have"))
            return Done()
        return call
    ProcessGroup.send, ProcessGroup.recv = dry("send"), dry("recv")
    try:
        if piece.is_first:
            piece.send_forward(torch.full((2, 3), 1.0))
        else:
            piece.recv_forward((2, 3), torch.float32)
        piece.wait_sends()
    except Exception as error:  # noqa: BLE001 (told in the test's words; after a bad peer, its consequence)
        if all(isinstance(peer, int) for _, peer in calls):
            calls.append(("raised", one_line(error)))
    finally:
        ProcessGroup.send, ProcessGroup.recv = saved["send"], saved["recv"]
    return {"group_calls": calls}


@pytest.mark.parametrize("task", [pytest.param("10.2", marks=pytest.mark.task10_2),
                                  pytest.param("10.3", marks=pytest.mark.task10_3)])
@pytest.mark.parametrize("world_size", [2, slow(4)])
def test_activations_and_gradients_go_round_trip_between_neighbours(impl, task, world_size):
    judging(impl, task)
    results = run(_round_trip, world_size, task, "both neighbours send first, then receive", impl, task,
                  timeout=15)
    check_round_trip(results, task, world_size)


@pytest.mark.skipif(not HAS_SOLUTIONS, reason="runs solutions/ with another _send")
def test_a_send_through_batch_isend_irecv_passes_the_round_trip():
    """A false negative a student found: the test's recorder used to replace dist.isend, and
    P2POp, which checks that its op IS dist.isend, refused the right answer above."""
    results = run(_round_trip, 2, "10.2", "_send through batch_isend_irecv", REFERENCE, "10.2", _send_batched,
                  timeout=15)
    check_round_trip(results, "10.2", 2)


def check_round_trip(results, task, world_size):
    where = WHERE[task]
    for rank, (got, expected_activation, records, pending, done, emptied, waited_in_send) in enumerate(results):
        sends = [r for r in records if r[0] in ("send", "isend")]
        if task == "10.3":  # Issue 45: passed on 2 ranks, where any source is the one neighbour
            anywhere = [r for r in records if r[0] in ("recv", "irecv") and r[1] is None]
            assert not anywhere, (
                f"{where}: rank {rank} received from any source (dist.recv(tensor) without its src), "
                f"{len(anywhere)} time(s): receive from `peer`, dist.recv(tensor, peer); a middle stage gets "
                "activations from one neighbour and gradients from the other, and takes whichever came first")
        if task == "10.2":
            assert not waited_in_send, (
                f"{where}: rank {rank}'s _send called wait_sends() before starting its send: each send then waits "
                "until the sends before it are received, and stage.pending_sends loses their Works. _send only "
                "starts the send (dist.isend) and appends its Work; the step calls wait_sends() once, at its end")
            assert all(r[0] == "isend" for r in sends), (
                f"{where}: rank {rank} sent with {[r[0] for r in sends]}: use dist.isend, a blocking dist.send "
                "waits for its receiver on gloo")
            assert not any(r[4] for r in sends), (
                f"{where}: rank {rank} sent a tensor that requires grad: send the data only, tensor.detach()")
            assert pending == len(sends) and done, (
                f"{where}: rank {rank} started {len(sends)} isends and kept {pending} Works in "
                "stage.pending_sends: keep every Work, so that wait_sends() can wait for it")
        if rank > 0:
            value, requires_grad, dtype = got["activation"]
            assert torch.equal(value, expected_activation) and dtype == torch.float32, (
                f"{where}: rank {rank} received {value.tolist()} from rank {rank - 1}, which sent "
                f"{expected_activation.tolist()}")
            assert requires_grad, (
                f"{where}: the activation recv_forward returned on rank {rank} does not require grad: it is "
                "the input of this stage's layers, and without requires_grad its .grad stays None, so the "
                "earlier stages get no gradient (return tensor.requires_grad_(requires_grad))")
            dtypes = got["dtypes"]
            fix = ("receive into a tensor of the given dtype, torch.empty(shape, dtype=dtype)" if task == "10.3" else
                   "send the tensor in its own dtype")
            assert not isinstance(dtypes, str), (
                f"{where}: rank {rank} could not receive an int64 tensor of shape (10,), learn_shapes' shape "
                f"message ({dtypes}): {fix}: learn_shapes sends int64, and the activations may be float64")
            shape_dtype, shape_value, wide_dtype, wide_value = dtypes
            # trial 14: the receive buffers had the dtypes asked for (messages_wire(expect_dtype) refuses others), so
            # a tensor returned in another dtype was converted after it arrived (told to use the right buffer)
            converted = ("_recv received into a buffer of the dtype asked for, then returned the tensor in another "
                         "dtype: return it as it arrived (no .float(), no .to(...))")
            assert shape_dtype == torch.int64 and torch.equal(shape_value, torch.arange(10) * 3 + rank - 1), (
                f"{where}: rank {rank} received learn_shapes' int64 shape message as {shape_dtype} "
                f"{shape_value.tolist()}: {converted if task == '10.3' and shape_dtype != torch.int64 else fix}")
            want = torch.full((2, 3), 0.1 * rank, dtype=torch.float64)
            assert wide_dtype == torch.float64 and torch.equal(wide_value, want), (
                f"{where}: rank {rank} received a float64 activation as {wide_dtype} {wide_value.tolist()}: "
                f"{converted if task == '10.3' and wide_dtype != torch.float64 else fix}")
        if world_size == 4:
            want = [("send", rank + 1)] if rank % 2 == 0 else [("recv", rank - 1)]
            way = {"send": "send to", "recv": "recv from"}
            made = ", ".join(f"{way[kind]} {peer}" if kind in way else peer for kind, peer in got["group_calls"])
            assert got["group_calls"] == want, (
                f"{where}: in a pipeline of its own group, global ranks {[0, 1] if rank < 2 else [2, 3]} (stage "
                f"{rank % 2} is global rank {rank}), rank {rank}'s {'send' if rank % 2 == 0 else 'recv'}_forward "
                f"called {made or 'no send or recv'}, not {way[want[0][0]]} global rank {want[0][1]}: `peer` is a "
                "global rank (stage.next_rank, stage.prev_rank): dist.isend(tensor, peer) / dist.recv(tensor, peer), "
                "with or without group=; group_dst= and group_src= take the group's own rank (0 or 1 here), which "
                "equals the global rank only in a group of ranks [0, 1]")
        strided = got.get("strided")
        assert not isinstance(strided, str), (
            f"{where}: rank {rank}'s _send of a non-contiguous tensor (a strided view, x.t(): a stage's output may be "
            f"one) failed: {strided}: gloo sends contiguous memory only, send tensor.detach().contiguous()")
        if rank > 0 and strided is not None:
            want = torch.arange(6.0).view(2, 3).t() + rank - 1
            assert torch.equal(strided, want), (
                f"{where}: rank {rank} received {strided.tolist()} for the transposed view {want.tolist()} rank "
                f"{rank - 1} sent: send the view's values in its own order, tensor.contiguous() (not its storage)")
        if rank < world_size - 1:
            value, requires_grad, _ = got["gradient"]
            assert torch.equal(value, torch.full((2, 3), 101.0 + rank)), (
                f"{where}: rank {rank} received the gradient {value.tolist()} from rank {rank + 1}, which sent "
                f"{101.0 + rank}")
            assert not requires_grad, f"{where}: a received gradient is a plain tensor (requires_grad=False)"


# --------------------------------------------------------------------------- PyTorch's pipelining, the baseline
def torch_pipeline_schedule(stage_module, stage_index, num_stages, num_microbatches, loss_fn, schedule,
                            group=None):
    """PyTorch's own pipeline for one stage of the flat CNN: PipelineStage (shapes inferred at its
    first step) and ScheduleGPipe or Schedule1F1B, which scale each micro-batch's gradients by 1/M."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    pipe_stage = PipelineStage(stage_module, stage_index, num_stages, torch.device("cpu"), group=group)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    return cls(pipe_stage, n_microbatches=num_microbatches, loss_fn=loss_fn)


def torch_pipeline_step(schedule, stage_index, num_stages, inputs, targets):
    """One step of torch_pipeline_schedule's schedule: the batch's mean loss on the last stage, else None."""
    losses = []
    if stage_index == 0:
        schedule.step(inputs, target=targets if num_stages == 1 else None, losses=losses)
    elif stage_index == num_stages - 1:
        schedule.step(target=targets, losses=losses)
    else:
        schedule.step()
    return torch.stack(losses).mean().item() if losses else None


# --------------------------------------------------------------------------- the schedules
def reference_gpipe(lib):
    """Task 10.6's gpipe_step (solutions/') computing with `lib`'s forward_step and backward_step: the
    schedule the tests of 10.4 and 10.5 run the judged step in. Its code is solutions/', its globals are
    lib's (load_with_reference's swap alone would call solutions/' steps), so no schedule is written here."""
    return with_globals(load("solutions", "template_pipeline").gpipe_step, lib)


class Alive:
    """Wraps forward_step to count, when each forward starts, how many earlier micro-batches'
    outputs are still referenced (weakrefs: what the schedule keeps alive, not what its trace says)."""

    def __init__(self, forward_step):
        self.forward_step, self.outputs, self.most = forward_step, [], (0, 0)  # (count, at forward i)

    def __call__(self, *args, **kwargs):
        count = sum(ref() is not None for ref in self.outputs)
        if count > self.most[0]:
            gc.collect()  # only reference cycles would need it: counted again when it matters
            count = sum(ref() is not None for ref in self.outputs)
            self.most = max(self.most, (count, len(self.outputs)))
        if PROGRESS and PROGRESS["forwards"] >= PROGRESS["m"]:  # trial 14: said at once, not as the hang it becomes
            p = PROGRESS
            warmup = min(p["num_stages"] - p["stage"] - 1, p["m"])
            raise TooManyForwards(
                f"stage {p['stage']} of {p['num_stages']} started a forward after all M = {p['m']} had run "
                f"({p['backwards']} backwards started)" + (": its previous stage sends only M activations, so this "
                "receive would wait for ever" if p["stage"] else "") + ". A step runs M forwards in all: the "
                f"warm-up's min(num_stages - stage_index - 1, M) = {warmup}, then one in each of the steady state's "
                f"M - {warmup} steps; a warm-up below 0 (range(-1, M) runs M + 1) or a steady state past M runs more")
        if PROGRESS:
            PROGRESS["forwards"] += 1
        result = self.forward_step(*args, **kwargs)
        # trial 14: forward_step (10.4) may be a student's: whatever it returned goes on to the schedule as it is
        if isinstance(result, tuple) and len(result) == 2 and torch.is_tensor(result[1]):
            self.outputs.append(weakref.ref(result[1]))
        return result


# This rank's place in the schedule under test (_schedule_run): said where a receive waits in vain, or the
# schedule runs out of micro-batches, so that the message can tell which count was wrong.
PROGRESS = {}


def progress():
    if not PROGRESS.get("m"):
        return ""
    p = PROGRESS
    return (f"after {p['forwards']} forwards and {p['backwards']} backwards started of M = {p['m']}, on stage {p['stage']} "
            f"of {p['num_stages']}")


def progress_of(text):
    """progress()'s numbers read back from a message: (forwards, backwards, M, stage, stages) or None."""
    found = re.search(r"after (\d+) forwards and (\d+) backwards started of M = (\d+), on stage (\d+) of (\d+)", text)
    return tuple(map(int, found.groups())) if found else None


@patient
def _schedule_run(rank, world_size, impl, task, schedule, microbatch_counts, pipes=None):
    """The schedule on every rank; `pipes` (lists of global ranks) runs one pipeline on each, in a
    group of its own (the stage numbers are then not the global ranks)."""
    lib = judging(impl, task)
    inputs, targets = batch()
    group = None
    stage_index, num_stages = rank, world_size
    if pipes:
        groups = [dist.new_group(pipe) for pipe in pipes]  # every rank creates every group, in the same order
        mine = next(i for i, pipe in enumerate(pipes) if rank in pipe)
        group, stage_index, num_stages = groups[mine], pipes[mine].index(rank), len(pipes[mine])
    first, last = stage_index == 0, stage_index == num_stages - 1
    out = []
    backward_step, send_forward, recv_backward = lib.backward_step, lib.Stage.send_forward, lib.Stage.recv_backward
    send_backward, wait_sends = lib.Stage.send_backward, lib.Stage.wait_sends
    learn_shapes = lib.Stage.learn_shapes
    # one Stage for every M, as a training run keeps it from step to step (trial 14: learn_shapes called at the first
    # step only passed, each M having had a Stage of its own); no optimizer step, so its weights stay the same
    torch.manual_seed(0)
    model = lib.flat_cnn()
    stage = lib.Stage(model, stage_index, num_stages, group=group)
    for step_number, m in enumerate(microbatch_counts):
        for param in model.parameters():
            param.grad = None  # each M's gradients on their own
        alive = Alive(lib.forward_step)
        PROGRESS.clear()  # counted where the schedule under test is the student's (10.6, 10.7)
        if task in ("10.6", "10.7"):
            PROGRESS.update(forwards=0, backwards=0, m=m, stage=stage_index, num_stages=num_stages)
        sent, received = [], []  # the activations this stage sent, the gradients it received
        learned = []  # stage.learn_shapes' calls: a send before the first is said at once (SentBeforeShapes)

        def counted_backward(*args, **kwargs):
            PROGRESS["backwards"] += 1
            return backward_step(*args, **kwargs)

        def kept_send_forward(self, activation):
            # trial 14: an output of another shape than this stage's layers give, said by the sender before it
            # sends (else the next stage's layers fail on it, or this stage's receive of its gradient: a race)
            if stage_index + 1 in shapes and torch.is_tensor(activation) and activation.numel() != math.prod(
                    shapes[stage_index + 1]):  # (the last stage has no next one: told where its send fails)
                # by the size: a flat view of the right output is the same message
                raise WrongOutput(
                    f"stage {stage_index}'s forward_step sent an output of shape {tuple(activation.shape)}, where "
                    f"this stage's layers give {shapes.get(stage_index + 1)} (what the next stage receives): output "
                    "= stage.module(input), this stage's layers only"
                    + (" (this is the CNN's whole output, the logits: stage.whole is every stage's layers)"
                       if tuple(activation.shape) == (BATCH // m, 10) else ""))
            sent.append(activation.detach().clone())
            return send_forward(self, activation)

        def kept_recv_backward(self, shape, dtype):
            grad = recv_backward(self, shape, dtype)
            received.append(grad.detach().clone())
            return grad

        def counted_learn_shapes(self, *args, **kwargs):
            learned.append(True)
            return learn_shapes(self, *args, **kwargs)

        # each gradient given to send_backward, and a copy of it then: its isend may read it until wait_sends()
        in_flight, changed, gradients_sent = [], [], [0]

        def kept_send_backward(self, grad):
            if torch.is_tensor(grad):
                in_flight.append((gradients_sent[0], grad, grad.detach().clone()))
            gradients_sent[0] += 1
            return send_backward(self, grad)

        def checked_wait_sends(self):
            changed.extend(k for k, tensor, then in in_flight
                           if tensor.shape != then.shape or not torch.equal(tensor.detach(), then))
            in_flight.clear()
            return wait_sends(self)
        lib.forward_step = alive  # trial 14: also for 10.4 and 10.5, whose answers may keep an output past the step
        if task in ("10.6", "10.7"):  # the schedules' tests
            lib.backward_step = counted_backward
            lib.Stage.learn_shapes = counted_learn_shapes
        lib.Stage.send_forward, lib.Stage.recv_backward = kept_send_forward, kept_recv_backward
        lib.Stage.send_backward, lib.Stage.wait_sends = kept_send_backward, checked_wait_sends
        shapes = activation_shapes(num_stages, BATCH // m)
        want = {peer: kinds for peer, kinds in ((stage.prev_rank, [(10,), shapes.get(stage_index)]),
                                                (stage.next_rank, [shapes.get(stage_index + 1)])) if peer is not None}
        try:
            with messages_wire(shapes=want, learned=learned if task in ("10.6", "10.7") else None) as wire:
                step = (reference_gpipe(lib) if task in ("10.4", "10.5") else
                        lib.gpipe_step if schedule == "gpipe" else lib.one_f_one_b_step)
                # inputs to the first stage only, targets to the last only, as the spec allows
                try:
                    loss, trace = step(stage, inputs if first else None, targets if last else None, F.cross_entropy,
                                       m)
                except IndexError as error:  # where the schedule was when it ran out of micro-batches
                    if not PROGRESS:
                        raise
                    raise IndexError(f"{error} [{progress()}]") from error
                except (SentBeforeShapes, WrongShape) as error:  # a send, or a receive in last step's shape
                    if not step_number or learned or task not in ("10.6", "10.7"):
                        raise
                    raise type(error)(
                        f"{error}. This was the stage's step {step_number + 1} (M = {m}; the step before had M = "
                        f"{microbatch_counts[step_number - 1]}): every step starts with stage.learn_shapes(inputs, M), "
                        "not only the first: M, and so the shapes of the activations, may change from step to step"
                    ) from None
                # the micro-batches' outputs the step still keeps, once it has returned (weakrefs; counted again
                # after a collection only when some are: reference cycles)
                kept_after = sum(ref() is not None for ref in alive.outputs)
                if kept_after:
                    gc.collect()
                    kept_after = sum(ref() is not None for ref in alive.outputs)
        finally:
            lib.forward_step, lib.backward_step = alive.forward_step, backward_step
            lib.Stage.send_forward, lib.Stage.recv_backward = send_forward, recv_backward
            lib.Stage.send_backward, lib.Stage.wait_sends = send_backward, wait_sends
            lib.Stage.learn_shapes = learn_shapes
        # Issue 45: the activation sent back as its own gradient was a bare difference of gradients
        echoed = next((i for i, grad in enumerate(received) if any(
            a.shape == grad.shape and torch.equal(a, grad) for a in sent)), None)
        done = all(w.is_completed() for w in wire.works)
        grads = {i: [None if p.grad is None else p.grad.clone() for p in model[i].parameters()] for i in stage.layers}
        # PyTorch's pipelining on the same split, from the same weights (Schedule1F1B refuses M < stages)
        torch_loss = torch_grads = None
        if not pipes and (schedule == "gpipe" or m >= world_size):
            torch.manual_seed(0)
            twin = lib.flat_cnn()
            piece = nn.Sequential(*(twin[i] for i in stage.layers))
            torch_loss = torch_pipeline_step(torch_pipeline_schedule(piece, rank, world_size, m, F.cross_entropy,
                                                                     schedule), rank, world_size, inputs, targets)
            torch_grads = {i: [p.grad.clone() for p in twin[i].parameters()] for i in stage.layers}
        graph = torch.is_tensor(loss) and (loss.requires_grad or loss.grad_fn is not None)
        loss_kind = (f"{loss.dim()}-d tensor" if torch.is_tensor(loss) else type(loss).__name__)
        loss = None if loss is None else torch.as_tensor(loss).detach().clone()
        out.append(dict(m=m, loss=loss, trace=trace, grads=grads, records=records_of(wire), done=done,
                        torch_loss=torch_loss, torch_grads=torch_grads, layers=list(stage.layers),
                        loss_graph=graph, loss_kind=loss_kind, most_alive=alive.most, echoed=echoed,
                        changed_in_flight=changed, kept_after=kept_after))
        dist.barrier()
    return out


def activation_shapes(num_stages, microbatch):
    """The shape of what stage s receives, for s = 1 .. num_stages - 1, from the CNN run here."""
    flat_cnn = load("solutions", "template_pipeline").flat_cnn  # given code
    x = torch.zeros(microbatch, 3, 32, 32)
    shapes, ranges = {}, expected_ranges(10, num_stages)
    with torch.no_grad():
        for i, layer in enumerate(flat_cnn()):
            x = layer(x)
            for s in range(1, num_stages):
                if i == ranges[s].start - 1:
                    shapes[s] = tuple(x.shape)
    return shapes


def check_schedule(results, task, schedule, world_size, ranks=None):
    """results[s]: stage s's runs; world_size: the number of stages; ranks: their global ranks
    (by default the stage numbers: one pipeline on the whole world)."""
    where = WHERE[task]
    on_group = ranks is not None
    ranks = list(range(world_size)) if ranks is None else ranks

    def described(rank, m):
        what = f"{world_size} stages, M = {m}, stage {rank}"
        if on_group:
            what += f" (global rank {ranks[rank]}, a pipeline of ranks {ranks} in a world of more ranks)"
        return what

    for case in range(len(results[0])):
        m = results[0][case]["m"]
        ref_loss, ref_grads = reference_gradients(*batch())
        shapes = activation_shapes(world_size, BATCH // m)
        for rank, runs in enumerate(results):
            r, what = runs[case], described(rank, m)
            if r["echoed"] is not None:
                raise AssertionError(
                    f"{where}: {what}: the gradient stage {rank} received from stage {rank + 1} for micro-batch "
                    f"{r['echoed']} is exactly an activation stage {rank} sent it: backward_step sends input.grad, "
                    "the gradient of the loss with respect to its input, not the input itself")
            if r["changed_in_flight"]:
                k = r["changed_in_flight"][0]
                raise AssertionError(
                    f"{where}: {what}: the gradient given to send_backward for micro-batch {k} (input.grad) was "
                    "changed before the step's wait_sends(): its isend may still be reading that tensor, so stage "
                    f"{rank - 1} receives the changed values (or not, by the luck of a race). Leave a tensor as it is "
                    "once it is sent, until the step has waited for its send")
            if schedule == "1f1b" or task in ("10.6", "10.7"):
                want = expected_trace(schedule, world_size, rank, m)
                assert r["trace"] == want, (
                    f"{where}: {what}: the trace is {r['trace']}, the {schedule} order is {want}"
                    + trace_hint(r["trace"], want, schedule, world_size, rank, m, on_group))
            peak = peak_stored(r["trace"])
            if schedule == "1f1b":
                assert peak <= world_size - rank, (
                    f"{where}: {what}: {peak} micro-batches' activations stored at once, more than "
                    f"num_stages - stage_index = {world_size - rank}: is the warm-up one forward too long?")
                alive, at = r["most_alive"]
                assert alive <= world_size - rank, (
                    f"{where}: {what}: when micro-batch {at}'s forward started, {alive} earlier micro-batches' outputs "
                    f"were still referenced, more than num_stages - stage_index = {world_size - rank}: drop each "
                    "(input, output) pair once its backward has run (saved.pop(0)). Kept, they hold every "
                    "micro-batch's activations, as GPipe does: 1F1B's memory saving is lost")
            else:
                assert peak == m, f"{where}: {what}: GPipe stores all M = {m} micro-batches, the trace shows {peak}"
        # trial 14: the loss before any gradient: a loss computed wrong in forward_step (a sum over the
        # micro-batch, the logits scaled) is told by the loss, where stage 0's gradients only differ
        for rank, runs in enumerate(results):
            r, what = runs[case], described(rank, m)
            if rank == world_size - 1:
                assert r["loss"] is not None and r["loss"].numel() == 1, (
                    f"{where}: {what}: the last stage returned the loss {r['loss']}: the batch's mean loss, one number")
                assert r["loss_kind"] == "0-d tensor", (
                    f"{where}: {what}: the last stage returned the loss as a {r['loss_kind']}: the docstring asks for "
                    "a 0-d tensor (the sum of the M scaled losses, each output.detach(), shape ())")
                assert not r["loss_graph"], (
                    f"{where}: {what}: the loss returned still carries its autograd graph (requires_grad=True): "
                    "return a 0-d tensor without graph, the sum of the detached scaled losses (output.detach(), "
                    "not output): whoever keeps the loss (a list of losses to plot) would keep the M micro-batches' "
                    "graphs alive with it")
                r["loss"] = r["loss"].item()
                assert math.isclose(r["loss"], ref_loss, rel_tol=RTOL, abs_tol=ATOL), (
                    f"{where}: {what}: the loss is {r['loss']}, single-process training on the whole batch gives "
                    f"{ref_loss}" + loss_hint(r["loss"], ref_loss, m, world_size, task))
            else:
                assert r["loss"] is None, (
                    f"{where}: {what}: returned a loss of shape {tuple(r['loss'].shape)}: only the last stage "
                    "computes the loss, the other stages return None")
        for rank, runs in enumerate(results):
            r, what = runs[case], described(rank, m)
            for i in r["layers"]:
                theirs_all = (r["torch_grads"] or {}).get(i, ref_grads[i])  # M < p with 1F1B: PyTorch refuses
                for j, (got, want, theirs) in enumerate(zip(r["grads"][i], ref_grads[i], theirs_all)):
                    if got is None and rank > 0 and all(g is not None for s in range(rank)
                                                        for grads in results[s][case]["grads"].values() for g in grads):
                        # the gradient went on back through this stage: its own parameters were left out
                        raise AssertionError(
                            f"{where}: {what}: layer {i}, on this stage, got no gradient, while every layer of the "
                            "earlier stages did: the gradient came back through this stage, but its backward never "
                            "put it into this stage's parameters' .grad. Run output.backward(the gradient received), "
                            "which fills input.grad and the parameters' .grad alike (torch.autograd.grad(output, "
                            "input, ...), for one, returns the input's gradient and leaves the parameters' .grad None)")
                    assert got is not None, (
                        f"{where}: {what}: layer {i} got no gradient: the earlier stages get no gradient when "
                        "an activation is detached, or received without requires_grad")
                    if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
                        ratio = (got.norm() / want.norm()).item()
                        hint = (f" The gradients are {ratio:.2f}x too large: scale each micro-batch's loss by "
                                "1/num_microbatches." if m > 1 and abs(ratio - m) < 1e-3 * m else
                                f" The gradients are {ratio:.2f}x the right ones, M / num_stages = {m}/{world_size}: "
                                "scale each micro-batch's loss by 1/num_microbatches, not 1/num_stages."
                                if m != world_size and abs(ratio - m / world_size) < 1e-3 * m / world_size else
                                f" The gradients are {ratio:.2f}x too small: the loss is scaled by 1/M more than "
                                "once." if m > 1 and abs(ratio * m - 1) < 1e-3 else
                                one_micro_batch_hint(got, i, j, m) or (  # Issue 45: `X or Y if c else ""` is
                                    # `(X or Y) if c else ""`: the line above was never asked for 10.4 and 10.5
                                    " Are backwards paired with the wrong micro-batch's activations (oldest first)?"
                                    if m > 1 and task in ("10.6", "10.7") else ""))  # 10.4, 10.5: the reference's
                        raise AssertionError(
                            f"{where}: {what}: layer {i}'s gradient differs from single-process training on the "
                            f"whole batch by {(got - want).abs().max():.3g}.{hint}")
                    assert torch.allclose(got, theirs, rtol=RTOL, atol=ATOL), (
                        f"{where}: {what}: layer {i}'s gradient differs from PyTorch's {schedule} schedule by "
                        f"{(got - theirs).abs().max():.3g}")
            keeper = {"10.4": "forward_step keeps its output (the schedule here is solutions'",
                      "10.5": "backward_step keeps the output (or input) it was given (the schedule here is "
                              "solutions'"}.get(task)
            assert not r["kept_after"], (
                f"{where}: {what}: after the step returned, {r['kept_after']} of the M micro-batches' outputs were "
                "still referenced, and their activations with them, in memory until the next step: "
                + (f"{keeper}, which drops each pair once its backward has run) somewhere that outlives the step (on "
                   "the stage, in a global): " + ("return it and keep nothing" if task == "10.4" else
                                                   "keep nothing once it returns") if keeper else
                   "the step keeps its (input, output) pairs somewhere that outlives it (on the stage, in a global). "
                   "Keep them in a list local to the step, and drop each once its backward has run"))
            if r["torch_loss"] is not None and rank == world_size - 1:
                assert math.isclose(r["loss"], r["torch_loss"], rel_tol=RTOL, abs_tol=ATOL), (
                    f"{where}: {what}: loss {r['loss']}, PyTorch's schedule {r['torch_loss']}")
            check_wire(r, where, what, rank, world_size, m, shapes, ranks)


def trace_hint(trace, want, schedule, num_stages, stage, m, on_group):
    """Why a trace is not the schedule's, said only where it holds: the warm-up's length, the order of
    the backwards, or forwards and backwards missing."""
    def numbers(kind):
        return sorted(i for k, i in trace if k == kind)
    if numbers("F") != list(range(m)) or numbers("B") != list(range(m)):
        return (f" (every micro-batch 0..{m - 1} once forward and once backward: forwards {numbers('F')}, "
                f"backwards {numbers('B')})")
    backwards = [i for k, i in trace if k == "B"]
    if backwards != list(range(m)):
        return f" (the backwards run in the order {backwards}: oldest first, 0..{m - 1}, the order the gradients arrive)"
    if schedule == "gpipe":
        return " (all forwards, then the backwards in micro-batch order B0..B(M-1), as ScheduleGPipe)"
    lead = next((i for i, (k, _) in enumerate(trace) if k == "B"), len(trace))  # forwards before the first backward
    right = min(num_stages - stage - 1, m)
    if lead == right < m and [k for k, _ in trace[lead:lead + 2]] == ["B", "F"]:
        # Issue 45: this trace is also a warm-up one forward short followed by forward-backward pairs, which
        # was told "the warm-up is right": both readings give the same trace, so both are named
        return (f" ({right} forward{'' if right == 1 else 's'} before the first backward, then backward-forward: "
                f"either the warm-up of {right} is right and each step of the steady state runs the backward "
                f"before the forward, or the warm-up is one forward short ({right - 1}, where min(num_stages - "
                f"stage_index - 1, M) = {right}) before forward-backward pairs. Each step of the steady state runs "
                "one forward, THEN one backward, of the oldest micro-batch)")
    warmup = lead - 1  # the warm-up, then the steady state's first forward
    if warmup != right and not (right == m and warmup == m - 1):
        return (f" (a warm-up of {warmup} forwards before the first forward-backward pair; it is min(num_stages - "
                f"stage_index - 1, M) = {right}"
                + (": computed from stage.num_stages and stage.stage_index, not the global rank or world size "
                   "(dist.get_rank(), dist.get_world_size())" if on_group else "") + ")")
    return " (after the warm-up, one forward then one backward, oldest first, until the forwards are done)"


def one_micro_batch_hint(got, layer, index, m):
    """" ..." where a gradient is one micro-batch's share alone (the others' zeroed or overwritten), else ""."""
    inputs, targets = batch()
    for k, (x, y) in enumerate(zip(inputs.split(BATCH // m), targets.split(BATCH // m))):
        share = reference_gradients(x, y)[1][layer][index] / m
        if torch.allclose(got, share, rtol=RTOL, atol=ATOL):
            return (f" It is micro-batch {k}'s share alone: the backwards must ADD into .grad; something zeroes or "
                    "replaces it between them (the caller zeroes the gradients once, before the step).")
    return ""


def loss_hint(loss, ref_loss, m, num_stages=None, task=None):
    """Why the last stage's loss is off, only where the numbers show that cause: M times too large (no
    1/M), M times too small (a mean of losses already scaled by 1/M); with forward_step judged (10.4), a
    sum over the micro-batch, a division by its size, the logits scaled instead of the loss."""
    if m > 1 and math.isclose(loss, ref_loss * m, rel_tol=1e-4):
        return f" ({loss / ref_loss:.2f}x: scale each micro-batch's loss by 1/num_microbatches)"
    size = BATCH // m  # the micro-batch's
    if task == "10.4" and size > 1 and math.isclose(loss, ref_loss * size, rel_tol=1e-4):
        return (f" ({loss / ref_loss:.2f}x, the micro-batch's size {size}: forward_step summed the micro-batch's "
                "losses (reduction='sum'?) where loss_fn's default takes their mean: loss_fn(stage.module(input), "
                "target) / num_microbatches)")
    if task == "10.4" and size not in (m, m * m) and math.isclose(loss * size, ref_loss * m, rel_tol=1e-4):
        return (f" ({loss / ref_loss:.2f}x = M / {size}: forward_step divided the micro-batch's loss by its size, "
                f"len(target) = {size}, where loss_fn's mean already has; divide by num_microbatches = {m} instead)")
    if task == "10.4" and m > 1:
        inputs, targets = batch()
        torch.manual_seed(0)
        with torch.no_grad():
            logits = load("solutions", "template_pipeline").flat_cnn()(inputs)
        scaled = sum(F.cross_entropy(z / m, y).item() for z, y in zip(logits.split(size), targets.split(size)))
        if math.isclose(loss, scaled, rel_tol=1e-4):
            return (" (the sum of loss_fn(logits / M, target) over the micro-batches: forward_step divided the "
                    "layers' output by M before loss_fn, not the loss after it: loss_fn(stage.module(input), "
                    "target) / num_microbatches)")
    if m > 1 and math.isclose(loss * m, ref_loss, rel_tol=1e-4):
        return (f" ({loss / ref_loss:.2f}x: the M losses are already scaled by 1/M: sum them; their mean divides by "
                "M a second time)" if task != "10.4" else  # the schedule is solutions' there: it sums them
                f" ({loss / ref_loss:.2f}x: forward_step scaled the micro-batch's loss by 1/M twice"
                + (f", or by 1/len(target) (the micro-batch's size, {size} = M**2 here)" if size == m * m else "")
                + ": loss_fn(stage.module(input), target) / num_microbatches, once)")
    if num_stages and m != num_stages and math.isclose(loss * num_stages, ref_loss * m, rel_tol=1e-4):
        return (f" ({loss / ref_loss:.2f}x = M / num_stages: scale each micro-batch's loss by 1/num_microbatches, "
                "not 1/num_stages)")
    if m > 1:  # one micro-batch's loss alone (scaled or not): the others replaced, not added
        inputs, targets = batch()
        for k, (x, y) in enumerate(zip(inputs.split(BATCH // m), targets.split(BATCH // m))):
            own = reference_gradients(x, y)[0]
            for value, how in ((own / m, "scaled by 1/M"), (own, "unscaled")):
                if math.isclose(loss, value, rel_tol=1e-4):
                    return (f" (micro-batch {k}'s loss alone, {how}: return the SUM of the M scaled losses, "
                            "each added to the total, not put in its place)")
    return ""


def check_wire(r, where, what, rank, world_size, m, shapes, ranks):
    """What went on the wire: to each neighbour, in order, one int64 shape message (forward
    only), then M activations forward and M gradients back, in the shapes of the CNN's split."""
    records = r["records"]
    by = {}
    for call, peer, shape, dtype, _ in records:
        kind = "send" if call in ("send", "isend") else "recv"
        by.setdefault((kind, peer), []).append((shape, dtype))
    header = [((10,), "int64")]
    want = {}
    if rank > 0:
        want[("recv", ranks[rank - 1])] = header + [(shapes[rank], "float32")] * m
        want[("send", ranks[rank - 1])] = [(shapes[rank], "float32")] * m
    if rank < world_size - 1:
        want[("send", ranks[rank + 1])] = header + [(shapes[rank + 1], "float32")] * m
        want[("recv", ranks[rank + 1])] = [(shapes[rank + 1], "float32")] * m
    headers = sum(1 for call, _, shape, dtype, _ in records if call in ("send", "isend") and dtype == "int64")
    assert headers <= 1, (
        f"{where}: {what}: stage {rank} sent {headers} shape messages (int64, learn_shapes') to the next stage: "
        "call stage.learn_shapes(inputs, M) once, at the start of the step, not once a micro-batch")
    assert by == want, (f"{where}: {what}: what went on the wire, {by}, is not one shape message then M "
                        f"activations forward and M gradients back: {want}")
    assert r["done"], f"{where}: {what}: the step returned before its sends completed: end it with stage.wait_sends()"


@pytest.mark.parametrize("task,schedule,world_size,counts", [
    pytest.param("10.4", "gpipe", 2, [1, 2, 4], marks=pytest.mark.task10_4),
    pytest.param("10.5", "gpipe", 2, [1, 2, 4], marks=pytest.mark.task10_5),
    pytest.param("10.6", "gpipe", 2, [1, 2, 4], marks=pytest.mark.task10_6),
    pytest.param("10.7", "1f1b", 4, [2, 4], marks=pytest.mark.task10_7),  # M=2 < p: the warm-up cut to M
    pytest.param("10.4", "gpipe", 4, [2, 4, 8], marks=[pytest.mark.task10_4, pytest.mark.slow]),
    pytest.param("10.5", "gpipe", 4, [2, 4, 8], marks=[pytest.mark.task10_5, pytest.mark.slow]),
    pytest.param("10.6", "gpipe", 4, [1, 2, 4, 8], marks=[pytest.mark.task10_6, pytest.mark.slow]),
    pytest.param("10.7", "1f1b", 2, [1, 2, 4, 8], marks=[pytest.mark.task10_7, pytest.mark.slow]),
    pytest.param("10.7", "1f1b", 4, [1, 8], marks=[pytest.mark.task10_7, pytest.mark.slow]),
], ids=lambda value: "M" + ",".join(map(str, value)) if isinstance(value, list) else str(value))
def test_schedule_equals_single_process_and_torch_pipelining(impl, task, schedule, world_size, counts):
    judging(impl, task)
    results = run(_schedule_run, world_size, task, f"{schedule} on {world_size} stages", impl, task, schedule, counts,
                  timeout=40)
    check_schedule(results, task, schedule, world_size)


@pytest.mark.task10_7
def test_1f1b_on_two_pipelines_of_a_4_rank_world(impl):
    """Two pipelines of 2 stages, ranks [0, 1] and [2, 3], each in its own group: the stage numbers
    are not the global ranks, so a warm-up computed from dist.get_rank() shows here."""
    judging(impl, "10.7")
    pipes = [[0, 1], [2, 3]]
    results = run(_schedule_run, 4, "10.7", "1f1b on two pipelines of 2 stages", impl, "10.7", "1f1b", [4], pipes,
                  timeout=40)
    for pipe in pipes:
        check_schedule([results[r] for r in pipe], "10.7", "1f1b", len(pipe), ranks=pipe)


def _uneven(rank, world_size, impl, task):
    lib = judging(impl, task)
    stage = lib.Stage(lib.flat_cnn(), 0, 1)
    step = lib.gpipe_step if task == "10.6" else lib.one_f_one_b_step
    try:
        step(stage, *batch(), F.cross_entropy, 3)
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.slow
@pytest.mark.parametrize("task", [pytest.param("10.6", marks=pytest.mark.task10_6),
                                  pytest.param("10.7", marks=pytest.mark.task10_7)])
def test_a_batch_that_does_not_split_into_m_micro_batches_is_refused(impl, task):
    judging(impl, task)
    message = run(_uneven, 1, task, "one stage", impl, task)[0]
    assert message and "does not split" in message, (
        f"{WHERE[task]}: a batch of {BATCH} in 3 micro-batches must raise split()'s ValueError, got {message!r}")


# --------------------------------------------------------------------------- pp x dp
def _pp_dp(rank, world_size, impl, steps):
    """pp=2 x dp=2 on 4 ranks: ranks 0,1 and 2,3 are two pipelines, each fed half of every batch;
    each stage's gradients are averaged with its dp peer's, then SGD."""
    lib = judging(impl, "10.7")
    pp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    replica, stage_index = divmod(rank, 2)
    torch.manual_seed(0)
    model = lib.flat_cnn()
    stage = lib.Stage(model, stage_index, 2, group=pp_groups[replica])
    optimizer = torch.optim.SGD(stage.module.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        inputs, targets = batch(seed=10 + step, size=2 * BATCH)
        half = slice(replica * BATCH, (replica + 1) * BATCH)
        optimizer.zero_grad()
        loss, _ = lib.one_f_one_b_step(stage, inputs[half], targets[half], F.cross_entropy, 4)
        for p in stage.module.parameters():
            dist.all_reduce(p.grad, group=dp_groups[stage_index])
            p.grad /= 2
        losses.append(loss)
        optimizer.step()
    full = stage.gather_full_module()
    return losses, {k: v.clone() for k, v in full.state_dict().items()}


@pytest.mark.slow
@pytest.mark.task10_7
def test_pp2_by_dp2_on_4_ranks_trains_like_one_process(impl):
    judging(impl, "10.7")
    steps = 3
    results = run(_pp_dp, 4, "10.7", "pp=2 x dp=2", impl, steps, timeout=40)
    torch.manual_seed(0)
    model = load("solutions", "template_pipeline").flat_cnn()  # given code
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    want_losses = []
    for step in range(steps):
        inputs, targets = batch(seed=10 + step, size=2 * BATCH)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        want_losses.append(loss.item())
        optimizer.step()
    # the loss of a global batch: the mean of the two pipelines' (each on half of it), on their last stages
    mean = [(a + b) / 2 for a, b in zip(results[1][0], results[3][0])]
    assert all(math.isclose(g, w, rel_tol=RTOL, abs_tol=ATOL) for g, w in zip(mean, want_losses)), (
        f"{T107}: pp=2 x dp=2: the two pipelines' mean losses {mean} differ from one process's {want_losses}")
    for rank, (_, state) in enumerate(results):
        for name, value in model.state_dict().items():
            assert torch.allclose(state[name], value, rtol=RTOL, atol=ATOL), (
                f"{T107}: pp=2 x dp=2, rank {rank}: after {steps} steps {name} differs from single-process training "
                f"by {(state[name] - value).abs().max():.3g}")


def _float64_step(rank, world_size, impl, task="10.5"):
    """One micro-batch of a float64 model over 2 stages (forward_step and backward_step, each its own task's
    answer where judged): the layers' gradients, by global layer index."""
    lib = judging(impl, task)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    x, target = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 2, 1, 1, 0])
    stage = lib.Stage(model, rank, world_size)
    stage.learn_shapes(x, 1)
    received, recv = [], stage._recv  # trial 14: x given to every stage, as a caller may: counted after learn_shapes

    def counted_recv(*args, **kwargs):
        received.append(True)
        return recv(*args, **kwargs)
    stage._recv = counted_recv  # recv_forward's, or the student's own call of it
    try:
        input, output = lib.forward_step(stage, x, target, F.cross_entropy, 1)
    except Exception as error:
        if task == "10.4" and rank > 0 and not received:
            raise XNotTheInput(f"{type(error).__name__}: {error}") from error
        raise
    if task == "10.4" and rank > 0 and not received:
        raise XNotTheInput("no error, but stage 1 never received its input")
    lib.backward_step(stage, input, output)
    stage.wait_sends()
    return {i: [p.grad for p in layer.parameters()] for i, layer in enumerate(model) if layer in list(stage.module)}


@pytest.mark.slow
@pytest.mark.parametrize("task", [pytest.param("10.4", marks=pytest.mark.task10_4),
                                  pytest.param("10.5", marks=pytest.mark.task10_5)])
def test_a_step_of_a_float64_model_equals_one_process(impl, task):
    """A model may compute in float64 (the tests above use float32): the activation comes in the dtype learn_shapes
    found (10.4), the gradient in output's dtype (10.5)."""
    judging(impl, task)
    try:
        results = run_ranks(_float64_step, 2, impl, task, timeout=25)
    except (RankTimeout, RankFailed) as error:
        said = re.search(r"raised XNotTheInput: ([^\n]*)", str(error))
        if said:
            raise AssertionError(
                f"{T104}: a float64 model over 2 stages, the batch given to forward_step on both: stage 1 received "
                f"nothing from stage 0 (no stage.recv_forward): it computed with x, not with stage 0's activation ("
                f"{said.group(1)}). On every stage but the first the input is stage.recv_forward(stage.input_shape, "
                "stage.input_dtype), whatever x is: choose by stage.is_first, not by x (a caller may give the batch "
                "to every stage)") from None
        raise AssertionError(
            f"{WHERE[task]}: a float64 model over 2 stages: {one_line(error)}. " + (
                "The activation is received in the shape AND dtype learn_shapes found (stage.recv_forward("
                "stage.input_shape, stage.input_dtype), float64 here)" if task == "10.4" else
                "The gradient is received in output's shape AND dtype (stage.recv_backward(output.shape, "
                "output.dtype))") + ": a buffer of another size or dtype than the message makes gloo abort") from None
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    x, target = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 2, 1, 1, 0])
    F.cross_entropy(model(x), target).backward()
    for rank, grads in enumerate(results):
        for i, got in grads.items():
            want = [p.grad for p in model[i].parameters()]
            assert all(g is not None and g.dtype == torch.float64 and torch.allclose(g, w, atol=1e-12)
                       for g, w in zip(got, want)), (
                f"{WHERE[task]}: a float64 model over 2 stages: rank {rank}'s layer {i} gradients differ from one "
                "process's")
