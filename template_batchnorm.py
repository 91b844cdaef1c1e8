"""Task 11: BatchNorm across ranks: SyncBatchNorm from scratch.

    python check.py 11                                                    # check your work
    torchrun --standalone --nproc_per_node=2 train_ddp.py --batchnorm sync   # train with it
    docs/task11-batchnorm.md                                              # the ideas, measured

Almost every layer treats the samples of a batch independently, so data parallelism can cut
the batch into slices and still compute what one process computes on the whole batch.
BatchNorm is the exception: in training it normalises each channel with the mean and the
variance of the BATCH. Plain nn.BatchNorm under data parallelism uses the statistics of its
rank's slice only: a different model from single-process training, and running statistics
that drift apart between ranks. SyncBatchNorm computes the statistics of the global batch
(every rank's slice together) with one collective in forward, and gets the input gradient
right with one more in backward.

    model = convert_sync_batchnorm(model)   # every nn.BatchNorm1d/2d/3d becomes a SyncBatchNorm
    loss.backward(); average_gradients(model)   # Task 2.2 (or DDP): as for any other model

    Task 11.1  global_batch_stats       mean, biased variance and count of the global batch, one collective
    Task 11.2  SyncBatchNormFunction    normalise; backward: the input gradient with one collective
    Task 11.3  SyncBatchNorm            running statistics, eval mode; convert_sync_batchnorm

As PyTorch's torch.nn.SyncBatchNorm, which runs on GPUs only (on a CPU it raises "SyncBatchNorm
expected input tensor to be on GPU"): this one runs on gloo too. Simplified: plain per-channel
arithmetic instead of fused kernels, and no channels_last special case.
"""
import torch
import torch.distributed as dist
from torch import nn


def _reduce_dims(x):
    """The dimensions a BatchNorm reduces over: every one but the channels (dim 1)."""
    return [0] + list(range(2, x.dim()))


def _per_channel(values, x):
    """A per-channel vector (C,) shaped to broadcast against x (N, C, ...): (1, C, 1, ...)."""
    return values.view([1, -1] + [1] * (x.dim() - 2))


# ----------------------------------------------------------------------------- Task 11.1
def global_batch_stats(x, group=None):
    """The per-channel statistics of the GLOBAL batch: every rank's slice of it together.

    x: this rank's slice, shape (N, C, ...) (N may differ between ranks, and may be 0).
    group: the process group whose ranks hold the slices (None: the default group).
    Returns (mean, var, count): mean and var are (C,) tensors in x's dtype, the mean and the
    BIASED variance (divided by count, as BatchNorm normalises with) of each channel over all
    the elements of all the ranks' slices; count is the global number of elements per channel
    (the sum over the ranks of N * H * W ...), an int or a tensor.

    - ONE collective. Every rank, also one whose slice is empty, must call it (a rank that
      skips it leaves the others waiting forever).
    - The count is summed, never assumed: slices may differ in size, so the ranks' means cannot
      simply be averaged; and the variance of the whole is not the mean of the ranks'
      variances (that forgets how far each rank's mean lies from the global mean).
    - Numerically stable: in float32, E[x^2] - E[x]^2 loses the variance when the mean is far
      from zero (relative error 0.065, up to 0.27, at mean 1000 and variance 1: measured in
      docs/task11-batchnorm.md). Either all-gather each rank's (count, mean, M2 = sum of
      squared deviations) and combine them with the parallel-variance formula (PyTorch's way),
      or all-reduce packed sums in float64, where that cancellation costs about
      1e-16 * mean^2 / var: 1e-10 at mean 1000.
    """
    # --- Task 11.1 begin ---
    # TODO Task 11.1: this rank's count, mean and squared deviations; one collective (empty slices too); the global mean, biased variance, count
    raise NotImplementedError("Task 11.1: global_batch_stats() in template_batchnorm.py is not done yet (docs/task11-batchnorm.md)")
    # --- Task 11.1 end ---


