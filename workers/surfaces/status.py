"""``GET /status``: one self-contained HTML page showing what the host routes on.

Per-pod occupancy bars, each pod's load in the table's load signal (red over the
bounded-load bar ``balance_factor × (increment + Σ load) / n``, marked on the bars when
the signal is occupancy; the increment is what the routers count for the call being
routed: 1 for in-flight and effective load, the mean latency's share of the window for
occupancy),
fading rings with the progress of their fade window and the share of keys they carry,
the routing knobs, the table's generation and age and the publisher's health. Plain
server-rendered HTML with inline CSS: no build step, no script, no external asset, so
it works from a ``kubectl port-forward`` on an air-gapped cluster. It reloads itself
every few seconds (``<meta http-equiv="refresh">``).

Every string from shared memory (addresses, zones, nodes) is HTML-escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any

from workers.surfaces.hosts import EndpointState, HostSnapshot

__all__ = ["MAX_ROWS", "bar_scale", "render"]

#: Most endpoint rows on the page: a table larger than this shows its most loaded ones,
#: so one page view costs the same at any table size.
MAX_ROWS = 200
# New endpoints named per fading ring (a scale-up of thousands is counted, not listed).
_ADDED_SHOWN = 20

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d232b;background:#fafbfc}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.4em 0 .4em}
.ok{color:#1a7f37}.bad{color:#b42318}.muted{color:#667085}
table{border-collapse:collapse}
td,th{padding:.25em .7em;text-align:left;vertical-align:middle;white-space:nowrap}
th{font-weight:600;border-bottom:1px solid #d0d5dd}tr+tr td{border-top:1px solid #eaecf0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.bar{position:relative;width:240px;height:14px;background:#eaecf0;border-radius:3px}
.fill{position:absolute;left:0;top:0;bottom:0;background:#2e6fd8;border-radius:3px}
.fill.hot{background:#d9480f}.fill.ring{background:#7a5af8}
.limit{position:absolute;top:-3px;bottom:-3px;width:2px;background:#1d232b}
.ejected td{color:#98a2b3;text-decoration:line-through}
dl{display:grid;grid-template-columns:max-content auto;gap:.15em 1em;margin:0}dt{color:#667085}
"""


def bar_scale(endpoints: tuple[EndpointState, ...], limit: float | None) -> float:
    """Occupancy shown as a full bar: at least 1.0, else the largest value to draw.

    Parameters
    ----------
    endpoints
        Endpoints with their occupancy (busy-seconds per second).
    limit
        The bounded-load bar in the same unit, if any.
    """
    values = [e.occupancy for e in endpoints if e.occupancy is not None]
    if limit is not None:
        values.append(limit)
    return max([1.0, *values])


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _num(x: float | None, fmt: str = ".3g", none: str = "–") -> str:
    return none if x is None else format(x, fmt)


def _knob(value: Any) -> str:
    if value is None:
        return "off / unlimited"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _summary(s: HostSnapshot) -> str:
    h = s.health
    verdict = (
        '<span class="ok" id="health">healthy</span>'
        if h.ok
        else f'<span class="bad" id="health">unhealthy: {escape(h.reason)}</span>'
    )
    rows = [
        ("health", verdict),
        ("generation", f'<span id="generation">{s.generation}</span>'),
        (
            "table age",
            f'<span id="table-age">{_num(s.table_age_s, ".1f")}</span> s'
            if s.table_age_s is not None
            else '<span id="table-age">nothing published yet</span>',
        ),
        (
            "publisher",
            f"pid {s.writer_pid}, heartbeat {_num(s.heartbeat_age_s, '.1f')} s ago "
            f"(stale after {s.stale_after_s:g} s)"
            if s.tables_present
            else "not found",
        ),
    ]
    if s.outlier_panic:
        rows.append(
            (
                "outlier panic",
                '<span class="bad" id="outlier-panic">too few endpoints left un-ejected: '
                "routing ignores every ejection (fail open)</span>",
            )
        )
    if s.counters_present:
        rows.append(
            (
                "host totals",
                f"{s.decisions} keys routed, {s.fallbacks} fallback, "
                f"{s.moves} moved by bounded load",
            )
        )
    items = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return f"<dl>{items}</dl>"


