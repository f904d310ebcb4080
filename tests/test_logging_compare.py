"""W&B offline logging, CSV metrics, and `pretrain compare` on runs and multiruns."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain.config import load_config
from pretrain.report.compare import compare, find_runs, load_run
from pretrain.training.run import train

REPO = Path(__file__).resolve().parents[1]
METRICS = {
    "train/loss",
    "train/tokens",
    "train/tokens_per_sec",
    "train/padding_waste",
    "train/pack_utilization",
    "train/num_targets",
    "val/loss",
    "lr",
}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture()
def offline_env(tmp_path, monkeypatch, shared_cache):
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(shared_cache))
    return tmp_path


def _run(out: Path, *overrides: str) -> dict:
    cfg = load_config(
        ["experiment=smoke", f"output_dir={out}", "progress_bar=false", "train.max_steps=6", *overrides]
    )
    return train(cfg)


def test_csv_has_every_metric_and_tokens_are_cumulative_real_tokens(offline_env):
    out = offline_env / "run"
    summary = _run(out, "data=padded", "data.pad_to=max")
    with open(out / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert METRICS <= set(rows[0])
    tokens = [float(r["train/tokens"]) for r in rows if r["train/tokens"]]
    assert tokens == sorted(tokens) and tokens[-1] == summary["tokens"]
    waste = [float(r["train/padding_waste"]) for r in rows if r["train/padding_waste"]]
    # pydocs documents are mostly longer than 128 tokens, yet short ones leave padded rows.
    assert all(0.0 <= w < 1.0 for w in waste)
    num_targets = [float(r["train/num_targets"]) for r in rows if r["train/num_targets"]]
    # padded rows: real targets = per step tokens increment
    assert tokens[0] == num_targets[0]


def test_wandb_offline_run_logs_config_group_and_tags(offline_env):
    out = offline_env / "wb"
    _run(out, "logger=wandb", "experiment_name=smoke-wandb")
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((out / "wandb").iterdir()) if (out / "wandb").exists() else "no wandb dir"
    # Offline runs keep everything in the run's .wandb record file (synced later with `wandb sync`).
    records = next(runs[0].glob("*.wandb")).read_bytes()
    assert b"train/padding_waste" in records and b"val/loss" in records  # metrics
    assert b"policy:bestfit" in records and b"attn:auto" in records  # tags
    assert b"smoke-wandb" in records  # group (the experiment) and the resolved config


def test_compare_reads_runs_and_writes_plot_and_table(offline_env):
    a, b = offline_env / "sweep" / "0", offline_env / "sweep" / "1"
    _run(a, "data=padded")
    _run(b, "data=bestfit")
    assert find_runs([offline_env / "sweep"]) == [a, b]
    png = compare([offline_env / "sweep"], output=offline_env / "cmp.png", quiet=True)
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    table = (offline_env / "cmp.md").read_text().splitlines()
    assert len(table) == 4  # header, rule, two runs
    padded, bestfit = load_run(a), load_run(b)
    assert padded.policy == "padded" and bestfit.policy == "bestfit"
    assert padded.mean("train/padding_waste") > bestfit.mean("train/padding_waste") == 0.0


def test_compare_cli_errors_clearly_on_a_directory_without_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pretrain.cli", "compare", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert proc.returncode == 2
    assert "no metrics.csv" in proc.stderr


def test_multirun_jobs_get_their_own_wandb_run_grouped_by_the_sweep(offline_env):
    sweep = offline_env / "outputs" / "multirun" / "day" / "sweepA"
    env = {k: v for k, v in os.environ.items()}
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--multirun",
            "experiment=smoke",
            "logger=wandb",
            "data=padded,bestfit",
            "train.max_steps=2",
            "progress_bar=false",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [next((sweep / job / "wandb").glob("offline-run-*/*.wandb")).read_bytes() for job in ("0", "1")]
    assert records[0] != records[1]  # one W&B run per job, not the first job's run reused
    for blob, policy in zip(records, ("padded", "bestfit"), strict=True):
        assert b"day/sweepA" in blob  # the group: the sweep directory
        assert f"policy:{policy}".encode() in blob
    # ... and the comparison reads the whole multirun.
    png = compare([sweep], quiet=True)
    assert png == (sweep / "compare.png").resolve() and png.exists()
