"""--batchnorm (Task 11): the CNN with a BatchNorm after each convolution, plain on every rank
(local) or with the global batch's statistics (sync: Task 11's SyncBatchNorm, PyTorch's with
--impl ddp). A feature: any data-parallel strategy can take it."""
import torch

from models import CNN
from strategies.base import Feature
from strategies.course_files import course_module

SPLIT_MODELS = ("--batchnorm {bn} cannot be combined with {flag}: the split models are cut from the plain CNN, "
                "which has no BatchNorm; leave --batchnorm at none with {flag}")
TORCH_NEEDS_A_GPU = ("--impl ddp --batchnorm sync uses PyTorch's torch.nn.SyncBatchNorm, which runs on GPUs only (on a "
                     "CPU it raises 'SyncBatchNorm expected input tensor to be on GPU'): on a CPU, train Task 11's "
                     "SyncBatchNorm with --impl template or --impl solutions")


def add_arguments(parser):
    group = parser.add_argument_group("BatchNorm (strategies/batchnorm.py)")
    group.add_argument("--batchnorm", choices=["none", "local", "sync"], default="none",
                       help="none: the CNN without BatchNorm; local: a BatchNorm2d after each convolution, each rank "
                       "normalising with its own slice's statistics (plain nn.BatchNorm under data parallelism); "
                       "sync: the same model with Task 11's SyncBatchNorm (template_batchnorm.py; PyTorch's "
                       "torch.nn.SyncBatchNorm with --impl ddp, GPUs only), the global batch's statistics "
                       "(default: none)")


def refusal(args):
    """What is wrong with --batchnorm whatever the strategy, or None."""
    if args.batchnorm == "none":
        return None
    for flag, size in (("--tp", args.tp), ("--pp", args.pp)):
        if size > 1:
            return SPLIT_MODELS.format(bn=args.batchnorm, flag=f"{flag} {size}")
    if args.batchnorm == "sync" and args.impl == "ddp" and not torch.cuda.is_available():  # gloo on GPUs works
        return TORCH_NEEDS_A_GPU
    return None


class BatchNorm(Feature):
    """--batchnorm local or sync: models.CNN(batchnorm=True), converted for sync."""

    @classmethod
    def chosen_by(cls, args):
        return args.batchnorm != "none"

    @classmethod
    def needs(cls, args):
        sync = args.batchnorm == "sync" and args.impl != "ddp"
        return super().needs(args) + (["template_batchnorm.py"] if sync else [])

    def build_model(self, device):
        model = CNN(batchnorm=True)
        if self.args.batchnorm == "sync":
            sync_batchnorm = (torch.nn.SyncBatchNorm if self.args.impl == "ddp" else
                              course_module(self.args.impl, "template_batchnorm").SyncBatchNorm)
            model = sync_batchnorm.convert_sync_batchnorm(model)
        return model.to(device)

    def start_line(self):
        return f"{super().start_line()} batchnorm={self.args.batchnorm}"

    def consistency(self, model):
        """As every strategy's, but where only BatchNorm's running statistics differ, say which: with
        --batchnorm local that is what plain BatchNorm under data parallelism does, not a mistake."""
        differing = self.differing(model)
        buffers = {name for name, _ in model.named_buffers()}
        if not differing or any(name not in buffers for name in differing):
            return super().consistency(model)  # the usual line: consistent, or parameters differ
        names = ", ".join(differing)
        if self.args.batchnorm == "local":
            return True, (f"ranks consistent in their parameters; their BatchNorm running statistics differ ({names}), "
                          "as --batchnorm local makes them: each rank normalises with its own slice's statistics, so "
                          "evaluation differs by rank. --batchnorm sync keeps them identical")
        return False, (f"ranks INCONSISTENT: the BatchNorm running statistics differ ({names}) although --batchnorm "
                       "sync computes them from the global batch on every rank: is Task 11.3 updating them with the "
                       "global mean, variance and count?")


FEATURES = [BatchNorm]
