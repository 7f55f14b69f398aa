"""Where the PPO algorithm lives during `esper-ray train`: in this process (placement PACK, the default), or in
a driver actor inside a SPREAD placement group, so that its env runners and learners go to different nodes.

Ray places the actors an algorithm creates wherever resources allow, packing by default, and RLlib passes
no scheduling strategy to them. A placement group that captures child tasks is how Tune spreads a trial;
this does the same for a single run. The driver's bundle is pinned to this node, so checkpoints are written
where the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
from ray.rllib.algorithms.ppo import PPO
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.process.threads import threads_of_cpus, use_threads
from esper_ray.train.rllib.ppo_config import build_ppo_config
from esper_ray.train.rllib.rounds import restore, train_round

NODE_PIN = 0.001  # a sliver of this node's "node:<ip>" resource pins a bundle to it


def learner_threads(cfg: TrainConfig) -> int | None:
    """The torch threads of the algorithm's process where its learner trains there (learners 0): its CPUs' (the
    driver's and the learner's), as an env runner's are its own; None for a remote learner (Ray gives its actor its
    CPUs' threads). torch's default, a thread per core, made the PPO update 5-9x slower beside another run's env
    runners on 2 cores (docs/performance.md)."""
    if cfg.learners != 0:
        return None
    return threads_of_cpus(cfg.driver_cpus + cfg.effective_learner_cpus)


class AlgorithmDriver:
    """Builds the algorithm (restoring a checkpoint's state into it) and runs it; used directly or as a Ray actor."""

    def __init__(self, cfg: TrainConfig, resume: str | None, progress_actor: str | None = None) -> None:
        threads = learner_threads(cfg)
        if threads is not None:
            use_threads(threads)
        self.algo = build_ppo_config(cfg, progress_actor).build_algo()
        if cfg.lead:
            self.algo.plan_leads(cfg.rounds, cfg.checkpoint_every)
        if resume is not None:
            restore(self.algo, resume)

    def train(self) -> dict[str, Any]:
        return train_round(self.algo)

    def save(self, path: str) -> None:
        self.algo.save_to_path(path)

    def iteration(self) -> int:
        return self.algo.iteration

    def env_runner_nodes(self) -> list[str]:
        """Node id of every remote env runner."""
        return self.algo.env_runner_group.foreach_env_runner(
            lambda runner: ray.get_runtime_context().get_node_id(), local_env_runner=False
        )

    def stop(self, abort: bool = False) -> None:
        """Stop the algorithm; `abort` kills its env runners first, so a round in progress cannot delay it.

        RLlib's own stop() asks every env runner to stop, and an env runner answers only after its current
        sample() call: with long episodes, minutes after a Ctrl-C.
        """
        if abort:
            # FaultTolerantActorManager.clear() (a DeveloperAPI) ray.kill()s every env runner it manages.
            self.algo.env_runner_group._worker_manager.clear()
            self.algo.learner_group.shutdown()
            return
        self.algo.stop()


class AlgorithmHandle:
    """The same methods as AlgorithmDriver, wherever the driver runs."""

    def __init__(self, cfg: TrainConfig, resume: Path | None, progress_actor: str | None = None) -> None:
        resume_path = str(resume.resolve()) if resume is not None else None
        self.group: PlacementGroup | None = None
        if cfg.placement == "SPREAD":
            self.group = spread_group(cfg)
            bundle = self.group.bundle_specs[0]
            # Two threads: a Ctrl-C can then save the last finished round and stop the env runners while train()
            # waits for them in the other thread.
            remote = ray.remote(AlgorithmDriver).options(
                num_cpus=bundle.get("CPU", 0),
                num_gpus=bundle.get("GPU", 0),
                max_concurrency=2,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
                ),
            )
            self.actor: Any = remote.remote(cfg, resume_path, progress_actor)
            self.local: AlgorithmDriver | None = None
        else:
            self.local = AlgorithmDriver(cfg, resume_path, progress_actor)

    def _call(self, method: str, *args: Any) -> Any:
        if self.local is not None:
            return getattr(self.local, method)(*args)
        return ray.get(getattr(self.actor, method).remote(*args))

    def train(self) -> dict[str, Any]:
        return self._call("train")

    def save(self, path: Path) -> None:
        self._call("save", str(path.resolve()))

    def iteration(self) -> int:
        return self._call("iteration")

    def env_runner_nodes(self) -> list[str]:
        return self._call("env_runner_nodes")

    def stop(self, abort: bool = False) -> None:
        try:
            self._call("stop", abort)
        finally:
            if self.group is not None:
                ray.kill(self.actor)
                remove_placement_group(self.group)


def spread_group(cfg: TrainConfig) -> PlacementGroup:
    """RLlib's own resource request for this PPO (driver, env runners, learners), spread over nodes."""
    bundles = [dict(b) for b in PPO.default_resource_request(build_ppo_config(cfg)).bundles]
    bundles[0][f"node:{ray.util.get_node_ip_address()}"] = NODE_PIN
    group = placement_group(bundles, strategy="SPREAD")
    ray.get(group.ready())
    return group
