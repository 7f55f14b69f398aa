"""One A/B trial as a Tune Trainable.

A `ppo` trial builds the trial's PPO algorithm and trains it round by round; after its last round it runs the
evaluation episodes with the greedy policy on its own env runners. A baseline trial (`heuristic`, `none`,
`random`, `fixed`, and the A/B-only `checkpoint` and `search`) has nothing to train: its single step runs the same
evaluation episodes in the trial's process (a `checkpoint` trial with its checkpoint's greedy policy; a `search`
trial first searches over fixed plans per host: plan_search.py).

With held-out hosts (held_out.py) the evaluation runs on each of them in turn, and the trial reports per host
`eval/<figure>/<host>` (test and validation accuracy, parameters, the host runs it spent there), and as
`eval/<figure>` the means over its evaluation episodes of every host (equal counts: the mean over hosts). A fixed
plan a host cannot take (its slot or blueprint missing) is not applicable there: said in one line, recorded as
`eval/not_applicable/<host>`, and left out of the means.
At equal cost (the experiment's `host_runs`, equal_cost.py) the evaluation episodes are the host runs: each host's
runs go into `eval/runs/<host>` (validation and test score, a search's plan), and the metric there is the test score of
the run best by validation; a search runs its i-th candidate on evaluation episode i (equal_cost_search).
With `esper-ray ab --save` every evaluation episode's grown network is written into the trial's folder,
`networks/episode<i>/` (train/commands/grow.py; runner.py gathers them under the run's `networks/`).

Tune reserves a ppo trial's resources as RLlib would for PPO itself (a placement group of the driver, env
runner and learner bundles, PACK or SPREAD), and the algorithm's actors are placed inside it. A baseline trial
asks for one env runner's share (its CPUs and GPU fraction), so its episodes run on the same kind of device.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
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
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.experiments.continuation import CONTINUES_KEY, ROUND_FILE, checkpoint_round, checkpoint_summary
from esper_ray.experiments.equal_cost import RUNS, run_record, runs_json, score_at
from esper_ray.experiments.held_out import host_key
from esper_ray.experiments.plan_search import (
    SEARCH_EPISODE_OFFSET,
    SearchOutcome,
    candidate_plans,
    make_searcher,
    run_search,
)
from esper_ray.experiments.search_settings import SearchSettings
from esper_ray.experiments.trial_keys import (
    EVAL_PREFIX,
    RUNNER_INIT_SECONDS,
    RUNNERS_UP_SECONDS,
    SETUP_SECONDS,
    SUMMARY_PREFIX,
    TORCH_THREADS,
    TRIAL_KEY,
    per_kparam,
)
from esper_ray.morpho.hosts import topology_of
from esper_ray.policy.fixed import FixedPlanController
from esper_ray.train.commands.episodes import Controller, EpisodeSummary, run_episode
from esper_ray.train.commands.evaluate import (
    EVAL_SEED_STRIDE,
    GreedyPolicyController,
    baseline_controller,
    evaluate_on_env_runners,
    evaluation_episodes,
    load_policy,
    run_evaluation_episodes,
)
from esper_ray.train.commands.grow import NetworkFiles, episode_folder, episodes_saver, write_network_files
from esper_ray.train.folders.manifest import MANIFEST_FILE, write_manifest
from esper_ray.train.output.round_summary import summarize_round
from esper_ray.train.output.tensorboard_log import tensorboard_scalars
from esper_ray.train.process.gpu_spread import spread_gpu
from esper_ray.train.process.threads import threads_of_cpus, use_threads
from esper_ray.train.rllib.env_runner import runner_start_seconds
from esper_ray.train.rllib.ppo_config import build_ppo_config
from esper_ray.train.rllib.rounds import restore, train_round
from esper_ray.train.rllib.step_failures import append_tracebacks, round_failures

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
    """Means over the evaluation episodes (the A/B metrics) and their spread; with no episode (a fixed plan that
    no held-out host could take) their count 0 and NaN figures."""
    if not summaries:
        return {
            EVAL_PREFIX + "episodes": 0.0,
            EVAL_PREFIX + "test_accuracy": math.nan,
            EVAL_PREFIX + "params_added": math.nan,
        }
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


HOST_FIGURES = (
    "test_accuracy",
    "test_accuracy_per_param",
    "val_accuracy",
    "val_accuracy_per_param",
    "final_params",
    "params_added",
    "germinated",
    "fossilized",
)
"""Figures a trial reports per held-out host (`eval/test_accuracy/<host>`), beside its host runs there; the seeds
planted and kept say whether a fixed or searched plan was planted there at all (results.TrialResult.plan_note)."""
HOST_RUNS, SEARCH_RUNS, NOT_APPLICABLE, SEARCH_PLAN = "host_runs", "search_runs", "not_applicable", "search_plan"
"""Per host: the host runs the trial spent there (its cost of a new host), of which the search's; 1.0 where the
arm's fixed plan does not fit the host; the plan a search picked (a string)."""


