"""The A/B report: results.json, report.md, metric_by_arm.png and learning_curves.png."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from esper_ray.experiments.results import ExperimentRecord, as_json, metric_by_arm  # noqa: E402
from esper_ray.experiments.statistics import compare_arms, summarize_arm, verdict  # noqa: E402


def _fmt(x: float, digits: int = 4) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}g}"


def write_report(output: Path, record: ExperimentRecord) -> dict[str, object]:
    spec = record.spec
    values = metric_by_arm(record)
    arms = [summarize_arm(arm, list(by_seed.values())) for arm, by_seed in values.items()]
    pairs = compare_arms(values)
    corrected = len(values) > 2
    verdicts = [verdict(p, spec.metric, spec.alpha, corrected) for p in pairs]
    results = as_json(record)
    results["statistics"] = {
        "metric": spec.metric, "alpha": spec.alpha, "holm_corrected": corrected,
        "arms": [asdict(a) for a in arms], "pairs": [asdict(p) for p in pairs], "verdicts": verdicts,
    }
    (output / "results.json").write_text(json.dumps(results, indent=2, allow_nan=True))
    (output / "report.md").write_text(_markdown(record, arms, pairs, verdicts, corrected))
    _plot_metric_by_arm(output / "metric_by_arm.png", values, spec.metric)
    _plot_learning_curves(output / "learning_curves.png", record)
    return results


def _markdown(record: ExperimentRecord, arms: list, pairs: list, verdicts: list[str], corrected: bool) -> str:
    spec = record.spec
    failed = [t for t in record.trials if t.status != "finished"]
    lines = [
        f"# A/B experiment `{spec.name}`",
        "",
        f"Metric: **{spec.metric}**, mean over the last {spec.last_rounds} rounds' final episodes of each trial "
        f"(a figure common to every arm, never an arm's own reward). Alpha {spec.alpha}. {len(spec.seeds)} seeds "
        f"shared by all arms, {spec.rounds} rounds per trial.",
        f"Start order: a random permutation with order seed {record.order_seed}"
        f"{' (drawn for this run)' if record.order_seed_drawn else ''}: "
        + ", ".join(f"{t.arm}/{t.seed}" for t in sorted(record.trials, key=lambda t: t.position)) + ".",
        "",
        "## Verdict",
        "",
        *[f"- {v}" for v in verdicts],
        "",
        "## Arms",
        "",
        "| arm | n | mean | median | IQM | 95 % CI of mean |",
        "|---|---|---|---|---|---|",
        *[f"| {a.arm} | {a.n} | {_fmt(a.mean)} | {_fmt(a.median)} | {_fmt(a.iqm)} | [{_fmt(a.ci_low)}, {_fmt(a.ci_high)}] |" for a in arms],
        "",
        "## Pairs",
        "",
        f"| A | B | U | p{' (Holm)' if corrected else ''} | rank-biserial | P(A > B) [95 % CI] | Wilcoxon (paired n, p) | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in pairs:
        p_shown = p.p_holm if corrected else p.p_value
        lines.append(
            f"| {p.arm_a} | {p.arm_b} | {_fmt(p.u)} | {_fmt(p_shown)} | {_fmt(p.rank_biserial)} | "
            f"{_fmt(p.prob_a_beats_b)} [{_fmt(p.prob_ci_low)}, {_fmt(p.prob_ci_high)}] | "
            f"n={p.wilcoxon_n}, p={_fmt(p.wilcoxon_p)} | {'; '.join(p.notes)} |"
        )
    lines += ["", "## Trials", "", "| position | arm | seed | status | metric | rounds |", "|---|---|---|---|---|---|"]
    for t in sorted(record.trials, key=lambda t: t.position):
        lines.append(f"| {t.position} | {t.arm} | {t.seed} | {t.status} | {_fmt(t.metric(spec.metric, spec.last_rounds))} | {len(t.history)} |")
    if failed:
        lines += ["", f"{len(failed)} trial(s) did not finish and are excluded where they have no metric: "
                  + ", ".join(f"{t.arm}/{t.seed} ({t.status}{': ' + t.error if t.error else ''})" for t in failed)]
    return "\n".join(lines) + "\n"


def _colors(arms: list[str]) -> dict[str, str]:
    palette = plt.get_cmap("tab10")
    return {arm: palette(i % 10) for i, arm in enumerate(arms)}


def _plot_metric_by_arm(path: Path, values: dict[str, dict[int, float]], metric: str) -> None:
    arms = list(values)
    colors = _colors(arms)
    fig, ax = plt.subplots(figsize=(1.8 + 1.4 * len(arms), 4))
    data = [list(values[a].values()) for a in arms]
    ax.boxplot([d if d else [math.nan] for d in data], tick_labels=arms, showfliers=False)
    for i, (arm, d) in enumerate(zip(arms, data), start=1):
        ax.scatter([i] * len(d), d, color=colors[arm], zorder=3)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} per trial, by arm")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_learning_curves(path: Path, record: ExperimentRecord) -> None:
    colors = _colors(list(record.spec.arms))
    fig, ax = plt.subplots(figsize=(7, 4))
    labelled: set[str] = set()
    for t in record.trials:
        if not t.history:
            continue
        rounds = [r["round"] for r in t.history]
        accuracy = [r["final_accuracy"] for r in t.history]
        ax.plot(rounds, accuracy, marker="o", markersize=3, color=colors[t.arm], alpha=0.8,
                label=None if t.arm in labelled else t.arm)
        labelled.add(t.arm)
    ax.set_xlabel("round")
    ax.set_ylabel("final host validation accuracy")
    ax.set_title("learning curves (one line per trial)")
    if labelled:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
