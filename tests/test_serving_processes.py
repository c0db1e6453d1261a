"""The serving middleware in real servers on 127.0.0.1: gunicorn (sync, gthread) and uvicorn.

No cslb config module anywhere: plain ``gunicorn tests.gunicorn_apps.servingpod:app``.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.gunicorn_harness import REPO, alive, children_of, free_port, wait_for
from workers.serving.orca import parse_response_headers

LOAD = "/.well-known/cslb/load"


def get(port: int, path: str, timeout: float = 30.0) -> tuple[int, dict, bytes, list]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        pairs = r.getheaders()
        return r.status, {k.lower(): v for k, v in pairs}, body, pairs
    finally:
        conn.close()


def pool_files(pid: int) -> list[str]:
    return [e for e in os.listdir("/dev/shm") if e.startswith(f"cslb.pod-{pid}-")]


@contextmanager
def server(args: list[str], log: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CSLB_", "GUNICORN_"))}
    env["SERVINGPOD_LOG"] = str(log)
    cmd = [sys.executable, "-m", *[a.replace("PORT", str(port)) for a in args]]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for("the server to answer", lambda: get(port, "/ping", 2.0)[0] == 200, 20.0)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def gunicorn(*extra: str) -> list[str]:
    return [
        "gunicorn",
        "-b",
        "127.0.0.1:PORT",
        "--timeout",
        "60",
        *extra,
        "tests.gunicorn_apps.servingpod:app",
    ]


def load_report(port: int) -> tuple[dict, dict]:
    status, _headers, body, pairs = get(port, LOAD)
    assert status == 200
    parsed = parse_response_headers(pairs)
    assert parsed.malformed == "" and parsed.report is not None
    return json.loads(body), {"report": parsed.report}


def concurrent(port: int, paths: list[str]) -> list[tuple[int, dict, bytes, list]]:
    out: list = [None] * len(paths)

    def one(i: int) -> None:
        out[i] = get(port, paths[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(paths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_two_sync_workers_pool_their_busy_time(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    with server(gunicorn("-w", "2"), log) as (proc, port):
        wait_for("two workers", lambda: len(children_of(proc.pid)) == 2, 20.0)
        # Two 1-s requests at once: each sync worker takes one.
        answers = concurrent(port, ["/sleep?s=1.0", "/sleep?s=1.0"])
        pids = {int(a[2]) for a in answers}
        assert len(pids) == 2, "both workers served a request"
        for _status, _headers, _body, pairs in answers:
            parsed = parse_response_headers(pairs)
            assert parsed.timing_malformed == "" and parsed.malformed == ""
            assert 1.0 <= parsed.service_time_s < 1.3
        body, rep = load_report(port)
        # 2 busy seconds in a 10-s window: 0.2 pooled (one worker alone would say 0.1).
        assert 0.19 <= body["occupancy"] < 0.35, body
        assert body["capacity"] == 2 and body["processes"] == 2, body
        assert body["application_utilization"] == pytest.approx(body["occupancy"] / 2, rel=1e-3)
        assert rep["report"].occupancy == pytest.approx(body["occupancy"], rel=0.05)
        assert body["rps_fractional"] >= 0.2 and body["eps"] == 0.0
        # Errors: a 500 counts.
        assert get(port, "/fail")[0] == 500
        # (the worker that answered counts the error as the answer closes: the next
        # request may reach the other worker first)
        wait_for("the error counted", lambda: load_report(port)[0]["eps"] > 0, 10.0)
        # The load-only path answers without calling the app.
        before = log.read_text().splitlines()
        for _ in range(5):
            load_report(port)
        after = log.read_text().splitlines()
        assert after == before and not any(LOAD in line for line in after)
        master = proc.pid
        assert len(pool_files(master)) == 1
    assert proc.returncode is not None
    assert pool_files(master) == [], "the last worker removed the pool"


def test_gthread_workers_count_threads(tmp_path: Path) -> None:
    with server(gunicorn("-w", "2", "-k", "gthread", "--threads", "3"), tmp_path / "l") as (
        p,
        port,
    ):
        results: list = []
        t = threading.Thread(target=lambda: results.extend(concurrent(port, ["/sleep?s=1.5"] * 2)))
        t.start()
        try:
            # Two requests leave every worker a free thread for the load-only request.
            def two_open() -> dict:
                body = load_report(port)[0]
                return body if body["open_requests"] == 2 else {}

            body = wait_for("two open requests", two_open, 10.0)
            assert body["capacity"] == 6 and "ThreadWorker" in body["capacity_source"]
        finally:
            t.join(30)
        assert all(1.5 <= parse_response_headers(r[3]).service_time_s < 1.8 for r in results)
        after = load_report(port)[0]
        assert 0.29 <= after["occupancy"] < 0.5 and after["open_requests"] == 0, after
        master = p.pid
    assert pool_files(master) == []


def test_a_sigkilled_workers_open_request_stops_counting(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    with server(gunicorn("-w", "2"), log) as (proc, port):
        wait_for("two workers", lambda: len(children_of(proc.pid)) == 2, 20.0)
        hung = threading.Thread(target=lambda: _ignore(lambda: get(port, "/sleep?s=40", 60)))
        hung.start()
        victim = wait_for("the sleeping worker", lambda: _sleeper(log), 10.0)
        wait_for(
            "the open request to show", lambda: load_report(port)[0]["open_requests"] == 1, 10.0
        )
        os.kill(victim, signal.SIGKILL)
        wait_for("the victim to go", lambda: not alive(victim), 10.0)
        # Within a liveness check (1 s) its open request no longer counts.
        body = wait_for("the dead row to stop counting", lambda: _idle(port), 5.0)
        first = body["occupancy"]
        time.sleep(1.0)  # an interval to compare two readings over, not a wait for an event
        second = load_report(port)[0]["occupancy"]
        assert second <= first + 0.01, (first, second)
        hung.join(60)


def _ignore(fn: Callable[[], object]) -> None:
    try:
        fn()
    except (OSError, http.client.HTTPException):
        pass


def _sleeper(log: Path) -> int | None:
    if not log.exists():
        return None
    for line in log.read_text().splitlines():
        path, _, pid = line.partition(" ")
        if path == "/sleep":
            return int(pid)
    return None


def _idle(port: int) -> dict:
    body = load_report(port)[0]
    return body if body["open_requests"] == 0 else {}


def test_asgi_under_uvicorn(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    args = [
        "uvicorn",
        "--host",
        "127.0.0.1",
        "--port",
        "PORT",
        "--log-level",
        "warning",
        "tests.gunicorn_apps.servingpod:asgi",
    ]
    with server(args, log) as (proc, port):
        answers = concurrent(port, ["/sleep?s=0.5"] * 3)
        for a in answers:
            # asyncio wakes a timer up to its clock resolution early
            assert 0.49 <= parse_response_headers(a[3]).service_time_s < 0.8
        body, rep = load_report(port)
        assert 0.14 <= body["occupancy"] < 0.3 and body["capacity"] == 1, body
        assert rep["report"].application_utilization == pytest.approx(body["occupancy"], rel=0.05)
        assert not any(LOAD in line for line in log.read_text().splitlines())
        status, _, _, pairs = get(port, "/fail")
        assert status == 500 and parse_response_headers(pairs).report is not None
        pid = proc.pid
        assert len(pool_files(pid)) == 1
    assert pool_files(pid) == []


def test_a_worker_of_a_master_that_is_pid_1_pools_under_the_master(monkeypatch):
    """In a container gunicorn is often PID 1: its workers still share one pool."""
    import types

    import gunicorn.arbiter  # noqa: F401  (what "auto" looks for)

    from workers.serving import pool

    monkeypatch.setattr(pool, "gunicorn_worker", lambda: types.SimpleNamespace(ppid=1))
    assert pool.auto_namespace("auto").startswith("pod-1-")  # (pod-<master pid>-<start ticks>)
    monkeypatch.setattr(pool, "gunicorn_worker", lambda: None)
    assert pool.auto_namespace("process").startswith(f"pod-{os.getpid()}-")
