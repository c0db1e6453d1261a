"""The failure log: one JSON line per failed call, at most a few per endpoint per second.

A dead pod under load fails thousands of calls a second; a line for each would bury
everything else in the log (and cost the worker more than the calls). Each endpoint
gets :data:`LINES_PER_S` lines per second; past that its failures are counted, and the
first line after its second ends (or :meth:`FailureLog.tick`, called after every
fan-out) says how many were left out::

    {"event": "cslb_call_failed", "product_id": "SKU-1", "endpoint": "http://10.2.0.7:8080",
     "pod_ip": "10.2.0.7", "node": "node-a1", "zone": "eu-central-1a", "attempt": 0,
     "generation": 12, "kind": "connect", "error": "...", "retry": "succeeded", ...}
    {"event": "cslb_call_failures_suppressed", "endpoint": "http://10.2.0.7:8080",
     "pod_ip": "10.2.0.7", "suppressed": 2781, "window_s": 1.0, "pid": 4242}

Lines go to the ``cslb.router`` logger at WARNING, as ASCII JSON (always one line), with
the same fields attached to the record as ``record.cslb`` for structured handlers; cslb's
own handler (under :mod:`workers.gunicorn_conf`, :mod:`workers.master.logs`) writes them in
cslb's line format, the event and these fields after ``timestamp``, ``level``,
``logger`` and ``pid``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import numpy as np

__all__ = ["LINES_PER_S", "FailureLog", "key_text", "pod_ip"]

#: Failure lines per endpoint per second before the rest are only counted.
LINES_PER_S = 3
_WINDOW_NS = 1_000_000_000
_MAX_ENDPOINTS = 4096  # windows remembered; older ones are dropped beyond this


def key_text(key: Any) -> str:
    """A key as text for the failure log."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key).decode("utf-8", "backslashreplace")
    if isinstance(key, np.generic):
        key = key.item()
        if isinstance(key, bytes):
            return key.decode("utf-8", "backslashreplace")
    return str(key)


def pod_ip(endpoint: str) -> str:
    """The host part of an endpoint address (the pod's IP), else the address itself."""
    try:
        host = urlsplit(endpoint if "://" in endpoint else f"//{endpoint}").hostname
    except ValueError:
        host = None
    return host or endpoint


class FailureLog:
    """Rate-limited failure lines of one worker process (thread-safe).

    Parameters
    ----------
    logger
        Where lines go (WARNING).
    lines_per_s
        Lines per endpoint per second; the rest are counted into one summary line.
    clock
        CLOCK_MONOTONIC nanoseconds.
    """

    def __init__(
        self,
        logger: logging.Logger,
        lines_per_s: int = LINES_PER_S,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.logger = logger
        self.lines_per_s = int(lines_per_s)
        self._clock = clock
        self._lock = threading.Lock()
        # endpoint -> [window start (ns), lines written in it, failures left out]
        self._windows: dict[str, list[int]] = {}
        self._due = -1  # earliest end of a window with failures left out (-1: none)

    def failed(self, fields: dict[str, Any]) -> bool:
        """Log one failed call (``fields`` name at least ``endpoint``); ``False``: left out."""
        ep = str(fields.get("endpoint"))
        now = self._clock()
        with self._lock:
            w = self._windows.get(ep)
            summary = None
            if w is None or now - w[0] >= _WINDOW_NS:
                if w is not None and w[2]:
                    summary = (ep, w[2])
                if w is None and len(self._windows) >= _MAX_ENDPOINTS:
                    self._prune(now)
                w = self._windows[ep] = [now, 0, 0]
            if w[1] < self.lines_per_s:
                w[1] += 1
                write = True
            else:
                w[2] += 1
                write = False
                end = w[0] + _WINDOW_NS
                if self._due < 0 or end < self._due:
                    self._due = end
        if summary is not None:
            self._summary(*summary)
        if write:
            self.logger.warning("%s", json.dumps(fields, ensure_ascii=True), extra={"cslb": fields})
        if 0 <= self._due <= now:  # other endpoints' windows that ended with lines left out
            self.tick()
        return write

    def tick(self) -> None:
        """Write the summary line of every window that ended with failures left out.

        Called after every fan-out and by every failure line; a caller recording failures
        by other means (``Tracker.fail``) that stop should call it too, or the last
        window's count waits for the next failure.
        """
        if self._due < 0:
            return
        now = self._clock()
        if now < self._due:
            return
        out = []
        with self._lock:
            due = -1
            for ep, w in self._windows.items():
                if not w[2]:
                    continue
                end = w[0] + _WINDOW_NS
                if now >= end:
                    out.append((ep, w[2]))
                    w[2] = 0  # (the window is over: the next failure opens a new one)
                elif due < 0 or end < due:
                    due = end
            self._due = due
        for ep, n in out:
            self._summary(ep, n)

    def _prune(self, now: int) -> None:
        """Forget windows that ended (their left-out counts are written first)."""
        for ep in [e for e, w in self._windows.items() if now - w[0] >= _WINDOW_NS]:
            w = self._windows.pop(ep)
            if w[2]:
                self._summary(ep, w[2])

    def _summary(self, endpoint: str, suppressed: int) -> None:
        fields = {
            "event": "cslb_call_failures_suppressed",
            "endpoint": endpoint,
            "pod_ip": pod_ip(endpoint),
            "suppressed": suppressed,
            "window_s": _WINDOW_NS / 1e9,
            "pid": os.getpid(),
        }
        self.logger.warning("%s", json.dumps(fields, ensure_ascii=True), extra={"cslb": fields})
