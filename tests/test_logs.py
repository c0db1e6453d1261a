"""cslb's log lines: one format (JSON or text) in every process cslb runs; none in yours.

The format is unit-tested here (line breaks, Unicode, NaN, NumPy values, reserved
names); then a real ``cslb serve`` and a real ``gunicorn -c python:workers.gunicorn_conf``
(master, workers, the discovery process they start) are run and every line of their
output is checked: under ``CSLB_LOG_FORMAT=json`` every line, gunicorn's and uvicorn's
own included, is one of cslb's JSON lines; under ``text`` gunicorn's keep gunicorn's
format. A fresh interpreter that imports everything and attaches a router shows the
library leaves the root logger alone.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lbcore.knobs import LOG_FORMAT, LOG_LEVEL, KnobError
from lbcore.logformat import Event, Formatter, iso_utc, render
from tests.gunicorn_harness import REPO, serving, unique_namespace
from workers.master import logs

TS = 1_746_091_800.1234  # 2025-05-01T09:30:00.123Z
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
GUNICORN_LINE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}\] \[\d+\] \[[A-Z]+\] ")
TEXT_LINE = re.compile(
    rf"({ISO.pattern}) (DEBUG|INFO|WARNING|ERROR|CRITICAL) +(cslb\.[a-z_.]+) ([a-z_]+) pid=(\d+)"
)
LEVELS = {"debug", "info", "warning", "error", "critical"}


# -- the format --------------------------------------------------------------------------


def test_json_lines_start_with_the_five_keys_and_stay_one_ascii_line():
    nasty = "a\nb\u2028c\x85d ürün"
    line = render(
        "json",
        TS,
        "warning",
        "cslb.router",
        "cslb_call_failed",
        {
            "product_id": nasty,
            "load": np.float64(0.5),
            "slot": np.int32(3),
            "shares": np.array([0.25, 1.0]),
            "latency_s": float("nan"),
            "level": "shadowed",
            "pid": 7,
        },
        pid=42,
    )
    assert line.isascii() and len(line.splitlines()) == 1
    doc = json.loads(line)
    assert list(doc)[:5] == ["timestamp", "level", "logger", "event", "pid"]
    assert doc["timestamp"] == "2025-05-01T09:30:00.123Z" == iso_utc(TS)
    assert (doc["level"], doc["logger"], doc["event"], doc["pid"]) == (
        "warning",
        "cslb.router",
        "cslb_call_failed",
        42,
    )
    assert doc["product_id"] == nasty and doc["load"] == 0.5 and doc["slot"] == 3
    assert doc["shares"] == [0.25, 1.0] and doc["latency_s"] is None  # strict JSON: no NaN
    assert doc["field_level"] == "shadowed" and doc["field_pid"] == 7  # never overwritten


def test_a_field_repeating_the_writers_pid_is_not_written_twice():
    doc = json.loads(render("json", TS, "info", "cslb.x", "e", {"pid": 42, "a": 1}, pid=42))
    assert doc == {
        "timestamp": iso_utc(TS),
        "level": "info",
        "logger": "cslb.x",
        "event": "e",
        "pid": 42,
        "a": 1,
    }


def test_text_lines_are_readable_and_never_break():
    line = render(
        "text",
        TS,
        "info",
        "cslb.discovery",
        "publish",
        {"generation": 7, "reason": "endpoints changed", "sku": "ürün-42", "odd": "x\u2028y"},
        pid=42,
    )
    assert line == (
        "2025-05-01T09:30:00.123Z INFO    cslb.discovery publish pid=42 generation=7 "
        'reason="endpoints changed" sku=ürün-42 odd="x\\u2028y"'
    )
    assert len(line.splitlines()) == 1
    assert TEXT_LINE.match(line)


def test_formats_and_levels_are_knobs_every_room_reads():
    assert (LOG_FORMAT.env, LOG_FORMAT.default) == ("CSLB_LOG_FORMAT", "json")
    assert LOG_FORMAT.convert("TEXT", "test") == "text"
    with pytest.raises(KnobError, match=r"CSLB_LOG_FORMAT='xml'.*expected one of json, text"):
        LOG_FORMAT.convert("xml", "environment")
    assert LOG_LEVEL.env == "CSLB_LOG_LEVEL"
    with pytest.raises(ValueError, match="log format 'xml'"):
        render("xml", TS, "info", "cslb.x", "e")


def _record(msg, *args, exc_info=None, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("cslb.master", logging.ERROR, __file__, 1, msg, args, exc_info)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_formatter_renders_events_structured_records_and_plain_ones():
    f = Formatter("json")
    doc = json.loads(f.format(_record(Event("discovery_exited", discovery_pid=9, exit="x"))))
    assert (doc["event"], doc["discovery_pid"], doc["exit"]) == ("discovery_exited", 9, "x")
    assert (
        doc["pid"] == os.getpid()
        and doc["logger"] == "cslb.master"
        and ISO.fullmatch(doc["timestamp"])
    )
    doc = json.loads(f.format(_record("%s", "{}", cslb={"event": "cslb_call_failed", "i": 1})))
    assert (doc["event"], doc["i"]) == ("cslb_call_failed", 1)
    try:
        raise RuntimeError("boom\nline 2")
    except RuntimeError:
        rec = _record("no table in %s", "ns", exc_info=sys.exc_info())
    doc = json.loads(f.format(rec))
    assert (doc["event"], doc["message"]) == ("log", "no table in ns")
    assert "RuntimeError: boom" in doc["exception"]
    text = Formatter("text").format(rec)
    assert len(text.splitlines()) == 1 and TEXT_LINE.match(text)
    # What another handler shows for an Event message: the text body.
    assert str(Event("a_b", x="1 2", n=3)) == 'a_b x="1 2" n=3'


# -- installing in a process cslb runs ----------------------------------------------------


@pytest.fixture
def cslb_logger():
    """The ``cslb`` logger, restored afterwards (install() changes it)."""
    log = logging.getLogger("cslb")
    saved = (list(log.handlers), log.level, log.propagate)
    root = logging.getLogger()
    root_saved = (list(root.handlers), root.level)
    yield log
    log.handlers[:] = saved[0]
    log.setLevel(saved[1])
    log.propagate = saved[2]
    assert (list(root.handlers), root.level) == root_saved  # never touched


def test_install_writes_cslb_lines_only_and_is_idempotent(cslb_logger):
    buf = io.StringIO()
    h = logs.install({"CSLB_LOG_FORMAT": "text"}, buf)
    assert h is not None and cslb_logger.handlers == [h] and not cslb_logger.propagate
    assert logs.install({}, buf) is h and cslb_logger.handlers == [h]  # again: json now
    logging.getLogger("cslb.master").info(Event("master_started", counters="created"))
    logging.getLogger("cslb.master").debug(Event("hidden"))
    logging.getLogger("someone.else").warning("not ours")
    (line,) = buf.getvalue().splitlines()
    assert json.loads(line)["event"] == "master_started"
    logs.install({"CSLB_LOG_LEVEL": "debug"}, buf)
    logging.getLogger("cslb.master").debug(Event("shown"))
    assert json.loads(buf.getvalue().splitlines()[-1])["event"] == "shown"
    with pytest.raises(KnobError, match="CSLB_LOG_LEVEL"):
        logs.install({"CSLB_LOG_LEVEL": "loud"})


def test_install_leaves_a_cslb_logger_configured_by_the_user(cslb_logger):
    theirs = logging.StreamHandler(io.StringIO())
    cslb_logger.handlers[:] = [theirs]
    assert logs.install({}) is None
    assert cslb_logger.handlers == [theirs] and cslb_logger.propagate


LIBRARY = r"""
import json, logging, sys
import lbcore, shm, discovery, discovery.events, workers, workers.gunicorn_conf, workers.app
from workers import Router

