"""Pod-reported load folded into bounded load: which reports count, and the loads they give.

A host sees only its own calls, about 1/H of a pod's work with H client hosts, and none
of the work other callers give it. A pod that reports its own occupancy (busy-seconds
per second over all of its workers, ``named_metrics.occupancy`` of the
``endpoint-load-metrics`` header) says what every caller together does to it.

**Report state**, one row per endpoint slot (:class:`ReportState`, what the workers keep
in shared memory): the latest value and its kind, when it arrived, when the current run
of reports began (the blackout's start) and whose reports they are (an identity hash of
the pod's address and UID, the caller's choice).

**Which reports count** (:func:`report_status`), after gRPC A58's weighted round robin:

* a report older than the expiry is not used; the next one starts a new run;
* a new run begins with a blackout. A58 ignores a pod's reports during it; here a
  blackout report may *raise* the pod's load above the host's view but never lower it.
  Honouring a hot report at once is safe for bounded load, whose only answer to a high
  load is to move keys *away* from the pod that said it is hot; a low report from a pod
  that just started (idle because nobody has called it yet, its cache cold) is the one
  A58 guards against, and it is still held back until the blackout ends;
* a new identity (the address; a UID where the caller passes one: the tables carry
  none yet) or a change of kind starts a new run.

**Like with like** (:func:`effective_loads`): occupancy (busy-s/s) is comparable only
between pods that each report it; utilization is a fraction of a capacity each pod
chooses. Each kind is one group: a pod sending ``named_metrics.occupancy`` is in the
occupancy group, one sending only ``application_utilization`` in the utilization group,
and a pod with no usable report keeps the host's view. A group of fewer than two pods
has nothing to be compared with and keeps the host's view too.

**Host scale.** Bounded load's bar is ``balance_factor × (increment + Σ load) / n`` on
the host's vector, whose increment is what one routed call adds to the host's own
signal. A reported value is the pod's total, about H times the host's share, in another
unit. So within a group G the reports are rescaled to the host's view of G::

    load_i = r_i × max(Σ_G h, |G| × increment) / Σ_G r        (i in G)

a pod's share of its group's reported total times the host's total over the group.
Σ load stays the host's total (so the bar keeps its meaning and its increment), and
``load_i / mean_G(load) = r_i / mean_G(r)``: a pod is over the bar when its report is
``balance_factor`` times its group's average. The floor (one routed call per pod) keeps
a host that has not yet called the group from scaling every report to 0. When a group
holds at least two pods past their blackout, only those set the scale (a pod in its
blackout is scaled by it); otherwise the whole group does.

**Zone affinity.** This host does not send every pod an equal part: each pod's bar is
drawn from its expected share ``e_i`` of the host's keys (:mod:`lbcore.zones`, B1). A
report is then rescaled onto that share instead of the flat mean::

    load_i = (r_i / mean_G r) × e_i × max(Σ_G h, |G| × increment) / Σ_G e

so a pod at its group's average sits exactly at its expected part of the host's total,
and ``load_i / bar_i`` is again ``r_i / (balance_factor × mean_G r)`` (for a pod
expected to carry less than the average, whose bar is the average's, lower). With
equal shares this is the rule above.

No I/O, no clocks: times are arguments (CLOCK_MONOTONIC nanoseconds, the caller's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lbcore.bounded import check_loads
from lbcore.errors import LoadError
from lbcore.kernel import hash_keys
from lbcore.report_settings import ReportSettings

__all__ = [
    "KIND_NONE",
    "KIND_OCCUPANCY",
    "KIND_UTILIZATION",
    "SOURCES",
    "SOURCE_HOST",
    "SOURCE_REPORTED",
    "STATUS_BLACKOUT",
    "STATUS_FRESH",
    "STATUS_NONE",
    "FoldedLoads",
    "ReportError",
    "ReportState",
    "effective_loads",
    "forget",
    "pod_identity",
    "record_reports",
    "refresh_due",
    "report_status",
    "report_value",
    "run_start",
]

#: Report kinds (``ReportState.kind``, uint8): none, ``named_metrics.occupancy``
#: (busy-s/s), ``application_utilization`` (a fraction of the pod's capacity).
KIND_NONE, KIND_OCCUPANCY, KIND_UTILIZATION = 0, 1, 2
#: Report status (:func:`report_status`, int8): not usable, in its blackout, fresh.
STATUS_NONE, STATUS_BLACKOUT, STATUS_FRESH = 0, 1, 2
#: Load source per endpoint (:attr:`FoldedLoads.source`, uint8), and its metric label.
SOURCE_HOST, SOURCE_REPORTED = 0, 1
SOURCES = ("host", "reported")


class ReportError(LoadError):
    """A report value, kind or slot the folding rules refuse; the message says which."""


def report_value(occupancy: float | None, utilization: float | None) -> tuple[float, int]:
    """The value a parsed report is folded with, and its kind.

    Parameters
    ----------
    occupancy
        ``named_metrics.occupancy`` in busy-seconds per second, or ``None`` if absent.
    utilization
        ``application_utilization`` as a fraction of capacity, or ``None`` if absent.

    Returns
    -------
    tuple of (float, int)
        Occupancy when present, else utilization; ``(nan, KIND_NONE)`` for neither.

    Raises
    ------
    ReportError
        A present value that is negative or not finite (the parser counts it malformed).
    """
    for name, v in (("occupancy", occupancy), ("application_utilization", utilization)):
        if v is not None and not (math.isfinite(v) and v >= 0.0):
            raise ReportError(f"reported {name} must be finite and >= 0, got {v!r}")
    if occupancy is not None:
        return float(occupancy), KIND_OCCUPANCY
    if utilization is not None:
        return float(utilization), KIND_UTILIZATION
    return math.nan, KIND_NONE


@dataclass(frozen=True, slots=True)
class ReportState:
    """The latest report per endpoint slot: five arrays of one length ``n``.

    Attributes
    ----------
    value : numpy.ndarray
        ``float64`` latest value, in its kind's unit (NaN: none).
    kind : numpy.ndarray
        ``uint8`` :data:`KIND_NONE`, :data:`KIND_OCCUPANCY` or :data:`KIND_UTILIZATION`.
    at_ns : numpy.ndarray
        ``int64`` when the latest report arrived (ns).
    since_ns : numpy.ndarray
        ``int64`` when the current run of reports began: the blackout's start (ns).
    identity : numpy.ndarray
        ``uint64`` the reporting pod's identity (a hash of its address and UID).
    """

    value: np.ndarray
    kind: np.ndarray
    at_ns: np.ndarray
    since_ns: np.ndarray
    identity: np.ndarray

    def take(self, slots: Any) -> ReportState:
        """The rows of ``slots``, in that order (e.g. ``Table.slots``: per endpoint)."""
        idx = np.asarray(slots, np.intp)
        return ReportState(
            self.value.take(idx),
            self.kind.take(idx),
            self.at_ns.take(idx),
            self.since_ns.take(idx),
            self.identity.take(idx),
        )

    @classmethod
    def empty(cls, n: int) -> ReportState:
        """``n`` slots with no report."""
        return cls(
            np.full(n, np.nan),
            np.zeros(n, np.uint8),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            np.zeros(n, np.uint64),
        )


def pod_identity(address: str, uid: str = "") -> int:
    """The identity a pod's reports are kept under: XXH64 of its address and UID.

    A pod replaced at the same address (a new UID) or moved to another address starts a
    new run of reports, with a blackout. ``uid`` empty: the address alone.
    """
    return int(hash_keys([f"{address}\x00{uid}".encode()])[0])


def run_start(
    kind: Any,
    at_ns: Any,
    since_ns: Any,
    identity: Any,
    new_kind: Any,
    new_identity: Any,
    now_ns: int,
    expiry_ns: int,
) -> np.ndarray:
    """The blackout start of a report arriving at ``now_ns`` after the slot's latest one.

    The run goes on (``since_ns`` kept) when the previous report is of the same kind and
    identity and no older than ``expiry_ns``; otherwise a new run starts at ``now_ns``.
    Arrays broadcast; returns ``int64``.
    """
    at = np.asarray(at_ns, np.int64)
    same = (
        (np.asarray(kind) == np.asarray(new_kind))
        & (np.asarray(kind) != KIND_NONE)
        & (np.asarray(identity, np.uint64) == np.asarray(new_identity, np.uint64))
        & (at <= now_ns)
        & (now_ns - at <= expiry_ns)
    )
    return np.where(same, np.asarray(since_ns, np.int64), np.int64(now_ns))


def record_reports(
    state: ReportState,
    slots: Any,
    values: Any,
    kinds: Any,
    identities: Any,
    now_ns: int,
    expiry_ns: int,
) -> ReportState:
    """``state`` with one report per given slot arriving at ``now_ns``.

    Raises
    ------
    ReportError
        A value negative or not finite, a kind not a report kind, a slot out of range,
        or a slot given twice.
    """
    idx = np.asarray(slots, np.intp).reshape(-1)
    val = np.broadcast_to(np.asarray(values, np.float64), idx.shape)
    knd = np.broadcast_to(np.asarray(kinds), idx.shape)
    ids = np.broadcast_to(np.asarray(identities, np.uint64), idx.shape)
    n = state.value.size
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ReportError(f"report slots must be in 0..{n - 1}, got {idx.tolist()!r:.80}")
    if np.unique(idx).size != idx.size:
        raise ReportError("a slot may be given one report per call")
    if not (np.isfinite(val) & (val >= 0.0)).all():
        raise ReportError(f"reported values must be finite and >= 0, got {val.tolist()!r:.80}")
    if not np.isin(knd, (KIND_OCCUPANCY, KIND_UTILIZATION)).all():
        raise ReportError(f"report kinds must be {KIND_OCCUPANCY} or {KIND_UTILIZATION}")
    since = run_start(
        state.kind[idx],
        state.at_ns[idx],
        state.since_ns[idx],
        state.identity[idx],
        knd,
        ids,
        now_ns,
        expiry_ns,
    )
    new = ReportState(
        *(a.copy() for a in (state.value, state.kind, state.at_ns, state.since_ns, state.identity))
    )
    new.value[idx] = val
    new.kind[idx] = knd
    new.at_ns[idx] = now_ns
    new.since_ns[idx] = since
    new.identity[idx] = ids
    return new


def forget(state: ReportState, slots: Any) -> ReportState:
    """``state`` with the given slots emptied (a slot handed to another endpoint)."""
    idx = np.asarray(slots, np.intp)
    empty = ReportState.empty(idx.size)
    new = ReportState(
        *(a.copy() for a in (state.value, state.kind, state.at_ns, state.since_ns, state.identity))
    )
    for name in ("value", "kind", "at_ns", "since_ns", "identity"):
        getattr(new, name)[idx] = getattr(empty, name)
    return new


def report_status(state: ReportState, now_ns: int, settings: ReportSettings) -> np.ndarray:
    """Per slot: :data:`STATUS_FRESH`, :data:`STATUS_BLACKOUT` or :data:`STATUS_NONE`.

    Cells no writer produces (a value negative or not finite, an unknown kind, a time
    after ``now_ns``, a run that begins after its latest report: shared memory any
    process of the user can write) make the slot's report unusable, never an error.
    """
    age = now_ns - state.at_ns
    usable = (
        ((state.kind == KIND_OCCUPANCY) | (state.kind == KIND_UTILIZATION))
        & np.isfinite(state.value)
        & (state.value >= 0.0)
        & (age >= 0)
        & (age <= settings.expiry_ns)
        & (state.since_ns <= state.at_ns)
    )
    past_blackout = now_ns - state.since_ns >= settings.blackout_ns
    status = np.where(past_blackout, STATUS_FRESH, STATUS_BLACKOUT).astype(np.int8)
    status[~usable] = STATUS_NONE
    return status


def refresh_due(state: ReportState, now_ns: int, refresh_ns: int) -> np.ndarray:
    """Per slot: whether discovery should ask the pod's load-only path for a report now.

    Due when the latest report is ``refresh_ns`` old or older, or there is none.
    """
    return (state.kind == KIND_NONE) | (now_ns - state.at_ns >= refresh_ns)


@dataclass(frozen=True, slots=True)
class FoldedLoads:
    """Loads for bounded load and where each came from.

    Attributes
    ----------
    loads : numpy.ndarray
        ``float64`` per endpoint, in the host vector's unit: pass to
        :func:`lbcore.bounded.in_call_units` and on to the plan as the host's vector was.
    source : numpy.ndarray
        ``uint8`` per endpoint, :data:`SOURCE_HOST` or :data:`SOURCE_REPORTED`
        (``SOURCES[source]`` is the metric label).
    """

    loads: np.ndarray
    source: np.ndarray


def effective_loads(
    host: Any,
    state: ReportState,
    now_ns: int,
    settings: ReportSettings,
    increment: float = 1.0,
    *,
    expected: Any = None,
) -> FoldedLoads:
    """The load vector bounded load compares: reports where they count, the host's elsewhere.

    Parameters
    ----------
    host
        The host's own load per endpoint (the load signal's vector, before
        :func:`~lbcore.bounded.in_call_units`), finite and ``>= 0``.
    state
        Report state of the same endpoints, in the same order.
    now_ns
        The present (ns, the clock the reports were stamped with).
    settings
        The report settings; with ``enabled`` false the host's vector comes back as is.
    increment
        What one routed call adds to the host's signal (the bar's increment, in the
        host vector's unit): the scale's floor, one call per reporting pod.
    expected
        With zone affinity, each endpoint's expected share of this host's keys, the
        one its bar is drawn from (:attr:`lbcore.Plan.bar_shares`): reports are
        rescaled onto it, so a pod reporting its group's average sits at its expected
        share and is over its bar as a pod is without a zone, at ``balance_factor``
        times the average. ``None``: the host's flat view (every pod alike).

    Returns
    -------
    FoldedLoads
        ``loads`` is ``host`` itself (same values, bit for bit) wherever no report
        counts; see the module's description for the rule.

    Raises
    ------
    LoadError
        A host load negative or not finite, a state of another length, a bad increment.
    """
    raw = np.asarray(host)
    loads = check_loads(host, raw.shape[0] if raw.ndim == 1 else -1)
    n = loads.size
    source = np.zeros(n, np.uint8)
    if not settings.enabled or n == 0:
        return FoldedLoads(loads, source)
    if state.value.shape != (n,):
        raise LoadError(f"report state has {state.value.size} slots, loads {n}")
    if not (math.isfinite(increment) and increment > 0.0):
        raise LoadError(f"increment must be finite and > 0, got {increment!r}")
    shares = None
    if expected is not None:
        shares = np.asarray(expected, dtype=np.float64)
        if shares.shape != (n,) or not (np.isfinite(shares).all() and (shares >= 0).all()):
            raise LoadError(f"expected must be {n} finite shares >= 0")
    status = report_status(state, now_ns, settings)
    out = loads
    for kind in (KIND_OCCUPANCY, KIND_UTILIZATION):
        member = (state.kind == kind) & (status != STATUS_NONE)
        trusted = member & (status == STATUS_FRESH)
        base = trusted if np.count_nonzero(trusted) >= 2 else member
        count = np.count_nonzero(base)
        if count < 2:
            continue  # nothing to compare a lone report with
        reported_total = float(state.value[base].sum())
        if not reported_total > 0.0:
            continue  # every pod of the group reports idle: the host's view says more
        host_total = max(float(loads[base].sum()), count * increment)
        share_total = 0.0 if shares is None else float(shares[base].sum())
        if share_total > 0.0:
            assert shares is not None
            mean = reported_total / count
            scaled = state.value / mean * shares * (host_total / share_total)
        else:
            scaled = state.value * (host_total / reported_total)
        if out is loads:
            out = loads.copy()
        hot = member & ~trusted & (scaled > loads)  # blackout: only raise
        use = trusted | hot
        out[use] = scaled[use]
        source[use] = SOURCE_REPORTED
    return FoldedLoads(out, source)
