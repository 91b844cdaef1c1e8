"""Task 3: all-reduce by hand, from dist.send and dist.recv.

    python check.py 3                                                       # check your work (one task: 3.2)
    torchrun --standalone --nproc_per_node=2 train_ddp.py --allreduce ring  # train with yours
    torchrun --standalone --nproc_per_node=4 benchmarks/allreduce_bench.py  # what each costs

Both functions do what dist.all_reduce(tensor) does: every rank passes its own tensor,
and afterwards every rank's tensor holds the element-wise SUM over all ranks, in place.
They differ in who sends what to whom. With N ranks and a tensor of S bytes:

    Task 3.1  naive_all_reduce  everything goes through rank 0. Rank 0 receives N-1
              tensors, adds them up and sends the sum N-1 times: 2(N-1)S bytes through
              one rank, which grows with N.
    Task 3.2  ring_all_reduce   the ranks form a ring and each passes chunks of S/N bytes
              to its right neighbour: 2(N-1) steps, 2(N-1)/N * S bytes sent by every
              rank, less than 2S however many ranks there are.

Use only point-to-point calls (dist.send, dist.recv, dist.isend, dist.irecv,
dist.batch_isend_irecv): dist.all_reduce is what you are rebuilding, and the tests
count the bytes each rank sends. Wait for every Work that isend, irecv or
batch_isend_irecv returns before the function returns: a send whose Work is dropped
unwaited may never leave, and an irecv's buffer holds nothing until its Work completes.
"""
import torch
import torch.distributed as dist


def naive_all_reduce(tensor):
    """Sum `tensor` over all ranks, in place, through rank 0 (the seed's central pattern).

    Every other rank sends its tensor to rank 0 and receives the sum back into it. Rank 0
    receives the N-1 tensors one by one into a buffer on the tensor's device, adds each
    to a running total held on the CPU (GPU -> CPU, as the seed's master copy does),
    copies the total into its own tensor (CPU -> GPU) and sends it to every other rank.
    Works for any shape, float and integer dtypes, and a world of one (nothing to do).
    """
    # --- Task 3.1 begin ---
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total = tensor.to("cpu", copy=True)  # copy: on the CPU .to() would return tensor itself
        received = torch.empty_like(tensor)  # on tensor's device: NCCL only moves GPU tensors
        for src in range(1, world_size):
            dist.recv(received, src=src)
            total += received.cpu()
        tensor.copy_(total)
    else:
        dist.send(tensor, dst=0)
    # the way back: rank 0 sends the whole sum once to every other rank
    if rank == 0:
        for dst in range(1, world_size):
            dist.send(tensor, dst=dst)
    else:
        dist.recv(tensor, src=0)
    # --- Task 3.1 end ---


def exchange(send_buffer, recv_buffer, right, left):
    """Send send_buffer to rank `right` while receiving recv_buffer from rank `left`.

    Both are posted together with batch_isend_irecv. Had every rank first called a
    blocking dist.send, all of them would wait for a receiver at once: a deadlock, on
    gloo as on NCCL, whose sends both wait for the matching receive.
    """
    ops = [dist.P2POp(dist.isend, send_buffer, right), dist.P2POp(dist.irecv, recv_buffer, left)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()


def ring_all_reduce(tensor):
    """Sum `tensor` over all ranks, in place, with the bandwidth-optimal ring.

    View the tensor as one flat row of numbers and cut it into world_size chunks with
    tensor_split (lengths differ by at most one; some are empty when there are fewer
    numbers than ranks). Rank r sends to right = (r + 1) % N and receives from
    left = (r - 1) % N, one exchange() per step.

    Reduce-scatter, N-1 steps: at step s, rank r sends chunk (r - s) % N and adds what
    it receives into chunk (r - s - 1) % N. Each chunk travels once around the ring and
    collects every rank's contribution, so rank r ends holding the full sum of chunk
    (r + 1) % N.
    All-gather, N-1 steps: at step s, rank r sends chunk (r + 1 - s) % N and overwrites
    chunk (r - s) % N with what it receives, so the finished chunks travel around too.

    Every rank sends 2(N-1) chunks, 2(N-1)/N of the tensor. The tensor must be
    contiguous, as for dist.all_reduce. Works for any length, float and integer dtypes,
    and a world of one (nothing to do).
    """
    # --- Task 3.2 begin ---
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    chunks = tensor.view(-1).tensor_split(world_size)  # views: writing a chunk writes the tensor
    # One receive buffer, kept between calls and grown when needed (chunk 0 is the longest).
    # A new buffer of 32 MB or more comes straight from mmap and page-faults on first use:
    # that made the ring 1.7x slower than gloo's own at 64 MB on 2 ranks (benchmarks/).
    buffers = ring_all_reduce.__dict__.setdefault("receive_buffers", {})
    key = (tensor.dtype, tensor.device)
    if key not in buffers or buffers[key].numel() < chunks[0].numel():
        buffers[key] = torch.empty_like(chunks[0])
    received = buffers[key]
    for step in range(world_size - 1):  # reduce-scatter
        send_index, recv_index = (rank - step) % world_size, (rank - step - 1) % world_size
        incoming = received[: chunks[recv_index].numel()]
        exchange(chunks[send_index], incoming, right, left)
        chunks[recv_index].add_(incoming)
    for step in range(world_size - 1):  # all-gather: receive straight into the chunk
        send_index, recv_index = (rank + 1 - step) % world_size, (rank - step) % world_size
        exchange(chunks[send_index], chunks[recv_index], right, left)
    # --- Task 3.2 end ---
