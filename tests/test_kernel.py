"""The two kernels: which one runs, XXH64 from the spec, key hashing and scatter_add parity."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xxhash

import lbcore
from lbcore import kernel as lbkernel
from lbcore.keys import encode_key, hash_each
from lbcore.knobs import KERNEL, docs_table

ROOT = Path(__file__).parents[1]


def run_python(code: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "CSLB_KERNEL"}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_this_install_routes_on_the_native_kernel():
    """The project's own install must have built the kernel (CI builds it too)."""
    if os.environ.get("CSLB_KERNEL") == "numpy":
        assert lbcore.kernel_name() == "numpy"
    else:
        assert lbcore.kernel_name() == "native", lbkernel.native_unavailable()


def test_cslb_kernel_is_read_at_import():
    code = "import lbcore; print(lbcore.kernel_name())"
    assert run_python(code, CSLB_KERNEL="numpy").stdout.strip() == "numpy"
    assert run_python(code, CSLB_KERNEL="native").stdout.strip() == "native"
    auto = run_python(code)
    assert auto.stdout.strip() == "native" and "RuntimeWarning" not in auto.stderr
    bad = run_python(code, CSLB_KERNEL="fast")
    assert (
        bad.returncode != 0 and "CSLB_KERNEL" in bad.stderr and "auto, native, numpy" in bad.stderr
    )


def test_a_missing_extension_warns_once_under_auto_and_fails_under_native():
    # The extension made unloadable from the inside: importing it raises.
    code = """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "lbcore._kernel":
                    raise ImportError("no compiler was there")
        sys.meta_path.insert(0, Block())
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import lbcore
        print(lbcore.kernel_name(), len(w), w[0].message if w else "")
        print(lbcore.Plan(lbcore.RingSet(["http://a:1", "http://b:1"]), 0).route(["k"])[0])
    """
    auto = run_python(code)
    assert auto.returncode == 0, auto.stderr
    first = auto.stdout.splitlines()[0]
    assert first.startswith("numpy 1 ") and "no compiler was there" in first
    native = run_python(
        code.replace(
            "import warnings", 'import os; os.environ["CSLB_KERNEL"] = "native"; import warnings'
        )
    )
    assert native.returncode != 0 and "CSLB_KERNEL=native" in native.stderr


