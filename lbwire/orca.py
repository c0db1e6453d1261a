"""The load-report wire format, one module for both sides: pods write it, callers read it.

A response may carry

* ``endpoint-load-metrics``: an ORCA load report in one of the spec's three HTTP forms,
  ``TEXT application_utilization=0.41, rps_fractional=120, eps=0, named_metrics.occupancy=3.3``,
  ``JSON {"application_utilization": 0.41, "named_metrics": {"occupancy": 3.3}}`` or
  ``BIN <base64 of the OrcaLoadReport protobuf>``; or ``endpoint-load-metrics-bin: <base64>``
  (gRPC's binary header, which Envoy also reads);
* ``Server-Timing`` (W3C): ``app;dur=1.93`` is this request's service time in
  milliseconds, as the pod measured it.

Reading is strict where Envoy's ORCA parser is (more than one form in a response, a
duplicate key, NaN or infinity) and stricter where cslb feeds the numbers to bounded
load: a negative value, a value above :data:`MAX_VALUE`, an unparseable one, or a header
over :data:`MAX_HEADER_BYTES` makes the report *malformed*. Nothing here raises on what
a pod sends: every parser returns a :class:`ResponseLoad` whose ``malformed`` says why a
report was refused, short enough for a log line. Keys a newer pod may add (``rps``,
``request_cost``, unknown ``TEXT`` keys) are ignored, but their values must still be
numbers. ``TEXT`` accepts ``key=value`` (the spec) and ``key:value`` (what Envoy's
parser splits on).

Callers holding libcurl's raw header block use :func:`parse_header_block` (or
:func:`split_header_block` to memoize the report's parse): when neither
header is present it costs one lower-cased copy and two ``bytes.find`` calls, and no
Python work per header line.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from lbwire.protowire import ProtoError, decode_report

__all__ = [
    "LOAD_HEADER",
    "LOAD_HEADER_BIN",
    "LOAD_PATH",
    "MAX_HEADER_BYTES",
    "MAX_VALUE",
    "TIMING_HEADER",
    "LoadReport",
    "ResponseLoad",
    "format_report",
    "format_server_timing",
    "parse_header_block",
    "parse_load_report",
    "parse_response_headers",
    "parse_server_timing",
    "split_header_block",
]

LOAD_HEADER = "endpoint-load-metrics"
#: The pods' load-only path (the middleware's default ``CSLB_POD_LOAD_PATH``): a ``GET``
#: answered with the pod's load report and no body of the app's, so a caller (the
#: discovery process) can refresh the report of a pod it no longer calls.
LOAD_PATH = "/.well-known/cslb/load"
LOAD_HEADER_BIN = "endpoint-load-metrics-bin"
TIMING_HEADER = "server-timing"
#: Longest header value read, in bytes (all lines of one header together); longer is malformed.
MAX_HEADER_BYTES = 8192
#: Largest value accepted: no utilization, rate or duration of a pod comes near it, and a
#: larger one would only be a way to pin a pod as infinitely loaded.
MAX_VALUE = 1e12

_SCALARS = (
    "application_utilization",
    "cpu_utilization",
    "mem_utilization",
    "rps_fractional",
    "eps",
)
_CAMEL = {
    "applicationUtilization": "application_utilization",
    "cpuUtilization": "cpu_utilization",
    "memUtilization": "mem_utilization",
    "rpsFractional": "rps_fractional",
    "namedMetrics": "named_metrics",
}
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?")
_TEXT_ITEM = re.compile(r"([A-Za-z0-9_.\-]{1,128})[ \t]*[=:][ \t]*([^ \t]*)")
_EMPTY_MAP: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class LoadReport:
    """A valid load report: each field ``None`` when the pod did not send it.

    Utilizations are fractions of the pod's capacity (may exceed 1), rates per second;
    ``named_metrics['occupancy']`` (:attr:`occupancy`) is cslb's busy-seconds per second.
    ``form`` is ``"TEXT"``, ``"JSON"``, ``"BIN"`` or ``"BIN-HEADER"``
    (``endpoint-load-metrics-bin``).
    """

    form: str
    application_utilization: float | None = None
    cpu_utilization: float | None = None
    mem_utilization: float | None = None
    rps_fractional: float | None = None
    eps: float | None = None
    named_metrics: Mapping[str, float] = field(default_factory=lambda: _EMPTY_MAP)
    utilization: Mapping[str, float] = field(default_factory=lambda: _EMPTY_MAP)

    @property
    def occupancy(self) -> float | None:
        """``named_metrics.occupancy``: the pod's busy-seconds per second, if sent."""
        return self.named_metrics.get("occupancy")


