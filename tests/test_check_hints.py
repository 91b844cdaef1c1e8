"""What check.py prints for a failing task: the test's hint, whole, wrapped; long values shortened.

    pytest tests/test_check_hints.py
"""
import os
import re

import pytest

from check import REPO, print_result
from grading.checker import Task, TaskResult, explain

pytestmark = pytest.mark.repo

# the real Task 3.2 message for a wrong all-gather index: the hint is its last sentence
CHUNK = ("Task 3.2 (template_allreduce.py, ring_all_reduce): a (10,) float32 tensor on 3 ranks, rank 0 is wrong "
         "at 4 of 10 elements (first at index 4: got 15.0, dist.all_reduce gives 18.0). Check the chunk "
         "bookkeeping: in the reduce-scatter, at step s rank r sends chunk (r - s) % N and adds what it receives "
         "into chunk (r - s - 1) % N; in the all-gather it sends chunk (r + 1 - s) % N and overwrites chunk "
         "(r - s) % N with what it receives.")


def test_a_long_hint_is_never_cut(capsys):
    text, _ = explain("AssertionError", CHUNK + "\nassert False", "")
    hint = CHUNK[CHUNK.index("Check the chunk"):]
    assert hint in text, f"the hint was cut: {text}"
    result = TaskResult(Task("3.2", file="template_allreduce.py", function="ring_all_reduce"), "failing",
                        explanation=text)
    print_result(result, 40)
    printed = " ".join(capsys.readouterr().out.split())
    assert hint in printed, f"check.py must wrap the hint, not cut it: {printed}"


def test_long_values_are_shortened_but_the_sentences_stay():
    values = list(range(500))
    text, _ = explain("AssertionError", f"Task 1.2 (x.py, f): expected {values}, got {values[::-1]}. "
                      "Pad with indices from the front.", "")
    assert len(text) < 300 and "..." in text and text.endswith("Pad with indices from the front."), text


def test_cuda_called_without_a_gpu_is_named():
    """PITFALLS, Phase 3: picotron's pipeline calls torch.cuda.synchronize(), which fails on CPUs."""
    text, _ = explain("RuntimeError", "rank 1 raised RuntimeError: Found no NVIDIA driver on your system. Please "
                      "check that you have an NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/"
                      "index.aspx", "template_pipeline.py:190 in _send")
    assert text.startswith("rank 1: RuntimeError: Found no NVIDIA driver") and "torch.cuda.synchronize()" in text, text
    assert "(template_pipeline.py:190 in _send)" in text, text


# --------------------------------------------------------------------- every failure names its task
# (issue 32: in a held-out Phase 2 set, 16 of 64 first failures named no task)
RECV = "Task 10.3 (template_pipeline.py, Stage._recv())"
RANK_TRACE = ('\n\n--- rank 1 traceback ---\nTraceback (most recent call last):\n  File "/w/tests/harness.py", line 90, '
              'in _rank_main\n  File "/w/template_pipeline.py", line 141, in _recv\nValueError: no such peer\n')


def _check_line(error, task_id="10.3"):
    """What check.py prints under the task's line for `error` escaping a test of the task."""
    text, _ = explain(type(error).__name__, str(error), "")
    from grading.checker import _without_task_prefix
    return _without_task_prefix(Task(task_id), text)


def test_a_ranks_own_exception_names_the_task_the_line_and_what_the_test_expected():
    from harness import RankFailed, named_failure
    error = named_failure(RankFailed("rank 1 raised ValueError: no such peer" + RANK_TRACE), [RECV],
                          "test_activations_and_gradients_go_round_trip_between_neighbours[2-10.3]")
    assert isinstance(error, RankFailed), error  # check.py still runs a RankFailed again (it may be the machine)
    first = str(error).splitlines()[0]
    assert first.startswith(RECV + ": rank 1 raised ValueError: no such peer (at template_pipeline.py:141 in _recv)"), first
    assert "What the test checks: activations and gradients go round trip between neighbours (2-10.3)." in first, first
    line = _check_line(error)
    assert line.startswith("rank 1: ValueError: no such peer (at template_pipeline.py:141 in _recv)"), line
    assert "--- rank" not in line and "What the test checks:" in line, line


