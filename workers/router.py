"""The Router: what user code in a worker process calls to route and to record load.

One :class:`Router` per worker process (:meth:`Router.attach`). It maps the host's
routing tables (:class:`shm.TableReader`), claims a row of the host's counter matrix
(:class:`shm.CounterStore`) and answers, for a batch of product IDs, which endpoint
serves each of them::

    router = Router.attach()
    idx = router.route(product_ids)
    urls = router.endpoints_of(idx)
    with router.track(idx) as t:
        ...                      # the fan-out; t.fail(i) marks call i failed

Indices are only meaningful with the table generation they were computed on. The
router remembers, per thread, the array its last :meth:`Router.route` /
:meth:`Router.route_table` call returned, with that call's table and keys:
:meth:`Router.endpoints_of` and :meth:`Router.track` given that very array (or a slice
of it, for the table) use them even if a new generation was published in between.
Pass ``table`` (from :meth:`Router.route_table`) and ``keys`` explicitly when the
indices went through another array (a copy, a fancy-indexed subset) or another thread.
(So each thread's last batch of keys stays referenced until its next routing call.)

Routing a batch
---------------
:meth:`Router.route` applies, in one pass: the rollout gate of the table's knobs;
N-ring fade-in (or Skipper's fade-in when ``fade_mode`` is ``skipper``); bounded load
on the host-wide load vector the knobs' ``load_signal`` names (its bar counting the
call being routed as what it adds to that signal, :meth:`shm.HostLoads.bar_increment`:
one request for in-flight and effective load, Skipper's 1.0; for occupancy the host's
mean call latency as a share of the occupancy window, so the bar is about
``balance_factor`` times the mean, not ``balance_factor × (1 + 1 / Σ occupancy)``
times it); ejected endpoints (never chosen); and ``attempt`` for the single fast
retry. Every rule is lbcore's: the router only composes
:meth:`lbcore.RingSet.answer_table`, :meth:`lbcore.RingSet.route`,
:func:`lbcore.fade.skipper_fadein_route` and :func:`lbcore.bounded.in_call_units`.

The load snapshot
-----------------
Summing every worker's counter row costs more than routing a batch, so the router
reads the host's loads on a cadence (:data:`LOAD_REFRESH`, ``CSLB_LOAD_REFRESH``,
default 0.1 s) and immediately when a new table generation appears. On a snapshot it
routes by *answer tables*: per ring and per position of the newest ring, the
bounded-load answer with ejected endpoints left out (:meth:`lbcore.RingSet.answer_table`),
plus a boolean table "this answer differs from the plain ring's", so counting
bounded-load moves costs one more gather. A batch then costs: hashing, one
bucket-table position lookup, the fade draw (while a ring is fading) and one gather.

Building the tables walks every ring position (about 0.7 ms for 100 endpoints x 100
virtual nodes with one fading ring, 4 ms for 1,000), so the router builds them only
when that pays, and keeps them as long as they are right:

* a refresh whose loads change no bar decision (:meth:`lbcore.RingSet.answer_fingerprint`:
  which endpoints are under the bar, and with a hop cap the order of the busy ones'
  loads) keeps the tables: on a host whose load is steady they are built once per
  table generation;
* otherwise they are built on the first batch when walking the keys expected on the
  snapshot (the worker's key rate over the refresh interval, or more if more keys
  were routed on answers equal to this snapshot's) would cost more than the build,
  by the worker's own timings of its walks and builds; until then, and for retries,
  keys are walked by :meth:`lbcore.RingSet.route`.

``perf/bench_router.py`` measures the cost per batch at 100 to 2,500 batches per
second against a never-refreshed snapshot, and the staleness.

Following new tables
--------------------
Work proportional to the table never runs on the routing thread for a large table:
a worker serving requests must not stall while discovery publishes (``perf/control.py``
measures the longest gap between a worker's batches during publishes).

* A new generation is mapped (checksum, validation: ~0.35 ms per MiB, ~50 ms for
  20,000 endpoints with a fading ring) by :class:`shm.TableReader` in a background
  thread; batches keep routing on the previous generation, which stays valid until the
  writer has published twice more, and the first batch after the thread finished
  routes on the new one. Tables up to 2 MiB (a few dozen endpoints) are mapped by the
  batch that first sees them, so the worker follows them at once. A worker that routes
  nothing for a while still follows: the map thread looks for a new generation every
  50 ms while idle and maps it ahead, so its next request neither maps nor waits (had
  the writer published twice meanwhile, the table it routed on last would be gone).
* Answer tables whose build this worker measured to take over 1 ms are built in a
  background thread (one at a time). Meanwhile a batch on a new load snapshot routes
  on the previous snapshot's answer tables of the same generation (bounded load then
  decides on loads one refresh older, for the few milliseconds of the build), and on a
  new generation walks its keys (:meth:`lbcore.RingSet.route`), as before a build pays.

Each kind of work has one long-lived daemon thread (:class:`shm.BackgroundWorker`,
``cslb-table-map`` and ``cslb-answer-build``), started when the router attaches: handing
it a job is a queue put, where starting a thread would make the batch wait until the
new thread got a core. A forked child never sees its parent's threads (it attaches its
own router, see Lifecycle). In a sync worker they run while the worker waits for the
network; in a gthread worker they are two more threads. They hand the GIL over at each
NumPy call that releases it, so a batch waits at most for one of their calls that holds
it (a few milliseconds at 20,000 endpoints: decoding the address list, a ring's
``bincount``, a step of the bounded-load walk). ``Router(background=False)`` maps and
builds on the routing thread and starts no thread.

Checks per batch are constant-cost: :meth:`shm.TableReader.table` (two shared-memory
loads and a clock read), one identity comparison with the snapshot's table, and
:meth:`shm.Table.valid` after routing (a result computed on a table the writer began
to rewrite is computed again on the new one).

Recording
---------
:meth:`Router.track` records a whole fan-out with one ``record_start`` and one
``record_end`` call on the worker's row (through :class:`shm.LockedRecorder`, so the
threads of a gthread worker share it safely). Fallback entries (``-1``) are not
recorded: those calls go through the ingress. Per routed batch the router adds the
decision statistics to its row (``Recorder.count``): *decisions* = keys routed
(fallbacks included, and retries: a key routed with ``attempt=0`` and again with
``attempt=1`` is two decisions; so is ``cslb_decisions_total``), *fallbacks* = keys
answered ``-1``, *moves* = keys that bounded load sent elsewhere than the plain ring
(with ejected endpoints left out) would have.

Failures
--------
:meth:`Tracker.fail` logs one line (rate-limited per endpoint, :mod:`workers.failurelog`)
on the ``cslb.router`` logger at WARNING: a JSON
object (ASCII, so always a single line) with ``event`` = ``"cslb_call_failed"``,
``product_id``, ``endpoint``, ``pod_ip`` (the endpoint's host), ``node``, ``zone``,
``attempt``, ``generation``, ``call`` (position in the fan-out) and ``pid``. The same
fields are attached to the log record as ``record.cslb`` for structured handlers.

Lifecycle
---------
:meth:`Router.attach` adopts the counter row the gunicorn master reserved for this
worker (``CSLB_COUNTER_ROW``), else claims any free row. About once a second it checks
whether the counters were replaced (the master restarted them) and then attaches the
new ones and claims a new row; missing tables or counters (discovery not started yet)
are retried at the same pace, and meanwhile every key is fallback. A forked child
never uses its parent's router: :meth:`Router.current` is ``None`` there and the
parent's router raises :class:`RouterStateError`.
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
from lbcore.bounded import in_call_units
from lbcore.fade import fadein_scores, skipper_fadein_route
from lbcore.hashing import unit_interval
from lbcore.knobs import Knob, parse_seconds
from workers.failurelog import FailureLog
from workers.failurelog import pod_ip as _pod_ip
from workers.fanout_settings import FAILURE_LOG_RATE
from workers.ledger import CallLedger

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

#: Environment variable through which the gunicorn master hands a worker its reserved row.
COUNTER_ROW_ENV = "CSLB_COUNTER_ROW"

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

#: Salt of the per-key draw that stands in for Skipper's per-request random threshold
#: in ``fade_mode=skipper`` (independent of the N-ring and gate draws).
SKIPPER_SALT = 0x736B697070657221

_CHECK_NS = 1_000_000_000  # pace of the replaced()/missing-segment checks
_RETRY_S = 1.0  # how long route() retries on tables the writer keeps rewriting
# How long TableReader.table() retries one read. A reader waits only while the writer
# switches buffers (microseconds); a buffer that never settles is damage, and a worker
# must not stall its request on it (shm remembers the verdict after the first wait).
_READ_TIMEOUT_S = 0.05
_MAX_KEY_BYTES = lbcore.MAX_KEY_BYTES
# Work a new table generation or load snapshot brings is done on the routing thread
# only when it is small; larger work runs in a background thread while the worker
# keeps routing (see "Following new tables" in the module docs). Mapping a table costs
# ~0.35 ms per MiB (checksum, validation; 2-vCPU Zen3 VM): up to 2 MiB (tables of a
# few dozen endpoints) it is mapped at once.
_INLINE_MAP_BYTES = 2 << 20
# Answer tables are built at once when this worker's measured build cost per entry
# says it takes at most this long (ns): ~100 endpoints x 100 virtual nodes.
_INLINE_BUILD_NS = 1_000_000


class RouterError(Exception):
    """Base class of the router's own errors."""


