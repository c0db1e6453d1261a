"""A table damaged after it was mapped and checked, before its first plan: with zone
affinity on, the plan itself reads the ring (each view's arcs, for the bars), so the
damage shows there rather than in a batch. Either way the worker falls back for every
key and says why, never raises to the app."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import lbcore
import shm.tables.codec as codec
from shm.segment import Segment
from shm.tables import ZoneCurve
from tests import router_harness as harness
from tests.router_harness import KEYS, endpoints

namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept

N = 9
ZONES = [f"z-{'abc'[i % 3]}" for i in range(N)]
NODE, GARBAGE = 5, 777


def _curve(affinity: bool, now_ns: int) -> ZoneCurve:
    if affinity:
        return ZoneCurve(
            zone="z-a",
            affinity=True,
            state="full",
            reason="ramp_done",
            x0=0.99,
            cap=0.99,
            start_ns=now_ns,
        )
    return ZoneCurve(
        zone="z-a", affinity=False, state="off", reason="affinity_off", start_ns=now_ns
    )


def _damage_after_decode(monkeypatch) -> list[int]:
    """Every decoded table gets one ring owner out of range in its shared memory, after
    the decoder checked it (any process of the user can write the segment)."""
    damaged: list[int] = []
    real = codec.Decoder.decode

    def decode_then_damage(self, gen):
        t = real(self, gen)
        own = t.ring_set.rings[-1].owners
        base = np.frombuffer(self.data.buf, np.uint8).__array_interface__["data"][0]
        off = own.__array_interface__["data"][0] - base + 4 * NODE
        seg = Segment.attach(self.data.name, writable=True)
        try:
            np.frombuffer(seg.buf, np.int32, count=1, offset=off)[0] = GARBAGE
        finally:
            seg.close()
        damaged.append(t.generation)
        return t

    monkeypatch.setattr(codec.Decoder, "decode", decode_then_damage)
    return damaged


@pytest.mark.parametrize("affinity", [True, False], ids=["affinity", "no-affinity"])
def test_damage_before_the_first_plan_falls_back_for_every_key(
    host, clock, monkeypatch, caplog, kernel, affinity
):
    rs = lbcore.RingSet(endpoints(N))
    host.publish(rs, zones=ZONES, zone=_curve(affinity, clock()))
    damaged = _damage_after_decode(monkeypatch)
    r = host.router(refresh_s=0.0, background=False)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            idx = r.route(KEYS[:50])
            assert damaged and (idx == -1).all(), idx
            problem = r._follow.problem
            assert problem is not None and f"generation {damaged[0]} is damaged" in problem
            if affinity:  # found by the plan's arc sums, which name the node
                assert f"ring node {NODE} has owner {GARBAGE}" in problem
        clock.advance(2.0)  # past the recheck: read again, still damaged, still no raise
        idx = r.route(KEYS[:50])
        assert (idx == -1).all() and r._follow.problem is not None
    lines = [rec for rec in caplog.records if "damaged after it was mapped" in rec.getMessage()]
    assert len(lines) == 1, [rec.getMessage() for rec in caplog.records]
    assert not [rec for rec in caplog.records if rec.exc_info]
