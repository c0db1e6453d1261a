"""Choosing and calling lbcore's kernel: the compiled C extension or the NumPy reference.

Both kernels answer the same questions bit for bit — hash a batch of keys, route it on
a :class:`lbcore.plan.Plan`, add a fan-out to a counter row — and are tested against
each other. The native one (``lbcore._kernel``, C99 built by ``pip install`` where a C
compiler works) is what a worker runs; the NumPy one (:func:`lbcore.keys.hash_each`,
:mod:`lbcore.numpy_kernel`, :mod:`lbcore.numpy_recording`) is the reference and the
fallback where nothing was compiled. This module picks one and forwards each question
to it.

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

from lbcore import numpy_recording
from lbcore.errors import ArgumentError
from lbcore.keys import batch_of, check_max_key_bytes, hash_each
from lbcore.knobs import KERNEL

__all__ = [
    "add_calls",
    "calls_adder",
    "check_attempt",
    "hash_keys",
    "kernel_name",
    "load_native",
    "native",
    "native_unavailable",
    "newest_recorder",
    "scatter_add",
    "scatter_add_routed",
    "scatter_adder",
    "scatter_adder_routed",
    "select_kernel",
    "use_kernel",
]

#: The native module's interface version this Python code drives (``LB_ABI`` in kernel.h).
ABI = 8

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


def load_native() -> ModuleType | None:
    """The native extension module, active or not (loaded once); ``None`` if it cannot load."""
    return _load_native()


def native_unavailable() -> str | None:
    """Why the native extension module cannot load; ``None`` when it loads."""
    _load_native()
    return _native_error


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
# Keys.


def check_attempt(attempt: Any) -> int:
    """Validate a retry number: a non-negative ``int`` or NumPy integer (not a ``bool``)."""
    if isinstance(attempt, bool) or not isinstance(attempt, (int, np.integer)) or attempt < 0:
        raise ArgumentError(f"attempt must be a non-negative integer, got {attempt!r}")
    return int(attempt)


def hash_keys(keys: Any, *, max_key_bytes: int | None = None) -> np.ndarray:
    """XXH64 (seed 0) of every key of a batch, on the active kernel.

    The one entry point of key hashing: the native kernel's, or the NumPy kernel's
    :func:`lbcore.keys.hash_each` (the reference); same keys accepted, same hashes, same
    exceptions and messages. The batch is judged first, then its keys in order: the
    first bad key is the one reported.

    Parameters
    ----------
    keys
        A batch of ``str`` (UTF-8), ``bytes``-like or integer keys (decimal string, so
        ``123`` and ``"123"`` hash alike), a list, tuple or 1-D array; a single key is a
        batch of one. An integer is its stored value, of any size (see
        :func:`lbcore.keys.encode_key`).
    max_key_bytes
        If given, a key longer than this many bytes raises :class:`lbcore.KeyTooLongError`.

    Returns
    -------
    numpy.ndarray
        ``uint64`` hash per key, in order.

    Raises
    ------
    KeyTypeError
        Not a batch, an array of an unsupported dtype or shape, or a key of another type
        (``bool``, ``float``, ``None``, ...).
    KeyEncodingError
        A ``str`` key is not valid Unicode.
    KeyTooLongError
        A key is longer than ``max_key_bytes``.
    ArgumentError
        ``max_key_bytes`` is not ``None`` or an integer ``>= 0``.
    """
    limit = check_max_key_bytes(max_key_bytes)
    k = _native if _active == "native" else None
    if k is None:
        return hash_each(keys, limit)
    return k.hash_keys(keys, None, -1 if limit is None else limit)


# --------------------------------------------------------------------------------------
# Recording.


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
    numpy_recording.scatter_add(target, index, values, offsets)


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
    return numpy_recording.scatter_add_routed(target, slot_map, endpoints, values, offsets)


def newest_recorder() -> Any:
    """The native kernel's ``record_newest`` when it is active, else ``None``.

    ``record_newest(sink, slot_map, endpoints, started_ns[, duration_ns, now_ns])``: a
    fan-out's start (or end) in a counter row's newest bucket as one
    :func:`scatter_add_routed` of the cells shm's recorder computes there, after the
    row's epoch check; ``-1`` (nothing added) sends the recorder down its general path.
    ``sink`` is :attr:`shm.Recorder.newest_sink`.
    """
    return _native.record_newest if _active == "native" and _native is not None else None


def scatter_adder_routed() -> Any:
    """The active kernel's :func:`scatter_add_routed` itself (as :func:`scatter_adder`)."""
    k = _native if _active == "native" else None
    return scatter_add_routed if k is None else k.scatter_add_routed


def add_calls(
    target: np.ndarray,
    ended: list[int],
    done: list[int],
    starts: dict[tuple[int, int], int],
    geometry: tuple[int, ...],
) -> None:
    """A batching recorder's step: many calls' ends, then their starts, added to a row.

    shm's :meth:`shm.Recorder.add_calls` hands over its row, the calls as its own
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
    numpy_recording.add_calls(target, ended, done, starts, geometry)


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
