"""One fan-out's state and its jobs, written once for both forms of the helper.

A :class:`FanOutState` holds what one fan-out routed where and collects the results. Its
jobs (:func:`key_job`, :func:`group_job`, :func:`fallback_job`) are generators that say
*what* to do — ``("call", url, what, timeout)``, ``("sleep", seconds)``, ``("slot",
slot, cap)`` (start a call once the endpoint is under the bulkhead's cap, for a call
with nowhere else to go: its start time; ``-1`` at the deadline; :data:`STUCK` when the
endpoint's oldest call has been out a quarter of the timeout) — and get each call's
outcome back as ``(value, exception)``: the thread-pool form
(:mod:`workers.fanout.threads`) performs them blocking on a pool thread, the asyncio form
(:mod:`workers.fanout.aio`) awaits them. So the retry rule, the bulkhead, the recording
and the failure log exist once.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

from lbcore.outlier import FAIL_CONNECT, FAIL_STATUS, FAIL_TIMEOUT, FAILURE_KINDS
from workers.fanout.failurelog import key_text, pod_ip
from workers.fanout.ledger import CUT
from workers.fanout.senders import failure_kind

__all__ = [
    "RETRYABLE",
    "DeadlineError",
    "FanOutState",
    "FanoutError",
    "Job",
    "RejectedError",
    "Result",
    "fallback_job",
    "group_job",
    "key_job",
]

#: Failure kinds worth a retry on another pod (not "other": a bug would fail there too).
RETRYABLE = frozenset((FAIL_CONNECT, FAIL_TIMEOUT, FAIL_STATUS))

#: What a ``("slot", ...)`` operation answers for an endpoint that looks stuck.
STUCK = -2

#: What a job yields (an operation) and gets back (``(value, exception)`` for a call).
Job = Generator[tuple[Any, ...], Any, None]


class FanoutError(Exception):
    """A key the fan-out did not get an answer for, without a call failing."""


class DeadlineError(FanoutError):
    """The fan-out's deadline passed before this key's call (or retry) ended."""


class RejectedError(FanoutError):
    """Not sent: the endpoint (and its retry pod) at the bulkhead's cap, or the pool full."""


class Result:
    """The outcome of one key of a fan-out.

    Attributes
    ----------
    value
        What ``send`` returned (``None`` on error).
    error : BaseException or None
        ``None`` on success; else the last call's exception, :class:`RejectedError`
        or :class:`DeadlineError`.
    endpoint : str or None
        The URL that answered, or was tried last; ``None`` for a fallback key.
    attempts : int
        Calls made: 1 or 2 (0 for a fallback not sent, or a key never sent).
    fallback : bool
        The router answered fallback for the key: it went to ``CSLB_FALLBACK_URL``, or,
        with ``attempts == 0``, is the caller's to send through the ingress.
    kind : int
        How the last call failed (``lbcore.outlier.FAIL_*``; 0 on success, when no call
        failed, or when the pod answered with a status that is not a failure status:
        :class:`workers.fanout.senders.CallAnswerError`).
    """

    __slots__ = ("attempts", "endpoint", "error", "fallback", "kind", "value")

    def __init__(
        self,
        value: Any = None,
        error: BaseException | None = None,
        endpoint: str | None = None,
        attempts: int = 0,
        fallback: bool = False,
        kind: int = 0,
    ) -> None:
        self.value = value
        self.error = error
        self.endpoint = endpoint
        self.attempts = attempts
        self.fallback = fallback
        self.kind = kind

    @property
    def ok(self) -> bool:
        """The key has a value (no error, and not a fallback left to the caller)."""
        return self.error is None and not (self.fallback and self.attempts == 0)

    def __repr__(self) -> str:
        what = f"error={self.error!r}" if self.error is not None else f"value={self.value!r:.60}"
        return (
            f"Result({what}, endpoint={self.endpoint!r}, attempts={self.attempts}"
            f"{', fallback=True' if self.fallback else ''})"
        )


