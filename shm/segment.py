"""Named POSIX shared-memory segments: create, attach, validate; probe their size.

A :class:`Segment` is one mapped ``posix_ipc`` shared-memory object. Segments are
created owner-only (mode 0600, whatever the umask) and fully allocated up front with
``posix_fallocate``, so a full ``/dev/shm`` is reported when the segment is created
(:class:`~shm.errors.SegmentFullError`) instead of killing a worker with ``SIGBUS`` the
first time it touches an unbacked page. Attaching refuses segments owned by another user
or writable by group or others, and :func:`check_header` validates magic, layout version
and size before any offset read from the segment is trusted.

Another process of the user can shrink an object under its mappings; the routing path
probes sizes (:data:`intact`) or reads words under the native kernel's SIGBUS guard
(:data:`words_are`). Names and namespaces are :mod:`shm.names`, owners' identity
:mod:`shm.owners`, the cross-process locks :mod:`shm.locks`, the test seams
:mod:`shm.seams`; the memory fence is :func:`lbcore.fence.fence`.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import posix_ipc

from lbcore import kernel as lbcore_kernel
from lbcore.fence import IS_TSO, fence
from shm.errors import (
    SegmentExistsError,
    SegmentFullError,
    SegmentLayoutError,
    SegmentMagicError,
    SegmentMissingError,
    SegmentPermissionError,
    SegmentSizeError,
    SegmentVersionError,
)
from shm.layout import KIND_NAMES, LAYOUT_VERSION, word
from shm.locks import segment_lock
from shm.names import SHM_DIR, unlink_name
from shm.seams import seam

_lseek = os.lseek
_SEEK_END = os.SEEK_END

__all__ = [
    "GUARDED",
    "SIZE_CHECK_NS",
    "Segment",
    "attach_initialized",
    "check_header",
    "intact",
    "intact_by_lseek",
    "kernel_guarded",
    "words_are",
]


def _shm_free_bytes() -> int | None:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _full_error(name: str, size: int, detail: str) -> SegmentFullError:
    free = _shm_free_bytes()
    free_txt = f"{free} bytes free" if free is not None else "free space unknown"
    return SegmentFullError(
        name,
        f"cannot allocate {size} bytes in {SHM_DIR} ({free_txt}; {detail}): "
        f"{SHM_DIR} is full or too small; containers default to 64 MiB, mount a larger "
        "in-memory volume (emptyDir medium: Memory) there",
    )


def _allocate(fd: int, name: str, size: int) -> None:
    """Size a new segment and reserve its pages now.

    A full ``/dev/shm`` then fails here, with the segment named, rather than as a SIGBUS
    on the first write.
    """
    os.ftruncate(fd, size)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise _full_error(name, size, os.strerror(exc.errno)) from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


#: How long the routing path may go without checking a segment's size (ns): 0, every
#: batch checks each segment it touches (:func:`intact`). A longer interval is a window
#: in which a shrink by another process kills (SIGBUS) a busy worker's next batch.
SIZE_CHECK_NS = 0


def intact_by_lseek(a: Segment, b: Segment | None = None) -> bool:
    """Whether ``a`` and ``b`` surely still back their whole mappings: one ``lseek`` each.

    The routing path's size check, once per batch per segment it touches. ``False``
    also when unsure (a closed descriptor, an error): the caller then asks
    :meth:`Segment.shrunk_to` of each, which gives the verdict. The routing path calls
    :data:`intact`: the native kernel's ``mapped_intact`` where it is built (no Python
    frame, and the GIL held around the system call, which does not block), else this.
    """
    try:
        return _lseek(a.fd, 0, _SEEK_END) >= a.size and (
            b is None or _lseek(b.fd, 0, _SEEK_END) >= b.size
        )
    except OSError:
        return False


try:  # (a build from older sources lacks it)
    from lbcore._kernel import mapped_intact as _native_intact
except ImportError:
    _native_intact = None

intact: Callable[..., bool] = _native_intact or intact_by_lseek


def _words_are(a: Any, i: int, x: int, b: Any = None, j: int = 0, y: int = 0) -> int:
    """``words_are`` without the native kernel: plain reads (probe sizes first)."""
    if a[i] != x:
        return 0
    if b is None:
        return 1
    if not IS_TSO:
        fence()  # (b is read after a, as the native acquire loads order them)
    return int(b[j] == y)


try:
    from lbcore._kernel import words_are as _native_words_are
except ImportError:
    _native_words_are = None

#: ``words_are(a, i, x[, b, j, y])``: ``1`` if word ``a[i] == x`` (and ``b[j] == y``),
#: ``0`` if not, ``-1`` if the read faulted (an object shrunk under its mapping: ask the
#: segments, :meth:`Segment.check_size`). With the native kernel the reads run under
#: its SIGBUS guard, so the routing path needs no size probe before them
#: (:data:`GUARDED`); without it they are plain reads and the caller probes first.
words_are: Callable[..., int] = _native_words_are or _words_are

#: Whether :data:`words_are` and the native kernel's shared-memory touches are guarded.
GUARDED = _native_words_are is not None


def kernel_guarded() -> bool:
    """Whether lbcore's active kernel touches shared memory under the guard (native)."""
    return GUARDED and lbcore_kernel.native() is not None


