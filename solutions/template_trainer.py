"""Task 2: keep the replicas in sync.

    torchrun --standalone --nproc_per_node=2 train_ddp.py     # trains with these functions
    python check.py 2                                         # check your work (one task: python check.py 2.2)

Every rank holds a full copy of the model and trains it on its own slice of each batch.
Three collectives keep the copies identical, and they are your tasks:

    Task 2.1  broadcast_parameters  before training, every rank takes rank 0's weights
    Task 2.2  average_gradients     after every backward, every rank gets the mean gradient
    Task 2.3  reduce_metrics        after evaluation, every rank gets the global counts

setup_distributed(), cleanup() and the loops train_one_epoch() and evaluate() are given:
read them to see where your functions are called.
"""
import contextlib
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

try:
    import launchers
except ImportError:  # started as solutions/template_collectives.py: Python looks in solutions/ only
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import launchers


def print0(*args, **kwargs):
    """print() on rank 0 only. Reads RANK from the environment, so it works before set-up."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(*args, **kwargs, flush=True)


def setup_distributed(backend=None, timeout=datetime.timedelta(minutes=5)):
    """Join the process group that the launcher describes, and choose this process's device.

    A launcher starts one copy of this script per rank and tells each, in its environment,
    its rank (among all processes), its local rank (among those on its machine), the world
    size and where to meet. torchrun names them RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT; srun, mpirun and Ray name them their own way, and launchers.py reads every
    one (docs/launchers.md). Started with plain `python`, none is set and this process is a
    world of one, so the same script runs either way.

    backend: "nccl" (GPUs) or "gloo" (CPUs, and CUDA tensors too); None picks NCCL when
    CUDA is available, else gloo. timeout: how long a collective waits for the other
    ranks before it fails, which is how long a hang lasts.
    Returns (rank, local_rank, world_size, device).
    """
    # who_am_i() in torchrun's words, written back as RANK, WORLD_SIZE, ... for print0 and env://
    me = launchers.set_torchrun_variables()
    rank, local_rank, world_size = me.rank, me.local_rank, me.world_size
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")

    # The device follows LOCAL_RANK, never RANK: on the second node RANK starts at the
    # number of GPUs per node, and cuda:RANK does not exist there.
    if torch.cuda.is_available():
        num_gpus = torch.cuda.device_count()
        if backend == "nccl" and me.local_world_size > num_gpus:
            raise ValueError(f"{me.local_world_size} processes on this node but only {num_gpus} GPUs: NCCL needs "
                             f"a GPU for each process; use --nproc_per_node={num_gpus}, or --backend gloo")
        device = torch.device("cuda", local_rank % num_gpus)
        torch.cuda.set_device(device)
    elif backend == "nccl":
        raise ValueError("the NCCL backend needs GPUs and none is visible: use --backend gloo on CPUs")
    else:
        device = torch.device("cpu")

    if dist.is_initialized():  # Ray Train and torchrunx join the group themselves: never a second time
        if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise ValueError(f"the process group already set up is rank {dist.get_rank()} of "
                             f"{dist.get_world_size()}, the environment says {rank} of {world_size}")
        return rank, local_rank, world_size, device
    options = {"device_id": device} if backend == "nccl" else {}
    if me.master_port is not None:  # the processes meet at MASTER_ADDR:MASTER_PORT (env://)
        with launchers.meeting_failures_explained(me):  # a taken port, a rank that never comes: one line
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout,
                                    store=restart_store(world_size, timeout), **options)
    else:  # plain `python`: an in-process store, so no port is needed
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **options)
    return rank, local_rank, world_size, device


def restart_store(world_size, timeout):
    """After torchrun restarted the processes (--max-restarts), a store for this attempt alone.

    torchrun's store outlives the failed attempt and still holds the dead processes'
    addresses under the same keys: a new rank that read them first would connect to a
    process that no longer exists ("Connection refused" in connectFullMesh). A prefix per
    attempt keeps the attempts apart. None, the default env:// store, on the first attempt.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt == "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=False, timeout=timeout)
    return dist.PrefixStore(f"restart_{attempt}", store)


def cleanup():
    """Leave the process group. Without it, gloo can abort at exit with
    'terminate called without an active exception' and a non-zero exit code."""
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_parameters(model, src=0):
    """Make every rank's model an exact copy of rank `src`'s, in place.

    Every parameter and every buffer (BatchNorm's running statistics are buffers, not
    parameters) is overwritten with rank src's values. Every rank must call this, with
    the same model, before the first training step: each rank initialised its model with
    its own random numbers, and without this they would train different models.
    """
    # --- Task 2.1 begin ---
    with torch.no_grad():  # an in-place write into a parameter must not be recorded by autograd
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor, src=src)
    # --- Task 2.1 end ---


def average_gradients(model):
    """Replace every parameter's .grad with its mean over all ranks, in place.

    Call it on every rank after loss.backward() and before optimizer.step(). all_reduce
    with SUM, then divide by the world size: a sum alone would act like a learning rate
    world_size times too large. (ReduceOp.AVG does both, but only on NCCL and on recent
    gloo, and SUM-then-divide shows what it does.) Skip parameters whose .grad is None
    (frozen ones): every rank skips the same ones, so the collectives still match.
    model.parameters() lists a parameter shared by two layers (tied weights) once, so it
    is averaged once.
    """
    # --- Task 2.2 begin ---
    world_size = dist.get_world_size()
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad /= world_size
    # --- Task 2.2 end ---


