"""A/B statistics against scipy, exact enumerations and hand-worked examples (EXPERIMENTS.md)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from esper_ray.experiments.statistics import (
    compare_arms,
    compare_pair,
    hodges_lehmann,
    holm,
    mann_whitney_min_p,
    median_interval,
    seeds_needed,
    signed_rank_null_cdf,
    summarize_arm,
    t_interval,
    verdict,
    walsh_averages,
    wilcoxon_min_p,
)


def as_seeds(values):
    return dict(enumerate(values))


# ------------------------------------------------------------------ independent exact enumerations
def enumerated_mann_whitney_p(a, b):
    """Two-sided p of A's rank sum (U up to a constant) by enumerating every split of the pooled values: twice the
    smaller tail, since with ties the null distribution is not symmetric."""
    pooled = np.concatenate([a, b])
    ranks = stats.rankdata(pooled)
    n_a = len(a)
    observed = ranks[:n_a].sum()
    sums = np.array([ranks[list(s)].sum() for s in itertools.combinations(range(len(pooled)), n_a)])
    return min(1.0, 2 * min(np.mean(sums >= observed - 1e-9), np.mean(sums <= observed + 1e-9)))


def enumerated_signed_rank_p(d):
    """Two-sided p of the signed-rank statistic by flipping every sign of the non-zero differences."""
    d = np.asarray([x for x in d if x != 0], dtype=float)
    ranks = stats.rankdata(np.abs(d))
    observed = abs(np.sum(np.sign(d) * ranks))
    extreme = 0
    for signs in itertools.product((-1, 1), repeat=len(d)):
        extreme += abs(np.sum(np.array(signs) * ranks)) >= observed - 1e-9
    return extreme / 2 ** len(d)


# ------------------------------------------------------------------------------- small samples
def test_three_constant_runs_per_arm_give_the_exact_p_not_the_asymptotic_one():
    pair = compare_pair("a", as_seeds([0.6] * 3), "b", as_seeds([0.5] * 3))
    # asymptotic Mann-Whitney says 0.047 ("A beats B"); the exact p is 2 / C(6, 3) = 0.1, the smallest possible
    assert pair.mann_whitney_p == pytest.approx(0.1) and pair.mann_whitney_min_p == pytest.approx(0.1)
    assert pair.wilcoxon_p == pytest.approx(0.25) and pair.wilcoxon_min_p == pytest.approx(0.25)
    text = verdict(pair, "test_accuracy", 0.05, 1)
    assert "undecidable at alpha=0.05" in text and "at least 6 are needed" in text and "beats" not in text


@pytest.mark.parametrize("n", range(1, 10))
def test_mann_whitney_p_equals_an_exact_enumeration_with_ties_and_unequal_n(n):
    rng = np.random.default_rng(n)
    a = rng.integers(0, 4, n).astype(float) / 10  # few distinct values: ties everywhere
    b = rng.integers(1, 5, max(1, n - 1)).astype(float) / 10
    pair = compare_pair("a", as_seeds(a), "b", dict(enumerate(b, start=100)))
    if min(len(a), len(b)) < 2:  # scipy's permutation test needs two runs per arm
        assert math.isnan(pair.mann_whitney_p) and "single run" in " ".join(pair.notes)
        return
    assert pair.mann_whitney_method == "exact"
    assert pair.mann_whitney_p == pytest.approx(min(1.0, enumerated_mann_whitney_p(a, b)), abs=1e-9)
    assert pair.u == pytest.approx(stats.mannwhitneyu(a, b).statistic)
    assert pair.n_pairs == 0 and pair.wilcoxon_n == 0  # no seed in common: no paired test


@pytest.mark.parametrize("n", range(1, 9))
def test_wilcoxon_p_equals_sign_flip_enumeration_and_counts_only_nonzero_differences(n):
    rng = np.random.default_rng(10 + n)
    b = rng.uniform(0.2, 0.4, n).round(2)
    d = rng.integers(-2, 3, n) / 10  # ties and zeros
    a = b + d
    pair = compare_pair("a", as_seeds(a), "b", as_seeds(b))
    nonzero = int(np.sum(np.round(a - b, 12) != 0))
    assert pair.n_pairs == n and pair.wilcoxon_n == nonzero
    if nonzero:
        assert pair.wilcoxon_p == pytest.approx(enumerated_signed_rank_p(np.round(a - b, 12)), abs=1e-9)
        assert pair.wilcoxon_min_p == pytest.approx(min(1.0, 2 / 2**nonzero))
    else:
        assert math.isnan(pair.wilcoxon_p)


def test_wilcoxon_reports_the_n_it_used():
    # 6 seeds, 2 of them tied: the test uses 4 differences, and says so
    pair = compare_pair("a", as_seeds([0.5, 0.6, 0.7, 0.8, 0.4, 0.3]), "b", as_seeds([0.5, 0.6, 0.6, 0.7, 0.3, 0.2]))
    assert pair.n_pairs == 6 and pair.wilcoxon_n == 4
    assert any("2 of 6 paired differences are zero" in note for note in pair.notes)


def test_smallest_reachable_p_values_match_the_table_in_experiments_md():
    assert [round(wilcoxon_min_p(n), 4) for n in (3, 4, 5, 6, 8)] == [0.25, 0.125, 0.0625, 0.0312, 0.0078]
    assert [round(mann_whitney_min_p(n, n), 5) for n in (3, 4, 5, 6, 8)] == [0.1, 0.02857, 0.00794, 0.00216, 0.00016]
    assert seeds_needed(0.05) == 6 and seeds_needed(0.01) == 8


# ------------------------------------------------------------------------------------ intervals
def test_signed_rank_null_distribution_equals_brute_force():
    for n in range(1, 9):
        sums = [sum(r for r, s in zip(range(1, n + 1), signs) if s) for signs in itertools.product((0, 1), repeat=n)]
        brute = np.cumsum(np.bincount(sums, minlength=n * (n + 1) // 2 + 1)) / 2**n
        assert signed_rank_null_cdf(n) == pytest.approx(brute)


def test_hodges_lehmann_interval_is_the_set_of_shifts_the_exact_test_does_not_reject():
    d = np.array([0.031, -0.012, 0.054, 0.022, 0.047, 0.008, 0.066, 0.015])
    estimate, interval = hodges_lehmann(d)
    walsh = walsh_averages(d)
    assert len(walsh) == 36 and estimate == pytest.approx(
        np.median([(x + y) / 2 for x, y in itertools.combinations_with_replacement(d, 2)])
    )
    assert interval.level == pytest.approx(1 - 2 * 5 / 256)  # n = 8: k = 3, P(T+ <= 3) = 5 / 256
    midpoints = (walsh[1:] + walsh[:-1]) / 2
    for theta in midpoints:
        p = stats.wilcoxon(d - theta, method="exact").pvalue
        inside = interval.low <= theta <= interval.high
        assert inside == (p >= 0.05), (theta, p, interval)


def test_hodges_lehmann_with_five_pairs_says_what_coverage_min_max_reaches():
    _, interval = hodges_lehmann(np.array([0.1, 0.2, -0.05, 0.3, 0.15]))
    assert (interval.low, interval.high) == (-0.05, 0.3) and interval.level == pytest.approx(1 - 2 / 32)


def coverage(interval_fn, n, draws=2000, seed=0):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(draws):
        x = rng.normal(0.5, 0.1, n)
        ci = interval_fn(x)
        hits += ci.low <= 0.5 <= ci.high
    return hits / draws


@pytest.mark.parametrize("n", [3, 5, 8])
def test_t_interval_of_the_mean_covers_at_small_n(n):
    assert coverage(t_interval, n) == pytest.approx(0.95, abs=0.02)


@pytest.mark.parametrize("n", [6, 8])
def test_median_interval_covers_at_least_its_stated_level(n):
    level = median_interval(np.arange(n, dtype=float)).level
    assert level >= 0.95 and coverage(median_interval, n) >= level - 0.015


def test_arm_summary_matches_numpy_and_scipy():
    x = np.random.default_rng(0).normal(0.6, 0.05, 8)
    s = summarize_arm("a", as_seeds(x))
    assert s.n == 8 and s.mean == pytest.approx(x.mean()) and s.median == pytest.approx(np.median(x))
    assert s.iqm == pytest.approx(np.sort(x)[2:6].mean())  # n=8: drop 2 from each end
    low, high = stats.t.interval(0.95, 7, loc=x.mean(), scale=stats.sem(x))
    assert (s.mean_ci.low, s.mean_ci.high) == pytest.approx((low, high)) and s.mean_ci.method == "t"
    assert s.iqm_ci.method == "BCa bootstrap" and s.iqm_ci.low < s.iqm < s.iqm_ci.high
    assert s.median_ci.method == "order statistics" and (s.median_ci.low, s.median_ci.high) == (x.min(), x.max())


def test_results_do_not_depend_on_the_order_trials_were_stored_in():
    rng = np.random.default_rng(3)
    a = dict(enumerate(rng.normal(0.6, 0.05, 7)))
    b = dict(enumerate(rng.normal(0.55, 0.05, 7)))
    shuffled_a = {k: a[k] for k in rng.permutation(list(a))}
    shuffled_b = {k: b[k] for k in rng.permutation(list(b))}
    assert summarize_arm("a", a) == summarize_arm("a", shuffled_a)
    assert compare_pair("a", a, "b", b) == compare_pair("a", shuffled_a, "b", shuffled_b)
    same = compare_pair("a", a, "b", dict(a))
    assert same.prob_a_beats_b == 0.5 and same.prob_ci.low <= 0.5 <= same.prob_ci.high


# ------------------------------------------------------------------------------ verdicts, Holm
def test_holm_matches_a_hand_worked_example():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(holm([0.02, math.nan])[1]) and holm([0.02, math.nan])[0] == pytest.approx(0.02)


def test_three_arms_apply_holm_to_both_families():
    rng = np.random.default_rng(7)
    values = {arm: as_seeds(rng.normal(mu, 0.03, 8)) for arm, mu in (("a", 0.5), ("b", 0.6), ("c", 0.52))}
    pairs = compare_arms(values)
    assert [(p.arm_a, p.arm_b) for p in pairs] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert [p.wilcoxon_p_holm for p in pairs] == pytest.approx(holm([p.wilcoxon_p for p in pairs]))
    assert [p.mann_whitney_p_holm for p in pairs] == pytest.approx(holm([p.mann_whitney_p for p in pairs]))
    assert "Holm-corrected p" in verdict(pairs[0], "test_accuracy", 0.05, 3)


def test_a_clear_paired_difference_names_the_better_arm():
    base = np.linspace(0.2, 0.6, 8)
    pair = compare_pair("low", as_seeds(base), "high", as_seeds(base + np.linspace(0.01, 0.08, 8)))
    assert pair.wilcoxon_p == pytest.approx(2 / 256) and pair.hodges_lehmann < 0
    text = verdict(pair, "test_accuracy", 0.05, 1)
    assert text.startswith("high beats low on test_accuracy at alpha=0.05") and "paired Wilcoxon p=0.0078" in text


def test_identical_arms_empty_arms_and_missing_pairs_are_said():
    values = as_seeds([0.3, 0.5, 0.7, 0.9])
    same = compare_pair("a", values, "b", values)
    assert same.prob_a_beats_b == 0.5 and same.mann_whitney_p == pytest.approx(1.0) and same.wilcoxon_n == 0
    assert "every one of the 4 run-seed pairs scored the same" in verdict(same, "test_accuracy", 0.05, 1)
    empty = compare_pair("a", {}, "b", as_seeds([0.5, 0.6, 0.7]))
    assert "no finished trials in a" in empty.notes[0] and math.isnan(empty.mann_whitney_p)
    assert "no test possible" in verdict(empty, "test_accuracy", 0.05, 1)
    assert summarize_arm("a", {}).n == 0 and math.isnan(summarize_arm("a", {}).mean)


def test_when_b_wins_the_verdict_states_the_effect_in_bs_direction():
    """Issue 32: "B beats A ... (Hodges-Lehmann) -0.018" contradicted itself; the winner's difference is stated."""
    a = {s: 0.20 + 0.01 * s for s in range(8)}
    b = {s: 0.50 + 0.02 * s for s in range(8)}
    [pair] = compare_arms({"a": a, "b": b})
    sentence = verdict(pair, "test_accuracy", 0.05, 1)
    assert sentence.startswith("b beats a on test_accuracy")
    assert f"median paired difference b - a (Hodges-Lehmann) +{-pair.hodges_lehmann:.4g}" in sentence
    assert pair.hodges_lehmann < 0  # the pair itself is still A - B
