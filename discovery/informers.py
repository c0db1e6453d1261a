"""The informers discovery runs: EndpointSlices, a ConfigMap of knobs, the callers' slices.

The backend Service's EndpointSlices; one ConfigMap of knobs; and, for zone affinity,
the caller's own Service's EndpointSlices (its zone, its callers per zone). Each
wraps one :class:`discovery.kube.ListWatch` on a thread of its own.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s_client

from discovery.callers import CallerView, callers_from_slices
from discovery.endpoints import ParsedSlice, merge_slices, parse_member_slice, parse_slice
from discovery.events import EventLog
from discovery.kube import ListWatch, WatchTiming, name_of
from discovery.kube_client import track_requests
from discovery.static import EndpointSpec

__all__ = [
    "SERVICE_NAME_LABEL",
    "CallerSliceInformer",
    "ConfigMapError",
    "ConfigMapInformer",
    "EndpointSliceInformer",
    "parse_configmap",
]

#: The label EndpointSlice controllers put on every slice of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class ConfigMapError(ValueError):
    """A ConfigMap does not have the shape the Kubernetes API defines."""


class _Informer:
    """Thread control shared by the informers: each wraps one :class:`ListWatch`."""

    watch: ListWatch[Any]

    def start(self) -> None:
        """Start the informer thread."""
        self.watch.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop the informer thread; True once it has ended (see :meth:`ListWatch.stop`)."""
        return self.watch.stop(timeout_s)

    def signal_stop(self) -> None:
        """Ask the informer thread to stop, cutting its request; does not wait."""
        self.watch.signal_stop()

    def join(self, timeout_s: float) -> bool:
        """Wait for the stopped informer thread; True once it has ended."""
        return self.watch.join(timeout_s)

    def problem(self) -> tuple[str, int] | None:
        """What keeps the informer from following the API, and since when (monotonic ns)."""
        return self.watch.problem()


def _slice_watch(
    api: k8s_client.ApiClient,
    namespace: str,
    service: str,
    parse: Callable[[dict[str, Any]], ParsedSlice],
    on_change: Callable[[dict[str, ParsedSlice], str], None],
    log: EventLog,
    timing: WatchTiming,
    rng: random.Random | None,
) -> ListWatch[ParsedSlice]:
    """A list+watch of one Service's EndpointSlices (by the service-name label)."""
    return ListWatch[ParsedSlice](
        kind="EndpointSlice",
        resource="endpointslices.discovery.k8s.io",
        list_call=k8s_client.DiscoveryV1Api(api).list_namespaced_endpoint_slice,
        namespace=namespace,
        selectors={"label_selector": f"{SERVICE_NAME_LABEL}={service}"},
        parse=parse,
        on_change=on_change,
        log=log,
        timing=timing,
        rng=rng,
        requests=track_requests(api),
    )


class EndpointSliceInformer(_Informer):
    """The ready endpoints of one Service, from its EndpointSlices.

    Parameters
    ----------
    api
        A configured :class:`kubernetes.client.ApiClient`.
    namespace, service
        The Service.
    on_update
        Called with the Service's ready endpoints (sorted, de-duplicated) after the first
        list and after every change of the slices (from the informer thread).
    port_name, scheme
        How addresses are built (see :mod:`discovery.endpoints`).
    """

    def __init__(
        self,
        api: k8s_client.ApiClient,
        namespace: str,
        service: str,
        on_update: Callable[[tuple[EndpointSpec, ...], str], None],
        *,
        log: EventLog,
        timing: WatchTiming,
        port_name: str = "",
        scheme: str = "http",
        rng: random.Random | None = None,
    ) -> None:
        self.on_update = on_update
        self.log = log
        self.port_name = port_name or None
        self.scheme = scheme
        self.watch = _slice_watch(
            api, namespace, service, self._parse, self._changed, log, timing, rng
        )

    def _parse(self, obj: dict[str, Any]) -> ParsedSlice:
        s = parse_slice(obj, port_name=self.port_name, scheme=self.scheme)
        if s.problems:
            self.log.warning(
                "slice_problems",
                slice=s.name,
                resource_version=s.resource_version,
                problems=list(s.problems[:20]),
                skipped=len(s.problems),
            )
        return s

    def _changed(self, store: dict[str, ParsedSlice], reason: str) -> None:
        slices = [store[name] for name in sorted(store)]
        self.on_update(merge_slices(slices), reason)


def parse_configmap(obj: dict[str, Any]) -> dict[str, str]:
    """A ConfigMap's ``data`` (``{}`` if it has none).

    Raises
    ------
    ConfigMapError
        If ``data`` is not an object of strings.
    """
    data = obj.get("data")
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise ConfigMapError(f"ConfigMap {name_of(obj)}: 'data' must map strings to strings")
    return dict(data)


class ConfigMapInformer(_Informer):
    """One ConfigMap's data: a dictionary when it exists, ``None`` when it does not."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        namespace: str,
        name: str,
        on_update: Callable[[dict[str, str] | None, str], None],
        *,
        log: EventLog,
        timing: WatchTiming,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.on_update = on_update
        self.watch = ListWatch[dict[str, str]](
            kind="ConfigMap",
            resource="configmaps",
            list_call=k8s_client.CoreV1Api(api).list_namespaced_config_map,
            namespace=namespace,
            selectors={"field_selector": f"metadata.name={name}"},
            parse=parse_configmap,
            on_change=self._changed,
            log=log,
            timing=timing,
            rng=rng,
            requests=track_requests(api),
        )

    def _changed(self, store: dict[str, dict[str, str]], reason: str) -> None:
        self.on_update(store.get(self.name), reason)


class CallerSliceInformer(_Informer):
    """The caller's own Service's EndpointSlices, reduced to a :class:`CallerView`.

    Parameters
    ----------
    api
        A configured :class:`kubernetes.client.ApiClient`.
    namespace, service
        The caller's own Service.
    pod_ip
        This pod's IP (``CSLB_POD_IP``, from the downward API).
    on_update
        Called with the view after the first list and after every change (from the
        informer thread).
    """

    def __init__(
        self,
        api: k8s_client.ApiClient,
        namespace: str,
        service: str,
        pod_ip: str,
        on_update: Callable[[CallerView, str], None],
        *,
        log: EventLog,
        timing: WatchTiming,
        rng: random.Random | None = None,
    ) -> None:
        self.pod_ip = pod_ip
        self.on_update = on_update
        self.watch = _slice_watch(
            api, namespace, service, parse_member_slice, self._changed, log, timing, rng
        )

    def _changed(self, store: dict[str, ParsedSlice], reason: str) -> None:
        self.on_update(callers_from_slices([store[n] for n in sorted(store)], self.pod_ip), reason)