@dataclass
class HostEvaluation:
    """One host's part of a trial's evaluation."""

    summaries: list[EpisodeSummary]
    search_runs: int = 0
    not_applicable: str | None = None
    """Why the arm cannot run on this host (None: it ran)."""
    search: SearchOutcome | None = None
    plans: list[str] | None = None
    """At equal cost, a search's plan of each host run (its summaries in order)."""


def test_score(summary: EpisodeSummary, metric: str) -> float:
    """A host run's test score: the experiment's metric on the test split, of the committed model."""
    test = math.nan if summary.test_accuracy is None else float(summary.test_accuracy)
    return per_kparam(test, summary.total_params) if metric.endswith("_per_param") else test


def host_runs_of(evaluation: HostEvaluation, metric: str) -> list[dict[str, Any]]:
    """A host's runs at equal cost, in order: episode seed, validation and test score, a search's plan."""
    plans = evaluation.plans or [None] * len(evaluation.summaries)
    return [
        run_record(
            -1 if s.reset_seed is None else s.reset_seed, validation_score(s, metric), test_score(s, metric), plan
        )
        for s, plan in zip(evaluation.summaries, plans)
    ]


def validation_score(summary: EpisodeSummary, metric: str) -> float:
    """What a search ranks a candidate by: the validation counterpart of the experiment's metric (never the test
    split, which only the chosen plan's evaluation reads)."""
    if metric.endswith("_per_param"):
        return per_kparam(summary.final_accuracy, summary.total_params)
    return float(summary.final_accuracy)


def held_out_metrics(by_host: dict[str, HostEvaluation], equal_cost_metric: str | None = None) -> dict[str, Any]:
    """The trial's evaluation over held-out hosts: the pooled figures (every host's episodes; equal counts make
    them the mean over hosts) and each host's own, its cost in host runs, and where it was not applicable.
    At equal cost (`equal_cost_metric`: the experiment's metric), each host's runs too, and the metric there is the
    test score of its run best by validation (equal_cost.score_at over all of them); the trial's, their mean over
    the hosts."""
    ran = [e for e in by_host.values() if e.not_applicable is None]
    metrics: dict[str, Any] = evaluation_metrics([s for e in ran for s in e.summaries])
    for host, e in by_host.items():
        if e.not_applicable is not None:
            metrics[EVAL_PREFIX + host_key(NOT_APPLICABLE, host)] = 1.0
            continue
        own = evaluation_metrics(e.summaries)
        metrics.update({EVAL_PREFIX + host_key(f, host): own[EVAL_PREFIX + f] for f in HOST_FIGURES})
        metrics[EVAL_PREFIX + host_key(HOST_RUNS, host)] = float(len(e.summaries) + e.search_runs)
        metrics[EVAL_PREFIX + host_key(SEARCH_RUNS, host)] = float(e.search_runs)
        if e.search is not None:
            metrics[EVAL_PREFIX + host_key(SEARCH_PLAN, host)] = e.search.best.label
    if ran:
        metrics[EVAL_PREFIX + HOST_RUNS] = float(np.mean([len(e.summaries) + e.search_runs for e in ran]))
    if equal_cost_metric is not None and ran:
        picked = []
        for host, e in by_host.items():
            if e.not_applicable is None:
                runs = host_runs_of(e, equal_cost_metric)
                metrics[EVAL_PREFIX + host_key(RUNS, host)] = runs_json(runs)
                picked.append(score_at(runs, len(runs)))
                metrics[EVAL_PREFIX + host_key(equal_cost_metric, host)] = picked[-1]
        metrics[EVAL_PREFIX + equal_cost_metric] = float(np.mean(picked))
    return metrics


