"""A folder's manifest: the size and SHA-256 of every file in it, written atomically when the folder is complete.

Checkpoints and Tune folders hold pickles, and unpickling runs whatever the file names. So the integrity of a
run is checked against its manifest, never by loading its pickles: `damage_of` reads sizes and hashes only, and
a pickle is loaded (to resume or evaluate) only after its folder matches its manifest. A manifest says a folder
is as its writer left it; it cannot say the writer is to be trusted (whoever hands over a folder can write its
manifest too), so resume or evaluate only runs from someone you trust.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST_FILE = "files.json"
TEMPORARY_SUFFIX = ".tmp"


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary name beside `path`, then rename: readers see the old file or the new, never half."""
    temporary = path.with_name(path.name + TEMPORARY_SUFFIX)
    with temporary.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path, manifest: Path) -> list[Path]:
    skip = {manifest, manifest.with_name(manifest.name + TEMPORARY_SUFFIX)}
    return [p for p in sorted(folder.rglob("*")) if p.is_file() and p not in skip]


def write_manifest(folder: Path, manifest: Path | None = None) -> None:
    """Record the size and SHA-256 of every file below `folder` in `manifest` (default: folder/files.json)."""
    manifest = manifest or folder / MANIFEST_FILE
    files = {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_of(p)}
        for p in _files(folder, manifest)
    }
    write_atomically(manifest, json.dumps({"files": files}, indent=1))


def damage_of(folder: Path, manifest: Path | None = None) -> str | None:
    """What differs between `folder` and its manifest ("learner/state.pkl: 1,000 bytes, saved with 487,622"), or
    None when every file is as recorded and no file was added. Reads no file but the manifest as data."""
    manifest = manifest or folder / MANIFEST_FILE
    if not manifest.is_file():
        return f"{manifest.name}: missing, so its files cannot be checked without running their pickles"
    try:
        files = json.loads(manifest.read_text())["files"]
        recorded = {str(name): (int(saved["bytes"]), str(saved["sha256"])) for name, saved in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, UnicodeDecodeError) as err:
        return f"{manifest.name}: unreadable ({type(err).__name__}: {err})"
    present = {p.relative_to(folder).as_posix() for p in _files(folder, manifest)}
    added = sorted(present - set(recorded))
    if added:
        return f"{added[0]}: not in {manifest.name} (added after it was written)"
    for name, (size, sha256) in recorded.items():
        path = folder / name
        if name not in present:
            return f"{name}: missing"
        if path.stat().st_size != size:
            return f"{name}: {path.stat().st_size:,} bytes, saved with {size:,}"
        if sha256_of(path) != sha256:
            return f"{name}: its contents changed since it was saved (SHA-256 differs)"
    return None


if __name__ == "__main__":  # write the manifest of a folder you trust (a checkpoint saved before manifests existed)
    import sys

    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit(
            "usage: python -m esper_ray.train.folders.manifest FOLDER  "
            "(records the size and SHA-256 of every file in FOLDER)"
        )
    write_manifest(Path(sys.argv[1]))
    print(f"wrote {Path(sys.argv[1]) / MANIFEST_FILE}")
