"""The HTTP benchmark's attribution: the bundled app's ``POST /route`` steps, each timed.

Served by the same ``cslb serve`` command as the two apps it explains
(``--app perf.stages_app:app``), this app answers ``POST /route`` as the bundled app
does, by the same public steps in the same order (:func:`workers.app.read_body`,
:func:`workers.app.parse_route_request`, :meth:`workers.Router.route_table`,
:class:`workers.surfaces.answers.RouteAnswers`), and measures each step's thread CPU time
(``CLOCK_THREAD_CPUTIME_ID``, less the clock's own cost, measured once per worker).
Every :data:`FLUSH_EVERY` requests each worker writes its figures to
``$CSLB_BENCH_STAGES_DIR/<pid>.json``: per step, the sum over all requests and the
durations of the last :data:`KEEP` requests (nanoseconds). Other paths go to the
bundled app.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from workers.app import app as bundled
from workers.app import parse_route_request, read_body
from workers.surfaces.answers import RouteAnswers

STEPS = ("read", "parse", "route", "answer")
FLUSH_EVERY = 256
KEEP = 4096


def _clock_cost_ns() -> int:
    """Median cost of one thread CPU time reading, in nanoseconds."""
    clock = time.thread_time_ns
    costs = []
    for _ in range(64):
        t0 = clock()
        for _ in range(16):
            clock()
        costs.append((clock() - t0) // 17)
    return int(np.median(costs))


class _Figures:
    """One worker's step durations (any thread of it adds under the lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.sums = [0] * len(STEPS)
        self.last = np.zeros((KEEP, len(STEPS)), dtype=np.int64)
        self.clock_ns = _clock_cost_ns()
        self.answers = RouteAnswers(None)

    def add(self, spans: tuple[int, ...]) -> None:
        with self.lock:
            row = self.requests % KEEP
            for i, d in enumerate(spans):
                d = max(d - self.clock_ns, 0)
                self.sums[i] += d
                self.last[row, i] = d
            self.requests += 1
            if self.requests % FLUSH_EVERY == 0:
                self._flush()

    def _flush(self) -> None:
        folder = os.environ.get("CSLB_BENCH_STAGES_DIR")
        if not folder:
            return
        n = min(self.requests, KEEP)
        # Oldest first: the reader takes the newest rows of its own run.
        last = np.roll(self.last, -(self.requests % KEEP), axis=0)[KEEP - n :]
        doc = {
            "requests": self.requests,
            "sums_ns": self.sums,
            "last_ns": {s: last[:, i].tolist() for i, s in enumerate(STEPS)},
        }
        path = os.path.join(folder, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(path + ".tmp", path)


_figures = _Figures()


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Serve one request: ``POST /route`` step by step, anything else by the bundled app."""
    if environ.get("PATH_INFO") != "/route" or environ.get("REQUEST_METHOD") != "POST":
        return bundled(environ, start_response)
    inner = bundled.get()
    figures = _figures
    clock = time.thread_time_ns
    t0 = clock()
    body = read_body(environ, inner.max_body_bytes)
    t1 = clock()
    keys, attempt, _ = parse_route_request(
        body,
        environ.get("CONTENT_TYPE", ""),
        environ.get("QUERY_STRING", ""),
        max_batch=inner.max_batch,
        check=False,
    )
    t2 = clock()
    idx, table = inner.router().route_table(keys, attempt=attempt)
    t3 = clock()
    answers = figures.answers
    if answers.table is not table:
        answers = figures.answers = RouteAnswers(table)
    out = answers.plain(idx)
    t4 = clock()
    figures.add((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
    start_response(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))]
    )
    return [out]
