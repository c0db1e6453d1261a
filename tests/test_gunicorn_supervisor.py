"""workers.supervisor: the discovery child's supervisor, with real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lbcore.knobs import KnobError
from tests.gunicorn_harness import alive, unique_namespace, wait_for
from workers.master.supervisor import (
    DiscoverySupervisor,
    check_settings,
    discovery_command,
    settings_from_env,
)

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ListLog:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def _add(self, msg: str, *args: object) -> None:
        self.lines.append(str(msg) % args if args else str(msg))

    info = warning = error = debug = _add


@pytest.fixture
def sup_factory():
    made: list[DiscoverySupervisor] = []

    def make(command=SLEEP, **kw) -> DiscoverySupervisor:
        kw.setdefault("log", ListLog())
        sup = DiscoverySupervisor(command, **kw)
        made.append(sup)
        return sup

    yield make
    for sup in made:  # stop every child we started, by its pidfd/PID
        sup.stop(timeout_s=1.0)


def test_start_poll_stop(sup_factory) -> None:
    sup = sup_factory()
    pid = sup.start()
    assert sup.pid == pid and alive(pid)
    assert sup.poll() is True
    assert sup.stop(timeout_s=5.0) == "killed by SIGTERM"
    assert not alive(pid)
    assert sup.pid is None and sup.stopped
    assert sup.tick() is False  # a stopped supervisor never restarts
    with pytest.raises(RuntimeError, match="stopped"):
        sup.start()


def test_death_is_seen_and_restarted_with_growing_backoff(sup_factory) -> None:
    clock = FakeClock()
    sup = sup_factory(
        [sys.executable, "-c", "raise SystemExit(3)"],
        backoff_s=0.5,
        backoff_max_s=1.5,
        clock=clock,
    )
    delays = []
    sup.start()
    for _ in range(4):
        wait_for("the child to exit", lambda: not sup.poll(), 10.0)
        assert sup.last_exit == "exited with status 3"
        assert sup.restart_at is not None
        delays.append(sup.restart_at - clock.now)
        assert sup.tick() is False  # not yet due: no new process
        assert sup.pid is None
        clock.now = sup.restart_at
        assert sup.tick() is True
    assert delays == [0.5, 1.0, 1.5, 1.5]
    assert sup.starts == 5


def test_long_lived_child_resets_the_backoff(sup_factory) -> None:
    clock = FakeClock()
    sup = sup_factory(backoff_s=0.5, stable_s=30.0, clock=clock)
    pid = sup.start()
    os.kill(pid, signal.SIGKILL)
    wait_for("the child to die", lambda: not sup.poll(), 10.0)
    clock.now = sup.restart_at
    assert sup.tick() is True
    pid2 = sup.pid
    assert pid2 is not None and pid2 != pid
    clock.now += 31.0  # lived long enough
    os.kill(pid2, signal.SIGKILL)
    wait_for("the child to die", lambda: not sup.poll(), 10.0)
    assert sup.last_exit == "killed by SIGKILL"
    assert sup.restart_at - clock.now == 0.5


def test_child_reaped_by_someone_else(sup_factory) -> None:
    """gunicorn's arbiter reaps with waitpid(-1): the supervisor still sees the death."""
    sup = sup_factory(backoff_s=0.0)
    pid = sup.start()
    os.kill(pid, signal.SIGKILL)
    wpid, status = os.waitpid(pid, 0)  # what the arbiter's reap_workers does
    assert wpid == pid and os.WIFSIGNALED(status)
    assert sup.poll() is False
    assert "unknown" in sup.last_exit
    assert sup.signal(signal.SIGTERM) is False  # nothing to signal, no reused PID hit
    assert sup.tick() is True  # restarted (no backoff configured)
    assert sup.pid != pid and alive(sup.pid)


