"""gunicorn config module: ``gunicorn -c python:workers.gunicorn_conf yourapp:app``.

In the master (the arbiter), before any worker forks:

0. ``on_starting`` first gives the ``cslb`` logger cslb's handler
   (:func:`workers.logs.install`: cslb's line format, ``CSLB_LOG_FORMAT``, on stderr), so
   the master's, the workers' and discovery's cslb lines are one format. Under
   ``CSLB_LOG_FORMAT=json`` gunicorn's own lines (and the uvicorn worker's) are cslb's
   JSON lines too: this module sets ``logger_class`` to
   :class:`workers.gunicorn_logging.Logger` (your ``--log-config*`` or ``--logger-class``
   wins; text mode keeps gunicorn's lines).
1. ``on_starting`` creates the host's counters (``shm.CounterStore.create``, one row per
   worker thread plus room for a graceful reload) and starts the host's discovery
   process, ``python -m cslb discovery``, by fork+exec as a supervised child. The
   discovery settings (``CSLB_ENDPOINTS_FILE``, ``CSLB_SERVICE``, ``CSLB_DEBOUNCE``...)
   reach it through the inherited environment. No Kubernetes client and no thread is
   created in the master.
2. ``when_ready`` waits (bounded, ``CSLB_DISCOVERY_START_WAIT``) for the first published
   table, so the first workers route from their first request; a discovery process that
   exits during that wait stops the server (exit status 1; discovery's own log lines
   say why).
3. ``pre_fork`` reserves a counter row for the worker about to fork (``worker.cslb_row``);
   ``post_fork`` (in the worker) hands it over as ``CSLB_COUNTER_ROW``, which
   :meth:`workers.Router.attach` adopts; ``child_exit`` releases it and reaps rows of
   any other dead process.
4. The arbiter's main loop polls discovery about once a second and on every SIGCHLD
   and restarts it with backoff; see "arbiter loop" below.
5. ``on_exit`` stops discovery (SIGTERM, SIGKILL after ``CSLB_DISCOVERY_STOP_TIMEOUT``)
   and unlinks the namespace's segments.

With ``CSLB_DISCOVERY=external`` the master starts no discovery process: a sidecar
publishes the tables. The master attaches to that host's counters, or creates them if
none exist. Counters are shared by every server on the namespace: a master removes them
on exit only when no other live process holds one of their rows (the last one out), and
a master whose counters were removed or replaced under it attaches again (or creates
them) and forks on; a worker forked meanwhile gets no row from the master and claims a
free one itself.

gunicorn's control socket (25.1+) runs a thread in the master from the first worker
fork on; this module sets ``control_socket_disable = True`` unless ``--control-socket``
is on the command line (or in ``GUNICORN_CMD_ARGS``). A config file that star-imports
this module may set ``control_socket_disable = False`` after the import.

Arbiter loop: gunicorn has no periodic hook, so ``on_starting`` wraps two methods of the
arbiter *instance* (``reap_workers``, ``manage_workers``): the first polls discovery
before the arbiter's ``waitpid(-1)`` so its exit status is not lost, the second restarts
it when its backoff delay passed and reaps counter rows of dead processes. If a future
gunicorn lacks these methods, supervision falls back to worker events (``pre_fork``,
``child_exit``) and a warning says so.

Your own hooks: add them in your config file and call :func:`compose` at its end::

    from workers.gunicorn_conf import *   # cslb's hooks
    from workers.gunicorn_conf import compose

    def post_fork(server, worker):        # yours: runs after cslb's
        ...

    compose(globals())                    # wraps every hook defined above with cslb's

Set-up hooks (``on_starting``, ``when_ready``, ``pre_fork``, ``post_fork``) run cslb's
part first; tear-down hooks (``child_exit``, ``worker_exit``, ``on_exit``) run yours first
and cslb's even if yours raises.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any

# NumPy's bundled OpenBLAS starts a thread pool when NumPy is imported; the master
# imports NumPy (through shm) and must have no thread when it forks. One BLAS thread
# per process is also what a prefork server wants. An explicit setting wins.
if "numpy" not in sys.modules:
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
    del _var

import lbcore
import shm
from lbcore.knobs import KnobError
from lbcore.logformat import Event
from workers.logs import install as install_logs
from workers.supervisor import (
    DiscoverySupervisor,
    check_settings,
    discovery_command,
    settings_from_env,
)

__all__ = [
    "child_exit",
    "control_socket_disable",
    "logger_class",
    "nworkers_changed",
    "on_exit",
    "on_starting",
    "post_fork",
    "pre_fork",
    "when_ready",
    "worker_exit",
]

#: How often the arbiter loop reaps counter rows of dead processes (seconds).
REAP_INTERVAL_S = 1.0
#: A failure of cslb's part of the arbiter's loop is logged at most this often (per part).
FAILURE_LOG_INTERVAL_S = 60.0
_failures: dict[str, list[float]] = {}  # what -> [next log at, failures not logged]


def _guarded(mlog: Any, event: str, what: str, fn: Callable[[], Any]) -> None:
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


#: The master's cslb lines (:mod:`workers.logs`: cslb's format under this module).
log = logging.getLogger("cslb.master")


def _control_socket_asked(argv: list[str], environ: MutableMapping[str, str]) -> bool:
    """True if ``--control-socket`` is given on gunicorn's command line or GUNICORN_CMD_ARGS."""
    try:
        extra = shlex.split(environ.get("GUNICORN_CMD_ARGS", ""))
    except ValueError:
        extra = []
    return any(a == "--control-socket" or a.startswith("--control-socket=") for a in argv + extra)


