"""The validation and counterfactual pass of N envs' models as one stacked forward per chunk (issue 77): what each env's
own pass (env/epoch.py validate_fused over MorphogeneticModel.fused_forward) gives it, its ValStats (correct count and
loss of each of its K alpha configurations), in calls that carry every env's validation batch and configurations.

How: each (model, configuration) pair is a row of the stack. Model i's chunk, prepared by its own `prepare`, is repeated
K_i times, and StackedCNNHosts runs in eval mode (running statistics, no buffer update) with `rows` naming model i's
host for each of them; at each slot the models' stacked seeds (morpho/stacked_seeds.py) blend into their rows at that
row's configuration's alpha, as fused_forward's slots blend at their alpha overrides (a TRAINING seed at its alpha 0).
So models with different K (seed counts) need no padding: a model simply has K rows. fused_forward runs the prefix its
configurations share once; here every row runs the whole host, which on a CPU costs arithmetic, not calls (a
digits-impaired host is call-bound: morpho/stacked.py). Chunks are each model's own (`chunk` of its set, rows of one
chunk size stacked together, as train_stacked_epoch stacks batches), and so are the sums per chunk.

Which envs validate stacked (`validation_key`, the vector env groups by it): a CNNHost in fp32 on the CPU (so no
captured CUDA graph: those are CUDA-only) whose active seeds all stack (`unstackable` is None: not a prune ramping
down, not a plug-in's seed module), grouped by the host's structure and the validation chunk. Every other env (on a
GPU, under AMP, with a transformer host or an unstackable seed) and one alone in its group runs its own pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from esper_ray.env.epoch import ValStats, read_val_stats
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.env.stacked_step import hits, sample_losses
from esper_ray.morpho.counterfactual import CounterfactualPlan
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.stacked import StackedCNNHosts
from esper_ray.morpho.stacked_seeds import StackedSeeds, stack_seeds, stackable


def validation_key(env: MorphogeneticEnv) -> tuple[Any, ...] | None:
    """What envs must share for their validation passes to run stacked (None: this env validates alone)."""
    model = env.model
    assert model is not None
    if env.device.type != "cpu" or env.precision.dtype is not None or not stackable(model.host, model.seed_slots()):
        return None
    return (model.host.cfg, env.cfg.effective_val_batch_size)


def validate_stacked(
    models: Sequence[MorphogeneticModel],
    x_vals: Sequence[torch.Tensor],
    y_vals: Sequence[torch.Tensor],
    alphas: Sequence[torch.Tensor],
    *,
    chunk: int,
    prepares: Sequence[Callable[[torch.Tensor], torch.Tensor]],
) -> list[ValStats]:
    """What validate_fused(models[i], x_vals[i], y_vals[i], alphas[i], chunk=chunk, prepare=prepares[i]) returns in
    fp32, for every i at once (the models' hosts of one structure, their active seeds stackable; alphas[i]: [K_i, S_i]
    in models[i]'s slot order)."""
    n = len(models)
    for model in models:
        model.eval()  # as validate_fused leaves it
    with torch.no_grad():
        hosts = StackedCNNHosts([m.host for m in models]).eval()  # type: ignore[misc]
        groups = stack_seeds([m.seed_slots() for m in models])
    ks = [int(a.shape[0]) for a in alphas]
    correct = [torch.zeros(k, dtype=torch.int64) for k in ks]
    loss_sum = [torch.zeros(k) for k in ks]
    with torch.inference_mode():
        for start in range(0, max(len(y) for y in y_vals), chunk):
            by_size: dict[int, list[int]] = {}
            for i, ys in enumerate(y_vals):
                size = min(chunk, len(ys) - start)
                if size > 0:
                    by_size.setdefault(size, []).append(i)
            for size, members in by_size.items():
                x = torch.stack([prepares[i](x_vals[i][start : start + size]) for i in members])
                y = torch.stack([y_vals[i][start : start + size] for i in members])
                counts = [ks[i] for i in members]
                if any(k > 1 for k in counts):  # model i's chunk once for each of its configurations
                    repeats = torch.tensor(counts)
                    x, y = x.repeat_interleave(repeats, dim=0), y.repeat_interleave(repeats, dim=0)
                logits = _forward(hosts, groups, models, alphas, members, x)  # [M, B, classes]
                right = hits(logits, y)
                losses = sample_losses(logits.float(), y).sum(dim=1)
                for i, hit, loss in zip(members, right.split(counts), losses.split(counts), strict=True):
                    correct[i] += hit
                    loss_sum[i] += loss
    return [read_val_stats(correct[i], loss_sum[i], y_vals[i].numel()) for i in range(n)]


def _forward(
    hosts: StackedCNNHosts,
    groups: Sequence[StackedSeeds],
    models: Sequence[MorphogeneticModel],
    alphas: Sequence[torch.Tensor],
    members: Sequence[int],
    x: torch.Tensor,
) -> torch.Tensor:
    """Logits [M, B, classes] of images x [M, B, C, H, W], whose rows are model members[0]'s K configurations, then
    members[1]'s, and so on."""
    offsets: dict[int, int] = {}
    host_rows: list[int] = []
    for i in members:
        offsets[i] = len(host_rows)
        host_rows += [i] * alphas[i].shape[0]
    # Per slot: each group's rows among x's, its seed row for each, and that row's configuration's alpha there.
    by_slot: dict[str, list[tuple[StackedSeeds, torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
    for group in groups:
        at: list[int] = []
        local: list[int] = []
        alpha: list[torch.Tensor] = []
        for j, i in enumerate(group.hosts):
            if i in offsets:
                k = alphas[i].shape[0]
                at += range(offsets[i], offsets[i] + k)
                local += [j] * k
                alpha.append(alphas[i][:, models[i].slot_ids.index(group.slot_id)])
        if at:
            entry = (group, torch.tensor(at), torch.tensor(local), torch.cat(alpha).float())
            by_slot.setdefault(group.slot_id, []).append(entry)

    def at_slot(slot: str, h: torch.Tensor) -> torch.Tensor:
        for group, at, local, alpha in by_slot.get(slot, ()):
            h = h.index_copy(0, at, group(h[at], local, alphas=alpha))
        return h

    rows = None if host_rows == list(range(hosts.n)) else torch.tensor(host_rows)
    return hosts(x, at_slot, frozenset(by_slot), rows)


def validate_envs(envs: Sequence[MorphogeneticEnv]) -> list[tuple[CounterfactualPlan, ValStats]]:
    """Each env's counterfactual plan and its validation stats, in one stacked pass (validation_key equal for all)."""
    plans = [env._validation_plan() for env in envs]
    stats = validate_stacked(
        [env.model for env in envs],  # type: ignore[misc]
        [env.val_x for env in envs],
        [env.val_y for env in envs],
        [plan.alphas for plan in plans],
        chunk=envs[0].cfg.effective_val_batch_size,
        prepares=[env._prepare_eval for env in envs],
    )
    return list(zip(plans, stats, strict=True))
