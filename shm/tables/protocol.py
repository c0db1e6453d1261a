"""The read protocol: which buffer is current, and mapping a generation without a torn read.

The order of loads, and why it is enough, is in ``docs/shared-memory.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lbcore.fence import fence
from shm.errors import (
    SegmentCorruptError,
    SegmentError,
    SegmentLayoutError,
    SegmentMissingError,
    TableChecksumError,
    TableUnavailableError,
)
from shm.layout import (
    BUFFER_HEADER_BYTES,
    CONTROL_BYTES,
    DATA_HEADER_BYTES,
    MAGIC_TABLES_CONTROL,
    MAGIC_TABLES_DATA,
    PAYLOAD_HEADER,
    TABLES_CONTROL,
    TABLES_DATA,
)
from shm.names import segment_name
from shm.seams import seam
from shm.segment import Segment, attach_initialized, check_header
from shm.tables.codec import Decoder
from shm.tables.model import Table, empty_table
from shm.tables.words import (
    B_CHECKSUM,
    B_GENERATION,
    B_PAYLOAD,
    B_SEQ,
    C_CURRENT,
    WEAK,
    payload_checksum,
)

# How long a verdict "this buffer is corrupt" stands before the buffer is checked again.
# Any process of the user can write the segment: bytes damaged for a moment (and
# repaired, or rewritten with the same sequence number) must not be refused forever,
# and re-checking costs a checksum of the payload, so not on every read either.

_BAD_RECHECK_NS = 1_000_000_000


class TablesView:
    """Read access to a namespace's tables: control segment plus current data segment."""

    def __init__(self, control: Segment) -> None:
        self.control = control
        self.cw = control.words
        self.data: Segment | None = None
        self.data_epoch = 0
        self.offsets = (0, 0)
        self.buffer_bytes = 0
        self.writable = control.writable
        # (mapping, buffer, seq, error) of a current buffer found unusable: while none of
        # these changes, later reads raise the same error at once instead of checking
        # the whole table again (or waiting out the timeout) on every call.
        self.bad: tuple[memoryview, int, int, SegmentError, int] | None = None
        self.host_keys: dict[str, str] = {}  # of the last decoded generation (see Decoder)

    def data_segment(self, epoch: int) -> Segment:
        """The data segment of ``epoch``, attached (again, if it shrank) and checked."""
        if self.data is not None and self.data_epoch == epoch:
            if self.data.shrunk_to() is None:
                return self.data
            # Shrunk under the mapping: map it again, which checks its size anew.
            self.data.close()
            self.data, self.data_epoch, self.bad = None, 0, None
        name = f"{self.control.name}.{epoch}"
        seg = Segment.attach(name, writable=self.writable, min_size=DATA_HEADER_BYTES)
        hdr = check_header(seg, TABLES_DATA, MAGIC_TABLES_DATA, "a cslb tables data segment")
        off0, off1, bb = (
            int(hdr["buffer_offset0"][0]),
            int(hdr["buffer_offset1"][0]),
            int(hdr["buffer_bytes"][0]),
        )
        if int(hdr["epoch"][0]) != epoch:
            raise SegmentLayoutError(name, f"header says epoch {int(hdr['epoch'][0])}")
        lo, hi = sorted((off0, off1))
        if (
            off0 % 64
            or off1 % 64
            or bb < BUFFER_HEADER_BYTES + PAYLOAD_HEADER.itemsize
            or lo < DATA_HEADER_BYTES
            or lo + bb > hi
            or hi + bb > seg.size
        ):
            raise SegmentLayoutError(
                name,
                f"buffer offsets {off0}, {off1} with {bb} bytes each do not fit "
                f"a {seg.size}-byte segment",
            )
        if self.data is not None:
            self.data.close()
        self.data, self.data_epoch = seg, epoch
        self.offsets, self.buffer_bytes = (off0, off1), bb
        return seg

    def payload_hint(self, cur: int) -> int:
        """Payload bytes the buffer ``cur`` names says it holds, without reading it.

        Only a size hint for deciding where to map it (not checked, may be racing a
        rewrite); a buffer of a data segment not mapped yet counts as unbounded.
        """
        data = self.data
        if not cur or data is None or (cur >> 1) != self.data_epoch:
            return 1 << 62
        return int(data.words[self.offsets[cur & 1] // 8 + B_PAYLOAD])

    def close(self) -> None:
        """Drop the mappings (views handed out keep theirs alive)."""
        if self.data is not None:
            self.data.close()
            self.data = None
        self.control.close()

    def read(self, cached: Table | None, timeout_s: float) -> tuple[int, Table]:
        """The current table, retried until consistent; returns ``(current word, table)``."""
        deadline = time.monotonic() + timeout_s
        spins = 0
        bad: SegmentCorruptError | None = None
        bad_tries = 0
        last: str = "no table could be read"
        while True:
            self.control.check_size()
            cur = self.cw[C_CURRENT]
            if cur == 0:
                return 0, empty_table()
            if WEAK:
                fence()  # load `current` before the buffer's seq
            epoch, b = cur >> 1, cur & 1
            try:
                data = self.data_segment(epoch)
            except SegmentMissingError:
                if self.cw[C_CURRENT] == cur:
                    raise  # named by control, yet gone: someone removed it
                continue  # the writer grew the tables again meanwhile
            seam("tables.read.mapped")
            data.check_size()
            off = self.offsets[b]
            w = data.words
            si = off // 8 + B_SEQ
            seq1 = w[si]
            if WEAK:
                fence()  # load seq1 before `current` again and before the payload
            if self.cw[C_CURRENT] != cur:
                # The buffer may hold a newer generation that `current` does not name
                # yet (the writer completed it and has not switched): not ours to use.
                last = "the writer switched buffers while this one was being mapped"
            elif (
                (v := self.bad) is not None
                and v[0] is w
                and v[1] == b
                and v[2] == seq1
                and time.monotonic_ns() < v[4]
            ):
                raise v[3]  # judged lately, not rewritten since
            elif seq1 & 1:
                last = f"buffer {b} was being rewritten"
            else:
                if (
                    cached is not None
                    and cached._seq_words is w  # this very mapping, not a namesake
                    and cached.buffer == b
                    and cached._seq == seq1
                ):
                    table: Table | None = cached
                else:
                    table = None
                    try:
                        table = self._decode(data, b, off, w)
                    except SegmentCorruptError as exc:
                        bad, last = exc, str(exc)
                    except Exception as exc:
                        # Content rewritten under our feet can fail any check in any
                        # way; if seq stayed put, it is simply bad content.
                        bad = SegmentLayoutError(
                            data.name, f"buffer {b}: content cannot be decoded: {exc!r}"
                        )
                        last = str(bad)
                if WEAK:
                    fence()
                if w[si] == seq1:
                    if table is not None:
                        if table is not cached:
                            table._seq_words, table._seq_index, table._seq = w, si, seq1
                            table._mapped = data
                        return cur, table
                    # Stable seq, still corrupt: on a weakly ordered CPU the writer's
                    # stores may not all be visible yet; retry briefly, then report.
                    bad_tries += 1
                    if bad_tries >= 3:
                        assert bad is not None
                        self.bad = (w, b, seq1, bad, time.monotonic_ns() + _BAD_RECHECK_NS)
                        raise bad
                    time.sleep(0.001)
                    continue
                last = f"buffer {b} was rewritten while it was read"
            spins += 1
            if time.monotonic() > deadline:
                err = TableUnavailableError(
                    self.control.name,
                    f"no consistent table within {timeout_s:g} s ({spins} retries; last: {last})",
                )
                if seq1 & 1 and self.cw[C_CURRENT] == cur:
                    # The writer never rewrites the current buffer: an odd seq that stayed
                    # there all along is damage, not a publish in progress.
                    self.bad = (w, b, seq1, err, time.monotonic_ns() + _BAD_RECHECK_NS)
                raise err
            time.sleep(0 if spins < 100 else 0.0005)

    def _decode(self, data: Segment, b: int, off: int, w: memoryview) -> Table:
        base = off // 8
        gen = w[base + B_GENERATION]
        nbytes = w[base + B_PAYLOAD]
        checksum = w[base + B_CHECKSUM]
        start = off + BUFFER_HEADER_BYTES
        if nbytes > self.buffer_bytes - BUFFER_HEADER_BYTES:
            raise SegmentLayoutError(
                data.name,
                f"buffer {b}: payload of {nbytes} bytes exceeds the buffer capacity of "
                f"{self.buffer_bytes - BUFFER_HEADER_BYTES} bytes",
            )
        found = payload_checksum(data.buf[start : start + nbytes])
        if found != checksum:
            raise TableChecksumError(
                data.name,
                f"buffer {b} generation {gen}: payload checksum 0x{found:016x} does not "
                f"match the stored 0x{checksum:016x} (corrupted, or written by something else)",
            )
        decoder = Decoder(data, b, start, nbytes, self.host_keys)
        decoder.on_host_keys = self._keep_host_keys
        return decoder.decode(gen)

    def _keep_host_keys(self, keys: dict[str, str]) -> None:
        self.host_keys = keys  # parsed by the last decode: the next one reuses them


def read_ahead(
    view: TablesView, timeout_s: float, prepare: Callable[[Table], None] | None = None
) -> tuple[int, Table]:
    """A background map: the current table, decoded off the routing thread.

    Decoding includes what routing on the table needs first, such as the endpoints'
    host identities (:attr:`lbcore.Ring.host_ids`, compared by routing with ejected
    endpoints or Skipper's fade-in): the first batch on the table does not pay for them.
    ``prepare(table)`` then computes what the reader's user derives from a table before
    its first batch (the zone views' arcs a worker's first plan weighs); an error of
    its is dropped: the table's first use computes the same and meets it there.
    """
    cur, t = view.read(None, timeout_s)
    if prepare is not None:
        try:
            prepare(t)
        except Exception:  # an optimisation: the first use reports what went wrong
            pass
    return cur, t


def attach_control(namespace: str, *, writable: bool) -> Segment:
    """Attach and validate a tables control segment (waiting briefly for its creator)."""
    name = segment_name(namespace, "tables")
    seg = attach_initialized(name, writable=writable, min_size=CONTROL_BYTES)
    check_header(seg, TABLES_CONTROL, MAGIC_TABLES_CONTROL, "a cslb tables control segment")
    return seg
