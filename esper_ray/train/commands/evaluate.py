"""Held-out evaluation: fixed episodes run by a controller, scored on the test split no reward ever reads.

Used three ways: `esper-ray eval` (a checkpoint's greedy policy), the end of every A/B trial (the trained
policy on its own env runners, or a baseline controller in the trial's process), and tests. Greedy, not sampled:
a checkpoint then gives one host run per seed, and it keeps at least what the sampled policy does (measured, and
its trap: docs/design.md, "Which policy is evaluated").

The episodes depend only on the run's settings and seed (`evaluation_episodes`): episode i trains on data
shard i % envs, as env runner i % envs + 1 did in training, from a reset seed that no training episode uses.
So every A/B arm with seed s evaluates on the same host initialisations and data orders, whatever its
controller, and the greedy policy is never scored on an episode it trained on.

The policy sees observations normalised with the frozen statistics of its own training filter, through the
same filter class, so evaluation feeds the network what training fed it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModule

from esper_ray.contracts.controllers import ControllerKind, FixedPlan
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.train_config import SLOT_ARCHITECTURES, TrainConfig
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.morpho.hosts import topology_of
from esper_ray.policy.baselines import NoGrowthController, RandomController
from esper_ray.policy.feature_filter import FEATURES, FeatureMeanStdFilter, feature_filter_of
from esper_ray.policy.fixed import FixedPlanController
from esper_ray.policy.heuristic import HeuristicConfig, HeuristicController
from esper_ray.policy.layout import check_layout, saved_layout
from esper_ray.train.commands.episodes import (
    Controller,
    EpisodeEnd,
    EpisodeHistory,
    EpisodeSummary,
    run_episode,
    run_episodes,
)
from esper_ray.train.commands.grow import NetworkFiles, network_keeper
from esper_ray.train.folders.checkpoints import load_checkpoint_config
from esper_ray.train.output.progress_lines import warn
from esper_ray.train.process.threads import COMMAND_THREADS, use_threads
from esper_ray.train.rllib.overlap import learn_pending
from esper_ray.train.rllib.rounds import MODULE_PATH

ENV_TO_MODULE_PATH = Path("env_runner") / "env_to_module_connector"
EVAL_SEED_STRIDE = 1_000_000  # reset seeds of evaluation episodes start here; training resets use small seeds


@dataclass(frozen=True)
class EvalEpisode:
    index: int
    env_config: dict[str, Any]
    reset_seed: int


def evaluation_episodes(cfg: TrainConfig, episodes: int) -> list[EvalEpisode]:
    """The fixed evaluation episodes of a run with these settings: identical for every controller."""
    if episodes < 1:
        raise ValueError(f"eval_episodes={episodes}: must be >= 1")
    return [
        EvalEpisode(i, cfg.env_config(shard=i % cfg.envs, num_shards=cfg.envs), EVAL_SEED_STRIDE * (cfg.seed + 1) + i)
        for i in range(episodes)
    ]


def run_evaluation_episodes(
    plan: list[EvalEpisode],
    controller: Controller,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    on_episode_end: EpisodeEnd | None = None,
) -> list[EpisodeSummary]:
    """Run `plan` with one controller, one fresh env per episode; each summary carries its test accuracy.
    `on_episode_end` sees each episode's env, summary and history while the env holds the final network."""
    summaries = []
    for item in plan:
        env = MorphogeneticEnv(item.env_config)
        history = EpisodeHistory() if on_episode_end is not None else None
        summaries.append(
            run_episode(
                env, controller, item.index, on_step, reset_seed=item.reset_seed, measure_test=True, history=history
            )
        )
        if on_episode_end is not None:
            on_episode_end(env, summaries[-1], history)
    return summaries