ns = sys.argv[1]
w = shm.TableWriter(ns)
w.publish(lbcore.RingSet(["http://10.9.0.1:80", "http://10.9.0.2:80"]))
store = shm.CounterStore.create(ns, rows=4)
try:
    r = Router.attach(ns)
    idx, table = r.route_table(["a", "b"])
    with r.track(idx, table, ["a", "b"]) as t:
        t.fail(0)  # a failure line on cslb.router
    r.close()
finally:
    store.close(unlink=True)
    w.close(unlink=True)
root = logging.getLogger()
cslb = logging.getLogger("cslb")
print(json.dumps({
    "routed": [int(i) for i in idx],
    "root": [len(root.handlers), root.level],
    "cslb": [len(cslb.handlers), cslb.level, cslb.propagate],
    "cslb_children": sorted(
        n for n, lg in logging.root.manager.loggerDict.items()
        if n.startswith("cslb.") and isinstance(lg, logging.Logger) and lg.handlers
    ),
}))
"""


def test_as_a_library_cslb_configures_no_logger():
    """Importing every room and attaching, routing and tracking leave logging as it was."""
    ns = unique_namespace("lg")
    p = subprocess.run(
        [sys.executable, "-c", LIBRARY, ns],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("CSLB_")},
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert all(i >= 0 for i in got["routed"])
    assert got["root"] == [0, logging.WARNING]
    assert got["cslb"] == [0, logging.NOTSET, True]
    assert got["cslb_children"] == []
    # Unconfigured, Python's last-resort handler prints the warning's message: the
    # failure line's JSON fields, as before.
    (line,) = [ln for ln in p.stderr.splitlines() if "cslb_call_failed" in ln]
    assert json.loads(line)["event"] == "cslb_call_failed"


def _gunicorn_logger(monkeypatch, log_format: str, **settings):
    import gunicorn.config

    import workers.gunicorn_conf as conf

    monkeypatch.setenv("CSLB_LOG_FORMAT", log_format)
    cfg = gunicorn.config.Config()
    cfg.set("logger_class", conf.logger_class)
    cfg.set("accesslog", "-")
    for k, v in settings.items():
        cfg.set(k, v)
    for name in ("gunicorn.error", "gunicorn.access"):  # gunicorn's loggers are global
        monkeypatch.setattr(logging.getLogger(name), "handlers", [])
    return cfg.logger_class(cfg)


@pytest.mark.parametrize("statsd", [False, True], ids=["plain", "statsd"])
def test_gunicorns_logger_class_writes_cslb_json_and_keeps_statsd(monkeypatch, statsd):
    from gunicorn.instrument.statsd import Statsd

    extra = {"statsd_host": "127.0.0.1:9"} if statsd else {}
    glog = _gunicorn_logger(monkeypatch, "json", **extra)
    assert isinstance(glog, Statsd) is statsd  # as gunicorn switches its default logger
    for log in (glog.error_log, glog.access_log):
        (handler,) = log.handlers
        assert isinstance(handler.formatter, Formatter) and handler.formatter.log_format == "json"
    glog.setup(glog.cfg)  # a reload (SIGHUP) makes the handlers again: still cslb's
    assert isinstance(glog.error_log.handlers[0].formatter, Formatter)
    record = logging.LogRecord("gunicorn.error", logging.INFO, "x", 1, "Booting %s", (7,), None)
    doc = json.loads(glog.error_log.handlers[0].format(record))
    assert (doc["logger"], doc["event"], doc["message"]) == ("gunicorn.error", "log", "Booting 7")
    if statsd:
        glog.sock.close()
    text = _gunicorn_logger(monkeypatch, "text")  # text: gunicorn's lines as gunicorn has them
    assert not isinstance(text.error_log.handlers[0].formatter, Formatter)


# -- real processes ------------------------------------------------------------------------


def _lines(server) -> list[str]:
    return server.log_path.read_text(errors="replace").splitlines()


def _run_and_hit(server, n: int = 8) -> list[dict]:
    server.wait_ready(workers=2)
    answers = [server.get_json("/") for _ in range(n)]
    assert all(a["routed"] and min(a["routed"]) >= 0 for a in answers)  # routed by cslb
    return answers


def _check_processes(pids: dict[str, set[int]], server, answers: list[dict]) -> None:
    """Lines came from the master, from workers and from the discovery process."""
    master = server.pid
    workers = {a["pid"] for a in answers}
    assert master in pids["cslb.master"] and master in pids["cslb.supervisor"]
    # (a worker that answered none of the requests may still have logged: only the
    # answering ones are known, so: some answering worker logged, and no other process)
    assert pids["cslb.router"] & workers, (pids["cslb.router"], workers)
    assert pids["cslb.discovery"] and not pids["cslb.discovery"] & (workers | {master})
    assert not pids["cslb.router"] & (pids["cslb.discovery"] | {master})


#: gunicorn's own lines every server writes from start to a SIGTERM stop (under JSON: the
#: ``message`` of logger ``gunicorn.error``, event ``log``).
GUNICORN_MESSAGES = (
    "Starting gunicorn",
    "Listening at",
    "Using worker",
    "Booting worker",
    "Handling signal",
    "Shutting down",
)


def _json_lines(server) -> list[dict]:
    """Every line of the tree's stdout and stderr, each one of cslb's JSON lines."""
    docs = []
    for line in _lines(server):
        doc = json.loads(line)  # every line: no plain text, not gunicorn's own format
        assert list(doc)[:5] == ["timestamp", "level", "logger", "event", "pid"], line
        assert ISO.fullmatch(doc["timestamp"]) and doc["level"] in LEVELS, line
        assert re.fullmatch(r"[a-z_]+", doc["event"]), line
        docs.append(doc)
    return docs


def _foreign_lines(docs: list[dict]) -> dict[str, list[str]]:
    """Messages of the lines that are not cslb's, by logger (gunicorn's, uvicorn's)."""
    out: dict[str, list[str]] = {}
    for doc in docs:
        if not doc["logger"].startswith("cslb."):
            assert doc["event"] == "log" and isinstance(doc["message"], str), doc
            out.setdefault(doc["logger"], []).append(doc["message"])
    return out


