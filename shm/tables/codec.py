"""Encoding a table into a buffer (writer side) and decoding it back (reader side).

The decoder validates every offset, count and index before it builds zero-copy views:
any process of the user can write the segment, so nothing read from it is trusted.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import lbcore
from lbcore.ejection import Ejections
from lbcore.outlier import EJECT_REASONS
from lbcore.ring import host_key
from shm.errors import SegmentLayoutError, TableInputError
from shm.layout import (
    BUFFER_HEADER_BYTES,
    DIRECTORY_OFFSET,
    MAGIC_PAYLOAD,
    PAYLOAD_HEADER,
    SECTION,
    TABLE_SECTIONS,
    align,
    ring_sections,
    table_sections,
)
from shm.segment import Segment
from shm.tables.model import Knobs, Table
from shm.tables.zone import ZONE_REASONS, ZONE_STATES, ZoneCurve

_MAX_ENDPOINTS = 1 << 20
_MAX_RINGS = 64
_MAX_VNODES = 1 << 16
_MIN_BUCKET_BITS = 1
_MAX_BUCKET_BITS = 32  # lbcore builds at most MAX_BUCKET_BITS; accept any sane table


def _blob(strings: Sequence[str], what: str) -> bytes:
    try:
        joined = "\0".join(strings)
    except TypeError:
        joined = None
    if joined is None or joined.count("\0") != max(len(strings) - 1, 0):
        for s in strings:  # find the culprit
            if not isinstance(s, str):
                raise TableInputError(f"{what} must be strings, got {type(s).__name__}: {s!r}")
            if "\0" in s:
                raise TableInputError(f"{what} must not contain NUL characters: {s!r}")
    assert joined is not None
    try:
        return joined.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TableInputError(f"{what} are not valid Unicode (lone surrogate?): {exc}") from exc


def per_endpoint(values: Any, n: int, dtype: Any, what: str, default: Any) -> np.ndarray:
    """``values`` as one contiguous ``dtype`` entry per endpoint (``default``: none given)."""
    if values is None:
        return np.full(n, default, dtype=dtype)
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise TableInputError(f"{what} has shape {arr.shape}, expected ({n},) for {n} endpoints")
    return np.ascontiguousarray(arr, dtype=dtype)


def strings(values: Sequence[str] | None, n: int, what: str) -> list[str]:
    """``values`` as a list of one string per endpoint (empty strings: none given)."""
    if values is None:
        return [""] * n
    out = list(values)
    if len(out) != n:
        raise TableInputError(f"{what} has {len(out)} entries, expected {n} (one per endpoint)")
    return out


class Encoded:
    """A table laid out as a payload: header, section directory, sections."""

    def __init__(self, header: np.ndarray, sections: list[tuple[str, memoryview]]) -> None:
        self.header = header
        self.sections = sections
        self.directory = np.zeros(len(sections), dtype=SECTION)
        off = align(DIRECTORY_OFFSET + SECTION.itemsize * len(sections), 64)
        for i, (_, data) in enumerate(sections):
            self.directory[i] = (off, data.nbytes)
            off = align(off + data.nbytes, 64)
        self.payload_bytes = off

    def write(self, buf: memoryview, start: int) -> None:
        """Write the payload at byte ``start`` of ``buf``, alignment gaps zeroed."""
        hb = memoryview(self.header).cast("B")
        buf[start : start + hb.nbytes] = hb
        db = memoryview(self.directory).cast("B")
        buf[start + DIRECTORY_OFFSET : start + DIRECTORY_OFFSET + db.nbytes] = db
        pos = start + DIRECTORY_OFFSET + db.nbytes
        for (_, data), (off, nbytes) in zip(self.sections, self.directory.tolist(), strict=True):
            # Zero the alignment gaps too: the checksum covers every payload byte.
            buf[pos : start + off] = bytes(start + off - pos)
            buf[start + off : start + off + nbytes] = data
            pos = start + off + nbytes
        buf[pos : start + self.payload_bytes] = bytes(start + self.payload_bytes - pos)


def _bytes_of(arr: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(arr).reshape(-1)).cast("B")


def encode(
    ring_set: lbcore.RingSet,
    *,
    generation: int,
    now_ns: int,
    slots: np.ndarray,
    freed_ns: np.ndarray,
    zones: list[str],
    nodes: list[str],
    ejected: np.ndarray,
    ejections: Ejections,
    outlier_panic: bool,
    knobs: Knobs,
    zone: ZoneCurve | None = None,
) -> Encoded:
    """Lay out a table (the arguments are :meth:`~shm.tables.TableWriter.publish`'s, checked)."""
    eps = ring_set.endpoints
    n = len(eps)
    rings = ring_set.rings
    if n and len(rings) != len(ring_set.starts_ns) + 1:
        raise TableInputError(
            f"ring set has {len(rings)} rings for {len(ring_set.starts_ns)} fading events"
        )
    if len(rings) > _MAX_RINGS or n > _MAX_ENDPOINTS:
        raise TableInputError(
            f"table too large: {n} endpoints, {len(rings)} rings "
            f"(limits {_MAX_ENDPOINTS} endpoints, {_MAX_RINGS} rings)"
        )
    hdr = np.zeros(1, dtype=PAYLOAD_HEADER)
    h = hdr[0]
    h["magic"] = MAGIC_PAYLOAD
    h["generation"] = generation
    h["published_ns"] = now_ns
    h["publisher_pid"] = os.getpid()
    h["endpoints"] = n
    h["rings"] = len(rings)
    h["vnodes"] = ring_set.vnodes
    h["slots"] = freed_ns.size
    h["fade_duration_ns"] = ring_set.duration_ns
    h["fade_exponent"] = ring_set.exponent
    h["enabled"] = int(bool(knobs.enabled))
    h["percentage"] = knobs.percentage
    h["balance_factor"] = math.nan if knobs.balance_factor is None else knobs.balance_factor
    h["max_hops"] = -1 if knobs.max_hops is None else int(knobs.max_hops)
    h["load_signal"] = knobs.load_signal.encode("ascii")
    h["fade_mode"] = knobs.fade_mode.encode("ascii")
    h["outlier_panic"] = int(bool(outlier_panic))
    zone = ZoneCurve() if zone is None else zone
    _encode_zone(h, zone)
    ej = ejections
    sections: list[tuple[str, memoryview]] = [
        ("addresses", memoryview(_blob(eps, "endpoint addresses"))),
        ("zones", memoryview(_blob(zones, "zones"))),
        ("nodes", memoryview(_blob(nodes, "node names"))),
        ("slot", _bytes_of(slots.astype(np.int32))),
        ("ejected", _bytes_of(ejected.astype(np.uint8))),
        ("eject_reason", _bytes_of(ej.reason.astype(np.uint8))),
        ("eject_until_ns", _bytes_of(ej.until_ns.astype(np.int64))),
        ("eject_multiplier", _bytes_of(ej.multiplier.astype(np.int32))),
        ("eject_decay_ns", _bytes_of(ej.decay_ns.astype(np.int64))),
        ("ejections", _bytes_of(ej.counts.astype(np.int64))),
        ("tier", _bytes_of(np.asarray(ring_set.tiers, dtype=np.int32))),
        ("starts_ns", _bytes_of(np.array(ring_set.starts_ns, dtype=np.int64))),
        ("slot_freed_ns", _bytes_of(freed_ns)),
        ("ring_nodes", _bytes_of(np.array([len(r) for r in rings], dtype=np.int64))),
        ("caller_zone", memoryview(_blob([zone.zone], "the caller's zone"))),
    ]
    for k, ring in enumerate(rings):
        arrays = {"hashes": (ring.hashes, np.uint64), "owners": (ring.owners, np.int32)}
        arrays["buckets"] = (ring.buckets, np.int32)
        for name, _ in ring_sections(k):
            arr, dt = arrays[name.split(".")[1]]
            sections.append((name, _bytes_of(np.asarray(arr, dtype=dt))))
    h["sections"] = len(sections)
    return Encoded(hdr, sections)


def _encode_zone(h: np.void, zone: ZoneCurve) -> None:
    if not isinstance(zone, ZoneCurve):
        raise TableInputError(f"zone must be a shm.tables.ZoneCurve, got {type(zone).__name__}")
    h["zone_affinity"] = int(bool(zone.affinity))
    h["zone_min_pods"] = int(zone.min_pods)
    h["zone_state"] = zone.state_code()
    h["zone_reason"] = zone.reason_code()
    h["zone_start_ns"] = int(zone.start_ns)
    h["zone_x0"] = float(zone.x0)
    h["zone_rate"] = float(zone.rate)
    h["zone_cap"] = float(zone.cap)
    h["zone_transitions"] = int(zone.transitions)


class Decoder:
    """Checks one buffer's payload and builds the :class:`Table` of views over it."""

    def __init__(
        self,
        data: Segment,
        buffer: int,
        start: int,
        payload_bytes: int,
        host_keys: dict[str, str] | None = None,
    ) -> None:
        self.data = data
        self.buffer = buffer
        self.start = start
        self.nbytes = payload_bytes
        self.where = f"buffer {buffer}"
        # endpoint -> lbcore.host_key of the previous generation a reader decoded: a new
        # generation mostly repeats its endpoints, and parsing every URL again is costly.
        self.host_keys = {} if host_keys is None else host_keys
        self.on_host_keys: Callable[[dict[str, str]], None] | None = None

    def host_ids(self, eps: tuple[str, ...]) -> np.ndarray:
        """Per endpoint, the id of its host identity (what ``lbcore.ring.host_ids_of`` gives).

        Computed once for all rings of the table, from the previous generation's
        :attr:`host_keys` where an endpoint repeats; :attr:`host_keys` then becomes the
        keys of exactly these endpoints (the next generation's decoder starts from them).
        """
        known = self.host_keys
        keys: dict[str, str] = {}
        ids: dict[str, int] = {}
        out = np.empty(len(eps), dtype=np.intp)
        for i, ep in enumerate(eps):
            key = known.get(ep)
            if key is None:
                key = host_key(ep)
            keys[ep] = key
            out[i] = ids.setdefault(key, len(ids))
        out.flags.writeable = False
        self.host_keys = keys
        if self.on_host_keys is not None:
            self.on_host_keys(keys)
        return out

    def fail(self, message: str) -> SegmentLayoutError:
        """The error for a payload found inconsistent (``message`` says how)."""
        return SegmentLayoutError(self.data.name, f"{self.where}: {message}")

    def decode(self, generation: int) -> Table:
        """Validate the payload and build the :class:`Table` of zero-copy views over it."""
        data, start = self.data, self.start
        if self.nbytes < DIRECTORY_OFFSET:
            raise self.fail(f"payload of {self.nbytes} bytes is shorter than a table header")
        h = data.array(PAYLOAD_HEADER, start, 1).copy()[0]
        if int(h["magic"]) != MAGIC_PAYLOAD:
            raise self.fail("payload does not start with the table magic")
        if int(h["generation"]) != generation:
            raise self.fail(
                f"payload is generation {int(h['generation'])}, buffer header says {generation}"
            )
        self.where = f"buffer {self.buffer} generation {generation}"
        n = int(h["endpoints"])
        n_rings = int(h["rings"])
        vnodes = int(h["vnodes"])
        n_slots = int(h["slots"])
        if n > _MAX_ENDPOINTS or n_rings > _MAX_RINGS or not 1 <= vnodes <= _MAX_VNODES:
            raise self.fail(f"counts out of range: {n} endpoints, {n_rings} rings, {vnodes} vnodes")
        if (n == 0) != (n_rings == 0):
            raise self.fail(f"{n} endpoints but {n_rings} rings")
        if n_slots > _MAX_ENDPOINTS * 4 or n_slots < n:
            raise self.fail(f"{n_slots} counter slots for {n} endpoints")
        n_sections = int(h["sections"])
        expect = table_sections(n_rings)
        if n_sections != expect:
            raise self.fail(f"{n_sections} sections, expected {expect} for {n_rings} rings")
        directory = data.array(SECTION, start + DIRECTORY_OFFSET, n_sections).copy()
        first = align(DIRECTORY_OFFSET + SECTION.itemsize * n_sections, 64)
        names = [name for name, _ in TABLE_SECTIONS]
        dtypes = [dt for _, dt in TABLE_SECTIONS]
        for k in range(n_rings):
            for name, dt in ring_sections(k):
                names.append(name)
                dtypes.append(dt)
        views: dict[str, Any] = {}
        for (off, nbytes), name, dt in zip(directory.tolist(), names, dtypes, strict=True):
            if off % 8 or off < first or off + nbytes > self.nbytes:
                raise self.fail(
                    f"section {name!r} at offset {off} with {nbytes} bytes lies outside the "
                    f"{self.nbytes}-byte payload"
                )
            if dt is None:
                views[name] = data.buf[start + off : start + off + nbytes]
            else:
                item = np.dtype(dt).itemsize
                if nbytes % item:
                    raise self.fail(f"section {name!r} is {nbytes} bytes, not a multiple of {item}")
                views[name] = data.array(dt, start + off, nbytes // item)

        def count(name: str, expected: int) -> np.ndarray:
            arr = views[name]
            if arr.size != expected:
                raise self.fail(f"section {name!r} has {arr.size} entries, expected {expected}")
            return arr

        def owned(name: str, expected: int) -> np.ndarray:
            # Per-endpoint values are copied before they are checked: any process of the
            # user can write the segment after the check, and these size and index
            # arrays (a slot of 0x7FFFFFF0 must not become a 16 GiB padding). The ring
            # arrays stay views (too large to copy per generation); the kernel bounds
            # every index it reads from them.
            arr = count(name, expected).copy()
            arr.flags.writeable = False  # immutable like the views it stands for
            return arr

        eps = self._strings(views["addresses"], n, "addresses")
        zones = self._strings(views["zones"], n, "zones")
        nodes = self._strings(views["nodes"], n, "nodes")
        if "" in eps:  # (one C-level scan; a generator holds the GIL far longer)
            raise self.fail("an endpoint address is empty")
        slots = owned("slot", n)
        if n and (int(slots.min()) < 0 or int(slots.max()) >= n_slots):
            raise self.fail(f"endpoint slots must be in 0..{n_slots - 1}")
        if n and int(np.bincount(slots, minlength=n_slots).max()) > 1:
            raise self.fail("two endpoints share a counter slot")
        ejected_u8 = owned("ejected", n)
        if n and int(ejected_u8.max()) > 1:
            raise self.fail("ejected flags must be 0 or 1")
        ejections = self._ejections(owned, n)
        panic = int(h["outlier_panic"])
        if panic not in (0, 1):
            raise self.fail(f"outlier panic flag must be 0 or 1, got {panic}")
        tiers = owned("tier", n)
        if n and (int(tiers.min()) < 0 or int(tiers.max()) >= n_rings):
            raise self.fail(f"endpoint tiers must be in 0..{n_rings - 1}")
        starts = owned("starts_ns", max(n_rings - 1, 0))
        if starts.size > 1 and bool((np.diff(starts) < 0).any()):
            raise self.fail("fading events are not ordered oldest first")
        freed = owned("slot_freed_ns", n_slots)
        ring_nodes = owned("ring_nodes", n_rings)
        duration = int(h["fade_duration_ns"])
        exponent = float(h["fade_exponent"])
        if duration < 0 or not math.isfinite(exponent) or exponent <= 0:
            raise self.fail(f"fade duration {duration} ns / exponent {exponent} out of range")
        rings = []
        # Host identities are per endpoint, not per ring: one parse serves every ring.
        host_ids = self.host_ids(eps) if n else None
        newest = int(ring_nodes[-1]) if n_rings else 0
        if n_rings and not 1 <= newest <= n * vnodes:
            raise self.fail(f"newest ring has {newest} nodes for {n} endpoints x {vnodes} vnodes")
        for k in range(n_rings):
            m = int(ring_nodes[k])
            hn, bn = f"ring{k}.hashes", f"ring{k}.buckets"
            if not 1 <= m <= newest:
                raise self.fail(f"ring {k} has {m} nodes, its newest ring {newest}")
            hashes = count(hn, m)
            buckets = views[bn]
            bits = buckets.size.bit_length() - 1
            if buckets.size != 1 << bits or not _MIN_BUCKET_BITS <= bits <= _MAX_BUCKET_BITS:
                raise self.fail(
                    f"ring {k} bucket table has {buckets.size} entries, expected a power of two "
                    f"from 2**{_MIN_BUCKET_BITS} to 2**{_MAX_BUCKET_BITS}"
                )
            if m > 1 and bool((hashes[1:] < hashes[:-1]).any()):
                raise self.fail(f"ring {k} hashes are not sorted")
            owners = count(f"ring{k}.owners", m)
            if int(owners.min()) < 0 or int(owners.max()) >= n:
                raise self.fail(f"ring {k} owners must be endpoint indices 0..{n - 1}")
            if int(tiers.take(owners).max()) > k:
                raise self.fail(f"ring {k} holds endpoints of a newer fading event")
            # Entries: e >= 0 a ring position; -1 "search"; e <= -2 the one node -e - 2.
            if int(buckets.min()) < -(m + 1) or int(buckets.max()) >= m:
                raise self.fail(f"ring {k} bucket table points outside the ring")
            rings.append(
                lbcore.Ring.from_arrays(
                    eps, hashes, owners, vnodes=vnodes, buckets=buckets, host_ids=host_ids
                )
            )
        knobs = self._knobs(h)
        zone = self._zone(h, views["caller_zone"])
        t = Table.__new__(Table)
        t._mapped = None  # set by the reader once its sequence word checks out
        t.generation = generation
        t.published_ns = int(h["published_ns"])
        t.publisher_pid = int(h["publisher_pid"])
        t.endpoints = eps
        t.zones = zones
        t.nodes = nodes
        t.slots = slots
        t.ejected = ejected_u8.view(np.bool_)
        t.ejections = ejections
        t.outlier_panic = bool(panic)
        t.knobs = knobs
        t.zone = zone
        t.n_slots = n_slots
        t.slot_freed_ns = freed
        t.segment = data.name
        t.buffer = self.buffer
        t.buffer_offset = self.start - BUFFER_HEADER_BYTES
        t.payload_bytes = self.nbytes
        if n_rings:
            t.ring_set = lbcore.RingSet.from_parts(
                eps,
                tiers,
                tuple(starts.tolist()),
                tuple(rings),
                duration_ns=duration,
                exponent=exponent,
                vnodes=vnodes,
            )
        else:
            t.ring_set = lbcore.RingSet((), duration_ns=duration, exponent=exponent)
        return t

    def _strings(self, blob: memoryview, n: int, what: str) -> tuple[str, ...]:
        if n == 0:
            if blob.nbytes:
                raise self.fail(f"section {what!r} holds text for an empty table")
            return ()
        try:
            out = bytes(blob).decode("utf-8").split("\0")
        except UnicodeDecodeError as exc:
            raise self.fail(f"section {what!r} is not valid UTF-8: {exc}") from exc
        if len(out) != n:
            raise self.fail(f"section {what!r} holds {len(out)} strings, expected {n}")
        return tuple(out)

    def _ejections(self, count: Callable[[str, int], np.ndarray], n: int) -> Ejections:
        reason = count("eject_reason", n)
        names = ("eject_until_ns", "eject_multiplier", "eject_decay_ns")
        parts = [count(name, n) for name in names]
        counts = count("ejections", n * len(EJECT_REASONS)).reshape(n, len(EJECT_REASONS))
        if n and int(reason.max()) > len(EJECT_REASONS):
            raise self.fail(f"ejection reasons must be 0..{len(EJECT_REASONS)}")
        if n and min(int(p.min()) for p in (*parts, counts)) < 0:
            raise self.fail("ejection times, multipliers and counts must be >= 0")
        return Ejections(reason, *parts, counts)

    def _zone(self, h: np.void, blob: memoryview) -> ZoneCurve:
        state, reason = int(h["zone_state"]), int(h["zone_reason"])
        affinity = int(h["zone_affinity"])
        if state >= len(ZONE_STATES) or reason >= len(ZONE_REASONS) or affinity not in (0, 1):
            raise self.fail(
                f"zone record out of range: state {state}, reason {reason}, affinity {affinity}"
            )
        try:
            name = bytes(blob).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"section 'caller_zone' is not valid UTF-8: {exc}") from exc
        if "\0" in name:
            raise self.fail("section 'caller_zone' holds more than one name")
        try:
            return ZoneCurve(
                zone=name,
                affinity=bool(affinity),
                min_pods=int(h["zone_min_pods"]),
                state=ZONE_STATES[state],
                reason=ZONE_REASONS[reason],
                start_ns=int(h["zone_start_ns"]),
                x0=float(h["zone_x0"]),
                rate=float(h["zone_rate"]),
                cap=float(h["zone_cap"]),
                transitions=int(h["zone_transitions"]),
            )
        except TableInputError as exc:
            raise self.fail(str(exc)) from exc

    def _knobs(self, h: np.void) -> Knobs:
        enabled = int(h["enabled"])
        bf = float(h["balance_factor"])
        hops = int(h["max_hops"])
        try:
            signal = bytes(h["load_signal"]).rstrip(b"\0").decode("ascii")
            fade_mode = bytes(h["fade_mode"]).rstrip(b"\0").decode("ascii")
        except UnicodeDecodeError as exc:
            raise self.fail("load signal or fade mode name is not ASCII") from exc
        if enabled not in (0, 1) or (hops != -1 and hops < 1):
            raise self.fail(f"knobs out of range: enabled={enabled}, max_hops={hops}")
        try:
            return Knobs(
                enabled=bool(enabled),
                percentage=float(h["percentage"]),
                balance_factor=None if math.isnan(bf) else bf,
                max_hops=None if hops == -1 else hops,
                load_signal=signal,
                fade_mode=fade_mode,
            )
        except TableInputError as exc:
            raise self.fail(str(exc)) from exc
