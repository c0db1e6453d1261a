"""The publisher's status line in the tables control segment (a seqlock'd text).

Discovery writes what is wrong with its sources ("cannot watch endpointslices...: HTTP
403") and since when; every reader of the namespace (``/healthz``, ``cslb inspect``)
can say why the tables may be stale without asking the publisher. Writing it never
changes the generation. The text is UTF-8, cut to :data:`shm.layout.STATUS_MAX_BYTES`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lbcore.fence import fence
from shm.layout import STATUS_HEADER, STATUS_MAX_BYTES, STATUS_OFFSET, word
from shm.segment import Segment

__all__ = ["PublisherStatus", "read_status", "write_status"]

_SEQ = STATUS_OFFSET // 8 + word(STATUS_HEADER, "seq")
_SINCE = STATUS_OFFSET // 8 + word(STATUS_HEADER, "since_ns")
_NBYTES = STATUS_OFFSET // 8 + word(STATUS_HEADER, "nbytes")
_TEXT = STATUS_OFFSET + STATUS_HEADER.itemsize
_TRIES = 1000


@dataclass(frozen=True, slots=True)
class PublisherStatus:
    """What the publisher reports about its sources.

    Attributes
    ----------
    problem : str
        Empty when nothing is wrong, else what is (naming the source and the error).
    since_ns : int
        CLOCK_MONOTONIC time the problem began (0 when there is none).
    """

    problem: str = ""
    since_ns: int = 0


def write_status(seg: Segment, problem: str, since_ns: int) -> None:
    """Store ``problem`` (``""``: none) and ``since_ns`` into the control segment ``seg``."""
    data = problem.encode("utf-8")[:STATUS_MAX_BYTES]
    data = data.decode("utf-8", "ignore").encode("utf-8")  # never half a character
    w = seg.words
    seq = int(w[_SEQ])
    w[_SEQ] = seq + 1 if seq % 2 == 0 else seq + 2  # odd: rewriting
    fence()
    seg.buf[_TEXT : _TEXT + len(data)] = data
    w[_NBYTES] = len(data)
    w[_SINCE] = int(np.uint64(np.int64(since_ns if problem else 0)))
    fence()
    w[_SEQ] = int(w[_SEQ]) + 1


def read_status(seg: Segment) -> PublisherStatus | None:
    """The status in ``seg``; ``None`` if a writer kept rewriting it or it is garbage."""
    w = seg.words
    for _ in range(_TRIES):
        seq = int(w[_SEQ])
        if seq % 2:
            continue
        fence()
        n = int(w[_NBYTES])
        since = int(np.int64(np.uint64(w[_SINCE])))
        raw = bytes(seg.buf[_TEXT : _TEXT + min(n, STATUS_MAX_BYTES)])
        fence()
        if int(w[_SEQ]) != seq:
            continue
        if n > STATUS_MAX_BYTES:
            return None
        return PublisherStatus(raw.decode("utf-8", "replace"), since)
    return None
