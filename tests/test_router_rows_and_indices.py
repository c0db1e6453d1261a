"""The router's counter row (claimed, refused, shared by threads) and the indices it
tracks (per thread, copied, checked), with the product ID in failure lines."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
import shm
from tests.test_router import (  # noqa: F401
    Host,
    _no_leftovers,
    clock,
    endpoints,
    host,
    namespace,
)
from workers.routing import router as workers_router


def test_fail_logs_the_product_id_of_the_failed_call_after_fallbacks(host, caplog):  # noqa: F811
    import json
    import logging

    host.publish(lbcore.RingSet(endpoints(4)))
    r = host.router()
    keys = ["p0", "p1", "p2", "p3"]
    idx, table = r.route_table(keys)
    idx[[0, 1]] = -1  # the first two went through the ingress
    with (
        caplog.at_level(logging.WARNING, logger="cslb.router"),
        r.track(idx, table, keys=keys) as t,
    ):
        t.fail(3)
    (line,) = [json.loads(m) for m in caplog.messages if "cslb_call_failed" in m]
    assert line["product_id"] == "p3" and line["call"] == 3


def test_a_row_not_reserved_for_us_still_gets_a_row(host, monkeypatch):  # noqa: F811
    host.publish(lbcore.RingSet(endpoints(3)))
    other = host.store.claim()
    monkeypatch.setenv("CSLB_COUNTER_ROW", str(other.row))
    r = host.router(row=other.row)
    assert r.row is not None and r.row != other.row and not r.adopted
    other.release()


def test_last_routed_is_per_thread(host):  # noqa: F811
    import threading

    eps = endpoints(5)
    host.publish(lbcore.RingSet(eps), knobs=shm.Knobs(balance_factor=None))
    r = host.router()
    idx = r.route(["k1", "k2"])
    # A newer table lists other endpoints: only the thread that routed idx maps it
    # on its table; another thread's last call is not this one (the current table).
    newer = [f"http://10.9.9.{i}:80" for i in range(5)]
    host.publish(lbcore.RingSet(newer), knobs=shm.Knobs(balance_factor=None))
    r.refresh()
    assert r.table().endpoints == tuple(newer)
    got: list = []
    th = threading.Thread(target=lambda: got.append(r.endpoints_of(idx)))
    th.start()
    th.join(10)
    assert got == [[newer[i] for i in idx]]
    assert r.endpoints_of(idx) == [eps[i] for i in idx]
    assert r.endpoints_of(idx[1:]) == [eps[idx[1]]]  # a view of it too


def test_tracker_copies_the_indices(host, caplog):  # noqa: F811
    """Nit: mutating the caller's array inside the block does not change fail(i)."""
    import json
    import logging

    eps = endpoints(4)
    host.publish(lbcore.RingSet(eps))
    r = host.router()
    keys = ["p0", "p1"]
    idx, table = r.route_table(keys)
    want = eps[int(idx[1])]
    with (
        caplog.at_level(logging.WARNING, logger="cslb.router"),
        r.track(idx, table, keys=keys) as t,
    ):
        idx[:] = (idx + 1) % 4
        t.fail(1)
    (line,) = [json.loads(m) for m in caplog.messages if "cslb_call_failed" in m]
    assert line["endpoint"] == want


def test_unsigned_indices_beyond_the_table_are_rejected(host):  # noqa: F811
    host.publish(lbcore.RingSet(endpoints(3)))
    r = host.router()
    t = r.table()
    for bad in (np.array([2**64 - 1], np.uint64), np.array([3], np.uint8)):
        with pytest.raises(workers_router.RouterInputError, match=r"-1\.\.2"):
            r.endpoints_of(bad, t)
    assert r.endpoints_of(np.array([2], np.uint64), t) == [t.endpoints[2]]


def test_a_refused_row_is_asked_for_once(namespace, clock, caplog):  # noqa: F811
    """Nit: while no row is free, the refusal of the env row is not logged every second."""
    import logging

    one_row = Host(namespace, clock, rows=1)
    try:
        one_row.publish(lbcore.RingSet(endpoints(3)))
        other = one_row.store.claim()
        with caplog.at_level(logging.WARNING, logger="cslb.router"):
            r = one_row.router(row=other.row)
            for _ in range(4):
                clock.advance(1.1)
                r.route(["a"])
            assert r.row is None
            other.release()
            clock.advance(1.1)
            r.route(["a"])
        assert caplog.text.count("counter row 0 is not reserved") == 1
        assert caplog.text.count("no counter row") == 1
        assert r.row == other.row and not r.adopted
    finally:
        one_row.close()


def test_threads_share_the_row_through_a_locked_recorder(host):  # noqa: F811
    host.publish(lbcore.RingSet(endpoints(3)))
    assert isinstance(host.router(threads=True).recorder, shm.LockedRecorder)
    assert isinstance(host.router().recorder, shm.LockedRecorder)  # the default: gthread-safe
    assert not isinstance(host.router(threads=False).recorder, shm.LockedRecorder)
