r"""The bundled WSGI app that ``cslb serve`` runs: routing as an HTTP service.

``workers.app:app`` answers

* ``POST /route``: which endpoint serves each product ID of a batch;
* ``GET /metrics``: the host's routing metrics for Prometheus (any worker answers for
  the whole host, read from shared memory; see :mod:`workers.web.collector`);
* ``GET /healthz``: 200 while a table with endpoints is published and its publisher is
  alive, else 503 with the reason (JSON both ways): for people and alerts;
* ``GET /readyz``: 200 whenever this worker answers (JSON: whether keys route
  client-side or fall back to the ingress, and why). A worker that falls back still
  serves, so this, not ``/healthz``, is what a Kubernetes readiness or liveness probe
  asks: an empty backend or a discovery outage must not take the client pods out of
  their Service;
* ``GET /status``: an HTML page for people (:mod:`workers.web.status`).

``POST /route`` takes one of

* ``application/json``: an array of product IDs (strings or integers), or an object
  ``{"keys": [...], "attempt": 0, "group": false}`` (``attempt`` and ``group`` optional,
  each field at most once);
* ``text/plain``: one product ID per line. Lines end with ``\n`` (a ``\r`` before it is
  dropped too); the last line's ending is optional, so an empty body is an empty batch
  and ``"\n"`` is one empty key. A leading UTF-8 byte order mark is dropped. Lines are
  routed as the bytes sent (UTF-8 unless the ``charset`` parameter names another of
  :data:`TEXT_CHARSETS`; any other charset is 415);
* ``application/octet-stream``: any byte strings, length-prefixed (``uint32`` count,
  then a ``uint16`` length per key, then the keys' bytes; all little-endian). The only
  form that carries every key: JSON cannot hold bytes that are not UTF-8, and text
  cannot hold a newline.

``attempt`` and ``group`` may also be given in the query string (``/route?attempt=1``).
A request without ``Content-Type`` is read as JSON.

The answer is ``{"generation": G, "endpoints": [url or null, ...]}``, one entry per key
in order (``null``: fallback, send that key through the ingress), all computed on the
table of generation ``G``. With ``group`` it is ``{"generation": G, "groups": {url:
[positions...]}, "fallback": [positions...]}``: 0-based positions of the keys each
endpoint serves, endpoints in table order, and the fallback keys' positions in their own
list (always present, possibly empty), so no endpoint string can collide with them.
Before discovery has published a table the answer is 200 with generation 0 and every key
``null``.

Errors are JSON ``{"error": message, "status": code}``: 400 bad input (invalid JSON,
keys that are not strings or integers, keys over 4096 bytes, bad ``attempt``, a
malformed binary or chunked body), 404 unknown path, 405 wrong method (with ``Allow``),
411 chunked body without a terminated input stream, 413 body or batch over the limits,
415 unsupported content type, 503 this worker cannot attach its router (no counters, no
free counter row). Bad input never costs more than its own request.

The app attaches its :class:`~workers.routing.router.Router` on the first ``/route`` request,
never at import, so a gunicorn master that preloads it forks no shared-memory state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

import shm
from lbcore.errors import KeyEncodingError, KeyTooLongError, KeyTypeError
from lbcore.knobs import Knob, from_mapping, parse_int_between
from lbcore.logformat import Event
from workers.web import status
from workers.web.collector import METRICS_MAX_ENDPOINTS, STALE_AFTER, CslbCollector, HostMonitor

if TYPE_CHECKING:
    from workers.routing.router import Router

__all__ = [
    "APP_KNOBS",
    "MAX_ATTEMPT",
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "MAX_KEY_BYTES",
    "TEXT_CHARSETS",
    "CslbApp",
    "HTTPError",
    "app",
    "check_keys",
    "pack_keys",
    "parse_route_request",
    "read_body",
]

log = logging.getLogger("cslb.workers.app")

#: Longest product ID in bytes (UTF-8 for strings, decimal digits for integers).
MAX_KEY_BYTES = 4096
#: Largest ``attempt``: retries beyond a few distinct endpoints make no sense.
MAX_ATTEMPT = 64
_CHARS_SAFE = MAX_KEY_BYTES // 4  # a str this short is at most MAX_KEY_BYTES in UTF-8
_BITS_SAFE = 13_000  # an int this narrow has fewer than 3,914 decimal digits


#: ``CSLB_MAX_BODY_BYTES``: largest ``/route`` request body.
MAX_BODY_BYTES = Knob(
    "max_body_bytes",
    "CSLB_MAX_BODY_BYTES",
    "--max-body-bytes",
    1 << 20,
    parse_int_between(64, 1 << 30),
    "Largest POST /route request body in bytes; a larger one is refused with 413 before "
    "it is read.",
    "BYTES",
)

#: ``CSLB_MAX_BATCH``: most keys in one ``/route`` request.
MAX_BATCH = Knob(
    "max_batch",
    "CSLB_MAX_BATCH",
    "--max-batch",
    10_000,
    parse_int_between(1, 10_000_000),
    "Most product IDs in one POST /route request; more are refused with 413.",
    "KEYS",
)

#: The app's own settings (the namespace is :data:`shm.SHM_NAMESPACE`).
APP_KNOBS: tuple[Knob, ...] = (MAX_BODY_BYTES, MAX_BATCH, STALE_AFTER, METRICS_MAX_ENDPOINTS)

_JSON = "application/json"
_BINARY = "application/octet-stream"
_STATUS_TEXT = {
    200: "200 OK",
    400: "400 Bad Request",
    404: "404 Not Found",
    405: "405 Method Not Allowed",
    411: "411 Length Required",
    413: "413 Content Too Large",
    415: "415 Unsupported Media Type",
    500: "500 Internal Server Error",
    503: "503 Service Unavailable",
}
_JSON_TYPES = {
    float: "a number with a fraction or exponent",
    bool: "a boolean",
    type(None): "null",
    list: "an array",
    dict: "an object",
    str: "a string",
    int: "an integer",
}
_OBJECT_FIELDS = ("keys", "attempt", "group")
_QUERY_FIELDS = ("attempt", "group")
_UTF8 = ("utf-8", "utf8", "us-ascii", "ascii")
# One traceback per path and exception type per this many ns (see CslbApp._log_failure).
_FAILURE_LOG_NS = 60_000_000_000
# The other charsets a text body may name: decoders linear in the body's size. Any other
# Python codec is refused unseen, since a client could pick one that is slow
# (punycode's decoder is quadratic) or that is not a text encoding at all.
_DECODED = {
    **dict.fromkeys(("iso-8859-1", "iso8859-1", "iso_8859-1", "latin-1", "latin1"), "latin-1"),
    **dict.fromkeys(("utf-16", "utf16"), "utf-16"),
    **dict.fromkeys(("utf-16le", "utf-16be"), None),  # their own names
}
#: Charsets ``text/plain`` bodies may name (others: 415).
TEXT_CHARSETS = ("utf-8", "us-ascii", "iso-8859-1", "utf-16", "utf-16le", "utf-16be")
_DECIMAL = re.compile(r"[0-9]{1,5}(?:\.[0-9]{1,3})?")


class HTTPError(Exception):
    """A request the app refuses, with its HTTP status and a message naming the problem.

    Parameters
    ----------
    status
        HTTP status code (4xx, or 503).
    message
        What was wrong and what was expected.
    headers
        Extra response headers (``Allow`` for 405).
    """

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = list(headers)


# --------------------------------------------------------------------------------------
# Request parsing (pure: bytes in, keys out).


def _what(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


class _DuplicateFieldError(ValueError):
    """A JSON object names one field twice (JSON leaves the meaning open; we refuse)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _DuplicateFieldError(name)
            seen.add(name)
    return out


