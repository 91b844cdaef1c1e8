"""The docs stay true: README.md and docs/*.md, their links, their commands and the task table.

    pytest tests/test_docs.py            # links, anchors, and a static check of every command (seconds)
    pytest -m slow tests/test_docs.py    # also runs every runnable command, in a copy of the repository

Every command in a ```bash block is either run by the slow test (with the small arguments of
QUICK added) or listed in NOT_RUN with the reason. Every ```python run block runs too. A new
page in docs/ is picked up by the glob, with no change here.
"""
import argparse
import contextlib
import io
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from glob import glob

import pytest

# Commands that are not run here, with the reason. A key matches the command it equals (after
# `&&` splits, comments dropped); a key ending in " *" matches every command that starts with
# what comes before the star.
NOT_RUN = {
    "pip install *": "installs packages: the environment is already set up (CI installs requirements.txt)",
    "python3 -m venv .venv": "creates a virtual environment: CI installs into its own (.ci/run)",
    ". .venv/bin/activate": "activates that environment in the reader's shell",
    "pytest *": "the test suite itself: CI runs `pytest` and `pytest -m slow` (.ci/run)",
    "python check.py *": "runs the task's tests, which the default `pytest` run runs on the solutions; "
                         "`pytest -m grading` runs check.py itself on prepared submissions",
    "python grading/grade.py *": "needs a folder of student submissions; `pytest -m grading` grades prepared ones",
    "python tools/student_release.py *": "writes a release outside the course, from the committed templates (here "
                                         "they hold the answers); tests/test_student_release.py builds one and runs "
                                         "check.py in it",
    "torchrun --standalone --nproc_per_node=gpu *": "needs GPUs (NCCL)",
    "bash tools/gpu_check.sh": "needs a GPU: it says so and stops on this machine; docs/gpu.md has its run on an H200",
    "python -m solutions.template_replicas --devices cuda:0,cuda:1": "needs two GPUs",
    "sbatch *": "needs a SLURM cluster; tests/test_launch.py submits submit.sh to the test cluster (pytest -m slurm)",
    "NPROC_PER_NODE=8 sbatch *": "needs a SLURM cluster with a CPU partition",
    "NPROC_PER_NODE=2 sbatch *": "needs the SLURM test cluster; tests/test_launch.py submits this job (pytest -m slurm)",
    "NPROC_PER_NODE=1 sbatch *": "needs the SLURM test cluster; tests/test_launch.py submits this job (pytest -m slurm)",
    "squeue *": "needs a SLURM cluster",
    "tail -f *": "follows a SLURM job's log",
    "scancel *": "needs a SLURM cluster",
    "export *": "sets variables for a multi-node NCCL or gloo job",
    "apt-get install *": "installs system packages as root (.ci/run does it in CI)",
    "tools/slurm_test_cluster.sh *": "starts SLURM daemons as root (.ci/run does it in CI)",
    "torchrun --standalone --nproc_per_node=4 benchmarks/allreduce_bench.py":
        "4 ranks on 2 cores for minutes: the 2-rank form runs here",
    "MIN_NODES=1 sbatch *": "needs a SLURM cluster",
    "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": "sets a variable for the elastic agents below",
    "torchrun --nnodes=1:2 *": "two agents that run until one is killed: tests/test_reshard.py runs them (pytest -m multinode)",
    "python tools/elastic_demo.py *": "minutes of two elastic agents and a reference run; tests/test_reshard.py runs "
                                      "smaller ones (pytest -m multinode)",
    "torchrun --standalone --nproc_per_node=4 train_ddp.py":
        "4 processes on the 2-core test machine: the 2-process form runs here",
    # run by other tests already; running them again here would cost the slow run a minute
    "torchrun --standalone --nproc_per_node=2 template_collectives.py":
        "tests/test_collectives.py runs the warm-up under torchrun, and every section on 1, 2 and 3 ranks",
    "torchrun --standalone --nproc_per_node=3 template_collectives.py": "as the 2-rank warm-up",
    "python template_collectives.py": "as the 2-rank warm-up",
    "torchrun --standalone --nproc_per_node=2 solutions/template_collectives.py": "as the 2-rank warm-up",
    "torchrun --standalone --nproc_per_node=2 train_ddp.py --allreduce ring":
        "tests/test_allreduce.py trains through train_ddp.py's --allreduce naive|ring path on 2 ranks",
    "torchrun --standalone --nproc_per_node=4 train_ddp.py --data synthetic --model vit *":
        "4 processes on the 2-core test machine: tests/test_sequence_parallel.py, test_context_parallel.py and "
        "test_train_experts.py train --tp 2 --sp, --cp 2 (ring and Ulysses) and --moe 4 --ep 2 on 4 ranks against "
        "data parallelism (pytest -m slow)",
    "torchrun --standalone --nproc_per_node=4 train_ddp.py --data synthetic *":
        "4 processes on the 2-core test machine; tests/test_train_model_parallel.py trains --tp 2 (ours and "
        "parallelize_module) and --pp 2 on 2 pipelines against one process",
    "torchrun --standalone --nproc_per_node=2 train_ddp.py --data synthetic --pp 2 *":
        "tests/test_train_model_parallel.py trains --pp 2 --microbatches 4 --schedule 1f1b against one process",
    "torchrun --standalone --nproc_per_node=2 train_ddp.py --data synthetic --impl ddp --pp 2 *":
        "tests/test_train_model_parallel.py trains it against one process",
    "python tools/transcripts.py *": "reruns the pages' transcripts (minutes): tests/test_transcripts.py does "
                                     "(pytest -m slow)",
    "torchrun --standalone --nproc_per_node=2 train_ddp.py --impl ddp":
        "tests/test_train_ddp.py trains with --impl ddp on 2 ranks, and docs/training.md's ddp run runs here",
    # issue 36: the other launchers (their flags are checked statically like the others')
    "mpirun *": "needs Open MPI (apt-get install -y openmpi-bin): tests/test_launchers.py runs it against torchrun "
                "(pytest -m mpi)",
    "mpirun.mpich *": "needs MPICH (apt-get install -y mpich): tests/test_launchers.py runs it (pytest -m mpi)",
    "srun python my_training_script.py": "the seed's recipe as it stands; submit_srun.sh is that recipe for "
                                         "train_ddp.py, which tests/test_launchers.py submits (pytest -m slurm)",
    "python ray_train.py *": "needs Ray (requirements-ray.txt) and most of a minute to start it: tests/test_launchers.py "
                             "runs ray_train.py on a two-node Ray cluster (pytest -m ray)",
    "ray start *": "starts a Ray node on a cluster's machine",
    "ray stop": "stops a Ray node",
    "torchrun --standalone --nproc_per_node=2 train_ddp.py --data synthetic --sync overlap --compress *":
        "tests/test_compression.py trains --sync overlap with --compress powersgd (and bf16, pytest -m slow)",
    "torchrun --standalone --nproc_per_node=2 train_ddp.py --data synthetic --impl ddp --compress *":
        "tests/test_compression.py trains --impl ddp --compress powersgd (pytest -m slow)",
    "torchrun --standalone --nproc_per_node=4 train_ddp.py --impl ddp --data synthetic --model vit *":
        "tests/test_train_experts.py trains it as the reference of --ep 2 (pytest -m slow)",
    "python benchmarks/experts_bench.py *": "minutes of 4 ranks on 2 cores; its figures are on docs/task16-experts.md",
}

