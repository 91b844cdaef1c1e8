"""DDP's communication-hook path (Task 12), given code for Task 5's DDP (template_ddp.py): a bucket
goes to hook(state, bucket) instead of Task 5.2's all-reduce, with the contract of PyTorch's
DistributedDataParallel.register_comm_hook, so PyTorch's own hooks run on Task 5's DDP and
template_compression.py's hooks run on PyTorch's."""
import torch


class GradBucket:
    """What a communication hook gets: the methods of PyTorch's dist.GradBucket that hooks use."""

    def __init__(self, bucket):
        self._bucket = bucket

    def buffer(self):
        """This rank's local, undivided gradients, flat: the hook sends this (or less)."""
        return self._bucket.buffer

    def set_buffer(self, tensor):
        self._bucket.buffer = tensor

    def gradients(self):
        """One view per parameter INTO buffer(): writing through them changes the buffer."""
        sizes = [param.numel() for param in self._bucket.params]
        return [flat.view_as(param) for flat, param in zip(self._bucket.buffer.split(sizes), self._bucket.params)]

    def parameters(self):
        return list(self._bucket.params)

    def index(self):
        return self._bucket.comm_hook[2]

    def is_last(self):
        return self._bucket.comm_hook[3]


class HookHandle:
    """bucket.handle on the hook's path: wait() waits for the hook's Future and puts its value,
    the averaged flat gradients, into bucket.buffer, where Task 5.4 reads the means. Waited for
    as Task 5.2's all-reduce Work can be: wait(), get_future().wait(), or is_completed() True."""

    def __init__(self, future, bucket):
        self.future, self.bucket = future, bucket

    def wait(self):
        self._deliver(self.future.wait())
        return True

    def get_future(self):
        """A Future done once the averaged gradients are in bucket.buffer, holding them."""
        return self.future.then(lambda future: self._deliver(future.value()))

    def is_completed(self):
        if not self.future.done():
            return False
        self._deliver(self.future.value())
        return True

    def _deliver(self, value):
        if isinstance(value, (list, tuple)):  # an all_reduce's own future holds [tensor]
            value = value[0]
        if not isinstance(value, torch.Tensor) or value.shape != self.bucket.buffer.shape:
            got = value.shape if isinstance(value, torch.Tensor) else type(value).__name__
            raise RuntimeError(f"the communication hook's Future held {got}, expected a tensor shaped like the "
                               f"bucket's buffer {tuple(self.bucket.buffer.shape)}: return the averaged buffer")
        self.bucket.buffer = value.to(self.bucket.buffer.dtype)
        return self.bucket.buffer


def launch_comm_hook(bucket):
    """The hook's path (Task 12): hand the bucket's LOCAL, undivided gradients to the hook, as
    PyTorch's DDP does; the hook divides and sends, and its Future is waited for in Task 5.4."""
    state, hook = bucket.comm_hook[:2]
    bucket.buffer = torch.cat([torch.zeros_like(param).reshape(-1) if param.grad is None else param.grad.reshape(-1)
                               for param in bucket.params])
    bucket.handle = HookHandle(hook(state, GradBucket(bucket)), bucket)
