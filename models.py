"""The models every part of the course trains: the CIFAR-10 CNN, and a small vision transformer.

    from models import CNN, ViT
    model = CNN()                                   # 3x32x32 images in, 10 logits out
    logits = model(torch.randn(8, 3, 32, 32))       # shape (8, 10)
    vit = ViT()                                     # the same images as 64 tokens of 4x4 patches: Tasks 14-16
    vit = ViT(num_experts=4, top_k=2)               # every second block's MLP a mixture of experts: Task 16

By default there is no BatchNorm, on purpose. BatchNorm normalises with the statistics
of the batch it sees, and under data parallelism each rank sees only its own slice of the
global batch, so the model would compute something different from single-process training
on the whole batch; its running statistics (buffers, not parameters) would also drift apart
between ranks. Without it, data-parallel training here is exactly single-process training on
the global batch, which is what the tests check.

    model = CNN(batchnorm=True)     # a BatchNorm2d after each convolution: Task 11

makes that exception visible: train it with `train_ddp.py --batchnorm local` (each rank its
slice's statistics) or `--batchnorm sync` (Task 11's SyncBatchNorm, the global batch's).
PyTorch's own torch.nn.SyncBatchNorm runs on GPUs only: on a CPU (gloo) it raises
"SyncBatchNorm expected input tensor to be on GPU" in training; Task 11's runs on both
(docs/task11-batchnorm.md).

The ViT has no BatchNorm and no dropout either (LayerNorm works on each token alone), so the same
holds for it: N-rank training is one process on the global batch, to float rounding. Its pieces
(Attention, MLP, Block, MoE) are plain modules one process can run; the tasks split them over ranks.
"""
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


class CNN(nn.Module):
    """Two 5x5 convolutions with max-pooling, then two linear layers (about 0.28M parameters).

    batchnorm=True puts an nn.BatchNorm2d after each convolution (96 more parameters, and the
    running statistics as buffers); the default model is unchanged, so every result measured
    without it stands."""

    def __init__(self, num_classes=10, batchnorm=False):
        super().__init__()

        def norm(channels):  # drawn after the convolutions: the same initial weights either way
            return [nn.BatchNorm2d(channels)] if batchnorm else []

        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=5, padding=2),   # 16x32x32
            *norm(16),
            nn.ReLU(),
            nn.MaxPool2d(2),                              # 16x16x16
            nn.Conv2d(16, 32, kernel_size=5, padding=2),  # 32x16x16
            *norm(32),
            nn.ReLU(),
            nn.MaxPool2d(2),                              # 32x8x8
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 8 * 8, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


# ----------------------------------------------------------------------------- the transformer
def attention(q, k, v):
    """Softmax attention of (B, H, S, D) queries, keys and values: F.scaled_dot_product_attention,
    scaled by 1/sqrt(D), not causal (an image's patches all see each other). Attention.attend holds it;
    context parallelism (Task 15) puts a function with the same arguments and result in its place."""
    return F.scaled_dot_product_attention(q, k, v)


class Attention(nn.Module):
    """Multi-head self-attention on (B, S, dim) tokens.

    qkv is one nn.Linear(dim, 3 * dim) whose output is laid out [q | k | v], each of them
    [head 0 | head 1 | ...] of dim / heads features; proj is nn.Linear(dim, dim). The number of
    heads in forward is self.heads and the head width follows from qkv's output: a module whose qkv
    holds some of the heads (Task 14) sets self.heads to how many it holds."""

    def __init__(self, dim, heads):
        super().__init__()
        if dim % heads:
            raise ValueError(f"Attention: dim {dim} does not divide into {heads} heads: choose heads that divide it")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attend = attention  # (B, H, S, D) q, k, v -> (B, H, S, D): Task 15 swaps in its own

    def forward(self, x):
        batch, tokens, _ = x.shape
        # (B, S, 3 * H * D) -> 3 tensors of (B, H, S, D): the [q | k | v] layout, each by head
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        out = self.attend(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, -1))


