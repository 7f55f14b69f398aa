"""Progress: the counter behind `esper-ray train`'s bar (env runners batch their step reports: a remote call per
step cost the default run on 2 cores speed, train/output/progress.py, and a finished sample is always counted whole);
the plain lines with a time-left estimate of `heuristic` and `eval` (train/output/progress_lines.py), as a command run
with its output redirected to a log file writes them; the estimate on `esper-ray ab`'s trial lines."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from esper_ray.formatting import counted, duration
from esper_ray.train.output import progress
from esper_ray.train.output.progress import PROGRESS_ACTOR_KEY, StepReporter, start_step_counter
from esper_ray.train.output.progress_lines import EPOCH_LINE_SECONDS, EpisodeProgress

REPO = Path(__file__).resolve().parents[1]


class FakeCounter:
    """Stands for the StepCounter actor handle: records each `add.remote(n)` call."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.add = SimpleNamespace(remote=self.calls.append)


def reporter_with(counter: FakeCounter, monkeypatch: Any) -> tuple[StepReporter, Any]:
    monkeypatch.setattr(progress.ray, "get_actor", lambda name: counter)
    runner = SimpleNamespace(config=SimpleNamespace(learner_config_dict={PROGRESS_ACTOR_KEY: "steps"}))
    return StepReporter(), runner


def test_steps_within_the_report_interval_go_out_in_one_call_and_a_flush_sends_the_rest(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    counter = FakeCounter()
    reporter, runner = reporter_with(counter, monkeypatch)
    reporter.step(runner)  # the first step goes out at once: the bar starts moving
    for _ in range(9):
        clock[0] += progress.REPORT_SECONDS / 10
        reporter.step(runner)
    assert counter.calls == [1]
    clock[0] += progress.REPORT_SECONDS
    reporter.step(runner)
    assert counter.calls == [1, 10]
    reporter.step(runner)
    reporter.flush()  # the end of a sample: nothing is left behind for the next round
    assert counter.calls == [1, 10, 1] and sum(counter.calls) == 12
    reporter.flush()
    assert counter.calls == [1, 10, 1]  # nothing pending, no call


def test_without_a_counter_the_reporter_sends_nothing(monkeypatch):
    runner = SimpleNamespace(config=SimpleNamespace(learner_config_dict={PROGRESS_ACTOR_KEY: None}))
    reporter = StepReporter()
    for _ in range(5):
        reporter.step(runner)
    reporter.flush()
    assert reporter.counter is None and reporter.pending == 0


def test_no_counter_is_started_where_no_bar_can_be_drawn(monkeypatch):
    monkeypatch.setattr(progress.sys, "stderr", SimpleNamespace(isatty=lambda: False))
    assert start_step_counter() == (None, None)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("seconds, text", [(0.4, "0s"), (42.9, "42s"), (185, "3m05s"), (3720, "1h02m")])
def test_durations_read_short(seconds, text):
    assert duration(seconds) == text


def test_counts_take_the_singular_for_one_only():
    assert [counted(n, "trial") for n in (0, 1, 2)] == ["0 trials", "1 trial", "2 trials"]
    assert counted(1, "ppo trial") == "1 ppo trial" and counted(3, "child", "children") == "3 children"
    out = io.StringIO()
    EpisodeProgress("eval", 1, 1, out=out, clock=FakeClock())
    assert out.getvalue().endswith("eval: 1 episode of up to 1 epoch (results at the end)\n")


def test_slow_epochs_get_a_line_each_and_every_episode_one_with_the_time_left():
    """2 episodes of 4 epochs, 10 s an epoch: after 3 epochs, 30 s for 3 of 8 -> 50 s left."""
    clock, out = FakeClock(), io.StringIO()
    lines = EpisodeProgress("heuristic", 2, 4, out=out, clock=clock)
    for _ in range(2):
        for epoch in range(1, 5):
            clock.now += 10
            lines.epoch(epoch, {"val_accuracy": 0.25})
        lines.episode_end(0.5, 1234, 40.0)
    printed = out.getvalue().splitlines()
    assert printed[0] == "[  0m00s] heuristic: 2 episodes of up to 4 epochs (results at the end)"
    assert printed[1] == "[  0m10s] heuristic: episode 0 (1 of 2), epoch 1/4: val acc 25.0%; about 1m10s left"
    assert printed[3] == "[  0m30s] heuristic: episode 0 (1 of 2), epoch 3/4: val acc 25.0%; about 50s left"
    assert (
        printed[4]
        == "[  0m40s] heuristic: episode 0 (1 of 2) done in 40s: final acc 50.0%, params kept 1,234; about 40s left"
    )
    assert printed[-1] == "[  1m20s] heuristic: episode 1 (2 of 2) done in 40s: final acc 50.0%, params kept 1,234"
    assert len(printed) == 1 + 2 * (3 + 1)  # the last epoch of an episode has the episode's line, not its own


def test_fast_epochs_get_no_line_of_their_own_and_the_estimate_counts_an_early_end_as_whole():
    clock, out = FakeClock(), io.StringIO()
    lines = EpisodeProgress("eval", 3, 25, out=out, clock=clock)
    for epoch in range(1, 11):  # a governor rollback ends the episode at epoch 10
        clock.now += EPOCH_LINE_SECONDS / 20
        lines.epoch(epoch, {"val_accuracy": 0.5})
    lines.episode_end(0.1, 0, 2.5)  # counted as 25 of 75 epochs in 2.5 s
    printed = out.getvalue().splitlines()
    assert len(printed) == 2 and printed[1].endswith(
        "episode 0 (1 of 3) done in 2s: final acc 10.0%, params kept 0; about 5s left"
    )


def test_the_heuristic_command_with_its_output_in_log_files_writes_progress_lines_and_clean_json(tmp_path):
    """As a job writes it, stdout and stderr redirected to files: the summaries on stdout (one JSON document),
    a line per episode on stderr with the time left, and nothing else there: no Ray warning, no ANSI code."""
    stdout, stderr = tmp_path / "out.json", tmp_path / "err.log"
    with stdout.open("w") as out, stderr.open("w") as err:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "esper_ray.cli",
                "heuristic",
                "--task",
                "digits",
                "--max-epochs",
                "2",
                "--episodes",
                "2",
                "--json",
            ],
            cwd=REPO,
            stdout=out,
            stderr=err,
            timeout=300,
        )
    log = stderr.read_text()
    assert run.returncode == 0, log
    assert [row["episode"] for row in json.loads(stdout.read_text())] == [0, 1]
    warning = "warning: no seed can be kept in a run of max_epochs=2"  # a 2-epoch run says so, once
    assert sum(warning in line for line in log.splitlines()) == 1, log
    lines = [line for line in log.splitlines() if warning not in line]
    assert lines[0].endswith("heuristic: 2 episodes of up to 2 epochs (results at the end), torch threads: 1")
    assert (
        "heuristic: episode 0 (1 of 2) done in " in lines[-2]
        and lines[-2].endswith(" left")
        and "; about " in lines[-2]
    )
    assert "heuristic: episode 1 (2 of 2) done in " in lines[-1]
    assert all(line.startswith("[") for line in lines), log  # progress lines only
    assert "Warning" not in log and "\x1b[" not in log