def _check_gunicorn_lines(foreign: dict[str, list[str]], worker: str) -> None:
    errors = foreign["gunicorn.error"]
    for start in GUNICORN_MESSAGES:
        assert any(m.startswith(start) for m in errors), (start, errors)
    assert f"Using worker: {worker}" in errors


def test_cslb_serve_writes_every_line_of_every_process_as_json(tmp_path: Path):
    with serving(["--app", "logapp:app", "--workers", "2"], tmp_path) as server:
        answers = _run_and_hit(server)
        result = server.stop()
        assert result["exit"] == 0, server.log()
    docs = _json_lines(server)
    pids: dict[str, set[int]] = {}
    events: set[str] = set()
    for doc in docs:
        if doc["logger"].startswith("cslb."):
            pids.setdefault(doc["logger"], set()).add(doc["pid"])
            events.add(doc["event"])
    assert sum(map(len, pids.values())) and len(events) > 5
    _check_processes(pids, server, answers)
    assert {"master_started", "discovery_started", "publish", "cslb_call_failed"} <= events
    assert {"discovery_stopped", "stopped"} <= events  # and on the way out
    foreign = _foreign_lines(docs)
    assert set(foreign) == {"gunicorn.error"}, foreign  # (no access log unless asked for)
    _check_gunicorn_lines(foreign, "sync")
    # Inside the worker: cslb's handler on its own logger, the root logger untouched.
    for a in answers:
        assert a["root"] == {"handlers": [], "level": logging.WARNING}
        assert a["cslb"] == {"handlers": ["_CslbHandler"], "propagate": False}


