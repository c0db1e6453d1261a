"""``cslb discovery``: the command line of :func:`discovery.cli.run`.

Every option also reads its ``CSLB_*`` variable (flags win); see :mod:`discovery.cli`
for what the process does and its exit statuses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from discovery.cli import NoEndpointSourceError, default_endpoints_file, fail, run
from discovery.events import EventLog
from discovery.settings import DISCOVERY_KNOBS, LAYERED_KNOBS, OUTLIER_KNOBS, ZONE_CONTROL_KNOBS
from discovery.static import EndpointsFileError, EndpointSpec, parse_endpoints
from lbcore.knobs import LOG_KNOBS, ROUTING_KNOBS, KnobError, add_arguments, from_args

__all__ = ["build_parser", "main"]


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
        "outlier detection (decided here for the whole host; a --configmap overrides it at "
        "runtime)"
    )
    add_arguments(outlier, OUTLIER_KNOBS)
    zones = p.add_argument_group(
        "zone affinity (the zone controller's settings; a --configmap overrides them at runtime)"
    )
    add_arguments(zones, ZONE_CONTROL_KNOBS)
    return p


def main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    """Run ``cslb discovery``; returns the exit status."""
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    try:
        logs = from_args(args, env, LOG_KNOBS)
    except KnobError as exc:
        return fail(str(exc))  # no log format to write it in: a plain line
    log = EventLog(sys.stderr, level=logs["log_level"], fmt=logs["log_format"])
    try:
        settings = from_args(args, env, DISCOVERY_KNOBS)
        routing = from_args(args, env, LAYERED_KNOBS)
        static: list[EndpointSpec] = parse_endpoints(list(args.endpoint), "--endpoint")
    except (KnobError, EndpointsFileError) as exc:
        return fail(str(exc), log=log)
    default = None
    if not (settings["service"] or settings["endpoints_file"] or static):
        try:
            default = default_endpoints_file(os.getcwd(), env)
        except NoEndpointSourceError as exc:
            return fail(str(exc), log=log)
        settings["endpoints_file"] = str(default)
    if default is not None:
        log.warning(
            "endpoints_file_default",
            path=str(default),
            why="no --service, --endpoints-file or --endpoint given (and not in a cluster)",
            note="static example endpoints, for running without a cluster",
        )
    return run(settings, routing, static, log)
