"""gunicorn config module: ``gunicorn -c python:workers.gunicorn_conf yourapp:app``.

In the master (the arbiter), before any worker forks:

0. ``on_starting`` first gives the ``cslb`` logger cslb's handler
   (:func:`workers.master.logs.install`: cslb's line format, ``CSLB_LOG_FORMAT``, on stderr), so
   the master's, the workers' and discovery's cslb lines are one format. Under
   ``CSLB_LOG_FORMAT=json`` gunicorn's own lines (and the uvicorn worker's) are cslb's
   JSON lines too: this module sets ``logger_class`` to
   :class:`workers.master.gunicorn_logging.Logger` (your ``--log-config*`` or ``--logger-class``
   wins; text mode keeps gunicorn's lines).
1. ``on_starting`` creates the host's counters (``shm.CounterStore.create``, one row per
   worker thread plus room for a graceful reload) and starts the host's discovery
   process, ``python -m cslb discovery``, by fork+exec as a supervised child. The
   discovery settings (``CSLB_ENDPOINTS_FILE``, ``CSLB_SERVICE``, ``CSLB_DEBOUNCE``...)
   reach it through the inherited environment. No Kubernetes client and no thread is
   created in the master.
   A setting that does not parse (every part's: :mod:`workers.settings_check`) stops
   the master here with exit status 2, its message naming the variable and range.
2. ``when_ready`` waits (bounded, ``CSLB_DISCOVERY_START_WAIT``) for the first published
   table, so the first workers route from their first request; a discovery process that
   exits during that wait stops the server (exit status 1, or 2 when discovery refused
   its settings; discovery's own log lines say why).
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

import contextlib
import os
import shlex
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

from lbcore.knobs import KnobError
from lbcore.logformat import Event
from workers.master.duties import (
    MASTER,
    SETTINGS_EXIT,
    CslbSettingsError,
    run_guarded,
)
from workers.master.logs import install as install_logs
from workers.master.quickstop import quick_stop_uvicorn

__all__ = [
    "child_exit",
    "control_socket_disable",
    "logger_class",
    "nworkers_changed",
    "on_exit",
    "on_starting",
    "post_fork",
    "post_worker_init",
    "pre_fork",
    "when_ready",
    "worker_exit",
]


def control_socket_asked(argv: list[str], environ: MutableMapping[str, str]) -> bool:
    """True if ``--control-socket`` is given on gunicorn's command line or GUNICORN_CMD_ARGS."""
    try:
        extra = shlex.split(environ.get("GUNICORN_CMD_ARGS", ""))
    except ValueError:
        extra = []
    return any(a == "--control-socket" or a.startswith("--control-socket=") for a in argv + extra)


#: gunicorn setting: no control socket (a thread in the master, a socket path shared by
#: every server of the user) unless one is asked for with ``--control-socket PATH``.
control_socket_disable = not control_socket_asked(sys.argv[1:], os.environ)

#: gunicorn setting: gunicorn's logger, writing its lines in cslb's format under
#: ``CSLB_LOG_FORMAT=json`` (:mod:`workers.master.gunicorn_logging`). A ``--logger-class`` on the
#: command line replaces it.
logger_class = "workers.gunicorn_logging.Logger"


# --------------------------------------------------------------------------------------
# The hooks (gunicorn checks their arity: keep the signatures).


def _settings_exit(exc: CslbSettingsError) -> SystemExit:
    """Print ``exc`` as gunicorn prints start-up errors; the exit status is 2, not 1.

    gunicorn turns a RuntimeError from a hook into status 1; a bad setting exits 2,
    as ``cslb serve`` and ``cslb discovery`` do, so a process manager can tell the two.
    """
    print(f"\nError: {exc}\n", file=sys.stderr, flush=True)
    return SystemExit(SETTINGS_EXIT)


def on_starting(server: Any) -> None:
    """Master, before binding: cslb's log lines, every setting, the counters, discovery.

    Raises
    ------
    SystemExit
        Status 2: a setting is unusable (stderr names the variable and its range).
    """
    try:
        install_logs()
    except KnobError as exc:
        raise _settings_exit(CslbSettingsError(f"cslb: {exc}")) from None
    try:
        MASTER.start(server)
    except CslbSettingsError as exc:
        raise _settings_exit(exc) from None


def when_ready(server: Any) -> None:
    """Master, listening, before the first fork: wait for the first table (bounded)."""
    if not MASTER.active:
        return
    try:
        MASTER.wait_for_table(server)
    except CslbSettingsError as exc:
        MASTER.stop(server)  # on_exit does not run when when_ready raises
        raise _settings_exit(exc) from None
    except BaseException:
        MASTER.stop(server)
        raise


def pre_fork(server: Any, worker: Any) -> None:
    """Master, before each fork: check discovery and threads, reserve the worker's row."""
    m = MASTER
    run_guarded(m.log, "supervision_failed", "discovery and counter rows", m.tick)
    if m.active:
        run_guarded(m.log, "supervision_failed", "checks before fork", m.before_fork)
    run_guarded(m.log, "supervision_failed", "counter row reservation", lambda: m.reserve(worker))


def post_fork(server: Any, worker: Any) -> None:
    """Worker, right after fork: ``CSLB_COUNTER_ROW`` = the reserved row."""
    MASTER.in_child(worker)


def post_worker_init(worker: Any) -> None:
    """Worker, before it serves: under uvicorn's worker, SIGQUIT stops it promptly.

    See :mod:`workers.master.quickstop` (gunicorn's Ctrl-C otherwise waits the whole
    graceful timeout for each uvicorn worker).
    """
    quick_stop_uvicorn(worker)


def child_exit(server: Any, worker: Any) -> None:
    """Master, after a worker exited: free its counter row(s), check discovery."""
    m = MASTER
    run_guarded(
        m.log, "supervision_failed", "counter row release", lambda: m.release(server, worker)
    )
    run_guarded(m.log, "supervision_failed", "discovery and counter rows", m.tick)


def worker_exit(server: Any, worker: Any) -> None:
    """Worker, on its way out: give back the Router's rows if one was attached."""
    router_mod = sys.modules.get("workers.routing.router")
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
    "post_worker_init": (post_worker_init, 1, True),
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

