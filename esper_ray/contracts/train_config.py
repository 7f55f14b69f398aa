"""Settings of one PPO training run (`esper-ray train`, one Tune trial). Flags and YAML keys use these names."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from esper_ray.contracts.actions import Tempo
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.envs_split import AUTO, auto_envs_per_runner, check_envs_per_runner
from esper_ray.contracts.fields import check_int, check_keys, check_types

MODEL_PRESET_NAMES = ("cpu", "gpu")
POLICY_ARCHITECTURES = ("flat", "slots", "slots-mean")
SLOT_ARCHITECTURES = ("slots", "slots-mean")
"""The architectures of SlotPolicyModule: slots mixed by attention, or by a masked mean (Deep Sets)."""
PLACEMENTS = ("PACK", "SPREAD")
SEED_LIMIT = 2**32
MAX_ROUNDS = 100_000
"""PPO rounds a run may take at most (a round is a whole host run per env: 100,000 is years of a machine)."""
MAX_COUNT = 100_000
"""Envs, episodes per env, learners and PPO epochs at most: a count past it is a typo, not a run."""
"""Seeds are 32-bit where numpy takes them (np.random.seed, which RLlib calls in every env runner)."""
# Env settings of every run a command sets up (`train`, `eval`, every arm of `ab`, so the arms of an A/B share one env,
# and `heuristic`, so it runs the lifecycle the A/B's heuristic arm runs) unless `env` or a flag gives others; a bare
# EnvConfig (the env built directly, `host`) keeps its own defaults. commit_horizon masks a germination whose seed
# could no longer be fossilized before the run ends: with lr 3e-4 it committed the best plan on 15 of 16 seeds
# (docs/results/studies/horizon_lr/, default_lr/), and it took the rollouts from 0.36 to 0.46
# (studies/commit_horizon/).
TRAINING_ENV_DEFAULTS: dict[str, Any] = {"commit_horizon": True}
RUN_ENV_KEYS = ("task", "plugins", "family", "slots", "max_epochs", "reward_mode", "reward_family", "gamma", "seed")
"""EnvConfig's settings that a run gives at the top level (`--task`, `max_epochs:`), not under `env`: the same for
every env of the run, and what its records (train_config.json, experiment.json) have always held there."""
TRAIN_OWNED_ENV_KEYS = frozenset({*RUN_ENV_KEYS, "shard", "num_shards"})
"""EnvConfig's settings that `env` may not give: the run's (RUN_ENV_KEYS) and each env runner's shard."""
RUNNERS_KEY = "env_runners"
"""A record's env runners (envs / envs_per_runner, written with the split the run took): read back, it must agree;
a record without it and with envs_per_runner > 1 is one of issue 77's cuts 2-3, when `envs` counted runners."""


