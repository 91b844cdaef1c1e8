"""The harness itself (tests/harness.py): a slow start is the machine's, never the code's.

    pytest tests/test_harness.py

Under load (six test runs on two cores) starting a rank, a fork and the import of the test's
module, once took the whole 20 s of a test's limit: check.py then reported a right Task 2.1
as a hang "in init_process_group". These start ranks that are slow to start on purpose.
"""
import os
import time

import pytest
import torch
import torch.distributed as dist

from harness import RankFailed, RankStartupTimeout, _raise_startup_timeout, _StartupStalled, differing_in_another_thread, run_ranks

pytestmark = pytest.mark.repo


def _slow_start(seconds, once_dir):
    """Runs in each rank as its arguments are unpickled, before the rank's code: a slow import.
    With `once_dir`, only the first rank to get here is slow."""
    if once_dir is not None:
        try:
            os.close(os.open(os.path.join(once_dir, "first"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return None
    time.sleep(seconds)
    return None


class SlowToStart:
    def __init__(self, seconds, once_dir=None):
        self.seconds, self.once_dir = seconds, once_dir

    def __reduce__(self):
        return _slow_start, (self.seconds, self.once_dir)


def _sum_of_ranks(rank, world_size, _):
    total = torch.tensor(float(rank))
    dist.all_reduce(total)
    return total.item()


def _sum_of_ranks_after_a_while(rank, world_size, _):
    time.sleep(0.1)  # longer than the harness's 50 ms wait on its queue: it looks at its deadline meanwhile
    return _sum_of_ranks(rank, world_size, _)


@pytest.mark.slow  # the three tests below wait on purpose (1.3, 2.2 and 2.2 s)
def test_a_slow_start_does_not_count_against_the_time_limit():
    # the ranks take 1.1 s to start, the code under test has 0.6 s: fine, as the start is not its time. The
    # sleep alone outlasts the limit, so a harness that counted the start fails, whatever the load; the
    # code under test (0.1 s, then one all_reduce of a float, which took at most 0.084 s in 55 runs with six
    # busy processes added on this machine's 2 cores, load average 5-9) has 3 times what it takes there
    assert run_ranks(_sum_of_ranks_after_a_while, 2, SlowToStart(1.1), timeout=0.6) == [1.0, 1.0]


@pytest.mark.slow
def test_a_start_that_stalls_is_tried_again(tmp_path):
    # the first rank to start stalls (as gloo's connection set-up can under load); no code under
    # test has run, so the harness starts the ranks again rather than report a hang. The test waits the
    # first start's whole limit; the second start has as long: a start of 2 ranks (fork, import, group)
    # took at most 1.25 s in 55 runs with six busy processes added on 2 cores (load average 5-9), 0.1 s quiet
    assert run_ranks(_sum_of_ranks, 2, SlowToStart(60.0, str(tmp_path)), timeout=2, startup_timeout=2) == [1.0, 1.0]


@pytest.mark.slow  # 2 s of two stalled starts; the message itself is checked below, at once
def test_a_start_that_never_ends_is_reported_as_the_machines():
    start = time.monotonic()
    with pytest.raises(RankStartupTimeout) as error:
        run_ranks(_sum_of_ranks, 2, SlowToStart(60.0), timeout=2, startup_timeout=1)
    message = str(error.value)
    assert time.monotonic() - start < 10, "the start-up limit was not kept"
    assert "did not start, twice, within 1 s" in message and "not a mistake in your code" in message, message
    assert "ranks [0, 1] had not started yet" in message, message


def test_where_the_ranks_were_is_said_plainly():
    class Alive:
        pid = 0
    with pytest.raises(_StartupStalled, match=r"^every rank \(0-2\) was still waiting in init_process_group"):
        _raise_startup_timeout([Alive()] * 3, {0, 1, 2}, set(), 30, "")
    with pytest.raises(_StartupStalled, match=r"^ranks \[1\] had not started yet .*; ranks \[0\] were waiting "
                                              r"in init_process_group for the others$"):
        _raise_startup_timeout([Alive()] * 2, {0}, set(), 30, "")


def _collect_garbage(rank, world_size):
    import gc
    return gc.get_freeze_count() > 0, gc.collect() >= 0


def test_a_stuck_ranks_report_ends_at_the_rank_and_ranks_leave_inherited_objects_to_the_collector():
    """A stuck rank's stack is said from where it waits down to _rank_main: the forkserver's frames below it
    (on Linux it is forked from pytest while pytest imports conftest.py) are none of the test's. And a rank
    has frozen (gc.freeze) what it inherited: a gc.collect() there walked every torch and pytest object, and
    copied every page the fork shared (1.3 s a call at load 8)."""
    from harness import _where
    dump = ('Thread 0x1 (most recent call first):\n'
            '  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 6371 in barrier\n'
            '  File "/c/tests/test_pipeline.py", line 642 in _schedule_run\n'
            '  File "/c/tests/harness.py", line 164 in _rank_main\n'
            '  File "<string>", line 1 in <module>\n'
            '  File "/c/tests/harness.py", line 102 in _forked_server\n'
            '  File "/c/tests/conftest.py", line 19 in <module>\n')
    assert _where(dump).split("\n      ") == [
        'File "/x/site-packages/torch/distributed/distributed_c10d.py", line 6371 in barrier',
        'File "/c/tests/test_pipeline.py", line 642 in _schedule_run', 'File "/c/tests/harness.py", line 164 in _rank_main']
    assert run_ranks(_collect_garbage, 1) == [(True, True)]


def _matmul_bits_in_another_thread(rank, world_size):
    return differing_in_another_thread(), os.environ.get("OMP_NUM_THREADS")


def test_every_thread_of_a_rank_computes_as_its_main_thread():
    """A rank's threads all compute with one thread, as under torchrun (OMP_NUM_THREADS=1): PowerSGD's decompress
    runs on gloo's thread, and with OpenMP's default of all cores there its matmul gave other bits than in the
    main thread (1245 of 25,600 elements here), and right answers ended "ranks INCONSISTENT". The variable
    itself is left as it was, for what the tests start in new processes."""
    [(differing, variable)] = run_ranks(_matmul_bits_in_another_thread, 1)
    assert differing == 0, f"{differing} elements of a matmul differ between a rank's main thread and another"
    assert variable == os.environ.get("OMP_NUM_THREADS")


def _where_and_what_it_got(rank, world_size, tensor):
    import sys
    tensor.add_(1.0)  # the rank's own copy
    return os.getcwd(), sys.path[0], tensor


def test_ranks_forked_ahead_run_in_their_runs_folder_and_sys_path_on_a_copy_of_its_arguments(tmp_path, monkeypatch):
    """Ranks are forked before their run, while the run before works (harness._pool): the folder and sys.path a
    rank has are its run's, as a forkserver's start of the rank itself would give, and a tensor it is given is
    its own copy (a rank that changes it changes nothing of the test's)."""
    tensor = torch.zeros(3)
    run_ranks(_where_and_what_it_got, 2, tensor)  # the next run's ranks are forked here, before the chdir
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for folder, path, got in run_ranks(_where_and_what_it_got, 2, tensor):
        assert (folder, path) == (str(tmp_path), str(tmp_path))
        assert got.tolist() == [1.0] * 3
    assert tensor.tolist() == [0.0] * 3, "a rank's change of its argument reached the test's tensor"


def _cannot_import_here():
    raise ImportError("no module named 'only_in_pytest'")


class ImportsInTheRankFail:
    def __reduce__(self):
        return _cannot_import_here, ()


def test_a_rank_that_cannot_import_its_tests_module_says_why():
    """A rank unpickles its run's function and arguments (importing the test's module) once the run starts: an
    error there is the rank's report, not an exit "without reporting"."""
    with pytest.raises(RankFailed, match=r"rank \d raised ImportError: no module named 'only_in_pytest'"):
        run_ranks(_sum_of_ranks, 2, ImportsInTheRankFail())


def _rank_1_ends_quietly(rank, world_size):
    if rank == 1:
        os._exit(0)
    return rank


def test_a_rank_that_ends_without_answering_is_reported_at_once_even_with_exit_code_0():
    """A rank whose pipe ended without its answer has ended for good, whatever its exit code: said then, not at
    the time limit (60 s here)."""
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 1 ended with exit code 0 without reporting"):
        run_ranks(_rank_1_ends_quietly, 2, timeout=60)
    assert time.monotonic() - start < 30, "the harness waited for the time limit"


def _rank_1_ends_quietly_while_rank_0_waits_for_it(rank, world_size):
    if rank == 1:
        os._exit(0)
    dist.recv(torch.zeros(1), src=1)  # gloo: "Connection closed by peer" once rank 1 is gone
    return rank


def test_a_rank_that_loses_its_peer_blames_the_peer_that_ended_with_exit_code_0():
    """A rank's lost connection is the consequence of another rank's end, also of an end with exit code 0 (the
    flaky failure of the test above: rank 0's lost connection came first, and an exit code 0 was not an end)."""
    with pytest.raises(RankFailed, match=r"rank 1 ended with exit code 0 without reporting"):
        run_ranks(_rank_1_ends_quietly_while_rank_0_waits_for_it, 2, timeout=60)


def test_a_lost_connection_read_before_its_peers_end_blames_the_peer(tmp_path):
    """The race behind the flaky failure of the test above (1 run in 16 at load 5): rank 0's "Connection closed by
    peer" and rank 1's end both waiting in their pipes, rank 0's read first. The end of rank 1's pipe, met while
    looking for another rank's report, is its end too."""
    import multiprocessing
    import types

    import harness
    ranks = []
    for rank in range(2):
        ours, theirs = multiprocessing.Pipe()
        theirs.send(("started", None))
        theirs.send(("joined", None))
        if rank == 0:
            theirs.send(("RuntimeError", ("[pair.cc:561] Connection closed by peer [127.0.0.1]:4482", "(trace)")))
        theirs.close()  # rank 1: ended without a word, os._exit(0)
        ranks.append((types.SimpleNamespace(exitcode=None if rank == 0 else 0, pid=os.getpid()), ours))
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"^rank 1 ended with exit code 0 without reporting.*\(rank 0 then lost"):
        harness._collect(ranks, 60, str(tmp_path))
    assert time.monotonic() - start < 2, "the harness waited its 3 s for rank 1's end, which it had already read"


def _rank_1_waits_for_a_send_that_never_comes(rank, world_size):
    if rank == 1:
        dist.recv(torch.zeros(1), src=0)
    return rank


@pytest.mark.slow
def test_a_deadlock_is_reported_once_every_rank_left_waits_not_at_the_time_limit(monkeypatch):
    """Once every rank still running waits without using the CPU, nothing can wake them: the report comes
    then (STILL_FOR, 3 s), not at the time limit, and says where each waits. The hangs of the catalogue
    and of students' answers waited 10-40 s for their limits before."""
    import harness
    monkeypatch.setattr(harness, "STILL_FOR", 1.0)  # the pytest process reads it; a second less to wait
    with pytest.raises(harness.RankTimeout) as hang:
        run_ranks(_rank_1_waits_for_a_send_that_never_comes, 2, timeout=60)
    report = str(hang.value)
    assert report.startswith("ranks [1] were still running after ") and "(ranks [0] had finished), all of them " \
        "waiting, without using the CPU, for the last 1 s: nothing left running could wake them" in report, report
    assert "in _rank_1_waits_for_a_send_that_never_comes" in report.split("rank 1 was at:")[1], report
    from grading.checker import is_deadlock
    assert is_deadlock(report), "check.py would run this certain deadlock a second time"


def _waits_while_the_other_rank_works(rank, world_size, how):
    """Rank 1 waits in recv for 2.5 s while rank 0 sleeps, computes, or waits for a process that computes."""
    import subprocess
    import sys
    tensor = torch.tensor([float(rank)])
    if rank == 1:
        dist.recv(tensor, src=0)
        return tensor.item()
    if how == "sleeps":
        time.sleep(2.5)
    elif how == "computes":
        start = time.monotonic()
        while time.monotonic() - start < 2.5:
            torch.randn(64, 64) @ torch.randn(64, 64)
    else:  # its child computes: a DataLoader's worker, a tool it runs
        subprocess.run([sys.executable, "-c", "import time\nstart = time.monotonic()\n"
                        "while time.monotonic() - start < 2.5: sum(range(1000))"], check=True)
    dist.send(torch.tensor([42.0]), dst=1)
    return tensor.item()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sleeps", "computes", "waits-for-its-child"])
def test_a_rank_that_sleeps_computes_or_waits_for_its_child_is_no_deadlock(monkeypatch, how):
    """The other side of the test above: a rank that waits while another sleeps on purpose, computes, or waits
    for a child process that computes, is waiting for something that will come. 2.5 s of it, against a
    stillness of 1 s: reported as a hang, the test fails."""
    import harness
    monkeypatch.setattr(harness, "STILL_FOR", 1.0)
    assert run_ranks(_waits_while_the_other_rank_works, 2, how, timeout=60) == [0.0, 42.0]


def _rank_1_fails_while_rank_0_waits_for_it(rank, world_size):
    if rank == 1:
        raise AssertionError("rank 1's own assertion")  # reported, then the group is left: rank 0's recv fails
    dist.recv(torch.zeros(1), src=1)
    return rank


def test_a_lost_connection_is_not_said_over_the_assertion_of_the_rank_that_closed_it():
    """Rank 1 fails and leaves the group; rank 0, waiting for it, gets "Connection closed by peer". Both reports
    arrive about together, and on a busy machine the lower rank's was read first: the run said rank 0's lost
    connection (Task 15.2's catalogue, once in a run of all the entries). Rank 1's assertion is the news. Quiet,
    rank 1's report is read first anyway; the order that failed is made below, with pipes."""
    with pytest.raises(RankFailed) as failed:
        run_ranks(_rank_1_fails_while_rank_0_waits_for_it, 2, timeout=60)
    assert str(failed.value).startswith("rank 1 raised AssertionError: rank 1's own assertion"), str(failed.value)
    import multiprocessing

    import harness
    pipes = [multiprocessing.Pipe() for _ in range(3)]
    reading = {ours: rank for rank, (ours, _) in enumerate(pipes)}
    pipes[1][1].send(("joined", None))
    pipes[1][1].send(("RuntimeError", ("[pair.cc:561] Connection closed by peer", "trace 1")))  # a consequence too
    pipes[2][1].send(("AssertionError", ("rank 2's own assertion", "trace 2")))
    assert harness._failure_waiting(reading, {}, 0) == (2, ("AssertionError", ("rank 2's own assertion", "trace 2")))
    assert harness._failure_waiting(reading, {}, 0) is None, "nothing else waits"


def test_only_runs_of_tasks_that_never_import_torch_dynamo_start_the_server_without_it():
    """check.py's run of one task (pytest -m task0_3) starts the ranks' server without torch._dynamo where that
    task's tests never import it (1.5-3.5 s of every such check), and without sympy where no rank imports it (0.3
    s); any other run (pytest, -m slow, a task that needs it, an expression of another form) with them."""
    import harness
    from grading.checker import discover_tasks

    assert not harness.needs_dynamo("task0_3") and not harness.needs_dynamo("task0_1 or task15_2 or task16_3")
    for markexpr in ("task2_2", "task0_3 or task13_2", "not slow", "slow", "", None, "task0_3 and slow",
                     "not task0_3", "grading"):
        assert harness.needs_dynamo(markexpr), markexpr
    read = harness.markexpr_of_the_command_line
    assert read(["-p", "x", "-m", "task0_3", "-q"]) == "task0_3" and read(["-mtask1_1 or task1_2"]) == "task1_1 or task1_2"
    assert read(["tests/test_collectives.py", "-q"]) is None and read(["-m"]) is None
    tasks = {t.id for t in discover_tasks(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    assert harness.TASKS_NEEDING_DYNAMO <= tasks, harness.TASKS_NEEDING_DYNAMO - tasks
    # sympy (torch.autograd.grad given an output gradient imports it) where a rank needs it: every task needing
    # torch._dynamo too, which imports it; the tables name tasks of the course, each task in one at most
    assert harness.needs_symbolic_shapes("task15_5") and harness.needs_symbolic_shapes("task0_3 or task2_2")
    assert not harness.needs_symbolic_shapes("task0_3") and harness.needs_symbolic_shapes("slow")
    assert harness.TASKS_NEEDING_SYMBOLIC_SHAPES <= tasks - harness.TASKS_NEEDING_DYNAMO, (
        harness.TASKS_NEEDING_SYMBOLIC_SHAPES - (tasks - harness.TASKS_NEEDING_DYNAMO))
