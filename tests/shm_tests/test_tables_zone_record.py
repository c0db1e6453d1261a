"""The zone record a table carries (shm.tables.zone): written, read back by a reader
(another process's view of the same bytes), evaluated at any instant without a publish,
validated like every other field, and refused under the previous layout version."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
from shm import SegmentVersionError, TableInputError, TableReader, TableWriter
from shm.layout import LAYOUT_VERSION, PAYLOAD_HEADER
from shm.names import segment_name
from shm.segment import Segment
from shm.tables import ZoneCurve
from shm.tables.zone import ZONE_REASONS, ZONE_STATES

EPS = [f"http://10.0.0.{i}:8080" for i in range(1, 7)]
ZONES = ["z-a", "z-a", "z-b", "z-b", "z-c", "z-c"]
S = 1_000_000_000


def test_the_zone_record_round_trips_and_its_curve_is_evaluated_at_any_instant(namespace):
    curve = ZoneCurve(
        zone="eu-central-1a",
        affinity=True,
        min_pods=2,
        state="ramping",
        reason="recovered",
        transitions=7,
        start_ns=50 * S,
        x0=0.01,
        rate=0.02,
        cap=0.8,
    )
    with TableWriter(namespace) as w, TableReader(namespace) as r:
        w.publish(lbcore.RingSet(EPS), zones=ZONES, zone=curve, now_ns=60 * S)
        t = r.table()
        assert t.zone == curve
        assert t.zone_share(40 * S) == pytest.approx(0.01)  # before the start: x0
        assert t.zone_share(60 * S) == pytest.approx(0.01 + 0.2)
        assert t.zone_share(500 * S) == pytest.approx(0.8)  # capped
        assert curve.reaches_cap_ns() == 50 * S + round(0.79 / 0.02 * S)
        # a table without a zone record: no zone, affinity off, x = 0
        w.publish(lbcore.RingSet(EPS), zones=ZONES)
        t = r.table()
        assert t.zone == ZoneCurve() and t.zone_share(10**15) == 0.0


def test_no_zone_or_affinity_off_means_no_local_share():
    on = ZoneCurve(zone="z", affinity=True, state="full", x0=1.0, cap=1.0)
    assert on.share_at(0) == 1.0
    assert ZoneCurve(zone="", affinity=True, state="full", x0=1.0, cap=1.0).share_at(0) == 0
    assert ZoneCurve(zone="z", affinity=False, state="full", x0=1.0, cap=1.0).share_at(0) == 0


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"state": "warming"}, "zone state 'warming'"),
        ({"reason": "because"}, "zone reason 'because'"),
        ({"x0": 1.5}, "zone x0 must be a share in 0..1"),
        ({"cap": float("nan")}, "zone cap must be a share in 0..1"),
        ({"rate": -0.1}, "zone rate must be >= 0"),
        ({"start_ns": -1}, "zone start must be >= 0 ns"),
        ({"transitions": -1}, "zone transitions must be >= 0"),
        ({"zone": "z" * 300}, "at most 253 bytes"),
    ],
)
def test_a_bad_zone_record_is_refused_before_anything_is_published(namespace, fields, error):
    with pytest.raises(TableInputError, match=error):
        ZoneCurve(**fields)
    with TableWriter(namespace) as w, pytest.raises(TableInputError, match="ZoneCurve"):
        w.publish(lbcore.RingSet(EPS), zone={"zone": "z"})  # type: ignore[arg-type]
    assert w.generation == 0


def _payload_header(r: TableReader) -> tuple[Segment, int]:
    t = r.table()
    seg = Segment.attach(t.segment, writable=True)
    return seg, t.buffer_offset + 64


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("zone_state", len(ZONE_STATES), "zone record out of range"),
        ("zone_reason", 200, "zone record out of range"),
        ("zone_affinity", 2, "zone record out of range"),
        ("zone_x0", np.nan, "zone x0 must be a share"),
        ("zone_rate", -1.0, "zone rate must be >= 0"),
    ],
)
def test_a_reader_validates_the_zone_record_it_maps(namespace, field, value, error):
    from shm.layout import BUFFER_HEADER
    from shm.tables.words import payload_checksum

    with TableWriter(namespace) as w:
        w.publish(lbcore.RingSet(EPS), zones=ZONES, zone=ZoneCurve(zone="z-a"))
        with TableReader(namespace) as r:
            seg, start = _payload_header(r)
            h = seg.array(PAYLOAD_HEADER, start, 1)
            h[0][field] = value
            n = int(seg.array(BUFFER_HEADER, start - 64, 1)[0]["payload_bytes"])
            hdr = seg.array(BUFFER_HEADER, start - 64, 1)
            hdr[0]["checksum"] = payload_checksum(seg.buf[start : start + n])
            seg.close()
        # a reader mapping this generation afresh checks every field
        from shm import SegmentLayoutError

        with pytest.raises(SegmentLayoutError, match=error), TableReader(namespace) as r2:
            r2.table()


def test_tables_of_the_previous_layout_version_are_refused_by_name(namespace):
    with TableWriter(namespace) as w:
        w.publish(lbcore.RingSet(EPS))
        ctl = Segment.attach(segment_name(namespace, "tables"), writable=True)
        ctl.words[1] = LAYOUT_VERSION - 1
        with pytest.raises(
            SegmentVersionError,
            match=f"is layout version {LAYOUT_VERSION - 1}, this build reads version "
            f"{LAYOUT_VERSION}",
        ):
            TableReader(namespace)
        ctl.words[1] = LAYOUT_VERSION
        ctl.close()
    assert LAYOUT_VERSION == 8 and ZONE_REASONS[0] == "none"
