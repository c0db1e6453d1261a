"""The callers' side of pod-reported load, with real HTTP pods on 127.0.0.1 and real shm.

The senders read ``endpoint-load-metrics`` and ``Server-Timing`` (CurlSender from
libcurl's header block, urllib3 and httpx from their header pairs); the pod's own
service time becomes the recorded busy time; each pod's latest report lands in the
worker's counter row; malformed headers never fail a call, are counted and logged once
per pod; with ``CSLB_LOAD_REPORTS=off`` nothing is read or stored. The discovery
process's refresher asks the pods' load-only path for reports that are due.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import lbcore
import shm
from discovery.loadrefresh import BACKOFF_REFRESHES, LoadRefresher
from lbcore.report_settings import ReportSettings
from lbcore.reported import KIND_NONE, KIND_OCCUPANCY, KIND_UTILIZATION, pod_identity
from shm.names import unlink_name
from workers.fanout import curl_transport
from workers.fanout.senders import CurlSender, HttpxSender, Urllib3Sender
from workers.fanout.settings import FanoutSettings
from workers.routing import reported
from workers.routing.router import Router

SLEEP_S = 0.03  # what each pod really takes
REPORTED_MS = 1.0  # what its Server-Timing says


class Pods:
    """HTTP/1.1 pods in threads of this process; ``headers[i]``: extra headers of pod i."""

    def __init__(self, n: int) -> None:
        self.headers: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        self.paths: list[str] = []
        self.servers: list[ThreadingHTTPServer] = []
        pods = self

        for i in range(n):

            class Handler(BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.1"
                disable_nagle_algorithm = True
                index = i

                def log_message(self, *args: object) -> None:
                    pass

                def do_GET(self) -> None:
                    pods.paths.append(self.path)
                    if not self.path.startswith("/.well-known/"):
                        time.sleep(SLEEP_S)
                    body = b'"ok"'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    for name, value in pods.headers[self.index]:
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)

            s = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            s.daemon_threads = True
            threading.Thread(target=s.serve_forever, daemon=True).start()
            self.servers.append(s)
        self.urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in self.servers]

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()


def report(occupancy: float, util: float) -> list[tuple[str, str]]:
    return [
        (
            "endpoint-load-metrics",
            f"TEXT application_utilization={util}, rps_fractional=10, "
            f"named_metrics.occupancy={occupancy}",
        ),
        ("Server-Timing", f"app;dur={REPORTED_MS}"),
    ]


def _reset_settings() -> None:
    reported.report_settings.cache_clear()
    curl_transport.forget_reactors()  # (this thread's transport is made anew)


@pytest.fixture(params=[True, False], ids=["reports-on", "reports-off"])
def reports(request, monkeypatch) -> Iterator[bool]:
    monkeypatch.setenv("CSLB_LOAD_REPORTS", "on" if request.param else "off")
    _reset_settings()
    yield request.param
    monkeypatch.delenv("CSLB_LOAD_REPORTS")
    _reset_settings()


@pytest.fixture
def pods() -> Iterator[Pods]:
    p = Pods(3)
    for i in range(3):
        p.headers[i] = report(0.5 + i, 0.1 * (i + 1))
    yield p
    p.close()


@pytest.fixture
def host(pods: Pods) -> Iterator[tuple[str, Router]]:
    ns = f"trep{uuid.uuid4().hex[:10]}"
    store = shm.CounterStore.create(ns, rows=8)
    writer = shm.TableWriter(ns, counters=store)
    writer.publish(lbcore.RingSet(pods.urls), knobs=shm.Knobs())
    router = Router(ns, fanout_settings=FanoutSettings(timeout_s=5.0))
    try:
        yield ns, router
    finally:
        router.close()
        writer.close()
        store.close()
        for name in shm.list_segments(ns):
            unlink_name(name)


KEYS = [f"K{i}" for i in range(60)]


def _fanout(router: Router, kind: str) -> None:
    if kind == "curl":
        results = router.fanout(KEYS, CurlSender())
    elif kind == "urllib3":
        results = router.fanout(KEYS, Urllib3Sender())
    else:

        async def go() -> list:
            sender = HttpxSender()
            try:
                return await router.afanout(KEYS, sender)
            finally:
                await sender.aclose()

        results = asyncio.run(go())
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    router.call_ledger.flush()


def _stored(ns: str, urls: list[str]) -> tuple[object, np.ndarray, shm.HostLoads]:
    t = shm.TableReader(ns).table()
    reader = shm.CounterReader(ns)
    now = time.monotonic_ns()
    state, util = reader.reports(now, 30_000_000_000, t.n_slots)
    slots = [t.slots[t.endpoints.index(u)] for u in urls]
    loads = reader.read(now, t.n_slots).take(slots)
    return state.take(slots), util[slots], loads


@pytest.mark.parametrize("sender", ["curl", "urllib3", "httpx"])
def test_senders_store_reports_and_record_the_pods_service_time(reports, pods, host, sender):
    ns, router = host
    _fanout(router, sender)
    state, util, loads = _stored(ns, pods.urls)
    latency_ms = loads.mean_latency_s * 1e3
    if not reports:
        assert (state.kind == KIND_NONE).all()  # nothing read, nothing stored
        assert (latency_ms >= SLEEP_S * 1e3 * 0.9).all()  # the caller's own clock
        return
    assert (state.kind == KIND_OCCUPANCY).all()
    np.testing.assert_allclose(state.value, [0.5, 1.5, 2.5])
    np.testing.assert_allclose(util, [0.1, 0.2, 0.3])
    assert state.identity.tolist() == [pod_identity(u) for u in pods.urls]
    # The recorded busy time is the pod's Server-Timing, not the 30 ms on the wire.
    assert (latency_ms < REPORTED_MS * 3).all(), latency_ms


def test_a_changed_report_replaces_the_stored_one(reports, pods, host):
    if not reports:
        pytest.skip("reports on only")
    ns, router = host
    _fanout(router, "curl")
    pods.headers[0] = [("endpoint-load-metrics", "TEXT application_utilization=0.7")]
    _fanout(router, "curl")
    state, _, _ = _stored(ns, pods.urls)
    assert state.kind[0] == KIND_UTILIZATION and state.value[0] == pytest.approx(0.7)


@pytest.mark.parametrize("sender", ["curl", "urllib3"])
def test_malformed_headers_never_fail_a_call_and_are_counted_and_logged_once(
    reports, pods, host, sender, caplog
):
    ns, router = host
    pods.headers[1] = [
        ("endpoint-load-metrics", "TEXT application_utilization=NaN"),
        ("Server-Timing", "app;dur=-5"),
    ]
    caplog.set_level(logging.WARNING, logger="cslb.router")
    for _ in range(3):
        _fanout(router, sender)  # every call answered: nothing raised into a call
    stats = shm.CounterReader(ns).stats()
    lines = [r.getMessage() for r in caplog.records if "malformed load report" in r.getMessage()]
    if not reports:
        assert stats["reports_malformed"] == 0 and not lines
        return
    calls = sum(1 for p in pods.paths if p.startswith("/K"))
    assert 0 < stats["reports_malformed"] <= calls
    assert len(lines) == 1 and pods.urls[1] in lines[0], lines
    state, _, _ = _stored(ns, pods.urls)
    assert state.kind[1] == KIND_NONE and state.kind[0] == KIND_OCCUPANCY


def test_hostile_header_blocks_never_raise():
    from workers.fanout.reports import BlockReader

    read = BlockReader()
    for block in (
        b"",
        b"\x00" * 100,
        b"HTTP/1.1 200 OK\r\nendpoint-load-metrics: " + b"x" * 70_000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nendpoint-load-metrics: TEXT a=1\r\nendpoint-load-metrics: "
        b"TEXT a=2\r\n\r\n",
        b'HTTP/1.1 200 OK\r\nendpoint-load-metrics: JSON {"named_metrics": {"occupancy": '
        b"1e999}}\r\nServer-Timing: app;dur=inf\r\n\r\n",
        "HTTP/1.1 200 OK\r\nServer-Timing: app;dur=\u00e91\r\n\r\n".encode("utf-8"),
    ):
        got = read(block)
        assert got.report is None


# ---- the discovery process's refresher ------------------------------------------------


def test_the_refresher_asks_the_load_only_path_of_pods_whose_reports_are_due(pods, host):
    ns, _ = host
    now = [time.monotonic_ns()]
    settings = ReportSettings(enabled=True, refresh_ns=1_000_000_000, expiry_ns=5_000_000_000)
    r = LoadRefresher(ns, settings, clock=lambda: now[0])
    try:
        assert r.round() == 3  # none stored yet: every pod asked
        assert sum(p.startswith("/.well-known/cslb/load") for p in pods.paths) == 3
        state, _, _ = _stored(ns, pods.urls)
        np.testing.assert_allclose(state.value, [0.5, 1.5, 2.5])
        assert r.round() == 0  # fresh: nobody asked
        now[0] += 1_000_000_000
        pods.headers[2] = [("Content-Language", "en")]  # pod 2 stopped reporting
        assert r.round() == 2
        # Pod 2 gave nothing usable: left alone for BACKOFF_REFRESHES intervals, while
        # the others are asked every interval.
        asked = sum(p.startswith("/.well-known/cslb/load") for p in pods.paths)
        now[0] += 1_000_000_000
        assert r.round() == 2
        assert sum(p.startswith("/.well-known/cslb/load") for p in pods.paths) == asked + 2
        now[0] += BACKOFF_REFRESHES * 1_000_000_000
        assert r.round() == 2
        assert sum(p.startswith("/.well-known/cslb/load") for p in pods.paths) == asked + 5
    finally:
        r.stop()
    # The refresher's row was given back: only the router's is still claimed.
    assert [s.row for s in shm.CounterStore.attach(ns).slots() if s.claimed] == [0]
