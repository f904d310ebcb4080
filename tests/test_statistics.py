"""compare's statistics against textbook values: R's t.test on Student's sleep data (paired and
Welch), R's p.adjust(method = "holm"), G*Power's paired-t power, and the n < 2, unequal n and
missing-value cases. Pure functions: nothing trains."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from pretrain.report.statistics import (
    PAIRED,
    TOO_FEW,
    WELCH,
    compare_to_reference,
    detectable_effect,
    holm,
)

# Cushny & Peebles via Student (1908), R's `sleep` data: extra hours of sleep of 10 patients under two
# drugs. The patient is the pairing unit, as a seed is ours.
DRUG_1 = (0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0)
DRUG_2 = (1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4)


def by_seed(values, seeds=None):
    return dict(zip(seeds or range(len(values)), values, strict=True))


def test_paired_matches_r_t_test_on_the_sleep_data():
    # R: t.test(extra ~ group, data = sleep, paired = TRUE): t = -4.0621, df = 9, p = 0.002833,
    # 95% CI -2.4598858 -0.7001142, mean difference -1.58
    c = compare_to_reference(by_seed(DRUG_1), by_seed(DRUG_2))
    assert (c.test, c.n, c.n_reference, c.df) == (PAIRED, 10, 10, 9)
    assert c.diff == pytest.approx(-1.58, abs=1e-12)
    assert (c.low, c.high) == (pytest.approx(-2.4598858, abs=1e-7), pytest.approx(-0.7001142, abs=1e-7))
    assert c.p == pytest.approx(0.002833, abs=5e-7)
    assert c.diff / c.se == pytest.approx(-4.0621, abs=5e-5)


def test_unpaired_matches_r_welch_t_test_on_the_sleep_data():
    # R: t.test(extra ~ group, data = sleep): t = -1.8608, df = 17.776, p = 0.07939,
    # 95% CI -3.3654832 0.2054832
    for c in (
        compare_to_reference(by_seed(DRUG_1), by_seed(DRUG_2), paired=False),  # --unpaired
        compare_to_reference(by_seed(DRUG_1), by_seed(DRUG_2, range(10, 20))),  # other seeds: Welch
    ):
        assert (c.test, c.n, c.n_reference) == (WELCH, 10, 10)
        assert c.df == pytest.approx(17.776, abs=5e-4)
        assert (c.low, c.high) == (pytest.approx(-3.3654832, abs=1e-7), pytest.approx(0.2054832, abs=1e-7))
        assert c.p == pytest.approx(0.07939, abs=5e-6)
        assert c.diff / c.se == pytest.approx(-1.8608, abs=5e-5)


def test_pairing_is_what_turns_the_same_numbers_significant():
    paired = compare_to_reference(by_seed(DRUG_1), by_seed(DRUG_2))
    welch = compare_to_reference(by_seed(DRUG_1), by_seed(DRUG_2), paired=False)
    assert paired.diff == pytest.approx(welch.diff)
    assert paired.p < 0.01 < 0.05 < welch.p and paired.mde < welch.mde


def test_unequal_n_welch_by_the_welch_satterthwaite_formula():
    arm, ref = (3.1, 3.3, 2.9, 3.6), (3.0, 3.05)
    c = compare_to_reference(by_seed(arm), by_seed(ref))
    assert (c.test, c.n, c.n_reference) == (WELCH, 4, 2)
    v1, v2 = stats.tvar(arm) / 4, stats.tvar(ref) / 2
    df = (v1 + v2) ** 2 / (v1**2 / 3 + v2**2 / 1)
    se = math.sqrt(v1 + v2)
    diff = sum(arm) / 4 - sum(ref) / 2
    assert (c.diff, c.se, c.df) == (pytest.approx(diff), pytest.approx(se), pytest.approx(df))
    assert c.p == pytest.approx(2 * stats.t.sf(abs(diff) / se, df))
    half = stats.t.ppf(0.975, df) * se
    assert (c.low, c.high) == (pytest.approx(diff - half), pytest.approx(diff + half))


def test_a_missing_value_drops_that_seed_from_the_pairs():
    arm = {1: 2.0, 2: 2.5, 3: math.nan, 4: 2.2}
    ref = {1: 2.3, 2: 2.6, 3: 2.4, 4: 2.6}
    c = compare_to_reference(arm, ref)
    differences = [-0.3, -0.1, -0.4]  # seeds 1, 2 and 4
    expected = stats.ttest_1samp(differences, 0.0)
    assert (c.test, c.n, c.df) == (PAIRED, 3, 2)
    assert c.diff == pytest.approx(-0.8 / 3) and c.p == pytest.approx(expected.pvalue)


def test_fewer_than_two_values_make_no_test():
    one = compare_to_reference({1: 2.0}, {1: 2.5, 2: 2.7})  # different seed sets: Welch's n
    assert (one.test, one.n, one.n_reference) == (TOO_FEW, 1, 2)
    assert one.diff == pytest.approx(2.0 - 2.6)
    assert all(math.isnan(v) for v in (one.low, one.high, one.p, one.mde, one.holm))
    assert one.significant is None
    pairs = compare_to_reference({1: 2.0, 2: math.nan}, {1: 2.5, 2: 2.7})  # one complete pair
    assert (pairs.test, pairs.n) == (TOO_FEW, 1) and pairs.diff == pytest.approx(-0.5)


def test_equal_per_seed_differences_have_a_point_interval():
    c = compare_to_reference({1: 2.5, 2: 2.6, 3: 2.7}, {1: 3.1, 2: 3.2, 3: 3.3})
    assert c.test == PAIRED and c.diff == pytest.approx(-0.6)
    assert (c.low, c.high, c.se, c.mde) == (pytest.approx(-0.6), pytest.approx(-0.6), 0.0, 0.0)
    assert c.p == 0.0


def test_holm_matches_r_p_adjust():
    # R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") = 0.03 0.06 0.06 0.02
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1; an arm without a test is no member of the family
    adjusted = holm([0.5, math.nan, 0.4])
    assert adjusted[0] == 0.8 and math.isnan(adjusted[1]) and adjusted[2] == 0.8
    assert holm([]) == [] and holm([0.2]) == [0.2]


def test_detectable_effect_matches_g_power():
    # G*Power: a paired t test of n = 10 at alpha 0.05 two-sided has power 0.8031 for d = 1; so the
    # effect detected with power 0.8031 is one standard deviation of the differences: se = 1/sqrt(10).
    se = 1 / math.sqrt(10)
    assert detectable_effect(se, 9, power=0.8030969) == pytest.approx(1.0, abs=1e-5)
    # near the normal approximation (t_0.975 + t_0.8) * se for large df, larger for few seeds
    assert detectable_effect(1.0, 1000) == pytest.approx(
        stats.norm.ppf(0.975) + stats.norm.ppf(0.8), abs=0.01
    )
    assert detectable_effect(1.0, 2) > stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2) - 0.5
    assert math.isnan(detectable_effect(math.nan, 3)) and detectable_effect(0.0, 3) == 0.0
    c = compare_to_reference(by_seed(DRUG_1), by_seed(DRUG_2))
    assert c.mde == pytest.approx(detectable_effect(c.se, 9))


def test_identical_arms_have_no_difference_and_p_one():
    c = compare_to_reference({1: 2.5, 2: 2.6}, {1: 2.5, 2: 2.6})
    assert (c.diff, c.low, c.high, c.p, c.mde) == (0.0, 0.0, 0.0, 1.0, 0.0)
