"""Adapter for Skipper's ``check_vectors.py``: every function goes through lbcore's public API.

Routing goes through :class:`lbcore.Plan` (one kernel call per batch) on whichever kernel
is active (``lbcore.use_kernel``); Skipper's request-by-request traffic (``sequential``)
is one plan per request, each on the in-flight counts the requests before it left.
"""

from __future__ import annotations

import numpy as np

import lbcore


def hash64(key: str) -> int:
    return int(lbcore.hash_keys([key])[0])


def ring(endpoints, hashes_per_endpoint):
    r = lbcore.Ring(endpoints, vnodes=hashes_per_endpoint)
    return list(zip(r.hashes.tolist(), r.owners.tolist(), strict=True))


def route(endpoints, keys, hashes_per_endpoint):
    rs = lbcore.RingSet(endpoints, vnodes=hashes_per_endpoint)
    return lbcore.Plan(rs, 0, max_key_bytes=None).route(keys)[0].tolist()


def route_bounded(
    endpoints, keys, hashes_per_endpoint, available, inflight, balance_factor, sequential
):
    rs = lbcore.RingSet(endpoints, vnodes=hashes_per_endpoint)
    ejected = None
    if available is not None:
        ejected = np.ones(len(endpoints), dtype=np.bool_)
        ejected[np.asarray(available, dtype=np.intp)] = False
    load = np.asarray(inflight, dtype=np.float64)

    def plan(loads):
        return lbcore.Plan(
            rs, 0, ejected=ejected, loads=loads, balance_factor=balance_factor, max_key_bytes=None
        )

    if not sequential:
        return plan(load).route(keys)[0].tolist()
    out = []
    load = load.copy()
    for key in keys:
        chosen = int(plan(load).route([key])[0][0])
        out.append(chosen)
        if chosen >= 0:
            load[chosen] += 1.0
    return out


def fadein_score(lifetime_ns, duration_ns, exponent):
    return lbcore.fadein_score(lifetime_ns, duration_ns, exponent)


def filter_fadein(ages_ns, duration_ns, exponent, threshold):
    return lbcore.fadein_filter(ages_ns, duration_ns, exponent, threshold).tolist()


def default_key(xff, remote_addr):
    return lbcore.default_key(xff, remote_addr)
