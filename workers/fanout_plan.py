"""One fan-out's plan and its jobs, written once for both forms of the helper.

A :class:`Plan` holds what one fan-out routed where and collects the results. Its
jobs (:func:`key_job`, :func:`group_job`, :func:`fallback_job`) are generators that say
*what* to do — ``("call", url, what, timeout)``, ``("sleep", seconds)``, ``("slot",
slot, cap)`` (start a call once the endpoint is under the bulkhead's cap: its start
time; ``-1`` at the deadline; :data:`STUCK` when the endpoint's oldest call has been
out a quarter of the timeout) — and get each call's outcome back as ``(value,
exception)``: the thread-pool form
(:mod:`workers.fanout`) performs them blocking on a pool thread, the asyncio form
(:mod:`workers.afanout`) awaits them. So the retry rule, the bulkhead, the recording
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
from workers.failurelog import pod_ip
from workers.senders import failure_kind

__all__ = [
    "RETRYABLE",
    "DeadlineError",
    "FanoutError",
    "Job",
    "Plan",
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
        How the last call failed (``lbcore.outlier.FAIL_*``; 0 on success or when no
        call failed).
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


def key_text(key: Any) -> str:
    """A key as text for the failure log."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key).decode("utf-8", "backslashreplace")
    if isinstance(key, np.generic):
        key = key.item()
        if isinstance(key, bytes):
            return key.decode("utf-8", "backslashreplace")
    return str(key)


