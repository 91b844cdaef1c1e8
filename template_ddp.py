"""Task 5: DistributedDataParallel from scratch: buckets, overlap, gradient accumulation.

    python check.py 5                                                               # check your work
    torchrun --standalone --nproc_per_node=2 train_ddp.py --sync overlap            # train with it
    torchrun --standalone --nproc_per_node=2 train_ddp.py --sync overlap --accumulate 4
    docs/task5-ddp.md                                                               # the ideas, measured

Task 2.2 averages every gradient after backward, one blocking all_reduce per parameter:
the network idles while backward runs, and backward idles while the network runs. PyTorch's
DistributedDataParallel does two things instead, and so does the DDP class below:

  buckets   gradients travel in a few large flat buffers, not one message per parameter:
            every all_reduce pays a fixed latency, so fewer, larger messages cost less.
  overlap   backward produces gradients from the last layer to the first; as soon as every
            gradient of a bucket is ready, its all_reduce starts (async_op=True) while
            backward goes on computing the earlier layers' gradients.

It is used as PyTorch's is:

    model = DDP(CNN().to(device), bucket_size_mb=25)   # broadcasts rank 0's parameters and buffers
    loss = F.cross_entropy(model(images), labels)       # forward: the wrapped module's output
    loss.backward()                                     # buckets are all-reduced WHILE backward runs
    model.finish_gradient_synchronization()             # wait for the last bucket; .grad = the mean
    optimizer.step()
    with model.no_sync():                               # gradient accumulation: no communication,
        F.cross_entropy(model(x1), y1).backward()       # gradients add up locally

Your tasks:

    Task 5.1  build_buckets          which parameters travel together, in backward's order
    Task 5.2  launch_all_reduce      one bucket's gradients, flattened, all-reduced asynchronously
    Task 5.3  DDP._register_hooks    launch each bucket from a hook, as soon as it is complete
    Task 5.4  DDP.finish_gradient_synchronization   wait, and copy the means back into .grad
    Task 5.5  DDP.no_sync            accumulate locally, communicate once

Task 12 (template_compression.py) plugs in here: model.register_comm_hook(state, hook) makes every
bucket travel through hook(state, bucket) instead of Task 5.2's all_reduce, with PyTorch's
contract, so PyTorch's own hooks (torch.distributed.algorithms.ddp_comm_hooks) run on it too.

Simplified, compared with torch.nn.parallel.DistributedDataParallel: buffers are broadcast once
at the start, not before every forward; a parameter that no rank used gets a zero gradient
where PyTorch leaves it None (the same for SGD or Adam without weight decay); no gradient
buffers shared with .grad (PyTorch's gradient_as_bucket_view); and you call
finish_gradient_synchronization() yourself, where PyTorch hides the wait inside backward.
"""
import contextlib

import torch
import torch.distributed as dist
from torch import nn

from support.comm_hooks import launch_comm_hook  # Task 12's path: given code


def build_buckets(parameters, bucket_size_mb=25.0):
    """Group the parameters that need gradients into buckets. Returns a list of lists of parameters.

    parameters: a list, usually list(module.parameters()); the same Parameter may occur more
    than once (tied weights, as named_parameters(remove_duplicate=False) lists them): it goes
    into one bucket only, at its FIRST occurrence, as module.parameters() lists it.
    Parameters with requires_grad=False get no gradient and go into no bucket.

    Buckets follow the REVERSE order of `parameters`, the order in which backward produces
    the gradients: the first bucket holds the last parameters. Walk that order and add each
    parameter to the current bucket; start a new bucket first when the current one is not
    empty and adding the parameter would take it over bucket_size_mb megabytes
    (1 MB = 2**20 bytes, as PyTorch's bucket_cap_mb; a parameter's bytes are
    numel() * element_size()), or when its dtype or device differs from the current
    bucket's (one flat buffer holds one dtype on one device). So a parameter larger than a
    bucket gets a bucket of its own. bucket_size_mb=None (or 0): one bucket per parameter.

    Every rank computes the same buckets from the same model: the order depends only on
    the order of `parameters`, never on ids, hashes or sets.
    """
    # --- Task 5.1 begin ---
    # TODO Task 5.1: group the parameters into buckets of at most bucket_size_mb, in reverse order, tied weights once
    raise NotImplementedError("Task 5.1: build_buckets() in template_ddp.py is not done yet (docs/task5-ddp.md)")
    # --- Task 5.1 end ---


