"""Context parallelism measured: bytes on the wire, step time, memory and causal load balance.

    python benchmarks/context_parallel_bench.py --quick            # S 256 and 1024, N 2, 1 repeat: a minute
    python benchmarks/context_parallel_bench.py                    # S 256 ... 4096, N 2 and 4, 3 repeats
    python benchmarks/context_parallel_bench.py --update-results   # the same, into benchmarks/results/ (the page's)

One attention, forward and backward (torch.autograd.grad of a random output gradient), of
B x H x S x D float32 queries, keys and values split over N gloo ranks (S / N tokens each), three ways:

    ring       Task 15's ring_attention (solutions/), contiguous layout, not causal
    ulysses    Task 15's ulysses_attention (solutions/): all-to-all to H / N heads, F.scaled_dot_product_attention
    allgather  the naive way: all-gather the whole K and V, attend (support/attention.py), and
               reduce-scatter the gradients of K and V back to their owners

What each rank measures of itself, around the forward and backward:
- bytes sent: the growth of /proc/self/io's wchar, what the process handed to write()/send() calls:
  gloo's sockets (checked on 4 ranks: an all-reduce of T bytes writes 1.5 T, an all-gather 3 T, an
  all-to-all 0.75 T, an isend T).
- step time: from a barrier to the end of the backward, the slowest rank's (a barrier after).
- the largest score block: the (B, H', Sq, Sk) scores one attention call makes, in bytes, from the
  shapes of the tensors each call was given (attention_block for ring and allgather, F.scaled_dot_
  product_attention for ulysses);
- K/V bytes held at once in the forward: this rank's own k and v plus the other ranks' K/V it holds,
  at the peak: weak references to every receive buffer (ring), the gathered K and V (allgather), the
  whole-sequence k and v of H / N heads handed to the attention (ulysses).
And with causal attention, the ring with the contiguous and the zig-zag layouts: the query-key pairs
each rank computes (counted in the attention_block calls) and its seconds inside them (forward and
backward). Methods run in a rotated order each repeat, so that a burst of load from elsewhere does not
always hit the same one. Writes context_parallel_bench.csv and context_parallel_causal.csv under --out.
"""
import argparse
import csv
import os
import statistics
import sys
import time
import warnings
import weakref

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from bench_common import add_output_arguments, output_folder, run_ranks  # noqa: E402  (beside this file)

METHODS = ["ring", "ulysses", "allgather"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", nargs="+", type=int, default=[256, 512, 1024, 2048, 4096],
                        help="whole sequence lengths S (default: 256 512 1024 2048 4096)")
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4], help="N, the context group (default: 2 4)")
    parser.add_argument("--batch", type=int, default=1, help="B (default: 1)")
    parser.add_argument("--heads", type=int, default=4, help="H (default: 4; divisible by every N for Ulysses)")
    parser.add_argument("--head-dim", type=int, default=16, help="D (default: 16)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (default: 3)")
    parser.add_argument("--causal-tokens", type=int, default=4096, help="S of the causal load-balance runs (default: 4096)")
    parser.add_argument("--quick", action="store_true", help="--tokens 256 1024 --ranks 2 --repeats 1 --causal-tokens 1024")
    add_output_arguments(parser, "context_parallel_bench.csv and context_parallel_causal.csv")
    args = parser.parse_args(argv)
    args.out = output_folder(args)
    if args.quick:
        args.tokens, args.ranks, args.repeats, args.causal_tokens = [256, 1024], [2], 1, 1024
    return args


