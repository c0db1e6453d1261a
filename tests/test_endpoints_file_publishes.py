"""What discovery publishes as an endpoints file changes: a bad entry keeps the last good
set, a large drop in one publish is a warning, an empty set makes ``/healthz`` 503."""

import json

import pytest

import shm
from tests.app_tests.wsgi_calls import call
from tests.discovery_harness import Loop, shm_namespace, wait_until
from workers.surfaces.app import CslbApp


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
