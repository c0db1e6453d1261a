"""What the tests of a running ``cslb serve`` read from it: the routing answers of
``POST /route``, the ``/metrics`` samples, and where the published table's slot section
lies in shared memory (to damage it)."""

from __future__ import annotations

import http.client
import json

from prometheus_client.parser import text_string_to_metric_families

import shm
from shm.segment import Segment


def route(server, keys: list[str]) -> tuple[int, dict | None]:
    """``POST /route`` of ``keys`` as JSON: the status and, on 200, the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", "/route", json.dumps(keys), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, json.loads(body) if resp.status == 200 else None
    finally:
        conn.close()


def metrics(server) -> dict[str, list]:
    """``GET /metrics``, its samples by name."""
    status, body = server.request("GET", "/metrics")
    assert status == 200
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def slot_section(namespace: str) -> tuple[shm.Table, int, int]:
    """The newest table of ``namespace``, and the byte offset in its data segment and
    the byte size of its slot section."""
    from shm.layout import BUFFER_HEADER_BYTES, SECTION, TABLE_SECTIONS
    from shm.layout import DIRECTORY_OFFSET as DIR_OFFSET

    reader = shm.TableReader(namespace)
    try:
        table = reader.table()
    finally:
        reader.close()
    start = table.buffer_offset + BUFFER_HEADER_BYTES
    seg = Segment.attach(table.segment)
    try:
        index = [name for name, _ in TABLE_SECTIONS].index("slot")
        entry = seg.array(SECTION, start + DIR_OFFSET + index * SECTION.itemsize, 1)[0]
        return table, start + int(entry["offset"]), int(entry["nbytes"])
    finally:
        seg.close()
