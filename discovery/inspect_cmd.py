"""``cslb inspect``: what the host's workers route on right now.

Reads the current table of a shared-memory namespace (read-only; never blocks the
publisher) and prints its generation, the publisher's liveness (PID still running and
heartbeat age), table age, the routing knobs, the fade curve, each fading ring with its
share now, and every endpoint with zone, node, counter slot and ring tier, and for
ejected endpoints why, until when and how often outlier detection ejected them (and
whether routing ignores the ejections: outlier panic).

The fade shares shown are those of N-ring fade-in; under ``fade_mode=skipper`` workers
use Skipper's per-request fade-in instead, and the output says so (and shows Skipper's
fade-in score of each ring's pods).

Exit status: 0 with a live publisher, 3 when the table is there but its publisher is
dead or silent (workers route on a stale table), 1 when there is no table, 2 for bad
arguments.
"""

from __future__ import annotations

import json
import os
import sys
import time
import unicodedata
from collections.abc import Mapping
from typing import Any

import shm
from discovery.settings import PUBLISHED_KNOBS, SHM_NAMESPACE, seconds_at_least
from lbcore.fade import fadein_score
from lbcore.knobs import Knob
from lbcore.outlier import EJECT_REASONS

__all__ = ["INSPECT_KNOBS", "run", "shown", "snapshot"]

#: ``--stale-after``: when a publisher counts as dead.
STALE_AFTER = Knob(
    "stale_after_s",
    "CSLB_STALE_AFTER",
    "--stale-after",
    5.0,
    seconds_at_least(0.01),
    "A publisher heartbeat older than this many seconds means the publisher is not alive "
    "(exit status 3).",
    "SECONDS",
)

