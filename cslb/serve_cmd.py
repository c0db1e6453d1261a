"""``cslb serve``: the command line of :func:`workers.master.serve.plan` and ``run``.

Arguments after ``--`` go to gunicorn unchanged.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import MutableMapping, Sequence

from cslb.argtypes import integer
from cslb.kernel_flag import add_kernel_argument, apply_kernel_flag
from discovery.settings import DISCOVERY_KNOBS, OUTLIER_KNOBS, ZONE_CONTROL_KNOBS
from lbcore.knobs import (
    LOG_KNOBS,
    ROUTING_KNOBS,
    Knob,
    KnobError,
    add_arguments,
    from_mapping,
)
from shm.settings import SHM_NAMESPACE
from workers.fanout.settings import FANOUT_KNOBS
from workers.master.serve import DEFAULT_APP, DEFAULT_BIND, DEFAULT_WORKERS, ServeError, plan, run
from workers.master.supervisor import DISCOVERY_MODES, SUPERVISOR_KNOBS
from workers.routing.router import ROUTER_KNOBS
from workers.surfaces.app import APP_KNOBS

__all__ = ["CHILD_KNOBS", "build_parser", "command", "main"]

# Knobs cslb serve takes as flags and hands to the processes through the environment.
_WORKER_KNOBS = (*ROUTER_KNOBS, *FANOUT_KNOBS)
_PASSED_KNOBS = (*ROUTING_KNOBS, *LOG_KNOBS, *APP_KNOBS, *_WORKER_KNOBS)


def _dest(k: Knob) -> str:
    return f"worker_{k.name}" if k in _WORKER_KNOBS else k.name


#: Settings the discovery child and the master read from the environment (checked here
#: before gunicorn starts).
CHILD_KNOBS = (*DISCOVERY_KNOBS, *OUTLIER_KNOBS, *ZONE_CONTROL_KNOBS, *SUPERVISOR_KNOBS)


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
        help="JSON or YAML file of endpoints, re-read when it changes (format: "
        "docs/endpoints-file.md) [env CSLB_ENDPOINTS_FILE]",
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
        type=integer(1),
        default=DEFAULT_WORKERS,
        metavar="N",
        help=f"worker processes (default {DEFAULT_WORKERS})",
    )
    srv.add_argument(
        "--threads",
        type=integer(1),
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
        "(workers.surfaces.mount); for an ASGI app add '-- -k uvicorn_worker.UvicornWorker'",
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
    add_kernel_argument(srv)
    app = p.add_argument_group("the routing service's HTTP settings (docs/http.md)")
    add_arguments(app, APP_KNOBS)
    worker = p.add_argument_group("each worker's router and fan-out (environment of your app)")
    for k in _WORKER_KNOBS:  # (own dests: the fan-out's 'threads' is not --threads)
        worker.add_argument(
            k.flag,
            dest=_dest(k),
            default=None,
            metavar=k.metavar,
            help=f"{k.doc} [env {k.env}, default {k.shown_default}]".replace("%", "%%"),
        )
    logs = p.add_argument_group("logs (the master's, the workers' and discovery's cslb lines)")
    add_arguments(logs, LOG_KNOBS)
    knobs = p.add_argument_group("routing knobs (published with the tables)")
    add_arguments(knobs, ROUTING_KNOBS)
    return p


def _parse(
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
    apply_kernel_flag(args, environ, p, switch=False)
    try:
        # The embedded discovery child reads its settings from this environment: a bad
        # one must stop the server here, not crash the child into restarts forever.
        from_mapping(environ, CHILD_KNOBS, source="environment")
    except KnobError as exc:
        p.error(str(exc))
    try:
        cmd = plan(
            environ=environ,
            bind=args.bind,
            workers=args.workers,
            threads=args.threads,
            app=args.app,
            endpoints_file=args.endpoints_file,
            service=args.service,
            namespace=args.namespace,
            shm_namespace=args.shm_namespace,
            discovery=args.discovery,
            control_socket=args.control_socket,
            knobs={k.env: getattr(args, _dest(k), None) for k in _PASSED_KNOBS},
            extra=extra,
            python=python,
        )
    except ServeError as exc:
        p.error(str(exc))
    return cmd, args


def command(
    argv: Sequence[str], environ: MutableMapping[str, str], *, python: str | None = None
) -> list[str]:
    """Parse ``cslb serve`` arguments; update ``environ``; return the gunicorn argv.

    Raises
    ------
    SystemExit
        Bad arguments (argparse prints the usage and the problem; status 2).
    """
    return _parse(argv, environ, python)[0]


def main(argv: list[str], environ: MutableMapping[str, str] | None = None) -> int:
    """Run ``cslb serve``: exec gunicorn (returns only with ``--print-command``)."""
    env = dict(os.environ if environ is None else environ)
    try:
        cmd, args = _parse(argv, env, None)
    except SystemExit as exc:
        return int(exc.code or 0)
    return run(cmd, env, print_command=args.print_command)
