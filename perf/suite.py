"""``python -m perf`` / ``cslb bench``: run the benchmark suite and write ``perf/RESULTS.md``.

Parts (all by default; ``--only`` picks some, comma-separated):

* ``inprocess`` — :mod:`perf.inprocess`: the worker's ``Router`` path per key at batch
  sizes 1 to 100,000 next to the pure-Python loop, uhashring and ``Ring.lookup``;
* ``host`` — :mod:`perf.host`: 1 … cores routing processes on one host's tables while
  discovery publishes every second;
* ``http`` — :mod:`perf.httpbench`: ``cslb serve`` (sync, gthread) under wrk next to a
  no-op app that only parses the body;
* ``control`` — :mod:`perf.control`: discovery's build + publish, propagation to the
  workers, PSS per worker;
* ``fanout`` — :mod:`perf.bench_fanout`: CPU per key of ``router.fanout`` / ``afanout``
  next to hand-written ``route`` + ``track`` loops, and the recording cost per call; on
  the wire (five C pods at 2 ms), the fan-out's wall time, CPU and connections next to a
  libcurl-multi floor, with issue 17's ratios;
* ``fleet`` — :mod:`perf.bench_fleet`: a healthy, equal fleet under load behind real
  gunicorn (gthread 2 × 4): keys moved by bounded load, bulkhead rejections, failed
  keys, recorded latency, ``CurlSender`` next to ``Urllib3Sender``;
* ``serving`` — :mod:`perf.bench_serving`: the pods' load-report middleware per request
  (WSGI, ASGI) next to the bare app;
* ``reports`` — :mod:`perf.bench_reports`: the callers' cost of reading the pods' load
  reports per answer, in-process and on the wire (CurlSender, with and without report
  headers, ``CSLB_LOAD_REPORTS`` off and on);
* ``lbcore`` — :mod:`perf.bench_lbcore`: lbcore's one-off calls (``Ring.lookup``,
  ``Ring.lookup_bounded``, ``route_ring_set``) per key next to the pure-Python loop;
* ``zones`` — :mod:`perf.bench_zones`: a worker's plans with zone affinity on (first
  plan of a table, refreshes with and without B1's bar window, with the pods' reports)
  next to the same table's plans with it off.

The page, its charts (PNG) and ``RESULTS.json`` go to ``out_dir`` (``--out``) (default: the ``perf``
directory of this checkout). A run of some parts keeps the other parts' figures from
``RESULTS.json``. ``--quick`` runs every part tiny (a smoke test, about a minute or two;
its figures are marked as such). The full run takes about ten minutes on 2 cores.
"""

from __future__ import annotations

import datetime
import importlib
import os
import time
from pathlib import Path
from typing import Any

from perf import results
from perf.common import machine_info

MODULES = {
    "inprocess": "perf.inprocess",
    "host": "perf.host",
    "http": "perf.httpbench",
    "control": "perf.control",
    "fanout": "perf.bench_fanout",
    "fleet": "perf.bench_fleet",
    "serving": "perf.bench_serving",
    "reports": "perf.bench_reports",
    "lbcore": "perf.bench_lbcore",
    "zones": "perf.bench_zones",
}
DEFAULT_OUT = Path(__file__).resolve().parent


def parts(text: str) -> list[str]:
    """The parts named in ``text`` (comma-separated), in order.

    Raises
    ------
    ValueError
        A name that is not one of :data:`MODULES`, or no name at all.
    """
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in MODULES]
    if bad or not names:
        raise ValueError(
            f"unknown part {bad[0]!r}; expected a comma-separated list of {', '.join(MODULES)}"
            if bad
            else f"no part named; expected a comma-separated list of {', '.join(MODULES)}"
        )
    return names


def run(
    names: list[str] | None = None,
    *,
    quick: bool = False,
    out_dir: Path = DEFAULT_OUT,
    check: bool = False,
) -> int:
    """Run the parts ``names`` (default all), write the results page; returns the exit status.

    Parameters
    ----------
    names
        Parts to run (:data:`MODULES`), in order; the others' figures are kept from
        ``RESULTS.json`` in ``out_dir``.
    quick
        Run every part tiny (a smoke test; its figures are marked as such).
    out_dir
        Directory for ``RESULTS.md``, ``RESULTS.json`` and the charts.
    check
        Return 1 when a target measured in this run is missed.
    """
    names = names or list(MODULES)
    parts: dict[str, Any] = results.load(out_dir)
    command = "python -m perf" + (" --quick" if quick else "")
    started = time.monotonic()
    for name in names:
        print(f"== {name}{' (quick)' if quick else ''}", flush=True)
        module = importlib.import_module(MODULES[name])
        machine = machine_info()
        t0 = time.monotonic()
        got = module.run(quick=quick, log=lambda s: print(s, flush=True))
        parts[name] = {
            **got,
            "format": results.FORMAT,
            "quick": bool(quick),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": time.monotonic() - t0,
            "machine": machine,
            "loadavg_end": os.getloadavg(),
        }
    page = results.write(parts, out_dir, command)
    print(f"\nwrote {page} in {time.monotonic() - started:.0f} s")
    missed = []
    for target, unit in results.targets(parts):
        if target.part in names and target.checks:
            print(f"{target.status.upper():>7}  {target.label}: {target.figures(unit)}")
            if target.status != "met":
                missed.append(target.label)
    return 1 if check and missed else 0
