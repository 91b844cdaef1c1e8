"""What check.py prints for a failing task: the test's hint, whole, wrapped; long values shortened.

    pytest tests/test_check_hints.py
"""
import pytest

from check import print_result
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
