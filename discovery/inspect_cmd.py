"""``cslb inspect``: what the host's workers route on right now.

Reads the current table of a shared-memory namespace (read-only; never blocks the
publisher) and prints its generation, the publisher's liveness (PID still running and
heartbeat age), table age, the routing knobs, the fade curve, each fading ring with its
share now, and every endpoint with zone, node, counter slot and ring tier.

Exit status: 0 with a live publisher, 3 when the table is there but its publisher is
dead or silent (workers route on a stale table), 1 when there is no table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import shm

__all__ = ["build_parser", "main", "snapshot"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``cslb inspect``."""
    p = argparse.ArgumentParser(
        prog="cslb inspect",
        description="Print the routing table the host's workers use (from shared memory).",
    )
    p.add_argument(
        "--shm-namespace",
        default=None,
        metavar="NS",
        help="shared-memory namespace [env CSLB_SHM_NAMESPACE, default 'default']",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--stale-after",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a heartbeat older than this means the publisher is not alive (default 5)",
    )
    return p


def snapshot(namespace: str, *, stale_after_s: float = 5.0) -> dict[str, Any]:
    """The current table of ``namespace`` as a JSON-ready dictionary.

    Raises
    ------
    shm.SegmentMissingError
        No publisher ever created the tables.
    shm.ShmError
        The tables are corrupt or unreadable.
    """
    with shm.TableReader(namespace) as reader:
        now = time.monotonic_ns()

        def read(t: shm.Table) -> dict[str, Any]:
            rs = t.ring_set
            shares = rs.share_list(now) if rs.endpoints else []
            tiers = [int(x) for x in rs.tiers]
            fading = []
            for k, (start, share) in enumerate(zip(rs.starts_ns, shares, strict=True), start=1):
                fading.append(
                    {
                        "ring": k,
                        "added": [
                            ep for ep, tier in zip(rs.endpoints, tiers, strict=True) if tier == k
                        ],
                        "age_s": round((now - start) / 1e9, 3),
                        "share": round(share, 6),
                    }
                )
            eps = [
                {
                    "address": ep,
                    "zone": zone,
                    "node": node,
                    "slot": int(slot),
                    "tier": tier,
                    "weight": float(w),
                    "ejected": bool(ej),
                }
                for ep, zone, node, slot, tier, w, ej in zip(
                    t.endpoints,
                    t.zones,
                    t.nodes,
                    t.slots.tolist(),
                    tiers,
                    t.weights.tolist(),
                    t.ejected.tolist(),
                    strict=True,
                )
            ]
            k = t.knobs
            return {
                "generation": int(t.generation),
                "published_age_s": round((now - t.published_ns) / 1e9, 3) if t.generation else None,
                "publisher_pid": int(t.publisher_pid),
                "knobs": {
                    "enabled": bool(k.enabled),
                    "percentage": k.percentage,
                    "balance_factor": k.balance_factor,
                    "max_hops": k.max_hops,
                    "load_signal": k.load_signal,
                },
                "fade": {
                    "duration_s": rs.duration_ns / 1e9,
                    "exponent": rs.exponent,
                    "vnodes": rs.vnodes,
                },
                "fading_rings": fading,
                "endpoints": sorted(eps, key=lambda e: e["address"]),
                "counter_slots": int(t.n_slots),
            }

        out = reader.consistent(read)
        beat_age = (now - reader.heartbeat_ns()) / 1e9
        pid_alive = reader.writer_alive()
        out = {
            "namespace": namespace,
            "writer_pid": reader.writer_pid(),
            "writer_running": pid_alive,
            "heartbeat_age_s": round(beat_age, 3),
            "publisher_alive": bool(pid_alive and beat_age <= stale_after_s),
            **out,
        }
    return out


def _text(s: dict[str, Any]) -> str:
    live = (
        "alive"
        if s["publisher_alive"]
        else (
            "NOT ALIVE (process running, heartbeat stale)"
            if s["writer_running"]
            else "NOT ALIVE (process gone)"
        )
    )
    age = s["published_age_s"]
    lines = [
        f"namespace {s['namespace']}: generation {s['generation']}, "
        + (f"table age {age:.1f} s" if age is not None else "nothing published yet"),
        f"publisher pid {s['writer_pid']}: {live}, last heartbeat {s['heartbeat_age_s']:.1f} s ago",
        "knobs: " + ", ".join(f"{k}={_fmt(k, v)}" for k, v in s["knobs"].items()),
        "fade: duration {duration_s:g} s, exponent {exponent:g}, vnodes {vnodes}".format(
            **s["fade"]
        ),
    ]
    eps = s["endpoints"]
    established = sum(1 for e in eps if e["tier"] == 0)
    lines.append(f"rings: established ring of {established} endpoint(s)")
    for r in s["fading_rings"]:
        lines.append(
            f"  ring {r['ring']}: +{len(r['added'])} endpoint(s), started {r['age_s']:.1f} s "
            f"ago, share now {r['share'] * 100:.2f} %"
        )
    lines.append(f"endpoints ({len(eps)}):")
    if eps:
        w = max(len(e["address"]) for e in eps)
        zw = max([len(e["zone"]) for e in eps] + [4])
        nw = max([len(e["node"]) for e in eps] + [4])
        lines.append(f"  {'address':<{w}}  {'zone':<{zw}}  {'node':<{nw}}  slot  ring")
        for e in eps:
            lines.append(
                f"  {e['address']:<{w}}  {e['zone'] or '-':<{zw}}  {e['node'] or '-':<{nw}}  "
                f"{e['slot']:>4}  {e['tier']:>4}" + ("  ejected" if e["ejected"] else "")
            )
    else:
        lines.append("  (none: every key falls back to the ingress)")
    return "\n".join(lines)


def _fmt(name: str, v: Any) -> str:
    if v is None:
        return "unlimited" if name == "max_hops" else "off"
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"{v:g}" if isinstance(v, float) else str(v)


def main(argv: list[str]) -> int:
    """Run ``cslb inspect``; returns the exit status."""
    args = build_parser().parse_args(argv)
    ns = args.shm_namespace or os.environ.get("CSLB_SHM_NAMESPACE") or "default"
    try:
        s = snapshot(ns, stale_after_s=args.stale_after)
    except shm.SegmentMissingError:
        print(
            f"cslb inspect: no routing tables in shared-memory namespace {ns!r} "
            f"(is cslb discovery running with --shm-namespace {ns}?)",
            file=sys.stderr,
        )
        return 1
    except shm.ShmError as exc:
        print(f"cslb inspect: cannot read the tables of {ns!r}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print(_text(s))
    return 0 if s["publisher_alive"] else 3