@dataclass(frozen=True, init=False)
class TrainConfig:
    """The run's settings and the EnvConfig every env of the run starts from (`env`). The run-level env settings
    (RUN_ENV_KEYS: task, max_epochs, slots, seed, ...) are given at the top level, as flags and files name them, and
    read there too (`cfg.task` is `cfg.env.task`)."""

    envs: int = 2
    """Environments of the run, env i on data shard i of envs; they run as envs / envs_per_runner env-runner
    processes (runner k's env i is env k * envs_per_runner + i)."""
    envs_per_runner: int | str = AUTO
    """Environments each env runner steps, as one vector env in its process whose CPU hosts train stacked (RLlib's
    num_envs_per_env_runner; env/vector_env.py, issue 77): a divisor of envs, or auto: 1 where the envs are no more
    than the CPU cores (of the run's Ray cluster; of an ab trial's share) or on a GPU, else envs / R with R the
    largest divisor of envs within the cores. It changes no episode, only how many processes step them; a resumed
    run keeps the split it recorded."""
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
    """Placement of the run's actors across nodes: PACK (fill a node first) or SPREAD (env runners on different
    nodes)."""
    lr: float = 3e-4
    """Adam learning rate of the policy. 3e-4 since issue 68 (1e-3 before): the steadiest training measured, and with
    commit_horizon it committed the best plan on 15 of 16 seeds (docs/results/studies/horizon_lr/, default_lr/)."""
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
    policy: str = "flat"
    """The policy network: flat (the default: every slot position read by weights of its own, policy/rl_module.py)
    or slots (one set of weights shared by every slot, with attention between slots: policy/slot_module.py, issue
    75), or slots-mean (the same network with the attention replaced by a masked mean over the slots, as Deep Sets
    mix: the alternative tune_configs/slot_mixing.yaml measures). A checkpoint of another one is refused."""
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
    env: EnvConfig = field(default_factory=lambda: EnvConfig(**TRAINING_ENV_DEFAULTS))
    """The env settings of the run: its RUN_ENV_KEYS, given at the top level, and any other (batch_size, host_lr, amp,
    device, data_dir, ...; see `esper-ray heuristic --help`), given as a mapping under `env`. Runs set up from these
    settings (train, eval, every arm of ab) get TRAINING_ENV_DEFAULTS unless `env` says otherwise."""

    def __init__(self, env: EnvConfig | Mapping[str, Any] = MappingProxyType({}), **settings: Any) -> None:
        """`env`: a mapping of env settings (TRAINING_ENV_DEFAULTS under it, RUN_ENV_KEYS refused there) or a built
        EnvConfig; `settings`: TrainConfig's fields and RUN_ENV_KEYS, which go into the env (over a built one's)."""
        check_keys(TrainConfig, settings, "training setting", also=(*RUN_ENV_KEYS, RUNNERS_KEY))
        runners = settings.pop(RUNNERS_KEY, None)
        for f in dataclasses.fields(self):
            if f.name != "env":
                object.__setattr__(self, f.name, settings.get(f.name, f.default))
        run = {k: settings[k] for k in RUN_ENV_KEYS if k in settings}
        seed = run.get("seed", env.seed if isinstance(env, EnvConfig) else 0)
        if (
            all(type(n) is int for n in (seed, self.envs)) and seed + self.envs >= SEED_LIMIT
        ):  # before the env's own check
            raise ValueError(
                f"seed={seed}: must be below 2**32 - envs = {SEED_LIMIT - self.envs:,} (numpy seeds are "
                f"32-bit, and RLlib seeds env runner k with seed + k)"
            )
        if isinstance(env, EnvConfig):
            env = dataclasses.replace(env, **run) if run else env
        elif isinstance(env, Mapping):
            owned = sorted(TRAIN_OWNED_ENV_KEYS & set(env))
            if owned:
                raise ValueError(
                    f"env: {owned} are training settings; set them at the top level (e.g. --max-epochs), not under env"
                )
            env = EnvConfig.from_mapping({**TRAINING_ENV_DEFAULTS, **run, **env})
        else:
            raise ValueError(f"env={env!r}: must be a mapping of env settings")
        object.__setattr__(self, "env", env)
        self.__post_init__()
        if runners is not None and (self.envs_per_runner == AUTO or runners != self.env_runners):
            raise ValueError(
                f"{RUNNERS_KEY}={runners!r}: a record of envs / envs_per_runner "
                f"({self.envs} / {self.envs_per_runner}); leave it out"
            )

    def __post_init__(self) -> None:
        check_types(self)
        for name, minimum, maximum in (
            ("envs", 1, MAX_COUNT),
            ("episodes_per_env", 1, MAX_COUNT),
            ("rounds", 1, MAX_ROUNDS),
            ("learners", 0, MAX_COUNT),
            ("ppo_epochs", 1, MAX_COUNT),
            ("checkpoint_every", 0, MAX_ROUNDS),
        ):
            check_int(name, getattr(self, name), minimum, maximum)
        check_envs_per_runner(self.envs_per_runner, self.envs)
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
        if not 0 <= self.gae_lambda <= 1:  # gamma: the env's, checked there
            raise ValueError(f"gae_lambda={self.gae_lambda}: must be in [0, 1]")
        if self.mps and self.gpus_per_env == 0:
            raise ValueError(
                "mps=True shares a GPU between env processes, but gpus_per_env=0 gives them none; "
                "set --gpus-per-env (0.25 puts four envs on a GPU) or leave --mps out"
            )
        if self.lead and not self.overlap:
            raise ValueError(
                "lead=True needs overlap=True (the runners lead while the learner trains on the round "
                "before); add --overlap or leave --lead out"
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement={self.placement!r}: choose one of {list(PLACEMENTS)}")
        if self.model not in MODEL_PRESET_NAMES:
            raise ValueError(f"model={self.model!r}: choose one of {list(MODEL_PRESET_NAMES)}")
        if self.policy not in POLICY_ARCHITECTURES:
            raise ValueError(f"policy={self.policy!r}: choose one of {list(POLICY_ARCHITECTURES)}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> TrainConfig:
        """Strict: unknown keys are errors that list the valid ones. Reads every train_config.json and experiment
        record written so far: the run-level env settings at the top level, the others under `env`."""
        return cls(**dict(mapping))

    @classmethod
    def from_record(cls, mapping: Mapping[str, Any]) -> TrainConfig:
        """A run's record (train_config.json, an A/B trial's settings): from_mapping, reading those written before
        `auto` as they ran: without envs_per_runner, one env per runner; with N > 1 but no RUNNERS_KEY (issue 77's
        cuts 2-3), `envs` counted the runners, so the run had envs x N envs."""
        raw = dict(mapping)
        per_runner = raw.setdefault("envs_per_runner", 1)
        if RUNNERS_KEY not in raw and isinstance(per_runner, int) and per_runner > 1:
            raw["envs"] = raw.get("envs", cls.default("envs")) * per_runner
        return cls(**raw)

    @staticmethod
    def default(name: str) -> Any:
        """A training setting's default where none is given (a run-level env setting's: EnvConfig's), for readers of
        settings files that build no TrainConfig (building one imports the plug-ins the settings name)."""
        owner = EnvConfig if name in RUN_ENV_KEYS else TrainConfig
        return owner.__dataclass_fields__[name].default  # type: ignore[attr-defined]

    def env_config(self, shard: int | None = None, num_shards: int | None = None) -> dict[str, Any]:
        """The env_config every env runner receives (shard and num_shards are filled in per runner)."""
        config = {
            f.name: getattr(self.env, f.name)
            for f in dataclasses.fields(EnvConfig)
            if f.name not in ("shard", "num_shards")
        }
        config.update(plugins=list(self.plugins), slots=list(self.slots))  # plain lists: RLlib's config is JSON-like
        if shard is not None:
            config.update(shard=shard, num_shards=num_shards)
        return config

    def to_dict(self) -> dict[str, Any]:
        """The format of every record so far: the run-level env settings at the top level, and under `env` the
        others that differ from a run's defaults (EnvConfig's with TRAINING_ENV_DEFAULTS)."""
        run = {k: list(v) if isinstance(v := getattr(self.env, k), tuple) else v for k in RUN_ENV_KEYS}
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "env"}
        if own["policy"] == "flat":  # records of the default network stay as they were before `policy` (issue 75)
            del own["policy"]
        # The split the run took, so that a resume takes it again (from_record); one env a runner is left out, as in
        # every record before envs_per_runner, which from_record reads as 1 (issue 77)
        if own["envs_per_runner"] == 1:
            del own["envs_per_runner"]
        elif own["envs_per_runner"] != AUTO:
            own[RUNNERS_KEY] = self.env_runners
        default = TrainConfig().env
        env = {
            f.name: getattr(self.env, f.name)
            for f in dataclasses.fields(EnvConfig)
            if f.name not in TRAIN_OWNED_ENV_KEYS and getattr(self.env, f.name) != getattr(default, f.name)
        }
        return {**run, **own, "env": env}

    def short_run_warning(self, tempo: Tempo | None = None) -> str | None:
        """EnvConfig.short_run_warning of this run's env: one line when no seed (at `tempo`) can be kept in it."""
        return self.env.short_run_warning(tempo)

    @property
    def host_name(self) -> str:
        """The registered name of the host this run grows (host_preset under env, or the task's own)."""
        return self.env.effective_host_preset

    # The run-level env settings, read where the run's settings are read (`cfg.task`): the env's own.
    task = property(lambda self: self.env.task)
    plugins = property(lambda self: self.env.plugins)
    family = property(lambda self: self.env.family)
    slots = property(lambda self: self.env.slots)
    max_epochs = property(lambda self: self.env.max_epochs)
    reward_mode = property(lambda self: self.env.reward_mode)
    reward_family = property(lambda self: self.env.reward_family)
    gamma = property(lambda self: self.env.gamma)
    seed = property(lambda self: self.env.seed)

    @property
    def effective_learner_cpus(self) -> float:
        return self.learner_cpus if self.learner_cpus is not None else 0.0

    @property
    def episode_lengths(self) -> tuple[int, ...]:
        """Epochs of an episode: max_epochs, or each family member's."""
        members = self.env.members()
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
        return self.total_envs * self.episode_steps_per_env

    @property
    def total_envs(self) -> int:
        """Environments of the run, each on its own data shard: `envs`, however they are split into runners."""
        return self.envs

    @property
    def env_runners(self) -> int:
        """Env-runner processes: envs / runner_envs."""
        return self.envs // self.runner_envs

    @property
    def runner_envs(self) -> int:
        """envs_per_runner as a number. `train` and `ab` decide `auto` before they build anything (`resolved`);
        settings left at auto (a PPOConfig built directly: tests, benchmarks) run one env a runner, as before auto."""
        return 1 if self.envs_per_runner == AUTO else int(self.envs_per_runner)

    def resolved(self, cores: float) -> TrainConfig:
        """These settings with envs_per_runner an integer: `auto` decided for `cores` CPU cores (envs_split.py);
        an integer stays."""
        if self.envs_per_runner != AUTO:
            return self
        per_runner = auto_envs_per_runner(self.envs, cores, on_gpu=self.gpus_per_env > 0)
        return dataclasses.replace(self, envs_per_runner=per_runner)
