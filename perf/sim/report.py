"""Text and JSON reports of scenario results."""

from __future__ import annotations

import json
import math
from typing import Any

from perf.sim.model import to_jsonable
from perf.sim.scenarios import ScenarioResult

__all__ = ["to_json", "to_text"]

# (row label, key in the summary row, format)
_SCALE_UP_ROWS = [
    ("hit rate before", "hit_rate_before", "pct"),
    ("hit rate, lowest 1 s", "hit_rate_min_1s", "pct"),
    ("hit rate, lowest 5 s", "hit_rate_min_5s", "pct"),
    ("hit rate, last 5 s", "hit_rate_end", "pct"),
    ("DB reads/s before", "db_reads_per_s_before", "int"),
    ("DB reads/s, peak 1 s", "db_reads_per_s_peak_1s", "int"),
    ("DB reads in the window", "db_reads_after_event", "int"),
    ("traffic to new pods at end", "new_pod_share_end", "pct"),
    ("new pods published at s (first)", "first_publish_s", "f1"),
    ("new pods published at s (last)", "last_publish_s", "f1"),
    ("keys remapped (ring, catalogue)", "keys_remapped_static", "pct"),
    ("keys moved (observed)", "keys_moved", "int"),
    ("moves per moved key", "moves_per_moved_key", "f2"),
    ("new pods' DB reads", "new_pod_fetches", "int"),
    ("  of keys they won't own", "new_pod_foreign_fetch_share", "pct"),
    ("new pods' cache owned at fade end", "new_pod_cached_owned_share", "pct"),
    ("call latency p99 ms", "lat_p99_ms", "f1"),
    ("batch latency p99 ms", "batch_p99_ms", "f1"),
    ("wall time s", "wall_s", "f1"),
]

_LOAD_SIGNAL_ROWS = [
    ("pods", "pods", "int"),
    ("occupancy mean (busy-s/s)", "occupancy_mean", "f2"),
    ("occupancy min / mean", ("over_mean", "min"), "f2"),
    ("occupancy p5 / mean", ("over_mean", "p5"), "f2"),
    ("occupancy p50 / mean", ("over_mean", "p50"), "f2"),
    ("occupancy p95 / mean", ("over_mean", "p95"), "f2"),
    ("occupancy max / mean", ("over_mean", "max"), "f2"),
    ("p5-p95 width / mean", ("over_mean", "p5_p95_width"), "f2"),
    ("occupancy p5 / p95 (busy-s/s)", [("over_mean", "abs_p5"), ("over_mean", "abs_p95")], "pair"),
    ("a host's load per pod", "host_load_per_pod", "f3"),
    ("a host's bar, / mean", ["host_bar", "host_bar_over_mean"], "pair3"),
    ("hit rate", "hit_rate", "pct"),
    ("DB reads/s", "db_reads_per_s", "int"),
    ("key moves/s", "moves_per_s", "int"),
    ("call latency p50 ms", "lat_p50_ms", "f1"),
    ("call latency p99 ms", "lat_p99_ms", "f1"),
    ("batch latency p99 ms", "batch_p99_ms", "f1"),
    ("pods needed for the p99 bound", ("pods_needed", "pods"), "int"),
    ("at pods needed: occupancy mean", ("at_pods_needed", "over_mean", "mean"), "f2"),
    ("  p5 / mean", ("at_pods_needed", "over_mean", "p5"), "f2"),
    ("  p95 / mean", ("at_pods_needed", "over_mean", "p95"), "f2"),
    ("  max / mean", ("at_pods_needed", "over_mean", "max"), "f2"),
    ("  p5-p95 width / mean", ("at_pods_needed", "over_mean", "p5_p95_width"), "f2"),
    (
        "  p5 / p95 (busy-s/s)",
        [("at_pods_needed", "over_mean", "abs_p5"), ("at_pods_needed", "over_mean", "abs_p95")],
        "pair",
    ),
    ("  a host's bar / mean", ("at_pods_needed", "host_bar_over_mean"), "f2"),
    ("  hit rate", ("at_pods_needed", "hit_rate"), "pct"),
    ("  call latency p99 ms", ("at_pods_needed", "lat_p99_ms"), "f1"),
]

