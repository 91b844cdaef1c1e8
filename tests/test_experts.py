"""Task 16: expert parallelism (template_experts.py).

    pytest --impl template -m task16_2     # one task; python check.py 16 for all five

Every check is against the single-process reference, models.MoE holding all E experts, run on each
rank's slice in turn (routing and capacity per slice, as each rank routes its own tokens), in float64:
the outputs, aux_loss, the input's gradient, the router's and every expert's gradients, before and
after Task 16.5's synchronisation, with and without dropped tokens (capacity_factor 0.5 and 8.0),
k = 1 and 2, E = 4 and 8, N = 2 and 4 ranks, 13 tokens a rank (divisible by nothing convenient), a
rank whose tokens all go to one expert, an expert no token reaches. What goes on the wire is recorded
(tests/wire.py): per MoE layer, forward one count exchange and two token all-to-alls, backward two,
of the kept tokens' sizes, nothing else. The all-to-all (16.1) is tested alone on rank-valued rows
with uneven and empty splits, and there and back before either backward (as dispatch and combine).
Dispatch and combine also run inside ep groups of 4 ranks (slow), where the default group is wrong;
the layer's aux_loss in a bfloat16 MoE; the sync with a parameter without .grad, and with --ep 1,
where the copies are not N. The tests of one task take solutions/' answers to the others.
"""
import copy
import gc
import re
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import models
import gpu  # where the GPU test's ranks run
from conftest import REFERENCE, keeps_its_input, load_with_reference, raise_if_unfilled
from harness import RankFailed, RankTimeout, one_line, run_ranks
from wire import Wire, dtype_name

T161 = "Task 16.1 (template_experts.py, all_to_all)"
T162 = "Task 16.2 (template_experts.py, dispatch)"
T163 = "Task 16.3 (template_experts.py, combine)"
T164 = "Task 16.4 (template_experts.py, ExpertParallelMoE / parallelize_moe)"
T165 = "Task 16.5 (template_experts.py, sync_moe_gradients)"
TASK = {"16.1": T161, "16.2": T162, "16.3": T163, "16.4": T164, "16.5": T165}

ANSWERS = {
    "16.1": ["_AllToAll.forward", "_AllToAll.backward"],
    "16.2": ["dispatch"],
    "16.3": ["combine"],
    "16.4": ["ExpertParallelMoE.from_moe", "ExpertParallelMoE.forward", "parallelize_moe"],
    "16.5": ["sync_moe_gradients"],
}
DIM, HIDDEN, TOKENS, AUX = 6, 8, 13, 0.3  # 13 tokens a rank: divisible by nothing convenient


def judging(impl, task):
    """template_experts of `impl` for the tests of `task`: your answer to that task, solutions/' to the
    others. An unfilled part of the task raises its NotImplementedError here, at once, before any rank."""
    others = [answer for t, answers in ANSWERS.items() if t != task for answer in answers]
    # solutions/' answers call the judged module's functions: yours to `task`
    module = load_with_reference(impl, "template_experts", *others, in_the_copy=True)
    raise_if_unfilled(module, ANSWERS[task])
    return module


def slow(*values):
    return pytest.param(*values, marks=pytest.mark.slow)


def _close(a, b):
    return a is not None and b is not None and a.shape == b.shape and torch.allclose(a, b, atol=1e-10, rtol=1e-9)


# --------------------------------------------------------------------------- Task 16.1
# SPLITS[n][s][d]: the rows rank s sends to rank d
SPLITS = {
    "even totals": [[1, 0, 2], [0, 3, 0], [2, 0, 1]],  # every rank sends 3 and receives 3, not to the same ranks
    "empty": [[1, 2, 0], [0, 0, 0], [3, 0, 0]],  # rank 1 sends nothing; rank 2 receives nothing
    "asymmetric": [[1, 2, 0], [0, 1, 2], [2, 0, 1]],  # every rank sends 3 and receives 3, from other ranks than to
}
CHAINED = "asymmetric"  # the splits of the way there and back: a second all_to_all before the first one's backward


def _rows(rank, count, offset=0.0):
    """Rows that say where they come from: rank * 100 + row, and a second column of that + 0.5."""
    base = torch.arange(count, dtype=torch.float64) + 100 * rank + offset
    return torch.stack([base, base + 0.5], dim=1)


def _a2a(rank, world_size, impl):
    ep = judging(impl, "16.1")
    out = {}
    for case, splits in SPLITS.items():
        input_splits = splits[rank]
        output_splits = [splits[s][rank] for s in range(world_size)]
        x = _rows(rank, sum(input_splits)).requires_grad_()
        grad_out = _rows(rank, sum(output_splits), offset=1000.0)
        with Wire() as wire:
            phase = "forward"
            try:
                y = ep.all_to_all(x, output_splits, input_splits)
                forward, phase = wire.calls[:], "backward"
                (grad_x,) = torch.autograd.grad(y, x, grad_out)
                backward = wire.calls[len(forward):]
            except NotImplementedError:
                raise
            except (RuntimeError, ValueError) as error:  # ValueError: gloo's refusal of mixed dtypes
                out[case] = dict(error=f"{type(error).__name__}: {error}"[:400], phase=phase)
                continue
        out[case] = dict(error=None, y=y.detach(), grad_x=grad_x, forward=[(c.kind, c.tensors) for c in forward],
                         backward=[(c.kind, c.tensors) for c in backward],
                         unwaited=[("forward" if c in forward else "backward", c.kind) for c in wire.calls if not c.waited],
                         kept_input=keeps_its_input(lambda x: ep.all_to_all(x, output_splits, input_splits), x))
    # strided: x a view of every row's first two columns, and y.sum()'s gradient an expanded (stride 0) tensor; gloo
    # refuses tensors that are not contiguous
    splits = SPLITS["even totals"]
    input_splits, output_splits = splits[rank], [splits[s][rank] for s in range(world_size)]
    base = torch.cat([_rows(rank, sum(input_splits)), torch.zeros(sum(input_splits), 2, dtype=torch.float64)], dim=1)
    base.requires_grad_()
    try:
        y = ep.all_to_all(base[:, :2], output_splits, input_splits)
        y.sum().backward()
        out["strided"] = dict(error=None, y=y.detach(), grad=base.grad)
    except (RuntimeError, ValueError) as error:
        out["strided"] = dict(error=f"{type(error).__name__}: {error}"[:400])
    # there and back, as a MoE layer's dispatch and combine: both forwards before either backward. Every rank sends
    # and receives 3 rows, so even splits mixed up between the two calls keep the messages' sizes (no hang)
    splits = SPLITS[CHAINED]
    input_splits, output_splits = splits[rank], [splits[s][rank] for s in range(world_size)]
    x = _rows(rank, sum(input_splits)).requires_grad_()
    grad_out = _rows(rank, sum(input_splits), offset=1000.0)
    try:
        back = ep.all_to_all(ep.all_to_all(x, output_splits, input_splits) * 2, input_splits, output_splits)
        (grad_x,) = torch.autograd.grad(back, x, grad_out)
        out["there and back"] = dict(error=None, y=back.detach(), grad_x=grad_x)
    except (RuntimeError, ValueError) as error:
        out["there and back"] = dict(error=f"{type(error).__name__}: {error}"[:400])
    return out


def _expected_a2a(rank, world_size, splits):
    """What rank receives in forward (its pieces from every rank, in rank order) and x's gradient."""
    received = []
    for s in range(world_size):
        start = sum(splits[s][:rank])
        received.append(_rows(s, sum(splits[s]))[start:start + splits[s][rank]])
    grads = []
    for d in range(world_size):  # what d received from this rank lies after what it received from ranks < rank
        start = sum(splits[s][d] for s in range(rank))
        grads.append(_rows(d, sum(splits[s][d] for s in range(world_size)), offset=1000.0)[start:start + splits[rank][d]])
    return torch.cat(received), torch.cat(grads)


@pytest.mark.task16_1
def test_all_to_all_uneven_and_empty_splits_forward_and_backward(impl):
    judging(impl, "16.1")
    try:
        results = run_ranks(_a2a, 3, impl)
    except (RankTimeout, RankFailed) as error:  # an abort or a hang names no cause by itself
        raise AssertionError(
            f"{T161}: all_to_all on 3 ranks, the splits {SPLITS}: Every rank must call all_to_all_single, also one "
            "with no rows to send (rank 1 in the 'empty' splits: zero splits, a (0, ...) tensor): a rank that skips it "
            "leaves the others waiting or gloo pairs their next messages with the wrong ones; and each buffer must "
            "have exactly the rows its splits add up to (gloo aborts on a message of another size).\n"
            f"{error}") from None
    for rank, out in enumerate(results):
        for case, splits in SPLITS.items():
            got = out[case]
            where = f"all_to_all on rank {rank} of 3 ({case} splits, rank s sends splits[s][d] rows to d: {splits})"
            y_expected, grad_expected = _expected_a2a(rank, 3, splits)
            error = got["error"]
            if error is not None:  # the cause where the error proves one, else what each direction does
                pytest.fail(f"{T161}: {where}: the {got['phase']} failed: {error}. " + (
                    "A tensor's rows differ from the sum of its split list: the forward's output has "
                    "sum(output_splits) rows, and all_to_all_single takes output_split_sizes, then input_split_sizes"
                    if "Split sizes" in error and got["phase"] == "forward" else
                    "A tensor's rows differ from the sum of its split list: the backward's output has "
                    "sum(input_splits) rows (not the incoming gradient's row count), and its all_to_all_single takes "
                    "the two lists swapped: output_split_sizes=ctx.input_splits, input_split_sizes=ctx.output_splits"
                    if "Split sizes" in error else
                    "The output buffer must have x's dtype (x.new_empty(...), not torch.empty(...) in the default "
                    "dtype): gloo refuses tensors of different dtypes" if "different dtypes" in error else
                    "Backward returns one value per argument of forward, (x's gradient, None, None, None): None for "
                    "output_splits, input_splits and group, which have none" if "incorrect number of gradients" in error
                    else "Forward receives output_splits[s] rows from rank s; backward sends each row's gradient back "
                    "where the row came from: the all-to-all with output_splits and input_splits swapped"))
            assert not got["unwaited"], (  # its rows may arrive in time, or not: said before the values
                f"{T161}: {where}: the {got['unwaited'][0][0]}'s {got['unwaited'][0][1]} was started with async_op=True "
                "and its Work never waited for: the output holds the rows only once work.wait() has returned; wait "
                "before returning it (or call it without async_op)")
            assert _close(got["y"], y_expected), (
                f"{T161}: {where} received {got['y'][:, 0].tolist()}, expected {y_expected[:, 0].tolist()} (row r of "
                "rank s is 100 s + r): rank s's rows for this rank, in rank order, a new tensor of sum(output_splits) rows")
            if not _close(got["grad_x"], grad_expected) and _close(got["grad_x"] * 3, grad_expected):  # each a third
                pytest.fail(f"{T161}: {where}: x's gradient is {got['grad_x'][:, 0].tolist()}, a third of the expected "
                            f"{grad_expected[:, 0].tolist()}: the backward divided by the group's size (3); an "
                            "all-to-all moves rows and sums nothing, so its backward sends each row's gradient back "
                            "as it is, not averaged")
            assert _close(got["grad_x"], grad_expected), (
                f"{T161}: {where}: x's gradient is {got['grad_x'][:, 0].tolist()}, expected "
                f"{grad_expected[:, 0].tolist()}: backward must send each row's gradient back to the rank the row came "
                "from: the all-to-all with output_splits and input_splits swapped")
            sent, received = sum(splits[rank]), sum(splits[s][rank] for s in range(3))
            assert got["forward"] == [("all_to_all_single", [("float64", 2 * received), ("float64", 2 * sent)])], (
                f"{T161}: {where}'s forward should be one all_to_all_single ({received} rows out, {sent} in), it sent "
                f"{got['forward']}" + _other_dtype(got["forward"], "x"))
            assert got["backward"] == [("all_to_all_single", [("float64", 2 * sent), ("float64", 2 * received)])], (
                f"{T161}: {where}'s backward should be one all_to_all_single with the splits swapped ({sent} rows "
                f"out, {received} in), it sent {got['backward']}" + _other_dtype(got["backward"], "the gradient"))
            assert not got["kept_input"], (
                f"{T161}: {where}: all_to_all keeps its input x alive after the forward (ctx.save_for_backward(x), "
                "or x on ctx), while the backward needs none of it, only the splits and the group: a MoE layer's "
                "tokens would stay in memory twice until the backward; keep no tensor on ctx")
        _check_there_and_back(rank, out["there and back"])
        _check_strided(rank, out["strided"])


