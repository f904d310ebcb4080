"""The arms' table: each metric's mean, std and n over an arm's seeds, and each arm's comparison with
a reference arm (statistics.py): the difference with its 95% t confidence interval, p, the Holm-
adjusted p over the arms compared with that reference, the detectable effect at 80% power and the
test used (paired by seed when both arms ran the same seeds, Welch otherwise; `n<2` without a test).

The metrics, per run, then summarized over the arm's seeds:
* final train loss and final val loss (the last logged value);
* val loss at a common real-token count: by default the largest count every run reached in validation
  (`--at-tokens N` chooses it), read linearly between the two validations around it;
* val loss at a common training time (seconds of data + update steps, validation left out, as the
  figure's time axis): by default the longest every run reached in validation (`--at-seconds S`);
* val loss at a common optimizer step: by default the last step every run validated at
  (`--at-step N`). At equal real tokens a layout with fewer real tokens per update (padding) has
  taken more updates: this row separates the two;
* a mixture's final `val/loss/<component>`, one section per component (data/mixture.py);
* real tokens/s (the run's real tokens over its training seconds) and padding waste (the run's mean);
* the budget: updates, real and computed tokens (arm_table's budget section flags unequal ones).
Time-based rows are marked unreliable when a run's machine was contended (`sys/load_per_cpu`).
A run without a value (it never validated, or its validations do not span the chosen x: it stopped
short of it or first validated after it; nothing is extrapolated) is left out of that metric's n and
named under its section.

Reference: `--reference LABEL` (an arm's label as the table prints it), by default the first padded
arm (the baseline), else the first arm, when there are several; none for a single arm.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..training.run_record import LOSS, Run, run_numbers
from . import floors as floor_models
from .arms import Arm
from .statistics import (
    Comparison,
    Summary,
    compare_to_reference,
    holm,
    interpolate_at,
    summarize,
)

VAL_LOSS = "val/loss"


@dataclass(frozen=True)
class Metric:
    """One section of the table: what is measured per run, at which x, and how it is printed."""

    name: str  # the section's heading (says which x)
    value: Callable[[Run], float]
    fmt: str = "{:.4f}"
    diff_fmt: str = "{:+.4f}"
    at: float | None = None  # the x it is read at: real tokens or training seconds
    missing: str = "no value"  # why a run has none, for the runs left out
    floored: bool = False  # a val loss on the cache's validation pairs: the floors are printed with it
    timed: bool = False  # read off wall-clock time: unreliable on a contended machine


@dataclass(frozen=True)
class Row:
    arm: Arm
    summary: Summary
    comparison: Comparison | None  # None: the reference itself, or no reference


@dataclass(frozen=True)
class Section:
    metric: Metric
    rows: list[Row]
    left_out: list[Run]  # runs without a value for this metric


CONTENDED = 1.5
"""A run whose median `sys/load_per_cpu` is above this shared its CPUs with other work (its own
threads make about 1): its times measure the machine's load as much as its layout."""
EQUAL_WITHIN = 0.05
"""Arms whose updates or real tokens differ from the reference's by more than this are flagged."""


@dataclass(frozen=True)
class Budget:
    """What an arm was given (means over its seeds) and how far it is from the reference's."""

    arm: Arm
    updates: float
    real_tokens: float
    computed_tokens: float
    seconds: float
    updates_vs_reference: float  # arm / reference - 1; nan for the reference or without one
    tokens_vs_reference: float

    def unequal(self) -> list[str]:
        """What differs from the reference by more than EQUAL_WITHIN: `updates +43%`, `real tokens -30%`."""
        return [
            f"{name} {ratio:+.0%}"
            for name, ratio in (
                ("updates", self.updates_vs_reference),
                ("real tokens", self.tokens_vs_reference),
            )
            if math.isfinite(ratio) and abs(ratio) > EQUAL_WITHIN
        ]


@dataclass(frozen=True)
class Floors:
    """An arm's floors (nats per validation pair; nan where run.json has none) and how many of its
    seeds' final val losses are below the bigram floor (of those with both)."""

    arm: Arm
    unigram: float
    bigram: float
    val_loss: float
    below_bigram: int
    judged: int
    tokens_to_bigram: float = math.nan  # median over seeds of `tokens_to_reach` the bigram floor


