"""Life inside a prefork server (DESIGN.md, "The rooms": ``workers``).

Five parts, one subpackage each:

* :mod:`workers.routing`: the in-worker library. :class:`workers.Router` is the API user
  code calls in a worker: ``Router.attach()``, ``route(keys)``, ``endpoints_of(idx)``,
  ``track(idx)``; beside it the table snapshot, the fan-out tracker and the counter row.
* :mod:`workers.fanout`: calling the chosen pods: the jobs, their drivers (threads,
  asyncio, libcurl), admission, the retry budget, the call ledger, the settings, the
  senders and the failure log.
* :mod:`workers.surfaces`: what people and tools see: the bundled app and its request
  bodies, ``mount()`` for your app, the host monitor, the metrics collector, the status
  page, and the reports of ``cslb route --live`` and ``cslb inspect``.
* :mod:`workers.master`: the gunicorn master side: the config module's hooks, the
  master's duties, the discovery supervisor, logging and ``cslb serve``'s command.
* :mod:`workers.serving`: the product pods' side: the middleware that reports a pod's
  own load on its answers (``endpoint-load-metrics``), pooled across its workers.

Public spellings kept as modules of their own: :mod:`workers.gunicorn_conf` (gunicorn's
``-c python:workers.gunicorn_conf``), :mod:`workers.app` (``workers.app:app``),
:mod:`workers.mount` (``mount``, ``workers.mount:app``), :mod:`workers.senders` and
:mod:`workers.gunicorn_logging` (gunicorn's ``logger_class``).

Names are imported lazily, so ``import workers`` in a gunicorn master loads neither
NumPy tables nor shared memory until something asks for them.
"""

from __future__ import annotations

from workers.lazy import lazy_names

__all__ = ["Router", "RouterError", "RouterInputError", "RouterStateError"]

_LAZY = {name: "workers.routing.router" for name in __all__}


__getattr__, __dir__ = lazy_names(globals(), _LAZY)
