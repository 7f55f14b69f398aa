"""benchmarks/throughput.py in its CPU mode, once, as a smoke test: it runs and prints its JSON (no timing is
asserted; speed figures belong to the benchmark's own output, on a named machine). benchmarks/roofline.py on the
CPU against a hand count of the cifar10 host's layers and the published H200 peaks. And benchmarks/ as a user reads
it: each script named in its folder's README, each results file naming its card and commit."""

from __future__ import annotations

import json
import os
import pstats
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """`python benchmarks/SCRIPT ARGS` from the checkout with `env` added to this process's environment; it must
    exit 0 (its stderr's tail in the failure)."""
    run = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.expensive
def test_throughput_benchmark_runs_on_cpu_and_prints_one_json_line():
    # No timing is asserted, so the limit only catches a hang: beside two CPU hogs on a busy 2-core machine the
    # run took over 10 minutes (4.5 without them)
    run = run_benchmark(
        "throughput.py",
        *("--rounds", "2", "--bare-seconds", "2", "--max-epochs", "5", "--bare-threads", "2"),
        timeout=1800,
        RAY_AUTH_MODE="disabled",
    )
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["machine"]["card"] == "no GPU" and report["setup"]["envs"] == 2 and report["setup"]["max_epochs"] == 5
    figures = report["without_mps"]
    for key in (
        "bare_env_steps_per_s",
        "bare_samples_per_s",
        "train_env_steps_per_s",
        "train_samples_per_s",
        "train_over_bare",
    ):
        assert figures[key] > 0, key
    assert 0 <= figures["bare_reset_share"] < 1
    assert figures["bare_threads_per_env"] == 2  # as asked (the default on 2 cores and 2 envs would be 1)
    assert figures["bare_capturing_steps_share"] == figures["bare_captures_per_episode"] == 0  # no CUDA graphs on a CPU
    # the train half's rounds wait for their slowest env runner: its share of the wall is what bare envs never pay
    assert 0 < figures["train_runner_sample_seconds_mean"] <= figures["train_runner_sample_seconds_max"]
    assert 0 <= figures["train_waiting_for_the_slowest_share"] < 1
    # by the driver's clock the same rounds take longer: it also counts the work between two algo.train() calls
    assert 0 < figures["train_wall_samples_per_s"] <= figures["train_samples_per_s"]
    assert 0 <= figures["train_between_rounds_share"] < 1
    # what the episodes asked of the envs, counted alike in both halves (no CUDA graphs on a CPU)
    assert figures["train_captures_per_episode"] == 0
    assert 0 <= figures["train_seed_epochs_per_episode"] <= 5 and 0 <= figures["bare_seed_epochs_per_episode"] <= 5
    assert figures["train_ms_per_step_in_env"] > 0 and figures["bare_ms_per_step_in_env"] > 0
    assert_the_split_adds_up(figures)


def assert_the_split_adds_up(figures: dict) -> None:
    """train / bare = (the pace while sampling / bare) x (1 - the share the rounds lose), to the figures' rounding.
    The share compares two clocks (the driver's rounds against the runners' sample calls): where the rounds lose
    next to nothing, timer jitter puts it a little below 0 (-0.002 on an H200)."""
    sampling_over_bare, share, over_bare = (
        figures[k] for k in ("train_sampling_over_bare", "train_outside_sampling_share", "train_over_bare")
    )
    assert -0.02 < share < 1
    # each figure is rounded to 3 decimals (off by 0.0005 at most), so the product is off by 0.0005 times the sum
    # of its factors at most, whatever the machine's pace (a fixed abs=0.005 failed at a ratio of 17.6)
    assert sampling_over_bare * (1 - share) == pytest.approx(
        over_bare, abs=0.0005 * (sampling_over_bare + 1 - share + 1)
    )


def vector_env_benchmark(*args: str) -> list[dict]:
    """The JSON lines of benchmarks/vector_env.py at its smallest (2 envs, one step, one round), one torch thread."""
    run = run_benchmark("vector_env.py", "--sizes", "2", "--steps", "1", "--rounds", "1", *args, OMP_NUM_THREADS="1")
    return [json.loads(line) for line in run.stdout.splitlines()]


def test_vector_env_benchmark_runs_and_prints_the_machine_then_one_json_line_per_size():
    """benchmarks/vector_env.py at its smallest, once: it runs, names the machine, and the vector env of two waiting
    envs trained every epoch stacked (no timing is asserted)."""
    lines = vector_env_benchmark()
    assert lines[0]["machine"]["torch_threads"] == 1 and lines[0]["machine"]["cpu"]
    assert [line["envs"] for line in lines[1:]] == [2] and lines[1]["stacked_epoch_share"] == 1.0
    assert set(lines[1]["per_host_step_ms"]) == {"separate", "vector"} and lines[1]["separate_over_vector"] > 0
    assert {"cpu", "cores", "torch", "commit"} <= set(lines[1])


