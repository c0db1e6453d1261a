"""The fan-out helper for asyncio workers: ``await router.afanout(keys, asend)``.

The same plan and jobs as ``router.fanout`` (:mod:`workers.fanout_plan`), driven on the
running event loop instead of a thread pool: a fan-out runs as many runner tasks as
the worker's loop has free slots (:class:`Limiter`, ``CSLB_FANOUT_THREADS`` calls in
flight per worker, at least one runner per fan-out), each taking the next job when its
last one ends; the runners' first calls start together and are recorded in one step
(:meth:`workers.ledger.CallLedger.begin_many`). Each call
is bounded by its timeout through cancellation (``asyncio.timeout``), so a sender that
ignores its timeout still cannot hold the fan-out past it. Retries sleep with
``asyncio.sleep``.

Tasks of many requests interleave on the loop's one thread, so nothing here uses the
router's per-thread "last batch": the plan keeps the table each route was computed on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from workers.fanout import FanOut, Result
from workers.fanout_plan import Job, Plan, group_job, key_job

__all__ = ["run"]


class Limiter:
    """Calls in flight at once on one event loop (``CSLB_FANOUT_THREADS``).

    Starting every call of a big batch at once would make each one wait for the
    others on the loop's one thread, and that wait would be recorded as the pods'
    busy time (and time calls out on every pod alike: a saturated caller). A fan-out
    takes the free slots for its runners (at least one runner, so it always moves).
    """

    def __init__(self, n: int) -> None:
        self.free = n

    def take(self, n: int) -> int:
        """Up to ``n`` slots; how many were free."""
        got = max(0, min(n, self.free))
        self.free -= got
        return got

    def give(self, n: int) -> None:
        self.free += n


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
    jobs = plan.jobs
    make = group_job if grouped else key_job
    lim = _limiter(fan)
    held = lim.take(len(jobs))
    n = max(held, 1) if jobs else 0
    # The runners' first calls start together: one recording step for all of them.
    firsts = [plan.slots[j[0] if grouped else j] for j in jobs[:n]]
    t0, admitted = fan.ledger.begin_many(firsts, cap) if n else (0, [])
    rest = iter(jobs[n:])  # (the runners take the next job from here, one at a time)

    async def runner(first: Any, started: int) -> None:
        await _drive(plan, make(plan, first, cap, started))  # type: ignore[arg-type]
        for j in rest:
            if plan.closed:
                return
            await _drive(plan, make(plan, j, cap))  # type: ignore[arg-type]

    tasks = [
        asyncio.ensure_future(runner(j, t0 if ok else -1))
        for j, ok in zip(jobs[:n], admitted, strict=True)
    ]
    tasks += [asyncio.ensure_future(_drive(plan, g)) for g, _ in fan.fallback_jobs(plan)]
    try:
        if tasks:
            left = (plan.deadline_ns - plan.clock()) / 1e9
            # Each call is bounded by its own timeout (at most the deadline); the margin
            # covers a task the loop could not run in time.
            _, late = await asyncio.wait(tasks, timeout=max(left, 0.0) + 0.05)
            for t in late:
                t.cancel()
            if late:
                await asyncio.wait(late, timeout=0.1)
    finally:
        lim.give(held)
    return fan.finish(plan)


async def _drive(plan: Plan, job: Job) -> None:
    """Run a job on the loop: its calls awaited under their timeouts, its backoff slept."""
    send = plan.send
    with_timeout = plan.with_timeout
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


async def _slot(plan: Plan, slot: int, cap: int) -> int:
    """A ``("slot", slot, cap)`` operation on the loop (see :meth:`Plan.slot`)."""
    while True:
        t0 = plan.slot(slot, cap)
        if t0 != -1 or plan.clock() >= plan.deadline_ns:
            return t0
        await asyncio.sleep(0.001)  # (calls end on this loop: a millisecond is plenty)
