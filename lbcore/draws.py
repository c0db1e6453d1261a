"""Per-key draws: a second, independent value per key, from its hash.

The ring orders keys by their raw XXH64 hash; the fade-in ring choice and the rollout
gate need a second value per key that is uncorrelated with that order. It is the hash
re-mixed with MurmurHash3's 64-bit finalizer (``fmix64``, a bijection with full
avalanche) after XOR with a per-purpose salt: a few array operations instead of hashing
the key bytes a second time.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["below", "below_threshold", "mix64", "unit_interval", "unit_threshold"]

_U64 = np.uint64
_FMIX_C1 = _U64(0xFF51AFD7ED558CCD)
_FMIX_C2 = _U64(0xC4CEB9FE1A85EC53)
_INV_2_53 = 1.0 / float(1 << 53)

_M64 = 0xFFFFFFFFFFFFFFFF

# fmix64's constants as 0-d arrays: a NumPy call with a scalar operand converts it on
# every call, which is most of the cost of a call on a small batch.
_MIX_SHIFT = np.array(33, dtype=_U64)
_MIX_C1 = np.array(int(_FMIX_C1), dtype=_U64)
_MIX_C2 = np.array(int(_FMIX_C2), dtype=_U64)
_SALTS: dict[int, np.ndarray] = {}
_xor, _shr, _mul = np.bitwise_xor, np.right_shift, np.multiply


def mix64(hashes: np.ndarray, salt: int) -> np.ndarray:
    """MurmurHash3's ``fmix64`` of ``hashes ^ salt`` (a new uint64 array)."""
    key = salt & _M64
    salt_arr = _SALTS.get(key)
    if salt_arr is None:
        salt_arr = _SALTS[key] = np.array(key, dtype=_U64)
    # Three buffers in turn: an output that is also an input costs NumPy an overlap
    # check on every call. Module-level ufuncs with a positional output: a keyword
    # ``out=`` costs more per call (perf/bench_kernel.py measures the mix).
    xor, shr, mul, k = _xor, _shr, _mul, _MIX_SHIFT
    a = xor(hashes, salt_arr)
    b = shr(a, k)
    c = xor(a, b)
    mul(c, _MIX_C1, a)
    shr(a, k, b)
    xor(a, b, c)
    mul(c, _MIX_C2, a)
    shr(a, k, b)
    return xor(a, b, c)


def unit_threshold(share: float) -> int:
    """Integer form of ``u < share`` for :func:`below`: ``ceil(share * 2**53) << 11``.

    ``u = (m >> 11) / 2**53`` and ``share * 2**53`` is exact in float64, so
    ``u < share`` holds exactly when ``m < ceil(share * 2**53) << 11``.
    """
    if share <= 0.0:
        return 0
    if share >= 1.0:
        return 1 << 64
    return math.ceil(share * float(1 << 53)) << 11


def below(hashes: np.ndarray, salt: int, share: float) -> np.ndarray:
    """Per key, ``unit_interval(hashes, salt) < share``, without the float conversion."""
    return below_threshold(hashes, salt, unit_threshold(share))


def below_threshold(hashes: np.ndarray, salt: int, threshold: int) -> np.ndarray:
    """Per key, ``mix64(hashes, salt) < threshold``: :func:`below` on an integer threshold.

    ``threshold`` is a share already in :func:`unit_threshold`'s integer form (``0`` to
    ``2**64``: no key to every key), as a plan keeps it.
    """
    if threshold <= 0:
        return np.zeros(hashes.size, dtype=np.bool_)
    if threshold > _M64:
        return np.ones(hashes.size, dtype=np.bool_)
    return mix64(hashes, salt) < _U64(threshold)


def unit_interval(hashes: np.ndarray, salt: int) -> np.ndarray:
    """Map key hashes to ``[0, 1)`` independently of their ring position.

    The ring orders keys by the raw hash; the fade-in ring choice and the rollout gate
    need a second value per key that is uncorrelated with that order, so the hash is
    re-mixed with MurmurHash3's 64-bit finalizer (``fmix64``, a bijection with full
    avalanche) after XOR with a per-purpose ``salt``. Costs a few array operations
    instead of hashing the key bytes a second time.

    Parameters
    ----------
    hashes
        ``uint64`` key hashes from :func:`hash_keys`.
    salt
        A 64-bit constant per purpose, so fade-in and gate draws are independent.

    Returns
    -------
    numpy.ndarray
        ``float64`` values in ``[0, 1)``, from the top 53 bits of the mixed hash.
    """
    x = mix64(hashes, salt)
    np.right_shift(x, _U64(11), out=x)
    out = x.astype(np.float64)
    out *= _INV_2_53
    return out
