"""``cslb serve``: the bundled routing service under gunicorn, discovery embedded.

Runs exactly the documented command, so nothing about it is special::

    gunicorn -c python:workers.gunicorn_conf --bind ADDR --workers N [--threads T] workers.app:app

``cslb serve`` turns its flags into that command line plus ``CSLB_*`` environment
variables (the endpoint source and routing knobs, which the discovery process the master
starts reads), then replaces itself with gunicorn (``exec``: same PID, so a process
manager's SIGTERM reaches the gunicorn master directly). Arguments after ``--`` go to
gunicorn unchanged.

With no endpoint source (no ``--endpoints-file``/``--service`` nor their variables) the
discovery process applies its own default, the example file ``examples/endpoints.json``
(see ``cslb discovery --help``): the rule lives in one place, in discovery, which this
module (in ``workers``) may not import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence

from lbcore.knobs import LOG_KNOBS, ROUTING_KNOBS, Knob, KnobError
from shm.settings import SHM_NAMESPACE
from workers.fanout.settings import FANOUT_KNOBS
from workers.routing.router import ROUTER_KNOBS
from workers.settings_check import check_environment
from workers.surfaces.app import APP_KNOBS
from workers.surfaces.mount import APP as MOUNT_APP

__all__ = [
    "DEFAULT_APP",
    "DEFAULT_BIND",
    "DEFAULT_WORKERS",
    "MOUNTED_APP",
    "ServeError",
    "plan",
    "run",
]

#: The bundled WSGI app.
DEFAULT_APP = "workers.app:app"
#: What gunicorn runs for ``--app MODULE:APP``: that app with cslb's paths mounted.
MOUNTED_APP = "workers.mount:app"
#: Loopback only by default: exposing the service is a deliberate choice.
DEFAULT_BIND = "127.0.0.1:8000"
DEFAULT_WORKERS = 2

#: The knobs ``plan(knobs=...)`` takes by name: routing knobs (published by discovery),
#: the log settings (read by the master, its workers and discovery), the routing
#: service's HTTP settings (read by the workers' app) and each worker's router and
#: fan-out settings.
KNOBS_BY_NAME = {k.name: k for k in (*ROUTING_KNOBS, *LOG_KNOBS, *APP_KNOBS)}
#: Every knob ``plan(knobs=...)`` takes, by environment variable (names can repeat
#: across rooms: the fan-out's ``threads`` is not the server's).
KNOBS_BY_ENV = {
    k.env: k for k in (*ROUTING_KNOBS, *LOG_KNOBS, *APP_KNOBS, *ROUTER_KNOBS, *FANOUT_KNOBS)
}


def _knob(key: str) -> Knob:
    k = KNOBS_BY_ENV.get(key) or KNOBS_BY_NAME.get(key)
    if k is None:
        raise ServeError(f"no cslb serve setting {key!r}")
    return k


class ServeError(ValueError):
    """A ``cslb serve`` setting that cannot be used; the message names it."""


def plan(
    *,
    environ: MutableMapping[str, str],
    bind: str = DEFAULT_BIND,
    workers: int = DEFAULT_WORKERS,
    threads: int = 1,
    app: str = DEFAULT_APP,
    endpoints_file: str | None = None,
    service: str | None = None,
    namespace: str | None = None,
    shm_namespace: str | None = None,
    discovery: str | None = None,
    control_socket: str | None = None,
    knobs: Mapping[str, str | None] | None = None,
    extra: Sequence[str] = (),
    python: str | None = None,
) -> list[str]:
    """The gunicorn command line for these settings; puts the ``CSLB_*`` ones into ``environ``.

    ``knobs``: raw values of knobs by knob name (routing, log and HTTP settings) or by
    environment variable (any of :data:`KNOBS_BY_ENV`), ``None``: not given. ``extra``:
    gunicorn's own arguments. ``cslb serve`` (:mod:`cslb.serve_cmd`) parses the command
    line and calls this.

    Raises
    ------
    ServeError
        A value is invalid (a knob, the namespace, the app spec, a missing file).
    """
    given = {_knob(key): raw for key, raw in (knobs or {}).items() if raw is not None}
    try:
        # The master's own check (every part's settings, and the rules between them),
        # so cslb serve stops on what the master would stop on, before exec.
        check_environment(environ)
        for k, raw in given.items():
            k.convert(raw, f"flag {k.flag}")
        if shm_namespace is not None:
            SHM_NAMESPACE.convert(shm_namespace, f"flag {SHM_NAMESPACE.flag}")
        if app != DEFAULT_APP:
            environ[MOUNT_APP.env] = MOUNT_APP.convert(app, "flag --app")
            app = MOUNTED_APP
    except KnobError as exc:
        raise ServeError(str(exc)) from None
    if endpoints_file:
        path = os.path.abspath(endpoints_file)
        if not os.path.isfile(path):
            raise ServeError(f"--endpoints-file {endpoints_file}: no such file ({path})")
        environ["CSLB_ENDPOINTS_FILE"] = path
        environ.pop("CSLB_SERVICE", None)
    if service:
        environ["CSLB_SERVICE"] = service
        environ.pop("CSLB_ENDPOINTS_FILE", None)
    if namespace:
        environ["CSLB_NAMESPACE"] = namespace
    if shm_namespace is not None:
        environ[SHM_NAMESPACE.env] = shm_namespace
    if discovery:
        environ["CSLB_DISCOVERY"] = discovery
    for k, raw in given.items():
        environ[k.env] = raw
    out = [
        python or sys.executable,
        "-m",
        "gunicorn",
        "--config",
        "python:workers.gunicorn_conf",
        "--bind",
        bind,
        "--workers",
        str(workers),
    ]
    if threads > 1:
        out += ["--worker-class", "gthread", "--threads", str(threads)]
    if control_socket:
        out += ["--control-socket", control_socket]
    else:
        out += ["--no-control-socket"]
    return [*out, *extra, app]


def _cslb_environ(environ: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(environ.items()) if k.startswith("CSLB_")]


def run(cmd: list[str], environ: Mapping[str, str], *, print_command: bool = False) -> int:
    """Exec gunicorn as ``cmd`` in ``environ`` (returns only with ``print_command``)."""
    if print_command:
        for line in _cslb_environ(environ):
            print(line)
        print(" ".join(cmd))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, dict(environ))
    return 1  # pragma: no cover - execve does not return
