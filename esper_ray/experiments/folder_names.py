"""Names that become folders: an experiment's, an arm's, a held-out host's."""

from __future__ import annotations

import re
from typing import Any

FOLDER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def check_folder_name(key: str, value: Any, what: str = "name") -> None:
    """An experiment or arm name becomes a folder (esper_runs/NAME, networks/ARM, Tune's trial folders): only a
    plain folder name, never a path ('..', 'a/b') or a name a shell or another system reads differently."""
    if not isinstance(value, str) or not FOLDER_NAME.fullmatch(value):
        raise ValueError(
            f"{key}={value!r}: the {what} must be a plain folder name of at most 100 letters, digits, "
            "'_', '-' or '.', starting with a letter, digit or '_'"
        )
