"""Throughput of the envs stepping bare against the same envs inside `esper-ray train`, on this machine.

    python benchmarks/throughput.py                       # CPU: the default `esper-ray train` settings (CI smoke test)
    python benchmarks/throughput.py --gpu                 # one GPU, 4 envs (CIFAR-shaped uint8 data, same work per env)
    python benchmarks/throughput.py --gpu --gpus 2        # equal work per env on two GPUs
    python benchmarks/throughput.py --gpu --mps-only --envs-per-gpu 12 --lead   # 12 envs a card, runners leading

`bare`: one process an env, each stepping its own shard with a random controller (`--bare-controller none`: the host
alone). `train`: `esper-ray train` with the same envs and GPU shares, at steady state. Both report env steps/s and host
training samples/s; `train_over_bare` is their ratio (1.0 = the RL costs nothing). Main flags: `--gpus G`,
`--envs-per-gpu E`, `--mps`/`--mps-only`, `--overlap`, `--lead` (implies `--overlap`), `--only bare|train`,
`--env KEY=VALUE` (both halves; `max_seeds=0` gives both the host alone), `--profile-runners DIR`. Progress goes to
stderr; the last stdout line is one JSON object. docs/performance.md explains its fields.

To measure other code side by side, run this script from that code's own copy of the tree: Ray's workers import
esper_ray from the driver's working directory, so a copy put first on PYTHONPATH would reach the bare half only.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import multiprocessing as mp
import os
import platform
import pstats
import queue
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

HALVES = ("bare", "train")


@dataclass(frozen=True)
class Setup:
    envs: int
    gpus: int
    task: str
    train_size: int
    """Training samples of all envs together (each env gets train_size / envs)."""
    val_size: int | None
    """Validation samples of the synthetic task; each env validates on all of them, so this stays fixed whatever the
    number of envs (equal work per env). None for a real task."""
    batch_size: int
    max_epochs: int
    episodes_per_env: int
    rounds: int
    bare_seconds: float
    slots: tuple[str, ...]
    model: str
    cuda_graphs: bool = True
    learner_gpus: float = 0.0
    learner_cpus: float | None = None
    """CPUs of the train half's learner (its torch threads; TrainConfig.learner_cpus): a CPU learner needs some."""
    cpus_per_env: float | None = None
    overlap: bool = False
    """The train half's learner trains on round k while the envs sample round k+1 (TrainConfig.overlap)."""
    lead: bool = False
    """The train half's env runners start each next round once done with their own (TrainConfig.lead)."""
    extra_env: tuple[tuple[str, Any], ...] = ()
    """Further env settings for both halves (--env KEY=VALUE)."""
    bare_controller: str = "random"
    """The bare envs' controller: random, or none (the host alone, never a capture after the warm-up)."""
    bare_threads: int | None = None
    """torch threads of each bare env process; None: the machine's cores over the envs (a train runner has one a CPU
    it was given: 1 by default)."""
    policy: str = "flat"
    """The train half's policy network (TrainConfig.policy): flat, or slots (attention over slot tokens per step)."""
    envs_per_runner: int = 1
    """Envs per process (TrainConfig.envs_per_runner): more than one steps them as one VectorMorphogeneticEnv, whose
    hosts train stacked (issue 77), in both halves."""

    @property
    def processes(self) -> int:
        """Env processes (env runners) of each half: envs / envs_per_runner."""
        return self.envs // self.envs_per_runner

    @property
    def gpus_per_env(self) -> float:
        """Each GPU's room after one learner's share, split among its env processes (4 of them and a 0.2 learner: 0.2
        each), so every GPU packs the same and the learner fits beside the envs of one of them."""
        if not self.gpus:
            return 0.0
        return int(1000 * (1.0 - self.learner_gpus) / (self.processes // self.gpus)) / 1000

    def env_config(self, shard: int) -> dict[str, Any]:
        config: dict[str, Any] = {
            "task": self.task,
            "slots": list(self.slots),
            "max_epochs": self.max_epochs,
            "batch_size": self.batch_size,
            "shard": shard,
            "num_shards": self.envs,
            "cuda_graphs": self.cuda_graphs,
        }
        if self.task == "synthetic":
            config["synthetic_size"] = self.train_size
            config["synthetic_held_out"] = self.val_size
        if self.gpus:
            config["device"] = "cuda:0"  # the one GPU its process sees (_show_one_gpu)
        return {**config, **dict(self.extra_env)}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return {
        "card": card,
        "gpus_present": torch.cuda.device_count(),
        "cpus": os.cpu_count(),
        "host": platform.node(),
        "torch": torch.__version__,
        "commit": commit(),
    }


def commit() -> str | None:
    """The checkout's commit (with "+" when it has changes), so a figure names the code that gave it."""
    import subprocess

    folder = Path(__file__).resolve().parent
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=folder, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        if Path(top).resolve() != folder.parent:
            return None  # a copy of the tree inside another checkout (`git archive REV | tar -x -C copy`) is not it
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None  # no git here (the device machine's copy, say)
    return head + ("+" if dirty else "")


# ------------------------------------------------------------------------------------------------------ bare
def _show_one_gpu(setup: Setup, shard: int) -> None:
    """As Ray does for an actor with a GPU share: the process sees only its env's GPU, so it makes no CUDA context
    (nor an MPS client) on the others. Before the process's first CUDA call."""
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), setup.gpus)[shard % setup.gpus]


