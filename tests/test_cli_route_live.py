"""``cslb route --live``: the pod a worker gives a key on this host right now, and why.

Real shared memory (tables published by a :class:`shm.TableWriter`, counters with open
calls in a claimed row), a real :class:`workers.Router` on the same namespace as the
reference: for every scenario (fading rings, bounded-load moves on the host's in-flight
load, ejected pods, the gate, Skipper's fade-in) the explanation's pod is the router's,
key for key, at the same instant; and every reason is checked against lbcore's plain
ring. The command itself runs as a process for its output and exit statuses.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import numpy as np
import pytest

import lbcore
import shm
from lbcore.ejection import Ejections
from lbcore.outlier import REASON_CONSECUTIVE
from shm.names import SHM_DIR, unlink_name
from tests.app_tests.conftest import ENDPOINTS, Host, new_namespace
from tests.cslb_runs import run_cslb
from workers.routing.router import Router
from workers.surfaces.explain import FALLBACK_REASONS, KINDS, live

KEYS = [f"SKU-{i:05d}" for i in range(3000)]
NEW = ["http://10.9.1.1:8080", "http://10.9.1.2:8080", "http://10.9.1.3:8080"]


@pytest.fixture
def host() -> Iterator[Host]:
    ns = new_namespace()
    h = Host(ns)
    yield h
    h.close()
    for name in os.listdir(SHM_DIR):
        if name.startswith(f"cslb.{ns}."):
            unlink_name("/" + name)


def _ejections(n: int, who: int, left_s: float) -> Ejections:
    e = Ejections.none(n)
    reason, until = e.reason.copy(), e.until_ns.copy()
    reason[who] = REASON_CONSECUTIVE
    until[who] = time.monotonic_ns() + int(left_s * 1e9)
    return Ejections.of(reason, until, e.multiplier, e.decay_ns, e.counts)


def _compare(host: Host, attempt: int = 0) -> tuple[list, shm.Table]:
    """Explain KEYS and route them on a real Router at the same frozen instant."""
    now = time.monotonic_ns()
    router = Router(host.namespace, background=False, refresh_s=0, clock=lambda: now)
    try:
        idx, table = router.route_table(KEYS, attempt=attempt)
        answer = live(host.namespace, KEYS, attempt=attempt, clock=lambda: now)
    finally:
        router.close()
    assert answer.generation == table.generation
    got = [r.index for r in answer.routes]
    differ = [k for k, a, b in zip(KEYS, got, idx.tolist(), strict=True) if a != b]
    assert not differ, f"{len(differ)} keys differ from the worker's answer, e.g. {differ[:3]}"
    for r in answer.routes:
        assert r.kind in KINDS and (r.fallback is None) == (r.index >= 0)
        assert r.fallback is None or r.fallback in FALLBACK_REASONS
        assert r.endpoint == (table.endpoints[r.index] if r.index >= 0 else None)
    return answer.routes, table


def _plain_ring(table: shm.Table) -> np.ndarray:
    """Skipper's ring over every endpoint, nothing ejected, no load: lbcore.Ring."""
    return lbcore.Ring(list(table.endpoints)).lookup(KEYS)


def test_established_ring(host: Host) -> None:
    host.publish()
    routes, table = _compare(host)
    assert {r.kind for r in routes} == {"ring"}
    assert [r.index for r in routes] == _plain_ring(table).tolist()
    assert all(r.ring == 0 and r.zone and r.node for r in routes)


def test_fading_ring_takes_its_share(host: Host) -> None:
    host.publish(fading=[(NEW, 15.0)])  # halfway through a 30 s fade: 17.7 %
    routes, _ = _compare(host)
    faded = [r for r in routes if r.kind == "fade_ring"]
    assert 0.10 < len(faded) / len(KEYS) < 0.25
    assert all(r.ring == 1 and abs(r.ring_share - 0.5**2.5) < 0.01 for r in faded)
    assert {r.pod_ring for r in faded} == {0, 1}  # its new pods and the old ones
    # Keys on the fading ring whose pod is new; every other key keeps its old pod.
    old = lbcore.Ring(ENDPOINTS).lookup(KEYS)
    moved = [r for r, o in zip(routes, old.tolist(), strict=True) if r.endpoint != ENDPOINTS[o]]
    assert moved and all(r.kind == "fade_ring" and r.endpoint in NEW for r in moved)
    assert all(r.pod_ring == 1 for r in moved)


