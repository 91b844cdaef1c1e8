"""Mixture of experts (--moe E: the ViT's every second MLP a models.MoE) and expert parallelism (--ep N,
Task 16): the experts spread over groups of N consecutive ranks, tokens sent to them with all-to-all,
data parallel for everything else. --impl ddp --moe E trains the same model with PyTorch's DDP, every
rank holding all E experts: the baseline."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

import models
from strategies.base import Feature, Strategy, world_size_before_set_up
from strategies.course_files import course_module


def add_arguments(parser):
    group = parser.add_argument_group("mixture of experts and expert parallelism (strategies/experts.py)")
    group.add_argument("--moe", type=int, default=0, metavar="E",
                       help="with --model vit: every second block's MLP a mixture of E experts (models.MoE), "
                       "each token through --top-k of them (default: 0, no experts)")
    group.add_argument("--top-k", type=int, default=2, metavar="K",
                       help="--moe: the experts each token goes through (default: 2)")
    group.add_argument("--capacity-factor", type=float, default=1.25, metavar="C",
                       help="--moe: each expert takes at most ceil(C * tokens * K / E) tokens of a rank's batch; "
                       "the rest are dropped (default: 1.25)")
    group.add_argument("--moe-aux-weight", type=float, default=0.01, metavar="W",
                       help="--moe: the training loss is cross-entropy + W * the load-balancing loss (default: 0.01)")
    group.add_argument("--ep", type=int, default=1, metavar="N",
                       help="Task 16: spread the --moe experts over groups of N ranks (expert parallelism), "
                       "world_size / N copies of them, data parallel for the rest (default: 1)")


def refusal(args):
    """What is wrong with --moe and --ep whatever the strategy, or None."""
    if not args.moe:
        if args.ep > 1:
            return f"--ep {args.ep} spreads the experts of --moe: add --moe E (E divisible by {args.ep}) and --model vit"
        return None
    if args.model != "vit":
        return f"--moe {args.moe} makes the ViT's MLPs mixtures of experts: add --model vit"
    if args.tp > 1:
        return f"--moe with --tp {args.tp}: the experts are not split by tensor parallelism here; leave --tp out"
    if args.moe < 1 or not 1 <= args.top_k <= args.moe:
        return f"--moe {args.moe} --top-k {args.top_k}: choose 1 <= K <= E"
    if args.capacity_factor <= 0:
        return f"--capacity-factor {args.capacity_factor}: an expert's capacity must be positive"
    if args.accumulate > 1:
        return ("--accumulate with --moe: routing and capacity are per forward, so micro-batches would route "
                "differently from the whole batch; train with a smaller --batch-size instead")
    if args.ep < 1 or args.moe % args.ep:
        return f"--ep {args.ep}: the {args.moe} experts of --moe do not divide over {args.ep} ranks: choose N dividing E"
    if args.ep > 1 and world_size_before_set_up() % args.ep:
        return (f"--ep {args.ep} does not divide the world size {world_size_before_set_up()}: each group of {args.ep} "
                f"consecutive ranks holds one copy of the experts, so start a multiple of {args.ep} processes")
    return None


def vit_of(model):
    """The models.ViT inside whatever wraps it (DDP's .module, ...)."""
    return next(module for module in model.modules() if isinstance(module, models.ViT))


class MixtureOfExperts(Feature):
    """--moe E, with any strategy: the training loss is cross-entropy + --moe-aux-weight * vit.aux_loss(),
    and each epoch line says how many token choices were dropped (past an expert's capacity) and the load
    of the busiest expert relative to the mean, over all ranks (the routing of every MoE layer, counted
    by a forward hook on it in training)."""

    @classmethod
    def chosen_by(cls, args):
        return args.moe > 0

    def wrap(self, model):
        model = super().wrap(model)
        self.layers = [module for module in model.modules() if hasattr(module, "router") and hasattr(module, "top_k")]
        self.counts = None  # per layer: [dropped, choices, load of expert 0, ..., E - 1]
        for index, layer in enumerate(self.layers):
            layer.register_forward_hook(self.count_routing(index))
        return model

    def count_routing(self, index):
        def hook(layer, inputs, output):
            if not layer.training:
                return
            with torch.no_grad():  # the layer's own routing again: the router is one small matrix product
                tokens = inputs[0].reshape(-1, inputs[0].shape[-1])
                routing = models.route(layer.router(tokens), layer.top_k, layer.capacity_factor)
                if self.counts is None:
                    self.counts = torch.zeros(len(self.layers), 2 + layer.num_experts, dtype=torch.float64,
                                              device=tokens.device)
                row = self.counts[index]
                row[0] += (~routing.kept).sum()
                row[1] += routing.kept.numel()
                row[2:] += torch.bincount(routing.expert.reshape(-1), minlength=layer.num_experts)
        return hook

    def forward_backward(self, model, images, labels, accumulate=1):
        loss = F.cross_entropy(model(images), labels) + self.args.moe_aux_weight * vit_of(model).aux_loss()
        loss.backward()
        return loss.item() * len(labels)

    def routing_figures(self):
        """(dropped share, choices, busiest expert / mean) of the epoch over every rank and MoE layer (the worst
        layer's load), then the counts start again. A collective: every rank calls it."""
        if self.counts is None:  # no training step this epoch
            return 0.0, 0, 1.0
        counts = self.counts.clone()
        dist.all_reduce(counts)
        self.counts = None
        dropped, choices = counts[:, 0].sum().item(), counts[:, 1].sum().item()
        load = counts[:, 2:]
        busiest = (load.max(dim=1).values / load.mean(dim=1)).max().item()
        return dropped / choices, int(choices), busiest

    def sync_line(self, stats):
        dropped, choices, busiest = self.routing_figures()
        return (f"{super().sync_line(stats)}  moe: dropped {dropped:.1%} of {choices:,} token choices, busiest expert "
                f"{busiest:.2f}x the mean")


class ExpertParallel(Strategy):
    """--ep N: Task 16's expert parallelism. Each MoE layer's E experts are spread over groups of N
    consecutive ranks (template_experts.parallelize_moe), world_size / N groups holding a copy each; every
    rank reads its own slice of each global batch, and sync_moe_gradients makes every gradient that of one
    process (the rest averaged over all ranks, the experts over the ranks holding the same ones)."""
    name = "expert-parallel"
    files = Strategy.files + ["template_experts.py"]

    @classmethod
    def chosen_by(cls, args):
        return args.ep > 1

    @classmethod
    def refusal(cls, args):
        conflicts = {"--impl ddp": args.impl == "ddp", f"--shard {args.shard}": args.shard != "none",
                     "--sync overlap": args.sync == "overlap", f"--allreduce {args.allreduce}": args.allreduce != "torch",
                     "--checkpoint-dir": args.checkpoint_dir is not None}
        for flag, conflicts_with_ep in conflicts.items():
            if conflicts_with_ep:
                return (f"--ep {args.ep} cannot be combined with {flag}: expert parallelism trains with Task 16's "
                        "sync_moe_gradients after backward (--impl template or solutions, --sync after-backward, "
                        "--allreduce torch, --shard none, no --checkpoint-dir); --impl ddp --moe E without --ep is the "
                        "baseline, every rank holding all experts")
        return None

    def __init__(self, args):
        super().__init__(args)
        self.ep = course_module(args.impl, "template_experts")

    def wrap(self, model):
        self.ep_group, self.expert_dp_group = self.ep.expert_parallel_groups(self.args.ep)
        self.trainer.broadcast_parameters(model, src=0)  # whole, BEFORE the experts are spread: one model
        return self.ep.parallelize_moe(model, self.ep_group)

    def sync_gradients(self, model):
        self.ep.sync_moe_gradients(model, self.ep_group, self.expert_dp_group)

    def start_line(self):
        copies = dist.get_world_size() // self.args.ep
        return f"allreduce={self.args.allreduce} sync={self.name} ep={self.args.ep} expert copies={copies}"

    def evaluate(self, model, loader, device):
        """Task 2.3's evaluation of the whole model (every expert gathered on every rank): the ranks' test
        shards may differ by a batch, and an expert-parallel forward is a collective that every rank of the
        group must call as often as the others."""
        with torch.device("meta"):  # the shapes only: no initialisation, nothing drawn from the RNG
            whole = models.ViT(num_experts=self.args.moe, top_k=self.args.top_k,
                               capacity_factor=self.args.capacity_factor)
        whole = whole.to_empty(device=device)
        whole.load_state_dict(self.full_parameters(model))
        return super().evaluate(whole, loader, device)

    def full_parameters(self, model):
        """The whole model on every rank: each layer's experts all-gathered over its ep group, named as in
        models.MoE (experts.<global index>...), the rest as they are. The end-of-run check then compares the
        experts of every copy too."""
        full = {}
        layers = {prefix: module for prefix, module in model.named_modules() if getattr(module, "expert_parallel", False)}
        size = dist.get_world_size(self.ep_group)
        for name, param in model.named_parameters():
            prefix = next((p for p in layers if name.startswith(f"{p}.experts.")), None)
            if prefix is None:
                full[name] = param.detach()
                continue
            local, _, rest = name[len(prefix) + len(".experts."):].partition(".")
            per_rank = len(layers[prefix].experts)
            pieces = [torch.empty_like(param) for _ in range(size)]
            dist.all_gather(pieces, param.detach().contiguous(), group=self.ep_group)
            for source, piece in enumerate(pieces):
                full[f"{prefix}.experts.{source * per_rank + int(local)}.{rest}"] = piece
        return dict(sorted(full.items()))


FEATURES = [MixtureOfExperts]
STRATEGIES = [ExpertParallel]