@dataclass(frozen=True)
class ArmTable:
    sections: list[Section]
    reference: Arm | None
    paired: bool = True  # False: --unpaired, Welch everywhere
    budgets: list[Budget] = field(default_factory=list)
    floors: list[Floors] = field(default_factory=list)
    contended: list[tuple[Run, float]] = field(default_factory=list)  # (run, its median load per CPU)


def contended_runs(runs: list[Run]) -> list[tuple[Run, float]]:
    """The runs whose median load per CPU was above CONTENDED, with it."""
    loads = [(run, run_numbers(run)["load_per_cpu"]) for run in runs]
    return [(run, load) for run, load in loads if math.isfinite(load) and load > CONTENDED]


def contention_note(table: ArmTable) -> str:
    """The warning a time-based section carries when a compared run's machine was contended."""
    if not table.contended:
        return ""
    worst_run, worst = max(table.contended, key=lambda pair: pair[1])
    return (
        f"UNRELIABLE: {len(table.contended)} run(s) shared the machine with other work (median load "
        f"per CPU above {CONTENDED}; up to {worst:.1f} in {worst_run.path}): their times measure the "
        "load as much as the layout. Compare throughput with `make bench` (side by side in one process)."
    )


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
        *_budget_metrics(),
    ]


def _loss_metrics() -> list[Metric]:
    """The final train and val losses."""
    return [
        Metric("final train loss", lambda run: run.last(LOSS), missing="no train/loss"),
        Metric("final val loss", final_val_loss, missing="never validated", floored=True),
        Metric(
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
            runs,
            "series",
            at_tokens,
            "--at-tokens",
            "{:,.0f} real tokens",
            ("a common real-token count", "the most every run reached in validation"),
        ),
        _interpolated(
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
            runs,
            "by_step",
            at_step,
            "--at-step",
            "optimizer step {:,.0f}",
            ("a common optimizer step", "the last step every run validated at"),
        ),
    ]


def _component_metrics(runs: list[Run]) -> list[Metric]:
    """A mixture's components (data/mixture.py): each one's own validation pairs."""
    return [
        Metric(
            f"final {key} (the {key.rsplit('/', 1)[1]} component's validation pairs)",
            partial(_last, key=key),
            missing=f"no {key}",
        )
        for key in component_losses(runs)
    ]


