"""The status page's layout: numeric pod order, zone groups, no overflow, sparklines.

Rendered from real shared memory; laid out by headless Chromium at 1,280 px and at a
phone's 390 × 844, the page refreshing itself in place every second (Chromium's virtual
time runs the refreshes) while a thread records load: no horizontal overflow (the
document's ``scrollWidth`` is its ``clientWidth``), pods in numeric address order within
their zone, and per-pod sparklines drawn from the refreshes. Screenshots go to
``$CSLB_TEST_ARTEFACTS`` (default: the test's temporary directory).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

import lbcore
import shm
from lbcore.ejection import Ejections
from lbcore.outlier import REASON_FAILURE_PERCENTAGE
from tests.app_tests.conftest import ENDPOINTS, ZONES, Host, new_namespace
from tests.app_tests.test_status_page import Tree, serve
from tests.chromium import run_chromium
from workers.surfaces.app import CslbApp
from workers.surfaces.hosts import HostMonitor
from workers.surfaces.status import address_order, render

# Six pods with zones (the conftest's), six more without, numbered so text order differs.
PODS = [*ENDPOINTS, *(f"http://10.9.0.{i}:8080" for i in (10, 11, 12, 20, 100, 7))]
NEW = "http://10.9.1.1:8080"


def test_address_order_is_numeric() -> None:
    addresses = [
        "http://10.2.0.10:8080",
        "http://pod-b.example:80",
        "http://[fd00::2]:8080",
        "http://10.2.0.1:9090",
        "http://10.2.0.9:8080",
        "http://10.2.0.1:8080",
        "http://[fd00::10]:8080",
        "http://192.168.0.1:80",
        "http://[fd00::2]:80",
        "not a url ::::",
    ]
    got = sorted(addresses, key=address_order)
    assert got[:5] == [
        "http://10.2.0.1:8080",
        "http://10.2.0.1:9090",
        "http://10.2.0.9:8080",
        "http://10.2.0.10:8080",
        "http://192.168.0.1:80",
    ]
    assert got[5:8] == ["http://[fd00::2]:80", "http://[fd00::2]:8080", "http://[fd00::10]:8080"]
    assert got[8] == "http://pod-b.example:80"


def _rows(tree: Tree) -> list[Any]:
    return [r for r in tree.by_class("pod") if r.tag == "tr"]


def _publish(host: Host, **kw: Any) -> None:
    e = Ejections.none(len(PODS) + 1)
    reason, until, counts = e.reason.copy(), e.until_ns.copy(), e.counts.copy()
    reason[3] = REASON_FAILURE_PERCENTAGE  # a long reason: it wraps, it does not overflow
    until[3] = time.monotonic_ns() + 300 * 10**9
    counts[3] = [12, 30, 7]
    state = Ejections.of(reason, until, e.multiplier, e.decay_ns, counts)
    host.publish(
        PODS,
        fading=[([NEW], 39.4)],  # a finished fade the publisher has not promoted yet
        knobs=shm.Knobs(balance_factor=1.25),
        ejections=state,
        **kw,
    )


def _expected_order() -> list[str]:
    zone_of = dict(zip(ENDPOINTS, ZONES, strict=True))
    every = [*PODS, NEW]
    return sorted(
        every, key=lambda a: (zone_of.get(a, "") == "", zone_of.get(a, ""), address_order(a))
    )


def test_pods_in_numeric_order_grouped_by_zone(host: Host) -> None:
    _publish(host)
    tree = Tree(render(HostMonitor(host.namespace).snapshot()))
    assert [r.attrs["data-endpoint"] for r in _rows(tree)] == _expected_order()
    zones = [z for z in tree.by_class("zone") if z.tag == "tr"]
    assert [z.attrs["data-zone"] for z in zones] == ["eu-1a", "eu-1b", "eu-1c", ""]
    assert [z.find_all(lambda e: e.tag == "b")[0].all_text() for z in zones[:2]] == [
        "eu-1a",
        "eu-1b",
    ]
    assert "· 2 pods · occupancy" in zones[0].all_text()
    assert "· 7 pods · occupancy" in zones[-1].all_text() and "no zone" in zones[-1].all_text()


def test_no_zone_rows_without_zones() -> None:
    ns_host = Host(new_namespace())
    try:
        ns_host.writer.publish(lbcore.RingSet(["http://10.0.0.10:80", "http://10.0.0.9:80"]))
        tree = Tree(render(HostMonitor(ns_host.namespace).snapshot()))
    finally:
        ns_host.close()
    assert tree.by_class("zone") == []
    assert [r.attrs["data-endpoint"] for r in _rows(tree)] == [
        "http://10.0.0.9:80",
        "http://10.0.0.10:80",
    ]


# --------------------------------------------------------------------------------------
# Laid out by Chromium, refreshing itself.

# Appended by the test (with the page's CSP taken out, so it may run): after a few of
# the page's own refreshes, writes what it measured onto <body> (the refreshes swap
# <main>, never <body>).
MEASURE = """<script>
setTimeout(() => {
  const d = document.documentElement, b = window.parent.document.body;
  b.dataset.scrollW = d.scrollWidth;
  b.dataset.clientW = d.clientWidth;
  b.dataset.order = [...document.querySelectorAll('tr.pod')].map(t => t.dataset.endpoint).join(' ');
  b.dataset.occupancySparks = [...document.querySelectorAll('svg.spark.occupancy')]
    .filter(s => +s.dataset.points >= 3).length;
  b.dataset.rateSparks = [...document.querySelectorAll('svg.spark.rate')]
    .filter(s => +s.dataset.points >= 2).length;
  b.dataset.pods = document.querySelectorAll('tr.pod').length;
  b.dataset.over = [...document.querySelectorAll('main *')]
    .filter(e => e.getBoundingClientRect().right > d.clientWidth + 0.5)
    .map(e => e.tagName + '.' + e.className).slice(0, 5).join(' ');
}, 4500);
</script>"""

CSP = re.compile(rb'<meta http-equiv="Content-Security-Policy"[^>]*>')


def framed(app: Callable[..., Iterable[bytes]], measure: bool) -> Callable[..., Iterable[bytes]]:
    """``app``, plus ``/frame?w=W&h=H``: /status in a W × H iframe (a phone's viewport:
    headless Chromium's window is at least 500 px wide); with ``measure``, the measuring
    script added to /status (and its CSP removed so that it may run)."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ["PATH_INFO"] == "/frame":
            w, h = re.fullmatch(r"w=(\d+)&h=(\d+)", environ["QUERY_STRING"]).groups()
            page = (
                '<!DOCTYPE html><html><body style="margin:0">'
                f'<iframe src="/status?refresh=1" width="{w}" height="{h}" '
                'style="border:0;display:block"></iframe></body></html>'
            ).encode()
            headers = [("Content-Type", "text/html"), ("Content-Length", str(len(page)))]
            start_response("200 OK", headers)
            return [page]
        got: dict[str, Any] = {}

        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            got.update(status=status, headers=headers)

        body = b"".join(app(environ, keep))
        if measure and environ["PATH_INFO"] == "/status":
            body = CSP.sub(b"", body).replace(b"</body>", MEASURE.encode() + b"</body>")
        headers = [(k, v) for k, v in got["headers"] if k.lower() != "content-length"]
        start_response(got["status"], [*headers, ("Content-Length", str(len(body)))])
        return [body]

    return wrapped


def chromium(url: str, size: tuple[int, int], tmp_path: Path, *extra: str) -> str:
    return run_chromium(
        # the page's refreshes run in virtual time
        ["--hide-scrollbars", "--virtual-time-budget=6000", *extra, url],
        tmp_path / f"profile-{size[0]}",
        size=size,
        timeout_s=120,
    )


def artefacts(tmp_path: Path) -> Path:
    d = Path(os.environ.get("CSLB_TEST_ARTEFACTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.mark.parametrize("size", [(1280, 900), (390, 844)], ids=["1280px", "phone"])
def test_fits_and_draws_sparklines_in_chromium(
    size: tuple[int, int], host: Host, tmp_path: Path
) -> None:
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        from tests.tools import need

        need("chromium", "chromium-browser")  # skips, or fails under CSLB_REQUIRE_TOOLS=1
    _publish(host)
    stop = threading.Event()

    def load() -> None:  # calls ending all the time, so the request rates move
        i = 0
        while not stop.wait(0.02):
            host.busy(PODS[i % len(PODS)], 0.05, calls=5, ago_s=1.0)
            host.writer.heartbeat()
            i += 1

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    app = CslbApp(host.namespace)
    shot = artefacts(tmp_path) / f"status-{size[0]}x{size[1]}.png"
    window = (max(size[0], 500), size[1])
    try:
        for measure in (True, False):
            with serve(framed(app, measure)) as base:
                url = f"{base}/frame?w={size[0]}&h={size[1]}"
                if measure:
                    dom = chromium(url, window, tmp_path, "--dump-dom")
                else:
                    chromium(url, window, tmp_path, f"--screenshot={shot}")
    finally:
        stop.set()
        loader.join(10)
        app.close()
    (body,) = Tree(dom).root.find_all(lambda e: e.tag == "body")
    b = body.attrs
    assert "data-scroll-w" in b, dom[-2000:]
    assert int(b["data-client-w"]) == size[0]
    assert int(b["data-scroll-w"]) <= int(b["data-client-w"]), b.get("data-over")
    assert b["data-over"] == ""
    assert b["data-order"].split() == _expected_order()
    pods = int(b["data-pods"])
    assert pods == len(PODS) + 1
    assert int(b["data-occupancy-sparks"]) == pods  # every pod, from 3+ refreshes
    assert int(b["data-rate-sparks"]) == pods
    assert shot.stat().st_size > 10_000
