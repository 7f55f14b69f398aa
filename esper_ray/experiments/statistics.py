"""A/B statistics that hold at small n, on scipy.stats (see ../shared docs EXPERIMENTS.md for the reasons).

The verdict rests on the test paired by run seed: seed s gives both arms the same host initialisation, data order
and evaluation episodes, so the difference A_s - B_s removes what the seed itself does.
    primary    Wilcoxon signed-rank on the paired differences of the seeds both arms finished; zero
               differences are dropped (`wilcoxon_n` is the number of non-zero differences used); p-value from
               the exact sign-flip distribution (scipy's permutation method: every one of the 2^n sign patterns
               when n <= 16, ties handled exactly), never the normal approximation.
    secondary  Mann-Whitney U on the two arms as unpaired samples, p-value from the exact permutation
               distribution (every split when feasible, ties handled exactly).
    Holm       over all pairs of arms, separately for each family.
Each test's smallest reachable two-sided p-value is reported (2 / 2^n for Wilcoxon, 2 / C(n_a + n_b, n_a)
for Mann-Whitney): when it exceeds alpha the verdict says that n cannot reach alpha at all.

Intervals (95 % by default; each says its method):
    mean        Student t
    median      distribution-free, from order statistics (binomial): coverage >= the level whenever n allows,
                otherwise the widest interval [min, max] with its achieved level
    IQM         BCa bootstrap (scipy), interquartile mean = scipy.stats.trim_mean(x, 0.25)
    paired      Hodges-Lehmann estimate of the paired difference (median of the Walsh averages) with the
                interval that inverts the exact signed-rank test (Walsh averages cut at its critical value)
    P(A > B)    BCa bootstrap (percentile where BCa is degenerate)
Every resampling reads the values in seed order, so storage order (the random start order) never changes a
result. Two-sided p-values are twice the smaller tail (scipy's convention; with ties the null distribution of U
is not symmetric). Differences are rounded to 12 decimals before ranking, so that accuracies whose differences
are equal on paper (0.7 - 0.6 and 0.6 - 0.5) tie, as they should, rather than by floating-point noise.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import special, stats

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 9_999
PERMUTATION_RESAMPLES = 100_000
"""Exact enumeration whenever the null distribution has at most this many permutations, else Monte Carlo."""
RNG_SEED = 0
DECIMALS = 12


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    method: str
    level: float
    """Achieved coverage where the method knows it exactly (median, Hodges-Lehmann), else the nominal level."""


NAN_INTERVAL = Interval(math.nan, math.nan, "n/a", math.nan)


@dataclass(frozen=True)
class ArmSummary:
    arm: str
    n: int
    mean: float
    mean_ci: Interval
    median: float
    median_ci: Interval
    iqm: float
    """Interquartile mean: the mean of the middle 50 %."""
    iqm_ci: Interval


@dataclass(frozen=True)
class PairComparison:
    arm_a: str
    arm_b: str
    n_pairs: int
    """Seeds finished in both arms."""
    wilcoxon_n: int
    """Non-zero paired differences: the n the signed-rank test used."""
    wilcoxon_statistic: float
    wilcoxon_p: float
    wilcoxon_p_holm: float
    wilcoxon_min_p: float
    """Smallest two-sided p-value the test can give with `wilcoxon_n` differences."""
    wilcoxon_method: str
    signed_rank_sum: float
    """T+ - T-: positive when A's wins over B rank higher than its losses (the direction of the paired test)."""
    hodges_lehmann: float
    """Median of the Walsh averages of the paired differences A - B."""
    hodges_lehmann_ci: Interval
    n_a: int
    n_b: int
    u: float
    """Mann-Whitney U of arm A (pairs with A > B, ties counting half)."""
    mann_whitney_p: float
    mann_whitney_p_holm: float
    mann_whitney_min_p: float
    mann_whitney_method: str
    rank_biserial: float
    """2 P(A > B) - 1, in [-1, 1]."""
    prob_a_beats_b: float
    """P(A > B): a random run of A beats one of B (ties count half) = U / (n_a n_b)."""
    prob_ci: Interval
    notes: tuple[str, ...]


