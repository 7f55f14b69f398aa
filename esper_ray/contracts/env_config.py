"""Settings of one MorphogeneticEnv, validated from the mapping RLlib passes as `env_config`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from esper_ray.contracts import families, registry
from esper_ray.contracts.actions import Tempo
from esper_ray.contracts.fields import MAX_INT, check_int, check_keys, check_types
from esper_ray.contracts.lifecycle import GateMode, LifecycleConfig
from esper_ray.contracts.rewards import RewardConfig

AMP_MODES = ("auto", "fp32", "off", "bf16", "fp16")
MIXED_AMP_MODES = ("bf16", "fp16")
"""The modes that ask for mixed precision by name: on a CPU they are ignored with a note (auto is not asking)."""
# Defaults shared by `train`, `heuristic` and `eval`. digits-impaired, because on digits the host alone reaches
# ~98 % and there is nothing for a controller to learn; a 25-epoch run is long enough for a seed to go from
# germination through 10 epochs of TRAINING and its blend to HOLDING, and short enough for a CPU.
DEFAULT_TASK = "digits-impaired"
DEFAULT_MAX_EPOCHS = 25
MAX_EPOCHS = 10_000
"""Host epochs an episode may take at most: one RL step each, so 10,000 is days of a GPU per episode already."""

# Per-task defaults where the tasks differ (batch per env, host learning rate, augmentation, validation chunk) are
# registered with each task (contracts/registry.py). val_batch_size: the 32x32 image tasks validate in one chunk of up
# to 10,000 images (a few hundred MB of activations on a GPU; fewer, fuller kernels: 0.41 -> 0.33 us a validation
# sample on an H100, issue 22); text in chunks of 1,024 sequences (logits of [K, chunk, T, 256] floats grow with the
# context).
TASKS = tuple(registry.task_names(builtin_only=True))
"""The built-in tasks (a run may name any registered task)."""
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    name: {key: getattr(registry.task(name), key) for key in ("batch_size", "host_lr", "augment", "val_batch_size")}
    for name in TASKS
}
"""The built-in tasks' registered defaults (benchmarks read them)."""
HOST_PRESET_CHOICES = {name: registry.task(name).hosts for name in TASKS if len(registry.task(name).hosts) > 1}
"""Built-in tasks that may use another built-in host than their own."""


