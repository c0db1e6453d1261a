"""The folding rules of pod-reported load (lbcore.reported), on a fake clock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lbcore.bounded import check_loads, in_call_units, target_load
from lbcore.errors import LoadError
from lbcore.knobs import KnobError, add_arguments, from_args
from lbcore.report_settings import REPORT_KNOBS, ReportSettings
from lbcore.reported import (
    KIND_NONE,
    KIND_OCCUPANCY,
    KIND_UTILIZATION,
    SOURCE_HOST,
    SOURCE_REPORTED,
    SOURCES,
    STATUS_BLACKOUT,
    STATUS_FRESH,
    STATUS_NONE,
    ReportError,
    ReportState,
    effective_loads,
    forget,
    record_reports,
    refresh_due,
    report_status,
    report_value,
)

S = 1_000_000_000  # one second, ns
ON = ReportSettings(enabled=True, blackout_ns=10 * S, expiry_ns=30 * S, refresh_ns=5 * S)


class Clock:
    def __init__(self, t_s: float = 1000.0) -> None:
        self.ns = round(t_s * S)

    def advance(self, s: float) -> int:
        self.ns += round(s * S)
        return self.ns


def reports(state, clock, values, kind=KIND_OCCUPANCY, ids=7, slots=None):
    slots = np.arange(len(values)) if slots is None else slots
    return record_reports(state, slots, values, kind, ids, clock.ns, ON.expiry_ns)


def test_defaults_and_knobs():
    d = ReportSettings()
    assert d.enabled is False  # off keeps today's routing
    assert d.blackout_ns == 10 * S
    assert d.expiry_ns >= 2 * d.refresh_ns
    assert [k.env for k in REPORT_KNOBS] == [
        "CSLB_LOAD_REPORTS",
        "CSLB_LOAD_REPORT_BLACKOUT",
        "CSLB_LOAD_REPORT_EXPIRY",
        "CSLB_LOAD_REPORT_REFRESH",
    ]
    s = ReportSettings.from_mapping({"CSLB_LOAD_REPORTS": "on", "CSLB_LOAD_REPORT_BLACKOUT": "3s"})
    assert s.enabled and s.blackout_ns == 3 * S
    with pytest.raises(KnobError, match="CSLB_LOAD_REPORT_BLACKOUT"):
        ReportSettings.from_mapping({"CSLB_LOAD_REPORT_BLACKOUT": "-1"})
    with pytest.raises(KnobError, match="CSLB_LOAD_REPORT_EXPIRY"):
        ReportSettings.from_mapping({"CSLB_LOAD_REPORT_EXPIRY": "1e9"})
    with pytest.raises(KnobError, match="at least twice"):
        ReportSettings.from_mapping(
            {"CSLB_LOAD_REPORT_EXPIRY": "6", "CSLB_LOAD_REPORT_REFRESH": "5"}
        )
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser, REPORT_KNOBS)
    values = from_args(parser.parse_args(["--load-report-expiry", "60"]), {}, REPORT_KNOBS)
    assert ReportSettings.from_values(values).expiry_ns == 60 * S


def test_report_value_prefers_occupancy_and_refuses_bad_numbers():
    assert report_value(2.5, 0.4) == (2.5, KIND_OCCUPANCY)
    assert report_value(None, 0.4) == (0.4, KIND_UTILIZATION)
    v, k = report_value(None, None)
    assert k == KIND_NONE and math.isnan(v)
    for bad in (-0.1, math.nan, math.inf, -math.inf):
        with pytest.raises(ReportError):
            report_value(bad, None)
        with pytest.raises(ReportError):
            report_value(None, bad)


def test_record_refuses_bad_input():
    st, c = ReportState.empty(3), Clock()
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ReportError, match="finite"):
            reports(st, c, [1.0, bad, 1.0])
    with pytest.raises(ReportError, match="kinds"):
        reports(st, c, [1.0, 1.0, 1.0], kind=KIND_NONE)
    with pytest.raises(ReportError, match="slots"):
        reports(st, c, [1.0], slots=[3])
    with pytest.raises(ReportError, match="one report"):
        reports(st, c, [1.0, 2.0], slots=[1, 1])
    assert (st.kind == KIND_NONE).all()  # the state given is never changed


def test_blackout_then_fresh_then_expiry():
    c = Clock()
    st = reports(ReportState.empty(2), c, [1.0, 1.0])
    assert (report_status(st, c.ns, ON) == STATUS_BLACKOUT).all()
    c.advance(9.9)
    st = reports(st, c, [1.0, 1.0])  # same run: the blackout keeps its start
    assert (report_status(st, c.ns, ON) == STATUS_BLACKOUT).all()
    c.advance(0.1)
    assert (report_status(st, c.ns, ON) == STATUS_FRESH).all()
    c.advance(29.9)  # exactly the expiry after the latest report: still used
    assert (report_status(st, c.ns, ON) == STATUS_FRESH).all()
    c.advance(0.001)
    assert (report_status(st, c.ns, ON) == STATUS_NONE).all()
    st = reports(st, c, [1.0, 1.0])  # a lapsed run starts again, with a blackout
    assert (report_status(st, c.ns, ON) == STATUS_BLACKOUT).all()


def test_identity_or_kind_change_restarts_the_run_and_forget_empties():
    c = Clock()
    st = reports(ReportState.empty(3), c, [1.0, 1.0, 1.0], ids=[1, 2, 3])
    c.advance(20)
    st = reports(st, c, [1.0, 1.0, 1.0], kind=[1, 1, 2], ids=[1, 9, 3])
    assert report_status(st, c.ns, ON).tolist() == [STATUS_FRESH, STATUS_BLACKOUT, STATUS_BLACKOUT]
    st = forget(st, [0])
    assert report_status(st, c.ns, ON)[0] == STATUS_NONE and st.kind[0] == KIND_NONE


def test_damaged_cells_make_a_report_unusable_not_an_error():
    c = Clock()
    st = reports(ReportState.empty(4), c, [1.0] * 4)
    c.advance(20)
    st.value[0] = np.nan
    st.value[1] = -3.0
    st.kind[2] = 99
    st.at_ns[3] = c.ns + S  # from the future
    assert (report_status(st, c.ns, ON) == STATUS_NONE).all()
    host = np.array([1.0, 2.0, 3.0, 4.0])
    assert effective_loads(host, st, c.ns, ON).loads is host


def test_refresh_due():
    c = Clock()
    st = reports(ReportState.empty(3), c, [1.0, 1.0], slots=[0, 1])
    c.advance(5)
    st = reports(st, c, [1.0], slots=[1])
    assert refresh_due(st, c.ns, ON.refresh_ns).tolist() == [True, False, True]


def _fresh(values, kinds=KIND_OCCUPANCY):
    c = Clock()
    st = reports(ReportState.empty(len(values)), c, [0.0] * len(values), kind=kinds)
    c.advance(15)
    return reports(st, c, values, kind=kinds), c


def test_off_or_no_reports_is_the_host_view_bit_for_bit():
    rng = np.random.default_rng(3)
    host = rng.random(50) * 3
    st, c = _fresh(rng.random(50) * 10)
    off = effective_loads(host, st, c.ns, ReportSettings())
    assert off.loads is host and (off.source == SOURCE_HOST).all()
    none = effective_loads(host, ReportState.empty(50), c.ns, ON)
    assert none.loads is host and (none.source == SOURCE_HOST).all()
    assert check_loads(host, 50) is host  # what the router feeds bounded load today


def test_all_fresh_fleet_compares_reports_with_their_average_at_host_scale():
    host = np.array([1.0, 1.0, 1.0, 1.0])  # the host sends each pod the same
    reported = np.array([8.0, 4.0, 4.0, 4.0])  # but pod 0 is hot for someone else
    st, c = _fresh(reported)
    f = effective_loads(host, st, c.ns, ON)
    assert (f.source == SOURCE_REPORTED).all()
    assert f.loads.sum() == pytest.approx(host.sum())  # the bar keeps its meaning
    assert f.loads / f.loads.mean() == pytest.approx(reported / reported.mean())
    bar = target_load(in_call_units(f.loads, 0.01), np.ones(4, bool), 1.25)
    over = in_call_units(f.loads, 0.01) > bar
    assert over.tolist() == [True, False, False, False]
    host_bar = target_load(in_call_units(host, 0.01), np.ones(4, bool), 1.25)
    assert not (in_call_units(host, 0.01) > host_bar).any()  # host-only sees nothing


def test_mixed_fleet_compares_like_with_like():
    # pods 0-2 report occupancy, 3-4 utilization only, 5-6 nothing, 7 a lone kind... none.
    host = np.array([2.0, 2.0, 2.0, 1.0, 1.0, 0.5, 3.0])
    reported = np.array([6.0, 3.0, 3.0, 0.9, 0.3, 0.0, 0.0])
    kinds = np.array([1, 1, 1, 2, 2, 1, 1])
    c = Clock()
    st = reports(ReportState.empty(7), c, reported[:5], kind=kinds[:5], slots=np.arange(5))
    c.advance(15)
    st = reports(st, c, reported[:5], kind=kinds[:5], slots=np.arange(5))
    f = effective_loads(host, st, c.ns, ON)
    assert [SOURCES[s] for s in f.source] == ["reported"] * 5 + ["host"] * 2
    assert f.loads[:3] == pytest.approx([3.0, 1.5, 1.5])  # share of 6 (host's sum)
    assert f.loads[3:5] == pytest.approx([1.5, 0.5])  # share of 2
    assert f.loads[5:].tolist() == host[5:].tolist()  # bit-identical host view
    assert f.loads.sum() == pytest.approx(host.sum())


def test_a_lone_report_of_its_kind_keeps_the_host_view():
    host = np.array([1.0, 2.0, 3.0])
    st, c = _fresh([5.0, 0.0, 0.0], kinds=[KIND_UTILIZATION, KIND_OCCUPANCY, KIND_OCCUPANCY])
    f = effective_loads(host, st, c.ns, ON)
    assert f.source.tolist() == [SOURCE_HOST, SOURCE_HOST, SOURCE_HOST]  # occupancy all 0
    assert f.loads.tolist() == host.tolist()


def test_blackout_honours_a_high_report_at_once_and_holds_a_low_one_back():
    c = Clock()
    st = reports(ReportState.empty(4), c, [2.0, 2.0, 2.0, 2.0])
    c.advance(15)
    st = reports(st, c, [2.0, 2.0, 2.0], slots=[0, 1, 2])
    st = reports(st, c, [8.0], slots=[3], ids=99)  # pod 3 restarted: a new identity
    host = np.array([1.0, 1.0, 1.0, 1.0])
    f = effective_loads(host, st, c.ns, ON)
    assert report_status(st, c.ns, ON)[3] == STATUS_BLACKOUT
    assert f.source.tolist() == [1, 1, 1, 1]
    assert f.loads[3] == pytest.approx(4.0)  # scaled by the fresh pods: 8 / mean(2) × 1
    st = reports(st, c, [0.0], slots=[3], ids=99)  # now it says idle, still in blackout
    f = effective_loads(host, st, c.ns, ON)
    assert f.source[3] == SOURCE_HOST and f.loads[3] == 1.0  # not lowered below the host
    c.advance(10)
    st = reports(st, c, [2.0, 2.0, 2.0, 0.0], ids=[7, 7, 7, 99])
    f = effective_loads(host, st, c.ns, ON)
    assert f.source[3] == SOURCE_REPORTED and f.loads[3] == 0.0  # past blackout: used


def test_everyone_in_blackout_still_sheds_a_hot_pod():
    c = Clock()
    st = reports(ReportState.empty(4), c, [9.0, 1.0, 1.0, 1.0])
    f = effective_loads(np.ones(4), st, c.ns, ON)
    assert f.source.tolist() == [1, 0, 0, 0]
    assert f.loads[0] == pytest.approx(3.0) and f.loads[1:].tolist() == [1.0, 1.0, 1.0]


def test_an_idle_host_is_floored_at_one_call_per_pod():
    st, c = _fresh([3.0, 1.0])
    f = effective_loads(np.zeros(2), st, c.ns, ON, increment=0.5)
    assert f.loads == pytest.approx([0.75, 0.25])


def test_bad_host_loads_and_arguments_are_refused():
    st, c = _fresh([1.0, 1.0])
    for bad in ([1.0, -1.0], [1.0, math.nan], [math.inf, 1.0]):
        with pytest.raises(LoadError):
            effective_loads(np.array(bad), st, c.ns, ON)
    with pytest.raises(LoadError, match="slots"):
        effective_loads(np.ones(3), st, c.ns, ON)
    with pytest.raises(LoadError, match="increment"):
        effective_loads(np.ones(2), st, c.ns, ON, increment=0.0)


def test_pod_identity_changes_with_address_or_uid():
    from lbcore.reported import pod_identity

    a = pod_identity("http://10.0.0.1:8080", "uid-1")
    assert a == pod_identity("http://10.0.0.1:8080", "uid-1")
    assert a != pod_identity("http://10.0.0.1:8080", "uid-2")
    assert a != pod_identity("http://10.0.0.2:8080", "uid-1")
    assert 0 <= a < 2**64


def test_take_picks_rows_per_endpoint():
    c = Clock()
    st = reports(ReportState.empty(4), c, [1.0, 2.0, 3.0, 4.0], ids=[1, 2, 3, 4])
    t = st.take([3, 0])
    assert t.value.tolist() == [4.0, 1.0] and t.identity.tolist() == [4, 1]
    assert t.at_ns.dtype == np.int64 and t.kind.dtype == np.uint8
