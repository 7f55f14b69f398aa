"""The captured validation pass (env/validation_graph.py): its key, its bookkeeping and what it computes.

On the CPU a stand-in runs the captured pass's own code (the set prepared once, static alphas refilled before
each replay, static accumulators) at every replay, as a CUDA graph replays the kernels it recorded; the CUDA
test compares a real captured pass with the eager one (benchmarks/gpu_check.sh runs it)."""

from __future__ import annotations

import functools

import pytest
import torch

from esper_ray.contracts.actions import Blueprint, Op, encode_joint
from esper_ray.contracts.stages import Stage
from esper_ray.env import MorphogeneticEnv, validation_graph
from esper_ray.env.epoch import read_val_stats, validate_fused
from esper_ray.env.train_step import Precision
from esper_ray.env.validation_graph import CapturedValidation, ValidationGraphs, capturable, validation_key
from esper_ray.morpho.counterfactual import build_plan
from esper_ray.policy.baselines import wait_action
from tests.morpho_helpers import drive_to, make_model

DIGITS = {"task": "digits", "max_epochs": 20, "num_shards": 2, "device": "cpu", "batch_size": 48}


class PassedOnCpu(CapturedValidation):
    """Records nothing; each replay runs the captured pass's code eagerly."""

    def _capture(self) -> None:
        pass

    def _launch(self) -> None:
        with torch.inference_mode():
            self._pass()


def episode_validations(capture: type | None) -> tuple[list[tuple[float, float]], list[int], list[str]]:
    """A conv_light seed germinated at epoch 2 and carried on by auto_forward; per epoch the validation accuracy
    and loss, the capture count and the seed's stage."""
    env = MorphogeneticEnv(DIGITS)
    if capture is not None:
        env.val_graphs = ValidationGraphs(enabled=True, capture=capture)
    env.reset(seed=4)
    validations, captures, stages = [], [], []
    for epoch in range(20):
        action = wait_action()
        if epoch == 1:
            action[0], action[1] = encode_joint(Op.GERMINATE, 1), int(Blueprint.CONV_LIGHT)
        _, _, _, _, info = env.step(action)
        validations.append((info["val_accuracy"], info["val_loss"]))
        captures.append(env.val_graphs.captures)
        stages.append(env.model.slot("r0c1").stage.name)
    return validations, captures, stages


@functools.cache
def eager_episode() -> tuple[list[tuple[float, float]], list[int], list[str]]:
    return episode_validations(None)


def test_the_captured_pass_validates_exactly_what_the_eager_pass_does_through_a_seeds_lifecycle():
    eager, _, stages = eager_episode()
    replayed, captures, replayed_stages = episode_validations(PassedOnCpu)
    assert replayed == eager and replayed_stages == stages
    assert "BLENDING" in stages  # the seed's alpha ramped while its graph was replayed
    assert 2 <= captures[-1] < len(captures) - 4  # the host alone, then the seed; not one capture per epoch


def test_a_pass_that_kept_its_captured_alphas_would_be_caught():
    """The comparison above can fail: a graph replayed without refilling its alphas scores the blend as it was
    at capture time while the seed's alpha ramps."""

    class AlphasNotRefilled(PassedOnCpu):
        def replay(self, alphas: torch.Tensor):
            self._launch()
            return read_val_stats(self.correct, self.loss_sum, self.y.numel())

    stale, _, _ = episode_validations(AlphasNotRefilled)
    assert stale != eager_episode()[0]


def test_a_pass_is_recaptured_when_what_it_reads_changes_and_not_when_alphas_move():
    model = make_model(["r0c1"], auto_forward=False)
    host_alone = validation_key(model, build_plan(model).alphas, Precision(), 256)
    slot = model.slot("r0c1")
    drive_to(slot, Stage.BLENDING)
    slot.step_epoch()  # alpha leaves 0
    blending = build_plan(model)
    assert blending.names == ("main", "off:r0c1")
    key = validation_key(model, blending.alphas, Precision(), 256)
    assert key != host_alone  # a seed runs, and two configurations part at its slot
    slot.step_epoch()  # alpha moves on
    moved = build_plan(model).alphas
    assert not torch.equal(moved, blending.alphas) and validation_key(model, moved, Precision(), 256) == key
    assert validation_key(model, moved, Precision(torch.bfloat16), 256) != key
    assert validation_key(model, moved, Precision(), 512) != key
    assert validation_key(model, moved[:1], Precision(), 256) != key  # one configuration only
    assert capturable(model)


def test_a_pass_in_which_an_uncapturable_seed_runs_stays_eager(monkeypatch):
    """flex_attention's seed on its eager path cannot run in a CUDA graph; conv_light stands in for it on the CPU."""
    monkeypatch.setattr(validation_graph, "runs_in_cuda_graphs", lambda seed: False)
    model = make_model(["r0c1"], auto_forward=False)
    assert capturable(model)  # dormant: the host alone
    drive_to(model.slot("r0c1"), Stage.BLENDING)
    assert not capturable(model)
    graphs = ValidationGraphs(enabled=True, capture=PassedOnCpu)
    x, y = torch.zeros(64, 1, 8, 8), torch.zeros(64, dtype=torch.int64)
    for _ in range(3):
        graphs.validate(model, x, y, build_plan(model).alphas, chunk=32, prepare=lambda t: t, precision=Precision())
    assert graphs.captures == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (benchmarks/gpu_check.sh runs this)")
@pytest.mark.parametrize(
    ("task", "blueprint"),
    [("synthetic", Blueprint.CONV_LIGHT), ("text", Blueprint.ATTENTION), ("text", Blueprint.FLEX_ATTENTION)],
)
def test_a_captured_pass_on_cuda_matches_the_eager_pass(task, blueprint):
    """A seed germinated at once blends from epoch 3 (min_training_epochs 1): by epoch 8 the pass
    that validates `main` and `off:r0c0` has been captured and replayed with moving alphas."""
    config = {
        "task": task,
        "max_epochs": 10,
        "device": "cuda",
        "cuda_graphs": True,
        "graph_validation": True,
        "min_training_epochs": 1,
        "synthetic_size": 4_000,
        "text_max_bytes": 20_000,
    }
    env = MorphogeneticEnv(config)
    assert env.val_graphs.enabled
    env.reset(seed=0)
    for epoch in range(8):
        action = wait_action()
        if epoch == 0:
            action[0], action[1] = encode_joint(Op.GERMINATE, 0), int(blueprint)
        env.step(action)
    plan = build_plan(env.model)
    assert len(plan.names) == 2 and env.val_graphs.captures >= 2, (plan.names, env.val_graphs.captures)
    with torch.cuda.stream(env.stream):
        graphed = env._validate(plan)
        eager = validate_fused(
            env.model,
            env.val_x,
            env.val_y,
            plan.alphas,
            chunk=env.cfg.effective_val_batch_size,
            prepare=env._prepare_eval,
            precision=env.precision,
        )
    torch.cuda.synchronize()
    assert env.val_graphs.captured is not None and env.val_graphs.captured.key.configurations == 2
    for k in range(len(plan.names)):
        assert abs(graphed.accuracy(k) - eager.accuracy(k)) <= 2e-3
        assert graphed.loss(k) == pytest.approx(eager.loss(k), rel=1e-4)
