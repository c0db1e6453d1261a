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

import argparse
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence

from lbcore.knobs import ROUTING_KNOBS, KnobError, add_arguments, from_args
from shm.settings import SHM_NAMESPACE
from workers.mount import APP as MOUNT_APP
from workers.supervisor import DISCOVERY_MODES

__all__ = ["DEFAULT_APP", "DEFAULT_BIND", "DEFAULT_WORKERS", "build_parser", "command", "main"]

#: The bundled WSGI app.
DEFAULT_APP = "workers.app:app"
#: What gunicorn runs for ``--app MODULE:APP``: that app with cslb's paths mounted.
MOUNTED_APP = "workers.mount:app"
#: Loopback only by default: exposing the service is a deliberate choice.
DEFAULT_BIND = "127.0.0.1:8000"
DEFAULT_WORKERS = 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``cslb serve``."""
    p = argparse.ArgumentParser(
        prog="cslb serve",
        usage="cslb serve [--endpoints-file F | --namespace NS --service SVC] [--bind ADDR] "
        "[--workers N] [--threads T] [options] [-- GUNICORN_ARGS...]",
        description="Run the routing service (POST /route, GET /metrics, /healthz, /status) "
        "under gunicorn with the host's discovery process embedded in the master. Other "
        "discovery settings (CSLB_DEBOUNCE, CSLB_CONFIGMAP...) are read from the "
        "environment by the discovery process; see 'cslb discovery --help'.",
    )
    src = p.add_argument_group(
        "endpoint source (default: the example file examples/endpoints.json)"
    )
    one = src.add_mutually_exclusive_group()
    one.add_argument(
        "--endpoints-file",
        metavar="FILE",
        help="JSON or YAML file of endpoints, re-read when it changes [env CSLB_ENDPOINTS_FILE]",
    )
    one.add_argument(
        "--service",
        metavar="SVC",
        help="Kubernetes Service whose EndpointSlices are watched [env CSLB_SERVICE]",
    )
    src.add_argument(
        "--namespace",
        metavar="NS",
        help="Kubernetes namespace of --service [env CSLB_NAMESPACE]",
    )
    srv = p.add_argument_group("server")
    srv.add_argument(
        "--bind",
        "-b",
        default=DEFAULT_BIND,
        metavar="ADDR",
        help=f"address to listen on (HOST:PORT or unix:PATH; default {DEFAULT_BIND})",
    )
    srv.add_argument(
        "--workers",
        "-w",
        type=_positive_int,
        default=DEFAULT_WORKERS,
        metavar="N",
        help=f"worker processes (default {DEFAULT_WORKERS})",
    )
    srv.add_argument(
        "--threads",
        type=_positive_int,
        default=1,
        metavar="T",
        help="threads per worker; more than 1 runs gunicorn's gthread worker (default 1)",
    )
    srv.add_argument(
        "--app",
        default=DEFAULT_APP,
        metavar="MODULE:APP",
        help=f"your WSGI or ASGI app to serve instead of the routing service ({DEFAULT_APP}); "
        "cslb's /metrics, /healthz, /readyz and /status are mounted into it "
        "(workers.mount); for an ASGI app add '-- -k uvicorn_worker.UvicornWorker'",
    )
    srv.add_argument(
        SHM_NAMESPACE.flag,
        dest="shm_namespace",
        metavar=SHM_NAMESPACE.metavar,
        help=f"{SHM_NAMESPACE.doc} [env {SHM_NAMESPACE.env}, default {SHM_NAMESPACE.default}]",
    )
    srv.add_argument(
        "--discovery",
        choices=DISCOVERY_MODES,
        help="'embedded' (default): the master runs discovery; 'external': a sidecar does "
        "[env CSLB_DISCOVERY]",
    )
    srv.add_argument(
        "--control-socket",
        metavar="PATH",
        help="gunicorn's control socket (gunicornc); default: disabled, so two servers on "
        "a host never share $HOME/.gunicorn/gunicorn.ctl and the master stays single-threaded",
    )
    srv.add_argument(
        "--print-command",
        action="store_true",
        help="print the environment and gunicorn command instead of running it",
    )
    knobs = p.add_argument_group("routing knobs (published with the tables)")
    add_arguments(knobs, ROUTING_KNOBS)
    return p


def command(
    argv: Sequence[str], environ: MutableMapping[str, str], *, python: str | None = None
) -> list[str]:
    """Parse ``cslb serve`` arguments; update ``environ``; return the gunicorn argv.

    Raises
    ------
    SystemExit
        Bad arguments (argparse prints the usage and the problem; status 2).
    """
    return _plan(argv, environ, python)[0]


def _plan(
    argv: Sequence[str], environ: MutableMapping[str, str], python: str | None
) -> tuple[list[str], argparse.Namespace]:
    args_list = list(argv)
    extra: list[str] = []
    if "--" in args_list:
        cut = args_list.index("--")
        args_list, extra = args_list[:cut], args_list[cut + 1 :]
    p = build_parser()
    args = p.parse_args(args_list)
    if args.namespace and args.endpoints_file:
        p.error(
            "--namespace names the Kubernetes namespace of --service; it means nothing with "
            "--endpoints-file"
        )
    if args.namespace and not (args.service or environ.get("CSLB_SERVICE")):
        p.error("--namespace names the Kubernetes namespace of --service: give --service too")
    try:
        from_args(args, environ, ROUTING_KNOBS)  # validate flags and variables alike
        if args.shm_namespace is not None:
            SHM_NAMESPACE.convert(args.shm_namespace, f"flag {SHM_NAMESPACE.flag}")
    except KnobError as exc:
        p.error(str(exc))
    if args.endpoints_file:
        path = os.path.abspath(args.endpoints_file)
        if not os.path.isfile(path):
            p.error(f"--endpoints-file {args.endpoints_file}: no such file ({path})")
        environ["CSLB_ENDPOINTS_FILE"] = path
        environ.pop("CSLB_SERVICE", None)
    if args.service:
        environ["CSLB_SERVICE"] = args.service
        environ.pop("CSLB_ENDPOINTS_FILE", None)
    if args.namespace:
        environ["CSLB_NAMESPACE"] = args.namespace
    if args.shm_namespace is not None:
        environ[SHM_NAMESPACE.env] = args.shm_namespace
    if args.discovery:
        environ["CSLB_DISCOVERY"] = args.discovery
    app = args.app
    if app != DEFAULT_APP:
        try:
            environ[MOUNT_APP.env] = MOUNT_APP.convert(app, "flag --app")
        except KnobError as exc:
            p.error(str(exc))
        app = MOUNTED_APP
    for k in ROUTING_KNOBS:
        raw = getattr(args, k.name, None)
        if raw is not None:
            environ[k.env] = raw
    out = [
        python or sys.executable,
        "-m",
        "gunicorn",
        "--config",
        "python:workers.gunicorn_conf",
        "--bind",
        args.bind,
        "--workers",
        str(args.workers),
    ]
    if args.threads > 1:
        out += ["--worker-class", "gthread", "--threads", str(args.threads)]
    if args.control_socket:
        out += ["--control-socket", args.control_socket]
    else:
        out += ["--no-control-socket"]
    return [*out, *extra, app], args


def _cslb_environ(environ: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(environ.items()) if k.startswith("CSLB_")]


def main(argv: list[str], environ: MutableMapping[str, str] | None = None) -> int:
    """Run ``cslb serve``: exec gunicorn (returns only with ``--print-command``)."""
    env = dict(os.environ if environ is None else environ)
    try:
        cmd, args = _plan(argv, env, None)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.print_command:
        for line in _cslb_environ(env):
            print(line)
        print(" ".join(cmd))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, env)
    return 1  # pragma: no cover - execve does not return
