"""Bulk hashing: Skipper's ring node names (vectorized XXH64) and checksums of blobs.

A ring of ``n`` endpoints holds ``n * vnodes`` nodes named ``f"{address}-{j}"``, each
placed at its XXH64 (seed 0), as Skipper places them; :func:`hash_node_names` computes
them without building the strings, with the XXH64 algorithm written as NumPy array
arithmetic over 8-byte lanes (the constants and rounds of the XXH64 specification;
tests check it against the ``xxhash`` package). Keys are hashed by :func:`lbcore.hash_keys`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

__all__ = ["digest", "hash_node_names"]

# Rings smaller than this many nodes are hashed name by name: the vectorized rounds pay
# a fixed NumPy cost per call that only amortises over a few hundred nodes.
_VECTOR_MIN_NODES = 512

# Names per block of the vectorized path, times vnodes: temporaries stay in the CPU caches.
_BLOCK_NODES = 1 << 15

_U64 = np.uint64
_P1 = _U64(11400714785074694791)
_P2 = _U64(14029467366897019727)
_P3 = _U64(1609587929392839161)
_P4 = _U64(9650029242287828579)
_P5 = _U64(2870177450012600261)
_V1_INIT = _U64((int(_P1) + int(_P2)) & 0xFFFFFFFFFFFFFFFF)  # seed 0
_V4_INIT = _U64((-int(_P1)) & 0xFFFFFFFFFFFFFFFF)
_LE_U64 = np.dtype("<u8")
# The constants as 0-d arrays for ufunc operands: a NumPy scalar operand is converted on
# every call (a good part of a call on a few hundred rows).
_P1a, _P2a, _P3a, _P4a, _P5a = (
    np.array(int(p), dtype=np.uint64) for p in (_P1, _P2, _P3, _P4, _P5)
)
_U64_CONSTS: dict[int, np.ndarray] = {}


def _u64(value: int) -> np.ndarray:
    """``value`` as a cached 0-d ``uint64`` array (shift counts, masks, lengths, powers of 10)."""
    a = _U64_CONSTS.get(value)
    if a is None:
        if len(_U64_CONSTS) >= 1024:  # name lengths are unbounded
            _U64_CONSTS.clear()
        a = _U64_CONSTS[value] = np.array(value, dtype=np.uint64)
    return a


_NATIVE_LE = sys.byteorder == "little"

_xxh64 = xxhash.xxh64_intdigest


def _rotl(x: np.ndarray, r: int, tmp: np.ndarray) -> np.ndarray:
    """Rotate ``x`` left by ``r`` bits in place, using ``tmp`` as scratch."""
    np.right_shift(x, _u64(64 - r), out=tmp)
    np.left_shift(x, _u64(r), out=x)
    np.bitwise_or(x, tmp, out=x)
    return x


def _round(acc: np.ndarray, lane: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """XXH64 round: ``acc = rotl(acc + lane * P2, 31) * P1`` in place."""
    np.multiply(lane, _P2a, out=tmp)
    np.add(acc, tmp, out=acc)
    _rotl(acc, 31, tmp)
    np.multiply(acc, _P1a, out=acc)
    return acc


def _xxh64_lanes(words: Any, length: int, out: np.ndarray | None = None) -> np.ndarray:
    """XXH64 (seed 0) of ``n`` keys of ``length`` bytes each.

    Parameters
    ----------
    words
        The keys' bytes read as little-endian 8-byte lanes: an ``(n, ceil(length / 8))``
        uint64 matrix, or a sequence of ``ceil(length / 8)`` uint64 columns (possibly
        unaligned strided views of a byte buffer). Bytes of the last lane beyond
        ``length`` are ignored, so they need not be zero.
    length
        Length of every key, in bytes.
    out
        Optional ``uint64`` array of ``n`` elements for the result.
    """
    if isinstance(words, np.ndarray):
        words = [words[:, j] for j in range(words.shape[1])]
    n = words[0].shape[0]
    tmp = np.empty(n, dtype=np.uint64)
    k1 = np.empty(n, dtype=np.uint64)
    offset = 0  # bytes consumed so far
    if length >= 32:
        v1 = np.full(n, _V1_INIT, dtype=np.uint64)
        v2 = np.full(n, _P2, dtype=np.uint64)
        v3 = np.zeros(n, dtype=np.uint64)
        v4 = np.full(n, _V4_INIT, dtype=np.uint64)
        accs = (v1, v2, v3, v4)
        while length - offset >= 32:
            w = offset // 8
            for j in range(4):
                _round(accs[j], words[w + j], tmp)
            offset += 32
        h = np.empty(n, dtype=np.uint64) if out is None else out
        for j, r in enumerate((1, 7, 12, 18)):
            np.copyto(k1, accs[j])
            _rotl(k1, r, tmp)
            if j == 0:
                np.copyto(h, k1)
            else:
                np.add(h, k1, out=h)
        for acc in accs:  # merge rounds
            k1.fill(0)
            _round(k1, acc, tmp)
            np.bitwise_xor(h, k1, out=h)
            np.multiply(h, _P1a, out=h)
            np.add(h, _P4a, out=h)
    else:
        h = np.empty(n, dtype=np.uint64) if out is None else out
        h.fill(_P5)
    np.add(h, _u64(length), out=h)
    while length - offset >= 8:
        k1.fill(0)
        _round(k1, words[offset // 8], tmp)
        np.bitwise_xor(h, k1, out=h)
        _rotl(h, 27, tmp)
        np.multiply(h, _P1a, out=h)
        np.add(h, _P4a, out=h)
        offset += 8
    rest = length - offset
    if rest:
        last = words[offset // 8]
        shift = 0
        if rest >= 4:
            np.bitwise_and(last, _u64(0xFFFFFFFF), out=k1)
            np.multiply(k1, _P1a, out=k1)
            np.bitwise_xor(h, k1, out=h)
            _rotl(h, 23, tmp)
            np.multiply(h, _P2a, out=h)
            np.add(h, _P3a, out=h)
            shift = 32
            rest -= 4
        for _ in range(rest):
            np.right_shift(last, _u64(shift), out=k1)
            np.bitwise_and(k1, _u64(0xFF), out=k1)
            np.multiply(k1, _P5a, out=k1)
            np.bitwise_xor(h, k1, out=h)
            _rotl(h, 11, tmp)
            np.multiply(h, _P1a, out=h)
            shift += 8
    return _xorshift_multiply(h, tmp, ((33, _P2a), (29, _P3a)), 32)  # XXH64's avalanche


def _xorshift_multiply(
    x: np.ndarray, tmp: np.ndarray, rounds: tuple[tuple[int, np.ndarray], ...], last: int
) -> np.ndarray:
    """``x ^= x >> s; x *= m`` for each ``(s, m)``, then ``x ^= x >> last``, in place."""
    for shift, mult in rounds:
        np.right_shift(x, _u64(shift), out=tmp)
        np.bitwise_xor(x, tmp, out=x)
        np.multiply(x, mult, out=x)
    np.right_shift(x, _u64(last), out=tmp)
    np.bitwise_xor(x, tmp, out=x)
    return x


def _lanes_from_rows(rows: np.ndarray, length: int) -> np.ndarray:
    """Copy an ``(n, length)`` uint8 matrix (any strides) into zero-padded uint64 lanes."""
    n = rows.shape[0]
    width = (length + 7) // 8
    padded = np.empty((n, width * 8), dtype=np.uint8)
    padded[:, length:] = 0
    if length:
        padded[:, :length] = rows
    words = padded.view(_LE_U64)
    return words if _NATIVE_LE else words.astype(np.uint64)


def _hash_rows(rows: np.ndarray, length: int) -> np.ndarray:
    if length == 0:
        return np.full(rows.shape[0], _xxh64(b""), dtype=np.uint64)
    return _xxh64_lanes(_lanes_from_rows(rows, length), length)


def hash_node_names(names: Sequence[str], count: int) -> np.ndarray:
    """XXH64 of ``f"{name}-{j}"`` for every name and ``j = 0 .. count-1``, name-major.

    Skipper's ring nodes. The strings are never built: for each group of names with the
    same UTF-8 length and each number of digits of ``j``, a byte matrix of
    ``name + "-" + digits`` rows is filled by broadcasting and hashed with the
    vectorized XXH64, so a 20,000-endpoint ring costs milliseconds, not a second.

    Parameters
    ----------
    names
        Endpoint addresses.
    count
        Virtual nodes per name.

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of ``len(names) * count`` hashes; entry ``i * count + j`` is node
        ``j`` of name ``i``.
    """
    n = len(names)
    out = np.empty(n * count, dtype=np.uint64)
    if n * count < _VECTOR_MIN_NODES:
        out[:] = [_xxh64(f"{name}-{j}".encode()) for name in names for j in range(count)]
        return out
    encoded = [name.encode("utf-8") for name in names]
    lengths = np.fromiter(map(len, encoded), dtype=np.intp, count=n)
    by_length: dict[int, list[int]] = {}
    for i, length in enumerate(lengths.tolist()):
        by_length.setdefault(length, []).append(i)
    digit_groups = []
    for d in range(1, len(str(max(count - 1, 0))) + 1):
        js = np.arange(0 if d == 1 else 10 ** (d - 1), min(10**d, count), dtype=np.intp)
        if js.size:
            table = np.frombuffer(b"".join(b"%d" % j for j in js.tolist()), np.uint8)
            digit_groups.append((d, js, table.reshape(js.size, d)))
    out2 = out.reshape(n, count)
    per_block = max(1, _BLOCK_NODES // max(count, 1))
    for length, members in by_length.items():
        for a in range(0, len(members), per_block):
            part = members[a : a + per_block]
            idx = np.array(part, dtype=np.intp)
            prefix = np.frombuffer(b"".join(encoded[i] for i in part), np.uint8)
            prefix = prefix.reshape(idx.size, length)
            for d, js, digits in digit_groups:
                total = length + 1 + d
                rows = np.empty((idx.size, js.size, total), dtype=np.uint8)
                rows[:, :, :length] = prefix[:, None, :]
                rows[:, :, length] = ord("-")
                rows[:, :, length + 1 :] = digits[None, :, :]
                h = _hash_rows(rows.reshape(-1, total), total)
                out2[idx[:, None], js[None, :]] = h.reshape(idx.size, js.size)
    return out


def digest(data: Any) -> int:
    """XXH3-64 (seed 0) of the bytes of a buffer: a checksum for large blobs.

    For shared-memory tables (``shm`` may not import xxhash itself): faster than CRC-32
    (``perf/RESULTS.md``), with a 64-bit result; xxhash releases the GIL while it
    hashes a large buffer, so other threads keep running.

    Parameters
    ----------
    data
        Any object with the buffer protocol (``bytes``, ``memoryview``, a contiguous
        NumPy array).
    """
    return xxhash.xxh3_64_intdigest(data)
