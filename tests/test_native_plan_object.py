"""The native ``lbcore._kernel.Plan`` object refuses to be used unless it was fully built.

Each check runs in a subprocess: a crash there (SIGSEGV on a NULL table) shows as a
failed test with the signal, not as a dead pytest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import lbcore

ROOT = Path(__file__).parents[1]

pytestmark = pytest.mark.skipif(
    lbcore.kernel.load_native() is None,
    reason="the native kernel is not built",
)

# Captures the keyword arguments lbcore.Plan builds its native core with (a real plan
# of a real ring set), so a test can build native Plans by hand, well or badly.
PRELUDE = """
    import numpy as np
    import lbcore
    k = lbcore.kernel.load_native()

    lbcore.use_kernel("native")
    Native = k.Plan
    captured = {}

    def capture(**kw):
        captured.update(kw)
        return Native(**kw)

    k.Plan = capture
    rs = lbcore.RingSet([f"http://10.0.0.{i}:80" for i in range(5)])
    reference = lbcore.Plan(rs, 0, loads=np.arange(5.0), balance_factor=1.25)
    k.Plan = Native
    kwargs = dict(captured)
    keys = [f"AD{i:06d}" for i in range(200)]
    want = reference.route(keys)[0].tolist()

    def refused(p):
        calls = {
            "route": lambda: p.route([""]),
            "route_hashes": lambda: p.route_hashes(np.array([1, 2], np.uint64)),
            "answers": lambda: p.answers(),
            "counter_slots": lambda: p.counter_slots(np.array([0], np.int32)),
        }
        out = []
        for name, call in calls.items():
            try:
                call()
            except ValueError as exc:
                assert "plan not built" in str(exc), (name, exc)
                out.append(name)
        return out
"""

ALL = "['route', 'route_hashes', 'answers', 'counter_slots']"


def run(body: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CSLB_KERNEL"}
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def check(proc: subprocess.CompletedProcess, *lines: str) -> None:
    if proc.returncode < 0:
        died = signal.Signals(-proc.returncode).name
        pytest.fail(f"the interpreter died of {died}: {proc.stderr}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[: len(lines)] == list(lines), proc.stdout


def test_a_plan_made_by_new_alone_refuses_every_method():
    check(run("print(refused(Native.__new__(Native)))"), ALL)


@pytest.mark.parametrize(
    "spoil",
    [
        'kwargs["buckets"] = np.zeros(3, np.int32)',  # after slots and guard were taken
        'kwargs["loads"] = np.zeros(2)',  # the last buffer taken
        # after every buffer was taken:
        "kwargs.update(choice=1, thresholds=np.zeros(9, np.uint64), saturated=np.zeros(9, '?'))",
        'kwargs["n"] = -1',  # before any
    ],
)
def test_an_init_that_fails_part_way_leaves_a_plan_that_refuses_and_can_be_built(spoil):
    body = f"""
        good = dict(kwargs)
        {spoil}
        p = Native.__new__(Native)
        try:
            p.__init__(**kwargs)
        except ValueError as exc:
            print("init failed:", "plan:" in str(exc))
        print(refused(p))
        p.__init__(**good)
        print(p.route(keys)[0].tolist() == want)
    """
    check(run(body), "init failed: True", ALL, "True")


def test_a_built_plan_cannot_be_built_again_and_keeps_routing():
    body = """
        p = Native(**kwargs)
        for other in (kwargs, {**kwargs, "buckets": np.zeros(3, np.int32)}, {}):
            try:
                p.__init__(**other)
            except TypeError as exc:
                print(exc)
        print(p.route(keys)[0].tolist() == want, refused(p))
    """
    once = "lbcore._kernel.Plan: a plan is built once"
    check(run(body), once, once, once, "True []")
