"""The captured train step's bookkeeping (warm-up, re-capture when seeds change, accumulators that outlive
epochs, the eager last batch) gives the same per-step losses as the eager loop. On the CPU a stand-in replays
the captured step object as a CUDA graph would replay its captured kernels; benchmarks/graph_check.py compares
real CUDA graphs with eager on a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from esper_ray.contracts.actions import AlphaCurve, AlphaSpeed, Blueprint, Op, Style, encode_joint
from esper_ray.contracts.stages import Stage
from esper_ray.env import MorphogeneticEnv, train_step
from esper_ray.env.train_step import Accumulators, Precision, StepGraphs, TrainStep
from esper_ray.morpho.transformer_blueprints import AttentionSeed, FlexAttentionSeed, runs_in_cuda_graphs
from esper_ray.policy.baselines import wait_action
from tests.morpho_helpers import drive_to, give_healthy_gradients, make_model

TEXT = {"task": "text", "text_max_bytes": 8_000, "batch_size": 16, "max_epochs": 8}
"""7 batches of 16 sequences per epoch: the step is captured from the second batch on (the last runs eagerly)."""


class ReplayedOnCpu:
    """Captures the step object, its telemetry and static input buffers; replay copies the batch in, runs that step
    with that telemetry and hands its norms on, as CapturedStep does."""

    def __init__(self, step: TrainStep, x: torch.Tensor, y: torch.Tensor, on_grads=None, fuse: bool = True) -> None:
        self.key, self.step, self.on_grads, self.fuse = step.key(), step, on_grads, fuse
        self.static_x, self.static_y = torch.empty_like(x), torch.empty_like(y)

    def replay(self, x: torch.Tensor, y: torch.Tensor, on_grads=None) -> None:
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        self.step(self.static_x, self.static_y, on_grads=self.on_grads, fuse=self.fuse)
        if on_grads is not None and self.on_grads is not None:
            on_grads.take(self.on_grads)


def episode_losses(captured: bool) -> tuple[list[float], int]:
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 14, "num_shards": 2, "device": "cpu", "batch_size": 48})
    if captured:
        env.graphs = StepGraphs(enabled=True, capture=ReplayedOnCpu)
    env.reset(seed=4)
    losses = []
    for epoch in range(14):
        action = wait_action()
        if epoch == 1:  # a seed joins the step: the captured step must be replaced
            action[0], action[1] = encode_joint(Op.GERMINATE, 1), int(Blueprint.CONV_LIGHT)
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

        def __init__(self, step: TrainStep, x: torch.Tensor, y: torch.Tensor, **kwargs) -> None:
            super().__init__(step, x, y, **kwargs)
            if NeverRecaptured.first is not None:
                self.step = NeverRecaptured.first.step  # keep replaying the first capture
            NeverRecaptured.first = NeverRecaptured.first or self

    env = MorphogeneticEnv({"task": "digits", "max_epochs": 14, "num_shards": 2, "device": "cpu", "batch_size": 48})
    env.graphs = StepGraphs(enabled=True, capture=NeverRecaptured)
    env.reset(seed=4)
    losses = []
    for epoch in range(14):
        action = wait_action()
        if epoch == 1:
            action[0], action[1] = encode_joint(Op.GERMINATE, 1), int(Blueprint.CONV_LIGHT)
        _, _, _, _, info = env.step(action)
        losses += [info["train_loss"], info["val_loss"]]
    assert losses != episode_losses(captured=False)[0]


def _key(model) -> tuple:
    optimizer = model.__dict__.setdefault("_test_host_optimizer", torch.optim.SGD(model.host.parameters(), lr=0.1))
    return TrainStep(model, optimizer, Precision(), 1.0, Accumulators(torch.device("cpu"))).key()


def test_a_step_is_recaptured_exactly_when_its_code_path_changes():
    """The key of a captured step changes when a seed starts or stops running, leaves TRAINING, or stops being
    trained (a prune's ramp-down); stages that run the same step (dormant, germinated, the cool-down after a
    prune; blending, holding, fossilized) share one key."""
    keys = {}
    for stage in (Stage.DORMANT, Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED):
        model = make_model(["r0c1"], auto_forward=False)  # the same host and seed init each time
        if stage is not Stage.DORMANT:
            drive_to(model.slot("r0c1"), stage)
        keys[stage] = [
            part for part in _key(model)[0][0] if not isinstance(part, torch.nn.Module | torch.optim.Optimizer)
        ]
    assert keys[Stage.GERMINATED] == keys[Stage.DORMANT]
    assert keys[Stage.BLENDING] == keys[Stage.HOLDING] == keys[Stage.FOSSILIZED]
    assert len({repr(keys[s]) for s in (Stage.DORMANT, Stage.TRAINING, Stage.BLENDING)}) == 3

    model = make_model(["r0c1"], auto_forward=False)
    slot = model.slot("r0c1")
    drive_to(slot, Stage.BLENDING)
    blending = _key(model)
    for _ in range(slot.tempo_epochs):
        slot.step_epoch()
    assert slot.advance() and slot.stage is Stage.HOLDING
    assert _key(model) == blending  # the same seed, optimizer and branch: the captured graph stays
    slot.metrics.age = slot.cfg.min_prune_age
    assert slot.prune(AlphaSpeed.SLOW, AlphaCurve.LINEAR)  # alpha ramps down: the seed still runs, untrained
    assert _key(model) != blending
    while slot.stage is not Stage.DORMANT:
        slot.step_epoch()
        if slot.stage in (Stage.PRUNED, Stage.EMBARGOED, Stage.RESETTING):
            assert _key(model)[0] == ((slot.slot_id,),), slot.stage  # no seed runs: the host's own step


def germinate_action(blueprint: Blueprint) -> np.ndarray:
    action = wait_action()
    action[0], action[1] = encode_joint(Op.GERMINATE, 0), int(blueprint)
    return action


def text_episode_with_a_seed(env: MorphogeneticEnv, blueprint: Blueprint) -> tuple[list[int], list[float]]:
    """The host alone for an epoch, then a seed of `blueprint` in r0c0 through 2 epochs of TRAINING and 2 of
    BLENDING. Returns the env's capture count after each epoch, and every train and validation loss."""
    env.reset(seed=0)
    slot = env.model.slot("r0c0")
    captures, losses = [], []

    def step(action) -> None:
        _, _, _, _, info = env.step(action)
        captures.append(env.graphs.captures)
        losses.extend([info["train_loss"], info["val_loss"]])

    step(wait_action())
    step(germinate_action(blueprint))  # GERMINATED: the seed does not run yet; TRAINING from the epoch's end
    assert slot.stage is Stage.TRAINING and slot.blueprint is blueprint
    for _ in range(2):
        step(wait_action())
    slot.metrics.epochs_in_stage = slot.cfg.min_training_epochs  # G2's wait and gradient check are not under test here
    give_healthy_gradients(slot)
    assert slot.advance() and slot.stage is Stage.BLENDING
    for _ in range(2):
        step(wait_action())
    assert (
        slot.stage in (Stage.BLENDING, Stage.HOLDING) and slot.is_active and float(slot.alpha_value) > 0
    )  # blended in
    return captures, losses


