"""One writer per run folder: `esper-ray train` and `esper-ray ab` hold RUN/run.lock for the run's whole life.

Two commands given the same --output both passed the folder check before either wrote (Ray's start lies between
them), then wrote into each other's files. The lock is taken where the folder is checked, before Ray starts:
an flock(2) on run.lock, which holds the writer's process id for the message a second writer gets. The kernel
drops an flock when its process ends however it ends (kill -9 included), so a lock left by a dead process is
simply taken over; the file stays, naming the last writer. Ray's processes do not inherit it (Python opens files
non-inheritable), so a driver killed while its cluster lingers frees the folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "run.lock"


class RunFolderBusy(FileExistsError):
    """Another live process holds the folder's lock."""


def writable_folder(folder: Path, flag: str) -> Path:
    """`folder`, created if missing; an unusable one (below a file, on a read-only file system, not permitted) is
    one ValueError naming the flag and the path, before anything else starts."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".{LOCK_FILE}.probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ValueError(
            f"{flag} {folder}: cannot be written ({err.strerror or type(err).__name__}"
            f"{f': {err.filename}' if err.filename and str(err.filename) != str(folder) else ''}); "
            "give a folder you can write"
        ) from None
    return folder


def check_can_write(folder: Path, flag: str) -> None:
    """The ValueError writable_folder would raise for a folder that cannot be made or written, without making
    anything: for a check before Ray is imported, by a command that may still be refused for something else."""
    existing = folder.expanduser().absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    why = (
        "Not a directory"
        if not existing.is_dir()
        else None
        if os.access(existing, os.W_OK | os.X_OK)
        else "Permission denied"
    )
    if why is not None:
        raise ValueError(
            f"{flag} {folder}: cannot be written ({why}{f': {existing}' if existing != folder else ''}); "
            "give a folder you can write"
        )


@contextlib.contextmanager
def run_folder_lock(folder: Path, flag: str = "--output") -> Iterator[Path]:
    """Within: this process is the folder's only writer (created if missing). Raises RunFolderBusy naming the
    folder and the process that holds it, or ValueError when the folder cannot be written (writable_folder)."""
    created = not folder.exists()
    writable_folder(folder, flag)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    wrote = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise RunFolderBusy(
                f"{folder} is in use: process {holder} is writing a run there (it holds {path}); "
                f"wait for it to end, or give another {flag}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        wrote = True
        yield folder
    finally:
        os.close(fd)  # releases the flock
        if created and wrote and [p.name for p in folder.iterdir()] == [LOCK_FILE]:
            path.unlink()  # a run refused before it wrote anything (it does not fit, say) leaves no folder behind
            folder.rmdir()


def is_locked(folder: Path) -> bool:
    """Whether a live process holds the folder's lock now (a fresh, numbered folder is chosen past it)."""
    path = folder / LOCK_FILE
    if not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
