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
* a mixture's final `val/loss/<component>`, one section per component (data/batching/mixture.py);
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

import numpy as np

from ..errors import ConfigError
from ..training.machine_load import CONTENDED  # a run's median `sys/load_per_cpu` above it: contended
from ..training.run_record import Run, run_numbers
from . import floors as floor_models
from .arm_metrics import Metric, computed_tokens, final_val_loss, metrics, tokens_to_reach, updates
from .arms import Arm
from .statistics import (
    Comparison,
    Summary,
    compare_to_reference,
    holm,
    summarize,
)


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
    seeds' final val losses are below the gate, the lower bigram floor (of those with both)."""

    arm: Arm
    unigram: float
    bigram: float
    val_loss: float
    below_bigram: int
    judged: int
    tokens_to_bigram: float = math.nan  # median over seeds of `tokens_to_reach` the gate
    bigram_kn: float = math.nan  # nan for runs from before the Kneser-Ney floor

    @property
    def gate(self) -> float:
        """The lower bigram floor (report/floors.py GATE)."""
        values = [v for v in (self.bigram, self.bigram_kn) if math.isfinite(v)]
        return min(values) if values else math.nan


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


def reference_arm(arms: list[Arm], label: str | None) -> Arm | None:
    """The arm `--reference LABEL` names. Without one: the first arm of a baseline policy (padded: what
    packing is measured against, wherever the sweep put it), else the first arm; none for a single arm."""
    if label is None:
        if len(arms) < 2:
            return None
        from ..data.batching.policies import REGISTRY

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
    how many of its seeds ended below the gate (the lower bigram floor)."""
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
                _median(
                    [tokens_to_reach(run, floor_models.floor(run, floor_models.GATE)) for run in arm.runs]
                ),
                floor_models.shared(arm.runs, "bigram_kn"),
            )
        )
    return rows
