"""A ring owner out of range (a table damaged after its reader checked it) is refused by
both kernels alike, with lbcore.TableDataError: for a batch that meets it and for every
position's answers, never an IndexError, nor an answer indexed from the array's end."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
from tests.kernel_harness import on
from tests.router_harness import endpoints

KERNELS = ["numpy"] + (["native"] if lbcore.kernel.load_native() is not None else [])
N = 12


@pytest.mark.parametrize("bad", [-1, -5, -(2**31), N, 2**31 - 1])
@pytest.mark.parametrize("loads", [None, "loaded"])
def test_a_batch_meeting_a_damaged_owner_raises_table_data_error(bad, loads):
    for k in KERNELS:

        def routed():
            rs = lbcore.RingSet(endpoints(N))
            kw = {} if loads is None else {"loads": np.arange(N, dtype=np.float64)}
            plan = lbcore.Plan(rs, 0, **kw)
            plan.newest.owners[7] = bad
            h = plan.newest.hashes.copy()  # a key on every ring node, the damaged one too
            return plan.route_hashes(h, 0)

        got = on(k, routed)
        assert got[:2] == ("error", lbcore.TableDataError), (k, got)
        assert "out of range" in got[2]


@pytest.mark.parametrize("bad", [-1, N])
def test_every_positions_answers_of_a_damaged_ring_are_refused(bad):
    for k in KERNELS:

        def answered():
            plan = lbcore.Plan(lbcore.RingSet(endpoints(N)), 0, loads=np.ones(N))
            plan.newest.owners[7] = bad
            return plan.answers()

        got = on(k, answered)
        assert got[:2] == ("error", lbcore.TableDataError), (k, got)


@pytest.mark.parametrize("bad", [-1, -5, N, 2**31 - 1])
@pytest.mark.parametrize("loads", [None, "loaded"])
def test_an_owner_damaged_after_the_batch_began_is_refused_where_it_is_read(
    monkeypatch, bad, loads
):
    """The NumPy reference checks the owners it indexes with, not an earlier read of the
    ring: damage once the batch is under way (here as it looks up the keys' positions,
    after any up-front check) still raises TableDataError, never an IndexError nor an
    answer indexed from the end. (The native kernel reads each owner once, checked: no
    window to hit from Python.)"""
    real = lbcore.Ring.positions

    def damage_then_look_up(ring, h):
        ring.owners[7] = bad
        return real(ring, h)

    def routed():
        rs = lbcore.RingSet(endpoints(N))
        kw = {} if loads is None else {"loads": np.arange(N, dtype=np.float64)}
        plan = lbcore.Plan(rs, 0, **kw)
        h = plan.newest.hashes.copy()
        monkeypatch.setattr(lbcore.Ring, "positions", damage_then_look_up)
        try:
            return plan.route_hashes(h, 0)
        finally:
            monkeypatch.setattr(lbcore.Ring, "positions", real)

    got = on("numpy", routed)
    assert got[:2] == ("error", lbcore.TableDataError), got
    assert "out of range" in got[2]
