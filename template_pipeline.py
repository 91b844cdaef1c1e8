"""Task 10: pipeline parallelism: stages, micro-batches, and the GPipe and 1F1B schedules.

    python check.py 10                # which of these tasks are done (docs/task10-pipeline.md)
    python benchmarks/pipeline_bench.py --quick    # the benchmark in seconds (its figures: the full run)

Data parallelism copies the whole model onto every rank. Pipeline parallelism cuts it into
consecutive stages, one a rank: stage 0 holds the first layers, stage 1 the next ones, and so
on. An activation travels forward from stage to stage with point-to-point send/recv, and its
gradient travels back the same way. To keep every stage busy, each batch is cut into
micro-batches that follow each other down the pipeline:

    model = flat_cnn()                                 # the CNN as one nn.Sequential of 10 layers
    stage = Stage(model, stage_index=rank, num_stages=world_size)    # keeps its layers only
    optimizer = torch.optim.SGD(stage.module.parameters(), lr=0.1)
    optimizer.zero_grad()
    loss, trace = one_f_one_b_step(stage, images, labels, F.cross_entropy, num_microbatches=4)
    optimizer.step()                                   # loss: the batch's mean, on the last stage

Your tasks:

    Task 10.1  partition          which layers each stage holds (balanced, the same on every rank)
    Task 10.2  Stage._send        start sending a tensor to a neighbour (isend; keep the Work)
    Task 10.3  Stage._recv        receive one; an activation must require grad
    Task 10.4  forward_step       one micro-batch's forward on this stage (loss scaled by 1/M)
    Task 10.5  backward_step      one micro-batch's backward on this stage
    Task 10.6  gpipe_step         GPipe: all forwards, then all backwards
    Task 10.7  one_f_one_b_step   1F1B: warm-up forwards, then one forward one backward, then the rest

How a stage learns the shape it receives: every step starts with Stage.learn_shapes (given).
The first stage knows its micro-batch's shape and dtype; it finds its output's shape by running
its layers on one zero sample (once per input shape; under no_grad, the random state kept) and
sends (dtype, shape) as a small int64 tensor to the next stage, which does the same. So each
stage knows the shape and dtype of the activations it will receive; the gradients it will
receive have the shape of its own output, which it has in hand by then. PyTorch's PipelineStage
does the same kind of inference, once, at its first step.

Simplified, compared with torch.distributed.pipelining: a stage is a slice of one nn.Sequential
whose layers take and return one tensor; one stage a rank (no interleaving); the whole module
is built on every rank before the stage keeps its slice.
"""
import torch
import torch.distributed as dist
from torch import nn

from models import CNN

# The dtypes a shape message can name (its first number is the index in this list).
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
MAX_DIMS = 8  # a shape message holds [dtype index, number of dimensions, up to MAX_DIMS sizes]


def flat_cnn(model=None):
    """The course's CNN (models.py) as one flat nn.Sequential of its 10 layers: the 6 of
    model.features, then the 4 of model.classifier. The layers are model's own modules, not
    copies: training the Sequential trains `model` (and model.state_dict() keeps its names)."""
    model = CNN() if model is None else model
    return nn.Sequential(*model.features, *model.classifier)


def partition(num_layers, num_stages, stage):
    """The layers of stage `stage` (0 <= stage < num_stages): a range of layer indices.

    Balanced: the stages' sizes differ by at most one, the first (num_layers % num_stages) stages
    taking one layer more (10 layers on 4 stages: range(0, 3), range(3, 6), range(6, 8),
    range(8, 10)). Every layer in exactly one stage, in order: stage s's range ends where stage
    s+1's starts. Every rank computes the partition of every stage from the same two numbers,
    so the stages agree on who holds which layer.
    More stages than layers raises a ValueError (a stage would hold nothing).
    """
    # --- Task 10.1 begin ---
    # TODO Task 10.1: balanced ranges of layers, sizes differing by at most one, the first stages one layer more
    raise NotImplementedError("Task 10.1: partition() in template_pipeline.py is not done yet (docs/task10-pipeline.md)")
    # --- Task 10.1 end ---