def plan_on_host(plan: FixedPlan, cfg: TrainConfig) -> FixedPlan | str:
    """A fixed plan as it is, read against a host's topology and slots; where the host lacks its slot or blueprint,
    why (one line), so the trial records it as not applicable there instead of failing."""
    try:
        return FixedPlan.from_mapping(
            plan.to_dict(), "fixed", topology=topology_of(cfg.task, cfg.host_name), slots=cfg.slots
        )
    except ValueError as err:
        return str(err)


def search_host(
    cfg: TrainConfig,
    settings: SearchSettings,
    metric: str,
    run: Callable[[TrainConfig, FixedPlanController, int], EpisodeSummary] | None = None,
) -> SearchOutcome:
    """The search over fixed plans on one host: every candidate on the same search episode (shard 0, a reset seed
    no evaluation or training episode uses), ranked by validation."""
    candidates = candidate_plans(topology_of(cfg.task, cfg.host_name), cfg.slots)
    lifecycle = cfg.env.lifecycle
    reset_seed = EVAL_SEED_STRIDE * (cfg.seed + 1) + SEARCH_EPISODE_OFFSET

    def score(plan: Any) -> float:
        controller = FixedPlanController(cfg.slots, cfg.max_epochs, plan, lifecycle.min_training_epochs)
        env = MorphogeneticEnv(cfg.env_config(shard=0, num_shards=cfg.envs))
        return validation_score(run_episode(env, controller, 0, reset_seed=reset_seed), metric)

    return run_search(make_searcher(settings, len(candidates), seed=cfg.seed), candidates, settings.budget, score)


