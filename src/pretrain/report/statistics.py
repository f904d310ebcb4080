"""The numbers behind a seed-aware comparison: a summary over seeds, the test of an arm against a
reference arm, values read off a curve between its points, and the mean curve of several seeds.

* `Summary`: n, mean, sample standard deviation (n - 1 in the denominator; n/a below n = 2), min, max
  of the finite values (a seed without the value is left out, not counted as zero).
* `compare_to_reference`: an arm against the reference arm, paired by seed when both ran the same
  seeds (else Welch): the difference, its 95% t confidence interval, the two-sided p, and the
  smallest difference the design detects at 80% power (`detectable_effect`); `holm` adjusts the p
  values of the arms compared with one reference. The distributions are scipy's.
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


ALPHA = 0.05
"""Two-sided level of the confidence intervals (95%), the tests and the Holm decision."""
POWER = 0.80
"""The power at which `Comparison.mde` is the smallest detectable difference."""
PAIRED, WELCH, TOO_FEW = "paired t", "Welch t", "n<2"
"""The tests `compare_to_reference` can use; TOO_FEW: an arm has fewer than 2 values, no test."""


@dataclass(frozen=True)
class Comparison:
    """An arm against the reference on one metric: the difference (arm - reference: the mean of the
    per-seed differences when paired, the difference of the means otherwise), its 95% t confidence
    interval, the two-sided p, its Holm-adjusted p across the arms compared with the same reference
    (`holm`; nan until set, and for TOO_FEW), the t test's degrees of freedom and standard error, and
    `mde`: the smallest true difference the test would detect with POWER at level ALPHA, given the
    spread observed (noncentral t). `n` counts the pairs (paired) or the arm's values (Welch);
    `n_reference` the reference's values."""

    test: str
    n: int
    n_reference: int
    diff: float
    low: float = math.nan
    high: float = math.nan
    p: float = math.nan
    df: float = math.nan
    se: float = math.nan
    mde: float = math.nan
    holm: float = math.nan

    @property
    def significant(self) -> bool | None:
        """Holm-adjusted p < ALPHA; None where no test was made (or the spread is zero on both sides)."""
        return None if not math.isfinite(self.holm) else bool(self.holm < ALPHA)


def detectable_effect(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The true difference a two-sided t test (level alpha, `df` degrees of freedom, standard error
    `se`) detects with probability `power`: the noncentrality at which P(|T| > t_crit) = power, times
    se. About (t_{1-alpha/2} + t_{power}) * se; exact here (scipy's noncentral t)."""
    from scipy import optimize, stats

    if not (math.isfinite(se) and math.isfinite(df) and df > 0):
        return math.nan
    if se == 0:
        return 0.0
    critical = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(noncentrality: float) -> float:
        # The far tail is negligible (and nan in scipy) once the noncentrality is large.
        far = float(np.nan_to_num(stats.nct.cdf(-critical, df, noncentrality)))
        return float(stats.nct.sf(critical, df, noncentrality)) + far - power

    upper = critical + 3.0  # past the root for power <= 0.998; doubled below if not
    while shortfall(upper) < 0:
        upper *= 2
    return float(optimize.brentq(shortfall, 0.0, upper, xtol=1e-12)) * float(se)


def compare_to_reference(
    arm: dict[object, float], reference: dict[object, float], paired: bool = True
) -> Comparison:
    """The arm's values against the reference's, each keyed by seed (nan: the run has no value).

    Paired (when `paired` and both arms ran the same set of seeds): the per-seed differences on the
    seeds where both have a value, a one-sample t test with n - 1 degrees of freedom (a seed gives
    both arms the same initial weights, and some layouts the same data order: pairing removes that
    shared noise). Otherwise Welch's t test (unequal variances, Welch-Satterthwaite degrees of
    freedom) on each arm's finite values. Fewer than 2 values (pairs) on a side: TOO_FEW, the
    difference alone."""
    import warnings

    from scipy import stats

    arm_values = {seed: v for seed, v in arm.items() if math.isfinite(v)}
    ref_values = {seed: v for seed, v in reference.items() if math.isfinite(v)}
    if paired and arm and set(arm) == set(reference):
        seeds = [seed for seed in arm if seed in arm_values and seed in ref_values]
        a = np.array([arm_values[s] for s in seeds], dtype=float)
        b = np.array([ref_values[s] for s in seeds], dtype=float)
        test, n, n_ref = PAIRED, len(seeds), len(seeds)
    else:
        a = np.array(list(arm_values.values()), dtype=float)
        b = np.array(list(ref_values.values()), dtype=float)
        test, n, n_ref = WELCH, len(a), len(b)
    diff = float(np.mean(a - b)) if test == PAIRED and n else _mean(a) - _mean(b)
    if n < 2 or n_ref < 2:
        return Comparison(TOO_FEW, n, n_ref, diff)
    with warnings.catch_warnings():  # identical values: scipy warns, the result (inf or nan) is right
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_rel(a, b) if test == PAIRED else stats.ttest_ind(a, b, equal_var=False)
        interval = result.confidence_interval(1 - ALPHA)
    df = float(result.df)
    spread = np.std(a - b, ddof=1) / math.sqrt(n) if test == PAIRED else _welch_se(a, b)
    low, high, p = float(interval.low), float(interval.high), float(result.pvalue)
    # No spread beyond rounding (every seed moved by the same amount, or identical runs): the interval
    # is the point, and p is 0 for a difference, 1 for none (scipy gives nan or rounding noise there).
    rounding = 1e-12 * max(1.0, float(np.max(np.abs(np.concatenate([a, b])))))
    if spread <= rounding:
        spread, low, high, p = 0.0, diff, diff, 0.0 if abs(diff) > rounding else 1.0
    return Comparison(test, n, n_ref, diff, low, high, p, df, float(spread), detectable_effect(spread, df))


def _mean(values: np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def _welch_se(a: np.ndarray, b: np.ndarray) -> float:
    return math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p values (nan: no test, left out of the family and
    kept nan): the k-th smallest of m becomes max over j <= k of min(1, (m - j + 1) p_(j))."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if math.isfinite(p))
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


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
    mean = points[:, :, 1].mean(axis=0)
    # The band always holds the mean: two summation orders of identical values differ in the last bits
    # (500 seeds: 1e-14), which would make an error bar's extent negative.
    low, high = np.fmin(bands[:, 0], mean), np.fmax(bands[:, 1], mean)
    return MeanCurve(points[:, :, 0].mean(axis=0), mean, low, high)


SMOOTHING_SPAN_FRACTION = 1 / 15
"""The train loss's EMA span: this fraction of its logged points (at least 2)."""


def smooth(values: np.ndarray) -> np.ndarray:
    """An exponential moving average of a curve's values with the start's bias corrected (as
    TensorBoard's smoothing: the first points are not pulled towards 0), span a fixed fraction of the
    curve's points, so a curve of any length is smoothed alike."""
    values = np.asarray(values, dtype=float)
    if len(values) < 3:
        return values.copy()
    span = max(2.0, len(values) * SMOOTHING_SPAN_FRACTION)
    keep = 1.0 - 2.0 / (span + 1.0)
    smoothed = np.empty_like(values)
    average = 0.0
    for i, value in enumerate(values):
        average = keep * average + (1.0 - keep) * value
        smoothed[i] = average / (1.0 - keep ** (i + 1))
    return smoothed
