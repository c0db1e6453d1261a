"""``cslb simulate``: options, errors, JSON and charts."""

import json
import pathlib
import sys

import pytest

from cslb import simulate_cmd as cli
from perf.sim.options import config
from tests.cslb_runs import run_cslb

FAST = ["--pods", "6", "--seconds", "4", "--catalogue", "20000", "--cache-size", "300"]


def _config(args):
    return config(args.scenario, cli.options(args))


def cslb(*args):
    return run_cslb("simulate", *args, timeout=120)


def test_simulate_is_registered_and_prints_a_table():
    p = cslb("--scenario", "slow-pod", *FAST, "--signal", "effective", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "no bounded load" in p.stdout and "effective bf 1.25" in p.stdout
    assert "slow pod's share while slow" in p.stdout
    # 4 s cannot show the pod recovering: said, not hidden
    assert "! warning: the run ends at 4 s, before the 'slow' phase" in p.stdout
    assert "the 'after' phase's figures are empty" in p.stdout


def test_json_output_carries_summary_series_and_warnings(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    args = ["--scenario", "scale-up", *FAST, "--add", "3", "--fade-s", "2", "--json"]
    rc = cli.main([*args, "--plot", str(tmp_path / "charts")])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scenario"] == "scale-up"
    assert set(doc["summary"]["by_mode"]) == {"off", "skipper", "n-ring"}
    run = doc["runs"][0]
    assert len(run["series"]["hit_rate"]) == 4 and run["config"]["fade_s"] == 2.0
    assert run["totals"]["routed"] >= run["totals"]["calls"] > 0
    # ready at 10 s + 20 s spread: the run ends long before the fade does
    assert any("before the last fade-in ends" in w for w in doc["warnings"])
    assert (tmp_path / "charts" / "sim-scale-up.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "load-signal", "--signal", "in-flight"], "--signal has no effect"),
        (["--scenario", "slow-pod", "--add", "3"], "--add has no effect on --scenario slow-pod"),
        (
            ["--scenario", "scale-up", "--in-flight-balance-factor", "1.2"],
            "--in-flight-balance-factor has no effect on --scenario scale-up",
        ),
        (["--scenario", "scale-up", "--pods", "0"], "argument --pods: expected an integer >= 1"),
        (
            ["--scenario", "scale-up", "--balance-factor", "0.5"],
            "argument --balance-factor: balance factor must be a finite number >= 1",
        ),
        (
            ["--scenario", "load-signal", "--in-flight-balance-factor", "nan"],
            "argument --in-flight-balance-factor: balance factor must be a finite number",
        ),
        (["--scenario", "scale-up", "--zipf", "-1"], "argument --zipf: expected a finite number"),
        (["--scenario", "scale-up", "--seconds", "inf"], "argument --seconds: expected a finite"),
        (["--scenario", "scale-up", "--seconds", "0.001"], "argument --seconds: expected a"),
        (["--scenario", "scale-up", "--fade-s", "inf"], "argument --fade-s: expected a finite"),
        (["--scenario", "scale-up", "--rate", "inf"], "argument --rate: expected a finite"),
        (["--scenario", "scale-up", "--seed", "-1"], "argument --seed: expected an integer >= 0"),
        (["--scenario", "load-signal", "--slo-ms", "0"], "argument --slo-ms: expected a finite"),
        (["--scenario", "scale-up", "--clients", "65"], "expected an integer from 1 to 64"),
        (
            ["--scenario", "load-signal", "--pod-speed-sigma", "-0.2"],
            "argument --pod-speed-sigma: expected a finite number >= 0",
        ),
        (["--scenario", "scale-up", "--catalogue", "50"], "batches carry up to 100 distinct"),
        (
            ["--scenario", "scale-up", "--signal", "in-flight"],
            "--signal has no effect on --scenario scale-up without --balance-factor",
        ),
    ],
)
def test_bad_options_are_named(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_run_too_big_for_memory_is_refused_before_it_starts(capsys):
    assert cli.main(["--scenario", "scale-up", "--seconds", "1e9"]) == 2
    err = capsys.readouterr().err
    assert "GiB of arrays" in err and "fewer seconds" in err


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_plot_dir_is_checked_before_the_run(kind, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    if kind == "file":
        target = tmp_path / "a-file"
        target.write_text("x")
        message = "exists and is not a directory"
    else:
        target = pathlib.Path("/proc/cslb-sim-test")  # cannot be created, even by root
        message = "cannot create the directory"
    with pytest.raises(SystemExit):
        cli.main(["--scenario", "slow-pod", *FAST, "--plot", str(target)])
    captured = capsys.readouterr()
    assert f"--plot {target}: {message}" in captured.err
    assert captured.out == ""  # nothing ran


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


def test_pod_speed_sigma_reaches_the_run_and_is_reported():
    args = cli.build_parser().parse_args(["--scenario", "load-signal", "--pod-speed-sigma", "0"])
    assert _config(args).pod_speed_sigma == 0.0
    default = cli.build_parser().parse_args(["--scenario", "load-signal"])
    assert _config(default).pod_speed_sigma == 0.2
    other = cli.build_parser().parse_args(["--scenario", "scale-up"])
    assert _config(other).pod_speed_sigma == 0.0
    p = cslb("--scenario", "slow-pod", *FAST, "--pod-speed-sigma", "0.3", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "pod speeds lognormal sigma 0.3" in p.stdout


def test_load_signal_defaults_and_bar_increment_option():
    parse = cli.build_parser().parse_args
    cfg = _config(parse(["--scenario", "load-signal"]))
    assert (cfg.pods, cfg.clients, cfg.seconds, cfg.bar_increment) == (100, 32, 30.0, "routed-call")
    assert cfg.total_rate == 35_000
    cfg = _config(parse(["--scenario", "load-signal", "--bar-increment", "skipper"]))
    assert cfg.bar_increment == "skipper"
    for scenario in ("scale-up", "slow-pod"):
        cfg = _config(parse(["--scenario", scenario]))
        assert (cfg.clients, cfg.bar_increment) == (8, "routed-call")  # as production routes
        cfg = _config(parse(["--scenario", scenario, "--bar-increment", "skipper"]))
        assert cfg.bar_increment == "skipper"
    with pytest.raises(SystemExit):
        parse(["--scenario", "load-signal", "--bar-increment", "zero"])
