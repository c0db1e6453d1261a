"""``GET /status``: one self-contained HTML page showing what the host routes on.

Per-pod occupancy bars, each pod's load in the table's load signal (red over the
bounded-load bar ``balance_factor × (increment + Σ load) / n``, marked on the bars when
the signal is occupancy; the increment is what the routers count for the call being
routed: 1 for in-flight and effective load, the mean latency's share of the window for
occupancy),
fading rings with the progress of their fade window and the share of keys they carry,
the routing knobs, the table's generation and age and the publisher's health. Pods are
listed by address in numeric order (IPv4, then IPv6, then names; then the port), and
grouped by zone when the endpoints carry zones. With a caller's zone or zone affinity,
the zone controller's state, why, the local share of keys now, its cap and the share of
the fan-out's calls that stayed in the zone; under zone affinity each pod is red over
its own bar (its bar share: its expected share of the keys averaged over the loads'
window, never below the average's bar).

Server-rendered HTML with inline CSS and one inline script: no build step, no external
asset, so it works from a ``kubectl port-forward`` on an air-gapped cluster. The layout
fits a 1,280-px window and a phone (below 760 px each pod becomes a card). With
refreshes on (``?refresh=S``, default 5 s) the script fetches the page again every
``S`` seconds and swaps its content in place, and keeps, per pod, the occupancy and the
request rate of the last :data:`SPARK_WINDOW_S` seconds from those refreshes (in the
tab's ``sessionStorage``, so a reload keeps them) to draw them as sparklines. The page
keeps the history rather than the worker because any worker of the host may answer a
refresh, and the host-wide counters it reads are the same in each: the browser's series
is the one continuous one, and a worker holds no state for pages nobody looks at.
Without scripts the page reloads itself (``<meta http-equiv="refresh">`` in
``<noscript>``) and shows no sparklines; with ``?refresh=0`` it is static and has no
script. A Content-Security-Policy allows only that script (by hash) and same-origin
fetches.

Every string from shared memory (addresses, zones, nodes) is HTML-escaped.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from html import escape
from typing import Any
from urllib.parse import urlsplit

from workers.surfaces.hosts import EndpointState, HostSnapshot

__all__ = ["MAX_ROWS", "SPARK_WINDOW_S", "address_order", "bar_scale", "render"]

#: Most endpoint rows on the page: a table larger than this shows its most loaded ones,
#: so one page view costs the same at any table size.
MAX_ROWS = 200
#: The sparklines' span: the last this many seconds of the page's refreshes.
SPARK_WINDOW_S = 300
# New endpoints named per fading ring (a scale-up of thousands is counted, not listed).
_ADDED_SHOWN = 20

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d232b;background:#fafbfc}
h1{font-size:1.3em;margin:0 0 .2em;overflow-wrap:anywhere}h2{font-size:1.05em;margin:1.4em 0 .4em}
.ok{color:#1a7f37}.bad{color:#b42318}.muted{color:#667085}
table{border-collapse:collapse}
td,th{padding:.25em .6em;text-align:left;vertical-align:middle;white-space:nowrap}
th{font-weight:600;border-bottom:1px solid #d0d5dd}tr+tr td{border-top:1px solid #eaecf0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.pod b{font-weight:600}td.pod small,td.reported small{display:block;color:#667085}
td.outlier,td.added{white-space:normal;min-width:6em;max-width:16em}
tr.zone th{padding-top:.9em;border-bottom:1px solid #d0d5dd;font-weight:400}
.bar{position:relative;width:200px;height:14px;background:#eaecf0;border-radius:3px}
.fill{position:absolute;left:0;top:0;bottom:0;background:#2e6fd8;border-radius:3px}
.fill.hot{background:#d9480f}.fill.ring{background:#7a5af8}
.limit{position:absolute;top:-3px;bottom:-3px;width:2px;background:#1d232b}
.ejected td{color:#98a2b3}.ejected td.pod b{text-decoration:line-through}
td.spark{line-height:0}svg.spark{display:block;overflow:visible}
svg.spark polyline{fill:none;stroke-width:1.5}
svg.occupancy polyline{stroke:#2e6fd8}svg.rate polyline{stroke:#667085}
dl{display:grid;grid-template-columns:max-content auto;gap:.15em 1em;margin:0}dt{color:#667085}
dd{margin:0;overflow-wrap:anywhere}#knobs td{white-space:normal;overflow-wrap:anywhere}
@media (max-width:760px){
body{margin:.8em}
table.cards,table.cards tbody,table.cards tr,table.cards td,table.cards th{display:block}
table.cards thead{display:none}
table.cards tr{display:flex;flex-wrap:wrap;gap:.1em .9em;padding:.5em 0}
table.cards tr+tr td{border-top:0}table.cards tr+tr{border-top:1px solid #eaecf0}
table.cards td{padding:0;white-space:normal;overflow-wrap:anywhere}
table.cards tr.zone th{flex:1 0 100%;box-sizing:border-box;padding:.6em 0 .2em}
table.cards td[data-label]::before{content:attr(data-label) " ";color:#667085}
table.cards td.pod,table.cards td.wide,table.cards td.outlier,table.cards td.added{
flex:1 0 100%;max-width:none}
.bar{width:100%}
}
.stale main{opacity:.6}
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


def address_order(address: str) -> tuple[Any, ...]:
    """Sort key of an endpoint address: numeric by IP (IPv4, then IPv6), then names; then port.

    ``http://10.2.0.9:8080`` sorts before ``http://10.2.0.10:8080`` (text order puts it
    after). An address that does not parse sorts last, by its text.
    """
    try:
        parts = urlsplit(address if "://" in address else f"//{address}")
        host = parts.hostname or ""
        port = parts.port or 0
    except ValueError:
        return (3, address, 0, address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return (2, host, port, address)
    return (ip.version // 6, int(ip), port, address)


_HEAD = (
    "<thead><tr><th>pod</th><th>occupancy{window}</th><th></th><th>load ({signal})</th>"
    "<th>in flight</th><th>latency</th><th>reported</th><th>requests</th><th>failures</th>"
    '<th title="occupancy (blue) and requests per second (grey), as this page saw them">'
    "last {spark_min:g} min</th><th>outlier</th></tr></thead>"
)
_COLUMNS = 11


def _endpoint_row(e: EndpointState, bar: float | None, limit: float | None, scale: float) -> str:
    """One pod's row (a card on a phone): cells labelled for the narrow layout."""
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
    cls = "pod ejected" if e.ejected else "pod"
    title = ' title="ejected"' if e.ejected else ""
    ring = f"fading {e.tier}" if e.tier else "established"
    where = f"{escape(e.node) or 'no node'} · {ring}"
    requests = "" if e.requests_total is None else f' data-requests="{e.requests_total}"'
    occupancy = "" if occ is None else f' data-occupancy="{occ!r}"'
    cells = [
        f'<td class="pod"><b>{escape(e.address)}</b><small>{where}</small></td>',
        f'<td class="wide">{cell}</td>',
        f'<td class=num data-label="occupancy">{value}</td>',
        f'<td class=num data-label="load" data-load="{e.load!r}">{_num(e.load)}</td>',
        f'<td class=num data-label="in flight">{_num(e.in_flight, "d")}</td>',
        f'<td class=num data-label="latency">{latency}</td>',
        f'<td class="reported" data-label="reported" data-source="{escape(e.load_source)}">'
        f"{_reported(e)}</td>",
        f'<td class=num data-label="requests">{_num(e.requests_total, "d")}</td>',
        f'<td class=num data-label="failures">{_num(e.failures_total, "d")}</td>',
        '<td class="spark wide"></td>',
        f'<td class="outlier" data-reason="{escape(e.eject_reason)}">{_outlier(e)}</td>',
    ]
    return (
        f'<tr class="{cls}"{title} data-endpoint="{escape(e.address)}" '
        f'data-zone="{escape(e.zone)}"{occupancy}{requests}>{"".join(cells)}</tr>'
    )


