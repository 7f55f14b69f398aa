"""`--save DIR` of `esper-ray eval`, `heuristic` and `grow`, and `esper-ray ab --save`: keep the network a host run
grew, with its description.

    DIR/weights.pt, DIR/architecture.json   the network (morpho/grown_artifact.py; `esper_ray.load_grown(DIR)`)
    DIR/summary.md                          the architecture as a table, the test accuracy, how to load it
    DIR/accuracy.png                        the run's accuracy curve with the seeds' events

architecture.json adds to the network's own description the run that grew it (`run`: task, controller, seeds,
device, accuracies and curves), how to prepare inputs (`input`) and every enabled slot's seed events
(`slots`), so the folder says everything summary.md shows.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import esper_ray
from esper_ray.data.datasets import TaskData
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.env.precision import resolve_amp
from esper_ray.morpho.grown import grown_from, kept_alpha
from esper_ray.morpho.grown_artifact import ARCHITECTURE_FILE, describe, plugins_needed, save_grown_network
from esper_ray.train.commands.episodes import EpisodeEnd, EpisodeHistory, EpisodeSummary
from esper_ray.train.commands.grow_summary import (
    CURVE_FILE,
    SUMMARY_FILE,
    no_seed_note,
    plot_accuracy,
    summary_markdown,
)
from esper_ray.train.folders.run_lock import writable_folder


def check_save_folder(path: str | Path, episodes: int) -> Path:
    """The folder `--save` will write, refused before any host trains if it cannot be written as asked."""
    if episodes != 1:
        raise ValueError(
            f"--save keeps one host run's network and --episodes is {episodes}; give --episodes 1 "
            "(run again with another --seed to keep another network)"
        )
    folder = Path(path).expanduser().resolve()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise FileExistsError(f"--save {folder}: already exists and is not an empty folder; choose a new one")
    return writable_folder(folder, "--save")  # made now: one that cannot be would fail only after the host run


def input_description(data: TaskData, example: Any) -> dict[str, Any]:
    """How to turn the task's raw samples into what the network's forward takes (TaskData.prepare)."""
    if data.tokens:
        vocab = data.num_classes
        return {
            "kind": "tokens",
            "shape": list(example.shape),
            "dtype": "int64",
            "vocab": vocab,
            "prepare": f"token ids [B, T] (0..{vocab - 1}) as they are; logits [B, T, {vocab}] predict the next token",
        }
    if not data.mean:  # a plug-in's own features: scaled only (TaskData.prepare)
        return {
            "kind": "features",
            "shape": list(example.shape),
            "scale": data.scale,
            "prepare": "x = raw / scale, for raw inputs [B, ...] stored as the task stores them; logits [B, classes]",
        }
    return {
        "kind": "images",
        "shape": list(example.shape),
        "scale": data.scale,
        "mean": list(data.mean),
        "std": list(data.std),
        "prepare": "x = (raw / scale - mean) / std per channel, for raw images [B, C, H, W] stored as the task "
        "stores them; logits [B, classes]",
    }


def save_grown_run(
    folder: Path,
    env: MorphogeneticEnv,
    summary: EpisodeSummary,
    history: EpisodeHistory,
    controller: str,
    checkpoint: str | None = None,
) -> None:
    """Write the env's final network and its description into `folder` (summary needs its test accuracy);
    `checkpoint`: the policy's checkpoint as files meant for sharing name it (RUN/checkpoints/round_N), if one grew
    it."""
    if env.model is None or summary.test_accuracy is None or summary.test_loss is None:
        raise RuntimeError(
            "save_grown_run needs a finished episode whose test accuracy was measured (measure_test=True)"
        )
    network = grown_from(env.model, env.cfg.plugins)
    slots = {}
    for slot in env.model.seed_slots():
        # a slot back to DORMANT after a prune has forgotten its blueprint: its old seed's events go with it
        events = history.seeds.get(slot.slot_id) if slot.blueprint is not None else None
        slots[slot.slot_id] = {
            "stage": slot.stage.name,
            "blueprint": slot.blueprint.key if slot.blueprint is not None else None,
            "in_network": kept_alpha(slot) is not None,
            "germinated_epoch": events.germinated_epoch if events else None,
            "fossilized_epoch": events.fossilized_epoch if events else None,
        }
    run = {
        "task": env.cfg.task,
        "host_preset": env.cfg.effective_host_preset,
        "controller": controller,
        "seed": env.cfg.seed,
        "episode_seed": history.episode_seed,
        "max_epochs": env.cfg.max_epochs,
        "epochs": summary.steps,
        "ended_by_rollback": summary.rolled_back,
        "device": str(env.device),
        "amp": resolve_amp(env.cfg.amp, env.device),
        "test_accuracy": summary.test_accuracy,
        "test_accuracy_with_probation": summary.test_accuracy_with_probation,
        "params_dropped_on_probation": summary.params_on_probation,
        "test_loss": summary.test_loss
        if math.isfinite(summary.test_loss)
        else None,  # strict JSON: a diverged loss is null
        "initial_val_accuracy": summary.initial_accuracy,
        "final_val_accuracy": summary.final_accuracy,
        "val_accuracy_by_epoch": history.val_accuracy,
        "train_accuracy_by_epoch": history.train_accuracy,
        "esper_ray_version": esper_ray.__version__,
    }
    if checkpoint is not None:
        run["checkpoint"] = checkpoint
    extra = {"run": run, "input": input_description(env.data, env.data.test_x[0]), "slots": slots}
    architecture = {**describe(network), **extra}
    folder.mkdir(parents=True, exist_ok=True)
    # the summary and its figure first, the architecture file last: a folder without it is an unfinished save
    plot_accuracy(folder / CURVE_FILE, architecture)
    (folder / SUMMARY_FILE).write_text(summary_markdown(folder, architecture))
    save_grown_network(folder, network, extra)


def saver(folder: Path, controller: str, checkpoint: str | None = None) -> EpisodeEnd:
    """The `on_episode_end` hook of a `--save` run (one episode: check_save_folder refuses more)."""

    def save(env: MorphogeneticEnv, summary: EpisodeSummary, history: EpisodeHistory) -> None:
        save_grown_run(folder, env, summary, history, controller, checkpoint)

    return save


def saved_line(folder: Path) -> str:
    """What a command prints once it has kept a network (read back from its architecture file): how to load it, with
    the plug-ins its parts come from (which load_grown imports only when they are passed), and whether a seed was
    kept."""
    architecture = json.loads((folder / ARCHITECTURE_FILE).read_text())
    plugins, note = plugins_needed(architecture), no_seed_note(architecture)
    call = f"esper_ray.load_grown({str(folder)!r}" + (f", plugins={plugins!r})" if plugins else ")")
    return f"grown network: {folder} (see {folder / SUMMARY_FILE}; load it with {call})" + (f"; {note}" if note else "")


def episode_folder(root: Path, episode: int) -> Path:
    """Where `esper-ray ab --save` keeps evaluation episode `episode`'s network, below a trial's `root`."""
    return root / f"episode{episode}"


def episodes_saver(root: Path, controller: str) -> EpisodeEnd:
    """An `on_episode_end` hook that saves every episode's network into its own folder below `root`."""

    def save(env: MorphogeneticEnv, summary: EpisodeSummary, history: EpisodeHistory) -> None:
        save_grown_run(episode_folder(root, summary.episode), env, summary, history, controller)

    return save


NetworkFiles = dict[str, bytes]
"""A saved network's folder as {file name: contents}: what an env runner sends back to the trial that asked."""


def network_keeper(controller: str, into: dict[int, NetworkFiles]) -> EpisodeEnd:
    """An `on_episode_end` hook that keeps each episode's grown network as files in `into`, by episode index, so a
    process that may run on another node (an env runner) can return them to the one that writes them."""

    def keep(env: MorphogeneticEnv, summary: EpisodeSummary, history: EpisodeHistory) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "network"
            save_grown_run(folder, env, summary, history, controller)
            into[summary.episode] = {path.name: path.read_bytes() for path in folder.iterdir()}

    return keep


def write_network_files(folder: Path, files: NetworkFiles) -> None:
    """Write a kept network into `folder`, its architecture file last (a folder without it is an unfinished save)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in sorted(files, key=lambda n: n == ARCHITECTURE_FILE):
        (folder / name).write_bytes(files[name])
