"""deploy/kubernetes, proved: rendered by kustomize offline, every object checked against the
kubernetes client's models (and the two CRDs against small schemas), the numbers the
manifests promise checked against cslb's own settings, and ``cslb discovery`` run as the
manifest configures it, in-cluster (service host/port, token, CA bundle) against the test
API server serving TLS and enforcing the manifest's Role: it works with exactly those
rights, and each right taken away shows as a named error in the log and in /healthz."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import shm
from discovery.settings import knob
from tests.app_tests.test_app import call
from tests.discovery_harness import Proc, shm_namespace, wait_until
from tests.k8s_manifests import (
    POD_IP,
    check_any,
    check_model,
    container,
    env_of,
    find,
    kustomizations,
    kustomize,
    quantity_bytes,
    render,
    render_overlay,
)
from tests.kubeapi import (
    CONFIGMAPS,
    SLICES,
    FakeKubeAPI,
    Rbac,
    configmap,
    endpoint,
    endpoint_slice,
    make_test_ca,
)
from workers.surfaces.app import CslbApp

REPO = Path(__file__).resolve().parent.parent
NS = "shop"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}


@pytest.fixture(scope="module")
def base():
    return render()


@pytest.fixture(scope="module")
def sidecar():
    return render("sidecar")


def docs_overlay(variant: str = "") -> str:
    """docs/kubernetes.md's overlay that adds the monitoring component, for ``variant``."""
    text = (REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "components:" in b]
    assert "- ../deploy/kubernetes/monitoring" in block
    if variant:
        block = block.replace("- ../deploy/kubernetes ", f"- ../deploy/kubernetes/{variant} ")
    return block


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    """The base with the monitoring component, through the docs' overlay as written."""
    return render_overlay(tmp_path_factory.mktemp("overlay"), docs_overlay())


@pytest.fixture(scope="module")
def monitored_sidecar(tmp_path_factory):
    return render_overlay(tmp_path_factory.mktemp("overlay"), docs_overlay("sidecar"))


BASE_KINDS = ["Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap"]
BASE_KINDS += ["Service", "Service", "Deployment", "Deployment"]
MONITORING_KINDS = ["PodMonitor", "PrometheusRule"]


def _check_objects(docs):
    for d in docs:
        assert check_any(d) == [], d["kind"]
        if d["kind"] == "Namespace":  # cluster-scoped: kustomize's namespace: names it
            assert d["metadata"] == {"name": NS}
        else:
            assert d["metadata"].get("namespace") == NS, d["metadata"]


def test_every_kustomization_renders_and_every_object_is_valid():
    dirs = {p.relative_to(REPO).as_posix(): p for p in kustomizations()}
    assert set(dirs) >= {f"deploy/kubernetes{v}" for v in ("", "/base", "/sidecar", "/monitoring")}
    for name, path in dirs.items():
        docs = kustomize(path)
        assert docs, name
        for d in docs:
            assert check_any(d) == [], (name, d["kind"])


def test_both_variants_apply_on_a_fresh_cluster(base, sidecar):
    """No CRDs needed, and the namespace is created (first: kubectl applies in order)."""
    for docs in (base, sidecar):
        assert sorted(d["kind"] for d in docs) == sorted(BASE_KINDS)
        assert docs[0]["kind"] == "Namespace"
        assert not {d["apiVersion"].split("/")[0] for d in docs} & {"monitoring.coreos.com"}
        _check_objects(docs)


def test_the_monitoring_component_adds_the_operators_objects(monitored, monitored_sidecar):
    for docs in (monitored, monitored_sidecar):
        assert sorted(d["kind"] for d in docs) == sorted(BASE_KINDS + MONITORING_KINDS)
        _check_objects(docs)
    app = container(find(monitored_sidecar, "Deployment", "product-sets"), "discovery")
    assert app["command"] == ["python", "-m", "cslb", "discovery"]  # the sidecar's, indeed


def test_an_overlays_namespace_renames_the_namespace_with_everything(tmp_path):
    overlay = docs_overlay().replace("resources:", "namespace: shop-staging\nresources:")
    docs = render_overlay(tmp_path, overlay)
    assert find(docs, "Namespace")["metadata"]["name"] == "shop-staging"
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {
        "shop-staging"
    }
    assert find(docs, "RoleBinding")["subjects"][0]["namespace"] == "shop-staging"


