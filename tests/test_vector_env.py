"""The vector env (esper_ray/env/vector_env.py) steps N envs as N separate envs step: the same observations, rewards,
terminations, infos and env states, through a seed's germination, fossilization and a prune, episode ends and their
autoresets, while the envs train and validate their hosts and seeds stacked (issue 77's equal-episode test).

The reference is gymnasium's SyncVectorEnv over separate MorphogeneticEnvs: what RLlib's env runner steps with
`num_envs_per_env_runner` > 1 and no vector env of ours, NEXT_STEP autoreset included.

Tolerance. A stacked epoch sums in another order than a lone env's CPU step (tests/test_stacked_hosts.py: ~1e-7 an
epoch here), and SGD carries that on: over a whole run the validation losses of the two drift apart to ~3e-5, and at a
near-tie one validation prediction of 359 flips (seen once in this run, at env 1's ninth step: reward 100 x 1/359
apart). So the two are compared twice:
- step by step from the same state (the vector env made of copies of the separate envs before each step): every
  output and the envs' states after the step at rtol 1e-4, one epoch's rounding far inside it;
- over the whole run: the decisions, stages, terminations and autoresets exactly, the losses at rtol 1e-3 and the
  correct counts within one sample, as tests/test_cpu_step.py compares two paths' episodes.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from esper_ray.contracts.actions import Blueprint, Op, Style, Tempo
from esper_ray.contracts.stages import Stage
from esper_ray.env import MorphogeneticEnv, held_stack
from esper_ray.env.masks import allows
from esper_ray.env.vector_env import VectorMorphogeneticEnv, stack_key
from esper_ray.policy.baselines import lifecycle_action, wait_action

SEED = 3
BASE = {
    "task": "digits-impaired",
    "max_epochs": 9,
    "min_training_epochs": 2,
    "min_prune_age": 2,
    "device": "cpu",
    "seed": SEED,
}
# Env 2's episodes are shorter, so it resets while the others step.
CONFIGS = [{**BASE, "shard": i, "num_shards": 3, **({"max_epochs": 5} if i == 2 else {})} for i in range(3)]
STEPS = 12  # through the first episodes' ends (step 9), their autoresets and two epochs of the next
WAIT_FIRST = 2  # epochs before any seed: every host trains stacked
PLANTED = {0: (0, Blueprint.CONV_LIGHT, Style.GATED_GATE), 1: (0, Blueprint.CONV_LIGHT, Style.GATED_GATE)}
"""Env 0 plants a gated seed in its first slot and fossilizes it; env 1 plants the same there, trains it one epoch in
the same stacked seed as env 0's, and prunes it; env 2 only waits (tests/test_stacked_hosts.py stacks other blueprints,
blends and stages side by side)."""
STACKED_EPOCHS = [11, 11, 9]
"""Every epoch trains stacked but env 2's at step 9, where envs 0 and 1 reset (each env's epochs: 12 steps less its
autoresets)."""
STACKED_SEED_EPOCHS = [6, 1, 0]
"""Env 0's seed TRAINING (step 3, with env 1's), BLENDING (4-6), HOLDING (7), FOSSILIZED (8); env 1's TRAINING once."""
STACK_BUILDS = 7
"""HeldStacks built (env/held_stack.py): at step 0; 3 (the seeds planted); 4 (env 0's seed blends, another stage
kind; env 1's pruned); 5 (env 2 resets: envs 0 and 1 alone stack); 6 (all three again); 10 (envs 0 and 1 in new
episodes, new host optimizers); 11 (env 2 resets). Held at steps 1, 2 (the seeds plant after the epoch), 7 and 8
(BLENDING -> HOLDING -> FOSSILIZED keep the seed's group; its alpha is copied in each epoch)."""
STACKED_VALIDATIONS = STACKED_EPOCHS
"""Every step's validation runs stacked where the epoch did (env/stacked_validation.py), seeds included."""
STACKED_COUNTERFACTUALS = [2, 0, 0]
"""Env 0's validations with its seed ablated (K = 2 configurations) after its alpha has left 0: BLENDING (step 6) and
HOLDING (7); fossilized, it is part of the host (not ablated)."""
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
STATE_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
# The gradient of a convolution's weight that a batch norm follows is a near-cancelling sum, whose rounding is of the
# size of the host's other gradients times ~1e-4 (tests/test_stacked_hosts.py, GRAD_TOLERANCE), and momentum adds up
# an epoch of them: seen 1.6e-4 on a block-0 momentum of 1.5e-3 where the host's largest is 0.27. So the momentum is
# compared to the host's largest.
MOMENTUM_TOLERANCE = 1e-3


