"""The contrasts rendered: compare.md's section (one table per metric, a row per cell and the pooled
line), and the rows of compare.json and W&B's `compare/contrasts` (`CONTRAST_FIELDS`)."""

from __future__ import annotations

import math

from .arm_metrics import Metric
from .arm_render import p_text
from .contrasts import Contrast, ContrastTable, describe
from .statistics import ALPHA, POWER, TOO_FEW

CONTRAST_FIELDS = (
    "factor",
    "level",
    "reference",
    "setting",
    "metric",
    "at",
    "n",
    "n_reference",
    "mean",
    "reference_mean",
    "diff",
    "ci_low",
    "ci_high",
    "p",
    "p_holm",
    "mde",
    "test",
    "pooled",
)
"""One contrast as compare.json and W&B hold it (numbers as numbers, None where there is none)."""


def _json_value(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def contrast_record(c: Contrast) -> dict[str, object]:
    """A contrast as a JSON object in CONTRAST_FIELDS order."""
    return {name: _json_value(getattr(c, name)) for name in CONTRAST_FIELDS}


def wandb_contrast_rows(table: ContrastTable) -> list[list]:
    """The contrasts as W&B table rows (the setting spelled as the summary spells it)."""
    rows = []
    for c in table.contrasts:
        record = contrast_record(c)
        record["setting"] = describe(c.setting) if not c.pooled else "pooled"
        rows.append(list(record.values()))
    return rows


def _number(fmt: str, value: float) -> str:
    return fmt.format(value) if math.isfinite(value) else "n/a"


def interval_text(c: Contrast, fmt: str = "{:+.4f}") -> str:
    """`-0.0123 [-0.0301, +0.0055]`, or the difference alone without a test."""
    text = _number(fmt, c.diff)
    if math.isfinite(c.ci_low):
        text += f" [{_number(fmt, c.ci_low)}, {_number(fmt, c.ci_high)}]"
    return text


def _metric_formats(metrics: list[Metric]) -> dict[str, tuple[str, str]]:
    return {metric.key: (metric.fmt, metric.diff_fmt) for metric in metrics}


COLUMNS = ("cell", "n", "level mean", "reference mean", "diff [95% CI]", "p", "Holm p", "MDE", "test")


def contrast_markdown(table: ContrastTable, metrics: list[Metric]) -> list[str]:
    """compare.md's contrasts section: the legend, then per metric one row per (cell, level) and the
    pooled line per level; the cells a level is missing from."""
    formats = _metric_formats(metrics)
    keys = ", ".join(key.split(".")[-1] for key in table.keys) or "no other key"
    lines = [
        f"## contrasts: {table.factor} at matched settings (cells: {keys})",
        "",
        f"Each level of `{table.factor}` against `{table.reference}` inside each cell (runs that agree on "
        f"every other varied key): diff = level - reference with its {1 - ALPHA:.0%} t interval, paired "
        "by seed where both ran the same seeds (Welch otherwise, `n<2`: fewer than 2 seeds, no test); Holm "
        "p over every cell and level of the metric; MDE: the smallest true difference detected with "
        f"{POWER:.0%} power. `pooled`: the per-cell differences of the means as blocks (a one-sample t "
        "over cells, n = cells), Holm over the levels; it answers whether the level helps across the "
        "sweep, not at each setting.",
    ]
    for metric in dict.fromkeys(c.metric for c in table.contrasts):
        rows = table.rows(metric)
        fmt, diff_fmt = formats.get(metric, ("{:.4f}", "{:+.4f}"))
        lines += ["", f"### {rows[0].metric_name}", ""]
        lines += ["| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
        for c in rows:
            cell = f"**pooled over {c.n} cells**" if c.pooled else describe(c.setting)
            if len(table.levels) > 2:
                cell = f"{c.level}: {cell}"
            at = f" (at {c.at:,.1f})" if c.at is not None and math.isfinite(c.at) else ""
            n = str(c.n) if c.pooled or c.test != TOO_FEW else f"{c.n} vs {c.n_reference}"
            cells = [cell + at, n, _number(fmt, c.mean), _number(fmt, c.reference_mean)]
            cells += [interval_text(c, diff_fmt), p_text(c.p), p_text(c.p_holm), _number(fmt, c.mde), c.test]
            lines.append("| " + " | ".join(cells) + " |")
    if table.missing:
        lines += ["", "cells without every level (no contrast there):"]
        lines += [f"- {describe(setting)}: no {', '.join(levels)} run" for setting, levels in table.missing]
    return lines


def arm_contrast_labels(table: ContrastTable, metric: str = "val_loss") -> dict[int, str]:
    """Per arm (by id), for the figure's legend: its final val loss against the reference level in its
    own cell (`vs padded here: -0.052 [-0.090, -0.014], Holm p 0.031 (paired t)`), `reference here`
    for the reference level's arm of a cell that has a contrast. Arms of a cell without the reference
    get none: nothing at matched settings to say."""
    labels: dict[int, str] = {}
    for c in table.rows(metric, pooled=False):
        cell = next(cell for cell in table.cells if cell.setting == c.setting)
        labels[id(cell.arms[table.reference])] = "reference here"
        if c.test == TOO_FEW:
            text = f"{c.diff:+.3f} (n<2: no test)"
        else:
            text = f"{c.diff:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}], Holm p {p_text(c.p_holm)} ({c.test})"
        labels[id(cell.arms[c.level])] = f"vs {c.reference} here: final val {text}"
    return labels
