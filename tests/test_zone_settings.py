"""Zone settings (declared once, ranges checked) and the zone API's argument checks."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

import lbcore
from lbcore.knobs import KnobError, add_arguments, from_args
from lbcore.zone_settings import ZONE_KNOBS, ZoneSettings


def test_the_zone_settings_and_their_defaults():
    assert [k.env for k in ZONE_KNOBS] == [
        "CSLB_ZONE",
        "CSLB_ZONE_AFFINITY",
        "CSLB_ZONE_RAMP",
        "CSLB_ZONE_PROBE_FLOOR",
        "CSLB_ZONE_MIN_PODS",
        "CSLB_ZONE_LATENCY_MARGIN",
        "CSLB_ZONE_HOLD",
    ]
    s = ZoneSettings.from_mapping({})
    assert s == ZoneSettings()
    assert (s.zone, s.affinity, s.probe_floor, s.min_pods, s.latency_margin) == (
        "",
        False,
        0.01,
        3,
        0.35,
    )
    assert s.ramp_ns == 30_000_000_000 and s.hold_ns == 30_000_000_000


def test_zone_settings_from_the_environment_and_flags():
    env = {
        "CSLB_ZONE": "eu-central-1a",
        "CSLB_ZONE_AFFINITY": "ON",
        "CSLB_ZONE_RAMP": "60s",
        "CSLB_ZONE_MIN_PODS": "2",
    }
    s = ZoneSettings.from_mapping(env)
    assert (s.zone, s.affinity, s.ramp_ns, s.min_pods) == ("eu-central-1a", True, 60 * 10**9, 2)
    parser = argparse.ArgumentParser()
    add_arguments(parser, ZONE_KNOBS)
    values = from_args(parser.parse_args(["--zone-hold", "45"]), env, ZONE_KNOBS)
    assert ZoneSettings.from_values(values).hold_ns == 45 * 10**9


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("CSLB_ZONE", "eu central"),
        ("CSLB_ZONE", "-a"),
        ("CSLB_ZONE", "a" * 64),
        ("CSLB_ZONE_AFFINITY", "maybe"),
        ("CSLB_ZONE_RAMP", "-1"),
        ("CSLB_ZONE_RAMP", "100000"),
        ("CSLB_ZONE_PROBE_FLOOR", "0.6"),
        ("CSLB_ZONE_PROBE_FLOOR", "nan"),
        ("CSLB_ZONE_MIN_PODS", "0"),
        ("CSLB_ZONE_MIN_PODS", "1001"),
        ("CSLB_ZONE_LATENCY_MARGIN", "0"),
        ("CSLB_ZONE_LATENCY_MARGIN", "11"),
        ("CSLB_ZONE_HOLD", "0.5"),
    ],
)
def test_out_of_range_zone_settings_are_refused_by_name(env, value):
    with pytest.raises(KnobError, match=env):
        ZoneSettings.from_mapping({env: value})


def test_zone_split_checks_its_arguments():
    ok = lbcore.ZoneSplit([True, False, True], 0.5)
    assert ok.local.tolist() == [True, False, True] and ok.min_pods == 3
    with pytest.raises(ValueError):
        ok.local[0] = False  # read-only
    bad = [
        ((np.array([1, 0]), 0.5), {}),
        ((np.zeros((2, 2), dtype=bool), 0.5), {}),
        (([True], 1.5), {}),
        (([True], -0.1), {}),
        (([True], float("nan")), {}),
        (([True], True), {}),
        (([True], "0.5"), {}),
        (([True], 0.5), {"min_pods": 0}),
        (([True], 0.5), {"min_pods": 1001}),
        (([True], 0.5), {"min_pods": 2.0}),
        (([True], 0.5), {"name": None}),
        (([True], 0.5), {"name": b"z-a"}),
    ]
    for args, kw in bad:
        with pytest.raises(lbcore.ArgumentError):
            lbcore.ZoneSplit(*args, **kw)
    split = lbcore.ZoneSplit.for_zone(["a", "b", None, "a"], "a", 0.3, min_pods=2)
    assert split.local.tolist() == [True, False, False, True]
    assert split.name == "a" and split.salt == lbcore.zone_salt("a") != ok.salt
    assert not lbcore.ZoneSplit.for_zone(["a", ""], "", 0.3).local.any()


def test_a_plan_refuses_a_zone_that_does_not_fit(kernel):
    rs = lbcore.RingSet(["http://10.0.0.1:80", "http://10.0.0.2:80"])
    with pytest.raises(lbcore.ArgumentError, match="2 endpoints"):
        lbcore.Plan(rs, 0, zone=lbcore.ZoneSplit([True], 0.5))
    with pytest.raises(lbcore.ArgumentError, match="ZoneSplit"):
        lbcore.Plan(rs, 0, zone=[True, False])  # type: ignore[arg-type]
    with pytest.raises(lbcore.ArgumentError):
        lbcore.local_keys(["a"], 2.0, "z-a")
    with pytest.raises(lbcore.ArgumentError, match="zone name"):
        lbcore.local_keys(["a"], 0.5, None)  # type: ignore[arg-type]
