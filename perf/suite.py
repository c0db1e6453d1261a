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
  next to hand-written ``route`` + ``track`` loops, and the recording cost per call.

The page, its charts (PNG) and ``RESULTS.json`` go to ``--out`` (default: the ``perf``
directory of this checkout). A run of some parts keeps the other parts' figures from
``RESULTS.json``. ``--quick`` runs every part tiny (a smoke test, about a minute or two;
its figures are marked as such). The full run takes about ten minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys
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
}
DEFAULT_OUT = Path(__file__).resolve().parent


def _parts(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in MODULES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown part {bad[0]!r}; expected a comma-separated list of {', '.join(MODULES)}"
            if bad
            else f"no part named; expected a comma-separated list of {', '.join(MODULES)}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m perf`` / ``cslb bench``."""
    p = argparse.ArgumentParser(
        prog="cslb bench",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog="Parts: " + ", ".join(MODULES) + ". See perf/README.md.",
    )
    p.add_argument("--quick", action="store_true", help="run every part tiny (smoke test, ~20 s)")
    p.add_argument(
        "--only",
        type=_parts,
        metavar="PARTS",
        help=f"comma-separated parts to run (default all: {','.join(MODULES)})",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help="directory for RESULTS.md, RESULTS.json and the charts (default: %(default)s)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 when a target measured in this run is missed",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the selected parts, write the results page; returns the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    names = args.only or list(MODULES)
    out_dir: Path = args.out
    parts: dict[str, Any] = results.load(out_dir)
    command = "python -m perf" + (" --quick" if args.quick else "")
    started = time.monotonic()
    for name in names:
        print(f"== {name}{' (quick)' if args.quick else ''}", flush=True)
        module = importlib.import_module(MODULES[name])
        machine = machine_info()
        t0 = time.monotonic()
        got = module.run(quick=args.quick, log=lambda s: print(s, flush=True))
        parts[name] = {
            **got,
            "format": results.FORMAT,
            "quick": bool(args.quick),
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
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
