"""A table damaged after it was mapped and checked, before its first plan: with zone
affinity on, the plan itself reads the ring (each view's arcs, for the bars), so the
damage shows there rather than in a batch. Either way the worker falls back for every
key and says why, never raises to the app."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import lbcore
import shm
import shm.tables.codec as codec
from shm.segment import Segment
from shm.tables import ZoneCurve
from tests import router_harness as harness
from tests.router_harness import KEYS, endpoints
from workers.routing import snapshot

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


def _record_decodes(monkeypatch) -> list[tuple[object, str, int]]:
    """Every decoded table, with its segment's name and its newest ring's owners' offset
    there (to damage it after the decoder checked it: any process of the user can write
    the segment)."""
    decoded: list[tuple[object, str, int]] = []
    real = codec.Decoder.decode

    def decode_and_record(self, gen):
        t = real(self, gen)
        own = t.ring_set.rings[-1].owners
        base = np.frombuffer(self.data.buf, np.uint8).__array_interface__["data"][0]
        decoded.append((t, self.data.name, own.__array_interface__["data"][0] - base))
        return t

    monkeypatch.setattr(codec.Decoder, "decode", decode_and_record)
    return decoded


def _write_owners(table, name: str, offset: int, value: int, node: int | None = None) -> None:
    """Set the owner of ring ``node`` (``None``: of every node) in the segment."""
    seg = Segment.attach(name, writable=True)
    try:
        own = np.frombuffer(seg.buf, np.int32, count=len(table.ring_set.rings[-1]), offset=offset)
        own[slice(None) if node is None else node] = value
    finally:
        seg.close()


def _damage_after_decode(monkeypatch) -> list[int]:
    """Every table decoded from now on gets one ring owner out of range, right after the
    decoder checked it."""
    damaged: list[int] = []
    real = codec.Decoder.decode

    def decode_then_damage(self, gen):
        t = real(self, gen)
        own = t.ring_set.rings[-1].owners
        base = np.frombuffer(self.data.buf, np.uint8).__array_interface__["data"][0]
        off = own.__array_interface__["data"][0] - base
        _write_owners(t, self.data.name, off, GARBAGE, NODE)
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


@pytest.mark.parametrize("affinity", [True, False], ids=["affinity", "no-affinity"])
def test_a_damaged_second_generation_falls_back_with_affinity_or_without(
    host, clock, monkeypatch, caplog, kernel, affinity
):
    """Generation 1 routed on, generation 2 damaged after it was checked: whether its
    plan finds the damage (affinity: the arcs) or its first batch does, every key falls
    back on every batch (never on generation 1 through the last snapshot), and the
    problem says so; past the recheck, still damaged, the same."""
    host.publish(lbcore.RingSet(endpoints(N)), zones=ZONES, zone=_curve(affinity, clock()))
    r = host.router(refresh_s=0.0, background=False)
    assert (r.route(KEYS[:50]) >= 0).all() and r.routing_problem() is None
    damaged = _damage_after_decode(monkeypatch)
    gen2 = host.publish(
        lbcore.RingSet(endpoints(N + 1)), zones=[*ZONES, "z-a"], zone=_curve(affinity, clock())
    )
    with caplog.at_level(logging.WARNING):
        for i in range(6):
            if i == 3:
                clock.advance(2.0)  # past the recheck: read again, still damaged
            idx, t = r.route_table(KEYS[:50])
            assert damaged == [gen2] and (idx == -1).all(), (i, t.generation, idx)
            problem = r.routing_problem()
            assert problem is not None and f"generation {gen2} is damaged" in problem, problem
            assert "every key falls back" in problem
    lines = [rec for rec in caplog.records if "damaged after it was mapped" in rec.getMessage()]
    assert len(lines) == 1, [rec.getMessage() for rec in caplog.records]
    assert not [rec for rec in caplog.records if rec.exc_info]


@pytest.mark.parametrize("kind", ["batch", "plan"])
def test_the_last_good_generation_damaged_while_the_newest_is_unreadable(
    host, clock, monkeypatch, caplog, kernel, kind
):
    """The newest generation cannot be read, so the worker routes on the one before; that
    one is then damaged, found by a batch or by the plan a refresh builds anew (views
    changed: their arcs are read again): every key falls back, nothing raises to the
    app, and the problem names the unreadable generation."""
    decoded = _record_decodes(monkeypatch)
    host.publish(lbcore.RingSet(endpoints(N)), zones=ZONES, zone=_curve(True, clock()))
    r = host.router(refresh_s=0.0, background=False)
    idx, t1 = r.route_table(KEYS[:50])
    assert (idx >= 0).all() and decoded[-1][0] is t1
    reader = type(r._follow.reader)

    def unreadable(self):
        raise shm.SegmentCorruptError("tables", "checksum mismatch (test)")

    monkeypatch.setattr(reader, "table", unreadable)
    gen2 = host.publish(lbcore.RingSet(endpoints(N + 1)), zones=[*ZONES, "z-a"])
    idx, t = r.route_table(KEYS[:50])
    assert t is t1 and (idx >= 0).all()
    assert f"generation {gen2} cannot be read" in r.routing_problem()
    assert "routing on generation" in r.routing_problem()
    _write_owners(*decoded[-1], GARBAGE)
    if kind == "plan":
        # Views that changed: their arcs are not the previous plan's nor kept with the
        # ring, so the refresh's plan reads the ring again.
        real = snapshot.build_plan
        monkeypatch.setattr(
            snapshot, "build_plan", lambda *a, **kw: real(*a, **{**kw, "reuse": None})
        )
        t1.ring_set.rings[-1]._memo.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            clock.advance(0.1)  # a refresh due on every batch
            idx, t = r.route_table(KEYS[:50])
            assert (idx == -1).all(), idx
            problem = r.routing_problem()
            assert "every key falls back" in problem, problem
        assert f"generation {gen2} cannot be read" in problem, problem
    lines = [rec for rec in caplog.records if "damaged after it was mapped" in rec.getMessage()]
    assert len(lines) == 1, [rec.getMessage() for rec in caplog.records]
    assert not [rec for rec in caplog.records if rec.exc_info]
