"""A run directory read back: its config, its label, its metric series and the aggregates of a run.

One owner for what both `pretrain compare` (report/) and the W&B summary row (training/loggers.py)
read from a run directory, so that training never imports report/. A run directory is any directory
with a `metrics.csv`; a resumed run is one continuous curve: its steps are joined, the last write of a
step wins (also across files: `metrics.<n>.csv` beside it, n ascending, then `metrics.csv`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ..errors import ConfigError
from .metrics_file import FILE_NAME, join_steps, numeric_rows, read_table

LOSS = "train/loss"


@dataclass
class Run:
    path: Path
    label: str
    policy: str
    max_seq_len: int | None
    batch_size: int | None
    series: dict[str, list[tuple[float, float]]]  # metric -> [(tokens, value)]
    config: dict = field(default_factory=dict)  # the run's config.yaml

    def values(self, metric: str) -> np.ndarray:
        return np.array([v for _, v in self.series.get(metric, [])], dtype=float)

    def last(self, metric: str) -> float:
        values = self.values(metric)
        return float(values[-1]) if len(values) else math.nan

    def mean(self, metric: str) -> float:
        values = self.values(metric)
        return float(values.mean()) if len(values) else math.nan


def _load_config(run_dir: Path) -> dict:
    for candidate in (run_dir / "config.yaml", run_dir / ".hydra" / "config.yaml"):
        if candidate.is_file():
            return yaml.safe_load(candidate.read_text()) or {}
    return {}


def _label(run_dir: Path, config: dict) -> str:
    overrides = run_dir / ".hydra" / "overrides.yaml"
    if overrides.is_file():
        items = yaml.safe_load(overrides.read_text()) or []
        items = [i for i in items if not i.startswith(("hydra.", "experiment="))]
        if items:
            return " ".join(items)
    data, train = config.get("data", {}), config.get("train", {})
    return f"{data.get('policy', '?')} L={data.get('max_seq_len', '?')} bs={train.get('batch_size', '?')}"


def metrics_files(run_dir: Path) -> list[Path]:
    """`metrics.csv`, after the `metrics.<n>.csv` beside it (n ascending): the order they are joined in."""
    numbered = [p for p in run_dir.glob("metrics.*.csv") if re.fullmatch(r"metrics\.\d+\.csv", p.name)]
    numbered.sort(key=lambda p: int(p.name.split(".")[1]))
    main = run_dir / FILE_NAME
    return [*numbered, *([main] if main.is_file() else [])]


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """The run's logged rows, one per step in step order (a step logged twice: the later write wins).
    A file that is not a run's metrics (unreadable, no `step` or `train/loss` column, a cell that is
    not a number) is a ConfigError naming it."""
    rows: list[dict[str, float]] = []
    for path in metrics_files(run_dir):
        header, raw = read_table(path)
        if LOSS not in header:
            raise ConfigError(
                f"{path} is not a training run's metrics file: it has no {LOSS} column; pass run "
                "directories written by python train.py, or move this file away"
            )
        rows += numeric_rows(path, raw)
    return join_steps(rows)


def load_run(run_dir: Path) -> Run:
    config = _load_config(run_dir)
    series: dict[str, list[tuple[float, float]]] = {}
    tokens = 0.0
    for row in read_metrics(run_dir):
        tokens = row.get("train/tokens", tokens)
        for key, value in row.items():
            if key not in ("step", "epoch"):
                series.setdefault(key, []).append((tokens, value))
    data = config.get("data", {})
    return Run(
        path=run_dir,
        label=_label(run_dir, config),
        policy=str(data.get("policy", "?")),
        max_seq_len=data.get("max_seq_len"),
        batch_size=config.get("train", {}).get("batch_size"),
        series=series,
        config=config,
    )


def run_numbers(run: Run) -> dict[str, float]:
    """A run's numbers in the table: last real tokens and losses, median tokens/s, mean padding waste
    and pack utilization (nan where the run has no value)."""
    speeds = run.values("train/tokens_per_sec")
    return {
        "real_tokens": run.last("train/tokens"),
        "train_loss": run.last("train/loss"),
        "val_loss": run.last("val/loss"),
        "tokens_per_sec": float(np.median(speeds)) if len(speeds) else math.nan,
        "padding_waste": run.mean("train/padding_waste"),
        "pack_utilization": run.mean("train/pack_utilization"),
    }