class RouterInputError(RouterError, ValueError):
    """An argument of a router call is malformed (indices, call numbers, settings)."""


class RouterStateError(RouterError):
    """The router cannot be used here: closed, or inherited by a forked child."""


# ------------------------------------------------------------------------------------
# The load snapshot and what is precomputed from it.


class _Snapshot:
    """One table generation with one host-load snapshot, and the answer tables built on it.

    Immutable once built, except for the lazily built answer tables (two threads may
    both build them; both results are equal, the last one stays) and the key count.
    """

    __slots__ = (
        "_answer",
        "_fingerprint",
        "_plain",
        "balance_factor",
        "build_failed",
        "candidates",
        "carried",
        "due_ns",
        "expected",
        "gate",
        "gate_all",
        "last_ring",
        "load",
        "loads",
        "max_hops",
        "mode",
        "read_ns",
        "routed",
        "slots",
        "slots_ext",
        "stale",
        "table",
    )

    def __init__(
        self,
        table: shm.Table,
        slots: np.ndarray,
        loads: shm.HostLoads,
        read_ns: int,
        due_ns: int,
    ) -> None:
        knobs = table.knobs
        self.table = table
        self.slots = slots
        # Counter slot of index i at i + 1, a placeholder for fallback (-1) at 0: track()
        # maps a fan-out with one bounds-checked take (see _fast_slots).
        self.slots_ext = np.concatenate((_SLOT_PLACEHOLDER, slots))
        self.loads = loads
        self.read_ns = read_ns
        self.due_ns = due_ns
        self.mode = knobs.fade_mode
        self.gate = knobs.gate()
        rings = table.ring_set.rings
        # Per batch: -1 routes every key to fallback (gate closed, no ring); else the
        # newest ring's index. And whether the gate lets every key through.
        gate = self.gate
        self.last_ring = len(rings) - 1 if gate.enabled and gate.percentage > 0.0 else -1
        self.gate_all = gate.passes_all
        self.balance_factor = knobs.balance_factor
        self.max_hops = knobs.max_hops
        # In routed-call units: bounded load's 1.0 becomes what a call adds to the signal
        # (for occupancy its latency's share of the window, not one busy second per
        # second); in-flight and effective pass through as the very same array.
        sig = knobs.load_signal
        self.load = (
            in_call_units(loads.signal(sig), loads.bar_increment(sig))
            if loads.in_flight.size
            else None
        )
        ej = table.ejected
        # Ejected endpoints are left out as candidates (lbcore's skip rule), never by
        # inflating their load: that would raise the average and so the bar for all.
        self.candidates = ~ej if ej.size and bool(ej.any()) else None
        # (answer, moved or None, complete): see answer().
        self._answer: tuple[np.ndarray, np.ndarray | None, bool] | None = None
        self._plain: np.ndarray | None = None
        self._fingerprint: bytes | None = None
        # The answer tables of an earlier snapshot of the same table, routed on while
        # this one's are built in the background (see Router._answers).
        self.stale: tuple[np.ndarray, np.ndarray | None, bool] | None = None
        self.build_failed = False  # a background build raised on a valid table: walk
        self.routed = 0  # keys routed on this snapshot and those it follows with equal answers
        self.carried = 0  # of which on those before it
        self.expected = 0  # keys expected on this snapshot (the worker's recent rate)
        if self.balance_factor is None and self.candidates is None:
            self._answer = (table.ring_set.owner_table, None, True)  # nothing to build

    def amortized(self, n: int, costs: _Costs) -> bool:
        """Count ``n`` keys routed on this snapshot; true when routing on the answer tables.

        Tables kept from the previous snapshot (:meth:`follow`) are used at once.
        Otherwise they are built as soon as walking the keys still expected on them
        would cost more than building them, by this worker's own measurements
        (:class:`_Costs`). Keys expected: those the worker routed per refresh interval
        on the previous snapshot (:attr:`expected`), or more if more were already
        routed on answers equal to this snapshot's (they will likely stay equal as
        long again); until the first measurement, lbcore's rule
        (:meth:`lbcore.RingSet.amortized`).
        """
        self.routed += n  # racy under threads: at worst a count is lost
        if self._answer is not None:
            return True
        size = self.table.ring_set.owner_table.size
        ahead = max(self.expected, self.routed - self.carried) + self.carried
        return costs.pays(ahead, size) if costs.measured else self.table.ring_set.amortized(ahead)

    def fingerprint(self) -> bytes:
        """What the answer tables read of this snapshot's loads (lbcore's rule)."""
        fp = self._fingerprint
        if fp is None:
            if self.balance_factor is None or self.load is None:
                fp = b""
            else:
                fp = self.table.ring_set.answer_fingerprint(
                    self.load,
                    self.balance_factor,
                    candidates=self.candidates,
                    max_hops=self.max_hops,
                )
            self._fingerprint = fp
        return fp

    def follow(self, previous: _Snapshot | None, refresh_ns: int) -> None:
        """Carry over from the snapshot this one replaces: tables and the key rate.

        The answer tables stay if the new loads change no bar decision on the same
        table (:meth:`lbcore.RingSet.answer_fingerprint`); the plain table (candidates
        without bounded load) depends on no load at all. And the rate of keys routed
        on ``previous`` decides whether to build the tables on the first batch.
        """
        if previous is None:
            return
        life = self.read_ns - previous.read_ns
        if life > 0:
            keys = previous.routed - previous.carried
            self.expected = int(keys * max(refresh_ns, life) / life)
        if previous.table is not self.table or self._answer is not None:
            return
        self._plain = previous._plain
        self.stale = previous._answer or previous.stale
        same = (
            self.load is not None
            and previous.load is not None
            and np.array_equal(self.load, previous.load)  # an idle host: no fingerprint
        )
        if same or previous.fingerprint() == self.fingerprint():
            # The same answers: tables built on previous serve this snapshot too, and
            # keys routed on it count towards paying for building them.
            self._answer = previous._answer
            self.routed = self.carried = previous.routed

    def answer(self, costs: _Costs | None = None) -> tuple[np.ndarray, np.ndarray | None, bool]:
        """The answer tables ``(answer, moved, complete)``, built on first use.

        Per (ring, newest-ring position): the endpoint, and whether bounded load moved
        it off the plain ring's answer (``moved`` is ``None`` if it moved none: without
        bounded load, or no endpoint over the bar); ``complete``: no entry is ``-1``
        (so a batch needs no fallback count). The build is timed into ``costs``.
        """
        a = self._answer
        if a is None:
            t0 = time.perf_counter_ns()
            a = self._answer = self._build()
            if costs is not None:
                costs.built(a[0].size, time.perf_counter_ns() - t0)
        return a

    def _build(self) -> tuple[np.ndarray, np.ndarray | None, bool]:
        rs = self.table.ring_set
        plain = self._plain
        if plain is None:
            plain = self._plain = rs.answer_table(candidates=self.candidates)
        if self.balance_factor is None:
            return plain, None, not bool((plain < 0).any())
        bounded = rs.answer_table(
            self.load, self.balance_factor, candidates=self.candidates, max_hops=self.max_hops
        )
        moved = bounded != plain
        return bounded, moved if moved.any() else None, not bool((bounded < 0).any())


