"""Check your progress: which tasks are done, which are not, and why.

    python check.py            # every task, in course order
    python check.py 2.3        # one task (also: task2_3); seconds, not minutes
    python check.py 2          # all of Task 2
    python check.py -v 2.3     # and show pytest's own output, tracebacks included
    python check.py --env      # the set-up: torch and torchvision, GPUs, CIFAR-10 on disk

It runs the tests against your template_*.py files (pytest --impl template) once, and
prints one line per task: done, not started (its TODO still raises NotImplementedError),
blocked (it needs another task first), failing (with the tests' explanation of the likely
mistake) or hang (with where each stuck rank was waiting). It never hangs itself: a
deadlock is caught by the tests' time limits and reported. A task that fails in a way a busy
machine can cause (a hang where no rank finished, a lost connection) is run once more before
it is reported; a deadlock (a rank finished, the others wait in a collective for it) is not.
A task's slow-marked tests run after its others, and not at all once one of those failed: a
wrong answer is told in the time of the fast tests, a right one runs them all, as the grader
does. Without GPUs the NCCL variants of the tests are skipped; on a machine with GPUs they run too.
In a student release (no solutions/) a task's tests use your own answers to some other tasks of
its file (grading.checker.TASKS_USED: most of the earlier ones, a few later ones): when it fails, those
this run did not check are checked too, its message names those that fail, and "Next" sends you to them first.
"""
import argparse
import os
import sys
import tempfile
import textwrap

from grading.checker import (TASKS_USED, blame_own_answers, discover_tasks, in_fixing_order, is_release, run_tests,
                             select_tasks, summarize, tasks_used, tasks_used_unchecked)

REPO = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tasks", nargs="*", help="tasks to check, like 2.3 or task2_3 or 2 (default: all)")
    parser.add_argument("--impl", choices=["template", "solutions"], default="template",
                        help="template: your template_*.py files (default); solutions: the reference answers")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="stop the whole check after this many seconds (default: 600); a single hang is "
                        "caught much sooner by the tests' own limits")
    parser.add_argument("-v", "--verbose", action="store_true", help="also print pytest's output")
    parser.add_argument("--env", action="store_true",
                        help="check the set-up instead: torch and torchvision import and match, their versions, "
                        "the GPUs, whether CIFAR-10 is on disk (in --data-dir)")
    parser.add_argument("--data-dir", default="data", help="where --env looks for CIFAR-10 (default: data, as train_ddp.py)")
    return parser.parse_args(argv)


def check_environment(data_dir="data"):
    """Print what the course needs from the installation, one line each; 0 if it can run, else 1."""
    problems = []

    def line(name, text, problem=None):
        print(f"  {name:<12} {text}")
        if problem:
            problems.append(f"{name}: {problem}")

    line("Python", f"{sys.version.split()[0]} ({sys.executable})")
    try:
        import torch
    except Exception as error:  # not installed, or a broken build
        line("torch", f"cannot be imported ({type(error).__name__}: {error})",
             "install it: see the README's Start (CPU wheels on a machine without an NVIDIA GPU)")
        torch = None
    if torch is not None:
        import torch.distributed as dist
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        backends = [name for name, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available())) if ok]
        line("torch", f"{torch.__version__} ({build}; backends: {', '.join(backends) or 'none'})",
             None if "gloo" in backends else "this torch has no gloo backend: every test and CPU run needs it")
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = ", ".join(sorted({torch.cuda.get_device_name(i) for i in range(gpus)}))
        line("GPUs", f"{gpus} ({names})" if gpus else
             "none: everything runs on the CPU with gloo; the GPU variants of the tests are skipped")
        from data import cifar10_on_disk, matching_torchvision, torchvision_problem
        broken = torchvision_problem()
        if broken:
            line("torchvision", broken.split(". Reinstall")[0].removeprefix("torchvision "), broken)
        else:
            import torchvision
            wanted = matching_torchvision()
            matches = not wanted.endswith(".*") or torchvision.__version__.startswith(wanted[:-1])
            line("torchvision", f"{torchvision.__version__}" + (f", matches torch {torch.__version__}" if matches else
                 f", but torch {torch.__version__} goes with torchvision {wanted}"),
                 None if matches else f"pip install --force-reinstall \"torchvision=={wanted}\" (the CPU wheels: "
                 "add --index-url https://download.pytorch.org/whl/cpu)")
        folder = os.path.abspath(data_dir)
        line("CIFAR-10", f"on disk in {folder}" if cifar10_on_disk(data_dir) else
             f"not in {folder}: train_ddp.py downloads it (170 MB) on first use, or trains on synthetic data offline")
    for module, why in (("pytest", "the tests"), ("pytest_timeout", "the tests' time limits"),
                        ("matplotlib", "the plots"), ("tqdm", "the progress bar")):
        try:
            __import__(module)
        except Exception as error:
            line(module.replace("_", "-"), f"missing ({type(error).__name__})",
                 f"needed for {why}: pip install -r requirements.txt")
    if problems:
        print("\nTo fix:\n" + "\n".join(f"  {p}" for p in problems))
        return 1
    print("\nThe set-up can run the course.")
    return 0


