"""Write the course as students get it: everything but the answers.

    python tools/student_release.py ../course-release           # a new folder
    python tools/student_release.py ../course-release --git     # ... as a git repository, one commit
    python tools/student_release.py ../course-release --force   # replace the folder

Left out, and why (the release's README.md says so too):
- solutions/: the answers.
- the catalogue of typical wrong answers in tests/mistakes.py (MISTAKES, and RIGHT_ANSWERS): it is written as
  edits of the answers (its `old=` strings are pieces of them). The file stays, with an empty
  catalogue, for the tests that import its helpers; tests/test_mistakes.py and
  tests/test_check_grade.py, which check and grade that catalogue, are left out.
- benchmarks/*.py that import solutions/ (anywhere in the file): they measure the reference
  answers (their results and plots stay).
- tools/gpu_check.sh: what an instructor runs on a GPU node, with the reference answers.
- tools/tasks_used.py: what a maintainer runs to measure which tasks each task's tests use, with the answers.

In the release, `pytest`, `python check.py` and `torchrun ... train_ddp.py` run the student's
template_*.py files. A task's tests use the student's own answers to the other tasks where the
course uses the reference answers (tests/conftest.py), and check.py names an earlier task that
fails as the likely cause. Links in the Markdown pages to what is left out become plain text.

Before writing, the release is checked: the templates are the course's untouched ones (each
fence holds its TODO and its raise), no fenced answer of solutions/ appears in any file
(except one that the template's own docstring gives, like Task 7.3's one line), and no shipped
code names solutions/ (solutions_references): an import of it at any depth, a string that is
"solutions" or starts with "solutions." or "solutions/", `--impl solutions` in a shell script.
Tests take the reference answers through conftest.load, load_with_reference and REFERENCE,
which fall back to the student's files in a release; a few files handle a course without
solutions/ themselves (HANDLES_NO_SOLUTIONS), and test files marked `repo` as a whole are
skipped in a release (--impl template).
Either failing stops with what was found, and nothing is left behind.
"""
import argparse
import ast
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from grading.course import copy_course  # noqa: E402

# (path or folder/, why): what a release leaves out
MISTAKES = re.compile(r"^(MISTAKES|RIGHT_ANSWERS) = \[\n.*?^\]\n", re.M | re.S)
EMPTIED = ("{} = []  # the catalogue of typical wrong (and accepted) answers is not part of the student "
           "release: its entries are edits of the answers\n")
LEFT_OUT = [
    ("solutions/", "the answers"),
    ("tests/test_mistakes.py", "checks that catalogue against the answers"),
    ("tests/test_check_grade.py", "grades submissions made from that catalogue"),
    ("tools/gpu_check.sh", "an instructor's check of the reference answers on a GPU node"),
    ("tools/tasks_used.py", "a maintainer's measure of the tests, which fills a release with the answers"),
]
# Shipped files that name solutions/ and work without it, and why (solutions_references skips them)
HANDLES_NO_SOLUTIONS = {
    "check.py": "--impl solutions: refused with one line where solutions/ is missing",
    "train_ddp.py": "--impl solutions: refused with one line (strategies/__init__.py)",
    "strategies/__init__.py": "refuses --impl solutions without solutions/",
    "strategies/course_files.py": "has_solutions(): --impl ddp takes the student's files in a release",
    "tests/conftest.py": "load() falls back to the student's files; REFERENCE is 'template' in a release",
    "tests/impl_option.py": "--impl's choices",
    "grading/checker.py": "says, in a release, that a task is judged with the student's other answers",
    "grading/grade.py": "skips a submission's solutions/ folder",
    "tools/student_release.py": "makes the release from a course that has solutions/",
    "tools/elastic_demo.py": "trains with --impl solutions only where solutions/ exists",
    "tests/mistakes.py": "make_submission copies solutions/, for tests marked repo (skipped in a release)",
}
NAMES_SOLUTIONS = re.compile(r"^solutions(?:$|[./])")
IMPL_SOLUTIONS = re.compile(r"--impl[ =]solutions\b|\bsolutions/")
FENCE = re.compile(r"^[ \t]*# --- Task (\d+\.\d+) begin ---[ \t]*\n(.*?)^[ \t]*# --- Task \1 end ---", re.M | re.S)
UNTOUCHED = re.compile(r"\A[ \t]*# TODO Task [\d.]+:[^\n]*\n[ \t]*raise NotImplementedError\([^\n]*\)\n?\Z")
LINK = re.compile(r"(!?)\[((?:[^\]]|\][^(])*?)\]\(([^)\s]+)\)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", help="the new folder for the release")
    parser.add_argument("--git", action="store_true", help="make the folder a git repository with one commit")
    parser.add_argument("--force", action="store_true", help="replace DEST if it exists")
    return parser.parse_args(argv)