def _endpoints(s: HostSnapshot) -> str:
    if not s.endpoints:
        return (
            '<p class="muted" id="no-endpoints">'
            "No endpoints: every key falls back to the ingress.</p>"
        )
    bf = s.knobs.get("balance_factor")
    signal = s.knobs.get("load_signal", "occupancy")
    loads = [e.load for e in s.endpoints if e.load is not None and not e.ejected]
    # Bounded load's bar from the routers' own plan (balance_factor × (increment + Σ
    # load) / n over the eligible endpoints), in the unit of the table's load signal.
    # Not shown on an idle host (nobody can be over it).
    inc = 1.0 if s.bar_increment is None else s.bar_increment
    bar = s.bar if bf is not None and sum(loads) > 0 else None
    limit = bar if signal == "occupancy" else None  # drawn on the occupancy bars only then
    scale = bar_scale(s.endpoints, limit)
    window = f" over {s.window_s:g} s" if s.window_s else ""
    head = (
        "<tr><th>endpoint</th><th>zone</th><th>node</th><th>ring</th>"
        f"<th>occupancy{window}</th><th></th><th>load ({escape(str(signal))})</th>"
        "<th>in flight</th><th>latency</th><th>reported</th><th>requests</th>"
        "<th>failures</th><th>outlier</th></tr>"
    )
    rows = []
    shown = s.endpoints
    if len(shown) > MAX_ROWS:
        # The most loaded first: the page stays small at any table size and still
        # shows the pods an operator opens it for.
        shown = tuple(
            sorted(shown, key=lambda e: (-(e.load or 0.0), -(e.occupancy or 0.0)))[:MAX_ROWS]
        )
    for e in shown:
        occ = e.occupancy
        if occ is None:
            cell = '<span class="muted">no counters</span>'
            value = "–"
        else:
            hot = " hot" if bar is not None and (e.load or 0.0) > bar else ""
            marker = (
                f'<span class="limit" style="left:{_pct(limit / scale)}" '
                f'title="bounded-load bar {limit:.3g}"></span>'
                if limit is not None
                else ""
            )
            cell = (
                f'<div class="bar" data-endpoint="{escape(e.address)}" data-occupancy="{occ!r}">'
                f'<span class="fill{hot}" style="width:{_pct(min(occ / scale, 1.0))}"></span>'
                f"{marker}</div>"
            )
            value = f"{occ:.2f}"
        latency = "–" if e.latency_s is None else f"{e.latency_s * 1e3:.1f} ms"
        reported = _reported(e)
        cls = ' class="ejected" title="ejected"' if e.ejected else ""
        outlier = _outlier(e)
        ring = f"fading {e.tier}" if e.tier else "established"
        rows.append(
            f"<tr{cls}><td>{escape(e.address)}</td><td>{escape(e.zone) or '–'}</td>"
            f"<td>{escape(e.node) or '–'}</td><td>{ring}</td>"
            f"<td>{cell}</td><td class=num>{value}</td>"
            f'<td class=num data-load="{e.load!r}">{_num(e.load)}</td>'
            f"<td class=num>{_num(e.in_flight, 'd')}</td><td class=num>{latency}</td>"
            f'<td class="reported" data-source="{escape(e.load_source)}">{reported}</td>'
            f"<td class=num>{_num(e.requests_total, 'd')}</td>"
            f"<td class=num>{_num(e.failures_total, 'd')}</td>"
            f'<td class="outlier" data-reason="{escape(e.eject_reason)}">{outlier}</td></tr>'
        )
    note = ""
    if bar is not None:
        mark = " (the black mark)" if limit is not None else ""
        why = (
            " (the call being routed: mean latency over the window / window)"
            if signal == "occupancy" and inc != 1.0
            else ""
        )
        note = (
            f'<p class="muted" id="load-bar">Bar: full width = {scale:.3g}. Red: load over '
            f"the bounded-load bar {bar:.3g}{mark} = balance factor {bf:g} × ({inc:.3g} + "
            f"total {escape(str(signal))} load) / {len(loads)} endpoints{why}.</p>"
        )
    if len(shown) < len(s.endpoints):
        note += (
            f'<p class="muted" id="endpoints-cut">Showing the {len(shown)} most loaded of '
            f"{len(s.endpoints)} endpoints (/metrics and cslb inspect have the rest).</p>"
        )
    return f'<table id="endpoints">{head}{"".join(rows)}</table>{note}'


