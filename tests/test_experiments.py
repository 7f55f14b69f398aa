"""A/B experiments: experiment files, the start order, the report of finished/failed/missing trials, strict JSON,
resume checks, and end-to-end runs on a local Ray (one whose arms must differ)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import esper_ray
from esper_ray.cli import main
from esper_ray.contracts.actions import CNN_BLUEPRINTS
from esper_ray.contracts.controllers import ControllerKind
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.data.task_loading import load_task_data
from esper_ray.experiments.report import FIGURES, training_cost_lines, write_report
from esper_ray.experiments.results import (
    COMPUTE_COLUMNS,
    ERROR,
    FINISHED,
    INCOMPLETE,
    NOT_STARTED,
    TRIAL_DIR_RE,
    ExperimentRecord,
    TrialResult,
    metric_by_arm,
)
from esper_ray.experiments.runner import TrialWork, check_same_experiment
from esper_ray.experiments.spec import ExperimentSpec, start_order
from esper_ray.experiments.statistics import compare_arms
from esper_ray.experiments.trainable import evaluation_metrics
from esper_ray.train.commands.episodes import EpisodeSummary
from esper_ray.train.commands.evaluate import evaluation_episodes

REPO = Path(__file__).resolve().parents[1]
BASE = {
    "name": "t",
    "arms": {"a": {"reward_mode": "shaped"}, "b": {"reward_mode": "sparse", "lr": 1e-3}},
    "seeds": [0, 1, 2],
    "rounds": 2,
    "last_rounds": 1,
    "training": {"max_epochs": 3, "env": {"batch_size": 256}},
}


def test_every_arm_gets_the_same_seeds_its_own_overrides_and_its_own_copy_of_the_settings():
    spec = ExperimentSpec.from_mapping({**BASE, "arms": {**BASE["arms"], "c": {"controller": "none"}}})
    trials = spec.trials()
    assert [(t.arm, t.seed) for t in trials][:4] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    b0 = next(t for t in trials if t.name == "b_seed0")
    assert b0.train["reward_mode"] == "sparse" and b0.train["lr"] == 1e-3 and b0.train["rounds"] == 2
    assert b0.train["env"] == {"batch_size": 256} and b0.train["seed"] == 0 and b0.controller is ControllerKind.PPO
    assert next(t for t in trials if t.arm == "c").controller is ControllerKind.NONE
    assert "controller" not in next(t for t in trials if t.arm == "c").train
    trials[0].train["env"]["batch_size"] = 1  # no trial shares a dict with another, or with the spec
    assert all(t.train["env"]["batch_size"] == 256 for t in trials[1:]) and spec.training["env"]["batch_size"] == 256


def test_start_order_is_a_reproducible_permutation_that_depends_on_the_order_seed():
    trials = ExperimentSpec.from_mapping({**BASE, "seeds": list(range(6))}).trials()
    first, again, other = start_order(trials, 1), start_order(trials, 1), start_order(trials, 2)
    names = sorted(t.name for t in trials)
    assert sorted(t.name for t in first) == names and len(first) == len(trials)
    assert [t.name for t in first] == [t.name for t in again]
    assert [t.name for t in first] != [t.name for t in other]


def test_the_ppo_trials_start_first_each_kind_in_its_own_random_order():
    """PPO trials run for rounds, the others for their evaluation only: the long ones start at once."""
    arms = {"a": {}, "b": {"controller": "heuristic"}, "c": {"controller": "none"}, "d": {"reward_mode": "sparse"}}
    trials = ExperimentSpec.from_mapping({**BASE, "arms": arms, "seeds": list(range(6))}).trials()
    orders = [start_order(trials, order_seed) for order_seed in range(20)]
    for order in orders:
        kinds = [t.controller is ControllerKind.PPO for t in order]
        assert kinds == [True] * 12 + [False] * 12
    # within each kind, every arm is sometimes first: the order is random there, not by arm
    assert {order[0].arm for order in orders} == {"a", "d"}
    assert {order[12].arm for order in orders} == {"b", "c"}


def test_evaluation_episodes_depend_on_the_seed_and_settings_only():
    cfg = TrainConfig(envs=2, seed=3, reward_mode="shaped")
    other_arm = TrainConfig(envs=2, seed=3, reward_mode="sparse", lr=1e-2)
    plan, same = evaluation_episodes(cfg, 4), evaluation_episodes(other_arm, 4)
    assert [e.reset_seed for e in plan] == [e.reset_seed for e in same]
    assert [e.env_config["shard"] for e in plan] == [0, 1, 0, 1] and len({e.reset_seed for e in plan}) == 4
    assert all(e.reset_seed >= 1_000_000 for e in plan)  # never a training reset seed
    assert [e.reset_seed for e in evaluation_episodes(TrainConfig(envs=2, seed=4), 4)] != [e.reset_seed for e in plan]


def test_an_arm_s_envs_per_runner_changes_neither_its_work_nor_its_training_cost():
    """envs_per_runner=2 (issue 77): the arm's 6 envs run as 3 env runners x 2, and a round is still 6 envs'
    episodes, which the estimate of the time left and the report's training cost count as for the arm left to
    auto."""
    spec = ExperimentSpec.from_mapping(
        {
            **BASE,
            "arms": {"vec": {"envs_per_runner": 2}, "one": {}},
            "training": {**BASE["training"], "envs": 6, "episodes_per_env": 2},
        }
    )
    trials = {t.arm: t for t in spec.trials() if t.seed == 0}
    assert TrainConfig.from_mapping(trials["vec"].train).env_runners == 3
    assert TrialWork.of(trials["vec"], 1).per_round == TrialWork.of(trials["one"], 1).per_round == 6 * 2
    lines = training_cost_lines(ExperimentRecord(spec, 0, False, []))
    for arm in ("vec", "one"):
        assert f"| {arm} | 24 host runs of 3 epochs per run seed (2 rounds x 6 envs x 2 episodes) |" in lines
    assert spec.arm_envs("vec") == spec.arm_envs("one") == 6


@pytest.mark.parametrize(
    "change, match",
    [
        ({"colour": 1}, r"unknown experiment key\(s\) \['colour'\]"),
        ({"metric": "episode_return"}, "metric='episode_return'.*is never compared"),
        ({"arms": {"a": {"reward_mode": "shaped"}}}, "at least 2 arms"),
        (
            {"arms": {"a": {}, "b": {"controller": "greedy"}}},
            r"arms.b.controller='greedy': unknown controller; choose one of \['ppo'",
        ),
        ({"training": {"controller": "none"}}, "chosen per arm"),
        ({"seeds": [1, 1]}, "no repeats"),
        ({"seeds": "0,1"}, "seeds='0,1': must be a list of integers"),
        ({"arms": [1, 2]}, "arms=.*must map each arm name"),
        ({"eval_episodes": 0}, "eval_episodes=0: must be an integer >= 1"),
        ({"max_failures": -1}, "max_failures=-1"),
        ({"alpha": 1.5}, "alpha=1.5"),
        ({"training": {"seed": 3}}, r"\['seed'\] are set by the experiment"),
        ({"arms": {"a": {"reward_mode": "shaped"}, "b": {"reward_mode": "nope"}}}, "reward_mode='nope'"),
        (
            {"arms": {"a": {"reward_mode": "shaped"}, "b": {"max_epoch": 3}}},
            r"unknown training setting\(s\) \['max_epoch'\]",
        ),
        (
            {"arms": {"a": {}, "f": {"controller": "fixed"}}},
            r"arms.f: `fixed` names the seed .* this arm's controller is fixed and it has none",
        ),
        (
            {"arms": {"a": {"fixed": {"blueprint": "norm", "slot": "r0c1"}}, "b": {}}},
            r"arms.a: `fixed` names .* controller is ppo",
        ),
        (
            {"arms": {"a": {}, "f": {"controller": "fixed", "fixed": {"blueprint": "mlp", "slot": "r0c1"}}}},
            r"arms.f.fixed.blueprint: blueprint 'mlp' is not available for cnn hosts",
        ),
        (
            {
                "arms": {
                    "a": {},
                    "f": {"controller": "fixed", "slots": ["r0c0"], "fixed": {"blueprint": "norm", "slot": "r0c1"}},
                }
            },
            r"arms.f.fixed.slot='r0c1': not an enabled slot; enabled slots: \['r0c0'\]",
        ),
        ({"name": ".."}, r"name='\.\.': the name must be a plain folder name"),
        ({"name": "a/b"}, r"name='a/b': the name must be a plain folder name"),
        ({"arms": {"a": {}, "b/c": {}}}, r"arms.b/c='b/c': the arm name must be a plain folder name"),
        ({"arms": {"a": {}, "..": {}}}, r"arms...='\.\.': the arm name"),
        ({"seeds": [0, 2**32]}, r"seed=4294967296: must be below 2\*\*32 - envs"),
        ({"arms": {"a": {"overlap": True, "lead": True}, "b": {}}}, r"arms.a: lead=true does nothing in an A/B"),
    ],
)
def test_bad_experiment_files_fail_before_anything_runs(change, match):
    with pytest.raises(ValueError, match=match):
        ExperimentSpec.from_mapping({**BASE, **change})


@pytest.mark.parametrize(
    "rounds, last_rounds, used", [(1, None, 1), (2, None, 2), (3, None, 3), (10, None, 3), (10, 5, 5), (1, 1, 1)]
)
def test_last_rounds_defaults_to_three_or_all_rounds_when_fewer(rounds, last_rounds, used):
    given = {} if last_rounds is None else {"last_rounds": last_rounds}
    spec = ExperimentSpec.from_mapping(
        {**{k: v for k, v in BASE.items() if k != "last_rounds"}, "rounds": rounds, **given}
    )
    assert spec.rollout_rounds == used
    assert spec.to_dict()["last_rounds"] == used  # the record says what was averaged, and reads back the same
    assert ExperimentSpec.from_mapping(spec.to_dict()).to_dict() == spec.to_dict()


def test_last_rounds_beyond_rounds_is_refused_only_when_written():
    with pytest.raises(ValueError, match=r"last_rounds=4 exceeds rounds=2: give at most 2, or leave it out"):
        ExperimentSpec.from_mapping({**BASE, "rounds": 2, "last_rounds": 4})
    with pytest.raises(ValueError, match=r"last_rounds=0: must be an integer >= 1"):
        ExperimentSpec.from_mapping({**BASE, "last_rounds": 0})


def test_results_name_the_experiment_file_relative_to_where_the_command_ran(tmp_path):
    from esper_ray.cli import experiment_source

    (tmp_path / "runs" / "configs").mkdir(parents=True)
    inside = tmp_path / "runs" / "configs" / "x.yaml"
    assert experiment_source(inside, cwd=tmp_path / "runs") == "configs/x.yaml"
    assert experiment_source(Path("configs/x.yaml"), cwd=Path.cwd()) == "configs/x.yaml"
    assert experiment_source(inside, cwd=tmp_path / "elsewhere") == "x.yaml"  # never the machine's absolute path


def test_yaml_mistakes_name_the_file_and_line(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("name: d\narms:\n  a: {controller: none}\n  a: {controller: ppo}\nseeds: [0]\n")
    with pytest.raises(
        ValueError, match=r"dup.yaml:4:3: invalid YAML: key 'a' appears twice in one mapping \(first on line 3\)"
    ):
        ExperimentSpec.from_yaml(dup)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [x\nseeds: 1\n")
    with pytest.raises(ValueError, match=r"broken.yaml:2:.*invalid YAML"):
        ExperimentSpec.from_yaml(broken)


@pytest.mark.parametrize("path", sorted((REPO / "tune_configs").glob("**/*.yaml")))
def test_shipped_experiment_files_are_valid(path):
    spec = ExperimentSpec.from_yaml(path)
    assert len(spec.arms) >= 2 and spec.seeds


def test_shipped_comparisons_have_enough_seeds_and_the_baselines():
    controllers = ExperimentSpec.from_yaml(REPO / "tune_configs" / "controllers.yaml")
    assert {controllers.controller(a) for a in controllers.arms} >= {
        ControllerKind.PPO,
        ControllerKind.HEURISTIC,
        ControllerKind.NONE,
    }
    assert len(controllers.seeds) >= 8 and controllers.training["task"] == "digits-impaired"
    rewards = ExperimentSpec.from_yaml(REPO / "tune_configs" / "studies" / "reward_modes.yaml")
    assert {s["reward_mode"] for s in rewards.arms.values() if "reward_mode" in s} == {"shaped", "simplified", "sparse"}
    assert len(rewards.seeds) >= 8
    assert ControllerKind.FIXED in {controllers.controller(a) for a in controllers.arms}  # growth read against size


@pytest.mark.parametrize("name", ["controllers", "studies/reward_modes", "text", "studies/precision"])
def test_shipped_comparisons_can_reach_alpha_after_holm_over_their_family(name):
    """Holm multiplies the smallest p by the number of pairs the verdict tests (`compare`, or all pairs): 8 seeds
    (p >= 2/2^8) allow at most 6."""
    spec = ExperimentSpec.from_yaml(REPO / "tune_configs" / f"{name}.yaml")
    pairs = len(spec.compared_pairs)
    assert pairs * 2 / 2 ** len(spec.seeds) < spec.alpha, (pairs, len(spec.seeds))


def test_compare_names_the_verdicts_family_and_bad_pairs_fail_with_one_line():
    arms = {"a": {}, "b": {"reward_mode": "sparse"}, "c": {"controller": "none"}}
    spec = ExperimentSpec.from_mapping({**BASE, "arms": arms, "compare": [["a", "b"], ["a", "c"]]})
    assert spec.compared_pairs == [("a", "b"), ("a", "c")]
    assert ExperimentSpec.from_mapping({**BASE, "arms": arms}).compared_pairs == [("a", "b"), ("a", "c"), ("b", "c")]
    for compare, message in (
        ([["a", "z"]], r"names \['z'\], not arms"),
        ([["a", "a"]], "with itself"),
        ([["a", "b"], ["b", "a"]], "repeats a pair"),
        ("a-b", "non-empty list"),
        ([["a"]], "not a pair"),
    ):
        with pytest.raises(ValueError, match=message):
            ExperimentSpec.from_mapping({**BASE, "arms": arms, "compare": compare})


def test_holm_corrects_over_the_named_family_only():
    """Two arms far apart on 8 seeds: over a family of 1 pair p is the exact floor 2/2^8; over all 3 pairs, 3 times
    it."""
    values = {
        "a": {s: 0.5 + 0.01 * s for s in range(8)},
        "b": {s: 0.1 + 0.01 * s for s in range(8)},
        "c": {s: 0.3 + 0.02 * s for s in range(8)},
    }
    [only] = compare_arms(values, [("a", "b")])
    assert only.wilcoxon_p_holm == pytest.approx(2 / 2**8)
    every = {(p.arm_a, p.arm_b): p for p in compare_arms(values)}
    assert every[("a", "b")].wilcoxon_p_holm == pytest.approx(3 * 2 / 2**8)


def test_a_fixed_arm_carries_its_seed_into_every_trial():
    spec = ExperimentSpec.from_mapping(
        {
            **BASE,
            "arms": {
                "a": {},
                "heavy": {"controller": "fixed", "fixed": {"blueprint": "conv_heavy", "slot": "r0c1", "tempo": "fast"}},
            },
        }
    )
    fixed = [t for t in spec.trials() if t.arm == "heavy"]
    assert len(fixed) == 3 and all(
        t.controller is ControllerKind.FIXED and t.fixed.label == "conv_heavy@r0c1" for t in fixed
    )
    assert fixed[0].fixed.to_dict() == {
        "blueprint": "conv_heavy",
        "slot": "r0c1",
        "style": "sigmoid_add",
        "tempo": "fast",
    }
    assert "fixed" not in fixed[0].train and spec.fixed_plan("a") is None


# --------------------------------------------------------------------------- the report, without Ray
def record_with(statuses: dict[tuple[str, int], str], values: dict[tuple[str, int], float]) -> ExperimentRecord:
    spec = ExperimentSpec.from_mapping(
        {**BASE, "arms": {"ppo": {}, "none": {"controller": "none"}}, "seeds": list(range(8))}
    )
    trials = []
    for position, ((arm, seed), status) in enumerate(statuses.items()):
        value = values[(arm, seed)]
        evaluation = (
            None
            if status in (NOT_STARTED, INCOMPLETE) and arm == "none"
            else {
                "episodes": 4.0,
                "test_accuracy": value,
                "test_accuracy_std": 0.0,
                "test_accuracy_per_param": value,
                "val_accuracy": value,
                "val_accuracy_per_param": value,
                "params_added": 0.0,
                "host_params": 100.0,
                "fossilized": 0.0,
                "germinated": 0.0,
            }
        )
        history = (
            [
                {
                    "round": float(r),
                    "final_accuracy": value,
                    "params_added": 0.0,
                    "host_params": 100.0,
                    "episode_return": 1.0,
                    "episodes": 4.0,
                    "seconds": 1.0,
                }
                for r in range(1, 3)
            ]
            if arm == "ppo"
            else []
        )
        trials.append(
            TrialResult(
                arm,
                seed,
                position,
                ControllerKind.PPO if arm == "ppo" else ControllerKind.NONE,
                status,
                error="RuntimeError: boom" if status == ERROR else None,
                history=history,
                evaluation=evaluation,
            )
        )
    return ExperimentRecord(spec, 5, False, trials, "exp.yaml")


def test_report_reads_a_fixed_arm_at_equal_size_from_its_own_numbers(tmp_path):
    """ppo against a fixed arm that keeps a 3x larger model and trains 2x the FLOPs, same accuracy: the report
    must say so from the per-trial figures, as strict JSON (no NaN even where a trial has none)."""
    spec = ExperimentSpec.from_mapping(
        {
            **BASE,
            "seeds": list(range(8)),
            "arms": {
                "ppo": {},
                "heavy": {
                    "controller": "fixed",
                    "fixed": {"blueprint": "conv_heavy", "slot": "r0c1"},
                    "sweep_host_runs": 336,
                },
            },
        }
    )
    trials = []
    for position, (arm, seed) in enumerate((a, s) for s in range(8) for a in ("ppo", "heavy")):
        params = (400.0 if arm == "ppo" else 1200.0) + seed
        train = (1e9 if arm == "ppo" else 2e9) * (1 + seed / 10)
        evaluation = {
            "episodes": 4.0,
            "test_accuracy": 0.6 + 0.01 * seed,
            "test_accuracy_std": 0.0,
            "test_accuracy_per_param": 1.0,
            "val_accuracy": 0.6,
            "val_accuracy_per_param": 1.0,
            "params_added": params - 160,
            "host_params": 160.0,
            "fossilized": 1.0,
            "germinated": 1.0,
            "final_params": params,
            "refused": 0.0,
            "train_flops": train,
            "seed_train_flops": train / 2,
            "validation_flops": 1e8,
            "counterfactual_flops": 0.0 if arm == "heavy" else 1e8,
            "seconds": math.nan if seed == 7 else 2.0,
            "test_accuracy_with_probation": 0.7 if arm == "ppo" else 0.6 + 0.01 * seed,
            "params_on_probation": 50.0 if arm == "ppo" else 0.0,
        }
        history = (
            [
                {
                    "round": 1.0,
                    "final_accuracy": 0.6,
                    "params_added": 0.0,
                    "host_params": 160.0,
                    "episode_return": 1.0,
                    "episodes": 4.0,
                    "seconds": 1.0,
                }
            ]
            if arm == "ppo"
            else []
        )
        trials.append(
            TrialResult(arm, seed, position, spec.controller(arm), FINISHED, history=history, evaluation=evaluation)
        )
    results = write_report(tmp_path, ExperimentRecord(spec, 5, False, trials, "exp.yaml"))
    assert any(
        t["evaluation"]["seconds"] is not None and math.isnan(t["evaluation"]["seconds"]) for t in results["trials"]
    )

    def refuse(token: str) -> float:
        raise AssertionError(f"{token} is not JSON")

    stored = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)
    assert json.loads(json.dumps(stored, allow_nan=False)) == stored
    assert results["statistics"]["compute"]["arms"][1]["means"]["seconds"] == 2.0
    pair = stored["statistics"]["compute"]["pairs"][0]
    assert pair["params_difference"] == -800 and pair["train_flops_ratio"] == pytest.approx(0.5)
    assert pair["params_ratio"] == pytest.approx(np.median([(400 + s) / (1200 + s) for s in range(8)]))  # 0.3355
    sentence = stored["statistics"]["compute"]["size_verdicts"][0]
    assert sentence.startswith(
        "At equal size: ppo has 66 % fewer final parameters than heavy (median paired difference -800)"
    )
    assert "50 % fewer training FLOPs" in sentence
    heavy = next(a for a in stored["statistics"]["compute"]["arms"] if a["arm"] == "heavy")
    assert (
        heavy["means"]["final_params"] == pytest.approx(1203.5) and heavy["means"]["seconds"] == 2.0
    )  # seed 7: no seconds
    assert next(t for t in stored["trials"] if t["arm"] == "heavy")["fixed"]["blueprint"] == "conv_heavy"
    text = (tmp_path / "report.md").read_text()
    assert "heavy = fixed(conv_heavy@r0c1)" in text and "## Size and compute" in text and sentence in text
    # what the runs kept: the committed metric beside the same episodes with the seeds on probation left in
    assert "| ppo | 0.635 | 0.7 | 1 | " in text and "| 50 |" in text and "| heavy | 0.635 | 0.635 | 1 | " in text
    assert "## What each controller cost before its evaluation" in text and f"({spec.rounds} rounds x" in text
    assert "| heavy | 336 host runs once for all seeds (the sweep that picked its seed) |" in text
    assert (tmp_path / "metric_vs_flops.png").stat().st_size > 0
    assert "Start order: a random permutation with order seed 5: ppo/0, heavy/0, ppo/1" in text  # as recorded
    ppo_first = sorted(trials, key=lambda t: (t.arm != "ppo", t.position))
    for position, t in enumerate(ppo_first):
        t.position = position
    write_report(tmp_path, ExperimentRecord(spec, 5, False, trials, "exp.yaml"))
    text = (tmp_path / "report.md").read_text()
    assert (
        "Start order: PPO trials first (the longest), each kind in a random permutation with order seed 5: ppo/0, ppo/1"
        in text
    )


def test_evaluation_reports_test_loss_and_its_perplexity_beside_the_metric(tmp_path):
    """A trial's perplexity is exp of its episodes' mean test loss (a diverged episode makes it NaN, not a number);
    the report lists it per arm and seed-paired, from the trials' own figures."""

    def summary(loss: float | None) -> EpisodeSummary:
        return EpisodeSummary(
            episode=0,
            steps=3,
            episode_return=0.0,
            initial_accuracy=0.1,
            final_accuracy=0.5,
            host_params=100,
            params_added=0,
            germinated=0,
            fossilized=0,
            pruned=0,
            rollbacks=0,
            refused=0,
            train_flops=1,
            seed_train_flops=0,
            validation_flops=1,
            counterfactual_flops=0,
            rolled_back=False,
            seconds=1.0,
            test_accuracy=0.5,
            test_loss=loss,
        )

    metrics = evaluation_metrics([summary(2.0), summary(2.5)])
    assert metrics["eval/test_loss"] == pytest.approx(2.25) and metrics["eval/test_perplexity"] == pytest.approx(
        math.e**2.25
    )
    assert math.isnan(evaluation_metrics([summary(2.0), summary(float("inf"))])["eval/test_perplexity"])
    assert math.isnan(evaluation_metrics([summary(None)])["eval/test_loss"])

    statuses = {(arm, s): FINISHED for s in range(8) for arm in ("ppo", "none")}
    record = record_with(statuses, {(arm, s): 0.5 for arm in ("ppo", "none") for s in range(8)})
    for t in record.trials:  # ppo's loss 0.1 lower on every seed
        loss = 2.0 + 0.05 * t.seed - (0.1 if t.arm == "ppo" else 0.0)
        t.evaluation.update({c: 1.0 for c in COMPUTE_COLUMNS} | {"test_loss": loss, "test_perplexity": math.exp(loss)})
    write_report(tmp_path, record)
    text = (tmp_path / "report.md").read_text()
    ppo_mean = np.mean([math.exp(2.0 + 0.05 * s - 0.1) for s in range(8)])
    assert (
        "## Test loss and perplexity" in text
        and f"| ppo | 8 | {np.mean([2.0 + 0.05 * s - 0.1 for s in range(8)]):.4g} | {ppo_mean:.4g}" in text
    )
    median = np.median([math.exp(2.0 + 0.05 * s - 0.1) - math.exp(2.0 + 0.05 * s) for s in range(8)])
    assert f"| ppo | none | 8 | {median:.4g} | 8 of 8 |" in text


