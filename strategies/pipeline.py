"""Pipeline parallelism (--pp N, Task 10): the CNN cut into N stages on N consecutive ranks, each
batch cut into micro-batches that a schedule runs through them, data parallel over the
world_size / N pipelines; PyTorch's torch.distributed.pipelining with --impl ddp."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from strategies.base import Strategy, average_flat, gloo_send_refusal, split_model_refusal, world_size_before_set_up
from strategies.course_files import course_module


def add_arguments(parser):
    group = parser.add_argument_group("pipeline parallelism (strategies/pipeline.py)")
    group.add_argument("--pp", type=int, default=1, metavar="N",
                       help="Task 10: cut the CNN into N pipeline stages on N ranks, data parallel over "
                       "world_size / N; PyTorch's torch.distributed.pipelining with --impl ddp (default: 1)")
    group.add_argument("--microbatches", type=int, default=4, metavar="M",
                       help="--pp: the micro-batches each rank's batch is cut into (default: 4)")
    group.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b",
                       help="--pp: GPipe (all forwards, then all backwards) or 1F1B (default: 1f1b)")


def pipeline_groups(pp):
    """(pipeline group, dp group) of this rank: stages of one pipeline are pp consecutive ranks, and the
    ranks that hold the same stage form a dp group. Every rank creates every group, in the same order."""
    world, rank = dist.get_world_size(), dist.get_rank()
    pipes = [dist.new_group(list(range(start, start + pp))) for start in range(0, world, pp)]
    dps = [dist.new_group(list(range(stage, world, pp))) for stage in range(pp)]
    return pipes[rank // pp], dps[rank % pp]


class PipelineParallel(Strategy):
    """--pp N: Task 10's pipeline parallelism. The CNN's 10 layers are cut into N stages held by N
    consecutive ranks; each batch is cut into --microbatches M that the --schedule (gpipe or 1f1b)
    runs through the stages. The world_size / N pipelines are data parallel: every stage of a
    pipeline reads the same slice of each global batch, and each stage's gradients are averaged over
    the ranks that hold the same stage (one flat all-reduce). Evaluation gathers the whole model on
    every rank (each stage broadcasts its layers) and evaluates as data parallelism does."""
    name = "pipeline"
    files = Strategy.files + ["template_pipeline.py"]

    @classmethod
    def chosen_by(cls, args):
        return args.pp > 1

    @classmethod
    def refusal(cls, args):
        if args.accumulate > 1:
            return ("--accumulate with --pp: the pipeline already cuts each batch into --microbatches, whose "
                    "gradients add up: use those")
        if args.microbatches < 1:
            return f"--microbatches {args.microbatches}: a batch is cut into 1 micro-batch or more"
        pipelines = max(world_size_before_set_up() // args.pp, 1)
        if args.batch_size % (pipelines * args.microbatches):
            return (f"the global batch {args.batch_size} does not split into {pipelines} pipelines x "
                    f"{args.microbatches} equal micro-batches: choose a multiple of {pipelines * args.microbatches}")
        return gloo_send_refusal(args, f"--pp {args.pp}") or split_model_refusal(args, "pp")

    def __init__(self, args):
        super().__init__(args)
        self.pp = course_module(args.impl, "template_pipeline")

    def data_ranks(self, rank, world_size):
        return rank // self.args.pp, world_size // self.args.pp

    def wrap(self, model):
        pipe_group, self.dp_group = pipeline_groups(self.args.pp)
        self.trainer.broadcast_parameters(model, src=0)  # every stage cuts its layers from the same model
        self.stage = self.pp.Stage(self.pp.flat_cnn(model), dist.get_rank() % self.args.pp, self.args.pp, pipe_group)
        self.last_stage = dist.get_rank() - dist.get_rank() % self.args.pp + self.args.pp - 1  # its global rank
        self.pipe_group = pipe_group
        return self.stage.module  # this stage's layers: what the optimizer steps

    def forward_backward(self, model, images, labels, accumulate=1):
        step = {"gpipe": self.pp.gpipe_step, "1f1b": self.pp.one_f_one_b_step}[self.args.schedule]
        loss, _ = step(self.stage, images, labels, F.cross_entropy, self.args.microbatches)
        return self.loss_to_every_stage(loss) * len(labels)

    def loss_to_every_stage(self, loss):
        """The batch's mean loss, which only the last stage computes, on every stage of the pipeline (a
        one-number broadcast), so that every rank reports the same (totals counts each image once)."""
        loss = torch.tensor([0.0 if loss is None else float(loss)])
        dist.broadcast(loss, src=self.last_stage, group=self.pipe_group)
        return loss.item()

    def sync_gradients(self, model):
        average_flat(model, lambda flat: dist.all_reduce(flat, group=self.dp_group), dist.get_world_size(self.dp_group))

    def evaluate(self, model, loader, device):
        return super().evaluate(self.stage.gather_full_module(), loader, device)

    def full_parameters(self, model):
        return dict(self.stage.gather_full_module().named_parameters())

    def full_state(self, model):  # the whole model's, not this stage's
        whole = self.stage.gather_full_module()
        return {**dict(whole.named_parameters()), **dict(whole.named_buffers())}


class TorchPipeline(PipelineParallel):
    """--impl ddp --pp N: PyTorch's torch.distributed.pipelining (PipelineStage, ScheduleGPipe or
    Schedule1F1B) on the same stages, each stage wrapped in DistributedDataParallel over its dp group
    (PipelineStage runs all micro-batches but the last inside its no_sync())."""
    name = "pipelining"
    files = Strategy.files

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp" and args.pp > 1

    @classmethod
    def refusal(cls, args):
        if args.schedule == "1f1b" and args.microbatches < args.pp:
            return (f"--microbatches {args.microbatches} with --pp {args.pp}: PyTorch's Schedule1F1B refuses fewer "
                    "micro-batches than stages (ours runs them: a shorter warm-up); use --microbatches "
                    f"{args.pp} or more, or --schedule gpipe")
        return super().refusal(args)

    def wrap(self, model):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        module = super().wrap(model)
        device = next(model.parameters()).device
        if dist.get_world_size(self.dp_group) > 1:
            module = torch.nn.parallel.DistributedDataParallel(module, process_group=self.dp_group)
        stage = PipelineStage(module, self.stage.stage_index, self.args.pp, device, group=self.pipe_group)
        schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[self.args.schedule]
        self.schedule = schedule(stage, n_microbatches=self.args.microbatches, loss_fn=F.cross_entropy)
        return module

    def forward_backward(self, model, images, labels, accumulate=1):
        losses = []
        if self.stage.is_first:
            self.schedule.step(images, target=labels if self.stage.is_last else None, losses=losses)
        else:
            self.schedule.step(target=labels if self.stage.is_last else None, losses=losses)
        loss = torch.stack(losses).mean().item() if losses else None
        return self.loss_to_every_stage(loss) * len(labels)

    sync_gradients = None  # DDP averaged each stage's gradients over its dp group during the last backward

    def sync_line(self, stats):
        return "sync overlapped with backward by DDP" if self.dp_group.size() > 1 else "no data parallelism to sync"


STRATEGIES = [TorchPipeline, PipelineParallel]