def test_an_error_in_pytests_process_names_the_task():
    from harness import TaskFailure, named_failure
    try:
        [][1]
    except IndexError as raised:
        error = named_failure(raised, ["Task 10.1 (template_pipeline.py, partition())"],
                              "test_partition_is_balanced_and_every_layer_is_in_exactly_one_stage")
    assert isinstance(error, TaskFailure), error
    assert str(error).startswith("Task 10.1 (template_pipeline.py, partition()): your code raised IndexError: list "
                                 "index out of range"), error
    assert _check_line(error, "10.1").startswith("your code raised IndexError"), _check_line(error, "10.1")


def test_the_task_prefix_is_dropped_only_up_to_its_own_parenthesis():
    """A message that goes on "(...), a case (...): why" kept only what followed the case's own "):"."""
    case = "Task 11.1 (template_batchnorm.py, global_batch_stats), an empty slice (rank 1 holds none): NaN"
    assert _without_task_prefix_of("11.1", case) == case
    assert _without_task_prefix_of("10.1", "Task 10.1 (template_pipeline.py, partition()): why (a): b") == "why (a): b"


def test_gloos_all_gather_into_a_stacked_output_is_explained():
    text, _ = explain("RuntimeError", "ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (3, 3), "
                      "got (1, 3, 3))", "")
    assert "concatenated along dim 0" in text, text


def test_gloos_missing_future_is_explained():
    """torch's own words for a Future gloo's p2p and reduce-scatter Works lack (measured, torch 2.14)."""
    text, _ = explain("RuntimeError", "Work::getFuture not implemented", "")
    assert "have no Future" in text and "is_completed()" in text and "work.wait()" in text, text
    # where a test's message has said why (tests/wire.py's gloo_wait_only), the line is not said again
    said = ("Task 10.3 (template_pipeline.py, Stage._recv): gloo's point-to-point Works have no Future (get_future() "
            "raises on a dist.isend's or dist.irecv's Work), ...: call work.wait() on each. rank 0 raised "
            "RuntimeError: Work::getFuture not implemented.")
    text, _ = explain("AssertionError", said, "")
    assert text.count("no Future") == 1, text


def _without_task_prefix_of(task_id, text):
    from grading.checker import _without_task_prefix
    return _without_task_prefix(Task(task_id), text)


def test_did_not_raise_says_what_had_to_be_raised():
    from harness import named_failure
    with pytest.raises(pytest.fail.Exception) as raised:
        with pytest.raises(ValueError):
            pass
    error = named_failure(raised.value, ["Task 8.4 (template_checkpoint.py, read_overlaps())"],
                          "test_read_overlaps_reports_a_missing_piece")
    assert str(error).startswith("Task 8.4 (template_checkpoint.py, read_overlaps()): no ValueError was raised, "
                                 "where the test expected one"), error
    assert "What the test checks: read overlaps reports a missing piece." in str(error), error


def test_a_rank_killed_by_a_signal_is_named_and_its_task_too():
    from harness import RankFailed, _died, named_failure
    assert _died(1, -11).startswith("rank 1 was killed by SIGSEGV (exit code -11) without reporting: a segmentation "
                                    "fault"), _died(1, -11)
    assert "gloo aborts on a message whose size differs" in _died(0, -6), _died(0, -6)
    error = named_failure(RankFailed(_died(0, -6)), [RECV], "test_x")
    assert str(error).startswith(RECV + ": rank 0 was killed by SIGABRT"), error


