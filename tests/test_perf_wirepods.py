"""The benchmarks' C pod server (perf/podserver.c through perf/wirepods.py): build, start, talk.

One GET, one POST /batch, the answer's shape and its 2 ms, pipelined answers in order,
the connection counter, a malformed request and a reset connection. Skipped without a C
compiler. Times are only checked from below (an answer never comes before its 2 ms);
the pod process is stopped by PID.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import struct
import time

import pytest

from perf.wirepods import WirePods

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")),
    reason="no C compiler to build perf/podserver.c",
)


@pytest.fixture(scope="module")
def pods():
    with WirePods(3, 2.0) as p:
        yield p
    assert p.proc is None


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, object, float]:
    t0 = time.monotonic()
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    return resp.status, json.loads(body), time.monotonic() - t0


def test_get_answers_key_and_pod_after_service_time(pods: WirePods) -> None:
    port = pods.ports[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        status, doc, took = _get(conn, "/SKU-00042")
        assert status == 200
        assert doc == {"key": "SKU-00042", "pod": port}
        assert took >= 0.002
        status, doc, _ = _get(conn, "/a%20b%22c")  # %-decoded, then JSON-escaped
        assert doc == {"key": 'a b"c', "pod": port}
    finally:
        conn.close()
    assert pods.urls[1] == f"http://127.0.0.1:{port}"


def test_post_batch_answers_an_array_in_order(pods: WirePods) -> None:
    port = pods.ports[0]
    keys = ["AD1", "AD2", 'q"uote', "AD4"]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        t0 = time.monotonic()
        conn.request("POST", "/batch", body=json.dumps(keys).encode())
        resp = conn.getresponse()
        doc = json.loads(resp.read())
        took = time.monotonic() - t0
    finally:
        conn.close()
    assert resp.status == 200
    assert doc == [{"key": k, "pod": port} for k in keys]
    assert took >= 0.002


def test_pipelined_requests_answer_in_order(pods: WirePods) -> None:
    with socket.create_connection(("127.0.0.1", pods.ports[2]), timeout=5) as s:
        s.sendall(b"".join(f"GET /k{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(20)))
        buf = b""
        for _ in range(1000):
            if buf.count(b"HTTP/1.1 200 OK") == 20 and buf.endswith(b"}"):
                break
            buf += s.recv(65536)
    keys = [json.loads(b"{" + part.split(b"\r\n\r\n{", 1)[1])["key"] for part in
            buf.split(b"HTTP/1.1 200 OK")[1:]]  # fmt: skip
    assert keys == [f"k{i}" for i in range(20)]


def test_counters_count_connections_and_concurrency(pods: WirePods) -> None:
    pods.reset()
    conns = [http.client.HTTPConnection("127.0.0.1", pods.ports[0], timeout=5) for _ in range(4)]
    try:
        for c in conns:
            c.request("GET", "/x")  # all four in service at once
        for c in conns:
            assert c.getresponse().read()
        for c in conns:  # keep-alive: no new connection
            c.request("GET", "/y")
            assert c.getresponse().read()
    finally:
        for c in conns:
            c.close()
    st = pods.stats()
    assert st["accepted"][str(pods.ports[0])] == 4  # stats() kept its own from before reset()
    assert pods.accepted() == 4
    for _ in range(100):  # the pod sees the four closes soon after they were made
        if pods.connections()[1] == 0:
            break
        time.sleep(0.01)
    assert pods.connections() == (4, 0)
    assert st["served"][str(pods.ports[0])] == 8
    assert st["max_concurrent"][str(pods.ports[0])] == 4
    assert st["in_flight"]["total"] == 0


def test_malformed_request_and_reset_connection_leave_the_server_up(pods: WirePods) -> None:
    with socket.create_connection(("127.0.0.1", pods.ports[0]), timeout=5) as s:
        s.sendall(b"NOT HTTP\r\n\r\n")
        got = s.recv(4096)
        assert got.startswith(b"HTTP/1.1 400")
        assert s.recv(4096) == b""  # closed after the error
    with socket.create_connection(("127.0.0.1", pods.ports[0]), timeout=5) as s:
        s.sendall(b"POST /batch HTTP/1.1\r\nContent-Length: 5\r\n\r\n[1,2]")
        assert s.recv(4096).startswith(b"HTTP/1.1 400")  # not an array of strings
    for _ in range(20):  # reset with answers still due
        s = socket.create_connection(("127.0.0.1", pods.ports[1]), timeout=5)
        s.sendall(b"GET /k HTTP/1.1\r\n\r\n" * 5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    time.sleep(0.02)
    assert pods.proc is not None and pods.proc.poll() is None
    conn = http.client.HTTPConnection("127.0.0.1", pods.ports[1], timeout=5)
    try:
        assert _get(conn, "/still")[1] == {"key": "still", "pod": pods.ports[1]}
    finally:
        conn.close()
    assert pods.stats()["in_flight"]["total"] == 0