@dataclass(frozen=True)
class EnvConfig:
    task: str = DEFAULT_TASK
    """Task: digits-impaired (embedded, a starved host that seeds can rescue; default), digits (embedded; the host
    alone reaches ~98 %), cifar10 (needs data_dir), synthetic (generated CIFAR-shaped data), text (byte-level language
    modelling: Python's embedded help texts, or the .txt files of data_dir), or a task a plug-in registers."""
    plugins: tuple[str, ...] = ()
    """Modules that register your own tasks, hosts or blueprints ('package.module' or 'package.module:function'),
    imported before any name is looked up, in every process of the run, Ray's workers included, and recorded in its
    checkpoints (docs/plugins.md)."""
    family: str | None = None
    """A registered family of hosts and tasks (digits-family, digits-family-3slot, digits-held-out or a plug-in's):
    each episode draws one member and applies its settings over these (docs/families.md). None: one host, these
    settings."""
    train_samples: int | None = None
    """A data budget: train on the training split's first this many samples only (split among the shards; None:
    all of them)."""
    slots: tuple[str, ...] = ("r0c0", "r0c1", "r0c2")
    """Enabled seed slots: `r{row}c{col}` on the built-in hosts, the names a plug-in host declares on its own; where
    none are given and the host lacks these (a plug-in's host), `train` and `ab` take every slot the host declares, up
    to the policy's MAX_SLOTS."""
    max_epochs: int = DEFAULT_MAX_EPOCHS
    """Episode length in host epochs, one RL step each (the original used 150; the CPU default is short)."""
    reward_mode: str = "committed"
    """shaped, committed, simplified, sparse, basic, basic_plus, escrow or minimal (rewards/)."""
    reward_family: str = "contribution"
    """contribution (counterfactual accuracy) or loss (validation loss; shaped only)."""
    gamma: float = 0.995
    """Discount of PPO and of the reward's potential-based shaping."""
    param_cost_pp: float = 1.0
    """committed reward: accuracy points charged per doubling of the network by its seeds."""
    committed_stage_weight: float = 1.0
    """committed reward: weight of the potential-based shaping on the seeds' lifecycle stages (accuracy points)."""
    batch_size: int | None = None
    """Training batch per env; None takes the task default (64 digits, 512 CIFAR)."""
    host_lr: float | None = None
    """Host SGD learning rate (momentum 0.9, weight decay 5e-4); None takes the task default."""
    seed_lr: float = 0.01
    """Learning rate of each seed's own SGD optimizer while it TRAINS (alpha 0, straight-through)."""
    blended_seed_lr: float | None = None
    """Learning rate of a seed's SGD optimizer from BLENDING on; None takes the host's on text (a kept attention
    seed at 0.01 under a host at 0.3 barely moved: text-starved, seed 0, test 0.292 against 0.364 at 0.3) and
    seed_lr on the image tasks."""
    min_training_epochs: int = 10
    """Epochs a seed spends in TRAINING before it may blend (gate G2). With 10, the fastest lifecycle is
    germinate, 10 epochs of TRAINING, a 3-epoch blend, then FOSSILIZE at epoch 15: an episode needs more epochs."""
    min_prune_age: int = 5
    """Epochs since germination before a seed may be pruned (the original's MIN_PRUNE_AGE). At or above
    min_training_epochs a seed cannot be pruned before it blends, when its contribution is first measured: a
    prune in TRAINING is a guess from the blueprint alone (measurements/policy_probe.py)."""
    commit_horizon: bool = False
    """Mask each tempo of GERMINATE once a seed planted now at that tempo could no longer be fossilized before the
    run ends (LifecycleConfig.commit_steps no longer fits in the steps left), and GERMINATE once even the fast
    tempo's does not (with the defaults, after step 11 of 25). A run keeps only its fossils, so such a seed can
    never be kept, and one that blends and is then dropped costs the host what it adapted to it: on digits-impaired
    every greedy policy of step_and_batch.yaml planted the fixed arm's seed at step 1 and then a second one at steps
    12-25, never kept (docs/learning.md s. 8). Off in a bare EnvConfig, on in every run a command sets up (train, eval,
    heuristic, every arm of ab: TrainConfig's TRAINING_ENV_DEFAULTS)."""
    mask_cut_off: bool = False
    """Mask GERMINATE in a slot the loss cannot reach once the seed below is kept: upstream of a CNN seed that blends
    by ADD (toward any target: seeds are kept at alpha 1 only) or holds it. A CNN seed reads the host detached, so at
    alpha 1 nothing upstream of it gets a gradient; a seed planted there never passes G2, or never finishes, and the
    run drops it (env/masks.py `cut_off`). On digits-impaired in 32-epoch runs PPO's
    policies planted their second seed in r0c0, upstream of their first in r0c1, on 1 of 8 seeds with the defaults
    and on 2 of the 3 seeds probed with commit_horizon (docs/learning.md s. 8)."""
    max_grad_norm: float = 1.0
    """Gradient clip for the host and for each seed, separately."""
    amp: str = "auto"
    """Mixed precision: auto (bf16 on a CUDA GPU that has it, fp32 elsewhere), fp32 (or off), bf16 (no scaler) or
    fp16 (one GradScaler per env); CPUs always train in fp32. bf16 is the GPU default because an 8-seed A/B found no
    difference in what the controller learns (docs/results/studies/precision/: ppo fp32 0.2535, bf16 0.2531, Holm p
    0.74) and it gives 18 % more host samples/s (benchmarks/results/throughput_h200_2026-11-27.jsonl)."""
    device: str = "auto"
    """auto (CUDA when visible, else CPU), cpu, cuda or cuda:N."""
    seed: int = 0
    """Seed of a training run's policy and env runners; with the shard it fixes each env's host initialization and
    data order, the same in every A/B arm."""
    shard: int = 0
    """This env's data shard (RLlib: env-runner index - 1)."""
    num_shards: int = 1
    """Number of disjoint training shards (RLlib: number of env runners)."""
    data_dir: str | None = None
    """cifar10: folder holding CIFAR-10 in torchvision's format (cifar-10-batches-py/); text: a folder of .txt files
    (TinyStories, say) instead of the embedded corpus."""
    host_preset: str | None = None
    """The host network: None takes the task's own; task text may use text-gpu (a 4.9M-parameter transformer
    with a 256-byte context) or text-starved (the text host whose own attention sees only the current byte, a
    host that attention seeds can rescue) instead of text (170K parameters, 64 bytes); any task may use a host a
    plug-in registers."""
    text_max_bytes: int | None = None
    """text: keep only the corpus's first this many bytes (None: all of it; the embedded corpus is ~466 KB)."""
    synthetic_size: int = 10_000
    """Training samples of the synthetic task, split among the shards."""
    synthetic_held_out: int | None = None
    """Validation and test samples of the synthetic task, each; None: a fifth of synthetic_size. Every env validates
    on all of them, so a benchmark comparing runs of different env counts at equal work per env fixes this."""
    augment: bool | None = None
    """Random crop and flip on the device; None takes the task default (on for cifar10)."""
    gate_mode: str = "permissive"
    """Lifecycle gates: permissive (RL default) or strict."""
    auto_forward: bool = True
    """Advance seeds through the lifecycle when gates pass; masks the ADVANCE op when on."""
    max_seeds: int | None = None
    """Most live seeds at once; None = one per enabled slot. 0 masks GERMINATE: the host alone, whatever the
    controller (what `benchmarks/throughput.py --env max_seeds=0` uses to give both of its halves the same work)."""
    val_batch_size: int | None = None
    """Validation samples (text: sequences) per fused forward chunk, each chunk running every counterfactual
    configuration; None takes the task default (10,000 for cifar10 and synthetic, 1,024 for the others)."""
    cudnn_deterministic: bool = False
    """On CUDA, use cuDNN's deterministic algorithms: bit-identical reruns, about 3x slower host training (RLlib
    turns them on in every seeded worker; the env sets this back to what is asked)."""
    cuda_graphs: bool = True
    """On CUDA, replay the train step from a captured CUDA graph (fp32 and bf16; fp16 stays eager)."""
    graph_validation: bool = True
    """With cuda_graphs on CUDA, also replay the fused validation pass from a captured graph
    (env/validation_graph.py)."""
    governor: bool = True
    """Roll back to the last good snapshot on NaN/Inf or diverging validation loss."""

    def __post_init__(self) -> None:
        if self.amp is False:  # YAML, and so --env and experiment files, read `amp: off` as false
            object.__setattr__(self, "amp", "off")
        check_types(self)
        object.__setattr__(self, "plugins", tuple(self.plugins))
        registry.load_plugins(self.plugins)  # before any name is looked up: in a Ray worker too
        registry.task(self.task)  # an unknown name lists the known ones
        if isinstance(self.slots, str) or not all(isinstance(s, str) for s in self.slots):
            raise ValueError(f"slots={self.slots!r}: must be a list of slot names such as ['r0c0', 'r0c1']")
        object.__setattr__(self, "slots", tuple(self.slots))
        for name, minimum, maximum in (
            ("max_epochs", 1, MAX_EPOCHS),
            ("seed", 0, MAX_INT),
            ("shard", 0, MAX_INT),
            ("num_shards", 1, MAX_INT),
            ("synthetic_size", 10, MAX_INT),
            ("min_training_epochs", 0, MAX_EPOCHS),
            ("min_prune_age", 0, MAX_EPOCHS),
        ):
            check_int(name, getattr(self, name), minimum, maximum)
        if self.synthetic_held_out is not None:
            check_int("synthetic_held_out", self.synthetic_held_out, 10)
        if self.text_max_bytes is not None:
            check_int("text_max_bytes", self.text_max_bytes, 1_000)
        if self.train_samples is not None:
            check_int("train_samples", self.train_samples, max(self.num_shards, 1))  # every shard needs a sample
        if self.host_preset is not None:
            registry.host(
                self.host_preset, field="host_preset"
            )  # an unknown name lists the known ones; an import string registers itself
        own = list(registry.task(self.task).hosts)
        plugin_hosts = [h for h in registry.hosts_for(self.task) if h not in own]
        if (self.host_preset is None and not own) or (
            self.host_preset is not None and self.host_preset not in own + plugin_hosts
        ):
            also = f" or a plug-in's host {plugin_hosts}" if plugin_hosts else ""
            raise ValueError(f"host_preset={self.host_preset!r}: task {self.task} takes one of {own}{also}")
        if self.shard >= self.num_shards:
            raise ValueError(f"shard={self.shard}: must be < num_shards={self.num_shards}")
        for name, least in (("batch_size", 1), ("max_seeds", 0), ("val_batch_size", 1)):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), least)
        for name in ("host_lr", "seed_lr", "blended_seed_lr", "max_grad_norm"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name}={value!r}: must be a number > 0")
        for name in ("param_cost_pp", "committed_stage_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r}: must be a number >= 0")
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp={self.amp!r}: choose one of {list(AMP_MODES)}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device={self.device!r}: use auto, cpu, cuda or cuda:N")
        if self.gate_mode not in [m.value for m in GateMode]:
            raise ValueError(f"gate_mode={self.gate_mode!r}: choose one of {[m.value for m in GateMode]}")
        self.reward_config  # noqa: B018  (the property validates reward_mode / reward_family / gamma together)
        if self.family is not None:
            self.members()  # each member's settings, checked now

    def members(self) -> tuple[tuple[families.Member, EnvConfig], ...]:
        """The family's members, each with the env settings of its episodes (these, its overrides applied); () without
        a family. ValueError naming the family, the member and the field for a setting that does not fit."""
        if self.family is None:
            return ()
        out = []
        for member in families.family(self.family):
            where = f"family {self.family!r}, member {member.name!r}"
            fixed = sorted(families.RUN_KEYS & set(member.env))
            if fixed:
                raise ValueError(
                    f"{where}: {fixed} are the run's settings, the same for every member; set them on the run"
                )
            try:
                check_keys(EnvConfig, member.env, "env setting")
                cfg = dataclasses.replace(self, family=None, **member.env)  # its slots: checked by the env (a host)
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from None
            out.append((member, cfg))
        return tuple(out)

    def short_run_warning(self, tempo: Tempo | None = None) -> str | None:
        """One line when no seed (at `tempo`; None: at any tempo) can be kept in a run of these settings or of a
        family member's: every host run then ends as the host alone, whatever the controller, so the arms of an A/B
        tie with no growth. None when one can, or where max_seeds=0 asks for none. Every command that sets up host
        runs prints it (train, eval, heuristic, grow, ab per arm and held-out host)."""
        configs = [(f"member {member.name}: ", cfg) for member, cfg in self.members()] or [("", self)]
        lines = [where + line for where, cfg in configs if (line := _too_short(cfg, tempo)) is not None]
        if not lines:
            return None
        return (f"family {self.family}: " if self.family is not None else "") + "; ".join(lines)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> EnvConfig:
        """Build from a plain mapping (RLlib's env_config); unknown keys are errors that list the valid ones."""
        check_keys(cls, mapping, "env_config key")
        return cls(**dict(mapping))

    # ------------------------------------------------------------- derived
    @property
    def reward_config(self) -> RewardConfig:
        """A fresh RewardConfig for this env (each env holds its own copy). The loss family's scales follow the
        task: a text model's loss per byte moves in larger steps and ends far above an image classifier's."""
        loss_scales = {"loss_sigma": 0.15, "loss_target": 1.5} if self.tokens else {}
        return RewardConfig(
            mode=self.reward_mode,
            family=self.reward_family,
            gamma=self.gamma,  # type: ignore[arg-type]
            param_cost_pp=self.param_cost_pp,
            committed_stage_weight=self.committed_stage_weight,
            **loss_scales,
        )

    @property
    def lifecycle(self) -> LifecycleConfig:
        return LifecycleConfig(
            gate_mode=self.gate_mode,
            auto_forward=self.auto_forward,
            seed_lr=self.seed_lr,  # type: ignore[arg-type]
            min_training_epochs=self.min_training_epochs,
            min_prune_age=self.min_prune_age,
            blended_seed_lr=self.effective_blended_seed_lr,
        )

    @property
    def effective_blended_seed_lr(self) -> float:
        if self.blended_seed_lr is not None:
            return self.blended_seed_lr
        return self.effective_host_lr if self.tokens else self.seed_lr

    @property
    def tokens(self) -> bool:
        """The task's loss is per token (a language model), not per sample."""
        return registry.task(self.task).loss == "tokens"

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size if self.batch_size is not None else registry.task(self.task).batch_size

    @property
    def effective_val_batch_size(self) -> int:
        return self.val_batch_size if self.val_batch_size is not None else registry.task(self.task).val_batch_size

    @property
    def effective_host_lr(self) -> float:
        return self.host_lr if self.host_lr is not None else registry.task(self.task).host_lr

    @property
    def effective_augment(self) -> bool:
        return self.augment if self.augment is not None else registry.task(self.task).augment

    @property
    def effective_host_preset(self) -> str:
        return self.host_preset if self.host_preset is not None else registry.task(self.task).hosts[0]

    @property
    def effective_max_seeds(self) -> int:
        return self.max_seeds if self.max_seeds is not None else len(self.slots)


