"""``cslb simulate``: options, errors, JSON and charts."""

import json
import pathlib
import subprocess
import sys

import pytest

from perf.sim import cli

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAST = ["--pods", "6", "--seconds", "4", "--catalogue", "20000", "--cache-size", "300"]


def cslb(*args):
    return subprocess.run(
        [sys.executable, "-m", "cslb", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_simulate_is_registered_and_prints_a_table():
    p = cslb("--scenario", "slow-pod", *FAST, "--signal", "effective", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "no bounded load" in p.stdout and "effective bf 1.25" in p.stdout
    assert "slow pod's share while slow" in p.stdout


def test_json_output_carries_summary_and_series(capsys):
    rc = cli.main(["--scenario", "scale-up", *FAST, "--add", "3", "--fade-s", "2", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scenario"] == "scale-up"
    assert set(doc["summary"]["by_mode"]) == {"off", "skipper", "n-ring"}
    run = doc["runs"][0]
    assert len(run["series"]["hit_rate"]) == 4 and run["config"]["fade_s"] == 2.0
    assert run["totals"]["routed"] >= run["totals"]["calls"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "load-signal", "--signal", "in-flight"], "--signal has no effect"),
        (["--scenario", "slow-pod", "--add", "3"], "--add has no effect on --scenario slow-pod"),
        (["--scenario", "scale-up", "--pods", "0"], "--pods must be > 0"),
        (["--scenario", "scale-up", "--balance-factor", "0.5"], "--balance-factor must be >= 1"),
        (["--scenario", "scale-up", "--zipf", "-1"], "zipf must be >= 0"),
    ],
)
def test_bad_options_are_named(args, message, capsys):
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    rc = cli.main(["--scenario", "slow-pod", *FAST, "--plot", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and "pip install 'cslb[sim]'" in err
    assert not list(tmp_path.iterdir())


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    rc = cli.main(["--scenario", "slow-pod", *FAST, "--plot", str(tmp_path)])
    assert rc == 0
    png = tmp_path / "sim-slow-pod.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