#: Settings of ``cslb inspect`` (the namespace is discovery's own declaration).
INSPECT_KNOBS: tuple[Knob, ...] = (SHM_NAMESPACE, STALE_AFTER)


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
            knobs = {name: getattr(t.knobs, name) for name in PUBLISHED_KNOBS}
            knobs["enabled"] = bool(knobs["enabled"])
            mode = knobs["fade_mode"]
            shares = rs.share_list(now) if rs.endpoints else []
            tiers = [int(x) for x in rs.tiers]
            fading = []
            for k, (start, share) in enumerate(zip(rs.starts_ns, shares, strict=True), start=1):
                added = [ep for ep, tier in zip(rs.endpoints, tiers, strict=True) if tier == k]
                ring: dict[str, Any] = {
                    "ring": k,
                    "added": added,
                    "age_s": round((now - start) / 1e9, 3),
                    "share": round(share, 6),  # N-ring share
                }
                if mode == "skipper":
                    score = fadein_score(now - start, rs.duration_ns, rs.exponent)
                    ring["skipper_score"] = round(score, 6)
                fading.append(ring)
            e = t.ejections
            eps = [
                {
                    "address": ep,
                    "zone": zone,
                    "node": node,
                    "slot": int(slot),
                    "tier": tier,
                    "ejected": bool(ej),
                    "ejection": _ejection(reason, until, mult, counts, now),
                }
                for ep, zone, node, slot, tier, ej, reason, until, mult, counts in zip(
                    t.endpoints,
                    t.zones,
                    t.nodes,
                    t.slots.tolist(),
                    tiers,
                    t.ejected.tolist(),
                    e.reason.tolist(),
                    e.until_ns.tolist(),
                    e.multiplier.tolist(),
                    e.counts.tolist(),
                    strict=True,
                )
            ]
            return {
                "generation": int(t.generation),
                "published_age_s": round((now - t.published_ns) / 1e9, 3) if t.generation else None,
                "publisher_pid": int(t.publisher_pid),
                "knobs": knobs,
                "fade": {
                    "mode": mode,
                    "n_ring_shares_apply": mode == "n-ring",
                    "duration_s": rs.duration_ns / 1e9,
                    "exponent": rs.exponent,
                    "vnodes": rs.vnodes,
                },
                "fading_rings": fading,
                "outlier_panic": bool(t.outlier_panic),
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


def _ejection(
    reason: int, until_ns: int, multiplier: int, counts: list[int], now: int
) -> dict[str, Any]:
    """An endpoint's outlier-ejection state for the JSON output."""
    return {
        "reason": EJECT_REASONS[reason - 1] if reason else None,
        "until_ns": int(until_ns) if reason else None,
        "remaining_s": round(max(until_ns - now, 0) / 1e9, 3) if reason else None,
        "multiplier": int(multiplier),
        "ejections": dict(zip(EJECT_REASONS, (int(c) for c in counts), strict=True)),
    }


def _outlier_text(e: dict[str, Any]) -> str:
    j = e["ejection"]
    total = sum(j["ejections"].values())
    if not j["reason"]:
        return f"  ({total} ejection(s) before)" if total else ""
    what = "ejected" if e["ejected"] else "ejected but ignored (outlier panic)"
    return f"  {what}: {j['reason']}, {j['remaining_s']:.0f} s left, ejection {total}"


def shown(text: str) -> str:
    """``text`` safe to print on a terminal: control and format characters escaped.

    Labels and addresses come from shared memory any process of the user can write: an
    ESC or a bidi override printed raw would drive the operator's terminal.
    """
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() and unicodedata.category(ch) not in ("Cs", "Cf"):
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


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
        "fade: mode {mode}{why}, duration {duration_s:g} s, exponent {exponent:g}, "
        "vnodes {vnodes}".format(why=_FADE_MODES.get(s["fade"]["mode"], ""), **s["fade"]),
    ]
    eps = s["endpoints"]
    established = sum(1 for e in eps if e["tier"] == 0)
    lines.append(f"rings: established ring of {established} endpoint(s)")
    for r in s["fading_rings"]:
        head = (
            f"  ring {r['ring']}: +{len(r['added'])} endpoint(s), started {r['age_s']:.1f} s ago, "
        )
        if "skipper_score" in r:
            lines.append(
                head + f"Skipper fade-in score now {r['skipper_score'] * 100:.2f} % "
                f"(N-ring share {r['share'] * 100:.2f} %, not used)"
            )
        elif s["fade"]["n_ring_shares_apply"]:
            lines.append(head + f"share now {r['share'] * 100:.2f} %")
        else:
            lines.append(head + f"N-ring share {r['share'] * 100:.2f} % (not used)")
    if s["outlier_panic"]:
        lines.append(
            "outlier panic: too few endpoints left un-ejected, routing ignores every ejection"
        )
    lines.append(f"endpoints ({len(eps)}):")
    if eps:
        rows = [(shown(e["address"]), shown(e["zone"]), shown(e["node"]), e) for e in eps]
        w = max(len(a) for a, _, _, _ in rows)
        zw = max([len(z) for _, z, _, _ in rows] + [4])
        nw = max([len(n) for _, _, n, _ in rows] + [4])
        lines.append(f"  {'address':<{w}}  {'zone':<{zw}}  {'node':<{nw}}  slot  ring")
        for address, zone, node, e in rows:
            lines.append(
                f"  {address:<{w}}  {zone or '-':<{zw}}  {node or '-':<{nw}}  "
                f"{e['slot']:>4}  {e['tier']:>4}" + _outlier_text(e)
            )
    else:
        lines.append("  (none: every key falls back to the ingress)")
    return "\n".join(lines)


_FADE_MODES = {
    "n-ring": " (each scale-up has its own ring; shares below)",
    "skipper": (
        " (Skipper's per-request fade-in: workers filter new pods by the score below, "
        "N-ring shares are not used)"
    ),
    "off": " (new pods take their full share at once)",
}


def _fmt(name: str, v: Any) -> str:
    if v is None:
        return "unlimited" if name == "max_hops" else "off"
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"{v:g}" if isinstance(v, float) else str(v)


def run(settings: Mapping[str, Any], *, as_json: bool = False) -> int:
    """Print the namespace's table (``settings``: :data:`INSPECT_KNOBS` values); exit status.

    ``cslb inspect`` (:mod:`cslb.inspect_cmd`) parses the command line and calls this.
    """
    ns = settings["shm_namespace"]
    try:
        s = snapshot(ns, stale_after_s=settings["stale_after_s"])
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
    status = 0 if s["publisher_alive"] else 3
    out = json.dumps(s, indent=2) if as_json else _text(s)
    try:
        sys.stdout.write(out + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`cslb inspect --json | head`): not our error. Point
        # stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return status