def fake_trial(arm: str, seed: int, status: str, last_result: dict | None = None) -> Any:
    from esper_ray.experiments.trial_keys import TRIAL_KEY

    return SimpleNamespace(
        config={TRIAL_KEY: {"arm": arm, "seed": seed}},
        trial_id=f"{arm}{seed}",
        status=status,
        last_result=last_result or {},
    )


def ab_events(monkeypatch) -> tuple[list[float], list[str], Any]:
    """TrialEvents for a PPO trial of 2 rounds x 2 episodes + 2 evaluation episodes (6) and a baseline trial of 2 (8
    in all), on a clock the test moves; returns (clock, printed lines, events)."""
    from esper_ray.experiments import runner
    from esper_ray.experiments.runner import TrialEvents, TrialWork

    clock = [1000.0]
    monkeypatch.setattr(runner.time, "time", lambda: clock[0])
    printed: list[str] = []
    events = TrialEvents(
        2,
        2,
        {("ppo", 0): TrialWork(2, 2), ("none", 0): TrialWork(0, 2)},
        print_fn=lambda text, flush: printed.append(text),
    )
    return clock, printed, events


def round_one() -> dict:
    from esper_ray.experiments.trial_keys import SUMMARY_PREFIX

    return {SUMMARY_PREFIX + "round": 1, SUMMARY_PREFIX + "final_accuracy": 0.5, SUMMARY_PREFIX + "failed_env_steps": 0}


