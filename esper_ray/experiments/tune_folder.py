"""Ray Tune's experiment folder read as data: trial states, configs, errors and results, from JSON and text only.

    tune/experiment_state-<time>.json   every trial's status, config and folder (Tune rewrites it as it runs;
                                        the newest by name is the current one, as Tune's own restore picks it)
    tune/<trial>/result.json            one JSON line per reported result
    tune/<trial>/error.txt              the tracebacks of the trial's failures
    tune/tuner.pkl, */params.pkl, ...   pickles: read only by Tune when it resumes the experiment

`Tuner.restore(...).get_results()` would unpickle tuner.pkl, and Tune's JSON decoder turns the state file's
`CLOUDPICKLE_FALLBACK` entries back into objects by unpickling them. Reading a run to report it must run no
code from its files, so this module parses the JSON with the standard decoder and leaves those entries as the
strings they are on disk.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_GLOB = "experiment_state-*.json"
RESULT_FILE = "result.json"
ITERATION = "training_iteration"


@dataclass(frozen=True)
class TuneTrial:
    trial_id: str
    status: str
    """Tune's status: PENDING, RUNNING, PAUSED, TERMINATED or ERROR."""
    config: dict[str, Any]
    folder: Path
    error: str | None
    """The last line of the trial's last failure (its error.txt), when it ended in ERROR."""


def state_file(tune_path: Path) -> Path | None:
    """The experiment's current state file, or None when Tune has written none (nothing started)."""
    found = sorted(tune_path.glob(STATE_GLOB)) if tune_path.is_dir() else []
    return found[-1] if found else None


def _unreadable(path: Path, why: str) -> ValueError:
    return ValueError(f"{path}: {why}; the run folder is damaged (an interrupted copy?)")


def read_trials(tune_path: Path) -> list[TuneTrial]:
    """Every trial the experiment's state file lists (none when it has no state file)."""
    path = state_file(tune_path)
    if path is None:
        return []
    try:
        state = json.loads(path.read_text())
        entries = [
            (json.loads(trial), json.loads(meta) if isinstance(meta, str) else meta)
            for trial, meta in state["trial_data"]
        ]
    except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as err:
        raise _unreadable(path, f"not Tune's experiment state ({type(err).__name__}: {err})") from None
    trials = []
    for trial, _meta in entries:
        if (
            not isinstance(trial, dict)
            or not isinstance(trial.get("config"), dict)
            or not isinstance(trial.get("relative_logdir"), str)
        ):
            raise _unreadable(path, f"a trial entry without config or relative_logdir ({str(trial)[:120]})")
        folder = tune_path / trial["relative_logdir"]
        if folder.resolve().parent != tune_path.resolve():  # a report reads the run folder only
            raise _unreadable(
                path,
                f"a trial's relative_logdir={trial['relative_logdir'][:120]!r} is not a folder of "
                f"{tune_path} (Tune names each trial's folder inside it)",
            )
        status = str(trial.get("status"))
        error = _error_line(folder / "error.txt") if status == "ERROR" else None
        trials.append(TuneTrial(str(trial.get("trial_id")), status, trial["config"], folder, error))
    return trials


def _own_file(path: Path) -> Path:
    """`path`, a file of a trial's folder, unless a link makes it another folder's (a report reads its run only)."""
    if path.resolve().parent != path.parent.resolve():
        raise _unreadable(path, f"a link to {path.resolve()}, outside its trial's folder")
    return path


def _error_line(path: Path) -> str:
    """The exception line of the last traceback in a trial's error.txt."""
    if not path.is_file():
        return "failed (no error.txt)"
    _own_file(path)
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "failed (empty error.txt)"


def read_results(folder: Path) -> list[dict[str, Any]]:
    """The trial's reported results in order of training iteration, each iteration once.

    A trial resumed from a checkpoint older than its last reported result (an interrupt between the result and
    the checkpoint) reports that iteration again, and Tune appends it to result.json; the later report is the one
    the rest of the trial continued from, so it is kept.
    """
    path = folder / RESULT_FILE
    if not path.is_file():
        return []
    _own_file(path)
    by_iteration: dict[int, dict[str, Any]] = {}
    lines = path.read_text(errors="replace").splitlines()
    for line_number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            result = json.loads(line)
            iteration = int(result[ITERATION])
        except (ValueError, KeyError, TypeError, RecursionError):
            if line_number == len(lines):
                continue  # a last line cut short by an interrupt: that result was never complete
            raise _unreadable(path, f"line {line_number} is not a Tune result") from None
        by_iteration[iteration] = result
    return [by_iteration[i] for i in sorted(by_iteration)]


def number(value: Any) -> float:
    """A result's value as a float (NaN when absent or not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)
