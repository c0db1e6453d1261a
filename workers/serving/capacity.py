"""A pod's capacity: how many requests it serves at once (workers × threads).

Under gunicorn the answer is in the worker's own configuration, which has already merged
the command line, ``GUNICORN_CMD_ARGS``, ``WEB_CONCURRENCY`` and any config file; so
rather than parse any of them again, it is read from the worker object. gunicorn gives no
module-level handle on it, but a worker installs its bound methods as signal handlers
(``handle_quit``, ``handle_exit``, ``handle_usr1`` ...), and ``signal.getsignal`` hands
them back from any thread: their ``__self__`` is the worker and ``worker.cfg`` its
settings. uvicorn's gunicorn worker does the same for ``SIGUSR1``.

gthread workers serve ``threads`` requests at once and sync workers one; other worker
classes (gevent, eventlet, uvicorn's) count one per worker, an event loop's CPU: set
``CSLB_POD_CAPACITY`` where their concurrency means more.
"""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["gunicorn_capacity", "gunicorn_worker"]

_SIGNALS = tuple(
    getattr(signal, s)
    for s in ("SIGTERM", "SIGQUIT", "SIGUSR1", "SIGINT", "SIGWINCH", "SIGABRT")
    if hasattr(signal, s)
)


def gunicorn_worker() -> Any | None:
    """The gunicorn worker object running this process, or ``None`` outside one."""
    for sig in _SIGNALS:
        try:
            handler = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
        owner = getattr(handler, "__self__", None)
        if owner is None or not hasattr(owner, "cfg") or not hasattr(owner, "ppid"):
            continue
        mro = [c.__module__ for c in type(owner).__mro__]
        if any(m.startswith("gunicorn.workers") for m in mro):
            return owner
    return None


def gunicorn_capacity() -> tuple[int, str] | None:
    """``(workers × threads, how it was found)`` from the running gunicorn worker's settings.

    ``None`` outside a gunicorn worker or when its settings cannot be read.
    """
    worker = gunicorn_worker()
    if worker is None:
        return None
    try:
        cfg = worker.cfg
        workers = max(1, int(cfg.workers))
        threads = max(1, int(cfg.threads))
        kind = type(worker).__name__
    except (AttributeError, TypeError, ValueError):
        return None
    per_worker = threads if kind in ("ThreadWorker", "SyncWorker") else 1
    return workers * per_worker, f"gunicorn {kind}: {workers} workers x {per_worker}"