def test_ab_lines_estimate_the_time_left_from_the_episodes_done_since_the_first_trial_started(monkeypatch):
    """A PPO trial of 2 rounds x 2 episodes + 2 evaluation episodes (6) and a baseline trial of 2 (8 in all);
    Tune has created only the first trial when it reports round 1 after 20 s: 2 of 8 done -> 60 s left."""
    from esper_ray.experiments.trial_keys import RUNNER_INIT_SECONDS, RUNNERS_UP_SECONDS, SETUP_SECONDS

    clock, printed, events = ab_events(monkeypatch)
    ppo = fake_trial("ppo", 0, "RUNNING")
    events.on_trial_start(0, [ppo], ppo)
    assert printed[-1] == "[  0m00s] started  ppo/seed0 (1 running, 0/2 done)"  # nothing done yet: no estimate
    clock[0] += 20
    result = round_one()
    events.on_trial_result(1, [ppo], ppo, result)
    assert printed[-1] == "[  0m20s]          ppo/seed0 round 1/2: rollout acc 50.0%; about 1m00s left"
    ppo.last_result = result  # as Tune keeps it
    events.on_trial_result(1, [ppo], ppo, {**result, SETUP_SECONDS: 31.4})  # a trial's first result has its setup
    assert printed[-1] == "[  0m20s]          ppo/seed0 round 1/2: rollout acc 50.0%; its setup 31 s; about 1m00s left"
    events.on_trial_result(
        1, [ppo], ppo, {**result, SETUP_SECONDS: 31.4, RUNNERS_UP_SECONDS: 20.2, RUNNER_INIT_SECONDS: 8.6}
    )  # and its env runners' part of it
    assert printed[-1] == (
        "[  0m20s]          ppo/seed0 round 1/2: rollout acc 50.0%; its setup 31 s (env runners up "
        "after 20 s, then built in 9 s); about 1m00s left"
    )
    none = fake_trial("none", 0, "TERMINATED")
    clock[0] += 10
    events.on_trial_complete(2, [ppo, none], none)  # 2 + 2 of 8 after 30 s
    assert printed[-1] == "[  0m30s] finished none/seed0 (1/2 done; about 30s left)"


def test_ab_estimates_count_time_from_the_first_trial_start_not_from_ray_and_the_setups(monkeypatch):
    """Ray, Tune and the first trials' setup take 40 s before Tune calls a trial started; round 1 (2 of 8 episodes)
    reports 20 s later: the episodes left take 60 s at that pace, not 3 minutes (as 60 s for 2 episodes would say)."""
    clock, printed, events = ab_events(monkeypatch)
    ppo = fake_trial("ppo", 0, "RUNNING")
    clock[0] += 40
    events.on_trial_start(0, [ppo], ppo)
    assert printed[-1] == "[  0m40s] started  ppo/seed0 (1 running, 0/2 done)"
    clock[0] += 20
    events.on_trial_result(1, [ppo], ppo, round_one())
    assert printed[-1] == "[  1m00s]          ppo/seed0 round 1/2: rollout acc 50.0%; about 1m00s left"


def two_ppo_trials(printed: list[str], rounds_before: int = 0) -> Any:
    """TrialEvents for two PPO trials of 10 rounds x 2 episodes + 2 evaluation episodes (22 each, 44 in all), the
    first continuing from `rounds_before` rounds; its lines go to `printed`."""
    from esper_ray.experiments.runner import TrialEvents, TrialWork

    work = {("ppo", 0): TrialWork(2, 2, rounds_before), ("ppo", 1): TrialWork(2, 2)}
    return TrialEvents(2, 10, work, print_fn=lambda text, flush: printed.append(text))


def on_a_clock(monkeypatch) -> list[float]:
    """The runner's clock, as the test moves it."""
    from esper_ray.experiments import runner

    clock = [1000.0]
    monkeypatch.setattr(runner.time, "time", lambda: clock[0])
    return clock


def round_n(n: int) -> dict:
    return {**round_one(), "round/round": n}


