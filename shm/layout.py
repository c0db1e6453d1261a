"""Byte layout of every cslb shared-memory segment, in one place.

Four kinds of segment exist per namespace (``<ns>``):

=====================================  ==================================================
``/cslb.<ns>.tables``                  tables *control*: which data segment and buffer is
                                       current, the writer's PID, the heartbeat
``/cslb.<ns>.tables.<epoch>``          tables *data*: two buffers (double buffer), each a
                                       64-byte buffer header followed by one encoded table
``/cslb.<ns>.counters``                counters *control*: geometry, which data segment is
                                       current, the worker-slot table (owners)
``/cslb.<ns>.counters.<epoch>``        counters *data*: one row of counters per worker slot
=====================================  ==================================================

Every segment starts with the same four 8-byte words: ``magic`` (eight ASCII bytes
naming the kind), ``version`` (:data:`LAYOUT_VERSION`), ``size`` (the segment's size in
bytes, checked against the real size before any offset is trusted) and ``epoch`` (0 for
control segments, the data segment's number otherwise). All fields are naturally aligned
8-byte words in the host's byte order (a segment never leaves its host), so a single
aligned load or store of a field is indivisible on every 64-bit CPU CPython supports.

Headers are NumPy structured dtypes; :func:`word` gives a field's index as a ``uint64``
word, which the hot paths read through a ``memoryview`` rather than as NumPy scalars
(cheaper per load).
"""

from __future__ import annotations

import numpy as np

from lbcore.outlier import FAILURE_KINDS

__all__ = [
    "BUCKET_FIELDS",
    "BUFFER_HEADER",
    "BUFFER_HEADER_BYTES",
    "CONTROL_BYTES",
    "COUNTERS_CONTROL",
    "COUNTERS_DATA",
    "COUNTER_FIELDS",
    "DATA_HEADER_BYTES",
    "DIRECTORY_OFFSET",
    "KIND_FIELDS",
    "KIND_NAMES",
    "KIND_TOTAL_FIELDS",
    "LAYOUT_VERSION",
    "MAGIC_COUNTERS_CONTROL",
    "MAGIC_COUNTERS_DATA",
    "MAGIC_PAYLOAD",
    "MAGIC_TABLES_CONTROL",
    "MAGIC_TABLES_DATA",
    "OPEN_FIELDS",
    "PAYLOAD_HEADER",
    "REPORT_FIELDS",
    "SECTION",
    "SLOT",
    "SLOT_CLAIMED",
    "SLOT_FREE",
    "SLOT_RESERVED",
    "STATS_FIELDS",
    "STATS_WORDS",
    "STATUS_HEADER",
    "STATUS_MAX_BYTES",
    "STATUS_OFFSET",
    "TABLES_CONTROL",
    "TABLES_DATA",
    "TABLE_SECTIONS",
    "TOTAL_FIELDS",
    "align",
    "cell_words",
    "magic_word",
    "ring_sections",
    "row_layout",
    "table_sections",
    "word",
]

#: Layout version of every segment kind; bump on any incompatible change.
#: 2: open requests are kept per start bucket (``open``, ``open_start_sum``) plus a
#: count of older ones (``open_old``), replacing ``in_flight`` and ``start_sum``.
#: 4: tables no longer repeat the newest ring's owners (the last row of ``owner_table``
#: is that array) and are checksummed with XXH3-64 instead of CRC-32.
#: 5: counters keep failures per kind (:data:`KIND_FIELDS`, :data:`KIND_TOTAL_FIELDS`);
#: tables carry outlier-ejection state and no longer a ``weight`` section.
#: 6: tables no longer carry ``ring_pos`` and ``owner_table`` (nothing read them); every
#: ring, the newest too, has its own owners section.
#: 7: counter rows end with the pods' latest load reports (:data:`REPORT_FIELDS`).
#: 8: tables carry the zone record (the caller's zone and the zone controller's curve:
#: the ``zone_*`` header fields and the ``caller_zone`` section); a counter row's
#: lifetime totals take 16 words (:data:`STATS_WORDS`), adding the fan-out's calls by
#: locality.
LAYOUT_VERSION = 8


def magic_word(tag: bytes) -> int:
    """The ``uint64`` a segment's first word holds for an 8-byte ASCII ``tag``."""
    if len(tag) != 8:
        raise ValueError(f"magic tags are 8 bytes, got {tag!r}")
    return int.from_bytes(tag, "little")