# ----------------------------------------------------------------------------- Task 11.2
class SyncBatchNormFunction(torch.autograd.Function):
    """Normalise x with given global statistics; backward: the input gradient of the global batch.

        y = SyncBatchNormFunction.apply(x, weight, bias, mean, var, count, eps, group)

    x: this rank's slice (N, C, ...); weight, bias: (C,) or None (affine=False), either of them
    possibly frozen (requires_grad=False: it still scales or shifts, and gets no gradient); mean,
    var, count: global_batch_stats(x.detach(), group); eps: added to var; group: as there.

    forward: y = (x - mean) / sqrt(var + eps) * weight + bias, per channel (x_hat is the part
    before * weight). Write it out: no PyTorch BatchNorm function (not F.batch_norm, not
    torch.batch_norm_*), as the tests check.

    backward(grad_y): the mean and the variance depend on every rank's x, so the gradient of
    one rank's x involves every rank's grad_y. With dy = grad_y and x_hat as above, per channel:

        dx = weight / sqrt(var + eps) * (dy - sum(dy) / count - x_hat * sum(dy * x_hat) / count)

    where the two sums run over the GLOBAL batch: sum this rank's, then ONE all-reduce (SUM) of
    both packed together. Not of dy itself: the ranks' dy belong to different samples.
    The weight and bias gradients, sum(dy * x_hat) and sum(dy), stay THIS rank's sums (before
    the all-reduce): data parallelism averages them over the ranks like any other gradient
    (Task 2.2, DDP); summed here as well, they would come out world_size times too large.
    Return one gradient per input of forward (None for those without; ctx.needs_input_grad[i]
    says whether input i needs one).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, mean, var, count, eps, group):
        # --- Task 11.2 begin ---
        # TODO Task 11.2: y = (x - mean) / sqrt(var + eps) * weight + bias; keep what backward needs in ctx
        raise NotImplementedError("Task 11.2: SyncBatchNormFunction.forward() in template_batchnorm.py is not done yet (docs/task11-batchnorm.md)")
        # --- Task 11.2 end ---

    @staticmethod
    def backward(ctx, grad_y):
        # --- Task 11.2 begin ---
        # TODO Task 11.2: one all-reduce of the packed sums of dy and dy * x_hat; dx with the global count; weight and bias grads local
        raise NotImplementedError("Task 11.2: SyncBatchNormFunction.backward() in template_batchnorm.py is not done yet (docs/task11-batchnorm.md)")
        # --- Task 11.2 end ---


# ----------------------------------------------------------------------------- Task 11.3
class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A drop-in for nn.BatchNorm1d/2d/3d that normalises with the statistics of the global batch.

        SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                      process_group=None)

    The same attributes as nn.BatchNorm (weight, bias, running_mean, running_var,
    num_batches_tracked; built by nn.BatchNorm's own base class), plus process_group: the ranks
    whose slices form the global batch (None: every rank). Takes (N, C, ...) inputs of any
    number of dimensions from 2. A frozen weight or bias (requires_grad=False, as in
    fine-tuning) still scales and shifts, in training and in eval; it only gets no gradient,
    as in nn.BatchNorm.

    forward(x), in training (self.training), or in eval without running statistics:
    - training: mean, var, count = global_batch_stats (11.1), and y = SyncBatchNormFunction
      (11.2). With track_running_stats, num_batches_tracked += 1, then
          running_mean = (1 - m) * running_mean + m * mean
          running_var  = (1 - m) * running_var  + m * var * count / (count - 1)
      with m = momentum, or 1 / num_batches_tracked if momentum is None (a cumulative average):
      the UNBIASED variance with the GLOBAL count, as nn.BatchNorm does on the whole batch, so
      every rank's running statistics are the same.
    - eval with running statistics: normalise with running_mean and running_var (then weight
      and bias); send nothing, change nothing.
    - eval without running statistics (track_running_stats=False): as nn.BatchNorm and PyTorch's
      SyncBatchNorm, this batch's own statistics, computed from x itself: they stay in the graph,
      so the input gradient flows through them too, as nn.BatchNorm's does; send nothing.
    Keep nothing of x on the layer: what backward needs, the Function saves, and autograd frees
    it with the graph (an attribute holding x would keep a whole activation alive per layer).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects an (N, C, ...) input of at least 2 dimensions, got {x.dim()}")

    def forward(self, x):
        self._check_input_dim(x)
        # --- Task 11.3 begin ---
        # TODO Task 11.3: training: global statistics, running statistics (unbiased, global count), the Function; eval: nothing sent
        raise NotImplementedError("Task 11.3: SyncBatchNorm.forward() in template_batchnorm.py is not done yet (docs/task11-batchnorm.md)")
        # --- Task 11.3 end ---

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """Replace every BatchNorm in module (nn.BatchNorm1d/2d/3d: any nn.modules.batchnorm._BatchNorm),
        also module itself, by a SyncBatchNorm with the same settings and process_group.

        As torch.nn.SyncBatchNorm.convert_sync_batchnorm: the new layer takes over the old one's
        weight and bias (the same Parameter objects, so an optimizer built before still updates
        them), running_mean, running_var, num_batches_tracked and training mode. Every other
        module stays as it is. Returns the converted module (a new object where module itself
        was a BatchNorm, else module, changed in place).
        """
        # --- Task 11.3 begin ---
        # TODO Task 11.3: replace every _BatchNorm by cls(...), carrying weight, bias, buffers and training mode; recurse into the children
        raise NotImplementedError("Task 11.3: SyncBatchNorm.convert_sync_batchnorm() in template_batchnorm.py is not done yet (docs/task11-batchnorm.md)")
        # --- Task 11.3 end ---


def convert_sync_batchnorm(module, process_group=None):
    """SyncBatchNorm.convert_sync_batchnorm(module, process_group), as a function."""
    return SyncBatchNorm.convert_sync_batchnorm(module, process_group)
