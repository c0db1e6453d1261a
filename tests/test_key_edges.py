"""Keys at the edges of what the kernels accept: both must answer alike, exception and all.

Raw UCS4 beyond U+10FFFF in a U array, NumPy integer scalars whose subclass overrides
``__index__``, and integers too long for Python's own decimal conversion.
"""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

import lbcore

# A batch of a few hundred keys, the bad one last.
LONG = 515


def raw_unicode(rows: list[list[int]], width: int) -> np.ndarray:
    """A U array straight from code point values (NumPy does not validate a buffer)."""
    flat = [c for r in rows for c in (r + [0] * (width - len(r)))]
    return np.frombuffer(np.array(flat, dtype="<u4").tobytes(), dtype=f"<U{width}")


@pytest.mark.parametrize("n", [1, LONG])
@pytest.mark.parametrize("value", [0x110000, 0xFFFFFFFF])
def test_a_code_point_beyond_unicode_in_a_u_array_is_named(kernel, n, value):
    rows = [[ord("a"), ord("b")]] * (n - 1) + [[ord("x"), value]]
    with pytest.raises(
        lbcore.KeyEncodingError,
        match=f"key {n - 1} is not valid Unicode .*code point 0x{value:X} beyond U\\+10FFFF "
        "at character 1$",
    ):
        lbcore.hash_keys(raw_unicode(rows, 3), max_key_bytes=4096)


@pytest.mark.parametrize("n", [2, LONG])
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


class OverridingInt64(np.int64):
    """A NumPy scalar whose subclass claims another value: its stored value is the key."""

    def __index__(self) -> int:
        return 7

    def __int__(self) -> int:
        return 8


class OverridingInt(int):
    def __index__(self) -> int:
        return 7

    def __int__(self) -> int:
        return 8


def h(text: str | bytes) -> int:
    return xxhash.xxh64_intdigest(text.encode() if isinstance(text, str) else text)


@pytest.mark.parametrize("n", [1, LONG])
@pytest.mark.parametrize(
    "key", [OverridingInt64(5), OverridingInt(5), np.uint16(5), np.int8(5), np.int64(5)]
)
def test_integer_scalars_route_by_their_stored_value(kernel, n, key):
    keys = ["5"] * (n - 1) + [key]
    assert lbcore.hash_keys(keys).tolist() == [h("5")] * n
    assert lbcore.hash_keys(key).tolist() == [h("5")]
    assert lbcore.hash_keys([key, "x"]).tolist() == [h("5"), h("x")]


LIMIT = lbcore.MAX_KEY_BYTES


def test_the_limit_is_4096_bytes():
    assert LIMIT == 4096


@pytest.mark.parametrize("n", [1, LONG])
def test_an_int_exactly_the_limit_long_routes_and_one_digit_more_is_too_long(kernel, n):
    fits = [10 ** (LIMIT - 1), -(10 ** (LIMIT - 2)), 2 * 10 ** (LIMIT - 1) - 1]
    for key in fits:
        assert len(str(key)) == LIMIT
        keys = ["a"] * (n - 1) + [key]
        assert lbcore.hash_keys(keys, max_key_bytes=LIMIT).tolist()[-1] == h(str(key))
    for key in (10**LIMIT, -(10 ** (LIMIT - 1))):
        keys = ["a"] * (n - 1) + [key]
        with pytest.raises(
            lbcore.KeyTooLongError,
            match=rf"^key {n - 1} is {LIMIT + 1} bytes long; keys may be at most {LIMIT} bytes$",
        ):
            lbcore.hash_keys(keys, max_key_bytes=LIMIT)


@pytest.mark.parametrize("n", [1, LONG])
@pytest.mark.parametrize("digits", [4301, 5001, 200_001])
def test_an_int_beyond_pythons_digit_limit_is_too_long_not_a_value_error(kernel, n, digits):
    keys = ["a"] * (n - 1) + [-(10 ** (digits - 1)), 10 ** (digits - 1)]
    with pytest.raises(
        lbcore.KeyTooLongError,
        match=rf"^key {n - 1} is {digits + 1} bytes long; keys may be at most {LIMIT} bytes$",
    ):
        lbcore.hash_keys(keys, max_key_bytes=LIMIT)
    with pytest.raises(lbcore.KeyTypeError, match=f"key {n - 1} has type NoneType"):
        lbcore.hash_keys([*keys[:-2], None, *keys[-2:]], max_key_bytes=LIMIT)  # the first wins


def test_without_a_limit_an_int_of_any_length_is_its_decimal_string(kernel):
    keys = [10**5000, -(10**5000) + 1, OverridingInt(10**4400)]
    assert lbcore.hash_keys(keys).tolist() == [
        h("1" + "0" * 5000),
        h("-" + "9" * 5000),
        h("1" + "0" * 4400),
    ]


def test_pythons_digit_limit_setting_does_not_change_a_key(kernel):
    import sys

    key = 3**1500  # 716 digits: fine by default, beyond a limit of 640
    expected = h(str(key))
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        assert lbcore.hash_keys([key, "x"], max_key_bytes=LIMIT).tolist() == [expected, h("x")]
        assert lbcore.hash_keys([key]).tolist() == [expected]
    finally:
        sys.set_int_max_str_digits(old)
