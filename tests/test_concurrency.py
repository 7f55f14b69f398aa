"""Trials at once come from the cluster's resources (experiments/concurrency.py): constructed clusters of N CPUs
and G GPUs against what the shipped experiment files' trials ask for."""

from __future__ import annotations

import pytest

from esper_ray.experiments.concurrency import describe, fits_at_once, requests_by_kind
from esper_ray.experiments.runner import arm_resources, needs_cpu_fallback
from esper_ray.experiments.spec import ExperimentSpec


def test_fits_at_once_is_set_by_the_scarcest_resource():
    need = {"CPU": 2.5, "GPU": 0.25}
    assert fits_at_once(need, {"CPU": 16, "GPU": 1}) == 4  # the GPU limits
    assert fits_at_once(need, {"CPU": 64, "GPU": 4}) == 16
    assert fits_at_once(need, {"CPU": 8, "GPU": 4}) == 3  # the CPUs limit
    assert fits_at_once(need, {"CPU": 64}) == 0  # no GPU: none fits
    assert fits_at_once({"CPU": 0.5}, {"CPU": 2, "GPU": 8}) == 4  # a CPU trial ignores GPUs
    with pytest.raises(ValueError, match="must ask for some resource"):
        fits_at_once({"CPU": 0.0}, {"CPU": 2})


@pytest.mark.parametrize("cpus, gpus, ppo_at_once", [(16, 1, 4), (32, 2, 8), (64, 4, 16), (128, 8, 32)])
def test_the_text_experiment_fills_one_two_four_or_eight_gpus_unchanged(cpus, gpus, ppo_at_once):
    spec = ExperimentSpec.from_yaml("tune_configs/text.yaml")
    assert spec.max_concurrent_trials is None  # the file does not size itself for a machine
    have = {"CPU": float(cpus), "GPU": float(gpus)}
    needs = arm_resources(spec)
    assert fits_at_once(needs["ppo"], have) == ppo_at_once
    assert fits_at_once(needs["none"], have) >= ppo_at_once  # a baseline trial asks for less


def test_the_cnn_experiment_on_two_cores_runs_one_ppo_trial_beside_a_baseline():
    spec = ExperimentSpec.from_yaml("tune_configs/controllers.yaml")
    have = {"CPU": 2.0}
    needs = arm_resources(spec)
    ppo, baseline = needs["ppo"], needs["none"]
    assert fits_at_once(ppo, have) == 1 and ppo["CPU"] + baseline["CPU"] <= 2.0
    assert fits_at_once(ppo, {"CPU": 32.0}) == 21


def test_the_line_names_each_kind_of_trial_and_the_cap():
    line = describe(
        {"ppo": {"CPU": 2.5, "GPU": 0.25}, "baseline": {"CPU": 0.5, "GPU": 0.0625}},
        {"CPU": 64.0, "GPU": 4.0, "memory": 1e11},
        cap=None,
    )
    assert line == (
        "trials at once on 64 CPU, 4 GPU: 16 ppo trials at once (2.5 CPU, 0.25 GPU each); "
        "64 baseline trials at once (0.5 CPU, 0.0625 GPU each); no cap (max_concurrent_trials not set)"
    )
    assert describe({"ppo": {"CPU": 1.5}}, {"CPU": 2.0}, cap=1).endswith("capped at 1 by max_concurrent_trials")
    assert describe({"ppo": {"CPU": 1.5}}, {"CPU": 2.0}, cap=None).startswith(
        "trials at once on 2 CPU: 1 ppo trial at once"
    )


def test_arms_of_one_kind_that_ask_differently_are_listed_apart():
    kinds = {"ppo": "ppo", "ppo_big": "ppo", "ppo_same": "ppo", "none": "baseline"}
    small, big = {"CPU": 1.5}, {"CPU": 4.5}
    requests = requests_by_kind(kinds, {"ppo": small, "ppo_big": big, "ppo_same": small, "none": {"CPU": 0.5}})
    assert requests == {"ppo (ppo, ppo_same)": small, "ppo (ppo_big)": big, "baseline": {"CPU": 0.5}}
    assert requests_by_kind({"a": "ppo", "b": "ppo"}, {"a": small, "b": small}) == {"ppo": small}


@pytest.mark.parametrize(
    "have, local, on_cpus",
    [
        ({"CPU": 2.0}, True, True),  # a laptop: the GPU file's trials go on its CPUs
        ({"CPU": 32.0, "GPU": 2.0}, True, False),  # a GPU machine: as the file says
        ({"CPU": 2.0}, False, False),  # a cluster joined with --address may still add GPU nodes
    ],
)
def test_a_gpu_experiment_runs_on_the_cpus_only_where_a_local_machine_has_no_gpu(have, local, on_cpus):
    spec = ExperimentSpec.from_yaml("tune_configs/text.yaml")
    assert spec.asks_for_gpus and needs_cpu_fallback(spec, have, local) is on_cpus
    cnn = ExperimentSpec.from_yaml("tune_configs/controllers.yaml")  # asks for no GPU: nothing to change
    assert not cnn.asks_for_gpus and not needs_cpu_fallback(cnn, have, local)


def test_on_cpus_takes_out_every_gpu_setting_and_nothing_else():
    spec = ExperimentSpec.from_mapping(
        {
            "name": "g",
            "seeds": [0, 1],
            "rounds": 2,
            "arms": {
                "ppo": {
                    "controller": "ppo",
                    "learner_gpus": 0.5,
                    "learners": 1,
                    "env": {"device": "cuda:1", "amp": "bf16"},
                },
                "none": {"controller": "none", "gpus_per_env": 0.25},
            },
            "training": {
                "task": "text",
                "envs": 4,
                "gpus_per_env": 0.0625,
                "mps": True,
                "cpus_per_env": 0.5,
                "env": {"host_preset": "text-starved", "device": "cuda"},
            },
        }
    )
    cpu = spec.on_cpus()
    assert spec.asks_for_gpus and not cpu.asks_for_gpus
    for trial in cpu.trials():
        assert not {"gpus_per_env", "learner_gpus", "mps"} & set(trial.train) and "device" not in trial.train["env"]
        assert (
            trial.train["envs"] == 4
            and trial.train["cpus_per_env"] == 0.5
            and trial.train["env"]["host_preset"] == "text-starved"
        )
    assert cpu.arms["ppo"]["env"] == {"amp": "bf16"} and cpu.arms["ppo"]["learners"] == 1
    needs = arm_resources(cpu)
    assert all("GPU" not in need or need["GPU"] == 0 for need in needs.values())
    assert (
        spec.training["gpus_per_env"] == 0.0625 and spec.arms["ppo"]["env"]["device"] == "cuda:1"
    )  # the original is untouched
