"""Every numeric knob accepts only what the code can use.

The whole table of declared knobs is walked (every :class:`lbcore.knobs.Knob` in every
module of cslb's packages), not a list kept by hand, so a knob added later is covered.
Hostile values are either refused by a :class:`KnobError` naming the variable, or are
in a range every consumer handles: int64 nanoseconds after CLOCK_MONOTONIC, int
milliseconds of ``poll``, ``threading`` timeouts, C ints. Then the real processes: a
value out of range stops ``cslb discovery`` and ``cslb serve`` at start with exit status 2
naming the knob, and ``cslb discovery`` with every numeric knob at the largest value it
accepts publishes."""

from __future__ import annotations

import importlib
import math
import pkgutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import shm
from lbcore.knobs import MAX_KNOB_MAGNITUDE, MAX_SECONDS, Knob, KnobError
from tests.discovery_harness import Proc, shm_namespace, wait_until

PACKAGES = ("lbcore", "shm", "discovery", "workers", "cslb")

HOSTILE = [
    "1e308",
    "-1e308",
    "1e10",
    "99999999999999999999",
    "9" * 5000,
    "4294967296",
    "2147483648",
    "-2147483649",
    "nan",
    "inf",
    "-inf",
    "1e-320",
    "-1",
    "1e19s",
]

# Candidates for "the largest value a knob accepts", largest first.
LARGE = ["1e308", "99999999999999999999", "1e10", "4294967296", "2147483647", "1e9"]
LARGE += ["1073741824", "1e7", str(int(MAX_SECONDS)), "1e6", "100000", "10000", "1000"]
LARGE += ["100", "10", "1", "0.5"]


def _declared_knobs() -> list[Knob]:
    found: dict[int, Knob] = {}
    for pkg in PACKAGES:
        root = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(root.__path__, pkg + "."):
            if info.name.endswith("__main__"):
                continue
            mod = importlib.import_module(info.name)
            for value in vars(mod).values():
                for k in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(k, Knob):
                        found[id(k)] = k
    return sorted(found.values(), key=lambda k: (k.env, id(k)))


KNOBS = _declared_knobs()


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_numeric_knob(k: Knob) -> bool:
    if _numeric(k.default):
        return True
    for raw in LARGE:
        try:
            if _numeric(k.convert(raw, "probe")):
                return True
        except KnobError:
            continue
    return False


NUMERIC = [k for k in KNOBS if _is_numeric_knob(k)]


def _largest(k: Knob) -> str:
    for raw in LARGE:
        try:
            k.convert(raw, "probe")
        except KnobError:
            continue
        return raw
    raise AssertionError(f"{k.env} accepts none of {LARGE}")


def _usable(k: Knob, value: float) -> Iterator[str]:
    """What would overflow if ``value`` reached the code (empty: nothing)."""
    if not math.isfinite(value):
        yield "not finite"
        return
    if abs(value) > MAX_KNOB_MAGNITUDE:
        yield f"{value!r} beyond a C int"
    if k.metavar == "SECONDS" or (k.name.endswith("_s") and not k.name.endswith("_per_s")):
        if value > MAX_SECONDS:
            yield f"{value!r} s beyond {MAX_SECONDS:g}"
        if round(value * 1e9) + time.monotonic_ns() >= 1 << 63:
            yield "deadline beyond int64 nanoseconds"
        if value * 1000 > (1 << 31) - 1:
            yield "poll() milliseconds beyond a C int"
        if value > threading.TIMEOUT_MAX:
            yield "beyond threading.TIMEOUT_MAX"


def test_the_table_is_walked_whole() -> None:
    envs = {k.env for k in KNOBS}
    # One per room at least, so the walk cannot silently find nothing.
    assert {"CSLB_FADE_DURATION", "CSLB_MAX_HOPS", "CSLB_DEBOUNCE", "CSLB_COUNTER_ROWS"} <= envs
    assert {"CSLB_MAX_BODY_BYTES", "CSLB_LOAD_REFRESH", "CSLB_ENDPOINTS_FILE_MAX_BYTES"} <= envs
    assert len(NUMERIC) >= 40


