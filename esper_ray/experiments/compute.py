"""Size and compute per arm and per pair, so that a verdict also reads at equal size.

Per trial the evaluation holds means over its evaluation episodes: final parameters (host + kept seeds),
parameters added, training FLOPs of the host runs (host and seeds, forward + backward), validation and
counterfactual FLOPs (morpho/flops.py says what counts), wall seconds on the trial's device and refused
actions. A PPO arm's figures are those of its greedy policy's evaluation episodes: the host runs that trained
the controller itself (rounds x envs x episodes_per_env of them) are not in them.

Per pair (seeds finished in both arms): the median over seeds of the paired difference A - B and of the
paired ratio A / B, for final parameters, training FLOPs and all FLOPs (training + validation +
counterfactual). Medians, because a ratio's mean is pulled by one large seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from esper_ray.experiments.results import FINISHED, ExperimentRecord

SIZE_FIELDS = (
    "final_params",
    "params_added",
    "train_flops",
    "seed_train_flops",
    "validation_flops",
    "counterfactual_flops",
    "seconds",
    "refused",
)


@dataclass(frozen=True)
class ArmCompute:
    arm: str
    n: int
    """Finished trials with size figures (0 for runs made before they were recorded)."""
    means: dict[str, float]
    """Mean over the arm's finished trials of each of SIZE_FIELDS."""
    final_params_range: tuple[float, float]


@dataclass(frozen=True)
class PairCompute:
    arm_a: str
    arm_b: str
    n_pairs: int
    params_difference: float
    """Median over seeds of final parameters A - B."""
    params_ratio: float
    """Median over seeds of final parameters A / B."""
    train_flops_difference: float
    train_flops_ratio: float
    all_flops_ratio: float
    """Training + validation + counterfactual FLOPs, median paired ratio A / B."""


def _all_flops(evaluation: dict[str, float]) -> float:
    return evaluation["train_flops"] + evaluation["validation_flops"] + evaluation["counterfactual_flops"]


def by_seed(record: ExperimentRecord, field: str) -> dict[str, dict[int, float]]:
    """{arm: {seed: value}} of one size field (or "all_flops") over finished trials that recorded it."""
    out: dict[str, dict[int, float]] = {arm: {} for arm in record.spec.arms}
    for t in record.trials:
        if t.status != FINISHED or t.evaluation is None or "train_flops" not in t.evaluation:
            continue
        value = _all_flops(t.evaluation) if field == "all_flops" else t.evaluation.get(field, math.nan)
        if math.isfinite(value):
            out[t.arm][t.seed] = value
    return out


def summarize_compute(record: ExperimentRecord) -> tuple[list[ArmCompute], list[PairCompute]]:
    fields = {f: by_seed(record, f) for f in (*SIZE_FIELDS, "all_flops")}
    arms = []
    for arm in record.spec.arms:
        params = list(fields["final_params"][arm].values())
        arms.append(
            ArmCompute(
                arm=arm,
                n=len(params),
                means={
                    f: float(np.mean(list(fields[f][arm].values()))) if fields[f][arm] else math.nan
                    for f in SIZE_FIELDS
                },
                final_params_range=(min(params), max(params)) if params else (math.nan, math.nan),
            )
        )
    pairs = []
    for a, b in record.spec.compared_pairs:  # the verdict's pairs, in its order
        params_d, params_r, n = _paired(fields["final_params"][a], fields["final_params"][b])
        train_d, train_r, _ = _paired(fields["train_flops"][a], fields["train_flops"][b])
        _, all_r, _ = _paired(fields["all_flops"][a], fields["all_flops"][b])
        pairs.append(PairCompute(a, b, n, params_d, params_r, train_d, train_r, all_r))
    return arms, pairs


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, int]:
    """(median of A - B, median of A / B, run-seed pairs) over the seeds in both; the ratio is NaN where B has a 0."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return math.nan, math.nan, 0
    va = np.asarray([a[s] for s in seeds], dtype=float)
    vb = np.asarray([b[s] for s in seeds], dtype=float)
    ratio = float(np.median(va / vb)) if np.all(vb > 0) else math.nan
    return float(np.median(va - vb)), ratio, len(seeds)


def _relative(ratio: float, what: str, other: str) -> str:
    """ "40 % fewer final parameters than fixed", or "as many final parameters as fixed"."""
    if not math.isfinite(ratio):
        return f"n/a {what} against {other}"
    if abs(ratio - 1) < 0.005:
        return f"as many {what} as {other}"
    return f"{100 * abs(1 - ratio):.0f} % {'fewer' if ratio < 1 else 'more'} {what} than {other}"


def size_sentence(pair: PairCompute) -> str:
    """ "At equal size: ppo has 40 % fewer final parameters than fixed (median paired difference -300), ..." """
    if pair.n_pairs == 0:
        return f"At equal size: {pair.arm_a} vs {pair.arm_b}: no seed with size figures in both arms."
    return (
        f"At equal size: {pair.arm_a} has {_relative(pair.params_ratio, 'final parameters', pair.arm_b)} "
        f"(median paired difference {pair.params_difference:+,.0f}) and uses "
        f"{_relative(pair.train_flops_ratio, 'training FLOPs', pair.arm_b)} ({pair.train_flops_difference:+.3g}; "
        f"{_relative(pair.all_flops_ratio, 'FLOPs', pair.arm_b)} with validation and counterfactual passes), "
        f"over {pair.n_pairs} run-seed pairs."
    )
