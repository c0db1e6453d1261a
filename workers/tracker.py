"""One fan-out's load, recorded: what :meth:`workers.Router.track` returns.

On enter every routed call counts as in flight at its endpoint; on exit each call ends,
with its busy time from enter to its :meth:`Tracker.done` time (default: the exit),
and failed if :meth:`Tracker.fail` was called for it. Fallback calls (``-1``) went
through the ingress and are not recorded. The tracker writes through the worker's
:class:`workers.recording.Recording`: one start and one end for the whole fan-out.

:meth:`Tracker.fail` logs one line (rate-limited per endpoint,
:mod:`workers.failurelog`) on the ``cslb.router`` logger at WARNING: a JSON object
with ``event`` = ``"cslb_call_failed"``, ``product_id``, ``endpoint``, ``pod_ip`` (the
endpoint's host), ``node``, ``zone``, ``attempt``, ``generation``, ``call`` (position
in the fan-out) and ``pid``; the same fields are attached to the record as
``record.cslb``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

import shm
from workers.failurelog import pod_ip
from workers.recording import Recording

__all__ = ["RouterError", "RouterInputError", "RouterStateError", "Tracker"]


class RouterError(Exception):
    """Base class of the router's own errors."""


class RouterInputError(RouterError, ValueError):
    """An argument of a router call is malformed (indices, call numbers, settings)."""


class RouterStateError(RouterError):
    """The router cannot be used here: closed, or inherited by a forked child."""


def _key_text(key: Any) -> str:
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key).decode("utf-8", "backslashreplace")
    if isinstance(key, np.generic):
        key = key.item()
        if isinstance(key, bytes):
            return key.decode("utf-8", "backslashreplace")
    return str(key)


class Tracker:
    """Records one fan-out (from :meth:`workers.Router.track`); use it as a context manager.

    An exception inside the block still records the end (the calls are not marked
    failed by it).

    Attributes
    ----------
    idx : numpy.ndarray
        Endpoint index per call (a private copy), ``-1`` for fallback calls.
    table : shm.Table
        The table the indices belong to.
    keys : Sequence or None
        The product IDs, one per call (for the failure log line).
    attempt : int
        The attempt these calls are.
    """

    __slots__ = (
        "_bound",
        "_calls",
        "_ends",
        "_entered",
        "_exited",
        "_failed",
        "_rec",
        "_slots",
        "_start",
        "_started",
        "attempt",
        "idx",
        "keys",
        "table",
    )

    def __init__(
        self,
        recording: Recording,
        idx: np.ndarray,
        table: shm.Table,
        keys: Sequence[Any] | None,
        attempt: int,
        slots: np.ndarray,
        calls: np.ndarray | None,
        bound: int,
    ) -> None:
        self._rec = recording
        # A private copy: the caller may reuse its array while the calls are open, and
        # fail(i) must still name the endpoint call i went to.
        self.idx = idx.copy()
        self.table = table
        self.keys = keys
        self.attempt = attempt
        self._slots = slots  # counter slot per routed call (int64); empty: none recorded
        self._bound = bound  # every slot is below it
        self._calls = calls  # positions of the routed calls in idx (None: all of them)
        self._started: Any = None
        self._start = 0
        self._ends: np.ndarray | None = None
        self._failed: np.ndarray | None = None
        self._entered = self._exited = False

    def __enter__(self) -> Tracker:
        if self._entered:
            raise RouterStateError("a tracker records one fan-out; call router.track() again")
        self._entered = True
        rec = self._rec
        if not rec.ok:
            rec.check()
        self._start = start = rec.clock()
        if self._slots.size:
            self._started = rec.start(self._slots, start, self._bound)
        return self

    def _position(self, i: Any) -> int | None:
        """Index of call ``i`` among the routed calls (``None``: a fallback call)."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise RouterInputError(f"call number must be an integer, got {i!r}")
        n = self.idx.size
        if not -n <= i < n:
            raise RouterInputError(f"call {i} does not exist in a fan-out of {n} calls")
        i = int(i) % n
        if self.idx[i] < 0:
            return None
        if self._calls is None:
            return i
        return int(np.searchsorted(self._calls, i))

    def _check_open(self) -> None:
        if not self._entered or self._exited:
            raise RouterStateError("the tracker is not recording (use it inside its with block)")

    def done(self, i: int) -> None:
        """Call ``i`` ended now (its busy time stops here instead of at the exit)."""
        self._check_open()
        j = self._position(i)
        if j is None:
            return
        if self._ends is None:
            self._ends = np.full(self._n_routed(), -1, dtype=np.int64)
        self._ends[j] = self._rec.clock()

    def _n_routed(self) -> int:
        return self.idx.size if self._calls is None else self._calls.size

    def fail(self, i: int) -> None:
        """Call ``i`` failed: counted as a failure of its endpoint, logged once.

        A fallback call (``-1``) is neither counted nor logged: it went through the
        ingress, not to one of our endpoints.
        """
        self._check_open()
        j = self._position(i)
        if j is None:
            return
        if self._failed is None:
            self._failed = np.zeros(self._n_routed(), dtype=np.bool_)
        if self._failed[j]:
            return
        self._failed[j] = True
        i = int(i) % self.idx.size
        t = self.table
        e = int(self.idx[i])
        ep = t.endpoints[e]
        self._rec.failed(
            {
                "event": "cslb_call_failed",
                "product_id": None if self.keys is None else _key_text(self.keys[i]),
                "endpoint": ep,
                "pod_ip": pod_ip(ep),
                "node": t.nodes[e],
                "zone": t.zones[e],
                "attempt": self.attempt,
                "generation": t.generation,
                "call": i,
                "pid": os.getpid(),
            }
        )

    def __exit__(self, *exc: object) -> None:
        if self._exited:
            return
        self._exited = True
        started = self._started
        if started is None:
            return
        end = self._rec.clock()
        if self._ends is None:
            durations: Any = max(end - self._start, 0)  # every call: one int
        else:
            ends = np.where(self._ends < 0, end, self._ends)
            durations = np.maximum(ends - self._start, 0)
        self._rec.end(started, self._slots, self._start, durations, end, self._failed)
