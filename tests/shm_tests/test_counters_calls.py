"""Recorder.add_calls (a batching caller's step) records the cells record_end and
record_start record for the same calls, on both kernels, and refuses bad input whole."""

from __future__ import annotations

import numpy as np
import pytest

from lbcore.outlier import FAILURE_KINDS
from shm import CounterInputError
from tests.shm_tests.window import COLS, T0, B, W, row_words


def by_parts(rec, ended, done, starts, now):
    """The step as the ledger wrote it before: record_end per part, then record_start."""
    for flat, opened in ((ended, True), (done, False)):
        if not flat:
            continue
        slot, began, end, kind = np.array(flat, np.int64).reshape(-1, 4).T.copy()
        d = np.maximum(end - began, 0)
        cut = kind < 0
        if cut.any():
            rec.record_end(slot[cut], began[cut], d[cut], now, None, opened=opened, completed=False)
        ok = ~cut
        if ok.any():
            k = kind[ok]
            rec.record_end(slot[ok], began[ok], d[ok], now, k if k.any() else None, opened=opened)
    if starts:
        pairs = [key for key, n in starts.items() for _ in range(n)]
        s, t = np.array(pairs, np.int64).T.copy()
        rec.record_start(s, t)


def random_step(rng, now):
    def calls(n):
        flat = []
        for _ in range(n):
            st = now - int(rng.choice([rng.integers(0, B), rng.integers(0, 3 * W)]))
            end = min(now, st + int(rng.integers(0, 2 * W)))
            kind = int(rng.choice([0, 0, 0, -1, *range(1, len(FAILURE_KINDS) + 1)]))
            flat += (int(rng.integers(0, COLS)), st, end, kind)
        return flat

    starts = {}
    for _ in range(int(rng.integers(0, 12))):
        key = (int(rng.integers(0, COLS)), now - int(rng.choice([0, rng.integers(0, 3 * W)])))
        starts[key] = starts.get(key, 0) + int(rng.integers(1, 3))
    return calls(int(rng.integers(0, 30))), calls(int(rng.integers(0, 10))), starts


def test_a_step_records_what_its_parts_record(store, kernel):
    old, new = store.claim(), store.claim()
    rng = np.random.default_rng(5)
    now = T0
    for _ in range(150):
        now += int(rng.choice([1, B // 3, B, 4 * B, 3 * W]))
        ended, done, starts = random_step(rng, now)
        by_parts(old, ended, done, starts, now)
        new.add_calls(ended, done, starts, now)
        assert row_words(store, new.row).tolist() == row_words(store, old.row).tolist()
    assert row_words(store, new.row).any()


def test_a_step_with_a_bad_slot_or_kind_records_nothing(store, kernel):
    rec = store.claim()
    rec.add_calls([1, T0, T0 + 5, 0], [], {(2, T0): 1}, T0 + 10)
    before = row_words(store, rec.row)
    bad_steps = [
        ([1, T0, T0 + 5, 0, COLS, T0, T0 + 5, 0], [], {}, "slots must be in 0..15"),
        ([], [-1, T0, T0 + 5, 0], {}, "got -1"),
        ([1, T0, T0 + 5, len(FAILURE_KINDS) + 1], [], {}, "failure kinds"),
        ([1, T0, T0 + 5, -2], [], {}, "failure kinds"),
        ([1, T0, T0 + 5, 0], [], {(COLS, T0): 1}, "slots must be in"),
        ([1, -5, T0, 0], [], {}, "times must be in"),
        ([1, T0, T0 + 5, 0], [], {(1, T0): -1}, "call counts"),
        ([1, T0, T0 + 5, 0.5], [], {}, "must be ints"),
        ([1, T0, T0 + 5], [], {}, "4 ints per call"),
    ]
    for ended, done, starts, match in bad_steps:
        with pytest.raises(CounterInputError, match=match):
            rec.add_calls(ended, done, starts, T0 + 20)
        assert row_words(store, rec.row).tolist() == before.tolist()


def test_a_step_follows_counters_that_grew(store, kernel):
    rec = store.claim()
    store.ensure_columns(40)  # another process grew the counters meanwhile
    rec.add_calls([], [], {(30, T0): 2}, T0)
    rec.add_calls([30, T0, T0 + 7, 0], [], {}, T0 + 9)
    loads = store.reader().read(T0 + 10)
    assert loads.requests_total[30] == 1 and loads.in_flight[30] == 1
