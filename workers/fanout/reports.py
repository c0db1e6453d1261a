"""The callers' side of the pods' load reports: read on every answer, kept per pod.

A pod under cslb's middleware (:mod:`workers.serving`) answers every call with its own
load (``endpoint-load-metrics``) and the call's service time (``Server-Timing``;
:mod:`lbwire.orca` is the wire format). Per call, the fan-out then records
the pod's ``Server-Timing`` duration as the call's busy time and latency (the caller's
on-the-wire time when absent: what the pod spent on the call, not the time the answer
waited in the caller's own queues); per pod, the latest valid report goes into this
worker's counter row (:meth:`shm.Recorder.record_reports`), where every worker of the
host and the discovery process see it.

With ``CSLB_LOAD_REPORTS=off`` (the default) nothing here runs: the senders do not
even collect the response headers, so the off path costs nothing per call. The setting
is read from the environment once per process
(:func:`workers.routing.reported.report_settings`).

**Per-call cost.** Reports change at most every 100 ms or so, but every answer carries
one, so :class:`BlockReader` parses a report once per distinct raw value (a small
memo) and only ``Server-Timing`` per call. :class:`ReportBook` stores a pod's report
in the row when it changed or when the stored one is :data:`RESTAMP_NS` old, not on
every call.

**Hostile input.** A malformed report or ``Server-Timing`` never raises into the call:
it is counted (``reports_malformed`` in the row's stats,
``cslb_load_reports_malformed_total`` on ``/metrics``) and logged at most once a minute
per pod.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable
from typing import Any

from lbcore.report_settings import ReportSettings
from lbcore.reported import KIND_NONE, pod_identity, report_value
from lbwire.orca import (
    LoadReport,
    ResponseLoad,
    parse_load_report,
    parse_response_headers,
    parse_server_timing,
    split_header_block,
)
from workers.routing.reported import report_settings

__all__ = [
    "RESTAMP_NS",
    "BlockReader",
    "ReportBook",
    "hand_over",
    "read_headers",
    "report_settings",
    "take_over",
]

log = logging.getLogger("cslb.router")

#: How often (ns) an unchanged report of a pod is stored again (its arrival time
#: refreshed): far below the report expiry, far above the call rate.
RESTAMP_NS = 250_000_000
#: At most one malformed-report line per pod per this long (ns).
MALFORMED_LOG_NS = 60_000_000_000
# Distinct raw reports remembered per reader (cleared when full: a pod sends a few).
_MEMO_SIZE = 512
# Distinct (report, Server-Timing) answers remembered (cleared when full).
_ANSWERS_SIZE = 8192
_PODS_LOGGED_MAX = 4096

_NOTHING = ResponseLoad()


class BlockReader:
    """Both headers of a raw libcurl header block, their parse memoized.

    Callable with the block; returns a :class:`~lbwire.orca.ResponseLoad`. Never raises on
    what a pod sent. Thread-safe (a dict's item operations).

    Two memos: the answer per distinct pair of raw header values (a pod's report and
    ``Server-Timing`` repeat: the middleware rounds the duration to microseconds), and
    the report's parse per distinct raw report (it changes at most once per refresh of
    the pod's middleware, while ``Server-Timing`` changes with every call).
    """

    def __init__(self) -> None:
        self._reports: dict[tuple[str, ...], ResponseLoad] = {}
        self._answers: dict[tuple[str, ...], ResponseLoad] = {}

    def __call__(self, block: bytes) -> ResponseLoad:
        """What the block's headers say."""
        try:
            parts = split_header_block(block)
        except Exception as exc:  # a hostile block never raises into a call
            return ResponseLoad(malformed=f"header block unreadable ({type(exc).__name__})")
        if parts is None:
            return _NOTHING
        metrics, metrics_bin, timing = parts
        # (the -bin lines marked, so a value in one header never passes for the other's)
        key = (*metrics, "\0", *metrics_bin, "\0", *timing)
        answers = self._answers
        got = answers.get(key)
        if got is not None:
            return got
        report, why = None, ""
        if metrics or metrics_bin:
            rkey = (*metrics, "\0", *metrics_bin)
            memo = self._reports
            hit = memo.get(rkey)
            if hit is None:
                hit = parse_load_report(metrics, metrics_bin)
                if len(memo) >= _MEMO_SIZE:
                    memo.clear()
                memo[rkey] = hit
            report, why = hit.report, hit.malformed
        dur, twhy = parse_server_timing(timing) if timing else (None, "")
        got = ResponseLoad(report, dur, why, twhy)
        if len(answers) >= _ANSWERS_SIZE:
            answers.clear()
        answers[key] = got
        return got


def read_headers(headers: Iterable[tuple[Any, Any]]) -> ResponseLoad:
    """Both headers from ``(name, value)`` pairs (urllib3's, httpx's); never raises."""
    try:
        return parse_response_headers(headers)
    except Exception as exc:  # hostile headers never raise into a call
        return ResponseLoad(malformed=f"headers unreadable ({type(exc).__name__})")


_answer = threading.local()


def hand_over(load: ResponseLoad | None) -> None:
    """A sender's last answer's load headers, for the fan-out that awaits its return.

    Senders whose value is all they return (urllib3's, httpx's) call this just before
    returning or raising; the fan-out's driver takes it with :func:`take_over` right
    after, on the same thread (an asyncio sender returns to its awaiting driver
    without the loop running anything in between). ``None`` at the start of a call:
    a call that fails before its answer leaves nothing of an earlier one behind.
    """
    _answer.load = load


def take_over() -> ResponseLoad | None:
    """The load headers :func:`hand_over` left on this thread (``None``: none); cleared."""
    load = getattr(_answer, "load", None)
    if load is not None:
        _answer.load = None
    return load


class ReportBook:
    """One worker's pods' reports waiting for the ledger's next write, and their log.

    Not thread-safe: the ledger calls it under its lock.

    Parameters
    ----------
    settings
        The report settings (the expiry goes with each write).
    """

    __slots__ = ("_ids", "_logged", "_pending", "_stored", "malformed", "settings")

    def __init__(self, settings: ReportSettings) -> None:
        self.settings = settings
        # slot -> (value, utilization, kind, identity) of a report to write.
        self._pending: dict[int, tuple[float, float, int, int]] = {}
        # slot -> (report, stored at, pod): what the row holds (a slot may change pods).
        self._stored: dict[int, tuple[LoadReport, int, str]] = {}
        self._ids: dict[str, int] = {}
        self._logged: dict[str, int] = {}
        self.malformed = 0  # malformed answers not yet tallied into the row

    def take(
        self, slot: int, url: str, load: ResponseLoad, busy_ns: int | None, now_ns: int
    ) -> int | None:
        """Note one answer's headers; the busy time (ns) to record for the call.

        ``busy_ns``: the transport's own measure (``None``: the time since the call's
        start); the pod's ``Server-Timing`` duration replaces it when present.
        """
        if load.malformed or load.timing_malformed:
            self.malformed += 1
            self._log(url, load.malformed or load.timing_malformed, now_ns)
        r = load.report
        if r is not None and slot >= 0:
            last = self._stored.get(slot)
            if last is None or last[0] is not r or last[2] != url or now_ns - last[1] >= RESTAMP_NS:
                value, kind = report_value(r.occupancy, r.application_utilization)
                if kind != KIND_NONE:
                    ident = self._ids.get(url)
                    if ident is None:
                        if len(self._ids) >= _PODS_LOGGED_MAX:
                            self._ids.clear()
                        ident = self._ids[url] = pod_identity(url)
                    u = r.application_utilization
                    self._pending[slot] = (value, math.nan if u is None else u, kind, ident)
                    self._stored[slot] = (r, now_ns, url)
        st = load.service_time_s
        if st is not None:
            return int(st * 1e9)
        return busy_ns

    def _log(self, url: str, why: str, now_ns: int) -> None:
        logged = self._logged
        if now_ns < logged.get(url, -MALFORMED_LOG_NS) + MALFORMED_LOG_NS:
            return
        if len(logged) >= _PODS_LOGGED_MAX:
            logged.clear()
        logged[url] = now_ns
        log.warning(
            "malformed load report from %s ignored: %s (logged at most once a minute per pod)",
            url,
            why[:120],
        )

    @property
    def pending(self) -> bool:
        """Reports or malformed counts wait to be written."""
        return bool(self._pending or self.malformed)

    def drain(self) -> tuple[dict[int, tuple[float, float, int, int]], int]:
        """The reports to write and the malformed count to tally; both start anew."""
        out, n = self._pending, self.malformed
        self._pending, self.malformed = {}, 0
        return out, n
