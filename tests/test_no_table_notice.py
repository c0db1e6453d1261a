"""A worker that routes every key to fallback for want of a table says so in its log.

Once when it starts, again every minute while it lasts (with how many keys fell back),
and once when a table arrives; never per request. A real gunicorn run without cslb's
config module (so without discovery) shows the line once over many requests, and the
fan-out's answer says each key is fallback with no call made.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import lbcore
from tests.gunicorn_harness import serving, unique_namespace, wait_for
from tests.router_harness import Host
from workers import Router
from workers.routing import notice


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r.msg, "event", None) == event]


def test_once_then_every_minute_then_the_end(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CSLB_FALLBACK_URL", raising=False)
    ns = unique_namespace("nt")
    clock = Clock()
    caplog.set_level(logging.INFO, logger="cslb.router")
    with Router(ns, clock=clock, threads=False) as router:
        for _ in range(50):
            assert (router.route(["a", "b", "c"]) == -1).all()
        (first,) = _lines(caplog, "no_routing_table")
        f = first.msg.fields
        assert f["shm_namespace"] == ns and f["fallback_keys"] == 3
        assert "workers.gunicorn_conf" in f["fix"] and "cslb discovery" in f["fix"]
        assert "CSLB_FALLBACK_URL is not set" in f["fallback"]
        assert first.levelno == logging.WARNING
        clock.now += int(notice.REPEAT_S * 1e9) - 1
        router.route(["a"])
        assert not _lines(caplog, "still_no_routing_table")
        clock.now += 2
        router.route(["a", "b"])
        (again,) = _lines(caplog, "still_no_routing_table")
        assert again.msg.fields["fallback_keys"] == 50 * 3 - 3 + 1 + 2
        assert again.msg.fields["lasted_s"] == pytest.approx(notice.REPEAT_S, abs=0.1)
        # A table arrives (published as discovery would) and is found within a second.
        host = Host(ns, clock)
        try:
            host.publish(lbcore.RingSet(["http://10.0.0.1:8080"]))
            clock.now += 1_010_000_000
            assert (router.route(["a"]) == 0).all()
            (end,) = _lines(caplog, "routing_table_found")
            assert end.msg.fields["fallback_keys"] == 50 * 3 + 1 + 2
        finally:
            host.close()


def test_a_stretch_after_the_end_is_new(caplog: pytest.LogCaptureFixture) -> None:
    # (A router keeps routing on its last table once one was found, so the notice alone.)
    clock = Clock()
    caplog.set_level(logging.INFO, logger="cslb.router")
    n = notice.NoTableNotice("ns", clock, lambda: "")
    n.no_table(3, None)
    clock.now += 2_000_000_000
    n.table()
    (end,) = _lines(caplog, "routing_table_found")
    assert (end.msg.fields["without_table_s"], end.msg.fields["fallback_keys"]) == (2.0, 3)
    assert not n.active
    n.table()  # no stretch: nothing to end
    assert len(_lines(caplog, "routing_table_found")) == 1
    n.no_table(1, None)
    (_, again) = _lines(caplog, "no_routing_table")  # a new stretch, its first line
    assert again.msg.fields["fallback_keys"] == 1 and n.active


def test_the_line_names_the_fallback_url_when_set(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CSLB_FALLBACK_URL", "http://ingress.example:8080")
    caplog.set_level(logging.INFO, logger="cslb.router")
    with Router(unique_namespace("nt"), threads=False) as router:
        router.route(["a"])
    (first,) = _lines(caplog, "no_routing_table")
    assert "http://ingress.example:8080" in first.msg.fields["fallback"]


def test_real_gunicorn_without_the_config_module_logs_it_once(tmp_path: Path) -> None:
    """``gunicorn fanoutapp:app``, no ``-c``: no discovery, every key fallback, one line."""
    with serving(
        ["--workers", "1", "fanoutapp:app"],
        tmp_path,
        gunicorn=True,
        env={"CSLB_LOG_FORMAT": "json"},
    ) as server:
        server.wait_ready(1, path="/metrics")
        for i in range(20):
            status, doc = server.post_json("/fanout", [f"id-{i}", i, "x"])
            assert status == 200, doc
            assert all(r["endpoint"] is None and r["attempts"] == 0 for r in doc["results"]), doc
        wait_for("the no-table line", lambda: "no_routing_table" in server.log(), 10)
        text = server.log_path.read_text()
        lines = [ln for ln in text.splitlines() if "no_routing_table" in ln]
        assert len(lines) == 1, text[-3000:]
        assert server.namespace in lines[0] and "workers.gunicorn_conf" in lines[0]
        assert "still_no_routing_table" not in text
        json.dumps(lines)  # (readable text; the worker has no cslb handler here)
