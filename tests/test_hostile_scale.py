"""A large endpoint set: discovery is not mistaken for hung while it reads and publishes
it, and one ``/metrics`` scrape or ``/status`` page costs the same as for a small one."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.gunicorn_harness import serving, wait_for

BIG = 50_000


def _endpoints(n: int) -> list[dict[str, str]]:
    return [
        {
            "address": f"http://10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}:8080",
            "zone": f"z{i % 3}",
            "node": f"node-{i}",
            "pod": f"pod-{i}",
        }
        for i in range(n)
    ]


def test_a_large_file_is_published_without_a_stall_kill_and_pages_stay_small(
    tmp_path: Path,
) -> None:
    eps = tmp_path / "endpoints.json"
    eps.write_text(json.dumps(_endpoints(5)))
    env = {
        "CSLB_DEBOUNCE": "0.1",
        # Far shorter than reading, building and publishing the large file takes.
        "CSLB_DISCOVERY_STALL_TIMEOUT": "0.8",
        "CSLB_METRICS_MAX_ENDPOINTS": "1000",
    }
    with serving(["--endpoints-file", str(eps), "--workers", "1"], tmp_path, env=env) as server:
        server.wait_ready(workers=1, path="/healthz")
        (disc,) = server.discovery_pids()
        tmp = eps.with_suffix(".tmp")
        tmp.write_text(json.dumps({"endpoints": _endpoints(BIG)}))
        tmp.rename(eps)

        def published_big() -> bool:
            return any(p["endpoints"] == BIG for p in server.events("publish"))

        wait_for("the large table's publish", published_big, 180.0, 0.2)
        assert not server.events("discovery_hung"), "the master took long work for a hang"
        assert server.discovery_pids() == [disc]
        # Endpoint lines are capped per publish, with one line counting the rest.
        assert len(server.events("endpoint_added")) <= 5 + 100
        (capped,) = server.events("endpoint_lines_capped")
        assert capped["not_logged"]["endpoint_added"] == BIG - 5 - 100

        def metrics_of_big_table() -> list:
            status, body = server.request("GET", "/metrics", timeout_s=60)
            text = body.decode()
            if status != 200 or "cslb_table_generation 2.0" not in text:
                return []
            return list(text_string_to_metric_families(text))

        families = wait_for("/metrics on the large table", metrics_of_big_table, 120.0, 0.5)
        samples = [s for f in families for s in f.samples]
        assert len(samples) < 500, len(samples)
        occupancy = [s for s in samples if s.name == "cslb_endpoint_occupancy"]
        assert sorted(s.labels["zone"] for s in occupancy) == ["z0", "z1", "z2"]
        assert {s.labels["endpoint"] for s in occupancy} == {"*"}
        ejected = [s for s in samples if s.name == "cslb_endpoint_ejected"]
        assert sum(s.value for s in ejected) == 0 and len(ejected) == 3
        status, page = server.request("GET", "/status", timeout_s=60)
        assert status == 200 and len(page) < 400_000, len(page)
        assert f"most loaded of {BIG} endpoints".encode() in page
        assert page.count(b"<tr") <= 200 + 30  # endpoints, plus knobs and fading rings
        assert server.discovery_pids() == [disc]
        result = server.stop(timeout_s=60)
    assert result["exit"] == 0 and result["left"] == [] and result["segments"] == []
