"""Any request to the bundled WSGI app gives 200 or a 4xx, never a 500 (hypothesis)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.app_tests import wsgi_calls
from tests.app_tests.conftest import ENDPOINTS
from tests.app_tests.wsgi_calls import Response, call
from workers.surfaces.app import CslbApp, parse_route_request

# The app under test: a published table, a 64 KiB body and a 1,000-key batch limit.
app = wsgi_calls.app


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
