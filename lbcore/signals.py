"""Load signals: occupancy and the effective load bounded load compares.

* **in-flight**: open requests per endpoint (Skipper's signal).
* **occupancy**: busy-seconds per second over a sliding window: the time the host's
  workers spent waiting on a pod divided by the window. A pod kept busy one full second
  every second reads 1.0. Unlike in-flight counts it stays meaningful between bursts and
  tells a warm pod doing many fast requests from a cold one doing few slow ones.
* **effective load**: ``max(in_flight, occupancy) × min(pod_latency / global_latency, 5)``.

A failed call counts as load too (:func:`with_failures`): a pod that refuses
connections answers in microseconds, so by its busy time alone it would look the least
loaded of all and draw bounded load's spill until it is ejected. Each failed call
therefore adds the host's mean call latency to its pod's busy time and latency sum, as
if it had been an ordinary call. The in-flight signal stays Skipper's (open requests).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lbcore.errors import LoadError

__all__ = [
    "DEFAULT_LATENCY_CAP",
    "DEFAULT_WINDOW_NS",
    "LOAD_SIGNALS",
    "effective_load",
    "failure_rate",
    "global_latency",
    "load_for",
    "mean_latency",
    "occupancy",
    "open_busy_ns",
    "routing_load",
    "window_weights",
    "with_failures",
]

#: Default occupancy window: 10 s, in nanoseconds.
DEFAULT_WINDOW_NS = 10_000_000_000
#: Cap on the latency factor of the effective load.
DEFAULT_LATENCY_CAP = 5.0
#: Names of the load signals a knob may select.
LOAD_SIGNALS = ("effective", "occupancy", "in-flight")


def window_weights(
    bucket_starts_ns: Any, bucket_ns: int, now_ns: int, window_ns: int
) -> np.ndarray:
    """Share of each time bucket's counts that fall inside the window ``(now - window, now]``.

    A bucket's counts are taken as spread evenly over the part of it that has elapsed:
    ``[start, min(start + bucket_ns, now))``. So the bucket in progress counts fully, and
    the oldest bucket only by its overlap with the window.

    Parameters
    ----------
    bucket_starts_ns
        Start of each bucket, in nanoseconds (CLOCK_MONOTONIC).
    bucket_ns
        Width of every bucket, in nanoseconds.
    now_ns
        The present, in nanoseconds.
    window_ns
        Window length, in nanoseconds.

    Returns
    -------
    numpy.ndarray
        ``float64`` weights in ``[0, 1]``; a bucket wholly outside the window weighs 0.
    """
    starts = np.asarray(bucket_starts_ns, dtype=np.int64)
    end = np.minimum(starts + bucket_ns, now_ns)
    lo = np.maximum(starts, now_ns - window_ns)
    span = (end - starts).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(span > 0, (end - lo) / np.where(span > 0, span, 1.0), 0.0)
    return np.clip(w, 0.0, 1.0)


def occupancy(busy_ns: Any, window_ns: int, weights: Any = None) -> np.ndarray:
    """Busy-seconds per second over a window.

    Parameters
    ----------
    busy_ns
        Busy time per endpoint in nanoseconds: shape ``(endpoints,)`` already summed over
        the window, or ``(endpoints, buckets)`` per time bucket.
    window_ns
        Window length, in nanoseconds.
    weights
        For per-bucket input, the share of each bucket inside the window
        (:func:`window_weights`); default: every bucket counts fully.

    Returns
    -------
    numpy.ndarray
        ``float64`` occupancy per endpoint (1.0 = busy the whole window; above 1 when
        several requests overlap).
    """
    if window_ns <= 0:
        raise LoadError(f"occupancy window must be > 0 ns, got {window_ns}")
    busy = np.asarray(busy_ns, dtype=np.float64)
    if busy.ndim == 2:
        busy = busy @ (
            np.ones(busy.shape[1]) if weights is None else np.asarray(weights, np.float64)
        )
    return busy / float(window_ns)


def _per_completed(total: Any, completed: Any) -> np.ndarray:
    total = np.asarray(total, dtype=np.float64)
    count = np.asarray(completed, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.where(count > 0, count, 1.0), np.nan)


def mean_latency(latency_sum_s: Any, completed: Any) -> np.ndarray:
    """Mean latency per endpoint in seconds; NaN where nothing completed."""
    return _per_completed(latency_sum_s, completed)


def failure_rate(failures: Any, completed: Any) -> np.ndarray:
    """Share of the completed calls per endpoint that failed; NaN where nothing completed."""
    return _per_completed(failures, completed)


def global_latency(latency_sum_ns: Any, completed: Any) -> float:
    """The host's mean call latency in seconds over every endpoint; NaN: nothing completed.

    ``latency_sum_ns`` (nanoseconds) and ``completed`` are per endpoint.
    """
    total = float(np.sum(completed))
    return float(np.sum(latency_sum_ns)) / total / 1e9 if total > 0 else float("nan")


def open_busy_ns(counts: Any, since_ns: Any, start_sum_ns: Any, window_ns: int) -> np.ndarray:
    """Busy time of calls still open, each counted from its start but at most for the window.

    Per group of calls that started in one time bucket: ``count × (now - bucket start) -
    their start offsets in the bucket``, clipped to ``[0, count × window]``. Exact for
    buckets wholly inside or outside the window; in the one straddling its start, off by
    at most a bucket per call.

    Parameters
    ----------
    counts
        Open calls per group and endpoint (``int64``; negative counts as 0).
    since_ns
        Time from each group's bucket start to now, in nanoseconds, shape ``(groups,
        1)`` (capped by the caller so the products stay far from overflow).
    start_sum_ns
        Summed start offsets of the group's calls from the bucket start, in nanoseconds,
        per group and endpoint.
    window_ns
        The occupancy window in nanoseconds.

    Returns
    -------
    numpy.ndarray
        ``int64`` busy nanoseconds per group and endpoint.
    """
    c = np.maximum(counts, 0)
    busy = c * since_ns - start_sum_ns
    np.clip(busy, 0, c * window_ns, out=busy)
    return busy


def with_failures(
    occupancy_: Any,
    mean_latency_s: Any,
    completed: Any,
    failures: Any,
    global_latency_s: float,
    window_s: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Occupancy and mean latency with every failed call counted as a call of mean length.

    Parameters
    ----------
    occupancy_
        Measured busy-seconds per second per endpoint.
    mean_latency_s
        Measured mean latency per endpoint in seconds (NaN: nothing completed).
    completed, failures
        Calls per endpoint that ended in the window, and those of them that failed.
    global_latency_s
        The host's mean call latency in seconds (NaN or 0: no change).
    window_s
        The occupancy window in seconds.

    Returns
    -------
    tuple of numpy.ndarray
        ``occupancy + failures × global_latency / window`` and ``(latency sum + failures
        × global_latency) / completed``: each failed call adds at least the host's mean
        call latency of busy time to its endpoint.
    """
    occ = np.asarray(occupancy_, dtype=np.float64)
    lat = np.asarray(mean_latency_s, dtype=np.float64)
    f = np.asarray(failures, dtype=np.float64)
    g = float(global_latency_s)
    if not (np.isfinite(g) and g > 0.0 and window_s > 0) or not f.any():
        return occ, lat
    n = np.asarray(completed, dtype=np.float64)
    extra = f * g
    occ = occ + extra / float(window_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        lat = np.where(n > 0, (np.nan_to_num(lat) * n + extra) / np.where(n > 0, n, 1.0), lat)
    return occ, lat


def _signal(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size and not (arr.min() >= 0.0 and arr.max() < np.inf):
        raise LoadError(f"{name} must be finite and >= 0 per endpoint, got {arr.tolist()!r:.120}")
    return arr


def effective_load(
    in_flight: Any,
    occupancy_: Any,
    pod_latency_s: Any = None,
    global_latency_s: float | None = None,
    *,
    cap: float = DEFAULT_LATENCY_CAP,
) -> np.ndarray:
    """``max(in_flight, occupancy) × min(pod_latency / global_latency, cap)``.

    Parameters
    ----------
    in_flight
        Open requests per endpoint.
    occupancy_
        Busy-seconds per second per endpoint.
    pod_latency_s
        Mean latency per endpoint in seconds; NaN or 0 (no data yet) weighs 1.
    global_latency_s
        Mean latency over all endpoints in seconds; ``None``, NaN or 0 weighs every
        endpoint 1 (no latency information).
    cap
        Upper bound of the latency factor (default 5).

    Returns
    -------
    numpy.ndarray
        ``float64`` effective load per endpoint, finite and ``>= 0``.

    Raises
    ------
    LoadError
        If ``in_flight`` or ``occupancy_`` holds a negative or non-finite value.
    """
    base = np.maximum(_signal("in_flight", in_flight), _signal("occupancy", occupancy_))
    if pod_latency_s is None or global_latency_s is None:
        return base
    g = float(global_latency_s)
    if not np.isfinite(g) or g <= 0.0:
        return base
    lat = np.asarray(pod_latency_s, dtype=np.float64)
    ratio = np.where(np.isfinite(lat) & (lat > 0.0), lat / g, 1.0)
    return base * np.minimum(ratio, cap)


def load_for(
    signal: str,
    in_flight: Any,
    occupancy_: Any,
    pod_latency_s: Any = None,
    global_latency_s: float | None = None,
    *,
    cap: float = DEFAULT_LATENCY_CAP,
) -> np.ndarray:
    """The load bounded load compares, for the knob ``signal``.

    Parameters
    ----------
    signal
        One of :data:`LOAD_SIGNALS`: ``"effective"`` (:func:`effective_load`),
        ``"occupancy"`` (busy-seconds per second) or ``"in-flight"`` (open requests).
    in_flight, occupancy_, pod_latency_s, global_latency_s, cap
        As in :func:`effective_load` (latencies in seconds).

    Returns
    -------
    numpy.ndarray
        ``float64`` load per endpoint, finite and ``>= 0``.
    """
    if signal == "effective":
        return effective_load(in_flight, occupancy_, pod_latency_s, global_latency_s, cap=cap)
    if signal == "occupancy":
        return _signal("occupancy", occupancy_)
    if signal == "in-flight":
        return _signal("in_flight", in_flight)
    raise LoadError(f"unknown load signal {signal!r}; expected one of {', '.join(LOAD_SIGNALS)}")


def routing_load(
    signal: str,
    in_flight: Any,
    occupancy_: Any,
    mean_latency_s: Any,
    completed: Any,
    failures: Any,
    global_latency_s: float,
    window_s: float,
    *,
    cap: float = DEFAULT_LATENCY_CAP,
) -> np.ndarray:
    """The load bounded load compares for ``signal``, failed calls counted as load.

    :func:`load_for` on the occupancy and latency of :func:`with_failures`: every failed
    call adds the host's mean call latency of busy time, so a pod that fails fast does
    not look idle.

    Parameters
    ----------
    signal
        One of :data:`LOAD_SIGNALS`.
    in_flight, occupancy_, mean_latency_s
        Measured open calls, busy-seconds per second and mean latency (seconds, NaN:
        nothing completed) per endpoint.
    completed, failures
        Calls per endpoint that ended in the window, and those of them that failed.
    global_latency_s
        The host's mean call latency in seconds.
    window_s
        The occupancy window in seconds.
    cap
        Upper bound of the effective load's latency factor.

    Returns
    -------
    numpy.ndarray
        ``float64`` load per endpoint, finite and ``>= 0``.
    """
    occ, lat = with_failures(
        occupancy_, mean_latency_s, completed, failures, global_latency_s, window_s
    )
    return load_for(signal, in_flight, occ, lat, global_latency_s, cap=cap)
