"""HTTP: ``cslb serve`` under load from wrk, next to a no-op app that only parses the body.

Two servers run side by side on 127.0.0.1, each started with the same ``cslb serve``
command (gunicorn, the cslb config, embedded discovery on a 100-endpoint file, one
worker per core): one serves the bundled routing app, the other
:mod:`perf.noop_app`, which parses the same bodies with the same code and answers
without routing. wrk (one thread, a few connections, fixed duration) posts fresh SKU
batches — JSON arrays, text lines and the compact binary body
(:func:`workers.app.pack_keys`: key count, lengths, then the keys' bytes) — of 100 and
1,000 IDs; the runs of the two servers alternate.
Figures: requests/s, decisions/s (requests × IDs), wrk's p50 and p99 latency, and the
server's CPU time per request (user + system of the gunicorn master and all its
children, from ``/proc/<pid>/stat`` before and after the run). Every process is stopped
by PID and every shared-memory segment of the run unlinked.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from perf.common import (
    children_of,
    cpu_seconds,
    endpoint_urls,
    make_skus,
    process_tree,
    stop_tree,
    unique_namespace,
    unlink_namespace,
)

LUA = Path(__file__).resolve().parent / "wrk_post.lua"
BODY_TYPES = {
    "json": "application/json",
    "text": "text/plain",
    "binary": "application/octet-stream",
}
SIZES = (100, 1_000)
BODIES_PER_KIND = 200
CONNECTIONS = 8


def ensure_wrk(log: Any = print) -> str | None:
    """Path of ``wrk``; installs Debian's package when missing and running as root."""
    path = shutil.which("wrk")
    if path is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        log("  wrk missing: apt-get install -y wrk")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=300)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "wrk"],
            env=env,
            check=False,
            timeout=300,
        )
        path = shutil.which("wrk")
    return path


