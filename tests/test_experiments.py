"""A/B experiments: experiment files, the random start order, and the smoke run on a local Ray."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from esper_ray.cli import main
from esper_ray.experiments.spec import ExperimentSpec, start_order

REPO = Path(__file__).resolve().parents[1]
BASE = {"name": "t", "arms": {"a": {"reward_mode": "shaped"}, "b": {"reward_mode": "sparse", "lr": 1e-3}},
        "seeds": [0, 1, 2], "rounds": 2, "last_rounds": 1, "training": {"max_epochs": 3, "env": {"batch_size": 256}}}


def test_every_arm_gets_the_same_seeds_and_its_own_overrides():
    spec = ExperimentSpec.from_mapping(BASE)
    trials = spec.trials()
    assert [(t.arm, t.seed) for t in trials] == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    b0 = next(t for t in trials if t.name == "b_seed0")
    assert b0.train["reward_mode"] == "sparse" and b0.train["lr"] == 1e-3 and b0.train["rounds"] == 2
    assert b0.train["env"] == {"batch_size": 256} and b0.train["seed"] == 0


def test_start_order_is_a_reproducible_permutation_that_depends_on_the_order_seed():
    trials = ExperimentSpec.from_mapping({**BASE, "seeds": list(range(6))}).trials()
    first, again, other = start_order(trials, 1), start_order(trials, 1), start_order(trials, 2)
    names = sorted(t.name for t in trials)
    assert sorted(t.name for t in first) == names and len(first) == len(trials)
    assert [t.name for t in first] == [t.name for t in again]
    assert [t.name for t in first] != [t.name for t in other]


@pytest.mark.parametrize("change, match", [
    ({"colour": 1}, r"unknown experiment key\(s\) \['colour'\]"),
    ({"metric": "episode_return"}, "metric='episode_return'.*is never compared"),
    ({"arms": {"a": {"reward_mode": "shaped"}}}, "at least 2 arms"),
    ({"seeds": [1, 1]}, "no repeats"),
    ({"training": {"seed": 3}}, r"\['seed'\] are set by the experiment"),
    ({"arms": {"a": {"reward_mode": "shaped"}, "b": {"reward_mode": "nope"}}}, "reward_mode='nope'"),
    ({"arms": {"a": {"reward_mode": "shaped"}, "b": {"max_epoch": 3}}}, r"unknown training setting\(s\) \['max_epoch'\]"),
])
def test_bad_experiment_files_fail_before_anything_runs(change, match):
    with pytest.raises(ValueError, match=match):
        ExperimentSpec.from_mapping({**BASE, **change})


@pytest.mark.parametrize("path", sorted((REPO / "tune_configs").glob("*.yaml")))
def test_shipped_experiment_files_are_valid(path):
    spec = ExperimentSpec.from_yaml(path)
    assert len(spec.arms) >= 2 and spec.seeds


@pytest.mark.expensive
def test_smoke_experiment_writes_every_report_file_with_finite_values(ray_local, tmp_path, capsys):
    out = tmp_path / "smoke"
    assert main(["ab", str(REPO / "tune_configs" / "smoke.yaml"), "--output", str(out)]) == 0
    for name in ["results.json", "report.md", "metric_by_arm.png", "learning_curves.png", "experiment.json"]:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    trials = results["trials"]
    assert len(trials) == 4 and sorted(t["start_position"] for t in trials) == [0, 1, 2, 3]
    assert [(t["arm"], t["seed"]) for t in sorted(trials, key=lambda t: t["start_position"])] == [
        (o["arm"], o["seed"]) for o in json.loads((out / "experiment.json").read_text())["start_order"]]
    for t in trials:
        assert t["status"] == "finished" and math.isfinite(t["final_metric"]) and 0 <= t["final_metric"] <= 1
        assert t["history"] and all(math.isfinite(v) for v in t["history"][0].values())
    by_seed = {(t["arm"], t["seed"]): t["final_metric"] for t in trials}
    # same seed, same host and data, and the same untrained policy in round 1: the arms match exactly
    assert by_seed[("shaped", 0)] == by_seed[("simplified", 0)]
    stats = results["statistics"]
    assert [a["n"] for a in stats["arms"]] == [2, 2] and all(math.isfinite(a["mean"]) for a in stats["arms"])
    assert "fewer than 3 runs" in " ".join(stats["pairs"][0]["notes"]) and stats["verdicts"]
    assert "## Verdict" in (out / "report.md").read_text()

    capsys.readouterr()
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0  # rebuilds the report from the run folder
    assert (out / "report.md").is_file() and "# A/B experiment `smoke`" in capsys.readouterr().out

    assert main(["ab", str(REPO / "tune_configs" / "smoke.yaml"), "--output", str(out), "--resume"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert [t["history"] for t in again["trials"]] == [t["history"] for t in trials]  # nothing re-ran


def test_ab_refuses_to_overwrite_a_run(tmp_path, capsys):
    (tmp_path / "tune").mkdir()
    with pytest.raises(SystemExit):
        main(["ab", str(REPO / "tune_configs" / "smoke.yaml"), "--output", str(tmp_path)])
    assert "already holds a run: add --resume" in capsys.readouterr().err
