"""The worker's counter row: attached, claimed (or adopted), followed when replaced.

A :class:`CounterRow` attaches the host's counters when they exist, claims a row of the
counter matrix for this process (the row the gunicorn master reserved for this worker
if it names one, ``CSLB_COUNTER_ROW``, else any free row) and hands its recorder to the
worker's :class:`workers.routing.recording.Recording` and its reader to the snapshot follower.
The router calls :meth:`CounterRow.connect` about once a second: counters that appeared
meanwhile are attached, counters the master replaced (it restarted them) are dropped and
a new row is claimed in the new ones.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import shm
from workers.routing.errors import RouterInputError
from workers.routing.recording import Recording
from workers.routing.snapshot import Follower

__all__ = ["COUNTER_ROW_ENV", "CounterRow", "WarnOnce", "row_from_env"]

log = logging.getLogger("cslb.router")

#: Environment variable through which the gunicorn master hands a worker its reserved row.
COUNTER_ROW_ENV = "CSLB_COUNTER_ROW"


def row_from_env() -> int | None:
    """The row ``CSLB_COUNTER_ROW`` reserves for this process (``None``: not set).

    Raises
    ------
    RouterInputError
        Not a row number ``>= 0``.
    """
    raw = os.environ.get(COUNTER_ROW_ENV)
    if raw is None or not raw.strip():
        return None
    try:
        row = int(raw.strip())
    except ValueError:
        row = -1
    if row < 0:
        raise RouterInputError(
            f"environment: invalid {COUNTER_ROW_ENV}={raw!r}: expected a counter row number >= 0"
        )
    return row


class WarnOnce:
    """Logs a warning the first time its cause happens (not on every retry)."""

    def __init__(self) -> None:
        self._warned: set[tuple[Any, ...]] = set()

    def __call__(self, cause: tuple[Any, ...], msg: str, *args: Any) -> None:
        """Log ``msg % args`` at WARNING unless ``cause`` was said already."""
        warned = self._warned
        if cause in warned:
            return
        if len(warned) >= 64:  # a bounded memory of causes: say them again after many
            warned.clear()
        warned.add(cause)
        log.warning(msg, *args)


class CounterRow:
    """The process's row of the host's counters, for as long as the router lives.

    Not thread-safe: the router calls :meth:`connect` under its lock.

    Parameters
    ----------
    namespace
        Shared-memory namespace of the counters.
    threads
        Share the row among the process's threads (:class:`shm.LockedRecorder`).
    row
        The row reserved for this process, adopted once (``None``: any free row).
    recording, follow
        Given the row's recorder and the counters' reader when there are any.
    warn_once
        The router's once-per-cause warning.
    check_s
        How often :meth:`connect` is called, in seconds (for the log lines).

    Attributes
    ----------
    row : int or None
        The row recorded into (``None`` without counters).
    adopted : bool
        Whether it was the reserved one.
    reattached : int
        How many times replaced counters were attached again.
    recorder : shm.Recorder or shm.LockedRecorder or None
        The row's recorder.
    """

    def __init__(
        self,
        namespace: str,
        *,
        threads: bool,
        row: int | None,
        recording: Recording,
        follow: Follower,
        warn_once: Callable[..., None],
        check_s: float,
    ) -> None:
        self.namespace = namespace
        self.threads = threads
        self._wanted = row
        self._recording = recording
        self._follow = follow
        self._warn_once = warn_once
        self._check_s = check_s
        self._store: shm.CounterStore | None = None
        self._no_row_logged = False
        self.recorder: shm.Recorder | shm.LockedRecorder | None = None
        self.row: int | None = None
        self.adopted = False
        self.reattached = 0

    def connect(self) -> None:
        """Attach the counters and claim a row if missing; follow replaced counters."""
        store = self._store
        if store is not None and store.replaced():
            log.warning(
                "counters of %s were replaced (owner restarted); claiming a new row",
                self.namespace,
            )
            self._recording.attach(None)
            self._follow.use_counters(None)
            self._store = self.recorder = None
            self.row = None
            self.adopted = False
            self.reattached += 1
        if self._store is not None:
            return
        try:
            store = shm.CounterStore.attach(self.namespace)
        except shm.SegmentMissingError as exc:
            log.debug("counters of %s not attachable yet: %s", self.namespace, exc)
            return
        except shm.SegmentError as exc:
            self._warn_once(
                ("attach", "counters", str(exc)),
                "counters of %s cannot be used (retried every %g s; load not recorded "
                "meanwhile): %s",
                self.namespace,
                self._check_s,
                exc,
            )
            return
        try:
            rec, self.adopted = self._claim(store)
        except shm.ShmError as exc:
            if not self._no_row_logged:  # retried every second: say it once
                log.warning("no counter row for this worker in %s: %s", self.namespace, exc)
                self._no_row_logged = True
            return
        self.row = rec.row
        self.recorder = shm.LockedRecorder(rec) if self.threads else rec
        self._recording.attach(self.recorder)
        self._follow.use_counters(store.reader())
        self._store = store
        self._wanted = None  # a reserved row is adopted once, never again

    def _claim(self, store: shm.CounterStore) -> tuple[shm.Recorder, bool]:
        row = self._wanted
        if row is not None:
            try:
                return store.claim(row=row), True
            except shm.SlotOwnershipError as exc:
                # Say, a process started by the worker, which inherited its environment.
                # Said once: the row will not become ours later, so ask only for a free one
                # from now on (while none is free, connect retries every second).
                log.warning("counter row %d is not reserved for this process (%s)", row, exc)
                self._wanted = None
        return store.claim(), False

    def close(self) -> None:
        """Give the row back and detach the counters."""
        rec, self.recorder = self.recorder, None
        self._recording.attach(None)
        if rec is not None:
            try:
                rec.release()
            except shm.ShmError as exc:
                log.warning("counter row not released: %s", exc)
        counters = self._follow.counters
        if counters is not None:
            counters.close()
        if self._store is not None:
            self._store.close()
