"""Structured logs of the discovery process: one line per event, in cslb's log format.

Every line has ``timestamp`` (wall-clock time, ISO 8601 UTC, for humans and log
shippers), ``level``, ``logger`` (``cslb.discovery``), ``event`` (a stable snake_case
name such as ``endpoint_added``, ``publish``, ``api_error``), ``pid`` and the event's
fields, written as JSON or as text (:mod:`lbcore.logformat`, ``CSLB_LOG_FORMAT``).
Operators grep for the event name; tests read the same lines.

Lines go to a text stream (stderr by default) and to any extra sinks, which receive
the event as a dictionary (used by embedding code and tests).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from lbcore.knobs import LOG_FORMATS
from lbcore.knobs import LOG_LEVELS as LEVELS
from lbcore.logformat import iso_utc, render

__all__ = ["LEVELS", "EventLog", "LogLevelError"]


class LogLevelError(ValueError):
    """A log level that is not one of :data:`LEVELS`, or a format not one of the formats."""


class EventLog:
    """Writes one JSON line per event.

    Parameters
    ----------
    stream
        Where lines go (``None``: nowhere, only to sinks).
    level
        Lowest level written to ``stream`` (sinks get every event).
    logger
        Value of the ``logger`` field of every line.
    fmt
        ``"json"`` or ``"text"`` (:data:`lbcore.knobs.LOG_FORMAT`).

    Raises
    ------
    LogLevelError
        If ``level`` is not one of :data:`LEVELS` or ``fmt`` not a log format.
    """

    def __init__(
        self,
        stream: TextIO | None = sys.stderr,
        *,
        level: str = "info",
        logger: str = "cslb.discovery",
        fmt: str = "json",
    ) -> None:
        if level not in LEVELS:
            raise LogLevelError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
        if fmt not in LOG_FORMATS:
            raise LogLevelError(f"log format {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
        self.stream = stream
        self.min_level = LEVELS.index(level)
        self.logger = logger
        self.fmt = fmt
        self._sinks: list[Callable[[dict[str, Any]], None]] = []
        self._lock = threading.Lock()

    def add_sink(self, sink: Callable[[dict[str, Any]], None]) -> None:
        """Also hand every event (as a dictionary) to ``sink``."""
        self._sinks.append(sink)

    def emit(self, event: str, level: str = "info", **fields: Any) -> dict[str, Any]:
        """Log ``event`` with ``fields``; returns the record (what sinks get)."""
        now = time.time()
        pid = os.getpid()
        record: dict[str, Any] = {
            "timestamp": iso_utc(now),
            "level": level,
            "logger": self.logger,
            "event": event,
            "pid": pid,
        }
        record.update(fields)
        with self._lock:
            if self.stream is not None and LEVELS.index(level) >= self.min_level:
                line = render(self.fmt, now, level, self.logger, event, fields, pid)
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
