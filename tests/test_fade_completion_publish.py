"""The discovery process publishes a fade's completion when it completes.

A finished fade used to stay in the published table ("39.4 s of 30 s … 100 %" on
/status, a fading ring in /metrics) until the next change happened to publish. A real
``cslb discovery`` with a short fade window: a pod added to the endpoints file fades
in through a new ring, and about one window later a new generation goes out (reason
``fade completed``) whose tables hold no fading ring; the keys route as before.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

import shm
from lbcore import route_ring_set
from tests.discovery_harness import Proc, shm_namespace, wait_until

FADE_S = 1.0


def _read(ns: str) -> shm.Table:
    reader = shm.TableReader(ns)
    try:
        return reader.table()
    finally:
        reader.close()


def test_a_completed_fade_is_published_at_once(tmp_path: Path) -> None:
    f = tmp_path / "endpoints.json"
    f.write_text(json.dumps([f"http://10.0.0.{h}:80" for h in (1, 2, 3)]))
    with shm_namespace() as ns:
        env = {
            "CSLB_SHM_NAMESPACE": ns,
            "CSLB_LOG_FORMAT": "json",
            "CSLB_FADE_DURATION": str(FADE_S),
            "CSLB_DEBOUNCE": "0.1",
            "CSLB_FILE_POLL": "0.05",
            "CSLB_HEARTBEAT": "5",  # no heartbeat-paced wake-up: the fade's own must do
        }
        p = Proc("discovery", "--endpoints-file", str(f), env=env)
        try:
            wait_until(lambda: p.events("publish"), 60, "the first publish")
            f.write_text(json.dumps([f"http://10.0.0.{h}:80" for h in (1, 2, 3, 4)]))
            wait_until(lambda: len(p.events("publish")) >= 2, 30, "the scale-up")
            scale_up = _read(ns)
            assert len(scale_up.ring_set.starts_ns) == 1
            keys = [f"product-{i}" for i in range(2000)]
            wait_until(lambda: len(p.events("publish")) >= 3, 30, "the fade's completion")
            done = p.events("publish")[2]
            assert done["reason"] == "fade completed" and done["collapsed"] == 1, done
            assert done["fading_rings"] == 0 and done["added"] == 0
            table = _read(ns)
            assert table.generation == 3 and table.ring_set.starts_ns == ()
            started = scale_up.ring_set.starts_ns[0]
            late_s = (table.published_ns - started) / 1e9 - FADE_S
            assert 0 <= late_s < 1.0, late_s  # at the fade's end, not at a later change
            # Every key routes on the established ring as the completed fade left it.
            now = time.monotonic_ns()
            before = route_ring_set(scale_up.ring_set, keys, now)
            after = route_ring_set(table.ring_set, keys, now)
            assert np.array_equal(
                np.asarray(scale_up.endpoints)[before], np.asarray(table.endpoints)[after]
            )
            time.sleep(0.5)
            assert len(p.events("publish")) == 3  # and nothing more while nothing changes
            p.signal(15)
            assert p.wait(30) == 0
        finally:
            p.kill()
