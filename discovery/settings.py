"""Settings of the discovery process, and the routing knobs it publishes.

Process settings are declared once each with :class:`lbcore.knobs.Knob` (environment
variable, flag, default, validation, docs), like the routing knobs in
:mod:`lbcore.knobs`; ``cslb discovery --help`` and the README come from these
declarations.

Routing knobs (:data:`lbcore.knobs.ROUTING_KNOBS`) and the outlier-detection settings
(:data:`OUTLIER_KNOBS`, the discovery process's own, its decisions published with the
tables) are layered, lowest first: defaults, ``CSLB_*`` environment, command-line flags,
then the watched ConfigMap (``--configmap``), so an operator flips the kill switch or
outlier ejection for every host by editing one ConfigMap. A ConfigMap value that does
not parse is rejected as a whole (the previous knobs stay in force) and logged; a
deleted ConfigMap falls back to flags/environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import shm
from discovery.static import DEFAULT_MAX_FILE_BYTES

# lbcore.knobs' own parsers, reused rather than copied (private there for now).
from lbcore.knobs import (
    LOG_FORMAT,
    LOG_LEVEL,
    ROUTING_KNOBS,
    Knob,
    KnobError,
    from_mapping,
    parse_bool,
    parse_choice,
    parse_int_between,
    parse_number_between,
    seconds_at_least,
)
from lbcore.knobs import docs_table as _docs_table
from lbcore.outlier import DEFAULT_OUTLIER_PARAMS as _OD
from lbcore.outlier import OutlierParams
from lbcore.zone_settings import ZONE, ZONE_KNOBS
from shm.settings import UNLINK_ON_EXIT

__all__ = [
    "DISCOVERY_KNOBS",
    "LAYERED_KNOBS",
    "OUTLIER_KNOBS",
    "PUBLISHED_KNOBS",
    "SHM_NAMESPACE",
    "ZONE_CONTROL_KNOBS",
    "KnobState",
    "docs_table",
    "knob",
    "outlier_docs_table",
    "outlier_params",
    "seconds_at_least",
    "unknown_configmap_keys",
]

#: Routing knobs carried by the tables: the fields of :class:`shm.Knobs` (fade duration,
#: exponent and vnodes travel in the ring set itself).
PUBLISHED_KNOBS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(shm.Knobs))


def _text(text: str) -> str:
    return text.strip()


_share = parse_number_between(0.0, 1.0, what="a share")


#: Settings of the discovery process (not published; each host's own).
DISCOVERY_KNOBS: tuple[Knob, ...] = (
    Knob(
        "namespace",
        "CSLB_NAMESPACE",
        "--namespace",
        "",
        _text,
        "Kubernetes namespace of the Service (default: the pod's own namespace in a "
        "cluster, else the kubeconfig context's, else 'default').",
        "NS",
    ),
    Knob(
        "service",
        "CSLB_SERVICE",
        "--service",
        "",
        _text,
        "Service whose EndpointSlices (label kubernetes.io/service-name) are watched. "
        "Empty: no Kubernetes source (static endpoints only).",
        "SVC",
    ),
    # The caller's zone is each host's own: a process setting, never a ConfigMap key
    # (one ConfigMap serves hosts in every zone).
    ZONE,
    Knob(
        "caller_service",
        "CSLB_CALLER_SERVICE",
        "--caller-service",
        "",
        _text,
        "Zone affinity: this caller's own Service (same namespace). Its EndpointSlices "
        "give this pod's zone (found by --pod-ip) and the ready callers per zone, for the "
        "capacity cap; CSLB_ZONE, when set, names the zone instead. Empty: not watched.",
        "SVC",
    ),
    Knob(
        "pod_ip",
        "CSLB_POD_IP",
        "--pod-ip",
        "",
        _text,
        "This pod's IP, as its Service's EndpointSlices list it (set it from the downward "
        "API, status.podIP); used with --caller-service.",
        "IP",
    ),
    Knob(
        "port_name",
        "CSLB_PORT_NAME",
        "--port-name",
        "",
        _text,
        "Name of the EndpointSlice port to route to, or its number (the pod's port, e.g. "
        "8080); empty: the slices' only TCP port.",
        "NAME|NUMBER",
    ),
    Knob(
        "scheme",
        "CSLB_SCHEME",
        "--scheme",
        "http",
        parse_choice(("http", "https")),
        "Scheme of the endpoint addresses (scheme://ip:port, as Skipper hashes them).",
        "SCHEME",
    ),
    Knob(
        "kubeconfig",
        "CSLB_KUBECONFIG",
        "--kubeconfig",
        "",
        _text,
        "kubeconfig file; empty: the service account when running in a cluster, else "
        "$KUBECONFIG or ~/.kube/config.",
        "FILE",
    ),
    Knob(
        "service_account_dir",
        "CSLB_SERVICE_ACCOUNT_DIR",
        "--service-account-dir",
        "/var/run/secrets/kubernetes.io/serviceaccount",
        _text,
        "In a cluster (KUBERNETES_SERVICE_HOST and _PORT set, no --kubeconfig): the "
        "directory holding the service account's token, ca.crt and namespace files, as "
        "Kubernetes mounts them. The token is re-read when it rotates.",
        "DIR",
    ),
    Knob(
        "configmap",
        "CSLB_CONFIGMAP",
        "--configmap",
        "",
        _text,
        "ConfigMap (same namespace) whose data overrides routing and outlier knobs at "
        "runtime; keys are the CSLB_* variables or knob names. Empty: no ConfigMap.",
        "NAME",
    ),
    Knob(
        "configmap_wait_s",
        "CSLB_CONFIGMAP_WAIT",
        "--configmap-wait",
        10.0,
        seconds_at_least(0.0),
        "How long in seconds the first publish waits for the ConfigMap before it uses "
        "the flag and environment knobs.",
        "SECONDS",
    ),
    Knob(
        "endpoints_file",
        "CSLB_ENDPOINTS_FILE",
        "--endpoints-file",
        "",
        _text,
        "JSON or YAML file of endpoints, re-read when it changes (format: docs/endpoints-file.md).",
        "FILE",
    ),
    Knob(
        "endpoints_file_max_bytes",
        "CSLB_ENDPOINTS_FILE_MAX_BYTES",
        "--endpoints-file-max-bytes",
        DEFAULT_MAX_FILE_BYTES,
        parse_int_between(1024, 1 << 30),
        "Largest endpoints file in bytes that is read; a larger one, or one that is not a "
        "regular file (a FIFO, a device), is refused as endpoints_file_invalid and the last "
        "good endpoints stay in force.",
        "BYTES",
    ),
    shm.SHM_NAMESPACE,
    Knob(
        "debounce_s",
        "CSLB_DEBOUNCE",
        "--debounce",
        2.0,
        seconds_at_least(0.0),
        "Quiet time in seconds after the last endpoint change before the ring is rebuilt; "
        "folds a rolling deployment or a scale-up into one update.",
        "SECONDS",
    ),
    Knob(
        "debounce_max_s",
        "CSLB_DEBOUNCE_MAX",
        "--debounce-max",
        10.0,
        seconds_at_least(0.0),
        "Longest wait in seconds from the first change of a burst to its publish, for "
        "sources that never go quiet (raised to the debounce if smaller).",
        "SECONDS",
    ),
    Knob(
        "removals_at_once",
        "CSLB_REMOVALS_AT_ONCE",
        "--removals-at-once",
        False,
        parse_bool,
        "Publish endpoint removals (deleted, not-ready, terminating pods) at once instead "
        "of after the debounce; additions still wait for it, so a scale-up stays one "
        "fading ring. A rolling deployment then takes one more generation per burst.",
        "BOOL",
    ),
    Knob(
        "drop_warn_share",
        "CSLB_DROP_WARN_SHARE",
        "--drop-warn-share",
        0.5,
        _share,
        "A publish that removes more than this share (0-1) of the endpoints in force is "
        "logged as a warning (publish_drop, naming the removed endpoints); it is still "
        "published. 1 never warns.",
        "SHARE",
    ),
    Knob(
        "heartbeat_s",
        "CSLB_HEARTBEAT",
        "--heartbeat",
        1.0,
        seconds_at_least(0.01),
        "Interval in seconds of the publisher heartbeat workers use to tell a live "
        "discovery process from a dead one.",
        "SECONDS",
    ),
    Knob(
        "request_timeout_s",
        "CSLB_REQUEST_TIMEOUT",
        "--request-timeout",
        90.0,
        seconds_at_least(0.01),
        "Client-side read timeout in seconds of every Kubernetes API request: a watch "
        "that sends nothing (not even a bookmark) for this long is dropped and resumed.",
        "SECONDS",
    ),
    Knob(
        "watch_idle_s",
        "CSLB_WATCH_IDLE",
        "--watch-idle",
        15.0,
        seconds_at_least(0.05),
        "A watch that has sent nothing (no event, no bookmark) for this many seconds is "
        "checked with a list of the same objects on another connection: unless the list "
        "answers and shows nothing the watch missed, the watch is dropped and resumed "
        "from its resource version. A quiet watch is kept; a stalled one is replaced "
        "within about twice this (client-go pings an HTTP/2 connection idle for 30 s).",
        "SECONDS",
    ),
    Knob(
        "connect_timeout_s",
        "CSLB_CONNECT_TIMEOUT",
        "--connect-timeout",
        5.0,
        seconds_at_least(0.01),
        "Timeout in seconds for connecting to the Kubernetes API.",
        "SECONDS",
    ),
    Knob(
        "watch_timeout_s",
        "CSLB_WATCH_TIMEOUT",
        "--watch-timeout",
        300.0,
        seconds_at_least(1.0),
        "Server-side watch timeout in seconds; each watch asks for a random value between "
        "this and twice this (as client-go's reflector) and is then resumed.",
        "SECONDS",
    ),
    Knob(
        "backoff_s",
        "CSLB_BACKOFF",
        "--backoff",
        0.8,
        seconds_at_least(0.001),
        "First retry delay in seconds after a Kubernetes API error; doubles per failure "
        "(with jitter) up to --backoff-max.",
        "SECONDS",
    ),
    Knob(
        "backoff_max_s",
        "CSLB_BACKOFF_MAX",
        "--backoff-max",
        30.0,
        seconds_at_least(0.001),
        "Longest retry delay in seconds after Kubernetes API errors.",
        "SECONDS",
    ),
    Knob(
        "file_poll_s",
        "CSLB_FILE_POLL",
        "--file-poll",
        1.0,
        seconds_at_least(0.01),
        "How often in seconds the endpoints file is checked for changes.",
        "SECONDS",
    ),
    UNLINK_ON_EXIT,
    LOG_LEVEL,
    LOG_FORMAT,
)


# Counts are compared with per-window call counts; a billion is beyond any window.
_count = parse_int_between(0, 1_000_000_000)


_percent = parse_number_between(0.0, 100.0, what="a percentage", suffix="%")


_S = 1e9

#: Outlier detection (passive ejection), decided by the discovery process for the whole
#: host; settable in the knobs ConfigMap like the routing knobs.
OUTLIER_KNOBS: tuple[Knob, ...] = (
    Knob(
        "outlier_detection",
        "CSLB_OUTLIER_DETECTION",
        "--outlier-detection",
        _OD.enabled,
        parse_bool,
        "Passive outlier ejection: every interval discovery reads the host's counters and "
        "ejects endpoints whose calls fail (consecutive failures, a failure percentage or "
        "a success rate far below the others); ejected endpoints are skipped on the "
        "unchanged ring and fade back in when the ejection ends. 'false' readmits every "
        "ejected endpoint at once.",
        "BOOL",
    ),
    Knob(
        "outlier_interval_s",
        "CSLB_OUTLIER_INTERVAL",
        "--outlier-interval",
        _OD.interval_ns / _S,
        seconds_at_least(0.05),
        "How often in seconds endpoints are judged (and ejections end).",
        "SECONDS",
    ),
    Knob(
        "outlier_window_s",
        "CSLB_OUTLIER_WINDOW",
        "--outlier-window",
        _OD.window_ns / _S,
        seconds_at_least(0.05),
        "Sliding window in seconds of per-interval counts the failure-percentage and "
        "success-rate rules judge (raised to the interval if smaller); its volumes are "
        "per window. 10 s keeps Envoy's volume defaults, which are per 10-s interval.",
        "SECONDS",
    ),
    Knob(
        "outlier_ejection_time_s",
        "CSLB_OUTLIER_EJECTION_TIME",
        "--outlier-ejection-time",
        _OD.base_ejection_ns / _S,
        seconds_at_least(0.01),
        "Base ejection time in seconds: an ejection lasts base x the endpoint's multiplier "
        "(ejections in a row; one step down per healthy window).",
        "SECONDS",
    ),
    Knob(
        "outlier_max_ejection_time_s",
        "CSLB_OUTLIER_MAX_EJECTION_TIME",
        "--outlier-max-ejection-time",
        _OD.max_ejection_ns / _S,
        seconds_at_least(0.0),
        "Longest ejection in seconds (at least the base ejection time).",
        "SECONDS",
    ),
    Knob(
        "outlier_max_ejection_percentage",
        "CSLB_OUTLIER_MAX_EJECTION_PERCENTAGE",
        "--outlier-max-ejection-percentage",
        _OD.max_ejection_percent,
        _percent,
        "At most this share (0-100) of the endpoints is ejected at once, but at least one "
        "(0: none).",
        "PCT",
    ),
    Knob(
        "outlier_consecutive_failures",
        "CSLB_OUTLIER_CONSECUTIVE_FAILURES",
        "--outlier-consecutive-failures",
        _OD.consecutive_failures,
        _count,
        "Failures without a success in between that eject an endpoint (0: rule off).",
        "N",
    ),
    Knob(
        "outlier_failure_percentage",
        "CSLB_OUTLIER_FAILURE_PERCENTAGE",
        "--outlier-failure-percentage",
        _OD.failure_percentage,
        _percent,
        "Failed share (0-100) of an endpoint's calls in the window that ejects it (0: rule off).",
        "PCT",
    ),
    Knob(
        "outlier_failure_percentage_volume",
        "CSLB_OUTLIER_FAILURE_PERCENTAGE_VOLUME",
        "--outlier-failure-percentage-volume",
        _OD.failure_percentage_volume,
        _count,
        "Calls an endpoint needs in the window for the failure-percentage rule.",
        "N",
    ),
    Knob(
        "outlier_success_rate_stdev",
        "CSLB_OUTLIER_SUCCESS_RATE_STDEV",
        "--outlier-success-rate-stdev",
        _OD.success_rate_stdev,
        parse_number_between(0.0, 1000.0),
        "Success-rate rule: eject an endpoint whose success rate is below mean - this x "
        "stdev of the endpoints with enough calls, and at least 5 points below the mean "
        "(0: rule off).",
        "K",
    ),
    Knob(
        "outlier_success_rate_min_hosts",
        "CSLB_OUTLIER_SUCCESS_RATE_MIN_HOSTS",
        "--outlier-success-rate-min-hosts",
        _OD.success_rate_min_hosts,
        _count,
        "Endpoints with enough calls the success-rate rule needs.",
        "N",
    ),
    Knob(
        "outlier_success_rate_volume",
        "CSLB_OUTLIER_SUCCESS_RATE_VOLUME",
        "--outlier-success-rate-volume",
        _OD.success_rate_volume,
        _count,
        "Calls in the window that make an endpoint count for the success-rate rule.",
        "N",
    ),
    Knob(
        "outlier_panic_threshold",
        "CSLB_OUTLIER_PANIC_THRESHOLD",
        "--outlier-panic-threshold",
        _OD.panic_threshold,
        _percent,
        "Below this share (0-100) of endpoints not ejected, routing ignores every "
        "ejection (fail open, Envoy's panic mode). 0: never; then a table whose every "
        "endpoint is ejected routes every key to fallback.",
        "PCT",
    ),
)

#: The zone controller's settings (:data:`lbcore.zone_settings.ZONE_KNOBS` but the
#: caller's zone, a process setting in :data:`DISCOVERY_KNOBS`).
ZONE_CONTROL_KNOBS: tuple[Knob, ...] = tuple(k for k in ZONE_KNOBS if k is not ZONE)

#: Every knob the ConfigMap may set (layered by :class:`KnobState`): routing, outlier
#: detection and the zone controller's settings (its curve is decided and published
#: here).
LAYERED_KNOBS: tuple[Knob, ...] = ROUTING_KNOBS + OUTLIER_KNOBS + ZONE_CONTROL_KNOBS


def outlier_params(values: Mapping[str, Any]) -> OutlierParams:
    """Outlier-detection parameters from resolved knob values (by name).

    Raises
    ------
    KnobError
        A combination lbcore refuses (the parsers check each value alone).
    """
    interval = round(float(values["outlier_interval_s"]) * _S)
    try:
        return OutlierParams(
            enabled=bool(values["outlier_detection"]),
            interval_ns=interval,
            window_ns=max(round(float(values["outlier_window_s"]) * _S), interval),
            base_ejection_ns=round(float(values["outlier_ejection_time_s"]) * _S),
            max_ejection_ns=round(float(values["outlier_max_ejection_time_s"]) * _S),
            max_ejection_percent=float(values["outlier_max_ejection_percentage"]),
            consecutive_failures=int(values["outlier_consecutive_failures"]),
            failure_percentage=float(values["outlier_failure_percentage"]),
            failure_percentage_volume=int(values["outlier_failure_percentage_volume"]),
            success_rate_stdev=float(values["outlier_success_rate_stdev"]),
            success_rate_min_hosts=int(values["outlier_success_rate_min_hosts"]),
            success_rate_volume=int(values["outlier_success_rate_volume"]),
            panic_threshold=float(values["outlier_panic_threshold"]),
        )
    except ValueError as exc:
        raise KnobError(f"outlier detection settings: {exc}") from None


_BY_NAME = {k.name: k for k in DISCOVERY_KNOBS}

#: ``--shm-namespace`` (``CSLB_SHM_NAMESPACE``): also read by ``cslb inspect``.
SHM_NAMESPACE = _BY_NAME["shm_namespace"]


def knob(name: str) -> Knob:
    """The discovery setting called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KnobError(f"no discovery setting named {name!r}") from None