@pytest.mark.parametrize(
    "worker_args, app, worker",
    [
        (["-k", "gthread", "--threads", "2"], "logapp:app", "gthread"),
        (["-k", "uvicorn_worker.UvicornWorker"], "userasgi:app", "uvicorn_worker.UvicornWorker"),
    ],
    ids=["gthread", "uvicorn"],
)
def test_the_config_module_writes_gunicorns_and_uvicorns_lines_as_json_too(
    tmp_path: Path, worker_args, app, worker
):
    """gunicorn's error and access logs (and the uvicorn worker's loggers, which share
    their handlers) in cslb's JSON format, on stderr and stdout alike."""
    args = ["-c", "python:workers.gunicorn_conf", "--workers", "2", *worker_args]
    args += ["--access-logfile", "-", app]
    uvicorn = "uvicorn" in worker
    with serving(args, tmp_path, gunicorn=True, env={"CSLB_LOG_FORMAT": "json"}) as server:
        server.wait_ready(workers=2, path="/hello" if uvicorn else "/")
        for _ in range(4):
            status, _ = server.request("GET", "/hello" if uvicorn else "/")
            assert status == 200
        result = server.stop()
        assert result["exit"] == 0, server.log()
    foreign = _foreign_lines(_json_lines(server))
    _check_gunicorn_lines(foreign, worker)
    access = "uvicorn.access" if uvicorn else "gunicorn.access"
    assert sum(" 200" in m and "GET /" in m for m in foreign[access]) >= 4, foreign
    if uvicorn:
        assert any("Application startup complete" in m for m in foreign["uvicorn.error"])
        assert set(foreign) == {"gunicorn.error", "uvicorn.error", "uvicorn.access"}
    else:
        assert set(foreign) == {"gunicorn.error", "gunicorn.access"}