def test_a_hang_keeps_the_harness_report_after_the_task():
    from harness import RankTimeout, named_failure
    report = ("ranks [0] were still running after 20 s (ranks [1] had finished). This is a hang: usually ...\n"
              '  rank 0 was at:\n      File "/w/template_pipeline.py", line 170 in wait_sends')
    error = named_failure(RankTimeout(report), [RECV], "test_x")
    assert isinstance(error, RankTimeout) and str(error).startswith(RECV + ": ranks [0] were still running"), error
    text, details = explain("RankTimeout", str(error), "")
    assert text.startswith(RECV + ": ranks [0] were still running after 20 s") and details, (text, details)


def test_a_message_naming_its_task_and_an_unfilled_todo_stay_as_they_are():
    from harness import RankFailed, named_failure
    assert named_failure(AssertionError("Task 10.3 (x.py, f): got 1, expected 2"), [RECV], "test_x") is None
    assert named_failure(NotImplementedError("Task 10.3: not done"), [RECV], "test_x") is None
    assert named_failure(RankFailed("rank 0 raised NotImplementedError: Task 10.2: x"), [RECV], "test_x") is None
    assert named_failure(ValueError("x"), [], "test_repo_only") is None  # a test of no task
    timeout = pytest.fail.Exception("Timeout (>10.0s) from pytest-timeout.")  # read as a hang by grading/checker.py
    assert named_failure(timeout, [RECV], "test_x") is None
    # a message naming ANOTHER task (given code blaming an earlier one) still gets the judged task's name
    other = named_failure(RankFailed("rank 1 raised RuntimeError: see Task 10.4" + RANK_TRACE), [RECV], "test_x")
    assert str(other).startswith(RECV + ": rank 1 raised RuntimeError"), other


def _stuck(*ranks):
    """A RankTimeout report whose ranks wait in the given frames, innermost first."""
    blocks = []
    for rank, frames in enumerate(ranks):
        lines = "\n      ".join(f'File "/w/{path}", line {line} in {name}' for path, line, name in frames)
        blocks.append(f"  rank {rank} was at:\n      {lines}")
    return "ranks [0, 1] were still running after 40 s (ranks [] had finished). This is a hang\n" + "\n".join(blocks)


def test_a_hang_report_names_the_template_callers_that_led_to_the_collective():
    """The hints trial's W18 (Task 13.2): one rank skipped the averaging; the other waits in all_reduce_mean(),
    which is right, called by step(), where the mistake is: the report names the chain, innermost first."""
    from grading.checker import _stuck_ranks
    chain = [("torch/distributed/distributed_c10d.py", 3913, "all_reduce"),
             ("template_local_sgd.py", 40, "all_reduce_mean"), ("template_local_sgd.py", 61, "average_parameters"),
             ("template_local_sgd.py", 97, "step"), ("template_local_sgd.py", 20, "helper"), ("tests/t.py", 9, "_run")]
    lines = _stuck_ranks(_stuck(chain, [("torch/distributed/distributed_c10d.py", 6371, "barrier"), ("tests/t.py", 9, "_run")]))
    assert lines == ["rank 0 waits in all_reduce() (distributed_c10d.py:3913), called from template_local_sgd.py:40 in "
                     "all_reduce_mean() <- template_local_sgd.py:61 in average_parameters() <- template_local_sgd.py:97 "
                     "in step()", "rank 1 waits in barrier() (distributed_c10d.py:6371)"], lines
    # waiting in the test's stand-in for Work.wait (Task 15's recorder): the wait is the template's
    recorded = [("tests/test_context_parallel.py", 240, "recorded_wait"),
                ("template_context_parallel.py", 171, "backward"), ("tests/t.py", 9, "_run")]
    assert _stuck_ranks(_stuck(recorded)) == [
        "rank 0 waits in wait() (as the test records it: test_context_parallel.py:240), called from "
        "template_context_parallel.py:171 in backward()"]
    # waiting in the template itself: that frame is the place, not a caller
    assert _stuck_ranks(_stuck([("template_pipeline.py", 171, "wait_sends"), ("tests/t.py", 9, "_run")])) == [
        "rank 0 waits in wait_sends() (template_pipeline.py:171)"]