class Bucket:
    """Parameters whose gradients travel together, in one flat buffer and one all_reduce."""

    def __init__(self, params):
        self.params = params  # in backward's order
        self.num_ready = 0  # how many of params have their gradient for this step
        self.buffer = None  # the flat gradients while they travel
        self.handle = None  # what dist.all_reduce(..., async_op=True) returned
        self.comm_hook = None  # (state, hook, index, is_last) from DDP.register_comm_hook (Task 12)


def launch_all_reduce(bucket):
    """Start averaging the bucket's gradients over all ranks, and return without waiting.

    Flatten the gradients (param.grad, never the parameter itself) of bucket.params, in that
    order, into one new 1-D tensor bucket.buffer (torch.cat of the flattened gradients); a
    parameter whose .grad is None (unused in this forward) contributes zeros of its size, so
    every rank's buffer has the same length. Divide the buffer by the world size BEFORE the
    sum, as PyTorch's DDP does: in float16 the sum of N gradients can overflow where their
    mean would not. Then start dist.all_reduce(bucket.buffer, op=SUM, async_op=True) and keep
    its handle in bucket.handle. Do not wait: the point is to let backward go on while the
    buffer travels. Whoever needs the result calls bucket.handle.wait() later.
    """
    if bucket.comm_hook is not None:  # Task 12: a communication hook sends this bucket instead
        return launch_comm_hook(bucket)
    # --- Task 5.2 begin ---
    # TODO Task 5.2: flatten the bucket's gradients, divide by the world size, start an async all_reduce, keep the handle
    raise NotImplementedError("Task 5.2: launch_all_reduce() in template_ddp.py is not done yet (docs/task5-ddp.md)")
    # --- Task 5.2 end ---


