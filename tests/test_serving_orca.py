"""The load-report wire format: every ORCA form, Server-Timing, raw header blocks, hostile input."""

from __future__ import annotations

import base64
import json
import math
import struct

import pytest

from workers.serving.orca import (
    MAX_HEADER_BYTES,
    LoadReport,
    ResponseLoad,
    format_report,
    format_server_timing,
    parse_header_block,
    parse_load_report,
    parse_response_headers,
    parse_server_timing,
)

# ---- a tiny protobuf encoder for the BIN form (tests only) ------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _double(field: int, v: float) -> bytes:
    return _varint(field << 3 | 1) + struct.pack("<d", v)


def _entry(field: int, key: str, v: float) -> bytes:
    body = _varint(1 << 3 | 2) + _varint(len(key.encode())) + key.encode() + _double(2, v)
    return _varint(field << 3 | 2) + _varint(len(body)) + body


FULL_BIN = (
    _double(1, 0.3)
    + _double(2, 0.2)
    + _varint(3 << 3)
    + _varint(120)  # deprecated rps: skipped
    + _entry(4, "bytes", 3487.0)  # request_cost: skipped
    + _entry(5, "gpu", 0.7)
    + _double(6, 120.5)
    + _double(7, 1.5)
    + _entry(8, "occupancy", 3.3)
    + _double(9, 0.41)
)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_the_middleware_form_round_trips() -> None:
    text = format_report(0.41, 120, 0, 3.3, {"queue": 2})
    assert text == (
        "TEXT application_utilization=0.41, rps_fractional=120, eps=0, "
        "named_metrics.occupancy=3.3, named_metrics.queue=2"
    )
    r = parse_load_report(text)
    assert r.malformed == "" and r.report is not None
    assert (r.report.form, r.report.application_utilization, r.report.rps_fractional) == (
        "TEXT",
        0.41,
        120.0,
    )
    assert r.report.eps == 0.0 and r.report.occupancy == 3.3
    assert dict(r.report.named_metrics) == {"occupancy": 3.3, "queue": 2.0}
    assert r.report.cpu_utilization is None


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 1e13])
def test_format_report_refuses_what_a_reader_would_refuse(bad: float) -> None:
    with pytest.raises(ValueError, match="occupancy"):
        format_report(0.1, 1, 0, bad)


def test_text_form_as_in_the_spec_and_as_envoy_splits_it() -> None:
    r = parse_load_report(
        "TEXT cpu_utilization=0.3, mem_utilization:0.8 , rps_fractional = 10,eps=1,"
        " named_metrics.foo=123, utilization.gpu=0.5, application_utilization=.5e1"
    )
    assert r.malformed == ""
    rep = r.report
    assert rep == LoadReport("TEXT", 5.0, 0.3, 0.8, 10.0, 1.0, rep.named_metrics, rep.utilization)
    assert dict(rep.named_metrics) == {"foo": 123.0} and dict(rep.utilization) == {"gpu": 0.5}
    assert rep.occupancy is None


def test_json_form_snake_and_camel_case() -> None:
    doc = {
        "cpuUtilization": 0.3,
        "application_utilization": 0.4,
        "rpsFractional": "12.5",
        "eps": 0,
        "namedMetrics": {"occupancy": 2},
        "utilization": {"gpu": 0.1},
        "rps": 12,
        "request_cost": {"x": 1},
    }
    r = parse_load_report("JSON " + json.dumps(doc))
    assert r.malformed == "" and r.report is not None
    assert r.report.form == "JSON" and r.report.rps_fractional == 12.5
    assert r.report.occupancy == 2.0 and r.report.cpu_utilization == 0.3


def test_bin_form_and_the_bin_header() -> None:
    for result, form in (
        (parse_load_report("BIN " + b64(FULL_BIN)), "BIN"),
        (parse_load_report(metrics_bin=b64(FULL_BIN).rstrip("=")), "BIN-HEADER"),
    ):
        assert result.malformed == ""
        rep = result.report
        assert rep is not None and rep.form == form
        assert (
            rep.cpu_utilization,
            rep.mem_utilization,
            rep.rps_fractional,
            rep.eps,
            rep.application_utilization,
        ) == (0.3, 0.2, 120.5, 1.5, 0.41)
        assert dict(rep.named_metrics) == {"occupancy": 3.3} and dict(rep.utilization) == {
            "gpu": 0.7
        }


def test_absent_is_neither_report_nor_malformed() -> None:
    assert parse_load_report() == ResponseLoad()
    assert parse_response_headers([("Content-Type", "text/plain")]) == ResponseLoad()


