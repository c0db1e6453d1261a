"""The discovery loop: sources in, debounced ring sets out.

One thread owns all state. Sources (the EndpointSlice informer, the ConfigMap informer,
both in their own threads; the endpoints file, polled here; the command-line list) post
their latest complete view to an inbox; the loop keeps the last good view of each,
merges them, and decides when to publish:

* the **first publish** waits until every endpoint source has synced once (and the
  ConfigMap, for at most ``configmap_wait_s``), so workers never see a partial set;
* **endpoint changes** are debounced (:class:`discovery.debounce.Debouncer`): a burst
  becomes one publish, so a scale-up becomes one fading ring; with ``removals_at_once``
  the endpoints a burst removes are published at once (its additions still wait), so a
  terminating pod leaves the tables without waiting for the debounce;
* **knob changes** (ConfigMap) publish at once: the kill switch must not wait;
* **outlier ejection** (:mod:`discovery.outlier`): every ``CSLB_OUTLIER_INTERVAL`` the
  host's counters are judged; a change of the ejected set (or of the panic state) is
  published at once, not debounced, with the current endpoints: an ejected endpoint is
  skipped on the unchanged ring, a readmitted one fades back in through a new ring;
* a publish whose ring set, endpoint details, knobs and ejections equal the current
  table is skipped, so the generation counts real changes only;
* **zone affinity** (:mod:`discovery.zoneloop`): every second the zone controller
  decides on the counters' latency; a transition is published at once;
* a **heartbeat** is written every ``heartbeat_s`` without bumping the generation.

Sources that fail keep their last good view (the informer keeps its store; a bad file
keeps the previous file contents); an empty set is published only when a healthy
source reports that the Service has no ready endpoints. A publisher restarted on a
host continues from the table in shared memory: unchanged pods keep their tiers, fades
in progress go on, and nothing is republished if nothing changed.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import shm
from discovery.callers import CallerView
from discovery.debounce import Debouncer
from discovery.ejection_log import log_changes
from discovery.events import EventLog
from discovery.outlier import OutlierMonitor, Published
from discovery.ports import InformerLike, PublisherLike
from discovery.ringstate import FadeParams, RingState
from discovery.settings import (
    PUBLISHED_KNOBS,
    KnobState,
    outlier_params,
    unknown_configmap_keys,
)
from discovery.static import (
    DEFAULT_MAX_FILE_BYTES,
    EndpointsFileError,
    EndpointsFileWatcher,
    EndpointSpec,
)
from discovery.zoneloop import ZoneLoop
from lbcore.ejection import Ejections, routing_mask
from lbcore.knobs import KnobError
from lbcore.outlier import DEFAULT_OUTLIER_PARAMS, OutlierParams
from lbcore.zone_settings import ZoneSettings

__all__ = ["Discovery", "InformerLike", "PublisherLike"]

# Longest sleep of the loop: bounds how late a stop requested by a signal is noticed.
_MAX_WAIT_S = 0.2

# How long a stop waits, in all, for the informer threads to end (seconds). They are
# all told to stop first and their blocked requests are cut, so this is a safety cap.
_INFORMER_STOP_WAIT_S = 5.0
# Longest stretch of one piece of work (reading a huge endpoints file, building and
# publishing its table) during which a helper thread keeps the heartbeat going. Long
# enough for any table within the documented scale limits on a loaded host; short
# enough that a parse that never ends is still seen as a hang by the master.
_LONG_WORK_MAX_S = 300.0
# Per-endpoint log lines of one publish (added, removed, updated); the rest is counted
# in one summary line, so a publish of 100,000 new pods writes 100 lines, not 100,000.
_ENDPOINT_LINES_PER_PUBLISH = 100
# How often the zone controller reads the counters and decides (ns): well inside the
# counters' window, so a latency fault is seen within about one window.
_ZONE_TICK_NS = 1_000_000_000

_PUBLISHED = PUBLISHED_KNOBS


@dataclass
class _Source:
    name: str
    endpoints: tuple[EndpointSpec, ...] = ()
    synced: bool = False


def _host(address: str) -> str:
    try:
        return urlsplit(address).hostname or address
    except ValueError:
        return address


def _pod_fields(s: EndpointSpec) -> dict[str, str]:
    out = {"address": s.address, "ip": _host(s.address), "node": s.node, "zone": s.zone}
    if s.pod:
        out["pod"] = s.pod
    return out


class Discovery:
    """The host's discovery loop.

    Parameters
    ----------
    publisher
        Where ring sets go (:class:`discovery.publisher.Publisher`).
    knobs
        Routing knobs (flags/environment; the ConfigMap layer is set by the loop).
    log
        Structured event log.
    debounce_s, debounce_max_s
        Quiet time after the last endpoint change, and longest wait after the first
        change of a burst, before publishing (seconds).
    heartbeat_s
        Heartbeat interval (seconds).
    file_poll_s
        How often the endpoints file is checked (seconds).
    configmap_wait_s
        How long the first publish waits for the ConfigMap (seconds).
    removals_at_once
        Publish endpoint removals without waiting for the debounce (additions still
        wait for it).
    drop_warn_share
        A publish removing more than this share of the endpoints in force logs a
        ``publish_drop`` warning (1: never).
    clock
        CLOCK_MONOTONIC in nanoseconds.
    caller_zone
        This caller's zone (``CSLB_ZONE``; empty: from the caller Service's slices).
    """

    def __init__(
        self,
        publisher: PublisherLike,
        knobs: KnobState,
        log: EventLog,
        *,
        debounce_s: float = 2.0,
        debounce_max_s: float = 10.0,
        heartbeat_s: float = 1.0,
        file_poll_s: float = 1.0,
        configmap_wait_s: float = 10.0,
        removals_at_once: bool = False,
        drop_warn_share: float = 0.5,
        clock: Callable[[], int] = time.monotonic_ns,
        caller_zone: str = "",
    ) -> None:
        self.publisher = publisher
        self.caller_zone = caller_zone
        self.knobs = knobs
        self.log = log
        self.clock = clock
        delay = round(debounce_s * 1e9)
        self.debouncer = Debouncer(delay, max(delay, round(debounce_max_s * 1e9)))
        self.heartbeat_ns = round(heartbeat_s * 1e9)
        self.file_poll_ns = round(file_poll_s * 1e9)
        self.configmap_wait_ns = round(configmap_wait_s * 1e9)
        self.removals_at_once = removals_at_once
        self.drop_warn_share = float(drop_warn_share)
        self._removals_pending = False
        self.sources: dict[str, _Source] = {}
        self.inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.stop_event = threading.Event()
        self._file: EndpointsFileWatcher | None = None
        self._informers: list[InformerLike] = []
        self._configmap: str | None = None
        self._configmap_synced = False
        self.published_knobs: dict[str, Any] | None = None
        self.published = False
        self._knobs_dirty = False
        self._retry_at: int | None = None
        self._signalled = False
        # What is wrong, by source, and since when (CLOCK_MONOTONIC ns): reported to the
        # host's readers with the heartbeat (shm publisher status; /healthz says why).
        self._problems: dict[str, tuple[str, int]] = {}
        self._status_written: str | None = None
        self._outlier_params = DEFAULT_OUTLIER_PARAMS
        self._outlier_params = self._current_outlier_params()
        self._held_back: set[str] = set()
        rec = publisher.recovered
        self.published_zone = getattr(rec, "zone", None)
        self.zones = ZoneLoop(self._zone_settings(), log, self.published_zone)
        if rec is not None:
            self.state = rec.state
            self.published_knobs = dict(rec.knobs)
            self.published = True
            eps = rec.state.ring_set.endpoints
            self.monitor = OutlierMonitor(eps, rec.ejections)
            self.monitor.panic = rec.outlier_panic
            self.published_outlier = Published(eps, rec.ejections, rec.outlier_panic)
            log.info(
                "resumed",
                generation=rec.generation,
                endpoints=len(rec.state.meta),
                fading_rings=len(rec.state.ring_set.starts_ns),
                ejected=[a for a, r in zip(eps, rec.ejections.reason, strict=True) if r],
                knobs=rec.knobs,
            )
        else:
            self.state = RingState(FadeParams.from_knobs(knobs.values()))
            self.monitor = OutlierMonitor()
            self.published_outlier = Published((), Ejections.none(0), False)

    # -- sources --------------------------------------------------------------------------

    def add_list(self, specs: Sequence[EndpointSpec]) -> None:
        """A fixed list of endpoints (synced at once)."""
        self.sources["list"] = _Source("list", tuple(specs), True)

    def add_file(self, path: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        """An endpoints file, re-read when it changes (refused over ``max_bytes``)."""
        self._file = EndpointsFileWatcher(path, max_bytes)
        self.sources["file"] = _Source("file")

    def add_informer(self, name: str, informer: InformerLike) -> None:
        """An endpoint informer that calls :meth:`post_endpoints`."""
        self.sources[name] = _Source(name)
        self._informers.append(informer)

    def add_configmap_informer(self, name: str, informer: InformerLike) -> None:
        """A ConfigMap informer that calls :meth:`post_configmap`."""
        self._configmap = name
        self._informers.append(informer)

    def post_endpoints(self, source: str, specs: Sequence[EndpointSpec], reason: str) -> None:
        """Thread-safe: ``source`` now sees exactly ``specs``."""
        self.inbox.put(("endpoints", source, tuple(specs), reason))

    def add_caller_informer(self, informer: InformerLike) -> None:
        """The caller Service's informer that calls :meth:`post_callers` (zone affinity)."""
        self._informers.append(informer)

    def post_callers(self, source: str, view: CallerView, reason: str) -> None:
        """Thread-safe: what ``source`` now says about the callers (their zones)."""
        self.inbox.put(("callers", source, view, reason))

    def post_configmap(self, data: Mapping[str, str] | None, reason: str) -> None:
        """Thread-safe: the ConfigMap's data (``None``: it does not exist)."""
        self.inbox.put(("configmap", None if data is None else dict(data), reason))

    def stop(self) -> None:
        """Thread-safe: end :meth:`run` (wakes it at once)."""
        self.stop_event.set()
        self.inbox.put(("stop",))

    def stop_from_signal(self) -> None:
        """Signal-handler-safe: end :meth:`run` within ``_MAX_WAIT_S``.

        Takes no lock: a handler that runs while the loop holds the inbox's lock must not
        wait for it.
        """
        self._signalled = True

    # -- state ----------------------------------------------------------------------------

    def wanted(self) -> tuple[EndpointSpec, ...]:
        """The merged endpoints of all sources (first source wins details), by address."""
        merged: dict[str, EndpointSpec] = {}
        for src in self.sources.values():
            for s in src.endpoints:
                merged.setdefault(s.address, s)
        return tuple(merged[a] for a in sorted(merged))

    def knob_values(self) -> dict[str, Any]:
        """Routing knobs in force.

        Until the ConfigMap has been read once, a resumed publisher keeps the knobs of
        the table it took over (a restart must not flip a kill switch back on).
        """
        values = self.knobs.values()
        if self._configmap and not self._configmap_synced and self.published_knobs:
            values.update(self.published_knobs)
        return values

    def _synced(self, now_ns: int, started_ns: int) -> bool:
        if not all(s.synced for s in self.sources.values()):
            return False
        if self._configmap and not self._configmap_synced and not self.published:
            return now_ns - started_ns >= self.configmap_wait_ns
        return True

    # -- messages -------------------------------------------------------------------------

    def _on_endpoints(self, source: str, specs: tuple[EndpointSpec, ...], reason: str) -> None:
        src = self.sources[source]
        first = not src.synced
        src.synced = True
        if specs == src.endpoints and not first:
            return
        before = {s.address for s in src.endpoints}
        src.endpoints = specs
        after = {s.address for s in specs}
        self.log.info(
            "source_update",
            source=source,
            reason=reason,
            endpoints=len(specs),
            added=len(after - before),
            removed=len(before - after),
        )
        if self.published:
            self.debouncer.note(self.clock())
            if self.removals_at_once and before - after:
                self._removals_pending = True

    def _on_configmap(self, data: dict[str, str] | None, reason: str) -> None:
        source = f"ConfigMap {self._configmap}"
        first = not self._configmap_synced
        try:
            changed = self.knobs.set_overlay(data, source)
        except KnobError as exc:
            self._configmap_synced = True
            self._note_problem("configmap", f"ConfigMap {self._configmap} rejected: {exc}")
            self.log.error(
                "configmap_invalid",
                configmap=self._configmap,
                error=str(exc),
                action="previous knobs kept",
            )
            return
        self._configmap_synced = True
        self._problems.pop("configmap", None)
        unknown = unknown_configmap_keys(data or {})
        if unknown:
            self.log.warning("configmap_unknown_keys", configmap=self._configmap, keys=unknown)
        if changed or first:
            self.log.info(
                "knobs_changed" if changed else "knobs_read",
                source=source if data is not None else "flags/environment (no ConfigMap)",
                reason=reason,
                changes={k: {"old": o, "new": n} for k, (o, n) in changed.items()},
            )
        if self.published:
            self._knobs_dirty = True

    def _poll_file(self) -> None:
        assert self._file is not None
        try:
            specs = self._file.poll()
        except EndpointsFileError as exc:
            self._note_problem("file", f"endpoints file rejected: {exc}")
            src = self.sources["file"]
            self.log.error(
                "endpoints_file_invalid",
                path=self._file.path,
                error=str(exc),
                action=f"keeping last good endpoints ({len(src.endpoints)})"
                if src.synced
                else "waiting for a valid file",
            )
            return
        if self._file.error is None:
            self._problems.pop("file", None)
        if specs is not None:
            self._on_endpoints("file", tuple(specs), "file changed")
        if self._file.error is None:
            self._on_callers("file", CallerView("", self._file.callers), "file changed")

    # -- publishing -----------------------------------------------------------------------

    def _publish(
        self,
        reason: str,
        now_ns: int,
        *,
        membership: bool,
        endpoints: Sequence[EndpointSpec] | None = None,
        force: bool = False,
    ) -> bool:
        """Publish a ring set; True if a new generation went out (``force``: even unchanged).

        The endpoints are ``endpoints`` if given, else the sources' merged set
        (``membership``) or the current set (a knob change).
        """
        with self._long_work(f"publishing ({reason})"):
            return self._publish_now(reason, now_ns, membership, endpoints, force)

    def _publish_now(
        self,
        reason: str,
        now_ns: int,
        membership: bool,
        endpoints: Sequence[EndpointSpec] | None,
        force: bool,
    ) -> bool:
        knobs = self.knob_values()
        params = FadeParams.from_knobs(knobs)
        if endpoints is None:
            endpoints = self.wanted() if membership else self.state.endpoints()
        t0 = time.perf_counter()
        t = self.state.transition(endpoints, now_ns, params, self.monitor.pending_readmit)
        published = {k: knobs[k] for k in _PUBLISHED}
        knobs_changed = published != self.published_knobs
        eps = t.ring_set.endpoints
        ejections = self.monitor.ejections_for(eps)
        threshold = self._current_outlier_params().panic_threshold
        skipped, panic = routing_mask(ejections.ejected, threshold)
        outlier_changed = self.published_outlier.differs(eps, ejections, panic)
        zone = self.zones.curve(now_ns, t.zones(), ~skipped, self._zone_settings())
        folded = self.debouncer.changes if membership else 0
        # A completed fade changes no key's route, but is published at once (not with the
        # next change): /status, /metrics and the fade alert read the published rings.
        changed = t.routing_changed or knobs_changed or outlier_changed or t.collapsed
        changed = changed or zone != self.published_zone
        if self.published and not (force or changed):
            if membership:
                self.debouncer.reset()
                self.log.info(
                    "publish_skipped",
                    reason=reason,
                    why="no change to endpoints, rings or knobs",
                    folded_changes=folded,
                )
            self._knobs_dirty = False
            # The sources are back at what is published: a failed publish of some other
            # state is moot, so neither its retry nor its problem stays.
            self._retry_at = None
            self._problems.pop("publish", None)
            self.state.commit(t)
            return False
        try:
            gen = self.publisher.publish(
                t, knobs, now_ns, ejections=ejections, outlier_panic=panic, zone=zone
            )
        except Exception as exc:
            self._retry_at = now_ns + 1_000_000_000
            self._note_problem("publish", f"publish failed: {type(exc).__name__}: {exc}")
            self.log.error(
                "publish_failed",
                reason=reason,
                error=f"{type(exc).__name__}: {exc}",
                retry_in_s=1.0,
                action="previous generation stays current",
            )
            return False
        self._retry_at = None
        self._problems.pop("publish", None)
        if membership:
            self.debouncer.reset()
        self._knobs_dirty = False
        budget = _ENDPOINT_LINES_PER_PUBLISH
        unlogged: dict[str, int] = {}
        for event, specs in (
            ("endpoint_added", t.added),
            ("endpoint_removed", t.removed),
            ("endpoint_updated", t.updated),
        ):
            for s in specs[:budget]:
                self.log.info(event, generation=gen, **_pod_fields(s))
            if len(specs) > budget:
                unlogged[event] = len(specs) - budget
            budget = max(budget - len(specs), 0)
        if unlogged:
            self.log.info(
                "endpoint_lines_capped",
                generation=gen,
                not_logged=unlogged,
                why=f"at most {_ENDPOINT_LINES_PER_PUBLISH} endpoint lines per publish",
            )
        after = Published(eps, ejections, panic)
        m = self.monitor
        log_changes(
            self.log,
            gen,
            self.published_outlier,
            after,
            now_ns=now_ns,
            pod=lambda a: _pod_fields(t.meta[a]),
            counts=lambda a: m.window_counts(a) if a in m.addresses else {},
            faded={s.address for s in t.readmitted},
            fade="off" if t.params.duration_ns == 0 else knobs["fade_mode"],
            fade_duration_s=t.params.duration_ns / 1e9,
            panic_threshold=threshold,
        )
        self.published_outlier = after
        self.published_zone = zone
        self.monitor.pending_readmit -= {s.address for s in t.readmitted}
        self.state.commit(t)
        self.published = True
        changes = (
            {
                k: {"old": self.published_knobs.get(k), "new": v}
                for k, v in published.items()
                if self.published_knobs.get(k) != v
            }
            if self.published_knobs is not None and knobs_changed
            else {}
        )
        self.published_knobs = published
        rs = t.ring_set
        self.log.info(
            "publish",
            generation=gen,
            reason=reason,
            endpoints=len(rs.endpoints),
            added=len(t.added),
            removed=len(t.removed),
            updated=len(t.updated),
            readmitted=len(t.readmitted),
            ejected=int(ejections.ejected.sum()),
            fading_rings=len(rs.starts_ns),
            shares=[round(s, 4) for s in rs.share_list(now_ns)],
            collapsed=t.collapsed,
            folded_changes=folded,
            knob_changes=changes,
            fade_params={
                "duration_s": t.params.duration_ns / 1e9,
                "exponent": t.params.exponent,
                "vnodes": t.params.vnodes,
            },
            build_ms=round((time.perf_counter() - t0) * 1e3, 2),
        )
        before = len(rs.endpoints) - len(t.added) + len(t.removed)
        if before and len(t.removed) > self.drop_warn_share * before:
            self.log.warning(
                "publish_drop",
                generation=gen,
                endpoints_before=before,
                endpoints=len(rs.endpoints),
                removed=len(t.removed),
                share_removed=round(len(t.removed) / before, 4),
                warn_above=self.drop_warn_share,
                removed_endpoints=[s.address for s in t.removed[:20]],
                why="more endpoints left in one publish than --drop-warn-share allows; "
                "published all the same (check the Service, the file or the selector)",
            )
        if not rs.endpoints:
            self.log.warning(
                "publish_empty",
                generation=gen,
                why="the sources report no ready endpoints: every key falls back",
            )
        return True

    def _current_outlier_params(self) -> OutlierParams:
        """The outlier settings in force (an invalid combination keeps the previous ones)."""
        try:
            self._outlier_params = outlier_params(self.knob_values())
        except KnobError as exc:
            self.log.error("outlier_settings_invalid", error=str(exc), action="previous kept")
        return self._outlier_params

    def _outlier_tick(self, now_ns: int) -> None:
        """Judge the published endpoints; publish at once if the ejected set changed."""
        params = self._current_outlier_params()
        eps = self.state.ring_set.endpoints
        self.monitor.align(eps, params.window_intervals)
        totals = self.publisher.counter_totals(eps) if params.enabled and eps else None
        v = self.monitor.evaluate(totals, now_ns, params)
        held = set(v.held_back)
        for a in sorted(held - self._held_back):
            self.log.warning(
                "ejection_held_back",
                **_pod_fields(self.state.meta[a]),
                why=f"at most {params.max_ejection_percent:g} % of the endpoints are ejected "
                "at once (at least one)",
                counts=self.monitor.window_counts(a),
            )
        self._held_back = held
        if v.publish or v.panic != self.published_outlier.panic:
            what = "outlier ejection" if v.ejected else "outlier readmission"
            self._publish(what, now_ns, membership=False)

    def _publish_removals(self, now_ns: int) -> None:
        """Publish the current set less the endpoints the sources no longer have."""
        wanted = self.wanted()
        keep_addresses = {s.address for s in wanted}
        current = self.state.endpoints()
        keep = [s for s in current if s.address in keep_addresses]
        if len(keep) == len(current):
            return
        if self._publish("endpoints removed", now_ns, membership=False, endpoints=keep):
            if self.state.endpoints() == wanted:
                self.debouncer.reset()  # the burst held removals only: nothing left

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        """Run until :meth:`stop`; stops the informers on the way out."""
        started = self.clock()
        next_beat = started
        next_poll = started
        next_judge = started
        self._next_zone = started
        if self.published:
            # Resumed: compare the sources' first full view, and the knobs, with the
            # recovered table (published only if they differ).
            self.debouncer.note(started)
            self._knobs_dirty = True
        # Log "started" before any informer thread can log its first request.
        self.log.info(
            "started",
            sources=sorted(self.sources) + (["configmap"] if self._configmap else []),
            generation=self.publisher.generation,
            knobs=self.knob_values(),
        )
        try:
            for inf in self._informers:
                inf.start()  # inside try: informers already started are stopped below
            while not (self.stop_event.is_set() or self._signalled):
                now = self.clock()
                if self._file is not None and now >= next_poll:
                    with self._long_work("reading the endpoints file"):
                        self._poll_file()
                    next_poll = now + self.file_poll_ns
                if now >= next_beat:
                    self._check_tables(now)
                    self._report_status()
                    self._heartbeat(now)
                    next_beat = now + self.heartbeat_ns
                self._maybe_publish(now, started)
                if self.published and now >= next_judge:
                    self._outlier_tick(now)
                    next_judge = now + self._outlier_params.interval_ns
                if self.published and now >= self._next_zone:
                    self._zone_tick(now)
                    self._next_zone = now + _ZONE_TICK_NS
                wake = [next_beat, next_judge, self._next_zone]
                if self._file is not None:
                    wake.append(next_poll)
                d = self.debouncer.deadline()
                if d is not None and self._all_synced():
                    wake.append(d)
                if self._retry_at is not None:
                    wake.append(self._retry_at)
                for due in (self.fade_due(), self.zones.due_ns()):
                    if due is not None and due > now:
                        wake.append(due)
                if self._configmap and not self._configmap_synced and not self.published:
                    wake.append(started + self.configmap_wait_ns)
                timeout = min(max(min(wake) - self.clock(), 0) / 1e9, _MAX_WAIT_S)
                try:
                    msg = self.inbox.get(timeout=timeout)
                except queue.Empty:
                    continue
                while True:
                    self._handle(msg)
                    try:
                        msg = self.inbox.get_nowait()
                    except queue.Empty:
                        break
        finally:
            self._stop_informers()

    def _check_tables(self, now_ns: int) -> None:
        """Publish again when the tables segments were removed or shrunk under us."""
        check = getattr(self.publisher, "check_tables", None)
        if check is None:
            return
        try:
            why = check()
        except shm.ShmError as exc:
            self._note_problem("tables", f"tables segments lost and not recreated: {exc}")
            self.log.error(
                "tables_unrecoverable", error=str(exc), retry_in_s=self.heartbeat_ns / 1e9
            )
            return
        self._problems.pop("tables", None)
        if why is None:
            return
        self._status_written = None  # a new control segment has no status yet
        self.log.warning(
            "tables_lost",
            why=why,
            generation=self.publisher.generation,
            action="publishing the current table again" if self.published else "none yet",
        )
        if self.published:
            self._publish("tables lost", now_ns, membership=False, force=True)

    @contextlib.contextmanager
    def _long_work(self, what: str) -> Iterator[None]:
        """Keep the heartbeat going from a helper thread while ``what`` runs.

        The master takes a heartbeat older than its stall timeout for a hung process;
        a huge file or table can take longer than that on a loaded host without being
        hung. The helper beats only while the block runs, and for at most
        ``_LONG_WORK_MAX_S``, so a loop that really hangs still stops the heartbeat.
        """
        stop = threading.Event()
        interval = max(self.heartbeat_ns / 1e9, 0.01)

        def beat() -> None:
            deadline = time.monotonic() + _LONG_WORK_MAX_S
            while not stop.wait(interval) and time.monotonic() < deadline:
                try:
                    self.publisher.heartbeat(self.clock())
                except Exception:  # the main thread sees and reports the same fault
                    return

        helper = threading.Thread(target=beat, name="cslb-long-work-heartbeat", daemon=True)
        helper.start()
        try:
            yield
        finally:
            stop.set()
            helper.join()

    def _heartbeat(self, now_ns: int) -> None:
        try:
            self.publisher.heartbeat(now_ns)
        except shm.ShmError as exc:
            # Shrunk between the check and here: the next beat's check recreates it.
            self.log.warning("heartbeat_failed", error=str(exc))

    def _stop_informers(self) -> None:
        """Tell every informer to stop, then wait for them together (not one by one)."""
        for inf in self._informers:
            inf.signal_stop()
        deadline = time.monotonic() + _INFORMER_STOP_WAIT_S
        stuck = [
            type(inf).__name__
            for inf in self._informers
            if not inf.join(max(deadline - time.monotonic(), 0.0))
        ]
        if stuck:
            self.log.warning(
                "informers_not_stopped",
                informers=stuck,
                waited_s=_INFORMER_STOP_WAIT_S,
                action="left behind (daemon threads end with the process)",
            )

    def _note_problem(self, source: str, what: str) -> None:
        """``source`` fails with ``what`` (the start of a run of failures is kept)."""
        since = self._problems[source][1] if source in self._problems else self.clock()
        self._problems[source] = (what, since)

    def status(self) -> tuple[str, int]:
        """What is wrong with the sources now (``""``: nothing) and since when (ns)."""
        problems = dict(self._problems)
        for inf in self._informers:
            p = getattr(inf, "problem", lambda: None)()
            if p is not None:
                problems[type(inf).__name__] = p
        if not problems:
            return "", 0
        text = "; ".join(what for what, _ in problems.values())
        return text, min(since for _, since in problems.values())

    def _report_status(self) -> None:
        text, since = self.status()
        if text != self._status_written:
            self.publisher.set_status(text, since)
            self._status_written = text

    def _handle(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == "endpoints":
            self._on_endpoints(msg[1], msg[2], msg[3])
        elif msg[0] == "configmap":
            self._on_configmap(msg[1], msg[2])
        elif msg[0] == "callers":
            self._on_callers(msg[1], msg[2], msg[3])

    def _maybe_publish(self, now: int, started: int) -> None:
        if self._retry_at is not None and now < self._retry_at:
            return
        if not self.published:
            if self._synced(now, started):
                if self._configmap and not self._configmap_synced:
                    self.log.warning(
                        "configmap_wait_expired",
                        configmap=self._configmap,
                        waited_s=self.configmap_wait_ns / 1e9,
                        action="publishing with flags/environment knobs",
                    )
                self._publish("initial sync", now, membership=True)
            return
        retrying = self._retry_at is not None
        if self._removals_pending and self._all_synced():
            self._removals_pending = False
            self._publish_removals(now)
            if self._retry_at is not None:
                return
        if self._all_synced() and (
            self.debouncer.due(now) or (retrying and self.debouncer.pending)
        ):
            self._publish("endpoints changed", now, membership=True)
        elif self._knobs_dirty or (retrying and not self.debouncer.pending):
            self._publish("knobs changed", now, membership=False)
        else:
            due = self.fade_due()
            if due is not None and now >= due:
                self._publish("fade completed", now, membership=False)

    def fade_due(self) -> int | None:
        """When the oldest fading ring completes (CLOCK_MONOTONIC ns; ``None``: none fades).

        The loop wakes then and publishes the promotion (the ring joins the established
        one), so no reader shows a finished fade as still running.
        """
        rs = self.state.ring_set
        if not self.published or not rs.starts_ns:
            return None
        return min(rs.starts_ns) + rs.duration_ns

    # -- zones ----------------------------------------------------------------------------

    def _zone_settings(self) -> ZoneSettings:
        return ZoneSettings.from_values({**self.knob_values(), "zone": self.caller_zone})

    def _on_callers(self, source: str, view: CallerView, reason: str) -> None:
        if self.zones.set_view(source, view, reason):
            self._next_zone = self.clock()  # decide now, not at the next tick

    def _zone_tick(self, now_ns: int) -> None:
        """Let the zone controller decide on a fresh reading; publish a transition at once."""
        eps = self.state.ring_set.endpoints
        p = self.published_outlier
        skipped = p.state.ejected if not p.panic and p.addresses == eps else None
        window = getattr(self.publisher, "window_latency", None)
        zones = [self.state.meta[a].zone for a in eps]
        curve = self.zones.tick(now_ns, eps, zones, skipped, window, self._zone_settings())
        if curve != self.published_zone:
            self._publish(f"zone {curve.state} ({curve.reason})", now_ns, membership=False)

    def _all_synced(self) -> bool:
        return all(s.synced for s in self.sources.values())
