"""The figures and the progress bar: support/plot_runs.py, train_ddp.py's plot, the tqdm bar on rank 0; the
benchmarks' whiskers and the profile timeline's rows."""
import csv
import functools
import importlib
import io
import os
import runpy
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import train_ddp

pytestmark = pytest.mark.repo

PNG = b"\x89PNG\r\n\x1a\n"
ROWS = [{"epoch": e, "train_loss": 2.0 / e, "test_loss": 1.5 / e, "test_accuracy": 0.3 * e,
         "images_per_second": 900.0 + e, "sync_share": "", "epoch_seconds": 3.0} for e in (1, 2, 3)]


def plot_runs_main():
    return runpy.run_path("support/plot_runs.py")["main"]


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.slow  # seconds of matplotlib: the default run draws one figure, in the test below
def test_plot_runs_overlays_csvs_into_one_png(tmp_path):
    write_csv(tmp_path / "a.csv", ROWS)
    write_csv(tmp_path / "b.csv", ROWS[:2])
    out = tmp_path / "figs" / "both.png"
    plot_runs_main()([str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "-o", str(out), "--labels", "a", "b"])
    assert out.read_bytes().startswith(PNG)


@pytest.mark.parametrize("argv, message", [
    (["{a}", "--labels", "x", "y"], "1 CSVs but 2 labels"),
    (["{missing}"], "No such file"),
    (["{empty}"], "has no rows"),
])
def test_plot_runs_refuses_bad_input_in_one_line(tmp_path, argv, message):
    write_csv(tmp_path / "a.csv", ROWS)
    (tmp_path / "empty.csv").write_text("epoch,train_loss\n")
    paths = {"a": tmp_path / "a.csv", "missing": tmp_path / "nope.csv", "empty": tmp_path / "empty.csv"}
    with pytest.raises(SystemExit, match=message):
        plot_runs_main()([a.format(**paths) for a in argv] + ["-o", str(tmp_path / "x.png")])


def test_train_ddp_draws_its_run_beside_the_csv(tmp_path):
    said = train_ddp.write_plot(str(tmp_path / "run.csv"), ROWS, "a title")
    assert said == f"plot: {tmp_path / 'run.png'}"
    assert (tmp_path / "run.png").read_bytes().startswith(PNG)
    assert train_ddp.parse_args(["--no-plot"]).no_plot and not train_ddp.parse_args([]).no_plot


class Terminal(io.StringIO):
    def isatty(self):
        return True


def one_epoch(trainer, monkeypatch, stderr, rank="0"):
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setenv("RANK", rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    loader = DataLoader(TensorDataset(torch.randn(40, 4), torch.randint(0, 3, (40,))), batch_size=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = trainer.train_one_epoch(model, loader, optimizer, torch.device("cpu"), None, epoch=1, log_every=0.0)
    assert stats["samples"] == 40


def test_rank_0_in_a_terminal_gets_a_progress_bar_with_images_per_second(trainer, monkeypatch, capsys):
    tqdm = pytest.importorskip("tqdm")
    # tqdm redraws at most every 0.1 s: on a fast machine 5 tiny steps end before the first redraw
    monkeypatch.setattr(tqdm, "tqdm", functools.partial(tqdm.tqdm, mininterval=0))
    terminal = Terminal()
    one_epoch(trainer, monkeypatch, terminal)
    shown = terminal.getvalue()
    assert "epoch 1" in shown and "img/s" in shown and "loss" in shown, shown
    assert "step" not in capsys.readouterr().out, "a terminal gets the bar, not the periodic line too"


def test_a_file_or_another_rank_gets_no_bar(trainer, monkeypatch, capsys):
    log = io.StringIO()  # a file, or a SLURM log: not a terminal
    one_epoch(trainer, monkeypatch, log)
    assert log.getvalue() == ""
    assert "epoch 1 step 5/5" in capsys.readouterr().out, "the periodic line is the progress in a file"
    terminal = Terminal()
    one_epoch(trainer, monkeypatch, terminal, rank="1")
    assert terminal.getvalue() == ""


# ----------------------------------------------------------------------- the benchmarks' figures (issue 23 item 13)
# The pages say a ratio moves by 10-30% under load: every benchmark figure that shows a timing
# carries its spread, the fastest and the slowest repetition, as whiskers read from the CSV.
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results")


def benchmark(name, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(RESULTS)))
    return importlib.import_module(name)


def whiskers(monkeypatch):
    """Every Axes.errorbar call's (x, y, yerr), drawn for real."""
    import matplotlib.axes
    drawn = []
    errorbar = matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar",
                        lambda self, x, y, *a, **k: drawn.append((list(x), list(y), k.get("yerr")))
                        or errorbar(self, x, y, *a, **k))
    return drawn


def spans(drawn):
    """(low end, high end) of every whisker drawn."""
    return [(round(y - low, 9), round(y + high, 9)) for _, ys, (lows, highs) in drawn
            for y, low, high in zip(ys, lows, highs)]


