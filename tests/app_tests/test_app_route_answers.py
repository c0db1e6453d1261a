"""POST /route answers of the bundled WSGI app (called directly with WSGI environ dicts over
real shared memory): JSON, text and object forms, groups, fallbacks, new generations."""

from __future__ import annotations

import json
import time

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

import lbcore
import shm
from tests.app_tests import wsgi_calls
from tests.app_tests.conftest import ENDPOINTS, Host
from tests.app_tests.wsgi_calls import KEYS, call, expected, post_json
from workers.surfaces.app import CslbApp

# The app under test: a published table, a 64 KiB body and a 1,000-key batch limit.
app = wsgi_calls.app


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


def test_endpoint_strings_follow_a_reordered_table(host: Host, app: CslbApp) -> None:
    keys = [f"SKU-{i}" for i in range(200)]
    assert post_json(app, keys).code == 200
    new = list(reversed(ENDPOINTS))
    host.publish(new)
    time.sleep(0.01)
    doc = post_json(app, keys).json()
    assert doc["generation"] == 2
    assert doc["endpoints"] == expected(keys, new)