class _Costs:
    """What walking a key and building answer tables cost this worker (measured).

    Exponentially weighted means of the wall time of walks (per key) and of table
    builds (per table entry); cheap enough to take on every walk (two clock reads).
    """

    __slots__ = ("_built", "_first", "build_ns_per_entry", "measured", "walk_ns_per_key")

    _ALPHA = 0.2

    # Before the first build: what one costs per entry on this machine kind
    # (PERF-NOTES: 0.3-0.7 ms for 10k positions, ~4.5 ms for 100k).
    _BUILD_PRIOR_NS = 35.0

    def __init__(self) -> None:
        self.walk_ns_per_key = 0.0
        self.build_ns_per_entry = self._BUILD_PRIOR_NS
        self.measured = False  # walks were timed
        self._first: list[float] = []
        self._built = False

    def walked(self, keys: int, ns: int) -> None:
        if not keys:
            return
        per = ns / keys
        w = self.walk_ns_per_key
        if self.measured:
            # One slow sample (a page fault, a thread switch) moves the mean at most 2x:
            # walks may be rare once builds win, so an outlier would stay for long.
            per = min(max(per, 0.5 * w), 2.0 * w)
            self.walk_ns_per_key = w + self._ALPHA * (per - w)
        else:
            self._first.append(per)
            if len(self._first) == 3:  # the median of the first three
                self.walk_ns_per_key = sorted(self._first)[1]
                self.measured = True

    def built(self, entries: int, ns: int) -> None:
        if entries:
            per = ns / entries
            b = self.build_ns_per_entry
            self.build_ns_per_entry = b + self._ALPHA * (per - b) if self._built else per
            self._built = True

    def pays(self, keys: int, entries: int) -> bool:
        """Whether walking ``keys`` keys costs more than building ``entries`` entries."""
        return keys * self.walk_ns_per_key >= entries * self.build_ns_per_entry


def _idle_loads(n: int, now_ns: int) -> shm.HostLoads:
    """Loads of ``n`` endpoints nobody has called (no counters to read)."""
    return shm.HostLoads.idle(n, now_ns)


def _row_from_env() -> int | None:
    raw = os.environ.get(COUNTER_ROW_ENV)
    if raw is None or not raw.strip():
        return None
    try:
        row = int(raw.strip())
    except ValueError:
        raise RouterInputError(
            f"environment: invalid {COUNTER_ROW_ENV}={raw!r}: expected a counter row number >= 0"
        ) from None
    if row < 0:
        raise RouterInputError(
            f"environment: invalid {COUNTER_ROW_ENV}={raw!r}: expected a counter row number >= 0"
        )
    return row