# One decoder, built once: json.loads with any keyword builds a new one per call. The
# pairs hook runs only for objects (the request object, or a bad key), never per key.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)


def check_keys(keys: list[Any]) -> None:
    """Raise 400 unless every key is a str, int or bytes of at most MAX_KEY_BYTES bytes.

    The message names the first bad key by position, in JSON's words.
    """
    types = set(map(type, keys))
    if types <= {str, int, bytes}:
        if int not in types:
            if max(map(len, keys), default=0) <= _CHARS_SAFE:
                return  # the common case: short strings, two C-level passes
        elif types == {int} and max(k.bit_length() for k in keys) <= _BITS_SAFE:
            return
    for i, k in enumerate(keys):
        t = type(k)
        if t is str or t is bytes:
            if len(k) > _CHARS_SAFE:
                n = len(k.encode("utf-8", "surrogatepass")) if t is str else len(k)
                if n > MAX_KEY_BYTES:
                    raise HTTPError(
                        400,
                        f"key {i} is {n} bytes long in UTF-8; product IDs may be at most "
                        f"{MAX_KEY_BYTES} bytes",
                    )
        elif t is int:
            if k.bit_length() > _BITS_SAFE and len(str(k)) > MAX_KEY_BYTES:
                raise HTTPError(
                    400,
                    f"key {i} is an integer of {len(str(k))} characters; product IDs may be "
                    f"at most {MAX_KEY_BYTES} bytes",
                )
        else:
            raise HTTPError(
                400,
                f"key {i} is {_what(k)}; product IDs must be strings or integers",
            )


