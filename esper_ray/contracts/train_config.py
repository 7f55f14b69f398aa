"""Settings of one PPO training run (`esper-ray train`, one Tune trial). Flags and YAML keys use these names."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from esper_ray.contracts.actions import Tempo
from esper_ray.contracts.env_config import DEFAULT_MAX_EPOCHS, DEFAULT_TASK, MAX_EPOCHS, EnvConfig
from esper_ray.contracts.fields import check_int, check_keys, check_types

MODEL_PRESET_NAMES = ("cpu", "gpu")
PLACEMENTS = ("PACK", "SPREAD")
SEED_LIMIT = 2**32
MAX_ROUNDS = 100_000
"""PPO rounds a run may take at most (a round is a whole host run per env: 100,000 is years of a machine)."""
MAX_COUNT = 100_000
"""Envs, episodes per env, learners and PPO epochs at most: a count past it is a typo, not a run."""
"""Seeds are 32-bit where numpy takes them (np.random.seed, which RLlib calls in every env runner)."""
# Env settings that TrainConfig sets itself; `env` may not override them.
# Env settings of every run a command sets up (`train`, `eval`, every arm of `ab`, so the arms of an A/B share one env,
# and `heuristic`, so it runs the lifecycle the A/B's heuristic arm runs) unless `env` or a flag gives others; a bare
# EnvConfig (the env built directly, `host`) keeps its own defaults. commit_horizon masks a germination whose seed could no longer be
# fossilized before the run ends: with lr 3e-4 it committed the best plan on 15 of 16 seeds (docs/results/studies/
# horizon_lr/, default_lr/), and it took the rollouts from 0.36 to 0.46 (studies/commit_horizon/).
TRAINING_ENV_DEFAULTS: dict[str, Any] = {"commit_horizon": True}
TRAIN_OWNED_ENV_KEYS = frozenset({"task", "family", "plugins", "slots", "max_epochs", "reward_mode", "reward_family", "gamma", "seed", "shard", "num_shards"})


@dataclass(frozen=True)
class TrainConfig:
    task: str = DEFAULT_TASK
    """Task: digits-impaired (embedded, a starved host that seeds can rescue; default), digits (embedded; the host
    alone reaches ~98 %), cifar10 (needs env.data_dir), synthetic (generated CIFAR-shaped data), text (byte-level
    language modelling: Python's embedded help texts, or the .txt files of env.data_dir), or a task a plug-in
    registers."""
    family: str | None = None
    """A registered family of hosts and tasks to train on (digits-family-3slot, digits-family, or a plug-in's): each
    episode draws one member, whose settings override these (docs/families.md). None: one host, these settings."""
    plugins: tuple[str, ...] = ()
    """Modules that register your own tasks, hosts or blueprints ('package.module' or 'package.module:function'),
    imported in every process of the run, Ray's workers included, and recorded in its checkpoints (docs/plugins.md)."""
    slots: tuple[str, ...] = ("r0c0", "r0c1", "r0c2")
    """Enabled seed slots; where none are given and the host lacks these (a plug-in's host), `train` and `ab` take
    every slot the host declares, up to the policy's MAX_SLOTS."""
    max_epochs: int = DEFAULT_MAX_EPOCHS
    """Episode length in host epochs (the original used 150; the CPU default is short)."""
    reward_mode: str = "committed"
    """shaped, committed, simplified, sparse, basic, basic_plus, escrow or minimal (rewards/)."""
    reward_family: str = "contribution"
    """contribution or loss (loss only with shaped)."""
    envs: int = 2
    """Env-runner actors, one environment each; env k trains on data shard k."""
    episodes_per_env: int = 4
    """Episodes each env runner collects per round (per PPO update)."""
    rounds: int = 20
    """Training rounds (RLlib iterations): collect episodes, then one PPO update."""
    gpus_per_env: float = 0.0
    """GPU share of each env runner (0.25 puts four envs on one GPU)."""
    cpus_per_env: float = 1.0
    """CPU share of each env runner."""
    learners: int = 1
    """0: learner in the driver; 1: a remote learner actor; K > 1: K learners with DDP."""
    learner_gpus: float = 0.0
    """GPUs per learner."""
    learner_cpus: float | None = None
    """CPUs reserved per learner; None: none. The learner works between rounds, while the env runners wait, so on
    one machine it needs no cores of its own (RLlib would reserve 1 for a CPU learner); with `overlap` it works
    during the rounds and competes with the envs for the cores it has not reserved."""
    driver_cpus: float = 1.0
    """CPUs reserved for the process that drives the algorithm (a Tune trial's own process in `esper-ray ab`)."""
    mps: bool = False
    """Start a private CUDA MPS daemon on every GPU node for the run, so that envs sharing a GPU run their
    kernels side by side instead of in turns; stopped when the run ends. Off by default (no use with one env
    per GPU)."""
    overlap: bool = False
    """Let the learner train on round k's episodes while the env runners sample round k+1 (train/rllib/overlap.py): the
    learner update (about 1 s a round on a GPU) no longer stops the envs, and the runners act with weights one
    update older. Off by default: it changes what is learned, and it pays only where the learner has a GPU share
    or cores of its own."""
    lead: bool = False
    """With `overlap`: an env runner done with round k starts round k+1 at once, without waiting for the other
    runners and the driver (train/rllib/env_runner.py): the slowest runner, the collection of the episodes and the
    weight send no longer stop the others. Round k+1 then samples with the weights and observation filter sent
    after round k-1 (one update older than with `overlap` alone), always the same ones, so runs replay. No runner
    leads into the round after a checkpoint (every `checkpoint_every` rounds) or past the last. Off by default: it
    changes what is learned (with the envs on GPUs it gains most on several cards: docs/performance.md)."""
    placement: str = "PACK"
    """Placement of the run's actors across nodes: PACK (fill a node first) or SPREAD (env runners on different nodes)."""
    seed: int = 0
    """Seed for the policy, env runners and envs (host init and data order)."""
    lr: float = 3e-4
    """Adam learning rate of the policy. 3e-4 since issue 68 (1e-3 before): the steadiest training measured, and with
    commit_horizon it committed the best plan on 15 of 16 seeds (docs/results/studies/horizon_lr/, default_lr/)."""
    gamma: float = 0.995
    """Discount (also used by the reward's potential-based shaping)."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_param: float = 0.2
    """PPO ratio clip."""
    entropy_coeff: float = 0.05
    """Entropy bonus coefficient (of the causal entropy: heads the op ignores do not count)."""
    blueprint_entropy_coeff: float = 0.0
    """An entropy bonus on the blueprint head alone, beside entropy_coeff (which counts every head): it keeps the one
    choice an episode that decides the run from settling on a blueprint before the lifecycles' outcomes are known,
    without making the op decisions more random (docs/learning.md, section 8)."""
    vf_loss_coeff: float = 0.5
    """Value loss coefficient."""
    ppo_epochs: int = 16
    """Gradient steps per round, each on the whole batch of full-episode sequences (see train/rllib/learner.py)."""
    grad_clip: float = 5.0
    """Global gradient-norm clip of the policy update."""
    rollback_clawback: bool = True
    """When the governor rolls a host back, forfeit the episode's earlier rewards (this round's part) to 0 besides
    the -10 penalty, as the original did."""
    reward_normalization: bool = True
    """Divide rewards by their running standard deviation (no mean subtraction) and clip at +-10 before GAE, as the
    original did; the metrics stay in raw reward units."""
    model: str = "cpu"
    """Network size preset: cpu (64-unit LSTM) or gpu (512, the original's sizes)."""
    prune_logit: float = -3.0
    """Initial bias of the PRUNE entries of the policy's op head (learnable): negative makes an untrained policy prune
    less often, so a seed lives long enough to show what it brings (docs/learning.md, section 8)."""
    fossilize_logit: float = 0.0
    """Initial bias of the FOSSILIZE entries of the op head (learnable): positive makes an untrained policy commit a
    seed that reaches HOLDING within an epoch or two, so what a kept seed is worth is seen from the first rounds
    instead of the host's collapse when a seed left on probation is dropped (docs/learning.md, section 8)."""
    checkpoint_every: int = 5
    """Save a checkpoint every this many rounds (0: only at the end and on Ctrl-C)."""
    output: str = "esper_runs/train"
    """Folder for checkpoints, metrics and TensorBoard logs."""
    address: str | None = None
    """Ray cluster to join: auto or HOST:PORT; None starts a local Ray, even where another runs (ray start,
    RAY_ADDRESS): joining one takes this setting."""
    env: Mapping[str, Any] = field(default_factory=dict)
    """Further env settings (batch_size, host_lr, amp, device, data_dir, ...; see `esper-ray heuristic --help`). Runs
    set up from these settings (train, eval, every arm of ab) get TRAINING_ENV_DEFAULTS unless these say otherwise."""

    def __post_init__(self) -> None:
        check_types(self)
        object.__setattr__(self, "slots", tuple(self.slots))
        object.__setattr__(self, "plugins", tuple(self.plugins))
        object.__setattr__(self, "env", dict(self.env))
        for name, minimum, maximum in (("envs", 1, MAX_COUNT), ("episodes_per_env", 1, MAX_COUNT), ("rounds", 1, MAX_ROUNDS),
                                       ("learners", 0, MAX_COUNT), ("ppo_epochs", 1, MAX_COUNT),
                                       ("checkpoint_every", 0, MAX_ROUNDS), ("seed", 0, SEED_LIMIT), ("max_epochs", 1, MAX_EPOCHS)):
            check_int(name, getattr(self, name), minimum, maximum)
        if self.seed + self.envs >= SEED_LIMIT:  # RLlib seeds env runner k with seed + k, and numpy takes < 2**32
            raise ValueError(f"seed={self.seed}: must be below 2**32 - envs = {SEED_LIMIT - self.envs:,} (numpy seeds "
                             f"are 32-bit, and env runner k is seeded with seed + k)")
        for name in ("gpus_per_env", "learner_gpus", "learner_cpus", "entropy_coeff", "blueprint_entropy_coeff"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 0")
        for name in ("cpus_per_env", "driver_cpus", "lr", "clip_param", "grad_clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be > 0")
        if self.gpus_per_env > 1 and self.gpus_per_env != int(self.gpus_per_env):
            raise ValueError(f"gpus_per_env={self.gpus_per_env}: a fraction must be < 1 (0.25, 0.5) or a whole number")
        if self.learners > 1 and 0 < self.learner_gpus < 1:
            raise ValueError(
                f"learner_gpus={self.learner_gpus} with learners={self.learners}: DDP learners need a whole GPU each "
                f"(NCCL cannot run two ranks on one GPU); use learner_gpus=1, or learners=1 with a GPU fraction"
            )
        if not 0 < self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"gamma={self.gamma}, gae_lambda={self.gae_lambda}: gamma in (0, 1], gae_lambda in [0, 1]")
        if self.mps and self.gpus_per_env == 0:
            raise ValueError("mps=True shares a GPU between env processes, but gpus_per_env=0 gives them none; "
                             "set --gpus-per-env (0.25 puts four envs on a GPU) or leave --mps out")
        if self.lead and not self.overlap:
            raise ValueError("lead=True needs overlap=True (the runners lead while the learner trains on the round "
                             "before); add --overlap or leave --lead out")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement={self.placement!r}: choose one of {list(PLACEMENTS)}")
        if self.model not in MODEL_PRESET_NAMES:
            raise ValueError(f"model={self.model!r}: choose one of {list(MODEL_PRESET_NAMES)}")
        owned = sorted(TRAIN_OWNED_ENV_KEYS & set(self.env))
        if owned:
            raise ValueError(f"env: {owned} are training settings; set them at the top level (e.g. --max-epochs), not under env")
        EnvConfig.from_mapping(self.env_config(shard=0, num_shards=1))  # fail now, not inside an actor

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> TrainConfig:
        """Strict: unknown keys are errors that list the valid ones."""
        check_keys(cls, mapping, "training setting")
        return cls(**dict(mapping))

    def env_config(self, shard: int | None = None, num_shards: int | None = None) -> dict[str, Any]:
        """The env_config every env runner receives (shard and num_shards are filled in per runner)."""
        config: dict[str, Any] = {
            **TRAINING_ENV_DEFAULTS, "task": self.task, **({"family": self.family} if self.family is not None else {}),
            "plugins": list(self.plugins), "slots": list(self.slots), "max_epochs": self.max_epochs, "reward_mode": self.reward_mode,
            "reward_family": self.reward_family, "gamma": self.gamma, "seed": self.seed, **self.env,
        }
        if shard is not None:
            config.update(shard=shard, num_shards=num_shards)
        return config

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["slots"] = list(self.slots)
        out["plugins"] = list(self.plugins)
        out["env"] = dict(self.env)
        return out

    def short_run_warning(self, tempo: Tempo | None = None) -> str | None:
        """EnvConfig.short_run_warning of this run's env: one line when no seed (at `tempo`) can be kept in it."""
        return EnvConfig.from_mapping(self.env_config(shard=0, num_shards=1)).short_run_warning(tempo)

    @property
    def host_name(self) -> str:
        """The registered name of the host this run grows (host_preset under env, or the task's own)."""
        return EnvConfig.from_mapping(self.env_config(shard=0, num_shards=1)).effective_host_preset

    @property
    def effective_learner_cpus(self) -> float:
        return self.learner_cpus if self.learner_cpus is not None else 0.0

    @property
    def episode_lengths(self) -> tuple[int, ...]:
        """Epochs of an episode: max_epochs, or each family member's."""
        members = EnvConfig.from_mapping(self.env_config(shard=0, num_shards=1)).members()
        return tuple(cfg.max_epochs for _, cfg in members) or (self.max_epochs,)

    @property
    def longest_episode(self) -> int:
        """The LSTM's sequence length less its bootstrap step: the longest episode, so each stays one sequence."""
        return max(self.episode_lengths)

    @property
    def episode_steps_per_env(self) -> int:
        """Steps an env runner samples a round: episodes_per_env episodes of the mean length (a family's members
        are drawn in turn, so its episodes average that)."""
        lengths = self.episode_lengths
        return math.ceil(self.episodes_per_env * sum(lengths) / len(lengths))

    @property
    def episode_steps_per_round(self) -> int:
        return self.envs * self.episode_steps_per_env