def test_vector_env_benchmark_against_a_tree_runs_the_three_processes_and_their_ratios():
    """`--against TREE` (this checkout as the other tree here): per pair a process of the tree's separate envs, this
    tree's separate envs and its vector env, each its own line, then the medians and the within-pair ratios."""
    lines = vector_env_benchmark("--against", str(REPO), "--pairs", "1")
    assert sorted(line["run"] for line in lines[1:4]) == ["old_separate", "separate", "vector"]
    summary = lines[4]
    assert summary["envs"] == 2 and summary["against"] == str(REPO) and summary["card"] == "no GPU"
    assert all(summary[k] > 0 for k in ("old_over_vector", "old_over_separate", "separate_over_vector"))


def test_throughput_bare_half_steps_vector_envs_of_envs_per_runner():
    """`--envs-per-runner 2 --only bare`: one process steps the 2 envs as one vector env, its epochs stacked."""
    run = run_benchmark(
        "throughput.py",
        *("--only", "bare", "--envs-per-runner", "2"),
        *("--bare-seconds", "2", "--max-epochs", "3", "--bare-threads", "1"),
        RAY_AUTH_MODE="disabled",
    )
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["setup"]["envs"] == 2 and report["setup"]["envs_per_runner"] == 2
    figures = report["without_mps"]
    assert figures["bare_env_steps_per_s"] > 0 and figures["bare_stacked_epoch_share"] == 1.0
    assert 0 < figures["bare_stack_builds_per_step"] <= 1  # a random controller's seeds change the held stack's key
    # episodes of 3 epochs reset inside the vector env's steps, and those resets are timed, not reported as none
    assert 0 < figures["bare_reset_share"] < 1 and figures["bare_ms_per_reset"] > 0
    assert "bare: 1 env process of 2 envs" in run.stderr


@pytest.mark.parametrize("sampling_over_bare, share", [(17.60049, -0.00049), (17.6, -0.002), (0.41, 0.3)])
def test_the_split_adds_up_whatever_the_rounding_and_a_jitter_below_zero(sampling_over_bare, share):
    """Figures as the benchmark rounds them, at the worst of the rounding: a ratio of 17.6 came out 0.009 off."""
    figures = {
        "train_sampling_over_bare": round(sampling_over_bare, 3),
        "train_outside_sampling_share": round(share, 3),
        "train_over_bare": round(sampling_over_bare * (1 - share), 3),
    }
    assert_the_split_adds_up(figures)


@pytest.mark.expensive
def test_throughput_with_lead_counts_each_round_from_when_its_runners_began_it():
    """--lead: every steady round was sampled ahead by every runner, so its samples/s count from when the first
    round's episodes reached the driver (the runners began the second then), before that round's train() ended."""
    run = run_benchmark(
        "throughput.py", "--rounds", "3", "--max-epochs", "5", "--lead", "--only", "train", RAY_AUTH_MODE="disabled"
    )
    figures = json.loads(run.stdout.strip().splitlines()[-1])["without_mps"]
    assert figures["train_round_led_share"] == 1
    assert 0 < figures["train_samples_per_s"] < figures["train_wall_samples_per_s"]


# ------------------------------------------------------------------------------------------ benchmarks/roofline.py
# The cifar10 host by hand (HOST_PRESETS["cifar10"]): 3x3 convolutions 3->8 at 32x32, 8->16 at 16x16, 16->32 at 8x8
# (each block pooled 2x2 after), then a linear head 32->10 on the pooled features.
CONVS = ((3, 8, 32), (8, 16, 16), (16, 32, 8))  # (in channels, out channels, side)
HAND_FORWARD_FLOPS = sum(2 * cin * 9 * cout * side**2 for cin, cout, side in CONVS) + 2 * 32 * 10
HAND_ACTIVATIONS = sum((cin + cout) * side**2 for cin, cout, side in CONVS) + 32 + 10  # inputs + outputs, elements
H200_BF16_DENSE = 1979e12 / 2  # NVIDIA H200 datasheet: BF16 1,979 TFLOPS with sparsity
H200_BANDWIDTH = 4.8e12


