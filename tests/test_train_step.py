"""The captured train step's bookkeeping (warm-up, re-capture when seeds change, accumulators that outlive
epochs, the eager last batch) gives the same per-step losses as the eager loop. On the CPU a stand-in replays
the captured step object as a CUDA graph would replay its captured kernels; benchmarks/graph_check.py compares
real CUDA graphs with eager on a GPU."""

from __future__ import annotations

import torch

from esper_ray.contracts.actions import Blueprint, Op, encode_joint
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.train_step import StepGraphs, TrainStep
from esper_ray.policy.baselines import wait_action


class ReplayedOnCpu:
    """Captures the step object and static input buffers; replay copies the batch in and runs that step."""

    def __init__(self, step: TrainStep, x: torch.Tensor, y: torch.Tensor) -> None:
        self.key, self.step = step.key(), step
        self.static_x, self.static_y = torch.empty_like(x), torch.empty_like(y)

    def replay(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        self.step(self.static_x, self.static_y)


def episode_losses(captured: bool) -> tuple[list[float], int]:
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 14, "num_shards": 2, "device": "cpu", "batch_size": 48})
    if captured:
        env.graphs = StepGraphs(enabled=True, capture=ReplayedOnCpu)
    env.reset(seed=4)
    losses = []
    for epoch in range(14):
        action = wait_action(3)
        if epoch == 1:  # a seed joins the step: the captured step must be replaced
            action[0], action[1] = encode_joint(Op.GERMINATE, 1, 3), int(Blueprint.CONV_LIGHT)
        _, _, _, _, info = env.step(action)
        losses += [info["train_loss"], info["val_loss"]]
    return losses, env.graphs.captures


def test_captured_steps_train_exactly_what_the_eager_loop_trains():
    eager, _ = episode_losses(captured=False)
    replayed, captures = episode_losses(captured=True)
    assert replayed == eager
    assert captures >= 3  # the host alone, the seed in TRAINING, then BLENDING (a new code path in the slot)


def test_a_stale_captured_step_would_be_caught():
    """The comparison above can fail: replaying a step captured before the seed joined trains a different model."""

    class NeverRecaptured(ReplayedOnCpu):
        first: ReplayedOnCpu | None = None

        def __init__(self, step: TrainStep, x: torch.Tensor, y: torch.Tensor) -> None:
            super().__init__(step, x, y)
            if NeverRecaptured.first is not None:
                self.step = NeverRecaptured.first.step  # keep replaying the first capture
            NeverRecaptured.first = NeverRecaptured.first or self

    env = MorphogeneticEnv({"task": "digits", "max_epochs": 14, "num_shards": 2, "device": "cpu", "batch_size": 48})
    env.graphs = StepGraphs(enabled=True, capture=NeverRecaptured)
    env.reset(seed=4)
    losses = []
    for epoch in range(14):
        action = wait_action(3)
        if epoch == 1:
            action[0], action[1] = encode_joint(Op.GERMINATE, 1, 3), int(Blueprint.CONV_LIGHT)
        _, _, _, _, info = env.step(action)
        losses += [info["train_loss"], info["val_loss"]]
    assert losses != episode_losses(captured=False)[0]