def import_lbcore_copy(tmp_path: Path, so: bytes | None, **env: str):
    """Import a copy of lbcore without the checkout's build (``so``: a file in its place)."""
    import shutil

    shutil.copytree(
        ROOT / "lbcore", tmp_path / "lbcore", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    if so is not None:
        (tmp_path / "lbcore" / "_kernel.cpython-311-x86_64-linux-gnu.so").write_bytes(so)
    code = f"""
        import sys
        # This venv's editable install would find the checkout's lbcore first.
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import lbcore
        assert lbcore.__file__.startswith({str(tmp_path)!r}), lbcore.__file__
        print(lbcore.kernel_name())
        for m in w:
            print(m.category.__name__, m.message)
    """
    return run_python(code, cwd=tmp_path, PYTHONPATH=str(tmp_path), **env)


def test_an_extension_never_built_is_named_as_such(tmp_path):
    auto = import_lbcore_copy(tmp_path, None)
    assert auto.returncode == 0, auto.stderr
    assert auto.stdout.splitlines() == [
        "numpy",
        "RuntimeWarning lbcore: lbcore._kernel was not built (no working C compiler when "
        "installing?): routing on the NumPy kernel (same answers, slower; build with a C "
        "compiler, or set CSLB_KERNEL=numpy to silence this)",
    ]
    native = import_lbcore_copy(tmp_path / "again", None, CSLB_KERNEL="native")
    assert native.returncode != 0
    assert native.stderr.strip().splitlines()[-1] == (
        "ImportError: CSLB_KERNEL=native but lbcore's native kernel cannot load: "
        "lbcore._kernel was not built (no working C compiler when installing?)"
    )
    quiet = import_lbcore_copy(tmp_path / "numpy", None, CSLB_KERNEL="numpy")
    assert quiet.returncode == 0 and quiet.stdout.splitlines() == ["numpy"], quiet.stderr


def test_an_extension_that_fails_to_load_is_named_by_its_import_error(tmp_path):
    auto = import_lbcore_copy(tmp_path, b"not a shared object")
    assert auto.returncode == 0, auto.stderr
    name, warning = auto.stdout.splitlines()
    assert name == "numpy"
    assert warning.startswith("RuntimeWarning lbcore: native kernel not available (ImportError: ")
    assert "_kernel.cpython-311-x86_64-linux-gnu.so" in warning and "not built" not in warning


def test_use_kernel_switches_in_process_and_says_why_not():
    old = lbcore.use_kernel("numpy")
    try:
        assert lbcore.kernel_name() == "numpy"
        assert lbcore.Plan(lbcore.RingSet(["http://a:1"]), 0).kernel == "numpy"
        with pytest.raises(lbcore.ArgumentError, match="'native' or 'numpy'"):
            lbcore.use_kernel("c")
    finally:
        lbcore.use_kernel(old)


def test_the_kernel_knob_is_declared_and_documented():
    assert KERNEL.env == "CSLB_KERNEL" and KERNEL.default == "auto"
    assert KERNEL.convert("NumPy", "test") == "numpy"
    settings = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert docs_table((KERNEL,)) in settings


# ---------------------------------------------------------------------------------------
# XXH64 written from the specification.


def test_xxh64_matches_the_xxhash_package_on_every_length_and_many_inputs():
    native = lbkernel.load_native()
    rng = np.random.default_rng(64)
    for length in [*range(0, 130), 255, 256, 1000, 4095, 4096, 4097, 65537]:
        for _ in range(6):
            data = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
            assert native.xxh64(data) == xxhash.xxh64_intdigest(data), length
    for special in (b"", b"\0", b"\0" * 31, b"\xff" * 32, "ürün-42".encode(), b"a" * 64):
        assert native.xxh64(special) == xxhash.xxh64_intdigest(special)


# ---------------------------------------------------------------------------------------
# Keys: the same hashes and the same errors on both kernels.

KEY_BATCHES = [
    ["AD112G0AB-K11", "", "\0", "ürün-42", "日本語", "😀", "e\u0301", " \n\t", "x" * 4096],
    [b"AD112G0AB", b"", b"\0\0", b"\xff\xfe", bytearray(b"ba"), memoryview(b"mv")],
    [0, 1, -1, 123, -(2**63), 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**30, -(10**40)],
    [np.int64(5), np.uint64(2**64 - 1), np.int8(-3), np.uint16(7)],
    ["123", 123, b"123"],
    ("a", "b", "c"),
    np.array([1, -2, 3_000_000_000_000], dtype=np.int64),
    np.array([0, 2**64 - 1, 2**63], dtype=np.uint64),
    np.array([-128, 5, 127], dtype=np.int8),
    np.array([1, 2], dtype=">i8"),
    np.array([b"ab", b"c\0d", b"", b"\0"], dtype="S4"),
    np.array(["ab", "ürün", "", "日本"], dtype="U5"),
    np.array(["a", 1, b"b"], dtype=object),
    np.array([[1, 2], [3, 4]], dtype=np.int64)[:, 0],
    np.arange(12, dtype=np.int64)[::3],
    np.array(7),
    "single",
    b"single",
    12345,
    range(5),
    (k for k in ["gen", "erator"]),
    [],
    np.array([], dtype=np.int64),
]


@pytest.mark.parametrize("keys", KEY_BATCHES, ids=lambda k: type(k).__name__)
def test_hash_keys_equals_the_numpy_reference(kernel, keys):
    if type(keys).__name__ == "generator":
        keys = list(keys)
    want = hash_each(keys)
    got = lbcore.hash_keys(keys)
    assert got.dtype == np.uint64 and got.tolist() == want.tolist()
    if isinstance(keys, (list, tuple)):
        assert got.tolist() == [xxhash.xxh64_intdigest(encode_key(k)) for k in keys]


def test_integers_and_their_decimal_strings_hash_alike(kernel):
    values = [0, 7, -7, 10**12, 2**63 - 1, -(2**63), 2**64 - 1, 2**70, -(2**70)]
    as_text = [str(v) for v in values]
    assert lbcore.hash_keys(values).tolist() == lbcore.hash_keys(as_text).tolist()
    rng = np.random.default_rng(7)
    for dtype in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"):
        info = np.iinfo(dtype)
        arr = rng.integers(info.min, info.max, 500, dtype=dtype, endpoint=True)
        arr[:2] = (info.min, info.max)
        assert lbcore.hash_keys(arr).tolist() == hash_each([str(v) for v in arr.tolist()]).tolist()


BAD_BATCHES = [
    ([1.5], None),
    (["ok", None], None),
    ([True], None),
    ([np.bool_(True)], None),
    (["a\ud800b"], None),
    (["fine", "\udfff"], None),
    (["x" * 10, 2.0], 4),
    (["x" * 10, "y" * 3, "z" * 11], 4),
    ([b"x" * 5], 4),
    ([10**30], 10),
    (np.array([10**15, 1], dtype=np.int64), 10),
    (np.array([b"abcdef"], dtype="S8"), 3),
    (np.array(["\ud800"], dtype="U2"), None),
    (np.array([1.5]), None),
    (np.array([True]), None),
    (np.zeros((2, 2), dtype=np.int64), None),
    ({"a", "b"}, None),
    ({"a": 1}, None),
    (3.5, None),
    (None, None),
]


@pytest.mark.parametrize(("keys", "limit"), BAD_BATCHES, ids=lambda x: repr(x)[:30])
def test_bad_keys_raise_the_same_error_as_the_reference(kernel, keys, limit):
    with pytest.raises(Exception) as want:
        hash_each(keys, limit)
    with pytest.raises(type(want.value)) as got:
        lbcore.hash_keys(keys, max_key_bytes=limit)
    assert str(got.value) == str(want.value)
    assert isinstance(got.value, lbcore.LBCoreError)


@pytest.mark.parametrize("n", [3, 70_000])
def test_the_first_bad_key_in_key_order_is_reported(kernel, n):
    # Whatever its kind: a key too long before a key of a bad type is the one named, and
    # the other way round; in a list, a tuple and an array alike.
    keys = [f"k{i:06d}" for i in range(n)]
    too_long, bad_type = ("y" * 50, 1.5)
    for first, second, error in (
        (too_long, bad_type, lbcore.KeyTooLongError),
        (bad_type, too_long, lbcore.KeyTypeError),
        ("a\ud800", too_long, lbcore.KeyEncodingError),
        (too_long, "a\ud800", lbcore.KeyTooLongError),
    ):
        batch = list(keys)
        batch[n // 2], batch[-1] = first, second
        for b in (batch, tuple(batch)):
            with pytest.raises(error, match=f"^key {n // 2} "):
                lbcore.hash_keys(b, max_key_bytes=20)
    ids = np.arange(n, dtype=np.int64)
    ids[n // 2], ids[-1] = 10**15, -(10**16)
    with pytest.raises(lbcore.KeyTooLongError, match=f"^key {n // 2} is 16 bytes long"):
        lbcore.hash_keys(ids, max_key_bytes=10)
    text = np.array(keys, dtype="U60")
    text[n // 2], text[-1] = "z" * 30, "\ud800"
    with pytest.raises(lbcore.KeyTooLongError, match=f"^key {n // 2} is 30 bytes long"):
        lbcore.hash_keys(text, max_key_bytes=20)
    ok = [f"k{i:06d}" for i in range(n)]
    assert lbcore.hash_keys(ok).tolist() == hash_each(ok).tolist()


def test_a_list_changed_while_it_is_hashed_is_an_error_not_a_crash(monkeypatch):
    if lbcore.kernel_name() != "native":
        pytest.skip("native kernel only")
    keys: list = []
    decimal_key = lbcore.keys.decimal_key

    def sneaky(value, limit):  # Python code the kernel runs for a huge int empties the batch
        keys.clear()
        return decimal_key(value, limit)

    monkeypatch.setattr(lbcore.keys, "decimal_key", sneaky)
    huge = 10**700
    keys.extend([huge, "a", "b", "c"])
    with pytest.raises(RuntimeError, match="changed size"):
        lbcore.hash_keys(keys)
    keys.extend([huge, "a"])
    plan = lbcore.Plan(lbcore.RingSet(["http://a:1", "http://b:1"]), 0)
    with pytest.raises(RuntimeError, match="changed size"):
        plan.route(keys)


# ---------------------------------------------------------------------------------------
# scatter_add: the recording primitive.


def test_scatter_add_parity_on_random_fan_outs(kernel):
    rng = np.random.default_rng(11)
    for _ in range(200):
        cells = int(rng.integers(1, 300))
        n = int(rng.integers(0, 40))
        k = int(rng.integers(1, 5))
        target = rng.integers(-1000, 1000, cells).astype(np.int64)
        offsets = rng.integers(0, max(1, cells // 2), k).astype(np.int64)
        index = rng.integers(0, max(1, cells - int(offsets.max())), n).astype(np.int64)
        shape = int(rng.integers(0, 3))
        values: object = (
            int(rng.integers(-5, 5))
            if shape == 0
            else rng.integers(-9, 9, k).astype(np.int64)
            if shape == 1
            else rng.integers(-9, 9, k * n).astype(np.int64)
        )
        want = target.copy()
        vals = (
            np.full((k, n), values)
            if shape == 0
            else np.repeat(np.asarray(values)[:, None], n, 1)
            if shape == 1
            else np.asarray(values).reshape(k, n)
        )
        np.add.at(want, (offsets[:, None] + index[None, :]).ravel(), vals.ravel())
        if rng.random() < 0.5 and k * max(n, 1) <= 16:  # the few values and offsets as tuples
            as_tuple = values if shape == 0 else tuple(np.asarray(values).tolist())
            lbcore.scatter_add(target, index, as_tuple, tuple(offsets.tolist()))
        else:
            lbcore.scatter_add(target, index, values, offsets)
        assert target.tolist() == want.tolist()
    row = np.zeros(10, dtype=np.int64)
    lbcore.scatter_add(
        row, np.array([1, 1, 3], dtype=np.int64), np.array([5, 6, 7], dtype=np.int64)
    )
    assert row.tolist() == [0, 11, 0, 7, 0, 0, 0, 0, 0, 0]


def test_scatter_add_of_many_calls_over_few_slots_adds_the_same(kernel):
    """A long fan-out (calls far more than slots, one value per offset) is added per slot
    by the native kernel: the same sums as per call, wrapping included."""
    rng = np.random.default_rng(4)
    for n, slots, k in ((10_000, 7, 2), (5_000, 300, 6), (100, 40, 3), (65, 1, 2), (3, 1, 6)):
        target = rng.integers(-(2**62), 2**62, 2000).astype(np.int64)
        index = rng.integers(0, slots, n).astype(np.int64)
        offsets = np.sort(rng.choice(1600, k, replace=False)).astype(np.int64)
        for values in (int(rng.integers(-50, 50)), rng.integers(-(2**61), 2**61, k)):
            want = target.copy()
            vals = np.broadcast_to(np.asarray(values, np.int64).reshape(-1, 1), (k, n))
            with np.errstate(over="ignore"):
                np.add.at(want, (offsets[:, None] + index[None, :]).ravel(), vals.ravel())
            arg = values if isinstance(values, int) else tuple(values.tolist())
            lbcore.scatter_add(target, index, arg, tuple(offsets.tolist()))
            assert target.tolist() == want.tolist(), (n, slots, k)


@pytest.mark.parametrize(
    ("target", "index", "values", "offsets"),
    [
        (np.zeros(4, np.int64), np.array([4], np.int64), 1, None),
        (np.zeros(4, np.int64), np.array([0, -1], np.int64), 1, None),
        (np.zeros(4, np.int64), np.array([1], np.int64), 1, np.array([3], np.int64)),
        (np.zeros(4, np.int64), np.array([0], np.int64), 1, np.array([-1], np.int64)),
        (np.zeros(4, np.int64), np.array([0, 1], np.int64), np.array([1, 2, 3], np.int64), None),
        (np.zeros(4, np.int32), np.array([0], np.int64), 1, None),
        (np.zeros(4, np.int64), np.array([0], np.int32), 1, None),
        (np.zeros(8, np.int64)[::2], np.array([0], np.int64), 1, None),
        (np.zeros(4, np.int64), np.array([0], np.int64), 1.5, None),
        (np.zeros(4, np.int64), np.array([0], np.int64), True, None),
        ([0, 0], np.array([0], np.int64), 1, None),
        (np.zeros(4, np.int64), np.array([0], np.int64), (1, True), (0, 1)),
        (np.zeros(4, np.int64), np.array([0], np.int64), (1.5,), None),
        (np.zeros(4, np.int64), np.array([0], np.int64), 1, (0, 2**63)),
        (np.zeros(40, np.int64), np.array([0], np.int64), 1, tuple(range(17))),
        (np.zeros(4, np.int64), np.array([1], np.int64), (1,), (3,)),
    ],
)
def test_scatter_add_refuses_bad_input_alike_and_adds_nothing(
    kernel, target, index, values, offsets
):
    other = "numpy" if kernel == "native" else "native"
    before = None if isinstance(target, list) else target.copy()
    with pytest.raises((IndexError, TypeError, ValueError, OverflowError)) as got:
        lbcore.scatter_add(target, index, values, offsets)
    if before is not None:
        assert target.tolist() == before.tolist()
    old = lbcore.use_kernel(other)
    try:
        with pytest.raises(type(got.value)) as ref:
            lbcore.scatter_add(target, index, values, offsets)
    finally:
        lbcore.use_kernel(old)
    assert str(got.value) == str(ref.value)


@pytest.mark.parametrize(
    ("slot_map", "endpoints", "values", "offsets", "match"),
    [
        ([0, 1, 2], np.array([0, 3], np.int32), 1, None, r"endpoint 3 at position 1 .* -1\.\.2"),
        ([0, 1, 2], np.array([-2], np.int64), 1, None, "endpoint -2"),
        ([0, 1, 9], np.array([2, 0], np.int32), 1, None, "cell 9"),
        ([0, -1, 2], np.array([1], np.int32), 1, None, "slot -1"),
        ([0, 1, 2], np.array([1], np.int32), (1, 1), (0, 8), "cell 9"),
        ([0, 1, 2], np.array([1], np.int32), (1, 1), (0,), "2 values for 1 offset"),
        ([0, 1, 2], np.array([1], np.uint32), 1, None, "int32 or int64"),
        ([0, 1, 2], [1], 1, None, "int32 or int64"),
    ],
)
def test_scatter_add_routed_refuses_bad_input_alike_and_adds_nothing(
    kernel, slot_map, endpoints, values, offsets, match
):
    target = np.zeros(9, np.int64)
    m = np.array(slot_map, np.int64)
    with pytest.raises((IndexError, TypeError, ValueError)) as got:
        lbcore.scatter_add_routed(target, m, endpoints, values, offsets)
    assert not target.any()
    assert re.search(match, str(got.value)), got.value
    other = "numpy" if kernel == "native" else "native"
    old = lbcore.use_kernel(other)
    try:
        with pytest.raises(type(got.value), match=re.escape(str(got.value))):
            lbcore.scatter_add_routed(target, m, endpoints, values, offsets)
    finally:
        lbcore.use_kernel(old)


def test_scatter_add_routed_maps_and_skips_fallbacks(kernel):
    target = np.zeros(12, np.int64)
    m = np.array([5, 0, 3], np.int64)
    # Many calls over few slots (the per-slot count path) and a few (the plain path).
    many = np.tile(np.array([2, -1, 0, 0], np.int32), 50)
    assert lbcore.scatter_add_routed(target, m, many, (1, 10), (0, 6)) == 150
    assert lbcore.scatter_add_routed(target, m, np.array([1, -1], np.int64), 4) == 1
    assert target.tolist() == [4, 0, 0, 50, 0, 100, 0, 0, 0, 500, 0, 1000]


def test_scatter_add_refuses_a_read_only_row(kernel):
    row = np.zeros(4, np.int64)
    row.flags.writeable = False
    with pytest.raises(TypeError, match="writable"):
        lbcore.scatter_add(row, np.array([0], np.int64), 1)


@pytest.mark.slow
def test_a_build_without_a_compiler_installs_and_routes_on_the_numpy_kernel(tmp_path):
    """What a user without gcc gets: the install succeeds, lbcore warns once and routes."""
    import shutil

    copy = tmp_path / "src"
    copy.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(
        ROOT / "lbcore", copy / "lbcore", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CSLB_KERNEL", "LD_PRELOAD")}
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=copy,
        env={**env, "CC": "/bin/false"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    assert 'building extension "lbcore._kernel" failed' in build.stdout + build.stderr
    assert not list((copy / "lbcore").glob("_kernel*.so"))
    use = subprocess.run(
        [
            sys.executable,
            "-W",
            "default",
            "-c",
            # (This venv's editable install would find the checkout's build: only the
            # copy's lbcore, which has none, may be imported.)
            "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
            "if 'editable' not in repr(f).lower()]; "
            "import lbcore; print(lbcore.kernel_name()); "
            "rs = lbcore.RingSet(['http://10.0.0.1:80', 'http://10.0.0.2:80']); "
            "print(lbcore.Plan(rs, 0).route(['SKU-1', 5, b'x'])[0].tolist())",
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert use.returncode == 0, use.stderr
    name, answer = use.stdout.splitlines()
    assert name == "numpy"
    assert use.stderr.count(lbkernel.NOT_BUILT + ": routing on the NumPy kernel") == 1
    want = lbcore.Plan(lbcore.RingSet(["http://10.0.0.1:80", "http://10.0.0.2:80"]), 0)
    assert answer == str(want.route(["SKU-1", 5, b"x"])[0].tolist())
