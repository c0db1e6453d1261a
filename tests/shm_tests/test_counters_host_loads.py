"""The host's loads read from the counters: per endpoint, open requests' occupancy within the
window, slots newer than a snapshot, and lbcore's load rules on top."""

import numpy as np
import pytest

from shm import CounterInputError, CounterStore
from tests.shm_tests.window import MS, OPEN_PARTS, T0, S, W, block


def test_host_loads_per_endpoint_and_signals(store):
    rec = store.claim()
    rec.record_start([4, 4, 4], T0)
    rec.record_end([4], T0, [100 * MS], T0 + 100 * MS)
    rec.record_start([7], T0)
    rec.record_end([7], T0, [20 * MS], T0 + 20 * MS)
    loads = store.reader().read(T0 + 100 * MS, 8)
    per_endpoint = loads.take([7, 4])  # e.g. Table.slots: endpoint order
    assert per_endpoint.in_flight.tolist() == [0, 2]
    assert np.allclose(per_endpoint.signal("in-flight"), [0, 2])
    assert np.allclose(per_endpoint.signal("occupancy"), per_endpoint.occupancy)
    eff = per_endpoint.signal("effective")
    assert eff[1] == pytest.approx(2 * min(0.1 / loads.global_latency_s, 5))
    with pytest.raises(CounterInputError, match="unknown load signal"):
        loads.signal("cpu")


def test_an_old_open_request_counts_the_window_not_its_age(store):
    """open requests are clipped to the window one by one, not as a cell's
    sum. W = 2 s here; a request open 100 s counts 2 s, one open 1 s counts 1 s."""
    rec, other = store.claim(), store.claim()
    reader = store.reader()
    # Slot 1: the old request's bucket is recycled when time moves on (-> open_old).
    rec.record_start([1], T0 - 100 * S)
    rec.record_start([1], T0 - 1 * S)
    # Slot 2: a worker that recorded nothing since: its bucket column is stale.
    other.record_start([2], T0 - 100 * S)
    rec.record_start([2], T0 - 1 * S)
    # Slot 3: a start older than every kept bucket, recorded late (LockedRecorder threads).
    rec.record_start([3], T0 - 1 * S)
    rec.record_start([3], T0 - 100 * S)
    # Slot 4: ten requests open 100 ms and one open 100 s: (10 x 0.1 + 2) / 2 = 1.5,
    # not min(10 x 0.1 + 100, 11 x 2) / 2 = 11.
    rec.record_start([4], T0 - 100 * S)
    rec.record_start([4] * 10, T0 - 100 * MS)
    loads = reader.read(T0, 5)
    assert loads.in_flight.tolist() == [0, 2, 2, 2, 11]
    assert np.allclose(loads.occupancy, [0, 1.5, 1.5, 1.5, 1.5])
    # Ending them finds each open entry where it is (a kept bucket or open_old).
    rec.record_end([1, 1], [T0 - 100 * S, T0 - 1 * S], [100 * S, S], T0)
    other.record_end([2], T0 - 100 * S, [100 * S], T0)
    rec.record_end([2, 3, 3], [T0 - S, T0 - S, T0 - 100 * S], [S, S, 100 * S], T0)
    rec.record_end([4] * 11, [T0 - 100 * S] + [T0 - 100 * MS] * 10, [100 * S] + [100 * MS] * 10, T0)
    after = reader.read(T0, 5)
    assert after.in_flight.tolist() == [0] * 5
    for r in (rec.row, other.row):
        for part in OPEN_PARTS:
            assert not block(store, r, part).any(), (r, part)
    # Now ended, each request's busy time inside the window counts: min(duration, 2 s).
    assert np.allclose(after.occupancy, [0, 1.5, 1.5, 1.5, 1.5])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_open_request_occupancy_is_off_by_at_most_a_bucket_per_straddling_request(namespace, seed):
    """Random open requests of ages up to 3 windows over several rows: the reader's
    busy time of open requests is exact except for requests that started in the bucket
    holding the window's start, each off by at most one bucket."""
    rng = np.random.default_rng(seed)
    st = CounterStore.create(namespace, rows=4, columns=8, window_ns=W, window_buckets=10)
    b = st.bucket_ns
    recs = [st.claim() for _ in range(4)]
    starts = {r.row: [] for r in recs}
    for t in sorted(rng.integers(T0 - 3 * W, T0, 60).tolist()):
        r = recs[int(rng.integers(0, 4))]
        r.record_start([5], t)
        starts[r.row].append(t)
    got = st.reader().read(T0, 8).occupancy[5] * W
    ages = [T0 - t for ts in starts.values() for t in ts]
    truth = sum(min(a, W) for a in ages)
    straddling = sum((T0 - W) // b == t // b for ts in starts.values() for t in ts)
    assert abs(got - truth) <= straddling * b + 1, (got, truth, straddling)
    st.close()


def test_host_loads_follow_lbcores_load_rules(store):
    """effective load uses lbcore's rule and its latency cap (a pod far
    slower than the rest is capped exactly as lbcore caps it)."""
    from lbcore.signals import load_for

    rec = store.claim()
    rec.record_start([0] * 9 + [1], T0)
    rec.record_end([0] * 9, T0, [10 * MS] * 9, T0 + 10 * MS)
    rec.record_start([1, 2, 2], T0 + 10 * MS)  # slot 1: one more open, one ends slowly
    rec.record_end([1], T0, [900 * MS], T0 + 900 * MS)
    loads = store.reader().read(T0 + 900 * MS, 4)
    ratio = loads.mean_latency_s[1] / loads.global_latency_s
    assert ratio > 5  # beyond lbcore's default cap
    for name in ("effective", "occupancy", "in-flight"):
        want = load_for(
            name, loads.in_flight, loads.occupancy, loads.mean_latency_s, loads.global_latency_s
        )
        assert np.array_equal(loads.signal(name), want), name
    assert np.array_equal(loads.effective(), loads.signal("effective"))


def test_slots_newer_than_a_load_snapshot_count_as_idle(store):
    rec = store.claim()
    rec.record_start([1, 1], T0)
    loads = store.reader().read(T0 + 10 * MS, 4)  # a snapshot of slots 0..3
    per_endpoint = loads.take([1, 9])  # slot 9: an endpoint published after it
    assert per_endpoint.in_flight.tolist() == [2, 0]
    assert per_endpoint.occupancy[1] == 0 and per_endpoint.completed[1] == 0
    assert np.isnan(per_endpoint.mean_latency_s[1]) and np.isnan(per_endpoint.failure_rate[1])
    assert np.allclose(per_endpoint.signal("effective"), [2, 0])
    with pytest.raises(CounterInputError, match="must be >= 0"):
        loads.take([-1])
