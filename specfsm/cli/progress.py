"""The progress bar ``specfsm replay`` draws on stderr."""

from __future__ import annotations

import time
from typing import Any, TextIO

__all__ = ["Progress", "isatty"]


class Progress:
    """A one-line bar on stderr: ``[#####-----]  12/48 label``. Each redraw pads to the
    longest line drawn so far, so a shorter label leaves nothing of a longer one, and
    ``close`` clears the line."""

    def __init__(self, total: int, stream: TextIO, enabled: bool) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.enabled = enabled
        self.label = ""
        self._last = 0.0
        self._drawn = 0  # the longest line written so far

    def phase(self, label: str) -> None:
        self.label = label
        self._draw(force=True)

    def step(self, *_: Any) -> None:
        self.done += 1
        self._draw()

    def skip(self, n: int) -> None:
        self.done += n
        self._draw()

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        width = 30
        fill = width * self.done // self.total
        line = f"[{'#' * fill}{'-' * (width - fill)}] {self.done:>{len(str(self.total))}}/{self.total} {self.label}"
        self._drawn = max(self._drawn, len(line))
        self.stream.write(f"\r{line:<{self._drawn}}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()


def isatty(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (False for anything that cannot say)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
