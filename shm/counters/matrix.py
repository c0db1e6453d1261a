"""Views of the counters segments: the control segment and one data epoch's matrix."""

from __future__ import annotations

import numpy as np

from lbcore.fence import fence
from shm.errors import SegmentCorruptError, SegmentLayoutError, SegmentMissingError
from shm.layout import (
    BUCKET_FIELDS,
    COUNTERS_CONTROL,
    COUNTERS_DATA,
    LAYOUT_VERSION,
    MAGIC_COUNTERS_CONTROL,
    MAGIC_COUNTERS_DATA,
    REPORT_FIELDS,
    SLOT,
    STATS_WORDS,
    TOTAL_FIELDS,
    align,
    cell_words,
    row_layout,
    word,
)
from shm.names import segment_name
from shm.segment import Segment, attach_initialized, check_header

#: Default number of worker slots (rows): workers x threads of one host, with room.
DEFAULT_ROWS = 32
#: Default number of time buckets spanning the occupancy window (1 s each for 10 s).
DEFAULT_WINDOW_BUCKETS = 10
MAX_ROWS = 4096
MAX_COLUMNS = 1 << 22
HEADER_BYTES = 4096
PAGE = 4096

C_MAGIC = word(COUNTERS_CONTROL, "magic")
C_CURRENT = word(COUNTERS_CONTROL, "current")
#: Data epochs a control segment may name: 1 up to (not including) this. Any other value
#: in the ``current`` word was written by something else (the counters are shared with
#: every process of the user) and would overflow the next epoch's header.
MAX_EPOCH = 1 << 62


def _epoch_word(seg: Segment, value: int) -> int:
    """``value`` (the control segment's ``current`` word) if it is a plausible epoch.

    Raises
    ------
    SegmentCorruptError
        It is not (0, or at least 2**62).
    """
    epoch = int(value)
    if not 1 <= epoch < MAX_EPOCH:
        raise SegmentCorruptError(seg.name, f"names data epoch {epoch}, out of range")
    return epoch


def columns_for(n: int) -> int:
    """Columns of a matrix for ``n`` endpoint slots: a multiple of 8, at least 8."""
    return max(8, align(int(n), 8))


class Matrix:
    """Zero-copy views of one counters data segment."""

    def __init__(self, seg: Segment, epoch: int, rows: int, buckets: int) -> None:
        hdr = check_header(seg, COUNTERS_DATA, MAGIC_COUNTERS_DATA, "a cslb counters data segment")
        h = hdr[0]
        cols, k, row_words, off = (
            int(h["columns"]),
            int(h["buckets"]),
            int(h["row_words"]),
            int(h["rows_offset"]),
        )
        if int(h["epoch"]) != epoch or int(h["rows"]) != rows or k != buckets:
            raise SegmentLayoutError(
                seg.name,
                f"header says epoch {int(h['epoch'])}, {int(h['rows'])} rows, {k} buckets; "
                f"the control segment says epoch {epoch}, {rows} rows, {buckets} buckets",
            )
        layout = row_layout(cols, k) if 0 < cols <= MAX_COLUMNS and cols % 8 == 0 else None
        if (
            layout is None
            or row_words != layout["row_words"]
            or off < COUNTERS_DATA.itemsize
            or off % 64
            or off + rows * row_words * 8 > seg.size
        ):
            raise SegmentLayoutError(
                seg.name,
                f"{rows} rows of {row_words} words for {cols} columns at offset {off} do not "
                f"fit a {seg.size}-byte segment",
            )
        self.seg = seg
        self.epoch = epoch
        self.columns = cols
        self.buckets = k
        self.layout = layout
        self.rows2d = seg.array(np.int64, off, rows * row_words).reshape(rows, row_words)
        p = layout["open_old"]
        # (rows, 1 + len(BUCKET_FIELDS) * buckets, columns): open_old, then the bucket fields.
        self.fields = self.rows2d[:, p : p + cell_words(k) * cols].reshape(
            rows, cell_words(k), cols
        )
        self.periods = self.rows2d[:, :k]
        st = layout["stats"]
        self.stats = self.rows2d[:, st : st + STATS_WORDS]
        t = layout[TOTAL_FIELDS[0]]
        # (rows, len(TOTAL_FIELDS), columns): requests_total, failures_total, then per kind.
        self.totals = self.rows2d[:, t : t + len(TOTAL_FIELDS) * cols].reshape(
            rows, len(TOTAL_FIELDS), cols
        )
        r = layout[REPORT_FIELDS[0]]
        # (rows, len(REPORT_FIELDS), columns): the latest load report per slot.
        self.reports = self.rows2d[:, r : r + len(REPORT_FIELDS) * cols].reshape(
            rows, len(REPORT_FIELDS), cols
        )

    def block(self, row: int, name: str) -> np.ndarray:
        """View of one part of row ``row`` (see :func:`row_block`)."""
        return row_block(self.fields, self.buckets, row, name)

    def view(self) -> MatrixView:
        """Read-only views of this matrix."""
        return MatrixView(self)

    def copy_row(self, src: Matrix, r: int) -> None:
        """Copy row ``r`` of ``src`` (fewer or equal columns) into this matrix."""
        c = src.columns
        self.periods[r] = src.periods[r]
        self.stats[r] = src.stats[r]
        self.fields[r, :, :c] = src.fields[r]
        self.totals[r, :, :c] = src.totals[r]
        self.reports[r, :, :c] = src.reports[r]


