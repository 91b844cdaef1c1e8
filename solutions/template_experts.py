"""Task 16: expert parallelism: the experts of a mixture of experts spread over the ranks, tokens sent to them.

    python check.py 16                # which of these tasks are done (docs/task16-experts.md)

A mixture of experts (models.MoE) sends each token through top_k of E expert MLPs chosen by a router
(models.route), so the parameters grow with E while the work per token does not. Expert parallelism
(GShard, Switch Transformer, DeepSpeed-MoE, torchtitan's expert_parallel.py) spreads the E experts over
the N ranks of a group: rank r holds experts [r * E / N, (r + 1) * E / N). Each rank routes its own
tokens, sends every kept (token, choice) to the rank that holds its expert, runs its local experts on
what arrives from everyone, and sends the outputs back: an all-to-all there and one back, in forward
and in backward.

    ep_group, expert_dp_group = expert_parallel_groups(ep_size)      # given, below
    vit = parallelize_moe(ViT(num_experts=4), ep_group)            # every MoE layer converted, in place
    loss = F.cross_entropy(vit(images), labels) + 0.01 * vit.aux_loss()   # every rank its own images
    loss.backward(); sync_moe_gradients(vit, ep_group, expert_dp_group); optimizer.step()

Your tasks:

    Task 16.1  all_to_all                        all_to_all_single with split sizes, differentiable
    Task 16.2  dispatch                          the counts exchanged, the tokens sent to their experts
    Task 16.3  combine                           the outputs back, gate-weighted, in token order
    Task 16.4  ExpertParallelMoE, parallelize_moe   a MoE layer holding this rank's experts only
    Task 16.5  sync_moe_gradients                every rank's gradients those of one process

Simplified: one expert-parallel group per layer, no overlap of the all-to-alls with the experts'
work, an expert runs its tokens one after another (no grouped GEMM), and E must divide by N.
"""
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

import models


# ----------------------------------------------------------------------------- Task 16.1
# `group` is a process group, None for the default one; inside it ranks are numbered by
# dist.get_rank(group). Split sizes are Python lists of ints, one per rank of the group, in rows of dim 0.
class _AllToAll(torch.autograd.Function):
    """Forward: dist.all_to_all_single of x along dim 0: this rank sends x's first input_splits[0] rows
    to rank 0 of the group, the next input_splits[1] rows to rank 1, ..., and receives output_splits[s]
    rows from rank s, concatenated in rank order: a new tensor of sum(output_splits) rows. Any split
    may be 0 (a rank that sends nothing to another). Backward: the gradient of what arrived goes back
    where it came from: the same all-to-all with the two split lists swapped, which needs nothing of x:
    keep no tensor on ctx (x saved would stay alive until the backward), only the splits and the group."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        # --- Task 16.1 begin ---
        ctx.output_splits, ctx.input_splits, ctx.group = output_splits, input_splits, group
        out = x.new_empty((sum(output_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
        return out
        # --- Task 16.1 end ---

    @staticmethod
    def backward(ctx, grad):
        # --- Task 16.1 begin ---
        out = grad.new_empty((sum(ctx.input_splits), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.input_splits, ctx.output_splits, group=ctx.group)
        return out, None, None, None
        # --- Task 16.1 end ---


def all_to_all(x, output_splits, input_splits, group=None):
    """x's rows sent to the ranks of `group` (input_splits[s] rows to rank s, in order), the rows from every
    rank received (output_splits[s] from rank s, in rank order); differentiable: the gradient goes back
    by the all-to-all with the splits swapped."""
    return _AllToAll.apply(x, list(output_splits), list(input_splits), group)


# ----------------------------------------------------------------------------- Task 16.2
class Plan(NamedTuple):
    """What dispatch tells combine: where the K (token, choice) pairs this rank sent went, and what came.

    token, choice: (K,) long, the kept (token, choice) pairs of this rank in the order they were sent
        (by expert, then token order: see dispatch).
    weight: routing.weight, (T, k): the gates (in the graph: combine multiplies by them).
    input_splits: N ints, the rows this rank sent to each rank of the group.
    output_splits: N ints, the rows it received from each.
    received: (N, E / N) long: received[s, j] rows came from rank s for local expert j."""
    token: torch.Tensor
    choice: torch.Tensor
    weight: torch.Tensor
    input_splits: list
    output_splits: list
    received: torch.Tensor


def local_experts(num_experts, group=None):
    """range of the experts that this rank holds: [r * E / N, (r + 1) * E / N), r and N the group's;
    ValueError, the same on every rank (before any collective), when E does not divide by N."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if num_experts % size:
        raise ValueError(f"expert parallelism: {num_experts} experts do not divide over {size} ranks: choose an "
                         f"expert-parallel size that divides {num_experts}")
    per_rank = num_experts // size
    return range(rank * per_rank, (rank + 1) * per_rank)


