"""A one-line progress bar on stderr for runs that take more than a moment."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """Redraws ``label [#####.....] 45/120 s  12.3 s`` in place.

    Nothing is drawn during the first ``delay_s`` seconds of wall time, so short runs
    stay quiet; redraws are limited to ``every_s``.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        width: int = 30,
        delay_s: float = 1.0,
        every_s: float = 0.2,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.delay_s = delay_s
        self.every_s = every_s
        self.start = time.perf_counter()
        self._last = 0.0
        self._drawn = False

    def __call__(self, label: str, done: float, total: float) -> None:
        """Show ``label`` at ``done`` of ``total`` (simulated seconds, or search probes)."""
        now = time.perf_counter()
        elapsed = now - self.start
        if elapsed < self.delay_s or (now - self._last < self.every_s and done < total):
            return
        self._last = now
        frac = 0.0 if total <= 0 else min(1.0, done / total)
        bar = "#" * round(frac * self.width)
        line = f"\r{label[:40]:<40} [{bar:<{self.width}}] {done:5.0f}/{total:.0f}  {elapsed:6.1f} s"
        self.stream.write(line)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """End the bar's line (if anything was drawn)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
