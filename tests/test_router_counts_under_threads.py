"""A gthread worker's threads route and track on one Router while the GIL switches between
them as often as it can and the counters grow under them: every decision, fallback and
fan-out is counted once, in the process's totals and in the shared row alike (the
decision counts and the newest bucket's starts and ends are written by kernel calls that
take no lock of ours)."""

from __future__ import annotations

import sys
import threading

import lbcore
from tests import router_harness as harness
from tests.router_harness import endpoints, knobs

namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept


def test_counts_stay_exact_with_threads_switching_and_counters_growing(host):
    host.publish(lbcore.RingSet(endpoints(8)), knobs=knobs(percentage=60.0))  # fallbacks too
    r = host.router(threads=True)
    threads, batches = 6, 250
    errors: list[BaseException] = []
    go = threading.Barrier(threads + 1)
    keys_routed = [0] * threads
    fallbacks = [0] * threads

    def work(t: int) -> None:
        try:
            go.wait()
            for i in range(batches):
                keys = [f"t{t}-{i}-{j}" for j in range(1 + (i % 4))]
                idx, table = r.route_table(keys)
                keys_routed[t] += len(keys)
                fallbacks[t] += int((idx < 0).sum())
                with r.track(idx, table):
                    pass
        except BaseException as exc:
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in ts:
            th.start()
        go.wait()
        host.store.ensure_columns(128)  # a new matrix while they record: followed
        for th in ts:
            th.join(timeout=120)
    finally:
        sys.setswitchinterval(old)
    assert not errors and not any(th.is_alive() for th in ts)
    total, fell = sum(keys_routed), sum(fallbacks)
    st = r.stats()
    assert (st["decisions"], st["fallbacks"]) == (total, fell) and fell > 0
    shared = host.store.reader().stats()
    assert (shared["decisions"], shared["fallbacks"]) == (total, fell)
    assert host.store.matrix_view().columns >= 128  # (the matrix did move)
    loads = host.loads()
    assert loads.in_flight.sum() == 0
    assert loads.completed.sum() == total - fell
