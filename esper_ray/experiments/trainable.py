"""One A/B trial as a Tune Trainable.

A `ppo` trial builds the trial's PPO algorithm and trains it round by round; after its last round it runs the
evaluation episodes with the greedy policy on its own env runners. A baseline trial (`heuristic`, `none`,
`random`, `fixed`) has nothing to train: its single step runs the same evaluation episodes in the trial's process.
With `esper-ray ab --save` every evaluation episode's grown network is written into the trial's folder,
`networks/episode<i>/` (train/grow.py; runner.py gathers them under the run's `networks/`).

Tune reserves a ppo trial's resources as RLlib would for PPO itself (a placement group of the driver, env
runner and learner bundles, PACK or SPREAD), and the algorithm's actors are placed inside it. A baseline trial
asks for one env runner's share (its CPUs and GPU fraction), so its episodes run on the same kind of device.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from ray import tune
from ray.rllib.algorithms.ppo import PPO
from ray.tune.execution.placement_groups import PlacementGroupFactory
from ray.tune.result import DONE

from esper_ray.contracts.controllers import ControllerKind, FixedPlan
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.env.faults import fail_if_asked
from esper_ray.experiments.continuation import CONTINUES_KEY, ROUND_FILE, checkpoint_round, checkpoint_summary
from esper_ray.experiments.trial_keys import (EVAL_PREFIX, RUNNER_INIT_SECONDS, RUNNERS_UP_SECONDS, SETUP_SECONDS,
                                              SUMMARY_PREFIX, TORCH_THREADS, TRIAL_KEY, per_kparam)
from esper_ray.morpho.hosts import topology_of
from esper_ray.train.episodes import EpisodeSummary
from esper_ray.train.evaluate import baseline_controller, evaluate_on_env_runners, evaluation_episodes, run_evaluation_episodes
from esper_ray.train.env_runner import runner_start_seconds
from esper_ray.train.gpu_spread import spread_gpu
from esper_ray.train.grow import NetworkFiles, episode_folder, episodes_saver, write_network_files
from esper_ray.train.manifest import MANIFEST_FILE, write_manifest
from esper_ray.train.ppo_config import build_ppo_config
from esper_ray.train.round_summary import summarize_round
from esper_ray.train.rounds import restore, train_round
from esper_ray.train.step_failures import append_tracebacks, round_failures
from esper_ray.train.tensorboard_log import tensorboard_scalars
from esper_ray.train.threads import threads_of_cpus, use_threads

BASELINE_STATE_FILE = "baseline_trial.json"
NETWORKS_DIR = "networks"


def train_config_of(config: dict[str, Any]) -> TrainConfig:
    return TrainConfig.from_mapping(config[TRIAL_KEY]["train"])


def controller_of(config: dict[str, Any]) -> ControllerKind:
    return ControllerKind.parse(config[TRIAL_KEY]["controller"])


def fixed_plan_of(config: dict[str, Any]) -> FixedPlan | None:
    """The seed(s) of a `fixed` trial. Trials of runs started before fixed arms existed have no such key."""
    fixed = config[TRIAL_KEY].get("fixed")
    if fixed is None:
        return None
    cfg = train_config_of(config)
    return FixedPlan.from_mapping(fixed, "fixed", topology=topology_of(cfg.task, cfg.host_name), slots=cfg.slots)


def test_loss_and_perplexity(summaries: list[EpisodeSummary]) -> tuple[float, float]:
    """Mean held-out test loss (per token on text, per sample otherwise) over the evaluation episodes, and the
    perplexity exp(mean loss); NaN when an episode's loss is missing or not finite (a diverged host)."""
    losses = [math.nan if s.test_loss is None else float(s.test_loss) for s in summaries]
    loss = float(np.mean(losses)) if losses else math.nan
    return loss, math.exp(loss) if math.isfinite(loss) and loss < 700 else math.nan


def _mean_of(summaries: list[EpisodeSummary], field: str) -> float:
    values = [getattr(s, field) for s in summaries]
    return float(np.mean([math.nan if v is None else v for v in values]))


