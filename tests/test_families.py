"""Families (contracts/families.py): an env with `family` set draws one member per episode, reproducibly per seed and
every member in turn, and trains that member's host on that member's data; bad members are refused naming the field."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import tests.family_parts  # noqa: F401  registers test-family
from esper_ray.cli import main
from esper_ray.contracts.actions import MAX_SLOTS
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.families import Member, family, family_names, register_family
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.morpho.hosts import build_host

FAMILY = "test-family"
MEMBERS = [m.name for m in family(FAMILY)]


def draws(env: MorphogeneticEnv, episodes: int, seed: int | None = None) -> list[str]:
    out = []
    for k in range(episodes):
        _, info = env.reset(seed=seed if k == 0 else None)
        out.append(info["family_member"])
    return out


def test_members_are_drawn_reproducibly_per_seed_and_each_appears_once_per_block():
    env = MorphogeneticEnv({"family": FAMILY, "device": "cpu"})
    first = draws(env, 9, seed=0)
    assert first == draws(MorphogeneticEnv({"family": FAMILY, "device": "cpu"}), 9, seed=0)
    assert first == draws(env, 9, seed=0)  # reset(seed=...) starts the sequence again
    for block in range(3):  # every member once in each block of len(members) episodes
        assert sorted(first[3 * block : 3 * block + 3]) == sorted(MEMBERS)
    others = [draws(env, 9, seed=s) for s in range(1, 6)]
    assert any(o != first for o in others)  # the order depends on the seed


def test_in_training_rounds_the_shards_together_use_every_member_and_a_round_replays():
    def round_draws(shard: int, round_: int) -> list[str]:
        env = MorphogeneticEnv({"family": FAMILY, "device": "cpu", "shard": shard, "num_shards": 2})
        env.start_round(round_)
        return [env.reset()[1]["family_member"] for _ in range(3)]

    rounds = {r: [round_draws(0, r), round_draws(1, r)] for r in (0, 1)}
    for shard0, shard1 in rounds.values():  # 2 envs x 3 episodes: each member twice in the round
        assert Counter(shard0 + shard1) == Counter({m: 2 for m in MEMBERS})
    assert round_draws(1, 1) == rounds[1][1]  # a resumed round draws as it did


def test_a_members_overrides_reach_the_host_the_data_and_the_run_length():
    env = MorphogeneticEnv({"family": FAMILY, "device": "cpu"})
    seen = {}
    for _ in range(3):
        _, info = env.reset()
        seen[info["family_member"]] = (
            env.model.host.cfg.base_channels,
            len(env.shard),
            env.cfg.max_epochs,
            env.data.name,
        )
    plain, wide, few = seen["plain"], seen["wide"], seen["few"]
    assert wide[0] == build_host("digits-impaired-wide").cfg.base_channels != plain[0]
    assert few[1] == 200 < plain[1]
    assert (plain[2], wide[2]) == (3, 4)
    # an episode runs the member's length, and its info names the member
    while env.member != "wide":
        env.reset()
    steps, done = 0, False
    while not done:
        _, _, done, _, info = env.step(np.zeros(len(env.action_space.nvec), dtype=np.int64))
        steps += 1
    assert steps == 4 and info["family_member"] == "wide"


def test_the_built_in_held_out_family_shares_no_host_with_the_training_family_and_adds_a_data_set():
    def parts(name: str) -> set[tuple[str, str]]:
        return {(cfg.task, cfg.effective_host_preset) for _, cfg in EnvConfig(family=name).members()}

    training = parts("digits-family")
    assert len(EnvConfig(family="digits-family").members()) >= 6
    for name in ("digits-held-out", "digits-held-out-starved"):
        held_out = parts(name)
        assert len(held_out) >= 2
        assert not {host for _, host in training} & {host for _, host in held_out}
        assert {task for task, _ in held_out} - {task for task, _ in training}  # a data set no training member uses
    assert parts("digits-family-3slot") <= training
    assert {"digits-family", "digits-family-3slot", "digits-held-out", "digits-held-out-starved"} <= set(
        family_names(builtin_only=True)
    )


HELD_OUT = ("digits-held-out", "digits-held-out-starved", "grow-held-out")


def test_grow_family_covers_what_transfer_meets_and_shares_no_host_or_new_data_set_with_a_held_out_family():
    members = [cfg for _, cfg in EnvConfig(family="grow-family").members()]
    assert {len(cfg.slots) for cfg in members} == set(range(2, 8))  # 2 to 7 slots
    assert len({cfg.task for cfg in members}) >= 3
    assert min(cfg.max_epochs for cfg in members) == 15 and max(cfg.max_epochs for cfg in members) == 35
    assert any(cfg.train_samples is not None for cfg in members)  # a data budget
    training = {(cfg.task, cfg.effective_host_preset) for cfg in members}
    for name in HELD_OUT:
        held_out = {(cfg.task, cfg.effective_host_preset) for _, cfg in EnvConfig(family=name).members()}
        assert not {host for _, host in training} & {host for _, host in held_out}, name
    grow_held_out = {cfg.task for _, cfg in EnvConfig(family="grow-held-out").members()}
    assert grow_held_out and not grow_held_out & {task for task, _ in training}  # its data set no member trains on


@pytest.mark.parametrize(
    "env, match",
    [
        ({"max_epochs": 0}, r"family 'bad-.*', member 'm': max_epochs=0: must be an integer >= 1"),
        ({"widths": 3}, r"member 'm': unknown env setting\(s\) \['widths'\]"),
        ({"seed": 3}, r"member 'm': \['seed'\] are the run's settings"),
        ({"train_samples": 0}, r"member 'm': train_samples=0"),
        ({"task": "nope"}, r"member 'm': task='nope': unknown"),
    ],
)
def test_a_bad_member_is_refused_naming_the_family_the_member_and_the_field(env, match):
    name = f"bad-{sorted(env)[0]}-{list(env.values())[0]}"
    register_family(name, [Member("ok"), Member("m", env)])
    with pytest.raises(ValueError, match=match):
        EnvConfig(family=name)


def test_a_member_whose_host_lacks_a_slot_is_refused_when_the_env_is_built_naming_it():
    register_family("bad-slots", [Member("ok"), Member("m", {"host_preset": "digits-impaired-2b"})])
    with pytest.raises(ValueError, match=r"family 'bad-slots', member 'm': slot 'r0c2' does not exist"):
        MorphogeneticEnv({"family": "bad-slots", "device": "cpu"})


def test_unknown_families_and_malformed_members_are_refused():
    with pytest.raises(ValueError, match=r"family='nope': unknown; choose one of \[.*'digits-family'"):
        EnvConfig(family="nope")
    with pytest.raises(ValueError, match="names a member twice"):
        register_family("twice", [Member("a"), Member("a")])
    with pytest.raises(ValueError, match="has no members"):
        register_family("empty", [])
    register_family("budget", [Member("m", {"train_samples": 5_000})])
    with pytest.raises(ValueError, match=r"member 'm': train_samples=5,000: task digits-impaired has only 1,079"):
        MorphogeneticEnv({"family": "budget", "device": "cpu"})


def test_a_member_whose_host_has_more_slots_than_the_policy_holds_is_refused_naming_it():
    import tests.any_host_parts  # noqa: F401  registers any-mlp-17

    register_family(
        "too-many-slots",
        [
            Member("small", {"task": "toy-blobs", "host_preset": "any-mlp-2", "slots": ["h0", "h1"]}),
            Member("big", {"task": "toy-blobs", "host_preset": "any-mlp-17", "slots": [f"h{i}" for i in range(17)]}),
        ],
    )
    with pytest.raises(
        ValueError,
        match=rf"family 'too-many-slots', member 'big': host 'any-mlp-17' has 17 slots; the "
        rf"policy holds at most MAX_SLOTS={MAX_SLOTS}",
    ):
        MorphogeneticEnv({"family": "too-many-slots", "device": "cpu", "plugins": ["tests.any_host_parts"]})


def test_every_member_of_the_built_in_family_runs_a_step():
    env = MorphogeneticEnv({"family": "digits-family", "device": "cpu"})
    seen = set()
    for _ in range(len(family("digits-family"))):
        obs, _ = env.reset()
        assert env.observation_space.contains(obs)
        env.step(np.zeros(len(env.action_space.nvec), dtype=np.int64))
        seen.add(env.member)
    assert seen == {m.name for m in family("digits-family")}


def test_a_train_config_passes_its_family_on_and_sizes_sequences_by_the_longest_member():
    cfg = TrainConfig(family=FAMILY, plugins=("tests.family_parts",), episodes_per_env=3)
    assert cfg.env_config()["family"] == FAMILY
    assert cfg.episode_lengths == (3, 4, 3) and cfg.longest_episode == 4
    assert cfg.episode_steps_per_env == 10  # 3 episodes of the mean length, 10/3, rounded up
    with pytest.raises(ValueError, match=r"\['family'\] are training settings"):
        TrainConfig(env={"family": FAMILY})


@pytest.mark.expensive
def test_two_rounds_of_train_on_a_family_log_each_member(ray_local, tmp_path, capsys):
    out = tmp_path / "family"
    code = main(
        [
            "train",
            "--family",
            FAMILY,
            "--plugins",
            "tests.family_parts",
            "--rounds",
            "2",
            "--envs",
            "1",
            "--cpus-per-env",
            "0.5",
            "--episodes-per-env",
            "3",
            "--output",
            str(out),
        ]
    )
    assert code == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    # each round's episodes counted by member (3 a round of the mean length: one of each, unless a rollback cut one)
    for row in rows:
        counts = {m: row["by_member"].get(f"{m}_episodes", 0) for m in MEMBERS}
        assert sum(counts.values()) == row["episodes"] > 0, row["by_member"]
        assert all(0 <= row["by_member"][f"{m}_final_accuracy"] <= 1 for m in MEMBERS if counts[m])
    assert all(any(f"{m}_episodes" in row["by_member"] for row in rows) for m in MEMBERS)


def test_a_controller_trained_on_a_family_grows_the_one_host_asked_for():
    from esper_ray.train.commands.grow_command import grow_env_config

    base = TrainConfig(family="digits-family-3slot").env_config(shard=0, num_shards=1)
    config = grow_env_config(base, ("r0c0", "r0c1", "r0c2"), "digits", None, (), {}, None)
    assert "family" not in config and config["host_preset"] == "digits"


def test_an_experiment_file_names_a_family_under_training_or_per_arm():
    from esper_ray.experiments.spec import ExperimentSpec

    spec = ExperimentSpec.from_mapping(
        {
            "name": "families",
            "seeds": [0],
            "rounds": 1,
            "training": {"family": "digits-family-3slot", "max_epochs": 25},
            "arms": {"family": {"controller": "ppo"}, "one_host": {"controller": "ppo", "family": None}},
        }
    )
    configs = {t.arm: TrainConfig.from_mapping(t.train) for t in spec.trials()}
    assert configs["family"].family == "digits-family-3slot" and configs["one_host"].family is None
    with pytest.raises(ValueError, match="nope"):
        TrainConfig.from_mapping({**configs["family"].to_dict(), "family": "nope"})