def test_sigkill_after_stop_timeout(sup_factory, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    stubborn = [
        sys.executable,
        "-c",
        "import pathlib,signal,sys,time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "pathlib.Path(sys.argv[1]).touch()\n"
        "time.sleep(60)\n",
        str(ready),
    ]
    log = ListLog()
    sup = sup_factory(stubborn, log=log)
    pid = sup.start()
    wait_for("the child to ignore SIGTERM", ready.exists, 10.0)
    t0 = time.monotonic()
    assert sup.stop(timeout_s=0.5) == "killed by SIGKILL"
    assert 0.4 < time.monotonic() - t0 < 5.0
    assert not alive(pid)
    assert any("SIGKILL" in line for line in log.lines)


def test_unexecutable_command_is_retried_with_backoff(sup_factory, tmp_path: Path) -> None:
    clock = FakeClock()
    missing = str(tmp_path / "no-such-program")
    sup = sup_factory([missing], deathsig=False, backoff_s=1.0, clock=clock)
    with pytest.raises(OSError):
        sup.start()
    # As a restart (tick), a failed exec is logged and retried later, never raised.
    sup.schedule_restart()
    assert sup.tick() is False
    assert sup.restart_at == clock.now + 1.0


def test_child_dies_with_a_sigkilled_master(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: a SIGKILLed master does not leave discovery running."""
    pid_file = tmp_path / "child.pid"
    ready = tmp_path / "child.ready"
    master = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib,sys,time\n"
            "from workers.master.supervisor import DiscoverySupervisor\n"
            "child = [sys.executable, '-c', "
            "'import pathlib,sys,time; pathlib.Path(sys.argv[1]).touch(); time.sleep(60)', "
            "sys.argv[2]]\n"
            "s = DiscoverySupervisor(child)\n"
            "pid = s.start()\n"
            "pathlib.Path(sys.argv[1]).write_text(str(pid))\n"
            "time.sleep(60)\n",
            str(pid_file),
            str(ready),
        ],
        start_new_session=True,
    )
    child = 0
    try:
        child = int(
            wait_for("the child pid", lambda: pid_file.exists() and pid_file.read_text(), 20)
        )
        # The real child (past the pdeathsig shim's exec) says it runs.
        wait_for("the child to run", ready.exists, 20.0)
        assert alive(child)
        master.kill()
        master.wait(timeout=10)
        wait_for("the orphan to get SIGTERM", lambda: not alive(child), 10.0)
    finally:
        if master.poll() is None:
            master.kill()
            master.wait(timeout=10)
        if child and alive(child):
            os.kill(child, signal.SIGKILL)


def _spawn_with_pid(pid: int, tries: int = 50) -> subprocess.Popen | None:
    """A child of this process with PID ``pid`` (through ns_last_pid), or None."""
    for _ in range(tries):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        p = subprocess.Popen(SLEEP)
        if p.pid == pid:
            return p
        p.kill()
        p.wait(timeout=10)
    return None


def test_reused_pid_is_never_taken_for_the_child(sup_factory) -> None:
    """The arbiter reaped discovery and a new child of the master got its PID."""
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs a writable /proc/sys/kernel/ns_last_pid (root) to reuse a PID")
    sup = sup_factory(backoff_s=60.0, deathsig=False)
    pid = sup.start()
    os.kill(pid, signal.SIGKILL)
    assert os.waitpid(pid, 0)[0] == pid  # the arbiter's waitpid(-1)
    impostor = _spawn_with_pid(pid)
    if impostor is None:
        pytest.skip(f"could not get PID {pid} again (a busy machine took it)")
    try:
        assert sup.poll() is False  # the child is gone, whatever now runs as its PID
        assert sup.signal(signal.SIGTERM) is False
        assert impostor.poll() is None, "the supervisor signalled the new process"
    finally:
        impostor.kill()
        impostor.wait(timeout=10)


def test_settings_from_env_and_errors() -> None:
    s = settings_from_env({})
    assert s["discovery"] == "embedded" and s["counter_rows"] == 0
    s = settings_from_env({"CSLB_DISCOVERY": "external", "CSLB_COUNTER_ROWS": "12"})
    assert s["discovery"] == "external" and s["counter_rows"] == 12
    with pytest.raises(KnobError, match="CSLB_DISCOVERY="):
        settings_from_env({"CSLB_DISCOVERY": "sidecar"})
    with pytest.raises(KnobError, match="CSLB_COUNTER_ROWS"):
        settings_from_env({"CSLB_COUNTER_ROWS": "-1"})
    with pytest.raises(KnobError, match="CSLB_DISCOVERY_STOP_TIMEOUT"):
        settings_from_env({"CSLB_DISCOVERY_STOP_TIMEOUT": "soon"})
    bad = settings_from_env(
        {"CSLB_DISCOVERY_RESTART_BACKOFF": "5", "CSLB_DISCOVERY_RESTART_BACKOFF_MAX": "1"}
    )
    with pytest.raises(KnobError, match="RESTART_BACKOFF_MAX must be >="):
        check_settings(bad)


def test_constructor_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="command"):
        DiscoverySupervisor([])
    with pytest.raises(ValueError, match="backoff_s"):
        DiscoverySupervisor(SLEEP, backoff_s=-1)
    with pytest.raises(ValueError, match="stop_timeout_s"):
        DiscoverySupervisor(SLEEP, stop_timeout_s=float("nan"))


def test_discovery_command_runs_cslb_discovery() -> None:
    cmd = discovery_command(["--debounce", "0.1"])
    assert cmd[1:] == ["-m", "cslb", "discovery", "--debounce", "0.1"]
    out = subprocess.run([*discovery_command(["--help"])], capture_output=True, timeout=60)
    assert out.returncode == 0 and b"cslb discovery" in out.stdout


def test_harness_never_kills_a_reused_pid(tmp_path: Path) -> None:
    """Server.kill signals a PID only while it names the process the tree had."""
    from shm.owners import process_start_ticks
    from tests.gunicorn_harness import Server

    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=30)
    stranger = subprocess.Popen(SLEEP)  # stands for a process that got a seen PID again
    try:
        server = Server.__new__(Server)
        server.pid, server.proc, server.namespace = done.pid, done, unique_namespace("h")
        server.unlink = True
        server.log_file = open(tmp_path / "log", "wb")
        ticks = process_start_ticks(stranger.pid)
        assert ticks is not None
        server.seen = {stranger.pid: ticks - 1}  # same PID, another start time
        server.kill()
        with pytest.raises(subprocess.TimeoutExpired):  # still running: not SIGKILLed
            stranger.wait(timeout=0.5)
        server.seen = {stranger.pid: ticks}
        server.kill()
        assert stranger.wait(timeout=10) == -signal.SIGKILL
    finally:
        if stranger.poll() is None:
            stranger.kill()
            stranger.wait(timeout=10)
