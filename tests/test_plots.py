"""The figures and the progress bar: tools/plot_runs.py, train_ddp.py's plot, the tqdm bar on rank 0."""
import csv
import functools
import io
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
    return runpy.run_path("tools/plot_runs.py")["main"]


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