#: gunicorn setting: no control socket (a thread in the master, a socket path shared by
#: every server of the user) unless one is asked for with ``--control-socket PATH``.
control_socket_disable = not _control_socket_asked(sys.argv[1:], os.environ)

#: gunicorn setting: gunicorn's logger, writing its lines in cslb's format under
#: ``CSLB_LOG_FORMAT=json`` (:mod:`workers.gunicorn_logging`). A ``--logger-class`` on the
#: command line replaces it.
logger_class = "workers.gunicorn_logging.Logger"


class CslbStartupError(RuntimeError):
    """The master cannot start cslb's part (gunicorn prints it and exits with status 1)."""


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


class _Master:
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
        return self.pid == os.getpid()

    # -- start --------------------------------------------------------------------------

    def start(self, server: Any) -> None:
        import gunicorn

        check_gunicorn(tuple(getattr(gunicorn, "version_info", (0, 0))))
        try:
            self.settings = settings_from_env()
            check_settings(self.settings)
            self.namespace = shm.shm_namespace(os.environ)
        except KnobError as exc:
            raise CslbStartupError(f"cslb: {exc}") from None
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
            how = self._attach_counters()
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
        _hook_arbiter_loop(server, self)

    def _attach_counters(self) -> str:
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
        if self.active and self.supervisor is not None:
            self.supervisor.poll()

    def tick(self) -> None:
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
            how = self._attach_counters()
        except Exception as exc:  # never into the arbiter (see _guarded)
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
        router_cls = getattr(sys.modules.get("workers.router"), "Router", None)
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
                with shm.segment.segment_lock(self.store.name):
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
                shm.segment.unlink_name(name)
            if left:
                self.log.info(Event("segments_removed", segments=left))
        self.owns_namespace = False
        self.pid = 0


#: cslb's state in this process (the gunicorn master).
MASTER = _Master()


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
        if s.alive or (s.reserved and shm.segment.process_start_ticks(s.pid) is not None):
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


def _hook_arbiter_loop(server: Any, master: _Master) -> None:
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
        _guarded(mlog, "discovery_check_failed", "discovery check", master.poll)
        return reap()

    def manage_workers() -> Any:
        _guarded(mlog, "supervision_failed", "discovery and counter rows", master.tick)
        return manage()

    server.reap_workers = reap_workers
    server.manage_workers = manage_workers
    server._cslb_loop_hooked = True
    master.loop_hooked = True


# --------------------------------------------------------------------------------------
# The hooks (gunicorn checks their arity: keep the signatures).


def on_starting(server: Any) -> None:
    """Master, before binding: cslb's log lines, the counters, discovery."""
    try:
        install_logs()
    except KnobError as exc:
        raise CslbStartupError(f"cslb: {exc}") from None
    MASTER.start(server)


def when_ready(server: Any) -> None:
    """Master, listening, before the first fork: wait for the first table (bounded)."""
    if not MASTER.active:
        return
    try:
        MASTER.wait_for_table(server)
    except BaseException:
        MASTER.stop(server)  # on_exit does not run when when_ready raises
        raise


def pre_fork(server: Any, worker: Any) -> None:
    """Master, before each fork: check discovery and threads, reserve the worker's row."""
    m = MASTER
    _guarded(m.log, "supervision_failed", "discovery and counter rows", m.tick)
    if m.active:
        _guarded(m.log, "supervision_failed", "checks before fork", m.before_fork)
    _guarded(m.log, "supervision_failed", "counter row reservation", lambda: m.reserve(worker))


def post_fork(server: Any, worker: Any) -> None:
    """Worker, right after fork: ``CSLB_COUNTER_ROW`` = the reserved row."""
    MASTER.in_child(worker)


