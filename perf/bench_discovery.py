"""Benchmark of the discovery process (``python perf/bench_discovery.py``, ~30 s).

Prints, each next to a baseline measured in the same run:

1. EndpointSlice decoding: ``parse_slice`` + ``merge_slices`` for 100 / 1,000 / 5,000
   endpoints in slices of 100, against ``json.loads`` of the same list body (the least
   any client must do);
2. one scale-up publish (+10 % pods: ring-set transition + shared-memory publish) for
   100 / 1,000 / 5,000 endpoints, against building the plain ``lbcore.Ring`` of the same
   endpoints (what any ring rebuild costs);
3. end to end on 127.0.0.1: a slice change on the Kubernetes API (tests/kubeapi/) until
   a reader in this process routes on the new generation, published by a ``cslb
   discovery`` process (debounce 0), against the time until an informer's callback in
   this process sees the change.

Times are medians; absolute numbers drift on shared machines, ratios less.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import lbcore  # noqa: E402
import shm  # noqa: E402
from discovery.endpoints import merge_slices, parse_slice  # noqa: E402
from discovery.events import EventLog  # noqa: E402
from discovery.informers import EndpointSliceInformer  # noqa: E402
from discovery.kube import WatchTiming  # noqa: E402
from discovery.kube_client import load_client  # noqa: E402
from discovery.ringstate import FadeParams, RingState  # noqa: E402
from discovery.static import EndpointSpec  # noqa: E402
from shm.names import list_segments, unlink_name  # noqa: E402
from tests.discovery_harness import Proc  # noqa: E402
from tests.kubeapi import SLICES, FakeKubeAPI, endpoint, endpoint_slice  # noqa: E402

S = 1_000_000_000


def _ips(n: int, start: int = 0) -> list[str]:
    return [
        f"10.{(i // 62500) % 250}.{(i // 250) % 250}.{i % 250 + 1}" for i in range(start, start + n)
    ]


def _slices(ips: list[str], per: int = 100) -> list[dict]:
    return [
        endpoint_slice(
            f"catalog-{j // per}",
            "catalog",
            [endpoint(a, node=f"node-{a}", pod=f"pod-{a}") for a in ips[j : j + per]],
        )
        for j in range(0, len(ips), per)
    ]


def _median(fn, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def bench_decode() -> None:
    print("1. EndpointSlice decoding (parse + merge) vs json.loads of the list body")
    for n in (100, 1000, 5000):
        body = json.dumps({"items": _slices(_ips(n))})
        doc = json.loads(body)
        base = _median(lambda body=body: json.loads(body), 15)
        ours = _median(lambda doc=doc: merge_slices([parse_slice(s) for s in doc["items"]]), 15)
        print(
            f"   {n:>5} endpoints: {ours * 1e3:7.2f} ms  (json.loads {base * 1e3:6.2f} ms, "
            f"ratio {ours / base:4.1f}x)"
        )


def bench_publish() -> None:
    print("2. scale-up publish (+10 %): transition + shm publish vs plain Ring build")
    for n in (100, 1000, 5000):
        ns = f"bench{os.getpid()}{uuid.uuid4().hex[:6]}"
        writer = shm.TableWriter(ns)
        try:
            samples, bases = [], []
            for r in range(5):
                st = RingState(FadeParams(30 * S, 2.5, 100))
                base_specs = [EndpointSpec(f"http://{a}:8080") for a in _ips(n)]
                st.commit(st.transition(base_specs, r * S))
                more = base_specs + [
                    EndpointSpec(f"http://{a}:8080") for a in _ips(n // 10, start=n)
                ]
                t0 = time.perf_counter()
                t = st.transition(more, r * S + 1)
                writer.publish(t.ring_set, zones=t.zones(), nodes=t.nodes(), now_ns=r * S + 1)
                samples.append(time.perf_counter() - t0)
                addrs = [s.address for s in more]
                t0 = time.perf_counter()
                lbcore.Ring(addrs)
                bases.append(time.perf_counter() - t0)
            ours, base = statistics.median(samples), statistics.median(bases)
            print(
                f"   {n:>5} -> {n + n // 10:>5} endpoints: {ours * 1e3:7.1f} ms  "
                f"(Ring build {base * 1e3:6.1f} ms, ratio {ours / base:4.1f}x)"
            )
        finally:
            writer.close()
            for name in list_segments(ns):
                unlink_name(name)


def bench_end_to_end() -> None:
    print("3. API change -> reader routes on the new generation (cslb discovery, debounce 0)")
    api = FakeKubeAPI()
    api.bookmark_every_s = 0.5
    api.start()
    ns = f"bench{os.getpid()}{uuid.uuid4().hex[:6]}"
    tmp = tempfile.mkdtemp()
    kc = api.kubeconfig(os.path.join(tmp, "kc"), namespace="shop")
    api.put_many(SLICES, "shop", _slices(_ips(300)))
    proc = Proc(
        "discovery",
        "--kubeconfig",
        kc,
        "--service",
        "catalog",
        "--shm-namespace",
        ns,
        "--debounce",
        "0",
        "--heartbeat",
        "0.5",
        "--log-level",
        "warning",
    )
    # Baseline: an informer in this process whose callback only records the time.
    seen = threading.Event()
    client, _ = load_client(kc)
    timing = WatchTiming(1.0, 5.0, 30.0, 0.05, 0.2)
    inf = EndpointSliceInformer(
        client, "shop", "catalog", lambda e, r: seen.set(), log=EventLog(None), timing=timing
    )
    inf.start()
    reader = None
    try:
        deadline = time.monotonic() + 30
        while reader is None:
            try:
                reader = shm.TableReader(ns)
            except shm.SegmentMissingError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        while reader.generation() < 1:
            time.sleep(0.01)
        inf.watch.synced.wait(10)
        e2e, base = [], []
        for i in range(15):
            seen.clear()
            gen = reader.generation()
            extra = endpoint_slice(f"catalog-x{i}", "catalog", [endpoint(f"10.99.0.{i + 1}")])
            t0 = time.perf_counter()
            api.put(SLICES, "shop", extra)
            seen.wait(5)
            base.append(time.perf_counter() - t0)
            while reader.generation() <= gen:
                time.sleep(0.0002)
            reader.table()
            e2e.append(time.perf_counter() - t0)
            time.sleep(0.3)  # let the publisher settle (heartbeat, log) between changes
        ours, b = statistics.median(e2e), statistics.median(base)
        print(
            f"   300 -> 315 endpoints: {ours * 1e3:6.1f} ms until a reader routes on it  "
            f"(informer callback {b * 1e3:5.1f} ms, ratio {ours / b:4.1f}x)"
        )
    finally:
        if reader is not None:
            reader.close()
        inf.stop()
        client.close()
        proc.signal(signal.SIGTERM)
        proc.wait(10)
        proc.kill()
        api.stop()
        for name in list_segments(ns):
            unlink_name(name)


def main() -> int:
    bench_decode()
    bench_publish()
    bench_end_to_end()
    return 0


if __name__ == "__main__":
    sys.exit(main())