def roofline(*flags: str) -> dict:
    run = run_benchmark("roofline.py", "--json", *flags, timeout=300, CUDA_VISIBLE_DEVICES="")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _throughput_module(path: Path = REPO / "benchmarks" / "throughput.py", name: str = "throughput_script"):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_bare_envs_none_controller_keeps_the_host_alone_and_the_random_one_grows():
    """--bare-controller none: after the warm-up no seed ever runs (on a GPU: no step captures a graph)."""
    module = _throughput_module()
    base = dict(
        envs=2,
        gpus=0,
        task="digits-impaired",
        train_size=0,
        val_size=None,
        batch_size=64,
        max_epochs=6,
        episodes_per_env=1,
        rounds=1,
        bare_seconds=0.0,
        slots=("r0c1", "r0c2"),
        model="cpu",
    )
    germinated = {}
    for name in ("none", "random"):
        env, controller, obs = module.warmed_up_env(module.Setup(**base, bare_controller=name), shard=0)
        seen = 0
        for _ in range(12):
            obs, _, terminated, _, _ = env.step(controller.act(obs))
            seen += sum(s.is_active for s in env.model.seed_slots())
            if terminated:
                obs, _ = env.reset()
        germinated[name] = seen
    assert germinated["none"] == 0 and germinated["random"] > 0, germinated


def test_a_rounds_wall_splits_into_the_slowest_runner_collecting_and_the_driver_after_sampling():
    """runner_waits on two constructed rounds of 5 s each: runners took 4 s on average and 4.5 s at most, the
    driver held the episodes 4.6 s after the round began and spent 0.1 s sending the weights."""
    row = {
        "env_runners": {"esper/runner_sample_seconds": 4.0, "esper/runner_sample_seconds_max": 4.5},
        "esper/driver_sampling_seconds": 4.6,
        "esper/driver_weight_sync_seconds": 0.1,
    }
    waits = _throughput_module().runner_waits([row, row], seconds=10.0)
    assert waits["runner_sample_seconds_mean"] == 4.0 and waits["runner_sample_seconds_max"] == 4.5
    assert waits["waiting_for_the_slowest_share"] == pytest.approx(1.0 / 10)  # 0.5 s a round
    assert waits["collecting_episodes_share"] == pytest.approx(0.2 / 10)  # 4.6 - 4.5
    assert waits["after_sampling_share"] == pytest.approx(0.8 / 10)  # 5 - 4.6
    assert waits["weight_send_share"] == pytest.approx(0.2 / 10)
    del row["esper/driver_sampling_seconds"]  # RLlib's own PPO (no overlap) is not timed by the driver
    assert "after_sampling_share" not in _throughput_module().runner_waits([row], seconds=5.0)


def test_a_steady_rounds_episode_work_splits_a_runners_step_into_the_env_and_the_rest():
    """episode_work on two constructed rounds (episodes of 10 epochs, 2 per env): a runner's sample call took 3 s, so
    a step 150 ms; its episodes spent 0.9 s (train) + 0.3 s (val) in the env's phases, 120 ms a step; captures and
    seed epochs are the rounds' means."""
    module = _throughput_module()
    setup = module.Setup(
        envs=2,
        gpus=0,
        task="synthetic",
        train_size=100,
        val_size=None,
        batch_size=10,
        max_epochs=10,
        episodes_per_env=2,
        rounds=3,
        bare_seconds=0.0,
        slots=("r0c1",),
        model="cpu",
    )
    rows = [
        {
            "env_runners": {
                "esper/runner_sample_seconds": 3.0,
                "esper/time_train": 0.9,
                "esper/time_val": 0.3,
                "esper/graph_captures": captures,
                "esper/seed_epochs": seeds,
            }
        }
        for captures, seeds in ((4.0, 6.0), (6.0, 8.0))
    ]
    work = module.episode_work(rows, setup)
    assert work["ms_per_step_in_env"] == pytest.approx(120.0)
    assert work["ms_per_step_outside_env"] == pytest.approx(30.0)
    assert work["captures_per_episode"] == 5.0 and work["seed_epochs_per_episode"] == 7.0


def test_the_steady_rounds_name_each_cards_runner_pace_and_the_learners_card():
    """cards on three constructed rounds of a 2-GPU run: the runners on GPU 0 took 5.2, 5.4 and 5.3 s, those on GPU 1
    4.9 s each, except that the last round has none on GPU 1; the learner updated on GPU 0. A CPU run has neither."""
    module = _throughput_module()
    rows = [
        {
            "env_runners": {
                "esper/runner_sample_seconds_gpu_0": a,
                **({"esper/runner_sample_seconds_gpu_1": b} if b else {}),
            },
            "learners": {"default_policy": {"esper/learner_gpu": 0.0}},
        }
        for a, b in ((5.2, 4.9), (5.4, 4.9), (5.3, None))
    ]
    found = module.cards(rows)
    assert found["runner_sample_seconds_by_gpu"] == {"0": pytest.approx(5.3), "1": pytest.approx(4.9)}
    assert found["learner_gpu"] == "0"
    assert module.cards([{"env_runners": {"esper/runner_sample_seconds": 3.0}}]) == {}


