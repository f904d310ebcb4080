"""The floors a run's validation loss must beat, as compare reads them from run.json (data/measures/floors.py
computes them): the cross-entropy of the same validation pairs under a unigram and two interpolated
bigram models (Jelinek-Mercer, Kneser-Ney) counted on the train split. A layout acts through context
(what a position may attend to, which tails it trains): a run that has not gone below the lower of the
bigram floors (the gate) has not learned enough context for a layout to show, whatever the number of
seeds. A run.json from before the Kneser-Ney floor is judged on its Jelinek-Mercer one."""

from __future__ import annotations

import math

from ..training.run_record import Run

FLOORS = ("unigram", "bigram", "bigram_kn")
"""The floor models, weakest first."""
GATE = "gate"
"""The floor a run must beat: the lower of the bigram floors (`floor(run, GATE)`)."""
BIGRAMS = ("bigram", "bigram_kn")
DESCRIPTION = {
    "unigram": "unigram (add-one)",
    "bigram": "bigram (Jelinek-Mercer)",
    "bigram_kn": "bigram (Kneser-Ney)",
    GATE: "lower bigram",
}
SAME = 1e-9
"""Floors closer than this (nats) are one floor: the runs scored the same validation pairs."""


def floor(run: Run, name: str) -> float:
    """The run's `name` floor in nats per validation pair (GATE: the lower bigram floor it has); nan
    for a run without floors."""
    if name == GATE:
        values = [v for v in (floor(run, model) for model in BIGRAMS) if math.isfinite(v)]
        return min(values) if values else math.nan
    entry = run.floors.get(name) or {}
    value = entry.get("nats") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, int | float) else math.nan


def shared(runs: list[Run], name: str) -> float:
    """The `name` floor every run with floors shares; nan when none has one or they disagree (the
    runs scored different validation pairs: each arm's floor is then in the floors section)."""
    values = [v for v in (floor(run, name) for run in runs) if math.isfinite(v)]
    if not values or max(values) - min(values) > SAME:
        return math.nan
    return values[0]


def below(run: Run, loss: float, name: str = GATE) -> bool | None:
    """Whether `loss` (the run's final val loss) is below its `name` floor; None without either."""
    value = floor(run, name)
    if not (math.isfinite(value) and math.isfinite(loss)):
        return None
    return loss < value
