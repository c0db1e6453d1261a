"""Helpers for tests of work taken off the routing thread: holding shm's background
mapping thread at a seam, and running a function in a forked child."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from shm.segment import set_seam_hook


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
