"""PNG charts of scenario results (needs matplotlib: ``pip install 'cslb[sim]'``)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from perf.sim.scenarios import ScenarioResult, slow_pod_share

__all__ = ["PlotUnavailableError", "plot", "pyplot"]

_COLORS = {"off": "#d62728", "skipper": "#ff7f0e", "n-ring": "#2ca02c"}
_NAMES = {"off": "no fade-in", "skipper": "Skipper fade-in", "n-ring": "N-ring fade-in"}


class PlotUnavailableError(RuntimeError):
    """``--plot`` was asked for but matplotlib is not installed."""


def pyplot() -> Any:
    """Return matplotlib's ``pyplot`` on the Agg backend, or :class:`PlotUnavailableError`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailableError(
            "--plot needs matplotlib, which is not installed; "
            "install the extra with: pip install 'cslb[sim]'"
        ) from None
    return plt


def plot(result: ScenarioResult, directory: str | pathlib.Path) -> list[pathlib.Path]:
    """Write the scenario's chart(s) into ``directory``; return the paths written."""
    plt = pyplot()
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if result.name == "scale-up":
        fig = _scale_up(plt, result)
    elif result.name == "load-signal":
        fig = _load_signal(plt, result)
    elif result.name == "slow-pod":
        fig = _slow_pod(plt, result)
    else:
        raise ValueError(f"no chart for scenario {result.name!r}")
    path = out / f"sim-{result.name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _scale_up(plt: Any, result: ScenarioResult) -> Any:
    fig, axes = plt.subplots(3, 1, figsize=(9, 8.5), sharex=True)
    for r in result.runs:
        s = r.series
        kw = {"color": _COLORS.get(r.label), "label": _NAMES.get(r.label, r.label), "lw": 1.6}
        axes[0].plot(s["t"], 100 * s["hit_rate"], **kw)
        axes[1].plot(s["t"], s["db_reads_per_s"], **kw)
        axes[2].plot(s["t"], 100 * s["new_pod_share"], **kw)
    cfg = result.runs[0].config
    ev = cfg.events[-1]
    for ax in axes:
        ax.axvspan(ev.at_s, ev.at_s + ev.ready_spread_s, color="0.9", zorder=0)
        ax.grid(alpha=0.3)
    # When each routing table took the new pods in: cslb's discovery debounces
    # (trailing), so a rollout whose pods are ready less than debounce_s apart is one
    # event published after the last of them; Skipper detects pods at its polls and
    # starts fading each one then, earlier.
    marks = []
    for r in result.runs:
        if not r.published:
            continue
        first, last = r.published[0][0], r.published[-1][0]
        color = _COLORS.get(r.label)
        for ax in axes:
            for x in {first, last}:
                ax.axvline(x, color=color, ls=":", lw=1.2)
        name = _NAMES.get(r.label, r.label)
        if len(r.published) == 1:
            text = f"{name}: one event published at {first:g} s ({cfg.debounce_s:g}-s debounce)"
        else:
            text = f"{name}: pods detected at {cfg.skipper_poll_s:g}-s polls, {first:g}-{last:g} s"
        marks.append(plt.Line2D([], [], color=color, ls=":", lw=1.2, label=text))
    if marks:
        axes[2].legend(handles=marks, loc="lower right", fontsize=8)
    axes[0].set_ylabel("cache hit rate %")
    axes[1].set_ylabel("DB reads / s")
    axes[2].set_ylabel("traffic to new pods %")
    axes[2].set_xlabel(
        "seconds (grey: new pods becoming ready; dotted: routing tables take them in)"
    )
    axes[0].legend(loc="lower right")
    axes[0].set_title(
        f"Scale-up {cfg.pods} → {cfg.pods + ev.count} pods, "
        f"{cfg.total_rate:,.0f} calls/s, fade {cfg.fade_s:g} s (E={cfg.fade_exponent:g})"
    )
    fig.tight_layout()
    return fig


def _load_signal(plt: Any, result: ScenarioResult) -> Any:
    rows = result.summary["by_variant"]
    at_needed = any("at_pods_needed" in row for row in rows.values())
    fig, axes = plt.subplots(1, 2 if at_needed else 1, figsize=(11 if at_needed else 6.5, 4.5))
    axes = list(np.atleast_1d(axes))
    for r in result.runs:
        occ = r.pod_busy_s[r.members].sum(axis=1) / r.config.seconds
        occ = np.sort(occ / occ.mean())[::-1]
        axes[0].plot(np.linspace(0, 100, occ.size), occ, label=r.label, lw=1.6)
    cfg = result.runs[0].config
    if at_needed:
        for label, row in rows.items():
            at = row.get("at_pods_needed")
            if at is None:
                axes[1].plot([], [], label=f"{label}: no pod count met the bound")
                continue
            q = at["over_mean"]
            axes[1].plot(
                [0, 5, 50, 95, 100],
                [q["max"], q["p95"], q["p50"], q["p5"], q["min"]],
                marker="o",
                label=f"{label}: {at['pods']} pods",
                lw=1.4,
            )
        axes[1].set_title(
            f"at the pods each needs for p99 <= {result.summary['slo_p99_ms']:g} ms "
            "(max, p95, p50, p5, min)",
            fontsize=10,
        )
    axes[0].set_title(f"{cfg.pods} pods each, {cfg.seconds:g}-s run", fontsize=10)
    for ax in axes:
        ax.set_xlabel("% of pods, busiest first")
        ax.set_ylabel("occupancy / fleet mean (busy-s per s)")
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _slow_pod(plt: Any, result: ScenarioResult) -> Any:
    fig, axes = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    pod = result.summary["pod"]
    for r in result.runs:
        share = r.extra.get("slow_pod_share")
        if share is None:
            share = slow_pod_share(r, pod)
        axes[0].plot(r.series["t"], 100 * share, label=r.label, lw=1.6)
        axes[1].plot(r.series["t"], r.series["lat_p99_ms"], label=r.label, lw=1.4)
    ev = result.runs[0].config.events[0]
    for ax in axes:
        ax.axvspan(ev.at_s, ev.until_s, color="0.9", zorder=0)
        ax.grid(alpha=0.3)
    axes[0].axhline(100 / result.runs[0].config.pods, color="0.5", ls="--", lw=1)
    axes[0].set_ylabel(f"pod {pod}'s share of calls %")
    axes[1].set_ylabel("call latency p99 ms")
    axes[1].set_yscale("log")  # an unbounded slow pod queues for seconds, the rest ms
    axes[1].set_xlabel(f"seconds (grey: pod {pod} is {ev.factor:g}x slower)")
    axes[0].legend()
    fig.tight_layout()
    return fig
