"""The zones scenario's tables and charts (:mod:`perf.sim.zones`, :mod:`perf.sim.zone_ramp`)."""

from __future__ import annotations

import math
import pathlib
from typing import Any

from perf.sim.plot import pyplot
from perf.sim.zones import ZonesConfig

__all__ = ["COLUMNS", "controller_text", "plot", "plot_ramp", "ramp_text", "to_text"]

#: (heading, key, format) of the sweep's table; ``by_zone`` is the caller zones' cross share.
COLUMNS = (
    ("cross-zone", "cross_share", "{:.1%}"),
    ("by zone", "by_zone", None),
    ("hit rate", "hit_rate", "{:.1%}"),
    ("DB reads/s", "db_reads_per_s", "{:,.0f}"),
    ("mean ms", "lat_mean_ms", "{:.2f}"),
    ("p99 ms", "lat_p99_ms", "{:.1f}"),
    ("hot set/zone", "hot_set", "{:,.0f}"),
    ("cached", "cached_distinct", "{:,.0f}"),
    ("zones/key", "zones_per_cached_key", "{:.2f}"),
)


def _cell(row: dict[str, Any], key: str, fmt: str | None) -> str:
    if key == "by_zone":
        return "/".join(f"{100 * z['cross_share']:.0f}" for z in row["by_zone"].values()) + "%"
    v = row[key]
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def to_text(rows: list[dict[str, Any]], base: ZonesConfig) -> str:
    """One table per fleet: a row per strategy (and ``x``), the columns of :data:`COLUMNS`."""
    out = ["cslb simulate --scenario zones"]
    label_w = max(len(r["label"]) for r in rows)
    for spread in dict.fromkeys(r["spread"] for r in rows):
        mine = [r for r in rows if r["spread"] == spread]
        cells = [[_cell(r, k, f) for _, k, f in COLUMNS] for r in mine]
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(COLUMNS)]
        out += ["", f"pods per zone {spread}"]
        out.append(
            "".ljust(label_w)
            + "  "
            + "  ".join(h.rjust(w) for (h, _, _), w in zip(COLUMNS, widths, strict=True))
        )
        for r, c in zip(mine, cells, strict=True):
            out.append(
                r["label"].ljust(label_w)
                + "  "
                + "  ".join(x.rjust(w) for x, w in zip(c, widths, strict=True))
            )
    callers = "/".join(f"{c:g}" for c in base.callers)
    out += [
        "",
        f"* callers per zone {callers}; {base.rate_per_pod:g} calls/s per pod, Zipf "
        f"{base.zipf:g} over {base.catalogue:,} products, LRU cache of {base.cache_size:,} "
        f"per pod; hit {base.hit_s * 1e3:g} ms, miss {base.miss_s * 1e3:g} ms (a DB read), "
        f"x queue; trip {base.local_rtt_s * 1e3:g} ms local, {base.cross_rtt_s * 1e3:g} ms "
        "cross-zone",
        "* bounded load "
        + (
            "off"
            if base.balance_factor is None
            else f"{base.balance_factor:g} on each zone's occupancy view"
        )
        + f"; min pods {base.min_pods} (hard filter, cslb); x capped by lbcore.zones.zone_cap",
        "* by zone: cross-zone share of each caller zone's calls; hot set: distinct products "
        f"a zone's pods were asked for in the last {base.hot_window_s:g} s (mean over "
        "zones); cached: distinct products in any cache at the end; zones/key: zones "
        "whose caches hold a cached product, on average",
        f"* {base.seconds:g} s after a {base.warmup_s:g}-s warm-up, seed {base.seed}",
    ]
    return "\n".join(out)


def ramp_text(study: dict[str, Any]) -> str:
    """The ramp study's table: one row per ramp length and curve."""
    cols = (
        ("ramp s", "ramp_s", "{:g}"),
        ("curve E", "exponent", "{:g}"),
        ("reads/s before", "reads_before", "{:,.0f}"),
        ("peak", "reads_peak", "{:,.0f}"),
        ("after", "reads_after", "{:,.0f}"),
        ("peak/after", "peak_over_after", "{:.2f}"),
        ("5-s peak/after", "peak_5s_over_after", "{:.2f}"),
        ("reads above after", "excess_reads", "{:,.0f}"),
        ("lowest hit 1 s", "hit_rate_min", "{:.1%}"),
    )
    out = ["  ".join(h for h, _, _ in cols)]
    for r in study["rows"]:
        out.append("  ".join(f.format(r[k]).rjust(len(h)) for h, k, f in cols))
    if study["skipped"]:
        out.append(
            "* left out (the run ends before they settle): "
            + ", ".join(f"{r:g} s" for r in study["skipped"])
        )
    return "\n".join(out)