def test_the_train_halfs_pace_splits_into_sampling_and_what_the_rounds_lose():
    """sampling_split on constructed figures: 4 envs, 2 episodes of 10 epochs a round, so 20 steps a sample call of
    2.5 s on average: 32 steps/s while sampling; the rounds made 28.8 steps/s, 10 % less."""
    module = _throughput_module()
    setup = module.Setup(
        envs=4,
        gpus=0,
        task="synthetic",
        train_size=100,
        val_size=None,
        batch_size=10,
        max_epochs=10,
        episodes_per_env=2,
        rounds=3,
        bare_seconds=0.0,
        slots=("r0c1",),
        model="cpu",
    )
    split = module.sampling_split({"runner_sample_seconds_mean": 2.5, "env_steps_per_s": 28.8}, setup)
    assert split["sampling_env_steps_per_s"] == pytest.approx(32.0)
    assert split["outside_sampling_share"] == pytest.approx(0.1)


def test_runners_asked_to_profile_write_one_file_a_sample_call_and_the_summary_merges_the_steady_ones(
    tmp_path, monkeypatch
):
    """ESPER_RAY_PROFILE_SAMPLING makes an env runner profile each sample call into one file; profile_summary merges
    the calls from the second on (the first round captures graphs) and reads like pstats."""
    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.train.rllib.env_runner import PROFILE_ENV, CpuPolicyEnvRunner
    from esper_ray.train.rllib.ppo_config import build_ppo_config

    monkeypatch.setenv(PROFILE_ENV, str(tmp_path))
    cfg = TrainConfig(max_epochs=2)
    runner = CpuPolicyEnvRunner(config=build_ppo_config(cfg), worker_index=1, num_workers=cfg.envs)
    for _ in range(3):
        runner.sample(num_episodes=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"runner_1_call_{n}.prof" for n in (1, 2, 3)]
    summary = _throughput_module().profile_summary(tmp_path, dump=tmp_path / "steady.prof")
    assert summary.startswith("2 sample calls of 1 env runner (calls 2 on)")
    assert "_sample" in summary and "function calls" in summary
    merged = pstats.Stats(str(tmp_path / "steady.prof"))  # the two steady calls, callers and all
    samples = [v for (_, _, name), v in merged.stats.items() if name == "_sample"]  # type: ignore[attr-defined]
    assert samples and samples[0][0] == 2 and samples[0][4]  # called twice, with its callers
    assert "no sample call profiles" in _throughput_module().profile_summary(tmp_path, first_call=4)


def test_a_runner_given_a_gpu_times_its_sample_calls_under_that_cards_id_and_one_without_does_not(monkeypatch):
    """The card a runner's envs train on is the one GPU it sees (here declared: this runner samples on the CPU); its
    sample calls are logged under that id beside the runner-wide mean, which one call makes the same figure."""
    from esper_ray.contracts import metrics as m
    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.train.rllib.env_runner import CpuPolicyEnvRunner
    from esper_ray.train.rllib.ppo_config import build_ppo_config

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    for gpus, expected in ((0.25, [m.RUNNER_SAMPLE_SECONDS_ON_GPU + "1"]), (0.0, [])):
        cfg = TrainConfig(max_epochs=2, gpus_per_env=gpus)
        runner = CpuPolicyEnvRunner(config=build_ppo_config(cfg), worker_index=1, num_workers=cfg.envs)
        runner.sample(num_episodes=1)
        stats = runner.get_metrics()  # the runner's own statistics, before the driver reduces them over runners
        assert [k for k in stats if k.startswith(m.RUNNER_SAMPLE_SECONDS_ON_GPU)] == expected
        for key in expected:
            assert stats[key].peek() == pytest.approx(stats[m.RUNNER_SAMPLE_SECONDS].peek()) and stats[key].peek() > 0
        runner.stop()


def test_a_result_names_the_checkouts_commit_and_no_commit_for_a_copy_inside_another_checkout(tmp_path):
    """A copy of the tree made with `git archive | tar -x` inside another checkout (as the side-by-side runs do) has
    no commit of its own: naming the outer checkout's would put the wrong code's name on its figures."""
    import shutil

    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    assert _throughput_module().commit().rstrip("+") == head
    outer = tmp_path / "outer"
    (outer / "copy" / "benchmarks").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "outer"],
        cwd=outer,
        check=True,
    )
    copy = outer / "copy" / "benchmarks" / "throughput.py"
    shutil.copy(REPO / "benchmarks" / "throughput.py", copy)
    assert _throughput_module(copy, "throughput_copy").commit() is None


