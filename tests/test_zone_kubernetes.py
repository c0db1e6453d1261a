"""The caller's zone and the callers per zone, discovered in-cluster: ``cslb discovery``
run with the client container's environment from the manifests (CSLB_CALLER_SERVICE,
CSLB_POD_IP from the downward API) against the test API server over TLS with the
manifests' Role enforced. It finds its own pod in its own Service's EndpointSlices by its
IP, counts the ready callers per zone, follows them through the watch, and needs no right
beyond the Role's."""

from __future__ import annotations

import time

import pytest

from tests.discovery_harness import shm_namespace, wait_until
from tests.k8s_manifests import container, env_of, find, render
from tests.kubeapi import CONFIGMAPS, SLICES, configmap, endpoint, endpoint_slice
from tests.test_kubernetes_manifests import NS, _api, _discovery, _stop, _table

ME = "10.5.0.1"


@pytest.fixture(scope="module")
def base():
    return render()


def test_the_manifests_give_discovery_its_caller_service_and_pod_ip(base):
    d = find(base, "Deployment", "product-sets")
    env = env_of(container(d, "app"), NS, pod_ip="192.0.2.7")
    assert env["CSLB_CALLER_SERVICE"] == d["metadata"]["name"]
    assert find(base, "Service", env["CSLB_CALLER_SERVICE"])["spec"]["selector"].items() <= (
        d["spec"]["template"]["metadata"]["labels"].items()
    )
    assert env["CSLB_POD_IP"] == "192.0.2.7"  # from status.podIP
    side = find(render("sidecar"), "Deployment", "product-sets")
    side_env = env_of(container(side, "discovery"), NS, pod_ip="192.0.2.7")
    assert (side_env["CSLB_CALLER_SERVICE"], side_env["CSLB_POD_IP"]) == (
        "product-sets",
        "192.0.2.7",
    )


def _callers(api, eps):
    api.put(SLICES, NS, endpoint_slice("product-sets-x1", "product-sets", eps))


def _catalog(api):
    eps = [
        endpoint(f"10.4.{z}.{i}", zone=f"z-{'abc'[z]}", pod=f"catalog-{z}{i}")
        for z in range(3)
        for i in range(1, 4)
    ]
    api.put(SLICES, NS, endpoint_slice("catalog-x1", "catalog", eps))


def test_discovery_finds_its_zone_and_the_callers_per_zone_with_the_roles_rights(tmp_path, base):
    api = _api(tmp_path, base)
    try:
        _catalog(api)
        api.put(CONFIGMAPS, NS, configmap("cslb-knobs", {"CSLB_ZONE_AFFINITY": "on"}))
        _callers(
            api,
            [
                endpoint(ME, zone="z-b", ready=False, pod="product-sets-me"),  # not ready yet
                endpoint("10.5.0.2", zone="z-a", pod="product-sets-2"),
            ],
        )
        with shm_namespace() as ns:
            proc = _discovery(api, base, ns, pod_ip=ME, ramp="0.5")
            try:
                t = wait_until(
                    lambda: (t := _table(ns)) is not None and t.zone.state == "full" and t,
                    20,
                    "full affinity",
                )
                # z-b: a third of the pods, half of the callers (this pod, counted although
                # not ready yet, and one in z-a)
                assert t.zone.zone == "z-b"
                assert t.zone.cap == pytest.approx(2 / 3)
                assert t.zone_share(time.monotonic_ns()) == pytest.approx(2 / 3)
                # a caller joins z-a through the watch: z-b now has a third of the callers
                _callers(
                    api,
                    [
                        endpoint(ME, zone="z-b", pod="product-sets-me"),
                        endpoint("10.5.0.2", zone="z-a", pod="product-sets-2"),
                        endpoint("10.5.0.3", zone="z-a", pod="product-sets-3"),
                        endpoint("10.5.0.4", zone="z-c", ready=False, pod="product-sets-4"),
                    ],
                )
                wait_until(
                    lambda: (t := _table(ns)) is not None and t.zone.cap == pytest.approx(0.99),
                    20,
                    "the cap after the callers changed",
                )
            finally:
                _stop(proc)
        lines = proc.events("zone_callers")
        assert lines[-1]["callers"] == {"z-a": 2, "z-b": 1} and lines[-1]["zone"] == "z-b"
        assert not proc.events("zone_caller_not_found")
        assert api.forbidden == []
        assert not proc.events("api_error"), proc.events("api_error")
        selectors = {r.query.get("labelSelector") for r in api.requests if r.resource == SLICES}
        assert selectors == {
            "kubernetes.io/service-name=catalog",
            "kubernetes.io/service-name=product-sets",
        }
    finally:
        api.stop()


def test_a_pod_missing_from_its_service_has_no_zone_and_says_so(tmp_path, base):
    api = _api(tmp_path, base)
    try:
        _catalog(api)
        api.put(CONFIGMAPS, NS, configmap("cslb-knobs", {"CSLB_ZONE_AFFINITY": "on"}))
        _callers(api, [endpoint("10.5.0.2", zone="z-a")])
        with shm_namespace() as ns:
            proc = _discovery(api, base, ns, pod_ip=ME)
            try:
                (line, *_) = wait_until(
                    lambda: proc.events("zone_caller_not_found"), 20, "the warning"
                )
                t = wait_until(_table_of(ns), 20, "a table")
                assert (t.zone.state, t.zone.reason, t.zone_share(time.monotonic_ns())) == (
                    "off",
                    "no_zone",
                    0.0,
                )
            finally:
                _stop(proc)
        assert line["level"] == "warning" and "CSLB_POD_IP" in line["why"]
    finally:
        api.stop()


def _table_of(ns):
    return lambda: _table(ns)
