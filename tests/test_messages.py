"""Messages that say what is wrong and what to change: one test per case (issue 10)."""

from __future__ import annotations

import csv
import json
import logging
import warnings
from pathlib import Path

import pytest

from pretrain.cli import main
from pretrain.config import load_config, to_config
from pretrain.errors import ConfigError
from pretrain.report.compare import compare
from pretrain.training.loggers import summary_row
from pretrain.training.run import RunSettings, train

HEADER = ["lr", "step", "train/loss", "train/tokens", "train/tokens_per_sec", "val/loss"]


def write_run(directory: Path, steps: int = 4, overrides: tuple[str, ...] = ()) -> Path:
    """A run directory as train(cfg) leaves it (metrics.csv, config.yaml), without training."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "metrics.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        for step in range(1, steps + 1):
            writer.writerow([0.001, step, 10.0 - step, 512 * step, 1000.0, 9.5 if step == steps else ""])
    if overrides:
        (directory / ".hydra").mkdir(exist_ok=True)
        (directory / ".hydra" / "overrides.yaml").write_text("".join(f"- {item}\n" for item in overrides))
    return directory


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err


def test_compare_output_without_an_image_suffix_is_refused(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    code, err = run_cli(capsys, "compare", str(run), "--output", str(tmp_path / "plots"))
    assert code == 2
    assert err.strip().splitlines() == [
        f"error: --output {tmp_path / 'plots'} needs a file name with an image suffix such as .png "
        f"(e.g. --output {tmp_path / 'plots.png'}); leave --output out for compare.png in the first directory"
    ]
    assert not (tmp_path / "plots").exists() and not (run / "compare.png").exists()
    # A known image suffix is what it needs (the table goes beside it).
    assert run_cli(capsys, "compare", str(run), "--output", str(tmp_path / "plots.svg"))[0] == 0
    assert (tmp_path / "plots.svg").read_text().lstrip().startswith("<?xml")
    assert (tmp_path / "plots.md").is_file()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe binary", "is not a metrics file (not UTF-8 text"),
        (b"loss;tokens\n1;2\n", "its header has no `step` column (found: loss;tokens)"),
        (b"step,lr\n1,0.1\n", "it has no train/loss column"),
        (b"step,train/loss\n1,2.5\n2,oops\n", "line 3: 'oops' in column 'train/loss' is not a number"),
        (b"", "its header has no `step` column (found: nothing)"),
    ],
)
def test_compare_of_a_garbage_metrics_file_names_it_and_plots_nothing(tmp_path, capsys, content, says):
    write_run(tmp_path / "sweep" / "good")
    bad = tmp_path / "sweep" / "bad" / "metrics.csv"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(content)
    code, err = run_cli(capsys, "compare", str(tmp_path / "sweep"))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}") and says in lines[0], err
    assert not list(tmp_path.rglob("compare.*"))


def test_validation_fraction_one_is_refused_at_config_time(tmp_path, cache_root):
    cfg = load_config(["experiment=smoke", "split.validation_fraction=1", f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as error:
        to_config(cfg)
    assert "split.validation_fraction=1.0 must be in [0, 1) (1 leaves no training documents)" in str(
        error.value
    )
    assert "set e.g. split.validation_fraction=0.05" in str(error.value)
    with pytest.raises(ConfigError, match=r"split\.validation_fraction"):
        train(cfg)
    assert not (tmp_path / "run").exists() and not cache_root.exists()  # nothing was built


def test_zero_train_budget_is_refused_at_config_time(tmp_path, cache_root):
    cfg = load_config(["experiment=smoke", "budget.train_tokens=0", f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as error:
        train(cfg)
    assert str(error.value) == (
        "budget.train_tokens=0 collects no training data: set a positive number of tokens, "
        "or budget.train_tokens=null for the whole source"
    )
    assert not (tmp_path / "run").exists() and not cache_root.exists()


def test_no_validation_split_warns_once_and_never_logs_val_loss(tmp_path, make_cfg, caplog):
    out = tmp_path / "run"
    cfg = make_cfg(
        None,
        "experiment=smoke",
        f"output_dir={out}",
        "progress_bar=false",
        "train.max_steps=3",
        "train.val_every_n_steps=1",
        "split.validation_fraction=0",
    )
    with caplog.at_level(logging.WARNING):
        summary = train(cfg)
    notes = [r.getMessage() for r in caplog.records if "validation split" in r.getMessage()]
    assert len(notes) == 1
    assert "no validation runs and val/loss is not logged" in notes[0]
    assert "set split.validation_fraction above 0" in notes[0]
    with open(out / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows] == [1, 2, 3] and "val/loss" not in rows[0]
    assert all(r["train/loss"] for r in rows)
    assert "val/loss" not in summary["metrics"] and summary["steps"] == 3
    assert "val/loss" not in json.loads((out / "run.json").read_text())["metrics"]
    assert "summary/val_loss" not in summary_row(summary)  # what W&B's summary gets
    assert "summary/train_loss" in summary_row(summary)


def test_a_model_too_big_for_the_cpu_warns_once_before_anything_is_built(caplog):
    with caplog.at_level(logging.WARNING):
        RunSettings.from_config(load_config(["model=gpt2-small", "trainer=cpu"]))
    notes = [r.getMessage() for r in caplog.records if "on the CPU" in r.getMessage()]
    assert len(notes) == 1, notes
    assert notes[0].startswith("model=gpt2-small on the CPU will be very slow: 1.6 TFLOP per optimizer step")
    assert notes[0].endswith("use trainer=gpu, or model=tiny for a CPU run")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        RunSettings.from_config(load_config(["experiment=smoke"]))  # the tiny model: no warning
        RunSettings.from_config(load_config(["experiment=smoke", "model=gpt2-small"]))  # 512 tokens a step
    assert not [r for r in caplog.records if "on the CPU" in r.getMessage()]


def test_compare_plot_never_warns_about_its_layout(tmp_path):
    for i in range(6):
        overrides = (
            f"source.files=[/a/very/long/path/to/the/dataset/shard_{i}.parquet]",
            f"model.init_from=/scratch/user/checkpoints/gpt2-{i}",
            f"train.lr=0.00{i}",
        )
        write_run(tmp_path / "sweep" / str(i), steps=3 + i, overrides=overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tight_layout warned "Tight layout not applied" here
        png = compare([tmp_path / "sweep"], quiet=True)
    assert png.read_bytes()[:4] == b"\x89PNG"
