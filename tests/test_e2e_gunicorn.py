"""The gunicorn master's cslb part with real gunicorn and a tiny app (no Router needed).

Counter rows per worker, discovery supervision (restart after SIGKILL, startup failure),
hooks composed with a user's config, external discovery, clean stop: no process and no
segment left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import shm
import shm.names
from shm.owners import process_start_ticks
from tests.gunicorn_harness import (
    APPS_DIR,
    REPO,
    Server,
    alive,
    cmdline,
    serving,
    unique_namespace,
    wait_for,
)

PING = ["--app", "pingapp:app"]


def _answers(server: Server, n: int) -> list[dict]:
    return [server.get_json("/") for _ in range(n)]


def _held_rows(namespace: str) -> list[shm.SlotInfo]:
    store = shm.CounterStore.attach(namespace, writable=False)
    try:
        return [s for s in store.slots() if s.alive or (s.reserved and alive(s.pid))]
    finally:
        store.close(unlink=False)


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _pidfds(pid: int) -> list[str]:
    """Open pidfds of process ``pid`` (the master's handle on discovery is one)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if "pidfd" in target:
            out.append(target)
    return out


def test_rows_supervision_and_clean_stop(tmp_path: Path) -> None:
    with serving(PING, tmp_path) as server:
        server.wait_ready(workers=2)
        master = server.pid
        assert _threads(master) == 1  # no thread in the master (NumPy's BLAS pool included)
        assert not server.events("master_threads")  # none at any fork either
        # Discovery starts before the first worker forks.
        (disc,) = server.discovery_pids()
        first_worker = min(process_start_ticks(p) or 0 for p in server.worker_pids())
        assert process_start_ticks(disc) < first_worker
        # The master tracks discovery through a pidfd; its workers hold none of it.
        assert _pidfds(master)
        assert all(_pidfds(w) == [] for w in server.worker_pids())
        # No source given: discovery's own default, the example file of the source tree.
        assert '"event":"endpoints_file_default"' in server.log()
        assert str(REPO / "examples" / "endpoints.json") in server.log()
        workers = set(server.worker_pids())
        assert len(workers) == 2

        # Each worker got its own reserved row, handed over as CSLB_COUNTER_ROW.
        rows: dict[int, str] = {}
        wait_for(
            "both workers to answer",
            lambda: (
                rows.update({a["pid"]: a["row"] for a in _answers(server, 4)}) or len(rows) == 2
            ),
            10.0,
        )
        assert set(rows) == workers
        assert len(set(rows.values())) == 2 and all(r is not None for r in rows.values())
        held = _held_rows(server.namespace)
        assert sorted(s.row for s in held) == sorted(int(r) for r in rows.values())
        assert {s.pid for s in held} == {master}  # reserved; pingapp never adopts them

        # A second server on the same namespace refuses to start, naming the problem.
        other = subprocess.run(
            [sys.executable, "-m", "cslb", "serve", "--bind", "127.0.0.1:0", *PING],
            env={**os.environ, "CSLB_SHM_NAMESPACE": server.namespace, "PYTHONPATH": str(APPS_DIR)},
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
        assert other.returncode != 0
        assert b"is in use" in other.stderr and server.namespace.encode() in other.stderr
        assert alive(master) and server.get_json("/")["pid"] in workers

        # SIGKILL discovery: the master starts a new one; requests never fail meanwhile.
        (disc,) = server.discovery_pids()
        os.kill(disc, signal.SIGKILL)
        ok = 0
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            assert server.get_json("/", timeout_s=5.0)["pid"] in workers
            ok += 1
            new = [p for p in server.discovery_pids() if p != disc]
            if new and ok >= 20:
                break
            time.sleep(0.01)
        assert new, f"discovery was not restarted:\n{server.log()}"
        assert "killed by SIGKILL" in server.log()

        # SIGKILL a worker: gunicorn replaces it; its row is freed and the new worker
        # gets one; no row leaks.
        victim = sorted(workers)[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            "a replacement worker",
            lambda: len(set(server.worker_pids()) - workers) == 1 and victim not in server.tree(),
            15.0,
        )
        wait_for("two held rows", lambda: len(_held_rows(server.namespace)) == 2, 10.0)
        assert len(_held_rows(server.namespace)) == 2

        # HUP (graceful reload): new workers with rows of their own, the old ones' rows
        # freed, discovery untouched.
        (disc,) = server.discovery_pids()
        before = set(server.worker_pids())
        os.kill(master, signal.SIGHUP)
        wait_for(
            "the reload to replace every worker",
            lambda: len(set(server.worker_pids())) == 2 and not set(server.worker_pids()) & before,
            20.0,
        )
        wait_for("two held rows after HUP", lambda: len(_held_rows(server.namespace)) == 2, 10.0)
        assert server.discovery_pids() == [disc]
        assert all(a["row"] is not None for a in _answers(server, 4))

        (disc,) = server.discovery_pids()
        result = server.stop()
        assert result["exit"] == 0, server.log()
        assert result["left"] == [], [cmdline(p) for p in result["left"]]
        assert result["segments"] == []
        # on_exit stopped discovery (SIGTERM: a clean exit), it did not just die.
        stopped = server.events("discovery_stopped")
        assert [(e["discovery_pid"], e["exit"]) for e in stopped] == [
            (disc, "exited with status 0")
        ]


def test_leftover_segments_of_a_killed_discovery_are_removed(tmp_path: Path) -> None:
    env = {"CSLB_DISCOVERY_RESTART_BACKOFF": "60", "CSLB_DISCOVERY_RESTART_BACKOFF_MAX": "60"}
    with serving([*PING, "--workers", "1"], tmp_path, env=env) as server:
        server.wait_ready(workers=1)
        (disc,) = server.discovery_pids()
        os.kill(disc, signal.SIGKILL)  # its tables stay; no restart for 60 s
        wait_for("the master to see discovery die", lambda: "killed by SIGKILL" in server.log(), 15)
        assert f"/cslb.{server.namespace}.tables" in shm.list_segments(server.namespace)
        result = server.stop()
        assert result["exit"] == 0 and result["left"] == [], server.log()
        assert result["segments"] == []
        assert server.events("segments_removed"), server.log()


def test_hung_discovery_is_replaced(tmp_path: Path) -> None:
    env = {"CSLB_DISCOVERY_STALL_TIMEOUT": "1.5"}  # heartbeat every 0.2 s (harness)
    with serving(PING, tmp_path, env=env) as server:
        server.wait_ready(workers=2)
        (disc,) = server.discovery_pids()
        time.sleep(2.0)
        assert server.discovery_pids() == [disc]  # a live heartbeat is left alone
        os.kill(disc, signal.SIGSTOP)  # alive, but its loop (and heartbeat) stops
        new = wait_for(
            "a new discovery process",
            lambda: [p for p in server.discovery_pids() if p != disc],
            15.0,
        )
        assert new and not alive(disc)
        assert server.events("discovery_hung"), server.log()
        result = server.stop()
        assert result["exit"] == 0 and result["left"] == [] and result["segments"] == []


def test_a_bad_discovery_setting_stops_cslb_serve_before_gunicorn(tmp_path: Path) -> None:
    with serving(PING, tmp_path, env={"CSLB_DEBOUNCE": "soon"}) as server:
        code = server.proc.wait(timeout=60)
        log = server.log()
        assert code == 2  # cslb serve checks the discovery child's settings first
        assert "invalid CSLB_DEBOUNCE='soon'" in log
        assert "Booting" not in log and shm.list_segments(server.namespace) == []


def test_discovery_failing_at_startup_stops_the_server(tmp_path: Path) -> None:
    # Plain gunicorn with cslb's config: discovery's settings are checked by discovery.
    args = ["-c", "python:workers.gunicorn_conf", "pingapp:app"]
    with serving(args, tmp_path, gunicorn=True, env={"CSLB_DEBOUNCE": "soon"}) as server:
        code = server.proc.wait(timeout=60)
        log = server.log()
        assert code == 2  # a refused setting: status 2, as cslb discovery's own (docs/gunicorn.md)
        assert "invalid CSLB_DEBOUNCE='soon'" in log  # discovery's own message
        assert "discovery process refused its settings (exit status 2" in log
        assert "restarting" not in log  # a startup failure is final, not retried
        assert shm.list_segments(server.namespace) == []
        assert [p for p in server.seen if server.ours(p)] == []


@pytest.mark.parametrize("failure", ["port taken", "app does not import"])
def test_a_server_failing_after_on_starting_leaves_nothing(failure: str, tmp_path: Path) -> None:
    import socket

    holder = socket.socket()
    try:
        args = PING
        if failure == "port taken":
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            args = [*PING, "--bind", f"127.0.0.1:{holder.getsockname()[1]}"]
        else:
            args = ["--app", "no_such_module_cslb:app"]
        with serving(args, tmp_path) as server:
            code = server.proc.wait(timeout=60)
            assert code != 0, server.log()
            log = server.log()
            assert server.events("discovery_started"), log  # past on_starting: discovery ran
            wait_for(
                "the namespace to be empty",
                lambda: shm.list_segments(server.namespace) == [],
                10.0,
            )
            assert [p for p in server.seen if server.ours(p)] == []
    finally:
        holder.close()


def test_more_workers_than_rows(tmp_path: Path) -> None:
    with serving(PING, tmp_path, env={"CSLB_COUNTER_ROWS": "1"}) as server:
        server.wait_ready(workers=2)
        rows: dict[int, str | None] = {}
        wait_for(
            "both workers to answer",
            lambda: (
                rows.update({a["pid"]: a["row"] for a in _answers(server, 4)}) or len(rows) == 2
            ),
            10.0,
        )
        assert sorted(rows.values(), key=str) == ["0", None]  # one row, one without
        assert server.events("no_counter_row"), server.log()
        assert "CSLB_COUNTER_ROWS" in server.log()
        result = server.stop()
        assert result["exit"] == 0 and result["left"] == [] and result["segments"] == []


def test_bad_cslb_setting_is_named(tmp_path: Path) -> None:
    with serving(PING, tmp_path, env={"CSLB_COUNTER_ROWS": "many"}) as server:
        assert server.proc.wait(timeout=60) != 0
        assert "CSLB_COUNTER_ROWS='many'" in server.log()
        assert shm.list_segments(server.namespace) == []


USER_CONF = """
import os
from pathlib import Path

from workers.gunicorn_conf import *  # noqa: F403
from workers.gunicorn_conf import compose

workers = 2
MARKS = Path({marks!r})


def post_fork(server, worker):
    # runs after cslb's part: the row is already there
    os.environ["TEST_MARKER"] = "row=" + os.environ.get("CSLB_COUNTER_ROW", "none")


def on_exit(server):
    # runs before cslb's part: the segments still exist
    import shm
    MARKS.write_text(",".join(shm.list_segments(os.environ["CSLB_SHM_NAMESPACE"])))


compose(globals())
"""


def test_user_config_composes_with_cslb_hooks(tmp_path: Path) -> None:
    marks = tmp_path / "on_exit.txt"
    (tmp_path / "myconf.py").write_text(USER_CONF.format(marks=str(marks)))
    with serving(["-c", "myconf.py", "pingapp:app"], tmp_path, gunicorn=True) as server:
        server.wait_ready(workers=2)
        answers = _answers(server, 6)
        assert all(a["marker"] == f"row={a['row']}" and a["row"] is not None for a in answers)
        assert server.discovery_pids()  # cslb's on_starting ran too
        # Plain gunicorn 25.1+ would start its control socket thread after the first
        # forks; the config module turns it off, so the master stays single-threaded.
        assert _threads(server.pid) == 1
        assert "Control socket" not in server.log()
        result = server.stop()
        assert result["exit"] == 0 and result["left"] == [] and result["segments"] == []
        seen_at_exit = marks.read_text().split(",")
        assert f"/cslb.{server.namespace}.counters" in seen_at_exit


@pytest.fixture
def sidecar():
    """``cslb discovery`` run as a sidecar in its own namespace; stopped by PID."""
    ns = unique_namespace("x")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSLB_")}
    env.update({"CSLB_SHM_NAMESPACE": ns, "CSLB_HEARTBEAT": "0.2"})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cslb",
            "discovery",
            "--endpoints-file",
            str(REPO / "examples" / "endpoints.json"),
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(
            "the sidecar's tables",
            lambda: f"/cslb.{ns}.tables" in shm.list_segments(ns),
            20.0,
        )
        yield SimpleNamespace(namespace=ns, proc=proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for name in shm.list_segments(ns):
            shm.names.unlink_name(name)
    assert shm.list_segments(ns) == []


def test_external_discovery(tmp_path: Path, sidecar) -> None:
    ns = sidecar.namespace
    with serving([*PING, "--discovery", "external"], tmp_path, namespace=ns) as server:
        server.wait_ready(workers=2)
        assert server.discovery_pids() == []  # the master started none
        assert all(a["row"] is not None for a in _answers(server, 4))
        assert [e["counters"] for e in server.events("master_started")] == ["created"]
        result = server.stop()
        assert result["exit"] == 0 and result["left"] == []
        # The master removed the counters (no one else held a row), not the sidecar's
        # tables.
        assert f"/cslb.{ns}.tables" in result["segments"]
        assert not any(".counters" in s for s in result["segments"])
        assert alive(sidecar.proc.pid)


def test_two_servers_share_a_sidecar(tmp_path: Path, sidecar) -> None:
    """The first server to stop leaves the counters the other one uses."""
    ns = sidecar.namespace
    args = [*PING, "--discovery", "external", "--workers", "1"]
    with serving(args, tmp_path, namespace=ns, unlink=False) as a:
        a.wait_ready(workers=1)
        with serving(args, tmp_path, namespace=ns, unlink=False) as b:
            b.wait_ready(workers=1)
            assert [e["counters"] for e in a.events("master_started")] == ["created"]
            assert [e["counters"] for e in b.events("master_started")] == ["attached"]
            (b_worker,) = b.worker_pids()
            assert b.get_json("/")["row"] is not None
            result = a.stop()
            assert result["exit"] == 0 and result["left"] == [], a.log()
            assert a.events("counters_kept"), a.log()
            assert f"/cslb.{ns}.counters" in shm.list_segments(ns)
            # B's master forks a replacement on the same counters, with a row.
            os.kill(b_worker, signal.SIGKILL)
            new = wait_for(
                "a replacement worker in B",
                lambda: [p for p in b.worker_pids() if p != b_worker],
                20.0,
            )
            answer = wait_for("the new worker to answer", lambda: b.get_json("/"), 10.0)
            assert answer["pid"] == new[0] and answer["row"] is not None, b.log()
            assert alive(b.pid) and "Unhandled exception" not in b.log()
            result = b.stop()
            assert result["exit"] == 0 and result["left"] == [], b.log()
            # The last server out removed the counters; the sidecar's tables stay.
            assert f"/cslb.{ns}.tables" in result["segments"]
            assert not any(".counters" in name for name in result["segments"])


def test_serve_print_command_and_errors(tmp_path: Path) -> None:
    from cslb import serve_cmd as serve

    env: dict[str, str] = {}
    cmd = serve.command(
        ["--threads", "4", "--workers", "3", "--balance-factor", "1.5", "--", "--timeout", "5"],
        env,
        python="PY",
    )
    assert cmd == [
        "PY", "-m", "gunicorn", "--config", "python:workers.gunicorn_conf",
        "--bind", "127.0.0.1:8000", "--workers", "3", "--worker-class", "gthread",
        "--threads", "4", "--no-control-socket", "--timeout", "5", "workers.app:app",
    ]  # fmt: skip
    assert env == {"CSLB_BALANCE_FACTOR": "1.5"}

    f = tmp_path / "eps.json"
    f.write_text("[]")
    env = {"CSLB_SERVICE": "old"}
    serve.command(["--endpoints-file", str(f)], env)
    assert env == {"CSLB_ENDPOINTS_FILE": str(f)}
    env = {}
    serve.command(["--namespace", "shop", "--service", "products"], env)
    assert env == {"CSLB_NAMESPACE": "shop", "CSLB_SERVICE": "products"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--endpoints-file", "nope.json"], "--endpoints-file nope.json: no such file"),
        (["--namespace", "shop"], "give --service too"),
        (["--endpoints-file", "x.json", "--namespace", "shop"], "nothing with --endpoints-file"),
        (["--endpoints-file", "x", "--service", "s"], "not allowed with argument"),
        (["--workers", "0"], "expected an integer >= 1"),
        (["--balance-factor", "0.5"], "CSLB_BALANCE_FACTOR"),
        (["--shm-namespace", "a/b"], "is invalid"),
    ],
)
def test_serve_rejects_bad_arguments(argv, message, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cslb", "serve", *argv],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert message in out.stderr.decode(), out.stderr.decode()


def test_serve_help_lists_it_in_cslb(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "cslb"], capture_output=True, timeout=60)
    assert b"serve" in out.stdout
    f = tmp_path / "eps.json"
    f.write_text("[]")
    out = subprocess.run(
        [sys.executable, "-m", "cslb", "serve", "--print-command", "--endpoints-file", str(f),
         "--percentage", "20", "--", "--timeout", "9"],
        env={k: v for k, v in os.environ.items() if not k.startswith("CSLB_")},
        capture_output=True,
        timeout=60,
        text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == [f"CSLB_ENDPOINTS_FILE={f}", "CSLB_PERCENTAGE=20"]
    assert lines[2].endswith("--no-control-socket --timeout 9 workers.app:app")
