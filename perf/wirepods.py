"""Product pods on the wire for the fan-out benchmarks: ``perf/podserver.c`` in one process.

``WirePods(n, service_ms)`` compiles ``podserver.c`` and ``podserver_http.c`` with the
machine's C compiler (once, into a cache directory keyed by the sources' hash), starts
it on ``n`` free ports of 127.0.0.1 and waits until every port answers. Every pod answers
``GET /<key>`` with ``{"key": ..., "pod": <port>}`` and ``POST /batch`` (a JSON array of
keys) with an array of those, exactly ``service_ms`` after the request was parsed, over
HTTP/1.1 keep-alive;
``GET /_stats`` counts TCP connections accepted and open, requests served and the most
requests served at once, per port (:meth:`WirePods.stats`); ``POST /_reset`` zeroes them. One C
process with one epoll loop and a timer answers faster than any Python client can ask,
so the pods are never the limit; ``cpu=`` pins it to one core.

    with WirePods(5, 2.0, cpu=0) as pods:
        pods.urls        # ['http://127.0.0.1:PORT', ...]
        pods.stats()     # {'accepted': {'total': N, 'PORT': N, ...}, 'served': ..., ...}
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["PARTS", "SOURCE", "CompilerMissingError", "WirePods", "build"]

SOURCE = Path(__file__).resolve().parent / "podserver.c"
# The pod server's other files, next to its main file: compiled with it (.c), or only
# hashed with it (.h), so an edit to any of them builds a new binary.
PARTS = ("podserver_http.c", "podserver.h")
CFLAGS = ["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror"]


class CompilerMissingError(RuntimeError):
    """No C compiler to build ``perf/podserver.c`` with."""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME")
    if base:
        return Path(base) / "cslb-perf"
    return Path(tempfile.gettempdir()) / f"cslb-perf-{os.getuid()}"


def build(source: Path = SOURCE, cache: Path | None = None) -> Path:
    """Compile ``source`` with its :data:`PARTS` beside it, unless built from these bytes.

    Returns the executable's path.

    The binary is named after the SHA-256 of the sources and the flags, so an edited
    source is rebuilt and concurrent builds never see a half-written file (each writes
    its own temporary file and renames it into place).

    Raises
    ------
    CompilerMissingError
        Neither ``$CC`` nor ``cc``/``gcc``/``clang`` is on the PATH.
    RuntimeError
        The compiler failed (its output is in the message).
    """
    cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None or shutil.which(cc.split()[0]) is None:
        raise CompilerMissingError(
            "the wire benchmarks build their pods (perf/podserver.c) with a C compiler and "
            "none was found: install one (apt-get install gcc) or set CC"
        )
    files = [source, *(source.with_name(part) for part in PARTS)]
    data = b"".join(f.read_bytes() for f in files)
    digest = hashlib.sha256(data + " ".join([cc, *CFLAGS]).encode()).hexdigest()[:16]
    cache = cache or _cache_dir()
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    exe = cache / f"podserver-{digest}"
    if exe.exists():
        return exe
    tmp = cache / f".podserver-{digest}-{os.getpid()}"
    got = subprocess.run(
        [*cc.split(), *CFLAGS, "-o", str(tmp), *(str(f) for f in files if f.suffix == ".c")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if got.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building {source} failed:\n{got.stdout}{got.stderr}")
    os.replace(tmp, exe)
    return exe


class WirePods:
    """``n`` pods answering in ``service_ms`` ms, in one C process; a context manager.

    Parameters
    ----------
    n
        Pods (ports on 127.0.0.1, picked by the kernel).
    service_ms
        Time from a request's parse to its answer (fractional milliseconds allowed).
    cpu
        Pin the pod process to this core (``os.sched_setaffinity``); ``None``: not pinned.
    start_timeout_s
        How long to wait for every port to answer.
    reports
        Every answer carries a load report (``endpoint-load-metrics``) and
        ``Server-Timing: app;dur=<service_ms>``, as the serving middleware's.
    """

    def __init__(
        self,
        n: int = 5,
        service_ms: float = 2.0,
        cpu: int | None = None,
        start_timeout_s: float = 10.0,
        reports: bool = False,
    ) -> None:
        if not 1 <= n <= 64:
            raise ValueError("n must be from 1 to 64")
        self.n = n
        self.service_ms = float(service_ms)
        self.cpu = cpu
        self.start_timeout_s = start_timeout_s
        self.reports = reports
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: list[int] = []
        self.urls: list[str] = []
        self._own = 0  # connections stats() opened since the last reset()
        self._conn: http.client.HTTPConnection | None = None

    # -- life ----------------------------------------------------------------------------

    def start(self) -> WirePods:
        """Build, start and wait until every port answers; returns ``self``."""
        exe = build()
        argv = [str(exe), *(["-r"] if self.reports else []), "-s", repr(self.service_ms)]
        argv += ["0"] * self.n
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            if self.cpu is not None:
                os.sched_setaffinity(self.proc.pid, {self.cpu})
            line = self._first_line()
            words = line.split()
            if not words or words[0] != "ports" or len(words) != self.n + 1:
                raise RuntimeError(f"podserver said {line!r}")
            self.ports = [int(w) for w in words[1:]]
            self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
            deadline = time.monotonic() + self.start_timeout_s
            for port in self.ports:
                self._wait_port(port, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _first_line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(self.start_timeout_s):
                raise RuntimeError(f"podserver printed no ports in {self.start_timeout_s} s")
        finally:
            sel.close()
        line = self.proc.stdout.readline().decode(errors="replace").strip()
        if not line:
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            raise RuntimeError(f"podserver exited ({self.proc.poll()}): {err.strip()}")
        return line

    def _wait_port(self, port: int, deadline: float) -> None:
        last: BaseException | None = None
        for _ in range(1000):
            try:
                self._request(port, "GET", "/_stats")
                return
            except (OSError, http.client.HTTPException, ValueError) as exc:
                last = exc
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        raise RuntimeError(f"pod port {port} did not answer: {last!r}")

    def stop(self) -> None:
        """Stop the pod process by its PID (SIGTERM, then SIGKILL after 3 s); idempotent."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5.0)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()

    def __enter__(self) -> WirePods:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        """The pod process's PID while it runs."""
        return None if self.proc is None else self.proc.pid

    # -- talking -------------------------------------------------------------------------

    def _request(
        self, port: int, method: str, path: str, body: bytes | None = None
    ) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5.0)
        try:
            return self._ask(conn, method, path, body)
        finally:
            conn.close()

    @staticmethod
    def _ask(
        conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None
    ) -> dict[str, Any]:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise ValueError(f"{method} {path}: HTTP {resp.status}: {data[:200]!r}")
        return json.loads(data)

    def _control(self, method: str, path: str, body: bytes | None = None) -> dict[str, Any]:
        """Ask the first pod on one kept-alive connection (opened again if it broke)."""
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection("127.0.0.1", self.ports[0], timeout=5.0)
                self._own += 1
            try:
                return self._ask(self._conn, method, path, body)
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def stats(self) -> dict[str, Any]:
        """The pods' counters: accepted, served, keys, max_concurrent and in_flight.

        Each is ``{"total": N, "<port>": N, ...}`` (``max_concurrent["total"]``: most key
        requests in service at once over all pods; ``served`` counts answered ``GET /<key>``
        and ``POST /batch`` requests, ``keys`` the keys in them). Asked on one kept-alive
        connection to the first pod, counted once in its ``accepted``: :meth:`accepted`
        leaves it out.
        """
        return self._control("GET", "/_stats")

    def accepted(self) -> int:
        """TCP connections accepted by all pods since the last :meth:`reset`, not our own."""
        return int(self.stats()["accepted"]["total"]) - self._own

    def connections(self) -> tuple[int, int]:
        """(accepted since the last :meth:`reset`, open now), neither counting our own.

        Between two readings, ``accepted`` grew by the connections opened and ``open`` by
        those opened less those closed: their difference is the connections closed.
        """
        st = self.stats()
        own_open = 1 if self._conn is not None else 0
        return (
            int(st["accepted"]["total"]) - self._own,
            int(st["open"]["total"]) - own_open,
        )

    def reset(self) -> None:
        """Zero the counters (``max_concurrent`` restarts from what is in service now)."""
        self._control("POST", "/_reset", b"")
        self._own = 0
