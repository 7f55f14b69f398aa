"""MorphogeneticEnv: one RL step = apply one decision, train one host epoch, validate, tick, reward.

Each env owns everything it trains with: its device and CUDA stream (all of its GPU work is issued there),
its data shard (resident on the device), its model and optimizers, its GradScaler (amp=fp16), its reward
config and its RNGs, seeded from (seed, shard). Nothing is shared with other envs.

An episode is one whole host training run, so it ends with `terminated=True`: after `max_epochs` steps (the run
is over; the last step pays the terminal reward and nothing follows it), or early when the governor rolls the
model back. `truncated` stays False: the env never cuts a run short. Only the sampler cuts episodes (a rollout
fragment ending mid-run), and RLlib bootstraps those cuts with V(s_T).

Why not truncation at `max_epochs`: the learner would then bootstrap the last step with V(s_T), a state no
loss ever trains (RLlib masks the bootstrap step), so V(s_T) follows V(s_T-1) and every value drifts to the
fixed point of a run that never ends (about 1 / (1 - gamma) = 200 times the mean reward). Measured on
digits-impaired: values of ~115 against returns of 13-36 and an explained variance of 0.000.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
import torch

from esper_ray.contracts.actions import (
    BLUEPRINT_NONE_INDEX,
    MAX_BLUEPRINTS,
    MAX_SLOTS,
    Blueprint,
    BlueprintId,
    FactoredAction,
    Op,
    Tempo,
    check_slot_count,
    topology_blueprints,
)
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.families import Member
from esper_ray.contracts.metrics import BLUEPRINT_OUTCOMES
from esper_ray.contracts.rewards import RewardBreakdown, StepSignal
from esper_ray.contracts.slots import check_slots, is_grid_slot
from esper_ray.data.augment import crop_and_flip
from esper_ray.data.datasets import TaskContext, TaskData
from esper_ray.data.sharding import DeviceShard, shard_indices
from esper_ray.data.task_loading import load_task
from esper_ray.env.blueprint_costs import COST_FEATURES, blueprint_costs
from esper_ray.env.counterfactuals import record_counterfactuals
from esper_ray.env.decisions import apply_decision
from esper_ray.env.epoch import TrainStats, ValStats, train_epoch, validate_fused
from esper_ray.env.family_draw import check_slot_counts, member_index
from esper_ray.env.faults import nan_epoch, poison_with_nan, raise_if_asked
from esper_ray.env.governor import SNAPSHOT_EVERY, Governor
from esper_ray.env.gradient_telemetry import GradientCapture
from esper_ray.env.graph_memory import GraphMemory
from esper_ray.env.infos import step_info, timed
from esper_ray.env.masks import action_nvec, compute_mask, decode_action
from esper_ray.env.observation import (
    FEATURE_BOUND,
    EpochView,
    blueprint_ids,
    build_features,
    feature_size,
    slot_descriptors,
)
from esper_ray.env.precision import precision_of, resolve_device
from esper_ray.env.spaces import MaskedMultiDiscrete
from esper_ray.env.step_signal import slot_snapshot, step_signal
from esper_ray.env.train_step import CapturedStep, StepGraphs
from esper_ray.env.validation_graph import CapturedValidation, ValidationGraphs
from esper_ray.morpho import cpu_step
from esper_ray.morpho.counterfactual import CounterfactualPlan, build_plan
from esper_ray.morpho.flops import FlopCounter, FlopTally
from esper_ray.morpho.hosts import build_host
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.transformer_blueprints import flex_attention_available
from esper_ray.rewards import compute_reward

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)
HOST_MOMENTUM = 0.9
HOST_WEIGHT_DECAY = 5e-4


@dataclass(frozen=True)
class TestStats:
    """The held-out test split, measured at the end of an evaluation episode."""

    accuracy: float
    """Of the committed model: the host and its fossilized seeds (seeds on probation dropped)."""
    loss: float
    accuracy_with_probation: float
    """Of the model as it runs, seeds on probation in at their current alpha (equals `accuracy` without any)."""


@dataclass(frozen=True)
class StepStart:
    """A step's first half (MorphogeneticEnv._begin_step): its decision and what the reward compares with."""

    timings: dict[str, float]
    decision: FactoredAction
    before: dict[str, dict[str, Any]]
    """The slots before the decision (step_signal.slot_snapshot)."""
    success: bool


