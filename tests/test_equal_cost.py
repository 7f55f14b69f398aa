"""The verdict at equal cost (`host_runs`, experiments/equal_cost.py): every arm spends k host runs per held-out host
and keeps the network its own validation picks; the search's TPE (Tune's OptunaSearch); the report's curve and
tables."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from esper_ray.cli import main
from esper_ray.experiments import search_settings, trainable
from esper_ray.experiments.equal_cost import ks_of, run_record, score_at
from esper_ray.experiments.plan_search import candidate_plans, make_searcher, run_search
from esper_ray.experiments.report import write_report
from esper_ray.experiments.results import COMPUTE_COLUMNS, EVAL_COLUMNS, FINISHED, ExperimentRecord, TrialResult
from esper_ray.experiments.runner import TrialWork
from esper_ray.experiments.search_settings import SearchSettings
from esper_ray.experiments.spec import ExperimentSpec
from esper_ray.experiments.statistics import holm
from esper_ray.experiments.trainable import HostEvaluation, equal_cost_search, held_out_metrics
from esper_ray.train.commands.episodes import EpisodeSummary
from tests.episode_summaries import episode_summary
from tests.held_out_parts import HOSTS

REPO = Path(__file__).resolve().parents[1]
BASE = {
    "name": "t",
    "seeds": [0, 1],
    "rounds": 1,
    "training": {"task": "digits-impaired", "max_epochs": 3},
    "arms": {"none": {"controller": "none"}, "search": {"controller": "search", "search": {"budget": 4}}},
    "held_out": HOSTS,
    "host_runs": 4,
}
HAS_OPTUNA = importlib.util.find_spec("optuna") is not None


def spec_with(**change) -> ExperimentSpec:
    return ExperimentSpec.from_mapping({**BASE, **change})


# ----------------------------------------------------------------------------------------- the selection at k
def test_the_score_at_k_is_the_test_score_of_the_run_best_by_validation_among_the_first_k():
    runs = [
        run_record(10, 0.50, 0.61),
        run_record(11, math.nan, 0.99),  # a diverged run: its validation never wins
        run_record(12, 0.70, 0.55),
        run_record(13, 0.70, 0.80),  # equal to run 2: the first of equals is kept
        run_record(14, 0.90, 0.40),
    ]
    assert [score_at(runs, k) for k in (1, 2, 3, 4, 5)] == [0.61, 0.61, 0.55, 0.55, 0.40]
    assert score_at(runs, 16) == 0.40  # fewer runs than k: all of them
    assert math.isnan(score_at([run_record(1, math.nan, 0.9)], 1))
    with pytest.raises(ValueError, match="k=0"):
        score_at(runs, 0)


def test_the_ks_are_the_powers_of_two_up_to_host_runs_and_host_runs_itself():
    assert ks_of(16) == [1, 2, 4, 8, 16] and ks_of(2) == [1, 2] and ks_of(1) == [1] and ks_of(6) == [1, 2, 4, 6]


# ------------------------------------------------------------------------------------------- the experiment file
@pytest.mark.parametrize(
    "change, match",
    [
        ({"held_out": None}, r"host_runs=4: counts host runs per held-out host; give `held_out` too"),
        ({"host_runs": 0}, r"host_runs=0: must be an integer >= 1"),
        ({"metric": "rollout_accuracy"}, r"host_runs with metric='rollout_accuracy': .*test split"),
        (
            {"arms": {"none": {"controller": "none"}, "s": {"controller": "search", "search": {"budget": 16}}}},
            r"arms.s.search.budget=16: with host_runs=4 a search's candidates are its host runs; give budget 4",
        ),
        ({"eval_episodes": 2}, r"eval_episodes=2 with host_runs=4: every host run is an evaluation episode"),
    ],
)
def test_bad_host_runs_settings_fail_in_one_line_naming_the_field(change, match):
    with pytest.raises(ValueError, match=match) as err:
        spec_with(**change)
    assert "\n" not in str(err.value)


def test_at_equal_cost_every_host_run_is_an_evaluation_episode_and_the_search_spends_no_more():
    spec = spec_with()
    assert spec.eval_episodes == 4 and spec_with(eval_episodes=4).eval_episodes == 4
    trials = {(t.arm, t.seed): t for t in spec.trials()}
    assert all(t.host_runs == 4 for t in trials.values())
    # two hosts x 4 host runs each, for the search as for no growth (before: 4 episodes + a budget of 4 per host)
    assert TrialWork.of(trials[("search", 0)], 4).evaluation == 2 * 4 == TrialWork.of(trials[("none", 0)], 4).evaluation
    without = ExperimentSpec.from_mapping({k: v for k, v in BASE.items() if k != "host_runs"})
    assert without.host_runs is None and without.eval_episodes == 4
    assert TrialWork.of(next(t for t in without.trials() if t.arm == "search"), 4).evaluation == 2 * (4 + 4)
    # a run's record reads back (eval_episodes as used, equal to host_runs)
    assert ExperimentSpec.from_mapping(spec.to_dict()).host_runs == 4


def test_a_tpe_search_without_optuna_is_refused_in_one_line_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        search_settings.importlib.util, "find_spec", lambda name, *a: None if name == "optuna" else real(name, *a)
    )
    arms = {"none": {"controller": "none"}, "s": {"controller": "search", "search": {"budget": 4, "algorithm": "tpe"}}}
    with pytest.raises(
        ValueError, match=r"arms.s.search.algorithm='tpe': needs optuna.*pip install 'esper-ray\[optuna\]'"
    ):
        spec_with(arms=arms)


# ------------------------------------------------------------------------------------------------- the TPE search
@pytest.mark.skipif(not HAS_OPTUNA, reason="optuna (the optional extra esper-ray[optuna]) is not installed")
def test_a_tpe_search_proposes_only_valid_candidates_runs_each_once_and_records_every_run():
    candidates = candidate_plans("cnn", ["r0c0", "r0c1", "r0c2"])
    rng = np.random.default_rng(5)
    scores = {c.label: float(v) for c, v in zip(candidates, rng.permutation(21) / 21)}
    scores[candidates[4].label] = math.nan  # a diverged run: told as a failed trial, never the best
    ran: list[str] = []

    def score(plan):
        ran.append(plan.label)
        return scores[plan.label]

    outcome = run_search(make_searcher(SearchSettings(16, "tpe"), len(candidates), seed=0), candidates, 16, score)
    labels = {c.label for c in candidates}
    assert outcome.runs == 16 == len(ran) and len(set(ran)) == 16 and set(ran) <= labels
    assert [p.label for p, _ in outcome.tried] == ran and [v for _, v in outcome.tried] == [scores[r] for r in ran]
    assert outcome.best.label == max((r for r in ran if math.isfinite(scores[r])), key=scores.get)
    again = run_search(
        make_searcher(SearchSettings(16, "tpe"), len(candidates), seed=0), candidates, 16, scores_of(scores)
    )
    assert [p.label for p, _ in again.tried] == ran  # seeded
    # more budget than candidates: each runs once, the repeats a TPE proposes cost no host run
    everything = run_search(
        make_searcher(SearchSettings(30, "tpe"), len(candidates), 0), candidates, 30, scores_of(scores)
    )
    assert everything.runs == 21 and len({p.label for p, _ in everything.tried}) == 21 and everything.repeats > 0


def scores_of(scores):
    return lambda plan: scores[plan.label]


# ------------------------------------------------------------------------------------------------- the trial
def summary(episode: int, val: float, test: float, reset_seed: int | None = None) -> EpisodeSummary:
    return episode_summary(
        episode=episode,
        final_accuracy=val,
        test_accuracy=test,
        params_added=40,
        germinated=1,
        fossilized=1,
        reset_seed=reset_seed,
    )


def test_at_equal_cost_a_trial_records_each_hosts_runs_and_its_metric_is_the_run_best_by_validation():
    runs = [summary(0, 0.5, 0.6, 100), summary(1, 0.8, 0.3, 101), summary(2, 0.7, 0.9, 102)]
    by_host = {
        "a": HostEvaluation(runs, plans=["x@r0c0", "y@r0c0", "z@r0c1"]),
        "b": HostEvaluation([summary(0, 0.2, 0.4, 100)]),
        "c": HostEvaluation([], not_applicable="no slot r0c1"),
    }
    metrics = held_out_metrics(by_host, "test_accuracy")
    assert json.loads(metrics["eval/runs/a"]) == [
        {"episode_seed": 100, "validation": 0.5, "test": 0.6, "plan": "x@r0c0"},
        {"episode_seed": 101, "validation": 0.8, "test": 0.3, "plan": "y@r0c0"},
        {"episode_seed": 102, "validation": 0.7, "test": 0.9, "plan": "z@r0c1"},
    ]
    assert json.loads(metrics["eval/runs/b"]) == [{"episode_seed": 100, "validation": 0.2, "test": 0.4}]
    assert metrics["eval/test_accuracy/a"] == 0.3 and metrics["eval/test_accuracy/b"] == 0.4  # not the runs' mean
    assert metrics["eval/test_accuracy"] == pytest.approx(0.35) and "eval/runs/c" not in metrics
    assert metrics["eval/host_runs/a"] == 3  # no search runs beside them
    assert "eval/runs/a" not in held_out_metrics(by_host)  # without host_runs: as before
    assert held_out_metrics(by_host)["eval/test_accuracy/a"] == pytest.approx(0.6)


def test_at_equal_cost_the_search_runs_its_ith_candidate_on_evaluation_episode_i(monkeypatch):
    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.train.commands.evaluate import evaluation_episodes

    cfg = TrainConfig(task="digits", slots=("r0c0", "r0c1", "r0c2"), seed=3)
    episodes = evaluation_episodes(cfg, 5)
    seen = []

    def fake_episodes(plan, controller, on_episode_end=None):
        (item,) = plan
        seen.append((item.reset_seed, "+".join(c.seed.label for c in controller.controllers)))
        return [summary(item.index, 0.1 * (item.index + 1), 0.5)]

    monkeypatch.setattr(trainable, "run_evaluation_episodes", fake_episodes)
    outcome, summaries, plans = equal_cost_search(cfg, SearchSettings(5), "test_accuracy", episodes)
    assert [s for s, _ in seen] == [e.reset_seed for e in episodes] and [s.episode for s in summaries] == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert plans == [p for _, p in seen] == [p.label for p, _ in outcome.tried] and len(set(plans)) == 5


# ------------------------------------------------------------------------------------------------- the report
def record_of(spec: ExperimentSpec, runs: dict[str, dict[str, list[list[tuple[float, float]]]]]) -> ExperimentRecord:
    """Finished trials with `runs[arm][host][seed]` = [(validation, test), ...]."""
    trials = []
    for arm, by_host in runs.items():
        for seed in spec.seeds:
            evaluation = {c: 1.0 for c in EVAL_COLUMNS + COMPUTE_COLUMNS}
            records = {
                h: [run_record(1000 + i, v, t) for i, (v, t) in enumerate(by_seed[seed])]
                for h, by_seed in by_host.items()
            }
            for h in by_host:
                evaluation[f"test_accuracy/{h}"] = score_at(records[h], spec.host_runs)
            evaluation["test_accuracy"] = float(np.mean([evaluation[f"test_accuracy/{h}"] for h in by_host]))
            trial = TrialResult(arm, seed, len(trials), spec.controller(arm), FINISHED, evaluation=evaluation)
            trial.runs = records
            trials.append(trial)
    return ExperimentRecord(spec, 1, False, trials, "t.yaml")


def test_the_report_gives_per_host_and_pooled_tables_at_each_k_the_curve_and_per_run_scores(tmp_path):
    seeds = list(range(6))
    arms = {"none": {"controller": "none"}, "heur": {"controller": "heuristic"}, "s": BASE["arms"]["search"]}
    spec = spec_with(seeds=seeds, arms=arms, compare=[["s", "none"], ["s", "heur"]])
    rng = np.random.default_rng(2)
    runs = {
        arm: {h: [[tuple(rng.uniform(0.2, 0.9, 2)) for _ in range(4)] for _ in seeds] for h in ("digits", "wide")}
        for arm in arms
    }
    results = write_report(tmp_path, record_of(spec, runs))
    report = (tmp_path / "report.md").read_text()
    assert "## At equal cost" in report and "### Pooled over the held-out hosts" in report
    assert (tmp_path / "equal_cost.png").is_file() and "`equal_cost.png`" in report
    assert "**not** corrected" in report
    # 6 run seeds: 2 / 2^6 = 0.03125 at best, times 6 tests > 0.05, which the report says
    assert "smallest exact paired p is 0.0312, so Holm over these 6 tests can reach at best 0.188: no" in report
    on_disk = json.loads((tmp_path / "results.json").read_text())
    ec = on_disk["statistics"]["equal_cost"]
    assert ec["ks"] == [1, 2, 4] and set(ec["panels"]) == {"digits", "wide", "pooled"}
    for k in (1, 2, 4):
        assert f"| {k} | s | none |" in report and f"| {k} | s | heur |" in report
    # every k recomputed from the runs results.json keeps: the tables' means
    for k in (1, 2, 4):
        for host in ("digits", "wide"):
            for row in ec["panels"][host][str(k)]["arms"]:
                kept = [score_at(t["runs"][host], k) for t in on_disk["trials"] if t["arm"] == row["arm"]]
                assert row["mean"] == pytest.approx(np.mean(kept))
        pooled = {r["arm"]: r for r in ec["panels"]["pooled"][str(k)]["arms"]}
        for arm in arms:
            per_seed = [
                np.mean([score_at(t["runs"][h], k) for h in ("digits", "wide")])
                for t in sorted(on_disk["trials"], key=lambda t: t["seed"])
                if t["arm"] == arm
            ]
            assert pooled[arm]["mean"] == pytest.approx(np.mean(per_seed))
            ci = stats.t.interval(0.95, len(seeds) - 1, loc=np.mean(per_seed), scale=stats.sem(per_seed))
            assert [pooled[arm]["mean_ci"]["low"], pooled[arm]["mean_ci"]["high"]] == pytest.approx(list(ci))
    # the pooled p-values: exact signed-rank, Holm over both pairs at all three k's (one family of 6)
    raw, reported = [], []
    for k in (1, 2, 4):
        by_seed = {
            arm: [
                np.mean([score_at(t["runs"][h], k) for h in ("digits", "wide")])
                for t in sorted(on_disk["trials"], key=lambda t: t["seed"])
                if t["arm"] == arm
            ]
            for arm in arms
        }
        for b in ("none", "heur"):
            raw.append(stats.wilcoxon(np.subtract(by_seed["s"], by_seed[b]), method="exact").pvalue)
        reported += ec["panels"]["pooled"][str(k)]["pairs"]
    assert [p["wilcoxon_p"] for p in reported] == pytest.approx(raw)
    assert [p["wilcoxon_p_holm"] for p in reported] == pytest.approx(holm(raw))
    # per host: uncorrected
    assert all(p["wilcoxon_p_holm"] == p["wilcoxon_p"] for p in ec["panels"]["digits"]["1"]["pairs"])
    assert results["statistics"]["equal_cost"]["host_runs"] == 4


def test_a_report_without_host_runs_has_no_equal_cost_section(tmp_path):
    spec = ExperimentSpec.from_mapping({k: v for k, v in BASE.items() if k != "host_runs"})
    trials = [
        TrialResult(
            arm,
            seed,
            0,
            spec.controller(arm),
            FINISHED,
            evaluation={
                **{c: 0.5 for c in EVAL_COLUMNS + COMPUTE_COLUMNS},
                "test_accuracy/digits": 0.5,
                "test_accuracy/wide": 0.5,
            },
        )
        for arm in spec.arms
        for seed in spec.seeds
    ]
    results = write_report(tmp_path, ExperimentRecord(spec, 1, False, trials, "t.yaml"))
    assert "equal_cost" not in results["statistics"] and not (tmp_path / "equal_cost.png").exists()
    assert "## At equal cost" not in (tmp_path / "report.md").read_text()


# ------------------------------------------------------------------------------------------- a smoke experiment
@pytest.mark.expensive
def test_a_smoke_experiment_at_equal_cost_gives_the_curve_the_tables_at_k_1_and_2_and_per_run_scores(
    ray_local, tmp_path
):
    experiment = {
        "name": "equal_cost_smoke",
        "arms": {
            "none": {"controller": "none"},
            "fixed": {"controller": "fixed", "fixed": {"blueprint": "norm", "slot": "r0c1"}},
            "search": {"controller": "search", "search": {"budget": 2, "algorithm": "random"}},
        },
        "compare": [["search", "none"], ["search", "fixed"]],
        "held_out": [{"name": "digits", "env": {"task": "digits", "max_epochs": 2}}],
        "host_runs": 2,
        "seeds": [0, 1],
        "rounds": 1,
        "order_seed": 3,
        "training": {
            "task": "digits-impaired",
            "max_epochs": 2,
            "envs": 1,
            "cpus_per_env": 0.5,
            "env": {"batch_size": 1024},
        },
    }
    path = tmp_path / "equal_cost.yaml"
    path.write_text(yaml.safe_dump(experiment))
    out = tmp_path / "run"
    assert main(["ab", str(path), "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert all(t["status"] == "finished" for t in results["trials"]), [
        (t["arm"], t["error"]) for t in results["trials"]
    ]
    for t in results["trials"]:
        runs = t["runs"]["digits"]
        assert len(runs) == 2 and all(0 <= r["validation"] <= 1 and 0 <= r["test"] <= 1 for r in runs)
        assert [r["episode_seed"] for r in runs] == [1_000_000 * (t["seed"] + 1) + i for i in (0, 1)]  # paired
        assert ("plan" in runs[0]) == (t["arm"] == "search")
        assert t["evaluation"]["host_runs/digits"] == 2  # the search spent no more than the others
    report = (out / "report.md").read_text()
    assert "## At equal cost" in report and (out / "equal_cost.png").is_file()
    ec = results["statistics"]["equal_cost"]
    assert ec["ks"] == [1, 2]
    for k in (1, 2):
        assert f"| {k} | search | none |" in report and f"| {k} | search | fixed |" in report
        for row in ec["panels"]["pooled"][str(k)]["arms"]:
            kept = [score_at(t["runs"]["digits"], k) for t in results["trials"] if t["arm"] == row["arm"]]
            assert row["mean"] == pytest.approx(np.mean(kept))


def test_at_equal_cost_the_cost_table_counts_every_arms_network_at_its_host_runs(tmp_path):
    spec = spec_with(seeds=[0, 1, 2])
    runs = {arm: {h: [[(0.5, 0.5 + 0.01 * s)] * 4 for s in range(3)] for h in ("digits", "wide")} for arm in spec.arms}
    results = write_report(tmp_path, record_of(spec, runs))
    cost = {row["arm"]: row["host_runs_per_network"] for row in results["statistics"]["held_out"]["cost"]}
    assert cost == {"none": 4, "search": 4}  # not 1 against the search's 4: each keeps the best of its 4 runs
    report = (tmp_path / "report.md").read_text()
    assert "at 100 % of its host runs per grown network" in report
    assert "At equal cost every arm's network is the best by validation of its 4 host runs." in report
