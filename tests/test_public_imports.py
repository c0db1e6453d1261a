"""Every public spelling of the workers room that the README, docs, examples and deploy
files show keeps working, wherever the code behind it lives."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHOWN_IN = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "examples").glob("*.py")),
    *sorted(p for p in (ROOT / "deploy").rglob("*") if p.is_file()),
]
IMPORT = re.compile(r"^\s*(from workers[\w.]* import [\w, ]+|import workers[\w.]*)", re.M)
# gunicorn's spellings: ``-c python:workers.x`` and ``workers.x:attr`` (an app).
CONFIG = re.compile(r"python:(workers[\w.]*)")
APP = re.compile(r"\b(workers[\w.]*):(\w+)\b")

# Names the docs show as dotted paths in prose (a logger class, a function to call).
DOTTED = [
    "workers.Router",
    "workers.RouterError",
    "workers.RouterInputError",
    "workers.RouterStateError",
    "workers.app.CslbApp",
    "workers.app.pack_keys",
    "workers.gunicorn_conf.compose",
    "workers.gunicorn_logging.Logger",
    "workers.mount.mount",
    "workers.mount.mount_asgi",
    "workers.senders.CurlSender",
    "workers.senders.HttpxSender",
    "workers.senders.Urllib3Sender",
    "workers.surfaces.collector.CslbCollector",
    "workers.master.logs.install",
]


def _shown(pattern: re.Pattern[str]) -> set:
    found = set()
    for path in SHOWN_IN:
        found |= set(pattern.findall(path.read_text(encoding="utf-8", errors="replace")))
    return found


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_docs_show_imports_of_the_workers_room() -> None:
    assert len(_shown(IMPORT)) >= 3 and "workers.gunicorn_conf" in _shown(CONFIG)


@pytest.mark.parametrize("statement", sorted(_shown(IMPORT)))
def test_every_import_the_docs_show_works(statement: str) -> None:
    exec(statement, {})


@pytest.mark.parametrize("module", sorted(_shown(CONFIG)))
def test_gunicorn_config_modules_have_the_hooks(module: str) -> None:
    conf = importlib.import_module(module)
    for name in conf.__all__:
        assert hasattr(conf, name), name
    assert callable(conf.on_starting) and callable(conf.post_fork)
    ns: dict = {}
    exec(f"from {module} import *", ns)
    assert {"on_starting", "post_fork", "child_exit", "logger_class"} <= set(ns)
    assert _resolve(conf.logger_class) is _resolve("workers.gunicorn_logging.Logger")


@pytest.mark.parametrize(("module", "attr"), sorted(_shown(APP)))
def test_every_app_spelling_the_docs_show_resolves(module: str, attr: str, monkeypatch) -> None:
    # workers.mount:app mounts the app CSLB_APP names: give it the stdlib's demo app.
    monkeypatch.setenv("CSLB_APP", "wsgiref.simple_server:demo_app")
    impl = importlib.import_module("workers.surfaces.mount")
    cached = "app" in vars(impl)
    try:
        assert callable(getattr(importlib.import_module(module), attr))
    finally:
        if not cached:  # (the mounted app is kept once resolved: not for other tests)
            vars(impl).pop("app", None)


@pytest.mark.parametrize("dotted", DOTTED)
def test_every_dotted_name_the_docs_show_resolves(dotted: str) -> None:
    assert _resolve(dotted) is not None
