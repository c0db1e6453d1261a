"""What the hostile tests damage: the file behind a segment name, a counter matrix in use,
and the counters as any other process of the user can write them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import shm
import shm.names
from shm.counters.matrix import Control, attach_control
from shm.names import SHM_DIR
from tests.discovery_harness import shm_namespace


def segment_path(name: str) -> str:
    """The file behind the POSIX shared-memory name ``name`` (``/cslb...``)."""
    return os.path.join(SHM_DIR, name.lstrip("/"))


@contextlib.contextmanager
def counters_in_use() -> Iterator[tuple[str, shm.CounterStore, shm.Recorder, shm.CounterReader]]:
    """A 4 x 8 counter matrix in a namespace of its own, one row claimed with a call open
    on slots 1 and 2 (at 1 s), and a reader: ``(namespace, store, recorder, reader)``."""
    with shm_namespace() as ns:
        store = shm.CounterStore.create(ns, rows=4, columns=8)
        try:
            rec = store.claim()
            rec.record_start([1, 2], 10**9)
            yield ns, store, rec, store.reader()
        finally:
            store.close()


def newest_data(namespace: str, kind: str) -> str:
    """The name of the newest data segment of ``kind`` (``"tables"``, ``"counters"``)."""
    epochs = shm.names.epoch_segments(namespace, kind)
    return epochs[max(epochs)]


def shrink(name: str, nbytes: int) -> None:
    """Truncate the segment named ``name`` to ``nbytes`` bytes, under its users' feet."""
    os.truncate(segment_path(name), nbytes)


def writable_counters(namespace: str) -> Control:
    """The counters of ``namespace`` mapped writable a second time, as any process of the
    user can map them: the slot table (``.slots``) and, by ``.current()``, the matrix. What
    a test writes through it reaches the store's rows without going through the store."""
    return attach_control(namespace, writable=True)
