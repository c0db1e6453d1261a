"""Keys at the edges of what the kernels accept: both must answer alike, exception and all.

Raw UCS4 beyond U+10FFFF in a U array, NumPy integer scalars whose subclass overrides
``__index__``, and integers too long for Python's own decimal conversion.
"""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

import lbcore
from lbcore.hashing import VECTOR_MIN_BATCH


def raw_unicode(rows: list[list[int]], width: int) -> np.ndarray:
    """A U array straight from code point values (NumPy does not validate a buffer)."""
    flat = [c for r in rows for c in (r + [0] * (width - len(r)))]
    return np.frombuffer(np.array(flat, dtype="<u4").tobytes(), dtype=f"<U{width}")


@pytest.mark.parametrize("n", [1, VECTOR_MIN_BATCH + 3])
@pytest.mark.parametrize("value", [0x110000, 0xFFFFFFFF])
def test_a_code_point_beyond_unicode_in_a_u_array_is_named(kernel, n, value):
    rows = [[ord("a"), ord("b")]] * (n - 1) + [[ord("x"), value]]
    with pytest.raises(
        lbcore.KeyEncodingError,
        match=f"key {n - 1} is not valid Unicode .*code point 0x{value:X} beyond U\\+10FFFF "
        "at character 1$",
    ):
        lbcore.hash_keys(raw_unicode(rows, 3), max_key_bytes=4096)


@pytest.mark.parametrize("n", [2, VECTOR_MIN_BATCH + 3])
def test_the_first_bad_key_of_a_u_array_wins_surrogate_or_beyond(kernel, n):
    rows = [[ord("a")]] * n
    rows[0] = [ord("a"), 0xD800]  # a lone surrogate first, then a value beyond Unicode
    rows[1] = [0x110000]
    with pytest.raises(
        lbcore.KeyEncodingError, match=r"key 0 .*surrogates not allowed at character 1$"
    ):
        lbcore.hash_keys(raw_unicode(rows, 2))
    rows[0], rows[1] = rows[1], [ord("b"), ord("c"), 0xDFFF]
    with pytest.raises(
        lbcore.KeyEncodingError, match=r"key 0 .*code point 0x110000 .*character 0$"
    ):
        lbcore.hash_keys(raw_unicode(rows, 3))


def test_the_largest_code_point_is_still_a_key(kernel):
    keys = raw_unicode([[0x10FFFF, ord("z")]], 2)
    assert lbcore.hash_keys(keys).tolist() == [xxhash.xxh64_intdigest("\U0010ffffz".encode())]
