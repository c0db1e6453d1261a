"""Pod-reported load across two cslb hosts, with real processes on 127.0.0.1.

Five product pods under the serving middleware (``gunicorn -k gthread``, 2 workers of 8
threads each: a pod with room, so one that other callers keep busy still answers cslb's
calls at once), two cslb services (``gunicorn -c python:workers.gunicorn_conf``, each its
own shared-memory namespace: two "hosts") fanning keys out to them with CurlSender, and
a load generator that bypasses cslb and keeps one pod busy.

* reports on: both services move that pod's keys away within blackout + one refresh
  (plus the pod's own measuring window);
* reports off: they do not (the pod answers them as fast as before: their own view
  shows nothing);
* a healthy, equal fleet with reports on: bounded load moves at most 2 % of decisions
  (the pods' ports are chosen so their key shares are equal: see :func:`equal_ports`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import lbcore
from discovery.loadrefresh import fetch_report
from tests.gunicorn_harness import REPO, Server, free_port, unique_namespace, wait_for
from tests.json_http import post_fanout

# The pods' occupancy window (their report) and the callers' report knobs, short.
POD_ENV = {"CSLB_POD_REPORT_REFRESH": "0.05"}
BLACKOUT_S, REFRESH_S, EXPIRY_S = 1.0, 0.5, 5.0
SERVICE_ENV = {
    "CSLB_LOAD_REPORT_BLACKOUT": str(BLACKOUT_S),
    "CSLB_LOAD_REPORT_REFRESH": str(REFRESH_S),
    "CSLB_LOAD_REPORT_EXPIRY": str(EXPIRY_S),
    "CSLB_LOAD_REFRESH": "0.05",
    "CSLB_DEBOUNCE": "0.2",
    "CSLB_FADE_DURATION": "0",
    "CSLB_FANOUT_TIMEOUT": "2",
}
POOL = [f"SKU-{i:05d}" for i in range(3000)]
HOT = 2  # the pod the load generator keeps busy


def _get(port: int, path: str, timeout: float = 5.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def equal_ports(n: int, spread: float = 0.08, tries: int = 500) -> list[int]:
    """``n`` free ports whose pods get each within ``spread`` of an equal share of POOL.

    Consistent hashing gives 5 pods of 100 virtual nodes key shares up to 1.2x the mean
    or more, which bounded load (balance factor 1.25) answers under any load signal. An
    equal fleet is equal in work: what moves keys on it is the signal's noise.
    """
    keys = lbcore.hash_keys([k.encode() for k in POOL])
    for _ in range(tries):
        ports = [free_port() for _ in range(n)]
        if len(set(ports)) < n:
            continue
        owners = lbcore.RingSet([f"http://127.0.0.1:{p}" for p in ports]).rings[0].lookup(
            keys, hashes=keys
        )
        share = np.bincount(np.asarray(owners), minlength=n) / len(POOL) * n
        if share.max() <= 1 + spread and share.min() >= 1 - spread:
            return ports
    raise AssertionError(f"no {n} free ports with key shares within {spread:.0%} in {tries} tries")


@contextlib.contextmanager
def pods(n: int, tmp: Path) -> Iterator[list[str]]:
    """``n`` serving pods (:func:`equal_ports`); stopped by PID (SIGTERM, then SIGKILL)."""
    env = {
        k: v
        for k, v in __import__("os").environ.items()
        if not k.startswith(("CSLB_", "GUNICORN_"))
    }
    env.update(POD_ENV)
    env["PYTHONPATH"] = str(REPO)
    procs: list[tuple[subprocess.Popen, int]] = []
    try:
        for i, port in enumerate(equal_ports(n)):
            log = open(tmp / f"pod-{i}.log", "wb")
            p = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "-b",
                    f"127.0.0.1:{port}",
                    "-w",
                    "2",
                    "-k",
                    "gthread",
                    "--threads",
                    "8",
                    "--timeout",
                    "60",
                    "tests.gunicorn_apps.servingpod:app",
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            log.close()
            procs.append((p, port))
        for _, port in procs:
            wait_for("a pod to answer", lambda port=port: _get(port, "/ping", 2.0) == 200, 30.0)
        yield [f"http://127.0.0.1:{port}" for _, port in procs]
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, _ in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@contextlib.contextmanager
def service(tmp: Path, urls: list[str], reports: bool, tag: str) -> Iterator[Server]:
    eps = tmp / f"endpoints-{tag}.json"
    eps.write_text(json.dumps({"endpoints": [{"address": u} for u in urls]}))
    server = Server(
        ["-c", "python:workers.gunicorn_conf", "--timeout", "30", "-w", "2", "fanoutapp:app"],
        tmp_path=tmp,
        namespace=unique_namespace("r"),
        env={
            **SERVICE_ENV,
            "CSLB_LOAD_REPORTS": "on" if reports else "off",
            "CSLB_ENDPOINTS_FILE": str(eps),
        },
        gunicorn=True,
    )
    try:
        server.wait_ready(workers=2, path="/metrics")
        yield server
    finally:
        server.kill()


class Traffic:
    """One client thread per service posting 100 keys per request: (time, endpoints)."""

    def __init__(self, servers: list[Server], max_s: float = 90.0) -> None:
        self.seen: list[list[tuple[float, list[str | None]]]] = [[] for _ in servers]
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._end = time.monotonic() + max_s
        self._threads = [
            threading.Thread(target=self._run, args=(i, s.port), daemon=True)
            for i, s in enumerate(servers)
        ]
        for t in self._threads:
            t.start()

    def _run(self, i: int, port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for j in range(100_000):
            if self._stop.is_set() or time.monotonic() > self._end:
                break
            off = (j * 101) % (len(POOL) - 100)
            try:
                doc = json.loads(post_fanout(conn, POOL[off : off + 100]))
            except (OSError, http.client.HTTPException, ValueError) as exc:
                self.errors.append(repr(exc))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                time.sleep(0.05)
                continue
            self.seen[i].append((time.monotonic(), [r["endpoint"] for r in doc["results"]]))
            time.sleep(0.01)
        conn.close()

    def share(self, i: int, url: str, since: float) -> tuple[float, int]:
        """Share of service ``i``'s keys sent to ``url`` since ``since``, and the keys."""
        got = [e for t, eps in list(self.seen[i]) if t >= since for e in eps]
        return (sum(e == url for e in got) / len(got) if got else 0.0), len(got)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)