def scripted_action(env: MorphogeneticEnv, index: int) -> np.ndarray:
    if index not in PLANTED or env.epoch < WAIT_FIRST:
        return wait_action()
    slot, blueprint, style = PLANTED[index]
    stage = env.model.slot(env.slot_ids[slot]).stage  # type: ignore[union-attr]
    planted = env.counts[f"germinated/{blueprint.key}"] > 0
    op = {
        Stage.DORMANT: None if planted else Op.GERMINATE,
        Stage.HOLDING: Op.FOSSILIZE if index == 0 else Op.PRUNE,
        Stage.TRAINING: Op.PRUNE if index == 1 else None,
        Stage.BLENDING: Op.PRUNE if index == 1 else None,
    }.get(stage)
    mask = env._mask()
    if op is not None and allows(mask, op, slot, Tempo.FAST):
        return lifecycle_action(op, slot, blueprint=blueprint, style=style, tempo=Tempo.FAST)
    return wait_action()


def assert_same(ours: Any, theirs: Any, where: str) -> None:
    """Equal structure; numbers at TOLERANCE, everything else equal. Phase timings are not compared."""
    if isinstance(theirs, dict):
        keys = {k for k in theirs if not k.lstrip("_").startswith("time/")}
        assert {k for k in ours if not k.lstrip("_").startswith("time/")} == keys, where
        for k in keys:
            assert_same(ours[k], theirs[k], f"{where}[{k!r}]")
        return
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, where
    if theirs.dtype.kind in "fc":
        np.testing.assert_allclose(ours, theirs, **TOLERANCE, err_msg=where)
    elif theirs.dtype.kind == "O" and all(isinstance(v, float) for v in theirs.flat if v is not None):
        np.testing.assert_allclose(ours.astype(float), theirs.astype(float), **TOLERANCE, err_msg=where)
    else:
        assert ours.tolist() == theirs.tolist(), where


def separate_envs(configs: Sequence[dict[str, Any]] = CONFIGS) -> SyncVectorEnv:
    return SyncVectorEnv([lambda c=c: MorphogeneticEnv(c) for c in configs], autoreset_mode=AutoresetMode.NEXT_STEP)


def script(envs: Any) -> np.ndarray:
    return np.stack([scripted_action(env, i) for i, env in enumerate(envs)])


def copies(separate: SyncVectorEnv) -> VectorMorphogeneticEnv:
    """A vector env of copies of the separate envs, as they stand (their autoresets due included)."""
    ours = VectorMorphogeneticEnv([lambda e=e: e for e in copy.deepcopy(separate.envs)])
    ours._autoreset_envs = separate._autoreset_envs.copy()
    return ours


def assert_same_state(ours: MorphogeneticEnv, theirs: MorphogeneticEnv, where: str) -> None:
    """The model (host, seeds, batch-norm statistics), the host's momentum, the epoch and the data generator."""
    assert ours.epoch == theirs.epoch, where
    assert torch.equal(ours.data_generator.get_state(), theirs.data_generator.get_state()), where
    mine, other = ours.model.state_dict(), theirs.model.state_dict()  # type: ignore[union-attr]
    assert mine.keys() == other.keys(), where
    for name, value in other.items():
        torch.testing.assert_close(mine[name], value, **STATE_TOLERANCE, msg=f"{where}: {name}")
    pairs = [
        (
            name,
            ours.host_optimizer.state[p].get("momentum_buffer"),
            theirs.host_optimizer.state[q].get("momentum_buffer"),
        )
        for (name, p), q in zip(ours.model.host.named_parameters(), theirs.model.host.parameters(), strict=True)  # type: ignore[union-attr]
    ]
    largest = max((b.abs().max().item() for _, _, b in pairs if b is not None), default=0.0)
    for name, a, b in pairs:
        assert (a is None) == (b is None), f"{where}: momentum of {name}"
        if b is not None:
            assert (a - b).abs().max().item() <= MOMENTUM_TOLERANCE * largest, f"{where}: momentum of {name}"


