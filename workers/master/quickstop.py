"""A prompt stop for uvicorn's gunicorn worker: gunicorn's SIGQUIT shuts its server down.

gunicorn stops its workers with SIGQUIT on SIGINT (Ctrl-C) and SIGQUIT to the master,
then waits up to ``--graceful-timeout`` (30 s by default) before SIGKILL. uvicorn's
gunicorn worker (``uvicorn_worker.UvicornWorker``, and the older
``uvicorn.workers.UvicornWorker``) handles SIGQUIT with gunicorn's ``handle_exit``,
which only clears ``worker.alive``, a flag its server never reads: the worker serves on
until the master SIGKILLs it, so every Ctrl-C took the whole graceful timeout (a bare
app does the same: it is the worker's behaviour, not cslb's). Only a signal that
reaches the terminal's whole process group (a Ctrl-C in a shell) also hands the worker
the SIGINT its server listens to, and even then not always before the SIGQUIT.

:func:`quick_stop_uvicorn` makes that SIGQUIT also raise SIGTERM in the worker, which
uvicorn's own handler turns into its graceful shutdown: responses in progress finish,
idle connections close, the lifespan shutdown runs, the process exits. The master's
graceful timeout still bounds it (SIGKILL after), so a request that outlives the
timeout ends as before.
"""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["quick_stop_uvicorn"]


def quick_stop_uvicorn(worker: Any) -> bool:
    """Under uvicorn's worker, make gunicorn's SIGQUIT stop the server; True if it did.

    Call in the worker before its ``run`` (gunicorn's ``post_worker_init``): uvicorn's
    worker installs its SIGQUIT handler from ``worker.handle_exit`` when it starts
    serving. Any other worker class is left as it is.
    """
    if not callable(getattr(worker, "_install_sigquit_handler", None)):
        return False
    original = worker.handle_exit

    def handle_exit(sig: int, frame: Any) -> None:
        original(sig, frame)
        if sig == signal.SIGQUIT:
            signal.raise_signal(signal.SIGTERM)  # uvicorn's handler: graceful shutdown

    worker.handle_exit = handle_exit
    return True