class MLP(nn.Module):
    """fc1, GELU, fc2: dim -> hidden -> dim, on each token alone."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Routing(NamedTuple):
    """Where route() sends each of T tokens: (T, k) tensors, one column per choice."""
    expert: torch.Tensor  # long: the chosen expert, the best first
    weight: torch.Tensor  # float32 (or the logits' dtype if wider): the gate, what the expert's output is scaled by
    slot: torch.Tensor  # long: the place of this (token, choice) in its expert's queue, 0 first
    kept: torch.Tensor  # bool: slot < capacity; a choice not kept is dropped and contributes nothing


def route(logits, top_k, capacity_factor):
    """Route T tokens to experts from the router's (T, E) logits; returns a Routing of (T, k) tensors.

    - The softmax over the E experts in float32 at least (bf16 router probabilities are too coarse to
      rank experts by), and each token's top_k experts, the most probable first.
    - The gate weights: with top_k > 1 the k probabilities renormalised to sum to 1 (Mixtral); with
      top_k = 1 the probability itself (Switch Transformer), so that the router still gets a gradient.
    - capacity = ceil(capacity_factor * T * top_k / E) tokens per expert, counted on THIS call's T.
    - Slots in priority order, as GShard: every token's first choice before any second choice, and
      within a choice, token order. A (token, choice) whose slot is at or past its expert's capacity
      is dropped (kept False): it contributes nothing, the residual connection carries the token.
    Differentiable into the logits through `weight`; the choices and slots are not.
    """
    tokens, num_experts = logits.shape
    probs = logits.softmax(dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    weight, expert = probs.topk(top_k, dim=-1)
    if top_k > 1:
        weight = weight / weight.sum(dim=-1, keepdim=True)
    capacity = math.ceil(capacity_factor * tokens * top_k / num_experts)
    # Choice-major order (all first choices, then all second choices), and a running count per expert:
    one_hot = F.one_hot(expert.t().reshape(-1), num_experts)  # (k * T, E)
    slot = ((one_hot.cumsum(dim=0) - 1) * one_hot).sum(dim=-1).reshape(top_k, tokens).t()
    return Routing(expert, weight, slot, slot < capacity)


def load_balancing_loss(probs, expert, num_experts):
    """Switch Transformer's auxiliary loss, E * sum_e f_e * P_e: f_e the share of the T * k choices
    made for expert e (before any is dropped; counts, no gradient), P_e the mean router probability
    of expert e over the T tokens (differentiable). 1.0 when the load is perfectly even; E when every
    token goes to one expert with certainty. probs: (T, E); expert: (T, k), route()'s."""
    share = torch.bincount(expert.reshape(-1), minlength=num_experts).to(probs.dtype) / expert.numel()
    return num_experts * (share * probs.mean(dim=0)).sum()


class MoE(nn.Module):
    """A mixture of experts in place of an MLP: each token goes through top_k of num_experts MLPs, chosen
    by a router, its output the gate-weighted sum of theirs (route() says which, and what is dropped).

        moe = MoE(dim=64, hidden=256, num_experts=4, top_k=2)
        y = moe(x)                       # (B, S, dim) -> (B, S, dim)
        moe.aux_loss                     # that call's load-balancing loss, in the graph

    The reference that expert parallelism (Task 16) must match: one process holding every expert.
    Routing and capacity are per call, over the call's B * S tokens."""

    def __init__(self, dim, hidden, num_experts, top_k=2, capacity_factor=1.25):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"MoE: top_k {top_k} must be between 1 and num_experts {num_experts}")
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(dim, hidden) for _ in range(num_experts))
        self.aux_loss = None

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])  # (T, dim)
        logits = self.router(tokens)
        routing = route(logits, self.top_k, self.capacity_factor)
        probs = logits.softmax(dim=-1, dtype=routing.weight.dtype)
        self.aux_loss = load_balancing_loss(probs, routing.expert, self.num_experts)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            # Every expert runs, on no token if none was kept for it: its gradients are then zeros, not
            # None, and every rank's gradients have the same parameters (no "unused parameter").
            token, choice = torch.where((routing.expert == e) & routing.kept)
            gate = routing.weight[token, choice].to(x.dtype).unsqueeze(-1)
            out = out.index_add(0, token, gate * expert(tokens[token]))
        return out.reshape(x.shape)


