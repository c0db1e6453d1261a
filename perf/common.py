"""Pieces the benchmarks share: key batches, the pure-Python baseline, timing, hosts, processes.

Nothing here measures anything by itself; the ``bench_*`` scripts and the suite of
``python -m perf`` (:mod:`perf.suite`) do.
"""

from __future__ import annotations

import bisect
import json
import os
import platform
import signal
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import xxhash

import lbcore

S = 1_000_000_000  # nanoseconds per second
SKU_ALPHABET = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", dtype=np.uint8)


# ------------------------------------------------------------------------------------
# Keys and endpoints.


def make_skus(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` Zalando-style 13-character SKUs (``AD112G0AB-K11``) as a list of str."""
    chars = SKU_ALPHABET[rng.integers(0, SKU_ALPHABET.size, size=(n, 13))]
    chars[:, 9] = ord("-")
    return chars.view("S13").ravel().astype("U13").tolist()


def make_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` int64 product IDs (up to 12 digits), as a NumPy array."""
    return rng.integers(1, 10**12, size=n, dtype=np.int64)


KEY_MAKERS: dict[str, Callable[[np.random.Generator, int], Any]] = {
    "sku": make_skus,
    "int": make_ids,
}


def endpoint_urls(n: int, salt: int = 0) -> list[str]:
    """``n`` distinct endpoint URLs (``http://10.S.X.Y:8080``); ``salt`` gives another set."""
    return [
        f"http://10.{salt}.{(i // 250) % 250}.{i % 250 + 1}:{8080 + i // 62500}" for i in range(n)
    ]


# ------------------------------------------------------------------------------------
# The baseline a user writes without cslb.


class PythonLoopRing:
    """The loop a user writes without cslb: hash each key, bisect a sorted list of nodes."""

    def __init__(self, ring: lbcore.Ring) -> None:
        self.hashes = ring.hashes.tolist()
        self.owners = ring.owners.tolist()

    def lookup(self, keys: Any) -> list[int]:
        hashes, owners, size = self.hashes, self.owners, len(self.hashes)
        h64 = xxhash.xxh64_intdigest
        out = []
        for k in keys:
            b = k.encode() if isinstance(k, str) else str(k).encode()
            i = bisect.bisect_left(hashes, h64(b))
            out.append(owners[i if i < size else 0])
        return out


def as_python(batch: Any) -> Any:
    """A NumPy batch as a list of Python ints (what a pure-Python loop gets), else as is."""
    return batch.tolist() if isinstance(batch, np.ndarray) else batch


# ------------------------------------------------------------------------------------
# Timing.


def measure(
    fn: Callable[[Any], Any],
    batches: list[Any],
    n: int,
    convert: Callable[[Any], Any] | None = None,
) -> float:
    """Median nanoseconds per key of ``fn`` over fresh batches of ``n`` keys.

    The first batch warms the code (not the data: every timed call gets a batch never
    seen before). ``convert`` is applied to the batches outside the timing.
    """
    if convert is not None:
        batches = [convert(b) for b in batches]
    fn(batches[0])
    times = []
    for b in batches[1:]:
        t0 = time.perf_counter_ns()
        fn(b)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / n


# ------------------------------------------------------------------------------------
# Shared-memory hosts.


def unique_namespace(tag: str) -> str:
    """A fresh shm namespace for one benchmark (``perf<tag><pid><random>``)."""
    return f"perf{tag}{os.getpid()}{uuid.uuid4().hex[:6]}"


def unlink_namespace(namespace: str) -> None:
    """Remove every segment of ``namespace`` (idempotent)."""
    from shm.names import list_segments, unlink_name

    for name in list_segments(namespace):
        unlink_name(name)


class LoadedHost:
    """Counters and a published table of ``n`` endpoints, 10 % fading in, with load history.

    What a host looks like to a worker while a scale-up fades in: counters with a few
    busy endpoints (another worker's row: seconds of busy time and calls still open),
    knobs with bounded load on ``load_signal``. Close it (or use ``with``) to unlink
    every segment.

    Parameters
    ----------
    namespace
        Fresh shm namespace.
    n
        Endpoints (the last 10 % fade in, half-way through a 30 s window).
    rows
        Counter rows (one per worker process at most).
    load_signal
        The knobs' load signal.
    """

    def __init__(
        self, namespace: str, n: int, *, rows: int = 8, load_signal: str = "occupancy"
    ) -> None:
        import shm

        self.namespace = namespace
        self.endpoints = endpoint_urls(n)
        self.knobs = shm.Knobs(load_signal=load_signal)
        self.store = shm.CounterStore.create(namespace, rows=rows)
        try:
            self.writer = shm.TableWriter(namespace, counters=self.store)
            now = time.monotonic_ns()
            cut = n - max(n // 10, 1)
            self.ring_set = lbcore.RingSet(self.endpoints[:cut]).scale_up(
                self.endpoints[cut:], now - 15 * S
            )
            self.writer.publish(self.ring_set, knobs=self.knobs)
            slots = np.asarray(shm.TableReader(namespace).table().slots, dtype=np.intp)
            rng = np.random.default_rng(7)
            hot = rng.choice(n, max(n // 10, 2), replace=False)
            busy = np.repeat(slots[hot], 4)
            self.other = self.store.claim()
            self.other.record_start(busy, now - 3 * S)
            self.other.record_end(busy, now - 3 * S, np.full(busy.size, 2 * S), now)
            self.other.record_start(slots[hot], now)
        except BaseException:
            self.close()
            raise

    def publish(self, ring_set: lbcore.RingSet) -> int:
        """Publish ``ring_set`` with the host's knobs; returns the generation."""
        return int(self.writer.publish(ring_set, knobs=self.knobs))

    def close(self) -> None:
        """Release everything and unlink the namespace's segments (idempotent)."""
        for name in ("other", "writer", "store"):
            obj = self.__dict__.pop(name, None)
            if obj is None:
                continue
            try:
                obj.release() if name == "other" else obj.close()
            except Exception:  # already gone: the unlink below is what matters
                pass
        unlink_namespace(self.namespace)

    def __enter__(self) -> LoadedHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def full_route(router: Any) -> Callable[[Any], Any]:
    """One batch through the worker's whole path: ``route_table`` then ``track`` (enter + exit)."""

    def run(keys: Any) -> Any:
        idx, table = router.route_table(keys)
        with router.track(idx, table):
            pass
        return idx

    return run


# ------------------------------------------------------------------------------------
# Processes.

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # comm may contain spaces and parentheses: the fields start after the last ')'.
    return stat[stat.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    f = _stat_fields(pid)
    return f is not None and f[0] != "Z"


def children_of(pid: int) -> list[int]:
    """Direct live children of ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            f = _stat_fields(int(entry))
            if f is not None and int(f[1]) == pid and f[0] != "Z":
                out.append(int(entry))
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its live descendants."""
    out, todo = [pid], [pid]
    while todo:
        for c in children_of(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of ``pids`` so far, in seconds (exited ones count 0)."""
    ticks = 0
    for pid in pids:
        f = _stat_fields(pid)
        if f is not None:
            ticks += int(f[11]) + int(f[12])  # utime, stime
    return ticks / CLOCK_TICKS


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid`` from ``/proc/<pid>/smaps_rollup``, in bytes."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss line in /proc/{pid}/smaps_rollup")


def stop_tree(pid: int, pids: list[int] | None = None, timeout_s: float = 10.0) -> None:
    """SIGTERM ``pid``, wait up to ``timeout_s``, then SIGKILL it and ``pids`` left, by PID."""
    tree = sorted(set(pids or []) | set(process_tree(pid)))
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(alive(p) for p in tree):
            break
        time.sleep(0.05)
    for p in tree:
        if alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


@contextmanager
def no_gc() -> Iterator[None]:
    """Collector off inside (a collection in a timed call is noise, not routing)."""
    import gc

    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# ------------------------------------------------------------------------------------
# The machine.


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, OS, Python and library versions, load average."""
    import importlib.metadata as md

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    versions = {}
    for dist in ("cslb", "numpy", "xxhash", "gunicorn", "uhashring", "posix-ipc"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = "not installed"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": versions,
        "loadavg": os.getloadavg(),
    }


def write_json(path: str | None, results: Any) -> None:
    """Write a benchmark's ``results`` to ``path`` (its ``--json``; ``None``: not asked)."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