def wchar():
    """Bytes this process has handed to write() and send() so far (all its threads: gloo's too)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


class Probe:
    """The largest score block and the K/V bytes held at once, recorded from the tensors themselves."""

    def __init__(self, cp):
        self.cp, self.score, self.held, self.buffers, self.own = cp, 0, 0, [], 0
        self.pairs, self.compute = 0, 0.0

    def alive(self):
        return self.own + sum(t.numel() * t.element_size() for t in (r() for r in self.buffers) if t is not None)

    def __enter__(self):
        import torch.nn.functional as F
        from torch._C._distributed_c10d import ProcessGroup
        self.saved = (vars(ProcessGroup)["recv"], self.cp.attention_block, self.cp.attention_block_backward,
                      F.scaled_dot_product_attention)
        recv, block, block_backward, sdpa = self.saved

        def recorded_recv(group, tensors, src, *args, **kwargs):
            self.buffers += [weakref.ref(t) for t in tensors]
            self.held = max(self.held, self.alive())
            return recv(group, tensors, src, *args, **kwargs)

        def timed(fn, q, k):
            def run(*args, **kwargs):
                self.score = max(self.score, q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.element_size())
                self.pairs += q.shape[2] * k.shape[2]
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.compute += time.perf_counter() - start
            return run

        def recorded_block(q, k, v, *args, **kwargs):
            return timed(block, q, k)(q, k, v, *args, **kwargs)

        def recorded_backward(dout, q, k, v, *args, **kwargs):
            return timed(block_backward, q, k)(dout, q, k, v, *args, **kwargs)

        def recorded_sdpa(q, k, v, *args, **kwargs):
            self.held = max(self.held, self.own + (k.numel() + v.numel()) * k.element_size())
            return timed(sdpa, q, k)(q, k, v, *args, **kwargs)

        ProcessGroup.recv = recorded_recv
        self.cp.attention_block, self.cp.attention_block_backward = recorded_block, recorded_backward
        F.scaled_dot_product_attention = recorded_sdpa
        return self

    def __exit__(self, *exc):
        import torch.nn.functional as F
        from torch._C._distributed_c10d import ProcessGroup
        ProcessGroup.recv, self.cp.attention_block, self.cp.attention_block_backward, \
            F.scaled_dot_product_attention = self.saved


def allgather_attention(cp, q, k, v, dout):
    """The naive way, forward and backward by hand: (dq, dk, dv) of this rank's tokens."""
    import torch
    import torch.distributed as dist
    size = dist.get_world_size()
    whole_k, whole_v = torch.empty(size * k.shape[0], *k.shape[1:]), torch.empty(size * v.shape[0], *v.shape[1:])
    dist.all_gather_into_tensor(whole_k, k.contiguous())  # rank by rank along dim 0
    dist.all_gather_into_tensor(whole_v, v.contiguous())
    whole_k, whole_v = (torch.cat(t.chunk(size, dim=0), dim=2) for t in (whole_k, whole_v))
    out, lse = cp.attention_block(q, whole_k, whole_v)
    held = (k.numel() + v.numel() + whole_k.numel() + whole_v.numel()) * k.element_size()  # its own too
    dq, dk_whole, dv_whole = cp.attention_block_backward(dout, q, whole_k, whole_v, out, lse)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dist.reduce_scatter_tensor(dk, torch.cat(dk_whole.chunk(size, dim=2), dim=0).contiguous())
    dist.reduce_scatter_tensor(dv, torch.cat(dv_whole.chunk(size, dim=2), dim=0).contiguous())
    return dq, dk, dv, held


def one_step(cp, probe, method, q, k, v, dout, causal=False, layout="contiguous"):
    """(dq, dk, dv, the K/V bytes held at once in the forward)."""
    import torch
    if method == "allgather":
        return allgather_attention(cp, q, k, v, dout)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    if method == "ring":
        out = cp.ring_attention(q, k, v, causal=causal, layout=layout)
    else:
        out = cp.ulysses_attention(q, k, v, causal=causal)
    held = max(probe.held, probe.own)  # the backward's dK/dV blocks are not counted
    return (*torch.autograd.grad(out, (q, k, v), dout), held)


