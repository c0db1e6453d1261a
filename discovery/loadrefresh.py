"""Refreshing the pods' load reports from the discovery process (``CSLB_LOAD_REPORTS=on``).

Every answer a worker gets carries its pod's load report, and the workers store them in
their counter rows (:mod:`shm.counters.reports`). A pod whose keys all moved away gets
no calls and so no reports: its last one, high, would keep its keys away until it
expires. The discovery process, the host's one writer, therefore asks every pod whose
latest report is older than ``CSLB_LOAD_REPORT_REFRESH`` (or that has none) for a new
one on the pods' load-only path (:data:`lbwire.orca.LOAD_PATH`, answered by the serving
middleware without calling the app), and stores the answers in a counter row of its
own, where the workers read them like their own. A pod that cooled down so gets its
keys back within a refresh, not at expiry.

Bounded: at most :data:`CONCURRENCY` requests at once, each with a short timeout
(:data:`TIMEOUT_S`), at most :data:`MAX_PER_ROUND` pods per round, one round every
quarter of the refresh interval. A pod that does not answer, answers an error status or
sends no usable report (malformed ones are counted as the workers count theirs) is not
asked again for :data:`BACKOFF_REFRESHES` refresh intervals: a fleet whose pods do not
run the middleware costs each host one request per pod per that many intervals, not
one per round. The settings are read from the environment, which the
discovery process shares with the workers of its host (the gunicorn master starts
both); a discovery sidecar needs the same ``CSLB_LOAD_REPORT*`` values as the workers.
"""

from __future__ import annotations

import http.client
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any
from urllib.parse import urlsplit

import numpy as np

import shm
from lbcore.report_settings import ReportSettings
from lbcore.reported import KIND_NONE, pod_identity, refresh_due, report_value
from lbwire.orca import LOAD_PATH, ResponseLoad, parse_response_headers

__all__ = ["CONCURRENCY", "MAX_PER_ROUND", "TIMEOUT_S", "LoadRefresher", "fetch_report"]

log = logging.getLogger("cslb.discovery")

#: Load-only requests in flight at once.
CONCURRENCY = 8
#: Timeout of one load-only request (connect and answer), seconds.
TIMEOUT_S = 0.5
#: Most pods asked per round (the rest wait for the next round, oldest report first).
MAX_PER_ROUND = 256
# Largest load-only answer body read (bytes): the report is in the headers.
_MAX_BODY = 65536


#: Refresh intervals a pod that gave no usable answer is left alone.
BACKOFF_REFRESHES = 4