class Segment:
    """One mapped POSIX shared-memory segment.

    Use :meth:`create` or :meth:`attach`; :attr:`buf` is the mapping, :attr:`words`
    the same memory as ``uint64`` words.

    Attributes
    ----------
    name : str
        POSIX name, e.g. ``/cslb.prapi.tables``.
    size : int
        Mapped size in bytes.
    writable : bool
        Mapped read-write (creators, writers) or read-only (readers).
    created : bool
        True if this handle created the segment.
    inode : int
        Inode of the segment in ``/dev/shm``: a segment removed and created anew under
        the same name has another one.
    fd : int
        The object's own descriptor, kept to read its size (-1 once closed); read it,
        never close it.
    """

    __slots__ = (
        "_mm",
        "buf",
        "created",
        "fd",
        "inode",
        "name",
        "size",
        "words",
        "writable",
    )

    def __init__(
        self,
        name: str,
        mm: mmap.mmap,
        size: int,
        writable: bool,
        created: bool,
        inode: int = 0,
        fd: int = -1,
    ):
        # The object's own descriptor, kept to read its size: another process of the user can
        # shrink the object under the mapping, and a touch past its end is SIGBUS.
        self.fd = fd
        self.name = name
        self.inode = inode
        self._mm = mm
        self.size = size
        self.writable = writable
        self.created = created
        self.buf = memoryview(mm)
        self.words = self.buf[: size // 8 * 8].cast("Q")

    def __repr__(self) -> str:
        mode = "rw" if self.writable else "ro"
        return f"Segment({self.name!r}, {self.size} bytes, {mode})"

    @classmethod
    def create_replacing(cls, name: str, size: int) -> Segment:
        """:meth:`create`, first unlinking a leftover of the same name.

        For data segments a process killed while growing left behind: the control segment
        never named them, so no reader uses them. The caller holds the writer lock.
        """
        try:
            return cls.create(name, size)
        except SegmentExistsError:
            unlink_name(name)
            return cls.create(name, size)

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Create, allocate and map a new segment (mode 0600); fails if it exists.

        Raises
        ------
        SegmentExistsError
            The name is taken.
        SegmentFullError
            ``/dev/shm`` cannot hold ``size`` more bytes.
        """
        if size <= 0:
            raise ValueError(f"segment size must be > 0 bytes, got {size}")
        free = _shm_free_bytes()
        if free is not None and size > free:
            raise _full_error(name, size, "checked before creating")
        try:
            mem = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
        except posix_ipc.ExistentialError as exc:
            raise SegmentExistsError(name, "already exists") from exc
        fd = mem.fd
        try:
            seam("segment.created")  # exists, still 0 bytes
            os.fchmod(fd, 0o600)
            _allocate(fd, name, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            inode = os.fstat(fd).st_ino
            kept = os.dup(fd)
        except BaseException:
            with contextlib.suppress(posix_ipc.ExistentialError):
                mem.unlink()
            raise
        finally:
            mem.close_fd()
        return cls(name, mm, size, True, True, inode, kept)

    @classmethod
    def attach(cls, name: str, *, writable: bool = False, min_size: int = 32) -> Segment:
        """Map an existing segment after checking its owner, mode and size.

        Parameters
        ----------
        name
            POSIX name.
        writable
            Map read-write (else read-only: stray writes fault instead of corrupting).
        min_size
            Smallest size in bytes that can hold the expected header.

        Raises
        ------
        SegmentMissingError, SegmentPermissionError, SegmentSizeError
        """
        try:
            mem = posix_ipc.SharedMemory(name, 0, read_only=not writable)
        except posix_ipc.ExistentialError as exc:
            raise SegmentMissingError(name, "does not exist") from exc
        except posix_ipc.PermissionsError as exc:
            raise SegmentPermissionError(name, f"cannot be opened: {exc}") from exc
        try:
            st = os.fstat(mem.fd)
            _check_owner(name, st)
            size = st.st_size
            if size < min_size:
                raise SegmentSizeError(
                    name,
                    f"is {size} bytes, too short for its {min_size}-byte header "
                    "(truncated, or not a cslb segment)",
                )
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(mem.fd, size, mmap.MAP_SHARED, prot)
            kept = os.dup(mem.fd)
        finally:
            mem.close_fd()
        return cls(name, mm, size, writable, False, st.st_ino, kept)

    @classmethod
    def reinitialize(cls, name: str, size: int) -> Segment:
        """Map an existing segment read-write at ``size`` bytes, all zero.

        Only for the holder of the segment's lock, to redo the creation of a process
        that died before finishing it (a segment still 0 bytes long, or whose magic
        word, written last, is still 0): nobody else can be using it.

        Raises
        ------
        SegmentMissingError, SegmentPermissionError, SegmentFullError
        """
        try:
            mem = posix_ipc.SharedMemory(name, 0)
        except posix_ipc.ExistentialError as exc:
            raise SegmentMissingError(name, "does not exist") from exc
        except posix_ipc.PermissionsError as exc:
            raise SegmentPermissionError(name, f"cannot be opened: {exc}") from exc
        fd = mem.fd
        try:
            st = os.fstat(fd)
            _check_owner(name, st)
            _allocate(fd, name, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            kept = os.dup(fd)
        finally:
            mem.close_fd()
        mm[:] = bytes(size)
        return cls(name, mm, size, True, False, st.st_ino, kept)

    # --------------------------------------------------------------------------------

    def array(self, dtype: np.dtype | str, offset: int, count: int) -> np.ndarray:
        """Zero-copy NumPy view of ``count`` items of ``dtype`` at byte ``offset``."""
        return np.frombuffer(self._mm, dtype=dtype, count=count, offset=offset)

    def header(self, dtype: np.dtype, offset: int = 0) -> np.ndarray:
        """Zero-copy view of one structured header record at byte ``offset``."""
        return self.array(dtype, offset, 1)[0:1]

    def shrunk_to(self) -> int | None:
        """The object's size if it is now shorter than this mapping, else ``None``.

        One ``lseek`` to the end of the object this handle mapped (not of the name, which
        may name another object by now). Unlinking or replacing the name leaves the
        mapping valid; only a shrunk object makes touching the mapping fault (SIGBUS).
        """
        if self.fd < 0:
            return None
        try:
            # The object's size, as fstat's st_size, without building a stat result: this
            # runs before every access point, batches included. (The descriptor's offset
            # moves; nothing reads through it.)
            size = os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            return None
        return size if size < self.size else None

    def check_size(self) -> None:
        """Raise unless the object still backs the whole mapping (call before touching it).

        A window remains between this check and the touch: another process shrinking
        the object in that window still faults. Checking on every access point makes
        that window as short as a few instructions instead of the process's lifetime.

        Raises
        ------
        SegmentSizeError
            The object was shrunk under the mapping.
        """
        size = self.shrunk_to()
        if size is not None:
            raise SegmentSizeError(
                self.name,
                f"shrank to {size} bytes under its {self.size}-byte mapping (truncated by "
                "another process); not read or written",
            )

    def unlink(self) -> bool:
        """Remove the name from ``/dev/shm`` (mappings stay valid); False if already gone."""
        try:
            posix_ipc.unlink_shared_memory(self.name)
        except posix_ipc.ExistentialError:
            return False
        return True

    def close(self) -> None:
        """Drop this handle's mapping.

        Views handed out (tables, counter rows) keep the mapping alive; it is unmapped
        when the last of them is garbage collected.
        """
        mm = self._mm
        self.words = self.buf = memoryview(b"")
        try:
            mm.close()
        except (BufferError, ValueError):
            # Views still map it: keep the descriptor so shrink checks keep working for
            # their holders; it is closed when this handle is collected.
            return
        self._close_fd()

    def _close_fd(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self._close_fd()

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """Hold the segment's cross-process lock (see :func:`segment_lock`)."""
        return segment_lock(self.name)


def _check_owner(name: str, st: os.stat_result) -> None:
    if st.st_uid != os.geteuid():
        raise SegmentPermissionError(
            name,
            f"is owned by uid {st.st_uid}, not by this process's uid {os.geteuid()}; "
            "refusing to route on a segment another user controls",
        )
    if st.st_mode & 0o022:
        raise SegmentPermissionError(
            name,
            f"has mode {st.st_mode & 0o777:04o}, writable by group or others; "
            "cslb segments are created 0600",
        )


def attach_initialized(
    name: str, *, writable: bool, min_size: int, wait_s: float = 2.0, initialized: bool = True
) -> Segment:
    """Attach a segment another process may be creating right now.

    Waits up to ``wait_s`` seconds for the creator to size it (and, with
    ``initialized``, to write its magic word, which creators write last); after that
    the segment is returned as it is, for :func:`check_header` to judge.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            seg = Segment.attach(name, writable=writable, min_size=min_size)
        except SegmentSizeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
            continue
        if not initialized or seg.words[0] != 0 or time.monotonic() > deadline:
            return seg
        seg.close()
        time.sleep(0.005)


def check_header(
    seg: Segment, dtype: np.dtype, magic: int, what: str, *, epoch: int | None = None
) -> np.ndarray:
    """Validate a segment's common header and return a view of its header record.

    Parameters
    ----------
    seg
        The attached segment.
    dtype
        The header dtype of the expected kind.
    magic
        The expected magic word.
    what
        Human name of the expected kind, for messages.
    epoch
        The expected data-segment epoch (the number in its name), if any.

    Raises
    ------
    SegmentSizeError, SegmentMagicError, SegmentVersionError
    """
    if seg.size < dtype.itemsize:
        raise SegmentSizeError(
            seg.name,
            f"is {seg.size} bytes, too short for the {dtype.itemsize}-byte header of {what}",
        )
    w = seg.words
    found = w[word(dtype, "magic")]
    if found != magic:
        kind = KIND_NAMES.get(found)
        if kind is not None:
            raise SegmentMagicError(seg.name, f"is {kind}, expected {what}")
        raise SegmentMagicError(
            seg.name,
            f"does not start with a cslb magic number (found 0x{found:016x}, expected "
            f"0x{magic:016x} for {what}): not a cslb segment, or overwritten",
        )
    version = w[word(dtype, "version")]
    if version != LAYOUT_VERSION:
        raise SegmentVersionError(
            seg.name, f"is layout version {version}, this build reads version {LAYOUT_VERSION}"
        )
    declared = w[word(dtype, "size")]
    if declared != seg.size:
        raise SegmentSizeError(
            seg.name,
            f"header says {declared} bytes but the segment has {seg.size} bytes "
            "(truncated or resized by someone else)",
        )
    if epoch is not None and w[word(dtype, "epoch")] != epoch:
        raise SegmentLayoutError(
            seg.name,
            f"header says epoch {w[word(dtype, 'epoch')]} but its name says epoch {epoch}",
        )
    return seg.header(dtype)
