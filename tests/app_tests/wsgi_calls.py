"""Calls into the bundled WSGI app with WSGI environ dicts (no server), the app fixture the
app tests share, and lbcore's answer to compare with."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest

import lbcore
from tests.app_tests.conftest import ENDPOINTS, Host
from workers.surfaces.app import CslbApp

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
# application/octet-stream: length-prefixed keys.


def packed(keys: list[bytes]) -> bytes:
    """The binary body, built by hand (not with the app's own pack_keys)."""
    out = len(keys).to_bytes(4, "little")
    out += b"".join(len(k).to_bytes(2, "little") for k in keys)
    return out + b"".join(keys)


def post_binary(app: CslbApp, body: bytes, **kw) -> Response:
    return call(app, "POST", "/route", body, content_type="application/octet-stream", **kw)
