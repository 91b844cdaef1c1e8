"""Communicating less often (Task 13): --local-sgd H, every rank steps on its own gradients and the
parameters are averaged every H steps (template_local_sgd.py's LocalSGD; with --impl ddp, PyTorch's
PeriodicModelAverager in a PostLocalSGDOptimizer); --diloco H, DiLoCo: AdamW inside, and every H
steps an outer Nesterov step on the averaged change. Nothing averages the gradients.

Both also synchronise after the last step of every epoch, so that the epoch's evaluation and the
end-of-run check see one model (a shorter last round; the count starts again with the next epoch).
The epoch line says how many bytes a step all-reduced on average, next to plain data parallelism's
(every gradient, every step)."""
import time
import warnings

import torch
import torch.distributed as dist

from strategies.base import Strategy, broadcast_like_ddp
from strategies.course_files import course_module
from strategies.data_parallel import TorchDDP


def add_arguments(parser):
    group = parser.add_argument_group("communicating less often: local SGD, DiLoCo (strategies/local_sgd.py)")
    group.add_argument("--local-sgd", type=int, default=0, metavar="H",
                       help="no gradient averaging: every rank steps its own optimizer (--optimizer) and the "
                       "parameters are averaged every H steps (Task 13.2; --impl ddp: PyTorch's "
                       "PeriodicModelAverager) (default: 0, off)")
    group.add_argument("--diloco", type=int, default=0, metavar="H",
                       help="DiLoCo (Task 13.3): AdamW inside (its paper's; --optimizer does not apply, --lr does), "
                       "and every H steps an outer SGD step with Nesterov momentum on the averaged change "
                       "(default: 0, off)")
    group.add_argument("--outer-lr", type=float, default=0.7, help="--diloco: the outer learning rate (default: 0.7)")
    group.add_argument("--outer-momentum", type=float, default=0.9,
                       help="--diloco: the outer Nesterov momentum; 0: plain outer SGD (default: 0.9)")


def refusal(args):
    """What is wrong with these flags whatever the strategy, or None."""
    for flag, value in (("--local-sgd", args.local_sgd), ("--diloco", args.diloco)):
        if value < 0:
            return f"{flag} {value}: H is a number of steps, 1 or more (0: off)"
    if args.local_sgd and args.diloco:
        return "--local-sgd and --diloco are two ways of averaging less often: choose one"
    if not args.diloco and (args.outer_lr != 0.7 or args.outer_momentum != 0.9):
        return "--outer-lr and --outer-momentum set DiLoCo's outer optimizer: add --diloco H"
    if not (args.local_sgd or args.diloco):
        return None
    flag = f"--local-sgd {args.local_sgd}" if args.local_sgd else f"--diloco {args.diloco}"
    conflicts = {"--sync overlap": args.sync == "overlap", f"--allreduce {args.allreduce}": args.allreduce != "torch",
                 f"--shard {args.shard}": args.shard != "none", f"--tp {args.tp}": args.tp > 1,
                 f"--pp {args.pp}": args.pp > 1, "--checkpoint-dir": args.checkpoint_dir is not None,
                 # Task 12 compresses the gradients that data parallelism averages: here none are
                 f"--compress {getattr(args, 'compress', 'none')}": getattr(args, "compress", "none") != "none",
                 # Task 11's SyncBatchNorm all-reduces statistics at every step; PeriodicModelAverager
                 # leaves BatchNorm's running statistics apart (ours averages them with the parameters)
                 "--batchnorm sync": getattr(args, "batchnorm", "none") == "sync",
                 "--batchnorm local with --impl ddp": getattr(args, "batchnorm", "none") == "local"
                 and args.impl == "ddp"}
    for other, conflicting in conflicts.items():
        if conflicting:
            return (f"{flag} cannot be combined with {other}: local SGD and DiLoCo average the parameters of whole "
                    "replicas every H steps and never the gradients; train them with the default data-parallel "
                    "flags (--sync after-backward, --allreduce torch, --shard none, no --tp/--pp/--checkpoint-dir)")
    if args.diloco and args.impl == "ddp":
        return ("--diloco has no PyTorch implementation to compare with (torchft's DiLoCo needs its fault-tolerance "
                "Manager): use --impl template or --impl solutions")
    return None