def test_the_train_half_sees_only_the_gpus_asked_for_as_the_bare_half_does():
    ids = _throughput_module().gpu_ids
    assert ids(None, 1) == ["0"] and ids(None, 2) == ["0", "1"]  # a 4-GPU machine, --gpus 1 / 2: not all four
    assert ids("2,3,1", 2) == ["2", "3"]  # the first of what the caller made visible
    with pytest.raises(ValueError, match=r"--gpus 4: only 2 GPU\(s\) visible"):
        ids("0,1", 4)


def _ab_wall_module():
    _throughput_module(name="throughput")  # ab_wall imports its sibling by that name
    return _throughput_module(REPO / "benchmarks" / "ab_wall.py", "ab_wall_script")


def test_ab_wall_cuts_the_rounds_of_a_copy_that_still_reads_as_the_same_experiment(tmp_path):
    from esper_ray.experiments.spec import ExperimentSpec

    source = REPO / "tune_configs" / "text.yaml"
    copy = _ab_wall_module().experiment_copy(source, tmp_path, rounds=2)
    original, cut = ExperimentSpec.from_yaml(source), ExperimentSpec.from_yaml(copy)
    assert (cut.rounds, cut.last_rounds) == (2, 2) and original.rounds == 60  # last_rounds 3 would refuse 2 rounds
    assert (cut.arms, cut.seeds, cut.training, cut.compare) == (
        original.arms,
        original.seeds,
        original.training,
        original.compare,
    )


def test_ab_wall_moves_a_cpu_files_envs_onto_a_gpu_share_and_leaves_the_rest_as_it_was(tmp_path):
    from esper_ray.experiments.spec import ExperimentSpec

    source = REPO / "tune_configs" / "controllers.yaml"
    copy = _ab_wall_module().experiment_copy(source, tmp_path, gpus_per_env=0.0625)
    original, moved = ExperimentSpec.from_yaml(source), ExperimentSpec.from_yaml(copy)
    assert "gpus_per_env" not in original.training and "mps" not in original.training  # the file: CPUs only
    assert (moved.training["gpus_per_env"], moved.training["mps"]) == (0.0625, True)
    rest = {k: v for k, v in moved.training.items() if k not in ("gpus_per_env", "mps")}
    assert rest == original.training and moved.rounds == original.rounds
    assert (moved.arms, moved.seeds, moved.compare) == (original.arms, original.seeds, original.compare)


FAKE_AB = """import json, os, signal, sys, time
out = sys.argv[sys.argv.index("--output") + 1]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "calls.jsonl"), "a") as calls:
    calls.write(json.dumps({"argv": sys.argv[3:], "visible": os.environ["CUDA_VISIBLE_DEVICES"]}) + "\\n")
resume = "--resume" in sys.argv
print("trials at once on 2 CPU, 0 GPU: 1 ppo trial at once", flush=True)
print("[  0m00s] started  ppo/seed0 (1 running, 0/2 done)", flush=True)  # Tune's clock starts about now
trials = [{"status": "finished"}, {"status": "finished" if resume else "incomplete"}]
with open(os.path.join(out, "results.json"), "w") as results:
    json.dump({"trials": trials}, results)
with open(os.path.join(out, "report.md"), "w") as report:
    report.write("report")
if not resume:  # the first call runs until it is stopped, and stops as esper-ray ab does on SIGTERM
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    time.sleep(60)
"""


def test_ab_wall_stops_a_run_resumes_it_on_the_first_cards_and_sums_its_walls(tmp_path, monkeypatch):
    """An `esper-ray ab` double (its command line, exit codes and files): stopped after 1 s by SIGTERM, resumed by
    the next call with --resume on the same first 2 of the 3 visible cards, walls summed; a third call runs nothing."""
    ab_wall = _ab_wall_module()
    fake = tmp_path / "fake_python"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_AB)  # called as `python -c CODE ab FILE --output DIR`
    fake.chmod(0o755)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0,1")
    output, experiment = tmp_path / "g2", REPO / "tune_configs" / "smoke.yaml"
    first = ab_wall.measure(experiment, 2, output, stop_after=1.0, python=str(fake))
    assert first["exit_codes"] == [143] and first["calls"] == 1 and not first["report"]
    assert (first["trials_done"], first["trials"]) == (1, 2)
    assert 1.0 <= first["wall_s"] < 30  # stopped, not left to sleep
    second = ab_wall.measure(experiment, 2, output, stop_after=30.0, python=str(fake))
    assert second["exit_codes"] == [143, 0] and second["report"] and second["trials_done"] == 2
    assert second["wall_s"] == round(sum(second["walls_s"]), 1) and second["concurrency"].startswith("trials at once")
    assert len(second["cpu_busy"]) == 2 and all(b is None or 0 <= b <= 1 for b in second["cpu_busy"])
    first_call = second["outside_tune"][0]  # its one progress line came before the sleep that SIGTERM cut
    assert 0 <= first_call["before_tune_s"] < second["walls_s"][0]
    assert 0 < first_call["after_last_event_s"] <= second["walls_s"][0]  # the wait for SIGTERM came after the line
    assert "[  0m00s] started  ppo/seed0" in (output / "ab.log").read_text()  # the output still reaches the log
    assert ab_wall.measure(experiment, 2, output, stop_after=30.0, python=str(fake))["calls"] == 2  # done: no call
    calls = [json.loads(line) for line in (output / "run" / "calls.jsonl").read_text().splitlines()]
    assert [c["visible"] for c in calls] == ["2,0", "2,0"]
    assert calls[0]["argv"] == ["ab", str(experiment), "--output", str(output / "run")]
    assert calls[1]["argv"] == calls[0]["argv"] + ["--resume"]