def _budget_metrics() -> list[Metric]:
    """What an arm spent: updates, real and computed tokens, tokens/s and padding waste."""
    return [
        Metric("updates (optimizer steps)", updates, missing="no step", **COUNTED),
        Metric(
            "real training tokens",
            lambda run: run.last("train/tokens"),
            **COUNTED,
            missing="no train/tokens",
        ),
        Metric(
            "computed tokens (real + padding: the compute paid)",
            computed_tokens,
            **COUNTED,
            missing="no train/tokens or train/padding_waste",
        ),
        Metric(
            "real tokens/s (real tokens / training seconds)",
            lambda run: run_numbers(run)["tokens_per_sec"],
            timed=True,
            **COUNTED,
            missing="no train/tokens_per_sec",
        ),
        Metric(
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
    runs: list[Run], axis: str, chosen: float | None, option: str, at_fmt: str, default: tuple[str, ...]
) -> Metric:
    """val loss read on `axis` (a Run series: real tokens, seconds or steps) at `chosen` (its `option`)
    or, by default, at the runs' common reach; `default` = (the x in words, how the default is chosen,
    optionally why no run has one)."""
    x = float(chosen) if chosen is not None else common_reach(runs, axis)
    at, how = at_fmt.format(x), option if chosen is not None else default[1]
    if not math.isfinite(x):
        at, how = default[0], default[2] if len(default) > 2 else "no run validated"
    return Metric(
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


def reference_arm(arms: list[Arm], label: str | None) -> Arm | None:
    """The arm `--reference LABEL` names. Without one: the first arm of a baseline policy (padded: what
    packing is measured against, wherever the sweep put it), else the first arm; none for a single arm."""
    if label is None:
        if len(arms) < 2:
            return None
        from ..data.policies import REGISTRY

        baselines = {str(name) for name, policy in REGISTRY.items() if policy.baseline}
        return next((arm for arm in arms if arm.runs[0].policy in baselines), arms[0])
    for arm in arms:
        if arm.label == label:
            return arm
    choices = "; ".join(repr(arm.label) for arm in arms)
    raise ConfigError(f"--reference {label!r} is not one of the compared arms: choose one of {choices}")


def seed_values(arm: Arm, values: dict[int, float]) -> dict[object, float]:
    """The arm's values keyed by seed; an arm that repeats a seed is keyed by run (it cannot pair)."""
    seeds = arm.seeds
    if len(set(map(repr, seeds))) < len(seeds):
        return {
            (repr(seed), i): values[id(run)]
            for i, (seed, run) in enumerate(zip(seeds, arm.runs, strict=True))
        }
    return {repr(seed): values[id(run)] for seed, run in zip(seeds, arm.runs, strict=True)}


def arm_table(
    arms: list[Arm],
    reference: str | None = None,
    at_tokens: float | None = None,
    at_seconds: float | None = None,
    at_step: float | None = None,
    paired: bool = True,
) -> ArmTable:
    """Each metric's summary per arm and its comparison with the reference arm (paired by seed where
    both ran the same seeds and `paired`), the p values Holm-adjusted per metric across the arms."""
    ref = reference_arm(arms, reference)
    runs = [run for arm in arms for run in arm.runs]
    sections = []
    for metric in metrics(runs, at_tokens, at_seconds, at_step):
        values = {id(run): metric.value(run) for run in runs}
        summaries = {id(arm): summarize([values[id(run)] for run in arm.runs]) for arm in arms}
        comparisons = {
            id(arm): compare_to_reference(seed_values(arm, values), seed_values(ref, values), paired)
            for arm in arms
            if ref is not None and arm is not ref
        }
        adjusted = holm([c.p for c in comparisons.values()])
        comparisons = {
            key: replace(c, holm=p) for (key, c), p in zip(comparisons.items(), adjusted, strict=True)
        }
        rows = [Row(arm, summaries[id(arm)], comparisons.get(id(arm))) for arm in arms]
        left_out = [run for run in runs if not math.isfinite(values[id(run)])]
        sections.append(Section(metric, rows, left_out))
    return ArmTable(sections, ref, paired, budgets(arms, ref), arm_floors(arms), contended_runs(runs))


def _median(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else math.nan


def budgets(arms: list[Arm], ref: Arm | None) -> list[Budget]:
    """Each arm's updates, real and computed tokens and training seconds, against the reference's."""

    def mean(arm: Arm, value: Callable[[Run], float]) -> float:
        return summarize([value(run) for run in arm.runs]).mean

    def tokens(run: Run) -> float:
        return run.last("train/tokens")

    def seconds(run: Run) -> float:
        return run_numbers(run)["train_seconds"]

    def versus(arm: Arm, value: Callable[[Run], float]) -> float:
        if ref is None or arm is ref:
            return math.nan
        return mean(arm, value) / mean(ref, value) - 1.0

    return [
        Budget(
            arm,
            mean(arm, updates),
            mean(arm, tokens),
            mean(arm, computed_tokens),
            mean(arm, seconds),
            versus(arm, updates),
            versus(arm, tokens),
        )
        for arm in arms
    ]


def arm_floors(arms: list[Arm]) -> list[Floors]:
    """Each arm's floors (its first run's with floors: an arm's seeds score one cache's pairs) and
    how many of its seeds ended below the bigram floor."""
    rows = []
    for arm in arms:
        verdicts = [floor_models.below(run, final_val_loss(run)) for run in arm.runs]
        rows.append(
            Floors(
                arm,
                floor_models.shared(arm.runs, "unigram"),
                floor_models.shared(arm.runs, "bigram"),
                summarize([final_val_loss(run) for run in arm.runs]).mean,
                sum(1 for v in verdicts if v),
                sum(1 for v in verdicts if v is not None),
                _median([tokens_to_reach(run, floor_models.floor(run, "bigram")) for run in arm.runs]),
            )
        )
    return rows
