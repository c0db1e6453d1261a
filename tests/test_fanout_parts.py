"""The fan-out helper's parts alone: retry budget, failure log, call ledger, senders, knobs."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import lbcore
import shm
from lbcore.knobs import KnobError, docs_table
from lbcore.outlier import FAIL_CONNECT, FAIL_NONE, FAIL_OTHER, FAIL_STATUS, FAIL_TIMEOUT
from tests.gunicorn_harness import free_port
from tests.pods import PodFleet
from workers.fanout.budget import RetryBudget
from workers.fanout.failurelog import FailureLog
from workers.fanout.ledger import CallLedger
from workers.fanout.senders import (
    CallAnswerError,
    CallConnectError,
    CallStatusError,
    CallTimeoutError,
    HttpxSender,
    Urllib3Sender,
    failure_kind,
)
from workers.fanout.settings import FANOUT_KNOBS, FanoutSettings
from workers.routing.recording import Recording
from workers.routing.router import Router

S = 1_000_000_000
SETTINGS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"


# ------------------------------------------------------------------------------------
# Retry budget.


def test_budget_allows_a_percentage_of_calls_plus_a_floor_within_its_window():
    b = RetryBudget(percent=0.2, floor_per_s=0.0, window_s=10.0)
    t = 100 * S
    b.deposit(t, 100)
    assert sum(b.withdraw(t) for _ in range(30)) == 20  # 20 % of 100 calls
    b.deposit(t + S, 10)
    assert sum(b.withdraw(t + S) for _ in range(5)) == 2
    # Ten seconds later the deposits and the withdrawals have aged out together.
    assert not b.withdraw(t + 10 * S)
    b.deposit(t + 11 * S, 5)
    assert sum(b.withdraw(t + 11 * S) for _ in range(5)) == 1
    floor = RetryBudget(percent=0.0, floor_per_s=2.0, window_s=5.0)
    assert sum(floor.withdraw(t) for _ in range(20)) == 10  # 2/s kept for 5 s
    assert floor.balance(t) == 0
    with pytest.raises(ValueError, match="window_s >= 1"):
        RetryBudget(window_s=0.5)


def test_budget_is_thread_safe():
    b = RetryBudget(percent=0.1, floor_per_s=0.0)
    t = 5 * S
    b.deposit(t, 1000)
    got = []
    threads = [
        threading.Thread(target=lambda: got.append(sum(b.withdraw(t) for _ in range(100))))
        for _ in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sum(got) == 100


# ------------------------------------------------------------------------------------
# Failure log.


class Clock:
    def __init__(self) -> None:
        self.now = 10 * S

    def __call__(self) -> int:
        return self.now


def test_failure_log_writes_a_few_lines_per_endpoint_per_second_then_a_summary(caplog):
    clock = Clock()
    flog = FailureLog(logging.getLogger("cslb.test"), 3, clock)
    with caplog.at_level(logging.WARNING, logger="cslb.test"):
        for i in range(100):
            flog.failed({"event": "cslb_call_failed", "endpoint": "http://10.0.0.1:80", "i": i})
        for i in range(2):
            flog.failed({"event": "cslb_call_failed", "endpoint": "http://10.0.0.2:80", "i": i})
        flog.tick()  # the second is not over: no summary yet
        n_before = len(caplog.records)
        clock.now += S
        flog.tick()
    lines = [json.loads(r.getMessage()) for r in caplog.records]
    assert n_before == 5
    assert [x["i"] for x in lines[:3]] == [0, 1, 2]
    summary = lines[-1]
    assert summary["event"] == "cslb_call_failures_suppressed"
    assert summary["endpoint"] == "http://10.0.0.1:80" and summary["suppressed"] == 97
    assert summary["pod_ip"] == "10.0.0.1"
    assert len(lines) == 6  # nothing was left out for the second endpoint
    assert caplog.records[0].cslb["i"] == 0  # the fields, for structured handlers


def test_failure_log_summary_comes_with_the_next_line_of_the_next_second(caplog):
    clock = Clock()
    flog = FailureLog(logging.getLogger("cslb.test"), 1, clock)
    with caplog.at_level(logging.WARNING, logger="cslb.test"):
        for _ in range(4):
            flog.failed({"endpoint": "e"})
        clock.now += 2 * S
        flog.failed({"endpoint": "e", "again": True})
    lines = [json.loads(r.getMessage()) for r in caplog.records]
    assert [x.get("suppressed") for x in lines] == [None, 3, None]
    assert lines[-1]["again"] is True
    # Another endpoint's failure line brings the summary of one that stopped failing.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cslb.test"):
        for _ in range(5):
            flog.failed({"endpoint": "dead"})
        clock.now += 2 * S
        flog.failed({"endpoint": "other"})
    lines = [json.loads(r.getMessage()) for r in caplog.records]
    assert [(x["endpoint"], x.get("suppressed")) for x in lines] == [
        ("dead", None),
        ("other", None),
        ("dead", 4),
    ]


# ------------------------------------------------------------------------------------
# Call ledger.


@pytest.fixture
def store():
    ns = f"lg{uuid.uuid4().hex[:10]}"
    st = shm.CounterStore.create(ns, rows=4, columns=16)
    yield st
    st.close()


def test_ledger_writes_in_batched_steps_what_calls_did(store):
    rec = store.claim()
    now = [1_000 * S]
    led = CallLedger(Recording(lambda: now[0], rec))
    reader = store.reader()
    t1 = led.begin(3, cap=10)
    now[0] += 1_000  # (1 µs: not due)
    t2 = led.begin(3, cap=10)
    assert led.pending and led.in_flight(3) == 2
    # The first call after a quiet spell is written at once, the next one waits.
    assert reader.read(now[0], 16).in_flight[3] == 1
    led.flush()
    assert not led.pending and reader.read(now[0], 16).in_flight[3] == 2
    now[0] += 5_000_000
    led.end(3, t1, FAIL_TIMEOUT)  # due (5 ms since the last write): written at once
    now[0] += 1_000
    led.end(3, t2)
    led.tally("retries", 2)
    led.flush()
    loads = reader.read(now[0], 16)
    assert loads.in_flight[3] == 0 and loads.completed[3] == 2
    assert loads.failures_total_by_kind[3].tolist() == [0, 1, 0, 0]
    assert loads.mean_latency_s[3] == pytest.approx(5_001_000 / 1e9)  # each its own start
    assert store.reader().stats()["retries"] == 2
    # The bulkhead: at the cap a call is refused and nothing is recorded for it.
    assert led.begin(5, cap=1) > 0
    assert led.begin(5, cap=1) == -1
    led.flush()
    assert reader.read(now[0], 16).in_flight[5] == 1
    _, ok = led.begin_many([5, 6, 6, -1], cap=1)
    assert ok == [False, True, False, True]  # (-1: not recorded, always admitted)
    assert not led.pending  # calls that start together: one step, at once
    assert reader.read(now[0], 16).in_flight[[5, 6]].tolist() == [1, 1]


def watched_claim(store, reader, clock):
    """A row claimed with kernel adders that, after each write into it (each kernel call:
    a step is several), read what other workers see in flight; returns the recorder and
    what they saw."""
    import shm.counters.recorder as recorder_mod

    seen: list[list[int]] = []

    def watching(make_adder):
        def make():
            add = make_adder()

            def watched_add(*a):
                add(*a)
                seen.append(reader.read(clock(), 16).in_flight[:4].tolist())

            return watched_add

        return make

    # (the recorder resolves its kernel entry points once, when it is made)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recorder_mod, "scatter_adder", watching(recorder_mod.scatter_adder))
        mp.setattr(recorder_mod, "calls_adder", watching(recorder_mod.calls_adder))
        return store.claim(), seen


def test_ledger_never_shows_a_call_in_flight_that_is_not(store):
    """A step with ends, complete calls and new starts: every state a reader can catch
    counts at most the calls really out (ends first, starts last); the end state counts
    exactly them."""
    now = [1_000 * S]
    rec, seen = watched_claim(store, store.reader(), lambda: now[0])
    led = CallLedger(Recording(lambda: now[0], rec))
    a = led.begin(1, cap=10)  # written at once (first after a quiet spell)
    now[0] += 1_000
    b = led.begin(1, cap=10)  # pending ...
    now[0] += 1_000
    led.end(1, b)  # ... and over before any write: a complete call
    led.end(1, a)  # its start was written
    now[0] += 1_000
    led.begin(2, cap=10)  # still out
    led.begin(3, cap=10)
    out = {1: 0, 2: 1, 3: 1}
    seen.clear()
    led.flush()
    # One write (lbcore.kernel.add_calls: ends, a release fence, then starts); a reader
    # between writes sees the end state at most.
    assert len(seen) >= 1
    for cells in seen:
        assert all(cells[s] <= n for s, n in out.items()), seen
    assert seen[-1][1:4] == [0, 1, 1]
    loads = store.reader().read(now[0], 16)
    assert loads.completed[1] == 2 and loads.in_flight[1] == 0
    assert loads.mean_latency_s[1] == pytest.approx((2_000 + 1_000) / 2 / 1e9)


def test_ledger_from_many_threads_loses_nothing(store):
    rec = shm.LockedRecorder(store.claim())
    led = CallLedger(Recording(recorder=rec))

    def calls():
        for i in range(300):
            t = led.begin(i % 7, cap=1000)
            led.end(i % 7, t, FAIL_CONNECT if i % 10 == 0 else 0)

    threads = [threading.Thread(target=calls) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    led.flush()
    loads = store.reader().read(time.monotonic_ns(), 16)
    assert int(loads.requests_total.sum()) == 1200
    assert int(loads.failures_total.sum()) == 120
    assert int(loads.in_flight.sum()) == 0


# ------------------------------------------------------------------------------------
# Senders, against real pods.


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    d = tmp_path_factory.mktemp("pods")
    with PodFleet(2, d, service_ms=1.0) as f, PodFleet(1, d, service_ms=300.0) as slow:
        f.slow = slow.pods[0]
        yield f


def test_urllib3_sender_values_and_failure_kinds(fleet):
    send = Urllib3Sender(timeout_s=2.0)
    a, b = fleet.pods
    assert send(a.url, "SKU 1/ä") == {"key": "SKU 1/ä", "pod": a.port}
    assert send.group(b.url, ["x", "y"]) == [{"key": k, "pod": b.port} for k in "xy"]
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(CallConnectError) as e:
        send(closed, "k")
    assert failure_kind(e.value) == FAIL_CONNECT
    b.set_status(503)
    try:
        with pytest.raises(CallStatusError) as e:
            send(b.url, "k")
        assert e.value.status == 503 and failure_kind(e.value) == FAIL_STATUS
        with pytest.raises(CallAnswerError) as e:  # not a configured failure status
            Urllib3Sender(fail_statuses=[500])(b.url, "k")
        assert failure_kind(e.value) == FAIL_NONE and e.value.status == 503
    finally:
        b.set_status(200)
    with pytest.raises(CallTimeoutError) as e:
        Urllib3Sender(timeout_s=5.0)(fleet.slow.url, "k", timeout=0.05)
    assert failure_kind(e.value) == FAIL_TIMEOUT


def test_httpx_sender_values_and_failure_kinds(fleet):
    send = HttpxSender(timeout_s=2.0)
    a, b = fleet.pods
    closed = f"http://127.0.0.1:{free_port()}"

    async def main():
        assert await send(a.url, "k1") == {"key": "k1", "pod": a.port}
        assert await send.group(b.url, [1, 2]) == [{"key": str(k), "pod": b.port} for k in (1, 2)]
        with pytest.raises(CallConnectError):
            await send(closed, "k")
        b.set_status(502)
        try:
            with pytest.raises(CallStatusError):
                await send(b.url, "k")
        finally:
            b.set_status(200)
        with pytest.raises(CallTimeoutError):
            await send(fleet.slow.url, "k", timeout=0.05)
        await send.aclose()

    asyncio.run(main())


@pytest.fixture
def fleet_router(fleet):
    """A router over the fleet's two pods, 4 fan-out threads (2 calls per pod at once)."""
    ns = f"sp{uuid.uuid4().hex[:10]}"
    st = shm.CounterStore.create(ns, rows=4)
    writer = shm.TableWriter(ns, counters=st)
    writer.publish(lbcore.RingSet(fleet.urls), knobs=shm.Knobs(balance_factor=None))
    r = Router(ns, fanout_settings=FanoutSettings(threads=4, timeout_s=5.0))
    try:
        yield r
    finally:
        r.close()
        writer.close()
        st.close()


