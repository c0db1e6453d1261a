"""The benchmark suite's targets: each a label, the figures it rests on, met or missed.

Nothing here measures; :mod:`perf.results` lists the targets at the top of
``RESULTS.md`` and :mod:`perf.suite` reports them after a run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from perf.control import STALL_LIMIT_S

__all__ = ["Target", "find_one", "fmt", "pick", "rows_of", "targets"]

HTTP_CPU_LIMIT = 0.10  # the bundled app may add at most 10 % CPU per request (issue 12)
STALL_LIMIT_MS = STALL_LIMIT_S * 1e3
#: A worker's PSS with a 1,000-endpoint table mapped on the NumPy router, measured by
#: ``python -m perf --only control`` on 2026-11-29 (perf/RESULTS.md of then): the
#: kernel issue's "no regression" bar is within 10 % of it.
PSS_BEFORE_MIB = 69.9


def rows_of(part: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [] if part is None else part["rows"]


def pick(rows: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def find_one(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    got = pick(rows, **match)
    return got[0] if got else None


def fmt(x: float, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


# ------------------------------------------------------------------------------------
# Targets.


class Target:
    """One target (issues 6 and 12): its label, the figures it rests on and whether it is met."""

    def __init__(self, label: str, part: str) -> None:
        self.label = label
        self.part = part
        self.checks: list[tuple[str, float, float, bool]] = []  # what, value, bar, met
        self.context = ""  # a baseline measured alongside, to read the figures by

    def check(self, what: str, value: float, bar: float, ok: Callable[[float, float], bool]):
        self.checks.append((what, value, bar, bool(ok(value, bar))))

    @property
    def status(self) -> str:
        if not self.checks:
            return "not measured"
        return "met" if all(c[3] for c in self.checks) else "MISSED"

    def figures(self, unit: str) -> str:
        out = "; ".join(
            f"{what}: {fmt(v, 2)}{unit} ({'ok' if ok else 'miss'}, {v / bar:.2f}× the bar)"
            if bar
            else f"{what}: {fmt(v, 0)} ({'ok' if ok else 'miss'}, bar {fmt(bar, 0)})"
            for what, v, bar, ok in self.checks
        )
        return f"{out}; {self.context}" if self.context else out


def targets(parts: dict[str, Any]) -> list[tuple[Target, str]]:
    """The targets of issue 12 evaluated on ``parts``, each with the unit of its figures."""
    ge = lambda v, b: v >= b  # noqa: E731
    le = lambda v, b: v <= b  # noqa: E731
    lt = lambda v, b: v < b  # noqa: E731
    ip = rows_of(parts.get("inprocess"))
    out: list[tuple[Target, str]] = []

    def ratio_target(
        label: str,
        batch: int,
        rings: tuple[int, ...],
        base: str,
        bar: float,
        kinds: tuple[str, ...] = ("sku", "int"),
    ) -> None:
        t = Target(label, "inprocess")
        for eps in rings:
            for kind in kinds:
                mine = find_one(ip, endpoints=eps, keys=kind, batch=batch, op="cslb Router")
                other = find_one(ip, endpoints=eps, keys=kind, batch=batch, op=base)
                if mine and other:
                    t.check(f"{eps}×100 {kind}", other["ns_per_key"] / mine["ns_per_key"], bar, ge)
        out.append((t, "×"))

    # (Batch 1: the Router's time at most 3× the loop's, i.e. the loop at least 1/3 of it.)
    ratio_target("Batch 1, Router ≤ 3× the Python loop's time (ratio ≥ 0.33)", 1, (100, 1_000),
                 "python loop", 1 / 3)  # fmt: skip
    ratio_target("Batch 100, Router ≥ 5× the Python loop, 100×100 ring", 100, (100,),
                 "python loop", 5.0)  # fmt: skip
    ratio_target("Batch 100, Router ≥ 10× the Python loop, 1,000×100 ring", 100, (1_000,),
                 "python loop", 10.0)  # fmt: skip
    ratio_target("Batch 100, Router ≥ 20× uhashring", 100, (100, 1_000), "uhashring", 20.0)
    ratio_target("Batch 100,000, Router ≥ 15× the Python loop, list of str", 100_000,
                 (100, 1_000), "python loop", 15.0, ("sku",))  # fmt: skip
    ratio_target("Batch 100,000, Router ≥ 20× the Python loop, int64 array", 100_000,
                 (100, 1_000), "python loop", 20.0, ("int",))  # fmt: skip

    t = Target("2 processes ≥ 1.8× one process (batch 100)", "host")
    hs = rows_of(parts.get("host"))
    for op in ("cslb Router", "python loop"):
        two = find_one(hs, processes=2, batch=100, op=op)
        one = find_one(hs, processes=1, batch=100, op=op)
        if one and two:
            ratio = two["decisions_per_s"] / one["decisions_per_s"]
            if op == "cslb Router":
                t.check("cslb Router, 2 processes / 1", ratio, 1.8, ge)
            else:
                t.context = f"the machine itself (python loop, same run): {ratio:.2f}×"
    out.append((t, "×"))

    hr = rows_of(parts.get("http"))
    t = Target(
        "HTTP, 100 IDs: the bundled app adds ≤ 10 % CPU per request over the no-op app", "http"
    )
    for r in pick(hr, app="cslb", ids=100):
        base = find_one(hr, app="noop", ids=100, server=r["server"], body=r["body"])
        if base:
            extra = r["cpu_us_per_request"] / base["cpu_us_per_request"] - 1.0
            t.check(f"{r['server']} {r['body']}", extra * 100, HTTP_CPU_LIMIT * 100, le)
    out.append((t, " %"))

    t = Target("HTTP, 1,000 IDs: ≥ 3,000,000 decisions/s for the host", "http")
    best = max(pick(hr, app="cslb", ids=1_000), key=lambda r: r["decisions_per_s"], default=None)
    if best:
        t.check(f"best: {best['server']} {best['body']}", best["decisions_per_s"] / 1e6, 3.0, ge)
    out.append((t, " M/s"))

    cp = rows_of(parts.get("control"))
    t = Target("Publishing 20,000 endpoints < 250 ms", "control")
    r = find_one(cp, endpoints=20_000)
    if r:
        t.check("scale-up", r["up_total_ms"], 250.0, lt)
        t.check("scale-down", r["down_total_ms"], 250.0, lt)
    out.append((t, " ms"))
    t = Target(f"Publishing never stalls a worker (no gap > {STALL_LIMIT_MS:g} ms)", "control")
    for r in cp:
        t.check(f"{r['endpoints']:,} endpoints", r["max_gap_ms"], STALL_LIMIT_MS, le)
    out.append((t, " ms"))
    t = Target(
        f"PSS per worker at 1,000 endpoints within 10 % of {PSS_BEFORE_MIB:g} MiB "
        "(the NumPy router's, before the kernel)",
        "control",
    )
    r = find_one(cp, endpoints=1_000)
    if r and r.get("pss_mib"):
        t.check("median worker", statistics.median(r["pss_mib"]), 1.1 * PSS_BEFORE_MIB, le)
    out.append((t, " MiB"))
    out += _issue17_targets(parts)
    return out + _lbcore_targets(parts) + _zone_targets(parts)


def _lbcore_targets(parts: dict[str, Any]) -> list[tuple[Target, str]]:
    """Issue 18's targets for lbcore's one-off calls against the Python loop."""
    ge = lambda v, b: v >= b  # noqa: E731
    lt = lambda v, b: v < b  # noqa: E731
    rows = rows_of(parts.get("lbcore"))
    big = max((r["batch"] for r in rows), default=0)
    out: list[tuple[Target, str]] = []
    for label, rings, batch, ops, bar in (
        ("Batch 100, Ring.lookup_bounded ≥ 2× the Python loop, 100×100 ring", (100,), 100,
         ("lookup_bounded",), 2.0),
        ("Batch 100, Ring.lookup_bounded ≥ 3.5× the Python loop, 1,000×100 ring", (1_000,),
         100, ("lookup_bounded",), 3.5),
        (f"Batch {big:,} (the largest run), Ring.lookup ≥ 10× the Python loop",
         (100, 1_000), big, ("lookup",), 10.0),
    ):  # fmt: skip
        t = Target(label, "lbcore")
        for eps in rings:
            for kind in ("sku", "int"):
                for op in ops:
                    r = find_one(rows, endpoints=eps, keys=kind, batch=batch, op=op)
                    if r:
                        t.check(f"{eps:,}×100 {kind}", r["ratio"], bar, ge)
        out.append((t, "×"))
    t = Target("Batch 1 < 5 µs per call: lookup, lookup_bounded, fade_route", "lbcore")
    for op in ("lookup", "lookup_bounded", "fade_route"):
        for r in pick(rows, op=op, batch=1):
            t.check(f"{op} {r['endpoints']:,}×100 {r['keys']}", r["ns_per_key"] / 1e3, 5.0, lt)
    out.append((t, " µs"))
    return out


def _issue17_targets(parts: dict[str, Any]) -> list[tuple[Target, str]]:
    """Issue 17's targets: the wire fan-out against its floor, and the fleet under load."""
    le = lambda v, b: v <= b  # noqa: E731
    fo = [r for r in rows_of(parts.get("fanout")) if r.get("wire_target")]
    out: list[tuple[Target, str]] = []
    for label, ids, grouped in (
        ("Fan-out, 100 IDs: fanout / afanout p50 wall and CPU ≤ 1.3× the floor's", 100, False),
        ("Fan-out, 1,000 IDs: fanout / afanout p50 wall and CPU ≤ 1.3× the floor's, no "
         "failed key", 1_000, False),
        ("Fan-out, grouped (one POST per pod) ≤ 1.3× the floor's grouped", None, True),
    ):  # fmt: skip
        t = Target(label, "fanout")
        for r in fo:
            if ("grouped" in r["variant"]) != grouped or (ids is not None and r["ids"] != ids):
                continue
            what = f"{r['variant'].removeprefix('CurlSender ')}, {r['ids']:,} IDs"
            t.check(f"{what}: wall", r["wall_ratio"], r["bar"], le)
            t.check(f"{what}: CPU", r["cpu_ratio"], r["bar"], le)
            if ids == 1_000 or r["failed_keys"]:
                t.check(f"{what}: failed keys", r["failed_keys"], 0, le)
        out.append((t, "×"))
    fl = rows_of(parts.get("fleet"))
    curl = find_one(fl, fleet=True, sender="curl")
    t = Target("Healthy fleet (curl): keys moved by bounded load ≤ 5 % of decisions", "fleet")
    if curl:
        t.check("moved", curl["moved_pct"], 5.0, le)
        before = find_one(fl, fleet=True, sender="urllib3")
        if before:
            t.context = f"urllib3 (before), same run: {before['moved_pct']:.1f} %"
    out.append((t, " %"))
    t = Target("Healthy fleet (curl): no bulkhead rejection, no failed key", "fleet")
    if curl:
        t.check("bulkhead rejections", curl["bulkhead_rejections"], 0, le)
        t.check("failed keys", curl["failed_keys"], 0, le)
    out.append((t, ""))
    return out


