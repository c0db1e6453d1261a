"""Adapter for Skipper's ``check_vectors.py``: every function goes through lbcore's public API."""

from __future__ import annotations

import numpy as np

import lbcore


def hash64(key: str) -> int:
    return int(lbcore.hash_keys([key])[0])


def ring(endpoints, hashes_per_endpoint):
    r = lbcore.Ring(endpoints, vnodes=hashes_per_endpoint)
    return list(zip(r.hashes.tolist(), r.owners.tolist(), strict=True))


def route(endpoints, keys, hashes_per_endpoint):
    return lbcore.Ring(endpoints, vnodes=hashes_per_endpoint).lookup(keys).tolist()


def route_bounded(
    endpoints, keys, hashes_per_endpoint, available, inflight, balance_factor, sequential
):
    r = lbcore.Ring(endpoints, vnodes=hashes_per_endpoint)
    return r.lookup_bounded(
        keys,
        np.asarray(inflight, dtype=np.float64),
        balance_factor,
        candidates=available,
        sequential=sequential,
    ).tolist()


def fadein_score(lifetime_ns, duration_ns, exponent):
    return lbcore.fadein_score(lifetime_ns, duration_ns, exponent)


def filter_fadein(ages_ns, duration_ns, exponent, threshold):
    return lbcore.fadein_filter(ages_ns, duration_ns, exponent, threshold).tolist()


def default_key(xff, remote_addr):
    return lbcore.default_key(xff, remote_addr)
