"""cslb's duties in the gunicorn master: :class:`Master` and the one :data:`MASTER`.

The master owns the host's counters (created, attached again when replaced, removed by
the last server out), the discovery child (started, polled, restarted with backoff,
stopped) and the counter rows of dead processes (reaped). The hooks in
:mod:`workers.master.hooks` call it; :func:`hook_arbiter_loop` makes the arbiter's main
loop call it too (gunicorn has no periodic hook), and :func:`runrun_guarded` keeps any
failure of cslb's part out of gunicorn's loop.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import lbcore
import shm
import shm.locks
import shm.names
import shm.owners
from lbcore.knobs import KnobError
from lbcore.logformat import Event
from workers.master.supervisor import (
    DiscoverySupervisor,
    check_settings,
    discovery_command,
    settings_from_env,
)
from workers.settings_check import check_environment

#: How often the arbiter loop reaps counter rows of dead processes (seconds).
REAP_INTERVAL_S = 1.0
#: A failure of cslb's part of the arbiter's loop is logged at most this often (per part).
FAILURE_LOG_INTERVAL_S = 60.0
_failures: dict[str, list[float]] = {}  # what -> [next log at, failures not logged]


def run_guarded(mlog: Any, event: str, what: str, fn: Callable[[], Any]) -> None:
    """Run ``fn`` (cslb's part of an arbiter hook or loop step); never raise.

    Escaping into gunicorn's main loop an exception stops the master ("Unhandled
    exception in main loop", exit 255, discovery and segments left behind). It is logged
    with its traceback at most once a minute per ``what``, with the number of failures
    not logged since.
    """
    try:
        fn()
    except Exception:
        now = time.monotonic()
        state = _failures.setdefault(what, [0.0, 0])
        if now < state[0]:
            state[1] += 1
            return
        suppressed = int(state[1])
        state[:] = [now + FAILURE_LOG_INTERVAL_S, 0]
        with contextlib.suppress(Exception):
            mlog.exception(
                Event(event, of=what, not_logged_since=suppressed, action="retried later")
            )


#: The master's cslb lines (:mod:`workers.master.logs`: cslb's format under this module).
log = logging.getLogger("cslb.master")


class CslbStartupError(RuntimeError):
    """The master cannot start cslb's part (gunicorn prints it and exits with status 1)."""


class CslbSettingsError(CslbStartupError):
    """A setting is unusable: the master exits with status 2 (:data:`SETTINGS_EXIT`).

    The message names the variable and what it accepts (the knob's own parser's words).
    """


#: The master's exit status for an unusable setting, as ``cslb serve``/``cslb discovery``.
SETTINGS_EXIT = 2


#: Oldest gunicorn this module supports: 25.1 added ``--no-control-socket``, and before
#: 25 the arbiter reaped workers (and ran ``child_exit``) inside its SIGCHLD handler.
MIN_GUNICORN = (25, 1)


def check_gunicorn(version: tuple[int, ...]) -> None:
    """Raise :class:`CslbStartupError` if gunicorn ``version`` is older than supported."""
    if tuple(version[:2]) < MIN_GUNICORN:
        raise CslbStartupError(
            "cslb: gunicorn {} is too old: workers.gunicorn_conf needs gunicorn >= {}".format(
                ".".join(map(str, version)), ".".join(map(str, MIN_GUNICORN))
            )
        )


class Master:
    """cslb's state in the gunicorn master (one per process; see :data:`MASTER`)."""

    def __init__(self) -> None:
        self.pid = 0
        self.settings: dict[str, Any] = {}
        self.namespace = ""
        self.rows = 0
        self.store: shm.CounterStore | None = None
        self.store_epoch = 0  # +1 each time the counters are attached again
        self.owns_namespace = False  # embedded: we created its counters, we clean it up
        self.supervisor: DiscoverySupervisor | None = None
        self.log: Any = log
        self.next_reap = 0.0
        self.loop_hooked = False
        self.reader: shm.TableReader | None = None  # for discovery's heartbeat
        self.warned: set[str] = set()
        self.exit_registered = False

    @property
    def active(self) -> bool:
        """True in the process that started cslb's part (not in a forked worker)."""
        return self.pid == os.getpid()

    # -- start --------------------------------------------------------------------------

    def start(self, server: Any) -> None:
        """Check gunicorn and the settings, then set up the counters and discovery."""
        import gunicorn

        check_gunicorn(tuple(getattr(gunicorn, "version_info", (0, 0))))
        try:
            check_environment(os.environ)
            self.settings = settings_from_env()
            check_settings(self.settings)
            self.namespace = shm.shm_namespace(os.environ)
        except KnobError as exc:
            raise CslbSettingsError(f"cslb: {exc}") from None
        self.pid = os.getpid()
        if not self.exit_registered:
            # gunicorn skips on_exit when it fails after on_starting (the port is taken,
            # the app does not import: sys.exit from the arbiter); the interpreter's exit
            # still runs this, so nothing is left in /dev/shm. A no-op after on_exit and
            # in forked workers (stop() acts only in the master that started).
            atexit.register(self._stop_at_exit, server)
            self.exit_registered = True
        os.environ.pop("CSLB_COUNTER_ROW", None)  # set per worker in post_fork
        threads = max(int(getattr(server.cfg, "threads", 1) or 1), 1)
        workers = max(int(server.cfg.workers), 1)
        self.rows = self.settings["counter_rows"] or min(2 * workers * threads + 4, 4096)
        try:
            how = self.attach_counters()
            if self.settings["discovery"] == "embedded":
                self.owns_namespace = True
                self._start_discovery(server)
        except BaseException:
            self.stop(server)
            raise
        assert self.store is not None
        self.log.info(
            Event(
                "master_started",
                shm_namespace=self.namespace,
                counter_rows=self.store.rows,
                counters=how,
                discovery=self.settings["discovery"],
                kernel=lbcore.kernel_name(),
            )
        )
        hook_arbiter_loop(server, self)

    def attach_counters(self) -> str:
        """Create, take over or attach the namespace's counters; returns which it was."""
        existed = shm.segment_name(self.namespace, "counters") in shm.list_segments(self.namespace)
        if self.settings["discovery"] == "embedded":
            self.store = _own_counters(self.namespace, self.rows)
            how = "taken over" if existed else "created"
        else:
            self.store, created = _external_counters(self.namespace, self.rows)
            how = "created" if created else "attached"
        self.store_epoch += 1
        return how

    def _start_discovery(self, server: Any) -> None:
        s = self.settings
        self.supervisor = DiscoverySupervisor(
            discovery_command(),
            backoff_s=s["restart_backoff_s"],
            backoff_max_s=s["restart_backoff_max_s"],
            stop_timeout_s=s["stop_timeout_s"],
        )
        try:
            self.supervisor.start()
        except OSError as exc:
            raise CslbStartupError(f"cslb: cannot start the discovery process: {exc}") from None

    def wait_for_table(self, server: Any) -> None:
        """Wait for the first published table, bounded by ``start_wait_s``."""
        deadline = time.monotonic() + self.settings["start_wait_s"]
        reader: shm.TableReader | None = None
        try:
            while True:
                sup = self.supervisor
                if sup is not None and not sup.poll(restart=False):
                    if sup.last_code == SETTINGS_EXIT:
                        raise CslbSettingsError(
                            "cslb: the discovery process refused its settings (exit status "
                            f"{SETTINGS_EXIT}; its start_failed line above names the variable)"
                        )
                    raise CslbStartupError(
                        f"cslb: the discovery process {sup.last_exit} before publishing a "
                        "table (its log lines above say why)"
                    )
                if reader is None:
                    with contextlib.suppress(shm.SegmentMissingError, shm.SegmentCorruptError):
                        reader = shm.TableReader(self.namespace)
                table = None
                if reader is not None and reader.generation() > 0:
                    try:
                        table = reader.table()
                    except shm.ShmError as exc:  # mid-publish or corrupt: look again
                        self.log.debug(Event("first_table_unreadable", error=str(exc)))
                if table is not None:
                    if self.owns_namespace and self.store is not None and table.n_slots:
                        self.store.ensure_columns(int(table.n_slots))
                    self.log.info(
                        Event(
                            "first_table",
                            generation=table.generation,
                            endpoints=len(table.endpoints),
                            publisher_pid=table.publisher_pid,
                        )
                    )
                    return
                if time.monotonic() >= deadline:
                    self.log.warning(
                        Event(
                            "first_table_late",
                            waited_s=self.settings["start_wait_s"],
                            action="starting workers anyway (they answer with the fallback "
                            "until a table is published)",
                        )
                    )
                    return
                time.sleep(0.02)
        finally:
            if reader is not None:
                reader.close()

    # -- loop ---------------------------------------------------------------------------

    def poll(self) -> None:
        """Collect discovery's exit status, if it exited (before the arbiter's waitpid)."""
        if self.active and self.supervisor is not None:
            self.supervisor.poll()

    def tick(self) -> None:
        """One step of the arbiter loop: restart discovery when due, reap dead rows."""
        if not self.active:
            return
        if self.supervisor is not None:
            self.supervisor.tick()
        now = time.monotonic()
        if now >= self.next_reap:
            self.next_reap = now + REAP_INTERVAL_S
            self.check_stall()
            if not self.check_counters():
                return
            assert self.store is not None
            try:
                rows = self.store.reap()
            except shm.ShmError as exc:
                self.log.warning(Event("reap_failed", error=str(exc)))
            else:
                if rows:
                    self.log.info(Event("rows_reclaimed", rows=rows, of="dead processes"))

    def check_counters(self) -> bool:
        """Attach the counters again if they were removed or replaced; True if usable.

        Counters shared with other servers (``CSLB_DISCOVERY=external``) or removed by
        hand are found again here, at most once a second and before each fork.
        """
        store = self.store
        try:
            if store is not None and not store.replaced():
                if store.repair():
                    self.log.warning(
                        Event(
                            "counters_repaired",
                            shm_namespace=self.namespace,
                            why="the counters data segment was shrunk, removed or "
                            "overwritten, or the control segment named an impossible data "
                            "epoch (written by another process)",
                            action="a new data segment replaces it; load history restarts",
                        )
                    )
                return True
            if store is not None:
                store.close(unlink=False)
                self.store = None
                self.log.warning(
                    Event(
                        "counters_replaced",
                        shm_namespace=self.namespace,
                        why="removed or replaced (or shrunk) by another process",
                        action="attaching again",
                    )
                )
            how = self.attach_counters()
        except Exception as exc:  # never into the arbiter (see run_guarded)
            self._warn_once(
                f"counters:{type(exc).__name__}:{exc}",
                Event(
                    "counters_unavailable",
                    shm_namespace=self.namespace,
                    error=str(exc),
                    action="workers fork without a row",
                    retry_every_s=REAP_INTERVAL_S,
                ),
            )
            return False
        self.warned = {w for w in self.warned if not w.startswith("counters:")}
        self.log.info(Event("counters_attached", shm_namespace=self.namespace, counters=how))
        return True

    def _warn_once(self, key: str, event: Event) -> None:
        if key not in self.warned:
            self.warned.add(key)
            self.log.warning(event)

    def check_stall(self) -> None:
        """SIGKILL a discovery process that runs but stopped writing its heartbeat."""
        sup, timeout = self.supervisor, self.settings.get("stall_timeout_s", 0.0)
        if sup is None or sup.pid is None or not timeout:
            return
        try:
            if self.reader is None:
                self.reader = shm.TableReader(self.namespace)
            if self.reader.writer_pid() != sup.pid:
                return  # not the writer yet: its heartbeat is not in the tables
            age_s = (time.monotonic_ns() - self.reader.heartbeat_ns()) / 1e9
        except shm.ShmError:
            return
        if age_s > timeout:
            self.log.error(
                Event(
                    "discovery_hung",
                    discovery_pid=sup.pid,
                    heartbeat_age_s=round(age_s, 3),
                    limit_s=timeout,
                    setting="CSLB_DISCOVERY_STALL_TIMEOUT",
                    action="SIGKILL",
                )
            )
            sup.signal(signal.SIGKILL)  # its death is seen and restarted like any other

    # -- workers ------------------------------------------------------------------------

    def before_fork(self) -> None:
        """Checks of the master's state that forked workers inherit (warned once each)."""
        tasks = _thread_count()
        if tasks > 1:
            self._warn_once(
                "threads",
                Event(
                    "master_threads",
                    threads=tasks,
                    why="the master runs threads while forking workers (a control socket "
                    "enabled, NumPy imported before OPENBLAS_NUM_THREADS could be set, a "
                    "thread started by a hook?)",
                    risk="a forked worker inherits only the forking thread and any lock "
                    "another thread held",
                ),
            )
        router_cls = getattr(sys.modules.get("workers.routing.router"), "Router", None)
        current = getattr(router_cls, "current", None)
        if current is not None and current() is not None:
            self._warn_once(
                "router",
                Event(
                    "router_in_master",
                    why="a workers.Router was attached in the master (a module-level "
                    "Router.attach() with --preload?)",
                    risk="every worker inherits it unusable and without its counter row",
                    fix="call Router.attach() in request code, not at import",
                ),
            )

    def reserve(self, worker: Any) -> None:
        """Reserve a counter row for ``worker`` before it forks (``worker.cslb_row``)."""
        worker.cslb_row = None
        if not self.active:
            return
        for attempt in range(2):
            if not self.check_counters():
                return
            assert self.store is not None
            try:
                worker.cslb_row = self.store.reserve()
                worker.cslb_epoch = self.store_epoch
                return
            except shm.NoFreeSlotError as exc:
                if attempt == 0:
                    with contextlib.suppress(shm.ShmError):
                        self.store.reap()
                    continue
                self.log.error(
                    Event(
                        "no_counter_row",
                        error=str(exc),
                        fix="set CSLB_COUNTER_ROWS higher than workers x threads",
                        action="the worker claims a row itself if one frees",
                    )
                )
            except shm.ShmError as exc:
                # Removed under us (say, by another server) between the check and here:
                # check_counters attaches again on the second attempt.
                self.log.warning(Event("reserve_failed", error=str(exc)))

    def release(self, server: Any, worker: Any) -> None:
        """Release the row of ``worker``, which exited."""
        if not self.active or self.store is None:
            return
        row = getattr(worker, "cslb_row", None)
        if getattr(worker, "cslb_epoch", None) != self.store_epoch:
            row = None  # reserved in counters we no longer use
        held = {
            getattr(w, "cslb_row", None)
            for w in getattr(server, "WORKERS", {}).values()
            if w is not worker and getattr(w, "cslb_epoch", None) == self.store_epoch
        }
        if row is not None and row in held:
            # The worker freed its row itself (Router.close at exit) and the master has
            # reserved it for a newer worker since: that reservation is not ours to free.
            row = None
        try:
            if row is not None:
                self.store.release(row, worker.pid)
            self.store.reap()  # the worker's other rows (gthread) and anyone else's
        except shm.ShmError as exc:
            self.log.warning(
                Event("release_failed", row=row, worker_pid=worker.pid, error=str(exc))
            )

    def in_child(self, worker: Any) -> None:
        """In the forked worker: hand over the row; forget the master's handles."""
        row = getattr(worker, "cslb_row", None)
        if row is None:
            os.environ.pop("CSLB_COUNTER_ROW", None)
        else:
            os.environ["CSLB_COUNTER_ROW"] = str(row)
        if self.supervisor is not None:
            self.supervisor.detach_in_child()
        self.supervisor = None
        self.store = None  # the master's; CounterStore.close never unlinks from a child
        self.reader = None

    # -- stop ---------------------------------------------------------------------------

    def _stop_at_exit(self, server: Any) -> None:
        if not self.active:
            return
        try:
            self.log.info(Event("exit_without_on_exit", action="stopping discovery"))
            self.stop(server)
        except Exception as exc:  # the interpreter is exiting: report, never raise
            with contextlib.suppress(Exception):
                self.log.error(Event("cleanup_failed", error=repr(exc)))

    def stop(self, server: Any) -> None:
        """Stop discovery and remove the namespace's segments if this server was the last."""
        if not self.active:
            return
        unlink = bool(self.settings.get("unlink_on_exit", True))
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        keep_counters = not unlink
        if self.store is not None:
            # Never remove counters another live process holds a row of (another server
            # sharing a sidecar's namespace): checked and removed under their lock, so a
            # server reserving meanwhile either shows up here or finds them gone.
            try:
                with shm.locks.segment_lock(self.store.name):
                    others = _holders(self.store) if unlink else []
                    if others:
                        keep_counters = True
                        self.log.info(
                            Event(
                                "counters_kept",
                                shm_namespace=self.namespace,
                                why="rows held by live processes",
                                pids=others,
                            )
                        )
                    self.store.close(unlink=not keep_counters)
            except shm.ShmError:  # removed already
                self.store.close(unlink=False)
            self.store = None
        if unlink and self.owns_namespace:
            # Discovery unlinks its tables on a clean stop; after a SIGKILL they stay.
            left = shm.list_segments(self.namespace)
            if keep_counters:
                counters = shm.segment_name(self.namespace, "counters")
                left = [n for n in left if not n.startswith(counters)]
            for name in left:
                shm.names.unlink_name(name)
            if left:
                self.log.info(Event("segments_removed", segments=left))
        self.owns_namespace = False
        self.pid = 0


#: cslb's state in this process (the gunicorn master).
MASTER = Master()


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _own_counters(namespace: str, rows: int) -> shm.CounterStore:
    """Create (or take over) the namespace's counters for this master."""
    try:
        store = shm.CounterStore.create(namespace, rows=rows)
    except shm.SegmentCorruptError as exc:
        # Another geometry or version: replace it unless a live process uses it.
        live = _live_holders(namespace)
        if live:
            raise CslbStartupError(
                f"cslb: the counters of shm namespace {namespace!r} are in use by live "
                f"processes {live} ({exc}); another server on this host? Give this one "
                "its own CSLB_SHM_NAMESPACE"
            ) from None
        store = shm.CounterStore.create(namespace, rows=rows, replace_invalid=True)
    live = _holders(store)
    if live:
        store.close(unlink=False)
        raise CslbStartupError(
            f"cslb: shm namespace {namespace!r} is in use: counter rows are held by live "
            f"processes {live}; another server on this host? Give this one its own "
            "CSLB_SHM_NAMESPACE (or use CSLB_DISCOVERY=external to share a sidecar's)"
        )
    return store


def _holders(store: shm.CounterStore) -> list[int]:
    """PIDs of live processes other than this one holding (claimed or reserved) a row."""
    me = os.getpid()
    pids = set()
    for s in store.slots():
        if s.pid == me or s.pid <= 0:
            continue
        if s.alive or (s.reserved and shm.owners.process_start_ticks(s.pid) is not None):
            pids.add(s.pid)
    return sorted(pids)


def _live_holders(namespace: str) -> list[int]:
    try:
        other = shm.CounterStore.attach(namespace, writable=False)
    except shm.ShmError:
        return []
    try:
        return _holders(other)
    finally:
        other.close(unlink=False)


def _external_counters(namespace: str, rows: int) -> tuple[shm.CounterStore, bool]:
    """Attach to a sidecar host's counters, or create them if none exist (True: created)."""
    try:
        return shm.CounterStore.attach(namespace, writable=True), False
    except shm.SegmentMissingError:
        return shm.CounterStore.create(namespace, rows=rows), True


def hook_arbiter_loop(server: Any, master: Master) -> None:
    """Run ``master.poll`` before the arbiter reaps and ``master.tick`` each loop.

    An exception in cslb's part is logged and swallowed: escaping into gunicorn's main
    loop it would stop the master without running ``on_exit``.
    """
    if getattr(server, "_cslb_loop_hooked", False):
        return
    mlog = getattr(master, "log", None) or log
    reap = getattr(server, "reap_workers", None)
    manage = getattr(server, "manage_workers", None)
    if not (callable(reap) and callable(manage)):
        mlog.warning(
            Event(
                "arbiter_not_hooked",
                why="this gunicorn's arbiter has no reap_workers/manage_workers",
                consequence="discovery is checked only when workers fork or exit",
            )
        )
        return

    def reap_workers() -> Any:
        run_guarded(mlog, "discovery_check_failed", "discovery check", master.poll)
        return reap()

    def manage_workers() -> Any:
        run_guarded(mlog, "supervision_failed", "discovery and counter rows", master.tick)
        return manage()

    server.reap_workers = reap_workers
    server.manage_workers = manage_workers
    server._cslb_loop_hooked = True
    master.loop_hooked = True

