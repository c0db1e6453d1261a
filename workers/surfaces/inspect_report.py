"""``cslb inspect``: what the host's workers route on right now.

Reads the current table of a shared-memory namespace (read-only; never blocks the
publisher) and prints its generation, the publisher's liveness (PID still running and
heartbeat age), table age, the routing knobs, the fade curve, each fading ring with its
share now, and every endpoint with zone, node, counter slot and ring tier, its pod's
latest load report as the workers stored it (``CSLB_LOAD_REPORTS``), and for
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

import dataclasses
import json
import math
import os
import sys
import time
import unicodedata
from collections.abc import Mapping
from typing import Any

import shm
from lbcore.knobs import Knob, KnobError
from lbcore.outlier import EJECT_REASONS
from lbcore.reported import KIND_NONE, KIND_OCCUPANCY, STATUS_BLACKOUT, report_status
from workers.routing.reported import read_reports, report_settings
from workers.surfaces.hosts import STALE_AFTER, EndpointState, TableRows, read_table

__all__ = ["INSPECT_KNOBS", "render_text", "run", "shown", "snapshot"]

#: Settings of ``cslb inspect``: the namespace, and when a publisher counts as dead (the
#: workers' own ``CSLB_STALE_AFTER``).
INSPECT_KNOBS: tuple[Knob, ...] = (shm.SHM_NAMESPACE, STALE_AFTER)


def snapshot(namespace: str, *, stale_after_s: float = STALE_AFTER.default) -> dict[str, Any]:
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
        table, rows = reader.consistent(lambda t: (t, read_table(t, now)))
        reports = _reports(namespace, table, now)
        beat_age = (now - reader.heartbeat_ns()) / 1e9
        pid_alive = reader.writer_alive()
        return {
            "namespace": namespace,
            "writer_pid": reader.writer_pid(),
            "writer_running": pid_alive,
            "heartbeat_age_s": round(beat_age, 3),
            "publisher_alive": bool(pid_alive and beat_age <= stale_after_s),
            **_shown_table(rows, now, reports),
        }


def _reports(namespace: str, table: shm.Table, now: int) -> dict[str, dict[str, Any]]:
    """The pods' stored load reports by address (empty: no counters, or none stored).

    Shown whatever ``CSLB_LOAD_REPORTS`` says in this shell: what the workers stored.
    """
    try:
        counters = shm.CounterReader(namespace)
    except shm.ShmError:
        return {}
    try:
        settings = dataclasses.replace(report_settings(), enabled=True)
        got = read_reports(counters, table, now, settings)
    except (shm.ShmError, KnobError):
        return {}
    finally:
        counters.close()
    if got is None or not table.valid():
        return {}
    st = got.state
    status = report_status(st, now, settings)
    out = {}
    for i, address in enumerate(table.endpoints):
        if st.kind[i] == KIND_NONE:
            continue
        u = float(got.utilization[i])
        out[address] = {
            "kind": "occupancy" if st.kind[i] == KIND_OCCUPANCY else "utilization",
            "value": round(float(st.value[i]), 6),
            "utilization": None if math.isnan(u) else round(u, 6),
            "age_s": round((now - int(st.at_ns[i])) / 1e9, 3),
            "in_blackout": bool(status[i] == STATUS_BLACKOUT),
        }
    return out


def _shown_table(
    rows: TableRows, now: int, reports: Mapping[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """``rows`` in the JSON output's words."""
    knobs = {f.name: getattr(rows.knobs, f.name) for f in dataclasses.fields(rows.knobs)}
    knobs["enabled"] = bool(knobs["enabled"])
    mode = knobs["fade_mode"]
    fading = []
    for r in rows.fading:
        ring: dict[str, Any] = {
            "ring": r.ring,
            "added": list(r.added),
            "age_s": round(r.age_s, 3),
            "share": round(r.n_ring_share, 6),  # N-ring share
        }
        if mode == "skipper":
            ring["skipper_score"] = round(r.share, 6)
        fading.append(ring)
    eps = [
        {
            "address": e.address,
            "zone": e.zone,
            "node": e.node,
            "slot": e.slot,
            "tier": e.tier,
            "ejected": bool(e.ejected),
            "ejection": _ejection(e, now),
            "load_report": (reports or {}).get(e.address),
        }
        for e in rows.endpoints
    ]
    return {
        "generation": rows.generation,
        "published_age_s": round((now - rows.published_ns) / 1e9, 3) if rows.generation else None,
        "publisher_pid": rows.publisher_pid,
        "knobs": knobs,
        "fade": {
            "mode": mode,
            "n_ring_shares_apply": mode == "n-ring",
            "duration_s": rows.fade_duration_s,
            "exponent": rows.fade_exponent,
            "vnodes": rows.vnodes,
        },
        "fading_rings": fading,
        "outlier_panic": rows.outlier_panic,
        "zone": _zone(rows, now),
        "endpoints": sorted(eps, key=lambda e: e["address"]),
        "counter_slots": rows.n_slots,
    }


