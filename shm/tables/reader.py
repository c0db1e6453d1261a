"""A worker's handle on the routing tables: :class:`TableReader`, with background prefetch."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from lbcore.fence import fence
from shm.background import BackgroundWorker, Job
from shm.errors import SegmentError, TableUnavailableError
from shm.names import current_inode
from shm.owners import process_alive
from shm.segment import GUARDED, intact, words_are
from shm.status import PublisherStatus, read_status
from shm.tables.model import Table
from shm.tables.protocol import TablesView, attach_control, read_ahead
from shm.tables.words import (
    C_CURRENT,
    C_GENERATION,
    C_HEARTBEAT,
    C_WRITER_PID,
    C_WRITER_START,
    NO_SEQ,
    WEAK,
    now_ns,
)

T = TypeVar("T")


_BACKGROUND_READERS: weakref.WeakSet[TableReader] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A background reader's thread takes the reader's lock (its idle look-ahead, every
    # ``prefetch_s``); forked while it held it, the child's lock would never be released.
    for r in list(_BACKGROUND_READERS):
        r._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class TableReader:
    """A worker's handle on a namespace's routing tables.

    Thread-safe: the threads of a gthread worker may share one reader. The per-batch
    path (nothing changed) takes no lock; remapping after a publish is serialized by a
    per-reader lock, so one thread maps a new generation and the others wait for it
    and reuse it.

    Follows a restarted writer: if the control segment was removed and created anew
    (a writer stopped cleanly, which removes the segments, and a new one started), the
    reader notices within ``recheck_s`` and switches to the new segments once the new
    writer has published, keeping the last table until then. The new writer's
    generations count from 1 again.

    Parameters
    ----------
    namespace
        The namespace the writer publishes under.
    timeout_s
        How long :meth:`table` keeps retrying before it gives up (seconds).
    recheck_s
        How often :meth:`table` checks that the control segment it maps is still the
        namespace's (seconds; one ``stat`` call each time).
    background
        Map new generations off the caller's path: when a new generation is current
        and the previous table is still valid (the writer reuses its buffer only two
        publishes later), :meth:`table` starts mapping the new one (checksum,
        validation) in a background thread and keeps returning the previous table
        until it is ready (a worker keeps routing instead of stalling on a large
        table); once the previous table's buffer is being rewritten, :meth:`table`
        waits for the new one. Off by default: then :meth:`table` returns the current
        generation as soon as it was published.
    foreground_bytes
        With ``background``: a new generation whose payload is at most this many
        bytes is mapped by :meth:`table` itself, as without ``background`` (mapping
        cost grows with the payload, so small tables are followed at once for less
        than a thread hand-over costs; perf/bench_shm.py measures it). Default 0:
        every new generation but the first is mapped in the background.
    prefetch_s
        With ``background``: while nobody calls :meth:`table`, the background thread
        looks for a new generation every this many seconds and maps it ahead, so an
        idle worker's next call finds it mapped (it would otherwise map it then, or
        wait for it if the writer had published twice meanwhile).
    prepare
        With ``background``: called by the background thread with each table it maps,
        before :meth:`table` hands it over (what the caller derives from a new table
        before its first use, computed off the caller's path); its errors are dropped
        (the caller's first use meets them).

    Raises
    ------
    SegmentMissingError
        No writer has created the tables yet.
    SegmentCorruptError
        The control segment is foreign, truncated or of another layout version.

    Attributes
    ----------
    reattached : int
        How many times the reader switched to a new control segment.
    """

    def __init__(
        self,
        namespace: str,
        *,
        timeout_s: float = 1.0,
        recheck_s: float = 1.0,
        background: bool = False,
        foreground_bytes: int = 0,
        prefetch_s: float = 0.05,
        prepare: Callable[[Table], None] | None = None,
    ) -> None:
        if isinstance(foreground_bytes, bool) or not isinstance(foreground_bytes, int):
            raise TypeError(f"foreground_bytes must be an int >= 0, got {foreground_bytes!r}")
        if foreground_bytes < 0:
            raise ValueError(f"foreground_bytes must be an int >= 0, got {foreground_bytes}")
        self.namespace = namespace
        self.timeout_s = timeout_s
        self.recheck_s = recheck_s
        self.background = bool(background)
        self.foreground_bytes = foreground_bytes
        self._prepare = prepare
        self.reattached = 0
        #: Generations mapped by the background thread (``background=True``).
        self.mapped_in_background = 0
        self._lock = threading.Lock()
        # The background map in progress: (its job, the process that submitted it); the
        # job's result is (current word, table).
        self._bg: tuple[Job, int] | None = None
        self._worker: BackgroundWorker | None = None
        self._view = TablesView(attach_control(namespace, writable=False))
        self._ctl = self._view.cw
        if self.background:  # (after attaching: a reader that failed starts no thread)
            _BACKGROUND_READERS.add(self)  # its thread takes the lock: reset at a fork
            me = weakref.ref(self)  # the thread must not keep an unused reader alive

            def look_ahead() -> None:
                reader = me()
                if reader is not None:
                    reader._prefetch()

            self._worker = BackgroundWorker("cslb-table-map", idle=look_ahead, idle_s=prefetch_s)
            self._worker.start()  # now: starting a thread makes its caller wait for it
            weakref.finalize(self, self._worker.close)  # a reader dropped unclosed
        # (control words, current word, table, its seq word, index and value): one
        # attribute, so a thread on the fast path never pairs one remap's table with
        # another's control or current word.
        self._state: tuple[memoryview, int, Table | None, memoryview, int, int]
        self._set_state(-1, None)
        self._inode = self._view.control.inode
        self._recheck_ns = now_ns() + int(recheck_s * 1e9)

    @property
    def name(self) -> str:
        """Name of the control segment."""
        return self._view.control.name

    def table(self) -> Table:
        """The current table: cached while nothing changed, remapped after a publish.

        When nothing changed this costs two shared-memory loads and a clock read (the
        clock paces the check for a replaced control segment). After a publish it maps
        the new generation once: verifies its checksum, validates its layout and wraps
        its rings.

        Raises
        ------
        TableChecksumError, SegmentLayoutError
            The current generation is corrupt (tables already returned stay usable
            while :meth:`Table.valid` says so).
        TableUnavailableError
            No consistent read within ``timeout_s``.
        """
        self._check_mapped()
        ctl, cur, t, seq_words, seq_index, seq = self._state
        if ctl[C_CURRENT] == cur:
            if WEAK:
                fence()
            if seq_words[seq_index] == seq and now_ns() < self._recheck_ns:
                return t  # never None here: cur is -1 while there is no table
        return self._refresh()

    def _check_mapped(self) -> None:
        """Refuse to touch segments shrunk under their mappings (a touch would be SIGBUS).

        A shrunk control segment is dropped for the namespace's new one if its writer
        made one (see :meth:`_follow_replacement`); a shrunk data segment is unmapped, so
        the next read maps whatever the control segment names then (the writer
        publishes into a new data segment when it notices).


        Raises
        ------
        SegmentSizeError
            The control segment shrank and has no replacement yet.
        """
        view = self._view
        if view.control.shrunk_to() is None and (
            view.data is None or view.data.shrunk_to() is None
        ):
            return
        with self._lock:
            view = self._view
            if view.control.shrunk_to() is not None:
                self._recheck_ns = 0
                self._follow_replacement()
                view = self._view
                view.control.check_size()
            data = view.data
            if data is not None and data.shrunk_to() is not None:
                view.data, view.data_epoch, view.bad = None, 0, None
                data.close()
                self._set_state(-1, None)

    def is_current(self, table: Table, guarded: bool = False) -> bool:
        """Whether :meth:`table` returns ``table`` now (nothing published since).

        Two shared-memory loads and no remapping: ``False`` once a new
        generation was published (the word ``current`` changed, or names the same
        buffer rewritten since), or when ``table`` is not this reader's current one. A
        replaced control segment is noticed by :meth:`table` (its clock paces the
        check), which callers still call now and then.

        Parameters
        ----------
        table
            A table this reader returned.
        guarded
            The caller touches the table's memory only through the native kernel's
            SIGBUS guard (:func:`shm.segment.kernel_guarded`): the two loads run under
            it too and no size is probed (a fault makes the answer ``False`` after the
            segments were asked). Otherwise both segments' sizes are probed first
            (:func:`shm.segment.intact`, an ``lseek`` each): the batch that follows
            touches both.
        """
        ctl, cur, t, seq_words, seq_index, seq = self._state
        if guarded and GUARDED:
            if t is not table:
                return False
            same = words_are(ctl, C_CURRENT, cur, seq_words, seq_index, seq)
            if same < 0:  # faulted: which segment shrank (a touch now would fault again)
                self._check_mapped()
                return False
            return same == 1
        view = self._view
        if not intact(view.control, view.data):
            self._check_mapped()
            ctl, cur, t, seq_words, seq_index, seq = self._state
        if t is not table or ctl[C_CURRENT] != cur:
            return False
        if WEAK:
            fence()
        return seq_words[seq_index] == seq

    def _set_state(self, cur: int, t: Table | None) -> None:
        if t is None:
            self._state = (self._ctl, -1, None, NO_SEQ, 0, 1)
        else:
            self._state = (self._ctl, cur, t, t._seq_words, t._seq_index, t._seq)

    def _refresh(self) -> Table:
        with self._lock:
            if self.background:
                kept = self._refresh_in_background()
                if kept is not None:
                    return kept
            if now_ns() >= self._recheck_ns:
                self._follow_replacement()
            ctl, cur, t = self._state[:3]
            if t is not None and ctl[C_CURRENT] == cur and t.valid():
                return t  # another thread remapped while we waited for the lock
            cur, t = self._view.read(t, self.timeout_s)
            self._set_state(cur, t)
            return t

    def _refresh_in_background(self) -> Table | None:
        """:meth:`_refresh` with ``background``; ``None``: read in the foreground.

        Called with the lock held. Returns the table to use now: a new generation the
        background thread finished mapping, or the previous table while it is still
        valid and the thread maps the new one. The view is only ever used by one
        thread at a time: the foreground reads only when no background map runs.
        """
        bg = self._bg
        ctl, cur, t = self._state[:3]
        if bg is not None:
            job, pid = bg
            if pid != os.getpid():
                self._bg = None  # inherited through fork: the thread is not ours
            else:
                if not job.done():
                    if t is not None and t.valid():
                        return t
                    job.wait()  # the previous table's buffer is being rewritten: wait
                self._bg = None
                if job.error is None:
                    new_cur, new = job.result
                    if new.valid():
                        self.mapped_in_background += 1
                        self._set_state(new_cur, new)
                        if ctl[C_CURRENT] == new_cur:
                            return new
                        cur, t = new_cur, new  # already superseded: map the next one
                else:
                    return None  # failed: the foreground read reports it (remembered)
        if now_ns() >= self._recheck_ns:
            # Before mapping in the background (the thread uses the view this may
            # replace); a replaced control segment resets the state: foreground.
            self._follow_replacement()
            ctl, cur, t = self._state[:3]
        if t is None or ctl[C_CURRENT] == cur or not t.valid():
            return None
        if self.foreground_bytes and self._view.payload_hint(ctl[C_CURRENT]) <= (
            self.foreground_bytes
        ):
            return None  # small: mapped at once by the caller
        view, timeout_s, prepare = self._view, self.timeout_s, self._prepare
        assert self._worker is not None
        job = self._worker.submit(lambda: read_ahead(view, timeout_s, prepare))
        self._bg = (job, os.getpid())
        return t

    def _prefetch(self) -> None:
        """On the background thread when idle: map a new generation nobody asked for yet.

        Only after the first :meth:`table` call, and never while a map is pending or a
        caller holds the lock (it will look itself). The next :meth:`table` call takes
        the mapped generation as it takes any background result.
        """
        if not self._lock.acquire(blocking=False):
            return
        try:
            bg = self._bg
            if bg is not None and (bg[1] != os.getpid() or not bg[0].done()):
                return
            ctl, cur, t = self._state[:3]
            now = ctl[C_CURRENT]
            # (The same current word names a newer generation once its buffer was reused.)
            if t is None or now == 0 or (now == cur and t.valid()):
                return
            if bg is not None:
                if bg[0].error is not None:
                    return  # a failed map: the next table() call reads (and reports) it
                done_cur, done = bg[0].result
                if done_cur == now and done.valid():
                    return  # mapped already, not picked up yet
            if now_ns() >= self._recheck_ns:
                self._follow_replacement()  # a stat; a replaced segment resets the state
                if self._state[2] is None:
                    return  # the next table() call maps the new writer's first table
            view, timeout_s, prepare = self._view, self.timeout_s, self._prepare
            assert self._worker is not None
            job = self._worker.submit(lambda: read_ahead(view, timeout_s, prepare))
            self._bg = (job, os.getpid())
        finally:
            self._lock.release()

    def mapped_ahead(self) -> int:
        """Generation the background thread mapped and :meth:`table` did not take yet (0: none)."""
        bg = self._bg
        if bg is None or bg[1] != os.getpid() or not bg[0].done() or bg[0].error is not None:
            return 0
        return int(bg[0].result[1].generation)

    def _background_busy(self) -> bool:
        bg = self._bg
        return bg is not None and bg[1] == os.getpid() and not bg[0].done()

    def _follow_replacement(self) -> None:
        """Switch to a new control segment if the namespace has one that was published."""
        if self._background_busy():
            return  # it reads the view this would replace: check again after it
        self._recheck_ns = now_ns() + int(self.recheck_s * 1e9)
        if current_inode(self.name) == self._inode:
            return
        try:
            control = attach_control(self.namespace, writable=False)
        except SegmentError:
            return  # gone, or being created: keep routing on the last table
        if control.words[C_CURRENT] == 0:
            control.close()  # its writer has published nothing yet: keep the last table
            return
        old = self._view
        self._bg = None  # a finished background map of the old segments: not ours now
        self._view = TablesView(control)
        self._ctl = self._view.cw
        self._set_state(-1, None)  # same segment names, other content: no reuse
        self._inode = control.inode
        self.reattached += 1
        old.close()  # tables handed out keep their own mappings alive

    def _maybe_follow(self) -> None:
        if now_ns() >= self._recheck_ns:
            with self._lock:
                self._follow_replacement()
        self._check_mapped()

    def consistent(self, fn: Callable[[Table], T]) -> T:
        """``fn(table)`` on the current table, repeated until it ran on a valid table.

        A failure of ``fn`` while the table was being rewritten is retried too; a
        failure on a valid table propagates. To use the table after ``fn`` (say its
        ``slots`` for the routed endpoints), return it from ``fn``:
        ``t, idx = reader.consistent(lambda t: (t, route_ring_set(t.ring_set, keys, now)))``
        (:func:`lbcore.route_ring_set`).
        """
        deadline = time.monotonic() + self.timeout_s
        while True:
            t = self.table()
            try:
                result = fn(t)
            except Exception:
                if t.valid():
                    raise
            else:
                if t.valid():
                    return result
            if time.monotonic() > deadline:
                raise TableUnavailableError(
                    self.name, f"no routing pass finished on a stable table in {self.timeout_s} s"
                )

    def generation(self) -> int:
        """Latest published generation as the control segment says (no remapping).

        A writer killed between switching ``current`` and storing the generation word
        leaves the word one behind the table ``current`` names (published all the same);
        when this reader has mapped that table, its generation is the answer.
        """
        self._maybe_follow()
        ctl, cur, t = self._state[:3]
        gen = int(self._ctl[C_GENERATION])
        if t is not None and ctl is self._ctl and ctl[C_CURRENT] == cur and t.generation > gen:
            return t.generation
        return gen

    def heartbeat_ns(self) -> int:
        """CLOCK_MONOTONIC time of the writer's last heartbeat or publish (ns)."""
        self._maybe_follow()
        return int(np.int64(np.uint64(self._ctl[C_HEARTBEAT])))

    def status(self) -> PublisherStatus | None:
        """The writer's report on its sources (:meth:`TableWriter.set_status`).

        ``None`` when it cannot be read (a writer killed while rewriting it).
        """
        self._maybe_follow()
        return read_status(self._view.control)

    def writer_pid(self) -> int:
        """PID of the last process that took over as writer (0 if none)."""
        self._maybe_follow()
        return int(self._ctl[C_WRITER_PID])

    def writer_alive(self) -> bool:
        """True if that writer process is still running (PID and start time match)."""
        self._maybe_follow()
        return process_alive(self._ctl[C_WRITER_PID], self._ctl[C_WRITER_START])

    def replaced(self) -> bool:
        """True if the control segment this reader maps was removed or recreated.

        :meth:`table` follows a new control segment by itself once its writer has
        published (then this is False again). Costs one ``stat`` call.
        """
        return current_inode(self.name) != self._inode

    def close(self) -> None:
        """Drop this reader's mappings (tables already returned keep theirs alive)."""
        with self._lock:
            bg = self._bg
            if bg is not None and bg[1] == os.getpid():
                bg[0].wait()
            self._bg = None
            if self._worker is not None:
                self._worker.close()
            self._set_state(-1, None)
            self._view.close()

    def __enter__(self) -> TableReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
