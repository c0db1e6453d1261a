"""application/octet-stream bodies of the bundled WSGI app: length-prefixed keys, any byte
string, refusals, and fuzzed bodies."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lbcore
from tests.app_tests import wsgi_calls
from tests.app_tests.wsgi_calls import expected, packed, post_binary, post_json
from workers.surfaces.app import MAX_KEY_BYTES, CslbApp, parse_route_request

# The app under test: a published table, a 64 KiB body and a 1,000-key batch limit.
app = wsgi_calls.app


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


def test_pack_keys_writes_each_key_as_the_router_hashes_it() -> None:
    from workers.surfaces.app import pack_keys

    # An integer is its decimal text (what lbcore hashes), never int-many zero bytes.
    assert pack_keys([12345, -7, "a"]) == packed([b"12345", b"-7", b"a"])
    with pytest.raises(lbcore.KeyTypeError, match="1"):
        pack_keys(["a", 1.5])