class FanOutState:
    """The routed keys of one fan-out and their results.

    ``jobs`` are the units of work in the order they should start: positions (one
    call per key) or, grouped, lists of positions of one endpoint; ``-1`` entries of
    ``idx`` are fallback keys (``fallback_positions``).
    """

    def __init__(
        self,
        fan: Any,
        keys: Sequence[Any],
        send: Callable[..., Any],
        with_timeout: bool,
        timeout_s: float,
        deadline_s: float,
        grouped: bool,
    ) -> None:
        self.fan = fan
        self.ledger = fan.ledger
        self.clock: Callable[[], int] = fan.clock
        self.keys = keys
        self.send = send
        self.with_timeout = with_timeout
        self.grouped = grouped
        self.timeout_s = timeout_s
        now = self.clock()
        self.deadline_ns = now + int(deadline_s * 1e9)
        self.idx, self.table, slots = fan.route(keys)
        n = self.idx.size
        self.results: list[Result | None] = [None] * n
        self.left = n
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.closed = False
        # The bulkhead also refuses calls to a pod that looks stuck (the curl form: it
        # has no pool for a frozen pod to fill, so no count cap below the batch size).
        self.refuse_stuck = False
        self._retry_routes: dict[int, dict[int, tuple[int, str | None]]] = {}
        t = self.table
        self.urls = t.endpoints
        self.slots: list[int] = slots.tolist() if slots is not None else [-1] * n
        self.local = fan.local_slots(t)
        self._calls: list[bool] = []  # per call made: to a pod in the caller's zone?
        self._counted = 0
        routed = np.flatnonzero(self.idx >= 0)
        self.fallback_positions: list[int] = np.flatnonzero(self.idx < 0).tolist()
        self.jobs = self._jobs(routed)
        if routed.size:
            fan.budget.deposit(now, len(self.jobs) if grouped else int(routed.size))

    def _jobs(self, routed: np.ndarray) -> list[Any]:
        e = self.idx[routed]
        if self.grouped:
            if not routed.size:
                return []
            order = np.argsort(e, kind="stable")
            cuts = np.flatnonzero(np.diff(e[order])) + 1
            return [g.tolist() for g in np.split(routed[order], cuts)]
        if routed.size <= 2:
            return routed.tolist()
        # Interleave the endpoints (round robin), so a pod's calls spread over the
        # fan-out instead of coming in a burst that meets the bulkhead's cap.
        order = np.argsort(e, kind="stable")
        es = e[order]
        first = np.flatnonzero(np.r_[True, es[1:] != es[:-1]])
        rank = np.arange(es.size) - np.repeat(first, np.diff(np.r_[first, es.size]))
        return routed[order][np.lexsort((es, rank))].tolist()

    def keys_at(self, positions: list[int]) -> Any:
        """The keys at ``positions`` (an array for an array of keys, else a list)."""
        if isinstance(self.keys, np.ndarray):
            return self.keys[np.asarray(positions, dtype=np.intp)]
        return [self.keys[p] for p in positions]

    # -- results ------------------------------------------------------------------------

    def finish(self, pos: int, result: Result) -> None:
        """Set the result of ``pos`` (once; a closed state takes no more results)."""
        with self.lock:
            if self.closed or self.results[pos] is not None:
                return
            self.results[pos] = result
            self.left -= 1
            if self.left == 0:
                self.done.set()

    def close(self) -> list[Result]:
        """No more results: unanswered keys become deadline errors; the results.

        The calls made so far are added to the row's locality totals (later ones as
        they start: :meth:`count_call` sees the state closed).
        """
        self._close_results()
        self.flush_calls()
        return self.results  # type: ignore[return-value]

    def _close_results(self) -> None:
        with self.lock:
            self.closed = True
            out = self.results
            for i, r in enumerate(out):
                if r is None:
                    e = int(self.idx[i])
                    out[i] = Result(
                        error=DeadlineError("no answer before the fan-out's deadline"),
                        endpoint=self.urls[e] if e >= 0 else None,
                        fallback=e < 0,
                    )

    # -- calls --------------------------------------------------------------------------

    def call_timeout(self, now: int) -> tuple[float, bool]:
        """Timeout (s) of a call starting at ``now``, and whether the deadline cut it short.

        Short: to under half the call timeout. Such a call that times out is the
        caller's doing (it started late: its pool or loop was saturated), not the pod's.
        One left at least half its timeout that still gets no answer counts as the pod's
        timeout, so a frozen pod's late calls do not pass for successes.
        """
        left = (self.deadline_ns - now) / 1e9
        if left < self.timeout_s:
            return max(left, 0.0), left < 0.5 * self.timeout_s
        return self.timeout_s, False

    def begin(self, slot: int, cap: int) -> int:
        """Start a call to ``slot`` (``-1``: not recorded): its start, or -1 at the cap.

        With :attr:`refuse_stuck` a pod that looks stuck (:meth:`stuck_at`) is at its
        cap too, whatever its count.
        """
        if slot < 0:
            return self.clock()
        return self.ledger.begin(slot, cap, self.stuck_ns if self.refuse_stuck else 0)

    def end(self, slot: int, t0: int, kind: int, cut: bool, busy_ns: int | None = None) -> None:
        """End it; a timeout the deadline caused is neither the pod's failure nor a success.

        ``busy_ns``: the transport's own measure of the call (libcurl's), recorded as its
        busy time instead of the time since ``t0``.
        """
        if slot >= 0:
            self.ledger.end(slot, t0, CUT if cut and kind == FAIL_TIMEOUT else kind, busy_ns)

    @property
    def stuck_ns(self) -> int:
        """How long a pod's oldest call may be out before the pod looks stuck (ns)."""
        return max(int(self.timeout_s * 0.25e9), 10_000_000)

    def stuck_at(self, slot: int) -> int:
        """When ``slot`` looks stuck (CLOCK_MONOTONIC ns; far ahead with no call out).

        That is when its oldest call in flight has been out :attr:`stuck_ns`.
        """
        oldest = self.ledger.oldest(slot) if slot >= 0 else None
        if oldest is None:
            return 1 << 62
        return oldest + self.stuck_ns

    def slot(self, slot: int, cap: int) -> int:
        """Start a call to ``slot`` now if it is under ``cap``: its start time.

        Else :data:`STUCK` if it looks stuck, or ``-1`` (wait until :meth:`wait_until`
        and ask again, unless the deadline passed: the caller reads the clock).
        """
        if self.refuse_stuck:
            # No pool to protect (the curl form): the stuck rule only steers a call to
            # another pod when one can take it; a call with nowhere else to go goes out.
            return self.ledger.begin(slot, cap) if slot >= 0 else self.clock()
        t0 = self.begin(slot, cap)
        if t0 >= 0:
            return t0
        if self.clock() >= self.stuck_at(slot):
            return STUCK
        return -1

    def wait_until(self, slot: int) -> int:
        """Until when to wait for a slot at ``slot`` before asking again (ns)."""
        return min(self.deadline_ns, self.stuck_at(slot))

    def retry_route(self, pos: int) -> tuple[int, str | None]:
        """``(slot, url)`` of ``pos``'s retry (url ``None``: there is none).

        Routed with ``attempt=1`` once per first endpoint, for all keys of the fan-out
        that went there (they are the ones likely to need it). Never the first endpoint
        itself: attempt 1 is the next pod after the key's attempt-0 pod *now*, and that
        can differ from the one this state routed to (loads refreshed, a new table); then
        attempt 1 may be the very pod that failed, and the key's current attempt-0 pod
        (or attempt 2's) takes the retry instead.
        """
        s = self.fan.settings
        if s.retry_to == "ingress":
            return -1, s.fallback_url
        e = int(self.idx[pos])
        with self.lock:
            got = self._retry_routes.get(e)
        if got is None:
            got = self._route_retries(np.flatnonzero(self.idx == e).tolist(), self.urls[e])
            with self.lock:
                self._retry_routes[e] = got
        return got.get(pos, (-1, None))

    def _route_retries(
        self, positions: list[int], failed_url: str
    ) -> dict[int, tuple[int, str | None]]:
        """``(slot, url)`` of a retry pod other than ``failed_url`` for each of ``positions``."""
        got: dict[int, tuple[int, str | None]] = {}
        todo = positions
        for attempt in (1, 0, 2):  # (0 and 2: only for keys whose attempt 1 is failed_url)
            idx2, t2, slots2 = self.fan.route(self.keys_at(todo), attempt)
            again = []
            for j, p in enumerate(todo):
                e2 = int(idx2[j])
                if e2 < 0:
                    got[p] = (-1, None)
                elif t2.endpoints[e2] == failed_url:
                    again.append(p)
                else:
                    got[p] = (int(slots2[j]) if slots2 is not None else -1, t2.endpoints[e2])
            if not again:
                break
            todo = again
        for p in todo:
            got.setdefault(p, (-1, None))
        return got

    def retry_refusal(self, now: int, wait_ns: int) -> str | None:
        """Why a retry after a failure cannot go out now (``None``: it may; budget taken)."""
        if now + wait_ns >= self.deadline_ns:
            return "no time before the deadline"
        if not self.fan.budget.withdraw(now):
            self.ledger.tally("retries_refused")
            return "refused by the retry budget"
        return None

    def backoff_ns(self) -> int:
        """The jittered backoff before a retry (ns), over the upper half of the setting."""
        return int(self.fan.settings.retry_backoff_s * (0.5 + 0.5 * random.random()) * 1e9)

    def count_call(self, slot: int) -> None:
        """Count a call to a pod (``slot`` >= 0) in the caller's zone or out of it.

        ``slot`` is the endpoint's counter slot, which an endpoint keeps across tables;
        a retry routed on a newer table to a pod this fan-out's table does not know
        counts as remote (a pod that new is rarely warm in either sense). The counts
        reach the counter row when the state closes (a call that starts later, at the
        deadline, at once): one append per call, no lock.
        """
        self._calls.append(slot in self.local)
        if self.closed:
            self.flush_calls()

    def flush_calls(self) -> None:
        """Add the calls counted since the last flush to the row's locality totals."""
        with self.lock:
            calls = self._calls
            new = calls[self._counted :]  # (appends may go on meanwhile: counted next time)
            self._counted += len(new)
        local = sum(new)
        if local:
            self.ledger.tally("calls_local", local)
        if len(new) > local:
            self.ledger.tally("calls_remote", len(new) - local)

    # -- the failure log ----------------------------------------------------------------

    def log_failure(
        self, pos: int, url: str, attempt: int, kind: int, exc: BaseException, retry: str
    ) -> None:
        """One failure line (rate-limited) for the call of ``pos`` to ``url``."""
        t = self.table
        e = int(self.idx[pos])
        if e < 0 or self.urls[e] != url:  # a retry pod's (or the ingress's) call
            e = self.urls.index(url) if url in self.urls else -1
        fields = {
            "event": "cslb_call_failed",
            "product_id": key_text(self.keys[pos]),
            "endpoint": url,
            "pod_ip": pod_ip(url),
            "node": t.nodes[e] if e >= 0 else "",
            "zone": t.zones[e] if e >= 0 else "",
            "attempt": attempt,
            "generation": t.generation,
            "kind": FAILURE_KINDS[kind - 1] if kind else "none",
            "error": f"{type(exc).__name__}: {exc}"[:300],
            "retry": retry,
            "call": pos,
            "pid": os.getpid(),
        }
        self.fan.failure_log.failed(fields)


