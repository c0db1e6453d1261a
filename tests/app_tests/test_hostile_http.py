"""Client-controlled decoding: a request names only charsets whose decoders are linear
(anything else is 415 before a byte is decoded), and JSON may start with a BOM."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app_tests.conftest import Host
from tests.app_tests.wsgi_calls import call, expected, post_json
from tests.gunicorn_harness import serving, wait_for
from workers.surfaces.app import TEXT_CHARSETS, CslbApp

# Python codecs a client could name: slow (punycode, idna), not text (base64, zlib,
# hex, rot13 is text but not a charset), or merely exotic.
REFUSED = ["punycode", "idna", "base64", "zlib_codec", "hex", "rot13", "utf-7", "cp037",
           "raw_unicode_escape", "unicode_escape", "utf-32", "shift_jis", "klingon"]


@pytest.fixture
def app(host: Host) -> Iterator[CslbApp]:
    host.publish()
    a = CslbApp(host.namespace)
    try:
        yield a
    finally:
        a.close()


@pytest.mark.parametrize("charset", REFUSED)
def test_text_charsets_outside_the_list_are_415(app: CslbApp, charset: str) -> None:
    r = call(app, "POST", "/route", b"a" * 1000, content_type=f"text/plain; charset={charset}")
    assert r.code == 415, r.body
    assert f"unsupported charset {charset!r}" in r.error
    assert "utf-8" in r.error and "iso-8859-1" in r.error


def test_no_decoder_runs_for_a_charset_outside_the_list(app: CslbApp) -> None:
    """A codec registered under a fresh name records every lookup: none happens."""
    looked_up: list[str] = []

    def search(name: str) -> codecs.CodecInfo | None:
        if name == "cslb_spy_codec":
            looked_up.append(name)
            return codecs.lookup("latin-1")
        return None

    codecs.register(search)
    try:
        r = call(app, "POST", "/route", b"abc", content_type="text/plain; charset=cslb_spy_codec")
    finally:
        codecs.unregister(search)
    assert r.code == 415 and looked_up == []


@pytest.mark.parametrize("charset", [*TEXT_CHARSETS, "UTF8", "latin1", "Latin-1", "ascii"])
def test_listed_charsets_route_the_same_keys(app: CslbApp, charset: str) -> None:
    keys = ["a", "b-ü", "SKU-9"] if "ascii" not in charset else ["a", "b", "SKU-9"]
    name = codecs.lookup(charset.lower().replace("us-ascii", "ascii")).name
    body = "\n".join(keys).encode(name)
    r = call(app, "POST", "/route", body, content_type=f"text/plain; charset={charset}")
    assert r.code == 200, r.body
    assert r.json()["endpoints"] == expected(keys)


def test_json_with_a_utf8_byte_order_mark_is_accepted(app: CslbApp) -> None:
    want = post_json(app, ["a", "b"]).json()
    for body in (b"\xef\xbb\xbf" + json.dumps(["a", "b"]).encode(),
                 b"\xef\xbb\xbf" + json.dumps({"keys": ["a", "b"]}).encode()):
        r = call(app, "POST", "/route", body, content_type="application/json")
        assert r.code == 200, r.body
        assert r.json() == want
    # Only one, only first: a second mark is not JSON.
    r = call(app, "POST", "/route", b"\xef\xbb\xbf\xef\xbb\xbf[]", content_type="application/json")
    assert r.code == 400 and "invalid JSON" in r.error


def test_a_real_server_refuses_a_punycode_body_and_keeps_serving(tmp_path: Path) -> None:
    eps = tmp_path / "endpoints.json"
    eps.write_text(json.dumps(["http://10.6.0.1:8080", "http://10.6.0.2:8080"]))
    with serving(["--endpoints-file", str(eps), "--workers", "1"], tmp_path) as server:
        server.wait_ready(workers=1, path="/healthz")
        body = b"a" * 500_000 + b"-" + b"9" * 400_000  # quadratic for punycode
        status, answer = server.request(
            "POST", "/route", body, {"Content-Type": "text/plain; charset=punycode"},
            timeout_s=60,
        )
        assert status == 415 and b"unsupported charset 'punycode'" in answer
        status, answer = server.request(
            "POST", "/route", b"\xef\xbb\xbf[\"k\"]", {"Content-Type": "application/json"}
        )
        assert status == 200 and json.loads(answer)["endpoints"][0].startswith("http://10.6.0.")
        wait_for("/healthz", lambda: server.request("GET", "/healthz")[0] == 200, 20.0)
        result = server.stop()
    assert result["exit"] == 0 and result["segments"] == []


def _corrupt_section(namespace: str, name: str) -> None:
    """Overwrite one section of the current table (after readers mapped and checked it)."""
    import numpy as np

    import shm
    from shm.layout import BUFFER_HEADER_BYTES, SECTION, TABLE_SECTIONS, ring_sections
    from shm.layout import DIRECTORY_OFFSET as DIR_OFFSET
    from shm.segment import Segment

    reader = shm.TableReader(namespace)
    try:
        t = reader.table()
        n_rings = len(t.ring_set.rings)
    finally:
        reader.close()
    names = [n for n, _ in TABLE_SECTIONS]
    for k in range(n_rings):
        names += [n for n, _ in ring_sections(k)]
    start = t.buffer_offset + BUFFER_HEADER_BYTES
    seg = Segment.attach(t.segment, writable=True)
    try:
        entry = seg.array(SECTION, start + DIR_OFFSET + names.index(name) * SECTION.itemsize, 1)
        off, nbytes = int(entry[0]["offset"]), int(entry[0]["nbytes"])
        seg.array(np.uint8, start + off, nbytes)[:] = 0xFF
    finally:
        seg.close()


def test_a_table_damaged_after_mapping_falls_back_with_one_log_line(
    app: CslbApp, host: Host, caplog
) -> None:
    body = json.dumps(["a", "b", "c"]).encode()
    r = call(app, "POST", "/route", body, content_type="application/json")
    assert r.code == 200 and None not in r.json()["endpoints"]
    _corrupt_section(host.namespace, "ring0.owners")
    with caplog.at_level("WARNING"):
        for _ in range(20):
            r = call(app, "POST", "/route", body, content_type="application/json")
            assert r.code == 200, r.body
            assert r.json()["endpoints"] == [None, None, None]
    damaged = [rec for rec in caplog.records if "damaged after it was mapped" in rec.getMessage()]
    assert len(damaged) == 1
    assert not [rec for rec in caplog.records if rec.exc_info]
    r = call(app, "GET", "/healthz")
    # The monitor's own check finds the checksum off; a worker that mapped the table
    # before says it cannot route on it. Either way: 503, naming the damage.
    reason = r.json()["reason"]
    assert r.code == 503 and ("damaged" in reason or "checksum" in reason), reason


def test_an_unexpected_error_logs_one_traceback_a_minute(app: CslbApp, caplog, monkeypatch) -> None:
    def boom():
        raise RuntimeError("a bug, not the client's fault")

    monkeypatch.setattr(app.monitor, "snapshot", boom)  # /metrics reads the host through it
    with caplog.at_level("ERROR"):
        for _ in range(25):
            r = call(app, "GET", "/metrics")
            assert r.code == 500 and "internal error" in r.error
    tracebacks = [rec for rec in caplog.records if rec.exc_info]
    assert len(tracebacks) == 1
    assert app.failures_not_logged("/metrics", "RuntimeError") == 24
