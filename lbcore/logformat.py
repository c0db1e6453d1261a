"""cslb's one log line format: timestamp, level, logger, event, then the event's fields.

Every line cslb's own processes write (the discovery process, the gunicorn master's and
workers' cslb lines, the bundled app) has the same parts, rendered one of two ways
(:data:`lbcore.knobs.LOG_FORMAT`, ``CSLB_LOG_FORMAT``):

* ``json`` — one JSON object per line, ASCII only (so a line is always one line, whatever
  a product ID holds), keys in this order: ``timestamp`` (wall clock, ISO 8601 UTC with
  milliseconds), ``level`` (``debug`` … ``critical``), ``logger`` (``cslb.discovery``,
  ``cslb.master``...), ``event`` (a stable snake_case name), ``pid``, then the fields::

    {"timestamp":"2025-05-01T09:30:00.123Z","level":"info","logger":"cslb.discovery","event":"publish","pid":4242,"generation":7,"endpoints":60}

* ``text`` — the same parts for a person reading a terminal: values are written bare
  when they are one printable word, else quoted as JSON strings (so a value never breaks
  the line)::

    2025-05-01T09:30:00.123Z INFO    cslb.discovery publish pid=4242 generation=7 endpoints=60

This module only renders (no I/O, time comes in as an argument); the rooms write the
lines: :class:`discovery.events.EventLog` and, through the standard :mod:`logging`
module, :mod:`workers.master.logs`. :class:`Formatter` renders a :class:`logging.LogRecord`: a
record whose message is an :class:`Event` (``log.info(Event("publish", generation=7))``)
or that carries ``record.cslb`` (a mapping with ``event`` and the fields) is that event;
any other record is event ``log`` with its ``message``. Handlers other than cslb's see
an :class:`Event` message as ``publish generation=7``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from lbcore.knobs import LOG_FORMATS

__all__ = ["RESERVED", "Event", "Formatter", "iso_utc", "level_name", "render"]

#: Keys every line starts with; a field of the same name is written as ``field_<name>``
#: (``pid``, the writing process, is dropped instead when the field holds the same PID).
RESERVED = ("timestamp", "level", "logger", "event", "pid")

_BARE = re.compile(r"[^\s\"=\\]+")
_LINE_BREAKS = re.compile("[\x85\u2028\u2029]")  # (json.dumps escapes those below 0x20)


def iso_utc(ts: float) -> str:
    """``ts`` (seconds since the epoch) as ISO 8601 UTC with milliseconds: ``…T09:30:00.123Z``."""
    whole = math.floor(ts)
    ms = min(int((ts - whole) * 1000), 999)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


def level_name(levelno: int) -> str:
    """The lowercase name of a :mod:`logging` level (``20`` -> ``"info"``)."""
    return logging.getLevelName(levelno).lower() if levelno in _NAMED else f"level{levelno}"


_NAMED = {logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL}


def _plain(value: Any) -> Any:
    """A JSON-ready stand-in for what :func:`json.dumps` cannot write."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as ``None`` (strict JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (np.floating, np.ndarray)):
        return _finite(_plain(value))
    return value


def _json(obj: Any) -> str:
    try:
        return json.dumps(
            obj, ensure_ascii=True, separators=(",", ":"), default=_plain, allow_nan=False
        )
    except ValueError:  # a NaN or an infinity somewhere: rare, so cleaned only then
        return json.dumps(
            _finite(obj), ensure_ascii=True, separators=(",", ":"), default=_plain, allow_nan=False
        )


def _text_value(value: Any) -> str:
    """A value in a text line: one bare printable word, else a JSON string (or JSON)."""
    if not isinstance(value, str):
        return _json(value)  # (ASCII: nothing in it breaks the line)
    if _BARE.fullmatch(value) and value.isprintable():
        return value
    quoted = json.dumps(value, ensure_ascii=False)
    return _LINE_BREAKS.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def render(
    fmt: str,
    timestamp: float,
    level: str,
    logger: str,
    event: str,
    fields: Mapping[str, Any] | None = None,
    pid: int | None = None,
) -> str:
    """One log line (without its newline).

    Parameters
    ----------
    fmt
        ``"json"`` or ``"text"`` (:data:`lbcore.knobs.LOG_FORMATS`).
    timestamp
        Wall-clock time of the event, seconds since the epoch.
    level
        ``"debug"``, ``"info"``, ``"warning"``, ``"error"`` or ``"critical"``.
    logger
        The writer's logger name (``cslb.discovery``).
    event
        Stable snake_case name of what happened.
    fields
        The event's fields, written in order after the reserved keys (a field named
        like one of :data:`RESERVED` is written as ``field_<name>``).
    pid
        The writing process (written after ``event``; ``None``: left out).

    Raises
    ------
    ValueError
        ``fmt`` is not a log format.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
    items = [] if pid is None else [("pid", pid)]
    for k, v in (fields or {}).items():
        if k == "pid" and v == pid:
            continue  # the writer's PID given again (say, by a failure line's fields)
        items.append((f"field_{k}" if k in RESERVED else str(k), v))
    if fmt == "json":
        doc: dict[str, Any] = {
            "timestamp": iso_utc(timestamp),
            "level": level,
            "logger": logger,
            "event": event,
        }
        doc.update(items)
        return _json(doc)
    head = f"{iso_utc(timestamp)} {level.upper():<7} {logger} {_text_value(event)}"
    return " ".join([head, *(f"{k}={_text_value(v)}" for k, v in items)])


class Event:
    """An event as a :mod:`logging` message: ``log.warning(Event("pod_slow", pod=p))``.

    Parameters
    ----------
    event
        Stable snake_case name of what happened.
    **fields
        The event's fields.
    """

    __slots__ = ("event", "fields")

    def __init__(self, event: str, /, **fields: Any) -> None:
        self.event = event
        self.fields = fields

    def __str__(self) -> str:
        """``event k=v ...``: what a handler other than cslb's writes as the message."""
        return " ".join(
            [_text_value(self.event), *(f"{k}={_text_value(v)}" for k, v in self.fields.items())]
        )

    def __repr__(self) -> str:
        return f"Event({self.event!r}, **{self.fields!r})"


class Formatter(logging.Formatter):
    """A :class:`logging.Formatter` writing cslb's line format.

    Parameters
    ----------
    fmt
        ``"json"`` or ``"text"``.

    Raises
    ------
    ValueError
        ``fmt`` is not a log format.
    """

    def __init__(self, fmt: str = "json") -> None:
        if fmt not in LOG_FORMATS:
            raise ValueError(f"log format {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
        super().__init__()
        self.log_format = fmt

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record``: its :class:`Event` or ``record.cslb``, else event ``log``."""
        msg = record.msg
        data = getattr(record, "cslb", None)
        fields: dict[str, Any] = {}
        if isinstance(msg, Event):
            event = msg.event
            fields.update(msg.fields)
        elif isinstance(data, Mapping) and "event" in data:
            event = str(data["event"])
            fields.update((k, v) for k, v in data.items() if k != "event")
        else:
            event = "log"
            fields["message"] = record.getMessage()
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            fields["exception"] = record.exc_text
        return render(
            self.log_format,
            record.created,
            level_name(record.levelno),
            record.name,
            event,
            fields,
            record.process,
        )