# ------------------------------------------------------------------------------------
# The jobs.


def _attempt(
    state: FanOutState, slot: int, t0: int, url: str, what: Any
) -> Generator[tuple[Any, ...], Any, tuple[Any, BaseException | None, int]]:
    """One recorded call: ``(value, exception, failure kind)``.

    A job closed while its call is out (the asyncio form cancels at the deadline)
    still records the call's end, as neither success nor failure: the caller gave up,
    not the pod.
    """
    timeout, cut = state.call_timeout(t0)
    if slot >= 0:  # (a pod's call; -1 is the ingress's, for retries sent there)
        state.count_call(slot)
    try:
        got = yield ("call", url, what, timeout)
    except GeneratorExit:
        state.end(slot, t0, CUT, True)
        raise
    value, exc = got[0], got[1]
    kind = 0 if exc is None else failure_kind(exc)
    # A call that timed out waiting for a connection inside the transport never reached
    # the pod: cut, like one the deadline cut short (busy time only: the transport's 0).
    cut = cut or getattr(exc, "local", False)
    busy = got[2] if len(got) > 2 else None
    if len(got) > 3 and got[3] is not None:
        # The answer's load headers (reports on): the pod's own service time, if sent,
        # is the call's busy time; its report waits for the ledger's next write.
        busy = state.ledger.answered(slot, url, got[3], busy)
    state.end(slot, t0, kind, cut, busy)
    return value, exc, kind


