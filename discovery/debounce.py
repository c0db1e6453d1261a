"""Debounce: fold a burst of endpoint changes into one ring update.

A rolling deployment or a 50-pod scale-up reaches the informer as dozens of events
over a few seconds. Publishing each would open a fade ring per pod and bump the
generation dozens of times. The debouncer waits until the source has been quiet for
``delay_ns`` (trailing debounce), but never longer than ``max_delay_ns`` after the first
change of the burst, so a source that never goes quiet still publishes regularly.

Pure: time is an argument (CLOCK_MONOTONIC nanoseconds).
"""

from __future__ import annotations

__all__ = ["DebounceError", "Debouncer"]


class DebounceError(ValueError):
    """A debounce delay or cap that cannot work (negative, or a cap below the delay)."""


class Debouncer:
    """Trailing debounce with a cap.

    Parameters
    ----------
    delay_ns
        Quiet time after the last change before the burst is released, in nanoseconds
        (0: release at once).
    max_delay_ns
        Longest time from the first change of a burst to its release, in nanoseconds;
        ``None``: five times ``delay_ns``.

    Raises
    ------
    DebounceError
        If ``delay_ns`` is negative or ``max_delay_ns`` is below it.
    """

    def __init__(self, delay_ns: int, max_delay_ns: int | None = None) -> None:
        if delay_ns < 0:
            raise DebounceError(f"debounce delay must be >= 0 ns, got {delay_ns}")
        self.delay_ns = int(delay_ns)
        self.max_delay_ns = int(5 * delay_ns if max_delay_ns is None else max_delay_ns)
        if self.max_delay_ns < self.delay_ns:
            raise DebounceError(
                f"debounce cap ({self.max_delay_ns} ns) must be >= the delay ({self.delay_ns} ns)"
            )
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.changes = 0

    @property
    def pending(self) -> bool:
        """True while changes wait for release."""
        return self.first_ns is not None

    def note(self, now_ns: int) -> None:
        """Record a change at ``now_ns``."""
        if self.first_ns is None:
            self.first_ns = now_ns
        self.last_ns = now_ns
        self.changes += 1

    def deadline(self) -> int | None:
        """When the pending burst is released (``None`` if nothing is pending)."""
        if self.first_ns is None or self.last_ns is None:
            return None
        return min(self.last_ns + self.delay_ns, self.first_ns + self.max_delay_ns)

    def due(self, now_ns: int) -> bool:
        """True if a burst is pending and its release time has come."""
        d = self.deadline()
        return d is not None and now_ns >= d

    def reset(self) -> int:
        """Forget the pending burst (after publishing it); returns how many changes it held."""
        n = self.changes
        self.first_ns = self.last_ns = None
        self.changes = 0
        return n