def _zone_row(zone: str, pods: list[EndpointState], s: HostSnapshot) -> str:
    occ = sum(e.occupancy or 0.0 for e in pods)
    name = f"zone <b>{escape(zone)}</b>" if zone else "<b>no zone</b>"
    mine = zone and zone == s.zone.zone
    here = f" · this caller's zone, {_pct(s.zone_share)} of keys local" if mine else ""
    return (
        f'<tr class="zone{" caller" if mine else ""}" data-zone="{escape(zone)}">'
        f"<th colspan={_COLUMNS}>{name} · "
        f"{len(pods)} pod{'s' if len(pods) != 1 else ''} · occupancy {occ:.2f}{here}</th></tr>"
    )


#: What each zone controller state means, for the status page.
_ZONE_STATES = {
    "off": "off: every key global",
    "short": "short of healthy local pods: every key global",
    "ramping": "ramping up",
    "full": "full: at the cap",
    "floor": "suppressed to the probe floor",
}


def _zone_affinity(s: HostSnapshot) -> str:
    """The zone controller as the table has it: zone, state, why, x now, cap, calls."""
    z = s.zone
    if not s.tables_present or not (z.affinity or z.zone):
        return ""
    state = _ZONE_STATES.get(z.state, z.state)
    bad = z.state in ("floor", "short")
    local = s.local_call_share
    calls = s.fanout.get("calls_local", 0) + s.fanout.get("calls_remote", 0)
    rows = [
        ("caller's zone", f'<span id="zone-name">{escape(z.zone) or "unknown"}</span>'),
        ("affinity", "on" if z.affinity else "off (CSLB_ZONE_AFFINITY)"),
        (
            "state",
            f'<span id="zone-state" data-state="{escape(z.state)}"'
            f"{' class=bad' if bad else ''}>{escape(state)}</span>"
            f' (<span id="zone-reason">{escape(z.reason.replace("_", " "))}</span>)',
        ),
        ("keys local now", f'<span id="zone-share">{_pct(s.zone_share)}</span>'),
        ("local share cap", f'<span id="zone-cap">{_pct(z.cap)}</span>'),
        (
            "calls in the zone",
            f'<span id="zone-calls">{_pct(local)}</span> of {calls} fan-out calls'
            if local is not None
            else '<span id="zone-calls">no fan-out calls yet</span>',
        ),
        ("transitions", f'<span id="zone-transitions">{z.transitions}</span>'),
    ]
    items = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return f'<h2>Zone affinity</h2><dl id="zone-affinity">{items}</dl>'


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
    scale = bar_scale(s.endpoints, max([limit, *(s.bars or ())]) if limit is not None else None)
    window = f" over {s.window_s:g} s" if s.window_s else ""
    head = _HEAD.format(window=window, signal=escape(str(signal)), spark_min=SPARK_WINDOW_S / 60)
    shown = s.endpoints
    if len(shown) > MAX_ROWS:
        # The most loaded: the page stays small at any table size and still shows the
        # pods an operator opens it for.
        shown = tuple(
            sorted(shown, key=lambda e: (-(e.load or 0.0), -(e.occupancy or 0.0)))[:MAX_ROWS]
        )
    ordered = sorted(shown, key=lambda e: address_order(e.address))
    rows = []
    # With zone affinity each pod has its own bar (from its bar share of the keys).
    own = dict(zip((e.address for e in s.endpoints), s.bars or (), strict=False))

    def row(e: EndpointState) -> str:
        b = own.get(e.address, bar) if bar is not None else None
        return _endpoint_row(e, b, b if limit is not None else None, scale)

    if any(e.zone for e in ordered):
        zones: dict[str, list[EndpointState]] = {}
        for e in ordered:
            zones.setdefault(e.zone, []).append(e)
        for zone in sorted(zones, key=lambda z: (z == "", z)):  # pods without a zone last
            rows.append(_zone_row(zone, zones[zone], s))
            rows += [row(e) for e in zones[zone]]
    else:
        rows = [row(e) for e in ordered]
    note = ""
    if bar is not None and s.bars is not None:
        note = (
            f'<p class="muted" id="load-bar">Bar: full width = {scale:.3g}. Red: load over '
            f"the pod's own bounded-load bar (zone affinity: balance factor {bf:g} × its "
            f"bar share × ({inc:.3g} + total {escape(str(signal))} load), the bar shares "
            "being the expected shares averaged over the loads' window, never below the "
            "average's bar)"
            f"{' (the black mark)' if limit is not None else ''}.</p>"
        )
    elif bar is not None:
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
    return f'<table id="endpoints" class="cards">{head}<tbody>{"".join(rows)}</tbody></table>{note}'


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
        f"<thead><tr><th>ring</th><th>new endpoints</th><th>fade window</th><th></th>"
        f"<th>{what.get(mode, 'share')}</th></tr></thead>"
    )
    window = s.knobs.get("fade_duration_s", 0.0)
    rows = []
    for r in s.fading:
        added = ", ".join(escape(a) for a in r.added[:_ADDED_SHOWN]) or "–"
        if len(r.added) > _ADDED_SHOWN:
            added += f" and {len(r.added) - _ADDED_SHOWN} more"
        rows.append(
            f'<tr class="fading" data-ring="{r.ring}" data-share="{r.share!r}">'
            f'<td class=num data-label="ring">{r.ring}</td><td class="added">{added}</td>'
            f'<td class="wide"><div class="bar"><span class="fill ring" '
            f'style="width:{_pct(r.progress)}"></span></div></td>'
            # A fade past its window is complete: discovery publishes its promotion then,
            # so this shows only for the moment between (never "39.4 s of 30 s").
            f"<td class=num>{min(r.age_s, window):.1f} s of {window:g} s</td>"
            f'<td class=num data-label="share">{_pct(r.share)}</td></tr>'
        )
    return f'<table id="fading" class="cards">{head}<tbody>{"".join(rows)}</tbody></table>'


