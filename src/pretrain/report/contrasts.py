"""Contrasts at matched settings: what one factor (by default `data.policy`) changes *within each
combination of the other keys a sweep varied* (a cell), seeds paired inside a cell.

A sweep `data=padded,bestfit train.batch_size=4,8 data.max_seq_len=128,256 seed=0,1` has 4 cells
(batch_size x max_seq_len); in each, bestfit is contrasted with padded on every metric of the arms'
table (arm_metrics.py; the interpolated ones at the cell's own common reach): n, the two means, the
difference with its 95% t interval, p, Holm's p over all cells of that metric and level, and the
detectable effect (statistics.py: paired by seed where both arms ran the same seeds, Welch otherwise,
`n<2` without a test). Then one pooled line per level: the cells as blocks (the per-cell differences
of the means, a one-sample t over cells), so a sweep without seeds still gets an interval from 3 cells.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import ConfigError
from .arm_metrics import metrics
from .arm_table import seed_values
from .arms import NOT_SWEPT, SEED, Arm, flat_config, layout_label, policy_keys, swept_keys
from .statistics import TOO_FEW, Comparison, compare_to_reference, holm, summarize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contrast:
    """One level of the factor against the reference level, in one cell (or pooled over cells), on one
    metric. `setting` holds the cell's values of the other varied keys (`{"train.batch_size": "4"}`;
    empty for a pooled line). Numbers are nan where they do not exist (no test: `test == "n<2"`)."""

    factor: str  # the contrasted key, e.g. "data.policy"
    level: str  # e.g. "bestfit"
    reference: str  # e.g. "padded"
    setting: dict[str, str]
    metric: str  # the metric's key (arm_metrics.Metric.key), e.g. "val_loss"
    metric_name: str  # its heading in compare.md, e.g. "final val loss"
    at: float | None  # the x an interpolated metric is read at (tokens, seconds or step); else None
    n: int  # pairs (paired t), the level's values (Welch), cells (pooled)
    n_reference: int
    mean: float
    reference_mean: float
    diff: float  # level - reference
    ci_low: float
    ci_high: float
    p: float
    p_holm: float
    mde: float
    test: str  # "paired t", "Welch t", "n<2"; pooled: "paired t (cells as blocks)"
    pooled: bool = False


DEFAULT_FACTOR = "data.policy"
"""The factor contrasted when `--contrast` is not given and the runs vary it: what packing buys."""
POOLED_TEST = "paired t (cells as blocks)"
GENERIC_NAMES = {
    "val_loss_at_tokens": "val loss at equal real tokens (each cell's common reach)",
    "val_loss_at_seconds": "val loss at equal training seconds (each cell's common reach)",
    "val_loss_at_step": "val loss at an equal optimizer step (each cell's common reach)",
}
"""Contrast names of the interpolated metrics, whose x is each cell's own (`Contrast.at`)."""


@dataclass(frozen=True)
class Cell:
    """One combination of the other varied keys' values, and the arm of each factor level in it."""

    setting: dict[str, str]
    arms: dict[str, Arm]  # level -> arm


@dataclass(frozen=True)
class ContrastTable:
    factor: str
    reference: str  # the reference level
    levels: list[str]  # every level, the reference first
    keys: list[str]  # the keys that make a cell
    cells: list[Cell]
    contrasts: list[Contrast]
    missing: list[tuple[dict[str, str], list[str]]]  # (a cell's setting, the levels it lacks)

    def rows(self, metric: str, pooled: bool | None = None) -> list[Contrast]:
        """The contrasts of one metric (key), cells first then the pooled lines; `pooled` filters."""
        return [c for c in self.contrasts if c.metric == metric and (pooled is None or c.pooled == pooled)]


