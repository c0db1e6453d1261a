"""The pods' load reports in the counter rows: one writer per row, readers take the newest.

Real shared memory: rows claimed from a real store, read by a real reader.
"""

from __future__ import annotations

import math
import multiprocessing

import numpy as np
import pytest

import shm
from lbcore.report_settings import ReportSettings
from lbcore.reported import (
    KIND_NONE,
    KIND_OCCUPANCY,
    KIND_UTILIZATION,
    STATUS_BLACKOUT,
    STATUS_FRESH,
    pod_identity,
    report_status,
)
from shm.counters.reports import F_AT, F_KIND, F_SINCE, F_VALUE, merge_reports
from shm.errors import CounterInputError, SegmentVersionError
from shm.layout import LAYOUT_VERSION, REPORT_FIELDS
from shm.names import segment_name
from shm.segment import Segment
from tests.shm_damage import writable_counters

S = 1_000_000_000
EXPIRY = 30 * S
A = pod_identity("http://10.0.0.1:8080")
B = pod_identity("http://10.0.0.2:8080")


def _store(namespace: str, columns: int = 16) -> shm.CounterStore:
    return shm.CounterStore.create(namespace, rows=8, columns=columns)


def _put(rec, slot, value, now, ident=A, kind=KIND_OCCUPANCY, util=0.5):
    rec.record_reports([slot], [value], [util], [kind], [ident], now, EXPIRY)


def test_no_report_reads_as_none(namespace):
    with _store(namespace) as store:
        store.claim()
        state, util = store.reader().reports(100 * S, EXPIRY)
        assert (state.kind == KIND_NONE).all()
        assert np.isnan(state.value).all() and np.isnan(util).all()


def test_a_report_reaches_every_reader_and_the_newest_row_wins(namespace):
    with _store(namespace) as store:
        r1, r2 = store.claim(), store.claim()
        _put(r1, 3, 2.5, 10 * S, util=0.4)
        _put(r2, 3, 7.0, 12 * S, util=0.9)
        _put(r1, 4, 1.0, 11 * S, kind=KIND_UTILIZATION, util=1.0)
        reader = shm.CounterReader(namespace)
        state, util = reader.reports(20 * S, EXPIRY)
        assert state.value[3] == 7.0 and state.kind[3] == KIND_OCCUPANCY
        assert state.at_ns[3] == 12 * S and util[3] == pytest.approx(0.9)
        assert state.identity[3] == np.uint64(A)
        assert state.kind[4] == KIND_UTILIZATION and state.value[4] == 1.0
        # The run began with row 1's first report: a worker's first report of the pod
        # does not restart the host's blackout.
        assert state.since_ns[3] == 10 * S
        # Newer in the older row again: that row's report is taken.
        _put(r1, 3, 1.5, 13 * S)
        state, _ = reader.reports(20 * S, EXPIRY)
        assert state.value[3] == 1.5 and state.since_ns[3] == 10 * S


def test_run_start_across_rows_ignores_a_lapsed_run(namespace):
    with _store(namespace) as store:
        r1, r2 = store.claim(), store.claim()
        _put(r1, 0, 1.0, 1 * S)
        _put(r2, 0, 2.0, 1 * S + EXPIRY + S)  # after row 1's report expired: a new run
        state, _ = store.reader().reports(1 * S + EXPIRY + 2 * S, EXPIRY)
        assert state.since_ns[0] == 1 * S + EXPIRY + S


def test_identity_change_starts_a_new_run(namespace):
    with _store(namespace) as store:
        r1, r2 = store.claim(), store.claim()
        _put(r1, 0, 1.0, 1 * S, ident=A)
        _put(r1, 0, 1.0, 5 * S, ident=A)
        _put(r2, 0, 2.0, 6 * S, ident=B)  # another pod on the slot, seen by row 2
        state, _ = store.reader().reports(7 * S, EXPIRY)
        assert state.identity[0] == np.uint64(B) and state.since_ns[0] == 6 * S
        settings = ReportSettings(enabled=True, blackout_ns=10 * S)
        assert report_status(state, 7 * S, settings)[0] == STATUS_BLACKOUT
        # the same row: its own run restarts too
        _put(r1, 0, 1.0, 8 * S, ident=B)
        state, _ = store.reader().reports(9 * S, EXPIRY)
        assert state.since_ns[0] == 6 * S
        assert report_status(state, 17 * S, settings)[0] == STATUS_FRESH


