"""CurlSender: the fan-out on libcurl's multi interface, against real pods on 127.0.0.1.

Python pods (tests/pods.py: one process each, counting the requests they serve at once)
for the behaviour, the C pods of the benchmarks (perf/podserver.c: answers exactly S ms
after the request) where a pod's true service time matters, and a hostile pod in this
process (garbage, resets, endless bodies). The drivers' shared description of a batch
(:class:`workers.fanout.curl_driver.Batch`) is also driven without sockets, on a fake reactor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import lbcore
import shm
import shm.names
from lbcore.outlier import FAIL_CONNECT, FAIL_OTHER
from tests.pods import PodFleet
from workers.fanout.admission import Admission, AdmissionError
from workers.fanout.curl_driver import Batch
from workers.fanout.jobs import RejectedError
from workers.fanout.senders import CallConnectError, CallError, CurlSender
from workers.fanout.settings import FanoutSettings
from workers.routing.router import Router, RouterInputError

KEYS = [f"SKU-{i:05d}" for i in range(100)]


class Host:
    """A published table over ``urls``, routers on it; :meth:`close` frees everything."""

    def __init__(self, urls: list[str]) -> None:
        self.ns = f"fc{uuid.uuid4().hex[:10]}"
        self.store = shm.CounterStore.create(self.ns, rows=8)
        self.writer = shm.TableWriter(self.ns, counters=self.store)
        self.writer.publish(lbcore.RingSet(urls), knobs=shm.Knobs(balance_factor=None))
        self.routers: list[Router] = []

    def router(self, **settings) -> Router:
        r = Router(self.ns, fanout_settings=FanoutSettings(**settings))
        self.routers.append(r)
        return r

    def loads(self) -> shm.HostLoads:
        return self.store.reader().read(time.monotonic_ns())

    def stats(self) -> dict:
        return self.store.reader().stats()

    def close(self) -> None:
        for r in self.routers:
            r.close()
        self.writer.close()
        self.store.close()
        for name in shm.list_segments(self.ns):
            shm.names.unlink_name(name)


@pytest.fixture
def fleet(tmp_path):
    with PodFleet(5, tmp_path, service_ms=2.0) as f:
        yield f


@pytest.fixture
def host(fleet):
    h = Host(fleet.urls)
    yield h
    h.close()


def _values_ok(r: Router, res, keys) -> None:
    want = r.endpoints_of(r.route(keys))
    assert [x.endpoint for x in res] == want
    assert all(x.ok and x.attempts == 1 for x in res), [x for x in res if not x.ok][:3]
    assert [x.value["key"] for x in res] == [
        k.decode() if isinstance(k, bytes) else str(k) for k in keys
    ]
    assert [f"http://127.0.0.1:{x.value['pod']}" for x in res] == want


def _run_on(loop: str, coro):
    if loop == "uvloop":  # (uvicorn's loop when installed: its handles differ)
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_sync_asyncio_and_grouped_fanouts_answer_every_key_from_its_pod(host, loop):
    r = host.router(timeout_s=5.0)
    s = CurlSender("/{key}")
    _values_ok(r, r.fanout(KEYS, s), KEYS)
    _values_ok(r, r.fanout(KEYS, s.group, grouped=True), KEYS)
    _values_ok(r, _run_on(loop, r.afanout(KEYS, s)), KEYS)
    _values_ok(r, _run_on(loop, r.afanout(KEYS, s.group, grouped=True)), KEYS)
    # Once more, on a new loop: the last loop's transport is closed, a new one made.
    _values_ok(r, _run_on(loop, r.afanout(KEYS, s)), KEYS)
    # Keys that need quoting, ints and bytes reach the pod as themselves.
    odd = ["a b/c?d", "é€", 12345, b"raw-bytes", ""]
    _values_ok(r, r.fanout(odd, s), odd)
    # Every call recorded, nothing left in flight; called on its own, one blocking call.
    loads = host.loads()
    grouped_calls = 2 * len(set(r.endpoints_of(r.route(KEYS))))
    assert int(loads.requests_total.sum()) == 3 * len(KEYS) + grouped_calls + len(odd)
    assert int(loads.in_flight.sum()) == 0
    url = r.endpoints_of(r.route(["x"]))[0]
    assert s(url, "x")["key"] == "x"
    assert [v["key"] for v in s.group(url, ["x", "y"])] == ["x", "y"]


def test_every_call_of_a_batch_is_in_flight_together(tmp_path):
    """No pool and no cap below the batch size: a pod sees its share of the batch at once."""
    with PodFleet(5, tmp_path, service_ms=300.0) as slow:
        h = Host(slow.urls)
        try:
            r = h.router(timeout_s=10.0)
            res = r.fanout(KEYS, CurlSender())
            assert all(x.ok for x in res)
            per_pod = {u: 0 for u in slow.urls}
            for u in r.endpoints_of(r.route(KEYS)):
                per_pod[u] += 1
            seen = {p.url: p.stats()["max_active"] for p in slow.pods}
            # Each pod served all of its keys at once (its share of the batch, up to the
            # per-pod connection cap of 32), never in waves of a pool's size.
            for u, n in per_pod.items():
                assert seen[u] >= min(n, 32) - 1, (u, n, seen[u])
            assert sum(seen.values()) >= 80
        finally:
            h.close()


def _hogs(n: int) -> list[subprocess.Popen]:
    """``n`` CPU-bound processes (a loaded machine), each ending by itself within 120 s."""
    code = "import time\nt=time.monotonic()+120\nwhile time.monotonic()<t: pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


@pytest.mark.slow
def test_thousand_ids_on_a_loaded_worker_raise_no_false_timeouts():
    """Pods that answer in 2 ms (C, never the limit), a worker whose CPU the 1,000 calls
    saturate, on a machine with a CPU-bound process per core beside it."""
    from perf.wirepods import WirePods

    with WirePods(5, 2.0) as pods:
        host = Host(pods.urls)
        try:
            r = host.router()  # the default call timeout (1 s)
            keys = [f"ID-{i:06d}" for i in range(1000)]
            hogs = _hogs(os.cpu_count() or 2)
            try:
                for _ in range(3):
                    res = r.fanout(keys, CurlSender())
                    assert [x for x in res if not x.ok] == []
                    res = asyncio.run(r.afanout(keys, CurlSender()))
                    assert [x for x in res if not x.ok] == []
            finally:
                _stop(hogs)
            _no_failures(host)
        finally:
            host.close()


def _no_failures(host: Host) -> None:
    loads = host.loads()
    assert int(loads.requests_total.sum()) == 6000
    assert int(loads.failures_total.sum()) == 0
    assert host.stats()["retries"] == 0 and host.stats()["bulkhead_rejections"] == 0


def test_busy_time_recorded_under_a_saturated_worker_stays_near_the_pods_service_time():
    """A 1,000-call fan-out keeps this worker's CPU busy for far longer than a call takes:
    each answer then waits for Python. The recorded busy time is libcurl's, on the wire."""
    from perf.wirepods import WirePods

    service_ms = 20.0
    with WirePods(5, service_ms) as pods:
        h = Host(pods.urls)
        try:
            r = h.router(timeout_s=5.0)
            keys = [f"ID-{i:06d}" for i in range(1000)]
            r.fanout(keys[:100], CurlSender())  # connections opened
            t0 = time.monotonic()
            res = r.fanout(keys, CurlSender())
            took_ms = (time.monotonic() - t0) * 1e3
            assert all(x.ok for x in res)
            r.call_ledger.flush()
            loads = h.loads()
            n = int(loads.completed.sum())
            assert n == 1100
            mean_ms = float(np.nansum(loads.mean_latency_s * loads.completed)) / n * 1e3
            # Never less than the pod's own time, and near it: the Python time around the
            # calls is not in it. Timed by Python, the 1,000 answers (handled one after
            # the other over took_ms) would read about half the fan-out each; a loaded
            # machine makes the C pods' timers late too, hence the slack.
            assert service_ms <= mean_ms < service_ms + max(10.0, took_ms / 10), (
                mean_ms,
                took_ms,
            )
        finally:
            h.close()


