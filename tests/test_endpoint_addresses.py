"""Endpoint addresses only in Skipper's ``scheme://host:port`` form; endpoint files without
unknown fields (weights included), refused naming the entry and the reason."""


import pytest

from discovery.address import check_address
from discovery.static import EndpointsFileError, load_endpoints_file, parse_endpoints

GOOD = [
    "http://10.0.0.1:8080",
    "https://10.0.0.1:443",
    "h2c://10.2.0.1:80",
    "http://[2001:db8::1]:8080",
    "http://[::1]:1",
    "http://catalog.shop.svc.cluster.local:65535",
]


BAD = [
    ("10.0.0.1:8080", "no scheme"),
    ("http://10.0.0.1:8080/", "trailing slash"),
    ("http://10.0.0.1:8080/path", "a path"),
    ("HTTP://10.0.0.1:8080", "scheme 'HTTP' is not lowercase"),
    ("Http://10.0.0.1:8080", "not lowercase"),
    ("http://10.0.0.1", "no port"),
    ("http://[2001:db8::1]", "no port"),
    ("http://2001:db8::1:8080", "must be in brackets"),
    ("http://[2001:DB8::1]:8080", "not in canonical form (2001:db8::1)"),
    ("http://[2001:db8:0::1]:8080", "not in canonical form"),
    ("http://10.0.0.01:8080", "not an IPv4 address"),
    ("http://10.0.0.1:0", "port '0'"),
    ("http://10.0.0.1:08080", "leading zeros"),
    ("http://10.0.0.1:70000", "1 to 65535"),
    ("http://Catalog.shop:8080", "lowercase DNS name"),
    ("http://user@10.0.0.1:8080", "user information"),
    ("http://10.0.0.1:8080?x=1", "a query"),
    (" http://10.0.0.1:8080", "not a URL scheme"),
]


@pytest.mark.parametrize("address", GOOD)
def test_skippers_form_is_accepted(address):
    assert check_address(address) is None
    assert [s.address for s in parse_endpoints([address])] == [address]


@pytest.mark.parametrize(("address", "why"), BAD)
def test_other_spellings_are_refused_naming_the_entry_and_the_form(address, why):
    assert why in (check_address(address) or "")
    doc = {"endpoints": ["http://10.0.0.9:8080", {"address": address, "zone": "z"}]}
    with pytest.raises(EndpointsFileError) as err:
        parse_endpoints(doc, "f.json")
    msg = str(err.value)
    assert msg.startswith(f"f.json: endpoint 1 address {address!r}")
    assert why in msg
    assert "expected scheme://host:port" in msg and "http://[2001:db8::1]:8080" in msg


def test_unknown_fields_are_refused_by_name_weight_with_the_reason(tmp_path):
    f = tmp_path / "eps.yaml"
    f.write_text("endpoints:\n  - {address: 'http://10.0.0.1:8080', weight: 3}\n")
    with pytest.raises(EndpointsFileError) as err:
        load_endpoints_file(f)
    msg = str(err.value)
    assert "endpoint 0 ('http://10.0.0.1:8080'): unknown field 'weight'" in msg
    assert "weights are not supported" in msg and "Skipper's consistentHash ignores" in msg
    with pytest.raises(EndpointsFileError, match=r"unknown field 'zome': the fields are address"):
        parse_endpoints([{"address": "http://10.0.0.1:8080", "zome": "a"}])
    with pytest.raises(EndpointsFileError, match="unknown top-level field 'weights'"):
        parse_endpoints({"endpoints": [], "weights": [1]})
    with pytest.raises(EndpointsFileError, match="'pod' must be a string"):
        parse_endpoints([{"address": "http://10.0.0.1:8080", "pod": 3}])
    (spec,) = parse_endpoints([{"address": "http://10.0.0.1:8080", "pod": "p-1", "node": "n"}])
    assert (spec.pod, spec.node, spec.zone) == ("p-1", "n", "")