@pytest.fixture
def one_torch_thread():
    """As in an env runner given one CPU (train/rllib/env_factory.py): two threads on a busy 2-core machine ran these
    text epochs 7x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("eager_only", [False, True])
def test_a_step_in_which_an_uncapturable_seed_runs_is_never_captured(monkeypatch, one_torch_thread, eager_only):
    """A flex_attention seed on its eager path cannot run in a CUDA graph (runs_in_cuda_graphs), and has no CPU
    backward: the attention seed stands in for it on the CPU, once marked uncapturable (and once not, to show
    captures happen)."""
    if eager_only:
        monkeypatch.setattr(train_step, "runs_in_cuda_graphs", lambda seed: not isinstance(seed, AttentionSeed))
    env = MorphogeneticEnv({**TEXT, "device": "cpu"})
    env.graphs = StepGraphs(enabled=True, capture=ReplayedOnCpu)
    captures, losses = text_episode_with_a_seed(env, Blueprint.ATTENTION)
    assert captures[:2] == [1, 2]  # the host alone was captured: a full batch, then (after its warm-up) the last
    if eager_only:
        assert captures[-1] == 2  # nothing more while the seed ran
    else:
        assert captures[-1] == 6  # TRAINING, then BLENDING, each a full batch and the last
    assert all(math.isfinite(v) for v in losses)


def test_only_a_compiled_flex_attention_seed_runs_in_cuda_graphs():
    """The seed's compiled path (a GPU, heads of 16 or more) captures; its eager one (a CPU, narrow heads) cannot."""
    cuda = torch.device("cuda")  # only compared with: no GPU needed
    wide, narrow = FlexAttentionSeed(64), FlexAttentionSeed(32)  # 4 heads of 16; 4 heads of 8
    assert wide.compiles(cuda) and not narrow.compiles(cuda)
    assert not wide.compiles(torch.device("cpu"))
    assert not runs_in_cuda_graphs(wide)  # its parameters are on the CPU
    assert runs_in_cuda_graphs(AttentionSeed(32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (benchmarks/gpu_check.sh runs this)")
def test_a_flex_attention_seed_s_captured_text_episode_trains_what_the_eager_one_does():
    """Uncompiled, the seed's step raised "Cannot copy between CPU and CUDA tensors during CUDA graph capture" and
    every such episode was lost; compiled (the text tasks' heads are 16 wide), its steps are captured as the attention
    seed's are, and compute the eager steps' losses."""
    runs = {}
    for graphs in (True, False):
        env = MorphogeneticEnv({**TEXT, "device": "cuda", "cuda_graphs": graphs})
        assert env.graphs.enabled is graphs
        runs[graphs] = text_episode_with_a_seed(env, Blueprint.FLEX_ATTENTION)
        assert env.model.slot("r0c0").seed.compiles(torch.device("cuda"))
    captures, losses = runs[True]
    assert captures[:2] == [1, 2] and captures[-1] == 6  # the host alone, then the seed in TRAINING and BLENDING
    eager_losses = runs[False][1]
    assert all(math.isfinite(v) for v in losses) and len(losses) == len(eager_losses)
    assert losses == pytest.approx(eager_losses, rel=1e-3)  # the same kernels, in the same order, on the same data


def _gated_seed_steps(fused: bool, start_momentum: bool) -> list[torch.Tensor]:
    """A conv_light seed blended by a learned gate, trained through TRAINING (the gate gets no gradient: alpha is 0)
    into BLENDING (now it does), with the fused SGD kernel the env uses on CUDA or the foreach one (CPU)."""
    model = make_model(["r0c1"], auto_forward=False)
    slot = model.slots["r0c1"]
    drive_to(slot, Stage.TRAINING, style=Style.GATED_GATE)
    slot.optimizer = torch.optim.SGD(slot.seed_parameters(), lr=0.05, momentum=0.9, fused=fused)
    host_optimizer = torch.optim.SGD(model.host.parameters(), lr=0.05, momentum=0.9, fused=fused)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 8, 8, generator=generator), torch.randint(0, 10, (16,), generator=generator)
    original = train_step.start_momentum_of_new_grads
    if not start_momentum:
        train_step.start_momentum_of_new_grads = lambda optimizer: None
    try:
        for stage in (Stage.TRAINING, Stage.BLENDING):
            if stage is Stage.BLENDING:
                drive_from_training_to_blending(slot)
            step = TrainStep(model, host_optimizer, Precision(), 1.0, Accumulators(torch.device("cpu")))
            for _ in range(3):
                step(x, y)
    finally:
        train_step.start_momentum_of_new_grads = original
    return [p.detach().clone() for p in slot.seed_parameters()]


def drive_from_training_to_blending(slot) -> None:
    for _ in range(slot.cfg.min_training_epochs):
        slot.step_epoch()
    give_healthy_gradients(slot)
    assert slot.advance() and slot.stage is Stage.BLENDING
    slot.step_epoch()  # alpha > 0: the gate is in the forward pass


def test_a_gate_that_first_gets_gradients_when_blending_steps_with_the_fused_optimizer():
    # The A/B of issue 30 on H200s lost 1-5 env steps a round to this: the fused kernel takes a group's momentum
    # buffers as all new or all there, and the gate's arrive after the seed's.
    with pytest.raises(TypeError, match="NoneType"):
        _gated_seed_steps(fused=True, start_momentum=False)
    fused = _gated_seed_steps(fused=True, start_momentum=True)
    foreach = _gated_seed_steps(fused=False, start_momentum=False)  # torch's own path, which starts buffers itself
    assert len(fused) == len(foreach) > 0
    for a, b in zip(fused, foreach):
        torch.testing.assert_close(a, b)
