"""record_start / record_end with a slot map (track()'s one kernel call each) record the
cells record_start / record_end record for the same calls' slots, whichever bucket the
start and the end fall in (the newest one: the fast path; older or newer: the general one)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.shm_tests.window import COLS, T0, B, W, row_words, window_store


@pytest.fixture
def stores(namespace):
    a = window_store(namespace + "a", rows=2)
    b = window_store(namespace + "b", rows=2)
    yield a, b
    a.close()
    b.close()


def test_routed_start_and_end_record_the_cells_of_their_slots(stores):
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
        n = ra.record_start(idx, start, bound=COLS, slot_map=slot_map)
        assert n == slots.size
        rb.record_start(slots, start)
        now += int(rng.choice([0, rng.integers(0, B // 20), rng.integers(0, 3 * B)]))
        d = now - start
        if n:
            ra.record_end(idx, start, d, now, bound=COLS, slot_map=slot_map)
            rb.record_end(slots, start, d, now)
        assert np.array_equal(row_words(a, ra.row), row_words(b, rb.row)), step
