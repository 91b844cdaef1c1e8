"""Plot the metrics CSVs that train_ddp.py writes: one run, or several overlaid in one figure.

    python support/plot_runs.py runs/metrics.csv -o runs/metrics.png
    python support/plot_runs.py runs/ours.csv runs/ddp.csv -o runs/compare.png --labels solutions ddp

Three panels per epoch: the training loss (solid) and test loss (dashed), the test accuracy,
and the throughput in images/s over all ranks. train_ddp.py draws its own run with the same
function, beside its CSV, unless it is given --no-plot.
"""
import argparse
import csv
import os


def read_runs(paths):
    """Each CSV as a dict of columns: {"epoch": [1, 2, ...], "train_loss": [...], ...}."""
    runs = []
    for path in paths:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            raise ValueError(f"{path} has no rows: did the run finish an epoch?")
        runs.append({key: [float(row[key]) if row[key] != "" else float("nan") for row in rows] for key in rows[0]})
    return runs


def plot_runs(runs, labels, out, title=None):
    """Draw the runs (dicts of columns, as read_runs returns) into out, a PNG."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed, on a cluster node either
    import matplotlib.pyplot as plt

    fig, (loss_ax, acc_ax, speed_ax) = plt.subplots(1, 3, figsize=(13, 3.8))
    for run, label, color in zip(runs, labels, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 10):
        epochs = run["epoch"]
        loss_ax.plot(epochs, run["train_loss"], "-o", color=color, label=f"{label} train".strip())
        loss_ax.plot(epochs, run["test_loss"], "--o", color=color, label=f"{label} test".strip())
        acc_ax.plot(epochs, [100 * a for a in run["test_accuracy"]], "-o", color=color, label=label)
        speed_ax.plot(epochs, run["images_per_second"], "-o", color=color, label=label)
    for ax, ylabel in ((loss_ax, "loss"), (acc_ax, "test accuracy (%)"), (speed_ax, "images/s (all ranks)")):
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        if ax is loss_ax or len(runs) > 1:
            ax.legend(fontsize=8)
    losses = [x for run in runs for key in ("train_loss", "test_loss") for x in run[key] if x > 0]
    if losses and max(losses) > 10 * min(losses):
        loss_ax.set_yscale("log")  # losses fall by orders of magnitude: a linear axis hides the end
    speed_ax.set_ylim(bottom=0)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def cannot_write(path):
    """train_ddp.py --metrics and --profile, checked before training: why the file `path` could not
    be written (its folder or one above it is a file, or not writable), or None."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return f"{folder} is a file, not a folder"
    if os.path.isdir(path):
        return f"{path} is a folder"
    return None if os.access(folder, os.W_OK) else f"{folder} is not writable"


def write_metrics(path, rows):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def earlier_rows(path, first_epoch):
    """The rows of the epochs before first_epoch in the CSV at path, as train_ddp.py wrote them: a
    resumed run (--checkpoint-dir, a torchrun restart, a SLURM requeue) keeps its history."""
    if first_epoch == 1 or not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        rows = [row for row in csv.DictReader(f) if int(row["epoch"]) < first_epoch]
    return [{key: int(value) if key == "epoch" else float(value) if value != "" else "" for key, value in row.items()}
            for row in rows]


def write_plot(metrics_path, rows, title):
    """train_ddp.py's own run, drawn beside its CSV (same name, .png). matplotlib is imported only here: a run without it still trains."""
    path = os.path.splitext(metrics_path)[0] + ".png"
    try:
        plot_runs([{key: [row[key] for row in rows] for key in rows[0]}], [""], path, title)
    except ImportError as error:
        return f"no plot ({error}): pip install matplotlib, or pass --no-plot"
    return f"plot: {path}"


def default_labels(paths):
    """The file names without .csv, or the folder and the name where names repeat."""
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    if len(set(names)) < len(names):
        names = [os.path.splitext(os.path.normpath(p))[0].replace(os.sep, "/") for p in paths]
    return names


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", help="metrics CSVs written by train_ddp.py (--metrics)")
    parser.add_argument("-o", "--out", default="runs/compare.png", help="the PNG to write (default: runs/compare.png)")
    parser.add_argument("--labels", nargs="+", help="one legend label per CSV (default: the file names)")
    parser.add_argument("--title", help="a title above the figure")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    labels = args.labels or default_labels(args.csv)
    if len(labels) != len(args.csv):
        raise SystemExit(f"error: {len(args.csv)} CSVs but {len(labels)} labels")
    try:
        runs = read_runs(args.csv)
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"error: {error}")
    plot_runs(runs, labels, args.out, args.title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