@dataclass(frozen=True, slots=True)
class ResponseLoad:
    """What one response said about its pod's load.

    Attributes
    ----------
    report : LoadReport or None
        The valid load report; ``None`` when absent or malformed.
    service_time_s : float or None
        ``Server-Timing``'s ``app`` duration in seconds; ``None`` when absent or invalid.
    malformed : str
        Why the load report was refused (empty when valid or absent): count it, log it.
    timing_malformed : str
        Why ``Server-Timing`` was refused (empty when valid or absent).
    """

    report: LoadReport | None = None
    service_time_s: float | None = None
    malformed: str = ""
    timing_malformed: str = ""


_NOTHING = ResponseLoad()


# ------------------------------------------------------------------------------------
# Writing (pods).


def _num(name: str, value: float) -> str:
    v = float(value)
    if not (math.isfinite(v) and 0.0 <= v <= MAX_VALUE):
        raise ValueError(f"{name} must be finite, >= 0 and <= {MAX_VALUE:g}, got {value!r}")
    return f"{v:.6g}"


def format_report(
    application_utilization: float,
    rps_fractional: float,
    eps: float,
    occupancy: float,
    named_metrics: Mapping[str, float] | None = None,
) -> str:
    """The ``endpoint-load-metrics`` value cslb's middleware sends, in the ``TEXT`` form.

    Parameters
    ----------
    application_utilization
        Occupancy divided by the pod's capacity (a fraction; above 1 when overloaded).
    rps_fractional, eps
        Requests and errors per second.
    occupancy
        Busy-seconds per second, sent as ``named_metrics.occupancy``.
    named_metrics
        More named metrics to send (names of ``A-Z a-z 0-9 _ . -``).

    Raises
    ------
    ValueError
        A value negative, non-finite or above :data:`MAX_VALUE`, or a bad metric name.
    """
    parts = [
        f"application_utilization={_num('application_utilization', application_utilization)}",
        f"rps_fractional={_num('rps_fractional', rps_fractional)}",
        f"eps={_num('eps', eps)}",
        f"named_metrics.occupancy={_num('occupancy', occupancy)}",
    ]
    for name, value in (named_metrics or {}).items():
        if name == "occupancy" or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,100}", name):
            raise ValueError(f"named metric name {name!r} is taken or not [A-Za-z0-9_.-]{{1,100}}")
        parts.append(f"named_metrics.{name}={_num(name, value)}")
    return "TEXT " + ", ".join(parts)


def format_server_timing(service_time_s: float) -> str:
    """``app;dur=<milliseconds>``: the ``Server-Timing`` value for one request."""
    return f"app;dur={max(0.0, service_time_s) * 1e3:.3f}"


# ------------------------------------------------------------------------------------
# Reading (callers).


class _MalformedError(Exception):
    pass