def dispatch(x, routing, num_experts, group=None):
    """This rank's tokens sent to the ranks that hold their experts; returns (expert_inputs, plan).

    x: (T, dim), this rank's tokens; routing: models.route's Routing for them ((T, k) expert, weight,
    slot, kept). Rank r of the N ranks of `group` holds experts local_experts(E, group) (E must divide
    by N: local_experts' ValueError otherwise).
    - Only the kept (token, choice) pairs travel; this rank sends them ordered by expert (rank s's
      experts are consecutive, so each rank's share is one piece), and within an expert in token order.
    - Before the tokens, the number of pairs per expert goes to every rank in ONE all-to-all of E
      integers, so that each rank knows how many rows it receives from each rank, and for which expert.
    - The tokens travel with all_to_all (16.1), one all-to-all, differentiable.
    - expert_inputs: a list of E / N tensors; expert_inputs[j] holds, for this rank's j-th local
      expert, the rows that every rank sent for it: rank 0's first, then rank 1's, ..., each rank's in
      its token order. (0, dim) where none came.
    - plan: a Plan (above), everything combine needs.
    Nothing else is sent: no all-gather of the tokens, no second count exchange. T may be 0 (an uneven
    last batch): the rank still takes part in both all-to-alls, with zero counts and no rows.
    """
    experts = local_experts(num_experts, group)
    # --- Task 16.2 begin ---
    size = dist.get_world_size(group)
    token, choice = torch.where(routing.kept)  # token order, then choice
    expert = routing.expert[token, choice]
    order = torch.argsort(expert, stable=True)  # by expert; within one, token order stays
    token, choice, expert = token[order], choice[order], expert[order]
    counts = torch.bincount(expert, minlength=num_experts)  # pairs this rank sends to each expert
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)  # E / N counts to each rank, from each
    received = received.view(size, len(experts))  # [source rank, local expert]
    input_splits = counts.view(size, len(experts)).sum(dim=1).tolist()
    output_splits = received.sum(dim=1).tolist()
    arrived = all_to_all(x[token], output_splits, input_splits, group)
    # arrived is source-major: [rank 0's for expert 0, 1, ... | rank 1's ...]; regroup by expert
    pieces = arrived.split(received.reshape(-1).tolist())
    expert_inputs = [torch.cat(pieces[j::len(experts)]) for j in range(len(experts))]
    return expert_inputs, Plan(token, choice, routing.weight, input_splits, output_splits, received)
    # --- Task 16.2 end ---


# ----------------------------------------------------------------------------- Task 16.3
def combine(expert_outputs, plan, group=None):
    """The local experts' outputs sent back to the ranks whose tokens they are; returns y, (T, dim).

    expert_outputs[j]: the j-th local expert's output on dispatch's expert_inputs[j] (the same rows,
    the same order). One all-to-all back (all_to_all, 16.1), the reverse of dispatch's; then y[t] = the
    sum over token t's kept choices c of weight[t, c] * (the expert's output for (t, c)), the weight
    cast to the outputs' dtype, in this rank's token order; zeros for a token with no kept choice. A
    rank with nothing to send back or to get still takes part in the all-to-all (T may be 0).
    Differentiable into the expert outputs and into plan.weight (the router learns from it)."""
    # --- Task 16.3 begin ---
    size, per_rank = plan.received.shape
    by_expert = [out.split(plan.received[:, j].tolist()) for j, out in enumerate(expert_outputs)]
    send = torch.cat([by_expert[j][s] for s in range(size) for j in range(per_rank)])  # source-major again
    back = all_to_all(send, plan.input_splits, plan.output_splits, group)  # in the order dispatch sent
    gate = plan.weight[plan.token, plan.choice].to(back.dtype).unsqueeze(-1)
    tokens = plan.weight.shape[0]
    return back.new_zeros((tokens, back.shape[-1])).index_add(0, plan.token, gate * back)
    # --- Task 16.3 end ---


# ----------------------------------------------------------------------------- Task 16.4
class ExpertParallelMoE(nn.Module):
    """models.MoE with its experts spread over the ranks of `group`: the same forward and aux_loss.

        layer = ExpertParallelMoE.from_moe(moe, group)
        layer.router              # nn.Linear(dim, E, bias=False), the whole router on every rank
        layer.experts             # nn.ModuleList of this rank's E / N models.MLP, local_experts' order
        layer.aux_loss            # the last forward's load-balancing loss, as models.MoE's
    """

    expert_parallel = True  # sync_moe_gradients and train_ddp.py find the layers by it (not isinstance:
    # a layer may come from another copy of this file)

    def __init__(self, router, experts, num_experts, top_k, capacity_factor, group=None):
        super().__init__()
        self.router = router
        self.experts = nn.ModuleList(experts)
        self.num_experts, self.top_k, self.capacity_factor, self.group = num_experts, top_k, capacity_factor, group
        self.aux_loss = None

    @classmethod
    def from_moe(cls, moe, group=None):
        """This rank's part of `moe` (a models.MoE): its router, whole, and its local experts
        (local_experts' range; ValueError when E does not divide by N), the same models.MLP modules or
        copies. The layer holds nothing of the other experts: once `moe` is dropped their parameters'
        memory is freed. Return cls(router, experts, E, top_k, capacity_factor, group)."""
        # --- Task 16.4 begin ---
        experts = [moe.experts[e] for e in local_experts(moe.num_experts, group)]
        return cls(moe.router, experts, moe.num_experts, moe.top_k, moe.capacity_factor, group)
        # --- Task 16.4 end ---

    def forward(self, x):
        """(B, S, dim) -> (B, S, dim), models.MoE's output for this rank's tokens, and self.aux_loss set
        as models.MoE sets it: routing, capacity and the loss on this rank's B * S tokens. Every local
        expert runs, on no row if none came (its gradients are then zeros, not None)."""
        # --- Task 16.4 begin ---
        tokens = x.reshape(-1, x.shape[-1])
        logits = self.router(tokens)
        routing = models.route(logits, self.top_k, self.capacity_factor)
        probs = logits.softmax(dim=-1, dtype=routing.weight.dtype)
        self.aux_loss = models.load_balancing_loss(probs, routing.expert, self.num_experts)
        expert_inputs, plan = dispatch(tokens, routing, self.num_experts, self.group)
        outputs = [expert(rows) for expert, rows in zip(self.experts, expert_inputs)]
        return combine(outputs, plan, self.group).reshape(x.shape)
        # --- Task 16.4 end ---