def split(batch, num_microbatches):
    """The batch cut along its first dimension into num_microbatches equal micro-batches."""
    if batch.shape[0] % num_microbatches:
        raise ValueError(f"a batch of {batch.shape[0]} does not split into {num_microbatches} equal micro-batches: "
                         "choose a batch size that is a multiple of the number of micro-batches")
    return list(batch.split(batch.shape[0] // num_microbatches))


class Stage:
    """One stage of the pipeline: this rank's consecutive slice of a model.

    module       the WHOLE nn.Sequential (built the same on every rank); the stage keeps
                 module[i] for i in partition(len(module), num_stages, stage_index) as
                 self.module, an nn.Sequential sharing those layers (their parameters).
    stage_index  this stage's number; stage i is rank i of `group` (the default group if None).
    pending_sends  the Work of every send started and not yet waited for (wait_sends()).
    input_shape, input_dtype  what this stage receives in this step (learn_shapes()).
    """

    def __init__(self, module, stage_index, num_stages, group=None):
        if dist.get_world_size(group) != num_stages or dist.get_rank(group) != stage_index:
            raise ValueError(f"stage {stage_index} of {num_stages} must run on rank {stage_index} of a group of "
                             f"{num_stages} ranks; this is rank {dist.get_rank(group)} of {dist.get_world_size(group)}")
        self.whole, self.stage_index, self.num_stages, self.group = module, stage_index, num_stages, group
        self.layers = partition(len(module), num_stages, stage_index)
        self.module = nn.Sequential(*(module[i] for i in self.layers))
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        # point-to-point calls name global ranks
        self.prev_rank = None if self.is_first else self._global(stage_index - 1)
        self.next_rank = None if self.is_last else self._global(stage_index + 1)
        self.pending_sends = []
        self.input_shape = self.input_dtype = None
        self._output_shapes = {}  # input (shape, dtype) -> output shape, from one zero sample

    def _global(self, group_rank):
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def _send(self, tensor, peer):
        """Start sending `tensor` to global rank `peer`, without waiting for it to arrive.

        Use dist.isend (not the blocking dist.send: on gloo a send waits until its receiver
        posts the matching recv, so two neighbours that both send first wait for each other
        forever). Send the data only (a detached, contiguous tensor: no autograd graph travels).
        Append the Work that isend returns to self.pending_sends: wait_sends() waits for it
        before the step returns. A Work that nobody keeps is cancelled by gloo when it is
        garbage-collected, and the neighbour then waits for a message that never comes.
        """
        # --- Task 10.2 begin ---
        # TODO Task 10.2: dist.isend a detached contiguous copy to peer, keep its Work in self.pending_sends
        raise NotImplementedError("Task 10.2: Stage._send() in template_pipeline.py is not done yet (docs/task10-pipeline.md)")
        # --- Task 10.2 end ---

    def _recv(self, shape, dtype, peer, requires_grad):
        """Receive a tensor of `shape` and `dtype` from global rank `peer`, and return it: in that
        dtype (learn_shapes receives an int64 message this way; gloo refuses a buffer whose size
        differs from the message's).

        Blocking (dist.recv into a new tensor): the stage cannot compute before it has its input.
        With requires_grad=True (an activation), the returned tensor must require grad: it is
        the input of this stage's layers, and backward must give it a .grad, the gradient that
        send_backward returns to the previous stage. A gradient received is a plain tensor.
        """
        # --- Task 10.3 begin ---
        # TODO Task 10.3: dist.recv into a new tensor of shape and dtype, then requires_grad_(requires_grad)
        raise NotImplementedError("Task 10.3: Stage._recv() in template_pipeline.py is not done yet (docs/task10-pipeline.md)")
        # --- Task 10.3 end ---

    def send_forward(self, activation):
        """This stage's output for one micro-batch, to the next stage."""
        self._send(activation, self.next_rank)

    def recv_forward(self, shape, dtype):
        """The previous stage's output for one micro-batch: this stage's input (requires grad)."""
        return self._recv(shape, dtype, self.prev_rank, requires_grad=True)

    def send_backward(self, grad):
        """The gradient of the loss with respect to this stage's input, to the previous stage."""
        if grad is None:
            raise RuntimeError(
                f"stage {self.stage_index}: send_backward(grad) got None, so the earlier stages get no gradient. "
                "backward_step sends input.grad, the .grad of the input forward_step returned, after backward from "
                "the output (output.grad stays None: output is no leaf); input.grad is None if that input does not "
                "require grad (recv_forward's tensor, Stage._recv) or forward_step detached it before computing")
        self._send(grad, self.prev_rank)

    def recv_backward(self, shape, dtype):
        """The gradient of the loss with respect to this stage's output, from the next stage."""
        return self._recv(shape, dtype, self.next_rank, requires_grad=False)

    def wait_sends(self):
        """Wait until every send this stage started has completed (a step ends with this)."""
        for work in self.pending_sends:
            work.wait()
        self.pending_sends.clear()

    def learn_shapes(self, inputs, num_microbatches):
        """Set self.input_shape and self.input_dtype: the micro-batch shape and dtype this stage
        receives in this step. The first stage reads them from `inputs`; each stage tells the next
        one the shape of its output, in a small int64 message sent before any activation."""
        if self.is_first:
            shape, dtype = split(inputs, num_microbatches)[0].shape, inputs.dtype
        else:
            message = self._recv((2 + MAX_DIMS,), torch.int64, self.prev_rank, requires_grad=False)
            ndim = int(message[1])
            shape, dtype = torch.Size(message[2:2 + ndim].tolist()), DTYPES[int(message[0])]
        self.input_shape, self.input_dtype = shape, dtype
        if not self.is_last:
            out = self._output_shape(shape, dtype)
            message = torch.zeros(2 + MAX_DIMS, dtype=torch.int64)
            message[0], message[1], message[2:2 + len(out)] = DTYPES.index(dtype), len(out), torch.tensor(out)
            self._send(message, self.next_rank)

    def _output_shape(self, shape, dtype):
        if (shape, dtype) not in self._output_shapes:
            # one zero sample through the layers: no graph, and the random state left as it was
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                sample = self.module(torch.zeros((1,) + tuple(shape[1:]), dtype=dtype))
            self._output_shapes[(shape, dtype)] = (shape[0],) + tuple(sample.shape[1:])
        return self._output_shapes[(shape, dtype)]

    def gather_full_module(self):
        """Every layer's current parameters on every stage: each stage broadcasts the layers it
        holds to the others of its group. Returns the whole module given to Stage(), now whole on
        every rank (for an end-of-run check, or to save it). A collective of the group."""
        for stage in range(self.num_stages):
            for i in partition(len(self.whole), self.num_stages, stage):
                for tensor in list(self.whole[i].parameters()) + list(self.whole[i].buffers()):
                    dist.broadcast(tensor.data, self._global(stage), group=self.group)
        return self.whole


def forward_step(stage, x, target, loss_fn, num_microbatches):
    """The forward of one micro-batch on this stage; returns (input, output) for backward_step.

    input: on the first stage `x` (the micro-batch of inputs); on the others the activation
    received from the previous stage, stage.recv_forward(stage.input_shape, stage.input_dtype),
    whatever x is (a caller may give the batch to every stage: choose by stage.is_first).
    output: stage.module(input). On the last stage, output is the loss instead,
    loss_fn(stage.module(input), target) / num_microbatches: scaled by 1/M, so that the
    gradients that the M backwards add up are those of the batch's mean loss (PyTorch's
    schedules scale the same way). On the other stages, send output to the next stage.
    Keep output as it is, attached to the graph: backward_step runs backward from it.
    """
    # --- Task 10.4 begin ---
    # TODO Task 10.4: receive the input (or take x), run stage.module, send the output or return the loss / M
    raise NotImplementedError("Task 10.4: forward_step() in template_pipeline.py is not done yet (docs/task10-pipeline.md)")
    # --- Task 10.4 end ---


def backward_step(stage, input, output):
    """The backward of one micro-batch on this stage, given forward_step's (input, output).

    On the last stage, output is the scaled loss: output.backward(). On the others, receive
    the gradient of the loss with respect to output from the next stage
    (stage.recv_backward(output.shape, output.dtype)) and run output.backward(that gradient).
    backward ADDS into the parameters' .grad, so the M micro-batches' gradients sum up. Then,
    except on the first stage, send input.grad to the previous stage.
    """
    # --- Task 10.5 begin ---
    # TODO Task 10.5: backward from the loss, or from the output with the gradient received; send input.grad back
    raise NotImplementedError("Task 10.5: backward_step() in template_pipeline.py is not done yet (docs/task10-pipeline.md)")
    # --- Task 10.5 end ---


def gpipe_step(stage, inputs, targets, loss_fn, num_microbatches):
    """One training step of the GPipe schedule: all M forwards, then all M backwards.

    Every stage calls it with the same arguments; `inputs` (the batch) is read by the first
    stage only, `targets` by the last (the others may pass None). Both are cut into M equal
    micro-batches with split(). The step starts with stage.learn_shapes(inputs, M) and ends
    with stage.wait_sends(): it returns only after every send it started has completed.

    Forwards of micro-batches 0, 1, ..., M-1 (forward_step), each (input, output) kept for its
    backward; then backwards in the same order 0, 1, ..., M-1, as PyTorch's ScheduleGPipe.
    The gradients are ADDED into .grad (the caller zeroes them) and equal those of the whole
    batch's mean loss.
    Returns (loss, trace): loss is the batch's mean loss (the sum of the M scaled losses, a
    0-d tensor without graph) on the last stage and None on the others; trace is the list of
    ("F", i) and ("B", i) this stage ran, in order.
    """
    # --- Task 10.6 begin ---
    # TODO Task 10.6: learn_shapes, M forwards, then M backwards in order 0..M-1, wait_sends; return (loss, trace)
    raise NotImplementedError("Task 10.6: gpipe_step() in template_pipeline.py is not done yet (docs/task10-pipeline.md)")
    # --- Task 10.6 end ---


def one_f_one_b_step(stage, inputs, targets, loss_fn, num_microbatches):
    """One training step of the 1F1B schedule; the same arguments and result as gpipe_step.

    Warm-up: min(num_stages - stage_index - 1, M) forwards. Steady state: for each remaining
    micro-batch, one forward, then one backward, of the oldest micro-batch whose forward ran.
    Cool-down: the remaining backwards, oldest first. Backwards always run oldest first (in the
    order 0, 1, ..., M-1), because the next stage sends the gradients in that order. So a stage
    holds at most num_stages - stage_index micro-batches' activations at once, against M with
    GPipe. As gpipe_step: learn_shapes first, wait_sends last, the same loss and trace.
    """
    # --- Task 10.7 begin ---
    # TODO Task 10.7: learn_shapes, warm-up forwards, one forward one backward, the remaining backwards, wait_sends
    raise NotImplementedError("Task 10.7: one_f_one_b_step() in template_pipeline.py is not done yet (docs/task10-pipeline.md)")
    # --- Task 10.7 end ---