def test_the_vector_env_steps_as_separate_envs_from_the_same_state() -> None:
    separate = separate_envs()
    separate.reset(seed=0)
    stacked, seeded, validated, ablated = [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]
    for t in range(STEPS):
        ours = copies(separate)
        actions = script(separate.envs)
        theirs_out = separate.step(actions)
        ours_out = ours.step(actions)
        for k, name in enumerate(("observations", "rewards", "terminations", "truncations", "infos")):
            assert_same(ours_out[k], theirs_out[k], f"step {t} {name}")
        for i, (a, b) in enumerate(zip(ours.envs, separate.envs, strict=True)):
            assert_same_state(a, b, f"step {t} env {i}")  # type: ignore[arg-type]
        stacked = [n + m for n, m in zip(stacked, ours.stacked_epochs, strict=True)]
        seeded = [n + m for n, m in zip(seeded, ours.stacked_seed_epochs, strict=True)]
        validated = [n + m for n, m in zip(validated, ours.stacked_validations, strict=True)]
        ablated = [n + m for n, m in zip(ablated, ours.stacked_counterfactuals, strict=True)]
    # Every env's epochs trained and validated stacked, with their seeds and their counterfactual configurations, except
    # where an env was the only one to step.
    assert (stacked, seeded) == (STACKED_EPOCHS, STACKED_SEED_EPOCHS)
    assert (validated, ablated) == (STACKED_VALIDATIONS, STACKED_COUNTERFACTUALS)


@pytest.fixture
def one_torch_thread():
    """One intra-op thread, as an env process runs (train/process/threads.py). With two, a reduction's order differs
    between the stacked and the separate path, and a whole run amplifies it: on an Intel Xeon (AVX-512, torch 2.11)
    env 0's validation loss was 2e-3 apart at step 6 with two threads and 2.5e-5 at most with one (this VM: 4e-5)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_vector_run_follows_the_separate_run_through_a_seeds_lifecycle(one_torch_thread) -> None:
    separate, ours = separate_envs(), VectorMorphogeneticEnv.of_configs(CONFIGS)
    (theirs_obs, _), (ours_obs, _) = separate.reset(seed=0), ours.reset(seed=0)
    np.testing.assert_array_equal(ours_obs["features"], theirs_obs["features"])
    seen, resets = set(), 0
    for t in range(STEPS):
        actions = script(separate.envs)
        _, _, theirs_term, theirs_trunc, theirs_info = separate.step(actions)
        _, _, ours_term, ours_trunc, ours_info = ours.step(actions)
        where = f"step {t}"
        np.testing.assert_array_equal(ours_term, theirs_term, err_msg=where)
        np.testing.assert_array_equal(ours_trunc, theirs_trunc, err_msg=where)
        for key in (
            "epoch",
            "last_op",
            "action_success",
            "stages",
            "count/germinated",
            "count/fossilized",
            "count/pruned",
            "episode_seed",
        ):
            assert_same(ours_info[key], theirs_info[key], f"{where} {key}")
        for key in ("val_loss", "train_loss"):
            if key in theirs_info:
                mask = theirs_info["_" + key]
                np.testing.assert_allclose(ours_info[key][mask], theirs_info[key][mask], rtol=1e-3, err_msg=where)
        for key in ("val_correct", "train_correct"):
            if key in theirs_info:
                mask = theirs_info["_" + key]
                assert np.abs(ours_info[key][mask] - theirs_info[key][mask]).max() <= 1, (where, key)
        seen |= {stage for stages in theirs_info["stages"].values() for stage in stages if stage}
        resets += int((theirs_info["epoch"] == 0).sum())
    assert {"TRAINING", "BLENDING", "HOLDING", "FOSSILIZED", "EMBARGOED"} <= seen, seen
    assert resets >= 3  # env 2 twice, envs 0 and 1 once
    assert (ours.stacked_epochs, ours.stacked_seed_epochs) == (STACKED_EPOCHS, STACKED_SEED_EPOCHS)
    assert (ours.stacked_validations, ours.stacked_counterfactuals) == (STACKED_VALIDATIONS, STACKED_COUNTERFACTUALS)
    assert (ours.stack_builds, ours.stacked_captures) == (STACK_BUILDS, 0)  # held across epochs; no graph on a CPU


class EagerCapture(held_stack.CapturedStackedStep):
    """A captured stacked step whose capture records nothing and whose replay runs the step eagerly on its static
    inputs: everything else (its key, warm-up, static buffers, telemetry handed over as copies) is the real one's."""

    def record(self, memory: object) -> None:
        pass

    def play(self) -> None:
        self.run(False)


