"""Helpers for the discovery tests: unique shared-memory namespaces that are always
cleaned up, the discovery loop run in a thread against the fake Kubernetes API, and
``cslb discovery`` run as a real process that is always stopped by its PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import shm
from discovery.events import EventLog
from discovery.informers import ConfigMapInformer, EndpointSliceInformer
from discovery.kube import WatchTiming
from discovery.kube_client import load_client
from discovery.publisher import Publisher
from discovery.service import Discovery
from discovery.settings import KnobState
from lbcore.knobs import ROUTING_KNOBS, defaults
from tests.shm_names import Namespaces
from tests.shm_names import segments as shm_segments

ROOT = Path(__file__).resolve().parent.parent

FAST = WatchTiming(
    connect_timeout_s=1.0,
    request_timeout_s=1.0,
    watch_timeout_s=2.0,
    backoff_s=0.05,
    backoff_max_s=0.2,
)


def segments(ns: str) -> list[str]:
    """The segments of namespace ``ns``."""
    return shm_segments(f"{ns}.")


#: ``with shm_namespace() as ns``: a namespace of this test alone; every segment under
#: it is unlinked afterwards.
shm_namespace = Namespaces("td").one


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


class Loop:
    """The discovery loop in a thread, publishing into real shared memory."""

    def __init__(
        self,
        ns: str,
        *,
        kube: Any = None,
        kubeconfig: str | None = None,
        service: str | None = "catalog",
        namespace: str = "shop",
        configmap: str | None = None,
        endpoints_file: str | None = None,
        static: list | None = None,
        knobs: dict | None = None,
        debounce_s: float = 0.3,
        debounce_max_s: float = 3.0,
        heartbeat_s: float = 0.05,
        configmap_wait_s: float = 2.0,
        port_name: str = "",
        drop_warn_share: float = 0.5,
    ) -> None:
        self.ns = ns
        self.events: list[dict[str, Any]] = []
        self.log = EventLog(None)
        self.log.add_sink(self.events.append)
        self.publisher = Publisher(ns)
        base = defaults(ROUTING_KNOBS)
        base.update(knobs or {})
        self.disc = Discovery(
            self.publisher,
            KnobState(base),
            self.log,
            debounce_s=debounce_s,
            debounce_max_s=debounce_max_s,
            heartbeat_s=heartbeat_s,
            file_poll_s=0.05,
            configmap_wait_s=configmap_wait_s,
            drop_warn_share=drop_warn_share,
        )
        self.api = None
        if static:
            self.disc.add_list(static)
        if endpoints_file:
            self.disc.add_file(endpoints_file)
        if kubeconfig and (service or configmap):
            self.api, _ = load_client(kubeconfig)
            if service:
                self.disc.add_informer(
                    "kubernetes",
                    EndpointSliceInformer(
                        self.api,
                        namespace,
                        service,
                        lambda eps, why: self.disc.post_endpoints("kubernetes", eps, why),
                        log=self.log,
                        timing=FAST,
                        port_name=port_name,
                    ),
                )
            if configmap:
                self.disc.add_configmap_informer(
                    configmap,
                    ConfigMapInformer(
                        self.api,
                        namespace,
                        configmap,
                        self.disc.post_configmap,
                        log=self.log,
                        timing=FAST,
                    ),
                )
        self.thread = threading.Thread(target=self._run, name="discovery-loop", daemon=True)
        self.error: BaseException | None = None
        self.reader: shm.TableReader | None = None

    def _run(self) -> None:
        try:
            self.disc.run()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def start(self) -> Loop:
        self.thread.start()
        return self

    def stop(self, *, unlink: bool = True) -> None:
        self.disc.stop()
        self.thread.join(10)
        assert not self.thread.is_alive(), "discovery loop did not stop"
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        self.publisher.close(unlink=unlink)
        if self.api is not None:
            self.api.close()
        if self.error is not None:
            raise self.error

    def table(self) -> shm.Table:
        if self.reader is None:
            self.reader = wait_until(lambda: _reader(self.ns), what="tables segment")
        return self.reader.table()

    def generation(self) -> int:
        return self.publisher.generation

    def wait_generation(self, gen: int, timeout: float = 10.0) -> shm.Table:
        wait_until(lambda: self.generation() >= gen, timeout, f"generation {gen}")
        t = self.table()
        assert t.generation == gen, f"generation {t.generation}, expected {gen}"
        return t

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e["event"] == event]


def _reader(ns: str) -> shm.TableReader | None:
    try:
        return shm.TableReader(ns)
    except shm.SegmentMissingError:
        return None


class Proc:
    """``cslb ...`` as a child process; stopped by PID at the end of the test."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, replace_env: bool = False
    ) -> None:
        full_env = dict(env or {}) if replace_env else {**os.environ, **(env or {})}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "cslb", *args],
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr_lines: list[str] = []
        self._t = threading.Thread(target=self._drain, daemon=True)
        self._t.start()

    def _drain(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.stderr_lines.append(line)

    @property
    def pid(self) -> int:
        return self.p.pid

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in list(self.stderr_lines):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if name is None or rec.get("event") == name:
                out.append(rec)
        return out

    def signal(self, sig: int) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, sig)

    def wait(self, timeout: float = 10.0) -> int:
        rc = self.p.wait(timeout)
        self._t.join(5)
        return rc

    def kill(self) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGKILL)
            self.p.wait(10)
        self._t.join(5)
