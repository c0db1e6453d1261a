"""record_start / record_end with a slot map (track()'s one kernel call each) record the
cells record_start / record_end record for the same calls' slots, whichever bucket the
start and the end fall in (the newest one: the fast path; older or newer: the general one),
and whatever else the end says (failures, cut short, slots not promised in range)."""

from __future__ import annotations

import numpy as np
import pytest

import shm
from tests.shm_tests.window import COLS, T0, B, W, row_words, window_store


@pytest.fixture
def stores(namespace):
    a = window_store(namespace + "a", rows=2)
    b = window_store(namespace + "b", rows=2)
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("flags", [False, True])
def test_routed_start_and_end_record_the_cells_of_their_slots(stores, flags):
    a, b = stores
    ra, rb = a.claim(), b.claim()
    rng = np.random.default_rng(12)
    slot_map = rng.permutation(COLS).astype(np.int64)
    now = T0
    for step in range(400):
        idx = rng.integers(-1, COLS, size=int(rng.integers(0, 6))).astype(np.int32)
        slots = slot_map[idx[idx >= 0]]
        # Mostly within one bucket (the fast path), sometimes across one or many.
        now += int(rng.choice([rng.integers(0, B // 50), rng.integers(0, 2 * B), 3 * W]))
        start = now
        bound = None if flags and step % 2 else COLS
        n = ra.record_start(idx, start, bound=bound, slot_map=slot_map)
        assert n == slots.size
        rb.record_start(slots, start)
        now += int(rng.choice([0, rng.integers(0, B // 20), rng.integers(0, 3 * B)]))
        d = now - start
        # The end's flags: some calls failed, or the caller's deadline cut them all short.
        failed = rng.integers(0, 2, size=slots.size).astype(bool) if flags else None
        completed = not flags or step % 3 > 0
        if n:
            ra.record_end(
                idx, start, d, now, failed, bound=bound, slot_map=slot_map, completed=completed
            )
            rb.record_end(slots, start, d, now, failed, completed=completed)
        assert np.array_equal(row_words(a, ra.row), row_words(b, rb.row)), step


def test_endpoints_outside_the_slot_map_record_nothing(stores):
    a, _ = stores
    rec = a.claim()
    slot_map = np.arange(4, dtype=np.int64)
    outside = np.array([0, 4], np.int64)
    before = row_words(a, rec.row).copy()
    with pytest.raises(shm.CounterInputError):
        rec.record_start(outside, T0, slot_map=slot_map)
    with pytest.raises(shm.CounterInputError):
        rec.record_end(outside, T0, 5, T0 + 5, [True, False], slot_map=slot_map)
    assert np.array_equal(row_words(a, rec.row), before)
