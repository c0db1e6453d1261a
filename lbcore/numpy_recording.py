"""The NumPy reference of the counter-row primitives: scatter adds and the call ledger.

What :func:`lbcore.kernel.scatter_add`, :func:`~lbcore.kernel.scatter_add_routed` and
:func:`~lbcore.kernel.add_calls` do on the NumPy kernel, with the native kernel's checks
in its order (``csrc/scatter.c``, ``csrc/calls.c``), so both raise alike; the parity
tests run every case on both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lbcore.errors import ArgumentError

__all__ = ["add_calls", "scatter_add", "scatter_add_routed"]

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
    """The NumPy reference of :func:`lbcore.kernel.scatter_add`."""
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
    """The NumPy reference of :func:`lbcore.kernel.scatter_add_routed`."""
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
    """The NumPy reference of :func:`lbcore.kernel.add_calls`."""
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