def print_result(result, width):
    task = result.task
    print(f"  Task {task.id:<5} {task.where():<{width}} {result.status}")
    if result.status in ("failing", "hang", "blocked", "error", "not run", "skipped"):
        for line in textwrap.wrap(result.explanation, width=100):
            print(" " * 13 + line)
        for line in result.details[:8]:
            print(" " * 15 + line)


def next_step(results, impl, everything):
    todo = [r for r in results if not r.done and r.status not in ("skipped", "no tests")]
    if not todo:
        if impl == "solutions":
            return "nothing: the reference solutions pass." if everything else "`python check.py --impl solutions` checks every task."
        if everything:
            return ("every task passes. Train with your own code: torchrun --standalone --nproc_per_node=2 "
                    "train_ddp.py (docs/training.md)")
        return "these pass; `python check.py` checks every task."
    first = todo[0]
    task = first.task
    again = f"python check.py {task.id}"
    details = f"pytest --impl {impl} -m {task.marker}"
    if first.status == "not started":
        return f"Task {task.id}: read the docstring of {task.where()} and replace its TODO, then `{again}`."
    if first.status == "blocked":
        return f"finish the task it waits for first ({first.explanation.split('(')[0].strip()}), then `{again}`."
    if first.error_type == "RankStartupTimeout":
        return (f"nothing to fix in Task {task.id}: its ranks could not even start, twice, on this busy machine. "
                f"Run `{again}` again when it is quieter.")
    both_ways = [r.task.id for r in results if not r.done and r.status in ("failing", "hang") and r is not first
                 and r.task.id in TASKS_USED.get(task.id, ()) and task.id in TASKS_USED.get(r.task.id, ())]
    if both_ways and first.status in ("failing", "hang") and is_release(REPO):  # either may be the cause
        ids = " ".join([task.id, *both_ways])
        return (f"fix Task {task.id} or Task {', '.join(both_ways)}: in this copy each one's tests use your answer to "
                f"the other, so either may be the cause (the lines above say what each one's tests saw). Then "
                f"`python check.py {ids}`.")
    if first.status == "hang":
        # no cause here: "every rank must call the same collectives in the same order" was wrong for two
        # neighbours that both send first (same calls, same order), and the lines above give the cause
        return (f"fix the hang in Task {task.id} ({task.where()}): the lines above say where each rank waited. "
                f"Then `{again}`; the full report: `{details}`.")
    return f"fix Task {task.id} ({task.where()}), then `{again}`; the full traceback: `{details}`."


def run_again_if_uncertain(run, results, workdir, args):
    """Run once more the tasks whose result a busy machine can cause (a hang, a rank too slow to
    start or to connect, a crash): a right answer is then not blamed for the machine, as the
    grader does (grading/grade.py). Returns the results, a note per task that passed only on
    the second run, and the second run's seconds."""
    again = [r for r in results if not r.certain] if not run.timed_out else []
    notes = {}
    if not again:
        return results, notes, 0.0
    ids = [r.task.id for r in again]
    print(f"Task {', '.join(ids)}: {again[0].status} on the first run; running {'it' if len(ids) == 1 else 'them'} "
          "again, as a busy machine can cause that ...", flush=True)
    retry_dir = os.path.join(workdir, "again")
    os.makedirs(retry_dir)
    rerun = run_tests(REPO, ids, retry_dir, impl=args.impl, timeout=args.timeout,
                      fast_first=True)
    results = list(results)
    for new in summarize([r.task for r in again], rerun, blame=False):
        index = next(i for i, r in enumerate(results) if r.task.id == new.task.id)
        old = results[index]
        if new.done:
            notes[new.task.id] = (f"(passed when run again; the first run: {old.status}, "
                                  f"{textwrap.shorten(old.explanation, 120)})")
        results[index] = new
    if args.verbose:
        with open(rerun.log_path, encoding="utf-8", errors="replace") as log:
            print(log.read())
    return results, notes, rerun.seconds


