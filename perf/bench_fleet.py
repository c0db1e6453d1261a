"""A healthy, equal fleet under load: ``python perf/bench_fleet.py`` (perf part ``fleet``).

Five pods answering in exactly 2 ms (:class:`perf.wirepods.WirePods`, one C process) and
a user service under real gunicorn (``-c python:workers.gunicorn_conf --workers 2
--threads 4 -k gthread``, ``perf/fleet_app.py``) whose embedded discovery reads a static
endpoints file. Four client threads each post 100 fresh IDs per request to ``POST
/fanout`` on keep-alive connections for a bounded time and count; the service fans them
out with ``Router.attach().fanout(ids, SENDER)``. Measured once with ``CurlSender`` and
once with ``Urllib3Sender(maxsize=8)`` (the transport before issue 17), in one run, each
on its own gunicorn and namespace, the same pods.

Reported per sender, over the measured window (after a warm-up): requests/s, the
client's p50/p90 per request, failed keys (from the answers), decisions and keys moved
by bounded load (``cslb_bounded_load_moves_total`` / ``cslb_decisions_total``),
bulkhead rejections, retries, new TCP connections the pods accepted per request (and
closed: churn, not a pool growing; and how many are open at the end), the
service's CPU per request, and the per-pod latency cslb recorded
(``cslb_endpoint_latency_seconds``, scraped a few times during the load) next to the
pods' true 2 ms. Issue 17's targets (for ``curl``): moved ≤ 5 % of decisions, no
bulkhead rejection, no failed key. Everything runs on 127.0.0.1, is stopped by PID and
leaves no shared-memory segment.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perf.common import (
    cpu_seconds,
    process_tree,
    stop_tree,
    unique_namespace,
    unlink_namespace,
    write_json,
)
from perf.wirepods import CompilerMissingError, WirePods, build

REPO = Path(__file__).resolve().parent.parent
PERF = Path(__file__).resolve().parent
PODS = 5
SERVICE_MS = 2.0
CLIENTS = 4
IDS = 100
SENDERS = ("curl", "urllib3")
#: Issue 17's bars on a healthy, equal fleet.
MOVED_BAR_PCT = 5.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(
    port: int, method: str, path: str, body: bytes | None = None, timeout_s: float = 10.0
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _metrics(port: int) -> dict[str, list[tuple[str, float]]]:
    """``/metrics`` as {name: [(labels, value), ...]}."""
    status, body = _request(port, "GET", "/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    out: dict[str, list[tuple[str, float]]] = {}
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        try:
            out.setdefault(name, []).append((labels.rstrip("}"), float(value)))
        except ValueError:
            continue
    return out


def _total(m: dict[str, list[tuple[str, float]]], name: str) -> float:
    return sum(v for _, v in m.get(name, []))


def _per_endpoint(m: dict[str, list[tuple[str, float]]], name: str) -> dict[str, float]:
    out = {}
    for labels, v in m.get(name, []):
        for part in labels.split(","):
            k, _, val = part.partition("=")
            if k == "endpoint":
                out[val.strip('"')] = v
    return out


class Service:
    """The user service under gunicorn, in its own session; :meth:`stop` stops it by PID."""

    def __init__(self, sender: str, endpoints_file: Path, log_path: Path) -> None:
        self.port = _free_port()
        self.namespace = unique_namespace("fl")
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CSLB_") and k != "GUNICORN_CMD_ARGS"
        }
        env.update(
            {
                "CSLB_SHM_NAMESPACE": self.namespace,
                "CSLB_ENDPOINTS_FILE": str(endpoints_file),
                "CSLB_FLEET_SENDER": sender,
                "PYTHONPATH": os.pathsep.join([str(PERF), str(REPO)]),
            }
        )
        argv = [
            sys.executable, "-m", "gunicorn", "-c", "python:workers.gunicorn_conf",
            "--bind", f"127.0.0.1:{self.port}", "--workers", "2", "--threads", "4",
            "-k", "gthread", "--timeout", "60", "fleet_app:app",
        ]  # fmt: skip
        self.log_path = log_path
        self._log = open(log_path, "wb")  # closed in stop()
        self.proc = subprocess.Popen(
            argv,
            cwd=str(PERF),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pids: set[int] = {self.proc.pid}

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until /metrics shows a routing table and a fan-out of 100 IDs has no failure."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        for i in range(10_000):
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited ({self.proc.returncode}):\n{self.log()}")
            self.pids.update(process_tree(self.proc.pid))
            try:
                m = _metrics(self.port)
                if _total(m, "cslb_table_generation") >= 1:
                    ids = json.dumps([f"READY{i:04d}-{j:03d}" for j in range(IDS)]).encode()
                    status, body = _request(self.port, "POST", "/fanout", ids)
                    last = (status, body[:200])
                    if status == 200 and json.loads(body)["failed"] == 0:
                        return
            except (OSError, http.client.HTTPException, ValueError, RuntimeError) as exc:
                last = exc
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        raise RuntimeError(
            f"the service did not get ready in {timeout_s} s: {last!r}\n{self.log()}"
        )

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def cpu_s(self) -> float:
        """CPU seconds of the whole tree (master, workers, discovery) so far."""
        self.pids.update(process_tree(self.proc.pid))
        return cpu_seconds(sorted(self.pids))

    def stop(self) -> None:
        """SIGTERM the master, then SIGKILL whatever of the tree is left, by PID."""
        self.pids.update(process_tree(self.proc.pid))
        stop_tree(self.proc.pid, sorted(self.pids), timeout_s=10.0)
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()
        unlink_namespace(self.namespace)


class Load:
    """``CLIENTS`` threads posting ``IDS`` fresh IDs per request, bounded in time and count."""

    def __init__(
        self, port: int, tag: str, clients: int = CLIENTS, max_requests: int = 100_000
    ) -> None:
        self.port = port
        self.tag = tag
        self.max_requests = max_requests
        self.lock = threading.Lock()
        self.measuring = False
        self.took: list[float] = []
        self.fanout_s: list[float] = []  # the fan-out's own wall time, in the service
        self.failed = 0
        self.wrong = 0
        self.errors: list[str] = []
        self.requests = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(c,), daemon=True) for c in range(clients)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _run(self, c: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json"}
        try:
            for i in range(self.max_requests):
                if self._stop.is_set():
                    break
                body = json.dumps([f"{self.tag}{c}-{i:07d}-{j:03d}" for j in range(IDS)]).encode()
                t0 = time.perf_counter()
                try:
                    conn.request("POST", "/fanout", body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    took = time.perf_counter() - t0
                    doc = json.loads(data) if resp.status == 200 else None
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                    with self.lock:
                        if self.measuring:
                            self.errors.append(repr(exc))
                            self.failed += IDS
                    continue
                with self.lock:
                    if not self.measuring:
                        continue
                    self.requests += 1
                    self.took.append(took)
                    if doc is None:
                        self.failed += IDS
                        self.errors.append(f"HTTP {resp.status}: {data[:200]!r}")
                    else:
                        self.failed += int(doc["failed"])
                        self.wrong += int(doc["wrong"])
                        self.fanout_s.append(float(doc["took_s"]))
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def _one(
    sender: str,
    pods: WirePods,
    endpoints_file: Path,
    log_dir: Path,
    seconds: float,
    warmup_s: float,
    log: Callable[[str], None],
    clients: int = CLIENTS,
) -> dict[str, Any]:
    svc = Service(sender, endpoints_file, log_dir / f"gunicorn-{sender}.log")
    load: Load | None = None
    try:
        svc.wait_ready()
        load = Load(svc.port, tag=f"{sender[:2].upper()}{os.getpid() % 1000:03d}", clients=clients)
        load.start()
        time.sleep(warmup_s)
        m0 = _metrics(svc.port)
        pods.reset()
        _, open0 = pods.connections()
        cpu0 = svc.cpu_s()
        with load.lock:
            load.measuring = True
        t0 = time.monotonic()
        scrapes: list[dict[str, float]] = []
        n_scrapes = 4
        for k in range(n_scrapes):  # latency gauges while the load runs
            time.sleep(seconds / n_scrapes)
            scrapes.append(_per_endpoint(_metrics(svc.port), "cslb_endpoint_latency_seconds"))
            del k
        with load.lock:
            load.measuring = False
        elapsed = time.monotonic() - t0
        m1 = _metrics(svc.port)
        cpu1 = svc.cpu_s()
        accepted, open1 = pods.connections()
        load.stop()
    finally:
        if load is not None:
            load.stop()
        svc.stop()

    def delta(name: str) -> float:
        return _total(m1, name) - _total(m0, name)

    decisions = delta("cslb_decisions_total")
    moves = delta("cslb_bounded_load_moves_total")
    lat = {}
    for url in pods.urls:
        got = [s[url] * 1e3 for s in scrapes if url in s]
        lat[url] = statistics.median(got) if got else float("nan")
    took = sorted(load.took)
    n = max(1, load.requests)
    row = {
        "fleet": True,
        "sender": sender,
        "clients": clients,
        "seconds": elapsed,
        "requests": load.requests,
        "requests_per_s": load.requests / elapsed,
        "p50_ms": statistics.median(took) * 1e3 if took else float("nan"),
        "p90_ms": took[int(0.9 * len(took))] * 1e3 if took else float("nan"),
        "fanout_p50_ms": statistics.median(load.fanout_s) * 1e3 if load.fanout_s else float("nan"),
        "failed_keys": load.failed + load.wrong,
        "errors": load.errors[:5],
        "decisions": decisions,
        "moves": moves,
        "moved_pct": 100.0 * moves / decisions if decisions else float("nan"),
        "bulkhead_rejections": delta("cslb_bulkhead_rejections_total"),
        "retries": delta("cslb_retries_total"),
        "new_conns_per_request": accepted / n,
        "closed_conns_per_request": (accepted - (open1 - open0)) / n,
        "open_conns": open1,
        "server_cpu_ms_per_request": (cpu1 - cpu0) * 1e3 / n,
        "latency_ms": lat,
        "latency_ms_median": statistics.median(lat.values()) if lat else float("nan"),
        "service_ms": SERVICE_MS,
    }
    log(
        f"  {sender:8s} {row['requests']:6d} req  {row['requests_per_s']:7.1f} req/s  "
        f"p50 {row['p50_ms']:6.1f} ms (fan-out {row['fanout_p50_ms']:5.1f})  "
        f"failed keys {row['failed_keys']:5d}  "
        f"moved {row['moved_pct']:5.2f} % of {decisions:,.0f}  bulkhead "
        f"{row['bulkhead_rejections']:,.0f}  retries {row['retries']:,.0f}  new conns/req "
        f"{row['new_conns_per_request']:.2f} (closed {row['closed_conns_per_request']:.2f}, open "
        f"{open1})  CPU/req {row['server_cpu_ms_per_request']:.1f} ms  "
        f"recorded latency per pod (ms) " + " ".join(f"{v:.2f}" for v in lat.values())
    )
    return row


def run(
    quick: bool = False,
    log: Callable[[str], None] = print,
    clients: int = CLIENTS,
    seconds: float | None = None,
    senders: tuple[str, ...] = SENDERS,
) -> dict[str, Any]:
    """The ``fleet`` part of ``python -m perf``: one row per sender, targets, notes.

    ``clients``, ``seconds`` (measured, per sender) and ``senders``: the command line's
    ``--clients``, ``--seconds`` and ``--senders``; the suite runs the defaults.
    """
    import tempfile

    seconds = seconds or (4.0 if quick else 20.0)
    warmup_s = 1.0 if quick else 3.0
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        build()
    except CompilerMissingError as exc:
        log(f"fleet: not run: {exc}")
        return {"rows": [], "notes": [f"Not run: {exc}"]}
    with tempfile.TemporaryDirectory(prefix="cslb-fleet-") as tmp, WirePods(
        PODS, SERVICE_MS
    ) as pods:  # fmt: skip
        eps = Path(tmp) / "endpoints.json"
        eps.write_text(json.dumps({"endpoints": [{"address": u} for u in pods.urls]}))
        log(f"fleet: {PODS} C pods at {SERVICE_MS:g} ms; gunicorn gthread 2 workers x 4 "
            f"threads; {clients} clients x {IDS} fresh IDs per request; {seconds:g} s "
            f"measured after {warmup_s:g} s")  # fmt: skip
        for sender in senders:
            try:
                rows.append(_one(sender, pods, eps, Path(tmp), seconds, warmup_s, log, clients))
            except (RuntimeError, ImportError, OSError) as exc:
                notes.append(f"{sender}: not measured: {str(exc)[:600]}")
                log(f"  {sender}: not measured: {exc}")
    for r in list(rows):  # (a target row is appended for the curl row)
        if r["sender"] != "curl":
            continue
        met = (
            r["moved_pct"] <= MOVED_BAR_PCT
            and r["bulkhead_rejections"] == 0
            and r["failed_keys"] == 0
        )
        rows.append(
            {
                "fleet_target": True,
                "sender": "curl",
                "moved_pct": r["moved_pct"],
                "bulkhead_rejections": r["bulkhead_rejections"],
                "failed_keys": r["failed_keys"],
                "met": met,
            }
        )
        notes.append(
            f"Issue 17 target (curl): moved {r['moved_pct']:.2f} % of decisions (bar "
            f"{MOVED_BAR_PCT:g} %), bulkhead rejections {r['bulkhead_rejections']:.0f}, failed "
            f"keys {r['failed_keys']}: {'met' if met else 'MISSED'}."
        )
    notes.append(
        "A healthy, equal fleet: the pods never change and all answer in "
        f"{SERVICE_MS:g} ms, so every key bounded load moves and every bulkhead rejection "
        "comes from what the workers measured, not from the pods. Recorded latency: "
        "cslb_endpoint_latency_seconds (the mean over the occupancy window), median of "
        "4 scrapes during the load. Pods, service and clients share the machine's cores "
        "(nothing pinned): the workers are CPU-bound, as in production under load."
    )
    return {"rows": rows, "notes": notes}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures (``--json FILE`` writes them too)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 s per sender (a smoke run)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    ap.add_argument("--clients", type=int, default=CLIENTS, help="client threads (default 4)")
    ap.add_argument("--seconds", type=float, help="measured seconds per sender (default 20)")
    ap.add_argument(
        "--senders", default=",".join(SENDERS), help="comma-separated: curl, urllib3 (both)"
    )
    args = ap.parse_args(argv)
    senders = tuple(x.strip() for x in args.senders.split(",") if x.strip())
    if not senders or any(x not in SENDERS for x in senders):
        ap.error("--senders: expected a comma-separated list of curl, urllib3")
    if not 1 <= args.clients <= 64 or (args.seconds is not None and not 0 < args.seconds <= 600):
        ap.error("--clients: 1 to 64; --seconds: more than 0, at most 600")
    got = run(quick=args.quick, clients=args.clients, seconds=args.seconds, senders=senders)
    for n in got["notes"]:
        print(f"* {n}")
    write_json(args.json, got)
    return 0


if __name__ == "__main__":
    sys.exit(main())
