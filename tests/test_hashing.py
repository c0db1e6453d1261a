import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import lbcore
from lbcore.draws import unit_interval

# A batch of a few hundred keys: hypothesis' short examples repeated.
LONG = 529


def ref(k):
    if isinstance(k, str):
        k = k.encode("utf-8")
    elif isinstance(k, int):
        k = str(k).encode()
    return xxhash.xxh64_intdigest(k)


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=1024)
blobs = st.binary(max_size=1024)
ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(text, max_size=40))
def test_str_keys_match_xxhash(keys):
    assert lbcore.hash_keys(keys).tolist() == [ref(k) for k in keys]


@settings(max_examples=300, deadline=None)
@given(st.lists(blobs, max_size=40))
def test_bytes_keys_match_xxhash_including_nul_bytes(keys):
    assert lbcore.hash_keys(keys).tolist() == [ref(k) for k in keys]


@settings(max_examples=300, deadline=None)
@given(st.lists(ints, max_size=40))
def test_int_keys_hash_as_decimal_strings(keys):
    assert lbcore.hash_keys(keys).tolist() == [ref(str(k)) for k in keys]


def resampled(keys, seed):
    """A batch of LONG keys drawn from ``keys`` with repeats (seeded)."""
    rng = np.random.default_rng(seed)
    return [keys[i] for i in rng.integers(0, len(keys), LONG)]


@settings(max_examples=60, deadline=None)
@given(st.lists(text, min_size=1, max_size=30), st.integers(0, 3))
def test_long_str_batches_and_object_arrays_match(keys, seed):
    batch = resampled(keys, seed)
    assert lbcore.hash_keys(batch).tolist() == [ref(k) for k in batch]
    as_array = np.array(batch, dtype=object)
    assert lbcore.hash_keys(as_array).tolist() == [ref(k) for k in batch]


@settings(max_examples=60, deadline=None)
@given(st.lists(blobs, min_size=1, max_size=30), st.integers(0, 3))
def test_long_bytes_batches_match(keys, seed):
    batch = resampled(keys, seed)
    assert lbcore.hash_keys(batch).tolist() == [ref(k) for k in batch]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=30), st.integers(0, 3))
def test_long_int_batches_and_int64_arrays_match(keys, seed):
    rng = np.random.default_rng(seed)
    batch = [keys[i] for i in rng.integers(0, len(keys), LONG)]
    want = [ref(str(k)) for k in batch]
    assert lbcore.hash_keys(batch).tolist() == want
    assert lbcore.hash_keys(np.array(batch, dtype=np.int64)).tolist() == want


def test_uint64_extremes_and_mixed_int_lengths(kernel):
    vals = np.array([0, 1, 9, 10, 99, 100, 2**63, 2**64 - 1] * 100, dtype=np.uint64)
    assert lbcore.hash_keys(vals).tolist() == [ref(str(int(v))) for v in vals]
    neg = np.array([-(2**63), -1, -10, 0, 7] * 120, dtype=np.int64)
    assert lbcore.hash_keys(neg).tolist() == [ref(str(int(v))) for v in neg]


@pytest.mark.parametrize("n", [1, 3, LONG, 3000])
def test_numpy_string_arrays(kernel, n):
    rng = np.random.default_rng(n)
    keys = [
        "".join(rng.choice(list("ABCDEF0123-"), size=int(rng.integers(0, 40)))) for _ in range(n)
    ]
    want = [ref(k) for k in keys]
    assert lbcore.hash_keys(np.array(keys)).tolist() == want
    assert lbcore.hash_keys(np.array([k.encode() for k in keys], dtype="S")).tolist() == want
    assert lbcore.hash_keys(np.array(keys, dtype=np.dtypes.StringDType())).tolist() == want


def test_non_ascii_unicode_array(kernel):
    keys = ["ürün-42", "商品", "é", "e\u0301", "\u200b", "🙂"] * 100
    assert lbcore.hash_keys(np.array(keys)).tolist() == [ref(k) for k in keys]


def test_keys_with_newlines_and_long_keys(kernel):
    keys = ["a\nb", "line\n", "", "x" * 4096] * 200
    assert lbcore.hash_keys(keys).tolist() == [ref(k) for k in keys]


def test_123_and_str_123_route_alike(kernel):
    assert lbcore.hash_keys([123]).tolist() == lbcore.hash_keys(["123"]).tolist()
    assert lbcore.hash_keys(np.array([123])).tolist() == lbcore.hash_keys([b"123"]).tolist()


def test_scalar_key_is_a_batch_of_one(kernel):
    assert lbcore.hash_keys("abc").tolist() == [ref("abc")]
    assert lbcore.hash_keys(5).tolist() == [ref("5")]


@pytest.mark.parametrize("bad", [1.5, None, True, object(), [1], {"a": 1}])
@pytest.mark.parametrize("n", [3, LONG])
def test_unsupported_key_types_name_the_key(kernel, bad, n):
    for base in ("abc", 7, b"abc"):
        keys = [base] * n
        keys[1] = bad
        with pytest.raises(lbcore.KeyTypeError, match="key 1 has type"):
            lbcore.hash_keys(keys)


def test_bool_array_and_float_array_rejected(kernel):
    with pytest.raises(lbcore.KeyTypeError, match="dtype"):
        lbcore.hash_keys(np.array([1.0, 2.0]))
    with pytest.raises(lbcore.KeyTypeError, match="dtype"):
        lbcore.hash_keys(np.array([True]))


@pytest.mark.parametrize("n", [2, LONG])
def test_lone_surrogate_is_a_clear_error(kernel, n):
    keys = ["ok"] * n
    keys[-1] = "bad\ud800"
    with pytest.raises(lbcore.KeyEncodingError, match=f"key {n - 1} is not valid Unicode"):
        lbcore.hash_keys(keys)


