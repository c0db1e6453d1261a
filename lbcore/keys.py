"""Keys: what a product ID is, which bytes are hashed for it, and the reference hashing.

Skipper hashes keys with ``xxhash.Sum64String`` (XXH64, seed 0, over the UTF-8 bytes),
so cslb hashes exactly those bytes: a ``str`` as UTF-8, a ``bytes``-like key as is, an
integer as its decimal string (``123`` and ``"123"`` route alike). A batch is a list,
tuple or 1-D NumPy array of keys (a single key is a batch of one); :func:`batch_of`
normalises every batch for both kernels.

The rule for a bad batch, on both kernels: the batch as a whole is judged first (its
type, shape, dtype, masked entries), then the keys in order, and the first bad key
(wrong type, not Unicode, longer than the limit) is the one reported.
:func:`hash_each` is the rule applied key by key with the ``xxhash`` package: the
NumPy kernel's hashing and the reference the native kernel (``csrc/keys.c``) is
tested against.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xxhash

from lbcore.errors import ArgumentError, KeyEncodingError, KeyTooLongError, KeyTypeError

__all__ = [
    "MAX_KEY_BYTES",
    "batch_of",
    "check_key_length",
    "check_max_key_bytes",
    "decimal_key",
    "encode_key",
    "hash_each",
    "plain_array",
]

#: The longest key every cslb surface accepts, in bytes (UTF-8 for ``str`` keys).
MAX_KEY_BYTES = 4096

_xxh64 = xxhash.xxh64_intdigest

# Python formats an int of at most sys.get_int_max_str_digits() digits (640 at the least);
# ints of at most this many bits have at most 600 digits, so str() formats them whatever
# the setting. Longer ones are measured before they are formatted (see decimal_key).
_REPR_SAFE_BITS = 1993
_REPR_SAFE_DIGITS = 600

_MAX_CODE_POINT = 0x10FFFF


def check_max_key_bytes(max_key_bytes: Any) -> int | None:
    """Validate a key length limit: ``None`` (no limit) or an integer ``>= 0`` (bytes)."""
    if max_key_bytes is None:
        return None
    if (
        isinstance(max_key_bytes, bool)
        or not isinstance(max_key_bytes, (int, np.integer))
        or max_key_bytes < 0
    ):
        raise ArgumentError(f"max_key_bytes must be None or an integer >= 0, got {max_key_bytes!r}")
    return int(max_key_bytes)


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


def _too_long(i: int, length: int, max_key_bytes: int) -> KeyTooLongError:
    return KeyTooLongError(
        f"key {i} is {length} bytes long; keys may be at most {max_key_bytes} bytes"
    )


def check_key_length(length: int, i: int = 0, max_key_bytes: int | None = MAX_KEY_BYTES) -> None:
    """Raise unless a key of ``length`` bytes is within ``max_key_bytes`` (``None``: no limit).

    The one key-length rule and its message, for surfaces that measure keys before they
    hash them (request bodies, a client packing a body).

    Parameters
    ----------
    length
        The key's length in bytes (UTF-8 for ``str``, decimal digits for integers).
    i
        Position of the key in its batch, used in the message.
    max_key_bytes
        The limit in bytes.

    Raises
    ------
    KeyTooLongError
        ``length`` is over ``max_key_bytes``.
    """
    if max_key_bytes is not None and length > max_key_bytes:
        raise _too_long(i, length, max_key_bytes)


def _not_unicode(i: int, what: str, j: int) -> KeyEncodingError:
    return KeyEncodingError(
        f"key {i} is not valid Unicode and cannot be encoded as UTF-8: {what} at character {j}"
    )


def encode_key(key: Any, i: int = 0, max_key_bytes: int | None = None) -> bytes:
    """Return the bytes that are hashed for one key.

    Parameters
    ----------
    key
        ``str`` (UTF-8), ``bytes``-like, or an integer (decimal string, ``-`` for negatives).
    i
        Position of the key in its batch, used in error messages.
    max_key_bytes
        If given, a key longer than this many bytes raises :class:`KeyTooLongError`.

    Raises
    ------
    KeyTypeError
        For ``bool``, ``float``, ``None`` and every other type.
    KeyEncodingError
        For a ``str`` that is not valid Unicode (a lone surrogate).
    KeyTooLongError
        For a key longer than ``max_key_bytes``.

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
            data = str.encode(key, "utf-8")
        except UnicodeEncodeError as exc:
            raise _not_unicode(i, exc.reason, exc.start) from None
    elif isinstance(key, (bytes, bytearray, memoryview)):
        # Through the buffer: bytes() would call a subclass's __bytes__ instead.
        data = memoryview(key).tobytes()
    elif isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        text = decimal_key(_int_value(key), max_key_bytes)
        if isinstance(text, int):  # measured, not formatted
            raise _too_long(i, text, max_key_bytes or 0)
        data = text
    else:
        raise KeyTypeError(
            f"key {i} has type {type(key).__name__}; expected str, bytes or int "
            "(a product ID: str is hashed as UTF-8, int as its decimal string)"
        )
    check_key_length(len(data), i, max_key_bytes)
    return data