#: The zones part's bars (issue 21's costs): a zone plan's refresh and first build over
#: the plain table's, reports on over off in zone mode (:mod:`perf.bench_zones`).
ZONE_REFRESH_BAR, ZONE_FIRST_BAR, ZONE_REPORTS_BAR = 1.5, 2.0, 1.2


def _zone_targets(parts: dict[str, Any]) -> list[tuple[Target, str]]:
    """What zone affinity may add to a worker's plans, as ratios measured in one run."""
    le = lambda v, b: v <= b  # noqa: E731
    rows = rows_of(parts.get("zones"))
    out: list[tuple[Target, str]] = []
    t = Target(
        f"Zone plan refresh (reuse, bar window, loads, bounded load) ≤ {ZONE_REFRESH_BAR:g}× "
        "the no-zone refresh, 1,000 and 20,000 endpoints",
        "zones",
    )
    for r in pick(rows, op="refresh"):
        if r["endpoints"] >= 1_000:
            t.check(f"{r['endpoints']:,} endpoints", r["ratio"], ZONE_REFRESH_BAR, le)
    out.append((t, "×"))
    t = Target(f"First zone plan of a table ≤ {ZONE_FIRST_BAR:g}× the first no-zone plan", "zones")
    for r in pick(rows, op="first"):
        t.check(f"{r['endpoints']:,} endpoints", r["ratio"], ZONE_FIRST_BAR, le)
    out.append((t, "×"))
    t = Target(
        f"Zone mode: a refresh with the pods' reports on ≤ {ZONE_REPORTS_BAR:g}× one with them off",
        "zones",
    )
    for r in pick(rows, op="refresh, reports"):
        t.check(f"{r['endpoints']:,} endpoints", r["reports_ratio"], ZONE_REPORTS_BAR, le)
    out.append((t, "×"))
    return out
