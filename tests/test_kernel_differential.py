"""Differential test: the native kernel and the NumPy reference on random plans and keys.

Random ring sets (1-2,000 endpoints, up to two fading rings), ejected masks, gates,
fade modes, loads, balance factors and hop caps; random batches of every accepted key
type. Both kernels must give the same indices, counts, exceptions and counter cells.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lbcore
from lbcore import Gate, Plan, RingSet
from tests.kernel_harness import on

pytestmark = pytest.mark.skipif(
    lbcore.kernel.load_native() is None,
    reason="needs the native kernel",
)

D = 30_000_000_000


class ClaimingInt64(np.int64):
    """A NumPy scalar whose subclass claims another value: the stored one is the key."""

    def __index__(self) -> int:
        return 7


class LyingStr(str):
    """A str whose encode() claims other bytes: the characters are the key."""

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"not the key"


class LyingBytes(bytes):
    """Bytes whose __bytes__ claims other bytes: the stored bytes are the key."""

    def __bytes__(self) -> bytes:
        return b"not the key"


class LyingByteArray(bytearray):
    def __bytes__(self) -> bytes:
        return b"not the key"


LIMIT = 4096  # lbcore.MAX_KEY_BYTES; plans draw it as their max_key_bytes

text = st.text(st.characters(codec="utf-8"), max_size=20) | st.sampled_from(
    ["", "\0", "a\0b", "\0\0", "ürün-42", "😀", "\U0010ffff\0", "x" * 4096, "y" * 4097]
)
blob = st.binary(max_size=20) | st.sampled_from([b"", b"\0", b"a\0", b"\xff" * 4096, b"z" * 4097])
# Ints at every width, beyond 2**64, at the limit's boundary (4,096 digits routes, 4,097
# is too long, negatives with their sign), beyond Python's 4,300-digit conversion limit.
# (Built by map: Hypothesis reprs sampled values, and Python cannot repr 10**5000.)
huge = st.sampled_from(
    [(1, LIMIT - 1), (-1, LIMIT - 2), (1, LIMIT), (-1, LIMIT - 1), (1, 5000), (-1, 5000), (7, 0)]
).map(lambda sd: sd[0] * 10 ** sd[1] if sd[1] else 3**2000)
integer = (
    st.integers(min_value=-(2**63), max_value=2**65)
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, -(2**64)])
    | huge
)
key = (
    text
    | blob
    | integer
    | blob.map(bytearray)
    | blob.map(memoryview)
    | blob.filter(lambda b: len(b) >= 2).map(lambda b: memoryview(b)[::2])  # not contiguous
    | integer.filter(lambda v: 0 <= v < 2**64).map(np.uint64)
    | st.integers(-(2**31), 2**31 - 1).map(np.int32)
    | st.integers(-(2**63), 2**63 - 1).map(ClaimingInt64)
    | text.map(LyingStr)
    | blob.map(LyingBytes)
    | blob.map(LyingByteArray)
)
bad = st.sampled_from([1.5, None, True, np.bool_(True), "\ud800", "a\udfff", object()])
INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def int_array(draw, dtype, n):
    info = np.iinfo(dtype)
    edges = st.sampled_from([int(info.min), int(info.max), 0, -1 if info.min < 0 else 1])
    vals = draw(st.lists(st.integers(int(info.min), int(info.max)) | edges, min_size=n, max_size=n))
    return np.array(vals, dtype=dtype)


@st.composite
def batches(draw):
    kinds = ["list", "tuple", "ints", "S", "U", "raw-U", "T", "object", "mixed-bad"]
    kinds += ["big-endian", "masked"]
    kind = draw(st.sampled_from(kinds))
    n = draw(st.integers(0, 40))
    if kind in ("list", "tuple"):
        ks = draw(st.lists(key, min_size=n, max_size=n))
        return ks if kind == "list" else tuple(ks)
    if kind == "mixed-bad":
        ks = draw(st.lists(key, min_size=n, max_size=n))
        ks.insert(draw(st.integers(0, n)), draw(bad))
        return ks
    if kind == "ints":
        return int_array(draw, draw(st.sampled_from(INT_DTYPES)), n)
    if kind == "S":
        return np.array(draw(st.lists(st.binary(max_size=12), min_size=n, max_size=n)), dtype="S12")
    if kind == "object":
        ks = draw(st.lists(key | bad, min_size=n, max_size=n))
        arr = np.empty(n, dtype=object)
        arr[:] = ks
        return arr
    strings = st.lists(
        text | st.text(st.characters(codec="utf-8"), max_size=8), min_size=n, max_size=n
    )
    if kind == "raw-U":  # code points straight into a U buffer: surrogates, beyond U+10FFFF
        codes = st.integers(0, 0x10FFFF) | st.sampled_from([0, 0xD800, 0xDFFF, 0x110000, 2**32 - 1])
        rows = draw(st.lists(st.lists(codes, min_size=3, max_size=3), min_size=n, max_size=n))
        flat = np.array([c for r in rows for c in r], dtype="<u4")
        return np.frombuffer(flat.tobytes(), dtype="<U3")
    if kind == "T":  # StringDType: variable-width UTF-8 strings, NULs kept
        return np.array(draw(strings), dtype=np.dtypes.StringDType())
    if kind == "big-endian":  # the same keys in the other byte order: U and integers
        if draw(st.booleans()):
            arr = int_array(draw, draw(st.sampled_from(INT_DTYPES)), n)
        else:
            arr = np.array(draw(strings), dtype="U8") if n else np.array([], "U1")
        return arr.astype(arr.dtype.newbyteorder(">" if arr.dtype.isnative else "<"))
    if kind == "masked":  # masked arrays: routed when nothing is masked, refused else
        if draw(st.booleans()):
            base = int_array(draw, np.int64, n)
        else:
            base = np.array(draw(strings), dtype="U8") if n else np.array([], "U1")
        mask = draw(st.lists(st.booleans(), min_size=n, max_size=n)) if draw(
            st.booleans()
        ) else False
        return np.ma.array(base, mask=mask)
    return (
        np.array(draw(strings), dtype="U8" if draw(st.booleans()) else None)
        if n
        else np.array([], "U1")
    )


@st.composite
def plans(draw):
    n = draw(st.integers(1, 2000))
    vnodes = draw(st.integers(1, max(1, min(100, 20_000 // n))))
    eps = [f"http://10.{i // 60000}.{(i // 250) % 240}.{i % 250}:{8080 + i % 3}" for i in range(n)]
    cuts = sorted(draw(st.lists(st.integers(1, n), max_size=2)))
    parts = [0, *cuts, n]
    rs = RingSet(eps[: parts[1]] or eps[:1], duration_ns=D, vnodes=vnodes)
    start = 0
    for a, b in itertools.pairwise(parts[1:]):
        start += draw(st.integers(0, D))
        rs = rs.scale_up(eps[max(a, 1) : b], start)
    n = len(rs.endpoints)
    now = start + draw(st.integers(-D, 2 * D))
    ejected = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=np.bool_)
    if draw(st.booleans()):
        ejected[:] = False
    hot = draw(st.floats(0, 1000, allow_nan=False))
    loads = np.array(draw(st.lists(st.floats(0, 50, allow_nan=False), min_size=n, max_size=n)))
    loads[: draw(st.integers(0, n))] += hot
    gate = Gate(
        enabled=draw(st.booleans()) or draw(st.booleans()),
        percentage=draw(st.sampled_from([100.0, 0.0]) | st.floats(0, 100)),
    )
    bf = draw(st.none() | st.floats(1.0, 3.0))
    return {
        "ring_set": rs,
        "now_ns": now,
        "ejected": ejected,
        "loads": loads,
        "balance_factor": bf,
        "max_hops": draw(st.none() | st.integers(1, 20)),
        "gate": gate,
        "fade_mode": draw(st.sampled_from(["n-ring", "skipper", "off"])),
        "slots": np.arange(n, dtype=np.int64)[::-1].copy(),
        "max_key_bytes": draw(st.sampled_from([4096, None, 5])),
    }


KEY_ERRORS = (lbcore.KeyTypeError, lbcore.KeyEncodingError, lbcore.KeyTooLongError)


def routed_and_recorded(args, keys, attempt):
    plan = Plan(**args)
    idx, fallbacks, moves, valid = plan.route(keys, attempt=attempt)
    slots, where = plan.counter_slots(idx)
    row = np.zeros(3 * len(plan.slots) + 8, dtype=np.int64)
    offsets = np.array([0, len(plan.slots), 2 * len(plan.slots)], dtype=np.int64)
    lbcore.scatter_add(row, slots, np.array([1, 7, -2], dtype=np.int64), offsets)
    # The tracker's one call: the same cells from the routed indices and the slot map.
    mapped = np.zeros_like(row)
    calls = lbcore.scatter_add_routed(mapped, plan.slots, idx, (1, 7, -2), tuple(offsets.tolist()))
    assert calls == slots.size and mapped.tolist() == row.tolist()
    return (
        idx.tolist(),
        fallbacks,
        moves,
        valid,
        None if where is None else where.tolist(),
        row.tolist(),
    )


@st.composite
def routed_fan_outs(draw):
    """A slot map (sometimes with bad slots), routed indices (sometimes bad), a row."""
    eps = draw(st.integers(0, 300))
    cols = draw(st.integers(1, 400))
    slot_map = np.array(
        draw(st.lists(st.integers(-2, cols + 2), min_size=eps, max_size=eps)), dtype=np.int64
    )
    if draw(st.booleans()):
        slot_map = np.clip(slot_map, 0, cols - 1)
    n = draw(st.integers(0, 2000))
    hi = max(eps, 1) + (2 if draw(st.integers(0, 4)) == 0 else 0)
    few = draw(st.integers(1, hi))  # many calls over few endpoints, at times
    idx = np.array(draw(st.lists(st.integers(-1, few - 1), min_size=0, max_size=40)), np.int64)
    idx = np.resize(idx, n) if idx.size else np.full(n, -1, np.int64)
    if draw(st.integers(0, 8)) == 0 and n:
        idx[draw(st.integers(0, n - 1))] = draw(st.sampled_from([-2, eps, 2**40]))
    idx = idx.astype(draw(st.sampled_from([np.int32, np.int64])))
    k = draw(st.integers(1, 6))
    buckets = draw(st.integers(1, 4))
    offsets = tuple(
        draw(st.integers(-1 if draw(st.integers(0, 9)) == 0 else 0, buckets * cols))
        for _ in range(k)
    )
    values = draw(
        st.integers(-5, 5)
        | st.tuples(*[st.integers(-(2**40), 2**40)] * k)
        | st.tuples(*[st.integers(-3, 3)] * draw(st.integers(1, 7)))
    )
    return slot_map, idx, values, offsets, (buckets + 1) * cols


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(routed_fan_outs())
def test_native_and_numpy_scatter_add_routed_alike(fan_out):
    slot_map, idx, values, offsets, cells = fan_out

    def recorded():
        row = np.zeros(cells, dtype=np.int64)
        try:
            n = lbcore.scatter_add_routed(row, slot_map, idx, values, offsets)
        except Exception as exc:
            assert not row.any()  # nothing added on a refusal
            raise exc
        return n, row.tolist()

    assert on("native", recorded) == on("numpy", recorded)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(plans(), batches(), st.integers(0, 3))
def test_native_and_numpy_route_alike(args, keys, attempt):
    native = on("native", lambda: routed_and_recorded(args, keys, attempt))
    reference = on("numpy", lambda: routed_and_recorded(args, keys, attempt))
    assert native == reference
    if native[0] == "error":  # agreeing is not enough: a bad key is named as one
        assert issubclass(native[1], KEY_ERRORS), native


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(), st.integers(0, 2))
def test_native_and_numpy_agree_on_every_position(args, attempt):
    def every_position():
        plan = Plan(**args)
        answer, moved = plan.answers()
        if plan.closed:
            return answer.tolist(), moved.tolist(), []
        h = plan.newest.hashes.copy()  # keys exactly on ring points, and just past them
        h2 = h + np.uint64(1)
        return (
            answer.tolist(),
            moved.tolist(),
            plan.route_hashes(np.concatenate((h, h2)), attempt)[0].tolist(),
        )

    assert on("native", every_position) == on("numpy", every_position)


# The kinds the kernels once disagreed on, each pinned once besides the drawn batches.
PINNED = {
    "big-endian U": np.array(["abc", "de", ""], dtype=">U3"),
    "big-endian ints": np.array([1, -2, 2**40], dtype=">i8"),
    "str subclass": [LyingStr("abc"), "de"],
    "bytes subclass": [LyingBytes(b"abc"), LyingByteArray(b"de")],
    "object array of subclasses": np.array([LyingStr("abc"), LyingBytes(b"x")], dtype=object),
    "masked, none masked": np.ma.array(["abc", "de"]),
    "masked U": np.ma.array(["abc", "de"], mask=[False, True]),
    "masked ints": np.ma.array([1, 2, 3], mask=[True, False, False]),
    "long masked": np.ma.array(
        [f"k{i}" for i in range(5000)], mask=[i == 4321 for i in range(5000)]
    ),
}


@pytest.mark.parametrize("name", list(PINNED))
def test_pinned_kinds_get_the_same_answer_or_the_same_error(name):
    keys = PINNED[name]

    ring = lbcore.Ring(["http://10.0.0.1:80", "http://10.0.0.2:80"])

    def both():
        return lbcore.hash_keys(keys).tolist(), ring.lookup(keys).tolist()

    native = on("native", both)
    reference = on("numpy", both)
    assert native == reference
    if "masked" in name and name != "masked, none masked":
        assert native[0] == "error" and issubclass(native[1], KEY_ERRORS)
        assert "is masked" in native[2]
    else:
        assert native[0] != "error"
    if name == "str subclass":  # the characters, not what encode() claims
        assert native[0][0] == lbcore.hash_keys(["abc"]).tolist()[0]