def test_a_pipeline_hang_is_told_by_where_the_ranks_wait_not_by_another_tasks_text():
    """Issue 32: three Task 10.3/10.7 mistakes got Task 10.2's text about blocking sends."""
    from test_pipeline import hang_hint
    waits_for_sends = ("template_pipeline.py", 171, "wait_sends")
    in_test = ("torch/distributed/distributed_c10d.py", 6371, "barrier")
    text = hang_hint("10.7", _stuck([in_test, ("tests/test_pipeline.py", 560, "_schedule_run")],
                                    [("torch/distributed/distributed_c10d.py", 1, "wait"), waits_for_sends]))
    assert "rank 0 waits in barrier() in the test, for the other ranks" in text, text
    assert "rank 1 waits in wait_sends() for its sends to complete: the neighbour never receives them" in text, text
    assert "blocking" not in text, text
    receiving = [("torch/distributed/distributed_c10d.py", 1, "wait"), ("template_pipeline.py", 143, "_recv"),
                 ("template_pipeline.py", 166, "recv_backward")]
    text = hang_hint("10.3", _stuck(receiving))
    assert text.startswith("rank 0 waits to receive a gradient (recv_backward), in _recv() (template_pipeline.py:143), "
                           "and it never comes. Likely: _recv must receive exactly one message, from `peer`"), text
    text = hang_hint("10.3", _stuck(receiving, receiving))
    assert text.startswith("ranks 0 and 1 wait to receive a gradient") and text.count("Likely") == 1, text
    sending = [("torch/distributed/distributed_c10d.py", 1, "send"), ("tests/test_pipeline.py", 190, "blocking_send"),
               ("template_pipeline.py", 120, "_send")]
    assert "_send must start a dist.isend" in hang_hint("10.2", _stuck(sending))
    assert "_send must start" not in hang_hint("10.4", _stuck(sending))
    looping = [("template_pipeline.py", 300, "one_f_one_b_step")]
    assert "a loop that never ends" in hang_hint("10.7", _stuck(looping))


def test_a_rank_polling_is_completed_is_told_why_gloo_never_says_true(tmp_path):
    """Trial 6: a loop on an irecv's is_completed() was told "the message never comes"; the stuck line, or the
    `while` whose body it is, polls is_completed(), and the hint says why that never ends (wire.gloo_wait_only)."""
    from test_pipeline import hang_hint
    from wire import gloo_wait_only
    template = tmp_path / "template_pipeline.py"
    template.write_text("def _recv(tensor, peer):\n    work = dist.irecv(tensor, peer)\n"
                        "    while not work.is_completed():\n        pass\n    return tensor\n")
    for line in (3, 4):
        report = ("ranks [0] were still running after 40 s (ranks [1] had finished). This is a hang\n"
                  f'  rank 0 was at:\n      File "{template}", line {line} in _recv')
        text = hang_hint("10.3", report)
        assert "polls is_completed() in _recv()" in text and gloo_wait_only("irecv") in text, text
    text = hang_hint("10.3", report.replace("line 4", "line 2"))  # waiting in the irecv itself: not a loop
    assert "is_completed" not in text, text