def _knobs(s: HostSnapshot) -> str:
    if not s.knobs:
        return '<p class="muted">No table: knobs unknown.</p>'
    rows = "".join(
        f'<tr><td>{escape(k)}</td><td id="knob-{escape(k)}">{escape(_knob(v))}</td></tr>'
        for k, v in s.knobs.items()
    )
    return f'<table id="knobs">{rows}</table>'


# Refreshes the page in place and draws the sparklines (see the module docstring). It
# reads the numbers the rows carry (data-occupancy, data-requests) and the host's clock
# (data-now-s), never the text, so it works whatever the page's wording.
_SCRIPT = """
(() => {
const body = document.body, every = 1000 * parseFloat(body.dataset.refreshS);
const keep = parseFloat(body.dataset.sparkS), key = 'cslb-status:' + body.dataset.ns;
let hist = {};
try { hist = JSON.parse(sessionStorage.getItem(key)) || {}; } catch (e) { hist = {}; }
function sample(main) {
  const now = parseFloat(main.dataset.nowS);
  for (const tr of main.querySelectorAll('tr.pod')) {
    const h = hist[tr.dataset.endpoint] || (hist[tr.dataset.endpoint] = {t: [], o: [], c: []});
    if (h.t.length && now <= h.t[h.t.length - 1]) continue;
    if (h.t.length && now - h.t[h.t.length - 1] > keep) { h.t = []; h.o = []; h.c = []; }
    const o = parseFloat(tr.dataset.occupancy), c = parseFloat(tr.dataset.requests);
    h.t.push(now); h.o.push(isFinite(o) ? o : null); h.c.push(isFinite(c) ? c : null);
  }
  for (const [a, h] of Object.entries(hist)) {
    while (h.t.length && h.t[0] < now - keep) { h.t.shift(); h.o.shift(); h.c.shift(); }
    if (!h.t.length) delete hist[a];
  }
  try { sessionStorage.setItem(key, JSON.stringify(hist)); } catch (e) {}
}
function line(values, cls, what) {
  const n = values.length, ok = values.filter(v => v !== null);
  if (ok.length < 2) return '';
  const top = Math.max(...ok) || 1, w = 96, h = 14;
  const pts = values.map((v, i) => v === null ? null :
    (1 + i * (w - 2) / (n - 1)).toFixed(1) + ',' + (h - 1 - v / top * (h - 2)).toFixed(1));
  const last = ok[ok.length - 1];
  return '<svg class="spark ' + cls + '" width="' + w + '" height="' + h + '" data-points="' +
    ok.length + '" role="img" aria-label="' + what + '"><title>' + what + ': ' +
    last.toPrecision(3) + ' now, ' + top.toPrecision(3) + ' at most</title><polyline points="' +
    pts.filter(p => p).join(' ') + '"/></svg>';
}
function draw(main) {
  for (const tr of main.querySelectorAll('tr.pod')) {
    const h = hist[tr.dataset.endpoint], td = tr.querySelector('td.spark');
    if (!h || !td) continue;
    const rate = h.c.map((c, i) => i === 0 || c === null || h.c[i - 1] === null ||
      c < h.c[i - 1] ? null : (c - h.c[i - 1]) / Math.max(h.t[i] - h.t[i - 1], 1e-3));
    td.innerHTML = line(h.o, 'occupancy', 'occupancy') + line(rate.slice(1), 'rate', 'requests/s');
  }
}
let main = document.getElementById('main');
sample(main); draw(main);
async function again() {
  try {
    const r = await fetch(location.href, {cache: 'no-store'});
    if (r.ok) {
      const doc = new DOMParser().parseFromString(await r.text(), 'text/html');
      const next = doc.getElementById('main');
      if (next) { main.replaceWith(next); main = next; sample(main); draw(main); }
    }
    body.classList.toggle('stale', !r.ok);
  } catch (e) { body.classList.add('stale'); }
  setTimeout(again, every);
}
setTimeout(again, every);
})();
"""
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
# Only this script runs, only same-origin fetches: a string that escaped escaping
# still could not run.
_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    f"script-src 'sha256-{_SCRIPT_HASH}'; connect-src 'self'"
)