class Plan:
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
        router = fan.router
        self.fan = fan
        self.ledger = fan.ledger
        self.clock: Callable[[], int] = router.recording.clock
        self.keys = keys
        self.send = send
        self.with_timeout = with_timeout
        self.grouped = grouped
        self.timeout_s = timeout_s
        now = self.clock()
        self.deadline_ns = now + int(deadline_s * 1e9)
        self.idx, self.table = router.route_table(keys)
        n = self.idx.size
        self.results: list[Result | None] = [None] * n
        self.left = n
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.closed = False
        self._retry_routes: dict[int, dict[int, tuple[int, str | None]]] = {}
        t = self.table
        self.urls = t.endpoints
        slots = router.call_slots(self.idx, t)
        self.slots: list[int] = slots.tolist() if slots is not None else [-1] * n
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
        """Set the result of ``pos`` (once; a closed plan takes no more results)."""
        with self.lock:
            if self.closed or self.results[pos] is not None:
                return
            self.results[pos] = result
            self.left -= 1
            if self.left == 0:
                self.done.set()

    def close(self) -> list[Result]:
        """No more results: unanswered keys become deadline errors; the results."""
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
        return out  # type: ignore[return-value]

    # -- calls --------------------------------------------------------------------------

    def call_timeout(self, now: int) -> tuple[float, bool]:
        """Timeout (s) of a call starting at ``now``, and whether the deadline shortened it."""
        left = (self.deadline_ns - now) / 1e9
        if left < self.timeout_s:
            return max(left, 0.0), True
        return self.timeout_s, False

    def begin(self, slot: int, cap: int) -> int:
        """Start a call to ``slot`` (``-1``: not recorded): its start, or -1 at the cap."""
        if slot < 0:
            return self.clock()
        return self.ledger.begin(slot, cap)

    def end(self, slot: int, t0: int, kind: int, cut: bool) -> None:
        """End it; a timeout the deadline caused is not the pod's failure."""
        if slot >= 0:
            self.ledger.end(slot, t0, 0 if cut and kind == FAIL_TIMEOUT else kind)

    def stuck_at(self, slot: int) -> int:
        """When ``slot`` looks stuck (CLOCK_MONOTONIC ns; far ahead with no call out).

        That is when its oldest call in flight has been out a quarter of the timeout.
        """
        oldest = self.ledger.oldest(slot) if slot >= 0 else None
        if oldest is None:
            return 1 << 62
        return oldest + max(int(self.timeout_s * 0.25e9), 10_000_000)

    def slot(self, slot: int, cap: int) -> int:
        """Start a call to ``slot`` now if it is under ``cap``: its start time.

        Else :data:`STUCK` if it looks stuck, or ``-1`` (wait until :meth:`wait_until`
        and ask again, unless the deadline passed: the caller reads the clock).
        """
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
        that went there (they are the ones likely to need it).
        """
        s = self.fan.settings
        if s.retry_to == "ingress":
            return -1, s.fallback_url
        e = int(self.idx[pos])
        with self.lock:
            got = self._retry_routes.get(e)
        if got is None:
            positions = np.flatnonzero(self.idx == e).tolist()
            router = self.fan.router
            idx2, t2 = router.route_table(self.keys_at(positions), attempt=1)
            slots2 = router.call_slots(idx2, t2)
            got = {}
            for j, p in enumerate(positions):
                e2 = int(idx2[j])
                if e2 < 0:
                    got[p] = (-1, None)
                else:
                    got[p] = (int(slots2[j]) if slots2 is not None else -1, t2.endpoints[e2])
            with self.lock:
                self._retry_routes[e] = got
        return got.get(pos, (-1, None))

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

    # -- the failure log ----------------------------------------------------------------

    def log_failure(
        self, pos: int, url: str, attempt: int, kind: int, exc: BaseException, retry: str
    ) -> None:
        """One failure line (rate-limited) for the call of ``pos`` to ``url``."""
        t = self.table
        e = int(self.idx[pos])
        if attempt:
            e = self.urls.index(url) if url in self.urls else -1  # the retry pod's node, zone
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
    plan: Plan, slot: int, t0: int, url: str, what: Any
) -> Generator[tuple[Any, ...], Any, tuple[Any, BaseException | None, int]]:
    """One recorded call: ``(value, exception, failure kind)``.

    A job closed while its call is out (the asyncio form cancels at the deadline)
    still records the call's end, as not failed: the caller gave up, not the pod.
    """
    timeout, cut = plan.call_timeout(t0)
    try:
        value, exc = yield ("call", url, what, timeout)
    except GeneratorExit:
        plan.end(slot, t0, 0, True)
        raise
    kind = 0 if exc is None else failure_kind(exc)
    plan.end(slot, t0, kind, cut)
    return value, exc, kind


def key_job(plan: Plan, pos: int, cap: int, t0: int | None = None) -> Job:
    """One key: its call (already begun at ``t0`` if given; ``-1``: refused), one retry."""
    if t0 is None:
        if plan.closed or plan.clock() >= plan.deadline_ns:
            return  # no time left: a deadline error, not a call
        t0 = plan.begin(plan.slots[pos], cap)
    url = plan.urls[int(plan.idx[pos])]
    key = plan.keys[pos]
    if t0 < 0:
        # The bulkhead. A pod whose calls are just busy keeps its keys (and its cache):
        # wait for a slot. One whose oldest call has been out for a quarter of the
        # timeout looks stuck: straight to the retry pod (no budget, no backoff).
        t0 = yield ("slot", plan.slots[pos], cap)
        if t0 == STUCK:
            if plan.retry_route(pos)[1] is None:
                t0 = -1  # no other pod: wait on (a deadline error, not a call)
            else:
                plan.ledger.tally("bulkhead_rejections")
                err = RejectedError(f"{url} at the bulkhead's cap")
                yield from _second(plan, pos, cap, None, 0, err)
                return
        if t0 < 0:
            return  # the deadline passed meanwhile: a deadline error, not a call
    value, exc, kind = yield from _attempt(plan, plan.slots[pos], t0, url, key)
    if exc is None:
        plan.finish(pos, Result(value, None, url, 1))
    elif kind in RETRYABLE and not plan.closed:
        yield from _second(plan, pos, cap, url, kind, exc)
    else:
        plan.log_failure(pos, url, 0, kind, exc, "not retried")
        plan.finish(pos, Result(error=exc, endpoint=url, attempts=1, kind=kind))


def _second(
    plan: Plan,
    pos: int,
    cap: int,
    first_url: str | None,
    first_kind: int,
    first_exc: BaseException,
) -> Job:
    """The single retry of ``pos``: after a failure (``first_url`` set) or the bulkhead."""
    attempts = 0 if first_url is None else 1

    def give_up(retry: str) -> None:
        if first_url is not None:
            plan.log_failure(pos, first_url, 0, first_kind, first_exc, retry)
        plan.finish(
            pos, Result(error=first_exc, endpoint=first_url, attempts=attempts, kind=first_kind)
        )

    slot, url = plan.retry_route(pos)
    if url is None:
        give_up("no other pod")
        return
    if first_url is not None:
        wait = plan.backoff_ns()
        why = plan.retry_refusal(plan.clock(), wait)
        if why is not None:
            give_up(why)
            return
        yield ("sleep", wait / 1e9)
    t0 = plan.begin(slot, cap)
    if t0 < 0:
        t0 = yield ("slot", slot, cap)  # the retry pod at its cap too: wait for a slot
        if t0 < 0:
            give_up(
                f"not sent: {url} at the bulkhead's cap" + (" and stuck" if t0 == STUCK else "")
            )
            return
    if first_url is not None:
        plan.ledger.tally("retries")
    value, exc, kind = yield from _attempt(plan, slot, t0, url, plan.keys[pos])
    if exc is None:
        if first_url is not None:
            plan.log_failure(pos, first_url, 0, first_kind, first_exc, f"succeeded on {url}")
        plan.finish(pos, Result(value, None, url, attempts + 1))
        return
    if first_url is not None:
        plan.ledger.tally("retries_failed")
        plan.log_failure(pos, first_url, 0, first_kind, first_exc, f"failed on {url}")
    plan.log_failure(pos, url, 1, kind, exc, "none (the single retry)")
    plan.finish(pos, Result(error=exc, endpoint=url, attempts=attempts + 1, kind=kind))


def fallback_job(plan: Plan, positions: list[int]) -> Job:
    """Keys the router answered -1: to the ingress, one call each (grouped: one for all)."""
    url = plan.fan.settings.fallback_url
    what = plan.keys_at(positions) if plan.grouped else plan.keys[positions[0]]
    timeout, _ = plan.call_timeout(plan.clock())
    value, exc = yield ("call", url, what, timeout)
    if exc is None and plan.grouped:
        value, exc = group_values(value, len(positions))
    if exc is not None:
        kind = failure_kind(exc)
        for p in positions:
            plan.finish(p, Result(error=exc, attempts=1, fallback=True, kind=kind))
        return
    values = value if plan.grouped else [value]
    for p, v in zip(positions, values, strict=True):
        plan.finish(p, Result(v, None, None, 1, True))


def group_values(got: Any, n: int) -> tuple[Any, BaseException | None]:
    """``(values, None)`` if ``got`` holds ``n`` values, else ``(None, the error)``."""
    try:
        values = list(got)
    except TypeError as exc:
        return None, exc
    if len(values) != n:
        return None, ValueError(f"send_group returned {len(values)} values for {n} keys")
    return values, None


def group_job(plan: Plan, positions: list[int], cap: int, t0: int | None = None) -> Job:
    """One pod's keys in one call; if it fails, the keys' retries grouped per retry pod."""
    slot = plan.slots[positions[0]]
    url = plan.urls[int(plan.idx[positions[0]])]
    if t0 is None:
        if plan.closed or plan.clock() >= plan.deadline_ns:
            return
        t0 = plan.begin(slot, cap)
    if t0 < 0:
        plan.ledger.tally("bulkhead_rejections", len(positions))
        err = RejectedError(f"{url} at the bulkhead's cap")
        yield from _group_second(plan, positions, cap, None, 0, err)
        return
    value, exc, kind = yield from _attempt(plan, slot, t0, url, plan.keys_at(positions))
    if exc is None:
        value, exc = group_values(value, len(positions))
        kind = 0 if exc is None else failure_kind(exc)
    if exc is None:
        for p, v in zip(positions, value, strict=True):
            plan.finish(p, Result(v, None, url, 1))
    elif kind in RETRYABLE and not plan.closed:
        yield from _group_second(plan, positions, cap, url, kind, exc)
    else:
        plan.log_failure(positions[0], url, 0, kind, exc, "not retried")
        for p in positions:
            plan.finish(p, Result(error=exc, endpoint=url, attempts=1, kind=kind))


def _group_second(
    plan: Plan,
    positions: list[int],
    cap: int,
    first_url: str | None,
    first_kind: int,
    first_exc: BaseException,
) -> Job:
    """The retries of a failed (or refused) group: one call per retry pod."""
    attempts = 0 if first_url is None else 1
    by_pod: dict[str | None, list[int]] = {}
    slot_of: dict[str | None, int] = {}
    for p in positions:
        slot, url = plan.retry_route(p)
        by_pod.setdefault(url, []).append(p)
        slot_of[url] = slot

    def give_up(ps: list[int], retry: str) -> None:
        if first_url is not None:
            plan.log_failure(ps[0], first_url, 0, first_kind, first_exc, retry)
        for p in ps:
            plan.finish(
                p, Result(error=first_exc, endpoint=first_url, attempts=attempts, kind=first_kind)
            )

    if first_url is not None:
        wait = plan.backoff_ns()
        if plan.clock() + wait >= plan.deadline_ns:
            give_up(positions, "no time before the deadline")
            return
        yield ("sleep", wait / 1e9)
    for url, ps in by_pod.items():
        if url is None:
            give_up(ps, "no other pod")
            continue
        if first_url is not None:
            why = plan.retry_refusal(plan.clock(), 0)
            if why is not None:
                give_up(ps, why)
                continue
        slot = slot_of[url]
        t0 = plan.begin(slot, cap)
        if t0 < 0:
            plan.ledger.tally("bulkhead_rejections", len(ps))
            give_up(ps, f"not sent: {url} at the bulkhead's cap too")
            continue
        if first_url is not None:
            plan.ledger.tally("retries")
        value, exc, kind = yield from _attempt(plan, slot, t0, url, plan.keys_at(ps))
        if exc is None:
            value, exc = group_values(value, len(ps))
            kind = 0 if exc is None else failure_kind(exc)
        if exc is None:
            if first_url is not None:
                plan.log_failure(ps[0], first_url, 0, first_kind, first_exc, f"succeeded on {url}")
            for p, v in zip(ps, value, strict=True):
                plan.finish(p, Result(v, None, url, attempts + 1))
            continue
        if first_url is not None:
            plan.ledger.tally("retries_failed")
            plan.log_failure(ps[0], first_url, 0, first_kind, first_exc, f"failed on {url}")
        plan.log_failure(ps[0], url, 1, kind, exc, "none (the single retry)")
        for p in ps:
            plan.finish(p, Result(error=exc, endpoint=url, attempts=attempts + 1, kind=kind))