MAGIC_TABLES_CONTROL = magic_word(b"CSLBtctl")
MAGIC_TABLES_DATA = magic_word(b"CSLBtdat")
MAGIC_COUNTERS_CONTROL = magic_word(b"CSLBcctl")
MAGIC_COUNTERS_DATA = magic_word(b"CSLBcdat")
MAGIC_PAYLOAD = magic_word(b"CSLBtabl")

#: What each magic means, for error messages about foreign segments.
KIND_NAMES = {
    MAGIC_TABLES_CONTROL: "a cslb tables control segment",
    MAGIC_TABLES_DATA: "a cslb tables data segment",
    MAGIC_COUNTERS_CONTROL: "a cslb counters control segment",
    MAGIC_COUNTERS_DATA: "a cslb counters data segment",
}

_COMMON = [("magic", "u8"), ("version", "u8"), ("size", "u8"), ("epoch", "u8")]


def align(n: int, to: int = 64) -> int:
    """``n`` rounded up to a multiple of ``to`` (bytes)."""
    return (n + to - 1) // to * to


def word(dtype: np.dtype, field: str) -> int:
    """Index of ``field`` of a header ``dtype`` counted in 8-byte words."""
    offset = dtype.fields[field][1]
    assert offset % 8 == 0, (dtype, field)
    return offset // 8


# ------------------------------------------------------------------------------------
# Tables.

#: Size of the tables control segment and of the header region of a data segment (bytes).
CONTROL_BYTES = 4096
DATA_HEADER_BYTES = 4096

#: ``current`` packs ``epoch << 1 | buffer``: one word, so a reader never sees the
#: epoch of one publish with the buffer index of another. 0 means "nothing published".
TABLES_CONTROL = np.dtype(
    [
        *_COMMON,
        ("current", "u8"),
        ("generation", "u8"),  # generation of the current buffer (the buffer header rules)
        ("writer_pid", "u8"),
        ("writer_start", "u8"),  # writer's start time in clock ticks since boot (/proc)
        ("heartbeat_ns", "i8"),  # CLOCK_MONOTONIC
        ("created_ns", "i8"),
    ]
)

#: The publisher's status, in the tables control segment at :data:`STATUS_OFFSET`: what
#: it reports about its sources (empty: nothing wrong), written next to the heartbeat
#: without a publish. ``seq`` is odd while the writer rewrites it (a seqlock);
#: ``since_ns`` (CLOCK_MONOTONIC) is when the reported problem began; ``nbytes`` of UTF-8
#: text follow the header. A segment whose writer never wrote one reads all zeros: no
#: problem, so readers and writers of layout 4 without it agree.
STATUS_HEADER = np.dtype([("seq", "u8"), ("since_ns", "i8"), ("nbytes", "u8")])
STATUS_OFFSET = 1024
STATUS_MAX_BYTES = CONTROL_BYTES - STATUS_OFFSET - 64

TABLES_DATA = np.dtype(
    [
        *_COMMON,
        ("buffer_offset0", "u8"),
        ("buffer_offset1", "u8"),
        ("buffer_bytes", "u8"),  # size of each buffer: buffer header + payload capacity
    ]
)

#: Header of each of the two buffers of a data segment. ``seq`` is odd while the
#: writer rewrites the buffer and grows by two with every rewrite; ``checksum`` is the
#: XXH3-64 of the payload (:func:`lbcore.hashing.digest`).
BUFFER_HEADER = np.dtype(
    [("seq", "u8"), ("generation", "u8"), ("payload_bytes", "u8"), ("checksum", "u8")]
)
BUFFER_HEADER_BYTES = 64

#: Fixed part of an encoded table; the section directory follows it.
PAYLOAD_HEADER = np.dtype(
    [
        ("magic", "u8"),
        ("generation", "u8"),
        ("published_ns", "i8"),
        ("publisher_pid", "u8"),
        ("endpoints", "u8"),
        ("rings", "u8"),
        ("vnodes", "u8"),
        ("slots", "u8"),  # counter columns in use: every slot is below this
        ("fade_duration_ns", "i8"),
        ("fade_exponent", "f8"),
        ("enabled", "u8"),
        ("percentage", "f8"),
        ("balance_factor", "f8"),  # NaN: no bounded load
        ("max_hops", "i8"),  # -1: Skipper's unlimited walk
        ("load_signal", "S32"),
        ("fade_mode", "S16"),
        ("outlier_panic", "u8"),  # 1: too few endpoints left, ejections ignored (fail open)
        # The zone record (shm.tables.zone.ZoneCurve; the zone name is its own section).
        ("zone_affinity", "u8"),  # 0/1
        ("zone_min_pods", "u8"),
        ("zone_state", "u8"),  # index in shm.tables.zone.ZONE_STATES
        ("zone_reason", "u8"),  # index in shm.tables.zone.ZONE_REASONS
        ("zone_start_ns", "i8"),  # CLOCK_MONOTONIC
        ("zone_x0", "f8"),  # local share at zone_start_ns
        ("zone_rate", "f8"),  # share per second
        ("zone_cap", "f8"),
        ("zone_transitions", "u8"),  # controller transitions so far (a counter)
        ("sections", "u8"),
    ]
)

