"""cslb's ``/metrics``, ``/healthz``, ``/readyz`` and ``/status`` inside your own app.

One line, at the end of your app module::

    from workers.surfaces.mount import mount
    app = mount(app)            # WSGI: gunicorn sync or gthread workers

    from workers.surfaces.mount import mount_asgi
    app = mount_asgi(app)       # ASGI: uvicorn's gunicorn worker

Requests for those four paths are answered by cslb's :class:`~workers.surfaces.app.CslbApp`
(the host's routing state, read from shared memory); every other request, and every
non-HTTP ASGI scope (lifespan, websocket), goes to your app unchanged. ``/route`` is not
mounted: your app routes through :class:`workers.Router` itself.

``/metrics`` carries your own prometheus_client metrics too, so one scrape gets both:
the default registry, or, when ``PROMETHEUS_MULTIPROC_DIR`` is set (prometheus_client's
multiprocess mode), a :class:`~prometheus_client.multiprocess.MultiProcessCollector`
over that directory, as prometheus_client's docs prescribe for gunicorn. Pass
``registry=`` to use another, or ``registry=None`` for cslb's metrics alone. cslb's own
metrics never go through those registries or files: they are read from shared memory.

Nothing is attached at import or when :func:`mount` runs (a gunicorn master that
preloads the app maps no shared memory): cslb's app is built on the first request to
one of its paths, configured from the ``CSLB_*`` variables (``CSLB_SHM_NAMESPACE``...).

``workers.mount:app`` is what ``cslb serve --app MODULE:APP`` runs: the app named by
``CSLB_APP``, imported in the worker and mounted (ASGI if its ``__call__`` is a
coroutine function, else WSGI).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.registry import Collector

from lbcore.knobs import Knob

__all__ = ["APP", "PATHS", "load_app", "mount", "mount_asgi", "user_registry"]

#: The paths cslb answers inside a mounted app.
PATHS = ("/metrics", "/healthz", "/readyz", "/status")

_DEFAULT = object()


def _app_spec(text: str) -> str:
    spec = text.strip()
    module, _, attr = spec.partition(":")
    if not module or not all(p.isidentifier() for p in module.split(".")):
        raise ValueError("expected MODULE:APP, e.g. myservice.wsgi:app")
    if attr and not all(p.isidentifier() for p in attr.split(".")):
        raise ValueError("expected MODULE:APP with APP a (dotted) name")
    return spec


#: ``CSLB_APP``: the app ``workers.mount:app`` imports and mounts (``cslb serve --app``).
APP = Knob(
    "app",
    "CSLB_APP",
    "--app",
    "",
    _app_spec,
    "Your WSGI or ASGI app as MODULE:APP (APP defaults to 'app'): cslb serve --app runs "
    "it with cslb's /metrics, /healthz, /readyz and /status mounted (workers.mount:app).",
    "MODULE:APP",
)


def user_registry(environ: Mapping[str, str] | None = None) -> CollectorRegistry:
    """The registry of the app's own prometheus_client metrics.

    prometheus_client's default registry, or a fresh one with a ``MultiProcessCollector``
    when ``PROMETHEUS_MULTIPROC_DIR`` (or the older ``prometheus_multiproc_dir``) is set.
    """
    env = os.environ if environ is None else environ
    path = env.get("PROMETHEUS_MULTIPROC_DIR") or env.get("prometheus_multiproc_dir")
    if not path:
        return REGISTRY
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    return registry


class _Forward(Collector):
    """Yields another registry's families at every scrape.

    It has no ``describe``, so the two registries' names are never checked against each
    other at registration.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        """The other registry's families."""
        return iter(list(self.registry.collect()))


class _Cslb:
    """cslb's app for the mounted paths, built on first use (in the worker)."""

    def __init__(self, registry: Any) -> None:
        self._registry = registry
        self._app: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        a = self._app
        if a is None:
            with self._lock:
                if self._app is None:
                    from workers.surfaces.app import CslbApp  # here: nothing maps at import

                    reg = user_registry() if self._registry is _DEFAULT else self._registry
                    a = CslbApp.from_environ()
                    if reg is not None:
                        a.registry.register(_Forward(reg))
                    self._app = a
                a = self._app
        return a


def mount(app: Callable[..., Iterable[bytes]], *, registry: Any = _DEFAULT) -> Callable[..., Any]:
    """``app`` (WSGI) with cslb's :data:`PATHS` answered by cslb.

    Parameters
    ----------
    app
        Your WSGI application.
    registry
        Whose metrics ``/metrics`` adds to cslb's: by default :func:`user_registry`;
        ``None`` for none.
    """
    cslb = _Cslb(registry)
    paths = frozenset(PATHS)

    def mounted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") in paths:
            return cslb.get()(environ, start_response)
        return app(environ, start_response)

    mounted.__wrapped__ = app  # type: ignore[attr-defined]
    mounted.cslb = cslb  # type: ignore[attr-defined]
    return mounted


ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[Any]]],
    Awaitable[None],
]


def _wsgi_call(a: Any, environ: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
    got: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        got[:] = [status, headers]

    body = b"".join(a(environ, start_response))
    return int(got[0].split(" ", 1)[0]), got[1], body


class _MountedASGI:
    def __init__(self, app: ASGIApp, registry: Any) -> None:
        self.app = app
        self.cslb = _Cslb(registry)
        self.paths = frozenset(PATHS)
        self.__wrapped__ = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        while True:  # drain the request body (these paths take none)
            message = await receive()
            if message.get("type") != "http.request" or not message.get("more_body"):
                break
        server = scope.get("server") or ("localhost", 80)
        environ = {
            "REQUEST_METHOD": scope.get("method", "GET"),
            "PATH_INFO": scope["path"],
            "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
            "SERVER_NAME": str(server[0]),
            "SERVER_PORT": str(server[1]),
            "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
            "wsgi.url_scheme": scope.get("scheme", "http"),
        }
        for name, value in scope.get("headers", ()):
            key = name.decode("latin-1").upper().replace("-", "_")
            environ[f"HTTP_{key}"] = value.decode("latin-1")
        # A scrape reads shared memory for a few ms: off the event loop.
        status, headers, body = await asyncio.to_thread(_wsgi_call, self.cslb.get(), environ)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            }
        )
        await send({"type": "http.response.body", "body": body})


def mount_asgi(app: ASGIApp, *, registry: Any = _DEFAULT) -> ASGIApp:
    """``app`` (ASGI 3) with cslb's :data:`PATHS` answered by cslb (see :func:`mount`)."""
    return _MountedASGI(app, registry)


def _is_asgi(obj: Any) -> bool:
    call = obj if inspect.isfunction(obj) else getattr(obj, "__call__", None)  # noqa: B004
    return inspect.iscoroutinefunction(call)


def load_app(spec: str) -> Any:
    """Import ``MODULE:APP`` (APP defaults to ``app``) and mount cslb's paths into it."""
    spec = APP.convert(spec, "CSLB_APP")
    module, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in (attr or "app").split("."):
        obj = getattr(obj, part)
    return mount_asgi(obj) if _is_asgi(obj) else mount(obj)


def __getattr__(name: str) -> Any:
    # ``workers.mount:app``: resolved when gunicorn's worker imports it, not before.
    if name == "app":
        value = load_app(os.environ.get(APP.env, ""))
        globals()["app"] = value
        return value
    raise AttributeError(f"module 'workers.surfaces.mount' has no attribute {name!r}")