def _value(key: str, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise _MalformedError(f"{key[:40]}: not a number")
    if isinstance(raw, str):
        if not _NUMBER.fullmatch(raw):
            if raw.lstrip("+-").lower() in ("nan", "inf", "infinity"):
                raise _MalformedError(f"{key[:40]}: non-finite value")
            raise _MalformedError(f"{key[:40]}: unparseable value {raw[:20]!r}")
    try:
        v = float(raw)
    except OverflowError:
        raise _MalformedError(f"{key[:40]}: value out of range") from None
    if math.isnan(v) or math.isinf(v):
        raise _MalformedError(f"{key[:40]}: non-finite value")
    if v < 0.0:
        raise _MalformedError(f"{key[:40]}: negative value")
    if v > MAX_VALUE:
        raise _MalformedError(f"{key[:40]}: value above {MAX_VALUE:g}")
    return v


def _report(
    form: str, scalars: Mapping[str, Any], maps: Mapping[str, Mapping[str, Any]]
) -> LoadReport:
    vals = {k: _value(k, v) for k, v in scalars.items()}
    named = {k: _value("named_metrics." + k, v) for k, v in maps.get("named_metrics", {}).items()}
    util = {k: _value("utilization." + k, v) for k, v in maps.get("utilization", {}).items()}
    return LoadReport(
        form,
        named_metrics=MappingProxyType(named) if named else _EMPTY_MAP,
        utilization=MappingProxyType(util) if util else _EMPTY_MAP,
        **vals,
    )


def _text(body: str) -> LoadReport:
    scalars: dict[str, str] = {}
    maps: dict[str, dict[str, str]] = {"named_metrics": {}, "utilization": {}}
    seen: set[str] = set()
    for item in body.split(","):
        item = item.strip(" \t")
        if not item:
            continue
        m = _TEXT_ITEM.fullmatch(item)
        if m is None:
            raise _MalformedError(f"TEXT item {item[:30]!r} is not key=value")
        key, raw = m.groups()
        if key in seen:
            raise _MalformedError(f"duplicate key {key[:40]}")
        seen.add(key)
        prefix, dot, name = key.partition(".")
        if key in _SCALARS:
            scalars[key] = raw
        elif dot and prefix in maps:
            if not name:
                raise _MalformedError(f"empty {prefix} name")
            maps[prefix][name] = raw
        else:
            _value(key, raw)  # unknown keys are skipped, but must hold numbers
    return _report("TEXT", scalars, maps)


def _no_constants(name: str) -> float:
    raise _MalformedError(f"JSON {name}: non-finite value")


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _MalformedError(f"duplicate key {k[:40]}")
        out[k] = v
    return out


def _json(body: str) -> LoadReport:
    try:
        doc = json.loads(body, object_pairs_hook=_json_object, parse_constant=_no_constants)
    except _MalformedError:
        raise
    except (ValueError, RecursionError):
        raise _MalformedError("JSON unparseable") from None
    if not isinstance(doc, dict):
        raise _MalformedError("JSON is not an object")
    scalars: dict[str, Any] = {}
    maps: dict[str, dict[str, Any]] = {}
    for key, value in doc.items():
        name = _CAMEL.get(key, key)
        if name in scalars or name in maps:
            raise _MalformedError(f"duplicate key {name}")
        if name in _SCALARS:
            scalars[name] = value
        elif name in ("named_metrics", "utilization"):
            if not isinstance(value, dict) or "" in value:
                raise _MalformedError(f"JSON {name} is not an object of named values")
            maps[name] = value
    return _report("JSON", scalars, maps)


def _bin(b64: str, form: str) -> LoadReport:
    text = b64.strip(" \t")
    if not text:
        raise _MalformedError("empty BIN value")
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise _MalformedError("BIN value is not base64") from None
    try:
        scalars, maps = decode_report(raw)
    except ProtoError as exc:
        raise _MalformedError(f"BIN protobuf: {str(exc)[:60]}") from None
    return _report(form, scalars, maps)


def _as_list(values: str | bytes | Iterable[str | bytes] | None) -> list[str]:
    if values is None:
        return []
    if isinstance(values, (str, bytes, bytearray)):
        values = [values]
    return [v.decode("latin-1") if isinstance(v, (bytes, bytearray)) else str(v) for v in values]


def _load(metrics: list[str], metrics_bin: list[str]) -> tuple[LoadReport | None, str]:
    if not metrics and not metrics_bin:
        return None, ""
    if len(metrics) + len(metrics_bin) > 1:
        return None, "more than one load report in the response"
    value = (metrics or metrics_bin)[0]
    if len(value) > MAX_HEADER_BYTES:
        return None, f"header over {MAX_HEADER_BYTES} bytes"
    try:
        if metrics_bin:
            return _bin(value, "BIN-HEADER"), ""
        value = value.strip(" \t")
        form, _, body = value.partition(" ")
        if form == "TEXT":
            return _text(body), ""
        if form == "JSON":
            return _json(body), ""
        if form == "BIN":
            return _bin(body, "BIN"), ""
        return None, f"unknown format {form[:8]!r}"
    except _MalformedError as exc:
        return None, str(exc)
    except Exception as exc:  # hostile input never raises into a call
        return None, f"unreadable ({type(exc).__name__})"


def parse_load_report(
    metrics: str | bytes | Iterable[str | bytes] | None = None,
    metrics_bin: str | bytes | Iterable[str | bytes] | None = None,
) -> ResponseLoad:
    """Parse a response's load report.

    Parameters
    ----------
    metrics
        The ``endpoint-load-metrics`` value, or every line of it (a list).
    metrics_bin
        The ``endpoint-load-metrics-bin`` value, or every line of it.

    Returns
    -------
    ResponseLoad
        ``report`` set when valid; ``malformed`` saying why not otherwise (both empty
        when the response carried no report). Never raises on what a pod sent.
    """
    report, why = _load(_as_list(metrics), _as_list(metrics_bin))
    return ResponseLoad(report=report, malformed=why)


_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_PARAM = re.compile(rf"[ \t]*;[ \t]*({_TOKEN})(?:[ \t]*=[ \t]*({_TOKEN}|{_QUOTED}))?")
_PARAMS = rf"(?:[ \t]*;[ \t]*{_TOKEN}(?:[ \t]*=[ \t]*(?:{_TOKEN}|{_QUOTED}))?)*"
_METRIC = re.compile(rf"[ \t]*({_TOKEN})({_PARAMS})[ \t]*(?:,|$)")
_APP_DUR = re.compile(r"app;dur=([0-9]{1,15}(?:\.[0-9]{1,9})?)")


def parse_server_timing(
    values: str | bytes | Iterable[str | bytes] | None,
) -> tuple[float | None, str]:
    """The ``app`` metric's ``dur`` from ``Server-Timing``, in seconds.

    W3C syntax: metrics separated by commas, each with ``;name=value`` parameters (a
    token or a quoted string), over one or several header lines. The first ``app``
    metric that carries a ``dur`` counts (the W3C rule for a repeated parameter, applied
    to a repeated metric); other metrics are ignored.

    Returns
    -------
    tuple
        ``(seconds, "")``; ``(None, "")`` when no ``app;dur`` is present; ``(None,
        reason)`` when the header is unparseable, over :data:`MAX_HEADER_BYTES`, or the
        duration is negative, non-finite or above :data:`MAX_VALUE` ms.
    """
    lines = _as_list(values)
    if not lines:
        return None, ""
    if len(lines) == 1:
        # The form the middleware writes (format_server_timing), one regex match; any
        # other text takes the general path below (same result for this form).
        m = _APP_DUR.fullmatch(lines[0])
        if m is not None:
            try:
                return _value("Server-Timing app;dur", m.group(1)) / 1e3, ""
            except _MalformedError as exc:
                return None, str(exc)
    text = ", ".join(lines)
    if len(text) > MAX_HEADER_BYTES:
        return None, f"Server-Timing over {MAX_HEADER_BYTES} bytes"
    try:
        pos, end = 0, len(text)
        while pos < end:
            m = _METRIC.match(text, pos)
            if m is None or m.end() == pos:
                return None, "Server-Timing unparseable"
            pos = m.end()
            if m.group(1) != "app":
                continue
            for p in _PARAM.finditer(m.group(2)):
                if p.group(1).lower() == "dur":
                    raw = (p.group(2) or "0").strip('"')
                    return _value("Server-Timing app;dur", raw) / 1e3, ""
        return None, ""
    except _MalformedError as exc:
        return None, str(exc)
    except Exception as exc:  # hostile input never raises into a call
        return None, f"Server-Timing unreadable ({type(exc).__name__})"


def _combine(metrics: list[str], metrics_bin: list[str], timing: list[str]) -> ResponseLoad:
    if not (metrics or metrics_bin or timing):
        return _NOTHING
    report, why = _load(metrics, metrics_bin)
    dur, twhy = parse_server_timing(timing)
    return ResponseLoad(report, dur, why, twhy)


def parse_response_headers(headers: Iterable[tuple[str | bytes, str | bytes]]) -> ResponseLoad:
    """Both headers from a response's ``(name, value)`` pairs, repeated names included.

    Pass every line: ``response.headers.multi_items()`` (httpx),
    ``response.headers.iteritems()`` (urllib3), ``list(msg.items())`` (http.client).
    """
    metrics: list[str] = []
    metrics_bin: list[str] = []
    timing: list[str] = []
    by_name = {LOAD_HEADER: metrics, LOAD_HEADER_BIN: metrics_bin, TIMING_HEADER: timing}
    for name, value in headers:
        key = (name.decode("latin-1") if isinstance(name, (bytes, bytearray)) else name).lower()
        bucket = by_name.get(key.strip())
        if bucket is not None:
            bucket.append(
                value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else value
            )
    return _combine(metrics, metrics_bin, timing)


_LINE = re.compile(rb"\n(endpoint-load-metrics(?:-bin)?|server-timing)[ \t]*:[ \t]*([^\r\n]*)")
_COLON = re.compile(rb"[ \t]*:[ \t]*")


def _one_line(raw: bytes, low: bytes, at: int, name: bytes) -> list[str] | None:
    """The value of header ``name`` starting at ``at`` (``[]``: absent; ``None``: not plain)."""
    if at < 0:
        return []
    i = at + 1 + len(name)
    m = _COLON.match(low, i)
    if m is None:
        return None  # (a longer name, such as -bin, or no colon: the scan decides)
    j = m.end()
    ends = [p for p in (low.find(b"\r", j), low.find(b"\n", j)) if p >= 0]
    return [raw[j : min(ends) if ends else len(low)].rstrip(b" \t").decode("latin-1")]


def split_header_block(block: bytes) -> tuple[list[str], list[str], list[str]] | None:
    """The raw values of both headers in a raw header block (libcurl's, all lines).

    Returns ``(endpoint-load-metrics, endpoint-load-metrics-bin, server-timing)``
    lines of the block's last response, or ``None`` when neither header is present
    (one lower-cased copy and two ``bytes.find`` calls). For a caller that memoizes
    :func:`parse_load_report` by the raw report (a pod's report changes far less often
    than it answers) and reads ``Server-Timing`` per call.

    Raises
    ------
    Exception
        Only on a ``block`` that is not bytes-like (:func:`parse_header_block` catches).
    """
    raw = bytes(block)
    low = raw.lower()
    lm = low.find(b"\nendpoint-load-metrics")
    st = low.find(b"\nserver-timing")
    if lm < 0 and st < 0:
        return None
    start = max(low.rfind(b"\nhttp/"), 0)
    if (
        start < min(p for p in (lm, st) if p >= 0)
        and (lm < 0 or low.find(b"\nendpoint-load-metrics", lm + 1) < 0)
        and (st < 0 or low.find(b"\nserver-timing", st + 1) < 0)
    ):
        # One response, each header at most once (the common case): two slices instead
        # of a scan. Anything else (a repeated header, the -bin form) takes the scan.
        metrics = _one_line(raw, low, lm, b"endpoint-load-metrics")
        timing = _one_line(raw, low, st, b"server-timing")
        if metrics is not None and timing is not None:
            return metrics, [], timing
    lists: dict[bytes, list[str]] = {
        b"endpoint-load-metrics": [],
        b"endpoint-load-metrics-bin": [],
        b"server-timing": [],
    }
    for m in _LINE.finditer(low, start):
        a, b = m.span(2)
        lists[m.group(1)].append(bytes(block[a:b]).rstrip(b" \t").decode("latin-1"))
    return lists[b"endpoint-load-metrics"], lists[b"endpoint-load-metrics-bin"], lists[
        b"server-timing"
    ]


def parse_header_block(block: bytes) -> ResponseLoad:
    """Both headers from a raw header block, as libcurl hands it (all lines, one string).

    Only the last response of the block counts (after ``100 Continue`` or redirects,
    libcurl hands every response's headers). When neither header is present this is one
    lower-cased copy and two ``bytes.find`` calls, and returns a shared empty result.
    """
    try:
        parts = split_header_block(block)
        return _NOTHING if parts is None else _combine(*parts)
    except Exception as exc:  # a hostile block never raises into a call
        return ResponseLoad(malformed=f"header block unreadable ({type(exc).__name__})")
