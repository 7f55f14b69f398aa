"""A training run's folder and its checkpoints.

    config.json                 the TrainConfig
    metrics.jsonl               one RoundSummary per round
    tensorboard/                each round's figures, grouped (tensorboard_log.py), and the settings as text
    checkpoints/round_NNNNN/    RLlib checkpoints (weights, optimizer, observation filter, reward normaliser)
                                + train_config.json + files.json (every file's size and SHA-256)
    checkpoints/latest.json     the newest checkpoint, as a path relative to checkpoints/, so a copied or moved
                                run folder (rsync-down, then eval) resumes its own checkpoint

A checkpoint folder may also stand on its own (docs/results/grow_family/controllers/seedS: an A/B trial's, with
train_config.json and files.json added, its round in round.json): `eval` and `grow` take either.

A checkpoint is written into round_NNNNN.partial and renamed when complete, and latest.json is written to a
temporary name and renamed over the old one, so latest.json only ever names a complete checkpoint, whatever
cuts a save short. A checkpoint damaged later (an interrupted copy, a full disk) fails its files.json check
(manifest.py) when it is resumed or evaluated, in seconds, naming the file; loading it would fail inside the
learner actor, which RLlib then waits on for ever. The check reads sizes and hashes only: a checkpoint is
pickles, and its pickles are loaded only to resume or evaluate it, after it matches its manifest.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.folders.manifest import MANIFEST_FILE, damage_of, write_atomically, write_manifest
from esper_ray.train.folders.run_lock import is_locked

TRAIN_CONFIG_FILE = "train_config.json"
LATEST_FILE = "latest.json"
PARTIAL_SUFFIX = ".partial"
RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints")
TRIAL_ROUND_FILE = "round.json"  # an A/B trial's checkpoint records its round here (experiments/trainable.py)


def checkpoint_dir(output: Path, round_: int) -> Path:
    return output / "checkpoints" / f"round_{round_:05d}"


def partial_checkpoint_dir(output: Path, round_: int) -> Path:
    """Where RLlib writes a checkpoint before it is complete (a fresh, empty folder)."""
    path = checkpoint_dir(output, round_).with_name(checkpoint_dir(output, round_).name + PARTIAL_SUFFIX)
    if path.exists():
        shutil.rmtree(path)  # left by a save that was cut short
    return path


def record_checkpoint(output: Path, cfg: TrainConfig, partial: Path, round_: int) -> Path:
    """Complete the checkpoint RLlib saved into `partial`: add the settings and the manifest, rename it to its
    round's folder, then make it the run's newest in latest.json. Returns the checkpoint's folder."""
    (partial / TRAIN_CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))
    write_manifest(partial)
    final = checkpoint_dir(output, round_)
    if final.exists():  # a run resumed in place from an earlier round: its new round N replaces the old one
        replaced = final.with_name(final.name + ".replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        os.replace(final, replaced)
        os.replace(partial, final)
        shutil.rmtree(replaced)
    else:
        os.replace(partial, final)
    latest = {"round": round_, "path": final.relative_to(output / "checkpoints").as_posix()}
    write_atomically(output / "checkpoints" / LATEST_FILE, json.dumps(latest))
    return final


def check_complete(checkpoint: Path) -> None:
    """Raise ValueError naming the damaged file and the newest earlier checkpoint that is complete (or saying
    there is none) unless `checkpoint` matches its manifest. No pickle is loaded to check it."""
    damage = damage_of(checkpoint)
    if damage is None:
        return
    fallback = _fallback(checkpoint.parent, _round_number(checkpoint))
    if damage.startswith(MANIFEST_FILE + ": missing"):
        raise ValueError(
            f"checkpoint {checkpoint} cannot be checked: {damage} (checkpoints saved before manifests existed "
            "have none; if you trust where it came from, write one with python -m esper_ray.train.folders.manifest "
            f"FOLDER); {fallback}"
        )
    raise ValueError(f"checkpoint {checkpoint} is damaged: {damage}; {fallback}")


def _fallback(checkpoints: Path, before: int | None) -> str:
    """Where to resume from instead: the newest complete checkpoint in `checkpoints` before round `before`."""
    rounds = {p: _round_number(p) for p in checkpoints.iterdir() if p.is_dir()} if checkpoints.is_dir() else {}
    earlier = sorted(
        (p for p, r in rounds.items() if r is not None and (before is None or r < before)),
        key=lambda p: rounds[p],
        reverse=True,
    )
    complete = next((p for p in earlier if damage_of(p) is None), None)
    if complete is None:
        return f"no earlier complete checkpoint is in {checkpoints}"
    return f"the newest complete one is {complete}: resume from it with --resume {shlex.quote(str(complete))}"


def read_latest(output: Path) -> tuple[int, Path] | None:
    """(round, checkpoint folder) that checkpoints/latest.json names, None without one. A damaged latest.json
    (an interrupted copy, a hand edit) is one ValueError naming it and the checkpoint to resume from instead."""
    latest = output / "checkpoints" / LATEST_FILE
    if not latest.is_file():
        return None
    try:
        raw = json.loads(latest.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ValueError(
            f"{latest}: not valid JSON ({type(err).__name__}: {err}); {_fallback(latest.parent, None)}"
        ) from None
    if (
        not isinstance(raw, dict)
        or isinstance(raw.get("round"), bool)
        or not isinstance(raw.get("round"), int)
        or not isinstance(raw.get("path"), str)
        or not raw["path"]
    ):
        raise ValueError(
            f"{latest}: expected {{\"round\": N, \"path\": \"round_NNNNN\"}}, found {str(raw)[:200]}; "
            f"{_fallback(latest.parent, None)}"
        )
    stored = Path(raw["path"])
    checkpoint = stored if stored.is_absolute() else latest.parent / stored  # absolute: older runs
    # A resume writes into the folder its checkpoint lies in: latest.json may name only one of its own run's
    # checkpoints, never one through `..`, a link or an absolute path elsewhere (it would continue that run).
    if checkpoint.resolve().parent != latest.parent.resolve():
        raise ValueError(
            f"{latest}: path={raw['path']!r} lies outside {latest.parent}; it may name only a checkpoint "
            f"of this run (round_NNNNN); {_fallback(latest.parent, None)}"
        )
    return raw["round"], checkpoint


def latest_round(output: Path) -> int | None:
    latest = read_latest(output)
    return latest[0] if latest is not None else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a training output folder (then its newest checkpoint); checked complete."""
    checkpoint = _find_checkpoint(Path(path).expanduser())
    check_complete(checkpoint)
    return checkpoint


def _find_checkpoint(path: Path) -> Path:
    if (path / TRAIN_CONFIG_FILE).is_file():
        return path
    latest = read_latest(path)
    if latest is not None:
        round_, checkpoint = latest
        if not (checkpoint / TRAIN_CONFIG_FILE).is_file():
            raise FileNotFoundError(
                f"{path / 'checkpoints' / LATEST_FILE} names round {round_} at {checkpoint}, which holds no "
                f"{TRAIN_CONFIG_FILE} (an incomplete copy?); {_fallback(checkpoint.parent, round_)}"
            )
        return checkpoint
    raise FileNotFoundError(
        f"no esper-ray checkpoint at {path}: expected {TRAIN_CONFIG_FILE} in it (a checkpoint folder) or "
        f"checkpoints/{LATEST_FILE} (a training output folder)"
    )


def _round_number(folder: Path) -> int | None:
    """N of a folder named round_NNNNN; None for any other name (a .partial folder, say)."""
    digits = folder.name[len("round_") :]
    return int(digits) if folder.name.startswith("round_") and digits.isdigit() else None


def round_of(checkpoint: Path) -> int:
    """The round a checkpoint folder was saved after: its name's (`round_NNNNN`), else the one its round.json
    records (an A/B trial's checkpoint, as docs/results/grow_family/controllers/ keeps them, under any name)."""
    number = _round_number(checkpoint)
    if number is None:
        try:
            number = json.loads((checkpoint / TRIAL_ROUND_FILE).read_text())["round"]
        except (OSError, ValueError, KeyError, TypeError):
            number = None
    if not isinstance(number, int) or isinstance(number, bool):
        raise ValueError(
            f"{checkpoint}: not an esper-ray checkpoint folder (expected a name like round_00010, or a "
            f"{TRIAL_ROUND_FILE} holding {{\"round\": N}})"
        )
    return number


def in_a_run(checkpoint: Path) -> bool:
    """Whether the checkpoint lies in a training output folder (RUN/checkpoints/round_NNNNN), not on its own."""
    return checkpoint.parent.name == "checkpoints" and _round_number(checkpoint) is not None


def run_folder_of(checkpoint: Path) -> Path:
    """The training output folder a checkpoint belongs to (.../RUN/checkpoints/round_NNNNN -> .../RUN)."""
    return checkpoint.parent.parent


def load_checkpoint_config(checkpoint: Path) -> TrainConfig:
    """The checkpoint's training settings; a damaged file is one ValueError naming it."""
    path = checkpoint / TRAIN_CONFIG_FILE
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ValueError(f"{path}: not valid JSON ({type(err).__name__}: {err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of training settings, found {str(raw)[:100]}")
    try:
        return TrainConfig.from_record(raw)  # its envs split as the run took it (envs_per_runner)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: {err}") from None


def holds_a_run(folder: Path) -> bool:
    """Whether a run kept something there: a checkpoint (latest.json, or a round_NNNNN folder) or a finished round's
    line in metrics.jsonl (results a new run would append to). A run killed (kill -9) during start-up leaves only its
    RUN_MARKERS (config.json, an empty metrics.jsonl and checkpoints/): nothing to resume or keep, so a new run may
    take the folder (its lock says whether that run still lives)."""
    return has_checkpoint(folder) or records_a_round(folder)


def has_checkpoint(folder: Path) -> bool:
    """A checkpoint was saved there: latest.json, or a round_NNNNN folder."""
    checkpoints = folder / "checkpoints"
    return (checkpoints / LATEST_FILE).exists() or (
        checkpoints.is_dir() and any(_round_number(p) is not None for p in checkpoints.iterdir())
    )


def records_a_round(folder: Path) -> bool:
    """metrics.jsonl holds a finished round (a run may finish rounds before its first checkpoint: checkpoint_every)."""
    metrics = folder / "metrics.jsonl"
    if not metrics.is_file():
        return False
    for line in metrics.read_text(errors="replace").splitlines():
        try:
            if isinstance(json.loads(line), dict) and "round" in json.loads(line):
                return True
        except ValueError:
            continue  # a line cut short by a kill
    return False


def left_without_checkpoint(folder: Path) -> bool:
    """A run's folder (RUN_MARKERS) in which no checkpoint was ever saved: `--resume` has nothing to continue there."""
    return folder.is_dir() and any((folder / m).exists() for m in RUN_MARKERS) and not has_checkpoint(folder)


def fresh_run_folder(output: Path, numbered: bool) -> Path:
    """`output`, or with `numbered` the first free `output-2`, `output-3`, ... when `output` holds a run.

    A folder holding a run is never written into by a new run (metrics would be appended to the old run's,
    checkpoints mixed): `--resume` continues a run in place; otherwise the run goes to a fresh folder
    (`numbered`, for the default output) or is refused (an explicit --output). A numbered folder is also chosen
    past one that another command is writing (its lock is held) before it holds a run; an explicit one is refused
    by the lock itself (run_lock.py), naming the process.
    """
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"--output {output} is a file; give a folder for the run")
    if not holds_a_run(output) and not (numbered and is_locked(output)):
        return output
    if not numbered:
        raise FileExistsError(
            f"{output} already holds a run: add --resume {shlex.quote(str(output))} to continue it, "
            "or choose another --output"
        )
    n = 2
    while holds_a_run(output.with_name(f"{output.name}-{n}")) or is_locked(output.with_name(f"{output.name}-{n}")):
        n += 1
    return output.with_name(f"{output.name}-{n}")
