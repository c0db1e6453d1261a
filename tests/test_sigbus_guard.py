"""The native kernel's SIGBUS guard: a shared-memory object shrunk under a mapping cuts a
kernel step short (MappingFaultError, or -1 from words_are) instead of killing the
process, and a SIGBUS outside every guard still kills it, through faulthandler when it
is enabled. Each case runs in a process of its own: a guard that failed would kill it,
not the test run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest

import lbcore

pytestmark = pytest.mark.skipif(
    lbcore.kernel.load_native() is None, reason="the native kernel is not built here"
)

# A mapping of a fresh POSIX shared-memory object (unlinked at once) that the script
# shrinks to nothing; `w` is its first 64 KiB as uint64 words.
PRELUDE = """
import os, mmap, sys
import numpy as np
import lbcore
k = lbcore.kernel.load_native()
path = "/dev/shm/cslb-test-guard-{tag}"
fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.unlink(path)
os.ftruncate(fd, 1 << 16)
mm = mmap.mmap(fd, 1 << 16)
w = np.frombuffer(mm, dtype=np.uint64)
i64 = np.frombuffer(mm, dtype=np.int64)
w[3] = 7
def shrink():
    os.ftruncate(fd, 0)
"""


def _run(body: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = PRELUDE.format(tag=uuid.uuid4().hex) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, *args, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_kernel_steps_on_a_shrunk_object_fault_and_the_process_lives() -> None:
    done = _run(
        """
        assert k.words_are(w, 3, 7) == 1 and k.words_are(w, 3, 8) == 0
        ring_set = lbcore.RingSet([f"http://10.0.0.{i}:80" for i in range(1, 9)])
        plan = lbcore.Plan(ring_set, 0, guard=(w, 3, 7))
        assert plan.kernel == "native"
        assert plan.route(["a", "b"])[3] is True
        shrink()
        assert k.words_are(w, 3, 7) == -1
        assert k.words_are(np.zeros(4, np.uint64), 0, 0, w, 3, 7) == -1
        # bucket ns, buckets, columns, newest period, kinds, then each field's offset
        GEOMETRY = (10**9, 4, 8, 0, 1, 0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320)
        for call in (
            lambda: plan.route(["a", "b"]),
            lambda: k.scatter_add(i64, np.array([1, 2], np.int64), 1),
            lambda: k.scatter_add_routed(
                i64, np.array([4, 5], np.int64), np.array([0, -1, 1], np.int32), (1, 2), (0, 8)
            ),
            lambda: k.add_calls(i64, [], [], {(1, 10): 1}, GEOMETRY),
        ):
            for _ in range(3):  # (the guard is armed again after a fault)
                try:
                    call()
                except lbcore.MappingFaultError as exc:
                    assert "shrunk" in str(exc)
                else:
                    raise AssertionError("no fault")
        print("alive")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "alive"
    assert "Fatal Python error" not in done.stderr


@pytest.mark.parametrize("faulthandler", [True, False])
def test_a_sigbus_outside_the_guard_still_kills_the_process(faulthandler: bool) -> None:
    """Installed by the first guarded step, the guard hands every other SIGBUS on to
    what was there before it: faulthandler's traceback, then the default action."""
    done = _run(
        """
        k.words_are(w, 3, 7)  # installs the guard
        shrink()
        print("reading", flush=True)
        print(int(w[3]))  # NumPy's read: no guard
        """,
        *(["-X", "faulthandler"] if faulthandler else []),
    )
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        # (.ci/kernel_sanitizers: AddressSanitizer's handler was there before us; it
        # reports the signal and ends the process its own way)
        assert done.returncode != 0 and "AddressSanitizer" in done.stderr, done.stderr
    else:
        assert done.returncode == -signal.SIGBUS, (done.returncode, done.stderr)
        assert ("Fatal Python error: Bus error" in done.stderr) is faulthandler, done.stderr
    assert done.stdout.strip() == "reading"
    if faulthandler:
        assert "Fatal Python error: Bus error" in done.stderr, done.stderr


def test_a_faulthandler_enabled_after_the_guard_does_not_turn_a_guarded_fault_fatal() -> None:
    """faulthandler then sees the signal first (it prints its traceback) and hands it
    back to the guard: the step is cut short and the process lives."""
    done = _run(
        """
        import faulthandler
        k.words_are(w, 3, 7)
        faulthandler.enable()
        shrink()
        assert k.words_are(w, 3, 7) == -1
        print("alive")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "alive"


def test_a_guarded_fault_on_another_thread_is_cut_short_there() -> None:
    """The guard is per thread: a fault on a thread routing without the GIL (a large
    batch) returns on that thread."""
    done = _run(
        """
        import threading
        ring_set = lbcore.RingSet([f"http://10.0.0.{i}:80" for i in range(1, 9)])
        plan = lbcore.Plan(ring_set, 0, guard=(w, 3, 7))
        keys = np.arange(200_000, dtype=np.int64)
        shrink()
        errors = []
        def route():
            try:
                plan.route(keys)
            except lbcore.MappingFaultError as exc:
                errors.append(exc)
        threads = [threading.Thread(target=route) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(errors) == 2, errors
        print("alive")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "alive"


def test_a_router_whose_tables_shrink_under_it_falls_back_and_follows_a_new_publish() -> None:
    """No size probe on the routing path: the tables' data segment shrunk to nothing
    under a routing worker faults inside the guard, the batch falls back (the worker
    says why), and the next publish (a new data segment) is routed on again."""
    import shm
    from tests.router_harness import Clock, Host, endpoints
    from tests.shm_damage import newest_data, shrink

    host = Host(f"sg{os.getpid()}x{uuid.uuid4().hex[:8]}", Clock())
    try:
        host.publish(lbcore.RingSet(endpoints(10)))
        r = host.router(background=False)
        keys = [f"k{i}" for i in range(50)]
        before = r.route(keys)
        assert (before >= 0).all() and r.snapshot().guarded
        shrink(newest_data(host.ns, "tables"), 0)
        for _ in range(3):
            assert (r.route(keys) == -1).all()
            host.clock.advance(0.5)
        assert r.routing_problem() is not None
        host.writer.close()
        host.writer = shm.TableWriter(host.ns, counters=host.store, clock=host.clock)
        host.publish(lbcore.RingSet(endpoints(10)))
        host.clock.advance(1.5)
        assert (r.route(keys) == before).all()
    finally:
        host.close()
