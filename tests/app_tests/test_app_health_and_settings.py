"""The bundled WSGI app's GET surfaces and settings: /healthz (also once discovery stops and
restarts), /metrics, the index, settings read from the environment."""

from __future__ import annotations

import multiprocessing
import os
import re
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

import lbcore
import shm
from lbcore.knobs import KnobError
from tests.app_tests import wsgi_calls
from tests.app_tests.conftest import ENDPOINTS, Host
from tests.app_tests.wsgi_calls import KEYS, call, expected, post_json
from workers.surfaces.app import CslbApp

# The app under test: a published table, a 64 KiB body and a 1,000-key batch limit.
app = wsgi_calls.app


# --------------------------------------------------------------------------------------
# GET /healthz, /metrics, HEAD, settings.


def _publish_and_exit(namespace: str) -> None:
    try:
        w = shm.TableWriter(namespace)
        w.publish(lbcore.RingSet(ENDPOINTS[:2]))
    finally:
        os._exit(0)  # dies as the publisher: segments stay, the process is gone


def test_healthz(namespace: str) -> None:
    app = CslbApp(namespace, stale_after_s=2.0)
    try:
        r = call(app, "GET", "/healthz")
        assert r.code == 503
        doc = r.json()
        assert doc["status"] == "unavailable"
        assert f"no routing tables in shared-memory namespace {namespace!r}" in doc["reason"]
        h = Host(namespace)
        try:
            r = call(app, "GET", "/healthz")
            assert r.code == 503 and "has not published" in r.json()["reason"]
            h.publish()
            r = call(app, "GET", "/healthz")
            assert r.code == 200
            doc = r.json()
            assert doc["status"] == "ok" and doc["generation"] == 1
            assert doc["publisher_pid"] == os.getpid() and doc["heartbeat_age_s"] < 1
            # HEAD announces the body GET would send. The heartbeat age in it changes its
            # length now and then (0.12 vs 0.123 s): compare while two GETs around the
            # HEAD agree on their length.
            for _ in range(20):
                head = call(app, "HEAD", "/healthz")
                after = call(app, "GET", "/healthz")
                if len(after.body) == len(r.body):
                    break
                r = after
            assert head.code == 200 and head.body == b""
            assert head.headers["Content-Length"] == str(len(r.body))
            h.writer.heartbeat(time.monotonic_ns() - 3_000_000_000)
            r = call(app, "GET", "/healthz")
            assert r.code == 503
            assert re.fullmatch(
                r"publisher heartbeat is 3\.\d s old \(stale after 2 s\)", r.json()["reason"]
            )
            h.writer.heartbeat()
            assert call(app, "GET", "/healthz").code == 200
        finally:
            h.close()
        # A publisher that died (SIGKILL-like: no clean close) leaves its table behind.
        ctx = multiprocessing.get_context("fork")
        p = ctx.Process(target=_publish_and_exit, args=(namespace,))
        p.start()
        p.join(10)
        app.close()  # forget the old segments' mappings
        r = call(app, "GET", "/healthz")
        assert r.code == 503
        assert f"publisher process {p.pid} is not running" in r.json()["reason"]
    finally:
        app.close()


def test_metrics_endpoint(app: CslbApp) -> None:
    r = call(app, "GET", "/metrics")
    assert r.code == 200
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    fams = {f.name: f for f in text_string_to_metric_families(r.body.decode())}
    assert fams["cslb_discovery_up"].samples[0].value == 1.0
    assert fams["cslb_table_generation"].samples[0].value == 1.0
    om = call(app, "GET", "/metrics", extra={"HTTP_ACCEPT": "application/openmetrics-text"})
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.body.endswith(b"# EOF\n")