class DDP(nn.Module):
    """Data parallelism with bucketed all-reduces that overlap backward, like PyTorch's DDP.

    DDP(module, bucket_size_mb=25.0): module is the model, already on this rank's device;
    bucket_size_mb caps a bucket's size (None: one bucket per parameter). Every rank must
    build it with the same model, after init_process_group.
    """

    def __init__(self, module, bucket_size_mb=25.0):
        super().__init__()
        self.module = module
        # Every rank initialised its own copy: start from rank 0's, as Task 2.1 did.
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=0)
        self.buckets = [Bucket(params) for params in build_buckets(list(module.parameters()), bucket_size_mb)]
        self.next_bucket = 0  # the first bucket not launched yet in this backward
        self.require_backward_grad_sync = True  # False inside no_sync()
        self.sync_this_backward = True  # decided in forward, as PyTorch's DDP does
        self._hook_handles = []
        self._register_hooks()

    def register_comm_hook(self, state, hook):
        """Send every bucket through hook(state, bucket) instead of a plain averaging all_reduce,
        as torch.nn.parallel.DistributedDataParallel.register_comm_hook does (Task 12).

        hook(state, bucket) gets a GradBucket whose buffer() holds this rank's local, undivided
        gradients, and returns a torch.futures.Future whose value is that buffer AVERAGED over
        the ranks. state is the hook's own (a process group, a PowerSGDState, ...). Call it once,
        before the first backward, as PyTorch allows.
        """
        if any(bucket.comm_hook is not None for bucket in self.buckets):
            raise RuntimeError("register_comm_hook can only be called once, as in PyTorch's DDP")
        for index, bucket in enumerate(self.buckets):
            bucket.comm_hook = (state, hook, index, index == len(self.buckets) - 1)

    def forward(self, *args, **kwargs):
        # PyTorch's DDP decides in forward whether the next backward communicates, so the
        # forward must run inside no_sync() too, not only the backward.
        self.sync_this_backward = self.require_backward_grad_sync
        return self.module(*args, **kwargs)

    def _register_hooks(self):
        """Make backward start each bucket's all_reduce as soon as the bucket is complete.

        For every parameter of every bucket, register a hook with
        param.register_post_accumulate_grad_hook(hook) and keep the handles it returns in
        self._hook_handles. Autograd calls hook(param) once per backward, AFTER it has added
        this backward's gradient into param.grad, so param.grad is complete (under
        accumulation: the sum so far). param.register_hook would not do: it fires before
        that, while param.grad still holds the previous value.

        In the hook:
          - if self.sync_this_backward is False (the forward ran inside no_sync()), return:
            the gradients only accumulate locally;
          - count the parameter as ready in its bucket (bucket.num_ready += 1);
          - launch the complete buckets IN ORDER: while self.next_bucket is a valid index and
            that bucket has all its parameters ready, launch_all_reduce(it) and move
            self.next_bucket on. A complete bucket behind an incomplete one waits: launching
            in bucket order is what makes every rank issue the same all-reduces in the same
            order, even when a parameter is used on some ranks only.
        Never wait in the hook: a wait blocks backward until the bucket has arrived, and then
        nothing overlaps. finish_gradient_synchronization() waits.
        """
        # --- Task 5.3 begin ---
        # TODO Task 5.3: register a post-accumulate-grad hook per parameter that launches the complete buckets in order
        raise NotImplementedError("Task 5.3: _register_hooks() in template_ddp.py is not done yet (docs/task5-ddp.md)")
        # --- Task 5.3 end ---

    def finish_gradient_synchronization(self):
        """After loss.backward(), before optimizer.step(): make every .grad the mean over ranks.

        If the last forward ran inside no_sync() (self.sync_this_backward is False), there is
        nothing to finish: return at once, without any communication.
        Otherwise, launch, in order, every bucket that backward did not launch (from
        self.next_bucket on: a parameter of it, or of a bucket before it, got no gradient,
        because forward did not use it; launch_all_reduce sends zeros for it). Then, for every
        bucket: wait for its handle, and copy its slice of bucket.buffer back into each
        param.grad, in the bucket's order, reshaped like the parameter (a parameter whose
        .grad is None gets a new .grad holding its slice). Finally reset for the next step:
        every bucket's num_ready to 0, handle and buffer to None, self.next_bucket to 0.
        """
        # --- Task 5.4 begin ---
        # TODO Task 5.4: launch the buckets backward did not, wait for each handle, copy the means back into .grad, reset
        raise NotImplementedError("Task 5.4: finish_gradient_synchronization() in template_ddp.py is not done yet (docs/task5-ddp.md)")
        # --- Task 5.4 end ---

    @contextlib.contextmanager
    def no_sync(self):
        """A context manager: forwards (and their backwards) inside it do not communicate.

            with model.no_sync():
                F.cross_entropy(model(x1), y1).backward()   # forward AND backward inside
            F.cross_entropy(model(x2), y2).backward()       # this one all-reduces x1's + x2's
            model.finish_gradient_synchronization()

        Set self.require_backward_grad_sync to False while the block runs, and restore its
        previous value when the block ends, even when the block raises (try/finally): a
        stuck False would silently stop every later step from communicating.
        """
        # --- Task 5.5 begin ---
        # TODO Task 5.5: turn require_backward_grad_sync off inside the block, and restore it even if the block raises
        raise NotImplementedError("Task 5.5: no_sync() in template_ddp.py is not done yet (docs/task5-ddp.md)")
        # --- Task 5.5 end ---
