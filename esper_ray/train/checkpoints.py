"""A training run's folder and its checkpoints.

    config.json                 the TrainConfig
    metrics.jsonl               one RoundSummary per round
    tensorboard/                each round's figures, grouped (tensorboard_log.py), and the settings as text
    checkpoints/round_NNNNN/    RLlib checkpoints (weights, optimizer, observation filter, reward normaliser)
                                + train_config.json + files.json (every file's size and SHA-256)
    checkpoints/latest.json     the newest checkpoint, as a path relative to checkpoints/, so a copied or moved
                                run folder (rsync-down, then eval) resumes its own checkpoint

A checkpoint is written into round_NNNNN.partial and renamed when complete, and latest.json is written to a
temporary name and renamed over the old one, so latest.json only ever names a complete checkpoint, whatever
cuts a save short. A checkpoint damaged later (an interrupted copy, a full disk) fails its files.json check
when it is resumed or evaluated, in seconds, naming the file; loading it would fail inside the learner actor,
which RLlib then waits on for ever.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

from esper_ray.contracts.train_config import TrainConfig

TRAIN_CONFIG_FILE = "train_config.json"
LATEST_FILE = "latest.json"
MANIFEST_FILE = "files.json"
PARTIAL_SUFFIX = ".partial"
RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints")


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


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary name beside `path`, then rename: readers see the old file or the new, never half."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(checkpoint: Path) -> None:
    """files.json: the size and SHA-256 of every file of the checkpoint (as saved)."""
    files = {p.relative_to(checkpoint).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(checkpoint.rglob("*")) if p.is_file() and p.name != MANIFEST_FILE}
    (checkpoint / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=1))


def damage_of(checkpoint: Path) -> str | None:
    """What is wrong with a checkpoint folder ("learner_group/learner/state.pkl: 1,000 bytes, saved with 487,622"),
    or None when it is complete. Without files.json (checkpoints of older versions), every pickle must load."""
    manifest = checkpoint / MANIFEST_FILE
    if not manifest.is_file():
        for path in sorted(checkpoint.rglob("*.pkl")):
            try:
                with path.open("rb") as f:
                    pickle.load(f)
            except (pickle.UnpicklingError, EOFError) as err:
                return f"{path.relative_to(checkpoint).as_posix()}: {err}"
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        return f"{MANIFEST_FILE}: unreadable ({err})"
    for name, saved in files.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name}: missing"
        size = path.stat().st_size
        if size != saved["bytes"]:
            return f"{name}: {size:,} bytes, saved with {saved['bytes']:,}"
        if _sha256(path) != saved["sha256"]:
            return f"{name}: its contents changed since it was saved (SHA-256 differs)"
    return None


def check_complete(checkpoint: Path) -> None:
    """Raise ValueError naming the damaged file and the newest earlier checkpoint that is complete (or saying
    there is none) unless `checkpoint` is complete."""
    damage = damage_of(checkpoint)
    if damage is None:
        return
    rounds = {p: _round_number(p) for p in checkpoint.parent.iterdir() if p.is_dir()}
    this = _round_number(checkpoint)
    earlier = sorted((p for p, r in rounds.items() if r is not None and this is not None and r < this),
                     key=lambda p: rounds[p], reverse=True)
    complete = next((p for p in earlier if damage_of(p) is None), None)
    fallback = (f"the newest complete one is {complete}: resume from it with --resume {complete}" if complete is not None
                else f"no earlier complete checkpoint is in {checkpoint.parent}")
    raise ValueError(f"checkpoint {checkpoint} is damaged: {damage}; {fallback}")


def latest_round(output: Path) -> int | None:
    latest = output / "checkpoints" / LATEST_FILE
    return int(json.loads(latest.read_text())["round"]) if latest.is_file() else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a training output folder (then its newest checkpoint); checked complete."""
    checkpoint = _find_checkpoint(Path(path).expanduser())
    check_complete(checkpoint)
    return checkpoint


def _find_checkpoint(path: Path) -> Path:
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


def _round_number(folder: Path) -> int | None:
    """N of a folder named round_NNNNN; None for any other name (a .partial folder, say)."""
    digits = folder.name[len("round_"):]
    return int(digits) if folder.name.startswith("round_") and digits.isdigit() else None


def round_of(checkpoint: Path) -> int:
    """The round a checkpoint folder (`round_NNNNN`) was saved after."""
    number = _round_number(checkpoint)
    if number is None:
        raise ValueError(f"{checkpoint}: not an esper-ray checkpoint folder (expected a name like round_00010)")
    return number


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
