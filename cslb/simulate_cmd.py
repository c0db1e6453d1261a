"""``cslb simulate``: the command line of :func:`perf.sim.options.run_scenario`."""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any

from cslb.argtypes import integer, number
from cslb.kernel_flag import add_kernel_argument, apply_kernel_flag
from lbcore import BalanceFactorError
from lbcore.bounded import check_balance_factor

__all__ = ["build_parser", "main", "options"]


# Option types: each says what it expected; argparse names the flag.


def _balance_factor(text: str) -> float:
    try:
        return check_balance_factor(float(text))
    except ValueError as exc:  # float() or lbcore's BalanceFactorError
        msg = str(exc) if isinstance(exc, BalanceFactorError) else f"not a number: {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``cslb simulate``."""
    from perf.sim.model import BAR_INCREMENTS, SIGNALS
    from perf.sim.options import MAX_BATCH
    from perf.sim.scenarios import SCENARIOS

    p = argparse.ArgumentParser(
        prog="cslb simulate",
        description=(
            "Simulate clients routing batch requests with lbcore (the routing code cslb runs) "
            "to pods with LRU caches, and report cache hit rate, database reads, per-pod "
            "occupancy, traffic to new pods, keys remapped and latency. Scenarios: "
            "scale-up (no fade-in vs Skipper's vs N-ring fade-in), load-signal (bounded "
            "load on in-flight vs occupancy), slow-pod (latency weighting), reports (bounded "
            "load on each host's own view vs pod-reported load, with other callers), zones "
            "(cross-zone calls vs cache hit rate: no zones, Skipper's zone filter, a "
            "per-request split and cslb's key split), zone-ramp (how long the local share "
            "should take to rise), zone-controller (discovery's zone controller against "
            "caches: a latency fault, the floor and the recovery's ramp)."
        ),
    )
    p.add_argument("--scenario", required=True, choices=sorted([*SCENARIOS, *_OWN]))
    p.add_argument("--pods", type=integer(1), help="pods at the start (50 / 100 / 20 by scenario)")
    p.add_argument(
        "--add", type=integer(1), help="scale-up: pods added (default: as many as --pods)"
    )
    p.add_argument(
        "--fade-s",
        type=number(0, detail=" seconds"),
        help="scale-up: fade-in duration, seconds (30)",
    )
    p.add_argument(
        "--exponent", type=number(0, above=True), help="scale-up: fade-in curve exponent (2.5)"
    )
    p.add_argument(
        "--ready-spread-s",
        type=number(0, detail=" seconds"),
        help="scale-up: new pods become ready evenly over this many seconds (20)",
    )
    p.add_argument(
        "--balance-factor",
        type=_balance_factor,
        help="bounded load: scale-up: off unless given; load-signal: the occupancy "
        "variant's factor (default: two variants, 1.25 and 1.35); slow-pod: 1.25",
    )
    p.add_argument(
        "--in-flight-balance-factor",
        type=_balance_factor,
        help="load-signal: the in-flight variant's balance factor (1.10)",
    )
    p.add_argument(
        "--signal",
        choices=SIGNALS,
        help="load signal: scale-up (with --balance-factor; default effective); "
        "slow-pod (compare this one with no bounded load)",
    )
    p.add_argument(
        "--seconds",
        type=number(1, detail=" (one 1-s report interval)"),
        help="simulated seconds after warm-up (120 / 30 / 80 by scenario)",
    )
    p.add_argument("--seed", type=integer(0), default=1, help="random seed, >= 0 (default 1)")
    p.add_argument(
        "--rate",
        type=number(0, above=True, detail=" calls/s"),
        help="calls per second over all clients (default 700 / 350 / 350 per starting pod)",
    )
    p.add_argument(
        "--zipf",
        type=number(0),
        help="Zipf exponent of product popularity (1.0)",
    )
    p.add_argument(
        "--catalogue",
        type=integer(MAX_BATCH, detail=f" (batches carry up to {MAX_BATCH} distinct IDs)"),
        help="number of product IDs (1,000,000)",
    )
    p.add_argument("--cache-size", type=integer(1), help="products per pod cache (2,000)")
    p.add_argument("--concurrency", type=integer(1), help="calls a pod serves at once (8)")
    p.add_argument(
        "--pod-speed-sigma",
        type=number(0),
        help="pods on unequal nodes: each pod's service times x a fixed lognormal factor "
        "(mean 1) of this shape; 0.2 spreads pod speeds by about +-20 %% (default 0: equal; "
        "load-signal 0.2)",
    )
    p.add_argument(
        "--clients",
        type=integer(1, 64),
        help="client hosts, each with its own counters (8; load-signal 32; reports 4)",
    )
    p.add_argument(
        "--bar-increment",
        choices=BAR_INCREMENTS,
        help="what the bounded-load bar adds for the routed call: routed-call = what the "
        "call adds to the signal (its mean latency's share of the window for occupancy, 1 "
        "for counts; as cslb's worker router routes, the default), skipper = 1.0 whatever "
        "the signal (Skipper's formula, what cslb did for occupancy before)",
    )
    p.add_argument(
        "--slo-ms",
        type=number(0, above=True, detail=" ms"),
        default=25.0,
        help="load-signal: p99 bound for pods needed, ms (25)",
    )
    p.add_argument(
        "--no-search", action="store_true", help="load-signal: skip the pods-needed search"
    )
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.add_argument("--plot", metavar="DIR", help="write PNG chart(s) into DIR, created if missing")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="draw a progress bar on stderr (default: when stderr is a terminal)",
    )
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_kernel_argument(p)
    return p


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The scenario options of parsed arguments (what :mod:`perf.sim.options` reads)."""
    out = vars(args).copy()
    for name in ("scenario", "json", "plot", "progress"):
        out.pop(name, None)
    return out


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Reject options that do not apply to the scenario (argparse checked each value)."""
    from perf.sim.options import ONLY

    defaults = vars(parser.parse_args(["--scenario", args.scenario]))
    for name, scenarios in ONLY.items():
        if args.scenario not in scenarios and getattr(args, name) != defaults[name]:
            flag = "--" + name.replace("_", "-")
            parser.error(
                f"{flag} has no effect on --scenario {args.scenario}; it applies to "
                f"{' and '.join(scenarios)}"
            )
    if args.scenario == "scale-up" and args.signal is not None and args.balance_factor is None:
        parser.error(
            "--signal has no effect on --scenario scale-up without --balance-factor "
            "(the scale-up runs without bounded load unless a balance factor is given)"
        )


