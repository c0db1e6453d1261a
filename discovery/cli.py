"""``cslb discovery``: run the host's discovery process.

Watches a Service's EndpointSlices (and optionally a ConfigMap of knobs) and/or static
endpoints, and publishes ring sets into shared memory for the host's workers. Runs in
the foreground until SIGTERM or SIGINT, then stops its informers and, by default,
removes the tables segments it owns.

With no endpoint source at all (no ``--service``, ``--endpoints-file`` or ``--endpoint``,
nor their variables) it runs on the static example file, the embedded default that
needs no cluster: ``examples/endpoints.json`` in the current directory if there is one,
else the one of the source tree this package was installed from (a checkout or an
editable install). It says so in an ``endpoints_file_default`` log line naming the
file. Inside a cluster (``KUBERNETES_SERVICE_HOST`` set) there is no default: routing
real traffic to example addresses would be wrong, so a missing source is an error.

Exit status: 0 after a clean stop, 2 for bad arguments or configuration, 1 when it
cannot publish (another discovery process owns the namespace, /dev/shm unusable) or
crashed (the tables then stay for the next process to take over).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from discovery.events import EventLog
from discovery.settings import DISCOVERY_KNOBS, LAYERED_KNOBS, OUTLIER_KNOBS, KnobState
from discovery.static import EndpointsFileError, EndpointSpec, parse_endpoints
from lbcore.knobs import ROUTING_KNOBS, KnobError, add_arguments, from_args

__all__ = [
    "EXAMPLE_ENDPOINTS",
    "NoEndpointSourceError",
    "build_parser",
    "default_endpoints_file",
    "main",
]

#: The static example file, relative to the current directory or the source tree.
EXAMPLE_ENDPOINTS = Path("examples") / "endpoints.json"

# The source tree this package was installed from (checkout or editable install).
_SOURCE_TREE = Path(__file__).resolve().parent.parent


class NoEndpointSourceError(Exception):
    """No endpoint source was given and the example file cannot stand in."""


def default_endpoints_file(
    cwd: str | os.PathLike[str], environ: Mapping[str, str], source_tree: Path = _SOURCE_TREE
) -> Path:
    """The endpoints file to run on when no source was given (see the module docs).

    Raises
    ------
    NoEndpointSourceError
        Inside a cluster, or when neither place has the example file; the message
        says what was tried and what to give instead.
    """
    give = "give --service SVC (Kubernetes), --endpoints-file FILE or --endpoint URL"
    if environ.get("KUBERNETES_SERVICE_HOST"):
        raise NoEndpointSourceError(
            f"no endpoint source: {give} (inside a cluster the example endpoints are not "
            "used as a default)"
        )
    tried = []
    for base in (Path(cwd), source_tree):
        path = (base / EXAMPLE_ENDPOINTS).resolve()
        if path in tried:
            continue
        if path.is_file():
            return path
        tried.append(path)
    raise NoEndpointSourceError(
        f"no endpoint source: {give} (no example file to default to: tried "
        + ", ".join(str(p) for p in tried)
        + ")"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``cslb discovery``."""
    p = argparse.ArgumentParser(
        prog="cslb discovery",
        description=(
            "Run the host's discovery process: watch a Service's EndpointSlices (list+watch "
            "with bookmarks, relist on 410, jittered backoff) and/or static endpoints, fold "
            "bursts with a debounce, fade new pods in ring by ring, and publish the ring "
            "set with the routing knobs into shared memory. Every option also reads its "
            "CSLB_* environment variable; flags win."
        ),
    )
    src = p.add_argument_group("endpoint sources and process settings")
    add_arguments(src, DISCOVERY_KNOBS)
    src.add_argument(
        "--endpoint",
        "-e",
        action="append",
        default=[],
        metavar="URL",
        help="a static endpoint address, verbatim as Skipper hashes it (scheme://ip:port); "
        "repeatable",
    )
    knobs = p.add_argument_group(
        "routing knobs (published with the tables; a --configmap overrides them at runtime)"
    )
    add_arguments(knobs, ROUTING_KNOBS)
    outlier = p.add_argument_group(
        "outlier detection (decided here for the whole host; a --configmap overrides it at runtime)"
    )
    add_arguments(outlier, OUTLIER_KNOBS)
    return p