def equal_cost_search(
    cfg: TrainConfig,
    settings: SearchSettings,
    metric: str,
    episodes: list[Any],
    on_episode_end: Any = None,
) -> tuple[SearchOutcome, list[EpisodeSummary], list[str]]:
    """The search at equal cost on one host: its i-th candidate run on evaluation episode i (test split measured, as
    every arm's host runs are), ranked by validation; the runs' summaries and plans in order."""
    candidates = candidate_plans(topology_of(cfg.task, cfg.host_name), cfg.slots)
    lifecycle = cfg.env.lifecycle
    summaries: list[EpisodeSummary] = []
    plans: list[str] = []

    def score(plan: Any) -> float:
        controller = FixedPlanController(cfg.slots, cfg.max_epochs, plan, lifecycle.min_training_epochs)
        # run_search calls this once per host run, in order: run i is episode i
        summaries.extend(run_evaluation_episodes([episodes[len(summaries)]], controller, on_episode_end=on_episode_end))
        plans.append(plan.label)
        return validation_score(summaries[-1], metric)

    searcher = make_searcher(settings, len(candidates), seed=cfg.seed)
    return run_search(searcher, candidates, len(episodes), score), summaries, plans


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
        # held-out hosts, a checkpoint arm's checkpoint, a search arm's settings: absent in runs started before them
        self.held_out = [
            (h["name"], TrainConfig.from_mapping(h["train"])) for h in config[TRIAL_KEY].get("held_out") or []
        ]
        self.metric = str(config[TRIAL_KEY].get("metric", "test_accuracy"))
        search = config[TRIAL_KEY].get("search")
        self.search = SearchSettings.from_mapping(search, "search") if search is not None else None
        self.checkpoint = config[TRIAL_KEY].get("checkpoint")
        self.host_runs = config[TRIAL_KEY].get("host_runs")  # equal cost; absent in runs started before it
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
            keep = f"the greedy PPO policy of A/B trial {self.label}" if self.save_networks else None

            def on_runners(host: str | None, cfg: TrainConfig) -> HostEvaluation:
                networks: dict[int, NetworkFiles] = {}
                summaries = evaluate_on_env_runners(self.algo, cfg, self.eval_episodes, keep, networks)
                self._write_networks(networks, host)
                return HostEvaluation(summaries)

            metrics.update(self._evaluate(on_runners))
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
            raise ValueError(
                f"{checkpoint}: no longer matches its {MANIFEST_FILE} (or has no {ROUND_FILE}); its pickles "
                "are not loaded"
            )
        restore(self.algo, str(checkpoint))
        self.round_summary = checkpoint_summary(checkpoint)
        self.continue_from = None

    def _evaluate(self, on_host: Callable[[str | None, TrainConfig], HostEvaluation]) -> dict[str, Any]:
        """The evaluation on the trial's own settings, or on each held-out host (held_out_metrics)."""
        if not self.held_out:
            return evaluation_metrics(on_host(None, self.cfg).summaries)
        by_host = {}
        for host, cfg in self.held_out:
            by_host[host] = on_host(host, cfg)
        return held_out_metrics(by_host, self.metric if self.host_runs is not None else None)

    def _networks_folder(self, host: str | None) -> Path:
        """networks/ in the trial's folder, networks/<host>/ for a held-out host's episodes."""
        return Path(self.logdir) / NETWORKS_DIR / (host or "")

    def _baseline_step(self) -> dict[str, Any]:
        label = f"the {self.controller.value} controller of A/B trial {self.label}"
        policy = load_policy(Path(self.checkpoint)) if self.controller is ControllerKind.CHECKPOINT else None

        def in_process(host: str | None, cfg: TrainConfig) -> HostEvaluation:
            where = f" on held-out host {host}" if host else ""
            search = None
            # in this process: each network is saved straight into the trial's folder
            keep = episodes_saver(self._networks_folder(host), label + where) if self.save_networks else None
            if self.controller is ControllerKind.SEARCH and self.host_runs is not None:
                search, summaries, plans = equal_cost_search(
                    cfg, self.search, self.metric, evaluation_episodes(cfg, self.eval_episodes), keep
                )
                print(
                    f"{self.label}: search{where} at equal cost: {search.runs} host runs"
                    + (f", {search.repeats} candidate(s) proposed again and not rerun" if search.repeats else ""),
                    flush=True,
                )
                return HostEvaluation(summaries, 0, search=search, plans=plans)
            if self.controller is ControllerKind.CHECKPOINT:
                controller: Controller = GreedyPolicyController(*policy)
            elif self.controller is ControllerKind.SEARCH:
                search = search_host(cfg, self.search, self.metric)
                print(
                    f"{self.label}: search{where}: {search.best.label} best by validation ({search.best_score:.4f}) of "
                    f"{search.runs} plans tried",
                    flush=True,
                )
                lifecycle = cfg.env.lifecycle
                controller = FixedPlanController(cfg.slots, cfg.max_epochs, search.best, lifecycle.min_training_epochs)
            else:
                fixed = self.fixed if self.fixed is None or host is None else plan_on_host(self.fixed, cfg)
                if isinstance(fixed, str):
                    print(
                        f"{self.label}: fixed({self.fixed.label}) is not applicable on held-out host {host}: {fixed}",
                        flush=True,
                    )
                    return HostEvaluation([], not_applicable=fixed)
                controller = baseline_controller(self.controller, cfg, fixed)
            summaries = run_evaluation_episodes(
                evaluation_episodes(cfg, self.eval_episodes), controller, on_episode_end=keep
            )
            return HostEvaluation(summaries, search.runs if search else 0, search=search)

        metrics = self._evaluate(in_process)
        self.evaluated = True
        metrics[DONE] = True  # nothing to train: one step is the whole trial
        return metrics

    def _write_networks(self, networks: dict[int, NetworkFiles], host: str | None = None) -> None:
        """The networks the env runners sent back, into the trial's folder (Tune copies it to the run's storage
        with the trial's checkpoint)."""
        for episode, files in sorted(networks.items()):
            write_network_files(episode_folder(self._networks_folder(host), episode), files)

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        if self.algo is not None:
            self.algo.save_to_path(checkpoint_dir)
            (Path(checkpoint_dir) / ROUND_FILE).write_text(
                json.dumps({"round": self.algo.iteration, "summary": self.round_summary})
            )
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
