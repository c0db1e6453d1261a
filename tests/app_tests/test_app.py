"""The bundled WSGI app, called directly with WSGI environ dicts over real shared memory."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import re
import time
from collections.abc import Iterator
from typing import Any
from wsgiref.util import setup_testing_defaults

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import lbcore
import shm
from lbcore.knobs import KnobError
from tests.app_tests.conftest import ENDPOINTS, Host
from workers.surfaces.app import (
    MAX_ATTEMPT,
    MAX_KEY_BYTES,
    CslbApp,
    HTTPError,
    parse_route_request,
    read_body,
)

KEYS = [f"SKU-{i:06d}" for i in range(300)]


class Response:
    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.code = int(status.split()[0])
        self.status = status
        self.headers = dict(headers)
        self.body = body

    def json(self) -> Any:
        assert self.headers["Content-Type"] == "application/json"
        return json.loads(self.body)

    @property
    def error(self) -> str:
        doc = self.json()
        assert doc["status"] == self.code
        return doc["error"]


def call(
    app: CslbApp,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    content_type: str | None = None,
    query: str = "",
    chunked: bool = False,
    extra: dict[str, Any] | None = None,
) -> Response:
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    environ.update(
        REQUEST_METHOD=method,
        PATH_INFO=path,
        QUERY_STRING=query,
        **{"wsgi.input": io.BytesIO(body)},
    )
    if chunked:
        environ["wsgi.input_terminated"] = True
        environ["HTTP_TRANSFER_ENCODING"] = "chunked"
    elif body or method == "POST":
        environ["CONTENT_LENGTH"] = str(len(body))
    if content_type is not None:
        environ["CONTENT_TYPE"] = content_type
    environ.update(extra or {})
    got: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info=None) -> None:
        got.extend((status, headers))

    out = b"".join(app(environ, start_response))
    r = Response(got[0], got[1], out)
    assert int(r.headers["Content-Length"]) == len(out) or method == "HEAD"
    return r


def post_json(app: CslbApp, doc: Any, **kw) -> Response:
    return call(
        app, "POST", "/route", json.dumps(doc).encode(), content_type="application/json", **kw
    )


@pytest.fixture
def app(host: Host) -> Iterator[CslbApp]:
    host.publish()
    a = CslbApp(host.namespace, max_body_bytes=64 * 1024, max_batch=1000)
    try:
        yield a
    finally:
        a.close()


def expected(keys: list[Any], endpoints: list[str] = ENDPOINTS) -> list[str]:
    """Skipper's ring answer from lbcore, computed from scratch (idle host, default knobs)."""
    return [endpoints[i] for i in lbcore.Ring(endpoints).lookup(keys)]


# --------------------------------------------------------------------------------------
# POST /route: answers.


def test_route_json_array_matches_lbcore(app: CslbApp) -> None:
    r = post_json(app, KEYS)
    assert r.code == 200
    assert r.json() == {"generation": 1, "endpoints": expected(KEYS)}


def test_integers_route_like_their_decimal_strings(app: CslbApp) -> None:
    big = 10**200 + 7
    keys = [123, "123", -5, "-5", big, str(big), 0, "0"]
    got = post_json(app, keys).json()["endpoints"]
    assert got[0::2] == got[1::2]
    assert got == expected([str(k) for k in keys])


def test_object_form_attempt_and_query(app: CslbApp) -> None:
    first = post_json(app, {"keys": KEYS}).json()["endpoints"]
    assert first == expected(KEYS)
    retry = post_json(app, {"keys": KEYS, "attempt": 1}).json()["endpoints"]
    assert all(a != b for a, b in zip(first, retry, strict=True))
    assert post_json(app, KEYS, query="attempt=1").json()["endpoints"] == retry
    r = post_json(app, {"keys": KEYS, "attempt": 1}, query="attempt=1")
    assert r.code == 400 and "both in the query string and the body" in r.error


def test_group_form(app: CslbApp) -> None:
    flat = post_json(app, KEYS).json()["endpoints"]
    doc = post_json(app, {"keys": KEYS, "group": True}).json()
    assert doc["generation"] == 1 and doc["fallback"] == []
    assert list(doc["groups"]) == [e for e in ENDPOINTS if e in set(flat)]  # table order
    seen = sorted(p for ps in doc["groups"].values() for p in ps)
    assert seen == list(range(len(KEYS)))
    for ep, positions in doc["groups"].items():
        assert positions == sorted(positions)
        assert {flat[p] for p in positions} == {ep}
    assert post_json(app, KEYS, query="group=1").json() == doc
    empty = post_json(app, {"keys": [], "group": True}).json()
    assert empty == {"generation": 1, "groups": {}, "fallback": []}