def test_the_ready_made_senders_pool_connections_per_worker(fleet, fleet_router):
    """500 calls over two real pods, 4 threads and 2 calls per pod at once (urllib3), or
    4 calls at once (httpx): each pod accepts at most as many connections as calls were
    out to it at once (not one per call or per fan-out)."""
    r = fleet_router
    keys = [f"SKU-{i}" for i in range(100)]

    def opened(run):
        before = [p.stats() for p in fleet.pods]
        run()
        after = [p.stats() for p in fleet.pods]
        assert sum(a["served"] - b["served"] for a, b in zip(after, before, strict=True)) == 500
        # (less the second question's own connection)
        return [a["connections"] - b["connections"] - 1 for a, b in zip(after, before, strict=True)]

    send = Urllib3Sender(timeout_s=5.0)

    def threads():
        for _ in range(5):
            assert all(x.ok for x in r.fanout(keys, send, deadline_s=30.0))

    got = opened(threads)
    assert all(1 <= n <= 2 for n in got), got
    asend = HttpxSender(timeout_s=5.0)

    async def main():
        for _ in range(5):
            assert all(x.ok for x in await r.afanout(keys, asend, deadline_s=30.0))
        await asend.aclose()

    got = opened(lambda: asyncio.run(main()))
    assert all(1 <= n <= 2 for n in got), got


