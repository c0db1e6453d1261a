"""``cslb route``: which pod serves product X — on a given endpoint list, or live on this host.

Without ``--live`` it prints Skipper's consistent-hash ring answer for the endpoints given
(every endpoint healthy, no load bound). With ``--live`` it answers from the host's live
table and counters, as a worker would right now, and says why
(:func:`workers.surfaces.explain.live`).

Exit status: 0 answered; with ``--live``, 3 when answered from a table whose publisher is
not alive (workers route on it, but nobody updates it) and 1 when the host has no table
(every key is fallback); 2 for bad arguments or a bad key (over 4,096 bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import lbcore
from cslb.argtypes import integer
from cslb.kernel_flag import add_kernel_argument, apply_kernel_flag
from lbcore.knobs import add_arguments

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``cslb route``."""
    from shm.settings import SHM_NAMESPACE
    from workers.surfaces.hosts import STALE_AFTER

    p = argparse.ArgumentParser(
        prog="cslb route",
        usage="cslb route (--endpoint URL ... | --endpoints-file F | --live [--shm-namespace NS])"
        " [--attempt N] [--json] [--stdin] KEY ...",
        description=(
            "Print the pod each key goes to. Keys are product IDs, taken literally as the "
            "bytes given (an integer ID routes like its decimal string), at most 4,096 "
            "bytes each. With --endpoint/--endpoints-file: the endpoint Skipper's "
            "consistent-hash ring picks, every endpoint healthy and no load bound. With "
            "--live: the pod a worker of this host gives the key right now (the live "
            "table and the host's counters) and why: the established or a fading ring, a "
            "bounded-load move, an ejected pod skipped, or fallback and why."
        ),
        epilog="Exit status: 0 answered; --live: 3 answered from a table whose publisher is "
        "not alive, 1 no table on this host (every key is fallback); 2 bad arguments or a "
        "bad key.",
    )
    p.add_argument("keys", nargs="*", metavar="KEY", help="keys to route (taken literally)")
    p.add_argument(
        "--stdin", action="store_true", help="also read keys from standard input, one per line"
    )
    p.add_argument(
        "--attempt",
        type=integer(0),
        default=0,
        help="0 for the primary pod, 1 for the retry pod (next distinct pod on the ring)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_kernel_argument(p)
    static = p.add_argument_group("a given endpoint list")
    static.add_argument(
        "--endpoint",
        "-e",
        action="append",
        default=[],
        metavar="URL",
        help="an endpoint address, verbatim as Skipper hashes it (scheme://ip:port); repeatable",
    )
    static.add_argument(
        "--endpoints-file",
        "-f",
        metavar="FILE",
        help="JSON or YAML endpoints file (format: docs/endpoints-file.md)",
    )
    static.add_argument(
        "--vnodes",
        type=int,
        default=lbcore.DEFAULT_VNODES,
        help="virtual nodes per endpoint (Skipper: 100)",
    )
    live = p.add_argument_group("this host's live table")
    live.add_argument(
        "--live",
        action="store_true",
        help="answer from the shared memory this host's workers route on, with why",
    )
    add_arguments(live, [SHM_NAMESPACE])
    live.add_argument(
        STALE_AFTER.flag,
        dest="stale_after_s",
        metavar=STALE_AFTER.metavar,
        help=f"a publisher heartbeat older than this many seconds means the publisher is not "
        f"alive (exit status 3) [env {STALE_AFTER.env}, default {STALE_AFTER.default:g}]",
    )
    return p


def _keys(args: argparse.Namespace) -> list[bytes]:
    # The bytes given: argv is decoded with surrogateescape, os.fsencode undoes it.
    keys = [os.fsencode(k) for k in args.keys]
    if args.stdin:
        keys.extend(line.rstrip(b"\r\n") for line in sys.stdin.buffer)
    return keys


def _shown(key: bytes) -> str:
    return key.decode("utf-8", "backslashreplace")


def _error(msg: str) -> int:
    print(f"cslb route: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    """Run ``cslb route``; returns the exit status."""
    p = build_parser()
    args = p.parse_args(argv)
    apply_kernel_flag(args, os.environ, p)
    if args.live and (args.endpoint or args.endpoints_file):
        p.error("--live answers from this host's table: it takes no --endpoint/--endpoints-file")
    if not args.live and (args.shm_namespace or args.stale_after_s):
        p.error("--shm-namespace and --stale-after go with --live")
    keys = _keys(args)
    if not keys:
        return _error("no keys given: pass them as arguments or use --stdin")
    try:
        lbcore.hash_keys(keys, max_key_bytes=lbcore.MAX_KEY_BYTES)
    except lbcore.LBCoreError as exc:
        return _error(f"bad key: {exc}")
    return _live(args, keys) if args.live else _static(args, keys)


def _static(args: argparse.Namespace, keys: list[bytes]) -> int:
    from discovery.static import (
        EndpointsFileError,
        EndpointSpec,
        load_endpoints_file,
        parse_endpoints,
    )

    specs: list[EndpointSpec] = []
    try:
        if args.endpoints_file:
            specs.extend(load_endpoints_file(args.endpoints_file))
        specs.extend(parse_endpoints(list(args.endpoint), "--endpoint"))
        if not specs:
            raise EndpointsFileError(
                "no endpoints: give --endpoint URL ... or --endpoints-file FILE, or --live "
                "for this host's table"
            )
        ring = lbcore.Ring([s.address for s in specs], vnodes=args.vnodes)
        idx = ring.lookup(keys, attempt=args.attempt)
    except (EndpointsFileError, lbcore.LBCoreError) as exc:
        return _error(str(exc))
    rows = []
    for key, i in zip(keys, idx.tolist(), strict=True):
        spec = specs[i] if i >= 0 else None
        rows.append(
            {
                "key": _shown(key),
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


def _live(args: argparse.Namespace, keys: list[bytes]) -> int:
    import dataclasses

    import shm
    from lbcore.knobs import KnobError
    from workers.surfaces.explain import live
    from workers.surfaces.hosts import STALE_AFTER

    try:
        ns = shm.check_namespace(args.shm_namespace or shm.shm_namespace(os.environ))
        raw = args.stale_after_s or os.environ.get(STALE_AFTER.env)
        source = "flag --stale-after" if args.stale_after_s else "environment"
        stale = STALE_AFTER.default if raw is None else STALE_AFTER.convert(raw, source)
    except (KnobError, shm.ShmError, ValueError) as exc:
        return _error(str(exc))
    try:
        answer = live(ns, keys, attempt=args.attempt, stale_after_s=stale)
    except shm.SegmentMissingError:
        return _no_table(args, keys, ns, "no routing tables (discovery has not started)")
    except shm.ShmError as exc:
        print(f"cslb route: cannot read the tables of {ns!r}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        doc = dataclasses.asdict(answer)
        doc["shm_namespace"] = ns
        doc["attempt"] = args.attempt
        doc["routes"] = [{"key": _shown(k), **r} for k, r in zip(keys, doc["routes"], strict=True)]
        print(json.dumps(doc, ensure_ascii=False))
    else:
        print(_header(answer, ns))
        _print_rows(keys, [_why(r, answer) for r in answer.routes], answer.routes)
    if not answer.generation:
        return 1
    return 0 if answer.publisher_alive else 3


def _no_table(args: argparse.Namespace, keys: Sequence[bytes], ns: str, why: str) -> int:
    if args.json:
        rows = [
            {"key": _shown(k), "index": -1, "endpoint": None, "kind": "fallback"}
            | {"fallback": "no_table"}
            for k in keys
        ]
        print(json.dumps({"shm_namespace": ns, "generation": 0, "routes": rows}))
    else:
        print(f"shm namespace {ns}: {why}; workers send every key to the fallback")
        for k in keys:
            print(f"{_shown(k)}  fallback  no table")
    return 1


def _header(a: Any, ns: str) -> str:
    k = a.knobs
    alive = "alive" if a.publisher_alive else f"NOT alive (heartbeat {a.heartbeat_age_s:.1f} s old)"
    gate = "off (kill switch)" if not k["enabled"] else f"{k['percentage']:g} %"
    bf = "off" if k["balance_factor"] is None else f"{k['balance_factor']:g}"
    loads = "host counters" if a.counters else "no counters: bounded load sees no load"
    age = "" if a.published_age_s is None else f", published {a.published_age_s:.1f} s ago"
    lines = [
        f"generation {a.generation}{age} by pid {a.publisher_pid} ({alive}); shm namespace {ns}",
        f"gate {gate}; fade {k['fade_mode']}; bounded load {bf} on {k['load_signal']} ({loads})",
    ]
    z = a.zone
    if z and (z["affinity"] or z["zone"]):
        lines.append(
            f"zone {z['zone'] or 'unknown'}: affinity {'on' if z['affinity'] else 'off'}, "
            f"{z['state']} ({z['reason']}), {z['share'] * 100:.1f} % of keys local now "
            f"(cap {z['cap'] * 100:.1f} %)"
        )
    if a.outlier_panic:
        lines.append("outlier panic: too few endpoints left un-ejected, ejections are ignored")
    return "\n".join(lines)


def _fallback(reason: str, knobs: dict[str, Any]) -> str:
    return {
        "kill_switch": "the kill switch is off (CSLB_ENABLED=false)",
        "percentage": f"outside the rollout percentage (CSLB_PERCENTAGE={knobs['percentage']:g})",
        "no_table": "no table (nothing published, or no endpoints)",
        "all_ejected": "every endpoint of its ring is ejected",
        "no_other_endpoint": "no other endpoint for this retry",
    }[reason]


def _why(r: Any, a: Any) -> str:
    signal = a.knobs["load_signal"]
    if r.kind == "fallback":
        parts = [_fallback(r.fallback, a.knobs)]
    elif r.kind == "zone_ring":
        parts = ["zone ring: a local key, on the caller zone's pods"]
    elif r.kind == "bounded_load":
        bar = f" is over the bar {r.loads['bar']:.3g}" if "bar" in r.loads else ""
        parts = [
            f"bounded load: moved from {r.moved_from} (its {signal} load "
            f"{r.loads['from']:.3g}{bar}; this pod's is {r.loads['to']:.3g})"
        ]
    elif r.kind == "fade_ring" and r.ring is None:
        parts = ["Skipper fade-in: a new pod the key's draw keeps"]
    elif r.kind == "fade_ring":
        share = "" if r.ring_share is None else f", share {r.ring_share * 100:.1f} %"
        new = "; one of its new pods" if r.pod_ring == r.ring else ""
        parts = [f"fading ring {r.ring}{share}{new}"]
    elif r.kind == "retry":
        parts = ["retry: the next distinct pod"]
    else:
        parts = ["established ring" if a.knobs["fade_mode"] == "n-ring" else "ring"]
    for s in r.skipped:
        left = "" if s["remaining_s"] is None else f", {s['remaining_s']:.1f} s left"
        parts.append(f"skipped ejected {s['endpoint']} ({s['reason']}{left})")
    return "; ".join(parts)


def _print_rows(keys: Sequence[bytes], whys: list[str], routes: list[Any]) -> None:
    shown = [_shown(k) for k in keys]
    width = max(len(s) for s in shown)
    for key, why, r in zip(shown, whys, routes, strict=True):
        where = r.endpoint or "fallback"
        extra = " ".join(x for x in (r.zone, r.node) if x)
        print(f"{key:<{width}}  {where}" + (f" ({extra})" if extra else "") + f"  {why}")
