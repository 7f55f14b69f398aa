"""The report's part for an experiment at equal cost (`host_runs: K`, equal_cost.py): every arm's test score against
the host runs k it spends per new host, k = 1, 2, 4, ..., K, each k recomputed from the runs results.json keeps.

Per host and pooled (per run seed, the mean over the held-out hosts the arm ran on), for each k: each arm's mean with
its 95 % t interval, and each compared pair's Hodges-Lehmann estimate with the exact paired signed-rank p. The pooled
pairs are Holm-corrected over every pair and every k (one family); the per-host p-values are not corrected. The figure
`equal_cost.png`: the mean test score against k (log2 axis), a line per arm, a panel per host and one pooled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from esper_ray.experiments.equal_cost import ks_of, score_at  # noqa: E402
from esper_ray.experiments.held_out_report import pooled_pair  # noqa: E402
from esper_ray.experiments.results import FINISHED, ExperimentRecord  # noqa: E402
from esper_ray.experiments.statistics import (  # noqa: E402
    Interval,
    PairComparison,
    compare_pair,
    holm_over,
    in_seed_order,
    t_interval,
    wilcoxon_min_p,
)

FIGURE = "equal_cost.png"
POOLED = "pooled"
ByArm = dict[str, dict[int, float]]


def scores_at(record: ExperimentRecord, host: str, k: int) -> ByArm:
    """{arm: {seed: score at k host runs on `host`}} over the finished trials that ran there."""
    out: ByArm = {arm: {} for arm in record.spec.arms}
    for t in record.trials:
        runs = t.runs.get(host)
        if t.status == FINISHED and runs:
            value = score_at(runs, k)
            if math.isfinite(value):
                out[t.arm][t.seed] = value
    return out


def pooled_arm(per_host: Mapping[str, ByArm], arm: str) -> dict[int, float]:
    """Per seed, the arm's mean over the hosts it ran on (every seed it has on all of them)."""
    hosts = [h for h, values in per_host.items() if values[arm]]
    seeds = set.intersection(*[set(per_host[h][arm]) for h in hosts]) if hosts else set()
    return {s: float(np.mean([per_host[h][arm][s] for h in hosts])) for s in sorted(seeds)}


def _arm_row(arm: str, by_seed: Mapping[int, float]) -> dict[str, Any]:
    x = in_seed_order(by_seed)
    return {
        "arm": arm,
        "n": len(x),
        "mean": float(x.mean()) if len(x) else math.nan,
        "mean_ci": asdict(t_interval(x)),
        "by_seed": {str(s): v for s, v in sorted(by_seed.items())},
    }


def equal_cost_statistics(record: ExperimentRecord) -> dict[str, Any]:
    """Everything the section shows, as results.json keeps it: per panel (each host, then `pooled`) and per k, the
    arms' means and the pairs."""
    spec = record.spec
    hosts = [h.name for h in spec.held_out_hosts]
    ks = ks_of(spec.host_runs)
    family = spec.compared_pairs
    panels: dict[str, dict[str, Any]] = {h: {} for h in [*hosts, POOLED]}
    pooled_pairs: list[PairComparison] = []
    for k in ks:
        per_host = {h: scores_at(record, h, k) for h in hosts}
        for h, values in per_host.items():
            panels[h][k] = {
                "arms": [_arm_row(a, v) for a, v in values.items()],
                "pairs": [compare_pair(a, values[a], b, values[b]) for a, b in family],  # uncorrected
            }
        for a, b in family:
            a_values, b_values, _ = pooled_pair(per_host, a, b)  # over the hosts both ran on
            pooled_pairs.append(compare_pair(a, a_values, b, b_values))
        panels[POOLED][k] = {"arms": [_arm_row(a, pooled_arm(per_host, a)) for a in spec.arms], "pairs": []}
    corrected = holm_over(pooled_pairs)  # one family: every pair at every k
    for i, k in enumerate(ks):
        panels[POOLED][k]["pairs"] = corrected[i * len(family) : (i + 1) * len(family)]
    return {"host_runs": spec.host_runs, "ks": ks, "hosts": hosts, "panels": panels}


def as_json(stats: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "host_runs": stats["host_runs"],
        "ks": stats["ks"],
        "hosts": stats["hosts"],
        "selection": "per trial and host, the test score of the run with the best validation among its first k",
        "pooled_holm": "over every compared pair at every k",
        "per_host_p": "uncorrected",
        "panels": {
            panel: {
                str(k): {"arms": part["arms"], "pairs": [asdict(p) for p in part["pairs"]]} for k, part in by_k.items()
            }
            for panel, by_k in stats["panels"].items()
        },
    }


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def _mean_cell(row: Mapping[str, Any]) -> str:
    ci = row["mean_ci"]
    interval = f" [{_fmt(ci['low'])}, {_fmt(ci['high'])}]" if math.isfinite(ci["low"]) else ""
    return f"{_fmt(row['mean'])}{interval} (n={row['n']})"