def test_fallback_keys_are_null_and_grouped_apart(host: Host, app: CslbApp) -> None:
    host.publish(knobs=shm.Knobs(percentage=50.0))
    time.sleep(0.01)
    doc = post_json(app, KEYS).json()
    assert doc["generation"] == 2
    nulls = [i for i, e in enumerate(doc["endpoints"]) if e is None]
    gate = lbcore.Gate(True, 50.0).mask(lbcore.hash_keys(KEYS))
    assert nulls == np.flatnonzero(~gate).tolist()
    assert 0 < len(nulls) < len(KEYS)
    grouped = post_json(app, {"keys": KEYS, "group": True}).json()
    assert grouped["fallback"] == nulls
    assert sum(map(len, grouped["groups"].values())) == len(KEYS) - len(nulls)
    host.publish(knobs=shm.Knobs(enabled=False))
    time.sleep(0.01)
    assert post_json(app, KEYS[:5]).json() == {"generation": 3, "endpoints": [None] * 5}


def test_text_plain_lines(app: CslbApp) -> None:
    keys = ["SKU-1", "", "  spaced ", "ünï", "SKU-2"]
    want = post_json(app, keys).json()
    body = "\n".join(keys).encode()
    for variant in (body, body + b"\n", body.replace(b"\n", b"\r\n") + b"\r\n"):
        r = call(app, "POST", "/route", variant, content_type="text/plain")
        assert r.json() == want, variant
    r = call(app, "POST", "/route", b"\n", content_type="text/plain; charset=utf-8")
    assert r.json()["endpoints"] == post_json(app, [""]).json()["endpoints"]
    assert call(app, "POST", "/route", b"", content_type="text/plain").json()["endpoints"] == []
    latin = "ünï\nSKU-2".encode("latin-1")
    r = call(app, "POST", "/route", latin, content_type="text/plain; charset=ISO-8859-1")
    assert r.json()["endpoints"] == want["endpoints"][3:]


def test_json_without_content_type_and_with_suffix(app: CslbApp) -> None:
    body = json.dumps(KEYS[:10]).encode()
    want = expected(KEYS[:10])
    assert call(app, "POST", "/route", body).json()["endpoints"] == want
    r = call(app, "POST", "/route", body, content_type="application/vnd.cslb+json")
    assert r.json()["endpoints"] == want


def test_new_generation_is_followed(host: Host, app: CslbApp) -> None:
    assert post_json(app, KEYS).json()["generation"] == 1
    host.publish(ENDPOINTS[:3])
    time.sleep(0.01)
    doc = post_json(app, KEYS).json()
    assert doc == {"generation": 2, "endpoints": expected(KEYS, ENDPOINTS[:3])}


def test_answers_with_endpoints_of_different_lengths(host: Host) -> None:
    """Endpoints a few characters apart: the answer is built from space-padded pieces;
    one endpoint far longer than the rest: joined per key, with no padding. Both are the
    same JSON, fallback keys included."""
    near = [
        "http://10.0.0.1:8080",
        "http://10.0.0.100:8080",
        "http://10.0.0.22:80",
        "http://10.0.0.5:81",
    ]
    far = [*near[:3], "http://" + "pod-" * 60 + "x.svc.cluster.local:8080"]
    app = CslbApp(host.namespace)
    try:
        for generation, endpoints in enumerate((near, far), start=1):
            host.publish(endpoints, knobs=shm.Knobs(percentage=50.0))
            time.sleep(0.01)
            r = post_json(app, KEYS)
            gate = lbcore.Gate(True, 50.0).mask(lbcore.hash_keys(KEYS))
            ring = expected(KEYS, endpoints)
            want = [e if g else None for e, g in zip(ring, gate, strict=True)]
            assert r.json() == {"generation": generation, "endpoints": want}
            assert None in want and len(set(want)) > 2
            assert (b"  " in r.body) == (endpoints is near), r.body[:200]
            assert post_json(app, []).json() == {"generation": generation, "endpoints": []}
            assert post_json(app, KEYS[:1]).json()["endpoints"] == want[:1]
    finally:
        app.close()


def test_no_tables_answers_fallback(namespace: str) -> None:
    app = CslbApp(namespace)
    try:
        assert post_json(app, ["a", "b"]).json() == {"generation": 0, "endpoints": [None, None]}
    finally:
        app.close()


def test_router_attached_lazily_and_counts_decisions(app: CslbApp) -> None:
    from workers.routing.router import Router

    assert Router.current() is None
    call(app, "GET", "/healthz")
    call(app, "GET", "/metrics")
    assert Router.current() is None  # only /route attaches
    post_json(app, KEYS)
    post_json(app, KEYS[:50])
    assert Router.current() is app.router()
    fams = {
        f.name: f
        for f in text_string_to_metric_families(call(app, "GET", "/metrics").body.decode())
    }
    (decisions,) = fams["cslb_decisions"].samples
    assert decisions.value == len(KEYS) + 50


