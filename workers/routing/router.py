"""The Router: what user code in a worker process calls to route and to record load.

One :class:`Router` per worker process (:meth:`Router.attach`). It maps the host's
routing tables, claims a row of the host's counter matrix and answers, for a batch of
product IDs, which endpoint serves each of them::

    router = Router.attach()
    idx = router.route(product_ids)
    urls = router.endpoints_of(idx)
    with router.track(idx) as t:
        ...                      # the fan-out; t.fail(i) marks call i failed

A batch is one kernel call on the current plan (:mod:`workers.routing.snapshot`: one immutable
:class:`lbcore.Plan` per table generation and load snapshot, built off the hot path's
way): hashing, ring positions, the fade ring, the rollout gate, bounded load on the
host-wide loads, ejected endpoints and ``attempt`` for the single fast retry, with the
fallback and bounded-load move counts. The plan checks after the batch that the table
was not rewritten meanwhile; a batch computed on a table the writer began to rewrite
is routed again on the new one. Decision statistics count only valid batches:
*decisions* = keys routed (fallbacks included, and retries: a key routed with
``attempt=0`` and again with ``attempt=1`` is two, as in ``cslb_decisions_total``),
*fallbacks* = keys answered ``-1``, *moves* = keys bounded load sent elsewhere than the
plain ring (ejected endpoints left out) would have.

Indices are only meaningful with the table generation they were computed on. The
router remembers, per thread, the array its last :meth:`Router.route` /
:meth:`Router.route_table` call returned, with that call's table and keys:
:meth:`Router.endpoints_of` and :meth:`Router.track` given that very array (or a slice
of it, for the table) use them even if a new generation was published in between.
Pass ``table`` (from :meth:`Router.route_table`) and ``keys`` explicitly when the
indices went through another array (a copy, a fancy-indexed subset) or another thread.

:meth:`Router.track` records a whole fan-out with one start and one end on the
worker's row (:mod:`workers.routing.tracker`); fallback entries (``-1``) are not recorded.

Lifecycle: :meth:`Router.attach` adopts the counter row the gunicorn master reserved
for this worker (``CSLB_COUNTER_ROW``), else claims any free row. About once a second
it checks whether the counters were replaced (the master restarted them) and then
attaches the new ones and claims a new row; missing tables or counters (discovery not
started yet) are retried at the same pace, and meanwhile every key is fallback. A
forked child never uses its parent's router: :meth:`Router.current` is ``None`` there
and the parent's router raises :class:`RouterStateError`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

import lbcore
import shm
from lbcore.fade import SKIPPER_SALT
from lbcore.knobs import Knob, parse_seconds
from workers.fanout.failurelog import FailureLog
from workers.fanout.ledger import CallLedger
from workers.fanout.reports import ReportBook, report_settings
from workers.fanout.settings import FAILURE_LOG_RATE, FALLBACK_URL
from workers.routing.errors import RouterError, RouterInputError, RouterStateError
from workers.routing.notice import NoTableNotice
from workers.routing.recording import Recording
from workers.routing.rows import COUNTER_ROW_ENV, CounterRow, WarnOnce, row_from_env
from workers.routing.snapshot import RETRY_S, Follower, Snapshot, empty_table
from workers.routing.tracker import Tracker, check_indices, table_slots

__all__ = [
    "COUNTER_ROW_ENV",
    "LOAD_REFRESH",
    "ROUTER_KNOBS",
    "SKIPPER_SALT",
    "Router",
    "RouterError",
    "RouterInputError",
    "RouterStateError",
    "Tracker",
]

log = logging.getLogger("cslb.router")

#: How often the worker re-reads the host's loads (seconds).
LOAD_REFRESH = Knob(
    "load_refresh_s",
    "CSLB_LOAD_REFRESH",
    "--load-refresh",
    0.1,
    parse_seconds,
    "Seconds between two reads of the host's load counters by a worker; bounded load "
    "decides on a snapshot at most this old (a new table generation is read at once). "
    "0 reads them for every batch.",
    "SECONDS",
)

#: The router's own process settings (declared like the routing knobs).
ROUTER_KNOBS: tuple[Knob, ...] = (LOAD_REFRESH,)

_CHECK_NS = 1_000_000_000  # pace of the replaced()/missing-segment checks


_ROUTERS: weakref.WeakSet[Router] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    Router._current = None
    Router._attach_lock = threading.Lock()  # another thread may have held it at the fork
    for r in list(_ROUTERS):
        r._forked = True
        r.recording.ok = False


os.register_at_fork(after_in_child=_after_fork_in_child)


class Router:
    """Routes batches of product IDs and records the load of the calls made to them.

    Use :meth:`attach` (one router per process); the constructor is for tests and
    tools that need several routers in one process.

    Parameters
    ----------
    namespace
        Shared-memory namespace of the host's tables and counters.
    threads
        ``True`` (or ``None``): the process's threads share the counter row through a
        :class:`shm.LockedRecorder` (safe under gthread); ``False``: one thread records
        (no lock).
    row
        Counter row reserved for this process by its parent (the gunicorn master);
        ``None``: claim any free row.
    refresh_s
        Load snapshot cadence in seconds (:data:`LOAD_REFRESH`).
    clock
        CLOCK_MONOTONIC source in nanoseconds (fade-in time, load snapshots, call
        durations); injectable for tests.
    background
        Where a new table generation is mapped: ``None`` (default) in a background
        thread unless it is small (up to 2 MiB), ``True`` always there, ``False`` by
        the batch that first sees it (which then waits for it).
    fanout_settings
        The fan-out helper's settings (:class:`workers.fanout.settings.FanoutSettings`);
        default: from the ``CSLB_FANOUT_*`` environment, when :meth:`fanout` is first
        used.

    Attributes
    ----------
    namespace : str
        The namespace.
    recording : workers.routing.recording.Recording
        The handle through which this router's fan-outs and decisions are recorded.
    """

    _current: ClassVar[Router | None] = None
    _attach_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        namespace: str,
        *,
        threads: bool | None = None,
        row: int | None = None,
        refresh_s: float | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        background: bool | None = None,
        fanout_settings: Any = None,
    ) -> None:
        self.namespace = shm.check_namespace(namespace)
        if background is not None and not isinstance(background, bool):
            raise RouterInputError(f"background must be True, False or None, got {background!r}")
        if refresh_s is None:
            refresh_s = LOAD_REFRESH.convert(
                os.environ.get(LOAD_REFRESH.env, str(LOAD_REFRESH.default)), "environment"
            )
        elif isinstance(refresh_s, bool) or not isinstance(refresh_s, (int, float)):
            raise RouterInputError(f"refresh_s must be seconds >= 0, got {refresh_s!r}")
        if not (refresh_s >= 0 and math.isfinite(refresh_s)):
            raise RouterInputError(f"refresh_s must be seconds >= 0, got {refresh_s!r}")
        if row is not None and (isinstance(row, bool) or not isinstance(row, int) or row < 0):
            raise RouterInputError(f"row must be a counter row number >= 0, got {row!r}")
        self.refresh_ns = int(refresh_s * 1e9)
        self.threads = threads is not False
        self._clock = clock
        self._pid = os.getpid()
        self._forked = False
        self._closed = False
        self._lock = threading.Lock()  # (re)attaching
        self._failure_log = FailureLog(
            log,
            FAILURE_LOG_RATE.convert(
                os.environ.get(FAILURE_LOG_RATE.env, str(FAILURE_LOG_RATE.default)), "environment"
            ),
            clock,
        )
        self.recording = Recording(clock, failure_log=self._failure_log, check=self._check_usable)
        self._kernel_totals = self.recording.kernel_totals
        self._ledger: CallLedger | None = None
        self._fanout: Any = None  # workers.fanout.threads.FanOut, made on first use
        self._fanout_settings = fanout_settings
        self._fanout_lock = threading.RLock()  # (FanOut() asks for the ledger under it)
        self._warn_once = WarnOnce()
        self._no_table = NoTableNotice(self.namespace, clock, self._fallback_to)
        self._follow = Follower(
            self.namespace, self.refresh_ns, clock, background, self._warn_once, self._tick
        )
        self._rows = CounterRow(
            self.namespace,
            threads=self.threads,
            row=row,
            recording=self.recording,
            follow=self._follow,
            warn_once=self._warn_once,
            check_s=_CHECK_NS / 1e9,
        )
        # Per thread, the last (indices, table, keys) route_table() returned: mapping or
        # tracking that very array later uses its table and keys (see endpoints_of).
        self._last = threading.local()
        self._next_check = 0
        self._connect(clock())
        _ROUTERS.add(self)

    # -- attaching ----------------------------------------------------------------------

    @classmethod
    def attach(
        cls,
        namespace: str | None = None,
        *,
        threads: bool | None = None,
        row: int | None = None,
        refresh_s: float | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> Router:
        """The process's router, attached on first use.

        Parameters
        ----------
        namespace
            ``None``: ``CSLB_SHM_NAMESPACE`` (default ``"default"``).
        threads, refresh_s, clock
            See :class:`Router`.
        row
            ``None``: ``CSLB_COUNTER_ROW`` if set (the row the gunicorn master reserved
            for this worker), else any free row.

        Raises
        ------
        RouterStateError
            This process already attached a router to another namespace.
        RouterInputError
            ``CSLB_COUNTER_ROW`` is malformed.
        lbcore.knobs.KnobError
            A setting the router or its fan-out reads (``CSLB_LOAD_REFRESH``,
            ``CSLB_FANOUT_*``, ``CSLB_SHM_NAMESPACE``...) is unusable: the message names
            the variable and what it accepts. Raised here, on the first attach, rather
            than on the first fan-out; a library does not end its host process, so the
            caller decides (under cslb's gunicorn config module the master has checked
            them already and exited with status 2).
        """
        with cls._attach_lock:
            cur = cls.current()
            if cur is None:
                from workers.settings_check import ROUTER_GROUPS, check_environment

                check_environment(os.environ, ROUTER_GROUPS)
            ns = shm.shm_namespace(os.environ) if namespace is None else namespace
            if cur is not None:
                if cur.namespace != ns:
                    raise RouterStateError(
                        f"this process's router is attached to namespace {cur.namespace!r}; "
                        f"close it before attaching to {ns!r}"
                    )
                return cur
            if row is None:
                row = row_from_env()
            router = cls(ns, threads=threads, row=row, refresh_s=refresh_s, clock=clock)
            cls._current = router
            return router

    def _fallback_to(self) -> str:
        """Where :meth:`fanout` sends fallback keys (``""``: back to the caller)."""
        fan = self._fanout
        settings = fan.settings if fan is not None else self._fanout_settings
        if settings is not None:
            return str(settings.fallback_url)
        try:
            return str(FALLBACK_URL.convert(os.environ.get(FALLBACK_URL.env, ""), "environment"))
        except ValueError:
            return ""

    def _why_no_table(self) -> str:
        """Why there is no table to route on, for the no-table warning."""
        f = self._follow
        if f.problem:
            return f.problem
        if f.reader is None:
            return "no tables segment in this namespace: no discovery process has started here"
        return "nothing published yet (a discovery process is starting, or stopped early)"

    @classmethod
    def current(cls) -> Router | None:
        """The router :meth:`attach` returned in this process, or ``None``."""
        cur = cls._current
        if cur is None or cur._pid != os.getpid() or cur._closed:
            return None
        return cur

    def _tick(self, now: int) -> None:
        """The follower's slow path: attach what is missing or replaced, once a second."""
        if now >= self._next_check:
            with self._lock:
                if now >= self._next_check and not self._closed:
                    self._connect(now)

    def _connect(self, now: int) -> None:
        """Attach whatever is missing or replaced (under ``self._lock`` or in __init__)."""
        self._next_check = now + _CHECK_NS
        self._follow.connect()
        self._rows.connect()

    @property
    def row(self) -> int | None:
        """The counter row this process records into (``None`` without counters)."""
        return self._rows.row

    @property
    def adopted(self) -> bool:
        """Whether that row was the one reserved for this process."""
        return self._rows.adopted

    @property
    def reattached(self) -> int:
        """How many times the router re-attached replaced counters."""
        return self._rows.reattached

    def _check_usable(self) -> None:
        if self._forked or self._pid != os.getpid():
            raise RouterStateError(
                f"this router was attached in process {self._pid}; a forked child must "
                "call Router.attach() itself"
            )
        if self._closed:
            raise RouterStateError(f"router of namespace {self.namespace!r} is closed")

    # -- what it routes on --------------------------------------------------------------

    def snapshot(self) -> Snapshot | None:
        """The snapshot batches route on now (refreshed when due; ``None``: no table yet).

        Raises
        ------
        RouterStateError
            Closed, or a forked child's inherited router.
        """
        self._check_usable()
        return self._follow.current()

    def routing_problem(self) -> str | None:
        """Why this worker cannot route on the published table now (``None``: it can).

        Set when the current generation cannot be read (corrupt, shrunk, unreadable) and
        cleared by the first batch that routes on it; the verdict is checked again about
        once a second, never kept for good.
        """
        return self._follow.problem

    def refresh(self) -> None:
        """Read the host's loads at the next batch instead of when the cadence says."""
        self._follow.drop()

    def table(self) -> shm.Table:
        """The current table generation (an empty generation-0 table before any).

        Raises
        ------
        RouterStateError
            Closed, or a forked child's inherited router.
        """
        s = self.snapshot()
        return s.table if s is not None else empty_table()

    def loads(self) -> shm.HostLoads:
        """The cached host-wide load snapshot, per endpoint of :meth:`table`."""
        s = self.snapshot()
        return s.loads if s is not None else shm.HostLoads.idle(0, self._clock())

    @property
    def tables(self) -> shm.TableReader | None:
        """The tables reader (``None`` until the tables exist)."""
        return self._follow.reader

    @property
    def counters(self) -> shm.CounterReader | None:
        """The host's counters reader that loads are read from (``None`` until they exist)."""
        return self._follow.counters

    @property
    def recorder(self) -> shm.Recorder | shm.LockedRecorder | None:
        """The recorder of the process's counter row (``None`` without counters)."""
        return self._rows.recorder

    # -- routing ------------------------------------------------------------------------

    def route(self, keys: Any, *, attempt: int = 0) -> np.ndarray:
        """Endpoint index per key (``int32``; ``-1``: fallback through the ingress).

        Parameters
        ----------
        keys
            A batch of product IDs: ``str``, ``bytes`` or integers (see
            :func:`lbcore.hash_keys`), each at most 4,096 bytes.
        attempt
            ``0`` for the first choice; ``1`` for the single fast retry: the next
            distinct eligible endpoint, never the one of attempt 0.

        Raises
        ------
        lbcore.KeyTypeError, lbcore.KeyTooLongError, lbcore.KeyEncodingError
            Bad keys (nothing is counted then).
        lbcore.ArgumentError
            ``attempt`` is not a non-negative integer.
        """
        return self.route_table(keys, attempt=attempt)[0]

    def route_table(self, keys: Any, *, attempt: int = 0) -> tuple[np.ndarray, shm.Table]:
        """:meth:`route` plus the exact table generation the answer was computed on.

        Map the indices with that table (:meth:`endpoints_of`, :meth:`track`), never
        with a later one: a new generation may order its endpoints differently.
        """
        if self._forked or self._closed:  # (the at-fork hook sets _forked in a child)
            self._check_usable()
        s = self._follow.current()
        missing = s is None
        if s is None:
            s = _no_table()
        elif self._no_table.since:  # (the active property without its frame, per batch)
            self._no_table.table()
        row = self.recording.row
        try:
            # The decision counts go to the row in the kernel's call (counted), else below.
            idx, fallbacks, moves, valid, counted = s.route_counted(
                keys, attempt, None if row is None else row[1].count_sink, self._kernel_totals
            )
        except lbcore.TableDataError as exc:
            if s.table.valid():
                # Damaged after it was mapped and checked (any process of the user can
                # write the segment): fall back on it, say so once, check it again later.
                self._follow.damaged(s.table, exc)
                s = _no_table()
                idx, fallbacks, moves, valid = s.route(keys, attempt)
                counted = False
            else:
                valid = False
        except lbcore.MappingFaultError:
            valid = False  # a segment shrank under the batch: the next check asks them
        except Exception:
            # Content rewritten under our feet can fail in any way; on a table that is
            # still valid the error is real.
            if s.table.valid():
                raise
            valid = False
        if not valid:
            counted = False
            idx, fallbacks, moves, s = self._reroute(keys, attempt)
        n = idx.size
        if n:
            if not counted:
                self.recording.count(n, fallbacks, moves)
            if missing:
                self._no_table.no_table(n, self._why_no_table())
        t = s.table
        self._last.routed = (idx, t, keys)
        return idx, t

    def _reroute(self, keys: Any, attempt: int) -> tuple[np.ndarray, int, int, Snapshot]:
        """Route again: the writer rewrote the table's buffer while a batch routed on it.

        The next :meth:`shm.TableReader.table` call maps the generation it published.
        """
        deadline = time.monotonic() + RETRY_S
        while time.monotonic() <= deadline:
            s = self._follow.current() or _no_table()
            try:
                idx, fallbacks, moves, valid = s.route(keys, attempt)
            except lbcore.MappingFaultError:
                continue
            except Exception:
                if s.table.valid():
                    raise
            else:
                if valid:
                    return idx, fallbacks, moves, s
        log.warning("no stable table in %s for %g s; fallback", self.namespace, RETRY_S)
        s = _no_table()
        idx, fallbacks, moves, _ = s.route(keys, attempt)
        return idx, fallbacks, moves, s

    def stats(self) -> dict[str, int]:
        """Totals of this process since attaching.

        Keys ``decisions``, ``fallbacks``, ``moves`` and ``failures``; the host-wide
        totals are in the shared counters (:meth:`shm.CounterReader.stats`).
        """
        return self.recording.stats()

    # -- mapping indices ----------------------------------------------------------------

    def _routed_on(self, idx: Any) -> tuple[np.ndarray, shm.Table, Any] | None:
        """Last ``(indices, table, keys)`` routed by this thread, if ``idx`` is (a view of) it."""
        last = getattr(self._last, "routed", None)
        if last is None or idx.__class__ is not np.ndarray:
            return None
        if idx is last[0] or idx.base is last[0]:
            return last
        return None

    def endpoints_of(self, idx: Any, table: shm.Table | None = None) -> list[str | None]:
        """Endpoint address per index (``None`` for fallback).

        Parameters
        ----------
        idx
            Indices from :meth:`route` / :meth:`route_table`.
        table
            The table they were computed on (from :meth:`route_table`). Default: if
            ``idx`` is the very array this thread's last :meth:`route` /
            :meth:`route_table` call returned (or a slice of it), that call's table;
            otherwise the current one, which is only right if no generation was
            published since.

        Raises
        ------
        RouterInputError
            Indices that are not integers in ``-1 .. len(endpoints) - 1``.
        """
        if table is None:
            last = self._routed_on(idx)
            t = self.table() if last is None else last[1]
        else:
            t = table
        arr = check_indices(idx, len(t.endpoints))
        eps = t.endpoints
        return [eps[i] if i >= 0 else None for i in arr.tolist()]

    def call_slots(self, idx: np.ndarray, table: shm.Table) -> np.ndarray | None:
        """Counter slot per index of ``idx`` routed on ``table`` (``-1`` entries: 0).

        ``None`` when ``table``'s buffer was reused since (its slots are gone).
        """
        safe = np.maximum(idx, 0)
        s = self._follow.of(table)
        if s is not None:
            slots = s.plan.slots
            return slots.take(safe) if slots.size else np.zeros(idx.size, np.int64)
        if not len(table.endpoints):
            return np.zeros(idx.size, np.int64)
        slots = table.slots.take(safe).astype(np.int64)
        if not table.valid() or (slots.size and int(slots.max()) >= table.n_slots):
            return None
        return slots

    def route_calls(
        self, keys: Any, attempt: int = 0
    ) -> tuple[np.ndarray, shm.Table, np.ndarray | None]:
        """:meth:`route_table` and the routed endpoints' counter slots (:meth:`call_slots`).

        The one question the fan-out asks the router ("route these keys for attempt
        N"): its plan, jobs and drivers need nothing else of it.
        """
        idx, table = self.route_table(keys, attempt=attempt)
        return idx, table, self.call_slots(idx, table)

    # -- recording ----------------------------------------------------------------------

    def track(
        self,
        idx: Any,
        table: shm.Table | None = None,
        keys: Sequence[Any] | None = None,
        *,
        attempt: int = 0,
    ) -> Tracker:
        """Context manager recording one fan-out: in-flight up on enter, busy time on exit.

        Parameters
        ----------
        idx
            Endpoint index per call (from :meth:`route_table`); ``-1`` entries are
            fallback calls and are not recorded.
        table
            The table ``idx`` was computed on. Default: as in :meth:`endpoints_of` (the
            table of this thread's last routing call if ``idx`` is its array or a slice
            of it, else the current one).
        keys
            The product IDs, one per call, for the failure log line. Default: the keys
            of this thread's last routing call if ``idx`` is the very array it returned.
        attempt
            The attempt these calls are (for the failure log line).

        Raises
        ------
        RouterInputError
            Indices that are not integers in ``-1 .. len(endpoints) - 1``, or keys of
            another length.
        """
        if self._forked or self._closed:  # (the at-fork hook sets _forked in a child)
            self._check_usable()
        if attempt.__class__ is not int:
            attempt = int(attempt)
        s = self._follow.snapshot
        if keys is not None:
            keys = self._keys_for(keys, idx)
        if table is None or keys is None:
            last = getattr(self._last, "routed", None)
            if last is not None and idx is last[0]:
                # This thread's last batch as it was returned: its table and keys, and
                # (on the current snapshot) the plan's own indices, checked as they come.
                if table is None:
                    table = last[1]
                if keys is None:
                    keys = last[2]
                if s is not None and s.table is table:
                    # Mapped to counter slots by the kernel on enter and exit (the
                    # indices checked there: the caller may have changed them since).
                    plan = s.plan
                    return Tracker(
                        self.recording,
                        idx,
                        table,
                        keys,
                        attempt,
                        None,
                        None,
                        plan.n_slots,
                        plan.slots,
                        s.slot_view,
                    )
            elif table is None and last is not None and idx.__class__ is np.ndarray:
                if idx.base is last[0]:  # a slice of it: its table
                    table = last[1]
        t = self.table() if table is None else table
        arr = check_indices(idx, len(t.endpoints))
        if s is not None and s.table is t:
            # The plan's private copy of the table's slots, checked when it was built.
            try:
                slots, calls = s.plan.counter_slots(arr)
            except lbcore.ArgumentError as exc:
                raise RouterInputError(str(exc)) from None
            return Tracker(self.recording, arr, t, keys, attempt, slots, calls, s.plan.n_slots)
        slots, calls = table_slots(t, arr)
        return Tracker(self.recording, arr, t, keys, attempt, slots, calls, t.n_slots)

    @staticmethod
    def _keys_for(keys: Sequence[Any], idx: Any) -> Sequence[Any]:
        n = idx.size if idx.__class__ is np.ndarray else len(idx)
        if len(keys) != n:
            raise RouterInputError(f"track got {len(keys)} keys for {n} calls")
        return keys

    # -- the fan-out helper (workers.fanout.threads, workers.fanout.aio) ----------------

    def fanout(
        self,
        keys: Any,
        send: Callable[..., Any],
        *,
        timeout_s: float | None = None,
        deadline_s: float | None = None,
        grouped: bool = False,
    ) -> list[Any]:
        """Route ``keys`` and make their calls (sync and gthread workers).

        With a :class:`workers.fanout.senders.CurlSender` (or its ``group``) every call of the
        batch is in flight at once on this thread's libcurl multi handle
        (:mod:`workers.fanout.curl_driver`); any other ``send(url, key) -> value`` runs on the
        worker's pool. ``send`` raises on failure (``grouped``: ``send(url, keys) ->
        values``, once per pod) and gets ``timeout=`` if it takes it
        (:mod:`workers.fanout.senders`); ``timeout_s`` bounds one call, ``deadline_s`` the
        fan-out (defaults ``CSLB_FANOUT_TIMEOUT``, ``CSLB_FANOUT_DEADLINE``). Returns one
        :class:`workers.fanout.threads.Result` per key, in order; retry, budget, bulkhead,
        fallback and recording: :mod:`workers.fanout.threads`.
        """
        self._check_usable()
        if not self.threads and not _is_curl(send):
            raise RouterStateError(
                "router.fanout runs calls on a thread pool: attach the router with "
                "threads=True (the default)"
            )
        fan = self.fanout_machinery
        return fan.run(fan.prepare(keys, send, timeout_s, deadline_s, grouped))

    async def afanout(
        self,
        keys: Any,
        asend: Callable[..., Any],
        *,
        timeout_s: float | None = None,
        deadline_s: float | None = None,
        grouped: bool = False,
    ) -> list[Any]:
        """:meth:`fanout` for asyncio workers, on the running loop (:mod:`workers.fanout.aio`).

        A :class:`workers.fanout.senders.CurlSender` puts every call in flight at once on the
        loop's libcurl multi handle; another ``asend`` is awaited, at most
        ``CSLB_FANOUT_THREADS`` calls at once. Tasks may interleave on one thread:
        nothing here uses the per-thread last batch.
        """
        self._check_usable()
        from workers.fanout.aio import run

        fan = self.fanout_machinery
        return await run(fan, fan.prepare(keys, asend, timeout_s, deadline_s, grouped))

    @property
    def fanout_machinery(self) -> Any:
        """The :class:`workers.fanout.threads.FanOut` helper of :meth:`fanout`, made on first use.

        Its ``settings``, thread ``pool``, call ``ledger`` and retry ``budget``.
        """
        fan = self._fanout
        if fan is None:
            from workers.fanout.threads import FanOut

            with self._fanout_lock:
                if self._fanout is None:
                    self._fanout = FanOut(self, self._fanout_settings)
                fan = self._fanout
        return fan

    @property
    def call_ledger(self) -> CallLedger:
        """The per-call recording of this router's fan-outs (batched steps)."""
        led = self._ledger
        if led is None:
            with self._fanout_lock:
                if self._ledger is None:
                    rs = report_settings()
                    book = ReportBook(rs) if rs.enabled else None
                    self._ledger = CallLedger(self.recording, book)
                led = self._ledger
        return led

    def close(self) -> None:
        """Give the counter row back and drop the mappings (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.recording.ok = False
        if self._fanout is not None:
            self._fanout.close()
        if self._ledger is not None and not self._forked and self._pid == os.getpid():
            self._ledger.flush()
        if Router._current is self:
            Router._current = None
        if self._forked or self._pid != os.getpid():
            return  # the parent's row and mappings are the parent's to release
        self._rows.close()
        self._follow.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Router(namespace={self.namespace!r}, row={self.row}, pid={self._pid}, "
            f"refresh={self.refresh_ns / 1e9:g}s)"
        )


def _is_curl(send: Any) -> bool:
    """``send`` is a CurlSender (or its group): its calls need no thread pool."""
    from workers.fanout.senders import CurlGroup, CurlSender

    return isinstance(send, (CurlSender, CurlGroup))


_NO_TABLE: list[Snapshot] = []


def _no_table() -> Snapshot:
    """What a batch routes on while there is no table: every key fallback (keys checked)."""
    if not _NO_TABLE:
        t = empty_table()
        plan = lbcore.Plan(t.ring_set, 0)
        _NO_TABLE.append(Snapshot(t, plan, shm.HostLoads.idle(0, 0), 0, 1 << 62))
    s = _NO_TABLE[0]
    if s.plan.kernel != lbcore.kernel_name():  # (tests switch kernels in-process)
        _NO_TABLE.clear()
        return _no_table()
    return s