def _key_text(key: Any) -> str:
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key).decode("utf-8", "backslashreplace")
    if isinstance(key, np.generic):
        key = key.item()
        if isinstance(key, bytes):
            return key.decode("utf-8", "backslashreplace")
    return str(key)


# ------------------------------------------------------------------------------------
# The router.

_ROUTERS: weakref.WeakSet[Router] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    Router._current = None
    Router._attach_lock = threading.Lock()  # another thread may have held it at the fork
    for r in list(_ROUTERS):
        r._forked = True


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
        Where a new table generation is mapped and answer tables are built: ``None``
        (default) in a background thread unless the work is small (tables up to
        2 MiB, answer tables this worker builds in under 1 ms), ``True`` always in
        the background, ``False`` always on the routing thread (every new generation
        is then routed on by the first batch after its publish, at the cost of
        stalling that batch; see "Following new tables" in the module docs).

    Attributes
    ----------
    namespace : str
        The namespace.
    row : int or None
        The counter row this process records into (``None`` without counters).
    adopted : bool
        Whether that row was the one reserved for this process.
    reattached : int
        How many times the router re-attached replaced counters.
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
    ) -> None:
        self.namespace = shm.check_namespace(namespace)
        if background is not None and not isinstance(background, bool):
            raise RouterInputError(f"background must be True, False or None, got {background!r}")
        self.background = background
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
        self._lock = threading.Lock()  # snapshot refresh and (re)attaching
        self._stats_lock = threading.Lock()
        self._failure_log = FailureLog(
            log,
            FAILURE_LOG_RATE.convert(
                os.environ.get(FAILURE_LOG_RATE.env, str(FAILURE_LOG_RATE.default)), "environment"
            ),
            clock,
        )
        self._ledger: CallLedger | None = None
        self._fanout: Any = None  # workers.fanout.FanOut, made on first use
        self._fanout_lock = threading.RLock()  # (FanOut() asks for the ledger under it)
        self._stats = {"decisions": 0, "fallbacks": 0, "moves": 0, "failures": 0}
        self._reader: shm.TableReader | None = None
        self._store: shm.CounterStore | None = None
        self._counters: shm.CounterReader | None = None
        self._rec: Any = None
        self._wanted_row = row
        self.row: int | None = None
        self.adopted = False
        self.reattached = 0
        self._snap: _Snapshot | None = None
        self._costs = _Costs()
        # The answer-table build handed to the background: (its job, PID that submitted it).
        self._building: tuple[shm.background.Job, int] | None = None
        self._build_lock = threading.Lock()
        self._builder: shm.BackgroundWorker | None = None
        if background is not False:
            self._builder = shm.BackgroundWorker("cslb-answer-build")
            self._builder.start()  # now: starting a thread makes its caller wait for it
            weakref.finalize(self, self._builder.close)  # a router dropped unclosed
        # Per thread, the last (indices, table, keys) route_table() returned: mapping or
        # tracking that very array later uses its table and keys (see endpoints_of).
        self._last = threading.local()
        self._next_check = 0
        self._no_row_logged = False
        self._warned: set[tuple[Any, ...]] = set()
        self._bad: tuple[int, int] | None = None  # (generation, recheck time) of a bad read
        self._connect(self._clock())
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
            ``CSLB_LOAD_REFRESH`` is malformed (``refresh_s`` not given).
        """
        ns = shm.shm_namespace(os.environ) if namespace is None else namespace
        with cls._attach_lock:
            cur = cls.current()
            if cur is not None:
                if cur.namespace != ns:
                    raise RouterStateError(
                        f"this process's router is attached to namespace {cur.namespace!r}; "
                        f"close it before attaching to {ns!r}"
                    )
                return cur
            if row is None:
                row = _row_from_env()
            router = cls(ns, threads=threads, row=row, refresh_s=refresh_s, clock=clock)
            cls._current = router
            return router

    @classmethod
    def current(cls) -> Router | None:
        """The router :meth:`attach` returned in this process, or ``None``."""
        cur = cls._current
        if cur is None or cur._pid != os.getpid() or cur._closed:
            return None
        return cur

    def _connect(self, now: int) -> None:
        """Attach whatever is missing or replaced (under ``self._lock`` or in __init__)."""
        self._next_check = now + _CHECK_NS
        if self._reader is None:
            try:
                self._reader = shm.TableReader(
                    self.namespace,
                    timeout_s=_READ_TIMEOUT_S,
                    background=self.background is not False,
                    foreground_bytes=_INLINE_MAP_BYTES if self.background is None else 0,
                )
            except shm.SegmentMissingError as exc:
                log.debug("tables of %s not readable yet: %s", self.namespace, exc)
            except shm.SegmentError as exc:  # foreign, another layout version, damaged
                self._warn_once(
                    ("attach", "tables", str(exc)),
                    "tables of %s cannot be used (retried every %g s; fallback meanwhile): %s",
                    self.namespace,
                    _CHECK_NS / 1e9,
                    exc,
                )
        store = self._store
        if store is not None and store.replaced():
            log.warning(
                "counters of %s were replaced (owner restarted); claiming a new row",
                self.namespace,
            )
            self._store = self._counters = self._rec = None
            self.row = None
            self.adopted = False
            self.reattached += 1
            self._snap = None
        if self._store is None:
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
                    _CHECK_NS / 1e9,
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
            self._rec = shm.LockedRecorder(rec) if self.threads else rec
            self._counters = store.reader()
            self._store = store
            self._wanted_row = None  # a reserved row is adopted once, never again

    def _warn_once(self, cause: tuple[Any, ...], msg: str, *args: Any) -> None:
        """Log ``msg`` at WARNING the first time ``cause`` happens (not on every retry)."""
        warned = self._warned
        if cause in warned:
            return
        if len(warned) >= 64:  # a bounded memory of causes: say them again after many
            warned.clear()
        warned.add(cause)
        log.warning(msg, *args)

    def _claim(self, store: shm.CounterStore) -> tuple[shm.Recorder, bool]:
        row = self._wanted_row
        if row is not None:
            try:
                return store.claim(row=row), True
            except shm.SlotOwnershipError as exc:
                # Say, a process started by the worker, which inherited its environment.
                # Said once: the row will not become ours later, so ask only for a free one
                # from now on (while none is free, _connect retries every second).
                log.warning("counter row %d is not reserved for this process (%s)", row, exc)
                self._wanted_row = None
        return store.claim(), False

    def _check_usable(self) -> None:
        if self._forked or self._pid != os.getpid():
            raise RouterStateError(
                f"this router was attached in process {self._pid}; a forked child must "
                "call Router.attach() itself"
            )
        if self._closed:
            raise RouterStateError(f"router of namespace {self.namespace!r} is closed")

    # -- snapshots ----------------------------------------------------------------------

    def _snapshot(self, now: int) -> _Snapshot | None:
        """The snapshot to route on: the current table with a fresh-enough load read.

        ``None`` while there is no usable table (nothing published, segments missing or
        corrupt, or a writer rewriting faster than we can read for a second).
        """
        if now >= self._next_check:
            with self._lock:
                if now >= self._next_check:
                    self._connect(now)
        reader = self._reader
        if reader is None:
            return None
        bad = self._bad
        if bad is not None:
            # The current generation could not be read: not again until it changes or
            # the recheck interval passed (a corrupt table costs a checksum per read).
            if now < bad[1] and reader.generation() == bad[0]:
                return self._last_good(now)
            self._bad = None
        deadline = 0.0
        while True:
            try:
                t = reader.table()
            except shm.ShmError as exc:
                self._bad = (reader.generation(), now + _CHECK_NS)
                s = self._last_good(now)
                if s is not None:
                    self._warn_once(
                        ("table", type(exc), str(exc)),
                        "routing table of %s unusable, routing on generation %d meanwhile: %s",
                        self.namespace,
                        s.table.generation,
                        exc,
                    )
                else:
                    self._warn_once(
                        ("table", type(exc), str(exc)),
                        "no usable routing table in %s (fallback): %s",
                        self.namespace,
                        exc,
                    )
                return s
            s = self._snap
            if s is not None and s.table is t and now < s.due_ns:
                return s
            s = self._refresh(t, now)
            if s is not None:
                return s
            # The writer began rewriting t's buffer while we read it: the next table()
            # call maps the generation it published.
            if not deadline:
                deadline = time.monotonic() + _RETRY_S
            elif time.monotonic() > deadline:
                log.warning("no stable table in %s for %g s", self.namespace, _RETRY_S)
                return None

    def _last_good(self, now: int) -> _Snapshot | None:
        """The last snapshot, refreshed when due, while its table is still valid."""
        s = self._snap
        if s is None or not s.table.valid():
            return None
        if now >= s.due_ns:
            s = self._refresh(s.table, now) or s
        return s

    def _refresh(self, t: shm.Table, now: int) -> _Snapshot | None:
        """A new snapshot of ``t`` (``None`` if ``t`` was rewritten while we read it)."""
        with self._lock:
            s = self._snap
            if s is not None and s.table is t and now < s.due_ns:
                return s  # another thread refreshed meanwhile
            try:
                # A private copy: the table's arrays are views of shared memory that the
                # writer may reuse two publishes later; garbage there must not become,
                # say, a gigantic allocation in take().
                slots = np.array(t.slots, dtype=np.intp)
                if slots.size and (int(slots.min()) < 0 or int(slots.max()) >= t.n_slots):
                    raise shm.SegmentLayoutError(t.segment, "endpoint slot out of range")
                counters = self._counters
                n = len(t.endpoints)
                if counters is None or n == 0:
                    loads = _idle_loads(n, now)
                else:
                    loads = counters.read(now, t.n_slots, failure_kinds=False).take(slots)
                s = _Snapshot(t, slots, loads, now, now + self.refresh_ns)
            except Exception:
                if t.valid():
                    raise
                return None
            if not t.valid():
                return None
            s.follow(self._snap, self.refresh_ns)
            self._snap = s
            return s

    def table(self) -> shm.Table:
        """The current table generation (an empty generation-0 table before any).

        Raises
        ------
        RouterStateError
            Closed, or a forked child's inherited router.
        """
        self._check_usable()
        s = self._snapshot(self._clock())
        return s.table if s is not None else _empty_table()

    def loads(self) -> shm.HostLoads:
        """The cached host-wide load snapshot, per endpoint of :meth:`table`."""
        self._check_usable()
        now = self._clock()
        s = self._snapshot(now)
        return s.loads if s is not None else _idle_loads(0, now)

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
        h = lbcore.hash_keys(keys, max_key_bytes=_MAX_KEY_BYTES)
        if attempt.__class__ is not int or attempt < 0:
            if (
                isinstance(attempt, bool)
                or not isinstance(attempt, (int, np.integer))
                or attempt < 0
            ):
                raise lbcore.ArgumentError(
                    f"attempt must be a non-negative integer, got {attempt!r}"
                )
        n = h.size
        deadline = 0.0
        while True:
            now = self._clock()
            s = self._snapshot(now)
            if s is None:
                idx, moves, fallbacks, t = np.full(n, -1, dtype=np.int32), 0, n, _empty_table()
                break
            t = s.table
            try:
                idx, moves, fallbacks = self._route_on(s, h, now, int(attempt))
            except Exception:
                # Content rewritten under our feet can fail in any way; on a table that
                # is still valid the error is real.
                if t.valid():
                    raise
            else:
                if t.valid():
                    break
            # The writer rewrote this table's buffer while we routed on it: the next
            # table() call maps the new generation.
            if not deadline:
                deadline = time.monotonic() + _RETRY_S
            elif time.monotonic() > deadline:
                log.warning("no stable table in %s for %g s; fallback", self.namespace, _RETRY_S)
                idx, moves, fallbacks, t = np.full(n, -1, dtype=np.int32), 0, n, _empty_table()
                break
        if n:
            self._count(n, fallbacks, moves)
        self._last.routed = (idx, t, keys)
        return idx, t

    def _route_on(
        self, s: _Snapshot, h: np.ndarray, now: int, attempt: int
    ) -> tuple[np.ndarray, int, int]:
        """Route hashes ``h`` on snapshot ``s``: ``(indices, bounded-load moves, fallbacks)``."""
        n = h.size
        last = s.last_ring
        if last < 0 or n == 0:
            return np.full(n, -1, dtype=np.int32), 0, n
        rs = s.table.ring_set
        complete = False  # known to hold no fallback
        if s.mode == "skipper":
            idx, moved = self._route_skipper(s, h, now, attempt)
        elif (
            attempt
            or ((ready := s._answer) is None and not s.amortized(n, self._costs))
            or not (a := ready or self._answers(s))  # being built: walk meanwhile
        ):
            t0 = time.perf_counter_ns()
            idx, moved = self._route_lbcore(s, h, now, attempt)
            if not attempt:
                self._costs.walked(n, time.perf_counter_ns() - t0)
        else:
            if ready is not None:
                s.routed += n  # (what amortized() counts; racy under threads, as there)
            answer, moved_table, complete = a
            pos = rs.rings[last].positions(h)
            if last == 0:
                flat = pos
            elif s.mode == "off":
                flat = pos + last * answer.shape[1]
            else:
                off = rs.ring_offsets(h, now, answer.shape[1])
                flat = pos if off is None else np.add(pos, off)
            idx = answer.take(flat)
            moved = None if moved_table is None else moved_table.take(flat)
        if not s.gate_all:
            keep = s.gate.mask(h)
            idx[~keep] = lbcore.FALLBACK
            if moved is not None:
                moved &= keep
            complete = False
        moves = 0 if moved is None else int(np.count_nonzero(moved))
        return idx, moves, 0 if complete else int(np.count_nonzero(idx < 0))

    def _answers(self, s: _Snapshot) -> tuple[np.ndarray, np.ndarray | None, bool] | None:
        """Answer tables to route on for ``s``, whose own are not built yet.

        Built right here when this worker's measured cost says that is quick (or with
        ``background=False``); otherwise a background thread builds them (one build at
        a time) and, until they are ready, the routing thread uses those of the
        previous snapshot of the same table (bounded load then decides on loads one
        refresh older), or walks the keys (``None``) on a new generation.
        """
        costs = self._costs
        bg = self.background
        if bg is False or (
            bg is None
            and s.table.ring_set.owner_table.size * costs.build_ns_per_entry <= _INLINE_BUILD_NS
        ):
            return s.answer(costs)
        if not s.build_failed:
            self._build_in_background(s)
        return s._answer or s.stale

    def _build_in_background(self, s: _Snapshot) -> None:
        """Start building ``s``'s answer tables in a thread, unless a build is running."""
        pid = os.getpid()
        b = self._building
        if b is not None and b[1] == pid and not b[0].done():
            return  # ``s`` is started after it: the next batch asks again
        with self._build_lock:
            b = self._building
            if (b is not None and b[1] == pid and not b[0].done()) or s._answer is not None:
                return
            builder = self._builder
            if builder is None:  # background=False builds at once; never here
                return
            self._building = (builder.submit(lambda: self._build_answers(s)), pid)

    def _build_answers(self, s: _Snapshot) -> None:
        """Background job: build ``s``'s answer tables; the routing thread picks them up."""
        t0 = time.thread_time_ns()  # CPU time: waits for the GIL are not build cost
        try:
            a = s._build()
        except Exception as exc:
            if s.table.valid():  # else: rewritten under us; that generation is gone
                s.build_failed = True
                self._warn_once(
                    ("answer build", type(exc), str(exc)),
                    "answer tables of generation %d in %s not built (walking keys): %r",
                    s.table.generation,
                    self.namespace,
                    exc,
                )
            return
        if s.table.valid():
            s._answer = a
            s.stale = None
            self._costs.built(a[0].size, time.thread_time_ns() - t0)

    def _route_lbcore(
        self, s: _Snapshot, h: np.ndarray, now: int, attempt: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Retries, and snapshots too young for answer tables: lbcore's ring-set routing."""
        rs = s.table.ring_set
        when = now if s.mode != "off" else _FAR_FUTURE
        kw = {"candidates": s.candidates, "max_hops": s.max_hops, "attempt": attempt, "hashes": h}
        plain = rs.route(None, when, **kw)
        if s.balance_factor is None:
            return plain, None
        idx = rs.route(None, when, loads=s.load, balance_factor=s.balance_factor, **kw)
        return idx, (idx != plain) & (idx >= 0)

    def _route_skipper(
        self, s: _Snapshot, h: np.ndarray, now: int, attempt: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Skipper's fade-in (:func:`lbcore.fade.skipper_fadein_route`), ejected unlisted.

        Skipper draws one random threshold per request; here the draw is a salted re-mix
        of the key's hash (:data:`SKIPPER_SALT`), so a key's answer is deterministic for
        a given time while the whole batch still sees Skipper's candidate shares.
        """
        rs = s.table.ring_set
        # Scores per fading event (tier 0: established, fully in), then per endpoint.
        ages: list[int | None] = [None, *(now - start for start in rs.starts_ns)]
        scores = fadein_scores(ages, rs.duration_ns, rs.exponent).take(rs.tiers)
        kw: dict[str, Any] = {
            "candidates": s.candidates,
            "attempt": attempt,
            "hashes": h,
            "scores": scores,
        }
        args = (rs.master, None, None, rs.duration_ns, rs.exponent, unit_interval(h, SKIPPER_SALT))
        plain = skipper_fadein_route(*args, **kw)
        if s.balance_factor is None:
            return plain, None
        idx = skipper_fadein_route(
            *args, loads=s.load, balance_factor=s.balance_factor, max_hops=s.max_hops, **kw
        )
        return idx, (idx != plain) & (idx >= 0)

    def _count(self, decisions: int, fallbacks: int, moves: int) -> None:
        with self._stats_lock:
            st = self._stats
            st["decisions"] += decisions
            st["fallbacks"] += fallbacks
            st["moves"] += moves
        rec = self._rec
        if rec is not None:
            try:
                rec._count_trusted(decisions, fallbacks, moves)  # our own ints >= 0
            except shm.ShmError as exc:  # released meanwhile (closed, counters replaced)
                log.warning("decision counts not recorded: %s", exc)

    def stats(self) -> dict[str, int]:
        """Totals of this process since attaching.

        Keys ``decisions``, ``fallbacks``, ``moves`` and ``failures``; the host-wide
        totals are in the shared counters (:meth:`shm.CounterReader.stats`).
        """
        with self._stats_lock:
            return dict(self._stats)

    # -- mapping indices ----------------------------------------------------------------

    def _routed_on(self, idx: Any) -> tuple[np.ndarray, shm.Table, Any] | None:
        """Last ``(indices, table, keys)`` routed by this thread, if ``idx`` is (a view of) it."""
        last = getattr(self._last, "routed", None)
        if last is None or type(idx) is not np.ndarray:
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
        arr = _indices(idx, len(t.endpoints))
        eps = t.endpoints
        return [eps[i] if i >= 0 else None for i in arr.tolist()]

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
        """
        if self._forked or self._closed:  # (the at-fork hook sets _forked in a child)
            self._check_usable()
        if table is None or keys is None:
            last = self._routed_on(idx)
            if last is not None:
                if table is None:
                    table = last[1]
                if keys is None and idx is last[0] and last[2] is not None:
                    keys = last[2]
        t = self.table() if table is None else table
        snap = self._snap
        if (
            snap is not None
            and snap.table is t
            and idx.__class__ is np.ndarray
            and idx.dtype is _I32  # (route's own; int64 i + 1 as uint64 could wrap to -1)
            and idx.ndim == 1
        ):
            slots, calls = _fast_slots(idx, snap.slots_ext, len(t.endpoints))
            arr = idx
        else:
            arr = _indices(idx, len(t.endpoints))
            slots = calls = None
        if keys is not None and len(keys) != arr.size:
            raise RouterInputError(f"track got {len(keys)} keys for {arr.size} calls")
        tracker = Tracker(self, arr, t, keys, int(attempt))
        if slots is not None:
            tracker._mapped = (slots, calls)
        return tracker

    # -- the fan-out helper (workers.fanout, workers.afanout) ----------------------------

    def fanout(
        self,
        keys: Any,
        send: Callable[..., Any],
        *,
        timeout_s: float | None = None,
        deadline_s: float | None = None,
        grouped: bool = False,
    ) -> list[Any]:
        """Route ``keys`` and make their calls on the worker's pool (sync, gthread workers).

        ``send(url, key) -> value`` raises on failure (``grouped``: ``send(url, keys) ->
        values``, once per pod) and gets ``timeout=`` if it takes it
        (:mod:`workers.senders`); ``timeout_s`` bounds one call, ``deadline_s`` the
        fan-out (defaults ``CSLB_FANOUT_TIMEOUT``, ``CSLB_FANOUT_DEADLINE``). Returns one
        :class:`workers.fanout.Result` per key, in order; retry, budget, bulkhead,
        fallback and recording: :mod:`workers.fanout`.
        """
        self._check_usable()
        if not self.threads:
            raise RouterStateError(
                "router.fanout runs calls on a thread pool: attach the router with "
                "threads=True (the default)"
            )
        return self._fan().run(keys, send, timeout_s, deadline_s, grouped)

    async def afanout(
        self,
        keys: Any,
        asend: Callable[..., Any],
        *,
        timeout_s: float | None = None,
        deadline_s: float | None = None,
        grouped: bool = False,
    ) -> list[Any]:
        """:meth:`fanout` for asyncio workers, on the running loop (:mod:`workers.afanout`).

        Tasks may interleave on one thread: nothing here uses the per-thread last batch.
        """
        self._check_usable()
        from workers.afanout import run

        return await run(self._fan(), keys, asend, timeout_s, deadline_s, grouped)

    def _fan(self) -> Any:
        fan = self._fanout
        if fan is None:
            from workers.fanout import FanOut

            with self._fanout_lock:
                if self._fanout is None:
                    self._fanout = FanOut(self)
                fan = self._fanout
        return fan

    def _call_ledger(self) -> CallLedger:
        """The per-call recording handle of this router (its counter row, batched steps)."""
        led = self._ledger
        if led is None:
            with self._fanout_lock:
                if self._ledger is None:
                    self._ledger = CallLedger(lambda: self._rec, self._clock)
                led = self._ledger
        return led

    def _call_slots(self, idx: np.ndarray, table: shm.Table) -> np.ndarray | None:
        """Counter slot per index of ``idx`` routed on ``table`` (``-1`` entries: 0).

        ``None`` when ``table``'s buffer was reused since (its slots are gone).
        """
        safe = np.maximum(idx, 0)
        snap = self._snap
        if snap is not None and snap.table is table:
            return snap.slots.take(safe) if snap.slots.size else np.zeros(idx.size, np.intp)
        if not len(table.endpoints):
            return np.zeros(idx.size, np.intp)
        slots = table.slots.take(safe).astype(np.intp)
        if not table.valid() or (slots.size and int(slots.max()) >= table.n_slots):
            return None
        return slots

    def close(self) -> None:
        """Give the counter row back and drop the mappings (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._fanout is not None:
            self._fanout.close()
        if self._ledger is not None and not self._forked and self._pid == os.getpid():
            self._ledger.flush()
        if Router._current is self:
            Router._current = None
        if self._forked or self._pid != os.getpid():
            return  # the parent's row and mappings are the parent's to release
        rec = self._rec
        self._rec = None
        if rec is not None:
            try:
                rec.release()
            except shm.ShmError as exc:
                log.warning("counter row not released: %s", exc)
        if self._reader is not None:
            self._reader.close()
        if self._builder is not None:
            self._builder.close()
        if self._counters is not None:
            self._counters.close()
        if self._store is not None:
            self._store.close()
        self._snap = None

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Router(namespace={self.namespace!r}, row={self.row}, pid={self._pid}, "
            f"refresh={self.refresh_ns / 1e9:g}s)"
        )


_FAR_FUTURE = (1 << 62) - 1
_umax = np.maximum.reduce  # every fading ring at share 1 (fade_mode=off)
_umin = np.minimum.reduce
_count_nonzero = np.count_nonzero  # a quarter of a ufunc reduction's call cost
_I32 = np.dtype(np.int32)
_ONE32 = np.array(1, dtype=np.int32)  # 0-d: no scalar conversion per call
_SLOT_PLACEHOLDER = np.zeros(1, dtype=np.intp)
_NO_SLOTS = np.empty(0, dtype=np.intp)  # (never written: a tracker replaces it)


def _fast_slots(
    idx: np.ndarray, slots_ext: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Counter slots of the routed calls of ``idx`` (1-D ``int32``), and their positions.

    ``slots_ext`` is a snapshot's :attr:`_Snapshot.slots_ext` for ``n`` endpoints. The
    bounds check is the take itself: ``i + 1`` as unsigned is in ``0 .. n`` exactly for
    ``-1 <= i < n``. Positions are ``None`` when no call is a fallback.

    Raises
    ------
    RouterInputError
        An index outside ``-1 .. n - 1``.
    """
    u = np.add(idx, _ONE32).view(np.uint32)  # below 2**32: take converts it exactly
    try:
        slots = slots_ext.take(u)
    except IndexError:
        _indices(idx, n)  # raises the error that names the bad values
        raise
    if _count_nonzero(u) != u.size:  # a fallback (-1) call: not recorded
        routed = u != 0
        return slots[routed], np.flatnonzero(routed)
    return slots, None


def _indices(idx: Any, n: int) -> np.ndarray:
    """Validated endpoint indices (``route``'s own ``int32`` arrays pass without a copy)."""
    arr = idx if type(idx) is np.ndarray else np.asarray(idx)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise RouterInputError(
            f"endpoint indices must be a 1-D integer array, got {arr.dtype} of shape {arr.shape}"
        )
    if arr.dtype != np.int32 and arr.dtype != np.int64:
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= n:
            # Checked before the conversion: 2**64 - 1 as int64 would be -1 (fallback).
            raise RouterInputError(
                f"endpoint indices must be in -1..{n - 1} for a table of {n} endpoints, got "
                f"{int(arr.max())}"
            )
        arr = arr.astype(np.int64)  # unsigned or narrow: compare and index safely
    # -1 <= i < n for all i, in one reduction: i + 1 as unsigned is below n + 1.
    if arr.size and int(_umax((arr + 1).view(np.uint32 if arr.itemsize == 4 else np.uint64))) > n:
        raise RouterInputError(
            f"endpoint indices must be in -1..{n - 1} for a table of {n} endpoints, got "
            f"values from {int(arr.min())} to {int(arr.max())}"
        )
    return arr


_EMPTY: list[shm.Table] = []


def _empty_table() -> shm.Table:
    """A generation-0 table without endpoints (no tables published yet)."""
    if not _EMPTY:
        _EMPTY.append(shm.Table.empty())
    return _EMPTY[0]


class Tracker:
    """Records one fan-out (from :meth:`Router.track`); use it as a context manager.

    On enter every routed call counts as in flight at its endpoint; on exit each call
    ends, with its busy time from enter to its :meth:`done` time (default: the exit),
    and failed if :meth:`fail` was called for it. An exception inside the block still
    records the end (the calls are not marked failed by it).
    """

    __slots__ = (
        "_calls",
        "_counts",
        "_ends",
        "_entered",
        "_exited",
        "_failed",
        "_mapped",
        "_n",
        "_rec",
        "_slots",
        "_start",
        "attempt",
        "idx",
        "keys",
        "router",
        "table",
    )

    def __init__(
        self,
        router: Router,
        idx: np.ndarray,
        table: shm.Table,
        keys: Sequence[Any] | None,
        attempt: int,
    ) -> None:
        self.router = router
        # A private copy: the caller may reuse its array while the calls are open, and
        # fail(i) must still name the endpoint call i went to.
        self.idx = idx.copy()
        self.table = table
        self.keys = keys
        self.attempt = attempt
        self._rec: Any = None
        self._calls: np.ndarray | None = None  # positions of routed calls (None: all)
        self._n = 0  # routed calls (done/fail bookkeeping, recorded or not)
        self._slots = _NO_SLOTS  # their counter slots; empty: not recorded
        self._start = 0
        self._ends: np.ndarray | None = None
        self._failed: np.ndarray | None = None
        self._counts: np.ndarray | None = None  # calls per slot, if the start counted them
        self._entered = self._exited = False
        # (slots, positions) computed by Router.track on the snapshot of this table.
        self._mapped: tuple[np.ndarray, np.ndarray | None] | None = None

    def __enter__(self) -> Tracker:
        if self._entered:
            raise RouterStateError("a tracker records one fan-out; call router.track() again")
        self._entered = True
        router = self.router
        if router._forked or router._closed:
            router._check_usable()
        t = self.table
        mapped = self._mapped
        if mapped is not None:
            # Router.track mapped the calls on the snapshot's private copy of the slots.
            self._slots, self._calls = mapped
            self._n = self._slots.size
            self._rec = rec = router._rec
            self._start = start = int(router._clock())
            if rec is not None and self._n:
                self._counts = rec._record_start_trusted(self._slots, start, t.n_slots)
            return self
        idx = self.idx
        if _count_nonzero(idx >= 0) != idx.size:
            routed = idx >= 0
            self._calls = np.flatnonzero(routed)
            idx = idx[routed]
        self._n = idx.size
        snap = router._snap
        if snap is not None and snap.table is t:
            # The snapshot's private copy of the current table's slots (checked to be in
            # 0 .. n_slots - 1 when the snapshot was taken).
            self._slots = snap.slots.take(idx)
        else:
            self._slots = t.slots.take(idx).astype(np.intp)
            if self._slots.size and (
                not t.valid() or int(self._slots.max()) >= t.n_slots or self._slots.min() < 0
            ):
                # An old generation whose buffer the writer has reused since: its slots
                # are gone. Not recording beats recording onto other endpoints' columns.
                log.warning(
                    "fan-out on table generation %d not recorded: that table was replaced "
                    "twice since it was routed on",
                    t.generation,
                )
                self._slots = _NO_SLOTS
        self._rec = router._rec
        self._start = start = int(router._clock())
        if self._rec is not None and self._slots.size:
            self._counts = self._rec._record_start_trusted(self._slots, start, t.n_slots)
        return self

    def _position(self, i: int) -> int | None:
        """Index of call ``i`` among the recorded calls (``None``: a fallback call)."""
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
            self._ends = np.full(self._n, -1, dtype=np.int64)
        self._ends[j] = self.router._clock()

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
            self._failed = np.zeros(self._n, dtype=np.bool_)
        if self._failed[j]:
            return
        self._failed[j] = True
        i = int(i) % self.idx.size
        t = self.table
        e = int(self.idx[i])
        ep = t.endpoints[e]
        fields = {
            "event": "cslb_call_failed",
            "product_id": None if self.keys is None else _key_text(self.keys[i]),
            "endpoint": ep,
            "pod_ip": _pod_ip(ep),
            "node": t.nodes[e],
            "zone": t.zones[e],
            "attempt": self.attempt,
            "generation": t.generation,
            "call": i,
            "pid": os.getpid(),
        }
        self.router._failure_log.failed(fields)
        with self.router._stats_lock:
            self.router._stats["failures"] += 1

    def __exit__(self, *exc: object) -> None:
        if self._exited:
            return
        self._exited = True
        rec = self._rec
        if rec is None or not self._slots.size:
            return
        end = int(self.router._clock())
        if self._ends is None:
            durations: Any = max(end - self._start, 0)  # every call: one int
        else:
            ends = np.where(self._ends < 0, end, self._ends)
            durations = np.maximum(ends - self._start, 0)
        try:
            rec._record_end_trusted(
                self._slots,
                self._start,
                durations,
                end,
                self._failed,
                self.table.n_slots,
                self._counts,
            )
        except shm.ShmError as exc:
            # Released meanwhile (router closed, counters replaced): nothing to add to.
            log.warning("fan-out end not recorded: %s", exc)
