"""Decoding an ``OrcaLoadReport`` protobuf by hand (the ``BIN`` form of a load report).

Only the fields cslb reads, from ``xds/data/orca/v3/orca_load_report.proto``: doubles
``cpu_utilization`` (1), ``mem_utilization`` (2), ``rps_fractional`` (6), ``eps`` (7),
``application_utilization`` (9), and the ``map<string, double>`` fields ``utilization`` (5)
and ``named_metrics`` (8). Other fields (the deprecated ``rps``, ``request_cost``, fields a
newer proto adds) are skipped by their wire type. No protobuf dependency: a pod's report is
a few dozen bytes, and a hand decoder can refuse what a lenient library would accept (a
field repeated, a map key given twice, a truncated message) with a reason to log.

Values are not range-checked here: :mod:`lbwire.orca` checks every value of every
form alike.
"""

from __future__ import annotations

import struct

__all__ = ["ProtoError", "decode_report"]

_DOUBLES = {
    1: "cpu_utilization",
    2: "mem_utilization",
    6: "rps_fractional",
    7: "eps",
    9: "application_utilization",
}
_MAPS = {5: "utilization", 8: "named_metrics"}
_F64 = struct.Struct("<d")


class ProtoError(ValueError):
    """The bytes are not a well-formed ``OrcaLoadReport``; the message says why."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    for n in range(10):  # a 64-bit varint takes at most 10 bytes
        if i + n >= len(buf):
            raise ProtoError("truncated varint")
        b = buf[i + n]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + n + 1
        shift += 7
    raise ProtoError("varint longer than 10 bytes")


def _fields(buf: bytes):  # yields (field, wire type, payload)
    i, end = 0, len(buf)
    while i < end:
        tag, i = _varint(buf, i)
        field, wt = tag >> 3, tag & 7
        if field == 0:
            raise ProtoError("field number 0")
        if wt == 0:
            value, i = _varint(buf, i)
            yield field, wt, value
        elif wt == 1:
            if i + 8 > end:
                raise ProtoError(f"truncated 64-bit field {field}")
            yield field, wt, _F64.unpack_from(buf, i)[0]
            i += 8
        elif wt == 2:
            n, i = _varint(buf, i)
            if i + n > end:
                raise ProtoError(f"truncated length-delimited field {field}")
            yield field, wt, buf[i : i + n]
            i += n
        elif wt == 5:
            if i + 4 > end:
                raise ProtoError(f"truncated 32-bit field {field}")
            i += 4
            yield field, wt, None
        else:  # groups (3, 4) are not in this proto; 6 and 7 do not exist
            raise ProtoError(f"wire type {wt} in field {field}")


def _map_entry(buf: bytes, name: str) -> tuple[str, float]:
    key: str | None = None
    value = 0.0  # proto3: an absent value is the default
    seen: set[int] = set()
    for field, wt, payload in _fields(buf):
        if field in seen:
            raise ProtoError(f"{name} entry repeats field {field}")
        seen.add(field)
        if field == 1:
            if wt != 2:
                raise ProtoError(f"{name} key has wire type {wt}")
            try:
                key = payload.decode("utf-8")  # type: ignore[union-attr]
            except UnicodeDecodeError:
                raise ProtoError(f"{name} key is not UTF-8") from None
        elif field == 2:
            if wt != 1:
                raise ProtoError(f"{name} value has wire type {wt}")
            value = payload  # type: ignore[assignment]
    if not key:
        raise ProtoError(f"{name} entry without a key")
    return key, value


def decode_report(buf: bytes) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Decode the fields cslb reads from a serialized ``OrcaLoadReport``.

    Parameters
    ----------
    buf
        The message bytes (base64 already decoded).

    Returns
    -------
    tuple
        ``(scalars, maps)``: the double fields present, by name; the two maps
        (``utilization``, ``named_metrics``), each possibly empty.

    Raises
    ------
    ProtoError
        Truncated or malformed wire data, a known field with the wrong wire type, a
        scalar field given twice, a map key given twice, an entry without a key.
    """
    scalars: dict[str, float] = {}
    maps: dict[str, dict[str, float]] = {"utilization": {}, "named_metrics": {}}
    for field, wt, payload in _fields(bytes(buf)):
        name = _DOUBLES.get(field)
        if name is not None:
            if wt != 1:
                raise ProtoError(f"{name} has wire type {wt}, expected 1 (double)")
            if name in scalars:
                raise ProtoError(f"duplicate {name}")
            scalars[name] = payload  # type: ignore[assignment]
            continue
        mname = _MAPS.get(field)
        if mname is not None:
            if wt != 2:
                raise ProtoError(f"{mname} has wire type {wt}, expected 2 (map entry)")
            key, value = _map_entry(payload, mname)  # type: ignore[arg-type]
            if key in maps[mname]:
                raise ProtoError(f"duplicate {mname}.{key[:40]}")
            maps[mname][key] = value
    return scalars, maps
