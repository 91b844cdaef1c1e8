"""Task 13: communicate less often: parameter averaging, local SGD and DiLoCo.

    python check.py 13                                                    # check your work
    torchrun --standalone --nproc_per_node=2 train_ddp.py --local-sgd 16  # average every 16 steps
    torchrun --standalone --nproc_per_node=2 train_ddp.py --diloco 16     # DiLoCo, AdamW inside
    docs/task13-local-sgd.md                                              # the ideas, measured

Data parallelism (Tasks 2 and 5) averages the gradients at every step: the whole model crosses
the network once a step. Averaging the PARAMETERS instead, after each rank stepped on its own
gradient, gives exactly the same model whenever the optimizer's update is linear in the
gradients (SGD, momentum, Nesterov, coupled weight decay), and something else for Adam(W),
whose update divides by a square root. Averaging only every H steps (local SGD) sends H times
less, and the ranks drift apart between the averages. DiLoCo (Douillard et al. 2023) takes
the averaged change of those H steps as a gradient for an outer optimizer (SGD with Nesterov
momentum), with AdamW inside.

    Task 13.1  all_reduce_mean, average_parameters  the mean over the group, one all-reduce per dtype
    Task 13.2  LocalSGD.step   the inner step; after every sync_every-th step, the parameters averaged
    Task 13.3  DiLoCo.step     the inner step; after every sync_every-th, an outer step on the averaged change

Used like an optimizer: the caller starts every rank from the same parameters (Task 2.1's
broadcast), runs zero_grad() and loss.backward(), then step(). Nothing averages the gradients:
    local_sgd = LocalSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=16)
    local_sgd.zero_grad(); loss.backward(); local_sgd.step()
The references: torch.distributed.algorithms.model_averaging (PeriodicModelAverager, which
counts differently, see LocalSGD) and torchft.local_sgd (LocalSGD, DiLoCo). Simplified: no
fault tolerance (torchft's Manager), no streaming of fragments, no overlap of the all-reduce.
"""
import torch
import torch.distributed as dist


def all_reduce_mean(tensors, group=None):
    """Replace every tensor by its mean over the ranks of `group`, in place, with as few collectives as possible.

    tensors: a list of tensors, the same shapes and dtypes in the same order on every rank of the
    group. group: a process group (dist.new_group), or None for every rank.
    As in Task 5.2, flatten the tensors into one buffer (torch.cat of their .reshape(-1)), all-reduce
    that buffer once with SUM, divide it by the GROUP's size (dist.get_world_size(group): not the
    world's), and copy each slice back into its tensor. torch.cat cannot mix dtypes without
    converting them, so make one buffer per dtype: one all-reduce per dtype, in the order the dtypes
    first appear in `tensors` (the same order on every rank, or the all-reduces would not match).
    Every rank of the group ends with bit-identical tensors. Sends nothing if `tensors` is empty.
    """
    # --- Task 13.1 begin ---
    # TODO Task 13.1: flatten into one buffer per dtype, all_reduce (SUM) over the group, divide by the group's size, copy back
    raise NotImplementedError("Task 13.1: all_reduce_mean() in template_local_sgd.py is not done yet (docs/task13-local-sgd.md)")
    # --- Task 13.1 end ---


def average_parameters(model, group=None):
    """Replace every parameter of `model`, and every floating-point buffer, by its mean over `group`, in place.

    Every parameter (frozen ones too), then every floating-point buffer (BatchNorm's running_mean and
    running_var: each rank's statistics of its own data), in the order model.parameters() and
    model.buffers() give them, averaged with all_reduce_mean: one all-reduce for a model of one dtype.
    Integer buffers (BatchNorm's num_batches_tracked, a count) are left as they are: their mean would
    not be an integer. A collective: every rank of the group calls it.
    """
    # --- Task 13.1 begin ---
    # TODO Task 13.1: the parameters and the floating-point buffers, averaged with all_reduce_mean
    raise NotImplementedError("Task 13.1: average_parameters() in template_local_sgd.py is not done yet (docs/task13-local-sgd.md)")
    # --- Task 13.1 end ---