def warmed_up_env(setup: Setup, shard: int) -> tuple[Any, Any, Any]:
    """Env `shard` of the setup, its controller (setup.bare_controller), and the observation it stands at after a
    whole episode of warm-up: CUDA context, cuDNN, graph captures, and the compiled host blocks of each pooling variant
    (fused_block.py; a seed in r0c1 asks for the second), which compile once in an env's life."""
    from esper_ray.env import MorphogeneticEnv
    from esper_ray.policy.baselines import NoGrowthController, RandomController

    env = MorphogeneticEnv(setup.env_config(shard))
    controller = (
        NoGrowthController(env.slot_ids)
        if setup.bare_controller == "none"
        else RandomController(env.slot_ids, seed=shard)
    )
    obs, _ = env.reset(seed=shard)
    steps = 0
    while True:
        obs, _, terminated, _, _ = env.step(controller.act(obs))
        steps += 1
        if terminated:
            obs, _ = env.reset()
            if steps >= 3:
                return env, controller, obs


def graph_captures(env: Any) -> int:
    """CUDA graphs the env has captured so far, train steps and validation passes together."""
    return env.graphs.captures + env.val_graphs.captures


def _bare_worker(setup: Setup, shard: int, threads: int, barrier: Any, results: Any) -> None:
    if setup.gpus:
        _show_one_gpu(setup, shard)
    torch.set_num_threads(threads)
    env, controller, obs = warmed_up_env(setup, shard)
    barrier.wait()
    start, cpu_start, steps, samples = time.perf_counter(), time.process_time(), 0, 0
    # Where the wall goes besides plain steps: resets, and steps that captured a new train or validation graph.
    episodes, reset_s, capture_s, captures = 0, 0.0, 0.0, 0
    seed_epochs, in_env_s = (
        0,
        0.0,
    )  # what the steps asked of the GPU besides the host, and their seconds in the env's phases
    while time.perf_counter() - start < setup.bare_seconds:
        before, t0 = graph_captures(env), time.perf_counter()
        obs, _, terminated, _, info = env.step(controller.act(obs))
        new_graphs = graph_captures(env) - before
        if new_graphs:
            capture_s, captures = capture_s + time.perf_counter() - t0, captures + new_graphs
        steps, samples = steps + 1, samples + int(info["train_total"])
        seed_epochs += info["seed_params"] > 0
        in_env_s += sum(v for k, v in info.items() if k.startswith("time/"))
        if terminated:
            t0 = time.perf_counter()
            obs, _ = env.reset()
            episodes, reset_s = episodes + 1, reset_s + time.perf_counter() - t0
    wall = time.perf_counter() - start
    results.put(
        (
            shard,
            steps,
            samples,
            wall,
            (time.process_time() - cpu_start) / wall,
            {
                "reset_share": reset_s / wall,
                "capturing_steps_share": capture_s / wall,
                "captures_per_episode": captures / max(episodes, 1),
                "ms_per_reset": 1e3 * reset_s / max(episodes, 1),
                "seed_epochs_per_episode": seed_epochs * setup.max_epochs / max(steps, 1),
                "ms_per_step_in_env": 1e3 * in_env_s / max(steps, 1),
                "threads_per_env": torch.get_num_threads(),
            },
        )
    )


def vector_captures(vector: Any) -> int:
    """Graphs a VectorMorphogeneticEnv captured: its envs' own and its held stacks' (env/held_stack.py)."""
    return sum(graph_captures(env) for env in vector.envs) + vector.stacked_captures