def test_senders_fail_on_the_statuses_they_are_configured_with(fleet, monkeypatch):
    a = fleet.pods[0]
    a.set_status(429)
    try:
        with pytest.raises(CallAnswerError) as e:  # by default a 4xx is the caller's
            Urllib3Sender()(a.url, "k")
        assert failure_kind(e.value) == FAIL_NONE
        with pytest.raises(CallStatusError) as e:
            Urllib3Sender(fail_statuses=[429, 503])(a.url, "k")
        assert e.value.status == 429 and failure_kind(e.value) == FAIL_STATUS

        async def main():
            with pytest.raises(CallStatusError) as e:
                await HttpxSender(fail_statuses={429})(a.url, "k")
            assert e.value.status == 429
            with pytest.raises(CallAnswerError) as e:
                await HttpxSender()(a.url, "k")
            assert failure_kind(e.value) == FAIL_NONE

        asyncio.run(main())
    finally:
        a.set_status(200)
    # Without httpx installed, HttpxSender says what to install (at once, not per call).
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'cslb[httpx]'")):
        HttpxSender()


def test_failure_kind_of_other_clients_errors():
    import httpx
    from urllib3 import exceptions as u3

    assert failure_kind(TimeoutError()) == FAIL_TIMEOUT
    assert failure_kind(ConnectionResetError()) == FAIL_CONNECT
    assert failure_kind(u3.NewConnectionError(None, "refused")) == FAIL_CONNECT
    assert failure_kind(u3.ReadTimeoutError(None, "/", "slow")) == FAIL_TIMEOUT
    assert failure_kind(u3.ProtocolError("reset")) == FAIL_CONNECT
    assert failure_kind(httpx.ConnectError("x")) == FAIL_CONNECT
    assert failure_kind(httpx.ReadTimeout("x")) == FAIL_TIMEOUT
    assert failure_kind(ValueError("bad json")) == FAIL_OTHER
    with pytest.raises(ValueError, match="key"):
        Urllib3Sender(path="/products")


