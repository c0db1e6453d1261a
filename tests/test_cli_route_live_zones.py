"""``cslb route --live`` under zone affinity: the explanation's pod is the worker's, key
for key (the plan both build from the table's zone record); local keys are explained as
the zone's ring, a local key spilled off its zone pod by bounded load names that pod and
its own bar; the header says the zone controller's state and the local share now."""

from __future__ import annotations

import json

import numpy as np

import lbcore
import shm
from lbcore.zones import local_keys
from shm.tables import ZoneCurve
from tests.app_tests.conftest import ENDPOINTS, ZONES, Host
from tests.test_cli_route_live import KEYS, _compare, cslb, host  # noqa: F401

LOCAL = {e for e, z in zip(ENDPOINTS, ZONES, strict=True) if z == "eu-1a"}


def publish(host: Host, x: float, **kw) -> None:  # noqa: F811
    curve = ZoneCurve(
        zone="eu-1a", affinity=True, min_pods=2, state="full", reason="ramp_done", x0=x, cap=x
    )
    host.writer.publish(lbcore.RingSet(ENDPOINTS), zones=ZONES, zone=curve, **kw)


def test_local_keys_are_explained_as_the_zone_ring(host: Host) -> None:  # noqa: F811
    publish(host, 0.5, knobs=shm.Knobs(balance_factor=None))
    routes, _ = _compare(host)
    is_local = local_keys(KEYS, 0.5, "eu-1a")
    kinds = np.array([r.kind for r in routes])
    assert (kinds[is_local] == "zone_ring").all()
    assert "zone_ring" not in set(kinds[~is_local])
    assert all(r.endpoint in LOCAL for r, here in zip(routes, is_local, strict=True) if here)


def test_a_spill_names_the_zone_pod_and_its_own_bar(host: Host) -> None:  # noqa: F811
    publish(host, 1.0, knobs=shm.Knobs(load_signal="in-flight"))
    host.open(ENDPOINTS[0], 40)  # a local pod far over its bar
    routes, table = _compare(host)
    spilled = [r for r in routes if r.kind == "bounded_load" and r.moved_from == ENDPOINTS[0]]
    assert spilled
    plan_bar = None
    for r in spilled:
        assert r.loads["from"] == 40.0 and r.loads["bar"] < 40.0
        plan_bar = plan_bar or r.loads["bar"]
        assert r.loads["bar"] == plan_bar  # the pod's own bar, the same for every key
    # its own bar: the local pods carry every key, so twice the flat average's share
    flat = 1.25 * (1.0 + 40.0) / len(table.endpoints)
    assert plan_bar > 2.5 * flat


def test_the_command_shows_the_zone_controller(host: Host) -> None:  # noqa: F811
    publish(host, 1.0, knobs=shm.Knobs(balance_factor=None))
    keys = KEYS[:50]
    p = cslb("--live", "--shm-namespace", host.namespace, *keys)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert lines[2] == (
        "zone eu-1a: affinity on, full (ramp_done), 100.0 % of keys local now (cap 100.0 %)"
    )
    body = lines[3:]
    assert len(body) == len(keys)
    assert all("zone ring: a local key, on the caller zone's pods" in line for line in body)
    doc = json.loads(cslb("--live", "--shm-namespace", host.namespace, "--json", *keys).stdout)
    assert doc["zone"] == {
        "zone": "eu-1a",
        "affinity": True,
        "state": "full",
        "reason": "ramp_done",
        "share": 1.0,
        "cap": 1.0,
    }
    assert {r["endpoint"] for r in doc["routes"]} <= LOCAL


def test_without_a_zone_the_header_has_no_zone_line(host: Host) -> None:  # noqa: F811
    host.publish()
    lines = cslb("--live", "--shm-namespace", host.namespace, "SKU-1").stdout.decode().splitlines()
    assert len(lines) == 3 and not any(line.startswith("zone ") for line in lines)