def test_held_stacks_replay_their_captured_steps_as_the_eager_steps_would(one_torch_thread, monkeypatch) -> None:
    """The held stacks' graph path (env/held_stack.py), a replay standing in for a CUDA graph's, gives exactly what
    the eager stacked path gives: the same steps on the same data, the full batches' and the last batch's with its
    gradient telemetry. Env 2 on shard 1 too, so that every batch, the last included, is every host's (shards 0 and 1
    are 360 samples, shard 2 359). Captures: each held stack's full batch once (STACK_BUILDS), and the last batch
    where a stack's key comes back in a later epoch: steps 1 (the host alone) and 8 (env 0's seed HOLDING, then
    FOSSILIZED: unmeasured both)."""
    configs = [*CONFIGS[:2], {**CONFIGS[2], "shard": 1}]

    def run(graphs: bool) -> tuple[list[Any], VectorMorphogeneticEnv]:
        with monkeypatch.context() as patch:
            if graphs:
                patch.setattr(held_stack, "CapturedStackedStep", EagerCapture)
                patch.setattr(VectorMorphogeneticEnv, "_memory", lambda self, env: object())
            envs = VectorMorphogeneticEnv.of_configs(configs)
            outputs = [envs.reset(seed=0)]
            for _ in range(STEPS):
                outputs.append(envs.step(script(envs.envs)))
        return outputs, envs

    (plain, eager), (replayed, held) = run(graphs=False), run(graphs=True)
    for t, (a, b) in enumerate(zip(replayed, plain, strict=True)):
        for k, (mine, theirs) in enumerate(zip(a, b, strict=True)):
            if isinstance(theirs, dict):
                mine, theirs = (
                    {key: v for key, v in d.items() if not key.lstrip("_").startswith("time/")} for d in (mine, theirs)
                )
            np.testing.assert_equal(mine, theirs, err_msg=f"step {t} output {k}")
    assert eager.stacked_captures == 0
    assert held.stack_builds == STACK_BUILDS and held.stacked_captures == STACK_BUILDS + 2


def test_an_env_with_seeds_stacks_unless_a_seed_cannot() -> None:
    """A seed in any stage stacks (stack_key is the host's alone); a prune ramping a seed down keeps the env alone."""
    env = MorphogeneticEnv(CONFIGS[0])
    env.reset(seed=0)
    key = stack_key(env)
    slot = env.model.slot(env.slot_ids[0])  # type: ignore[union-attr]
    assert slot.germinate(Blueprint.CONV_LIGHT, Style.GATED_GATE)
    slot.stage = Stage.TRAINING
    assert key is not None and stack_key(env) == key
    slot.pruning = True
    assert stack_key(env) is None


def fp16(env: MorphogeneticEnv, init_scale: float) -> MorphogeneticEnv:
    """The env in fp16 with its own GradScaler (on the CPU, where an env trains fp32 by itself: autocast and a CPU
    GradScaler behave as a GPU's)."""
    from esper_ray.env.train_step import Precision

    env.precision = Precision(dtype=torch.float16, scaler=torch.amp.GradScaler("cpu", init_scale=init_scale))
    return env


