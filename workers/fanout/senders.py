"""Ready-made senders for the fan-out helper, and how a failed call is classified.

``router.fanout(keys, send)`` calls ``send(url, key)``; ``await router.afanout(keys,
asend)`` awaits ``asend(url, key)``. Any callable works (it returns the value or
raises; any exception is a failure), on a pool of ``CSLB_FANOUT_THREADS`` calls at once;
the ready-made senders keep keep-alive connections per worker process:

* :class:`CurlSender` — the fast path, for both ``fanout`` and ``afanout``: the fan-out
  puts every call of the batch in flight at once on libcurl's multi interface
  (:mod:`workers.fanout.curl_driver`), timed by libcurl;
* :class:`Urllib3Sender` (urllib3 comes with the Kubernetes client) for ``fanout``;
* :class:`HttpxSender` (``pip install cslb[httpx]``) for ``afanout`` under an asyncio
  worker (uvicorn's).

All send ``GET <url><path>`` with the key URL-quoted into ``path`` (and, for the
grouped form, ``POST <url><batch_path>`` with a JSON array of keys, answered by a JSON
array of values in the same order), decode the body (JSON by default), and raise
:class:`CallConnectError`, :class:`CallTimeoutError` or :class:`CallStatusError` (a 5xx,
or any status in ``fail_statuses``) so the helper knows what to retry and the counters
record how each pod fails (:func:`failure_kind`); another non-2xx status raises
:class:`CallAnswerError`, the key's error but not the pod's failure. A sender that
takes a ``timeout`` keyword gets the fan-out's per-call timeout (seconds).

With ``CSLB_LOAD_REPORTS=on`` the ready-made senders also read each answer's
``endpoint-load-metrics`` and ``Server-Timing`` (:mod:`workers.fanout.reports`): the
pod's service time becomes the call's busy time, its report goes into shared memory.
"""

from __future__ import annotations

import importlib
import json
import re
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypedDict, Unpack
from urllib.parse import quote

from lbcore.outlier import FAIL_CONNECT, FAIL_NONE, FAIL_OTHER, FAIL_STATUS, FAIL_TIMEOUT
from workers.fanout.reports import hand_over, read_headers, report_settings

__all__ = [
    "CallAnswerError",
    "CallConnectError",
    "CallError",
    "CallStatusError",
    "CallTimeoutError",
    "CurlGroup",
    "CurlSender",
    "HttpxSender",
    "SenderOptions",
    "Urllib3Sender",
    "failure_kind",
]

# Text that URL-quoting leaves as it is (RFC 3986 unreserved characters).
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*").fullmatch

#: Statuses that count as the pod's failure by default: every 5xx.
SERVER_ERRORS = frozenset(range(500, 600))


class CallError(Exception):
    """A call to an endpoint failed; :attr:`kind` says how (``lbcore.outlier.FAIL_*``)."""

    kind = FAIL_OTHER

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


class CallConnectError(CallError):
    """No answer could be asked for: connection refused, reset or dropped."""

    kind = FAIL_CONNECT


class CallTimeoutError(CallError):
    """No answer within the call's timeout (connecting or reading)."""

    kind = FAIL_TIMEOUT


class CallStatusError(CallError):
    """The endpoint answered with a failure status (5xx, or one configured)."""

    kind = FAIL_STATUS

    def __init__(self, status: int, url: str | None = None, body: bytes = b"") -> None:
        super().__init__(f"HTTP {status} from {url}", url)
        self.status = status
        self.body = body[:200]


class CallAnswerError(CallError):
    """The endpoint answered with a status that is not a failure status (a 4xx, say).

    The key failed, but the pod did its job: the request was the caller's problem, so
    it is neither retried nor counted as the pod's failure (as Envoy and Finagle treat
    a 4xx). Its kind is :data:`~lbcore.outlier.FAIL_NONE`.
    """

    kind = FAIL_NONE

    def __init__(self, status: int, url: str | None = None, body: bytes = b"") -> None:
        super().__init__(f"HTTP {status} from {url}", url)
        self.status = status
        self.body = body[:200]


