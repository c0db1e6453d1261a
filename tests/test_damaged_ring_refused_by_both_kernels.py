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
