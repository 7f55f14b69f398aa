"""MorphogeneticEnv: gymnasium API, config validation, masks, episode end, governor rollback, reproducibility, test
split."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from esper_ray.cli import parse_env_overrides
from esper_ray.contracts.actions import (
    BLUEPRINT_NONE_INDEX,
    MAX_SLOTS,
    AlphaTarget,
    Blueprint,
    Op,
    Style,
    Tempo,
    encode_joint,
)
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.env import ENV_ID, MorphogeneticEnv
from esper_ray.env.masks import head_offsets
from esper_ray.env.observation import feature_size
from esper_ray.env.precision import resolve_amp


def wait() -> np.ndarray:
    return np.array([0, 0, Style.SIGMOID_ADD, Tempo.STANDARD, AlphaTarget.FULL, 0, 0])


def germinate(env: MorphogeneticEnv, slot: str, blueprint: Blueprint = Blueprint.CONV_LIGHT) -> np.ndarray:
    action = wait()
    action[0] = encode_joint(Op.GERMINATE, env.slot_ids.index(slot))
    action[1] = blueprint
    return action


def test_gymnasium_env_checker_passes():
    env = gym.make(
        ENV_ID, config={"task": "digits", "max_epochs": 4, "num_shards": 4}, disable_env_checker=True
    ).unwrapped
    check_env(env, skip_render_check=True)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"max_epoch": 5}, r"unknown env_config key\(s\) \['max_epoch'\]; valid keys: .*'max_epochs'"),
        ({"max_epochs": 0}, "max_epochs=0: must be an integer >= 1"),
        ({"task": "mnist"}, r"task='mnist': unknown; choose one of \['digits'"),
        ({"amp": "fp8"}, "amp='fp8'"),
        (
            {"reward_mode": "sparse", "reward_family": "loss"},
            "reward_family='loss' works only with reward_mode='shaped'",
        ),
        ({"reward_mode": "greedy"}, "reward_mode='greedy': unknown"),
        ({"slots": ["r0c9"]}, "slot 'r0c9' does not exist"),
        ({"shard": 3, "num_shards": 3}, "shard=3: must be < num_shards=3"),
        ({"host_lr": -1.0}, "host_lr=-1.0: must be a number > 0"),
        ({"max_seeds": -1}, "max_seeds=-1: must be an integer >= 0"),
    ],
)
def test_bad_config_names_the_key_and_what_is_allowed(bad, match):
    with pytest.raises(ValueError, match=match):
        MorphogeneticEnv(bad)


def test_each_env_owns_its_reward_config():
    config = {"reward_mode": "escrow", "max_epochs": 3}
    a, b = MorphogeneticEnv(config), MorphogeneticEnv(config)
    assert a.reward_config == b.reward_config and a.reward_config is not b.reward_config


def test_random_legal_policy_for_200_steps_never_trips_the_mask_check():
    env = MorphogeneticEnv(
        {"task": "digits", "max_epochs": 25, "num_shards": 6, "auto_forward": False, "slots": ["r0c0", "r0c1", "r1c0"]}
    )
    env.action_space.seed(0)
    obs, _ = env.reset(seed=1)
    ops_seen = set()
    for _ in range(200):
        assert env.observation_space.contains(obs)
        action = env.action_space.sample()  # mask-aware sampling
        obs, reward, terminated, truncated, info = env.step(action)
        ops_seen.add(info["last_op"])
        assert np.isfinite(reward)
        if terminated or truncated:
            obs, _ = env.reset()
    assert {"WAIT", "GERMINATE", "ADVANCE", "PRUNE"} <= ops_seen


def test_max_seeds_0_masks_germination_so_a_random_controller_keeps_the_host_alone():
    """max_seeds=0: GERMINATE is never legal, so a controller that picks uniformly among the legal actions (every
    other op too, where legal) grows nothing; with the default max_seeds the same controller grows."""
    grew = {}
    for max_seeds in (0, None):
        env = MorphogeneticEnv({"task": "digits", "max_epochs": 8, "num_shards": 6, "max_seeds": max_seeds})
        env.action_space.seed(0)
        obs, _ = env.reset(seed=1)
        germinate = [encode_joint(Op.GERMINATE, i) for i in range(len(env.slot_ids))]
        legal, seed_epochs = 0, 0
        for _ in range(16):
            legal += int(obs["action_mask"][head_offsets()["op_slot"]][germinate].sum())
            obs, _, terminated, _, info = env.step(env.action_space.sample())
            seed_epochs += info["seed_params"] > 0
            if terminated:
                obs, _ = env.reset()
        grew[max_seeds] = (legal, seed_epochs)
    assert grew[0] == (0, 0) and grew[None][0] > 0 and grew[None][1] > 0, grew


def test_a_masked_action_raises_and_names_the_op():
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 5, "num_shards": 6})
    env.reset(seed=0)
    fossilize = wait()
    fossilize[0] = encode_joint(Op.FOSSILIZE, 1)
    with pytest.raises(ValueError, match="masked action: FOSSILIZE on slot r0c1"):
        env.step(fossilize)
    bad_blueprint = germinate(env, "r0c0", Blueprint.LORA)
    with pytest.raises(ValueError, match="head blueprint=8 is not legal for GERMINATE"):
        env.step(bad_blueprint)


def test_mask_allows_exactly_the_legal_op_slot_pairs():
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 30, "num_shards": 6, "auto_forward": True})
    obs, _ = env.reset(seed=0)
    joint = obs["action_mask"][head_offsets()["op_slot"]]
    assert np.flatnonzero(joint).tolist() == [0, 1, 2, 3]  # WAIT, GERMINATE on each empty slot
    obs, *_ = env.step(germinate(env, "r0c1"))
    joint = obs["action_mask"][head_offsets()["op_slot"]]
    assert np.flatnonzero(joint).tolist() == [0]  # a TRAINING seed blocks germination; ADVANCE is auto
    assert obs["features"].shape == (feature_size(),) and obs["blueprint_ids"].tolist() == [
        BLUEPRINT_NONE_INDEX,
        int(Blueprint.CONV_LIGHT),
    ] + [BLUEPRINT_NONE_INDEX] * (MAX_SLOTS - 2)


@pytest.mark.parametrize("min_prune_age", [5, 8])
def test_prune_is_masked_until_the_seed_reaches_min_prune_age(min_prune_age):
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 12, "num_shards": 6, "min_prune_age": min_prune_age})
    obs, _ = env.reset(seed=0)
    prune = encode_joint(Op.PRUNE, env.slot_ids.index("r0c1"))
    obs, *_ = env.step(germinate(env, "r0c1"))
    prunable = []
    for _ in range(1, 10):  # ages 1-9: in TRAINING throughout (10 epochs)
        prunable.append(bool(obs["action_mask"][head_offsets()["op_slot"]][prune]))
        obs, *_ = env.step(wait())
    assert prunable.index(True) + 1 == min_prune_age  # ages 1..min_prune_age-1 masked, then legal


def test_the_run_ends_terminated_at_max_epochs_and_reports_real_counts():
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 3, "num_shards": 4, "shard": 1})
    env.reset(seed=0)
    results = [env.step(wait()) for _ in range(3)]
    # the host run is over: terminated (nothing follows, no bootstrap), never truncated by the env itself
    assert [r[2:4] for r in results] == [(False, False), (False, False), (True, False)]
    info = results[-1][4]
    assert info["val_total"] == 359 and 0.0 <= info["val_accuracy"] <= 1.0
    assert info["train_total"] == len(env.shard) == 270  # shard 1 of 4 of the 1,079 training images


def test_the_test_split_reaches_no_observation_reward_or_info():
    # deterministic cuDNN: on a GPU, two envs then train bit-identically, so any difference comes from the test split
    config = {"task": "digits", "max_epochs": 4, "num_shards": 4, "cudnn_deterministic": True}
    clean, poisoned = MorphogeneticEnv(config), MorphogeneticEnv(config)
    object.__setattr__(poisoned.data, "test_x", torch.full_like(poisoned.data.test_x, 255))
    object.__setattr__(poisoned.data, "test_y", torch.zeros_like(poisoned.data.test_y))
    traces = []
    for env in (clean, poisoned):
        obs, info = env.reset(seed=1)
        trace = [obs["features"], info["val_accuracy"]]
        for t in range(4):
            obs, reward, _, _, info = env.step(germinate(env, "r0c1") if t == 0 else wait())
            trace += [obs["features"], reward, info["val_accuracy"], info["val_loss"]]
        traces.append(trace)
    assert all(np.array_equal(x, y) for x, y in zip(*traces))
    test = clean.measure_test()
    assert 0 < test.accuracy <= 1 and np.isfinite(test.loss) and poisoned.measure_test().accuracy != test.accuracy


def test_info_carries_accuracies_counts_params_stages_rewards_and_phase_times():
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 4, "num_shards": 3})
    env.reset(seed=0)
    _, reward, _, _, info = env.step(germinate(env, "r0c0"))
    assert 0 <= info["train_accuracy"] <= 1 and 0 <= info["val_accuracy"] <= 1
    assert info["train_total"] == len(env.shard) and info["train_correct"] <= info["train_total"]
    assert info["train_batches"] == -(-len(env.shard) // env.cfg.effective_batch_size)
    assert info["seed_params"] == 592 and info["total_params"] == info["host_params"] + 592
    assert info["stages"] == {"r0c0": "TRAINING", "r0c1": "DORMANT", "r0c2": "DORMANT"}
    components = {k: v for k, v in info.items() if k.startswith("reward/")}
    assert components and sum(components.values()) == pytest.approx(reward)
    assert {"time/decision", "time/train", "time/val", "time/lifecycle", "time/reward"} <= set(info)


def test_same_seed_gives_same_host_init_and_data_order_in_every_reward_mode():
    a = MorphogeneticEnv({"task": "digits", "reward_mode": "shaped", "max_epochs": 3, "seed": 7, "num_shards": 3})
    b = MorphogeneticEnv({"task": "digits", "reward_mode": "sparse", "max_epochs": 3, "seed": 7, "num_shards": 3})
    c = MorphogeneticEnv({"task": "digits", "reward_mode": "shaped", "max_epochs": 3, "seed": 8, "num_shards": 3})
    for env in (a, b, c):
        env.reset()
    for (name, pa), pb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.model.parameters(), c.model.parameters()))
    orders = [torch.randperm(100, generator=env.data_generator, device=env.device).tolist() for env in (a, b, c)]
    assert orders[0] == orders[1] != orders[2]  # the same batches in the same order


def test_observations_and_rewards_reproduce_on_cpu_for_a_fixed_seed():
    runs = []
    for _ in range(2):
        env = MorphogeneticEnv({"task": "digits", "max_epochs": 6, "num_shards": 4, "device": "cpu"})
        obs, _ = env.reset(seed=3)
        trace = [obs["features"].copy()]
        for t in range(6):
            obs, reward, *_ = env.step(germinate(env, "r0c2") if t == 0 else wait())
            trace += [obs["features"].copy(), np.float32(reward)]
        runs.append(trace)
    assert all(np.array_equal(x, y) for x, y in zip(*runs))


def test_nan_in_the_host_rolls_back_to_the_snapshot_and_ends_the_episode():
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 12, "num_shards": 3})
    env.reset(seed=0)
    taken, snapshot_of = {}, env.governor.snapshot

    def record(model, epoch):  # the host's weights as each snapshot is taken
        snapshot_of(model, epoch)
        taken[epoch] = {k: v.detach().to("cpu", copy=True) for k, v in model.host.state_dict().items()}

    env.governor.snapshot = record
    for _ in range(6):  # a snapshot is taken at epoch 5
        _, _, terminated, _, _ = env.step(wait())
        assert not terminated
    env.step(germinate(env, "r0c0"))
    assert env.governor.snapshot_epoch == 5
    snapshot = taken[5]
    with torch.no_grad():
        env.model.host.blocks[0].conv.weight[0, 0, 0, 0] = float("nan")  # poisons the loss of every batch
    obs, reward, terminated, truncated, info = env.step(wait())
    assert terminated and not truncated and info["rollback"] == "nan" and reward == -10.0
    restored = env.model.host.state_dict()
    assert all(torch.equal(restored[k].cpu(), v) for k, v in snapshot.items())  # snapshots live on the CPU
    assert info["stages"]["r0c0"] == "PRUNED" and np.isfinite(obs["features"]).all()


def test_env_runs_with_fp16_scaler_only_on_cuda():
    with pytest.warns(UserWarning, match="amp=fp16 applies on CUDA only"):
        env = MorphogeneticEnv({"amp": "fp16", "device": "cpu", "max_epochs": 2, "num_shards": 6})
    env.reset(seed=0)
    _, _, _, _, info = env.step(wait())
    assert env.precision.scaler is None and "grad_scale" not in info  # CPU runs in fp32


def test_the_default_precision_is_fp32_on_a_cpu_without_a_warning(recwarn):
    env = MorphogeneticEnv({"device": "cpu", "max_epochs": 2})
    assert env.cfg.amp == "auto" and env.precision.dtype is None and env.precision.scaler is None
    assert not [w for w in recwarn if "amp=" in str(w.message)]


def test_amp_off_from_yaml_means_fp32():
    """`--env amp=off` and `amp: off` in a YAML file arrive as False (YAML's boolean)."""
    overrides = parse_env_overrides(["amp=off"])
    assert overrides == {"amp": False}
    assert EnvConfig.from_mapping(overrides).amp == "off"
    assert resolve_amp("off", torch.device("cuda")) == resolve_amp("fp32", torch.device("cuda")) == "fp32"
    assert resolve_amp("bf16", torch.device("cpu")) == "fp32"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU default (benchmarks/gpu_check.sh runs this)")
def test_the_default_precision_is_bf16_on_cuda_and_off_still_means_fp32():
    assert MorphogeneticEnv({"device": "cuda", "max_epochs": 2}).precision.dtype is torch.bfloat16
    assert MorphogeneticEnv({"device": "cuda", "max_epochs": 2, "amp": "off"}).precision.dtype is None


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="channels-last matters to cuDNN only (benchmarks/gpu_check.sh)"
)
def test_on_cuda_every_conv_weight_of_host_and_new_seeds_is_channels_last():
    env = MorphogeneticEnv(
        {"task": "synthetic", "synthetic_size": 1_000, "slots": ["r0c1"], "max_epochs": 3, "device": "cuda"}
    )
    env.reset(seed=0)
    env.step(germinate(env, "r0c1", Blueprint.CONV_HEAVY))
    weights = [(name, p) for name, p in env.model.named_parameters() if p.dim() == 4]
    assert any(name.startswith("slots.r0c1.seed") for name, _ in weights)
    for name, p in weights:
        assert p.is_contiguous(memory_format=torch.channels_last), name
