"""``perf/RESULTS.md``: tables, targets and charts from the figures of a benchmark run.

Nothing here measures; :mod:`perf.suite` runs the parts and hands their figures over
(also kept as ``RESULTS.json`` next to the page, so a run of some parts only keeps the
figures of the others, each with its own date and machine).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from perf.targets import Target, targets
from perf.targets import find_one as _one
from perf.targets import fmt as _fmt
from perf.targets import pick as _pick
from perf.targets import rows_of as _rows

__all__ = ["Target", "charts", "load", "render", "targets", "write"]

PARTS = (
    "inprocess", "host", "http", "control", "fanout", "fleet", "serving", "reports", "lbcore",
    "zones",
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
    "zones": "Zone affinity's cost to a worker's plans",
}
INPROCESS_CHART = "inprocess.png"
HOST_CHART = "host.png"


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


def _zones(part: dict[str, Any]) -> list[str]:
    rows = part["rows"]
    body = [
        [
            f"{r['endpoints']:,}",
            r["op"],
            _fmt(r["zone_ms"], 3),
            _fmt(r["plain_ms"], 3),
            _ratio(r["ratio"]),
            _ratio(r["reports_ratio"]) if "reports_ratio" in r else "–",
            f"{_fmt(r['zone_prepare_ms'], 3)} / {_fmt(r['plain_prepare_ms'], 3)} "
            f"({r['prepared_tables']} of {r['tables']} tables)"
            if "zone_prepare_ms" in r
            else "–",
        ]
        for r in rows
    ]
    header = ["endpoints", "plan", "zone ms", "no zone ms", "zone × no zone",
              "reports on × off (zone)",
              "map thread's prepare ms (zone / no zone; tables it mapped)"]  # fmt: skip
    return [
        "`build_plan` on a table mapped from shared memory, median milliseconds of the "
        "routing thread (pinned to one core); ratios are measured in the same run. Tables "
        "over the worker's inline-map size are mapped and prepared by the reader's map "
        "thread (`prepare_table`, its own column; – : mapped by the batch).",
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
    "zones": _zones,
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