def _other_dtype(calls, what):
    """A hint when the one all_to_all_single sent the tensors in another dtype than the float64 it was given."""
    if len(calls) != 1 or calls[0][0] != "all_to_all_single":
        return ""
    dtypes = sorted({d for d, _ in calls[0][1]})
    return ("" if dtypes == ["float64"] else
            f": the rows went as {dtypes}, {what} is float64: a copy in another dtype (.float(), .to(...)) loses "
            "precision, or for bfloat16 doubles the bytes on the wire; send the tensor in its own dtype and receive "
            "into a buffer of that dtype")


def _check_strided(rank, got):
    """all_to_all of a strided x (the first two of four columns) whose y.sum() gives an expanded gradient; said after
    the cases above, which passed with contiguous tensors and the same splits."""
    splits = SPLITS["even totals"]
    where = (f"all_to_all on rank {rank} of 3 (the even totals splits {splits}) of a strided x (x = base[:, :2], a view "
             "of the first two of four columns) and backward from y.sum() (its gradient an expanded tensor, stride 0)")
    if got["error"] is not None:
        pytest.fail(f"{T161}: {where} failed: {got['error']}" + (
            ": give dist.all_to_all_single contiguous tensors (x.contiguous() in forward, grad.contiguous() in "
            "backward): an upstream gradient or an input may be a view of another shape in memory"
            if "contiguous" in got["error"] else ""))
    y_expected, _ = _expected_a2a(rank, 3, splits)
    grad = torch.cat([torch.ones(sum(splits[rank]), 2), torch.zeros(sum(splits[rank]), 2)], dim=1).double()
    assert _close(got["y"], y_expected) and _close(got["grad"], grad), (
        f"{T161}: {where}: received {got['y'][:, 0].tolist()} (expected {y_expected[:, 0].tolist()}) and base's gradient "
        f"{got['grad'].tolist() if got['grad'] is not None else None}, expected ones in the two columns x views")


def _check_there_and_back(rank, got):
    """all_to_all there (the splits of CHAINED) and back (swapped), both forwards before the backwards, as dispatch
    and combine run in a MoE layer; said after each call alone passed, with the same splits."""
    splits = SPLITS[CHAINED]
    where = (f"all_to_all on rank {rank} of 3 there and back (the {CHAINED} splits {splits}, then the splits swapped), "
             "both forwards before either backward, as a MoE layer's dispatch and combine")
    x, grad_out = _rows(rank, sum(splits[rank])), _rows(rank, sum(splits[rank]), offset=1000.0)
    assert got["error"] is None, f"{T161}: {where} failed: {got['error']}"
    assert _close(got["y"], 2 * x), (
        f"{T161}: {where}: got {got['y'][:, 0].tolist()}, expected twice this rank's rows {(2 * x)[:, 0].tolist()}")
    if not _close(got["grad_x"], 2 * grad_out):
        pytest.fail(f"{T161}: {where}: x's gradient is {got['grad_x'][:, 0].tolist()}, expected "
                    f"{(2 * grad_out)[:, 0].tolist()}, while each all_to_all alone with these splits gave the right "
                    "gradient: the second call's forward changed what the first call's backward uses. Keep each "
                    "call's splits (and group) on its own ctx, not on the class or in a global: a MoE layer runs "
                    "two all-to-alls before either backward")


def _a2a_in_groups(rank, world_size, impl):
    """all_to_all inside the groups [0, 1] and [2, 3] of 4 ranks: (group rank, result or error, the sizes of the
    groups its collectives ran over)."""
    ep = judging(impl, "16.1")
    group = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    grank, splits = rank % 2, GROUP_SPLITS
    input_splits, output_splits = splits[grank], [splits[s][grank] for s in range(2)]
    x = _rows(grank, sum(input_splits)).requires_grad_()
    grad_out = _rows(grank, sum(output_splits), offset=1000.0)
    with Wire() as wire:
        try:
            y = ep.all_to_all(x, output_splits, input_splits, group)
            (grad_x,) = torch.autograd.grad(y, x, grad_out)
        except RuntimeError as error:
            return grank, one_line(error), sorted({c.group_size for c in wire.calls})
    return grank, (y.detach(), grad_x), sorted({c.group_size for c in wire.calls})


GROUP_SPLITS = [[1, 2], [0, 3]]  # in a group of 2: rank 0 sends 1 row to itself and 2 to rank 1; rank 1 3 to itself


@pytest.mark.task16_1
@pytest.mark.slow
def test_all_to_all_runs_inside_the_group_it_is_given(impl):
    judging(impl, "16.1")
    for rank, (grank, got, sizes) in enumerate(run_ranks(_a2a_in_groups, 4, impl)):
        where = (f"all_to_all on rank {rank} (rank {grank} of the group {[rank - grank, rank - grank + 1]} of 4 ranks, "
                 f"splits {GROUP_SPLITS})")
        assert sizes == [2], (
            f"{T161}: {where} ran all-to-alls over groups of {sizes} ranks, not over the 2 of the group it was given: "
            "pass group=group to dist.all_to_all_single, forward and backward (the default group is all 4)"
            + (f" ({got})" if isinstance(got, str) else ""))
        assert not isinstance(got, str), f"{T161}: {where} failed: {got}"
        y_expected, grad_expected = _expected_a2a(grank, 2, GROUP_SPLITS)
        assert _close(got[0], y_expected) and _close(got[1], grad_expected), (
            f"{T161}: {where}: received {got[0][:, 0].tolist()} and x's gradient {got[1][:, 0].tolist()}; expected "
            f"{y_expected[:, 0].tolist()} and {grad_expected[:, 0].tolist()}")


# --------------------------------------------------------------------------- the MoE layer (16.2-16.4)
def _moe_case(world_size, num_experts, top_k, capacity_factor, case):
    """(moe, xs, grads): a float64 models.MoE, each rank's (TOKENS, DIM) tokens and an upstream gradient for
    them, the same on every rank (seeded). case "one expert": every token of rank 0 goes first to expert 0;
    "idle expert": no token of any rank chooses the last expert."""
    torch.manual_seed(1000 * num_experts + 10 * top_k + world_size)
    moe = models.MoE(DIM, HIDDEN, num_experts, top_k, capacity_factor).double()
    xs = [torch.randn(TOKENS, DIM, dtype=torch.float64) for _ in range(world_size)]
    grads = [torch.randn(TOKENS, DIM, dtype=torch.float64) for _ in range(world_size)]
    with torch.no_grad():
        if case == "one expert":  # rank 0's tokens along the router's row 0, far from the others
            direction = moe.router.weight[0] / moe.router.weight[0].norm()
            xs[0] = 4 * direction + 0.05 * xs[0]
            moe.router.weight[0] = 3 * direction
        if case == "idle expert":  # every token has a positive first feature; the last expert's row says no to it
            for x in xs:
                x[:, 0] = x[:, 0].abs() + 2.0
            moe.router.weight[-1] = 0.0
            moe.router.weight[-1, 0] = -5.0
    for x in xs:
        routing = models.route(moe.router(x), top_k, capacity_factor)
        if case == "one expert" and x is xs[0]:
            assert (routing.expert[:, 0] == 0).all(), "the test's 'one expert' case does not hold: fix the test"
        if case == "idle expert":
            assert not (routing.expert == num_experts - 1).any(), "the test's 'idle expert' case does not hold"
    return moe, xs, grads


def _reference(moe, xs, grads):
    """models.MoE on each rank's slice in turn: outputs, aux losses, each slice's input gradient and
    router gradient (its own loss's), and every expert's gradient summed over the slices' losses."""
    moe = copy.deepcopy(moe)
    out = dict(y=[], aux=[], grad_x=[], grad_router=[], expert_inputs=[], y_ungated=[], kept=[], x=[x.clone() for x in xs],
               choice_major=[])
    total = 0
    for x, g in zip(xs, grads):
        x = x.clone().requires_grad_()
        y = moe(x)
        loss = (y * g).sum() + AUX * moe.aux_loss
        (grad_router,) = torch.autograd.grad(loss, moe.router.weight, retain_graph=True)
        total = total + loss
        out["y"].append(y.detach())
        out["aux"].append(moe.aux_loss.detach())
        out["grad_router"].append(grad_router)
        out["grad_x"].append(x)
        routing = models.route(moe.router(x.detach()), moe.top_k, moe.capacity_factor)
        out["expert_inputs"].append([x.detach()[torch.where((routing.expert == e) & routing.kept)[0]]
                                     for e in range(moe.num_experts)])
        # every first choice before any second choice: the order a choice-by-choice enumeration gives
        out["choice_major"].append([x.detach()[torch.where(((routing.expert == e) & routing.kept).t())[1]]
                                    for e in range(moe.num_experts)])
        with torch.no_grad():  # what a combine that forgets the gates gives
            ungated = torch.zeros_like(x)
            for e, expert in enumerate(moe.experts):
                token = torch.where((routing.expert == e) & routing.kept)[0]
                ungated.index_add_(0, token, expert(x.detach()[token]))
        out["y_ungated"].append(ungated)
        out["kept"].append(int(routing.kept.sum()))
    total.backward()
    out["grad_x"] = [x.grad for x in out["grad_x"]]
    out["grad_experts"] = [{name: p.grad.clone() for name, p in expert.named_parameters()} for expert in moe.experts]
    return out


def _counts_check(rank, expected_rows, task):
    """A Wire check that stops a receiver guessing its sizes before its token all-to-all runs: gloo does not
    notice a wrong size (a wrong result, or rows of garbage), NCCL may hang. A token all-to-all (float64) that
    comes before any all-to-all of integers (the count exchange) in the same forward is refused, naming it."""
    seen = {"counts": 0, "tokens": 0}  # one Wire per layer call: its first token all-to-all is dispatch's

    def check(call, group):
        if call.kind not in ("all_to_all_single", "all_to_all"):
            if call.dtype is not None and not call.dtype.is_floating_point:
                seen["counts"] += 1  # counts sent otherwise (an all-gather): said by the checks of the wire
            return
        if call.dtype is not None and not call.dtype.is_floating_point:
            seen["counts"] += 1
            return
        kinds = {d.startswith(("float", "bfloat")) for d, _ in call.tensors}
        if not seen["counts"] and not seen["tokens"] and call.shape is not None and len(call.shape) == 1 and len(kinds) == 2:
            raise AssertionError(  # an integer tensor among them: the counts, received into a float buffer
                f"{TASK[task]}: rank {rank} exchanges its counts with tensors of two dtypes "
                f"({[d for d, _ in call.tensors]}): the buffer it receives the counts in is a float, the counts "
                "integers: make it like the counts (torch.empty_like(counts)), so that the split sizes taken from it "
                "(.tolist()) are ints (gloo also refuses tensors of different dtypes)")
        if not seen["counts"] and not seen["tokens"] and call.shape is not None and len(call.shape) == 1:
            raise AssertionError(  # the tokens are (rows, dim): a 1-D tensor first is the counts
                f"{TASK[task]}: rank {rank} exchanges its counts as {dtype_name(call.dtype)} (a 1-D all-to-all of "
                f"{call.shape[0]} elements before the tokens): count in integers (torch.bincount gives int64), so that "
                "the split sizes taken from them (.tolist()) are ints")
        if not seen["counts"] and not seen["tokens"]:
            raise AssertionError(
                f"{TASK[task]}: rank {rank} sends its tokens (an all-to-all that would receive {call.shape[0] if call.shape else '?'} "
                f"rows; the ranks send it {expected_rows}) with no count exchange before it: it guessed its sizes. "
                "Exchange the counts first (one all-to-all of the E per-expert counts), so that every rank knows how "
                "many rows it receives from each rank and for which expert")
        seen["tokens"] += 1
    return check


CONFIGS_FAST = [(4, 1, 8.0, "one expert"), (4, 2, 0.5, "plain")]  # k = 1 without drops first: order shows
# With the fast ones, E = 4 on 2 ranks and E = 8 on 4 ranks each see k = 1 and 2 with drops (0.5) and without (8.0)
CONFIGS_2 = [(4, 1, 0.5, "plain"), (4, 2, 8.0, "plain"), (4, 2, 1.25, "idle expert")]
CONFIGS_4 = [(8, 1, 8.0, "plain"), (8, 2, 8.0, "plain"), (8, 2, 0.5, "plain"), (8, 1, 0.5, "one expert"),
             (8, 2, 0.5, "idle expert"), (4, 2, 0.5, "plain")]  # the last: one expert a rank


