"""Faults a run must survive, on a local Ray with 2 CPUs: a NaN host, an env step that raises (and the run says
what it raised), a killed env runner, a trial that raises, and `kill -9` of `esper-ray train` between checkpoints
(resumed rounds replay the uninterrupted run's)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.env.faults import FAIL_TRIAL, NAN_AT_EPOCH, RAISE_AT_EPOCH
from esper_ray.train.output.round_summary import summarize_round
from esper_ray.train.rllib.algorithm_host import AlgorithmDriver
from esper_ray.train.rllib.step_failures import FAILURES_LOG

pytestmark = pytest.mark.expensive
NAN_SEED = 77
RAISE_SEED = 91
SMALL = dict(task="digits", envs=2, cpus_per_env=0.5, episodes_per_env=1, learners=0, env={"batch_size": 512})


@pytest.fixture(scope="module")
def ray_with_faults():
    """This module's own Ray: the fault switches must be in the environment before Ray starts its workers."""
    import ray

    os.environ[FAIL_TRIAL] = "broken/1"
    os.environ[NAN_AT_EPOCH] = f"4:seed={NAN_SEED}"
    os.environ[RAISE_AT_EPOCH] = f"2:seed={RAISE_SEED}"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a recorded cluster
    yield ray
    ray.shutdown()
    del os.environ[FAIL_TRIAL], os.environ[NAN_AT_EPOCH], os.environ[RAISE_AT_EPOCH]


def test_a_nan_host_rolls_back_ends_its_episode_and_training_goes_on(ray_with_faults):
    driver = AlgorithmDriver(TrainConfig(max_epochs=6, seed=NAN_SEED, **SMALL), None)
    try:
        summaries = [summarize_round(driver.train()) for _ in range(3)]
    finally:
        driver.stop()
    assert all(s.rollbacks >= 1 and s.failed_env_steps == 0 for s in summaries)  # every episode hits epoch 4
    assert all(math.isfinite(s.episode_return) and s.episodes >= 1 for s in summaries)
    assert [s.round for s in summaries] == [1, 2, 3]


def test_a_failed_env_step_is_named_on_its_round_line_counted_and_its_traceback_kept(ray_with_faults, tmp_path, capsys):
    """Each env runner's first episode raises at epoch 2 (once per process): RLlib recreates the env and samples on,
    and without --verbose the round line must still say what was raised."""
    from esper_ray.cli import main

    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--task",
                "digits",
                "--rounds",
                "2",
                "--envs",
                "2",
                "--cpus-per-env",
                "0.5",
                "--learners",
                "0",
                "--max-epochs",
                "3",
                "--episodes-per-env",
                "1",
                "--env",
                "batch_size=512",
                "--seed",
                str(RAISE_SEED),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    lines = {int(line.split()[1].split("/")[0]): line for line in printed.splitlines() if line.startswith("round ")}
    error = f"InjectedFault: injected env step failure at epoch 2 ({RAISE_AT_EPOCH})"
    assert (
        "FAILED env steps 2" in lines[1] and lines[1].count(error) == 1 and f"{error} (2x)" in lines[1]
    )  # once, counted
    assert "FAILED" not in lines[2]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["failed_env_steps"], r["failed_env_steps_lifetime"]) for r in rows] == [(2, 2), (0, 2)]
    assert all(r["episodes"] == 2 for r in rows)  # each lost episode was replaced by a whole new one
    log = (out / FAILURES_LOG).read_text()
    assert log.startswith(f"round 1: 2 env step(s) raised {error}\nTraceback") and log.count("Traceback") == 1
    assert "raise_if_asked" in log and "_train_epoch" in log  # the frames that raised
    events = next((out / "tensorboard").glob("events.out.tfevents.*")).read_bytes()
    assert b"raise_if_asked" in events  # the traceback as TensorBoard text too


def test_a_killed_env_runner_is_restarted_and_the_run_goes_on(ray_with_faults):
    # rounds of 5 s or more: the kill at 1.5 s lands inside one
    driver = AlgorithmDriver(TrainConfig(max_epochs=75, **SMALL), None)
    algo = driver.algo
    try:
        driver.train()
        victim = algo.env_runner_group._worker_manager._actors[1]
        killer = threading.Timer(1.5, lambda: ray_with_faults.kill(victim, no_restart=False))
        killer.start()  # lands in the middle of the next round
        hit = summarize_round(driver.train())
        killer.join()
        later = [driver.train() for _ in range(2)]
    finally:
        driver.stop()
    assert hit.episodes <= 2  # the killed runner's episode of that round is lost, the other runner's is not
    last = later[-1]
    assert (
        last["fault_tolerance"]["num_healthy_workers"] == 2
        and last["fault_tolerance"]["num_remote_worker_restarts"] >= 1
    )
    assert summarize_round(last).episodes == 2 and summarize_round(last).failed_env_steps == 0  # both runners again


