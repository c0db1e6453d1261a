"""Passive outlier detection: how calls fail, and which endpoints fail unlike the others.

Workers record per endpoint *how* each call failed, as one small integer per call
(:data:`FAIL_CONNECT` … :data:`FAIL_OTHER`, ``0`` for success); the counters keep a
count per kind next to the total. The host's one table writer reads the counts every
interval and judges endpoints with the pure functions below (counts in, verdicts out);
:mod:`lbcore.ejection` turns verdicts into ejections over time.

The rules are Envoy's (and gRPC A50's), adapted to a 1-s evaluation over a sliding
window of per-interval counts:

* **consecutive failures**: ``consecutive_failures`` failures with no success in
  between (:func:`streaks`; counted per interval, so a success anywhere in an interval
  ends the streak);
* **failure percentage**: at least ``failure_percentage`` % of the window's calls
  failed, with at least ``failure_percentage_volume`` calls;
* **success rate**: with at least ``success_rate_min_hosts`` endpoints of at least
  ``success_rate_volume`` calls, a success rate below ``mean − success_rate_stdev ×
  stdev`` of theirs *and* at least :data:`SUCCESS_RATE_MIN_GAP` below the mean (so one
  failure among near-perfect peers, whose stdev is tiny, ejects nobody).

**Caller-side timeouts.** A timeout may be the pod's doing (frozen, overloaded) or the
caller's (its pool or event loop saturated, so every call waits). The two look alike
for one endpoint but not across endpoints: a frozen pod times out while its peers do
not; a saturated caller times out on every pod alike. So, per interval, an endpoint's
timeouts count as failures only when it stands out from its peers (the other endpoints
that had calls; :func:`interval_counts`), all three of:

* the peers' pooled timeout share (their timeouts over their calls) is at most
  :data:`TIMEOUT_PEER_MAX`: with the peers timing out too, the caller is the suspect;
* the endpoint's own share exceeds the peers' pooled share by at least
  :data:`TIMEOUT_MARGIN`;
* a one-sided two-proportion z-test of the two shares (pooled variance, Yates'
  continuity correction) reaches :data:`TIMEOUT_Z`: a few calls that happened to time
  out together, at the small counts of a short interval, are not evidence.

Otherwise they count neither as failures nor as successes (and, with no peer calls in
the interval, there is nothing to judge against: the same). Connect errors, failure
statuses and other failures always count: they are answers (or refusals) of the pod
itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from lbcore.errors import OutlierError

__all__ = [
    "DEFAULT_OUTLIER_PARAMS",
    "EJECT_REASONS",
    "FAILURE_KINDS",
    "FAIL_CONNECT",
    "FAIL_NONE",
    "FAIL_OTHER",
    "FAIL_STATUS",
    "FAIL_TIMEOUT",
    "REASON_CONSECUTIVE",
    "REASON_FAILURE_PERCENTAGE",
    "REASON_NONE",
    "REASON_SUCCESS_RATE",
    "SUCCESS_RATE_MIN_GAP",
    "TIMEOUT_MARGIN",
    "TIMEOUT_PEER_MAX",
    "TIMEOUT_Z",
    "IntervalCounts",
    "OutlierParams",
    "Verdict",
    "interval_counts",
    "judge",
    "streaks",
]

#: The call succeeded.
FAIL_NONE = 0
#: The transport failed before a response: connection refused or reset, DNS.
FAIL_CONNECT = 1
#: The call timed out (connecting or waiting for the answer).
FAIL_TIMEOUT = 2
#: The endpoint answered with a failure status (a 5xx or another configured status).
FAIL_STATUS = 3
#: Any other failure (an exception the sender could not classify; ``True`` flags).
FAIL_OTHER = 4

#: Name of each failure kind: ``FAILURE_KINDS[code - 1]``.
FAILURE_KINDS = ("connect", "timeout", "status", "other")

#: Not an outlier (not ejected).
REASON_NONE = 0
#: Ejected for consecutive failures.
REASON_CONSECUTIVE = 1
#: Ejected for a failure percentage over the threshold.
REASON_FAILURE_PERCENTAGE = 2
#: Ejected for a success rate far below the other endpoints'.
REASON_SUCCESS_RATE = 3
#: Name of each ejection reason: ``EJECT_REASONS[reason - 1]`` (Prometheus label values).
EJECT_REASONS = ("consecutive_failures", "failure_percentage", "success_rate")

#: How far (as a share of calls, 0-1) an endpoint's timed-out share must exceed its
#: peers' pooled share before its timeouts count as its failures.
TIMEOUT_MARGIN = 0.5
#: Peers' pooled timed-out share (0-1) above which no endpoint's timeouts count: the
#: caller itself is slow.
TIMEOUT_PEER_MAX = 0.2
#: z-score the endpoint's share must reach over its peers' (one-sided, ~0.13 %).
TIMEOUT_Z = 3.0
#: Smallest gap (success-rate points, 0-1) below the mean for a success-rate ejection.
SUCCESS_RATE_MIN_GAP = 0.05

_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class OutlierParams:
    """Outlier detection settings (times in nanoseconds, percentages 0-100).

    Defaults are Envoy's where they fit a 1-s evaluation: its volumes are per 10-s
    interval, so the window of per-interval counts the rate rules judge is 10 s.

    Attributes
    ----------
    enabled
        Off: no new ejections, and every ejection in force ends at once.
    interval_ns
        How often endpoints are judged.
    window_ns
        Span of per-interval counts the rate rules judge (a sliding window).
    base_ejection_ns, max_ejection_ns
        Ejection time is ``base × multiplier``, at most ``max(base, max)``.
    max_ejection_percent
        At most this share of the endpoints ejected at once, but at least one
        (0: none).
    consecutive_failures
        Failures without a success that eject (0: rule off).
    failure_percentage, failure_percentage_volume
        Failed share of the window's calls that ejects (0: rule off), and the calls
        the window needs for it.
    success_rate_stdev, success_rate_min_hosts, success_rate_volume
        The stdev factor (0: rule off), the endpoints with enough calls the rule needs,
        and what "enough" is.
    panic_threshold
        Below this share of endpoints not ejected, ejections are ignored (0: never).
    """

    enabled: bool = True
    interval_ns: int = _S
    window_ns: int = 10 * _S
    base_ejection_ns: int = 30 * _S
    max_ejection_ns: int = 300 * _S
    max_ejection_percent: float = 10.0
    consecutive_failures: int = 5
    failure_percentage: float = 85.0
    failure_percentage_volume: int = 50
    success_rate_stdev: float = 1.9
    success_rate_min_hosts: int = 5
    success_rate_volume: int = 100
    panic_threshold: float = 50.0

    def __post_init__(self) -> None:
        if not 0 < self.interval_ns <= self.window_ns:
            raise OutlierError(
                f"outlier interval must be > 0 and at most the window, got "
                f"{self.interval_ns} ns and a {self.window_ns} ns window"
            )
        if self.base_ejection_ns <= 0 or self.max_ejection_ns < 0:
            raise OutlierError(
                f"ejection times must be > 0 (base) and >= 0 (max), got "
                f"{self.base_ejection_ns} and {self.max_ejection_ns} ns"
            )
        for name in ("max_ejection_percent", "failure_percentage", "panic_threshold"):
            v = getattr(self, name)
            if not 0.0 <= v <= 100.0:
                raise OutlierError(f"{name} must be a percentage from 0 to 100, got {v!r}")
        for name in (
            "consecutive_failures",
            "failure_percentage_volume",
            "success_rate_min_hosts",
            "success_rate_volume",
        ):
            if getattr(self, name) < 0:
                raise OutlierError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not (self.success_rate_stdev >= 0.0 and np.isfinite(self.success_rate_stdev)):
            raise OutlierError(
                f"success_rate_stdev must be finite and >= 0, got {self.success_rate_stdev!r}"
            )

    @property
    def window_intervals(self) -> int:
        """Intervals the window spans (at least 1)."""
        return max(1, -(-self.window_ns // self.interval_ns))

    def ejection_ns(self, multiplier: Any) -> np.ndarray:
        """Ejection time of an ejection with ``multiplier`` (1 = first), in nanoseconds."""
        cap = max(self.base_ejection_ns, self.max_ejection_ns)
        m = np.asarray(multiplier, dtype=np.int64)
        return np.minimum(self.base_ejection_ns * np.maximum(m, 1), cap)


#: The defaults (Envoy's, for a 1-s interval).
DEFAULT_OUTLIER_PARAMS = OutlierParams()


class IntervalCounts(NamedTuple):
    """One interval's calls per endpoint as the rules count them.

    Attributes
    ----------
    successes : numpy.ndarray
        ``int64`` calls that succeeded.
    failures : numpy.ndarray
        ``int64`` failures that count (timeouts only where the endpoint stood out).
    local_timeouts : numpy.ndarray
        ``int64`` timeouts judged the caller's (counted neither way).
    """

    successes: np.ndarray
    failures: np.ndarray
    local_timeouts: np.ndarray


def _stand_out(calls: np.ndarray, timeouts: np.ndarray, peers: np.ndarray) -> np.ndarray:
    """Which endpoints' timeouts are theirs: they stand out from the peers' (module notes)."""
    pc = np.where(peers, calls, 0)
    pt = np.where(peers, timeouts, 0)
    n1 = calls.astype(np.float64)
    n2 = (pc.sum() - pc).astype(np.float64)  # the peers' calls, without the endpoint itself
    t2 = (pt.sum() - pt).astype(np.float64)
    has = (n1 > 0) & (n2 > 0)
    n1, n2 = np.maximum(n1, 1.0), np.maximum(n2, 1.0)
    own, theirs = timeouts / n1, t2 / n2
    both = (timeouts + t2) / (n1 + n2)
    inv = 1.0 / n1 + 1.0 / n2
    se = np.sqrt(both * (1.0 - both) * inv)
    # Yates' continuity correction: at a handful of calls the normal test overstates.
    gap = own - theirs - 0.5 * inv
    z = np.divide(gap, se, out=np.zeros_like(se), where=se > 0)
    return (
        has
        & (theirs <= TIMEOUT_PEER_MAX + 1e-12)
        & (own - theirs >= TIMEOUT_MARGIN - 1e-9)  # (7/10 - 2/10)
        & (z >= TIMEOUT_Z)
    )


def interval_counts(calls: Any, failures_by_kind: Any, peers: Any = None) -> IntervalCounts:
    """Successes and counted failures of one interval, judging timeouts across endpoints.

    Parameters
    ----------
    calls
        Calls per endpoint that ended in the interval (failed ones included).
    failures_by_kind
        ``(endpoints, 4)`` failures per kind, columns in :data:`FAILURE_KINDS` order.
    peers
        Boolean mask of the endpoints a timeout is judged against (default: all; the
        monitor leaves out ejected endpoints, whose last calls are the tail of their
        own failure).

    Returns
    -------
    IntervalCounts
        A timeout counts as a failure only if the endpoint stands out from its peers
        (:data:`TIMEOUT_PEER_MAX`, :data:`TIMEOUT_MARGIN`, :data:`TIMEOUT_Z`; see the
        module notes); else it is a local timeout.

    Raises
    ------
    OutlierError
        Shapes that do not match, negative counts or more failures than calls.
    """
    c = np.asarray(calls, dtype=np.int64)
    k = np.asarray(failures_by_kind, dtype=np.int64)
    if c.ndim != 1 or k.shape != (c.size, len(FAILURE_KINDS)):
        raise OutlierError(
            f"calls must be (n,) and failures by kind (n, {len(FAILURE_KINDS)}), got "
            f"{c.shape} and {k.shape}"
        )
    failed = k.sum(axis=1)
    if c.size and (int(c.min()) < 0 or int(k.min()) < 0 or bool((failed > c).any())):
        raise OutlierError("counts must be >= 0 and failures at most the calls")
    peer = np.ones(c.size, np.bool_) if peers is None else np.asarray(peers, np.bool_)
    if peer.shape != c.shape:
        raise OutlierError(f"peers must be a mask of {c.size} endpoints, got {peer.shape}")
    timeouts = k[:, FAIL_TIMEOUT - 1]
    local = timeouts
    if timeouts.any():
        local = np.where(_stand_out(c, timeouts, peer), 0, timeouts)
    return IntervalCounts(c - failed, failed - local, local)


def streaks(streak: Any, successes: Any, failures: Any) -> np.ndarray:
    """Consecutive failures after one more interval.

    The order of calls inside an interval is unknown, so any success in it ends the
    streak (a pod that dies mid-interval starts its streak in the next one); an
    interval without counted calls leaves it as it was.
    """
    st = np.asarray(streak, dtype=np.int64)
    s = np.asarray(successes, dtype=np.int64)
    f = np.asarray(failures, dtype=np.int64)
    return np.where(s > 0, 0, st + f)


class Verdict(NamedTuple):
    """Which endpoints are outliers now.

    Attributes
    ----------
    reasons : numpy.ndarray
        ``uint8`` per endpoint: :data:`REASON_NONE` or the first rule that fired, in
        the order consecutive failures, failure percentage, success rate.
    failure_rate : numpy.ndarray
        ``float64`` counted failed share of the window's calls (0 without calls): how
        bad an outlier is, when not every outlier may be ejected.
    """

    reasons: np.ndarray
    failure_rate: np.ndarray


def judge(successes: Any, failures: Any, streak: Any, params: OutlierParams) -> Verdict:
    """Apply the three rules to the window's counts (see the module notes).

    Parameters
    ----------
    successes, failures
        Per endpoint: the window's successes and counted failures
        (:func:`interval_counts` summed over the window's intervals).
    streak
        Per endpoint: consecutive failures (:func:`streaks`).
    params
        The rules' settings.
    """
    s = np.asarray(successes, dtype=np.float64)
    f = np.asarray(failures, dtype=np.float64)
    st = np.asarray(streak, dtype=np.int64)
    if not (s.shape == f.shape == st.shape) or s.ndim != 1:
        raise OutlierError(
            f"successes, failures and streaks must be (n,) each, got {s.shape}, {f.shape}, "
            f"{st.shape}"
        )
    vol = s + f
    rate = np.divide(f, vol, out=np.zeros_like(f), where=vol > 0)
    reasons = np.zeros(s.size, dtype=np.uint8)
    if not params.enabled or not s.size:
        return Verdict(reasons, rate)
    if params.success_rate_stdev > 0:
        hosts = vol >= max(params.success_rate_volume, 1)
        if int(hosts.sum()) >= max(params.success_rate_min_hosts, 1):
            ok = 1.0 - rate[hosts]
            mean, sd = float(ok.mean()), float(ok.std())
            bar = min(mean - params.success_rate_stdev * sd, mean - SUCCESS_RATE_MIN_GAP)
            low = np.zeros(s.size, dtype=np.bool_)
            low[hosts] = ok < bar
            reasons[low] = REASON_SUCCESS_RATE
    if params.failure_percentage > 0:
        over = (vol >= max(params.failure_percentage_volume, 1)) & (
            rate * 100.0 >= params.failure_percentage
        )
        reasons[over] = REASON_FAILURE_PERCENTAGE
    if params.consecutive_failures > 0:
        reasons[st >= params.consecutive_failures] = REASON_CONSECUTIVE
    return Verdict(reasons, rate)
