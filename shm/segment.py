"""Named POSIX shared-memory segments: create, attach, validate, lock, unlink.

A :class:`Segment` is one mapped ``posix_ipc`` shared-memory object. Segments are
created owner-only (mode 0600, whatever the umask) and fully allocated up front with
``posix_fallocate``, so a full ``/dev/shm`` is reported when the segment is created
(:class:`~shm.errors.SegmentFullError`) instead of killing a worker with ``SIGBUS`` the
first time it touches an unbacked page. Attaching refuses segments owned by another user
or writable by group or others, and :func:`check_header` validates magic, layout version
and size before any offset read from the segment is trusted.

Also here: the namespace rules and segment names, process identity (PID plus start time,
so a reused PID is not mistaken for a live owner), the cross-process lock used by the
rare operations that need one (claiming a worker slot, taking over as table writer), and
:func:`fence`, the memory barrier of the table protocol on CPUs that reorder memory
accesses.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import posix_ipc

from lbcore import kernel as lbcore_kernel
from lbcore.fence import IS_TSO as _TSO
from lbcore.fence import fence
from shm.errors import (
    NamespaceError,
    ProcessLivenessError,
    SegmentExistsError,
    SegmentFullError,
    SegmentLayoutError,
    SegmentMagicError,
    SegmentMissingError,
    SegmentPermissionError,
    SegmentSizeError,
    SegmentVersionError,
    WriterBusyError,
)
from shm.layout import KIND_NAMES, LAYOUT_VERSION, word

_lseek = os.lseek
_SEEK_END = os.SEEK_END

__all__ = [
    "SHM_DIR",
    "Segment",
    "WriterLock",
    "attach_initialized",
    "check_header",
    "check_namespace",
    "current_inode",
    "epoch_segments",
    "fence",
    "intact",
    "intact_by_lseek",
    "list_segments",
    "own_start_ticks",
    "process_alive",
    "process_start_ticks",
    "seam",
    "segment_lock",
    "segment_name",
    "set_seam_hook",
    "unlink_name",
    "unlink_stale_epochs",
]

#: Where Linux keeps POSIX shared memory (used for free-space checks and listings).
SHM_DIR = "/dev/shm"

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_namespace(namespace: str) -> str:
    """Validate a namespace: 1-64 characters from ``A-Z a-z 0-9 _ -``.

    Raises
    ------
    NamespaceError
        Naming the offending namespace and the allowed characters.
    """
    if not isinstance(namespace, str):
        raise NamespaceError(f"namespace must be a string, got {type(namespace).__name__}")
    if not _NAMESPACE_RE.fullmatch(namespace):
        raise NamespaceError(
            f"namespace {namespace!r} is invalid: use 1 to 64 characters from "
            "A-Z, a-z, 0-9, '_' and '-' (it becomes part of /dev/shm file names)"
        )
    return namespace


def segment_name(namespace: str, kind: str, epoch: int | None = None) -> str:
    """POSIX name of a segment: ``/cslb.<namespace>.<kind>`` or ``...<kind>.<epoch>``."""
    base = f"/cslb.{check_namespace(namespace)}.{kind}"
    return base if epoch is None else f"{base}.{int(epoch)}"


def list_segments(namespace: str) -> list[str]:
    """Names of all existing segments of ``namespace`` (empty where /dev/shm is absent)."""
    prefix = f"cslb.{check_namespace(namespace)}."
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted("/" + e for e in entries if e.startswith(prefix))


def epoch_segments(namespace: str, kind: str) -> dict[int, str]:
    """Existing data segments ``/cslb.<namespace>.<kind>.<epoch>``, by epoch."""
    base = segment_name(namespace, kind) + "."
    out = {}
    for name in list_segments(namespace):
        tail = name[len(base) :]
        if name.startswith(base) and tail.isascii() and tail.isdigit():
            out[int(tail)] = name
    return out


def unlink_stale_epochs(namespace: str, kind: str, keep: int | None) -> list[str]:
    """Unlink every data segment of ``kind`` but epoch ``keep``; returns what it removed.

    Only for the holder of the kind's lock (the table writer; a counters grower under
    the control segment's lock): then no other process is creating or switching data
    segments, so every epoch the control segment does not name is a leftover of a
    process killed while growing (the new segment before the switch, or the old one
    after it). Readers that still map a removed segment keep their mapping.
    """
    removed = []
    for epoch, name in sorted(epoch_segments(namespace, kind).items()):
        if epoch != keep and unlink_name(name):
            removed.append(name)
    return removed


# ------------------------------------------------------------------------------------
# Test seam.

_seam_hook: Callable[[str], None] | None = None


def seam(point: str) -> None:
    """Mark a point of a protocol where another process may act (a test seam).

    The multi-process tests force the interleavings that matter (a reader stalled
    between two loads, a writer killed between two stores) by installing a hook in a
    child process that pauses there. Without a hook this is one global load; it sits
    only on slow paths (remapping, publishing, growing, creating), never on the
    per-batch ones.
    """
    hook = _seam_hook
    if hook is not None:
        hook(point)


def set_seam_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or with ``None`` remove) the hook :func:`seam` calls; for tests only."""
    global _seam_hook
    _seam_hook = hook