def spelled(value: object) -> str:
    """A config value as an override spells it: `false`, `128`, `concat`."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _partial_keys(arms: list[Arm]) -> list[str]:
    """Keys only some arms have (one policy's own option, `data.packing_buffer`) whose values differ
    among the arms that have them: they tell a policy's arms apart within a cell."""
    flats = [flat_config(arm.config) for arm in arms]
    every = set.intersection(*(set(flat) for flat in flats)) if flats else set()
    keys = []
    for key in sorted(set().union(*flats) - every) if flats else []:
        if key == SEED or key.startswith(NOT_SWEPT):
            continue
        if len({repr(flat[key]) for flat in flats if key in flat}) > 1:
            keys.append(key)
    return keys


def _without(label: str, factor: str) -> str:
    """A layout label without the factor's own `name=value` (the cell of a layout option's levels)."""
    name = factor.split(".")[-1] + "="
    return " ".join(part for part in label.split(" ") if not part.startswith(name))


def varied_factors(arms: list[Arm]) -> list[str]:
    """The keys a contrast can take: `data.policy` when the arms' layouts differ, a layout option that
    differs, and every other key the arms differ in (swept_keys)."""
    configured = [arm for arm in arms if arm.config]
    flats = [flat_config(arm.config) for arm in configured]
    keys = []
    if len({layout_label(arm, configured) for arm in configured}) > 1:
        keys.append(DEFAULT_FACTOR)
    for key in sorted(policy_keys() - {DEFAULT_FACTOR}):
        if all(key in flat for flat in flats) and len({repr(flat[key]) for flat in flats}) > 1:
            keys.append(key)
    return keys + swept_keys([arm.runs[0] for arm in configured], ignored=(SEED,))


def choose_factor(arms: list[Arm], requested: str | None) -> str | None:
    """`--contrast KEY` checked against what the arms vary; without one, `data.policy` when it varies
    (else None: no contrasts, the arms' table alone)."""
    factors = varied_factors(arms)
    if requested is None:
        return DEFAULT_FACTOR if DEFAULT_FACTOR in factors else None
    if requested not in factors:
        choices = ", ".join(factors) or "none: the runs differ only in seed"
        raise ConfigError(
            f"--contrast {requested}: the compared runs do not vary it; keys they vary: {choices}"
        )
    return requested


def _level(arm: Arm, arms: list[Arm], factor: str, partial: list[str]) -> str:
    flat = flat_config(arm.config)
    if factor != DEFAULT_FACTOR:
        return spelled(flat.get(factor))
    extra = [f"{key.split('.')[-1]}={spelled(flat[key])}" for key in partial if key in flat]
    return " ".join([layout_label(arm, arms), *extra])


def cells_of(arms: list[Arm], factor: str) -> tuple[list[str], list[Cell], list[str]]:
    """(the keys that make a cell, the cells in the order of their first arm, the levels in the order
    first seen). A cell is the arms that agree on every other varied key; for a factor other than
    `data.policy` the layout (policy and layout options, the factor's own left out) is one of them."""
    configured = [arm for arm in arms if arm.config]
    partial = _partial_keys(configured) if factor == DEFAULT_FACTOR else []
    keys = [key for key in swept_keys([arm.runs[0] for arm in configured], ignored=(SEED,)) if key != factor]
    layouts = {_without(layout_label(arm, configured), factor) for arm in configured}
    by_layout = factor != DEFAULT_FACTOR and len(layouts) > 1
    cells: dict[tuple, Cell] = {}
    levels: list[str] = []
    for arm in configured:
        flat = flat_config(arm.config)
        setting = {key: spelled(flat.get(key)) for key in keys}
        if by_layout:
            setting = {"layout": _without(layout_label(arm, configured), factor), **setting}
        level = _level(arm, configured, factor, partial)
        cell = cells.setdefault(tuple(setting.items()), Cell(setting, {}))
        if level in cell.arms:
            log.warning(
                f"{arm.label}: a second arm of {factor}={level} at {describe(setting)}: left out of the "
                f"contrasts (they differ in a key only some runs have; compare them with --contrast KEY)"
            )
            continue
        cell.arms[level] = arm
        levels.append(level)
    return (["layout"] if by_layout else []) + keys, list(cells.values()), list(dict.fromkeys(levels))


def describe(setting: dict[str, str]) -> str:
    """A cell as the summary prints it: `batch_size=4 max_seq_len=128` (every cell, when only one)."""
    return " ".join(f"{key.split('.')[-1]}={value}" for key, value in setting.items()) or "all runs"


def reference_level(levels: list[str], cells: list[Cell], factor: str, reference: Arm | None) -> str:
    """The level the others are contrasted with: the `--reference` arm's, else for `data.policy` the
    first baseline policy's (padded), else the first level seen."""
    if reference is not None:
        for cell in cells:
            for level, arm in cell.arms.items():
                if arm is reference:
                    return level
    if factor == DEFAULT_FACTOR:
        from ..data.batching.policies import REGISTRY

        baselines = {str(name) for name, policy in REGISTRY.items() if policy.baseline}
        for level in levels:
            if level.split(" ")[0] in baselines:
                return level
    return levels[0]


def contrast_table(
    arms: list[Arm],
    factor: str,
    reference: Arm | None = None,
    at_tokens: float | None = None,
    at_seconds: float | None = None,
    at_step: float | None = None,
    paired: bool = True,
) -> ContrastTable:
    """Every level against the reference level in every cell on every metric of the arms' table (the
    interpolated metrics at the cell's own common reach unless `at_*` fixes x), Holm over the cells
    and levels of each metric; then one pooled line per level and metric over the cells where both
    have a value (cells as blocks), Holm over the levels."""
    keys, cells, levels = cells_of(arms, factor)
    ref = reference_level(levels, cells, factor, reference)
    levels = [ref, *(level for level in levels if level != ref)]
    contrasts: list[Contrast] = []
    pooled: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}  # (metric, level) -> cell means
    names: dict[str, str] = {}
    missing = [
        (cell.setting, [level for level in levels if level not in cell.arms])
        for cell in cells
        if any(level not in cell.arms for level in levels)
    ]
    for index, cell in enumerate(cells):
        if ref not in cell.arms or len(cell.arms) < 2:
            continue
        base = cell.arms[ref]
        runs = [run for arm in cell.arms.values() for run in arm.runs]
        for metric in metrics(runs, at_tokens, at_seconds, at_step):
            names.setdefault(metric.key, GENERIC_NAMES.get(metric.key, metric.name))
            values = {id(run): metric.value(run) for run in runs}
            base_mean = summarize([values[id(run)] for run in base.runs]).mean
            for level, arm in cell.arms.items():
                if level == ref:
                    continue
                c = compare_to_reference(seed_values(arm, values), seed_values(base, values), paired)
                mean = summarize([values[id(run)] for run in arm.runs]).mean
                contrasts.append(
                    _contrast(
                        factor, level, ref, cell.setting, metric.key, names, metric.at, c, mean, base_mean
                    )
                )
                if math.isfinite(mean) and math.isfinite(base_mean):
                    pooled.setdefault((metric.key, level), {})[index] = (mean, base_mean)
    contrasts = _holm_by_metric(contrasts)
    lines = []
    for (key, level), means in pooled.items():
        if len([cell for cell in cells if ref in cell.arms and level in cell.arms]) < 2:
            continue  # one cell: its own line says it all
        c = compare_to_reference({i: m[0] for i, m in means.items()}, {i: m[1] for i, m in means.items()})
        c = replace(c, test=POOLED_TEST if c.test != TOO_FEW else TOO_FEW)
        level_mean = float(np.mean([m[0] for m in means.values()]))
        ref_mean = float(np.mean([m[1] for m in means.values()]))
        lines.append(
            _contrast(factor, level, ref, {}, key, names, None, c, level_mean, ref_mean, pooled=True)
        )
    return ContrastTable(factor, ref, levels, keys, cells, contrasts + _holm_by_metric(lines), missing)


def _contrast(
    factor: str,
    level: str,
    ref: str,
    setting: dict[str, str],
    key: str,
    names: dict[str, str],
    at: float | None,
    c: Comparison,
    mean: float,
    ref_mean: float,
    pooled: bool = False,
) -> Contrast:
    return Contrast(
        factor=factor,
        level=level,
        reference=ref,
        setting=dict(setting),
        metric=key,
        metric_name=names[key],
        at=at,
        n=c.n,
        n_reference=c.n_reference,
        mean=mean,
        reference_mean=ref_mean,
        diff=c.diff,
        ci_low=c.low,
        ci_high=c.high,
        p=c.p,
        p_holm=math.nan,
        mde=c.mde,
        test=c.test,
        pooled=pooled,
    )


def _holm_by_metric(contrasts: list[Contrast]) -> list[Contrast]:
    """Holm's adjustment over each metric's contrasts (every cell and level of it)."""
    adjusted = list(contrasts)
    for key in dict.fromkeys(c.metric for c in contrasts):
        indices = [i for i, c in enumerate(contrasts) if c.metric == key]
        for i, p in zip(indices, holm([contrasts[i].p for i in indices]), strict=True):
            adjusted[i] = replace(contrasts[i], p_holm=p)
    return adjusted
