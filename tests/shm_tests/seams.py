"""Two threads on one shared-memory object, the first held at a seam of the code."""

from __future__ import annotations

import threading
from collections.abc import Callable

from shm.seams import set_seam_hook


def second_waits_for_first(
    point: str,
    first: Callable[[], None],
    second: Callable[[], None],
    while_held: Callable[[], None] = lambda: None,
) -> bool:
    """Whether ``second`` had to wait for ``first`` held at seam ``point``.

    Runs ``first`` in thread A until it reaches ``point`` (its first time) and holds it
    there; calls ``while_held``; runs ``second`` in thread B and looks whether B is still
    running 0.3 s later; then lets A go and joins both (10 s each at most).
    """
    paused, go = threading.Event(), threading.Event()
    a_thread = threading.Thread(target=first)

    def hook(at: str) -> None:
        if at == point and threading.current_thread() is a_thread and not paused.is_set():
            paused.set()
            go.wait(10)

    set_seam_hook(hook)
    try:
        a_thread.start()
        assert paused.wait(10), f"thread A never reached {point}"
        while_held()
        b_thread = threading.Thread(target=second)
        b_thread.start()
        b_thread.join(0.3)
        waited = b_thread.is_alive()
        go.set()
        a_thread.join(10)
        b_thread.join(10)
    finally:
        set_seam_hook(None)
    return waited
