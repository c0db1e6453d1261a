"""Structured logs of the discovery process: one JSON object per line, one line per event.

Every line has ``ts`` (wall-clock time, ISO 8601 UTC, for humans and log shippers),
``level``, ``event`` (a stable snake_case name such as ``endpoint_added``,
``publish``, ``api_error``) and event-specific fields. Operators grep for the event
name; tests read the same lines.

Lines go to a text stream (stderr by default) and to any extra sinks, which receive
the event as a dictionary (used by embedding code and tests).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["LEVELS", "EventLog", "LogLevelError"]

#: Levels in increasing severity.
LEVELS = ("debug", "info", "warning", "error")


class LogLevelError(ValueError):
    """A log level that is not one of :data:`LEVELS`."""


def _iso(ts: float) -> str:
    t = time.gmtime(ts)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(ts % 1 * 1000):03d}Z"


class EventLog:
    """Writes one JSON line per event.

    Parameters
    ----------
    stream
        Where lines go (``None``: nowhere, only to sinks).
    level
        Lowest level written to ``stream`` (sinks get every event).
    component
        Value of the ``component`` field of every line.

    Raises
    ------
    LogLevelError
        If ``level`` is not one of :data:`LEVELS`.
    """

    def __init__(
        self,
        stream: TextIO | None = sys.stderr,
        *,
        level: str = "info",
        component: str = "discovery",
    ) -> None:
        if level not in LEVELS:
            raise LogLevelError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
        self.stream = stream
        self.min_level = LEVELS.index(level)
        self.component = component
        self._sinks: list[Callable[[dict[str, Any]], None]] = []
        self._lock = threading.Lock()

    def add_sink(self, sink: Callable[[dict[str, Any]], None]) -> None:
        """Also hand every event (as a dictionary) to ``sink``."""
        self._sinks.append(sink)

    def emit(self, event: str, level: str = "info", **fields: Any) -> dict[str, Any]:
        """Log ``event`` with ``fields``; returns the record."""
        record: dict[str, Any] = {
            "ts": _iso(time.time()),
            "level": level,
            "component": self.component,
            "event": event,
        }
        record.update(fields)
        with self._lock:
            if self.stream is not None and LEVELS.index(level) >= self.min_level:
                line = json.dumps(record, default=str, ensure_ascii=False, separators=(",", ":"))
                try:
                    self.stream.write(line + "\n")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass  # a closed stderr must not stop the publisher
            for sink in self._sinks:
                sink(record)
        return record

    def debug(self, event: str, **fields: Any) -> dict[str, Any]:
        """Emit at level ``debug``."""
        return self.emit(event, "debug", **fields)

    def info(self, event: str, **fields: Any) -> dict[str, Any]:
        """Emit at level ``info``."""
        return self.emit(event, "info", **fields)

    def warning(self, event: str, **fields: Any) -> dict[str, Any]:
        """Emit at level ``warning``."""
        return self.emit(event, "warning", **fields)

    def error(self, event: str, **fields: Any) -> dict[str, Any]:
        """Emit at level ``error``."""
        return self.emit(event, "error", **fields)
