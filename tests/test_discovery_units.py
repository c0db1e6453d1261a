"""Pure parts of discovery: debounce, backoff, ring-set state machine, knob layers, file
watcher, event log."""

import dataclasses
import io
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

import lbcore
import shm
from discovery.cli import NoEndpointSourceError, default_endpoints_file
from discovery.debounce import DebounceError, Debouncer
from discovery.events import EventLog, LogLevelError
from discovery.kube import Backoff
from discovery.ringstate import FadeParams, RingState
from discovery.settings import (
    DISCOVERY_KNOBS,
    PUBLISHED_KNOBS,
    KnobState,
    knob,
    unknown_configmap_keys,
)
from discovery.static import EndpointsFileError, EndpointsFileWatcher, EndpointSpec
from lbcore.knobs import ROUTING_KNOBS, KnobError, defaults
from lbcore.route import route_ring_set

ROOT = Path(__file__).resolve().parent.parent

S = 1_000_000_000


def specs(n, start=0, zone="z"):
    return [
        EndpointSpec(f"http://10.0.{i // 200}.{i % 200}:80", zone, f"node-{i}")
        for i in range(start, start + n)
    ]


# -- debounce ---------------------------------------------------------------------------


def test_debounce_waits_for_quiet_then_releases_once():
    d = Debouncer(2 * S, 10 * S)
    assert not d.pending and d.deadline() is None and not d.due(0)
    for t in range(0, 50):  # 50 changes in 0.49 s
        d.note(t * S // 100)
    assert d.deadline() == 49 * S // 100 + 2 * S
    assert not d.due(2 * S) and d.due(49 * S // 100 + 2 * S)
    assert d.reset() == 50 and not d.pending


def test_debounce_cap_releases_a_source_that_never_goes_quiet():
    d = Debouncer(2 * S, 5 * S)
    t = 0
    while not d.due(t):
        d.note(t)
        t += S  # a change every second: never 2 s of quiet
    assert t == 5 * S


def test_debounce_rejects_bad_settings():
    with pytest.raises(DebounceError, match=">= 0"):
        Debouncer(-1)
    with pytest.raises(DebounceError, match="cap"):
        Debouncer(10, 5)
    assert Debouncer(0).max_delay_ns == 0


# -- backoff ----------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_and_caps():
    b = Backoff(0.8, 30.0, random.Random(1))
    delays = [b.next() for _ in range(12)]
    for n, d in enumerate(delays):
        base = min(30.0, 0.8 * 2**n)
        assert 0.5 * base <= d <= base
    assert max(delays) <= 30.0 and delays[-1] >= 15.0
    assert len(set(delays)) == len(delays)  # jittered
    b.reset()
    assert b.next() <= 0.8


# -- ring state -------------------------------------------------------------------------


def test_first_set_is_established_then_scale_up_fades_as_one_ring():
    st = RingState(FadeParams(30 * S, 2.5, 100))
    t = st.transition(specs(10), 100 * S)
    assert t.membership_changed and len(t.added) == 10 and t.ring_set.starts_ns == ()
    st.commit(t)
    t = st.transition(specs(60), 200 * S)  # +50 in one publish
    assert len(t.added) == 50 and t.ring_set.starts_ns == (200 * S,)
    assert int((t.ring_set.tiers == 1).sum()) == 50
    st.commit(t)
    assert st.ring_set.share_list(215 * S) == pytest.approx([0.5**2.5])


def test_deletion_leaves_every_ring_at_once_mid_fade():
    st = RingState(FadeParams(30 * S, 2.5, 100))
    st.commit(st.transition(specs(10), 0))
    st.commit(st.transition(specs(20), 1 * S))
    st.commit(st.transition(specs(30), 2 * S))
    assert len(st.ring_set.starts_ns) == 2
    # Remove one established pod and one pod of each fading ring.
    keep = [s for i, s in enumerate(specs(30)) if i not in (3, 13, 23)]
    t = st.transition(keep, 3 * S)
    assert {s.node for s in t.removed} == {"node-3", "node-13", "node-23"}
    rs = t.ring_set
    gone = {specs(30)[i].address for i in (3, 13, 23)}
    assert not gone & set(rs.endpoints)
    for ring in rs.rings:
        assert not gone & {rs.endpoints[o] for o in np.unique(ring.owners)}
    assert len(rs.starts_ns) == 2  # fades go on
    keys = [f"k{i}" for i in range(2000)]
    idx = route_ring_set(rs, keys, 3 * S)
    assert not gone & {rs.endpoints[i] for i in idx}


def test_completed_fade_collapses_in_the_next_transition_only():
    st = RingState(FadeParams(30 * S, 2.5, 100))
    st.commit(st.transition(specs(10), 0))
    st.commit(st.transition(specs(15), 1 * S))
    t = st.transition(specs(15), 40 * S)  # no change, fade done
    assert t.collapsed == 1 and t.ring_set.starts_ns == () and not t.routing_changed
    keys = [f"k{i}" for i in range(3000)]
    assert np.array_equal(
        route_ring_set(st.ring_set, keys, 40 * S), route_ring_set(t.ring_set, keys, 40 * S)
    )  # collapsing changes no route


def test_fade_off_and_param_changes_rebuild():
    st = RingState(FadeParams(30 * S, 2.5, 100))
    st.commit(st.transition(specs(10), 0))
    t = st.transition(specs(12), S, FadeParams(0, 2.5, 100))
    assert t.params_changed and t.ring_set.starts_ns == () and t.ring_set.duration_ns == 0
    st.commit(st.transition(specs(12), S))
    t = st.transition(specs(12), 2 * S, FadeParams(60 * S, 3.0, 100))
    assert t.params_changed and t.routing_changed and t.ring_set.starts_ns == (S,)
    assert t.ring_set.duration_ns == 60 * S and t.ring_set.exponent == 3.0
    t = st.transition(specs(12), 2 * S, FadeParams(30 * S, 2.5, 50))
    assert t.ring_set.vnodes == 50 and len(t.ring_set.newest) == 12 * 50
    ref = lbcore.Ring(t.ring_set.endpoints, vnodes=50)
    assert np.array_equal(t.ring_set.newest.hashes, ref.hashes)


def test_fade_params_from_knobs():
    k = defaults(ROUTING_KNOBS)
    assert FadeParams.from_knobs(k) == FadeParams(30 * S, 2.5, 100)
    assert FadeParams.from_knobs({**k, "fade_mode": "off"}).duration_ns == 0
    assert FadeParams.from_knobs({**k, "fade_duration_s": 1.5}).duration_ns == 1_500_000_000


def test_zone_or_node_change_is_a_routing_change_pod_name_is_not():
    st = RingState()
    base = specs(3)
    st.commit(st.transition(base, 0))
    moved = [EndpointSpec(base[0].address, "other-zone", base[0].node), *base[1:]]
    t = st.transition(moved, S)
    assert [s.address for s in t.updated] == [base[0].address] and t.routing_changed
    renamed = [EndpointSpec(s.address, s.zone, s.node, "pod-x") for s in base]
    assert not st.transition(renamed, S).routing_changed


def test_transition_leaves_state_alone_and_rejects_duplicates():
    st = RingState()
    st.commit(st.transition(specs(3), 0))
    before = st.ring_set
    st.transition(specs(9), S)
    assert st.ring_set is before
    with pytest.raises(lbcore.EndpointError, match="twice"):
        st.transition(specs(2) + specs(1), S)


def test_recovered_state_keeps_tiers_and_starts():
    st = RingState(FadeParams(30 * S, 2.5, 100))
    st.commit(st.transition(specs(5), 0))
    st.commit(st.transition(specs(8), 5 * S))
    rs = st.ring_set
    again = RingState.recovered(
        lbcore.RingSet(rs.endpoints, rs.tiers, rs.starts_ns),
        [s.zone for s in specs(8)],
        [s.node for s in specs(8)],
    )
    t = again.transition(specs(8), 6 * S)
    assert not t.routing_changed and t.ring_set.starts_ns == (5 * S,)


# -- knobs ------------------------------------------------------------------------------


def test_configmap_layer_overrides_flags_and_is_all_or_nothing():
    ks = KnobState(defaults(ROUTING_KNOBS))
    assert ks.set_overlay({"CSLB_ENABLED": "false", "percentage": "25"}, "cm") == {
        "enabled": (True, False),
        "percentage": (100.0, 25.0),
    }
    with pytest.raises(KnobError, match="cm: invalid CSLB_BALANCE_FACTOR"):
        ks.set_overlay({"CSLB_ENABLED": "true", "CSLB_BALANCE_FACTOR": "0.5"}, "cm")
    assert ks.values()["enabled"] is False  # unchanged by the bad update
    assert ks.set_overlay(None, "cm") == {"enabled": (False, True), "percentage": (25.0, 100.0)}
    assert unknown_configmap_keys({"CSLB_ENABLE": "x", "enabled": "1", "max_hops": "2"}) == [
        "CSLB_ENABLE"
    ]


def test_discovery_settings_declared_once():
    names = [k.name for k in DISCOVERY_KNOBS]
    envs = [k.env for k in DISCOVERY_KNOBS]
    assert len(set(names)) == len(names) and len(set(envs)) == len(envs)
    assert all(e.startswith("CSLB_") for e in envs)
    routing = {k.env for k in ROUTING_KNOBS} | {k.flag for k in ROUTING_KNOBS}
    assert not routing & (set(envs) | {k.flag for k in DISCOVERY_KNOBS})
    by = {k.name: k for k in DISCOVERY_KNOBS}
    assert by["debounce_s"].default == 2.0
    with pytest.raises(KnobError, match="CSLB_DEBOUNCE"):
        by["debounce_s"].convert("-1", "test")
    with pytest.raises(KnobError, match="expected one of http, https"):
        by["scheme"].convert("ftp", "test")
    with pytest.raises(KnobError, match="expected one of debug, info, warning, error"):
        by["log_level"].convert("loud", "test")
    with pytest.raises(KnobError, match=r"CSLB_SHM_NAMESPACE='a/b'.*is invalid"):
        by["shm_namespace"].convert("a/b", "test")
    assert knob("shm_namespace") is by["shm_namespace"]


@pytest.mark.parametrize(
    ("name", "raw", "want"),
    [
        ("debounce_s", "2.5s", 2.5),
        ("debounce_s", "0", 0.0),
        ("heartbeat_s", "0.01", 0.01),
        ("heartbeat_s", "0.001", "expected seconds >= 0.01"),
        ("watch_timeout_s", "0.5", "expected seconds >= 1"),
        ("debounce_s", "nan", "expected a finite number"),
        ("debounce_s", "inf", "expected a finite number"),
        ("debounce_s", "soon", "expected a number"),
        ("request_timeout_s", "-1", "expected seconds >= 0"),
    ],
)
def test_second_settings_parse_through_lbcore_knobs(name, raw, want):
    k = knob(name)
    if isinstance(want, float):
        assert k.convert(raw, "test") == want
    else:
        with pytest.raises(KnobError, match=want):
            k.convert(raw, "test")


def test_published_knobs_are_the_table_knobs_and_routing_knobs():
    assert PUBLISHED_KNOBS == tuple(f.name for f in dataclasses.fields(shm.Knobs))
    assert "fade_mode" in PUBLISHED_KNOBS
    assert set(PUBLISHED_KNOBS) <= {k.name for k in ROUTING_KNOBS}


# -- the embedded default source --------------------------------------------------------


def test_the_example_file_is_the_default_outside_a_cluster(tmp_path):
    example = ROOT / "examples" / "endpoints.json"
    # In a directory with its own examples/endpoints.json: that one.
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "endpoints.json").write_text('["http://10.9.0.1:80"]')
    assert default_endpoints_file(tmp_path, {}) == tmp_path / "examples" / "endpoints.json"
    # Anywhere else: the source tree's.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert default_endpoints_file(elsewhere, {}) == example
    # Neither: an error naming both places.
    with pytest.raises(NoEndpointSourceError, match="no endpoint source") as err:
        default_endpoints_file(elsewhere, {}, source_tree=tmp_path / "nowhere")
    assert str(elsewhere / "examples" / "endpoints.json") in str(err.value)
    assert str(tmp_path / "nowhere" / "examples" / "endpoints.json") in str(err.value)
    # Inside a cluster there is no default, even with the file at hand.
    with pytest.raises(NoEndpointSourceError, match="inside a cluster"):
        default_endpoints_file(tmp_path, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"})


# -- endpoints file ---------------------------------------------------------------------


def test_file_watcher_rereads_on_change_and_keeps_last_good(tmp_path):
    f = tmp_path / "eps.yaml"
    f.write_text("endpoints:\n  - address: http://10.0.0.1:80\n    zone: a\n")
    w = EndpointsFileWatcher(f)
    assert [s.address for s in w.poll()] == ["http://10.0.0.1:80"]
    assert w.poll() is None  # unchanged
    f.write_text("- http://10.0.0.1:80\n- http://10.0.0.2:80\n")
    os.utime(f, ns=(1, 10**18))
    assert [s.address for s in w.poll()] == ["http://10.0.0.1:80", "http://10.0.0.2:80"]
    f.write_text("- [broken\n")
    os.utime(f, ns=(1, 2 * 10**18))
    with pytest.raises(EndpointsFileError, match="not valid YAML"):
        w.poll()
    assert w.poll() is None  # same error: reported once
    assert [s.address for s in w.endpoints] == ["http://10.0.0.1:80", "http://10.0.0.2:80"]
    f.write_text("- http://10.0.0.3:80\n")  # fixed without a new mtime: still picked up
    os.utime(f, ns=(1, 2 * 10**18))
    assert [s.address for s in w.poll()] == ["http://10.0.0.3:80"]
    f.unlink()
    with pytest.raises(EndpointsFileError, match="cannot read"):
        w.poll()


# -- event log --------------------------------------------------------------------------


def test_event_log_writes_one_json_object_per_line():
    buf = io.StringIO()
    seen = []
    log = EventLog(buf, level="info")
    log.add_sink(seen.append)
    log.debug("hidden", x=1)
    log.error("api_error", error="line1\nline2", retry_in_s=0.8)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["event"] == "api_error" and rec["level"] == "error" and rec["retry_in_s"] == 0.8
    assert rec["timestamp"].endswith("Z") and rec["error"] == "line1\nline2"
    assert rec["logger"] == "cslb.discovery" and rec["pid"] == os.getpid()
    assert [r["event"] for r in seen] == ["hidden", "api_error"]
    with pytest.raises(LogLevelError, match="log level 'loud' is not one of debug, info"):
        EventLog(buf, level="loud")


def test_readme_settings_table_matches_the_declarations():
    from pathlib import Path

    from discovery.settings import docs_table

    settings = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
    readme = settings.read_text(encoding="utf-8")
    assert docs_table() in readme


def test_readme_outlier_table_matches_the_declarations():
    import re
    from pathlib import Path

    from discovery.settings import OUTLIER_KNOBS, outlier_docs_table

    settings = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
    readme = settings.read_text(encoding="utf-8")
    m = re.search(r"<!-- outlier-knobs -->\n(.*?)<!-- /outlier-knobs -->", readme, re.S)
    assert m and m.group(1).strip() == outlier_docs_table()
    names = {k.env for k in OUTLIER_KNOBS}
    assert {
        "CSLB_OUTLIER_DETECTION",
        "CSLB_OUTLIER_EJECTION_TIME",
        "CSLB_OUTLIER_MAX_EJECTION_PERCENTAGE",
    } <= names


def test_outlier_knobs_have_envoys_defaults_for_a_one_second_interval():
    from discovery.settings import OUTLIER_KNOBS, KnobState, outlier_params
    from lbcore.knobs import ROUTING_KNOBS, KnobError, defaults

    st = KnobState(defaults(ROUTING_KNOBS))  # outlier knobs default when not given
    p = outlier_params(st.values())
    assert p.enabled and p.interval_ns == 10**9 and p.window_ns == 10 * 10**9
    assert p.base_ejection_ns == 30 * 10**9 and p.max_ejection_ns == 300 * 10**9
    assert (p.max_ejection_percent, p.consecutive_failures, p.panic_threshold) == (10, 5, 50)
    assert (p.failure_percentage, p.failure_percentage_volume) == (85, 50)
    assert (p.success_rate_stdev, p.success_rate_min_hosts, p.success_rate_volume) == (1.9, 5, 100)
    # The ConfigMap layer sets them like routing knobs, and refuses bad values by name.
    st.set_overlay({"CSLB_OUTLIER_EJECTION_TIME": "5s", "outlier_detection": "off"}, "cm")
    p = outlier_params(st.values())
    assert p.base_ejection_ns == 5 * 10**9 and not p.enabled
    for key, bad in [
        ("CSLB_OUTLIER_MAX_EJECTION_PERCENTAGE", "120"),
        ("CSLB_OUTLIER_CONSECUTIVE_FAILURES", "-1"),
        ("CSLB_OUTLIER_EJECTION_TIME", "0"),
        ("CSLB_OUTLIER_SUCCESS_RATE_STDEV", "inf"),
    ]:
        with pytest.raises(KnobError, match=key):
            st.set_overlay({key: bad}, "cm")
    assert outlier_params(st.values()).base_ejection_ns == 5 * 10**9  # kept
    assert len({k.flag for k in OUTLIER_KNOBS}) == len(OUTLIER_KNOBS)
    # A window shorter than the interval is raised to it.
    st.set_overlay({"CSLB_OUTLIER_INTERVAL": "2", "CSLB_OUTLIER_WINDOW": "1"}, "cm")
    assert outlier_params(st.values()).window_ns == 2 * 10**9