def _layer(rank, world_size, impl, task, configs):
    ep = judging(impl, task)
    results = []
    for num_experts, top_k, capacity_factor, case in configs:
        moe, xs, grads = _moe_case(world_size, num_experts, top_k, capacity_factor, case)
        ref = _reference(moe, xs, grads)
        per_rank = num_experts // world_size
        mine = range(rank * per_rank, (rank + 1) * per_rank)
        expected_rows = sum(len(ref["expert_inputs"][s][e]) for s in range(world_size) for e in mine)
        got = dict(config=(num_experts, top_k, capacity_factor, case), error=None)
        # dispatch alone, on the reference routing
        routing = models.route(moe.router(xs[rank]), top_k, capacity_factor)
        with Wire(check=_counts_check(rank, expected_rows, task)) as wire:
            try:
                inputs, plan = ep.dispatch(xs[rank], routing, num_experts)
            except NotImplementedError:
                raise
            except RuntimeError as error:  # said with the splits' contract: a split error alone names no cause
                said = str(error)
                last = wire.calls[-1] if wire.calls else None
                short = [n for _, n in last.tensors if n != num_experts] if last is not None and last.tensors and all(
                    not d.startswith(("float", "bfloat")) for d, _ in last.tensors) else []
                tokens_call = last if last is not None and any(d.startswith(("float", "bfloat")) for d, _ in last.tensors) else None
                every_choice = sum(int((models.route(moe.router(xs[s]), top_k, capacity_factor).expert == e).sum())
                                   for s in range(world_size) for e in mine)
                unwaited = [c.kind for c in wire.calls if not c.waited]
                hint = (f"its {unwaited[0]} was started with async_op=True and its Work never waited for: the counts "
                        "(or rows) are in the buffer only once work.wait() has returned, the split sizes read from it "
                        "before then are garbage; wait before using them (or call it without async_op)"
                        if unwaited else
                        "the counts count every choice, also those past their expert's capacity (routing.kept False), "
                        f"so this rank expects {tokens_call.tensors[0][1] // DIM} rows, not the {expected_rows} kept ones "
                        "sent to its experts: count the kept (token, choice) pairs alone, the ones that travel"
                        if tokens_call is not None and every_choice != expected_rows
                        and tokens_call.tensors[0][1] == every_choice * DIM else
                        "the ranks disagree on how many rows go from one to another (gloo compares what a rank sends "
                        "itself with what it receives from itself): input_splits[s] of a rank must equal output_splits "
                        "of rank s for it. input_splits: this rank's counts viewed (N destination ranks, E / N experts), "
                        "summed over dim 1; output_splits: the exchanged counts viewed (N source ranks, E / N local "
                        "experts), summed over dim 1 (the local experts), one per source rank"
                        if "LengthPerRank" in said else
                        f"the count exchange sends E = {num_experts} integers, one per expert, also for the experts "
                        f"this rank sends no pair to; it had {short[0]}: torch.bincount(expert, minlength=E) (without "
                        "minlength it stops at the highest expert chosen)" if short else
                        "the all-to-all's output_splits are the rows this rank RECEIVES from each rank: the sums of "
                        "the counts the others sent here (the exchanged counts), not the rows it sends (input_splits)"
                        if "split_sizes to sum" in said or "Split sizes" in said else
                        "input_splits and output_splits hold one number per rank of the group (N), the exchanged "
                        "counts viewed as (N source ranks, E / N local experts) and summed over the experts"
                        if "splits not equal to group size" in said else "")
                if not hint:
                    raise
                raise AssertionError(f"{TASK[task]}: rank {rank} of {world_size}, E={num_experts}, k={top_k}, "
                                     f"capacity_factor={capacity_factor}, {case}: dispatch failed: "
                                     f"{one_line(error)}: {hint}") from None
        unwaited = [c.kind for c in wire.calls if not c.waited]
        assert not unwaited, (
            f"{TASK[task]}: rank {rank} of {world_size}, E={num_experts}, k={top_k}, capacity_factor={capacity_factor}, "
            f"{case}: dispatch's {unwaited[0]} was started with async_op=True and its Work never waited for: its output "
            "holds the counts (or rows) only once work.wait() has returned; wait before reading it")
        if task == "16.2" and (num_experts, top_k, capacity_factor, case) == configs[0]:  # float32 tokens, float64 gates
            with Wire() as wire32:
                inputs32, _ = ep.dispatch(xs[rank].float(), routing, num_experts)
            got["float32_inputs"] = sorted({dtype_name(t.dtype) for t in inputs32})
            got["float32_wire"] = sorted({d for c in wire32.calls for d, _ in c.tensors if d.startswith(("float", "bfloat"))})
        got["expert_inputs"] = [t.detach().clone() for t in inputs]
        got["dispatch_wire"] = [(c.kind, c.tensors) for c in wire.calls]
        got.update(ref=ref, mine=list(mine), routing=routing)
        if task == "16.2":
            _check_expert_inputs(rank, world_size, got)
            _check_plan(rank, world_size, got, plan)
        if task == "16.3":  # combine alone, every expert the identity: y[t] = (token t's kept gates' sum) x[t]
            try:
                got["identity"] = ep.combine([t.detach().clone() for t in inputs], plan).detach()
            except (RuntimeError, IndexError):  # the layer below says it, with its own hint
                got["identity"] = None
            try:  # float32 outputs, float64 gates (models.route's, of a float64 router): y is float32
                got["identity_float32"] = ep.combine([t.detach().float() for t in inputs], plan).dtype
            except (RuntimeError, IndexError) as error:
                got["identity_float32"] = one_line(error)
        # the layer
        copied = copy.deepcopy(moe)
        layer = ep.ExpertParallelMoE.from_moe(copied)
        got["held"] = [_which_expert(moe, mlp) for mlp in layer.experts]
        router = getattr(getattr(layer, "router", None), "weight", None)
        got["router_same"] = isinstance(router, torch.Tensor) and router.shape == moe.router.weight.shape and torch.equal(
            router, moe.router.weight)
        del copied
        x = xs[rank].clone().requires_grad_()
        with Wire(check=_counts_check(rank, expected_rows, task)) as wire:
            try:
                y = layer(x.view(1, TOKENS, DIM))
                forward = [(c.kind, c.tensors) for c in wire.calls]
                aux = layer.aux_loss
                loss = (y.view(TOKENS, DIM) * grads[rank]).sum() + AUX * (aux if isinstance(aux, torch.Tensor) else 0.)
                loss.backward()
            except (RuntimeError, IndexError, ValueError) as error:  # said here, at once: the other ranks may wait
                kept = ref["kept"][rank]
                said = str(error)
                sizes = re.search(r"got split_sizes=\[([0-9, ]*)\]", said)
                sizes = [int(n) for n in sizes[1].split(",") if n.strip()] if sizes else None
                rows = [r.tolist() for r in plan.received] if isinstance(getattr(plan, "received", None), torch.Tensor) else []
                columns = [c.tolist() for c in plan.received.t()] if rows else []
                hint = ("; the gates are one per sent pair, (K,), and they were (K, K): plan.weight[plan.token][:, "
                        "plan.choice] takes every pair's choice column for every pair's token; index both at once, "
                        "plan.weight[plan.token, plan.choice] (then a trailing dimension, .unsqueeze(-1))"
                        if task == "16.3" and re.search(rf"source.shape = \[{kept}, {kept}, {DIM}\]", said) else
                        "; the gates are a vector of one per row, the outputs (rows, dim): give the gate a trailing "
                        "dimension (gate.unsqueeze(-1), or gate[:, None]) so that it scales each row"
                        if task == "16.3" and re.search(rf"size of tensor a \(({kept}|{DIM})\) must match the size of "
                                                        rf"tensor b \(({kept}|{DIM})\)", said) and kept != DIM else
                        "; combine split an expert's output by a ROW of plan.received: received[s, j] counts the rows "
                        "from rank s for local expert j, so local expert j's output splits by the column "
                        "plan.received[:, j], one piece per source rank"
                        if task == "16.3" and sizes is not None and sizes in rows and sizes not in columns else
                        "; the output has one row per kept choice: combine returned the outputs in the order dispatch "
                        "sent them, not in token order (add each at its token, plan.token)"
                        if f"input of size {kept * DIM}" in str(error) and kept != TOKENS else
                        "; combine's all-to-all goes back the reverse way of dispatch's: it sends the rows that arrived "
                        "(sum(plan.output_splits)) and receives the rows that were sent (sum(plan.input_splits)): "
                        "all_to_all(send, plan.input_splits, plan.output_splits)"
                        if task == "16.3" and "Split sizes" in str(error) else
                        "; the layer gets (B, S, dim) tokens, models.route takes (T, E) logits: flatten the tokens to "
                        "(T, dim) first, as models.MoE does, and reshape the output back"
                        if isinstance(error, ValueError) and "unpack" in str(error) else
                        "; a tensor made in torch's default dtype (float32) met the float64 expert outputs: make new "
                        "tensors in the outputs' dtype (back.new_zeros(...), or dtype=...)"
                        if "self (Float) and source (Double)" in str(error) else
                        f"; combine alone returned {got['identity'].shape[0]} rows for this rank's {TOKENS} tokens: y has "
                        "one row per token, T = plan.weight.shape[0] (the routing's), zeros for a token none of whose "
                        "choices was kept" if task == "16.3" and isinstance(got.get("identity"), torch.Tensor)
                        and got["identity"].shape[0] != TOKENS else "")
                raise AssertionError(f"{TASK[task]}: rank {rank} of {world_size}, E={num_experts}, k={top_k}, "
                                     f"capacity_factor={capacity_factor}, {case}: the layer failed: "
                                     f"{type(error).__name__}: {error}{hint}") from None
            backward = [(c.kind, c.tensors) for c in wire.calls[len(forward):]]
        # what the layer keeps on itself after a step (activations in the graph stay alive until the next forward),
        # and its aux_loss after a second forward (the last forward's, not a running sum)
        got["kept_on_layer"] = sorted(name for name, v in vars(layer).items() if name != "aux_loss" and any(
            torch.is_tensor(t) and t.grad_fn is not None for t in (v if isinstance(v, (list, tuple)) else [v])))
        if task == "16.4":  # the layer is 16.4's
            with torch.no_grad():
                layer(xs[rank].view(1, TOKENS, DIM))
            got["aux_again"] = layer.aux_loss.detach() if isinstance(layer.aux_loss, torch.Tensor) else layer.aux_loss
        got.update(y=y.detach().view(TOKENS, DIM), aux=aux.detach() if isinstance(aux, torch.Tensor) else aux,
                   aux_in_graph=isinstance(aux, torch.Tensor) and aux.requires_grad,
                   grad_x=x.grad, grad_router=layer.router.weight.grad, forward=forward, backward=backward,
                   num_local=len(layer.experts),
                   grad_experts=[{n: None if p.grad is None else p.grad.clone() for n, p in e.named_parameters()}
                                 for e in layer.experts],
                   sent=sum(len(ref["expert_inputs"][rank][e]) for e in range(num_experts)),
                   received=expected_rows)
        results.append(got)
    return results


def _which_expert(moe, mlp):
    """The index of the expert of `moe` whose fc1 weight `mlp` holds, or None."""
    weight = getattr(getattr(mlp, "fc1", None), "weight", None)
    return next((e for e, expert in enumerate(moe.experts) if isinstance(weight, torch.Tensor)
                 and weight.shape == expert.fc1.weight.shape and torch.equal(expert.fc1.weight, weight)), None)


def _combine_hint(got, rank):
    """Why combine's output differs, from combine alone on identity experts (got["identity"]): y[t] should be the
    sum of token t's kept gates times x[t]. '' when that says nothing."""
    y, routing = got.get("identity"), got["routing"]
    if y is None:
        return ""
    x = got["ref"]["x"][rank]
    if y.shape != x.shape:
        return ""
    gates = (routing.weight * routing.kept).to(x.dtype)  # (T, k)
    expected = gates.sum(dim=1, keepdim=True) * x
    if _close(y, expected):
        return ""
    scale = (y * x).sum(dim=1) / (x * x).sum(dim=1)
    if not _close(y, scale.unsqueeze(1) * x):
        wrong = next(t for t in range(x.shape[0]) if not torch.allclose(y[t], expected[t], atol=1e-10, rtol=1e-9))
        return (f": combine alone, every expert the identity, put at token {wrong} rows that are not token {wrong}'s: "
                "the outputs come back to the wrong tokens. Send them back in the order dispatch received them (for "
                "each source rank, its rows for local expert 0, then expert 1, ...: plan.received), so that the "
                "all-to-all with the splits swapped returns every rank its rows in the order it sent them")
    rounded = (routing.weight.float().to(x.dtype) * routing.kept).sum(dim=1, keepdim=True) * x
    if not _close(rounded, expected) and _close(y, rounded):
        return (": combine alone, every expert the identity, weighted each token by its gates rounded to float32: "
                "cast the gate to the outputs' dtype (float64 here), not to float32")
    renormalised = routing.kept.any(dim=1, keepdim=True).to(x.dtype) * x  # the kept gates made to sum to 1
    if not _close(renormalised, expected) and _close(y, renormalised):
        return (": combine alone, every expert the identity, weighted each token's kept outputs by gates that sum "
                "to 1 over its kept choices: renormalised after the drops. models.route's gates are already "
                "renormalised over the top k, before the capacity drops: a token whose choice was dropped keeps its "
                "other choices' gates as they are (and the residual connection carries the rest); use "
                "plan.weight[token, choice] as it is")
    several = routing.kept.sum(dim=1) > 1
    single = [(scale[t] - gates[t]).abs().min() < 1e-9 for t in range(x.shape[0]) if several[t]]
    first = [(scale[t] - gates[t, 0]).abs() < 1e-9 for t in range(x.shape[0]) if several[t]]
    if len(first) > 2 and all(first):  # index_copy keeps the choice written last: by expert, not always the first
        return (": combine alone, every expert the identity, gave each token with several kept choices its FIRST "
                "choice's output alone: y[t] sums weight[t, c] * output over EVERY kept choice c of token t (plan.choice "
                "tells which), second choices too")
    if single and all(single):
        return (": combine alone, every expert the identity, gave each token ONE of its kept choices' outputs: a "
                "token's top-k outputs must be ADDED (index_add), not written over each other (index_copy, y[token] = ...)")
    return ""


