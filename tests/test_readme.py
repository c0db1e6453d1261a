"""The README's front page is true: its commands and its code run as written.

The two set-up commands are the ones CI runs; the ``/route`` example prints, byte for
byte, what a real ``cslb serve`` prints; the fan-out example (the README's Python, as
``myapp.py``) runs under real gunicorn against real product pods on 127.0.0.1 and answers
what the README shows, keeps every product across a killed pod, and the claims about
fallback keys hold; the screenshot is there at 1,280 px; every relative link of the
README and docs/ resolves. Every process is stopped by PID.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import lbcore
import shm
from tests.gunicorn_harness import REPO, Server, free_port, unique_namespace, wait_for

README = (REPO / "README.md").read_text(encoding="utf-8")
IDS = ["AD112G0AB-K11", 12345, "ürün-42"]


def blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def commands(block: str) -> list[str]:
    return [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]


def section(heading: str) -> str:
    start = README.index(f"\n## {heading}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end >= 0 else len(README)]


# -- the first screen ---------------------------------------------------------------------


def test_the_first_screen_has_exactly_the_two_set_up_commands_ci_runs() -> None:
    first = blocks("sh")[0]
    assert README.index(first) < 1500, "the set-up commands left the first screen"
    run, test = commands(first)
    venv = "python3 -m venv .venv && . .venv/bin/activate && "
    assert run == venv + "pip install -e . && cslb serve"
    assert test == venv + "pip install -e '.[test,sim]' && python -m pytest"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m pip install --quiet -e '.[test,sim]'" in ci  # the same extras
    assert re.search(r"^python -m pytest -q$", ci, re.M)  # the same command, quieter
    # Its comment names what the suite needs and what happens without it; CI has them.
    comment = first.splitlines()[first.splitlines().index(test) - 1]
    for need in ("kubectl >= 1.27", "Prometheus", "Chromium", "openssl", "CSLB_REQUIRE_TOOLS=1"):
        assert need in comment, need
    assert "export CSLB_REQUIRE_TOOLS=1" in ci and "kubectl >= 1.27" in ci
    for tool in ("chromium", "prometheus", "openssl"):
        assert f"apt_install {tool}" in ci


def test_the_route_example_prints_what_cslb_serve_prints(tmp_path: Path) -> None:
    intro = README[: README.index("\n## ")]
    curl = next(b for b in blocks("sh", intro) if "/route" in b)
    command, shown = curl.strip().splitlines()
    server = Server([], tmp_path=tmp_path, namespace=unique_namespace("readme"))
    try:
        server.wait_ready(workers=2, path="/readyz")
        # The published table is the example file's: wait for its first generation.
        wait_for("the first table", lambda: server.get_json("/healthz").get("generation"), 20)
        argv = shlex.split(command.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}"))
        got = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
        assert got.stdout == shown
        metrics = server.request("GET", "/metrics")[1].decode()
        for address in json.loads(shown)["endpoints"]:  # "the host's per-pod metrics"
            assert f'cslb_endpoint_occupancy{{endpoint="{address}"' in metrics
        # "Ctrl-C stops it and removes its shared memory"
        assert shm.list_segments(server.namespace)
        os.kill(server.pid, signal.SIGINT)
        assert server.proc.wait(timeout=30) == 0
        wait_for("the segments to go", lambda: not shm.list_segments(server.namespace), 10)
    finally:
        server.kill()


# -- the fan-out example ------------------------------------------------------------------


class Example:
    """Three product pods (examples/product_pod.py) and the README's myapp.py."""

    def __init__(self, tmp: Path) -> None:
        (self.code,) = blocks("python", section("The fan-out in your service"))
        (tmp / "myapp.py").write_text(self.code, encoding="utf-8")
        run = next(b for b in blocks("sh", section("The fan-out in your service")))
        self.pods_cmd, self.serve_cmd, self.curl_cmd, self.shown = run.strip().splitlines()
        self.tmp = tmp
        self.ports = [free_port() for _ in range(3)]
        self.pods = [
            subprocess.Popen(
                [sys.executable, str(REPO / "examples" / "product_pod.py"), "--port", str(p)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for p in self.ports
        ]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.endpoints = tmp / "pods.json"
        self.endpoints.write_text(json.dumps({"endpoints": [{"address": u} for u in self.urls]}))

    def serve(self, env: dict[str, str], config: bool = True) -> Server:
        """The README's gunicorn command (``-c`` dropped unless ``config``)."""
        env_part, _, cmd = self.serve_cmd.partition(" gunicorn ")
        assert env_part == "CSLB_ENDPOINTS_FILE=examples/pods.json", env_part
        args = shlex.split(cmd)
        if not config:
            args = [a for a in args if a not in ("-c", "python:workers.gunicorn_conf")]
        server = Server(
            args,
            tmp_path=self.tmp,
            namespace=unique_namespace("readme"),
            env={"CSLB_ENDPOINTS_FILE": str(self.endpoints), **env},
            gunicorn=True,
        )
        server.wait_ready(workers=1, path="/readyz")
        return server

    def get(self, server: Server) -> dict:
        assert self.curl_cmd == "curl -s http://127.0.0.1:8000/"
        status, body = server.request("GET", "/", timeout_s=10)
        assert status == 200, body
        return json.loads(body)

    def close(self) -> None:
        for p in self.pods:
            p.kill()
            p.wait(10)


@pytest.fixture
def example(tmp_path: Path):
    ex = Example(tmp_path)
    try:
        yield ex
    finally:
        ex.close()


def _pods_of(urls: list[str]) -> list[int]:
    """The port of the pod Skipper's ring gives each of the README's IDs."""
    idx = lbcore.Ring(urls).lookup(IDS)
    return [int(urls[i].rsplit(":", 1)[1]) for i in idx]


def test_the_shown_answer_is_the_example_pods_answer() -> None:
    (block,) = [b for b in blocks("sh", section("The fan-out in your service"))]
    pods_cmd, _, _, shown = block.strip().splitlines()
    listed = json.loads((REPO / "examples" / "pods.json").read_text())["endpoints"]
    urls = [e["address"] for e in listed]
    ports = [int(p) for p in re.search(r"for p in ([\d ]+);", pods_cmd).group(1).split()]
    assert urls == [f"http://127.0.0.1:{p}" for p in ports]  # the pods the loop starts
    doc = json.loads(shown)
    assert [p["pod"] for p in doc["products"]] == _pods_of(urls)
    assert [p["id"] for p in doc["products"]] == [str(i) for i in IDS]
    assert 'ids = ["AD112G0AB-K11", 12345, "ürün-42"]' in README


def test_the_fanout_example_runs_against_pods_on_127_0_0_1(example: Example) -> None:
    server = example.serve({})
    try:
        def ready() -> bool:
            doc = example.get(server)
            return doc["fallback"] == [] and doc["failed"] == {}

        wait_for("the first table and the pods", ready, 20)
        shown = json.loads(example.shown)
        for p, want in zip(shown["products"], _pods_of(example.urls), strict=True):
            p["pod"] = want  # the same answer, from this test's pods
        assert example.get(server) == shown
        # "kill one pod and its IDs come from the next pod on the ring ... ejected"
        victim = _pods_of(example.urls)[0]
        pod = example.pods[example.ports.index(victim)]
        pod.kill()
        pod.wait(10)
        reader = shm.TableReader(server.namespace)
        try:

            def ejected() -> bool:
                doc = example.get(server)
                assert doc["failed"] == {} and doc["fallback"] == [], doc
                assert victim not in {p["pod"] for p in doc["products"]}
                t = reader.table()
                return bool(t.ejected[t.endpoints.index(f"http://127.0.0.1:{victim}")])

            wait_for("the killed pod's ejection", ejected, 20, 0.1)
        finally:
            reader.close()
        result = server.stop()
        assert result["exit"] == 0 and result["segments"] == [], server.log()
    finally:
        server.kill()


def test_without_the_config_module_every_id_comes_back_in_fallback(example: Example) -> None:
    server = example.serve({}, config=False)
    try:
        assert example.get(server) == {"products": [], "fallback": IDS, "failed": {}}
    finally:
        server.kill()


def test_with_a_fallback_url_the_fanout_sends_fallback_keys_there(example: Example) -> None:
    ingress = example.ports[2]  # a pod stands in for the ingress
    env = {"CSLB_FALLBACK_URL": f"http://127.0.0.1:{ingress}", "CSLB_ENABLED": "false"}
    server = example.serve(env)
    try:
        wait_for("the table and the pods", lambda: len(example.get(server)["products"]) == 3, 20)
        doc = example.get(server)
        assert doc["fallback"] == [] and doc["failed"] == {}
        assert [p["pod"] for p in doc["products"]] == [ingress] * len(IDS)
    finally:
        server.kill()


# -- the picture and the links -------------------------------------------------------------


def test_the_status_screenshot_is_there_at_1280_px() -> None:
    (image,) = re.findall(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", section("The status page"))
    data = (REPO / image).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, _ = struct.unpack(">II", data[16:24])
    assert width == 1280


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of ``path`` (code blocks left out)."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    out = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def _links() -> list[tuple[str, str]]:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "perf" / "README.md"]
    out = []
    for doc in docs:
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if not re.match(r"[a-z]+:", target):
                out.append((str(doc.relative_to(REPO)), target))
    return out


@pytest.mark.parametrize(("doc", "target"), _links())
def test_every_relative_link_resolves(doc: str, target: str) -> None:
    path, _, anchor = target.partition("#")
    file = (REPO / doc).parent / path if path else REPO / doc
    assert file.exists(), f"{doc}: {target} does not exist"
    if anchor:
        assert anchor in _anchors(file), f"{doc}: {target}: no such heading"


def test_a_missing_tool_skips_its_tests_unless_required(monkeypatch) -> None:
    """What the test command's comment says: skip, or fail with CSLB_REQUIRE_TOOLS=1."""
    from _pytest.outcomes import Failed, Skipped

    from tests import tools

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(os.path, "exists", lambda p: False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("CSLB_REQUIRE_TOOLS", raising=False)
    for tool in ("kubectl", "prometheus", "chromium", "openssl"):
        with pytest.raises(Skipped, match=f"{tool} is not installed"):
            tools.need(tool)
    monkeypatch.setenv("CSLB_REQUIRE_TOOLS", "1")
    for tool in ("kubectl", "prometheus", "chromium", "openssl"):
        with pytest.raises(Failed, match=f"{tool} is not installed"):
            tools.need(tool)