# ------------------------------------------------------------------------------------
# Settings.


def test_settings_are_declared_once_validated_and_documented():
    env = {"CSLB_FANOUT_THREADS": "16", "CSLB_FALLBACK_URL": "http://skipper.default:9999/"}
    s = FanoutSettings.from_env(env)
    assert s.threads == 16 and s.fallback_url == "http://skipper.default:9999"
    assert s.deadline_for(1.0) == pytest.approx(2.005) and s.cap_for(asyncio=False) == 8
    assert FanoutSettings(deadline_s=0.5, endpoint_cap=3).deadline_for(1.0) == 0.5
    for var, bad in (
        ("CSLB_FANOUT_THREADS", "0"),
        ("CSLB_FALLBACK_URL", "skipper:9999"),
        ("CSLB_FANOUT_TIMEOUT", "0"),
        ("CSLB_RETRY_TO", "elsewhere"),
        ("CSLB_RETRY_BUDGET_PERCENT", "-1"),
    ):
        with pytest.raises(KnobError, match=re.escape(var)):
            FanoutSettings.from_env({var: bad})
    assert len({k.env for k in FANOUT_KNOBS}) == len(FANOUT_KNOBS)
    assert docs_table(FANOUT_KNOBS) in SETTINGS.read_text(encoding="utf-8")
