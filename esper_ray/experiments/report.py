"""The A/B report: results.json (strict JSON), report.md and four figures.

    metric_by_arm.png        every finished trial's metric as a point, seeds joined across arms (the pairing),
                             the arm's mean with its t-interval; a box only from 10 points up
    learning_curves.png      per PPO arm, the mean training-rollout curve with its t-interval band over thin
                             per-seed lines; baseline arms as a level with its band
    performance_profile.png  the fraction of runs scoring above each threshold, with 95 % bootstrap bands
                             (rliable's score distributions)
    metric_vs_flops.png      every finished trial's metric against the training FLOPs of its evaluation episodes'
                             host runs (one point per seed): quality against compute, per arm
    equal_cost.png           at equal cost (`host_runs`) only: test score against host runs k per new host
                             (equal_cost_report.py)
Arms keep the experiment file's order and one colour everywhere.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from esper_ray.contracts.controllers import ControllerKind  # noqa: E402
from esper_ray.experiments import equal_cost_report, held_out_report  # noqa: E402
from esper_ray.experiments.compute import ArmCompute, by_seed, size_sentence, summarize_compute  # noqa: E402
from esper_ray.experiments.results import (
    FINISHED,
    NOT_KEPT,
    NOT_PLANTED,
    TUNE_DIR,
    ExperimentRecord,
    as_json,  # noqa: E402
    metric_by_arm,
)
from esper_ray.experiments.rollout_blocks import block_lines  # noqa: E402
from esper_ray.experiments.statistics import (  # noqa: E402
    ArmSummary,
    Interval,
    PairComparison,
    compare_arms,
    seeds_needed,
    summarize_arm,
    t_interval,
    verdict,
)
from esper_ray.formatting import counted  # noqa: E402

FIGURES = ("metric_by_arm.png", "learning_curves.png", "performance_profile.png", "metric_vs_flops.png")
BOX_FROM_N = 10
PROFILE_RESAMPLES = 2_000
METRIC_LABELS = {
    "test_accuracy": "test accuracy of the final host (held-out split, mean over evaluation episodes)",
    "test_accuracy_per_param": "test accuracy per 1,000 parameters of the final model",
    "rollout_accuracy": "validation accuracy at the end of the training rollouts (last rounds)",
    "rollout_accuracy_per_param": "training-rollout validation accuracy per 1,000 parameters",
}


def strict_json(value: Any) -> Any:
    """NaN and infinities become null: results.json must be JSON that jq and every other reader accepts."""
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, Enum):
        return value.value
    return value


def write_report(output: Path, record: ExperimentRecord) -> dict[str, Any]:
    spec = record.spec
    values = metric_by_arm(record)
    arms = [summarize_arm(arm, by_seed) for arm, by_seed in values.items()]
    held_out = held_out_report.held_out_statistics(record) if spec.held_out is not None else None
    # with held-out hosts the verdict is the pooled one (a pair pooled over the hosts both its arms ran on)
    pairs = held_out["pooled"] if held_out is not None else compare_arms(values, spec.compared_pairs)
    verdicts = [verdict(p, spec.metric, spec.alpha, len(pairs)) for p in pairs]
    family = "the pairs of the experiment's `compare`" if spec.compare is not None else "all pairs"
    arm_compute, pair_compute = summarize_compute(record)
    size_verdicts = [size_sentence(p) for p in pair_compute]
    results = as_json(record)
    results["statistics"] = {
        "metric": spec.metric,
        "alpha": spec.alpha,
        "pairs_in_family": len(pairs),
        "primary_test": f"paired Wilcoxon signed-rank (exact sign-flip distribution), Holm over {family}",
        "secondary_test": f"Mann-Whitney U (exact permutation distribution), Holm over {family}",
        "arms": [asdict(a) for a in arms],
        "pairs": [asdict(p) for p in pairs],
        "verdicts": verdicts,
        "excluded_trials": [
            {"arm": t.arm, "seed": t.seed, "status": t.status, "error": t.error} for t in record.excluded
        ],
        "compute": {
            "arms": [asdict(a) for a in arm_compute],
            "pairs": [asdict(p) for p in pair_compute],
            "size_verdicts": size_verdicts,
        },
    }
    if held_out is not None:
        results["statistics"]["held_out"] = held_out_report.as_json(held_out)
    equal_cost = equal_cost_report.equal_cost_statistics(record) if spec.host_runs is not None else None
    if equal_cost is not None:
        results["statistics"]["equal_cost"] = equal_cost_report.as_json(equal_cost)
    (output / "results.json").write_text(json.dumps(strict_json(results), indent=2, allow_nan=False))
    extra = held_out_report.held_out_lines(held_out, spec.metric) if held_out is not None else []
    if equal_cost is not None:
        extra += equal_cost_report.equal_cost_lines(equal_cost, spec.metric, list(spec.arms))
    (output / "report.md").write_text(markdown(record, arms, pairs, verdicts, arm_compute, size_verdicts, extra))
    colors = arm_colors(list(spec.arms))
    plot_metric_by_arm(output / FIGURES[0], values, spec.metric, colors)
    plot_learning_curves(output / FIGURES[1], record, colors)
    plot_performance_profile(output / FIGURES[2], values, spec.metric, colors)
    plot_metric_vs_flops(output / FIGURES[3], values, by_seed(record, "train_flops"), spec.metric, colors)
    if equal_cost is not None:
        save_figure(equal_cost_report.figure(equal_cost, spec.metric, colors), output / equal_cost_report.FIGURE)
    return results


# ------------------------------------------------------------------------------------------------ markdown
def _fmt(x: float, digits: int = 4) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def _ci(interval: Interval) -> str:
    if not math.isfinite(interval.low):
        return "n/a"
    level = (
        f", {100 * interval.level:.1f} %" if math.isfinite(interval.level) and abs(interval.level - 0.95) > 1e-9 else ""
    )
    return f"[{_fmt(interval.low)}, {_fmt(interval.high)}]{level}"


def _ppo_first(record: ExperimentRecord) -> bool:
    """Whether the run started its PPO trials before the others (spec.start_order; a run recorded before it
    started every trial in one random permutation)."""
    kinds = [t.controller is ControllerKind.PPO for t in sorted(record.trials, key=lambda t: t.position)]
    return kinds == sorted(kinds, reverse=True) and any(kinds) and not all(kinds)


def markdown(
    record: ExperimentRecord,
    arms: list[ArmSummary],
    pairs: list[PairComparison],
    verdicts: list[str],
    arm_compute: list[ArmCompute],
    size_verdicts: list[str],
    held_out: list[str] | None = None,
) -> str:
    """`held_out`: the held-out hosts' section (held_out_report.py), after the pairs."""
    spec = record.spec
    planned = len(record.trials)
    excluded = record.excluded
    lines = [
        f"# A/B experiment `{spec.name}`",
        "",
        f"Metric: **{spec.metric}**: {METRIC_LABELS[spec.metric]}; common to every arm, never an arm's own reward. "
        f"Alpha {spec.alpha}. {counted(len(spec.seeds), 'run seed')} shared by all arms "
        "(run seed s: same host initialisation, "
        f"data order and {counted(spec.eval_episodes, 'evaluation episode')} in every arm), "
        f"{counted(spec.rounds, 'PPO round')} per trial.",
        *(
            [
                f"At equal cost: every arm spent {spec.host_runs} host runs per held-out host (its evaluation "
                "episodes), and its metric there is the test score of the run best by validation of them, not their "
                "mean (section \"At equal cost\" has every k)."
            ]
            if spec.host_runs is not None
            else []
        ),
        "Controllers: " + ", ".join(f"{a} = {_controller_label(spec, a)}" for a in spec.arms) + ".",
        f"Start order: {'PPO trials first (the longest), each kind in ' if _ppo_first(record) else ''}a random "
        f"permutation with order seed {record.order_seed}{' (drawn for this run)' if record.order_seed_drawn else ''}: "
        + ", ".join(f"{t.arm}/{t.seed}" for t in sorted(record.trials, key=lambda t: t.position))
        + ".",
        *(
            [
                "Device: the experiment file puts envs on GPUs; the machine had none, so every trial ran on the CPUs "
                "(no GPU share, no MPS; flex_attention, which has no CPU backward, masked)."
            ]
            if record.on_cpus
            else []
        ),
        *[f"**Too short to keep a seed:** {line}." for line in spec.short_run_warnings()],
        "",
        "## Verdict",
        "",
        "The verdict rests on the test paired by run seed (Wilcoxon signed-rank, exact), "
        f"Holm-corrected over the {len(pairs)} "
        f"pair(s){' the experiment file names (compare)' if spec.compare is not None else ''}; "
        "Mann-Whitney U is the unpaired view. "
        f"An exact paired test needs at least {seeds_needed(spec.alpha)} "
        f"non-zero run-seed pairs to reach alpha={spec.alpha}.",
        "",
        *[f"- {v} {s}" for v, s in zip(verdicts, size_verdicts)],
    ]
    if excluded:
        lines += [
            "",
            f"**n shrank:** {len(excluded)} of {planned} planned trials did not finish and are excluded from "
            "the statistics: "
            + ", ".join(f"{t.arm}/seed {t.seed} ({t.status}{': ' + t.error if t.error else ''})" for t in excluded)
            + ".",
        ]
    lines += [
        "",
        "## Arms",
        "",
        "| arm | controller | n | mean [95 % t] | median [order statistics] | IQM [95 % BCa] |",
        "|---|---|---|---|---|---|",
        *[
            f"| {a.arm} | {_controller_label(spec, a.arm)} | {a.n} | {_fmt(a.mean)} {_ci(a.mean_ci)} | "
            f"{_fmt(a.median)} {_ci(a.median_ci)} | {_fmt(a.iqm)} {_ci(a.iqm_ci)} |"
            for a in arms
        ],
        "",
        "## Pairs",
        "",
        "Differences are A - B. "
        "Intervals are 95 % unless another coverage is given (the exact coverage that n allows).",
        "",
        "| A | B | run-seed pairs (non-zero) | paired p (Holm) | smallest possible p | Hodges-Lehmann A - B | "
        "Mann-Whitney U | unpaired p (Holm) | P(A > B) | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in pairs:
        lines.append(
            f"| {p.arm_a} | {p.arm_b} | {p.n_pairs} ({p.wilcoxon_n}) | "
            f"{_fmt(p.wilcoxon_p)} ({_fmt(p.wilcoxon_p_holm)}) | "
            f"{_fmt(p.wilcoxon_min_p)} | {_fmt(p.hodges_lehmann)} {_ci(p.hodges_lehmann_ci)} | {_fmt(p.u)} | "
            f"{_fmt(p.mann_whitney_p)} ({_fmt(p.mann_whitney_p_holm)}) | {_fmt(p.prob_a_beats_b)} {_ci(p.prob_ci)} | "
            f"{'; '.join(p.notes)} |"
        )
    lines += held_out or []
    lines += kept_lines(record)
    lines += loss_lines(record)
    lines += compute_lines(arm_compute)
    lines += training_cost_lines(record)
    lines += block_lines(record)
    salvaged = any(t.ran_in != [TUNE_DIR] for t in record.trials if t.ran_in)  # a killed run, salvaged
    lines += ["", "## Trials", ""]
    if salvaged:
        lines += [
            "Part of this run was killed and salvaged (`esper-ray ab --resume --salvage`): `ran in` names the "
            "Tune folders a trial's results come from, a set-aside folder's rounds up to the checkpoint it "
            "continued from.",
            "",
        ]
    lines += [
        "| position | arm | seed | controller | status | metric | rounds |" + (" ran in |" if salvaged else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if salvaged else ""),
    ]
    for t in sorted(record.trials, key=lambda t: t.position):
        lines.append(
            f"| {t.position} | {t.arm} | {t.seed} | {t.controller.value} | {t.status} | "
            f"{_fmt(t.metric(spec.metric, spec.rollout_rounds))} | {len(t.history)} |"
            + (f" {', '.join(t.ran_in)} |" if salvaged else "")
        )
    figures = [*FIGURES, *([equal_cost_report.FIGURE] if spec.host_runs is not None else [])]
    lines += ["", "Figures: " + ", ".join(f"`{f}`" for f in figures) + "."]
    return "\n".join(lines) + "\n"


def _controller_label(spec: Any, arm: str) -> str:
    fixed = spec.fixed_plan(arm)
    if fixed is not None:
        return f"fixed({fixed.label})"
    search = spec.search_settings(arm)
    if search is not None:
        return f"search({search.algorithm}, budget {search.budget})"
    return spec.controller(arm).value


def kept_lines(record: ExperimentRecord) -> list[str]:
    """What each arm's host runs kept: the metric scores the committed model (host and fossils); the seeds still on
    probation when a run ended are dropped. Both accuracies side by side, so a reader sees what was not kept."""
    with_probation = by_seed(record, "test_accuracy_with_probation")
    arms = [a for a in record.spec.arms if with_probation[a]]
    if not arms:
        return []  # runs made before the committed model
    test, kept = by_seed(record, "test_accuracy"), by_seed(record, "params_added")
    probation, fossilized = by_seed(record, "params_on_probation"), by_seed(record, "fossilized")

    def mean(values: dict[int, float]) -> float:
        return float(np.mean(list(values.values()))) if values else math.nan

    lines = [
        "",
        "## What the host runs kept",
        "",
        "A host run keeps its committed model: the host and its fossilized seeds (docs/design.md, \"The end of a host "
        "run\"). The test accuracy above is that model's; beside it, the same evaluation episodes with the seeds still "
        "on probation left in at their last alpha. Means per evaluation episode over each arm's finished trials.",
        "",
        "| arm | test accuracy, committed | with seeds on probation | fossilized seeds | params kept | "
        "params on probation (dropped) |",
        "|---|---|---|---|---|---|",
    ]
    for arm in arms:
        lines.append(
            f"| {arm} | {_fmt(mean(test[arm]))} | {_fmt(mean(with_probation[arm]))} | "
            f"{_fmt(mean(fossilized[arm]), 3)} | "
            f"{_fmt(mean(kept[arm]), 6)} | {_fmt(mean(probation[arm]), 6)} |"
        )
    return lines + ([] if record.spec.held_out is not None else unplanted_lines(record))  # held-out: per host there


def unplanted_lines(record: ExperimentRecord) -> list[str]:
    """The fixed and search arms whose plan the evaluation episodes never planted or never kept, with the seeds."""
    notes: dict[str, dict[str, list[int]]] = {}
    for t in sorted(record.trials, key=lambda t: t.seed):
        note = (
            t.plan_note()
            if t.status == FINISHED and t.controller in (ControllerKind.FIXED, ControllerKind.SEARCH)
            else None
        )
        if note is not None:
            notes.setdefault(t.arm, {}).setdefault(note, []).append(t.seed)
    return (
        [
            "",
            *[
                f"- {arm} ({_controller_label(record.spec, arm)}): its plan was {note} "
                f"on seed(s) {', '.join(map(str, seeds))}"
                f" ({NOTE_MEANING[note]})."
                for arm, by_note in notes.items()
                for note, seeds in by_note.items()
            ],
        ]
        if notes
        else []
    )


NOTE_MEANING = {
    NOT_PLANTED: "no evaluation episode planted its seed: the run left no room for its tempo",
    NOT_KEPT: "planted, and never fossilized before the run ended",
}


def training_cost_lines(record: ExperimentRecord) -> list[str]:
    """The full cost of each arm's controller beyond its evaluation episodes: a PPO arm's training host runs, a
    fixed arm's sweep (as its experiment file states it)."""
    spec = record.spec
    rows = []
    for arm in spec.arms:
        kind = spec.controller(arm)
        if kind is ControllerKind.PPO:  # envs, episodes and epochs are the same for every seed
            envs, episodes, epochs = (spec.arm_setting(arm, k) for k in ("envs", "episodes_per_env", "max_epochs"))
            runs = spec.rounds * envs * episodes  # however the envs were split into runners (envs_per_runner)
            rows.append(
                f"| {arm} | {runs:,} host runs of {epochs} epochs per run seed ({counted(spec.rounds, 'round')} x "
                f"{counted(envs, 'env')} x {counted(episodes, 'episode')}) |"
            )
        elif kind is ControllerKind.FIXED:
            sweep = spec.arms[arm].get("sweep_host_runs")
            rows.append(
                f"| {arm} | "
                + (
                    f"{sweep:,} host runs once for all seeds (the sweep that picked its seed) |"
                    if sweep is not None
                    else "the sweep that picked its seed (not stated in the file) |"
                )
            )
        elif kind is ControllerKind.CHECKPOINT:
            rows.append(f"| {arm} | trained before this run ({spec.arms[arm]['checkpoint']}); frozen here |")
        elif kind is ControllerKind.SEARCH:
            search = spec.search_settings(arm)
            rows.append(
                f"| {arm} | none before; on every host a search of up to {search.budget} host runs "
                f"({search.algorithm}) |"
            )
        else:
            rows.append(f"| {arm} | none (rules, no training) |")
    return [
        "",
        "## What each controller cost before its evaluation",
        "",
        "| arm | training or search |",
        "|---|---|",
        *rows,
    ]


def loss_lines(record: ExperimentRecord) -> list[str]:
    """Test loss and perplexity beside the metric: per arm, and paired by run seed per pair of arms (none in older
    runs)."""
    perplexity = by_seed(record, "test_perplexity")
    loss = by_seed(record, "test_loss")
    arms = [a for a in record.spec.arms if perplexity[a]]
    if not arms:
        return []
    lines = [
        "",
        "## Test loss and perplexity",
        "",
        "A trial's test loss is the mean held-out loss (per token on text) of its evaluation episodes, its perplexity "
        "exp of that loss; lower is better. Paired differences are medians over the seeds both arms finished.",
        "",
        "| arm | n | test loss, mean | perplexity, mean [min, max] |",
        "|---|---|---|---|",
    ]
    for arm in arms:
        p = list(perplexity[arm].values())
        lines.append(
            f"| {arm} | {len(p)} | {_fmt(float(np.mean(list(loss[arm].values()))))} | "
            f"{_fmt(float(np.mean(p)))} [{_fmt(min(p))}, {_fmt(max(p))}] |"
        )
    lines += [
        "",
        "| A | B | run-seed pairs | perplexity A - B, median | seeds with lower perplexity in A |",
        "|---|---|---|---|---|",
    ]
    for i, a in enumerate(arms):
        for b in arms[i + 1 :]:
            seeds = sorted(set(perplexity[a]) & set(perplexity[b]))
            diff = [perplexity[a][s] - perplexity[b][s] for s in seeds]
            lines.append(
                f"| {a} | {b} | {len(seeds)} | {_fmt(float(np.median(diff)) if diff else math.nan)} | "
                f"{sum(d < 0 for d in diff)} of {len(seeds)} |"
            )
    return lines


def compute_lines(arm_compute: list[ArmCompute]) -> list[str]:
    """The size and compute table: means per evaluation episode over each arm's finished trials."""

    def flops(x: float) -> str:
        return "n/a" if not math.isfinite(x) else f"{x:.3g}"

    lines = [
        "",
        "## Size and compute",
        "",
        "Means per evaluation episode over each arm's finished trials. FLOPs count convolutions, linear layers and "
        "attention matmuls from the modules' shapes (training = forward + backward of host and seeds; validation = "
        "the model as it is; counterfactual = the extra configurations with seeds switched off); seconds are wall "
        "seconds of an episode on the trial's device. A PPO arm's figures are its greedy policy's evaluation "
        "episodes; the host runs that trained the controller are not included.",
        "",
        "| arm | n | final params [min, max] | params added | training FLOPs | of which seeds | validation FLOPs | "
        "counterfactual FLOPs | seconds | refused actions |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in arm_compute:
        m = a.means
        lines.append(
            f"| {a.arm} | {a.n} | {_fmt(m['final_params'], 6)} [{_fmt(a.final_params_range[0], 6)}, "
            f"{_fmt(a.final_params_range[1], 6)}] | {_fmt(m['params_added'], 6)} | {flops(m['train_flops'])} | "
            f"{flops(m['seed_train_flops'])} | {flops(m['validation_flops'])} | {flops(m['counterfactual_flops'])} | "
            f"{_fmt(m['seconds'], 3)} | {_fmt(m['refused'], 3)} |"
        )
    return lines


# ------------------------------------------------------------------------------------------------- figures
def arm_colors(arms: list[str]) -> dict[str, Any]:
    palette = plt.get_cmap("tab10")
    return {arm: palette(i % 10) for i, arm in enumerate(arms)}


def plot_metric_by_arm(path: Path, values: dict[str, dict[int, float]], metric: str, colors: dict[str, Any]) -> None:
    arms = list(values)
    fig, ax = plt.subplots(figsize=(2.0 + 1.5 * len(arms), 4.2))
    seeds = sorted({s for by_seed in values.values() for s in by_seed})
    for seed in seeds:  # the pairing: one faint line per seed across the arms that finished it
        xs = [i for i, a in enumerate(arms) if seed in values[a]]
        ax.plot(xs, [values[arms[i]][seed] for i in xs], color="0.8", linewidth=0.8, zorder=1)
    for i, arm in enumerate(arms):
        points = np.asarray([values[arm][s] for s in sorted(values[arm])], dtype=float)
        if len(points) >= BOX_FROM_N:
            ax.boxplot([points], positions=[i], widths=0.5, showfliers=False)
        offsets = np.linspace(-0.08, 0.08, len(points)) if len(points) > 1 else np.zeros(len(points))
        ax.scatter(i + offsets, points, color=colors[arm], zorder=3, s=22)
        if len(points):
            ci = t_interval(points)
            low, high = (ci.low, ci.high) if math.isfinite(ci.low) else (points.mean(), points.mean())
            ax.errorbar(
                [i + 0.22],
                [points.mean()],
                yerr=[[points.mean() - low], [high - points.mean()]],
                fmt="D",
                color=colors[arm],
                capsize=4,
                zorder=4,
            )
    ax.set_xticks(range(len(arms)), [f"{a}\n(n={len(values[a])})" for a in arms])
    ax.set_xlim(-0.5, len(arms) - 0.5)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} per trial (points), mean and 95 % t-interval (diamond); grey: same seed")
    ax.title.set_fontsize(9)
    save_figure(fig, path)


def plot_learning_curves(path: Path, record: ExperimentRecord, colors: dict[str, Any]) -> None:
    spec = record.spec
    per_param = spec.metric.endswith("_per_param")
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    finished = [t for t in record.trials if t.status == FINISHED]
    for arm in spec.arms:
        trials = sorted((t for t in finished if t.arm == arm), key=lambda t: t.seed)
        if not trials:
            continue
        if spec.controller(arm) is ControllerKind.PPO:
            curves = [t.rollout_curve(per_param) for t in trials]
            for curve in curves:
                ax.plot(range(1, len(curve) + 1), curve, color=colors[arm], alpha=0.25, linewidth=0.8)
            length = min(len(c) for c in curves)
            stacked = np.asarray([c[:length] for c in curves], dtype=float)
            mean = stacked.mean(axis=0)
            bands = [t_interval(stacked[:, r]) for r in range(length)]
            rounds = np.arange(1, length + 1)
            ax.plot(rounds, mean, color=colors[arm], linewidth=2.2, label=f"{arm} (ppo, n={len(trials)})")
            if len(trials) > 1:
                ax.fill_between(rounds, [b.low for b in bands], [b.high for b in bands], color=colors[arm], alpha=0.2)
        else:
            level = np.asarray(
                [t.metric("rollout_accuracy_per_param" if per_param else "rollout_accuracy", 1) for t in trials]
            )
            band = t_interval(level)
            ax.axhline(
                level.mean(),
                color=colors[arm],
                linestyle="--",
                linewidth=1.8,
                label=f"{arm} ({spec.controller(arm).value}, no training, n={len(trials)})",
            )
            if math.isfinite(band.low):
                ax.axhspan(band.low, band.high, color=colors[arm], alpha=0.12)
    ax.set_xlabel("round")
    ax.set_ylabel("rollout final validation accuracy" + (" per 1,000 params" if per_param else ""))
    ax.set_title("training rollouts: mean over seeds with 95 % t-band, thin lines = seeds")
    ax.title.set_fontsize(9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_metric_vs_flops(
    path: Path,
    values: dict[str, dict[int, float]],
    train_flops: dict[str, dict[int, float]],
    metric: str,
    colors: dict[str, Any],
) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for arm, by_seed_value in values.items():
        seeds = sorted(set(by_seed_value) & set(train_flops[arm]))
        if seeds:
            ax.scatter(
                [train_flops[arm][s] for s in seeds],
                [by_seed_value[s] for s in seeds],
                color=colors[arm],
                s=24,
                label=f"{arm} (n={len(seeds)})",
                zorder=3,
            )
    if ax.get_legend_handles_labels()[0]:
        ax.set_xscale("log")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: it hid points
    ax.set_xlabel("training FLOPs of an evaluation episode's host run (host + seeds, forward + backward)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} against training compute, one point per run seed")
    ax.title.set_fontsize(9)
    save_figure(fig, path)


def save_figure(fig: Any, path: Path) -> None:
    """Every report figure: laid out, written at 120 dpi, and closed (pyplot keeps open figures alive)."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def performance_profile(
    scores: np.ndarray, taus: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fraction of runs > tau, 2.5 % band, 97.5 % band) for every tau, bands from resampling the runs."""
    fraction = (scores[:, None] > taus[None, :]).mean(axis=0)
    resampled = rng.choice(scores, size=(PROFILE_RESAMPLES, len(scores)), replace=True)
    boot = (resampled[:, :, None] > taus[None, None, :]).mean(axis=1)
    return fraction, np.percentile(boot, 2.5, axis=0), np.percentile(boot, 97.5, axis=0)


def plot_performance_profile(
    path: Path, values: dict[str, dict[int, float]], metric: str, colors: dict[str, Any]
) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    everything = [v for arm_values in values.values() for v in arm_values.values()]
    if everything:
        low, high = min(everything), max(everything)
        pad = 0.05 * (high - low) or 0.01
        taus = np.linspace(low - pad, high + pad, 200)
        for arm, arm_values in values.items():
            scores = np.asarray([arm_values[s] for s in sorted(arm_values)], dtype=float)
            if len(scores) == 0:
                continue
            fraction, band_low, band_high = performance_profile(scores, taus, np.random.default_rng(0))
            ax.plot(taus, fraction, color=colors[arm], linewidth=2, label=f"{arm} (n={len(scores)})")
            ax.fill_between(taus, band_low, band_high, color=colors[arm], alpha=0.15)
        ax.legend(fontsize=8)
    ax.set_xlabel(f"{metric} threshold tau")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("performance profile with 95 % bootstrap bands")
    ax.title.set_fontsize(9)
    save_figure(fig, path)