@dataclass(frozen=True)
class Validated:
    """A step's validation run elsewhere (a vector env's stacked pass, env/stacked_validation.py): the plan it ran
    (`_validation_plan`), what the env's own `_validate` of that plan would return, and its share of the pass's
    seconds (added to the step's `time/val`)."""

    plan: CounterfactualPlan
    val: ValStats
    seconds: float


class MorphogeneticEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.cfg = EnvConfig.from_mapping(dict(config or {}))
        self._base_cfg = self.cfg  # with a family, self.cfg is the current member's settings
        self.model: MorphogeneticModel | None = None
        self.device = resolve_device(self.cfg.device)
        self.stream = torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None
        if self.device.type == "cuda":
            torch.backends.cudnn.deterministic = (
                self.cfg.cudnn_deterministic
            )  # a process-wide flag: one env per process
        self.precision = precision_of(self.cfg.amp, self.device)
        graphs = self.device.type == "cuda" and self.cfg.cuda_graphs
        memory = GraphMemory(self.device) if graphs else None  # one pool for all of this env's graphs
        self.graphs = StepGraphs(enabled=graphs, capture=functools.partial(CapturedStep, memory=memory))
        self.val_graphs = ValidationGraphs(
            enabled=graphs and self.cfg.graph_validation, capture=functools.partial(CapturedValidation, memory=memory)
        )
        self.family = self.cfg.members()  # (member, its env settings) per member; () without a family
        if self.family:
            check_slot_counts(self.cfg.family, self.family)  # every member now, not at its first draw
        self._member: str | None = None  # the member whose host, data and slots are in place
        self._placed = False
        self._member_data: dict[str, tuple[TaskData, DeviceShard, torch.Tensor, torch.Tensor]] = {}
        self._family_seed, self._family_draws = self.cfg.seed, 0
        self._use(*self.family[0]) if self.family else self._use(None, self.cfg)
        # Sized for MAX_SLOTS whatever the host (observation.py, masks.py): a policy runs on any host, a family's too.
        self.action_space = MaskedMultiDiscrete(action_nvec(), mask_provider=self._current_mask)
        self.observation_space = gym.spaces.Dict(
            {
                "features": gym.spaces.Box(-10.0, 10.0, shape=(feature_size(),), dtype=np.float32),
                "blueprint_ids": gym.spaces.MultiDiscrete([BLUEPRINT_NONE_INDEX + 1] * MAX_SLOTS),
                # What each offered blueprint would add at each slot (blueprint_costs.py), fixed for a host.
                "blueprint_costs": gym.spaces.Box(
                    0.0, FEATURE_BOUND, shape=(MAX_SLOTS, MAX_BLUEPRINTS, len(COST_FEATURES)), dtype=np.float32
                ),
                # 0/1 per action value. MultiDiscrete rather than MultiBinary so that observation filters, which
                # leave discrete parts alone, never rescale the mask.
                "action_mask": gym.spaces.MultiDiscrete(np.full(int(sum(action_nvec())), 2), dtype=np.int8),
            }
        )
        self._episode_rng = np.random.default_rng([self.cfg.seed, self.cfg.shard])
        self._round: int | None = None  # set by start_round() in RLlib training
        self._episode_in_round = 0

    @property
    def base_cfg(self) -> EnvConfig:
        """The settings the env was built with (with a family, `cfg` holds the current member's)."""
        return self._base_cfg

    @property
    def family_name(self) -> str | None:
        return self._base_cfg.family

    @property
    def member(self) -> str | None:
        """The family member of the current episode (None without a family)."""
        return self._member

    # ------------------------------------------------------------------ gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        with self._on_stream():
            return self._reset(seed)

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if self.model is None:
            raise RuntimeError("step() called before reset()")
        with self._on_stream():
            return self._step(action)

    def start_round(self, round_: int) -> None:
        """From now on, episode k of training round `round_` starts from a seed fixed by (seed, shard, round, k),
        whatever reset() is given, and so does this process's global generator, which samples the policy's
        actions: a resumed run then replays the rounds an uninterrupted one would have (train/rllib/rounds.py)."""
        self._round, self._episode_in_round = round_, 0

    def measure_test(self) -> TestStats:
        """The held-out test split's accuracy and loss of the committed model (host and fossils: what a host run
        keeps), and the accuracy with the seeds still on probation at their current alpha, in one fused pass.

        Only a final evaluation calls this: no reward, observation or governor decision ever reads the test
        split, so a controller is never trained on it.
        """
        if self.model is None:
            raise RuntimeError("measure_test() called before reset()")
        with self._on_stream():
            if self._test_split is None:
                self._test_split = (self.data.test_x.to(self.device), self.data.test_y.to(self.device))
            test_x, test_y = self._test_split
            alphas = torch.stack([self.model.committed_alphas(), self.model.current_alphas()])
            stats = validate_fused(
                self.model,
                test_x,
                test_y,
                alphas,
                chunk=self.cfg.effective_val_batch_size,
                prepare=self._prepare_eval,
                precision=self.precision,
            )
        return TestStats(accuracy=stats.accuracy(0), loss=stats.loss(0), accuracy_with_probation=stats.accuracy(1))

    # -------------------------------------------------------------- reset: the member, its host and data, a fresh model
    def _reset(self, seed: int | None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if seed is not None and self._round is None:
            self._family_seed, self._family_draws = seed, 0
        self._draw_member()
        if self._round is not None:
            rng = np.random.default_rng([self.cfg.seed, self.cfg.shard, self._round, self._episode_in_round])
            self._episode_in_round += 1
            # The env runner samples actions from the global generators of this process; seeding them here, at
            # the episode's start, makes the episode's actions as reproducible as its host.
            action_seed = int(rng.integers(2**31))
            random.seed(action_seed)
            np.random.seed(action_seed)
            torch.manual_seed(action_seed)
        else:
            if seed is not None:
                self._episode_rng = np.random.default_rng([seed, self.cfg.shard])
            rng = self._episode_rng
        episode_seed = int(rng.integers(2**31))
        self._episode_seed = episode_seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(episode_seed)
            model = MorphogeneticModel(build_host(self.cfg.effective_host_preset), self.slot_ids, self.cfg.lifecycle)
        model = self._in_layout(model.to(self.device))
        if self.model is None:
            self.host_optimizer = torch.optim.SGD(
                model.host.parameters(),
                lr=self.cfg.effective_host_lr,
                momentum=HOST_MOMENTUM,
                weight_decay=HOST_WEIGHT_DECAY,
                fused=cpu_step.fused_sgd(self.device),  # one kernel a step instead of several (slot.py, germinate)
            )
        else:
            self._keep_host(model)
        self.model = model
        self.data_generator = torch.Generator(device=self.device).manual_seed(episode_seed)
        self.epoch = 0
        self.loss_history: list[float] = []
        self.accuracy_history: list[float] = []
        self.last_op: Op | None = None
        self.last_success = True
        self.escrow_credits = {s: 0.0 for s in self.slot_ids}
        self.drip_pools = {s: 0.0 for s in self.slot_ids}
        self.counts = {"germinated": 0, "fossilized": 0, "pruned": 0, "rollbacks": 0, "refused": 0}
        # By blueprint, every usable one from 0, so each episode's info has the same keys (a per-episode mean of a
        # key that only some episodes carry would count only those): which seed the policy plants, and keeps.
        for outcome in BLUEPRINT_OUTCOMES:
            self.counts.update({f"{outcome}/{b.key}": 0 for b in self.blueprints})
        self.flops = FlopTally()
        self.governor = Governor(self.random_guess_loss)
        plan = self._validation_plan()
        self._record_validation(plan, self._validate(plan))
        self.initial_accuracy = self.val.accuracy()
        self.governor.check(self.val.loss())
        self.governor.snapshot(self.model, self.epoch)
        return self._observation(), self._info(reward=None, timings={}, train=None)

    def _draw_member(self) -> None:
        """Pick this episode's member: position g = episode x num_shards + shard in a sequence of shuffled blocks of
        every member, so the envs of a round together use each member once per block (and each env every member over
        enough episodes), the same in every run of this seed. In training rounds the blocks restart each round, keyed by
        (seed, round), so a resumed run draws as the uninterrupted one did; else they run on from reset(seed=...)."""
        if not self.family:
            return
        if self._round is not None:
            position, key = (
                self._episode_in_round * self.cfg.num_shards + self.cfg.shard,
                [self._base_cfg.seed, self._round],
            )
        else:
            position, key = self._family_draws * self.cfg.num_shards + self.cfg.shard, [self._family_seed]
            self._family_draws += 1
        self._use(*self.family[member_index(position, key, len(self.family))])

    def _use(self, member: Member | None, cfg: EnvConfig) -> None:
        """Put a member's host, slots and data in place (the run's own settings without a family): everything that
        follows from the env settings but the device, the spaces and the RNGs. Each member's data is loaded once."""
        name = member.name if member is not None else None
        if self._placed and name == self._member:
            return
        self.cfg, self._member, self._placed = cfg, name, True
        self.reward_config = cfg.reward_config  # this env's own copy
        probe = build_host(cfg.effective_host_preset)  # its slots, topology and context length
        self.topology = probe.topology
        self.slot_ids: list[str] = check_slots(list(cfg.slots), probe.slot_ids)
        check_slot_count(cfg.effective_host_preset, len(self.slot_ids))
        self.slot_descriptors = slot_descriptors(probe.slots(), self.slot_ids)  # fixed for a host: where each slot sits
        if cfg.mask_cut_off and not all(is_grid_slot(s) for s in self.slot_ids):
            raise ValueError(
                f"mask_cut_off=True: needs slots named r{{row}}c{{col}}, which say where each sits; host "
                f"{cfg.effective_host_preset!r} has {self.slot_ids}; leave mask_cut_off off"
            )
        self.blueprints = self._usable_blueprints()
        shapes = {s: tuple(probe.slot_shape(s)) for s in self.slot_ids}
        self.flop_counter = FlopCounter(cfg.effective_host_preset, shapes)
        self.blueprint_costs = blueprint_costs(
            cfg.effective_host_preset, self.topology, [shapes[s] for s in self.slot_ids], self.blueprints
        )
        key = name or ""
        if key not in self._member_data:
            seq_len = int(probe.example_input().shape[-1]) if cfg.tokens else 64  # a token task's context: the host's
            data = load_task(
                cfg.task,
                TaskContext(cfg.data_dir, cfg.synthetic_size, seq_len, cfg.text_max_bytes, cfg.synthetic_held_out),
            )
            available = len(data.train_y)
            if cfg.train_samples is not None and cfg.train_samples > available:
                where = f"family {self.family_name!r}, member {name!r}: " if name is not None else ""
                raise ValueError(
                    f"{where}train_samples={cfg.train_samples:,}: task {cfg.task} has only {available:,} "
                    "training samples"
                )
            idx = shard_indices(min(available, cfg.train_samples or available), cfg.shard, cfg.num_shards)
            with self._on_stream():
                shard = DeviceShard(data.train_x[idx], data.train_y[idx], self.device)
                self._member_data[key] = (data, shard, data.val_x.to(self.device), data.val_y.to(self.device))
        self.data, self.shard, self.val_x, self.val_y = self._member_data[key]
        self.random_guess_loss = math.log(self.data.num_classes)
        self._test_split: tuple[torch.Tensor, torch.Tensor] | None = None  # moved to the device on first use
        self._commit_steps = {tempo: cfg.lifecycle.commit_steps(tempo) for tempo in Tempo}
        if self.model is not None:  # another host: its own optimizer, and none of the old graphs
            self.model = None
            self.graphs.forget()
            self.val_graphs.forget()

    def _keep_host(self, model: MorphogeneticModel) -> None:
        """Give the new episode's model the host tensors and host optimizer of the episodes before, holding the new
        episode's initial values: its fresh host's values are copied in, and the optimizer's momentum is zeroed,
        which for SGD without dampening is where a new optimizer starts (its first step sets momentum to the
        gradient; zero times momentum plus the gradient is the gradient). So the captured step and validation pass
        of the host alone, kept by key (StepGraphs, ValidationGraphs), are replayed in every episode instead of
        captured anew; the graphs of the last episode's seeds are never asked for again and age out."""
        assert self.model is not None
        host = self.model.host
        host.load_state_dict(model.host.state_dict())  # copies into the same tensors: a captured graph reads them
        model.host = host
        for state in self.host_optimizer.state.values():
            momentum = state.get("momentum_buffer")
            if momentum is not None:
                momentum.zero_()

    # -------------------------------------------- step: decision, epoch, validation, rollback, reward, observation
    def _step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        start = self._begin_step(action)
        with timed(start.timings, "train"):
            train = self._train_epoch()
        return self._end_step(start, train)

    # A step in two halves around its host epoch: a vector env (vector_env.py) runs the halves of each of its envs and
    # trains the epochs of those whose hosts stack in one call between them.
    def _begin_step(self, action: np.ndarray) -> StepStart:
        """The decision: decoded against the mask, applied to the model."""
        assert self.model is not None
        timings: dict[str, float] = {}
        with timed(timings, "decision"):
            decision = decode_action(action, self._mask(), self.slot_ids)
            before = slot_snapshot(self.model)
            success = self._apply_decision(decision)
        return StepStart(timings, decision, before, success)

    def _end_step(
        self, start: StepStart, train: TrainStats, validated: Validated | None = None
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """After the epoch: validation (or the one `validated` elsewhere), lifecycle tick, governor, reward,
        observation and info."""
        assert self.model is not None
        timings, decision, success = start.timings, start.decision, start.success
        with timed(timings, "val"):
            if validated is None:
                plan = self._validation_plan()
                val = self._validate(plan)
            else:
                plan, val = validated.plan, validated.val
                self._count_validation(plan)
            prev_val = self.val
            self._record_validation(plan, val)
        if validated is not None:
            timings["val"] += validated.seconds
        with timed(timings, "lifecycle"):
            self.model.step_epoch()
            verdict = self.governor.check(val.loss()) if self.cfg.governor else None
            rollback = verdict is not None and verdict.rollback
            if rollback:
                self._roll_back()
            elif math.isfinite(val.loss()) and (
                self.epoch % SNAPSHOT_EVERY == 0 or (decision.op is Op.FOSSILIZE and success)
            ):
                self.governor.snapshot(self.model, self.epoch)
        with timed(timings, "reward"):
            signal = step_signal(self, decision, success, start.before, plan, val, prev_val)
            reward = self._reward(signal, rollback)
        with timed(timings, "observation"):
            self.last_op, self.last_success = decision.op, success
            obs = self._observation()
        terminated = rollback or self.epoch >= self.cfg.max_epochs
        info = self._info(
            reward=reward, timings=timings, train=train, rollback_reason=verdict.reason if rollback else ""
        )
        return obs, float(reward.total), bool(terminated), False, info

    def _apply_decision(self, decision: FactoredAction) -> bool:
        assert self.model is not None
        return apply_decision(
            self.model,
            decision,
            self.counts,
            episode_seed=self._episode_seed,
            epoch=self.epoch,
            in_layout=self._in_layout,
        )

    def _train_epoch(self) -> TrainStats:
        assert self.model is not None
        self._before_epoch()
        capture = GradientCapture(self.model)
        stats = train_epoch(
            self.model,
            self.host_optimizer,
            self.shard,
            batch_size=self.cfg.effective_batch_size,
            generator=self.data_generator,
            prepare=self._prepare_train,
            precision=self.precision,
            max_grad_norm=self.cfg.max_grad_norm,
            graphs=self.graphs,
            on_last_batch=capture,
        )
        capture.publish()
        self.epoch += 1
        return stats

    def _before_epoch(self) -> None:
        """What precedes an epoch's training wherever it runs (here, or stacked by a vector env): a test's injected
        faults, and the epoch's training FLOPs."""
        assert self.model is not None
        if self.epoch + 1 == nan_epoch(self.cfg.seed):  # a test's injected fault (faults.py); never set otherwise
            poison_with_nan(self.model.host)
        raise_if_asked(self.epoch + 1, self.cfg.seed)  # likewise
        total, seeds = self.flop_counter.train_epoch(self.model.seed_slots(), rows=len(self.shard))
        self.flops.train += total
        self.flops.train_seeds += seeds

    def _validation_plan(self) -> CounterfactualPlan:
        """The configurations this epoch's validation pass evaluates."""
        assert self.model is not None
        return build_plan(self.model, ablate_fossils=self.reward_config.ablates_fossils)

    def _count_validation(self, plan: CounterfactualPlan) -> None:
        """The pass's FLOPs, wherever it runs (here, or stacked by a vector env)."""
        assert self.model is not None
        main, extra = self.flop_counter.validation(self.model.seed_slots(), plan.alphas, rows=len(self.val_y))
        self.flops.validation += main
        self.flops.counterfactual += extra

    def _validate(self, plan: CounterfactualPlan) -> ValStats:
        assert self.model is not None
        self._count_validation(plan)
        return self.val_graphs.validate(
            self.model,
            self.val_x,
            self.val_y,
            plan.alphas,  # type: ignore[arg-type]
            chunk=self.cfg.effective_val_batch_size,
            prepare=self._prepare_eval,
            precision=self.precision,
        )

    def _record_validation(self, plan: CounterfactualPlan, val: ValStats) -> None:
        assert self.model is not None
        self.val = val
        self.committed_accuracy = val.accuracy(plan.committed_index)
        record_counterfactuals(self.model, plan, val)
        main = val.accuracy(0)
        self.model.observe_accuracy(main)
        self.loss_history.append(val.loss(0))
        self.accuracy_history.append(main)

    def _roll_back(self) -> None:
        """Restore the snapshot, prune live seeds, drop host momentum, and re-measure the restored model."""
        assert self.model is not None
        self.governor.restore(self.model)
        self.host_optimizer.state.clear()  # momentum from the bad trajectory must not carry over
        self.graphs.forget()  # the captured step held that momentum
        self.val_graphs.forget()
        self.counts["rollbacks"] += 1
        self.loss_history.pop()
        self.accuracy_history.pop()
        plan = self._validation_plan()
        self._record_validation(plan, self._validate(plan))

    def _reward(self, signal: StepSignal, rollback: bool) -> RewardBreakdown:
        if rollback:
            return RewardBreakdown(
                self.reward_config.rollback_penalty, {"rollback": self.reward_config.rollback_penalty}
            )
        reward = compute_reward(signal, self.reward_config)
        self.escrow_credits.update(reward.escrow_credits)
        self.drip_pools.update(reward.drip_pools)
        return reward

    def _observation(self) -> dict[str, np.ndarray]:
        assert self.model is not None
        view = EpochView(
            epoch=self.epoch,
            max_epochs=self.cfg.max_epochs,
            val_loss=self.val.loss(),
            val_accuracy=self.val.accuracy(),
            loss_history=self.loss_history,
            accuracy_history=self.accuracy_history,
            last_action_success=self.last_success,
            last_op=self.last_op,
        )
        slots = self.model.seed_slots()
        return {
            "features": build_features(view, slots, self.slot_descriptors),
            "blueprint_ids": blueprint_ids(slots),
            "blueprint_costs": self.blueprint_costs.copy(),
            "action_mask": self._mask(),
        }

    def _info(
        self,
        *,
        reward: RewardBreakdown | None,
        timings: dict[str, float],
        train: TrainStats | None,
        rollback_reason: str = "",
    ) -> dict[str, Any]:
        return step_info(self, reward=reward, timings=timings, train=train, rollback_reason=rollback_reason)

    # ------------------------------------------------------------------ helpers
    def _on_stream(self) -> contextlib.AbstractContextManager[object]:
        """Issue GPU work on this env's own stream (a no-op on CPU)."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def _usable_blueprints(self) -> tuple[BlueprintId, ...]:
        """The topology's blueprints, less flex_attention where it cannot train (no CPU backward in torch 2.13)."""
        blueprints = topology_blueprints(self.topology.value)
        if Blueprint.FLEX_ATTENTION in blueprints and not flex_attention_available(self.device)[0]:
            blueprints = tuple(b for b in blueprints if b is not Blueprint.FLEX_ATTENTION)
        return blueprints

    def _in_layout(self, module: ModuleT) -> ModuleT:
        """On CUDA, 4-d weights channels-last like the images (cuDNN's NHWC kernels). A seed left in the default
        layout is converted on every call: with seeds converted once at birth, 4 bf16 envs on an H100 stepped 7 %
        faster (benchmarks/throughput.py, 591K -> 632K samples/s bare; fp32 1 %)."""
        return module.to(memory_format=torch.channels_last) if self.device.type == "cuda" else module

    def _prepare_train(self, x: torch.Tensor) -> torch.Tensor:
        if self.data.tokens:
            return x
        x = self.data.prepare(x)
        if self.cfg.effective_augment:
            x = crop_and_flip(x, self.data_generator)
        return self._image_layout(x)

    def _prepare_eval(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.data.tokens else self._image_layout(self.data.prepare(x))

    def _image_layout(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.device.type == "cuda" and x.dim() == 4 else x

    def _current_mask(self) -> np.ndarray | None:
        return self._mask() if self.model is not None else None

    def _mask(self) -> np.ndarray:
        assert self.model is not None
        return compute_mask(
            self.model.seed_slots(),
            auto_forward=self.cfg.auto_forward,
            max_seeds=self.cfg.effective_max_seeds,
            blueprints=self.blueprints,
            tempos=self._commit_tempos(),
            mask_cut_off=self.cfg.mask_cut_off,
        )

    def _commit_tempos(self) -> tuple[Tempo, ...]:
        """The tempos a seed germinated at this step (epoch + 1) may take: with commit_horizon on, those whose
        lifecycle lets it be fossilized by the last step (max_epochs); none once even the fastest does not."""
        if not self.cfg.commit_horizon:
            return tuple(Tempo)
        return tuple(
            t
            for t, steps in self._commit_steps.items()
            if self.cfg.lifecycle.commits_in_time(self.epoch, steps, self.cfg.max_epochs)
        )