def _fail(msg: str, code: int = 2) -> int:
    print(f"cslb discovery: {msg}", file=sys.stderr)
    return code


def main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    """Run ``cslb discovery``; returns the exit status."""
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    try:
        settings = from_args(args, env, DISCOVERY_KNOBS)
        routing = from_args(args, env, LAYERED_KNOBS)
        static: list[EndpointSpec] = parse_endpoints(list(args.endpoint), "--endpoint")
    except (KnobError, EndpointsFileError) as exc:
        return _fail(str(exc))
    default = None
    if not (settings["service"] or settings["endpoints_file"] or static):
        try:
            default = default_endpoints_file(os.getcwd(), env)
        except NoEndpointSourceError as exc:
            return _fail(str(exc))
        settings["endpoints_file"] = str(default)
    log = EventLog(sys.stderr, level=settings["log_level"])
    if default is not None:
        log.warning(
            "endpoints_file_default",
            path=str(default),
            why="no --service, --endpoints-file or --endpoint given (and not in a cluster)",
            note="static example endpoints, for running without a cluster",
        )
    return _run(settings, routing, static, log)


def _run(
    settings: dict[str, Any],
    routing: dict[str, Any],
    static: list[EndpointSpec],
    log: EventLog,
) -> int:
    import shm
    from discovery.publisher import Publisher
    from discovery.service import Discovery

    api = None
    namespace = settings["namespace"]
    if settings["service"] or settings["configmap"]:
        from discovery.kube import KubeConfigError, WatchTiming, load_client

        try:
            api, default_ns = load_client(settings["kubeconfig"])
        except KubeConfigError as exc:
            return _fail(str(exc))
        namespace = namespace or default_ns
        timing = WatchTiming(
            connect_timeout_s=settings["connect_timeout_s"],
            request_timeout_s=settings["request_timeout_s"],
            watch_timeout_s=settings["watch_timeout_s"],
            backoff_s=settings["backoff_s"],
            backoff_max_s=settings["backoff_max_s"],
        )
    try:
        publisher = Publisher(settings["shm_namespace"])
    except (shm.ShmError, OSError) as exc:
        return _fail(f"cannot publish into shared memory: {exc}", 1)
    disc = Discovery(
        publisher,
        KnobState(routing),
        log,
        debounce_s=settings["debounce_s"],
        debounce_max_s=settings["debounce_max_s"],
        heartbeat_s=settings["heartbeat_s"],
        file_poll_s=settings["file_poll_s"],
        configmap_wait_s=settings["configmap_wait_s"],
        removals_at_once=settings["removals_at_once"],
    )
    if static:
        disc.add_list(static)
    if settings["endpoints_file"]:
        disc.add_file(settings["endpoints_file"])
    if api is not None:
        from discovery.kube import ConfigMapInformer, EndpointSliceInformer

        if settings["service"]:
            disc.add_informer(
                "kubernetes",
                EndpointSliceInformer(
                    api,
                    namespace,
                    settings["service"],
                    lambda eps, why: disc.post_endpoints("kubernetes", eps, why),
                    log=log,
                    timing=timing,
                    port_name=settings["port_name"],
                    scheme=settings["scheme"],
                ),
            )
        if settings["configmap"]:
            disc.add_configmap_informer(
                settings["configmap"],
                ConfigMapInformer(
                    api,
                    namespace,
                    settings["configmap"],
                    disc.post_configmap,
                    log=log,
                    timing=timing,
                ),
            )

    def on_signal(signum: int, _frame: Any) -> None:
        disc.stop_from_signal()  # no locks in a signal handler
        stopping.append(signal.Signals(signum).name)

    stopping: list[str] = []

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    clean = False
    try:
        disc.run()
        clean = True
        log.info("stopping", signal=stopping[0] if stopping else None)
    except Exception as exc:
        log.error(
            "crashed",
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
            action="tables left in place for the next discovery process",
        )
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        unlink = clean and bool(settings["unlink_on_exit"])
        publisher.close(unlink=unlink)
        if api is not None:
            api.close()
        log.info("stopped", generation=publisher.generation, unlinked=unlink, clean=clean)
    return 0 if clean else 1