def _bare_vector_worker(setup: Setup, runner: int, threads: int, barrier: Any, results: Any) -> None:
    """_bare_worker's figures for one process of `setup.envs_per_runner` envs (shards runner * N ...) stepped as one
    VectorMorphogeneticEnv, each env with its own controller. A reset is the next step of an env whose episode ended
    (NEXT_STEP autoreset), inside that step: each env's reset is timed where the vector env calls it."""
    from gymnasium.vector.utils import iterate

    from esper_ray.env.vector_env import VectorMorphogeneticEnv
    from esper_ray.policy.baselines import NoGrowthController, RandomController

    if setup.gpus:
        _show_one_gpu(setup, runner)
    torch.set_num_threads(threads)
    n = setup.envs_per_runner
    shards = [runner * n + i for i in range(n)]
    vector = VectorMorphogeneticEnv.of_configs([setup.env_config(shard) for shard in shards])
    controllers = [
        NoGrowthController(env.slot_ids) if setup.bare_controller == "none" else RandomController(env.slot_ids, seed=k)
        for env, k in zip(vector.envs, shards, strict=True)
    ]
    obs, _ = vector.reset(seed=shards[0])
    resets = {"count": 0, "seconds": 0.0}

    def timed_reset(reset: Callable[..., Any], **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = reset(**kwargs)
        resets["count"], resets["seconds"] = resets["count"] + 1, resets["seconds"] + time.perf_counter() - t0
        return out

    for env in vector.envs:
        env.reset = functools.partial(timed_reset, env.reset)  # type: ignore[method-assign]

    def step() -> tuple[Any, dict[str, Any]]:
        actions = [c.act(o) for c, o in zip(controllers, iterate(vector.single_observation_space, obs), strict=True)]
        out = vector.step(np.stack(actions))
        return out[0], out[4]

    done = np.zeros(n, dtype=bool)
    while not done.all():  # a whole episode of every env: warm-up (CUDA context, cuDNN, captures, compiles)
        obs, info = step()
        done |= info.get("epoch", np.ones(n)) == 0
    stacked_before, builds_before, vector_steps = sum(vector.stacked_epochs), vector.stack_builds, 0
    resets.update(count=0, seconds=0.0)
    barrier.wait()
    start, cpu_start, steps, samples, seed_epochs, in_env_s = time.perf_counter(), time.process_time(), 0, 0, 0, 0.0
    capture_s, captures = 0.0, 0
    while time.perf_counter() - start < setup.bare_seconds:
        before, t0 = vector_captures(vector), time.perf_counter()
        obs, info = step()
        vector_steps += 1
        new_graphs = vector_captures(vector) - before
        if new_graphs:
            capture_s, captures = capture_s + time.perf_counter() - t0, captures + new_graphs
        stepped = info.get("_train_total")  # absent where every env reset this step
        if stepped is None:
            continue
        steps, samples = steps + int(stepped.sum()), samples + int(info["train_total"][stepped].sum())
        seed_epochs += int((info["seed_params"][stepped] > 0).sum())
        in_env_s += sum(float(v[info["_" + k]].sum()) for k, v in info.items() if k.startswith("time/"))
    wall = time.perf_counter() - start
    results.put(
        (
            runner,
            steps,
            samples,
            wall,
            (time.process_time() - cpu_start) / wall,
            {
                "reset_share": resets["seconds"] / wall,
                "capturing_steps_share": capture_s / wall,
                "captures_per_episode": captures / max(resets["count"], 1),
                "ms_per_reset": 1e3 * resets["seconds"] / max(resets["count"], 1),
                "seed_epochs_per_episode": seed_epochs * setup.max_epochs / max(steps, 1),
                "ms_per_step_in_env": 1e3 * in_env_s / max(steps, 1),
                "threads_per_env": torch.get_num_threads(),
                "stacked_epoch_share": (sum(vector.stacked_epochs) - stacked_before) / max(steps, 1),
                "stack_builds_per_step": (vector.stack_builds - builds_before) / max(vector_steps, 1),
            },
        )
    )


def run_processes(target: Callable[..., None], n: int, args: Callable[[int], tuple[Any, ...]]) -> list[Any]:
    """target(*args(k), barrier, results) in n spawned processes k = 0..n-1 (each waits at the barrier, then puts
    one result); their results. A process that dies first (an import error, out of memory) raises here instead of
    hanging the benchmark."""
    context = mp.get_context("spawn")
    barrier, results = context.Barrier(n), context.Queue()
    workers = [context.Process(target=target, args=(*args(k), barrier, results)) for k in range(n)]
    for w in workers:
        w.start()
    outcomes: list[Any] = []
    while len(outcomes) < n:
        try:
            outcomes.append(results.get(timeout=5))
        except queue.Empty:
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed:
                for w in workers:
                    w.kill()
                raise RuntimeError(f"an env process failed (exit codes {failed}); its traceback is above") from None
    for w in workers:
        w.join()
    return outcomes


def bare(setup: Setup) -> dict[str, float]:
    threads = setup.bare_threads or max(1, (os.cpu_count() or 1) // setup.processes)
    worker = _bare_worker if setup.envs_per_runner == 1 else _bare_vector_worker
    outcomes = run_processes(worker, setup.processes, lambda k: (setup, k, threads))
    seconds = max(o[3] for o in outcomes)
    figures = {
        "env_steps_per_s": sum(o[1] for o in outcomes) / seconds,
        "samples_per_s": sum(o[2] for o in outcomes) / seconds,
        # CPU seconds per second of each env process (its threads together; a CUDA sync spins, so it counts)
        "cpu_busy_per_env": sum(o[4] for o in outcomes) / len(outcomes),
        **{k: sum(o[5][k] for o in outcomes) / len(outcomes) for k in outcomes[0][5]},
    }  # per env, averaged
    if setup.gpus > 1:  # does one GPU lag the others?
        figures["samples_per_s_by_gpu"] = [
            sum(o[2] for o in outcomes if o[0] % setup.gpus == g) / seconds for g in range(setup.gpus)
        ]
    return figures


# ----------------------------------------------------------------------------------------------------- train
def train(setup: Setup, mps: bool) -> dict[str, float]:
    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.train.commands.runner import run_training

    env = {
        k: v
        for k, v in setup.env_config(0).items()
        if k not in ("task", "slots", "max_epochs", "shard", "num_shards", "device")
    }
    cfg = TrainConfig(
        task=setup.task,
        slots=setup.slots,
        max_epochs=setup.max_epochs,
        envs=setup.envs,
        envs_per_runner=setup.envs_per_runner,
        episodes_per_env=setup.episodes_per_env,
        rounds=setup.rounds,
        gpus_per_env=setup.gpus_per_env,
        cpus_per_env=setup.cpus_per_env or max(0.25, min(1.0, (os.cpu_count() or 2) / (setup.processes + 1))),
        learners=1,
        learner_gpus=setup.learner_gpus,
        learner_cpus=setup.learner_cpus,
        model=setup.model,
        policy=setup.policy,
        mps=mps,
        overlap=setup.overlap,
        lead=setup.lead,
        checkpoint_every=0,
        env=env,
    )
    results: list[dict] = []
    ended: list[float] = []  # when each round's result reached the driver's loop

    def record(result: dict) -> None:
        results.append(result)
        ended.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as folder:
        outcome = run_training(cfg, Path(folder) / "run", log=log, on_result=record)
    from esper_ray.contracts import metrics as m
    from esper_ray.train.output.round_summary import flatten_numbers

    last = flatten_numbers(results[-1])
    timers = {
        k: round(v, 4)
        for k, v in last.items()
        if ("timer" in k or "esper/time_" in k or "time_between" in k) and "lifetime" not in k and "throughput" not in k
    }
    log("timers of the last round: " + json.dumps(timers))
    steady = outcome.rounds[1:] or outcome.rounds
    seconds = sum(r.seconds for r in steady)
    steps = sum(r.env_steps for r in steady)
    samples_per_step = setup.train_size / setup.envs
    figures = {
        "env_steps_per_s": steps / seconds,
        "samples_per_s": steps * samples_per_step / seconds,
        "seconds_per_round": seconds / len(steady),
        **runner_waits(results[-len(steady) :], seconds),
        **episode_work(results[-len(steady) :], setup),
        **cards(results[-len(steady) :]),
    }
    if len(ended) > 1:  # the same rounds by the driver's clock: also the work between two algo.train() calls
        wall = ended[-1] - ended[0]
        figures.update(
            wall_env_steps_per_s=steps / wall,
            wall_samples_per_s=steps * samples_per_step / wall,
            between_rounds_share=(wall - seconds) / wall,
        )
    if setup.lead and len(ended) > 1:
        # the steady rounds' sampling began when the first round's episodes reached the driver (its runners then
        # started the second), before that round's train() call ended: counted from there, not from that end
        first = flatten_numbers(results[0])
        began = ended[0] - outcome.rounds[0].seconds + first[m.DRIVER_SAMPLING_SECONDS]
        wall = ended[-1] - began
        figures.update(
            env_steps_per_s=steps / wall,
            samples_per_s=steps * samples_per_step / wall,
            round_led_share=sum(flatten_numbers(r)[f"{m.ENV_RUNNERS}/{m.RUNNER_ROUND_LED}"] for r in results[1:])
            / len(results[1:]),
        )
    return {**figures, **sampling_split(figures, setup)}


def sampling_split(figures: dict[str, float], setup: Setup) -> dict[str, float]:
    """The train half's pace split in two: the envs' steps/s while their runners sample (each runner's steps a round
    over its mean sample call: the env's phases and RLlib's work of each step, the card shared with the other
    runners), and the share of that pace lost outside the sample calls (the rounds: waiting for the slowest,
    collecting, the driver's work, the next round's start). train / bare = (sampling pace / bare) x (1 - that share).
    The share is not clipped at 0: it compares the driver's clock with the runners', so where the rounds lose next
    to nothing it can come out a hair below 0 (-0.002 on an H200), and clipping would break that product."""
    sampling = setup.envs * setup.episodes_per_env * setup.max_epochs / figures["runner_sample_seconds_mean"]
    return {"sampling_env_steps_per_s": sampling, "outside_sampling_share": 1 - figures["env_steps_per_s"] / sampling}


def episode_work(results: list[dict], setup: Setup) -> dict[str, float]:
    """What the episodes of `results` (the steady rounds) asked of the envs, as the bare half counts it: CUDA graphs
    captured and epochs with a seed, per episode (a policy that grows other seeds than the bare half's random controller
    trains another network: train / bare then measures more than overhead), and a step's milliseconds in the env's
    phases against the rest of the runner's sample call (the policy, RLlib's connectors and episodes, the resets)."""
    from esper_ray.contracts import metrics as m
    from esper_ray.train.output.round_summary import flatten_numbers

    rows = [{k.removeprefix(f"{m.ENV_RUNNERS}/"): v for k, v in flatten_numbers(r).items()} for r in results]

    def mean(key: str) -> float:
        return sum(row[key] for row in rows) / len(rows)

    in_env = sum(mean(key) for key in rows[0] if key.startswith(m.PHASE_TIME_PREFIX)) / setup.max_epochs
    per_step = mean(m.RUNNER_SAMPLE_SECONDS) / (setup.episodes_per_env * setup.max_epochs)
    return {
        "captures_per_episode": mean(m.GRAPH_CAPTURES),
        "seed_epochs_per_episode": mean(m.SEED_EPOCHS),
        "ms_per_step_in_env": 1e3 * in_env,
        "ms_per_step_outside_env": 1e3 * (per_step - in_env),
    }


def runner_waits(results: list[dict], seconds: float) -> dict[str, float]:
    """The env runners' sample calls over `results` (the steady rounds, `seconds` of wall): the mean runner's and the
    slowest runner's seconds a round, and the share of the wall the others stood waiting for the slowest."""
    from esper_ray.contracts import metrics as m
    from esper_ray.train.output.round_summary import flatten_numbers

    rows = [flatten_numbers(r) for r in results]
    mean = [row[f"{m.ENV_RUNNERS}/{m.RUNNER_SAMPLE_SECONDS}"] for row in rows]
    slowest = [row[f"{m.ENV_RUNNERS}/{m.RUNNER_SAMPLE_SECONDS_MAX}"] for row in rows]
    waits = {
        "runner_sample_seconds_mean": sum(mean) / len(rows),
        "runner_sample_seconds_max": sum(slowest) / len(rows),
        "waiting_for_the_slowest_share": (sum(slowest) - sum(mean)) / seconds,
    }
    if all(m.DRIVER_SAMPLING_SECONDS in row for row in rows):  # timed by the overlapped PPO only
        sampling = sum(row[m.DRIVER_SAMPLING_SECONDS] for row in rows)
        waits.update(
            collecting_episodes_share=(sampling - sum(slowest)) / seconds,
            after_sampling_share=(seconds - sampling) / seconds,
            weight_send_share=sum(row[m.DRIVER_WEIGHT_SYNC_SECONDS] for row in rows) / seconds,
        )
    return waits


def cards(results: list[dict]) -> dict[str, Any]:
    """Over `results` (the steady rounds): the mean runner's sample call by the GPU its envs train on, and the GPU the
    learner updates on, where the rounds carry them (envs on GPUs; a learner on one). A card whose runners are slower
    than the others' is one where something else runs: the learner's update, for one."""
    from esper_ray.contracts import metrics as m
    from esper_ray.train.output.round_summary import flatten_numbers

    rows = [flatten_numbers(r) for r in results]
    prefix = f"{m.ENV_RUNNERS}/{m.RUNNER_SAMPLE_SECONDS_ON_GPU}"
    out: dict[str, Any] = {}
    keys = sorted({key for row in rows for key in row if key.startswith(prefix)})
    if keys:
        out["runner_sample_seconds_by_gpu"] = {
            key.removeprefix(prefix): sum(row[key] for row in rows if key in row) / sum(key in row for row in rows)
            for key in keys
        }
    learner_key = f"{m.LEARNERS}/{m.DEFAULT_MODULE}/{m.LEARNER_GPU}"  # logged per module (learner.py)
    learner = [row[learner_key] for row in rows if learner_key in row]
    if learner:
        out["learner_gpu"] = str(int(learner[-1]))
    return out


def gpu_ids(visible: str | None, gpus: int) -> list[str]:
    """The GPU ids both halves use: the first `gpus` of CUDA_VISIBLE_DEVICES (or of 0 .. n-1). The train half's Ray
    must see only these, or its env processes spread over every card of the machine
    (esper_ray/train/process/gpu_spread.py): `--gpus 1` on a 4-GPU machine trained on four (tenth session)."""
    from esper_ray.train.process.gpu_spread import gpu_list

    ids = gpu_list(visible) if visible else [str(i) for i in range(gpus)]
    if len(ids) < gpus:
        raise ValueError(f"--gpus {gpus}: only {len(ids)} GPU(s) visible (CUDA_VISIBLE_DEVICES={visible!r})")
    return ids[:gpus]


@contextlib.contextmanager
def local_ray(mps: bool, gpus: int, profiles: Path | None = None):  # type: ignore[no-untyped-def]
    """A local Ray for the train half that sees `gpus` GPUs (with the MPS environment when asked; with `profiles`,
    its env runners profile their sample calls into that folder); the bare half needs none."""
    import ray

    from esper_ray.train.process.gpu_spread import NODE_GPUS_ENV
    from esper_ray.train.process.mps import mps_daemons, mps_environment, new_run_id
    from esper_ray.train.rllib.env_runner import PROFILE_ENV

    env = mps_environment(new_run_id()) if mps else {}
    if profiles is not None:
        env = {**env, PROFILE_ENV: str(profiles.resolve())}
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpus:
        ids = ",".join(gpu_ids(before, gpus))
        os.environ["CUDA_VISIBLE_DEVICES"] = ids  # Ray counts and hands out only these
        env = {**env, NODE_GPUS_ENV: ids}
    ray.init(
        address="local",
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": env} if env else None,
    )
    try:
        with mps_daemons(env) if mps else contextlib.nullcontext():
            yield
    finally:
        ray.shutdown()
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


@contextlib.contextmanager
def bare_mps(mps: bool):  # type: ignore[no-untyped-def]
    """A private daemon for the bare processes (they inherit its pipe folder through the environment)."""
    if not mps:
        yield
        return
    import shutil
    import subprocess

    from esper_ray.train.process.mps import CONTROL, mps_environment, new_run_id

    env = mps_environment(new_run_id())
    for folder in env.values():
        os.makedirs(folder, exist_ok=True)
    subprocess.run([CONTROL, "-d"], env={**os.environ, **env}, check=True, timeout=30)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        subprocess.run([CONTROL], input="quit\n", text=True, env={**os.environ, **env}, timeout=30)
        shutil.rmtree(os.path.dirname(env["CUDA_MPS_PIPE_DIRECTORY"]), ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def profile_summary(folder: Path, first_call: int = 2, lines: int = 40, dump: Path | None = None) -> str:
    """The env runners' profiles in `folder` (one file a sample call: esper_ray/train/rllib/env_runner.py) from call
    `first_call` on (call 1 is the first round, with its captures), merged: the functions by cumulative and by own
    time. With `dump`, the merged profile is also written there, for pstats' callers and callees."""
    files = sorted(p for p in folder.glob("runner_*_call_*.prof") if int(p.stem.rsplit("_", 1)[1]) >= first_call)
    if not files:
        return f"no sample call profiles from call {first_call} on in {folder}"
    stats = pstats.Stats(str(files[0]), stream=io.StringIO())
    for path in files[1:]:
        stats.add(str(path))
    if dump is not None:
        stats.dump_stats(str(dump))
    from esper_ray.formatting import counted

    runners = len({p.stem.split("_call_")[0] for p in files})
    out = io.StringIO()
    out.write(
        f"{counted(len(files), 'sample call')} of {counted(runners, 'env runner')} (calls {first_call} on), merged\n"
    )
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(lines)
    stats.sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def measure(setup: Setup, mps: bool, halves: tuple[str, ...] = HALVES, profiles: Path | None = None) -> dict[str, Any]:
    """The figures of the halves asked for (a half not measured is left out, and so is the ratio). With `profiles`,
    the train half's runners profile their sample calls there and the steady rounds' summary goes to steady.txt."""
    from esper_ray.formatting import counted

    figures: dict[str, Any] = {}
    if "bare" in halves:
        log(
            f"bare: {counted(setup.processes, 'env process', 'env processes')} of {counted(setup.envs, 'env')}"
            f" for {setup.bare_seconds:.0f}s"
            f"{' under MPS' if mps else ''}"
        )
        with bare_mps(mps):
            bare_rate = bare(setup)
        log(f"bare: {bare_rate}")
        figures.update(
            bare_env_steps_per_s=round(bare_rate["env_steps_per_s"], 2),
            bare_samples_per_s=round(bare_rate["samples_per_s"]),
            bare_cpu_busy_per_env=round(bare_rate["cpu_busy_per_env"], 2),
            bare_threads_per_env=bare_rate["threads_per_env"],
            bare_reset_share=round(bare_rate["reset_share"], 3),
            bare_capturing_steps_share=round(bare_rate["capturing_steps_share"], 3),
            bare_captures_per_episode=round(bare_rate["captures_per_episode"], 2),
            bare_ms_per_reset=round(bare_rate["ms_per_reset"], 1),
            bare_seed_epochs_per_episode=round(bare_rate["seed_epochs_per_episode"], 2),
            bare_ms_per_step_in_env=round(bare_rate["ms_per_step_in_env"], 2),
        )
        if "stacked_epoch_share" in bare_rate:  # vector envs: the share of their epochs that trained stacked
            figures["bare_stacked_epoch_share"] = round(bare_rate["stacked_epoch_share"], 3)
            figures["bare_stack_builds_per_step"] = round(bare_rate["stack_builds_per_step"], 3)
        if "samples_per_s_by_gpu" in bare_rate:
            figures["bare_samples_per_s_by_gpu"] = [round(x) for x in bare_rate["samples_per_s_by_gpu"]]
    if "train" in halves:
        log(f"train: {counted(setup.envs, 'env')}, {counted(setup.rounds, 'round')}{' under MPS' if mps else ''}")
        with local_ray(mps, setup.gpus, profiles):
            train_rate = train(setup, mps)
        log(f"train: {train_rate}")
        if profiles is not None:
            (profiles / "steady.txt").write_text(profile_summary(profiles, dump=profiles / "steady.prof"))
            log(f"train: the runners' profiles of the steady rounds in {profiles / 'steady.txt'} (merged: steady.prof)")
        figures.update(
            train_env_steps_per_s=round(train_rate["env_steps_per_s"], 2),
            train_samples_per_s=round(train_rate["samples_per_s"]),
            train_samples_per_s_per_gpu=round(train_rate["samples_per_s"] / max(setup.gpus, 1)),
            train_seconds_per_round=round(train_rate["seconds_per_round"], 2),
            train_runner_sample_seconds_mean=round(train_rate["runner_sample_seconds_mean"], 3),
            train_runner_sample_seconds_max=round(train_rate["runner_sample_seconds_max"], 3),
            train_waiting_for_the_slowest_share=round(train_rate["waiting_for_the_slowest_share"], 3),
        )
        for key in (
            "collecting_episodes_share",
            "after_sampling_share",
            "weight_send_share",
            "between_rounds_share",
            "wall_samples_per_s",
            "round_led_share",
        ):
            if key in train_rate:
                figures[f"train_{key}"] = round(train_rate[key], 3 if key.endswith("share") else None)
        for key in ("captures_per_episode", "seed_epochs_per_episode", "ms_per_step_in_env", "ms_per_step_outside_env"):
            figures[f"train_{key}"] = round(train_rate[key], 2)
        figures["train_outside_sampling_share"] = round(train_rate["outside_sampling_share"], 3)
        if "runner_sample_seconds_by_gpu" in train_rate:
            figures["train_runner_sample_seconds_by_gpu"] = {
                gpu: round(seconds, 3) for gpu, seconds in train_rate["runner_sample_seconds_by_gpu"].items()
            }
        if "learner_gpu" in train_rate:
            figures["train_learner_gpu"] = train_rate["learner_gpu"]
    if "bare" in halves and "train" in halves:
        figures["train_over_bare"] = round(train_rate["env_steps_per_s"] / bare_rate["env_steps_per_s"], 3)
        figures["train_sampling_over_bare"] = round(
            train_rate["sampling_env_steps_per_s"] / bare_rate["env_steps_per_s"], 3
        )
        if "wall_env_steps_per_s" in train_rate:
            figures["train_wall_over_bare"] = round(
                train_rate["wall_env_steps_per_s"] / bare_rate["env_steps_per_s"], 3
            )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="GPU sizes (default: CPU, the default train settings)")
    parser.add_argument(
        "--gpus", type=int, default=1, help="GPUs to use with --gpu (envs per GPU stays --envs-per-gpu)"
    )
    parser.add_argument("--envs-per-gpu", type=int, default=4)
    parser.add_argument(
        "--envs-per-runner",
        type=int,
        default=1,
        help="envs per process, stepped as one vector env whose hosts train stacked (must divide the envs)",
    )
    parser.add_argument(
        "--learner-gpus",
        type=float,
        default=None,
        help="GPU share of the learner with --gpu (default 0.2 on one GPU; 0.1 on several, so that the "
        "envs' share, (1 - this) / envs per GPU, leaves no room for one more env per GPU)",
    )
    parser.add_argument(
        "--learner-cpus",
        type=float,
        default=None,
        help="CPUs of the learner with --gpu, its torch threads (default none reserved: one thread); "
        "with --learner-gpus 0 the learner updates on these",
    )
    parser.add_argument("--mps", action="store_true", help="also measure under a private MPS daemon")
    parser.add_argument("--mps-only", action="store_true", help="measure only under a private MPS daemon")
    parser.add_argument("--overlap", action="store_true", help="the train half overlaps learner updates with sampling")
    parser.add_argument(
        "--lead",
        action="store_true",
        help="the train half's env runners start each next round once done with theirs (implies --overlap)",
    )
    parser.add_argument(
        "--env", action="append", metavar="KEY=VALUE", help="an env setting for both halves (repeatable)"
    )
    parser.add_argument("--no-graphs", action="store_true", help="eager train steps (no CUDA graphs)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--max-epochs",
        type=int,
        default=None,
        help="host epochs an episode (default: 20 with --gpu, else a plain `esper-ray train`'s)",
    )
    parser.add_argument("--cpus-per-env", type=float, default=None, help="CPUs of each env runner in the train half")
    parser.add_argument("--only", choices=("bare", "train"), help="measure one half only (no ratio)")
    parser.add_argument("--bare-seconds", type=float, default=None)
    parser.add_argument(
        "--profile-runners",
        type=Path,
        metavar="DIR",
        help="the train half's env runners profile their sample calls (cProfile, one file a call) into "
        "DIR/with_mps or DIR/without_mps; the steady rounds' merged summary goes to steady.txt there",
    )
    parser.add_argument(
        "--bare-threads",
        type=int,
        default=None,
        help="torch threads of each bare env process (default: the cores over the envs; a train runner "
        "has one a CPU it was given, 1 by default)",
    )
    parser.add_argument(
        "--bare-controller",
        choices=("random", "none"),
        default="random",
        help="the bare envs' controller (default random; none: the host alone, so no step after the "
        "warm-up captures a graph: what the envs make without capture costs)",
    )
    parser.add_argument(
        "--policy",
        choices=("flat", "slots"),
        default="flat",
        help="the train half's policy network (default flat; slots: the slot-shared one, attention each step)",
    )
    args = parser.parse_args()
    halves = (args.only,) if args.only else HALVES
    from esper_ray.cli import parse_env_overrides

    extra_env = tuple(sorted(parse_env_overrides(args.env).items()))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.gpu:
        envs = args.gpus * args.envs_per_gpu
        learner_gpus = args.learner_gpus if args.learner_gpus is not None else (0.2 if args.gpus == 1 else 0.1)
        setup = Setup(
            envs=envs,
            gpus=args.gpus,
            task="synthetic",
            train_size=12_500 * envs,
            val_size=10_000,
            batch_size=512,
            max_epochs=args.max_epochs or 20,
            episodes_per_env=4,
            rounds=args.rounds or 4,
            bare_seconds=args.bare_seconds or 30.0,
            slots=("r0c1",),
            model="gpu",
            cuda_graphs=not args.no_graphs,
            learner_gpus=learner_gpus,
            learner_cpus=args.learner_cpus,
            cpus_per_env=args.cpus_per_env,
            overlap=args.overlap or args.lead,
            lead=args.lead,
            extra_env=extra_env,
            bare_controller=args.bare_controller,
            bare_threads=args.bare_threads,
            policy=args.policy,
            envs_per_runner=args.envs_per_runner,
        )
    else:
        # CPU: the settings of a plain `esper-ray train` (unless --max-epochs)
        from esper_ray.contracts.env_config import TASK_DEFAULTS
        from esper_ray.contracts.train_config import TrainConfig
        from esper_ray.data.task_loading import load_task_data

        default = TrainConfig()
        setup = Setup(
            envs=default.envs,
            gpus=0,
            task=default.task,
            train_size=len(load_task_data(default.task).train_y),
            val_size=None,
            batch_size=TASK_DEFAULTS[default.task]["batch_size"],
            max_epochs=args.max_epochs or default.max_epochs,
            episodes_per_env=default.episodes_per_env,
            rounds=args.rounds or 4,
            bare_seconds=args.bare_seconds or 10.0,
            slots=default.slots,
            model="cpu",
            cpus_per_env=args.cpus_per_env or default.cpus_per_env,
            overlap=args.overlap or args.lead,
            lead=args.lead,
            extra_env=extra_env,
            bare_controller=args.bare_controller,
            bare_threads=args.bare_threads,
            policy=args.policy,
            envs_per_runner=args.envs_per_runner,
        )
    if setup.envs % setup.envs_per_runner:
        parser.error(f"--envs-per-runner {setup.envs_per_runner} must divide the {setup.envs} envs")
    from esper_ray.contracts.env_config import EnvConfig
    from esper_ray.env.precision import resolve_amp

    amp = EnvConfig(**dict(extra_env)).amp  # as an env reads it (YAML's `off` arrives as False)
    precision = resolve_amp(amp, torch.device("cuda" if setup.gpus else "cpu"))  # what the envs train in
    report: dict[str, Any] = {
        "machine": machine(),
        "setup": {**setup.__dict__, "gpus_per_env": setup.gpus_per_env, "precision": precision},
    }
    if not args.mps_only:
        report["without_mps"] = measure(
            setup, mps=False, halves=halves, profiles=args.profile_runners and args.profile_runners / "without_mps"
        )
    if args.mps or args.mps_only:
        report["with_mps"] = measure(
            setup, mps=True, halves=halves, profiles=args.profile_runners and args.profile_runners / "with_mps"
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
