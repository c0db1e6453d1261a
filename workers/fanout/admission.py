"""FIFO admission of fan-outs: a worker's calls in flight stay under a cap, in order.

With every call of a batch in flight at once, a worker's calls in flight are bounded
by what it admits, not by a pool. :class:`Admission` admits a fan-out with its ``n``
calls when the worker has room (``in flight + n <= max_calls``, or nothing in flight: a
batch larger than the cap still runs, alone); else the fan-out waits in line, first
come first served, for at most ``timeout_s``; with ``queue_size`` fan-outs already
waiting, or after the wait, it is refused at once (Skipper's ``fifo(maxConcurrency,
maxQueueSize, timeout)`` filter, counted in calls). Threads wait on an event; asyncio
tasks on a future of their loop. One per worker process.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

__all__ = ["Admission", "AdmissionError"]


class AdmissionError(Exception):
    """A fan-out the worker could not take: its line is full, or the wait ran out."""


class _Waiter:
    __slots__ = ("calls", "granted", "wake")

    def __init__(self, calls: int, wake: Any) -> None:
        self.calls = calls
        self.granted = False
        self.wake = wake


class Admission:
    """The worker's calls in flight, and the fan-outs waiting for room, in order.

    Parameters
    ----------
    max_calls
        Most calls in flight at once (``CSLB_FANOUT_MAX_IN_FLIGHT``).
    queue_size
        Most fan-outs waiting at once (``CSLB_FANOUT_FIFO_SIZE``).
    timeout_s
        Longest wait of one fan-out, in seconds (``CSLB_FANOUT_FIFO_TIMEOUT``).
    """

    def __init__(self, max_calls: int, queue_size: int, timeout_s: float) -> None:
        self.max_calls = int(max_calls)
        self.queue_size = int(queue_size)
        self.timeout_s = float(timeout_s)
        self.in_flight = 0
        self._line: collections.deque[_Waiter] = collections.deque()
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Fan-outs in line now."""
        return len(self._line)

    def _fits(self, calls: int) -> bool:
        return self.in_flight == 0 or self.in_flight + calls <= self.max_calls

    def _try(self, calls: int, wake: Any) -> _Waiter | None:
        """Admit now (``None``), or a place in line; raises when the line is full."""
        with self._lock:
            if not self._line and self._fits(calls):
                self.in_flight += calls
                return None
            if len(self._line) >= self.queue_size:
                raise AdmissionError(
                    f"the worker has {self.in_flight} calls in flight and {len(self._line)} "
                    f"fan-outs waiting (CSLB_FANOUT_FIFO_SIZE={self.queue_size}): not sent"
                )
            w = _Waiter(calls, wake)
            self._line.append(w)
            return w

    def _give_up(self, w: _Waiter, waited_s: float) -> None:
        """The wait ran out: out of line, unless room came meanwhile."""
        with self._lock:
            if w.granted:
                return
            self._line.remove(w)
            self._grant()
        raise AdmissionError(
            f"no room for {w.calls} calls within {waited_s:g} s "
            f"(CSLB_FANOUT_MAX_IN_FLIGHT={self.max_calls}, "
            f"CSLB_FANOUT_FIFO_TIMEOUT={self.timeout_s:g}): not sent"
        )

    def _grant(self) -> None:
        """Admit the fan-outs at the head of the line that fit now (lock held)."""
        line = self._line
        while line and self._fits(line[0].calls):
            w = line.popleft()
            self.in_flight += w.calls
            w.granted = True
            w.wake()

    def enter(self, calls: int, wait_s: float | None = None) -> None:
        """Admit ``calls`` calls, waiting in line on this thread if needed.

        Raises
        ------
        AdmissionError
            The line is full, or no room came within ``min(wait_s, timeout_s)``.
        """
        event = threading.Event()
        w = self._try(calls, event.set)
        if w is None:
            return
        limit = self.timeout_s if wait_s is None else min(wait_s, self.timeout_s)
        if not event.wait(max(limit, 0.0)):
            self._give_up(w, limit)

    async def aenter(self, calls: int, wait_s: float | None = None) -> None:
        """:meth:`enter` for a task on the running loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            # (called under the lock, maybe from another thread)
            loop.call_soon_threadsafe(_set, fut)

        w = self._try(calls, wake)
        if w is None:
            return
        limit = self.timeout_s if wait_s is None else min(wait_s, self.timeout_s)
        try:
            await asyncio.wait_for(asyncio.shield(fut), max(limit, 0.0))
        except TimeoutError:
            self._give_up(w, limit)
        except BaseException:  # the caller was cancelled while in line
            with self._lock:
                if not w.granted:
                    self._line.remove(w)
                    self._grant()
                    raise
            self.leave(calls)
            raise

    def leave(self, calls: int) -> None:
        """``calls`` admitted calls ended: room for the fan-outs in line."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - calls)
            self._grant()


def _set(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
