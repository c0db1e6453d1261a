"""Where a key goes on this host right now, and why: ``cslb route --live``.

Answers from the live table (the shared memory the workers route on) and the host's
counters, with the rules a worker routes by: :func:`workers.routing.snapshot.build_plan` builds
the :class:`lbcore.Plan` a worker builds from that table and load snapshot (the rollout
gate and fade mode of the table's knobs, its ejected endpoints, bounded load on the
knobs' load signal in routed-call units), and :func:`explain` asks it, then asks two
plainer plans of the same snapshot what the key would have got without bounded load and
without ejections, to say why:

* ``ring`` — the established ring's pod for the key's position;
* ``fade_ring`` — a fading ring took the key (N-ring fade-in: the newest ring whose share
  is above the key's draw; Skipper's fade-in: the key's level kept this pod);
* ``zone_ring`` — zone affinity: the key is local (its zone draw is under the caller
  zone's share now) and its ring restricted to the caller zone's pods answered;
* ``bounded_load`` — the ring's pod was over the bounded-load bar; the walk went on to
  this one (``moved_from``, with both loads and the bar; under zone affinity the pod's
  own bar, and a local key whose zone pod is over it spills to the global ring);
* ``retry`` — ``attempt`` > 0: the next distinct pod after the earlier attempts';
* ``fallback`` — no pod: ``kill_switch`` (``CSLB_ENABLED=false``), ``percentage`` (the
  key's gate draw is outside ``CSLB_PERCENTAGE``), ``no_table`` (nothing published, or
  no endpoints), ``all_ejected`` (every endpoint of the key's ring is ejected),
  ``no_other_endpoint`` (a retry with no other pod).

An ejected pod the key's position belongs to is named in ``skipped`` with its ejection
reason and how long it has left, whatever the answer's kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import lbcore
import shm
from lbcore.outlier import EJECT_REASONS
from lbcore.zones import local_mask
from workers.routing.reported import TableReports, read_reports
from workers.routing.snapshot import (
    bounded_bar,
    build_plan,
    compared_loads,
    read_loads,
)
from workers.routing.snapshot import zone_bars as own_bars

__all__ = [
    "FALLBACK_REASONS",
    "KINDS",
    "Explanation",
    "LiveAnswer",
    "explain",
    "live",
]

#: What an answer can be (see the module docs).
KINDS = ("ring", "fade_ring", "zone_ring", "bounded_load", "retry", "fallback")
_KNOBS = ("enabled", "percentage", "balance_factor", "max_hops", "load_signal", "fade_mode")
#: Why a key can be fallback.
FALLBACK_REASONS = ("kill_switch", "percentage", "no_table", "all_ejected", "no_other_endpoint")


@dataclass(frozen=True)
class Explanation:
    """One key's answer on one table generation and load snapshot.

    Attributes
    ----------
    index : int
        Endpoint index in the table (``-1``: fallback), as :meth:`workers.Router.route`.
    endpoint, zone, node : str or None
        The pod (``None`` for fallback).
    kind : str
        One of :data:`KINDS`.
    ring : int or None
        The ring that answered: 0 the established ring, ``k`` the ``k``-th fading ring
        (N-ring fade-in), ``None`` when not routed on a ring.
    ring_share : float or None
        That fading ring's share of keys now (0-1).
    pod_ring : int or None
        The ring that added the pod (0: established; ``k``: the ``k``-th fading ring's
        scale-up), so a key on a fading ring can be told on one of its new pods.
    moved_from : str or None
        ``bounded_load``: the ring's pod the walk moved the key off.
    loads : dict
        ``bounded_load``: ``{"from": ..., "to": ..., "bar": ...}`` in the load signal's
        unit (requests for in-flight and effective load, busy-seconds per second for
        occupancy): the loads and bar the worker's plan compared, pods' load reports
        folded in when they are on (under zone affinity, onto the plan's bar shares).
    skipped : list of dict
        Ejected pod(s) the key's position belongs to: ``endpoint``, ``reason`` (an
        :data:`lbcore.outlier.EJECT_REASONS` name), ``remaining_s``.
    fallback : str or None
        One of :data:`FALLBACK_REASONS` when ``index`` is ``-1``.
    """

    index: int
    endpoint: str | None
    zone: str | None
    node: str | None
    kind: str
    ring: int | None = None
    ring_share: float | None = None
    pod_ring: int | None = None
    moved_from: str | None = None
    loads: dict[str, float] = field(default_factory=dict)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    fallback: str | None = None


def _skipped(table: shm.Table, i: int, now_ns: int) -> dict[str, Any]:
    code = int(table.ejections.reason[i])
    until = int(table.ejections.until_ns[i])
    return {
        "endpoint": table.endpoints[i],
        "reason": EJECT_REASONS[code - 1] if 0 < code <= len(EJECT_REASONS) else "ejected",
        "remaining_s": round(max(until - now_ns, 0) / 1e9, 3) if until else None,
    }


def explain(
    table: shm.Table,
    loads: shm.HostLoads,
    keys: Any,
    now_ns: int,
    *,
    attempt: int = 0,
    reports: TableReports | None = None,
) -> list[Explanation]:
    """Each key's pod on ``table`` with ``loads`` at ``now_ns``, and why.

    ``reports``: the pods' load reports of ``table``'s endpoints
    (:func:`workers.routing.reported.read_reports`; ``None``: reports off), folded in as a
    worker's plan folds them; a bounded-load move shows the loads and bar that plan
    compares (:func:`workers.routing.snapshot.compared_loads`, ``bounded_bar``,
    ``zone_bars``), in the load signal's unit.

    Raises
    ------
    lbcore.KeyTooLongError, lbcore.KeyTypeError, lbcore.KeyEncodingError
        A bad key (longer than 4,096 bytes, not a str, bytes or int, not UTF-8 text).
    lbcore.ArgumentError
        ``attempt`` is not a non-negative integer.
    """
    h = lbcore.hash_keys(keys, max_key_bytes=lbcore.MAX_KEY_BYTES)
    knobs, rs = table.knobs, table.ring_set
    plan = build_plan(table, loads, now_ns, reports=reports)
    idx = plan.route_hashes(h, attempt)[0]
    n_eps = len(table.endpoints)
    if plan.closed or not n_eps:
        why = "no_table" if not n_eps else "kill_switch" if not knobs.enabled else "percentage"
        return [Explanation(-1, None, None, None, "fallback", fallback=why) for _ in idx]
    gated = plan.gate.mask(h)
    plain = build_plan(table, loads, now_ns, balance_factor=None).route_hashes(h, attempt)[0]
    owner = build_plan(table, loads, now_ns, balance_factor=None, ejected=False)
    owners = owner.route_hashes(h, 0)[0]
    first = plan.route_hashes(h, 0)[0] if attempt else idx
    mode = knobs.fade_mode
    # Zone affinity: which keys are local now, and each pod's own bar (from its bar share).
    split = plan.zone if plan.zone_views else None
    local = (
        local_mask(h, plan.zone_share, split.name)
        if split is not None
        else np.zeros(h.size, np.bool_)
    )
    zone_bars = None
    if plan.zone_views and knobs.balance_factor is not None:
        zone_bars = own_bars(plan)  # the plan's, as /status shows them
    rings = rs.ring_choice(h, now_ns) if mode == "n-ring" else None
    shares = rs.share_list(now_ns)
    ejected = np.array(table.ejected, dtype=np.bool_)
    # What the plan compares (reports folded in), back in the signal's unit for display.
    inc = loads.bar_increment(knobs.load_signal)
    compared = compared_loads(plan, inc)
    out = []
    for j, i in enumerate(idx.tolist()):
        o = int(owners[j])
        skipped = [_skipped(table, o, now_ns)] if o >= 0 and ejected[o] else []
        ring = None if rings is None else int(rings[j])
        if mode == "off":
            ring = len(rs.rings) - 1
        share = shares[ring - 1] if ring and mode == "n-ring" else None
        if i < 0:
            why = (
                "percentage"
                if not gated[j]
                else "no_other_endpoint"
                if attempt and first[j] >= 0
                else "all_ejected"
            )
            out.append(Explanation(-1, None, None, None, "fallback", skipped=skipped, fallback=why))
            continue
        kind, moved_from, load_info = "ring", None, {}
        if attempt:
            kind = "retry"
        elif i != int(plain[j]) and knobs.balance_factor is not None:
            kind, p = "bounded_load", int(plain[j])
            moved_from = table.endpoints[p]
            view = 0 if ring is None or mode == "off" else ring
            bar = bounded_bar(plan, view) if mode != "skipper" else None
            if zone_bars is not None:
                bar = float(zone_bars[p])
            if compared is not None:
                load_info = {"from": float(compared[p]), "to": float(compared[i])}
            if bar is not None:
                load_info["bar"] = bar * inc
        elif local[j] and plan.zone is not None and plan.zone.local[i]:
            kind = "zone_ring"
        elif (ring or 0) > 0 and mode == "n-ring":
            kind = "fade_ring"
        elif mode == "skipper" and rs.starts_ns and int(rs.tiers[i]) > 0:
            kind = "fade_ring"
        out.append(
            Explanation(
                i,
                table.endpoints[i],
                table.zones[i] or None,
                table.nodes[i] or None,
                kind,
                ring=ring,
                ring_share=share,
                pod_ring=int(rs.tiers[i]),
                moved_from=moved_from,
                loads=load_info,
                skipped=skipped,
            )
        )
    return out


@dataclass(frozen=True)
class LiveAnswer:
    """:func:`live`'s answer: the keys' explanations and the table they were computed on.

    Attributes
    ----------
    generation : int
        The table generation (0: nothing published; every key is fallback).
    published_age_s : float or None
        Seconds since that generation was published.
    publisher_pid : int
        The writer's PID.
    publisher_alive : bool
        The writer runs and its heartbeat is younger than ``stale_after_s`` (else workers
        route on a table nobody updates).
    heartbeat_age_s : float
        Seconds since the writer's last heartbeat.
    counters : bool
        The host's counters were read (else bounded load saw no load, as a worker without
        counters).
    knobs : dict
        The table's routing knobs.
    outlier_panic : bool
        Routing ignores every ejection (too few endpoints left).
    routes : list of Explanation
        Per key, in order.
    zone : dict
        The table's zone record: ``zone`` (the caller's, ``""``: unknown), ``affinity``,
        ``state``, ``reason``, ``share`` (the local share of keys now) and ``cap``.
    """

    generation: int
    published_age_s: float | None
    publisher_pid: int
    publisher_alive: bool
    heartbeat_age_s: float
    counters: bool
    knobs: dict[str, Any]
    outlier_panic: bool
    routes: list[Explanation]
    zone: dict[str, Any] = field(default_factory=dict)


def live(
    namespace: str,
    keys: Any,
    *,
    attempt: int = 0,
    stale_after_s: float = 5.0,
    clock: Callable[[], int] = time.monotonic_ns,
) -> LiveAnswer:
    """Explain ``keys`` on the current table and counters of ``namespace`` (read-only).

    Raises
    ------
    shm.SegmentMissingError
        No tables in ``namespace`` (discovery never started there).
    shm.ShmError
        The tables are unreadable (another layout version, damaged).
    lbcore.KeyTooLongError, lbcore.KeyTypeError, lbcore.KeyEncodingError
        A bad key.
    """
    lbcore.hash_keys(keys, max_key_bytes=lbcore.MAX_KEY_BYTES)  # bad keys before any I/O
    with shm.TableReader(namespace) as reader:
        try:
            counters: shm.CounterReader | None = shm.CounterReader(namespace)
        except shm.ShmError:
            counters = None
        try:

            def answer(t: shm.Table) -> tuple[shm.Table, int, list[Explanation]]:
                now = clock()
                loads = read_loads(counters, t, now)
                reports = read_reports(counters, t, now)
                return t, now, explain(t, loads, keys, now, attempt=attempt, reports=reports)

            t, now, routes = reader.consistent(answer)
            beat_age = (now - reader.heartbeat_ns()) / 1e9
            alive = reader.writer_alive() and not reader.replaced() and beat_age <= stale_after_s
            knobs = {name: getattr(t.knobs, name) for name in _KNOBS}
            return LiveAnswer(
                generation=int(t.generation),
                published_age_s=round((now - t.published_ns) / 1e9, 3) if t.generation else None,
                publisher_pid=int(reader.writer_pid()),
                publisher_alive=bool(alive),
                heartbeat_age_s=round(beat_age, 3),
                counters=counters is not None,
                knobs={k: bool(v) if k == "enabled" else v for k, v in knobs.items()},
                outlier_panic=bool(t.outlier_panic),
                routes=routes,
                zone={
                    "zone": t.zone.zone,
                    "affinity": t.zone.affinity,
                    "state": t.zone.state,
                    "reason": t.zone.reason,
                    "share": round(t.zone_share(now), 6),
                    "cap": t.zone.cap,
                },
            )
        finally:
            if counters is not None:
                counters.close()