def evaluation_metrics(summaries: list[EpisodeSummary]) -> dict[str, float]:
    """Means over the evaluation episodes (the A/B metrics) and their spread."""
    test = np.asarray([s.test_accuracy for s in summaries], dtype=float)
    test_loss, test_perplexity = test_loss_and_perplexity(summaries)
    val = np.asarray([s.final_accuracy for s in summaries], dtype=float)
    params = np.asarray([s.total_params for s in summaries], dtype=float)
    return {
        EVAL_PREFIX + "episodes": float(len(summaries)),
        EVAL_PREFIX + "test_accuracy": float(test.mean()),
        EVAL_PREFIX + "test_accuracy_std": float(test.std()),
        EVAL_PREFIX + "test_accuracy_per_param": float(np.mean([per_kparam(t, p) for t, p in zip(test, params)])),
        # the committed model is what is scored; the same with the seeds left on probation shows what was not kept
        EVAL_PREFIX + "test_accuracy_with_probation": _mean_of(summaries, "test_accuracy_with_probation"),
        EVAL_PREFIX + "val_accuracy_with_probation": _mean_of(summaries, "final_accuracy_with_probation"),
        EVAL_PREFIX + "params_on_probation": float(np.mean([s.params_on_probation for s in summaries])),
        EVAL_PREFIX + "test_loss": test_loss,
        EVAL_PREFIX + "test_perplexity": test_perplexity,
        EVAL_PREFIX + "val_accuracy": float(val.mean()),
        EVAL_PREFIX + "val_accuracy_per_param": float(np.mean([per_kparam(v, p) for v, p in zip(val, params)])),
        EVAL_PREFIX + "params_added": float(np.mean([s.params_added for s in summaries])),
        EVAL_PREFIX + "host_params": float(np.mean([s.host_params for s in summaries])),
        EVAL_PREFIX + "fossilized": float(np.mean([s.fossilized for s in summaries])),
        EVAL_PREFIX + "germinated": float(np.mean([s.germinated for s in summaries])),
        # size and compute (per episode): what the grown model costs, to read the metric at equal size
        EVAL_PREFIX + "final_params": float(params.mean()),
        EVAL_PREFIX + "refused": float(np.mean([s.refused for s in summaries])),
        EVAL_PREFIX + "train_flops": float(np.mean([s.train_flops for s in summaries])),
        EVAL_PREFIX + "seed_train_flops": float(np.mean([s.seed_train_flops for s in summaries])),
        EVAL_PREFIX + "validation_flops": float(np.mean([s.validation_flops for s in summaries])),
        EVAL_PREFIX + "counterfactual_flops": float(np.mean([s.counterfactual_flops for s in summaries])),
        EVAL_PREFIX + "seconds": float(np.mean([s.seconds for s in summaries])),
        TORCH_THREADS: float(max(s.torch_threads for s in summaries)),
    }


