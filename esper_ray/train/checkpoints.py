"""A training run's folder and its checkpoints.

    config.json                 the TrainConfig
    metrics.jsonl               one RoundSummary per round
    tensorboard/                each round's figures, grouped (tensorboard_log.py), and the settings as text
    checkpoints/round_NNNNN/    RLlib checkpoints (weights, optimizer, observation filter, reward normaliser)
                                + train_config.json
    checkpoints/latest.json     the newest checkpoint, as a path relative to checkpoints/, so a copied or moved
                                run folder (rsync-down, then eval) resumes its own checkpoint
"""

from __future__ import annotations

import json
from pathlib import Path

from esper_ray.contracts.train_config import TrainConfig

TRAIN_CONFIG_FILE = "train_config.json"
LATEST_FILE = "latest.json"
RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints")


def checkpoint_dir(output: Path, round_: int) -> Path:
    return output / "checkpoints" / f"round_{round_:05d}"


def record_checkpoint(output: Path, cfg: TrainConfig, path: Path, round_: int) -> None:
    """Mark `path` (already saved by RLlib) as the run's newest checkpoint."""
    (path / TRAIN_CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))
    latest = {"round": round_, "path": path.relative_to(output / "checkpoints").as_posix()}
    (output / "checkpoints" / LATEST_FILE).write_text(json.dumps(latest))


def latest_round(output: Path) -> int | None:
    latest = output / "checkpoints" / LATEST_FILE
    return int(json.loads(latest.read_text())["round"]) if latest.is_file() else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a training output folder (then its newest checkpoint)."""
    path = Path(path).expanduser()
    if (path / TRAIN_CONFIG_FILE).is_file():
        return path
    latest = path / "checkpoints" / LATEST_FILE
    if latest.is_file():
        stored = Path(json.loads(latest.read_text())["path"])
        checkpoint = stored if stored.is_absolute() else path / "checkpoints" / stored  # absolute: older runs
        if not (checkpoint / TRAIN_CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{latest} names {stored}, which holds no {TRAIN_CONFIG_FILE}; is the run folder complete?")
        return checkpoint
    raise FileNotFoundError(
        f"no esper-ray checkpoint at {path}: expected {TRAIN_CONFIG_FILE} in it (a checkpoint folder) or "
        f"checkpoints/{LATEST_FILE} (a training output folder)"
    )


def round_of(checkpoint: Path) -> int:
    """The round a checkpoint folder (`round_NNNNN`) was saved after."""
    name = checkpoint.name
    if not name.startswith("round_") or not name[len("round_"):].isdigit():
        raise ValueError(f"{checkpoint}: not an esper-ray checkpoint folder (expected a name like round_00010)")
    return int(name[len("round_"):])


def run_folder_of(checkpoint: Path) -> Path:
    """The training output folder a checkpoint belongs to (.../RUN/checkpoints/round_NNNNN -> .../RUN)."""
    return checkpoint.parent.parent


def load_checkpoint_config(checkpoint: Path) -> TrainConfig:
    return TrainConfig.from_mapping(json.loads((checkpoint / TRAIN_CONFIG_FILE).read_text()))


def holds_a_run(folder: Path) -> bool:
    return folder.is_dir() and any((folder / marker).exists() for marker in RUN_MARKERS)


def fresh_run_folder(output: Path, numbered: bool) -> Path:
    """`output`, or with `numbered` the first free `output-2`, `output-3`, ... when `output` holds a run.

    A folder holding a run is never written into by a new run (metrics would be appended to the old run's,
    checkpoints mixed): `--resume` continues a run in place; otherwise the run goes to a fresh folder
    (`numbered`, for the default output) or is refused (an explicit --output).
    """
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"--output {output} is a file; give a folder for the run")
    if not holds_a_run(output):
        return output
    if not numbered:
        raise FileExistsError(f"{output} already holds a run: add --resume {output} to continue it, or choose another --output")
    n = 2
    while holds_a_run(output.with_name(f"{output.name}-{n}")):
        n += 1
    return output.with_name(f"{output.name}-{n}")
