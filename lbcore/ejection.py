"""Ejections over time: who is ejected, until when, and whether routing honours it.

:func:`step` advances the per-endpoint ejection state by one evaluation, given the
outliers :func:`lbcore.outlier.judge` found:

1. ejections whose time is over end (the endpoint is *readmitted*);
2. outliers not yet ejected are ejected, worst first (consecutive failures, then
   failure percentage, then success rate; within a rule the higher failure rate), while
   fewer than ``max(1, floor(n × max_ejection_percent / 100))`` endpoints are ejected
   (none at 0 %). Each ejection raises the endpoint's multiplier by one and lasts
   ``base × multiplier``, at most ``max(base, max)`` (Envoy's rule);
3. the multiplier decays while the endpoint stays healthy: one step down per window
   (10 s by default, the pace of Envoy's decrement per 10-s interval) spent readmitted
   without being an outlier.

:func:`routing_mask` is what workers honour: the ejected endpoints, unless fewer than
``panic_threshold`` % of the endpoints are left (then none: fail open, Envoy's panic
mode). With the threshold at 0 every endpoint may end up ejected; routing then answers
fallback for every key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from lbcore.errors import OutlierError
from lbcore.outlier import EJECT_REASONS, OutlierParams

__all__ = ["Ejections", "Step", "routing_mask", "step"]

_N_REASONS = len(EJECT_REASONS)


@dataclass(frozen=True, slots=True)
class Ejections:
    """Ejection state per endpoint (rows aligned with the caller's endpoint list).

    Attributes
    ----------
    reason : numpy.ndarray
        ``uint8``: 0 not ejected, else the reason code of the ejection in force
        (:data:`lbcore.outlier.EJECT_REASONS` ``[reason - 1]``).
    until_ns : numpy.ndarray
        ``int64`` CLOCK_MONOTONIC time the ejection ends (0 when not ejected).
    multiplier : numpy.ndarray
        ``int32`` Envoy's ejection multiplier: ejections in a row, decaying while healthy.
    decay_ns : numpy.ndarray
        ``int64`` when the multiplier next drops one step if the endpoint stays healthy
        (0: nothing to decay).
    counts : numpy.ndarray
        ``int64`` ``(endpoints, 3)``: ejections so far per reason.
    """

    reason: np.ndarray
    until_ns: np.ndarray
    multiplier: np.ndarray
    decay_ns: np.ndarray
    counts: np.ndarray

    @classmethod
    def none(cls, n: int) -> Ejections:
        """``n`` endpoints never ejected."""
        return cls(
            np.zeros(n, np.uint8),
            np.zeros(n, np.int64),
            np.zeros(n, np.int32),
            np.zeros(n, np.int64),
            np.zeros((n, _N_REASONS), np.int64),
        )

    @classmethod
    def of(
        cls, reason: Any, until_ns: Any, multiplier: Any, decay_ns: Any, counts: Any
    ) -> Ejections:
        """Checked state from arrays (copies).

        Raises
        ------
        OutlierError
            Shapes that disagree, an unknown reason, negative times or counts.
        """
        r = np.array(reason, dtype=np.int64)
        n = r.size
        u = np.array(until_ns, dtype=np.int64)
        m = np.array(multiplier, dtype=np.int64)
        d = np.array(decay_ns, dtype=np.int64)
        c = np.array(counts, dtype=np.int64)
        if r.shape != (n,) or u.shape != (n,) or m.shape != (n,) or d.shape != (n,):
            raise OutlierError(
                f"ejection state arrays must be (n,) each, got {r.shape}, {u.shape}, "
                f"{m.shape}, {d.shape}"
            )
        if c.shape != (n, _N_REASONS):
            raise OutlierError(f"ejection counts must be ({n}, {_N_REASONS}), got {c.shape}")
        if n and (int(r.min()) < 0 or int(r.max()) > _N_REASONS):
            raise OutlierError(f"ejection reasons must be 0..{_N_REASONS}, got {r.tolist()[:10]}")
        if n and min(int(u.min()), int(m.min()), int(d.min()), int(c.min())) < 0:
            raise OutlierError("ejection times, multipliers and counts must be >= 0")
        return cls(r.astype(np.uint8), u, m.astype(np.int32), d, c)

    def __len__(self) -> int:
        return int(self.reason.size)

    @property
    def ejected(self) -> np.ndarray:
        """``bool`` per endpoint: an ejection is in force."""
        return self.reason > 0

    def take(self, rows: Any) -> Ejections:
        """The state of ``rows`` in that order; ``-1`` gives a never-ejected row.

        For a new endpoint list: row ``i`` of the result is old row ``rows[i]``.
        """
        idx = np.asarray(rows, dtype=np.intp)
        new = idx < 0
        safe = np.where(new, 0, idx)
        if not len(self):
            return Ejections.none(idx.size)

        def pick(a: np.ndarray) -> np.ndarray:
            out = a.take(safe, axis=0)
            out[new] = 0
            return out

        return Ejections(
            pick(self.reason),
            pick(self.until_ns),
            pick(self.multiplier),
            pick(self.decay_ns),
            pick(self.counts),
        )

    def equal(self, other: Ejections) -> bool:
        """Same state in every row."""
        return all(
            np.array_equal(a, b)
            for a, b in zip(
                (self.reason, self.until_ns, self.multiplier, self.decay_ns, self.counts),
                (other.reason, other.until_ns, other.multiplier, other.decay_ns, other.counts),
                strict=True,
            )
        )


class Step(NamedTuple):
    """The outcome of one evaluation.

    Attributes
    ----------
    state : Ejections
        The new state.
    ejected, readmitted : numpy.ndarray
        ``intp`` endpoints ejected and readmitted by this step.
    held_back : numpy.ndarray
        ``intp`` outliers not ejected because the maximum share is reached.
    """

    state: Ejections
    ejected: np.ndarray
    readmitted: np.ndarray
    held_back: np.ndarray


def step(
    state: Ejections,
    reasons: Any,
    now_ns: int,
    params: OutlierParams,
    failure_rate: Any = None,
) -> Step:
    """Advance ``state`` to ``now_ns`` given this evaluation's outliers (see module notes).

    Parameters
    ----------
    state
        Ejections before this step.
    reasons
        ``uint8`` per endpoint from :func:`lbcore.outlier.judge` (0: not an outlier).
        Endpoints readmitted by this step are not ejected again by it.
    now_ns
        CLOCK_MONOTONIC time of the evaluation, in nanoseconds.
    params
        Settings; with ``params.enabled`` false every ejection ends now.
    failure_rate
        Per endpoint, how bad an outlier is (higher first when not all may be ejected).
    """
    n = len(state)
    why = np.asarray(reasons, dtype=np.int64)
    if why.shape != (n,) or (n and (int(why.min()) < 0 or int(why.max()) > _N_REASONS)):
        raise OutlierError(
            f"reasons must be {n} codes from 0 to {_N_REASONS}, got shape {why.shape}"
        )
    rate = np.zeros(n) if failure_rate is None else np.asarray(failure_rate, dtype=np.float64)
    reason = state.reason.copy()
    until = state.until_ns.copy()
    mult = state.multiplier.copy()
    decay = state.decay_ns.copy()
    counts = state.counts.copy()
    now = int(now_ns)
    win = params.window_ns
    # 1. Ejections that are over (all of them with detection off).
    over = (reason > 0) & ((until <= now) | (not params.enabled))
    readmitted = np.flatnonzero(over)
    reason[over] = 0
    until[over] = 0
    decay[over] = np.where(mult[over] > 0, now + win, 0)
    # 2. New ejections, worst first, within the cap.
    cand = np.flatnonzero((why > 0) & (reason == 0) & ~over) if params.enabled else readmitted[:0]
    if cand.size:
        cand = cand[np.lexsort((cand, -rate[cand], why[cand]))]
    cap = max(1, int(n * params.max_ejection_percent // 100)) if params.max_ejection_percent else 0
    room = max(cap - int((reason > 0).sum()), 0)
    ejected, held = cand[:room], cand[room:]
    mult[ejected] += 1
    reason[ejected] = why[ejected]
    until[ejected] = now + params.ejection_ns(mult[ejected])
    decay[ejected] = 0
    np.add.at(counts, (ejected, why[ejected] - 1), 1)
    # 3. Decay: one step per window readmitted and healthy; an outlier held back is not.
    decay[held] = np.where(mult[held] > 0, now + win, 0)
    due = np.flatnonzero((reason == 0) & (mult > 0) & (decay > 0) & (decay <= now))
    if due.size:
        steps = 1 + (now - decay[due]) // win
        mult[due] = np.maximum(mult[due] - steps, 0).astype(np.int32)
        decay[due] = np.where(mult[due] > 0, decay[due] + steps * win, 0)
    return Step(Ejections(reason, until, mult, decay, counts), ejected, readmitted, held)


def routing_mask(ejected: Any, panic_threshold: float) -> tuple[np.ndarray, bool]:
    """What routing skips: ``(mask, panic)``.

    Parameters
    ----------
    ejected
        ``bool`` per endpoint: an ejection is in force (:attr:`Ejections.ejected`).
    panic_threshold
        Percentage: below this share of endpoints not ejected, routing ignores every
        ejection (``panic`` true, the mask all false). 0: never.
    """
    e = np.asarray(ejected, dtype=np.bool_)
    n = e.size
    healthy = n - int(e.sum())
    panic = bool(n and healthy * 100.0 < panic_threshold * n)
    return (np.zeros(n, dtype=np.bool_) if panic else e.copy()), panic
