"""Discovery's zone controller inside the zones simulation (Zipf keys, LRU caches, the
default zone settings, the cap held at 1 - probe floor): a latency fault sends a zone to
the probe floor, whether it starts during the start's ramp or at full affinity, and the
recovery's ramp, whose newly local keys meet cold caches, does not send it back. With
Z2's draw salted per caller zone the probe floor's remote keys read like local ones, so
the zones without a fault stay at their cap; with each side's latency the mean of its
pods' means, neither does a zone at its ramp's end whose hottest keys are still remote
(seeds 1-5)."""

from dataclasses import replace

import numpy as np
import pytest

from cslb.simulate_cmd import main
from lbcore.draws import unit_interval
from lbcore.zone_settings import ZoneSettings
from lbcore.zones import zone_salt
from perf.sim.workload import Catalogue
from perf.sim.zone_control import CASES, controller_study
from perf.sim.zones import ZonesConfig

EVEN = ZonesConfig(pods=(4, 4, 4))
RAMPING, AT_FULL = (slow for _, slow in CASES)
CAP = 1.0 - ZoneSettings().probe_floor
HOLD_S = ZoneSettings().hold_ns / 1e9
RAMP_S = ZoneSettings().ramp_ns / 1e9


def _of(study, zone):
    return [t for t in study["transitions"] if t["zone"] == zone]


def _states(study, zone):
    return [(t["state"], t["reason"]) for t in _of(study, zone)]


def test_a_recovery_ramp_does_not_flap_back_to_the_floor():
    study = controller_study(replace(EVEN, seconds=120.0), slow=RAMPING)
    # the fault (10-40 s) while x rises: one drop, a recovery after the hold, a full ramp
    assert _states(study, "z-a") == [
        ("ramping", "started"),
        ("floor", "latency"),
        ("ramping", "recovered"),
        ("full", "ramp_done"),
    ]
    floor, recovered, full = [t["t_s"] for t in _of(study, "z-a")][1:]
    assert 10.0 < floor < 15.0  # within a few steps of the fault
    assert recovered >= 40.0 + HOLD_S  # not before the signal was good for the hold time
    assert full == pytest.approx(recovered + RAMP_S, abs=1.0)
    # the cold keys of the ramp keep local latency below the recovery threshold (half
    # the margin), not only below the margin that would drop it
    assert study["recovery_excess"]["z-a"] < ZoneSettings().latency_margin / 2
    # the other two reach their cap and stay there: nothing is wrong with them
    for zone in ("z-b", "z-c"):
        assert _states(study, zone) == [("ramping", "started"), ("full", "ramp_done")]
    assert study["floors"] == {"z-a": 1, "z-b": 0, "z-c": 0}


def test_a_fault_at_full_affinity_is_seen_and_recovers_without_flapping():
    study = controller_study(replace(EVEN, seconds=170.0), slow=AT_FULL)
    za = _of(study, "z-a")
    assert _states(study, "z-a") == [
        ("ramping", "started"),
        ("full", "ramp_done"),
        ("floor", "latency"),
        ("ramping", "recovered"),
        ("full", "ramp_done"),
    ]
    assert za[1]["x"] == pytest.approx(CAP)
    # seen one step after it starts, on the probe floor's remote calls
    assert 60.0 < za[2]["t_s"] < 65.0 and za[2]["remote_calls"] >= 20
    assert za[3]["t_s"] >= 90.0 + HOLD_S
    assert za[3]["t_s"] >= 90.0 + HOLD_S
    assert study["recovery_excess"]["z-a"] < ZoneSettings().latency_margin / 2
    # the other zones never drop, and every zone ends back at its cap
    assert study["floors"] == {"z-a": 1, "z-b": 0, "z-c": 0}
    assert study["series"]["x"][-1].tolist() == pytest.approx([CAP] * 3)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_without_a_fault_no_zone_drops_not_even_at_a_ramps_end_with_hot_keys_remote(seed):
    # Each zone's probe keys are the other zones' local keys, warm at their owner as any
    # pod's local keys are: remote reads pay the longer trip and are not faster for it.
    # (With one draw for every zone they were the same keys from all zones, cache-hot
    # at their owner, and zones dropped with nothing wrong.)
    study = controller_study(replace(EVEN, seconds=200.0, seed=seed), slow=None)
    assert study["floors"] == {"z-a": 0, "z-b": 0, "z-c": 0}
    s = study["series"]
    steady = s["t"] >= 45.0  # the start's ramp and one window after it are over
    excess = s["excess"][steady]
    assert not np.isnan(excess).any()  # both sides measured at every step at full
    assert (excess < ZoneSettings().latency_margin / 2).all()
    assert (np.mean(excess, axis=0) < 0.0).all()  # local faster on average: the trip
    # The ramp's end, where the readings' window still holds its last remote calls:
    # z-b's draw leaves five of the 25 most popular products (about 6 % of calls,
    # always cache hits at their owner) between 0.93 and 0.99, so they are most of
    # z-b's remote calls then. Weighted by call they read remote faster than local by
    # more than the margin (seeds 3 and 5 dropped z-b with no fault); weighted by pod
    # (discovery.zonecontrol.latency_reading) they stay under half of it.
    cat = Catalogue(EVEN.catalogue, EVEN.zipf)
    u = unit_interval(cat.hashes[:25], zone_salt("z-b"))
    late = (u > 0.93) & (u < CAP)
    assert late.sum() >= 5 and cat.popularity[:25][late].sum() > 0.05
    ramp_end = (s["t"] >= RAMP_S - 10.0) & (s["t"] < RAMP_S + 15.0)
    assert np.nanmax(s["excess"][ramp_end]) < ZoneSettings().latency_margin / 2


def test_on_an_uneven_fleet_only_the_faulty_zone_drops():
    # 3/4/5 pods and even callers: z-a's cap is 0.75, so a quarter of its keys stay
    # remote at full, hot ones among them. Weighted by call, every zone dropped with
    # nothing wrong (7 floors in 200 s on seed 1, z-a already at the floor when its
    # fault came); weighted by pod only z-a drops, once, on its fault.
    study = controller_study(replace(EVEN, pods=(3, 4, 5), seconds=200.0), slow=AT_FULL)
    assert study["floors"] == {"z-a": 1, "z-b": 0, "z-c": 0}
    (drop,) = [t for t in _of(study, "z-a") if t["state"] == "floor"]
    assert 60.0 < drop["t_s"] < 65.0 and drop["reason"] == "latency"
    assert _states(study, "z-a")[-1] == ("full", "ramp_done")


def test_the_cli_prints_every_case(capsys):
    assert main(["--scenario", "zone-controller", "--seconds", "20", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for name, _ in CASES:
        assert f"\n{name}: z-a's service times x3" in out
    assert "floor" in out and "highest excess while ramping after a recovery" in out
    assert "caps held at 1 - probe floor" in out


def test_the_cli_has_no_chart_for_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--scenario", "zone-controller", "--plot", str(tmp_path)])
    assert exc.value.code == 2
    assert "no chart" in capsys.readouterr().err