def _check_expert_inputs(rank, world_size, got):
    """Task 16.2's own checks, run in the rank right after dispatch (before the layer, which a wrong dispatch
    can break in a way that says nothing of the cause)."""
    E, k, cf, case = got["config"]
    ref, mine = got["ref"], got["mine"]
    where = f"rank {rank} of {world_size}, E={E}, k={k}, capacity_factor={cf}, {case}"
    T = T162
    expected = [torch.cat([ref["expert_inputs"][s][e] for s in range(world_size)]) for e in mine]
    inputs = got["expert_inputs"]
    assert len(inputs) == len(mine), (
        f"{T}: {where}: dispatch returned {len(inputs)} expert inputs, expected {len(mine)}, one per local expert")
    by_source = [torch.cat([ref["expert_inputs"][j][e] for e in range(rank * len(mine), (rank + 1) * len(mine))])
                 for j in range(min(world_size, len(mine)))] if world_size <= len(mine) else None
    for j, (got_j, want) in enumerate(zip(inputs, expected)):
        if got_j.shape == want.shape and torch.equal(got_j, want):
            continue
        if by_source and j < len(by_source) and got_j.shape == by_source[j].shape and torch.equal(got_j, by_source[j]):
            raise AssertionError(f"{T}: {where}: expert_inputs[{j}] holds the rows rank {j} sent, for all of this "
                                 "rank's experts: regrouped by source rank, not by expert; expert_inputs[j] holds every "
                                 f"rank's rows for local expert j (global expert {mine[j]}). What arrives is ordered "
                                 "by source rank, then local expert (rank 0's rows for local expert 0, 1, ..., then "
                                 "rank 1's): split it by the exchanged counts and take every (E / N)-th piece")
        everything = sum(int((ref["expert_inputs"][s][mine[j]]).shape[0]) for s in range(world_size))
        hint = ""
        if got_j.shape[0] > everything:
            hint = (": more rows than the kept choices: a choice past its expert's capacity (routing.kept False) "
                    "is dropped, it travels nowhere")
        elif got_j.shape == want.shape and torch.equal(got_j, torch.cat([ref["choice_major"][s][mine[j]]
                                                                          for s in range(world_size)])):
            raise AssertionError(f"{T}: {where}: expert_inputs[{j}] (global expert {mine[j]}) holds the right "
                                 f"{want.shape[0]} rows, within each rank's in choice order (every first choice, then "
                                 "every second choice), not in token order: the (token, choice) pairs were listed "
                                 "choice by choice (torch.where on routing.kept.t(), or a loop over the choices); list "
                                 "them in token order (torch.where(routing.kept)) before the stable sort by expert")
        elif got_j.shape == want.shape and torch.equal(got_j.sort(dim=0).values, want.sort(dim=0).values):
            raise AssertionError(f"{T}: {where}: expert_inputs[{j}] (global expert {mine[j]}) holds the right "
                                 f"{want.shape[0]} rows in another order: rank 0's first, then rank 1's, ..., each in "
                                 "token order (sorting the pairs by expert: a stable sort, torch.argsort(..., "
                                 "stable=True), keeps the token order within an expert)")
        else:
            owners = sorted({e for row in got_j for s in range(world_size) for e in range(E)
                             if any(torch.equal(row, other) for other in ref["expert_inputs"][s][e])} - {mine[j]})
            if owners:
                hint = (f": it holds rows routed to expert(s) {owners}, not to expert {mine[j]}: each rank sends its "
                        "pairs sorted by expert, ASCENDING (rank s's experts consecutive, in the order of the counts "
                        "that the receivers split them by), within an expert in token order")
        if not hint and got_j.shape == want.shape:
            wire = got["dispatch_wire"][-1][1] if got["dispatch_wire"] else []
            sent = sorted({d for d, _ in wire if d.startswith(("float", "bfloat"))})
            norms = (want * want).sum(dim=1)
            scale = torch.where(norms > 0, (got_j * want).sum(dim=1) / norms.clamp_min(1e-300), torch.ones_like(norms))
            if sent and sent != [dtype_name(want.dtype)]:  # the symptom: the tokens' all-to-all in another dtype
                hint = (f": the right rows, but they travelled as {sent} and the tokens are {dtype_name(want.dtype)}: "
                        "a copy in another dtype loses precision (float64) or doubles the bytes (bfloat16); send "
                        "x[token] as it is, in x's dtype")
            elif torch.allclose(got_j, scale[:, None] * want) and not torch.allclose(scale, torch.ones_like(scale)):
                hint = (f": rows are their tokens times factors ({', '.join(f'{v:.4g}' for v in sorted(scale.tolist(), key=lambda v: -abs(v - 1))[:4])}, ...): the "
                        "tokens were scaled (by their gates?) before they were sent. dispatch sends the tokens as they "
                        "are; combine multiplies the experts' OUTPUTS by the gates (an expert is not linear)")
            else:
                hint = (f": the right number of rows with other values (largest difference "
                        f"{(got_j - want).abs().max().item():.3g}): expert_inputs[j] holds the tokens x[t] themselves")
        raise AssertionError(f"{T}: {where}: expert_inputs[{j}] (global expert {mine[j]}) has {got_j.shape[0]} "
                             f"rows, expected {want.shape[0]}{hint}" if got_j.shape != want.shape else
                             f"{T}: {where}: expert_inputs[{j}] (global expert {mine[j]}) has the expected "
                             f"{want.shape[0]} rows, with other values{hint}")
    if "float32_inputs" in got:
        assert got["float32_inputs"] in ([], ["float32"]) and got["float32_wire"] in ([], ["float32"]), (
            f"{T}: {where}: dispatch of float32 tokens with float64 gates (a float64 router's) gave expert inputs of "
            f"{got['float32_inputs']}, and sent {got['float32_wire']} on the wire: the tokens travel in their own "
            "dtype (x[token] as it is), not in the gates' dtype (routing.weight's is float32 at least, whatever the "
            "model's: a bfloat16 model's tokens would travel at twice the bytes)")
    kinds = [kind for kind, _ in got["dispatch_wire"]]
    assert len(kinds) == 2 and kinds[1] == "all_to_all_single" and kinds[0] in ("all_to_all_single", "all_to_all"), (
        f"{T}: {where}: dispatch should send one count exchange (an all-to-all of E integers) and one all-to-all "
        f"of the tokens; it sent {got['dispatch_wire']}" + (
            ": exchange the counts first" if len(kinds) < 2 else
            f": {len(kinds) - 1} exchanges of integers before the tokens: the E per-expert counts alone tell every rank "
            "its splits (input_splits: its own counts summed per destination rank; output_splits: the exchanged "
            "counts viewed (N, E / N), summed over the local experts): no second exchange"
            if len(kinds) > 2 and all(all(not d.startswith(("float", "bfloat")) for d, _ in tensors)
                                      for _, tensors in got["dispatch_wire"][:-1]) else
            ": the counts went by an all-gather, every rank receiving all N x E counts; one all-to-all of the E "
            "counts gives each rank just those of its own experts, from each rank" if "gather" in kinds[0] else ""))
    counts = got["dispatch_wire"][0][1]  # all_to_all_single: (output, input); all_to_all: the lists' pieces
    assert all(not d.startswith(("float", "bfloat")) for d, _ in counts) and (
        all(n == E for _, n in counts) if kinds[0] == "all_to_all_single" else sum(n for _, n in counts) == 2 * E), (
        f"{T}: {where}: the count exchange should be E = {E} integers each way (tensors {counts})")


def _check_plan(rank, world_size, got, plan):
    """Task 16.2's Plan against its contract, in the rank right after dispatch (combine, solutions/' here, reads it:
    a wrong plan shows only later, as wrong gradients or a split error that names no cause)."""
    E, k, cf, case = got["config"]
    routing, ref, mine = got["routing"], got["ref"], got["mine"]
    where = f"rank {rank} of {world_size}, E={E}, k={k}, capacity_factor={cf}, {case}"
    T = T162
    pairs = [torch.where((routing.expert == e) & routing.kept) for e in range(E)]  # by expert, then token order
    token, choice = torch.cat([t for t, _ in pairs]), torch.cat([c for _, c in pairs])
    got_token, got_choice = getattr(plan, "token", None), getattr(plan, "choice", None)
    if not (isinstance(got_token, torch.Tensor) and isinstance(got_choice, torch.Tensor)
            and torch.equal(got_token, token) and torch.equal(got_choice, choice)):
        same = (isinstance(got_token, torch.Tensor) and isinstance(got_choice, torch.Tensor)
                and got_token.shape == token.shape and got_choice.shape == choice.shape
                and sorted(zip(got_token.tolist(), got_choice.tolist())) == sorted(zip(token.tolist(), choice.tolist())))
        raise AssertionError(
            f"{T}: {where}: plan.token and plan.choice " + (
                "hold this rank's kept (token, choice) pairs in another order than the rows it sent (by expert, "
                "within an expert in token order): combine gets the outputs back in the order the rows were sent and "
                "adds each at plan.token, so the pairs must be listed in that same order (sort token and choice "
                "with the rows, by the same permutation)" if same else
                f"should be the {len(token)} kept (token, choice) pairs of this rank, in the order their rows were "
                f"sent; they are {tuple(got_token.shape) if isinstance(got_token, torch.Tensor) else got_token} "
                f"and {tuple(got_choice.shape) if isinstance(got_choice, torch.Tensor) else got_choice}"))
    sent = [sum(len(ref["expert_inputs"][rank][e]) for e in range(d * len(mine), (d + 1) * len(mine)))
            for d in range(world_size)]
    came = [[len(ref["expert_inputs"][s][e]) for e in mine] for s in range(world_size)]
    for name, want in (("input_splits", sent), ("output_splits", [sum(row) for row in came])):
        have = getattr(plan, name, None)
        assert isinstance(have, (list, tuple)) and all(type(n) is int for n in have), (
            f"{T}: {where}: plan.{name} is {have!r}: N Python ints, one per rank of the group (a tensor's .tolist()), "
            "as the Plan's docstring says: all_to_all takes its split sizes as ints")
        assert list(have) == want, (
            f"{T}: {where}: plan.{name} is {list(have)}, expected {want}: the rows this rank "
            + ("sent to each rank" if name == "input_splits" else "received from each rank"))
    received = getattr(plan, "received", None)
    if not (isinstance(received, torch.Tensor) and received.tolist() == came):
        own = [[len(ref["expert_inputs"][rank][e]) for e in range(d * len(mine), (d + 1) * len(mine))]
               for d in range(world_size)]
        have = received.tolist() if isinstance(received, torch.Tensor) else received
        raise AssertionError(
            f"{T}: {where}: plan.received is {have}, expected {came} (received[s, j]: the rows rank s sent for this "
            "rank's local expert j, the exchanged counts viewed (N, E / N))" + (
                ": it holds the counts this rank SENT (its own, viewed by destination rank), not those it received "
                "from the others; combine splits what it sends back by them" if have == own != came else
                f": the right numbers as a {type(received).__name__}, not a tensor: the Plan holds received as the "
                "(N, E / N) long tensor (combine takes its .shape and its columns)"
                if not isinstance(received, torch.Tensor) and have == came else ""))
    weight = getattr(plan, "weight", None)
    kept = routing.kept
    assert isinstance(weight, torch.Tensor) and weight.shape == routing.weight.shape and torch.equal(
        weight.detach()[kept], routing.weight.detach()[kept]), (
        f"{T}: {where}: plan.weight should be routing.weight, the (T, k) gates"
        + (f", it is {tuple(weight.shape)}" if isinstance(weight, torch.Tensor) else f", it is {weight!r}"))
    assert weight.requires_grad, (
        f"{T}: {where}: plan.weight is out of the graph (detached, or a copy without grad): combine multiplies each "
        "expert output by plan.weight[token, choice], and the router learns through it: pass routing.weight itself")