# Small arguments added to the commands that are run, so that each takes seconds.
QUICK = {
    "train_ddp.py": ["--data", "synthetic", "--epochs", "1", "--train-samples", "1024", "--test-samples", "256"],
    "benchmarks/allreduce_bench.py": ["--max-size", "16KB", "--warmup", "1", "--repeats", "2"],
    "template_replicas.py": ["--steps", "2"],
    "benchmarks/compression_bench.py": ["--repeats", "1", "--steps", "4", "--rounds", "1", "--no-resnet"],
    # the page's --update-results is its whole benchmark (6 minutes on 2 cores): here the quick one's sizes
    "benchmarks/context_parallel_bench.py": ["--quick"],
    "benchmarks/sequence_parallel_bench.py": ["--ranks", "1,2", "--steps", "2"],
}

# Pages of Phase 2 that other pages may link to before they land. Empty it once they exist:
# a link to a page not listed here, or listed and still missing after it is emptied, fails.
PLANNED = set()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob(os.path.join(REPO, "docs", "*.md")))
FENCE = re.compile(r"^```([\w-]*)[ \t]*([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
LINK = re.compile(r"!?\[(?:[^\]]|\][^(])*?\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

pytestmark = pytest.mark.repo


def read(path):
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def prose(text):
    """The text without fenced blocks or inline code, where links do not count."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    for line in FENCE.sub("", read(path)).splitlines():  # a heading's inline code counts: slug keeps its text
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


@dataclass
class Command:
    page: str
    line: int
    tokens: list

    @property
    def text(self):
        return " ".join(self.tokens)

    @property
    def words(self):
        """The command without leading `VAR=value` assignments."""
        i = 0
        while i < len(self.tokens) and ENV.match(self.tokens[i]):
            i += 1
        return self.tokens[i:]

    def __str__(self):
        return f"{self.page}:{self.line}: {self.text}"


def blocks(page):
    """(language, info, body, first line) of every fenced block of a page."""
    text = read(page)
    for match in FENCE.finditer(text):
        yield match.group(1), match.group(2).strip(), match.group(3), text[:match.start()].count("\n") + 2


def block_commands(page, body, first):
    """The commands of a bash block, one per line and per `&&`, comments dropped."""
    for number, line in enumerate(body.replace("\\\n", " ").splitlines(), first):
        tokens = shlex.split(line, comments=True)
        while tokens:
            head, tokens = (tokens[:tokens.index("&&")], tokens[tokens.index("&&") + 1:]) if "&&" in tokens \
                else (tokens, [])
            yield Command(page, number, head)


def commands(page):
    for lang, _, body, first in blocks(page):
        if lang in ("sh", "shell", "console"):
            raise AssertionError(f"{page}:{first}: write shell commands in ```bash blocks")
        if lang == "bash":
            yield from block_commands(page, body, first)


ALL = [c for page in PAGES for c in commands(page)]


def matches(key, command):
    return command.text == key or key.endswith(" *") and (command.text + " ").startswith(key[:-1])


def not_run_reason(command):
    for key, reason in NOT_RUN.items():
        if matches(key, command):
            return reason
    return None


def script_of(command):
    """(script path or module, its arguments, is_module) for python and torchrun commands, else None."""
    words = command.words
    if words[0] == "python":
        if words[1] == "-m":
            return words[2], words[3:], True
        return words[1], words[2:], False
    if words[0] == "torchrun":
        i = 1
        while words[i].startswith("-"):
            i += 1
        return words[i], words[i + 1:], False
    if words[0] in ("mpirun", "mpirun.mpich") and "python" in words:  # mpirun [options] python script ...
        i = words.index("python")
        return words[i + 1], words[i + 2:], False
    return None


def runnable(command):
    return not_run_reason(command) is None and script_of(command) is not None


# ---------------------------------------------------------------------------- links


@pytest.mark.parametrize("page", PAGES)
def test_links_and_images_resolve(page):
    """Every relative link and image of the page points at a file that exists, anchors too."""
    broken = []
    for target in LINK.findall(prose(read(page))):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if resolved in PLANNED and not os.path.exists(os.path.join(REPO, resolved)):
            continue  # announced, not written yet
        if not os.path.exists(os.path.join(REPO, resolved)):
            broken.append(f"{target} ({resolved} does not exist)")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading in {resolved} has the anchor #{anchor})")
    assert not broken, f"{page}: broken links: {broken}"


def test_every_page_is_linked_from_the_readme_or_another_page():
    linked = set()
    for page in PAGES:
        for target in LINK.findall(prose(read(page))):
            path = target.partition("#")[0]
            if path:
                linked.add(os.path.normpath(os.path.join(os.path.dirname(page), path)))
    orphans = [p for p in PAGES[1:] if p not in linked]
    assert not orphans, f"no page links to {orphans}: add them to README.md"


@pytest.mark.parametrize("page", PAGES[1:])
def test_page_says_what_it_teaches_and_ends_with_its_check_and_what_comes_next(page):
    text = read(page).strip()
    paragraphs = text.split("\n\n")
    assert paragraphs[0].startswith("# ") and paragraphs[1].startswith("After this page you can"), (
        f"{page}: start with the title, then 'After this page you can ...'")
    assert re.search(r"^## Check\n\n```bash\n", text, re.M), f"{page}: end with '## Check' and its command in a bash block"
    assert re.match(r"Next: .*\]\([^)]+\)", text.splitlines()[-1]), f"{page}: the last line is 'Next: [page](link)'"


# ---------------------------------------------------------------------------- static checks of the commands


def markers():
    lines = read("pytest.ini").split("markers =", 1)[1].splitlines()
    return {m.group(1) for line in lines for m in [re.match(r"^\s+(\w+):", line)] if m}


def task_groups_of_markers():
    return {m.group(1) for m in map(re.compile(r"^task(\d+)_\d+$").match, markers()) if m}


class _Parsed(Exception):
    pass


def parse_like_the_script(path, argv, is_module):
    """Run the script as __main__ until its argparse has parsed argv, then stop: the flags are
    checked by the script's own parser, whether it is in parse_args() or in main()."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        original(self, argv, namespace)
        raise _Parsed

    # and what the script's top sets for itself (train_ddp.py: OMP_NUM_THREADS) must not reach the tests after
    saved_argv, saved_path, saved_environ = sys.argv, list(sys.path), dict(os.environ)
    sys.argv = [path] + list(argv)
    argparse.ArgumentParser.parse_args = parse_args
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if is_module:
                runpy.run_module(path, run_name="__main__", alter_sys=False)
            else:
                sys.path.insert(0, os.path.dirname(os.path.join(REPO, path)))
                runpy.run_path(os.path.join(REPO, path), run_name="__main__")
    except _Parsed:
        return None
    except SystemExit as exit:
        return None if exit.code in (0, None) else f"its argparse says: {err.getvalue().strip()[-400:]}"
    finally:
        argparse.ArgumentParser.parse_args = original
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.environ.clear()
        os.environ.update(saved_environ)
    return "it never parsed its arguments with argparse"


def check_task_ids(ids):
    groups, known = task_groups_of_markers(), markers()
    for task in ids:
        if re.fullmatch(r"\d+", task):
            assert task in groups, f"no task{task}_* marker in pytest.ini"
        else:
            marker = task if task.startswith("task") else "task" + task.replace(".", "_")
            assert marker in known, f"no marker {marker} in pytest.ini"


def static_check(command):
    words = command.words
    script = script_of(command)
    if script:
        path, argv, is_module = script
        if is_module:
            assert os.path.exists(os.path.join(REPO, path.replace(".", "/") + ".py")), f"no module {path}"
        else:
            assert os.path.isfile(os.path.join(REPO, path)), f"no file {path}"
        file = path.replace(".", "/") + ".py" if is_module else path
        if "argparse" in read(file):
            problem = parse_like_the_script(path, argv, is_module)
            assert problem is None, problem
        else:
            assert not argv, f"{file} takes no arguments (it has no argparse)"
        if path == "check.py":
            check_task_ids([a for a in argv if not a.startswith("-")])
    elif words[0] == "pytest":
        for i, word in enumerate(words):
            if word == "-m":
                names = set(re.findall(r"[A-Za-z_]\w*", words[i + 1])) - {"and", "or", "not"}
                assert names <= markers(), f"markers not in pytest.ini: {names - markers()}"
            if word == "--impl":
                assert words[i + 1] in ("solutions", "template"), words[i + 1]
            if word.endswith(".py"):
                assert os.path.isfile(os.path.join(REPO, word)), f"no file {word}"
    elif words[0] == "sbatch":
        i = next(i for i, w in enumerate(words) if w.endswith(".sh"))
        assert os.path.isfile(os.path.join(REPO, words[i])), f"no file {words[i]}"
        problem = parse_like_the_script("train_ddp.py", words[i + 1:], False)  # submit.sh passes them on
        assert problem is None, problem
    elif words[0].startswith("tools/"):
        assert os.access(os.path.join(REPO, words[0]), os.X_OK), f"{words[0]} is missing or not executable"
        assert re.search(rf"^\s+{words[1]}\)", read(words[0]), re.M), f"{words[0]} has no '{words[1]}' command"
    elif words[:3] == ["pip", "install", "-r"]:
        assert os.path.isfile(os.path.join(REPO, words[3])), f"no file {words[3]}"


@pytest.mark.parametrize("command", ALL, ids=str)
def test_command_is_run_or_listed_and_its_flags_exist(command):
    assert runnable(command) or not_run_reason(command), (
        f"{command}: the slow test cannot run it; run it from a test, or add it to NOT_RUN in "
        "tests/test_docs.py with the reason")
    static_check(command)


def test_not_run_and_quick_have_no_stale_entries():
    unused = [key for key in NOT_RUN if not any(matches(key, c) for c in ALL)]
    assert not unused, f"NOT_RUN entries that match no command in the docs: {unused}"
    scripts = {script_of(c)[0] for c in ALL if script_of(c)}
    assert set(QUICK) <= scripts, f"QUICK entries for scripts no command runs: {set(QUICK) - scripts}"


def test_python_blocks_say_whether_they_run():
    """```python run blocks run in the slow test; other python blocks are excerpts and must say
    nothing else after the language, so that a typo in `run` cannot skip one silently."""
    for page in PAGES:
        for lang, info, _, first in blocks(page):
            if lang == "python":
                assert info in ("", "run"), f"{page}:{first}: ```python {info}: write ```python run or ```python"


# ---------------------------------------------------------------------------- the course table


def course_table():
    """{task group: row cells} from the README's course path table, and the other rows."""
    lines = read("README.md").splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^\|\s*Part\s*\|\s*What you build", line))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def fence_groups():
    """{task group: the template files whose fences hold its tasks}."""
    groups = {}
    for path in glob(os.path.join(REPO, "template_*.py")):
        with open(path) as f:
            for task in re.findall(r"^\s*# --- Task (\d+)\.\d+ begin ---", f.read(), re.M):
                groups.setdefault(task, set()).add(os.path.basename(path))
    return groups


def test_readme_table_agrees_with_markers_and_fences():
    rows = course_table()
    table = {m.group(1): cells for part, cells in rows.items() for m in [re.fullmatch(r"Task (\d+)", part)] if m}
    fences = fence_groups()
    assert set(table) == task_groups_of_markers(), (
        f"README.md's course table has Tasks {sorted(table, key=int)}, pytest.ini's markers "
        f"Tasks {sorted(task_groups_of_markers(), key=int)}: add or remove a row")
    assert set(table) == set(fences), (
        f"README.md's course table has Tasks {sorted(table, key=int)}, the template fences "
        f"Tasks {sorted(fences, key=int)}")
    for task, (part, _, file, page, check) in table.items():
        assert set(re.findall(r"`([^`]+)`", file)) == fences[task], f"{part}: File is {file}, fences in {fences[task]}"
        assert re.search(rf"\(docs/task{task}-[\w-]+\.md\)", page), f"{part}: Page {page} is not docs/task{task}-*.md"
        assert check == f"`python check.py {task}`", f"{part}: Check is {check}"
    assert "Training" in rows, "README.md's course table lost its Training row"


# ---------------------------------------------------------------------------- running the commands


@pytest.fixture(scope="module")
def course_copy(tmp_path_factory):
    """The files git knows (no venv, no data, no runs) in a temporary folder, with the reference
    answers in place of the template_*.py files, so that the commands a student runs on a
    finished template run here on a fresh clone."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    dest = tmp_path_factory.mktemp("course")
    for name in filter(None, listed.stdout.split("\0")):
        if os.path.isfile(os.path.join(REPO, name)):
            os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
            shutil.copy2(os.path.join(REPO, name), os.path.join(dest, name))
    for path in glob(os.path.join(dest, "solutions", "template_*.py")):
        shutil.copy2(path, os.path.join(dest, os.path.basename(path)))
    return str(dest)


def argv_of(command):
    """The command as it runs here: this Python, torchrun as a module, QUICK's arguments added."""
    path, args, _ = script_of(command)
    words = command.words
    head = [sys.executable, "-m", "torch.distributed.run"] if words[0] == "torchrun" else [sys.executable]
    return head + words[1:] + QUICK.get(path, [])


def run_in(cwd, argv, env, what, timeout=120):
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"{what} did not finish within {timeout} s; its output:\n{out[-3000:]}")
    assert proc.returncode == 0, f"{what} exited with {proc.returncode}:\n{out[-3000:]}"


ALREADY_RUN = set()  # over all pages: a command shown on several pages runs once


def same_run(argv):
    """What makes two runs differ: for train_ddp.py its parsed arguments (the last of a repeated
    flag wins, and --impl template is the reference answers in the copy), else the words."""
    if "train_ddp.py" not in argv or "--help" in argv or "-h" in argv:
        return tuple(argv)
    i = argv.index("train_ddp.py")
    import train_ddp
    args = vars(train_ddp.parse_args(argv[i + 1:]))
    args["impl"] = "solutions" if args["impl"] == "template" else args["impl"]
    return tuple(argv[:i]) + tuple(sorted(args.items()))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", PAGES)
def test_runnable_commands_and_python_blocks_run(page, course_copy):
    """In document order, so a python block can read what a command above it wrote."""
    for lang, info, body, first in blocks(page):
        if lang == "python" and info == "run":
            script = os.path.join(course_copy, "docs_block.py")
            with open(script, "w") as f:
                f.write(body)
            run_in(course_copy, [sys.executable, script], {}, f"{page}:{first}: the python block")
        elif lang == "bash":
            for command in block_commands(page, body, first):
                argv = argv_of(command) if runnable(command) else None
                if argv and same_run(argv) not in ALREADY_RUN:
                    ALREADY_RUN.add(same_run(argv))
                    env = dict(token.split("=", 1) for token in command.tokens[:len(command.tokens) - len(command.words)])
                    run_in(course_copy, argv, env, f"{command} (run as {' '.join(argv[1:])})")
