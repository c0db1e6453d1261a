"""The host's discovery process as a supervised child of the gunicorn master.

The master starts ``python -m cslb discovery`` by fork+exec (no Kubernetes client and no
thread in the master), restarts it with exponential backoff when it dies, and stops it
with SIGTERM, then SIGKILL after a timeout, when the server stops.

Two gunicorn facts shape this module (gunicorn 25.1-27, ``gunicorn/arbiter.py``):

* The arbiter reaps children with ``waitpid(-1, WNOHANG)`` in ``reap_workers`` and
  quietly drops a PID that is not one of its workers ("Reaped unknown child process",
  debug level). So the supervisor may find its child already reaped by the arbiter: it
  tracks the child through a *pidfd* (Linux >= 5.4 for ``waitid(P_PIDFD)``), which
  tells exit from life even after someone else reaped it and can never wait on or
  signal a reused PID. The exit status is
  then unknown unless :meth:`DiscoverySupervisor.poll` ran first, which is why the
  config module polls before the arbiter reaps (:mod:`workers.gunicorn_conf`).
* No gunicorn hook runs periodically; restarts are driven by :meth:`tick`, which the
  config module calls from the arbiter's main loop (about once a second and on every
  SIGCHLD).

The child runs in its own session (a Ctrl-C in the terminal reaches only the master,
which then stops discovery in order) and gets ``PR_SET_PDEATHSIG`` = SIGTERM through a
tiny exec shim, so a SIGKILLed master does not leave discovery running forever.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lbcore.knobs import (
    Knob,
    KnobError,
    from_mapping,
    parse_choice,
    parse_int_between,
    seconds_at_least,
)
from lbcore.logformat import Event
from shm.settings import UNLINK_ON_EXIT

__all__ = [
    "DISCOVERY_MODES",
    "SUPERVISOR_KNOBS",
    "DiscoverySupervisor",
    "discovery_command",
    "settings_from_env",
]

#: ``embedded``: the master runs discovery as its child; ``external``: a sidecar does.
DISCOVERY_MODES = ("embedded", "external")


_rows = parse_int_between(0, 4096)  # 0: automatic


#: Settings of the gunicorn master's cslb part (environment only; ``cslb serve`` sets
#: them from its flags). Discovery's own settings (``CSLB_ENDPOINTS_FILE``,
#: ``CSLB_DEBOUNCE``...) pass through the environment to the discovery child.
SUPERVISOR_KNOBS: tuple[Knob, ...] = (
    Knob(
        "discovery",
        "CSLB_DISCOVERY",
        "--discovery",
        "embedded",
        parse_choice(DISCOVERY_MODES),
        "'embedded': the gunicorn master runs the host's discovery process as a supervised "
        "child; 'external': a discovery process runs elsewhere on the host (a sidecar "
        "sharing /dev/shm) and the master only attaches to its tables.",
        "MODE",
    ),
    Knob(
        "counter_rows",
        "CSLB_COUNTER_ROWS",
        "--counter-rows",
        0,
        _rows,
        "Worker slots (rows) of the host's counters; 0: 2 x workers x threads + 4, room "
        "for a graceful reload (HUP) that starts new workers before the old ones exit.",
        "N",
    ),
    Knob(
        "start_wait_s",
        "CSLB_DISCOVERY_START_WAIT",
        "--discovery-start-wait",
        10.0,
        seconds_at_least(0.0),
        "How long in seconds the master waits for the first published table before it "
        "forks workers (they route everything to the fallback until a table exists).",
        "SECONDS",
    ),
    Knob(
        "restart_backoff_s",
        "CSLB_DISCOVERY_RESTART_BACKOFF",
        "--discovery-restart-backoff",
        0.5,
        seconds_at_least(0.0),
        "Delay in seconds before the master restarts a dead discovery process; doubles "
        "per consecutive failure up to the maximum and resets after 30 s of life.",
        "SECONDS",
    ),
    Knob(
        "restart_backoff_max_s",
        "CSLB_DISCOVERY_RESTART_BACKOFF_MAX",
        "--discovery-restart-backoff-max",
        30.0,
        seconds_at_least(0.0),
        "Longest delay in seconds between restarts of a discovery process that keeps dying.",
        "SECONDS",
    ),
    Knob(
        "stop_timeout_s",
        "CSLB_DISCOVERY_STOP_TIMEOUT",
        "--discovery-stop-timeout",
        5.0,
        seconds_at_least(0.0),
        "How long in seconds the master waits for discovery to exit after SIGTERM before "
        "it sends SIGKILL.",
        "SECONDS",
    ),
    Knob(
        "stall_timeout_s",
        "CSLB_DISCOVERY_STALL_TIMEOUT",
        "--discovery-stall-timeout",
        30.0,
        seconds_at_least(0.0),
        "A running discovery process whose heartbeat in the tables is older than this "
        "many seconds is hung: the master SIGKILLs it and starts a new one. 0: never.",
        "SECONDS",
    ),
    UNLINK_ON_EXIT,
)


def settings_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Resolve :data:`SUPERVISOR_KNOBS` from the environment (else their defaults).

    Raises
    ------
    lbcore.knobs.KnobError
        A variable does not parse; the message names it and what was expected.
    """
    env = os.environ if environ is None else environ
    values = {k.name: k.default for k in SUPERVISOR_KNOBS}
    values.update(from_mapping(env, SUPERVISOR_KNOBS, source="environment"))
    return values