def _check_held(task, rank, world_size, got):
    """Which experts the layer holds: checked on every rank before any rank's values, which a rank holding the
    wrong experts spoils on the others too (they send it tokens)."""
    E, k, cf, case = got["config"]
    mine = got["mine"]
    where = f"rank {rank} of {world_size}, E={E}, k={k}, capacity_factor={cf}, {case}"
    T = TASK[task]
    assert got["num_local"] == len(mine), (
        f"{T}: {where}: the layer holds {got['num_local']} experts in `experts`, expected E / N = {len(mine)}: a rank keeps "
        "its own experts only, the others' memory is not freed otherwise")
    assert got["router_same"], (
        f"{T}: {where}: the layer's router weight is not the models.MoE's: the router is the MoE's own (or a copy of "
        "it), whole on every rank; a new nn.Linear starts from new random weights")
    assert got["held"] == mine, (
        f"{T}: {where}: the layer holds the experts {got['held']} of the models.MoE, expected {mine}: rank r holds the "
        "consecutive experts [r * E / N, (r + 1) * E / N) (local_experts), which dispatch sends their tokens to"
        + ("; this rank took rank 0's experts, 0 ... E / N - 1: take moe.experts[e] for e in local_experts(E, group), "
           "this rank's range: either they were taken for the positions 0, 1, ... of that range, or this rank's "
           "rank was taken as 0 (with group None too, the default group, dist.get_rank(group) gives this rank's)"
           if rank > 0 and got["held"] == list(range(len(mine))) else ""))


def _check_layer(task, rank, world_size, got):
    E, k, cf, case = got["config"]
    ref, mine = got["ref"], got["mine"]
    where = f"rank {rank} of {world_size}, E={E}, k={k}, capacity_factor={cf}, {case}"
    T = TASK[task]
    _check_held(task, rank, world_size, got)
    forward, backward = got["forward"], got["backward"]
    send, recv = got["sent"] * DIM, got["received"] * DIM
    tokens = [("float64", recv), ("float64", send)]
    expected_forward = [tokens, tokens[::-1]]
    token_calls = [tensors for kind, tensors in forward if kind == "all_to_all_single" and tensors[0][0] == "float64"]
    others = [(kind, tensors) for kind, tensors in forward if not (kind == "all_to_all_single" and tensors[0][0] == "float64")]
    if token_calls and len(token_calls[0]) == 2 and token_calls[0][1][1] != send:
        rows = token_calls[0][1][1] // DIM
        pytest.fail(f"{T}: {where}: the layer sent {rows} rows of its {TOKENS} tokens' choices; models.MoE keeps "
                    f"{got['sent']} of them (models.route: capacity = ceil(capacity_factor * T * k / E) counted on THIS "
                    "rank's T tokens, and only the kept pairs travel): route this rank's tokens as models.MoE does, "
                    "models.route(logits, self.top_k, self.capacity_factor)")
    assert len(others) == 1 and token_calls == expected_forward, (
        f"{T}: {where}: a MoE layer's forward should send exactly one count exchange and two all-to-alls of the kept "
        f"tokens ({got['received']} rows in and {got['sent']} out, then back); it sent {forward}")
    if not backward and forward:
        pytest.fail(f"{T}: {where}: the layer's backward sent no all-to-all: the experts' outputs never went back "
                    "through the graph, so neither combine's nor dispatch's all-to-all ran backward (the experts get no "
                    "gradient, nor the tokens through them): "
                    + ("combine's way back was cut from the graph (dist.all_to_all_single, which autograd does not "
                       "see, or the rows detached): send them back with all_to_all (16.1), differentiable"
                       if task == "16.3" else "send the tokens there and the outputs back with all_to_all (16.1), "
                       "differentiable, not dist.all_to_all_single, which autograd does not see, nor detached rows"))
    if len(backward) == 1 and not _close(got["grad_x"], ref["grad_x"][rank]):
        pytest.fail(f"{T}: {where}: the layer's backward sent one all-to-all, combine's, and the input's gradient differs "
                    "from models.MoE's: the tokens' gradients never came back through dispatch's all-to-all, whose "
                    "rows were cut from the graph (x[token].detach(), or dist.all_to_all_single, which autograd does "
                    "not see): send them with all_to_all (16.1), differentiable")
    assert sorted(t for _, t in backward) == sorted(expected_forward) and len(backward) == 2, (
        f"{T}: {where}: the layer's backward should send two all-to-alls (the tokens' gradients back the way they "
        f"came), it sent {backward}")
    y_ref = ref["y"][rank]
    y = got["y"]
    if not _close(y, y_ref):
        tokens_y = y.shape[0] == y_ref.shape[0]
        hint = ""
        if (tokens_y and _close(y.sort(dim=0).values, y_ref.sort(dim=0).values)) or (
                not tokens_y and y.shape[0] == ref["kept"][rank]):
            hint = (": the outputs are returned in the order dispatch sent them (one row per kept choice, by "
                    "expert), not in token order: add each at its token (plan.token), in the original token order")
        elif tokens_y and _close(y, ref["y_ungated"][rank]):
            hint = (": each kept expert output was added with weight 1, not with its gate: weight by the gate, "
                    "plan.weight[token, choice]; without it the router gets no gradient and never learns"
                    + (" (gates renormalised over a token's kept choices are 1 when k = 1: models.route's gates are "
                       "already renormalised over the top k, before the drops; use them as they are)" if k == 1 else ""))
        else:
            hint = _combine_hint(got, rank)
        pytest.fail(f"{T}: {where}: the layer's output differs from models.MoE's by "
                    f"{(y - y_ref).abs().max().item() if tokens_y else 'its shape ' + str(tuple(y.shape))}{hint}")
    assert isinstance(got["aux"], torch.Tensor) and _close(got["aux"], ref["aux"][rank]), (
        f"{T}: {where}: the layer's aux_loss is {got['aux']}, models.MoE's {ref['aux'][rank].item()}: " + (
            "set self.aux_loss in forward as models.MoE does (vit.aux_loss() finds it by that name)"
            if not isinstance(got["aux"], torch.Tensor) else
            "computed otherwise than models.MoE's: models.load_balancing_loss(probs, routing.expert, E) on this rank's "
            "T tokens, probs the softmax of the router's logits (T, E), routing.expert ALL k choices of each token "
            "(before any is dropped), as models.MoE.forward does"))
    assert got["aux_in_graph"], (
        f"{T}: {where}: the layer's aux_loss has the right value but is out of the graph (requires_grad False): the "
        "load-balancing loss trains the router through it; keep it in the graph, as models.MoE does (no detach, no .item())")
    # the router's first: with the outputs right, only the gates' path makes it differ (and then x's too)
    if got["grad_router"] is None or not _close(got["grad_router"], ref["grad_router"][rank]):
        pytest.fail(f"{T}: {where}: the router's gradient differs from models.MoE's ("
                    + ("None" if got["grad_router"] is None else f"by {(got['grad_router'] - ref['grad_router'][rank]).abs().max().item():.3g}")
                    + ("): the layer's gates are out of the graph: the router learns from the gates, routing.weight of "
                       "models.route(logits, ...), which combine multiplies each output by, and from aux_loss; route the "
                       "logits themselves (not logits.detach(), nor under torch.no_grad()), as models.MoE does"
                       if task == "16.4" else
                       "): combine multiplies each expert output by its gate, plan.weight[token, choice], which is in the "
                       "graph (not detached): that is how the router learns"))
    assert _close(got["grad_x"], ref["grad_x"][rank]), (
        f"{T}: {where}: the input's gradient differs from models.MoE's")
    if got.get("identity_float32") not in (None, torch.float32) and got.get("identity") is not None:
        pytest.fail(f"{T}: {where}: combine of float32 expert outputs with float64 gates "
                    + (f"failed ({got['identity_float32']})" if isinstance(got["identity_float32"], str) else
                       f"returned {got['identity_float32']}")
                    + (": the buffer y is summed into was made in the gates' dtype (float64, plan.weight.new_zeros or "
                       "dtype=plan.weight.dtype) while the gated outputs are float32: make y in the OUTPUTS' dtype "
                       "(back.new_zeros(...)), as the docstring's 'the weight cast to the outputs' dtype' asks"
                       if "self (Double) and source (Float)" in str(got["identity_float32"]) else
                       ": cast the gate to the outputs' dtype (plan.weight is float32 at least, models.route's "
                       "softmax, whatever the experts' dtype: a bfloat16 model's MoE layer must still return bfloat16)"))
    for j, e in enumerate(mine):
        for name, want in ref["grad_experts"][e].items():
            have = got["grad_experts"][j][name]
            if have is None:
                pytest.fail(f"{T}: {where}: local expert {j} (global {e}) {name} has no gradient (None), models.MoE's is "
                            + ("zeros" if not want.any() else "not") + ": every local expert runs, also on no row "
                            "(a (0, dim) tensor) when none came, so that its gradients are zeros, not None (the "
                            "optimizer and the gradient sync then see the same parameters on every rank)")
            assert _close(have, want), (
                f"{T}: {where}: local expert {j} (global {e}) {name}'s gradient differs from the sum over the ranks' "
                f"losses of models.MoE's (max difference "
                f"{'None' if have is None else (have - want).abs().max().item():}): every rank's tokens for it "
                "must reach it and their gradients come back")
    again = got.get("aux_again")
    assert not isinstance(again, torch.Tensor) or _close(again, ref["aux"][rank]), (
        f"{T}: {where}: after a second forward on the same tokens the layer's aux_loss is {again.item()}, models.MoE's "
        f"{ref['aux'][rank].item()} (the first forward's was right): self.aux_loss is the LAST forward's loss, set "
        "anew (self.aux_loss = ...), not added to the previous one: a sum over steps keeps every step's graph alive")
    assert not got.get("kept_on_layer"), (
        f"{T}: {where}: after forward and backward the layer keeps {got['kept_on_layer']} on itself, tensors of the "
        "graph (the tokens dispatched, the plan, ...): they and their graph stay alive until the next forward, "
        "memory a step no longer needs; keep them in local variables (only aux_loss is kept, as models.MoE does)")


def _refused(ep, task):
    """The ValueError's message for 3 experts over 2 ranks (None if nothing was raised)."""
    moe = models.MoE(DIM, HIDDEN, 3, 1)
    x = torch.randn(TOKENS, DIM)
    try:
        if task == "16.2":
            ep.dispatch(x, models.route(moe.router(x), 1, 1.0), 3)
        else:
            ep.ExpertParallelMoE.from_moe(moe)
        return None
    except ValueError as error:
        return str(error)


def _storage(rank, world_size, ep):
    """What a layer made from a models.MoE of 8 experts keeps, once the MoE is dropped."""
    torch.manual_seed(0)
    moe = models.MoE(DIM, HIDDEN, 8, 2)
    per_rank = 8 // world_size
    expert_bytes = sum(p.numel() * p.element_size() for p in moe.experts[0].parameters())
    router_bytes = moe.router.weight.numel() * moe.router.weight.element_size()
    others = [weakref.ref(p) for e, expert in enumerate(moe.experts) if e // per_rank != rank
              for p in expert.parameters()]
    layer = ep.ExpertParallelMoE.from_moe(moe)
    del moe
    gc.collect()
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in layer.parameters()}
    return dict(alive=sum(ref() is not None for ref in others), bytes=sum(storages.values()), per_rank=per_rank,
                expected=router_bytes + per_rank * expert_bytes, mlps=[type(e).__name__ for e in layer.experts])


def _suite(rank, world_size, impl, task, configs, extras):
    """The layer's checks for `configs`, and the `extras` ("refused", "storage", "vit") of the task, in one start
    of the ranks (each start costs a second of the default run)."""
    ep = judging(impl, task)
    out = dict(layer=_layer(rank, world_size, impl, task, configs))
    if "refused" in extras:
        out["refused"] = _refused(ep, task)
    if "storage" in extras:
        out["storage"] = _storage(rank, world_size, ep)
    if "vit" in extras:
        out["vit"] = _vit(rank, world_size, impl, task, world_size, 4, 2, 1.0)
    if "subgroups" in extras:
        out["subgroups"] = _subgroups(rank, world_size, ep)
    if "bfloat16" in extras:
        out["bfloat16"] = _aux_in_bfloat16(rank, ep)
    return out


def _aux_in_bfloat16(rank, ep):
    """The layer's aux_loss in a bfloat16 MoE against models.MoE's (its router probabilities in float32, as
    models.route's gates), and the loss of probabilities left in bfloat16: (the layer's, models.MoE's, bfloat16's)."""
    torch.manual_seed(20 + rank)
    moe = models.MoE(DIM, HIDDEN, 4, 2, 8.0).to(torch.bfloat16)
    x = torch.randn(1, TOKENS, DIM).to(torch.bfloat16)
    reference = copy.deepcopy(moe)
    reference(x)
    layer = ep.ExpertParallelMoE.from_moe(copy.deepcopy(moe))
    with torch.no_grad():
        layer(x)
        logits = moe.router(x.view(TOKENS, DIM))
        coarse = models.load_balancing_loss(logits.softmax(dim=-1), models.route(logits, 2, 8.0).expert, 4)
    aux = layer.aux_loss
    return tuple(float(a) if isinstance(a, torch.Tensor) else a for a in (aux, reference.aux_loss, coarse))