def failure_kind(exc: BaseException) -> int:
    """How a call failed, as :mod:`lbcore.outlier`'s ``FAIL_*`` code.

    This module's exceptions carry their kind (:class:`CallAnswerError`:
    :data:`~lbcore.outlier.FAIL_NONE`, an answer, not the pod's failure); the standard
    library's, urllib3's and httpx's transport errors (raised by a sender of your own)
    are recognized too, and httpx's status errors (a 4xx is an answer); anything else is
    :data:`~lbcore.outlier.FAIL_OTHER`.
    """
    kind = getattr(exc, "kind", None)
    if isinstance(exc, CallError) and kind in (FAIL_NONE, FAIL_CONNECT, FAIL_TIMEOUT, FAIL_STATUS):
        return int(kind)
    if isinstance(exc, TimeoutError):  # socket.timeout and asyncio's are this class
        return FAIL_TIMEOUT
    if isinstance(exc, ConnectionError):
        return FAIL_CONNECT
    name = type(exc).__module__.split(".")[0]
    if name == "urllib3":
        return _urllib3_kind(exc)
    if name == "httpx":
        return _httpx_kind(exc)
    return FAIL_OTHER


def _urllib3_kind(exc: BaseException) -> int:
    from urllib3 import exceptions as e

    if isinstance(exc, e.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, e.NewConnectionError):  # (a subclass of ConnectTimeoutError)
        return FAIL_CONNECT
    if isinstance(exc, e.TimeoutError):
        return FAIL_TIMEOUT
    if isinstance(exc, (e.ProtocolError, e.ProxyError)):
        return FAIL_CONNECT
    return FAIL_OTHER


def _httpx_kind(exc: BaseException) -> int:
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return FAIL_TIMEOUT
    if isinstance(exc, (httpx.NetworkError, httpx.RemoteProtocolError)):
        return FAIL_CONNECT
    if isinstance(exc, httpx.HTTPStatusError):
        return FAIL_STATUS if exc.response.status_code >= 500 else FAIL_NONE
    return FAIL_OTHER


def _check_status(status: int, fail: Collection[int], url: str, body: bytes) -> None:
    if status in fail:
        raise CallStatusError(status, url, body)
    if not 200 <= status < 300:
        raise CallAnswerError(status, url, body)  # the caller's problem, not the pod's


class SenderOptions(TypedDict, total=False):
    """The keywords every ready-made sender takes (besides ``path``).

    Attributes
    ----------
    batch_path
        Path of the grouped form: ``POST`` of a JSON array of keys, answered by a JSON
        array of values in the same order (default ``"/batch"``).
    decode
        Body -> value (default: ``json.loads``); an exception it raises becomes the
        call's :class:`CallError`.
    fail_statuses
        Statuses raised as :class:`CallStatusError` (the pod's failure; default: 5xx).
        Other non-2xx statuses raise :class:`CallAnswerError` (not retried, not the
        pod's failure).
    timeout_s
        Per-call timeout (connect and answer, seconds) when the fan-out passes none
        (default 1).
    headers
        Extra request headers.
    """

    batch_path: str
    decode: Callable[[bytes], Any] | None
    fail_statuses: Collection[int] | None
    timeout_s: float
    headers: dict[str, str] | None


