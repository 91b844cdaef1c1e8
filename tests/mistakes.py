"""Typical wrong answers, written as edits of the reference solutions.

Each Mistake turns one solution into a plausible student answer that is wrong. The task's
tests must fail on it, with a message that contains `hint` (tests/test_mistakes.py checks
both), and the grader's tests use the same submissions. Add one whenever a student finds a
wrong answer that the tests let through.
"""
import dataclasses
import os
import shutil

from grading.course import copy_course

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
            "g.manual_seed(seed + epoch)", "g.manual_seed(seed)", "left out of the seed"),
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
    # Task 3.1
    Mistake("3.1", "naive-no-send-back", "template_allreduce.py",
            """    # the way back: rank 0 sends the whole sum once to every other rank
    if rank == 0:
        for dst in range(1, world_size):
            dist.send(tensor, dst=dst)
    else:
        dist.recv(tensor, src=0)
""", "", "every rank"),
    Mistake("3.1", "naive-mean", "template_allreduce.py",
            "        tensor.copy_(total)", "        tensor.copy_(total / world_size)", "mean"),
    Mistake("3.1", "naive-forgets-own-tensor", "template_allreduce.py",
            'total = tensor.to("cpu", copy=True)', 'total = torch.zeros_like(tensor, device="cpu")', "own tensor"),
    # Task 3.2
    Mistake("3.2", "reduce-scatter-only", "template_allreduce.py",
            "    for step in range(world_size - 1):  # all-gather", "    for step in range(0):  # all-gather",
            "all-gather"),
    Mistake("3.2", "chunk-off-by-one", "template_allreduce.py",
            "send_index, recv_index = (rank + 1 - step) % world_size, (rank - step) % world_size",
            "send_index, recv_index = (rank - step) % world_size, (rank - step - 1) % world_size", "chunk"),
    Mistake("3.2", "forgets-remainder", "template_allreduce.py",
            "    chunks = tensor.view(-1).tensor_split(world_size)",
            "    size = tensor.numel() // world_size\n"
            "    chunks = [tensor.view(-1)[i * size:(i + 1) * size] for i in range(world_size)]", "remainder"),
    Mistake("3.2", "whole-buffer-ring", "template_allreduce.py",  # right sums, (N-1) tensors sent
            """    for step in range(world_size - 1):  # reduce-scatter
        send_index, recv_index = (rank - step) % world_size, (rank - step - 1) % world_size
        incoming = received[: chunks[recv_index].numel()]
        exchange(chunks[send_index], incoming, right, left)
        chunks[recv_index].add_(incoming)
    for step in range(world_size - 1):  # all-gather: receive straight into the chunk
        send_index, recv_index = (rank + 1 - step) % world_size, (rank - step) % world_size
        exchange(chunks[send_index], chunks[recv_index], right, left)
""", """    passing, incoming = tensor.clone(), torch.empty_like(tensor)
    for step in range(world_size - 1):
        exchange(passing, incoming, right, left)
        tensor += incoming
        passing, incoming = incoming, passing
""", "whole tensor"),
    Mistake("3.2", "blocking-send-first", "template_allreduce.py",
            "        exchange(chunks[send_index], incoming, right, left)",
            "        dist.send(chunks[send_index], right)\n        dist.recv(incoming, left)", "blocking"),
    Mistake("3.2", "calls-dist-all-reduce", "template_allreduce.py",
            "    for step in range(world_size - 1):  # reduce-scatter",
            "    dist.all_reduce(tensor)\n    return\n    for step in range(world_size - 1):  # reduce-scatter",
            "collective"),
    # Task 0-3, trial 9 (2026-11-29): a prediction that communicates, outputs and buffers in the default dtype, a sum
    # never made in place, compute before the launch, Works never waited for, padding, slicing and chunking edges, the loaders' settings, frozen, unused
    # and tied parameters, counts past 2**24, float64 through float32, an empty receive from any source
    Mistake("0.1", "prediction-communicates", "template_collectives.py",
            "    return sum(rank_tensor(rank) for rank in range(world_size))",
            "    tensor = rank_tensor(dist.get_rank())\n    dist.all_reduce(tensor)\n    return tensor",
            "worked out without any communication"),
    Mistake("0.2", "outputs-default-dtype", "template_collectives.py",
            "    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]",
            "    gathered = [torch.empty(tensor.shape) for _ in range(dist.get_world_size())]",
            "must have the input's dtype"),
    Mistake("0.3", "reduces-a-copy", "template_collectives.py",
            "    handle = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)",
            "    handle = dist.all_reduce(tensor.clone(), op=dist.ReduceOp.SUM, async_op=True)",
            "the sum never came into the tensor you were given"),
    Mistake("1.2", "minus-zero-slice", "template_data_loader.py",
            "        return indices[: len(indices) - len(indices) % num_replicas]",
            "        return indices[: -(len(indices) % num_replicas)]",
            "indices[:-0]"),
    Mistake("1.2", "pads-a-whole-round", "template_data_loader.py",
            "    padding = -len(indices) % num_replicas\n",
            "    padding = num_replicas - len(indices) % num_replicas\n",
            "a whole round"),
    Mistake("1.3", "ceil-blocks", "template_data_loader.py",
            "    base, extra = divmod(len(indices), num_replicas)\n    start = rank * base + min(rank, extra)\n    end = start + base + (1 if rank < extra else 0)\n",
            "    size = math.ceil(len(indices) / num_replicas)\n    start, end = rank * size, (rank + 1) * size\n",
            "ceil(n / N)"),
    Mistake("1.4", "test-batch-global", "template_data_loader.py",
            "    test_loader = DataLoader(test_set, batch_size=batch_size,",
            "    test_loader = DataLoader(test_set, batch_size=global_batch_size,",
            "same per-rank batch size"),
    Mistake("1.4", "workers-ignored", "template_data_loader.py",
            "drop_last=True,\n                              num_workers=num_workers,",
            "drop_last=True,\n                              num_workers=0,",
            "pass the argument num_workers"),
    Mistake("1.4", "pin-always", "template_data_loader.py",
            "    pin_memory = torch.device(device).type == \"cuda\"",
            "    pin_memory = True",
            "pin_memory only when the device is a GPU"),
    Mistake("1.4", "loader-no-drop-last", "template_data_loader.py",
            "sampler=train_sampler, drop_last=True,",
            "sampler=train_sampler,",
            "drop_last=True in the DataLoader too"),
    Mistake("2.1", "trainable-only", "template_trainer.py",
            "        for tensor in list(model.parameters()) + list(model.buffers()):\n",
            "        for tensor in [p for p in model.parameters() if p.requires_grad] + list(model.buffers()):\n",
            "trainable or not"),
    Mistake("2.1", "async-not-waited", "template_trainer.py",
            "            dist.broadcast(tensor, src=src)",
            "            dist.broadcast(tensor, src=src, async_op=True)",
            "must be waited for"),
    Mistake("2.1", "broadcast-on-src-only", "template_trainer.py",
            "            dist.broadcast(tensor, src=src)",
            "            if dist.get_rank() == src:\n                dist.broadcast(tensor, src=src)",
            "that another rank never calls"),
    Mistake("2.2", "skips-by-requires-grad", "template_trainer.py",
            "        if param.grad is None:\n            continue\n",
            "        if not param.requires_grad:\n            continue\n",
            "whose .grad is None"),
    Mistake("2.2", "flat-float32", "template_trainer.py",
            "    for param in model.parameters():\n        if param.grad is None:\n            continue\n        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n        param.grad /= world_size\n",
            "    grads = [p.grad for p in model.parameters() if p.grad is not None]\n    flat = torch.zeros(sum(g.numel() for g in grads))  # one buffer, one all_reduce\n    flat.copy_(torch.cat([g.reshape(-1) for g in grads]))\n    dist.all_reduce(flat)\n    flat /= world_size\n    offset = 0\n    for g in grads:\n        g.copy_(flat[offset:offset + g.numel()].view_as(g))\n        offset += g.numel()\n",
            "rounded to float32"),
    Mistake("2.2", "tied-reduced-twice", "template_trainer.py",
            "    for param in model.parameters():\n        if param.grad is None:",
            "    for param in (p for module in model.modules() for p in module.parameters(recurse=False)):\n        if param.grad is None:",
            "tied weight"),
    Mistake("2.3", "float32-sums", "template_trainer.py",
            "dtype=torch.float64, device=device)",
            "device=device)",
            "rounded to float32"),
    Mistake("2.3", "loss-as-tensor", "template_trainer.py",
            "    correct, total, loss_sum = sums.tolist()\n    return int(correct), int(total), loss_sum",
            "    correct, total, loss_sum = sums\n    return int(correct), int(total), loss_sum",
            "as a Python float"),
    # Task 2, trial 12 (2026-11-30): what goes on the wire (an integer buffer skipped, a copy broadcast, the weights
    # reduced, a .float() copy reduced), dtypes (a loss sum through int64). Each passed, or was a bare difference
    # or another cause
    Mistake("2.1", "float-buffers-only", "template_trainer.py",  # passed: num_batches_tracked was 0 on every rank
            '            dist.broadcast(tensor, src=src)',
            '            if tensor.is_floating_point():  # counters need no syncing\n                dist.broadcast(tensor, src=src)',
            'integer ones too'),
    Mistake("2.1", "broadcast-a-copy", "template_trainer.py",  # passed: .float() of a float32 tensor is itself
            '            dist.broadcast(tensor, src=src)',
            '            dist.broadcast(tensor.float(), src=src)',
            'broadcast a copy of it'),
    Mistake("2.2", "reduces-the-weights", "template_trainer.py",  # was a bare 'should be the average'
            '        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)',
            '        dist.all_reduce(param.data, op=dist.ReduceOp.SUM)',
            'the WEIGHTS'),
    Mistake("2.2", "reduces-a-float32-copy", "template_trainer.py",  # was a bare 'should be the average'
            '        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)',
            '        dist.all_reduce(param.grad.float(), op=dist.ReduceOp.SUM)',
            'a copy of it'),
    Mistake("2.3", "loss-truncated", "template_trainer.py",  # was 'never average the counts'
            'dtype=torch.float64, device=device)',
            'dtype=torch.int64, device=device)',
            'fractions cut off'),
    Mistake("2.2", "floor-divided", "template_trainer.py",  # was told as float32 rounding
            '        param.grad /= world_size\n',
            '        param.grad //= world_size\n',
            'rounded down to a whole number'),
    Mistake("2.2", "async-never-waited", "template_trainer.py",  # was a bare difference
            '        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n',
            "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, async_op=True)  # overlap the parameters' reductions\n",
            'without waiting for their Work'),
    Mistake("3.1", "float32-total", "template_allreduce.py",
            "total = tensor.to(\"cpu\", copy=True)",
            "total = torch.zeros(tensor.shape); total += tensor.cpu()",
            "float32's precision"),
    Mistake("3.1", "isend-not-waited", "template_allreduce.py",
            "            dist.send(tensor, dst=dst)",
            "            dist.isend(tensor, dst=dst)",
            "never waited for"),
    Mistake("3.1", "recv-any-source-empty", "template_allreduce.py",
            "            dist.recv(received, src=src)",
            "            dist.recv(received)",
            "from any source"),
    Mistake("3.2", "buffer-default-dtype", "template_allreduce.py",
            "        buffers[key] = torch.empty_like(chunks[0])",
            "        buffers[key] = torch.empty(chunks[0].numel())",
            "buffer on the wire"),
    Mistake("0.3", "compute-before-launch", "template_collectives.py",
            "    handle = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)\n"
            "    result = compute()  # tensor must not be used here: until wait() it may hold anything\n",
            "    result = compute()\n"
            "    handle = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)\n",
            "called compute() before it started the all_reduce"),
    Mistake("3.2", "torch-chunk", "template_allreduce.py",
            "    chunks = tensor.view(-1).tensor_split(world_size)",
            "    chunks = tensor.view(-1).chunk(world_size)",
            "tensor_split(world_size) always makes world_size chunks"),
    # Tasks 1 and 3, trial 12 (2026-11-30): indices that are not ints, a generator kept between calls, a list
    # returned as itself, pin_memory from the machine or a string, the test loader shuffled or dropping, seeds by
    # rank, the sampler given the per-rank batch, the global RNG seeded, memory replaced instead of written, int64
    # through a float, one receive buffer reused, a cached buffer never grown or sliced to the sent chunk, an
    # exchange skipped for an empty chunk, messages to itself or to a rank past the last, a step too many, a
    # buffer cache without the dtype in its key
    Mistake("1.1", "list-of-0-dim-tensors", "template_data_loader.py",
            "return torch.randperm(dataset_len, generator=g).tolist()",
            "return list(torch.randperm(dataset_len, generator=g))",
            "list(tensor) gives 0-dim tensors"),
    Mistake("1.1", "generator-kept-between-calls", "template_data_loader.py",
            "    g = torch.Generator()\n    g.manual_seed(seed + epoch)\n",
            "    g = ordered_indices.__dict__.setdefault('generators', {}).get(seed + epoch)\n"
            "    if g is None:  # one generator per seed, made once\n"
            "        g = ordered_indices.generators[seed + epoch] = torch.Generator()\n"
            "        g.manual_seed(seed + epoch)\n",
            "a generator is kept between calls"),
    Mistake("1.2", "returns-the-same-list", "template_data_loader.py",
            "    if padding == 0:\n        return list(indices)\n",
            "    if padding == 0:\n        return indices\n",
            "the very list it was given"),
    Mistake("1.4", "pin-if-cuda-available", "template_data_loader.py",
            "    pin_memory = torch.device(device).type == \"cuda\"",
            "    pin_memory = torch.cuda.is_available()",
            "not whether the machine has a GPU"),
    Mistake("1.4", "pin-if-string-is-cuda", "template_data_loader.py",
            "    pin_memory = torch.device(device).type == \"cuda\"",
            "    pin_memory = device == \"cuda\"",
            "compare the device's type"),
    Mistake("1.4", "test-sampler-shuffled", "template_data_loader.py",
            "test_sampler = DistributedSampler(test_set, world_size, rank, shuffle=False, pad=False)",
            "test_sampler = DistributedSampler(test_set, world_size, rank, shuffle=True, seed=seed, pad=False)",
            "the test sampler shuffles"),
    Mistake("1.4", "test-loader-drop-last", "template_data_loader.py",
            "test_loader = DataLoader(test_set, batch_size=batch_size, sampler=test_sampler,",
            "test_loader = DataLoader(test_set, batch_size=batch_size, sampler=test_sampler, drop_last=True,",
            "the test DataLoader has drop_last=True"),
    Mistake("1.4", "seed-plus-rank", "template_data_loader.py",
            "shuffle=True, seed=seed, drop_last=True",
            "shuffle=True, seed=seed + rank, drop_last=True",
            "every rank must shuffle with the same seed"),
    Mistake("3.1", "total-rebinds-tensor-data", "template_allreduce.py",
            "        tensor.copy_(total)",
            "        tensor.data = total",
            "came back in other memory"),
    Mistake("3.1", "float64-total", "template_allreduce.py",
            "total = tensor.to(\"cpu\", copy=True)",
            "total = tensor.to(\"cpu\", torch.float64)  # float64: no precision lost",
            "went through a floating-point tensor"),
    Mistake("3.1", "irecvs-into-one-buffer", "template_allreduce.py",
            "        for src in range(1, world_size):\n"
            "            dist.recv(received, src=src)\n"
            "            total += received.cpu()\n",
            "        works = [dist.irecv(received, src=src) for src in range(1, world_size)]  # all at once\n"
            "        for work in works:\n"
            "            work.wait()\n"
            "            total += received.cpu()\n",
            "landed in one buffer"),
    Mistake("3.2", "flat-copy-rebound", "template_allreduce.py",
            "    chunks = tensor.view(-1).tensor_split(world_size)",
            "    flat = tensor.flatten().clone()\n"
            "    tensor.data = flat.view(tensor.shape)\n"
            "    chunks = flat.tensor_split(world_size)",
            "came back in other memory"),
    Mistake("3.2", "buffer-never-grown", "template_allreduce.py",
            "    if key not in buffers or buffers[key].numel() < chunks[0].numel():",
            "    if key not in buffers:",
            "must grow"),
    Mistake("3.2", "all-gather-adds", "template_allreduce.py",
            "        exchange(chunks[send_index], chunks[recv_index], right, left)\n",
            "        incoming = received[: chunks[recv_index].numel()]\n"
            "        exchange(chunks[send_index], incoming, right, left)\n"
            "        chunks[recv_index].add_(incoming)\n",
            "overwriting rather than adding"),
    Mistake("1.1", "global-manual-seed", "template_data_loader.py",
            "    g = torch.Generator()\n    g.manual_seed(seed + epoch)\n"
            "    return torch.randperm(dataset_len, generator=g).tolist()\n",
            "    torch.manual_seed(seed + epoch)\n    return torch.randperm(dataset_len).tolist()\n",
            "changed PyTorch's global random state"),
    Mistake("3.2", "receive-sized-by-the-sent-chunk", "template_allreduce.py",
            "        incoming = received[: chunks[recv_index].numel()]\n"
            "        exchange(chunks[send_index], incoming, right, left)\n"
            "        chunks[recv_index].add_(incoming)",
            "        incoming = received[: chunks[send_index].numel()]\n"
            "        exchange(chunks[send_index], incoming, right, left)\n"
            "        chunks[recv_index].add_(incoming)",
            "a receive buffer sliced to another length"),
    Mistake("3.2", "skips-an-empty-send", "template_allreduce.py",
            "        exchange(chunks[send_index], incoming, right, left)\n",
            "        if chunks[send_index].numel() == 0:\n"
            "            continue  # nothing to send\n"
            "        exchange(chunks[send_index], incoming, right, left)\n",
            "an exchange skipped on one side"),
    Mistake("1.4", "sampler-given-the-per-rank-batch", "template_data_loader.py",
            "drop_last=True,\n                                       global_batch_size=global_batch_size)",
            "drop_last=True,\n                                       global_batch_size=batch_size)",
            "the per-rank batch, and the sampler refused it"),
    Mistake("3.1", "receives-from-itself", "template_allreduce.py",
            "        for src in range(1, world_size):\n            dist.recv(received, src=src)",
            "        for src in range(world_size):\n            dist.recv(received, src=src)",
            "received from itself"),
    Mistake("3.2", "neighbours-not-wrapped", "template_allreduce.py",
            "    right, left = (rank + 1) % world_size, (rank - 1) % world_size",
            "    right, left = rank + 1, rank - 1",
            "Neighbours on a ring wrap around"),
    Mistake("3.2", "all-gather-one-step-too-many", "template_allreduce.py",
            "    for step in range(world_size - 1):  # all-gather",
            "    for step in range(world_size):  # all-gather",
            "sent a message to itself"),
    Mistake("3.2", "guarded-all-gather-a-step-too-many", "template_allreduce.py",  # right sums, 2N-1 sends
            "    for step in range(world_size - 1):  # all-gather",
            "    if world_size == 1:\n        return  # nothing to gather\n"
            "    for step in range(world_size):  # all-gather",
            "count the steps of each loop"),
    Mistake("3.2", "buffer-cache-keyed-by-device-only", "template_allreduce.py",
            "    key = (tensor.dtype, tensor.device)",
            "    key = tensor.device",
            "keyed by dtype too"),
    # Task 4.1
    Mistake("4.1", "replicas-are-the-master", "template_replicas.py",
            "    return [copy.deepcopy(master).to(device) for device in devices]",
            "    return [master.to(device) for device in devices]", "deep copy"),
    Mistake("4.1", "one-copy-for-all", "template_replicas.py",
            "    return [copy.deepcopy(master).to(device) for device in devices]",
            "    replica = copy.deepcopy(master)\n    return [replica.to(device) for device in devices]",
            "one copy per device"),
    Mistake("4.1", "replicas-made-anew", "template_replicas.py",  # trial 8: passed: the test's model froze its parameter in its constructor
            "    return [copy.deepcopy(master).to(device) for device in devices]",
            "    copies = []\n"
            "    for device in devices:\n"
            "        replica = type(master)().to(device)  # a fresh model of the same class, then the master's weights\n"
            "        replica.load_state_dict(master.state_dict())\n"
            "        copies.append(replica)\n"
            "    return copies",
            "a state_dict holds values only"),
    # Task 4.2
    Mistake("4.2", "torch-chunk", "template_replicas.py",
            "zip(images.tensor_split(len(devices)), labels.tensor_split(len(devices)))",
            "zip(images.chunk(len(devices)), labels.chunk(len(devices)))", "tensor_split"),
    Mistake("4.2", "drops-remainder", "template_replicas.py",
            "    chunks = zip(images.tensor_split(len(devices)), labels.tensor_split(len(devices)))",
            "    size = len(labels) // len(devices)\n"
            "    chunks = [(images[i * size:(i + 1) * size], labels[i * size:(i + 1) * size]) for i in range(len(devices))]",
            "every image once"),
    Mistake("4.2", "scatter-returns-a-generator", "template_replicas.py",  # trial 8: was "gave None chunks"
            "    return [(x.to(device), y.to(device)) for (x, y), device in zip(chunks, devices)]",
            "    return ((x.to(device), y.to(device)) for (x, y), device in zip(chunks, devices))",
            "scatter returned a generator"),
    # Task 4.3
    Mistake("4.3", "plain-mean", "template_replicas.py",
            "param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
            "param.grad = sum(p.grad.cpu() for p in replica_params) / len(replica_params)", "share of the batch"),
    Mistake("4.3", "sum-not-mean", "template_replicas.py",
            "param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
            "param.grad = sum(p.grad.cpu() for p in replica_params)", "divide"),
    Mistake("4.3", "accumulates-into-master-grad", "template_replicas.py",  # trial 8: passed: the test's master had no .grad yet
            "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
            "        average = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))\n"
            "        if param.grad is None:\n"
            "            param.grad = average\n"
            "        else:\n"
            "            param.grad += average  # as backward() does",
            "do not accumulate into it"),
    Mistake("4.3", "integer-weights", "template_replicas.py",  # trial 8: was "expected sum over replicas of ..."
            "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
            "        param.grad = sum(p.grad.cpu() * (n // total) for p, n in zip(replica_params, chunk_sizes))",
            "integer division"),
    # Task 4.4
    Mistake("4.4", "assigns-data", "template_replicas.py",
            "                target.copy_(source)", "                target.data = source.data", "shares the master's memory"),
    Mistake("4.4", "no-copy-back", "template_replicas.py",
            "                target.copy_(source)", "                pass", "master's values"),
    Mistake("4.4", "re-replicates", "template_replicas.py",  # trial 8: was told it shares the master's memory
            "    with torch.no_grad():\n"
            "        sources = list(master.parameters()) + list(master.buffers())\n"
            "        for replica in replicas:\n"
            "            for target, source in zip(list(replica.parameters()) + list(replica.buffers()), sources):\n"
            "                target.copy_(source)\n",
            "    devices = [next(replica.parameters()).device for replica in replicas]\n"
            "    replicas[:] = [copy.deepcopy(master).to(device) for device in devices]  # fresh replicas of the new weights\n",
            "is not the one the replica held before"),
    # Task 4, trial 10 (2026-11-29): a master moved by module.to (in place), labels left off their device, the
    # replicas' gradients written in place, a frozen parameter judged by the master's .grad or by requires_grad
    # (an unused one), float64 averaged in float32, weights that do not sum to 1, a replica left out of the copy
    # (replicas[1:], an iterator used up), a frozen parameter not copied, a copy into the master
    Mistake("4.1", "moves-the-master", "template_replicas.py",  # passed: on the CPU, master.to("cpu") is a no-op
            "    return [copy.deepcopy(master).to(device) for device in devices]",
            "    return [copy.deepcopy(master.to(device)) for device in devices]",
            "moved the master itself"),
    Mistake("4.1", "one-per-distinct-device", "template_replicas.py",  # was told the length only
            "    return [copy.deepcopy(master).to(device) for device in devices]",
            "    return [copy.deepcopy(master).to(device) for device in dict.fromkeys(devices)]",
            "not one per distinct device"),
    Mistake("4.2", "labels-left-behind", "template_replicas.py",  # passed: CPU devices only
            "    return [(x.to(device), y.to(device)) for (x, y), device in zip(chunks, devices)]",
            "    return [(x.to(device), y) for (x, y), device in zip(chunks, devices)]",
            "move the labels to the device too"),
    Mistake("4.2", "labels-take-the-images-dtype", "template_replicas.py",  # passed: torch.equal compares values
            "    return [(x.to(device), y.to(device)) for (x, y), device in zip(chunks, devices)]",
            "    pairs = []\n"
            "    for (x, y), device in zip(chunks, devices):\n"
            "        x = x.to(device)\n"
            "        pairs.append((x, y.to(x)))  # the labels where the images are\n"
            "    return pairs",
            "y.to(x) would give y x's dtype too"),
    Mistake("4.2", "images-made-float32", "template_replicas.py",  # passed: the test's images were float32
            "    return [(x.to(device), y.to(device)) for (x, y), device in zip(chunks, devices)]",
            "    return [(x.to(device).float(), y.to(device)) for (x, y), device in zip(chunks, devices)]",
            "converting them is the caller's choice"),
    Mistake("4.1", "replica-0-is-the-master", "template_replicas.py",  # caught and named already; kept so
            "    return [copy.deepcopy(master).to(device) for device in devices]",
            "    return [master] + [copy.deepcopy(master).to(device) for device in devices[1:]]  # as nn.DataParallel",
            "replica 0 is the master itself"),
    Mistake("4.3", "writes-into-replica-0", "template_replicas.py",  # was "expected sum over replicas of ..."
            "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
            "        param.grad = replica_params[0].grad.cpu().mul_(chunk_sizes[0] / total)\n"
            "        for p, n in zip(replica_params[1:], chunk_sizes[1:]):\n"
            "            param.grad.add_(p.grad.cpu(), alpha=n / total)",
            "in place: read the replicas' gradients"),
    Mistake("4.3", "frozen-by-the-masters-grad", "template_replicas.py",  # passed: the master held a .grad already
            "        if replica_params[0].grad is None:\n            continue\n",
            "        if param.grad is None:  # frozen\n            continue\n",
            "a frozen parameter is one whose REPLICAS have no .grad"),
    Mistake("4.3", "frozen-by-requires-grad", "template_replicas.py",  # passed: no unused parameter
            "        if replica_params[0].grad is None:\n            continue\n",
            "        if not param.requires_grad:  # frozen\n            continue\n",
            "not only the frozen ones"),
    Mistake("4.3", "float32-accumulator", "template_replicas.py",  # passed: float32 only
            "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
            "        grad = torch.zeros(param.shape)\n"
            "        for p, n in zip(replica_params, chunk_sizes):\n"
            "            grad += p.grad.cpu() * (n / total)\n"
            "        param.grad = grad",
            "the .grad given to one is not"),
    Mistake("4.3", "float32-accumulator-cast-back", "template_replicas.py",  # passed: float32 only
            "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
            "        grad = torch.zeros(param.shape)\n"
            "        for p, n in zip(replica_params, chunk_sizes):\n"
            "            grad += p.grad.cpu() * (n / total)\n"
            "        param.grad = grad.to(param.dtype)",
            "rounded to float32"),
    Mistake("4.3", "divides-twice", "template_replicas.py",  # was "expected sum over replicas of ..."
            "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
            "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes)) / len(replicas)",
            "divided again by the number of replicas"),
    Mistake("4.3", "total-from-the-longest-chunk", "template_replicas.py",  # was "expected sum over replicas of ..."
            "    total = sum(chunk_sizes)\n", "    total = len(chunk_sizes) * max(chunk_sizes)\n",
            "must sum to 1 (n = sum(chunk_sizes)"),
    Mistake("4.3", "two-replicas-only", "template_replicas.py",  # was "expected sum over replicas of ..."
            "    for param, *replica_params in zip(master.parameters(), *(replica.parameters() for replica in replicas)):",
            "    for param, *replica_params in zip(master.parameters(), replicas[0].parameters(), replicas[1].parameters()):",
            "over the first 2 of the 3 replicas only"),
    Mistake("4.4", "sources-an-iterator", "template_replicas.py",  # was told to copy the buffers
            "        sources = list(master.parameters()) + list(master.buffers())",
            "        import itertools\n"
            "        sources = itertools.chain(master.parameters(), master.buffers())",
            "the first replica used it up"),
    Mistake("4.4", "skips-replica-0", "template_replicas.py",  # was told to copy the buffers
            "        for replica in replicas:\n            for target",
            "        for replica in replicas[1:]:  # replica 0 is on the master's device\n            for target",
            "replica 0 too"),
    Mistake("4.4", "skips-frozen-parameters", "template_replicas.py",  # was told to copy the buffers
            "        sources = list(master.parameters()) + list(master.buffers())\n"
            "        for replica in replicas:\n"
            "            for target, source in zip(list(replica.parameters()) + list(replica.buffers()), sources):\n",
            "        sources = [p for p in master.parameters() if p.requires_grad] + list(master.buffers())\n"
            "        for replica in replicas:\n"
            "            targets = [p for p in replica.parameters() if p.requires_grad] + list(replica.buffers())\n"
            "            for target, source in zip(targets, sources):\n",
            "the frozen ones too"),
    Mistake("4.4", "copies-into-the-master", "template_replicas.py",  # was told replica 0 lacked the master's values
            "                target.copy_(source)", "                source.copy_(target)",
            "changed the master's weights"),
    Mistake("4.4", "load-state-dict-assign", "template_replicas.py",  # was told it had assigned .data
            "    with torch.no_grad():\n"
            "        sources = list(master.parameters()) + list(master.buffers())\n"
            "        for replica in replicas:\n"
            "            for target, source in zip(list(replica.parameters()) + list(replica.buffers()), sources):\n"
            "                target.copy_(source)\n",
            "    for replica in replicas:\n"
            "        replica.load_state_dict(master.state_dict(), assign=True)\n",
            "load_state_dict(..., assign=True) all hand the replica"),
    Mistake("4.3", "frozen-gets-zeros", "template_replicas.py",  # caught and named already; kept so
            "        if replica_params[0].grad is None:\n            continue\n",
            "        if replica_params[0].grad is None:\n            param.grad = torch.zeros_like(param)\n            continue\n",
            "must stay None, not be set"),
    Mistake("4.4", "state-dict-into-parameters", "template_replicas.py",  # was a raw size mismatch
            "        sources = list(master.parameters()) + list(master.buffers())",
            "        sources = list(master.state_dict().values())",
            "paired with a master's tensor of another shape"),
    # Task 5.1
    Mistake("5.1", "forward-order", "template_ddp.py",
            "    for param in reversed(unique):", "    for param in unique:", "REVERSE"),
    Mistake("5.1", "order-from-a-set", "template_ddp.py",
            "    unique = list({id(param): param for param in parameters}.values())",
            "    unique = list(set(parameters))", "same on every rank"),
    Mistake("5.1", "cap-exclusive", "template_ddp.py",
            "current_bytes + size > limit", "current_bytes + size >= limit", "at most"),
    Mistake("5.1", "tied-twice", "template_ddp.py",
            "    unique = list({id(param): param for param in parameters}.values())",
            "    unique = list(parameters)", "twice"),
    # Task 5.2
    Mistake("5.2", "no-division", "template_ddp.py",
            "    bucket.buffer /= dist.get_world_size()\n", "", "divide"),
    Mistake("5.2", "reduces-the-parameters", "template_ddp.py",
            "else param.grad.reshape(-1)", "else param.reshape(-1)", "param.grad"),
    Mistake("5.2", "waits-at-once", "template_ddp.py",
            "    bucket.handle = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM, async_op=True)\n",
            "    bucket.handle = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM, async_op=True)\n"
            "    bucket.handle.wait()\n", "overlap"),
    Mistake("5.2", "blocking-all-reduce", "template_ddp.py",
            "op=dist.ReduceOp.SUM, async_op=True)", "op=dist.ReduceOp.SUM)", "overlap"),
    Mistake("5.2", "buffer-cast-to-float32", "template_ddp.py",  # trial 6: float64 gradients lost their low bits
            "    bucket.buffer = torch.cat(grads)\n", "    bucket.buffer = torch.cat(grads).float()\n",
            "keep the gradients' dtype"),
    Mistake("5.2", "zeros-in-the-default-dtype", "template_ddp.py",  # trial 6: a float64 bucket of None grads
            "torch.zeros_like(param).reshape(-1) if param.grad is None",
            "torch.zeros(param.numel()) if param.grad is None", "the parameter's dtype"),
    # Task 5.3
    Mistake("5.3", "register-hook", "template_ddp.py",
            "self._hook_handles.append(param.register_post_accumulate_grad_hook(hook))",
            "self._hook_handles.append(param.register_hook(lambda grad, hook=hook, param=param: hook(param)))",
            "register_post_accumulate_grad_hook"),
    Mistake("5.3", "waits-in-the-hook", "template_ddp.py",
            "                    launch_all_reduce(self.buckets[self.next_bucket])\n",
            "                    launch_all_reduce(self.buckets[self.next_bucket])\n"
            "                    self.buckets[self.next_bucket].handle.wait()\n", "nothing overlaps"),
    Mistake("5.3", "out-of-order", "template_ddp.py",
            """                while (self.next_bucket < len(self.buckets)
                       and self.buckets[self.next_bucket].num_ready == len(self.buckets[self.next_bucket].params)):
                    launch_all_reduce(self.buckets[self.next_bucket])
                    self.next_bucket += 1
""", """                if bucket.num_ready == len(bucket.params):
                    launch_all_reduce(bucket)
                    self.next_bucket += 1
""", "bucket order"),
    Mistake("5.3", "ignores-no-sync", "template_ddp.py",
            "                if not self.sync_this_backward:\n                    return\n", "", "no_sync"),
    Mistake("5.3", "a-hook-per-listed-place", "template_ddp.py",  # trial 6: a tied weight hooked twice, counted twice
            """        for bucket in self.buckets:
            hook = make_hook(bucket)
            for param in bucket.params:
                self._hook_handles.append(param.register_post_accumulate_grad_hook(hook))""",
            """        bucket_of = {id(p): b for b in self.buckets for p in b.params}
        for _, param in self.module.named_parameters(remove_duplicate=False):
            if id(param) in bucket_of:
                self._hook_handles.append(param.register_post_accumulate_grad_hook(make_hook(bucket_of[id(param)])))""",
            "counts the weight twice"),
    # Task 5.4
    Mistake("5.4", "hang-when-unused", "template_ddp.py",
            """        for bucket in self.buckets[self.next_bucket:]:
            launch_all_reduce(bucket)
        for bucket in self.buckets:
            bucket.handle.wait()
""", """        for bucket in self.buckets:
            if bucket.handle is None:  # never launched: nothing to wait for
                continue
            bucket.handle.wait()
""", "unused"),
    Mistake("5.4", "skips-missing-grads", "template_ddp.py",
            "                    param.grad = mean.view_as(param).clone()", "                    continue",
            "unused on this rank"),
    Mistake("5.4", "waits-on-unlaunched-buckets", "template_ddp.py",  # `unused` keeps a bucket from launching
            "        for bucket in self.buckets[self.next_bucket:]:\n            launch_all_reduce(bucket)\n", "",
            "backward never launched"),
    Mistake("5.4", "syncs-after-no-sync", "template_ddp.py",
            "        if not self.sync_this_backward:\n            return\n        for bucket in self.buckets[self.next_bucket:]:",
            "        for bucket in self.buckets[self.next_bucket:]:", "return at once"),
    # Task 5.5
    Mistake("5.5", "no-sync-does-nothing", "template_ddp.py",
            "        self.require_backward_grad_sync = False\n", "", "inside no_sync"),
    Mistake("5.5", "no-finally", "template_ddp.py",
            """        try:
            yield
        finally:
            self.require_backward_grad_sync = previous
""", """        yield
        self.require_backward_grad_sync = previous
""", "finally"),
    Mistake("5.5", "first-micro-batch-syncs", "template_trainer.py",
            "        last = micro_step == accumulate - 1", "        last = micro_step == 0", "last one outside"),
    Mistake("5.5", "no-sync-also-stops-this-backward", "template_ddp.py",  # trial 6: forward decides, not no_sync
            "        self.require_backward_grad_sync = False\n        try:",
            "        self.require_backward_grad_sync = False\n        self.sync_this_backward = False\n        try:",
            "only forward decides it"),
    # Task 5, trial 9 (2026-11-29): bytes by dtype, frozen and tied parameters, the op and when the buffer is divided, hooks closing over a loop variable, buckets launched twice or skipped in finish, nested no_sync
    Mistake("5.1", "tied-kept-at-its-last-place", "template_ddp.py",  # trial 9: was told both rules at once
            "    unique = list({id(param): param for param in parameters}.values())",
            "    unique = list(reversed({id(param): param for param in reversed(parameters)}.values()))",
            "took its LAST place"),
    Mistake("5.1", "frozen-closes-the-bucket", "template_ddp.py",  # trial 9: was told as tied weights
            "        if not param.requires_grad:\n            continue\n        size",
            "        if not param.requires_grad:  # no gradient: the bucket ends here\n            if current:\n                buckets.append(current)\n                current, current_bytes = [], 0\n            continue\n        size",
            "closed the bucket"),
    Mistake("5.1", "four-bytes-an-element", "template_ddp.py",  # trial 9: passed: every case was float32
            "        size = param.numel() * param.element_size()",
            "        size = param.numel() * 4  # float32",
            "4 an element"),
    Mistake("5.2", "reduce-op-avg", "template_ddp.py",  # trial 9: passed: the values agree
            "    bucket.buffer /= dist.get_world_size()\n    bucket.handle = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM, async_op=True)",
            "    bucket.handle = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.AVG, async_op=True)",
            "an averaging op divides AFTER the sum"),
    Mistake("5.2", "divides-in-a-callback", "template_ddp.py",  # trial 9: passed: the values agree
            "    bucket.buffer /= dist.get_world_size()\n    bucket.handle = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM, async_op=True)",
            "    bucket.handle = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM, async_op=True)\n    buffer, n = bucket.buffer, dist.get_world_size()\n    bucket.handle.get_future().then(lambda f: buffer.div_(n))",
            "went into the all_reduce undivided"),
    Mistake("5.3", "hook-closes-over-the-loop-variable", "template_ddp.py",  # trial 9: was told no hook launched
            "        def make_hook(bucket):\n            def hook(param):\n                if not self.sync_this_backward:\n                    return\n                bucket.num_ready += 1\n                while (self.next_bucket < len(self.buckets)\n                       and self.buckets[self.next_bucket].num_ready == len(self.buckets[self.next_bucket].params)):\n                    launch_all_reduce(self.buckets[self.next_bucket])\n                    self.next_bucket += 1\n            return hook\n\n        for bucket in self.buckets:\n            hook = make_hook(bucket)\n",
            "        for bucket in self.buckets:\n            def hook(param):\n                if not self.sync_this_backward:\n                    return\n                bucket.num_ready += 1\n                while (self.next_bucket < len(self.buckets)\n                       and self.buckets[self.next_bucket].num_ready == len(self.buckets[self.next_bucket].params)):\n                    launch_all_reduce(self.buckets[self.next_bucket])\n                    self.next_bucket += 1\n\n",
            "every hook counted into the LAST bucket"),
    Mistake("5.4", "relaunches-every-bucket", "template_ddp.py",  # trial 9: was told as handles not waited on
            "        for bucket in self.buckets[self.next_bucket:]:\n            launch_all_reduce(bucket)\n        for bucket in self.buckets:\n            bucket.handle.wait()",
            "        for bucket in self.buckets:  # every bucket, so none is missed\n            launch_all_reduce(bucket)\n        for bucket in self.buckets:\n            bucket.handle.wait()",
            "launched again buckets that backward had launched"),
    Mistake("5.4", "launches-only-incomplete-buckets", "template_ddp.py",  # trial 9: was told as buckets never ready
            "        for bucket in self.buckets[self.next_bucket:]:\n            launch_all_reduce(bucket)\n",
            "        for bucket in self.buckets[self.next_bucket:]:\n            if bucket.num_ready < len(bucket.params):  # the incomplete ones\n                launch_all_reduce(bucket)\n",
            "behind an incomplete bucket"),
    Mistake("5.5", "toggles", "template_ddp.py",  # trial 9: passed
            "        self.require_backward_grad_sync = False\n        try:",
            "        self.require_backward_grad_sync = not self.require_backward_grad_sync\n        try:",
            "nested in another, require_backward_grad_sync was True"),
    Mistake("5.5", "previous-kept-on-self", "template_ddp.py",  # trial 9: was told 'not True'
            "        previous = self.require_backward_grad_sync\n        self.require_backward_grad_sync = False\n        try:\n            yield\n        finally:\n            self.require_backward_grad_sync = previous",
            "        self._previous = self.require_backward_grad_sync\n        self.require_backward_grad_sync = False\n        try:\n            yield\n        finally:\n            self.require_backward_grad_sync = self._previous",
            "not on self"),
    # Task 5, trial 11 (2026-11-29): bucket_size_mb None and 0, empty buckets, two dtypes of one element size, the divisor and the tensor reduced, which flag the hook reads and when it counts, the order finish launches in and what it resets, which flags no_sync restores
    Mistake("5.1", "none-is-no-cap", "template_ddp.py",  # trial 11: was told as another order
            "    limit = None if bucket_size_mb is None else bucket_size_mb * 2**20",
            "    limit = bucket_size_mb * 2**20 if bucket_size_mb else float('inf')  # 0 or None: no cap",
            "None (or 0) means one bucket per parameter"),
    Mistake("5.1", "zero-is-no-cap", "template_ddp.py",  # trial 11: passed: 0 was never tried
            "    limit = None if bucket_size_mb is None else bucket_size_mb * 2**20",
            "    limit = None if bucket_size_mb is None else (bucket_size_mb or float('inf')) * 2**20  # 0: unlimited",
            "bucket_size_mb=0 means one bucket per parameter too"),
    Mistake("5.1", "none-is-the-default-25", "template_ddp.py",  # trial 11: was told as another order
            "    limit = None if bucket_size_mb is None else bucket_size_mb * 2**20",
            "    limit = (25.0 if bucket_size_mb is None else bucket_size_mb) * 2**20  # None: PyTorch's default",
            "nor PyTorch's default of 25 MB"),
    Mistake("5.1", "empty-first-bucket", "template_ddp.py",  # trial 11: was told as another order
            "        if current and (limit is None or current_bytes + size > limit or param.dtype != current[0].dtype",
            "        if limit is None or current_bytes + size > limit or current and (param.dtype != current[0].dtype",
            "returned an empty bucket"),
    Mistake("5.1", "splits-by-element-size", "template_ddp.py",  # trial 11: passed: no two dtypes of one size
            "or param.dtype != current[0].dtype",
            "or param.element_size() != current[0].element_size()",
            "compare param.dtype itself"),
    Mistake("5.2", "divides-by-the-parameters", "template_ddp.py",  # trial 11: was told as bare values
            "    bucket.buffer /= dist.get_world_size()\n",
            "    bucket.buffer /= len(bucket.params)  # the mean\n",
            "divided by the number of parameters in the bucket"),
    Mistake("5.2", "reduces-a-temporary", "template_ddp.py",  # trial 11: was told as bare values
            "    bucket.buffer /= dist.get_world_size()\n    bucket.handle = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM, async_op=True)",
            "    bucket.handle = dist.all_reduce(bucket.buffer / dist.get_world_size(), op=dist.ReduceOp.SUM, async_op=True)",
            "another tensor than bucket.buffer"),
    Mistake("5.3", "ready-when-grad-not-none", "template_ddp.py",  # trial 11: was told as register_hook
            "                bucket.num_ready += 1\n",
            "                bucket.num_ready = sum(p.grad is not None for p in bucket.params)\n",
            "not the parameters whose .grad is not None"),
    Mistake("5.3", "hook-reads-require-flag", "template_ddp.py",  # trial 11: was told as no early return
            "                if not self.sync_this_backward:\n                    return\n                bucket.num_ready",
            "                if not self.require_backward_grad_sync:\n                    return\n                bucket.num_ready",
            "the hook reads require_backward_grad_sync"),
    Mistake("5.3", "counts-before-the-flag", "template_ddp.py",  # trial 11: was told as register_hook
            "                if not self.sync_this_backward:\n                    return\n                bucket.num_ready += 1\n",
            "                bucket.num_ready += 1\n                if not self.sync_this_backward:\n                    return\n",
            "return before counting"),
    Mistake("5.4", "finish-reads-require-flag", "template_ddp.py",  # trial 11: was told as no early return
            "        if not self.sync_this_backward:\n            return\n        for bucket in self.buckets[self.next_bucket:]:",
            "        if not self.require_backward_grad_sync:\n            return\n        for bucket in self.buckets[self.next_bucket:]:",
            "it reads require_backward_grad_sync"),
    Mistake("5.4", "finish-launches-in-reverse", "template_ddp.py",  # trial 11: was told as buckets not launched
            "        for bucket in self.buckets[self.next_bucket:]:\n            launch_all_reduce(bucket)\n",
            "        for bucket in reversed(self.buckets[self.next_bucket:]):\n            launch_all_reduce(bucket)\n",
            "IN BUCKET ORDER"),
    Mistake("5.4", "finish-resets-only-launched", "template_ddp.py",  # trial 11: was told as never launched
            "            bucket.num_ready, bucket.handle, bucket.buffer = 0, None, None\n",
            "            bucket.handle, bucket.buffer = None, None\n        for bucket in self.buckets[:self.next_bucket]:\n            bucket.num_ready = 0\n",
            "still has num_ready="),
    Mistake("5.5", "restores-both-flags", "template_ddp.py",  # trial 11: passed
            "        finally:\n            self.require_backward_grad_sync = previous\n",
            "        finally:\n            self.require_backward_grad_sync = previous\n            self.sync_this_backward = previous\n",
            "restore require_backward_grad_sync alone"),
    Mistake("5.5", "previous-read-after-setting", "template_ddp.py",  # trial 11: was told as a launch count
            "        previous = self.require_backward_grad_sync\n        self.require_backward_grad_sync = False\n",
            "        self.require_backward_grad_sync = False\n        previous = self.require_backward_grad_sync\n",
            "BEFORE setting False"),
    # Task 6.1
    Mistake("6.1", "floor-not-ceil", "template_zero.py",
            "    shard_size = max(1, -(-total // world_size))", "    shard_size = max(1, total // world_size)",
            "with floor"),
    Mistake("6.1", "whole-parameters", "template_zero.py",  # ZeroRedundancyOptimizer's split, not an even one
            "            end = min(param.numel(), (rank + 1) * shard_size - offset)",
            "            end = param.numel()", "Cut the parameters by element"),
    Mistake("6.1", "offset-not-advanced", "template_zero.py",
            "        offset += param.numel()\n", "", "unequal shards"),
    Mistake("6.1", "end-not-clipped", "template_zero.py",
            "            end = min(param.numel(), (rank + 1) * shard_size - offset)",
            "            end = (rank + 1) * shard_size - offset", "exactly one piece"),
    Mistake("6.1", "set-of-params", "template_zero.py",  # a set is ordered by object id: differs by rank
            "    for index, param in enumerate(params):\n",
            "    for param in set(params):\n        index = next(i for i, p in enumerate(params) if p is param)\n",
            "the same on every rank"),
    # Task 6.2
    Mistake("6.2", "every-rank-steps-everything", "template_zero.py",
            "            if rank == self.rank:\n                mine.append(view)",
            "            mine.append(view)", "every rank stepping every parameter"),
    Mistake("6.2", "copies-not-views", "template_zero.py",
            "            view = params[index].detach().view(-1)[start:end]",
            "            view = params[index].detach().flatten()[start:end].clone()",
            "shares the parameter's memory"),
    Mistake("6.2", "later-group-not-sharded", "template_zero.py",
            "            self.optim.add_param_group(local_group)", "            self.optim.add_param_group(param_group)",
            "add_param_group after __init__ not sharded"),
    Mistake("6.2", "skips-empty-group", "template_zero.py",
            "        local_group = {**param_group, \"params\": mine}\n",
            "        if not mine:\n            return\n        local_group = {**param_group, \"params\": mine}\n",
            "owns no piece of it"),
    # trial 8 (2026-11-29): raw errors from torch.optim, the given step() or the test itself, a bare "must list"
    Mistake("6.2", "views-in-the-graph", "template_zero.py",  # was torch.optim's raw "can't optimize a non-leaf"
            "            view = params[index].detach().view(-1)[start:end]",
            "            view = params[index].view(-1)[start:end]",
            "make it from param.detach()"),
    Mistake("6.2", "rows-not-elements", "template_zero.py",  # was a raw size error in the given step()
            "            view = params[index].detach().view(-1)[start:end]",
            "            view = params[index].detach()[start:end]",
            "param[start:end] slices rows"),
    Mistake("6.2", "local-optimizer-built-anew", "template_zero.py",  # was the test's own IndexError
            "        if self.optim is None:\n"
            "            self.optim = self.optimizer_cls([local_group], **self.optimizer_kwargs)\n"
            "        else:\n"
            "            self.optim.add_param_group(local_group)\n",
            "        self.optim = self.optimizer_cls([local_group], **self.optimizer_kwargs)\n",
            "built a new local optimizer"),
    Mistake("6.2", "group-dict-handed-over", "template_zero.py",  # was "must list every parameter" alone
            "        local_group = {**param_group, \"params\": mine}\n",
            "        local_group = param_group\n        local_group[\"params\"] = mine\n",
            "it is the very dict given to self.optim"),
    Mistake("6.2", "earlier-groups-cut-again", "template_zero.py",  # was two lists whose shown parts were equal
            "        params = param_group[\"params\"]\n",
            "        params = [p for group in self.param_groups for p in group[\"params\"]]\n",
            "the parameters of earlier groups were cut again"),
    Mistake("6.2", "own-pieces-only-listed", "template_zero.py",  # named already; no entry had it
            "            self.pieces.append((view, params[index], start, end, rank))\n"
            "            if rank == self.rank:\n"
            "                mine.append(view)\n",
            "            if rank == self.rank:\n"
            "                self.pieces.append((view, params[index], start, end, rank))\n"
            "                mine.append(view)\n",
            "this rank's and the others'"),
    # Task 6.3
    Mistake("6.3", "no-send", "template_zero.py",
            "            dist.broadcast(view, src=rank)", "            pass",
            "every rank must get every updated piece"),
    Mistake("6.3", "send-before-step", "template_zero.py",
            """        self.optim.step(**kwargs)
        for view, param, start, end, rank in self.pieces:
            dist.broadcast(view, src=rank)
""", """        for view, param, start, end, rank in self.pieces:
            dist.broadcast(view, src=rank)
        self.optim.step(**kwargs)
""", "after the local optimizer's step"),
    Mistake("6.3", "views-get-no-gradient", "template_zero.py",
            "                view.grad = None if param.grad is None else param.grad.view(-1)[start:end]",
            "                pass", "param.grad.view(-1)[start:end]"),
    Mistake("6.3", "closure-to-the-local-step", "template_zero.py",
            """        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for view, param, start, end, rank in self.pieces:
            if rank == self.rank:
                view.grad = None if param.grad is None else param.grad.view(-1)[start:end]
        self.optim.step(**kwargs)
""", """        for view, param, start, end, rank in self.pieces:
            if rank == self.rank:
                view.grad = None if param.grad is None else param.grad.view(-1)[start:end]
        loss = self.optim.step(closure, **kwargs)
""", "call the closure first"),
    Mistake("6.3", "views-keep-the-gradients", "template_zero.py",
            """        for view, param, start, end, rank in self.pieces:
            view.grad = None
""", "", "Set view.grad = None"),
    # Task 0.1
    Mistake("0.1", "float-prediction", "template_collectives.py",
            "    return sum(rank_tensor(rank) for rank in range(world_size))",
            "    return sum(rank_tensor(rank) for rank in range(world_size)).float()", "integer"),
    # Task 4.4
    Mistake("4.4", "copies-parameters-only", "template_replicas.py",
            "        sources = list(master.parameters()) + list(master.buffers())",
            "        sources = list(master.parameters())", "buffers"),
    # Task 1.4
    Mistake("1.4", "blocks-of-the-whole-epoch", "template_data_loader.py",
            "drop_last=True,\n                                       global_batch_size=global_batch_size)",
            "drop_last=True)", "global_batch_size"),
    Mistake("1.4", "padded-train-sampler", "template_data_loader.py",
            "seed=seed, drop_last=True,\n", "seed=seed,\n", "drop_last=True in the training sampler"),
    # Task 1.1
    Mistake("1.1", "no-seed", "template_data_loader.py",
            "return torch.randperm(dataset_len, generator=g).tolist()", "return torch.randperm(dataset_len).tolist()",
            "shards overlap"),
    Mistake("6.3", "grad-piece-cast-to-float32", "template_zero.py",  # trial 6: passed, the tests had only fp32 models
            "view.grad = None if param.grad is None else param.grad.view(-1)[start:end]",
            "view.grad = None if param.grad is None else param.grad.view(-1)[start:end].float()", "in the parameter's dtype"),
    Mistake("6.3", "none-grad-sliced", "template_zero.py",  # trial 6: an unused parameter raised a bare AttributeError
            "view.grad = None if param.grad is None else param.grad.view(-1)[start:end]",
            "view.grad = param.grad.view(-1)[start:end]", "views no gradient"),
    # Task 6, trial 10 (2026-11-29): sizes counted in rows, a shard size one too large, views wrapped anew, pieces
    # sent many times, a SUM for a send, the closure run twice or without grad, a broadcast into a converted copy
    Mistake("6.1", "rows-not-elements-counted", "template_zero.py",  # passed: every parameter of the test was 1-D
            "    total = sum(param.numel() for param in params)\n",
            "    total = sum(len(param) for param in params)\n", "T was counted with len(param)"),
    Mistake("6.1", "floor-plus-one", "template_zero.py",  # was told as a split by whole parameters
            "    shard_size = max(1, -(-total // world_size))", "    shard_size = total // world_size + 1",
            "is one too many when world_size divides T"),
    Mistake("6.2", "views-wrapped-in-parameters", "template_zero.py",  # was told as copies, not views
            "                mine.append(view)", "                mine.append(torch.nn.Parameter(view))",
            "are not views listed in self.pieces"),
    Mistake("6.3", "broadcast-loop-nested", "template_zero.py",  # passed: right values, every piece sent N times
            "        for view, param, start, end, rank in self.pieces:\n            dist.broadcast(view, src=rank)\n",
            "        for view, param, start, end, rank in self.pieces:\n"
            "            for view, param, start, end, rank in self.pieces:\n"
            "                dist.broadcast(view, src=rank)\n",
            "go on the wire once"),
    Mistake("6.3", "all-reduce-for-a-send", "template_zero.py",  # was told as src=0 or a missing gradient
            "            dist.broadcast(view, src=rank)", "            dist.all_reduce(view)", "all-reduced with SUM"),
    Mistake("6.3", "closure-run-twice", "template_zero.py",  # passed: the same gradients, computed twice
            "        self.optim.step(**kwargs)\n", "        self.optim.step(closure, **kwargs)\n",
            "once more from the local optimizer's step"),
    Mistake("6.3", "closure-without-enable-grad", "template_zero.py",  # was a raw "does not require grad"
            "            with torch.enable_grad():\n                loss = closure()", "            loss = closure()",
            "with gradients disabled"),
    Mistake("6.3", "broadcast-into-a-float32-copy", "template_zero.py",  # was told as a step in another dtype
            "            dist.broadcast(view, src=rank)", "            dist.broadcast(view.float(), src=rank)",
            "nothing was received into the views"),
    Mistake("6.1", "end-inclusive", "template_zero.py",  # was "exactly one piece" alone
            "            pieces.append((index, start, end, rank))", "            pieces.append((index, start, end - 1, rank))",
            "end is exclusive"),
    Mistake("6.2", "frozen-left-out", "template_zero.py",  # was two lists of pieces, the cause unsaid
            "        params = param_group[\"params\"]\n",
            "        params = [p for p in param_group[\"params\"] if p.requires_grad]\n",
            "leaves out the parameters with requires_grad=False"),
    Mistake("6.2", "pieces-started-anew", "template_zero.py",  # was "1 pieces, expected 13"
            "        params = param_group[\"params\"]\n",
            "        params = param_group[\"params\"]\n        self.pieces = []\n",
            "holds only the pieces of the group added last"),
    Mistake("6.3", "loss-not-returned", "template_zero.py",  # was the test's own TypeError from torch.equal(None)
            "        return loss\n        # --- Task 6.3 end ---", "        # --- Task 6.3 end ---", "it returned None"),
    Mistake("6.3", "grad-rows-not-elements", "template_zero.py",  # was torch's raw "assign a gradient of size"
            "view.grad = None if param.grad is None else param.grad.view(-1)[start:end]",
            "view.grad = None if param.grad is None else param.grad[start:end]", "slices rows (dim 0)"),
    Mistake("6.3", "broadcast-from-this-rank", "template_zero.py",  # was a hang in broadcast, the source unsaid
            "            dist.broadcast(view, src=rank)", "            dist.broadcast(view, src=self.rank)",
            "but self.pieces names rank"),
    # Task 7.1
    Mistake("7.1", "no-padding", "template_fsdp.py",
            "    padding = -flat.numel() % world_size", "    padding = 0", "pad"),
    Mistake("7.1", "uneven-shards", "template_fsdp.py",  # shard sizes that differ across ranks
            "    return padded[rank * shard_numel:(rank + 1) * shard_numel].clone()",
            "    return flat.tensor_split(world_size)[rank].clone()", "same size"),
    Mistake("7.1", "strided-shard", "template_fsdp.py",  # a layout all_gather does not put back together
            "    return padded[rank * shard_numel:(rank + 1) * shard_numel].clone()",
            "    return padded[rank::world_size].clone()", "contiguous"),
    Mistake("7.1", "padding-in-the-default-dtype", "template_fsdp.py",  # trial 6: bf16 parameters got an fp32 shard
            "padded = torch.cat([flat, flat.new_zeros(padding)])",
            "padded = torch.cat([flat, torch.zeros(padding, device=flat.device)])", "make the padding in flat's dtype too"),
    # Task 7.2
    Mistake("7.2", "new-full-tensor", "template_fsdp.py",
            "        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), "
            "async_op=async_op)",
            "        gathered = torch.empty(self.full.numel(), dtype=self.compute_dtype, device=self.full.device)\n"
            "        handle = dist.all_gather_into_tensor(gathered, self.shard.detach().to(self.compute_dtype), "
            "async_op=async_op)\n"
            "        self.full = gathered\n        return handle", "in place"),
    Mistake("7.2", "drops-the-handle", "template_fsdp.py",  # async, but nobody can wait: a race with compute
            "        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), "
            "async_op=async_op)",
            "        dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), "
            "async_op=async_op)", "returned None"),
    Mistake("7.2", "copied-before-the-wait", "template_fsdp.py",  # a prefetch's buffer read before it arrives: a race
            "        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), "
            "async_op=async_op)",
            "        gathered = torch.empty_like(self.full)\n"
            "        handle = dist.all_gather_into_tensor(gathered, self.shard.detach().to(self.compute_dtype), "
            "async_op=async_op)\n"
            "        self.full.copy_(gathered)\n        return handle", "before waiting on its Work"),
    Mistake("7.2", "storage-sized-in-float32", "template_fsdp.py",  # trial 6: passed; bf16 units took twice the bytes
            "self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())",
            "self.full.untyped_storage().resize_(self.full.numel() * 4)", "compute_dtype's size"),
    # Task 7.3
    Mistake("7.3", "keeps-gathered-params", "template_fsdp.py",
            "        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---",
            "        pass\n        # --- Task 7.3 end ---", "free it"),
    Mistake("7.3", "replaces-the-tensor", "template_fsdp.py",
            "        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---",
            "        self.full = torch.empty(self.full.shape, dtype=self.full.dtype, device=self.full.device)\n"
            "        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---", "in place"),
    Mistake("7.3", "new-empty-tensor", "template_fsdp.py",  # autograd's views keep the old memory alive
            "        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---",
            "        self.full = torch.empty(0, dtype=self.full.dtype, device=self.full.device)\n"
            "        # --- Task 7.3 end ---", "in place"),
    Mistake("7.3", "resizes-the-tensor", "template_fsdp.py",  # shape (0,): unshard() then gathers into 0 bytes
            "        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---",
            "        self.full.resize_(0)\n        # --- Task 7.3 end ---", "keep its shape"),
    Mistake("7.3", "empty-data", "template_fsdp.py",  # the same object, new empty memory; views keep the old
            "        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---",
            "        self.full.data = torch.empty(0, dtype=self.full.dtype, device=self.full.device)\n"
            "        # --- Task 7.3 end ---", "keep its shape"),
    Mistake("7.3", "keeps-its-shard", "template_fsdp.py",  # "keep only the shard", read as: in self.full
            "        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---",
            "        self.full.untyped_storage().resize_(self.shard.numel() * self.full.element_size())\n"
            "        # --- Task 7.3 end ---", "the shard that lasts is self.shard"),
    Mistake("7.3", "frees-only-after-backward", "template_fsdp.py",  # was "each unit must reshard", unnamed
            "        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---",
            "        if self.shard.grad is not None:  # after a backward only: forward's views are saved for it\n"
            "            self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---",
            "(FSDP._post_forward) calls unit.free(), which calls reshard()"),
    Mistake("7.3", "drops-the-shards-gradient", "template_fsdp.py",  # trial 6: "free all but the shard"
            "        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---",
            "        self.full.untyped_storage().resize_(0)\n        self.shard.grad = None\n        # --- Task 7.3 end ---",
            "dropped self.shard.grad"),
    # Task 7, trial 12 (2026-11-30): what goes on the wire (an all-reduce for the all-gather, a shard not cast), memory
    # (bytes counted in elements, uninitialised padding, a gather into other memory, a resize_ that gives nothing
    # back, pending reduce-scatters dropped), state (the bf16 piece copied back into the shard), a ceil rounded.
    # Each passed, or was a raw exception, a bare difference or another cause
    Mistake("7.1", "empty-padding", "template_fsdp.py",  # passed whenever the memory held zeros
            'padded = torch.cat([flat, flat.new_zeros(padding)])',
            'padded = torch.cat([flat, flat.new_empty(padding)])',
            'uninitialised memory'),
    Mistake("7.1", "round-not-ceil", "template_fsdp.py",  # was told as shards of unequal sizes
            '    padding = -flat.numel() % world_size  # the zeros that make the length a multiple of world_size\n    padded = torch.cat([flat, flat.new_zeros(padding)])\n    shard_numel = padded.numel() // world_size\n',
            '    shard_numel = round(flat.numel() / world_size)\n    padded = torch.cat([flat, flat.new_zeros(max(0, shard_numel * world_size - flat.numel()))])\n',
            'cannot hold all of flat'),
    Mistake("7.1", "padding-in-front", "template_fsdp.py",  # was a bare difference of the concatenated shards
            'padded = torch.cat([flat, flat.new_zeros(padding)])',
            'padded = torch.cat([flat.new_zeros(padding), flat])',
            'pad at the END'),
    Mistake("7.2", "all-reduce-of-zeros", "template_fsdp.py",  # passed
            '        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), async_op=async_op)',
            '        self.full.zero_()\n        n = self.shard.numel()\n        self.full[self.rank * n:(self.rank + 1) * n] = self.shard.detach()\n        return dist.all_reduce(self.full, async_op=async_op)',
            'twice the bytes of an all-gather'),
    Mistake("7.2", "storage-in-elements", "template_fsdp.py",  # was a raw setStorage RuntimeError
            'self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())',
            'self.full.untyped_storage().resize_(self.full.numel())',
            'a number of BYTES'),
    Mistake("7.2", "shard-not-cast", "template_fsdp.py",  # was gloo's raw 'invalid tensor type'
            'self.shard.detach().to(self.compute_dtype), async_op=async_op)',
            'self.shard.detach(), async_op=async_op)',
            'tensors of different dtypes'),
    Mistake("7.2", "set-to-new-storage", "template_fsdp.py",  # passed
            '        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())\n        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), async_op=async_op)',
            '        gathered = torch.empty(self.full.numel(), dtype=self.compute_dtype, device=self.full.device)\n        handle = dist.all_gather_into_tensor(gathered, self.shard.detach().to(self.compute_dtype), async_op=async_op)\n        self.full.set_(gathered)  # the same tensor object, now with the gathered memory\n        return handle',
            'gave self.full other memory'),
    Mistake("7.2", "tensor-resize-same-shape", "template_fsdp.py",  # resize_ to its own shape gives nothing back
            '        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())\n',
            '        self.full.resize_(self.full.shape)  # same shape: its storage grows back to numel x element_size\n',
            'while its memory was still freed'),
    Mistake("7.3", "drops-pending-reduce-scatters", "template_fsdp.py",  # was the test's own AttributeError
            '        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---',
            '        self.full.untyped_storage().resize_(0)\n        self.gathering, self.reducing = None, []  # nothing of the full tensor left\n        # --- Task 7.3 end ---',
            'leave self.reducing'),
    Mistake("7.3", "copies-its-piece-back", "template_fsdp.py",  # caught by chance: an unfilled self.full
            '        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---',
            '        if self.is_unsharded():  # keep my piece of the gathered weights in my shard, then free the rest\n            n = self.shard.numel()\n            with torch.no_grad():\n                self.shard.copy_(self.full[self.rank * n:(self.rank + 1) * n])\n        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---',
            'rounding the master weights to bf16'),
    # Task 7.4
    Mistake("7.4", "averages-twice", "template_fsdp.py",  # blocking, and divided before and after the sum
            "        handle = dist.reduce_scatter_tensor(piece, full_grad / self.world_size, op=dist.ReduceOp.SUM, "
            "async_op=True)\n        return handle, piece",
            "        dist.reduce_scatter_tensor(piece, full_grad / self.world_size, op=dist.ReduceOp.SUM)\n"
            "        return None, piece / self.world_size", "divide once"),
    Mistake("7.4", "sum-not-mean", "template_fsdp.py",
            "(piece, full_grad / self.world_size,", "(piece, full_grad,", "divide by the world size"),
    Mistake("7.4", "divides-autograds-tensor", "template_fsdp.py",
            "(piece, full_grad / self.world_size,", "(piece, full_grad.div_(self.world_size),", "not yours"),
    Mistake("7.4", "drops-the-handle", "template_fsdp.py",
            "        return handle, piece\n", "        return None, piece\n", "handle returned is None"),
    Mistake("7.4", "returns-the-piece-alone", "template_fsdp.py",
            "        return handle, piece\n", "        handle.wait()\n        return piece\n", "return a pair"),
    Mistake("7.4", "divided-before-the-wait", "template_fsdp.py",  # the sum divided before it arrives: a race
            "        handle = dist.reduce_scatter_tensor(piece, full_grad / self.world_size, op=dist.ReduceOp.SUM, "
            "async_op=True)\n        return handle, piece\n",
            "        handle = dist.reduce_scatter_tensor(piece, full_grad, op=dist.ReduceOp.SUM, async_op=True)\n"
            "        return handle, piece / self.world_size\n", "before waiting on its Work"),
    Mistake("7.4", "divided-in-place-before-the-wait", "template_fsdp.py",  # was "the sum, not the mean: divide"
            "        handle = dist.reduce_scatter_tensor(piece, full_grad / self.world_size, op=dist.ReduceOp.SUM, "
            "async_op=True)\n        return handle, piece\n",
            "        handle = dist.reduce_scatter_tensor(piece, full_grad, op=dist.ReduceOp.SUM, async_op=True)\n"
            "        return handle, piece.div_(self.world_size)\n", "changed in place before wait() filled it"),
    Mistake("7.4", "divided-after-the-sum", "template_fsdp.py",  # passed: right in fp32 and bf16, inf in float16
            "        handle = dist.reduce_scatter_tensor(piece, full_grad / self.world_size, op=dist.ReduceOp.SUM, "
            "async_op=True)\n        return handle, piece\n",
            "        dist.reduce_scatter_tensor(piece, full_grad.contiguous(), op=dist.ReduceOp.SUM)\n"
            "        return None, piece / self.world_size\n", "overflowed before the division"),
    Mistake("7.4", "piece-like-the-shard", "template_fsdp.py",  # trial 6: gloo's raw dtype check, now said
            "piece = torch.empty(self.shard.numel(), dtype=full_grad.dtype, device=full_grad.device)",
            "piece = torch.empty_like(self.shard)", "make the piece in full_grad's dtype"),
    # Task 7.5
    Mistake("7.5", "compute-dtype-copies", "template_fsdp.py",
            "            dist.all_gather_into_tensor(full, unit.shard.detach())\n",
            "            full = full.to(unit.compute_dtype)\n"
            "            dist.all_gather_into_tensor(full, unit.shard.detach().to(unit.compute_dtype))\n", "fp32 shards"),
    Mistake("7.5", "gathered-through-unshard", "template_fsdp.py",  # trial 6: told as a wrong gather, not as bf16
            """            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, device=unit.shard.device)
            dist.all_gather_into_tensor(full, unit.shard.detach())
            views[id(unit)] = unit.views(full)""", """            unit.unshard()
            views[id(unit)] = [view.to(unit.shard.dtype) for view in unit.views(unit.full)]""",
            "rounded to bfloat16"),
    Mistake("7.5", "fp32-units-left-gathered", "template_fsdp.py",  # trial 6: passed; the whole model stayed gathered
            """            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, device=unit.shard.device)
            dist.all_gather_into_tensor(full, unit.shard.detach())
""", """            if unit.compute_dtype == unit.shard.dtype:  # already the shards' dtype: reuse the unit's own
                unit.unshard()
                full = unit.full
            else:
                full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, device=unit.shard.device)
                dist.all_gather_into_tensor(full, unit.shard.detach())
""", "never called unit.reshard() after reading them"),
    Mistake("7.5", "resharded-before-the-copy", "template_fsdp.py",  # was a SIGSEGV: clone() of freed memory
            """            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, device=unit.shard.device)
            dist.all_gather_into_tensor(full, unit.shard.detach())
            views[id(unit)] = unit.views(full)
""", """            if unit.compute_dtype == unit.shard.dtype:  # already the shards' dtype: reuse the unit's own
                unit.unshard()
                views[id(unit)] = unit.views(unit.full)
                unit.reshard()  # before the views are copied, below
            else:
                full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, device=unit.shard.device)
                dist.all_gather_into_tensor(full, unit.shard.detach())
                views[id(unit)] = unit.views(full)
""", "after unit.reshard() had freed it"),
    Mistake("7.5", "views-of-the-units-own-full", "template_fsdp.py",  # what the next unshard() overwrites
            """            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, device=unit.shard.device)
            dist.all_gather_into_tensor(full, unit.shard.detach())
            views[id(unit)] = unit.views(full)
        return {name: views[id(unit)][index].clone() for name, unit, index in self._names}
""", """            if unit.compute_dtype == unit.shard.dtype:  # already the shards' dtype: reuse the unit's own
                unit.unshard()
                views[id(unit)] = unit.views(unit.full)
            else:
                full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, device=unit.shard.device)
                dist.all_gather_into_tensor(full, unit.shard.detach())
                views[id(unit)] = unit.views(full)
        return {name: views[id(unit)][index] for name, unit, index in self._names}
""", "share memory with their unit's gathered flat tensor"),
    # Task 8.1
    Mistake("8.1", "every-rank-writes", "template_checkpoint.py",
            "    if get_rank() != 0:\n        return None\n    state = {", "    state = {", "rank 0 alone"),
    Mistake("8.1", "written-in-place", "template_checkpoint.py",
            """    fd, tmp = tempfile.mkstemp(dir=directory, prefix=LAST + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # on the disk before the rename makes it the checkpoint
        if os.path.exists(last):
            os.replace(last, os.path.join(directory, PREVIOUS))
        os.replace(tmp, last)
    except Exception:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
""", """    if os.path.exists(last):
        os.replace(last, os.path.join(directory, PREVIOUS))
    with open(last, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
""", "written in place"),
    Mistake("8.1", "no-optimizer-state", "template_checkpoint.py",
            '"optimizer": optimizer.state_dict(),\n             "epoch"', '\n             "epoch"', "optimizer state"),
    Mistake("8.1", "no-epoch-or-step", "template_checkpoint.py",
            '"epoch": epoch, "step": step, "args"', '"args"', "epoch and step"),
    Mistake("8.1", "wrapper-prefixes", "template_checkpoint.py",
            'state = {"model": unwrap(model).state_dict()', 'state = {"model": model.state_dict()', "module."),
    Mistake("8.1", "no-fsync", "template_checkpoint.py",
            "            os.fsync(f.fileno())  # on the disk before the rename makes it the checkpoint\n", "", "fsync"),
    # Task 8.2
    Mistake("8.2", "rank-0-loads-alone", "template_checkpoint.py",
            "    unreadable = []\n", "    unreadable = []\n    if get_rank() != 0:\n        return None, None\n",
            "every rank"),
    Mistake("8.2", "no-fallback", "template_checkpoint.py",
            "    for name in (LAST, PREVIOUS):", "    for name in (LAST,):", "previous.pt must be used"),
    Mistake("8.2", "silent-fresh-start", "template_checkpoint.py",
            "    if unreadable:\n        raise CheckpointError(", "    if False:\n        raise CheckpointError(",
            "start from scratch"),
    Mistake("8.2", "unsafe-load", "template_checkpoint.py",
            "map_location=device, weights_only=True)", "map_location=device, weights_only=False)", "weights_only"),
    # Task 7, trial 9 (2026-11-29): padding of an even flat, memory (a gather into freed memory, del self.full), what
    # goes on the wire (the weights reduced, ReduceOp.AVG, gathered to rank 0 alone, an output without the padding),
    # order (a cast before the wait), other dtypes (a float64 model). Each passed, or was a bare difference, a raw
    # exception or another cause
    Mistake("7.1", "pads-a-whole-shard-when-even", "template_fsdp.py",
            "    padding = -flat.numel() % world_size", "    padding = world_size - flat.numel() % world_size",
            "a whole shard's worth"),
    Mistake("7.2", "gathered-before-the-resize", "template_fsdp.py",  # was gloo's raw "out of bounds for storage"
            "        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())\n"
            "        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), "
            "async_op=async_op)\n",
            "        handle = dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), "
            "async_op=async_op)\n"
            "        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())\n"
            "        return handle\n", "while its memory was still freed"),
    Mistake("7.3", "deletes-the-attribute", "template_fsdp.py",  # was a raw AttributeError
            "        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---",
            "        del self.full\n        # --- Task 7.3 end ---", "removed the attribute self.full"),
    Mistake("7.4", "reduces-the-weights", "template_fsdp.py",  # was a bare difference
            "(piece, full_grad / self.world_size,", "(piece, self.full / self.world_size,", "WEIGHTS (self.full"),
    Mistake("7.4", "reduce-op-avg", "template_fsdp.py",
            "(piece, full_grad / self.world_size, op=dist.ReduceOp.SUM,", "(piece, full_grad, op=dist.ReduceOp.AVG,",
            "ReduceOp.AVG sums, then divides"),
    Mistake("7.4", "piece-cast-before-the-wait", "template_fsdp.py",  # was told as "a division after the sum, say"
            "        return handle, piece\n", "        return handle, piece.float()\n",
            "converted before wait() filled it"),
    Mistake("7.5", "gathered-to-rank-0-only", "template_fsdp.py",  # was told rank 1's values, as a wrong gather
            "            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, "
            "device=unit.shard.device)\n"
            "            dist.all_gather_into_tensor(full, unit.shard.detach())\n",
            "            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, "
            "device=unit.shard.device)\n"
            "            pieces = [torch.empty_like(unit.shard) for _ in range(self.world_size)] if self.rank == 0 "
            "else None\n"
            "            dist.gather(unit.shard.detach(), pieces, dst=0)\n"
            "            if self.rank == 0:\n                full = torch.cat(pieces)\n", "rank 0 got the whole model"),
    Mistake("7.5", "float32-hard-coded", "template_fsdp.py",  # passed: every test model was float32
            "            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, "
            "device=unit.shard.device)\n"
            "            dist.all_gather_into_tensor(full, unit.shard.detach())\n",
            "            full = torch.empty(unit.shard.numel() * self.world_size, dtype=torch.float32, "
            "device=unit.shard.device)\n"
            "            dist.all_gather_into_tensor(full, unit.shard.detach().float())\n", "with a float64 model"),
    Mistake("7.5", "full-without-padding", "template_fsdp.py",  # the checker's hint said "not stacked"
            "            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, "
            "device=unit.shard.device)\n",
            "            full = torch.empty(sum(unit.numels), dtype=unit.shard.dtype, device=unit.shard.device)\n",
            "padding included (unit.shard.numel() * world_size"),
    Mistake("7.4", "gradient-sent-in-float32", "template_fsdp.py",  # was told to make the piece in full_grad's dtype
            "(piece, full_grad / self.world_size,", "(piece, full_grad.float() / self.world_size,",
            "the gradient was converted to float32 before the reduce-scatter"),
    # Task 8, trial 9 (2026-11-29): what is made durable and what is left behind (the folder fsynced, a temporary
    # file left by a failed save), what load_checkpoint lets out or returns, and what a saved flat of one element is
    Mistake("8.1", "fsyncs-the-folder", "template_checkpoint.py",
            "            os.fsync(f.fileno())  # on the disk before the rename makes it the checkpoint\n",
            "        folder = os.open(directory, os.O_RDONLY)\n        os.fsync(folder)\n        os.close(folder)\n",
            "os.fsync the temporary file itself"),
    Mistake("8.1", "temp-file-in-tmp", "template_checkpoint.py",  # said already; catalogued here
            'tempfile.mkstemp(dir=directory, prefix=LAST + ".", suffix=".tmp")', 'tempfile.mkstemp(suffix=".tmp")',
            "is not in the checkpoint's own folder"),
    Mistake("8.1", "temp-file-left-on-failure", "template_checkpoint.py",  # passed
            "    except Exception:\n        if os.path.exists(tmp):\n            os.remove(tmp)\n        raise\n",
            "    finally:\n        pass\n", "remove the temporary file"),
    Mistake("8.2", "catches-runtimeerror-only", "template_checkpoint.py",  # was a raw UnpicklingError
            "        except Exception as error:  # truncated zip, bad pickle, forbidden class: all unreadable\n",
            "        except RuntimeError as error:\n", "let torch.load's UnpicklingError out"),
    Mistake("8.2", "returns-last-path-always", "template_checkpoint.py",  # was a raw FileNotFoundError
            "return torch.load(path, map_location=device, weights_only=True), path",
            "return torch.load(path, map_location=device, weights_only=True), os.path.join(directory, LAST)",
            "return the path of the file it loaded"),
    Mistake("8.2", "silent-fallback", "template_checkpoint.py",
            '            print(f"[rank {get_rank()}] checkpoint {path} cannot be read ({reason[:200]}){then}", '
            'flush=True)\n', "", "say in one line"),
    # Task 8.3, the lead's trial 11 (2026-11-29): at counted from the line, the shard's end taken as inclusive
    Mistake("8.3", "at-counted-from-the-line", "template_checkpoint.py",  # was told to clip the range, which it did
            "            entries.append((name, low - offset, high - low, low - start))",
            "            entries.append((name, low - offset, high - low, low))",
            "not of the line (low)"),
    Mistake("8.3", "end-taken-as-inclusive", "template_checkpoint.py",  # was the bare last line
            "        low, high = max(start, offset), min(end, offset + numel)",
            "        low, high = max(start, offset), min(end - 1, offset + numel)",
            "not min(end - 1, ...)"),
    Mistake("8.4", "step-as-int", "template_checkpoint.py",  # was told "step 7, saved 7"
            "            state[key] = value.clone() if torch.is_tensor(value) else value\n",
            "            state[key] = int(value)\n", "came back as int"),
    Mistake("8.4", "step-told-by-numel", "template_checkpoint.py",  # passed: no saved flat had one element
            '        if not per_element(value, saved[0][1]["param"]):\n',
            '        if not (torch.is_tensor(value) and value.numel() > 1):\n', "not by numel() > 1"),
    Mistake("8.1", "module-of-the-wrapper", "template_checkpoint.py",  # was a raw AttributeError
            'state = {"model": unwrap(model).state_dict()', 'state = {"model": model.module.state_dict()',
            "save unwrap(model).state_dict()"),
    Mistake("8.2", "missing-file-told-unreadable", "template_checkpoint.py",  # passed: told "cannot be read", or
            # with only a leftover temporary file, refused to start
            "    unreadable = []\n    for name in (LAST, PREVIOUS):\n        path = os.path.join(directory, name)\n"
            "        if not os.path.exists(path):\n            continue\n",
            "    if not os.listdir(directory):  # nothing saved yet\n        return None, None\n"
            "    unreadable = []\n    for name in (LAST, PREVIOUS):\n        path = os.path.join(directory, name)\n",
            "file that does not exist is not an unreadable one"),
    # Task 8, trial 11 (2026-11-29): what is left behind or kept alive (last.pt removed by a failed save's clean-up,
    # mkstemp's descriptor never closed), what previous.pt is (a copy), a collective in save_checkpoint, the rank (from
    # torch.distributed without a group, from RANK / LOCAL_RANK) and the path returned, vars() of the dict of args, the
    # first save's rotation and fsync, and in load_checkpoint the fallback's device, an empty file's EOFError, the
    # unreadable file removed, a report of many lines, a bare name returned. Each passed, or was a raw exception or
    # another cause
    Mistake("8.1", "failed-save-removes-last", "template_checkpoint.py",  # passed
            "    except Exception:\n        if os.path.exists(tmp):\n            os.remove(tmp)\n        raise\n",
            "    except Exception:\n        for leftover in (tmp, last):  # nothing half-written left behind\n"
            "            if os.path.exists(leftover):\n                os.remove(leftover)\n        raise\n",
            "the last good checkpoint (epoch 1) must stay last.pt"),
    Mistake("8.1", "mkstemp-descriptor-leaked", "template_checkpoint.py",  # passed
            '        with os.fdopen(fd, "wb") as f:\n            torch.save(state, f)\n            f.flush()\n'
            "            os.fsync(f.fileno())  # on the disk before the rename makes it the checkpoint\n",
            "        torch.save(state, tmp)  # the path: torch.save opens and closes it\n        os.fsync(fd)\n",
            "close the descriptor tempfile.mkstemp returns"),
    Mistake("8.1", "previous-copied", "template_checkpoint.py",  # passed
            "            os.replace(last, os.path.join(directory, PREVIOUS))\n",
            "            import shutil\n            shutil.copyfile(last, os.path.join(directory, PREVIOUS))\n",
            "it was copied, not renamed"),
    Mistake("8.1", "barrier-inside", "template_checkpoint.py",  # passed: every rank called it in the tests
            "    if get_rank() != 0:\n        return None\n    state = {",
            "    if torch.distributed.is_initialized():\n        torch.distributed.barrier()\n"
            "    if get_rank() != 0:\n        return None\n    state = {", "save_checkpoint called dist.barrier"),
    Mistake("8.1", "path-returned-on-every-rank", "template_checkpoint.py",  # was told "rank 1 wrote []"
            "    if get_rank() != 0:\n        return None\n    state = {",
            "    last = os.path.join(directory, LAST)\n    if get_rank() != 0:\n        return last\n    state = {",
            "rank 1 wrote nothing (right) but returned"),
    Mistake("8.1", "returns-the-temporary-path", "template_checkpoint.py",  # was a raw FileNotFoundError
            "        os.replace(tmp, last)\n", "        os.replace(tmp, last)\n        last = tmp\n",
            "a path that no longer exists"),
    Mistake("8.1", "rank-from-torch-distributed", "template_checkpoint.py",  # was told "a collective ran before"
            "    if get_rank() != 0:\n        return None\n    state = {",
            "    if torch.distributed.get_rank() != 0:\n        return None\n    state = {",
            "use the given get_rank()"),
    Mistake("8.1", "rank-from-the-environment", "template_checkpoint.py",  # was a raw KeyError: 'RANK'
            "    if get_rank() != 0:\n        return None\n    state = {",
            '    if int(os.environ["RANK"]) != 0:\n        return None\n    state = {',
            "it read the environment variable RANK"),
    Mistake("8.1", "rank-from-the-environment-default-0", "template_checkpoint.py",  # was told "rank 1 wrote", no why
            "    if get_rank() != 0:\n        return None\n    state = {",
            '    if int(os.environ.get("RANK", 0)) != 0:\n        return None\n    state = {',
            "read the environment variable(s) RANK"),
    Mistake("8.1", "local-rank-0-writes", "template_checkpoint.py",  # was told "rank 1 wrote", no why
            "    if get_rank() != 0:\n        return None\n    state = {",
            '    if int(os.getenv("LOCAL_RANK", "0")) != 0:\n        return None\n    state = {',
            "each node's first process is local"),
    Mistake("8.1", "args-through-vars", "template_checkpoint.py",  # was a raw TypeError
            '"args": dict(args)}', '"args": vars(args)}', "not an argparse Namespace"),
    Mistake("8.1", "rotates-unconditionally", "template_checkpoint.py",  # was a raw FileNotFoundError
            "        if os.path.exists(last):\n            os.replace(last, os.path.join(directory, PREVIOUS))\n",
            "        os.replace(last, os.path.join(directory, PREVIOUS))\n", "there is no last.pt to keep yet"),
    Mistake("8.1", "rotates-after-the-rename", "template_checkpoint.py",  # was a raw FileNotFoundError
            "        if os.path.exists(last):\n            os.replace(last, os.path.join(directory, PREVIOUS))\n"
            "        os.replace(tmp, last)\n",
            "        os.replace(tmp, last)\n"
            "        if os.path.exists(last):\n            os.replace(last, os.path.join(directory, PREVIOUS))\n",
            "left only previous.pt, no last.pt"),
    Mistake("8.1", "fsync-of-a-closed-descriptor", "template_checkpoint.py",  # was a raw OSError (EBADF)
            "            f.flush()\n            os.fsync(f.fileno())  # on the disk before the rename makes it the "
            "checkpoint\n", "        os.fsync(fd)\n", "the descriptor it was given was closed"),
    Mistake("8.2", "fallback-without-map-location", "template_checkpoint.py",  # passed
            "            return torch.load(path, map_location=device, weights_only=True), path\n",
            "            if name == LAST:\n                return torch.load(path, map_location=device, "
            "weights_only=True), path\n            return torch.load(path, weights_only=True), path\n",
            "the fallback's too"),
    Mistake("8.2", "catches-the-two-errors-named", "template_checkpoint.py",  # passed: no test had an empty file
            "        except Exception as error:  # truncated zip, bad pickle, forbidden class: all unreadable\n",
            "        except (RuntimeError, torch.serialization.pickle.UnpicklingError) as error:  # truncated, refused\n",
            "an empty file an EOFError"),
    Mistake("8.2", "returns-the-name", "template_checkpoint.py",  # was a raw FileNotFoundError
            "            return torch.load(path, map_location=device, weights_only=True), path\n",
            "            return torch.load(path, map_location=device, weights_only=True), name\n",
            "the file's name, not its path"),
    Mistake("8.2", "removes-the-unreadable-file", "template_checkpoint.py",  # was the slow test's bare list of files
            "            unreadable.append(path)\n",
            "            unreadable.append(path)\n            if get_rank() == 0 and name == LAST:\n"
            "                os.remove(path)  # a torn file is no checkpoint\n",
            "load_checkpoint removed the unreadable last.pt"),
    Mistake("8.2", "whole-error-reported", "template_checkpoint.py",  # passed: a refused pickle's 7 lines
            'print(f"[rank {get_rank()}] checkpoint {path} cannot be read ({reason[:200]}){then}", flush=True)',
            'print(f"[rank {get_rank()}] checkpoint {path} cannot be read: {error}{then}", flush=True)',
            "printed torch.load's whole error message"),
    # Task 9.1 (tensor parallelism)
    Mistake("9.1", "f-without-backward-all-reduce", "template_tensor_parallel.py",
            "        grad = grad.clone(memory_format=torch.contiguous_format)  # a new tensor: autograd's is not ours\n"
            "        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)\n        return grad, None\n",
            "        return grad, None\n", "f's backward must all-reduce"),
    Mistake("9.1", "g-all-reduces-in-backward-too", "template_tensor_parallel.py",  # what dist.nn.functional.all_reduce does
            "        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)\n        return out\n        # --- Task 9.1 end ---\n\n"
            "    @staticmethod\n    def backward(ctx, grad):\n        # --- Task 9.1 begin ---\n        return grad, None\n",
            "        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)\n        ctx.group = group\n        return out\n"
            "        # --- Task 9.1 end ---\n\n    @staticmethod\n    def backward(ctx, grad):\n        # --- Task 9.1 begin ---\n"
            "        grad = grad.clone()\n        dist.all_reduce(grad, group=ctx.group)\n        return grad, None\n",
            "backward is the identity"),
    Mistake("9.1", "mean-not-sum", "template_tensor_parallel.py",
            "        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)\n        return out\n",
            "        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)\n        return out / dist.get_world_size(group)\n",
            "not the mean"),
    Mistake("9.1", "all-reduce-input-in-place", "template_tensor_parallel.py",
            "        out = x.clone(memory_format=torch.contiguous_format)  # x may be saved by autograd: leave it as it is\n",
            "        out = x\n", "in place"),
    Mistake("9.1", "gather-backward-returns-the-whole-gradient", "template_tensor_parallel.py",  # was torch's raw
            # "invalid gradient" error
            "return grad.chunk(size, dim=-1)[rank].contiguous(), None", "return grad, None",
            "the shape of the whole incoming gradient"),
    # Task 9.2
    Mistake("9.2", "column-split-along-in", "template_tensor_parallel.py",
            "        weight = linear.weight.detach()[rows].clone()\n",
            "        weight = linear.weight.detach()[:, rows].clone()\n", "weight is (out, in)"),
    Mistake("9.2", "row-bias-before-sum", "template_tensor_parallel.py",
            "        y = reduce_from_tp(F.linear(x, self.weight), self.group)\n"
            "        return y if self.bias is None else y + self.bias\n",
            "        return reduce_from_tp(F.linear(x, self.weight, self.bias), self.group)\n", "bias once"),
    Mistake("9.2", "global-rank-slice", "template_tensor_parallel.py",
            '        rank, size = dist.get_rank(group), dist.get_world_size(group)\n        _refuse_uneven("ColumnParallelLinear"',
            '        rank, size = dist.get_rank(), dist.get_world_size(group)\n        _refuse_uneven("ColumnParallelLinear"',
            "group rank"),
    Mistake("9.2", "row-bias-divided-before-sum", "template_tensor_parallel.py",  # right output: was a bare difference
            "        y = reduce_from_tp(F.linear(x, self.weight), self.group)\n"
            "        return y if self.bias is None else y + self.bias\n",
            "        bias = None if self.bias is None else self.bias / dist.get_world_size(self.group)\n"
            "        return reduce_from_tp(F.linear(x, self.weight, bias), self.group)\n",
            "the bias was divided by the group's size"),
    # Task 9.3
    Mistake("9.3", "dp-and-tp-transposed", "template_tensor_parallel.py",
            "    return dp_group, tp_group\n    # --- Task 9.3 end ---", "    return tp_group, dp_group\n    # --- Task 9.3 end ---",
            "transposed"),
    # Task 9.4
    Mistake("9.4", "tp-peers-read-different-batches", "template_tensor_parallel.py",
            "    return rank // tp_size, world_size // tp_size\n", "    return rank, world_size\n", "same batch"),
    Mistake("9.4", "average-over-all-ranks", "template_tensor_parallel.py",
            "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group)\n        param.grad /= dp_size\n",
            "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n        param.grad /= dist.get_world_size()\n",
            "dp group only"),
    # Task 10: pipeline parallelism
    Mistake("10.1", "stages-disagree", "template_pipeline.py",
            "start + base + (1 if stage < extra else 0))", "start + base + (1 if stage <= extra else 0))",
            "every layer in exactly one stage"),
    Mistake("10.2", "blocking-send", "template_pipeline.py",  # both neighbours send first: a deadlock on gloo
            "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))\n",
            "        dist.send(tensor.detach().contiguous(), peer)\n", "blocking dist.send waits"),
    Mistake("10.3", "no-requires-grad", "template_pipeline.py",
            "        return tensor.requires_grad_(requires_grad)\n", "        return tensor\n",
            "earlier stages get no gradient"),
    Mistake("10.4", "no-loss-scaling", "template_pipeline.py",
            "        output = loss_fn(output, target) / num_microbatches\n", "        output = loss_fn(output, target)\n",
            "1/num_microbatches"),
    Mistake("10.4", "detach-before-send", "template_pipeline.py",
            "        stage.send_forward(output)\n", "        output = output.detach()\n        stage.send_forward(output)\n",
            "earlier stages get no gradient"),
    # trial 8 (2026-11-29): a float32 activation that passed, and raw exceptions from the given code
    Mistake("10.4", "activation-received-as-float32", "template_pipeline.py",  # passed: every model was float32
            "    input = x if stage.is_first else stage.recv_forward(stage.input_shape, stage.input_dtype)\n",
            "    input = x if stage.is_first else stage.recv_forward(stage.input_shape, torch.float32)\n",
            "in the shape AND dtype learn_shapes found"),
    Mistake("10.4", "last-stage-sends-too", "template_pipeline.py",  # was a raw "Must specify global_rank"
            "    output = stage.module(input)\n"
            "    if stage.is_last:\n"
            "        output = loss_fn(output, target) / num_microbatches\n"
            "    else:\n"
            "        stage.send_forward(output)\n",
            "    output = stage.module(input)\n"
            "    stage.send_forward(output)\n"
            "    if stage.is_last:\n"
            "        output = loss_fn(output, target) / num_microbatches\n",
            "the last stage sent its output on"),
    Mistake("10.4", "received-in-the-shape-of-x", "template_pipeline.py",  # was a raw AttributeError
            "    input = x if stage.is_first else stage.recv_forward(stage.input_shape, stage.input_dtype)\n",
            "    input = x if stage.is_first else stage.recv_forward(x.shape, x.dtype)\n",
            "x is None on every stage but the first"),
    Mistake("10.4", "loss-returned-as-a-float", "template_pipeline.py",  # was a raw AttributeError in gpipe_step
            "        output = loss_fn(output, target) / num_microbatches\n",
            "        output = loss_fn(output, target).item() / num_microbatches\n",
            "as a Python float"),
    Mistake("10.4", "computed-on-a-detached-input", "template_pipeline.py",  # was the given code's two causes
            "    output = stage.module(input)\n",
            "    output = stage.module(input if stage.is_first else input.detach().requires_grad_())\n",
            "computed with another tensor than the one it returned"),
    Mistake("10.6", "loss-on-every-stage", "template_pipeline.py",
            "        if stage.is_last:\n            loss = output.detach() if loss is None else loss + output.detach()\n",
            "        loss = output.detach() if loss is None else loss + output.detach()\n",
            "only the last stage computes the loss"),
    Mistake("10.7", "backward-newest-first", "template_pipeline.py",
            "backward_step(stage, *saved.pop(0))", "backward_step(stage, *saved.pop())",
            "paired with the wrong micro-batch"),
    Mistake("10.7", "warmup-off-by-one", "template_pipeline.py",
            "min(stage.num_stages - stage.stage_index - 1, num_microbatches)",
            "min(stage.num_stages - stage.stage_index, num_microbatches)", "warm-up"),
    # Issue 22: what the tests did not look at (each class's test also catches the same mistake written
    # other ways: these are representatives). Memory that stays alive (storage bytes)
    Mistake("7.1", "shard-is-a-view", "template_fsdp.py",  # keeps the whole padded tensor alive
            "    return padded[rank * shard_numel:(rank + 1) * shard_numel].clone()",
            "    return padded[rank * shard_numel:(rank + 1) * shard_numel]", "a view of a larger tensor"),
    # bytes on the wire (a recording wrapper around the collectives)
    Mistake("7.2", "gathers-in-fp32", "template_fsdp.py",
            "        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), "
            "async_op=async_op)",
            "        gathered = torch.empty(self.full.numel(), dtype=self.shard.dtype, device=self.full.device)\n"
            "        dist.all_gather_into_tensor(gathered, self.shard.detach())\n"
            "        self.full.copy_(gathered)\n        return None", "travel in compute_dtype"),
    Mistake("7.4", "all-reduce-then-slice", "template_fsdp.py",
            "        piece = torch.empty(self.shard.numel(), dtype=full_grad.dtype, device=full_grad.device)\n"
            "        handle = dist.reduce_scatter_tensor(piece, full_grad / self.world_size, op=dist.ReduceOp.SUM, "
            "async_op=True)\n        return handle, piece\n",
            "        total = full_grad / self.world_size\n"
            "        dist.all_reduce(total, op=dist.ReduceOp.SUM)\n"
            "        n = self.shard.numel()\n"
            "        return None, total[self.rank * n:(self.rank + 1) * n]\n", "reduce_scatter_tensor"),
    # durability: what reached the disk, where, and in which order
    Mistake("8.1", "fsync-after-rename", "template_checkpoint.py",
            "            os.fsync(f.fileno())  # on the disk before the rename makes it the checkpoint\n"
            "        if os.path.exists(last):\n"
            "            os.replace(last, os.path.join(directory, PREVIOUS))\n"
            "        os.replace(tmp, last)\n",
            "        if os.path.exists(last):\n"
            "            os.replace(last, os.path.join(directory, PREVIOUS))\n"
            "        os.replace(tmp, last)\n"
            "        with open(last, \"rb\") as f:\n"
            "            os.fsync(f.fileno())\n", "before the rename"),
    Mistake("8.2", "previous-alone-ignored", "template_checkpoint.py",
            "    unreadable = []\n",
            "    unreadable = []\n    if not os.path.exists(os.path.join(directory, LAST)):\n        return None, None\n",
            "only previous.pt"),
    Mistake("8.2", "no-map-location", "template_checkpoint.py",
            "map_location=device, weights_only=True)", "weights_only=True)", "map_location"),
    # state and nesting
    Mistake("5.5", "restores-true", "template_ddp.py",
            "            self.require_backward_grad_sync = previous\n",
            "            self.require_backward_grad_sync = True\n", "nested"),
    Mistake("5.3", "launches-one-bucket-a-hook", "template_ddp.py",  # a complete bucket behind waits for finish
            "                while (self.next_bucket < len(self.buckets)", "                if (self.next_bucket < len(self.buckets)",
            "behind"),
    # concurrency: every launched handle waited on
    Mistake("5.4", "waits-on-the-last-handle", "template_ddp.py",
            "        for bucket in self.buckets:\n            bucket.handle.wait()\n",
            "        self.buckets[-1].handle.wait()\n        for bucket in self.buckets:\n", "waited"),
    # a pure function that never ends: a time and memory limit, not a hang hint
    Mistake("6.1", "endless-loop", "template_zero.py",
            "            end = min(param.numel(), (rank + 1) * shard_size - offset)",
            "            end = min(param.numel(), rank * shard_size - offset)", "did not finish"),
    # messages that name the true cause
    Mistake("8.1", "rotates-before-writing", "template_checkpoint.py",
            "    fd, tmp = tempfile.mkstemp(dir=directory, prefix=LAST + \".\", suffix=\".tmp\")\n",
            "    if os.path.exists(last):\n        os.replace(last, os.path.join(directory, PREVIOUS))\n"
            "    fd, tmp = tempfile.mkstemp(dir=directory, prefix=LAST + \".\", suffix=\".tmp\")\n",
            "before the new one"),
    Mistake("5.4", "forgets-next-bucket", "template_ddp.py",
            "        self.next_bucket = 0\n        # --- Task 5.4 end ---", "        # --- Task 5.4 end ---",
            "not 0: reset it"),
    # Task 8.3 (resharding, issue 24)
    Mistake("8.3", "offsets-local-to-the-shard", "template_checkpoint.py",
            "            entries.append((name, low - offset, high - low, low - start))",
            "            entries.append((name, low - start, high - low, low - start))", "must be global"),
    Mistake("8.3", "padding-read-as-data", "template_checkpoint.py",
            "        low, high = max(start, offset), min(end, offset + numel)\n",
            "        low, high = max(start, offset), min(end, offset + numel) if name != names[-1] else end\n",
            "padding, read as data"),
    # Task 8.4
    Mistake("8.4", "glued-in-file-order", "template_checkpoint.py",
            "            parts.sort(key=lambda part: part[0])  # by position in the parameter\n", "", "wrong order"),
    Mistake("8.4", "step-count-lost", "template_checkpoint.py",
            "            state[key] = value.clone() if torch.is_tensor(value) else value\n            continue\n",
            "            continue\n", "step count lost"),
    # Issue 23: wrong answers whose hint named another cause
    Mistake("2.1", "fixed-source-rank", "template_trainer.py",
            "            dist.broadcast(tensor, src=src)", "            dist.broadcast(tensor, src=0)",
            "pass the argument src"),
    Mistake("5.1", "megabyte-as-10-to-the-6", "template_ddp.py",
            "bucket_size_mb * 2**20", "bucket_size_mb * 10**6", "2**20"),
    Mistake("6.3", "every-piece-from-rank-0", "template_zero.py",
            "            dist.broadcast(view, src=rank)", "            dist.broadcast(view, src=0)", "from its owner"),
    # Task 9 trial (wrong answers that passed, a message that named another cause)
    Mistake("9.2", "weight-a-view-of-the-linear", "template_tensor_parallel.py",  # keeps the whole layer alive
            "        weight = linear.weight.detach()[rows].clone()\n",
            "        weight = linear.weight.detach().chunk(size, dim=0)[rank]\n", "a view of the nn.Linear"),
    Mistake("9.3", "gather-between-the-pair", "template_tensor_parallel.py",  # right numbers, 2 extra collectives
            "    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group)\n"
            "    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3], tp_group)\n",
            "    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group, gather_output=True)\n"
            "    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3], tp_group, input_is_parallel=False)\n",
            "gather_output=False"),
    Mistake("9.3", "no-dp-group-without-dp", "template_tensor_parallel.py",  # None: averages over the tp peers
            "    for t in range(tp_size):\n        ranks = list(range(t, world_size, tp_size))\n",
            "    for t in range(tp_size if dp_size > 1 else 0):\n        ranks = list(range(t, world_size, tp_size))\n",
            "dp_group None"),
    Mistake("9.3", "only-its-own-groups", "template_tensor_parallel.py",  # new_group is a collective: names collide
            "    dp_group = tp_group = None\n    for d in range(dp_size):\n",
            "    tp_group = dist.new_group(list(range(rank // tp_size * tp_size, (rank // tp_size + 1) * tp_size)))\n"
            "    dp_group = dist.new_group(list(range(rank % tp_size, world_size, tp_size)))\n"
            "    return dp_group, tp_group\n    for d in range(dp_size):\n",
            "each rank must create every group"),
    # Task 8.4, trial A (a raw RuntimeError)
    Mistake("8.4", "missing-only-when-no-part", "template_checkpoint.py",  # some parts found, not all of them
            "if sum(part.numel() for _, part in parts) != length:", "if not parts:",
            "do not add up to the entry's length"),
    # Task 9, trial A (caught, but the message did not name the cause)
    Mistake("9.1", "gather-backward-slices-dim-0", "template_tensor_parallel.py",  # torch's "invalid gradient"
            "return grad.chunk(size, dim=-1)[rank].contiguous(), None",
            "return grad.chunk(size, dim=0)[rank].contiguous(), None", "sliced dimension 0"),
    Mistake("9.2", "row-bias-only-on-rank-0", "template_tensor_parallel.py",  # right output, rank 1's bias no gradient
            "        y = reduce_from_tp(F.linear(x, self.weight), self.group)\n"
            "        return y if self.bias is None else y + self.bias\n",
            "        bias = self.bias if dist.get_rank(self.group) == 0 else None  # the bias counted once: on rank 0\n"
            "        return reduce_from_tp(F.linear(x, self.weight, bias), self.group)\n",
            "took no part in this rank's forward"),
    Mistake("9.2", "row-bias-after-sum-only-on-rank-0", "template_tensor_parallel.py",
            "        return y if self.bias is None else y + self.bias\n",
            "        return y if self.bias is None or dist.get_rank(self.group) != 0 else y + self.bias\n",
            "without the bias"),
    Mistake("9.4", "all-reduce-of-a-copy", "template_tensor_parallel.py",  # the sum goes nowhere
            "dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group)",
            "dist.all_reduce(param.grad.detach().clone(), op=dist.ReduceOp.SUM, group=dp_group)",
            "its sum never reached param.grad"),
    Mistake("9.4", "skips-by-requires-grad", "template_tensor_parallel.py",  # an unused parameter's .grad is None
            "        if param.grad is None:\n            continue\n        dist.all_reduce(param.grad",
            "        if not param.requires_grad:\n            continue\n        dist.all_reduce(param.grad",
            "skip every parameter whose .grad is None"),
    # Trial D (Tasks 8-9): a message that named another cause, or a wrong answer that passed
    Mistake("8.4", "overlap-measured-from-the-wanted-offset", "template_checkpoint.py",
            "begin = saved_at + low - saved_offset", "begin = saved_at + low - offset",
            "or the elements taken from a saved flat are not the overlap's"),
    Mistake("8.4", "each-part-the-wanted-length", "template_checkpoint.py",
            "parts.append((low, tensors[key][begin:begin + high - low]))",
            "parts.append((low, tensors[key][begin:begin + length]))",
            "or the elements taken from a saved flat are not the overlap's"),
    Mistake("8.4", "overlap-one-short", "template_checkpoint.py",
            "low, high = max(offset, saved_offset), min(offset + length, saved_offset + saved_length)",
            "low, high = max(offset, saved_offset), min(offset + length, saved_offset + saved_length) - 1",
            "or the elements taken from a saved flat are not the overlap's"),
    Mistake("8.4", "missing-piece-raises-valueerror", "template_checkpoint.py",  # passed: the test caught ValueError
            '                raise CheckpointError(f"the checkpoint', '                raise ValueError(f"the checkpoint',
            "raise CheckpointError (given: from support.checkpoint_state import CheckpointError)"),
    Mistake("8.2", "no-readable-raises-valueerror", "template_checkpoint.py",
            '        raise CheckpointError(f"no readable checkpoint in {directory}',
            '        raise ValueError(f"no readable checkpoint in {directory}',
            "raise CheckpointError (given: from support.checkpoint_state import CheckpointError)"),
    Mistake("9.1", "gather-backward-slices-dim-1", "template_tensor_parallel.py",  # passed: right for a 2-D x only
            "return grad.chunk(size, dim=-1)[rank].contiguous(), None",
            "return grad.chunk(size, dim=1)[rank].contiguous(), None", "sliced dimension 1"),
    Mistake("9.2", "row-bias-added-detached", "template_tensor_parallel.py",  # right output, no bias gradient anywhere
            "        return y if self.bias is None else y + self.bias\n",
            "        return y if self.bias is None else y + self.bias.detach()\n", "cut from the autograd graph"),
    Mistake("9.4", "async-all-reduce-never-waited", "template_tensor_parallel.py",  # was a bare difference
            "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group)\n        param.grad /= dp_size\n",
            "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group, async_op=True)\n"
            "        param.grad /= dp_size\n", "started all_reduce with async_op=True and never waited on its Work"),
    # Task 9, trial 6 (2026-11-29): inputs kept for backward, float64 inputs, gathers over the world
    Mistake("9.1", "gather-keeps-x-for-its-width", "template_tensor_parallel.py",  # passed
            "        ctx.group = group\n        pieces = [",
            "        ctx.group, ctx.x = group, x  # backward needs the width of x\n        pieces = [",
            "keeps its input for backward (ctx.x)"),
    Mistake("9.1", "g-saves-x", "template_tensor_parallel.py",  # passed
            "        out = x.clone(memory_format=torch.contiguous_format)  # x may be saved by autograd: leave it as it is\n",
            "        ctx.save_for_backward(x)\n        out = x.clone(memory_format=torch.contiguous_format)\n",
            "keeps its input for backward (ctx.save_for_backward"),
    Mistake("9.1", "f-saves-x", "template_tensor_parallel.py",  # passed
            "        ctx.group = group\n        return x\n",
            "        ctx.group = group\n        ctx.save_for_backward(x)\n        return x.view_as(x)\n",
            "keeps its input for backward (ctx.save_for_backward"),
    Mistake("9.1", "gather-pieces-float32", "template_tensor_parallel.py",  # passed: every x was float32
            "        pieces = [torch.empty_like(x, memory_format=torch.contiguous_format)\n",
            "        pieces = [torch.empty(x.shape)\n",
            "not with torch.empty(shape) or torch.zeros(shape)"),
    Mistake("9.1", "g-sum-into-float32-zeros", "template_tensor_parallel.py",  # passed
            "        out = x.clone(memory_format=torch.contiguous_format)  # x may be saved by autograd: leave it as it is\n",
            "        out = torch.zeros(x.shape)\n        out += x\n",
            "the output is torch.float32"),
    Mistake("9.1", "f-backward-into-float32-zeros", "template_tensor_parallel.py",  # passed: autograd casts the gradient back
            "        grad = grad.clone(memory_format=torch.contiguous_format)  # a new tensor: autograd's is not ours\n",
            "        grad = torch.zeros(grad.shape).copy_(grad)\n",
            "to float32's precision only"),
    Mistake("9.1", "gather-pieces-by-world-size", "template_tensor_parallel.py",  # was gloo's raw list-length error
            "                  for _ in range(dist.get_world_size(group))]",
            "                  for _ in range(dist.get_world_size())]",
            "one per rank of the world (dist.get_world_size())"),
    Mistake("9.1", "gather-over-the-world", "template_tensor_parallel.py",  # was gloo's raw list-length error
            "        dist.all_gather(pieces, x.contiguous(), group=group)\n",
            "        dist.all_gather(pieces, x.contiguous())\n",
            "Pass group=group to the all-gather"),
    # Task 9, trial 6: a layer's collective over the world, a slice without f, a split by the default group, float32
    Mistake("9.2", "column-gathers-over-the-world", "template_tensor_parallel.py",  # was a bare difference
            "        return gather_from_tp(y, self.group) if self.gather_output else y\n",
            "        return gather_from_tp(y) if self.gather_output else y\n",
            "pass self.group to gather_from_tp"),
    Mistake("9.2", "row-reduces-over-the-world", "template_tensor_parallel.py",  # was a bare difference
            "        y = reduce_from_tp(F.linear(x, self.weight), self.group)\n",
            "        y = reduce_from_tp(F.linear(x, self.weight))\n",
            "pass self.group to reduce_from_tp"),
    Mistake("9.2", "row-split-without-f", "template_tensor_parallel.py",  # was told only that the gradient differs
            "            x = _split_last_dim(x, self.group)\n",
            "            k = x.shape[-1] // dist.get_world_size(self.group)\n            r = dist.get_rank(self.group)\n            x = x[..., r * k:(r + 1) * k]\n",
            "the slice was taken without f before it"),
    Mistake("9.3", "row-layer-without-group", "template_tensor_parallel.py",  # was told 'not the global rank'
            "    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3], tp_group)\n",
            "    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3])\n",
            "give tp_group to from_linear"),
    Mistake("9.3", "layers-without-group", "template_tensor_parallel.py",  # was told 'not the global rank'
            "    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group)\n    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3], tp_group)\n",
            "    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1])\n    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3])\n",
            "it was split over all 4 ranks, the default group"),
    Mistake("9.4", "flat-buffer-float32", "template_tensor_parallel.py",  # passed: every gradient was float32
            "    dp_size = dist.get_world_size(dp_group)\n    for param in model.parameters():\n        if param.grad is None:\n            continue\n        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group)\n        param.grad /= dp_size\n",
            "    dp_size = dist.get_world_size(dp_group)\n    grads = [p.grad for p in model.parameters() if p.grad is not None]\n    flat = torch.zeros(sum(g.numel() for g in grads))\n    torch.cat([g.reshape(-1) for g in grads], out=flat) if False else flat.copy_(torch.cat([g.reshape(-1) for g in grads]))\n    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=dp_group)\n    flat /= dp_size\n    for g, mean in zip(grads, flat.split([g.numel() for g in grads])):\n        g.copy_(mean.view_as(g))\n",
            "to float32's precision only"),
    # Task 9.2 and 9.4, trial 6: passed where dp and tp sizes are equal; a refusal on rank 0 only
    Mistake("9.4", "divides-by-the-tp-size", "template_tensor_parallel.py",  # passed: dp 2 x tp 2 only
            "    dp_size = dist.get_world_size(dp_group)\n",
            "    dp_size = dist.get_world_size() // dist.get_world_size(dp_group)\n",
            "the tp size (world size // dp size)"),
    Mistake("9.2", "refuses-on-rank-0-only", "template_tensor_parallel.py",  # told 'accepted', not 'rank 0 refused'
            "        _refuse_uneven(\"ColumnParallelLinear\", \"out_features\", linear.out_features, size)\n",
            "        if rank == 0:\n            _refuse_uneven(\"ColumnParallelLinear\", \"out_features\", linear.out_features, size)\n",
            "accepted it on rank 1"),
    # Task 10 (pipeline): wrong answers a student's trial found passing (issue: trial of Tasks 9-10)
    Mistake("10.3", "recv-without-dtype", "template_pipeline.py",  # learn_shapes' int64 message: gloo aborts
            "        tensor = torch.empty(shape, dtype=dtype)\n", "        tensor = torch.empty(shape)\n",
            "receive into a tensor of the given dtype"),
    Mistake("10.7", "keeps-every-micro-batch", "template_pipeline.py",  # the trace is right, the memory GPipe's
            "backward_step(stage, *saved.pop(0))", "backward_step(stage, *saved[next_backward])",
            "drop each (input, output) pair"),
    Mistake("10.7", "warmup-from-global-rank", "template_pipeline.py",  # right while one pipeline spans the world
            "min(stage.num_stages - stage.stage_index - 1, num_microbatches)",
            "min(dist.get_world_size() - dist.get_rank() - 1, num_microbatches)", "not the global rank"),
    Mistake("10.6", "loss-keeps-its-graph", "template_pipeline.py",
            "            loss = output.detach() if loss is None else loss + output.detach()\n",
            "            loss = output if loss is None else loss + output\n", "still carries its autograd graph"),
    Mistake("10.5", "forgets-send-backward", "template_pipeline.py",  # a hang: the message names the missing send
            "    if not stage.is_first:\n        stage.send_backward(input.grad)\n", "",
            "stage.send_backward(input.grad)"),
    # Trial D (Task 10.2): a message that named another cause
    Mistake("10.2", "waits-for-its-sends-inside-send", "template_pipeline.py",  # told "no receive matches them"
            "self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))",
            "self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))\n        self.wait_sends()",
            "_send waits for its own sends"),
    Mistake("10.2", "pending-sends-replaced-each-send", "template_pipeline.py",  # told "did not keep the Work"
            "self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))",
            "self.pending_sends = [dist.isend(tensor.detach().contiguous(), peer)]",
            "append to stage.pending_sends; do not replace or empty it"),
    # Issue 32: inputs Phase 3's tests never used, and failures that did not name their task or true cause
    # (one representative a class; the message each must produce is the hint).
    # A student's own exception in a rank: the task, where it was raised, what the test checks
    Mistake("9.2", "bias-none-unchecked", "template_tensor_parallel.py",
            "        bias = None if linear.bias is None else linear.bias.detach()[rows].clone()\n",
            "        bias = linear.bias.detach()[rows].clone()\n",
            "raised AttributeError: 'NoneType' object has no attribute 'detach' (at template_tensor_parallel.py:"),
    # an IndexError in pytest's own process
    Mistake("10.1", "starts-list-one-short", "template_pipeline.py",
            "    start = stage * base + min(stage, extra)\n    return range(start, start + base + (1 if stage < extra else 0))",
            "    starts = [s * base + min(s, extra) for s in range(num_stages)]\n"
            "    return range(starts[stage], starts[stage + 1])",
            "your code raised IndexError: list index out of range (at template_pipeline.py:"),
    # a rank killed by a signal (gloo aborts on a buffer of another size than the message)
    Mistake("10.3", "receives-into-a-smaller-buffer", "template_pipeline.py",
            "        tensor = torch.empty(shape, dtype=dtype)\n",
            "        tensor = torch.empty(tuple(shape)[:-1] or (1,), dtype=dtype)\n", "was killed by SIGABRT"),
    # pytest.raises' "DID NOT RAISE"
    Mistake("5.5", "swallows-the-exception", "template_ddp.py",
            "        try:\n            yield\n        finally:\n            self.require_backward_grad_sync = previous\n",
            "        try:\n            yield\n        except Exception:\n            pass  # keep training\n"
            "        self.require_backward_grad_sync = previous\n", "no KeyError was raised, where the test expected one"),
    # a failed operator's recorded collectives counted against the next one ("g's forward sent two all-reduces")
    Mistake("9.1", "f-backward-returns-one-gradient", "template_tensor_parallel.py",
            "        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)\n        return grad, None\n",
            "        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)\n        return grad\n",
            "copy_to_tp on rank 0 (group rank 0 of 2) failed: RuntimeError: function _CopyToTPBackward returned an "
            "incorrect number of gradients"),
    # hangs told by where the student's code waits: a receive whose message never comes, sends never received
    Mistake("10.3", "irecv-from-the-previous-stage-always", "template_pipeline.py",
            "        dist.recv(tensor, peer)\n",
            "        dist.irecv(tensor, self.prev_rank if self.prev_rank is not None else peer).wait()\n",
            "_recv must receive exactly one message, from `peer`"),
    Mistake("10.7", "no-cool-down", "template_pipeline.py",
            "    while next_backward < num_microbatches:\n        backward()\n", "",
            "sends to complete: the neighbour never receives them"),
    # given code's message (send_backward's) naming the task that called it wrongly, not an earlier one
    Mistake("10.5", "sends-output-grad", "template_pipeline.py",
            "        stage.send_backward(input.grad)\n", "        stage.send_backward(output.grad)\n",
            "send_backward was given None"),
    # a hint only where its condition holds: the steady state's order (not the warm-up's length), one
    # micro-batch's gradient (not a pairing of micro-batches)
    Mistake("10.7", "backward-before-forward", "template_pipeline.py",
            "    for i in range(warmup, num_microbatches):\n        forward(i)\n        backward()\n",
            "    for i in range(warmup, num_microbatches):\n        if saved:\n            backward()\n        forward(i)\n",
            "one forward, THEN one backward"),
    Mistake("10.6", "zero-grad-before-each-backward", "template_pipeline.py",
            "        backward_step(stage, *saved[i])\n        saved[i] = None",
            "        stage.module.zero_grad()\n        backward_step(stage, *saved[i])\n        saved[i] = None",
            "share alone: the backwards must ADD into .grad"),
    # contracts beyond the value: a 0-d loss, the caller's module changed in place
    Mistake("10.6", "loss-of-shape-1", "template_pipeline.py",
            "    stage.wait_sends()\n    return loss, trace\n    # --- Task 10.6 end ---",
            "    stage.wait_sends()\n    return (None if loss is None else loss.reshape(1)), trace\n    # --- Task 10.6 end ---",
            "asks for a 0-d tensor"),
    Mistake("9.3", "parallelizes-a-copy", "template_tensor_parallel.py",
            "    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group)\n",
            "    import copy\n    model = copy.deepcopy(model)  # leave the caller's model as it was\n"
            "    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group)\n",
            "change the model IN PLACE"),
    # groups checked before the numbers: rows sized by dp, columns strided by dp (right only when dp == tp)
    Mistake("9.3", "grid-rows-sized-by-dp", "template_tensor_parallel.py",
            "    for d in range(dp_size):\n        ranks = list(range(d * tp_size, (d + 1) * tp_size))",
            "    for d in range(tp_size):\n        ranks = list(range(d * dp_size, (d + 1) * dp_size))",
            "make_2d_groups"),
    # inputs never used: other dtypes, strided tensors, a shard starting inside the padding, a group of one
    # rank, a group without global rank 0, a device that is not the CPU
    Mistake("8.4", "float32-zeros", "template_checkpoint.py",
            "        flat = value.new_zeros(numel)\n", "        flat = torch.zeros(numel)\n",
            "value.new_zeros(numel), not torch.zeros(numel)"),
    Mistake("10.2", "sends-strided-views", "template_pipeline.py",
            "dist.isend(tensor.detach().contiguous(), peer)", "dist.isend(tensor.detach(), peer)",
            "gloo sends contiguous memory only"),
    Mistake("8.3", "padding-counted-from-the-line-end", "template_checkpoint.py",
            "    padding = (end - start) - sum(length for _, _, length, _ in entries)\n",
            "    padding = max(0, end - sum(numels))\n", "it starts inside the padding"),
    Mistake("9.2", "row-slice-contiguous-not-clone", "template_tensor_parallel.py",
            "        weight = linear.weight.detach()[:, rank * k:(rank + 1) * k].clone()\n",
            "        weight = linear.weight.detach().tensor_split(size, dim=1)[rank].contiguous()\n",
            "in a group of 1 rank"),
    Mistake("9.3", "broadcast-from-global-rank-0", "template_tensor_parallel.py",
            "    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group)\n",
            "    for p in model.parameters():  # every rank starts from rank 0's model\n"
            "        dist.broadcast(p.data, src=0, group=tp_group)\n"
            "    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group)\n",
            "dist.get_global_rank(tp_group, 0)"),
    Mistake("7.1", "padding-on-the-default-device", "template_fsdp.py",
            "    padded = torch.cat([flat, flat.new_zeros(padding)])", "    padded = torch.cat([flat, torch.zeros(padding)])",
            "on the 'meta' device"),
    # Task 10, trial A (caught, but the message did not name the cause)
    Mistake("10.2", "send-work-dropped", "template_pipeline.py",  # was the neighbour's receive after 10 s
            "self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))",
            "dist.isend(tensor.detach().contiguous(), peer)", "did not keep the Work of its send"),
    Mistake("10.6", "first-stage-skips-learn-shapes", "template_pipeline.py",  # was gloo's SIGABRT
            "    # --- Task 10.6 begin ---\n    stage.learn_shapes(inputs, num_microbatches)\n",
            "    # --- Task 10.6 begin ---\n    if not stage.is_first:  # the first stage knows its shapes\n"
            "        stage.learn_shapes(inputs, num_microbatches)\n", "before it called stage.learn_shapes"),
    Mistake("10.7", "first-stage-skips-learn-shapes", "template_pipeline.py",
            "    # --- Task 10.7 begin ---\n    stage.learn_shapes(inputs, num_microbatches)\n",
            "    # --- Task 10.7 begin ---\n    if not stage.is_first:  # the first stage knows its shapes\n"
            "        stage.learn_shapes(inputs, num_microbatches)\n", "before it called stage.learn_shapes"),
    Mistake("10.3", "irecv-never-waited", "template_pipeline.py",  # was a hang at the 15 s limit, run twice: 44 s
            "dist.recv(tensor, peer)", "dist.irecv(tensor, peer)", "returned before its message arrived"),
    Mistake("7.4", "waited-through-the-future-on-gloo", "template_fsdp.py",  # trial 6: a raw RuntimeError
            "        return handle, piece\n", "        torch.futures.wait_all([handle.get_future()])\n        return None, piece\n",
            "has no Future"),
    Mistake("7.4", "polled-until-completed-on-gloo", "template_fsdp.py",  # trial 6: told of a collective never called
            "        return handle, piece\n",
            "        while not handle.is_completed():  # gloo: never True for a reduce-scatter\n            pass\n"
            "        return None, piece\n", "reduce-scatter Work has no Future (get_future() raises), and polled with "
            "is_completed() it never says True"),
    Mistake("14.3", "reduce-scatter-polled-until-completed", "template_sequence_parallel.py",  # trial 6: a 50 s hang
            "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group)\n",
            "        work = dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group, async_op=True)\n"
            "        while not work.is_completed():  # gloo: never True for a reduce-scatter\n            pass\n",
            "it never says True, not even after its wait() has run"),
    Mistake("14.3", "reduce-scatter-waited-through-its-future", "template_sequence_parallel.py",  # trial 6: passed
            "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group)\n",  # (Wire's poisoned Future)
            "        work = dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group, async_op=True)\n"
            "        torch.futures.wait_all([work.get_future()])  # gloo: no Future for a reduce-scatter\n",
            "reduce-scatter Work has no Future"),
    Mistake("10.3", "irecv-polled-until-completed", "template_pipeline.py",  # trial 6: told the message never came
            "        dist.recv(tensor, peer)\n",
            "        work = dist.irecv(tensor, peer)\n        while not work.is_completed():  # gloo: never True before wait()\n"
            "            pass\n", "only once their wait() has run"),
    Mistake("10.3", "irecv-waited-through-its-future", "template_pipeline.py",  # trial 6: a raw RuntimeError
            "        dist.recv(tensor, peer)\n", "        dist.irecv(tensor, peer).get_future().wait()\n",
            "have no Future"),
    # Task 9 and 10, trial 9 (2026-11-29): handles never waited, a collective of the wrong kind, a bias of the
    # wrong size, a slice by the global rank, layers skipped in the dp average, buffers changed in flight, activations kept past
    # the step, a stage's parameters left without .grad, losses replaced, 2 stages against 4
    Mistake("9.1", "gather-backward-slice-by-global-rank", "template_tensor_parallel.py",  # was a raw IndexError (the float64 case's)
            "        rank, size = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)\n        return grad.chunk(",
            "        rank, size = dist.get_rank(), dist.get_world_size(ctx.group)\n        return grad.chunk(",
            "ranks and sizes are the group's: dist.get_rank(group) = 0"),
    Mistake("9.1", "f-backward-async-never-waited", "template_tensor_parallel.py",  # was told f's backward does not all-reduce
            "        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)\n        return grad, None\n",
            "        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group, async_op=True)\n        return grad, None\n",
            "backward started all_reduce with async_op=True and never waited on its Work"),
    Mistake("9.1", "g-forward-async-never-waited", "template_tensor_parallel.py",
            "        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)\n        return out\n",
            "        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group, async_op=True)\n        return out\n",
            "forward started all_reduce with async_op=True and never waited on its Work"),
    Mistake("9.2", "column-forward-without-f", "template_tensor_parallel.py",  # caught: f left out at the layer, not in the operator
            "        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)\n",
            "        y = F.linear(x, self.weight, self.bias)\n",
            "copy_to_tp (f) before the product sums it over the ranks in backward"),
    Mistake("9.2", "column-bias-kept-whole", "template_tensor_parallel.py",  # caught
            "        bias = None if linear.bias is None else linear.bias.detach()[rows].clone()\n",
            "        bias = None if linear.bias is None else linear.bias.detach().clone()\n",
            "the bias must be this rank's slice of it"),
    Mistake("9.2", "row-bias-sliced-like-the-weight", "template_tensor_parallel.py",  # was a hang: rank 0's forward failed, rank 1 waited in backward
            "        bias = None if linear.bias is None else linear.bias.detach().clone()\n        return cls(weight, bias, linear.in_features, linear.out_features, group, input_is_parallel)",
            "        bias = None if linear.bias is None else linear.bias.detach()[rank * k:(rank + 1) * k].clone()\n        return cls(weight, bias, linear.in_features, linear.out_features, group, input_is_parallel)",
            "the bias must be the whole bias, on every rank"),
    Mistake("9.2", "column-gathers-with-a-zero-padded-all-reduce", "template_tensor_parallel.py",  # right numbers: was told the kinds only
            "        return gather_from_tp(y, self.group) if self.gather_output else y\n",
            "        if not self.gather_output:\n            return y\n        rank, k = dist.get_rank(self.group), y.shape[-1]\n        full = y.new_zeros((*y.shape[:-1], self.out_features))\n        full[..., rank * k:(rank + 1) * k] = y\n        return reduce_from_tp(full, self.group)  # the others' slices are zero: the sum is the whole output\n",
            "sent one all-reduce of the whole output"),
    Mistake("9.3", "row-expects-the-whole-input", "template_tensor_parallel.py",  # was a raw 'mat1 and mat2 shapes cannot be multiplied'
            "    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3], tp_group)\n",
            "    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3], tp_group, input_is_parallel=False)\n",
            "slices it again"),
    Mistake("9.4", "skips-the-split-layers", "template_tensor_parallel.py",  # was a bare training difference (features.0.weight)
            "    for param in model.parameters():\n        if param.grad is None:\n            continue\n        dist.all_reduce(param.grad",
            "    split = {id(p) for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) for p in m.parameters()}\n    for param in model.parameters():\n        if param.grad is None or id(param) in split:\n            continue  # a tp slice: different on each rank\n        dist.all_reduce(param.grad",
            "left the gradients of the ColumnParallelLinear's weight and bias"),
    Mistake("9.4", "averages-only-the-split-layers", "template_tensor_parallel.py",
            "    for param in model.parameters():\n        if param.grad is None:\n            continue\n        dist.all_reduce(param.grad",
            "    split = {id(p) for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) for p in m.parameters()}\n    for param in model.parameters():\n        if param.grad is None or id(param) not in split:\n            continue  # replicated: f and g made them equal\n        dist.all_reduce(param.grad",
            "left the gradients of the replicated nn.Linear's weight and bias"),
    Mistake("9.4", "sampler-by-tp-rank", "template_tensor_parallel.py",  # caught
            "    return rank // tp_size, world_size // tp_size\n",
            "    return rank % tp_size, world_size // tp_size\n",
            "read different slices ({0: 0, 1: 1})"),
    # Task 9, trial 14 (b): sizes of the whole layer, f after the slice, split by size, a float64 copy sent, the pair
    # half done, an index off by one, a loop that returns early or filters by shape
    Mistake("9.1", "gather-backward-split-by-size", "template_tensor_parallel.py",  # trial 14 (b): was torch's raw 'invalid gradient at index 0'
            '        return grad.chunk(size, dim=-1)[rank].contiguous(), None',
            '        return grad.split(size, dim=-1)[rank].contiguous(), None',
            'cuts pieces n elements LONG'),
    Mistake("9.1", "f-backward-via-float64", "template_tensor_parallel.py",  # trial 14 (b): was a bare difference of the wire's dtype
            "        grad = grad.clone(memory_format=torch.contiguous_format)  # a new tensor: autograd's is not ours\n        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)\n        return grad, None",
            '        total = grad.double()  # sum in float64: no rounding\n        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)\n        return total.to(grad.dtype), None',
            'the right collective of a float64 copy'),
    Mistake("9.2", "column-out-features-local", "template_tensor_parallel.py",  # trial 14 (b): passed: nothing read the sizes
            '        return cls(weight, bias, linear.in_features, linear.out_features, group, gather_output)',
            '        return cls(weight, bias, linear.in_features, k, group, gather_output)',
            "they are the whole layer's sizes"),
    Mistake("9.2", "row-in-features-local", "template_tensor_parallel.py",  # trial 14 (b): passed
            '        return cls(weight, bias, linear.in_features, linear.out_features, group, input_is_parallel)',
            '        return cls(weight, bias, k, linear.out_features, group, input_is_parallel)',
            "not this rank's (6, 7)"),
    Mistake("9.2", "row-f-after-the-slice", "template_tensor_parallel.py",  # trial 14 (b): was told only that the gradient differs
            '            x = _split_last_dim(x, self.group)',
            '            r, k = dist.get_rank(self.group), x.shape[-1] // dist.get_world_size(self.group)\n            x = copy_to_tp(x[..., r * k:(r + 1) * k], self.group)',
            'f (copy_to_tp) was applied after the slice'),
    Mistake("9.2", "clone-then-slice", "template_tensor_parallel.py",  # trial 14 (b): was told it shares the nn.Linear's memory, which it does not
            '        weight = linear.weight.detach()[rows].clone()',
            '        weight = linear.weight.detach().clone()[rows]',
            "a slice of a copy of the nn.Linear's whole weight"),
    Mistake("9.2", "column-refuses-by-in-features", "template_tensor_parallel.py",  # trial 14 (b): was its own ValueError, raw
            '_refuse_uneven("ColumnParallelLinear", "out_features", linear.out_features, size)',
            '_refuse_uneven("ColumnParallelLinear", "in_features", linear.in_features, size)',
            'It splits out_features only; in_features may be anything'),
    Mistake("9.2", "row-refuses-by-out-features", "template_tensor_parallel.py",  # trial 14 (b): was its own ValueError, raw
            '_refuse_uneven("RowParallelLinear", "in_features", linear.in_features, size)',
            '_refuse_uneven("RowParallelLinear", "out_features", linear.out_features, size)',
            'It splits in_features only; out_features may be anything'),
    Mistake("9.3", "row-not-split", "template_tensor_parallel.py",  # trial 14 (b): was told that gather_full_params (given code) differs
            '    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group)\n    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3], tp_group)',
            '    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group, gather_output=True)',
            'replace BOTH'),
    Mistake("9.3", "column-gathers-row-expects-slice", "template_tensor_parallel.py",  # trial 14 (b): was a raw 'mat1 and mat2 shapes cannot be multiplied'
            '    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group)',
            '    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group, gather_output=True)',
            'gather_output=True before classifier[3] with input_is_parallel=True'),
    Mistake("9.3", "classifier-off-by-one", "template_tensor_parallel.py",  # trial 14 (b): was a raw AttributeError of the Flatten
            '    model.classifier[1] = ColumnParallelLinear.from_linear(model.classifier[1], tp_group)\n    model.classifier[3] = RowParallelLinear.from_linear(model.classifier[3], tp_group)',
            '    model.classifier[0] = ColumnParallelLinear.from_linear(model.classifier[0], tp_group)\n    model.classifier[2] = RowParallelLinear.from_linear(model.classifier[2], tp_group)',
            'index 0 is the Flatten'),
    Mistake("9.4", "return-after-first", "template_tensor_parallel.py",  # trial 14 (b): was told 'expected' a float64 tensor of another case
            '        param.grad /= dp_size\n    # --- Task 9.4 end ---',
            '        param.grad /= dp_size\n        return\n    # --- Task 9.4 end ---',
            'average EVERY parameter that has a .grad (no return inside the loop'),
    Mistake("9.4", "average-only-weights", "template_tensor_parallel.py",  # trial 14 (b): was told 'expected' a float64 tensor of another case
            '        if param.grad is None:\n            continue',
            '        if param.grad is None or param.dim() < 2:\n            continue  # biases are tiny',
            "but left ['0.bias', '1.bias'] as they were"),
    Mistake("9.1", "f-keeps-args", "template_tensor_parallel.py",  # trial 14 (b): passed: x in a tuple on ctx
            '        ctx.group = group\n        return x\n',
            '        ctx.group = group\n        ctx.args = (x, group)  # for debugging\n        return x\n',
            'ctx.args, a tuple holding x'),
    Mistake("9.1", "gather-keeps-pieces", "template_tensor_parallel.py",  # trial 14 (b): passed: tensors in a list on ctx
            '        dist.all_gather(pieces, x.contiguous(), group=group)\n',
            "        dist.all_gather(pieces, x.contiguous(), group=group)\n        ctx.pieces = pieces  # for the backward's shapes\n",
            'keeps tensors of its forward on ctx (ctx.pieces'),
    Mistake("9.2", "column-f-without-group", "template_tensor_parallel.py",  # trial 14 (b): was told f was missing before the product
            '        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)',
            '        y = F.linear(copy_to_tp(x), self.weight, self.bias)',
            "f's backward summed it over all 4 ranks"),
    Mistake("9.2", "row-split-f-without-group", "template_tensor_parallel.py",  # trial 14 (b): was told only that the gradient differs
            '            x = _split_last_dim(x, self.group)',
            '            r, k = dist.get_rank(self.group), x.shape[-1] // dist.get_world_size(self.group)\n            x = copy_to_tp(x)[..., r * k:(r + 1) * k]',
            'the f before the slice summed it over all 4 ranks'),
    Mistake("10.5", "sends-before-backward", "template_pipeline.py",  # caught
            "    if stage.is_last:\n        output.backward()\n    else:\n        output.backward(stage.recv_backward(output.shape, output.dtype))\n    if not stage.is_first:\n        stage.send_backward(input.grad)\n",
            "    if not stage.is_first:\n        stage.send_backward(input.grad)\n    if stage.is_last:\n        output.backward()\n    else:\n        output.backward(stage.recv_backward(output.shape, output.dtype))\n",
            "once output.backward(...) has run"),
    Mistake("10.5", "sends-back-from-the-last-stage-only", "template_pipeline.py",  # right on 2 stages: a hang on 4, named
            "    if not stage.is_first:\n        stage.send_backward(input.grad)\n",
            "    if stage.is_last:\n        stage.send_backward(input.grad)\n",
            "stage.send_backward(input.grad)) on every stage but the first"),
    Mistake("10.5", "input-gradient-by-autograd-grad", "template_pipeline.py",  # was told an activation was detached
            "        output.backward(stage.recv_backward(output.shape, output.dtype))\n    if not stage.is_first:\n        stage.send_backward(input.grad)\n",
            "        grad = stage.recv_backward(output.shape, output.dtype)\n        if not stage.is_first:\n            (input_grad,) = torch.autograd.grad(output, input, grad)\n            stage.send_backward(input_grad)\n            return\n        output.backward(grad)\n        return\n    if not stage.is_first:\n        stage.send_backward(input.grad)\n",
            "its backward never put it into this stage's parameters' .grad"),
    Mistake("10.5", "zeroes-input-grad-after-sending", "template_pipeline.py",  # was told 'micro-batch 0's share alone'
            "    if not stage.is_first:\n        stage.send_backward(input.grad)\n",
            "    if not stage.is_first:\n        stage.send_backward(input.grad)\n        input.grad.zero_()  # sent: this stage is done with it\n",
            "was changed before the step's wait_sends()"),
    Mistake("10.6", "backwards-newest-first", "template_pipeline.py",  # caught
            "    for i in range(num_microbatches):\n        backward_step(stage, *saved[i])\n        saved[i] = None  # its activations are no longer needed\n        trace.append((\"B\", i))\n",
            "    for i in reversed(range(num_microbatches)):\n        backward_step(stage, *saved[i])\n        saved[i] = None  # its activations are no longer needed\n        trace.append((\"B\", i))\n",
            "the backwards run in the order [1, 0]"),
    Mistake("10.6", "no-wait-sends", "template_pipeline.py",  # caught
            "    stage.wait_sends()\n    return loss, trace\n    # --- Task 10.6 end ---",
            "    return loss, trace\n    # --- Task 10.6 end ---",
            "end it with stage.wait_sends()"),
    Mistake("10.6", "keeps-activations-on-the-stage", "template_pipeline.py",  # passed: the trace and numbers right
            "    trace, saved, loss = [], [], None\n    for i in range(num_microbatches):\n        input, output = forward_step(stage, xs[i], ys[i], loss_fn, num_microbatches)\n        saved.append((input, output))\n        trace.append((\"F\", i))\n        if stage.is_last:\n            loss = output.detach() if loss is None else loss + output.detach()\n    for i in range(num_microbatches):\n        backward_step(stage, *saved[i])\n        saved[i] = None  # its activations are no longer needed\n",
            "    trace, loss = [], None\n    stage.saved = []  # the step's (input, output) pairs, on the stage\n    for i in range(num_microbatches):\n        input, output = forward_step(stage, xs[i], ys[i], loss_fn, num_microbatches)\n        stage.saved.append((input, output))\n        trace.append((\"F\", i))\n        if stage.is_last:\n            loss = output.detach() if loss is None else loss + output.detach()\n    for i in range(num_microbatches):\n        backward_step(stage, *stage.saved[i])\n",
            "after the step returned, 1 of the M micro-batches' outputs"),
    Mistake("10.6", "loss-of-the-last-micro-batch-only", "template_pipeline.py",  # was a bare difference of losses
            "        if stage.is_last:\n            loss = output.detach() if loss is None else loss + output.detach()\n",
            "        if stage.is_last:\n            loss = output.detach()\n",
            "micro-batch 1's loss alone, scaled by 1/M"),
    Mistake("10.7", "trace-b-with-forward-index", "template_pipeline.py",  # caught
            "    for i in range(warmup, num_microbatches):\n        forward(i)\n        backward()\n",
            "    for i in range(warmup, num_microbatches):\n        forward(i)\n        backward()\n        trace[-1] = (\"B\", i)\n",
            "backwards [1, 1]"),
    Mistake("10.7", "cool-down-newest-first", "template_pipeline.py",  # caught
            "    while next_backward < num_microbatches:\n        backward()\n",
            "    while saved:  # the cool-down: the last forwards' backwards\n        backward_step(stage, *saved.pop())\n        trace.append((\"B\", next_backward))\n        next_backward += 1\n",
            "paired with the wrong micro-batch's activations"),
    # Task 11: BatchNorm across ranks (issue 33)
    Mistake("11.1", "local-statistics", "template_batchnorm.py",  # no communication at all
            "    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)  # the one collective\n", "",
            "this rank's slice only"),
    Mistake("11.1", "means-averaged-as-if-equal", "template_batchnorm.py",
            "n * mean, m2 + n * mean ** 2])\n    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)  # the one collective\n"
            "    count = packed[0]\n    total, squares = packed[1:].chunk(2)\n    global_mean = total / count\n",
            "mean, m2 + n * mean ** 2])\n    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)\n"
            "    count = packed[0]\n    total, squares = packed[1:].chunk(2)\n"
            "    global_mean = total / dist.get_world_size(group)\n", "the same size"),
    Mistake("11.1", "variances-averaged", "template_batchnorm.py",  # forgets the spread of the ranks' means
            "n * mean, m2 + n * mean ** 2])\n    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)  # the one collective\n"
            "    count = packed[0]\n    total, squares = packed[1:].chunk(2)\n    global_mean = total / count\n"
            "    global_var = (squares / count - global_mean ** 2).clamp(min=0)\n",
            "n * mean, m2])\n    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)\n"
            "    count = packed[0]\n    total, squares = packed[1:].chunk(2)\n    global_mean = total / count\n"
            "    global_var = squares / count  # the ranks' variances, weighted by their counts\n",
            "spread of the means"),
    Mistake("11.1", "unbiased-for-normalising", "template_batchnorm.py",
            "    global_var = (squares / count - global_mean ** 2).clamp(min=0)\n",
            "    global_var = ((squares - count * global_mean ** 2) / (count - 1)).clamp(min=0)\n", "UNBIASED"),
    Mistake("11.1", "naive-float32-variance", "template_batchnorm.py",  # E[x^2] - E[x]^2 in x's dtype
            "    packed = torch.cat([torch.tensor([float(n)], dtype=torch.float64, device=x.device), n * mean, "
            "m2 + n * mean ** 2])\n",
            "    packed = torch.cat([torch.tensor([float(n)], dtype=x.dtype), x.sum(dims), (x * x).sum(dims)])\n",
            "cancels"),
    Mistake("11.1", "empty-rank-skips-the-collective", "template_batchnorm.py",  # the others hang
            "    dims = _reduce_dims(x)\n",
            "    dims = _reduce_dims(x)\n    if x.shape[0] == 0:  # nothing to add\n"
            "        return torch.zeros(x.shape[1], dtype=x.dtype), torch.zeros(x.shape[1], dtype=x.dtype), 0\n",
            "a hang in global_batch_stats"),
    Mistake("11.1", "local-count", "template_batchnorm.py",
            "global_var.to(x.dtype), int(count.item())", "global_var.to(x.dtype), n", "this rank's own count"),
    Mistake("11.2", "backward-without-all-reduce", "template_batchnorm.py",
            "            dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=ctx.group)  # the global sums\n", "",
            "exact only on one rank"),
    Mistake("11.2", "all-reduces-dy", "template_batchnorm.py",
            "            packed = torch.cat([sum_dy, sum_dy_xhat])\n"
            "            dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=ctx.group)  # the global sums\n"
            "            global_dy, global_dy_xhat = packed.chunk(2)\n",
            "            total = grad_y.clone()\n            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)\n"
            "            global_dy, global_dy_xhat = total.sum(dims), (total * x_hat).sum(dims)\n", "not of dy itself"),
    Mistake("11.2", "weight-gradient-all-reduced-too", "template_batchnorm.py",  # and again by data parallelism
            "            grad_weight = sum_dy_xhat  # this rank's: data parallelism averages it\n",
            "            grad_weight = global_dy_xhat\n", "times too large"),
    Mistake("11.2", "calls-f-batch-norm", "template_batchnorm.py",
            "        y = x_hat\n", "        y = torch.nn.functional.batch_norm(x, mean, var, None, None, False, 0.0, eps)\n",
            "no PyTorch BatchNorm function"),
    Mistake("11.3", "biased-running-var", "template_batchnorm.py",
            "self.running_var.mul_(1 - m).add_(m * var * count / (count - 1))",
            "self.running_var.mul_(1 - m).add_(m * var)", "UNBIASED"),
    Mistake("11.3", "local-count-in-running-var", "template_batchnorm.py",
            "self.running_var.mul_(1 - m).add_(m * var * count / (count - 1))",
            "self.running_var.mul_(1 - m).add_(m * var * (x.numel() // x.shape[1]) / (x.numel() // x.shape[1] - 1))",
            "own count"),
    Mistake("11.3", "running-stats-updated-in-eval", "template_batchnorm.py",
            "            invstd = torch.rsqrt(self.running_var + self.eps)\n",
            "            self.running_mean.mul_(0.9).add_(0.1 * x.mean(_reduce_dims(x)))\n"
            "            invstd = torch.rsqrt(self.running_var + self.eps)\n", "must not change the running statistics"),
    Mistake("11.3", "collective-in-eval", "template_batchnorm.py",  # without running statistics: the global batch's
            "            var, mean = torch.var_mean(x, dim=_reduce_dims(x), correction=0)\n",
            "            mean, var, _ = global_batch_stats(x, self.process_group)\n", "nothing is sent in eval mode"),
    Mistake("11.3", "convert-forgets-num-batches-tracked", "template_batchnorm.py",
            "            converted.num_batches_tracked = module.num_batches_tracked\n", "", "num_batches_tracked"),
    # found by planting held-out-style wrong answers (branch t11trial)
    Mistake("11.1", "ranks-m2-unbiased", "template_batchnorm.py",  # torch.var_mean's default correction=1
            "        var, mean = torch.var_mean(x, dim=dims, correction=0)\n",
            "        var, mean = torch.var_mean(x, dim=dims)\n", "n / (n - 1)"),
    Mistake("11.1", "empty-slice-gives-nan", "template_batchnorm.py",
            "    if n > 0:\n", "    if True:  # var_mean of an empty slice is NaN\n", "NaN, from the empty slice"),
    Mistake("11.1", "count-of-samples", "template_batchnorm.py",  # N, not N * H * W
            "    n = x.numel() // x.shape[1]  # this rank's elements per channel\n", "    n = x.shape[0]\n",
            "the number of samples"),
    Mistake("11.2", "eps-outside-sqrt", "template_batchnorm.py",
            "        invstd = torch.rsqrt(var + eps)\n", "        invstd = 1 / (torch.sqrt(var) + eps)\n",
            "outside the square root"),
    Mistake("11.2", "weight-and-bias-swapped", "template_batchnorm.py",
            "            y = y * _per_channel(weight, x)\n        if bias is not None:\n            y = y + _per_channel(bias, x)\n",
            "            y = y * _per_channel(bias, x)\n        if bias is not None:\n            y = y + _per_channel(weight, x)\n",
            "swapped"),
    Mistake("11.2", "backward-without-the-variance-term", "template_batchnorm.py",
            "                      - x_hat * _per_channel(global_dy_xhat / ctx.count, grad_y))", "                      )",
            "the variance depends on x too"),
    Mistake("11.2", "backward-all-reduce-ignores-the-group", "template_batchnorm.py",
            "            dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=ctx.group)  # the global sums\n",
            "            dist.all_reduce(packed, op=dist.ReduceOp.SUM)\n", "group=ctx.group"),
    Mistake("11.2", "weight-none-with-affine-false", "template_batchnorm.py",
            "            scale = invstd if weight is None else invstd * weight\n", "            scale = invstd * weight\n",
            "with affine=False, weight and bias are None"),
    Mistake("11.3", "momentum-the-other-way-round", "template_batchnorm.py",
            "                    self.running_mean.mul_(1 - m).add_(m * mean)\n",
            "                    self.running_mean.mul_(m).add_((1 - m) * mean)\n", "the other way round"),
    Mistake("11.3", "momentum-none-as-0.1", "template_batchnorm.py",
            "                m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum\n",
            "                m = self.momentum or 0.1\n", "cumulative average"),
    Mistake("11.3", "running-stats-of-this-rank", "template_batchnorm.py",
            "                    self.running_mean.mul_(1 - m).add_(m * mean)\n"
            "                    self.running_var.mul_(1 - m).add_(m * var * count / (count - 1))\n",
            "                    lv, lm = torch.var_mean(x.detach(), dim=_reduce_dims(x), correction=1)\n"
            "                    self.running_mean.mul_(1 - m).add_(m * lm)\n"
            "                    self.running_var.mul_(1 - m).add_(m * lv)\n", "statistics of this rank's slice"),
    Mistake("11.3", "eval-without-running-stats-uses-them", "template_batchnorm.py",
            "        if not self.training and self.track_running_stats:  # eval: the running statistics, nothing sent\n",
            "        if not self.training:\n", "running_mean and running_var are None"),
    Mistake("11.3", "empty-slice-returns-early", "template_batchnorm.py",  # the others would hang
            "        else:\n            mean, var, count = global_batch_stats(x.detach(), self.process_group)\n",
            "        elif x.shape[0] == 0:\n            return x * 1.0\n"
            "        else:\n            mean, var, count = global_batch_stats(x.detach(), self.process_group)\n",
            "the training forward sent nothing"),
    Mistake("11.3", "process-group-ignored", "template_batchnorm.py",
            "            mean, var, count = global_batch_stats(x.detach(), self.process_group)\n",
            "            mean, var, count = global_batch_stats(x.detach())\n", "pass self.process_group"),
    Mistake("11.3", "x-detached-into-the-function", "template_batchnorm.py",
            "            return SyncBatchNormFunction.apply(x, self.weight",
            "            return SyncBatchNormFunction.apply(x.detach(), self.weight", "not x.detach()"),
    Mistake("11.3", "convert-copies-buffers-into-float32", "template_batchnorm.py",
            "            converted.running_mean = module.running_mean\n            converted.running_var = module.running_var\n",
            "            if module.track_running_stats:\n                converted.running_mean.copy_(module.running_mean)\n"
            "                converted.running_var.copy_(module.running_var)\n", "float64 model"),
    Mistake("11.3", "convert-returns-the-original", "template_batchnorm.py",
            "        return converted\n        # --- Task 11.3 end ---", "        return module\n        # --- Task 11.3 end ---",
            "must come back converted"),
    # issue 45, a held-out-style trial of Tasks 11-13 (branch trial-11-13): wrong answers that passed, or were
    # told a wrong cause, a bare diff or a raw exception
    Mistake("11.2", "backward-sums-averaged", "template_batchnorm.py",  # the AVG op: the sums / N
            "            dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=ctx.group)  # the global sums\n",
            "            dist.all_reduce(packed, op=dist.ReduceOp.AVG, group=ctx.group)\n", "not summed"),
    Mistake("11.2", "gradient-for-a-none-weight", "template_batchnorm.py",  # affine=False: autograd refuses it
            "        if weight is not None and ctx.needs_input_grad[1]:\n", "        if True:\n",
            "None for an input that is None"),
    Mistake("11.2", "empty-slice-skips-backward", "template_batchnorm.py",  # the others wait in its all-reduce
            "        x_hat, invstd, weight = ctx.saved_tensors\n",
            "        x_hat, invstd, weight = ctx.saved_tensors\n        if grad_y.shape[0] == 0:\n"
            "            return torch.zeros_like(grad_y), None if weight is None else torch.zeros_like(weight), "
            "None if weight is None else torch.zeros_like(weight), None, None, None, None, None\n",
            "a hang in backward"),
    Mistake("11.3", "running-stats-updated-without-tracking", "template_batchnorm.py",  # they are None
            "            if self.track_running_stats:\n                self.num_batches_tracked.add_(1)\n",
            "            if True:\n                self.num_batches_tracked.add_(1)\n",
            "in training, there are no running statistics to update"),
    # Task 11, trial 6 (2026-11-29): buffers in float32 for float64 inputs, inputs changed in place, a list sized by the world
    Mistake("11.1", "packed-in-float32", "template_batchnorm.py",  # was told to sum the ranks' sums
            "    packed = torch.cat([torch.tensor([float(n)], dtype=torch.float64, device=x.device), n * mean, m2 + n * mean ** 2])\n",
            "    packed = torch.zeros(1 + 2 * x.shape[1])\n    packed[0] = n\n    packed[1:1 + x.shape[1]] = n * mean\n    packed[1 + x.shape[1]:] = m2 + n * mean ** 2\n",
            "to float32's precision only, for float64 slices"),
    Mistake("11.1", "all-gather-by-world-size", "template_batchnorm.py",  # was gloo's raw list-length error
            "    packed = torch.cat([torch.tensor([float(n)], dtype=torch.float64, device=x.device), n * mean, m2 + n * mean ** 2])\n    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)  # the one collective\n",
            "    local = torch.cat([torch.tensor([float(n)], dtype=torch.float64, device=x.device), n * mean, m2 + n * mean ** 2])\n    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]\n    dist.all_gather(gathered, local, group=group)\n    packed = torch.stack(gathered).sum(0)\n",
            "one per rank of the group it runs over"),
    Mistake("11.2", "backward-grad-y-in-place", "template_batchnorm.py",  # passed
            "            grad_x = (grad_y - _per_channel(global_dy / ctx.count, grad_y)\n                      - x_hat * _per_channel(global_dy_xhat / ctx.count, grad_y)) * _per_channel(scale, grad_y)\n",
            "            grad_x = grad_y.sub_(_per_channel(global_dy / ctx.count, grad_y)).sub_(\n                x_hat * _per_channel(global_dy_xhat / ctx.count, grad_y)).mul_(_per_channel(scale, grad_y))\n",
            "backward changed the incoming gradient grad_y in place"),
    Mistake("11.2", "forward-centres-x-in-place", "template_batchnorm.py",  # passed
            "        x_hat = (x - _per_channel(mean, x)) * _per_channel(invstd, x)\n",
            "        x_hat = x.sub_(_per_channel(mean, x)) * _per_channel(invstd, x)\n",
            "forward changed its input x in place"),
    Mistake("11.2", "packed-sums-in-float32", "template_batchnorm.py",  # was a bare difference
            "            packed = torch.cat([sum_dy, sum_dy_xhat])\n",
            "            packed = torch.zeros(2 * sum_dy.numel())\n            packed[:sum_dy.numel()], packed[sum_dy.numel():] = sum_dy, sum_dy_xhat\n",
            "to float32's precision only"),
    Mistake("11.3", "eval-normalises-x-in-place", "template_batchnorm.py",  # was told to give x to SyncBatchNormFunction
            "            y = (x - _per_channel(self.running_mean, x)) * _per_channel(invstd, x)\n",
            "            y = x.detach().sub_(_per_channel(self.running_mean, x)).mul_(_per_channel(invstd, x))\n",
            "in eval the output does not depend on x"),
    Mistake("11.3", "running-stats-float32", "template_batchnorm.py",  # was a bare difference
            "                with torch.no_grad():\n",
            "                mean, var = mean.float(), var.float()\n                with torch.no_grad():\n",
            "in a float64 layer: the statistics or the running buffers were made or sent in float32"),
    # Task 11, trial 6: a saved tensor changed in backward, x changed in place in eval
    Mistake("11.2", "backward-scales-saved-x-hat-in-place", "template_batchnorm.py",  # was told the output differs
            "                      - x_hat * _per_channel(global_dy_xhat / ctx.count, grad_y)) * _per_channel(scale, grad_y)\n",
            "                      - x_hat.mul_(_per_channel(global_dy_xhat / ctx.count, grad_y))) * _per_channel(scale, grad_y)\n",
            "backward changed forward's output y in place"),
    Mistake("11.3", "eval-centres-x-in-place", "template_batchnorm.py",  # was torch's raw leaf-Variable error
            "            y = (x - _per_channel(self.running_mean, x)) * _per_channel(invstd, x)\n",
            "            y = x.sub_(_per_channel(self.running_mean, x)).mul_(_per_channel(invstd, x))\n",
            "never change it in place"),
    # Task 11, helper-a (2026-11-29): a frozen weight or bias (requires_grad=False), which the tests never built
    Mistake("11.3", "frozen-weight-passed-as-none", "template_batchnorm.py",  # passed: the output lost its scale
            "            return SyncBatchNormFunction.apply(x, self.weight, self.bias,",
            "            weight = self.weight if self.weight is not None and self.weight.requires_grad else None\n"
            "            return SyncBatchNormFunction.apply(x, weight, self.bias,", "a frozen weight still scales"),
    Mistake("11.3", "eval-skips-a-frozen-affine", "template_batchnorm.py",  # passed
            "        if self.weight is not None:\n            y = y * _per_channel(self.weight, x)",
            "        if self.weight is not None and self.weight.requires_grad:\n            y = y * _per_channel(self.weight, x)",
            "a frozen weight still scales"),
    Mistake("11.3", "frozen-weight-detaches-the-bias-too", "template_batchnorm.py",  # passed: bias.grad None
            "            return SyncBatchNormFunction.apply(x, self.weight, self.bias,",
            "            weight, bias = self.weight, self.bias\n"
            "            if weight is not None and not weight.requires_grad:\n"
            "                weight, bias = weight.detach(), bias.detach()\n"
            "            return SyncBatchNormFunction.apply(x, weight, bias,", "bias.grad is None after backward"),
    Mistake("11.2", "bias-gradient-under-the-weights-flag", "template_batchnorm.py",  # passed: a frozen weight
            "        if ctx.needs_input_grad[2]:\n            grad_bias = sum_dy",
            "        if ctx.needs_input_grad[1]:\n            grad_bias = sum_dy", "the bias got no gradient"),
    Mistake("11.2", "input-gradient-unscaled-for-a-frozen-weight", "template_batchnorm.py",  # passed
            "            scale = invstd if weight is None else invstd * weight",
            "            scale = invstd * weight if ctx.needs_input_grad[1] else invstd",
            "not on whether the weight needs a gradient"),
    Mistake("11.2", "forward-skips-a-frozen-weight", "template_batchnorm.py",  # passed
            "        if weight is not None:\n            y = y * _per_channel(weight, x)",
            "        if weight is not None and weight.requires_grad:\n            y = y * _per_channel(weight, x)",
            "a frozen weight still scales"),
    Mistake("11.3", "running-stats-keep-the-graph", "template_batchnorm.py",  # was autograd's raw "a second time"
            "            mean, var, count = global_batch_stats(x.detach(), self.process_group)\n"
            "            if self.track_running_stats:\n"
            "                self.num_batches_tracked.add_(1)\n"
            "                m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum\n"
            "                with torch.no_grad():\n"
            "                    self.running_mean.mul_(1 - m).add_(m * mean)\n"
            "                    self.running_var.mul_(1 - m).add_(m * var * count / (count - 1))\n",
            "            mean, var, count = global_batch_stats(x, self.process_group)\n"
            "            if self.track_running_stats:\n"
            "                self.num_batches_tracked.add_(1)\n"
            "                m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum\n"
            "                self.running_mean = (1 - m) * self.running_mean + m * mean\n"
            "                self.running_var = (1 - m) * self.running_var + m * var * count / (count - 1)\n",
            "they hold autograd's graph"),
    Mistake("11.3", "layer-keeps-its-input", "template_batchnorm.py",  # helper a's trial: passed (what stays alive)
            "            mean, var, count = global_batch_stats(x.detach(), self.process_group)\n",
            "            self.last_input = x\n"
            "            mean, var, count = global_batch_stats(x.detach(), self.process_group)\n", "stayed alive after"),
    Mistake("11.3", "layer-keeps-every-input-detached", "template_batchnorm.py",  # the same, through memory shared
            "            mean, var, count = global_batch_stats(x.detach(), self.process_group)\n",
            "            self.inputs = getattr(self, 'inputs', []) + [x.detach()]\n"
            "            mean, var, count = global_batch_stats(x.detach(), self.process_group)\n", "stayed alive after"),
    Mistake("11.3", "running-var-count-as-equal-slices", "template_batchnorm.py",  # was the formula alone
            "                    self.running_var.mul_(1 - m).add_(m * var * count / (count - 1))",
            "                    n = x.numel() // x.shape[1] * dist.get_world_size()\n"
            "                    self.running_var.mul_(1 - m).add_(m * var * n / (n - 1))", "as if every slice were the same size"),
    Mistake("11.3", "frozen-parameters-made-trainable", "template_batchnorm.py",  # passed
            "        self._check_input_dim(x)\n        # --- Task 11.3 begin ---\n",
            "        self._check_input_dim(x)\n        # --- Task 11.3 begin ---\n"
            "        if self.weight is not None:\n            self.weight.requires_grad_(True)\n"
            "            self.bias.requires_grad_(True)\n", "a frozen parameter gets no gradient"),
    # Task 12: gradient compression hooks (template_compression.py)
    Mistake("12.1", "divides-after-the-sum", "template_compression.py",  # fp16: the sum of 3 ranks overflows
            "    compressed = buffer.to(dtype).div_(group.size())\n\n    def decompress(future):\n"
            "        buffer.copy_(future.value()[0])\n",
            "    compressed = buffer.to(dtype)\n\n    def decompress(future):\n"
            "        buffer.copy_(future.value()[0] / group.size())\n", "before the all-reduce"),
    Mistake("12.1", "forgets-the-divide", "template_compression.py",
            "buffer.to(dtype).div_(group.size())", "buffer.to(dtype)", "not the mean"),
    Mistake("12.1", "divides-by-the-world-size", "template_compression.py",  # right until a group is a subgroup
            "buffer.to(dtype).div_(group.size())", "buffer.to(dtype).div_(dist.get_world_size())", "its size"),
    Mistake("12.1", "returns-before-the-all-reduce", "template_compression.py",  # DDP would read unsummed numbers
            "    return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)\n",
            "    dist.all_reduce(compressed, group=group, async_op=True)\n    future = torch.futures.Future()\n"
            "    future.set_result([compressed])\n    return future.then(decompress)\n", "before the all-reduce finished"),
    Mistake("12.2", "no-subtraction", "template_compression.py",
            "            rest -= torch.sum(col * rest, dim=0, keepdim=True) * col\n", "            pass\n",
            "not orthonormal"),
    Mistake("12.3", "compresses-1-d-tensors", "template_compression.py",
            "        if n * m > r * (n + m) * state.min_compression_rate:",
            "        if n * m > r * (n + m) * state.min_compression_rate or tensor.dim() == 1:", "sent whole"),
    Mistake("12.3", "no-error-feedback", "template_compression.py",  # the residual stays zero
            "            state.error_dict[index] = wanted - buffer\n", "            pass\n", "error feedback"),
    Mistake("12.3", "feedback-added-twice", "template_compression.py",
            "            buffer.add_(state.error_dict[index])\n",
            "            buffer.add_(state.error_dict[index])\n            buffer.add_(state.error_dict[index])\n",
            "error feedback"),
    Mistake("12.3", "q-not-orthogonalised", "template_compression.py",
            "    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n", "",
            "Q was not orthogonalised"),
    Mistake("12.3", "unseeded-first-qs", "template_compression.py",  # each rank draws its own Qs
            "            torch.manual_seed(state.rng.randint(1_000_000_000))\n", "", "draw the same first Qs"),
    Mistake("12.3", "p-but-not-q", "template_compression.py",
            "    return dist.all_reduce(state.q_memory_dict[index], group=group, async_op=True).get_future().then(decompress)\n",
            "    future = torch.futures.Future()\n    future.set_result(None)\n    return future.then(decompress)\n",
            "but not Q"),
    Mistake("12.3", "one-residual-for-every-bucket", "template_compression.py",  # kept across tensors of other shapes
            "            buffer.add_(state.error_dict[index])\n",
            "            buffer.add_(next(iter(state.error_dict.values())))\n", "per bucket"),
    Mistake("12.3", "warm-start-from-p", "template_compression.py",  # Q = M^T P_old: last step's P, not its Q
            "    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n",
            "    if not new_qs:\n        for (matrix, _), p, q in zip(matrices, ps, qs):\n"
            "            torch.matmul(matrix.T, p, out=q)\n"
            "    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n", "warm start"),
    Mistake("12.3", "returns-before-the-all-reduce", "template_compression.py",
            "    return dist.all_reduce(state.q_memory_dict[index], group=group, async_op=True).get_future().then(decompress)\n",
            "    dist.all_reduce(state.q_memory_dict[index], group=group, async_op=True)\n"
            "    future = torch.futures.Future()\n    future.set_result(None)\n    return future.then(decompress)\n",
            "before the all-reduce finished"),
    # Task 12, held-out trial (issue 34; issue 32's classes): blocking, dtypes, signs, counting, aliasing
    Mistake("12.1", "blocking-all-reduce", "template_compression.py",  # right values, nothing overlaps
            "    return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)\n",
            "    dist.all_reduce(compressed, group=group)\n    buffer.copy_(compressed)\n"
            "    future = torch.futures.Future()\n    future.set_result(buffer)\n    return future\n",
            "was blocking (async_op=False)"),
    Mistake("12.1", "casts-back-to-float32", "template_compression.py",  # right on float32 models only
            "        buffer.copy_(future.value()[0])\n        return buffer\n",
            "        return future.value()[0].float()\n", "on a torch.float64 bucket the Future held torch.float32"),
    Mistake("12.2", "qr-signs", "template_compression.py",  # the same span, columns of either sign
            "    num_cols = matrix.shape[1]\n    for i in range(num_cols):\n",
            "    matrix.copy_(torch.linalg.qr(matrix).Q)\n    num_cols = 0\n    for i in range(num_cols):\n",
            "up to their SIGNS"),
    Mistake("12.2", "ignores-epsilon", "template_compression.py",
            "keepdim=True) + epsilon", "keepdim=True)", "add epsilon to the norm"),
    Mistake("12.2", "column-copied", "template_compression.py",  # the division never reaches the matrix
            "        col = matrix[:, i:i + 1]\n", "        col = matrix[:, i:i + 1].clone()\n", "not a copy"),
    Mistake("12.3", "starts-one-step-late", "template_compression.py",  # off by one in counting the steps
            "    if state.iter < state.start_powerSGD_iter:", "    if state.iter <= state.start_powerSGD_iter:",
            "compression starts at step start_powerSGD_iter"),
    Mistake("12.3", "one-all-reduce-per-whole-tensor", "template_compression.py",  # right values, more messages
            "        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n"
            "        dist.all_reduce(flat, group=group)\n"
            "        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n"
            "            tensor.copy_(mean.view_as(tensor))\n",
            "        for tensor in whole:\n            dist.all_reduce(tensor, group=group)\n"
            "            tensor.div_(world_size)\n", "one flat tensor, one all-reduce"),
    Mistake("12.3", "p-all-reduce-not-waited", "template_compression.py",  # P used before it is summed
            "    dist.all_reduce(state.p_memory_dict[index], group=group)  #",
            "    dist.all_reduce(state.p_memory_dict[index], group=group, async_op=True)  #", "not waited for"),
    Mistake("12.3", "q-sum-not-mean", "template_compression.py",
            "        state.q_memory_dict[index].div_(world_size)\n", "", "divide Q's sum by N"),
    Mistake("12.3", "no-fork-rng", "template_compression.py",  # reseeds the training's random numbers
            "        with torch.random.fork_rng(devices=[]):\n", "        if True:\n", "fork_rng"),
    Mistake("12.3", "float32-p-and-q", "template_compression.py",  # fails on a float64 model
            "        state.p_memory_dict[index] = torch.empty(sum(mat.shape[0] * r for mat, r in matrices), dtype=dtype,",
            "        state.p_memory_dict[index] = torch.empty(sum(mat.shape[0] * r for mat, r in matrices), "
            "dtype=torch.float32,", "the bucket's dtype"),
    Mistake("12.3", "compresses-at-the-boundary", "template_compression.py",
            "        if n * m > r * (n + m) * state.min_compression_rate:",
            "        if n * m >= r * (n + m) * state.min_compression_rate:", "strictly"),
    Mistake("12.3", "rank-not-capped-by-the-shape", "template_compression.py",
            "        r = min(n, m, state.matrix_approximation_rank)", "        r = state.matrix_approximation_rank",
            "rank at most min(n, m)"),
    Mistake("12.3", "ignores-use-error-feedback", "template_compression.py",
            "    if state.use_error_feedback:\n        if index in state.error_dict:",
            "    if True:\n        if index in state.error_dict:", "use_error_feedback=False, but"),
    Mistake("12.3", "matrices-copied", "template_compression.py",  # M' written into a copy, not the buffer
            "            matrices.append((matrix, r))", "            matrices.append((matrix.clone(), r))",
            "still hold this rank's own gradients"),
    Mistake("12.3", "wanted-aliases-the-buffer", "template_compression.py",  # the residual is always zero
            "        wanted = buffer.detach().clone()", "        wanted = buffer", "(a copy, buffer.clone()"),
    # issue 45, the trial of Tasks 11-13 (branch trial-11-13)
    Mistake("12.1", "divides-before-the-cast", "template_compression.py",  # in float32: other roundings
            "    compressed = buffer.to(dtype).div_(group.size())\n", "    compressed = buffer.div_(group.size()).to(dtype)\n",
            "divided by the world size in its own dtype"),
    Mistake("12.2", "next-column-only", "template_compression.py",  # right for r = 2, wrong from r = 3
            "            rest = matrix[:, i + 1:]\n", "            rest = matrix[:, i + 1:i + 2]\n",
            "orthogonal to its neighbours only"),
    Mistake("12.3", "never-warm-starts", "template_compression.py",
            "    new_qs = not state.warm_start or index not in state.p_memory_dict\n", "    new_qs = True\n",
            "drew new Qs"),
    Mistake("12.3", "viewed-by-the-last-dimension", "template_compression.py",  # PyTorch views (shape[0], -1)
            "        matrix = tensor.view(tensor.shape[0], -1)\n", "        matrix = tensor.view(-1, tensor.shape[-1])\n",
            "viewed as (-1, shape[-1])"),
    # Task 12, trial 9 (2026-11-29): the op and the dtype sent, rows for columns, one all-reduce per P, the order of the all-reduces, state keyed by the GradBucket object, a collective over the world, steps counted at the first bucket, a warm start judged by any bucket's state
    Mistake("12.1", "op-avg", "template_compression.py",  # trial 9: named already; kept so
            "    compressed = buffer.to(dtype).div_(group.size())\n\n    def decompress(future):\n        buffer.copy_(future.value()[0])\n        return buffer\n\n    return dist.all_reduce(compressed, ",
            "    compressed = buffer.to(dtype)\n\n    def decompress(future):\n        buffer.copy_(future.value()[0])\n        return buffer\n\n    return dist.all_reduce(compressed, op=dist.ReduceOp.AVG, ",
            "an average op divides after the sum"),
    Mistake("12.1", "ignores-the-dtype", "template_compression.py",  # trial 9: was told to cast before sending
            "    compressed = buffer.to(dtype).div_(group.size())\n",
            "    compressed = buffer.half().div_(group.size())\n",
            "not to a dtype of your own"),
    Mistake("12.2", "rows-not-columns", "template_compression.py",  # trial 9: was told of an all-zero column
            "    num_cols = matrix.shape[1]\n    for i in range(num_cols):\n        col = matrix[:, i:i + 1]\n        col /= torch.linalg.vector_norm(col, dim=0, keepdim=True) + epsilon\n        if i + 1 < num_cols:\n            rest = matrix[:, i + 1:]\n            rest -= torch.sum(col * rest, dim=0, keepdim=True) * col",
            "    num_cols = matrix.shape[0]\n    for i in range(num_cols):\n        col = matrix[i:i + 1, :]\n        col /= torch.linalg.vector_norm(col, dim=1, keepdim=True) + epsilon\n        if i + 1 < num_cols:\n            rest = matrix[i + 1:, :]\n            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col",
            "the ROWS of the matrix"),
    Mistake("12.3", "a-p-all-reduce-per-matrix", "template_compression.py",  # trial 9: was told it compressed the wrong tensors
            "    dist.all_reduce(state.p_memory_dict[index], group=group)  #",
            "    for p in ps:\n        dist.all_reduce(p, group=group)\n    #",
            "the Ps went in"),
    Mistake("12.3", "state-keyed-by-the-grad-bucket", "template_compression.py",  # trial 9: was told of a residual's size only
            "    index, dtype = bucket.index(), buffer.dtype",
            "    index, dtype = id(bucket), buffer.dtype",
            "bucket.index()"),
    Mistake("12.3", "whole-tensors-over-the-world", "template_compression.py",  # trial 9: named already; kept so
            "        dist.all_reduce(flat, group=group)\n",
            "        dist.all_reduce(flat)\n",
            "not the process group the hook was given"),
    Mistake("12.3", "whole-after-p", "template_compression.py",  # trial 9: was a bare expected
            "    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n",
            "    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n",
            "the Ps were all-reduced before the tensors sent whole"),
    Mistake("12.3", "counts-at-the-first-bucket", "template_compression.py",  # trial 9: was told "not the buckets or the calls"
            "    if state.iter < state.start_powerSGD_iter:\n        state.maybe_increase_iter(bucket)\n        return allreduce_mean(group, buffer)\n    index, dtype = bucket.index(), buffer.dtype\n\n    wanted = None\n    if state.use_error_feedback:\n        if index in state.error_dict:\n            buffer.add_(state.error_dict[index])\n        else:\n            state.error_dict[index] = torch.zeros_like(buffer)\n        wanted = buffer.detach().clone()\n\n    matrices, whole = [], []\n    for tensor in bucket.gradients():\n        matrix = tensor.view(tensor.shape[0], -1)\n        n, m = matrix.shape\n        r = min(n, m, state.matrix_approximation_rank)\n        state.total_numel_before_compression += n * m\n        if n * m > r * (n + m) * state.min_compression_rate:\n            matrices.append((matrix, r))\n            state.total_numel_after_compression += r * (n + m)\n        else:\n            whole.append(tensor)\n            state.total_numel_after_compression += n * m\n\n    new_qs = not state.warm_start or index not in state.p_memory_dict\n    if new_qs:\n        state.p_memory_dict[index] = torch.empty(sum(mat.shape[0] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n        state.q_memory_dict[index] = torch.empty(sum(mat.shape[1] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n    ps, qs, p_at, q_at = [], [], 0, 0\n    for matrix, r in matrices:\n        n, m = matrix.shape\n        ps.append(state.p_memory_dict[index][p_at:p_at + n * r].view(n, r))\n        qs.append(state.q_memory_dict[index][q_at:q_at + m * r].view(m, r))\n        p_at, q_at = p_at + n * r, q_at + m * r\n    if new_qs:\n        with torch.random.fork_rng(devices=[]):\n            torch.manual_seed(state.rng.randint(1_000_000_000))\n            for q in qs:\n                q.copy_(torch.randn(*q.shape, device=\"cpu\", dtype=dtype))\n    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix, q, out=p)\n\n    # Every collective from this thread, in the same order on every rank: a collective started in a\n    # .then callback runs on the communication thread, where its order against the next bucket's\n    # differs between ranks (a hang; PyTorch's own hook does it, safe with one bucket only).\n    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix.T, p, out=q)\n\n    def decompress(future):\n        state.q_memory_dict[index].div_(world_size)\n        for (matrix, _), p, q in zip(matrices, ps, qs):\n            torch.matmul(p, q.T, out=matrix)\n        if state.use_error_feedback:\n            state.error_dict[index] = wanted - buffer\n        if not state.warm_start:  # this bucket's only: the others may still be in flight\n            del state.p_memory_dict[index], state.q_memory_dict[index]\n        state.maybe_increase_iter(bucket)\n        return buffer\n",
            "    if state.iter < state.start_powerSGD_iter:\n        if bucket.index() == 0:  # a step begins with its first bucket\n            state.iter += 1\n        return allreduce_mean(group, buffer)\n    index, dtype = bucket.index(), buffer.dtype\n\n    wanted = None\n    if state.use_error_feedback:\n        if index in state.error_dict:\n            buffer.add_(state.error_dict[index])\n        else:\n            state.error_dict[index] = torch.zeros_like(buffer)\n        wanted = buffer.detach().clone()\n\n    matrices, whole = [], []\n    for tensor in bucket.gradients():\n        matrix = tensor.view(tensor.shape[0], -1)\n        n, m = matrix.shape\n        r = min(n, m, state.matrix_approximation_rank)\n        state.total_numel_before_compression += n * m\n        if n * m > r * (n + m) * state.min_compression_rate:\n            matrices.append((matrix, r))\n            state.total_numel_after_compression += r * (n + m)\n        else:\n            whole.append(tensor)\n            state.total_numel_after_compression += n * m\n\n    new_qs = not state.warm_start or index not in state.p_memory_dict\n    if new_qs:\n        state.p_memory_dict[index] = torch.empty(sum(mat.shape[0] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n        state.q_memory_dict[index] = torch.empty(sum(mat.shape[1] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n    ps, qs, p_at, q_at = [], [], 0, 0\n    for matrix, r in matrices:\n        n, m = matrix.shape\n        ps.append(state.p_memory_dict[index][p_at:p_at + n * r].view(n, r))\n        qs.append(state.q_memory_dict[index][q_at:q_at + m * r].view(m, r))\n        p_at, q_at = p_at + n * r, q_at + m * r\n    if new_qs:\n        with torch.random.fork_rng(devices=[]):\n            torch.manual_seed(state.rng.randint(1_000_000_000))\n            for q in qs:\n                q.copy_(torch.randn(*q.shape, device=\"cpu\", dtype=dtype))\n    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix, q, out=p)\n\n    # Every collective from this thread, in the same order on every rank: a collective started in a\n    # .then callback runs on the communication thread, where its order against the next bucket's\n    # differs between ranks (a hang; PyTorch's own hook does it, safe with one bucket only).\n    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix.T, p, out=q)\n\n    def decompress(future):\n        state.q_memory_dict[index].div_(world_size)\n        for (matrix, _), p, q in zip(matrices, ps, qs):\n            torch.matmul(p, q.T, out=matrix)\n        if state.use_error_feedback:\n            state.error_dict[index] = wanted - buffer\n        if not state.warm_start:  # this bucket's only: the others may still be in flight\n            del state.p_memory_dict[index], state.q_memory_dict[index]\n        if bucket.index() == 0:\n            state.iter += 1\n        return buffer\n",
            "the step was counted at its FIRST bucket"),
    Mistake("12.3", "warm-start-checked-for-any-bucket", "template_compression.py",  # trial 9: was a raw KeyError
            "    new_qs = not state.warm_start or index not in state.p_memory_dict\n",
            "    new_qs = not state.warm_start or not state.p_memory_dict  # nothing kept yet\n",
            "when THIS bucket has none"),
    # Task 13 (parameter averaging, local SGD, DiLoCo; issue 35)
    Mistake("13.1", "sum-not-mean", "template_local_sgd.py",
            "            flat /= size\n", "", "summed, not averaged"),
    Mistake("13.1", "forgets-buffers", "template_local_sgd.py",
            "    all_reduce_mean(list(model.parameters()) + buffers, group)",
            "    all_reduce_mean(list(model.parameters()), group)", "floating-point buffers"),
    Mistake("13.1", "one-all-reduce-per-tensor", "template_local_sgd.py",  # right values, many collectives
            "            flat = torch.cat([tensor.reshape(-1) for tensor in same])\n",
            "            for tensor in same:\n                dist.all_reduce(tensor, group=group)\n"
            "                tensor /= size\n            continue\n"
            "            flat = torch.cat([tensor.reshape(-1) for tensor in same])\n", "one flat buffer"),
    Mistake("13.1", "default-group", "template_local_sgd.py",
            "dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)", "dist.all_reduce(flat, op=dist.ReduceOp.SUM)",
            "pass group=group"),
    Mistake("13.1", "divides-by-world-size", "template_local_sgd.py",
            "    size = dist.get_world_size(group)\n", "    size = dist.get_world_size()\n", "group's size"),
    Mistake("13.2", "averages-after-the-first-step", "template_local_sgd.py",  # PeriodicModelAverager's counting
            "        self.local_step += 1  # this step counts: the average comes after the H-th, not before it\n"
            "        if self.local_step >= self.sync_every:  # >=: sync_every may have been lowered below the count\n"
            "            average_parameters(self.model, self.group)\n"
            "            self.local_step = 0\n",
            "        if self.local_step % self.sync_every == 0:\n"
            "            average_parameters(self.model, self.group)\n"
            "        self.local_step += 1\n", "averaged after step 1"),
    Mistake("13.2", "never-resets-the-count", "template_local_sgd.py",
            "            average_parameters(self.model, self.group)\n            self.local_step = 0\n",
            "            average_parameters(self.model, self.group)\n", "the count was never set back to 0"),
    Mistake("13.2", "averages-gradients-too", "template_local_sgd.py",
            "        loss = self.optimizer.step(closure)\n",
            "        all_reduce_mean([p.grad for p in self.model.parameters() if p.grad is not None], self.group)\n"
            "        loss = self.optimizer.step(closure)\n", "gradients were averaged as well"),
    Mistake("13.3", "pseudo-gradient-sign", "template_local_sgd.py",
            "param.grad = synced.to(param.device) - param", "param.grad = param - synced.to(param.device)",
            "wrong sign"),
    Mistake("13.3", "outer-step-from-the-average", "template_local_sgd.py",
            "            for param, synced in zip(self.params, self.synced):\n"
            "                param.copy_(synced)  # the outer step starts where the round started\n",
            "            average_parameters(self.model, self.group)\n", "from the averaged parameters"),
    Mistake("13.3", "synced-before-the-outer-step", "template_local_sgd.py",
            "        self.outer_optimizer.step()  # its momentum persists: built once, in __init__\n"
            "        self.outer_optimizer.zero_grad()\n"
            "        for param, synced in zip(self.params, self.synced):\n"
            "            synced.copy_(param.detach())  # after the outer step: where the next round starts\n",
            "        for param, synced in zip(self.params, self.synced):\n"
            "            synced.copy_(param.detach())\n"
            "        self.outer_optimizer.step()\n"
            "        self.outer_optimizer.zero_grad()\n", "self.synced never moves"),
    Mistake("13.3", "outer-state-reset", "template_local_sgd.py",
            "        self.outer_optimizer.step()  # its momentum persists: built once, in __init__\n",
            "        self.outer_optimizer = torch.optim.SGD(self.params, **{key: self.outer_optimizer.defaults[key]\n"
            "                                               for key in (\"lr\", \"momentum\", \"nesterov\")})\n"
            "        self.outer_optimizer.step()\n", "outer optimizer's state"),
    Mistake("13.3", "inner-state-reset", "template_local_sgd.py",
            "        self.outer_optimizer.zero_grad()\n",
            "        self.outer_optimizer.zero_grad()\n        self.inner_optimizer.state.clear()\n",
            "inner optimizer's state was reset"),
    Mistake("13.3", "inner-state-averaged", "template_local_sgd.py",
            "        self.outer_optimizer.zero_grad()\n",
            "        self.outer_optimizer.zero_grad()\n"
            "        all_reduce_mean([value for state in self.inner_optimizer.state.values()\n"
            "                         for key, value in state.items() if key != \"step\"], self.group)\n",
            "inner optimizer's state was averaged"),
    # Task 13, found by a held-out trial (issue 35): one entry per class of mistake the tests now name
    Mistake("13.1", "dtypes-in-a-fixed-order", "template_local_sgd.py",  # a set's order is no better
            "        for dtype in dict.fromkeys(tensor.dtype for tensor in tensors):  # dicts keep the order of first appearance\n",
            "        for dtype in (torch.float32, torch.float64):\n"
            "            if not any(tensor.dtype == dtype for tensor in tensors):\n                continue\n",
            "in the order the dtypes first appear"),
    Mistake("13.1", "cat-converts-dtypes", "template_local_sgd.py",  # torch.cat promotes float32 to float64
            "        for dtype in dict.fromkeys(tensor.dtype for tensor in tensors):  # dicts keep the order of first appearance\n"
            "            same = [tensor for tensor in tensors if tensor.dtype == dtype]\n",
            "        if tensors:  # one buffer for them all\n            same = tensors\n", "torch.cat converted them"),
    Mistake("13.1", "skips-frozen-parameters", "template_local_sgd.py",
            "    all_reduce_mean(list(model.parameters()) + buffers, group)",
            "    all_reduce_mean([param for param in model.parameters() if param.requires_grad] + buffers, group)",
            "frozen ones too"),
    Mistake("13.1", "averages-integer-buffers", "template_local_sgd.py",
            "    buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]\n",
            "    buffers = list(model.buffers())\n", "integer buffers"),
    Mistake("13.1", "rebinds-instead-of-copying", "template_local_sgd.py",
            "                tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))\n",
            "                tensor = flat[offset:offset + tensor.numel()].view_as(tensor)\n", "rebinding a name"),
    Mistake("13.2", "averages-before-the-step", "template_local_sgd.py",
            "        loss = self.optimizer.step(closure)\n"
            "        self.local_step += 1  # this step counts: the average comes after the H-th, not before it\n"
            "        if self.local_step >= self.sync_every:  # >=: sync_every may have been lowered below the count\n"
            "            average_parameters(self.model, self.group)\n"
            "            self.local_step = 0\n",
            "        self.local_step += 1\n"
            "        if self.local_step >= self.sync_every:  # >=: sync_every may have been lowered below the count\n"
            "            average_parameters(self.model, self.group)\n"
            "            self.local_step = 0\n"
            "        loss = self.optimizer.step(closure)\n", "came before this step's inner optimizer step"),
    Mistake("13.2", "one-step-late", "template_local_sgd.py",
            "        if self.local_step >= self.sync_every:  # >=: sync_every may have been lowered below the count\n"
            "            average_parameters",
            "        if self.local_step > self.sync_every:\n            average_parameters", "synchronised after steps"),
    Mistake("13.2", "ignores-the-closure", "template_local_sgd.py",
            "        loss = self.optimizer.step(closure)\n", "        loss = self.optimizer.step()\n", "pass the closure"),
    Mistake("13.2", "group-not-passed", "template_local_sgd.py",
            "            average_parameters(self.model, self.group)\n            self.local_step = 0\n",
            "            average_parameters(self.model)\n            self.local_step = 0\n", "pass the group on"),
    Mistake("13.3", "synced-aliases-the-parameters", "template_local_sgd.py",  # on the CPU, detach() is no copy
            "        for param, synced in zip(self.params, self.synced):\n"
            "            synced.copy_(param.detach())  # after the outer step: where the next round starts\n",
            "        self.synced = [param.detach() for param in self.params]\n", "shares memory"),
    Mistake("13.3", "pseudo-gradient-subtracted-into-synced", "template_local_sgd.py",  # trial 6: a bare "off by"
            "param.grad = synced.to(param.device) - param", "param.grad = synced.to(param.device).sub_(param)",
            "written into self.synced in place"),
    Mistake("13.3", "forgets-buffers", "template_local_sgd.py",  # Task 13.3's own code: named as Task 13.3's
            "            all_reduce_mean([param.grad for param in self.params] + buffers, self.group)\n",
            "            all_reduce_mean([param.grad for param in self.params], self.group)\n", "floating-point buffers"),
    Mistake("13.3", "buffers-in-a-second-all-reduce", "template_local_sgd.py",
            "            all_reduce_mean([param.grad for param in self.params] + buffers, self.group)\n",
            "            all_reduce_mean([param.grad for param in self.params], self.group)\n"
            "            all_reduce_mean(buffers, self.group)\n", "ONE all_reduce_mean"),
    Mistake("13.3", "hand-written-outer-step", "template_local_sgd.py",  # SGD without its momentum
            "                param.copy_(synced)  # the outer step starts where the round started\n"
            "        self.outer_optimizer.step()  # its momentum persists: built once, in __init__\n"
            "        self.outer_optimizer.zero_grad()\n",
            "                param.copy_(synced - self.outer_optimizer.defaults[\"lr\"] * param.grad)\n"
            "                param.grad = None\n", "never stepped"),
    # held-out trials of Tasks 12 and 13 (notes/trial12, trial13): wrong answers once told only a generic cause
    Mistake("12.3", "q-from-unorthogonalised-p", "template_compression.py",
            "    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)\n"
            "    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix.T, p, out=q)\n",
            "    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix.T, p, out=q)\n"
            "    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)\n", "before P was orthogonalised"),
    Mistake("12.3", "a-seed-per-q", "template_compression.py",  # a bucket without Qs draws no seed
            "            torch.manual_seed(state.rng.randint(1_000_000_000))\n            for q in qs:\n",
            "            for q in qs:\n                torch.manual_seed(state.rng.randint(1_000_000_000))\n",
            "drew no seed for it"),
    Mistake("13.1", "offset-not-advanced", "template_local_sgd.py",
            "                offset += tensor.numel()\n", "", "copied from offset 0"),
    Mistake("13.1", "async-all-reduce-not-waited", "template_local_sgd.py",
            "            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)",
            "            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True)",
            "were never waited for"),
    Mistake("13.3", "pseudo-gradient-divided-by-h", "template_local_sgd.py",
            "                param.grad = synced.to(param.device) - param",
            "                param.grad = (synced.to(param.device) - param) / self.sync_every", "divided by sync_every"),
    Mistake("13.3", "pseudo-gradients-summed", "template_local_sgd.py",  # a bare dist.all_reduce per gradient
            "            all_reduce_mean([param.grad for param in self.params] + buffers, self.group)\n",
            "            for param in self.params:\n                dist.all_reduce(param.grad, group=self.group)\n"
            "            all_reduce_mean(buffers, self.group)\n", "summed over the ranks, not averaged"),
    Mistake("13.3", "grad-copied-into-none", "template_local_sgd.py",  # the frozen and unused parameters have none
            "                param.grad = synced.to(param.device) - param",
            "                param.grad.copy_(synced.to(param.device) - param)", "no gradient to write into"),
    Mistake("13.3", "synced-on-the-parameters-device", "template_local_sgd.py",  # a GPU's memory; seen on meta
            "        for param, synced in zip(self.params, self.synced):\n"
            "            synced.copy_(param.detach())  # after the outer step: where the next round starts\n",
            "        self.synced = [param.detach().clone() for param in self.params]\n", "not on the CPU"),
    # issue 45, the trial of Tasks 11-13 (branch trial-11-13)
    Mistake("13.1", "buffers-picked-by-name", "template_local_sgd.py",  # BatchNorm's only
            "    buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]\n",
            "    buffers = [buffer for name, buffer in model.named_buffers() if name.endswith((\"running_mean\", "
            "\"running_var\"))]\n", "picked by name"),
    Mistake("13.3", "pseudo-gradient-on-the-cpu", "template_local_sgd.py",  # right on CPUs, fails on a GPU
            "param.grad = synced.to(param.device) - param", "param.grad = synced - param.detach().cpu()",
            "computed on the CPU"),
    Mistake("13.3", "averages-integer-buffers", "template_local_sgd.py",  # num_batches_tracked: a raw cast error
            "            buffers = [buffer for buffer in self.model.buffers() if buffer.is_floating_point()]\n",
            "            buffers = list(self.model.buffers())\n", "an integer buffer"),
    Mistake("13.3", "outer-zero-grad-before-its-step", "template_local_sgd.py",  # the step sees no gradient
            "        self.outer_optimizer.step()  # its momentum persists: built once, in __init__\n"
            "        self.outer_optimizer.zero_grad()\n",
            "        self.outer_optimizer.zero_grad()\n        self.outer_optimizer.step()\n", "the outer step moved nothing"),
    Mistake("13.3", "never-resets-the-count", "template_local_sgd.py",
            "        self.local_step = 0\n        with torch.no_grad():\n", "        with torch.no_grad():\n",
            "never set back to 0"),
    # helper-a (2026-11-29): the buffers averaged over the world was told only as a split all-reduce (2 ranks, where
    # the world is the group); the group ignored by average_parameters was told to pass group= to dist.all_reduce
    Mistake("13.1", "buffers-averaged-over-the-world", "template_local_sgd.py",
            "    all_reduce_mean(list(model.parameters()) + buffers, group)\n",
            "    all_reduce_mean(list(model.parameters()), group)\n    all_reduce_mean(buffers)\n",
            "some collectives of average_parameters were not given the group"),
    Mistake("13.1", "buffers-all-reduced-alone-over-the-world", "template_local_sgd.py",
            "    all_reduce_mean(list(model.parameters()) + buffers, group)\n",
            "    all_reduce_mean(list(model.parameters()), group)\n    for buffer in buffers:\n"
            "        dist.all_reduce(buffer)\n        buffer /= dist.get_world_size()\n",
            "some collectives of average_parameters were not given the group"),
    Mistake("13.1", "average-parameters-drops-the-group", "template_local_sgd.py",
            "    all_reduce_mean(list(model.parameters()) + buffers, group)\n",
            "    all_reduce_mean(list(model.parameters()) + buffers)\n",
            "average_parameters' collectives were not given the group"),
    Mistake("13.1", "divides-by-two", "template_local_sgd.py",  # right on 2 ranks; was told to advance the offset
            "            flat /= size\n", "            flat /= 2\n", "divided by 2, where the group has 1 rank"),
    # helper-a (2026-11-29): a pseudo-gradient rounded through a lower precision was a bare "off by"
    Mistake("13.3", "pseudo-gradient-added-to-the-inner-gradient", "template_local_sgd.py",  # was a bare "off by"
            "                param.grad = synced.to(param.device) - param  # how far this rank went, as a gradient points\n",
            "                if param.grad is None:\n                    param.grad = synced.to(param.device) - param\n"
            "                else:\n                    param.grad += synced.to(param.device) - param\n",
            "added to the last inner step's gradient"),
    Mistake("13.3", "pseudo-gradient-rounded-through-bf16", "template_local_sgd.py",
            "            all_reduce_mean([param.grad for param in self.params] + buffers, self.group)\n",
            "            for param in self.params:\n"
            "                param.grad = param.grad.to(torch.bfloat16).to(param.dtype)\n"
            "            all_reduce_mean([param.grad for param in self.params] + buffers, self.group)\n",
            "went through bfloat16"),
    Mistake("13.3", "pseudo-gradient-all-reduced-in-bf16", "template_local_sgd.py",  # and the wire in two dtypes
            "            all_reduce_mean([param.grad for param in self.params] + buffers, self.group)\n",
            "            low = [param.grad.to(torch.bfloat16) for param in self.params]\n"
            "            all_reduce_mean(low + buffers, self.group)\n"
            "            for param, grad in zip(self.params, low):\n                param.grad.copy_(grad)\n",
            "went through bfloat16"),
    Mistake("13.3", "pseudo-gradient-rounded-through-float32", "template_local_sgd.py",  # off by 1e-9 only
            "                param.grad = synced.to(param.device) - param",
            "                param.grad = (synced.to(param.device) - param).float().to(param.dtype)",
            "went through float32"),
    # Task 14 (the transformer: tensor and sequence parallelism)
    Mistake("14.1", "contiguous-qkv-split", "template_sequence_parallel.py",  # rank 0 gets all of q
            "    attn.qkv = column.from_linear(regrouped, group)\n", "    attn.qkv = column.from_linear(attn.qkv, group)\n",
            "the contiguous split of its 3 * dim rows"),
    Mistake("14.1", "heads-not-divided", "template_sequence_parallel.py",  # attention over heads of the wrong width
            "    attn.heads //= size\n", "", "set attn.heads to the number of heads this rank holds"),
    Mistake("14.1", "uneven-heads-not-refused", "template_sequence_parallel.py",
            "    if attn.heads % size:\n        raise ValueError(", "    if False:\n        raise ValueError(",
            "ValueError naming the heads"),
    Mistake("14.1", "strided-head-features", "template_sequence_parallel.py",  # every N-th feature, not whole heads
            "    order = torch.arange(3 * dim).view(3, size, dim // size).transpose(0, 1).reshape(-1)",
            "    order = torch.arange(3 * dim).view(3, dim // size, size).permute(2, 0, 1).reshape(-1)",
            "whole heads of 4 features each"),
    Mistake("14.1", "proj-column-parallel", "template_sequence_parallel.py",  # a shape error in the rank, before
            "    attn.proj = row.from_linear(attn.proj, group)", "    attn.proj = column.from_linear(attn.proj, group)",
            "proj must be row-parallel"),
    Mistake("14.3", "keep-returns-the-whole-gradient", "template_sequence_parallel.py",  # a student trial's: was
            # told that gather_sequence's backward is a reduce-scatter, which the other branch is
            "        if not ctx.reduce:\n            return pieces[rank], None, None\n",
            "        if not ctx.reduce:\n            return grad, None, None\n",
            "with tensor_parallel_output_grad=False it returns this rank's slice"),
    Mistake("14.1", "regrouped-linear-in-the-default-dtype", "template_sequence_parallel.py",  # a student trial's:
            # the hint's "an nn.Linear with those rows", made float32 for float64 weights: equal values, half the bytes
            "    regrouped = nn.Linear(dim, 3 * dim, bias=attn.qkv.bias is not None, device=\"meta\")\n"
            "    regrouped.weight = nn.Parameter(attn.qkv.weight.detach()[order])\n"
            "    if attn.qkv.bias is not None:\n"
            "        regrouped.bias = nn.Parameter(attn.qkv.bias.detach()[order])\n",
            "    regrouped = nn.Linear(dim, 3 * dim, bias=attn.qkv.bias is not None)\n"
            "    with torch.no_grad():\n"
            "        regrouped.weight.copy_(attn.qkv.weight[order])\n"
            "        if attn.qkv.bias is not None:\n"
            "            regrouped.bias.copy_(attn.qkv.bias[order])\n",
            "a new nn.Linear (or tensor) is made in torch's default dtype"),
    Mistake("14.1", "qkv-rows-a-view-of-the-whole", "template_sequence_parallel.py",  # the right rows, all the memory
            "    regrouped = nn.Linear(dim, 3 * dim, bias=attn.qkv.bias is not None, device=\"meta\")\n"
            "    regrouped.weight = nn.Parameter(attn.qkv.weight.detach()[order])\n"
            "    if attn.qkv.bias is not None:\n"
            "        regrouped.bias = nn.Parameter(attn.qkv.bias.detach()[order])\n"
            "    attn.qkv = column.from_linear(regrouped, group)\n",
            "    weight = attn.qkv.weight.detach()[order].chunk(size, dim=0)[rank]\n"
            "    bias = None if attn.qkv.bias is None else attn.qkv.bias.detach()[order].chunk(size, dim=0)[rank]\n"
            "    attn.qkv = column(weight, bias, dim, 3 * dim, group)\n",
            "not a view of the whole weight"),
    Mistake("14.2", "mlp-ignores-sequence-parallel", "template_sequence_parallel.py",  # passed: 14.2 ran without SP only
            "    column, row = _layers(sequence_parallel)\n    mlp.fc1",
            "    column, row = ColumnParallelLinear, RowParallelLinear\n    mlp.fc1", "passing the flag on"),
    Mistake("14.3", "gather-backward-all-gathers", "template_sequence_parallel.py",  # gather and reduce-scatter swapped
            "        out = torch.empty_like(pieces[rank])\n"
            "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=ctx.group)\n        return out, None, None\n",
            "        gathered = [torch.empty_like(grad) for _ in range(size)]\n"
            "        dist.all_gather(gathered, grad.contiguous(), group=ctx.group)\n"
            "        return torch.cat(gathered, dim=1), None, None\n", "gather_sequence's backward is a reduce-scatter"),
    Mistake("14.3", "strided-shards", "template_sequence_parallel.py",  # shards taken in the wrong order
            "        pieces = [piece.contiguous() for piece in x.chunk(size, dim=1)]\n",
            "        pieces = [x[:, r::size].contiguous() for r in range(size)]\n", "the shards are contiguous"),
    Mistake("14.3", "keep-slice-ignored", "template_sequence_parallel.py",
            "        if not ctx.reduce:\n            return pieces[rank], None, None\n", "",
            "keep this rank's slice, no collective"),
    Mistake("14.3", "uneven-tokens-not-refused", "template_sequence_parallel.py",
            "        if x.shape[1] % size:\n            raise ValueError(f\"reduce_scatter_sequence:",
            "        if False:\n            raise ValueError(f\"reduce_scatter_sequence:", "ValueError naming the tokens"),
    Mistake("14.3", "gather-default-group", "template_sequence_parallel.py",  # passed: the tests had no sub-group
            "        dist.all_gather(pieces, x.contiguous(), group=group)\n        return torch.cat(pieces, dim=1)",
            "        dist.all_gather(pieces, x.contiguous())\n        return torch.cat(pieces, dim=1)",
            "not over the 2 of the group it was given"),
    Mistake("14.4", "row-bias-before-reduce-scatter", "template_sequence_parallel.py",  # the bias counted T times
            "        y = reduce_scatter_sequence(F.linear(x, self.weight), self.group)\n"
            "        return y if self.bias is None else y + self.bias  # after the sum, on this rank's tokens: once\n",
            "        return reduce_scatter_sequence(F.linear(x, self.weight, self.bias), self.group)\n",
            "before the reduce-scatter; add it once, after"),
    Mistake("14.4", "f-kept-after-the-gather", "template_sequence_parallel.py",  # x's gradient summed twice
            "        return F.linear(x, self.weight, self.bias)  # no f: the gather's backward already sums x's gradient\n",
            "        return F.linear(copy_to_tp(x, self.group), self.weight, self.bias)\n",
            "no f in the sequence-parallel column layer"),
    Mistake("14.4", "mlp-input-not-gathered", "template_sequence_parallel.py",  # a shape error at the residual, before
            "        for module in (block.attn, block.mlp):", "        for module in (block.attn,):",
            "attn and mlp EACH get the whole sequence"),
    Mistake("14.5", "one-all-reduce-a-parameter", "template_sequence_parallel.py",  # a student trial's: was a raw list
            "    for same in by_dtype.values():\n"
            "        flat = torch.cat([param.grad.reshape(-1) for param in same])\n"
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n"
            "        for param, summed in zip(same, flat.split([param.grad.numel() for param in same])):\n"
            "            param.grad.copy_(summed.view_as(param.grad))\n",
            "    for same in by_dtype.values():\n"
            "        for param in same:\n"
            "            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)\n",
            "flatten them into one buffer"),
    Mistake("14.5", "norms-not-summed", "template_sequence_parallel.py",
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n", "", "was left as it was"),
    Mistake("14.5", "norms-averaged", "template_sequence_parallel.py",
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n",
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n        flat /= dist.get_world_size(group)\n",
            "became the mean over the ranks"),
    Mistake("14.5", "norms-summed-twice", "template_sequence_parallel.py",
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n",
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n"
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n", "all-reduced twice"),
    Mistake("14.5", "sharded-parameters-summed", "template_sequence_parallel.py",  # every parameter of the block
            "        for module in block.modules():\n            if isinstance(module, nn.LayerNorm):\n",
            "        params.update({id(p): p for p in block.parameters()})\n"
            "        for module in block.modules():\n            if isinstance(module, nn.LayerNorm):\n",
            "never sum a sharded parameter's gradient"),
    Mistake("14.5", "every-layernorm-summed", "template_sequence_parallel.py",  # the final norm too: T times
            "        if not getattr(block, \"sequence_parallel\", False):\n            continue\n", "",
            "outside any sequence-parallel block"),
    Mistake("14.5", "last-gather-reduce-scatters", "template_sequence_parallel.py",  # tensor_parallel_output_grad
            "gather_sequence(args[0], tp_group, tensor_parallel_output_grad=False)", "gather_sequence(args[0], tp_group)",
            "tensor_parallel_output_grad=False"),
    Mistake("14.5", "first-split-without-f", "template_sequence_parallel.py",  # the embedding's gradient partial
            "model.blocks[0].register_forward_pre_hook(lambda module, args: (split_sequence(args[0], tp_group),))",
            "model.blocks[0].register_forward_pre_hook(lambda module, args: "
            "(args[0].chunk(dist.get_world_size(tp_group), dim=1)[dist.get_rank(tp_group)],))", "no f before the slice"),
    # Task 14, trial A (caught, but the message did not name the cause)
    Mistake("14.3", "gather-work-never-waited", "template_sequence_parallel.py",  # read before it ends: a race
            "dist.all_gather(pieces, x.contiguous(), group=group)\n        return torch.cat(pieces, dim=1)",
            "dist.all_gather(pieces, x.contiguous(), group=group, async_op=True)\n        return torch.cat(pieces, dim=1)",
            "never waited on its Work"),
    Mistake("14.3", "gather-waited-after-the-cat", "template_sequence_parallel.py",  # was a bare difference (a race)
            "dist.all_gather(pieces, x.contiguous(), group=group)\n        return torch.cat(pieces, dim=1)",
            "work = dist.all_gather(pieces, x.contiguous(), group=group, async_op=True)\n"
            "        out = torch.cat(pieces, dim=1)\n        work.wait()\n        return out",
            "before waiting on its Work"),
    Mistake("14.5", "sum-work-never-waited", "template_sequence_parallel.py",  # was "left as it was": a missing sum
            "dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)",
            "dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True)",
            "never waited on its Work"),
    Mistake("14.5", "gather-after-the-norm", "template_sequence_parallel.py",  # the norm sees this rank's tokens
            "        model.norm.register_forward_pre_hook(\n"
            "            lambda module, args: (gather_sequence(args[0], tp_group, tensor_parallel_output_grad=False),))",
            "        model.norm.register_forward_hook(\n"
            "            lambda module, args, out: gather_sequence(out, tp_group, tensor_parallel_output_grad=False))",
            "the final norm saw only this rank's tokens"),
    Mistake("14.5", "split-hook-on-the-module-list", "template_sequence_parallel.py",  # a ModuleList is never called
            "model.blocks[0].register_forward_pre_hook(", "model.blocks.register_forward_pre_hook(",
            "that hook never runs"),
    Mistake("14.5", "gather-before-the-last-block", "template_sequence_parallel.py",  # was told to sum in the sync
            "        model.norm.register_forward_pre_hook(\n",
            "        model.blocks[-1].register_forward_pre_hook(\n", "the tokens were gathered before it"),
    Mistake("14.5", "first-split-missing", "template_sequence_parallel.py",  # the other reading of a whole block input
            "        model.blocks[0].register_forward_pre_hook(lambda module, args: (split_sequence(args[0], tp_group),))\n",
            "", "either the split never ran or a gather undid it"),
    Mistake("14.2", "mlp-over-the-world", "template_sequence_parallel.py",  # trial 6: passed (14.2 had no sub-group)
            "    mlp.fc1 = column.from_linear(mlp.fc1, group)\n"
            "    mlp.fc2 = row.from_linear(mlp.fc2, group)\n",
            "    mlp.fc1 = column.from_linear(mlp.fc1)\n"
            "    mlp.fc2 = row.from_linear(mlp.fc2)\n",
            "not over the 2 of the group it was given"),
    Mistake("14.3", "keep-slice-by-global-rank", "template_sequence_parallel.py",  # trial 6: was a raw IndexError
            "        rank, size = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)\n",
            "        rank, size = dist.get_rank(), dist.get_world_size(ctx.group)\n",
            "not this rank's place in the group"),
    Mistake("14.3", "gather-buffers-in-the-default-dtype", "template_sequence_parallel.py",  # trial 6: was gloo's raw ValueError
            "        pieces = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]\n",
            "        pieces = [torch.empty(x.shape) for _ in range(dist.get_world_size(group))]\n",
            "make the buffers with the input's dtype"),
    Mistake("14.3", "rs-backward-cat-along-dim-0", "template_sequence_parallel.py",  # trial 6: was told it ran the same collective again
            "        return torch.cat(pieces, dim=1), None\n",
            "        return torch.cat(pieces), None\n",
            "concatenated the ranks' gradients along dim 0"),
    Mistake("14.3", "gather-saves-its-input", "template_sequence_parallel.py",  # trial 6: passed
            "        ctx.group, ctx.reduce = group, tensor_parallel_output_grad\n",
            "        ctx.group, ctx.reduce = group, tensor_parallel_output_grad\n        ctx.save_for_backward(x)\n",
            "keeps its input alive after the forward"),
    Mistake("14.3", "reduce-scatter-keeps-its-input-on-ctx", "template_sequence_parallel.py",
            "        ctx.group = group\n        size = dist.get_world_size(group)\n",
            "        ctx.group, ctx.x = group, x\n        size = dist.get_world_size(group)\n",
            "the whole (B, S, dim) sequence held until the backward"),
    Mistake("14.3", "rs-by-all-reduce", "template_sequence_parallel.py",  # trial 6: a bare list of calls
            "        pieces = [piece.contiguous() for piece in x.chunk(size, dim=1)]\n"
            "        out = torch.empty_like(pieces[0])\n"
            "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group)\n"
            "        return out\n",
            "        total = x.clone()\n"
            "        dist.all_reduce(total, group=group)\n"
            "        return total.chunk(size, dim=1)[dist.get_rank(group)].contiguous()\n",
            "all-reduced the whole sequence, then kept its slice"),
    Mistake("14.3", "gather-backward-by-all-reduce", "template_sequence_parallel.py",
            "        out = torch.empty_like(pieces[rank])\n"
            "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=ctx.group)\n"
            "        return out, None, None\n",
            "        total = grad.clone()\n"
            "        dist.all_reduce(total, group=ctx.group)\n"
            "        return total.chunk(size, dim=1)[rank].contiguous(), None, None\n",
            "all-reduced the whole sequence, then kept its slice"),
    Mistake("14.4", "row-bias-on-rank-0-only", "template_sequence_parallel.py",  # trial 6: a bare difference
            "        return y if self.bias is None else y + self.bias  # after the sum, on this rank's tokens: once\n",
            "        return y if self.bias is None or dist.get_rank(self.group) != 0 else y + self.bias\n",
            "each adds the bias, once"),
    Mistake("14.5", "summed-in-float32", "template_sequence_parallel.py",  # trial 6: a bare list of calls
            "        flat = torch.cat([param.grad.reshape(-1) for param in same])\n",
            "        flat = torch.cat([param.grad.reshape(-1) for param in same]).float()\n",
            "sent the float64 gradients as float32"),
    Mistake("14.5", "missing-gradient-not-skipped", "template_sequence_parallel.py",  # trial 6: was a raw AttributeError
            "        if param.grad is not None:\n"
            "            by_dtype.setdefault(param.grad.dtype, []).append(param)\n",
            "        by_dtype.setdefault(param.grad.dtype, []).append(param)\n",
            "parameters without .grad are skipped"),
    Mistake("14.5", "sync-over-the-world", "template_sequence_parallel.py",  # trial 6: named already; kept so
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n",
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM)\n",
            "not over the 2 of the group it was given"),
    Mistake("14.4", "block-gather-keeps-the-slice", "template_sequence_parallel.py",  # trial 6: named already
            "(gather_sequence(args[0], group), *args[1:])",
            "(gather_sequence(args[0], group, tensor_parallel_output_grad=False), *args[1:])",
            "must reduce-scatter the gradient in backward"),
    Mistake("14.4", "gather-hooks-on-qkv-and-fc1", "template_sequence_parallel.py",  # trial 6: named already
            "        for module in (block.attn, block.mlp):",
            "        for module in (block.attn.qkv, block.mlp.fc1):",
            "attn and mlp EACH get the whole sequence"),
    Mistake("14.5", "missing-gradient-as-zeros", "template_sequence_parallel.py",  # trial 6: named already
            "        if param.grad is not None:\n"
            "            by_dtype.setdefault(param.grad.dtype, []).append(param)\n",
            "        if param.grad is None:\n"
            "            param.grad = torch.zeros_like(param)\n"
            "        by_dtype.setdefault(param.grad.dtype, []).append(param)\n",
            "must keep None"),
    # Task 14, trial 8 (A)
    Mistake("14.1", "rows-by-tp-size", "template_sequence_parallel.py",  # trial 8: passed: 4 heads over 2 ranks are 2 a rank, as many as ranks
            "    order = torch.arange(3 * dim).view(3, size, dim // size).transpose(0, 1).reshape(-1)\n"
            "    regrouped = nn.Linear(dim, 3 * dim, bias=attn.qkv.bias is not None, device=\"meta\")\n"
            "    regrouped.weight = nn.Parameter(attn.qkv.weight.detach()[order])\n"
            "    if attn.qkv.bias is not None:\n"
            "        regrouped.bias = nn.Parameter(attn.qkv.bias.detach()[order])\n"
            "    attn.qkv = column.from_linear(regrouped, group)\n",
            "    head_dim, local = dim // attn.heads, attn.heads // size\n"
            "    rows = torch.cat([torch.arange(part * dim + rank * size * head_dim, part * dim + (rank + 1) * size * head_dim)\n"
            "                      for part in range(3)])\n"
            "    bias = None if attn.qkv.bias is None else attn.qkv.bias.detach()[rows].clone()\n"
            "    attn.qkv = column(attn.qkv.weight.detach()[rows].clone(), bias, dim, 3 * dim, group)\n",
            "whole heads of 2 features each"),
    Mistake("14.1", "regrouped-by-heads-per-rank", "template_sequence_parallel.py",  # trial 8: passed: the same coincidence, in the regrouping
            "    order = torch.arange(3 * dim).view(3, size, dim // size).transpose(0, 1).reshape(-1)\n",
            "    order = torch.arange(3 * dim).view(3, attn.heads // size, -1).transpose(0, 1).reshape(-1)\n",
            "whole heads of 2 features each"),
    Mistake("14.1", "heads-set-to-the-tp-size", "template_sequence_parallel.py",  # trial 8: passed: the same coincidence, in attn.heads
            "    attn.heads //= size\n",
            "    attn.heads = size\n",
            "set attn.heads to the number of heads this rank holds"),
    Mistake("14.1", "attn-returns-none", "template_sequence_parallel.py",  # trial 8: was a raw AttributeError
            "    attn.heads //= size\n"
            "    return attn\n",
            "    attn.heads //= size\n",
            "returned None, not the module it was given"),
    Mistake("14.1", "attn-split-a-copy", "template_sequence_parallel.py",  # trial 8: passed: parallelize_block ignores the return value
            "    column, row = _layers(sequence_parallel)\n"
            "    dim = attn.proj.in_features\n",
            "    column, row = _layers(sequence_parallel)\n"
            "    import copy\n"
            "    attn = copy.deepcopy(attn)  # leave the caller's module as it was\n"
            "    dim = attn.proj.in_features\n",
            "returned another Attention object"),
    Mistake("14.2", "mlp-returns-none", "template_sequence_parallel.py",  # trial 8: was a raw AttributeError
            "    mlp.fc2 = row.from_linear(mlp.fc2, group)\n"
            "    return mlp\n",
            "    mlp.fc2 = row.from_linear(mlp.fc2, group)\n",
            "returned None, not the module it was given"),
    Mistake("14.4", "row-rs-default-group", "template_sequence_parallel.py",  # trial 8: passed: the blocks ran solutions/' layers
            "        y = reduce_scatter_sequence(F.linear(x, self.weight), self.group)",
            "        y = reduce_scatter_sequence(F.linear(x, self.weight))",
            "not over the 2 of the group it was given"),
    Mistake("14.4", "gather-hook-on-block", "template_sequence_parallel.py",  # trial 8: was a raw size mismatch at the residual
            "        for module in (block.attn, block.mlp):\n"
            "            module.register_forward_pre_hook(lambda module, args: (gather_sequence(args[0], group), *args[1:]))\n",
            "        block.register_forward_pre_hook(lambda module, args: (gather_sequence(args[0], group), *args[1:]))\n",
            "not of the block"),
    Mistake("14.4", "hooks-without-sp", "template_sequence_parallel.py",  # trial 8: was a raw size mismatch at the residual
            "    if sequence_parallel:\n"
            "        for module in (block.attn, block.mlp):\n",
            "    if True:\n"
            "        for module in (block.attn, block.mlp):\n",
            "without sequence parallelism every rank holds the whole sequence"),
    Mistake("14.4", "row-bias-rank0-before-rs", "template_sequence_parallel.py",  # trial 8: was "the bias got no gradient"
            "        y = reduce_scatter_sequence(F.linear(x, self.weight), self.group)\n"
            "        return y if self.bias is None else y + self.bias  # after the sum, on this rank's tokens: once\n",
            "        bias = self.bias if dist.get_rank(self.group) == 0 else None  # summed once by the reduce-scatter\n"
            "        return reduce_scatter_sequence(F.linear(x, self.weight, bias), self.group)\n",
            "added on another rank only"),
    Mistake("14.4", "row-all-reduce-then-slice", "template_sequence_parallel.py",  # trial 8: was told dist.all_reduce has no backward
            "        y = reduce_scatter_sequence(F.linear(x, self.weight), self.group)\n"
            "        return y if self.bias is None else y + self.bias  # after the sum, on this rank's tokens: once\n",
            "        rank, size = dist.get_rank(self.group), dist.get_world_size(self.group)\n"
            "        return super().forward(x).chunk(size, dim=1)[rank]\n",
            "zero on the others"),
    Mistake("14.1", "qkv-bias-left-fresh", "template_sequence_parallel.py",  # trial 8: was "holds (24,), not its part (24,)"
            "    regrouped = nn.Linear(dim, 3 * dim, bias=attn.qkv.bias is not None, device=\"meta\")\n"
            "    regrouped.weight = nn.Parameter(attn.qkv.weight.detach()[order])\n"
            "    if attn.qkv.bias is not None:\n"
            "        regrouped.bias = nn.Parameter(attn.qkv.bias.detach()[order])\n",
            "    regrouped = nn.Linear(dim, 3 * dim, dtype=attn.qkv.weight.dtype)\n"
            "    regrouped.weight.data = attn.qkv.weight.detach()[order].clone()\n",
            "copy the weight AND the bias"),
    Mistake("14.1", "qkv-regrouped-in-float64", "template_sequence_parallel.py",  # trial 8: passed: every case was float64
            "    regrouped = nn.Linear(dim, 3 * dim, bias=attn.qkv.bias is not None, device=\"meta\")\n"
            "    regrouped.weight = nn.Parameter(attn.qkv.weight.detach()[order])\n"
            "    if attn.qkv.bias is not None:\n"
            "        regrouped.bias = nn.Parameter(attn.qkv.bias.detach()[order])\n",
            "    regrouped = nn.Linear(dim, 3 * dim, dtype=torch.float64)  # the tests said: not the default dtype\n"
            "    with torch.no_grad():\n"
            "        regrouped.weight.copy_(attn.qkv.weight[order])\n"
            "        regrouped.bias.copy_(attn.qkv.bias[order])\n",
            "or in the dtype written out"),
    Mistake("14.2", "fc1-gathers-fc2-splits", "template_sequence_parallel.py",  # trial 8: right values; was a bare list of calls
            "    mlp.fc1 = column.from_linear(mlp.fc1, group)\n"
            "    mlp.fc2 = row.from_linear(mlp.fc2, group)\n",
            "    mlp.fc1 = column.from_linear(mlp.fc1, group, gather_output=True)  # the GELU sees every hidden feature\n"
            "    mlp.fc2 = row.from_linear(mlp.fc2, group, input_is_parallel=False)\n",
            "a pair needs neither"),
    Mistake("14.5", "row-biases-not-summed", "template_sequence_parallel.py",  # trial 8: caught and named already; kept so
            "            elif getattr(module, \"split_dim\", None) == 1 and module.bias is not None:",
            "            elif False:  # the LayerNorms only",
            "proj.bias's gradient was left as it was"),
    Mistake("14.5", "one-all-reduce-in-float64", "template_sequence_parallel.py",  # trial 8: was a bare list of calls
            "    for same in by_dtype.values():\n"
            "        flat = torch.cat([param.grad.reshape(-1) for param in same])\n"
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n"
            "        for param, summed in zip(same, flat.split([param.grad.numel() for param in same])):\n"
            "            param.grad.copy_(summed.view_as(param.grad))\n",
            "    same = [param for params in by_dtype.values() for param in params]\n"
            "    if same:  # one message: every gradient as float64, no precision lost\n"
            "        flat = torch.cat([param.grad.reshape(-1).double() for param in same])\n"
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n"
            "        for param, summed in zip(same, flat.split([param.grad.numel() for param in same])):\n"
            "            param.grad.copy_(summed.view_as(param.grad))\n",
            "one buffer, and one all-reduce, per dtype"),
    Mistake("14.5", "sync-checks-the-class", "template_sequence_parallel.py",  # trial 8: caught and named already; kept so
            "        if not getattr(block, \"sequence_parallel\", False):\n"
            "            continue\n",
            "        if type(block).__name__ != \"Block\":\n"
            "            continue\n",
            "outside any sequence-parallel block"),
    Mistake("14.3", "gather-backward-two-outputs", "template_sequence_parallel.py",  # trial 8: was PyTorch's bare "incorrect number of gradients"
            "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=ctx.group)\n"
            "        return out, None, None",
            "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=ctx.group)\n"
            "        return out, None",
            "one value per input of its forward"),
    Mistake("14.3", "keep-path-two-outputs", "template_sequence_parallel.py",  # trial 8: the same, on the tensor_parallel_output_grad=False path only
            "            return pieces[rank], None, None",
            "            return pieces[rank], None",
            "one value per input of its forward"),
    # Task 14, 16.5, trial 13 (2026-11-30): what stays alive (ctx, a kept layer), the into-tensor collectives on (B, S, dim), aliased buffers, the gather's place, the router
    Mistake("14.4", "gather-before-the-norms", "template_sequence_parallel.py",  # trial 13: passed (right values, the norms on every token)
            "        for module in (block.attn, block.mlp):\n",
            "        for module in (block.norm1, block.norm2):\n",
            "received the whole sequence"),
    Mistake("14.3", "gather-pieces-one-buffer-repeated", "template_sequence_parallel.py",  # trial 13: was a bare difference
            "        pieces = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]\n",
            "        pieces = [torch.empty_like(x, memory_format=torch.contiguous_format)] * dist.get_world_size(group)\n",
            "the pieces given to all_gather are ONE tensor"),
    Mistake("14.3", "rs-backward-pieces-one-buffer-repeated", "template_sequence_parallel.py",  # trial 13: was a bare difference
            "        pieces = [torch.empty_like(grad, memory_format=torch.contiguous_format) for _ in range(size)]\n",
            "        pieces = [torch.empty_like(grad, memory_format=torch.contiguous_format)] * size\n",
            "the pieces given to all_gather are ONE tensor"),
    Mistake("14.3", "reduce-scatter-tensor-flat", "template_sequence_parallel.py",  # trial 13: was a bare difference
            "        pieces = [piece.contiguous() for piece in x.chunk(size, dim=1)]\n"
            "        out = torch.empty_like(pieces[0])\n"
            "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group)\n"
            "        return out\n",
            "        out = x.new_empty((x.shape[0], x.shape[1] // size, *x.shape[2:]))\n"
            "        dist.reduce_scatter_tensor(out.view(-1), x.contiguous().view(-1), op=dist.ReduceOp.SUM, group=group)\n"
            "        return out\n",
            "pieces of the sequence's memory, not its tokens"),
    Mistake("14.3", "reduce-scatter-tensor-along-the-batch", "template_sequence_parallel.py",  # trial 13: was gloo's raw check
            "        pieces = [piece.contiguous() for piece in x.chunk(size, dim=1)]\n"
            "        out = torch.empty_like(pieces[0])\n"
            "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group)\n"
            "        return out\n",
            "        out = x.new_empty((x.shape[0], x.shape[1] // size, *x.shape[2:]))\n"
            "        dist.reduce_scatter_tensor(out, x.contiguous(), op=dist.ReduceOp.SUM, group=group)\n"
            "        return out\n",
            "reduce_scatter_tensor cuts its input along dim 0"),
    Mistake("14.3", "gather-into-tensor-flat", "template_sequence_parallel.py",  # trial 13: was a bare difference
            "        pieces = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]\n"
            "        dist.all_gather(pieces, x.contiguous(), group=group)\n"
            "        return torch.cat(pieces, dim=1)\n",
            "        size = dist.get_world_size(group)\n"
            "        out = x.new_empty((x.shape[0], x.shape[1] * size, *x.shape[2:]))\n"
            "        dist.all_gather_into_tensor(out.view(-1), x.contiguous().view(-1), group=group)\n"
            "        return out\n",
            "all_gather_into_tensor concatenates along dim 0"),
    Mistake("14.3", "gather-pieces-kept-on-ctx", "template_sequence_parallel.py",  # trial 13: passed (only the input was looked for)
            "        dist.all_gather(pieces, x.contiguous(), group=group)\n        return torch.cat(pieces, dim=1)\n",
            "        dist.all_gather(pieces, x.contiguous(), group=group)\n"
            "        ctx.pieces = pieces  # the backward's buffers, made once\n"
            "        return torch.cat(pieces, dim=1)\n",
            "keeps ctx.pieces on ctx"),
    Mistake("14.1", "attn-gathers-its-own-input", "template_sequence_parallel.py",  # trial 13: was told to gather at attn's input, which it did
            "    attn.heads //= size\n    return attn\n",
            "    attn.heads //= size\n"
            "    if sequence_parallel:  # the column-parallel layer needs the whole sequence\n"
            "        attn.register_forward_pre_hook(lambda module, args: (gather_sequence(args[0], group),))\n"
            "    return attn\n",
            "the sequence was gathered twice"),
    Mistake("14.4", "gather-inside-the-column-layer", "template_sequence_parallel.py",  # trial 13: was a raw size mismatch
            "        return F.linear(x, self.weight, self.bias)  # no f: the gather's backward already sums x's gradient\n",
            "        return F.linear(gather_sequence(x, self.group), self.weight, self.bias)\n",
            "it gathered again"),
    Mistake("14.1", "whole-qkv-kept-as-an-attribute", "template_sequence_parallel.py",  # trial 13: passed (only the unsplit names were compared)
            "    attn.qkv = column.from_linear(regrouped, group)\n",
            "    attn.unsplit_qkv = attn.qkv  # to put the rows back together later\n"
            "    attn.qkv = column.from_linear(regrouped, group)\n",
            "holds parameters the unsplit one has not"),
    Mistake("14.1", "qkv-bias-split-as-it-lies", "template_sequence_parallel.py",  # trial 13: caught and named already; kept so
            "        regrouped.bias = nn.Parameter(attn.qkv.bias.detach()[order])\n",
            "        regrouped.bias = nn.Parameter(attn.qkv.bias.detach().clone())\n",
            "the bias regrouped as the weight"),
    Mistake("14.2", "fc1-sliced-by-global-rank", "template_sequence_parallel.py",  # trial 13: caught (slow grid test); the hint now names get_rank(group)
            "    mlp.fc1 = column.from_linear(mlp.fc1, group)\n",
            "    rank, size = dist.get_rank(), dist.get_world_size(group)\n"
            "    mlp.fc1 = column(mlp.fc1.weight.detach().chunk(size)[rank].clone(),\n"
            "                     mlp.fc1.bias.detach().chunk(size)[rank].clone(), mlp.fc1.in_features, mlp.fc1.out_features, group)\n",
            "dist.get_rank(group)"),
    Mistake("14.3", "reduce-scatter-out-in-float64", "template_sequence_parallel.py",  # trial 13: passed (every case was float64)
            "        out = torch.empty_like(pieces[0])\n        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group)\n",
            "        out = torch.empty(pieces[0].shape, dtype=torch.float64)\n        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group)\n",
            "a dtype written out"),
    Mistake("14.3", "gather-cat-in-float64", "template_sequence_parallel.py",  # trial 13: passed (every case was float64)
            "        return torch.cat(pieces, dim=1)\n        # --- Task 14.3 end ---\n",
            "        return torch.cat(pieces, dim=1).to(torch.float64)\n        # --- Task 14.3 end ---\n",
            "not float32"),
    Mistake("14.5", "blocks-among-the-children", "template_sequence_parallel.py",  # trial 13: was told to sum them, which it did, one level up
            "    for block in model.modules():\n        if not getattr(block, \"sequence_parallel\", False):",
            "    for block in model.children():\n        if not getattr(block, \"sequence_parallel\", False):",
            "at any depth, not model.children()"),
    Mistake("14.5", "only-the-last-handle-waited", "template_sequence_parallel.py",  # trial 13: caught and named already; kept so
            "    for same in by_dtype.values():\n"
            "        flat = torch.cat([param.grad.reshape(-1) for param in same])\n"
            "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n",
            "    work = None\n"
            "    for same in by_dtype.values():\n"
            "        flat = torch.cat([param.grad.reshape(-1) for param in same])\n"
            "        if work is not None:\n"
            "            work.wait()\n"
            "        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True)\n",
            "never waited on its Work"),
    Mistake("16.5", "sent-in-float32", "template_experts.py",  # trial 13: was a bare "differ, ratio [1.0000000007]"
            "            flat = torch.cat([g.reshape(-1) for g in grads])\n",
            "            flat = torch.cat([g.reshape(-1) for g in grads]).float()  # half the bytes on the wire\n",
            "to float32's precision only"),
    Mistake("14.5", "sync-sent-in-float32", "template_sequence_parallel.py",  # trial 13: caught and named already; kept so
            "        flat = torch.cat([param.grad.reshape(-1) for param in same])\n",
            "        flat = torch.cat([param.grad.reshape(-1) for param in same]).float()  # half the bytes on the wire\n",
            "sent the float64 gradients as float32"),
    Mistake("14.4", "row-bias-through-f", "template_sequence_parallel.py",  # trial 13: was told the bias went before the reduce-scatter
            "        return y if self.bias is None else y + self.bias  # after the sum, on this rank's tokens: once\n",
            "        return y if self.bias is None else y + copy_to_tp(self.bias, self.group)  # its gradient summed over the ranks\n",
            "summed over the ranks inside the layer"),
    Mistake("14.1", "proj-bias-divided", "template_sequence_parallel.py",  # trial 13: was told it was never copied (random initialisation)
            "    attn.proj = row.from_linear(attn.proj, group)\n",
            "    attn.proj = row(attn.proj.weight.detach().chunk(size, dim=1)[rank].clone(), attn.proj.bias.detach() / size,\n"
            "                    dim, dim, group)  # the bias summed over the ranks: each adds its share\n",
            "adds its bias once, after the all-reduce"),
    Mistake("16.5", "divided-twice", "template_experts.py",  # trial 13: was told it averaged over the ep group, which it did not
            "                grad.copy_(mean.view_as(grad))\n",
            "                grad.copy_(mean.view_as(grad) / divisor)\n",
            "once more than the rule asks"),
    Mistake("16.5", "router-counted-as-an-expert", "template_experts.py",  # trial 13: was told to divide by the world size
            "    size = dist.get_world_size(ep_group)\n",
            "    size = dist.get_world_size(ep_group)\n"
            "    experts = {id(p) for module in model.modules() if getattr(module, \"expert_parallel\", False) for p in module.parameters()}\n",
            "they belong to the expert-parallel layer but not"),
    Mistake("16.5", "one-flat-for-every-dtype", "template_experts.py",  # trial 13: caught and named already; kept so
            "        for dtype in sorted({p.grad.dtype for p in params}, key=str):  # one flat buffer per dtype\n"
            "            grads = [p.grad for p in params if p.grad.dtype == dtype]\n",
            "        for dtype in [None] if params else []:\n"
            "            grads = [p.grad for p in params]\n",
            "one collective per group and dtype"),
    # Task 15
    Mistake("15.1", "outputs-averaged", "template_context_parallel.py",
            "    return weight_a * out_a + weight_b * out_b, lse", "    return (out_a + out_b) / 2, lse",
            "the two outputs were averaged"),
    Mistake("15.1", "max-not-log-sum-exp", "template_context_parallel.py",
            "    lse = torch.logaddexp(lse_a, lse_b)", "    lse = torch.maximum(lse_a, lse_b)",
            "the max instead of log-sum-exp"),
    Mistake("15.1", "nan-for-a-fully-masked-block", "template_context_parallel.py",
            "    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # both -inf: weights 0, not NaN",
            "    finite = lse", "exp(-inf - -inf) = NaN"),
    Mistake("15.2", "ring-turns-the-wrong-way", "template_context_parallel.py",
            "            owner = (rank - step) % size  # whose block this is: it came from r - 1, which had it from r - 2, ...",
            "            owner = (rank + step) % size", "the ring turns the wrong way"),
    Mistake("15.2", "wait-before-compute", "template_context_parallel.py",  # right values, nothing overlaps
            "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n"
            "            owner = (rank - step) % size  # whose block",
            "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n"
            "                for work in works:\n                    work.wait()\n                works = []\n"
            "            owner = (rank - step) % size  # whose block", "nothing could overlap"),
    Mistake("15.2", "future-blocks-computed", "template_context_parallel.py",  # right values, masked: N times the work
            "\n            if not causal or k_id <= q_id]", "]", "computed a block wholly in the future"),
    Mistake("15.2", "group-rank-as-global-rank", "template_context_parallel.py",  # right on the default group
            "        send_to = dist.get_global_rank(group, (rank + 1) % size) if group is not None else (rank + 1) % size\n"
            "        recv_from = dist.get_global_rank(group, (rank - 1) % size) if group is not None else (rank - 1) % size\n"
            "        tokens = q.shape[2]\n        q_chunks = token_chunks(rank, size, tokens, layout)\n"
            "        q_pieces = _pieces(q, q_chunks)\n        outs",
            "        send_to, recv_from = (rank + 1) % size, (rank - 1) % size\n"
            "        tokens = q.shape[2]\n        q_chunks = token_chunks(rank, size, tokens, layout)\n"
            "        q_pieces = _pieces(q, q_chunks)\n        outs", "take GLOBAL ranks"),
    Mistake("15.2", "diagonal-block-not-masked", "template_context_parallel.py",  # only the values said so
            "_pieces(kv[1], k_chunks)[j],\n                                           causal, q_chunks[i][1], k_chunks[j][1])",
            "_pieces(kv[1], k_chunks)[j],\n                                           False, q_chunks[i][1], k_chunks[j][1])",
            "without the causal mask"),
    Mistake("15.2", "diagonal-block-skipped", "template_context_parallel.py",  # rank 0 computes nothing: a TypeError
            "            if not causal or k_id <= q_id]", "            if not causal or k_id < q_id]",
            "a pair of equal ids (the diagonal block) is kept"),
    Mistake("15.2", "own-positions-for-every-block", "template_context_parallel.py",  # told as the ring turning wrongly
            "            owner = (rank - step) % size  # whose block this is: it came from r - 1, which had it from r - 2, ...",
            "            owner = rank", "with its OWN tokens' positions"),
    Mistake("15.2", "receive-first-loop-variable-keeps-the-send", "template_context_parallel.py",  # 3 blocks alive
            "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n"
            "            owner = (rank - step) % size  # whose block",
            "                works = [dist.irecv(incoming, recv_from, group=group), dist.isend(kv, send_to, group=group)]\n"
            "            owner = (rank - step) % size  # whose block", "the loop variable"),
    Mistake("15.2", "send-on-the-last-step-too", "template_context_parallel.py",  # was a hang: the next case's ring
            "            if step < size - 1:\n                incoming = torch.empty_like(kv)\n"
            "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n"
            "            owner = (rank - step) % size  # whose block",
            "            if True:\n                incoming = torch.empty_like(kv)\n"
            "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n"
            "            owner = (rank - step) % size  # whose block", "N - 1 times"),
    Mistake("15.3", "dk-dv-left-on-the-computing-rank", "template_context_parallel.py",
            "            if size > 1:  # the block's gradients go on with it: after N sends they reach its owner\n"
            "                grad_incoming = torch.empty_like(dkv)\n"
            "                grad_works = [dist.isend(dkv, send_to, group=group), dist.irecv(grad_incoming, recv_from, "
            "group=group)]\n",
            "            grad_incoming, grad_works = dkv, []\n", "dk and dv were left on the rank that computed them"),
    Mistake("15.3", "dkv-restarted-every-step", "template_context_parallel.py",  # each hop drops what came before
            "            if step > 0:  # the dk, dv that this block has gathered so far, from r - 1\n"
            "                for work in grad_works:\n                    work.wait()\n"
            "                dkv, grad_works = grad_incoming, None\n"
            "            else:\n                dkv = torch.zeros_like(kv)\n",
            "            if step > 0:\n                for work in grad_works:\n                    work.wait()\n"
            "            dkv = torch.zeros_like(kv)\n", "not restarted from zeros"),
    Mistake("15.4", "zigzag-chunks-swapped", "template_context_parallel.py",
            "    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=dim)",
            "    return torch.cat([chunks[2 * size - 1 - rank], chunks[rank]], dim=dim)", "in the wrong order"),
    Mistake("15.2", "send-waited-twice", "template_context_parallel.py",  # a student trial's: a hang of 57 s, blamed
            # on a collective that another rank never calls
            "                for work in works:\n                    work.wait()\n"
            "                kv, works = incoming, None  # a Work keeps its tensor alive: drop the finished ones too\n",
            "                for work in works:\n                    work.wait()\n                works[0].wait()\n"
            "                kv, works = incoming, None  # a Work keeps its tensor alive: drop the finished ones too\n",
            "waited for a Work a second time"),
    Mistake("15.3", "gradients-sent-n-minus-1-times", "template_context_parallel.py",  # a student trial's: a bare
            # "differs by 2.51"; what each rank returns is its successor's block's
            "            if size > 1:  # the block's gradients go on with it: after N sends they reach its owner\n"
            "                grad_incoming = torch.empty_like(dkv)\n"
            "                grad_works = [dist.isend(dkv, send_to, group=group), dist.irecv(grad_incoming, recv_from, group=group)]\n"
            "            if step < size - 1:\n"
            "                for work in works:\n"
            "                    work.wait()\n"
            "                kv, works = incoming, None\n"
            "        if size > 1:\n"
            "            for work in grad_works:\n"
            "                work.wait()\n"
            "            dkv = grad_incoming\n",
            "            if step < size - 1:  # the block's gradients go on with it, as the block itself\n"
            "                grad_incoming = torch.empty_like(dkv)\n"
            "                grad_works = [dist.isend(dkv, send_to, group=group), dist.irecv(grad_incoming, recv_from, group=group)]\n"
            "            if step < size - 1:\n"
            "                for work in works:\n"
            "                    work.wait()\n"
            "                kv, works = incoming, None\n",
            "the gradients need N"),
    Mistake("15.2", "block-without-positions", "template_context_parallel.py",  # a student trial's: a bare "differs"
            "_pieces(kv[1], k_chunks)[j],\n                                           causal, q_chunks[i][1], k_chunks[j][1])",
            "_pieces(kv[1], k_chunks)[j],\n                                           causal)",
            "without q_pos and k_pos"),
    Mistake("15.4", "shard-along-dim-2-always", "template_context_parallel.py",  # a student trial's: passed
            "    chunks = x.chunk(2 * size, dim=dim)\n    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=dim)",
            "    chunks = x.chunk(2 * size, dim=2)\n    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=2)",
            "cut, check and concatenate along `dim`"),
    Mistake("15.5", "all-to-all-splits-the-sequence", "template_context_parallel.py",
            "    qkv = all_to_all(torch.stack([q, k, v]), group, scatter_dim=2, gather_dim=3)",
            "    qkv = all_to_all(torch.stack([q, k, v]), group, scatter_dim=3, gather_dim=2)",
            "the all-to-all splits the wrong dimension"),
    Mistake("15.5", "backward-same-dims", "template_context_parallel.py",  # autograd's shape error, before
            "        return _AllToAll.apply(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None",
            "        return _AllToAll.apply(grad, ctx.group, ctx.scatter_dim, ctx.gather_dim), None, None, None",
            "scatter_dim and gather_dim swapped"),
    Mistake("15.5", "all-to-all-without-group", "template_context_parallel.py",  # passed: no sub-group in 15.5's tests
            "        dist.all_to_all_single(received, send, group=group)\n        return torch.cat(received.unbind(0), dim=gather_dim)",
            "        dist.all_to_all_single(received, send)\n        return torch.cat(received.unbind(0), dim=gather_dim)",
            "not over the 2 of the group it was given"),
    Mistake("15.5", "heads-not-refused", "template_context_parallel.py",  # a student trial's: was a raw shape error
            "    if heads % size:\n        raise ValueError(", "    if False:\n        raise ValueError(",
            "no ValueError: it went on and raised"),
    Mistake("15.5", "way-back-with-the-wrappers-defaults", "template_context_parallel.py",  # a student trial's: was
            # a bare "differs"
            "    return all_to_all(out, group, scatter_dim=2, gather_dim=1)  # (B, H, S / N, D)",
            "    return all_to_all(out, group)", "the all-to-all back is the reverse of the one in"),
    Mistake("15.2", "ring-polled-until-completed", "template_context_parallel.py",  # trial 6: a 50 s hang
            "            if step < size - 1:\n                for work in works:\n                    work.wait()\n"
            "                kv, works = incoming, None  # a Work keeps",
            "            if step < size - 1:\n                while not all(work.is_completed() for work in works):\n"
            "                    pass\n                kv, works = incoming, None  # a Work keeps",
            "say True only once their wait() has run"),
    Mistake("15.5", "all-to-all-saves-its-input", "template_context_parallel.py",  # trial 6: passed
            "        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim\n",
            "        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim\n"
            "        ctx.save_for_backward(x)\n",
            "keeps its input x alive after the forward"),
    Mistake("15.6", "one-all-reduce-a-parameter", "template_context_parallel.py",  # a student trial's: passed
            "    flat = torch.cat([param.grad.reshape(-1) for param in params])\n"
            "    dist.all_reduce(flat, group=group)\n"
            "    for param, grad in zip(params, flat.split([param.numel() for param in params])):\n",
            "    for param in params:\n"
            "        dist.all_reduce(param.grad, group=group)\n"
            "    for param, grad in zip(params, [param.grad.reshape(-1).clone() for param in params]):\n",
            "expected one all-reduce of the"),
    Mistake("15.6", "pooled-feature-not-reduced", "template_context_parallel.py",
            "        dist.all_reduce(total, group=group)\n", "", "not reduced over the context group"),
    Mistake("15.6", "head-gradients-times-n", "template_context_parallel.py",
            "(world if id(param) in head else world // cp_size)", "(world // cp_size)",
            "the head's gradients are N = 3 times too large"),
    Mistake("15.6", "block-gradients-divided-by-n", "template_context_parallel.py",
            "(world if id(param) in head else world // cp_size)", "world",
            "N = 3 times too small"),
    Mistake("15.2", "blocking-send-then-recv", "template_context_parallel.py",  # trial B's: a hang, told generically
            "        kv = torch.stack([k, v])  # one message a step\n        for step in range(size):\n"
            "            if step < size - 1:\n                incoming = torch.empty_like(kv)\n"
            "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]",
            "        kv = torch.stack([k, v])  # one message a step\n        for step in range(size):\n"
            "            if step < size - 1:\n                incoming = torch.empty_like(kv)\n"
            "                dist.send(kv, send_to, group=group); dist.recv(incoming, recv_from, group=group); works = []",
            "every rank waits in a blocking dist.send"),
    Mistake("15.2", "send-work-dropped", "template_context_parallel.py",  # trial B's: a hang, told generically
            "                for work in works:\n                    work.wait()\n                kv, works = incoming, None  # a Work keeps",
            "                works[1].wait()\n                kv, works = incoming, None  # a Work keeps",
            "let go of the Work of its send"),
    Mistake("15.2", "receive-from-r-plus-1", "template_context_parallel.py",  # trial B's: a hang, told generically
            "        recv_from = dist.get_global_rank(group, (rank - 1) % size) if group is not None else (rank - 1) % size\n"
            "        tokens = q.shape[2]\n        q_chunks = token_chunks(rank, size, tokens, layout)\n"
            "        q_pieces = _pieces(q, q_chunks)",
            "        recv_from = dist.get_global_rank(group, (rank + 1) % size) if group is not None else (rank + 1) % size\n"
            "        tokens = q.shape[2]\n        q_chunks = token_chunks(rank, size, tokens, layout)\n"
            "        q_pieces = _pieces(q, q_chunks)",
            "posted a receive from rank"),
    Mistake("15.2", "causal-rank-leaves-the-ring-early", "template_context_parallel.py",  # trial B's: a hang, told
            # generically; rank 0 finishes, its neighbours wait for it
            "        kv = torch.stack([k, v])  # one message a step\n        for step in range(size):\n",
            "        kv = torch.stack([k, v])  # one message a step\n        for step in range(size):\n"
            "            if causal and layout == \"contiguous\" and step > rank:\n"
            "                break  # every later block lies in this rank's future: nothing left to compute\n",
            "leaves the ring early"),
    Mistake("15.3", "blocking-gradient-recv-first", "template_context_parallel.py",  # trial B's: a hang, told generically
            "                grad_works = [dist.isend(dkv, send_to, group=group), dist.irecv(grad_incoming, recv_from, group=group)]",
            "                dist.recv(grad_incoming, recv_from, group=group)\n                dist.send(dkv, send_to, group=group)\n"
            "                grad_works = []",
            "every rank waits in a blocking dist.recv"),
    Mistake("15.6", "backward-divided-by-local-tokens", "template_context_parallel.py",  # trial B's: the expected
            # formula only
            "        return (grad / ctx.tokens).unsqueeze(1)", "        return (grad / ctx.local).unsqueeze(1)",
            "divided by this rank's token count"),
    Mistake("15.6", "pooled-over-the-default-group", "template_context_parallel.py",  # trial B's: a ratio only
            "        dist.all_reduce(total, group=group)", "        dist.all_reduce(total)", "ran over the default group"),
    Mistake("15.3", "dq-pieces-are-copies", "template_context_parallel.py",  # trial B's: a bare "differs"
            "        dq_pieces = _pieces(dq, q_chunks)",
            "        dq_pieces = [piece.clone() for piece in _pieces(dq, q_chunks)]", "none of them reached the dq"),
    Mistake("15.3", "idle-step-keeps-the-gradients", "template_context_parallel.py",  # trial B's: a raw TypeError
            "            if size > 1:  # the block's gradients go on with it",
            "            if size > 1 and block_pairs(q_chunks, k_chunks, causal):  # the block's gradients go on with it",
            "passed the block on without its dK/dV"),
    Mistake("15.2", "one-receive-more-than-sends", "template_context_parallel.py",  # trial C's: told as a receive posted before the send
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose block this is: it came from r - 1, which had it from r - 2, ...\n'
            '            k_chunks = token_chunks(owner, size, tokens, layout)\n'
            '            for i, j in block_pairs(q_chunks, k_chunks, causal):  # views of kv made here die here: kv can go\n'
            '                out, lse = attention_block(q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                                           causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                outs[i], lses[i] = (out, lse) if outs[i] is None else merge_attention(outs[i], lses[i], out, lse)\n'
            '            if step < size - 1:\n'
            '                for work in works:\n'
            '                    work.wait()\n'
            '                kv, works = incoming, None  # a Work keeps its tensor alive: drop the finished ones too\n',
            '                send_work = dist.isend(kv, send_to, group=group)\n'
            '            owner = (rank - step) % size  # whose block this is: it came from r - 1, which had it from r - 2, ...\n'
            '            k_chunks = token_chunks(owner, size, tokens, layout)\n'
            '            for i, j in block_pairs(q_chunks, k_chunks, causal):  # views of kv made here die here: kv can go\n'
            '                out, lse = attention_block(q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                                           causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                outs[i], lses[i] = (out, lse) if outs[i] is None else merge_attention(outs[i], lses[i], out, lse)\n'
            '            incoming = torch.empty_like(kv)\n'
            '            dist.recv(incoming, recv_from, group=group)\n'
            '            if step < size - 1:\n'
            '                send_work.wait()\n'
            '            kv, works = incoming, None  # a Work keeps its tensor alive: drop the finished ones too\n',
            'a receive that no rank sends to'),
    Mistake("15.2", "blocking-send-another-tag", "template_context_parallel.py",  # trial C's: told as neighbours that all send first
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose',
            '                works = [dist.irecv(incoming, recv_from, group=group)]\n'
            '                dist.send(kv, send_to, group=group, tag=step)\n'
            '            owner = (rank - step) % size  # whose',
            'another tag, peer or size'),
    Mistake("15.2", "works-waited-through-their-futures", "template_context_parallel.py",  # was torch's raw
            # "Work::getFuture not implemented"
            "                for work in works:\n                    work.wait()\n                kv, works = incoming, None  # a Work keeps",
            "                torch.futures.wait_all([work.get_future() for work in works])\n"
            "                kv, works = incoming, None  # a Work keeps", "point-to-point Works have no Future"),
    Mistake("15.3", "dq-made-anew-every-step", "template_context_parallel.py",  # trial C's: told as shares added into copies
            '        dq = torch.zeros_like(q)\n'
            '        dq_pieces = _pieces(dq, q_chunks)\n'
            '        kv = torch.stack([k, v])\n'
            '        for step in range(size):\n'
            '            if step < size - 1:\n'
            '                incoming = torch.empty_like(kv)\n'
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size\n'
            '            k_chunks = token_chunks(owner, size, tokens, layout)\n'
            '            if step > 0:',
            '        kv = torch.stack([k, v])\n'
            '        for step in range(size):\n'
            '            if step < size - 1:\n'
            '                incoming = torch.empty_like(kv)\n'
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size\n'
            '            k_chunks = token_chunks(owner, size, tokens, layout)\n'
            "            dq = torch.zeros_like(q)  # this step's dq\n"
            '            dq_pieces = _pieces(dq, q_chunks)\n'
            '            if step > 0:',
            'a dq made anew at each step'),
    Mistake("15.3", "no-gradients-sent-at-step-0", "template_context_parallel.py",  # was a raw UnboundLocalError
            "            if size > 1:  # the block's gradients go on with it: after N sends they reach its owner\n",
            "            if step > 0:  # nothing gathered yet at step 0\n", "from the first step on"),
    Mistake("15.3", "gradients-sent-n-minus-1-times-then-waited", "template_context_parallel.py",  # was a raw
            # TypeError: the wait after the loop iterates the last step's grad_works, None
            "            if size > 1:  # the block's gradients go on with it: after N sends they reach its owner\n",
            "            if step < size - 1:  # the block's gradients go on with it, as the block itself\n",
            "dK/dV blocks sent and as many received"),
    Mistake("15.3", "dk-dv-swapped", "template_context_parallel.py",  # was a bare "differs"
            "        return dq, dkv[0], dkv[1], None, None, None", "        return dq, dkv[1], dkv[0], None, None, None",
            "dk and dv are swapped"),
    Mistake("15.6", "backward-times-n", "template_context_parallel.py",  # trial C's: told as divided by the local token count
            '        return (grad / ctx.tokens).unsqueeze(1)',
            '        return (grad * dist.get_world_size() / ctx.tokens).unsqueeze(1)',
            'multiplied by N = 3'),
    Mistake("15.6", "tokens-counted-over-the-world", "template_context_parallel.py",  # was a ratio only; right
            # where the context group is the world
            "        ctx.local, ctx.tokens = x.shape[1], x.shape[1] * dist.get_world_size(group)",
            "        ctx.local, ctx.tokens = x.shape[1], x.shape[1] * dist.get_world_size()",
            "divided by S counted with the world size"),
    # the sixth trial of our own (2026-11-29, 06:40): passed, wrongly blamed, raw or bare before
    Mistake("15.1", "lse-summed", "template_context_parallel.py",
            '    lse = torch.logaddexp(lse_a, lse_b)',
            '    lse = lse_a + lse_b',
            'the log of the PRODUCT'),
    Mistake("15.1", "weights-swapped", "template_context_parallel.py",
            '    weight_a = torch.exp(lse_a - finite).unsqueeze(-1)\n'
            '    weight_b = torch.exp(lse_b - finite).unsqueeze(-1)\n',
            '    weight_a = torch.exp(lse_b - finite).unsqueeze(-1)\n'
            '    weight_b = torch.exp(lse_a - finite).unsqueeze(-1)\n',
            "the OTHER block's share"),
    Mistake("15.1", "shifted-by-the-max-not-normalised", "template_context_parallel.py",
            '    weight_a = torch.exp(lse_a - finite).unsqueeze(-1)\n'
            '    weight_b = torch.exp(lse_b - finite).unsqueeze(-1)\n',
            '    m = torch.maximum(lse_a, lse_b)\n'
            '    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)\n'
            '    weight_a = torch.exp(lse_a - m).unsqueeze(-1)\n'
            '    weight_b = torch.exp(lse_b - m).unsqueeze(-1)\n',
            'not divided by the sum of those weights'),
    Mistake("15.1", "weights-in-float32", "template_context_parallel.py",
            '    weight_a = torch.exp(lse_a - finite).unsqueeze(-1)\n'
            '    weight_b = torch.exp(lse_b - finite).unsqueeze(-1)\n',
            '    weight_a = torch.exp((lse_a - finite).float()).unsqueeze(-1)\n'
            '    weight_b = torch.exp((lse_b - finite).float()).unsqueeze(-1)\n',
            "float32's rounding"),
    Mistake("15.1", "scaled-again", "template_context_parallel.py",
            '    return weight_a * out_a + weight_b * out_b, lse',
            '    return (weight_a * out_a + weight_b * out_b) / out_a.shape[-1] ** 0.5, lse',
            'the scores were scaled already'),
    Mistake("15.1", "guard-on-one-side", "template_context_parallel.py",
            '    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # both -inf: weights 0, not NaN',
            '    finite = torch.where(torch.isinf(lse_b), torch.zeros_like(lse), lse)',
            'wrong in the rows where one block is fully masked'),
    Mistake("15.2", "block-never-replaced", "template_context_parallel.py",
            # trial 6's: was told as the ring turning the wrong way
            '                kv, works = incoming, None  # a Work keeps its tensor alive: drop the finished ones too\n',
            '                works = None\n',
            'never took the place of the one it held'),
    Mistake("15.2", "receive-not-waited", "template_context_parallel.py",  # trial 6's: was a bare difference of 1e289
            '                for work in works:\n'
            '                    work.wait()\n'
            '                kv, works = incoming, None  # a Work keeps',
            '                works[0].wait()  # the send; the receive is used at the next step\n'
            '                kv, works = incoming, None  # a Work keeps',
            'whose dist.irecv had not been waited for'),
    Mistake("15.2", "last-blocks-lse-saved", "template_context_parallel.py",
            # trial 6's: passed the default tests; a bare message in a slow one
            '        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)\n',
            '        out = torch.cat(outs, dim=2)\n',
            "it is the last block's alone"),
    Mistake("15.2", "global-rank-and-size", "template_context_parallel.py",
            # trial 6's: was told as isend taking global ranks, which it did
            '        rank, size = dist.get_rank(group), dist.get_world_size(group)\n'
            '        send_to = dist.get_global_rank(group, (rank + 1) % size) if group is not None else (rank + 1) % size\n'
            '        recv_from = dist.get_global_rank(group, (rank - 1) % size) if group is not None else (rank - 1) % size\n'
            '        tokens = q.shape[2]\n'
            '        q_chunks = token_chunks(rank, size, tokens, layout)\n'
            '        q_pieces = _pieces(q, q_chunks)\n'
            '        outs',
            '        rank, size = dist.get_rank(), dist.get_world_size()\n'
            '        send_to = dist.get_global_rank(group, (rank + 1) % size) if group is not None else (rank + 1) % size\n'
            '        recv_from = dist.get_global_rank(group, (rank - 1) % size) if group is not None else (rank - 1) % size\n'
            '        tokens = q.shape[2]\n'
            '        q_chunks = token_chunks(rank, size, tokens, layout)\n'
            '        q_pieces = _pieces(q, q_chunks)\n'
            '        outs',
            "the ring's rank and size were the world's"),
    Mistake("15.2", "one-step-too-many", "template_context_parallel.py",
            # trial 6's: was told as its own positions for every block
            '        outs, lses = [None] * len(q_chunks), [None] * len(q_chunks)\n'
            '        kv = torch.stack([k, v])  # one message a step\n'
            '        for step in range(size):\n',
            '        outs, lses = [None] * len(q_chunks), [None] * len(q_chunks)\n'
            '        kv = torch.stack([k, v])  # one message a step\n'
            '        for step in range(size + 1):\n',
            'one step more computes the last block again'),
    Mistake("15.3", "block-own-out-and-lse", "template_context_parallel.py",  # trial 6's: was a bare difference
            '                dq_b, dk_b, dv_b = attention_block_backward(\n'
            '                    dout_pieces[i], q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                    out_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n',
            '                out_b, lse_b = attention_block(q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                                               causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                dq_b, dk_b, dv_b = attention_block_backward(\n'
            '                    dout_pieces[i], q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                    out_b, lse_b, causal, q_chunks[i][1], k_chunks[j][1])\n',
            "that block's OWN out and lse"),
    Mistake("15.3", "gradients-in-float32", "template_context_parallel.py",  # trial 6's: was a bare difference of 1e-7
            '            else:\n'
            '                dkv = torch.zeros_like(kv)\n',
            '            else:\n'
            '                dkv = torch.zeros_like(kv, dtype=torch.float32)  # half the bytes on the wire\n',
            'sent float32 messages in backward'),
    Mistake("15.3", "gradients-sent-before-this-steps-share", "template_context_parallel.py",
            # trial 6's: was told as dK/dV restarted from zeros
            '            for i, j in block_pairs(q_chunks, k_chunks, causal):\n'
            '                dq_b, dk_b, dv_b = attention_block_backward(\n'
            '                    dout_pieces[i], q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                    out_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                dq_pieces[i].add_(dq_b)\n'
            '                _pieces(dkv[0], k_chunks)[j].add_(dk_b)\n'
            '                _pieces(dkv[1], k_chunks)[j].add_(dv_b)\n'
            "            if size > 1:  # the block's gradients go on with it: after N sends they reach its owner\n"
            '                grad_incoming = torch.empty_like(dkv)\n'
            '                grad_works = [dist.isend(dkv, send_to, group=group), dist.irecv(grad_incoming, recv_from, group=group)]\n',
            '            if size > 1:  # posted early, to overlap with the compute\n'
            '                grad_incoming = torch.empty_like(dkv)\n'
            '                grad_works = [dist.isend(dkv, send_to, group=group), dist.irecv(grad_incoming, recv_from, group=group)]\n'
            '            for i, j in block_pairs(q_chunks, k_chunks, causal):\n'
            '                dq_b, dk_b, dv_b = attention_block_backward(\n'
            '                    dout_pieces[i], q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                    out_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                dq_pieces[i].add_(dq_b)\n'
            '                _pieces(dkv[0], k_chunks)[j].add_(dk_b)\n'
            '                _pieces(dkv[1], k_chunks)[j].add_(dv_b)\n',
            'changed a tensor that it had posted in a dist.isend'),
    Mistake("15.3", "backward-ring-turns-the-wrong-way", "template_context_parallel.py",
            # trial 6's: was a bare difference on rank 0, which computes one block
            '            owner = (rank - step) % size\n'
            '            k_chunks = token_chunks(owner, size, tokens, layout)\n'
            '            if step > 0:',
            '            owner = (rank + step) % size\n'
            '            k_chunks = token_chunks(owner, size, tokens, layout)\n'
            '            if step > 0:',
            'the ring turns the wrong way in backward'),
    Mistake("15.4", "unshard-over-the-default-group", "template_context_parallel.py",
            # trial 6's: passed: no sub-group in 15.4's tests
            '    dist.all_gather(parts, x.contiguous(), group=group)\n',
            '    dist.all_gather(parts, x.contiguous())\n',
            'not over the 1 of the group it was given'),
    Mistake("15.4", "shard-by-the-global-rank", "template_context_parallel.py",
            # trial 6's: passed: no sub-group in 15.4's tests
            '    rank, size = dist.get_rank(group), dist.get_world_size(group)\n'
            '    if x.shape[dim] % (2 * size):',
            '    rank, size = dist.get_rank(), dist.get_world_size(group)\n'
            '    if x.shape[dim] % (2 * size):',
            'by the GLOBAL rank'),
    Mistake("15.4", "odd-ranks-chunks-reversed", "template_context_parallel.py",  # trial 6's: the expected value only
            '    return [(chunk, torch.arange(chunk * half, (chunk + 1) * half)) for chunk in (rank, 2 * world_size - 1 - rank)]',
            '    ids = (rank, 2 * world_size - 1 - rank) if rank % 2 == 0 else (2 * world_size - 1 - rank, rank)\n'
            '    return [(chunk, torch.arange(chunk * half, (chunk + 1) * half)) for chunk in ids]',
            'the right chunks in the wrong order'),
    Mistake("15.5", "q-scaled-before-sdpa", "template_context_parallel.py",  # trial 6's: was a bare difference
            '    out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=causal)',
            '    out = F.scaled_dot_product_attention(qkv[0] / qkv.shape[-1] ** 0.5, qkv[1], qkv[2], is_causal=causal)',
            'the scale was applied twice'),
    Mistake("15.5", "all-to-all-buffer-float32", "template_context_parallel.py",
            # trial 6's: was the test's own KeyError
            '        received = torch.empty_like(send)\n'
            '        dist.all_to_all_single(received, send, group=group)',
            '        received = torch.empty(send.shape)\n'
            '        dist.all_to_all_single(received, send, group=group)',
            'the buffer that receives must be like the one sent'),
    Mistake("15.5", "heads-checked-against-the-world", "template_context_parallel.py",
            # trial 6's: passed: 4 heads divide by the group and by the world
            '    heads, size = q.shape[1], dist.get_world_size(group)\n',
            '    heads, size = q.shape[1], dist.get_world_size()\n',
            "dist.get_world_size(group), not over the world's 4"),
    Mistake("15.6", "pooled-with-avg-then-divided-by-s", "template_context_parallel.py",
            # trial 6's: was a bare 'not the mean'
            '        dist.all_reduce(total, group=group)\n'
            '        return total / ctx.tokens\n',
            '        dist.all_reduce(total, op=dist.ReduceOp.AVG, group=group)\n'
            '        return total / ctx.tokens\n',
            'its all-reduce averaged (ReduceOp.AVG)'),
    Mistake("15.6", "replicas-not-averaged", "template_context_parallel.py",  # trial 6's: was a ratio only
            '(world if id(param) in head else world // cp_size)',
            '(cp_size if id(param) in head else 1)',
            "the replicas' gradients were summed, not averaged"),
    Mistake("15.2", "blocks-sent-in-bfloat16", "template_context_parallel.py",  # trial 6's: was a bare difference
            '                incoming = torch.empty_like(kv)\n'
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose block this is: it came from r - 1, which had it from r - 2, ...\n'
            '            k_chunks = token_chunks(owner, size, tokens, layout)\n'
            '            for i, j in block_pairs(q_chunks, k_chunks, causal):  # views of kv made here die here: kv can go\n'
            '                out, lse = attention_block(q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                                           causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                outs[i], lses[i] = (out, lse) if outs[i] is None else merge_attention(outs[i], lses[i], out, lse)\n'
            '            if step < size - 1:\n'
            '                for work in works:\n'
            '                    work.wait()\n'
            '                kv, works = incoming, None  # a Work keeps its tensor alive: drop the finished ones too\n',
            '                incoming = torch.empty_like(kv, dtype=torch.bfloat16)  # half the bytes on the wire\n'
            '                works = [dist.isend(kv.to(torch.bfloat16), send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose block this is: it came from r - 1, which had it from r - 2, ...\n'
            '            k_chunks = token_chunks(owner, size, tokens, layout)\n'
            '            for i, j in block_pairs(q_chunks, k_chunks, causal):  # views of kv made here die here: kv can go\n'
            '                out, lse = attention_block(q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                                           causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                outs[i], lses[i] = (out, lse) if outs[i] is None else merge_attention(outs[i], lses[i], out, lse)\n'
            '            if step < size - 1:\n'
            '                for work in works:\n'
            '                    work.wait()\n'
            '                kv, works = incoming.to(q.dtype), None\n',
            'sent or received bfloat16 messages in forward'),
    Mistake("15.2", "receive-buffer-float32", "template_context_parallel.py",  # trial 6's: gloo's abort, run twice
            '        for step in range(size):\n'
            '            if step < size - 1:\n'
            '                incoming = torch.empty_like(kv)\n'
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose',
            '        for step in range(size):\n'
            '            if step < size - 1:\n'
            '                incoming = torch.empty(kv.shape)\n'
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose',
            'posted a receive into a float32 buffer'),
    # trial 7 (2026-11-29): dout and out mixed up in the backward (a bare difference), a receive buffer for k alone
    # (gloo's SIGABRT)
    Mistake("15.3", "dout-for-out", "template_context_parallel.py",  # D = rowsum(dout * dout)
            '                    out_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                dq_pieces[i].add_(dq_b)',
            '                    dout_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                dq_pieces[i].add_(dq_b)',
            "became rowsum(dout * dout)"),
    Mistake("15.3", "out-for-dout", "template_context_parallel.py",
            '                    dout_pieces[i], q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                    out_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                dq_pieces[i].add_(dq_b)',
            '                    out_pieces[i], q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                    out_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                dq_pieces[i].add_(dq_b)',
            "the forward's output out stands where the output gradient dout belongs"),
    Mistake("15.3", "dout-and-out-swapped", "template_context_parallel.py",
            '                    dout_pieces[i], q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                    out_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                dq_pieces[i].add_(dq_b)',
            '                    out_pieces[i], q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n'
            '                    dout_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n'
            '                dq_pieces[i].add_(dq_b)',
            "dout and out are swapped"),
    Mistake("15.2", "receive-buffer-for-k-alone", "template_context_parallel.py",  # was gloo's SIGABRT, 1024 vs 512
            '                incoming = torch.empty_like(kv)\n'
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose',
            '                incoming = torch.empty_like(k)\n'
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose',
            "the buffer is sized for one of the 2 tensors that the message stacks"),
    Mistake("15.2", "receive-buffer-for-k-alone-posted-first", "template_context_parallel.py",  # said at the send
            '                incoming = torch.empty_like(kv)\n'
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose',
            '                incoming = torch.empty_like(k)\n'
            '                works = [dist.irecv(incoming, recv_from, group=group), dist.isend(kv, send_to, group=group)]\n'
            '            owner = (rank - step) % size  # whose',
            "1024 vs 512"),
    # trial 7, our own: the wire (sizes, a receive short), the owner out of range, a step short, token_chunks' positions
    Mistake("15.3", "gradient-buffer-for-dk-alone", "template_context_parallel.py",  # was gloo's SIGABRT
            '                grad_incoming = torch.empty_like(dkv)\n'
            '                grad_works = [dist.isend(dkv, send_to, group=group), dist.irecv(grad_incoming, recv_from, group=group)]\n'
            '            if step < size - 1:',
            '                grad_incoming = torch.empty_like(dkv[0])\n'
            '                grad_works = [dist.isend(dkv, send_to, group=group), dist.irecv(grad_incoming, recv_from, group=group)]\n'
            '            if step < size - 1:',
            'dk alone, where dk and dv travel together'),
    Mistake("15.2", "two-sends-one-receive", "template_context_parallel.py",  # was a hang, said by the stacks only
            '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose',
            '                works = [dist.isend(kv[0], send_to, group=group), dist.isend(kv[1], send_to, group=group),\n'
            '                         dist.irecv(incoming, recv_from, group=group)]\n'
            '            owner = (rank - step) % size  # whose',
            'with 1 receive posted'),
    Mistake("15.2", "owner-without-modulo", "template_context_parallel.py",  # was told as the ring turning the wrong way
            '            owner = (rank - step) % size  # whose block',
            '            owner = rank - step  # whose block',
            'without % N, is negative'),
    Mistake("15.3", "backward-owner-without-modulo", "template_context_parallel.py",  # was told as the ring turning the wrong way
            '            owner = (rank - step) % size\n'
            '            k_chunks = token_chunks(owner, size, tokens, layout)\n'
            '            if step > 0:',
            '            owner = rank - step\n'
            '            k_chunks = token_chunks(owner, size, tokens, layout)\n'
            '            if step > 0:',
            'without % N, is negative'),
    Mistake("15.2", "one-step-too-few", "template_context_parallel.py",  # was a bare difference
            '        outs, lses = [None] * len(q_chunks), [None] * len(q_chunks)\n'
            '        kv = torch.stack([k, v])  # one message a step\n'
            '        for step in range(size):',
            '        outs, lses = [None] * len(q_chunks), [None] * len(q_chunks)\n'
            '        kv = torch.stack([k, v])  # one message a step\n'
            '        for step in range(size - 1):',
            'the last step computes the block that came'),
    Mistake("15.4", "zigzag-positions-by-tokens", "template_context_parallel.py",  # was the test's own IndexError
            '    return [(chunk, torch.arange(chunk * half, (chunk + 1) * half)) for chunk in (rank, 2 * world_size - 1 - rank)]',
            '    return [(chunk, torch.arange(chunk * tokens, chunk * tokens + half)) for chunk in (rank, 2 * world_size - 1 - rank)]',
            'gave [(0, [0, 1]), (5, [20, 21])]'),
    Mistake("15.4", "unshard-buffers-float32", "template_context_parallel.py",  # passed: the test's x was float32
            '    parts = [torch.empty_like(x) for _ in range(size)]',
            '    parts = [torch.empty(x.shape) for _ in range(size)]',
            'the buffers that receive must be like x'),
    Mistake("15.2", "last-blocks-out-saved", "template_context_parallel.py",  # passed the default tests: out's
            # shape is right; a bare message in a slow one
            '        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)\n'
            '        ctx.save_for_backward(q, k, v, out, lse)\n'
            '        ctx.group, ctx.causal, ctx.layout = group, causal, layout\n'
            '        return out\n',
            '        result, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)\n'
            '        ctx.save_for_backward(q, k, v, out, lse)\n'
            '        ctx.group, ctx.causal, ctx.layout = group, causal, layout\n'
            '        return result\n',
            "it is the attention over rank 1's keys alone"),
    # trial 8, B: the lse by exp and log, a weight without its last dim, the zig-zag halves, the all-to-all's pieces and
    # gradients, q, k, v packed on the heads, the pooled sum's size and the flat buffer's dtype
    Mistake("15.1", "lse-by-exp-and-log", "template_context_parallel.py",  # said already: a catalogue entry
            "    lse = torch.logaddexp(lse_a, lse_b)\n",
            "    lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))\n",
            "an overflow, exp of scores near 1e4"),
    Mistake("15.1", "weighted-in-place", "template_context_parallel.py",  # said already: a catalogue entry
            "    return weight_a * out_a + weight_b * out_b, lse",
            "    return out_a.mul_(weight_a).add_(weight_b * out_b), lse",
            "changed its inputs in place"),
    Mistake("15.1", "weights-without-their-last-dim", "template_context_parallel.py",  # was a raw shape error
            "    weight_a = torch.exp(lse_a - finite).unsqueeze(-1)\n    weight_b = torch.exp(lse_b - finite).unsqueeze(-1)\n",
            "    weight_a = torch.exp(lse_a - finite)\n    weight_b = torch.exp(lse_b - finite)\n",
            "lines its S up with out's D"),
    Mistake("15.1", "weights-by-sigmoid", "template_context_parallel.py",  # said already: NaN where both sides are -inf
            "    weight_a = torch.exp(lse_a - finite).unsqueeze(-1)\n    weight_b = torch.exp(lse_b - finite).unsqueeze(-1)\n",
            "    weight_a = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)\n    weight_b = torch.sigmoid(lse_b - lse_a).unsqueeze(-1)\n",
            "a row with both sides -inf must give out = 0"),
    Mistake("15.4", "unshard-halves-swapped", "template_context_parallel.py",  # was a bare "not in order"
            "        chunks[rank], chunks[2 * size - 1 - rank] = part.chunk(2, dim=dim)",
            "        chunks[2 * size - 1 - rank], chunks[rank] = part.chunk(2, dim=dim)",
            "each rank's two halves went to each other's places"),
    Mistake("15.4", "positions-as-a-list", "template_context_parallel.py",  # was the test's own AttributeError
            "    return [(chunk, torch.arange(chunk * half, (chunk + 1) * half)) for chunk in (rank, 2 * world_size - 1 - rank)]",
            "    return [(chunk, list(range(chunk * half, (chunk + 1) * half))) for chunk in (rank, 2 * world_size - 1 - rank)]",
            "gave the positions as a list, not a tensor"),
    Mistake("15.5", "backward-returns-the-gradient-alone", "template_context_parallel.py",  # was told as swapped dims
            "        return _AllToAll.apply(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None",
            "        return _AllToAll.apply(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim)",
            "returns one gradient per input of forward"),
    Mistake("15.5", "received-reshaped-not-concatenated", "template_context_parallel.py",  # was told as a wrong dim
            "        return torch.cat(received.unbind(0), dim=gather_dim)",
            "        shape = list(x.shape)\n        shape[scatter_dim] //= size\n        shape[gather_dim] *= size\n"
            "        return received.reshape(shape)",
            "were reshaped to the output's shape, which interleaves them"),
    Mistake("15.5", "q-k-v-packed-along-the-heads", "template_context_parallel.py",  # was a bare difference
            "    qkv = all_to_all(torch.stack([q, k, v]), group, scatter_dim=2, gather_dim=3)  # (3, B, H / N, S, D)\n"
            "    out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=causal)",
            "    qkv = all_to_all(torch.cat([q, k, v], dim=1), group, scatter_dim=1, gather_dim=2)\n"
            "    out = F.scaled_dot_product_attention(*qkv.chunk(3, dim=1), is_causal=causal)",
            "were packed along the heads (torch.cat on dim 1"),
    Mistake("15.6", "pooled-by-all-reducing-x-in-place", "template_context_parallel.py",  # passed: right values
            "        total = x.sum(dim=1)\n        dist.all_reduce(total, group=group)\n",
            "        dist.all_reduce(x, group=group)\n        total = x.sum(dim=1)\n",
            "x itself, in place"),
    Mistake("15.6", "flat-buffer-float32", "template_context_parallel.py",  # was "1 x the single-process gradient"
            "    flat = torch.cat([param.grad.reshape(-1) for param in params])",
            "    flat = torch.zeros(sum(param.numel() for param in params))\n"
            "    torch.cat([param.grad.reshape(-1) for param in params], out=flat)",
            "sent the float64 gradients as ['float32']"),
    Mistake("15.6", "mean-backward-not-expanded", "template_context_parallel.py",  # was autograd's raw shape error
            "        return (grad / ctx.tokens).unsqueeze(1).expand(-1, ctx.local, -1).contiguous(), None",
            "        return grad / ctx.tokens, None",
            "returned a gradient of the wrong shape for x"),
    Mistake("15.4", "shard-cut-by-the-worlds-size", "template_context_parallel.py",  # was "not chunks 0 and 1"
            "    rank, size = dist.get_rank(group), dist.get_world_size(group)\n    if x.shape[dim] % (2 * size):",
            "    rank, size = dist.get_rank(group), dist.get_world_size()\n    if x.shape[dim] % (2 * size):",
            "by the world's size, not the group's"),
    Mistake("15.4", "unshard-list-by-the-worlds-size", "template_context_parallel.py",  # was gloo's error alone
            "    size = dist.get_world_size(group)\n    parts = [torch.empty_like(x) for _ in range(size)]",
            "    size = dist.get_world_size()\n    parts = [torch.empty_like(x) for _ in range(size)]",
            "gather list holds one buffer per rank of the world"),
    Mistake("15.6", "gradients-flattened-from-a-set", "template_context_parallel.py",  # was "0.93 x" alone
            "    params = [param for param in model.parameters() if param.grad is not None]",
            "    params = {param for param in model.parameters() if param.grad is not None}",
            "the ranks took their pieces out of it differently"),
    Mistake("15.6", "frozen-parameter-flattened", "template_context_parallel.py",  # passed: no frozen parameter
            "    params = [param for param in model.parameters() if param.grad is not None]",
            "    params = list(model.parameters())",
            "leave it out of the flat buffer"),
    Mistake("15.6", "frozen-parameter-given-zeros", "template_context_parallel.py",  # passed: no frozen parameter
            "    params = [param for param in model.parameters() if param.grad is not None]",
            "    params = list(model.parameters())\n    for param in params:\n        if param.grad is None:\n"
            "            param.grad = torch.zeros_like(param)",
            "leave a frozen parameter's .grad as it is"),
    Mistake("15.5", "no-way-back", "template_context_parallel.py",  # was told as a way back that was not the reverse
            "    return all_to_all(out, group, scatter_dim=2, gather_dim=1)  # (B, H, S / N, D)",
            "    return out",
            "the shape of the attention's output, H / N heads of the whole sequence: no way back"),
    Mistake("15.5", "way-back-by-all-gather", "template_context_parallel.py",  # said already: the wire
            "    return all_to_all(out, group, scatter_dim=2, gather_dim=1)  # (B, H, S / N, D)",
            "    import torch.distributed.nn.functional as dnn\n    rank = dist.get_rank(group)\n"
            "    return torch.cat(dnn.all_gather(out, group=group), dim=1).chunk(size, dim=2)[rank]",
            "expected all-to-alls of q, k, v and out"),
    Mistake("15.6", "mean-saves-its-input", "template_context_parallel.py",  # passed: right values, x kept alive
            "        return total / ctx.tokens\n        # --- Task 15.6 end ---\n\n    @staticmethod\n"
            "    def backward(ctx, grad):\n        # --- Task 15.6 begin ---\n"
            "        return (grad / ctx.tokens).unsqueeze(1).expand(-1, ctx.local, -1).contiguous(), None",
            "        ctx.save_for_backward(x)\n        return total / ctx.tokens\n        # --- Task 15.6 end ---\n\n"
            "    @staticmethod\n    def backward(ctx, grad):\n        # --- Task 15.6 begin ---\n        x, = ctx.saved_tensors\n"
            "        return (grad / ctx.tokens).unsqueeze(1).expand_as(x).contiguous(), None",
            "keeps its input x alive after the forward"),
    # Task 15, trial 13 (2026-11-30): other dtypes (a bfloat16 merge, a float32 dq or pooled sum), what stays alive
    # (blocks kept on ctx or in a list, one receive buffer), every Work waited (the last dK/dV, async all-reduces),
    # sub-groups (the gradients' all-reduce and divisor with group=), a refusal on one rank, backward's arity
    Mistake("15.1", "merge-zeros-default-dtype", "template_context_parallel.py",  # trial 13: passed: float64 only; a bfloat16 merge came out float32
            '    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # both -inf: weights 0, not NaN',
            '    finite = torch.where(torch.isinf(lse), torch.zeros(lse.shape), lse)  # both -inf: weights 0, not NaN',
            'merge_attention of bfloat16 blocks returned out in float32'),
    Mistake("15.1", "merge-float32-for-bf16", "template_context_parallel.py",  # trial 13: passed: float64 only
            '    lse = torch.logaddexp(lse_a, lse_b)\n',
            '    out_a, lse_a, out_b, lse_b = (t if t.dtype == torch.float64 else t.float() for t in (out_a, lse_a, out_b, lse_b))\n    lse = torch.logaddexp(lse_a, lse_b)\n',
            'returned out in float32 and lse in float32'),
    Mistake("15.2", "blocks-kept-on-ctx", "template_context_parallel.py",  # trial 13: told as views or Works holding 3 blocks
            '        kv = torch.stack([k, v])  # one message a step\n        for step in range(size):\n            if step < size - 1:\n                incoming = torch.empty_like(kv)\n',
            '        kv = torch.stack([k, v])  # one message a step\n        ctx.blocks = []  # every block received, for the backward\n        for step in range(size):\n            if step < size - 1:\n                incoming = torch.empty_like(kv)\n                ctx.blocks.append(incoming)\n',
            'held by ctx.blocks'),
    Mistake("15.2", "single-receive-buffer", "template_context_parallel.py",  # trial 13: told as a receive not waited for
            '        kv = torch.stack([k, v])  # one message a step\n        for step in range(size):\n            if step < size - 1:\n                incoming = torch.empty_like(kv)\n',
            '        kv = torch.stack([k, v])  # one message a step\n        incoming = torch.empty_like(kv)  # one buffer, made once\n        for step in range(size):\n            if step < size - 1:\n',
            'into the very buffer of a dist.isend still in flight'),
    Mistake("15.3", "last-gradients-not-waited", "template_context_parallel.py",  # trial 13: a bare difference (or right by chance)
            '        if size > 1:\n            for work in grad_works:\n                work.wait()\n            dkv = grad_incoming\n',
            '        if size > 1:\n            dkv = grad_incoming\n',
            'returned without waiting for 1 dist.irecv and 1 dist.isend'),
    Mistake("15.3", "dq-in-float32", "template_context_parallel.py",  # trial 13: a bare difference of 5e-8
            '        dq = torch.zeros_like(q)\n',
            '        dq = torch.zeros_like(q, dtype=torch.float32)\n',
            'every value of it is a float32 number'),
    Mistake("15.3", "backward-keeps-every-block", "template_context_parallel.py",  # trial 13: the list was not among the holders named
            '        kv = torch.stack([k, v])\n        for step in range(size):\n            if step < size - 1:\n                incoming = torch.empty_like(kv)\n',
            '        kv = torch.stack([k, v])\n        blocks = [kv]  # every block met\n        for step in range(size):\n            if step < size - 1:\n                incoming = torch.empty_like(kv)\n                blocks.append(incoming)\n',
            'a list or dict that each received block is added to'),
    Mistake("15.3", "backward-returns-three", "template_context_parallel.py",  # trial 13: torch's count alone
            '        return dq, dkv[0], dkv[1], None, None, None\n',
            '        return dq, dkv[0], dkv[1]\n',
            'then None for each of the other three'),
    Mistake("15.5", "refused-on-rank-0-only", "template_context_parallel.py",  # trial 13: rank 1's shape error, rank 0's refusal unsaid
            '    if heads % size:\n        raise ValueError(',
            '    if heads % size and dist.get_rank(group) == 0:\n        raise ValueError(',
            'refuse on every rank alike'),
    Mistake("15.6", "pooled-sum-float32", "template_context_parallel.py",  # trial 13: a raw dtype error from the head
            '        total = x.sum(dim=1)\n',
            '        total = torch.zeros(x.shape[0], x.shape[2])\n        total += x.sum(dim=1)\n',
            'returned float32 for a float64 x'),
    Mistake("15.6", "mean-async-not-waited", "template_context_parallel.py",  # trial 13: told as a mean not reduced
            '        dist.all_reduce(total, group=group)\n',
            '        dist.all_reduce(total, group=group, async_op=True)\n',
            'called all_reduce(async_op=True) and never waited for its Work: what it returned'),
    Mistake("15.6", "acpg-async-not-waited", "template_context_parallel.py",  # trial 13: told as a set's order
            '    dist.all_reduce(flat, group=group)\n',
            '    dist.all_reduce(flat, group=group, async_op=True)\n',
            'called all_reduce(async_op=True) and never waited for its Work: the gradients'),
    Mistake("15.6", "acpg-over-the-default-group", "template_context_parallel.py",  # trial 13: passed: no test gave group=
            '    dist.all_reduce(flat, group=group)\n',
            '    dist.all_reduce(flat)\n',
            'ran its all-reduce over 3 ranks'),
    Mistake("15.6", "acpg-size-of-the-world", "template_context_parallel.py",  # trial 13: passed: no test gave group=
            '    world = dist.get_world_size(group)\n    head = {id(param)',
            '    world = dist.get_world_size()\n    head = {id(param)',
            "divided by the world's 3 ranks, not the group's"),
    # Task 16.1 (expert parallelism)
    Mistake("16.1", "backward-with-the-forwards-splits", "template_experts.py",
            "ctx.input_splits, ctx.output_splits, group=ctx.group)",
            "ctx.output_splits, ctx.input_splits, group=ctx.group)", "swapped"),
    Mistake("16.1", "all-to-all-default-group", "template_experts.py",  # passed: no sub-group in 16.1's tests
            "        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)",
            "        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits)",
            "not over the 2 of the group it was given"),
    Mistake("16.1", "splits-kept-on-the-class", "template_experts.py",  # trial 6: passed (a backward before each forward)
            "        ctx.output_splits, ctx.input_splits, ctx.group = output_splits, input_splits, group\n"
            "        out = x.new_empty((sum(output_splits), *x.shape[1:]))\n"
            "        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)\n"
            "        return out\n"
            "        # --- Task 16.1 end ---\n"
            "\n"
            "    @staticmethod\n"
            "    def backward(ctx, grad):\n"
            "        # --- Task 16.1 begin ---\n"
            "        out = grad.new_empty((sum(ctx.input_splits), *grad.shape[1:]))\n"
            "        dist.all_to_all_single(out, grad.contiguous(), ctx.input_splits, ctx.output_splits, group=ctx.group)\n",
            "        _AllToAll.splits = (output_splits, input_splits, group)  # for the backward\n"
            "        out = x.new_empty((sum(output_splits), *x.shape[1:]))\n"
            "        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)\n"
            "        return out\n"
            "        # --- Task 16.1 end ---\n"
            "\n"
            "    @staticmethod\n"
            "    def backward(ctx, grad):\n"
            "        # --- Task 16.1 begin ---\n"
            "        output_splits, input_splits, group = _AllToAll.splits\n"
            "        out = grad.new_empty((sum(input_splits), *grad.shape[1:]))\n"
            "        dist.all_to_all_single(out, grad.contiguous(), input_splits, output_splits, group=group)\n",
            "Keep each call's splits (and group) on its own ctx"),
    Mistake("16.1", "backward-averaged", "template_experts.py",  # trial 6: was told to swap the splits
            "        return out, None, None, None\n",
            "        return out / dist.get_world_size(ctx.group), None, None, None\n",
            "the backward divided by the group's size"),
    Mistake("16.1", "input-saved-for-backward", "template_experts.py",  # trial 6: passed
            "        ctx.output_splits, ctx.input_splits, ctx.group = output_splits, input_splits, group\n",
            "        ctx.output_splits, ctx.input_splits, ctx.group = output_splits, input_splits, group\n"
            "        ctx.save_for_backward(x)\n",
            "all_to_all keeps its input x alive"),
    Mistake("16.1", "gradient-sent-as-it-came", "template_experts.py",  # trial 8: passed (every gradient contiguous)
            "        dist.all_to_all_single(out, grad.contiguous(), ctx.input_splits,",
            "        dist.all_to_all_single(out, grad, ctx.input_splits,",
            "give dist.all_to_all_single contiguous tensors"),
    # Task 16.2
    # Task 16.1, the lead's trial 11 (2026-11-29): the backward's arity, a Work never waited for
    Mistake("16.1", "backward-returns-one-value", "template_experts.py",  # was PyTorch's count, then the splits' rule
            "        return out, None, None, None\n",
            "        return out\n",
            "one value per argument of forward"),
    Mistake("16.1", "forward-never-waits", "template_experts.py",  # was a bare difference, and only "there and back"
            "        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)\n",
            "        work = dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group,\n"
            "                                      async_op=True)\n",
            "its Work never waited for"),
    Mistake("16.2", "regrouped-by-source-rank", "template_experts.py",
            "    expert_inputs = [torch.cat(pieces[j::len(experts)]) for j in range(len(experts))]\n",
            "    expert_inputs = list(arrived.split(output_splits))\n", "regrouped by source rank"),
    Mistake("16.2", "dropped-choices-sent", "template_experts.py",  # every choice travels, kept or not
            "    token, choice = torch.where(routing.kept)  # token order, then choice\n",
            "    token, choice = torch.where(torch.ones_like(routing.kept))\n", "past its expert's capacity"),
    Mistake("16.2", "counts-not-exchanged", "template_experts.py",  # the receiver guesses: as many as it sends
            "    received = torch.empty_like(counts)\n"
            "    dist.all_to_all_single(received, counts, group=group)  # E / N counts to each rank, from each\n",
            "    received = counts.clone()\n", "Exchange the counts first"),
    Mistake("16.2", "counts-over-the-world", "template_experts.py",  # trial 6: passed (no sub-group in 16.2's tests)
            "    dist.all_to_all_single(received, counts, group=group)  #",
            "    dist.all_to_all_single(received, counts)  #",
            "not over the 2 of the group it was given"),
    Mistake("16.2", "tokens-over-the-world", "template_experts.py",  # trial 6: passed
            "    arrived = all_to_all(x[token], output_splits, input_splits, group)\n",
            "    arrived = all_to_all(x[token], output_splits, input_splits)\n",
            "not over the 2 of the group it was given"),
    Mistake("16.2", "counts-as-floats", "template_experts.py",  # trial 6: was told it guessed its sizes
            "    counts = torch.bincount(expert, minlength=num_experts)  #",
            "    counts = torch.zeros(num_experts).index_add_(0, expert, torch.ones(len(expert)))  #",
            "count in integers"),
    Mistake("16.2", "pairs-enumerated-choice-major", "template_experts.py",  # trial 6: was told to sort stably
            "    token, choice = torch.where(routing.kept)  # token order, then choice\n",
            "    choice, token = torch.where(routing.kept.t())\n",
            "listed choice by choice"),
    Mistake("16.2", "tokens-detached-before-sending", "template_experts.py",  # trial 6: a bare count of the backward's calls
            "    arrived = all_to_all(x[token], output_splits, input_splits, group)\n",
            "    arrived = all_to_all(x[token].detach(), output_splits, input_splits, group)\n",
            "never came back through dispatch's all-to-all"),
    # trial 8 (2026-11-29): a Plan that disagrees with what was sent, counts of another size or dtype, a second
    # exchange (each was told a wrong cause, a raw split error, or a bare list of calls)
    Mistake("16.2", "plan-pairs-in-token-order", "template_experts.py",  # was told the expert's gradient differed
            "    return expert_inputs, Plan(token, choice, routing.weight,",
            "    return expert_inputs, Plan(*torch.where(routing.kept), routing.weight,",
            "in another order than the rows it sent"),
    Mistake("16.2", "plan-weight-detached", "template_experts.py",  # was told combine's gate was detached
            "    return expert_inputs, Plan(token, choice, routing.weight,",
            "    return expert_inputs, Plan(token, choice, routing.weight.detach(),",
            "plan.weight is out of the graph"),
    Mistake("16.2", "plan-received-is-what-was-sent", "template_experts.py",  # was a raw split error in combine
            "input_splits, output_splits, received)\n",
            "input_splits, output_splits, counts.view(size, len(experts)))\n",
            "it holds the counts this rank SENT"),
    Mistake("16.2", "bincount-without-minlength", "template_experts.py",  # was a raw "does not divide equally"
            "    counts = torch.bincount(expert, minlength=num_experts)  #",
            "    counts = torch.bincount(expert)  #",
            "torch.bincount(expert, minlength=E)"),
    Mistake("16.2", "counts-received-in-floats", "template_experts.py",  # was told it counted in floats
            "    received = torch.empty_like(counts)\n",
            "    received = torch.empty(num_experts)\n",
            "the buffer it receives the counts in is a float"),
    Mistake("16.2", "splits-exchanged-twice", "template_experts.py",  # was a bare list of the calls
            "    output_splits = received.sum(dim=1).tolist()\n",
            "    totals = torch.empty(size, dtype=torch.long)\n"
            "    dist.all_to_all_single(totals, counts.view(size, len(experts)).sum(dim=1), group=group)\n"
            "    output_splits = totals.tolist()\n",
            "no second exchange"),
    Mistake("16.2", "splits-as-tensors", "template_experts.py",  # was told the tokens' all-to-all sent 0-d tensors
            "    input_splits = counts.view(size, len(experts)).sum(dim=1).tolist()\n"
            "    output_splits = received.sum(dim=1).tolist()\n",
            "    input_splits = counts.view(size, len(experts)).sum(dim=1)\n"
            "    output_splits = received.sum(dim=1)\n",
            "N Python ints"),
    Mistake("16.2", "regrouped-expert-major", "template_experts.py",  # told "by source rank" alone
            "    expert_inputs = [torch.cat(pieces[j::len(experts)]) for j in range(len(experts))]\n",
            "    expert_inputs = [torch.cat(pieces[j * size:(j + 1) * size]) for j in range(len(experts))]\n",
            "What arrives is ordered by source rank, then local expert"),
    # Task 16.3
    Mistake("16.3", "not-gate-weighted", "template_experts.py",
            "index_add(0, plan.token, gate * back)", "index_add(0, plan.token, back)", "weight by the gate"),
    Mistake("16.3", "dispatch-order", "template_experts.py",
            "    return back.new_zeros((tokens, back.shape[-1])).index_add(0, plan.token, gate * back)\n",
            "    return gate * back\n", "not in token order"),
    Mistake("16.3", "outputs-sent-back-expert-major", "template_experts.py",  # the rows come back to wrong tokens
            "    send = torch.cat([by_expert[j][s] for s in range(size) for j in range(per_rank)])",
            "    send = torch.cat(expert_outputs)", "the outputs come back to the wrong tokens"),
    Mistake("16.3", "index-copy-not-add", "template_experts.py",  # top-2: one choice kept per token
            "index_add(0, plan.token, gate * back)", "index_copy(0, plan.token, gate * back)", "must be ADDED"),
    Mistake("16.3", "gate-not-cast", "template_experts.py",  # passed: float64 everywhere; fails in any float32 model
            "    gate = plan.weight[plan.token, plan.choice].to(back.dtype).unsqueeze(-1)",
            "    gate = plan.weight[plan.token, plan.choice].unsqueeze(-1)", "cast the gate to the outputs' dtype"),
    Mistake("16.3", "combine-over-the-world", "template_experts.py",  # trial 6: passed (no sub-group in 16.3's tests)
            "    back = all_to_all(send, plan.input_splits, plan.output_splits, group)",
            "    back = all_to_all(send, plan.input_splits, plan.output_splits)",
            "not over the 2 of the group it was given"),
    Mistake("16.3", "zeros-in-the-default-dtype", "template_experts.py",  # trial 6: was a raw index_add_ error
            "    return back.new_zeros((tokens, back.shape[-1]))",
            "    return torch.zeros(tokens, back.shape[-1])",
            "made in torch's default dtype (float32) met the float64"),
    Mistake("16.3", "tokens-counted-from-the-plan", "template_experts.py",  # trial 6: was a raw reshape error
            "    tokens = plan.weight.shape[0]\n",
            "    tokens = int(plan.token.max()) + 1 if len(plan.token) else 0\n",
            "y has one row per token"),
    Mistake("16.3", "gate-cast-to-float32", "template_experts.py",  # trial 6: was told the outputs came in dispatch order
            "plan.weight[plan.token, plan.choice].to(back.dtype)",
            "plan.weight[plan.token, plan.choice].float()",
            "gates rounded to float32"),
    Mistake("16.3", "gate-detached", "template_experts.py",  # trial 6: named already
            "plan.weight[plan.token, plan.choice].to(back.dtype)",
            "plan.weight[plan.token, plan.choice].detach().to(back.dtype)",
            "(not detached)"),
    # trial 8: gates renormalised after the drops, a gate without its row dimension, a split by a row of
    # plan.received, a way back outside autograd, the splits not swapped back
    Mistake("16.3", "gates-renormalised-after-drops", "template_experts.py",  # was told "without their gates"
            "    gate = plan.weight[plan.token, plan.choice].to(back.dtype).unsqueeze(-1)\n",
            "    kept = torch.zeros_like(plan.weight).index_put((plan.token, plan.choice), plan.weight[plan.token, plan.choice])\n"
            "    kept = kept / kept.sum(dim=1, keepdim=True).clamp_min(1e-20)  # the kept gates sum to one\n"
            "    gate = kept[plan.token, plan.choice].to(back.dtype).unsqueeze(-1)\n",
            "renormalised over a token's kept choices"),
    Mistake("16.3", "gate-without-a-row-dimension", "template_experts.py",  # was a raw broadcast error
            "    gate = plan.weight[plan.token, plan.choice].to(back.dtype).unsqueeze(-1)\n",
            "    gate = plan.weight[plan.token, plan.choice].to(back.dtype)\n",
            "give the gate a trailing dimension"),
    Mistake("16.3", "split-by-a-row-of-received", "template_experts.py",  # was a raw split error
            "out.split(plan.received[:, j].tolist())", "out.split(plan.received[j].tolist())",
            "by a ROW of plan.received"),
    Mistake("16.3", "way-back-outside-autograd", "template_experts.py",  # was "it sent []" alone
            "    back = all_to_all(send, plan.input_splits, plan.output_splits, group)  # in the order dispatch sent\n",
            "    back = send.new_empty((sum(plan.input_splits), send.shape[-1]))\n"
            "    dist.all_to_all_single(back, send, plan.input_splits, plan.output_splits, group=group)\n",
            "combine's way back was cut from the graph"),
    Mistake("16.3", "way-back-splits-not-swapped", "template_experts.py",  # named already; no entry had it
            "    back = all_to_all(send, plan.input_splits, plan.output_splits, group)",
            "    back = all_to_all(send, plan.output_splits, plan.input_splits, group)",
            "goes back the reverse way of dispatch's"),
    # Task 16.4
    Mistake("16.4", "every-expert-kept", "template_experts.py",  # all E held, the local ones picked in forward
            "        experts = [moe.experts[e] for e in local_experts(moe.num_experts, group)]\n"
            "        return cls(moe.router, experts,",
            "        return cls(moe.router, list(moe.experts),", "memory is not freed"),
    Mistake("16.4", "aux-loss-not-kept", "template_experts.py",
            "        self.aux_loss = models.load_balancing_loss(probs, routing.expert, self.num_experts)\n",
            "        aux_loss = models.load_balancing_loss(probs, routing.expert, self.num_experts)  # noqa: F841\n",
            "vit.aux_loss() finds it"),
    Mistake("16.4", "idle-experts-skipped", "template_experts.py",  # None gradients, not zeros, for an idle expert
            "        outputs = [expert(rows) for expert, rows in zip(self.experts, expert_inputs)]",
            "        outputs = [expert(rows) if len(rows) else rows for expert, rows in zip(self.experts, expert_inputs)]",
            "has no gradient (None)"),
    Mistake("16.4", "experts-by-position-not-by-rank", "template_experts.py",  # trial B's: rank 0's output differed
            "        experts = [moe.experts[e] for e in local_experts(moe.num_experts, group)]",
            "        experts = [moe.experts[e] for e in range(len(local_experts(moe.num_experts, group)))]",
            "this rank took rank 0's experts"),
    Mistake("16.4", "top-level-children-only", "template_experts.py",  # trial B's: "converted 0 MoE layers" alone
            "    for module in list(model.modules()):\n        for name, child in module.named_children():",
            "    for module in [model]:\n        for name, child in module.named_children():",
            "MoE layers nested inside blocks must be found"),
    Mistake("16.4", "rank-0-without-group", "template_experts.py",  # trial C's: told as positions taken for experts
            '        experts = [moe.experts[e] for e in local_experts(moe.num_experts, group)]',
            '        size = dist.get_world_size(group)\n'
            '        rank = dist.get_rank(group) if group is not None else 0  # no group: one process\n'
            '        if moe.num_experts % size:\n'
            '            raise ValueError(f"{moe.num_experts} experts do not divide over {size} ranks")\n'
            '        per = moe.num_experts // size\n'
            '        experts = list(moe.experts)[rank * per:(rank + 1) * per]',
            "this rank's rank was taken as 0"),
    Mistake("16.4", "set-on-the-model-with-a-dotted-name", "template_experts.py",  # trial C's: passed (a stray child)
            '    for module in list(model.modules()):\n'
            '        for name, child in module.named_children():\n'
            '            if isinstance(child, models.MoE):\n'
            '                setattr(module, name, ExpertParallelMoE.from_moe(child, ep_group))\n'
            '    return model\n',
            '    for name, module in list(model.named_modules()):\n'
            '        if isinstance(module, models.MoE):\n'
            '            setattr(model, name, ExpertParallelMoE.from_moe(module, ep_group))\n'
            '    return model\n',
            "added as a new child 'blocks.1.mlp'"),
    Mistake("16.4", "set-on-the-model-with-the-last-name", "template_experts.py",  # trial C's: passed (the block kept its MoE)
            '    for module in list(model.modules()):\n'
            '        for name, child in module.named_children():\n'
            '            if isinstance(child, models.MoE):\n'
            '                setattr(module, name, ExpertParallelMoE.from_moe(child, ep_group))\n'
            '    return model\n',
            '    for name, module in list(model.named_modules()):\n'
            '        if isinstance(module, models.MoE):\n'
            '            setattr(model, name.rsplit(".", 1)[-1], ExpertParallelMoE.from_moe(module, ep_group))\n'
            '    return model\n',
            "added as a new child 'mlp'"),
    Mistake("16.4", "returns-none", "template_experts.py",  # trial C's: passed
            '                setattr(module, name, ExpertParallelMoE.from_moe(child, ep_group))\n'
            '    return model\n',
            '                setattr(module, name, ExpertParallelMoE.from_moe(child, ep_group))\n',
            'not the model it was given'),
    Mistake("16.4", "recursion-drops-ep-group", "template_experts.py",  # trial C's: passed (ep = world only)
            '    for module in list(model.modules()):\n'
            '        for name, child in module.named_children():\n'
            '            if isinstance(child, models.MoE):\n'
            '                setattr(module, name, ExpertParallelMoE.from_moe(child, ep_group))\n'
            '    return model\n',
            '    for name, child in model.named_children():\n'
            '        if isinstance(child, models.MoE):\n'
            '            setattr(model, name, ExpertParallelMoE.from_moe(child, ep_group))\n'
            '        else:\n'
            '            parallelize_moe(child)\n'
            '    return model\n',
            'must pass ep_group on too'),
    Mistake("16.4", "global-rank-not-group-rank", "template_experts.py",  # trial C's: passed (ep = world only)
            '        experts = [moe.experts[e] for e in local_experts(moe.num_experts, group)]',
            '        size, rank = dist.get_world_size(group), dist.get_rank()\n'
            '        if moe.num_experts % size:\n'
            '            raise ValueError(f"{moe.num_experts} experts do not divide over {size} ranks")\n'
            '        per = moe.num_experts // size\n'
            '        experts = list(moe.experts)[rank * per:(rank + 1) * per]',
            "gives the global rank, not this rank's place in the group"),
    Mistake("16.4", "dense-mlps-converted-too", "template_experts.py",  # was a raw AttributeError
            '    for module in list(model.modules()):\n'
            '        for name, child in module.named_children():\n'
            '            if isinstance(child, models.MoE):\n'
            '                setattr(module, name, ExpertParallelMoE.from_moe(child, ep_group))\n'
            '    return model\n',
            '    for block in model.blocks:\n'
            '        block.mlp = ExpertParallelMoE.from_moe(block.mlp, ep_group)\n'
            '    return model\n',
            "only the MoE layers are converted"),
    Mistake("16.4", "add-module-with-a-dotted-name", "template_experts.py",  # was a raw KeyError
            '    for module in list(model.modules()):\n'
            '        for name, child in module.named_children():\n'
            '            if isinstance(child, models.MoE):\n'
            '                setattr(module, name, ExpertParallelMoE.from_moe(child, ep_group))\n'
            '    return model\n',
            '    for name, module in list(model.named_modules()):\n'
            '        if isinstance(module, models.MoE):\n'
            '            model.add_module(name, ExpertParallelMoE.from_moe(module, ep_group))\n'
            '    return model\n',
            "take a child's own name, without dots"),
    Mistake("16.4", "aux-loss-detached", "template_experts.py",  # trial 6: was told the gates were detached
            "        self.aux_loss = models.load_balancing_loss(probs, routing.expert, self.num_experts)\n",
            "        self.aux_loss = models.load_balancing_loss(probs, routing.expert, self.num_experts).detach()\n",
            "out of the graph"),
    Mistake("16.4", "router-made-anew", "template_experts.py",  # trial 6: a bare difference of the outputs
            "        return cls(moe.router, experts,",
            "        router = nn.Linear(moe.router.in_features, moe.num_experts, bias=False, dtype=moe.router.weight.dtype)\n"
            "        return cls(router, experts,",
            "router weight is not the models.MoE's"),
    Mistake("16.4", "probs-in-the-logits-dtype", "template_experts.py",  # trial 6: passed (float64 only)
            "        probs = logits.softmax(dim=-1, dtype=routing.weight.dtype)\n",
            "        probs = logits.softmax(dim=-1)\n",
            "router probabilities were taken in bfloat16"),
    Mistake("16.4", "capacity-over-the-group", "template_experts.py",  # trial 6: named already
            "        routing = models.route(logits, self.top_k, self.capacity_factor)\n",
            "        routing = models.route(logits, self.top_k, self.capacity_factor * dist.get_world_size(self.group))\n",
            "counted on THIS rank's T tokens"),
    Mistake("16.4", "logits-detached-before-routing", "template_experts.py",  # trial 8: was told combine's gate
            "        routing = models.route(logits, self.top_k, self.capacity_factor)\n",
            "        routing = models.route(logits.detach(), self.top_k, self.capacity_factor)\n",
            "route the logits themselves"),
    Mistake("16.4", "layer-made-without-the-group", "template_experts.py",  # trial 8: named already; no entry had it
            "                setattr(module, name, ExpertParallelMoE.from_moe(child, ep_group))\n",
            "                setattr(module, name, ExpertParallelMoE.from_moe(child))\n",
            "not the ep_group given to parallelize_moe"),
    # Task 16.5
    Mistake("16.5", "non-experts-averaged-over-the-ep-group", "template_experts.py",  # a student trial's: was told
            # "not averaged over the ranks"; the same group as the world's in the default run, so the 4-rank one
            '                dist.all_reduce(flat, group=None if ranks == "all" else ranks)',
            '                dist.all_reduce(flat, group=ep_group if ranks == "all" else ranks)', "averaged over a group of"),
    Mistake("16.2", "unstable-sort-by-expert", "template_experts.py",  # a student trial's: "12 rows, expected 12"
            "    order = torch.argsort(expert, stable=True)", "    order = torch.argsort(expert)", "a stable sort"),
    Mistake("16.5", "expert-grads-not-scaled", "template_experts.py",
            "expert_dp_group, size * copies)", "expert_dp_group, copies)", "times too large"),
    Mistake("16.5", "expert-grads-averaged-over-ep", "template_experts.py",
            "expert_dp_group, size * copies)", "expert_dp_group, size * size * copies)", "times too small"),
    Mistake("16.5", "experts-reduced-over-ep-group", "template_experts.py",  # sums different experts' gradients
            "                dist.all_reduce(flat, group=None if ranks == \"all\" else ranks)",
            "                dist.all_reduce(flat, group=None if ranks == \"all\" else ep_group)", "which hold DIFFERENT experts"),
    Mistake("16.5", "one-all-reduce-per-parameter", "template_experts.py",
            "            flat = torch.cat([g.reshape(-1) for g in grads])\n"
            "            if ranks is not None:  # None: one copy of the experts, nothing to average them with\n"
            "                dist.all_reduce(flat, group=None if ranks == \"all\" else ranks)\n"
            "            flat /= divisor\n"
            "            for grad, mean in zip(grads, flat.split([g.numel() for g in grads])):\n"
            "                grad.copy_(mean.view_as(grad))\n",
            "            for grad in grads:\n"
            "                if ranks is not None:\n"
            "                    dist.all_reduce(grad, group=None if ranks == \"all\" else ranks)\n"
            "                grad /= divisor\n", "not one per parameter"),
    Mistake("16.5", "dense-grads-not-averaged", "template_experts.py",
            "not in experts], \"all\", dist.get_world_size())", "not in experts], None, 1)", "not averaged over the ranks"),
    Mistake("16.5", "parameters-without-grad-not-skipped", "template_experts.py",  # trial 6: passed (every parameter had a gradient)
            "    with_grad = [p for p in model.parameters() if p.grad is not None]\n",
            "    with_grad = list(model.parameters())\n",
            "parameters without .grad are left alone"),
    Mistake("16.5", "copies-from-the-ep-group", "template_experts.py",  # trial 6: passed (ep 2 of 4: 2 copies)
            "    copies = 1 if expert_dp_group is None else dist.get_world_size(expert_dp_group)\n",
            "    copies = 1 if expert_dp_group is None else dist.get_world_size(ep_group)\n",
            "summed over the 2 copies of expert_dp_group"),
    Mistake("16.5", "experts-summed-over-copies", "template_experts.py",  # trial 6: was told to divide by N
            "expert_dp_group, size * copies)",
            "expert_dp_group, size)",
            "summed over the 2 copies of expert_dp_group"),
    # Issue 45: what a student trial of Tasks 11-13 found passing or told with a wrong cause
    Mistake("12.3", "forgets-every-bucket", "template_compression.py",  # the reference's own bug: a KeyError
            "        if not state.warm_start:  # this bucket's only: the others may still be in flight\n"
            "            del state.p_memory_dict[index], state.q_memory_dict[index]\n",
            "        if not state.warm_start:\n            state.p_memory_dict.clear()\n"
            "            state.q_memory_dict.clear()\n", "forget only its OWN P and Q"),
    Mistake("11.3", "eval-statistics-detached", "template_batchnorm.py",  # the output right, the input gradient not
            "            var, mean = torch.var_mean(x, dim=_reduce_dims(x), correction=0)\n",
            "            var, mean = torch.var_mean(x.detach(), dim=_reduce_dims(x), correction=0)\n",
            "they stay in the graph"),
    Mistake("12.3", "iter-counted-before-the-check", "template_compression.py",
            "    buffer = bucket.buffer()\n    if state.iter < state.start_powerSGD_iter:\n"
            "        state.maybe_increase_iter(bucket)\n",
            "    buffer = bucket.buffer()\n    state.maybe_increase_iter(bucket)\n"
            "    if state.iter < state.start_powerSGD_iter:\n", "after comparing state.iter"),
    Mistake("13.2", "count-equals-sync-every", "template_local_sgd.py",  # never averages again once H is lowered
            "        if self.local_step >= self.sync_every:  # >=: sync_every may have been lowered below the count\n",
            "        if self.local_step == self.sync_every:\n", "using >=, not =="),
    Mistake("13.3", "count-equals-sync-every", "template_local_sgd.py",
            "        if self.local_step < self.sync_every:\n            return loss\n",
            "        if self.local_step != self.sync_every:\n            return loss\n", "using >=, not =="),
    Mistake("13.3", "outer-gradients-kept", "template_local_sgd.py",  # the trial's: 3.1e-3 off after 6 steps
            "        self.outer_optimizer.step()  # its momentum persists: built once, in __init__\n"
            "        self.outer_optimizer.zero_grad()\n",
            "        self.outer_optimizer.step()  # its momentum persists: built once, in __init__\n",
            "clear the outer optimizer's gradients"),
    Mistake("13.3", "outer-gradients-zeroed", "template_local_sgd.py",  # zeros, not None: AdamW decays `unused`
            "        self.outer_optimizer.zero_grad()\n", "        self.outer_optimizer.zero_grad(set_to_none=False)\n",
            "clear the outer optimizer's gradients"),
    Mistake("12.3", "warm-q-not-orthogonalised", "template_compression.py",  # last step's Q used as it came
            "    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n",
            "    for q in (qs if new_qs else []):\n        orthogonalize(q, state.orthogonalization_epsilon)\n",
            "Q was not orthogonalised"),
    Mistake("12.3", "wanted-before-the-residual", "template_compression.py",  # the residual forgets the old one
            "        if index in state.error_dict:\n            buffer.add_(state.error_dict[index])\n"
            "        else:\n            state.error_dict[index] = torch.zeros_like(buffer)\n"
            "        wanted = buffer.detach().clone()\n",
            "        wanted = buffer.detach().clone()\n        if index in state.error_dict:\n"
            "            buffer.add_(state.error_dict[index])\n"
            "        else:\n            state.error_dict[index] = torch.zeros_like(buffer)\n",
            "the buffer plus the old residual"),
    Mistake("13.1", "averaged-in-float32", "template_local_sgd.py",  # float64 parameters to float32's precision
            "            flat = torch.cat([tensor.reshape(-1) for tensor in same])\n",
            "            flat = torch.cat([tensor.reshape(-1) for tensor in same]).float()\n",
            "the mean to float32's precision"),
    Mistake("13.3", "parameters-averaged-after-the-outer-step", "template_local_sgd.py",  # a second all-reduce
            "            synced.copy_(param.detach())  # after the outer step: where the next round starts\n",
            "            synced.copy_(param.detach())  # after the outer step: where the next round starts\n"
            "        average_parameters(self.model, self.group)\n", "nothing more"),
    # Issue 45, item 4: hints that named a wrong cause, now reached only by their own mistake
    Mistake("12.3", "whole-means-not-written-back", "template_compression.py",  # was told about the first Qs
            "            tensor.copy_(mean.view_as(tensor))\n", "            tensor = mean.view_as(tensor)\n",
            "the tensors sent whole still hold this rank's own gradients"),
    Mistake("12.3", "first-qs-drawn-in-float32", "template_compression.py",  # was told about error feedback
            "                q.copy_(torch.randn(*q.shape, device=\"cpu\", dtype=dtype))\n",
            "                q.copy_(torch.randn(*q.shape, device=\"cpu\"))\n", "the first Qs were drawn in torch.float32"),
    Mistake("12.1", "default-group-refused", "template_compression.py",  # DDP passes None: a raw AttributeError
            "    group = process_group if process_group is not None else dist.group.WORLD\n    buffer = bucket.buffer()\n"
            "    compressed", "    group = process_group\n    buffer = bucket.buffer()\n    compressed",
            "the process group was None"),
    Mistake("12.3", "default-group-refused", "template_compression.py",
            "    group = state.process_group if state.process_group is not None else dist.group.WORLD\n",
            "    group = state.process_group\n", "the process group was None"),
    Mistake("12.3", "whole-sent-in-float32", "template_compression.py",  # trial 14 (e): a float32 copy of the tensors sent whole: passed (no float64 bucket had one)
            '        flat = torch.cat([tensor.reshape(-1) for tensor in whole])',
            '        flat = torch.cat([tensor.reshape(-1) for tensor in whole]).float()',
            'the flat tensor of those sent whole in float32'),
    Mistake("12.3", "epsilon-ignored", "template_compression.py",  # trial 14 (e): orthogonalize(p) without state.orthogonalization_epsilon: passed
            "    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix, q, out=p)\n\n    # Every collective from this thread, in the same order on every rank: a collective started in a\n    # .then callback runs on the communication thread, where its order against the next bucket's\n    # differs between ranks (a hang; PyTorch's own hook does it, safe with one bucket only).\n    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)",
            "    for q in qs:\n        orthogonalize(q)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix, q, out=p)\n\n    # Every collective from this thread, in the same order on every rank: a collective started in a\n    # .then callback runs on the communication thread, where its order against the next bucket's\n    # differs between ranks (a hang; PyTorch's own hook does it, safe with one bucket only).\n    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n    for p in ps:\n        orthogonalize(p)",
            'pass state.orthogonalization_epsilon to every orthogonalize call'),
    Mistake("12.3", "keeps-p-q-without-warm-start", "template_compression.py",  # trial 14 (e): without warm start the P and Q buffers stay alive: passed
            "        if not state.warm_start:  # this bucket's only: the others may still be in flight\n            del state.p_memory_dict[index], state.q_memory_dict[index]\n",
            '',
            "still hold this bucket's buffers after the step"),
    Mistake("12.3", "p-all-reduced-in-float32", "template_compression.py",  # trial 14 (e): was told of error feedback and warm start
            '    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N',
            '    p32 = state.p_memory_dict[index].float()\n    dist.all_reduce(p32, group=group)\n    state.p_memory_dict[index].copy_(p32)',
            'the P buffer in float32'),
    Mistake("12.3", "whole-in-decompress", "template_compression.py",  # trial 14 (e): a bare list of sizes
            '    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix.T, p, out=q)\n\n    def decompress(future):\n        state.q_memory_dict[index].div_(world_size)\n',
            '    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix.T, p, out=q)\n\n    def decompress(future):\n        state.q_memory_dict[index].div_(world_size)\n        if whole:\n            flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n            dist.all_reduce(flat, group=group)\n            for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n                tensor.copy_(mean.view_as(tensor))\n',
            "the tensors sent whole were all-reduced after Q's"),
    Mistake("12.3", "rank-1-p-not-orthogonalised", "template_compression.py",  # trial 14 (e): was told the whole algorithm
            '    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)',
            '    for p in ps:\n        if p.shape[1] > 1:\n            orthogonalize(p, state.orthogonalization_epsilon)',
            'of one column was not normalised'),
    Mistake("12.3", "feedback-only-with-warm-start", "template_compression.py",  # trial 14 (e): was told to keep the state per bucket
            '    if state.use_error_feedback:\n        if index in state.error_dict:\n            buffer.add_(state.error_dict[index])\n        else:\n            state.error_dict[index] = torch.zeros_like(buffer)\n        wanted = buffer.detach().clone()\n\n    matrices, whole = [], []\n    for tensor in bucket.gradients():\n        matrix = tensor.view(tensor.shape[0], -1)\n        n, m = matrix.shape\n        r = min(n, m, state.matrix_approximation_rank)\n        state.total_numel_before_compression += n * m\n        if n * m > r * (n + m) * state.min_compression_rate:\n            matrices.append((matrix, r))\n            state.total_numel_after_compression += r * (n + m)\n        else:\n            whole.append(tensor)\n            state.total_numel_after_compression += n * m\n\n    new_qs = not state.warm_start or index not in state.p_memory_dict\n    if new_qs:\n        state.p_memory_dict[index] = torch.empty(sum(mat.shape[0] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n        state.q_memory_dict[index] = torch.empty(sum(mat.shape[1] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n    ps, qs, p_at, q_at = [], [], 0, 0\n    for matrix, r in matrices:\n        n, m = matrix.shape\n        ps.append(state.p_memory_dict[index][p_at:p_at + n * r].view(n, r))\n        qs.append(state.q_memory_dict[index][q_at:q_at + m * r].view(m, r))\n        p_at, q_at = p_at + n * r, q_at + m * r\n    if new_qs:\n        with torch.random.fork_rng(devices=[]):\n            torch.manual_seed(state.rng.randint(1_000_000_000))\n            for q in qs:\n                q.copy_(torch.randn(*q.shape, device="cpu", dtype=dtype))\n    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix, q, out=p)\n\n    # Every collective from this thread, in the same order on every rank: a collective started in a\n    # .then callback runs on the communication thread, where its order against the next bucket\'s\n    # differs between ranks (a hang; PyTorch\'s own hook does it, safe with one bucket only).\n    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix.T, p, out=q)\n\n    def decompress(future):\n        state.q_memory_dict[index].div_(world_size)\n        for (matrix, _), p, q in zip(matrices, ps, qs):\n            torch.matmul(p, q.T, out=matrix)\n        if state.use_error_feedback:\n            state.error_dict[index] = wanted - buffer',
            '    if state.use_error_feedback and state.warm_start:\n        if index in state.error_dict:\n            buffer.add_(state.error_dict[index])\n        else:\n            state.error_dict[index] = torch.zeros_like(buffer)\n        wanted = buffer.detach().clone()\n\n    matrices, whole = [], []\n    for tensor in bucket.gradients():\n        matrix = tensor.view(tensor.shape[0], -1)\n        n, m = matrix.shape\n        r = min(n, m, state.matrix_approximation_rank)\n        state.total_numel_before_compression += n * m\n        if n * m > r * (n + m) * state.min_compression_rate:\n            matrices.append((matrix, r))\n            state.total_numel_after_compression += r * (n + m)\n        else:\n            whole.append(tensor)\n            state.total_numel_after_compression += n * m\n\n    new_qs = not state.warm_start or index not in state.p_memory_dict\n    if new_qs:\n        state.p_memory_dict[index] = torch.empty(sum(mat.shape[0] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n        state.q_memory_dict[index] = torch.empty(sum(mat.shape[1] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n    ps, qs, p_at, q_at = [], [], 0, 0\n    for matrix, r in matrices:\n        n, m = matrix.shape\n        ps.append(state.p_memory_dict[index][p_at:p_at + n * r].view(n, r))\n        qs.append(state.q_memory_dict[index][q_at:q_at + m * r].view(m, r))\n        p_at, q_at = p_at + n * r, q_at + m * r\n    if new_qs:\n        with torch.random.fork_rng(devices=[]):\n            torch.manual_seed(state.rng.randint(1_000_000_000))\n            for q in qs:\n                q.copy_(torch.randn(*q.shape, device="cpu", dtype=dtype))\n    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix, q, out=p)\n\n    # Every collective from this thread, in the same order on every rank: a collective started in a\n    # .then callback runs on the communication thread, where its order against the next bucket\'s\n    # differs between ranks (a hang; PyTorch\'s own hook does it, safe with one bucket only).\n    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix.T, p, out=q)\n\n    def decompress(future):\n        state.q_memory_dict[index].div_(world_size)\n        for (matrix, _), p, q in zip(matrices, ps, qs):\n            torch.matmul(p, q.T, out=matrix)\n        if state.use_error_feedback and state.warm_start:\n            state.error_dict[index] = wanted - buffer',
            'use_error_feedback (on by default) and warm_start are independent'),
    Mistake("12.3", "wanted-after-the-whole-means", "template_compression.py",  # trial 14 (e): was told the residual is all zeros
            '        wanted = buffer.detach().clone()\n\n    matrices, whole = [], []\n    for tensor in bucket.gradients():\n        matrix = tensor.view(tensor.shape[0], -1)\n        n, m = matrix.shape\n        r = min(n, m, state.matrix_approximation_rank)\n        state.total_numel_before_compression += n * m\n        if n * m > r * (n + m) * state.min_compression_rate:\n            matrices.append((matrix, r))\n            state.total_numel_after_compression += r * (n + m)\n        else:\n            whole.append(tensor)\n            state.total_numel_after_compression += n * m\n\n    new_qs = not state.warm_start or index not in state.p_memory_dict\n    if new_qs:\n        state.p_memory_dict[index] = torch.empty(sum(mat.shape[0] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n        state.q_memory_dict[index] = torch.empty(sum(mat.shape[1] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n    ps, qs, p_at, q_at = [], [], 0, 0\n    for matrix, r in matrices:\n        n, m = matrix.shape\n        ps.append(state.p_memory_dict[index][p_at:p_at + n * r].view(n, r))\n        qs.append(state.q_memory_dict[index][q_at:q_at + m * r].view(m, r))\n        p_at, q_at = p_at + n * r, q_at + m * r\n    if new_qs:\n        with torch.random.fork_rng(devices=[]):\n            torch.manual_seed(state.rng.randint(1_000_000_000))\n            for q in qs:\n                q.copy_(torch.randn(*q.shape, device="cpu", dtype=dtype))\n    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix, q, out=p)\n\n    # Every collective from this thread, in the same order on every rank: a collective started in a\n    # .then callback runs on the communication thread, where its order against the next bucket\'s\n    # differs between ranks (a hang; PyTorch\'s own hook does it, safe with one bucket only).\n    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum',
            '\n    matrices, whole = [], []\n    for tensor in bucket.gradients():\n        matrix = tensor.view(tensor.shape[0], -1)\n        n, m = matrix.shape\n        r = min(n, m, state.matrix_approximation_rank)\n        state.total_numel_before_compression += n * m\n        if n * m > r * (n + m) * state.min_compression_rate:\n            matrices.append((matrix, r))\n            state.total_numel_after_compression += r * (n + m)\n        else:\n            whole.append(tensor)\n            state.total_numel_after_compression += n * m\n\n    new_qs = not state.warm_start or index not in state.p_memory_dict\n    if new_qs:\n        state.p_memory_dict[index] = torch.empty(sum(mat.shape[0] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n        state.q_memory_dict[index] = torch.empty(sum(mat.shape[1] * r for mat, r in matrices), dtype=dtype,\n                                                 device=buffer.device)\n    ps, qs, p_at, q_at = [], [], 0, 0\n    for matrix, r in matrices:\n        n, m = matrix.shape\n        ps.append(state.p_memory_dict[index][p_at:p_at + n * r].view(n, r))\n        qs.append(state.q_memory_dict[index][q_at:q_at + m * r].view(m, r))\n        p_at, q_at = p_at + n * r, q_at + m * r\n    if new_qs:\n        with torch.random.fork_rng(devices=[]):\n            torch.manual_seed(state.rng.randint(1_000_000_000))\n            for q in qs:\n                q.copy_(torch.randn(*q.shape, device="cpu", dtype=dtype))\n    for q in qs:\n        orthogonalize(q, state.orthogonalization_epsilon)\n    for (matrix, _), p, q in zip(matrices, ps, qs):\n        torch.matmul(matrix, q, out=p)\n\n    # Every collective from this thread, in the same order on every rank: a collective started in a\n    # .then callback runs on the communication thread, where its order against the next bucket\'s\n    # differs between ranks (a hang; PyTorch\'s own hook does it, safe with one bucket only).\n    if whole:\n        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):\n            tensor.copy_(mean.view_as(tensor))\n    if state.use_error_feedback:\n        wanted = buffer.detach().clone()\n    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum',
            'taken after their mean was written back'),
    Mistake("12.3", "p-orthogonalised-before-the-sum", "template_compression.py",  # trial 14 (e): was told the whole algorithm
            '    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)\n',
            '    for p in ps:\n        orthogonalize(p, state.orthogonalization_epsilon)\n    dist.all_reduce(state.p_memory_dict[index], group=group)\n',
            'P was orthogonalised before its all-reduce'),
    Mistake("12.3", "q-divided-by-2", "template_compression.py",  # trial 14 (e): was told the whole algorithm (a 3-rank test)
            '        state.q_memory_dict[index].div_(world_size)\n',
            '        state.q_memory_dict[index].div_(2)\n',
            "Q's sum was divided by 2, not by"),
    Mistake("12.3", "returns-the-q-buffer", "template_compression.py",  # trial 14 (e): a raw RuntimeError raised in the test's own helper
            '        state.maybe_increase_iter(bucket)\n        return buffer\n',
            '        state.maybe_increase_iter(bucket)\n        return future.value()[0]\n',
            'decompress must return bucket.buffer()'),
    Mistake("13.1", "first-tensor-assumed", "template_local_sgd.py",  # a raw IndexError on an empty list
            "        for dtype in dict.fromkeys(tensor.dtype for tensor in tensors):",
            "        for dtype in dict.fromkeys([tensors[0].dtype] + [tensor.dtype for tensor in tensors]):",
            "with no tensor there is nothing to average"),
    Mistake("10.5", "grads-zeroed-per-micro-batch", "template_pipeline.py",  # a bare diff: the hint was unreachable
            "    if stage.is_last:\n        output.backward()\n    else:\n",
            "    stage.module.zero_grad()  # a fresh gradient for each micro-batch\n"
            "    if stage.is_last:\n        output.backward()\n    else:\n", "the backwards must ADD into .grad"),
    Mistake("10.2", "each-send-waited-at-once", "template_pipeline.py",  # was told of a loop that never ends
            "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))\n",
            "        dist.isend(tensor.detach().contiguous(), peer).wait()  # sent before going on\n",
            "a send's wait() blocks until the neighbour receives"),
    Mistake("10.5", "first-stage-sends-back", "template_pipeline.py",  # was told about output.grad
            "    if not stage.is_first:\n        stage.send_backward(input.grad)\n",
            "    stage.send_backward(input.grad)\n", "stage 0 has no previous stage"),
    Mistake("10.7", "warmup-one-short", "template_pipeline.py",  # was told "the warm-up is right"
            "    warmup = min(stage.num_stages - stage.stage_index - 1, num_microbatches)\n",
            "    warmup = max(min(stage.num_stages - stage.stage_index - 1, num_microbatches) - 1, 0)\n",
            "or the warm-up is one forward short"),
    Mistake("12.2", "last-column-not-normalised", "template_compression.py",  # was told "not a copy"
            "        col /= torch.linalg.vector_norm(col, dim=0, keepdim=True) + epsilon\n",
            "        if i + 1 < num_cols:  # the last column: nothing after it to subtract from\n"
            "            col /= torch.linalg.vector_norm(col, dim=0, keepdim=True) + epsilon\n", "the last column too"),
    Mistake("12.2", "normalised-before-its-turn", "template_compression.py",  # every column divided first
            "    num_cols = matrix.shape[1]\n    for i in range(num_cols):\n        col = matrix[:, i:i + 1]\n"
            "        col /= torch.linalg.vector_norm(col, dim=0, keepdim=True) + epsilon\n",
            "    num_cols = matrix.shape[1]\n    matrix /= torch.linalg.vector_norm(matrix, dim=0, keepdim=True) + epsilon\n"
            "    for i in range(num_cols):\n        col = matrix[:, i:i + 1]\n", "at its turn"),
    Mistake("11.2", "saved-x-hat-scaled-in-place", "template_batchnorm.py",  # was told the all-reduce was missing
            "        y = x_hat\n        if weight is not None:\n            y = y * _per_channel(weight, x)\n",
            "        y = x_hat\n        if weight is not None:\n            y = y.mul_(_per_channel(weight, x))\n",
            "backward read x_hat scaled by the weight"),
    Mistake("8.4", "offsets-without-names", "template_checkpoint.py",  # was told the checkpoint lacks elements
            "                    if saved_name == name and low < high:\n", "                    if low < high:\n",
            "has the same NAME and their offsets overlap"),
    Mistake("8.4", "per-element-by-key-name", "template_checkpoint.py",  # passed: momentum_buffer kept whole
            "        if not per_element(value, saved[0][1][\"param\"]):\n",
            "        if key not in (\"param\", \"exp_avg\", \"exp_avg_sq\"):\n", "not by its key's name"),
    # Issue 45, section 4 (a trial of Tasks 8.3-10.7): wrong answers that passed, or were told a bare difference,
    # a raw exception or another cause. What goes on the wire: the peer, the source, the shape
    Mistake("10.2", "sends-to-the-next-stage-always", "template_pipeline.py",  # was told the Work was not kept
            "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))\n",
            "        dst = self.next_rank if self.next_rank is not None else peer\n"
            "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), dst))\n",
            "_send must send to `peer`"),
    Mistake("10.2", "waits-for-the-previous-send", "template_pipeline.py",  # was told to keep every Work
            "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))\n",
            "        self.wait_sends()  # one message in flight at a time\n"
            "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))\n",
            "called wait_sends() before starting its send"),
    Mistake("10.3", "recv-from-any-source", "template_pipeline.py",  # passed: on 2 ranks any source is the peer
            "        dist.recv(tensor, peer)\n", "        dist.recv(tensor)\n", "received from any source"),
    Mistake("10.5", "recv-grad-in-input-shape", "template_pipeline.py",  # was gloo's SIGABRT
            "        output.backward(stage.recv_backward(output.shape, output.dtype))\n",
            "        output.backward(stage.recv_backward(input.shape, input.dtype))\n",
            "stage.recv_backward(output.shape, output.dtype)"),
    Mistake("10.5", "sends-the-input-back", "template_pipeline.py",  # was a bare difference of gradients
            "        stage.send_backward(input.grad)\n", "        stage.send_backward(input.detach())\n",
            "not the input itself"),
    Mistake("10.6", "learn-shapes-every-micro-batch", "template_pipeline.py",  # was a bare difference of the wire
            "    for i in range(num_microbatches):\n        input, output = forward_step(",
            "    for i in range(num_microbatches):\n        stage.learn_shapes(inputs, num_microbatches)\n"
            "        input, output = forward_step(", "once, at the start of the step"),
    # state and counts: the scaling, the ends of the pipeline, the schedule's counts (each was a bare
    # difference or a raw exception)
    Mistake("10.4", "loss-scaled-by-stages", "template_pipeline.py",  # right when M = num_stages
            "        output = loss_fn(output, target) / num_microbatches\n",
            "        output = loss_fn(output, target) / stage.num_stages\n", "not 1/num_stages"),
    Mistake("10.4", "returns-x-as-input", "template_pipeline.py",
            "    return input, output\n    # --- Task 10.4 end ---", "    return x, output\n    # --- Task 10.4 end ---",
            "with the input it computed with"),
    Mistake("10.1", "refuses-one-layer-a-stage", "template_pipeline.py",
            "    if not 1 <= num_stages <= num_layers:\n", "    if not 1 <= num_stages < num_layers:\n",
            "refuse only MORE stages than layers"),
    Mistake("10.6", "targets-split-on-every-stage", "template_pipeline.py",
            "    ys = split(targets, num_microbatches) if stage.is_last else [None] * num_microbatches\n"
            "    trace, saved, loss = [], [], None\n    for i in range(num_microbatches):\n        input, output",
            "    ys = split(targets, num_microbatches)\n"
            "    trace, saved, loss = [], [], None\n    for i in range(num_microbatches):\n        input, output",
            "split() was given None"),
    Mistake("10.7", "warmup-not-capped-by-m", "template_pipeline.py",  # M < num_stages
            "    warmup = min(stage.num_stages - stage.stage_index - 1, num_microbatches)\n",
            "    warmup = stage.num_stages - stage.stage_index - 1\n", "never more than M"),
    Mistake("10.7", "steady-state-one-short", "template_pipeline.py",  # the last forward missing
            "    for i in range(warmup, num_microbatches):\n        forward(i)\n        backward()\n",
            "    for i in range(warmup, num_microbatches - 1):\n        forward(i)\n        backward()\n",
            "with no forward left to pair"),
    Mistake("10.5", "receives-on-the-last-stage-too", "template_pipeline.py",  # was told send_backward was missing
            "    if stage.is_last:\n        output.backward()\n    else:\n"
            "        output.backward(stage.recv_backward(output.shape, output.dtype))\n",
            "    output.backward(stage.recv_backward(output.shape, output.dtype))\n", "the last stage has no next stage"),
    # where elements go: positions in the shard, in the flat, of the input
    Mistake("8.3", "at-from-the-parameter", "template_checkpoint.py",
            "            entries.append((name, low - offset, high - low, low - start))",
            "            entries.append((name, low - offset, high - low, low - offset))",
            "counts from the start of this rank's"),
    # trial 8, B: the range not clipped to the shard, an inclusive end, negative padding (each the bare last line
    # before), and two said already: the line position advanced only on overlap, entries of length 0
    Mistake("8.3", "range-not-clipped-at-the-end", "template_checkpoint.py",
            "        low, high = max(start, offset), min(end, offset + numel)\n",
            "        low, high = max(start, offset), offset + numel\n",
            "runs past the end of the shard"),
    Mistake("8.3", "range-not-clipped-at-the-start", "template_checkpoint.py",
            "        low, high = max(start, offset), min(end, offset + numel)\n",
            "        low, high = offset, min(end, offset + numel)\n",
            "starts before the shard"),
    Mistake("8.3", "parameter-end-inclusive", "template_checkpoint.py",
            "        low, high = max(start, offset), min(end, offset + numel)\n",
            "        low, high = max(start, offset), min(end, offset + numel - 1)\n",
            "is one element short"),
    Mistake("8.3", "padding-negative-before-the-line-end", "template_checkpoint.py",
            "    padding = (end - start) - sum(length for _, _, length, _ in entries)\n",
            "    padding = end - max(start, sum(numels))\n",
            "never fewer than 0"),
    Mistake("8.3", "line-position-advanced-on-overlap-only", "template_checkpoint.py",
            "            entries.append((name, low - offset, high - low, low - start))\n        offset += numel\n",
            "            entries.append((name, low - offset, high - low, low - start))\n            offset += numel\n",
            "whether or not this shard overlaps the one before"),
    Mistake("8.3", "entries-of-length-0", "template_checkpoint.py",
            "        if low < high:\n", "        if low <= high:\n",
            "an entry of length 0 for v"),
    Mistake("8.4", "copied-at-the-offset", "template_checkpoint.py",
            "            flat[at:at + length] = torch.cat([part for _, part in parts])\n",
            "            flat[offset:offset + length] = torch.cat([part for _, part in parts])\n",
            "their position in the PARAMETER"),
    Mistake("9.2", "row-ignores-input-is-parallel", "template_tensor_parallel.py",
            "        if not self.input_is_parallel:\n            x = _split_last_dim(x, self.group)\n", "",
            "multiplied the WHOLE input"),
    # the fourth trial of our own wrong answers (2026-11-28, 22:00): they passed, or their message named no cause
    Mistake("15.4", "refuses-by-n-not-2n", "template_context_parallel.py",  # passed: 2N + 1 tokens do not divide by N
            "    if x.shape[dim] % (2 * size):\n", "    if x.shape[dim] % size:\n", "divides by N = 3 but not by 2N"),
    Mistake("16.2", "empty-rank-skips-the-counts", "template_experts.py",  # passed: no test had a rank with no tokens
            "    dist.all_to_all_single(received, counts, group=group)  # E / N counts to each rank, from each\n",
            "    if counts.sum() == 0:\n        received.zero_()\n    else:\n"
            "        dist.all_to_all_single(received, counts, group=group)\n",
            "A rank with no tokens must still call every collective"),
    Mistake("16.3", "idle-rank-skips-the-way-back", "template_experts.py",  # passed: nothing to send, nothing to get
            "    back = all_to_all(send, plan.input_splits, plan.output_splits, group)  # in the order dispatch sent\n",
            "    if sum(plan.input_splits) == 0 and sum(plan.output_splits) == 0:\n"
            "        return send.new_zeros((plan.weight.shape[0], send.shape[-1]))\n"
            "    back = all_to_all(send, plan.input_splits, plan.output_splits, group)  # in the order dispatch sent\n",
            "A rank with no tokens must still call every collective"),
    # a group that is not the world: every test of Task 14 had run over the default group only
    Mistake("14.1", "heads-counted-over-the-world", "template_sequence_parallel.py",
            "    # --- Task 14.1 begin ---\n    rank, size = dist.get_rank(group), dist.get_world_size(group)\n",
            "    # --- Task 14.1 begin ---\n    rank, size = dist.get_rank(group), dist.get_world_size()\n",
            "not the default group's"),
    Mistake("14.4", "block-gathers-over-the-world", "template_sequence_parallel.py",
            "(gather_sequence(args[0], group), *args[1:])", "(gather_sequence(args[0]), *args[1:])",
            "not the default group's"),
    Mistake("14.5", "first-split-over-the-world", "template_sequence_parallel.py",
            "(split_sequence(args[0], tp_group),)", "(split_sequence(args[0]),)", "not the default group's"),
    Mistake("14.5", "last-gather-over-the-world", "template_sequence_parallel.py",
            "(gather_sequence(args[0], tp_group, tensor_parallel_output_grad=False),)",
            "(gather_sequence(args[0], tensor_parallel_output_grad=False),)", "not the default group's"),
    Mistake("16.5", "skips-an-all-zero-flat", "template_experts.py",  # passed: no rank had all-zero gradients
            "            if ranks is not None:  # None: one copy", "            if ranks is not None and bool(flat.any()):  #",
            "also one whose gradients are all zero"),
    Mistake("12.1", "skips-a-bucket-of-zeros", "template_compression.py",  # passed: no bucket was all zero
            "    compressed = buffer.to(dtype).div_(group.size())\n",
            "    compressed = buffer.to(dtype).div_(group.size())\n    if not buffer.any():\n"
            "        future = torch.futures.Future()\n        future.set_result(buffer)\n        return future\n",
            "also one of zeros"),
    Mistake("10.5", "gradient-received-as-float32", "template_pipeline.py",  # passed: every model was float32
            "        output.backward(stage.recv_backward(output.shape, output.dtype))\n",
            "        output.backward(stage.recv_backward(output.shape, torch.float32))\n", "AND dtype"),
    Mistake("10.2", "sends-tagged-with-the-stage", "template_pipeline.py",  # was told its Work was dropped
            "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))",
            "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer, tag=self.stage_index))",
            "no receive matches them"),
    Mistake("13.3", "synced-never-copied", "template_local_sgd.py",  # was told it was copied before the step
            "synced.copy_(param.detach())", "pass", "or never"),
    Mistake("16.5", "all-reduce-not-waited", "template_experts.py",  # was told "not averaged"
            "                dist.all_reduce(flat, group=None if ranks == \"all\" else ranks)\n",
            "                dist.all_reduce(flat, group=None if ranks == \"all\" else ranks, async_op=True)\n",
            "were never waited for"),
    Mistake("16.1", "no-rows-skips-the-all-to-all", "template_experts.py",  # was told about message sizes only
            "        ctx.output_splits, ctx.input_splits, ctx.group = output_splits, input_splits, group\n",
            "        ctx.output_splits, ctx.input_splits, ctx.group = output_splits, input_splits, group\n"
            "        if x.shape[0] == 0:\n            return x.new_zeros((sum(output_splits), *x.shape[1:]))\n",
            "also one with no rows to send"),
    Mistake("16.1", "output-in-the-default-dtype", "template_experts.py",  # was a raw ValueError
            "        out = x.new_empty((sum(output_splits), *x.shape[1:]))\n",
            "        out = torch.empty((sum(output_splits), *x.shape[1:]))\n", "must have x's dtype"),
    Mistake("16.2", "output-splits-are-the-input-splits", "template_experts.py",  # was a raw split error
            "    output_splits = received.sum(dim=1).tolist()\n", "    output_splits = list(input_splits)\n",
            "the rows this rank RECEIVES"),
    Mistake("16.2", "counts-viewed-expert-major", "template_experts.py",  # was a raw "not equal to group size"
            "    received = received.view(size, len(experts))  # [source rank, local expert]\n",
            "    received = received.view(len(experts), size)\n", "one number per rank of the group"),
    # Tasks 16.1-16.4, trial 14 (d): what goes on the wire (dtype), what stays alive, drops, choices
    Mistake("16.1", "sent-as-float32", "template_experts.py",  # trial 14 (d): was a bare list of the calls
            "        out = x.new_empty((sum(output_splits), *x.shape[1:]))\n        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)\n        return out",
            "        out = x.new_empty((sum(output_splits), *x.shape[1:]), dtype=torch.float32)\n        dist.all_to_all_single(out, x.float().contiguous(), output_splits, input_splits, group=group)\n        return out.to(x.dtype)",
            "the rows went as ['float32']"),
    Mistake("16.1", "grad-sent-as-float32", "template_experts.py",  # trial 14 (d): was a bare list of the calls
            "        out = grad.new_empty((sum(ctx.input_splits), *grad.shape[1:]))\n        dist.all_to_all_single(out, grad.contiguous(), ctx.input_splits, ctx.output_splits, group=ctx.group)\n        return out, None, None, None",
            "        out = grad.new_empty((sum(ctx.input_splits), *grad.shape[1:]), dtype=torch.float32)\n        dist.all_to_all_single(out, grad.float().contiguous(), ctx.input_splits, ctx.output_splits, group=ctx.group)\n        return out.to(grad.dtype), None, None, None",
            "the rows went as ['float32'], the gradient"),
    Mistake("16.2", "tokens-sent-as-float32", "template_experts.py",  # trial 14 (d): was "has 4 rows, expected 4"
            "arrived = all_to_all(x[token], output_splits, input_splits, group)",
            "arrived = all_to_all(x[token].float(), output_splits, input_splits, group).to(x.dtype)",
            "they travelled as ['float32']"),
    Mistake("16.2", "tokens-gated-before-sending", "template_experts.py",  # trial 14 (d): was "has 19 rows, expected 19"
            "arrived = all_to_all(x[token], output_splits, input_splits, group)",
            "arrived = all_to_all(x[token] * routing.weight[token, choice].to(x.dtype).unsqueeze(-1), output_splits, input_splits, group)",
            "scaled (by their gates?) before they were sent"),
    Mistake("16.2", "output-splits-summed-over-ranks", "template_experts.py",  # trial 14 (d): was gloo's raw enforce failure
            "output_splits = received.sum(dim=1).tolist()",
            "output_splits = received.sum(dim=0).tolist()",
            "the ranks disagree on how many rows go"),
    Mistake("16.2", "counts-of-every-choice", "template_experts.py",  # trial 14 (d): was told output_splits were the rows it sends
            "counts = torch.bincount(expert, minlength=num_experts)",
            "counts = torch.bincount(routing.expert.reshape(-1), minlength=num_experts)",
            "the counts count every choice"),
    Mistake("16.3", "zeros-from-the-weights", "template_experts.py",  # trial 14 (d): was told to cast the gate, which it did
            "return back.new_zeros((tokens, back.shape[-1])).index_add(0, plan.token, gate * back)",
            "return plan.weight.new_zeros((tokens, back.shape[-1])).index_add(0, plan.token, gate * back)",
            "made in the gates' dtype"),
    Mistake("16.3", "only-first-choice-combined", "template_experts.py",  # trial 14 (d): was told it wrote choices over each other
            "gate = plan.weight[plan.token, plan.choice].to(back.dtype).unsqueeze(-1)",
            "gate = (plan.weight[plan.token, plan.choice] * (plan.choice == 0)).to(back.dtype).unsqueeze(-1)",
            "its FIRST choice's output alone"),
    Mistake("16.3", "gate-indexed-twice", "template_experts.py",  # trial 14 (d): was a raw index_add shape error
            "gate = plan.weight[plan.token, plan.choice].to(back.dtype).unsqueeze(-1)",
            "gate = plan.weight[plan.token][:, plan.choice].to(back.dtype).unsqueeze(-1)",
            "they were (K, K)"),
    Mistake("16.4", "aux-of-first-choices-only", "template_experts.py",  # trial 14 (d): was told to set self.aux_loss by that name
            "self.aux_loss = models.load_balancing_loss(probs, routing.expert, self.num_experts)",
            "self.aux_loss = models.load_balancing_loss(probs, routing.expert[:, :1], self.num_experts)",
            "computed otherwise than models.MoE's"),
    Mistake("16.4", "aux-accumulated", "template_experts.py",  # trial 14 (d): passed: one forward per layer
            "self.aux_loss = models.load_balancing_loss(probs, routing.expert, self.num_experts)",
            "aux = models.load_balancing_loss(probs, routing.expert, self.num_experts)\n        self.aux_loss = aux if self.aux_loss is None else self.aux_loss + aux",
            "the LAST forward's loss, set anew"),
    Mistake("16.4", "expert-inputs-kept", "template_experts.py",  # trial 14 (d): passed: nothing looked at the layer after a step
            "outputs = [expert(rows) for expert, rows in zip(self.experts, expert_inputs)]",
            "self.expert_inputs = expert_inputs\n        outputs = [expert(rows) for expert, rows in zip(self.experts, expert_inputs)]",
            "keeps ['expert_inputs'] on itself"),
    Mistake("16.2", "tokens-in-the-gates-dtype", "template_experts.py",  # trial 14 (d): passed: tokens and gates float64 alike
            "arrived = all_to_all(x[token], output_splits, input_splits, group)",
            "arrived = all_to_all(x[token].to(routing.weight.dtype), output_splits, input_splits, group)",
            "not in the gates' dtype"),
    Mistake("16.2", "plan-received-as-list", "template_experts.py",  # trial 14 (d): was "is [[13, 0], [6, 0]], expected [[13, 0], [6, 0]]"
            "return expert_inputs, Plan(token, choice, routing.weight, input_splits, output_splits, received)",
            "return expert_inputs, Plan(token, choice, routing.weight, input_splits, output_splits, received.tolist())",
            "the right numbers as a list"),
    Mistake("16.2", "counts-not-waited", "template_experts.py",  # trial 14 (d): was a raw allocation error (garbage split sizes)
            "dist.all_to_all_single(received, counts, group=group)  # E / N",
            "dist.all_to_all_single(received, counts, group=group, async_op=True)  # E / N",
            "its Work never waited for"),
    Mistake("14.2", "fc1-gathers-its-output", "template_sequence_parallel.py",  # was a raw shape error
            "column.from_linear(mlp.fc1, group)", "column.from_linear(mlp.fc1, group, gather_output=True)",
            "shapes do not chain"),
    # Tasks 10.1, 13.2, 14.2, trial 12 (2026-11-30, the lead): the error's kind, one-shot iterators
    Mistake("10.1", "asserts-instead-of-raising", "template_pipeline.py",  # the student's own message, nothing more
            "    if not 1 <= num_stages <= num_layers:\n"
            "        raise ValueError(f\"cannot split {num_layers} layers into {num_stages} stages: \"\n"
            "                         \"every stage needs at least one layer\")\n",
            "    assert num_stages <= num_layers, \"every stage needs at least one layer\"\n",
            "must raise a ValueError, as the docstring says"),
    Mistake("10.1", "returns-a-generator", "template_pipeline.py",  # was "your code raised TypeError" (the test's len)
            "    return range(start, start + base + (1 if stage < extra else 0))",
            "    return (i for i in range(start, start + base + (1 if stage < extra else 0)))",
            "returned an iterator (generator)"),
    # Task 10, trial 14 (a): wrong answers that passed (a pipeline on a group of other global ranks), or were told a
    # bare difference of stage 0's gradients, another task's cause, or a hang's generic one
    Mistake("10.2", "isend-to-group-dst-peer", "template_pipeline.py",  # trial 14 (a): passed (no group but the world)
            "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))\n",
            "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), group=self.group, group_dst=peer))\n",
            "group_dst= and group_src= take the group's own rank"),
    Mistake("10.3", "recv-from-group-src-peer", "template_pipeline.py",  # trial 14 (a): passed, as 10.2's
            "        dist.recv(tensor, peer)\n", "        dist.recv(tensor, group=self.group, group_src=peer)\n",
            "group_dst= and group_src= take the group's own rank"),
    Mistake("10.3", "returned-as-float32", "template_pipeline.py",  # trial 14 (a): told to receive in the given dtype
            "        return tensor.requires_grad_(requires_grad)\n",
            "        return tensor.float().requires_grad_(requires_grad)\n",
            "then returned the tensor in another dtype"),
    Mistake("10.4", "loss-summed-over-the-micro-batch", "template_pipeline.py",  # trial 14 (a): a bare difference
            "        output = loss_fn(output, target) / num_microbatches\n",
            "        output = loss_fn(output, target, reduction=\"sum\") / num_microbatches\n",
            "summed the micro-batch's losses"),
    Mistake("10.4", "loss-divided-by-the-micro-batch-size", "template_pipeline.py",  # trial 14 (a): a bare difference
            "        output = loss_fn(output, target) / num_microbatches\n",
            "        output = loss_fn(output, target) / len(target)\n",
            "divided the micro-batch's loss by its size"),
    Mistake("10.4", "logits-scaled-not-the-loss", "template_pipeline.py",  # trial 14 (a): a bare difference
            "        output = loss_fn(output, target) / num_microbatches\n",
            "        output = loss_fn(output / num_microbatches, target)\n",
            "divided the layers' output by M before loss_fn"),
    Mistake("10.4", "computed-with-the-whole-model", "template_pipeline.py",  # trial 14 (a): told 10.5's receive
            "    output = stage.module(input)\n", "    output = stage.whole(input)\n",
            "stage.whole is every stage's layers"),
    Mistake("10.4", "input-chosen-by-x", "template_pipeline.py",  # trial 14 (a): told to receive in the right dtype
            "    input = x if stage.is_first else stage.recv_forward(stage.input_shape, stage.input_dtype)\n",
            "    input = stage.recv_forward(stage.input_shape, stage.input_dtype) if x is None else x\n",
            "choose by stage.is_first, not by x"),
    Mistake("10.7", "warmup-below-zero-on-the-last-stage", "template_pipeline.py",  # trial 14 (a): a hang, told
            # "every stage must run each micro-batch"
            "    warmup = min(stage.num_stages - stage.stage_index - 1, num_microbatches)\n",
            "    warmup = min(stage.num_stages - stage.stage_index - 2, num_microbatches)\n",
            "started a forward after all M = "),
    Mistake("10.4", "keeps-the-last-output-on-the-stage", "template_pipeline.py",  # trial 14 (a): passed (only the
            # schedules' answers were counted)
            "    return input, output\n    # --- Task 10.4 end ---",
            "    stage.last_output = output  # for debugging\n    return input, output\n    # --- Task 10.4 end ---",
            "forward_step keeps its output"),
    Mistake("10.5", "keeps-the-last-pair-on-the-stage", "template_pipeline.py",  # trial 14 (a): passed, as 10.4's
            "    if not stage.is_first:\n        stage.send_backward(input.grad)\n",
            "    if not stage.is_first:\n        stage.send_backward(input.grad)\n"
            "    stage.last_pair = (input, output)  # for debugging\n", "backward_step keeps the output"),
    Mistake("10.6", "learn-shapes-at-the-first-step-only", "template_pipeline.py",  # trial 14 (a): passed (a Stage each M)
            "    # --- Task 10.6 begin ---\n    stage.learn_shapes(inputs, num_microbatches)\n",
            "    # --- Task 10.6 begin ---\n    if stage.input_shape is None:  # learnt at the first step\n"
            "        stage.learn_shapes(inputs, num_microbatches)\n", "not only the first"),
    Mistake("10.7", "learn-shapes-at-the-first-step-only", "template_pipeline.py",  # trial 14 (a): passed, as 10.6's
            "    # --- Task 10.7 begin ---\n    stage.learn_shapes(inputs, num_microbatches)\n",
            "    # --- Task 10.7 begin ---\n    if stage.input_shape is None:  # learnt at the first step\n"
            "        stage.learn_shapes(inputs, num_microbatches)\n", "not only the first"),
    Mistake("13.2", "remainder-of-the-count", "template_local_sgd.py",  # passed: lowered from 4 to 2, 4 % 2 == 0
            "        if self.local_step >= self.sync_every:  # >=: sync_every may have been lowered below the count\n",
            "        if self.local_step % self.sync_every == 0:\n", "nor a remainder, %"),
    Mistake("13.3", "remainder-of-the-count", "template_local_sgd.py",  # passed, as 13.2's
            "        if self.local_step < self.sync_every:\n            return loss\n",
            "        if self.local_step % self.sync_every:\n            return loss\n", "nor a remainder, %"),
    # Task 13, trial 14 (b): storage replaced, a count of tensors as divisor, two calls, a float64 copy sent,
    # the count carried over
    Mistake("13.1", "assigns-data", "template_local_sgd.py",  # trial 14 (b): passed: the values were right
            '                tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))',
            '                tensor.data = flat[offset:offset + tensor.numel()].view_as(tensor)',
            'now live in other memory (data_ptr() changed)'),
    Mistake("13.1", "divide-by-len", "template_local_sgd.py",  # trial 14 (b): was told the offset did not advance
            '            flat /= size',
            '            flat /= len(same)',
            'a count of tensors, len(...), is no divisor'),
    Mistake("13.1", "average-with-buffers-separately", "template_local_sgd.py",  # trial 14 (b): was told to make one flat buffer, which all_reduce_mean did
            '    buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]\n    all_reduce_mean(list(model.parameters()) + buffers, group)',
            '    all_reduce_mean(list(model.parameters()), group)\n    all_reduce_mean([buffer for buffer in model.buffers() if buffer.is_floating_point()], group)',
            'average_parameters called it (or dist.all_reduce) more than once'),
    Mistake("13.1", "flat-float64-always", "template_local_sgd.py",  # trial 14 (b): was told the two lists of the wire only
            '            flat = torch.cat([tensor.reshape(-1) for tensor in same])',
            '            flat = torch.cat([tensor.reshape(-1) for tensor in same]).double()',
            'a copy in another dtype went on the wire'),
    Mistake("13.2", "subtracts-sync-every", "template_local_sgd.py",  # trial 14 (b): was told the counts only, and 'outer steps'
            '            self.local_step = 0\n        return loss',
            '            self.local_step -= self.sync_every\n        return loss',
            'the 5 steps counted minus sync_every, not 0'),
    Mistake("13.1", "slice-assign-copy-back", "template_local_sgd.py",  # trial 14 (b): passed: no 0-dim tensor
            '                tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))',
            '                tensor[:] = flat[offset:offset + tensor.numel()].view_as(tensor)',
            'which has no slice to assign into'),
    Mistake("13.2", "closure-called-by-hand", "template_local_sgd.py",  # trial 14 (b): passed: SGD takes step() alike
            '        loss = self.optimizer.step(closure)',
            '        loss = None\n        if closure is not None:\n            with torch.enable_grad():\n                loss = closure()\n        self.optimizer.step()',
            'the inner optimizer\'s step got the closure'),
    # Task 13.3 and 11, trial 14 (c)
    Mistake("13.3", "closure-called-by-hand", "template_local_sgd.py",  # trial 14 (c): passed: AdamW takes step() alike
            '        loss = self.inner_optimizer.step(closure)',
            '        loss = None\n        if closure is not None:\n            with torch.enable_grad():\n                loss = closure()\n        self.inner_optimizer.step()',
            'the inner optimizer\'s step got the closure'),
    Mistake("13.3", "pseudo-gradients-kept-on-self", "template_local_sgd.py",  # trial 14 (c): passed: a model's worth kept
            "            for param, synced in zip(self.params, self.synced):\n                param.grad = synced.to(param.device) - param  # how far this rank went, as a gradient points\n",
            "            self.pseudo = [synced.to(param.device) - param for param, synced in zip(self.params, self.synced)]\n            for param, grad in zip(self.params, self.pseudo):\n                param.grad = grad\n",
            "were still alive once DiLoCo.step() had returned"),
    Mistake("13.3", "outer-step-one-step-late", "template_local_sgd.py",  # trial 14 (c): was told the counts only
            "        if self.local_step < self.sync_every:\n            return loss\n",
            "        if self.local_step <= self.sync_every:\n            return loss\n", "not `>`: after the sync_every-th step"),
    Mistake("11.2", "x-hat-kept-on-ctx", "template_batchnorm.py",  # trial 14 (c): passed: with affine=False, y is x_hat, a cycle
            '        ctx.save_for_backward(x_hat, invstd, weight)\n        ctx.count, ctx.group = count, group\n        y = x_hat\n        if weight is not None:\n            y = y * _per_channel(weight, x)\n        if bias is not None:\n            y = y + _per_channel(bias, x)\n        return y\n        # --- Task 11.2 end ---\n\n    @staticmethod\n    def backward(ctx, grad_y):\n        # --- Task 11.2 begin ---\n        x_hat, invstd, weight = ctx.saved_tensors\n',
            '        ctx.save_for_backward(invstd, weight)\n        ctx.x_hat = x_hat\n        ctx.count, ctx.group = count, group\n        y = x_hat\n        if weight is not None:\n            y = y * _per_channel(weight, x)\n        if bias is not None:\n            y = y + _per_channel(bias, x)\n        return y\n        # --- Task 11.2 end ---\n\n    @staticmethod\n    def backward(ctx, grad_y):\n        # --- Task 11.2 begin ---\n        invstd, weight = ctx.saved_tensors\n        x_hat = ctx.x_hat\n',
            "a reference cycle"),
    Mistake('11.3', 'convert-only-2d', "template_batchnorm.py",  # trial 14 (c): was told to return the new layer
            '        if isinstance(module, nn.modules.batchnorm._BatchNorm):\n            converted = cls(',
            '        if isinstance(module, nn.BatchNorm2d):\n            converted = cls(',
            'not one class'),
    Mistake('11.3', 'convert-children-lose-the-group', "template_batchnorm.py",  # trial 14 (c): was told the fact only
            '            converted.add_module(name, cls.convert_sync_batchnorm(child, process_group))',
            '            converted.add_module(name, cls.convert_sync_batchnorm(child))',
            'pass it on in the recursion'),
    Mistake("11.3", 'function-without-the-group', "template_batchnorm.py",  # trial 14 (c): was told to give x itself, not detached
            '            return SyncBatchNormFunction.apply(x, self.weight, self.bias, mean, var, count, self.eps,\n                                               self.process_group)',
            '            return SyncBatchNormFunction.apply(x, self.weight, self.bias, mean, var, count, self.eps, None)',
            'give self.process_group to SyncBatchNormFunction.apply too'),
    Mistake("11.3", 'convert-clones-none-buffers', "template_batchnorm.py",  # trial 14 (c): a raw AttributeError
            '            converted.num_batches_tracked = module.num_batches_tracked\n',
            '            converted.num_batches_tracked = module.num_batches_tracked.clone()\n',
            'None stays None'),
    Mistake("12.2", "epsilon-under-the-square-root", "template_compression.py",  # passed: the only epsilon case was 0
            "        col /= torch.linalg.vector_norm(col, dim=0, keepdim=True) + epsilon\n",
            "        col /= torch.sqrt((col * col).sum() + epsilon)\n", "not by sqrt(sum of squares + epsilon)"),
    Mistake("12.2", "norm-floored-at-epsilon", "template_compression.py",  # passed, as the one above
            "        col /= torch.linalg.vector_norm(col, dim=0, keepdim=True) + epsilon\n",
            "        col /= torch.linalg.vector_norm(col).clamp(min=epsilon)\n", "nor by the norm floored at epsilon"),
]


@dataclasses.dataclass(frozen=True)
class RightAnswer:
    """A right answer written otherwise than the solution: `edits` (Mistakes whose hint is unused) turn
    the solution into it, and the task's tests must pass it (tests/test_mistakes.py). Each is a choice
    its docstring makes on purpose: accepted, not merely not caught."""
    task: str
    name: str
    why: str  # what the docstring says that makes it right
    edits: tuple

    @property
    def marker(self):
        return "task" + self.task.replace(".", "_")


RIGHT_ANSWERS = [
    RightAnswer("4.4", "load-state-dict",  # trial 8 (A): passes; kept so
                "'Overwrite each replica's tensors with copy_ (CPU -> device) under torch.no_grad()': "
                "load_state_dict copies each parameter and (persistent) buffer so, into the replica's own tensors", (
        Mistake("4.4", "load-state-dict", "template_replicas.py",
                "    with torch.no_grad():\n"
                "        sources = list(master.parameters()) + list(master.buffers())\n"
                "        for replica in replicas:\n"
                "            for target, source in zip(list(replica.parameters()) + list(replica.buffers()), sources):\n"
                "                target.copy_(source)\n",
                "    for replica in replicas:\n"
                "        replica.load_state_dict(master.state_dict())  # copy_ into its own tensors, under no_grad\n", ""),)),
    # Task 4, trial 10 (2026-11-29): right answers written otherwise
    RightAnswer("4.1", "copy-then-move-in-place",
                "'one independent copy of master on each device': Module.to moves the copy in place", (
        Mistake("4.1", "copy-then-move-in-place", "template_replicas.py",
                "    return [copy.deepcopy(master).to(device) for device in devices]",
                "    copies = []\n"
                "    for device in devices:\n"
                "        replica = copy.deepcopy(master)\n"
                "        replica.to(device)  # in place: the copy moves, the master stays\n"
                "        copies.append(replica)\n"
                "    return copies", ""),)),
    RightAnswer("4.2", "split-by-sizes",
                "'The lengths differ by at most one, the longer first, as torch.tensor_split makes them'", (
        Mistake("4.2", "split-by-sizes", "template_replicas.py",
                "    chunks = zip(images.tensor_split(len(devices)), labels.tensor_split(len(devices)))",
                "    base, extra = divmod(len(labels), len(devices))\n"
                "    sizes = [base + (i < extra) for i in range(len(devices))]\n"
                "    chunks = zip(torch.split(images, sizes), torch.split(labels, sizes))", ""),
        Mistake("4.2", "non-blocking", "template_replicas.py",
                "(x.to(device), y.to(device)) for (x, y)",
                "(x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for (x, y)", ""))),
    RightAnswer("4.2", "labels-to-the-images-device",
                "'pair i on devices[i]': the labels go to the device their images are on", (
        Mistake("4.2", "labels-to-the-images-device", "template_replicas.py",
                "    return [(x.to(device), y.to(device)) for (x, y), device in zip(chunks, devices)]",
                "    pairs = []\n"
                "    for (x, y), device in zip(chunks, devices):\n"
                "        x = x.to(device)\n"
                "        pairs.append((x, y.to(x.device)))\n"
                "    return pairs", ""),)),
    RightAnswer("4.3", "stacked-weights",
                "'master.grad = sum over replicas i of (n_i / n) * replica_i.grad': one weighted sum of a stack", (
        Mistake("4.3", "stacked-weights", "template_replicas.py",
                "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
                "        stacked = torch.stack([p.grad.cpu() for p in replica_params])\n"
                "        weights = torch.tensor(chunk_sizes, dtype=stacked.dtype) / total\n"
                "        param.grad = (weights.view(-1, *[1] * param.dim()) * stacked).sum(0)", ""),)),
    RightAnswer("4.3", "in-place-on-a-copy",
                "'copied to the CPU first': in-place arithmetic on that copy leaves the replicas' gradients alone; "
                "a parameter no replica has a gradient for set to None ('keeps .grad None')", (
        Mistake("4.3", "in-place-on-a-copy", "template_replicas.py",
                "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
                "        param.grad = replica_params[0].grad.to('cpu', copy=True).mul_(chunk_sizes[0] / total)\n"
                "        for p, n in zip(replica_params[1:], chunk_sizes[1:]):\n"
                "            param.grad.add_(p.grad.cpu(), alpha=n / total)", ""),
        Mistake("4.3", "sets-none", "template_replicas.py",
                "        if replica_params[0].grad is None:\n            continue\n",
                "        if any(p.grad is None for p in replica_params):\n"
                "            param.grad = None\n            continue\n", ""))),
    RightAnswer("4.3", "frees-the-replicas-gradients",
                "'set the master's .grad to the replicas' gradients averaged': nothing asks to keep the replicas' "
                "once read, and train_step sets them anew every step", (
        Mistake("4.3", "frees-the-replicas-gradients", "template_replicas.py",
                "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))",
                "        param.grad = sum(p.grad.cpu() * (n / total) for p, n in zip(replica_params, chunk_sizes))\n"
                "        for p in replica_params:  # read once: free the replicas' memory until the next backward\n"
                "            p.grad = None", ""),)),
    RightAnswer("4.4", "data-copy-and-by-name",
                "'copy the master's parameters and buffers into every replica, in place' without autograd "
                "recording it: .data.copy_ does not record either", (
        Mistake("4.4", "data-copy", "template_replicas.py",
                "    with torch.no_grad():\n"
                "        sources = list(master.parameters()) + list(master.buffers())\n"
                "        for replica in replicas:\n"
                "            for target, source in zip(list(replica.parameters()) + list(replica.buffers()), sources):\n"
                "                target.copy_(source)\n",
                "    for replica in replicas:\n"
                "        mine = dict(replica.named_parameters()) | dict(replica.named_buffers())\n"
                "        for name, source in list(master.named_parameters()) + list(master.named_buffers()):\n"
                "            mine[name].data.copy_(source.data, non_blocking=True)\n", ""),)),
    RightAnswer("4.4", "state-dict-on-both-sides",
                "'Overwrite each replica's tensors with copy_': a state_dict's tensors are the module's own, "
                "detached, and both sides list them in the same order", (
        Mistake("4.4", "state-dict-on-both-sides", "template_replicas.py",
                "    with torch.no_grad():\n"
                "        sources = list(master.parameters()) + list(master.buffers())\n"
                "        for replica in replicas:\n"
                "            for target, source in zip(list(replica.parameters()) + list(replica.buffers()), sources):\n"
                "                target.copy_(source)\n",
                "    for replica in replicas:\n"
                "        for target, source in zip(replica.state_dict().values(), master.state_dict().values()):\n"
                "            target.copy_(source)  # detached views of the replica's own tensors\n", ""),)),
    RightAnswer("6.2", "data-reshape-narrow",
                "'view = param.detach().view(-1)[start:end]: a 1-D tensor that shares the parameter's memory': "
                "param.data.reshape(-1).narrow(...) is that tensor; the group's options copied key by key", (
        Mistake("6.2", "data-reshape-narrow", "template_zero.py",
                "            view = params[index].detach().view(-1)[start:end]  # shares the parameter's memory\n",
                "            view = params[index].data.reshape(-1).narrow(0, start, end - start)  # shares the memory\n", ""),
        Mistake("6.2", "data-reshape-narrow", "template_zero.py",
                "        local_group = {**param_group, \"params\": mine}\n",
                "        local_group = {key: value for key, value in param_group.items() if key != \"params\"}\n"
                "        local_group[\"params\"] = mine\n", ""),)),
    RightAnswer("10.4", "returns-early-on-a-middle-stage",
                "'On the last stage, output is the loss instead ... On the other stages, send output to the next "
                "stage': the last stage known by next_rank None, an early return, the loss divided by .div", (
        Mistake("10.4", "returns-early-on-a-middle-stage", "template_pipeline.py",
                "    input = x if stage.is_first else stage.recv_forward(stage.input_shape, stage.input_dtype)\n"
                "    output = stage.module(input)\n"
                "    if stage.is_last:\n"
                "        output = loss_fn(output, target) / num_microbatches\n"
                "    else:\n"
                "        stage.send_forward(output)\n"
                "    return input, output\n",
                "    if stage.is_first:\n"
                "        input = x\n"
                "    else:\n"
                "        input = stage.recv_forward(stage.input_shape, stage.input_dtype)\n"
                "    output = stage.module(input)\n"
                "    if stage.next_rank is not None:\n"
                "        stage.send_forward(output)\n"
                "        return input, output\n"
                "    return input, loss_fn(output, target).div(num_microbatches)\n", ""),)),
    RightAnswer("15.2", "mask-only-the-diagonal-block", "block_pairs keeps a key chunk before its query chunk, wholly "
                "visible: only the pair of equal ids needs the causal mask (the test's check of an unmasked block "
                "looks at the positions, not at the flag)", (
        Mistake("15.2", "mask-only-the-diagonal-block", "template_context_parallel.py",
                "_pieces(kv[1], k_chunks)[j],\n                                           causal, q_chunks[i][1], k_chunks[j][1])",
                "_pieces(kv[1], k_chunks)[j],\n                                           "
                "causal and q_chunks[i][0] == k_chunks[j][0], q_chunks[i][1], k_chunks[j][1])", ""),)),
    RightAnswer("12.3", "p-averaged-not-summed", "orthogonalising P removes any positive factor", (
        Mistake("12.3", "p-averaged-not-summed", "template_compression.py",
                "    dist.all_reduce(state.p_memory_dict[index], group=group)  # the sum: orthogonalizing removes the N\n",
                "    dist.all_reduce(state.p_memory_dict[index], group=group)\n"
                "    state.p_memory_dict[index].div_(world_size)\n", ""),)),
    RightAnswer("12.3", "iter-counted-after-the-check", "maybe_increase_iter right after the comparison", (
        Mistake("12.3", "iter-counted-after-the-check", "template_compression.py",
                "    index, dtype = bucket.index(), buffer.dtype\n",
                "    state.maybe_increase_iter(bucket)  # compressed: counted here, not in decompress\n"
                "    index, dtype = bucket.index(), buffer.dtype\n", ""),
        Mistake("12.3", "iter-counted-after-the-check", "template_compression.py",
                "        state.maybe_increase_iter(bucket)\n        return buffer\n", "        return buffer\n", ""))),
    # Task 12, trial 9 (2026-11-29): right answers written otherwise
    RightAnswer("12.1", "decompress-reads-the-compressed-tensor",
                "'decompress copies the reduced tensor back into bucket.buffer()': all_reduce reduces in place, so the compressed tensor is the reduced one", (
        Mistake("12.1", "decompress-reads-the-compressed-tensor", "template_compression.py",
                "        buffer.copy_(future.value()[0])\n",
                "        buffer.copy_(compressed)  # all_reduce works in place\n", ""),)),
    RightAnswer("12.1", "returns-a-new-tensor",
                "'returns a torch.futures.Future whose value is the buffer AVERAGED over the ranks' (PyTorch's contract): a new tensor of the buffer's dtype holding the mean is that value", (
        Mistake("12.1", "returns-a-new-tensor", "template_compression.py",
                "        buffer.copy_(future.value()[0])\n        return buffer\n",
                "        return future.value()[0].to(buffer.dtype)\n", ""),)),
    RightAnswer("12.2", "classical-gram-schmidt",
                "'Make the columns of matrix orthonormal, in place, by Gram-Schmidt': classical Gram-Schmidt gives the same columns at epsilon 0 up to rounding", (
        Mistake("12.2", "classical-gram-schmidt", "template_compression.py",
                "    num_cols = matrix.shape[1]\n    for i in range(num_cols):\n        col = matrix[:, i:i + 1]\n        col /= torch.linalg.vector_norm(col, dim=0, keepdim=True) + epsilon\n        if i + 1 < num_cols:\n            rest = matrix[:, i + 1:]\n            rest -= torch.sum(col * rest, dim=0, keepdim=True) * col",
                "    for j in range(matrix.shape[1]):\n        col = matrix[:, j]\n        done = matrix[:, :j]\n        col -= done @ (done.T @ col)\n        col /= torch.linalg.vector_norm(col) + epsilon", ""),)),
    RightAnswer("12.3", "p-buffer-made-anew",
                "'With a warm start, the Qs are last step's averaged Qs': P = M Q is recomputed every step, so a new P buffer each step changes nothing", (
        Mistake("12.3", "p-buffer-made-anew", "template_compression.py",
                "    if new_qs:\n        state.p_memory_dict[index] = torch.empty(",
                "    if True:  # P is recomputed every step; only Q warm-starts\n        state.p_memory_dict[index] = torch.empty(", ""),
        Mistake("12.3", "p-buffer-made-anew", "template_compression.py",
                "                                                 device=buffer.device)\n        state.q_memory_dict[index] = torch.empty(",
                "                                                 device=buffer.device)\n    if new_qs:\n        state.q_memory_dict[index] = torch.empty(", ""),)),
    RightAnswer("12.3", "m-divided-not-q",
                "'divide the Q buffer by N; M' = P Q^T': P (Q/N)^T = (P Q^T)/N, and the next step orthogonalises the kept (summed) Q, which removes the factor, as for P", (
        Mistake("12.3", "m-divided-not-q", "template_compression.py",
                "        state.q_memory_dict[index].div_(world_size)\n        for (matrix, _), p, q in zip(matrices, ps, qs):\n            torch.matmul(p, q.T, out=matrix)",
                "        for (matrix, _), p, q in zip(matrices, ps, qs):\n            torch.matmul(p, q.T, out=matrix)\n            matrix.div_(world_size)", ""),)),
    RightAnswer("12.3", "whole-divided-before-the-sum",
                "'the tensors sent whole: concatenated flat, all-reduced (blocking), divided by N': divided before the "
                "sum instead, the mean is the same up to rounding", (
        Mistake("12.3", "whole-divided-before-the-sum", "template_compression.py",
                "        flat = torch.cat([tensor.reshape(-1) for tensor in whole])\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.div_(world_size).split([t.numel() for t in whole])):",
                "        flat = torch.cat([tensor.reshape(-1) for tensor in whole]).div_(world_size)\n        dist.all_reduce(flat, group=group)\n        for tensor, mean in zip(whole, flat.split([t.numel() for t in whole])):", ""),)),
    RightAnswer("12.3", "buffer-divided-at-the-end",  # trial 14 (e)
                "'M\' = P Q^T approximates the average': the sums (Q's and the tensors sent whole) written in, then the whole buffer divided by N, is that average up to rounding", (
        Mistake("12.3", "buffer-divided-at-the-end", "template_compression.py",
                '        state.q_memory_dict[index].div_(world_size)\n        for (matrix, _), p, q in zip(matrices, ps, qs):\n            torch.matmul(p, q.T, out=matrix)\n',
                '        for (matrix, _), p, q in zip(matrices, ps, qs):\n            torch.matmul(p, q.T, out=matrix)\n        buffer.div_(world_size)\n', ""),
        Mistake("12.3", "buffer-divided-at-the-end", "template_compression.py",
                '        for tensor, mean in zip(whole, flat.div_(world_size).split(',
                '        for tensor, mean in zip(whole, flat.split(', ""),)),
    RightAnswer("12.3", "no-zero-residual-the-first-time",  # trial 14 (e)
                "'add state.error_dict[i] to bucket.buffer() in place (a zero residual the first time)': adding nothing the first time is adding zero", (
        Mistake("12.3", "no-zero-residual-the-first-time", "template_compression.py",
                '            state.error_dict[index] = torch.zeros_like(buffer)\n',
                '            pass\n', ""),)),
    RightAnswer("12.3", "whole-async-then-wait",  # trial 14 (e)
                "'the tensors sent whole: concatenated flat, all-reduced (blocking)': async_op=True and an immediate wait() block the same", (
        Mistake("12.3", "whole-async-then-wait", "template_compression.py",
                '        dist.all_reduce(flat, group=group)\n',
                '        dist.all_reduce(flat, group=group, async_op=True).wait()\n', ""),)),
    RightAnswer("12.3", "reshape-and-copy",  # trial 14 (e)
                "'view each as (shape[0], -1)', M' written 'through the views into the buffer': reshape of a contiguous view is that view, and matrix.copy_(p @ q.T) writes through it", (
        Mistake("12.3", "reshape-and-copy", "template_compression.py",
                '        matrix = tensor.view(tensor.shape[0], -1)',
                '        matrix = tensor.reshape(tensor.shape[0], -1)', ""),
        Mistake("12.3", "reshape-and-copy", "template_compression.py",
                '            torch.matmul(p, q.T, out=matrix)',
                '            matrix.copy_(p @ q.T)', ""),)),
    RightAnswer("12.3", "q-views-divided",  # trial 14 (e)
                "'decompress: divide the Q buffer by N': dividing each Q, a view into that buffer, divides the same numbers", (
        Mistake("12.3", "q-views-divided", "template_compression.py",
                '        state.q_memory_dict[index].div_(world_size)\n        for (matrix, _), p, q in zip(matrices, ps, qs):\n',
                '        for (matrix, _), p, q in zip(matrices, ps, qs):\n            q.div_(world_size)\n', ""),)),
    RightAnswer("13.3", "parameters-averaged-then-pseudo-gradient", "synced - mean(param) is mean(synced - param)", (
        Mistake("13.3", "parameters-averaged-then-pseudo-gradient", "template_local_sgd.py",
                "            for param, synced in zip(self.params, self.synced):\n"
                "                param.grad = synced.to(param.device) - param  # how far this rank went, as a gradient points\n"
                "            buffers = [buffer for buffer in self.model.buffers() if buffer.is_floating_point()]\n"
                "            all_reduce_mean([param.grad for param in self.params] + buffers, self.group)\n",
                "            average_parameters(self.model, self.group)\n"
                "            for param, synced in zip(self.params, self.synced):\n"
                "                param.grad = synced.to(param.device) - param\n", ""),)),
    RightAnswer("13.1", "reduce-op-avg",  # helper-a (2026-11-29)
                "'all-reduce that buffer once with SUM, divide it by the GROUP's size': ReduceOp.AVG over the group "
                "does both (gloo takes it for floats since torch 2.7)", (
        Mistake("13.1", "reduce-op-avg", "template_local_sgd.py",
                "            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)  # gloo has AVG only since torch 2.7\n"
                "            flat /= size\n",
                "            dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=group)\n", ""),)),
    RightAnswer("13.1", "copied-back-through-split",  # helper-a (2026-11-29)
                "'copy each slice back into its tensor': flat.split by the tensors' sizes gives the same slices", (
        Mistake("13.1", "copied-back-through-split", "template_local_sgd.py",
                "            offset = 0\n            for tensor in same:\n"
                "                tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))\n"
                "                offset += tensor.numel()\n",
                "            for tensor, piece in zip(same, flat.split([t.numel() for t in same])):\n"
                "                tensor.copy_(piece.view(tensor.shape))\n", ""),)),
    RightAnswer("13.3", "synced-rebuilt-as-new-cpu-copies",  # helper-a (2026-11-29)
                "'the result is the new synced value': a new list of CPU copies holds the same values as copying into "
                "the old one", (
        Mistake("13.3", "synced-rebuilt-as-new-cpu-copies", "template_local_sgd.py",
                "        for param, synced in zip(self.params, self.synced):\n"
                "            synced.copy_(param.detach())  # after the outer step: where the next round starts\n",
                "        self.synced = [param.detach().to('cpu', copy=True) for param in self.params]\n", ""),)),
    RightAnswer("13.3", "pseudo-gradients-by-foreach-sub",  # helper-a (2026-11-29)
                "'synced - param, as param.grad, on the parameter's device': torch._foreach_sub gives the same "
                "tensors in one call", (
        Mistake("13.3", "pseudo-gradients-by-foreach-sub", "template_local_sgd.py",
                "            for param, synced in zip(self.params, self.synced):\n"
                "                param.grad = synced.to(param.device) - param  # how far this rank went, as a gradient points\n",
                "            pseudo = torch._foreach_sub([synced.to(param.device) for param, synced in zip(self.params, "
                "self.synced)], [param.detach() for param in self.params])\n"
                "            for param, grad in zip(self.params, pseudo):\n                param.grad = grad\n", ""),)),
    RightAnswer("11.1", "raw-sums-in-float64",  # trial 14 (c): passes
                "'or all-reduce packed sums in float64, where that cancellation costs about 1e-16 * mean^2 / var': "
                "sum(x) and sum(x * x) of x.double(), no per-rank mean first", (
        Mistake("11.1", "raw-sums-in-float64", "template_batchnorm.py",
                "    if n > 0:\n        # each rank's own mean and squared deviations, stable in x's dtype (torch.var_mean\n        # never forms E[x^2]); then sums in float64: sum(x^2) = M2 + n * mean^2 is then\n        # exact enough for the subtraction below\n        var, mean = torch.var_mean(x, dim=dims, correction=0)\n        mean, m2 = mean.double(), var.double() * n\n    else:  # nothing here, but this rank must still take part in the all-reduce\n        mean = m2 = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)\n    packed = torch.cat([torch.tensor([float(n)], dtype=torch.float64, device=x.device), n * mean, m2 + n * mean ** 2])\n",
                "    xd = x.double()  # sums in float64: the docstring's second way\n    packed = torch.cat([torch.tensor([float(n)], dtype=torch.float64, device=x.device), xd.sum(dims), (xd * xd).sum(dims)])\n", ""),)),
    RightAnswer("11.2", "sums-stacked-and-unbound",  # trial 14 (c): passes
                "'sum this rank's, then ONE all-reduce (SUM) of both packed together': torch.stack packs them as "
                "well as torch.cat, and SUM is all_reduce's default op", (
        Mistake("11.2", "sums-stacked-and-unbound", "template_batchnorm.py", '            packed = torch.cat([sum_dy, sum_dy_xhat])\n            dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=ctx.group)  # the global sums\n            global_dy, global_dy_xhat = packed.chunk(2)',
                '            packed = torch.stack([sum_dy, sum_dy_xhat])\n            dist.all_reduce(packed, group=ctx.group)\n            global_dy, global_dy_xhat = packed.unbind(0)', ""),)),
    RightAnswer("11.1", "count-as-a-tensor",  # trial 14 (c): passes
                "'count is the global number of elements per channel ..., an int or a tensor'", (
        Mistake("11.1", "count-as-a-tensor", "template_batchnorm.py", '    return global_mean.to(x.dtype), global_var.to(x.dtype), int(count.item())',
                '    return global_mean.to(x.dtype), global_var.to(x.dtype), count', ""),)),
    RightAnswer("13.3", "buffers-before-the-pseudo-gradients",  # trial 14 (c): passes
                "'Averaged over the group in one all-reduce (all_reduce_mean), together with the floating-point "
                "buffers': one call, in either order", (
        Mistake("13.3", "buffers-before-the-pseudo-gradients", "template_local_sgd.py",
                "            all_reduce_mean([param.grad for param in self.params] + buffers, self.group)",
                "            all_reduce_mean(buffers + [param.grad for param in self.params], self.group)", ""),)),
    RightAnswer("13.3", "outer-step-in-an-if-block",  # trial 14 (c): passes
                "'after every sync_every-th inner step, the outer step' and 'returns the closure's loss': one return "
                "after an if-block gives both, as the early return does", (
        Mistake("13.3", "outer-step-in-an-if-block", "template_local_sgd.py", '        loss = self.inner_optimizer.step(closure)\n        self.local_step += 1\n        if self.local_step < self.sync_every:\n            return loss\n        self.local_step = 0\n        with torch.no_grad():\n            for param, synced in zip(self.params, self.synced):\n                param.grad = synced.to(param.device) - param  # how far this rank went, as a gradient points\n            buffers = [buffer for buffer in self.model.buffers() if buffer.is_floating_point()]\n            all_reduce_mean([param.grad for param in self.params] + buffers, self.group)\n            for param, synced in zip(self.params, self.synced):\n                param.copy_(synced)  # the outer step starts where the round started\n        self.outer_optimizer.step()  # its momentum persists: built once, in __init__\n        self.outer_optimizer.zero_grad()\n        for param, synced in zip(self.params, self.synced):\n            synced.copy_(param.detach())  # after the outer step: where the next round starts\n        return loss\n',
                '        loss = self.inner_optimizer.step(closure)\n        self.local_step += 1\n        if self.local_step >= self.sync_every:  # the outer step in a block, no early return\n            self.local_step = 0\n            with torch.no_grad():\n                for param, synced in zip(self.params, self.synced):\n                    param.grad = synced.to(param.device) - param  # how far this rank went, as a gradient points\n                buffers = [buffer for buffer in self.model.buffers() if buffer.is_floating_point()]\n                all_reduce_mean([param.grad for param in self.params] + buffers, self.group)\n                for param, synced in zip(self.params, self.synced):\n                    param.copy_(synced)  # the outer step starts where the round started\n            self.outer_optimizer.step()  # its momentum persists: built once, in __init__\n            self.outer_optimizer.zero_grad()\n            for param, synced in zip(self.params, self.synced):\n                synced.copy_(param.detach())  # after the outer step: where the next round starts\n        return loss\n', ""),)),
    RightAnswer("13.3", "outer-gradients-set-to-none", "zero_grad(set_to_none=True) is zero_grad()'s default", (
        Mistake("13.3", "outer-gradients-set-to-none", "template_local_sgd.py",
                "        self.outer_optimizer.zero_grad()\n", "        self.outer_optimizer.zero_grad(set_to_none=True)\n",
                ""),)),
    RightAnswer("7.2", "copied-after-wait-all",
                "'returning None after a blocking gather is correct too, only slower': a gather into a buffer of "
                "its own, waited for through its Future (torch.futures.wait_all) before the copy into self.full", (
        Mistake("7.2", "copied-after-wait-all", "template_fsdp.py",
                "        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), "
                "async_op=async_op)",
                "        gathered = torch.empty_like(self.full)\n"
                "        work = dist.all_gather_into_tensor(gathered, self.shard.detach().to(self.compute_dtype), "
                "async_op=True)\n"
                "        torch.futures.wait_all([work.get_future()])\n"
                "        self.full.copy_(gathered)\n", ""),)),
    RightAnswer("7.4", "waited-inside-returns-none",
                "'(A blocking reduce-scatter and (None, tensor) is correct too, only slower.)': an async_op=True "
                "reduce-scatter waited for inside (wait()) is one (gloo's Work for it has no get_future(), and its "
                "is_completed() never turns True: wait() is the way here)", (
        Mistake("7.4", "waited-inside-returns-none", "template_fsdp.py",
                "        return handle, piece\n", "        handle.wait()\n        return None, piece\n", ""),)),
    RightAnswer("14.1", "own-rows-into-the-constructor",
                "'a column-parallel layer ... whose weight and bias are the rows of rank r's heads in q, then in "
                "k, then in v ... held in new tensors of that size': the layer's own constructor takes them, no "
                "from_linear asked", (
        Mistake("14.1", "own-rows-into-the-constructor", "template_sequence_parallel.py",
                "    order = torch.arange(3 * dim).view(3, size, dim // size).transpose(0, 1).reshape(-1)\n"
                "    regrouped = nn.Linear(dim, 3 * dim, bias=attn.qkv.bias is not None, device=\"meta\")\n"
                "    regrouped.weight = nn.Parameter(attn.qkv.weight.detach()[order])\n"
                "    if attn.qkv.bias is not None:\n"
                "        regrouped.bias = nn.Parameter(attn.qkv.bias.detach()[order])\n"
                "    attn.qkv = column.from_linear(regrouped, group)\n",
                "    def mine(t):  # this rank's heads of q, of k and of v: a new tensor of 3 * dim / N rows\n"
                "        return None if t is None else torch.cat([part.chunk(size, dim=0)[rank] for part in t.detach().chunk(3)])\n"
                "    attn.qkv = column(mine(attn.qkv.weight), mine(attn.qkv.bias), dim, 3 * dim, group)\n", ""),)),
    RightAnswer("14.3", "into-tensor-collectives",
                "'all-gathered' and 'reduce-scattered (SUM)': the docstrings name the collectives, not the calls;"
                " all_gather_into_tensor and reduce_scatter_tensor take the ranks' pieces one after another along"
                " dim 0", (
        Mistake("14.3", "into-tensor-collectives", "template_sequence_parallel.py",
                "        pieces = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]\n"
                "        dist.all_gather(pieces, x.contiguous(), group=group)\n"
                "        return torch.cat(pieces, dim=1)\n",
                "        size = dist.get_world_size(group)\n"
                "        out = x.new_empty((size * x.shape[0], *x.shape[1:]))  # the ranks' shards one after another along dim 0\n"
                "        dist.all_gather_into_tensor(out, x.contiguous(), group=group)\n"
                "        return torch.cat(out.chunk(size, dim=0), dim=1)\n", ""),
        Mistake("14.3", "into-tensor-collectives", "template_sequence_parallel.py",
                "        pieces = [piece.contiguous() for piece in x.chunk(size, dim=1)]\n"
                "        out = torch.empty_like(pieces[0])\n"
                "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group)\n"
                "        return out\n",
                "        stacked = torch.cat(x.chunk(size, dim=1), dim=0).contiguous()  # rank j's tokens j-th along dim 0\n"
                "        out = x.new_empty((x.shape[0], x.shape[1] // size, *x.shape[2:]))\n"
                "        dist.reduce_scatter_tensor(out, stacked, group=group)\n"
                "        return out\n", ""),
        Mistake("14.3", "into-tensor-collectives", "template_sequence_parallel.py",
                "        pieces = [torch.empty_like(grad, memory_format=torch.contiguous_format) for _ in range(size)]\n"
                "        dist.all_gather(pieces, grad.contiguous(), group=ctx.group)\n"
                "        return torch.cat(pieces, dim=1), None\n",
                "        gathered = grad.new_empty((size * grad.shape[0], *grad.shape[1:]))\n"
                "        dist.all_gather_into_tensor(gathered, grad.contiguous(), group=ctx.group)\n"
                "        return torch.cat(gathered.chunk(size, dim=0), dim=1), None\n", ""),)),
    RightAnswer("14.3", "waited-through-the-future",  # trial D: rejected as "never waited" by the first version
                "'all-gathered': an async_op=True Work waited for through its Future (get_future().wait()) has "
                "finished as one waited with wait()", (
        Mistake("14.3", "waited-through-the-future", "template_sequence_parallel.py",
                "        dist.all_gather(pieces, x.contiguous(), group=group)\n",
                "        dist.all_gather(pieces, x.contiguous(), group=group, async_op=True).get_future().wait()\n", ""),)),
    RightAnswer("14.5", "polled-until-completed",  # trial D: rejected as "never waited" by the first version
                "'one all-reduce (SUM) over group per dtype': a Work polled until is_completed() says True has "
                "finished", (
        Mistake("14.5", "polled-until-completed", "template_sequence_parallel.py",
                "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n",
                "        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True)\n"
                "        while not work.is_completed():\n            pass\n", ""),)),
    RightAnswer("14.4", "row-bias-added-in-place",
                "'the bias counted once', after the reduce-scatter: y is the reduce-scatter's new tensor, which "
                "autograd saved nowhere, so y += bias is y + bias", (
        Mistake("14.4", "row-bias-added-in-place", "template_sequence_parallel.py",
                "        y = reduce_scatter_sequence(F.linear(x, self.weight), self.group)\n"
                "        return y if self.bias is None else y + self.bias  # after the sum, on this rank's tokens: once\n",
                "        y = reduce_scatter_sequence(F.linear(x, self.weight), self.group)\n"
                "        if self.bias is not None:\n"
                "            y += self.bias  # y is a new tensor (the reduce-scatter's): adding in place changes nothing autograd saved\n"
                "        return y\n", ""),)),
    RightAnswer("14.5", "row-biases-by-class",  # a student trial: rejected as "left as it was" by the old loader
                "'the row-parallel layers' biases (split_dim == 1)': the layers of the block are this file's "
                "SequenceParallelRowLinear under sequence parallelism, so isinstance finds the same biases", (
        Mistake("14.5", "row-biases-by-class", "template_sequence_parallel.py",
                "            elif getattr(module, \"split_dim\", None) == 1 and module.bias is not None:\n",
                "            elif isinstance(module, SequenceParallelRowLinear) and module.bias is not None:\n", ""),)),
    RightAnswer("14.5", "norms-and-row-biases-by-name",
                "'the LayerNorms' weights and biases and the row-parallel layers' biases ... one all-reduce (SUM)"
                " over group per dtype': in a models.Block they are norm1, norm2, attn.proj.bias and "
                "mlp.fc2.bias, in any order", (
        Mistake("14.5", "norms-and-row-biases-by-name", "template_sequence_parallel.py",
                "    params = {}\n"
                "    for block in model.modules():\n"
                "        if not getattr(block, \"sequence_parallel\", False):\n"
                "            continue\n"
                "        for module in block.modules():\n"
                "            if isinstance(module, nn.LayerNorm):\n"
                "                params.update({id(p): p for p in module.parameters(recurse=False)})\n"
                "            elif getattr(module, \"split_dim\", None) == 1 and module.bias is not None:\n"
                "                params[id(module.bias)] = module.bias\n"
                "    by_dtype = {}\n"
                "    for param in params.values():\n"
                "        if param.grad is not None:\n"
                "            by_dtype.setdefault(param.grad.dtype, []).append(param)\n"
                "    for same in by_dtype.values():\n"
                "        flat = torch.cat([param.grad.reshape(-1) for param in same])\n"
                "        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n"
                "        for param, summed in zip(same, flat.split([param.grad.numel() for param in same])):\n"
                "            param.grad.copy_(summed.view_as(param.grad))\n",
                "    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors\n"
                "    grads = []\n"
                "    for block in model.modules():\n"
                "        if getattr(block, \"sequence_parallel\", False):\n"
                "            for p in (block.attn.proj.bias, block.mlp.fc2.bias, *block.norm2.parameters(), *block.norm1.parameters()):\n"
                "                if p is not None and p.grad is not None:\n"
                "                    grads.append(p.grad)\n"
                "    for dtype in {g.dtype for g in grads}:\n"
                "        same = [g for g in grads if g.dtype == dtype]\n"
                "        flat = _flatten_dense_tensors(same)\n"
                "        dist.all_reduce(flat, group=group)\n"
                "        for g, summed in zip(same, _unflatten_dense_tensors(flat, same)):\n"
                "            g.copy_(summed)\n", ""),)),
    RightAnswer("14.4", "gathered-after-the-norms",  # trial 8 (A): passes; kept so
                "'a post-hook on the norm before it is the same' (parallelize_block): norm1's and norm2's outputs "
                "are attn's and mlp's inputs", (
        Mistake("14.4", "gathered-after-the-norms", "template_sequence_parallel.py",
                "        for module in (block.attn, block.mlp):\n"
                "            module.register_forward_pre_hook(lambda module, args: (gather_sequence(args[0], group), *args[1:]))\n",
                "        for norm in (block.norm1, block.norm2):  # a post-hook on the norm before each pair\n"
                "            norm.register_forward_hook(lambda module, args, out: gather_sequence(out, group))\n", ""),)),
    RightAnswer("14.4", "pre-hook-returns-the-tensor",  # trial 8 (A): passes; kept so
                "'a forward pre-hook, as PyTorch's PrepareModuleInput': a pre-hook may return the new input alone, "
                "not in a tuple (PyTorch wraps it)", (
        Mistake("14.4", "pre-hook-returns-the-tensor", "template_sequence_parallel.py",
                "(gather_sequence(args[0], group), *args[1:])",
                "gather_sequence(args[0], group)", ""),)),
    # Task 14, 16.5, trial 13 (2026-11-30): constructors, a post-hook for the last gather, grads rebound, another divisor
    RightAnswer("14.2", "own-slices-into-the-constructors",
                "'fc1 becomes the column-parallel layer ... (rank r: hidden features [r * hidden / N, (r + 1) * "
                "hidden / N)), fc2 the row-parallel one': the layers' own constructors take those slices", (
        Mistake("14.2", "own-slices-into-the-constructors", "template_sequence_parallel.py",
                "    mlp.fc1 = column.from_linear(mlp.fc1, group)\n"
                "    mlp.fc2 = row.from_linear(mlp.fc2, group)\n",
                "    rank, size = dist.get_rank(group), dist.get_world_size(group)\n"
                "    fc1, fc2 = mlp.fc1, mlp.fc2\n"
                "    mlp.fc1 = column(fc1.weight.detach().chunk(size, dim=0)[rank].clone(), fc1.bias.detach().chunk(size)[rank].clone(),\n"
                "                     fc1.in_features, fc1.out_features, group)\n"
                "    mlp.fc2 = row(fc2.weight.detach().chunk(size, dim=1)[rank].clone(), fc2.bias.detach().clone(),\n"
                "                  fc2.in_features, fc2.out_features, group)\n", ""),)),
    RightAnswer("14.5", "last-gather-after-the-last-block",
                "'the tokens are gathered back before the final norm': a forward hook on the last block gathers "
                "the same tensor at the same place as a pre-hook on the norm", (
        Mistake("14.5", "last-gather-after-the-last-block", "template_sequence_parallel.py",
                "        model.norm.register_forward_pre_hook(\n"
                "            lambda module, args: (gather_sequence(args[0], tp_group, tensor_parallel_output_grad=False),))\n",
                "        model.blocks[-1].register_forward_hook(\n"
                "            lambda module, args, out: gather_sequence(out, tp_group, tensor_parallel_output_grad=False))\n", ""),)),
    RightAnswer("14.5", "grads-rebound-to-the-flat-buffer",
                "'Sum over group the gradients ..., in place': each .grad made a view of the summed buffer holds "
                "the sum, as one copied into holds it", (
        Mistake("14.5", "grads-rebound-to-the-flat-buffer", "template_sequence_parallel.py",
                "            param.grad.copy_(summed.view_as(param.grad))\n",
                "            param.grad = summed.view_as(param.grad)\n", ""),)),
    RightAnswer("14.3", "gather-backward-into-tensor-transposed",
                "'the reduce-scatter (SUM) of the gradient along dim 1': the tokens brought to dim 0, "
                "reduce_scatter_tensor cuts them there, and the result transposed back", (
        Mistake("14.3", "gather-backward-into-tensor-transposed", "template_sequence_parallel.py",
                "        out = torch.empty_like(pieces[rank])\n"
                "        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=ctx.group)\n"
                "        return out, None, None\n",
                "        tokens_first = grad.transpose(0, 1).contiguous()  # (S, B, dim): rank j's tokens j-th along dim 0\n"
                "        out = tokens_first.new_empty((tokens_first.shape[0] // size, *tokens_first.shape[1:]))\n"
                "        dist.reduce_scatter_tensor(out, tokens_first, group=ctx.group)\n"
                "        return out.transpose(0, 1), None, None\n", ""),)),
    RightAnswer("16.5", "experts-divided-by-the-world-size",
                "'divided by N, and averaged over expert_dp_group': N times the copies is the world size, "
                "W = N * (W / N)", (
        Mistake("16.5", "experts-divided-by-the-world-size", "template_experts.py",
                "expert_dp_group, size * copies)", "expert_dp_group, dist.get_world_size())", ""),)),
    RightAnswer("15.1", "max-then-log-sum-exp",
                "'(out, lse) exactly as attention_block over the concatenated keys ... no overflow': max + "
                "log(sum of exp(lse - max)) is the log-sum-exp, each side weighted by its share", (
        Mistake("15.1", "max-then-log-sum-exp", "template_context_parallel.py",
                "    lse = torch.logaddexp(lse_a, lse_b)\n"
                "    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # both -inf: weights 0, not NaN\n"
                "    weight_a = torch.exp(lse_a - finite).unsqueeze(-1)\n"
                "    weight_b = torch.exp(lse_b - finite).unsqueeze(-1)\n"
                "    return weight_a * out_a + weight_b * out_b, lse\n",
                "    m = torch.maximum(lse_a, lse_b)\n"
                "    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both -inf: shift by 0, not NaN\n"
                "    ea, eb = torch.exp(lse_a - m), torch.exp(lse_b - m)\n"
                "    total = ea + eb\n"
                "    lse = m + torch.log(total)\n"
                "    safe = torch.where(total == 0, torch.ones_like(total), total)\n"
                "    return (ea / safe).unsqueeze(-1) * out_a + (eb / safe).unsqueeze(-1) * out_b, lse\n", ""),)),
    RightAnswer("15.2", "receive-posted-first",
                "'Each step's send and receive are posted BEFORE that step's blocks are computed and waited for "
                "after': which of the two goes first is not said; every finished Work dropped, so at most 2 "
                "blocks are held", (
        Mistake("15.2", "receive-posted-first", "template_context_parallel.py",
                "                incoming = torch.empty_like(kv)\n"
                "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n"
                "            owner = (rank - step) % size  # whose",
                "                incoming = torch.empty_like(kv)\n"
                "                works = [dist.irecv(incoming, recv_from, group=group), dist.isend(kv, send_to, group=group)]\n"
                "            owner = (rank - step) % size  # whose", ""),
        Mistake("15.2", "receive-posted-first", "template_context_parallel.py",
                "            if step < size - 1:\n"
                "                for work in works:\n"
                "                    work.wait()\n"
                "                kv, works = incoming, None  # a Work keeps its tensor alive: drop the finished ones too\n",
                "            if step < size - 1:\n"
                "                while works:\n"
                "                    works.pop().wait()  # and dropped: a Work keeps its tensor alive\n"
                "                kv = incoming\n", ""),)),
    RightAnswer("15.2", "batch-isend-irecv",
                "'rank r sending to r + 1 and receiving from r - 1 ..., point to point': dist.batch_isend_irecv "
                "posts that isend and irecv (the page names it)", (
        Mistake("15.2", "batch-isend-irecv", "template_context_parallel.py",
                "                incoming = torch.empty_like(kv)\n"
                "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n"
                "            owner = (rank - step) % size  # whose",
                "                incoming = torch.empty_like(kv)\n"
                "                works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, send_to, group),\n"
                "                                                dist.P2POp(dist.irecv, incoming, recv_from, group)])\n"
                "            owner = (rank - step) % size  # whose", ""),)),
    RightAnswer("15.3", "block-and-gradients-in-one-message",
                "'The K/V blocks go round again, each with its dk, dv, summed as it travels': k, v, dk and dv in "
                "one message (on the last hop home the gradients only); the backward is not asked to overlap", (
        Mistake("15.3", "block-and-gradients-in-one-message", "template_context_parallel.py",
                "        kv = torch.stack([k, v])\n"
                "        for step in range(size):\n"
                "            if step < size - 1:\n"
                "                incoming = torch.empty_like(kv)\n"
                "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n"
                "            owner = (rank - step) % size\n"
                "            k_chunks = token_chunks(owner, size, tokens, layout)\n"
                "            if step > 0:  # the dk, dv that this block has gathered so far, from r - 1\n"
                "                for work in grad_works:\n"
                "                    work.wait()\n"
                "                dkv, grad_works = grad_incoming, None\n"
                "            else:\n"
                "                dkv = torch.zeros_like(kv)\n"
                "            for i, j in block_pairs(q_chunks, k_chunks, causal):\n"
                "                dq_b, dk_b, dv_b = attention_block_backward(\n"
                "                    dout_pieces[i], q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n"
                "                    out_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n"
                "                dq_pieces[i].add_(dq_b)\n"
                "                _pieces(dkv[0], k_chunks)[j].add_(dk_b)\n"
                "                _pieces(dkv[1], k_chunks)[j].add_(dv_b)\n"
                "            if size > 1:  # the block's gradients go on with it: after N sends they reach its owner\n"
                "                grad_incoming = torch.empty_like(dkv)\n"
                "                grad_works = [dist.isend(dkv, send_to, group=group), dist.irecv(grad_incoming, recv_from, group=group)]\n"
                "            if step < size - 1:\n"
                "                for work in works:\n"
                "                    work.wait()\n"
                "                kv, works = incoming, None\n"
                "        if size > 1:\n"
                "            for work in grad_works:\n"
                "                work.wait()\n"
                "            dkv = grad_incoming\n"
                "        return dq, dkv[0], dkv[1], None, None, None\n",
                "        kv = torch.stack([k, v])\n"
                "        buf = torch.cat([kv, torch.zeros_like(kv)])  # k, v, dk, dv: the block travels with its gradients\n"
                "        for step in range(size):\n"
                "            owner = (rank - step) % size\n"
                "            k_chunks = token_chunks(owner, size, tokens, layout)\n"
                "            for i, j in block_pairs(q_chunks, k_chunks, causal):\n"
                "                dq_b, dk_b, dv_b = attention_block_backward(\n"
                "                    dout_pieces[i], q_pieces[i], _pieces(buf[0], k_chunks)[j], _pieces(buf[1], k_chunks)[j],\n"
                "                    out_pieces[i], lse_pieces[i], causal, q_chunks[i][1], k_chunks[j][1])\n"
                "                dq_pieces[i].add_(dq_b)\n"
                "                _pieces(buf[2], k_chunks)[j].add_(dk_b)\n"
                "                _pieces(buf[3], k_chunks)[j].add_(dv_b)\n"
                "            if size > 1:\n"
                "                message = buf if step < size - 1 else buf[2:].contiguous()  # the last hop home: the gradients only\n"
                "                incoming = torch.empty_like(message)\n"
                "                works = [dist.isend(message, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n"
                "                for work in works:\n"
                "                    work.wait()\n"
                "                buf, works = incoming, None\n"
                "        return dq, buf[-2], buf[-1], None, None, None\n", ""),)),
    RightAnswer("15.4", "unshard-by-all-reduce",
                "zigzag_unshard is 'a collective over group', not a given one: each rank's chunks at their places"
                " and zeros elsewhere, summed, are the whole sequence", (
        Mistake("15.4", "unshard-by-all-reduce", "template_context_parallel.py",
                "    parts = [torch.empty_like(x) for _ in range(size)]\n"
                "    dist.all_gather(parts, x.contiguous(), group=group)\n"
                "    chunks = [None] * (2 * size)\n"
                "    for rank, part in enumerate(parts):\n"
                "        chunks[rank], chunks[2 * size - 1 - rank] = part.chunk(2, dim=dim)\n"
                "    return torch.cat(chunks, dim=dim)\n",
                "    rank = dist.get_rank(group)\n"
                "    shape = list(x.shape)\n"
                "    shape[dim] *= size\n"
                "    whole = x.new_zeros(shape)  # this rank's chunks at their places, zeros elsewhere: the sum is the sequence\n"
                "    positions = torch.cat([p for _, p in token_chunks(rank, size, x.shape[dim], \"zigzag\")])\n"
                "    whole.index_copy_(dim, positions, x)\n"
                "    dist.all_reduce(whole, group=group)\n"
                "    return whole\n", ""),)),
    RightAnswer("15.5", "q-k-v-sent-one-by-one",
                "'all-to-alls of q, k, v and out each way (4 calls, or 2 with q, k and v packed in one)'", (
        Mistake("15.5", "q-k-v-sent-one-by-one", "template_context_parallel.py",
                "        send = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()  # piece j first-dim j: rank j's\n"
                "        received = torch.empty_like(send)\n"
                "        dist.all_to_all_single(received, send, group=group)\n"
                "        return torch.cat(received.unbind(0), dim=gather_dim)\n",
                "        send = x.unflatten(scatter_dim, (size, -1)).movedim(scatter_dim, 0).contiguous()\n"
                "        received = torch.empty_like(send)\n"
                "        dist.all_to_all_single(received, send, group=group)\n"
                "        return torch.cat(list(received), dim=gather_dim)\n", ""),
        Mistake("15.5", "q-k-v-sent-one-by-one", "template_context_parallel.py",
                "    qkv = all_to_all(torch.stack([q, k, v]), group, scatter_dim=2, gather_dim=3)  # (3, B, H / N, S, D)\n"
                "    out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=causal)\n",
                "    q_h, k_h, v_h = (all_to_all(t, group, scatter_dim=1, gather_dim=2) for t in (q, k, v))  # (B, H / N, S, D)\n"
                "    out = F.scaled_dot_product_attention(q_h, k_h, v_h, is_causal=causal)\n", ""),)),
    RightAnswer("15.6", "divided-before-the-all-reduce",
                "'one all-reduce (SUM) of this rank's token sum, then / S (or / S before it)': each rank's share of "
                "the mean, summed, is the mean up to rounding, and the wire is the same", (
        Mistake("15.6", "divided-before-the-all-reduce", "template_context_parallel.py",
                "        total = x.sum(dim=1)\n"
                "        dist.all_reduce(total, group=group)\n"
                "        return total / ctx.tokens\n",
                "        share = x.sum(dim=1) / ctx.tokens  # this rank's share of the mean; the shares add up to it\n"
                "        dist.all_reduce(share, group=group)\n"
                "        return share\n", ""),)),
    RightAnswer("15.1", "nan-to-num-weights",
                "'A side with lse = -inf ... contributes nothing; both -inf gives lse = -inf and out = 0. No NaN': "
                "exp(lse_a - lse) with the NaN of -inf - -inf replaced by 0 is the same weight", (
        Mistake("15.1", "nan-to-num-weights", "template_context_parallel.py",
                '    weight_a = torch.exp(lse_a - finite).unsqueeze(-1)\n'
                '    weight_b = torch.exp(lse_b - finite).unsqueeze(-1)\n',
                '    weight_a = torch.nan_to_num(torch.exp(lse_a - lse), nan=0.0).unsqueeze(-1)  # -inf - -inf: no key on either side\n'
                '    weight_b = torch.nan_to_num(torch.exp(lse_b - lse), nan=0.0).unsqueeze(-1)\n',
                ''),
    )),
    RightAnswer("15.2", "k-and-v-in-two-messages",
                "'the K/V block sent whole each step (k and v stacked in one message, as the solution does, or in "
                "two)' (the module docstring)", (
        Mistake("15.2", "k-and-v-in-two-messages", "template_context_parallel.py",
                '                incoming = torch.empty_like(kv)\n'
                '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n'
                '            owner = (rank - step) % size  # whose',
                '                k_in, v_in = torch.empty_like(kv[0]), torch.empty_like(kv[1])\n'
                '                works = [dist.isend(kv[0], send_to, group=group), dist.isend(kv[1], send_to, group=group),\n'
                '                         dist.irecv(k_in, recv_from, group=group), dist.irecv(v_in, recv_from, group=group)]\n'
                '            owner = (rank - step) % size  # whose',
                ''),
        Mistake("15.2", "k-and-v-in-two-messages", "template_context_parallel.py",
                '                kv, works = incoming, None  # a Work keeps its tensor alive: drop the finished ones too\n',
                '                kv, works, k_in, v_in = torch.stack([k_in, v_in]), None, None, None\n',
                ''),
    )),
    # Task 16.1, the lead's trial 11 (2026-11-29)
    RightAnswer("16.1", "backward-by-the-function-itself",
                "'the same all-to-all with the two split lists swapped': the function applied again (as torchtitan's "
                "does) is that all-to-all, and differentiable itself", (
        Mistake("16.1", "backward-by-the-function-itself", "template_experts.py",
                "        out = grad.new_empty((sum(ctx.input_splits), *grad.shape[1:]))\n"
                "        dist.all_to_all_single(out, grad.contiguous(), ctx.input_splits, ctx.output_splits, group=ctx.group)\n"
                "        return out, None, None, None\n",
                "        return _AllToAll.apply(grad, ctx.input_splits, ctx.output_splits, ctx.group), None, None, None\n",
                ""),
    )),
    RightAnswer("16.1", "async-and-waited",
                "'dist.all_to_all_single of x along dim 0 ... a new tensor': started with async_op=True and waited for "
                "before it is returned, it is the same call", (
        Mistake("16.1", "async-and-waited", "template_experts.py",
                "        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)\n",
                "        work = dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group,\n"
                "                                      async_op=True)\n"
                "        work.get_future().wait()\n",
                ""),
        Mistake("16.1", "empty-with-dtype-and-device", "template_experts.py",
                "        out = x.new_empty((sum(output_splits), *x.shape[1:]))\n",
                "        out = torch.empty(sum(output_splits), *x.shape[1:], dtype=x.dtype, device=x.device)\n",
                ""),
    )),
    RightAnswer("16.2", "int32-counts-experts-in-turn",
                "'the number of pairs per expert goes ... in ONE all-to-all of E integers': any integer dtype; a "
                "token chooses an expert at most once, so each expert's pairs from torch.where are in token order", (
        Mistake("16.2", "int32-counts-experts-in-turn", "template_experts.py",
                "    token, choice = torch.where(routing.kept)  # token order, then choice\n"
                "    expert = routing.expert[token, choice]\n"
                "    order = torch.argsort(expert, stable=True)  # by expert; within one, token order stays\n"
                "    token, choice, expert = token[order], choice[order], expert[order]\n"
                "    counts = torch.bincount(expert, minlength=num_experts)  # pairs this rank sends to each expert\n"
                "    received = torch.empty_like(counts)\n"
                "    dist.all_to_all_single(received, counts, group=group)  # E / N counts to each rank, from each\n"
                "    received = received.view(size, len(experts))  # [source rank, local expert]\n",
                "    tokens, choices = [], []\n"
                "    for e in range(num_experts):  # a token chooses an expert at most once: token order within it\n"
                "        t, c = torch.where((routing.expert == e) & routing.kept)\n"
                "        tokens.append(t)\n"
                "        choices.append(c)\n"
                "    counts = torch.tensor([len(t) for t in tokens], dtype=torch.int32)\n"
                "    token, choice = torch.cat(tokens), torch.cat(choices)\n"
                "    received = torch.empty_like(counts)\n"
                "    dist.all_to_all_single(received, counts, group=group)  # E / N counts to each rank, from each\n"
                "    received = received.long().view(size, len(experts))  # [source rank, local expert]\n"
                "    counts = counts.long()\n", ""),)),
    RightAnswer("16.2", "counts-by-all-to-all-of-lists",
                "'the number of pairs per expert goes to every rank in ONE all-to-all of E integers': dist.all_to_all "
                "of E / N counts to each rank is that all-to-all", (
        Mistake("16.2", "counts-by-all-to-all-of-lists", "template_experts.py",
                "    dist.all_to_all_single(received, counts, group=group)  # E / N counts to each rank, from each\n",
                "    dist.all_to_all(list(received.chunk(size)), list(counts.chunk(size)), group=group)\n", ""),)),
    RightAnswer("16.3", "sorted-back-by-source",
                "'One all-to-all back, the reverse of dispatch's': the outputs put back source-major by a stable "
                "sort on each row's source rank, y made by index_add_ on zeros of the outputs' dtype", (
        Mistake("16.3", "sorted-back-by-source", "template_experts.py",
                "    by_expert = [out.split(plan.received[:, j].tolist()) for j, out in enumerate(expert_outputs)]\n"
                "    send = torch.cat([by_expert[j][s] for s in range(size) for j in range(per_rank)])  # source-major again\n",
                "    source = torch.cat([torch.repeat_interleave(torch.arange(size), plan.received[:, j]) for j in range(per_rank)])\n"
                "    send = torch.cat(expert_outputs)[torch.argsort(source, stable=True)]  # source-major, experts in turn\n", ""),
        Mistake("16.3", "sorted-back-by-source", "template_experts.py",
                "    return back.new_zeros((tokens, back.shape[-1])).index_add(0, plan.token, gate * back)\n",
                "    y = torch.zeros(tokens, back.shape[-1], dtype=back.dtype)\n"
                "    y.index_add_(0, plan.token, back * gate)\n"
                "    return y\n", ""),)),
    RightAnswer("16.3", "a-slot-per-choice",
                "'y[t] = the sum over token t's kept choices c of weight[t, c] * (the expert's output for (t, c))"
                " ... zeros for a token with no kept choice': a (T, k, dim) buffer, zero where dropped, weighted "
                "and summed over k", (
        Mistake("16.3", "a-slot-per-choice", "template_experts.py",
                "    gate = plan.weight[plan.token, plan.choice].to(back.dtype).unsqueeze(-1)\n"
                "    tokens = plan.weight.shape[0]\n"
                "    return back.new_zeros((tokens, back.shape[-1])).index_add(0, plan.token, gate * back)\n",
                "    tokens, k = plan.weight.shape\n"
                "    slots = back.new_zeros((tokens, k, back.shape[-1]))  # one row per (token, choice); zeros where dropped\n"
                "    slots = slots.index_put((plan.token, plan.choice), back)\n"
                "    return (slots * plan.weight.to(back.dtype).unsqueeze(-1)).sum(dim=1)\n", ""),)),
    RightAnswer("16.4", "copies-of-the-router-and-experts",
                "'its router, whole, and its local experts ..., the same models.MLP modules or copies'; aux_loss "
                "set 'as models.MoE sets it', before or after the experts run", (
        Mistake("16.4", "copies-of-the-router-and-experts", "template_experts.py",
                "        experts = [moe.experts[e] for e in local_experts(moe.num_experts, group)]\n"
                "        return cls(moe.router, experts, moe.num_experts, moe.top_k, moe.capacity_factor, group)\n",
                "        import copy\n"
                "        experts = [copy.deepcopy(moe.experts[e]) for e in local_experts(moe.num_experts, group)]\n"
                "        return cls(copy.deepcopy(moe.router), experts, moe.num_experts, moe.top_k, moe.capacity_factor, group)\n", ""),
        Mistake("16.4", "copies-of-the-router-and-experts", "template_experts.py",
                "        probs = logits.softmax(dim=-1, dtype=routing.weight.dtype)\n"
                "        self.aux_loss = models.load_balancing_loss(probs, routing.expert, self.num_experts)\n"
                "        expert_inputs, plan = dispatch(tokens, routing, self.num_experts, self.group)\n"
                "        outputs = [expert(rows) for expert, rows in zip(self.experts, expert_inputs)]\n"
                "        return combine(outputs, plan, self.group).reshape(x.shape)\n",
                "        expert_inputs, plan = dispatch(tokens, routing, self.num_experts, self.group)\n"
                "        outputs = [expert(rows) for expert, rows in zip(self.experts, expert_inputs)]\n"
                "        y = combine(outputs, plan, self.group)\n"
                "        self.aux_loss = models.load_balancing_loss(logits.softmax(dim=-1, dtype=routing.weight.dtype), routing.expert,\n"
                "                                                   self.num_experts)\n"
                "        return y.view_as(x)\n", ""),)),
    RightAnswer("16.5", "reduce-op-avg",
                "'averaged over all W ranks' and 'divided by N, and averaged over expert_dp_group': ReduceOp.AVG "
                "(gloo takes it for floats on torch 2.14) averages; the experts then divided by N alone", (
        Mistake("16.5", "reduce-op-avg", "template_experts.py",
                "            if ranks is not None:  # None: one copy of the experts, nothing to average them with\n"
                "                dist.all_reduce(flat, group=None if ranks == \"all\" else ranks)\n"
                "            flat /= divisor\n",
                "            if ranks is not None:  # None: one copy of the experts, nothing to average them with\n"
                "                dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=None if ranks == \"all\" else ranks)\n"
                "            if ranks != \"all\":\n"
                "                flat /= size\n", ""),)),
    RightAnswer("16.5", "divided-before-the-sum",
                "'averaged over all W ranks' and 'divided by N, and averaged over expert_dp_group': dividing "
                "before the all-reduce sums the same shares; the groups and dtypes in any order", (
        Mistake("16.5", "divided-before-the-sum", "template_experts.py",
                "    for params, ranks, divisor in (([p for p in with_grad if id(p) not in experts], \"all\", dist.get_world_size()),\n"
                "                                   ([p for p in with_grad if id(p) in experts], expert_dp_group, size * copies)):\n"
                "        for dtype in sorted({p.grad.dtype for p in params}, key=str):  # one flat buffer per dtype\n"
                "            grads = [p.grad for p in params if p.grad.dtype == dtype]\n"
                "            flat = torch.cat([g.reshape(-1) for g in grads])\n"
                "            if ranks is not None:  # None: one copy of the experts, nothing to average them with\n"
                "                dist.all_reduce(flat, group=None if ranks == \"all\" else ranks)\n"
                "            flat /= divisor\n",
                "    for params, ranks, divisor in (([p for p in with_grad if id(p) in experts], expert_dp_group, size * copies),\n"
                "                                   ([p for p in with_grad if id(p) not in experts], \"all\", dist.get_world_size())):\n"
                "        for dtype in {p.grad.dtype for p in params}:  # one flat buffer per dtype\n"
                "            grads = [p.grad for p in params if p.grad.dtype == dtype]\n"
                "            flat = torch.cat([g.reshape(-1) for g in grads]) / divisor\n"
                "            if ranks is not None:  # None: one copy of the experts, nothing to average them with\n"
                "                dist.all_reduce(flat, group=None if ranks == \"all\" else ranks)\n", ""),)),
    RightAnswer("0.3", "waited-through-the-future",  # trial 6
                "'handle.wait() returns when the sum is in `tensor`': the Work's Future waited for "
                "(get_future().wait()) returns then too", (
        Mistake("0.3", "waited-through-the-future", "template_collectives.py",
                "    handle.wait()\n"
                "    return result",
                "    handle.get_future().wait()\n"
                "    return result", ""),)),
    # Task 0-3, trial 9 (2026-11-29): a closed form, one output tensor, tensor_split, the state_dict, one flat
    # buffer with AVG, integer counts, sends waited for together, blocking sends in even/odd order, a polled Work
    RightAnswer("0.1", "closed-form", "'Predict it on paper first ... Returns an integer tensor of 2 elements': "
                "the sum over r < n of [1 + 2r, 2 + 2r] is [n**2, n**2 + n]", (
        Mistake("0.1", "closed-form", "template_collectives.py",
                "    return sum(rank_tensor(rank) for rank in range(world_size))",
                "    return torch.tensor([world_size ** 2, world_size ** 2 + world_size])", ""),)),
    RightAnswer("0.2", "all-gather-into-one-tensor", "'Returns a tensor of shape (world_size, *tensor.shape) whose "
                "row r is rank r's tensor': all_gather_into_tensor into (world_size * n, ...), as gloo takes it, "
                "viewed as (world_size, n, ...), is that tensor", (
        Mistake("0.2", "all-gather-into-one-tensor", "template_collectives.py",
                "    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]\n"
                "    dist.all_gather(gathered, tensor)\n"
                "    return torch.stack(gathered)\n",
                "    world_size = dist.get_world_size()\n"
                "    gathered = tensor.new_empty((world_size * tensor.shape[0], *tensor.shape[1:]))  # rows concatenated\n"
                "    dist.all_gather_into_tensor(gathered, tensor.contiguous())\n"
                "    return gathered.view(world_size, *tensor.shape)\n", ""),)),
    RightAnswer("1.3", "tensor-split", "'the first len(indices) % num_replicas ranks take one more than the "
                "others, as torch.tensor_split does': torch.tensor_split itself, back to a list", (
        Mistake("1.3", "tensor-split", "template_data_loader.py",
                "    base, extra = divmod(len(indices), num_replicas)\n"
                "    start = rank * base + min(rank, extra)\n"
                "    end = start + base + (1 if rank < extra else 0)\n"
                "    return indices[start:end]\n",
                "    return torch.tensor_split(torch.tensor(indices, dtype=torch.long), num_replicas)[rank].tolist()\n",
                ""),)),
    RightAnswer("2.1", "state-dict-values", "'Every parameter and every buffer ... is overwritten with rank src's "
                "values': state_dict() holds every parameter and persistent buffer, detached and sharing their "
                "memory (a tied weight twice: broadcast twice, harmless)", (
        Mistake("2.1", "state-dict-values", "template_trainer.py",
                "    with torch.no_grad():  # an in-place write into a parameter must not be recorded by autograd\n"
                "        for tensor in list(model.parameters()) + list(model.buffers()):\n"
                "            dist.broadcast(tensor, src=src)\n",
                "    for tensor in model.state_dict().values():  # detached, sharing the parameters' memory\n"
                "        dist.broadcast(tensor, src=src)\n", ""),)),
    RightAnswer("2.2", "one-flat-buffer-avg", "'Replace every parameter's .grad with its mean over all ranks' and "
                "'ReduceOp.AVG does both ... on recent gloo': one buffer of every gradient, in the widest of their "
                "dtypes, averaged by one all_reduce and copied back", (
        Mistake("2.2", "one-flat-buffer-avg", "template_trainer.py",
                "    for param in model.parameters():\n"
                "        if param.grad is None:\n"
                "            continue\n"
                "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n"
                "        param.grad /= world_size\n",
                "    grads = [p.grad for p in model.parameters() if p.grad is not None]\n"
                "    flat = torch.cat([g.reshape(-1) for g in grads])  # float64 if any gradient is\n"
                "    dist.all_reduce(flat, op=dist.ReduceOp.AVG)\n"
                "    for g, mean in zip(grads, flat.split([g.numel() for g in grads])):\n"
                "        g.copy_(mean.view_as(g))\n", ""),)),
    RightAnswer("2.3", "counts-as-integers", "'Returns (correct, total, loss_sum) summed over ranks as (int, int, "
                "float)': the counts summed as int64 and the loss as float64, in two all_reduces", (
        Mistake("2.3", "counts-as-integers", "template_trainer.py",
                "    sums = torch.tensor([correct, total, loss_sum], dtype=torch.float64, device=device)\n"
                "    dist.all_reduce(sums, op=dist.ReduceOp.SUM)\n"
                "    correct, total, loss_sum = sums.tolist()\n"
                "    return int(correct), int(total), loss_sum\n",
                "    counts = torch.tensor([correct, total], device=device)  # int64\n"
                "    loss = torch.tensor(loss_sum, dtype=torch.float64, device=device)\n"
                "    dist.all_reduce(counts)\n"
                "    dist.all_reduce(loss)\n"
                "    return counts[0].item(), counts[1].item(), loss.item()\n", ""),)),
    # Task 2, trial 12 (2026-11-30): right answers written otherwise (a state_dict sent as an object, the division
    # before the sum, a new .grad, a reduce then a broadcast, gathered Python numbers): each passes
    RightAnswer("2.1", "state-dict-as-an-object", "'Make every rank's model an exact copy of rank src's, in place': rank src's state_dict sent by broadcast_object_list and loaded, which copies into the model's own tensors", (
        Mistake("2.1", "state-dict-as-an-object", "template_trainer.py",
                '    with torch.no_grad():  # an in-place write into a parameter must not be recorded by autograd\n        for tensor in list(model.parameters()) + list(model.buffers()):\n            dist.broadcast(tensor, src=src)\n',
                "    state = [model.state_dict() if dist.get_rank() == src else None]\n    dist.broadcast_object_list(state, src=src)\n    model.load_state_dict(state[0])  # copies into the model's own tensors\n", ""),)),
    RightAnswer("2.2", "divided-before-the-sum", "'its mean over all ranks': each rank's gradient divided by the world size, then summed, is the mean", (
        Mistake("2.2", "divided-before-the-sum", "template_trainer.py",
                '        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n        param.grad /= world_size\n',
                "        param.grad /= world_size  # each rank's share of the mean, then the sum of the shares\n        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n", ""),)),
    RightAnswer("2.2", "grad-replaced-by-the-mean", "'Replace every parameter's .grad with its mean over all ranks': a new .grad holding the mean is what the optimizer reads", (
        Mistake("2.2", "grad-replaced-by-the-mean", "template_trainer.py",
                '        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n        param.grad /= world_size\n',
                '        summed = param.grad.clone()\n        dist.all_reduce(summed, op=dist.ReduceOp.SUM)\n        param.grad = summed / world_size\n', ""),)),
    RightAnswer("2.3", "reduce-then-broadcast", "'returned on every rank': the sums reduced to rank 0, then broadcast from it", (
        Mistake("2.3", "reduce-then-broadcast", "template_trainer.py",
                '    dist.all_reduce(sums, op=dist.ReduceOp.SUM)\n',
                '    dist.reduce(sums, dst=0, op=dist.ReduceOp.SUM)\n    dist.broadcast(sums, src=0)\n', ""),)),
    RightAnswer("2.3", "all-gather-objects", "'The sums over all ranks ... as (int, int, float)': every rank's Python numbers gathered, then summed, exactly", (
        Mistake("2.3", "all-gather-objects", "template_trainer.py",
                '    sums = torch.tensor([correct, total, loss_sum], dtype=torch.float64, device=device)\n    dist.all_reduce(sums, op=dist.ReduceOp.SUM)\n    correct, total, loss_sum = sums.tolist()\n    return int(correct), int(total), loss_sum\n',
                '    every = [None] * dist.get_world_size()\n    dist.all_gather_object(every, (correct, total, loss_sum))\n    return sum(c for c, _, _ in every), sum(t for _, t, _ in every), float(sum(l for _, _, l in every))\n', ""),)),
    RightAnswer("2.2", "async-all-then-waited", "'Replace every parameter's .grad with its mean': every all_reduce started with async_op=True, each waited for before its division", (
        Mistake("2.2", "async-all-then-waited", "template_trainer.py",
                '    for param in model.parameters():\n        if param.grad is None:\n            continue\n        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n        param.grad /= world_size\n',
                '    grads = [p.grad for p in model.parameters() if p.grad is not None]\n    handles = [dist.all_reduce(g, op=dist.ReduceOp.SUM, async_op=True) for g in grads]  # all in flight at once\n    for g, handle in zip(grads, handles):\n        handle.wait()\n        g /= world_size\n', ""),)),
    RightAnswer("3.1", "isend-to-all-then-wait", "'sends it to every other rank': the N-1 sends started together "
                "with dist.isend, each Work waited for before returning", (
        Mistake("3.1", "isend-to-all-then-wait", "template_allreduce.py",
                "        for dst in range(1, world_size):\n"
                "            dist.send(tensor, dst=dst)\n",
                "        for work in [dist.isend(tensor, dst=dst) for dst in range(1, world_size)]:\n"
                "            work.wait()\n", ""),)),
    RightAnswer("3.2", "even-odd-blocking-sends", "the module docstring's 'dist.send, dist.recv' and the page's 'An "
                "even/odd order (even ranks send first, odd ranks receive first) works too': no two neighbours both "
                "wait in a send, on 2, 3 or 4 ranks", (
        Mistake("3.2", "even-odd-blocking-sends", "template_allreduce.py",
                "    for step in range(world_size - 1):  # reduce-scatter\n",
                "    def exchange(send_buffer, recv_buffer, right, left):  # even ranks send first, odd ones receive first\n"
                "        if rank % 2 == 0:\n"
                "            dist.send(send_buffer, right)\n"
                "            dist.recv(recv_buffer, left)\n"
                "        else:\n"
                "            dist.recv(recv_buffer, left)\n"
                "            dist.send(send_buffer, right)\n"
                "    for step in range(world_size - 1):  # reduce-scatter\n", ""),)),
    RightAnswer("0.3", "polls-is-completed", "'handle.wait() returns when the sum is in `tensor`': a Work whose "
                "is_completed() said True has its sum in `tensor` too", (
        Mistake("0.3", "polls-is-completed", "template_collectives.py",
                "    handle.wait()\n"
                "    return result",
                "    while not handle.is_completed():\n"
                "        time.sleep(0.001)\n"
                "    return result", ""),)),
    # Tasks 1 and 3, trial 12 (2026-11-30): right answers written otherwise
    RightAnswer("1.2", "cycle-islice", "'append indices taken from the front of the list, wrapping around as often "
                "as needed ... Returns a new list': itertools.cycle cut at the next multiple is that list", (
        Mistake("1.2", "cycle-islice", "template_data_loader.py",
                "    repeats = math.ceil(padding / len(indices))\n"
                "    return indices + (indices * repeats)[:padding]\n",
                "    import itertools\n"
                "    return list(itertools.islice(itertools.cycle(indices), len(indices) + padding))\n", ""),)),
    RightAnswer("1.1", "fork-rng", "'seeded with seed + epoch' and the global random state left alone: "
                "torch.manual_seed inside torch.random.fork_rng is restored on the way out, and the default "
                "generator's randperm is a torch.Generator's", (
        Mistake("1.1", "fork-rng", "template_data_loader.py",
                "    g = torch.Generator()\n    g.manual_seed(seed + epoch)\n"
                "    return torch.randperm(dataset_len, generator=g).tolist()\n",
                "    with torch.random.fork_rng(devices=[]):  # the global state is restored on the way out\n"
                "        torch.manual_seed(seed + epoch)\n"
                "        return torch.randperm(dataset_len).tolist()\n", ""),)),
    RightAnswer("1.4", "cuda-in-the-name", "'pin_memory only when the device is a GPU': 'cuda' in str(device) is "
                "true for 'cuda', 'cuda:0' and torch.device('cuda', 0), false for 'cpu'", (
        Mistake("1.4", "cuda-in-the-name", "template_data_loader.py",
                "    pin_memory = torch.device(device).type == \"cuda\"",
                "    pin_memory = \"cuda\" in str(device)", ""),)),
    RightAnswer("3.1", "irecv-into-own-buffers", "'Rank 0 receives the N-1 tensors ... into a buffer on the "
                "tensor's device, adds each to a running total': N-1 irecvs posted together, each into a buffer "
                "of its own, each waited for and added in rank order", (
        Mistake("3.1", "irecv-into-own-buffers", "template_allreduce.py",
                "        received = torch.empty_like(tensor)  # on tensor's device: NCCL only moves GPU tensors\n"
                "        for src in range(1, world_size):\n"
                "            dist.recv(received, src=src)\n"
                "            total += received.cpu()\n",
                "        buffers = [torch.empty_like(tensor) for _ in range(1, world_size)]\n"
                "        works = [dist.irecv(buffer, src=src) for src, buffer in enumerate(buffers, start=1)]\n"
                "        for work, buffer in zip(works, buffers):\n"
                "            work.wait()\n"
                "            total += buffer.cpu()\n", ""),)),
    RightAnswer("3.2", "all-gather-through-the-buffer", "'overwrites chunk (r - s) % N with what it receives': "
                "received into the buffer, then copied into the chunk, is that overwrite", (
        Mistake("3.2", "all-gather-through-the-buffer", "template_allreduce.py",
                "        exchange(chunks[send_index], chunks[recv_index], right, left)\n",
                "        incoming = received[: chunks[recv_index].numel()]\n"
                "        exchange(chunks[send_index], incoming, right, left)\n"
                "        chunks[recv_index].copy_(incoming)\n", ""),)),
    RightAnswer("3.1", "others-receive-then-copy", "'receives the sum back into it': into a buffer first, then "
                "copied into the tensor's own memory", (
        Mistake("3.1", "others-receive-then-copy", "template_allreduce.py",
                "    else:\n        dist.recv(tensor, src=0)\n",
                "    else:\n        total = torch.empty_like(tensor)\n        dist.recv(total, src=0)\n"
                "        tensor.copy_(total)\n", ""),)),
    RightAnswer("3.2", "reshape-flat", "'View the tensor as one flat row of numbers': reshape(-1) of a contiguous "
                "tensor is a view too", (
        Mistake("3.2", "reshape-flat", "template_allreduce.py",
                "    chunks = tensor.view(-1).tensor_split(world_size)",
                "    chunks = tensor.reshape(-1).tensor_split(world_size)", ""),)),
    RightAnswer("3.2", "ring-the-other-way", "'the bandwidth-optimal ring': the same ring run leftwards (rank r "
                "sends to r - 1), its chunk numbers mirrored, sends 2(N-1) chunks and sums each element once", (
        Mistake("3.2", "ring-the-other-way", "template_allreduce.py",
                "    right, left = (rank + 1) % world_size, (rank - 1) % world_size",
                "    right, left = (rank - 1) % world_size, (rank + 1) % world_size  # the ring the other way round",
                ""),
        Mistake("3.2", "ring-the-other-way", "template_allreduce.py",
                "        send_index, recv_index = (rank - step) % world_size, (rank - step - 1) % world_size\n"
                "        incoming",
                "        send_index, recv_index = (rank + step) % world_size, (rank + step + 1) % world_size\n"
                "        incoming", ""),
        Mistake("3.2", "ring-the-other-way", "template_allreduce.py",
                "        send_index, recv_index = (rank + 1 - step) % world_size, (rank - step) % world_size",
                "        send_index, recv_index = (rank - 1 + step) % world_size, (rank + step) % world_size", ""),)),
    RightAnswer("5.4", "handles-waited-in-reverse-then-copied",  # trial 6
                "'for every bucket: wait for its handle, and copy its slice of bucket.buffer back': every handle "
                "waited for before any slice is read, in any order", (
        Mistake("5.4", "handles-waited-in-reverse-then-copied", "template_ddp.py",
                "        for bucket in self.buckets:\n"
                "            bucket.handle.wait()\n"
                "            means = bucket.buffer.split([param.numel() for param in bucket.params])\n",
                "        for bucket in reversed(self.buckets):\n"
                "            bucket.handle.wait()\n"
                "        for bucket in self.buckets:\n"
                "            means = bucket.buffer.split([param.numel() for param in bucket.params])\n", ""),)),
    # Task 5, trial 9 (2026-11-29): right answers written otherwise
    RightAnswer("5.1", "nbytes",
                "'a parameter's bytes are numel() * element_size()': param.nbytes is that product", (
        Mistake("5.1", "nbytes", "template_ddp.py",
                "        size = param.numel() * param.element_size()",
                "        size = param.nbytes", ""),)),
    RightAnswer("5.2", "new-zeros",
                "'a parameter whose .grad is None contributes zeros of its size': param.new_zeros(numel) has its dtype and device", (
        Mistake("5.2", "new-zeros", "template_ddp.py",
                "torch.zeros_like(param).reshape(-1) if param.grad is None",
                "param.new_zeros(param.numel()) if param.grad is None", ""),)),
    RightAnswer("5.3", "one-hook-a-lookup",
                "'register a hook with param.register_post_accumulate_grad_hook(hook)' for every parameter of every bucket: one hook function that finds the parameter's bucket in a dict counts the same", (
        Mistake("5.3", "one-hook-a-lookup", "template_ddp.py",
                "        for bucket in self.buckets:\n            hook = make_hook(bucket)\n            for param in bucket.params:\n                self._hook_handles.append(param.register_post_accumulate_grad_hook(hook))",
                "        bucket_of = {param: bucket for bucket in self.buckets for param in bucket.params}\n\n        def hook(param):\n            make_hook(bucket_of[param])(param)\n\n        for param in bucket_of:\n            self._hook_handles.append(param.register_post_accumulate_grad_hook(hook))", ""),)),
    RightAnswer("5.4", "grads-as-views-of-the-bucket",
                "'a parameter whose .grad is None gets a new .grad holding its slice': every .grad rebound to its slice of the reduced buffer (PyTorch's gradient_as_bucket_view) holds the mean too", (
        Mistake("5.4", "grads-as-views-of-the-bucket", "template_ddp.py",
                "                if param.grad is None:\n                    param.grad = mean.view_as(param).clone()\n                else:\n                    param.grad.copy_(mean.view_as(param))",
                "                param.grad = mean.view_as(param)  # a view of the bucket: no copy", ""),)),
    RightAnswer("5.4", "wait-all-futures",
                "'for every bucket: wait for its handle': torch.futures.wait_all of every handle's Future waits for each", (
        Mistake("5.4", "wait-all-futures", "template_ddp.py",
                "        for bucket in self.buckets:\n            bucket.handle.wait()\n",
                "        torch.futures.wait_all([bucket.handle.get_future() for bucket in self.buckets])\n        for bucket in self.buckets:\n", ""),)),
    # Task 5, trial 11 (2026-11-29): right answers written otherwise
    RightAnswer("5.1", "falsy-cap-is-per-parameter",
                "'bucket_size_mb=None (or 0): one bucket per parameter': `if bucket_size_mb` treats None and 0 alike", (
        Mistake("5.1", "falsy-cap-is-per-parameter", "template_ddp.py",
                "    limit = None if bucket_size_mb is None else bucket_size_mb * 2**20",
                "    limit = bucket_size_mb * 2**20 if bucket_size_mb else None  # None or 0: one bucket per parameter", ""),)),
    RightAnswer("5.1", "dict-fromkeys",
                "'it goes into one bucket only, at its FIRST occurrence': dict.fromkeys keeps the first place, and a Parameter hashes by identity", (
        Mistake("5.1", "dict-fromkeys", "template_ddp.py",
                "    unique = list({id(param): param for param in parameters}.values())",
                "    unique = list(dict.fromkeys(parameters))  # a Parameter hashes by identity", ""),)),
    RightAnswer("5.2", "divided-out-of-place",
                "'Divide the buffer by the world size BEFORE the sum': an out-of-place division assigned to bucket.buffer, then all_reduce of bucket.buffer", (
        Mistake("5.2", "divided-out-of-place", "template_ddp.py",
                "    bucket.buffer = torch.cat(grads)\n    bucket.buffer /= dist.get_world_size()\n",
                "    bucket.buffer = torch.cat(grads) / dist.get_world_size()\n", ""),)),
    RightAnswer("5.2", "default-op",
                "'dist.all_reduce(bucket.buffer, op=SUM, async_op=True)': SUM is all_reduce's default op", (
        Mistake("5.2", "default-op", "template_ddp.py",
                "dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM, async_op=True)",
                "dist.all_reduce(bucket.buffer, async_op=True)", ""),)),
    RightAnswer("5.3", "for-with-break",
                "'while self.next_bucket is a valid index and that bucket has all its parameters ready': a for loop from self.next_bucket that breaks at the first incomplete bucket", (
        Mistake("5.3", "for-with-break", "template_ddp.py",
                "                while (self.next_bucket < len(self.buckets)\n                       and self.buckets[self.next_bucket].num_ready == len(self.buckets[self.next_bucket].params)):\n                    launch_all_reduce(self.buckets[self.next_bucket])\n                    self.next_bucket += 1\n",
                "                for index in range(self.next_bucket, len(self.buckets)):\n                    if self.buckets[index].num_ready < len(self.buckets[index].params):\n                        break\n                    launch_all_reduce(self.buckets[index])\n                    self.next_bucket = index + 1\n", ""),)),
    RightAnswer("5.4", "finish-advances-next-bucket",
                "'launch, in order, every bucket that backward did not launch (from self.next_bucket on)': a while loop that moves self.next_bucket on, reset to 0 at the end", (
        Mistake("5.4", "finish-advances-next-bucket", "template_ddp.py",
                "        for bucket in self.buckets[self.next_bucket:]:\n            launch_all_reduce(bucket)\n",
                "        while self.next_bucket < len(self.buckets):\n            launch_all_reduce(self.buckets[self.next_bucket])\n            self.next_bucket += 1\n", ""),)),
    RightAnswer("5.5", "tuple-swap",
                "'restore its previous value': read and set in one tuple assignment", (
        Mistake("5.5", "tuple-swap", "template_ddp.py",
                "        previous = self.require_backward_grad_sync\n        self.require_backward_grad_sync = False\n",
                "        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False\n", ""),)),
    RightAnswer("6.3", "async-broadcasts-waited-in-reverse",  # trial 6
                "'dist.broadcast(view, src=rank) for every piece in self.pieces, in that order on every rank': "
                "launched in that order with async_op=True, every Work waited for before step() returns, in any order", (
        Mistake("6.3", "async-broadcasts-waited-in-reverse", "template_zero.py",
                "        for view, param, start, end, rank in self.pieces:\n"
                "            dist.broadcast(view, src=rank)\n",
                "        works = [dist.broadcast(view, src=rank, async_op=True) for view, param, start, end, rank in self.pieces]\n"
                "        for work in reversed(works):\n"
                "            work.wait()\n", ""),)),
    RightAnswer("6.3", "one-all-gather",  # trial 6
                "'dist.broadcast(view, src=rank) for every piece ... or an all-gather': each rank's pieces packed, "
                "padded to the longest rank's, all-gathered and copied back into the views", (
        Mistake("6.3", "one-all-gather", "template_zero.py",
                "        for view, param, start, end, rank in self.pieces:\n"
                "            dist.broadcast(view, src=rank)\n",
                "        sizes = [0] * self.world_size\n"
                "        for view, param, start, end, rank in self.pieces:\n"
                "            sizes[rank] += view.numel()\n"
                "        mine = [view for view, param, start, end, rank in self.pieces if rank == self.rank]\n"
                "        first = self.pieces[0][0]\n"
                "        send = torch.zeros(max(sizes), dtype=first.dtype, device=first.device)  # every rank sends as many\n"
                "        if mine:\n"
                "            send[:sizes[self.rank]] = torch.cat(mine)\n"
                "        gathered = [torch.empty_like(send) for _ in range(self.world_size)]\n"
                "        dist.all_gather(gathered, send, async_op=True).wait()\n"
                "        offsets = [0] * self.world_size\n"
                "        for view, param, start, end, rank in self.pieces:\n"
                "            view.copy_(gathered[rank][offsets[rank]:offsets[rank] + view.numel()])\n"
                "            offsets[rank] += view.numel()\n", ""),)),
    # Task 6, trial 10 (2026-11-29): per-rank loops, another flat view and group copy, the local zero_grad,
    # a copied gradient slice, an all-reduce of zeroed copies
    RightAnswer("6.1", "ranks-then-parameters",
                "'Rank r owns elements [r * S, (r + 1) * S) ... S = ceil(T / world_size)': each rank's range cut "
                "against each parameter's, math.ceil for S; the pieces come out in order along the line all the same", (
        Mistake("6.1", "ranks-then-parameters", "template_zero.py",
                "    pieces = []\n"
                "    offset = 0  # where params[index] begins on the line\n"
                "    for index, param in enumerate(params):\n"
                "        start = 0\n"
                "        while start < param.numel():\n"
                "            rank = (offset + start) // shard_size\n"
                "            end = min(param.numel(), (rank + 1) * shard_size - offset)  # this rank's shard ends, or the parameter\n"
                "            pieces.append((index, start, end, rank))\n"
                "            start = end\n"
                "        offset += param.numel()\n"
                "    return pieces",
                "    import math\n"
                "    shard_size = math.ceil(total / world_size)\n"
                "    starts = [0]\n"
                "    for param in params:\n"
                "        starts.append(starts[-1] + param.numel())\n"
                "    pieces = []\n"
                "    for rank in range(world_size):\n"
                "        lo, hi = rank * shard_size, min(total, (rank + 1) * shard_size)\n"
                "        for index, param in enumerate(params):\n"
                "            a, b = max(lo, starts[index]), min(hi, starts[index + 1])\n"
                "            if a < b:\n"
                "                pieces.append((index, a - starts[index], b - starts[index], rank))\n"
                "    return pieces", ""),)),
    RightAnswer("6.2", "flatten-and-dict-copy",
                "'view = param.detach().view(-1)[start:end]: a 1-D tensor that shares the parameter's memory': "
                "torch.flatten of a contiguous tensor is that view; the local group a dict() copy with its own params", (
        Mistake("6.2", "flatten-and-dict-copy", "template_zero.py",
                "        mine = []\n"
                "        for index, start, end, rank in partition_parameters(params, self.world_size):\n"
                "            view = params[index].detach().view(-1)[start:end]  # shares the parameter's memory\n"
                "            self.pieces.append((view, params[index], start, end, rank))\n"
                "            if rank == self.rank:\n"
                "                mine.append(view)\n"
                "        local_group = {**param_group, \"params\": mine}",
                "        new = [(torch.flatten(params[index].detach())[start:end], params[index], start, end, rank)\n"
                "               for index, start, end, rank in partition_parameters(params, self.world_size)]\n"
                "        self.pieces += new\n"
                "        local_group = dict(param_group)\n"
                "        local_group[\"params\"] = [piece[0] for piece in new if piece[4] == self.rank]", ""),)),
    RightAnswer("6.3", "local-zero-grad",
                "'Set the views' .grad back to None': only this rank's views got one, and self.optim.zero_grad() "
                "(set_to_none) sets exactly those to None", (
        Mistake("6.3", "local-zero-grad", "template_zero.py",
                "        for view, param, start, end, rank in self.pieces:\n            view.grad = None\n",
                "        self.optim.zero_grad()  # set_to_none: only this rank's views had a .grad\n", ""),)),
    RightAnswer("6.3", "gradient-slice-copied",
                "'give each view of this rank the matching slice of its parameter's gradient': a copy of the slice "
                "holds the same numbers; set back to None after the step, it is freed with the rest", (
        Mistake("6.3", "gradient-slice-copied", "template_zero.py",
                "view.grad = None if param.grad is None else param.grad.view(-1)[start:end]",
                "view.grad = None if param.grad is None else param.grad.detach().reshape(-1)[start:end].clone()", ""),)),
    RightAnswer("6.3", "all-reduce-of-zeroed-copies",
                "'Each piece's new value goes from its owner to every other rank': every rank but the owner zeroes "
                "its copy, and a SUM all-reduce then gives every rank the owner's value (one piece, once, on the wire)", (
        Mistake("6.3", "all-reduce-of-zeroed-copies", "template_zero.py",
                "            dist.broadcast(view, src=rank)",
                "            if rank != self.rank:\n                view.zero_()\n            dist.all_reduce(view)", ""),)),
    RightAnswer("6.3", "broadcast-by-group-src",
                "'dist.broadcast(view, src=rank)': in the default process group group_src=rank names the same rank "
                "(the tests' check of each piece's source reads either)", (
        Mistake("6.3", "broadcast-by-group-src", "template_zero.py",
                "            dist.broadcast(view, src=rank)", "            dist.broadcast(tensor=view, group_src=rank)", ""),)),
    RightAnswer("7.2", "shard-copied-into-its-place-in-full",  # trial 6
                "'all_gather_into_tensor into self.full ... in compute_dtype; send a detached copy of the shard': the"
                " copy made in this rank's own slice of self.full (fully_shard's in-place all-gather)", (
        Mistake("7.2", "shard-copied-into-its-place-in-full", "template_fsdp.py",
                "        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), async_op=async_op)",
                "        mine = self.full.chunk(self.world_size)[self.rank]\n"
                "        mine.copy_(self.shard.detach())  # this rank's part of full, in compute_dtype: gathered in place\n"
                "        return dist.all_gather_into_tensor(self.full, mine, async_op=async_op)", ""),)),
    RightAnswer("7.5", "fp32-units-through-unshard-then-resharded",
                "'leaves every unit as resharded as it found it (no unit.full kept alive after it)': a unit whose "
                "compute_dtype is already fp32 gathered with unit.unshard(), its views copied, then unit.reshard()", (
        Mistake("7.5", "fp32-units-through-unshard-then-resharded", "template_fsdp.py",
                """            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, device=unit.shard.device)
            dist.all_gather_into_tensor(full, unit.shard.detach())
            views[id(unit)] = unit.views(full)
""", """            if unit.compute_dtype == unit.shard.dtype:  # already the shards' dtype: reuse the unit's own
                unit.unshard()
                views[id(unit)] = [view.clone() for view in unit.views(unit.full)]
                unit.reshard()
            else:
                full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, device=unit.shard.device)
                dist.all_gather_into_tensor(full, unit.shard.detach())
                views[id(unit)] = unit.views(full)
""", ""),)),
    RightAnswer("7.4", "reduce-scatter-of-a-list",
                "'dist.reduce_scatter_tensor with SUM hands each rank the sum over the ranks of its own piece': "
                "dist.reduce_scatter of the N chunks of full_grad / N does the same", (
        Mistake("7.4", "reduce-scatter-of-a-list", "template_fsdp.py",
                "        handle = dist.reduce_scatter_tensor(piece, full_grad / self.world_size, op=dist.ReduceOp.SUM, "
                "async_op=True)\n",
                "        handle = dist.reduce_scatter(piece, list((full_grad / self.world_size).chunk(self.world_size)),\n"
                "                                     op=dist.ReduceOp.SUM, async_op=True)\n", ""),)),
    RightAnswer("7.4", "piece-made-in-compute-dtype",  # trial 6
                "'Start the reduce-scatter into a new tensor of the shard's size, in compute_dtype': made from "
                "self.compute_dtype, not from full_grad's dtype (the same dtype)", (
        Mistake("7.4", "piece-made-in-compute-dtype", "template_fsdp.py",
                "        piece = torch.empty(self.shard.numel(), dtype=full_grad.dtype, device=full_grad.device)\n"
                "        handle = dist.reduce_scatter_tensor(piece, full_grad / self.world_size, op=dist.ReduceOp.SUM, async_op=True)\n"
                "        return handle, piece\n",
                "        piece = torch.zeros_like(self.shard, dtype=self.compute_dtype).detach()\n"
                "        handle = dist.reduce_scatter_tensor(piece, (full_grad / self.world_size).contiguous(), op=dist.ReduceOp.SUM,\n"
                "                                            async_op=True)\n"
                "        return handle, piece\n", ""),)),
    # Task 7, trial 9 (2026-11-29): right answers written otherwise (padding made another way, a gather into a
    # list): each passes
    RightAnswer("7.1", "pads-only-the-last-piece",
                "'every shard has the same size ... and concatenating the shards of ranks 0, 1, ... gives back flat "
                "followed by the padding zeros': this rank's slice of flat, short or empty on the last ranks, then "
                "its own zeros, in a new tensor (torch.cat copies)", (
        Mistake("7.1", "pads-only-the-last-piece", "template_fsdp.py",
                "    padding = -flat.numel() % world_size  # the zeros that make the length a multiple of world_size\n"
                "    padded = torch.cat([flat, flat.new_zeros(padding)])\n"
                "    shard_numel = padded.numel() // world_size\n"
                "    return padded[rank * shard_numel:(rank + 1) * shard_numel].clone()\n",
                "    shard_numel = -(-flat.numel() // world_size)  # ceil\n"
                "    piece = flat[rank * shard_numel:(rank + 1) * shard_numel]  # short, or empty, on the last ranks\n"
                "    return torch.cat([piece, flat.new_zeros(shard_numel - piece.numel())])  # a new tensor\n", ""),)),
    RightAnswer("7.1", "functional-pad", "'Pad flat at the end with zeros': F.pad(flat, (0, padding)) does, in "
                "flat's dtype and on its device", (
        Mistake("7.1", "functional-pad", "template_fsdp.py",
                "    padded = torch.cat([flat, flat.new_zeros(padding)])\n",
                "    padded = torch.nn.functional.pad(flat, (0, padding))\n", ""),)),
    RightAnswer("7.2", "all-gather-into-chunks-of-full",
                "'every rank's shard, in rank order' in self.full: dist.all_gather into the world_size views of "
                "self.full (self.full.chunk) writes them there, and its handle is returned", (
        Mistake("7.2", "all-gather-into-chunks-of-full", "template_fsdp.py",
                "        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), "
                "async_op=async_op)\n",
                "        pieces = list(self.full.chunk(self.world_size))  # views: the gather writes into self.full\n"
                "        return dist.all_gather(pieces, self.shard.detach().to(self.compute_dtype), "
                "async_op=async_op)\n", ""),)),
    # Task 7, trial 12 (2026-11-30): right answers written otherwise (a row of a 2-D view, a blocking gather as an
    # asynchronous one waited for, each view's storage freed): each passes
    RightAnswer("7.1", "row-of-a-2d-view", "'cut it into world_size equal contiguous pieces ... as a copy': row rank of padded.view(world_size, -1), cloned", (
        Mistake("7.1", "row-of-a-2d-view", "template_fsdp.py",
                '    return padded[rank * shard_numel:(rank + 1) * shard_numel].clone()',
                '    return padded.view(world_size, shard_numel)[rank].clone()', ""),)),
    RightAnswer("7.2", "always-async-waited-when-blocking", "'returning None after a blocking gather is correct too': an asynchronous gather waited for at once when async_op=False", (
        Mistake("7.2", "always-async-waited-when-blocking", "template_fsdp.py",
                '        return dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), async_op=async_op)',
                '        handle = dist.all_gather_into_tensor(self.full, self.shard.detach().to(self.compute_dtype), async_op=True)\n        if not async_op:\n            handle.wait()\n            return None\n        return handle', ""),)),
    RightAnswer("7.3", "storage-freed-through-the-views", "'Free it in place': every view of self.full shares its one storage, and resizing that storage to 0 frees it", (
        Mistake("7.3", "storage-freed-through-the-views", "template_fsdp.py",
                '        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---',
                '        for view in self.views(self.full):  # every view shares the one storage: freeing it once is enough\n            view.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---', ""),)),
    RightAnswer("7.3", "frees-only-when-gathered", "'Free the memory of the full flat tensor': a full tensor already freed has nothing to free, so resizing only when is_unsharded() frees the same", (
        Mistake("7.3", "frees-only-when-gathered", "template_fsdp.py",
                '        self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---',
                '        if self.is_unsharded():  # nothing to free otherwise\n            self.full.untyped_storage().resize_(0)\n        # --- Task 7.3 end ---', ""),)),
    RightAnswer("7.5", "all-gather-a-list-then-cat",
                "'Gather each unit's shards (all_gather_into_tensor, into fp32)': an all_gather into a list of "
                "shard-sized tensors, concatenated in rank order, is the same flat tensor, new", (
        Mistake("7.5", "all-gather-a-list-then-cat", "template_fsdp.py",
                "            full = torch.empty(unit.shard.numel() * self.world_size, dtype=unit.shard.dtype, "
                "device=unit.shard.device)\n"
                "            dist.all_gather_into_tensor(full, unit.shard.detach())\n",
                "            pieces = [torch.empty_like(unit.shard) for _ in range(self.world_size)]\n"
                "            dist.all_gather(pieces, unit.shard.detach())\n"
                "            full = torch.cat(pieces)\n", ""),)),
    # Task 8, trial 9 (2026-11-29): a fixed temporary name fsynced through another descriptor, the step kept as saved
    RightAnswer("8.1", "fixed-temp-name-fsynced-by-reopening",
                "'write a temporary file in the same folder, flush and os.fsync it, then os.replace it': rank 0 "
                "alone writes, so a fixed name cannot collide; torch.save(path) closes the file (its bytes are the "
                "kernel's), and os.fsync of any descriptor of the file puts them on the disk", (
        Mistake("8.1", "fixed-temp-name-fsynced-by-reopening", "template_checkpoint.py",
                '    fd, tmp = tempfile.mkstemp(dir=directory, prefix=LAST + ".", suffix=".tmp")\n'
                "    try:\n"
                '        with os.fdopen(fd, "wb") as f:\n'
                "            torch.save(state, f)\n"
                "            f.flush()\n"
                "            os.fsync(f.fileno())  # on the disk before the rename makes it the checkpoint\n",
                '    tmp = last + ".tmp"  # one writer, rank 0: a fixed name cannot collide\n'
                "    try:\n"
                "        torch.save(state, tmp)  # closed on return: its bytes are the kernel's\n"
                '        with open(tmp, "rb") as f:\n'
                "            os.fsync(f.fileno())  # fsync flushes the file, whatever mode it was opened in\n", ""),)),
    RightAnswer("8.4", "step-kept-as-saved", "'any other key ...: its value in a saved flat ..., unchanged'", (
        Mistake("8.4", "step-kept-as-saved", "template_checkpoint.py",
                "            state[key] = value.clone() if torch.is_tensor(value) else value\n",
                "            state[key] = value  # unchanged\n", ""),)),
    # Task 8, trial 11 (2026-11-29): NamedTemporaryFile, os.rename and a clean-up on any exit, the rank from
    # torch.distributed when a group exists, mkstemp's descriptor closed and the path reopened, the files that exist
    # listed first and loaded memory-mapped
    RightAnswer("8.1", "named-temporary-file", "'write a temporary file in the same folder': "
                "NamedTemporaryFile(dir=directory, delete=False) is one, closed by its with block", (
        Mistake("8.1", "named-temporary-file", "template_checkpoint.py",
                '    fd, tmp = tempfile.mkstemp(dir=directory, prefix=LAST + ".", suffix=".tmp")\n'
                '    try:\n        with os.fdopen(fd, "wb") as f:\n',
                "    f = tempfile.NamedTemporaryFile(dir=directory, delete=False)\n    tmp = f.name\n"
                "    try:\n        with f:\n", ""),)),
    RightAnswer("8.1", "rename-and-cleanup-on-any-exit", "os.rename is os.replace on POSIX; removing the temporary "
                "file on a crash (BaseException) too leaves last.pt as it was", (
        Mistake("8.1", "rename-and-cleanup-on-any-exit", "template_checkpoint.py",
                "            os.replace(last, os.path.join(directory, PREVIOUS))\n        os.replace(tmp, last)\n"
                "    except Exception:\n",
                "            os.rename(last, os.path.join(directory, PREVIOUS))\n        os.rename(tmp, last)\n"
                "    except BaseException:  # a crash too\n", ""),)),
    RightAnswer("8.1", "rank-from-torch-distributed-guarded", "get_rank() is 0 without a process group: "
                "dist.is_initialized() and dist.get_rank() != 0 says the same", (
        Mistake("8.1", "rank-from-torch-distributed-guarded", "template_checkpoint.py",
                "    if get_rank() != 0:\n        return None\n    state = {",
                "    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:\n"
                "        return None\n    state = {", ""),)),
    RightAnswer("8.1", "no-flush-torch-save-flushes", "'flush and os.fsync it': torch.save flushes the file object "
                "it writes to when it is done, so the bytes are the kernel's before the fsync either way", (
        Mistake("8.1", "no-flush-torch-save-flushes", "template_checkpoint.py",
                "            f.flush()\n            os.fsync(f.fileno())", "            os.fsync(f.fileno())", ""),)),
    RightAnswer("8.1", "fsync-of-the-file-object", "os.fsync accepts any object with a fileno() method: "
                "os.fsync(f) is os.fsync(f.fileno())", (  # was a TypeError in the tests' own spy
        Mistake("8.1", "fsync-of-the-file-object", "template_checkpoint.py",
                "            os.fsync(f.fileno())  # on the disk", "            os.fsync(f)  # on the disk", ""),)),
    RightAnswer("8.1", "shutil-move-within-the-folder", "shutil.move within one file system is os.rename: "
                "atomic, the same inode", (
        Mistake("8.1", "shutil-move-within-the-folder", "template_checkpoint.py",
                "import tempfile\n", "import shutil\nimport tempfile\n", ""),
        Mistake("8.1", "shutil-move-within-the-folder", "template_checkpoint.py",
                "            os.replace(last, os.path.join(directory, PREVIOUS))\n        os.replace(tmp, last)\n",
                "            shutil.move(last, os.path.join(directory, PREVIOUS))\n        shutil.move(tmp, last)\n", ""),)),
    RightAnswer("8.1", "mkstemp-closed-then-reopened", "mkstemp's descriptor closed at once, the file reopened "
                "by its path, flushed and fsynced", (
        Mistake("8.1", "mkstemp-closed-then-reopened", "template_checkpoint.py",
                '        with os.fdopen(fd, "wb") as f:\n',
                '        os.close(fd)\n        with open(tmp, "wb") as f:\n', ""),)),
    RightAnswer("8.2", "existing-files-first-memory-mapped", "'Try last.pt, then previous.pt': the ones that "
                "exist, listed first; mmap=True reads the same tensors", (
        Mistake("8.2", "existing-files-first-memory-mapped", "template_checkpoint.py",
                "    for name in (LAST, PREVIOUS):\n        path = os.path.join(directory, name)\n"
                "        if not os.path.exists(path):\n            continue\n        try:\n"
                "            return torch.load(path, map_location=device, weights_only=True), path\n",
                "    present = [os.path.join(directory, n) for n in (LAST, PREVIOUS) "
                "if os.path.exists(os.path.join(directory, n))]\n"
                "    for path in present:\n        name = os.path.basename(path)\n        try:\n"
                "            return torch.load(path, map_location=device, weights_only=True, mmap=True), path\n",
                ""),)),
    RightAnswer("10.2", "isend-to-a-global-rank-in-the-group",  # trial 6
                "'Start sending `tensor` to global rank `peer` ... dist.isend': isend's dst is a global rank with "
                "group=self.group given too", (
        Mistake("10.2", "isend-to-a-global-rank-in-the-group", "template_pipeline.py",
                "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))\n",
                "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), dst=peer, group=self.group))\n", ""),)),
    RightAnswer("10.3", "irecv-waited-at-once",  # trial 6
                "'Blocking (dist.recv into a new tensor): the stage cannot compute before it has its input': an irecv"
                " whose Work is waited for at once blocks the same", (
        Mistake("10.3", "irecv-waited-at-once", "template_pipeline.py",
                "        tensor = torch.empty(shape, dtype=dtype)\n"
                "        dist.recv(tensor, peer)\n"
                "        return tensor.requires_grad_(requires_grad)\n",
                "        tensor = torch.empty(shape, dtype=dtype)\n"
                "        dist.irecv(tensor, src=peer).wait()\n"
                "        return tensor.requires_grad_(requires_grad)\n", ""),)),
    RightAnswer("15.2", "group-dst-and-group-src",  # trial 6
                "'rank r sending to r + 1 and receiving from r - 1 (ranks of the group), point to point': isend's "
                "group_dst and irecv's group_src take those group ranks directly", (
        Mistake("15.2", "group-dst-and-group-src", "template_context_parallel.py",
                "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n"
                "            owner = (rank - step) % size  # whose",
                "                works = [dist.isend(kv, group=group, group_dst=(rank + 1) % size),\n"
                "                         dist.irecv(incoming, group=group, group_src=(rank - 1) % size)]\n"
                "            owner = (rank - step) % size  # whose", ""),)),
    RightAnswer("15.2", "k-and-v-in-two-messages-from-a-list",  # trial 6
                "'N - 1 K/V blocks sent per rank, no collective': k and v of a block in two messages each step are "
                "the same bytes (the solution's one message a step is a comment, not the docstring)", (
        Mistake("15.2", "k-and-v-in-two-messages-from-a-list", "template_context_parallel.py",
                "        kv = torch.stack([k, v])  # one message a step\n"
                "        for step in range(size):\n"
                "            if step < size - 1:\n"
                "                incoming = torch.empty_like(kv)\n"
                "                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]\n",
                "        kv = [k.contiguous(), v.contiguous()]  # two messages a step\n"
                "        for step in range(size):\n"
                "            if step < size - 1:\n"
                "                incoming = [torch.empty_like(t) for t in kv]\n"
                "                works = [dist.isend(kv[0], send_to, group=group), dist.isend(kv[1], send_to, group=group),\n"
                "                         dist.irecv(incoming[0], recv_from, group=group), dist.irecv(incoming[1], recv_from, group=group)]\n", ""),)),
    RightAnswer("15.2", "two-buffers-swapped",  # trial 7
                "'A rank holds at most 2 other ranks' K/V blocks at a time': two buffers, the one sent reused for the next receive once its send is waited for, are 2 blocks, however often each is received into", (
        Mistake("15.2", "two-buffers-swapped", "template_context_parallel.py",
                '        kv = torch.stack([k, v])  # one message a step\n'
                '        for step in range(size):\n'
                '            if step < size - 1:\n'
                '                incoming = torch.empty_like(kv)\n'
                '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]',
                '        kv = torch.stack([k, v])  # one message a step\n'
                '        spare = torch.empty_like(kv)  # two buffers, swapped each step: the one sent is free once its send is waited for\n'
                '        for step in range(size):\n'
                '            if step < size - 1:\n'
                '                incoming = spare\n'
                '                works = [dist.isend(kv, send_to, group=group), dist.irecv(incoming, recv_from, group=group)]', ""),
        Mistake("15.2", "two-buffers-swapped", "template_context_parallel.py",
                '                kv, works = incoming, None  # a Work keeps its tensor alive: drop the finished ones too\n',
                '                kv, spare, incoming, works = incoming, kv, None, None  # a Work keeps its tensor alive\n', ""),
    )),
    RightAnswer("15.2", "blocks-merged-at-the-end",  # trial 7
                "'the partial results are merged with merge_attention': every block's (out, lse) kept and merged once the ring is done gives the same attention (more memory for outputs, none for K/V)", (
        Mistake("15.2", "blocks-merged-at-the-end", "template_context_parallel.py",
                '        outs, lses = [None] * len(q_chunks), [None] * len(q_chunks)\n',
                "        partial = [[] for _ in q_chunks]  # every block's (out, lse) for each query chunk, merged at the end\n", ""),
        Mistake("15.2", "blocks-merged-at-the-end", "template_context_parallel.py",
                '                outs[i], lses[i] = (out, lse) if outs[i] is None else merge_attention(outs[i], lses[i], out, lse)\n',
                '                partial[i].append((out, lse))\n', ""),
        Mistake("15.2", "blocks-merged-at-the-end", "template_context_parallel.py",
                '        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)\n',
                '        merged = [functools.reduce(lambda a, b: merge_attention(*a, *b), blocks) for blocks in partial]\n'
                '        out, lse = torch.cat([o for o, _ in merged], dim=2), torch.cat([m for _, m in merged], dim=2)\n', ""),
    )),
    RightAnswer("15.5", "all-to-all-of-a-list",  # trial 7
                "'One dist.all_to_all_single (or one dist.all_to_all of the N pieces)': the same bytes, each piece to its rank", (
        Mistake("15.5", "all-to-all-of-a-list", "template_context_parallel.py",
                "        send = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()  # piece j first-dim j: rank j's\n"
                '        received = torch.empty_like(send)\n'
                '        dist.all_to_all_single(received, send, group=group)\n'
                '        return torch.cat(received.unbind(0), dim=gather_dim)\n',
                "        send = [piece.contiguous() for piece in x.chunk(size, dim=scatter_dim)]  # piece j: rank j's\n"
                '        received = [torch.empty_like(piece) for piece in send]\n'
                '        dist.all_to_all(received, send, group=group)\n'
                '        return torch.cat(received, dim=gather_dim)\n', ""),
    )),
    RightAnswer("15.2", "merged-from-an-empty-attention",  # trial 7
                "merge_attention's 'A side with lse = -inf ... contributes nothing': starting from out = 0, "
                "lse = -inf and merging every block in gives the same attention", (
        Mistake("15.2", "merged-from-an-empty-attention", "template_context_parallel.py",
                '        outs, lses = [None] * len(q_chunks), [None] * len(q_chunks)\n',
                '        outs = [torch.zeros_like(piece) for piece in q_pieces]  # the attention over no key yet: out 0, lse -inf\n'
                '        lses = [torch.full(piece.shape[:3], float("-inf"), dtype=q.dtype) for piece in q_pieces]\n', ""),
        Mistake("15.2", "merged-from-an-empty-attention", "template_context_parallel.py",
                '                outs[i], lses[i] = (out, lse) if outs[i] is None else merge_attention(outs[i], lses[i], out, lse)\n',
                '                outs[i], lses[i] = merge_attention(outs[i], lses[i], out, lse)\n', ""),
    )),
    RightAnswer("9.1", "g-waited-through-the-future",  # trial 6 (2026-11-29)
                "'forward, the all-reduce (SUM) of x over the group, into a new tensor': a gloo all-reduce's Work "
                "has a Future; waiting through it returns once the sum is there", (
        Mistake("9.1", "g-waited-through-the-future", "template_tensor_parallel.py",
                "        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)\n        return out\n",
                "        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group, async_op=True).get_future().wait()\n"
                "        return out\n", ""),)),
    RightAnswer("9.1", "f-polls-is-completed",  # trial 6 (2026-11-29)
                "'backward, the all-reduce (SUM) of the gradient over the group': a gloo all-reduce's Work completes "
                "on its own (its p2p Works do not), so polling is_completed() until True ends with the sum", (
        Mistake("9.1", "f-polls-is-completed", "template_tensor_parallel.py",
                "        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)\n        return grad, None\n",
                "        work = dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group, async_op=True)\n"
                "        while not work.is_completed():\n            pass\n        return grad, None\n", ""),)),
    RightAnswer("9.2", "row-bias-added-in-place",  # trial 6 (2026-11-29)
                "'the partial product without bias, g (reduce_from_tp), then the bias': g returns a new tensor, "
                "so adding the bias to it in place changes no tensor autograd needs", (
        Mistake("9.2", "row-bias-added-in-place", "template_tensor_parallel.py",
                "        return y if self.bias is None else y + self.bias\n",
                "        if self.bias is not None:\n            y += self.bias\n        return y\n", ""),)),
    RightAnswer("9.4", "waited-through-the-future",  # trial 6 (2026-11-29)
                "'all_reduce with SUM over dp_group, then divide': a gloo all-reduce's Future waited for before "
                "dividing", (
        Mistake("9.4", "waited-through-the-future", "template_tensor_parallel.py",
                "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group)\n",
                "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group, async_op=True).get_future().wait()\n",
                ""),)),
    RightAnswer("11.2", "backward-waited-through-the-future",  # trial 6 (2026-11-29)
                "'ONE all-reduce (SUM) of both packed together': started with async_op=True and its gloo Future "
                "waited for before the sums are read", (
        Mistake("11.2", "backward-waited-through-the-future", "template_batchnorm.py",
                "            dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=ctx.group)  # the global sums\n",
                "            dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=ctx.group, async_op=True).get_future().wait()\n",
                ""),)),
    RightAnswer("11.1", "polls-is-completed",  # trial 6 (2026-11-29)
                "'ONE collective': a gloo all-reduce started with async_op=True completes on its own, so polling "
                "is_completed() until True ends with the sums (gloo's p2p Works do not)", (
        Mistake("11.1", "polls-is-completed", "template_batchnorm.py",
                "    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)  # the one collective\n",
                "    work = dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group, async_op=True)\n"
                "    while not work.is_completed():\n        pass\n", ""),)),
    RightAnswer("9.1", "gather-backward-returns-a-view",  # trial 6 (2026-11-29)
                "'Backward: this rank's slice of the gradient, [..., r * k:(r + 1) * k]': the slice as a view of "
                "grad, not copied, is that slice (autograd accepts a strided gradient)", (
        Mistake("9.1", "gather-backward-returns-a-view", "template_tensor_parallel.py",
                "        return grad.chunk(size, dim=-1)[rank].contiguous(), None\n",
                "        k = grad.shape[-1] // size\n        return grad[..., rank * k:(rank + 1) * k], None\n", ""),)),
    # Tasks 9 and 10, trial 9 (2026-11-29): other orders, other calls, other buffers that are right
    RightAnswer("9.2", "row-slice-through-the-transpose",
                "'Keep columns [r * in / N, (r + 1) * in / N) of linear.weight ... New tensors': the columns taken through the transpose and cloned are those columns, in their own memory (strided: F.linear takes it)", (
        Mistake("9.2", "row-slice-through-the-transpose", "template_tensor_parallel.py",
                "        weight = linear.weight.detach()[:, rank * k:(rank + 1) * k].clone()\n",
                "        weight = linear.weight.detach().t()[rank * k:(rank + 1) * k].t().clone()\n",
                ""),)),
    RightAnswer("9.3", "columns-before-rows",
                "'every rank creates EVERY group, in the same order on every rank': columns first, on every rank alike, is such an order", (
        Mistake("9.3", "columns-before-rows", "template_tensor_parallel.py",
                "    dp_group = tp_group = None\n    for d in range(dp_size):\n        ranks = list(range(d * tp_size, (d + 1) * tp_size))\n        group = dist.new_group(ranks)\n        if rank in ranks:\n            tp_group = group\n    for t in range(tp_size):\n        ranks = list(range(t, world_size, tp_size))\n        group = dist.new_group(ranks)\n        if rank in ranks:\n            dp_group = group\n",
                "    dp_group = tp_group = None\n    for t in range(tp_size):\n        ranks = list(range(t, world_size, tp_size))\n        group = dist.new_group(ranks)\n        if rank in ranks:\n            dp_group = group\n    for d in range(dp_size):\n        ranks = list(range(d * tp_size, (d + 1) * tp_size))\n        group = dist.new_group(ranks)\n        if rank in ranks:\n            tp_group = group\n",
                ""),)),
    RightAnswer("9.3", "new-subgroups-by-enumeration",
                "'the process groups of a grid that contain this rank': dist.new_subgroups_by_enumeration creates every group of a list on every rank and returns this rank's", (
        Mistake("9.3", "new-subgroups-by-enumeration", "template_tensor_parallel.py",
                "    dp_group = tp_group = None\n    for d in range(dp_size):\n        ranks = list(range(d * tp_size, (d + 1) * tp_size))\n        group = dist.new_group(ranks)\n        if rank in ranks:\n            tp_group = group\n    for t in range(tp_size):\n        ranks = list(range(t, world_size, tp_size))\n        group = dist.new_group(ranks)\n        if rank in ranks:\n            dp_group = group\n",
                "    tp_group, _ = dist.new_subgroups_by_enumeration([list(range(d * tp_size, (d + 1) * tp_size)) for d in range(dp_size)])\n    dp_group, _ = dist.new_subgroups_by_enumeration([list(range(t, world_size, tp_size)) for t in range(tp_size)])\n",
                ""),)),
    RightAnswer("9.3", "own-groups-with-local-synchronization",
                "'or, with use_local_synchronization=True, each rank creates only the two groups it is in': PyTorch's new_group then needs no call from the other ranks", (
        Mistake("9.3", "own-groups-with-local-synchronization", "template_tensor_parallel.py",
                "    dp_group = tp_group = None\n    for d in range(dp_size):\n",
                "    tp_group = dist.new_group(list(range(rank // tp_size * tp_size, (rank // tp_size + 1) * tp_size)), use_local_synchronization=True)\n    dp_group = dist.new_group(list(range(rank % tp_size, world_size, tp_size)), use_local_synchronization=True)\n    return dp_group, tp_group\n    for d in range(dp_size):\n",
                ""),)),
    RightAnswer("9.4", "avg-op",
                "'replace every .grad with its mean over dp_group': ReduceOp.AVG is that mean on torch 2.14's gloo (floats)", (
        Mistake("9.4", "avg-op", "template_tensor_parallel.py",
                "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group)\n        param.grad /= dp_size\n",
                "        dist.all_reduce(param.grad, op=dist.ReduceOp.AVG, group=dp_group)\n",
                ""),)),
    RightAnswer("9.4", "divide-first",
                "'its mean over dp_group': dividing each rank's gradient before the SUM gives the same mean (and cannot overflow first)", (
        Mistake("9.4", "divide-first", "template_tensor_parallel.py",
                "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group)\n        param.grad /= dp_size\n",
                "        param.grad /= dp_size\n        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group)\n",
                ""),)),
    # Task 13, trial 14 (b): right answers written otherwise
    RightAnswer("13.1", "copied-back-by-foreach",  # trial 14 (b)
                "'copy each slice back into its tensor': torch._foreach_copy_ of the slices does that copy for every tensor at once", (
        Mistake("13.1", "copied-back-by-foreach", "template_local_sgd.py",
                '            offset = 0\n            for tensor in same:\n                tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))\n                offset += tensor.numel()',
                '            torch._foreach_copy_(same, [piece.view_as(t) for piece, t in zip(flat.split([t.numel() for t in same]), same)])',
                ""),)),
    RightAnswer("13.1", "dtypes-in-a-list",  # trial 14 (b)
                "'in the order the dtypes first appear in `tensors`': a list appended with each new dtype is that order", (
        Mistake("13.1", "dtypes-in-a-list", "template_local_sgd.py",
                '        for dtype in dict.fromkeys(tensor.dtype for tensor in tensors):  # dicts keep the order of first appearance',
                '        dtypes = []\n        for tensor in tensors:\n            if tensor.dtype not in dtypes:\n                dtypes.append(tensor.dtype)\n        for dtype in dtypes:',
                ""),)),
    RightAnswer("13.1", "named-parameters-and-buffers",  # trial 14 (b)
                "'in the order model.parameters() and model.buffers() give them': named_parameters() and named_buffers() give them in that order", (
        Mistake("13.1", "named-parameters-and-buffers", "template_local_sgd.py",
                '    buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]\n    all_reduce_mean(list(model.parameters()) + buffers, group)',
                '    params = [p for _, p in model.named_parameters()]\n    buffers = [b for _, b in model.named_buffers() if b.dtype.is_floating_point]\n    all_reduce_mean(params + buffers, group)',
                ""),)),
    # Task 9, trial 14 (b): right answers written otherwise
    RightAnswer("9.3", "tp-group-none-for-every-rank",  # trial 14 (b)
                "'tp_group = None  # tensor parallel over every rank' (the module docstring): with dp_size 1 the tp group is every rank, the default group, which None stands for in every collective", (
        Mistake("9.3", "tp-group-none-for-every-rank", "template_tensor_parallel.py",
                '    for d in range(dp_size):\n        ranks = list(range(d * tp_size, (d + 1) * tp_size))\n        group = dist.new_group(ranks)\n        if rank in ranks:\n            tp_group = group\n',
                '    for d in range(dp_size if dp_size > 1 else 0):  # dp 1: the tp group is every rank, the default group (None)\n        ranks = list(range(d * tp_size, (d + 1) * tp_size))\n        group = dist.new_group(ranks)\n        if rank in ranks:\n            tp_group = group\n',
                ""),)),
    RightAnswer("9.2", "column-bias-added-separately",  # trial 14 (b)
                "'computes y_r = f(x) W_r^T + b_r ... With gather_output=True the slices are all-gathered': each rank adds its own slice of the bias before the gather, so the gathered output holds the whole bias", (
        Mistake("9.2", "column-bias-added-separately", "template_tensor_parallel.py",
                '        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)\n        return gather_from_tp(y, self.group) if self.gather_output else y',
                '        y = F.linear(copy_to_tp(x, self.group), self.weight)\n        if self.gather_output:\n            return gather_from_tp(y if self.bias is None else y + self.bias, self.group)\n        return y if self.bias is None else y + self.bias',
                ""),)),
    RightAnswer("9.2", "row-split-by-chunk-after-f",  # trial 14 (b)
                "'take this rank's slice of it (_split_last_dim, whose backward gives every rank x's whole gradient)': f on the whole x, then chunk(N)[r], is _split_last_dim written out", (
        Mistake("9.2", "row-split-by-chunk-after-f", "template_tensor_parallel.py",
                '            x = _split_last_dim(x, self.group)',
                '            x = copy_to_tp(x, self.group).chunk(dist.get_world_size(self.group), dim=-1)[dist.get_rank(self.group)]',
                ""),)),
    RightAnswer("9.4", "one-flat-buffer",  # trial 14 (b)
                "'replace every .grad of model with its mean over dp_group, in place': one all-reduce of the gradients concatenated (in their dtype) and copied back is that mean", (
        Mistake("9.4", "one-flat-buffer", "template_tensor_parallel.py",
                '    for param in model.parameters():\n        if param.grad is None:\n            continue\n        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=dp_group)\n        param.grad /= dp_size',
                '    grads = [p.grad for p in model.parameters() if p.grad is not None]\n    if not grads:\n        return\n    flat = torch.cat([g.reshape(-1) for g in grads])\n    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=dp_group)\n    flat /= dp_size\n    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):\n        g.copy_(piece.view_as(g))',
                ""),)),
    RightAnswer("9.4", "nothing-to-do-on-one-rank",  # trial 14 (b)
                "'its mean over dp_group': over a group of one rank the mean is the gradient itself, so returning at once is that mean", (
        Mistake("9.4", "nothing-to-do-on-one-rank", "template_tensor_parallel.py",
                '    dp_size = dist.get_world_size(dp_group)\n',
                '    dp_size = dist.get_world_size(dp_group)\n    if dp_size == 1:\n        return  # nothing to average\n',
                ""),)),
    RightAnswer("10.1", "list-not-range",
                "'a range of layer indices': a list of the same consecutive indices serves Stage alike", (
        Mistake("10.1", "list-not-range", "template_pipeline.py",
                "    return range(start, start + base + (1 if stage < extra else 0))",
                "    return list(range(start, start + base + (1 if stage < extra else 0)))",
                ""),)),
    RightAnswer("10.2", "sends-flattened",
                "'Send the data only (a detached, contiguous tensor)': a flat view of it is the same bytes; the receiver's buffer gives the shape", (
        Mistake("10.2", "sends-flattened", "template_pipeline.py",
                "dist.isend(tensor.detach().contiguous(), peer)",
                "dist.isend(tensor.detach().reshape(-1), peer)",
                ""),)),
    RightAnswer("10.3", "recv-into-a-leaf-requiring-grad",
                "'the returned tensor must require grad': a leaf made with requires_grad=True and filled by recv (not an autograd op) is one", (
        Mistake("10.3", "recv-into-a-leaf-requiring-grad", "template_pipeline.py",
                "        tensor = torch.empty(shape, dtype=dtype)\n        dist.recv(tensor, peer)\n        return tensor.requires_grad_(requires_grad)\n",
                "        tensor = torch.empty(shape, dtype=dtype, requires_grad=requires_grad)\n        dist.recv(tensor, peer)\n        return tensor\n",
                ""),)),
    RightAnswer("10.3", "recv-flat-then-view",
                "'Receive a tensor of shape and dtype': a flat buffer of that dtype and size, viewed in the shape, receives the same bytes", (
        Mistake("10.3", "recv-flat-then-view", "template_pipeline.py",
                "        tensor = torch.empty(shape, dtype=dtype)\n        dist.recv(tensor, peer)\n        return tensor.requires_grad_(requires_grad)\n",
                "        flat = torch.zeros(torch.Size(shape).numel(), dtype=dtype)\n        dist.recv(flat, src=peer)\n        return flat.view(shape).requires_grad_(requires_grad)\n",
                ""),)),
    RightAnswer("10.5", "autograd-backward",
                "'run output.backward(that gradient)': torch.autograd.backward([output], [gradient]) is that call", (
        Mistake("10.5", "autograd-backward", "template_pipeline.py",
                "        output.backward(stage.recv_backward(output.shape, output.dtype))\n",
                "        torch.autograd.backward([output], [stage.recv_backward(output.shape, output.dtype)])\n",
                ""),)),
    RightAnswer("10.7", "warmup-capped-by-m-minus-1",
                "'Warm-up: min(num_stages - stage_index - 1, M) forwards': capped at M - 1, the steady state runs the M-th forward and then the first backward, the same order", (
        Mistake("10.7", "warmup-capped-by-m-minus-1", "template_pipeline.py",
                "min(stage.num_stages - stage.stage_index - 1, num_microbatches)",
                "min(stage.num_stages - stage.stage_index - 1, num_microbatches - 1)",
                ""),)),
    RightAnswer("10.7", "loss-summed-in-backward",
                "'loss is the sum of the M scaled losses': summed as each micro-batch's backward runs, it is the same sum", (
        Mistake("10.7", "loss-summed-in-backward", "template_pipeline.py",
                "        if stage.is_last:\n            loss = saved[-1][1].detach() if loss is None else loss + saved[-1][1].detach()\n\n    def backward():\n        nonlocal next_backward\n        backward_step(stage, *saved.pop(0))",
                "\n    def backward():\n        nonlocal next_backward, loss\n        input, output = saved.pop(0)\n        if stage.is_last:  # the loss of the micro-batch whose backward runs\n            loss = output.detach() if loss is None else loss + output.detach()\n        backward_step(stage, input, output)",
                ""),)),
    RightAnswer("11.2", "saves-x-recomputes-x-hat",  # trial 6 (2026-11-29)
                "'x_hat is the part before * weight': saving x, mean and invstd and recomputing x_hat in backward "
                "(PyTorch's own BatchNorm saves its input) gives the same gradient", (
        Mistake("11.2", "saves-x-recomputes-x-hat", "template_batchnorm.py",
                "        ctx.save_for_backward(x_hat, invstd, weight)\n",
                "        ctx.save_for_backward(x, mean, invstd, weight)\n", ""),
        Mistake("11.2", "saves-x-recomputes-x-hat", "template_batchnorm.py",
                "        x_hat, invstd, weight = ctx.saved_tensors\n",
                "        x, mean, invstd, weight = ctx.saved_tensors\n"
                "        x_hat = (x - _per_channel(mean, x)) * _per_channel(invstd, x)\n", ""),)),
    RightAnswer("11.3", "frozen-parameters-detached",  # helper-a (2026-11-29)
                "'a frozen weight or bias still scales and shifts; it only gets no gradient': passing a frozen "
                "parameter detached gives the same values and, as before, no gradient", (
        Mistake("11.3", "frozen-parameters-detached", "template_batchnorm.py",
                "            return SyncBatchNormFunction.apply(x, self.weight, self.bias,",
                "            weight, bias = (p if p is None or p.requires_grad else p.detach() for p in (self.weight, self.bias))\n"
                "            return SyncBatchNormFunction.apply(x, weight, bias,", ""),)),
    RightAnswer("11.3", "running-stats-rebound-with-lerp",  # helper-a (2026-11-29)
                "'running_mean = (1 - m) * running_mean + m * mean': torch.lerp, the buffers rebound to new tensors "
                "(nn.Module keeps them registered), from statistics of x.detach(): no graph kept", (
        Mistake("11.3", "running-stats-rebound-with-lerp", "template_batchnorm.py",
                "                with torch.no_grad():\n"
                "                    self.running_mean.mul_(1 - m).add_(m * mean)\n"
                "                    self.running_var.mul_(1 - m).add_(m * var * count / (count - 1))\n",
                "                self.running_mean = torch.lerp(self.running_mean, mean, m)\n"
                "                self.running_var = torch.lerp(self.running_var, var * count / (count - 1), m)\n", ""),)),
    RightAnswer("11.3", "eval-scale-and-shift-folded",  # helper-a (2026-11-29)
                "'eval with running statistics: normalise with running_mean and running_var (then weight and bias)': "
                "folded into one scale and one shift per channel, as inference engines do, equal to rounding", (
        Mistake("11.3", "eval-scale-and-shift-folded", "template_batchnorm.py",
                "            invstd = torch.rsqrt(self.running_var + self.eps)\n"
                "            y = (x - _per_channel(self.running_mean, x)) * _per_channel(invstd, x)\n",
                "            scale = torch.rsqrt(self.running_var + self.eps)\n"
                "            shift = -self.running_mean * scale\n"
                "            if self.weight is not None:\n"
                "                scale, shift = scale * self.weight, shift * self.weight + self.bias\n"
                "            return x * _per_channel(scale, x) + _per_channel(shift, x)\n", ""),)),
    # trial 8, B
    RightAnswer("15.1", "log-sum-exp-of-a-stack", "merge_attention returns the union's lse however it is computed: "
                "torch.logsumexp over the two stacked is as stable as logaddexp, and -inf for two -inf", (
        Mistake("15.1", "log-sum-exp-of-a-stack", "template_context_parallel.py",
                "    lse = torch.logaddexp(lse_a, lse_b)\n",
                "    lse = torch.logsumexp(torch.stack([lse_a, lse_b]), dim=0)\n", ""),)),
    RightAnswer("15.4", "shard-by-index-select", "zigzag_shard returns chunk r then chunk 2N - 1 - r: picking their "
                "positions (token_chunks') with index_select is the same tensor", (
        Mistake("15.4", "shard-by-index-select", "template_context_parallel.py",
                "    chunks = x.chunk(2 * size, dim=dim)\n"
                "    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=dim)\n",
                "    positions = torch.cat([p for _, p in token_chunks(rank, size, x.shape[dim] // size, 'zigzag')])\n"
                "    return x.index_select(dim, positions)\n", ""),)),
    RightAnswer("15.4", "unshard-into-one-tensor", "zigzag_unshard is 'a collective over group': all_gather_into_tensor "
                "(the parts concatenated along dim 0, as gloo takes it) gathers the same parts as all_gather", (
        Mistake("15.4", "unshard-into-one-tensor", "template_context_parallel.py",
                "    parts = [torch.empty_like(x) for _ in range(size)]\n"
                "    dist.all_gather(parts, x.contiguous(), group=group)\n",
                "    gathered = x.new_empty((size * x.shape[0], *x.shape[1:]))\n"
                "    dist.all_gather_into_tensor(gathered, x.contiguous(), group=group)\n"
                "    parts = gathered.chunk(size)\n", ""),)),
    RightAnswer("15.6", "gradients-assigned-not-copied", "every .grad is made the single-process gradient: a new tensor "
                "assigned to .grad holds the same values as one copied into it", (
        Mistake("15.6", "gradients-assigned-not-copied", "template_context_parallel.py",
                "        param.grad.copy_(grad.view_as(param) / (world if id(param) in head else world // cp_size))",
                "        param.grad = grad.view_as(param) / (world if id(param) in head else world // cp_size)", ""),)),
    RightAnswer("15.6", "mean-backward-by-repeat", "each token gets grad / S: repeated along the tokens, then divided, "
                "is the same", (
        Mistake("15.6", "mean-backward-by-repeat", "template_context_parallel.py",
                "        return (grad / ctx.tokens).unsqueeze(1).expand(-1, ctx.local, -1).contiguous(), None",
                "        return grad.unsqueeze(1).repeat(1, ctx.local, 1) / ctx.tokens, None", ""),)),
    RightAnswer("8.3", "padding-from-the-line-end-clamped", "padding is how many of the end - start elements lie past "
                "the parameters: end - max(start, sum(numels)), clamped at 0, counts the same elements", (
        Mistake("8.3", "padding-from-the-line-end-clamped", "template_checkpoint.py",
                "    padding = (end - start) - sum(length for _, _, length, _ in entries)\n",
                "    padding = max(0, end - max(start, sum(numels)))\n", ""),)),
    RightAnswer("8.3", "entries-as-lists", "an entry is (name, offset, length, at): four values in order, a list as "
                "good as a tuple to every reader", (
        Mistake("8.3", "entries-as-lists", "template_checkpoint.py",
                "            entries.append((name, low - offset, high - low, low - start))",
                "            entries.append([name, low - offset, high - low, low - start])", ""),)),
    RightAnswer("15.6", "mean-of-the-means", "sequence_mean's 'one all-reduce (SUM) ... then / S (or / S before it)': "
                "each rank's mean is its sum / (S / N); their sum over the N ranks, / N, is the same mean", (
        Mistake("15.6", "mean-of-the-means", "template_context_parallel.py",
                "        total = x.sum(dim=1)\n        dist.all_reduce(total, group=group)\n        return total / ctx.tokens\n",
                "        mean = x.mean(dim=1)\n        dist.all_reduce(mean, group=group)\n"
                "        return mean / dist.get_world_size(group)\n", ""),)),
    # Task 15, trial 13 (2026-11-30): a merge in float32 for bfloat16, k and v concatenated, dq in parts, unshard into
    # places, an expanded gradient
    RightAnswer("15.1", "merge-in-at-least-float32",  # trial 13
                "merge_attention's 'New tensors in the inputs' dtype (computed in it; bfloat16 may be computed in float32 and cast back)': float64 merged in float64, bfloat16 in float32 and cast back", (
        Mistake("15.1", "merge-in-at-least-float32", "template_context_parallel.py",
                '    lse = torch.logaddexp(lse_a, lse_b)\n',
                '    dtype = out_a.dtype\n    work = torch.promote_types(dtype, torch.float32)  # bfloat16 merged in float32\n    out_a, lse_a, out_b, lse_b = (t.to(work) for t in (out_a, lse_a, out_b, lse_b))\n    lse = torch.logaddexp(lse_a, lse_b)\n', ""),
        Mistake("15.1", "merge-in-at-least-float32", "template_context_parallel.py",
                '    return weight_a * out_a + weight_b * out_b, lse',
                '    return (weight_a * out_a + weight_b * out_b).to(dtype), lse.to(dtype)', ""),
    )),
    RightAnswer("15.2", "k-and-v-concatenated-along-d",  # trial 13
                "'the K/V block sent whole each step (k and v stacked in one message, as the solution does, or in two)': k and v concatenated along the head width are one message of the same bytes", (
        Mistake("15.2", "k-and-v-concatenated-along-d", "template_context_parallel.py",
                '        kv = torch.stack([k, v])  # one message a step\n',
                '        kv = torch.cat([k, v], dim=-1)  # one message a step\n', ""),
        Mistake("15.2", "k-and-v-concatenated-along-d", "template_context_parallel.py",
                '                out, lse = attention_block(q_pieces[i], _pieces(kv[0], k_chunks)[j], _pieces(kv[1], k_chunks)[j],\n',
                '                d = kv.shape[-1] // 2\n                out, lse = attention_block(q_pieces[i], _pieces(kv[..., :d], k_chunks)[j], _pieces(kv[..., d:], k_chunks)[j],\n', ""),
    )),
    RightAnswer("15.3", "dq-parts-concatenated",  # trial 13
                "'dq of this rank's queries': one sum per query chunk, concatenated once the ring is done, is the same dq", (
        Mistake("15.3", "dq-parts-concatenated", "template_context_parallel.py",
                '        dq = torch.zeros_like(q)\n        dq_pieces = _pieces(dq, q_chunks)\n',
                '        dq_parts = [torch.zeros_like(piece) for piece in q_pieces]  # one per query chunk, concatenated at the end\n', ""),
        Mistake("15.3", "dq-parts-concatenated", "template_context_parallel.py",
                '                dq_pieces[i].add_(dq_b)\n',
                '                dq_parts[i] = dq_parts[i] + dq_b\n', ""),
        Mistake("15.3", "dq-parts-concatenated", "template_context_parallel.py",
                '        return dq, dkv[0], dkv[1], None, None, None\n',
                '        return torch.cat(dq_parts, dim=2), dkv[0], dkv[1], None, None, None\n', ""),
    )),
    RightAnswer("15.4", "unshard-into-narrowed-places",  # trial 13
                "'The whole sequence, in order': each gathered chunk copied to its place in one tensor is the same sequence", (
        Mistake("15.4", "unshard-into-narrowed-places", "template_context_parallel.py",
                '    chunks = [None] * (2 * size)\n    for rank, part in enumerate(parts):\n        chunks[rank], chunks[2 * size - 1 - rank] = part.chunk(2, dim=dim)\n    return torch.cat(chunks, dim=dim)\n',
                '    half = x.shape[dim] // 2\n    shape = list(x.shape)\n    shape[dim] = 2 * size * half\n    whole = x.new_empty(shape)\n    for rank, part in enumerate(parts):  # chunk r to place r, chunk 2N - 1 - r to its place\n        whole.narrow(dim, rank * half, half).copy_(part.narrow(dim, 0, half))\n        whole.narrow(dim, (2 * size - 1 - rank) * half, half).copy_(part.narrow(dim, half, half))\n    return whole\n', ""),
    )),
    RightAnswer("15.6", "mean-backward-an-expanded-view",  # trial 13
                "'each of its tokens gets grad / S': an expanded view of grad / S is that gradient, without a copy", (
        Mistake("15.6", "mean-backward-an-expanded-view", "template_context_parallel.py",
                '        return (grad / ctx.tokens).unsqueeze(1).expand(-1, ctx.local, -1).contiguous(), None',
                '        return (grad / ctx.tokens).unsqueeze(1).expand(-1, ctx.local, -1), None', ""),
    )),
    # Tasks 10.1, 13.2, 14.2, trial 12 (2026-11-30, the lead)
    RightAnswer("10.1", "tensor-split-of-an-arange", "'a range of layer indices' that Stage reads once: "
                "torch.tensor_split's first (num_layers % num_stages) pieces are one longer, the balance asked for", (
        Mistake("10.1", "tensor-split-of-an-arange", "template_pipeline.py",
                "    base, extra = divmod(num_layers, num_stages)\n    start = stage * base + min(stage, extra)\n"
                "    return range(start, start + base + (1 if stage < extra else 0))",
                "    return torch.tensor_split(torch.arange(num_layers), num_stages)[stage]", ""),)),
    RightAnswer("10.1", "tuple-of-indices", "'a range of layer indices': a tuple of the same indices serves Stage alike", (
        Mistake("10.1", "tuple-of-indices", "template_pipeline.py",
                "    return range(start, start + base + (1 if stage < extra else 0))",
                "    return tuple(range(start, start + base + (1 if stage < extra else 0)))", ""),)),
    # Tasks 10.2-10.6, trial 14 (a): right answers written otherwise
    RightAnswer("10.2", "batch-isend-irecv",  # trial 14 (a)
                "'Use dist.isend ... Append the Work': dist.batch_isend_irecv([dist.P2POp(dist.isend, ...)]) starts "
                "the same isend and returns its Works", (
        Mistake("10.2", "batch-isend-irecv", "template_pipeline.py",
                "        self.pending_sends.append(dist.isend(tensor.detach().contiguous(), peer))\n",
                "        self.pending_sends.extend(dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor.detach()"
                ".contiguous(), peer)]))\n", ""),)),
    RightAnswer("10.3", "group-src-translated",  # trial 14 (a)
                "'from global rank `peer`': the group's own rank of that global rank, given as group_src= with "
                "the group, names the same rank", (
        Mistake("10.3", "group-src-translated", "template_pipeline.py",
                "        dist.recv(tensor, peer)\n",
                "        group = self.group or dist.group.WORLD\n"
                "        dist.recv(tensor, group=group, group_src=dist.get_group_rank(group, peer))\n", ""),)),
    RightAnswer("10.4", "layers-run-one-by-one",  # trial 14 (a)
                "'output: stage.module(input)': its layers called in turn are that call", (
        Mistake("10.4", "layers-run-one-by-one", "template_pipeline.py",
                "    output = stage.module(input)\n",
                "    output = input\n    for layer in stage.module:\n        output = layer(output)\n", ""),)),
    RightAnswer("10.5", "sends-when-the-input-requires-grad",  # trial 14 (a)
                "'except on the first stage, send input.grad': the first stage's input is x, the batch, which "
                "requires no grad; every later stage's requires grad (recv_forward's)", (
        Mistake("10.5", "sends-when-the-input-requires-grad", "template_pipeline.py",
                "    if not stage.is_first:\n        stage.send_backward(input.grad)\n",
                "    if input.requires_grad:\n        stage.send_backward(input.grad)\n", ""),)),
    RightAnswer("10.5", "input-grad-dropped-after-sending",  # trial 14 (a)
                "'send input.grad to the previous stage': input.grad = None afterwards leaves the tensor sent as it "
                "is (the Work keeps it until wait_sends); only changing that tensor is wrong", (
        Mistake("10.5", "input-grad-dropped-after-sending", "template_pipeline.py",
                "    if not stage.is_first:\n        stage.send_backward(input.grad)\n",
                "    if not stage.is_first:\n        stage.send_backward(input.grad)\n        input.grad = None  # sent\n",
                ""),)),
    RightAnswer("10.6", "loss-added-in-place",  # trial 14 (a)
                "'loss is ... the sum of the M scaled losses, a 0-d tensor without graph': added in place into the "
                "first one's detached tensor, it is that sum (nothing reads that loss's value in backward)", (
        Mistake("10.6", "loss-added-in-place", "template_pipeline.py",
                "            loss = output.detach() if loss is None else loss + output.detach()\n",
                "            if loss is None:\n                loss = output.detach()\n            else:\n"
                "                loss += output.detach()\n", ""),)),
    RightAnswer("10.7", "cool-down-counted-by-the-warm-up",  # trial 14 (a)
                "'Cool-down: the remaining backwards': after the steady state they are the warm-up's, so "
                "range(warmup) backwards are all of them", (
        Mistake("10.7", "cool-down-counted-by-the-warm-up", "template_pipeline.py",
                "    while next_backward < num_microbatches:\n        backward()\n",
                "    for _ in range(warmup):  # the warm-up's forwards still wait for their backwards\n        backward()\n",
                ""),)),
    RightAnswer("10.6", "loss-stacked-and-summed",  # trial 14 (a)
                "'the sum of the M scaled losses, a 0-d tensor without graph': torch.stack(...).sum() of the "
                "detached losses is that sum", (
        Mistake("10.6", "loss-stacked-and-summed", "template_pipeline.py",
                "            loss = output.detach() if loss is None else loss + output.detach()\n",
                "            loss = torch.stack([o.detach() for _, o in saved]).sum()  # the scaled losses so far\n",
                ""),)),
    RightAnswer("13.2", "returns-early-between-averages", "'if this was the sync_every-th step since the last "
                "average': returning the loss until then is the same test the other way round", (
        Mistake("13.2", "returns-early-between-averages", "template_local_sgd.py",
                "        if self.local_step >= self.sync_every:  # >=: sync_every may have been lowered below the count\n"
                "            average_parameters(self.model, self.group)\n            self.local_step = 0\n        return loss\n",
                "        if self.local_step < self.sync_every:\n            return loss\n"
                "        average_parameters(self.model, self.group)\n        self.local_step = 0\n        return loss\n",
                ""),)),
    RightAnswer("13.2", "closure-passed-only-if-given", "'with the closure, if any': step() without an argument is "
                "step(None)", (
        Mistake("13.2", "closure-passed-only-if-given", "template_local_sgd.py",
                "        loss = self.optimizer.step(closure)\n        self.local_step += 1",
                "        loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()\n"
                "        self.local_step += 1", ""),)),
    RightAnswer("10.6", "losses-stacked-activations-popped", "'the sum of the M scaled losses, a 0-d tensor without "
                "graph': summed once after the forwards; each (input, output) taken off the list by its backward, "
                "in the same order 0, 1, ..., M-1", (
        Mistake("10.6", "losses-stacked-activations-popped", "template_pipeline.py",
                "        if stage.is_last:\n"
                "            loss = output.detach() if loss is None else loss + output.detach()\n"
                "    for i in range(num_microbatches):\n        backward_step(stage, *saved[i])\n"
                "        saved[i] = None  # its activations are no longer needed\n",
                "    if stage.is_last:\n        loss = torch.stack([output.detach() for _, output in saved]).sum()\n"
                "    for i in range(num_microbatches):\n        backward_step(stage, *saved.pop(0))\n", ""),)),
    RightAnswer("16.4", "experts-deep-copied", "from_moe's 'its local experts ..., the same models.MLP modules or "
                "copies'", (
        Mistake("16.4", "experts-deep-copied", "template_experts.py",
                "        experts = [moe.experts[e] for e in local_experts(moe.num_experts, group)]\n",
                "        import copy\n"
                "        experts = [copy.deepcopy(moe.experts[e]) for e in local_experts(moe.num_experts, group)]\n", ""),)),
    RightAnswer("16.4", "replaced-by-qualified-name", "parallelize_moe's 'every models.MoE inside model replaced, in "
                "place': found by named_modules and set on its parent, get_submodule", (
        Mistake("16.4", "replaced-by-qualified-name", "template_experts.py",
                "    for module in list(model.modules()):\n        for name, child in module.named_children():\n"
                "            if isinstance(child, models.MoE):\n"
                "                setattr(module, name, ExpertParallelMoE.from_moe(child, ep_group))\n",
                "    for name, module in list(model.named_modules()):\n        if isinstance(module, models.MoE):\n"
                "            parent, _, attr = name.rpartition(\".\")\n"
                "            setattr(model.get_submodule(parent), attr, ExpertParallelMoE.from_moe(module, ep_group))\n",
                ""),)),
    RightAnswer("8.4", "parts-copied-into-place", "'glued in the order of their offsets in the parameter': each part "
                "copied straight to its place (at + its offset in the entry) is that order whatever order they come "
                "in; the elements counted say whether all were found", (
        Mistake("8.4", "parts-copied-into-place", "template_checkpoint.py",
                "            parts = []\n",
                "            covered = 0\n", ""),
        Mistake("8.4", "parts-copied-into-place", "template_checkpoint.py",
                "                        parts.append((low, tensors[key][begin:begin + high - low]))\n"
                "            parts.sort(key=lambda part: part[0])  # by position in the parameter\n"
                "            if sum(part.numel() for _, part in parts) != length:\n",
                "                        flat[at + low - offset:at + high - offset] = tensors[key][begin:begin + high - low]\n"
                "                        covered += high - low\n"
                "            if covered != length:\n", ""),
        Mistake("8.4", "parts-copied-into-place", "template_checkpoint.py",
                "            flat[at:at + length] = torch.cat([part for _, part in parts])\n", "", ""),)),
    RightAnswer("11.1", "parallel-variance-of-gathered-stats", "the docstring's first way: 'all-gather each rank's "
                "(count, mean, M2 = sum of squared deviations) and combine them with the parallel-variance formula "
                "(PyTorch's way)', gathered in float64 (a count in bfloat16 is not exact past 256)", (
        Mistake("11.1", "parallel-variance-of-gathered-stats", "template_batchnorm.py",
                ("    dims = _reduce_dims(x)\n"
                 "    n = x.numel() // x.shape[1]  # this rank's elements per channel\n"
                 "    if n > 0:\n"
                 "        # each rank's own mean and squared deviations, stable in x's dtype (torch.var_mean\n"
                 "        # never forms E[x^2]); then sums in float64: sum(x^2) = M2 + n * mean^2 is then\n"
                 "        # exact enough for the subtraction below\n"
                 "        var, mean = torch.var_mean(x, dim=dims, correction=0)\n"
                 "        mean, m2 = mean.double(), var.double() * n\n"
                 "    else:  # nothing here, but this rank must still take part in the all-reduce\n"
                 "        mean = m2 = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)\n"
                 "    packed = torch.cat([torch.tensor([float(n)], dtype=torch.float64, device=x.device), n * mean, m2 + n * mean ** 2])\n"
                 "    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)  # the one collective\n"
                 "    count = packed[0]\n"
                 "    total, squares = packed[1:].chunk(2)\n"
                 "    global_mean = total / count\n"
                 "    global_var = (squares / count - global_mean ** 2).clamp(min=0)\n"
                 "    return global_mean.to(x.dtype), global_var.to(x.dtype), int(count.item())\n"),
                ("    dims = _reduce_dims(x)\n"
                 "    n = x.numel() // x.shape[1]  # this rank's elements per channel\n"
                 "    channels = x.shape[1]\n"
                 "    if n > 0:\n"
                 "        var, mean = torch.var_mean(x, dim=dims, correction=0)\n"
                 "    else:\n"
                 "        mean = var = x.new_zeros(channels)\n"
                 "    # (count, mean, M2) of this rank, in float64: a count in float16 or bfloat16 would not be exact\n"
                 "    mine = torch.cat([torch.tensor([float(n)], dtype=torch.float64, device=x.device), mean.double(), var.double() * n])\n"
                 "    gathered = torch.empty(dist.get_world_size(group) * mine.numel(), dtype=torch.float64, device=x.device)\n"
                 "    dist.all_gather_into_tensor(gathered, mine, group=group)  # the one collective\n"
                 "    gathered = gathered.view(-1, mine.numel())\n"
                 "    count = torch.zeros((), dtype=torch.float64, device=x.device)\n"
                 "    global_mean = torch.zeros(channels, dtype=torch.float64, device=x.device)\n"
                 "    m2 = torch.zeros(channels, dtype=torch.float64, device=x.device)\n"
                 "    for row in gathered:  # Chan et al.'s parallel variance, one rank at a time\n"
                 "        n_b, mean_b, m2_b = row[0], row[1:1 + channels], row[1 + channels:]\n"
                 "        if n_b == 0:\n"
                 "            continue\n"
                 "        total = count + n_b\n"
                 "        delta = mean_b - global_mean\n"
                 "        global_mean = global_mean + delta * n_b / total\n"
                 "        m2 = m2 + m2_b + delta ** 2 * count * n_b / total\n"
                 "        count = total\n"
                 "    global_var = m2 / count\n"
                 "    return global_mean.to(x.dtype), global_var.to(x.dtype), int(count.item())\n"), ""),)),
    RightAnswer("14.1", "rows-reordered-in-place", "'a column-parallel layer ... whose weight and bias are the rows "
                "of rank r's heads in q, then in k, then in v': the whole qkv's rows put in that order in place, then "
                "Task 9's from_linear of it, splitting them as they lie", (
        Mistake("14.1", "rows-reordered-in-place", "template_sequence_parallel.py",
                "    regrouped = nn.Linear(dim, 3 * dim, bias=attn.qkv.bias is not None, device=\"meta\")\n"
                "    regrouped.weight = nn.Parameter(attn.qkv.weight.detach()[order])\n"
                "    if attn.qkv.bias is not None:\n        regrouped.bias = nn.Parameter(attn.qkv.bias.detach()[order])\n"
                "    attn.qkv = column.from_linear(regrouped, group)\n",
                "    with torch.no_grad():\n        attn.qkv.weight.copy_(attn.qkv.weight[order])\n"
                "        if attn.qkv.bias is not None:\n            attn.qkv.bias.copy_(attn.qkv.bias[order])\n"
                "    attn.qkv = column.from_linear(attn.qkv, group)\n", ""),)),
    RightAnswer("16.2", "sorted-by-one-key", "'ordered by expert ..., and within an expert in token order': one "
                "key, expert * T + token, sorts the kept pairs so (a token picks an expert once: no ties)", (
        Mistake("16.2", "sorted-by-one-key", "template_experts.py",
                "    order = torch.argsort(expert, stable=True)  # by expert; within one, token order stays\n",
                "    order = torch.argsort(expert * routing.kept.shape[0] + token)  # one key: expert, then token\n",
                ""),)),
    RightAnswer("16.2", "counts-from-one-hot", "'the number of pairs per expert': the one-hot rows of the "
                "experts summed are those counts, int64 as bincount's (and E zeros where T is 0)", (
        Mistake("16.2", "counts-from-one-hot", "template_experts.py",
                "    counts = torch.bincount(expert, minlength=num_experts)  # pairs this rank sends to each expert\n",
                "    counts = torch.nn.functional.one_hot(expert, num_experts).sum(dim=0)\n", ""),)),
    RightAnswer("16.3", "index-put-accumulated", "'y[t] = the sum over token t's kept choices': index_put with "
                "accumulate=True adds each weighted row at its token, as index_add does (differentiable alike)", (
        Mistake("16.3", "index-put-accumulated", "template_experts.py",
                "    return back.new_zeros((tokens, back.shape[-1])).index_add(0, plan.token, gate * back)\n",
                "    return back.new_zeros((tokens, back.shape[-1])).index_put((plan.token,), gate * back, "
                "accumulate=True)\n", ""),)),
    # Tasks 16.1-16.4, trial 14 (d)
    RightAnswer("16.1", "output-zeros", "'a new tensor of sum(output_splits) rows': zeros as good as new_empty, in x's dtype and device", (  # trial 14 (d)
        Mistake("16.1", "output-zeros", "template_experts.py",
                "out = x.new_empty((sum(output_splits), *x.shape[1:]))",
                "out = torch.zeros(sum(output_splits), *x.shape[1:], dtype=x.dtype, device=x.device)", ""),)),
    RightAnswer("16.2", "tokens-by-index-select", "'Only the kept (token, choice) pairs travel': x.index_select(0, token) is x[token], differentiable alike", (  # trial 14 (d)
        Mistake("16.2", "tokens-by-index-select", "template_experts.py",
                "arrived = all_to_all(x[token], output_splits, input_splits, group)",
                "arrived = all_to_all(x.index_select(0, token), output_splits, input_splits, group)", ""),)),
    RightAnswer("16.2", "regrouped-by-a-loop", "'expert_inputs[j] ... rank 0's first, then rank 1's': a loop over the source ranks takes the same pieces", (  # trial 14 (d)
        Mistake("16.2", "regrouped-by-a-loop", "template_experts.py",
                "    pieces = arrived.split(received.reshape(-1).tolist())\n    expert_inputs = [torch.cat(pieces[j::len(experts)]) for j in range(len(experts))]",
                "    pieces = list(arrived.split(received.reshape(-1).tolist()))\n    expert_inputs = []\n    for j in range(len(experts)):\n        rows = [pieces[s * len(experts) + j] for s in range(size)]\n        expert_inputs.append(torch.cat(rows, dim=0))", ""),)),
    RightAnswer("16.2", "input-splits-by-destination", "'input_splits: N ints, the rows this rank sent to each rank': a bincount of expert // (E / N) counts them", (  # trial 14 (d)
        Mistake("16.2", "input-splits-by-destination", "template_experts.py",
                "input_splits = counts.view(size, len(experts)).sum(dim=1).tolist()",
                "input_splits = torch.bincount(expert // len(experts), minlength=size).tolist()", ""),)),
    RightAnswer("16.3", "index-add-in-place", "'y[t] = the sum over token t's kept choices ..., zeros for a token with no kept choice': in place on fresh zeros, differentiable alike", (  # trial 14 (d)
        Mistake("16.3", "index-add-in-place", "template_experts.py",
                "return back.new_zeros((tokens, back.shape[-1])).index_add(0, plan.token, gate * back)",
                "y = torch.zeros(tokens, back.shape[-1], dtype=back.dtype, device=back.device)\n    y.index_add_(0, plan.token, back * gate)\n    return y", ""),)),
    RightAnswer("16.3", "scatter-add", "'y[t] = the sum over token t's kept choices': scatter_add over the rows adds each at its token as index_add does", (  # trial 14 (d)
        Mistake("16.3", "scatter-add", "template_experts.py",
                "return back.new_zeros((tokens, back.shape[-1])).index_add(0, plan.token, gate * back)",
                "return back.new_zeros((tokens, back.shape[-1])).scatter_add(0, plan.token[:, None].expand_as(back), gate * back)", ""),)),
    RightAnswer("16.4", "experts-sliced", "'its local experts (local_experts' range) ..., the same models.MLP modules': a slice of the ModuleList is those modules", (  # trial 14 (d)
        Mistake("16.4", "experts-sliced", "template_experts.py",
                "experts = [moe.experts[e] for e in local_experts(moe.num_experts, group)]",
                "mine = local_experts(moe.num_experts, group)\n        experts = list(moe.experts[mine.start:mine.stop])", ""),)),
    RightAnswer("16.4", "modules-walked-live", "'Every models.MoE inside model replaced, in place': setattr on an existing name during modules() changes no dict's size; the walk then visits the new layer's children, none a MoE", (  # trial 14 (d)
        Mistake("16.4", "modules-walked-live", "template_experts.py",
                "    for module in list(model.modules()):\n        for name, child in module.named_children():",
                "    for module in model.modules():\n        for name, child in list(module.named_children()):", ""),)),
    RightAnswer("16.2", "sorted-by-torch-sort", "'ordered by expert ..., and within an expert in token order': torch.sort(..., stable=True)'s indices are argsort's", (  # trial 14 (d)
        Mistake("16.2", "sorted-by-torch-sort", "template_experts.py",
                "order = torch.argsort(expert, stable=True)",
                "_, order = torch.sort(expert, stable=True)", ""),)),
]


def make_submission(dest, mistakes=(), repo=REPO):
    """A copy of the course's files (grading/course.py: never a .venv or data) whose template_*.py
    files are the solutions with `mistakes` applied.

    The tests in the copy are this repository's, so `pytest --impl template` there checks
    the wrong answers."""
    copy_course(dest, repo)
    _copy_compiled_files(repo, dest)
    for name in os.listdir(os.path.join(repo, "solutions")):
        if name.startswith("template_") and name.endswith(".py"):
            with open(os.path.join(repo, "solutions", name)) as f:
                text = f.read()
            for mistake in mistakes:
                if mistake.file == name:
                    text = mistake.apply(text)
            with open(os.path.join(dest, name), "w") as f:
                f.write(text)
    return dest


def _copy_compiled_files(repo, dest):
    """The course's __pycache__ folders, where the copy has the folder: Python and pytest take a compiled file
    only while its source has the size and mtime it was compiled from (copy_course keeps both), so each copy's
    pytest and ranks no longer compile the tests, solutions/ and support/ again (the templates, rewritten, are)."""
    for folder, subfolders, _ in os.walk(dest):
        cache = os.path.join(repo, os.path.relpath(folder, dest), "__pycache__")
        if os.path.isdir(cache) and "__pycache__" not in subfolders:
            shutil.copytree(cache, os.path.join(folder, "__pycache__"))