#: Byte offset of the section directory from the payload start.
DIRECTORY_OFFSET = align(PAYLOAD_HEADER.itemsize, 8)

#: One entry of the section directory: byte offset from the payload start, and length.
SECTION = np.dtype([("offset", "u8"), ("nbytes", "u8")])

#: Sections every table has, in directory order; then those of each ring (see
#: :func:`ring_sections`). Each is ``(name, dtype or None for a byte blob)``.
TABLE_SECTIONS: tuple[tuple[str, str | None], ...] = (
    ("addresses", None),  # UTF-8, NUL-separated
    ("zones", None),
    ("nodes", None),
    ("slot", "i4"),
    ("ejected", "u1"),  # what routing skips (none while in outlier panic)
    # Outlier-ejection state per endpoint (lbcore.ejection.Ejections), for tools and for
    # a restarted writer: reason code (0: none), until (CLOCK_MONOTONIC ns), multiplier,
    # next multiplier decay (ns), and ejections so far per reason (endpoints x 3).
    ("eject_reason", "u1"),
    ("eject_until_ns", "i8"),
    ("eject_multiplier", "i4"),
    ("eject_decay_ns", "i8"),
    ("ejections", "i8"),
    ("tier", "i4"),
    ("starts_ns", "i8"),  # one per fading ring
    ("slot_freed_ns", "i8"),  # per counter slot: -1 in use, else CLOCK_MONOTONIC freed time
    ("ring_nodes", "i8"),  # nodes of each ring
    ("caller_zone", None),  # UTF-8: the caller's zone (the zone record's name)
)


def ring_sections(k: int) -> tuple[tuple[str, str], ...]:
    """Directory entries of ring ``k``: sorted hashes, owners, bucket table."""
    return ((f"ring{k}.hashes", "u8"), (f"ring{k}.owners", "i4"), (f"ring{k}.buckets", "i4"))


def table_sections(rings: int) -> int:
    """Number of directory entries of a table with ``rings`` rings."""
    return len(TABLE_SECTIONS) + 3 * rings


# ------------------------------------------------------------------------------------
# Counters.

SLOT_FREE = 0
SLOT_CLAIMED = 1
#: Held by a process (a prefork master) for a child about to fork, which adopts it.
SLOT_RESERVED = 2

COUNTERS_CONTROL = np.dtype(
    [
        *_COMMON,
        ("current", "u8"),  # epoch of the current counters data segment
        ("rows", "u8"),  # worker slots
        ("buckets", "u8"),  # time buckets kept per row (window buckets + 2)
        ("window_buckets", "u8"),  # buckets that span the occupancy window
        ("bucket_ns", "u8"),
        ("window_ns", "u8"),
        ("base_ns", "i8"),  # creation time (CLOCK_MONOTONIC); informational since layout 2
        ("slots_offset", "u8"),  # byte offset of the slot table
        ("created_ns", "i8"),
    ]
)

#: One worker slot (one row of the counter matrix) in the control segment's slot table.
SLOT = np.dtype(
    [
        ("state", "u8"),  # SLOT_FREE, SLOT_CLAIMED or SLOT_RESERVED
        ("pid", "u8"),
        ("start_ticks", "u8"),  # owner's start time (/proc/<pid>/stat field 22)
        ("thread_id", "u8"),  # threading.get_ident() of a per-thread row, else 0
        ("claimed_ns", "i8"),
        ("released_ns", "i8"),
        ("claims", "u8"),  # how many times the row was claimed
        ("used", "u8"),  # 1 once the row was ever claimed (readers skip unused rows)
    ]
)

