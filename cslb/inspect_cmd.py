"""``cslb inspect``: the command line of :func:`workers.surfaces.inspect_report.run`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from lbcore.knobs import KnobError, add_arguments, from_args

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``cslb inspect``."""
    from workers.surfaces.inspect_report import INSPECT_KNOBS

    p = argparse.ArgumentParser(
        prog="cslb inspect",
        description="Print the routing table the host's workers use (from shared memory).",
    )
    add_arguments(p, INSPECT_KNOBS)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    """Run ``cslb inspect``; returns the exit status (2 for bad arguments)."""
    from workers.surfaces.inspect_report import INSPECT_KNOBS, run

    args = build_parser().parse_args(argv)
    try:
        settings = from_args(args, os.environ if environ is None else environ, INSPECT_KNOBS)
    except KnobError as exc:
        print(f"cslb inspect: {exc}", file=sys.stderr)
        return 2
    return run(settings, as_json=args.json)
