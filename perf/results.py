"""``perf/RESULTS.md``: tables, targets and charts from the figures of a benchmark run.

Nothing here measures; :mod:`perf.suite` runs the parts and hands their figures over
(also kept as ``RESULTS.json`` next to the page, so a run of some parts only keeps the
figures of the others, each with its own date and machine).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perf.control import STALL_LIMIT_S

PARTS = (
    "inprocess", "host", "http", "control", "fanout", "fleet", "serving", "reports", "lbcore",
)  # fmt: skip
#: Version of the figures' layout in RESULTS.json; parts kept from a run with another
#: version are dropped (rerun them) rather than misread.
FORMAT = 2
TITLES = {
    "inprocess": "In-process routing",
    "host": "Host scaling",
    "http": "HTTP: `cslb serve` under wrk",
    "control": "Control plane",
    "fanout": "The fan-out helper",
    "fleet": "A healthy, equal fleet under load",
    "serving": "The pods' load-report middleware",
    "reports": "Reading the pods' load reports (callers)",
    "lbcore": "lbcore's one-off calls: `Ring.lookup`, `Ring.lookup_bounded`, `route_ring_set`",
}
INPROCESS_CHART = "inprocess.png"
HOST_CHART = "host.png"
HTTP_CPU_LIMIT = 0.10  # the bundled app may add at most 10 % CPU per request (issue 12)
STALL_LIMIT_MS = STALL_LIMIT_S * 1e3
#: A worker's PSS with a 1,000-endpoint table mapped on the NumPy router, measured by
#: ``python -m perf --only control`` on 2026-11-29 (perf/RESULTS.md of then): the
#: kernel issue's "no regression" bar is within 10 % of it.
PSS_BEFORE_MIB = 69.9


def _rows(part: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [] if part is None else part["rows"]


def _pick(rows: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def _one(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    got = _pick(rows, **match)
    return got[0] if got else None


def _fmt(x: float, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def _ratio(x: float) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "–"
    return f"{x:.2g}×" if x < 1 else f"{x:.1f}×"


def _table(header: list[str], body: list[list[str]], left: int = 1) -> list[str]:
    """A Markdown table; the first ``left`` columns are text (left-aligned), the rest numbers."""
    align = ["---" if i < left else "---:" for i in range(len(header))]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in body]
    return out


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
            f"{what}: {_fmt(v, 2)}{unit} ({'ok' if ok else 'miss'}, {v / bar:.2f}× the bar)"
            if bar
            else f"{what}: {_fmt(v, 0)} ({'ok' if ok else 'miss'}, bar {_fmt(bar, 0)})"
            for what, v, bar, ok in self.checks
        )
        return f"{out}; {self.context}" if self.context else out


def targets(parts: dict[str, Any]) -> list[tuple[Target, str]]:
    """The targets of issue 12 evaluated on ``parts``, each with the unit of its figures."""
    ge = lambda v, b: v >= b  # noqa: E731
    le = lambda v, b: v <= b  # noqa: E731
    lt = lambda v, b: v < b  # noqa: E731
    ip = _rows(parts.get("inprocess"))
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
                mine = _one(ip, endpoints=eps, keys=kind, batch=batch, op="cslb Router")
                other = _one(ip, endpoints=eps, keys=kind, batch=batch, op=base)
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
    hs = _rows(parts.get("host"))
    for op in ("cslb Router", "python loop"):
        two = _one(hs, processes=2, batch=100, op=op)
        one = _one(hs, processes=1, batch=100, op=op)
        if one and two:
            ratio = two["decisions_per_s"] / one["decisions_per_s"]
            if op == "cslb Router":
                t.check("cslb Router, 2 processes / 1", ratio, 1.8, ge)
            else:
                t.context = f"the machine itself (python loop, same run): {ratio:.2f}×"
    out.append((t, "×"))

    hr = _rows(parts.get("http"))
    t = Target(
        "HTTP, 100 IDs: the bundled app adds ≤ 10 % CPU per request over the no-op app", "http"
    )
    for r in _pick(hr, app="cslb", ids=100):
        base = _one(hr, app="noop", ids=100, server=r["server"], body=r["body"])
        if base:
            extra = r["cpu_us_per_request"] / base["cpu_us_per_request"] - 1.0
            t.check(f"{r['server']} {r['body']}", extra * 100, HTTP_CPU_LIMIT * 100, le)
    out.append((t, " %"))

    t = Target("HTTP, 1,000 IDs: ≥ 3,000,000 decisions/s for the host", "http")
    best = max(_pick(hr, app="cslb", ids=1_000), key=lambda r: r["decisions_per_s"], default=None)
    if best:
        t.check(f"best: {best['server']} {best['body']}", best["decisions_per_s"] / 1e6, 3.0, ge)
    out.append((t, " M/s"))

    cp = _rows(parts.get("control"))
    t = Target("Publishing 20,000 endpoints < 250 ms", "control")
    r = _one(cp, endpoints=20_000)
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
    r = _one(cp, endpoints=1_000)
    if r and r.get("pss_mib"):
        t.check("median worker", statistics.median(r["pss_mib"]), 1.1 * PSS_BEFORE_MIB, le)
    out.append((t, " MiB"))
    out += _issue17_targets(parts)
    return out + _lbcore_targets(parts)


def _lbcore_targets(parts: dict[str, Any]) -> list[tuple[Target, str]]:
    """Issue 18's targets for lbcore's one-off calls against the Python loop."""
    ge = lambda v, b: v >= b  # noqa: E731
    lt = lambda v, b: v < b  # noqa: E731
    rows = _rows(parts.get("lbcore"))
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
                    r = _one(rows, endpoints=eps, keys=kind, batch=batch, op=op)
                    if r:
                        t.check(f"{eps:,}×100 {kind}", r["ratio"], bar, ge)
        out.append((t, "×"))
    t = Target("Batch 1 < 5 µs per call: lookup, lookup_bounded, fade_route", "lbcore")
    for op in ("lookup", "lookup_bounded", "fade_route"):
        for r in _pick(rows, op=op, batch=1):
            t.check(f"{op} {r['endpoints']:,}×100 {r['keys']}", r["ns_per_key"] / 1e3, 5.0, lt)
    out.append((t, " µs"))
    return out


def _issue17_targets(parts: dict[str, Any]) -> list[tuple[Target, str]]:
    """Issue 17's targets: the wire fan-out against its floor, and the fleet under load."""
    le = lambda v, b: v <= b  # noqa: E731
    fo = [r for r in _rows(parts.get("fanout")) if r.get("wire_target")]
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
    fl = _rows(parts.get("fleet"))
    curl = _one(fl, fleet=True, sender="curl")
    t = Target("Healthy fleet (curl): keys moved by bounded load ≤ 5 % of decisions", "fleet")
    if curl:
        t.check("moved", curl["moved_pct"], 5.0, le)
        before = _one(fl, fleet=True, sender="urllib3")
        if before:
            t.context = f"urllib3 (before), same run: {before['moved_pct']:.1f} %"
    out.append((t, " %"))
    t = Target("Healthy fleet (curl): no bulkhead rejection, no failed key", "fleet")
    if curl:
        t.check("bulkhead rejections", curl["bulkhead_rejections"], 0, le)
        t.check("failed keys", curl["failed_keys"], 0, le)
    out.append((t, ""))
    return out


