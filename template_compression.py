"""Task 12: send fewer bytes: gradient compression hooks (bf16, fp16, PowerSGD) for DDP.

    python check.py 12                                                              # check your work
    torchrun --standalone --nproc_per_node=2 train_ddp.py --sync overlap --compress bf16
    torchrun --standalone --nproc_per_node=2 train_ddp.py --sync overlap --compress powersgd --powersgd-rank 2
    docs/task12-compression.md                                                      # the ideas, measured

Task 5 hid the all-reduce behind backward; this task shrinks what the all-reduce sends. A
communication hook replaces DDP's "divide the bucket by N, all-reduce it" with anything that
returns the same average, or an approximation of it:

    model = DDP(CNN(), bucket_size_mb=25)                       # Task 5's, or PyTorch's own
    model.register_comm_hook(None, bf16_compress_hook)          # 2 bytes an element instead of 4
    state = PowerSGDState(matrix_approximation_rank=2)          # or: a rank-2 approximation
    model.register_comm_hook(state, powersgd_hook)

The contract is PyTorch's (DistributedDataParallel.register_comm_hook): hook(state, bucket)
gets a bucket whose buffer() holds this rank's local, undivided gradients, flat, and whose
gradients() are views into that buffer, one per parameter; it returns a torch.futures.Future
whose value is the buffer AVERAGED over the ranks. The hooks below run unchanged on PyTorch's
DDP, and PyTorch's (torch.distributed.algorithms.ddp_comm_hooks) run unchanged on Task 5's.

Your tasks:

    Task 12.1  compress_hook     cast, divide by N, all-reduce, cast back (bf16 and fp16)
    Task 12.2  orthogonalize     Gram-Schmidt on the columns of a matrix, in place
    Task 12.3  powersgd_hook     a rank-r approximation of each gradient matrix, with error feedback

Simplified, compared with PyTorch's powerSGD_hook: no batching of same-shape tensors, Gram-Schmidt
at every rank r (PyTorch switches to a QR decomposition above r = 2: the same Q up to rounding and
signs), and the random first Qs are drawn per tensor in the bucket's order (PyTorch groups them by
shape first: the same draws where shapes differ, which is how the tests compare them), and every
all-reduce is started by the hook itself, not in a Future callback as PyTorch's does (on gloo with
several buckets, the ranks then order them differently and hang: measured, docs/task12-compression.md).
"""
import numpy as np
import torch
import torch.distributed as dist


# --------------------------------------------------------------------------- Task 12.1
def compress_hook(dtype, process_group, bucket):
    """Average the bucket over the ranks, sending it in `dtype` (torch.bfloat16 or torch.float16).

    process_group: the group to average over (None: every rank, dist.group.WORLD); N = its size.
    In PyTorch's order, which the tests compare with bit for bit:
      1. cast bucket.buffer() to dtype (a new tensor: .to(dtype)), then divide it by N in that
         dtype, BEFORE the sum: fp16 holds at most 65504, and the sum of N gradients can pass it
         where their mean does not;
      2. start dist.all_reduce of the compressed tensor (SUM, group=process_group, async_op=True);
      3. return work.get_future().then(decompress), where decompress copies the reduced tensor
         back into bucket.buffer() (copy_ casts it to the buffer's dtype) and returns the buffer.
    Every rank all-reduces every bucket, also one of zeros (the others wait for it).
    Never wait here: returning the future lets backward go on while the bucket travels. A
    Future completed by hand before the all-reduce has finished would hand DDP numbers that
    are not summed yet.
    """
    # --- Task 12.1 begin ---
    # TODO Task 12.1: cast, divide by N in the compressed dtype, all-reduce asynchronously, cast back in a .then callback
    raise NotImplementedError("Task 12.1: compress_hook() in template_compression.py is not done yet (docs/task12-compression.md)")
    # --- Task 12.1 end ---


def bf16_compress_hook(process_group, bucket):
    """PyTorch's default_hooks.bf16_compress_hook: the bucket travels in bfloat16 (2 bytes)."""
    return compress_hook(torch.bfloat16, process_group, bucket)


def fp16_compress_hook(process_group, bucket):
    """PyTorch's default_hooks.fp16_compress_hook: the bucket travels in float16 (2 bytes)."""
    return compress_hook(torch.float16, process_group, bucket)


# --------------------------------------------------------------------------- PowerSGD
class PowerSGDState:
    """What PowerSGD keeps between steps, per bucket (keyed by bucket.index()), with the names of
    PyTorch's powerSGD_hook.PowerSGDState:

      error_dict[index]     the error-feedback residual: what compression left out last time
      q_memory_dict[index]  the Qs of the bucket's compressed tensors, flat: the warm start
      p_memory_dict[index]  the Ps, flat (one all-reduce sends all of a bucket's Ps)
      rng                   numpy's RandomState(random_seed): the seeds of the first Qs, the
                            same on every rank, so every rank draws the same Qs
      iter                  steps done; before start_powerSGD_iter, buckets are plain averages
      total_numel_before_compression, total_numel_after_compression   what compression_stats() reports
    """

    def __init__(self, process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0):
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            # DDP's first step is special (PyTorch rebuilds its buckets after it): PyTorch refuses too
            raise ValueError("PowerSGDState: start_powerSGD_iter must be > 1 with use_error_feedback or "
                             f"warm_start (got {start_powerSGD_iter}): compression can start at step 2 at the earliest")
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.rng = np.random.RandomState(random_seed)
        self.error_dict, self.p_memory_dict, self.q_memory_dict = {}, {}, {}
        self.iter = 0
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0

    def maybe_increase_iter(self, bucket):
        """A step ends with its last bucket."""
        if bucket.is_last():
            self.iter += 1

    def compression_stats(self):
        """(rate, numbers before compression, numbers sent), counted over every compressed step."""
        before, after = self.total_numel_before_compression, self.total_numel_after_compression
        return (before / after if after > 0 else 0, before, after)


