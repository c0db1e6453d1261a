"""``--kernel`` on the commands that route: this process switches, the processes it starts too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lbcore
from cslb import route_cmd, serve_cmd, simulate_cmd
from tests.gunicorn_harness import serving

ROOT = Path(__file__).parents[1]
FAST_SIM = ["--pods", "6", "--seconds", "2", "--catalogue", "20000", "--cache-size", "300"]


@pytest.fixture
def restored(monkeypatch):
    """The process's kernel and ``CSLB_KERNEL`` put back after the test."""
    monkeypatch.setenv("CSLB_KERNEL", "auto")
    old = lbcore.kernel_name()
    yield
    lbcore.use_kernel(old)


@pytest.mark.parametrize(
    "run",
    [
        lambda: route_cmd.main(["--kernel", "numpy", "-e", "http://10.0.0.1:80", "k1", "k2"]),
        lambda: simulate_cmd.main(
            ["--scenario", "slow-pod", *FAST_SIM, "--no-progress", "--kernel", "numpy"]
        ),
    ],
    ids=["route", "simulate"],
)
def test_route_and_simulate_switch_this_process(restored, capsys, run):
    assert lbcore.kernel_name() == "native"
    assert run() == 0
    assert lbcore.kernel_name() == "numpy" and os.environ["CSLB_KERNEL"] == "numpy"
    assert capsys.readouterr().out


def test_serve_puts_the_kernel_into_the_servers_environment_only(restored):
    env: dict[str, str] = {}
    serve_cmd.command(["--kernel", "NumPy"], env, python=sys.executable)
    assert env["CSLB_KERNEL"] == "numpy"
    assert lbcore.kernel_name() == "native"  # serve itself only execs gunicorn


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--print-command"],
        ["route", "-e", "http://a:1", "k"],
        ["simulate", "--scenario", "slow-pod"],
    ],
)
def test_a_bad_kernel_is_a_usage_error_naming_it(command):
    p = subprocess.run(
        [sys.executable, "-m", "cslb", *command, "--kernel", "fast"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 2
    assert "invalid CSLB_KERNEL='fast': expected one of auto, native, numpy" in p.stderr


def test_serve_kernel_numpy_reaches_the_master_and_every_worker(tmp_path):
    eps = tmp_path / "endpoints.json"
    eps.write_text(json.dumps({"endpoints": [{"address": "http://10.9.0.1:8080"}]}))
    args = ["--kernel", "numpy", "--endpoints-file", str(eps), "--workers", "2"]
    args += ["--app", "kernelapp:app"]  # (GET /kernel: the answering worker's kernel)
    with serving(args, tmp_path, env={"CSLB_KERNEL": "native"}) as server:
        server.wait_ready(workers=2, path="/healthz")
        (started,) = server.events("master_started")
        assert started["kernel"] == "numpy"
        workers = set(server.worker_pids())
        kernels: dict[int, str] = {}
        for _ in range(400):  # bounded: connections spread over both workers soon
            doc = server.get_json("/kernel")
            kernels[doc["pid"]] = doc["kernel"]
            if set(kernels) >= workers:
                break
        assert kernels == dict.fromkeys(workers, "numpy")
        status, body = server.request("GET", "/metrics")
        assert status == 200
        assert re.findall(r'^cslb_build_info\{[^}]*kernel="(\w+)"', body.decode(), re.M) == [
            "numpy"
        ]