def child_exit(server: Any, worker: Any) -> None:
    """Master, after a worker exited: free its counter row(s), check discovery."""
    m = MASTER
    _guarded(m.log, "supervision_failed", "counter row release", lambda: m.release(server, worker))
    _guarded(m.log, "supervision_failed", "discovery and counter rows", m.tick)


def worker_exit(server: Any, worker: Any) -> None:
    """Worker, on its way out: give back the Router's rows if one was attached."""
    router_mod = sys.modules.get("workers.router")
    router_cls = getattr(router_mod, "Router", None)
    current = getattr(router_cls, "current", None)
    if current is None:
        return
    router = current()
    if router is not None:
        with contextlib.suppress(Exception):
            router.close()


def nworkers_changed(server: Any, new_value: int, old_value: int | None) -> None:
    """Master: warn when more workers than counter rows are asked for (TTIN)."""
    if old_value is None or not MASTER.active:
        return
    threads = max(int(getattr(server.cfg, "threads", 1) or 1), 1)
    if new_value * threads > MASTER.rows:
        MASTER.log.warning(
            Event(
                "counter_rows_exceeded",
                workers=new_value,
                threads=threads,
                counter_rows=MASTER.rows,
                consequence="extra workers record no load",
                fix="raise CSLB_COUNTER_ROWS and restart",
            )
        )


def on_exit(server: Any) -> None:
    """Master, last: stop discovery, unlink the namespace's segments."""
    MASTER.stop(server)


# --------------------------------------------------------------------------------------
# Composing with your own hooks.

#: cslb's hooks: name -> (function, arity, True if cslb's part runs first (set-up) or
#: False if yours runs first (tear-down)).
HOOKS: dict[str, tuple[Callable[..., Any], int, bool]] = {
    "on_starting": (on_starting, 1, True),
    "when_ready": (when_ready, 1, True),
    "pre_fork": (pre_fork, 2, True),
    "post_fork": (post_fork, 2, True),
    "child_exit": (child_exit, 2, False),
    "worker_exit": (worker_exit, 2, False),
    "nworkers_changed": (nworkers_changed, 3, True),
    "on_exit": (on_exit, 1, False),
}


def _chain(
    name: str, ours: Callable[..., Any], theirs: Callable[..., Any], arity: int, first: bool
) -> Callable[..., Any]:
    def run(*args: Any) -> None:
        if first:
            ours(*args)
            theirs(*args)
        else:
            try:
                theirs(*args)
            finally:
                ours(*args)

    # gunicorn validates a hook's arity, so each composed hook keeps the exact signature.
    hook: Callable[..., Any]
    if arity == 1:

        def hook(server: Any) -> None:
            run(server)

    elif arity == 2:

        def hook(server: Any, worker: Any) -> None:
            run(server, worker)

    else:

        def hook(server: Any, new_value: Any, old_value: Any) -> None:
            run(server, new_value, old_value)

    hook.__name__ = hook.__qualname__ = name
    hook.__doc__ = f"cslb's {name} composed with {getattr(theirs, '__qualname__', theirs)!r}."
    hook._cslb_composed = True  # type: ignore[attr-defined]
    return hook


def compose(
    namespace: MutableMapping[str, Any] | None = None, /, **hooks: Callable[..., Any]
) -> dict[str, Callable[..., Any]]:
    """Compose cslb's gunicorn hooks with yours.

    Parameters
    ----------
    namespace
        Your config module's ``globals()``: every gunicorn hook defined there is
        replaced by its composition with cslb's, and cslb's other hooks are added.
    **hooks
        Hooks given by name instead (``post_fork=my_post_fork``).

    Returns
    -------
    dict
        Hook name -> the function gunicorn should call (also written into
        ``namespace``).

    Raises
    ------
    TypeError
        A hook given by keyword is not a gunicorn hook cslb uses, or not callable.
    """
    given: dict[str, Callable[..., Any]] = {}
    if namespace is not None:
        given.update({k: namespace[k] for k in HOOKS if k in namespace})
    for name, fn in hooks.items():
        if name not in HOOKS:
            raise TypeError(f"compose() got {name!r}: cslb composes only {sorted(HOOKS)}")
        given[name] = fn
    out: dict[str, Callable[..., Any]] = {}
    for name, (ours, arity, first) in HOOKS.items():
        theirs = given.get(name)
        if theirs is None or theirs is ours or getattr(theirs, "_cslb_composed", False):
            out[name] = theirs or ours
            continue
        if not callable(theirs):
            raise TypeError(f"{name} must be callable, got {type(theirs).__name__}")
        out[name] = _chain(name, ours, theirs, arity, first)
    if namespace is not None:
        namespace.update(out)
    return out
