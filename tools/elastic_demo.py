"""Lose a node and grow back: an elastic 2 -> 1 -> 2 run beside an uninterrupted one, as one PNG.

    python tools/elastic_demo.py runs/elastic            # plain data parallelism
    python tools/elastic_demo.py runs/elastic --shard full --optimizer adamw

Two torchrun agents on this machine stand for two nodes (--nnodes=1:2, a c10d rendezvous on
loopback, one process each). Once a checkpoint inside epoch --lose-in is written, the second
agent and its worker are SIGKILLed (the node is gone): the first agent's worker fails, the agent
meets the rendezvous again alone, and its new worker resumes the 2-rank checkpoint on 1 rank. Once
that run has saved inside epoch --grow-in, a new second agent starts (the node is back): the first
agent stops its worker, both meet in a new round, and two workers resume on 2 ranks. Meanwhile the
same training runs uninterrupted on 2 ranks. Writes OUT/uninterrupted.csv, OUT/elastic.csv (the
losses of the epochs as rank 0 printed them; an epoch trained partly twice shows its last run) and
OUT/elastic.png (support/plot_runs.py), and prints the steps, the lines that show the resharding and
the largest difference between the two final models. docs/task8-checkpoints.md shows a result.
"""
import argparse
import csv
import os
import re
import signal
import socket
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from support.interrupt import torchrun_workers as workers  # noqa: E402
from support.plot_runs import plot_runs  # noqa: E402

RDZV_CONF = "join_timeout=120,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=5"


def env():
    # see docs/task8-checkpoints.md: torch 2.14's shared rendezvous store breaks a scale-up
    return dict(os.environ, LOGLEVEL="INFO", PYTHONUNBUFFERED="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")


def agent(port, run, log, host):
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc_per_node=1",
               "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=elastic-demo",
               f"--rdzv_conf=is_host={int(host)},{RDZV_CONF}", "--max_restarts=3", "--monitor_interval=0.5",
               "train_ddp.py", *run]
    return subprocess.Popen(command, cwd=REPO, env=env(), stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)



def saved_position(folder):
    for name in ("last.pt", "last.shards/index.pt"):
        try:
            saved = torch.load(os.path.join(folder, name), weights_only=True)
            return saved["epoch"], saved["step"]
        except (OSError, RuntimeError, EOFError, KeyError):
            continue
    return -1, -1


def wait(condition, what, timeout=600):
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise SystemExit(f"{what} did not happen in {timeout} s")
        time.sleep(0.05)