@functools.lru_cache(maxsize=1024)  # a test session checks the same files more than once (parsing them: 1.3 s)
def solutions_references(path, text):
    """[(line, what)]: where the shipped file `path` ('/'-separated) names solutions/ in its code, so
    that it would fail in a release: Python, an import of solutions at any depth or a string (not a
    docstring) that is "solutions", or starts with "solutions.", "solutions/" or "--impl solutions",
    other than the first argument of conftest's load() or load_with_reference() or a comparison; a shell script, a line (not a comment) that runs
    `--impl solutions` or a path in solutions/."""
    if "solutions" not in text:
        return ()
    if path.endswith(".sh"):
        return tuple((number, line.strip()) for number, line in enumerate(text.splitlines(), 1)
                     if IMPL_SOLUTIONS.search(line.split("#", 1)[0]))
    if not path.endswith(".py"):
        return ()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ()
    if path.startswith("tests/") and re.search(r"^pytestmark\b.*\bmark\.repo\b", text, re.M):
        return ()  # every test of the file is skipped in a release (conftest.pytest_runtest_setup)
    allowed = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            allowed.add(id(body[0].value))  # a docstring
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                "load", "load_with_reference"):
            allowed.update(id(arg) for arg in node.args[:1])  # conftest.load("solutions", ...) falls back
        if isinstance(node, ast.Compare):
            allowed.update(id(part) for part in [node.left, *node.comparators])  # impl == "solutions"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if NAMES_SOLUTIONS.match(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and NAMES_SOLUTIONS.match(node.module or ""):
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in allowed and (
                NAMES_SOLUTIONS.match(node.value) or re.match(r"--impl[ =]solutions\b", node.value)):
            found.append((node.lineno, repr(node.value[:60])))
    return tuple(sorted(found))  # cached: not to be changed


def left_out(path, repo=REPO):
    """Why `path` (relative, '/'-separated) is not in a release, or None."""
    if path.startswith("benchmarks/") and path.endswith(".py") and os.path.isfile(os.path.join(repo, path)):
        with open(os.path.join(repo, path), encoding="utf-8") as f:
            if any(what.startswith(("import", "from")) for _, what in solutions_references(path, f.read())):
                return "measures the reference answers"
    for prefix, why in LEFT_OUT:
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return why
    return None


def answers(solutions):
    """{(file, task): the fenced answer, its lines stripped} of every solution file."""
    found = {}
    for name in sorted(os.listdir(solutions)):
        if name.startswith("template_") and name.endswith(".py"):
            with open(os.path.join(solutions, name), encoding="utf-8") as f:
                for task, body in FENCE.findall(f.read()):
                    found[(name, task)] = _normal(body)
    return found


def _normal(text):
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def problems(release, solutions):
    """What would make `release` leak an answer or break: a filled-in template, an answer found,
    code that names solutions/ (solutions_references)."""
    found = []
    for here, dirs, files in os.walk(release):
        dirs[:] = sorted(d for d in dirs if d not in (".git", "__pycache__"))
        for name in sorted(files):
            path = os.path.relpath(os.path.join(here, name), release).replace(os.sep, "/")
            if path in HANDLES_NO_SOLUTIONS or not name.endswith((".py", ".sh")):
                continue
            with open(os.path.join(here, name), encoding="utf-8") as f:
                for line, what in solutions_references(path, f.read()):
                    found.append(f"{path}:{line} names solutions/ ({what}), which a release has not: take the "
                                 f"reference answers through conftest's load(\"solutions\", ...) or REFERENCE")
    for name in sorted(os.listdir(release)):
        if name.startswith("template_") and name.endswith(".py"):
            with open(os.path.join(release, name), encoding="utf-8") as f:
                for task, body in FENCE.findall(f.read()):
                    if not UNTOUCHED.match(body.lstrip("\n")):
                        found.append(f"{name}: Task {task}'s fence is filled in (the release takes the committed "
                                     f"templates: commit them untouched)")
    bodies = answers(solutions)
    for (file, task), body in list(bodies.items()):  # an answer that its docstring spells out is handed out anyway
        with open(os.path.join(release, file), encoding="utf-8") as f:
            if body in _normal(f.read()):
                del bodies[(file, task)]
    for here, _, files in os.walk(release):
        if ".git" in os.path.relpath(here, release).split(os.sep):
            continue
        for name in files:
            path = os.path.join(here, name)
            try:
                with open(path, encoding="utf-8") as f:
                    text = _normal(f.read())
            except (UnicodeDecodeError, OSError):
                continue  # images, data
            for (file, task), body in bodies.items():
                if body and body in text:
                    found.append(f"{os.path.relpath(path, release)} holds the answer to Task {task} ({file})")
    return found