# ------------------------------------------------------------------------------------
# Sections.


def _inprocess(part: dict[str, Any]) -> list[str]:
    rows = part["rows"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    out = [
        "Nanoseconds per key (median over fresh batches; lower is better) and, for cslb, "
        "millions of keys per second. Ratios are the alternative's time over cslb's.",
        "",
    ]
    header = ["ring", "keys", "batch", *[f"{op} ns/key" for op in ops], "cslb M keys/s"]
    header += [f"× vs {op}" for op in ops if op != "cslb Router"]
    body = []
    seen = list(dict.fromkeys((r["endpoints"], r["keys"], r["batch"]) for r in rows))
    for eps, kind, batch in seen:
        cells = {r["op"]: r for r in _pick(rows, endpoints=eps, keys=kind, batch=batch)}
        mine = cells.get("cslb Router")
        line = [f"{eps:,}×100", kind, f"{batch:,}"]
        line += [_fmt(cells[op]["ns_per_key"]) if op in cells else "–" for op in ops]
        line.append(_fmt(mine["mkeys_per_s"], 2) if mine else "–")
        for op in ops:
            if op == "cslb Router":
                continue
            ok = mine and op in cells
            line.append(_ratio(cells[op]["ns_per_key"] / mine["ns_per_key"]) if ok else "–")
        body.append(line)
    out += _table(header, body, left=3)
    out += ["", f"![ns per key vs batch size]({INPROCESS_CHART})"]
    return out + _where_the_time_goes(part)


def _where_the_time_goes(part: dict[str, Any]) -> list[str]:
    """The Router's path in parts and its profile (100×100, SKU keys), if measured."""
    parts = part.get("breakdown") or []
    if not parts:
        return []
    labels = list(dict.fromkeys((r["part"], r["depth"]) for r in parts))
    batches = sorted({r["batch"] for r in parts})
    out = [
        "",
        "### Where the Router's time goes (100×100, SKU keys)",
        "",
        "Each part measured alone, median nanoseconds per batch (a part marked — is "
        "inside the row above it; what the parts leave of their row is Python around them: "
        "frames, locks, clock reads, the index copy).",
        "",
    ]
    body = []
    for label, depth in labels:
        line = ["— " * depth + label]
        for b in batches:
            got = _one(parts, part=label, batch=b)
            line.append(_fmt(got["ns_per_batch"], 0) if got else "–")
        body.append(line)
    out += _table(["part", *[f"batch {b:,} ns" for b in batches]], body)
    prof = part.get("profile") or []
    if prof:
        out += [
            "",
            "Profile of batch-1 `route_table` + `track` (cProfile, own time; its overhead "
            "inflates short functions, so read shares, not times):",
            "",
        ]
        rows = [
            [f"`{p['function']}`", f"{p['calls_per_batch']:.1f}", f"{p['own_share'] * 100:.1f} %"]
            for p in prof
        ]
        out += _table(["function", "calls per batch", "own time"], rows)
    return out


def _host(part: dict[str, Any]) -> list[str]:
    header = ["what", "batch", "processes", "M keys/s", "efficiency", "new generations followed"]
    body = [
        [
            r.get("op", "cslb Router"),
            f"{r['batch']:,}",
            str(r["processes"]),
            _fmt(r["decisions_per_s"] / 1e6, 2),
            f"{r['efficiency']:.2f}",
            f"≥ {r['generations_followed']} per run"
            if r.get("op", "cslb Router") != "python loop"
            else "–",
        ]
        for r in part["rows"]
    ]
    return [
        "Total keys routed per second by the host (for cslb: decisions through route_table "
        "+ track, all processes); efficiency = N processes' total / (N × one process).",
        "",
        *_table(header, body, left=3),
        "",
        f"![decisions per second vs processes]({HOST_CHART})",
    ]


def _http(part: dict[str, Any]) -> list[str]:
    rows = part["rows"]
    if not rows:
        return ["Not run."]
    header = [
        "server",
        "body",
        "IDs/request",
        "app",
        "requests/s",
        "M IDs/s (cslb: decisions)",
        "p50 ms",
        "p99 ms",
        "server CPU µs/request",
        "routing's extra CPU",
    ]
    body = []
    for r in rows:
        extra = "–"
        if r["app"] == "cslb":
            base = _one(rows, app="noop", server=r["server"], body=r["body"], ids=r["ids"])
            if base:
                extra = f"{(r['cpu_us_per_request'] / base['cpu_us_per_request'] - 1) * 100:+.0f} %"
        body.append(
            [
                r["server"],
                r["body"],
                f"{r['ids']:,}",
                r["app"] + (f" ({r['errors']} errors)" if r["errors"] else ""),
                _fmt(r["requests_per_s"]),
                _fmt(r["decisions_per_s"] / 1e6, 2),
                _fmt(r["p50_ms"], 2),
                _fmt(r["p99_ms"], 2),
                _fmt(r["cpu_us_per_request"]),
                extra,
            ]
        )
    return _table(header, body, left=4)


def _control(part: dict[str, Any]) -> list[str]:
    header = [
        "endpoints",
        "scale-up: build + publish ms",
        "scale-down: build + publish ms",
        "first publish ms",
        "every worker on it after ms (max)",
        "worker's first batch on it ms",
        "worker batch ms",
        "longest gap between batches ms (less waits for a core)",
        "PSS per worker MiB",
        "on the routing thread: every worker on it ms / longest gap ms",
    ]

    def change(r: dict[str, Any], kind: str) -> str:
        return (
            f"{_fmt(r[kind + '_build_ms'])} + {_fmt(r[kind + '_publish_ms'])} = "
            f"{_fmt(r[kind + '_total_ms'])}"
        )

    body = [
        [
            f"{r['endpoints']:,}",
            change(r, "up"),
            change(r, "down"),
            _fmt(r["first_publish_ms"]),
            f"{_fmt(r['reach_ms'])} ({_fmt(r['reach_max_ms'])})",
            _fmt(r["first_batch_ms"], 2),
            _fmt(r["batch_ms"], 2),
            f"{_fmt(r['max_gap_ms'])} ({_fmt(r.get('max_gap_own_ms', math.nan))})",
            ", ".join(_fmt(x) for x in r["pss_mib"]),
            f"{_fmt(r.get('fg_reach_ms', math.nan))} / {_fmt(r.get('fg_max_gap_ms', math.nan))}",
        ]
        for r in part["rows"]
    ]
    return _table(header, body)


def _fanout(part: dict[str, Any]) -> list[str]:
    rows = part["rows"]
    out: list[str] = []
    inproc = [r for r in rows if "form" in r]
    if inproc:
        header = ["form", "send", "helper µs/key (CPU)", "by hand µs/key (CPU)", "ratio",
                  "by hand"]  # fmt: skip
        body = [
            [
                r["form"],
                r["send"],
                _fmt(r["helper_us_per_key"]),
                _fmt(r["hand_us_per_key"]),
                _ratio(r["ratio"]),
                r["baseline"],
            ]
            for r in inproc
        ]
        out += ["In process (a send that returns at once or sleeps 1 ms):", ""]
        out += _table(header, body, left=2)
    for r in rows:
        if r.get("op") == "recording":
            out += [
                "",
                f"Recording one call (begin + end, batched writes): "
                f"{_fmt(r['ledger_ns_per_call'], 0)} ns; one record_start + record_end per "
                f"call: {_fmt(r['per_call_ns'], 0)} ns ({_ratio(r['ratio'])}).",
            ]
    wire = [r for r in rows if r.get("wire")]
    for ids in dict.fromkeys(r["ids"] for r in wire):
        these = [r for r in wire if r["ids"] == ids]
        floors = {r["variant"]: r for r in these if r["variant"].startswith("floor")}
        header = ["client", "fan-outs", "p50 ms", "p90 ms", "CPU ms per fan-out",
                  "wall × floor", "CPU × floor", "new connections per fan-out (closed)",
                  "failed keys"]  # fmt: skip
        body = []
        for r in these:
            base = floors.get("floor grouped" if "grouped" in r["variant"] else "floor")
            body.append(
                [
                    r["variant"],
                    str(r["fanouts"]),
                    _fmt(r["p50_ms"], 2),
                    _fmt(r["p90_ms"], 2),
                    _fmt(r["cpu_ms"], 2),
                    _ratio(r["p50_ms"] / base["p50_ms"]) if base else "–",
                    _ratio(r["cpu_ms"] / base["cpu_ms"]) if base else "–",
                    f"{_fmt(r['new_conns_per_fanout'], 2)} "
                    f"({_fmt(r.get('closed_conns_per_fanout', math.nan), 2)})",
                    str(r["failed_keys"] + r.get("wrong_values", 0)),
                ]
            )
        out += [
            "",
            f"On the wire, {ids:,} IDs per fan-out to 5 pods answering in 2 ms (one fan-out "
            "at a time, the clients interleaved in one run; ratios against the floor of the "
            "same run, grouped rows against the floor grouped):",
            "",
        ]
        out += _table(header, body, left=1)
    tg = [r for r in rows if r.get("wire_target")]
    if tg:
        out += ["", "Issue 17's bars (≤ 1.3× the floor's p50 wall and CPU, no failed key):", ""]
        out += _table(
            ["client", "IDs", "against", "wall ×", "CPU ×", "failed keys", "status"],
            [
                [
                    t["variant"],
                    f"{t['ids']:,}",
                    t["floor"],
                    _ratio(t["wall_ratio"]),
                    _ratio(t["cpu_ratio"]),
                    str(t["failed_keys"]),
                    "met" if t["met"] else "**missed**",
                ]
                for t in tg
            ],
            left=3,
        )
    return out


def _fleet(part: dict[str, Any]) -> list[str]:
    rows = [r for r in part["rows"] if r.get("fleet")]
    if not rows:
        return ["Not run."]
    header = ["sender", "requests/s", "p50 ms", "p90 ms", "fan-out p50 ms (in the service)",
              "failed keys", "decisions",
              "moved by bounded load", "bulkhead rejections", "retries",
              "new connections per request (closed)", "service CPU ms per request",
              "recorded latency per pod ms (true: 2)"]  # fmt: skip
    body = [
        [
            r["sender"],
            _fmt(r["requests_per_s"]),
            _fmt(r["p50_ms"]),
            _fmt(r["p90_ms"]),
            _fmt(r.get("fanout_p50_ms", math.nan)),
            str(r["failed_keys"]),
            f"{r['decisions']:,.0f}",
            f"{r['moved_pct']:.2f} %",
            f"{r['bulkhead_rejections']:,.0f}",
            f"{r['retries']:,.0f}",
            f"{_fmt(r['new_conns_per_request'], 2)} "
            f"({_fmt(r.get('closed_conns_per_request', math.nan), 2)})",
            _fmt(r["server_cpu_ms_per_request"]),
            ", ".join(_fmt(v, 2) for v in r["latency_ms"].values()),
        ]
        for r in rows
    ]
    return [
        "Five C pods answering in 2 ms, the service under gunicorn (gthread, 2 workers × 4 "
        "threads, perf/fleet_app.py) fanning out 100 fresh IDs per request from 4 clients; "
        "figures over the measured window.",
        "",
        *_table(header, body, left=1),
    ]


def _serving(part: dict[str, Any]) -> list[str]:
    rows = [r for r in part["rows"] if r.get("serving")]
    if not rows:
        return ["Not run."]
    body = [
        [
            r["what"],
            _fmt(r["us"], 2),
            f"+{_fmt(r['us'] - r['baseline_us'], 2)}" if r["baseline_us"] else "–",
        ]
        for r in rows
    ]
    return _table(["what", "µs per request", "over the bare app"], body, left=1)


def _reports(part: dict[str, Any]) -> list[str]:
    inproc = [r for r in part["rows"] if r.get("reports") == "inprocess"]
    wire = [r for r in part["rows"] if r.get("reports") == "wire"]
    out = _table(
        ["in-process, per answer", "µs"], [[r["what"], _fmt(r["us"], 2)] for r in inproc], left=1
    )
    if wire:
        out += [""]
        out += _table(
            ["on the wire (CurlSender)", "CPU µs per call", "extra", "ms per fan-out"],
            [
                [
                    r["what"],
                    _fmt(r["cpu_us_per_call"], 2),
                    f"{r['extra_us_per_call']:+.2f}",
                    _fmt(r["wall_ms_per_fanout"], 2),
                ]
                for r in wire
            ],
            left=1,
        )
    return out


def _lbcore(part: dict[str, Any]) -> list[str]:
    rows = part["rows"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    header = ["ring", "keys", "batch", "python loop ns/key", *[f"{op} ns/key" for op in ops]]
    header += [f"{op} × loop" for op in ops]
    body = []
    for eps, kind, batch in dict.fromkeys((r["endpoints"], r["keys"], r["batch"]) for r in rows):
        cells = {r["op"]: r for r in _pick(rows, endpoints=eps, keys=kind, batch=batch)}
        loop = next(iter(cells.values()))["loop_ns_per_key"]
        line = [f"{eps:,}×100", kind, f"{batch:,}", _fmt(loop)]
        line += [_fmt(cells[op]["ns_per_key"]) if op in cells else "–" for op in ops]
        line += [_ratio(cells[op]["ratio"]) if op in cells else "–" for op in ops]
        body.append(line)
    return [
        "Nanoseconds per key (median over fresh batches, pinned to one core); ratios are "
        "the pure-Python loop's time (`xxhash` + `bisect`, same run) over lbcore's.",
        "",
        *_table(header, body, left=2),
    ]


SECTIONS = {
    "inprocess": _inprocess,
    "host": _host,
    "http": _http,
    "control": _control,
    "fanout": _fanout,
    "fleet": _fleet,
    "serving": _serving,
    "reports": _reports,
    "lbcore": _lbcore,
}


# ------------------------------------------------------------------------------------
# Charts.


def charts(parts: dict[str, Any], out_dir: Path) -> list[str]:
    """Write the PNG charts into ``out_dir``; returns notes (why a chart is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["matplotlib is not installed (pip install 'cslb[sim]'): no charts"]
    notes: list[str] = []
    ip = _rows(parts.get("inprocess"))
    if ip:
        rings = sorted({r["endpoints"] for r in ip})
        fig, axes = plt.subplots(1, len(rings), figsize=(4.2 * len(rings), 3.8), sharey=True)
        axes = list(axes) if len(rings) > 1 else [axes]
        for ax, eps in zip(axes, rings, strict=True):
            for i, op in enumerate(dict.fromkeys(r["op"] for r in ip)):
                color = f"C{i}"  # one colour per implementation, solid SKUs, dotted IDs
                for kind, style in (("sku", "-"), ("int", ":")):
                    pts = sorted(
                        (r["batch"], r["ns_per_key"])
                        for r in _pick(ip, endpoints=eps, op=op, keys=kind)
                    )
                    if pts:
                        ax.plot(*zip(*pts, strict=True), style, color=color, marker="o",
                                ms=3, label=f"{op} ({kind})")  # fmt: skip
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{eps:,} endpoints × 100 vnodes")
            ax.set_xlabel("batch size (keys)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel("ns per key (lower is better)")
        axes[-1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / INPROCESS_CHART, dpi=110)
        plt.close(fig)
    hs = _rows(parts.get("host"))
    if hs:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for op, batch in dict.fromkeys((r.get("op", "cslb Router"), r["batch"]) for r in hs):
            pts = sorted(
                (r["processes"], r["decisions_per_s"] / 1e6)
                for r in hs
                if r.get("op", "cslb Router") == op and r["batch"] == batch
            )
            xs, ys = zip(*pts, strict=True)
            (line,) = ax.plot(xs, ys, marker="o", label=f"{op}, batch {batch:,}")
            ax.plot(xs, [ys[0] * x for x in xs], "--", color=line.get_color(), alpha=0.4)
        ax.set_xlabel("processes (dashed: linear scaling)")
        ax.set_ylabel("M keys per second (host)")
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["processes"] for r in hs}))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / HOST_CHART, dpi=110)
        plt.close(fig)
    return notes


# ------------------------------------------------------------------------------------
# The page.


def _machine(m: dict[str, Any]) -> str:
    v = ", ".join(f"{k} {val}" for k, val in m["versions"].items())
    load = " / ".join(f"{x:.2f}" for x in m["loadavg"])
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['memory_bytes'] / 2**30:.0f} GiB, {m['os']}; "
        f"{m['python']}; {v}; load average at the start {load}"
    )


def render(parts: dict[str, Any], command: str, chart_notes: list[str]) -> str:
    """The Markdown page for ``parts`` (name -> {rows, notes, machine, date, ...})."""
    lines = [
        "# cslb benchmark results",
        "",
        f"Generated by `{command}` — do not edit by hand; run it again to regenerate "
        "(`python -m perf --help`; `--only` reruns some parts and keeps the others' "
        "figures, each with its own date). What each part measures is in "
        "[perf/README.md](README.md).",
        "",
        "Absolute numbers move by up to 2× on shared machines; the targets are ratios "
        "measured in the same run where they can be.",
        "",
        "## Targets",
        "",
    ]
    header = ["target", "status", "figures (value, share of the bar)"]
    body = [[t.label, f"**{t.status}**", t.figures(unit) or "–"] for t, unit in targets(parts)]
    lines += _table(header, body, left=3)
    lines += [""]
    lines += [f"* {n}" for n in chart_notes]
    for name in PARTS:
        part = parts.get(name)
        lines += ["", f"## {TITLES[name]}", ""]
        if part is None:
            lines.append(f"Not measured yet: `python -m perf --only {name}`.")
            continue
        mode = " — **quick mode (smoke test; not figures to quote)**" if part["quick"] else ""
        lines += [
            f"Measured {part['date']} in {part['seconds']:.0f} s{mode}. Machine: "
            f"{_machine(part['machine'])}.",
            "",
        ]
        lines += SECTIONS[name](part)
        if part.get("notes"):
            lines.append("")
            lines += [f"* {n}" for n in part["notes"]]
    return "\n".join(lines) + "\n"


def write(parts: dict[str, Any], out_dir: Path, command: str) -> Path:
    """Write ``RESULTS.json``, the charts and ``RESULTS.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "RESULTS.json").write_text(json.dumps(parts, indent=1, sort_keys=True) + "\n")
    notes = charts(parts, out_dir)
    page = out_dir / "RESULTS.md"
    page.write_text(render(parts, command, notes))
    return page


def load(out_dir: Path) -> dict[str, Any]:
    """The parts kept in ``out_dir/RESULTS.json`` by an earlier run (empty if none)."""
    path = out_dir / "RESULTS.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return {}
    return {k: v for k, v in data.items() if k in PARTS and v.get("format") == FORMAT}