def _attempt(value: Any, source: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_ATTEMPT:
        shown = json.dumps(value)[:32] if type(value) in (int, float, bool) else _what(value)
        raise HTTPError(400, f"{source} must be an integer from 0 to {MAX_ATTEMPT}, got {shown}")
    return value


def _group(value: Any, source: str) -> bool:
    if type(value) is not bool:
        raise HTTPError(400, f"{source} must be true or false, got {_what(value)}")
    return value


def _query(query: str) -> dict[str, Any]:
    """``attempt`` and ``group`` from a query string."""
    try:
        pairs = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=16)
    except ValueError as exc:
        raise HTTPError(400, f"bad query string: {exc}") from None
    out: dict[str, Any] = {}
    for name, values in pairs.items():
        if name not in _QUERY_FIELDS:
            raise HTTPError(
                400,
                f"unknown query parameter {name[:64]!r}; expected {', '.join(_QUERY_FIELDS)}",
            )
        if len(values) > 1:
            raise HTTPError(400, f"query parameter {name!r} is given {len(values)} times")
        raw = values[0].strip()
        if name == "attempt":
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 3):
                raise HTTPError(
                    400,
                    f"query parameter attempt must be an integer from 0 to {MAX_ATTEMPT}, "
                    f"got {raw[:32]!r}",
                )
            out["attempt"] = _attempt(int(raw), "query parameter attempt")
        else:
            low = raw.lower()
            if low in ("", "1", "true", "yes", "on"):
                out["group"] = True
            elif low in ("0", "false", "no", "off"):
                out["group"] = False
            else:
                raise HTTPError(
                    400, f"query parameter group must be true or false, got {raw[:32]!r}"
                )
    return out


def _parse_json(body: bytes, max_batch: int) -> tuple[list[Any], dict[str, Any]]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPError(
            400, f"invalid JSON: the body is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    # A UTF-8 byte order mark (Windows editors, PowerShell) is not part of the JSON text;
    # RFC 8259 lets a parser ignore it.
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise HTTPError(400, "empty request body; expected a JSON array of product IDs")
    try:
        doc = _DECODER.decode(text)
    except RecursionError:
        raise HTTPError(400, "invalid JSON: nested too deeply") from None
    except _DuplicateFieldError as exc:
        raise HTTPError(
            400, f"field {str(exc)[:64]!r} is given twice in an object; give each field once"
        ) from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, integers of >4300 digits
        raise HTTPError(400, f"invalid JSON: {exc}") from None
    options: dict[str, Any] = {}
    if type(doc) is dict:
        unknown = [k for k in doc if k not in _OBJECT_FIELDS]
        if unknown:
            raise HTTPError(
                400,
                f"unknown field {unknown[0][:64]!r} in the request object; expected "
                f"{', '.join(_OBJECT_FIELDS)}",
            )
        if "keys" not in doc:
            raise HTTPError(400, 'the request object has no "keys" array of product IDs')
        keys = doc["keys"]
        if type(keys) is not list:
            raise HTTPError(400, f'"keys" must be an array of product IDs, got {_what(keys)}')
        if "attempt" in doc:
            options["attempt"] = _attempt(doc["attempt"], '"attempt"')
        if "group" in doc:
            options["group"] = _group(doc["group"], '"group"')
    elif type(doc) is list:
        keys = doc
    else:
        raise HTTPError(
            400,
            f"the body is {_what(doc)}; expected a JSON array of product IDs or an object "
            'with a "keys" array',
        )
    if len(keys) > max_batch:
        raise HTTPError(413, f"{len(keys)} keys in one request; at most {max_batch} are allowed")
    return keys, options


def _parse_text(body: bytes, charset: str | None, max_batch: int) -> list[bytes]:
    if charset is not None and charset not in _UTF8:
        if charset not in _DECODED:
            raise HTTPError(
                415,
                f"unsupported charset {charset[:64]!r} for text/plain; use one of "
                f"{', '.join(TEXT_CHARSETS)} (or JSON, always UTF-8)",
            )
        codec = _DECODED[charset] or charset
        try:
            text = body.decode(codec)
        except UnicodeDecodeError as exc:
            raise HTTPError(400, f"the body is not valid {charset}: {exc.reason}") from None
        try:
            body = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise HTTPError(400, f"the body holds text that is not Unicode: {exc.reason}") from None
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:]  # a UTF-8 byte order mark (Windows editors) is not part of key 0
    if not body:
        return []
    if body.endswith(b"\n"):
        body = body[:-1]
    n = body.count(b"\n") + 1
    if n > max_batch:
        raise HTTPError(413, f"{n} keys in one request; at most {max_batch} are allowed")
    lines = body.split(b"\n")
    if b"\r" in body:
        lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
    longest = max(map(len, lines))
    if longest > MAX_KEY_BYTES:
        i = next(i for i, ln in enumerate(lines) if len(ln) == longest)
        raise HTTPError(
            400,
            f"key {i} (line {i + 1}) is {longest} bytes long; product IDs may be at most "
            f"{MAX_KEY_BYTES} bytes",
        )
    return lines