def test_ab_wall_warms_up_on_a_one_round_copy_in_its_own_folder_once(tmp_path, monkeypatch):
    """The warm-up runs a copy of the file with rounds 1 on the cards asked, in OUTPUT/warmup; a finished one is not
    run again."""
    ab_wall = _ab_wall_module()
    fake = tmp_path / "fake_python"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_AB.replace("if not resume:", "if False:"))  # runs to its end
    fake.chmod(0o755)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    warm = tmp_path / "warmup"
    first = ab_wall.warm_up(REPO / "tune_configs" / "smoke.yaml", warm, 2, None, stop_after=30.0, python=str(fake))
    assert first["gpus"] == 2 and first["report"]
    assert json.loads((warm / ab_wall.STATE).read_text())["walls"] == [first["wall_s"]]  # its one call's wall, kept
    calls = [json.loads(line) for line in (warm / "run" / "calls.jsonl").read_text().splitlines()]
    copy = warm / "smoke_rounds1.yaml"
    assert [c["argv"][1] for c in calls] == [str(copy)] and calls[0]["visible"] == "0,1"
    assert yaml.safe_load(copy.read_text())["rounds"] == 1
    assert ab_wall.warm_up(REPO / "tune_configs" / "smoke.yaml", warm, 2, None, 30.0, python=str(fake)) == first
    assert len((warm / "run" / "calls.jsonl").read_text().splitlines()) == 1  # done: not run again


AB_LOG = """esper-ray ab: text: arms ppo (ppo), none (none) x 2 seeds = 4 trials
[  0m11s] started  ppo/seed1 (1 running, 0/4 done)
[  0m20s]          ppo/seed1 round 1/3: rollout acc 40.0%
esper-ray ab: text: arms ppo (ppo), none (none) x 2 seeds = 4 trials
[  0m05s] started  ppo/seed0 (1 running, 0/4 done)
[  0m06s] started  none/seed0 (2 running, 0/4 done)
[  0m19s]          ppo/seed1 round 2/3: rollout acc 41.0%; about 1m00s left
[  0m30s]          ppo/seed0 round 1/3: rollout acc 40.5%; its setup 4 s (env runners up after 2 s, then built in 1 s); about 50s left
[  0m31s]          none/seed0 evaluation: test acc 38.1% over 2 episodes, +0 params
[  0m31s] finished none/seed0 (1/4 done)
[  1m12s] started  ppo/seed2 (2 running, 1/4 done)
[  1m20s]          ppo/seed2 round 1/3: rollout acc 39.0%; its setup 12 s
[  1m50s]          ppo/seed0 round 3/3: rollout acc 42.0%; evaluation: test acc 41.0% over 2 episodes, +9 params
[  2m15s]          ppo/seed2 round 3/3: rollout acc 43.0%
"""  # noqa: E501  (progress lines as `esper-ray ab` prints them)


def test_ab_wall_says_where_the_last_call_went_from_the_progress_lines(tmp_path):
    """Only the last call's PPO trials that started in it: ppo/seed1 began in the first call, none/seed0 has no
    rounds; ppo/seed0 started at 5 s after a 4 s setup, round 1 at 30 s, round 3 at 110 s; ppo/seed2 at 72 s after
    12 s of setup, 80 and 135 s."""
    ab_wall = _ab_wall_module()
    log = tmp_path / "ab.log"
    log.write_text(AB_LOG)
    assert ab_wall.ppo_timeline(log) == {
        "ppo_trials_started_s": [5, 72],
        "ppo_first_round_s": [8, 25],
        "ppo_later_rounds_s": [55, 80],
        "ppo_setup_s": [4, 12],
        "ppo_env_runners_up_s": [2],
        "ppo_env_runner_init_s": [1],
    }
    log.write_text(
        AB_LOG.replace("; its setup 4 s (env runners up after 2 s, then built in 1 s)", "").replace(
            "; its setup 12 s", ""
        )
    )  # a run from before the setups were printed
    assert "ppo_setup_s" not in ab_wall.ppo_timeline(log)
    log.write_text(AB_LOG.split("[  0m05s]")[0])  # a last call with no PPO trial started in it
    assert ab_wall.ppo_timeline(log) is None
    assert ab_wall.ppo_timeline(tmp_path / "absent.log") is None


