"""Typical wrong answers, written as edits of the reference solutions.

Each Mistake turns one solution into a plausible student answer that is wrong. The task's
tests must fail on it, with a message that contains `hint` (tests/test_mistakes.py checks
both), and the grader's tests use the same submissions. Add one whenever a student finds a
wrong answer that the tests let through.
"""
import dataclasses
import os
import shutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Mistake:
    task: str  # "2.2"
    name: str  # short, for test ids
    file: str  # the template file, as named in solutions/
    old: str  # text in the solution (must occur exactly once)
    new: str  # what the student wrote instead
    hint: str  # a phrase the failing test's message must contain

    @property
    def marker(self):
        return "task" + self.task.replace(".", "_")

    def apply(self, text):
        assert text.count(self.old) == 1, f"mistake {self.name}: {self.old!r} must occur once in {self.file}"
        return text.replace(self.old, self.new)


MISTAKES = [
    # Task 0.1
    Mistake("0.1", "mean-not-sum", "template_collectives.py",
            "    return sum(rank_tensor(rank) for rank in range(world_size))",
            "    return sum(rank_tensor(rank) for rank in range(world_size)) / world_size", "does not average"),
    Mistake("0.1", "ranks-from-1", "template_collectives.py",
            "rank_tensor(rank) for rank in range(world_size))",
            "rank_tensor(rank) for rank in range(1, world_size + 1))", "count from 0"),
    # Task 0.2
    Mistake("0.2", "aliased-outputs", "template_collectives.py",
            "    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]",
            "    gathered = [torch.empty_like(tensor)] * dist.get_world_size()", "one tensor per rank"),
    Mistake("0.2", "gather-to-rank-0", "template_collectives.py",
            "    dist.all_gather(gathered, tensor)",
            "    dist.gather(tensor, gathered if dist.get_rank() == 0 else None, dst=0)", "every rank"),
    Mistake("0.2", "cat-not-stack", "template_collectives.py",
            "    return torch.stack(gathered)", "    return torch.cat(gathered)", "torch.stack"),
    # Task 0.3
    Mistake("0.3", "wait-before-compute", "template_collectives.py",
            "    result = compute()  # tensor must not be used here: until wait() it may hold anything\n"
            "    handle.wait()\n",
            "    handle.wait()\n    result = compute()\n", "nothing could overlap"),
    Mistake("0.3", "blocking-all-reduce", "template_collectives.py",
            "    handle = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)\n"
            "    result = compute()  # tensor must not be used here: until wait() it may hold anything\n"
            "    handle.wait()\n",
            "    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)\n    result = compute()\n", "nothing could overlap"),
    Mistake("0.3", "async-op-false", "template_collectives.py",
            "SUM, async_op=True)", "SUM, async_op=False)", "nothing could overlap"),
    Mistake("0.3", "no-wait", "template_collectives.py",
            "    handle.wait()\n    return result", "    return result", "call handle.wait() before returning"),
    # Task 1.1
    Mistake("1.1", "epoch-not-in-seed", "template_data_loader.py",
            "g.manual_seed(seed + epoch)", "g.manual_seed(seed)", "epoch"),
    Mistake("1.1", "seeded-by-rank", "template_data_loader.py",
            "g.manual_seed(seed + epoch)", "g.manual_seed(seed + epoch + dist.get_rank() if dist.is_initialized() else seed + epoch)",
            "same"),
    Mistake("1.1", "python-random-shuffle", "template_data_loader.py",
            "return torch.randperm(dataset_len, generator=g).tolist()",
            "import random; order = list(range(dataset_len)); random.Random(seed + epoch).shuffle(order); return order",
            "randperm"),
    # Task 1.2
    Mistake("1.2", "no-padding", "template_data_loader.py",
            "    padding = -len(indices) % num_replicas\n", "    padding = 0\n", "multiple"),
    Mistake("1.2", "pad-once-only", "template_data_loader.py",
            "    return indices + (indices * repeats)[:padding]", "    return indices + indices[:padding]", "wrap"),
    # Task 1.3
    Mistake("1.3", "same-shard-everywhere", "template_data_loader.py",
            "    start = rank * base + min(rank, extra)", "    start = 0", "rank"),
    Mistake("1.3", "strided-shard", "template_data_loader.py",
            "    return indices[start:end]", "    return indices[rank::num_replicas]", "contiguous"),
    # Task 1.4
    Mistake("1.4", "global-batch-per-rank", "template_data_loader.py",
            "    batch_size = global_batch_size // world_size", "    batch_size = global_batch_size", "global batch"),
    Mistake("1.4", "padded-test-sampler", "template_data_loader.py",
            "test_sampler = DistributedSampler(test_set, world_size, rank, shuffle=False, pad=False)",
            "test_sampler = DistributedSampler(test_set, world_size, rank, shuffle=False)", "twice"),
    # Task 2.1
    Mistake("2.1", "no-broadcast", "template_trainer.py",
            "            dist.broadcast(tensor, src=src)", "            pass", "broadcast"),
    Mistake("2.1", "parameters-only", "template_trainer.py",
            "list(model.parameters()) + list(model.buffers())", "model.parameters()", "buffer"),
    # Task 2.2
    Mistake("2.2", "sum-without-divide", "template_trainer.py",
            "        param.grad /= world_size\n", "", "divide"),
    Mistake("2.2", "average-on-rank-0-only", "template_trainer.py",
            "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)",
            "        dist.reduce(param.grad, dst=0, op=dist.ReduceOp.SUM)", "every rank"),
    # Task 2.3
    Mistake("2.3", "reduce-to-rank-0", "template_trainer.py",
            "    dist.all_reduce(sums, op=dist.ReduceOp.SUM)", "    dist.reduce(sums, dst=0, op=dist.ReduceOp.SUM)",
            "every rank"),
    Mistake("2.3", "averaged-counts", "template_trainer.py",
            "    correct, total, loss_sum = sums.tolist()",
            "    correct, total, loss_sum = (sums / dist.get_world_size()).tolist()", "sum"),
    Mistake("2.3", "rank-0-skips", "template_trainer.py",
            "    dist.all_reduce(sums, op=dist.ReduceOp.SUM)",
            "    if dist.get_rank() != 0: dist.all_reduce(sums, op=dist.ReduceOp.SUM)", "hang"),
]


def make_submission(dest, mistakes=()):
    """A copy of the repository whose template_*.py files are the solutions with `mistakes` applied.

    The tests in the copy are this repository's, so `pytest --impl template` there checks
    the wrong answers."""
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", "data", "runs"))
    for name in os.listdir(os.path.join(REPO, "solutions")):
        if name.startswith("template_") and name.endswith(".py"):
            with open(os.path.join(REPO, "solutions", name)) as f:
                text = f.read()
            for mistake in mistakes:
                if mistake.file == name:
                    text = mistake.apply(text)
            with open(os.path.join(dest, name), "w") as f:
                f.write(text)
    return dest
