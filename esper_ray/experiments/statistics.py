"""A/B statistics on scipy.stats: per-arm summaries, Mann-Whitney U with effect sizes, Wilcoxon signed-rank on
seed-paired differences, Holm correction, and a verdict sentence.

Effect sizes (for arm A against arm B, with U_A the Mann-Whitney statistic of A):
    P(A > B) = U_A / (n_A n_B)      the probability that a random run of A beats one of B (ties count half)
    rank-biserial r = 2 P(A > B) - 1, in [-1, 1]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

MIN_N = 3  # below this per arm, tests and bootstrap intervals say nothing useful
BOOTSTRAP_RESAMPLES = 4000


@dataclass(frozen=True)
class ArmSummary:
    arm: str
    n: int
    mean: float
    median: float
    iqm: float
    """Interquartile mean: the mean of the middle 50 %."""
    ci_low: float
    ci_high: float
    """Bootstrap 95 % confidence interval of the mean (NaN when n < 3)."""


@dataclass(frozen=True)
class PairComparison:
    arm_a: str
    arm_b: str
    n_a: int
    n_b: int
    u: float
    p_value: float
    p_holm: float
    rank_biserial: float
    prob_a_beats_b: float
    prob_ci_low: float
    prob_ci_high: float
    wilcoxon_n: int
    """Seeds present in both arms (pairs)."""
    wilcoxon_statistic: float
    wilcoxon_p: float
    notes: tuple[str, ...]


def _bootstrap_ci(data: tuple[np.ndarray, ...], statistic: Any, seed: int) -> tuple[float, float]:
    if min(len(d) for d in data) < MIN_N:
        return math.nan, math.nan
    if all(np.ptp(d) == 0 for d in data):  # constant data: the interval is the point
        value = float(statistic(*data))
        return value, value
    result = stats.bootstrap(data, statistic, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                             rng=np.random.default_rng(seed), vectorized=True)
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def summarize_arm(arm: str, values: Sequence[float], seed: int = 0) -> ArmSummary:
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return ArmSummary(arm, 0, math.nan, math.nan, math.nan, math.nan, math.nan)
    low, high = _bootstrap_ci((x,), np.mean, seed)  # np.mean takes `axis`, so scipy vectorises the resampling
    return ArmSummary(arm, len(x), float(x.mean()), float(np.median(x)), float(stats.trim_mean(x, 0.25)), low, high)


def prob_a_beats_b(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    """Share of (a, b) pairs with a > b, ties counting half: U_a / (n_a n_b), along `axis` (for bootstrap)."""
    a, b = np.moveaxis(a, axis, -1), np.moveaxis(b, axis, -1)
    greater = (a[..., :, None] > b[..., None, :]).mean(axis=(-2, -1))
    ties = (a[..., :, None] == b[..., None, :]).mean(axis=(-2, -1))
    return greater + 0.5 * ties


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (scipy has BH/BY only); NaN inputs stay NaN."""
    p = np.asarray(p_values, dtype=float)
    valid = np.flatnonzero(~np.isnan(p))
    adjusted = np.full(len(p), math.nan)
    order = valid[np.argsort(p[valid])]
    m = len(order)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[index]))
        adjusted[index] = running
    return adjusted.tolist()


def compare_pair(arm_a: str, a_by_seed: Mapping[int, float], arm_b: str, b_by_seed: Mapping[int, float], seed: int = 0) -> PairComparison:
    a = np.asarray(list(a_by_seed.values()), dtype=float)
    b = np.asarray(list(b_by_seed.values()), dtype=float)
    notes: list[str] = []
    if min(len(a), len(b)) == 0:
        return PairComparison(arm_a, arm_b, len(a), len(b), math.nan, math.nan, math.nan, math.nan, math.nan,
                              math.nan, math.nan, 0, math.nan, math.nan, (f"no finished trials in {arm_a if len(a) == 0 else arm_b}",))
    if min(len(a), len(b)) < MIN_N:
        notes.append(f"fewer than {MIN_N} runs per arm ({len(a)} vs {len(b)}): p-values and intervals are not informative")
    if len(np.unique(np.concatenate([a, b]))) < len(a) + len(b):
        notes.append("tied values: Mann-Whitney uses mid-ranks and the normal approximation")
    mw = stats.mannwhitneyu(a, b, alternative="two-sided")
    prob = float(mw.statistic) / (len(a) * len(b))
    assert math.isclose(prob, float(prob_a_beats_b(a, b))), (prob, prob_a_beats_b(a, b))
    low, high = _bootstrap_ci((a, b), prob_a_beats_b, seed)
    paired = sorted(set(a_by_seed) & set(b_by_seed))
    w_stat = w_p = math.nan
    if paired:
        diffs = np.asarray([a_by_seed[s] - b_by_seed[s] for s in paired])
        if np.all(diffs == 0):
            notes.append("every seed-paired difference is zero: Wilcoxon signed-rank is undefined")
        else:
            w = stats.wilcoxon(diffs, zero_method="wilcox", alternative="two-sided")
            w_stat, w_p = float(w.statistic), float(w.pvalue)
    return PairComparison(arm_a, arm_b, len(a), len(b), float(mw.statistic), float(mw.pvalue), float(mw.pvalue),
                          2 * prob - 1, prob, low, high, len(paired), w_stat, w_p, tuple(notes))


def compare_arms(values: Mapping[str, Mapping[int, float]], seed: int = 0) -> list[PairComparison]:
    """All pairs of arms; Holm-corrected p-values when there are more than two arms."""
    pairs = [compare_pair(a, values[a], b, values[b], seed) for a, b in itertools.combinations(values, 2)]
    if len(values) > 2:
        adjusted = holm([p.p_value for p in pairs])
        pairs = [PairComparison(**{**asdict(p), "p_holm": q}) for p, q in zip(pairs, adjusted)]
    return pairs


def verdict(pair: PairComparison, metric: str, alpha: float, corrected: bool) -> str:
    p = pair.p_holm if corrected else pair.p_value
    label = "Holm-corrected p" if corrected else "p"
    if math.isnan(p):
        return f"{pair.arm_a} vs {pair.arm_b}: no test possible ({'; '.join(pair.notes)})."
    if p < alpha:
        better, worse = (pair.arm_a, pair.arm_b) if pair.prob_a_beats_b > 0.5 else (pair.arm_b, pair.arm_a)
        prob = max(pair.prob_a_beats_b, 1 - pair.prob_a_beats_b)
        return (f"{better} beats {worse} on {metric} at alpha={alpha} (Mann-Whitney {label}={p:.3g}, "
                f"P({better} > {worse})={prob:.2f}, n={pair.n_a}+{pair.n_b}).")
    return (f"No difference in {metric} between {pair.arm_a} and {pair.arm_b} was detected at alpha={alpha} with "
            f"n={pair.n_a}+{pair.n_b} (Mann-Whitney {label}={p:.3g}, P({pair.arm_a} > {pair.arm_b})={pair.prob_a_beats_b:.2f}).")