def _check_aux_in_bfloat16(rank, world_size, got):
    mine, want, coarse = got
    where = f"rank {rank} of {world_size}, a bfloat16 MoE (E = 4, k = 2)"
    if isinstance(mine, float) and abs(mine - want) > 1e-6 * abs(want) and abs(mine - coarse) <= 1e-6 * abs(coarse):
        pytest.fail(f"{T164}: {where}: the layer's aux_loss is {mine}, models.MoE's {want}: its router probabilities "
                    "were taken in bfloat16; models.MoE takes them in the gates' dtype, float32 at least "
                    "(logits.softmax(dim=-1, dtype=routing.weight.dtype)): bfloat16 probabilities are too coarse")
    assert isinstance(mine, float) and abs(mine - want) <= 1e-6 * abs(want), (
        f"{T164}: {where}: the layer's aux_loss is {mine}, models.MoE's {want}")


def _subgroups(rank, world_size, ep):
    """parallelize_moe over ep groups of half the world ([0], [1] for 2 ranks; [0, 1], [2, 3] for 4), made here:
    each converted layer's group, and the experts it holds (their indices in the models.MoE)."""
    size = world_size // 2
    groups = [dist.new_group(list(range(start, start + size))) for start in range(0, world_size, size)]
    ep_group = groups[rank // size]
    vit = _tiny_vit(4, 2, 1.0)
    original = copy.deepcopy(vit)
    _converted(ep, vit, ep_group)
    layers = []
    for name, m in vit.named_modules():
        if getattr(m, "expert_parallel", False):
            moe = original.get_submodule(name) if name in dict(original.named_modules()) else None
            group = getattr(m, "group", "no attribute `group`")
            layers.append(dict(name=name, ep_group=group is ep_group,
                               group="None (the default group)" if group is None else
                               group if isinstance(group, str) else "another group",
                               held=[_which_expert(moe, mlp) for mlp in m.experts] if isinstance(moe, models.MoE) else None))
    return dict(layers=layers, size=size, group_rank=rank % size, mine=list(range(4 * (rank % size) // size,
                                                                                    4 * (rank % size + 1) // size)))


def _converted(ep, model, ep_group):
    """ep.parallelize_moe(model, ep_group); an error said with its cause where what it was given proves it: a module
    other than a models.MoE handed to ExpertParallelMoE.from_moe, or a dotted name handed to add_module."""
    original = vars(ep.ExpertParallelMoE)["from_moe"]
    given = []

    def from_moe(cls, moe, group=None):
        given.append(type(moe).__name__)
        return original.__func__(cls, moe, group)
    ep.ExpertParallelMoE.from_moe = classmethod(from_moe)
    try:
        return ep.parallelize_moe(model, ep_group)
    except (NotImplementedError, AssertionError):
        raise
    except Exception as error:  # noqa: BLE001  said with its cause where it is proven, else as it was
        raised = f"{T164}: parallelize_moe raised {type(error).__name__}: {error}"
        dense = [name for name in given if name != "MoE"]
        if dense:
            raise AssertionError(
                f"{raised}, after it gave ExpertParallelMoE.from_moe a module of class {dense[0]}, not a models.MoE: "
                "only the MoE layers are converted; a dense block's mlp (a models.MLP: no router, no experts) stays "
                "as it is: test each module with isinstance(module, models.MoE)") from None
        if isinstance(error, KeyError) and "can't contain \".\"" in str(error.args[0] if error.args else ""):
            raise AssertionError(
                f"{raised}: add_module (and register_module) take a child's own name, without dots, on its parent "
                "module: replace each MoE in the block that holds it, setattr(model.get_submodule(parent), name, "
                "layer), parent the part of its dotted name before the last dot") from None
        raise
    finally:
        ep.ExpertParallelMoE.from_moe = original


def _check_subgroups(rank, world_size, got):
    size, E = got["size"], 4
    where = (f"rank {rank} of {world_size}, parallelize_moe(vit, ep_group) with ep groups of {size} rank"
             f"{'s' if size > 1 else ''} (rank {got['group_rank']} of its group), E = {E}")
    for layer in got["layers"]:
        assert layer["ep_group"], (
            f"{T164}: {where}: the layer at {layer['name']} has the group {layer['group']}, not the ep_group given to "
            "parallelize_moe: each layer is made with ExpertParallelMoE.from_moe(moe, ep_group)"
            + (" (a recursive call of parallelize_moe must pass ep_group on too: without it the layer spreads its "
               "experts over the default group, all the ranks)" if layer["group"].startswith("None") else ""))
        per = E // size
        glob = [e for e in range(rank * per, (rank + 1) * per) if e < E]
        assert layer["held"] == got["mine"], (
            f"{T164}: {where}: the layer at {layer['name']} holds the experts {layer['held']} of the models.MoE, "
            f"expected {got['mine']}, those of this rank's place in ep_group (local_experts(E, group): "
            "dist.get_rank(group), the group's rank)"
            + (f"; these are the experts of global rank {rank}: dist.get_rank() without the group gives the global "
               "rank, not this rank's place in the group" if rank != got["group_rank"] and layer["held"] == glob else ""))


def _check_storage(rank, world_size, got):
    where = f"rank {rank} of {world_size}, 8 experts"
    assert got["mlps"] == ["MLP"] * got["per_rank"], (
        f"{T164}: {where}: layer.experts should be the {got['per_rank']} local models.MLP modules (E / N), it is "
        f"{got['mlps']}")
    assert got["alive"] == 0, (
        f"{T164}: {where}: {got['alive']} parameters of the other ranks' experts are still alive once the models.MoE "
        "is dropped: the layer keeps a reference to them (the MoE itself, its experts list): their memory is not freed")
    assert got["bytes"] == got["expected"], (
        f"{T164}: {where}: the layer's parameters take {got['bytes']} bytes, expected {got['expected']} (the router and "
        "E / N experts)")


def _run_suite(impl, task, world_size, configs, extras=()):
    judging(impl, task)
    try:
        results = run_ranks(_suite, world_size, impl, task, configs, extras, timeout=60)
    except RankFailed as error:
        if task not in ("16.2", "16.3") or "SIGABRT" not in str(error):
            raise
        raise AssertionError(  # gloo's abort alone names no cause: the splits' contract, and the other way to it
            f"{TASK[task]}: {world_size} ranks, the MoE layer's all-to-alls: gloo aborted on a message whose size "
            "differs from its buffer's. The all-to-all's output_splits are the rows this rank RECEIVES from each "
            "rank (from the exchanged counts), input_splits the rows it sends; combine's way back swaps the two. Or "
            "a rank skipped a collective the others called, and gloo paired their next messages with the wrong ones."
            f"\n{error}") from None
    for rank, out in enumerate(results):
        for got in out["layer"]:
            _check_held(task, rank, world_size, got)
    for rank, out in enumerate(results):
        for got in out["layer"]:
            _check_layer(task, rank, world_size, got)
        if "storage" in extras:
            _check_storage(rank, world_size, out["storage"])
        if "vit" in extras:
            _check_vit(task, rank, world_size, world_size, out["vit"])
        if "subgroups" in extras:
            _check_subgroups(rank, world_size, out["subgroups"])
        if "bfloat16" in extras:
            _check_aux_in_bfloat16(rank, world_size, out["bfloat16"])
        if "refused" in extras:
            assert out["refused"] is not None, (
                f"{TASK[task]}: rank {rank}: 3 experts over 2 ranks must raise ValueError with one clear line, on every "
                "rank, before any collective")


@pytest.mark.task16_2
@pytest.mark.parametrize("world_size,configs", [(2, CONFIGS_FAST), slow(2, CONFIGS_2), slow(4, CONFIGS_4)],
                         ids=["2 ranks", "2 ranks more", "4 ranks"])
def test_dispatch_sends_kept_tokens_to_their_experts(impl, world_size, configs):
    _run_suite(impl, "16.2", world_size, configs, ("refused",) if world_size == 2 else ())


@pytest.mark.task16_3
@pytest.mark.parametrize("world_size,configs", [(2, CONFIGS_FAST), slow(2, CONFIGS_2), slow(4, CONFIGS_4)],
                         ids=["2 ranks", "2 ranks more", "4 ranks"])
def test_combine_gives_models_moe_outputs_and_gradients(impl, world_size, configs):
    _run_suite(impl, "16.3", world_size, configs)


@pytest.mark.task16_4
@pytest.mark.parametrize("world_size,configs", [(2, CONFIGS_FAST[1:]), slow(4, CONFIGS_4[2:4])], ids=["2 ranks", "4 ranks"])
def test_expert_parallel_moe_computes_models_moe_with_its_experts_only(impl, world_size, configs):
    """The layer's output, aux_loss and gradients; its bytes (E / N experts, the others freed); a ViT converted by
    parallelize_moe, whose aux_loss() still counts the layer; 3 experts over 2 ranks refused."""
    _run_suite(impl, "16.4", world_size, configs,
               ("storage", "vit", "subgroups", "bfloat16") + (("refused",) if world_size == 2 else ()))


# --------------------------------------------------------------------------- the ViT (16.4, 16.5)
def _tiny_vit(num_experts, top_k, capacity_factor):
    torch.manual_seed(7)
    return models.ViT(image_size=8, patch_size=2, dim=16, depth=2, heads=4, mlp_ratio=2, num_experts=num_experts,
                      top_k=top_k, capacity_factor=capacity_factor).double()


def _vit_reference(vit, images, labels):
    """One process: the MoE ViT on each rank's images in turn, the loss the mean over the ranks of
    cross-entropy + AUX * aux_loss; returns (losses, aux, {name: grad})."""
    vit = copy.deepcopy(vit)
    losses, auxes, total = [], [], 0
    for x, y in zip(images, labels):
        loss = F.cross_entropy(vit(x), y) + AUX * vit.aux_loss()
        auxes.append(vit.aux_loss().item())
        losses.append(loss.item())
        total = total + loss / len(images)
    total.backward()
    return losses, auxes, {name: p.grad.clone() for name, p in vit.named_parameters()}


def _vit_data(world_size):
    """Each rank's images (3 of 16 tokens, float64) and labels."""
    g = torch.Generator().manual_seed(1)
    images = [torch.randn(3, 3, 8, 8, generator=g, dtype=torch.float64) for _ in range(world_size)]
    return images, [torch.randint(0, 10, (3,), generator=g) for _ in range(world_size)]


def _vit(rank, world_size, impl, task, ep_size, num_experts, top_k, capacity_factor):
    ep = judging(impl, task)
    vit = _tiny_vit(num_experts, top_k, capacity_factor)
    images, labels = _vit_data(world_size)
    losses, auxes, grads = _vit_reference(vit, images, labels)
    ep_group, expert_dp_group = ep.expert_parallel_groups(ep_size)
    moe_names = {name for name, m in vit.named_modules() if isinstance(m, models.MoE)}
    returned = _converted(ep, vit, ep_group)
    left = [name for name, m in vit.named_modules() if isinstance(m, models.MoE)]  # not converted
    stray = [(key, parent) for parent, module in vit.named_modules() for key, child in module.named_children()
             if getattr(child, "expert_parallel", False)  # a layer set where no MoE was: a new child
             and ("." in key or (f"{parent}.{key}" if parent else key) not in moe_names)]
    top_level = None
    if left:  # the same layer, a direct child of the model given: is it converted there?
        probe = torch.nn.ModuleDict({"mlp": copy.deepcopy(vit.get_submodule(left[0]))})
        ep.parallelize_moe(probe, ep_group)
        top_level = getattr(probe["mlp"], "expert_parallel", False)
    loss = F.cross_entropy(vit(images[rank]), labels[rank]) + AUX * vit.aux_loss()
    aux = vit.aux_loss().item()
    loss.backward()
    if task == "16.5":  # a float32 parameter among the float64 ones: one collective per group AND dtype
        with torch.no_grad():
            vit.head.bias.data, vit.head.bias.grad = vit.head.bias.data.float(), vit.head.bias.grad.float()
        vit.pos_embed.grad = None  # frozen, say: left alone
    members = []  # the global ranks of each collective's group, in call order (the sizes alone cannot tell groups apart)
    crashed = None
    with Wire(check=lambda call, group: members.append(dist.get_process_group_ranks(group or dist.group.WORLD))) as wire:
        try:
            ep.sync_moe_gradients(vit, ep_group, expert_dp_group)
        except AttributeError as error:  # said by the test where a None .grad proves its cause
            if "'NoneType'" not in str(error) or wire.calls:
                raise
            crashed = one_line(error)
    per_rank = num_experts // ep_size
    first = (rank % ep_size) * per_rank
    expected, got = {}, {}
    for name, p in vit.named_parameters():
        found = re.match(r"(.*\.experts)\.(\d+)\.(.*)", name)
        ref_name = f"{found[1]}.{first + int(found[2])}.{found[3]}" if found else name
        expected[name], got[name] = grads.get(ref_name), p.grad
    if task == "16.5":
        expected["pos_embed"] = None
    copies = world_size // ep_size
    expert_numel = sum(p.numel() for name, p in vit.named_parameters() if ".experts." in name)
    expert_ids = ep.expert_parameters(vit)  # given code: the experts' parameters, not the rest of their layer
    layer_own = {f"{prefix}.{name}" if prefix else name: p.numel() for prefix, m in vit.named_modules()
                 if getattr(m, "expert_parallel", False) for name, p in m.named_parameters() if id(p) not in expert_ids}
    return dict(loss=loss.item(), ref_loss=losses[rank], aux=aux, ref_aux=auxes[rank], got=got, expected=expected,
                crashed=crashed, frozen_numel=vit.pos_embed.numel() if task == "16.5" else 0,
                float32_numel=vit.head.bias.numel() if task == "16.5" else 0,
                wire=[(c.kind, dtype_name(c.dtype), c.numel, c.group_size) for c in wire.calls], copies=copies,
                members=[sorted(ranks) for ranks in members], expert_dp=list(range(rank % ep_size, world_size, ep_size)),
                unwaited=sum(not c.waited for c in wire.calls),
                dense_numel=sum(p.numel() for p in vit.parameters()) - expert_numel, expert_numel=expert_numel,
                layer_own=layer_own,
                converted=sum(getattr(m, "expert_parallel", False) for m in vit.modules()), left=left,
                top_level=top_level, stray=stray, returned_the_model=returned is vit,
                returned="None" if returned is None else type(returned).__name__)


def _check_vit(task, rank, world_size, ep_size, got):
    T = TASK[task]
    where = f"rank {rank} of {world_size}, --ep {ep_size} (a tiny MoE ViT, float64)"
    assert got["converted"] == 1, (
        f"{T}: {where}: parallelize_moe converted {got['converted']} MoE layers, expected 1"
        + (f": the models.MoE at {got['left'][0]} is left, nested inside a block, while one that is a direct child of "
           "the model given is converted: MoE layers nested inside blocks must be found too (model.named_modules() "
           "walks every depth), each replaced in its parent module" if got.get("top_level") and got["left"]
           and "." in got["left"][0] else ""))
    stray = got.get("stray")
    assert not got["left"], (
        f"{T}: {where}: after parallelize_moe a models.MoE is left at {got['left'][0]}: the model still runs it, every "
        "rank computing every expert; each MoE layer must be replaced in its parent module, the block that holds it "
        "(setattr(model.get_submodule(parent), name, ...), parent the part of its name before the last dot)"
        + (f"; instead an expert-parallel layer was added as a new child {stray[0][0]!r} of "
           f"{repr(stray[0][1]) if stray[0][1] else 'the model'}, where no MoE was (setattr on "
           f"{repr(stray[0][1]) if stray[0][1] else 'the model'} with "
           f"{'a dotted name' if '.' in stray[0][0] else 'the layer' + chr(39) + 's own name'} adds a child there: it "
           "replaces nothing)" if stray else ""))
    assert not stray, (
        f"{T}: {where}: parallelize_moe added an expert-parallel layer as a new child {stray[0][0]!r} of "
        f"{repr(stray[0][1]) if stray[0][1] else 'the model'}, where no MoE was: replace each MoE in its parent module, "
        "under its own name there")
    assert got["returned_the_model"], (
        f"{T}: {where}: parallelize_moe returned {got['returned']}, not the model it was given: it converts the model in "
        "place AND returns it (train_ddp.py uses what it returns: strategies/experts.py's wrap returns "
        "parallelize_moe(model, ep_group))")
    assert abs(got["aux"] - got["ref_aux"]) < 1e-10, (
        f"{T}: {where}: vit.aux_loss() is {got['aux']} after parallelize_moe, models.MoE's {got['ref_aux']}: the "
        "converted layer must keep its load-balancing loss in `aux_loss`, or training silently drops it")
    assert abs(got["loss"] - got["ref_loss"]) < 1e-10, f"{T}: {where}: the loss differs from one process's"
    if task != "16.5":
        return
    if got["crashed"]:
        pytest.fail(f"{T}: {where}: sync_moe_gradients raised {got['crashed']}, before any collective, on a model where "
                    "pos_embed has no gradient (None: frozen, or unused in the step): parameters without .grad are left "
                    "alone (leave them out of the flat buffers)")
    assert got["got"]["pos_embed"] is None, (
        f"{T}: {where}: pos_embed had no gradient (None: frozen, or unused in the step) and must keep None after the "
        "sync, not get one")
    del got["got"]["pos_embed"], got["expected"]["pos_embed"]
    def close(have, want):
        if have is not None and want is not None and have.dtype == torch.float32:  # head.bias, made float32
            return have.shape == want.shape and torch.allclose(have.double(), want, atol=1e-6, rtol=1e-5)
        return _close(have, want)
    wrong = [name for name in got["got"] if not close(got["got"][name], got["expected"][name])]
    ratio = {}
    for name in wrong:
        have, want = got["got"][name], got["expected"][name]
        if have is not None and want.abs().max() > 0:
            have, want = have.double().flatten(), want.double().flatten()
            ratio[name] = (have @ want / (want @ want)).item()
    experts = [name for name in wrong if ".experts." in name]
    dense = [name for name in wrong if ".experts." not in name]
    rounded = [name for name in wrong if got["got"][name] is not None and got["got"][name].dtype == torch.float64
               and got["got"][name].shape == got["expected"][name].shape
               and (got["got"][name] - got["expected"][name]).abs().max() <= 1e-6 * got["expected"][name].abs().max()]
    if wrong and rounded == wrong:  # float64 gradients right to float32's precision only, not to float64's
        narrowed = [call for call in got["wire"] if call[1] != "float64" and call[2] != got["float32_numel"]]
        pytest.fail(f"{T}: {where}: the gradients {wrong[:2]} equal one process's to float32's precision only (within "
                    "1e-6, not 1e-10): the float64 gradients were rounded on the way, a buffer made or converted "
                    "in a narrower dtype" + (f" (it sent {narrowed})" if narrowed else "") + ": keep each dtype's "
                    "flat buffer, and its all-reduce, in that dtype")
    if wrong and got.get("unwaited"):  # the values below would say "not averaged", which the code meant to do
        pytest.fail(f"{T}: {where}: the gradients differ from one process's ({wrong[:2]}), and {got['unwaited']} "
                    "all-reduce(s) started with async_op=True were never waited for (wait()): the sum may not have "
                    "arrived when the gradients were read back. Wait for each (or call it without async_op)")
    if experts:
        r = [ratio.get(name, float("nan")) for name in experts]
        hint = ""
        copies = got["copies"]
        if copies > 1 and copies != ep_size and all(abs(x - copies) < 1e-6 for x in r):
            hint = (f": {copies} times too large: summed over the {copies} copies of expert_dp_group, not averaged: "
                    f"divide by its size too (the divisor is N * copies = {ep_size * copies}, here N = {ep_size})")
        elif all(abs(x - ep_size) < 1e-6 for x in r):
            hint = (f": {ep_size} times too large: the all-to-all's backward already SUMMED every rank's tokens' gradients "
                    f"into the expert: divide by the expert-parallel size {ep_size}"
                    + (f" and by the {copies} copies of expert_dp_group it is summed over (here both are {ep_size}: "
                       f"the divisor is N * copies = {ep_size * copies})" if copies == ep_size else ""))
        elif all(abs(x - 1 / ep_size) < 1e-6 for x in r):
            hint = (f": {ep_size} times too small: divided by N = {ep_size} once more than the rule asks (as if the "
                    "experts were averaged over the ep group like data-parallel gradients, or divided twice): the "
                    "all-to-all's backward summed the ep group's tokens into the expert, so divide by N once, and "
                    f"average over expert_dp_group only: one division by N * copies = {ep_size * got['copies']}")
        else:
            mixed = [ranks for (_, _, numel, _), ranks in zip(got["wire"], got["members"])
                     if numel == got["expert_numel"] and ranks != got["expert_dp"]]
            if mixed:
                hint = (f": the experts' gradients were all-reduced over the ranks {mixed[0]}, which hold DIFFERENT experts "
                        "(the sum adds one expert's gradient to another's): divide them by the expert-parallel size and "
                        f"average them over expert_dp_group only, the ranks {got['expert_dp']} holding copies of the "
                        "same experts" + (" (here one copy: no collective for them)" if got["copies"] == 1 else ""))
        pytest.fail(f"{T}: {where}: the experts' gradients differ from one process's ({experts[:2]}, ratio {r[:2]}){hint}")
    if dense:
        router = got.get("layer_own", {})
        without = got["dense_numel"] - got["float32_numel"] - got["frozen_numel"] - sum(router.values())
        if set(dense) <= set(router) and ("all_reduce", "float64", without, world_size) in got["wire"]:
            pytest.fail(f"{T}: {where}: the gradients of {sorted(router)} differ from one process's, and they were "
                        "left out of the all-reduce over all ranks: they belong to the expert-parallel layer but not "
                        "to its experts (the router is replicated, the same on every rank: data parallel, averaged "
                        "over all ranks); the experts are exactly expert_parameters(model), the parameters of each "
                        "layer's `experts`, not every parameter of the layer")
        r = [ratio.get(name, float("nan")) for name in dense]
        same = all(abs(x - r[0]) < 1e-6 for x in r) and r[0] > 0
        fewer = sorted({size for kind, _, numel, size in got["wire"]
                        if kind == "all_reduce" and size < world_size and numel != got["expert_numel"]})
        hint = (f": {world_size} times too large: summed over the ranks, not averaged (divide by the world size)"
                if all(abs(x - world_size) < 1e-6 for x in r) else
                f": {r[0]:.4g} times one process's: the all-reduce SUMS the {world_size} ranks' gradients, so divide "
                f"by the world size {world_size} (it was divided by {world_size / r[0]:.4g})" if same and any(
                    kind == "all_reduce" and size == world_size for kind, _, _, size in got["wire"]) else
                f": averaged over a group of {fewer[0]} ranks, not over all {world_size}: a parameter outside the "
                "experts is data parallel over the whole world (the default group), not over ep_group or "
                "expert_dp_group" if fewer else
                ": not averaged over the ranks: a parameter outside the experts is data parallel, its gradient is the "
                "mean over all ranks (all-reduce, divide by the world size)")
        pytest.fail(f"{T}: {where}: the gradients outside the experts differ from one process's ({dense[:3]}){hint}")
    wire = got["wire"]
    head = got["float32_numel"]  # head.bias, made float32
    dense = got["dense_numel"] - head - got["frozen_numel"]
    expected = [("all_reduce", "float64", dense, world_size), ("all_reduce", "float32", head, world_size)]
    expected += [("all_reduce", "float64", got["expert_numel"], got["copies"])] if got["copies"] > 1 else []
    assert sorted(wire) == sorted(expected), (
        f"{T}: {where}: sync_moe_gradients should send one all-reduce of the non-expert gradients over all ranks per "
        f"dtype (here {dense} float64 and {head} float32: the head's bias; pos_embed, without .grad, left out)"
        + (f", and one of the {got['expert_numel']} expert gradients over the {got['copies']} ranks of expert_dp_group"
           if got["copies"] > 1 else ", and nothing for the experts (one copy)")
        + f": one collective per group and dtype, not one per parameter. It sent {wire} (kind, dtype, elements, ranks)")


@pytest.mark.task16_5
@pytest.mark.parametrize("world_size,ep_size,num_experts,top_k,capacity_factor", [
    (2, 2, 4, 2, 0.5), slow(2, 1, 4, 2, 0.5), slow(4, 2, 8, 1, 8.0), slow(4, 4, 8, 2, 0.5)],
    ids=["2 ranks ep 2", "2 ranks ep 1 (2 copies)", "4 ranks ep 2 (2 copies)", "4 ranks ep 4"])
def test_sync_moe_gradients_gives_one_process_gradients(impl, world_size, ep_size, num_experts, top_k, capacity_factor):
    judging(impl, "16.5")
    for rank, got in enumerate(run_ranks(_vit, world_size, impl, "16.5", ep_size, num_experts, top_k, capacity_factor,
                                         timeout=60)):
        _check_vit("16.5", rank, world_size, ep_size, got)


def _experts_on_gpu(rank, world_size):
    """The reference answers' whole step on CUDA tensors: the tiny MoE ViT converted with every expert on one rank
    of 2, a forward and backward of this rank's images, sync_moe_gradients; the loss and gradients, on the CPU."""
    ep = judging(REFERENCE, "16.5")
    device = gpu.use_gpu(rank)
    vit = _tiny_vit(4, 2, 0.5).to(device)
    images, labels = _vit_data(world_size)
    ep_group, expert_dp_group = ep.expert_parallel_groups(world_size)
    vit = ep.parallelize_moe(vit, ep_group)
    loss = F.cross_entropy(vit(images[rank].to(device)), labels[rank].to(device)) + AUX * vit.aux_loss()
    loss.backward()
    ep.sync_moe_gradients(vit, ep_group, expert_dp_group)
    return loss.item(), {name: p.grad.cpu() for name, p in vit.named_parameters()}


@pytest.mark.gpu
@pytest.mark.repo
@pytest.mark.parametrize("backend", gpu.backends(2))
def test_solution_gives_one_process_gradients_on_gpus(backend):
    """Tasks 16.1-16.5's reference answers with CUDA tensors (tools/gpu_check.sh): the counts and tokens' all-to-alls
    (uneven splits, capacity 0.5 drops some) and the sync, on NCCL with 2 GPUs and on gloo with both ranks on one;
    the losses and gradients of one process on the CPU (float64)."""
    world_size, per_rank = 2, 2  # 4 experts
    results = run_ranks(_experts_on_gpu, world_size, backend=backend, timeout=90)
    losses, _, grads = _vit_reference(_tiny_vit(4, 2, 0.5), *_vit_data(world_size))
    for rank, (loss, got) in enumerate(results):
        assert abs(loss - losses[rank]) < 1e-10, f"rank {rank}: the loss {loss}, one process's {losses[rank]}"
        for name, grad in got.items():
            found = re.match(r"(.*\.experts)\.(\d+)\.(.*)", name)
            ref_name = f"{found[1]}.{rank * per_rank + int(found[2])}.{found[3]}" if found else name
            assert _close(grad, grads[ref_name]), f"rank {rank}: {name}'s gradient differs from one process's {ref_name}"


# --------------------------------------------------------------------------- a rank with no tokens (16.2, 16.3)
EMPTY_RANK = 1  # of 3: its slice of the batch is empty (an uneven last batch); 6 experts, 2 a rank, k = 2
EMPTY_CASES = ["its experts get rows", "its experts get none"]  # the second: rank 1 neither sends nor receives


def _empty_rank_tokens(world_size, case):
    """Each rank's tokens (rank 1's: none) and routing, the same on every rank (seeded)."""
    torch.manual_seed(16)
    moe = models.MoE(DIM, HIDDEN, 6, 2, 8.0).double()
    xs = [torch.randn(0 if r == EMPTY_RANK else TOKENS, DIM, dtype=torch.float64) for r in range(world_size)]
    if case == "its experts get none":  # every token has a positive first feature; experts 2 and 3 say no to it
        with torch.no_grad():
            for x in xs:
                x[:, 0] = x[:, 0].abs() + 2.0
            moe.router.weight[2:4] = 0.0
            moe.router.weight[2:4, 0] = -5.0
    routings = [models.route(moe.router(x).detach(), 2, 8.0) for x in xs]
    idle = not any(((r.expert >= 2) & (r.expert < 4) & r.kept).any() for r in routings)
    assert idle == (case == "its experts get none"), f"the test's case {case!r} does not hold: fix the test"
    return xs, routings


def _through_toy_experts(xs, routings, rank):
    """With two experts a rank that multiply by (global index + 2): what dispatch gives `rank`'s experts (every
    rank's kept rows for them, rank 0's first, each in token order) and what combine returns it (the gated sum)."""
    mine = range(2 * rank, 2 * rank + 2)
    want = [torch.cat([x[torch.where((routing.expert == e) & routing.kept)[0]] for x, routing in zip(xs, routings)])
            for e in mine]
    routing, x = routings[rank], xs[rank]
    gates = (routing.weight * routing.kept).to(x.dtype)
    return want, (gates * (routing.expert + 2).to(x.dtype)).sum(dim=1, keepdim=True) * x


def _through_dispatch_and_combine(rank, world_size, impl, task):
    """dispatch, experts that multiply by (global index + 2), combine: what this rank's experts got, and y."""
    ep = judging(impl, task)
    out = {}
    for case in EMPTY_CASES:
        xs, routings = _empty_rank_tokens(world_size, case)
        inputs, plan = ep.dispatch(xs[rank], routings[rank], 6)
        outputs = [x * (e + 2) for e, x in zip(ep.local_experts(6), inputs)]
        out[case] = dict(inputs=[x.detach() for x in inputs], y=ep.combine(outputs, plan).detach())
    return out


@pytest.mark.parametrize("task", [pytest.param("16.2", marks=pytest.mark.task16_2),
                                  pytest.param("16.3", marks=pytest.mark.task16_3)])
def test_a_rank_with_no_tokens_still_takes_part_in_every_all_to_all(impl, task):
    """An uneven last batch can leave a rank no token: it still calls every all-to-all (the counts', the
    tokens' there and back), with zero counts and (0, dim) tensors, also when no row comes to its experts
    either; one that skips them leaves the others waiting, or gloo pairs their next messages with the wrong
    ones. 3 ranks, rank 1 empty."""
    judging(impl, task)
    try:
        results = run_ranks(_through_dispatch_and_combine, 3, impl, task, timeout=60)
    except (RankTimeout, RankFailed) as error:
        raise AssertionError(  # the cause first, then the harness's report (check.py shows both)
            f"{TASK[task]}: 3 ranks, rank {EMPTY_RANK} with no tokens (x of shape (0, {DIM})): A rank with no tokens "
            "must still call every collective the others call (the counts' all-to-all, then the tokens' all_to_all "
            "there and back), with zero counts and (0, dim) tensors, also when no row comes to its experts: a rank "
            "that skips one leaves the others waiting, or gloo pairs their next message with the wrong one.\n"
            f"{error}") from None
    for case in EMPTY_CASES:
        xs, routings = _empty_rank_tokens(3, case)
        for rank, out in enumerate(results):
            got = out[case]
            want, y = _through_toy_experts(xs, routings, rank)
            where = f"rank {rank} of 3, rank {EMPTY_RANK} with no tokens and {case}"
            if task == "16.2":
                # a trial's unstable sort was told "[(11, 6), (3, 6)] rows, expected [(11, 6), (3, 6)]"
                reordered = len(got["inputs"]) == 2 and all(
                    g.shape == w.shape and torch.equal(g.sort(dim=0).values, w.sort(dim=0).values)
                    for g, w in zip(got["inputs"], want))
                assert len(got["inputs"]) == 2 and all(_close(g, w) for g, w in zip(got["inputs"], want)), (
                    f"{T162}: {where}: dispatch gave this rank's experts "
                    + ("the right rows in another order: rank 0's first, then rank 1's, ..., each in token order "
                       "(sorting the pairs by expert: a stable sort, torch.argsort(..., stable=True))" if reordered
                       else f"{[tuple(g.shape) for g in got['inputs']]} rows, expected "
                       f"{[tuple(w.shape) for w in want]}: every rank's kept rows for them"))
            assert _close(got["y"], y), (
                f"{TASK[task]}: {where}: y is {tuple(got['y'].shape)}"
                + (f", expected {tuple(y.shape)}" if got["y"].shape != y.shape else ", not the gated sum of the "
                   "experts' outputs for its tokens") + (": a rank with no tokens returns a (0, dim) y"
                                                         if rank == EMPTY_RANK else ""))


def _stop_outside(size):
    """A Wire check: a collective over another number of ranks than the group's is stopped before it runs, the same
    on every rank (over the default group the sizes of the two groups' messages would not match: a hang or an abort)."""
    def check(call, group):
        if call.group_size != size:
            raise WrongGroup(f"{call.kind} over {call.group_size} ranks")
    return check


class WrongGroup(Exception):
    """Raised by _stop_outside: a collective outside the group given (said by the test, with its cause)."""


def _dispatch_in_groups(rank, world_size, impl, task):
    """dispatch, experts that multiply by (global index + 2), combine, inside the ep groups [0, 1] and [2, 3] of 4
    ranks, each group on tokens of its own: (this rank in its group, its tokens' routing, the experts' inputs, y),
    or the collective that ran outside the group."""
    ep = judging(impl, task)
    group = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    grank = rank % 2
    torch.manual_seed(160 + rank // 2)  # other tokens in each group
    moe = models.MoE(DIM, HIDDEN, 4, 2, 8.0).double()
    xs = [torch.randn(TOKENS, DIM, dtype=torch.float64) for _ in range(2)]
    routings = [models.route(moe.router(x).detach(), 2, 8.0) for x in xs]
    with Wire(check=_stop_outside(2)):
        try:
            inputs, plan = ep.dispatch(xs[grank], routings[grank], 4, group)
            outputs = [x * (e + 2) for e, x in zip(ep.local_experts(4, group), inputs)]
            y = ep.combine(outputs, plan, group).detach()
        except WrongGroup as error:
            return dict(error=str(error))
    return dict(error=None, grank=grank, xs=xs, routings=routings, inputs=[x.detach() for x in inputs], y=y)


@pytest.mark.slow
@pytest.mark.parametrize("task", [pytest.param("16.2", marks=pytest.mark.task16_2),
                                  pytest.param("16.3", marks=pytest.mark.task16_3)])
def test_dispatch_and_combine_run_inside_the_group_they_are_given(impl, task):
    """4 ranks, the ep groups [0, 1] and [2, 3], each on tokens of its own: every collective over the group given (the
    default group, all 4 ranks, passed every test above, where the group is the world)."""
    judging(impl, task)
    for rank, got in enumerate(run_ranks(_dispatch_in_groups, 4, impl, task, timeout=60)):
        where = (f"rank {rank} of 4, in the ep group {[rank // 2 * 2, rank // 2 * 2 + 1]} (E = 4, k = 2), on its "
                 "group's tokens")
        assert got["error"] is None, (
            f"{TASK[task]}: {where}: {'dispatch' if task == '16.2' else 'combine'} ran a collective ({got['error']}, "
            "stopped by the test) not over the 2 of the group it was given: pass group=group to every collective and "
            "all_to_all, the counts' and the tokens' (the default group is all 4 ranks)")
        want, y = _through_toy_experts(got["xs"], got["routings"], got["grank"])
        assert len(got["inputs"]) == 2 and all(_close(g, w) for g, w in zip(got["inputs"], want)), (
            f"{TASK[task]}: {where}: dispatch gave this rank's experts {[tuple(g.shape) for g in got['inputs']]} rows, "
            f"expected {[tuple(w.shape) for w in want]}: every rank of the group's kept rows for them")
        assert _close(got["y"], y), f"{TASK[task]}: {where}: y is not the gated sum of the experts' outputs for its tokens"


def _sync_with_zero_gradients(rank, world_size, impl):
    """sync_moe_gradients on hand-set gradients, 4 ranks, --ep 2: rank 0's all zero (a rank whose slice chose no
    expert, say), rank r's (r + 1)(i + 1) for parameter i: [(i, an expert's, its first element after the sync)]."""
    ep = judging(impl, "16.5")
    vit = _tiny_vit(4, 2, 1.0)
    ep_group, expert_dp_group = ep.expert_parallel_groups(2)
    ep.parallelize_moe(vit, ep_group)
    for i, p in enumerate(vit.parameters()):
        p.grad = torch.full_like(p, 0.0 if rank == 0 else (rank + 1) * (i + 1.0))
    ep.sync_moe_gradients(vit, ep_group, expert_dp_group)
    experts = ep.expert_parameters(vit)
    return [(i, id(p) in experts, p.grad[(0,) * p.dim()].item()) for i, p in enumerate(vit.parameters())]


@pytest.mark.task16_5
@pytest.mark.slow
def test_sync_moe_gradients_takes_part_also_with_gradients_all_zero(impl):
    """Every rank calls every collective, also one whose gradients are all zero (rank 0 here): skipping the
    all-reduce for nothing to add leaves the other ranks waiting, or pairs their next collective with the wrong one."""
    judging(impl, "16.5")
    try:
        results = run_ranks(_sync_with_zero_gradients, 4, impl, timeout=60)
    except (RankTimeout, RankFailed) as error:
        raise AssertionError(
            f"{T165}: 4 ranks, --ep 2, rank 0's gradients all zero: Every rank must call the same all-reduces, also one "
            "whose gradients are all zero (it adds its zeros): a rank that skips one leaves the others waiting, or "
            "gloo pairs their next collective with the wrong one.\n"
            f"{error}") from None
    for rank, got in enumerate(results):
        for i, expert, value in got:
            scale = [0, 2, 3, 4]  # rank r's gradient is scale[r] * (i + 1)
            want = (i + 1) * (sum(scale[r] for r in range(rank % 2, 4, 2)) / 2 / 2 if expert else sum(scale) / 4)
            assert abs(value - want) < 1e-9, (
                f"{T165}: 4 ranks, --ep 2, rank 0's gradients all zero: rank {rank}'s parameter {i} "
                f"({'an expert' if expert else 'outside the experts'}) holds {value} after the sync, expected {want}")