def _plot_dir(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Create and check ``--plot DIR`` before the run, not after it."""
    from perf.sim.plot import pyplot

    pyplot()  # PlotUnavailableError without matplotlib
    out = pathlib.Path(args.plot)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        parser.error(f"--plot {args.plot}: exists and is not a directory")
    except OSError as exc:
        parser.error(f"--plot {args.plot}: cannot create the directory: {exc.strerror}")
    if not os.access(out, os.W_OK | os.X_OK):
        parser.error(f"--plot {args.plot}: the directory is not writable")


#: What --scenario reports reads; the other options belong to the cache scenarios.
_REPORTS_OPTIONS = {"scenario", "seconds", "seed", "clients", "progress", "kernel"}


def _reports(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``--scenario reports``: host-only vs pod-reported load, and the settings sweep."""
    from perf.sim.reports import ReportsConfig, sweep, to_text

    defaults = vars(parser.parse_args(["--scenario", "reports"]))
    for name, value in vars(args).items():
        if name not in _REPORTS_OPTIONS and value != defaults[name]:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} has no effect on --scenario reports")
    seconds = 80.0 if args.seconds is None else args.seconds
    if seconds < 10:
        parser.error("--seconds: --scenario reports needs at least 10 simulated seconds")
    cfg = ReportsConfig(
        seconds=seconds,
        hosts=4 if args.clients is None else args.clients,
        seed=args.seed,
        external_on_s=0.25 * seconds,
        external_off_s=0.6 * seconds,
    )
    print(to_text(sweep(cfg), cfg))
    return 0


#: What --scenario zones, zone-ramp and zone-controller read; the other options belong
#: to the cache scenarios.
_ZONES_OPTIONS = {
    "scenario",
    "seconds",
    "seed",
    "balance_factor",
    "zipf",
    "catalogue",
    "cache_size",
    "json",
    "plot",
    "progress",
    "kernel",
}


