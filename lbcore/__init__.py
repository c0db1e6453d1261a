"""cslb's routing core: pure routing math over NumPy arrays.

Skipper-exact consistent hashing (:class:`Ring`), bounded load (:mod:`lbcore.bounded`),
N-ring and Skipper fade-in (:mod:`lbcore.fade`), the rollout gate (:mod:`lbcore.gate`),
load signals (:mod:`lbcore.signals`) and passive outlier ejection (:mod:`lbcore.outlier`
judges endpoints, :mod:`lbcore.ejection` keeps ejections over time). No I/O, no
processes, no implicit clocks: time and loads are arguments.
"""

from lbcore import bounded, ejection, fade, gate, outlier, signals
from lbcore.bounded import redirect_table
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
    OutlierError,
)
from lbcore.fade import RingSet, fade_share, fadein_filter, fadein_score
from lbcore.gate import FALLBACK, Gate
from lbcore.hashing import MAX_KEY_BYTES, hash_keys
from lbcore.ring import DEFAULT_VNODES, Ring
from lbcore.signals import effective_load, occupancy

__all__ = [
    "DEFAULT_VNODES",
    "FALLBACK",
    "MAX_KEY_BYTES",
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
    "OutlierError",
    "Ring",
    "RingSet",
    "bounded",
    "default_key",
    "effective_load",
    "ejection",
    "fade",
    "fade_share",
    "fadein_filter",
    "fadein_score",
    "gate",
    "hash_keys",
    "occupancy",
    "outlier",
    "redirect_table",
    "signals",
]