def epoch_rows(text):
    """The last line printed for each epoch, as plot_runs's columns."""
    rows = {}
    pattern = (r"epoch (\d+)/\d+  train loss ([\d.]+)  test loss ([\d.]+)  test accuracy ([\d.]+)%.*?"
               r"([\d,]+) images/s")
    for epoch, train, test, accuracy, speed in re.findall(pattern, text):
        rows[int(epoch)] = {"epoch": int(epoch), "train_loss": float(train), "test_loss": float(test),
                            "test_accuracy": float(accuracy) / 100, "images_per_second": float(speed.replace(",", ""))}
    return [rows[e] for e in sorted(rows)]


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def final_params(folder):
    """The final parameters, glued from a sharded checkpoint's pieces if need be."""
    if os.path.exists(f"{folder}/last.pt"):
        return torch.load(f"{folder}/last.pt", weights_only=True)["model"]
    index = torch.load(f"{folder}/last.shards/index.pt", weights_only=True)
    pieces = {}
    for name in index["files"]:
        for record in torch.load(f"{folder}/last.shards/{name}", weights_only=True)["flats"]:
            for param, offset, length, at in record["entries"]:
                pieces.setdefault(param, []).append((offset, record["tensors"]["param"][at:at + length]))
    return {name: torch.cat([p for _, p in sorted(parts, key=lambda part: part[0])]) for name, parts in pieces.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="folder for the logs, checkpoints, CSVs and the PNG")
    parser.add_argument("--shard", default="none", choices=["none", "optimizer", "full"], help="train_ddp.py --shard")
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"], help="train_ddp.py --optimizer")
    parser.add_argument("--epochs", type=int, default=6, help="epochs (default: 6)")
    parser.add_argument("--train-samples", type=int, default=2048, help="synthetic training images (default: 2048)")
    parser.add_argument("--lose-in", type=int, default=2, help="lose the second node in this epoch (default: 2)")
    parser.add_argument("--grow-in", type=int, default=4, help="start it again in this epoch (default: 4)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    out = os.path.abspath(args.out)
    impl = "solutions" if os.path.isdir(os.path.join(REPO, "solutions")) else "template"  # a student release: yours
    run = ["--impl", impl, "--data", "synthetic", "--train-samples", str(args.train_samples),
           "--test-samples", "512", "--batch-size", "32", "--epochs", str(args.epochs), "--shard", args.shard,
           "--optimizer", args.optimizer, "--no-plot", "--checkpoint-every", "4"]
    steps = args.train_samples // 32
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    start = time.monotonic()
    reference = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                "train_ddp.py", *run, "--metrics", f"{out}/uninterrupted.csv",
                                "--checkpoint-dir", f"{out}/uninterrupted"], cwd=REPO, env=env(),
                               capture_output=True, text=True)
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    print(f"uninterrupted 2-rank run: {time.monotonic() - start:.0f} s")

    folder, logs = f"{out}/ckpt", [f"{out}/node0.log", f"{out}/node1.log", f"{out}/node1-again.log"]
    start = time.monotonic()
    first = agent(port, [*run, "--metrics", "", "--checkpoint-dir", folder], logs[0], True)
    time.sleep(0.5)
    second = agent(port, [*run, "--metrics", "", "--checkpoint-dir", folder], logs[1], False)
    wait(lambda: saved_position(folder)[1] > (args.lose_in - 1) * steps, "a checkpoint inside the losing epoch")
    lost_at = saved_position(folder)
    doomed = workers(second.pid)
    os.killpg(second.pid, signal.SIGKILL)
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)
    second.wait()
    print(f"second node lost after the checkpoint at (epoch, step) {lost_at}")
    wait(lambda: saved_position(folder)[1] > (args.grow_in - 1) * steps, "a 1-rank checkpoint inside the growing epoch")
    paused = workers(first.pid)  # paused while the new node starts, so that the run cannot end first
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    grown_at = saved_position(folder)
    third = agent(port, [*run, "--metrics", "", "--checkpoint-dir", folder], logs[2], False)
    wait(lambda: "new nodes from group_rank" in open(logs[0]).read(), "the first agent seeing the new node")
    for pid in paused:
        os.kill(pid, signal.SIGCONT)
    print(f"second node back after the checkpoint at (epoch, step) {grown_at}")
    codes = [first.wait(), third.wait()]
    print(f"elastic run: {time.monotonic() - start:.0f} s, exit codes {codes}")
    text = "".join(open(log).read() for log in logs)
    for line in re.findall(r"^(resuming .*|.*rank 0 opened.*)$", text, re.M):
        print(" ", line)

    write_csv(f"{out}/elastic.csv", epoch_rows(text))
    ours, whole = final_params(folder), final_params(f"{out}/uninterrupted")
    worst = max((ours[k].reshape(-1) - whole[k].reshape(-1)).abs().max().item() for k in whole)
    print(f"largest difference between the final parameters: {worst:.2e}")
    with open(f"{out}/uninterrupted.csv") as f:
        rows = list(csv.DictReader(f))
    runs = [{k: [float(r[k]) if r[k] else float("nan") for r in rows] for k in rows[0]},
            {k: [r[k] for r in epoch_rows(text)] for k in epoch_rows(text)[0]}]
    title = (f"2 ranks throughout vs 2 -> 1 (epoch {lost_at[0] + 1}) -> 2 (epoch {grown_at[0] + 1}), "
             f"--shard {args.shard}, synthetic data")
    plot_runs(runs, ["uninterrupted", "elastic"], f"{out}/elastic.png", title)
    print(f"plot: {out}/elastic.png")


if __name__ == "__main__":
    main()
