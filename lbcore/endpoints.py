"""Endpoints: address lists and Skipper's identity of a host.

A ring's endpoints are address strings, verbatim and unique (:func:`endpoint_tuple`).
Skipper's skip rule compares them by host (:func:`host_key`: lower-cased
``host:port`` with the scheme's default port), so two addresses of one pod count as one
candidate; :func:`host_ids_of` numbers a list's hosts once per ring.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from lbcore.errors import EndpointError

__all__ = ["endpoint_tuple", "host_ids_of", "host_key", "parsed_host_key", "renumbered"]

_DEFAULT_PORTS = {"http": 80, "https": 443}  # what Skipper's net.SchemeHost fills in

# scheme://host[:port] with nothing urlsplit would strip, unquote or reject: the common
# endpoint, whose parse is this match (much cheaper than urlsplit; a ring parses them all).
_PLAIN_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://([A-Za-z0-9_\-.]+)(?::([0-9]{1,5}))?")


def host_key(endpoint: str) -> str:
    """Skipper's identity of an endpoint for the skip rule: lower-cased ``host:port``.

    Skipper compares candidates by the parsed ``Host`` of the LB endpoint (with the
    scheme's default port filled in), so ``http://A:80`` and ``http://a`` are one host.
    An address without a scheme (only valid for the ring function) is its own identity.
    """
    m = _PLAIN_URL.fullmatch(endpoint)
    if m is not None:
        scheme, host, digits = m.groups()
        port = _DEFAULT_PORTS.get(scheme.lower()) if digits is None else int(digits)
        if port is None:
            return host.lower()
        if port <= 65535:
            return f"{host.lower()}:{port}"
    return parsed_host_key(endpoint)


def renumbered(host_ids: np.ndarray) -> np.ndarray:
    """Ids renumbered from 0 in order of first appearance (of a subset of endpoints)."""
    _, first, inverse = np.unique(host_ids, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.intp)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    out = rank[inverse.reshape(-1)]
    out.flags.writeable = False
    return out


# Lines of "scheme://host:port" with a port from 0 to 65535 without leading zeros: their
# host_key is the line lower-cased without its scheme (no default port to fill in).
_PORT = (
    r"(?:0|[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
)
_CANONICAL = re.compile(rf"(?:[A-Za-z][A-Za-z0-9+.\-]*://[A-Za-z0-9_\-.]+:{_PORT}(?:\n|\Z))*")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.\-]*://", re.MULTILINE)


def host_ids_of(endpoints: Sequence[str]) -> np.ndarray:
    """Per endpoint, an id shared by endpoints with the same :func:`host_key` (read-only).

    Ids are numbered from 0 in order of first appearance. A list of only canonical
    ``scheme://host:port`` addresses (the usual one) is parsed by two regular-expression
    passes over the joined list instead of one :func:`host_key` call per address.
    """
    n = len(endpoints)
    text = "\n".join(endpoints)
    keys: Any = None
    if _CANONICAL.fullmatch(text):
        keys = _SCHEME.sub("", text.lower()).split("\n")
        if len(keys) != n:  # (an address holding a newline cannot match; be sure)
            keys = None
    if keys is None:
        keys = map(host_key, endpoints)
    ids: dict[str, int] = {}
    out = np.fromiter((ids.setdefault(k, len(ids)) for k in keys), np.intp, n)
    out.flags.writeable = False
    return out


def parsed_host_key(endpoint: str) -> str:
    """:func:`host_key` by ``urllib.parse.urlsplit``, for every address.

    The general parse :func:`host_key` falls back on for addresses its pattern does not
    take, and the reference its fast path is checked against.
    """
    if "://" not in endpoint:
        return endpoint.lower()
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return endpoint.lower()
    if not host:
        return endpoint.lower()
    scheme = parts.scheme.lower()
    if port is None:
        port = _DEFAULT_PORTS.get(scheme)
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}" if port is not None else host


def endpoint_tuple(
    endpoints: Any, *, allow_empty: bool = False, allow_duplicates: bool = False
) -> tuple[str, ...]:
    """Validate a list of endpoint address strings and return it as a tuple.

    Raises
    ------
    EndpointError
        For a single string (a common slip: it would be read as its characters), an
        empty list (unless allowed), a non-string or empty address, or a duplicate.
    """
    if isinstance(endpoints, (str, bytes)):
        raise EndpointError(
            f"endpoints must be a list of address strings, got one string {endpoints!r:.60}"
        )
    eps = tuple(endpoints)
    if not eps and not allow_empty:
        raise EndpointError("endpoint list is empty; a ring needs at least one endpoint")
    seen: dict[str, int] = {}
    for i, ep in enumerate(eps):
        if not isinstance(ep, str):
            raise EndpointError(f"endpoint {i} is {type(ep).__name__}, expected an address string")
        if not ep:
            raise EndpointError(f"endpoint {i} is an empty string")
        if ep in seen and not allow_duplicates:
            raise EndpointError(
                f"endpoint {ep!r} appears twice (positions {seen[ep]} and {i}); "
                "endpoint addresses must be unique"
            )
        seen[ep] = i
    return eps
