"""envs_per_runner: auto (issue 77, item 3): a run's `envs` envs split into env-runner processes by the cores, the
same envs, shards and round seeds however split; flags over files; the recorded split on resume (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper_ray.cli import _split_envs, build_parser, main, train_config_from_args
from esper_ray.contracts.envs_split import auto_envs_per_runner
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.experiments.results import ExperimentRecord, as_json
from esper_ray.experiments.spec import ExperimentSpec
from esper_ray.experiments.trial_split import check_override, decide_split, recorded_split, with_split


@pytest.mark.parametrize(
    "envs, cores, per_runner",
    [
        (2, 2, 1),  # the quick start on 2 cores: one env a process, as before
        (4, 16, 1),
        (4, 4, 1),
        (16, 2, 8),  # 2 runners x 8
        (6, 4, 2),  # 3 runners x 2: the largest divisor of 6 within 4 cores
        (7, 2, 7),  # a prime: no divisor but 1 within 2 cores, so 1 runner x 7
        (12, 5, 3),  # 4 runners x 3
        (3, 0.5, 3),  # less than a core counts one
    ],
)
def test_auto_splits_the_envs_into_the_most_runners_the_cores_hold(envs, cores, per_runner):
    assert auto_envs_per_runner(envs, cores, on_gpu=False) == per_runner


def test_auto_keeps_one_env_a_runner_on_a_gpu():
    assert auto_envs_per_runner(16, 2, on_gpu=True) == 1
    assert TrainConfig(envs=16, gpus_per_env=0.25).resolved(2).envs_per_runner == 1


def test_auto_is_the_default_and_resolves_to_a_split_of_the_same_envs():
    cfg = TrainConfig(envs=16, episodes_per_env=3)
    assert cfg.envs_per_runner == "auto"
    split = cfg.resolved(2)
    assert (split.envs_per_runner, split.env_runners, split.total_envs) == (8, 2, 16)
    assert split.episode_steps_per_round == cfg.episode_steps_per_round  # the same episodes each round
    assert TrainConfig(envs=16, envs_per_runner=4).resolved(2).envs_per_runner == 4  # an integer stays


@pytest.mark.parametrize(
    "value, match",
    [
        (3, r"envs_per_runner=3: must divide envs=4 \(one of \[1, 2, 4\]\), or be 'auto'"),
        (0, r"envs_per_runner=0: must be a positive integer that divides envs, or 'auto'"),
        ("most", r"envs_per_runner='most': must be a positive integer that divides envs, or 'auto'"),
    ],
)
def test_a_bad_envs_per_runner_is_one_line_naming_it_and_what_is_allowed(value, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(envs=4, envs_per_runner=value)


def test_a_bad_envs_per_runner_flag_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--envs", "4", "--envs-per-runner", "3"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "envs_per_runner=3: must divide envs=4" in err and len(err.splitlines()) == 1


def test_the_flag_overrides_the_config_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text("envs: 8\nenvs_per_runner: 4\n")
    from_file, _ = train_config_from_args(build_parser().parse_args(["train", "--config", str(config)]))
    assert from_file.envs_per_runner == 4
    flagged = ["train", "--config", str(config), "--envs-per-runner", "auto"]
    assert train_config_from_args(build_parser().parse_args(flagged))[0].envs_per_runner == "auto"
    flagged[-1] = "2"
    assert train_config_from_args(build_parser().parse_args(flagged))[0].envs_per_runner == 2


def test_train_decides_auto_by_the_local_cores_and_says_why(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    cfg, line = _split_envs(TrainConfig(envs=16), resumed=False)
    assert cfg.envs_per_runner == 8 and line == "16 envs as 2 env runners x 8 (auto: 2 CPU cores)"
    cfg, line = _split_envs(TrainConfig(envs=2), resumed=False)
    assert cfg.envs_per_runner == 1 and line is None  # the head line as before
    cfg, line = _split_envs(TrainConfig(envs=4, address="auto"), resumed=False)
    assert cfg.envs_per_runner == "auto" and "once joined" in line  # run_training decides, by the cluster's CPUs


def _stored_run(tmp_path: Path, cfg: TrainConfig) -> Path:
    from esper_ray.train.folders.checkpoints import record_checkpoint

    run = tmp_path / "run"
    partial = run / "checkpoints" / "round_00001.partial"
    partial.mkdir(parents=True)
    record_checkpoint(run, cfg, partial, 1)
    return run


@pytest.mark.parametrize("recorded", [1, 2])
def test_a_resume_keeps_the_split_the_run_recorded_on_a_machine_that_would_split_otherwise(
    tmp_path, monkeypatch, recorded
):
    run = _stored_run(tmp_path, TrainConfig(envs=4, envs_per_runner=recorded))
    record = json.loads((run / "checkpoints" / "round_00001" / "train_config.json").read_text())
    assert record.get("envs_per_runner", 1) == recorded and record.get("env_runners", 4) == 4 // recorded
    monkeypatch.setattr("os.cpu_count", lambda: 1)  # auto would put all 4 envs in one runner here
    for extra in ([], ["--envs-per-runner", "auto"]):
        args = build_parser().parse_args(["train", "--resume", str(run), "--rounds", "3", *extra])
        cfg, _ = train_config_from_args(args)
        cfg, line = _split_envs(cfg, resumed=True)
        assert (cfg.envs, cfg.envs_per_runner) == (4, recorded)
        assert line == (None if recorded == 1 else "4 envs as 2 env runners x 2 (as the run started)")
    other = build_parser().parse_args(["train", "--resume", str(run), "--rounds", "3", "--envs-per-runner", "4"])
    with pytest.raises(ValueError, match=r"\['envs_per_runner'\] differ from the run's"):
        train_config_from_args(other)


def test_records_before_auto_read_as_they_ran():
    assert TrainConfig.from_record({"envs": 3}).envs_per_runner == 1  # no key: one env a runner
    early = TrainConfig.from_record({"envs": 1, "envs_per_runner": 2})  # issue 77's cuts 2-3: envs counted runners
    assert (early.envs, early.env_runners) == (2, 1)
    now = TrainConfig(envs=4, envs_per_runner=2)
    assert now.to_dict()["env_runners"] == 2 and TrainConfig.from_record(now.to_dict()) == now
    with pytest.raises(ValueError, match="env_runners=3: a record of envs / envs_per_runner"):
        TrainConfig.from_mapping({**now.to_dict(), "env_runners": 3})


def test_a_split_run_gives_each_env_the_shard_and_round_seeds_it_has_unsplit():
    """4 envs as 2 runners x 2 against 4 runners x 1: env i reads shard i of 4 either way, and its episodes start
    from the same seeds (from seed, shard, round and episode), whatever reset seed RLlib hands each runner."""
    from ray.rllib.env.env_context import EnvContext

    from esper_ray.train.rllib.env_factory import RUNNER_KEY, ShardedMorphogeneticEnv, ShardedVectorMorphogeneticEnv

    cfg = TrainConfig(envs=4, max_epochs=2, seed=5, env={"device": "cpu"})
    split = cfg.resolved(2)
    assert (split.env_runners, split.envs_per_runner) == (2, 2)

    def seeds(env, reset_seed):
        env.start_round(3)
        out = []
        for _ in range(2):
            env.reset(seed=reset_seed)
            out.append(env._episode_seed)
        return out

    alone = []
    for i in range(cfg.envs):  # runner i + 1 of 4; RLlib seeds a runner's first reset with seed + worker index
        env = ShardedMorphogeneticEnv(EnvContext(cfg.env_config(), worker_index=i + 1, num_workers=cfg.envs))
        alone.append(((env.cfg.shard, env.cfg.num_shards), seeds(env, cfg.seed + i + 1)))
    folded = []
    for k in range(split.env_runners):
        settings = {**split.env_config(), "num_envs": split.envs_per_runner, RUNNER_KEY: (k + 1, split.env_runners)}
        vector = ShardedVectorMorphogeneticEnv(settings)
        for j, env in enumerate(vector.envs):
            env = env.unwrapped
            folded.append(((env.cfg.shard, env.cfg.num_shards), seeds(env, cfg.seed + k + 1 + j)))
    assert [shard for shard, _ in alone] == [(i, 4) for i in range(4)]
    assert folded == alone


AB = {
    "name": "t",
    "arms": {"ppo": {"reward_mode": "shaped"}, "none": {"controller": "none"}},
    "seeds": [0, 1, 2, 3],
    "rounds": 2,
    "last_rounds": 1,
    "training": {"max_epochs": 3, "envs": 4, "cpus_per_env": 0.5, "driver_cpus": 0.5},
}
UNSPLIT_NEED = {"ppo": {"CPU": 2.5}}  # 4 runners x 0.5 + the driver's 0.5


@pytest.mark.parametrize(
    "have, cap, per_runner",
    [
        (16, None, 1),  # 4 trials fit at once: 4 cores a trial, one per env
        (8, None, 2),  # 3 fit: 2.7 cores a trial, so 2 runners x 2
        (16, 8, 1),  # the cap leaves 4 trials (the experiment's PPO trials) at once
    ],
)
def test_an_ab_trial_s_auto_counts_its_share_of_the_cluster_s_cpus(have, cap, per_runner):
    spec = ExperimentSpec.from_mapping({**AB, **({"max_concurrent_trials": cap} if cap else {})})
    decided = decide_split(spec, {"CPU": float(have)}, UNSPLIT_NEED)
    assert set(decided) == {"ppo"} and decided["ppo"][0] == per_runner, decided


def test_an_ab_cap_of_one_trial_gives_it_every_core():
    spec = ExperimentSpec.from_mapping({**AB, "max_concurrent_trials": 1})
    assert decide_split(spec, {"CPU": 2.0}, UNSPLIT_NEED)["ppo"] == (
        2,
        "auto: 2 CPU cores a trial, 1 trial at a time on 2",
    )


def test_the_ab_flag_overrides_the_file_and_is_checked_against_every_ppo_arm():
    spec = ExperimentSpec.from_mapping({**AB, "training": {**AB["training"], "envs_per_runner": 2}})
    assert decide_split(spec, {"CPU": 16.0}, UNSPLIT_NEED)["ppo"] == (2, None)  # the file's
    assert decide_split(spec, {"CPU": 16.0}, UNSPLIT_NEED, override=4)["ppo"] == (4, None)
    assert decide_split(spec, {"CPU": 16.0}, UNSPLIT_NEED, override="auto")["ppo"][0] == 1
    with pytest.raises(ValueError, match=r"--envs-per-runner \(arms.ppo\): envs_per_runner=3: must divide envs=4"):
        check_override(spec, 3)


def test_an_ab_run_records_its_split_and_results_give_each_trial_its_own():
    spec = ExperimentSpec.from_mapping(AB)
    assert recorded_split({"envs_per_runner": {"ppo": 2}}, spec) == {"ppo": 2}
    assert recorded_split({}, spec) == {"ppo": 1}  # a run started before auto: one env a runner
    ran = with_split(spec, {"ppo": 2})
    assert all(t.train["envs_per_runner"] == 2 for t in ran.trials() if t.arm == "ppo")
    results = as_json(ExperimentRecord(spec, 0, False, [], split={"ppo": 2}))
    assert results["envs_per_runner"] == {"ppo": 2} and results["experiment"] == spec.to_dict()
