"""The transfer verdict (tune_configs/transfer.yaml): held-out hosts, the `checkpoint` and `search` arm kinds, the
per-host and pooled statistics, each arm's cost per new host, and transfer.yaml itself at smoke size."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from esper_ray.cli import main
from esper_ray.contracts.controllers import ControllerKind, FixedPlan
from esper_ray.contracts.families import family
from esper_ray.contracts.registry import BLUEPRINT_NAMES
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.experiments.held_out import HeldOutHost, host_settings, parse_held_out
from esper_ray.experiments.held_out_report import held_out_statistics, pooled_pair
from esper_ray.experiments.plan_search import RandomPlanSearch, candidate_plans, run_search
from esper_ray.experiments.report import write_report
from esper_ray.experiments.results import COMPUTE_COLUMNS, EVAL_COLUMNS, FINISHED, ExperimentRecord, TrialResult
from esper_ray.experiments.runner import TrialWork, check_checkpoint
from esper_ray.experiments.search_settings import SearchSettings
from esper_ray.experiments.spec import ExperimentSpec
from esper_ray.experiments.statistics import holm
from esper_ray.experiments.trainable import HostEvaluation, held_out_metrics, plan_on_host, validation_score
from esper_ray.policy.layout import check_layout, saved_layout
from esper_ray.train.commands.episodes import EpisodeSummary
from esper_ray.train.folders.checkpoints import load_checkpoint_config, resolve_checkpoint, round_of
from esper_ray.train.rllib.rounds import MODULE_PATH
from tests.episode_summaries import episode_summary
from tests.held_out_parts import HOSTS

REPO = Path(__file__).resolve().parents[1]
BASE = {
    "name": "t",
    "seeds": [0, 1],
    "rounds": 1,
    "training": {"task": "digits-impaired", "max_epochs": 3},
    "arms": {"ppo": {}, "none": {"controller": "none"}},
    "held_out": HOSTS,
}


def spec_with(**change) -> ExperimentSpec:
    return ExperimentSpec.from_mapping({**BASE, **change})


# ------------------------------------------------------------------------------------------ the experiment file
@pytest.mark.parametrize(
    "change, match",
    [
        ({"held_out": []}, r"held_out=\[\]: must be a non-empty list of hosts"),
        ({"held_out": [{"name": "digits"}]}, r"held_out\[0\]=.*exactly `name` and `env`"),
        (
            {"held_out": [{"name": "a/b", "env": {}}]},
            r"held_out\[0\].name='a/b': the host name must be a plain folder name",
        ),
        ({"held_out": [{"name": "d", "env": 3}]}, r"held_out\[0\].env=3: must be a mapping"),
        ({"held_out": [{"name": "d", "env": {"seed": 4}}]}, r"held_out\[0\].env: \['seed'\] are the run's"),
        ({"held_out": HOSTS + [HOSTS[0]]}, r"held_out: host name\(s\) \['digits'\] given more than once"),
        ({"held_out": [{"name": "d", "env": {"task": "tetris"}}]}, r"held_out host 'd' \(arm ppo\):.*tetris"),
        ({"held_out": [{"name": "d", "env": {"colour": 1}}]}, r"held_out host 'd' \(arm ppo\):.*colour"),
        ({"arms": {"a": {}, "s": {"controller": "search"}}}, r"arms.s: a `controller: search` arm needs `search`"),
        (
            {"arms": {"a": {}, "s": {"controller": "search", "search": {"budget": 0}}}},
            r"arms.s.search.budget=0: must be an integer in \[1",
        ),
        (
            {"arms": {"a": {}, "s": {"controller": "search", "search": {"budget": 4, "algorithm": "bayes"}}}},
            r"arms.s.search.algorithm='bayes': choose one of \['random', 'tpe'\]",
        ),
        (
            {"arms": {"a": {}, "s": {"controller": "search", "search": {"budget": 4, "beam": 2}}}},
            r"arms.s.search: unknown key\(s\) \['beam'\]",
        ),
        (
            {"arms": {"a": {}, "s": {"controller": "none", "search": {"budget": 4}}}},
            r"arms.s: `search` belongs to a `controller: search` arm",
        ),
        (
            {"arms": {"a": {}, "c": {"controller": "checkpoint"}}},
            r"arms.c: a `controller: checkpoint` arm needs `checkpoint`",
        ),
        (
            {"arms": {"a": {}, "c": {"controller": "checkpoint", "checkpoint": 5}}},
            r"arms.c.checkpoint=5: must be the path",
        ),
        (
            {"arms": {"a": {}, "c": {"controller": "ppo", "checkpoint": "x"}}},
            r"arms.c: `checkpoint` belongs to a `controller: checkpoint`",
        ),
        (
            {"arms": {"a": {}, "c": {"controller": "checkpoint", "checkpoint": "runs/{arm}/ck"}}},
            r"arms.c.checkpoint='runs/\{arm\}/ck': the only field a checkpoint path may hold is \{seed\}",
        ),
    ],
)
def test_bad_held_out_hosts_and_arms_fail_naming_the_field_and_value(change, match):
    with pytest.raises(ValueError, match=match):
        spec_with(**change)


def test_every_trial_evaluates_on_each_held_out_host_with_the_arms_settings_and_the_hosts_on_top():
    spec = spec_with(
        arms={
            "ppo": {"lr": 3e-4, "env": {"host_preset": "digits-impaired", "batch_size": 256}},
            "s": {"controller": "search", "search": {"budget": 5}},
            "c": {"controller": "checkpoint", "checkpoint": "runs/ck"},
        }
    )
    trials = {(t.arm, t.seed): t for t in spec.trials()}
    ppo = trials[("ppo", 1)]
    assert [name for name, _ in ppo.held_out] == ["digits", "wide"]
    digits, wide = (settings for _, settings in ppo.held_out)
    assert digits["task"] == "digits" and digits["lr"] == 3e-4 and digits["seed"] == 1
    assert "host_preset" not in digits["env"] and digits["env"]["batch_size"] == 256  # the arm's host is not the task's
    assert wide["max_epochs"] == 4 and "max_epochs" not in wide["env"]
    assert trials[("s", 0)].search == SearchSettings(5, "random")
    # the time left counts every host's evaluation episodes, and a search's candidates there
    assert TrialWork.of(trials[("s", 0)], 4).evaluation == 2 * (5 + 4) and TrialWork.of(ppo, 4).evaluation == 2 * 4
    assert trials[("c", 0)].checkpoint == str(Path("runs/ck").resolve())
    assert ExperimentSpec.from_mapping(spec.to_dict()).to_dict() == spec.to_dict()  # results read it back the same


def test_a_checkpoint_arm_with_seed_in_its_path_evaluates_each_seeds_own_controller():
    spec = spec_with(arms={"a": {}, "c": {"controller": "checkpoint", "checkpoint": "runs/seed{seed}/ck"}})
    paths = {t.seed: t.checkpoint for t in spec.trials() if t.arm == "c"}
    assert paths == {s: str(Path(f"runs/seed{s}/ck").resolve()) for s in spec.seeds} and len(
        set(paths.values())
    ) == len(spec.seeds)
    assert ExperimentSpec.from_mapping(spec.to_dict()).to_dict() == spec.to_dict()  # results read it back the same


def test_a_plugins_family_can_be_the_held_out_one(tmp_path, monkeypatch):
    """The family is looked up after the run's plug-ins are imported (a module no other test imports)."""
    (tmp_path / "held_out_family_plugin.py").write_text(
        "from esper_ray.contracts.families import Member, register_family\n"
        "register_family('plugin-held-out', [Member('short', {'max_epochs': 4})])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "held_out_family_plugin" not in sys.modules
    spec = spec_with(training={**BASE["training"], "plugins": ["held_out_family_plugin"]}, held_out="plugin-held-out")
    assert [h.name for h in spec.held_out_hosts] == ["short"]
    monkeypatch.delitem(sys.modules, "held_out_family_plugin")


def test_a_held_out_host_drops_the_family_the_arm_trains_on():
    settings = host_settings(
        {"task": "digits-impaired", "family": "digits-family", "env": {"family": "x", "amp": "off"}},
        HeldOutHost("d", {"task": "digits", "batch_size": 64}),
    )
    assert settings == {"task": "digits", "env": {"amp": "off", "batch_size": 64}}


def test_a_family_name_gives_its_members_as_hosts_and_an_unknown_one_is_refused_in_one_line():
    hosts = parse_held_out("digits-held-out")
    assert [(h.name, dict(h.env)) for h in hosts] == [(m.name, dict(m.env)) for m in family("digits-held-out")]
    assert len(hosts) > 1
    with pytest.raises(ValueError, match=r"^held_out='other': family='other': unknown; choose one of \[.*'digits-held"):
        parse_held_out("other")


def test_several_families_and_hosts_in_one_list_give_every_member_and_host_and_a_name_twice_is_refused():
    hosts = parse_held_out(["digits-held-out-starved", "grow-held-out", {"name": "d", "env": {"task": "digits"}}])
    expected = [m.name for m in family("digits-held-out-starved")] + [m.name for m in family("grow-held-out")] + ["d"]
    assert [h.name for h in hosts] == expected
    with pytest.raises(ValueError, match=r"host name\(s\) \['gray-starved', 'impaired-5b'"):
        parse_held_out(["digits-held-out-starved", "digits-held-out-starved"])


def test_transfer_yaml_compares_ppo_with_every_baseline_on_held_out_hosts_at_a_stated_budget():
    spec = ExperimentSpec.from_yaml(REPO / "tune_configs" / "transfer.yaml")
    kinds = {spec.controller(a) for a in spec.arms}
    assert kinds == {
        ControllerKind.PPO,
        ControllerKind.HEURISTIC,
        ControllerKind.NONE,
        ControllerKind.FIXED,
        ControllerKind.SEARCH,
    }
    assert sorted(spec.compared_pairs) == sorted(("ppo", a) for a in spec.arms if a != "ppo")
    assert spec.fixed_plan("fixed").label == "conv_heavy@r0c1" and spec.search_settings("search").budget == 16
    assert spec.held_out_hosts and len(spec.compared_pairs) * 2 / 2 ** len(spec.seeds) < spec.alpha


# ------------------------------------------------------------------------------------------------ the search
def test_the_search_proposes_each_plan_once_and_picks_the_best_by_validation():
    candidates = candidate_plans("cnn", ["r0c0", "r0c1", "r0c2"])
    assert len(candidates) == 21 and len({c.label for c in candidates}) == 21
    rng = np.random.default_rng(5)
    scores = {c.label: float(v) for c, v in zip(candidates, rng.permutation(21) / 21)}
    scores[candidates[3].label] = math.nan  # a diverged run never wins
    outcome = run_search(RandomPlanSearch(len(candidates), seed=0), candidates, 8, lambda plan: scores[plan.label])
    tried = [p.label for p, _ in outcome.tried]
    assert outcome.runs == 8 and len(set(tried)) == 8
    assert outcome.best.label == max((t for t in tried if math.isfinite(scores[t])), key=scores.get)
    assert outcome.best_score == scores[outcome.best.label]
    again = run_search(RandomPlanSearch(len(candidates), seed=0), candidates, 8, lambda plan: scores[plan.label])
    assert [p.label for p, _ in again.tried] == tried  # seeded
    other = run_search(RandomPlanSearch(len(candidates), seed=1), candidates, 8, lambda plan: scores[plan.label])
    assert [p.label for p, _ in other.tried] != tried
    everything = run_search(RandomPlanSearch(len(candidates), seed=0), candidates, 100, lambda plan: scores[plan.label])
    assert everything.runs == 21 and everything.best.label == max(
        (k for k in scores if math.isfinite(scores[k])), key=scores.get
    )


def summary(val: float, test: float, params: int = 200) -> EpisodeSummary:
    return episode_summary(final_accuracy=val, test_accuracy=test, params_added=params - 160)


def test_a_search_ranks_by_validation_never_by_test():
    assert validation_score(summary(0.7, 0.1), "test_accuracy") == 0.7
    assert validation_score(summary(0.7, 0.1, params=500), "test_accuracy_per_param") == pytest.approx(0.7 / 0.5)


def test_a_trial_reports_each_host_its_cost_there_and_the_mean_over_hosts():
    plan = FixedPlan.from_mapping({"blueprint": "norm", "slot": "r0c1"}, "x", topology="cnn", slots=["r0c1"])
    from esper_ray.experiments.plan_search import SearchOutcome

    metrics = held_out_metrics(
        {
            "a": HostEvaluation(
                [summary(0.5, 0.6), summary(0.5, 0.8)], search_runs=3, search=SearchOutcome(plan, 0.5, [])
            ),
            "b": HostEvaluation([summary(0.5, 0.2), summary(0.5, 0.4)]),
            "c": HostEvaluation([], not_applicable="no slot r0c1"),
        }
    )
    assert metrics["eval/test_accuracy/a"] == pytest.approx(0.7) and metrics["eval/test_accuracy/b"] == pytest.approx(
        0.3
    )
    assert metrics["eval/test_accuracy"] == pytest.approx(0.5)  # the mean over the hosts it ran on
    assert metrics["eval/host_runs/a"] == 5 and metrics["eval/host_runs/b"] == 2 and metrics["eval/host_runs"] == 3.5
    assert metrics["eval/not_applicable/c"] == 1.0 and "eval/test_accuracy/c" not in metrics
    assert metrics["eval/search_plan/a"] == "norm@r0c1"
    # seeds planted and kept per host: whether the plan was planted there at all (results.TrialResult.plan_note)
    assert "eval/germinated/a" in metrics and "eval/fossilized/b" in metrics and "eval/germinated/c" not in metrics


def test_a_fixed_plan_a_held_out_host_cannot_take_is_not_applicable_there_in_one_line():
    plan = FixedPlan.from_mapping(
        {"blueprint": "conv_heavy", "slot": "r0c1"}, "x", topology="cnn", slots=["r0c0", "r0c1"]
    )
    assert plan_on_host(plan, TrainConfig(task="digits")) == plan
    missing_slot = plan_on_host(plan, TrainConfig(task="digits", slots=("r0c0", "r0c2")))
    assert (
        isinstance(missing_slot, str)
        and "slot='r0c1': not an enabled slot" in missing_slot
        and "\n" not in missing_slot
    )
    missing_blueprint = plan_on_host(plan, TrainConfig(task="text", slots=("r0c1",)))
    assert isinstance(missing_blueprint, str) and "conv_heavy" in missing_blueprint


# -------------------------------------------------------------------------------------------- the statistics
def record_of(
    values: dict[str, dict[str, list[float]]], spec: ExperimentSpec, runs: dict[str, float]
) -> ExperimentRecord:
    """Finished trials whose evaluation holds `values[arm][host][seed]` (NaN: not applicable there)."""
    trials = []
    for arm, by_host in values.items():
        for seed in spec.seeds:
            evaluation = {c: 0.0 for c in EVAL_COLUMNS + COMPUTE_COLUMNS}
            evaluation["episodes"] = 1.0
            ran = [h for h in by_host if math.isfinite(by_host[h][seed])]
            for host in by_host:
                if host in ran:
                    evaluation[f"test_accuracy/{host}"] = by_host[host][seed]
                    evaluation[f"host_runs/{host}"] = runs[arm]
                    evaluation[f"search_runs/{host}"] = runs[arm] - 1
                else:
                    evaluation[f"not_applicable/{host}"] = 1.0
            evaluation["test_accuracy"] = float(np.mean([by_host[h][seed] for h in ran]))
            trials.append(TrialResult(arm, seed, len(trials), spec.controller(arm), FINISHED, evaluation=evaluation))
    return ExperimentRecord(spec, 1, False, trials, "t.yaml")


def test_per_host_and_pooled_pairs_match_scipys_exact_signed_rank_test_with_holm(tmp_path):
    seeds = list(range(7))
    spec = ExperimentSpec.from_mapping(
        {
            **BASE,
            "seeds": seeds,
            "compare": [["ppo", "none"], ["ppo", "fix"]],
            "arms": {
                "ppo": {},
                "none": {"controller": "none"},
                "fix": {"controller": "fixed", "fixed": {"blueprint": "norm", "slot": "r0c1"}},
            },
        }
    )
    rng = np.random.default_rng(3)
    values = {
        arm: {h: list(np.round(rng.uniform(0.3, 0.9, len(seeds)), 3)) for h in ("digits", "wide")}
        for arm in ("ppo", "none", "fix")
    }
    values["fix"]["wide"] = [math.nan] * len(seeds)  # its plan does not fit that host
    stats_ = held_out_statistics(record_of(values, spec, {"ppo": 1.0, "none": 1.0, "fix": 1.0}))
    for host in ("digits", "wide"):
        pairs = stats_["per_host"][host]["pairs"]
        ppo_none = pairs[0]
        d = np.asarray(values["ppo"][host]) - np.asarray(values["none"][host])
        assert ppo_none.wilcoxon_p == pytest.approx(stats.wilcoxon(d, method="exact").pvalue)
    digits = stats_["per_host"]["digits"]["pairs"]
    expected = holm(
        [
            stats.wilcoxon(np.asarray(values["ppo"]["digits"]) - np.asarray(values[b]["digits"]), method="exact").pvalue
            for b in ("none", "fix")
        ]
    )
    assert [p.wilcoxon_p_holm for p in digits] == pytest.approx(expected)
    # pooled: per seed the mean over the hosts; ppo-fix only over the host both ran on
    pooled = stats_["pooled"]
    pooled_ppo = np.mean([values["ppo"]["digits"], values["ppo"]["wide"]], axis=0)
    pooled_none = np.mean([values["none"]["digits"], values["none"]["wide"]], axis=0)
    p_none = stats.wilcoxon(pooled_ppo - pooled_none, method="exact").pvalue
    p_fix = stats.wilcoxon(
        np.asarray(values["ppo"]["digits"]) - np.asarray(values["fix"]["digits"]), method="exact"
    ).pvalue
    assert [p.wilcoxon_p for p in pooled] == pytest.approx([p_none, p_fix])
    assert [p.wilcoxon_p_holm for p in pooled] == pytest.approx(holm([p_none, p_fix]))
    assert stats_["pooled_hosts"] == [["digits", "wide"], ["digits"]]
    d = pooled_ppo - pooled_none
    walsh = [(d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d))]
    assert pooled[0].hodges_lehmann == pytest.approx(np.median(walsh))


