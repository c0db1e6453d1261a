"""Rollout gate: the kill switch and the percentage of keys routed client-side.

``CSLB_ENABLED`` and ``CSLB_PERCENTAGE`` decide per key, deterministically, whether a key
is routed by cslb or returned as fallback (``-1``: the caller sends it through the
ingress as before). A key is in iff its gate draw ``g`` in ``[0, 1)`` (an independent
re-mix of its hash) is below ``percentage / 100``, so raising the percentage only ever
adds keys and lowering it only removes them: no key flaps between paths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lbcore.draws import below
from lbcore.errors import GateError

__all__ = ["FALLBACK", "GATE_SALT", "Gate", "apply_gate", "gate_mask"]

#: Endpoint index that means "not routed client-side: use the ingress".
FALLBACK = -1
#: Salt of the per-key gate draw (independent of the ring position and the fade draw).
GATE_SALT = 0x726F6C6C6F757421


def _check_percentage(percentage: Any) -> float:
    if isinstance(percentage, bool) or not isinstance(
        percentage, (int, float, np.integer, np.floating)
    ):
        raise GateError(f"percentage must be a number from 0 to 100, got {percentage!r}")
    p = float(percentage)
    if not math.isfinite(p) or p < 0.0 or p > 100.0:
        raise GateError(f"percentage must be from 0 to 100, got {percentage!r}")
    return p


@dataclass(frozen=True, slots=True)
class Gate:
    """The kill switch and rollout percentage.

    Parameters
    ----------
    enabled
        ``False`` sends every key to fallback.
    percentage
        Share of keys (0-100) routed client-side.
    """

    enabled: bool = True
    percentage: float = 100.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, (bool, np.bool_)):
            raise GateError(f"enabled must be a bool, got {self.enabled!r}")
        object.__setattr__(self, "percentage", _check_percentage(self.percentage))

    @property
    def passes_all(self) -> bool:
        """True when no key is excluded (the gate costs nothing then)."""
        return bool(self.enabled) and self.percentage >= 100.0

    def mask(self, hashes: np.ndarray) -> np.ndarray:
        """Boolean per key: ``True`` routes client-side, ``False`` is fallback."""
        return gate_mask(hashes, self.enabled, self.percentage)

    def apply(self, indices: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """Set excluded keys of a routed batch to :data:`FALLBACK`, in place; return it."""
        return apply_gate(indices, hashes, self.enabled, self.percentage)


def gate_mask(hashes: np.ndarray, enabled: bool, percentage: float) -> np.ndarray:
    """Per key, ``True`` if the gate routes it client-side.

    Parameters
    ----------
    hashes
        ``uint64`` key hashes.
    enabled
        Kill switch; ``False`` excludes every key.
    percentage
        Share of keys (0-100) routed client-side.
    """
    p = _check_percentage(percentage)
    n = hashes.size
    if not enabled or p <= 0.0:
        return np.zeros(n, dtype=np.bool_)
    if p >= 100.0:
        return np.ones(n, dtype=np.bool_)
    return below(hashes, GATE_SALT, p / 100.0)


def apply_gate(
    indices: np.ndarray, hashes: np.ndarray, enabled: bool, percentage: float
) -> np.ndarray:
    """Set the keys the gate excludes to :data:`FALLBACK` in ``indices`` (in place)."""
    if enabled and _check_percentage(percentage) >= 100.0:
        return indices
    indices[~gate_mask(hashes, enabled, percentage)] = FALLBACK
    return indices
