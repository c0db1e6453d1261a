"""The fan-out helper: route a batch, make its calls, retry once, record each call.

``router.fanout(keys, send)`` (sync and gthread workers) and ``await
router.afanout(keys, asend)`` (asyncio workers, :mod:`workers.fanout.aio`) route the keys
once, then for each key:

1. **call** it: with a :class:`workers.fanout.senders.CurlSender` every call of the batch at
   once on libcurl's multi interface (:mod:`workers.fanout.curl_driver`: no pool, FIFO
   admission, each call timed by libcurl); with another ``send(url, key)`` on the
   worker's pool (:class:`Pool`, ``CSLB_FANOUT_THREADS`` threads, at most
   ``CSLB_FANOUT_QUEUE`` calls held). Each call is recorded from when it really starts
   to when it ends (:class:`workers.fanout.ledger.CallLedger`) with how it failed;
2. on a transport error, a timeout or a failure status (:func:`workers.fanout.senders.failure_kind`:
   connect, timeout, status; not "other"), **retry once** on ``route(keys, attempt=1)``'s
   pod (or the ingress, ``CSLB_RETRY_TO``) after a jittered backoff, while the worker's
   :class:`workers.fanout.budget.RetryBudget` allows and the deadline is not passed; a failed
   retry returns its error;
3. keys the router answers ``-1`` go to ``CSLB_FALLBACK_URL`` when set (not recorded,
   not retried: the ingress retries itself), else come back with ``fallback=True``;
4. a **bulkhead** caps the calls the worker has in flight to one endpoint (a frozen
   pod holds its calls until they time out): a call over the cap goes to the retry pod
   at once, as the key's one call (no budget, no backoff), so a frozen pod cannot take
   every thread; a retry pod at its cap too, or a key with no other pod, waits for a
   slot unless that pod looks stuck (its oldest call out for a quarter of the
   timeout). Such moves are counted (``bulkhead_rejections``), never as the pod's
   failure; a full pool fails keys at once as :class:`RejectedError`.

A call's timeout is ``min(timeout_s, time left to the deadline)``; one that times out
after the deadline cut it to under half of ``timeout_s`` counts as neither the pod's
failure (a saturated caller must not eject healthy pods) nor its success (it would
reset the pod's consecutive failures): only its busy time is recorded. Results come back in the
order of ``keys`` as :class:`Result`; the failure log
(:class:`workers.fanout.failurelog.FailureLog`) gets a line per failed call, at most a few per
endpoint per second, saying whether its retry succeeded.

The grouped form (``grouped=True``) calls ``send(url, keys)`` once per pod with that
pod's keys (a list) and expects their values in order; a failed group's keys are routed
with ``attempt=1`` and retried per retry pod.
"""

from __future__ import annotations

import inspect
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from workers.fanout.admission import Admission
from workers.fanout.budget import RetryBudget
from workers.fanout.curl_driver import by_curl, curl_sender_of, run_sync
from workers.fanout.failurelog import FailureLog
from workers.fanout.jobs import (
    DeadlineError,
    FanoutError,
    FanOutState,
    Job,
    RejectedError,
    Result,
    fallback_job,
    group_job,
    key_job,
)
from workers.fanout.ledger import CallLedger
from workers.fanout.reports import take_over
from workers.fanout.settings import FanoutSettings
from workers.routing.errors import RouterInputError

__all__ = [
    "DeadlineError",
    "FanOut",
    "FanoutError",
    "Pool",
    "RejectedError",
    "Result",
    "takes_timeout",
]

log = logging.getLogger("cslb.router")

_TAKES_TIMEOUT: dict[Any, bool] = {}


