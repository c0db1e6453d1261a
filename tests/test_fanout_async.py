"""router.afanout on one event loop: tasks interleave, slots are given back, calls past their
timeout are cancelled and retried, a cancelled fan-out records its calls' end."""

from __future__ import annotations

import asyncio
import time

import pytest

from lbcore.outlier import FAIL_TIMEOUT
from tests import fanout_harness
from tests.fanout_harness import EPS, KEYS

# The fan-out tests' host: five pods published, routing independent of the loads.
host = fanout_harness.host


def test_afanout_tasks_interleave_on_one_thread(host):
    r = host.router(endpoint_cap=100)  # (no bulkhead moves: every key on its own pod)

    async def asend(url, key, timeout=None):
        await asyncio.sleep(0.001 * (hash(key) % 5))
        return f"{key}@{url}"

    async def main():
        a, b = KEYS[:50], [f"OTHER-{i}" for i in range(70)]
        return a, b, await asyncio.gather(r.afanout(a, asend), r.afanout(b, asend))

    a, b, (ra, rb) = asyncio.run(main())
    for keys, res in ((a, ra), (b, rb)):
        want = r.endpoints_of(r.route(keys))
        assert [x.value for x in res] == [f"{k}@{u}" for k, u in zip(keys, want, strict=True)]
    assert int(host.loads().in_flight.sum()) == 0


def test_an_afanout_that_started_with_no_free_slot_gets_the_slots_given_back(host):
    # Fan-out `a` takes the loop's 4 slots; `b`, started meanwhile, runs on one runner.
    # When `a` ends its slots go to `b` (in line), not only to fan-outs started later:
    # else `b` stays on one runner while each later fan-out takes all the slots again,
    # and runs many times slower than they do, into its deadline (seen on the uvicorn
    # worker: keys never sent, DeadlineError).
    r = host.router(threads=4, endpoint_cap=100)
    out: dict[str, int] = {}
    now: dict[str, int] = {}

    async def asend(url, key, timeout=None):
        who = key.split("-")[0]
        now[who] = now.get(who, 0) + 1
        out[who] = max(out.get(who, 0), now[who])
        total = sum(now.values())
        out["total"] = max(out.get("total", 0), total)
        await asyncio.sleep(0.002)
        now[who] -= 1
        return key

    async def later():
        for i in range(3):  # fan-outs started after `a`, one after the other
            await r.afanout([f"C{i}-{j}" for j in range(20)], asend)

    async def main():
        ta = asyncio.ensure_future(r.afanout([f"A-{j}" for j in range(20)], asend))
        await asyncio.sleep(0)
        tb = asyncio.ensure_future(r.afanout([f"B-{j}" for j in range(100)], asend))
        await ta
        tc = asyncio.ensure_future(later())
        rb = await tb
        await tc
        return rb

    rb = asyncio.run(main())
    assert all(x.ok for x in rb)
    assert out["A"] == 4
    assert out["B"] >= 4  # more runners once `a` gave its slots back (else 1)
    assert out["total"] <= 4 + 1 + 1  # the slots, plus one runner each for b and a `later`
    assert int(host.loads().in_flight.sum()) == 0


def test_afanout_cancels_a_call_past_its_timeout_and_retries_it(host):
    r = host.router()
    frozen = EPS[4]

    async def asend(url, key):  # ignores timeouts: cancellation enforces them
        if url == frozen:
            await asyncio.sleep(30)
        return key

    t0 = time.monotonic()
    res = asyncio.run(r.afanout(KEYS, asend, timeout_s=0.2))
    took = time.monotonic() - t0
    first = r.endpoints_of(r.route(KEYS))
    assert took < 5.0
    assert [x for x in res if not x.ok] == []
    timed_out = [x for i, x in enumerate(res) if first[i] == frozen and x.attempts == 2]
    # The bulkhead's cap (4) of them were sent and timed out; the rest went to their
    # retry pods at once.
    assert len(timed_out) == 4
    assert all(x.endpoint != frozen for i, x in enumerate(res) if first[i] == frozen)
    kinds = host.loads().failures_total_by_kind
    assert int(kinds[host.slot(frozen, r), FAIL_TIMEOUT - 1]) == 4


def test_a_cancelled_afanout_cancels_its_calls_and_records_their_end(host):
    r = host.router(threads=4)
    calls = []

    async def asend(url, key, timeout=None):
        calls.append(key)
        await asyncio.sleep(0.05)
        return key

    async def main():
        task = asyncio.ensure_future(r.afanout(KEYS, asend, timeout_s=5.0, deadline_s=30.0))
        await asyncio.sleep(0.12)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        sent = len(calls)
        await asyncio.sleep(0.3)  # six more rounds of calls, if they went on
        assert len(calls) == sent < len(KEYS)
        out.append(sent)
        # The loop's call slots came back: the next fan-out runs 4 at once again.
        res = await r.afanout(KEYS[:8], asend, timeout_s=5.0)
        assert all(x.ok for x in res)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    out: list[int] = []
    assert asyncio.run(main()) == []
    r.fanout_machinery.ledger.flush()
    loads = host.loads()
    assert int(loads.in_flight.sum()) == 0 and int(loads.failures_total.sum()) == 0
    # The 4 calls out when it was cancelled count as neither success nor failure; the
    # others, and the next fan-out's 8, completed.
    assert int(loads.requests_total.sum()) == out[0] - 4 + 8
