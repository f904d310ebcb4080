"""A run directory read back: its config, its label, its metric series and the aggregates of a run.

One owner for what both `pretrain compare` (report/) and the W&B summary row (training/loggers.py)
read from a run directory, so that training never imports report/. A run directory is any directory
with a `metrics.csv`; a resumed run is one continuous curve: its steps are joined, the last write of a
step wins (also across files: `metrics.<n>.csv` beside it, n ascending, then `metrics.csv`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import yaml

from ..errors import ConfigError
from .metrics_file import FILE_NAME, join_steps, numeric_rows, read_table
from .summary import read_summary

LOSS = "train/loss"


def layout_options(config_class: type) -> dict[str, object]:
    """A policy config's layout choices (its enum and bool fields) and their defaults: what makes an
    arm (`data.strategy`, `data.pad_to`, `data.document_mask`); numbers such as a buffer size are
    swept, not arms."""
    from enum import Enum

    return {
        f.name: f.default
        for f in fields(config_class)
        if isinstance(f.default, bool | Enum) and f.name != "policy"
    }


def policy_layout_options(data: dict) -> tuple[str, dict[str, object] | None]:
    """A `data` group's policy name and its layout options with their defaults; None for a policy this
    version does not know (named by its name alone)."""
    from ..data.batching.policies import policy_class
    from ..errors import PretrainError

    policy = str(data.get("policy", "?"))
    try:
        return policy, layout_options(policy_class(policy).config_class)
    except PretrainError:
        return policy, None


def arm_name(data: dict) -> str:
    """The batch layout a run's `data` group chooses: its policy, plus each layout option that differs
    from the policy's default (`padded pad_to=longest`, `prepacked strategy=bfd`)."""
    policy, options = policy_layout_options(data)
    if options is None:
        return policy
    changed = [
        f"{k}={data[k]}" for k, default in options.items() if k in data and str(data[k]) != str(default)
    ]
    return " ".join([policy, *changed])


@dataclass
class Run:
    path: Path
    label: str
    policy: str
    max_seq_len: int | None
    batch_size: int | None
    series: dict[str, list[tuple[float, float]]]  # metric -> [(tokens, value)]
    config: dict = field(default_factory=dict)  # the run's config.yaml
    by_time: dict[str, list[tuple[float, float]]] = field(
        default_factory=dict
    )  # metric -> [(seconds, value)]
    by_step: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # metric -> [(step, value)]
    layouts: dict[str, dict] = field(default_factory=dict)  # arm -> waste and truncation on the run's data
    composition: dict = field(default_factory=dict)  # run.json's composition audit (data/measures/audit.py)
    floors: dict = field(default_factory=dict)  # run.json's floors (data/measures/floors.py): unigram, bigram
    downstream: dict = field(
        default_factory=dict
    )  # run.json's `pretrain lm-eval` metrics: task -> metric -> value

    @property
    def arm(self) -> str:
        return arm_name(self.config.get("data") or {"policy": self.policy})

    def values(self, metric: str) -> np.ndarray:
        return np.array([v for _, v in self.series.get(metric, [])], dtype=float)

    def last(self, metric: str) -> float:
        values = self.values(metric)
        return float(values[-1]) if len(values) else math.nan

    def mean(self, metric: str) -> float:
        values = self.values(metric)
        return float(values.mean()) if len(values) else math.nan

    def truncated_fraction(self, arm: str | None = None) -> float:
        """Prediction pairs the layout never trains (cut document tails) / all prediction pairs."""
        layout = self.layouts.get(arm or self.arm)
        if not layout or not layout["prediction_pairs"]:
            return math.nan
        return layout["truncated_pairs"] / layout["prediction_pairs"]