def _zone(rows: TableRows, now: int) -> dict[str, Any]:
    """The table's zone record for the JSON output: the controller's curve and x now."""
    z = rows.zone
    return {
        "zone": z.zone,
        "affinity": z.affinity,
        "state": z.state,
        "reason": z.reason,
        "share": round(z.share_at(now), 6),
        "cap": z.cap,
        "x0": z.x0,
        "rate_per_s": z.rate,
        "started_age_s": round((now - z.start_ns) / 1e9, 3) if z.start_ns else None,
        "min_pods": z.min_pods,
        "transitions": z.transitions,
    }


def _ejection(e: EndpointState, now: int) -> dict[str, Any]:
    """An endpoint's outlier-ejection state for the JSON output."""
    until = e.eject_until_ns
    return {
        "reason": e.eject_reason or None,
        "until_ns": until,
        "remaining_s": round(max(until - now, 0) / 1e9, 3) if until is not None else None,
        "multiplier": e.eject_multiplier,
        "ejections": dict(zip(EJECT_REASONS, e.ejections, strict=True)),
    }


def _report_text(e: dict[str, Any]) -> str:
    """The pod's stored load report, short: ``occ 3.30 util 0.41 2.1s``, or ``-``."""
    r = e.get("load_report")
    if not r:
        return "-"
    kind = "occ" if r["kind"] == "occupancy" else "util"
    util = "" if r["utilization"] is None or kind == "util" else f" util {r['utilization']:.2f}"
    blackout = " blackout" if r["in_blackout"] else ""
    return f"{kind} {r['value']:.2f}{util} {r['age_s']:.1f}s{blackout}"


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


def render_text(s: dict[str, Any]) -> str:
    """The text ``cslb inspect`` prints for snapshot ``s`` (:func:`snapshot`)."""
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
    z = s["zone"]
    if z["affinity"] or z["zone"]:
        ramp = f", rising {z['rate_per_s'] * 100:g} %/s" if z["rate_per_s"] else ""
        lines.append(
            f"zone {shown(z['zone']) or 'unknown'}: affinity {'on' if z['affinity'] else 'off'}, "
            f"{z['state']} ({z['reason']}), {z['share'] * 100:.2f} % of keys local now{ramp}, "
            f"cap {z['cap'] * 100:.2f} %, min pods {z['min_pods']}, "
            f"{z['transitions']} transition(s)"
        )
    lines.append(f"endpoints ({len(eps)}):")
    if eps:
        rows = [(shown(e["address"]), shown(e["zone"]), shown(e["node"]), e) for e in eps]
        w = max(len(a) for a, _, _, _ in rows)
        zw = max([len(z) for _, z, _, _ in rows] + [4])
        nw = max([len(n) for _, _, n, _ in rows] + [4])
        lines.append(
            f"  {'address':<{w}}  {'zone':<{zw}}  {'node':<{nw}}  slot  ring  {'report':<24}"
        )
        for address, zone, node, e in rows:
            lines.append(
                f"  {address:<{w}}  {zone or '-':<{zw}}  {node or '-':<{nw}}  "
                f"{e['slot']:>4}  {e['tier']:>4}  {_report_text(e):<24}" + _outlier_text(e)
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
    out = json.dumps(s, indent=2) if as_json else render_text(s)
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
