"""Cross-process locks on segment names: ``flock`` on a descriptor of the segment itself.

The kernel drops a ``flock`` when its holder dies, so a SIGKILLed process never leaves
one held. :func:`segment_lock` serialises the rare operations that need it (claiming
a worker slot, creating, taking over or growing counters); :class:`WriterLock` makes
one process a namespace's table writer for its lifetime.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

import posix_ipc

from shm.errors import SegmentMissingError, WriterBusyError

__all__ = ["WriterLock", "segment_lock"]


@contextlib.contextmanager
def segment_lock(name: str) -> Iterator[None]:
    """Hold the cross-process lock of segment ``name`` (``flock`` on a fresh descriptor).

    The kernel drops the lock when the holder dies, so a SIGKILLed process never
    leaves it held. Used only for rare operations (creating or taking over counters,
    claiming a worker slot, growing counters), never on a routing or recording path.
    Works on a segment of any size, even one its creator never sized.
    """
    fd = _open_for_lock(name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _open_for_lock(name: str) -> int:
    try:
        mem = posix_ipc.SharedMemory(name, 0, read_only=True)
    except posix_ipc.ExistentialError as exc:
        raise SegmentMissingError(name, "does not exist (removed while in use?)") from exc
    return mem.fd  # the caller owns and closes it


class WriterLock:
    """Exclusive, non-blocking, process-lifetime lock on a segment name.

    Held by the one table writer of a namespace. The kernel releases it when the
    process dies; the descriptor is closed in forked children (``os.register_at_fork``)
    so a child never keeps a dead writer's lock alive.
    """

    _held: set[WriterLock] = set()  # noqa: RUF012 - per-process registry of held locks

    def __init__(self, name: str) -> None:
        self.name = name
        self.fd = _open_for_lock(name)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self.fd)
            raise WriterBusyError(name, "another live process holds the writer lock") from exc
        WriterLock._held.add(self)

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        WriterLock._held.discard(self)

    @classmethod
    def _after_fork_in_child(cls) -> None:
        for lock in list(cls._held):
            with contextlib.suppress(OSError):
                os.close(lock.fd)  # the parent still holds the lock through its own fd
            lock.fd = -1
        cls._held.clear()


os.register_at_fork(after_in_child=WriterLock._after_fork_in_child)