# "{L}s" for every key length L: a struct format that cuts a key of L bytes.
_CUT = [f"{n}s" for n in range(MAX_KEY_BYTES + 1)]


def pack_keys(keys: Iterable[bytes | str]) -> bytes:
    """The ``application/octet-stream`` body of a ``POST /route`` for ``keys``.

    Parameters
    ----------
    keys
        Product IDs: ``bytes`` as they are, ``str`` as UTF-8; each at most 4,096 bytes.

    Raises
    ------
    ValueError
        A key is longer than 4,096 bytes (it names the key's position).
    """
    raw = [k.encode("utf-8") if isinstance(k, str) else bytes(k) for k in keys]
    lengths = [len(k) for k in raw]
    for i, n in enumerate(lengths):
        if n > MAX_KEY_BYTES:
            raise ValueError(f"key {i} is {n} bytes long; at most {MAX_KEY_BYTES} bytes")
    return b"".join([struct.pack(f"<I{len(raw)}H", len(raw), *lengths), *raw])


def _parse_binary(body: bytes, max_batch: int) -> list[bytes]:
    """Keys of an ``application/octet-stream`` body (the format is in docs/http.md).

    ``uint32`` key count ``n``, then ``n`` ``uint16`` key lengths, then the keys' bytes
    back to back, all little-endian. Lengths come first so that the keys are cut by one
    :mod:`struct` call, with no Python step per key (0.7-1.5x ``json.loads`` of the same
    keys, ~2x for mixed lengths; a length before each key needs a Python loop: 2.7-4.5x).
    """
    size = len(body)
    if size < 4:
        raise HTTPError(
            400,
            f"binary body of {size} bytes; it must start with the number of keys "
            "(uint32, little-endian)",
        )
    n = int.from_bytes(body[:4], "little")
    head = 4 + 2 * n
    if head > size:
        raise HTTPError(
            400,
            f"binary body announces {n} keys, whose lengths need {head} bytes, but it has "
            f"only {size} bytes",
        )
    if n > max_batch:
        raise HTTPError(413, f"{n} keys in one request; at most {max_batch} are allowed")
    if n == 0:
        if size != 4:
            raise HTTPError(400, f"binary body announces 0 keys but has {size - 4} more bytes")
        return []
    lengths = struct.unpack_from(f"<{n}H", body, 4)
    longest = max(lengths)
    if longest > MAX_KEY_BYTES:
        i = lengths.index(longest)
        raise HTTPError(
            400,
            f"key {i} is {longest} bytes long; product IDs may be at most {MAX_KEY_BYTES} bytes",
        )
    total = sum(lengths)
    if head + total != size:
        raise HTTPError(
            400,
            f"binary body: the {n} key lengths add up to {total} bytes, but {size - head} "
            "bytes follow them",
        )
    first = lengths[0]
    if lengths.count(first) == n:  # all keys alike long, as SKUs often are
        fmt = _CUT[first] * n
    else:
        fmt = "".join(map(_CUT.__getitem__, lengths))
    # A new Struct per call: struct's own format cache would keep up to 100 formats of up
    # to max_batch keys alive per worker.
    return list(struct.Struct(fmt).unpack_from(body, head))


def _media_type(header: str) -> tuple[str, str | None]:
    """Media type (lowercase) and charset parameter of a Content-Type header."""
    main, _, params = header.partition(";")
    charset = None
    for p in params.split(";"):
        name, _, value = p.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
    return main.strip().lower(), charset