def _outlier(e: EndpointState) -> str:
    """Ejection of one endpoint: why, for how long yet, and how often before."""
    total = sum(e.ejections)
    before = f" ({total} ejection{'s' if total != 1 else ''} so far)" if total else ""
    if not e.eject_reason:
        return f'<span class="muted">{"–" if not total else before.strip(" ()")}</span>'
    left = f", {e.ejected_for_s:.0f} s left" if e.ejected_for_s is not None else ""
    what = "ejected" if e.ejected else "ejected, ignored (panic)"
    return f"{what}: {escape(e.eject_reason.replace('_', ' '))}{left}{before}"


def _fading(s: HostSnapshot) -> str:
    if not s.fading:
        return '<p class="muted" id="no-fading">No ring is fading in.</p>'
    mode = s.knobs.get("fade_mode", "n-ring")
    what = {
        "n-ring": "share of keys",
        "skipper": "Skipper fade-in score",
        "off": "share (fade off)",
    }
    head = (
        f"<tr><th>ring</th><th>new endpoints</th><th>fade window</th><th></th>"
        f"<th>{what.get(mode, 'share')}</th></tr>"
    )
    window = s.knobs.get("fade_duration_s", 0.0)
    rows = []
    for r in s.fading:
        added = ", ".join(escape(a) for a in r.added[:_ADDED_SHOWN]) or "–"
        if len(r.added) > _ADDED_SHOWN:
            added += f" and {len(r.added) - _ADDED_SHOWN} more"
        rows.append(
            f'<tr class="fading" data-ring="{r.ring}" data-share="{r.share!r}">'
            f"<td class=num>{r.ring}</td><td>{added}</td>"
            f'<td><div class="bar"><span class="fill ring" '
            f'style="width:{_pct(r.progress)}"></span></div></td>'
            f"<td class=num>{r.age_s:.1f} s of {window:g} s</td>"
            f"<td class=num>{_pct(r.share)}</td></tr>"
        )
    return f'<table id="fading">{head}{"".join(rows)}</table>'


def _knobs(s: HostSnapshot) -> str:
    if not s.knobs:
        return '<p class="muted">No table: knobs unknown.</p>'
    rows = "".join(
        f'<tr><td>{escape(k)}</td><td id="knob-{escape(k)}">{escape(_knob(v))}</td></tr>'
        for k, v in s.knobs.items()
    )
    return f'<table id="knobs">{rows}</table>'


def render(snapshot: HostSnapshot, *, refresh_s: float | None = 5.0) -> str:
    """The status page of one snapshot, as an HTML document.

    Parameters
    ----------
    snapshot
        What to show (:meth:`workers.surfaces.collector.HostMonitor.snapshot`).
    refresh_s
        Reload the page every this many seconds (``None`` or ``<= 0``: never).
    """
    s = snapshot
    ns = escape(s.namespace)
    refresh = (
        f'<meta http-equiv="refresh" content="{refresh_s:g}">'
        if refresh_s is not None and refresh_s > 0
        else ""
    )
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8">{refresh}'
        f"<title>cslb · {ns}</title><style>{_CSS}</style></head><body>"
        f"<h1>cslb routing · namespace {ns}</h1>"
        f"{_summary(s)}"
        f"<h2>Endpoints ({len(s.endpoints)})</h2>{_endpoints(s)}"
        f"<h2>Fading rings ({len(s.fading)})</h2>{_fading(s)}"
        f"<h2>Knobs</h2>{_knobs(s)}"
        "</body></html>\n"
    )


def _reported(e: EndpointState) -> str:
    """The pod's own load report: utilization, age, and whether bounded load uses it."""
    if e.reported_age_s is None:
        return '<span class="muted">–</span>'
    util = "–" if e.reported_utilization is None else f"{e.reported_utilization:.2f}"
    used = " (balanced on it)" if e.load_source == "reported" else ""
    return f"{util} · {e.reported_age_s:.1f} s ago{used}"
