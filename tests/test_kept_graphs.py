"""Captured steps and validation passes are kept by key: when the model comes back to a structure it had, in the
same episode or the next (the env keeps its host's tensors across episodes), its graph is replayed again instead of
warmed up and captured anew, and what is trained and validated stays what the eager loop trains and validates. On
the CPU, through the stand-ins of test_train_step.py and test_validation_graph.py."""

from __future__ import annotations

import torch

from esper_ray.contracts.actions import Blueprint, Op, encode_joint
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.train_step import KEPT_STEPS, StepGraphs
from esper_ray.env.validation_graph import ValidationGraphs
from esper_ray.policy.baselines import wait_action
from tests.test_train_step import ReplayedOnCpu
from tests.test_validation_graph import PassedOnCpu

DIGITS = {"task": "digits", "max_epochs": 9, "num_shards": 2, "device": "cpu", "batch_size": 48}


def episode(captured: bool) -> tuple[list[float], list[int], list[int]]:
    """A conv_light seed germinated at epoch 1 (TRAINING from epoch 2) and pruned at once before epoch 5, so the
    host trains alone again. Per epoch: the train and validation losses and accuracies; after each epoch the step's
    and the pass's capture counts."""
    env = MorphogeneticEnv(DIGITS)
    if captured:
        env.graphs = StepGraphs(enabled=True, capture=ReplayedOnCpu)
        env.val_graphs = ValidationGraphs(enabled=True, capture=PassedOnCpu)
    env.reset(seed=4)
    values, step_captures, pass_captures = [], [], []
    for epoch in range(9):
        action = wait_action()
        if epoch == 1:
            action[0], action[1] = encode_joint(Op.GERMINATE, 1), int(Blueprint.CONV_LIGHT)
        if epoch == 5:
            env.model.slot("r0c1").prune(force=True)  # the governor's instant prune: no ramp-down
        _, _, _, _, info = env.step(action)
        values += [info["train_loss"], info["val_loss"], info["val_accuracy"]]
        step_captures.append(env.graphs.captures)
        pass_captures.append(env.val_graphs.captures)
    assert env.model.slot("r0c1").seed is None
    return values, step_captures, pass_captures


def test_after_a_prune_the_host_alone_replays_the_graphs_kept_from_the_episodes_start():
    eager, _, _ = episode(captured=False)
    replayed, steps, passes = episode(captured=True)
    assert replayed == eager
    assert steps[:5] == [1, 2, 3, 4, 4]  # the host alone's full batch, its last; the seed in TRAINING's two
    assert steps[-1] == steps[4]  # the host alone again: its kept step, no new capture
    assert passes[-1] == passes[4] >= 2  # and its kept pass


def steps(env: MorphogeneticEnv, seed: int, epochs: int, germinate_at: int | None = None) -> list[float]:
    """reset(seed), then `epochs` steps (a conv_light seed germinated in r0c1 at `germinate_at`): the initial
    observation, and every step's observation, reward and losses."""
    obs, _ = env.reset(seed=seed)
    trace = [*obs["features"].tolist()]
    for epoch in range(epochs):
        action = wait_action()
        if epoch == germinate_at:
            action[0], action[1] = encode_joint(Op.GERMINATE, 1), int(Blueprint.CONV_LIGHT)
        obs, reward, _, _, info = env.step(action)
        trace += [*obs["features"].tolist(), reward, info["train_loss"], info["val_loss"]]
    return trace


def test_a_later_episode_trains_what_a_new_envs_first_episode_trains_from_the_same_seed():
    """The env keeps its host's tensors and host optimizer across episodes (so the host alone's graphs carry over):
    the new episode's initial values are copied in and the momentum zeroed, and nothing of the last episode leaks."""
    used = MorphogeneticEnv(DIGITS)
    steps(used, seed=1, epochs=5, germinate_at=1)
    host, pointers = used.model.host, [t.data_ptr() for t in used.model.host.state_dict().values()]
    assert any(len(state) for state in used.host_optimizer.state.values())  # momentum to leak, were it not zeroed
    again = steps(used, seed=3, epochs=4, germinate_at=2)
    assert used.model.host is host and [t.data_ptr() for t in host.state_dict().values()] == pointers
    assert again == steps(MorphogeneticEnv(DIGITS), seed=3, epochs=4, germinate_at=2)


def test_the_host_alones_graphs_carry_over_into_the_next_episode():
    def two_episodes(captured: bool) -> tuple[list[float], MorphogeneticEnv]:
        env = MorphogeneticEnv(DIGITS)
        if captured:
            env.graphs = StepGraphs(enabled=True, capture=ReplayedOnCpu)
            env.val_graphs = ValidationGraphs(enabled=True, capture=PassedOnCpu)
        return steps(env, seed=1, epochs=3) + steps(env, seed=2, epochs=3), env

    eager, _ = two_episodes(captured=False)
    replayed, env = two_episodes(captured=True)
    assert replayed == eager
    # captured in the first episode (the step's full and last batch, the pass), replayed in both
    assert (env.graphs.captures, env.val_graphs.captures) == (2, 1)


def test_graphs_beyond_the_kept_number_are_dropped_least_recently_replayed_first():
    graphs = StepGraphs(enabled=True, capture=Recorded)
    for key in range(KEPT_STEPS + 2):
        for _ in range(3):  # the warm-up steps, then a capture
            graphs.run(FakeStep(key), torch.zeros(1), torch.zeros(1))
    graphs.run(FakeStep(1), torch.zeros(1), torch.zeros(1))  # 1 is kept no more: warmed up again
    assert graphs.captures == KEPT_STEPS + 2
    graphs.run(FakeStep(KEPT_STEPS + 1), torch.zeros(1), torch.zeros(1))  # the last one captured: replayed
    assert graphs.captures == KEPT_STEPS + 2
    assert list(graphs.kept) == list(range(2, KEPT_STEPS + 2))


class FakeStep:
    """A step with a key and nothing else."""

    def __init__(self, key: int) -> None:
        self._key = key

    def key(self) -> int:
        return self._key

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        pass


class Recorded:
    def __init__(self, step: FakeStep, x: torch.Tensor, y: torch.Tensor) -> None:
        self.key = step.key()

    def replay(self, x: torch.Tensor, y: torch.Tensor) -> None:
        pass
