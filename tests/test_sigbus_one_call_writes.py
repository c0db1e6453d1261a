"""The one-call writes (lbcore.Plan.route_counted's decision counts, a counter row's
record_newest) on a shared-memory object shrunk under them: cut short by the SIGBUS
guard, reported as "not written" (so the caller's general path names the shrunk
segment), and the process lives. The case runs in a process of its own: a guard that
failed would kill it, not the test run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest

import lbcore

pytestmark = pytest.mark.skipif(
    lbcore.kernel.load_native() is None, reason="the native kernel is not built here"
)

SCRIPT = """
import os, mmap
import numpy as np
import lbcore
from lbcore import _kernel as k
path = "/dev/shm/cslb-test-onecall-{tag}"
fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.unlink(path)
os.ftruncate(fd, 1 << 16)
mm = mmap.mmap(fd, 1 << 16)
w = np.frombuffer(mm, dtype=np.uint64)
row = memoryview(np.frombuffer(mm, dtype=np.int64)[1024:2048])
w[3] = 7  # the control word: epoch 7
plan = lbcore.Plan(lbcore.RingSet([f"10.0.0.{{i}}:80" for i in range(1, 9)]), 0)
totals = memoryview(np.zeros(3, np.int64))
count_sink = (row, 16, w, 3, 7)
newest_sink = (row, w, 3, 7, 8, 1000, 2000, (64, 128), (64, 128, 192, 256, 320, 384))
slot_map = memoryview(np.arange(8, dtype=np.int64))
idx = np.array([0, 5, -1], np.int32)
assert plan.route_counted(["a", "b"], 0, count_sink, totals)[4] is True
assert k.record_newest(newest_sink, slot_map, idx, 1500) == 2
os.ftruncate(fd, 0)
for _ in range(3):  # (the guard is armed again after a fault)
    out = plan.route_counted(["a", "b"], 0, count_sink, totals)
    assert out[3] is True and out[4] is False, out  # routed, not counted
    assert k.record_newest(newest_sink, slot_map, idx, 1500) == -1
    assert k.record_newest(newest_sink, slot_map, idx, 1500, 10, 1510) == -1
assert list(totals) == [2, 0, 0]
print("alive")
"""


def test_one_call_writes_on_a_shrunk_object_are_not_written_and_the_process_lives() -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT.format(tag=uuid.uuid4().hex))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "alive"
    assert "Fatal Python error" not in done.stderr
