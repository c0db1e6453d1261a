"""A plan's kernel side: the native ``lbcore._kernel.Plan`` or the NumPy reference's ``Core``.

:class:`lbcore.Plan` (a ring set's views) and :meth:`lbcore.Ring.lookup` (one ring's
view) compute their arrays with :mod:`lbcore.views` and hand them here; this picks the
kernel active now (:func:`lbcore.kernel.kernel_name`) and builds its routing object,
whose ``route``, ``route_hashes``, ``answers`` and ``counter_slots`` answer alike on
both kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lbcore import kernel, numpy_kernel
from lbcore.gate import GATE_SALT

__all__ = ["make_core"]

_M64 = (1 << 64) - 1


def make_core(
    *,
    newest: Any,
    n: int,
    views: int,
    eligible: np.ndarray,
    good: np.ndarray | None,
    listed_count: np.ndarray,
    eligible_count: np.ndarray,
    single: np.ndarray,
    loads: np.ndarray | None,
    max_hops: int | None,
    choice: int,
    fixed_view: int,
    choice_salt: int,
    fade_thresholds: np.ndarray,
    fade_saturated: np.ndarray,
    gate_mode: int,
    gate_threshold: int | None,
    slots: np.ndarray,
    n_slots: int,
    guard: tuple[np.ndarray, int, int] | None,
    closed: bool,
    max_key_bytes: int | None,
    zone_views: int = 0,
    zone_threshold: int = 0,
    zone_salt: int = 0,
    under: np.ndarray | None = None,
) -> Any:
    """The routing object of one plan's arrays, on the kernel active now.

    ``newest`` is the newest ring (:class:`lbcore.Ring`, or ``None`` when empty), whose
    ``hashes``, ``owners`` and ``buckets`` both kernels read; the other arguments are
    the :class:`lbcore.Plan` attributes of the same names (``good`` and ``loads`` only
    with bounded load). With a zone (``zone_views``: the number of global views, the
    zone parts following them), ``zone_threshold`` is the local draw's threshold
    (``2**64``: every key), ``zone_salt`` its salt and ``under`` (with bounded load) the
    endpoints at or under their bars. Arrays are used as given, not copied: the caller
    keeps them unchanged for the object's life.
    """
    native = kernel.native()
    if native is None:
        return numpy_kernel.Core(
            newest=newest,
            views=views,
            eligible=eligible,
            good=good,
            listed_count=listed_count,
            eligible_count=eligible_count,
            single=single,
            loads=loads,
            max_hops=max_hops,
            choice=choice,
            fixed_view=fixed_view,
            choice_salt=choice_salt,
            fade_thresholds=fade_thresholds,
            fade_saturated=fade_saturated,
            gate_mode=gate_mode,
            gate_threshold=gate_threshold,
            slots=slots,
            guard=guard,
            closed=closed,
            max_key_bytes=max_key_bytes,
            zone_views=zone_views,
            zone_threshold=zone_threshold,
            zone_salt=zone_salt,
            under=under,
        )
    bounded = good is not None
    return native.Plan(
        hashes=None if newest is None else newest.hashes,
        owners=None if newest is None else newest.owners,
        buckets=None if newest is None else newest.buckets,
        n=n,
        views=views,
        eligible=eligible,  # (C-contiguous bool: the kernel reads them as bytes, flat)
        good=good,
        listed_count=listed_count,
        eligible_count=eligible_count,
        single=single,
        loads=loads if bounded else None,
        bounded=bounded,
        max_hops=max_hops or 0,
        choice=choice,
        fixed_view=fixed_view,
        choice_salt=choice_salt,
        thresholds=fade_thresholds,
        saturated=fade_saturated,
        gate=gate_mode,
        gate_salt=GATE_SALT,
        gate_threshold=gate_threshold or 0,
        slots=slots,
        n_slots=n_slots,
        guard=guard,
        closed=closed,
        max_key_bytes=-1 if max_key_bytes is None else max_key_bytes,
        zone_views=zone_views,
        zone_salt=zone_salt,
        zone_threshold=min(zone_threshold, _M64),
        zone_saturated=zone_threshold > _M64,
        under=under if bounded and zone_views else None,
    )
