"""`pretrain compare DIR...`: loss and padding waste of runs or whole multiruns, side by side.

A run directory is any directory with a `metrics.csv` (our CSV logger's output); a multirun
directory is searched for them. Writes a PNG (loss against real tokens seen, padding waste, tokens/s,
pack utilization per run) and a markdown table next to it.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from ..errors import ConfigError


@dataclass
class Run:
    path: Path
    label: str
    policy: str
    max_seq_len: int | None
    batch_size: int | None
    series: dict[str, list[tuple[float, float]]]  # metric -> [(tokens, value)]

    def values(self, metric: str) -> np.ndarray:
        return np.array([v for _, v in self.series.get(metric, [])], dtype=float)

    def last(self, metric: str) -> float:
        values = self.values(metric)
        return float(values[-1]) if len(values) else math.nan

    def mean(self, metric: str) -> float:
        values = self.values(metric)
        return float(values.mean()) if len(values) else math.nan


def find_runs(directories: list[Path]) -> list[Path]:
    runs = []
    for directory in directories:
        if not directory.exists():
            raise ConfigError(f"{directory} does not exist")
        found = sorted(p.parent for p in directory.rglob("metrics.csv"))
        if not found:
            raise ConfigError(f"no metrics.csv under {directory}: is it a run or multirun output directory?")
        runs.extend(found)
    return list(dict.fromkeys(runs))


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


def load_run(run_dir: Path) -> Run:
    config = _load_config(run_dir)
    series: dict[str, list[tuple[float, float]]] = {}
    tokens = 0.0
    with open(run_dir / "metrics.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("train/tokens"):
                tokens = float(row["train/tokens"])
            for key, value in row.items():
                if key in ("step", "epoch") or value in ("", None):
                    continue
                series.setdefault(key, []).append((tokens, float(value)))
    data = config.get("data", {})
    return Run(
        path=run_dir,
        label=_label(run_dir, config),
        policy=str(data.get("policy", "?")),
        max_seq_len=data.get("max_seq_len"),
        batch_size=config.get("train", {}).get("batch_size"),
        series=series,
    )


def _drop_shared_label_parts(runs: list[Run]) -> None:
    """In a sweep, overrides every run shares say nothing: keep what tells runs apart."""
    if len(runs) < 2:
        return
    parts = [run.label.split(" ") for run in runs]
    shared = set(parts[0]).intersection(*parts[1:])
    for run, words in zip(runs, parts, strict=True):
        run.label = " ".join(w for w in words if w not in shared) or run.label


def markdown_table(runs: list[Run]) -> str:
    columns = ["run", "policy", "max_seq_len", "batch", "real tokens", "train loss", "val loss", "tokens/s"]
    columns += ["padding waste", "pack util"]
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for run in runs:
        speeds = run.values("train/tokens_per_sec")
        cells = [run.label, run.policy, run.max_seq_len, run.batch_size, f"{run.last('train/tokens'):,.0f}"]
        cells += [f"{run.last('train/loss'):.4f}", f"{run.last('val/loss'):.4f}"]
        cells += [f"{np.median(speeds) if len(speeds) else math.nan:,.0f}"]
        cells += [f"{run.mean('train/padding_waste'):.1%}", f"{run.mean('train/pack_utilization'):.1%}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def _short(label: str) -> str:
    """`data=padded train.batch_size=2` -> `padded batch_size=2`: room for the numbers."""
    return " ".join(
        w.removeprefix("data=").removeprefix("data.").removeprefix("train.") for w in label.split(" ")
    )


def plot(runs: list[Run], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(15, 10))
    grid = fig.add_gridspec(2, 3, height_ratios=[1.2, 1])
    colors = [plt.rcParams["axes.prop_cycle"].by_key()["color"][i % 10] for i in range(len(runs))]
    labels = [_short(run.label) for run in runs]
    ax = fig.add_subplot(grid[0, :])
    for run, label, color in zip(runs, labels, colors, strict=True):
        train = np.array(run.series.get("train/loss", []))
        if len(train):
            ax.plot(train[:, 0], train[:, 1], color=color, alpha=0.8, label=label)
        val = np.array(run.series.get("val/loss", []))
        if len(val):
            ax.plot(val[:, 0], val[:, 1], "o--", color=color, markersize=5)
    ax.set(
        xlabel="real tokens seen",
        ylabel="loss (lines: train, dots: validation)",
        title="loss against real tokens seen",
    )
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    y = np.arange(len(runs))
    panels = (
        ("train/padding_waste", "padding waste (pad rows / computed rows)", "{:.1%}", np.mean),
        ("train/tokens_per_sec", "real tokens / s (median)", "{:,.0f}", np.median),
        ("train/pack_utilization", "pack utilization (real / packs x capacity)", "{:.1%}", np.mean),
    )
    for column, (metric, title, fmt, reduce) in enumerate(panels):
        assert callable(reduce)
        ax = fig.add_subplot(grid[1, column])
        values = [float(reduce(run.values(metric))) if len(run.values(metric)) else math.nan for run in runs]
        bars = ax.barh(y, values, color=colors)
        ax.set_yticks(y, labels if column == 0 else [""] * len(runs), fontsize=8)
        ax.invert_yaxis()  # the legend's order, top to bottom
        ax.set_title(title, fontsize=10)
        ax.bar_label(bars, labels=[fmt.format(v) for v in values], fontsize=7)
        ax.margins(x=0.2)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    plt.close(fig)


def compare(directories: list[Path], output: Path | None = None, quiet: bool = False) -> Path:
    """Write the comparison PNG (and a .md table beside it); returns the PNG path."""
    runs = [load_run(path) for path in find_runs([Path(d) for d in directories])]
    _drop_shared_label_parts(runs)
    output = Path(output) if output else Path(directories[0]) / "compare.png"
    plot(runs, output)
    table = markdown_table(runs)
    output.with_suffix(".md").write_text(table)
    if not quiet:
        print(table)
        print(f"plot: {output.resolve()}")
    return output.resolve()
