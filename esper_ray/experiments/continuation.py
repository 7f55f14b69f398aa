"""A PPO trial of a killed A/B run, continued from its last intact checkpoint (`esper-ray ab --resume --salvage`).

A killed run's tune/ no longer matches its manifest, so Tune's own state there is never loaded (runner.py sets the
folder aside). Each of a PPO trial's checkpoints carries a manifest of its own (files.json, written by the trial
when the checkpoint is complete) and the round it holds (round.json), as `esper-ray train`'s checkpoints do: a
salvaged trial whose newest checkpoint matches its manifest continues from that round in a new trial, and its
history is the rounds it had to that checkpoint, read from the set-aside folder's result.json, then the new ones.

The new trial's config holds the chain (CONTINUES_KEY): the checkpoint to start from and, oldest first, each
set-aside folder the trial ran in with the last round taken from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from esper_ray.experiments.trial_keys import SUMMARY_PREFIX
from esper_ray.experiments.tune_folder import number, read_results
from esper_ray.train.folders.checkpoints import TRIAL_ROUND_FILE as ROUND_FILE
from esper_ray.train.folders.manifest import damage_of

CONTINUES_KEY = "continues"
# ROUND_FILE (round.json), in each checkpoint of an A/B trial: {"round": the rounds trained when it was saved,
# "summary": that round's summary as the trial reported it (SUMMARY_PREFIX keys)}. A trial killed after its last round
# was checkpointed, before its evaluation was reported, is continued by evaluating it alone, and reports that summary
# again. `eval` and `grow` read the round of such a checkpoint from it too (train/folders/checkpoints.py).
CHECKPOINT_GLOB = "checkpoint_*"


def checkpoint_round(checkpoint: Path) -> int | None:
    """The round an A/B trial's checkpoint holds, when it is intact (matches its files.json); else None."""
    if damage_of(checkpoint) is not None:
        return None
    try:
        value = json.loads((checkpoint / ROUND_FILE).read_text())["round"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def checkpoint_summary(checkpoint: Path) -> dict[str, Any]:
    """The summary of the round an A/B trial's checkpoint holds ({} for checkpoints written before it was kept)."""
    try:
        value = json.loads((checkpoint / ROUND_FILE).read_text()).get("summary", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: v for k, v in value.items() if k.startswith(SUMMARY_PREFIX)} if isinstance(value, dict) else {}


def newest_intact_checkpoint(trial_folder: Path) -> tuple[Path, int] | None:
    """The trial's newest checkpoint that matches its manifest, and its round (checkpoints of code before
    manifests have none: None)."""
    for checkpoint in sorted(trial_folder.glob(CHECKPOINT_GLOB), reverse=True):
        round_ = checkpoint_round(checkpoint)
        if round_ is not None:
            return checkpoint, round_
    return None


def continuation(output: Path, trial_folder: Path, trial_config: dict[str, Any]) -> dict[str, Any] | None:
    """The CONTINUES_KEY entry for a new trial that carries on the set-aside trial in `trial_folder` (None when it
    has no intact checkpoint): its chain so far, this folder's rounds to the checkpoint, and the checkpoint."""
    found = newest_intact_checkpoint(trial_folder)
    if found is None:
        return None
    checkpoint, round_ = found
    earlier = links_of(trial_config)
    link = {"folder": trial_folder.relative_to(output).as_posix(), "round": round_}
    return {"links": [*earlier, link], "checkpoint": str(checkpoint.resolve())}


def links_of(trial_config: dict[str, Any]) -> list[dict[str, Any]]:
    """The chain of set-aside folders a trial continues (none for a trial that started afresh)."""
    entry = trial_config.get(CONTINUES_KEY)
    if entry is None:
        return []
    links = entry.get("links") if isinstance(entry, dict) else None
    if not isinstance(links, list) or not all(
        isinstance(k, dict) and isinstance(k.get("folder"), str) and isinstance(k.get("round"), int) for k in links
    ):
        raise ValueError(
            f"a trial's {CONTINUES_KEY!r} entry is not the chain --salvage writes ({str(entry)[:120]}); "
            "the run folder is damaged"
        )
    return links


def continued_rows(output: Path, trial_config: dict[str, Any]) -> list[dict[str, Any]]:
    """The results a continued trial had before it continued: from each set-aside folder of its chain, the rounds
    after the previous link's and up to this link's checkpoint (a round reported after it was trained again)."""
    rows: list[dict[str, Any]] = []
    after = 0
    for link in links_of(trial_config):
        folder = (output / link["folder"]).resolve()
        if not folder.is_relative_to(output.resolve()):
            raise ValueError(f"{link['folder']!r}: a continued trial's earlier folder lies outside the run {output}")
        for row in read_results(folder):
            if after < number(row.get(SUMMARY_PREFIX + "round")) <= link["round"]:
                rows.append(row)
        after = link["round"]
    return rows
