"""Helpers for the Kubernetes manifest tests: render with kustomize, check objects against
the ``kubernetes`` client's models (unknown fields fail) and small schemas of the two
Prometheus Operator CRDs, and find things in the rendered objects."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIRECTORY``, offline; without kubectl the test skips, or fails
    under ``CSLB_REQUIRE_TOOLS=1`` (:mod:`tests.tools`)."""
    from tests.tools import need

    kubectl = need("kubectl")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def render(variant: str = "") -> list[dict[str, Any]]:
    """``kubectl kustomize deploy/kubernetes[/variant]``."""
    return kustomize(DEPLOY / variant)


def render_overlay(tmp: Path, kustomization: str) -> list[dict[str, Any]]:
    """Render a user's overlay whose paths name ``../deploy/kubernetes...``, as docs show.

    The overlay is written to ``tmp/my-overlay`` with ``../deploy`` pointing (relatively:
    kustomize refuses absolute paths) at this repository's deploy directory.
    """
    overlay = tmp / "my-overlay"
    overlay.mkdir(parents=True, exist_ok=True)
    to_deploy = os.path.relpath(ROOT / "deploy", overlay)
    (overlay / "kustomization.yaml").write_text(
        kustomization.replace("../deploy/", f"{to_deploy}/"), encoding="utf-8"
    )
    return kustomize(overlay)


def kustomizations() -> list[Path]:
    """Every directory under deploy/kubernetes with a kustomization (or component)."""
    return sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(hits) == 1, f"{len(hits)} {kind} {name or ''} in the manifests"
    return hits[0]


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


#: The pod IP :func:`env_of` gives ``status.podIP`` (the downward API's) by default.
POD_IP = "10.7.0.1"


def env_of(c: dict[str, Any], namespace: str, pod_ip: str = POD_IP) -> dict[str, str]:
    """A container's environment, fieldRefs resolved: ``metadata.namespace`` to
    ``namespace``, ``status.podIP`` to ``pod_ip``."""
    out = {}
    refs = {"metadata.namespace": namespace, "status.podIP": pod_ip}
    for e in c.get("env", ()):
        if "value" in e:
            out[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") in refs:
            out[e["name"]] = refs[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            raise AssertionError(f"cannot resolve env {e}")
    return out


_QUANTITY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|k|M|G)?$")
_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}


def quantity_bytes(q: str) -> float:
    m = _QUANTITY.match(str(q))
    assert m, f"not a quantity: {q}"
    return float(m.group(1)) * _UNITS[m.group(2)]


# -- the kubernetes client's models --------------------------------------------------


def model_name(api_version: str, kind: str) -> str:
    version = api_version.split("/")[-1]
    return version[0].upper() + version[1:] + kind


def _check_value(value: Any, typ: str, path: str, errors: list[str]) -> None:
    if typ.lower().startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            _check_value(v, typ[5:-1], f"{path}[{i}]", errors)
    elif typ.lower().startswith("dict("):
        inner = typ[typ.index(",") + 1 : -1].strip()
        _check_map(value, inner, path, errors)
    elif typ.lower().startswith("dict["):
        inner = typ[typ.index(",") + 1 : -1].strip()
        _check_map(value, inner, path, errors)
    elif typ == "str" or typ in ("datetime", "date"):
        if not isinstance(value, str):
            errors.append(f"{path}: expected a string, got {value!r}")
    elif typ == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{path}: expected an integer, got {value!r}")
    elif typ == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            errors.append(f"{path}: expected a number, got {value!r}")
    elif typ == "bool":
        if not isinstance(value, bool):
            errors.append(f"{path}: expected true or false, got {value!r}")
    elif typ == "object":
        pass  # IntOrString, RawExtension...
    else:
        check_model(value, typ, path, errors)


def _check_map(value: Any, inner: str, path: str, errors: list[str]) -> None:
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a map, got {type(value).__name__}")
        return
    for k, v in value.items():
        _check_value(v, inner, f"{path}.{k}", errors)


