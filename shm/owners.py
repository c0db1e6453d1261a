"""Process identity: a PID plus its start time, so a reused PID is not taken for a live owner.

Counter rows and the table writer record their owner this way; :func:`process_alive`
is the one liveness verdict, erring towards "alive" when ``/proc`` cannot tell.
"""

from __future__ import annotations

import errno
import os

from shm.errors import ProcessLivenessError

__all__ = ["own_start_ticks", "process_alive", "process_start_ticks", "unreaped_child"]


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