# --------------------------------------------------------------------------------------
# POST /route: refusals.

BAD_JSON = [
    (b"[1, 2", 400, "invalid JSON"),
    (b"", 400, "empty request body"),
    (b"   ", 400, "empty request body"),
    (b"\xff\xfe[", 400, "invalid JSON"),
    (b'["a", 1.5]', 400, "key 1 is a number with a fraction or exponent"),
    (b'["a", 1e3]', 400, "key 1 is a number with a fraction or exponent"),
    (b"[true]", 400, "key 0 is a boolean"),
    (b'["a", "b", null]', 400, "key 2 is null"),
    (b'[["a"]]', 400, "key 0 is an array"),
    (b'[{"a": 1}]', 400, "key 0 is an object"),
    (b"[NaN]", 400, "NaN is not a valid JSON number"),
    (b"[-Infinity]", 400, "-Infinity is not a valid JSON number"),
    (b'"SKU-1"', 400, "the body is a string; expected a JSON array"),
    (b"42", 400, "the body is an integer"),
    (b"null", 400, "the body is null"),
    (b"[" * 100_000, 400, "invalid JSON"),
    (b"[" + b"9" * 5000 + b"]", 400, "invalid JSON"),
    (b'{"key": []}', 400, "unknown field 'key'"),
    (b'{"attempt": 1}', 400, 'no "keys" array'),
    (b'{"keys": "SKU-1"}', 400, '"keys" must be an array of product IDs, got a string'),
    (b'{"keys": [], "attempt": -1}', 400, '"attempt" must be an integer from 0 to'),
    (b'{"keys": [], "attempt": 1.0}', 400, '"attempt" must be an integer'),
    (b'{"keys": [], "attempt": true}', 400, '"attempt" must be an integer'),
    (b'{"keys": [], "attempt": "1"}', 400, '"attempt" must be an integer'),
    (b'{"keys": [], "attempt": 65}', 400, f"from 0 to {MAX_ATTEMPT}"),
    (b'{"keys": [], "group": 1}', 400, '"group" must be true or false, got an integer'),
    (b'["\\ud800"]', 400, "not valid Unicode"),
]


@pytest.mark.parametrize(("body", "code", "message"), BAD_JSON)
def test_bad_json_is_400_with_the_reason(
    app: CslbApp, body: bytes, code: int, message: str
) -> None:
    r = call(app, "POST", "/route", body[: 60 * 1024], content_type="application/json")
    assert (r.code, message in r.error) == (code, True), r.error