def test_the_ab_estimate_holds_its_pace_across_a_resume_whose_first_round_is_slow(monkeypatch, tmp_path):
    """Rounds of 10 s: after 5 of the first trial's 10 rounds, 10 of 44 episodes in 50 s, 2m50s left. The run is
    stopped and resumed (Tune saves the callback's state and gives it back); the restored trial's first round takes
    30 s (its checkpoint loaded, its graphs captured again). The estimate goes on from the pace of both commands
    (12 episodes in 80 s: 3m33s for the 32 left), not from that one round (2 in 30 s: 8m00s, as it did before)."""
    clock, printed = on_a_clock(monkeypatch), []
    events = two_ppo_trials(printed)
    first, second = fake_trial("ppo", 0, "RUNNING"), fake_trial("ppo", 1, "PENDING")
    events.on_trial_start(0, [first, second], first)
    for n in range(1, 6):
        clock[0] += 10
        first.last_result = round_n(n)
        events.on_trial_result(n, [first, second], first, first.last_result)
    assert printed[-1].endswith("ppo/seed0 round 5/10: rollout acc 50.0%; about 2m50s left")
    from ray.tune.callback import CallbackList

    CallbackList([events]).save_to_dir(str(tmp_path))  # as Tune saves its callbacks' state when the command stops

    clock[0] += 300  # stopped for a while, then Ray and the restored trial's setup
    resumed = two_ppo_trials(printed)  # as Tune restores it (tuner.pkl): then its state, then setup()
    assert CallbackList([resumed]).can_restore(str(tmp_path))
    CallbackList([resumed]).restore_from_dir(str(tmp_path))
    resumed.setup()
    resumed.on_trial_start(0, [first, second], first)  # the trial as Tune restored it: its last result round 5
    assert printed[-1] == "[  0m00s] started  ppo/seed0 (1 running, 0/2 done; about 2m50s left)"
    clock[0] += 30
    first.last_result = round_n(6)
    resumed.on_trial_result(1, [first, second], first, first.last_result)
    assert printed[-1].endswith("ppo/seed0 round 6/10: rollout acc 50.0%; about 3m33s left")


def test_a_salvaged_trial_continued_from_its_checkpoint_counts_only_the_rounds_it_runs_again(monkeypatch):
    """--salvage continues the first trial from its round 5 in a new trial, whose first result is round 6, 10 s
    after it started: 2 episodes in 10 s, 32 left (12 done), 2m40s; not 12 episodes in 10 s (27 s)."""
    clock, printed = on_a_clock(monkeypatch), []
    events = two_ppo_trials(printed, rounds_before=5)
    first, second = fake_trial("ppo", 0, "RUNNING"), fake_trial("ppo", 1, "PENDING")
    events.on_trial_start(0, [first, second], first)
    assert printed[-1] == "[  0m00s] started  ppo/seed0 (1 running, 0/2 done)"
    clock[0] += 10
    events.on_trial_result(1, [first, second], first, round_n(6))
    assert printed[-1].endswith("ppo/seed0 round 6/10: rollout acc 50.0%; about 2m40s left")


def test_a_resumed_ab_run_says_how_many_trials_it_runs_at_once(tmp_path, capsys, monkeypatch):
    """A run that Tune restores prints the trials-at-once line as a new run does (Ray and Tune stand-ins here:
    the crafted run's trials have all finished), with the cap the run started with."""
    from types import SimpleNamespace

    from esper_ray.cli import main
    from esper_ray.experiments import runner
    from tests.test_experiments import crafted_run

    out = crafted_run(tmp_path, tmp_path / "ran")
    monkeypatch.setattr(runner, "connect_ray", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner.ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(runner, "check_tune_folder", lambda *args: True)  # a run Tune left to continue
    monkeypatch.setattr(runner.tune.Tuner, "restore", lambda *args, **kwargs: SimpleNamespace(fit=lambda: None))
    assert (
        main(
            [
                "ab",
                str(REPO / "tune_configs" / "smoke.yaml"),
                "--output",
                str(out),
                "--resume",
                "--max-concurrent-trials",
                "3",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "(1 PPO round, then 2 evaluation episodes each)" in printed  # counts with their own plural
    assert "trials at once on 2 CPU: 2 ppo trials at once (1 CPU each)" in printed
    assert "no cap (max_concurrent_trials not set)" in printed  # the run's own, not the flag's (Tune keeps it)


def test_ab_announces_ppo_rounds_only_when_an_arm_trains(tmp_path, capsys, monkeypatch):
    """`ab` announced "10 PPO rounds" for an experiment with no ppo arm (issue 74)."""
    from esper_ray.cli import main
    from esper_ray.experiments import runner

    experiment = tmp_path / "baselines.yaml"
    experiment.write_text(
        json.dumps(
            {
                "name": "b",
                "arms": {"none": {"controller": "none"}, "heuristic": {"controller": "heuristic"}},
                "seeds": [0],
                "rounds": 10,
                "eval_episodes": 2,
            }
        )
    )
    monkeypatch.setattr(
        runner,
        "run_experiment",
        lambda spec, output, **kw: runner.ExperimentOutcome(
            output, interrupted=True, terminated=False, failed=[], done=0, total=2
        ),
    )
    assert main(["ab", str(experiment), "--output", str(tmp_path / "out")]) == 130
    printed = capsys.readouterr().out
    assert "(2 evaluation episodes each, no training)" in printed and "PPO round" not in printed, printed