def _ucs4_key(codes: np.ndarray, i: int) -> str:
    """Key ``i`` of a ``U`` array from its code points, trailing NULs dropped (NumPy's padding).

    Raw UCS4 data (a buffer viewed as ``U``) may hold values beyond U+10FFFF, which no
    ``str`` can: the first such value or surrogate is named, with ``str.encode``'s words
    for a surrogate.
    """
    row = codes.tolist()
    while row and row[-1] == 0:
        row.pop()
    for j, c in enumerate(row):
        if c > _MAX_CODE_POINT:
            raise _not_unicode(i, f"code point 0x{c:X} beyond U+10FFFF", j)
        if 0xD800 <= c <= 0xDFFF:
            raise _not_unicode(i, "surrogates not allowed", j)
    return "".join(map(chr, row))


def hash_each(keys: Any, max_key_bytes: int | None = None) -> np.ndarray:
    """XXH64 (seed 0) of every key of a batch, one key at a time: the reference.

    The NumPy kernel's :func:`lbcore.hash_keys`; same arguments (``max_key_bytes``
    already checked by :func:`check_max_key_bytes`), same results and errors.
    """
    batch, kind = batch_of(keys)
    out = np.empty(len(batch), dtype=np.uint64)
    if kind is not None and kind[0] == "U":
        codes = batch.view(np.uint32).reshape(len(batch), -1)
        for i in range(len(batch)):
            out[i] = _xxh64(encode_key(_ucs4_key(codes[i], i), i, max_key_bytes))
        return out
    items = batch if kind is None else batch.tolist()  # S: tolist drops the NUL padding
    for i, key in enumerate(items):
        out[i] = _xxh64(encode_key(key, i, max_key_bytes))
    return out


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
    return keys


_ARRAY_KINDS = {"i": "i", "u": "u", "S": "S", "U": "U"}
_SINGLE = (str, bytes, bytearray, memoryview, int, np.integer)


def batch_of(keys: Any) -> tuple[Any, tuple[str, int] | None]:
    """A batch as the kernels take it: ``(list_or_tuple, None)`` or ``(array, (kind, itemsize))``.

    Arrays of integers, ``S`` and ``U`` come back 1-D, C-contiguous, non-empty and in
    native byte order; other arrays (object, StringDType, empty ones) as lists.

    Raises
    ------
    KeyTypeError
        Not a key or an ordered sequence of keys, a multi-dimensional array, an array of
        an unsupported dtype, or a masked entry.
    """
    tk = type(keys)
    if tk is list or tk is tuple:
        return keys, None
    if isinstance(keys, _SINGLE):
        return [keys], None
    if isinstance(keys, np.ndarray):
        keys = plain_array(keys)
        if keys.ndim != 1:
            keys = keys.reshape(-1) if keys.ndim == 0 else keys
            if keys.ndim != 1:
                raise KeyTypeError(f"keys must be a 1-D array, got shape {keys.shape}")
        kind = keys.dtype.kind
        code = _ARRAY_KINDS.get(kind)
        if code is not None and keys.dtype.itemsize and keys.size:
            if not keys.dtype.isnative:
                keys = keys.astype(keys.dtype.newbyteorder("="))
            return np.ascontiguousarray(keys), (code, keys.dtype.itemsize)
        if code is not None or kind in "OT":
            return keys.tolist(), None
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
    return list(keys), None
