"""``cslb discovery`` and ``cslb inspect`` as real processes: fake Kubernetes API on
127.0.0.1, real shared memory, a reader in the test process, SIGTERM and SIGKILL."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import lbcore
import shm
from cslb import inspect_cmd as inspect_cli
from discovery.publisher import Publisher
from discovery.ringstate import FadeParams, RingState
from discovery.static import EndpointSpec
from lbcore.knobs import defaults
from lbcore.route import route_ring_set
from tests.cslb_runs import run_cslb
from tests.discovery_harness import ROOT, Proc, segments, shm_namespace, wait_until
from tests.kubeapi import CONFIGMAPS, SLICES, configmap, endpoint, endpoint_slice
from workers.surfaces import inspect_report as inspect_cmd

NS = "shop"
S = 1_000_000_000
EXAMPLE = ROOT / "examples" / "endpoints.json"
FAST_FLAGS = [
    "--debounce",
    "0.2",
    "--heartbeat",
    "0.1",
    "--request-timeout",
    "2",
    "--connect-timeout",
    "1",
    "--watch-timeout",
    "5",
    "--backoff",
    "0.05",
    "--backoff-max",
    "0.3",
]


cslb = run_cslb


def catalog_slice(name, addrs):
    return endpoint_slice(
        name, "catalog", [endpoint(a, node=f"node-{a}", zone="eu-central-1b") for a in addrs]
    )


@pytest.fixture
def kube_bookmark_s() -> float:
    return 0.5


@pytest.fixture
def procs():
    started = []
    try:
        yield started
    finally:
        for p in started:
            p.kill()


def reader_for(ns, gen, timeout=20):
    def ready():
        try:
            r = shm.TableReader(ns)
        except shm.SegmentMissingError:
            return None
        if r.generation() >= gen:
            return r
        r.close()
        return None

    return wait_until(ready, timeout, f"generation {gen} in {ns}")


def test_discovery_process_publishes_what_a_reader_sees_and_cleans_up(kube, procs, tmp_path):
    kube.put(SLICES, NS, catalog_slice("catalog-a", ["10.3.0.1", "10.3.0.2", "10.3.0.3"]))
    kube.put(CONFIGMAPS, NS, configmap("cslb-knobs", {"CSLB_PERCENTAGE": "30"}))
    kc = kube.kubeconfig(str(tmp_path / "kc"), namespace="ignored")
    with shm_namespace() as ns:
        p = Proc(
            "discovery",
            "--kubeconfig",
            kc,
            "--namespace",
            NS,
            "--service",
            "catalog",
            "--configmap",
            "cslb-knobs",
            "--shm-namespace",
            ns,
            "--balance-factor",
            "1.5",
            *FAST_FLAGS,
        )
        procs.append(p)
        r = reader_for(ns, 1)
        try:
            t = r.table()
            want = ["http://10.3.0.1:8080", "http://10.3.0.2:8080", "http://10.3.0.3:8080"]
            assert sorted(t.endpoints) == want
            assert t.knobs.percentage == 30.0 and t.knobs.balance_factor == 1.5
            assert r.writer_pid() == p.pid and r.writer_alive()
            keys = [f"sku-{i}" for i in range(200)]
            ring = lbcore.Ring(want)
            assert [
                t.endpoints[i] for i in route_ring_set(t.ring_set, keys, time.monotonic_ns())
            ] == [want[i] for i in ring.lookup(keys)]
            kube.put(SLICES, NS, catalog_slice("catalog-b", ["10.3.0.4"]))
            wait_until(lambda: r.generation() == 2, 10, "generation 2")
            t = r.table()
            assert len(t.endpoints) == 4 and len(t.ring_set.starts_ns) == 1
            # cslb inspect sees the same table.
            ins = cslb("inspect", "--shm-namespace", ns, "--json")
            assert ins.returncode == 0, ins.stderr
            doc = json.loads(ins.stdout)
            assert doc["generation"] == 2 and doc["publisher_alive"] is True
            assert doc["writer_pid"] == p.pid and doc["knobs"]["percentage"] == 30.0
            by = {e["address"]: e for e in doc["endpoints"]}
            assert by["http://10.3.0.4:8080"]["tier"] == 1
            assert by["http://10.3.0.4:8080"]["node"] == "node-10.3.0.4"
            assert by["http://10.3.0.1:8080"]["zone"] == "eu-central-1b"
            assert len({e["slot"] for e in doc["endpoints"]}) == 4
            (ring1,) = doc["fading_rings"]
            assert ring1["added"] == ["http://10.3.0.4:8080"] and 0 <= ring1["share"] < 1
            text = cslb("inspect", "--shm-namespace", ns)
            assert text.returncode == 0
            assert "generation 2" in text.stdout and "alive" in text.stdout
            assert "ring 1: +1 endpoint(s)" in text.stdout and "node-10.3.0.4" in text.stdout
        finally:
            r.close()
        p.signal(signal.SIGTERM)
        assert p.wait(10) == 0
        assert segments(ns) == []  # SIGTERM unlinked everything it owned
        names = [e["event"] for e in p.events()]
        assert names[0] == "started" and names[-2:] == ["stopping", "stopped"]
        assert "publish" in names and "endpoint_added" in names
        stopped = p.events("stopped")[0]
        assert stopped["unlinked"] is True and stopped["generation"] == 2
        # every stderr line is one JSON object
        assert all(json.loads(line) for line in p.stderr_lines)


def test_sigkill_leaves_the_table_and_the_next_process_takes_over(procs, tmp_path):
    f = tmp_path / "eps.yaml"
    f.write_text("- http://10.7.0.1:80\n- http://10.7.0.2:80\n")
    with shm_namespace() as ns:
        args = ["discovery", "--endpoints-file", str(f), "--shm-namespace", ns, *FAST_FLAGS]
        p = Proc(*args)
        procs.append(p)
        r = reader_for(ns, 1)
        r.close()
        p.signal(signal.SIGKILL)
        p.wait(10)
        assert segments(ns)  # still there: workers keep routing
        ins = cslb("inspect", "--shm-namespace", ns, "--json", "--stale-after", "0.5")
        assert ins.returncode == 3
        assert json.loads(ins.stdout)["publisher_alive"] is False
        p2 = Proc(*args)
        procs.append(p2)
        wait_until(lambda: p2.events("publish_skipped"), 10, "takeover comparison")
        r = shm.TableReader(ns)
        try:
            assert r.generation() == 1 and r.writer_pid() == p2.pid
            assert json.loads(cslb("inspect", "--shm-namespace", ns, "--json").stdout)[
                "publisher_alive"
            ]
        finally:
            r.close()
        p2.signal(signal.SIGTERM)
        assert p2.wait(10) == 0 and segments(ns) == []


def test_static_file_is_the_default_that_runs_without_a_cluster(procs):
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST",)}
    env.update(CSLB_SERVICE="", CSLB_ENDPOINTS_FILE="")
    with shm_namespace() as ns:
        p = Proc("discovery", "--shm-namespace", ns, env=env)  # no source given
        procs.append(p)
        r = reader_for(ns, 1)
        try:
            want = [e["address"] for e in json.loads(EXAMPLE.read_text())["endpoints"]]
            assert sorted(r.table().endpoints) == sorted(want)
        finally:
            r.close()
        (default,) = p.events("endpoints_file_default")
        assert default["path"] == str(EXAMPLE) and default["level"] == "warning"
        p.signal(signal.SIGINT)
        assert p.wait(10) == 0 and segments(ns) == []


def test_no_default_source_inside_a_cluster():
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1"}
    p = cslb("discovery", env=env)
    assert p.returncode == 2
    assert "no endpoint source" in p.stderr and "inside a cluster" in p.stderr


def test_sigterm_is_prompt_while_every_list_hangs(kube, procs, tmp_path):
    # The API server accepts both lists and never answers; the read timeout is long.
    kube.fail("list", SLICES, "hang", times=-1)
    kube.fail("list", CONFIGMAPS, "hang", times=-1)
    kc = kube.kubeconfig(str(tmp_path / "kc"), namespace=NS)
    with shm_namespace() as ns:
        p = Proc(
            "discovery",
            "--kubeconfig",
            kc,
            "--service",
            "catalog",
            "--configmap",
            "knobs",
            "--shm-namespace",
            ns,
            "--request-timeout",
            "60",
        )
        procs.append(p)
        kube.wait_for_requests("list", SLICES, 1, timeout=20)
        kube.wait_for_requests("list", CONFIGMAPS, 1, timeout=20)
        time.sleep(0.2)  # both informer threads now wait for an answer
        t0 = time.monotonic()
        p.signal(signal.SIGTERM)
        assert p.wait(15) == 0
        assert time.monotonic() - t0 < 2.0  # not the 5 s per informer a join waited
        assert segments(ns) == []
        assert not p.events("informers_not_stopped") and not p.events("api_error")
        assert p.events("stopped")[0]["clean"] is True


def test_a_second_publisher_is_refused(procs):
    with shm_namespace() as ns:
        p = Proc("discovery", "-e", "http://10.0.0.1:80", "--shm-namespace", ns)
        procs.append(p)
        reader_for(ns, 1).close()
        second = cslb("discovery", "-e", "http://10.0.0.1:80", "--shm-namespace", ns)
        assert second.returncode == 1
        assert "cannot publish into shared memory" in second.stderr
        assert str(p.pid) in second.stderr
        p.signal(signal.SIGTERM)
        assert p.wait(10) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-e", "http://a:1", "--debounce", "soon"], "invalid CSLB_DEBOUNCE='soon'"),
        (["-e", "http://a:1", "--percentage", "140"], "percentage from 0 to 100"),
        (["-e", "http://a:1", "-e", "http://a:1"], "listed twice"),
        (["-e", "http://a:1", "--shm-namespace", "a/b"], "--shm-namespace"),
        (["--service", "x", "--kubeconfig", "/nonexistent/kc"], "/nonexistent/kc"),
    ],
)
def test_bad_arguments_exit_2_naming_the_problem(args, message):
    p = cslb("discovery", *args)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr


def test_environment_variables_configure_the_process():
    env = {**os.environ, "CSLB_DEBOUNCE": "-3"}
    p = cslb("discovery", "-e", "http://a:1", env=env)
    assert p.returncode == 2 and "environment: invalid CSLB_DEBOUNCE='-3'" in p.stderr


def test_inspect_without_tables():
    with shm_namespace() as ns:
        p = cslb("inspect", "--shm-namespace", ns)
        assert p.returncode == 1 and "no routing tables" in p.stderr and ns in p.stderr


def test_help_lists_every_setting_and_knob():
    out = cslb("discovery", "--help").stdout
    for flag in ["--service", "--port-name", "--configmap", "--debounce", "--enabled"]:
        assert flag in out
    assert "CSLB_ENABLED" in out and "CSLB_REQUEST_TIMEOUT" in out
    usage = cslb().stdout + cslb("--help").stdout
    assert "discovery" in usage and "inspect" in usage


def test_worker_side_modules_do_not_import_the_kubernetes_client():
    code = (
        "import sys, workers.surfaces.inspect_report, discovery.publisher, discovery.service, "
        "discovery.static, discovery.ringstate, cslb.route_cmd, cslb.inspect_cmd; "
        "bad = [m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture
def published():
    """Publishes tables from this process: n established pods and a fading ring of 2."""
    with contextlib.ExitStack() as stack:

        def publish(n=10, fade_mode="n-ring"):
            ns = stack.enter_context(shm_namespace())
            pub = Publisher(ns)
            stack.callback(pub.close, unlink=True)
            knobs = {**defaults(), "fade_mode": fade_mode}
            st = RingState(FadeParams.from_knobs(knobs))
            specs = [
                EndpointSpec(f"http://10.4.{i // 250}.{i % 250}:8080", "z", "n") for i in range(n)
            ]
            now = time.monotonic_ns()
            st.commit(st.transition(specs, now - 20 * S))
            new = [EndpointSpec("http://10.5.0.1:8080"), EndpointSpec("http://10.5.0.2:8080")]
            # The fading ring started 15 s ago: half way through the 30 s fade.
            pub.publish(st.transition([*specs, *new], now - 15 * S), knobs, now)
            pub.heartbeat(time.monotonic_ns())
            return ns

        yield publish


def test_inspect_shows_the_fade_mode_and_which_shares_apply(published):
    ns = published(fade_mode="skipper")
    s = inspect_cmd.snapshot(ns)
    assert s["knobs"]["fade_mode"] == "skipper"
    assert s["fade"]["mode"] == "skipper" and s["fade"]["n_ring_shares_apply"] is False
    (ring,) = s["fading_rings"]
    assert ring["added"] == ["http://10.5.0.1:8080", "http://10.5.0.2:8080"]
    assert 0.1 < ring["skipper_score"] < 0.25  # (15 s / 30 s) ** 2.5 = 0.177
    text = inspect_cmd.render_text(s)
    assert "fade_mode=skipper" in text and "fade: mode skipper" in text
    assert "N-ring shares are not used" in text and "Skipper fade-in score now" in text
    assert "share now" not in text
    ns2 = published(fade_mode="n-ring")
    s2 = inspect_cmd.snapshot(ns2)
    assert (
        s2["fade"]["n_ring_shares_apply"] is True and "skipper_score" not in s2["fading_rings"][0]
    )
    assert "share now 17." in inspect_cmd.render_text(s2)


def test_inspect_into_a_closed_pipe_ends_quietly(published):
    ns = published(n=2000)  # a JSON document far larger than a pipe's buffer
    p = subprocess.Popen(
        [sys.executable, "-m", "cslb", "inspect", "--json"],
        cwd=ROOT,
        env={**os.environ, "CSLB_SHM_NAMESPACE": ns},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert p.stdout.read(1) == b"{"
        p.stdout.close()  # `cslb inspect --json | head -c 1`
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 0, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--stale-after", "-1"], {}, "flag --stale-after: invalid CSLB_STALE_AFTER='-1'"),
        (["--stale-after", "nan"], {}, "expected a finite number"),
        (["--stale-after", "0"], {}, "expected seconds >= 0.01"),
        ([], {"CSLB_STALE_AFTER": "soon"}, "environment: invalid CSLB_STALE_AFTER='soon'"),
        (["--shm-namespace", "a/b"], {}, "invalid CSLB_SHM_NAMESPACE='a/b'"),
        ([], {"CSLB_SHM_NAMESPACE": "a b"}, "invalid CSLB_SHM_NAMESPACE='a b'"),
    ],
)
def test_inspect_rejects_bad_settings(args, env, message, capsys):
    assert inspect_cli.main(args, env) == 2
    err = capsys.readouterr().err
    assert err.startswith("cslb inspect: ") and message in err, err


def test_inspect_reads_its_namespace_from_the_environment(published, capsys):
    ns = published()
    assert inspect_cli.main(["--json"], {"CSLB_SHM_NAMESPACE": ns}) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["namespace"] == ns and len(doc["endpoints"]) == 12
