r"""The ``POST /route`` request: reading its body and parsing it into keys (pure functions).

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

Keys follow lbcore's rules (:data:`lbcore.MAX_KEY_BYTES`, :func:`lbcore.hash_keys`);
every refusal is an :class:`HTTPError` naming the problem, so bad input never costs more
than its own request.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs

import lbcore
from lbcore.keys import check_key_length, encode_key
from lbcore.knobs import Knob, parse_int_between

__all__ = [
    "JSON_MEDIA_TYPE",
    "MAX_ATTEMPT",
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "MAX_KEY_BYTES",
    "TEXT_CHARSETS",
    "HTTPError",
    "check_keys",
    "pack_keys",
    "parse_binary",
    "parse_json",
    "parse_route_request",
    "parse_text",
    "read_body",
]

#: Longest product ID in bytes (UTF-8 for strings, decimal digits for integers): lbcore's.
MAX_KEY_BYTES = lbcore.MAX_KEY_BYTES
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

#: Largest ``attempt``: retries beyond a few distinct endpoints make no sense.
MAX_ATTEMPT = 64

#: The media type of JSON bodies (and of every answer).
JSON_MEDIA_TYPE = "application/json"
_BINARY = "application/octet-stream"
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
    """Raise 400 unless lbcore routes every key; the message names the first bad key.

    The length and encoding rules, and their messages, are lbcore's
    (:func:`lbcore.hash_keys` with :data:`lbcore.MAX_KEY_BYTES`); a key of another type
    is named in JSON's words (``key 2 is a boolean``), the words of the client that sent it.
    """
    try:
        lbcore.hash_keys(keys, max_key_bytes=MAX_KEY_BYTES)
    except lbcore.KeyTypeError as exc:
        for i, k in enumerate(keys):
            if type(k) not in (str, int, bytes):
                raise HTTPError(
                    400, f"key {i} is {_what(k)}; product IDs must be strings or integers"
                ) from None
        raise HTTPError(400, str(exc)) from None
    except (lbcore.KeyTooLongError, lbcore.KeyEncodingError) as exc:
        raise HTTPError(400, str(exc)) from None


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


def parse_json(body: bytes, max_batch: int) -> tuple[list[Any], dict[str, Any]]:
    """Keys of a JSON body (an array, or an object with ``keys``) and the object's options.

    Raises
    ------
    HTTPError
        400 for invalid JSON or an unknown, repeated or mistyped field; 413 over
        ``max_batch`` keys. Keys are not checked here (:func:`check_keys`).
    """
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


def parse_text(body: bytes, charset: str | None, max_batch: int) -> list[bytes]:
    """Keys of a ``text/plain`` body: one per line, as the bytes sent (UTF-8 unless ``charset``).

    Raises
    ------
    HTTPError
        400 for a key over :data:`MAX_KEY_BYTES` (naming its line) or a body not in its
        charset; 413 over ``max_batch`` keys; 415 for a charset not in :data:`TEXT_CHARSETS`.
    """
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
        _refuse_length(longest, i, f" (line {i + 1})")
    return lines


def _refuse_length(length: int, i: int, where: str = "") -> None:
    """400 with lbcore's message if key ``i`` of ``length`` bytes is too long."""
    try:
        check_key_length(length, i, MAX_KEY_BYTES)
    except lbcore.KeyTooLongError as exc:
        raise HTTPError(400, f"{exc}{where}") from None


# "{L}s" for every key length L: a struct format that cuts a key of L bytes.
_CUT = [f"{n}s" for n in range(MAX_KEY_BYTES + 1)]


def pack_keys(keys: Iterable[bytes | str | int]) -> bytes:
    """The ``application/octet-stream`` body of a ``POST /route`` for ``keys``.

    Parameters
    ----------
    keys
        Product IDs, each as the router hashes it (:func:`lbcore.keys.encode_key`):
        ``bytes`` as they are, ``str`` as UTF-8, an integer as its decimal text; each
        at most 4,096 bytes.

    Raises
    ------
    lbcore.KeyTooLongError, lbcore.KeyTypeError, lbcore.KeyEncodingError
        A key too long, of another type, or a ``str`` that is not valid Unicode
        (``ValueError``/``TypeError``; lbcore's messages, naming the key's position).
    """
    raw = [encode_key(k, i, MAX_KEY_BYTES) for i, k in enumerate(keys)]
    lengths = [len(k) for k in raw]
    return b"".join([struct.pack(f"<I{len(raw)}H", len(raw), *lengths), *raw])


def parse_binary(body: bytes, max_batch: int) -> list[bytes]:
    """Keys of an ``application/octet-stream`` body (the format is in docs/http.md).

    ``uint32`` key count ``n``, then ``n`` ``uint16`` key lengths, then the keys' bytes
    back to back, all little-endian. Lengths come first so that the keys are cut by one
    :mod:`struct` call, with no Python step per key (a length before each key would need
    a Python loop).
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
        _refuse_length(longest, lengths.index(longest))
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
    json_like = media.startswith("application/") and media.endswith("+json")
    if media in ("", JSON_MEDIA_TYPE) or json_like:
        if charset is not None and charset not in _UTF8:
            raise HTTPError(415, f"JSON bodies must be UTF-8, not {charset[:64]!r}")
        keys, given = parse_json(body, max_batch)
        if check:
            check_keys(keys)
        for name in given:
            if name in options:
                raise HTTPError(400, f"{name} is given both in the query string and the body")
        options.update(given)
    elif media == "text/plain":
        keys = parse_text(body, charset, max_batch)
    elif media == _BINARY:
        keys = parse_binary(body, max_batch)
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