def test_pipeline_hints_only_where_their_condition_holds():
    from test_pipeline import expected_trace, loss_hint, trace_hint
    right = expected_trace("1f1b", 4, 0, 4)  # warm-up 3
    backward_first = [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    hint = trace_hint(backward_first, right, "1f1b", 4, 0, 4, False)
    # the same trace as a warm-up one forward short before forward-backward pairs: both readings named (Issue 45)
    assert "THEN one backward" in hint and "one forward short" in hint and "a warm-up of" not in hint, hint
    too_long = expected_trace("1f1b", 5, 0, 8)  # the warm-up of a 5-stage pipeline, 4 forwards, on 4 stages
    hint = trace_hint(too_long, expected_trace("1f1b", 4, 0, 8), "1f1b", 4, 0, 8, True)
    assert "a warm-up of 4 forwards" in hint and "= 3" in hint and "not the global rank" in hint, hint
    assert "min(num_stages - stage_index - 1, M) = 2" in trace_hint(right, expected_trace("1f1b", 4, 1, 4), "1f1b", 4,
                                                                    1, 4, False)
    newest_first = [("F", 0), ("F", 1), ("B", 1), ("B", 0)]
    assert "oldest first" in trace_hint(newest_first, expected_trace("gpipe", 2, 0, 2), "gpipe", 2, 0, 2, False)
    assert loss_hint(2.0, 2.0, 1) == "" and loss_hint(1.0, 2.0, 1) == ""  # one micro-batch: no 1/M to blame
    assert "a second time" in loss_hint(0.5, 2.0, 4) and "a second time" not in loss_hint(0.51, 2.0, 4)
    assert "scale each micro-batch's loss" in loss_hint(8.0, 2.0, 4) and loss_hint(7.9, 2.0, 4) == ""
    # Issue 45, section 4: 1/num_stages for 1/M, said only where the ratio is M / num_stages
    assert "not 1/num_stages" in loss_hint(1.0, 2.0, 1, 2) and loss_hint(1.1, 2.0, 1, 2) == ""
    assert "not 1/num_stages" not in loss_hint(1.0, 2.0, 2, 2)  # M = num_stages: nothing to tell apart


def test_pipeline_warm_up_and_index_hints_only_where_the_counts_prove_them():
    """Issue 45, section 4: a 1F1B stage waiting for a gradient, or out of micro-batches, is told which count was
    wrong only where the forwards and backwards it ran prove it."""
    from test_pipeline import raised_hint, warmup_hint
    waits = "waited 10 s to receive the gradient of its output (recv_backward) ... (waiting in _recv <- recv_backward; "
    short = warmup_hint("10.7", waits + "after 1 forwards and 1 backwards started of M = 4, on stage 0 of 4)")
    assert "first gradient after 1 forward" in short and "= 3 forwards, then one forward" in short, short
    # 4 forwards before the first backward is 1F1B's own count on stage 0 of 4: no warm-up to blame
    assert warmup_hint("10.7", waits + "after 4 forwards and 1 backwards started of M = 4, on stage 0 of 4)") is None
    assert warmup_hint("10.6", waits + "after 1 forwards and 1 backwards started of M = 4, on stage 0 of 4)") is None
    beyond = "rank 0 raised IndexError: list index out of range [after {} forwards and 0 backwards started of M = 2, on stage 0 of 4]"
    assert "never more than M" in raised_hint("10.7", beyond.format(2))
    assert raised_hint("10.7", beyond.format(1)) is None  # an index error with forwards left: no count proven
    popped = "rank 3 raised IndexError: pop from empty list [after 1 forwards and 1 backwards started of M = 2, on stage 3 of 4]"
    assert "no forward left to pair" in raised_hint("10.7", popped)


def test_a_traceback_stays_in_pytests_report_not_in_the_line():
    """Issue 32: a rank's traceback (or call_alone's) was joined into the one line check.py prints."""
    for trace in (RANK_TRACE, '\n\nTraceback (most recent call last):\n  File "/w/template_zero.py", line 3, in f\n'):
        text, _ = explain("AssertionError", "Task 6.1 (template_zero.py, f): f(1) raised ValueError: bad" + trace, "")
        assert text == "Task 6.1 (template_zero.py, f): f(1) raised ValueError: bad", text


def test_in_a_release_a_failing_earlier_task_of_the_file_is_said_first():
    """Issue 45: an 11.2 that all-reduced the weight and bias gradients itself made 11.3 fail with 'pass
    self.weight and self.bias to SyncBatchNormFunction.apply', which the student's 11.3 did; only the
    end of the message named 11.2. In a release (the student's own 11.2 runs in 11.3's tests) the
    earlier failing task comes first; an earlier task not checked in this run is still a note at the end."""
    from grading.checker import blame_own_answers

    course = [Task(f"11.{n}", file="template_batchnorm.py") for n in (1, 2, 3)]
    hint = "Task 11.3: the weight and bias gradients ...: pass self.weight and self.bias to SyncBatchNormFunction.apply"
    results = [TaskResult(course[1], "failing", "Task 11.2: the weight gradient is 2 times ..."),
               TaskResult(course[2], "failing", hint)]
    blame_own_answers(results, course)
    assert results[0].explanation.startswith("Task 11.2: the weight gradient"), results[0].explanation
    said = results[1].explanation
    assert said.startswith("This course has no solutions/") and "Task 11.2 is not done either" in said, said
    assert said.index("Task 11.2 is not done") < said.index("pass self.weight"), said
    alone = [TaskResult(course[2], "failing", hint)]
    blame_own_answers(alone, course)
    assert alone[0].explanation.startswith(hint) and "if Task 11.1, 11.2 is wrong" in alone[0].explanation, \
        alone[0].explanation


def test_in_a_release_the_tasks_a_test_uses_are_blamed_and_fixed_first_and_no_other():
    """A student trial: in a release, a wrong 14.4 (its column layer kept f) made `check.py 14.1` fail with 14.4's
    cause in the message, but the line said 14.1, nothing checked 14.4, and "Next" said to fix 14.1. The tasks a
    task's tests use are measured (grading.checker.TASKS_USED): 14.1's use 14.3 and 14.4, and 14.4's use 14.1 in
    turn, so each names the other as a possible cause; a wrong 14.3, which uses neither, is named first and fixed
    first. And an earlier task that a test does not use is blamed no more (2.3's tests run neither 2.1 nor 2.2)."""
    from grading.checker import blame_own_answers, in_fixing_order

    course = [Task(f"14.{n}", file="template_sequence_parallel.py") for n in (1, 2, 3, 4, 5)]
    one, four = "the input's gradient differs ... no f there", "SequenceParallelColumnLinear ... no f in the layer"
    results = [TaskResult(course[0], "failing", one)]
    used = [TaskResult(course[2], "done"), TaskResult(course[3], "failing", four)]
    blame_own_answers(results, course, others=used)
    blame_own_answers(used, course, others=results)
    said = results[0].explanation
    assert said.startswith("This course has no solutions/") and "Task 14.4 is not done either, and its tests use " \
        "this task's answer too: either may be the cause" in said and said.endswith(one) and "14.3" not in said, said
    assert "Task 14.1 is not done either, and its tests use this task's answer too" in used[1].explanation, \
        used[1].explanation
    # a wrong 14.3 (used by 14.1 and 14.4, using neither): said first, and fixed first
    three = [TaskResult(course[2], "failing", "gather ..."), TaskResult(course[3], "failing", four)]
    results = [TaskResult(course[0], "failing", one)]
    blame_own_answers(results, course, others=three)
    assert "Task 14.3 is not done either and may be the cause: fix it first" in results[0].explanation, \
        results[0].explanation
    assert [r.task.id for r in in_fixing_order(results + three, course)] == ["14.3", "14.1", "14.4"]
    # 14.3 and 14.4 right: 14.1's own message; with 14.3 not checked, the hedge names it alone (14.2 is not used)
    alone = [TaskResult(course[0], "failing", one)]
    blame_own_answers(alone, course, others=[TaskResult(course[3], "done")])
    assert alone[0].explanation.startswith(one) and "if Task 14.3 is wrong" in alone[0].explanation, \
        alone[0].explanation
    # an earlier task that is used is still fixed first; one that is not used is not blamed
    data = [Task(f"1.{n}", file="template_data_loader.py") for n in (1, 2, 3, 4)]
    mixed = [TaskResult(data[3], "failing", "x"), TaskResult(data[0], "failing", "y"), TaskResult(data[1], "done")]
    assert [r.task.id for r in in_fixing_order(mixed, data)] == ["1.1", "1.2", "1.4"]
    trainer = [Task(f"2.{n}", file="template_trainer.py") for n in (1, 2, 3)]
    sums = [TaskResult(trainer[0], "failing", "broadcast ..."), TaskResult(trainer[2], "failing", "the sums ...")]
    blame_own_answers(sums, trainer)
    assert sums[1].explanation == "the sums ...", sums[1].explanation


def test_the_tasks_used_are_tasks_of_the_same_file_and_docs_list_the_later_ones():
    """TASKS_USED (measured by tools/tasks_used.py) names other tasks of each task's own file, and
    docs/checking.md lists the later ones."""
    from grading.checker import TASKS_USED, discover_tasks

    course = {t.id: t for t in discover_tasks(REPO)}
    for task, used in TASKS_USED.items():
        assert task not in used and all(course[t].file == course[task].file for t in used), task
        assert list(used) == sorted(used, key=lambda t: course[t].key), task
    with open(os.path.join(REPO, "docs", "checking.md")) as f:
        page = " ".join(f.read().split())
    listed = {task: tuple(later.split(", ")) for task, later in
              re.findall(r"(\d+\.\d+) uses ((?:\d+\.\d+)(?:, \d+\.\d+)*)", page)}
    later = {task: tuple(t for t in used if course[t].key > course[task].key) for task, used in TASKS_USED.items()}
    assert listed == {task: used for task, used in later.items() if used}, listed


def test_ring_hang_and_skipped_gradient_hints_only_where_their_condition_holds():
    """Trial B, Task 15.2/15.3: hangs of the ring were told only by the harness's generic text, and a backward that
    skipped its dK/dV send at an idle step by a raw TypeError."""
    from test_context_parallel import ring_hang_hint, skipped_gradients
    wait = ("tests/test_context_parallel.py", 225, "recorded_wait")
    sending = [wait, ("tests/wire.py", 218, "blocking_send"), ("template_context_parallel.py", 132, "forward")]
    receiving = [wait, ("tests/wire.py", 230, "blocking_recv"), ("template_context_parallel.py", 185, "backward")]
    waiting = [wait, ("template_context_parallel.py", 141, "forward")]
    assert "every rank waits in a blocking dist.send" in ring_hang_hint(_stuck(sending, sending))
    assert "every rank waits in a blocking dist.recv" in ring_hang_hint(_stuck(receiving, receiving))
    for mixed in (_stuck(sending, receiving), _stuck(sending, waiting), _stuck(waiting, waiting)):
        hint = ring_hang_hint(mixed)
        assert "blocking" not in hint and "leaves the ring early" not in hint, hint
    finished = _stuck(waiting).replace("(ranks [] had finished)", "(ranks [0] had finished)")
    assert ring_hang_hint(finished).startswith("rank 0 had finished while the others still waited in the ring")
    # rank 0 of 3, causal: its own block computed and its dK/dV sent; rank 2's block passed on with nothing sent
    own = [("send", "kv", 0), ("compute", None, 0), ("send", "grad", None), ("arrived", "kv", 2)]
    idle = [("send", "kv", 2), ("arrived", "grad", None), ("arrived", "kv", 1)]
    assert skipped_gradients(own + idle) == 2
    assert skipped_gradients(own + idle[:2]) is None  # the step with rank 2's block had not ended: nothing proven
    sent = [("send", "kv", 2), ("send", "grad", None), ("arrived", "kv", 1)]
    assert skipped_gradients(own + sent) is None
    late = [("send", "kv", 0), ("compute", None, 0), ("arrived", "kv", 2), ("send", "grad", None)]
    assert skipped_gradients(late + idle) is None  # its dK/dV go out after the next block came: not its way to skip


def test_unsent_and_short_gradient_hints_only_where_their_condition_holds():
    """Task 15.3: no dK/dV sent at step 0 (a raw UnboundLocalError), and N - 1 dK/dV sends then a wait for the
    missing one (a raw TypeError), are said only where the Recorder's log proves them."""
    from test_context_parallel import gradients_never_sent, gradients_sent_n_minus_1_times
    # rank 0 of 3: its own block computed, passed on, the next one arrived, and no dK/dV ever sent
    unsent = [("send", "kv", 0), ("compute", None, 0), ("arrived", "kv", 2), ("send", "kv", 2)]
    assert gradients_never_sent(unsent)
    assert not gradients_never_sent(unsent[:2])  # the first step had not ended: nothing proven
    assert not gradients_never_sent([unsent[0], unsent[2]])  # nothing computed: nothing to send yet
    assert not gradients_never_sent(unsent[:2] + [("send", "grad", None)] + unsent[2:])
    # the whole ring of 3: 2 K/V blocks received, 2 dK/dV sent and received
    step = [("send", "kv", 0), ("compute", None, 0), ("send", "grad", None), ("arrived", "kv", 2)]
    short = step + [("send", "kv", 2), ("arrived", "grad", None), ("compute", None, 2), ("send", "grad", None),
                    ("arrived", "kv", 1), ("arrived", "grad", None), ("compute", None, 1)]
    assert gradients_sent_n_minus_1_times(short, 3)
    assert not gradients_sent_n_minus_1_times(short[:-2], 3)  # the last step's dK/dV not yet received
    assert not gradients_sent_n_minus_1_times(short + [("send", "grad", None)], 3)  # N sent: not short
    assert gradients_sent_n_minus_1_times([("send", "kv", 0), ("send", "grad", None), ("arrived", "kv", 1),
                                           ("arrived", "grad", None)], 2)


def test_gloos_all_gather_size_error_says_stacked_only_where_the_shape_shows_it():
    """Trial 9: an FSDP gather into an output without its padding (too small) was told that the output was stacked
    (world_size, n), a cause it did not have: gloo's error says both shapes; stacked shows one dim more."""
    stacked = "RuntimeError: ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (6), got (2, 3))"
    small = "RuntimeError: ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (6), got (5))"
    said_stacked, _ = explain("RuntimeError", stacked.split(": ", 1)[1], "")
    said_small, _ = explain("RuntimeError", small.split(": ", 1)[1], "")
    assert "not stacked (world_size, n, ...)" in said_stacked, said_stacked
    assert "stacked" not in said_small and "exactly world_size times the input's elements" in said_small, said_small


def test_next_names_both_tasks_where_each_ones_tests_use_the_other(monkeypatch):
    """In a release, 14.1 and 14.4 failing (each one's tests use the other's answer): "Next" names both, not 14.1
    alone (the student trial's wrong 14.4 was sent to fix 14.1); a task used one way is fixed first as before."""
    import check

    monkeypatch.setattr(check, "is_release", lambda repo: True)
    course = [Task(f"14.{n}", file="template_sequence_parallel.py") for n in (1, 3, 4)]
    both = [TaskResult(course[0], "failing", "x"), TaskResult(course[2], "failing", "y")]
    said = check.next_step(both, "template", everything=False)
    assert said.startswith("fix Task 14.1 or Task 14.4: in this copy each one's tests use your answer to the other") \
        and "`python check.py 14.1 14.4`" in said, said
    one_way = check.in_fixing_order([TaskResult(course[0], "failing", "x"), TaskResult(course[1], "failing", "z")],
                                    course)
    assert check.next_step(one_way, "template", everything=False).startswith("fix Task 14.3 "), one_way
    monkeypatch.setattr(check, "is_release", lambda repo: False)  # the course: 14.1's tests use solutions/' 14.4
    assert check.next_step(both, "template", everything=False).startswith("fix Task 14.1 ("), both
