"""The numbers behind a seed-aware comparison: a summary over seeds, the difference of two arms and
its standard error, values read off a curve between its points, and the mean curve of several seeds.

* `Summary`: n, mean, sample standard deviation (n - 1 in the denominator; n/a below n = 2), min, max
  of the finite values (a seed without the value is left out, not counted as zero).
* `difference`: Welch-style, seeds unpaired: the arms' mean difference, its standard error
  sqrt(s1^2/n1 + s2^2/n2), and whether |difference| > 2 SE (only when both arms have n >= 2: below
  that there is no spread to compare with).
* `interpolate_at`: linear between the two points around x, never extrapolated: outside the curve's
  own range the value is nan (the run stopped short of x or first validated after it; the caller
  reports it).
* `mean_curve`: the seeds' curves read off one common x grid over the range they all cover, their mean
  and a band: min-max for n <= BAND_MIN_MAX_UP_TO seeds (every seed inside it; a standard deviation of
  two or three values says little), mean +- 1 std above.
* `mean_points`: the seeds' k-th points (their k-th validations, taken at the same step) averaged, x
  and y, with the same band: no seed's last validation is cut because another reached a little less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BAND_MIN_MAX_UP_TO = 3
"""Bands of arms with at most this many seeds span min-max; larger arms get mean +- 1 std."""
GRID_POINTS = 200
"""Points of the common x grid a mean curve is drawn on."""


def band_name(n: int) -> str:
    """What an arm of n seeds draws around its mean: `min-max`, `+-1 std`, or `` for one seed."""
    if n < 2:
        return ""
    return "min-max" if n <= BAND_MIN_MAX_UP_TO else "+-1 std"


@dataclass(frozen=True)
class Summary:
    """One metric over an arm's seeds (finite values only)."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def std(self) -> float:
        """The sample standard deviation (n - 1 in the denominator); nan below two values."""
        return float(np.std(self.values, ddof=1)) if self.n >= 2 else math.nan

    @property
    def low(self) -> float:
        return min(self.values, default=math.nan)

    @property
    def high(self) -> float:
        return max(self.values, default=math.nan)

    def band(self) -> tuple[float, float]:
        """The band drawn around the mean (see `band_name`); (mean, mean) for a single value."""
        if self.n <= 1:
            return self.mean, self.mean
        if self.n <= BAND_MIN_MAX_UP_TO:
            return self.low, self.high
        return self.mean - self.std, self.mean + self.std


def summarize(values: list[float]) -> Summary:
    return Summary(tuple(float(v) for v in values if math.isfinite(v)))


@dataclass(frozen=True)
class Difference:
    """An arm's mean minus the reference arm's, its standard error (nan when either n < 2) and
    whether |diff| > 2 SE (None when either n < 2: no decision)."""

    diff: float
    se: float
    exceeds: bool | None


def difference(arm: Summary, reference: Summary) -> Difference:
    """Welch-style (unpaired seeds, unequal variances): SE = sqrt(s1^2/n1 + s2^2/n2)."""
    diff = arm.mean - reference.mean
    if arm.n < 2 or reference.n < 2:
        return Difference(diff, math.nan, None)
    se = math.sqrt(arm.std**2 / arm.n + reference.std**2 / reference.n)
    return Difference(diff, se, bool(abs(diff) > 2 * se))


def interpolate_at(points: list[tuple[float, float]], x: float) -> float:
    """The curve's value at x, linear between the two points around it; nan outside its range (never
    extrapolated) or for an empty curve. Points are in increasing x (cumulative tokens or seconds)."""
    if not points or not math.isfinite(x):
        return math.nan
    xs, ys = np.array(points, dtype=float).T
    if x < xs[0] or x > xs[-1]:
        return math.nan
    return float(np.interp(x, xs, ys))


@dataclass(frozen=True)
class MeanCurve:
    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def mean_curve(curves: list[list[tuple[float, float]]], x: np.ndarray | None = None) -> MeanCurve | None:
    """The seeds' mean on a common grid (GRID_POINTS over the x range every curve covers, or the
    given x, cut to that range) with the band of `Summary.band`; None when the curves share no x."""
    curves = [curve for curve in curves if curve]
    if not curves:
        return None
    start = max(curve[0][0] for curve in curves)
    stop = min(curve[-1][0] for curve in curves)
    if start > stop:
        return None
    grid = np.linspace(start, stop, GRID_POINTS) if x is None else x[(x >= start) & (x <= stop)]
    if not len(grid):
        return None
    # Every curve covers the grid: plain linear interpolation, nothing extrapolated.
    values = np.array([np.interp(grid, *np.array(curve, dtype=float).T) for curve in curves])
    mean = values.mean(axis=0)
    if len(curves) == 1:
        return MeanCurve(grid, mean, mean, mean)
    if len(curves) <= BAND_MIN_MAX_UP_TO:
        return MeanCurve(grid, mean, values.min(axis=0), values.max(axis=0))
    std = values.std(axis=0, ddof=1)
    return MeanCurve(grid, mean, mean - std, mean + std)


def mean_points(curves: list[list[tuple[float, float]]]) -> MeanCurve | None:
    """The mean of the seeds' k-th points (x and y) for every k all of them have, with the band of
    `Summary.band` over the y values; None when a seed has no points."""
    count = min((len(curve) for curve in curves), default=0)
    if count == 0:
        return None
    points = np.array([curve[:count] for curve in curves], dtype=float)  # seeds x k x (x, y)
    summaries = [summarize(list(points[:, k, 1])) for k in range(count)]
    bands = np.array([summary.band() for summary in summaries])
    return MeanCurve(points[:, :, 0].mean(axis=0), points[:, :, 1].mean(axis=0), bands[:, 0], bands[:, 1])