class MorphoTrial(tune.Trainable):
    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> PlacementGroupFactory:
        cfg = train_config_of(config)
        if controller_of(config) is ControllerKind.PPO:
            return PPO.default_resource_request(build_ppo_config(cfg))
        bundle = {"CPU": cfg.cpus_per_env}
        if cfg.gpus_per_env:
            bundle["GPU"] = cfg.gpus_per_env
        return PlacementGroupFactory([bundle])

    def setup(self, config: dict[str, Any]) -> None:
        started = time.time()  # wall clock: the env runners' stamps (runner_start_seconds) are compared with it
        fail_if_asked(f"{config[TRIAL_KEY]['arm']}/{config[TRIAL_KEY]['seed']}")  # tests only (env/faults.py)
        self.cfg = train_config_of(config)
        self.controller = controller_of(config)
        self.eval_episodes = int(config[TRIAL_KEY]["eval_episodes"])
        self.fixed = fixed_plan_of(config)
        self.save_networks = bool(config[TRIAL_KEY].get("save_networks", False))  # absent in runs started before --save
        self.label = f"{config[TRIAL_KEY]['arm']}/seed{config[TRIAL_KEY]['seed']}"
        if self.controller is not ControllerKind.PPO:
            spread_gpu()  # the baseline's env runs in this process, on its GPU share (a PPO trial's runners spread)
            use_threads(threads_of_cpus(self.cfg.cpus_per_env))  # and on the CPUs Tune reserved for it (its bundle)
        build_began = time.time()
        self.algo = build_ppo_config(self.cfg).build_algo() if self.controller is ControllerKind.PPO else None
        split = runner_start_seconds(self.algo.env_runner_group, build_began) if self.algo else None
        self.evaluated = False
        # a trial of a killed run, continued by --salvage: restored at its first step, unless Tune restores this
        # trial's own checkpoint first (a later resume of this run)
        self.continue_from = config[TRIAL_KEY].get(CONTINUES_KEY, {}).get("checkpoint")
        self.round_summary: dict[str, Any] = {}  # the newest round's, kept in each checkpoint (ROUND_FILE)
        # where the trial's start went (Tune calls a trial started only after its setup): in its first result only
        self.setup_report = {SETUP_SECONDS: round(time.time() - started, 1)}
        if split is not None:
            self.setup_report.update({RUNNERS_UP_SECONDS: round(split[0], 1), RUNNER_INIT_SECONDS: round(split[1], 1)})

    def step(self) -> dict[str, Any]:
        metrics = {**self._step(), **self.setup_report}
        self.setup_report = {}
        return metrics

    def _step(self) -> dict[str, Any]:
        if self.algo is None:
            return self._baseline_step()
        if self.continue_from is not None:
            self._continue(Path(self.continue_from))
        # A salvaged trial whose checkpoint holds its last round (killed between that checkpoint and its
        # evaluation's result) trains no further: it is only evaluated, so no policy trains past `rounds`.
        # It reports the round's summary its checkpoint kept, so its history still holds every round once.
        trains = self.algo.iteration < self.cfg.rounds
        metrics: dict[str, Any] = self._train_round() if trains else dict(self.round_summary)
        if self.algo.iteration >= self.cfg.rounds:  # the last round: score the greedy policy on held-out data
            networks: dict[int, NetworkFiles] = {}
            keep = f"the greedy PPO policy of A/B trial {self.label}" if self.save_networks else None
            metrics.update(evaluation_metrics(evaluate_on_env_runners(self.algo, self.cfg, self.eval_episodes, keep, networks)))
            self._write_networks(networks)
            metrics[DONE] = True  # a continued trial reaches its last round before Tune's count of iterations does
        return metrics

    def _train_round(self) -> dict[str, Any]:
        """One PPO round, as this trial reports it: the round's summary and its TensorBoard scalars."""
        result = train_round(self.algo)
        summary = summarize_round(result)
        failures = round_failures(result)
        if failures:  # the round's event line names the errors (runner.py); the tracebacks stay in the trial's folder
            append_tracebacks(Path(self.logdir), summary.round, failures)
        metrics: dict[str, Any] = tensorboard_scalars(result)  # as `train` logs them: grouped, RLlib's config left out
        self.round_summary = {SUMMARY_PREFIX + k: v for k, v in summary.as_dict().items()}
        metrics.update(self.round_summary)
        return metrics

    def _continue(self, checkpoint: Path) -> None:
        """Carry on from a killed run's checkpoint (continuation.py): only one that still matches its manifest."""
        if checkpoint_round(checkpoint) is None:
            raise ValueError(f"{checkpoint}: no longer matches its {MANIFEST_FILE} (or has no {ROUND_FILE}); its pickles "
                             "are not loaded")
        restore(self.algo, str(checkpoint))
        self.round_summary = checkpoint_summary(checkpoint)
        self.continue_from = None

    def _baseline_step(self) -> dict[str, Any]:
        controller = baseline_controller(self.controller, self.cfg, self.fixed)
        # in this process: each network is saved straight into the trial's folder
        label = f"the {self.controller.value} controller of A/B trial {self.label}"
        keep = episodes_saver(Path(self.logdir) / NETWORKS_DIR, label) if self.save_networks else None
        summaries = run_evaluation_episodes(evaluation_episodes(self.cfg, self.eval_episodes), controller, on_episode_end=keep)
        self.evaluated = True
        metrics: dict[str, Any] = evaluation_metrics(summaries)
        metrics[DONE] = True  # nothing to train: one step is the whole trial
        return metrics

    def _write_networks(self, networks: dict[int, NetworkFiles]) -> None:
        """The networks the env runners sent back, into the trial's folder (Tune copies it to the run's storage
        with the trial's checkpoint)."""
        for episode, files in sorted(networks.items()):
            write_network_files(episode_folder(Path(self.logdir) / NETWORKS_DIR, episode), files)

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        if self.algo is not None:
            self.algo.save_to_path(checkpoint_dir)
            (Path(checkpoint_dir) / ROUND_FILE).write_text(json.dumps({"round": self.algo.iteration,
                                                                       "summary": self.round_summary}))
        else:
            (Path(checkpoint_dir) / BASELINE_STATE_FILE).write_text(json.dumps({"evaluated": self.evaluated}))
        write_manifest(Path(checkpoint_dir))  # last: a checkpoint cut short by a kill has none that matches

    def load_checkpoint(self, checkpoint: str) -> None:  # type: ignore[override]
        self.continue_from = None  # this trial's own checkpoint: it holds the continuation's rounds too
        if self.algo is not None:
            restore(self.algo, checkpoint)
            self.round_summary = checkpoint_summary(Path(checkpoint))
        else:
            self.evaluated = json.loads((Path(checkpoint) / BASELINE_STATE_FILE).read_text())["evaluated"]

    def cleanup(self) -> None:
        if self.algo is not None:
            self.algo.stop()
