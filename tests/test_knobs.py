import argparse
import pathlib

import pytest

from lbcore import knobs

SETTINGS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "settings.md"


def test_defaults():
    d = knobs.defaults()
    assert d["enabled"] is True and d["percentage"] == 100.0 and d["balance_factor"] == 1.25
    assert d["max_hops"] == 10 and d["load_signal"] == "occupancy" and d["fade_mode"] == "n-ring"
    assert d["fade_duration_s"] == 30.0 and d["fade_exponent"] == 2.5 and d["vnodes"] == 100


def test_environment_and_configmap_values_by_variable_or_name():
    env = {
        "CSLB_ENABLED": "off",
        "CSLB_PERCENTAGE": "12.5%",
        "CSLB_MAX_HOPS": "unlimited",
        "OTHER": "x",
    }
    assert knobs.from_mapping(env) == {"enabled": False, "percentage": 12.5, "max_hops": None}
    assert knobs.from_mapping({"balance_factor": "off"}) == {"balance_factor": None}
    assert knobs.from_mapping({"load_signal": "In-Flight"}) == {"load_signal": "in-flight"}


def test_flags_override_environment_override_defaults():
    p = argparse.ArgumentParser()
    knobs.add_arguments(p)
    args = p.parse_args(["--balance-factor", "1.35", "--fade-duration", "60s"])
    values = knobs.from_args(args, {"CSLB_BALANCE_FACTOR": "2", "CSLB_PERCENTAGE": "50"})
    assert values["balance_factor"] == 1.35 and values["percentage"] == 50.0
    assert values["fade_duration_s"] == 60.0 and values["enabled"] is True
    assert "CSLB_BALANCE_FACTOR" in p.format_help()


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"CSLB_PERCENTAGE": "101"}, "CSLB_PERCENTAGE.*0 to 100"),
        ({"CSLB_BALANCE_FACTOR": "0.9"}, "CSLB_BALANCE_FACTOR.*>= 1"),
        ({"CSLB_ENABLED": "maybe"}, "CSLB_ENABLED.*true or false"),
        ({"CSLB_MAX_HOPS": "0"}, "CSLB_MAX_HOPS.*positive integer"),
        ({"CSLB_LOAD_SIGNAL": "cpu"}, "CSLB_LOAD_SIGNAL.*one of effective, occupancy, in-flight"),
        ({"CSLB_FADE_EXPONENT": "nan"}, "CSLB_FADE_EXPONENT.*finite"),
        ({"CSLB_VNODES": "1e3"}, "CSLB_VNODES.*integer"),
    ],
)
def test_bad_values_name_the_knob_and_the_expectation(env, match):
    with pytest.raises(knobs.KnobError, match=match):
        knobs.from_mapping(env, source="configmap cslb")


def test_typed_values_round_trip():
    assert knobs.knob("enabled").convert(False, "x") is False
    assert knobs.knob("max_hops").convert(None, "x") is None
    assert knobs.knob("percentage").convert(30, "x") == 30.0


def test_readme_documents_every_knob_from_the_declarations():
    assert knobs.docs_table() in SETTINGS.read_text(encoding="utf-8")


def test_docs_tables_show_empty_defaults_as_dash_and_run_time_ones_as_auto():
    k = knobs.Knob
    table = knobs.docs_table(
        [
            k("a", "CSLB_A", "--a", "", str, "Empty."),
            k("b", "CSLB_B", "--b", None, str, "None."),
            k("c", "CSLB_C", "--c", 0, int, "Worked out at run time.", auto=True),
            k("d", "CSLB_D", "--d", 0.0, float, "Zero."),
            k("e", "CSLB_E", "--e", "auto", str, "A value that reads auto."),
        ]
    )
    defaults = [row.split(" | ")[2] for row in table.splitlines()[2:]]
    assert defaults == ["-", "-", "`auto`", "`0.0`", "`auto`"]
    parser = argparse.ArgumentParser()
    knobs.add_arguments(parser, [k("c", "CSLB_C", "--c", 0, int, "Run time.", auto=True)])
    assert "default auto]" in parser.format_help()
    # Every table in the README and docs: no empty backticks, the run-time defaults auto.
    from discovery.settings import DISCOVERY_KNOBS, OUTLIER_KNOBS
    from workers.fanout.settings import FANOUT_KNOBS

    for group in (knobs.ROUTING_KNOBS, DISCOVERY_KNOBS, OUTLIER_KNOBS, FANOUT_KNOBS):
        assert "| `` |" not in knobs.docs_table(group)
    shown = {f.env: f.shown_default for f in FANOUT_KNOBS}
    assert shown["CSLB_FANOUT_DEADLINE"] == shown["CSLB_FANOUT_ENDPOINT_CAP"] == "auto"
    assert shown["CSLB_FALLBACK_URL"] == "-"