def measure(rank, world_size, args):
    import torch
    import torch.distributed as dist

    import solutions.template_context_parallel as cp
    # torch 2.14 names them all_gather_single and reduce_scatter_single; torch 2.11 has only these names
    warnings.filterwarnings("ignore", message=r"`torch.distributed.(all_gather_into_tensor|reduce_scatter_tensor)` "
                            "is deprecated", category=FutureWarning)
    rows, causal_rows = [], []
    shape = lambda tokens: (args.batch, args.heads, tokens // world_size, args.head_dim)  # noqa: E731
    for method in METHODS:  # the first call of each pays for the start-up of its kernels and connections: unmeasured
        with Probe(cp) as probe:
            one_step(cp, probe, method, *(torch.randn(*shape(args.tokens[0])) for _ in range(4)))
    for tokens in args.tokens:
        for repeat in range(args.repeats):
            gen = torch.Generator().manual_seed(repeat * 1000 + rank)
            q, k, v, dout = (torch.randn(*shape(tokens), generator=gen) for _ in range(4))
            for method in METHODS[repeat % 3:] + METHODS[:repeat % 3]:
                dist.barrier()
                with Probe(cp) as probe:
                    probe.own = (k.numel() + v.numel()) * k.element_size()
                    sent, start = wchar(), time.perf_counter()
                    *_, held = one_step(cp, probe, method, q, k, v, dout)
                    sent, seconds = wchar() - sent, time.perf_counter() - start
                slowest = torch.tensor([seconds])
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                rows.append(dict(method=method, ranks=world_size, tokens=tokens, repeat=repeat, rank=rank,
                                 bytes_sent=sent, seconds=slowest.item(), score_block_bytes=probe.score,
                                 kv_bytes_held=held))
    tokens = args.causal_tokens
    for repeat in range(args.repeats):
        gen = torch.Generator().manual_seed(repeat)
        q, k, v, dout = (torch.randn(args.batch, args.heads, tokens, args.head_dim, generator=gen) for _ in range(4))
        for layout in (["contiguous", "zigzag"] if repeat % 2 == 0 else ["zigzag", "contiguous"]):
            mine = [cp.zigzag_shard(t) if layout == "zigzag" else t.chunk(world_size, dim=2)[rank] for t in (q, k, v, dout)]
            dist.barrier()
            with Probe(cp) as probe:
                start = time.perf_counter()
                one_step(cp, probe, "ring", *mine, causal=True, layout=layout)
                seconds = time.perf_counter() - start
            slowest = torch.tensor([seconds])
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            causal_rows.append(dict(layout=layout, ranks=world_size, tokens=tokens, repeat=repeat, rank=rank,
                                    pairs=probe.pairs // 2, compute_seconds=probe.compute, step_seconds=slowest.item()))
    gathered = [None] * world_size
    dist.all_gather_object(gathered, (rows, causal_rows))
    return [row for rows, _ in gathered for row in rows], [row for _, rows in gathered for row in rows]


def write(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def spread(values):
    """'median (min-max)'."""
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows, causal = [], []
    for ranks in args.ranks:
        got, got_causal = run_ranks(ranks, measure, args)
        rows += got
        causal += got_causal
    write(os.path.join(args.out, "context_parallel_bench.csv"), rows)
    write(os.path.join(args.out, "context_parallel_causal.csv"), causal)
    print(f"B={args.batch} H={args.heads} D={args.head_dim} float32, forward + backward, {args.repeats} repeat(s): "
          "median (min-max)")
    print("| N | S | method | MB sent per rank | step ms | largest score block MB | K/V MB held |")
    print("|---|---|---|---|---|---|---|")
    for ranks in args.ranks:
        for tokens in args.tokens:
            for method in METHODS:
                mine = [r for r in rows if (r["ranks"], r["tokens"], r["method"]) == (ranks, tokens, method)]
                ms = [r["seconds"] * 1e3 for r in mine if r["rank"] == 0]
                print(f"| {ranks} | {tokens} | {method} | {spread([r['bytes_sent'] / 1e6 for r in mine])} | "
                      f"{spread(ms)} | {max(r['score_block_bytes'] for r in mine) / 1e6:.3g} | "
                      f"{max(r['kv_bytes_held'] for r in mine) / 1e6:.3g} |")
    print(f"\ncausal ring, S={args.causal_tokens}: query-key pairs and seconds in attention per rank, median (min-max)")
    print("| N | layout | rank | pairs | compute s | step s (slowest rank) |")
    print("|---|---|---|---|---|---|")
    for ranks in args.ranks:
        for layout in ("contiguous", "zigzag"):
            for rank in range(ranks):
                mine = [r for r in causal if (r["ranks"], r["layout"], r["rank"]) == (ranks, layout, rank)]
                print(f"| {ranks} | {layout} | {rank} | {mine[0]['pairs']:,} | {spread([r['compute_seconds'] for r in mine])} "
                      f"| {spread([r['step_seconds'] for r in mine])} |")
    print(f"\nwritten: {args.out}/context_parallel_bench.csv, context_parallel_causal.csv")


if __name__ == "__main__":
    main()
