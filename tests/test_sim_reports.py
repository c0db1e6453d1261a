"""The simulator's pod-reported-load scenario, briefly: reports cool a pod made hot by other
callers where the host's own view does not, and keep a healthy fleet's moves small."""

from dataclasses import replace

import pytest

from cslb.simulate_cmd import main
from perf.sim.reports import ReportsConfig, run

BRIEF = ReportsConfig(
    pods=10, seconds=30.0, window_s=5.0, external=1.5, external_on_s=8.0, external_off_s=24.0
)


def test_reported_load_cools_the_hot_pod_where_host_only_does_not():
    host = run(BRIEF)
    reported = run(replace(BRIEF, reports=True, blackout_s=2.0))
    assert host["pod0_hot"] > 1.6  # 1/H of the calls: the hosts barely see it
    assert host["moved_hot"] < 0.02
    assert reported["pod0_hot"] < host["pod0_hot"] - 0.5
    assert reported["spread_hot"] < host["spread_hot"] - 0.4
    assert reported["reported_share"] > 0.5
    assert reported["recovery_s"] < 5.0 + 2.0  # within a refresh and the pod's window


def test_a_healthy_fleet_moves_few_keys_with_reports_on():
    healthy = run(replace(BRIEF, reports=True, blackout_s=2.0, external=0.0))
    assert healthy["moved_healthy"] <= 0.02


def test_command_prints_the_table(capsys):
    assert main(["--scenario", "reports", "--seconds", "10", "--clients", "2"]) == 0
    out = capsys.readouterr().out
    assert "host-only" in out and "b10/e30/r5" in out and "keys moved, healthy" in out


def test_command_refuses_options_of_the_cache_scenarios(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--scenario", "reports", "--zipf", "1.2"])
    assert exc.value.code == 2
    assert "--zipf has no effect on --scenario reports" in capsys.readouterr().err
