"""``cslb serve`` end to end: real gunicorn (sync and gthread), real discovery, real shm.

One server per worker class goes through the whole story, in order: routing equals
lbcore's for the same endpoints in every worker; an edit of the endpoint file reaches
every worker within debounce + 1 s and its fading ring shows in /metrics; a worker
SIGKILLed in the middle of a tracked request is replaced, its row reclaimed and the
host's in-flight count returns to 0; a SIGKILLed discovery is restarted while routing
never stops; SIGTERM to the master leaves no process and no segment behind.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import lbcore
import shm
from tests.gunicorn_harness import Server, alive, cmdline, serving, wait_for
from tests.serve_probes import metrics

DEBOUNCE_S = 0.3
FILE_POLL_S = 0.1  # the harness's CSLB_FILE_POLL
ENDPOINTS = [f"http://10.9.0.{i}:8080" for i in range(1, 7)]
ADDED = ["http://10.9.1.1:8080", "http://10.9.1.2:8080"]
KEYS = [f"sku-{i}" for i in range(300)] + list(range(50)) + ["", " ", "ünï", "x" * 4096]


def _write_endpoints(path: Path, endpoints: list[str]) -> None:
    doc = {"endpoints": [{"address": a, "zone": f"z{i % 3}"} for i, a in enumerate(endpoints)]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.rename(path)  # atomic: discovery never reads half a file


def _route(server: Server, keys: list) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", "/route", json.dumps(keys), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 200, body
        return int(resp.getheader("X-Worker-Pid")), body
    finally:
        conn.close()


def _per_worker(server: Server, workers: set[int], check, what: str, timeout_s: float) -> float:
    """Route until every worker in ``workers`` passed ``check``; returns the time taken."""
    t0 = time.monotonic()
    passed: set[int] = set()

    def step() -> bool:
        pid, body = _route(server, KEYS[:20])
        if check(body):
            passed.add(pid)
        return workers <= passed

    wait_for(what, step, timeout_s, 0.01)
    return time.monotonic() - t0


@pytest.mark.parametrize("threads", [1, 4], ids=["sync", "gthread"])
def test_serve_end_to_end(threads: int, tmp_path: Path) -> None:
    eps_file = tmp_path / "endpoints.json"
    _write_endpoints(eps_file, ENDPOINTS)
    block_dir = tmp_path / "blocked"
    block_dir.mkdir()
    args = ["--endpoints-file", str(eps_file), "--workers", "2", "--threads", str(threads)]
    args += ["--app", "blockapp:app", "--", "--graceful-timeout", "5"]
    env = {
        "CSLB_DEBOUNCE": str(DEBOUNCE_S),
        "CSLB_FADE_DURATION": "60",
        "CSLB_LOAD_REFRESH": "0.05",
        "TEST_BLOCK_DIR": str(block_dir),
    }
    with serving(args, tmp_path, env=env) as server:
        server.wait_ready(workers=2, path="/healthz")
        master = server.pid
        workers = set(server.worker_pids())
        assert len(workers) == 2
        assert len(os.listdir(f"/proc/{master}/task")) == 1  # no thread in the master
        if threads > 1:
            assert "Using worker: gthread" in server.log()
        # The startup log and cslb_build_info say which routing kernel runs.
        (started,) = server.events("master_started")
        assert started["kernel"] == lbcore.kernel_name()
        (info,) = metrics(server)["cslb_build_info"]
        assert info.labels["kernel"] == lbcore.kernel_name()

        # 1. Every worker routes exactly as lbcore's ring over the same endpoints.
        ring = lbcore.Ring(ENDPOINTS)
        expected = [ENDPOINTS[i] for i in ring.lookup(KEYS).tolist()]
        seen: dict[int, list] = {}

        def parity() -> bool:
            pid, body = _route(server, KEYS)
            assert body["endpoints"] == expected, f"worker {pid} disagrees with lbcore"
            seen[pid] = body["endpoints"]
            return set(seen) == workers

        wait_for("answers from both workers", parity, 20.0, 0.0)
        with ThreadPoolExecutor(8) as pool:  # concurrent clients (gthread: threads)
            bodies = list(pool.map(lambda _: _route(server, KEYS)[1], range(16)))
        assert all(b["endpoints"] == expected for b in bodies)
        gen0 = bodies[0]["generation"]

        # 2. Edit the file: a new generation in every worker within debounce + 1 s
        #    (+ the file poll interval), and the new pods' ring fades in.
        _write_endpoints(eps_file, ENDPOINTS + ADDED)
        took = _per_worker(
            server, workers, lambda b: b["generation"] > gen0, "the new generation", 10.0
        )
        assert took <= DEBOUNCE_S + FILE_POLL_S + 1.0, f"took {took:.2f} s"
        shares = metrics(server).get("cslb_fade_share", [])
        assert len(shares) == 1 and 0.0 < shares[0].value < 1.0, shares
        gens = metrics(server)["cslb_table_generation"]
        assert gens[0].value > gen0

        # 3. SIGKILL a worker in the middle of a tracked request.
        def blocked_request() -> None:
            try:
                server.request("GET", "/block?held-key", timeout_s=40)
            except (OSError, http.client.HTTPException):
                pass  # the worker dies under it

        client = threading.Thread(target=blocked_request, daemon=True)
        client.start()
        mark = wait_for(
            "a blocked request",
            lambda: next(iter(block_dir.glob("*.json")), None),
            10.0,
        )
        info = json.loads(mark.read_text())
        victim, row, endpoint = int(info["pid"]), info["row"], info["endpoint"]
        assert victim in workers and row is not None

        def in_flight() -> dict[str, float]:
            return {
                s.labels["endpoint"]: s.value for s in metrics(server)["cslb_endpoint_in_flight"]
            }

        wait_for("in-flight 1 host-wide", lambda: in_flight().get(endpoint) == 1.0, 5.0)
        store = shm.CounterStore.attach(server.namespace, writable=False)
        try:
            slot = store.slots()[row]
            assert slot.claimed and slot.pid == victim  # the worker adopted its row
            os.kill(victim, signal.SIGKILL)
            wait_for(
                "a replacement worker",
                lambda: (
                    len(set(server.worker_pids()) - workers) == 1 and victim not in server.tree()
                ),
                15.0,
            )
            wait_for(
                "the dead worker's row to be reclaimed",
                lambda: all(
                    s.pid != victim or not (s.claimed or s.reserved) for s in store.slots()
                ),
                10.0,
            )
        finally:
            store.close(unlink=False)
        wait_for("in-flight back to 0", lambda: sum(in_flight().values()) == 0.0, 10.0)
        client.join(timeout=10)
        workers = set(server.worker_pids())
        assert len(workers) == 2

        # 4. SIGKILL discovery: restarted (new PID), routing never stops meanwhile.
        (disc,) = server.discovery_pids()
        os.kill(disc, signal.SIGKILL)
        answered = 0
        deadline = time.monotonic() + 15.0
        new: list[int] = []
        for _ in range(5000):
            if time.monotonic() > deadline:
                break
            _, body = _route(server, KEYS[:50])  # asserts 200
            assert all(e is not None for e in body["endpoints"])
            answered += 1
            new = [p for p in server.discovery_pids() if p != disc]
            if new and answered >= 20:
                break
        assert new, f"discovery was not restarted:\n{server.log()}"
        assert not alive(disc)
        wait_for(
            "/healthz ok with the new discovery",
            lambda: server.request("GET", "/healthz")[0] == 200,
            10.0,
        )

        # 5. SIGTERM to the master: nothing left.
        result = server.stop()
        assert result["exit"] == 0, server.log()
        assert result["left"] == [], [cmdline(p) for p in result["left"]]
        assert result["segments"] == []
