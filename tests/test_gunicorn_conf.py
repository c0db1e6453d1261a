"""workers.gunicorn_conf: what gunicorn sees of it, and composing with users' hooks."""

from __future__ import annotations

import gunicorn.config
import pytest

import workers.gunicorn_conf as conf


def _settings_seen_by_gunicorn(module_vars: dict) -> set[str]:
    known = {s.name for s in gunicorn.config.KNOWN_SETTINGS}
    return {k for k in module_vars if k in known}


def test_gunicorn_reads_only_hooks_from_the_module() -> None:
    # gunicorn applies every module-level name that is a setting: nothing else may leak.
    settings = {*conf.HOOKS, "control_socket_disable", "logger_class"}
    assert _settings_seen_by_gunicorn(vars(conf)) == settings
    assert set(conf.__all__) == settings


def test_gunicorn_accepts_every_hook_and_composition() -> None:
    cfg = gunicorn.config.Config()
    for name in conf.HOOKS:
        cfg.set(name, getattr(conf, name))  # validates callables and arity

    def mine1(server):
        pass

    def mine2(server, worker):
        pass

    def mine3(server, new_value, old_value):
        pass

    by_arity = {1: mine1, 2: mine2, 3: mine3}
    composed = conf.compose(**{n: by_arity[a] for n, (_, a, _) in conf.HOOKS.items()})
    for name, fn in composed.items():
        assert fn is not getattr(conf, name)
        cfg.set(name, fn)


def test_compose_orders_setup_and_teardown(monkeypatch) -> None:
    calls: list[str] = []
    for name in ("post_fork", "child_exit"):
        monkeypatch.setitem(
            conf.HOOKS,
            name,
            (lambda *a, _n=name: calls.append(f"cslb:{_n}"), 2, conf.HOOKS[name][2]),
        )

    def post_fork(server, worker):
        calls.append("user:post_fork")

    def child_exit(server, worker):
        calls.append("user:child_exit")
        raise RuntimeError("user hook failed")

    ns = {"post_fork": post_fork, "child_exit": child_exit, "bind": "127.0.0.1:1"}
    out = conf.compose(ns)
    assert ns["bind"] == "127.0.0.1:1"
    assert set(out) == set(conf.HOOKS) and all(ns[k] is out[k] for k in out)
    ns["post_fork"](None, None)
    with pytest.raises(RuntimeError, match="user hook failed"):
        ns["child_exit"](None, None)
    # set-up: cslb first; tear-down: the user's first, cslb's even when the user's raised
    assert calls == ["cslb:post_fork", "user:post_fork", "user:child_exit", "cslb:child_exit"]
    # Composing again (a config file re-read on HUP) does not wrap twice.
    again = conf.compose(ns)
    assert again["post_fork"] is ns["post_fork"]


def test_compose_keeps_cslb_hooks_from_a_star_import() -> None:
    ns = {name: getattr(conf, name) for name in conf.__all__ if name in conf.HOOKS}
    out = conf.compose(ns)
    assert all(out[name] is getattr(conf, name) for name in conf.HOOKS)


def test_compose_rejects_unknown_hooks() -> None:
    with pytest.raises(TypeError, match="cslb composes only"):
        conf.compose(post_request=lambda req, worker: None)
    with pytest.raises(TypeError, match="post_fork must be callable"):
        conf.compose({"post_fork": 3})


def test_docs_name_every_master_setting_and_hook() -> None:
    from pathlib import Path

    from workers.master.supervisor import SUPERVISOR_KNOBS

    doc = (Path(__file__).resolve().parent.parent / "docs" / "gunicorn.md").read_text()
    for k in SUPERVISOR_KNOBS:
        assert f"| `{k.env}` |" in doc, k.env
    for name in conf.HOOKS:
        assert f"| `{name}` |" in doc, name