class Block(nn.Module):
    """A pre-norm transformer block on (B, S, dim) tokens:

        x = x + attn(norm1(x))
        x = x + mlp(norm2(x))

    mlp is an MLP(dim, mlp_ratio * dim), or, with num_experts > 0, a MoE of that many such MLPs."""

    def __init__(self, dim, heads, mlp_ratio=4, num_experts=0, top_k=2, capacity_factor=1.25):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = mlp_ratio * dim
        self.mlp = MoE(dim, hidden, num_experts, top_k, capacity_factor) if num_experts else MLP(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A small vision transformer for CIFAR-10 (Dosovitskiy et al. 2020), for Tasks 14-16.

    The image is cut into (image_size / patch_size)^2 patches, 64 tokens of 4x4 pixels by default;
    patch_embed projects each to dim features and pos_embed (1, S, dim) adds a learned position; the
    depth Blocks follow, then the final LayerNorm `norm`, the MEAN over the tokens (no class token:
    64 tokens divide by 2, 4 and 8 ranks) and the linear `head`. No dropout: N ranks train what one
    process trains, to float rounding.

        vit = ViT()                                # 207,946 parameters (the CNN: 277,610)
        vit = ViT(num_experts=4, top_k=2)          # blocks 1 and 3 (moe_every=2) with a MoE each
        loss = F.cross_entropy(vit(images), labels) + 0.01 * vit.aux_loss()

    Measured, 2 gloo ranks on the 2-core course machine, torch 2.14.1, the synthetic data's 10,000
    training images, global batch 512, SGD: see docs/task14-sequence-parallel.md ("The model").
    """

    def __init__(self, num_classes=10, image_size=32, patch_size=4, dim=64, depth=4, heads=4, mlp_ratio=4,
                 num_experts=0, top_k=2, capacity_factor=1.25, moe_every=2):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"ViT: patch_size {patch_size} does not divide image_size {image_size}")
        tokens = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, tokens, dim))
        # every moe_every-th block (the 2nd, 4th, ... as GShard and Switch) has a MoE, with num_experts > 0
        self.blocks = nn.ModuleList(
            Block(dim, heads, mlp_ratio, num_experts if num_experts and (i + 1) % moe_every == 0 else 0, top_k,
                  capacity_factor) for i in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def embed(self, images):
        """(B, 3, H, W) images -> (B, S, dim) tokens, positions added; row by row, as the patches lie."""
        return self.patch_embed(images).flatten(2).transpose(1, 2) + self.pos_embed

    def forward(self, images):
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))

    def aux_loss(self):
        """The sum of the load-balancing losses of the last forward's MoE layers (0. without any): every
        module's `aux_loss` tensor, so that a layer converted for expert parallelism counts too."""
        losses = [module.aux_loss for module in self.modules()
                  if module is not self and isinstance(getattr(module, "aux_loss", None), torch.Tensor)]
        return sum(losses) if losses else torch.zeros(())


def benchmark_model(name):
    """The models the benchmarks measure, the same on every rank: "cnn" (this course's CNN, 0.28M
    parameters) or "resnet18" (torchvision's ResNet-18 for 10 classes, 11.7M parameters)."""
    torch.manual_seed(0)
    if name == "cnn":
        return CNN()
    import torchvision  # only the benchmarks need it

    return torchvision.models.resnet18(num_classes=10)