def parse_route_request(
    body: bytes,
    content_type: str,
    query: str = "",
    *,
    max_batch: int = MAX_BATCH.default,
    check: bool = True,
) -> tuple[list[Any], int, bool]:
    """Keys, ``attempt`` and ``group`` of a ``POST /route`` request.

    Parameters
    ----------
    body
        The request body.
    content_type
        The ``Content-Type`` header (``""``: JSON).
    query
        The query string.
    max_batch
        Most keys allowed.
    check
        Check every key's type and length (:func:`check_keys`). The app leaves that to
        the router's hashing, which checks the same in passing, and calls
        :func:`check_keys` only to word the error when the router refuses a key.

    Returns
    -------
    tuple
        The keys (``str``/``int`` from JSON, ``bytes`` from text), attempt and group.

    Raises
    ------
    HTTPError
        400, 413 or 415, with a message naming the problem.
    """
    media, charset = _media_type(content_type)
    if not media and content_type.strip():
        raise HTTPError(
            415,
            f"Content-Type {content_type[:64]!r} names no media type; send application/json, "
            "text/plain or application/octet-stream",
        )
    options = _query(query) if query else {}
    if media in ("", _JSON) or (media.startswith("application/") and media.endswith("+json")):
        if charset is not None and charset not in _UTF8:
            raise HTTPError(415, f"JSON bodies must be UTF-8, not {charset[:64]!r}")
        keys, given = _parse_json(body, max_batch)
        if check:
            check_keys(keys)
        for name in given:
            if name in options:
                raise HTTPError(400, f"{name} is given both in the query string and the body")
        options.update(given)
    elif media == "text/plain":
        keys = _parse_text(body, charset, max_batch)
    elif media == _BINARY:
        keys = _parse_binary(body, max_batch)
    else:
        raise HTTPError(
            415,
            f"unsupported Content-Type {media[:100]!r}; send application/json (an array "
            "of product IDs, or an object with keys), text/plain (one ID per line) or "
            "application/octet-stream (length-prefixed keys)",
        )
    return keys, options.get("attempt", 0), options.get("group", False)


def _read(stream: Any, n: int) -> bytes:
    """``stream.read(n)``; a body the server cannot deliver is the client's fault (400).

    gunicorn raises from ``wsgi.input.read`` on a malformed chunked body
    (``InvalidChunkSize``, ``ChunkMissingTerminator``, ...) or a client that hung up
    (``NoMoreData``, ``OSError``): bad input, not an internal error.
    """
    try:
        return stream.read(n)
    except Exception as exc:
        raise HTTPError(
            400, f"the request body could not be read: {type(exc).__name__}: {str(exc)[:100]}"
        ) from None


