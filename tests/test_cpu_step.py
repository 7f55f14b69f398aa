"""The CPU path of the training step (esper_ray/morpho/cpu_step.py) trains the episode the plain step trains: the
same data order, batches, decisions and stages, and the same losses to float rounding (its kernels sum in another
order: a 1x1 convolution as a matrix product, SGD's fused kernel). No speed is asserted (benchmarks/env_step.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from esper_ray.contracts.actions import Blueprint, Op, Style, Tempo
from esper_ray.contracts.stages import Stage
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.masks import allows
from esper_ray.morpho import cpu_step
from esper_ray.policy.baselines import lifecycle_action, wait_action

CONFIG = {
    "task": "digits-impaired",
    "num_shards": 2,
    "max_epochs": 14,
    "min_training_epochs": 2,
    "min_prune_age": 2,
    "device": "cpu",
    "seed": 3,
}
# The first seed gated (a gate module with its own parameters, blended by alpha), fossilized; the second pruned at the
# last step (the host trains its last epoch without it). Not later: a host that loses a blended seed swings for a few
# epochs (validation loss by 0.3 from one epoch to the next), and there rounding differences grow as fast as anything.
FOSSILIZED, PRUNED = (0, Blueprint.CONV_LIGHT, Style.GATED_GATE), (2, Blueprint.ATTENTION, Style.LINEAR_ADD)


def action(env: MorphogeneticEnv, mask: np.ndarray) -> np.ndarray:
    """Plant the first seed and fossilize it from HOLDING; then plant the second and prune it once allowed."""
    for index, blueprint, style in (FOSSILIZED, PRUNED):
        stage = env.model.slot(env.slot_ids[index]).stage  # type: ignore[union-attr]
        planted = env.counts[f"germinated/{blueprint.key}"] > 0
        op = {
            Stage.DORMANT: None if planted else Op.GERMINATE,
            Stage.HOLDING: Op.FOSSILIZE if index == 0 else Op.PRUNE,
            Stage.BLENDING: Op.PRUNE if index == 2 else None,
        }.get(stage)
        if op is not None and allows(mask, op, index, Tempo.FAST):
            return lifecycle_action(op, index, blueprint=blueprint, style=style, tempo=Tempo.FAST)
        if stage in (Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING) and index == 0:
            break  # one seed develops at a time
    return wait_action()


def episode(fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict], dict[str, torch.Tensor]]:
    monkeypatch.setattr(cpu_step, "ENABLED", fast)
    env = MorphogeneticEnv(CONFIG)
    obs, _ = env.reset(seed=0)
    infos = []
    for _ in range(CONFIG["max_epochs"]):
        obs, _, terminated, _, info = env.step(action(env, obs["action_mask"]))
        infos.append(info)
        if terminated:
            break
    assert env.host_optimizer.defaults["fused"] is fast  # SGD's fused kernel on the CPU path only
    return infos, {k: v.detach().clone() for k, v in env.model.state_dict().items()}  # type: ignore[union-attr]


def test_the_cpu_path_trains_the_plain_steps_episode_through_a_seeds_lifecycle(monkeypatch):
    plain, plain_weights = episode(False, monkeypatch)
    fast, fast_weights = episode(True, monkeypatch)
    assert len(plain) == len(fast) == CONFIG["max_epochs"]
    stages = [info["stages"] for info in plain]
    assert [info["stages"] for info in fast] == stages
    assert [(i["last_op"], i["action_success"]) for i in fast] == [(i["last_op"], i["action_success"]) for i in plain]
    seen = {stage for s in stages for stage in s.values()}
    assert {"TRAINING", "BLENDING", "HOLDING", "FOSSILIZED", "EMBARGOED"} <= seen, stages  # a pruned seed is embargoed
    assert plain[-1]["count/fossilized"] == plain[-1]["count/pruned"] == 1
    for key in ("train_loss", "val_loss"):
        np.testing.assert_allclose([i[key] for i in fast], [i[key] for i in plain], rtol=1e-3, err_msg=key)
    assert [i["train_correct"] for i in fast] == pytest.approx([i["train_correct"] for i in plain], abs=2)
    assert fast_weights.keys() == plain_weights.keys()
    for name, value in plain_weights.items():
        torch.testing.assert_close(fast_weights[name], value, rtol=1e-3, atol=1e-4, msg=name)
