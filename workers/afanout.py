"""The fan-out helper for asyncio workers: ``await router.afanout(keys, asend)``.

The same plan and jobs as ``router.fanout`` (:mod:`workers.fanout_plan`), driven on the
running event loop instead of a thread pool: every call of the batch starts at once
(recorded in one step, :meth:`workers.ledger.CallLedger.begin_many`), each bounded by
its timeout through cancellation (``asyncio.timeout``), so a sender that ignores its
timeout still cannot hold the fan-out past it. Retries sleep with ``asyncio.sleep``.

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
    firsts = [plan.slots[j[0] if grouped else j] for j in jobs]
    t0, admitted = fan.ledger.begin_many(firsts, plan.bound, cap)
    job = group_job if grouped else key_job
    gens: list[Job] = [
        job(plan, j, cap, t0 if ok else -1)  # type: ignore[arg-type]
        for j, ok in zip(jobs, admitted, strict=True)
    ]
    gens += [g for g, _ in fan.fallback_jobs(plan)]
    if gens:
        tasks = [asyncio.ensure_future(_drive(plan, g)) for g in gens]
        left = (plan.deadline_ns - plan.clock()) / 1e9
        # Each call is bounded by its own timeout (at most the deadline); the margin
        # covers a task the loop could not run in time.
        _, late = await asyncio.wait(tasks, timeout=max(left, 0.0) + 0.05)
        for t in late:
            t.cancel()
        if late:
            await asyncio.wait(late, timeout=0.1)
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
            else:
                await asyncio.sleep(op[1])
                op = job.send(None)
    except StopIteration:
        pass
    finally:
        job.close()  # cancelled mid-call: the job records the call's end
