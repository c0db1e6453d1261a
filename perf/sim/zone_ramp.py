"""How long cslb's local share should take to rise (``CSLB_ZONE_RAMP``): a simulated ramp.

An even fleet runs global (``x = 0``) until ``at_s``, then cslb's ``x`` rises to the
cap (1 on an even fleet) over ``R`` seconds along :func:`lbcore.fade.fade_share`'s
curve (exponent 1: linear; the N-ring fade's exponent: slow start, steep end). Every
key that turns local is asked of a local pod whose cache does not hold it yet, so the
database takes a burst of reads; the steady state after the ramp reads more than before
(each zone caches its own copy of the local keys), and the question is how far above
that new level the burst goes and for how long.

Figures per ramp: the database reads per second before, at the peak second and in the
new steady state (the last ``settle_s`` of the run); the peak over the new steady
state; the reads above it, summed from the ramp's start (the ramp's extra cost); the
lowest one-second hit rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from lbcore.knobs import defaults
from perf.sim.zones import ZonesConfig, run

__all__ = ["RAMPS", "ramp_curves", "ramp_study"]

#: Ramp lengths compared, in seconds (0: the share jumps).
RAMPS = (0.0, 10.0, 30.0, 60.0, 120.0)


def ramp_curves() -> tuple[float, ...]:
    """Curve exponents compared: linear, and the N-ring fade's (``CSLB_FADE_EXPONENT``)."""
    return (1.0, float(defaults()["fade_exponent"]))


def ramp_study(
    base: ZonesConfig,
    *,
    ramps: tuple[float, ...] = RAMPS,
    exponents: tuple[float, ...] | None = None,
    at_s: float = 10.0,
    settle_s: float = 30.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Raise cslb's share from 0 to its cap over each ramp length, on the same traffic.

    A ramp that would not end ``settle_s`` before the run does (``base.seconds``) is
    left out and named in ``skipped``.

    Returns
    -------
    dict
        ``rows`` (one per ramp and curve: ``ramp_s``, ``exponent``,
        ``reads_before``, ``reads_peak``, ``reads_after`` per second, ``peak_over_after``,
        ``excess_reads``, ``hit_rate_min``, ``series``) and ``skipped``.
    """
    exponents = ramp_curves() if exponents is None else exponents
    out: dict[str, Any] = {"rows": [], "skipped": []}
    for e in exponents:
        for r in ramps:
            if at_s + r + settle_s > base.seconds:
                out["skipped"].append(r)
                continue
            if progress is not None:
                progress(f"ramp {r:g} s, exponent {e:g}")
            cfg = replace(base, strategy="cslb", share=1.0, ramp=(at_s, r, e))
            out["rows"].append(_figures(run(cfg), at_s, settle_s, r, e))
    out["skipped"] = sorted(set(out["skipped"]))
    return out


def _figures(res: dict[str, Any], at_s: float, settle_s: float, ramp_s: float, e: float):
    s = res["series"]
    t, reads, hit = s["t"], s["db_reads"], s["hit_rate"]
    before = (t >= max(0.0, at_s - 5.0)) & (t < at_s)
    after = t >= t[-1] + 1 - settle_s
    during = t >= at_s
    steady = float(reads[after].mean())
    # 5-s means: the sum above the new level would otherwise be mostly the noise of
    # single seconds (a Poisson count's), the same in every row
    smooth = np.convolve(reads, np.ones(5) / 5, "same")
    return {
        "ramp_s": ramp_s,
        "exponent": e,
        "reads_before": float(reads[before].mean()) if before.any() else math.nan,
        "reads_peak": float(reads[during].max()),
        "reads_after": steady,
        "peak_over_after": float(reads[during].max() / steady) if steady else math.nan,
        "peak_5s_over_after": float(smooth[during].max() / steady) if steady else math.nan,
        "excess_reads": float(np.clip(smooth[during] - steady, 0.0, None).sum()),
        "hit_rate_min": float(hit[during].min()),
        "cross_after": float(s["cross_share"][after].mean()),
        "series": s,
    }