def test_index_and_settings_from_environment(namespace: str) -> None:
    app = CslbApp.from_environ(
        {"CSLB_SHM_NAMESPACE": namespace, "CSLB_MAX_BATCH": "5", "CSLB_MAX_BODY_BYTES": "4096"}
    )
    try:
        assert (app.namespace, app.max_batch, app.max_body_bytes) == (namespace, 5, 4096)
        r = call(app, "GET", "/")
        assert r.code == 200 and b"POST /route" in r.body
        assert post_json(app, list("abcdef")).code == 413
    finally:
        app.close()
    for env, name in [
        ({"CSLB_MAX_BATCH": "0"}, "CSLB_MAX_BATCH"),
        ({"CSLB_MAX_BODY_BYTES": "lots"}, "CSLB_MAX_BODY_BYTES"),
        ({"CSLB_STALE_AFTER": "-1"}, "CSLB_STALE_AFTER"),
        ({"CSLB_SHM_NAMESPACE": "a/b"}, "CSLB_SHM_NAMESPACE"),
    ]:
        with pytest.raises(KnobError, match=name):
            CslbApp.from_environ(env)


def test_module_level_app_reads_the_environment_on_first_request(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.surfaces import app as module

    host.publish()
    monkeypatch.setenv("CSLB_SHM_NAMESPACE", host.namespace)
    monkeypatch.setenv("CSLB_MAX_BATCH", "2")
    lazy = module.LazyApp()
    try:
        assert not lazy.built  # nothing built, nothing mapped at import
        assert post_json(lazy, ["a", "b"]).json()["generation"] == 1
        assert post_json(lazy, ["a", "b", "c"]).code == 413
        assert lazy.get().namespace == host.namespace
    finally:
        lazy.get().close()
    monkeypatch.setenv("CSLB_MAX_BATCH", "none")
    with pytest.raises(KnobError, match="CSLB_MAX_BATCH"):
        module.LazyApp()  # a bad setting stops the server at start-up
    assert callable(module.app)


def test_healthz_after_discovery_stops_cleanly_and_restarts(host: Host, app: CslbApp) -> None:
    assert call(app, "GET", "/healthz").code == 200
    assert call(app, "GET", "/metrics").code == 200  # scraped before: the table is mapped
    assert post_json(app, KEYS[:5]).code == 200
    host.writer.close()  # a clean stop removes the tables
    r = call(app, "GET", "/healthz")
    assert (
        r.code == 503 and "were removed (discovery stopped or is restarting)" in r.json()["reason"]
    )
    # Nothing of the removed publisher is reported as current.
    assert (r.json()["publisher_pid"], r.json()["heartbeat_age_s"]) == (0, None)
    fams = {
        f.name: f
        for f in text_string_to_metric_families(call(app, "GET", "/metrics").body.decode())
    }
    assert fams["cslb_discovery_up"].samples[0].value == 0.0
    assert fams["cslb_table_generation"].samples[0].value == 1.0  # the table still in use
    assert post_json(app, KEYS[:5]).json()["endpoints"] == expected(KEYS[:5])
    host.writer = shm.TableWriter(host.namespace, counters=host.counters)  # restarted
    host.publish(ENDPOINTS[:4])
    deadline = time.monotonic() + 5
    while call(app, "GET", "/healthz").code != 200:
        assert time.monotonic() < deadline, call(app, "GET", "/healthz").json()
        time.sleep(0.05)
    assert call(app, "GET", "/healthz").json()["generation"] == 1  # the new writer's count


def test_status_refresh_is_a_plain_number_given_once(app: CslbApp) -> None:
    for query in ("refresh=1_0", "refresh=nan", "refresh=1e3", "refresh=5&refresh=0", "refresh="):
        r = call(app, "GET", "/status", query=query)
        assert r.code == 400 and "refresh" in r.error, query
    for query, meta in (("refresh=10", 'content="10"'), ("refresh=2.5", 'content="2.5"')):
        r = call(app, "GET", "/status", query=query)
        assert r.code == 200 and meta.encode() in r.body
    assert b"http-equiv" not in call(app, "GET", "/status", query="refresh=0").body
