"""A ring-state transition is the documented rule: readmitted endpoints removed, then
``RingSet.with_endpoints`` (deletions at once, the new endpoints in the list's order as
one scale-up), on random membership sequences with readmissions and detail changes."""

import random

import numpy as np

from discovery.ringstate import FadeParams, RingState
from discovery.static import EndpointSpec

S = 1_000_000_000
POOL = [f"http://10.1.{i // 100}.{i % 100}:8080" for i in range(60)]


def _same_ring_sets(a, b) -> None:
    assert a.endpoints == b.endpoints
    assert a.starts_ns == b.starts_ns
    assert np.array_equal(a.tiers, b.tiers)
    assert len(a.rings) == len(b.rings)
    for x, y in zip(a.rings, b.rings, strict=True):
        assert x.endpoints == y.endpoints
        assert np.array_equal(x.hashes, y.hashes)
        assert np.array_equal(x.owners, y.owners)
        assert np.array_equal(x.buckets, y.buckets)


def test_transitions_equal_remove_then_with_endpoints_on_random_sequences() -> None:
    rng = random.Random(18)
    for trial in range(40):
        duration = rng.choice([0, 10 * S])
        st = RingState(FadeParams(duration, 2.0, 20))
        now = S
        for _ in range(12):
            now += rng.choice([0, S, 4 * S, 20 * S])
            kept = [a for a in st.meta if rng.random() < 0.8]
            fresh = [a for a in rng.sample(POOL, rng.randint(0, 8)) if a not in st.meta]
            addresses = kept + fresh
            rng.shuffle(addresses)
            wanted = [
                EndpointSpec(a, rng.choice(["z1", "z2"]), st.meta[a].node if a in st.meta else "n")
                for a in addresses
            ]
            readmit = rng.sample(addresses, min(len(addresses), rng.randint(0, 2)))
            t = st.transition(wanted, now, readmit=readmit)

            rs = st.ring_set.advance(now)
            back = sorted({a for a in readmit if a in st.meta})
            if back:
                rs = rs.remove(back)
            rs = rs.with_endpoints(addresses, now)
            if duration == 0 and rs.starts_ns:
                rs = rs.advance(now)
            _same_ring_sets(t.ring_set, rs)

            assert [s.address for s in t.added] == [a for a in addresses if a not in st.meta]
            assert [s.address for s in t.removed] == sorted(set(st.meta) - set(addresses))
            assert [s.address for s in t.readmitted] == back
            assert [s.address for s in t.updated] == [
                s.address
                for s in wanted
                if s.address in st.meta and st.meta[s.address].zone != s.zone
            ], trial
            st.commit(t)
