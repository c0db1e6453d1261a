"""Publishing ring sets into shared memory: discovery's only contact with :mod:`shm`.

:class:`Publisher` owns the namespace's :class:`shm.TableWriter` (the single writer of
the tables; it holds the writer lock for the life of the process) and, when the
host's counter matrix exists, grows it before a publish so every endpoint slot of the
new table has a column. Counter slots themselves are assigned by the table writer
(stable per endpoint; a freed slot is reused only after the occupancy window).

It also reads the host's counters for outlier detection
(:meth:`Publisher.counter_totals`, read-only, following a replaced counter matrix) and
publishes the ejection state with each table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import lbcore
import shm
from discovery.outlier import Totals
from discovery.ringstate import RingState, Transition
from discovery.settings import PUBLISHED_KNOBS
from lbcore.ejection import Ejections
from shm.tables.zone import ZoneCurve

__all__ = ["PUBLISHED_KNOBS", "Publisher", "Recovered", "shm_knobs"]

_NO_ZONE = ZoneCurve()


def shm_knobs(knobs: Mapping[str, Any]) -> shm.Knobs:
    """The table's knobs from resolved routing knob values (by name)."""
    return shm.Knobs(**{k: knobs[k] for k in PUBLISHED_KNOBS})


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a previous publisher left in shared memory (copied out of the mapping).

    Attributes
    ----------
    generation
        Its last generation.
    state
        Its ring set and endpoint details, rebuilt in private memory.
    knobs
        Its published knob values, by name.
    published_ns
        CLOCK_MONOTONIC time of that publish, in nanoseconds.
    ejections
        Its outlier-ejection state, per endpoint of ``state.ring_set`` (copied).
    outlier_panic
        Whether it was in outlier panic.
    zone
        Its zone record (the zone controller continues its curve).
    """

    generation: int
    state: RingState
    knobs: dict[str, Any]
    published_ns: int
    ejections: Ejections
    outlier_panic: bool = False
    zone: ZoneCurve = _NO_ZONE


class Publisher:
    """The namespace's table writer.

    Parameters
    ----------
    namespace
        Shared-memory namespace (``/dev/shm/cslb.<namespace>.*``).

    Raises
    ------
    shm.WriterBusyError
        Another live process publishes this namespace.
    shm.ShmError
        The segments cannot be created or are foreign.
    """

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._counters = self._attach_counters()
        # With the counters known up front the writer grows them itself and waits their
        # own occupancy window before it reuses a freed slot.
        self._writer_grows = self._counters is not None
        self.writer = shm.TableWriter(namespace, counters=self._counters)
        self.recovered = self._recover()
        self._reader: shm.CounterReader | None = None
        self._reader_id = 0

    def _attach_counters(self) -> shm.CounterStore | None:
        try:
            return shm.CounterStore.attach(self.namespace, writable=True)
        except (shm.SegmentMissingError, shm.SegmentCorruptError):
            return None  # not created yet (the gunicorn master creates them)

    def _recover(self) -> Recovered | None:
        t = self.writer.recovered
        if t is None or not t.endpoints:
            return None
        rs = t.ring_set
        # Copy out of shared memory: the writer will reuse that buffer two publishes on.
        ring_set = lbcore.RingSet(
            tuple(t.endpoints),
            [int(x) for x in rs.tiers],
            tuple(int(s) for s in rs.starts_ns),
            duration_ns=int(rs.duration_ns),
            exponent=float(rs.exponent),
            vnodes=int(rs.vnodes),
        )
        state = RingState.recovered(ring_set, list(t.zones), list(t.nodes))
        k = t.knobs
        knobs = {name: getattr(k, name) for name in PUBLISHED_KNOBS}
        e = t.ejections
        ejections = Ejections.of(e.reason, e.until_ns, e.multiplier, e.decay_ns, e.counts)
        return Recovered(
            int(t.generation),
            state,
            knobs,
            int(t.published_ns),
            ejections,
            bool(t.outlier_panic),
            t.zone,
        )

    @property
    def generation(self) -> int:
        """Generations published so far in this namespace (continues a previous writer's)."""
        return self.writer.generation

    def _grow_counters(self, new_endpoints: int) -> None:
        if self._writer_grows:
            return
        if self._counters is None:
            self._counters = self._attach_counters()
            if self._counters is None:
                return  # whoever creates them later sizes them from the table
        # Counters created after this process started: each new endpoint takes at most
        # one new slot.
        self._counters.ensure_columns(max(self.writer.n_slots + new_endpoints, 1))

    def publish(
        self,
        t: Transition,
        knobs: Mapping[str, Any],
        now_ns: int,
        *,
        ejections: Ejections | None = None,
        outlier_panic: bool = False,
        zone: ZoneCurve | None = None,
    ) -> int:
        """Publish a transition's ring set with ``knobs``; returns the new generation.

        ``ejections``: the outlier-ejection state per endpoint of ``t.ring_set`` (default:
        none ejected); ``outlier_panic``: routing ignores it; ``zone``: the caller's zone
        and the zone controller's curve (default: none).

        Raises
        ------
        shm.ShmError
            Nothing was published; the previous generation stays current.
        """
        self._grow_counters(len(t.added))
        return self.writer.publish(
            t.ring_set,
            zones=t.zones(),
            nodes=t.nodes(),
            ejections=ejections,
            outlier_panic=outlier_panic,
            knobs=shm_knobs(knobs),
            now_ns=now_ns,
            zone=zone,
        )

    def _counter_reader(self) -> shm.CounterReader | None:
        """The host's counters, read-only; attached again when they were replaced."""
        r = self._reader
        if r is not None and r.replaced():
            r.close()
            r = self._reader = None
        if r is None:
            try:
                r = self._reader = shm.CounterReader(self.namespace)
            except shm.ShmError:
                return None
            self._reader_id += 1
        return r

    def window_latency(
        self, endpoints: tuple[str, ...], now_ns: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Calls completed and their mean latency (seconds) per endpoint over the window.

        The host's counters at ``now_ns`` (CLOCK_MONOTONIC ns), all workers summed; an
        endpoint without a slot or calls has 0 calls and NaN latency. ``None``: no
        counters (yet).
        """
        r = self._counter_reader()
        if r is None:
            return None
        slots = self.writer.slots_of(endpoints)
        try:
            loads = r.read(now_ns, failure_kinds=False)
        except shm.ShmError:
            return None
        n = loads.completed.size
        ok = (slots >= 0) & (slots < n)
        idx = np.where(ok, slots, 0)
        completed = np.where(ok, loads.completed.take(idx), 0.0)
        mean_s = np.where(ok, loads.mean_latency_s.take(idx), np.nan)
        return completed, mean_s

    def counter_totals(self, endpoints: tuple[str, ...]) -> Totals | None:
        """Lifetime request and failure totals of ``endpoints`` (``None``: no counters).

        Reads the host's counters read-only; attaches again when they were replaced
        (then :attr:`Totals.source` changes, so deltas start over).
        """
        r = self._counter_reader()
        if r is None:
            return None
        slots = self.writer.slots_of(endpoints)
        try:
            requests, kinds = r.totals()
        except shm.ShmError:
            return None
        n = requests.size
        ok = (slots >= 0) & (slots < n)
        idx = np.where(ok, slots, 0)
        req = np.where(ok, requests.take(idx), 0)
        by_kind = np.where(ok[:, None], kinds.take(idx, axis=0), 0)
        return Totals(self._reader_id, slots, req, by_kind)

    def check_tables(self) -> str | None:
        """Notice tables segments lost under the writer; ``None``: nothing was lost.

        A lost control segment (removed, replaced or shrunk) gets a new writer that
        continues this one's generation count and counter slots; a lost data segment is
        replaced by the next publish. Either way the caller must publish again (the
        table readers need is gone), and the returned text says what happened.

        Raises
        ------
        shm.ShmError
            A new writer cannot be made (another live writer took the namespace over).
        """
        lost = self.writer.lost()
        if lost is None:
            return None
        what, why = lost
        if what == "control":
            old = self.writer
            # Release the writer lock first: a shrunk control segment still has our name
            # (and the lock lives on it), and it is ours to replace.
            old.close(unlink=False)
            new = shm.TableWriter(self.namespace, counters=self._counters, replace_invalid=True)
            new.adopt(old)
            self.writer = new
        return why

    def set_status(self, problem: str, since_ns: int) -> None:
        """Report what is wrong with the sources (``""``: nothing) to the host's readers."""
        self.writer.set_status(problem, since_ns)

    def heartbeat(self, now_ns: int) -> None:
        """Tell readers the publisher is alive (the generation does not change)."""
        self.writer.heartbeat(now_ns)

    def close(self, *, unlink: bool = True) -> None:
        """Release the writer lock; with ``unlink`` remove the tables segments."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._counters is not None:
            self._counters.close(unlink=False)
            self._counters = None
        self.writer.close(unlink=unlink)
