"""The in-worker library: the router, its table snapshot, the fan-out tracker, the counter row.

* :mod:`workers.routing.router`: :class:`~workers.routing.router.Router`, the face user
  code calls (also ``from workers import Router``).
* :mod:`workers.routing.snapshot`: follows the published tables and builds the plan.
* :mod:`workers.routing.tracker`: one start and one end per fan-out on the counter row.
* :mod:`workers.routing.rows`: the worker's counter row, claimed or handed over.
* :mod:`workers.routing.recording`: the narrow handle everything writes the row through.
* :mod:`workers.routing.errors`: the router's error types (the fan-out raises them too).
"""