def test_ab_wall_places_tunes_start_and_the_report_from_when_the_progress_lines_arrive():
    """A line stamped 0m05s that arrives 12.0 s into the call: Tune started 7 s in. The last progress line at 80.5 s
    of a 100.0 s call leaves 19.5 s for the report and the exit. Other lines move nothing."""
    ab_wall = _ab_wall_module()
    clock = ab_wall.TuneClock()
    assert clock.outside(100.0) is None  # no progress line: nothing to say
    clock.see("esper-ray ab: text: arms ppo (ppo)\n", 3.0)
    clock.see("[  0m05s] started  ppo/seed0 (1 running, 0/4 done)\n", 12.0)
    clock.see("[  1m10s]          ppo/seed0 round 1/3: rollout acc 40.0%\n", 77.3)
    clock.see("[  1m13s] finished ppo/seed0 (1/4 done)\n", 80.5)
    clock.see("report: /tmp/x/report.md\n", 95.0)
    assert clock.outside(100.0) == {"before_tune_s": 7.0, "after_last_event_s": 19.5}


def test_ab_wall_reads_the_machine_s_busy_cpu_share_from_proc_stat(tmp_path):
    """user nice system idle iowait irq softirq steal (guest after: already in user): busy is all but idle and
    iowait. Between the two readings: 300 busy ticks of 400."""
    ab_wall = _ab_wall_module()
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 7 0\ncpu0 1 2 3 4 5 6 7 8\n")
    before = ab_wall.cpu_times(stat)
    assert before == (150, 1000)
    stat.write_text("cpu  300 0 150 880 70 0 0 0 9 0\ncpu0 1 2 3 4 5 6 7 8\n")
    assert ab_wall.busy_share(before, ab_wall.cpu_times(stat)) == pytest.approx(300 / 400)
    assert ab_wall.cpu_times(tmp_path / "absent") is None and ab_wall.busy_share(None, before) is None


@pytest.fixture(scope="module")
def h200_bf16() -> dict:
    return roofline("--card", "H200", "--samples-per-s", "500000", "--precision", "bf16")


def test_roofline_training_flops_are_three_forwards_of_a_hand_count(h200_bf16):
    assert h200_bf16["val_flops"] == HAND_FORWARD_FLOPS == 1_622_656
    assert h200_bf16["train_flops"] == 3 * h200_bf16["val_flops"]
    # a step trains 12,500 samples and validates 10,000 (one configuration with no seed): 0.8 per training sample
    assert h200_bf16["step_flops"] == pytest.approx(3 * HAND_FORWARD_FLOPS + 0.8 * HAND_FORWARD_FLOPS)


def test_roofline_activation_bytes_follow_the_layer_shapes_and_halve_in_bf16():
    report = roofline()
    assert report["activation_elements"] == HAND_ACTIVATIONS
    fp32, bf16 = report["precisions"]["fp32"], report["precisions"]["bf16"]
    assert fp32["forward_activation_bytes"] == 4 * HAND_ACTIVATIONS
    assert bf16["forward_activation_bytes"] * 2 == fp32["forward_activation_bytes"]
    assert bf16["intensity"] == pytest.approx(2 * fp32["intensity"], rel=0.01)  # weights (fp32 in both) are < 1 %
    assert report["card"] is None and "roof" not in fp32  # no card named on a CPU: per-sample figures only


def test_roofline_fraction_is_samples_per_s_times_flops_per_sample_over_the_roof(h200_bf16):
    bf16 = h200_bf16["precisions"]["bf16"]
    achieved = 500_000 * h200_bf16["step_flops"]
    assert bf16["fraction_of_peak"] == pytest.approx(achieved / H200_BF16_DENSE)
    assert bf16["fraction_of_bandwidth"] == pytest.approx(500_000 * bf16["step_bytes"] / H200_BANDWIDTH)
    roof = min(H200_BF16_DENSE, bf16["intensity"] * H200_BANDWIDTH)
    assert bf16["fraction_of_roof"] == pytest.approx(achieved / roof)


