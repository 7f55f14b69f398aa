"""A PPO arm's training rollouts per block of rounds, and the block from which its curve is level (issue 30:
train to a plateau, and say where the curve flattens).

A block's figure is the mean over the arm's trials that reached the block of each trial's mean over its rounds in
the block: the committed accuracy of the rollouts' final hosts (sampled actions, validation split), seeds fossilized
and pruned per episode, and (in runs that record them) seeds germinated per episode by blueprint, shown as the
blueprint planted most and its share of the germinations: the blueprint head's learning curve. Unfinished trials
count for the blocks they reached (the table says how many trials each block holds).

Level from block b: b is not the last block and every later block's accuracy is within `LEVEL_TOLERANCE` of b's.
A rule stated in the report, so that "where the curve flattens" is read off the data the same way every time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from esper_ray.contracts.controllers import ControllerKind
from esper_ray.experiments.results import BY_BLUEPRINT, ExperimentRecord, TrialResult
from esper_ray.formatting import largest_share

LEVEL_TOLERANCE = 0.01
"""One point of accuracy: a reading rule, not a test (a block's mean still moves by a point or two from noise
where the seeds' curves differ, as on digits-impaired)."""
COLUMNS = {"accuracy": "final_accuracy", "fossilized": "fossilized", "pruned": "pruned"}
PLANTED = f"{BY_BLUEPRINT}/germinated_"


@dataclass(frozen=True)
class Block:
    first: int
    last: int
    trials: int
    accuracy: float
    fossilized: float
    pruned: float
    planted: dict[str, float] = field(default_factory=dict)
    """Seeds germinated per episode by blueprint (runs that recorded them): what the policy plants."""

    def most_planted(self) -> tuple[str, float] | None:
        """The blueprint planted most and its share of the block's germinations; None where none was recorded."""
        return largest_share(self.planted)


def block_size(rounds: int) -> int:
    """10 rounds a block from 30 rounds up (the tables of docs/learning.md); shorter runs get 3 blocks."""
    return 10 if rounds >= 30 else max(1, math.ceil(rounds / 3))


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def rollout_blocks(trials: Sequence[TrialResult], rounds: int, size: int) -> list[Block]:
    """Blocks 1..size, size+1..2 size, ... up to `rounds`; a block no trial reached is left out."""
    out = []
    for first in range(1, rounds + 1, size):
        last = min(first + size - 1, rounds)
        per_trial: dict[str, list[float]] = {name: [] for name in COLUMNS}
        planted: dict[str, list[float]] = {}
        reached = 0
        for trial in trials:
            rows = [r for r in trial.history if first <= r["round"] <= last]
            if not rows:
                continue
            reached += 1
            for name, column in COLUMNS.items():
                per_trial[name].append(_mean([r.get(column, math.nan) for r in rows]))
            for key in {k for r in rows for k in r if k.startswith(PLANTED)}:
                planted.setdefault(key.removeprefix(PLANTED), []).append(_mean([r.get(key, math.nan) for r in rows]))
        if reached:
            out.append(
                Block(
                    first,
                    last,
                    reached,
                    **{name: _mean(v) for name, v in per_trial.items()},
                    planted={k: _mean(v) for k, v in sorted(planted.items())},
                )
            )
    return out


def level_from(blocks: Sequence[Block], tolerance: float = LEVEL_TOLERANCE) -> Block | None:
    """The first block from which the accuracy stays within `tolerance` in every later block; None if the last two
    blocks differ by more (or there are fewer than two blocks)."""
    for i, block in enumerate(blocks[:-1]):
        if all(abs(later.accuracy - block.accuracy) <= tolerance for later in blocks[i + 1 :]):
            return block
    return None


def block_lines(record: ExperimentRecord) -> list[str]:
    """The report's section: per PPO arm, a row each of accuracy, fossils and prunes per block, and where it levels."""
    spec = record.spec
    size = block_size(spec.rounds)
    lines: list[str] = []
    for arm in spec.arms:
        if spec.controller(arm) is not ControllerKind.PPO:
            continue
        blocks = rollout_blocks([t for t in record.trials if t.arm == arm], spec.rounds, size)
        if not blocks:
            continue
        level = level_from(blocks)
        if level is not None:
            where = f"level from rounds {level.first}-{level.last} (every later block within {LEVEL_TOLERANCE} of it)"
        elif len(blocks) == 1:
            where = "one block: too few rounds to tell whether it is level"
        else:
            where = f"not level: the last two blocks differ by more than {LEVEL_TOLERANCE}"
        lines += [
            "",
            f"**{arm}**: {where}.",
            "",
            "| rounds | " + " | ".join(f"{b.first}-{b.last}" for b in blocks) + " |",
            "|---|" + "---|" * len(blocks),
            "| committed accuracy | " + " | ".join(f"{b.accuracy:.3f}" for b in blocks) + " |",
            "| fossilized per episode | " + " | ".join(f"{b.fossilized:.2f}" for b in blocks) + " |",
            "| pruned per episode | " + " | ".join(f"{b.pruned:.2f}" for b in blocks) + " |",
            "| trials | " + " | ".join(str(b.trials) for b in blocks) + " |",
        ]
        tops = [b.most_planted() for b in blocks]
        if any(tops):
            lines.insert(
                -1,
                "| most planted (share of germinations) | "
                + " | ".join(f"{top[0]} {top[1]:.2f}" if top else "" for top in tops)
                + " |",
            )
    if not lines:
        return []
    return [
        "",
        "## Training rollouts by block",
        "",
        "The PPO arms' training episodes (sampled actions): the committed model's validation accuracy at each "
        "episode's end, seeds fossilized and pruned per episode; means of each trial's block mean over the trials "
        "that reached the block.",
        *lines,
    ]