def fetch_report(url: str, path: str = LOAD_PATH, timeout_s: float = TIMEOUT_S) -> ResponseLoad:
    """``GET <url><path>``: what the answer's load headers say.

    Raises
    ------
    OSError, http.client.HTTPException
        No answer, or an error status (the message says which).
    """
    parts = urlsplit(url if "://" in url else f"http://{url}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    if parts.hostname is None:
        raise OSError(f"no host in endpoint address {url!r}")
    conn = cls(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        r = conn.getresponse()
        r.read(_MAX_BODY)
        if r.status != 200:
            raise http.client.HTTPException(f"{url}{path}: HTTP {r.status}")
        return parse_response_headers(r.getheaders())
    finally:
        conn.close()


class LoadRefresher:
    """The discovery process's thread that keeps the pods' reports fresh.

    Parameters
    ----------
    namespace
        The host's shared-memory namespace (tables and counters).
    settings
        The report settings (``enabled`` false: :meth:`start` does nothing).
    path
        The pods' load-only path.
    fetch
        ``fetch(url, path, timeout_s) -> ResponseLoad`` (tests pass their own).
    clock
        CLOCK_MONOTONIC nanoseconds.
    """

    def __init__(
        self,
        namespace: str,
        settings: ReportSettings,
        *,
        path: str = LOAD_PATH,
        fetch: Callable[[str, str, float], ResponseLoad] = fetch_report,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.namespace = namespace
        self.settings = settings
        self.path = path
        self._fetch = fetch
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tables: shm.TableReader | None = None
        self._store: shm.CounterStore | None = None
        self._row: shm.Recorder | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.rounds = 0
        self.refreshed = 0
        self._unanswered: dict[str, int] = {}  # endpoint -> when it last gave nothing usable

    def start(self) -> None:
        """Run rounds in a daemon thread until :meth:`stop` (nothing with reports off)."""
        if not self.settings.enabled or self._thread is not None:
            return
        self._pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="cslb-load-refresh")
        self._thread = threading.Thread(target=self._run, name="cslb-load-refresh", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, give the counter row back, drop the mappings."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._detach()

    def _run(self) -> None:
        interval = max(self.settings.refresh_ns / 4e9, 0.05)
        while not self._stop.wait(interval):
            try:
                self.round()
            except shm.ShmError as exc:  # counters or tables replaced, shrunk, removed
                log.debug("load refresh: shared memory unusable now (%s); attaching again", exc)
                self._detach()
            except Exception:  # a bug here must not stop discovery's publishing
                log.exception("load refresh round failed")
                self._detach()

    def _detach(self) -> None:
        row, self._row = self._row, None
        if row is not None:
            try:
                row.release()
            except shm.ShmError:
                pass
        for res in (self._store, self._tables):
            if res is not None:
                try:
                    res.close() if isinstance(res, shm.TableReader) else res.close(unlink=False)
                except shm.ShmError:
                    pass
        self._store = self._tables = None

    def _attach(self) -> bool:
        if self._store is not None and self._store.replaced():
            self._detach()
        try:
            if self._tables is None:
                self._tables = shm.TableReader(self.namespace)
            if self._store is None:
                self._store = shm.CounterStore.attach(self.namespace, writable=True)
            if self._row is None:
                self._row = self._store.claim()
        except shm.SegmentMissingError:
            return False  # (no tables or no counters yet: the next round)
        return True

    def round(self) -> int:
        """One round: ask the pods whose reports are due, store the answers; how many."""
        if not self._attach():
            return 0
        assert self._tables is not None and self._store is not None and self._row is not None
        table = self._tables.table()
        eps = tuple(table.endpoints)
        if not eps:
            return 0
        slots = np.array(table.slots, np.intp)
        if not table.valid():
            return 0
        s = self.settings
        now = self._clock()
        state, _ = self._store.reader().reports(now, s.expiry_ns, table.n_slots)
        if slots.size and int(slots.max()) >= state.value.size:
            return 0
        st = state.take(slots)
        ids = np.fromiter((pod_identity(e) for e in eps), np.uint64, len(eps))
        st.kind[st.identity != ids] = KIND_NONE  # another pod's report: none of this one's
        due = np.flatnonzero(refresh_due(st, now, s.refresh_ns))
        backoff = BACKOFF_REFRESHES * s.refresh_ns
        quiet = self._unanswered = {
            e: t for e, t in self._unanswered.items() if e in eps and now - t < backoff
        }
        due = np.array([i for i in due.tolist() if eps[i] not in quiet], np.intp)
        if due.size == 0:
            return 0
        due = due[np.argsort(st.at_ns[due], kind="stable")][:MAX_PER_ROUND]
        got = self._ask([eps[i] for i in due.tolist()])
        out: dict[int, tuple[float, float, int, int]] = {}
        malformed = 0
        for i, load in zip(due.tolist(), got, strict=True):
            quiet[eps[i]] = now  # until a usable report says otherwise
            if load is None:
                continue
            if load.malformed:
                malformed += 1
                log.debug("malformed load report from %s: %s", eps[i], load.malformed)
            r = load.report
            if r is None:
                continue
            value, kind = report_value(r.occupancy, r.application_utilization)
            if kind == KIND_NONE:
                continue
            del quiet[eps[i]]
            u = r.application_utilization
            out[int(slots[i])] = (value, math.nan if u is None else u, kind, int(ids[i]))
        if malformed:
            self._row.tally("reports_malformed", malformed)
        if out:
            v = list(out.values())
            self._row.record_reports(
                list(out),
                [x[0] for x in v],
                [x[1] for x in v],
                [x[2] for x in v],
                [x[3] for x in v],
                self._clock(),
                s.expiry_ns,
            )
        self.rounds += 1
        self.refreshed += len(out)
        return len(out)

    def _ask(self, urls: list[str]) -> list[ResponseLoad | None]:
        """Each pod's answer (``None``: none in time), :data:`CONCURRENCY` at a time."""
        pool = self._pool
        if pool is None:
            pool = self._pool = ThreadPoolExecutor(CONCURRENCY)
        futures = [pool.submit(self._fetch, u, self.path, TIMEOUT_S) for u in urls]
        # Every request is bounded by its timeout; the round by all of them in waves.
        wait(futures, timeout=TIMEOUT_S * (len(urls) // CONCURRENCY + 2))
        out: list[ResponseLoad | None] = []
        for f in futures:
            out.append(_result(f))
        return out


def _result(f: Any) -> ResponseLoad | None:
    if not f.done():
        f.cancel()
        return None
    try:
        return f.result()
    except Exception:  # no answer, an error status: skipped until the next round
        return None