class GreedyPolicyController:
    """Most likely action of every head, with the LSTM state carried through the episode."""

    def __init__(
        self, module: RLModule, feature_filter: FeatureMeanStdFilter, device: torch.device | str = "cpu"
    ) -> None:
        self.module = module
        self.filter = feature_filter
        self.device = torch.device(device)
        self.reset()

    def reset(self) -> None:
        self.state = {
            k: torch.as_tensor(v, device=self.device)[None] for k, v in self.module.get_initial_state().items()
        }

    def act(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        batch = policy_batch(self.filter, obs, self.state, self.device)
        with torch.no_grad():
            out = self.module.forward_inference(batch)
        self.state = out[Columns.STATE_OUT]
        dist = self.module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
        return self.choose(dist)[0, 0].cpu().numpy()

    def choose(self, dist: Any) -> torch.Tensor:
        """The action drawn from the masked distribution: here its most likely value (`grow --sample` samples)."""
        return dist.to_deterministic().sample()


def policy_batch(
    feature_filter: FeatureMeanStdFilter,
    obs: Mapping[str, np.ndarray],
    state: dict[str, torch.Tensor],
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """One observation as the module's batch of one step, its features normalised with the frozen training
    statistics, and the LSTM `state` carried in."""

    def tensor(x: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.as_tensor(x, dtype=dtype, device=device)[None, None]

    return {
        Columns.OBS: {
            FEATURES: tensor(feature_filter.normalize(obs[FEATURES], update=False), torch.float32),
            "blueprint_ids": tensor(obs["blueprint_ids"]),
            "blueprint_costs": tensor(obs["blueprint_costs"], torch.float32),
            "action_mask": tensor(obs["action_mask"]),
        },
        Columns.STATE_IN: state,
    }


def load_policy(checkpoint: Path) -> tuple[RLModule, FeatureMeanStdFilter]:
    """The checkpoint's module and observation filter; ValueError in one line when its policy layout (MAX_SLOTS,
    features, blueprint table: policy/layout.py) is not this code's."""
    check_layout(saved_layout(checkpoint / MODULE_PATH), f"checkpoint {checkpoint}")
    module = RLModule.from_checkpoint(str((checkpoint / MODULE_PATH).resolve()))
    module.eval()
    pipeline = ConnectorPipelineV2.from_checkpoint(str((checkpoint / ENV_TO_MODULE_PATH).resolve()))
    return module, feature_filter_of(pipeline, f"checkpoint {checkpoint}")


def check_policy_fits(checkpoint: Path, env: MorphogeneticEnv) -> None:
    """Refuse, in one line, a host run the checkpoint's policy cannot decide for, before any host trains.

    The one compatibility check of `eval` and `grow`. A policy's spaces hold MAX_SLOTS slot positions whatever the
    host (the env refuses a host with more), so any host fits; what must match is the policy layout the checkpoint
    records (MAX_SLOTS, the features, the blueprint table: policy/layout.py). Either architecture (flat or slots)
    runs: load_policy builds the checkpoint's own module class. `env`: the run (its slots fit already).
    """
    check_layout(saved_layout(checkpoint / MODULE_PATH), f"checkpoint {checkpoint}")


def untrained_positions_line(trained: EnvConfig, run: EnvConfig, policy: str = "flat") -> str | None:
    """One line when the run's hosts fill more slot positions than any host the policy trained on: each position is
    read by weights of its own (policy/rl_module.py), and a position no training host filled got no gradient, so
    the policy's choices there are its initial weights', not learned. None when every position was trained, and for
    a `policy` of slots or slots-mean (TrainConfig.policy), whose one set of weights reads every position."""
    if policy in SLOT_ARCHITECTURES:
        return None

    def positions(cfg: EnvConfig) -> int:
        return max((len(member.slots) for _, member in cfg.members()), default=len(cfg.slots))

    trained_on, needs = positions(trained), positions(run)
    if needs <= trained_on:
        return None
    return (
        f"this host fills {needs} slot positions and the policy trained on hosts of at most {trained_on}: positions "
        f"{trained_on + 1}-{needs} are read by weights no training host filled (at their initial values), so its "
        "decisions there are not learned; train on a family whose hosts have as many slots (docs/families.md)"
    )


def baseline_controller(kind: ControllerKind, cfg: TrainConfig, fixed: FixedPlan | None = None) -> Controller:
    """A controller that needs no training. Random draws depend on the run's seed only; `fixed` is the seed a
    `fixed` controller plants."""
    if kind is ControllerKind.NONE:
        return NoGrowthController(cfg.slots)
    if kind is ControllerKind.RANDOM:
        return RandomController(cfg.slots, seed=EVAL_SEED_STRIDE + cfg.seed)
    if kind is ControllerKind.HEURISTIC:
        lifecycle = EnvConfig.from_mapping(cfg.env_config(shard=0, num_shards=1)).lifecycle
        return HeuristicController(
            cfg.slots,
            cfg.max_epochs,
            HeuristicConfig.for_lifecycle(lifecycle),
            topology=topology_of(cfg.task, cfg.host_name),
        )
    if kind is ControllerKind.FIXED:
        if fixed is None:
            raise ValueError("controller='fixed' needs the seed it plants (fixed: {blueprint: ..., slot: ...})")
        lifecycle = EnvConfig.from_mapping(cfg.env_config(shard=0, num_shards=1)).lifecycle
        return FixedPlanController(cfg.slots, cfg.max_epochs, fixed, lifecycle.min_training_epochs)
    raise ValueError(
        f"controller={kind.value!r} is trained, not a baseline; evaluate it from its checkpoint or algorithm"
    )


def evaluate_on_env_runners(
    algo: Any,
    cfg: TrainConfig,
    episodes: int,
    keep_networks: str | None = None,
    networks: dict[int, NetworkFiles] | None = None,
) -> list[EpisodeSummary]:
    """Evaluate the algorithm's current greedy policy on its own env runners (their devices, in parallel).

    Env runner k of R runs episodes k, k + R, ... (on the shards any run with these `envs` gives them) with its
    own copy of the weights (synced after every update, including the last round's when the learner overlaps with
    sampling) and its own observation filter (merged across runners every round). With `keep_networks` (the
    controller's description), every episode's grown network comes back as files into `networks`, by episode index.
    """
    learn_pending(algo)
    plan = evaluation_episodes(cfg, episodes)

    def evaluate(runner: Any) -> list[tuple[EpisodeSummary, NetworkFiles | None]]:
        mine = [e for e in plan if e.index % cfg.env_runners == runner.worker_index - 1]
        feature_filter = feature_filter_of(runner._env_to_module, f"env runner {runner.worker_index}")
        runner.module.eval()
        kept: dict[int, NetworkFiles] = {}
        summaries = run_evaluation_episodes(
            mine,
            GreedyPolicyController(runner.module, feature_filter, runner._device),
            on_episode_end=network_keeper(keep_networks, kept) if keep_networks else None,
        )
        return [(s, kept.get(s.episode)) for s in summaries]

    # The actor manager itself, not EnvRunnerGroup.foreach_env_runner: with fault tolerance on, the latter logs and
    # drops a runner's error, and the real cause (an exception in an episode) would be lost.
    results = algo.env_runner_group._worker_manager.foreach_actor(evaluate, healthy_only=True)
    for result in results:
        if not result.ok:
            raise result.get()
    returned = [pair for result in results for pair in result.get()]
    if networks is not None:
        networks.update({s.episode: files for s, files in returned if files is not None})
    summaries = sorted((s for s, _ in returned), key=lambda s: s.episode)
    done = [s.episode for s in summaries]
    if done != list(range(episodes)):
        raise RuntimeError(
            f"evaluation: episodes {sorted(set(range(episodes)) - set(done))} did not return "
            f"(an env runner failed); {len(done)} of {episodes} finished"
        )
    return summaries


def mean_line(summaries: Sequence[EpisodeSummary]) -> str:
    """The line `eval` ends with: the mean held-out test accuracy over its episodes and the mean committed network
    (parameters the kept seeds add, and in all), the numbers an evaluation is compared by."""
    n = len(summaries)
    if n == 0:
        return "mean over 0 episodes: nothing was evaluated"
    tested = [s.test_accuracy for s in summaries if s.test_accuracy is not None]
    test = f"test acc {100 * float(np.mean(tested)):.2f}%" if len(tested) == n and n else "test acc not measured"
    spread = f" (min {100 * min(tested):.2f}%, max {100 * max(tested):.2f}%)" if n > 1 and len(tested) == n else ""
    return (
        f"mean over {n} episode{'s' if n != 1 else ''}: {test}{spread}, params kept "
        f"{float(np.mean([s.params_added for s in summaries])):,.0f} (committed network "
        f"{float(np.mean([s.total_params for s in summaries])):,.0f} params in all)"
    )


def run_evaluation(
    checkpoint: Path,
    episodes: int,
    seed: int | None = None,
    env_overrides: Mapping[str, Any] | None = None,
    progress: bool = True,
    on_episode_end: EpisodeEnd | None = None,
    threads: int = COMMAND_THREADS,
) -> list[EpisodeSummary]:
    """`esper-ray eval`: the checkpoint's greedy policy on fresh episodes (env settings may be overridden), with
    `threads` torch threads (train/process/threads.py; the policy's forward passes too)."""
    use_threads(threads)
    cfg = load_checkpoint_config(checkpoint)
    env_config = {**cfg.env_config(shard=0, num_shards=1), **(env_overrides or {})}
    if seed is not None:
        env_config["seed"] = seed
    env = MorphogeneticEnv(env_config)
    check_policy_fits(checkpoint, env)
    warn("eval", untrained_positions_line(cfg.env, env.base_cfg, cfg.policy))
    module, feature_filter = load_policy(checkpoint)
    return run_episodes(
        env,
        GreedyPolicyController(module, feature_filter),
        episodes,
        progress,
        measure_test=True,
        on_episode_end=on_episode_end,
        label="eval",
    )
