"""How each PPO arm of an A/B run splits its envs into env runners (TrainConfig.envs_per_runner,
contracts/envs_split.py): decided once, when the run starts, and recorded in experiment.json (SPLIT_KEY), so that a
resume, results.json and kept controllers give every trial the split it ran with.

`ab --envs-per-runner` overrides every arm's setting. Under `auto` a trial's cores are its share of the cluster's
CPUs: the CPUs over the PPO trials that run at once, as many as fit with one env a runner (concurrency.py),
capped by max_concurrent_trials and by the experiment's PPO trials (baseline trials, which only evaluate, are not
counted). A split trial asks for fewer CPUs, so more may then fit at once: the share assumed is an upper bound,
and auto never splits a trial whose envs that share would have run one per core.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from esper_ray.contracts.controllers import ControllerKind
from esper_ray.contracts.envs_split import AUTO, auto_envs_per_runner, check_envs_per_runner, split_line
from esper_ray.experiments.concurrency import fits_at_once
from esper_ray.experiments.spec import ExperimentSpec

SPLIT_KEY = "envs_per_runner"
"""experiment.json and results.json: {arm: envs_per_runner} of every PPO arm, as its trials ran."""


def ppo_arms(spec: ExperimentSpec) -> list[str]:
    return [arm for arm in spec.arms if spec.controller(arm) is ControllerKind.PPO]


def with_split(spec: ExperimentSpec, split: Mapping[str, int]) -> ExperimentSpec:
    """`spec` with each arm of `split` set to its envs_per_runner (the others as they are)."""
    arms = {
        arm: {**settings, "envs_per_runner": split[arm]} if arm in split else settings
        for arm, settings in spec.arms.items()
    }
    return dataclasses.replace(spec, arms=arms)


def recorded_split(record: Mapping[str, Any], spec: ExperimentSpec) -> dict[str, int]:
    """The split a run recorded; a run started before `auto` ran every arm left to it with one env a runner."""
    if SPLIT_KEY in record:
        return {str(arm): int(n) for arm, n in record[SPLIT_KEY].items()}
    return {arm: 1 for arm in ppo_arms(spec) if spec.arm_setting(arm, "envs_per_runner") == AUTO}


def check_override(spec: ExperimentSpec, value: int | str) -> None:
    """ab --envs-per-runner: 'auto' or a positive integer that divides every PPO arm's envs."""
    for arm in ppo_arms(spec):
        try:
            check_envs_per_runner(value, int(spec.arm_setting(arm, "envs")))
        except ValueError as err:
            raise ValueError(f"--envs-per-runner (arms.{arm}): {err}") from None


def decide_split(
    spec: ExperimentSpec,
    have: Mapping[str, float],
    unsplit_needs: Mapping[str, Mapping[str, float]],
    override: int | str | None = None,
) -> dict[str, tuple[int, str | None]]:
    """{PPO arm: (envs_per_runner, why auto chose it, or None)}. `have`: the cluster's resources; `unsplit_needs`:
    what one trial of each PPO arm asks for with one env a runner; `override`: ab --envs-per-runner."""
    arms = ppo_arms(spec)
    cpus = have.get("CPU", 0.0)
    if override is not None:
        check_override(spec, override)
    out: dict[str, tuple[int, str | None]] = {}
    for arm in arms:
        value = override if override is not None else spec.arm_setting(arm, "envs_per_runner")
        envs = int(spec.arm_setting(arm, "envs"))
        if value != AUTO:  # the file's, checked when it was read
            out[arm] = (int(value), None)
            continue
        if float(spec.arm_setting(arm, "gpus_per_env")) > 0:
            out[arm] = (auto_envs_per_runner(envs, cpus, on_gpu=True), "auto: envs on GPUs")
            continue
        trials = len(arms) * len(spec.seeds)
        at_once = max(1, min(fits_at_once(unsplit_needs[arm], have), spec.max_concurrent_trials or trials, trials))
        share = cpus / at_once
        at_once_text = f"{at_once} trials at once" if at_once > 1 else "1 trial at a time"
        why = f"auto: {share:.2g} CPU cores a trial, {at_once_text} on {cpus:g}"
        out[arm] = (auto_envs_per_runner(envs, share, on_gpu=False), why)
    return out


def split_lines(spec: ExperimentSpec, decided: Mapping[str, tuple[int, str | None]]) -> list[str]:
    """A line per PPO arm whose envs are split (none where every arm runs one env a runner)."""
    return [
        f"{arm}: {split_line(int(spec.arm_setting(arm, 'envs')), n, why)}" for arm, (n, why) in decided.items() if n > 1
    ]
