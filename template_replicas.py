"""Task 4: data parallelism inside one process, the seed's first version.

    python template_replicas.py                          # 2 CPU "devices" against one device
    python template_replicas.py --devices cpu,cpu,cpu --batch-size 50
    python template_replicas.py --devices cuda:0,cuda:1  # two GPUs, and nn.DataParallel too
    python -m solutions.template_replicas                # the same with the reference answers
    python check.py 4                                    # check your work (one task: python check.py 4.3)

No process group and no torchrun: one Python process holds a master copy of the model
on the CPU and one replica of it on each device of a list. A device may appear several
times ("cpu,cpu" is two replicas on the CPU), so this runs on any laptop. Every step:

    scatter           Task 4.2  cut the batch into one chunk per device
    (given)                     forward and backward on each replica, on its own chunk
    reduce_gradients  Task 4.3  average the replicas' gradients into the master, on the CPU
    (given)                     optimizer.step() on the master
    copy_weights      Task 4.4  copy the master's new weights into every replica

after replicate (Task 4.1) made the replicas once, before the first step. The result is
single-device training on the whole batch, up to float rounding, which is what the demo
and the tests check. torch.nn.DataParallel does the same with the master on the first GPU
and the replicas run in threads. Its cost is the traffic: every gradient goes device ->
CPU and every weight CPU -> device, through one place, every step. Task 3's ring spreads
that traffic over all the links; DistributedDataParallel is that ring, one process per GPU.
"""
import argparse
import copy

import torch
import torch.nn.functional as F


def replicate(master, devices):
    """Task 4.1: one independent copy of `master` on each device, in the order of `devices`.

    Returns a list of len(devices) modules. Each replica has its own parameters and
    buffers, equal to the master's, on its device: a deep copy, never the master itself,
    or the replicas on one device would all be one model. The master stays on the CPU.
    """
    # --- Task 4.1 begin ---
    # TODO Task 4.1: a deep copy of master, moved to each device
    raise NotImplementedError("Task 4.1: replicate() in template_replicas.py is not done yet (docs/task4-replicas.md)")
    # --- Task 4.1 end ---


def scatter(images, labels, devices):
    """Task 4.2: the batch cut along its first dimension into one chunk per device.

    Returns a list of (images, labels) pairs, pair i on devices[i], in the order of the
    batch. The lengths differ by at most one, the longer first, as torch.tensor_split
    makes them: 10 images on 4 devices give 3, 3, 2, 2 (torch.chunk would give 3, 3, 3, 1,
    and only 3 chunks for 5 images on 4 devices).
    """
    if len(labels) < len(devices):  # a replica with nothing to compute has no gradient to give
        raise ValueError(f"a batch of {len(labels)} cannot be split over {len(devices)} devices: "
                         f"use a batch of at least {len(devices)}")
    # --- Task 4.2 begin ---
    # TODO Task 4.2: torch.tensor_split images and labels into len(devices) chunks, chunk i .to(devices[i])
    raise NotImplementedError("Task 4.2: scatter() in template_replicas.py is not done yet (docs/task4-replicas.md)")
    # --- Task 4.2 end ---


def reduce_gradients(master, replicas, chunk_sizes):
    """Task 4.3: set the master's .grad to the replicas' gradients averaged on the CPU.

    For each parameter: master.grad = sum over replicas i of (n_i / n) * replica_i.grad,
    copied to the CPU first, where n_i = chunk_sizes[i] and n = sum(chunk_sizes). Why the
    weights: each replica's loss is the mean over its own chunk, and the loss of the whole
    batch weighs chunk i by n_i / n; with equal chunks this is the plain mean. A parameter
    without a gradient on the replicas (a frozen one) keeps .grad None on the master.
    """
    # --- Task 4.3 begin ---
    # TODO Task 4.3: master param.grad = sum of (n_i / n) * replica_i's grad, on the CPU; skip grads that are None
    raise NotImplementedError("Task 4.3: reduce_gradients() in template_replicas.py is not done yet (docs/task4-replicas.md)")
    # --- Task 4.3 end ---


