"""What the arms' table measures per run (`metrics`): final and interpolated losses, a mixture's
components, the budget (updates, real and computed tokens), tokens/s and padding waste."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..training.run_record import LOSS, Run, run_numbers
from .statistics import interpolate_at

VAL_LOSS = "val/loss"
CONTEXT_GAIN = "val/context_gain"


@dataclass(frozen=True)
class Metric:
    """One section of the table: what is measured per run, at which x, and how it is printed."""

    key: str  # a stable id for compare.json and W&B (`val_loss`, `val_loss_at_tokens`, ...)
    name: str  # the section's heading (says which x)
    value: Callable[[Run], float]
    fmt: str = "{:.4f}"
    diff_fmt: str = "{:+.4f}"
    at: float | None = None  # the x it is read at: real tokens or training seconds
    missing: str = "no value"  # why a run has none, for the runs left out
    floored: bool = False  # a val loss on the cache's validation pairs: the floors are printed with it
    timed: bool = False  # read off wall-clock time: unreliable on a contended machine


def common_reach(runs: list[Run], attribute: str) -> float:
    """The largest x (`series`: real tokens, `by_time`: training seconds, `by_step`: optimizer steps)
    every run that validated reached in validation: the smallest of their last validations' x; nan
    when none validated."""
    reached = [
        getattr(run, attribute)[VAL_LOSS][-1][0] for run in runs if getattr(run, attribute).get(VAL_LOSS)
    ]
    return min(reached, default=math.nan)


COUNTED: dict[str, Any] = {"fmt": "{:,.0f}", "diff_fmt": "{:+,.0f}"}
"""How counts (updates, tokens, tokens/s) are printed: whole numbers with thousands separators."""


def metrics(
    runs: list[Run],
    at_tokens: float | None = None,
    at_seconds: float | None = None,
    at_step: float | None = None,
) -> list[Metric]:
    """The table's metrics; the interpolated ones at `at_tokens` / `at_seconds` / `at_step` or at the
    runs' common reach."""
    return [
        *_loss_metrics(),
        *_interpolated_metrics(runs, at_tokens, at_seconds, at_step),
        *_component_metrics(runs),
        *_context_metrics(runs),
        *_downstream_metrics(runs),
        *_budget_metrics(),
    ]


def _loss_metrics() -> list[Metric]:
    """The final train and val losses."""
    return [
        Metric("train_loss", "final train loss", lambda run: run.last(LOSS), missing="no train/loss"),
        Metric("val_loss", "final val loss", final_val_loss, missing="never validated", floored=True),
        Metric(
            "val_loss_last_two",
            "val loss, mean of the last two validations (less noise than one)",
            last_two_val_losses,
            missing="fewer than two validations",
            floored=True,
        ),
    ]


def _interpolated_metrics(
    runs: list[Run], at_tokens: float | None, at_seconds: float | None, at_step: float | None
) -> list[Metric]:
    """Val loss read at a common real-token count, training time and optimizer step."""
    return [
        _interpolated(
            "val_loss_at_tokens",
            runs,
            "series",
            at_tokens,
            "--at-tokens",
            "{:,.0f} real tokens",
            ("a common real-token count", "the most every run reached in validation"),
        ),
        _interpolated(
            "val_loss_at_seconds",
            runs,
            "by_time",
            at_seconds,
            "--at-seconds",
            "{:,.1f} training seconds",
            (
                "a common training time",
                "the longest every run reached in validation",
                "no run validated with step seconds logged",
            ),
        ),
        _interpolated(
            "val_loss_at_step",
            runs,
            "by_step",
            at_step,
            "--at-step",
            "optimizer step {:,.0f}",
            ("a common optimizer step", "the last step every run validated at"),
        ),
    ]


def _component_metrics(runs: list[Run]) -> list[Metric]:
    """A mixture's components (data/batching/mixture.py): each one's own validation pairs."""
    return [
        Metric(
            key.replace("/", "_"),
            f"final {key} (the {key.rsplit('/', 1)[1]} component's validation pairs)",
            partial(_last, key=key),
            missing=f"no {key}",
        )
        for key in component_losses(runs)
    ]


def _context_metrics(runs: list[Run]) -> list[Metric]:
    """Context use at the last validation (training/context_use.py), when any run scored it: a model
    whose gain is not above 0 does not use context, so composition cannot change what it learned."""
    if not any(len(run.values(CONTEXT_GAIN)) for run in runs):
        return []
    return [
        Metric(
            "context_gain",
            "context gain: loss from the previous token alone minus final val loss (> 0: uses context)",
            partial(_last, key=CONTEXT_GAIN),
            missing="no context gain (eval.context without 1, or stopped before its last validation)",
        ),
        Metric(
            "val_loss_context_1",
            "final val loss from the previous token alone (eval.context 1)",
            partial(_last, key="val/loss_by_context/1"),
            missing="no val/loss_by_context/1",
        ),
    ]


DOWNSTREAM_DETAILS = ("_stderr", "_low", "_high")
"""A downstream metric's spread and interval (per run): the arms' table has its own over seeds."""
DOWNSTREAM_COUNTS = {"examples", "documents", "documents_left_out", "targets", "bytes"}
DOWNSTREAM_CHECKS = {"reference_bits_per_byte", "difference"}  # pretrain_bpb's agreement, not a score
RECALL_VARIANTS = ("pretrain_recall_plain", "pretrain_recall_distractor", "pretrain_recall_cue_only")
"""Summed up in pretrain_recall's paired contrast (downstream/harness.py)."""