def test_pooling_uses_the_hosts_both_arms_ran_on():
    per_host = {"x": {"a": {0: 0.5, 1: 0.7}, "b": {0: 0.1, 1: 0.3}}, "y": {"a": {0: 0.9, 1: 0.1}, "b": {}}}
    a, b, hosts = pooled_pair(per_host, "a", "b")
    assert hosts == ["x"] and a == {0: 0.5, 1: 0.7} and b == {0: 0.1, 1: 0.3}
    per_host["y"]["b"] = {0: 0.3, 1: 0.5}
    a, b, hosts = pooled_pair(per_host, "a", "b")
    assert hosts == ["x", "y"] and a == pytest.approx({0: 0.7, 1: 0.4}) and b == pytest.approx({0: 0.2, 1: 0.4})


def test_the_report_has_a_table_per_host_a_pooled_table_and_the_cost_per_new_host(tmp_path):
    spec = ExperimentSpec.from_mapping(
        {
            **BASE,
            "seeds": [0, 1, 2],
            "arms": {
                "ppo": {},
                "none": {"controller": "none"},
                "search": {"controller": "search", "search": {"budget": 4}},
            },
        }
    )
    values = {
        arm: {"digits": [0.5 + 0.1 * i, 0.6, 0.7], "wide": [0.4, 0.5 + 0.05 * i, 0.6]}
        for i, arm in enumerate(("ppo", "none", "search"))
    }
    results = write_report(tmp_path, record_of(values, spec, {"ppo": 1.0, "none": 1.0, "search": 5.0}))
    report = (tmp_path / "report.md").read_text()
    for heading in (
        "## Held-out hosts",
        "### Cost per new host",
        "### Host `digits`",
        "### Host `wide`",
        "### Pooled over the held-out hosts",
    ):
        assert heading in report
    cost = {row["arm"]: row for row in results["statistics"]["held_out"]["cost"]}
    assert cost["search"]["host_runs_per_new_host"] == 5 and cost["ppo"]["host_runs_per_new_host"] == 1
    assert cost["ppo"]["one_off"].startswith(
        "8 host runs of training per run seed"
    )  # 1 round x 2 envs x 4 episodes (defaults)
    # a grown network costs a controller one host run and the search its 4 candidates; this evaluation spent 5 there
    assert cost["search"]["host_runs_per_network"] == 4 and cost["ppo"]["host_runs_per_network"] == 1
    assert "| search | search | 4 | 5 | 4 |" in report and "| ppo | ppo | 1 | 1 | 0 |" in report
    gap = next(p for p in results["statistics"]["held_out"]["pooled"] if p["arm_b"] == "search")["hodges_lehmann"]
    assert (
        f"- ppo against search: {100 * gap:.3g} points (pooled Hodges-Lehmann, ppo - search) "
        "at 25 % of its host runs per grown network" in report
    )
    assert json.loads((tmp_path / "results.json").read_text())["statistics"]["held_out"]["hosts"] == ["digits", "wide"]