def key_job(state: FanOutState, pos: int, cap: int, t0: int | None = None) -> Job:
    """One key: its call (already begun at ``t0`` if given; ``-1``: refused), one retry.

    The bulkhead: a call over its pod's cap goes to the retry pod at once (no budget, no
    backoff: it is the key's first call), so a pod holding its calls cannot take the
    worker's threads; if that call fails, the key's one retry goes back to its own pod.
    Only when the retry pod is at its cap too (or there is none) does the call wait for
    a slot on its own pod.
    """
    if t0 is None:
        if state.closed or state.clock() >= state.deadline_ns:
            return  # no time left: a deadline error, not a call
        t0 = state.begin(state.slots[pos], cap)
    own_slot = state.slots[pos]
    url = state.urls[int(state.idx[pos])]
    key = state.keys[pos]
    if t0 < 0:
        slot2, url2 = state.retry_route(pos)
        t2 = -1 if url2 is None else state.begin(slot2, cap)
        if t2 < 0:
            t0 = yield ("slot", own_slot, cap)
            if t0 == STUCK and url2 is not None:
                t2 = state.begin(slot2, cap)  # (the retry pod may have a slot by now)
            if t2 < 0 and t0 == STUCK:
                state.ledger.tally("bulkhead_rejections")
                err = RejectedError(f"not sent: {url} at the bulkhead's cap and stuck")
                state.finish(pos, Result(error=err, endpoint=url))
                return
        if t2 >= 0:
            state.ledger.tally("bulkhead_rejections")
            value, exc, kind = yield from _attempt(state, slot2, t2, url2, key)
            if exc is None:
                state.finish(pos, Result(value, None, url2, 1))
            elif kind in RETRYABLE and not state.closed:
                yield from _retry(state, pos, cap, own_slot, url, url2, kind, exc)
            else:
                state.log_failure(pos, url2, 0, kind, exc, "not retried")
                state.finish(pos, Result(error=exc, endpoint=url2, attempts=1, kind=kind))
            return
        if t0 < 0:
            return  # the deadline passed meanwhile: a deadline error, not a call
    value, exc, kind = yield from _attempt(state, own_slot, t0, url, key)
    if exc is None:
        state.finish(pos, Result(value, None, url, 1))
    elif kind in RETRYABLE and not state.closed:
        slot2, url2 = state.retry_route(pos)
        if url2 is None:
            state.log_failure(pos, url, 0, kind, exc, "no other pod")
            state.finish(pos, Result(error=exc, endpoint=url, attempts=1, kind=kind))
        else:
            yield from _retry(state, pos, cap, slot2, url2, url, kind, exc)
    else:
        state.log_failure(pos, url, 0, kind, exc, "not retried")
        state.finish(pos, Result(error=exc, endpoint=url, attempts=1, kind=kind))