class LocalSGD:
    """Local SGD: every rank steps its own optimizer on its own gradients; every sync_every steps the
    parameters (and floating-point buffers) are averaged over the group.

        LocalSGD(model, optimizer, sync_every, group=None)

    model: this rank's replica, the same parameters on every rank at the start. optimizer: any
    optimizer over its parameters (the inner one; its state stays this rank's own). sync_every: H,
    how many steps between two averages (1: after every step). group: the ranks that average
    together, None for all. The constructor sends nothing.

    Averaging after every step equals averaging the gradients for SGD, momentum, Nesterov and
    coupled weight decay (the update is linear in the gradients), not for Adam(W).
    PyTorch's PeriodicModelAverager(period=H) averages at its very first call, then every H calls:
    after steps 1, H + 1, 2H + 1, ... Here the average comes after steps H, 2H, 3H, ...: the
    averager does the same with warmup_steps=H - 1.
    """

    def __init__(self, model, optimizer, sync_every, group=None):
        if not (isinstance(sync_every, int) and sync_every >= 1):
            raise ValueError(f"sync_every must be a whole number of steps, at least 1; got {sync_every!r}")
        self.model = model
        self.optimizer = optimizer
        self.sync_every = sync_every
        self.group = group
        self.local_step = 0  # steps since the last average

    @property
    def param_groups(self):
        """The inner optimizer's (a learning-rate schedule changes them there)."""
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """The inner optimizer's step (with the closure, if any; returns its loss); then, if this was
        the sync_every-th step since the last average, average_parameters over the group.

        Counts its own steps in self.local_step (0 after an average) and averages once that count
        is sync_every OR MORE (>=, not ==): sync_every may be lowered in the middle of a round, below
        the steps already counted (train_ddp.py lowers it for one step to end a round at an epoch's
        end; a schedule may shorten the rounds), and the average then comes at this step.
        Sends nothing between two averages: no gradient is averaged, ever. Every rank of the group ends an average with
        bit-identical parameters.
        """
        # --- Task 13.2 begin ---
        # TODO Task 13.2: the inner step; count it; after the sync_every-th, average_parameters and start counting again
        raise NotImplementedError("Task 13.2: LocalSGD.step() in template_local_sgd.py is not done yet (docs/task13-local-sgd.md)")
        # --- Task 13.2 end ---


class DiLoCo:
    """DiLoCo: H inner steps on each rank, then one outer step, taken by every rank alike, on the
    averaged change of those H steps.

        DiLoCo(model, inner_optimizer, sync_every, outer_lr=0.7, outer_momentum=0.9, group=None)

    inner_optimizer: this rank's optimizer over the model's parameters (AdamW in the paper); its
    state stays this rank's own, never averaged, never reset. sync_every: H. The outer optimizer is
    torch.optim.SGD(parameters, lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0),
    built here once: its momentum carries over from round to round (OpenDiLoCo's 0.7 and 0.9 are
    the defaults). With H = 1, outer_lr = 1 and outer_momentum = 0 it is plain parameter averaging.
    The constructor sends nothing: every rank must start from the same parameters (Task 2.1).

    self.synced holds the parameters of the last synchronisation (at first, the starting ones), on
    the CPU: a GPU's memory is for training. Floating-point buffers (BatchNorm's statistics) have no
    outer step: they are averaged, in the same all-reduce. Behaves as torchft.local_sgd.DiLoCo
    with one fragment (torchft leaves the buffers alone).
    """

    def __init__(self, model, inner_optimizer, sync_every, outer_lr=0.7, outer_momentum=0.9, group=None):
        if not (isinstance(sync_every, int) and sync_every >= 1):
            raise ValueError(f"sync_every must be a whole number of steps, at least 1; got {sync_every!r}")
        self.model = model
        self.inner_optimizer = inner_optimizer
        self.sync_every = sync_every
        self.group = group
        self.local_step = 0  # inner steps since the last outer step
        self.params = list(model.parameters())
        self.synced = [param.detach().to("cpu", copy=True) for param in self.params]
        self.outer_optimizer = torch.optim.SGD(self.params, lr=outer_lr, momentum=outer_momentum,
                                               nesterov=outer_momentum > 0)

    @property
    def param_groups(self):
        """The inner optimizer's (a learning-rate schedule changes them there)."""
        return self.inner_optimizer.param_groups

    def zero_grad(self, set_to_none=True):
        self.inner_optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """The inner optimizer's step (returns the closure's loss, if any); after every sync_every-th
        inner step, the outer step:

        1. The pseudo-gradient of each parameter: synced - param (where this rank started the round,
           minus where it is now: the direction of a gradient, uphill), as param.grad, on the
           parameter's device.
        2. Averaged over the group in one all-reduce (all_reduce_mean), together with the
           floating-point buffers (averaged as they are).
        3. Each parameter set back to its synced value: the outer step starts from there, not from
           the average.
        4. self.outer_optimizer.step(), then its zero_grad() (the pseudo-gradients are not the next
           inner step's gradients): every .grad None again, as zero_grad's default (set_to_none) leaves
           it, so that a parameter the next round gives no gradient is skipped by the inner optimizer
           even in a loop that zeroes with set_to_none=False (a stale pseudo-gradient, or zeros, would
           be stepped: AdamW's weight decay moves a parameter even at a zero gradient).
        5. The result is the new synced value: copy each parameter into self.synced.
        Counts the inner steps in self.local_step (0 after an outer step); the outer step comes once
        that count is self.sync_every or more (>=), as LocalSGD's average does. Sends nothing between two outer steps. Every rank ends the outer step bit-identical.
        """
        # --- Task 13.3 begin ---
        # TODO Task 13.3: the inner step; after the sync_every-th: pseudo-gradients, one all-reduce, back to synced, outer step, new synced
        raise NotImplementedError("Task 13.3: DiLoCo.step() in template_local_sgd.py is not done yet (docs/task13-local-sgd.md)")
        # --- Task 13.3 end ---