# --------------------------------------------------------------------------------- transfer.yaml at smoke size
@pytest.mark.expensive
def test_transfer_yaml_at_smoke_size_runs_to_its_report_per_host_and_pooled(ray_local, tmp_path, capsys):
    experiment = yaml.safe_load((REPO / "tune_configs" / "transfer.yaml").read_text())
    experiment.update(seeds=[0, 1], rounds=1, last_rounds=1, eval_episodes=1, max_concurrent_trials=2)
    experiment["training"].update(max_epochs=3, envs=1, episodes_per_env=1, env={"batch_size": 1024})
    experiment["arms"]["search"]["search"]["budget"] = 2
    assert experiment["held_out"] == "digits-held-out" and experiment["training"]["family"] == "digits-family"
    experiment["held_out"] = [{"name": m.name, "env": {**m.env, "max_epochs": 3}} for m in family("digits-held-out")]
    path = tmp_path / "transfer.yaml"
    path.write_text(yaml.safe_dump(experiment))
    out = tmp_path / "run"
    assert main(["ab", str(path), "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    hosts = [h["name"] for h in experiment["held_out"]]
    assert all(t["status"] == "finished" for t in results["trials"]), [
        (t["arm"], t["error"]) for t in results["trials"]
    ]
    for t in results["trials"]:
        e = t["evaluation"]
        per_host = [e[f"test_accuracy/{h}"] for h in hosts]
        assert all(0 <= v <= 1 for v in per_host) and e["test_accuracy"] == pytest.approx(np.mean(per_host))
        assert all(e[f"host_runs/{h}"] == (1 + 2 if t["arm"] == "search" else 1) for h in hosts)
        if t["arm"] == "search":
            assert set(t["search_plans"]) == set(hosts)
    report = (out / "report.md").read_text()
    assert "### Cost per new host" in report and "### Pooled over the held-out hosts" in report
    assert all(f"### Host `{h}`" in report for h in hosts)
    cost = {row["arm"]: row["host_runs_per_new_host"] for row in results["statistics"]["held_out"]["cost"]}
    assert cost == {"ppo": 1, "heuristic": 1, "none": 1, "fixed": 1, "search": 3}

    # the PPO trial's checkpoint, as a `checkpoint` arm: evaluated frozen on the same hosts, nothing trained
    checkpoint = sorted((out / "tune").glob("ppo_seed0_*/checkpoint_*"))[-1]
    frozen = {
        **experiment,
        "name": "frozen",
        "compare": [["frozen", "none"]],
        "arms": {"frozen": {"controller": "checkpoint", "checkpoint": str(checkpoint)}, "none": {"controller": "none"}},
    }
    path.write_text(yaml.safe_dump(frozen))
    assert main(["ab", str(path), "--output", str(tmp_path / "frozen")]) == 0
    results = json.loads((tmp_path / "frozen" / "results.json").read_text())
    assert all(t["status"] == "finished" and t["history"] == [] for t in results["trials"])
    assert {row["arm"]: row["host_runs_per_new_host"] for row in results["statistics"]["held_out"]["cost"]} == {
        "frozen": 1,
        "none": 1,
    }
    assert "trained before this run" in (tmp_path / "frozen" / "report.md").read_text()


def test_transfer_equal_cost_yaml_reads_controllers_this_code_loads(monkeypatch):
    """transfer_equal_cost.yaml freezes the controllers docs/results/grow_family/ kept, one a seed: each is a checkpoint
    folder, and its policy layout is this code's (a change of the layout must retrain them or drop the file)."""
    monkeypatch.chdir(REPO)  # its paths are relative to the repository's root, where `esper-ray ab` runs it
    spec = ExperimentSpec.from_yaml(REPO / "tune_configs" / "transfer_equal_cost.yaml")
    frozen = [t for t in spec.trials() if t.controller is ControllerKind.CHECKPOINT]
    assert sorted(t.seed for t in frozen) == list(range(12)) and len({t.checkpoint for t in frozen}) == 12
    for trial in frozen:
        check_checkpoint(trial.arm, trial.checkpoint)
        check_layout(saved_layout(Path(trial.checkpoint) / MODULE_PATH), trial.checkpoint)  # what load_policy checks


def test_the_retired_controllers_layout_is_refused_in_one_line_naming_what_differs():
    """transfer.yaml's controllers (8 slot positions, weights of their own) were retired by issue 75: a checkpoint of
    their layout is refused before any pickle of it runs, in one line."""
    old = {
        "max_slots": 8,
        "base_features": 23,
        "slot_features": 31,
        "slot_descriptors": 6,
        "topologies": ["cnn", "transformer", "vector"],
        "joint_size": 41,
        "blueprints": ["noop", *BLUEPRINT_NAMES],
    }  # as docs/results/transfer/controllers/seed0 recorded it (saved_layout), before they were retired
    with pytest.raises(ValueError, match=r"^c: its policy layout does not match this code's: max_slots 8 there, 16 "):
        check_layout(old, "c")


def test_the_kept_controllers_are_complete_checkpoints_with_the_grow_family_runs_settings():
    """`eval` and `grow` take each kept controller as it is: it matches its files.json, its train_config.json holds
    the settings its seed's PPO trial of docs/results/grow_family/ trained with, and its round is the run's last."""
    record = json.loads((REPO / "docs" / "results" / "grow_family" / "experiment.json").read_text())
    spec = ExperimentSpec.from_mapping(record["experiment"])
    trials = [t for t in spec.trials() if t.arm == "ppo"]
    assert len(trials) == 12
    for trial in trials:
        folder = REPO / "docs" / "results" / "grow_family" / "controllers" / f"seed{trial.seed}"
        assert resolve_checkpoint(folder) == folder  # complete: matches its manifest
        assert load_checkpoint_config(folder) == TrainConfig.from_record(trial.train)  # one env a runner, as it ran
        assert load_checkpoint_config(folder).policy == "slots"
        assert round_of(folder) == spec.rounds


def test_a_searched_plan_no_evaluation_episode_planted_is_reported_as_not_planted_never_as_picked(tmp_path):
    """A 15-epoch held-out host: any seed could be kept at the fast tempo, but the search's candidates take the
    standard one (17 epochs), so what it ranks best there was never planted: the run warns naming the arm and the
    host, and the report marks each such plan, per host and seed, not planted (or not kept)."""
    hosts = [
        {"name": "digits", "env": {"task": "digits", "max_epochs": 25}},
        {"name": "short", "env": {"task": "digits", "max_epochs": 15}},
    ]
    spec = ExperimentSpec.from_mapping(
        {
            **BASE,
            "seeds": [0, 1],
            "held_out": hosts,
            "training": {"task": "digits-impaired"},
            "arms": {"none": {"controller": "none"}, "search": {"controller": "search", "search": {"budget": 4}}},
        }
    )
    [warning] = spec.short_run_warnings()
    assert warning.startswith(
        "arm search on host short: no seed at tempo standard can be kept in a run of max_epochs=15"
    )
    record = record_of(
        {arm: {"digits": [0.5, 0.6], "short": [0.4, 0.4]} for arm in ("none", "search")},
        spec,
        {"none": 1.0, "search": 5.0},
    )
    for t in record.trials:
        if t.arm == "search":
            t.plans = {"digits": "conv_heavy@r0c1", "short": "norm@r0c0"}
            t.evaluation.update(
                {
                    "germinated/digits": 1.0,
                    "fossilized/digits": 1.0 if t.seed == 0 else 0.0,
                    "germinated/short": 0.0,
                    "fossilized/short": 0.0,
                }
            )
    results = write_report(tmp_path, record)
    report = (tmp_path / "report.md").read_text()
    assert (
        "search on digits: 0: conv_heavy@r0c1, 1: conv_heavy@r0c1 (not kept); "
        "search on short: 0: norm@r0c0 (not planted), 1: norm@r0c0 (not planted)"
    ) in report
    assert "Plans the search picked" not in report and f"**Too short to keep a seed:** {warning}." in report
    notes = results["statistics"]["held_out"]["plan_notes"]["search"]
    assert notes == {"digits": {"1": "not kept"}, "short": {"0": "not planted", "1": "not planted"}}


def test_a_fixed_plan_not_planted_on_a_held_out_host_is_reported_per_host_and_seed():
    from esper_ray.experiments.held_out_report import plan_lines

    [_, line] = plan_lines({}, {"heavy": {"short": {0: "not planted", 1: "not planted", 2: "not kept"}}})
    assert (
        line == "Fixed plans the evaluation episodes did not plant or keep: heavy on short: not kept on seed(s) 2, "
        "not planted on seed(s) 0, 1."
    )
