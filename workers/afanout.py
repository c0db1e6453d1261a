"""The fan-out helper for asyncio workers: ``await router.afanout(keys, asend)``.

The same plan and jobs as ``router.fanout`` (:mod:`workers.fanout_plan`), driven on the
running event loop instead of a thread pool: up to ``CSLB_FANOUT_THREADS`` calls per
worker are in flight at once (:class:`Limiter`); those that get a slot when the
fan-out starts start together and are recorded in one step
(:meth:`workers.ledger.CallLedger.begin_many`), the others as slots free up. Each call
is bounded by its timeout through cancellation (``asyncio.timeout``), so a sender that
ignores its timeout still cannot hold the fan-out past it. Retries sleep with
``asyncio.sleep``.

Tasks of many requests interleave on the loop's one thread, so nothing here uses the
router's per-thread "last batch": the plan keeps the table each route was computed on.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from workers.fanout import FanOut, Result
from workers.fanout_plan import Job, Plan, group_job, key_job

__all__ = ["run"]


class Limiter:
    """Calls in flight at once on one event loop (``CSLB_FANOUT_THREADS``), FIFO.

    Starting every call of a big batch at once would make each one wait for the
    others on the loop's one thread, and that wait would be recorded as the pods'
    busy time (and time calls out on every pod alike: a saturated caller).
    """

    def __init__(self, n: int) -> None:
        self.free = n
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_take(self) -> bool:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.try_take():
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except BaseException:
            if not fut.cancelled() and fut.done():
                self.give()  # handed a slot as it was cancelled: pass it on
            raise

    def give(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot goes straight to the next waiter
                return
        self.free += 1


_LIMITERS: dict[int, Limiter] = {}


def _limiter(fan: FanOut) -> Limiter:
    key = id(asyncio.get_running_loop())
    lim = _LIMITERS.get(key)
    if lim is None:
        _LIMITERS.clear()  # (one loop per worker; a new loop gets a new limiter)
        lim = _LIMITERS[key] = Limiter(fan.settings.threads)
    return lim


async def run(
    fan: FanOut,
    keys: Sequence[Any],
    asend: Callable[..., Any],
    timeout_s: float | None,
    deadline_s: float | None,
    grouped: bool = False,
) -> list[Result]:
    """:meth:`workers.Router.afanout`."""
    plan = fan.plan(keys, asend, timeout_s, deadline_s, grouped)
    cap = fan.settings.cap_for(asyncio=True)
    lim = _limiter(fan)
    jobs = plan.jobs
    job = group_job if grouped else key_job
    # The calls that get a slot now start together: one recording step for all.
    n_now = 0
    while n_now < len(jobs) and lim.try_take():
        n_now += 1
    firsts = [plan.slots[j[0] if grouped else j] for j in jobs[:n_now]]
    t0, admitted = fan.ledger.begin_many(firsts, plan.bound, cap) if n_now else (0, [])
    tasks = [
        asyncio.ensure_future(_drive(plan, job(plan, j, cap, t0 if ok else -1), lim))  # type: ignore[arg-type]
        for j, ok in zip(jobs[:n_now], admitted, strict=True)
    ]
    tasks += [
        asyncio.ensure_future(_drive(plan, job(plan, j, cap), lim, wait=True))  # type: ignore[arg-type]
        for j in jobs[n_now:]
    ]
    tasks += [asyncio.ensure_future(_drive(plan, g, None)) for g, _ in fan.fallback_jobs(plan)]
    if tasks:
        left = (plan.deadline_ns - plan.clock()) / 1e9
        # Each call is bounded by its own timeout (at most the deadline); the margin
        # covers a task the loop could not run in time.
        _, late = await asyncio.wait(tasks, timeout=max(left, 0.0) + 0.05)
        for t in late:
            t.cancel()
        if late:
            await asyncio.wait(late, timeout=0.1)
    return fan.finish(plan)


async def _drive(plan: Plan, job: Job, lim: Limiter | None, wait: bool = False) -> None:
    """Run a job on the loop: its calls awaited under their timeouts, its backoff slept.

    ``lim``: the slot the job holds (taken already, or first, with ``wait``), given
    back when it ends.
    """
    send = plan.send
    with_timeout = plan.with_timeout
    if wait and lim is not None:
        await lim.take()
    try:
        op = next(job)
        while True:
            if op[0] == "call":
                _, url, what, timeout = op
                try:
                    async with asyncio.timeout(timeout):
                        if with_timeout:
                            value = await send(url, what, timeout=timeout)
                        else:
                            value = await send(url, what)
                    got: tuple[Any, BaseException | None] = (value, None)
                except Exception as exc:
                    got = (None, exc)
                op = job.send(got)
            elif op[0] == "slot":
                op = job.send(await _slot(plan, op[1], op[2]))
            else:
                await asyncio.sleep(op[1])
                op = job.send(None)
    except StopIteration:
        pass
    finally:
        job.close()  # cancelled mid-call: the job records the call's end
        if lim is not None:
            lim.give()


async def _slot(plan: Plan, slot: int, cap: int) -> int:
    """A ``("slot", slot, cap)`` operation on the loop (see :meth:`Plan.slot`)."""
    while True:
        t0 = plan.slot(slot, cap)
        if t0 != -1 or plan.clock() >= plan.deadline_ns:
            return t0
        await asyncio.sleep(0.001)  # (calls end on this loop: a millisecond is plenty)