def _unlink_left_out(release, page):
    """[text](link) to a file that is left out becomes the text: the release has no such file."""
    path = os.path.join(release, page)
    with open(path, encoding="utf-8") as f:
        text = f.read()

    def plain(match):
        image, label, target = match.groups()
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), target.partition("#")[0])).replace(os.sep, "/")
        if left_out(resolved) or left_out(resolved + "/"):
            return label
        return match.group(0)
    new = LINK.sub(plain, text)
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)


NOTE = """\
> **Student release.** This copy of the course has no answers. Left out: {left}.
> `pytest` and `python check.py` test your `template_*.py` files; a task's tests use your own
> answers to the tasks it builds on, so when an earlier task fails, fix that one first
> (`python check.py` names it).

"""


def build(dest, repo=REPO):
    """Write the release to the new folder `dest`; returns (the problems: empty if written, what
    was left out)."""
    work = tempfile.mkdtemp(prefix="release-")
    try:
        staged = os.path.join(work, "course")
        copy_course(staged, repo)
        benchmarks = []
        for here, dirs, files in os.walk(staged, topdown=False):
            for name in files + dirs:
                path = os.path.join(here, name)
                relative = os.path.relpath(path, staged).replace(os.sep, "/")
                if left_out(relative, repo) or left_out(relative + "/"):
                    if relative.startswith("benchmarks/"):
                        benchmarks.append(relative)
                    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
        mistakes = os.path.join(staged, "tests", "mistakes.py")
        if os.path.exists(mistakes):
            with open(mistakes, encoding="utf-8") as f:
                text, count = MISTAKES.subn(lambda match: EMPTIED.format(match.group(1)), f.read())
            if not count or "MISTAKES = []" not in text:
                return ["tests/mistakes.py: no `MISTAKES = [` ... `]` list found to empty"]
            with open(mistakes, "w", encoding="utf-8") as f:
                f.write(text)
        # plain `pytest` tests the student's files too
        ini = os.path.join(staged, "pytest.ini")
        with open(ini, encoding="utf-8") as f:
            text = f.read()
        with open(ini, "w", encoding="utf-8") as f:
            f.write(re.sub(r"^(addopts\s*=.*)$", r"\1 --impl template", text, count=1, flags=re.M))
        gone = LEFT_OUT + [(path, "measures the reference answers") for path in sorted(benchmarks)]
        left = ", ".join(f"`{path}` ({why})" for path, why in gone) + (
            ", and the catalogue of typical wrong answers in `tests/mistakes.py` (edits of the answers)")
        readme = os.path.join(staged, "README.md")
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        title, _, rest = text.partition("\n\n")
        with open(readme, "w", encoding="utf-8") as f:
            f.write(f"{title}\n\n{NOTE.format(left=left)}{rest}")
        for here, _, files in os.walk(staged):
            for name in files:
                if name.endswith(".md"):
                    _unlink_left_out(staged, os.path.relpath(os.path.join(here, name), staged))
        found = problems(staged, os.path.join(repo, "solutions"))
        if not found:
            shutil.move(staged, dest)
        return found, [path for path, _ in LEFT_OUT] + sorted(benchmarks)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None):
    args = parse_args(argv)
    dest = os.path.abspath(args.dest)
    if os.path.exists(dest):
        if not args.force:
            print(f"student_release.py: {args.dest} exists: choose a new folder, or --force to replace it",
                  file=sys.stderr)
            return 2
        shutil.rmtree(dest)
    if dest == REPO or dest.startswith(REPO + os.sep):
        print("student_release.py: write the release outside the course (it would copy itself)", file=sys.stderr)
        return 2
    found, gone = build(dest)
    if found:
        print("student_release.py: not written, the release would give answers away:", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 1
    if args.git:
        for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=course", "-c", "user.email=course@localhost",
                                                       "commit", "-q", "-m", "Student release"]):
            subprocess.run(["git", *command], cwd=dest, check=True)
    count = sum(len(files) for here, _, files in os.walk(dest)
                if ".git" not in os.path.relpath(here, dest).split(os.sep))
    print(f"Wrote the student release to {args.dest} ({count} files; left out: {', '.join(gone)}; "
          f"the catalogue in tests/mistakes.py emptied).")
    print(f"Check it: cd {args.dest} && python check.py 1.1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
