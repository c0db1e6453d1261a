"""What ``cslb simulate`` runs: each scenario's defaults, its options and the run itself.

The command line (:mod:`cslb.simulate_cmd`) parses the flags into an options mapping
(names as the flags' ``dest``: ``pods``, ``fade_s``...; ``None`` for one not given) and
calls :func:`run_scenario`; this module turns them into a :class:`SimConfig` and the
scenario's keywords.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from perf.sim.model import SimConfig
from perf.sim.progress import ProgressBar
from perf.sim.scenarios import SCENARIOS, ScenarioResult

__all__ = ["DEFAULTS", "MAX_BATCH", "ONLY", "config", "run_scenario"]

#: Per scenario: default pods, calls/s per starting pod, simulated seconds.
DEFAULTS: dict[str, dict[str, Any]] = {
    "scale-up": {"pods": 50, "rate_per_pod": 700.0, "seconds": 120.0},
    "load-signal": {
        "pods": 100,
        "rate_per_pod": 350.0,
        "seconds": 30.0,
        "clients": 32,
        "pod_speed_sigma": 0.2,
    },
    "slow-pod": {"pods": 20, "rate_per_pod": 350.0, "seconds": 80.0},
}
#: Options that only some scenarios use.
ONLY: dict[str, tuple[str, ...]] = {
    "add": ("scale-up",),
    "fade_s": ("scale-up",),
    "exponent": ("scale-up",),
    "ready_spread_s": ("scale-up",),
    "slo_ms": ("load-signal",),
    "no_search": ("load-signal",),
    "in_flight_balance_factor": ("load-signal",),
    "signal": ("scale-up", "slow-pod"),
}
#: Distinct product IDs a batch carries at most (the catalogue must hold one batch).
MAX_BATCH = SimConfig().max_batch

# Options that set a SimConfig field (option name -> field).
_FIELDS = (
    ("rate", "rate"),
    ("zipf", "zipf"),
    ("catalogue", "catalogue"),
    ("cache_size", "cache_size"),
    ("concurrency", "concurrency"),
    ("clients", "clients"),
    ("pod_speed_sigma", "pod_speed_sigma"),
    ("bar_increment", "bar_increment"),
    ("fade_s", "fade_s"),
    ("exponent", "fade_exponent"),
)


def config(scenario: str, options: Mapping[str, Any]) -> SimConfig:
    """The simulation settings of ``scenario`` with ``options`` applied.

    Raises
    ------
    perf.sim.model.SimConfigError
        If the settings make no valid run (say, too many arrays for memory).
    """
    d = DEFAULTS[scenario]
    cfg = SimConfig(
        **{
            **d,
            "pods": options.get("pods") or d["pods"],
            "seconds": options.get("seconds") or d["seconds"],
        },
        seed=options.get("seed", 1),
    )
    changes: dict[str, Any] = {
        field: options[name] for name, field in _FIELDS if options.get(name) is not None
    }
    if scenario == "scale-up":
        if options.get("balance_factor") is not None:
            changes["balance_factor"] = options["balance_factor"]
        if options.get("signal") is not None:
            changes["signal"] = options["signal"]
    return replace(cfg, **changes).validate()


def run_scenario(
    scenario: str, options: Mapping[str, Any], progress: ProgressBar | None = None
) -> ScenarioResult:
    """Run ``scenario`` (one of :data:`perf.sim.scenarios.SCENARIOS`) with ``options``.

    Raises
    ------
    perf.sim.model.SimConfigError
        If the settings make no valid run.
    """
    cfg = config(scenario, options)
    fn = SCENARIOS[scenario]
    opt = options.get
    if scenario == "scale-up":
        kw: dict[str, Any] = {}
        if opt("add") is not None:
            kw["add"] = opt("add")
        if opt("ready_spread_s") is not None:
            kw["ready_spread_s"] = opt("ready_spread_s")
        return fn(cfg, progress=progress, **kw)
    if scenario == "load-signal":
        kw = {"slo_p99_ms": None if opt("no_search") else opt("slo_ms", 25.0)}
        if opt("balance_factor") is not None:
            kw["occupancy_factors"] = (opt("balance_factor"),)
        if opt("in_flight_balance_factor") is not None:
            kw["in_flight_factor"] = opt("in_flight_balance_factor")
        return fn(cfg, progress=progress, **kw)
    kw = {"balance_factor": opt("balance_factor") or 1.25}
    if opt("signal") is not None:
        kw["signals"] = (None, opt("signal"))
    return fn(cfg, progress=progress, **kw)
