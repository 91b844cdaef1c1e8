"""Draw a torch.profiler Chrome trace as a timeline: forward, backward, the all-reduces and the
optimizer step, each on its own row.

    python support/timeline.py runs/profile/trace.json runs/profile/timeline.png
    python support/timeline.py --streams runs/profile/trace.json   # a GPU trace: which kernels ran on which stream

train_ddp.py --profile DIR calls plot_timeline() itself. The rows, from the trace's events:

    forward            the model's forward: the "forward" ranges that start_profiler's hooks
                       record around each call of the (wrapped) model, one per micro-batch
    backward           autograd's evaluate_function events on the main thread (CPU)
    GPU compute        CUDA kernels other than NCCL's (on a GPU only)
    all_reduce called  dist.all_reduce on the main thread (c10d::allreduce_): a tick where it starts
    all_reduce running gloo's worker threads (gloo:all_reduce) or NCCL's kernels: the transfer itself
    optimizer step     Optimizer.step

With --sync overlap the "running" bars start while backward still runs; with --sync
after-backward they all come after it.
"""
import json
import os
import sys

FORWARD = "forward"  # the name of the range mark_forward records around each forward


def _merge(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def timeline_rows(trace_path):
    """{row name: merged [start, end] intervals in ms from the first profiled step}, and the step bounds."""
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    origin = min(e["ts"] for e in (steps or events))
    main_tids = {e["tid"] for e in events if e.get("name", "").startswith("autograd::engine::evaluate_function")}
    rows = {"forward": [], "backward": [], "GPU compute": [], "all_reduce called": [], "all_reduce running": [], "optimizer step": []}
    for e in events:
        name, span = e.get("name", ""), ((e["ts"] - origin) / 1e3, (e["ts"] + e["dur"] - origin) / 1e3)
        is_kernel = e.get("cat") in ("kernel", "gpu_memcpy")
        if name == FORWARD and e.get("cat") == "user_annotation":
            rows["forward"].append(span)
        elif name.startswith("autograd::engine::evaluate_function") and e["tid"] in main_tids:
            rows["backward"].append(span)
        elif is_kernel and "nccl" in name.lower():
            rows["all_reduce running"].append(span)
        elif is_kernel:
            rows["GPU compute"].append(span)
        elif name == "c10d::allreduce_":
            rows["all_reduce called"].append(span)
        elif name.startswith("gloo:all_reduce"):
            rows["all_reduce running"].append(span)
        elif name.startswith("Optimizer.step"):
            rows["optimizer step"].append(span)
    bounds = sorted(((e["ts"] - origin) / 1e3, (e["ts"] + e["dur"] - origin) / 1e3) for e in steps)
    return {name: _merge(spans) for name, spans in rows.items() if spans}, bounds


def kernel_streams(trace_path):
    """A GPU trace's kernels by CUDA stream: {stream: (kind, kernels, busy ms)}, kind "nccl" or "compute",
    and the ms during which an NCCL kernel ran while a compute kernel ran on another stream: the
    overlap that Task 5's buckets are for, seen on the GPU itself."""
    with open(trace_path) as f:
        kernels = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    streams, spans = {}, {"nccl": [], "compute": []}
    for e in kernels:
        kind = "nccl" if "nccl" in e["name"].lower() else "compute"
        stream = e.get("args", {}).get("stream", e.get("tid"))
        _, count, busy = streams.get(stream, (kind, 0, 0.0))
        streams[stream] = (kind, count + 1, busy + e["dur"] / 1e3)
        spans[kind].append((e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3))
    compute = _merge(spans["compute"])
    overlap = sum(max(0.0, min(end, c_end) - max(start, c_start))
                  for start, end in _merge(spans["nccl"]) for c_start, c_end in compute)
    return streams, overlap


def plot_timeline(trace_path, png_path, title=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, bounds = timeline_rows(trace_path)
    colors = {"forward": "tab:purple", "backward": "tab:blue", "GPU compute": "tab:cyan", "all_reduce called": "tab:gray",
              "all_reduce running": "tab:orange", "optimizer step": "tab:green"}
    names = list(rows)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.5 * len(names)))
    for y, name in enumerate(reversed(names)):
        spans = rows[name]
        widths = [max(end - start, 0.05) for start, end in spans]  # a launch is short: keep it visible
        ax.broken_barh([(start, w) for (start, _), w in zip(spans, widths)], (y - 0.35, 0.7), color=colors[name])
    for start, _ in bounds:
        ax.axvline(start, color="black", linewidth=0.5, linestyle=":")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(list(reversed(names)))
    ax.set_xlabel("ms (dotted lines: the start of each profiled step)")
    ax.set_title(title or f"rank 0, {len(bounds)} steps: {trace_path}")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def mark_forward(model):
    """Hooks that record each call of `model` as a "forward" range in the profile (the forward row):
    a CPU trace holds no event of its own for a module's forward. Returns a function that removes them."""
    import torch

    open_ranges = []

    def enter(module, inputs):
        open_ranges.append(torch.autograd.profiler.record_function(FORWARD))
        open_ranges[-1].__enter__()

    def leave(module, inputs, output):
        if open_ranges:
            open_ranges.pop().__exit__(None, None, None)

    handles = [model.register_forward_pre_hook(enter), model.register_forward_hook(leave)]
    return lambda: [handle.remove() for handle in handles]


def start_profiler(directory, device, model=None):
    """train_ddp.py --profile: a torch.profiler that skips 2 steps, warms up 1, records 3 and writes
    DIR/trace.json and DIR/timeline.png; with `model`, its forward calls are marked (mark_forward)."""
    import torch  # here, not at the top: drawing a saved trace needs no torch

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "trace.json")
    unmark = mark_forward(model) if model is not None else (lambda: None)

    def write(profiler):
        unmark()  # the recorded steps are over
        profiler.export_chrome_trace(path)
        plot_timeline(path, os.path.join(directory, "timeline.png"))

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities, on_trace_ready=write,
                                      schedule=torch.profiler.schedule(wait=2, warmup=1, active=3, repeat=1))
    profiler.start()
    return profiler


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--streams":
        streams, overlap = kernel_streams(sys.argv[2])
        for stream, (kind, count, busy) in sorted(streams.items(), key=lambda item: str(item[0])):
            print(f"stream {stream}: {count} {kind} kernels, {busy:.2f} ms busy")
        print(f"NCCL kernels running beside compute kernels: {overlap:.2f} ms" if streams else
              "no GPU kernels in this trace (a CPU run)")
    elif len(sys.argv) in (3, 4):
        plot_timeline(*sys.argv[1:])
    else:
        sys.exit("usage: python support/timeline.py TRACE.json OUT.png [TITLE]  or  python support/timeline.py --streams TRACE.json")
