"""The counter window the counter tests record into, and a store with it."""

from __future__ import annotations

from shm import CounterStore

S = 1_000_000_000
MS = 1_000_000
BUCKETS = 10
W = 2 * S  # the window: 2 s in 10 buckets of 200 ms
B = W // BUCKETS
T0 = 1_000 * S  # a time aligned with the buckets
COLS = 16


def window_store(namespace: str, rows: int, columns: int = COLS) -> CounterStore:
    """A new counter matrix of ``rows`` x ``columns`` with the tests' window."""
    return CounterStore.create(
        namespace, rows=rows, columns=columns, window_ns=W, window_buckets=BUCKETS
    )


def row_words(store: CounterStore, row: int):
    """A copy of one counter row's words, as the matrix holds them."""
    return store.matrix_view().words[row].copy()


def raw(store: CounterStore, row: int):
    """A copy of one counter row's fields, by name."""
    return store.matrix_view().fields[row].copy()


def block(store: CounterStore, row: int, name: str):
    """A copy of one part of a row: ``open_old`` or a per-bucket field."""
    return store.matrix_view().block(row, name).copy()


# The parts of a row that follow the open requests.
OPEN_PARTS = ("open_old", "open", "open_start_sum")
