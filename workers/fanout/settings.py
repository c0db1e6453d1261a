"""Settings of the fan-out helper (``router.fanout`` / ``router.afanout``), declared once.

Worker process settings, read from the environment when the router's fan-out is first
used, like :data:`workers.routing.router.LOAD_REFRESH` (they are not published with the tables:
each service sets its own timeouts and its own ingress). The README's table is
generated from :data:`FANOUT_KNOBS` (:func:`lbcore.knobs.docs_table`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from lbcore.knobs import (
    Knob,
    from_mapping,
    parse_choice,
    parse_int_between,
    parse_number_between,
    parse_seconds,
    seconds_at_least,
)

__all__ = ["FANOUT_KNOBS", "FanoutSettings"]


def _url_or_empty(text: str) -> str:
    t = text.strip()
    if not t:
        return ""
    parts = urlsplit(t)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("expected an http:// or https:// URL (or empty: no fallback URL)")
    return t.rstrip("/")


def _cap(text: str) -> int:
    if text.strip().lower() in ("auto", "0", ""):
        return 0
    return parse_int_between(1, 100_000)(text)


_positive_seconds = seconds_at_least(0.001, 3600)


def _deadline(text: str) -> float:
    if text.strip().lower() in ("auto", "0", ""):
        return 0.0
    return _positive_seconds(text)


_percent = parse_number_between(0.0, 1000.0, what="a percentage", suffix="%")
_rate = parse_number_between(0.0, what="a number")


FALLBACK_URL = Knob(
    "fallback_url",
    "CSLB_FALLBACK_URL",
    "--fallback-url",
    "",
    _url_or_empty,
    "Where router.fanout sends keys the router answers with fallback (-1: gate, kill "
    "switch, no table, nothing eligible): the ingress (Skipper's service), called with "
    "the same send function. Empty: such keys come back as results with fallback=True "
    "and attempts=0, for the caller to send.",
    "URL",
)
FANOUT_THREADS = Knob(
    "threads",
    "CSLB_FANOUT_THREADS",
    "--fanout-threads",
    8,
    parse_int_between(1, 1024),
    "For send functions of your own (not CurlSender): calls in flight at once per worker "
    "process, the threads of router.fanout's pool (shared by the requests of a gthread "
    "worker) or the concurrent calls of router.afanout on the worker's event loop.",
    "N",
)
FANOUT_QUEUE = Knob(
    "queue",
    "CSLB_FANOUT_QUEUE",
    "--fanout-queue",
    1024,
    parse_int_between(1, 1_000_000),
    "For send functions of your own: most calls a worker's fan-out pool holds (queued or "
    "running); a fan-out's calls beyond it fail at once as rejected (never counted as a "
    "pod's failure).",
    "N",
)
FANOUT_ENDPOINT_CAP = Knob(
    "endpoint_cap",
    "CSLB_FANOUT_ENDPOINT_CAP",
    "--fanout-endpoint-cap",
    0,
    _cap,
    "Bulkhead: most calls one worker has in flight to one endpoint. A call over it goes "
    "to the retry pod at once (the key's one call: no retry budget, no backoff), so a "
    "frozen pod holding its calls until they time out cannot take every thread; it is "
    "counted in cslb_bulkhead_rejections_total, never as the pod's failure. 'auto' (0): "
    "half of CSLB_FANOUT_THREADS (at least 1) for send functions of your own; with "
    "CurlSender no count cap (FIFO admission bounds the worker's calls), and a pod counts "
    "as at its cap while its oldest call from the worker has been out a quarter of the "
    "call timeout (a frozen pod), which a healthy pod never reaches.",
    "N",
    auto=True,
)
FANOUT_CONNECTIONS = Knob(
    "connections",
    "CSLB_FANOUT_CONNECTIONS",
    "--fanout-connections",
    32,
    parse_int_between(1, 10_000),
    "CurlSender: most keep-alive connections to one pod per worker thread (per event loop "
    "under asyncio); a fan-out's calls beyond it wait inside libcurl for a free "
    "connection instead of opening more. Idle connections are kept for the next fan-out.",
    "N",
)
FANOUT_MAX_IN_FLIGHT = Knob(
    "max_in_flight",
    "CSLB_FANOUT_MAX_IN_FLIGHT",
    "--fanout-max-in-flight",
    1024,
    parse_int_between(1, 1_000_000),
    "CurlSender: most calls in flight at once per worker process, every call of a "
    "fan-out admitted together (a fan-out larger than this still runs when the worker "
    "has nothing else in flight). A fan-out without room waits in the FIFO line.",
    "N",
)
FANOUT_FIFO_SIZE = Knob(
    "fifo_size",
    "CSLB_FANOUT_FIFO_SIZE",
    "--fanout-fifo-size",
    64,
    parse_int_between(0, 1_000_000),
    "CurlSender: most fan-outs waiting for room (CSLB_FANOUT_MAX_IN_FLIGHT) at once per "
    "worker, first come first served; one more fails at once, every key a RejectedError "
    "that says so (never counted as a pod's failure).",
    "N",
)
FANOUT_FIFO_TIMEOUT = Knob(
    "fifo_timeout_s",
    "CSLB_FANOUT_FIFO_TIMEOUT",
    "--fanout-fifo-timeout",
    1.0,
    _positive_seconds,
    "CurlSender: longest wait in the FIFO line, in seconds (and never past the fan-out's "
    "deadline); a fan-out still waiting then fails, every key a RejectedError.",
    "SECONDS",
)
FANOUT_TIMEOUT = Knob(
    "timeout_s",
    "CSLB_FANOUT_TIMEOUT",
    "--fanout-timeout",
    1.0,
    _positive_seconds,
    "Per-call timeout in seconds (connect and answer) when the fan-out is given no "
    "timeout_s; passed to send functions that take a timeout keyword.",
    "SECONDS",
)
FANOUT_DEADLINE = Knob(
    "deadline_s",
    "CSLB_FANOUT_DEADLINE",
    "--fanout-deadline",
    0.0,
    _deadline,
    "Seconds a whole fan-out may take when given no deadline_s; keys unanswered by then "
    "come back as deadline errors. 'auto' (0): twice the call timeout plus the retry "
    "backoff, so one call and its retry fit.",
    "SECONDS",
    auto=True,
)
RETRY_BACKOFF = Knob(
    "retry_backoff_s",
    "CSLB_RETRY_BACKOFF",
    "--retry-backoff",
    0.005,
    parse_seconds,
    "Backoff before the single fast retry, in seconds, jittered uniformly over its upper "
    "half; a retry that would start past the deadline is not sent.",
    "SECONDS",
)
RETRY_BUDGET_PERCENT = Knob(
    "retry_percent",
    "CSLB_RETRY_BUDGET_PERCENT",
    "--retry-budget-percent",
    20.0,
    _percent,
    "Retry budget (Finagle's): retries allowed as a percentage of the worker's calls in "
    "the last 10 s, on top of the floor; 0 with a floor of 0 disables retries.",
    "PCT",
)
RETRY_BUDGET_FLOOR = Knob(
    "retry_floor_per_s",
    "CSLB_RETRY_BUDGET_FLOOR",
    "--retry-budget-floor",
    10.0,
    _rate,
    "Retries per second each worker may send whatever its call rate (kept for 10 s, so "
    "a worker that just started can retry a burst of ten times this).",
    "N",
)
RETRY_TO = Knob(
    "retry_to",
    "CSLB_RETRY_TO",
    "--retry-to",
    "pod",
    parse_choice(("pod", "ingress")),
    "Where the single retry goes: 'pod' (route(keys, attempt=1)'s pod, the next distinct "
    "pod on the ring) or 'ingress' (CSLB_FALLBACK_URL, which must be set).",
    "WHERE",
)
FAILURE_LOG_RATE = Knob(
    "failure_log_rate",
    "CSLB_FAILURE_LOG_RATE",
    "--failure-log-rate",
    3,
    parse_int_between(0, 1_000_000),
    "Failure log lines per endpoint per second and worker; further failures of that "
    "second are summed into one line saying how many were left out.",
    "N",
)

#: The fan-out helper's process settings (declared like the router's own knobs).
FANOUT_KNOBS: tuple[Knob, ...] = (
    FALLBACK_URL,
    FANOUT_THREADS,
    FANOUT_QUEUE,
    FANOUT_ENDPOINT_CAP,
    FANOUT_CONNECTIONS,
    FANOUT_MAX_IN_FLIGHT,
    FANOUT_FIFO_SIZE,
    FANOUT_FIFO_TIMEOUT,
    FANOUT_TIMEOUT,
    FANOUT_DEADLINE,
    RETRY_BACKOFF,
    RETRY_BUDGET_PERCENT,
    RETRY_BUDGET_FLOOR,
    RETRY_TO,
    FAILURE_LOG_RATE,
)


@dataclass(frozen=True, slots=True)
class FanoutSettings:
    """The values of :data:`FANOUT_KNOBS` (see each knob's doc)."""

    fallback_url: str = FALLBACK_URL.default
    threads: int = FANOUT_THREADS.default
    queue: int = FANOUT_QUEUE.default
    endpoint_cap: int = FANOUT_ENDPOINT_CAP.default
    connections: int = FANOUT_CONNECTIONS.default
    max_in_flight: int = FANOUT_MAX_IN_FLIGHT.default
    fifo_size: int = FANOUT_FIFO_SIZE.default
    fifo_timeout_s: float = FANOUT_FIFO_TIMEOUT.default
    timeout_s: float = FANOUT_TIMEOUT.default
    deadline_s: float = FANOUT_DEADLINE.default
    retry_backoff_s: float = RETRY_BACKOFF.default
    retry_percent: float = RETRY_BUDGET_PERCENT.default
    retry_floor_per_s: float = RETRY_BUDGET_FLOOR.default
    retry_to: str = RETRY_TO.default
    failure_log_rate: int = FAILURE_LOG_RATE.default

    def __post_init__(self) -> None:
        if self.retry_to == "ingress" and not self.fallback_url:
            raise ValueError(
                "CSLB_RETRY_TO=ingress needs CSLB_FALLBACK_URL (the ingress to retry on)"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **override: Any) -> FanoutSettings:
        """Settings from ``environ`` (``CSLB_*``), then ``override`` by knob name.

        Raises
        ------
        lbcore.knobs.KnobError
            A malformed variable, named with what was expected.
        ValueError
            Settings that contradict each other.
        """
        values = from_mapping(environ, FANOUT_KNOBS, source="environment")
        values.update(override)
        return cls(**values)

    def deadline_for(self, timeout_s: float) -> float:
        """The whole fan-out's deadline in seconds for calls of ``timeout_s``."""
        if self.deadline_s:
            return self.deadline_s
        return 2.0 * timeout_s + self.retry_backoff_s

    def cap_for(self, asyncio: bool = False, curl: bool = False) -> int:
        """The bulkhead's cap per endpoint, in calls in flight (both forms alike).

        ``curl``: for CurlSender's fan-outs, which have no pool: no cap below the
        worker's calls in flight unless one is set.
        """
        if self.endpoint_cap:
            return self.endpoint_cap
        if curl:
            return 1 << 30  # (admission bounds the worker's calls; a pod has no count cap)
        return max(1, self.threads // 2)