def row_block(fields: np.ndarray, buckets: int, row: int, name: str) -> np.ndarray:
    """View of one part of row ``row`` of a matrix's ``fields``.

    ``open_old`` (``[columns]``) or one of :data:`~shm.layout.BUCKET_FIELDS`
    (``[buckets][columns]``).
    """
    if name == "open_old":
        return fields[row, 0]
    i = 1 + BUCKET_FIELDS.index(name) * buckets
    return fields[row, i : i + buckets]


def _read_only(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


class MatrixView:
    """Read-only views of the counter matrix a store names now: for tools and tests.

    Nothing reached through it can write shared memory. The views stay on this epoch's
    segment: after the matrix grows (:meth:`CounterStore.ensure_columns`) take a new one.

    Attributes
    ----------
    segment : str
        Name of the data segment.
    epoch : int
        Its epoch (the ``current`` word of the control segment names it).
    columns, buckets : int
        Endpoint slots, and time buckets per row.
    layout : dict[str, int]
        Word offset of each field in a row (:func:`shm.layout.row_layout`).
    words : numpy.ndarray
        ``int64`` ``(rows, row words)``: every row whole.
    fields : numpy.ndarray
        ``int64`` ``(rows, 1 + fields x buckets, columns)``: ``open_old``, then each
        bucket field (see :meth:`block`).
    periods : numpy.ndarray
        ``int64`` ``(rows, buckets)``: the period each bucket column holds (-1: none).
    stats : numpy.ndarray
        ``int64`` ``(rows, 16)``: lifetime totals (:data:`shm.layout.STATS_FIELDS`, the
        rest reserved).
    totals : numpy.ndarray
        ``int64`` ``(rows, total fields, columns)``: lifetime totals per slot
        (:data:`shm.layout.TOTAL_FIELDS`).
    reports : numpy.ndarray
        ``int64`` ``(rows, report fields, columns)``: the latest load report per slot
        (:data:`shm.layout.REPORT_FIELDS`; :mod:`shm.counters.reports` reads them).
    """

    __slots__ = (
        "buckets",
        "columns",
        "epoch",
        "fields",
        "layout",
        "periods",
        "reports",
        "segment",
        "stats",
        "totals",
        "words",
    )

    def __init__(self, m: Matrix) -> None:
        self.segment = m.seg.name
        self.epoch = m.epoch
        self.columns = m.columns
        self.buckets = m.buckets
        self.layout = dict(m.layout)
        self.words = _read_only(m.rows2d)
        self.fields = _read_only(m.fields)
        self.periods = _read_only(m.periods)
        self.stats = _read_only(m.stats)
        self.totals = _read_only(m.totals)
        self.reports = _read_only(m.reports)

    def block(self, row: int, name: str) -> np.ndarray:
        """Read-only view of one part of row ``row`` (see :func:`row_block`)."""
        return row_block(self.fields, self.buckets, row, name)


class Control:
    """The counters control segment: geometry, current data epoch, slot table."""

    def __init__(self, seg: Segment) -> None:
        hdr = check_header(
            seg, COUNTERS_CONTROL, MAGIC_COUNTERS_CONTROL, "a cslb counters control segment"
        )
        h = hdr[0]
        self.seg = seg
        self.cw = seg.words
        self.rows = int(h["rows"])
        self.buckets = int(h["buckets"])
        self.window_buckets = int(h["window_buckets"])
        self.bucket_ns = int(h["bucket_ns"])
        self.window_ns = int(h["window_ns"])
        self.base_ns = int(h["base_ns"])
        off = int(h["slots_offset"])
        if (
            not 1 <= self.rows <= MAX_ROWS
            or self.buckets != self.window_buckets + 2
            or self.bucket_ns <= 0
            or self.window_ns <= 0
            or off < COUNTERS_CONTROL.itemsize
            or off % 64
            or off + self.rows * SLOT.itemsize > seg.size
        ):
            raise SegmentLayoutError(
                seg.name,
                f"geometry out of range: {self.rows} rows, {self.buckets} buckets "
                f"({self.window_buckets} in the window) of {self.bucket_ns} ns, slot table "
                f"at {off} in {seg.size} bytes",
            )
        self.slots = seg.array(SLOT, off, self.rows)
        self.matrix: Matrix | None = None

    def current(self) -> Matrix:
        """The current data segment's matrix, attaching it if the epoch moved.

        Raises
        ------
        SegmentSizeError
            The control or the current data segment was shrunk under its mapping.
        """
        self.seg.check_size()
        while True:
            epoch = _epoch_word(self.seg, self.cw[C_CURRENT])
            m = self.matrix
            if m is not None and m.epoch == epoch:
                m.seg.check_size()
                return m
            name = f"{self.seg.name}.{epoch}"
            try:
                seg = Segment.attach(name, writable=self.seg.writable, min_size=HEADER_BYTES)
            except SegmentMissingError:
                if self.cw[C_CURRENT] != epoch:
                    continue  # grown again meanwhile
                raise
            self.matrix = Matrix(seg, epoch, self.rows, self.buckets)
            return self.matrix


def attach_control(namespace: str, *, writable: bool) -> Control:
    """Attach a namespace's counters control segment (waiting briefly for its creator)."""
    name = segment_name(namespace, "counters")
    return Control(attach_initialized(name, writable=writable, min_size=HEADER_BYTES))


def create_data(name: str, epoch: int, rows: int, columns: int, buckets: int) -> Segment:
    """Create data segment ``name`` of ``epoch``: every bucket unstamped, magic written last."""
    layout = row_layout(columns, buckets)
    size = align(HEADER_BYTES + rows * layout["row_words"] * 8, PAGE)
    seg = Segment.create_replacing(name, size)
    h = seg.header(COUNTERS_DATA)
    h["version"] = LAYOUT_VERSION
    h["size"] = size
    h["epoch"] = epoch
    h["rows"] = rows
    h["columns"] = columns
    h["buckets"] = buckets
    h["row_words"] = layout["row_words"]
    h["rows_offset"] = HEADER_BYTES
    rows2d = seg.array(np.int64, HEADER_BYTES, rows * layout["row_words"]).reshape(rows, -1)
    rows2d[:, :buckets] = -1  # no bucket holds a period yet
    fence()
    h["magic"] = MAGIC_COUNTERS_DATA
    return seg


def release_in_flight(m: Matrix, row: int) -> None:
    """Zero ``row``'s open requests (its owner is gone); its history ages out."""
    m.fields[row, : 1 + 2 * m.buckets] = 0  # open_old, open, open_start_sum