COUNTERS_DATA = np.dtype(
    [
        *_COMMON,
        ("rows", "u8"),
        ("columns", "u8"),
        ("buckets", "u8"),
        ("row_words", "u8"),
        ("rows_offset", "u8"),
    ]
)

#: Per-bucket fields of a cell for requests still open: how many started in the bucket,
#: and the sum of their start times relative to the bucket's start (ns).
OPEN_FIELDS = ("open", "open_start_sum")

#: Per-bucket counter fields of a cell for what happened in the bucket.
COUNTER_FIELDS = ("busy_ns", "completed", "latency_ns", "failures")

#: Per-bucket failures of each kind (:data:`lbcore.outlier.FAILURE_KINDS`, in code order);
#: they sum to ``failures``.
KIND_FIELDS = tuple(f"failures_{kind}" for kind in FAILURE_KINDS)

#: Every per-bucket field, in row order after ``open_old``.
BUCKET_FIELDS = OPEN_FIELDS + COUNTER_FIELDS + KIND_FIELDS

#: Lifetime failures of each kind, in code order; they sum to ``failures_total``.
KIND_TOTAL_FIELDS = tuple(f"{name}_total" for name in KIND_FIELDS)

#: Per-cell lifetime totals (never age out; zeroed only when a freed endpoint slot is
#: given to a new endpoint).
TOTAL_FIELDS = ("requests_total", "failures_total", *KIND_TOTAL_FIELDS)

#: Per-cell latest load report a pod sent this row's writer (:mod:`lbcore.reported`'s
#: report state, plus the ``application_utilization`` shown on ``/metrics``): value and
#: utilization are ``float64`` bit patterns in the ``int64`` words (NaN: none), kind a
#: :data:`lbcore.reported.KIND_*`, times CLOCK_MONOTONIC ns, identity a ``uint64``
#: bit pattern. Written only by the row's owner; zeroed with the totals when a freed
#: endpoint slot is given to a new endpoint. Readers take each slot's newest report
#: across rows (:mod:`shm.counters.reports`).
REPORT_FIELDS = (
    "report_value",
    "report_util",
    "report_kind",
    "report_at_ns",
    "report_since_ns",
    "report_identity",
)

#: Per-row lifetime totals of routing decisions, then of the fan-out helper
#: (``workers.fanout``): retry calls sent, those that failed too, retries the retry
#: budget refused, calls the bulkhead kept from an endpoint or queue, answers whose load
#: report or ``Server-Timing`` was malformed (ignored), and the calls made to pods
#: (retries included, the ingress's fallback calls not) in the caller's zone and out of
#: it. Totals per row, not per endpoint, so they survive every table change.
STATS_FIELDS = (
    "decisions",
    "fallbacks",
    "moves",
    "retries",
    "retries_failed",
    "retries_refused",
    "bulkhead_rejections",
    "reports_malformed",
    "calls_local",
    "calls_remote",
)

#: Words a row holds for :data:`STATS_FIELDS` (the rest reserved; a multiple of 8, so
#: what follows stays on a 64-byte boundary).
STATS_WORDS = 16


def row_layout(columns: int, buckets: int) -> dict[str, int]:
    """Word offsets of the parts of one counter row, and the row's length in words.

    A row is, in ``int64`` words: ``periods[buckets]`` (padded to 8 words: the time
    bucket each bucket column currently holds, ``-1`` if none), ``stats[16]``
    (lifetime totals of :data:`STATS_FIELDS`, the rest reserved: :data:`STATS_WORDS`),
    ``open_old[columns]`` (requests still open that started before every bucket the
    row holds: older than the window), then for each of :data:`BUCKET_FIELDS` a
    ``[buckets][columns]`` block, then for each of :data:`TOTAL_FIELDS` and of
    :data:`REPORT_FIELDS` a ``[columns]`` block. ``columns`` is a multiple of 8, so
    every part and every row starts on a 64-byte
    boundary (no false sharing between workers' rows).
    """
    periods_words = align(buckets, 8)
    out = {"periods": 0, "stats": periods_words, "open_old": periods_words + STATS_WORDS}
    off = periods_words + STATS_WORDS + columns
    for name in BUCKET_FIELDS:
        out[name] = off
        off += buckets * columns
    for name in TOTAL_FIELDS + REPORT_FIELDS:
        out[name] = off
        off += columns
    out["row_words"] = off
    return out


def cell_words(buckets: int) -> int:
    """``int64`` words per (worker slot, endpoint slot) cell of the counter matrix."""
    return 1 + len(BUCKET_FIELDS) * buckets
