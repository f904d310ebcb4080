"""Reliability, round 4 (issue 42), the tools around training: `pretrain compare` on many identical
seeds (item 6)."""

from __future__ import annotations

import numpy as np
import pytest
from test_compare_seeds import write_run

from pretrain.report.compare import compare
from pretrain.report.statistics import mean_points

# --- item 6: identical seeds never make an error bar's extent negative -----------------------------


def test_the_band_of_identical_seeds_holds_their_mean_at_any_count():
    """The mean of the k-th validations (summed down the seeds) and the band's own mean (summed along
    one value list) round differently: the band is widened to hold the mean, never left 1e-14 short."""
    for seeds in range(2, 501):
        dots = mean_points([[(200.0, 4.4), (400.0, 3.1)]] * seeds)
        assert dots is not None
        assert (dots.mean - dots.low >= 0).all() and (dots.high - dots.mean >= 0).all(), seeds
        np.testing.assert_allclose(dots.mean, [4.4, 3.1], rtol=1e-12)


@pytest.mark.parametrize("seeds", [50, pytest.param(500, marks=pytest.mark.slow)])
def test_compare_plots_two_arms_of_many_identical_seeds(tmp_path, seeds):
    """2 arms x 500 seeds with identical values died in matplotlib's errorbar ("'yerr' must not
    contain negative values"); 50 seeds a arm already did."""
    root = tmp_path / "multirun"
    runs = [
        write_run(root / f"{policy}-{seed}", policy=policy, seed=seed, train_loss=3.1, val=(4.4, 3.1))
        for policy in ("padded", "bestfit")
        for seed in range(seeds)
    ]
    png = compare(runs, output=tmp_path / "compare.png", quiet=True)
    assert png.is_file() and png.stat().st_size > 0
