"""ProgressBar: the progress of a long command (``prune``, ``migrate``, ``persistence
import/export``) on stderr."""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

__all__ = ["ProgressBar", "bar"]

_WIDTH = 24
_EVERY_S = 1.0  # a redirected stderr gets at most a line a second (and the last one)


def bar(done: int, total: Optional[int]) -> str:
    """``[#########...............] 1,200/3,000`` (without a total: ``1,200``)."""
    if not total:
        return f"{done:,}"
    filled = min(_WIDTH, done * _WIDTH // total)
    return f"[{'#' * filled}{'.' * (_WIDTH - filled)}] {done:,}/{total:,}"


class ProgressBar:
    """A bar on stderr, redrawn in place on a terminal.

    When stderr is not a terminal (a log file, CI), it writes a whole line at most once a
    second and one at the end. Stdout is never touched: ``--json`` output stays clean.

    Args:
        label: What is done (``"prune"``, ``"migrate"``).
        total: How many steps there are (:obj:`None`: not known ahead).
        unit: What a step is (``"row(s)"``, ``"step(s)"``).
        say: Where a whole line goes instead of the terminal (the command's ``stderr``).
        stream: The terminal (default ``sys.stderr``).
    """

    __slots__ = ("_drawn", "_last", "_say", "_stream", "_tty", "done", "label", "total", "unit")

    def __init__(
        self,
        label: str,
        total: Optional[int],
        *,
        unit: str = "",
        say: Optional[Callable[[str], None]] = None,
        stream: Optional[TextIO] = None,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self._stream: TextIO = stream or sys.stderr
        self._say = say
        try:
            self._tty = bool(self._stream.isatty())
        except (AttributeError, ValueError):
            self._tty = False
        self._last = time.monotonic()
        self._drawn = False

    def text(self, note: str = "") -> str:
        """The bar's current line."""
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.label} {bar(self.done, self.total)}{unit}" + (f" {note}" if note else "")

    def advance(self, steps: int = 1, note: str = "") -> None:
        """Count ``steps`` more as done and show it."""
        self.done += steps
        self._show(note, final=False)

    def finish(self, note: str = "") -> None:
        """Show the last state and end the line."""
        self._show(note, final=True)
        if self._tty and self._drawn:
            self._stream.write("\n")
            self._stream.flush()

    def _show(self, note: str, *, final: bool) -> None:
        line = self.text(note)
        if self._tty:
            # \r and clear to the end of the line: a shorter note leaves nothing behind
            self._stream.write(f"\r\x1b[K{line}")
            self._stream.flush()
            self._drawn = True
            return
        now = time.monotonic()
        if not final and now - self._last < _EVERY_S:
            return
        self._last = now
        if self._say is not None:
            self._say(line)
        else:
            self._stream.write(line + "\n")
            self._stream.flush()
