"""N MorphogeneticEnvs in one process as one gymnasium VectorEnv, whose hosts train stacked where they can (issue 77).

Each env keeps everything it has alone (its shard, generators, episode seeds, lifecycle, governor, rewards and
observations) and runs its own step in two halves (MorphogeneticEnv._begin_step and _end_step). Between them the vector
env trains the envs' epochs: the envs with a CNN host whose seeds can stack (every seed but a prune's ramp-down and a
plug-in's seed module: morpho/stacked_seeds.py, `unstackable`) and which share the device, precision (fp32, bf16, or
fp16 with each env's own GradScaler: env/stacked_scalers.py), the host's structure and training settings train as one
stacked module in one call per batch (on a GPU all envs on one CUDA stream, the batches from CUDA graphs:
env/held_stack.py), their seeds in one stacked module per slot, blueprint, blend and stage kind (morpho/stacked.py,
morpho/stacked_seeds.py, env/stacked_step.py); every other env trains its epoch itself, exactly as a lone env does.
The validation and counterfactual pass after the epoch runs stacked likewise (env/stacked_validation.py: envs of one
host structure and validation chunk whose seeds stack, in fp32 on the CPU), each env handed the ValStats its own pass
gives; every other env, and one alone in its group, validates itself. A step's other phases (lifecycle, governor,
reward, observation: none runs a forward pass) and a reset's or a rollback's validation stay per env.

The state stays in each env: a stacked epoch copies the hosts' and seeds' tensors and their momentum into the stack,
trains, writes them back into each env's own modules and optimizers, and hands each env's last-batch gradient
telemetry to its slots. So validation, the governor's snapshots and rollbacks, the lifecycle's gates, the next
episode's kept host and the env's own epoch all read what they read in a lone env, and an env leaves or joins the
stack from one epoch to the next with nothing to hand over. The stack itself is held from one epoch to the next while
its group and their structure stay (env/held_stack.py), so the copies go into the same tensors (a foreach call each
way), and on a GPU the CUDA graphs captured over them replay in later epochs.

Autoreset is gymnasium's NEXT_STEP, which RLlib's SingleAgentEnvRunner expects of its vector envs: the step after an
env's episode ends resets that env (its action ignored) and returns the new episode's first observation, reward 0 and
neither terminated nor truncated, as SyncVectorEnv does. tests/test_vector_env.py checks this env against a
SyncVectorEnv of separate envs, step by step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from copy import deepcopy
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import concatenate, iterate

from esper_ray.env.epoch import TrainStats
from esper_ray.env.graph_memory import GraphMemory
from esper_ray.env.held_stack import HeldStack, held_key
from esper_ray.env.morphogenetic_env import MorphogeneticEnv, StepStart, Validated
from esper_ray.env.stacked_validation import validate_envs, validation_key
from esper_ray.morpho.stacked_seeds import stackable


def stack_key(env: MorphogeneticEnv) -> tuple[Any, ...] | None:
    """What envs must share for their epochs to train stacked (None: this env's epoch trains alone): the host's
    structure and the settings of its training step. Seeds need not match: the stack splits them by slot, blueprint,
    blend and stage kind inside (morpho/stacked_seeds.py); an env whose seed cannot stack (`unstackable`: a prune
    ramping down, a plug-in's seed module) trains alone."""
    model = env.model
    assert model is not None
    if not stackable(model.host, model.seed_slots()):
        return None
    group = env.host_optimizer.param_groups[0]
    return (
        env.device,
        env.precision.dtype,
        model.host.cfg,
        env.cfg.effective_batch_size,
        env.cfg.max_grad_norm,
        group["lr"],
        group["momentum"],
        group["weight_decay"],
    )


def stack_groups(
    indices: Iterable[int], key_of: Callable[[int], tuple[Any, ...] | None]
) -> tuple[list[list[int]], list[int]]:
    """`indices` by `key_of`: the groups of two or more that share a key (each runs stacked), and the rest (a None
    key, or alone with its key), in order."""
    by_key: dict[tuple[Any, ...], list[int]] = {}
    alone: list[int] = []
    for i in indices:
        key = key_of(i)
        (alone if key is None else by_key.setdefault(key, [])).append(i)
    groups = [members for members in by_key.values() if len(members) > 1]
    alone += [i for members in by_key.values() if len(members) == 1 for i in members]
    return groups, sorted(alone)


class VectorMorphogeneticEnv(SyncVectorEnv):
    """A VectorEnv of MorphogeneticEnvs, one per config, stepped as SyncVectorEnv steps them (NEXT_STEP autoreset),
    their host epochs stacked where they can be (the module doc). `stacked_epochs[i]` counts env i's epochs that
    trained stacked, `stacked_seed_epochs[i]` those of them in which a seed of env i ran in the forward pass;
    `stacked_validations[i]` counts env i's step validations that ran stacked, `stacked_counterfactuals[i]` those of
    them with more than one configuration (a seed ablated)."""

    def __init__(self, env_fns: Sequence[Callable[[], MorphogeneticEnv]]) -> None:
        if not env_fns:
            raise ValueError("VectorMorphogeneticEnv: env_fns must make at least one env, got none")
        super().__init__(env_fns, autoreset_mode=AutoresetMode.NEXT_STEP)
        # One CUDA stream for all: a stacked epoch reads and writes every env's tensors, so their work must be ordered
        # on one stream (the envs of one process run one after another anyway).
        streams = {env.stream for env in self.envs if env.stream is not None}
        if len(streams) > 1:
            torch.cuda.synchronize()  # what each env issued on its own stream while it was built
            shared = self.envs[0].stream
            for env in self.envs:
                env.stream = shared
        self.stacked_epochs = [0] * self.num_envs
        self.stacked_seed_epochs = [0] * self.num_envs
        self.stacked_validations = [0] * self.num_envs
        self.stacked_counterfactuals = [0] * self.num_envs
        self.held: dict[tuple[int, ...], tuple[tuple[Any, ...], HeldStack]] = {}
        """Each stacked group's HeldStack (env/held_stack.py) by its envs, with the key it was built for."""
        self.stack_builds = 0
        """HeldStacks built: a group's first epoch, or its first after its key changed."""
        self.stacked_captures = 0
        """CUDA graphs the held stacks captured."""
        self._graph_memory: GraphMemory | None = None

    @classmethod
    def of_configs(cls, configs: Sequence[Mapping[str, Any]]) -> VectorMorphogeneticEnv:
        """One env per config."""
        return cls([functools.partial(MorphogeneticEnv, dict(c)) for c in configs])

    @classmethod
    def sharded(
        cls, config: Mapping[str, Any], num_envs: int, first_shard: int, num_shards: int
    ) -> VectorMorphogeneticEnv:
        """`num_envs` envs of one config on shards first_shard, first_shard + 1, ... of `num_shards`."""
        return cls.of_configs([{**config, "shard": first_shard + i, "num_shards": num_shards} for i in range(num_envs)])

    def start_round(self, round_: int) -> None:
        for env in self.envs:
            env.start_round(round_)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        envs: list[MorphogeneticEnv] = self.envs  # type: ignore[assignment]
        env_infos: list[dict[str, Any]] = [{} for _ in envs]
        started: dict[int, StepStart] = {}
        for i, action in enumerate(iterate(self.action_space, actions)):
            if self._autoreset_envs[i]:
                self._env_obs[i], env_infos[i] = envs[i].reset()
                self._rewards[i], self._terminations[i], self._truncations[i] = 0.0, False, False
            else:
                if envs[i].model is None:
                    raise RuntimeError("step() called before reset()")
                with envs[i]._on_stream():
                    started[i] = envs[i]._begin_step(action)
        trained = self._train_epochs(started)
        validated = self._validate_stacked(started)
        for i, start in started.items():
            with envs[i]._on_stream():
                (
                    self._env_obs[i],
                    self._rewards[i],
                    self._terminations[i],
                    self._truncations[i],
                    env_infos[i],
                ) = envs[i]._end_step(start, trained[i], validated.get(i))
        infos: dict[str, Any] = {}
        for i, info in enumerate(env_infos):
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (
            deepcopy(self._observations) if self.copy else self._observations,
            np.copy(self._rewards),
            np.copy(self._terminations),
            np.copy(self._truncations),
            infos,
        )

    def _train_epochs(self, started: dict[int, StepStart]) -> dict[int, TrainStats]:
        """The host epoch of every env that steps: stacked by stack_key where two or more share one, alone otherwise.
        A stacked group's seconds are shared out equally among its envs' `time/train`."""
        envs: list[MorphogeneticEnv] = self.envs  # type: ignore[assignment]
        groups, alone = stack_groups(started, lambda i: stack_key(envs[i]))
        trained: dict[int, TrainStats] = {}
        held, self.held = self.held, {}  # a group that does not step this epoch lets its stack go
        for members in groups:
            began = time.perf_counter()
            seeded = [bool(envs[i].model.active_slot_ids()) for i in members]  # type: ignore[union-attr]
            with envs[members[0]]._on_stream():  # the stack's copies too: ordered after the envs' own work
                stack = self._held_stack(members, held)
                captures = stack.captures
                stats_of = stack.train_epoch([envs[i] for i in members])
            self.stacked_captures += stack.captures - captures
            for i in members:
                envs[i].epoch += 1
            for i, stats, with_seed in zip(members, stats_of, seeded, strict=True):
                trained[i] = stats
                self.stacked_epochs[i] += 1
                self.stacked_seed_epochs[i] += with_seed
            share = (time.perf_counter() - began) / len(members)
            for i in members:
                started[i].timings["train"] = share
        for i in alone:
            began = time.perf_counter()
            with envs[i]._on_stream():
                trained[i] = envs[i]._train_epoch()
            started[i].timings["train"] = time.perf_counter() - began
        return trained

    def _held_stack(
        self, members: list[int], held: dict[tuple[int, ...], tuple[tuple[Any, ...], HeldStack]]
    ) -> HeldStack:
        """The group's HeldStack: last epoch's where its key is unchanged, else a new one. Each env's test hook
        (_before_epoch: an injected NaN lands in the host before it is copied in) runs first."""
        envs: list[MorphogeneticEnv] = [self.envs[i] for i in members]  # type: ignore[misc]
        for env in envs:
            env._before_epoch()
            env.model.train()  # type: ignore[union-attr]
        key = (stack_key(envs[0]), held_key(envs))
        kept = held.get(tuple(members))
        if kept is not None and kept[0] == key:
            stack = kept[1]
        else:
            stack = HeldStack(envs, self._memory(envs[0]))
            self.stack_builds += 1
        self.held[tuple(members)] = (key, stack)
        return stack

    def _memory(self, env: MorphogeneticEnv) -> GraphMemory | None:
        """The pool and capture stream of every held stack's CUDA graphs (graph_memory.py), made at the first stacked
        epoch on a GPU; None on a CPU."""
        if env.device.type != "cuda":
            return None
        if self._graph_memory is None:
            self._graph_memory = GraphMemory(env.device)
        return self._graph_memory

    def _validate_stacked(self, started: dict[int, StepStart]) -> dict[int, Validated]:
        """The validation pass of every env that steps and shares validation_key with another, stacked
        (env/stacked_validation.py); the others are left to validate themselves in _end_step. A group's seconds are
        shared out equally among its envs' `time/val`."""
        envs: list[MorphogeneticEnv] = self.envs  # type: ignore[assignment]
        groups, _ = stack_groups(started, lambda i: validation_key(envs[i]))
        validated: dict[int, Validated] = {}
        for members in groups:
            began = time.perf_counter()
            results = validate_envs([envs[i] for i in members])
            share = (time.perf_counter() - began) / len(members)
            for i, (plan, val) in zip(members, results, strict=True):
                validated[i] = Validated(plan, val, share)
                self.stacked_validations[i] += 1
                self.stacked_counterfactuals[i] += len(val.correct) > 1
        return validated
