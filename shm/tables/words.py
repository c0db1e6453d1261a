"""Word indices and helpers shared by the tables reader and writer.

The control segment's and each buffer header's words (:data:`shm.layout.TABLES_CONTROL`,
:data:`shm.layout.BUFFER_HEADER`) by index, the payload checksum, and whether this
CPU needs real barriers between them (see ``docs/shared-memory.md``).
"""

from __future__ import annotations

import time

import numpy as np

from lbcore.fence import IS_TSO
from lbcore.hashing import digest
from shm.layout import BUFFER_HEADER, TABLES_CONTROL, word

WEAK = not IS_TSO

# Word indices used on hot paths.
C_MAGIC = word(TABLES_CONTROL, "magic")
C_CURRENT = word(TABLES_CONTROL, "current")
C_GENERATION = word(TABLES_CONTROL, "generation")
C_WRITER_PID = word(TABLES_CONTROL, "writer_pid")
C_WRITER_START = word(TABLES_CONTROL, "writer_start")
C_HEARTBEAT = word(TABLES_CONTROL, "heartbeat_ns")
B_SEQ = word(BUFFER_HEADER, "seq")
B_GENERATION = word(BUFFER_HEADER, "generation")
B_PAYLOAD = word(BUFFER_HEADER, "payload_bytes")
B_CHECKSUM = word(BUFFER_HEADER, "checksum")

now_ns = time.monotonic_ns
NO_SEQ = memoryview(np.zeros(1, dtype=np.uint64)).cast("B").cast("Q")  # never equals 1


def payload_checksum(data: memoryview) -> int:
    """XXH3-64 of a table payload, as stored in its buffer header."""
    # Through lbcore (shm may not import xxhash itself). XXH3 rather than CRC-32: CRC-32
    # was half the cost of mapping a large table (perf/bench_shm.py); it releases the GIL
    # on large buffers, so a background map does not hold up routing threads.
    return digest(data)
