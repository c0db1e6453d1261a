"""Key hashing: XXH64 (seed 0) over whole batches of keys.

Skipper hashes keys and ring nodes with ``xxhash.Sum64String`` (XXH64, seed 0, over the
UTF-8 bytes), so cslb must produce exactly the same 64-bit values.

Two strategies, picked per batch:

* small batches: one C call of the ``xxhash`` package per key. Vectorized hashing pays
  a fixed NumPy call overhead per batch, which only amortises above a few hundred keys;
* large batches: the XXH64 algorithm written as NumPy array arithmetic over a matrix of
  8-byte lanes, one row per key, keys grouped by length so every row of a group runs the
  same sequence of rounds. The algorithm's constants and rounds are those of the XXH64
  specification (Yann Collet, ``xxhash.h`` / ``doc/xxhash_spec.md``).

Keys may be ``str`` (hashed as UTF-8), ``bytes``-like, or integers (hashed as their
decimal string, so ``123`` and ``"123"`` route alike), in a sequence or a NumPy array.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from lbcore.errors import KeyEncodingError, KeyTooLongError, KeyTypeError

__all__ = [
    "MAX_KEY_BYTES",
    "VECTOR_MIN_BATCH",
    "decimal_key",
    "digest",
    "encode_key",
    "hash_keys",
    "hash_node_names",
    "unit_interval",
]

#: The longest key every cslb surface accepts, in bytes (UTF-8 for ``str`` keys).
MAX_KEY_BYTES = 4096

#: Batches at least this long are hashed with NumPy; shorter ones key by key.
VECTOR_MIN_BATCH = 512

#: Batches longer than two blocks are hashed a block of this many keys at a time.
BLOCK = 1 << 15

# Below this many keys a group of equal-length keys is cheaper to hash key by key.
_GROUP_MIN = 48

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
# every call (~0.2 us of a ~0.5 us call on a few hundred keys).
_P1a, _P2a, _P3a, _P4a, _P5a = (
    np.array(int(p), dtype=np.uint64) for p in (_P1, _P2, _P3, _P4, _P5)
)
_U64_CONSTS: dict[int, np.ndarray] = {}


def _u64(value: int) -> np.ndarray:
    """``value`` as a cached 0-d ``uint64`` array (shift counts, masks, lengths, powers of 10)."""
    a = _U64_CONSTS.get(value)
    if a is None:
        if len(_U64_CONSTS) >= 1024:  # key lengths are unbounded without max_key_bytes
            _U64_CONSTS.clear()
        a = _U64_CONSTS[value] = np.array(value, dtype=np.uint64)
    return a


_NATIVE_LE = sys.byteorder == "little"

_xxh64 = xxhash.xxh64_intdigest


def _type_error(i: int, key: Any) -> KeyTypeError:
    return KeyTypeError(
        f"key {i} has type {type(key).__name__}; expected str, bytes or int "
        "(a product ID: str is hashed as UTF-8, int as its decimal string)"
    )


# Python formats an int of at most sys.get_int_max_str_digits() digits (640 at the least);
# ints of at most this many bits have at most 600 digits, so str() formats them whatever
# the setting. Longer ones are measured before they are formatted (see decimal_key).
_REPR_SAFE_BITS = 1993
_REPR_SAFE_DIGITS = 600


def _digit_count(m: int) -> int:
    """Decimal digits of ``m >= 0``, without formatting it: from its bit length, then exact."""
    d = max(1, (m.bit_length() - 1) * 30103 // 100000 + 1)
    while d > 1 and m < 10 ** (d - 1):
        d -= 1
    while m >= 10**d:
        d += 1
    return d


def _digits(m: int, d: int) -> str:
    """The ``d`` decimal digits of ``0 <= m < 10**d``, zero-padded, a half at a time."""
    if d <= _REPR_SAFE_DIGITS:
        return str(m).zfill(d)
    half = d // 2
    high, low = divmod(m, 10**half)
    return _digits(high, d - half) + _digits(low, half)


def decimal_key(value: int, max_key_bytes: int | None = None) -> bytes | int:
    """The decimal string of an int of any size, as a key's bytes; its length if too long.

    Both kernels format integers with this rule; the native one calls this for ints of
    more than ~600 digits. Unlike ``str(value)`` it is not bound by Python's limit on
    digits, and it measures the string before it builds it: an int longer than
    ``max_key_bytes`` costs a few multiplications, not its formatting.

    Parameters
    ----------
    value
        The key (an ``int`` subclass counts by its value).
    max_key_bytes
        The key length limit, in bytes, or ``None``.

    Returns
    -------
    bytes or int
        The ASCII decimal string (``-`` for negatives), or its length in bytes when that is
        more than ``max_key_bytes``.
    """
    value = int.__int__(value)  # an int subclass by its value, not by its overrides
    m = -value if value < 0 else value
    if m.bit_length() <= _REPR_SAFE_BITS:
        text = b"%d" % value
        return len(text) if max_key_bytes is not None and len(text) > max_key_bytes else text
    d = _digit_count(m)
    length = d + (value < 0)
    if max_key_bytes is not None and length > max_key_bytes:
        return length
    return (("-" if value < 0 else "") + _digits(m, d)).encode("ascii")


def _int_value(key: int | np.integer) -> int:
    """An integer key's value: an ``int`` subclass's, or a NumPy scalar's stored value.

    Overrides of ``__int__``/``__index__`` in a subclass do not count: the value a NumPy
    scalar holds is the key, as it would be in an array of them.
    """
    if isinstance(key, int):
        return int.__int__(key)
    t = type(key)
    while t.__module__ != "numpy":  # a subclass: its NumPy base type reads the value
        t = t.__base__
    return t.__int__(key)


def encode_key(key: Any, i: int = 0) -> bytes:
    """Return the bytes that are hashed for one key.

    Parameters
    ----------
    key
        ``str`` (UTF-8), ``bytes``-like, or an integer (decimal string, ``-`` for negatives).
    i
        Position of the key in its batch, used in error messages.

    Raises
    ------
    KeyTypeError
        For ``bool``, ``float``, ``None`` and every other type.
    KeyEncodingError
        For a ``str`` that is not valid Unicode (a lone surrogate).

    Notes
    -----
    An integer key is its value: an ``int`` subclass's stored value, a NumPy integer
    scalar's stored value (a subclass's ``__index__`` or ``__int__`` does not count), of
    any number of digits (Python's limit on digits does not apply).
    """
    if isinstance(key, str):
        try:
            # str.encode, not key.encode: a subclass's override must not change the key
            # (the native kernel reads the characters themselves).
            return str.encode(key, "utf-8")
        except UnicodeEncodeError as exc:
            raise KeyEncodingError(
                f"key {i} is not valid Unicode and cannot be encoded as UTF-8: {exc.reason} "
                f"at character {exc.start}"
            ) from None
    if isinstance(key, (bytes, bytearray, memoryview)):
        # Through the buffer: bytes() would call a subclass's __bytes__ instead.
        return memoryview(key).tobytes()
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        text = decimal_key(_int_value(key))
        assert isinstance(text, bytes)  # no limit: always the string
        return text
    raise _type_error(i, key)


def _check_lengths(lengths: np.ndarray, max_key_bytes: int | None) -> None:
    if max_key_bytes is None or lengths.size == 0:
        return
    too_long = np.flatnonzero(lengths > max_key_bytes)
    if too_long.size:
        i = int(too_long[0])
        raise KeyTooLongError(
            f"key {i} is {int(lengths[i])} bytes long; keys may be at most {max_key_bytes} bytes "
            f"({too_long.size} key(s) too long in this batch)"
        )


# --------------------------------------------------------------------------------------
# Vectorized XXH64 over a matrix of little-endian 8-byte lanes.


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
    if n * count < VECTOR_MIN_BATCH:
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
    per_block = max(1, BLOCK // max(count, 1))  # names per block: temporaries stay in cache
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


def _hash_flat(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Hash keys stored as byte ranges ``buf[starts[i] : starts[i] + lengths[i]]``."""
    n = lengths.size
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    lmin = int(lengths.min())
    lmax = int(lengths.max())
    if lmin == lmax:
        groups = [(lmin, None)]
    else:
        order = np.argsort(lengths, kind="stable")
        sorted_len = lengths[order]
        cuts = np.flatnonzero(np.diff(sorted_len)) + 1
        bounds = np.concatenate(([0], cuts, [n]))
        groups = [(int(sorted_len[a]), order[a:b]) for a, b in itertools.pairwise(bounds)]
    raw = buf.tobytes() if any(g is not None and g.size < _GROUP_MIN for _, g in groups) else b""
    for length, members in groups:
        sel_starts = starts if members is None else starts[members]
        if members is not None and members.size < _GROUP_MIN:
            out[members] = [_xxh64(raw[s : s + length]) for s in sel_starts.tolist()]
            continue
        if length == 0:
            rows = np.empty((sel_starts.size, 0), dtype=np.uint8)
        else:
            rows = buf[sel_starts[:, None] + np.arange(length)]
        h = _hash_rows(rows, length)
        if members is None:
            out[:] = h
        else:
            out[members] = h
    return out


def _hash_aligned(mat: np.ndarray, lengths: np.ndarray, right: bool) -> np.ndarray:
    """Hash keys stored one per row of a fixed-width ``(n, width)`` uint8 matrix.

    Key ``i`` is the first (``right=False``) or last (``right=True``) ``lengths[i]``
    bytes of row ``i``. Rows are grouped by length; a group is a strided column slice of
    the matrix (after a row gather when lengths are mixed), never a byte-level gather.
    """
    n, width = mat.shape
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    counts = np.bincount(lengths, minlength=width + 1)
    present = np.flatnonzero(counts)
    if present.size == 1:
        length = int(present[0])
        return _hash_rows(mat[:, width - length :] if right else mat[:, :length], length)
    order = np.argsort(lengths, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(counts[present])))
    for length, lo, hi in zip(
        present.tolist(), bounds[:-1].tolist(), bounds[1:].tolist(), strict=True
    ):
        members = order[lo:hi]
        if members.size < _GROUP_MIN:
            cols = slice(width - length, width) if right else slice(0, length)
            out[members] = [_xxh64(row.tobytes()) for row in mat[members, cols]]
            continue
        rows = mat[members]
        out[members] = _hash_rows(rows[:, width - length :] if right else rows[:, :length], length)
    return out


