"""``cslb simulate``: a routing simulator built on lbcore's routing.

Clients send batch requests of product IDs (Zipf popularity) that lbcore routes, call by
call, to pods with per-pod LRU caches, a hit and a miss service time and a concurrency
limit. Scenarios reproduce Zalando's published results: scale-up with and without
fade-in, bounded load on in-flight counts versus occupancy, and a slow pod.

Modules: :mod:`~perf.sim.workload` (catalogue, batches), :mod:`~perf.sim.cache`
(tick-resolution LRU), :mod:`~perf.sim.pods` (FIFO multi-slot pods),
:mod:`~perf.sim.routing` (lbcore routers), :mod:`~perf.sim.model` (the simulation),
:mod:`~perf.sim.scenarios`, :mod:`~perf.sim.report`, :mod:`~perf.sim.plot`,
:mod:`~perf.sim.options` (what `cslb simulate`, parsed by :mod:`cslb.simulate_cmd`, runs).
"""

from perf.sim.model import ScaleDown, ScaleUp, SimConfig, SimResult, SlowPod, run
from perf.sim.scenarios import load_signal, scale_up, slow_pod

__all__ = [
    "ScaleDown",
    "ScaleUp",
    "SimConfig",
    "SimResult",
    "SlowPod",
    "load_signal",
    "run",
    "scale_up",
    "slow_pod",
]