def test_key_length_limit_in_bytes(app: CslbApp) -> None:
    ok = "é" * (MAX_KEY_BYTES // 2)  # 4096 bytes in UTF-8
    assert post_json(app, ["a", ok]).code == 200
    r = post_json(app, ["a", ok + "x"])
    assert r.code == 400
    assert r.error.startswith(f"key 1 is {MAX_KEY_BYTES + 1} bytes long; keys may be at most")
    assert post_json(app, [int("9" * MAX_KEY_BYTES)]).code == 200
    r = post_json(app, [int("9" * (MAX_KEY_BYTES + 1))])
    assert r.code == 400 and "key 0 is 4097 bytes long" in r.error
    line = b"x" * (MAX_KEY_BYTES + 1)
    r = call(app, "POST", "/route", b"a\n" + line, content_type="text/plain")
    assert r.code == 400 and "key 1 (line 2) is 4097 bytes long" in r.error


def test_size_and_batch_limits(app: CslbApp) -> None:
    r = post_json(app, [f"k{i}" for i in range(1001)])
    assert r.code == 413 and "1001 keys in one request; at most 1000" in r.error
    r = call(app, "POST", "/route", b"k\n" * 1001, content_type="text/plain")
    assert r.code == 413 and "at most 1000" in r.error
    big = json.dumps(["x" * 4000] * 20).encode()  # > 64 KiB
    r = call(app, "POST", "/route", big, content_type="application/json")
    assert r.code == 413 and f"request body of {len(big)} bytes" in r.error


def test_oversized_body_is_refused_before_it_is_read(app: CslbApp) -> None:
    class Unreadable(io.RawIOBase):
        def read(self, n: int = -1) -> bytes:
            raise AssertionError("the app read an oversized body")

    r = call(
        app,
        "POST",
        "/route",
        content_type="application/json",
        extra={"CONTENT_LENGTH": str(10**12), "wsgi.input": Unreadable()},
    )
    assert r.code == 413


def test_content_types_methods_and_paths(app: CslbApp) -> None:
    body = json.dumps(KEYS[:3]).encode()
    r = call(app, "POST", "/route", body, content_type="application/x-www-form-urlencoded")
    assert r.code == 415 and "unsupported Content-Type" in r.error
    r = call(app, "POST", "/route", body, content_type="application/json; charset=latin-1")
    assert r.code == 415
    r = call(app, "POST", "/route", b"a", content_type="text/plain; charset=klingon")
    assert r.code == 415 and "unsupported charset 'klingon'" in r.error
    r = call(app, "GET", "/route")
    assert r.code == 405 and r.headers["Allow"] == "POST"
    r = call(app, "DELETE", "/metrics")
    assert r.code == 405 and r.headers["Allow"] == "GET, HEAD"
    r = call(app, "GET", "/nope")
    assert r.code == 404 and "/nope" in r.error
    r = post_json(app, KEYS[:3], query="attempts=1")
    assert r.code == 400 and "unknown query parameter 'attempts'" in r.error
    r = post_json(app, KEYS[:3], query="attempt=x")
    assert r.code == 400 and "attempt must be an integer" in r.error
    r = post_json(app, KEYS[:3], query="group=maybe")
    assert r.code == 400 and "group must be true or false" in r.error


def test_chunked_and_short_bodies(app: CslbApp) -> None:
    body = json.dumps(KEYS).encode()
    r = call(app, "POST", "/route", body, content_type="application/json", chunked=True)
    assert r.json()["endpoints"] == expected(KEYS)
    big = json.dumps(["x" * 4000] * 20).encode()
    r = call(app, "POST", "/route", big, content_type="application/json", chunked=True)
    assert r.code == 413 and "over 65536 bytes" in r.error
    # Chunked, but the server did not de-chunk (no wsgi.input_terminated): refuse.
    r = call(
        app,
        "POST",
        "/route",
        content_type="application/json",
        extra={"HTTP_TRANSFER_ENCODING": "chunked", "CONTENT_LENGTH": ""},
    )
    assert r.code == 411
    r = call(
        app,
        "POST",
        "/route",
        body[:10],
        content_type="application/json",
        extra={"CONTENT_LENGTH": str(len(body))},
    )
    assert r.code == 400 and f"ended after 10 of the {len(body)} bytes" in r.error
    r = call(app, "POST", "/route", body, extra={"CONTENT_LENGTH": "12x"})
    assert r.code == 400 and "Content-Length must be a non-negative integer" in r.error


def test_read_body_reads_in_pieces() -> None:
    class Trickle(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self.data = data

        def read(self, n: int = -1) -> bytes:
            out, self.data = self.data[: min(n, 3)], self.data[min(n, 3) :]
            return out

    data = b"0123456789" * 10
    assert read_body({"wsgi.input": Trickle(data), "CONTENT_LENGTH": "100"}, 100) == data
    env = {"wsgi.input": Trickle(data), "wsgi.input_terminated": True}
    assert read_body(env, 100) == data
    with pytest.raises(HTTPError) as err:
        read_body({"wsgi.input": Trickle(data), "wsgi.input_terminated": True}, 99)
    assert err.value.status == 413
    assert read_body({"wsgi.input": Trickle(data)}, 100) == b""  # no length, not chunked


def test_parse_route_request_pure() -> None:
    assert parse_route_request(b'["a", 1]', "application/json") == (["a", 1], 0, False)
    assert parse_route_request(b"a\r\nb", "text/plain", "attempt=1&group") == (
        [b"a", b"b"],
        1,
        True,
    )
    with pytest.raises(HTTPError) as err:
        parse_route_request(b"[1, 2, 3]", "", max_batch=2)
    assert err.value.status == 413


# --------------------------------------------------------------------------------------
# GET /healthz, /metrics, HEAD, settings.


def _publish_and_exit(namespace: str) -> None:
    try:
        w = shm.TableWriter(namespace)
        w.publish(lbcore.RingSet(ENDPOINTS[:2]))
    finally:
        os._exit(0)  # dies as the publisher: segments stay, the process is gone


def test_healthz(namespace: str) -> None:
    app = CslbApp(namespace, stale_after_s=2.0)
    try:
        r = call(app, "GET", "/healthz")
        assert r.code == 503
        doc = r.json()
        assert doc["status"] == "unavailable"
        assert f"no routing tables in shared-memory namespace {namespace!r}" in doc["reason"]
        h = Host(namespace)
        try:
            r = call(app, "GET", "/healthz")
            assert r.code == 503 and "has not published" in r.json()["reason"]
            h.publish()
            r = call(app, "GET", "/healthz")
            assert r.code == 200
            doc = r.json()
            assert doc["status"] == "ok" and doc["generation"] == 1
            assert doc["publisher_pid"] == os.getpid() and doc["heartbeat_age_s"] < 1
            # HEAD announces the body GET would send. The heartbeat age in it changes its
            # length now and then (0.12 vs 0.123 s): compare while two GETs around the
            # HEAD agree on their length.
            for _ in range(20):
                head = call(app, "HEAD", "/healthz")
                after = call(app, "GET", "/healthz")
                if len(after.body) == len(r.body):
                    break
                r = after
            assert head.code == 200 and head.body == b""
            assert head.headers["Content-Length"] == str(len(r.body))
            h.writer.heartbeat(time.monotonic_ns() - 3_000_000_000)
            r = call(app, "GET", "/healthz")
            assert r.code == 503
            assert re.fullmatch(
                r"publisher heartbeat is 3\.\d s old \(stale after 2 s\)", r.json()["reason"]
            )
            h.writer.heartbeat()
            assert call(app, "GET", "/healthz").code == 200
        finally:
            h.close()
        # A publisher that died (SIGKILL-like: no clean close) leaves its table behind.
        ctx = multiprocessing.get_context("fork")
        p = ctx.Process(target=_publish_and_exit, args=(namespace,))
        p.start()
        p.join(10)
        app.close()  # forget the old segments' mappings
        r = call(app, "GET", "/healthz")
        assert r.code == 503
        assert f"publisher process {p.pid} is not running" in r.json()["reason"]
    finally:
        app.close()


def test_metrics_endpoint(app: CslbApp) -> None:
    r = call(app, "GET", "/metrics")
    assert r.code == 200
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    fams = {f.name: f for f in text_string_to_metric_families(r.body.decode())}
    assert fams["cslb_discovery_up"].samples[0].value == 1.0
    assert fams["cslb_table_generation"].samples[0].value == 1.0
    om = call(app, "GET", "/metrics", extra={"HTTP_ACCEPT": "application/openmetrics-text"})
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.body.endswith(b"# EOF\n")


def test_index_and_settings_from_environment(namespace: str) -> None:
    app = CslbApp.from_environ(
        {"CSLB_SHM_NAMESPACE": namespace, "CSLB_MAX_BATCH": "5", "CSLB_MAX_BODY_BYTES": "4096"}
    )
    try:
        assert (app.namespace, app.max_batch, app.max_body_bytes) == (namespace, 5, 4096)
        r = call(app, "GET", "/")
        assert r.code == 200 and b"POST /route" in r.body
        assert post_json(app, list("abcdef")).code == 413
    finally:
        app.close()
    for env, name in [
        ({"CSLB_MAX_BATCH": "0"}, "CSLB_MAX_BATCH"),
        ({"CSLB_MAX_BODY_BYTES": "lots"}, "CSLB_MAX_BODY_BYTES"),
        ({"CSLB_STALE_AFTER": "-1"}, "CSLB_STALE_AFTER"),
        ({"CSLB_SHM_NAMESPACE": "a/b"}, "CSLB_SHM_NAMESPACE"),
    ]:
        with pytest.raises(KnobError, match=name):
            CslbApp.from_environ(env)


# --------------------------------------------------------------------------------------
# Fuzz: any request gives 200 or a 4xx, never a 500.

_scalars = (
    st.none()
    | st.booleans()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers()
    | st.integers(min_value=10**4000, max_value=10**4200)
    | st.text(max_size=20)
)
_json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_requests = st.one_of(
    _json_values,
    st.lists(st.one_of(st.text(), st.integers()), max_size=50),
    st.fixed_dictionaries(
        {"keys": st.lists(st.text(max_size=10) | st.integers(), max_size=20)},
        optional={
            "attempt": st.integers(-3, 70) | _scalars,
            "group": st.booleans() | _scalars,
            "extra": _scalars,
        },
    ),
)
_content_types = st.sampled_from(
    [
        "application/json",
        "",
        "text/plain",
        "text/plain; charset=latin-1",
        "text/plain; charset=utf-16",
        "application/json; charset=utf-16",
        "application/x-www-form-urlencoded",
        "application/problem+json",
        "nonsense;;;charset=",
    ]
)
_queries = st.sampled_from(["", "attempt=1", "group=true", "group=1&attempt=0", "x=1"]) | st.text(
    max_size=20
)


def _check_answer(r: Response, body: bytes, content_type: str, query: str) -> None:
    assert r.code == 200 or 400 <= r.code < 500, (r.status, r.body[:300])
    doc = json.loads(r.body)
    if r.code != 200:
        assert doc["status"] == r.code and doc["error"]
        return
    keys, _, group = parse_route_request(body, content_type, query, max_batch=1000)
    if group:
        positions = sorted([*doc["fallback"], *(p for g in doc["groups"].values() for p in g)])
        assert positions == list(range(len(keys)))
    else:
        assert len(doc["endpoints"]) == len(keys)
        assert set(doc["endpoints"]) <= {*ENDPOINTS, None}


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(doc=_requests, content_type=_content_types, query=_queries)
def test_fuzz_json_documents(app: CslbApp, doc: Any, content_type: str, query: str) -> None:
    body = json.dumps(doc).encode()
    r = call(app, "POST", "/route", body, content_type=content_type, query=query)
    _check_answer(r, body, content_type, query)


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=st.binary(max_size=600), content_type=_content_types, chunked=st.booleans())
def test_fuzz_raw_bodies(app: CslbApp, body: bytes, content_type: str, chunked: bool) -> None:
    r = call(app, "POST", "/route", body, content_type=content_type, chunked=chunked)
    _check_answer(r, body, content_type, "")


def test_worker_whose_router_belongs_elsewhere_answers_503(app: CslbApp, namespace: str) -> None:
    from workers.routing.router import Router

    other = Router.attach(f"{namespace}o")  # user code attached another namespace first
    try:
        r = post_json(app, KEYS[:3])
        assert r.code == 503 and "cannot attach the router" in r.error
        assert call(app, "GET", "/healthz").code == 200  # the host is fine
    finally:
        other.close()
    assert post_json(app, KEYS[:3]).code == 200


def test_module_level_app_reads_the_environment_on_first_request(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.surfaces import app as module

    host.publish()
    monkeypatch.setenv("CSLB_SHM_NAMESPACE", host.namespace)
    monkeypatch.setenv("CSLB_MAX_BATCH", "2")
    lazy = module.LazyApp()
    try:
        assert not lazy.built  # nothing built, nothing mapped at import
        assert post_json(lazy, ["a", "b"]).json()["generation"] == 1
        assert post_json(lazy, ["a", "b", "c"]).code == 413
        assert lazy.get().namespace == host.namespace
    finally:
        lazy.get().close()
    monkeypatch.setenv("CSLB_MAX_BATCH", "none")
    with pytest.raises(KnobError, match="CSLB_MAX_BATCH"):
        module.LazyApp()  # a bad setting stops the server at start-up
    assert callable(module.app)


def test_bad_values_are_quoted_short(app: CslbApp) -> None:
    r = post_json(app, {"keys": [], "attempt": 10**4000})
    assert r.code == 400 and len(r.error) < 200
    assert post_json(app, {"keys": [], "attempt": True}).error.endswith("got true")
    assert post_json(app, {"keys": [], "attempt": "1"}).error.endswith("got a string")
    r = post_json(app, KEYS[:1], query="x" * 5000 + "=1")
    assert r.code == 400 and len(r.error) < 200


def test_healthz_after_discovery_stops_cleanly_and_restarts(host: Host, app: CslbApp) -> None:
    assert call(app, "GET", "/healthz").code == 200
    assert call(app, "GET", "/metrics").code == 200  # scraped before: the table is mapped
    assert post_json(app, KEYS[:5]).code == 200
    host.writer.close()  # a clean stop removes the tables
    r = call(app, "GET", "/healthz")
    assert (
        r.code == 503 and "were removed (discovery stopped or is restarting)" in r.json()["reason"]
    )
    # Review nit 12: nothing of the removed publisher is reported as current.
    assert (r.json()["publisher_pid"], r.json()["heartbeat_age_s"]) == (0, None)
    fams = {
        f.name: f
        for f in text_string_to_metric_families(call(app, "GET", "/metrics").body.decode())
    }
    assert fams["cslb_discovery_up"].samples[0].value == 0.0
    assert fams["cslb_table_generation"].samples[0].value == 1.0  # the table still in use
    assert post_json(app, KEYS[:5]).json()["endpoints"] == expected(KEYS[:5])
    host.writer = shm.TableWriter(host.namespace, counters=host.counters)  # restarted
    host.publish(ENDPOINTS[:4])
    deadline = time.monotonic() + 5
    while call(app, "GET", "/healthz").code != 200:
        assert time.monotonic() < deadline, call(app, "GET", "/healthz").json()
        time.sleep(0.05)
    assert call(app, "GET", "/healthz").json()["generation"] == 1  # the new writer's count


# --------------------------------------------------------------------------------------
# Review findings (B1, S1, S4, nits 5-9).


class _Raising(io.RawIOBase):
    """A server's wsgi.input that fails like gunicorn's on a malformed chunked body."""

    def read(self, n: int = -1) -> bytes:
        raise OSError("No more data after: None")


def test_unreadable_body_is_400_not_500(app: CslbApp) -> None:
    for extra in (
        {"wsgi.input": _Raising(), "wsgi.input_terminated": True, "CONTENT_LENGTH": ""},
        {"wsgi.input": _Raising(), "CONTENT_LENGTH": "10"},
    ):
        r = call(app, "POST", "/route", content_type="application/json", extra=extra)
        assert r.code == 400, (r.code, r.body)
        assert r.error == "the request body could not be read: OSError: No more data after: None"
    assert post_json(app, KEYS[:3]).code == 200  # the worker goes on


def test_duplicate_fields_in_the_request_object_are_refused(app: CslbApp) -> None:
    body = b'{"keys": ["a"], "attempt": 1, "attempt": 0}'
    r = call(app, "POST", "/route", body, content_type="application/json")
    assert r.code == 400
    assert r.error == "field 'attempt' is given twice in an object; give each field once"
    r = call(app, "POST", "/route", b'{"keys": ["a"], "keys": ["b"]}')
    assert r.code == 400 and "'keys' is given twice" in r.error
    r = call(app, "POST", "/route", b'{"keys": ["a"], "attempt": 1}')
    assert r.code == 200


def test_body_limit_is_exact_and_query_fields_once(app: CslbApp) -> None:
    limit = app.max_body_bytes
    body = b'["a"]'.ljust(limit, b" ")  # JSON allows trailing whitespace
    assert call(app, "POST", "/route", body, content_type="application/json").code == 200
    r = call(app, "POST", "/route", body + b" ", content_type="application/json")
    assert r.code == 413 and f"request body of {limit + 1} bytes" in r.error
    r = post_json(app, ["a"], query="group=1&group=0")
    assert r.code == 400 and "given 2 times" in r.error


def test_huge_content_length_is_413_with_a_short_message(app: CslbApp) -> None:
    for digits in (19, 5000):
        r = call(
            app,
            "POST",
            "/route",
            content_type="application/json",
            extra={"CONTENT_LENGTH": "9" * digits, "wsgi.input": _Raising()},
        )
        assert r.code == 413, r.body
        assert len(r.error) < 120 and f"a {digits}-digit number of bytes" in r.error


def test_attempt_beyond_the_endpoints_is_all_fallback(app: CslbApp) -> None:
    n = len(ENDPOINTS)
    last = post_json(app, {"keys": KEYS, "attempt": n - 1}).json()["endpoints"]
    assert None not in last
    assert post_json(app, {"keys": KEYS, "attempt": n}).json()["endpoints"] == [None] * len(KEYS)


def test_text_plain_drops_a_leading_byte_order_mark(app: CslbApp) -> None:
    want = post_json(app, ["a", "b"]).json()
    for body in (b"\xef\xbb\xbfa\nb", "a\nb".encode("utf-16")):
        ctype = "text/plain" if body[0] == 0xEF else "text/plain; charset=utf-16"
        assert call(app, "POST", "/route", body, content_type=ctype).json() == want
    r = call(app, "POST", "/route", b"\xef\xbb\xbf", content_type="text/plain")
    assert r.json()["endpoints"] == []
    # Only at the start: elsewhere it is part of the key.
    r = call(app, "POST", "/route", b"a\n\xef\xbb\xbfb", content_type="text/plain")
    assert r.json()["endpoints"] == expected(["a", "\ufeffb"])


def test_content_type_without_a_media_type_is_415(app: CslbApp) -> None:
    for ctype in (";;;", "; charset=utf-8", " ;"):
        r = call(app, "POST", "/route", b'["a"]', content_type=ctype)
        assert r.code == 415 and "names no media type" in r.error, ctype
    assert call(app, "POST", "/route", b'["a"]', content_type="  ").code == 200  # blank: JSON


def test_status_refresh_is_a_plain_number_given_once(app: CslbApp) -> None:
    for query in ("refresh=1_0", "refresh=nan", "refresh=1e3", "refresh=5&refresh=0", "refresh="):
        r = call(app, "GET", "/status", query=query)
        assert r.code == 400 and "refresh" in r.error, query
    for query, meta in (("refresh=10", 'content="10"'), ("refresh=2.5", 'content="2.5"')):
        r = call(app, "GET", "/status", query=query)
        assert r.code == 200 and meta.encode() in r.body
    assert b"http-equiv" not in call(app, "GET", "/status", query="refresh=0").body


# --------------------------------------------------------------------------------------
# application/octet-stream: length-prefixed keys (S4).


def packed(keys: list[bytes]) -> bytes:
    """The binary body, built by hand (not with the app's own pack_keys)."""
    out = len(keys).to_bytes(4, "little")
    out += b"".join(len(k).to_bytes(2, "little") for k in keys)
    return out + b"".join(keys)


def post_binary(app: CslbApp, body: bytes, **kw) -> Response:
    return call(app, "POST", "/route", body, content_type="application/octet-stream", **kw)


def test_binary_body_carries_any_byte_string(app: CslbApp) -> None:
    from workers.surfaces.app import pack_keys

    keys = [b"SKU-1", b"", b"line\nbreak\xff\x00", b"\x00", b"x" * MAX_KEY_BYTES, "ü".encode()]
    r = post_binary(app, packed(keys))
    assert r.code == 200
    assert r.json() == {"generation": 1, "endpoints": expected(keys)}
    # Keys alike long take another path through the parser: same answers.
    same = [f"AD{i:09d}-K11".encode() for i in range(300)]
    assert post_binary(app, packed(same)).json()["endpoints"] == expected(same)
    assert post_binary(app, packed([])).json() == {"generation": 1, "endpoints": []}
    grouped = post_binary(app, packed(same), query="group=1&attempt=1").json()
    retry = post_json(app, {"keys": [k.decode() for k in same], "attempt": 1, "group": True})
    assert grouped == retry.json()
    assert pack_keys(keys) == packed(keys)
    assert pack_keys(["ü", b"a"]) == packed(["ü".encode(), b"a"])
    with pytest.raises(ValueError, match="key 1 is 4097 bytes long"):
        pack_keys([b"a", b"x" * (MAX_KEY_BYTES + 1)])


BAD_BINARY = [
    (b"", 400, "binary body of 0 bytes; it must start with the number of keys"),
    (b"\x01\x00\x00", 400, "binary body of 3 bytes"),
    (b"\x02\x00\x00\x00\x01\x00", 400, "announces 2 keys, whose lengths need 8 bytes"),
    (b"\x00\x00\x00\x00z", 400, "announces 0 keys but has 1 more bytes"),
    (packed([b"ab", b"c"])[:-1], 400, "the 2 key lengths add up to 3 bytes, but 2 bytes"),
    (packed([b"ab", b"c"]) + b"!", 400, "the 2 key lengths add up to 3 bytes, but 4 bytes"),
    (packed([b"a", b"x" * (MAX_KEY_BYTES + 1)]), 400, "key 1 is 4097 bytes long"),
    (packed([b"k"] * 1001), 413, "1001 keys in one request; at most 1000"),
    (b"\xff\xff\xff\xff", 400, "announces 4294967295 keys"),
]


@pytest.mark.parametrize(("body", "code", "message"), BAD_BINARY)
def test_bad_binary_bodies(app: CslbApp, body: bytes, code: int, message: str) -> None:
    r = post_binary(app, body)
    assert (r.code, message in r.error) == (code, True), r.error


_binary_keys = st.lists(
    st.binary(max_size=40) | st.binary(min_size=4090, max_size=4100), max_size=8
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    keys=_binary_keys,
    cut=st.integers(-3, 3),
    noise=st.binary(max_size=700),
    kind=st.sampled_from(["packed", "cut", "noise", "count"]),
)
def test_fuzz_binary_bodies(app: CslbApp, keys: list[bytes], cut: int, noise: bytes, kind: str):
    """Any body gives 200 with one answer per key, or a 4xx naming the problem."""
    body = packed(keys)
    if kind == "cut":
        body = body[: len(body) + cut] if cut < 0 else body + noise[:cut]
    elif kind == "noise":
        body = noise
    elif kind == "count":  # a plausible count in front of random bytes
        body = len(noise[4:]).to_bytes(4, "little")[: 4 + cut] + noise[4:]
    r = post_binary(app, body)
    assert r.code in (200, 400, 413), (r.status, r.body[:300])
    doc = json.loads(r.body)
    if r.code != 200:
        assert doc["status"] == r.code and doc["error"]
        return
    got = parse_route_request(body, "application/octet-stream", max_batch=1000)[0]
    assert packed(got) == body  # the parser's keys are exactly what the body holds
    assert doc["endpoints"] == expected(got)
    if kind == "packed" and all(len(k) <= MAX_KEY_BYTES for k in keys):
        assert got == keys


def test_endpoint_strings_follow_a_reordered_table(host: Host, app: CslbApp) -> None:
    keys = [f"SKU-{i}" for i in range(200)]
    assert post_json(app, keys).code == 200
    new = list(reversed(ENDPOINTS))
    host.publish(new)
    time.sleep(0.01)
    doc = post_json(app, keys).json()
    assert doc["generation"] == 2
    assert doc["endpoints"] == expected(keys, new)
