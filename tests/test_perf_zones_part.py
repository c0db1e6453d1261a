"""The ``zones`` part of ``python -m perf`` in quick mode: every size and plan measured on
real shared memory (nothing left behind), its section and issue 21's three cost targets
on the results page. Asserts what the figures are, never how large."""

from __future__ import annotations

import math
import os
import re

from perf import bench_zones, results


def test_the_zones_part_measures_every_plan_and_states_its_targets(tmp_path):
    got = bench_zones.run(quick=True, log=lambda s: None)
    mine = re.compile(rf"cslb\.perfz[zp]{os.getpid()}[0-9a-f]{{6}}\.")
    assert not [s for s in os.listdir("/dev/shm") if mine.match(s)]

    rows = got["rows"]
    assert {(r["endpoints"], r["op"]) for r in rows} == {
        (n, op) for n in bench_zones.SIZES for op in bench_zones.OPS
    }
    for r in rows:
        assert r["zone_ms"] > 0 and r["plain_ms"] > 0
        assert math.isclose(r["ratio"], r["zone_ms"] / r["plain_ms"])
    for r in (r for r in rows if r["op"] == "refresh, reports"):
        off = next(o for o in rows if o["endpoints"] == r["endpoints"] and o["op"] == "refresh")
        assert math.isclose(r["reports_ratio"], r["zone_ms"] / off["zone_ms"])
    for r in (r for r in rows if r["op"] == "first"):
        assert 0 <= r["prepared_tables"] <= r["tables"]

    part = {**got, "format": results.FORMAT, "quick": True, "date": "now", "seconds": 1.0}
    part["machine"] = {"cpu": "x", "cores": 2, "memory_bytes": 2**30, "os": "linux",
                       "python": "3.11", "versions": {}, "loadavg": (0.0, 0.0, 0.0)}  # fmt: skip
    page = results.render({"zones": part}, "python -m perf --quick", [])
    assert "## Zone affinity's cost to a worker's plans" in page
    assert "| 20,000 | refresh, reports |" in page
    zone_targets = [t for t, _ in results.targets({"zones": part}) if t.part == "zones"]
    assert len(zone_targets) == 3
    assert all(t.status in ("met", "MISSED") for t in zone_targets)
    refresh, first, reports = zone_targets
    assert [c[0] for c in refresh.checks] == ["1,000 endpoints", "20,000 endpoints"]
    assert len(first.checks) == len(reports.checks) == len(bench_zones.SIZES)