def render(snapshot: HostSnapshot, *, refresh_s: float | None = 5.0) -> str:
    """The status page of one snapshot, as an HTML document.

    Parameters
    ----------
    snapshot
        What to show (:meth:`workers.surfaces.collector.HostMonitor.snapshot`).
    refresh_s
        Refresh the page every this many seconds, in place (a reload without scripts),
        with sparklines (``None`` or ``<= 0``: never; a static page without script).
    """
    s = snapshot
    ns = escape(s.namespace)
    live = refresh_s is not None and refresh_s > 0
    head = ""
    body = ""
    script = ""
    if live:
        head = (
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            f'<noscript><meta http-equiv="refresh" content="{refresh_s:g}"></noscript>'
        )
        body = f' data-ns="{ns}" data-refresh-s="{refresh_s!r}" data-spark-s="{SPARK_WINDOW_S}"'
        script = f"<script>{_SCRIPT}</script>"
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{head}<title>cslb · {ns}</title><style>{_CSS}</style></head><body{body}>"
        f'<main id="main" data-now-s="{s.now_ns / 1e9!r}">'
        f"<h1>cslb routing · namespace {ns}</h1>"
        f"{_summary(s)}"
        f"{_zone_affinity(s)}"
        f"<h2>Endpoints ({len(s.endpoints)})</h2>{_endpoints(s)}"
        f"<h2>Fading rings ({len(s.fading)})</h2>{_fading(s)}"
        f"<h2>Knobs</h2>{_knobs(s)}"
        f"</main>{script}</body></html>\n"
    )


def _reported(e: EndpointState) -> str:
    """The pod's own load report: utilization, age, and whether bounded load uses it."""
    if e.reported_age_s is None:
        return '<span class="muted">–</span>'
    util = "–" if e.reported_utilization is None else f"{e.reported_utilization:.2f}"
    used = " · used" if e.load_source == "reported" else ""
    title = "balanced on it" if used else "this host's view is used"
    return f'<span title="{title}">{util}</span><small>{e.reported_age_s:.0f} s ago{used}</small>'
