"""The pod's load pool: one small shared-memory segment its worker processes record into.

Under gunicorn every worker of a pod is a child of the same master, so the pool is named
after the master (``/cslb.pod-<pid>-<start ticks>.pod``): a pod's workers find each other
with no configuration, and two pods on one machine never share a pool. A process outside
any prefork server names the pool after itself.

Layout (``int64`` words): a header of 8 words (magic, version, size in bytes, rows,
buckets, ``bucket_ns``, ``base_ns``), then :data:`ROWS` rows of :data:`ROW_WORDS` words
(64-byte aligned). A row holds its owner (PID, start ticks), its open requests and the
sum of their start times (relative to ``base_ns``), then per time bucket its period,
busy time, requests and errors. Each row has one writer, the process that claimed it, so
its words are plain aligned stores and readers sum the rows: the host counter matrix's
scheme (``shm.CounterStore``), with no lock shared across processes on the request path.

Rare operations take the segment's ``flock`` (released by the kernel if the holder dies):
claiming a row (a free one, or one whose owner is dead: PID plus start time, so a reused
PID is not taken for the owner), releasing it at exit, and removing the segment when the
last owner leaves. A pool left behind by a master killed with all its workers is removed
by the next pool created on the machine.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import time

import numpy as np

from shm import SegmentError, SegmentMagicError, SegmentSizeError
from shm.locks import segment_lock
from shm.names import SHM_DIR, current_inode, segment_name, unlink_name
from shm.owners import own_start_ticks, process_alive, process_start_ticks
from shm.segment import Segment, attach_initialized
from workers.serving.capacity import gunicorn_worker

__all__ = [
    "BUCKET",
    "HEADER_WORDS",
    "ROWS",
    "ROW_WORDS",
    "Pool",
    "auto_namespace",
    "open_pool",
    "private_pool",
]

MAGIC = int.from_bytes(b"cslbpod1", "little")
VERSION = 1
HEADER_WORDS = 8
ROW_WORDS = 64
#: Rows of a pool: worker processes of one pod that record at once.
ROWS = 128
# Row fields (word offsets): owner, open requests, then BUCKET words per time bucket.
PID, TICKS, OPEN, OPEN_SUM = 0, 1, 2, 3
FIRST_BUCKET = 8
BUCKET = 4  # period, busy_ns, requests, errors
MAX_BUCKETS = (ROW_WORDS - FIRST_BUCKET) // BUCKET
_H_MAGIC, _H_VERSION, _H_SIZE, _H_ROWS, _H_BUCKETS, _H_BUCKET_NS, _H_BASE = range(7)
_KIND = "pod"
_PREFIX = "pod-"


def auto_namespace(pool: str) -> str:
    """Namespace of this process's pool for the ``CSLB_POD_POOL`` setting.

    ``parent``: the parent process (the prefork master); ``process``: this process;
    ``auto``: the parent under gunicorn (its arbiter module is loaded in the worker),
    else this process.
    """
    under_prefork = pool == "parent" or (pool == "auto" and "gunicorn.arbiter" in sys.modules)
    pid = os.getpid()
    if under_prefork:
        # The master gunicorn recorded at the fork: PID 1 when it is a container's first
        # process, which getppid() alone cannot tell from an orphan's adoptive init.
        worker = gunicorn_worker()
        master = getattr(worker, "ppid", None)
        if isinstance(master, int) and master > 0:
            pid = master
        elif os.getppid() > 1:
            pid = os.getppid()
    ticks = process_start_ticks(pid) or 0
    return f"{_PREFIX}{pid}-{ticks}"


class Pool:
    """One mapped pool (shared, or private to this process when no row is free).

    Attributes
    ----------
    words : memoryview
        The segment as signed 64-bit words.
    rows, buckets, bucket_ns, base_ns : int
        Geometry from the header (``bucket_ns`` and ``base_ns`` in nanoseconds,
        CLOCK_MONOTONIC).
    name : str
        POSIX name; empty for a private pool.
    """

    def __init__(self, mm: mmap.mmap | memoryview, name: str, seg: Segment | None) -> None:
        self._seg = seg  # keeps the mapping and its descriptor alive
        self.name = name
        self.words = memoryview(mm).cast("B").cast("q")
        w = self.words
        self.rows, self.buckets, self.bucket_ns, self.base_ns = (
            w[_H_ROWS],
            w[_H_BUCKETS],
            w[_H_BUCKET_NS],
            w[_H_BASE],
        )
        self.table = np.frombuffer(
            mm, dtype=np.int64, count=self.rows * ROW_WORDS, offset=HEADER_WORDS * 8
        ).reshape(self.rows, ROW_WORDS)

    @property
    def shared(self) -> bool:
        """True for a segment other processes see."""
        return bool(self.name)

    def offset(self, row: int) -> int:
        """Word offset of ``row`` in :attr:`words`."""
        return HEADER_WORDS + row * ROW_WORDS


def _size(rows: int) -> int:
    return (HEADER_WORDS + rows * ROW_WORDS) * 8


def _init(w: memoryview, size: int, rows: int, buckets: int, bucket_ns: int, base_ns: int) -> None:
    w[_H_VERSION], w[_H_SIZE], w[_H_ROWS], w[_H_BUCKETS] = VERSION, size, rows, buckets
    w[_H_BUCKET_NS], w[_H_BASE] = bucket_ns, base_ns
    for r in range(rows):
        o = HEADER_WORDS + r * ROW_WORDS + FIRST_BUCKET
        for j in range(buckets):
            w[o + j * BUCKET] = -1  # no bucket holds a period yet
    w[_H_MAGIC] = MAGIC  # last: attachers wait for it


def _check(seg: Segment) -> None:
    w = seg.buf.cast("q")
    if w[_H_MAGIC] != MAGIC or w[_H_VERSION] != VERSION:
        raise SegmentMagicError(seg.name, f"is not a version-{VERSION} cslb pod load pool")
    rows, buckets = w[_H_ROWS], w[_H_BUCKETS]
    if (
        w[_H_SIZE] != seg.size
        or not 1 <= rows <= 4096
        or seg.size != _size(rows)
        or not 2 <= buckets <= MAX_BUCKETS
        or w[_H_BUCKET_NS] <= 0
    ):
        raise SegmentSizeError(seg.name, "header geometry does not match the segment")


def _sweep() -> None:
    """Remove pools whose naming process is gone (a master killed with its workers)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(SHM_DIR):
            head = "cslb." + _PREFIX
            if not (entry.startswith(head) and entry.endswith("." + _KIND)):
                continue
            pid_s, _, ticks_s = entry[len(head) : -len(_KIND) - 1].partition("-")
            if (
                pid_s.isdigit()
                and ticks_s.isdigit()
                and not process_alive(int(pid_s), int(ticks_s))
            ):
                unlink_name("/" + entry)


