"""A ring's host identities: computed when it is built, never filled in later, and the
fast parse of plain ``scheme://host:port`` addresses equals urlsplit's for every input."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import lbcore
from lbcore.endpoints import host_ids_of, host_key, parsed_host_key
from lbcore.route import route_ring_set

TRICKY = [
    "http://10.0.0.1:8080",
    "HTTP://WEB-A",
    "https://Web-A",
    "http://a:80",
    "http://a:080",
    "http://a:0",
    "http://a:65535",
    "http://a:65536",
    "http://a:99999",
    "http://a:",
    "http://a:1x",
    "http://[::1]:81",
    "http://user@a:81",
    "http://a:81/path",
    "http://a.:81",
    "ftp://a",
    "x+y.z-w://a_b",
    "1http://a",
    "http://",
    "http:// a",
    " http://a",
    "http://a\t:81",
    "a:81",
    "A",
    "http://ä:81",
    "http://a%41:81",
]


def test_the_fast_parse_equals_urlsplits_on_tricky_addresses():
    for ep in TRICKY:
        assert host_key(ep) == parsed_host_key(ep), ep


@settings(max_examples=400, deadline=None)
@given(
    st.text(st.sampled_from("hHtTpPsS:/.-_+[]@?#% \t09aAzZ5ä"), max_size=24)
    | st.builds(
        lambda s, h, p: f"{s}://{h}{p}",
        st.sampled_from(["http", "HTTPS", "ftp", "h+t", "1x", ""]),
        st.text(st.sampled_from("aZ09.-_[]:@ä"), max_size=8),
        st.sampled_from(["", ":", ":0", ":80", ":0443", ":65535", ":65536", ":123456", ":x"]),
    )
)
def test_the_fast_parse_equals_urlsplits_on_any_address(ep):
    assert host_key(ep) == parsed_host_key(ep)


def slots(ring: lbcore.Ring) -> dict[str, int]:
    return {name: id(getattr(ring, name)) for name in type(ring).__slots__}


def test_a_ring_holds_its_host_ids_from_the_start_and_routing_changes_nothing_it_holds():
    eps = ["http://web-a:80", "http://10.0.0.1:81", "HTTP://WEB-A", "http://10.0.0.2:81"]
    ring = lbcore.Ring(eps)
    before = slots(ring)
    assert ring.host_ids.tolist() == [0, 1, 0, 2]
    assert not ring.host_ids.flags.writeable
    assert ring.has_aliases
    rs = lbcore.RingSet(eps)
    held = [slots(r) for r in rs.rings]
    cand = np.array([True, True, False, False])
    ring.lookup([f"k{i}" for i in range(50)], candidates=cand, attempt=1)
    route_ring_set(rs, [f"k{i}" for i in range(50)], 0, candidates=cand, attempt=1)
    assert slots(ring) == before
    assert [slots(r) for r in rs.rings] == held
    sub = ring.subset([0, 1])
    assert sub.host_ids is ring.host_ids  # derived rings share the parse


def test_has_aliases_is_public_and_exact():
    assert not lbcore.Ring(["http://a:1", "http://b:1"]).has_aliases
    assert lbcore.Ring(["http://a", "http://A:80"]).has_aliases
    ids = host_ids_of(["http://a", "http://b", "http://A:80"])
    assert ids.tolist() == [0, 1, 0]


def reference_ids(eps):
    ids: dict[str, int] = {}
    return [ids.setdefault(parsed_host_key(e), len(ids)) for e in eps]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.builds(
            lambda s, h, p: f"{s}://{h}{p}",
            st.sampled_from(["http", "HTTPS", "h+t"]),
            st.sampled_from(["a", "A", "b", "10.0.0.1", "x_y"]),
            st.sampled_from(["", ":0", ":80", ":080", ":443", ":65535", ":65536", ":8080"]),
        )
        | st.sampled_from(TRICKY),
        max_size=12,
    )
)
def test_host_ids_of_any_list_equal_one_parse_per_address(eps):
    assert host_ids_of(eps).tolist() == reference_ids(eps)


def test_rings_of_a_set_share_their_host_ids_through_scale_up_and_remove():
    eps = [f"http://10.0.0.{i}:80" for i in range(10)] + ["http://10.0.0.3", "HTTP://X:1"]
    rs = lbcore.RingSet(eps[:6]).scale_up(eps[6:9], 10).scale_up(eps[9:], 20)
    for r in rs.rings:
        assert r.host_ids is rs.newest.host_ids
        assert r.host_ids.tolist() == reference_ids(rs.endpoints)
    smaller = rs.remove(["http://10.0.0.0:80", "http://10.0.0.5:80"])
    for r in smaller.rings:
        assert r.host_ids.tolist() == reference_ids(smaller.endpoints)
