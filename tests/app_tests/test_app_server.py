"""``workers.app:app`` served by a real gunicorn (gthread) on 127.0.0.1, talked to over HTTP."""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import lbcore
from tests.app_tests.conftest import ENDPOINTS, Host
from tests.gunicorn_harness import alive, children_of
from tests.stopping import terminate

KEYS = [f"SKU-{i:05d}" for i in range(100)]


@pytest.fixture
def server(host: Host, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """gunicorn with one gthread worker (2 threads) on a free port; stopped by PID."""
    host.publish()
    env = dict(
        os.environ,
        CSLB_SHM_NAMESPACE=host.namespace,
        CSLB_MAX_BATCH="500",
        CSLB_MAX_BODY_BYTES="65536",
    )
    env.pop("GUNICORN_CMD_ARGS", None)  # only the flags below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--bind",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--threads",
            "2",
            "--worker-tmp-dir",
            str(tmp_path),
            "--log-level",
            "info",
            "workers.app:app",
        ],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    workers: list[int] = []
    try:
        assert proc.stderr is not None
        port = None
        log = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (port and b"Booting worker" in log):
            ready, _, _ = select.select([proc.stderr], [], [], 0.5)
            if ready:
                line = proc.stderr.readline()
                if not line:
                    break
                log += line
                m = re.search(rb"Listening at: http://127\.0\.0\.1:(\d+)", line)
                if m:
                    port = int(m.group(1))
        assert port and b"Booting worker" in log, log.decode(errors="replace")
        workers = children_of(proc.pid)
        yield "127.0.0.1", port
    finally:
        workers = sorted(set(workers) | set(children_of(proc.pid) if proc.poll() is None else []))
        terminate(proc, 15)
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.stderr is not None:
            proc.stderr.close()


def request(
    addr: tuple[str, int],
    method: str,
    path: str,
    body=None,
    headers: dict[str, str] | None = None,
    *,
    chunked: bool = False,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*addr, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_served_by_gunicorn(server: tuple[str, int]) -> None:
    want = [ENDPOINTS[i] for i in lbcore.Ring(ENDPOINTS).lookup(KEYS)]
    js = {"Content-Type": "application/json"}
    status, headers, body = request(server, "POST", "/route", json.dumps(KEYS), js)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"generation": 1, "endpoints": want}
    # A chunked body, de-chunked by gunicorn, in pieces that split keys apart.
    raw = json.dumps({"keys": KEYS, "group": True}).encode()
    pieces = [raw[i : i + 37] for i in range(0, len(raw), 37)]
    status, _, body = request(
        server, "POST", "/route", iter(pieces), {**js, "Transfer-Encoding": "chunked"}, chunked=True
    )
    assert status == 200
    groups = json.loads(body)["groups"]
    assert {p: ep for ep, ps in groups.items() for p in ps} == dict(enumerate(want))
    # A chunked body over the limit: 413, and the worker keeps serving.
    big = [b'["' + b"x" * 4000 + b'",' for _ in range(20)] + [b'"y"]']
    status, _, body = request(
        server, "POST", "/route", iter(big), {**js, "Transfer-Encoding": "chunked"}, chunked=True
    )
    assert status == 413, body
    status, _, body = request(
        server, "POST", "/route", "\n".join(KEYS[:5]).encode(), {"Content-Type": "text/plain"}
    )
    assert json.loads(body)["endpoints"] == want[:5]
    status, _, body = request(server, "POST", "/route", b"[1.5]", js)
    assert status == 400 and "key 0 is a number" in json.loads(body)["error"]
    status, _, body = request(server, "POST", "/route", json.dumps(["k"] * 501), js)
    assert status == 413
    status, _, body = request(server, "GET", "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, headers, body = request(server, "GET", "/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    (decisions,) = fams["cslb_decisions"].samples
    assert decisions.value == 2 * len(KEYS) + 5
    status, headers, body = request(server, "GET", "/status")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert body.count(b'class="bar" data-endpoint=') == len(ENDPOINTS)


def test_concurrent_requests_on_threads(server: tuple[str, int]) -> None:
    """Threads of one gthread worker share the lazily attached router."""
    want = [ENDPOINTS[i] for i in lbcore.Ring(ENDPOINTS).lookup(KEYS)]
    body = json.dumps(KEYS)

    def one(i: int) -> tuple[int, list]:
        status, _, out = request(
            server, "POST", "/route", body, {"Content-Type": "application/json"}
        )
        return status, json.loads(out)["endpoints"]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(40)))
    assert results == [(200, want)] * 40


def _raw(addr: tuple[str, int], data: bytes) -> bytes:
    """Send ``data`` as is, half-close, and read the whole answer."""
    import socket

    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_malformed_chunked_bodies_are_400_from_gunicorn(server: tuple[str, int]) -> None:
    head = (
        b"POST /route HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for body in (b'zz\r\n["a"]\r\n0\r\n\r\n', b'5\r\n["a"]\r\n', b'fffffffffff\r\n["a"]\r\n'):
        out = _raw(server, head + body)
        status = out.split(b"\r\n", 1)[0]
        assert status == b"HTTP/1.1 400 Bad Request", (body, out[:300])
        assert b"the request body could not be read" in out
    ok = _raw(server, head + b'5\r\n["a"]\r\n0\r\n\r\n')
    assert ok.startswith(b"HTTP/1.1 200 OK"), ok[:300]
    # The binary body over the wire: a key with a newline and bytes that are not UTF-8.
    keys = [b"a\nb\xff", b"SKU-1"]
    body = b"\x02\x00\x00\x00\x04\x00\x05\x00" + b"".join(keys)
    status, headers, out = request(
        server, "POST", "/route", body, {"Content-Type": "application/octet-stream"}
    )
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(out)["endpoints"] == [
        ENDPOINTS[i] for i in lbcore.Ring(ENDPOINTS).lookup(keys)
    ]