def test_a_trial_that_raises_is_retried_then_excluded_and_the_rest_completes(ray_with_faults, tmp_path, capsys):
    from esper_ray.cli import main

    experiment = tmp_path / "fail.yaml"
    experiment.write_text(
        json.dumps(
            {
                "name": "fail",
                "seeds": [0, 1],
                "rounds": 1,
                "last_rounds": 1,
                "eval_episodes": 1,
                "max_failures": 1,
                "arms": {"broken": {"controller": "none"}, "fine": {"controller": "none", "env": {"host_lr": 0.01}}},
                "max_concurrent_trials": 2,
                "order_seed": 1,
                "training": {"task": "digits", "max_epochs": 2, "envs": 1, "cpus_per_env": 0.5},
            }
        )
    )
    out = tmp_path / "run"
    assert (
        main(["ab", str(experiment), "--output", str(out)]) == 1
    )  # the report, then a non-zero exit: a script can tell
    assert "1 of 4 trials failed" in capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    status = {(t["arm"], t["seed"]): t["status"] for t in results["trials"]}
    assert status == {
        ("broken", 0): "finished",
        ("broken", 1): "error",
        ("fine", 0): "finished",
        ("fine", 1): "finished",
    }
    broken = next(t for t in results["trials"] if t["status"] == "error")
    assert "InjectedFault" in broken["error"] and not broken["in_statistics"]
    assert results["statistics"]["arms"][0]["n"] == 1 and "n shrank" in (out / "report.md").read_text()
    failures = list((out / "tune").glob("broken_seed1_*/error.txt"))
    assert failures and failures[0].read_text().count("Failure #") == 2  # the first try and one retry


def _train(out: Path, rounds: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "esper_ray.cli",
            "train",
            "--rounds",
            str(rounds),
            "--envs",
            "2",
            "--cpus-per-env",
            "0.5",
            "--max-epochs",
            "20",
            "--episodes-per-env",
            "1",
            "--task",
            "digits",
            "--env",
            "batch_size=512",
            "--checkpoint-every",
            "2",
            "--seed",
            "3",
            "--output",
            str(out),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled"},
    )


def _rounds(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _descendants(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children(recursive=True)


# The same two envs as two env runners, or as one runner's vector env of two (issue 77: resume and exactly-once
# rounds unchanged with envs_per_runner > 1).
@pytest.mark.parametrize(
    "runners",
    [["--envs-per-runner", "1"], ["--envs-per-runner", "2"]],
    ids=["one-env-per-runner", "two-envs-per-runner"],
)
def test_kill_9_then_resume_replays_the_uninterrupted_rounds_each_once_and_leaves_no_ray_process(
    ray_with_faults, tmp_path, runners
):
    """kill -9 of the command alone (as `kill -9 PID` does), after round 3 with checkpoints every 2 rounds: its Ray
    processes end with it (the dashboard and runtime-env agents outlived it before), and the resume from round 2
    replays round 3, which metrics.jsonl then holds once (it held [1, 2, 3, 3, 4] before)."""
    import psutil

    whole = _train(tmp_path / "whole", 4, *runners)
    whole.communicate(timeout=600)
    assert whole.returncode == 0

    killed = _train(tmp_path / "killed", 4, *runners)
    started: list = []
    try:
        for line in killed.stdout:
            if line.startswith("round 3/4"):  # round 4 (a second or more) has begun
                started = _descendants(killed.pid)
                os.kill(killed.pid, signal.SIGKILL)
                break
        killed.wait(timeout=60)
        assert started, "the command had no Ray process when it was killed"
        _, alive = psutil.wait_procs(started, timeout=60)
        assert not alive, [p.name() for p in alive]
    finally:
        for process in started:  # started by this test's command: never left behind, whatever failed above
            if process.is_running():
                process.kill()
    assert json.loads((tmp_path / "killed" / "checkpoints" / "latest.json").read_text())["round"] == 2
    resumed = _train(tmp_path / "killed", 4, *runners, "--resume", str(tmp_path / "killed"))
    printed, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, printed[-3000:]
    assert "resumed from" in printed and "at round 2" in printed

    expected, got = _rounds(tmp_path / "whole"), _rounds(tmp_path / "killed")
    assert [r["round"] for r in got] == [1, 2, 3, 4]
    assert all(r["env_steps"] == 2 * 20 for r in got)  # both envs step every round
    keys = ("env_steps", "episode_return", "final_accuracy", "params_added", "germinated", "pruned")
    for round_ in range(3, 5):
        assert {k: got[round_ - 1][k] for k in keys} == {k: expected[round_ - 1][k] for k in keys}, round_
