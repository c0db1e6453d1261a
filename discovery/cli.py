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

import os
import signal
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from discovery.events import EventLog
from discovery.settings import KnobState
from discovery.static import EndpointSpec

__all__ = [
    "EXAMPLE_ENDPOINTS",
    "NoEndpointSourceError",
    "default_endpoints_file",
    "fail",
    "run",
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


def fail(msg: str, code: int = 2, log: EventLog | None = None) -> int:
    """Report ``msg`` as ``cslb discovery``'s error; returns ``code``.

    With ``log`` it is a ``start_failed`` line in the process's log format (under a
    gunicorn master it joins the master's other cslb lines); without one (the log
    settings themselves are bad) a plain line on stderr.
    """
    if log is not None:
        log.error("start_failed", error=msg, exit_status=code)
    else:
        print(f"cslb discovery: {msg}", file=sys.stderr)
    return code


def run(
    settings: dict[str, Any],
    routing: dict[str, Any],
    static: list[EndpointSpec],
    log: EventLog,
) -> int:
    """Run the discovery process until SIGTERM/SIGINT; returns the exit status.

    ``settings``: :data:`discovery.settings.DISCOVERY_KNOBS` values (an endpoints file
    already chosen); ``routing``: the routing and outlier knobs; ``static``: ``--endpoint``
    entries.
    ``cslb discovery`` (:mod:`cslb.discovery_cmd`) parses the command line and calls this.
    """
    import shm
    from discovery.publisher import Publisher
    from discovery.service import Discovery

    api = None
    namespace = settings["namespace"]
    if settings["service"] or settings["configmap"] or settings["caller_service"]:
        from discovery.kube import WatchTiming
        from discovery.kube_client import KubeConfigError, load_client

        try:
            api, default_ns = load_client(
                settings["kubeconfig"], service_account_dir=settings["service_account_dir"]
            )
        except KubeConfigError as exc:
            return fail(str(exc), log=log)
        namespace = namespace or default_ns
        timing = WatchTiming(
            connect_timeout_s=settings["connect_timeout_s"],
            request_timeout_s=settings["request_timeout_s"],
            watch_timeout_s=settings["watch_timeout_s"],
            watch_idle_s=settings["watch_idle_s"],
            backoff_s=settings["backoff_s"],
            backoff_max_s=settings["backoff_max_s"],
        )
    try:
        publisher = Publisher(settings["shm_namespace"])
    except (shm.ShmError, OSError) as exc:
        return fail(f"cannot publish into shared memory: {exc}", 1, log)
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
        drop_warn_share=settings["drop_warn_share"],
        caller_zone=settings["zone"],
    )
    if static:
        disc.add_list(static)
    if settings["endpoints_file"]:
        disc.add_file(settings["endpoints_file"], settings["endpoints_file_max_bytes"])
    if api is not None:
        from discovery.informers import ConfigMapInformer, EndpointSliceInformer

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
        if settings["caller_service"]:
            from discovery.informers import CallerSliceInformer
            from discovery.zoneloop import KUBERNETES_CALLERS

            disc.add_caller_informer(
                CallerSliceInformer(
                    api,
                    namespace,
                    settings["caller_service"],
                    settings["pod_ip"],
                    lambda view, why: disc.post_callers(KUBERNETES_CALLERS, view, why),
                    log=log,
                    timing=timing,
                )
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

    from discovery.loadrefresh import LoadRefresher
    from lbcore.knobs import KnobError
    from lbcore.report_settings import ReportSettings

    try:
        report_settings = ReportSettings.from_mapping(os.environ)
    except KnobError as exc:
        publisher.close(unlink=False)
        return fail(str(exc), log=log)
    # The pods' load reports, refreshed for pods no worker calls (CSLB_LOAD_REPORTS=on).
    refresher = LoadRefresher(settings["shm_namespace"], report_settings)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    clean = False
    try:
        refresher.start()
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
        refresher.stop()
        unlink = clean and bool(settings["unlink_on_exit"])
        publisher.close(unlink=unlink)
        if api is not None:
            api.close()
        log.info("stopped", generation=publisher.generation, unlinked=unlink, clean=clean)
    return 0 if clean else 1