class Hot:
    """Threads keeping one pod busy with slow requests of its own, bypassing cslb."""

    def __init__(self, url: str, threads: int = 6, max_s: float = 90.0) -> None:
        self.port = int(url.rsplit(":", 1)[1])
        self._stop = threading.Event()
        self._end = time.monotonic() + max_s
        self.sent = 0
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        for _ in range(100_000):
            if self._stop.is_set() or time.monotonic() > self._end:
                break
            try:
                conn.request("GET", "/sleep?s=0.05")
                conn.getresponse().read()
                self.sent += 1
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.close()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)


def wait_cool(urls: list[str], timeout_s: float = 30.0) -> None:
    """Wait until no pod reports much more occupancy than the others (a test's hot pod
    before it cooled down would move keys in the next test)."""

    def cool() -> bool:
        occ = [fetch_report(u, timeout_s=2.0).report for u in urls]
        vals = sorted(r.occupancy or 0.0 for r in occ if r is not None)
        return len(vals) == len(urls) and vals[-1] <= 1.5 * vals[len(vals) // 2] + 0.05

    wait_for("the pods to cool down", cool, timeout_s, 0.5)


def _metric_sum(server: Server, name: str) -> float:
    status, body = server.request("GET", "/metrics")
    assert status == 200
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _metric_lines(server: Server, name: str) -> list[str]:
    status, body = server.request("GET", "/metrics")
    assert status == 200
    return [line for line in body.decode().splitlines() if line.startswith(name + "{")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[tuple[Path, list[str]]]:
    tmp = tmp_path_factory.mktemp("reports")
    with pods(5, tmp) as urls:
        yield tmp, urls


def _hot_pod_run(tmp: Path, urls: list[str], reports: bool) -> list[tuple[float, int]]:
    """Shares of the hot pod's keys per service: before, and after the load began."""
    hot_url = urls[HOT]
    wait_cool(urls)
    with service(tmp, urls, reports, "a") as a, service(tmp, urls, reports, "b") as b:
        traffic = Traffic([a, b])
        hot: Hot | None = None
        try:
            # Both services route and call every pod (and, reports on, hear from all).
            t0 = time.monotonic()
            wait_for(
                "both services to route keys to every pod",
                lambda: all(traffic.share(i, hot_url, t0)[1] >= 2000 for i in (0, 1)),
                30.0,
                0.1,
            )
            time.sleep(BLACKOUT_S + 0.5)  # every pod past its blackout
            before = [traffic.share(i, hot_url, time.monotonic() - 1.0) for i in (0, 1)]
            hot = Hot(hot_url)
            started = time.monotonic()
            # Blackout + one refresh + the pod's window (its report rising) + slack.
            limit = BLACKOUT_S + REFRESH_S + 1.0 + 4.0
            if reports:

                def moved() -> bool:
                    since = time.monotonic() - 0.5
                    return all(
                        traffic.share(i, hot_url, since)[0] < 0.02
                        and traffic.share(i, hot_url, since)[1] >= 200
                        for i in (0, 1)
                    )

                wait_for("both services to move the hot pod's keys away", moved, limit, 0.1)
                took = time.monotonic() - started
                assert took <= limit
                # It stays away while it is hot (refreshes keep its report fresh)...
                time.sleep(EXPIRY_S + 1.0)
                for i in (0, 1):
                    share, n = traffic.share(i, hot_url, time.monotonic() - EXPIRY_S)
                    assert n >= 200 and share < 0.05, (i, share, n)
                for srv in (a, b):
                    src = [ln for ln in _metric_lines(srv, "cslb_endpoint_load_source")
                           if 'source="reported"' in ln]
                    assert sum(float(ln.rsplit(" ", 1)[1]) for ln in src) >= 4, src
                    util = _metric_lines(srv, "cslb_endpoint_reported_utilization")
                    assert any(hot_url in ln for ln in util), util
                # ... and gets its keys back once it cooled down: within a refresh and
                # the pod's window (plus slack), not at expiry.
                hot.stop()
                cooled = time.monotonic()

                def back() -> bool:
                    since = time.monotonic() - 0.5
                    return all(traffic.share(i, hot_url, since)[0] > 0.05 for i in (0, 1))

                wait_for("the cooled pod to get its keys back", back, EXPIRY_S + 5.0, 0.1)
                took_back = time.monotonic() - cooled
                return [*before, (took, 0), (took_back, 0)]
            time.sleep(limit)
            after = [traffic.share(i, hot_url, time.monotonic() - 2.0) for i in (0, 1)]
            return [*before, *after]
        finally:
            if hot is not None:
                hot.stop()
            traffic.stop()


def test_reports_on_both_hosts_move_a_pod_hot_from_other_callers(fleet):
    tmp, urls = fleet
    got = _hot_pod_run(tmp, urls, reports=True)
    before = got[:2]
    for share, n in before:
        assert n >= 200 and share > 0.05, before  # it had keys before
    print(f"moved away in {got[2][0]:.2f} s, back in {got[3][0]:.2f} s after cooling down")


def test_reports_off_a_pod_hot_from_other_callers_keeps_its_keys(fleet):
    tmp, urls = fleet
    got = _hot_pod_run(tmp, urls, reports=False)
    for share, n in got:
        assert n >= 200 and share > 0.05, got  # before and after: keys stay


@pytest.mark.parametrize("reports", [True, False], ids=["on", "off"])
def test_healthy_equal_fleet_moves_few_keys(fleet, reports):
    tmp, urls = fleet
    wait_cool(urls)
    with service(tmp, urls, reports, "c") as a, service(tmp, urls, reports, "d") as b:
        traffic = Traffic([a, b])
        try:
            t0 = time.monotonic()
            wait_for(
                "both services to route keys",
                lambda: all(traffic.share(i, urls[0], t0)[1] >= 2000 for i in (0, 1)),
                30.0,
                0.1,
            )
            time.sleep(BLACKOUT_S + 1.0)  # every pod past its blackout: reports count
            start = [
                (_metric_sum(s, "cslb_bounded_load_moves_total"),
                 _metric_sum(s, "cslb_decisions_total"))
                for s in (a, b)
            ]
            time.sleep(8.0)
            moved = decided = 0.0
            for s, (m0, d0) in zip((a, b), start, strict=True):
                src = [ln for ln in _metric_lines(s, "cslb_endpoint_load_source")
                       if 'source="reported"' in ln]
                assert sum(float(ln.rsplit(" ", 1)[1]) for ln in src) == 5 * reports, src
                moves = _metric_sum(s, "cslb_bounded_load_moves_total") - m0
                decisions = _metric_sum(s, "cslb_decisions_total") - d0
                assert decisions >= 2000
                print(f"moved {moves:.0f} of {decisions:.0f} decisions ({moves / decisions:.2%})")
                moved += moves
                decided += decisions
            # The fleet's decisions, both hosts together.
            assert moved <= 0.02 * decided, (moved, decided)
        finally:
            traffic.stop()