def _too_short(cfg: EnvConfig, tempo: Tempo | None) -> str | None:
    """EnvConfig.short_run_warning for one host's settings: the soonest epoch a seed can be fossilized, from what,
    and the settings that would make room for it."""
    lifecycle = cfg.lifecycle
    need = lifecycle.min_epochs_to_keep(tempo)
    if cfg.effective_max_seeds == 0 or cfg.max_epochs >= need:
        return None
    ramp = tempo if tempo is not None else min(Tempo, key=lifecycle.commit_steps)
    advance = "" if cfg.auto_forward else "1 to ADVANCE out of GERMINATED (auto_forward off), "
    fix = f"max_epochs >= {need}"
    if cfg.max_epochs - (need - lifecycle.min_training_epochs) >= 0:
        fix += f" or min_training_epochs <= {cfg.max_epochs - (need - lifecycle.min_training_epochs)}"
    what = "no seed" if tempo is None else f"no seed at tempo {tempo.name.lower()}"
    outcome = "every host run ends as the host alone" if tempo is None else "a plan at that tempo keeps nothing"
    blend = f"the fastest tempo's {ramp.epochs}-epoch blend" if tempo is None else f"its {ramp.epochs}-epoch blend"
    return (
        f"{what} can be kept in a run of max_epochs={cfg.max_epochs}: the soonest one is fossilized at epoch {need} "
        f"(planted at epoch 1, {advance}min_training_epochs={lifecycle.min_training_epochs} in TRAINING, {blend}, 1 in "
        f"HOLDING), so {outcome}; set {fix}"
    )
