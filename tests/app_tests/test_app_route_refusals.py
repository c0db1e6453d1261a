"""POST /route refusals of the bundled WSGI app: bad JSON, limits on keys, bodies and batches,
content types, methods and paths, unreadable and chunked bodies, each a 4xx with its reason."""

from __future__ import annotations

import io
import json

import pytest

from tests.app_tests import wsgi_calls
from tests.app_tests.wsgi_calls import KEYS, call, expected, post_json
from workers.surfaces.app import (
    MAX_ATTEMPT,
    MAX_KEY_BYTES,
    CslbApp,
    HTTPError,
    parse_route_request,
    read_body,
)

# The app under test: a published table, a 64 KiB body and a 1,000-key batch limit.
app = wsgi_calls.app


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
    assert r.code == 400
    assert r.error == "key 1 is 4097 bytes long; keys may be at most 4096 bytes (line 2)"


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


def test_bad_values_are_quoted_short(app: CslbApp) -> None:
    r = post_json(app, {"keys": [], "attempt": 10**4000})
    assert r.code == 400 and len(r.error) < 200
    assert post_json(app, {"keys": [], "attempt": True}).error.endswith("got true")
    assert post_json(app, {"keys": [], "attempt": "1"}).error.endswith("got a string")
    r = post_json(app, KEYS[:1], query="x" * 5000 + "=1")
    assert r.code == 400 and len(r.error) < 200


# --------------------------------------------------------------------------------------


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


def test_content_type_without_a_media_type_is_415(app: CslbApp) -> None:
    for ctype in (";;;", "; charset=utf-8", " ;"):
        r = call(app, "POST", "/route", b'["a"]', content_type=ctype)
        assert r.code == 415 and "names no media type" in r.error, ctype
    assert call(app, "POST", "/route", b'["a"]', content_type="  ").code == 200  # blank: JSON