def reduce_metrics(correct, total, loss_sum, device="cpu"):
    """The sums over all ranks of this rank's evaluation counts, returned on every rank.

    correct: images classified correctly, total: images evaluated, loss_sum: the sum of
    their losses (not the mean), all on this rank. Returns (correct, total, loss_sum) summed
    over ranks as (int, int, float). Sum counts, never average accuracies: the ranks may
    hold different numbers of test images. device: where the collective runs (a GPU for
    NCCL, which cannot reduce CPU tensors).
    """
    # --- Task 2.3 begin ---
    # float64 holds counts exactly up to 2**53, and the loss sum without float32 rounding
    sums = torch.tensor([correct, total, loss_sum], dtype=torch.float64, device=device)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    correct, total, loss_sum = sums.tolist()
    return int(correct), int(total), loss_sum
    # --- Task 2.3 end ---


def progress_bar(loader, epoch):
    """A tqdm bar with images/s over all ranks, on rank 0 when stderr is a terminal; else None,
    and train_one_epoch prints a line every few seconds instead (a bar in a file or a SLURM
    log is a wall of carriage returns)."""
    if int(os.environ.get("RANK", 0)) != 0 or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    images_per_step = (loader.batch_size or 1) * world_size  # the bar counts steps, unit_scale shows images
    return tqdm(total=len(loader), desc=f"epoch {epoch}", unit="img", unit_scale=images_per_step, leave=False)


def forward_backward(model, images, labels, accumulate=1):
    """Forward and backward of one batch on this rank; returns the sum of its images' losses.

    accumulate=K splits the batch into K micro-batches whose gradients add up before the one
    optimizer step (Task 5); a model with no_sync() (a DDP) runs all but the last inside it.
    A strategy that runs forward and backward its own way (a pipeline, Task 10) passes
    train_one_epoch another function with the same arguments and result.
    """
    loss_sum = 0.0
    for micro_step, (x, y) in enumerate(zip(images.chunk(accumulate), labels.chunk(accumulate))):
        # Only the last micro-batch may communicate: forward AND backward inside no_sync().
        last = micro_step == accumulate - 1
        with contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
            # divided by K: the K micro-batches' gradients then sum to the whole batch's mean
            loss = F.cross_entropy(model(x), y) / accumulate
            loss.backward()
        loss_sum += loss.item() * len(labels)  # = the micro-batch's mean loss x its size
    return loss_sum


def train_one_epoch(model, loader, optimizer, device, sync_gradients=average_gradients,
                    epoch=0, log_every=10.0, accumulate=1, forward_backward=forward_backward):
    """One pass over this rank's shard. Returns this rank's loss sum, samples and timings.

    sync_gradients(model) runs between backward and step: average_gradients for our own
    data parallelism, None under DistributedDataParallel, which averages during backward.
    Its time is measured, waiting for slower ranks included: that is the price of
    synchronising every step. forward_backward(model, images, labels, accumulate) runs
    forward and backward of each batch and returns the sum of its losses (see above).
    """
    model.train()
    loss_sum, samples, sync_seconds = 0.0, 0, 0.0
    start = last_log = time.perf_counter()
    bar = progress_bar(loader, epoch)
    for step, (images, labels) in enumerate(loader):
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        batch_loss_sum = forward_backward(model, images, labels, accumulate)
        loss_sum += batch_loss_sum
        if sync_gradients is not None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # GPU work is asynchronous: time the sync alone
            t0 = time.perf_counter()
            sync_gradients(model)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            sync_seconds += time.perf_counter() - t0
        optimizer.step()
        samples += len(labels)
        if bar is not None:
            bar.set_postfix_str(f"loss {batch_loss_sum / len(labels):.4f}", refresh=False)
            bar.update()
        elif time.perf_counter() - last_log > log_every:
            last_log = time.perf_counter()
            print0(f"  epoch {epoch} step {step + 1}/{len(loader)} loss {batch_loss_sum / len(labels):.4f}")
    if bar is not None:
        bar.close()
    return {"loss_sum": loss_sum, "samples": samples,
            "seconds": time.perf_counter() - start, "sync_seconds": sync_seconds}


def evaluate(model, loader, device):
    """Accuracy and mean loss over the whole test set, the same on every rank.

    Each rank evaluates its own shard (of the unpadded sampler, so no image counts twice),
    then reduce_metrics adds up the counts. The shards may differ in length by one, so a
    rank may have one batch fewer: that is why there is no collective inside the loop,
    only one after it, which every rank reaches.
    """
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(dim=1) == labels).sum().item()
            total += len(labels)
    correct, total, loss_sum = reduce_metrics(correct, total, loss_sum, device)
    return {"correct": correct, "total": total, "accuracy": correct / max(total, 1),
            "loss": loss_sum / max(total, 1)}
