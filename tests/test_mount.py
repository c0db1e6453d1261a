"""cslb's /metrics, /healthz, /readyz and /status mounted into a user's own app with one
line, under real gunicorn: WSGI (sync workers, prometheus_client's multiprocess mode) and
ASGI (uvicorn's gunicorn worker), and ``cslb serve --app``."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gunicorn_harness import serving

ENDPOINTS = [f"http://10.9.0.{i}:8080" for i in range(1, 4)]


def _endpoints_file(tmp_path: Path) -> str:
    f = tmp_path / "eps.json"
    f.write_text(json.dumps({"endpoints": ENDPOINTS}))
    return str(f)


def _families(server) -> dict[str, dict]:
    status, body = server.request("GET", "/metrics")
    assert status == 200, body[:300]
    return {
        f.name: {(*sorted(s.labels.items()), s.name): s.value for s in f.samples}
        for f in text_string_to_metric_families(body.decode())
    }


def _check_cslb_paths(server) -> None:
    doc = server.get_json("/healthz")
    assert doc["status"] == "ok" and doc["generation"] == 1
    ready = server.get_json("/readyz")
    assert ready["status"] == "serving" and ready["routing"] == "client-side"
    status, page = server.request("GET", "/status")
    assert status == 200 and b"10.9.0.1" in page
    status, body = server.request("GET", "/nowhere")
    assert (status, body) == (404, b"the user's 404")  # the user's app answers the rest
    status, _ = server.request("POST", "/route", "[]")
    assert status == 404  # /route is not mounted: the user's app routes itself


def test_wsgi_one_liner_with_multiprocess_metrics_under_gunicorn(tmp_path: Path) -> None:
    mp = tmp_path / "prom"
    mp.mkdir()
    env = {"CSLB_ENDPOINTS_FILE": _endpoints_file(tmp_path), "PROMETHEUS_MULTIPROC_DIR": str(mp)}
    args = ["-c", "python:workers.gunicorn_conf", "--workers", "2", "userapp:app"]
    with serving(args, tmp_path, gunicorn=True, env=env) as server:
        server.wait_ready(workers=2, path="/healthz")
        _check_cslb_paths(server)
        # Slow requests two at a time: a sync worker serves one at a time, so both answer.
        with ThreadPoolExecutor(2) as pool:
            pids = set(pool.map(lambda _: server.get_json("/hello?slow")["pid"], range(40)))
        assert len(pids) == 2, "the requests all went to one worker"
        for i in range(20):
            fams = _families(server)
            # Summed over both workers' files by prometheus_client's MultiProcessCollector,
            # whichever worker answers the scrape.
            assert fams["shop_hellos"][("shop_hellos_total",)] == 40.0 + i
            assert fams["cslb_table_generation"][("cslb_table_generation",)] == 1.0
            assert fams["cslb_discovery_up"][("cslb_discovery_up",)] == 1.0
            assert "cslb_build_info" in fams
            server.get_json("/hello")
        assert server.stop()["exit"] == 0


def test_cslb_serve_app_mounts_cslbs_paths_into_a_wsgi_app(tmp_path: Path) -> None:
    args = ["--endpoints-file", _endpoints_file(tmp_path), "--app", "userapp:plain"]
    with serving(args, tmp_path) as server:
        server.wait_ready(workers=2, path="/healthz")
        _check_cslb_paths(server)
        server.get_json("/hello")
        fams = _families(server)
        # the default registry of the worker that answered (no multiprocess dir)
        assert ("shop_hellos_total",) in fams["shop_hellos"]
        assert fams["cslb_table_generation"][("cslb_table_generation",)] == 1.0
        assert server.stop()["exit"] == 0


def test_cslb_serve_app_mounts_into_an_asgi_app_under_uvicorns_worker(tmp_path: Path) -> None:
    args = [
        "--endpoints-file",
        _endpoints_file(tmp_path),
        "--workers",
        "1",
        "--app",
        "userasgi:app",
        "--",
        "-k",
        "uvicorn_worker.UvicornWorker",
    ]
    with serving(args, tmp_path) as server:
        server.wait_ready(workers=1, path="/healthz")
        _check_cslb_paths(server)
        hello = server.get_json("/hello")
        assert hello == {"hello": "async", "started": True, "pid": hello["pid"]}  # lifespan ran
        fams = _families(server)
        assert fams["shop_async_hellos"][("shop_async_hellos_total",)] == 1.0
        assert fams["cslb_discovery_up"][("cslb_discovery_up",)] == 1.0
        status, body = server.request("HEAD", "/healthz")
        assert status == 200 and body == b""
        assert server.stop()["exit"] == 0


def test_a_bad_app_spec_is_refused_before_gunicorn_starts() -> None:
    from cslb.serve_cmd import command

    env: dict[str, str] = {}
    with pytest.raises(SystemExit):
        command(["--app", "not a module"], env)
    argv = command(["--app", "shop.wsgi:application"], env)
    assert argv[-1] == "workers.mount:app" and env["CSLB_APP"] == "shop.wsgi:application"