def _retry(
    state: FanOutState,
    pos: int,
    cap: int,
    slot: int,
    url: str,
    first_url: str,
    first_kind: int,
    first_exc: BaseException,
) -> Job:
    """The single retry of ``pos`` on ``url``, after its first call to ``first_url`` failed."""

    def give_up(retry: str) -> None:
        state.log_failure(pos, first_url, 0, first_kind, first_exc, retry)
        state.finish(pos, Result(error=first_exc, endpoint=first_url, attempts=1, kind=first_kind))

    wait = state.backoff_ns()
    why = state.retry_refusal(state.clock(), wait)
    if why is not None:
        give_up(why)
        return
    yield ("sleep", wait / 1e9)
    t0 = state.begin(slot, cap)
    if t0 < 0:
        t0 = yield ("slot", slot, cap)  # the retry's pod at its cap: wait for a slot
        if t0 < 0:
            give_up(
                f"not sent: {url} at the bulkhead's cap" + (" and stuck" if t0 == STUCK else "")
            )
            return
    state.ledger.tally("retries")
    value, exc, kind = yield from _attempt(state, slot, t0, url, state.keys[pos])
    if exc is None:
        state.log_failure(pos, first_url, 0, first_kind, first_exc, f"succeeded on {url}")
        state.finish(pos, Result(value, None, url, 2))
        return
    state.ledger.tally("retries_failed")
    state.log_failure(pos, first_url, 0, first_kind, first_exc, f"failed on {url}")
    state.log_failure(pos, url, 1, kind, exc, "none (the single retry)")
    state.finish(pos, Result(error=exc, endpoint=url, attempts=2, kind=kind))