def test_failed_and_unfinished_trials_are_excluded_listed_and_shrink_n(tmp_path):
    statuses = {(arm, s): FINISHED for s in range(8) for arm in ("ppo", "none")}
    statuses[("ppo", 3)] = ERROR  # raised, retries used up: its partial metric must not count
    statuses[("ppo", 5)] = INCOMPLETE  # 3 of 30 rounds
    statuses[("none", 6)] = NOT_STARTED
    values = {(arm, s): (0.6 if arm == "ppo" else 0.4) + 0.01 * s for arm in ("ppo", "none") for s in range(8)}
    record = record_with(statuses, values)
    by_arm = metric_by_arm(record)
    assert sorted(by_arm["ppo"]) == [0, 1, 2, 4, 6, 7] and sorted(by_arm["none"]) == [0, 1, 2, 3, 4, 5, 7]
    results = write_report(tmp_path, record)
    text = (tmp_path / "report.md").read_text()
    assert "**n shrank:** 3 of 16 planned trials" in text and "ppo/seed 3 (error: RuntimeError: boom)" in text
    pair = results["statistics"]["pairs"][0]
    assert pair["n_pairs"] == 5 and pair["n_a"] == 6 and pair["n_b"] == 7  # seeds 0, 1, 2, 4, 7 in both arms
    assert "undecidable" in results["statistics"]["verdicts"][0]  # 5 pairs cannot reach 0.05
    assert [t["in_statistics"] for t in results["trials"]].count(False) == 3
    for figure in FIGURES:
        assert (tmp_path / figure).stat().st_size > 0