# ------------------------------------------------------------------------------------------- intervals
def t_interval(x: np.ndarray, level: float = CONFIDENCE) -> Interval:
    n = len(x)
    if n < 2:
        return Interval(math.nan, math.nan, "t", level)
    mean, sem = float(np.mean(x)), float(stats.sem(x))
    if sem == 0:
        return Interval(mean, mean, "t", level)
    low, high = stats.t.interval(level, n - 1, loc=mean, scale=sem)
    return Interval(float(low), float(high), "t", level)


def median_interval(x: np.ndarray, level: float = CONFIDENCE) -> Interval:
    """[x_(j), x_(n+1-j)] with the largest j whose coverage 1 - 2 P(Bin(n, 1/2) < j) reaches `level`."""
    n = len(x)
    if n == 0:
        return NAN_INTERVAL
    xs = np.sort(x)
    best_j = 1
    for j in range(1, n // 2 + 1):
        if 1 - 2 * stats.binom.cdf(j - 1, n, 0.5) >= level:
            best_j = j
    achieved = 1 - 2 * stats.binom.cdf(best_j - 1, n, 0.5)
    return Interval(float(xs[best_j - 1]), float(xs[n - best_j]), "order statistics", float(achieved))


def iqm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return stats.trim_mean(x, 0.25, axis=axis)


def bootstrap_interval(
    data: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], level: float = CONFIDENCE
) -> Interval:
    """BCa bootstrap (percentile where BCa is degenerate); a point interval when every resample is the same."""
    if min(len(d) for d in data) < 2:
        return Interval(math.nan, math.nan, "BCa bootstrap", level)
    if all(np.ptp(d) == 0 for d in data):
        value = float(statistic(*data))
        return Interval(value, value, "constant data", level)
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():  # a degenerate BCa says so with NaN, and then the percentile is used
            warnings.simplefilter("ignore")
            result = stats.bootstrap(
                data,
                statistic,
                n_resamples=BOOTSTRAP_RESAMPLES,
                method=method,
                confidence_level=level,
                rng=np.random.default_rng(RNG_SEED),
                vectorized=True,
            )
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return Interval(low, high, f"{method} bootstrap", level)
    value = float(statistic(*data))
    return Interval(value, value, "degenerate bootstrap", level)