# ------------------------------------------------------------------------------------
# Process identity.


def process_start_ticks(pid: int) -> int | None:
    """Start time of a live process in clock ticks since boot, ``None`` if it is gone.

    A zombie (killed but not yet waited for) counts as gone: it holds no memory and
    will never touch a counter again. Only "no such process" (``ENOENT``, ``ESRCH``)
    means gone.

    Raises
    ------
    ProcessLivenessError
        ``/proc/<pid>/stat`` could not be read for another reason (``EMFILE``,
        ``ENFILE``, ``ENOMEM``, ``EACCES`` ...): whether the process lives is unknown.
    """
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        raise ProcessLivenessError(
            exc.errno,
            f"cannot tell whether process {pid} is alive: reading /proc/{pid}/stat failed "
            f"({exc.strerror})",
        ) from exc
    # The command name (field 2) is parenthesised and may hold spaces or ')'.
    rest = stat[stat.rfind(b")") + 2 :].split()
    if not rest or rest[0] in (b"Z", b"X", b"x"):
        return None
    return int(rest[19])  # field 22 overall: starttime


def unreaped_child(pid: int) -> bool:
    """True if ``pid`` is a zombie child of the calling process (exited, not yet waited for).

    A prefork master hears of such a child's exit later (gunicorn's ``child_exit`` runs
    from its SIGCHLD handling), so whatever the child held is still the master's to
    release. False when it cannot be told.
    """
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    rest = stat[stat.rfind(b")") + 2 :].split()
    return len(rest) > 1 and rest[0] == b"Z" and int(rest[1]) == os.getpid()


def own_start_ticks() -> int:
    """Start time of the calling process in clock ticks since boot (with its PID, its identity).

    Raises
    ------
    ProcessLivenessError
        ``/proc/self/stat`` cannot be read (out of file descriptors, no ``/proc``):
        without it no slot or writer ownership can be recorded safely.
    """
    pid = os.getpid()
    ticks = process_start_ticks(pid)
    if ticks is None:
        raise ProcessLivenessError(
            errno.ENOENT, f"cannot read the start time of this process ({pid}): is /proc mounted?"
        )
    return ticks


def process_alive(pid: int, start_ticks: int) -> bool:
    """True if process ``pid`` exists, is not a zombie and started at ``start_ticks``.

    Also True when that cannot be told (``/proc`` unreadable for a reason other than
    the process being gone, say out of file descriptors): a live owner taken for dead
    would have its in-flight counts dropped and its row handed to a second writer,
    while a dead one taken for live only keeps its row until the next check.
    """
    if pid <= 0:
        return False
    try:
        ticks = process_start_ticks(pid)
    except ProcessLivenessError:
        return True
    return ticks is not None and ticks == start_ticks


# ------------------------------------------------------------------------------------
# Segments.


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
    if not _TSO:
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


def current_inode(name: str) -> int | None:
    """Inode of the segment now named ``name`` (``None`` if there is none)."""
    try:
        return os.stat(SHM_DIR + name).st_ino
    except OSError:
        return None


def unlink_name(name: str) -> bool:
    """Remove a segment name from ``/dev/shm``; False if it did not exist."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    return True


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
