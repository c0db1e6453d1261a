"""The benchmark suite's command line (:func:`perf.suite.run`): ``python -m perf``.

``cslb bench`` is this command: the command line may use perf, perf never the command
line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["build_parser", "main"]


def _parts(text: str) -> list[str]:
    from perf.suite import parts

    try:
        return parts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``cslb bench`` / ``python -m perf``."""
    from perf.suite import DEFAULT_OUT, MODULES

    p = argparse.ArgumentParser(
        prog="cslb bench",
        description="Run the benchmark suite (in-process, host, HTTP, control plane, "
        "fan-out) and write perf/RESULTS.md with its charts.",
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
    """Run ``cslb bench``; returns the exit status (argparse exits 2 on bad options)."""
    from perf.suite import run

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run(args.only, quick=args.quick, out_dir=args.out, check=args.check)
