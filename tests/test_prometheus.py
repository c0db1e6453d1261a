"""deploy/prometheus and deploy/grafana, checked by the real tools: ``promtool check rules``
and ``promtool test rules`` on the alerts, and every PromQL expression of the dashboard
run by a real Prometheus (Debian's ``/usr/bin/prometheus`` on 127.0.0.1) that scrapes a
real ``cslb serve`` under a little load; each must return data.

The tools are installed by ``.ci/run`` (apt); under CI (``CI`` or ``CSLB_REQUIRE_TOOLS``
set) a missing tool fails these tests instead of skipping them."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from tests.gunicorn_harness import free_port, serving, wait_for
from tests.stopping import terminate

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "cslb-rules.yaml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "cslb-rules.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "cslb.json"
PROMETHEUS_RULE = ROOT / "deploy" / "kubernetes" / "monitoring" / "prometheusrule.yaml"


def tool(name: str) -> str:
    from tests.tools import need

    return need(name)


def test_promtool_checks_the_rules() -> None:
    out = subprocess.run(
        [tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout


def test_promtool_unit_tests_every_alert() -> None:
    out = subprocess.run(
        [tool("promtool"), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULE_TESTS.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    tested = {t["alertname"] for c in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in c["alert_rule_test"]}
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert tested == alerts  # each alert has a unit test that fires it


def test_the_prometheusrule_carries_the_same_groups() -> None:
    crd = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert crd["kind"] == "PrometheusRule"
    assert crd["spec"] == yaml.safe_load(RULES.read_text())


def test_the_alerts_do_not_page_on_table_age() -> None:
    text = RULES.read_text()
    exprs = [r["expr"] for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    assert not [e for e in exprs if "cslb_table_age_seconds" in e]
    assert any("cslb_discovery_heartbeat_age_seconds" in e for e in exprs)
    assert any("cslb_endpoint_ejections_total" in e for e in exprs)


# -- the dashboard, against a real Prometheus ---------------------------------------------

NAMESPACE, JOB = "shop", "product-sets"
VARIABLES = {"$namespace": NAMESPACE, "$job": JOB, "$__rate_interval": "10s"}


def _exprs() -> list[tuple[str, str]]:
    d = json.loads(DASHBOARD.read_text())
    out = []
    for p in d["panels"]:
        for t in p["targets"]:
            expr = t["expr"]
            for k, v in VARIABLES.items():
                expr = expr.replace(k, v)
            assert "$" not in expr, expr
            out.append((p["title"], expr))
    return out


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _load(port: int, ns: str, stop: threading.Event) -> None:
    """A little load: batches through /route, and tracked calls as a user's worker makes."""
    import http.client

    from workers.routing.router import Router

    router = Router.attach(ns)
    keys = [f"sku-{i}" for i in range(50)]
    deadline = time.monotonic() + 120
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                headers = {"Content-Type": "application/json"}
                conn.request("POST", "/route", json.dumps(keys), headers)
                conn.getresponse().read()
            finally:
                conn.close()
            idx, table = router.route_table(keys)
            with router.track(idx, table, keys=keys):
                time.sleep(0.002)
            stop.wait(0.05)
    finally:
        router.close()


def test_every_dashboard_expression_returns_data_from_a_real_prometheus(tmp_path: Path) -> None:
    prometheus = tool("prometheus")
    eps = tmp_path / "eps.json"
    eps.write_text(json.dumps({"endpoints": [f"http://10.7.0.{i}:8080" for i in range(1, 11)]}))
    with serving(["--endpoints-file", str(eps)], tmp_path) as server:
        server.wait_ready(workers=2, path="/healthz")
        stop = threading.Event()
        loader = threading.Thread(target=_load, args=(server.port, server.namespace, stop))
        loader.start()
        prom_port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": JOB,
                            "static_configs": [
                                {
                                    "targets": [f"127.0.0.1:{server.port}"],
                                    # what the PodMonitor's discovery adds
                                    "labels": {"namespace": NAMESPACE, "pod": "product-sets-0"},
                                }
                            ],
                        }
                    ],
                }
            )
        )
        log = open(tmp_path / "prometheus.log", "wb")
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{prom_port}"
        try:

            def query(expr: str) -> list:
                doc = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
                assert doc["status"] == "success", doc
                return doc["data"]["result"]

            def scraped() -> bool:
                try:
                    up = query(f'up{{job="{JOB}"}}')
                    n = query(f'count_over_time(cslb_decisions_total{{job="{JOB}"}}[1m])')
                except OSError:
                    return False
                if not (up and n) or up[0]["value"][1] != "1":
                    return False
                return float(n[0]["value"][1]) >= 12

            wait_for("Prometheus to scrape cslb serve a dozen times", scraped, 60, 0.5)
            empty = []
            for title, expr in _exprs():
                result = query(expr)
                if not result:
                    empty.append((title, expr))
                for sample in result:
                    assert sample["value"][1] not in ("NaN", "+Inf", "-Inf"), (title, sample)
            assert empty == [], f"panels without data: {empty}"
            # the templating variables, as Grafana asks them
            ns_values = _get(
                f"{base}/api/v1/label/namespace/values?"
                + urllib.parse.urlencode({"match[]": "cslb_build_info"})
            )["data"]
            assert NAMESPACE in ns_values
            job_values = _get(
                f"{base}/api/v1/label/job/values?"
                + urllib.parse.urlencode({"match[]": f'cslb_build_info{{namespace="{NAMESPACE}"}}'})
            )["data"]
            assert JOB in job_values
        finally:
            stop.set()
            loader.join(10)
            terminate(proc, 20)
            log.close()
        assert server.stop()["exit"] == 0