def fallback_job(state: FanOutState, positions: list[int]) -> Job:
    """Keys the router answered -1: to the ingress, one call each (grouped: one for all)."""
    url = state.fan.settings.fallback_url
    what = state.keys_at(positions) if state.grouped else state.keys[positions[0]]
    timeout, _ = state.call_timeout(state.clock())
    got = yield ("call", url, what, timeout)
    value, exc = got[0], got[1]
    if exc is None and state.grouped:
        value, exc = group_values(value, len(positions))
    if exc is not None:
        kind = failure_kind(exc)
        for p in positions:
            state.finish(p, Result(error=exc, attempts=1, fallback=True, kind=kind))
        return
    values = value if state.grouped else [value]
    for p, v in zip(positions, values, strict=True):
        state.finish(p, Result(v, None, None, 1, True))


def group_values(got: Any, n: int) -> tuple[Any, BaseException | None]:
    """``(values, None)`` if ``got`` holds ``n`` values, else ``(None, the error)``."""
    try:
        values = list(got)
    except TypeError as exc:
        return None, exc
    if len(values) != n:
        return None, ValueError(f"send_group returned {len(values)} values for {n} keys")
    return values, None


def group_job(state: FanOutState, positions: list[int], cap: int, t0: int | None = None) -> Job:
    """One pod's keys in one call; if it fails, the keys' retries grouped per retry pod.

    Over its pod's cap the group goes to the keys' retry pods at once (one call each,
    as in :func:`key_job`); keys whose retry pod is at its cap too, or fails, come back
    to their own pod in one call (a retry, for those that failed).
    """
    slot = state.slots[positions[0]]
    url = state.urls[int(state.idx[positions[0]])]
    if t0 is None:
        if state.closed or state.clock() >= state.deadline_ns:
            return
        t0 = state.begin(slot, cap)
    if t0 < 0:
        state.ledger.tally("bulkhead_rejections", len(positions))
        err = RejectedError(f"{url} at the bulkhead's cap")
        yield from _group_second(state, positions, cap, None, 0, err, (slot, url))
        return
    yield from _group_call(state, positions, cap, slot, t0, url)


def _group_call(
    state: FanOutState,
    positions: list[int],
    cap: int,
    slot: int,
    t0: int,
    url: str,
    first: tuple[str, int, BaseException] | None = None,
) -> Job:
    """The group's call to its own pod, begun at ``t0`` (``first``: it is a retry)."""
    value, exc, kind = yield from _attempt(state, slot, t0, url, state.keys_at(positions))
    if exc is None:
        value, exc = group_values(value, len(positions))
        kind = 0 if exc is None else failure_kind(exc)
    if first is not None:
        f_url, f_kind, f_exc = first
        state.ledger.tally("retries")
        if exc is not None:
            state.ledger.tally("retries_failed")
        outcome = f"succeeded on {url}" if exc is None else f"failed on {url}"
        state.log_failure(positions[0], f_url, 0, f_kind, f_exc, outcome)
    attempts = 1 if first is None else 2
    if exc is None:
        for p, v in zip(positions, value, strict=True):
            state.finish(p, Result(v, None, url, attempts))
        return
    if first is None and kind in RETRYABLE and not state.closed:
        yield from _group_second(state, positions, cap, url, kind, exc)
        return
    retry = "not retried" if first is None else "none (the single retry)"
    state.log_failure(positions[0], url, attempts - 1, kind, exc, retry)
    for p in positions:
        state.finish(p, Result(error=exc, endpoint=url, attempts=attempts, kind=kind))


