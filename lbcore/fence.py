"""The memory fence of the sequence checks: orders loads, and stores, as other CPUs see them.

A reader of shared-memory tables loads a sequence word, then the table, then the word
again, and a writer stores them in the mirror order; on a CPU that reorders memory
accesses each step needs a barrier between them (the ``smp_rmb`` / ``smp_wmb`` of a
seqlock). :func:`fence` is that barrier for Python code: :mod:`shm`'s table protocol
and :mod:`lbcore.numpy_kernel`'s guard check use it. (The native kernel uses the C11
fences of ``kernel.h``.)
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable

__all__ = ["IS_TSO", "fence", "weak_fence"]

#: Whether this CPU keeps loads in order with older loads and stores with older stores
#: (x86's total store order): then :func:`fence` has nothing to do.
IS_TSO = platform.machine().lower() in {"x86_64", "amd64", "i386", "i686", "x86"}
_local = threading.local()


def weak_fence() -> None:
    """The fence for CPUs that reorder memory accesses (arm64, POWER).

    A release followed by an acquire of the same per-thread, otherwise uncontended lock:
    CPython's locks are an atomic with release semantics followed by one with acquire
    semantics, so accesses before the release cannot move after it and accesses after
    the acquire cannot move before it, and on arm64 (RCsc) and POWER a release is not
    reordered with a later acquire: this orders load->load and store->store across the
    call.
    """
    lock = getattr(_local, "lock", None)
    if lock is None:
        lock = _local.lock = threading.Lock()
        lock.acquire()
    lock.release()
    lock.acquire()


def _tso_fence() -> None:
    # TSO already orders what a seqlock needs, and the C compiler cannot move accesses
    # across the interpreter's calls: nothing to do.
    return None


#: Orders this thread's earlier memory accesses before its later ones (loads before
#: loads, stores before stores) as seen by other CPUs. A no-op on x86-64.
fence: Callable[[], None] = _tso_fence if IS_TSO else weak_fence