class _Template:
    """What the senders share: building the request, decoding the answer."""

    def __init__(
        self,
        path: str,
        *,
        batch_path: str = "/batch",
        decode: Callable[[bytes], Any] | None = None,
        fail_statuses: Collection[int] | None = None,
        timeout_s: float = 1.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        if "{key}" not in path:
            raise ValueError(f"path must contain '{{key}}', got {path!r}")
        try:
            path.format(key="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"path {path!r} has a field other than '{{key}}': {exc}") from None
        self.path = path
        before, _, after = path.partition("{key}")
        # (the text around the key, its {{ }} escapes undone, as str.format would)
        self._before = before.replace("{{", "{").replace("}}", "}")
        self._after = after.replace("{{", "{").replace("}}", "}")
        self.batch_path = batch_path
        self.decode = json.loads if decode is None else decode
        self.fail_statuses = SERVER_ERRORS if fail_statuses is None else frozenset(fail_statuses)
        self.headers = dict(headers or {})
        self.timeout_s = float(timeout_s)
        # Read the answers' load headers (CSLB_LOAD_REPORTS): off, not even looked at.
        self.reads_reports = report_settings().enabled

    def _timeout_of(self, timeout: float | None) -> float:
        """The call's timeout (seconds): the fan-out's, at least 1 ms, else ``timeout_s``."""
        return self.timeout_s if timeout is None else max(float(timeout), 0.001)

    def _begin(self, timeout: float | None) -> float:
        """Before a call: no report handed over yet; the call's timeout (seconds)."""
        if self.reads_reports:
            hand_over(None)
        return self._timeout_of(timeout)

    def _answered(self, status: int, headers: Any, data: bytes, url: str) -> bytes:
        """After a call: its load headers (name, value pairs) handed over; the body.

        Raises :class:`CallStatusError` or :class:`CallAnswerError` for a status that is
        not a success.
        """
        if self.reads_reports:
            hand_over(read_headers(headers))
        _check_status(status, self.fail_statuses, url, data)
        return data

    @staticmethod
    def _raise_failure(
        kind: int, url: str, timeout: float, exc: BaseException, detail: str
    ) -> None:
        """Raise a client's ``exc`` of failure ``kind`` as the pod's; return for any other."""
        if kind == FAIL_CONNECT:
            raise CallConnectError(f"{url}: {detail}", url) from exc
        if kind == FAIL_TIMEOUT:
            raise CallTimeoutError(f"{url}: no answer within {timeout:g} s", url) from exc

    def url_of(self, url: str, key: Any) -> str:
        text = key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else str(key)
        if not _UNRESERVED(text):  # (most product IDs need no quoting: skip its cost)
            text = quote(text, safe="")
        return url.rstrip("/") + self._before + text + self._after

    def batch_body(self, keys: Sequence[Any]) -> bytes:
        return json.dumps(
            [k.decode("utf-8", "surrogateescape") if isinstance(k, bytes) else k for k in keys]
        ).encode()

    def decoded(self, body: bytes, url: str) -> Any:
        """The value of an answer's ``body``; an undecodable one is the call's error."""
        try:
            return self.decode(body)
        except Exception as exc:
            raise CallError(f"answer from {url} could not be decoded: {exc}", url) from exc

    def values(self, body: bytes, n: int, url: str) -> list[Any]:
        got = self.decoded(body, url)
        if not isinstance(got, list) or len(got) != n:
            raise CallError(f"batch answer from {url} is not a list of {n} values", url)
        return got


class Urllib3Sender(_Template):
    """``send(url, key)`` for :meth:`workers.Router.fanout`, on a urllib3 pool per worker.

    Parameters
    ----------
    path
        Appended to the endpoint URL, ``{key}`` replaced by the URL-quoted key.
    maxsize
        Keep-alive connections kept per endpoint (the fan-out's threads, say).
    **options
        :class:`SenderOptions`: ``batch_path`` (of :meth:`group`), ``decode``,
        ``fail_statuses``, ``timeout_s``, ``headers``.
    """

    def __init__(
        self, path: str = "/{key}", *, maxsize: int = 8, **options: Unpack[SenderOptions]
    ) -> None:
        super().__init__(path, **options)
        # Imported now, not in the first call (its ~0.1 s would count as the pod's).
        self._urllib3: Any = importlib.import_module("urllib3")
        self.maxsize = int(maxsize)
        self._pool: Any = None
        self._lock = threading.Lock()

    def _manager(self) -> Any:
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    # No retries of its own (the fan-out retries on another pod), no
                    # blocking on a full pool (a new connection instead).
                    self._pool = self._urllib3.PoolManager(
                        num_pools=256, maxsize=self.maxsize, block=False, retries=False
                    )
                pool = self._pool
        return pool

    def _request(self, method: str, url: str, body: bytes | None, timeout: float | None) -> bytes:
        t = self._begin(timeout)
        headers = self.headers
        if body is not None:
            headers = {**headers, "Content-Type": "application/json"}
        try:
            r = self._manager().request(
                method,
                url,
                body=body,
                headers=headers,
                timeout=self._urllib3.Timeout(connect=t, read=t),
                redirect=False,
                preload_content=True,
            )
        except Exception as exc:
            self._raise_failure(_urllib3_kind(exc), url, t, exc, str(exc))
            raise
        return self._answered(r.status, r.headers.iteritems(), r.data, url)

    def __call__(self, url: str, key: Any, timeout: float | None = None) -> Any:
        """One call: ``GET <url><path>``; the decoded body."""
        full = self.url_of(url, key)
        return self.decoded(self._request("GET", full, None, timeout), full)

    def group(self, url: str, keys: Sequence[Any], timeout: float | None = None) -> list[Any]:
        """One call for many keys: ``POST <url><batch_path>``; one value per key."""
        full = url.rstrip("/") + self.batch_path
        return self.values(
            self._request("POST", full, self.batch_body(keys), timeout), len(keys), full
        )

    def close(self) -> None:
        """Close the pooled connections."""
        with self._lock:
            if self._pool is not None:
                self._pool.clear()
                self._pool = None


class HttpxSender(_Template):
    """``asend(url, key)`` for :meth:`workers.Router.afanout`, on an httpx.AsyncClient.

    One client (connection pool) per event loop, made on first use in it. Parameters
    as for :class:`Urllib3Sender`; ``max_connections`` bounds the client's connections
    in all. Raises ``ImportError`` naming the extra to install when httpx is missing.
    """

    def __init__(
        self, path: str = "/{key}", *, max_connections: int = 100, **options: Unpack[SenderOptions]
    ) -> None:
        super().__init__(path, **options)
        try:  # now, not in the first call (its ~0.1 s would count as the pod's)
            self._httpx: Any = importlib.import_module("httpx")
        except ImportError as exc:
            raise ImportError(
                "HttpxSender needs httpx: pip install 'cslb[httpx]' (or httpx)"
            ) from exc
        self.max_connections = int(max_connections)
        self._clients: dict[int, Any] = {}

    def _client(self) -> Any:
        import asyncio

        import httpx

        loop = asyncio.get_running_loop()
        c = self._clients.get(id(loop))
        if c is None or c.is_closed:
            limits = httpx.Limits(
                max_connections=self.max_connections,
                max_keepalive_connections=self.max_connections,
            )
            c = httpx.AsyncClient(limits=limits, headers=self.headers, follow_redirects=False)
            self._clients = {id(loop): c}  # (one loop per worker; a new loop, a new client)
        return c

    async def _request(
        self, method: str, url: str, body: bytes | None, timeout: float | None
    ) -> bytes:
        import httpx

        t = self._begin(timeout)
        try:
            r = await self._client().request(
                method,
                url,
                content=body,
                headers={"Content-Type": "application/json"} if body is not None else None,
                timeout=httpx.Timeout(t),
            )
        except httpx.HTTPError as exc:
            self._raise_failure(_httpx_kind(exc), url, t, exc, repr(exc))
            raise
        return self._answered(r.status_code, r.headers.multi_items(), r.content, url)

    async def __call__(self, url: str, key: Any, timeout: float | None = None) -> Any:
        """One call: ``GET <url><path>``; the decoded body."""
        full = self.url_of(url, key)
        return self.decoded(await self._request("GET", full, None, timeout), full)

    async def group(self, url: str, keys: Sequence[Any], timeout: float | None = None) -> list[Any]:
        """One call for many keys: ``POST <url><batch_path>``; one value per key."""
        full = url.rstrip("/") + self.batch_path
        body = await self._request("POST", full, self.batch_body(keys), timeout)
        return self.values(body, len(keys), full)

    async def aclose(self) -> None:
        """Close the client of the running loop."""
        clients, self._clients = self._clients, {}
        for c in clients.values():
            await c.aclose()


#: Largest answer body a CurlSender takes by default (bytes).
MAX_BODY_BYTES = 16 << 20


class CurlSender(_Template):
    """The fast sender: a fan-out's calls all in flight at once on libcurl's multi interface.

    Pass it to ``router.fanout(keys, sender)`` (sync and gthread workers) or ``await
    router.afanout(keys, sender)`` (asyncio workers), and :attr:`group` with
    ``grouped=True``: the fan-out then runs every call of the batch at once on the
    worker thread's (or event loop's) libcurl multi handle, with HTTP/1.1 keep-alive
    connections per pod (``CSLB_FANOUT_CONNECTIONS``), and records each call's busy time
    as libcurl measured it on the wire (:mod:`workers.fanout.curl_driver`,
    :mod:`workers.fanout.curl_transport`).

    Calling the sender itself (``sender(url, key)``) makes one blocking call on this
    thread's transport: for code of your own, not for an event loop.

    Parameters
    ----------
    path
        Appended to the endpoint URL, ``{key}`` replaced by the URL-quoted key.
    max_body_bytes
        Largest answer body taken (bytes); a larger one stops the call as a
        :class:`CallError`, so a pod cannot make a worker buffer gigabytes.
    **options
        :class:`SenderOptions`: ``batch_path`` (of :attr:`group`), ``decode``,
        ``fail_statuses``, ``timeout_s``, ``headers``.
    """

    def __init__(
        self,
        path: str = "/{key}",
        *,
        max_body_bytes: int = MAX_BODY_BYTES,
        **options: Unpack[SenderOptions],
    ) -> None:
        super().__init__(path, **options)
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int):
            raise TypeError(f"max_body_bytes must be an int, got {max_body_bytes!r}")
        if not 1 <= max_body_bytes <= 1 << 40:
            raise ValueError(f"max_body_bytes must be from 1 to 2**40, got {max_body_bytes}")
        for name, value in self.headers.items():
            text = f"{name}: {value}"
            if not name or any(c in name + value for c in "\r\n\0") or ":" in name:
                raise ValueError(f"header {name!r}: {value!r} cannot be sent")
            try:
                text.encode("latin-1")
            except UnicodeEncodeError:
                raise ValueError(
                    f"header {name!r}: {value!r} is not latin-1 text (HTTP/1.1 headers are)"
                ) from None
        self.max_body_bytes = max_body_bytes
        # libcurl's header lists, built once; "Expect:" stops a 100-continue round trip.
        own = [f"{k}: {v}" for k, v in self.headers.items()]
        self.headers_list = own
        self.post_headers = [*own, "Content-Type: application/json", "Expect:"]
        self.group = CurlGroup(self)

    def batch_url(self, url: str) -> str:
        """The grouped call's URL at the pod ``url``."""
        return url.rstrip("/") + self.batch_path

    def finish(self, status: int, body: bytes, url: str, what: Any, grouped: bool) -> Any:
        """The value of a call that got an answer (or raise its error)."""
        _check_status(status, self.fail_statuses, url, body)
        if grouped:
            return self.values(body, len(what), url)
        return self.decoded(body, url)

    def _one(self, url: str, what: Any, grouped: bool, timeout: float | None) -> Any:
        from workers.fanout.curl_transport import thread_reactor

        reactor = thread_reactor()
        got: list[Any] = []
        t = self._timeout_of(timeout)
        if grouped:
            full, body = self.batch_url(url), self.batch_body(what)
        else:
            full, body = self.url_of(url, what), None
        h = reactor.transport.start(self, full, what, body, t, got.append, grouped)
        try:
            reactor.run(lambda: bool(got), time.monotonic_ns() + int((t + 1.0) * 1e9))
        finally:
            if not got:
                reactor.transport.cancel(h)
        if not got:
            raise CallTimeoutError(f"{full}: no answer within {t:g} s", full)
        value, exc = got[0][0], got[0][1]
        if exc is not None:
            raise exc
        return value

    def __call__(self, url: str, key: Any, timeout: float | None = None) -> Any:
        """One blocking call: ``GET <url><path>``; the decoded body."""
        return self._one(url, key, False, timeout)


class CurlGroup:
    """A :class:`CurlSender`'s grouped form: one ``POST <batch_path>`` per pod.

    ``router.fanout(keys, sender.group, grouped=True)`` sends each pod its keys in one
    call. Called directly (``sender.group(url, keys)``) it makes one blocking call.
    """

    def __init__(self, sender: CurlSender) -> None:
        self.sender = sender

    def __call__(self, url: str, keys: Sequence[Any], timeout: float | None = None) -> list[Any]:
        """One blocking call for many keys: ``POST <url><batch_path>``; one value per key."""
        return self.sender._one(url, keys, True, timeout)
