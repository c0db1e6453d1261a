"""The fan-out on libcurl's multi interface: every call of a batch in flight at once.

``router.fanout(keys, CurlSender(...))`` and ``await router.afanout(keys, sender)`` run
the state's jobs (:mod:`workers.fanout.jobs`: the same retry, bulkhead, recording and
failure log as the other forms) as a :class:`Batch` on a reactor of
:mod:`workers.fanout.curl_transport`: each job's calls become transfers on the worker
thread's (or the event loop's) multi handle, all started together; its backoff sleeps
and its waits for a bulkhead slot become reactor timers. One description drives both
forms; only who waits differs (:func:`run_sync` runs the thread's ``epoll`` loop until
the batch ends, :func:`run_async` awaits a future the loop's callbacks resolve).

Nothing here throttles a healthy batch: there is no pool and no cap below the batch
size. A worker's calls in flight are bounded by FIFO admission
(:class:`workers.fanout.admission.Admission`); the bulkhead (the state's) refuses calls only to a
pod whose oldest call from this worker has been out a quarter of the call timeout (a
frozen pod), or that holds ``CSLB_FANOUT_ENDPOINT_CAP`` calls when that is set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from workers.fanout.admission import AdmissionError
from workers.fanout.curl_transport import Outcome, Reactor, loop_reactor, thread_reactor
from workers.fanout.jobs import FanOutState, Job, RejectedError, Result, group_job, key_job
from workers.fanout.ledger import CUT
from workers.routing.errors import RouterInputError

__all__ = ["Batch", "by_curl", "run_async", "run_sync"]

log = logging.getLogger("cslb.router")

_START = object()
# How often a job waiting for a bulkhead slot looks again (s): calls end within ms.
_SLOT_POLL_S = 0.001


class Batch:
    """The jobs of one state, moved by a reactor's calls and timers.

    Parameters
    ----------
    state
        The fan-out's state.
    reactor
        The worker thread's or the event loop's reactor.
    request
        The sender (:class:`workers.fanout.senders.CurlSender`): builds requests, reads answers.
    """

    def __init__(self, state: FanOutState, reactor: Reactor, request: Any) -> None:
        self.state = state
        self.reactor = reactor
        self.transport = reactor.transport
        self.transport.expect_pods(len(state.urls))
        self.request = request
        self.active = 0
        self.on_idle: Callable[[], None] | None = None
        self._calls: dict[Job, Any] = {}  # job -> its transfer in flight
        self._timers: dict[Job, Any] = {}  # job -> its timer (a sleep, a slot wait)
        self._failed: BaseException | None = None  # (the last call that could not start)

    def add(self, job: Job) -> None:
        """Start ``job`` now (its first call goes out with the others)."""
        self.active += 1
        self._advance(job, _START)

    def done(self) -> bool:
        """Every job ended."""
        return self.active == 0

    def _advance(self, job: Job, value: Any) -> None:
        """Give ``job`` what it waited for; start what it asks for next."""
        state = self.state
        try:
            op = next(job) if value is _START else job.send(value)
            while True:
                what = op[0]
                if what == "call":
                    if self._call(job, op[1], op[2], op[3]):
                        return
                    op = job.send((None, self._failed, 0))
                    continue
                if what == "sleep":
                    self._timers[job] = self.reactor.call_later(
                        op[1], lambda: self._woke(job, None)
                    )
                    return
                t0 = state.slot(op[1], op[2])  # ("slot", slot, cap)
                if t0 != -1 or state.clock() >= state.deadline_ns:
                    op = job.send(t0)
                    continue
                self._timers[job] = self.reactor.call_later(
                    _SLOT_POLL_S, lambda op=op: self._slot_again(job, op)
                )
                return
        except StopIteration:
            self._ended(job)

    def _call(self, job: Job, url: str, what: Any, timeout: float) -> bool:
        """Start the call; ``False`` if it could not even be asked (the key's error)."""
        r = self.request
        try:
            if self.state.grouped:
                full, body = r.batch_url(url), r.batch_body(what)
            else:
                full, body = r.url_of(url, what), None
            self._calls[job] = self.transport.start(
                r,
                full,
                what,
                body,
                timeout,
                lambda out: self._answered(job, out),
                self.state.grouped,
            )
        except Exception as exc:  # a key or header libcurl cannot send: that key's error
            from workers.fanout.senders import CallError

            self._failed = CallError(f"{url}: the request could not be made: {exc!r}", url)
            return False
        return True

    def _answered(self, job: Job, outcome: Outcome) -> None:
        del self._calls[job]
        self._advance(job, outcome)

    def _woke(self, job: Job, value: Any) -> None:
        del self._timers[job]
        self._advance(job, value)

    def _slot_again(self, job: Job, op: tuple[Any, ...]) -> None:
        del self._timers[job]
        state = self.state
        t0 = state.slot(op[1], op[2])
        if t0 != -1 or state.clock() >= state.deadline_ns:
            self._advance(job, t0)
        else:
            self._timers[job] = self.reactor.call_later(
                _SLOT_POLL_S, lambda: self._slot_again(job, op)
            )

    def _ended(self, job: Job) -> None:
        self.active -= 1
        if self.active == 0 and self.on_idle is not None:
            self.on_idle()

    def holds(self, job: Job) -> bool:
        """``job`` has a call out or a timer set (:meth:`stop` ends it)."""
        return job in self._calls or job in self._timers

    def stop(self) -> None:
        """The deadline passed (or the caller gave up): stop every call and job.

        Each stopped call is recorded as ended, cut short by the caller (the job's own
        ``GeneratorExit`` handling), never as the pod's failure.
        """
        calls, timers = self._calls, self._timers
        self._calls, self._timers = {}, {}
        for job, handle in calls.items():
            self.transport.cancel(handle)
            job.close()
        for job, timer in timers.items():
            timer.cancel()
            job.close()
        self.active = 0


def start_jobs(fan: Any, state: FanOutState, cap: int) -> tuple[list[Job], list[tuple[int, int]]]:
    """The state's jobs, their first calls begun together (one ledger step for all).

    Also the ``(slot, start)`` of each job's begun call (slot ``-1``: none), for a job
    never started: a generator closed before its first step runs no code, so its begun
    call is ended by :func:`_wind_up` instead.
    """
    grouped = state.grouped
    make = group_job if grouped else key_job
    slots = state.slots
    firsts = [slots[j[0] if grouped else j] for j in state.jobs]  # type: ignore[index]
    t0, admitted = fan.ledger.begin_many(firsts, cap, state.stuck_ns) if firsts else (0, [])
    jobs: list[Job] = [
        make(state, j, cap, t0 if ok else -1)  # type: ignore[arg-type]
        for j, ok in zip(state.jobs, admitted, strict=True)
    ]
    begun = [(s, t0) if ok else (-1, 0) for s, ok in zip(firsts, admitted, strict=True)]
    fallback = [g for g, _ in fan.fallback_jobs(state)]
    return jobs + fallback, begun + [(-1, 0)] * len(fallback)


def _wind_up(
    fan: Any,
    batch: Batch,
    jobs: list[Job],
    begun: list[tuple[int, int]],
    started: int,
    calls: int,
) -> None:
    """Stop what is left of a batch and give its admitted room back (both forms).

    ``started``: jobs the batch took. The begun calls of the jobs it never took end as
    cut short (a generator closed before its first step runs no code to do it).
    """
    if started < len(jobs) and batch.holds(jobs[started]):
        started += 1  # (the job that failed to start had its call out: stop() ends it)
    batch.stop()
    state = batch.state
    for slot, t0 in begun[started:]:
        if slot >= 0:
            state.end(slot, t0, CUT, True)
    if calls:
        fan.admission.leave(calls)


def _refuse(fan: Any, state: FanOutState, exc: AdmissionError) -> list[Result]:
    """Every key of a fan-out the worker could not admit: rejected, not sent."""
    err = RejectedError(str(exc))
    for p in range(len(state.results)):
        state.finish(p, Result(error=err, fallback=int(state.idx[p]) < 0))
    now = time.monotonic()
    if now >= fan.admission_logged + 1.0:  # (at most a line a second: no log flood)
        fan.admission_logged = now
        log.warning("fan-out not admitted: %s", exc)
    return fan.finish(state)


def _calls_to_admit(fan: Any, state: FanOutState) -> int:
    """How many calls the fan-out asks the worker to admit (at most)."""
    state.refuse_stuck = True
    fallback = len(state.fallback_positions) if fan.settings.fallback_url else 0
    return len(state.jobs) + fallback


def run_sync(fan: Any, state: FanOutState) -> list[Result]:
    """:meth:`workers.Router.fanout` of a fan-out prepared for a CurlSender (:func:`by_curl`)."""
    calls = _calls_to_admit(fan, state)
    if calls:
        try:
            fan.admission.enter(calls, (state.deadline_ns - state.clock()) / 1e9)
        except AdmissionError as exc:
            return _refuse(fan, state, exc)
    reactor = thread_reactor(fan.settings.connections)
    batch = Batch(state, reactor, state.send)
    jobs, begun = start_jobs(fan, state, fan.settings.cap_for(curl=True))  # (begun once admitted)
    started = 0
    try:
        for j in jobs:
            batch.add(j)
            started += 1
        left_ns = max(state.deadline_ns - state.clock(), 0)
        reactor.run(batch.done, time.monotonic_ns() + left_ns)
    finally:
        _wind_up(fan, batch, jobs, begun, started, calls)
    return fan.finish(state)


async def run_async(fan: Any, state: FanOutState) -> list[Result]:
    """:meth:`workers.Router.afanout` of a fan-out prepared for a CurlSender (:func:`by_curl`)."""
    calls = _calls_to_admit(fan, state)
    if calls:
        try:
            await fan.admission.aenter(calls, (state.deadline_ns - state.clock()) / 1e9)
        except AdmissionError as exc:
            return _refuse(fan, state, exc)
    reactor = loop_reactor(fan.settings.connections)
    batch = Batch(state, reactor, state.send)
    idle = reactor.loop.create_future()

    def wake() -> None:
        if not idle.done():
            idle.set_result(None)

    batch.on_idle = wake
    timer = None
    jobs, begun = start_jobs(fan, state, fan.settings.cap_for(curl=True))
    started = 0
    try:
        for j in jobs:
            batch.add(j)
            started += 1
        if not batch.done():
            left = max((state.deadline_ns - state.clock()) / 1e9, 0.0)
            timer = reactor.loop.call_later(left, wake)
            await idle
    finally:
        if timer is not None:
            timer.cancel()
        _wind_up(fan, batch, jobs, begun, started, calls)
    return fan.finish(state)


def by_curl(state: FanOutState) -> bool:
    """Whether libcurl drives a prepared fan-out (its sender is a CurlSender)."""
    from workers.fanout.senders import CurlSender

    return isinstance(state.send, CurlSender)


def curl_sender_of(send: Callable[..., Any], grouped: bool) -> Any:
    """The :class:`workers.fanout.senders.CurlSender` behind ``send``, or ``None`` (another sender).

    Raises
    ------
    RouterInputError
        ``send`` is a CurlSender's ``group`` without ``grouped=True`` (a ``ValueError``).
    """
    from workers.fanout.senders import CurlGroup, CurlSender

    if isinstance(send, CurlSender):
        return send
    if isinstance(send, CurlGroup):
        if not grouped:
            raise RouterInputError(
                "CurlSender.group sends a pod's keys in one call: pass grouped=True "
                "(or pass the CurlSender itself for one call per key)"
            )
        return send.sender
    return None