def docs_table() -> str:
    """The README table of :data:`DISCOVERY_KNOBS` (empty defaults shown as "-")."""
    return _docs_table(DISCOVERY_KNOBS)


def outlier_docs_table() -> str:
    """The README table of :data:`OUTLIER_KNOBS`."""
    return _docs_table(OUTLIER_KNOBS)


_LAYERED_KEYS = frozenset(k for kn in LAYERED_KNOBS for k in (kn.env, kn.name))


def unknown_configmap_keys(data: Mapping[str, Any]) -> list[str]:
    """ConfigMap keys that name no knob it may set (typos such as ``CSLB_ENABLE``)."""
    return sorted(k for k in data if k not in _LAYERED_KEYS)


class KnobState:
    """Routing and outlier knobs: flags/environment underneath, the ConfigMap on top.

    Parameters
    ----------
    base
        Every knob resolved from defaults, environment and flags
        (:func:`lbcore.knobs.from_args`); outlier and zone knobs it lacks take their
        defaults.
    knobs
        The knob declarations.
    """

    def __init__(self, base: Mapping[str, Any], knobs: Iterable[Knob] = LAYERED_KNOBS) -> None:
        self.knobs = tuple(knobs)
        optional = OUTLIER_KNOBS + ZONE_CONTROL_KNOBS
        base = {**{k.name: k.default for k in optional if k in self.knobs}, **base}
        missing = [k.name for k in self.knobs if k.name not in base]
        if missing:
            raise KnobError(f"base knob values lack {missing}")
        self.base = dict(base)
        self.overlay: dict[str, Any] = {}

    def values(self) -> dict[str, Any]:
        """The knobs in force, by name."""
        out = dict(self.base)
        out.update(self.overlay)
        return out

    def set_overlay(self, data: Mapping[str, Any] | None, source: str) -> dict[str, Any]:
        """Replace the ConfigMap layer with ``data`` (``None``: no ConfigMap).

        Returns
        -------
        dict
            The knobs whose value in force changed, ``name -> (old, new)``.

        Raises
        ------
        KnobError
            If a value does not parse; nothing changes then.
        """
        overlay = from_mapping(data or {}, self.knobs, source=source)
        before = self.values()
        self.overlay = overlay
        after = self.values()
        return {k: (before[k], after[k]) for k in after if before[k] != after[k]}
