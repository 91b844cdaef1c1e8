"""Write the GitHub Classroom workflow: one autograding step per task, with its points.

    python grading/classroom.py            # writes .github/workflows/classroom.yml
    python grading/classroom.py --check    # exit 1 if that file is not what the course gives

The steps come from the tasks (pytest.ini's markers, the fences) and grading/points.toml, as
grade.py's do: after adding a task or changing points, run this and commit the file.
tests/test_grading_formats.py fails while the committed file is out of date.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script
from grading.checker import REPO, discover_tasks  # noqa: E402
from grading.formats import classroom_workflow  # noqa: E402
from grading.grade import POINTS_FILE, load_policy  # noqa: E402

WORKFLOW = os.path.join(REPO, ".github", "workflows", "classroom.yml")


def expected(repo=REPO, points=POINTS_FILE):
    return classroom_workflow(discover_tasks(repo), load_policy(points))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare: exit 1 if the file is out of date")
    args = parser.parse_args(argv)
    text = expected()
    current = open(WORKFLOW, encoding="utf-8").read() if os.path.exists(WORKFLOW) else None
    if args.check:
        if current != text:
            print(f"classroom.py: {os.path.relpath(WORKFLOW, REPO)} is out of date: run python grading/classroom.py",
                  file=sys.stderr)
            return 1
        print(f"{os.path.relpath(WORKFLOW, REPO)} is up to date.")
        return 0
    os.makedirs(os.path.dirname(WORKFLOW), exist_ok=True)
    with open(WORKFLOW, "w", encoding="utf-8") as f:
        f.write(text)
    steps = text.count("autograding-command-grader")
    print(f"Wrote {os.path.relpath(WORKFLOW, REPO)} ({steps} tasks).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