def check_tasks_used(results, tasks, workdir, args):
    """In a student release a failing task's tests run the student's own answers to the other tasks of its
    file that they use (grading.checker.TASKS_USED): check those this run did not, so that its message can
    say which of them fail (or that none does) instead of that any may. Returns their results and the
    seconds it took."""
    used = tasks_used_unchecked(results, tasks) if is_release(REPO) else []
    if not used:
        return [], 0.0
    ids = [t.id for t in used]
    failed = [r.task.id for r in results if r.status in ("failing", "hang")
              and any(t in used for t in tasks_used(r.task, tasks))]
    print(f"Task {', '.join(failed)} failed, and {'its' if len(failed) == 1 else 'their'} tests use your answers to "
          f"Task {', '.join(ids)}: checking {'it' if len(ids) == 1 else 'them'} too ...", flush=True)
    folder = os.path.join(workdir, "used")
    os.makedirs(folder)
    run = run_tests(REPO, ids, folder, impl=args.impl, timeout=args.timeout, fast_first=True)
    return summarize(used, run, blame=False), run.seconds


def main(argv=None):
    args = parse_args(argv)
    if args.env:
        print("The set-up:")
        return check_environment(args.data_dir)
    if args.impl == "solutions" and not os.path.isdir(os.path.join(REPO, "solutions")):
        print("check.py: --impl solutions checks the reference answers, which this copy of the course does not "
              "have: check your own files (the default)", file=sys.stderr)
        return 2
    tasks = discover_tasks(REPO)
    try:
        chosen = select_tasks(tasks, args.tasks)
    except ValueError as error:
        print(f"check.py: {error}", file=sys.stderr)
        return 2
    if not chosen:
        print("check.py: no task found: pytest.ini has no taskX_Y markers", file=sys.stderr)
        return 2
    which = "your template_*.py files" if args.impl == "template" else "solutions/"
    print(f"Checking {which}: Task {', '.join(t.id for t in chosen)} ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="check-") as workdir:
        run = run_tests(REPO, [t.id for t in chosen], workdir, impl=args.impl, timeout=args.timeout, fast_first=True)
        results = summarize(chosen, run, blame=False)
        if args.verbose or (all(r.status in ("error", "no tests") for r in results)):
            with open(run.log_path, encoding="utf-8", errors="replace") as log:
                print(log.read())
        results, notes, seconds_again = run_again_if_uncertain(run, results, workdir, args)
        used, seconds_used = check_tasks_used(results, tasks, workdir, args)
    if is_release(REPO):  # each task's message names the tasks its tests use that fail, of both runs
        blame_own_answers(results, tasks, others=used)
        blame_own_answers(used, tasks, others=results)
    gpu = {e["nodeid"] for e in run.events if e.get("event") == "collected" and e.get("gpu")}
    skipped = {o.nodeid for r in results for o in r.outcomes if o.state == "skipped"} & gpu
    width = max(len(r.task.where()) for r in results + used) + 1
    for result in results:
        print_result(result, width)
        if result.task.id in notes:
            print(" " * 13 + notes[result.task.id])
    if used:
        print("Checked too, as the tests above ran them:")
        for result in used:
            print_result(result, width)
    done = sum(r.done for r in results)
    gpu_note = f" ({len(skipped)} GPU tests skipped: they need CUDA)" if skipped else ""
    seconds = run.seconds + seconds_again + seconds_used
    print(f"\n{done} of {len(results)} tasks done in {seconds:.0f} s{gpu_note}.")
    in_order = in_fixing_order(results + used, tasks)  # a task its tests use is fixed first
    print("Next:", next_step(in_order, args.impl, everything=len(chosen) == len(tasks)))
    return 0 if done == len(results) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the tests and their ranks are already stopped
        print("\ncheck.py: interrupted", file=sys.stderr)
        sys.exit(130)