# Sets PR_SET_PDEATHSIG (kept across execve), checks the master is still the parent
# (it may have died before the prctl), then execs the real command.
_PDEATHSIG_SHIM = (
    "import ctypes,os,signal,sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(0)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def discovery_command(args: Sequence[str] = (), *, python: str | None = None) -> list[str]:
    """The command line of the host's discovery process (``python -m cslb discovery``).

    Endpoint source and knobs normally reach it through the inherited ``CSLB_*``
    environment; ``args`` are appended (flags win over the environment).
    """
    return [python or sys.executable, "-m", "cslb", "discovery", *args]


def _describe(status: int | None) -> str:
    if status is None:
        return "exit status unknown (reaped by the gunicorn arbiter)"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    if os.WIFEXITED(status):
        return f"exited with status {os.WEXITSTATUS(status)}"
    return f"wait status {status}"


def _wait_status(res: os.waitid_result) -> int:
    """The ``waitpid`` status word of a ``waitid`` result (for :func:`_describe`)."""
    if res.si_code == os.CLD_EXITED:
        return (res.si_status & 0xFF) << 8
    core = 0x80 if res.si_code == os.CLD_DUMPED else 0
    return (res.si_status & 0x7F) | core


class DiscoverySupervisor:
    """Start, watch, restart and stop one child process (the host's discovery).

    Not thread-safe: every method runs in the gunicorn master's main thread (hooks and
    the arbiter loop).

    Parameters
    ----------
    command
        Program and arguments, exec'd in a new session with the master's environment.
    env
        Environment of the child (default: the master's, read at each start).
    backoff_s, backoff_max_s
        Restart delay after the first consecutive death, and its cap (seconds); the
        delay doubles per consecutive death.
    stable_s
        A child that lived this long (seconds) resets the backoff.
    stop_timeout_s
        Wait after SIGTERM before SIGKILL, in :meth:`stop` (seconds).
    log
        Where to log starts, deaths and stops.
    deathsig
        Give the child ``PR_SET_PDEATHSIG`` = SIGTERM (Linux) through an exec shim.
    clock
        Monotonic clock in seconds.

    Attributes
    ----------
    starts : int
        Processes started so far (1 after the first start).
    last_exit : str | None
        How the last child ended, in words.
    last_code : int | None
        Its exit status (negative: the signal that ended it; ``None``: not known).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
        stable_s: float = 30.0,
        stop_timeout_s: float = 5.0,
        log: logging.Logger | Any | None = None,
        deathsig: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not command:
            raise ValueError("command must name a program to run")
        for name, value in (
            ("backoff_s", backoff_s),
            ("backoff_max_s", backoff_max_s),
            ("stable_s", stable_s),
            ("stop_timeout_s", stop_timeout_s),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        self.command = list(command)
        self.env = env
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = max(float(backoff_max_s), float(backoff_s))
        self.stable_s = float(stable_s)
        self.stop_timeout_s = float(stop_timeout_s)
        self.log = log or logging.getLogger("cslb.supervisor")
        self.deathsig = deathsig and sys.platform.startswith("linux")
        self.clock = clock
        self.starts = 0
        self.last_exit: str | None = None
        self.last_code: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self._started_at = 0.0
        self._failures = 0
        self._restart_at: float | None = None
        self._last_pid = 0
        self._stopped = False
        self._owner_pid = os.getpid()

    # -- state ------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """PID of the running child (``None`` while none runs)."""
        return None if self._proc is None else self._proc.pid

    @property
    def restart_at(self) -> float | None:
        """Clock time (s) of the scheduled restart, ``None`` if none is pending."""
        return self._restart_at

    def schedule_restart(self, delay_s: float = 0.0) -> None:
        """Start the child on the first :meth:`tick` ``delay_s`` seconds from now."""
        self._restart_at = self.clock() + delay_s

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` ran: the child is never restarted again."""
        return self._stopped

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> int:
        """Start the child now; returns its PID.

        Raises
        ------
        RuntimeError
            A child is already running, or the supervisor was stopped.
        OSError
            The program cannot be executed (the message names it).
        """
        if self._stopped:
            raise RuntimeError("the supervisor was stopped; it starts no more processes")
        if self._proc is not None:
            raise RuntimeError(f"a child is already running (pid {self._proc.pid})")
        argv = self.command
        if self.deathsig:
            argv = [sys.executable, "-c", _PDEATHSIG_SHIM, str(os.getpid()), *argv]
        env = dict(os.environ if self.env is None else self.env)
        env.pop("CSLB_COUNTER_ROW", None)  # a worker's setting, never discovery's
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            env=env,
            close_fds=True,
            start_new_session=True,
        )
        self._pidfd = None
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(self._proc.pid)
        self._started_at = self.clock()
        self._restart_at = None
        self.starts += 1
        self.log.info(
            Event(
                "discovery_started",
                discovery_pid=self._proc.pid,
                start=self.starts,
                command=" ".join(self.command),
            )
        )
        return self._proc.pid

    def _exited(self) -> tuple[bool, int | None]:
        """Whether the child ended, and its wait status if this call reaped it."""
        assert self._proc is not None
        pid = self._proc.pid
        if self._pidfd is not None:
            # Wait on the pidfd itself, never on the bare PID: once the arbiter reaped our
            # child, the PID may name a newer child of the master (a worker) already.
            try:
                res = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                return True, None  # reaped by the arbiter's waitpid(-1)
            except (AttributeError, OSError):  # no P_PIDFD (Linux < 5.4): ask the pidfd
                p = select.poll()
                p.register(self._pidfd, select.POLLIN)
                if not p.poll(0):
                    return False, None
            else:
                if res is None:
                    return False, None
                return True, _wait_status(res)
        try:
            wpid, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            # Reaped by the arbiter's waitpid(-1). Without a pidfd a reused PID could
            # look alive to kill(0), so only the pidfd path trusts a live answer.
            return True, None
        if wpid == 0:
            return False, None
        return True, status

    def poll(self, *, restart: bool = True) -> bool:
        """Check the child without blocking; returns True while it runs.

        A child found dead is logged and forgotten, and (with ``restart``) a restart is
        scheduled with backoff (see :meth:`tick`).
        """
        if self._proc is None or os.getpid() != self._owner_pid:
            return False
        done, status = self._exited()
        if not done:
            return True
        self._forget(status)
        if not restart:
            self.log.error(
                Event(
                    "discovery_exited",
                    discovery_pid=self._last_pid,
                    exit=self.last_exit,
                    lived_s=round(self.clock() - self._started_at, 3),
                )
            )
        elif not self._stopped:
            lived = self.clock() - self._started_at
            self._failures = 1 if lived >= self.stable_s else self._failures + 1
            delay = min(self.backoff_s * 2 ** (self._failures - 1), self.backoff_max_s)
            self._restart_at = self.clock() + delay
            self.log.error(
                Event(
                    "discovery_exited",
                    discovery_pid=self._last_pid,
                    exit=self.last_exit,
                    lived_s=round(lived, 3),
                    restart_in_s=round(delay, 3),
                    note="workers keep routing on the last published table",
                )
            )
        return False

    def _forget(self, status: int | None) -> None:
        assert self._proc is not None
        self._last_pid = self._proc.pid
        self.last_exit = _describe(status)
        self.last_code = None
        if status is not None:
            self._proc.returncode = self.last_code = os.waitstatus_to_exitcode(status)
        else:
            self._proc.returncode = 0  # nothing left to wait for
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._proc = None

    def tick(self) -> bool:
        """Poll the child and restart it once its backoff delay passed.

        Returns True if a child runs after the call. A failed start (the program
        cannot be executed) is logged and retried with backoff.
        """
        if self._stopped or os.getpid() != self._owner_pid:
            return False
        if self.poll():
            return True
        if self._restart_at is None or self.clock() < self._restart_at:
            return False
        try:
            self.start()
        except OSError as exc:
            self._failures += 1
            delay = min(self.backoff_s * 2 ** (self._failures - 1), self.backoff_max_s)
            self._restart_at = self.clock() + delay
            self.log.error(
                Event("discovery_start_failed", error=str(exc), retry_in_s=round(delay, 3))
            )
            return False
        return True

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the running child (never to a reused PID); False if none runs."""
        if self._proc is None or os.getpid() != self._owner_pid:
            return False
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                self._proc.send_signal(sig)
        except ProcessLookupError:
            return False
        except OSError as exc:  # pragma: no cover - EPERM and the like
            if exc.errno == errno.ESRCH:
                return False
            raise
        return True

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the child to end; True if it did."""
        deadline = self.clock() + max(timeout_s, 0.0)
        while True:
            if self._proc is None:
                return True
            done, status = self._exited()
            if done:
                self._forget(status)
                return True
            left = deadline - self.clock()
            if left <= 0:
                return False
            if self._pidfd is not None:
                p = select.poll()
                p.register(self._pidfd, select.POLLIN)
                p.poll(max(1, int(min(left, 0.1) * 1000)))
            else:
                time.sleep(min(left, 0.02))

    def stop(self, timeout_s: float | None = None) -> str | None:
        """Stop supervising: SIGTERM the child, SIGKILL it after ``timeout_s``, reap it.

        Returns how the child ended (``None`` if none was running). Idempotent.
        """
        if os.getpid() != self._owner_pid:
            return None
        self._stopped = True
        self._restart_at = None
        if self._proc is None:
            return None
        timeout = self.stop_timeout_s if timeout_s is None else timeout_s
        pid = self._proc.pid
        if self.signal(signal.SIGTERM) and not self.wait(timeout):
            self.log.warning(
                Event(
                    "discovery_killed",
                    discovery_pid=pid,
                    why=f"still running {timeout:g} s after SIGTERM",
                    signal="SIGKILL",
                )
            )
            self.signal(signal.SIGKILL)
            self.wait(5.0)
        if self._proc is not None:  # signal failed: it is gone already
            self.wait(1.0)
        self.log.info(Event("discovery_stopped", discovery_pid=pid, exit=self.last_exit))
        return self.last_exit

    def detach_in_child(self) -> None:
        """In a forked worker: drop the master's handle (never signal or wait on it)."""
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
        self._pidfd = None
        if self._proc is not None:
            self._proc.returncode = 0  # keep Popen.__del__ from waiting on it
        self._proc = None
        self._stopped = True


def check_settings(values: Mapping[str, Any]) -> None:
    """Raise :class:`~lbcore.knobs.KnobError` if the settings contradict each other."""
    if values["restart_backoff_max_s"] < values["restart_backoff_s"]:
        raise KnobError(
            "CSLB_DISCOVERY_RESTART_BACKOFF_MAX must be >= CSLB_DISCOVERY_RESTART_BACKOFF "
            f"(got {values['restart_backoff_max_s']} < {values['restart_backoff_s']})"
        )