# ------------------------------------------------------------------------------------
# Bad input and hostile pods.


class HostilePod:
    """A TCP server in this process that answers every request the way ``mode`` says."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.sent = 0
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(c,), daemon=True).start()

    def _answer(self, c: socket.socket) -> None:
        with c:
            c.settimeout(5.0)
            with contextlib.suppress(OSError):
                c.recv(65536)
                if self.mode == "garbage":
                    c.sendall(b"\x00\x01 this is not HTTP \xff\r\n\r\n")
                elif self.mode == "reset":
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                elif self.mode == "huge":  # announced: refused before the body
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n")
                    c.sendall(b"x" * 65536)
                elif self.mode == "endless":  # chunked, never ending: stopped on the way
                    c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    chunk = b"10000\r\n" + b"x" * 65536 + b"\r\n"
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline and self.sent < 1 << 30:
                        c.sendall(chunk)
                        self.sent += 65536

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


@pytest.mark.parametrize("mode", ["garbage", "reset"])
def test_a_pod_that_answers_garbage_or_resets_fails_as_connect_and_is_retried(mode, fleet):
    bad = HostilePod(mode)
    h = Host([bad.url, *fleet.urls[:2]])
    try:
        r = h.router(timeout_s=2.0)
        keys = [f"K{i}" for i in range(60)]
        res = r.fanout(keys, CurlSender())
        on_bad = [x for x, u in zip(res, r.endpoints_of(r.route(keys)), strict=True)
                  if u == bad.url]  # fmt: skip
        assert on_bad, "no key routed to the hostile pod"
        # Each of its keys failed there as a connect failure and got its answer elsewhere.
        assert all(x.ok and x.attempts == 2 and x.endpoint != bad.url for x in on_bad)
        slot = int(r.table().slots[r.table().endpoints.index(bad.url)])
        loads = h.loads()
        assert int(loads.failures_total_by_kind[slot, FAIL_CONNECT - 1]) == len(on_bad)
        with pytest.raises(CallConnectError, match=bad.url):
            CurlSender()(bad.url, "k")
    finally:
        h.close()
        bad.close()


@pytest.mark.parametrize("mode", ["huge", "endless"])
def test_an_answer_over_max_body_bytes_is_stopped_not_buffered(mode):
    bad = HostilePod(mode)
    try:
        s = CurlSender(max_body_bytes=1 << 20)
        with pytest.raises(CallError, match="max_body_bytes=1048576") as got:
            s(bad.url, "k", timeout=10.0)
        assert type(got.value) is CallError  # not retried elsewhere: kind "other"
        if mode == "endless":
            # The pod was cut off near the limit, not after it sent its gigabyte.
            deadline = time.monotonic() + 5
            while bad.sent < 1 << 20 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)
            assert bad.sent < 64 << 20
    finally:
        bad.close()


def test_bad_settings_and_arguments_are_clear_errors(host):
    with pytest.raises(ValueError, match=re.escape("must contain '{key}'")):
        CurlSender("/products")
    with pytest.raises(ValueError, match=re.escape("other than '{key}'")):
        CurlSender("/{key}/{id}")
    with pytest.raises(ValueError, match="max_body_bytes"):
        CurlSender(max_body_bytes=0)
    with pytest.raises(ValueError, match="cannot be sent"):
        CurlSender(headers={"X-A": "1\r\nInjected: yes"})
    r = host.router()
    s = CurlSender()
    with pytest.raises(RouterInputError, match="grouped=True"):
        r.fanout(KEYS, s.group)
    # A pod answering something the decoder cannot read: that key's error, named.
    bad = CurlSender(decode=lambda b: int(b))
    res = r.fanout(KEYS[:5], bad)
    assert all(isinstance(x.error, CallError) and "could not be decoded" in str(x.error)
               for x in res)  # fmt: skip
    assert all(x.kind == FAIL_OTHER and x.attempts == 1 for x in res)


# ------------------------------------------------------------------------------------
# FIFO admission.


def test_admission_is_first_come_first_served_and_bounded():
    a = Admission(max_calls=100, queue_size=1, timeout_s=5.0)
    a.enter(100)  # the worker is full
    order: list[str] = []

    def second() -> None:
        a.enter(50)
        order.append("second")

    t = threading.Thread(target=second)
    t.start()
    deadline = time.monotonic() + 5
    while a.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert a.waiting == 1
    with pytest.raises(AdmissionError, match="CSLB_FANOUT_FIFO_SIZE=1"):
        a.enter(1)  # the line is full: refused at once
    a.leave(100)
    t.join(5)
    assert order == ["second"] and a.in_flight == 50
    # A batch larger than the cap runs when the worker has nothing else in flight.
    a.leave(50)
    a.enter(500)
    with pytest.raises(AdmissionError, match=re.escape("within 0.05 s")):
        a.enter(1, wait_s=0.05)
    assert a.waiting == 0
    a.leave(500)


def test_a_fanout_beyond_the_line_is_rejected_with_a_clear_error(tmp_path):
    with PodFleet(3, tmp_path, service_ms=400.0) as slow:
        h = Host(slow.urls)
        try:
            settings = {"max_in_flight": 10, "fifo_size": 1, "fifo_timeout_s": 5.0}
            r = h.router(timeout_s=5.0, **settings)
            got: dict[str, list] = {}

            def run(name: str, n: int) -> None:
                got[name] = r.fanout([f"{name}{i}" for i in range(n)], CurlSender())

            first = threading.Thread(target=run, args=("a", 10))
            first.start()
            deadline = time.monotonic() + 5
            while r.fanout_machinery.admission.in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            second = threading.Thread(target=run, args=("b", 5))
            second.start()
            while r.fanout_machinery.admission.waiting == 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            run("c", 5)  # the line holds one fan-out already: refused at once
            first.join(10)
            second.join(10)
            assert all(x.ok for x in got["a"]) and all(x.ok for x in got["b"])
            assert all(isinstance(x.error, RejectedError) for x in got["c"])
            assert "CSLB_FANOUT_FIFO_SIZE=1" in str(got["c"][0].error)
            loads = h.loads()
            assert int(loads.requests_total.sum()) == 15  # the refused were never sent
            assert int(loads.in_flight.sum()) == 0 and r.fanout_machinery.admission.in_flight == 0
        finally:
            h.close()


# ------------------------------------------------------------------------------------
# The drivers' shared description, without sockets.


class FakeTransport:
    def __init__(self) -> None:
        self.started: list[tuple] = []
        self.cancelled: list = []

    def expect_pods(self, n: int) -> None:
        pass

    def start(self, request, url, what, body, timeout_s, on_done, grouped=False):
        h = object()
        self.started.append((h, url, what, body, timeout_s, on_done))
        return h

    def cancel(self, handle) -> None:
        self.cancelled.append(handle)


class FakeReactor:
    def __init__(self) -> None:
        self.transport = FakeTransport()
        self.timers: list[tuple[float, object]] = []

    def call_later(self, delay_s, fn):
        entry = (delay_s, fn)
        self.timers.append(entry)
        timers = self.timers

        class T:
            def cancel(self) -> None:
                timers.remove(entry)

        return T()


@pytest.fixture
def paper_host():
    """A table of pods that do not exist (nothing here connects to them)."""
    h = Host([f"http://127.0.0.1:{p}" for p in (1, 2, 3, 4, 5)])
    yield h
    h.close()


def test_a_batch_is_driven_by_its_reactor_alone(paper_host):
    """Retry, backoff and deadline of the shared description, with no socket at all."""
    host = paper_host
    r = host.router(retry_backoff_s=0.004)
    s = CurlSender()
    keys = KEYS[:3]
    state = r.fanout_machinery.prepare(keys, s, 1.0, 5.0, False)
    state.refuse_stuck = True
    reactor = FakeReactor()
    batch = Batch(state, reactor, s)
    from workers.fanout.curl_driver import start_jobs

    fan = r.fanout_machinery
    for j in start_jobs(fan, state, fan.settings.cap_for(curl=True))[0]:
        batch.add(j)
    started = reactor.transport.started
    assert len(started) == 3 and not batch.done()  # every first call out at once
    urls = r.endpoints_of(r.route(keys))
    want = [f"{u}/{k}" for u, k in zip(urls, keys, strict=True)]
    assert sorted(x[1] for x in started) == sorted(want)
    call = {x[1]: x for x in started}
    first, second, third = (call[w] for w in want)
    ok = ({"key": "v"}, None, 2_000_000)
    # Answers come 10 ms after their calls began; libcurl says the pod took 2 ms.
    time.sleep(0.01)
    first[5](ok)
    err = CallConnectError("refused", urls[1])
    second[5]((None, err, 100_000))  # the second failed: a retry after the backoff
    assert len(reactor.timers) == 1 and 0.002 <= reactor.timers[0][0] <= 0.004
    _, wake = reactor.timers.pop()
    wake()
    assert len(started) == 4 and started[3][1] != second[1]  # the retry, elsewhere
    assert started[3][1].endswith("/" + keys[1])
    time.sleep(0.01)
    started[3][5](ok)
    assert not batch.done()
    batch.stop()  # the deadline: the third key's call is stopped, cut, not failed
    assert reactor.transport.cancelled == [third[0]] and batch.done()
    res = r.fanout_machinery.finish(state)
    assert res[0].ok and res[0].attempts == 1
    assert res[1].ok and res[1].attempts == 2
    assert not res[2].ok and "deadline" in str(res[2].error)
    loads = host.loads()
    assert int(loads.in_flight.sum()) == 0
    assert int(loads.failures_total.sum()) == 1  # the refused call; not the cut one
    assert int(loads.requests_total.sum()) == 3  # two answers + one failure
    # libcurl's busy times were recorded (2 ms answers, a 0.1 ms refusal), not the clock's.
    lat = float(np.nansum(loads.mean_latency_s * loads.completed))
    assert lat == pytest.approx(2 * 0.002 + 0.0001, abs=1e-6)


def test_when_every_pod_looks_stuck_a_call_still_goes_to_its_own_pod(paper_host):
    """The stuck rule steers calls away from a pod only to one that can take them."""
    from workers.fanout.curl_driver import start_jobs

    r = paper_host.router(timeout_s=0.02)  # (a pod looks stuck after 10 ms)
    keys = [f"K{i}" for i in range(40)]

    def start() -> tuple:
        state = r.fanout_machinery.prepare(keys, CurlSender(), None, 5.0, False)
        state.refuse_stuck = True
        reactor = FakeReactor()
        batch = Batch(state, reactor, state.send)
        fan = r.fanout_machinery
        for j in start_jobs(fan, state, fan.settings.cap_for(curl=True))[0]:
            batch.add(j)
        return state, batch, reactor.transport.started

    first = start()
    time.sleep(0.05)  # every pod's oldest call is now out well past 10 ms
    state, batch, started = start()
    urls = r.endpoints_of(r.route(keys))
    assert sorted(x[1] for x in started) == sorted(
        f"{u}/{k}" for u, k in zip(urls, keys, strict=True)
    )  # each key on its own pod: no retry pod could take it either
    for p, b, _ in (first, (state, batch, None)):
        b.stop()
        res = r.fanout_machinery.finish(p)
        assert not any(isinstance(x.error, RejectedError) for x in res)
    assert paper_host.stats()["bulkhead_rejections"] == 0


def test_a_key_that_cannot_be_sent_is_that_keys_error(host):
    """A bytes key that is no text cannot go into a URL: its own error, the rest answered,
    nothing left in flight."""
    r = host.router(timeout_s=5.0)
    keys = [*KEYS[:20], b"\xff\xfe", *KEYS[20:40]]
    res = r.fanout(keys, CurlSender())
    bad = res[20]
    assert isinstance(bad.error, CallError) and "could not be made" in str(bad.error)
    assert bad.kind == FAIL_OTHER and bad.attempts == 1
    assert all(x.ok for i, x in enumerate(res) if i != 20)
    r.call_ledger.flush()
    assert int(host.loads().in_flight.sum()) == 0
    assert r.fanout(KEYS[:10], CurlSender())[0].ok  # the worker goes on as before


def test_a_call_that_times_out_waiting_for_a_connection_is_not_the_pods_failure():
    """One connection per pod, a pod slower than the timeout: the call on the wire times
    out (the pod's failure), the calls queued behind it in libcurl never reached it."""
    from perf.wirepods import WirePods

    with WirePods(1, 1000.0) as pods:
        h = Host(pods.urls)
        try:
            r = h.router(timeout_s=0.3, connections=1)
            res = r.fanout(KEYS[:5], CurlSender())
            assert all(not x.ok for x in res)
            r.call_ledger.flush()
            loads = h.loads()
            assert int(loads.failures_total.sum()) == 1
            assert int(loads.in_flight.sum()) == 0
        finally:
            h.close()


def test_an_asyncio_fanout_cancelled_by_its_caller_cuts_its_calls(tmp_path):
    with PodFleet(3, tmp_path, service_ms=2000.0) as slow:
        h = Host(slow.urls)
        try:
            r = h.router(timeout_s=5.0)

            async def main() -> None:
                task = asyncio.ensure_future(r.afanout(KEYS[:30], CurlSender()))
                deadline = time.monotonic() + 5
                while (
                    r.call_ledger.in_flight(0)
                    + r.call_ledger.in_flight(1)
                    + r.call_ledger.in_flight(2)
                    == 0
                    and time.monotonic() < deadline
                ):
                    await asyncio.sleep(0.005)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

            asyncio.run(main())
            r.call_ledger.flush()
            loads = h.loads()
            assert int(loads.in_flight.sum()) == 0
            assert int(loads.failures_total.sum()) == 0  # the caller gave up, not the pods
            assert r.fanout_machinery.admission.in_flight == 0
        finally:
            h.close()


def test_the_readme_shows_curlsender_first():
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    example = text.split("## The fan-out in your service", 1)[1].split("```", 2)[1]
    assert "CurlSender" in example and "router.fanout(" in example


def test_jobs_a_failing_batch_never_started_leave_nothing_in_flight(paper_host, monkeypatch):
    """Every job's first call is begun before the batch starts them: if starting one
    fails (a bug), the calls of the jobs never started still end, cut."""
    import workers.fanout.curl_driver as fc

    r = paper_host.router(timeout_s=1.0)
    real = fc.Batch.add
    added = []

    def add(self, job):
        if len(added) == 3:
            raise RuntimeError("a bug while starting a job")
        added.append(job)
        real(self, job)

    monkeypatch.setattr(fc, "thread_reactor", lambda n=None: FakeReactor())
    monkeypatch.setattr(fc.Batch, "add", add)
    with pytest.raises(RuntimeError, match="a bug"):
        r.fanout(KEYS[:20], CurlSender())
    r.call_ledger.flush()
    assert int(paper_host.loads().in_flight.sum()) == 0
    assert sum(r.call_ledger.in_flight(s) for s in range(5)) == 0