def test_roofline_from_a_results_file_takes_its_card_precision_and_rate_per_gpu(tmp_path):
    record = {
        "machine": {"card": "NVIDIA H100 80GB HBM3"},
        "setup": {"envs": 8, "gpus": 2, "train_size": 100_000, "val_size": 10_000, "extra_env": [["amp", "bf16"]]},
        "with_mps": {"train_samples_per_s": 1_000_000},
    }
    results = tmp_path / "throughput.jsonl"
    results.write_text(json.dumps({"label": "no train figures"}) + "\n" + json.dumps(record) + "\n")
    report = roofline("--from", str(results))
    assert report["card"] == "H100-SXM" and report["samples_per_s"] == 500_000
    assert list(report["precisions"]) == ["bf16"]
    assert report["train_size"] == 12_500 and report["val_size"] == 10_000
    assert report["precisions"]["bf16"]["fraction_of_bandwidth"] == pytest.approx(
        500_000 * report["precisions"]["bf16"]["step_bytes"] / 3.35e12
    )


def test_roofline_reads_the_precision_a_results_file_resolved_and_fp32_from_older_files(tmp_path):
    record = {
        "machine": {"card": "NVIDIA H200"},
        "setup": {"envs": 4, "gpus": 1, "train_size": 50_000, "val_size": 10_000, "extra_env": [], "precision": "bf16"},
        "with_mps": {"train_samples_per_s": 600_000},
    }
    older = {**record, "setup": {k: v for k, v in record["setup"].items() if k != "precision"}}  # before amp=auto
    results = tmp_path / "throughput.jsonl"
    results.write_text(json.dumps(record) + "\n" + json.dumps(older) + "\n")
    assert list(roofline("--from", str(results), "--line", "1")["precisions"]) == ["bf16"]
    assert list(roofline("--from", str(results), "--line", "2")["precisions"]) == ["fp32"]


# ------------------------------------------------------------------------------- benchmarks/ and its results files
# Issue 33: benchmarks/ holds what a user runs, each script named in its folder's README; every results file names
# its card in its name and its commit inside (benchmarks/README.md, "Results").
BENCHMARKS = REPO / "benchmarks"
CARDS = {"h100": "H100", "h200": "H200", "a100": "A100", "b200": "B200", "cpu": "no GPU"}  # add a new card here
NAME_CARD = re.compile(r"(?:^|_)(" + "|".join(CARDS) + r")(?:x\d+)?(?=_|$)")
SHA = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")


def result_files() -> list[Path]:
    return sorted(p for p in (BENCHMARKS / "results").iterdir() if p.is_file())


def json_lines(path: Path) -> list[dict] | None:
    """The file's lines as JSON objects, or None for a text file."""
    if path.suffix not in (".json", ".jsonl"):
        return None
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def names_a_commit(record: dict) -> bool:
    machine = record.get("machine") if isinstance(record.get("machine"), dict) else {}
    if machine.get("commit") or record.get("commit") or record.get("commit_recorded_after_the_fact"):
        return True
    return any(SHA.search(str(record.get(key) or "")) for key in ("code", "note", "label"))


def test_every_script_in_benchmarks_and_its_probes_is_named_in_that_folders_readme():
    for folder in (BENCHMARKS, BENCHMARKS / "probes"):
        readme = (folder / "README.md").read_text()
        scripts = sorted(p.name for p in folder.iterdir() if p.suffix in (".py", ".sh"))
        assert scripts, folder
        assert [s for s in scripts if f"`{s}`" not in readme] == [], folder


def test_every_results_file_names_its_card_in_its_name_and_the_card_is_in_its_content():
    files = result_files()
    assert files
    for path in files:
        cards = NAME_CARD.findall(path.stem)
        assert cards, f"{path.name}: no card in the name ({', '.join(CARDS)}, e.g. throughput_h200x2_DATE.jsonl)"
        text = path.read_text()
        for card in cards:
            assert CARDS[card].lower() in text.lower(), f"{path.name} names {card}, its content does not"


def test_every_json_line_of_the_results_names_its_commit_and_a_card_of_its_files_name():
    for path in result_files():
        records = json_lines(path)
        if records is None:
            continue
        cards = {CARDS[c] for c in NAME_CARD.findall(path.stem)}
        for number, record in enumerate(records, 1):
            assert names_a_commit(record), f"{path.name} line {number}: no commit (machine.commit, or a note saying it)"
            machine = record.get("machine") if isinstance(record.get("machine"), dict) else {}
            card = str(record.get("card") or machine.get("card") or "")
            assert any(c.lower() in card.lower() for c in cards), f"{path.name} line {number}: card {card!r}"


def test_every_text_file_of_the_results_names_its_commit_in_its_first_lines():
    for path in result_files():
        if json_lines(path) is None:
            head = path.read_text().splitlines()[:3]
            assert any(SHA.search(line) for line in head), f"{path.name}: no commit in its first three lines"
