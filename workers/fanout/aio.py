"""The fan-out helper for asyncio workers: ``await router.afanout(keys, asend)``.

The same state and jobs as ``router.fanout`` (:mod:`workers.fanout.jobs`), driven on the
running event loop instead of a thread pool: a fan-out runs as many runner tasks as
the worker's loop has free slots (:class:`Limiter`, ``CSLB_FANOUT_THREADS`` calls in
flight per worker, at least one runner per fan-out), each taking the next job when its
last one ends; the runners' first calls start together and are recorded in one step
(:meth:`workers.fanout.ledger.CallLedger.begin_many`). Each call
is bounded by its timeout through cancellation, so a sender that ignores its timeout
still cannot hold the fan-out past it: one lazily moved timer per task (:class:`_Watch`)
instead of ``asyncio.timeout``'s timer per call, which cost a third of the helper's CPU
per key. Retries sleep with ``asyncio.sleep``. A fan-out whose caller is cancelled
cancels its calls (each still recorded as ended, not as the pod's failure).

Tasks of many requests interleave on the loop's one thread, so nothing here uses the
router's per-thread "last batch": the state keeps the table each route was computed on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from workers.fanout.curl_driver import by_curl, run_async
from workers.fanout.jobs import FanOutState, Job, group_job, key_job
from workers.fanout.reports import take_over
from workers.fanout.threads import FanOut, Result

__all__ = ["run"]


class Limiter:
    """Calls in flight at once on one event loop (``CSLB_FANOUT_THREADS``).

    Starting every call of a big batch at once would make each one wait for the
    others on the loop's one thread, and that wait would be recorded as the pods'
    busy time (and time calls out on every pod alike: a saturated caller). A fan-out
    takes the free slots for its runners (at least one runner, so it always moves).
    One that got fewer runners than it has jobs waits in line (:meth:`wait`): slots
    given back go to the fan-outs in line first, oldest first, so a fan-out that
    started while others held every slot is not left on one runner while later
    fan-outs take all the slots again (it would run many times slower, into its
    deadline).
    """

    def __init__(self, n: int) -> None:
        self.free = n
        self._line: list[Callable[[int], int]] = []

    def take(self, n: int) -> int:
        """Up to ``n`` slots; how many were free."""
        got = max(0, min(n, self.free))
        self.free -= got
        return got

    def wait(self, grant: Callable[[int], int]) -> None:
        """Get in line for more slots: ``grant(k)`` takes up to ``k``, says how many."""
        self._line.append(grant)

    def leave(self, grant: Callable[[int], int]) -> None:
        """Out of the line (the fan-out ended)."""
        with contextlib.suppress(ValueError):
            self._line.remove(grant)

    def give(self, n: int) -> None:
        """Give ``n`` slots back: to the fan-outs in line first."""
        self.free += n
        while self.free > 0 and self._line:
            got = self._line[0](self.free)
            self.free -= got
            if got == 0:  # (it has no jobs left to start: out of the line)
                self._line.pop(0)


_LIMITERS: dict[int, Limiter] = {}


def _limiter(fan: FanOut) -> Limiter:
    key = id(asyncio.get_running_loop())
    lim = _LIMITERS.get(key)
    if lim is None:
        _LIMITERS.clear()  # (one loop per worker; a new loop gets a new limiter)
        lim = _LIMITERS[key] = Limiter(fan.settings.threads)
    return lim


class _Watch:
    """Bounds the current call of one task by its timeout, with one timer per task.

    ``asyncio.timeout`` schedules and cancels a timer for every call; here a task keeps
    one timer, moved only when it fires before the running call's end time (calls that
    end in time touch no timer). When a call is over its time the task is cancelled,
    and :meth:`expired` turns that cancellation into a timeout (Python's own
    ``uncancel`` bookkeeping keeps a cancellation from outside one).
    """

    __slots__ = ("_fired", "_handle", "_loop", "_task", "until")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._handle: asyncio.TimerHandle | None = None
        self._fired = False
        self.until: float | None = None  # the running call's end time (loop clock)

    def start(self, timeout_s: float) -> None:
        """A call bounded by ``timeout_s`` starts now."""
        until = self._loop.time() + timeout_s
        self.until = until
        h = self._handle
        if h is None or h.when() > until:
            if h is not None:
                h.cancel()
            self._handle = self._loop.call_at(until, self._check)

    def _check(self) -> None:
        self._handle = None
        until = self.until
        if until is None:
            return
        if self._loop.time() >= until:
            self.until = None
            self._fired = True
            if self._task is not None:
                self._task.cancel()
        else:
            self._handle = self._loop.call_at(until, self._check)

    def expired(self) -> bool:
        """After a call: whether this watch cancelled it, and only this watch."""
        self.until = None
        if not self._fired:
            return False
        self._fired = False
        task = self._task
        return task is None or task.uncancel() == 0

    def close(self) -> None:
        """No more calls: drop the timer."""
        self.until = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def run(fan: FanOut, state: FanOutState) -> list[Result]:
    """:meth:`workers.Router.afanout` of a prepared fan-out (:meth:`FanOut.prepare`)."""
    if by_curl(state):
        return await run_async(fan, state)
    cap = fan.settings.cap_for(asyncio=True)
    jobs = state.jobs
    grouped = state.grouped
    make = group_job if grouped else key_job
    lim = _limiter(fan)
    held = lim.take(len(jobs))
    n = max(held, 1) if jobs else 0
    # The runners' first calls start together: one recording step for all of them.
    firsts = [state.slots[j[0] if grouped else j] for j in jobs[:n]]
    t0, admitted = fan.ledger.begin_many(firsts, cap) if n else (0, [])
    rest = iter(jobs[n:])  # (the runners take the next job from here, one at a time)
    unstarted = len(jobs) - n  # jobs no runner took yet
    coming = 0  # runners granted later that did not take a job yet

    async def runner(first: Any, started: int) -> None:
        nonlocal unstarted, coming
        watch = _Watch()
        try:
            if first is not None:
                await _drive(state, make(state, first, cap, started), watch)  # type: ignore[arg-type]
            else:
                coming -= 1
            for j in rest:
                unstarted -= 1
                if state.closed:
                    return
                await _drive(state, make(state, j, cap), watch)  # type: ignore[arg-type]
        finally:
            watch.close()

    async def alone(job: Job) -> None:
        watch = _Watch()
        try:
            await _drive(state, job, watch)
        finally:
            watch.close()

    tasks = [
        asyncio.ensure_future(runner(j, t0 if ok else -1))
        for j, ok in zip(jobs[:n], admitted, strict=True)
    ]
    tasks += [asyncio.ensure_future(alone(g)) for g, _ in fan.fallback_jobs(state)]

    def grant(k: int) -> int:
        """Slots given back by other fan-outs: more runners, up to the jobs not started."""
        nonlocal held, coming
        got = 0 if state.closed else min(k, unstarted - coming)
        if got <= 0:
            return 0
        held += got
        coming += got
        tasks.extend(asyncio.ensure_future(runner(None, -1)) for _ in range(got))
        return got

    if unstarted > 0:
        lim.wait(grant)
    try:
        if tasks:
            loop = asyncio.get_running_loop()
            # Each call is bounded by its own timeout (at most the deadline); the margin
            # covers a task the loop could not run in time.
            end = loop.time() + max((state.deadline_ns - state.clock()) / 1e9, 0.0) + 0.05
            while late := [t for t in tasks if not t.done()]:  # (grant() may add runners)
                left = end - loop.time()
                if left > 0:
                    await asyncio.wait(late, timeout=left)
                    continue
                for t in late:
                    t.cancel()
                await asyncio.wait(late, timeout=0.1)
                break
    except BaseException:  # the caller was cancelled: so are its calls
        for t in tasks:
            t.cancel()
        raise
    finally:
        lim.leave(grant)
        lim.give(held)
    return fan.finish(state)


async def _drive(state: FanOutState, job: Job, watch: _Watch) -> None:
    """Run a job on the loop: its calls awaited under their timeouts, its backoff slept."""
    send = state.send
    with_timeout = state.with_timeout
    try:
        op = next(job)
        while True:
            if op[0] == "call":
                _, url, what, timeout = op
                watch.start(timeout)
                try:
                    if with_timeout:
                        value = await send(url, what, timeout=timeout)
                    else:
                        value = await send(url, what)
                    # (the answer's load headers, reports on: left by our senders)
                    got: tuple[Any, ...] = (value, None, None, take_over())
                    watch.expired()  # (a sender that swallowed the cancellation)
                except asyncio.CancelledError:
                    take_over()
                    if not watch.expired():
                        raise
                    got = (None, TimeoutError(f"{url}: no answer within {timeout:g} s"))
                except Exception as exc:
                    watch.expired()
                    got = (None, exc, None, take_over())
                op = job.send(got)
            elif op[0] == "slot":
                op = job.send(await _slot(state, op[1], op[2]))
            else:
                await asyncio.sleep(op[1])
                op = job.send(None)
    except StopIteration:
        pass
    finally:
        job.close()  # cancelled mid-call: the job records the call's end


async def _slot(state: FanOutState, slot: int, cap: int) -> int:
    """A ``("slot", slot, cap)`` operation on the loop (see :meth:`FanOutState.slot`)."""
    while True:
        t0 = state.slot(slot, cap)
        if t0 != -1 or state.clock() >= state.deadline_ns:
            return t0
        await asyncio.sleep(0.001)  # (calls end on this loop: a millisecond is plenty)