def check_model(value: Any, model: str, path: str, errors: list[str]) -> None:
    """Every field of ``value`` is one ``model`` knows, with the right type, recursively.

    The client's deserializer drops unknown fields silently, so this walks the model's
    ``attribute_map`` (JSON names) and ``openapi_types`` itself.
    """
    cls = getattr(k8s, model, None)
    if cls is None:
        errors.append(f"{path}: the kubernetes client has no model {model}")
        return
    if not isinstance(value, dict):
        errors.append(f"{path}: expected an object ({model}), got {value!r:.60}")
        return
    by_json = {j: attr for attr, j in cls.attribute_map.items()}
    for key, v in value.items():
        attr = by_json.get(key)
        if attr is None:
            errors.append(f"{path}.{key}: {model} has no field {key!r}")
            continue
        _check_value(v, cls.openapi_types[attr], f"{path}.{key}", errors)


def check_against_models(doc: dict[str, Any]) -> list[str]:
    """Problems of one built-in object: unknown fields, wrong types, missing required."""
    name = model_name(doc["apiVersion"], doc["kind"])
    where = f"{doc['kind']}/{doc['metadata'].get('name')}"
    errors: list[str] = []
    check_model(doc, name, where, errors)
    if not errors:
        try:  # the client's own required-field checks (client-side validation)
            k8s.ApiClient()._ApiClient__deserialize(doc, name)
        except (ValueError, TypeError) as exc:
            errors.append(f"{where}: {exc}")
    return errors


# -- the two Prometheus Operator CRDs -------------------------------------------------

_S = str
_LABEL_SELECTOR = {"matchLabels": {_S: _S}, "matchExpressions": [dict]}
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "PodMonitor": {
        "selector": _LABEL_SELECTOR,
        "namespaceSelector": {"any": bool, "matchNames": [_S]},
        "jobLabel": _S,
        "podTargetLabels": [_S],
        "podMetricsEndpoints": [
            {
                "port": _S,
                "path": _S,
                "scheme": _S,
                "interval": _S,
                "scrapeTimeout": _S,
                "honorLabels": bool,
                "relabelings": [dict],
                "metricRelabelings": [dict],
            }
        ],
    },
    "PrometheusRule": {
        "groups": [
            {
                "name": _S,
                "interval": _S,
                "rules": [
                    {
                        "alert": _S,
                        "record": _S,
                        "expr": _S,
                        "for": _S,
                        "labels": {_S: _S},
                        "annotations": {_S: _S},
                    }
                ],
            }
        ]
    },
}


def _check_schema(value: Any, schema: Any, path: str, errors: list[str]) -> None:
    if isinstance(schema, list):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list")
            return
        for i, v in enumerate(value):
            _check_schema(v, schema[0], f"{path}[{i}]", errors)
    elif isinstance(schema, dict) and set(schema) == {_S}:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map")
            return
        for k, v in value.items():
            _check_schema(v, schema[_S], f"{path}.{k}", errors)
    elif isinstance(schema, dict):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected an object")
            return
        for k, v in value.items():
            if k not in schema:
                errors.append(f"{path}.{k}: unknown field")
            else:
                _check_schema(v, schema[k], f"{path}.{k}", errors)
    elif not isinstance(value, schema):
        errors.append(f"{path}: expected {schema.__name__}, got {value!r:.60}")


def check_crd(doc: dict[str, Any]) -> list[str]:
    """Problems of a PodMonitor or PrometheusRule (monitoring.coreos.com/v1)."""
    where = f"{doc['kind']}/{doc['metadata'].get('name')}"
    errors: list[str] = []
    if doc["apiVersion"] != "monitoring.coreos.com/v1":
        errors.append(f"{where}: apiVersion {doc['apiVersion']}")
    for key in doc:
        if key not in ("apiVersion", "kind", "metadata", "spec"):
            errors.append(f"{where}.{key}: unknown field")
    check_model(doc["metadata"], "V1ObjectMeta", f"{where}.metadata", errors)
    _check_schema(doc.get("spec"), CRD_SCHEMAS[doc["kind"]], f"{where}.spec", errors)
    return errors


def check_any(doc: dict[str, Any]) -> list[str]:
    if doc["kind"] in CRD_SCHEMAS:
        return check_crd(doc)
    return check_against_models(doc)
