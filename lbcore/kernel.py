"""Choosing and calling lbcore's kernel: the compiled C extension or the NumPy reference.

Both kernels answer the same questions bit for bit — hash a batch of keys, route it on
a :class:`lbcore.plan.Plan`, add a fan-out to a counter row — and are tested against
each other. The native one (``lbcore._kernel``, C99 built by ``pip install`` where a C
compiler works) is what a worker runs; the NumPy one (:mod:`lbcore.numpy_kernel` and
:mod:`lbcore.hashing`) is the reference and the fallback where nothing was compiled.

Which one runs is the :data:`lbcore.knobs.KERNEL` setting ``CSLB_KERNEL``, read here
once when lbcore is imported (the one exception to "lbcore reads no environment"):
``auto`` (default) the native kernel if it loads, else NumPy with one
:class:`RuntimeWarning` naming why; ``native`` raises :class:`ImportError` at import if
it cannot load; ``numpy`` never loads it. :func:`use_kernel` switches in-process (tests
run every parity test on both kernels that way); a plan routes on the kernel that was
active when it was built.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from types import ModuleType
from typing import Any

import numpy as np

from lbcore import hashing
from lbcore.errors import ArgumentError, KeyTypeError
from lbcore.knobs import KERNEL

__all__ = [
    "add_calls",
    "batch_of",
    "hash_keys",
    "kernel_name",
    "native",
    "scatter_add",
    "scatter_add_routed",
    "select_kernel",
    "use_kernel",
]

#: The native module's interface version this Python code drives (``LB_ABI`` in kernel.h).
ABI = 3

#: Why the native kernel is not used where no extension module was built.
NOT_BUILT = "lbcore._kernel was not built (no working C compiler when installing?)"

_native: ModuleType | None = None
_native_error: str | None = None
_active = "numpy"


def _load_native() -> ModuleType | None:
    """The extension module, loaded once; ``None`` (and the reason kept) if it cannot load."""
    global _native, _native_error
    if _native is None and _native_error is None:
        try:
            # A missing module must be told apart first: importing it while lbcore is
            # half imported would blame a circular import.
            if importlib.util.find_spec("lbcore._kernel") is None:
                _native_error = NOT_BUILT
                return None
            from lbcore import _kernel
        except ImportError as exc:
            _native_error = f"native kernel not available ({type(exc).__name__}: {exc})"
        else:
            abi = getattr(_kernel, "ABI", None)
            if abi != ABI:  # built from other sources: a stale in-place build
                _native_error = (
                    f"lbcore/_kernel was built from other sources (interface {abi}, this "
                    f"lbcore needs {ABI}); reinstall cslb to rebuild it"
                )
            else:
                _kernel.configure(batch_of)
                _native = _kernel
    return _native


def kernel_name() -> str:
    """The kernel routing in this process: ``"native"`` or ``"numpy"``."""
    return _active


def native() -> ModuleType | None:
    """The native extension module while it is the active kernel, else ``None``."""
    return _native if _active == "native" else None


def use_kernel(name: str) -> str:
    """Switch this process to kernel ``name`` (``"native"`` or ``"numpy"``); returns the old one.

    Plans built afterwards route on it (plans already built keep theirs); hashing and
    :func:`scatter_add` switch at once.

    Raises
    ------
    ArgumentError
        An unknown name, or ``"native"`` when the extension cannot load (the message
        says why).
    """
    global _active
    if name not in ("native", "numpy"):
        raise ArgumentError(f"kernel must be 'native' or 'numpy', got {name!r}")
    if name == "native" and _load_native() is None:
        raise ArgumentError(f"the native kernel cannot be loaded: {_native_error}")
    old, _active = _active, name
    return old


def select_kernel(choice: str, *, stacklevel: int = 2) -> str:
    """Make the kernel a ``CSLB_KERNEL`` value names active, as lbcore's import does.

    ``"auto"``: the native kernel if it loads, else NumPy with one
    :class:`RuntimeWarning` naming why; ``"native"``: the native kernel or
    :class:`ImportError`; ``"numpy"``: NumPy. For a command's ``--kernel`` flag (the
    commands put the value into ``CSLB_KERNEL`` as well, for the processes they start).
    Returns the kernel now active (:func:`kernel_name`).

    Raises
    ------
    lbcore.KnobError
        Not one of ``auto``, ``native``, ``numpy``.
    ImportError
        ``"native"`` and the extension cannot load (the message says why).
    """
    choice = KERNEL.convert(choice, KERNEL.env)
    if choice == "numpy":
        use_kernel("numpy")
    elif _load_native() is not None:
        use_kernel("native")
    elif choice == "native":
        raise ImportError(
            f"CSLB_KERNEL=native but lbcore's native kernel cannot load: {_native_error}"
        )
    else:
        use_kernel("numpy")
        warnings.warn(
            f"lbcore: {_native_error}: routing on the NumPy kernel (same answers, slower; "
            "build with a C compiler, or set CSLB_KERNEL=numpy to silence this)",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
    return _active


def _select_at_import() -> None:
    choice = KERNEL.convert(os.environ.get(KERNEL.env, KERNEL.default), "environment")
    select_kernel(choice, stacklevel=3)


# --------------------------------------------------------------------------------------
# Batches.

_ARRAY_KINDS = {"i": "i", "u": "u", "S": "S", "U": "U"}
_SINGLE = (str, bytes, bytearray, memoryview, int, np.integer)


def batch_of(keys: Any) -> tuple[Any, tuple[str, int] | None]:
    """A batch as the kernels take it: ``(list_or_tuple, None)`` or ``(array, (kind, itemsize))``.

    Arrays come back 1-D, C-contiguous and in native byte order; object and StringDType
    arrays as lists. The same checks and errors as :func:`lbcore.hashing.hash_keys`.

    Raises
    ------
    KeyTypeError
        Not a key or an ordered sequence of keys, a multi-dimensional array, or an array
        of an unsupported dtype.
    """
    tk = type(keys)
    if tk is list or tk is tuple:
        return keys, None
    if isinstance(keys, _SINGLE):
        return [keys], None
    if isinstance(keys, np.ndarray):
        keys = hashing.plain_array(keys)
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


def check_max_key_bytes(max_key_bytes: Any) -> int | None:
    """Validate a key length limit: ``None`` (no limit) or an integer ``>= 0``."""
    if max_key_bytes is None:
        return None
    if (
        isinstance(max_key_bytes, bool)
        or not isinstance(max_key_bytes, (int, np.integer))
        or max_key_bytes < 0
    ):
        raise ArgumentError(f"max_key_bytes must be None or an integer >= 0, got {max_key_bytes!r}")
    return int(max_key_bytes)


def check_attempt(attempt: Any) -> int:
    """Validate a retry number: a non-negative ``int`` or NumPy integer (not a ``bool``)."""
    if isinstance(attempt, bool) or not isinstance(attempt, (int, np.integer)) or attempt < 0:
        raise ArgumentError(f"attempt must be a non-negative integer, got {attempt!r}")
    return int(attempt)


def hash_keys(keys: Any, *, max_key_bytes: int | None = None) -> np.ndarray:
    """XXH64 (seed 0) of every key of a batch, on the active kernel.

    Exactly :func:`lbcore.hashing.hash_keys` (the NumPy reference): same keys accepted,
    same hashes, same exceptions and messages.

    Parameters
    ----------
    keys
        A batch of ``str`` (UTF-8), ``bytes``-like or integer keys (decimal string), a
        list, tuple or 1-D array; a single key is a batch of one.
    max_key_bytes
        If given, a key longer than this many bytes raises :class:`lbcore.KeyTooLongError`.

    Returns
    -------
    numpy.ndarray
        ``uint64`` hash per key.
    """
    limit = check_max_key_bytes(max_key_bytes)
    k = _native if _active == "native" else None
    if k is None:
        return hashing.hash_keys(keys, max_key_bytes=limit)
    return k.hash_keys(keys, None, -1 if limit is None else limit)


# --------------------------------------------------------------------------------------
# Recording.

_I64 = np.dtype(np.int64)
_I32 = np.dtype(np.int32)


def _i64(a: Any, name: str, *, writable: bool = False) -> np.ndarray:
    # (The native kernel's checks, in its order: array, layout and writability, dtype.)
    if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
        raise TypeError(f"scatter_add: {name} must be a contiguous int64 array")
    if writable and not a.flags.writeable:
        raise TypeError(f"scatter_add: {name} must be writable")
    if a.dtype != _I64:
        raise TypeError(f"scatter_add: {name} must be a contiguous int64 array")
    return a.reshape(-1)


_MAX_TUPLE = 16  # offsets or values given as a tuple: at most this many (MAX_TUPLE in C)
_I64_RANGE = (-(1 << 63), (1 << 63) - 1)


def _i64s(a: Any, name: str) -> np.ndarray:
    """An ``int64`` array or a tuple of ints, checked as the native kernel checks them."""
    if type(a) is not tuple:
        return _i64(a, name)
    if len(a) > _MAX_TUPLE:
        raise ValueError(f"scatter_add: {name} as a tuple holds at most {_MAX_TUPLE} ints")
    for x in a:
        if not isinstance(x, int) or isinstance(x, bool):
            raise TypeError(f"scatter_add: {name} must be a contiguous int64 array")
        if not _I64_RANGE[0] <= x <= _I64_RANGE[1]:
            raise OverflowError("int too big to convert")
    return np.array(a, dtype=np.int64)


def scatter_add(target: np.ndarray, index: np.ndarray, values: Any, offsets: Any = None) -> None:
    """``target[offsets[r] + index[j]] += value(r, j)`` for every offset and index.

    The primitive shm's counter rows record calls with: ``target`` is a row (a
    contiguous ``int64`` view, often shared memory that other processes read), ``index``
    the calls' counter slots, ``offsets`` the fields' word offsets in the row.

    Parameters
    ----------
    target
        Writable, C-contiguous ``int64`` array (viewed flat).
    index
        C-contiguous ``int64`` array of ``n`` indices (repeats add up).
    values
        An ``int`` for every cell, or a C-contiguous ``int64`` array (or a tuple of at
        most 16 ints): ``k`` values (one per offset, with ``offsets``) or ``k * n``
        (offset-major).
    offsets
        Optional ``k`` offsets, a C-contiguous ``int64`` array or a tuple of at most 16
        ints; default one offset, 0. (Arguments are positional: the native kernel parses
        no keywords, a recorder calls it once per fan-out start and end.)

    Raises
    ------
    TypeError
        An argument of another dtype or layout.
    ValueError
        The number of values fits none of the shapes.
    IndexError
        A cell outside ``target``; nothing is added then.

    Notes
    -----
    Native: each cell is one atomic load and store ordered by release fences (correct
    on arm64 as on x86-64), with the GIL held throughout; the caller must be the row's
    only writer (shm's one-writer-per-row rule, threads serialized by its lock).
    """
    k = _native if _active == "native" else None
    if k is not None:
        k.scatter_add(target, index, values, offsets)
        return
    t = _i64(target, "target", writable=True)
    idx = _i64(index, "index")
    scalar = isinstance(values, int) and not isinstance(values, bool)
    v = np.array([int(values)], dtype=np.int64) if scalar else _i64s(values, "values")
    offs = np.zeros(1, dtype=np.int64) if offsets is None else _i64s(offsets, "offsets")
    n, rows = idx.size, offs.size
    if scalar:
        vals = np.full((rows, n), v[0], dtype=np.int64)
    elif offsets is not None and v.size == rows:
        vals = np.repeat(v[:, None], n, axis=1)
    elif v.size == rows * n:
        vals = v.reshape(rows, n)
    else:
        raise ValueError(
            f"scatter_add: {v.size} values for {n} indices and {rows} offset(s); expected "
            "one, one per offset or one per (offset, index)"
        )
    cells = (offs[:, None] + idx[None, :]).reshape(rows, n)
    bad = (offs[:, None] < 0) | (idx[None, :] < 0) | (cells < 0) | (cells >= t.size)
    if bad.any():
        r, j = (int(x[0]) for x in np.nonzero(bad))
        raise IndexError(
            f"scatter_add: index {int(cells[r, j])} (offset {int(offs[r])} + {int(idx[j])} at "
            f"position {j}) is outside the target's {t.size} cells; nothing was added"
        )
    np.add.at(t, cells.ravel(), vals.ravel())


def _endpoints(a: Any) -> np.ndarray:
    if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or a.dtype not in (_I32, _I64):
        raise TypeError("scatter_add_routed: endpoints must be a contiguous int32 or int64 array")
    return a.reshape(-1)


def scatter_add_routed(
    target: np.ndarray,
    slot_map: np.ndarray,
    endpoints: np.ndarray,
    values: Any,
    offsets: Any = None,
) -> int:
    """``target[offsets[r] + slot_map[e]] += values[r]`` for each routed endpoint ``e``.

    A fan-out's start or end in one call: ``endpoints`` as :meth:`lbcore.Plan.route`
    returned them (``-1``: fallback, skipped), mapped to counter slots through
    ``slot_map`` (a plan's :attr:`~lbcore.Plan.slots`), every cell checked before the
    first is written (as :func:`scatter_add`).

    Parameters
    ----------
    target
        Writable, C-contiguous ``int64`` array (viewed flat).
    slot_map
        C-contiguous ``int64`` array: the counter slot of each endpoint.
    endpoints
        C-contiguous ``int32`` or ``int64`` array, each in ``-1 .. len(slot_map) - 1``.
    values
        An ``int`` for every cell, or one per offset (a tuple of at most 16 ints or an
        ``int64`` array).
    offsets
        Optional offsets, as for :func:`scatter_add`.

    Returns
    -------
    int
        The routed calls (entries ``>= 0``) added.

    Raises
    ------
    TypeError
        An argument of another dtype or layout.
    ValueError
        Not one value, or one per offset.
    IndexError
        An endpoint outside the map, or a cell outside ``target``; nothing is added then.
    """
    k = _native if _active == "native" else None
    if k is not None:
        return k.scatter_add_routed(target, slot_map, endpoints, values, offsets)
    t = _i64(target, "target", writable=True)
    m = _i64(slot_map, "slot_map")
    e = _endpoints(endpoints)
    scalar = isinstance(values, int) and not isinstance(values, bool)
    v = np.array([int(values)], dtype=np.int64) if scalar else _i64s(values, "values")
    offs = np.zeros(1, dtype=np.int64) if offsets is None else _i64s(offsets, "offsets")
    if not scalar and v.size != offs.size:
        raise ValueError(
            f"scatter_add_routed: {v.size} values for {offs.size} offset(s); expected one, "
            "or one per offset"
        )
    bad = np.flatnonzero((e < -1) | (e >= m.size))
    if bad.size:
        j = int(bad[0])
        raise IndexError(
            f"scatter_add_routed: endpoint {int(e[j])} at position {j} is not in "
            f"-1..{m.size - 1}; nothing was added"
        )
    s = m[e[e >= 0]]
    if s.size:
        lo, hi = min(int(s.min()), 0), int(s.max())
        for off in offs.tolist():
            if not (lo >= 0 and off >= 0 and hi < t.size and off < t.size - hi):
                bad_slot = lo if lo < 0 else hi
                raise IndexError(
                    f"scatter_add_routed: cell {off + bad_slot} (offset {off} + slot "
                    f"{bad_slot}) is outside the target's {t.size} cells; nothing was added"
                )
        vals = np.broadcast_to(v if not scalar else v[:1], offs.shape)
        for off, val in zip(offs.tolist(), vals.tolist(), strict=True):
            np.add.at(t, off + s, val)
    return int(s.size)


def scatter_adder_routed() -> Any:
    """The active kernel's :func:`scatter_add_routed` itself (as :func:`scatter_adder`)."""
    k = _native if _active == "native" else None
    return scatter_add_routed if k is None else k.scatter_add_routed


_TIME_LIMIT = 1 << 62  # call times in 0 .. 2**62 ns (TIME_LIMIT in calls.c)
_GEOMETRY = 16


def _int(x: Any, what: str) -> int:
    if not isinstance(x, int):
        raise TypeError(f"add_calls: {what} must be ints")
    if not _I64_RANGE[0] <= x <= _I64_RANGE[1]:
        raise OverflowError("int too big to convert")
    return int(x)


def add_calls(
    target: np.ndarray,
    ended: list[int],
    done: list[int],
    starts: dict[tuple[int, int], int],
    geometry: tuple[int, ...],
) -> None:
    """A batching recorder's step: many calls' ends, then their starts, added to a row.

    shm's :meth:`shm.Recorder.record_calls` hands over its row, the calls as its own
    lists and the row's geometry after rotating its buckets (the protocol stays in
    shm); this adds the cells :meth:`shm.Recorder.record_end` and
    :meth:`~shm.Recorder.record_start` would for the same calls. Everything is checked
    before anything is added; ends are written before starts.

    Parameters
    ----------
    target
        The row: writable, C-contiguous ``int64``.
    ended, done
        Flat ``slot, start_ns, end_ns, kind`` per call, of calls whose starts were
        added before (``ended``) or never (``done``); ``kind`` ``-1``: cut short (busy
        time only), ``0``: success, ``1..kinds``: a failure kind.
    starts
        ``{(slot, start_ns): calls}`` of calls still out.
    geometry
        16 ints: bucket ns, buckets, columns, the newest period held, failure kinds,
        then the word offsets of open, open_start_sum, open_old, busy_ns, completed,
        latency_ns, requests_total, failures, failures_total, the first kind's bucket
        block and the first kind's total.

    Raises
    ------
    TypeError
        Arguments of another type or layout.
    ArgumentError
        A slot, kind, time or count out of range, or a geometry the row cannot hold;
        nothing is added then.
    """
    k = _native if _active == "native" else None
    if k is not None:
        k.add_calls(target, ended, done, starts, geometry)
        return
    if type(geometry) is not tuple or len(geometry) != _GEOMETRY:
        raise TypeError(f"add_calls: geometry must be a tuple of {_GEOMETRY} ints")
    g = [_int(x, "geometry entries") for x in geometry]
    if (
        not isinstance(target, np.ndarray)
        or not target.flags.c_contiguous
        or not target.flags.writeable
        or target.dtype != _I64
    ):
        raise TypeError("add_calls: target must be a writable contiguous int64 array")
    t = target.reshape(-1)
    b, nb, cols, newest, nk = g[:5]
    o_open, o_sum, o_old, o_busy, o_done, o_lat, o_req, o_fail, o_ftot, o_kind, o_ktot = g[5:]
    spans = [
        (o_open, nb * cols), (o_sum, nb * cols), (o_old, cols), (o_busy, nb * cols),
        (o_done, nb * cols), (o_lat, nb * cols), (o_req, cols), (o_fail, nb * cols),
        (o_ftot, cols), (o_kind, nk * nb * cols), (o_ktot, nk * cols),
    ]  # fmt: skip
    if (
        b <= 0 or nb <= 0 or nb > 1 << 16 or cols <= 0 or cols > 1 << 24 or nk < 0 or nk > 64
        or newest < 0 or newest >= _TIME_LIMIT
        or any(o < 0 or o > t.size or n > t.size - o for o, n in spans)
    ):  # fmt: skip
        raise ArgumentError(f"add_calls: the row's geometry does not fit its {t.size} words")
    oldest = newest - nb + 1
    cells: list[int] = []
    vals: list[int] = []
    for flat, opened in ((ended, True), (done, False)):
        if type(flat) is not list or len(flat) % 4:
            raise TypeError(
                "add_calls: ends must be a list of 4 ints per call (slot, start, end, kind)"
            )
        for i in range(0, len(flat), 4):
            s = _int(flat[i], "slots")
            st, end = _int(flat[i + 1], "times"), _int(flat[i + 2], "times")
            kind = _int(flat[i + 3], "kinds")
            if not 0 <= s < cols:
                raise ArgumentError(f"add_calls: endpoint slots must be in 0..{cols - 1}, got {s}")
            if not -1 <= kind <= nk:
                raise ArgumentError(
                    f"add_calls: failure kinds must be -1 (cut), 0 or 1..{nk}, got {kind}"
                )
            if not (0 <= st < _TIME_LIMIT and 0 <= end < _TIME_LIMIT):
                raise ArgumentError(
                    f"add_calls: call times must be in 0..2**62 ns, got {st}..{end}"
                )
            d = end - st if end > st else 0
            end = st + d
            qs = st // b
            if kind >= 0:
                cells.append(o_req + s)
                vals.append(1)
            if opened:
                if qs >= oldest:
                    j = (qs % nb) * cols + s
                    cells += (o_open + j, o_sum + j)
                    vals += (-1, qs * b - st)
                else:
                    cells.append(o_old + s)
                    vals.append(-1)
            for q in range(max(qs, oldest), min(newest, (end - 1) // b) + 1):
                part = min(end, (q + 1) * b) - max(st, q * b)
                if part > 0:
                    cells.append(o_busy + (q % nb) * cols + s)
                    vals.append(part)
            if kind < 0:
                continue
            jb = min(max(end // b, oldest), newest) % nb
            j = jb * cols + s
            cells += (o_done + j, o_lat + j)
            vals += (1, d)
            if kind:
                cells += (o_fail + j, o_ftot + s, o_kind + ((kind - 1) * nb + jb) * cols + s,
                          o_ktot + (kind - 1) * cols + s)  # fmt: skip
                vals += (1, 1, 1, 1)
    n_ends = len(cells)
    if type(starts) is not dict:
        raise TypeError("add_calls: starts must be a dict {(slot, start): calls}")
    for key, n in starts.items():
        if type(key) is not tuple or len(key) != 2:
            raise TypeError("add_calls: starts must be a dict {(slot, start): calls}")
        s, st, n = _int(key[0], "slots"), _int(key[1], "times"), _int(n, "call counts")
        if not 0 <= s < cols:
            raise ArgumentError(f"add_calls: endpoint slots must be in 0..{cols - 1}, got {s}")
        if not (0 <= st < _TIME_LIMIT and 0 <= n <= 1 << 30):
            raise ArgumentError(
                "add_calls: start times must be in 0..2**62 ns and call counts in 0..2**30, "
                f"got {st} and {n}"
            )
        q = st // b
        if q >= oldest:
            j = (q % nb) * cols + s
            cells += (o_open + j, o_sum + j)
            vals += (n, n * (st - q * b))
        else:
            cells.append(o_old + s)
            vals.append(n)
    c = np.array(cells, np.int64)
    v = np.array(vals, np.int64)
    np.add.at(t, c[:n_ends], v[:n_ends])  # the ends, then the starts
    np.add.at(t, c[n_ends:], v[n_ends:])


def calls_adder() -> Any:
    """The active kernel's :func:`add_calls` itself (as :func:`scatter_adder`)."""
    k = _native if _active == "native" else None
    return add_calls if k is None else k.add_calls


def scatter_adder() -> Any:
    """The active kernel's :func:`scatter_add` itself (same arguments, one call less).

    For a caller that records on every batch and resolves it once per object (shm's
    counter rows do, per binding): it keeps the kernel active when it was asked for.
    """
    k = _native if _active == "native" else None
    return scatter_add if k is None else k.scatter_add


_select_at_import()