def _zones(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``--scenario zones`` (the strategies' table), ``zone-ramp`` and ``zone-controller``."""
    import json
    from dataclasses import replace

    from perf.sim.config import to_jsonable
    from perf.sim.zone_control import CASES, controller_study
    from perf.sim.zone_ramp import ramp_study
    from perf.sim.zones import ZonesConfig, sweep
    from perf.sim.zones_report import controller_text, plot, plot_ramp, ramp_text, to_text

    defaults = vars(parser.parse_args(["--scenario", args.scenario]))
    for name, value in vars(args).items():
        if name not in _ZONES_OPTIONS and value != defaults[name]:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} has no effect on --scenario {args.scenario}")
    ramp = args.scenario == "zone-ramp"
    control = args.scenario == "zone-controller"
    if control and args.plot:
        parser.error("--scenario zone-controller has no chart (--plot)")
    long_s = 200.0 if control else 180.0 if ramp else 60.0
    seconds = long_s if args.seconds is None else args.seconds
    base = ZonesConfig(seconds=seconds, seed=args.seed)
    changes = {
        k: getattr(args, k)
        for k in ("balance_factor", "zipf", "catalogue", "cache_size")
        if getattr(args, k) is not None
    }
    if ramp or control:
        changes["pods"] = (4, 4, 4)
    # a run simulates at most twice --seconds: a warm-up as long (20 s at most), then them
    warmup = min(base.warmup_s, seconds)
    base = replace(base, warmup_s=warmup, hot_window_s=min(base.hot_window_s, seconds), **changes)
    try:
        base.validate()
    except ValueError as exc:
        parser.error(str(exc))
    if args.plot:
        _plot_dir(args, parser)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    say = (lambda text: print(f"  {text}", file=sys.stderr)) if show else None
    if control:
        studies = []
        for name, slow in CASES:
            if say is not None:
                say(name)
            studies.append((name, controller_study(base, slow=slow)))
        if args.json:
            print(json.dumps(to_jsonable(dict(studies)), indent=1))
        else:
            print(controller_text(studies))
        return 0
    if ramp:
        study = ramp_study(base, progress=say)
        if args.json:
            print(json.dumps(to_jsonable(study), indent=1))
        else:
            print(ramp_text(study))
        if args.plot and (path := plot_ramp(study, args.plot)) is not None:
            print(f"wrote {path}", file=sys.stderr)
        return 0
    rows = sweep(base, progress=say)
    if args.json:
        print(json.dumps(to_jsonable(rows), indent=1))
    else:
        print(to_text(rows, base))
    if args.plot:
        print(f"wrote {plot(rows, args.plot)}", file=sys.stderr)
    return 0


#: Scenarios with a command of their own here (the others run through perf.sim.options).
_OWN = {"reports": _reports, "zones": _zones, "zone-ramp": _zones, "zone-controller": _zones}


def main(argv: list[str]) -> int:
    """Run ``cslb simulate``; returns the exit status (argparse exits 2 on bad options)."""
    from perf.sim.model import SimConfigError
    from perf.sim.options import config, run_scenario
    from perf.sim.plot import PlotUnavailableError, plot
    from perf.sim.progress import ProgressBar
    from perf.sim.report import to_json, to_text

    parser = build_parser()
    args = parser.parse_args(argv)
    apply_kernel_flag(args, os.environ, parser)
    if args.scenario in _OWN:
        return _OWN[args.scenario](args, parser)
    _check(args, parser)
    opts = options(args)
    try:
        if args.plot:
            _plot_dir(args, parser)
        config(args.scenario, opts)  # settings errors before the bar appears
        show = sys.stderr.isatty() if args.progress is None else args.progress
        bar = ProgressBar() if show else None
        try:
            result = run_scenario(args.scenario, opts, bar)
        finally:
            if bar is not None:
                bar.close()
    except (SimConfigError, PlotUnavailableError) as exc:
        print(f"cslb simulate: {exc}", file=sys.stderr)
        return 2
    print(to_json(result) if args.json else to_text(result))
    if args.plot:
        for path in plot(result, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    return 0