def _tables(by_k: Mapping[int, Mapping[str, Any]], arms: list[str], p_label: str) -> list[str]:
    lines = [
        "| k | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
        *[f"| {k} | " + " | ".join(_mean_cell(r) for r in part["arms"]) + " |" for k, part in by_k.items()],
        "",
        f"| k | A | B | run-seed pairs (non-zero) | Hodges-Lehmann A - B [interval] | {p_label} | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, part in by_k.items():
        for p in part["pairs"]:
            lines.append(
                f"| {k} | {p.arm_a} | {p.arm_b} | {p.n_pairs} ({p.wilcoxon_n}) | {_fmt(p.hodges_lehmann)} "
                f"{_interval(p.hodges_lehmann_ci)} | {_p_cell(p, p_label)} | {'; '.join(p.notes)} |"
            )
    return lines


def _interval(ci: Interval) -> str:
    return f"[{_fmt(ci.low)}, {_fmt(ci.high)}]" if math.isfinite(ci.low) else ""


def _p_cell(p: PairComparison, label: str) -> str:
    return f"{_fmt(p.wilcoxon_p)} ({_fmt(p.wilcoxon_p_holm)})" if "Holm" in label else _fmt(p.wilcoxon_p)


def equal_cost_lines(stats: Mapping[str, Any], metric: str, arms: list[str]) -> list[str]:
    ks, hosts = stats["ks"], stats["hosts"]
    tests = sum(len(part["pairs"]) for part in stats["panels"][POOLED].values())
    seeds = max((r["n"] for part in stats["panels"][POOLED].values() for r in part["arms"]), default=0)
    reach = (
        f"With {seeds} run seeds the smallest exact paired p is {wilcoxon_min_p(seeds):.3g}, so Holm over these "
        f"{tests} tests can reach at best {min(1.0, tests * wilcoxon_min_p(seeds)):.3g}"
        f"{'' if tests * wilcoxon_min_p(seeds) <= 0.05 else ': no difference can be detected at 0.05 here'}."
        if seeds and tests
        else ""
    )
    lines = [
        "",
        "## At equal cost",
        "",
        f"Every arm spent {stats['host_runs']} host runs on each held-out host, run i on the same episode (host "
        "initialisation and data order) in every arm: a controller grew a network on each, a search ran its i-th "
        "candidate. At k host runs an arm keeps the network its own validation score picks: the score at k is the "
        f"{metric} on the test split of the run with the best validation among its first k. Every k is recomputed "
        f"from the per-run scores in results.json (`trials[].runs.<host>`: episode seed, validation, test, a "
        "search's plan). The verdict above is k = "
        f"{stats['host_runs']} alone (Holm over the pairs); figure `{FIGURE}` plots the tables below.",
        "",
        "### Pooled over the held-out hosts",
        "",
        "Per run seed the mean over the hosts; mean [95 % t interval] (n run seeds); exact paired signed-rank test, "
        f"Holm over every pair and every k ({len(ks)} k's x the compared pairs). {reach}",
        "",
        *_tables(stats["panels"][POOLED], arms, "paired p (Holm)"),
    ]
    for host in hosts:
        lines += [
            "",
            f"### Host `{host}`",
            "",
            "Paired p-values here are **not** corrected for multiple comparisons (the pooled table is the verdict).",
            "",
            *_tables(stats["panels"][host], arms, "paired p (uncorrected)"),
        ]
    return lines


def figure(stats: Mapping[str, Any], metric: str, colors: Mapping[str, Any]) -> Any:
    """Mean score against k (log2 axis) with its 95 % t interval, a line per arm; a panel per host, then pooled."""
    panels = [*stats["hosts"], POOLED]
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    ks = stats["ks"]
    for ax, panel in zip(axes.flat, panels):
        by_k = stats["panels"][panel]
        for arm in colors:
            rows_k = [next(r for r in by_k[k]["arms"] if r["arm"] == arm) for k in ks]
            mean = np.asarray([r["mean"] for r in rows_k], dtype=float)
            if not np.isfinite(mean).any():
                continue
            low = np.asarray([r["mean_ci"]["low"] for r in rows_k], dtype=float)
            high = np.asarray([r["mean_ci"]["high"] for r in rows_k], dtype=float)
            ax.plot(ks, mean, marker="o", color=colors[arm], label=arm)
            ax.fill_between(ks, low, high, color=colors[arm], alpha=0.12)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_title(f"host {panel}" if panel != POOLED else "pooled (mean over hosts)", fontsize=9)
        ax.set_xlabel("host runs per new host (k)")
        ax.set_ylabel(metric)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    pooled = axes.flat[len(panels) - 1]
    if pooled.get_legend_handles_labels()[0]:
        pooled.legend(fontsize=7)
    fig.suptitle("test score of the run best by validation of the first k, mean and 95 % t band", fontsize=10)
    return fig
