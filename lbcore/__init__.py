"""cslb's routing core: pure routing math over NumPy arrays.

Keys and their XXH64 (:mod:`lbcore.keys`, :func:`hash_keys`), Skipper-exact consistent
hashing (:class:`Ring`), bounded load (:mod:`lbcore.bounded`),
N-ring and Skipper fade-in (:mod:`lbcore.fade`), the rollout gate (:mod:`lbcore.gate`),
load signals (:mod:`lbcore.signals`), passive outlier ejection (:mod:`lbcore.outlier`
judges endpoints, :mod:`lbcore.ejection` keeps ejections over time), zone affinity
(:mod:`lbcore.zones`: :class:`ZoneSplit`, :func:`zone_cap`, :func:`local_keys`,
:func:`zone_salt`), and the routing plan a worker asks per batch
(:class:`lbcore.plan.Plan`; :func:`route_ring_set` for a one-off batch), answered by one
of two kernels
(:mod:`lbcore.kernel`: the compiled C kernel or the NumPy reference, :func:`kernel_name`).
No I/O, no processes, no implicit clocks: time and loads are arguments. The one setting
read from the environment is ``CSLB_KERNEL``, once, at import.
"""

from lbcore import bounded, ejection, fade, gate, outlier, signals, zones
from lbcore.clientkey import default_key
from lbcore.errors import (
    ArgumentError,
    BalanceFactorError,
    CandidatesError,
    EndpointError,
    FadeError,
    GateError,
    KeyEncodingError,
    KeyTooLongError,
    KeyTypeError,
    LBCoreError,
    LoadError,
    MappingFaultError,
    OutlierError,
    TableDataError,
)
from lbcore.fade import RingSet, fade_share, fadein_filter, fadein_score
from lbcore.gate import FALLBACK, Gate
from lbcore.kernel import hash_keys, kernel_name, scatter_add, scatter_add_routed, use_kernel
from lbcore.keys import MAX_KEY_BYTES
from lbcore.plan import Plan
from lbcore.ring import DEFAULT_VNODES, Ring
from lbcore.route import route_ring_set
from lbcore.signals import effective_load, occupancy
from lbcore.zones import ZONE_SALT, ZoneSplit, expected_shares, local_keys, zone_cap, zone_salt

__all__ = [
    "DEFAULT_VNODES",
    "FALLBACK",
    "MAX_KEY_BYTES",
    "ZONE_SALT",
    "ArgumentError",
    "BalanceFactorError",
    "CandidatesError",
    "EndpointError",
    "FadeError",
    "Gate",
    "GateError",
    "KeyEncodingError",
    "KeyTooLongError",
    "KeyTypeError",
    "LBCoreError",
    "LoadError",
    "MappingFaultError",
    "OutlierError",
    "Plan",
    "Ring",
    "RingSet",
    "TableDataError",
    "ZoneSplit",
    "bounded",
    "default_key",
    "effective_load",
    "ejection",
    "expected_shares",
    "fade",
    "fade_share",
    "fadein_filter",
    "fadein_score",
    "gate",
    "hash_keys",
    "kernel_name",
    "local_keys",
    "occupancy",
    "outlier",
    "route_ring_set",
    "scatter_add",
    "scatter_add_routed",
    "signals",
    "use_kernel",
    "zone_cap",
    "zone_salt",
    "zones",
]