def test_the_model_check_catches_what_the_deserializer_drops(base, monitored):
    d = copy.deepcopy(find(base, "Deployment", "product-sets"))
    c = d["spec"]["template"]["spec"]["containers"][0]
    c["readinessProb"] = c.pop("readinessProbe")  # a typo kubectl apply would drop
    d["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizelimit"] = "1Gi"
    c["ports"][0]["containerPort"] = "8000"
    problems = check_any(d)
    assert any("V1Container has no field 'readinessProb'" in p for p in problems)
    assert any("V1EmptyDirVolumeSource has no field 'sizelimit'" in p for p in problems)
    assert any("containerPort: expected an integer" in p for p in problems)
    pm = copy.deepcopy(find(monitored, "PodMonitor"))
    pm["spec"]["podMetricsEndpoints"][0]["targetPort"] = 9100
    assert check_any(pm) == [
        "PodMonitor/product-sets-cslb.spec.podMetricsEndpoints[0].targetPort: unknown field"
    ]


def _grants(role):
    out = set()
    for rule in role["rules"]:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                for v in rule["verbs"]:
                    out.add((g, r, v, tuple(rule.get("resourceNames", ()))))
    return out


def test_the_role_grants_what_discovery_reads_and_nothing_that_writes(base):
    role = find(base, "Role")
    client = find(base, "Deployment", "product-sets")
    env = env_of(container(client, "app"), NS)
    cm = (env["CSLB_CONFIGMAP"],)
    assert _grants(role) == {
        ("discovery.k8s.io", "endpointslices", "list", ()),
        ("discovery.k8s.io", "endpointslices", "watch", ()),
        ("", "configmaps", "list", cm),
        ("", "configmaps", "watch", cm),
    }
    assert not {v for *_, v, _ in _grants(role)} & WRITE_VERBS
    binding = find(base, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    sa = client["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NS}]
    assert find(base, "ServiceAccount")["metadata"]["name"] == sa
    assert find(base, "ConfigMap")["metadata"]["name"] == cm[0]


def _gunicorn_flag(cmd, name, default):
    for a in cmd:
        if a.startswith(f"{name}="):
            return a.split("=", 1)[1]
    if name in cmd:
        return cmd[cmd.index(name) + 1]
    return default


def test_the_client_deployment(base, monitored):
    d = find(base, "Deployment", "product-sets")
    pod = d["spec"]["template"]["spec"]
    app = container(d, "app")
    cmd = app["command"]
    assert cmd[:3] == ["gunicorn", "-c", "python:workers.gunicorn_conf"]
    env = env_of(app, NS)
    assert env.get("CSLB_DISCOVERY", "embedded") == "embedded"
    assert env["CSLB_SERVICE"] == find(base, "Service", "catalog")["metadata"]["name"]
    # /dev/shm: memory-backed, sized, mounted; the memory limit covers it plus the workers.
    (vol,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert vol["emptyDir"]["medium"] == "Memory"
    shm_bytes = quantity_bytes(vol["emptyDir"]["sizeLimit"])
    assert {"name": "dshm", "mountPath": "/dev/shm"} in app["volumeMounts"]
    workers = int(_gunicorn_flag(cmd, "--workers", "1"))
    limit = quantity_bytes(app["resources"]["limits"]["memory"])
    # docs/kubernetes.md: limit >= /dev/shm + workers x 150 MiB + 250 MiB (master, discovery)
    assert limit >= shm_bytes + workers * 150 * 2**20 + 250 * 2**20
    assert quantity_bytes(app["resources"]["requests"]["memory"]) <= limit
    # Probes ask /readyz (serving, even when falling back), never the strict /healthz.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert app[probe]["httpGet"] == {"path": "/readyz", "port": "http"}, probe
    assert app["livenessProbe"]["failureThreshold"] * app["livenessProbe"]["periodSeconds"] >= 60
    # Shutdown: the grace period outlasts the preStop and gunicorn's graceful timeout.
    graceful = float(_gunicorn_flag(cmd, "--graceful-timeout", "30"))
    pre_stop = float(app["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > graceful + pre_stop
    # Metrics: a named port, the annotations and the PodMonitor agree on it.
    ports = {p["name"]: p["containerPort"] for p in app["ports"]}
    binds = [_gunicorn_flag([a], "--bind", "") for a in cmd if a.startswith("--bind")]
    assert {f"0.0.0.0:{p}" for p in ports.values()} <= set(binds)
    ann = d["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == ports["metrics"]
    assert ann["prometheus.io/path"] == "/metrics"
    pm = find(monitored, "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pm["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"][
        "metadata"
    ]["labels"].items()
    assert find(base, "Service", "product-sets")["spec"]["ports"][0]["targetPort"] == "http"


@pytest.fixture(scope="module")
def design_point(base):
    """Bytes of the tables and the counters at the manifests' design point (200 backend
    pods, 3 rings, counter rows for the workers), measured on segments really made."""
    import lbcore

    d = find(base, "Deployment", "product-sets")
    workers = int(_gunicorn_flag(container(d, "app")["command"], "--workers", "1"))
    eps = [f"http://10.1.{i // 250}.{i % 250 + 1}:8080" for i in range(200)]
    with shm_namespace() as ns:
        counters = shm.CounterStore.create(ns, rows=2 * workers + 4, columns=256)
        writer = shm.TableWriter(ns, counters=counters)
        try:
            now = time.monotonic_ns()
            rs = lbcore.RingSet(eps[:160]).scale_up(eps[160:180], now_ns=now)
            writer.publish(rs.scale_up(eps[180:], now_ns=now))
            sizes = {n: os.stat(f"/dev/shm{n}").st_size for n in shm.list_segments(ns)}
        finally:
            writer.close()
            counters.close(unlink=True)
    tables = sum(v for n, v in sizes.items() if ".tables" in n)
    return {"tables": tables, "counters": sum(sizes.values()) - tables, "workers": workers}


def _shm_limit(d):
    (vol,) = [v for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm"]
    return quantity_bytes(vol["emptyDir"]["sizeLimit"])


def test_the_shm_size_limit_holds_the_design_point_while_a_table_grows(base, design_point):
    """Twice the segments (a growing table or counter matrix briefly has its old segment
    next to the new one) fits."""
    used = design_point["tables"] + design_point["counters"]
    assert 2 * used <= _shm_limit(find(base, "Deployment", "product-sets")), used


def test_the_sidecar_containers_are_sized_for_what_each_writes(sidecar, design_point):
    """docs/kubernetes.md: /dev/shm pages count against the container that writes them."""
    d = find(sidecar, "Deployment", "product-sets")

    def limit(name):
        return quantity_bytes(container(d, name)["resources"]["limits"]["memory"])

    mib = 2**20
    assert limit("discovery") >= 64 * mib + 2 * design_point["tables"]
    workers = design_point["workers"]
    assert limit("app") >= workers * 150 * mib + 50 * mib + 2 * design_point["counters"]
    assert 2 * (design_point["tables"] + design_point["counters"]) <= _shm_limit(d)
    for name in ("app", "discovery"):
        c = container(d, name)
        assert quantity_bytes(c["resources"]["requests"]["memory"]) <= limit(name)


def test_the_backend_outlasts_discoverys_removal_debounce(base):
    d = find(base, "Deployment", "catalog")
    c = container(d, "catalog")
    pre_stop = float(c["lifecycle"]["preStop"]["exec"]["command"][1])
    client_env = env_of(container(find(base, "Deployment", "product-sets"), "app"), NS)
    debounce_max = float(
        client_env.get("CSLB_DEBOUNCE_MAX", knob("debounce_max_s").default)
    )
    # the README's rule: --debounce-max plus a few seconds (watch, publish, switch)
    assert pre_stop >= debounce_max + 5
    assert d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > pre_stop
    assert {"name": "http", "containerPort": 8080} in c["ports"]
    assert client_env["CSLB_PORT_NAME"] == "http"
    # docs/kubernetes.md's distroless form (the kubelet's sleep action) is valid and the same
    text = " ".join((REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8").split())
    (snippet,) = re.findall(r"`lifecycle: (\{preStop: \{sleep: \{seconds: \d+\}\}\})`", text)
    lifecycle = yaml.safe_load(snippet)
    problems: list[str] = []
    check_model(lifecycle, "V1Lifecycle", "lifecycle", problems)
    assert problems == []
    assert lifecycle["preStop"]["sleep"]["seconds"] == pre_stop


def _effective_user(pod, c):
    return {
        k: c.get("securityContext", {}).get(k, pod.get("securityContext", {}).get(k))
        for k in ("runAsUser", "runAsGroup")
    }


def test_the_sidecar_variant(sidecar):
    d = find(sidecar, "Deployment", "product-sets")
    pod = d["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    app, disc = container(d, "app"), container(d, "discovery")
    app_env, disc_env = env_of(app, NS), env_of(disc, NS)
    assert app_env["CSLB_DISCOVERY"] == "external"
    assert disc["command"] == ["python", "-m", "cslb", "discovery"]
    for k in ("CSLB_SERVICE", "CSLB_PORT_NAME", "CSLB_CONFIGMAP", "CSLB_NAMESPACE"):
        assert disc_env[k] == app_env[k], k
    assert disc_env["CSLB_SHM_NAMESPACE"] == app_env["CSLB_SHM_NAMESPACE"]
    assert _effective_user(pod, app) == _effective_user(pod, disc)
    assert _effective_user(pod, app)["runAsUser"] is not None
    assert {"name": "dshm", "mountPath": "/dev/shm"} in disc["volumeMounts"]
    assert disc["image"] == app["image"]


def test_the_readiness_path_stays_ready_on_an_empty_backend(base, tmp_path):
    """What the probes ask answers 200 while every key falls back; /healthz says 503."""
    import lbcore

    path = container(find(base, "Deployment", "product-sets"), "app")["readinessProbe"][
        "httpGet"
    ]["path"]
    with shm_namespace() as ns:
        w = shm.TableWriter(ns)
        app = CslbApp(ns)
        try:
            assert call(app, "GET", path).code == 200  # no table at all: falls back
            w.publish(lbcore.RingSet([]))
            assert call(app, "GET", "/healthz").code == 503
            r = call(app, "GET", path)
            assert r.code == 200 and r.json()["routing"] == "fallback"
        finally:
            app.close()
            w.close()


# -- discovery in-cluster, TLS, the manifest's Role enforced ---------------------------


def _api(tmp_path: Path, docs, *, drop: tuple[str, str] | None = None) -> FakeKubeAPI:
    ca, crt, key = make_test_ca(str(tmp_path))
    docs = copy.deepcopy(docs)
    if drop is not None:
        resource, verb = drop
        for rule in find(docs, "Role")["rules"]:
            if resource in rule["resources"]:
                rule["verbs"].remove(verb)
    client = find(docs, "Deployment", "product-sets")
    sa = client["spec"]["template"]["spec"]["serviceAccountName"]
    rbac = Rbac.from_manifests(docs, {"sa-token-1": f"{NS}/{sa}"})
    api = FakeKubeAPI(tls=(crt, key), rbac=rbac)
    api.bookmark_every_s = 0.3
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text("sa-token-1")
    (sa_dir / "ca.crt").write_text(Path(ca).read_text())
    (sa_dir / "namespace").write_text(NS)
    api.sa_dir = str(sa_dir)  # type: ignore[attr-defined]
    return api.start()


def _discovery(
    api: FakeKubeAPI, docs, ns: str, *, pod_ip: str = POD_IP, ramp: str | None = None
) -> Proc:
    """``cslb discovery`` with the client container's environment, in-cluster."""
    env = env_of(container(find(docs, "Deployment", "product-sets"), "app"), NS, pod_ip)
    env.pop("CSLB_DISCOVERY", None)
    if ramp is not None:
        env["CSLB_ZONE_RAMP"] = ramp
    env.update(
        {
            "CSLB_SHM_NAMESPACE": ns,  # this test's own
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(api.port),
            "CSLB_SERVICE_ACCOUNT_DIR": api.sa_dir,  # type: ignore[attr-defined]
            "KUBECONFIG": "/nonexistent",
            # faster than production, so the test takes seconds
            "CSLB_DEBOUNCE": "0.2",
            "CSLB_HEARTBEAT": "0.1",
            "CSLB_BACKOFF": "0.1",
            "CSLB_BACKOFF_MAX": "0.5",
            "CSLB_CONFIGMAP_WAIT": "1",
        }
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CSLB_", "KUBERNETES_"))}
    return Proc("discovery", env={**clean, **env}, replace_env=True)


def _backend(api: FakeKubeAPI, ips) -> None:
    api.put(
        SLICES,
        NS,
        endpoint_slice("catalog-x1", "catalog", [endpoint(ip, pod=f"catalog-{ip}") for ip in ips]),
    )


def _table(ns: str):
    try:
        with shm.TableReader(ns) as r:
            return r.table() if r.generation() else None
    except shm.ShmError:
        return None


def _stop(proc: Proc) -> None:
    proc.signal(signal.SIGTERM)
    try:
        assert proc.wait(10) == 0
    finally:
        proc.kill()


def test_discovery_runs_in_cluster_over_tls_with_exactly_the_roles_rights(tmp_path, base):
    api = _api(tmp_path, base)
    try:
        _backend(api, ["10.4.0.1", "10.4.0.2"])
        api.put(CONFIGMAPS, NS, configmap("cslb-knobs", {"CSLB_PERCENTAGE": "40"}))
        api.put(CONFIGMAPS, NS, configmap("unrelated", {"x": "y"}))
        with shm_namespace() as ns:
            proc = _discovery(api, base, ns)
            try:
                t = wait_until(lambda: _table(ns), 20, "the first table")
                assert list(t.endpoints) == ["http://10.4.0.1:8080", "http://10.4.0.2:8080"]
                assert t.knobs.percentage == 40.0  # read from the ConfigMap
                _backend(api, ["10.4.0.1", "10.4.0.2", "10.4.0.3"])  # through the watch
                wait_until(
                    lambda: (_table(ns) is not None and len(_table(ns).endpoints) == 3),
                    20,
                    "the watched change",
                )
                app = CslbApp(ns)
                try:
                    r = call(app, "GET", "/healthz")
                    assert r.code == 200, r.json()
                finally:
                    app.close()
            finally:
                _stop(proc)
        assert api.forbidden == []
        assert not proc.events("api_error"), proc.events("api_error")
        used = {(r.op, r.resource) for r in api.requests}
        assert used == {
            ("list", SLICES),
            ("watch", SLICES),
            ("list", CONFIGMAPS),
            ("watch", CONFIGMAPS),
        }
        # the ConfigMap is only ever asked for by name
        assert {
            r.query.get("fieldSelector") for r in api.requests if r.resource == CONFIGMAPS
        } == {"metadata.name=cslb-knobs"}
    finally:
        api.stop()


FULL = {SLICES: "endpointslices.discovery.k8s.io", CONFIGMAPS: "configmaps"}


@pytest.mark.parametrize(
    ("resource", "verb"),
    [(SLICES, "list"), (SLICES, "watch"), (CONFIGMAPS, "list"), (CONFIGMAPS, "watch")],
)
def test_each_right_taken_away_is_named_in_the_log_and_in_healthz(
    tmp_path, base, resource, verb
):
    api = _api(tmp_path, base, drop=(resource, verb))
    try:
        _backend(api, ["10.4.0.1"])
        api.put(CONFIGMAPS, NS, configmap("cslb-knobs", {"CSLB_PERCENTAGE": "40"}))
        with shm_namespace() as ns:
            proc = _discovery(api, base, ns)
            app = CslbApp(ns)
            try:

                def forbidden():
                    return [e for e in proc.events("api_error") if e.get("status") == 403]

                (err, *_) = wait_until(forbidden, 20, "a 403 in the log")
                assert err["level"] == "error"
                want = {"verb": verb, "resource": FULL[resource], "namespace": NS}
                assert err["forbidden"] == want
                assert f"verb '{verb}' on '{FULL[resource]}'" in err["hint"]
                # the hint's manifest is in the repository and grants that verb
                (hinted,) = re.findall(r"see (\S+\.yaml)", err["hint"])
                role = yaml.safe_load_all((REPO / hinted).read_text(encoding="utf-8"))
                (rule,) = [
                    r
                    for d in role
                    if d["kind"] == "Role"
                    for r in d["rules"]
                    if resource in r["resources"]
                ]
                assert verb in rule["verbs"]
                assert f'cannot {verb} resource "{resource}"' in err["error"]

                def healthz():
                    r = call(app, "GET", "/healthz")
                    named = f"forbidden to {verb} {FULL[resource]}" in r.json()["reason"]
                    return r if named else None

                r = wait_until(healthz, 20, "/healthz to say why")
                assert r.code == 503
                doc = r.json()
                assert f"namespace {NS}" in doc["discovery_problem"]
                assert re.search(r"\(for \d+ s\)$", doc["discovery_problem"])
            finally:
                app.close()
                _stop(proc)
        assert {(r.op, r.resource) for r in api.forbidden} == {(verb, resource)}
    finally:
        api.stop()


def test_the_docs_image_recipe_matches_the_manifests(base, sidecar):
    """docs/kubernetes.md's Dockerfile runs as the manifests' user, and its check command
    (run here) names the kernel this interpreter routes on."""
    import lbcore

    text = (REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    (dockerfile,) = re.findall(r"```dockerfile\n(.*?)```", text, re.S)
    (user,) = re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.M)
    for docs in (base, sidecar):
        d = find(docs, "Deployment", "product-sets")
        pod = d["spec"]["template"]["spec"]
        for c in pod["containers"]:
            want = _effective_user(pod, c)
            assert (str(want["runAsUser"]), str(want["runAsGroup"])) == user, c["name"]
    assert "pip wheel" in dockerfile and "--no-index --find-links" in dockerfile
    (check,) = re.findall(r'python -c "(import lbcore; print\(lbcore\.kernel_name\(\)\))"', text)
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == lbcore.kernel_name() and out.returncode == 0, out.stderr