@pytest.mark.parametrize("k", NUMERIC, ids=lambda k: k.env)
def test_every_numeric_knob_refuses_what_the_code_cannot_use(k: Knob) -> None:
    for raw in HOSTILE:
        try:
            value = k.convert(raw, "environment")
        except KnobError as exc:
            assert k.env in str(exc), exc
            assert len(str(exc)) < 400, "the message quotes a huge value whole"
            continue
        if _numeric(value):
            problems = list(_usable(k, value))
            assert not problems, f"{k.env}={raw} accepted as {value!r}: {problems}"
    largest = k.convert(_largest(k), "environment")
    if _numeric(largest):
        assert not list(_usable(k, largest))


def _discovery_knobs() -> list[Knob]:
    from discovery.settings import DISCOVERY_KNOBS, LAYERED_KNOBS

    return [k for k in (*DISCOVERY_KNOBS, *LAYERED_KNOBS) if k in NUMERIC]


@pytest.mark.parametrize("k", _discovery_knobs(), ids=lambda k: k.env)
def test_cslb_discovery_stops_at_start_naming_the_knob(k: Knob, capsys) -> None:
    from cslb.discovery_cmd import main

    env = {"CSLB_SHM_NAMESPACE": "never-created", k.env: "1e308"}
    assert main(["--endpoint", "http://10.0.0.1:80"], env) == 2
    err = capsys.readouterr().err
    assert "start_failed" in err and k.env in err and "Traceback" not in err


def test_cslb_serve_refuses_every_knob_it_passes_on_out_of_range(capsys) -> None:
    from cslb.serve_cmd import CHILD_KNOBS, main
    from workers.master.serve import KNOBS_BY_ENV

    passed = set(KNOBS_BY_ENV) | {k.env for k in CHILD_KNOBS}
    checked = [k for k in NUMERIC if k.env in passed]
    assert len(checked) >= 40
    for k in checked:
        env = {k.env: "99999999999999999999"}
        assert main(["--print-command"], env) == 2, k.env
        err = capsys.readouterr().err
        assert k.env in err, (k.env, err)


def test_real_discovery_exits_2_naming_an_overflowing_knob() -> None:
    for env in (
        {"CSLB_FADE_DURATION": "1e308"},
        {"CSLB_FADE_DURATION": "1e10"},
        {"CSLB_MAX_HOPS": "99999999999999999999"},
    ):
        with shm_namespace() as ns:
            p = Proc(
                "discovery",
                "--endpoint",
                "http://10.0.0.1:80",
                env={"CSLB_SHM_NAMESPACE": ns, **env},
            )
            try:
                assert p.wait(60) == 2
            finally:
                p.kill()
            (line,) = p.events("start_failed")
            (name,) = env
            assert name in line["error"] and "Traceback" not in "".join(p.stderr_lines)
            assert shm.list_segments(ns) == []


def test_real_discovery_publishes_with_every_numeric_knob_at_its_largest() -> None:
    env = {k.env: _largest(k) for k in _discovery_knobs()}
    # Dependent pairs take their largest together: base <= max, interval <= window.
    with shm_namespace() as ns:
        env["CSLB_SHM_NAMESPACE"] = ns
        p = Proc("discovery", "--endpoint", "http://10.0.0.1:80", env=env)
        try:
            wait_until(lambda: p.events("publish") or p.p.poll() is not None, 60, "a publish")
            assert p.p.poll() is None, "".join(p.stderr_lines)
            (pub,) = p.events("publish")
            assert pub["generation"] == 1
            assert pub["fade_params"]["duration_s"] == MAX_SECONDS
            reader = shm.TableReader(ns)
            try:
                table = reader.table()
                assert table.generation == 1
                assert table.knobs.max_hops == int(env["CSLB_MAX_HOPS"])
            finally:
                reader.close()
            p.signal(15)
            assert p.wait(60) == 0
        finally:
            p.kill()
        assert not p.events("crashed") and not p.events("publish_failed")