def test_fp16_envs_train_stacked_each_with_its_own_grad_scaler() -> None:
    """fp16 envs stack (stack_key apart from fp32's), each row scaled, unscaled and stepped by its own env's scaler,
    which reports the same grad_scale as the separate env's, and their losses agree within fp16's rounding. At a scale
    that never overflows here: where one overflows, CPU kernels that round differently (a 1x1 convolution alone, a
    batched product stacked) may overflow on different batches; tests/test_stacked_hosts.py tests the skip and the
    back-off on a constructed overflow."""
    configs = [{**c, "max_epochs": 9} for c in CONFIGS]
    separate = SyncVectorEnv(
        [lambda c=c: fp16(MorphogeneticEnv(c), 2.0**8) for c in configs], autoreset_mode=AutoresetMode.NEXT_STEP
    )
    ours = VectorMorphogeneticEnv([lambda c=c: fp16(MorphogeneticEnv(c), 2.0**8) for c in configs])
    separate.reset(seed=0), ours.reset(seed=0)
    fp32 = MorphogeneticEnv(configs[0])
    fp32.reset(seed=0)
    assert stack_key(ours.envs[0]) is not None and stack_key(ours.envs[0]) != stack_key(fp32)
    scales = []
    for t in range(4):
        actions = script(separate.envs)
        _, _, _, _, theirs = separate.step(actions)
        _, _, _, _, mine = ours.step(actions)
        np.testing.assert_array_equal(mine["grad_scale"], theirs["grad_scale"], err_msg=f"step {t}")
        np.testing.assert_allclose(mine["train_loss"], theirs["train_loss"], rtol=2e-2, err_msg=f"step {t}")
        scales.append(theirs["grad_scale"].tolist())
    assert scales == [[2.0**8] * 3] * 4  # never overflowed, never grown (growth_interval 2000)
    assert ours.stacked_epochs == [4, 4, 4]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device)")
@pytest.mark.parametrize("amp", ["off", "bf16", "fp16"])
def test_on_a_gpu_the_vector_env_trains_stacked_and_follows_the_separate_run(amp: str) -> None:
    """On a GPU the envs train stacked too (fp32 and bf16 full batches from the held stacks' CUDA graphs, fp16 eager
    with each env's GradScaler) and make the separate envs' decisions and stages; the training losses agree at rtol
    1e-3 in fp32 and 5e-2 in bf16 and fp16, whose rounding the two paths do in different kernels.

    fp32 runs without TF32 in cuDNN (on by default): a lone host's convolutions would round to TF32 where the stacked
    1x1 convolutions, batched products, do not. The validation loss is compared in fp32 only, at 2e-2: this starved
    host's eval-mode batch norm amplifies the paths' differences (on an H100 at be48dd4, with TF32 off: training losses
    within 3e-5, validation losses 5e-5 up to step 7 and 6.6e-3 at step 8; with TF32 on up to 0.23, in bf16 0.29)."""
    configs = [{**c, "device": "cuda", "amp": amp} for c in CONFIGS]
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=amp != "off"):
        separate = separate_envs(configs)
        ours = VectorMorphogeneticEnv.of_configs(configs)
        separate.reset(seed=0), ours.reset(seed=0)
        rtol = {"train_loss": 1e-3, "val_loss": 2e-2} if amp == "off" else {"train_loss": 5e-2}
        for t in range(STEPS):
            actions = script(separate.envs)
            _, _, theirs_term, _, theirs_info = separate.step(actions)
            _, _, ours_term, _, ours_info = ours.step(actions)
            np.testing.assert_array_equal(ours_term, theirs_term, err_msg=f"step {t}")
            for key in ("epoch", "last_op", "action_success", "stages"):
                assert_same(ours_info[key], theirs_info[key], f"step {t} {key}")
            for key in ("val_loss", "train_loss"):
                if key in theirs_info:
                    mask = theirs_info["_" + key]
                    np.testing.assert_array_equal(ours_info["_" + key], mask, err_msg=f"step {t} {key}")
                    if key in rtol:
                        np.testing.assert_allclose(
                            ours_info[key][mask], theirs_info[key][mask], rtol=rtol[key], err_msg=f"step {t} {key}"
                        )
    assert (ours.stacked_epochs, ours.stacked_seed_epochs) == (STACKED_EPOCHS, STACKED_SEED_EPOCHS)
    assert ours.stack_builds == STACK_BUILDS
    # A graph for each held stack's full batch (fp16's steps stay eager: its scalers read found_inf on the host).
    assert (ours.stacked_captures == STACK_BUILDS) if amp != "fp16" else ours.stacked_captures == 0