def _hash_separated(buf: bytes, n: int, sep: int, max_key_bytes: int | None) -> np.ndarray | None:
    """Hash ``n`` keys joined by the byte ``sep``; ``None`` if some key contains ``sep``."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    is_sep = arr == sep
    length = buf.find(bytes((sep,))) if n > 1 else arr.size
    stride = length + 1
    if arr.size == n * stride - 1 and bool(is_sep[length::stride].all()):
        # Every key has the same length: if these are the only separators, key i starts
        # at i * stride and its 8-byte lanes are read in place, as unaligned strided
        # uint64 views of the buffer, for every row whose reads stay inside the buffer.
        if int(np.count_nonzero(is_sep)) != n - 1:
            return None
        _check_lengths(np.array([length]), max_key_bytes)
        out = np.empty(n, dtype=np.uint64)
        width = (length + 7) // 8
        inside = 0 if length == 0 else max(0, min(n, (arr.size - 8 * width) // stride + 1))
        if inside:
            lanes = [
                np.ndarray((inside,), dtype=_LE_U64, buffer=buf, offset=8 * j, strides=(stride,))
                for j in range(width)
            ]
            if not _NATIVE_LE:
                lanes = [lane.astype(np.uint64) for lane in lanes]
            _xxh64_lanes(lanes, length, out=out[:inside])
        for i in range(inside, n):
            out[i] = _xxh64(buf[i * stride : i * stride + length])
        return out
    seps = np.flatnonzero(is_sep)
    if seps.size != n - 1:
        return None
    starts = np.empty(n, dtype=np.intp)
    starts[0] = 0
    starts[1:] = seps + 1
    ends = np.empty(n, dtype=np.intp)
    ends[:-1] = seps
    ends[-1] = arr.size
    lengths = ends - starts
    _check_lengths(lengths, max_key_bytes)
    return _hash_flat(arr, starts, lengths)


def _hash_bytes_list(encoded: list[bytes], max_key_bytes: int | None) -> np.ndarray:
    n = len(encoded)
    lengths = np.fromiter(map(len, encoded), dtype=np.intp, count=n)
    _check_lengths(lengths, max_key_bytes)
    starts = np.zeros(n, dtype=np.intp)
    np.cumsum(lengths[:-1], out=starts[1:])
    buf = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return _hash_flat(buf, starts, lengths)


def _encode_all(keys: Sequence[Any], max_key_bytes: int | None) -> list[bytes]:
    """Every key's bytes; the first bad key's error, else the batch's too-long keys'.

    An int too long to be a key is measured, not formatted (see :func:`decimal_key`).
    """
    encoded = []
    measured: dict[int, int] = {}
    for i, k in enumerate(keys):
        if isinstance(k, int) and max_key_bytes is not None and int.bit_length(k) > _REPR_SAFE_BITS:
            text = decimal_key(k, max_key_bytes)
            if isinstance(text, int):
                measured[i] = text
                text = b""
            encoded.append(text)
        else:
            encoded.append(encode_key(k, i))
    if measured:
        lengths = np.fromiter(map(len, encoded), dtype=np.intp, count=len(encoded))
        lengths[list(measured)] = list(measured.values())
        _check_lengths(lengths, max_key_bytes)
    return encoded


# Four ASCII digits per uint32 ("0000" .. "9999"), little-endian so the bytes read in order.
_DIGITS4 = np.frombuffer(
    "".join(f"{i:04d}" for i in range(10_000)).encode("ascii"), dtype="<u4"
).astype(np.uint32)
_POW10 = np.array([10**k for k in range(1, 20)], dtype=np.uint64)


def _decimal_digits(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Decimal strings of integers, right-aligned in a byte matrix.

    Returns ``(buf, starts, lengths, width)``: row ``i`` of the ``(n, width)`` matrix
    flattened into ``buf`` holds the decimal string (with ``-`` for negatives) of
    ``values[i]`` in its last ``lengths[i]`` bytes. Digits are produced four at a time
    from a 10,000-entry table, so a 12-digit ID costs three divisions, not twelve.
    """
    n = values.size
    if values.dtype.kind == "i":
        signed = values.astype(np.int64, copy=False)
        negative = signed < 0
        magnitude = signed.view(np.uint64).copy()
        np.negative(magnitude, out=magnitude, where=negative)  # two's complement, wraps
        if not negative.any():
            negative = None
    else:
        magnitude = values.astype(np.uint64, copy=True)
        negative = None
    ndigits = np.searchsorted(_POW10, magnitude, side="right") + 1
    groups = (int(ndigits.max()) + 3) // 4
    width = 4 * groups + (0 if negative is None else 4)
    mat = np.empty((n, width // 4), dtype=np.uint32)
    rem = magnitude
    quo = np.empty(n, dtype=np.uint64)
    low = np.empty(n, dtype=np.uint64)
    for g in range(width // 4 - 1, width // 4 - 1 - groups, -1):
        np.floor_divide(rem, _u64(10_000), out=quo)
        np.multiply(quo, _u64(10_000), out=low)
        np.subtract(rem, low, out=low)
        np.take(_DIGITS4, low.view(np.int64), out=mat[:, g], mode="clip")
        rem, quo = quo, rem
    buf = (
        mat.view(np.uint8).reshape(-1)
        if _NATIVE_LE
        else mat.astype("<u4").view(np.uint8).reshape(-1)
    )
    lengths = ndigits
    if negative is not None:
        lengths = ndigits + negative
        rows = np.flatnonzero(negative)
        buf[rows * width + (width - lengths[rows])] = ord("-")
    starts = np.arange(n, dtype=np.intp) * width + (width - lengths)
    return buf, starts, lengths, width


# Tails of 1-3 digits, zero-padded in the high bytes, for the last partial 4-digit chunk.
_DIGITS_TAIL = {
    r: np.frombuffer(
        b"".join(f"{i:0{r}d}".encode("ascii").ljust(4, b"\0") for i in range(10**r)), dtype="<u4"
    ).astype(np.uint32)
    for r in (1, 2, 3)
}


# The same tables as uint64 lane halves: [low 32 bits, high 32 bits] (little-endian order).
_DIGITS4_LANE = (_DIGITS4.astype(np.uint64), _DIGITS4.astype(np.uint64) << _U64(32))
_DIGITS_TAIL_LANE = {
    r: (t.astype(np.uint64), t.astype(np.uint64) << _U64(32)) for r, t in _DIGITS_TAIL.items()
}


def _lanes_of_decimal(values: np.ndarray, length: int) -> list[np.ndarray]:
    """Little-endian 8-byte lanes of the ``length``-digit decimal strings of ``values``.

    Every value has exactly ``length`` digits. The string is built left-aligned four
    digits at a time: chunk ``k`` is ``(v // 10**(length - 4k - 4)) % 10**4``, looked up
    in a table of four ASCII digits already shifted into the low or high half of a lane,
    so a lane is two table gathers and an add, and no byte is moved after it is written.
    """
    m = values.size
    full, tail = divmod(length, 4)
    nchunks = full + (1 if tail else 0)
    # np.empty, not np.zeros: calloc'ed pages fault on first write, which costs more here
    # than the arithmetic; every lane is fully written below.
    lanes = [np.empty(m, dtype=np.uint64) for _ in range((nchunks + 1) // 2)]
    prev: np.ndarray | None = None
    quo = np.empty(m, dtype=np.uint64)
    chunk = np.empty(m, dtype=np.uint64)
    part = np.empty(m, dtype=np.uint64)
    for k in range(nchunks):
        last = k == full  # the partial tail chunk
        if last:
            if prev is None:
                np.copyto(chunk, values)
            else:
                np.multiply(prev, _u64(10**tail), out=chunk)
                np.subtract(values, chunk, out=chunk)
            table = _DIGITS_TAIL_LANE[tail][k % 2]
        else:
            np.floor_divide(values, _u64(10 ** (length - 4 * k - 4)), out=quo)
            if prev is None:
                np.copyto(chunk, quo)
            else:
                np.multiply(prev, _u64(10_000), out=chunk)
                np.subtract(quo, chunk, out=chunk)
            table = _DIGITS4_LANE[k % 2]
            prev, quo = quo, (prev if prev is not None else np.empty(m, dtype=np.uint64))
        # mode="clip": indices are in range by construction, and "raise" with out= makes
        # NumPy buffer the output in a fresh temporary.
        if k % 2 == 0:
            np.take(table, chunk.view(np.int64), out=lanes[k // 2], mode="clip")
        else:
            np.take(table, chunk.view(np.int64), out=part, mode="clip")
            np.add(lanes[k // 2], part, out=lanes[k // 2])
    return lanes


def _hash_nonnegative(values: np.ndarray) -> np.ndarray:
    """XXH64 of the decimal strings of non-negative integers (uint64 array)."""
    n = values.size
    low, top = len(str(int(values.min()))), len(str(int(values.max())))
    ndigits = np.full(n, low, dtype=np.uint8)
    ge = np.empty(n, dtype=np.bool_)
    for k in range(low, top):  # only the digit counts this batch spans
        np.greater_equal(values, _u64(10**k), out=ge)
        np.add(ndigits, ge, out=ndigits)
    counts = np.bincount(ndigits, minlength=21)
    present = np.flatnonzero(counts)
    if present.size == 1:
        length = int(present[0])
        return _xxh64_lanes(_lanes_of_decimal(values, length), length)
    out = np.empty(n, dtype=np.uint64)
    # One comparison and flatnonzero per digit count present (a handful): ~5x faster
    # than argsort of the uint8 counts (~9 ns per key at 32,768 keys, stable or not).
    for length in present.tolist():
        members = np.flatnonzero(ndigits == length)
        sub = values[members]
        if members.size < _GROUP_MIN:
            out[members] = [_xxh64(str(v).encode("ascii")) for v in sub.tolist()]
        else:
            out[members] = _xxh64_lanes(_lanes_of_decimal(sub, length), length)
    return out


def _hash_int_array(values: np.ndarray, max_key_bytes: int | None) -> np.ndarray:
    if values.size < VECTOR_MIN_BATCH:
        if max_key_bytes is None or max_key_bytes >= 20:  # no int64 decimal is longer
            return np.fromiter(
                map(_xxh64, map(b"%d".__mod__, values.tolist())), np.uint64, values.size
            )
        return _hash_small(values.tolist(), max_key_bytes)
    if max_key_bytes is not None and max_key_bytes < 20:
        _, _, lengths, _ = _decimal_digits(values)
        _check_lengths(lengths, max_key_bytes)
    if values.dtype.kind == "u":
        return _hash_nonnegative(values.astype(np.uint64, copy=False))
    signed = values.astype(np.int64, copy=False)
    if int(signed.min()) >= 0:
        return _hash_nonnegative(signed.view(np.uint64))
    buf, _, lengths, width = _decimal_digits(values)
    return _hash_aligned(buf.reshape(-1, width), lengths, right=True)


def _hash_fixed_bytes_array(arr: np.ndarray, max_key_bytes: int | None) -> np.ndarray:
    """Hash a NumPy ``S`` array; like NumPy itself, trailing NUL bytes are padding."""
    n = arr.size
    width = arr.dtype.itemsize
    if n < VECTOR_MIN_BATCH:
        return _hash_small(arr.tolist(), max_key_bytes)
    lengths = np.strings.str_len(arr).astype(np.intp, copy=False)
    _check_lengths(lengths, max_key_bytes)
    flat = np.ascontiguousarray(arr).view(np.uint8)
    if width == 0:
        return np.full(n, _xxh64(b""), dtype=np.uint64)
    return _hash_aligned(flat.reshape(n, width), lengths, right=False)


_MAX_CODE_POINT = 0x10FFFF


def _raise_not_unicode(codes: np.ndarray) -> None:
    """Name the first key of a U array's ``(n, width)`` code points that is not Unicode.

    Only raw UCS4 data (a buffer viewed as ``U``) holds values beyond U+10FFFF; such an
    array cannot even be turned into ``str`` objects. The first surrogate or such value,
    in key order, is named, with ``str.encode``'s words for a surrogate.
    """
    bad = (codes > _MAX_CODE_POINT) | ((codes >= 0xD800) & (codes <= 0xDFFF))
    i, j = divmod(int(np.flatnonzero(bad.reshape(-1))[0]), codes.shape[1])
    c = int(codes[i, j])
    what = (
        "surrogates not allowed" if c <= _MAX_CODE_POINT else f"code point 0x{c:X} beyond U+10FFFF"
    )
    raise KeyEncodingError(
        f"key {i} is not valid Unicode and cannot be encoded as UTF-8: {what} at character {j}"
    )


def _hash_unicode_array(arr: np.ndarray, max_key_bytes: int | None) -> np.ndarray:
    n = arr.size
    width = arr.dtype.itemsize // 4
    codes = np.ascontiguousarray(arr).view(np.uint32).reshape(n, width)
    if width and int(codes.max()) > _MAX_CODE_POINT:
        _raise_not_unicode(codes)
    if n < VECTOR_MIN_BATCH:
        return _hash_small(arr.tolist(), max_key_bytes)
    if width and int(codes.max()) < 128:
        # ASCII: UTF-8 is one byte per code point.
        as_bytes = codes.astype(np.uint8).view(f"S{width}").reshape(n)
        return _hash_fixed_bytes_array(as_bytes, max_key_bytes)
    return _hash_bytes_list(_encode_all(arr.tolist(), max_key_bytes), max_key_bytes)


def _int_reprs(keys: Sequence[Any]) -> list[str] | None:
    """Decimal strings of a list of ints, or ``None`` if any key is not an int (or is a bool)."""
    try:
        reprs = list(map(int.__repr__, keys))
    except (TypeError, ValueError):  # ValueError: beyond Python's limit on digits
        return None
    if ("0" in reprs or "1" in reprs) and any(type(k) is bool for k in keys):
        return None  # bool is an int subclass; the general path names it
    return reprs


_BYTES_LIKE = (bytes, bytearray, memoryview)


def _hash_small(keys: Sequence[Any], max_key_bytes: int | None) -> np.ndarray:
    """Key-by-key hashing for short batches: C-level ``map`` calls, no NumPy temporaries."""
    n = len(keys)
    t = type(keys[0])
    encoded: Any = None
    try:
        if t is str:
            # No key is longer than all of them together: a batch whose UTF-8 fits the
            # limit needs no per-key length (a non-str key fails the join and takes the
            # checked path below); nor do keys of at most a quarter of the limit in
            # code points (UTF-8 takes at most 4 bytes per code point).
            if (
                max_key_bytes is None
                or len("".join(keys).encode()) <= max_key_bytes
                or max(map(len, keys)) <= max_key_bytes >> 2
            ):
                return np.fromiter(map(_xxh64, map(str.encode, keys)), np.uint64, n)
            encoded = list(map(str.encode, keys))
        elif t is bytes and all(isinstance(k, _BYTES_LIKE) for k in keys):
            # Checked by type: NumPy integer scalars export a buffer too, and xxhash or
            # b"".join would take their raw bytes instead of their decimal string.
            if max_key_bytes is None:
                return np.fromiter(map(_xxh64, keys), np.uint64, n)
            encoded = list(keys)
        elif t is int:
            reprs = _int_reprs(keys)
            if reprs is not None:
                encoded = list(map(str.encode, reprs))
    except (TypeError, UnicodeEncodeError):
        encoded = None
    if encoded is None:
        encoded = _encode_all(keys, max_key_bytes)  # names the offending key
    if max_key_bytes is not None and max(map(len, encoded)) > max_key_bytes:
        _check_lengths(np.array([len(e) for e in encoded], dtype=np.intp), max_key_bytes)
    return np.fromiter(map(_xxh64, encoded), np.uint64, n)


def _hash_sequence(keys: Sequence[Any], max_key_bytes: int | None) -> np.ndarray:
    n = len(keys)
    if n < VECTOR_MIN_BATCH:
        return _hash_small(keys, max_key_bytes)
    first = keys[0]
    if type(first) is str:
        try:
            joined = "\n".join(keys).encode("utf-8")
        except (TypeError, UnicodeEncodeError):
            joined = None  # mixed types or a lone surrogate: the general path names it
        if joined is not None:
            out = _hash_separated(joined, n, 0x0A, max_key_bytes)
            if out is not None:
                return out
    elif type(first) is bytes:
        joined_b = None  # mixed types: the general path encodes or names each key
        if all(isinstance(k, _BYTES_LIKE) for k in keys):  # see _hash_small
            joined_b = b"\n".join(keys)
        if joined_b is not None:
            out = _hash_separated(joined_b, n, 0x0A, max_key_bytes)
            if out is not None:  # None: some key holds a newline
                return out
    elif type(first) is int and set(map(type, keys)) == {int}:  # bool is not int here
        try:
            values = np.fromiter(keys, dtype=np.int64, count=n)
        except OverflowError:
            values = None  # beyond int64: the general path formats them one by one
        if values is not None:
            return _hash_int_array(values, max_key_bytes)
    return _hash_bytes_list(_encode_all(keys, max_key_bytes), max_key_bytes)


def in_blocks(fn: Any, keys: Any, dtype: Any) -> np.ndarray:
    """Apply ``fn`` to a long batch a :data:`BLOCK` of keys at a time.

    Vectorized rounds stream their temporaries through memory; blocks keep them in the
    CPU caches, so a million keys cost per key what a hundred thousand do. Errors name
    the key's index in the whole batch.
    """
    n = len(keys)
    out = np.empty(n, dtype=dtype)
    for a in range(0, n, BLOCK):
        try:
            out[a : a + BLOCK] = fn(keys[a : a + BLOCK])
        except (KeyTypeError, KeyEncodingError, KeyTooLongError) as exc:
            raise type(exc)(_shift_key_index(str(exc), a)) from None
    return out


def _hash_long_str(keys: Sequence[Any], max_key_bytes: int | None) -> np.ndarray | None:
    """A long list of ``str`` keys: joined once, then encoded and hashed a block at a time.

    Joining the whole list visits every key object once; slicing the list into blocks
    first visits each twice more (the slice and its release), ~2.5 ns per key of ~25 at
    100,000 SKUs. Blocks are cut in the joined text at ``BLOCK * (len(keys[0]) + 1)``
    characters, which is exact when every key has the first key's length; each block
    then proves it holds exactly its keys (a newline at its end, and :func:`_hash_separated`
    finds one separator per key boundary in it and no other), so the n - 1 newlines are
    the separators and block ``j`` holds keys ``j * BLOCK ...``. ``None``: another batch
    (the block path answers, and names a bad key).
    """
    if type(keys[0]) is not str:
        return None
    try:
        joined = "\n".join(keys)
    except TypeError:
        return None
    n = len(keys)
    stride = len(keys[0]) + 1
    if stride == 1 or len(joined) != n * stride - 1:
        return None
    out = np.empty(n, dtype=np.uint64)
    for a in range(0, n, BLOCK):
        b = min(n, a + BLOCK)
        if b < n and joined[b * stride - 1] != "\n":
            return None
        try:
            block = joined[a * stride : b * stride - 1].encode("utf-8")
        except UnicodeEncodeError:
            return None
        try:
            h = _hash_separated(block, b - a, 0x0A, max_key_bytes)
        except KeyTooLongError as exc:
            raise KeyTooLongError(_shift_key_index(str(exc), a)) from None
        if h is None:
            return None
        out[a:b] = h
    return out


def _blocked(keys: Any, max_key_bytes: int | None) -> np.ndarray:
    """Hash a long batch in blocks of :data:`BLOCK` keys (see :func:`in_blocks`)."""
    return in_blocks(lambda block: hash_keys(block, max_key_bytes=max_key_bytes), keys, np.uint64)


def _shift_key_index(message: str, offset: int) -> str:
    """Rewrite "key 12 ..." in a block's error message to the key's index in the batch."""
    head, sep, rest = message.partition("key ")
    number, space, tail = rest.partition(" ")
    if sep and not head and number.isdigit():
        return f"key {int(number) + offset}{space}{tail}"
    return message


def plain_array(keys: np.ndarray) -> np.ndarray:
    """``keys`` as a plain array in native byte order, as both kernels read it.

    A masked array's data is used when nothing is masked; a masked entry has no key to
    route, so it is refused rather than hashed (the data under a mask is arbitrary).

    Raises
    ------
    KeyTypeError
        An entry of a masked array is masked.
    """
    if isinstance(keys, np.ma.MaskedArray):
        mask = np.ma.getmaskarray(keys).reshape(-1)
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            raise KeyTypeError(
                f"key {i} is masked (a NumPy masked array); a masked entry has no product "
                "ID to route: give the unmasked keys (masked_array.compressed())"
            )
        keys = np.ma.getdata(keys)
    if type(keys) is not np.ndarray:
        keys = np.asarray(keys)  # other subclasses (matrix, memmap): their data
    if keys.dtype.kind in "iuU" and not keys.dtype.isnative:
        keys = keys.astype(keys.dtype.newbyteorder("="))
    return keys


def hash_keys(keys: Any, *, max_key_bytes: int | None = None) -> np.ndarray:
    """XXH64 (seed 0) of every key of a batch.

    Parameters
    ----------
    keys
        A sequence or 1-D NumPy array of ``str`` (hashed as UTF-8), ``bytes``-like, or
        integers (hashed as their decimal string, so ``123`` and ``"123"`` hash alike).
        A single ``str``, ``bytes`` or ``int`` is treated as a batch of one. An integer is
        its stored value (a subclass's ``__index__``/``__int__`` does not count, for
        ``int`` or NumPy scalars), of any size; one too long is measured, not formatted.
    max_key_bytes
        If given, a key longer than this many bytes raises :class:`KeyTooLongError`.

    Returns
    -------
    numpy.ndarray
        ``uint64`` array, one hash per key, in order.

    Raises
    ------
    KeyTypeError
        A key is of another type (``bool``, ``float``, ``None``, ...), or a NumPy array
        has an unsupported dtype.
    KeyEncodingError
        A ``str`` key is not valid Unicode.
    KeyTooLongError
        A key is longer than ``max_key_bytes``.
    """
    tk = type(keys)
    if tk is list or tk is tuple:
        if len(keys) > 2 * BLOCK:
            out = _hash_long_str(keys, max_key_bytes)
            return _blocked(keys, max_key_bytes) if out is None else out
        return _hash_sequence(keys, max_key_bytes) if keys else np.empty(0, dtype=np.uint64)
    if isinstance(keys, (str, bytes, bytearray, memoryview, int, np.integer)):
        keys = [keys]
    if isinstance(keys, np.ndarray):
        keys = plain_array(keys)
        if keys.ndim != 1:
            keys = keys.reshape(-1) if keys.ndim == 0 else keys
            if keys.ndim != 1:
                raise KeyTypeError(f"keys must be a 1-D array, got shape {keys.shape}")
        if keys.size == 0:
            return np.empty(0, dtype=np.uint64)
        if keys.size > 2 * BLOCK:
            return _blocked(keys, max_key_bytes)
        kind = keys.dtype.kind
        if kind in "iu":
            return _hash_int_array(keys, max_key_bytes)
        if kind == "S":
            return _hash_fixed_bytes_array(keys, max_key_bytes)
        if kind == "U":
            return _hash_unicode_array(keys, max_key_bytes)
        if kind == "O" or kind == "T":
            return _hash_sequence(keys.tolist(), max_key_bytes)
        raise KeyTypeError(
            f"keys array has dtype {keys.dtype}; expected str (U/T), bytes (S), integer or object"
        )
    if isinstance(keys, (set, frozenset, dict)) or not hasattr(keys, "__iter__"):
        raise KeyTypeError(
            f"keys must be a key or an ordered sequence of keys, got {type(keys).__name__}"
            + (
                " (unordered: results could not be matched to keys)"
                if hasattr(keys, "__iter__")
                else ""
            )
        )
    if not isinstance(keys, Sequence):
        keys = list(keys)
    if len(keys) == 0:
        return np.empty(0, dtype=np.uint64)
    return _hash_sequence(keys, max_key_bytes)


# --------------------------------------------------------------------------------------
# Derived per-key values.

_FMIX_C1 = _U64(0xFF51AFD7ED558CCD)
_FMIX_C2 = _U64(0xC4CEB9FE1A85EC53)
_INV_2_53 = 1.0 / float(1 << 53)


_M64 = 0xFFFFFFFFFFFFFFFF


# fmix64's constants as 0-d arrays: a NumPy call with a scalar operand pays a conversion
# each time (~0.25 us of a ~0.35 us call at batch 100).
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
    # check, 2.5x the call on small batches. Module-level ufuncs with a positional
    # output: ~50 ns less per call than a keyword ``out=`` (a sixth of a call at 100).
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
    t = unit_threshold(share)
    if t == 0:
        return np.zeros(hashes.size, dtype=np.bool_)
    if t > _M64:
        return np.ones(hashes.size, dtype=np.bool_)
    return mix64(hashes, salt) < _U64(t)


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
