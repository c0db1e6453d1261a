"""Pure-Python reference of Skipper's consistentHash, written from the vectors' README.

Slow and obvious on purpose: the vectorized lbcore code is checked against it on inputs
the golden vectors do not cover (other endpoint sets, loads, candidates, hop caps).
"""

from __future__ import annotations

import bisect
import math

import xxhash


def key_bytes(k) -> bytes:
    if isinstance(k, str):
        return k.encode("utf-8")
    if isinstance(k, int):
        return str(k).encode()
    return bytes(k)


def ring(endpoints, vnodes=100):
    nodes = [
        (xxhash.xxh64_intdigest(f"{ep}-{j}".encode()), i)
        for i, ep in enumerate(endpoints)
        for j in range(vnodes)
    ]
    nodes.sort(key=lambda t: t[0])
    return nodes


def search(nodes, key, eligible):
    hashes = [h for h, _ in nodes]
    h = xxhash.xxh64_intdigest(key_bytes(key))
    i = bisect.bisect_left(hashes, h)
    if i == len(nodes):
        i = 0
    while not eligible[nodes[i][1]]:
        i = (i + 1) % len(nodes)
    return i


def lookup(endpoints, keys, vnodes=100, candidates=None, attempt=0):
    nodes = ring(endpoints, vnodes)
    eligible = [candidates is None or i in candidates for i in range(len(endpoints))]
    out = []
    n_elig = sum(eligible)
    for k in keys:
        if n_elig == 0 or attempt >= n_elig:
            out.append(-1)
            continue
        if n_elig == 1 and attempt == 0:
            out.append(eligible.index(True))
            continue
        p = search(nodes, k, eligible)
        seen = [nodes[p][1]]
        while len(seen) <= attempt:
            p = (p + 1) % len(nodes)
            e = nodes[p][1]
            if eligible[e] and e not in seen:
                seen.append(e)
        out.append(seen[attempt])
    return out


def bounded(
    endpoints, keys, loads, bf, vnodes=100, candidates=None, sequential=False, max_hops=None
):
    """Skipper's boundedLoadSearch; with max_hops, cslb's capped walk (least loaded visited)."""
    nodes = ring(endpoints, vnodes)
    n = len(endpoints)
    eligible = [candidates is None or i in candidates for i in range(n)]
    cand = [i for i in range(n) if eligible[i]]
    load = [float(x) for x in loads]
    out = []
    for k in keys:
        if len(cand) == 1:
            out.append(cand[0])
            if sequential:
                load[cand[0]] += 1
            continue
        total = 1.0
        for i in cand:
            total += load[i]
        target = total / float(len(cand)) * bf
        start = search(nodes, k, eligible)
        p = start
        chosen = None
        if max_hops is None:
            for _ in range(len(nodes)):
                e = nodes[p][1]
                if eligible[e] and load[e] <= target:
                    chosen = e
                    break
                p = (p + 1) % len(nodes)
            if chosen is None:
                chosen = nodes[start][1]
        else:
            seen = []
            for _ in range(len(nodes)):
                e = nodes[p][1]
                if eligible[e] and e not in seen:
                    if load[e] <= target:
                        chosen = e
                        break
                    seen.append(e)
                    if len(seen) == max_hops:
                        break
                p = (p + 1) % len(nodes)
            if chosen is None:
                best = min(load[e] for e in seen)
                chosen = next(e for e in seen if load[e] == best)
        out.append(chosen)
        if sequential:
            load[chosen] += 1
    return out


def fade_share(elapsed_ns, duration_ns, exponent):
    if duration_ns <= 0:
        return 1.0
    return min(max(elapsed_ns / duration_ns, 0.0), 1.0) ** exponent


def isclose(a, b):
    return math.isclose(a, b, rel_tol=1e-12)
