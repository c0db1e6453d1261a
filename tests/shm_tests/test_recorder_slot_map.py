"""A fan-out recorded through a plan's slot map records the cells of its slots, whatever
else it says: failures, cut-short calls, calls whose starts were never recorded, and
unchecked bounds (the general paths behind record_start / record_end's one kernel call)."""

from __future__ import annotations

import numpy as np
import pytest

import shm
from tests.shm_tests.window import COLS, T0, B, row_words, window_store


@pytest.fixture
def stores(namespace):
    a = window_store(namespace + "a", rows=2)
    b = window_store(namespace + "b", rows=2)
    yield a, b
    a.close()
    b.close()


def test_ends_with_failures_or_flags_record_the_cells_of_their_slots(stores):
    a, b = stores
    ra, rb = a.claim(), b.claim()
    rng = np.random.default_rng(7)
    slot_map = rng.permutation(COLS).astype(np.int64)
    now = T0
    for step in range(200):
        idx = rng.integers(-1, COLS, size=int(rng.integers(1, 6))).astype(np.int64)
        slots = slot_map[idx[idx >= 0]]
        now += int(rng.integers(0, B // 10))
        start = now
        bound = COLS if step % 2 else None
        assert ra.record_start(idx, start, bound=bound, slot_map=slot_map) == slots.size
        assert rb.record_start(slots, start) == slots.size
        now += int(rng.integers(0, 2 * B))
        failed = rng.integers(0, 2, size=slots.size).astype(bool)
        completed = bool(step % 3)
        ra.record_end(
            idx, start, now - start, now, failed, bound=bound, slot_map=slot_map,
            completed=completed,
        )  # fmt: skip
        rb.record_end(slots, start, now - start, now, failed, completed=completed)
        assert np.array_equal(row_words(a, ra.row), row_words(b, rb.row)), step


def test_endpoints_outside_the_slot_map_record_nothing(stores):
    a, _ = stores
    rec = a.claim()
    slot_map = np.arange(4, dtype=np.int64)
    before = row_words(a, rec.row).copy()
    with pytest.raises(shm.CounterInputError):
        rec.record_start(np.array([0, 4], np.int64), T0, slot_map=slot_map)
    with pytest.raises(shm.CounterInputError):
        rec.record_end(np.array([0, 4], np.int64), T0, 5, T0 + 5, [True, False], slot_map=slot_map)
    assert np.array_equal(row_words(a, rec.row), before)
