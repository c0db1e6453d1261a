"""EndpointSlice -> endpoint addresses, by Skipper's dataclient rules."""

import random

import pytest

import lbcore
from discovery.endpoints import SliceError, format_address, merge_slices, parse_slice
from discovery.static import EndpointSpec
from tests.kubeapi import endpoint, endpoint_slice


def addrs(*slices, **kw):
    return [s.address for s in merge_slices(parse_slice(x, **kw) for x in slices)]


def test_format_address_brackets_ipv6_only():
    assert format_address("http", "10.2.0.1", 8080) == "http://10.2.0.1:8080"
    assert format_address("https", "fd00::1", 443) == "https://[fd00::1]:443"
    assert format_address("http", "pod.example.org", 80) == "http://pod.example.org:80"


def test_ready_endpoints_sorted_with_zone_node_and_pod():
    s = endpoint_slice(
        "svc-1",
        "svc",
        [
            endpoint("10.2.0.10", node="node-b", zone="eu-central-1b", pod="svc-b"),
            endpoint("10.2.0.9", node="node-a", zone="eu-central-1a", pod="svc-a"),
        ],
    )
    got = merge_slices([parse_slice(s)])
    # String order, as Go's sort.Strings: "10.2.0.10" < "10.2.0.9".
    assert got == (
        EndpointSpec("http://10.2.0.10:8080", "eu-central-1b", "node-b", "svc-b"),
        EndpointSpec("http://10.2.0.9:8080", "eu-central-1a", "node-a", "svc-a"),
    )


def test_ipv6_slice_and_scheme():
    s = endpoint_slice("v6", "svc", [endpoint("fd00:10::5")], address_type="IPv6")
    assert addrs(s, scheme="https") == ["https://[fd00:10::5]:8080"]


def test_port_by_name_or_the_only_port():
    two = endpoint_slice(
        "s", "svc", [endpoint("10.0.0.1")], ports=[("http", 8080), ("metrics", 9911)]
    )
    assert addrs(two, port_name="metrics") == ["http://10.0.0.1:9911"]
    assert addrs(two, port_name="http") == ["http://10.0.0.1:8080"]
    parsed = parse_slice(two)  # two ports, no name: nothing, with a reason
    assert parsed.endpoints == () and "--port-name" in parsed.problems[0]
    missing = parse_slice(two, port_name="grpc")
    assert missing.endpoints == () and "no TCP port named 'grpc'" in missing.problems[0]
    one = endpoint_slice("s", "svc", [endpoint("10.0.0.1")], ports=[("", 9000)])
    assert addrs(one) == ["http://10.0.0.1:9000"]


def test_port_by_number():
    two = endpoint_slice(
        "s", "svc", [endpoint("10.0.0.1")], ports=[("http", 8080), ("metrics", 9911)]
    )
    assert addrs(two, port_name="9911") == ["http://10.0.0.1:9911"]
    assert addrs(two, port_name="8080") == ["http://10.0.0.1:8080"]
    missing = parse_slice(two, port_name="7000")
    assert missing.endpoints == () and "no TCP port 7000 (ports: 8080, 9911)" in missing.problems[0]
    unnamed = endpoint_slice("s", "svc", [endpoint("10.0.0.1")], ports=[("", 9000), ("", 9001)])
    assert addrs(unnamed, port_name="9001") == ["http://10.0.0.1:9001"]


def test_udp_ports_are_not_candidates():
    s = endpoint_slice("s", "svc", [endpoint("10.0.0.1")])
    s["ports"] = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "http", "port": 80}]
    assert addrs(s) == ["http://10.0.0.1:80"]


def test_conditions_follow_skipper():
    eps = [
        endpoint("10.0.0.1", ready=True),
        endpoint("10.0.0.2", ready=False, serving=False),  # not ready: out
        endpoint("10.0.0.3", ready=True, terminating=True),  # terminating: out
        {"addresses": ["10.0.0.4"]},  # no conditions: ready
        {"addresses": ["10.0.0.5"], "conditions": {"ready": False}},  # serving unknown: in
        {"addresses": ["10.0.0.6"], "conditions": {}},  # all unknown: in
    ]
    assert addrs(endpoint_slice("s", "svc", eps)) == [
        "http://10.0.0.1:8080",
        "http://10.0.0.4:8080",
        "http://10.0.0.5:8080",
        "http://10.0.0.6:8080",
    ]


def test_dedup_across_slices_and_terminating_wins():
    a = endpoint_slice("a", "svc", [endpoint("10.0.0.1", zone="z1"), endpoint("10.0.0.2")])
    b = endpoint_slice(
        "b", "svc", [endpoint("10.0.0.1", zone="z2"), endpoint("10.0.0.2", terminating=True)]
    )
    got = merge_slices([parse_slice(a), parse_slice(b)])
    assert [g.address for g in got] == ["http://10.0.0.1:8080"]
    assert got[0].zone == "z2"  # the last ready copy gives the details
    # Terminating first, ready later: still out.
    got = merge_slices([parse_slice(b), parse_slice(a)])
    assert [g.address for g in got] == ["http://10.0.0.1:8080"]


