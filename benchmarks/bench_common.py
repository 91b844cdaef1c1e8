"""What the three benchmarks share: where they write, and the check that torchvision works.
(Imported as bench_common: a script's own folder is on sys.path.)

A run writes under runs/benchmarks/ (ignored by git). benchmarks/results/ holds the figures
the pages show, committed: only --update-results writes there, so that a quick try never
replaces them (the grader would then report the course as modified).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")  # committed: the pages' figures
RUNS = os.path.join(ROOT, "runs", "benchmarks")  # ignored by git: every other run


def add_output_arguments(parser, what):
    parser.add_argument("--out", default=None,
                        help=f"folder for {what} (default: runs/benchmarks, or benchmarks/results with "
                        "--update-results)")
    parser.add_argument("--update-results", action="store_true",
                        help="write into benchmarks/results, replacing the committed figures that the pages show")


def output_folder(args):
    """--out, or the folder --update-results chooses."""
    if args.out and args.update_results:
        sys.exit("--out and --update-results both say where to write: give one")
    return args.out or (RESULTS if args.update_results else RUNS)


def torchvision_or_exit(model_names):
    """ResNet-18 comes from torchvision: a broken one stops the benchmark with one line, at once."""
    if "resnet18" not in model_names:
        return
    sys.path.insert(0, ROOT)
    from data import torchvision_problem

    problem = torchvision_problem()
    if problem:
        if os.environ.get("RANK", "0") == "0":
            problem = problem.replace(", or train without it: --data synthetic", "")
            print(f"{os.path.basename(sys.argv[0])}: ResNet-18 needs torchvision, and {problem}; or leave "
                  "ResNet-18 out: --models cnn", file=sys.stderr)
        sys.exit(2)
