"""Real gunicorn servers for end-to-end tests: start, talk to over 127.0.0.1, stop by PID.

Every server gets its own shm namespace (so concurrent test runs never share segments)
and runs in its own session; :meth:`Server.stop` SIGTERMs the master by PID, waits
(bounded), then SIGKILLs every process of the tree that is left, by PID, and unlinks
any segment left in the namespace — so a failing test leaves nothing behind and the
assertion about leftovers is made before that cleanup.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import shm
from shm.names import unlink_name
from shm.owners import process_start_ticks

REPO = Path(__file__).resolve().parent.parent
APPS_DIR = Path(__file__).resolve().parent / "gunicorn_apps"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique_namespace(tag: str) -> str:
    return f"t{tag}{uuid.uuid4().hex[:10]}"


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # comm may contain spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry))
    return out


def descendants_of(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for c in children_of(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout_s: float,
    interval_s: float = 0.05,
    max_tries: int = 10_000,
) -> Any:
    """Poll ``check`` until it returns something truthy; AssertionError after the timeout.

    Bounded in time (``timeout_s``) and in count (``max_tries`` calls of ``check``).
    """
    deadline = time.monotonic() + timeout_s
    last: Any = None
    for _ in range(max_tries):
        try:
            last = check()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    raise AssertionError(
        f"gave up waiting for {what} after {timeout_s} s or {max_tries} tries (last: {last!r})"
    )


class Server:
    """A ``cslb serve`` (or plain gunicorn) process tree under test."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        tmp_path: Path,
        namespace: str,
        env: Mapping[str, str] | None = None,
        gunicorn: bool = False,
        unlink: bool = True,
    ) -> None:
        self.port = free_port()
        self.namespace = namespace
        self.unlink = unlink  # False: the namespace is shared; its owner cleans it up
        self.log_path = tmp_path / f"server-{self.port}.log"
        environ = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CSLB_") and k != "GUNICORN_CMD_ARGS"
        }
        environ.update(
            {
                "CSLB_SHM_NAMESPACE": namespace,
                "CSLB_HEARTBEAT": "0.2",
                "CSLB_FILE_POLL": "0.1",
                "PYTHONPATH": os.pathsep.join([str(APPS_DIR), str(REPO)]),
            }
        )
        environ.update(env or {})
        if gunicorn:
            argv = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{self.port}", *args]
        else:
            argv = [
                sys.executable,
                "-m",
                "cslb",
                "serve",
                "--bind",
                f"127.0.0.1:{self.port}",
                *args,
            ]
        self.log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            argv,
            cwd=tmp_path,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid  # cslb serve execs gunicorn: the master keeps this PID
        # Every process of the tree seen so far, with its start time (clock ticks): a PID
        # reused by an unrelated process after ours exited is never signalled.
        self.seen: dict[int, int] = {}

    # -- talking --------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            data = body.encode() if isinstance(body, str) else body
            conn.request(method, path, body=data, headers=dict(headers or {}))
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def get_json(self, path: str, timeout_s: float = 5.0) -> Any:
        status, body = self.request("GET", path, timeout_s=timeout_s)
        if status != 200:
            raise ValueError(f"GET {path}: HTTP {status}: {body[:300]!r}")
        return json.loads(body)

    def post_json(self, path: str, doc: Any, timeout_s: float = 5.0) -> tuple[int, Any]:
        status, body = self.request(
            "POST",
            path,
            json.dumps(doc),
            {"Content-Type": "application/json"},
            timeout_s=timeout_s,
        )
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    # -- processes ------------------------------------------------------------------------

    def tree(self) -> list[int]:
        pids = descendants_of(self.pid)
        for pid in [self.pid, *pids]:
            if pid not in self.seen:
                ticks = process_start_ticks(pid)
                if ticks is not None:
                    self.seen[pid] = ticks
        return pids

    def ours(self, pid: int) -> bool:
        """True while ``pid`` is still the process of the tree seen under that PID."""
        return alive(pid) and process_start_ticks(pid) == self.seen.get(pid)

    def discovery_pids(self) -> list[int]:
        return [p for p in self.tree() if "cslb discovery" in cmdline(p)]

    def worker_pids(self) -> list[int]:
        return [p for p in self.tree() if "cslb discovery" not in cmdline(p)]

    def wait_ready(self, workers: int, timeout_s: float = 20.0, path: str = "/") -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            if len(self.worker_pids()) < workers:
                return False
            status, _ = self.request("GET", path, timeout_s=2.0)
            return status < 500

        wait_for("the server to answer", ready, timeout_s, 0.1)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """cslb's JSON log lines of the whole tree (master, workers, discovery), in order.

        ``name``: only that event's lines.
        """
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or not str(rec.get("logger", "")).startswith("cslb"):
                continue
            if name is None or rec.get("event") == name:
                out.append(rec)
        return out

    def stop(self, timeout_s: float = 15.0) -> dict[str, Any]:
        """SIGTERM the master; report what was left; then clean up by force.

        Returns ``{"exit": code, "left": [pids still alive], "segments": [names]}``,
        measured before the forced cleanup.
        """
        self.tree()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        # Children reparented to init after the master exits: wait briefly for them.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(self.ours(p) for p in self.seen):
            time.sleep(0.05)
        left = sorted(p for p in self.seen if self.ours(p))
        segments = shm.list_segments(self.namespace)
        self.kill()
        return {"exit": code, "left": left, "segments": segments}

    def kill(self) -> None:
        """Force: SIGKILL every process of the tree by PID, unlink the namespace (``unlink``)."""
        with contextlib.suppress(OSError):
            self.tree()
        for pid in sorted(self.seen):
            if self.ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self.unlink:
            for name in shm.list_segments(self.namespace):
                unlink_name(name)
        self.log_file.close()


@contextlib.contextmanager
def serving(args: Sequence[str], tmp_path: Path, **kw: Any) -> Any:
    server = Server(
        args, tmp_path=tmp_path, namespace=kw.pop("namespace", None) or unique_namespace("g"), **kw
    )
    try:
        yield server
    finally:
        server.kill()