def downstream_keys(runs: list[Run]) -> list[tuple[str, str]]:
    """(task, metric) pairs any run's `pretrain lm-eval` recorded, in first-seen order: the scores,
    not their per-run stderrs and intervals, counts or checks."""
    pairs: dict[tuple[str, str], None] = {}
    for run in runs:
        for task, values in run.downstream.items():
            if task in RECALL_VARIANTS and "pretrain_recall" in run.downstream:
                continue
            for metric in values if isinstance(values, dict) else ():
                if metric.endswith(DOWNSTREAM_DETAILS) or metric in DOWNSTREAM_COUNTS | DOWNSTREAM_CHECKS:
                    continue
                pairs[(task, metric)] = None
    return list(pairs)


def _downstream_metrics(runs: list[Run]) -> list[Metric]:
    """`pretrain lm-eval`'s scores from run.json (docs/evaluation.md), each compared like val loss:
    per arm over its seeds, paired by seed."""
    return [
        Metric(
            f"downstream.{task}.{metric}",
            f"{task} {metric} (pretrain lm-eval on the run's checkpoint)",
            partial(_downstream, task=task, metric=metric),
            missing=f"no downstream.{task}.{metric} in run.json (run pretrain lm-eval --tasks {task})",
        )
        for task, metric in downstream_keys(runs)
    ]


def _downstream(run: Run, task: str, metric: str) -> float:
    value = (run.downstream.get(task) or {}).get(metric)
    return float(value) if isinstance(value, int | float) else math.nan


def _budget_metrics() -> list[Metric]:
    """What an arm spent: updates, real and computed tokens, tokens/s and padding waste."""
    return [
        Metric("updates", "updates (optimizer steps)", updates, missing="no step", **COUNTED),
        Metric(
            "real_tokens",
            "real training tokens",
            lambda run: run.last("train/tokens"),
            **COUNTED,
            missing="no train/tokens",
        ),
        Metric(
            "computed_tokens",
            "computed tokens (real + padding: the compute paid)",
            computed_tokens,
            **COUNTED,
            missing="no train/tokens or train/padding_waste",
        ),
        Metric(
            "tokens_per_sec",
            "real tokens/s (real tokens / training seconds)",
            lambda run: run_numbers(run)["tokens_per_sec"],
            timed=True,
            **COUNTED,
            missing="no train/tokens_per_sec",
        ),
        Metric(
            "padding_waste",
            "padding waste (mean of the run)",
            lambda run: run.mean("train/padding_waste"),
            fmt="{:.2%}",
            diff_fmt="{:+.2%}",
            missing="no train/padding_waste",
        ),
    ]


def final_val_loss(run: Run) -> float:
    return run.last(VAL_LOSS)


def last_two_val_losses(run: Run) -> float:
    values = run.values(VAL_LOSS)
    return float(values[-2:].mean()) if len(values) >= 2 else math.nan


def tokens_to_reach(run: Run, target: float) -> float:
    """The real tokens at which the run's val loss would reach `target` if it kept falling as over
    its second half of validations, linear in log(tokens) (a learning curve's usual shape at this
    scale; an estimate, never a promise): nan with fewer than 3 validations or a curve that is not
    falling there; the run's own tokens when it is already there."""
    curve = [(x, y) for x, y in run.series.get(VAL_LOSS, []) if x > 0]
    if len(curve) < 3:
        return math.nan
    if curve[-1][1] <= target:
        return curve[-1][0]
    tail = np.array(curve[len(curve) // 2 :], dtype=float)
    slope, intercept = np.polyfit(np.log(tail[:, 0]), tail[:, 1], 1)
    if not slope < 0:
        return math.nan
    return float(np.exp((target - intercept) / slope))


def updates(run: Run) -> float:
    """The run's optimizer steps: its last logged step."""
    steps = run.by_step.get(LOSS, [])
    return float(steps[-1][0]) if steps else math.nan


def computed_tokens(run: Run) -> float:
    """Real plus padding tokens the run computed: each logged row's new real tokens / (1 - its
    padding waste); exact when every step is logged (train.log_every_n_steps=1), else an estimate
    from the logged steps' waste."""
    waste = run.series.get("train/padding_waste", [])
    if not waste:
        return math.nan
    total, previous = 0.0, 0.0
    for tokens, fraction in waste:
        total += (tokens - previous) / (1.0 - fraction) if fraction < 1 else math.nan
        previous = tokens
    return total


def _last(run: Run, key: str) -> float:
    return run.last(key)


def _interpolated(
    key: str,
    runs: list[Run],
    axis: str,
    chosen: float | None,
    option: str,
    at_fmt: str,
    default: tuple[str, ...],
) -> Metric:
    """val loss read on `axis` (a Run series: real tokens, seconds or steps) at `chosen` (its `option`)
    or, by default, at the runs' common reach; `default` = (the x in words, how the default is chosen,
    optionally why no run has one)."""
    x = float(chosen) if chosen is not None else common_reach(runs, axis)
    at, how = at_fmt.format(x), option if chosen is not None else default[1]
    if not math.isfinite(x):
        at, how = default[0], default[2] if len(default) > 2 else "no run validated"
    return Metric(
        key,
        f"val loss at {at} (interpolated; {how})",
        lambda run: interpolate_at(getattr(run, axis).get(VAL_LOSS, []), x),
        at=x,
        missing=f"validations do not span {at}: not extrapolated",
        floored=True,
        timed=axis == "by_time",
    )


def component_losses(runs: list[Run]) -> list[str]:
    """`val/loss/<component>` keys of mixture runs, in first-seen order (val/loss_by_position is not one)."""
    keys = (key for run in runs for key in run.series)
    return list(dict.fromkeys(k for k in keys if k.startswith(VAL_LOSS + "/") and k.count("/") == 2))