def _open(name: str, buckets: int, bucket_ns: int, base_ns: int) -> Segment:
    try:
        seg = Segment.create(name, _size(ROWS))
    except SegmentError:
        seg = attach_initialized(name, writable=True, min_size=HEADER_WORDS * 8)
        _check(seg)
        return seg
    _init(seg.buf.cast("q"), seg.size, ROWS, buckets, bucket_ns, base_ns)
    _sweep()
    return seg


def _claim(w: memoryview, rows: int, buckets: int) -> int | None:
    me, ticks = os.getpid(), own_start_ticks()
    for r in range(rows):
        o = HEADER_WORDS + r * ROW_WORDS
        pid = w[o + PID]
        if pid == 0 or not process_alive(pid, w[o + TICKS]):
            w[o + PID] = 0
            for i in range(1, ROW_WORDS):
                w[o + i] = 0
            for j in range(buckets):
                w[o + FIRST_BUCKET + j * BUCKET] = -1
            w[o + TICKS] = ticks
            w[o + PID] = me  # last: readers count rows with an owner
            return r
    return None


def open_pool(namespace: str, window_ns: int, buckets: int) -> tuple[Pool, int]:
    """Map this process's pool (created on first use) and claim a row in it.

    Parameters
    ----------
    namespace
        The pool's namespace (:func:`auto_namespace`).
    window_ns
        Occupancy window in nanoseconds, split into ``buckets`` buckets (used when this
        process creates the pool; attachers take the creator's geometry).
    buckets
        Buckets spanning the window.

    Returns
    -------
    tuple
        ``(pool, row)``. A private pool (one row) when every row is held by a live
        process or the segment cannot be used: this process then reports only itself.
    """
    name = segment_name(namespace, _KIND)
    bucket_ns = -(-window_ns // buckets)
    for _ in range(5):  # the last owner may remove the name between our open and our claim
        try:
            seg = _open(name, buckets + 2, bucket_ns, time.monotonic_ns())
            with segment_lock(name):
                if current_inode(name) != seg.inode:
                    continue
                pool = Pool(seg.buf, name, seg)
                row = _claim(pool.words, pool.rows, pool.buckets)
            if row is not None:
                return pool, row
            break
        except (SegmentError, OSError):
            break
    return private_pool(window_ns, buckets), 0


def private_pool(window_ns: int, buckets: int) -> Pool:
    """A one-row pool in this process's own memory."""
    size = _size(1)
    mm = mmap.mmap(-1, size)
    w = memoryview(mm).cast("q")
    _init(w, size, 1, buckets + 2, -(-window_ns // buckets), time.monotonic_ns())
    _claim(w, 1, buckets + 2)
    return Pool(mm, "", None)


def release(pool: Pool, row: int) -> bool:
    """Give up ``row``; remove the pool if no live process holds a row. True if removed."""
    if not pool.shared:
        return False
    w, o = pool.words, pool.offset(row)
    try:
        with segment_lock(pool.name):
            if w[o + PID] == os.getpid():
                w[o + PID] = 0
                w[o + OPEN] = w[o + OPEN_SUM] = 0
            live = [
                r
                for r in range(pool.rows)
                if (pid := pool.table[r, PID])
                and process_alive(int(pid), int(pool.table[r, TICKS]))
            ]
            if live or current_inode(pool.name) != pool._seg.inode:  # type: ignore[union-attr]
                return False
            return unlink_name(pool.name)
    except (SegmentError, OSError):
        return False