def test_a_reused_slot_forgets_its_reports(namespace):
    with _store(namespace) as store:
        r1, r2 = store.claim(), store.claim()
        _put(r1, 2, 1.0, 1 * S)
        _put(r2, 2, 3.0, 2 * S)
        _put(r2, 5, 3.0, 2 * S)
        store.reset_totals([2])
        state, util = store.reader().reports(3 * S, EXPIRY)
        assert state.kind[2] == KIND_NONE and math.isnan(util[2])
        assert state.kind[5] == KIND_OCCUPANCY  # other slots keep theirs


def test_reports_survive_growth(namespace):
    with _store(namespace, columns=8) as store:
        rec = store.claim()
        _put(rec, 7, 4.0, 1 * S)
        store.ensure_columns(100)
        _put(rec, 90, 5.0, 2 * S)
        state, _ = store.reader().reports(3 * S, EXPIRY)
        assert state.value[7] == 4.0 and state.value[90] == 5.0


def test_bad_slots_are_refused(namespace):
    with _store(namespace) as store:
        rec = store.claim()
        with pytest.raises(CounterInputError):
            rec.record_reports([99], [1.0], [0.1], [1], [A], S, EXPIRY)
        with pytest.raises(CounterInputError):
            rec.record_reports([1, 1], [1.0, 2.0], [0.1, 0.2], [1, 1], [A, A], S, EXPIRY)


def test_garbage_cells_count_as_no_report_and_never_raise(namespace):
    rng = np.random.default_rng(7)
    with _store(namespace) as store:
        rec = store.claim()
        other = store.claim()
        _put(rec, 0, 1.0, 5 * S)
        m = writable_counters(namespace).current()  # (as another process would)
        # Random words in every report cell of another row, many times over.
        for _ in range(200):
            m.reports[other.row] = rng.integers(-(1 << 63), 1 << 63, m.reports[other.row].shape)
            state, _ = store.reader().reports(10 * S, EXPIRY)
            ok = state.kind != KIND_NONE
            assert np.isfinite(state.value[ok]).all() and (state.value[ok] >= 0).all()
            assert (state.at_ns[ok] <= 10 * S).all() and (state.since_ns <= state.at_ns).all()
        # Hand-made garbage: NaN, negative, inf, huge values; future times; bad kinds.
        cells = np.zeros((1, len(REPORT_FIELDS), 6), np.int64)
        values = np.array([np.nan, -1.0, np.inf, 1e300, 1.0, 1.0])
        cells[0, F_VALUE] = values.view(np.int64)
        cells[0, F_KIND] = [1, 1, 1, 1, 7, 1]
        cells[0, F_AT] = [S, S, S, S, S, 99 * S]
        cells[0, F_SINCE] = S
        state, _ = merge_reports(cells, 10 * S, EXPIRY)
        assert (state.kind == KIND_NONE).all()


def _writer(namespace: str, slot: int, value: float, now: int, go) -> None:
    store = shm.CounterStore.attach(namespace)
    rec = store.claim()
    _put(rec, slot, value, now)
    go.set()


def test_a_report_written_by_another_process_is_seen(namespace):
    with _store(namespace) as store:
        store.claim()
        go = multiprocessing.get_context("spawn").Event()
        p = multiprocessing.get_context("spawn").Process(
            target=_writer, args=(namespace, 6, 2.25, 3 * S, go)
        )
        p.start()
        try:
            assert go.wait(30)
            state, _ = store.reader().reports(4 * S, EXPIRY)
            assert state.value[6] == 2.25
        finally:
            p.join(30)
            if p.is_alive():
                p.kill()


def test_older_counters_are_refused_by_version(namespace):
    with _store(namespace):
        ctl = Segment.attach(segment_name(namespace, "counters"), writable=True)
        ctl.words[1] = LAYOUT_VERSION - 1
        with pytest.raises(SegmentVersionError, match="layout version"):
            shm.CounterReader(namespace)
