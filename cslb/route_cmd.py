"""``cslb route``: which pod serves product X."""

from __future__ import annotations

import argparse
import json
import sys

import lbcore
from discovery.static import EndpointsFileError, EndpointSpec, load_endpoints_file, parse_endpoints


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``cslb route``."""
    p = argparse.ArgumentParser(
        prog="cslb route",
        description=(
            "Print the endpoint Skipper's consistent-hash ring picks for each key, with every "
            "endpoint healthy and no load bound. Keys are product IDs as strings (an integer "
            "ID routes like its decimal string)."
        ),
    )
    p.add_argument("keys", nargs="*", metavar="KEY", help="keys to route (taken literally)")
    p.add_argument(
        "--stdin", action="store_true", help="also read keys from standard input, one per line"
    )
    p.add_argument(
        "--endpoint",
        "-e",
        action="append",
        default=[],
        metavar="URL",
        help="an endpoint address, verbatim as Skipper hashes it (scheme://ip:port); repeatable",
    )
    p.add_argument(
        "--endpoints-file",
        "-f",
        metavar="FILE",
        help="JSON or YAML endpoints file (see examples/endpoints.json)",
    )
    p.add_argument(
        "--vnodes",
        type=int,
        default=lbcore.DEFAULT_VNODES,
        help="virtual nodes per endpoint (Skipper: 100)",
    )
    p.add_argument(
        "--attempt",
        type=int,
        default=0,
        help="0 for the primary pod, 1 for the retry pod (next distinct pod on the ring)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p


def main(argv: list[str]) -> int:
    """Run ``cslb route``; returns the exit status."""
    args = build_parser().parse_args(argv)
    specs: list[EndpointSpec] = []
    try:
        if args.endpoints_file:
            specs.extend(load_endpoints_file(args.endpoints_file))
        specs.extend(parse_endpoints(list(args.endpoint), "--endpoint"))
        if not specs:
            raise EndpointsFileError(
                "no endpoints: give --endpoint URL ... or --endpoints-file FILE"
            )
        keys: list[str] = list(args.keys)
        if args.stdin:
            keys.extend(line.rstrip("\r\n") for line in sys.stdin)
        if not keys:
            raise EndpointsFileError("no keys given: pass them as arguments or use --stdin")
        ring = lbcore.Ring([s.address for s in specs], vnodes=args.vnodes)
        idx = ring.lookup(keys, attempt=args.attempt)
    except (EndpointsFileError, lbcore.LBCoreError) as exc:
        print(f"cslb route: {exc}", file=sys.stderr)
        return 2
    rows = []
    for key, i in zip(keys, idx.tolist(), strict=True):
        spec = specs[i] if i >= 0 else None
        rows.append(
            {
                "key": key,
                "endpoint": spec.address if spec else None,
                "index": i,
                "zone": spec.zone if spec else None,
                "node": spec.node if spec else None,
            }
        )
    if args.json:
        print(json.dumps({"attempt": args.attempt, "routes": rows}, ensure_ascii=False))
    else:
        width = max(len(r["key"]) for r in rows)
        for r in rows:
            where = r["endpoint"] or "fallback (no other endpoint)"
            extra = " ".join(x for x in (r["zone"], r["node"]) if x)
            print(f"{r['key']:<{width}}  {where}" + (f"  ({extra})" if extra else ""))
    return 0