def test_results_json_is_strict_json(tmp_path):
    statuses = {(arm, s): FINISHED for s in range(8) for arm in ("ppo", "none")}
    values = {(arm, s): 0.5 for arm in ("ppo", "none") for s in range(8)}  # identical arms: NaN p-values inside
    write_report(tmp_path, record_with(statuses, values))

    def refuse(token: str) -> float:
        raise AssertionError(f"{token} is not JSON")

    results = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)
    assert results["statistics"]["pairs"][0]["wilcoxon_p"] is None and results["source"] == "exp.yaml"


def test_a_clear_paired_win_is_the_verdict(tmp_path):
    statuses = {(arm, s): FINISHED for s in range(8) for arm in ("ppo", "none")}
    values = {("ppo", s): 0.3 + 0.05 * s + 0.01 * (s + 1) for s in range(8)} | {
        ("none", s): 0.3 + 0.05 * s for s in range(8)
    }
    results = write_report(tmp_path, record_with(statuses, values))
    verdict = results["statistics"]["verdicts"][0]
    assert verdict.startswith("ppo beats none on test_accuracy") and "p=0.0078" in verdict


def test_report_of_a_folder_that_is_not_a_run_is_one_clear_line(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    for target, message in ((tmp_path / "file.txt", "is not a folder"), (tmp_path, "holds no experiment.json")):
        with pytest.raises(SystemExit) as exit_info:
            main(["report", str(target)])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_ab_refuses_to_overwrite_a_run_and_to_resume_another_experiment(tmp_path, capsys):
    (tmp_path / "tune").mkdir()
    with pytest.raises(SystemExit):
        main(["ab", str(REPO / "tune_configs" / "smoke.yaml"), "--output", str(tmp_path)])
    assert "already holds a run: add --resume" in capsys.readouterr().err
    smoke = ExperimentSpec.from_yaml(REPO / "tune_configs" / "smoke.yaml")
    (tmp_path / "experiment.json").write_text(
        json.dumps({"experiment": smoke.to_dict(), "source": "/x/smoke.yaml", "start_order": []})
    )
    other = REPO / "tune_configs" / "controllers.yaml"
    with pytest.raises(SystemExit):
        main(["ab", str(other), "--output", str(tmp_path), "--resume"])
    err = capsys.readouterr().err
    assert "holds a run of experiment 'smoke' from /x/smoke.yaml" in err and "controllers.yaml differs in" in err
    with pytest.raises(SystemExit):  # its trials were started without keeping networks: --save cannot apply now
        main(["ab", str(REPO / "tune_configs" / "smoke.yaml"), "--output", str(tmp_path), "--resume", "--save"])
    assert "was started without --save" in capsys.readouterr().err
    # The cap on trials at once is the machine's: resuming on another machine with another cap is the same run.
    check_same_experiment(dataclasses.replace(smoke, max_concurrent_trials=7), tmp_path, "/x/smoke.yaml")


# ------------------------------------------------------------------------------- on a local Ray
@pytest.mark.expensive
def test_a_trial_larger_than_the_local_cluster_is_refused_before_tune_starts(ray_local, tmp_path, capsys):
    smoke = (REPO / "tune_configs" / "smoke.yaml").read_text()
    big = tmp_path / "big.yaml"
    big.write_text(smoke.replace("  cpus_per_env: 0.5\n", "  cpus_per_env: 3\n"))
    assert "cpus_per_env: 3" in big.read_text()
    with pytest.raises(SystemExit) as exit_info:
        main(["ab", str(big), "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "arms.ppo: one trial asks for 3.5 CPU (there are 2)" in err, (
        err
    )  # 3 for its env, 0.5 its driver
    assert not (tmp_path / "run" / "tune").exists()


@pytest.mark.expensive
def test_smoke_experiment_trains_evaluates_reports_and_keeps_the_grown_networks(ray_local, tmp_path, capsys):
    out = tmp_path / "smoke"
    assert main(["ab", str(REPO / "tune_configs" / "smoke.yaml"), "--output", str(out), "--save"]) == 0
    for name in ["results.json", "report.md", "experiment.json", *FIGURES]:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    trials = results["trials"]
    assert len(trials) == 4 and sorted(t["start_position"] for t in trials) == [0, 1, 2, 3]
    assert [(t["arm"], t["seed"]) for t in sorted(trials, key=lambda t: t["start_position"])] == [
        (o["arm"], o["seed"]) for o in json.loads((out / "experiment.json").read_text())["start_order"]
    ]
    for t in trials:
        assert t["status"] == "finished" and 0 <= t["final_metric"] <= 1 and t["evaluation"]["episodes"] == 2
        assert len(t["history"]) == (1 if t["controller"] == "ppo" else 0)
    # the PPO rounds' seeds by blueprint come back from Tune's records, summing to the seeds germinated per episode
    for row in (r for t in trials for r in t["history"]):
        planted = [v for k, v in row.items() if k.startswith("by_blueprint/germinated_")]
        assert len(planted) == len(CNN_BLUEPRINTS) and sum(planted) == pytest.approx(row["germinated"])
    assert "## Verdict" in (out / "report.md").read_text()
    printed = capsys.readouterr().out
    assert "started  ppo/seed0" in printed and "evaluation: test acc" in printed
    assert re.search(
        r"ppo/seed0 round 1/1: rollout acc [0-9.]+%; its setup \d+ s \(env runners up after \d+ s, "
        r"then built in \d+ s\); evaluation",
        printed,
    )
    assert (
        "trials at once on 2 CPU: 2 ppo trials at once (1 CPU each)" in printed and "no cap" in printed
    )  # smoke sets none
    # --save: every evaluation episode's network, the PPO arm's (sent back by its env runner) and the baseline's
    assert f"networks: 8 grown networks in {out / 'networks'}" in printed
    data = load_task_data("digits-impaired")
    for t in trials:
        kept = [out / "networks" / t["arm"] / f"seed{t['seed']}" / f"episode{i}" for i in range(2)]
        runs = [json.loads((k / "architecture.json").read_text())["run"] for k in kept]
        assert np.mean([r["test_accuracy"] for r in runs]) == pytest.approx(t["evaluation"]["test_accuracy"], abs=1e-12)
        assert (
            runs[0]["controller"].endswith(f"of A/B trial {t['arm']}/seed{t['seed']}")
            and (kept[1] / "summary.md").is_file()
        )
        network = esper_ray.load_grown(kept[0])
        chunk = EnvConfig.from_mapping({}).effective_val_batch_size  # the env's validation chunks (the same float sums)
        with torch.no_grad():  # an independent count on the test split, on the CPU as the trial ran
            correct = sum(
                int(
                    (
                        network(data.prepare(data.test_x[i : i + chunk])).argmax(dim=1) == data.test_y[i : i + chunk]
                    ).sum()
                )
                for i in range(0, len(data.test_y), chunk)
            )
        assert correct / len(data.test_y) == pytest.approx(runs[0]["test_accuracy"], abs=1e-12)

    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0  # rebuilds the report from the run folder
    assert (out / "report.md").is_file() and "# A/B experiment `smoke`" in capsys.readouterr().out

    assert main(["ab", str(REPO / "tune_configs" / "smoke.yaml"), "--output", str(out), "--resume"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert [t["evaluation"] for t in again["trials"]] == [t["evaluation"] for t in trials]  # nothing re-ran

    # measurements/policy_probe.py on the PPO trial's checkpoint: the policy watched along the fixed lifecycle
    trial = next((out / "tune").glob("ppo_seed0_*"))
    run = subprocess.run(
        [
            sys.executable,
            "measurements/policy_probe.py",
            "--trial",
            str(trial),
            "--blueprints",
            "conv_light",
            "--json",
            str(tmp_path / "probe.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    probe = json.loads((tmp_path / "probe.json").read_text())["results"][0]
    assert [s["stage"] for s in probe["steps"]] == ["DORMANT", "TRAINING", "TRAINING", "TRAINING"]  # 4 epochs
    assert all(s["prune"] == 0 and s["wait"] > 0 for s in probe["steps"][1:])  # age < 5: PRUNE masked, no mass on it
    assert 0 < probe["first_step"]["germinate"] <= 1
    assert sum(probe["first_step"]["blueprint"].values()) == pytest.approx(1, abs=0.01)
    assert "conv_light@r0c0; step 0: P(germinate)" in run.stdout
    # measurements/kept_seeds.py on the same checkpoint: every slot's seed in the run's evaluation episodes
    run = subprocess.run(
        [
            sys.executable,
            "measurements/kept_seeds.py",
            "--trial",
            str(trial),
            "--episodes",
            "2",
            "--json",
            str(tmp_path / "kept.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    episodes = json.loads((tmp_path / "kept.json").read_text())["episodes"]
    assert [e["episode"] for e in episodes] == [0, 1] and run.stdout.count("test acc") == 2
    for e in episodes:  # the slots' latest seeds agree with the env's own counts
        assert sum(s["fossilized"] is not None for s in e["seeds"]) == e["fossilized"]
        assert (len(e["seeds"]) > 0) == (e["germinated"] > 0) and len(e["seeds"]) <= e["germinated"]
        assert all(
            1 <= s["germinated"] <= 4 and (s["stage"] == "FOSSILIZED") == (s["fossilized"] is not None)
            for s in e["seeds"]
        )


@pytest.mark.expensive
def test_a_gpu_experiment_file_runs_unchanged_on_a_machine_without_gpus_and_its_resume_stays_there(
    ray_local, tmp_path, capsys
):
    if ray_local.cluster_resources().get("GPU", 0) > 0:
        pytest.skip("this machine has a GPU: the file would run on it")
    smoke = (REPO / "tune_configs" / "smoke.yaml").read_text()
    experiment = tmp_path / "gpu.yaml"
    experiment.write_text(
        smoke.replace("  cpus_per_env: 0.5\n", "  cpus_per_env: 0.5\n  gpus_per_env: 0.25\n  mps: true\n")
        .replace("eval_episodes: 2", "eval_episodes: 1")
        .replace("seeds: [0, 1]", "seeds: [0]")
    )
    assert "gpus_per_env: 0.25" in experiment.read_text()
    out = tmp_path / "run"
    assert main(["ab", str(experiment), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "this machine has none; every trial runs on the CPUs" in printed
    assert "trials at once on 2 CPU: 2 ppo trials at once (1 CPU each)" in printed  # no GPU asked
    record = json.loads((out / "experiment.json").read_text())
    assert (
        record["envs_on_cpus"] is True and record["experiment"]["training"]["gpus_per_env"] == 0.25
    )  # the file as given
    results = json.loads((out / "results.json").read_text())
    assert [t["status"] for t in results["trials"]] == ["finished", "finished"]
    assert results["envs_on_cpus"] and all("gpus_per_env" not in t["config"] for t in results["trials"])  # as each ran
    assert "every trial ran on the CPUs" in (out / "report.md").read_text()
    assert (
        main(["ab", str(experiment), "--output", str(out), "--resume"]) == 0
    )  # the resume keeps the CPUs, from the record
    assert "this run started on a machine without GPUs; every trial runs on the CPUs" in capsys.readouterr().out


@pytest.mark.expensive
def test_an_ab_run_with_a_fixed_arm_writes_size_and_compute_as_strict_json(ray_local, tmp_path):
    experiment = tmp_path / "fixed.yaml"
    experiment.write_text(
        json.dumps(
            {
                "name": "fixed",
                "seeds": [0, 1],
                "rounds": 1,
                "last_rounds": 1,
                "eval_episodes": 1,
                "order_seed": 1,
                "arms": {
                    "none": {"controller": "none"},
                    "norm": {"controller": "fixed", "fixed": {"blueprint": "norm", "slot": "r0c1"}},
                    "pair": {
                        "controller": "fixed",
                        "fixed": [{"blueprint": "norm", "slot": "r0c1"}, {"blueprint": "conv_light", "slot": "r0c2"}],
                    },
                },
                "max_concurrent_trials": 2,
                "training": {
                    "task": "digits-impaired",
                    "max_epochs": 3,
                    "envs": 1,
                    "cpus_per_env": 0.5,
                    "env": {"batch_size": 1024, "commit_horizon": False},
                },  # 3 epochs: the horizon would mask GERMINATE
            }
        )
    )
    out = tmp_path / "run"
    assert main(["ab", str(experiment), "--output", str(out)]) == 0

    def refuse(token: str) -> float:
        raise AssertionError(f"{token} is not JSON")

    results = json.loads((out / "results.json").read_text(), parse_constant=refuse)
    for t in results["trials"]:
        e = t["evaluation"]
        assert t["status"] == "finished" and e["train_flops"] > e["validation_flops"] > 0 and e["seconds"] > 0
        if t["arm"] == "norm":  # germinated at step 1 (2C + 1 = 9 params at C = 4), but 3 epochs end its run in
            # TRAINING: on probation, dropped from the kept (committed) model
            assert t["fixed"] == {"blueprint": "norm", "slot": "r0c1", "style": "sigmoid_add", "tempo": "standard"}
            assert e["germinated"] == 1 and e["refused"] == 0
            assert e["final_params"] == e["host_params"] and e["params_on_probation"] == 9
        elif t["arm"] == "pair":  # a list of seeds; in 3 epochs the second cannot go in (the first is in TRAINING)
            assert [f["slot"] for f in t["fixed"]] == ["r0c1", "r0c2"] and e["germinated"] == 1 and e["refused"] == 0
        else:
            assert (
                e["final_params"] == e["host_params"] and e["seed_train_flops"] == 0 and e["counterfactual_flops"] == 0
            )
    assert results["statistics"]["compute"]["size_verdicts"][0].startswith("At equal size: none has")
    assert (out / "metric_vs_flops.png").stat().st_size > 0
    assert "pair = fixed(norm@r0c1+conv_light@r0c2)" in (out / "report.md").read_text()


@pytest.mark.expensive
def test_an_ab_run_with_two_envs_per_runner_trains_every_env_and_records_the_setting(ray_local, tmp_path):
    """envs_per_runner: 2 in the file's training settings (issue 77): each PPO trial's two envs run as one env
    runner's vector env, so each round finishes 2 x episodes_per_env episodes, and the run records the split."""
    experiment = tmp_path / "vector.yaml"
    experiment.write_text(
        json.dumps(
            {
                "name": "vector",
                "seeds": [0],
                "rounds": 2,
                "last_rounds": 1,
                "eval_episodes": 1,
                "order_seed": 1,
                "arms": {"ppo": {"controller": "ppo", "reward_mode": "shaped"}, "none": {"controller": "none"}},
                "training": {
                    "task": "digits-impaired",
                    "max_epochs": 3,
                    "envs": 2,
                    "envs_per_runner": 2,
                    "episodes_per_env": 2,
                    "learners": 0,
                    "cpus_per_env": 0.5,
                    "driver_cpus": 0.5,
                    "learner_cpus": 0.5,
                    "env": {"batch_size": 512, "commit_horizon": False},
                },
            }
        )
    )
    out = tmp_path / "run"
    assert main(["ab", str(experiment), "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["experiment"]["training"]["envs_per_runner"] == 2 and results["envs_per_runner"] == {"ppo": 2}
    trials = {t["arm"]: t for t in results["trials"]}
    assert all(t["status"] == "finished" and t["config"]["envs_per_runner"] == 2 for t in trials.values())
    assert [(r["round"], r["episodes"]) for r in trials["ppo"]["history"]] == [(1, 4), (2, 4)]  # 2 envs x 2
    assert trials["ppo"]["evaluation"]["episodes"] == trials["none"]["evaluation"]["episodes"] == 1
    report = (out / "report.md").read_text()
    assert "| ppo | 8 host runs of 3 epochs per run seed (2 rounds x 2 envs x 2 episodes) |" in report


@pytest.mark.expensive
def test_an_experiment_whose_arms_differ_reaches_a_paired_verdict(ray_local, tmp_path):
    """Two fixed controllers on the same 6 seeds: the same hosts, one with a learning rate 20x lower, so every
    seed pair differs the same way and the exact paired test reaches its floor p = 2 / 2^6."""
    experiment = tmp_path / "lr.yaml"
    experiment.write_text(
        json.dumps(
            {
                "name": "lr",
                "seeds": list(range(6)),
                "rounds": 1,
                "last_rounds": 1,
                "eval_episodes": 1,
                "arms": {"none": {"controller": "none"}, "slow": {"controller": "none", "env": {"host_lr": 0.0025}}},
                "max_concurrent_trials": 2,
                "order_seed": 3,
                "training": {"task": "digits", "max_epochs": 3, "envs": 1, "cpus_per_env": 0.5},
            }
        )
    )
    out = tmp_path / "run"
    assert main(["ab", str(experiment), "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    by_arm = {a: [t["final_metric"] for t in results["trials"] if t["arm"] == a] for a in ("none", "slow")}
    assert min(by_arm["none"]) > max(by_arm["slow"])
    pair = results["statistics"]["pairs"][0]
    assert pair["wilcoxon_n"] == 6 and pair["wilcoxon_p"] == pytest.approx(2 / 64)
    assert results["statistics"]["verdicts"][0].startswith("none beats slow on test_accuracy at alpha=0.05")
    assert np.isfinite(pair["hodges_lehmann"]) and pair["hodges_lehmann"] > 0 and math.isfinite(pair["mann_whitney_p"])


# ------------------------------------------------------------------------------- trust: run folders are data
class RunsCode:
    """A crafted pickle: unpickling it creates the file `path` (what a hostile run folder would do instead)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def crafted_run(tmp_path: Path, marker: Path) -> Path:
    """A run folder of tune_configs/smoke.yaml as Tune leaves it, every pickle Tune would load crafted to create
    `marker`: tuner.pkl, a trial's params.pkl and error.pkl, and a CLOUDPICKLE_FALLBACK entry of the state file.
    Its ppo trial was resumed after round 1 was reported but not checkpointed: result.json holds round 1 twice."""
    import pickle

    from esper_ray.experiments.runner import plan

    out = tmp_path / "run"
    tune = out / "tune"
    tune.mkdir(parents=True)
    smoke = ExperimentSpec.from_yaml(REPO / "tune_configs" / "smoke.yaml")
    ordered = plan(smoke, out, "tune_configs/smoke.yaml")
    crafted = pickle.dumps(RunsCode(marker)).hex()
    trials = []
    for i, t in enumerate(ordered):
        name = f"{t.arm}_seed{t.seed}_abcde_{i:05d}"
        (tune / name).mkdir()
        (tune / name / "params.pkl").write_bytes(pickle.dumps(RunsCode(marker)))
        evaluation = {
            f"eval/{c}": 0.5
            for c in (
                "test_accuracy",
                "test_accuracy_std",
                "test_accuracy_per_param",
                "val_accuracy",
                "val_accuracy_per_param",
                "params_added",
                "host_params",
                "fossilized",
                "germinated",
                "episodes",
            )
        }
        rows = []
        if t.controller is ControllerKind.PPO:
            summary = {
                f"round/{c}": 0.1
                for c in ("final_accuracy", "params_added", "host_params", "episode_return", "episodes", "seconds")
            }
            rows = [
                {
                    "training_iteration": 1,
                    "timestamp": 10.0,
                    "time_this_iter_s": 1.0,
                    "round/round": 1,
                    **summary,
                    "round/final_accuracy": 0.1,
                },  # reported, then interrupted before its checkpoint
                {
                    "training_iteration": 1,
                    "timestamp": 20.0,
                    "time_this_iter_s": 1.0,
                    "round/round": 1,
                    **summary,
                    "round/final_accuracy": 0.3,
                    **evaluation,
                },
            ]  # the round again, after the resume
        else:
            rows = [{"training_iteration": 1, "timestamp": 10.0, "time_this_iter_s": 1.0, **evaluation}]
        (tune / name / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        trial = {
            "trial_id": f"abcde_{i:05d}",
            "status": "TERMINATED",
            "relative_logdir": name,
            "config": {"trial": {"arm": t.arm, "seed": t.seed}},
            "storage": {"_type": "CLOUDPICKLE_FALLBACK", "value": crafted},
        }
        trials.append([json.dumps(trial), json.dumps({"last_result": rows[-1]})])
    (tune / "experiment_state-2026-01-01_00-00-00.json").write_text(
        json.dumps(
            {"trial_data": trials, "runner_data": {"_stopper": {"_type": "CLOUDPICKLE_FALLBACK", "value": crafted}}}
        )
    )
    (tune / "tuner.pkl").write_bytes(pickle.dumps(RunsCode(marker)))
    return out


def test_report_of_a_run_folder_runs_no_code_from_it_and_counts_each_round_once(tmp_path, capsys):
    marker = tmp_path / "ran"
    out = crafted_run(tmp_path, marker)
    assert main(["report", str(out)]) == 0
    assert not marker.exists()
    results = json.loads((out / "results.json").read_text())
    ppo = [t for t in results["trials"] if t["arm"] == "ppo"]
    assert all(t["status"] == "finished" and [r["round"] for r in t["history"]] == [1] for t in ppo)
    assert all(t["history"][0]["final_accuracy"] == 0.3 for t in ppo)  # the round's report after the resume
    assert "| ppo | 0 | ppo | finished | 0.5 | 1 |" in (out / "report.md").read_text()  # rounds column: 1


def test_report_reads_no_file_outside_its_run_folder(tmp_path, capsys):
    """A trial whose relative_logdir leads out of tune/ (issue 69, item 5): refused in one line, and nothing of the
    folder it names reaches report.md or results.json."""
    out = crafted_run(tmp_path, tmp_path / "ran")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "error.txt").write_text("Traceback\nSecretError: a line of another folder\n")
    state = sorted((out / "tune").glob("experiment_state-*.json"))[-1]
    raw = json.loads(state.read_text())
    trial, meta = raw["trial_data"][0]
    raw["trial_data"][0] = [
        json.dumps({**json.loads(trial), "status": "ERROR", "relative_logdir": "../../elsewhere"}),
        meta,
    ]
    state.write_text(json.dumps(raw))
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(out)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "relative_logdir='../../elsewhere'" in err and len(err.splitlines()) == 1, err
    assert not any("SecretError" in p.read_text() for p in out.glob("*.*") if p.suffix in (".md", ".json"))
    # the trial's own folder, its error.txt a link to the other folder's
    raw["trial_data"][0] = [json.dumps({**json.loads(trial), "status": "ERROR"}), meta]
    state.write_text(json.dumps(raw))
    (out / "tune" / json.loads(trial)["relative_logdir"] / "error.txt").symlink_to(tmp_path / "elsewhere" / "error.txt")
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(out)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "error.txt: a link to" in err and "SecretError" not in err, err


def no_ray_may_start(monkeypatch) -> None:
    """Make starting (or joining) Ray from `esper-ray ab` fail the test: what is checked must be checked before."""

    def refuse(*args, **kwargs):
        raise AssertionError("esper-ray ab went on to start Ray")

    monkeypatch.setattr("esper_ray.experiments.runner.connect_ray", refuse)


def test_resume_of_a_tune_folder_that_differs_from_its_manifest_loads_none_of_its_pickles(
    tmp_path, capsys, monkeypatch
):
    import pickle

    from esper_ray.experiments.runner import TUNE_MANIFEST
    from esper_ray.train.folders.manifest import write_manifest

    no_ray_may_start(monkeypatch)
    marker = tmp_path / "ran"
    out = crafted_run(tmp_path, marker)
    smoke = str(REPO / "tune_configs" / "smoke.yaml")
    # no manifest: the folder cannot be checked (a kill -9, or not written by esper-ray)
    with pytest.raises(SystemExit) as exit_info:
        main(["ab", smoke, "--output", str(out), "--resume"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"{TUNE_MANIFEST}: missing" in err and "Traceback" not in err
    # a manifest, then tuner.pkl swapped: named, refused
    write_manifest(out / "tune", out / TUNE_MANIFEST)
    (out / "tune" / "tuner.pkl").write_bytes(pickle.dumps(RunsCode(marker)) + b"  ")
    with pytest.raises(SystemExit) as exit_info:
        main(["ab", smoke, "--output", str(out), "--resume"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and "tuner.pkl: " in err and "differs from tune_files.json" in err
    assert not marker.exists()


def test_salvage_of_a_killed_run_keeps_its_finished_trials_and_reruns_the_rest_loading_no_pickle(
    tmp_path, capsys, monkeypatch
):
    """A run killed with kill -9 leaves tune/ unlike its manifest. --resume refuses it and names --salvage;
    salvaging sets tune/ aside, keeps the trials that finished there (JSON only: the crafted pickles never run)
    and leaves the others to run again, in the recorded order (Tune's part: the expensive test below)."""
    from esper_ray.experiments.results import collect_trials
    from esper_ray.experiments.runner import check_tune_folder, unfinished_order

    marker = tmp_path / "ran"
    out = crafted_run(tmp_path, marker)
    smoke = str(REPO / "tune_configs" / "smoke.yaml")
    unfinished = sorted((out / "tune").glob("none_seed1_*"))[0]
    (unfinished / "result.json").write_text("")  # killed before it reported anything
    no_ray_may_start(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(["ab", smoke, "--output", str(out), "--salvage"])
    assert exit_info.value.code == 2 and "add --resume" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["ab", smoke, "--output", str(out), "--resume"])
    assert exit_info.value.code == 2 and "--salvage" in capsys.readouterr().err

    assert check_tune_folder(out, salvage=True) is False  # nothing for Tune to restore
    assert "set aside as tune_salvaged_1: 3 finished trials kept" in capsys.readouterr().out
    assert (out / "tune_salvaged_1" / unfinished.name).is_dir() and not (out / "tune").exists()
    assert [(t.arm, t.seed) for t in unfinished_order(ExperimentSpec.from_yaml(smoke), out)] == [("none", 1)]
    record = collect_trials(out)
    assert {(t.arm, t.seed): t.status for t in record.trials} == {
        ("ppo", 0): FINISHED,
        ("ppo", 1): FINISHED,
        ("none", 0): FINISHED,
        ("none", 1): NOT_STARTED,
    }
    [ppo0] = [t for t in record.trials if (t.arm, t.seed) == ("ppo", 0)]
    assert [r["final_accuracy"] for r in ppo0.history] == [0.3]  # read from the set-aside folder's JSON
    assert ppo0.ran_in == ["tune_salvaged_1"]
    assert not marker.exists()


@pytest.mark.parametrize("name, key", [("..", "name"), ("a/b", "name"), ("", "name")])
def test_an_experiment_or_arm_name_that_is_a_path_fails_before_ray_starts(tmp_path, capsys, monkeypatch, name, key):
    no_ray_may_start(monkeypatch)
    experiment = tmp_path / "x.yaml"
    experiment.write_text(json.dumps({**BASE, "name": name}))
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")  # the default output esper_runs/NAME would be below here
    with pytest.raises(SystemExit) as exit_info:
        main(["ab", str(experiment)])
    assert exit_info.value.code == 2 and f"{key}={name!r}" in capsys.readouterr().err
    assert list((tmp_path / "here").iterdir()) == []


def write_stop_experiment(path: Path, name: str, rounds: int, max_epochs: int) -> None:
    """The smallest run worth stopping: one seed of a PPO arm (one env, one episode a round) beside no growth."""
    path.write_text(
        json.dumps(
            {
                "name": name,
                "seeds": [0],
                "rounds": rounds,
                "last_rounds": rounds,
                "eval_episodes": 1,
                "order_seed": 1,
                "arms": {"ppo": {"controller": "ppo"}, "none": {"controller": "none"}},
                "max_concurrent_trials": 2,
                "training": {
                    "task": "digits-impaired",
                    "max_epochs": max_epochs,
                    "envs": 1,
                    "learners": 0,
                    "cpus_per_env": 0.5,
                    "driver_cpus": 0.5,
                    "learner_cpus": 0.5,
                    "episodes_per_env": 1,
                    "env": {"batch_size": 512},
                },
            }
        )
    )


@pytest.mark.expensive
def test_ctrl_c_early_and_late_then_a_kill_salvaged_completes_every_trial_once(
    ray_local, tmp_path, capsys, monkeypatch
):
    """Early: stopped before Tune recorded a trial (exit 130; its --resume died with KeyError: 'trial' before).
    Late: Ctrl-C after a PPO trial reported round 2 of 3 (exit 130 and the resume command; it exited 0 with a
    final-looking report before). Then the folder is altered as a kill -9 leaves it, and --resume --salvage
    completes: every trial once, every round once. (A plain resume after a stop mid-round: the SIGTERM test.)"""
    import os
    import signal

    from ray import tune

    from esper_ray.experiments.runner import TrialEvents

    experiment = tmp_path / "stop.yaml"
    write_stop_experiment(experiment, "stop", rounds=3, max_epochs=2)
    out = tmp_path / "run"
    command = ["ab", str(experiment), "--output", str(out)]

    def stopped_early(self):
        raise KeyboardInterrupt  # what a Ctrl-C while Tune sets up raises

    with monkeypatch.context() as patch:
        patch.setattr(tune.Tuner, "fit", stopped_early)
        with pytest.raises(SystemExit) as exit_info:
            main(command)
    assert exit_info.value.code == 130 and "--resume" in capsys.readouterr().err
    assert (out / "experiment.json").is_file() and (out / "tune").is_dir()
    with pytest.raises(SystemExit) as exit_info:  # a plain re-run is refused; the message says --resume
        main(command)
    assert exit_info.value.code == 2 and "add --resume" in capsys.readouterr().err

    on_result = TrialEvents.on_trial_result

    def ctrl_c_at_round_2(self, iteration, trials, trial, result, **info):
        on_result(self, iteration, trials, trial, result, **info)
        if result.get("round/round") == 2:
            os.kill(os.getpid(), signal.SIGINT)  # Tune's handler is installed: it stops the run cleanly

    with monkeypatch.context() as patch:
        patch.setattr(TrialEvents, "on_trial_result", ctrl_c_at_round_2)
        assert main([*command, "--resume"]) == 130
    err = capsys.readouterr().err
    assert "interrupted with" in err and f"--output {out} --resume" in err
    interrupted = json.loads((out / "results.json").read_text())
    assert [t["status"] for t in interrupted["trials"] if t["arm"] == "ppo"] == ["incomplete"]

    # then Tune's folder changes after its manifest, as a kill -9 leaves it (a state file Tune wrote later):
    # --resume refuses it; --resume --salvage keeps what finished and continues the PPO trial from its checkpoint
    from esper_ray.experiments.results import collect_trials

    before = {(t.arm, t.seed): t for t in collect_trials(out).trials}
    state = sorted((out / "tune").glob("experiment_state-*.json"))[-1]
    (out / "tune" / "basic-variant-state-2099-01-01_00-00-00.json").write_text(state.read_text())
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--resume"])
    assert exit_info.value.code == 2 and "--salvage" in capsys.readouterr().err
    assert main([*command, "--resume", "--salvage"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"continued from their last intact checkpoints: ppo/seed0 from round [12]\b", printed), printed
    results = json.loads((out / "results.json").read_text())
    assert sorted((t["arm"], t["seed"], t["status"]) for t in results["trials"]) == [
        ("none", 0, "finished"),
        ("ppo", 0, "finished"),
    ]
    [ppo] = [t for t in results["trials"] if t["arm"] == "ppo"]
    assert [r["round"] for r in ppo["history"]] == [1.0, 2.0, 3.0]  # each round once, across the two folders
    assert ppo["ran_in"] == ["tune_salvaged_1", "tune"]
    report = (out / "report.md").read_text()
    assert re.search(r"\| \d \| ppo \| 0 \| ppo \| finished \| [0-9.]+ \| 3 \| tune_salvaged_1, tune \|", report), (
        report
    )
    rerun = {m.group(1): p for p in (out / "tune").iterdir() if (m := TRIAL_DIR_RE.match(p.name))}
    assert set(rerun) == {arm for (arm, _), t in before.items() if t.status != FINISHED}
    continued = [json.loads(line)["round/round"] for line in (rerun["ppo"] / "result.json").read_text().splitlines()]
    assert continued[-1] == 3 and continued[0] > 1  # it went on from its checkpoint: round 1 was not trained again
    after = {(t.arm, t.seed): t for t in collect_trials(out).trials}
    for key, t in before.items():  # what had finished is the same record, not run again
        if t.status == FINISHED:
            assert after[key].started_at == t.started_at and after[key].evaluation == t.evaluation


def _process_group(process) -> int | None:
    """`process`'s process group; None once it has ended."""
    import os

    try:
        return os.getpgid(process.pid)
    except ProcessLookupError:
        return None


@pytest.mark.expensive
def test_sigterm_to_the_command_and_its_process_group_mid_round_stops_cleanly_and_resume_finishes(ray_local, tmp_path):
    """SIGTERM to every process of the command's process group while its PPO trial trains, as `timeout -s TERM`
    sends it (to the command, then to its whole group) and as `kill -TERM -PGID` or a shell's `kill %1` do. Ray's
    GCS and raylet were in that group: they shut down, the trials failed (`OSError: Broken pipe`), and 60 s later
    the driver's core worker ended the process (exit 1, "Failed to connect to GCS") before its `finally` wrote
    tune_files.json, so `--resume` refused the run. Now Ray's processes start in sessions of their own: the signal
    reaches the command alone and stops it as one Ctrl-C does (143, the resume command); the resume finishes."""
    import os
    import signal
    import time

    import psutil

    from esper_ray.experiments.runner import TUNE_MANIFEST

    experiment = tmp_path / "term.yaml"
    write_stop_experiment(experiment, "term", rounds=2, max_epochs=40)
    out = tmp_path / "run"
    command = ["ab", str(experiment), "--output", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "esper_ray.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )  # its own process group, as `timeout` gives the command
    lines, ray_processes = [], []
    try:
        for line in proc.stdout:  # round 2 (seconds long) has begun once round 1's line is printed
            lines.append(line)
            if "ppo/seed0 round 1/2" in line:
                ray_processes = psutil.Process(proc.pid).children(recursive=True)
                grouped = [p.cmdline()[:1] for p in ray_processes if _process_group(p) == proc.pid]
                os.killpg(proc.pid, signal.SIGTERM)
                sent = time.monotonic()
                break
        assert ray_processes, "".join(lines)[-3000:]
        rest, _ = proc.communicate(timeout=300)
        stopped_after = time.monotonic() - sent
        printed = "".join(lines) + rest
        assert proc.returncode == 143, printed[-3000:]
        assert re.search(r"esper-ray ab: terminated \(SIGTERM\) with [01] of 2 trials done", printed), printed[-3000:]
        assert f"--output {out} --resume" in printed and "Traceback" not in printed and "Unhandled error" not in printed
        assert stopped_after < 45, stopped_after  # the core worker's exit came 60 s after the signal
        assert (out / TUNE_MANIFEST).is_file()
        assert grouped == [], grouped  # the group's signal reached the command alone
        _, alive = psutil.wait_procs(ray_processes, timeout=30)  # its Ray ended with it, out of its group or not
        assert not alive, [p.name() for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
        for process in ray_processes:  # started by this test's command: never left behind, whatever failed above
            if process.is_running():
                process.kill()

    assert main([*command, "--resume"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert sorted((t["arm"], t["status"]) for t in results["trials"]) == [("none", "finished"), ("ppo", "finished")]
    [ppo] = [t for t in results["trials"] if t["arm"] == "ppo"]
    assert [r["round"] for r in ppo["history"]] == [1.0, 2.0]  # round 2 trained again from round 1's checkpoint, once


@pytest.mark.parametrize("text, expected", [("garbage", "not valid JSON"), ('{"experiment": 3}', "not the record")])
def test_report_of_a_damaged_experiment_record_is_one_line_naming_it(tmp_path, capsys, text, expected):
    (tmp_path / "experiment.json").write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and f"{tmp_path / 'experiment.json'}: {expected}" in err and "\n" not in err


# ------------------------------------------------------------------------------- runs too short to keep a seed
def test_an_experiment_too_short_to_keep_a_seed_names_each_arm_and_the_minimum_once():
    """12 epochs: no seed can be kept (15 at the soonest); 16 epochs: any seed can, but not at the standard tempo
    the fixed plan and the heuristic plant at (17); no growth plants nothing and is never named."""
    arms = {
        "ppo": {},
        "heuristic": {"controller": "heuristic"},
        "none": {"controller": "none"},
        "heavy": {"controller": "fixed", "fixed": {"blueprint": "conv_heavy", "slot": "r0c1"}},
    }
    short = ExperimentSpec.from_mapping({**BASE, "arms": arms, "training": {"max_epochs": 12}})
    [line] = short.short_run_warnings()
    assert (
        line.startswith("arm ppo, arm heuristic, arm heavy: no seed can be kept in a run of max_epochs=12")
        and ">= 15" in line
    )
    assert sum("no seed at tempo standard" in w for w in short.short_run_warnings()) == 0  # one line: any seed
    [standard] = ExperimentSpec.from_mapping(
        {**BASE, "arms": arms, "training": {"max_epochs": 16}}
    ).short_run_warnings()
    assert standard.startswith(
        "arm heuristic, arm heavy: no seed at tempo standard can be kept in a run of max_epochs=16"
    )
    assert (
        ExperimentSpec.from_mapping({**BASE, "arms": arms, "training": {"max_epochs": 17}}).short_run_warnings() == []
    )


def test_the_ab_command_warns_before_ray_starts_when_its_runs_are_too_short(tmp_path, monkeypatch, capsys):
    import esper_ray.experiments.runner as runner

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(runner, "run_experiment", stop)
    experiment = tmp_path / "e.yaml"
    experiment.write_text(json.dumps({**BASE, "arms": {"ppo": {}, "none": {"controller": "none"}}}))
    with pytest.raises(Stop):
        main(["ab", str(experiment), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "esper-ray ab: warning: arm ppo: no seed can be kept in a run of max_epochs=3" in err


def test_the_train_command_warns_when_its_runs_are_too_short_to_keep_a_seed(tmp_path, monkeypatch, capsys):
    import esper_ray.train.commands.runner as runner

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(runner, "run_training", stop)
    with pytest.raises(Stop):
        main(["train", "--max-epochs", "12", "--output", str(tmp_path / "run")])
    assert "esper-ray train: warning: no seed can be kept in a run of max_epochs=12" in capsys.readouterr().err
    with pytest.raises(Stop):
        main(["train", "--max-epochs", "12", "--env", "min_training_epochs=7", "--output", str(tmp_path / "run2")])
    assert "warning" not in capsys.readouterr().err


def test_the_report_says_which_fixed_plans_were_never_planted_or_never_kept(tmp_path):
    """A fixed arm whose evaluation episodes planted nothing (a run too short for its tempo) is reported as not
    planted, one whose seed was planted and dropped as not kept; the report's header repeats the run's warning."""
    spec = ExperimentSpec.from_mapping(
        {
            **BASE,
            "training": {"max_epochs": 16},
            "arms": {"ppo": {}, "heavy": {"controller": "fixed", "fixed": {"blueprint": "conv_heavy", "slot": "r0c1"}}},
        }
    )
    trials = []
    for arm in ("ppo", "heavy"):
        for seed in spec.seeds:
            germinated = 1.0 if arm == "ppo" or seed == 2 else 0.0
            evaluation = {
                **{c: 0.0 for c in COMPUTE_COLUMNS},
                "episodes": 4.0,
                "test_accuracy": 0.5 + 0.01 * seed,
                "test_accuracy_std": 0.0,
                "test_accuracy_per_param": 1.0,
                "val_accuracy": 0.5,
                "val_accuracy_per_param": 1.0,
                "params_added": 0.0,
                "host_params": 160.0,
                "germinated": germinated,
                "fossilized": 1.0 if arm == "ppo" else 0.0,
                "test_accuracy_with_probation": 0.5,
                "params_on_probation": 0.0,
            }
            trials.append(TrialResult(arm, seed, len(trials), spec.controller(arm), FINISHED, evaluation=evaluation))
    write_report(tmp_path, ExperimentRecord(spec, 5, False, trials, "exp.yaml"))
    text = (tmp_path / "report.md").read_text()
    assert "- heavy (fixed(conv_heavy@r0c1)): its plan was not planted on seed(s) 0, 1 (no evaluation episode" in text
    assert "- heavy (fixed(conv_heavy@r0c1)): its plan was not kept on seed(s) 2 (planted, and never fossilized" in text
    assert (
        "ppo (" not in text.split("## What the host runs kept")[1].split("##")[0].split("|---|")[-1]
    )  # ppo kept its seeds
    assert (
        "**Too short to keep a seed:** arm heavy: no seed at tempo standard can be kept in a run of max_epochs=16"
        in text
    )


def test_report_of_a_run_with_no_finished_trial_says_so_in_one_line_and_how_to_continue(tmp_path, capsys):
    """`report` on a controllers.yaml run stopped before any trial finished wrote a report of n=0 and "n/a"
    throughout (issue 74): it says there is nothing to report yet and gives the command that continues the run."""
    smoke = ExperimentSpec.from_yaml(REPO / "tune_configs" / "smoke.yaml")
    order = [{"position": i, "arm": t.arm, "seed": t.seed} for i, t in enumerate(smoke.trials())]
    (tmp_path / "experiment.json").write_text(
        json.dumps(
            {
                "experiment": smoke.to_dict(),
                "source": "tune_configs/smoke.yaml",
                "order_seed": 11,
                "order_seed_drawn": False,
                "start_order": order,
            }
        )
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"no trial has finished yet ({len(order)} planned)" in err
    assert f"esper-ray ab tune_configs/smoke.yaml --resume --output {tmp_path}" in err
    assert not (tmp_path / "report.md").exists()