@pytest.mark.parametrize("n", [2, LONG])
def test_max_key_bytes(kernel, n):
    keys = ["k"] * n
    keys[1] = "é" * 2049  # 4098 UTF-8 bytes
    with pytest.raises(lbcore.KeyTooLongError, match="key 1 is 4098 bytes long"):
        lbcore.hash_keys(keys, max_key_bytes=lbcore.MAX_KEY_BYTES)
    keys[1] = "é" * 2048
    assert lbcore.hash_keys(keys, max_key_bytes=lbcore.MAX_KEY_BYTES).size == n


def test_empty_batch(kernel):
    assert lbcore.hash_keys([]).dtype == np.uint64 and lbcore.hash_keys([]).size == 0
    assert lbcore.hash_keys(np.array([], dtype="U1")).size == 0


def test_unit_interval_is_uniform_and_salted():
    h = lbcore.hash_keys([f"SKU-{i}" for i in range(200_000)])
    u = unit_interval(h, 1)
    v = unit_interval(h, 2)
    assert u.min() >= 0.0 and u.max() < 1.0
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(counts - 20_000) < 1_000)
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.01
    # Independent of the ring position (the raw hash order).
    assert abs(np.corrcoef(u, h.astype(np.float64))[0, 1]) < 0.01


def test_below_equals_the_float_comparison_exactly():
    from lbcore.draws import below, unit_threshold

    h = lbcore.hash_keys(np.arange(200_000))
    u = unit_interval(h, 77)
    for share in (0.0, 1e-9, 0.003, 0.17677669529663687, 0.5, 0.768, 1 - 1e-16, 1.0):
        assert np.array_equal(below(h, 77, share), u < share), share
    # At the boundary: a u exactly equal to the share is not below it.
    x = float(u[123])
    assert not below(h[123:124], 77, x)[0] and below(h[123:124], 77, np.nextafter(x, 2))[0]
    assert unit_threshold(0.0) == 0 and unit_threshold(1.0) == 1 << 64


def test_a_long_batch_names_a_bad_key_by_its_index_in_the_batch(kernel):
    n = 70_000
    keys = [f"B{i}" for i in range(n)]
    assert lbcore.hash_keys(keys).tolist() == [ref(k) for k in keys]
    ids = np.arange(n, dtype=np.int64) * 7
    assert lbcore.hash_keys(ids)[-5:].tolist() == [ref(str(int(v))) for v in ids[-5:]]
    keys[n - 7] = None
    with pytest.raises(lbcore.KeyTypeError, match=f"key {n - 7} has type NoneType"):
        lbcore.hash_keys(keys)


def test_max_key_bytes_counts_utf8_bytes(kernel):
    # The encoded length decides (4-byte, 2-byte and 1-byte code points).
    lim = 4096
    ok = ["\U0001f600" * 1024, "ü" * 2048, "a" * 4096, "k"]
    np.testing.assert_array_equal(lbcore.hash_keys(ok, max_key_bytes=lim), lbcore.hash_keys(ok))
    for bad in (["k", "ü" * 2049], ["k", "\U0001f600" * 1025], ["k", "a" * 4097]):
        with pytest.raises(lbcore.KeyTooLongError, match="key 1 is"):
            lbcore.hash_keys(bad, max_key_bytes=lim)
    with pytest.raises(lbcore.KeyTooLongError):
        lbcore.hash_keys(["k", b"x" * 5000], max_key_bytes=lim)
    with pytest.raises(lbcore.KeyTypeError):
        lbcore.hash_keys(["k", 1.5], max_key_bytes=lim)
    # A batch whose UTF-8 fits the limit altogether, and one key that cannot encode.
    small = [f"SKU-{i:09d}" for i in range(300)]
    np.testing.assert_array_equal(
        lbcore.hash_keys(small, max_key_bytes=lim), lbcore.hash_keys(small)
    )
    with pytest.raises(lbcore.KeyEncodingError):
        lbcore.hash_keys(["k", "a\udc80"], max_key_bytes=lim)


@pytest.mark.parametrize("n", [600, 3000])
def test_long_bytes_batches_match_xxhash(kernel, n):
    import xxhash

    rng = np.random.default_rng(n)
    same = [f"SKU{int(v)}".encode() for v in rng.integers(10**9, 10**10, n)]
    mixed = [bytes(rng.integers(0, 256, int(k), dtype=np.uint8)) for k in rng.integers(0, 40, n)]
    for keys in (same, mixed, [*same[:-2], b"with\nnewline", bytearray(b"ba")]):
        want = [xxhash.xxh64_intdigest(bytes(k)) for k in keys]
        assert lbcore.hash_keys(keys).tolist() == want
    with pytest.raises(lbcore.KeyTypeError, match=f"key {n} has type float"):
        lbcore.hash_keys([*same, 1.5])
    with pytest.raises(lbcore.KeyTooLongError):
        lbcore.hash_keys([*same[:-1], b"x" * 5000], max_key_bytes=4096)


@pytest.mark.parametrize("n", [1, LONG])
@pytest.mark.parametrize("limit", [None, lbcore.MAX_KEY_BYTES])
def test_numpy_integer_scalars_after_bytes_hash_as_decimal_strings(kernel, n, limit):
    # NumPy integer scalars export a buffer: a list starting with bytes once hashed their
    # raw 8 bytes (or failed on len()) instead of their decimal string.
    keys = [b"", np.uint64(0), np.int64(-5), bytearray(b"q"), np.int32(7)] * n
    want = [xxhash.xxh64_intdigest(k) for k in [b"", b"0", b"-5", b"q", b"7"] * n]
    assert lbcore.hash_keys(keys, max_key_bytes=limit).tolist() == want