def encode(kind: str, keys: list[str]) -> bytes:
    """One ``POST /route`` body of ``keys`` in format ``kind`` (json, text or binary)."""
    if kind == "json":
        return json.dumps(keys).encode()
    if kind == "text":
        return "\n".join(keys).encode()
    if kind == "binary":
        from workers.app import pack_keys  # the app's own layout (docs/http.md)

        return pack_keys(keys)
    raise ValueError(f"unknown body kind {kind!r}; expected one of {', '.join(BODY_TYPES)}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(port: int, method: str, path: str, body: bytes = b"", ctype: str = "") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body or None, headers={"Content-Type": ctype})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


class Server:
    """``cslb serve`` on a free 127.0.0.1 port in its own namespace; stop() by PID."""

    def __init__(self, app: str | None, threads: int, workers: int, endpoints: Path, tmp: Path):
        self.port = _free_port()
        self.namespace = unique_namespace("http")
        cmd = [
            sys.executable,
            "-m",
            "cslb.cli",
            "serve",
            "--endpoints-file",
            str(endpoints),
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--shm-namespace",
            self.namespace,
        ]
        if app:
            cmd += ["--app", app]
        env = {k: v for k, v in os.environ.items() if k != "GUNICORN_CMD_ARGS"}
        self.log_path = tmp / f"{self.namespace}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.pids: list[int] = [self.proc.pid]

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if _request(self.port, "GET", "/healthz") == 200:
                    self.pids = process_tree(self.proc.pid)
                    return
            except OSError:
                pass
            time.sleep(0.2)
        tail = self.log_path.read_bytes()[-2000:].decode(errors="replace")
        raise RuntimeError(f"server on port {self.port} did not get ready:\n{tail}")

    def workers(self) -> list[int]:
        """PIDs of the gunicorn workers.

        The master's children that run its command line (the discovery process runs
        another).
        """
        try:
            with open(f"/proc/{self.proc.pid}/cmdline", "rb") as f:
                master = f.read()
        except OSError:
            return []
        out = []
        for pid in children_of(self.proc.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read() == master:
                        out.append(pid)
            except OSError:
                pass
        return sorted(out)

    def tree(self) -> list[int]:
        self.pids = sorted(set(self.pids) | set(process_tree(self.proc.pid)))
        return self.pids

    def stop(self) -> None:
        try:
            stop_tree(self.proc.pid, self.tree())
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        finally:
            self._log.close()
            unlink_namespace(self.namespace)


def _wrk_command(
    wrk: str, port: int, bodies: Path, ctype: str, seconds: float, connections: int
) -> list[str]:
    return [
        wrk,
        "-t1",
        f"-c{connections}",
        f"-d{max(round(seconds), 1)}s",
        "--timeout",
        "5s",
        "-s",
        str(LUA),
        f"http://127.0.0.1:{port}",
        "--",
        str(bodies),
        ctype,
    ]


def _wrk_summary(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    for line in stdout.splitlines():
        if line.startswith("CSLB_WRK "):
            return json.loads(line[len("CSLB_WRK ") :])
    raise RuntimeError(f"wrk printed no summary (status {returncode}): {stderr[-500:]}")


def run_wrk(
    wrk: str, port: int, bodies: Path, ctype: str, seconds: float, connections: int
) -> dict[str, Any]:
    """One bounded wrk run; returns the CSLB_WRK summary line as a dict."""
    cmd = _wrk_command(wrk, port, bodies, ctype, seconds, connections)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=False)
    return _wrk_summary(out.returncode, out.stdout, out.stderr)


def connections_per_worker(port: int, workers: list[int]) -> list[int]:
    """Established TCP connections to 127.0.0.1:``port`` held by each of ``workers``.

    From ``/proc/net/tcp`` (local port, state 01) and each worker's socket descriptors.
    Under gthread wrk's keep-alive connections stay with the worker that accepted them
    for the whole run, so this says how the load was split between the workers.
    """
    inodes: set[str] = set()
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    except OSError:
        return [0] * len(workers)
    out = []
    for pid in workers:
        n = 0
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    n += 1
        except OSError:
            pass
        out.append(n)
    return out


def _split(values: list[float]) -> str:
    """``"63/37"``: each worker's share in percent, largest first."""
    total = sum(values)
    if total <= 0:
        return "–"
    return "/".join(f"{v / total * 100:.0f}" for v in sorted(values, reverse=True))


LOPSIDED_RETRIES = 3
"""A gthread run where one worker holds every wrk connection is measured again, at most
this many times: its threads then contend for the GIL across both cores, which in some
runs nearly doubles the CPU per request of either app, so such a run measures where the
kernel put the connections, not what the app costs."""


def lopsided(connections_split: str) -> bool:
    """True when one worker holds every connection (``"8/0"``); ``"–"`` (sync) is not."""
    parts = connections_split.split("/")
    return len(parts) > 1 and all(p == "0" for p in parts[1:])


def _measure(
    wrk: str, server: Server, bodies: Path, ctype: str, seconds: float, keepalive: bool
) -> dict:
    """One wrk run against ``server`` with the server's CPU time around it.

    Also how the run's load fell on the workers: each worker's share of the workers'
    CPU time, and (sampled half-way through the run) the wrk connections each holds.
    """
    pids = server.tree()
    workers = server.workers()
    c0 = cpu_seconds(pids)
    w0 = [cpu_seconds([w]) for w in workers]
    cmd = _wrk_command(wrk, server.port, bodies, ctype, seconds, CONNECTIONS)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        time.sleep(max(round(seconds), 1) / 2)
        conns = connections_per_worker(server.port, workers) if keepalive else []
        try:
            stdout, stderr = proc.communicate(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
    r = _wrk_summary(proc.returncode, stdout, stderr)
    cpu = cpu_seconds(pids) - c0
    worker_cpu = [cpu_seconds([w]) - c for w, c in zip(workers, w0, strict=True)]
    errors = sum(
        r[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
    )
    return {
        "requests_per_s": r["requests"] / (r["duration_us"] / 1e6),
        "p50_ms": r["p50_us"] / 1e3,
        "p99_ms": r["p99_us"] / 1e3,
        "cpu_us_per_request": cpu / max(r["requests"], 1) * 1e6,
        "errors": errors,
        "worker_cpu_split": _split(worker_cpu),
        "connections_split": "/".join(map(str, sorted(conns, reverse=True))) or "–",
    }


def _write_bodies(path: Path, bodies: list[bytes]) -> None:
    with open(path, "wb") as f:
        for b in bodies:
            f.write(b"%d\n" % len(b))
            f.write(b)


STAGES_APP = "perf.stages_app:app"


def _stage_files(folder: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for path in folder.glob("*.json"):
        try:
            out[int(path.stem)] = json.loads(path.read_text())
        except (OSError, ValueError):
            pass  # (being replaced: read it at the next look)
    return out


def _stages(
    wrk: str, server: Server, folder: Path, bodies: Path, ctype: str, seconds: float
) -> dict[str, Any] | None:
    """One wrk run against the step-timing app: per step, median and mean µs per request."""
    before = _stage_files(folder)
    run_wrk(wrk, server.port, bodies, ctype, seconds, CONNECTIONS)
    after = _stage_files(folder)
    from perf.stages_app import STEPS

    requests = 0
    sums = [0] * len(STEPS)
    last: dict[str, list[int]] = {step: [] for step in STEPS}
    for pid, doc in after.items():
        old = before.get(pid, {"requests": 0, "sums_ns": [0] * len(STEPS)})
        n = doc["requests"] - old["requests"]
        requests += n
        for i, step in enumerate(STEPS):
            sums[i] += doc["sums_ns"][i] - old["sums_ns"][i]
            last[step] += doc["last_ns"][step][-n:] if n > 0 else []
    if not requests:
        return None
    route = np.array(last["route"], dtype=np.float64)
    slow = route > 4 * np.median(route) if route.size else route.astype(bool)
    return {
        "requests": requests,
        # The rare slow route_table calls (over 4x the median): the snapshot refreshes.
        "route_slow_share": float(slow.mean()) if route.size else 0.0,
        "route_slow_time_share": float(route[slow].sum() / route.sum()) if route.size else 0.0,
        **{f"{step}_mean_us": sums[i] / requests / 1e3 for i, step in enumerate(STEPS)},
        **{f"{step}_p50_us": statistics.median(last[step]) / 1e3 for step in STEPS if last[step]},
    }


def _stages_note(rows: list[dict[str, Any]], stages: list[dict[str, Any]]) -> str:
    cpu = {(r["server"], r["app"], r["body"], r["ids"]): r["cpu_us_per_request"] for r in rows}
    parts = []
    for st in stages:
        key = (st["server"], st["body"], st["ids"])
        noop = cpu[(key[0], "noop", *key[1:])]
        gap = cpu[(key[0], "cslb", *key[1:])] - noop
        parts.append(
            f"{st['server']} {st['body']}: {gap:+.0f} µs (the bar: {noop / 10:.0f}); "
            f"Router.route_table {st['route_p50_us']:.1f} (mean {st['route_mean_us']:.1f}; "
            f"its {st['route_slow_share']:.1%} of calls over 4× the median make "
            f"{st['route_slow_time_share']:.0%} of its time), answer "
            f"{st['answer_p50_us']:.1f} (mean {st['answer_mean_us']:.1f}); reading "
            f"{st['read_p50_us']:.1f} and parsing {st['parse_p50_us']:.1f}"
        )
    return (
        "Where the bundled app's extra CPU goes, 100 IDs: the server CPU the cslb app adds "
        "per request over the no-op app (from the table), then the thread CPU time of the "
        "app's own steps (perf/stages_app.py: the same steps, timed one by one in a third "
        "server, one run per body; µs per request, median over requests and mean). The "
        "no-op app reads and parses too, so the gap is the router call, the answer, and "
        "the rest (dispatch, and gunicorn and the kernel sending an answer of ~2.6 kB "
        "instead of 12 bytes). A mean above the median is the rare slow call: for "
        "route_table the snapshot refresh (loads read and plan rebuilt every "
        "CSLB_LOAD_REFRESH) that a request pays now and then. " + "; ".join(parts)
    )


def run(quick: bool = False, log: Any = print) -> dict[str, Any]:
    """Run the HTTP benchmark; returns ``{"rows": [...], "notes": [...]}``.

    Each row: ``server`` (sync/gthread), ``app`` (cslb/noop), ``body``, ``ids``,
    ``requests_per_s``, ``decisions_per_s``, ``p50_ms``, ``p99_ms``,
    ``cpu_us_per_request`` (server CPU, microseconds), ``errors``.
    """
    notes: list[str] = []
    wrk = ensure_wrk(log)
    if wrk is None:
        return {"rows": [], "notes": ["wrk is not installed (apt-get install wrk): skipped"]}
    cores = max(os.cpu_count() or 1, 1)
    seconds = 1.0 if quick else 3.0
    repeats = 1 if quick else 3
    modes = {"sync": 1} if quick else {"sync": 1, "gthread": 4}
    sizes = (100,) if quick else SIZES
    rng = np.random.default_rng(6)
    rows: list[dict[str, Any]] = []
    stages: list[dict[str, Any]] = []
    splits: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cslb-http-") as tmpdir:
        tmp = Path(tmpdir)
        endpoints = tmp / "endpoints.json"
        endpoints.write_text(
            json.dumps({"endpoints": [{"address": a} for a in endpoint_urls(100)]})
        )
        files: dict[tuple[str, int], Path] = {}
        for n in sizes:
            batches = [make_skus(rng, n) for _ in range(BODIES_PER_KIND)]
            for kind in BODY_TYPES:
                files[kind, n] = tmp / f"{kind}-{n}.bodies"
                _write_bodies(files[kind, n], [encode(kind, b) for b in batches])
        for mode, threads in modes.items():
            servers = {
                "cslb": Server(None, threads, cores, endpoints, tmp),
                "noop": Server("perf.noop_app:app", threads, cores, endpoints, tmp),
            }
            try:
                for s in servers.values():
                    s.wait_ready()
                kinds = []
                for kind, ctype in BODY_TYPES.items():
                    probe = encode(kind, make_skus(rng, 3))
                    status = {
                        a: _request(s.port, "POST", "/route", probe, ctype)
                        for a, s in servers.items()
                    }
                    if all(v == 200 for v in status.values()):
                        kinds.append(kind)
                    elif not any(kind in x for x in notes):
                        notes.append(
                            f"{kind} bodies ({ctype}) left out: the server answers "
                            f"{status['cslb']} (the bundled app does not accept them in this "
                            "build)"
                        )
                for s in servers.values():  # warm up: every worker attached, caches filled
                    run_wrk(wrk, s.port, files["json", sizes[0]], "application/json", 1, 4)
                runs: dict[tuple[str, str, int], list[dict[str, float]]] = {}
                # Repeats interleave the two servers and every body: a neighbour's load
                # or a slow moment hits all of them alike.
                for _ in range(repeats):
                    for n in sizes:
                        for kind in kinds:
                            for app, s in servers.items():
                                args = (files[kind, n], BODY_TYPES[kind], seconds)
                                m = _measure(wrk, s, *args, threads > 1)
                                retries = 0
                                while lopsided(m["connections_split"]) and (
                                    retries < LOPSIDED_RETRIES
                                ):
                                    retries += 1
                                    m = _measure(wrk, s, *args, threads > 1)
                                m["lopsided_retries"] = retries
                                runs.setdefault((app, kind, n), []).append(m)
                for (app, kind, n), got in runs.items():
                    med = {
                        k: statistics.median(m[k] for m in got)
                        for k, v in got[0].items()
                        if not isinstance(v, str)
                    }
                    row = {
                        "server": mode,
                        "app": app,
                        "body": kind,
                        "ids": n,
                        "requests_per_s": med["requests_per_s"],
                        "decisions_per_s": med["requests_per_s"] * n,
                        "p50_ms": med["p50_ms"],
                        "p99_ms": med["p99_ms"],
                        "cpu_us_per_request": med["cpu_us_per_request"],
                        "errors": int(sum(m["errors"] for m in got)),
                        "runs": len(got),
                        # per run, in run order: how the load fell on the workers
                        "worker_cpu_split": [m["worker_cpu_split"] for m in got],
                        "connections_split": [m["connections_split"] for m in got],
                        # runs measured again because one worker held every connection
                        "lopsided_retries": sum(m["lopsided_retries"] for m in got),
                    }
                    splits.append(
                        f"{mode} {app} {kind} {n}: "
                        + ", ".join(
                            f"{c} ({w})"
                            for c, w in zip(
                                row["connections_split"], row["worker_cpu_split"], strict=True
                            )
                        )
                    )
                    rows.append(row)
                    log(
                        f"  http {mode:<7} {app:<4} {kind:<6} {n:>5} IDs: "
                        f"{row['requests_per_s']:>7.0f} req/s "
                        f"{row['decisions_per_s'] / 1e6:>5.2f} M IDs/s "
                        f"p50 {row['p50_ms']:.2f} ms p99 {row['p99_ms']:.2f} ms "
                        f"CPU {row['cpu_us_per_request']:.0f} µs/req "
                        f"conns {','.join(row['connections_split'])} "
                        f"worker CPU % {','.join(row['worker_cpu_split'])}"
                        + (f" ERRORS {row['errors']}" if row["errors"] else "")
                    )
            finally:
                for s in servers.values():
                    s.stop()
            stages_dir = tmp / f"stages-{mode}"
            stages_dir.mkdir()
            os.environ["CSLB_BENCH_STAGES_DIR"] = str(stages_dir)
            try:
                timed = Server(STAGES_APP, threads, cores, endpoints, tmp)
            finally:
                del os.environ["CSLB_BENCH_STAGES_DIR"]
            try:
                timed.wait_ready()
                run_wrk(wrk, timed.port, files["json", sizes[0]], "application/json", 1, 4)
                for kind in kinds:
                    args = (files[kind, 100], BODY_TYPES[kind], seconds)
                    got = _stages(wrk, timed, stages_dir, *args)
                    if got is not None:
                        stages.append({"server": mode, "body": kind, "ids": 100, **got})
            finally:
                timed.stop()
    if stages:
        notes.append(_stages_note(rows, stages))
    notes.append(
        f"cslb serve with {cores} workers (sync; gthread with 4 threads each), 100 endpoints; "
        f"wrk -t1 -c{CONNECTIONS}, medians of {repeats} runs of {seconds:g} s, "
        f"{BODIES_PER_KIND} different bodies "
        "per kind and size; the load generator shares the cores with the server. Server CPU "
        "= user + system time of the gunicorn master, its workers and the discovery process. "
        'The no-op app answers {"keys": N}; the cslb app answers the endpoint of every ID.'
    )
    if splits:
        retried = sum(r["lopsided_retries"] for r in rows)
        notes.append(
            "How the load fell on the workers, per run: under gthread the wrk connections "
            "each worker held half-way through the run (keep-alive: they stay with the "
            "worker that accepted them; sync closes each after its request: –), and in "
            "brackets each worker's share of the workers' CPU time in percent. When one "
            "gthread worker holds every connection its threads contend for the GIL across "
            "both cores, which in some runs nearly doubles the CPU per request (for either "
            "app) and in others costs little, so such a run measures where the kernel "
            "put the connections rather than the app: for either app it is measured again, "
            f"at most {LOPSIDED_RETRIES} times ({retried} runs were; a split still shown "
            "with one worker at 0 stayed so). More connections do not spread them (16 and "
            "32 landed 16/0 and 32/0 too): one worker's accept loop takes the burst. "
            + "; ".join(splits)
        )
    return {"rows": rows, "notes": notes, "stages": stages}
