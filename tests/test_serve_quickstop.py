"""``cslb serve`` with uvicorn's gunicorn worker stops within seconds on SIGINT.

uvicorn's worker ignores gunicorn's SIGQUIT (it only clears a flag its server never
reads), so a Ctrl-C used to wait the whole graceful timeout (30 s) for each worker
before SIGKILL; cslb's ``post_worker_init`` hook makes that SIGQUIT shut the server down
(:mod:`workers.master.quickstop`). Both ways a SIGINT arrives: at the master alone (a
process manager, ``kill -INT``) and at the whole process group (Ctrl-C in a terminal).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import shm
from tests.gunicorn_harness import serving

ASGI = ["--workers", "2", "--app", "userasgi:app", "--", "-k", "uvicorn_worker.UvicornWorker"]
PROMPT_S = 6.0  # well under gunicorn's default graceful timeout of 30 s


@pytest.mark.parametrize("to", ["master", "group"])
def test_sigint_stops_everything_promptly(to: str, tmp_path: Path) -> None:
    pytest.importorskip("uvicorn_worker")
    with serving(ASGI, tmp_path) as server:
        server.wait_ready(2, path="/healthz")
        status, _ = server.request("GET", "/healthz", headers={"Connection": "keep-alive"})
        assert status == 200
        server.tree()  # remember every process of the tree
        assert len(server.seen) >= 4
        t0 = time.monotonic()
        if to == "master":
            os.kill(server.pid, signal.SIGINT)
        else:
            os.killpg(server.pid, signal.SIGINT)  # the server runs in its own session
        server.proc.wait(timeout=PROMPT_S + 30)
        took = time.monotonic() - t0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(server.ours(p) for p in server.seen):
            time.sleep(0.05)
        left = [p for p in server.seen if server.ours(p)]
        assert took < PROMPT_S, f"stopped after {took:.1f} s:\n{server.log()}"
        assert not left, left
        assert shm.list_segments(server.namespace) == []
        assert "SIGKILL" not in server.log()