def parallelize_moe(model, ep_group=None):
    """Every models.MoE inside `model` (a ViT's block.mlp) replaced, in place, by its ExpertParallelMoE
    over `ep_group`; returns the model. Every rank of the group must start from the same model (broadcast
    it whole BEFORE converting), or the ranks' routers and experts come from different models.
    model.aux_loss() then sums the converted layers' losses."""
    # --- Task 16.4 begin ---
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, models.MoE):
                setattr(module, name, ExpertParallelMoE.from_moe(child, ep_group))
    return model
    # --- Task 16.4 end ---


# ----------------------------------------------------------------------------- Task 16.5
def sync_moe_gradients(model, ep_group=None, expert_dp_group=None):
    """After backward, every rank's .grad made that of single-process training on the global batch
    (the mean over the ranks of each rank's loss); in place, between loss.backward() and optimizer.step().

    The world's W ranks each train on their own slice. `ep_group` (N ranks) spreads the experts;
    `expert_dp_group` holds the W / N ranks that keep copies of the same experts (None when there is one
    copy, W = N). The rule, and why:
    - a parameter outside the experts (attention, norms, routers, ...) is data parallel: its gradient
      is averaged over all W ranks;
    - an expert's gradient already holds the SUM over the N ranks of the ep group of their losses'
      gradients: every rank's tokens went through the expert and the all-to-all's backward brought
      their gradients back to it. So it is divided by N, and averaged over expert_dp_group only
      (the ranks of another ep group hold other experts).
    One collective per group and dtype (the gradients flattened together), not one per parameter, on
    every rank alike, also where the gradients are all zero;
    parameters without .grad are left alone. Expert parameters are those of expert_parameters(model).
    """
    experts = expert_parameters(model)
    # --- Task 16.5 begin ---
    size = dist.get_world_size(ep_group)
    copies = 1 if expert_dp_group is None else dist.get_world_size(expert_dp_group)
    with_grad = [p for p in model.parameters() if p.grad is not None]
    # (parameters, over which ranks, divided by): the experts' gradients are already sums over the ep group
    for params, ranks, divisor in (([p for p in with_grad if id(p) not in experts], "all", dist.get_world_size()),
                                   ([p for p in with_grad if id(p) in experts], expert_dp_group, size * copies)):
        for dtype in sorted({p.grad.dtype for p in params}, key=str):  # one flat buffer per dtype
            grads = [p.grad for p in params if p.grad.dtype == dtype]
            flat = torch.cat([g.reshape(-1) for g in grads])
            if ranks is not None:  # None: one copy of the experts, nothing to average them with
                dist.all_reduce(flat, group=None if ranks == "all" else ranks)
            flat /= divisor
            for grad, mean in zip(grads, flat.split([g.numel() for g in grads])):
                grad.copy_(mean.view_as(grad))
    # --- Task 16.5 end ---


# ----------------------------------------------------------------------------- given
def expert_parameters(model):
    """{id(parameter)} of the experts of every expert-parallel layer in model (its `experts`)."""
    return {id(p) for module in model.modules() if getattr(module, "expert_parallel", False)
            for p in module.experts.parameters()}


def expert_parallel_groups(ep_size):
    """(ep_group, expert_dp_group) of this rank: the W ranks form W / ep_size ep groups of ep_size
    consecutive ranks ([0, 1], [2, 3] for W = 4, ep_size = 2), and the ranks at the same place in them
    hold the same experts: the expert-dp groups ([0, 2], [1, 3]); None when there is one copy (W =
    ep_size, and then ep_group is None too: the default group). dist.new_group is a collective: every
    rank creates every group, in the same order."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % ep_size:
        raise ValueError(f"expert parallelism: --ep {ep_size} does not divide the world size {world}")
    if ep_size == world:
        return None, None
    eps = [dist.new_group(list(range(start, start + ep_size))) for start in range(0, world, ep_size)]
    dps = [dist.new_group(list(range(place, world, ep_size))) for place in range(ep_size)]
    return eps[rank // ep_size], dps[rank % ep_size]
