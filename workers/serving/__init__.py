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

from workers.lazy import lazy_names

__all__ = ["LOAD_PATH", "ASGILoadReportMiddleware", "LoadReportMiddleware", "PodLoad"]

_LAZY = {
    "LOAD_PATH": "workers.serving.middleware",
    "LoadReportMiddleware": "workers.serving.middleware",
    "ASGILoadReportMiddleware": "workers.serving.middleware",
    "PodLoad": "workers.serving.podload",
}


__getattr__, __dir__ = lazy_names(globals(), _LAZY)