def signed_rank_null_cdf(n: int) -> np.ndarray:
    """P(T+ <= k) for k = 0..n(n+1)/2 under H0 (no ties): count subsets of {1..n} by their sum."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1
    for rank in range(1, n + 1):
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    return np.cumsum(counts) / 2.0**n


def walsh_averages(d: np.ndarray) -> np.ndarray:
    """(d_i + d_j) / 2 for all i <= j, sorted."""
    i, j = np.triu_indices(len(d))
    return np.sort((d[i] + d[j]) / 2.0)


def hodges_lehmann(d: np.ndarray, level: float = CONFIDENCE) -> tuple[float, Interval]:
    """Estimate and interval of the centre of the paired differences (Hollander & Wolfe, ch. 3.2).

    The interval [W_(k+1), W_(M-k)] of the M sorted Walsh averages covers with probability 1 - 2 P(T+ <= k);
    k is the largest value keeping that >= level. With 5 or fewer differences even k = 0 ([min, max]) falls
    short of 95 %; the interval is then [min, max] and `level` says what it achieves.
    """
    n = len(d)
    if n == 0:
        return math.nan, NAN_INTERVAL
    walsh = walsh_averages(d)
    cdf = signed_rank_null_cdf(n)
    alpha = 1 - level
    k = 0
    while k + 1 < len(cdf) and cdf[k + 1] <= alpha / 2 + 1e-12:
        k += 1
    if cdf[0] > alpha / 2:
        k = 0
    m = len(walsh)
    achieved = 1 - 2 * cdf[k]
    return float(np.median(walsh)), Interval(
        float(walsh[k]), float(walsh[m - 1 - k]), "Walsh averages (signed-rank inversion)", float(achieved)
    )


# ------------------------------------------------------------------------------------------------ tests
def _permutation_method() -> stats.PermutationMethod:
    return stats.PermutationMethod(n_resamples=PERMUTATION_RESAMPLES, rng=np.random.default_rng(RNG_SEED))


def wilcoxon_min_p(n: int) -> float:
    return min(1.0, 2.0 / 2.0**n) if n > 0 else math.nan


def mann_whitney_min_p(n_a: int, n_b: int) -> float:
    return min(1.0, 2.0 / float(special.comb(n_a + n_b, n_a))) if n_a and n_b else math.nan


def paired_wilcoxon(d: np.ndarray) -> tuple[int, float, float, float, str]:
    """(non-zero n, statistic, T+ - T-, two-sided p, method) of the signed-rank test on differences `d`."""
    nonzero = d[d != 0]
    n = len(nonzero)
    if n == 0:
        return 0, math.nan, math.nan, math.nan, "n/a"
    signed_sum = float(np.sum(np.sign(nonzero) * stats.rankdata(np.abs(nonzero))))
    if n == 1:  # both sign patterns are as extreme as the one seen (scipy's permutation needs two values)
        return 1, 0.0, signed_sum, 1.0, "exact"
    method = "exact" if 2**n <= PERMUTATION_RESAMPLES else f"Monte Carlo ({PERMUTATION_RESAMPLES:,} sign flips)"
    result = stats.wilcoxon(nonzero, zero_method="wilcox", alternative="two-sided", method=_permutation_method())
    return n, float(result.statistic), signed_sum, min(1.0, float(result.pvalue)), method


def mann_whitney(a: np.ndarray, b: np.ndarray) -> tuple[float, float, str]:
    """(U of a, two-sided p, method) with the permutation distribution (exact when feasible, ties exact)."""
    method = (
        "exact"
        if special.comb(len(a) + len(b), len(a)) <= PERMUTATION_RESAMPLES
        else f"Monte Carlo ({PERMUTATION_RESAMPLES:,} splits)"
    )
    result = stats.mannwhitneyu(a, b, alternative="two-sided", method=_permutation_method())
    return float(result.statistic), min(1.0, float(result.pvalue)), method


def prob_a_beats_b(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    """Share of (a, b) pairs with a > b, ties counting half: U_a / (n_a n_b), along `axis` (for bootstrap)."""
    a, b = np.moveaxis(a, axis, -1), np.moveaxis(b, axis, -1)
    greater = (a[..., :, None] > b[..., None, :]).mean(axis=(-2, -1))
    ties = (a[..., :, None] == b[..., None, :]).mean(axis=(-2, -1))
    return greater + 0.5 * ties


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (scipy has BH/BY only); NaN inputs stay NaN and do not count."""
    p = np.asarray(p_values, dtype=float)
    valid = np.flatnonzero(~np.isnan(p))
    adjusted = np.full(len(p), math.nan)
    order = valid[np.argsort(p[valid], kind="stable")]
    m = len(order)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[index]))
        adjusted[index] = running
    return adjusted.tolist()


# --------------------------------------------------------------------------------------------- summaries
def in_seed_order(by_seed: Mapping[int, float]) -> np.ndarray:
    """Values sorted by seed: the one canonical order every computation reads."""
    return np.asarray([by_seed[s] for s in sorted(by_seed)], dtype=float)


