"""``cslb simulate``: run a scenario and print, dump or plot what it measured."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from perf.sim.model import SIGNALS, SimConfig
from perf.sim.progress import ProgressBar
from perf.sim.report import to_json, to_text
from perf.sim.scenarios import SCENARIOS, ScenarioResult

__all__ = ["build_parser", "main"]

# Per scenario: default pods, calls/s per starting pod, simulated seconds.
_DEFAULTS = {
    "scale-up": {"pods": 50, "rate_per_pod": 700.0, "seconds": 120.0},
    "load-signal": {"pods": 100, "rate_per_pod": 350.0, "seconds": 60.0},
    "slow-pod": {"pods": 20, "rate_per_pod": 350.0, "seconds": 80.0},
}
# Options that only some scenarios use.
_ONLY = {
    "add": ("scale-up",),
    "fade_s": ("scale-up",),
    "exponent": ("scale-up",),
    "ready_spread_s": ("scale-up",),
    "slo_ms": ("load-signal",),
    "no_search": ("load-signal",),
    "signal": ("scale-up", "slow-pod"),
}


class UsageError(ValueError):
    """An option does not apply or has a bad value."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``cslb simulate``."""
    p = argparse.ArgumentParser(
        prog="cslb simulate",
        description=(
            "Simulate clients routing batch requests with lbcore (the routing code cslb runs) "
            "to pods with LRU caches, and report cache hit rate, database reads, per-pod "
            "occupancy, traffic to new pods, keys remapped and latency. Scenarios: "
            "scale-up (no fade-in vs Skipper's vs N-ring fade-in), load-signal (bounded "
            "load on in-flight vs occupancy), slow-pod (latency weighting)."
        ),
    )
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--pods", type=int, help="pods at the start (50 / 100 / 20 by scenario)")
    p.add_argument("--add", type=int, help="scale-up: pods added (default: as many as --pods)")
    p.add_argument("--fade-s", type=float, help="scale-up: fade-in duration, seconds (30)")
    p.add_argument("--exponent", type=float, help="scale-up: fade-in curve exponent (2.5)")
    p.add_argument(
        "--ready-spread-s",
        type=float,
        help="scale-up: new pods become ready evenly over this many seconds (20)",
    )
    p.add_argument(
        "--balance-factor",
        type=float,
        help="bounded load: scale-up off unless given; load-signal: the occupancy "
        "variant's factor (1.30; in-flight uses 1.10); slow-pod: 1.25",
    )
    p.add_argument(
        "--signal",
        choices=SIGNALS,
        help="load signal: scale-up (with --balance-factor; default occupancy); "
        "slow-pod (compare this one with no bounded load)",
    )
    p.add_argument("--seconds", type=float, help="simulated seconds after warm-up")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--rate", type=float, help="calls per second over all clients")
    p.add_argument("--zipf", type=float, help="Zipf exponent of product popularity (1.0)")
    p.add_argument("--catalogue", type=int, help="number of product IDs (1,000,000)")
    p.add_argument("--cache-size", type=int, help="products per pod cache (2,000)")
    p.add_argument("--concurrency", type=int, help="calls a pod serves at once (8)")
    p.add_argument("--clients", type=int, help="client hosts, each with its own counters (8)")
    p.add_argument(
        "--slo-ms", type=float, default=25.0, help="load-signal: p99 bound for pods needed (25)"
    )
    p.add_argument(
        "--no-search", action="store_true", help="load-signal: skip the pods-needed search"
    )
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.add_argument("--plot", metavar="DIR", help="write PNG chart(s) into DIR (needs matplotlib)")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None)
    bar.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    defaults = vars(parser.parse_args(["--scenario", args.scenario]))
    for name, scenarios in _ONLY.items():
        if args.scenario not in scenarios and getattr(args, name) != defaults[name]:
            flag = "--" + name.replace("_", "-")
            raise UsageError(
                f"{flag} has no effect on --scenario {args.scenario}; it applies to "
                f"{' and '.join(scenarios)}"
            )
    for name in ("pods", "add", "seconds", "rate", "catalogue", "cache_size", "concurrency"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {v}")
    if args.clients is not None and not 1 <= args.clients <= 64:
        raise UsageError(f"--clients must be 1..64, got {args.clients}")
    if args.balance_factor is not None and args.balance_factor < 1:
        raise UsageError(f"--balance-factor must be >= 1, got {args.balance_factor}")


def _config(args: argparse.Namespace) -> SimConfig:
    d = _DEFAULTS[args.scenario]
    cfg = SimConfig(
        pods=args.pods or d["pods"],
        rate_per_pod=d["rate_per_pod"],
        seconds=args.seconds or d["seconds"],
        seed=args.seed,
    )
    changes: dict[str, Any] = {}
    for name, field in (
        ("rate", "rate"),
        ("zipf", "zipf"),
        ("catalogue", "catalogue"),
        ("cache_size", "cache_size"),
        ("concurrency", "concurrency"),
        ("clients", "clients"),
        ("fade_s", "fade_s"),
        ("exponent", "fade_exponent"),
    ):
        v = getattr(args, name)
        if v is not None:
            changes[field] = v
    if args.scenario == "scale-up":
        if args.balance_factor is not None:
            changes["balance_factor"] = args.balance_factor
        if args.signal is not None:
            changes["signal"] = args.signal
    return replace(cfg, **changes).validate()


def run_scenario(args: argparse.Namespace, progress: Any) -> ScenarioResult:
    cfg = _config(args)
    fn = SCENARIOS[args.scenario]
    if args.scenario == "scale-up":
        kw: dict[str, Any] = {}
        if args.add is not None:
            kw["add"] = args.add
        if args.ready_spread_s is not None:
            kw["ready_spread_s"] = args.ready_spread_s
        return fn(cfg, progress=progress, **kw)
    if args.scenario == "load-signal":
        return fn(
            cfg,
            occupancy_factor=args.balance_factor or 1.30,
            slo_p99_ms=None if args.no_search else args.slo_ms,
            progress=progress,
        )
    kw = {"balance_factor": args.balance_factor or 1.25}
    if args.signal is not None:
        kw["signals"] = (None, args.signal)
    return fn(cfg, progress=progress, **kw)


def main(argv: list[str]) -> int:
    """Run ``cslb simulate``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check(args, parser)
        if args.plot:
            from perf.sim.plot import _pyplot

            _pyplot()  # fail before a long run, not after it
        show = sys.stderr.isatty() if args.progress is None else args.progress
        bar = ProgressBar() if show else None
        try:
            result = run_scenario(args, bar)
        finally:
            if bar is not None:
                bar.close()
    except (UsageError, ValueError) as exc:
        print(f"cslb simulate: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # PlotUnavailableError
        print(f"cslb simulate: {exc}", file=sys.stderr)
        return 2
    print(to_json(result) if args.json else to_text(result))
    if args.plot:
        from perf.sim.plot import plot

        for path in plot(result, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    return 0