def test_a_users_logging_config_keeps_gunicorns_lines_theirs(tmp_path: Path):
    """``--log-config-json`` (here for a logger of the user's own): gunicorn's lines are
    left as the user's config has them, gunicorn's format; cslb's stay cslb's JSON."""
    conf = tmp_path / "logging.json"
    conf.write_text(
        json.dumps(
            {
                "version": 1,
                "handlers": {"out": {"class": "logging.StreamHandler"}},
                "loggers": {"shop": {"handlers": ["out"], "level": "INFO"}},
                "root": {"handlers": [], "level": "WARNING"},
            }
        )
    )
    args = ["-c", "python:workers.gunicorn_conf", "--log-config-json", str(conf), "logapp:app"]
    with serving(args, tmp_path, gunicorn=True) as server:
        server.wait_ready(workers=1)
        result = server.stop()
        assert result["exit"] == 0, server.log()
    theirs = [line for line in _lines(server) if GUNICORN_LINE.match(line)]
    assert any("Booting worker" in line for line in theirs), server.log()
    rest = [json.loads(line) for line in _lines(server) if not GUNICORN_LINE.match(line)]
    assert rest and all(doc["logger"].startswith("cslb.") for doc in rest)


def test_the_config_module_writes_text_lines_with_cslb_log_format_text(tmp_path: Path):
    args = ["-c", "python:workers.gunicorn_conf", "--workers", "2", "logapp:app"]
    env = {"CSLB_LOG_FORMAT": "text"}
    with serving(args, tmp_path, gunicorn=True, env=env) as server:
        answers = _run_and_hit(server)
        result = server.stop()
        assert result["exit"] == 0, server.log()
    pids: dict[str, set[int]] = {}
    theirs = []
    for line in _lines(server):
        if GUNICORN_LINE.match(line):
            assert "cslb" not in line, line
            theirs.append(line)
            continue
        m = TEXT_LINE.match(line)
        assert m, line
        pids.setdefault(m.group(3), set()).add(int(m.group(5)))
        assert not line.startswith("{")
    _check_processes(pids, server, answers)
    for start in GUNICORN_MESSAGES:  # text mode: gunicorn's lines are gunicorn's as usual
        assert any(start in line for line in theirs), (start, theirs)


# -- the docs --------------------------------------------------------------------------------


def _logs_section() -> str:
    doc = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    start = doc.index("## Logs\n")
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end >= 0 else len(doc)]


def _event_names(paths: list[Path], *, event_calls: bool) -> set[str]:
    """Event names in the source: ``Event("name", ...)`` or ``log.info("name", ...)``."""
    import ast

    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            first, f = node.args[0], node.func
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            if not re.fullmatch(r"[a-z_]+", first.value):
                continue
            if event_calls and isinstance(f, ast.Name) and f.id == "Event":
                names.add(first.value)
            if not event_calls and isinstance(f, ast.Attribute):
                if f.attr in ("debug", "info", "warning", "error"):
                    names.add(first.value)
    return names


def test_readme_logs_section_names_every_event_and_the_settings():
    from lbcore.knobs import LOG_KNOBS, docs_table

    doc = _logs_section()
    settings = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    table = re.search(r"<!-- log-knobs -->\n(.*?)<!-- /log-knobs -->", settings, re.S)
    assert table and table.group(1).strip() == docs_table(LOG_KNOBS)
    ours = _event_names(sorted((REPO / "workers").rglob("*.py")), event_calls=True)
    discovery = _event_names(
        [*sorted((REPO / "discovery").glob("*.py")), REPO / "cslb" / "discovery_cmd.py"],
        event_calls=False,
    )
    assert len(ours) > 20 and len(discovery) > 30
    missing = sorted(n for n in ours | discovery if f"`{n}`" not in doc)
    assert not missing, f"docs/operations.md's Logs section does not name {missing}"
    for failure in ("cslb_call_failed", "cslb_call_failures_suppressed"):
        assert f"`{failure}`" in doc