@pytest.mark.parametrize("csv_name, median, low, high", [
    ("memory_cnn.csv", "step_seconds", "step_min_seconds", "step_max_seconds"),
    ("memory_resnet18.csv", "step_seconds", "step_min_seconds", "step_max_seconds"),
    ("memory_resnet18_batch256.csv", "step_seconds", "step_min_seconds", "step_max_seconds"),
    ("allreduce_gloo_2ranks.csv", "median_seconds", "min_seconds", "max_seconds"),
    ("allreduce_gloo_4ranks.csv", "median_seconds", "min_seconds", "max_seconds"),
    ("pipeline_bubble.csv", "measured_bubble", "measured_bubble_min", "measured_bubble_max"),
    ("pipeline_cnn.csv", "step_seconds", "min_seconds", "max_seconds"),
])
def test_the_committed_benchmark_results_carry_their_spread(csv_name, median, low, high):
    with open(os.path.join(RESULTS, csv_name)) as f:
        rows = list(csv.DictReader(f))
    assert rows and low in rows[0] and high in rows[0], f"{csv_name}: no {low}/{high} columns: rerun with --update-results"
    for row in rows:
        assert float(row[low]) <= float(row[median]) <= float(row[high]), row


def test_the_batch_256_memory_figure_has_several_numbers_of_ranks():
    with open(os.path.join(RESULTS, "memory_resnet18_batch256.csv")) as f:
        ranks = {int(row["ranks"]) for row in csv.DictReader(f)}
    assert len(ranks) >= 3, f"one x value is no trend: ranks {sorted(ranks)}"


def memory_row(strategy, ranks, total, step, low, high):
    return {"model": "cnn", "ranks": ranks, "strategy": strategy, "batch_per_rank": 16, "total_bytes": total,
            "step_seconds": step, "step_min_seconds": low, "step_max_seconds": high}


def test_the_memory_figure_shows_the_step_time_with_its_spread(monkeypatch, tmp_path):
    """The price of sharding beside what it saves: a panel of step times, whiskers from the fastest
    to the slowest step of each strategy."""
    bench = benchmark("memory_bench", monkeypatch)
    drawn = whiskers(monkeypatch)
    rows = [memory_row("ddp", 1, 4 * 2**20, 0.010, 0.008, 0.020), memory_row("ddp", 2, 4 * 2**20, 0.020, 0.015, 0.050),
            memory_row("task7", 1, 4 * 2**20, 0.012, 0.011, 0.013), memory_row("task7", 2, 2 * 2**20, 0.030, 0.02, 0.04)]
    bench.plot(rows, str(tmp_path / "memory.png"))
    assert (tmp_path / "memory.png").read_bytes().startswith(PNG)
    assert sorted(spans(drawn)) == sorted([(8.0, 20.0), (15.0, 50.0), (11.0, 13.0), (20.0, 40.0)]), drawn
    assert [y for _, ys, _ in drawn for y in ys] == [10.0, 20.0, 12.0, 30.0], "the medians, in ms"


def test_the_allreduce_figure_shows_the_spread(monkeypatch, tmp_path):
    bench = benchmark("allreduce_bench", monkeypatch)
    drawn = whiskers(monkeypatch)
    row = {"median_seconds": 0.002, "min_seconds": 0.001, "max_seconds": 0.004, "busbw_GBps": 1.0}
    args = bench.parse_args(["--out", str(tmp_path)])
    bench.plot({("torch", 1024): row}, ["torch"], [1024], 2, args, str(tmp_path / "allreduce.png"))
    assert (tmp_path / "allreduce.png").read_bytes().startswith(PNG)
    time, bandwidth = spans(drawn)
    assert time == (1.0, 4.0), "ms: the fastest and the slowest call"
    assert bandwidth == (0.5, 2.0), "GB/s: the slowest call has the lowest bandwidth, the fastest the highest"


def test_the_pipeline_bubble_figure_shows_the_spread(monkeypatch, tmp_path):
    bench = benchmark("pipeline_bench", monkeypatch)
    drawn = whiskers(monkeypatch)
    rows = [{"schedule": s, "stages": 2, "microbatches": 4, "measured_bubble": 0.21, "measured_bubble_min": 0.2,
             "measured_bubble_max": 0.25} for s in ("gpipe", "1f1b")]
    bench.plot_bubble(rows, str(tmp_path / "bubble.png"))
    assert spans(drawn) == [(0.2, 0.25), (0.2, 0.25)], drawn


@pytest.mark.slow  # 5-9 s: the profiler starts, and the figure is drawn
def test_the_profile_timeline_has_a_forward_row_before_each_backward(tmp_path):
    """train_ddp.py --profile: a CPU trace has no event for a module's forward; start_profiler's hooks
    mark each call of the model, so the timeline shows forward, backward and the step in order."""
    from support import timeline

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler = timeline.start_profiler(str(tmp_path), torch.device("cpu"), model)
    for _ in range(6):  # skips 2, warms up 1, records 3
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        profiler.step()
    profiler.stop()
    rows, steps = timeline.timeline_rows(str(tmp_path / "trace.json"))
    assert list(rows)[:2] == ["forward", "backward"] and len(rows["forward"]) == 3 == len(steps), rows
    for start, end in steps:  # in each recorded step: forward, then backward, then the optimizer's step
        first = {name: min((a for a, _ in spans if start <= a < end), default=None) for name, spans in rows.items()}
        assert None not in first.values() and first["forward"] < first["backward"] < first["optimizer step"], first
    assert not model._forward_hooks and not model._forward_pre_hooks, "the marks end with the profile"
    assert (tmp_path / "timeline.png").read_bytes().startswith(PNG)
