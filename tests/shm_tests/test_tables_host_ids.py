"""A reader shares one parse of the endpoints' host identities across a table's rings and
reuses the previous generation's parse; the ids must equal lbcore's own, every generation."""

from __future__ import annotations

import numpy as np

import lbcore
from lbcore.route import route_ring_set
from shm import TableReader, TableWriter


def _fresh_ids(endpoints: tuple[str, ...]) -> np.ndarray:
    return lbcore.Ring(endpoints).host_ids


def test_host_ids_of_every_ring_equal_lbcores_across_generations(namespace: str) -> None:
    # Aliases: the same host written differently (default port, case, path) is one
    # identity, also across fading tiers.
    base = [f"http://10.0.0.{i}:8080" for i in range(1, 9)]
    aliases = ["http://web-a:80", "HTTP://WEB-A", "http://10.0.0.2:8080/x"]
    gen1 = lbcore.RingSet([*base, *aliases]).scale_up(["http://x:81", "http://WEB-A:80"], 10)
    # Next generation: aliases and a host gone, new hosts; the endpoints' order shifts,
    # so a stale cached id would point at the wrong host.
    gen2 = lbcore.RingSet(["http://new:9000", *base[1:], "http://x:81"]).scale_up(
        ["http://z:83"], 20
    )
    # And the same through lbcore's own transitions: aliases removed while their host
    # stays (each ring keeps exactly its listed endpoints' nodes).
    gen3 = gen1.with_endpoints([*base, "http://x:81", "http://z:83"], 30)
    with TableWriter(namespace) as w, TableReader(namespace) as r:
        for rs in (gen1, gen2, gen3):
            w.publish(rs)
            t = r.table()
            eps = tuple(t.endpoints)
            assert eps == rs.endpoints
            want = _fresh_ids(eps)
            assert len(t.ring_set.rings) >= 2
            for ring in t.ring_set.rings:
                np.testing.assert_array_equal(ring.host_ids, want)
            # Routing with candidates (which uses the host identities) is lbcore's answer.
            keys = [f"sku-{i}" for i in range(300)]
            cand = np.ones(len(eps), dtype=bool)
            cand[0] = False
            np.testing.assert_array_equal(
                route_ring_set(t.ring_set, keys, 15, candidates=cand, attempt=1),
                route_ring_set(rs, keys, 15, candidates=cand, attempt=1),
            )
    ids1 = _fresh_ids(gen1.endpoints)
    pos = {ep: i for i, ep in enumerate(gen1.endpoints)}
    assert ids1[pos["http://web-a:80"]] == ids1[pos["HTTP://WEB-A"]]
    assert ids1[pos["http://10.0.0.2:8080/x"]] == ids1[pos["http://10.0.0.2:8080"]]
