"""A/B statistics against scipy and hand-worked examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from esper_ray.experiments.statistics import compare_arms, compare_pair, holm, summarize_arm, verdict


def as_seeds(values):
    return dict(enumerate(values))


def test_mann_whitney_and_effect_sizes_on_fully_separated_arms_match_a_hand_computation():
    pair = compare_pair("a", as_seeds([1.0, 2.0, 3.0]), "b", as_seeds([4.0, 5.0, 6.0]))
    # U_a counts pairs with a > b: none. Exact two-sided p for n=3,3 and the most extreme split: 2 / C(6,3) = 0.1.
    assert pair.u == 0 and pair.prob_a_beats_b == 0.0 and pair.rank_biserial == -1.0
    assert pair.p_value == pytest.approx(0.1)
    reverse = compare_pair("b", as_seeds([4.0, 5.0, 6.0]), "a", as_seeds([1.0, 2.0, 3.0]))
    assert reverse.prob_a_beats_b == 1.0 and reverse.rank_biserial == 1.0


def test_identical_arms_have_no_effect():
    values = as_seeds([0.3, 0.5, 0.7, 0.9])
    pair = compare_pair("a", values, "b", values)
    assert pair.prob_a_beats_b == 0.5 and pair.rank_biserial == 0.0 and pair.p_value == pytest.approx(1.0)
    assert any("Wilcoxon signed-rank is undefined" in n for n in pair.notes)
    assert "No difference in final_accuracy between a and b was detected" in verdict(pair, "final_accuracy", 0.05, False)


def test_statistics_equal_scipy_on_fixed_data():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.6, 0.05, 8), rng.normal(0.55, 0.05, 8)
    pair = compare_pair("a", as_seeds(a), "b", as_seeds(b))
    reference = stats.mannwhitneyu(a, b, alternative="two-sided")
    assert pair.u == reference.statistic and pair.p_value == pytest.approx(reference.pvalue)
    assert pair.prob_a_beats_b == pytest.approx(np.mean([x > y for x in a for y in b]))  # no ties in this data
    wilcoxon = stats.wilcoxon(a - b)
    assert pair.wilcoxon_n == 8 and pair.wilcoxon_statistic == wilcoxon.statistic and pair.wilcoxon_p == pytest.approx(wilcoxon.pvalue)
    assert pair.prob_ci_low <= pair.prob_a_beats_b <= pair.prob_ci_high
    summary = summarize_arm("a", a)
    assert summary.mean == pytest.approx(a.mean()) and summary.median == pytest.approx(np.median(a))
    assert summary.iqm == pytest.approx(np.sort(a)[2:6].mean())  # n=8: drop 2 from each end
    assert summary.ci_low < summary.mean < summary.ci_high


def test_wilcoxon_uses_only_seeds_present_in_both_arms():
    pair = compare_pair("a", {0: 0.9, 1: 0.8, 2: 0.7, 5: 0.1}, "b", {0: 0.5, 1: 0.4, 2: 0.6, 9: 0.9})
    assert pair.wilcoxon_n == 3
    assert pair.wilcoxon_p == pytest.approx(stats.wilcoxon([0.4, 0.4, 0.1]).pvalue)


def test_holm_matches_a_hand_worked_example_and_applies_with_more_than_two_arms():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(holm([0.02, math.nan])[1]) and holm([0.02, math.nan])[0] == pytest.approx(0.02)
    values = {"a": as_seeds([1, 2, 3, 4]), "b": as_seeds([5, 6, 7, 8]), "c": as_seeds([1.5, 2.5, 3.5, 4.5])}
    pairs = compare_arms(values)
    assert [p.p_holm for p in pairs] == pytest.approx(holm([p.p_value for p in pairs]))
    assert "Holm-corrected p" in verdict(pairs[0], "final_accuracy", 0.05, True)


def test_small_samples_ties_and_empty_arms_are_reported():
    pair = compare_pair("a", as_seeds([0.5, 0.5]), "b", as_seeds([0.5, 0.6]))
    assert any("fewer than 3 runs" in n for n in pair.notes) and any("tied values" in n for n in pair.notes)
    assert math.isnan(pair.prob_ci_low)
    empty = compare_pair("a", {}, "b", as_seeds([0.5, 0.6, 0.7]))
    assert "no finished trials in a" in empty.notes[0]
    assert "no test possible" in verdict(empty, "final_accuracy", 0.05, False)


def test_a_clear_difference_names_the_better_arm():
    pair = compare_pair("low", as_seeds(np.linspace(0.1, 0.2, 8)), "high", as_seeds(np.linspace(0.5, 0.6, 8)))
    text = verdict(pair, "final_accuracy", 0.05, False)
    assert text.startswith("high beats low on final_accuracy at alpha=0.05") and "P(high > low)=1.00" in text