def takes_timeout(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` accepts a ``timeout`` keyword (cached per function code)."""
    func = getattr(fn, "__func__", fn)  # a bound method: its function
    key = getattr(func, "__code__", None) or type(func)
    got = _TAKES_TIMEOUT.get(key)
    if got is None:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            got = False
        else:
            got = any(
                p.kind is p.VAR_KEYWORD
                or (p.name == "timeout" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
                for p in params
            )
        if len(_TAKES_TIMEOUT) > 4096:
            _TAKES_TIMEOUT.clear()
        _TAKES_TIMEOUT[key] = got
    return got


# ------------------------------------------------------------------------------------
# The pool.


class Pool:
    """A worker's fan-out threads: each takes a fan-out and runs its calls until none is left.

    A fan-out is handed to the pool as up to ``threads`` tokens on one queue; a thread
    holding a token takes the fan-out's next job (one step of a shared iterator) until
    there is none, so a call costs no queue operation of its own. Threads start on first use
    (daemon threads: an exiting worker does not wait for them). A thread that finds no
    more work writes the ledger's pending events before it blocks if they are due (the
    fan-out's return and its waiter write the rest).

    Parameters
    ----------
    threads
        Number of threads.
    capacity
        Most calls held at once (queued or running); :meth:`admit` refuses beyond it.
    idle
        Called by a thread that runs out of work (the ledger's ``flush_due``).
    """

    def __init__(self, threads: int, capacity: int, idle: Callable[[], None]) -> None:
        self.threads = int(threads)
        self.capacity = int(capacity)
        self._idle = idle
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._held = 0
        self._started: list[threading.Thread] = []
        self._pid = os.getpid()

    def admit(self, calls: int) -> int:
        """Reserve room for up to ``calls`` calls; returns how many fit."""
        with self._lock:
            n = max(0, min(calls, self.capacity - self._held))
            self._held += n
            return n

    def release(self, calls: int) -> None:
        """Give back room :meth:`admit` reserved."""
        with self._lock:
            self._held = max(0, self._held - calls)

    def submit(self, work: Callable[[], None], tokens: int) -> None:
        """Run ``work`` on up to ``tokens`` threads at once."""
        if not self._started or self._pid != os.getpid():
            self._start()
        for _ in range(min(tokens, self.threads)):
            self._queue.put(work)

    def _start(self) -> None:
        with self._lock:
            if self._started and self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._queue = queue.SimpleQueue()
            self._started = []
            for i in range(self.threads):
                th = threading.Thread(target=self._loop, name=f"cslb-fanout-{i}", daemon=True)
                th.start()
                self._started.append(th)

    def _loop(self) -> None:
        q = self._queue
        while True:
            work = q.get()
            if work is None:
                return
            try:
                work()
            except Exception:  # a bug of ours must not kill the thread
                log.exception("fan-out work failed")
            if q.empty():
                try:
                    self._idle()
                except Exception:
                    log.exception("recording calls failed")

    def close(self) -> None:
        """Let the threads end once they finish what they are doing."""
        for _ in self._started:
            self._queue.put(None)
        self._started = []


# ------------------------------------------------------------------------------------
# The helper.


class FanOut:
    """A router's fan-out machinery: settings, pool, budget, ledger, failure log.

    Made by :meth:`workers.Router.fanout` (or ``afanout``) on first use, one per router.

    Parameters
    ----------
    router
        The :class:`workers.Router`.
    settings
        Default: from the environment (:data:`workers.fanout.settings.FANOUT_KNOBS`).
    """

    def __init__(self, router: Any, settings: FanoutSettings | None = None) -> None:
        self.settings = settings or FanoutSettings.from_env(os.environ)
        s = self.settings
        # What the fan-out takes from its router, once: the one routing question, the
        # clock, and where calls and failures are recorded. Nothing calls back otherwise.
        self.route: Callable[..., Any] = router.route_calls
        self.clock: Callable[[], int] = router.recording.clock
        self.ledger: CallLedger = router.call_ledger
        self.failure_log: FailureLog = router.recording.failure_log
        self.budget = RetryBudget(s.retry_percent / 100.0, s.retry_floor_per_s)
        self.pool = Pool(s.threads, s.queue, self.ledger.flush_due)
        self.admission = Admission(s.max_in_flight, s.fifo_size, s.fifo_timeout_s)
        self.admission_logged = float("-inf")  # (monotonic s of the last refusal line)
        self._local: tuple[Any, frozenset[int]] = (None, frozenset())

    def local_slots(self, table: Any) -> frozenset[int]:
        """The counter slots of ``table``'s endpoints in the caller's zone.

        The caller's zone is the table's zone record's; worked out once per table (the
        last one is kept), so a fan-out pays one set lookup per call.
        """
        last, local = self._local
        if last is table:
            return local
        caller = table.zone.zone
        local = frozenset()
        if caller and len(table.endpoints):
            here = np.fromiter((z == caller for z in table.zones), np.bool_, len(table.zones))
            local = frozenset(np.array(table.slots, dtype=np.int64)[here].tolist())
        self._local = (table, local)
        return local

    def close(self) -> None:
        """Stop the pool's threads (after their current calls)."""
        self.pool.close()

    def prepare(
        self,
        keys: Sequence[Any],
        send: Callable[..., Any],
        timeout_s: float | None,
        deadline_s: float | None,
        grouped: bool,
    ) -> FanOutState:
        """Route ``keys`` and lay out their jobs (both forms).

        A :class:`~workers.fanout.senders.CurlSender`'s ``group`` becomes the sender
        itself: the state's ``send`` then says libcurl drives the calls (:func:`by_curl`).
        """
        curl = curl_sender_of(send, grouped)
        if curl is not None:
            send = curl
        s = self.settings
        timeout = s.timeout_s if timeout_s is None else _seconds("timeout_s", timeout_s)
        deadline = (
            s.deadline_for(timeout) if deadline_s is None else _seconds("deadline_s", deadline_s)
        )
        if not isinstance(grouped, bool):
            raise RouterInputError(f"grouped must be True or False, got {grouped!r}")
        return FanOutState(self, keys, send, takes_timeout(send), timeout, deadline, grouped)

    def fallback_jobs(self, state: FanOutState) -> list[tuple[Job, list[int]]]:
        """Jobs for the keys routed to fallback, with their positions.

        Without a fallback URL there are none: those keys get their results at once.
        """
        fb = state.fallback_positions
        if not fb:
            return []
        if not self.settings.fallback_url:
            for p in fb:
                state.finish(p, Result(fallback=True))
            return []
        if state.grouped:
            return [(fallback_job(state, fb), fb)]
        return [(fallback_job(state, [p]), [p]) for p in fb]

    def finish(self, state: FanOutState) -> list[Result]:
        """Close ``state`` and write what its calls left pending; the results."""
        results = state.close()
        self.ledger.flush()
        self.failure_log.tick()
        return results

    # -- the thread-pool form -------------------------------------------------------------

    def run(self, state: FanOutState) -> list[Result]:
        """:meth:`workers.Router.fanout` of a fan-out :meth:`prepare` laid out."""
        if by_curl(state):
            return run_sync(self, state)
        cap = self.settings.cap_for(asyncio=False)
        grouped = state.grouped
        job = group_job if grouped else key_job
        # (make a job, the positions it answers)
        units: list[tuple[Callable[[], Job], list[int]]] = [
            ((lambda j=j: job(state, j, cap)), j if grouped else [j])  # type: ignore[misc]
            for j in state.jobs
        ]
        for g, ps in self.fallback_jobs(state):
            units.append(((lambda g=g: g), ps))
        if units:
            admitted = self.pool.admit(len(units))
            if admitted < len(units):
                self._reject(state, [ps for _, ps in units[admitted:]])
                units = units[:admitted]
            if units:
                it = iter(units)  # (next() on a list iterator is atomic: one job per take)

                def work() -> None:
                    for make, _ in it:
                        if state.closed:
                            return
                        _drive(state, make())

                self.pool.submit(work, len(units))
                self._wait(state)
                self.pool.release(len(units))
        return self.finish(state)

    def _wait(self, state: FanOutState) -> None:
        """Wait for every result or the deadline, writing pending calls meanwhile."""
        ledger = self.ledger
        clock = state.clock
        while not state.done.is_set():
            left = (state.deadline_ns - clock()) / 1e9
            if left <= 0:
                return
            if ledger.pending:
                # Events left pending by calls that hang (no more appends to write
                # them): at most this much later than their own flush rule.
                if state.done.wait(min(left, 0.02)):
                    return
                ledger.flush()
            elif state.done.wait(left):
                return

    def _reject(self, state: FanOutState, rejected: list[list[int]]) -> None:
        """Keys the pool had no room for fail at once, as rejected (not the pods' failure)."""
        err = RejectedError("the worker's fan-out pool is full")
        n = 0
        for ps in rejected:
            for p in ps:
                state.finish(p, Result(error=err, fallback=int(state.idx[p]) < 0))
                n += 1
        self.ledger.tally("bulkhead_rejections", n)


def _drive(state: FanOutState, job: Job) -> None:
    """Run a job blocking on this thread: its calls, its backoff sleep."""
    send = state.send
    with_timeout = state.with_timeout
    try:
        op = next(job)
        while True:
            if op[0] == "call":
                _, url, what, timeout = op
                try:
                    got = (
                        send(url, what, timeout=timeout) if with_timeout else send(url, what),
                        None,
                        None,
                        take_over(),  # (the answer's load headers: reports on, our senders)
                    )
                except Exception as exc:
                    got = (None, exc, None, take_over())
                op = job.send(got)
            elif op[0] == "slot":
                op = job.send(_wait_slot(state, op[1], op[2]))
            else:
                time.sleep(op[1])
                op = job.send(None)
    except StopIteration:
        pass


def _wait_slot(state: FanOutState, slot: int, cap: int) -> int:
    """A ``("slot", slot, cap)`` operation on this thread (see :meth:`FanOutState.slot`)."""
    while True:
        t0 = state.slot(slot, cap)
        if t0 != -1 or state.clock() >= state.deadline_ns:
            return t0
        state.ledger.wait_freed(slot, cap, state.wait_until(slot))


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise RouterInputError(f"{name} must be seconds > 0, got {value!r}")
    return float(value)