def test_bounded_load_moves_off_hot_pods_on_the_hosts_in_flight_load(host: Host) -> None:
    host.publish(knobs=shm.Knobs(load_signal="in-flight", balance_factor=1.25))
    hot, warm = ENDPOINTS[0], ENDPOINTS[3]
    host.open(hot, 30)
    host.open(warm, 4)
    routes, table = _compare(host)
    plain = _plain_ring(table)
    moved = [r for r in routes if r.kind == "bounded_load"]
    assert moved
    for r in moved:
        assert r.moved_from == hot  # the only pod over the bar (35 calls / 6 x 1.25 = 7.3)
        assert r.loads["from"] == 30 and r.loads["bar"] == pytest.approx(35 / 6 * 1.25)
        assert r.loads["to"] <= r.loads["bar"] and r.endpoint != hot
    on_hot = [r for r, p in zip(routes, plain.tolist(), strict=True) if ENDPOINTS[p] == hot]
    assert {r.kind for r in on_hot} == {"bounded_load"} and len(on_hot) == len(moved)
    # The retry pod too, as the worker's attempt 1.
    retries, _ = _compare(host, attempt=1)
    assert {r.kind for r in retries} == {"retry"}


@pytest.mark.parametrize("signal", ["occupancy", "effective"])
def test_bounded_load_on_occupancy_and_effective_load(host: Host, signal: str) -> None:
    """Loads the worker reads as busy time and latency (routed-call units for occupancy)."""
    host.publish(knobs=shm.Knobs(load_signal=signal))
    host.busy(ENDPOINTS[1], 8.0, calls=40)  # 0.8 busy-seconds per second, slow calls
    host.busy(ENDPOINTS[4], 4.0, calls=40)  # 0.4: over occupancy's bar (0.26), whose
    host.busy(ENDPOINTS[5], 0.5, calls=40)  # call counts as 0.1 s / 10 s, not as 1.0
    routes, _ = _compare(host)
    moved = [r for r in routes if r.kind == "bounded_load"]
    hot = {ENDPOINTS[1], ENDPOINTS[4]} if signal == "occupancy" else {ENDPOINTS[1]}
    assert moved and {r.moved_from for r in moved} == hot
    assert all(r.loads["from"] > r.loads["bar"] >= r.loads["to"] for r in moved)


def test_the_walks_hop_cap(host: Host) -> None:
    moves = []
    for hops in (1, None):
        host.publish(knobs=shm.Knobs(load_signal="in-flight", max_hops=hops))
        if hops == 1:  # (slots stay the endpoints' across generations)
            host.open(ENDPOINTS[0], 30)
            host.open(ENDPOINTS[1], 30)
        routes, _ = _compare(host)
        moves.append(sum(r.kind == "bounded_load" for r in routes))
    assert moves[0] < moves[1]


def test_ejected_pod_is_skipped_with_its_reason(host: Host) -> None:
    host.publish(ejections=_ejections(len(ENDPOINTS), 2, left_s=25.0))
    routes, table = _compare(host)
    plain = _plain_ring(table)
    ejected = ENDPOINTS[2]
    for r, p in zip(routes, plain.tolist(), strict=True):
        if ENDPOINTS[p] == ejected:
            (s,) = r.skipped
            assert s["endpoint"] == ejected and s["reason"] == "consecutive_failures"
            assert 20 < s["remaining_s"] <= 25 and r.endpoint != ejected
        else:
            assert not r.skipped and r.index == p


def test_every_endpoint_ejected_is_fallback_all_ejected(host: Host) -> None:
    n = len(ENDPOINTS)
    host.publish(ejected=[True] * n)  # (panic off: the publisher decides that)
    routes, _ = _compare(host)
    assert {r.fallback for r in routes} == {"all_ejected"}


@pytest.mark.parametrize(
    ("knobs", "reasons"),
    [
        (shm.Knobs(percentage=40.0), {None, "percentage"}),
        (shm.Knobs(percentage=0.0), {"percentage"}),
        (shm.Knobs(enabled=False), {"kill_switch"}),
    ],
)
def test_the_gate(host: Host, knobs: shm.Knobs, reasons: set) -> None:
    host.publish(knobs=knobs)
    routes, _ = _compare(host)
    assert {r.fallback for r in routes} == reasons
    if None in reasons:
        share = sum(r.fallback is None for r in routes) / len(KEYS)
        assert 0.35 < share < 0.45


def test_skipper_fade_in_and_fade_off(host: Host) -> None:
    host.publish(fading=[(NEW, 15.0)], knobs=shm.Knobs(fade_mode="skipper"))
    routes, _ = _compare(host)
    assert {r.kind for r in routes} == {"ring", "fade_ring"}
    assert all(r.endpoint in NEW for r in routes if r.kind == "fade_ring")
    host.publish(fading=[(NEW, 15.0)], knobs=shm.Knobs(fade_mode="off"))
    routes, table = _compare(host)
    assert [r.index for r in routes] == _plain_ring(table).tolist()  # full share at once


def test_no_table_yet(host: Host) -> None:
    answer = live(host.namespace, ["a"])  # the writer exists, nothing published
    assert answer.generation == 0 and answer.routes[0].fallback == "no_table"