def _load_config(run_dir: Path) -> dict:
    """The run's config, interpolations resolved: Hydra's `.hydra/config.yaml` (all a run still in
    progress has) keeps `${data.max_seq_len}`-style references, which would otherwise make a run
    look like another arm."""
    for candidate in (run_dir / "config.yaml", run_dir / ".hydra" / "config.yaml"):
        if candidate.is_file():
            try:
                config = yaml.safe_load(candidate.read_text()) or {}
            except (yaml.YAMLError, UnicodeDecodeError) as error:
                mark = getattr(error, "problem_mark", None)
                where = f" at line {mark.line + 1}" if mark is not None else ""
                raise ConfigError(
                    f"{candidate} is not valid YAML{where}: its run cannot be labelled; fix the file, "
                    f"or leave {run_dir} out of the comparison"
                ) from None
            if not isinstance(config, dict):
                raise ConfigError(
                    f"{candidate} holds no config (a {type(config).__name__}, not a mapping): fix the "
                    f"file, or leave {run_dir} out of the comparison"
                )
            try:
                from omegaconf import OmegaConf

                resolved = OmegaConf.to_container(OmegaConf.create(config), resolve=True)
            except Exception:  # a resolver only Hydra knows: keep the file's values as written
                return config
            return resolved if isinstance(resolved, dict) else config
    return {}


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


def _run_json_entry(run_dir: Path, key: str) -> dict:
    """run.json's `key` entry (the `composition` audit of data/measures/audit.py, the `floors` of
    measures/floors.py, `pretrain lm-eval`'s `downstream`); {} for a run without one (unfinished, older)."""
    try:
        return dict(read_summary(run_dir).get(key) or {})
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def load_run(run_dir: Path) -> Run:
    config = _load_config(run_dir)
    series: dict[str, list[tuple[float, float]]] = {}
    by_time: dict[str, list[tuple[float, float]]] = {}
    by_step: dict[str, list[tuple[float, float]]] = {}
    tokens = seconds = 0.0
    step = 0.0
    for row in read_metrics(run_dir):
        tokens = row.get("train/tokens", tokens)
        # Training time: a logged step's own seconds stand for every step since the previous row
        # (validation left out: it is the same work whatever the policy).
        steps, step = row["step"] - step, row["step"]
        seconds += steps * (row.get("train/step_seconds", math.nan) + row.get("train/data_seconds", 0.0))
        for key, value in row.items():
            if key not in ("step", "epoch"):
                series.setdefault(key, []).append((tokens, value))
                by_step.setdefault(key, []).append((step, value))
                if math.isfinite(seconds):
                    by_time.setdefault(key, []).append((seconds, value))
    data = config.get("data", {})
    return Run(
        path=run_dir,
        label=run_dir.name,
        policy=str(data.get("policy", "?")),
        max_seq_len=data.get("max_seq_len"),
        batch_size=config.get("train", {}).get("batch_size"),
        series=series,
        config=config,
        by_time=by_time,
        by_step=by_step,
        composition=_run_json_entry(run_dir, "composition"),
        floors=_run_json_entry(run_dir, "floors"),
        downstream=_run_json_entry(run_dir, "downstream"),
    )


def run_numbers(run: Run) -> dict[str, float]:
    """A run's numbers in the table: last real tokens and losses, real tokens/s from the totals (real
    tokens over training seconds: a median of per-step rates would weigh a slow step like a fast
    one), mean padding waste and pack utilization, its layout's truncated pairs (a fraction of all
    pairs), its training seconds, the composition audit's fragmented documents and cross-document
    visible tokens, the mean per-step `train/attention_cost` and the median `sys/load_per_cpu` while
    it trained (nan where the run has no value)."""
    audit = run.composition
    clock = run.by_time.get(LOSS, [])
    seconds = clock[-1][0] if clock else math.nan
    tokens = run.last("train/tokens")
    load = run.values("sys/load_per_cpu")
    return {
        "real_tokens": tokens,
        "train_loss": run.last("train/loss"),
        "val_loss": run.last("val/loss"),
        "tokens_per_sec": tokens / seconds if seconds > 0 else math.nan,
        "padding_waste": run.mean("train/padding_waste"),
        "pack_utilization": run.mean("train/pack_utilization"),
        "truncated_pairs": run.truncated_fraction(),
        "train_seconds": seconds,
        "fragmented_documents": float(audit.get("fragmented_documents", math.nan)),
        "cross_document_visible": float(audit.get("cross_document_visible_fraction", math.nan)),
        "attention_cost": run.mean("train/attention_cost"),
        "load_per_cpu": float(np.median(load)) if len(load) else math.nan,
    }
