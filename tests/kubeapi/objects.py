"""The API's resources and objects: which paths serve which kind, selectors, Status bodies,
and builders for the EndpointSlices and ConfigMaps the tests publish."""

from __future__ import annotations

from typing import Any

SLICES = "endpointslices"
CONFIGMAPS = "configmaps"
PATHS = {
    "apis/discovery.k8s.io/v1": {SLICES: ("EndpointSlice", "discovery.k8s.io/v1")},
    "api/v1": {CONFIGMAPS: ("ConfigMap", "v1")},
}
GROUPS = {"apis/discovery.k8s.io/v1": "discovery.k8s.io", "api/v1": ""}


def kind_of(resource: str) -> tuple[str, str]:
    for table in PATHS.values():
        if resource in table:
            return table[resource]
    raise KeyError(resource)


def selectors(query: dict[str, str]) -> dict[str, str]:
    sel: dict[str, str] = {}
    for part in filter(None, query.get("labelSelector", "").split(",")):
        k, _, v = part.partition("=")
        sel["label:" + k] = v
    for part in filter(None, query.get("fieldSelector", "").split(",")):
        k, _, v = part.partition("=")
        sel["field:" + k] = v
    return sel


def matches(obj: Any, sel: dict[str, str]) -> bool:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return True  # malformed: deliver it, the client must cope
    labels = meta.get("labels") or {}
    for k, v in sel.items():
        if k.startswith("label:") and labels.get(k[6:]) != v:
            return False
        if k == "field:metadata.name" and meta.get("name") != v:
            return False
    return True


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def endpoint(
    ip: str,
    *,
    ready: bool | None = True,
    serving: bool | None = None,
    terminating: bool | None = None,
    node: str | None = None,
    zone: str | None = "eu-central-1a",
    pod: str | None = None,
) -> dict[str, Any]:
    cond: dict[str, Any] = {}
    if ready is not None:
        cond["ready"] = ready
    cond["serving"] = ready if serving is None else serving
    if terminating is not None:
        cond["terminating"] = terminating
    ep: dict[str, Any] = {"addresses": [ip], "conditions": cond}
    if node is not None:
        ep["nodeName"] = node
    if zone is not None:
        ep["zone"] = zone
    if pod is not None:
        ep["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "default"}
    return ep


def endpoint_slice(
    name: str,
    service: str,
    endpoints: list[dict[str, Any]],
    *,
    ports: list[tuple[str, int]] | None = (("http", 8080),),  # type: ignore[assignment]
    address_type: str = "IPv4",
) -> dict[str, Any]:
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": None
        if ports is None
        else [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports],
    }


def configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": name}, "data": data}