HOSTILE = {
    "duplicate key": "TEXT eps=1, eps=2",
    "duplicate named": "TEXT named_metrics.a=1, named_metrics.a=1",
    "NaN": "TEXT eps=NaN",
    "nan lower": "TEXT eps=nan",
    "inf": "TEXT eps=inf",
    "infinity": "TEXT eps=Infinity",
    "overflow to inf": "TEXT eps=1e999",
    "negative": "TEXT application_utilization=-0.1",
    "negative named": "TEXT named_metrics.occupancy=-3",
    "huge": "TEXT rps_fractional=1e300",
    "huge digits": "TEXT rps_fractional=" + "9" * 4000,
    "underscores": "TEXT eps=1_000",
    "hex": "TEXT eps=0x10",
    "empty value": "TEXT eps=",
    "not key=value": "TEXT eps",
    "empty named": "TEXT named_metrics.=1",
    "unknown key with garbage": "TEXT foo=bar",
    "unknown format": "YAML eps: 1",
    "64 KiB": "TEXT " + ", ".join(f"named_metrics.m{i}=1" for i in range(4000)),
    "json NaN": 'JSON {"eps": NaN}',
    "json Infinity": 'JSON {"eps": -Infinity}',
    "json duplicate": 'JSON {"eps": 1, "eps": 2}',
    "json duplicate across cases": 'JSON {"cpu_utilization": 1, "cpuUtilization": 2}',
    "json duplicate named": 'JSON {"named_metrics": {"a": 1, "a": 2}}',
    "json negative": 'JSON {"eps": -1}',
    "json bool": 'JSON {"eps": true}',
    "json string nan": 'JSON {"eps": "NaN"}',
    "json not object": "JSON [1, 2]",
    "json garbage": "JSON {eps",
    "json deep": "JSON " + "[" * 4000 + "]" * 4000,
    "json named not object": 'JSON {"named_metrics": 3}',
    "bin garbage base64": "BIN !!!not*base64!!!",
    "bin empty": "BIN ",
    "bin truncated double": "BIN " + b64(FULL_BIN[:-3]),
    "bin truncated varint": "BIN " + b64(b"\x80"),
    "bin truncated length": "BIN " + b64(_varint(8 << 3 | 2) + _varint(50) + b"ab"),
    "bin wrong wire type": "BIN " + b64(_varint(7 << 3) + _varint(5)),
    "bin group": "BIN " + b64(_varint(10 << 3 | 3)),
    "bin field zero": "BIN " + b64(b"\x01" + b"\0" * 8),
    "bin duplicate scalar": "BIN " + b64(_double(7, 1.0) + _double(7, 2.0)),
    "bin duplicate map key": "BIN " + b64(_entry(8, "a", 1) + _entry(8, "a", 2)),
    "bin NaN": "BIN " + b64(_double(9, math.nan)),
    "bin negative": "BIN " + b64(_double(6, -5.0)),
    "bin entry without key": "BIN " + b64(_varint(8 << 3 | 2) + _varint(9) + _double(2, 1.0)),
    "bin long varint": "BIN " + b64(b"\xff" * 11),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_reports_are_malformed_with_a_reason_and_never_raise(name: str) -> None:
    r = parse_load_report(HOSTILE[name])
    assert r.report is None
    assert r.malformed and len(r.malformed) <= 100, r.malformed


def test_reasons_say_what_was_wrong() -> None:
    assert parse_load_report(HOSTILE["duplicate key"]).malformed == "duplicate key eps"
    assert "non-finite" in parse_load_report(HOSTILE["NaN"]).malformed
    assert "negative" in parse_load_report(HOSTILE["negative"]).malformed
    assert "8192" in parse_load_report(HOSTILE["64 KiB"]).malformed
    assert "base64" in parse_load_report(HOSTILE["bin garbage base64"]).malformed
    assert "truncated" in parse_load_report(HOSTILE["bin truncated double"]).malformed


def test_two_formats_or_two_lines_in_one_response_are_malformed() -> None:
    two = parse_load_report("TEXT eps=1", metrics_bin=b64(_double(7, 1.0)))
    assert two.report is None and two.malformed == "more than one load report in the response"
    lines = parse_load_report(["TEXT eps=1", "JSON {}"])
    assert lines.report is None and lines.malformed
    pairs = parse_response_headers(
        [
            ("endpoint-load-metrics", "TEXT eps=1"),
            ("Endpoint-Load-Metrics-Bin", b64(_double(7, 1.0))),
        ]
    )
    assert pairs.report is None and pairs.malformed


def test_a_header_exactly_at_the_limit_is_read() -> None:
    head = "TEXT eps=1, named_metrics.pad="
    value = head + "0" * (MAX_HEADER_BYTES - len(head))
    assert len(value) == MAX_HEADER_BYTES and parse_load_report(value).report is not None
    assert parse_load_report(value + "0").report is None


# ---- Server-Timing ----------------------------------------------------------------------


def test_server_timing_w3c_syntax() -> None:
    assert format_server_timing(0.00193) == "app;dur=1.930"
    assert parse_server_timing("app;dur=1.93") == (pytest.approx(0.00193), "")
    several = ['cache;desc="hit, warm";dur=0.1, db;dur=53', 'app ; desc="x;y" ; dur = "12.5"']
    assert parse_server_timing(several) == (pytest.approx(0.0125), "")
    # the first app metric carrying a dur counts; its first dur too
    assert parse_server_timing("app, app;dur=2;dur=9, app;dur=7") == (pytest.approx(0.002), "")
    assert parse_server_timing("total;dur=3, miss") == (None, "")
    assert parse_server_timing(None) == (None, "")


@pytest.mark.parametrize(
    "bad",
    [
        "app;dur=-1",
        "app;dur=NaN",
        "app;dur=inf",
        "app;dur=1e999",
        'app;desc="unterminated',
        "app;;",
        "app;dur=1 garbage",
        "app;dur=" + "1" * 9000,
    ],
)
def test_hostile_server_timing_is_refused_with_a_reason(bad: str) -> None:
    dur, why = parse_server_timing(bad)
    assert dur is None and why


# ---- callers' inputs --------------------------------------------------------------------

BLOCK = (
    b"HTTP/1.1 100 Continue\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
    b"ENDPOINT-LOAD-METRICS: TEXT application_utilization=0.5, rps_fractional=3, eps=0, "
    b"named_metrics.occupancy=1\r\n"
    b"Server-Timing: db;dur=3\r\nserver-timing:app;dur=4.5  \r\n\r\n"
)


def test_raw_header_block_as_libcurl_hands_it() -> None:
    r = parse_header_block(BLOCK)
    assert r.malformed == "" and r.timing_malformed == ""
    assert r.report is not None and r.report.occupancy == 1.0
    assert r.service_time_s == pytest.approx(0.0045)
    bin_block = b"HTTP/2 200\r\nendpoint-load-metrics-bin: " + b64(FULL_BIN).encode() + b"\r\n\r\n"
    rb = parse_header_block(bin_block)
    assert rb.report is not None and rb.report.form == "BIN-HEADER" and rb.service_time_s is None


def test_raw_block_case_preserved_for_base64() -> None:
    # Lower-casing locates the lines; values come from the original bytes.
    raw = b64(_entry(8, "Occupancy", 2.0) + _entry(8, "occupancy", 1.0))
    r = parse_header_block(
        b"HTTP/1.1 200 OK\r\nEndpoint-Load-Metrics: BIN " + raw.encode() + b"\r\n\r\n"
    )
    assert r.report is not None and dict(r.report.named_metrics) == {
        "Occupancy": 2.0,
        "occupancy": 1.0,
    }


def test_raw_block_only_the_last_response_counts() -> None:
    redirect = (
        b"HTTP/1.1 302 Found\r\nEndpoint-Load-Metrics: TEXT eps=9\r\nLocation: /x\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nEndpoint-Load-Metrics: TEXT eps=1\r\n\r\n"
    )
    r = parse_header_block(redirect)
    assert r.report is not None and r.report.eps == 1.0


def test_raw_block_without_the_headers_is_the_shared_empty_result() -> None:
    plain = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Server-Timing: app;dur=1\r\n\r\n"
    assert parse_header_block(plain) is parse_header_block(b"")
    assert parse_header_block(plain) == ResponseLoad()


def test_raw_block_hostile() -> None:
    line = b"endpoint-load-metrics: TEXT eps=1\r\n"
    dup = b"HTTP/1.1 200 OK\r\n" + line + line + b"\r\n"
    assert parse_header_block(dup).malformed
    huge = b"HTTP/1.1 200 OK\r\nendpoint-load-metrics: TEXT " + b"x" * 65536 + b"\r\n\r\n"
    assert "8192" in parse_header_block(huge).malformed
    binary = (
        b"HTTP/1.1 200 OK\r\nendpoint-load-metrics: TEXT eps=\xff\xfe\x00\r\n"
        b"server-timing: \x00\r\n\r\n"
    )
    r = parse_header_block(binary)
    assert r.report is None and r.malformed and r.timing_malformed
    assert parse_header_block(memoryview(BLOCK)).report is not None
    assert parse_header_block(None).malformed  # type: ignore[arg-type]


def test_response_header_pairs_bytes_or_str() -> None:
    r = parse_response_headers(
        [(b"Server-Timing", b"app;dur=1"), ("endpoint-load-metrics", "TEXT eps=2")]
    )
    assert r.report is not None and r.report.eps == 2.0 and r.service_time_s == pytest.approx(0.001)
