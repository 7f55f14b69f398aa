"""Progress as plain lines with an estimate of the time left, for commands that run whole episodes in this
process (`esper-ray heuristic`, `esper-ray eval`), and the clock stamp and time-left estimate that the lines
of `esper-ray ab` and `train` use too.

A `text` episode takes many minutes on a CPU (one epoch 20-40 s on 2 cores, 25 epochs by default), a `digits`
one a second: so there is a line for every finished episode, and a line for an epoch only when `EPOCH_LINE_SECONDS`
have passed since the last line (every epoch of a slow episode, none of a fast one). Lines, not a bar redrawn
with a carriage return, so that a log file (stderr redirected) reads as the terminal does. They go to stderr:
stdout holds the results (one JSON document with `--json`).

The estimate assumes the epochs left take as long as the mean epoch so far (the first epoch's reset and the
test passes included; seeds grown later make epochs slower). An episode that a governor rollback ended early
counts as all its epochs, which makes the estimate err long.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from esper_ray.formatting import clock_stamp, counted, duration, time_left
from esper_ray.train.process.threads import threads_line

EPOCH_LINE_SECONDS = 5.0
"""At most one epoch line per this many seconds; an episode's end always has its line."""


class EpisodeProgress:
    """Lines for `episodes` episodes of up to `max_epochs` epochs each: call `epoch` after every env step and
    `episode_end` after every episode. `label` begins each line (the command's name)."""

    def __init__(
        self,
        label: str,
        episodes: int,
        max_epochs: int,
        *,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        threads: int | None = None,
    ) -> None:
        """`threads`: torch's threads in this process, said once in the first line (train/process/threads.py)."""
        self.label, self.episodes, self.max_epochs = label, episodes, max_epochs
        self.out, self.clock = out, clock
        self.start = self.last_line = clock()
        self.episodes_done = 0
        said = f", {threads_line(threads)}" if threads is not None else ""
        self._line(f"{counted(episodes, 'episode')} of up to {counted(max_epochs, 'epoch')} (results at the end){said}")

    def _line(self, text: str) -> None:
        now = self.clock()
        self.last_line = now
        print(f"{clock_stamp(now - self.start)} {self.label}: {text}", file=self.out or sys.stderr, flush=True)

    def _left(self, epochs_done: int) -> str:
        left = time_left(self.clock() - self.start, epochs_done, self.episodes * self.max_epochs)
        return f"; {left}" if left else ""

    def _episode(self) -> str:
        return f"episode {self.episodes_done} ({self.episodes_done + 1} of {self.episodes})"

    def epoch(self, epoch: int, info: Mapping[str, Any]) -> None:
        """After the env step that trained host epoch `epoch` (1-based: an episode's step count) of the current
        episode; `info` is the step's info (run_episode's `on_step`)."""
        if epoch >= self.max_epochs or self.clock() - self.last_line < EPOCH_LINE_SECONDS:
            return  # a fast epoch has no line, and the last one has its episode's
        done = self.episodes_done * self.max_epochs + epoch
        self._line(
            f"{self._episode()}, epoch {epoch}/{self.max_epochs}: val acc {100 * float(info['val_accuracy']):.1f}%"
            + self._left(done)
        )

    def episode_end(
        self, final_accuracy: float, params_added: int, seconds: float, test_accuracy: float | None = None
    ) -> None:
        """After an episode: its committed model's validation accuracy (and test accuracy, where measured), the
        parameters it kept and its seconds."""
        test = f", test acc {100 * test_accuracy:.1f}%" if test_accuracy is not None else ""
        text = (
            f"{self._episode()} done in {duration(seconds)}: final acc {100 * final_accuracy:.1f}%{test}, "
            f"params kept {params_added:,}"
        )
        self.episodes_done += 1
        self._line(text + self._left(self.episodes_done * self.max_epochs))


def warn(command: str, line: str | None) -> None:
    """A warning (a run too short for a seed to be kept, a host the policy never trained for) in one line on stderr;
    None: nothing to say."""
    if line is not None:
        print(f"esper-ray {command}: warning: {line}", file=sys.stderr, flush=True)
