"""Honest inputs: endpoint addresses only in Skipper's ``scheme://host:port`` form, no
unknown fields (weights included) in endpoint files, a large drop of endpoints in one
publish logged, an empty endpoint set reported by ``/healthz``."""

import json

import pytest

import shm
from discovery.address import check_address
from discovery.static import EndpointsFileError, load_endpoints_file, parse_endpoints
from tests.app_tests.test_app import call
from tests.discovery_harness import Loop, shm_namespace, wait_until
from workers.surfaces.app import CslbApp

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


def _write(path, addresses):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"endpoints": addresses}))
    tmp.replace(path)


def _addresses(n):
    return [f"http://10.3.0.{i}:8080" for i in range(1, n + 1)]


def test_a_bad_address_in_the_file_keeps_the_last_good_set_and_names_the_entry(tmp_path):
    f = tmp_path / "eps.json"
    _write(f, _addresses(3))
    with shm_namespace() as ns:
        loop = Loop(ns, endpoints_file=str(f), service=None, debounce_s=0.05).start()
        try:
            t = loop.wait_generation(1)
            assert list(t.endpoints) == _addresses(3)
            _write(f, [*_addresses(3), "10.3.0.4:8080"])
            (bad,) = wait_until(lambda: loop.named("endpoints_file_invalid"), what="error")
            assert bad["level"] == "error"
            assert "endpoint 3 address '10.3.0.4:8080'" in bad["error"]
            assert "expected scheme://host:port" in bad["error"]
            assert bad["action"] == "keeping last good endpoints (3)"
            _write(f, _addresses(4))
            t = loop.wait_generation(2)
            assert list(t.endpoints) == _addresses(4)  # the bad set was never published
        finally:
            loop.stop()


@pytest.mark.parametrize(("share", "warned"), [(0.5, True), (0.9, False)])
def test_a_large_drop_in_one_publish_is_a_warning(tmp_path, share, warned):
    f = tmp_path / "eps.json"
    _write(f, _addresses(11))
    with shm_namespace() as ns:
        loop = Loop(
            ns, endpoints_file=str(f), service=None, debounce_s=0.05, drop_warn_share=share
        ).start()
        try:
            loop.wait_generation(1)
            _write(f, _addresses(10))  # 1 of 11 gone: never a warning
            loop.wait_generation(2)
            _write(f, _addresses(2))  # 8 of 10 gone (80 %)
            t = loop.wait_generation(3)
            assert list(t.endpoints) == _addresses(2)  # published all the same
            drops = loop.named("publish_drop")
            if not warned:
                assert drops == []
                return
            (drop,) = drops
            assert drop["level"] == "warning" and drop["generation"] == 3
            assert (drop["endpoints_before"], drop["endpoints"], drop["removed"]) == (10, 2, 8)
            assert drop["share_removed"] == 0.8 and drop["warn_above"] == 0.5
            assert sorted(drop["removed_endpoints"]) == sorted(_addresses(10)[2:])
        finally:
            loop.stop()


def test_an_empty_set_makes_healthz_503_with_the_reason(tmp_path):
    f = tmp_path / "eps.json"
    _write(f, _addresses(2))
    with shm_namespace() as ns:
        counters = shm.CounterStore.create(ns, rows=4)
        loop = Loop(ns, endpoints_file=str(f), service=None, debounce_s=0.05).start()
        app = CslbApp(ns)
        try:
            loop.wait_generation(1)
            assert call(app, "GET", "/healthz").code == 200
            _write(f, [])
            loop.wait_generation(2)
            r = call(app, "GET", "/healthz")
            assert r.code == 503
            doc = r.json()
            assert doc["status"] == "unavailable" and doc["generation"] == 2
            assert "has no endpoints" in doc["reason"] and "falls back" in doc["reason"]
            # ...and routing falls back, it does not fail
            r = call(app, "POST", "/route", b'["a", "b"]', content_type="application/json")
            assert r.code == 200 and r.json()["endpoints"] == [None, None]
            _write(f, _addresses(1))
            loop.wait_generation(3)
            assert call(app, "GET", "/healthz").code == 200
        finally:
            app.close()
            loop.stop()
            counters.close(unlink=True)
