"""``cslb simulate --scenario zones`` and ``zone-ramp``: bounded by --seconds, the table's
rows and columns, JSON, charts and the options they refuse."""

import json
import subprocess
import sys
import time

import pytest

from cslb.simulate_cmd import main
from perf.sim.zones_report import COLUMNS

FAST = ["--seconds", "3", "--catalogue", "20000", "--cache-size", "300", "--no-progress"]


def test_the_table_has_a_row_per_strategy_and_x_and_the_columns():
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "cslb", "simulate", "--scenario", "zones", *FAST],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.count("pods per zone 2/5/5") == out.count("pods per zone 4/4/4") == 1
    header = next(line for line in out.splitlines() if "cross-zone" in line)
    for heading, _, _ in COLUMNS:
        assert heading in header
    for spread in ("2/5/5", "4/4/4"):
        block = out.split(f"pods per zone {spread}")[1].split("pods per zone")[0]
        rows = [line.split("  ")[0].strip() for line in block.splitlines()[2:] if line.strip()]
        rows = [r for r in rows if r and not r.startswith("*")]
        expected = ["no zones", "hard filter"]
        expected += [
            f"{s} x={x:g}" for s in ("request split", "cslb") for x in (0, 0.25, 0.5, 0.75, 1)
        ]
        assert rows == expected
    assert "* 3 s after a 3-s warm-up" in out  # the warm-up is bounded by --seconds too
    assert time.monotonic() - t0 < 300


def test_json_has_figures_and_one_second_series_as_long_as_the_run(capsys):
    assert main(["--scenario", "zones", *FAST, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(len(r["series"]["db_reads"]) == 3 for r in rows)
    assert {r["spread"] for r in rows} == {"2/5/5", "4/4/4"}


def test_plot_writes_the_chart(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["--scenario", "zones", *FAST, "--plot", str(tmp_path)]) == 0
    assert (tmp_path / "sim-zones.png").stat().st_size > 10_000


def test_zone_ramp_leaves_out_ramps_the_run_cannot_hold(capsys):
    assert main(["--scenario", "zone-ramp", *FAST[:-1], "--seconds", "50"]) == 0
    out = capsys.readouterr().out
    assert "reads/s before" in out and "peak/after" in out
    assert "left out (the run ends before they settle): 30 s, 60 s, 120 s" in out


@pytest.mark.parametrize("scenario", ["zones", "zone-ramp"])
def test_options_of_the_cache_scenarios_are_refused(scenario, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--scenario", scenario, "--pods", "6"])
    assert exc.value.code == 2
    assert f"--pods has no effect on --scenario {scenario}" in capsys.readouterr().err