def allreduce_mean(process_group, tensor):
    """The plain hook: divide by N, all-reduce; the Future's value is the averaged tensor."""
    group = process_group if process_group is not None else dist.group.WORLD
    tensor.div_(group.size())
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda future: future.value()[0])


# --------------------------------------------------------------------------- Task 12.2
def orthogonalize(matrix, epsilon=0):
    """Make the columns of `matrix` (n x r, r <= n) orthonormal, in place, by Gram-Schmidt.

    For each column i in order: divide it by its norm (torch.linalg.vector_norm; plus epsilon
    when epsilon > 0, which keeps an all-zero column finite), then subtract from every LATER
    column its component along column i (col_j -= (col_i . col_j) col_i). Work in place on
    views of `matrix` (matrix[:, i:i + 1]): PowerSGD's Ps and Qs are views into one flat
    buffer per bucket, which is what gets all-reduced. PyTorch's _orthogonalize_gram_schmidt
    does the same, batched.
    """
    # --- Task 12.2 begin ---
    # TODO Task 12.2: Gram-Schmidt: normalise each column, remove it from the later ones, in place
    raise NotImplementedError("Task 12.2: orthogonalize() in template_compression.py is not done yet (docs/task12-compression.md)")
    # --- Task 12.2 end ---


# --------------------------------------------------------------------------- Task 12.3
def powersgd_hook(state, bucket):
    """Average the bucket over the ranks, each large gradient sent as a rank-r approximation.

    Before state.start_powerSGD_iter: state.maybe_increase_iter(bucket), then return
    allreduce_mean(group, bucket.buffer()), the plain average. From then on (N = group size,
    group = state.process_group or dist.group.WORLD, i = bucket.index()):

    1. Error feedback (state.use_error_feedback): add state.error_dict[i] to bucket.buffer() in
       place (a zero residual the first time), and keep a copy of the buffer: "what we wanted
       to send".
    2. Sort bucket.gradients() (views into the buffer) into matrices to compress and tensors to
       send whole: view each as (shape[0], -1), n x m, with r = min(n, m, rank); compress it
       only when n * m > r * (n + m) * state.min_compression_rate (a 1-D tensor, n x 1, never
       is). Count n * m into state.total_numel_before_compression and what is sent (r * (n + m),
       or n * m) into state.total_numel_after_compression.
    3. The Ps and Qs of the bucket live in two flat buffers, state.p_memory_dict[i] (sum of
       n * r) and state.q_memory_dict[i] (sum of m * r); each matrix's P (n x r) and Q (m x r)
       are views into them, in the order of the matrices. New buffers (torch.empty) when
       there are none yet for i, or without state.warm_start; then draw the first Qs as
       PyTorch does: with torch.random.fork_rng(devices=[]), torch.manual_seed(
       state.rng.randint(1_000_000_000)), then for each Q in order q.copy_(torch.randn(m, r,
       dtype=dtype)) (on the CPU), so every rank draws the same Qs. With a warm start, the Qs
       are last step's averaged Qs. Either way, orthogonalize(q, state.orthogonalization_epsilon).
    4. P = M Q for each matrix (torch.matmul(matrix, q, out=p)). Then, in this order:
       - if any, the tensors sent whole: concatenated flat, all-reduced (blocking), divided by N,
         copied back into their views;
       - all-reduce the P buffer (blocking; the SUM, as PyTorch's hook: orthogonalizing P next
         removes the factor N, so a P divided by N here gives the same Ps at the default
         orthogonalization_epsilon=0, and is accepted);
       - orthogonalize each P; Q = M^T P for each matrix (torch.matmul(matrix.T, p, out=q));
       - start the all-reduce of the Q buffer (async_op=True) and return
         work.get_future().then(decompress).
       Start every all-reduce here, never inside a .then callback: a callback runs on the
       communication thread, and the ranks would then order it differently against the next
       bucket's all-reduces (a hang).
    5. decompress: divide the Q buffer by N; M' = P Q^T approximates the average: write it into
       the matrix (torch.matmul(p, q.T, out=matrix)), through the views into the buffer. Error
       feedback: state.error_dict[i] = the copy of step 1 minus the buffer now. Without
       state.warm_start, forget this bucket's P and Q buffers, and only these (del
       state.p_memory_dict[i] and state.q_memory_dict[i]): the other buckets' all-reduces may
       still be in flight, and their decompress reads theirs; new Qs are drawn next step. Then
       state.maybe_increase_iter(bucket), and return bucket.buffer().

    state.iter counts the steps: state.maybe_increase_iter(bucket) once per call, on either path,
    AFTER the comparison with start_powerSGD_iter (it raises the count at a step's last bucket).
    On the compressed path PyTorch's hook calls it at the end, in decompress; calling it right
    after the comparison instead is the same (the count is read only when the next step begins)
    and is accepted. Before the comparison, the last bucket of step start_powerSGD_iter - 1 would
    already be compressed.
    """
    # --- Task 12.3 begin ---
    # TODO Task 12.3: PowerSGD: error feedback, P = MQ, all-reduce P, orthogonalise, Q = M^T P, all-reduce Q, M' = PQ^T
    raise NotImplementedError("Task 12.3: powersgd_hook() in template_compression.py is not done yet (docs/task12-compression.md)")
    # --- Task 12.3 end ---
