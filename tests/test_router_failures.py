"""A failing pod does not look idle to bounded load: failed calls count as calls of the
host's mean latency (lbcore.signals.with_failures through shm.HostLoads.signal)."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

import lbcore
from lbcore.outlier import FAIL_CONNECT
from lbcore.route import route_ring_set
from lbcore.signals import with_failures
from tests.router_harness import KEYS, Clock, Host, endpoints, knobs

MS = 1_000_000


@pytest.fixture
def host():
    h = Host(f"rf{os.getpid()}x{uuid.uuid4().hex[:8]}", Clock())
    yield h
    h.close()  # (the owner's close unlinks the tables and counters)


def record(host, slots, calls, duration_ns, kind=None):
    """``calls`` calls to ``slots`` that ended, started 3 s ago, all failing if ``kind``."""
    rec = host.store.claim()
    s = np.repeat(np.asarray(slots, dtype=np.int64), calls)
    start = host.clock() - 3_000_000_000
    rec.record_start(s, start)
    failed = None if kind is None else np.full(s.size, kind)
    rec.record_end(s, start, np.full(s.size, duration_ns, np.int64), start + duration_ns, failed)
    return rec


def test_a_pod_refusing_connections_draws_no_spill(host):
    """Pod 0 is hot and spills; pod 3 refuses every call in 0.2 ms, and has drawn spill for
    a while (more calls than a healthy pod). By busy time alone it is the idlest pod, the
    first one under the bar clockwise after pod 0 for a share of pod 0's keys; counted as
    calls of the host's mean latency, its failures put it over the bar, as the same calls
    would put a healthy pod."""
    signal = "occupancy"
    eps = endpoints(6)
    rs = lbcore.RingSet(eps)
    host.publish(rs, knobs=knobs(balance_factor=1.25, max_hops=None, load_signal=signal))
    r = host.router(refresh_s=0.5)
    slots = np.asarray(r.table().slots)
    recs = [
        record(host, slots[[0]], 40, 50 * MS),
        record(host, slots[[1, 2, 4, 5]], 20, 50 * MS),
        record(host, slots[[3]], 45, MS // 5, kind=FAIL_CONNECT),
    ]
    host.clock.advance(1.0)
    idx = r.route(KEYS)
    loads = r.loads()
    assert loads.occupancy[3] < 0.001  # as measured: almost idle
    sig = loads.signal(signal)
    assert sig[3] > sig[[1, 2, 4, 5]].max()  # as bounded load sees it: busier than healthy
    plain = route_ring_set(rs, KEYS, host.clock())
    spilled = (idx != plain) & (plain == 0)
    assert spilled.sum() > 200  # the hot pod sheds keys...
    assert not (idx[plain != 3] == 3).any()  # ...and none of anyone's lands on pod 3
    # Measured by busy time alone, pod 3 would have taken a share of the spill.
    occ, lat = loads.occupancy, loads.mean_latency_s
    raw = lbcore.signals.load_for(signal, loads.in_flight, occ, lat, loads.global_latency_s)
    inc = loads.bar_increment(signal)
    naive = route_ring_set(
        rs,
        KEYS,
        host.clock(),
        loads=lbcore.bounded.in_call_units(raw, inc),
        balance_factor=1.25,
    )
    assert (naive[plain == 0] == 3).sum() > 20
    # The effective signal sees it busy too (measured, it would be the least loaded).
    eff = loads.signal("effective")
    assert eff[3] > eff[[1, 2, 4, 5]].max()
    assert (
        lbcore.signals.effective_load(loads.in_flight, occ, lat, loads.global_latency_s)[3] < 0.01
    )
    for rec in recs:
        rec.release()


def test_failures_count_as_calls_of_mean_latency():
    occ, lat = with_failures(
        [0.2, 0.0, 0.1], [0.05, 0.0002, np.nan], [40, 36, 0], [0, 36, 0], 0.04, 10.0
    )
    assert occ.tolist() == pytest.approx([0.2, 36 * 0.04 / 10, 0.1])
    assert lat[0] == pytest.approx(0.05) and lat[1] == pytest.approx(0.0402)
    assert np.isnan(lat[2])
    # Nothing failed, or no host latency known: unchanged.
    same = with_failures([0.2], [0.05], [4], [0], 0.04, 10.0)
    assert same[0].tolist() == [0.2] and same[1].tolist() == [0.05]
    unknown = with_failures([0.2], [0.05], [4], [4], float("nan"), 10.0)
    assert unknown[0].tolist() == [0.2]
