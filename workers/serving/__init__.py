"""The serving side: what product pods run so their callers can balance on the pod's own clock.

* :mod:`workers.serving.orca` (re-exporting :mod:`lbwire.orca`, the one copy): the wire
  format both sides share (``endpoint-load-metrics`` in ORCA's forms, ``Server-Timing``):
  :func:`~lbwire.orca.format_report` for pods, :func:`~lbwire.orca.parse_header_block` and
  friends for callers.
* :class:`LoadReportMiddleware` (WSGI) and :class:`ASGILoadReportMiddleware` (ASGI): measure
  the pod's occupancy across all its worker processes and report it on every response,
  and answer the load-only path :data:`LOAD_PATH` without calling the app.

Names are imported lazily: a caller importing :mod:`workers.serving.orca` loads neither
NumPy nor shared memory.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LOAD_PATH", "ASGILoadReportMiddleware", "LoadReportMiddleware", "PodLoad"]

_LAZY = {
    "LOAD_PATH": "workers.serving.middleware",
    "LoadReportMiddleware": "workers.serving.middleware",
    "ASGILoadReportMiddleware": "workers.serving.middleware",
    "PodLoad": "workers.serving.podload",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workers.serving' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