def read_body(environ: Mapping[str, Any], limit: int) -> bytes:
    """The request body, at most ``limit`` bytes, honouring Content-Length and chunking.

    Raises
    ------
    HTTPError
        413 over ``limit``; 400 for a bad Content-Length, a body that ends early or
        that the server cannot deliver (malformed chunks); 411 for a chunked body the
        server did not de-chunk (no ``wsgi.input_terminated``).
    """
    stream = environ["wsgi.input"]
    raw = str(environ.get("CONTENT_LENGTH") or "").strip()
    if raw:
        if not (raw.isascii() and raw.isdigit()):
            raise HTTPError(400, f"Content-Length must be a non-negative integer, got {raw[:32]!r}")
        if len(raw) > 18:  # int() of over 4,300 digits raises; no body is this long anyway
            raise HTTPError(
                413,
                f"request body of a {len(raw)}-digit number of bytes; at most {limit} bytes "
                "are allowed",
            )
        n = int(raw)
        if n > limit:
            raise HTTPError(413, f"request body of {n} bytes; at most {limit} bytes are allowed")
        chunks = []
        left = n
        while left:
            chunk = _read(stream, left)
            if not chunk:
                raise HTTPError(
                    400, f"request body ended after {n - left} of the {n} bytes announced"
                )
            chunks.append(chunk)
            left -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if environ.get("wsgi.input_terminated"):
        chunks = []
        size = 0
        while True:
            chunk = _read(stream, min(1 << 16, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"request body over {limit} bytes; at most {limit} allowed")
            chunks.append(chunk)
    if "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower():
        raise HTTPError(411, "chunked request bodies need a server that de-chunks them")
    return b""  # no Content-Length, not chunked: no body (RFC 9112 6.3)


# --------------------------------------------------------------------------------------
# The app.


#: Most padding the fixed-width answer pieces may add, as a share of the bytes the
#: endpoints' JSON strings need without it; beyond that the answer is joined per key.
_MAX_PADDING = 0.25


class _Answers:
    """The pieces of the ``/route`` answers on one table, built once per generation.

    ``enc``: the JSON text of each endpoint and ``"null"`` last (so that index -1, the
    fallback, takes it), for the group form. ``pieces``: the same as one fixed-width
    ``bytes`` array, each entry ``,"endpoint"`` padded with spaces (JSON whitespace) to
    the longest, so that an answer of ``n`` keys is one ``take`` and one ``tobytes``
    (no Python step per key); ``None`` when the endpoints' lengths differ so much that
    the padding would add over :data:`_MAX_PADDING` to the answer's size (then the
    strings are joined per key).
    """

    __slots__ = ("enc", "generation", "head", "pieces", "table")

    def __init__(self, table: Any) -> None:
        self.table = table
        self.generation = int(table.generation) if table is not None else 0
        endpoints = () if table is None else table.endpoints
        # json.dumps escapes every non-ASCII character: the text is ASCII.
        self.enc = [*map(json.dumps, endpoints), "null"]
        self.head = b'{"generation": %d, "endpoints": [' % self.generation
        raw = [b"," + e.encode("ascii") for e in self.enc]
        width = max(map(len, raw))
        need = sum(map(len, raw[:-1])) or 1
        self.pieces: np.ndarray | None = None
        if len(raw) == 1 or width * (len(raw) - 1) <= need * (1.0 + _MAX_PADDING):
            self.pieces = np.array([r.ljust(width) for r in raw], dtype=f"S{width}")

    def plain(self, idx: np.ndarray) -> bytes:
        """The answer ``{"generation": G, "endpoints": [...]}`` for indices ``idx``."""
        if not idx.size:
            return self.head + b"]}"
        pieces = self.pieces
        if pieces is not None:
            body = pieces.take(idx).tobytes()
            # Drop the comma of the first entry, in the same copy as the head and tail.
            return b"".join((self.head, memoryview(body)[1:], b"]}"))
        enc = self.enc
        return b"%b%b]}" % (self.head, ", ".join([enc[i] for i in idx.tolist()]).encode())


class CslbApp:
    """The WSGI app: ``/route``, ``/metrics``, ``/healthz``, ``/status``.

    Parameters
    ----------
    namespace
        Shared-memory namespace of the host's tables and counters.
    max_body_bytes
        Largest ``/route`` body, in bytes.
    max_batch
        Most keys in one ``/route`` request.
    stale_after_s
        Heartbeat age in seconds beyond which the publisher counts as dead.

    Attributes
    ----------
    registry
        The registry ``/metrics`` writes: cslb's collector; register more collectors
        in it to serve their metrics alongside (:func:`workers.web.mount.mount` does).
    """

    def __init__(
        self,
        namespace: str,
        *,
        max_body_bytes: int = MAX_BODY_BYTES.default,
        max_batch: int = MAX_BATCH.default,
        stale_after_s: float = STALE_AFTER.default,
        metrics_max_endpoints: int = METRICS_MAX_ENDPOINTS.default,
    ) -> None:
        self.namespace = namespace
        self.max_body_bytes = int(max_body_bytes)
        self.max_batch = int(max_batch)
        self.monitor = HostMonitor(namespace, stale_after_s=stale_after_s)
        self.collector = CslbCollector(
            namespace, monitor=self.monitor, max_endpoints=metrics_max_endpoints
        )
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        self._router: Router | None = None
        self._lock = threading.Lock()
        # (path, exception type) -> [monotonic ns of the next traceback, lines not logged]
        self._failures: dict[tuple[str, str], list[int]] = {}
        # The pieces of the answers on the table routed last (rebuilt per generation).
        self._answers = _Answers(None)
        self._routes: dict[str, dict[str, Callable[[dict[str, Any]], tuple]]] = {
            "/route": {"POST": self._route},
            "/metrics": {"GET": self._metrics},
            "/healthz": {"GET": self._healthz},
            "/readyz": {"GET": self._readyz},
            "/status": {"GET": self._status},
            "/": {"GET": self._index},
        }

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> CslbApp:
        """The app configured from ``CSLB_*`` variables (defaults for the rest).

        Raises
        ------
        lbcore.knobs.KnobError
            A variable is set to an invalid value (the message names it).
        """
        env = os.environ if environ is None else environ
        knobs = (shm.SHM_NAMESPACE, *APP_KNOBS)
        values = {k.name: k.default for k in knobs}
        values.update(from_mapping(env, knobs, source="environment"))
        return cls(
            values["shm_namespace"],
            max_body_bytes=values["max_body_bytes"],
            max_batch=values["max_batch"],
            stale_after_s=values["stale_after_s"],
            metrics_max_endpoints=values["metrics_max_endpoints"],
        )

    # -- WSGI --------------------------------------------------------------------------

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        """Serve one request."""
        method = environ.get("REQUEST_METHOD", "GET").upper()
        path = environ.get("PATH_INFO", "") or "/"
        try:
            handlers = self._routes.get(path)
            if handlers is None:
                raise HTTPError(
                    404,
                    f"no such path {path[:200]!r}; try /route, /metrics, /healthz, /readyz or "
                    "/status",
                )
            handler = handlers.get("GET" if method == "HEAD" else method)
            if handler is None:
                allowed = ", ".join(sorted({*handlers, *(["HEAD"] if "GET" in handlers else [])}))
                raise HTTPError(
                    405, f"{path} does not take {method[:20]}; use {allowed}", [("Allow", allowed)]
                )
            status, ctype, body, headers = handler(environ)
        except HTTPError as exc:
            status, ctype, headers = exc.status, _JSON, exc.headers
            body = json.dumps({"error": exc.message, "status": exc.status}).encode()
        except Exception as exc:
            self._log_failure(method, path, exc)
            status, ctype, headers = 500, _JSON, []
            body = b'{"error": "internal error (logged by the worker)", "status": 500}'
        start_response(
            _STATUS_TEXT[status],
            [("Content-Type", ctype), ("Content-Length", str(len(body))), *headers],
        )
        return [b""] if method == "HEAD" else [body]

    def _log_failure(self, method: str, path: str, exc: Exception) -> None:
        """Log an unexpected error with its traceback, once a minute per path and type.

        Any client can repeat the request that caused it: one traceback per request
        would let it flood the log. The lines of that minute are counted instead and
        the count goes with the next traceback.
        """
        key = (path[:200], type(exc).__name__)
        now = time.monotonic_ns()
        entry = self._failures.get(key)
        if entry is not None and now < entry[0]:
            entry[1] += 1
            return
        if len(self._failures) > 256:
            self._failures.clear()  # (paths reaching a handler are few; a safety cap)
        self._failures[key] = [now + _FAILURE_LOG_NS, 0]
        log.exception(
            Event(
                "request_failed",
                method=method[:20],
                path=path[:200],
                same_failures_not_logged=0 if entry is None else entry[1],
                next_traceback_after_s=_FAILURE_LOG_NS / 1e9,
            )
        )

    # -- /route ------------------------------------------------------------------------

    def router(self) -> Router:
        """The router of this process, attached on first use.

        Raises
        ------
        HTTPError
            503 when the namespace has no tables or counters, or no free counter slot.
        """
        r = self._router
        if r is not None:
            return r
        with self._lock:
            if self._router is None:
                from workers.routing.router import Router  # here: never in the master

                try:
                    self._router = Router.attach(self.namespace)
                except shm.ShmError as exc:
                    raise HTTPError(503, f"cannot route: {exc}") from None
                except Exception as exc:
                    # Say, user code in this worker attached the process's router to
                    # another namespace: this worker cannot route, the next may.
                    log.exception(Event("router_attach_failed", shm_namespace=self.namespace))
                    raise HTTPError(503, f"cannot attach the router: {exc}") from None
            return self._router

    def _route(self, environ: dict[str, Any]) -> tuple:
        body = read_body(environ, self.max_body_bytes)
        keys, attempt, group = parse_route_request(
            body,
            environ.get("CONTENT_TYPE", ""),
            environ.get("QUERY_STRING", ""),
            max_batch=self.max_batch,
            check=False,
        )
        router = self._router if self._router is not None else self.router()
        try:
            idx, table = router.route_table(keys, attempt=attempt)
        except (KeyTypeError, KeyEncodingError, KeyTooLongError) as exc:
            check_keys(keys)  # a bad key: say which, in JSON's words if it is one of those
            raise HTTPError(400, str(exc)) from None
        except shm.ShmError as exc:
            raise HTTPError(503, f"cannot route: {exc}") from None
        answers = self._answers
        if answers.table is not table:
            answers = self._answers = _Answers(table)
        if group:
            out = self._grouped(idx, answers.generation, answers.enc).encode()
        else:
            out = answers.plain(idx)
        return 200, _JSON, out, []

    @staticmethod
    def _grouped(idx: np.ndarray, generation: int, enc: list[str]) -> str:
        """The group form: positions per endpoint (table order), fallback positions apart."""
        if not idx.size:
            return f'{{"generation": {generation}, "groups": {{}}, "fallback": []}}'
        order = np.argsort(idx, kind="stable")
        ranked = idx[order]
        cuts = [0, *(np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist(), idx.size]
        pos = list(map(str, order.tolist()))
        heads = ranked[cuts[:-1]].tolist()
        groups = [
            f"{enc[e]}: [{', '.join(pos[lo:hi])}]"
            for e, lo, hi in zip(heads, cuts, cuts[1:], strict=False)
            if e >= 0
        ]
        fallback = ", ".join(pos[: cuts[1]]) if heads[0] < 0 else ""  # -1 sorts first
        return (
            f'{{"generation": {generation}, "groups": {{{", ".join(groups)}}}, '
            f'"fallback": [{fallback}]}}'
        )

    # -- the rest ----------------------------------------------------------------------

    def _metrics(self, environ: dict[str, Any]) -> tuple:
        encoder, ctype = choose_encoder(environ.get("HTTP_ACCEPT"))
        return 200, ctype, encoder(self.registry), []

    def _worker_problem(self) -> str | None:
        """Why this worker cannot route the published table (``None``: it can, or untried)."""
        router = self._router
        if router is None:
            return None
        try:
            router.snapshot()  # the verdict of now, not of the last batch
        except Exception:  # a closed router: nothing this endpoint can do about it
            return None
        problem = router.routing_problem()
        return None if problem is None else f"this worker (pid {os.getpid()}): {problem}"

    def _healthz(self, environ: dict[str, Any]) -> tuple:
        h = self.monitor.health()
        worker = self._worker_problem()
        if h.ok and worker is not None:
            h = dataclasses.replace(h, ok=False, reason=f"workers cannot route: {worker}")
        doc = {
            "status": "ok" if h.ok else "unavailable",
            "reason": h.reason,
            "namespace": self.namespace,
            "generation": h.generation,
            "heartbeat_age_s": None if h.heartbeat_age_s is None else round(h.heartbeat_age_s, 3),
            "publisher_pid": h.writer_pid,
            "discovery_problem": h.problem or None,
        }
        return (200 if h.ok else 503), _JSON, json.dumps(doc).encode(), []

    def _readyz(self, environ: dict[str, Any]) -> tuple:
        h = self.monitor.health()
        worker = self._worker_problem()
        client_side = bool(h.generation and h.endpoints) and worker is None
        if h.ok and worker is not None:
            h = dataclasses.replace(h, ok=False, reason=f"workers cannot route: {worker}")
        doc = {
            "status": "serving",
            "routing": "client-side" if client_side else "fallback",
            "healthz": "ok" if h.ok else "unavailable",
            "reason": h.reason,
            "generation": h.generation,
        }
        return 200, _JSON, json.dumps(doc).encode(), []

    def _status(self, environ: dict[str, Any]) -> tuple:
        refresh: float | None = 5.0
        query = environ.get("QUERY_STRING", "")
        if query:
            values = parse_qs(query, keep_blank_values=True).get("refresh", [])
            if len(values) > 1:
                raise HTTPError(400, f"query parameter refresh is given {len(values)} times")
            if values:
                raw = values[0].strip()
                # Plain decimal only: float() would take "1_0", "nan" and "1e3" too.
                refresh = float(raw) if _DECIMAL.fullmatch(raw) else -1.0
                if not 0.0 <= refresh <= 86400.0:
                    raise HTTPError(
                        400,
                        "refresh must be a number of seconds from 0 (never) to 86400, "
                        f"got {raw[:32]!r}",
                    )
        page = status.render(self.monitor.snapshot(), refresh_s=refresh)
        return 200, "text/html; charset=utf-8", page.encode(), [("Cache-Control", "no-store")]

    def _index(self, environ: dict[str, Any]) -> tuple:
        text = (
            f"cslb routing service (namespace {self.namespace})\n"
            "POST /route    route a batch of product IDs (JSON array or text/plain lines)\n"
            "GET  /metrics  Prometheus metrics of the whole host\n"
            "GET  /healthz  200 while the routing table is fresh\n"
            "GET  /readyz   200 while this worker serves (routing or falling back)\n"
            "GET  /status   status page\n"
        )
        return 200, "text/plain; charset=utf-8", text.encode(), []

    def close(self) -> None:
        """Release the router's counter slot and the monitor's mappings."""
        with self._lock:
            if self._router is not None:
                self._router.close()
                self._router = None
        self.monitor.close()


class _LazyApp:
    """``workers.app:app``: the :class:`CslbApp` configured from the environment.

    Built on the first request (in the worker), so importing this module in a gunicorn
    master maps nothing; the settings are checked at import all the same, so a bad
    ``CSLB_*`` value stops the server at start-up with a message naming it.
    """

    def __init__(self) -> None:
        self._app: CslbApp | None = None
        self._lock = threading.Lock()
        CslbApp.from_environ()  # validate now; cheap, attaches nothing

    def get(self) -> CslbApp:
        """The app, built on first use."""
        a = self._app
        if a is None:
            with self._lock:
                if self._app is None:
                    self._app = CslbApp.from_environ()
                a = self._app
        return a

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        """Serve one request."""
        a = self._app
        return (a if a is not None else self.get())(environ, start_response)


app = _LazyApp()
