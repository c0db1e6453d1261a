"""Every command-line flag the docs name works: the flags after ``cslb <command>`` in
the docs' examples, and the flag column of every settings table, are options of the
command they belong to (rendered against the real parsers, not a list kept by hand)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from cslb import discovery_cmd, inspect_cmd, route_cmd, serve_cmd, simulate_cmd

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PARSERS = {
    "serve": serve_cmd.build_parser,
    "discovery": discovery_cmd.build_parser,
    "inspect": inspect_cmd.build_parser,
    "route": route_cmd.build_parser,
    "simulate": simulate_cmd.build_parser,
}


def _options(command: str) -> set[str]:
    parser: argparse.ArgumentParser = PARSERS[command]()
    return {s for a in parser._actions for s in a.option_strings}


def _example_flags() -> list[tuple[str, str, str]]:
    """``(doc, command, flag)`` for every flag written after ``cslb <command>``."""
    out = []
    pattern = re.compile(r"cslb (serve|discovery|inspect|route|simulate)\b([^`|#\n]*)")
    for doc in DOCS:
        for m in pattern.finditer(doc.read_text(encoding="utf-8")):
            rest = m.group(2).split(" -- ")[0]  # after --: gunicorn's own options
            for token in rest.split():
                if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", token):
                    out.append((doc.name, m.group(1), token.split("=")[0]))
                elif not token.startswith("-") and not re.fullmatch(r"[\w./:@,\[\]-]+", token):
                    break  # prose after the command: its flags end here
    return out


def _table_flags() -> list[tuple[str, str, str]]:
    """``(doc, variable, flag)`` for every row of a settings table."""
    row = re.compile(r"^\| `(CSLB_[A-Z0-9_]+)` \| `(--[a-z0-9-]+)` \|", re.M)
    return [(d.name, m.group(1), m.group(2)) for d in DOCS for m in row.finditer(d.read_text())]


def test_the_docs_name_flags_at_all() -> None:
    flags = {f for _, _, f in _table_flags()}
    assert {"--max-body-bytes", "--max-batch", "--stale-after", "--balance-factor"} <= flags
    assert ("serve", "--workers") in {(c, f) for _, c, f in _example_flags()}


@pytest.mark.parametrize(("doc", "command", "flag"), _example_flags())
def test_every_flag_in_an_example_is_an_option_of_its_command(doc, command, flag) -> None:
    assert flag in _options(command), f"{doc}: 'cslb {command} {flag}' is not an option"


@pytest.mark.parametrize(("doc", "variable", "flag"), _table_flags())
def test_every_settings_table_flag_is_an_option_of_some_command(doc, variable, flag) -> None:
    owners = [c for c in PARSERS if flag in _options(c)]
    assert owners, f"{doc}: {variable}'s flag {flag} is no command's option"


def test_the_http_settings_are_flags_of_cslb_serve_and_reach_the_workers() -> None:
    from workers.surfaces.app import APP_KNOBS

    env: dict[str, str] = {}
    argv = []
    for k, value in zip(APP_KNOBS, ("4096", "7", "2.5", "10"), strict=True):
        argv += [k.flag, value]
    serve_cmd.command(argv, env)
    assert [env[k.env] for k in APP_KNOBS] == ["4096", "7", "2.5", "10"]
    with pytest.raises(SystemExit) as exc:
        serve_cmd.command(["--max-batch", "0"], {})
    assert exc.value.code == 2


def test_worker_flags_sharing_a_name_with_a_server_flag_stay_apart() -> None:
    env: dict[str, str] = {}
    cmd = serve_cmd.command(["--threads", "2", "--fanout-threads", "3", "--load-refresh", "0"], env)
    assert env["CSLB_FANOUT_THREADS"] == "3" and env["CSLB_LOAD_REFRESH"] == "0"
    assert cmd[cmd.index("--threads") + 1] == "2"