def test_only_first_address_counts():
    s = endpoint_slice("s", "svc", [{"addresses": ["10.0.0.1", "10.0.0.99"]}])
    assert addrs(s) == ["http://10.0.0.1:8080"]


def test_null_ports_and_null_endpoints():
    assert (
        parse_slice(endpoint_slice("s", "svc", [endpoint("10.0.0.1")], ports=None)).endpoints == ()
    )
    s = endpoint_slice("s", "svc", [])
    s["endpoints"] = None
    assert parse_slice(s).endpoints == ()


def test_bad_endpoints_are_skipped_with_a_reason():
    s = endpoint_slice(
        "s",
        "svc",
        [
            endpoint("10.0.0.1"),
            endpoint("10.0.0.300"),
            endpoint("fd00::1"),  # IPv6 in an IPv4 slice
            {"addresses": []},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": "yes"}},
            {"addresses": ["10.0.0.3"], "nodeName": 7},
            "not an object",
        ],
    )
    p = parse_slice(s)
    assert [e.address for e in p.endpoints] == ["http://10.0.0.1:8080"]
    text = "\n".join(p.problems)
    assert len(p.problems) == 6
    assert "'10.0.0.300' is not an IP address" in text
    assert "is not an IPv4 address" in text
    assert "has no addresses" in text
    assert "'ready' must be true, false or null" in text
    assert "'nodeName' must be a string" in text


def test_non_canonical_ipv6_is_rejected():
    s = endpoint_slice("s", "svc", [endpoint("FD00:0::1")], address_type="IPv6")
    p = parse_slice(s)
    assert p.endpoints == () and "canonical" in p.problems[0]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.pop("metadata"), "no 'metadata'"),
        (lambda s: s["metadata"].pop("name"), "no metadata.name"),
        (lambda s: s.update(addressType="IPX"), "addressType is 'IPX'"),
        (lambda s: s.pop("addressType"), "addressType is None"),
        (lambda s: s.update(endpoints={"a": 1}), "'endpoints' must be a list"),
        (lambda s: s.update(ports="http"), "'ports' must be a list"),
        (lambda s: s["ports"][0].update(port="8080"), "port must be an integer 1-65535"),
        (lambda s: s["ports"][0].update(port=70000), "port must be an integer 1-65535"),
    ],
)
def test_malformed_slices_raise_naming_the_field(mutate, message):
    s = endpoint_slice("bad", "svc", [endpoint("10.0.0.1")])
    mutate(s)
    with pytest.raises(SliceError, match=message):
        parse_slice(s)


def test_not_an_object():
    with pytest.raises(SliceError, match="must be a JSON object"):
        parse_slice(["x"])


def test_fqdn_slices():
    s = endpoint_slice(
        "f", "svc", [endpoint("pod-1.svc.example"), endpoint("Bad_Name")], address_type="FQDN"
    )
    p = parse_slice(s)
    assert [e.address for e in p.endpoints] == ["http://pod-1.svc.example:8080"]
    assert "not a DNS name" in p.problems[0]


@pytest.mark.parametrize("name", ["ring_pub_ring_http_10.json", "ring_pub_ring_http_50_hpe10.json"])
def test_rings_from_slices_route_like_skipper(vector_dir, name):
    """Skipper's own answers (golden vectors) from a ring built on EndpointSlices.

    The vector's endpoints are split over slices the way a controller might (shuffled,
    one pod in two slices, plus a not-ready and a terminating pod that must stay out);
    the addresses cslb builds must be Skipper's strings in Skipper's order, so the ring
    routes every vector key to the endpoint Skipper chose.
    """
    import json

    v = json.loads((vector_dir / name).read_text(encoding="utf-8"))
    hosts = [e.removeprefix("http://").removesuffix(":8080") for e in v["endpoints"]]
    assert all(f"http://{h}:8080" == e for h, e in zip(hosts, v["endpoints"], strict=True))
    shuffled = hosts[:]
    random.Random(3).shuffle(shuffled)
    third = len(shuffled) // 3 or 1
    parts = [shuffled[:third], shuffled[third : 2 * third], shuffled[2 * third :]]
    parts[1].append(parts[0][0])  # the same pod in two slices
    slices = [
        endpoint_slice(f"svc-{j}", "svc", [endpoint(h) for h in part])
        for j, part in enumerate(parts)
    ]
    slices[2]["endpoints"] += [
        endpoint("10.255.0.1", ready=False),
        endpoint("10.255.0.2", terminating=True),
    ]
    got = addrs(*slices)
    assert got == v["endpoints"]  # Skipper's strings, sorted as Skipper sorts them
    ring = lbcore.Ring(got, vnodes=v["hashes_per_endpoint"])
    assert ring.lookup(v["keys"]).tolist() == v["expected"]