def summarize_arm(arm: str, by_seed: Mapping[int, float]) -> ArmSummary:
    x = in_seed_order(by_seed)
    if len(x) == 0:
        return ArmSummary(arm, 0, math.nan, NAN_INTERVAL, math.nan, NAN_INTERVAL, math.nan, NAN_INTERVAL)
    return ArmSummary(
        arm=arm,
        n=len(x),
        mean=float(x.mean()),
        mean_ci=t_interval(x),
        median=float(np.median(x)),
        median_ci=median_interval(x),
        iqm=float(iqm(x)),
        iqm_ci=bootstrap_interval((x,), iqm),
    )


def compare_pair(
    arm_a: str, a_by_seed: Mapping[int, float], arm_b: str, b_by_seed: Mapping[int, float]
) -> PairComparison:
    a, b = in_seed_order(a_by_seed), in_seed_order(b_by_seed)
    notes: list[str] = []
    paired = sorted(set(a_by_seed) & set(b_by_seed))
    d = np.round(np.asarray([a_by_seed[s] - b_by_seed[s] for s in paired], dtype=float), DECIMALS)
    w_n, w_stat, w_sum, w_p, w_method = paired_wilcoxon(d)
    hl, hl_ci = hodges_lehmann(d)
    if len(paired) and w_n == 0:
        notes.append("every paired by run seed difference is zero: the arms did exactly the same on every seed")
    if w_n and len(d) > w_n:
        notes.append(f"{len(d) - w_n} of {len(d)} paired differences are zero and were dropped by the signed-rank test")
    if w_n and wilcoxon_min_p(w_n) > 0.05:
        notes.append(f"{w_n} non-zero pairs: the paired test's smallest possible p is {wilcoxon_min_p(w_n):.3g}")
    if min(len(a), len(b)) == 0:
        missing = arm_a if len(a) == 0 else arm_b
        notes.append(f"no finished trials in {missing}")
        return PairComparison(
            arm_a,
            arm_b,
            len(paired),
            w_n,
            w_stat,
            w_p,
            w_p,
            wilcoxon_min_p(w_n),
            w_method,
            w_sum,
            hl,
            hl_ci,
            len(a),
            len(b),
            math.nan,
            math.nan,
            math.nan,
            math.nan,
            "n/a",
            math.nan,
            math.nan,
            NAN_INTERVAL,
            tuple(notes),
        )
    if min(len(a), len(b)) < 2:
        notes.append("an arm with a single run: no unpaired test")
        u = float(stats.mannwhitneyu(a, b).statistic)
        mw_p, mw_method = math.nan, "n/a"
    else:
        u, mw_p, mw_method = mann_whitney(a, b)
    prob = u / (len(a) * len(b))
    assert math.isclose(prob, float(prob_a_beats_b(a, b))), (prob, prob_a_beats_b(a, b))
    if len(np.unique(np.concatenate([a, b]))) < len(a) + len(b):
        notes.append("tied values: p-values use the exact permutation distribution with the ties")
    return PairComparison(
        arm_a=arm_a,
        arm_b=arm_b,
        n_pairs=len(paired),
        wilcoxon_n=w_n,
        wilcoxon_statistic=w_stat,
        wilcoxon_p=w_p,
        wilcoxon_p_holm=w_p,
        wilcoxon_min_p=wilcoxon_min_p(w_n),
        wilcoxon_method=w_method,
        signed_rank_sum=w_sum,
        hodges_lehmann=hl,
        hodges_lehmann_ci=hl_ci,
        n_a=len(a),
        n_b=len(b),
        u=u,
        mann_whitney_p=mw_p,
        mann_whitney_p_holm=mw_p,
        mann_whitney_min_p=mann_whitney_min_p(len(a), len(b)),
        mann_whitney_method=mw_method,
        rank_biserial=2 * prob - 1,
        prob_a_beats_b=prob,
        prob_ci=bootstrap_interval((a, b), prob_a_beats_b),
        notes=tuple(notes),
    )


