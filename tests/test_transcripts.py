"""Every transcript on a page is what its command prints now (tools/transcripts.py).

    pytest tests/test_transcripts.py            # markers, their commands, the masks (seconds)
    pytest -m slow tests/test_transcripts.py    # reruns every transcript and compares (minutes)
"""
import os
import re
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tools import transcripts  # noqa: E402

pytestmark = pytest.mark.repo

PAGES = ["README.md"] + sorted(os.path.join("docs", p) for p in os.listdir(os.path.join(REPO, "docs"))
                               if p.endswith(".md"))
BLOCKS = [(page, options, command, shown) for page in PAGES for options, command, shown, _ in transcripts.blocks(page)]
# What a training run or check.py prints: a block showing it is a transcript, and needs a marker.
TRAINING_OUTPUT = re.compile(r"^(\d+: )?(epoch \d+/\d+  train loss|ranks consistent|impl=\w+ allreduce=|"
                             r"Checking your template_)", re.M)
# Transcripts that no test produces, with the reason (the page says it too).
UNMARKED = {
    ("docs/task8-checkpoints.md", "submit.sh: job 33 on 1 node(s)"):
        "a SLURM job stopped by USR1 and requeued: the requeued job waits minutes in SLURM's queue, and the "
        "step at which USR1 stops it depends on when the signal arrives; tests/test_launch.py stops and "
        "resubmits a job and checks its log's lines",
    ("docs/instructors.md", "Checking your template_*.py files: Task 1.1, 1.4"):
        "check.py in a student release (tools/student_release.py), whose tests use the student's own answers; "
        "tests/test_student_release.py builds one and runs check.py in it",
}


def unmarked_training_output(page):
    with open(os.path.join(REPO, page)) as f:
        text = f.read()
    marked = {match.start(3) for _, _, _, match in transcripts.blocks(page)}
    fence = re.compile(r"^```[\w-]*[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
    for match in fence.finditer(text):
        if match.start(1) not in marked and TRAINING_OUTPUT.search(match.group(1)):
            yield match.group(1).split("\n", 1)[0]


def test_every_training_transcript_has_a_marker_or_a_reason():
    found = {(page, first) for page in PAGES for first in unmarked_training_output(page)}
    listed = {(page, first) for page, first in found for key in UNMARKED if key[0] == page and first.startswith(key[1])}
    assert found == listed, (
        f"blocks showing a training run's output without a `<!-- transcript: COMMAND -->` marker above them: "
        f"{sorted(found - listed)}; add the marker and run python tools/transcripts.py --update PAGE "
        "(docs/maintainers.md), or list it in UNMARKED with the reason")
    stale = [key for key in UNMARKED if not any(page == key[0] and first.startswith(key[1]) for page, first in found)]
    assert not stale, f"UNMARKED entries that match no block: {stale}"


def test_every_marker_is_read():
    """A marker the tool cannot read (a typo, no ```text block right below) would leave its block unchecked."""
    for page in PAGES:
        with open(os.path.join(REPO, page)) as f:
            text = re.sub(r"^```[^\n]*\n.*?^```[ \t]*$", "", f.read(), flags=re.M | re.S)  # examples in blocks
        lines = [line for line in text.splitlines() if line.startswith("<!-- transcript")]
        assert len(lines) == len(list(transcripts.blocks(page))), (
            f"{page}: {len(lines)} lines start a transcript marker, {len(list(transcripts.blocks(page)))} are read: write "
            "<!-- transcript OPTIONS: COMMAND --> right above a ```text block (tools/transcripts.py)")


@pytest.mark.parametrize("page, options, command, shown", BLOCKS, ids=[f"{b[0]}:{b[2][:60]}" for b in BLOCKS])
def test_the_block_shows_its_command_and_the_command_parses(page, options, command, shown):
    assert shown.startswith(transcripts.shown_command(command)), (
        f"{page}: the transcript must start with its marker's command as tools/transcripts.py writes it:\n"
        f"{transcripts.shown_command(command)}")
    words = transcripts.shlex.split(command)
    script = next(w for w in words if w.endswith(".py"))
    if script == "train_ddp.py":
        import train_ddp
        args = train_ddp.parse_args(words[words.index(script) + 1:])
        assert "kill-rank-1-at-step" not in options or (args.checkpoint_dir and "--max-restarts=1" in words), (
            f"{page}: a kill needs --checkpoint-dir and torchrun's --max-restarts=1")


def test_masks_hide_the_machine_and_keep_the_results():
    line = ("epoch 2/3  train loss 0.5499  test loss 0.2785  test accuracy 90.23% (231/256)  1,356 images/s  "
            "sync 45% of step time  (1.3 s)")
    masked = transcripts.mask(line)
    assert masked == ("epoch 2/3  train loss 0.5499  test loss 0.2785  test accuracy 90.23% (231/256)  N images/s  "
                      "sync N% of step time  (N s)\n"), masked
    log = ("E1125 12:48:04.280000 31727 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] "
           "failed (exitcode: -9) local_rank: 1 (pid: 31857) of binary: /root/.pyenv/versions/3.11.7/bin/python")
    assert transcripts.mask(log) == transcripts.mask(log.replace("31727", "5").replace("31857", "6")
                                                     .replace("12:48:04.280000", "01:02:03.000004")
                                                     .replace("/root/.pyenv/versions/3.11.7", "/usr"))
    assert transcripts.difference(line, line.replace("0.5499", "0.5498")), "a changed loss must differ"
    assert transcripts.difference(line, line.replace("(231/256)", "(230/256)")), "a changed count must differ"


def test_figures_of_another_cpu_are_not_compared_and_the_rest_is():
    line = "epoch 1/5  train loss 2.0316  test loss 0.6051  test accuracy 86.95% (1739/2000)  3,674 images/s\n"
    moved = line.replace("2.0316", "2.0318").replace("86.95%", "86.40%").replace("(1739/2000)", "(1728/2000)")
    other = {"cpu": "other-kind"}
    assert transcripts.difference(line, moved, other) == "", "another CPU's kernels round otherwise"
    assert transcripts.difference(line, moved.replace("test loss", "test error"), other), "words still count"
    assert transcripts.difference(line, moved.replace("epoch 1/5", "epoch 2/5"), other), "so do integers"
    assert transcripts.difference(line, moved, {"cpu": transcripts.cpu_kind()}), "this CPU's figures must match"
    assert transcripts.difference(line, moved), "a block without the option is compared whole"


def test_update_writes_this_cpu_into_the_marker():
    page = "<!-- transcript kill-rank-1-at-step 50 cpu other-kind: python x.py -->\n```text\n$ python x.py\nold\n```\n"
    match = transcripts.MARKER.search(page)
    rewritten = transcripts.with_this_cpu(page, match)
    assert rewritten == page.replace("other-kind", transcripts.cpu_kind()), rewritten
    assert re.fullmatch(r"[a-z0-9_]+(-[a-z0-9_]+)+", transcripts.cpu_kind()), "one word, as a marker option is"


@pytest.mark.slow
@pytest.mark.timeout(2 * transcripts.TIMEOUT + 60)
@pytest.mark.parametrize("page, options, command, shown", BLOCKS, ids=[f"{b[0]}:{b[2][:60]}" for b in BLOCKS])
def test_transcript_is_what_the_command_prints_now(page, options, command, shown):
    fresh = transcripts.produce(command, options)
    problem = transcripts.difference(shown, fresh, options)
    assert not problem, (f"{page}: the transcript of `{command}` is stale; if the change is intended, run "
                         f"python tools/transcripts.py --update {page}\n{problem}")
