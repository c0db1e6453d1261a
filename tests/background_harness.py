"""Helpers for tests of work taken off the routing thread: holding shm's background
mapping thread at a seam, and running a function in a forked child, forking while a lock is held."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from shm.seams import set_seam_hook


@contextmanager
def held_background_map() -> Iterator[threading.Event]:
    """Hold shm's background mapping thread at its first seam until the event is set."""
    gate = threading.Event()

    def hook(point: str) -> None:
        if point == "tables.read.mapped" and threading.current_thread().name == "cslb-table-map":
            assert gate.wait(10), "background map held too long"

    set_seam_hook(hook)
    try:
        yield gate
    finally:
        gate.set()
        set_seam_hook(None)


def run_forked(
    target: Callable[..., None],
    *args: Any,
    while_running: Callable[[], None] | None = None,
    timeout_s: float = 20.0,
) -> tuple[Any, int]:
    """Run ``target(*args, conn)`` in a forked child; what it sent on ``conn``, its PID.

    ``while_running`` is called in the parent once the child has started. The child is
    killed if it has not ended 10 s after reporting.
    """
    ctx = multiprocessing.get_context("fork")
    a, b = ctx.Pipe(duplex=False)
    p = ctx.Process(target=target, args=(*args, b), daemon=True)
    p.start()
    try:
        if while_running is not None:
            while_running()
        assert a.poll(timeout_s), "child did not report"
        return a.recv(), p.pid
    finally:
        p.join(10)
        if p.exitcode is None:
            p.kill()
            p.join(5)


def _checked_in_child(obj: Any, check: Callable[[Any], Any], conn) -> None:
    conn.send(bool(check(obj)))  # (blocks for good on a lock left held)


def fork_while_locked(obj: Any, check: Callable[[Any], Any]) -> bool:
    """Fork while another thread holds ``obj``'s lock; does ``check(obj)`` pass in the child?

    ``check`` uses ``obj`` as a caller would (a job submitted, a table read): with the lock
    left held in the child it would block, and the child never reports. Nothing public
    holds the lock for long, so the holding thread takes ``obj._lock`` itself.
    """
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with obj._lock:
            held.set()
            release.wait(20)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        return run_forked(_checked_in_child, obj, check)[0]
    finally:
        release.set()
        t.join(10)