class _Counted:
    """The optimizer train_ddp steps: `stepper.step()` (the inner step, and the averaging when due),
    and after the last step of an epoch an average in any case (`end_round`). Counts the bytes of every
    dist.all_reduce inside step(), and the seconds they take."""

    def __init__(self, stepper, steps_per_epoch, end_round):
        self.stepper, self.steps_per_epoch, self.end_round = stepper, steps_per_epoch, end_round
        self.steps = self.bytes = 0
        self.seconds = 0.0

    @property
    def param_groups(self):
        return self.stepper.param_groups

    def zero_grad(self, set_to_none=True):
        self.stepper.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        if closure is not None:  # train_ddp never passes one; PostLocalSGDOptimizer.step() takes none
            raise ValueError("local SGD and DiLoCo in train_ddp.py step without a closure")
        real = dist.all_reduce

        def counted(tensor, *args, **kwargs):
            self.bytes += tensor.numel() * tensor.element_size()
            started = time.perf_counter()
            try:
                return real(tensor, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        dist.all_reduce = counted
        try:
            self.steps += 1
            last = self.steps % self.steps_per_epoch == 0
            loss = self.end_round(self.stepper) if last else self.stepper.step()
        finally:
            dist.all_reduce = real
        return loss

    def take(self):
        """(bytes per step, seconds) since the last call."""
        steps = self.steps % self.steps_per_epoch or self.steps_per_epoch
        out = (self.bytes / steps, self.seconds)
        self.bytes, self.seconds = 0, 0.0
        return out


def _sync_now(stepper):
    """Ours: make this step the last of the round (LocalSGD and DiLoCo count in local_step)."""
    every = stepper.sync_every
    stepper.sync_every = stepper.local_step + 1
    try:
        return stepper.step()
    finally:
        stepper.sync_every = every


def _average_now(optimizer):
    """PyTorch's: step, then average unless the averager just did; its next average H steps from here."""
    from torch.distributed.algorithms.model_averaging import utils
    averager = optimizer.averager
    due = averager.step >= averager.warmup_steps and (averager.step - averager.warmup_steps) % averager.period == 0
    loss = optimizer.step()
    if not due:
        utils.average_parameters_or_parameter_groups(optimizer.param_groups, dist.group.WORLD)
    averager.step = 0  # warmup_steps = H - 1: the next average after H more steps
    return loss


class LocalSGD(Strategy):
    """--local-sgd H: Task 13.2's LocalSGD around the --optimizer; no gradient averaging."""
    name = "local-sgd"
    sync_gradients = None  # nothing between backward and step: step() averages the parameters when due
    files = Strategy.files + [("template_local_sgd.py", "all_reduce_mean"),
                              ("template_local_sgd.py", "average_parameters"), ("template_local_sgd.py", "LocalSGD")]

    @classmethod
    def chosen_by(cls, args):
        return args.local_sgd > 0

    @property
    def sync_every(self):
        return self.args.local_sgd

    def loaders(self, *args, **kwargs):  # ours, or DistributedSampler's with --impl ddp (TorchDDP's)
        train_loader, test_loader = super().loaders(*args, **kwargs)
        self.steps_per_epoch = len(train_loader)
        return train_loader, test_loader

    def inner(self, model, optimizer_cls, optimizer_kwargs):
        return optimizer_cls(model.parameters(), **optimizer_kwargs)

    def stepper(self, model, inner):
        lib = course_module(self.args.impl, "template_local_sgd")
        return lib.LocalSGD(model, inner, self.sync_every), _sync_now

    def optimizer(self, model, optimizer_cls, optimizer_kwargs):
        inner = self.inner(model, optimizer_cls, optimizer_kwargs)
        stepper, end_round = self.stepper(model, inner)
        self.dp_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        self.counted = _Counted(stepper, self.steps_per_epoch, end_round)
        return self.counted

    def start_line(self):
        return f"sync={self.name} H={self.sync_every} (no gradient averaging)"

    def _epoch(self, stats):
        """(bytes a step, share of the epoch's time in the all-reduces) of the epoch `stats` is of: taken
        once, for both the CSV (sync_share) and the epoch line (sync_line)."""
        if getattr(self, "_taken", (None,))[0] is not stats:
            per_step, seconds = self.counted.take()
            self._taken = (stats, per_step, seconds / stats["seconds"])
        return self._taken[1:]

    def sync_line(self, stats):
        per_step, share = self._epoch(stats)
        return (f"all-reduced {_size(per_step)} a step on average (plain data parallel: {_size(self.dp_bytes)}, "
                f"{self.dp_bytes / max(per_step, 1):.0f}x more), all-reduces {share:.0%} of step time")

    def sync_share(self, stats):
        return self._epoch(stats)[1]


class DiLoCo(LocalSGD):
    """--diloco H: Task 13.3's DiLoCo, AdamW inside, outer SGD with Nesterov momentum."""
    name = "diloco"
    files = Strategy.files + [("template_local_sgd.py", "all_reduce_mean"), ("template_local_sgd.py", "DiLoCo")]

    @classmethod
    def chosen_by(cls, args):
        return args.diloco > 0

    @property
    def sync_every(self):
        return self.args.diloco

    def inner(self, model, optimizer_cls, optimizer_kwargs):
        lr = 0.001 if self.args.lr is None else self.args.lr
        return torch.optim.AdamW(model.parameters(), lr=lr)

    def stepper(self, model, inner):
        lib = course_module(self.args.impl, "template_local_sgd")
        return lib.DiLoCo(model, inner, self.sync_every, outer_lr=self.args.outer_lr,
                          outer_momentum=self.args.outer_momentum), _sync_now

    def start_line(self):
        return (f"sync={self.name} H={self.sync_every} inner=AdamW(lr={0.001 if self.args.lr is None else self.args.lr}) "
                f"outer=SGD(lr={self.args.outer_lr}, momentum={self.args.outer_momentum}, "
                f"nesterov={self.args.outer_momentum > 0})")


class TorchLocalSGD(LocalSGD, TorchDDP):
    """--impl ddp --local-sgd H: PyTorch's PostLocalSGDOptimizer with a PeriodicModelAverager(period=H,
    warmup_steps=H - 1), whose first average then comes after step H as ours; DistributedSampler."""
    name = "local-sgd"
    files = Strategy.files

    @classmethod
    def chosen_by(cls, args):
        return args.impl == "ddp" and args.local_sgd > 0

    def wrap(self, model):
        broadcast_like_ddp(model)  # no DistributedDataParallel: it would average the gradients
        return model

    def stepper(self, model, inner):
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer
        with warnings.catch_warnings():  # "When period is 1, no need to use model averaging": H = 1 is the test
            warnings.filterwarnings("ignore", message="When period is 1")
            averager = PeriodicModelAverager(period=self.sync_every, warmup_steps=self.sync_every - 1)
        return PostLocalSGDOptimizer(inner, averager), _average_now


def _size(nbytes):
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:.1f} kB"


# Asked in this order: PyTorch's before ours.
STRATEGIES = [TorchLocalSGD, DiLoCo, LocalSGD]
