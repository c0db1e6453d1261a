"""Exception types of the shared-memory layer.

Every error names the segment involved (``/cslb.<namespace>.tables`` ...) and says what
was wrong and what was expected, so a worker, the discovery process or an operator can
show it as is. Segment errors derive from :class:`SegmentError`, which carries the
segment name in :attr:`SegmentError.segment`.
"""

from __future__ import annotations

__all__ = [
    "CapacityError",
    "CounterInputError",
    "NamespaceError",
    "NoFreeSlotError",
    "ProcessLivenessError",
    "SegmentCorruptError",
    "SegmentError",
    "SegmentExistsError",
    "SegmentFullError",
    "SegmentLayoutError",
    "SegmentMagicError",
    "SegmentMissingError",
    "SegmentPermissionError",
    "SegmentSizeError",
    "SegmentVersionError",
    "ShmError",
    "SlotOwnershipError",
    "TableChecksumError",
    "TableInputError",
    "TableUnavailableError",
    "WriterBusyError",
    "WriterUnusableError",
]


class ShmError(Exception):
    """Base class of every error raised by :mod:`shm`."""


class NamespaceError(ShmError, ValueError):
    """A namespace is empty, too long or holds characters not allowed in segment names."""


class TableInputError(ShmError, ValueError):
    """A table to publish is malformed; nothing is published.

    Knobs out of range, per-endpoint arrays of the wrong length, strings with NUL ...
    """


class CounterInputError(ShmError, ValueError):
    """A recording call got slots or durations it cannot record; nothing is recorded."""


class SegmentError(ShmError):
    """Something is wrong with one named shared-memory segment.

    Parameters
    ----------
    segment
        The POSIX shared-memory name, e.g. ``/cslb.prapi.tables``.
    message
        What was wrong and what was expected.
    """

    def __init__(self, segment: str, message: str) -> None:
        super().__init__(f"segment {segment}: {message}")
        self.segment = segment


class SegmentMissingError(SegmentError, FileNotFoundError):
    """The segment does not exist (nothing was published yet, or its owner removed it)."""


class SegmentExistsError(SegmentError, FileExistsError):
    """A segment to create already exists."""


class SegmentFullError(SegmentError, OSError):
    """``/dev/shm`` has no room for the segment (mount a larger in-memory volume there)."""


class SegmentPermissionError(SegmentError, PermissionError):
    """The segment is not ours (other owner) or is writable by other users."""


class SegmentCorruptError(SegmentError):
    """The segment's content cannot be trusted (base class of the checks below)."""


class SegmentMagicError(SegmentCorruptError):
    """The segment does not start with the magic number of the expected kind."""


class SegmentVersionError(SegmentCorruptError):
    """The segment was written with a layout version this build cannot read."""


class SegmentSizeError(SegmentCorruptError):
    """The segment is shorter than its header says (truncated) or than a header needs."""


class SegmentLayoutError(SegmentCorruptError):
    """A header field or table section is out of range (offsets, counts, indices)."""


class TableChecksumError(SegmentCorruptError):
    """A published table does not match the checksum its writer stored with it."""


class TableUnavailableError(SegmentError):
    """No consistent table could be read in time (the writer kept rewriting it)."""


class WriterBusyError(SegmentError):
    """Another live process is the table writer of this namespace."""


class CapacityError(SegmentError):
    """A table or counter matrix does not fit the limits of the layout."""


class NoFreeSlotError(SegmentError):
    """Every worker slot of the counter matrix is held by a live process."""


class ProcessLivenessError(ShmError, OSError):
    """Whether a process is alive cannot be told.

    ``/proc/<pid>/stat`` could not be read for a reason other than the process being
    gone (out of file descriptors, ...).
    """


class SlotOwnershipError(ShmError):
    """A counter recorder is used after its slot was released, or in a forked child."""


class WriterUnusableError(SlotOwnershipError):
    """A :class:`~shm.tables.TableWriter` is used after ``close()``, or in a forked child.

    (A subclass of :class:`SlotOwnershipError` only so that code written against the
    first release, which raised that, keeps working.)
    """
