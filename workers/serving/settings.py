"""Settings of the serving-side middleware, declared once (environment variables of the pod).

Read from the environment when a middleware is built; a pod needs none of them. The
docs table is :func:`lbcore.knobs.docs_table` of :data:`POD_KNOBS`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lbcore.knobs import (
    Knob,
    from_mapping,
    parse_choice,
    parse_int_between,
    seconds_at_least,
)

__all__ = ["POD_KNOBS", "PodSettings"]


def _path(text: str) -> str:
    t = text.strip()
    if not re.fullmatch(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]{0,200}", t):
        raise ValueError("expected an absolute URL path such as /.well-known/cslb/load")
    return t


POD_CAPACITY = Knob(
    "capacity",
    "CSLB_POD_CAPACITY",
    "--pod-capacity",
    0,
    parse_int_between(0, 1_000_000),
    "Requests the pod serves at once, the denominator of the application_utilization it "
    "reports (occupancy / capacity). 'auto' (0): gunicorn's workers x threads as the running "
    "worker was configured (one per worker for async worker classes); outside gunicorn, the "
    "processes recording into the pod's pool (1 for a single process).",
    "N",
    auto=True,
)
POD_WINDOW = Knob(
    "window_s",
    "CSLB_POD_WINDOW",
    "--pod-window",
    10.0,
    seconds_at_least(1.0, 300.0),
    "Window of the reported occupancy and rates, in seconds, kept in ten buckets: busy "
    "seconds per second over the last window, open requests counted from their start.",
    "SECONDS",
)
POD_REFRESH = Knob(
    "refresh_s",
    "CSLB_POD_REPORT_REFRESH",
    "--pod-report-refresh",
    0.1,
    seconds_at_least(0.0, 10.0),
    "Each worker process recomputes the report it sends at most this often, in seconds "
    "(0: for every response); responses in between carry the last one.",
    "SECONDS",
)
POD_POOL = Knob(
    "pool",
    "CSLB_POD_POOL",
    "--pod-pool",
    "auto",
    parse_choice(("auto", "parent", "process")),
    "Which processes pool their load into one report: 'parent' (every child of the same "
    "parent, such as uvicorn --workers), 'process' (each process alone), 'auto' (the "
    "gunicorn master's workers under gunicorn, else each process alone).",
    "MODE",
)
POD_LOAD_PATH = Knob(
    "load_path",
    "CSLB_POD_LOAD_PATH",
    "--pod-load-path",
    "/.well-known/cslb/load",
    _path,
    "Path of the load-only request: a GET or HEAD there is answered by the middleware with "
    "the load headers (and the same values as a small JSON body) without calling the app, "
    "so callers can refresh the report of a pod they no longer call.",
    "PATH",
)

#: Every setting of the serving-side middleware.
POD_KNOBS: tuple[Knob, ...] = (POD_CAPACITY, POD_WINDOW, POD_REFRESH, POD_POOL, POD_LOAD_PATH)


@dataclass(frozen=True, slots=True)
class PodSettings:
    """The middleware's settings (see :data:`POD_KNOBS`); durations in seconds."""

    capacity: int = 0
    window_s: float = 10.0
    refresh_s: float = 0.1
    pool: str = "auto"
    load_path: str = "/.well-known/cslb/load"

    @classmethod
    def from_env(cls, env: Mapping[str, Any] | None = None, **overrides: Any) -> PodSettings:
        """Settings from ``env`` (default: ``os.environ``), then ``overrides`` by name.

        Raises
        ------
        lbcore.knobs.KnobError
            A variable set to a value out of range, naming it.
        """
        values = from_mapping(os.environ if env is None else env, POD_KNOBS)
        unknown = set(overrides) - {k.name for k in POD_KNOBS}
        if unknown:
            raise TypeError(f"unknown pod settings: {', '.join(sorted(unknown))}")
        for k in POD_KNOBS:
            if overrides.get(k.name) is not None:
                values[k.name] = k.convert(overrides[k.name], "argument")
        return cls(**values)