def copy_weights(master, replicas):
    """Task 4.4: copy the master's parameters and buffers into every replica, in place.

    After the optimizer step only the master holds the new weights. Overwrite each
    replica's tensors with copy_ (CPU -> device) under torch.no_grad(): the replicas keep
    their own memory on their own devices, and autograd does not record the copy.
    """
    # --- Task 4.4 begin ---
    # TODO Task 4.4: under torch.no_grad(), copy_ every master parameter and buffer into each replica's
    raise NotImplementedError("Task 4.4: copy_weights() in template_replicas.py is not done yet (docs/task4-replicas.md)")
    # --- Task 4.4 end ---


def train_step(master, replicas, optimizer, images, labels, devices):
    """One step on the whole batch; returns its mean loss. `optimizer` holds the master's parameters."""
    chunks = scatter(images, labels, devices)
    losses = []
    for replica, (x, y) in zip(replicas, chunks):
        # one replica after the other: GPU kernels are launched asynchronously, so the
        # devices still work at the same time (nn.DataParallel uses a thread per device)
        replica.zero_grad(set_to_none=True)
        loss = F.cross_entropy(replica(x), y)
        loss.backward()
        losses.append(loss.detach())
    sizes = [len(y) for _, y in chunks]
    reduce_gradients(master, replicas, sizes)
    optimizer.step()
    copy_weights(master, replicas)
    return sum(loss.item() * n for loss, n in zip(losses, sizes)) / sum(sizes)


def demo(devices, steps, batch_size, lr, seed=0):
    """Train the CNN with replicas on `devices` and on one device from the same start, on the
    same batches; print both losses and the largest weight difference. True if they agree."""
    from data import synthetic_cifar  # the course's offline data set and model
    from models import CNN

    torch.manual_seed(seed)
    master = CNN()
    single = copy.deepcopy(master)  # the baseline: the whole batch on the CPU
    replicas = replicate(master, devices)
    optimizer = torch.optim.SGD(master.parameters(), lr=lr, momentum=0.9)
    single_optimizer = torch.optim.SGD(single.parameters(), lr=lr, momentum=0.9)
    dp = None
    if len(devices) > 1 and all(torch.device(d).type == "cuda" for d in devices):
        dp = torch.nn.DataParallel(copy.deepcopy(master).to(devices[0]), device_ids=devices)
        dp_optimizer = torch.optim.SGD(dp.parameters(), lr=lr, momentum=0.9)
    train_set, _ = synthetic_cifar(num_train=steps * batch_size, num_test=1, seed=seed)
    images, labels = train_set.tensors
    print(f"{len(devices)} replicas on {devices}, global batch {batch_size}, {steps} steps")
    for step in range(steps):
        x, y = images[step * batch_size:(step + 1) * batch_size], labels[step * batch_size:(step + 1) * batch_size]
        loss = train_step(master, replicas, optimizer, x, y, devices)
        single_optimizer.zero_grad()
        single_loss = F.cross_entropy(single(x), y)
        single_loss.backward()
        single_optimizer.step()
        line = f"step {step + 1:3d}  replicas loss {loss:.6f}  one device {single_loss.item():.6f}"
        if dp is not None:
            dp_optimizer.zero_grad()
            dp_loss = F.cross_entropy(dp(x.to(devices[0])), y.to(devices[0]))
            dp_loss.backward()
            dp_optimizer.step()
            line += f"  nn.DataParallel {dp_loss.item():.6f}"
        print(line)
    differences = [(a - b).abs().max().item() for a, b in zip(master.parameters(), single.parameters())]
    print(f"largest difference between the master's weights and one device's: {max(differences):.2e}")
    return max(differences) < 1e-4


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="cpu,cpu",
                        help="comma-separated devices, one replica each; repeats allowed (default: cpu,cpu)")
    parser.add_argument("--steps", type=int, default=5, help="training steps (default: 5)")
    parser.add_argument("--batch-size", type=int, default=64, help="the whole batch, over all replicas (default: 64)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default: 0.05)")
    args = parser.parse_args()
    try:
        agree = demo(args.devices.split(","), args.steps, args.batch_size, args.lr)
    except (NotImplementedError, ValueError) as error:
        print(error)
        agree = False
    raise SystemExit(0 if agree else 1)