def controller_text(studies: list[tuple[str, dict[str, Any]]]) -> str:
    """The controller study's transitions, one block per case (:mod:`perf.sim.zone_control`)."""
    out = ["cslb simulate --scenario zone-controller"]
    for name, study in studies:
        zone, factor, start, end = study["slow"]
        out += ["", f"{name}: z-{chr(ord('a') + zone)}'s service times x{factor:g} "
                f"from {start:g} s to {end:g} s"]  # fmt: skip
        out.append("     t s  zone  state     reason        x      local ms  remote ms  calls")
        for t in study["transitions"]:
            out.append(
                f"{t['t_s']:8.1f}  {t['zone']:4s}  {t['state']:8s}  {t['reason']:12s}"
                f"{t['x']:6.3f}  {t['local_ms']:8.2f}  {t['remote_ms']:9.2f}  "
                f"{t['local_calls']:,.0f}/{t['remote_calls']:,.0f}"
            )
        floors = ", ".join(f"{z} {n}" for z, n in study["floors"].items())
        peak = ", ".join(
            f"{z} {'n/a' if math.isnan(e) else f'{e:+.0%}'}"
            for z, e in study["recovery_excess"].items()
        )
        out.append(f"* floors: {floors}; highest excess while ramping after a recovery: {peak}")
    s = studies[0][1].get("settings") if studies else None
    if s is not None:
        out += [
            "",
            f"* defaults: ramp {s.ramp_ns / 1e9:g} s, probe floor {s.probe_floor:g}, margin "
            f"{s.latency_margin:g}, hold {s.hold_ns / 1e9:g} s, min pods {s.min_pods}; "
            "controllers step every second on the calls of the last 10 s; excess: local "
            "latency over remote, minus 1; caps held at 1 - probe floor",
        ]
    return "\n".join(out)


_STYLE = {
    "no zones": {"color": "0.45"},
    "hard filter": {"color": "#d62728"},
    "request split": {"color": "#ff7f0e", "marker": "o"},
    "cslb": {"color": "#2ca02c", "marker": "s"},
}


def plot(rows: list[dict[str, Any]], directory: str | pathlib.Path) -> pathlib.Path:
    """``sim-zones.png``: the trade-off (hit rate against cross-zone share) and copies.

    Left: each strategy's (cross-zone share, hit rate), the split strategies as a line
    through their ``x`` values (``x`` written beside cslb's points); right: zones
    caching a product against ``x``. Solid: the first fleet, dashed: the second.
    """
    plt = pyplot()
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    fig, (trade, copies) = plt.subplots(1, 2, figsize=(12, 4.6))
    spreads = list(dict.fromkeys(r["spread"] for r in rows))
    dashes = dict(zip(spreads, ("-", "--", ":", "-."), strict=False))
    for spread in spreads:
        mine = [r for r in rows if r["spread"] == spread]
        for name, style in _STYLE.items():
            pts = [r for r in mine if r["strategy"] == name]
            if not pts:
                continue
            label = f"{name}, {spread}"
            xs = [100 * r["cross_share"] for r in pts]
            ys = [100 * r["hit_rate"] for r in pts]
            if pts[0]["share"] is None:  # no x: one point, and a level on the right
                trade.plot(xs, ys, ls="none", marker="D", ms=7, mfc="none" if
                           dashes[spread] != "-" else style["color"], label=label,
                           color=style["color"])  # fmt: skip
                copies.axhline(pts[0]["zones_per_cached_key"], ls=dashes[spread], lw=1.2,
                               color=style["color"], label=label)  # fmt: skip
                continue
            trade.plot(xs, ys, ls=dashes[spread], lw=1.6, ms=4, label=label, **style)
            if name == "cslb":
                for r, x, y in zip(pts, xs, ys, strict=True):
                    trade.annotate(f"{r['share']:g}", (x, y), textcoords="offset points",
                                   xytext=(4, 4), fontsize=7, color=style["color"])  # fmt: skip
            copies.plot([r["share"] for r in pts], [r["zones_per_cached_key"] for r in pts],
                        ls=dashes[spread], lw=1.6, ms=4, label=label, **style)  # fmt: skip
    trade.set_xlabel("cross-zone calls %")
    trade.set_ylabel("cache hit rate %")
    trade.set_title("the trade-off (up and left is better; x beside cslb's points)", fontsize=10)
    copies.set_xlabel("x (wanted local share: of keys for cslb, of requests for the split)")
    copies.set_ylabel("zones whose caches hold a cached product")
    copies.set_title("cache footprint", fontsize=10)
    for ax in (trade, copies):
        ax.grid(alpha=0.3)
    trade.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        "3 zones, even callers; pods per zone " + " (solid), ".join(spreads) + " (dashed)",
        fontsize=10,
    )
    fig.tight_layout()
    path = out / "sim-zones.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_ramp(study: dict[str, Any], directory: str | pathlib.Path) -> pathlib.Path | None:
    """``sim-zone-ramp.png``: database reads per second through each ramp (None: no ramp)."""
    if not study["rows"]:
        return None
    plt = pyplot()
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    curves = sorted({r["exponent"] for r in study["rows"]})
    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4), sharey=True)
    axes = [axes] if len(curves) == 1 else list(axes)
    for ax, e in zip(axes, curves, strict=True):
        for r in (r for r in study["rows"] if r["exponent"] == e):
            ax.plot(r["series"]["t"], r["series"]["db_reads"], lw=1.2, label=f"{r['ramp_s']:g} s")
        ax.set_title(f"ramp curve exponent {e:g}", fontsize=10)
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="ramp")
    axes[0].set_ylabel("DB reads / s")
    fig.tight_layout()
    path = out / "sim-zone-ramp.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
