"""A bad setting of any part stops a real gunicorn master at start with status 2.

One bad value per declared knob group (the groups the master checks itself,
:data:`workers.settings_check.ALL_GROUPS`, and discovery's, which the embedded
discovery process refuses), chosen from the group's declarations, so a group added
later is covered: ``gunicorn -c python:workers.gunicorn_conf`` exits 2 before any
worker forks, stderr names the variable and what it accepts (the knob parser's own
words), and no shared memory is left. Outside gunicorn, :meth:`Router.attach` raises
:class:`KnobError` naming the variable instead of the first fan-out failing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import shm
import shm.names
from discovery.settings import DISCOVERY_KNOBS, OUTLIER_KNOBS
from lbcore.knobs import Knob, KnobError
from tests.gunicorn_harness import APPS_DIR, REPO, free_port, unique_namespace
from workers import Router
from workers.settings_check import ALL_GROUPS, ROUTER_GROUPS, check_environment

BAD = ["-1e308", "abc", "bad/ns!"]


def _one_bad(knobs: tuple[Knob, ...]) -> tuple[str, str, str]:
    """(variable, bad value, what it accepts) for the group's first knob refusing one.

    Numeric knobs first: their message is a range.
    """
    numeric = [k for k in knobs if isinstance(k.default, int | float)]
    for k in [*numeric, *(k for k in knobs if k not in numeric)]:
        for raw in BAD:
            try:
                k.convert(raw, "environment")
            except KnobError as exc:
                return k.env, raw, str(exc).split(": ", 1)[-1]
    raise AssertionError(f"no knob of {[k.env for k in knobs]} refuses any of {BAD}")


GROUPS = [(g.name, _one_bad(g.knobs)) for g in ALL_GROUPS]
GROUPS += [("discovery", _one_bad(DISCOVERY_KNOBS)), ("outlier", _one_bad(OUTLIER_KNOBS))]
# The case that started 500s on every request instead of stopping the master.
GROUPS += [("fanout-threads-0", ("CSLB_FANOUT_THREADS", "0", "expected an integer from 1 to 1024"))]
GROUPS += [("kernel", ("CSLB_KERNEL", "bogus", "expected one of auto, native, numpy"))]


def test_every_group_is_covered() -> None:
    names = {name for name, _ in GROUPS}
    assert {"router", "fan-out", "app", "routing", "master", "discovery", "outlier"} <= names


@pytest.mark.parametrize(("group", "bad"), GROUPS, ids=[name for name, _ in GROUPS])
def test_real_gunicorn_exits_2_naming_the_variable(
    group: str, bad: tuple[str, str, str], tmp_path: Path
) -> None:
    env_name, raw, accepted = bad
    ns = unique_namespace("st")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSLB_")}
    env.update(
        {
            "CSLB_SHM_NAMESPACE": ns,
            "PYTHONPATH": os.pathsep.join([str(APPS_DIR), str(REPO)]),
            env_name: raw,
        }
    )
    argv = [sys.executable, "-m", "gunicorn", "-c", "python:workers.gunicorn_conf"]
    argv += ["--bind", f"127.0.0.1:{free_port()}", "--workers", "1", "workers.app:app"]
    try:
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done.stderr[-3000:]
        assert env_name in done.stderr and accepted in done.stderr, done.stderr[-3000:]
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        assert "Booting worker" not in done.stderr  # stopped before any worker forked
        if env_name != "CSLB_SHM_NAMESPACE":
            assert shm.list_segments(ns) == []
    finally:
        if env_name != "CSLB_SHM_NAMESPACE":
            for name in shm.list_segments(ns):
                shm.names.unlink_name(name)


def test_router_attach_raises_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside gunicorn a library raises (never exits): the caller sees which variable."""
    monkeypatch.setenv("CSLB_SHM_NAMESPACE", unique_namespace("st"))
    monkeypatch.setenv("CSLB_FANOUT_THREADS", "0")
    with pytest.raises(KnobError, match=r"CSLB_FANOUT_THREADS='0': expected an integer from 1"):
        Router.attach()
    assert Router.current() is None
    monkeypatch.setenv("CSLB_FANOUT_THREADS", "4")
    monkeypatch.setenv("CSLB_RETRY_TO", "ingress")  # a rule between two knobs
    with pytest.raises(KnobError, match="CSLB_RETRY_TO=ingress needs CSLB_FALLBACK_URL"):
        Router.attach()
    monkeypatch.delenv("CSLB_RETRY_TO")
    router = Router.attach()
    try:
        assert Router.current() is router
    finally:
        router.close()


def test_router_groups_are_what_a_router_reads() -> None:
    assert {g.name for g in ROUTER_GROUPS} == {"shared memory", "router", "fan-out"}
    check_environment({}, ALL_GROUPS)  # the defaults pass


def test_cslb_serve_stops_on_a_rule_between_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    from cslb.serve_cmd import main

    assert main(["--print-command"], {"CSLB_RETRY_TO": "ingress"}) == 2
    assert "CSLB_FALLBACK_URL" in capsys.readouterr().err