_SLOW_POD_ROWS = [
    ("fair share", "fair_share", "pct"),
    ("slow pod's share before", "share_before", "pct"),
    ("slow pod's share while slow", "share_slow", "pct"),
    ("slow pod's share after", "share_after", "pct"),
    ("p99 ms before", "lat_p99_ms_before", "f1"),
    ("p99 ms while slow", "lat_p99_ms_slow", "f1"),
    ("p99 ms after", "lat_p99_ms_after", "f1"),
    ("batch latency p99 ms (run)", "batch_p99_ms", "f1"),
    ("hit rate (run)", "hit_rate", "pct"),
]


def _fmt(v: Any, kind: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "n/a"
    if kind in ("pair", "pair3"):
        a, b = v
        return f"{_fmt(a, 'f3' if kind == 'pair3' else 'f2')} / {_fmt(b, 'f2')}"
    if kind == "pct":
        return f"{100 * v:.1f}%"
    if kind == "int":
        return f"{v:,.0f}"
    if kind == "f1":
        return f"{v:.1f}"
    if kind == "f3":
        return f"{v:.3f}"
    return f"{v:.2f}"


def _get(row: dict[str, Any], key: Any) -> Any:
    if isinstance(key, list):  # two values shown as "a / b"
        values = [_get(row, k) for k in key]
        return None if any(v is None for v in values) else values
    value: Any = row
    for k in (key,) if isinstance(key, str) else key:
        if not isinstance(value, dict):
            return None
        value = value.get(k)
    return value


def _table(cols: dict[str, dict[str, Any]], rows: list[tuple[str, Any, str]]) -> str:
    names = list(cols)
    label_w = max(len(r[0]) for r in rows)
    # rows nobody has (for example "pods needed" when the search was skipped) are left out
    rows = [r for r in rows if any(_get(cols[n], r[1]) is not None for n in names)]
    cells = [[_fmt(_get(cols[n], key), kind) for n in names] for _, key, kind in rows]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    out = [" " * label_w + "  " + "  ".join(n.rjust(w) for n, w in zip(names, widths, strict=True))]
    for (label, _, _), line in zip(rows, cells, strict=True):
        out.append(
            label.ljust(label_w)
            + "  "
            + "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True))
        )
    return "\n".join(out)


def to_text(result: ScenarioResult) -> str:
    """A human summary: the comparison table, notes and wall time."""
    s = result.summary
    if result.name == "scale-up":
        table = _table(s["by_mode"], _SCALE_UP_ROWS)
    elif result.name == "load-signal":
        table = _table(s["by_variant"], _LOAD_SIGNAL_ROWS)
    else:
        table = _table(s["by_variant"], _SLOW_POD_ROWS)
    lines = [f"cslb simulate --scenario {result.name}", "", table, ""]
    lines += [f"* {n}" for n in result.notes]
    cfg = result.runs[0].config
    lines.append(
        f"* model: catalogue {cfg.catalogue:,} (Zipf {cfg.zipf:g}), cache {cfg.cache_size:,} "
        f"per pod, hit {cfg.hit_s * 1e3:g} ms / miss {cfg.miss_s * 1e3:g} ms, "
        f"concurrency {cfg.concurrency}, tick {cfg.tick_s * 1e3:g} ms, seed {cfg.seed}"
        + (f", pod speeds lognormal sigma {cfg.pod_speed_sigma:g}" if cfg.pod_speed_sigma else "")
    )
    lines.append(f"* wall time {result.wall_s:.1f} s for {len(result.runs)} run(s)")
    lines += [f"! warning: {w}" for w in result.warnings]
    return "\n".join(lines)


def to_json(result: ScenarioResult) -> str:
    """The whole result (summary, notes, every run's totals and series) as JSON."""
    return json.dumps(to_jsonable(result.to_dict()), indent=1, allow_nan=False)
