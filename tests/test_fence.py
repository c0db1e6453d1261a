"""lbcore.fence: the one memory fence, used by shm's table protocol and the NumPy kernel."""

import importlib
import pkgutil
import threading

import shm
from lbcore import fence


def test_weak_memory_fence_works_from_many_threads():
    errors = []

    def run():
        try:
            for _ in range(2000):
                fence.weak_fence()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_fence_is_one_implementation():
    """Every shm module that fences uses lbcore's fence; none declares its own."""
    users = []
    for info in pkgutil.walk_packages(shm.__path__, "shm."):
        mod = importlib.import_module(info.name)
        if hasattr(mod, "fence"):
            assert mod.fence is fence.fence, info.name
            users.append(info.name)
    assert "shm.tables.protocol" in users  # (the seqlock read fences)
    fence.fence()  # callable on this CPU, whichever form it is