def _group_second(
    state: FanOutState,
    positions: list[int],
    cap: int,
    first_url: str | None,
    first_kind: int,
    first_exc: BaseException,
    own: tuple[int, str] | None = None,
) -> Job:
    """The retries of a failed group (one call per retry pod), or a group over its cap.

    ``own``: the ``(slot, url)`` of a group moved by the bulkhead (``first_url`` is then
    ``None``); its keys whose retry pod is at its cap too go back to it, waiting for a
    slot, and those whose retry pod failed get their retry there.
    """
    attempts = 0 if first_url is None else 1
    by_pod: dict[str | None, list[int]] = {}
    slot_of: dict[str | None, int] = {}
    for p in positions:
        slot, url = state.retry_route(p)
        by_pod.setdefault(url, []).append(p)
        slot_of[url] = slot
    unsent: list[int] = []  # moved keys with nowhere else to go: their own pod, first call
    failed: list[tuple[list[int], str, int, BaseException]] = []  # moved and failed

    def give_up(ps: list[int], retry: str) -> None:
        if first_url is not None:
            state.log_failure(ps[0], first_url, 0, first_kind, first_exc, retry)
        for p in ps:
            state.finish(
                p, Result(error=first_exc, endpoint=first_url, attempts=attempts, kind=first_kind)
            )

    if first_url is not None:
        wait = state.backoff_ns()
        if state.clock() + wait >= state.deadline_ns:
            give_up(positions, "no time before the deadline")
            return
        yield ("sleep", wait / 1e9)
    for url, ps in by_pod.items():
        if url is None:
            if own is not None:
                unsent += ps
            else:
                give_up(ps, "no other pod")
            continue
        if first_url is not None:
            why = state.retry_refusal(state.clock(), 0)
            if why is not None:
                give_up(ps, why)
                continue
        slot = slot_of[url]
        t0 = state.begin(slot, cap)
        if t0 < 0 and own is not None:
            unsent += ps
            continue
        if t0 < 0:
            t0 = yield ("slot", slot, cap)  # the retry pod at its cap: wait for a slot
            if t0 < 0:
                stuck = " and stuck" if t0 == STUCK else ""
                give_up(ps, f"not sent: {url} at the bulkhead's cap{stuck}")
                continue
        if first_url is not None:
            state.ledger.tally("retries")
        value, exc, kind = yield from _attempt(state, slot, t0, url, state.keys_at(ps))
        if exc is None:
            value, exc = group_values(value, len(ps))
            kind = 0 if exc is None else failure_kind(exc)
        if exc is None:
            if first_url is not None:
                state.log_failure(ps[0], first_url, 0, first_kind, first_exc, f"succeeded on {url}")
            for p, v in zip(ps, value, strict=True):
                state.finish(p, Result(v, None, url, attempts + 1))
            continue
        if own is not None and kind in RETRYABLE and not state.closed:
            failed.append((ps, url, kind, exc))
            continue
        if first_url is not None:
            state.ledger.tally("retries_failed")
            state.log_failure(ps[0], first_url, 0, first_kind, first_exc, f"failed on {url}")
        state.log_failure(ps[0], url, 1, kind, exc, "none (the single retry)")
        for p in ps:
            state.finish(p, Result(error=exc, endpoint=url, attempts=attempts + 1, kind=kind))
    if own is None:
        return
    own_slot, own_url = own
    if unsent:
        t0 = yield ("slot", own_slot, cap)
        if t0 >= 0:
            yield from _group_call(state, unsent, cap, own_slot, t0, own_url)
        elif t0 == STUCK:
            err = RejectedError(f"not sent: {own_url} at the bulkhead's cap and stuck")
            for p in unsent:
                state.finish(p, Result(error=err, endpoint=own_url))
    for ps, url, kind, exc in failed:
        wait = state.backoff_ns()
        why = state.retry_refusal(state.clock(), wait)
        if why is None:
            yield ("sleep", wait / 1e9)
            t0 = yield ("slot", own_slot, cap)
            if t0 >= 0:
                yield from _group_call(state, ps, cap, own_slot, t0, own_url, (url, kind, exc))
                continue
            why = f"not sent: {own_url} at the bulkhead's cap"
            if t0 == STUCK:
                why += " and stuck"
        state.log_failure(ps[0], url, 0, kind, exc, why)
        for p in ps:
            state.finish(p, Result(error=exc, endpoint=url, attempts=1, kind=kind))
