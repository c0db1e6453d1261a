"""Each zone knob's help text (and so docs/settings.md) states the range its parser takes."""

from __future__ import annotations

import re

import pytest

from lbcore.zone_settings import ZONE_KNOBS

RANGES = {
    "CSLB_ZONE_RAMP": ("0", "86400", "Range: 0 to 86,400 s."),
    "CSLB_ZONE_PROBE_FLOOR": ("0", "0.5", "Range: 0 to 0.5."),
    "CSLB_ZONE_MIN_PODS": ("1", "1000", "Range: 1 to 1,000."),
    "CSLB_ZONE_LATENCY_MARGIN": (None, "10", "Range: above 0, at most 10."),
    "CSLB_ZONE_HOLD": ("1", "86400", "Range: 1 to 86,400 s."),
}
KNOBS = {k.env: k for k in ZONE_KNOBS}


@pytest.mark.parametrize("env", sorted(RANGES))
def test_the_help_states_the_range_the_parser_takes(env):
    low, high, said = RANGES[env]
    knob = KNOBS[env]
    assert said in knob.doc
    assert knob.parse(high) == pytest.approx(float(high))
    for beyond in (f"{float(high) * 1.001 + 1:g}", "-1"):
        with pytest.raises(ValueError):
            knob.parse(beyond)
    if low is None:  # above 0: 0 itself is refused
        with pytest.raises(ValueError):
            knob.parse("0")
    else:
        assert knob.parse(low) == pytest.approx(float(low))
        below = float(low) - 0.5 if env != "CSLB_ZONE_MIN_PODS" else 0
        with pytest.raises(ValueError):
            knob.parse(f"{below:g}")


def test_the_choices_and_the_zone_names_are_stated_too():
    assert "One of: off, on." in KNOBS["CSLB_ZONE_AFFINITY"].doc
    zone = KNOBS["CSLB_ZONE"]
    assert re.search(r"up to 63 letters", zone.doc)
    assert zone.parse("eu-west-1a") == "eu-west-1a"
    with pytest.raises(ValueError):
        zone.parse("x" * 64)