def test_bad_keys_are_refused_before_anything_is_read() -> None:
    with pytest.raises(lbcore.KeyTooLongError, match="key 1 is 4097 bytes long"):
        live("no-such-namespace-x", ["ok", "x" * 4097])


# -- the command -----------------------------------------------------------------------------


def cslb(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return run_cslb("route", *args, stdin=stdin, without_cslb_env=True, text=False)


def test_command_text_json_and_exit_statuses(host: Host) -> None:
    # A fade of ~31 years, half done: its share (17.7 %) stays put while the command runs.
    now = time.monotonic_ns()
    rs = lbcore.RingSet(ENDPOINTS, duration_ns=10**18).scale_up(NEW, now - 5 * 10**17)
    host.writer.publish(
        rs,
        knobs=shm.Knobs(load_signal="in-flight"),
        ejections=_ejections(len(ENDPOINTS) + len(NEW), 2, left_s=60.0),
    )
    host.open(ENDPOINTS[0], 40)
    keys = KEYS[:300]
    now = time.monotonic_ns()
    want = live(host.namespace, keys, clock=lambda: now)
    p = cslb("--live", "--shm-namespace", host.namespace, "--json", *keys)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["generation"] == want.generation and doc["publisher_alive"]
    assert doc["shm_namespace"] == host.namespace and doc["knobs"]["load_signal"] == "in-flight"
    assert [r["key"] for r in doc["routes"]] == keys
    assert [r["endpoint"] for r in doc["routes"]] == [r.endpoint for r in want.routes]
    kinds = {r["kind"] for r in doc["routes"]}
    assert {"ring", "fade_ring", "bounded_load"} <= kinds
    assert any(
        r["skipped"] and r["skipped"][0]["reason"] == "consecutive_failures" for r in doc["routes"]
    )
    text = cslb("--live", "--shm-namespace", host.namespace, *keys).stdout.decode()
    lines = text.splitlines()
    assert lines[0].startswith(f"generation {want.generation}, published ")
    assert "(alive); shm namespace" in lines[0] and "bounded load 1.25 on in-flight" in lines[1]
    body = "\n".join(lines[2:])
    assert "established ring" in body
    assert "  fading ring 1, share 17.7 %; one of its new pods" in body
    assert f"bounded load: moved from {ENDPOINTS[0]} (its in-flight load 40 is over" in body
    assert f"skipped ejected {ENDPOINTS[2]} (consecutive_failures, " in body
    assert len(lines) == 2 + len(keys)
    # Keys from standard input, byte for byte; the same answer.
    p = cslb(
        "--live",
        "--shm-namespace",
        host.namespace,
        "--stdin",
        "--json",
        stdin=b"".join(k.encode() + b"\n" for k in keys),
    )
    assert [r["endpoint"] for r in json.loads(p.stdout)["routes"]] == [
        r.endpoint for r in want.routes
    ]
    # The publisher's heartbeat older than --stale-after: answered, exit status 3.
    time.sleep(0.05)
    p = cslb("--live", "--shm-namespace", host.namespace, "--stale-after", "0.01", "SKU-1")
    assert p.returncode == 3 and b"NOT alive" in p.stdout


def test_command_gate_and_no_table(host: Host) -> None:
    host.publish(knobs=shm.Knobs(enabled=False))
    p = cslb("--live", "--shm-namespace", host.namespace, "SKU-1")
    assert p.returncode == 0
    assert b"SKU-1  fallback  the kill switch is off (CSLB_ENABLED=false)" in p.stdout
    p = cslb("--live", "--shm-namespace", new_namespace(), "--json", "SKU-1")
    assert p.returncode == 1
    assert json.loads(p.stdout)["routes"][0]["fallback"] == "no_table"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--live", "x" * 4097], b"bad key: key 0 is 4097 bytes long; keys may be at most 4096"),
        (["--endpoint", "http://10.0.0.1:80", "ok", "y" * 5000], b"key 1 is 5000 bytes long"),
        (["--live", "--endpoint", "http://10.0.0.1:80", "k"], b"takes no --endpoint"),
        (["--shm-namespace", "x", "--endpoint", "http://10.0.0.1:80", "k"], b"go with --live"),
        (["--live", "--shm-namespace", "no/slash", "k"], b"namespace"),
        (["--live", "--stale-after", "soon", "k"], b"CSLB_STALE_AFTER='soon'"),
        (["--live", "--attempt", "-1", "k"], b"--attempt: expected an integer >= 0"),
        (["--live"], b"no keys given"),
    ],
)
def test_command_errors_are_named(args: list[str], message: bytes) -> None:
    p = cslb(*args)
    assert p.returncode == 2, p
    assert message in p.stderr and b"Traceback" not in p.stderr, p.stderr
