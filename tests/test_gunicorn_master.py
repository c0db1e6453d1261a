"""workers.gunicorn_conf's master part in this process: real counters, real child processes.

gunicorn's arbiter is stood in for by a small object with the attributes the hooks read
(``log``, ``cfg``, ``WORKERS``); the counters, the processes holding rows and the
Router are real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

import shm
import shm.names
import workers.gunicorn_conf as conf
from tests.gunicorn_harness import REPO, unique_namespace
from workers.master.supervisor import settings_from_env


class ListLog:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def _add(self, msg: str, *args: object, **kw: object) -> None:
        self.lines.append(str(msg) % args if args else str(msg))

    info = warning = error = debug = exception = _add

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)


def _server(workers: int = 2) -> SimpleNamespace:
    return SimpleNamespace(
        log=ListLog(), cfg=SimpleNamespace(workers=workers, threads=1), WORKERS={}
    )


@pytest.fixture
def namespaces():
    made: list[str] = []

    def make() -> str:
        ns = unique_namespace("m")
        made.append(ns)
        return ns

    yield make
    for ns in made:
        for name in shm.list_segments(ns):
            shm.names.unlink_name(name)
        assert shm.list_segments(ns) == []


def _master(ns: str, mode: str = "external", rows: int = 4) -> tuple[conf.Master, SimpleNamespace]:
    server = _server()
    m = conf.Master()
    m.log = server.log
    m.settings = settings_from_env({"CSLB_DISCOVERY": mode})
    m.namespace = ns
    m.rows = rows
    m.pid = os.getpid()
    m.attach_counters()
    m.owns_namespace = mode == "embedded"
    return m, server


@pytest.fixture
def holders():
    """Child processes that adopt (claim) a counter row reserved by this process."""
    procs: list[subprocess.Popen] = []

    def hold(ns: str, row: int | None) -> subprocess.Popen:
        code = (
            "import sys, time, shm\n"
            "store = shm.CounterStore.attach(sys.argv[1])\n"
            "row = None if sys.argv[2] == '-' else int(sys.argv[2])\n"
            "rec = store.claim(row=row)\n"
            "print(rec.row, flush=True)\n"
            "time.sleep(60)\n"
        )
        p = subprocess.Popen(
            [sys.executable, "-c", code, ns, "-" if row is None else str(row)],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        procs.append(p)
        line = p.stdout.readline()  # bounded: the child prints or dies
        assert line.strip(), f"holder of row {row} failed (exit {p.poll()})"
        return p

    yield hold
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def _slot(store: shm.CounterStore, row: int) -> shm.SlotInfo:
    return store.slots()[row]


def test_child_exit_frees_the_row_the_dead_worker_adopted(namespaces, holders) -> None:
    m, server = _master(namespaces())
    worker = SimpleNamespace(pid=0)
    m.reserve(worker)
    row = worker.cslb_row
    assert row is not None and _slot(m.store, row).reserved
    child = holders(m.namespace, row)
    worker.pid = child.pid
    assert _slot(m.store, row).claimed and _slot(m.store, row).pid == child.pid
    # Released by the worker's PID (the holder is still alive here, so reap() alone
    # would never free it: only release(row, worker.pid) does).
    m.release(server, worker)
    assert not _slot(m.store, row).claimed and not _slot(m.store, row).reserved
    m.stop(server)


def test_child_exit_leaves_a_row_reserved_for_a_newer_worker(namespaces) -> None:
    m, server = _master(namespaces())
    old = SimpleNamespace(pid=0)
    m.reserve(old)
    row = old.cslb_row
    # The old worker freed its row itself (Router.close at exit); the master reserved
    # the same row for the next worker before the old one's child_exit ran.
    m.store.release(row, os.getpid())
    new = SimpleNamespace(pid=0)
    m.reserve(new)
    assert new.cslb_row == row
    new.pid = 999_999_999  # not a real process; only the row matters here
    old.pid = 999_999_998
    server.WORKERS[new.pid] = new
    m.release(server, old)
    assert _slot(m.store, row).reserved, "the newer worker's reservation was freed"
    m.stop(server)


def test_counters_removed_under_the_master(namespaces) -> None:
    """A peer removed the shared counters; the master re-attaches and forks on."""
    m, server = _master(namespaces())
    before = SimpleNamespace(pid=0)
    m.reserve(before)
    assert before.cslb_row is not None
    for name in shm.list_segments(m.namespace):  # what the peer's exit did
        shm.names.unlink_name(name)
    worker = SimpleNamespace(pid=0)
    m.reserve(worker)  # must not raise into gunicorn's main loop
    assert worker.cslb_row is not None
    assert m.log.has("removed or replaced")
    assert f"/cslb.{m.namespace}.counters" in shm.list_segments(m.namespace)
    # Row numbers of the old counters mean nothing in the new ones: the worker from
    # before the removal exiting frees no row of the new counters ...
    before.pid = 999_999_997
    before.cslb_row = worker.cslb_row
    m.release(server, before)
    assert _slot(m.store, worker.cslb_row).reserved
    # ... and, still running, it does not keep a new worker's row from being freed.
    worker.pid = 999_999_996  # died before adopting its row
    server.WORKERS[before.pid] = before
    m.release(server, worker)
    assert not _slot(m.store, worker.cslb_row).reserved
    # The periodic tick reaps and checks without raising either.
    m.next_reap = 0.0
    m.tick()
    m.stop(server)


def test_no_counters_at_all_forks_without_a_row(namespaces, monkeypatch) -> None:
    m, server = _master(namespaces())
    for name in shm.list_segments(m.namespace):
        shm.names.unlink_name(name)

    def refuse(*a, **kw):
        raise shm.SegmentFullError(f"/cslb.{m.namespace}.counters", "no room in /dev/shm")

    monkeypatch.setattr(shm.CounterStore, "create", classmethod(refuse))
    worker = SimpleNamespace(pid=0)
    m.reserve(worker)
    assert worker.cslb_row is None
    assert m.log.has("workers fork without a row")
    m.next_reap = 0.0
    m.tick()  # logged once, not raised
    assert sum("workers fork without a row" in line for line in m.log.lines) == 1
    m.stop(server)


def test_stop_keeps_counters_another_server_holds(namespaces, holders) -> None:
    ns = namespaces()
    a, server_a = _master(ns)  # created them
    b, _ = _master(ns)  # attached
    w = SimpleNamespace(pid=0)
    b.reserve(w)
    holders(ns, w.cslb_row)  # B's worker adopted it
    a.stop(server_a)
    assert f"/cslb.{ns}.counters" in shm.list_segments(ns)
    assert server_a.log.has("counters_kept shm_namespace=") and server_a.log.has(
        'why="rows held by live processes"'
    )
    # B can still reserve on them.
    w2 = SimpleNamespace(pid=0)
    b.reserve(w2)
    assert w2.cslb_row is not None and not b.log.has("removed or replaced")


def test_last_server_out_removes_the_counters(namespaces) -> None:
    ns = namespaces()
    a, server_a = _master(ns)  # created them
    b, server_b = _master(ns)  # attached
    b.stop(server_b)  # no other live holder: the last one out removes them
    assert shm.list_segments(ns) == []
    a.stop(server_a)  # finds them gone: no error
    assert shm.list_segments(ns) == []


def test_arbiter_wrappers_log_instead_of_raising() -> None:
    calls: list[str] = []
    server = SimpleNamespace(
        log=ListLog(),
        reap_workers=lambda: calls.append("reap"),
        manage_workers=lambda: calls.append("manage"),
    )

    class Broken:
        loop_hooked = False
        log = server.log  # the master's logger (cslb.master) stood in for

        def poll(self) -> None:
            raise RuntimeError("poll broke")

        def tick(self) -> None:
            raise shm.SegmentMissingError("/cslb.x.counters", "gone")

    conf.hook_arbiter_loop(server, Broken())
    server.reap_workers()
    server.manage_workers()
    assert calls == ["reap", "manage"]  # gunicorn's own part still ran
    assert server.log.has("discovery_check_failed")
    assert server.log.has("supervision_failed")


def test_before_fork_warns_of_threads_and_an_inherited_router(namespaces) -> None:
    from workers.routing.router import Router

    m, server = _master(namespaces())
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, args=(30,), daemon=True)
    t.start()
    try:
        m.before_fork()
    finally:
        stop.set()
        t.join(timeout=10)
    assert m.log.has("threads while forking workers")
    assert not m.log.has("Router was attached in the master")
    router = Router.attach(namespaces())  # what --preload with a module-level attach does
    try:
        m.before_fork()
        m.before_fork()
    finally:
        router.close()
    assert sum("Router was attached in the master" in line for line in m.log.lines) == 1
    m.stop(server)


def test_worker_exit_closes_the_router(namespaces) -> None:
    from workers.routing.router import Router

    router = Router.attach(namespaces())
    assert Router.current() is router
    conf.worker_exit(None, None)
    assert Router.current() is None


@pytest.mark.parametrize(
    ("argv", "env", "disabled"),
    [
        ([], {}, True),
        (["-c", "python:workers.gunicorn_conf", "app:app"], {}, True),
        (["--control-socket", "/tmp/x.ctl", "app:app"], {}, False),
        (["--control-socket=/tmp/x.ctl"], {}, False),
        (["--control-socket-mode", "600"], {}, True),
        ([], {"GUNICORN_CMD_ARGS": "--control-socket /tmp/x.ctl"}, False),
    ],
)
def test_control_socket_off_unless_asked(argv, env, disabled) -> None:
    assert (not conf.control_socket_asked(argv, env)) is disabled


def test_control_socket_setting_reaches_gunicorn(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from gunicorn.app.wsgiapp import WSGIApplication\n"
        "sys.argv = ['gunicorn', *sys.argv[1:]]\n"
        "app = WSGIApplication()\n"
        "print(app.cfg.control_socket_disable)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("GUNICORN_CMD_ARGS", None)
    out = {}
    for extra in ([], ["--control-socket", str(tmp_path / "g.ctl")]):
        res = subprocess.run(
            [sys.executable, "-c", code, "-c", "python:workers.gunicorn_conf", *extra, "x:app"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )
        assert res.returncode == 0, res.stderr
        out[bool(extra)] = res.stdout.strip().splitlines()[-1]
    assert out == {False: "True", True: "False"}


def test_start_log_says_created_taken_over_or_attached(namespaces) -> None:
    ns = namespaces()
    m, server = _master(ns, "embedded")
    m.store.close(unlink=False)  # a previous master's, same geometry
    assert m.attach_counters() == "taken over"
    m.stop(server)
    assert shm.list_segments(ns) == []
    assert m.attach_counters() == "created"
    ext, _ = _master(ns, "external")
    assert ext.attach_counters() == "attached"
    ext.store.close(unlink=False)
    m.pid = os.getpid()
    m.stop(server)


def test_older_gunicorn_is_refused_by_name() -> None:
    conf.check_gunicorn((25, 1, 0))
    conf.check_gunicorn((27, 0, 1))
    with pytest.raises(conf.CslbStartupError, match=r"gunicorn 23\.0\.0 is too old.*>= 25\.1"):
        conf.check_gunicorn((23, 0, 0))
