"""--compress (Task 12): the gradient buckets of DDP sent through a communication hook: bf16 or fp16
(half the bytes), or PowerSGD's rank-r approximations with error feedback. With --sync overlap,
Task 5's DDP with Task 12's hooks (template_compression.py); with --impl ddp, PyTorch's
DistributedDataParallel with PyTorch's own hooks (torch.distributed.algorithms.ddp_comm_hooks)."""
import torch
import torch.distributed as dist

from strategies.base import Feature
from strategies.course_files import course_module

START_POWERSGD_ITER = 2  # plain averages for the first 2 steps, as PowerSGDState's course default


def add_arguments(parser):
    group = parser.add_argument_group("gradient compression, Task 12 (strategies/compression.py)")
    group.add_argument("--compress", choices=["none", "bf16", "fp16", "powersgd"], default="none",
                       help="send DDP's gradient buckets compressed: bf16 or fp16 (2 bytes a number), or powersgd "
                       "(rank-r approximations of each weight's gradient, with error feedback); with --sync overlap "
                       "(Task 5's DDP, Task 12's hooks) or --impl ddp (PyTorch's DDP and hooks) (default: none)")
    group.add_argument("--powersgd-rank", type=int, default=None,
                       help="--compress powersgd: the rank r of the approximations, matrix_approximation_rank "
                       "(default: 1)")


def refusal(args):
    """What is wrong with these flags whatever the strategy, or None."""
    if args.powersgd_rank is not None and args.compress != "powersgd":
        return f"--powersgd-rank {args.powersgd_rank} sets PowerSGD's rank: add --compress powersgd, or leave it out"
    if args.powersgd_rank is not None and args.powersgd_rank < 1:
        return f"--powersgd-rank {args.powersgd_rank}: the rank of an approximation is 1 or more"
    return None


class Compression(Feature):
    """--compress: DDP's register_comm_hook, on Task 5's DDP or on PyTorch's."""

    @classmethod
    def chosen_by(cls, args):
        return args.compress != "none"

    @classmethod
    def refusal(cls, args):
        if args.tp > 1 or args.pp > 1 or args.shard == "full":
            return (f"--compress {args.compress} compresses DDP's gradient buckets: it cannot be combined with "
                    "--tp, --pp or --shard full, which do not average through DDP")
        if args.sync != "overlap" and args.impl != "ddp":
            return (f"--compress {args.compress} hooks into DDP's gradient buckets: add --sync overlap (Task 5's DDP "
                    "with Task 12's hooks), or train with --impl ddp (PyTorch's DDP and hooks)")
        return super().refusal(args)

    @classmethod
    def needs(cls, args):
        if args.impl == "ddp":
            return super().needs(args)
        if args.compress == "powersgd":
            return super().needs(args) + ["template_compression.py"]
        return super().needs(args) + [("template_compression.py", "compress_hook")]

    def wrap(self, model):
        rank = self.args.powersgd_rank or 1
        if self.args.impl == "ddp":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

            if self.args.compress == "powersgd" and dist.get_backend() == "gloo":
                # One bucket: PyTorch's powerSGD_hook starts all-reduces inside Future callbacks, and with
                # gloo and several buckets the ranks then pair different all-reduces (measured, torch 2.14.1:
                # "Received data size doesn't match expected size" on the CNN's two default buckets).
                size_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
                model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=size_mb + 1)
            else:
                model = super().wrap(model)
            hooks = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook,
                     "powersgd": powerSGD_hook.powerSGD_hook}
            state_cls = powerSGD_hook.PowerSGDState
        else:
            model = super().wrap(model)
            lib = course_module(self.args.impl, "template_compression")
            hooks = {"bf16": lib.bf16_compress_hook, "fp16": lib.fp16_compress_hook, "powersgd": lib.powersgd_hook}
            state_cls = lib.PowerSGDState
        self.state = None
        if self.args.compress == "powersgd":
            self.state = state_cls(None, matrix_approximation_rank=rank, start_powerSGD_iter=START_POWERSGD_ITER)
        model.register_comm_hook(self.state, hooks[self.args.compress])
        return model

    def start_line(self):
        extra = f" powersgd_rank={self.args.powersgd_rank or 1}" if self.args.compress == "powersgd" else ""
        return f"{super().start_line()} compress={self.args.compress}{extra}"

    def sync_line(self, stats):
        return f"{super().sync_line(stats)}; {self.ratio_line()}"

    def ratio_line(self):
        if self.state is None:  # bf16, fp16: every number in 2 bytes instead of 4
            return f"compression 2.0x fewer bytes ({self.args.compress})"
        rate, before, after = self.state.compression_stats()
        if not after:
            return f"compression not started yet (plain averages for the first {START_POWERSGD_ITER} steps)"
        return (f"compression {rate:.1f}x fewer numbers (PowerSGD rank {self.args.powersgd_rank or 1}: "
                f"{after:,} sent for {before:,} since step {START_POWERSGD_ITER})")


FEATURES = [Compression]