def compare_arms(
    values: Mapping[str, Mapping[int, float]], family: Sequence[tuple[str, str]] | None = None
) -> list[PairComparison]:
    """The pairs of `family` (default: every pair of arms, in arm order); Holm over those pairs, separately for the
    paired and the unpaired test."""
    family = list(itertools.combinations(values, 2)) if family is None else family
    return holm_over([compare_pair(a, values[a], b, values[b]) for a, b in family])


def holm_over(pairs: Sequence[PairComparison]) -> list[PairComparison]:
    """The pairs with their Holm-adjusted p-values over this family, separately for the paired and unpaired test."""
    paired_holm = holm([p.wilcoxon_p for p in pairs])
    unpaired_holm = holm([p.mann_whitney_p for p in pairs])
    return [replace(p, wilcoxon_p_holm=w, mann_whitney_p_holm=u) for p, w, u in zip(pairs, paired_holm, unpaired_holm)]


def seeds_needed(alpha: float) -> int:
    """Non-zero pairs an exact two-sided signed-rank test needs before its smallest p drops below alpha."""
    n = 1
    while wilcoxon_min_p(n) >= alpha:
        n += 1
    return n


def verdict(pair: PairComparison, metric: str, alpha: float, pairs_in_family: int) -> str:
    """One sentence, resting on the paired test (Holm-corrected when more than one pair is compared)."""
    label = "Holm-corrected p" if pairs_in_family > 1 else "p"
    secondary = (
        f"Mann-Whitney {label}={pair.mann_whitney_p_holm:.3g}"
        if math.isfinite(pair.mann_whitney_p_holm)
        else "Mann-Whitney n/a"
    )
    effect = (
        f"median paired difference (Hodges-Lehmann) {pair.hodges_lehmann:+.4g} "
        f"[{pair.hodges_lehmann_ci.low:+.4g}, {pair.hodges_lehmann_ci.high:+.4g}] "
        f"at {100 * pair.hodges_lehmann_ci.level:.0f} %"
        if math.isfinite(pair.hodges_lehmann)
        else "no paired difference"
    )
    head = f"{pair.arm_a} vs {pair.arm_b} on {metric}"
    if pair.n_pairs == 0:
        return f"{head}: no test possible ({'; '.join(pair.notes) or 'no seed finished in both arms'})."
    if pair.wilcoxon_n == 0:
        return f"{head}: no difference: every one of the {pair.n_pairs} run-seed pairs scored the same ({secondary})."
    if pair.wilcoxon_min_p >= alpha:
        return (
            f"{head}: undecidable at alpha={alpha}: "
            f"with {pair.wilcoxon_n} non-zero run-seed pairs the exact paired test "
            f"cannot give p below {pair.wilcoxon_min_p:.3g}; at least {seeds_needed(alpha)} are needed "
            f"({effect}; {secondary})."
        )
    p = pair.wilcoxon_p_holm
    stats_text = f"paired Wilcoxon {label}={p:.3g}, n={pair.wilcoxon_n} pairs; {effect}; {secondary}"
    if p < alpha:
        if pair.signed_rank_sum > 0:
            return f"{pair.arm_a} beats {pair.arm_b} on {metric} at alpha={alpha} ({stats_text})."
        # the winner is B: state the effect as B - A, so the sentence and its number agree
        ci = pair.hodges_lehmann_ci
        effect_b = (
            f"median paired difference {pair.arm_b} - {pair.arm_a} (Hodges-Lehmann) {-pair.hodges_lehmann:+.4g} "
            f"[{-ci.high:+.4g}, {-ci.low:+.4g}] at {100 * ci.level:.0f} %"
        )
        stats_b = f"paired Wilcoxon {label}={p:.3g}, n={pair.wilcoxon_n} pairs; {effect_b}; {secondary}"
        return f"{pair.arm_b} beats {pair.arm_a} on {metric} at alpha={alpha} ({stats_b})."
    return (
        f"No difference in {metric} between {pair.arm_a} and {pair.arm_b} was detected at alpha={alpha} ({stats_text})."
    )
