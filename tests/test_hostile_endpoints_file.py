"""Hostile endpoints files: bad bytes, bad labels, FIFOs, devices and huge files are
refused as ``endpoints_file_invalid`` with the last good set kept, never a crash or a
hang; ``/healthz`` names the file while it is bad and is ok again once it is good."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from discovery.static import (
    EndpointsFileError,
    EndpointsFileWatcher,
    check_label,
    load_endpoints_file,
    parse_endpoints,
)
from tests.gunicorn_harness import serving, wait_for

GOOD = ["http://10.7.0.1:8080", "http://10.7.0.2:8080", "http://10.7.0.3:8080"]


def _doc(addresses: list[str], zone: str = "z1") -> str:
    return json.dumps({"endpoints": [{"address": a, "zone": zone} for a in addresses]})


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)


def _replace_with_symlink(path: Path, target: str) -> None:
    tmp = path.with_name(path.name + ".lnk")
    tmp.symlink_to(target)
    tmp.rename(path)


def _load_in_thread(path: Path, max_bytes: int) -> BaseException | list:
    """Load ``path`` on a thread so a blocking ``open`` fails the test instead of hanging it."""
    out: list = []

    def run() -> None:
        try:
            out.append(load_endpoints_file(path, max_bytes))
        except BaseException as exc:  # handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), f"loading {path} blocked"
    return out[0]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"endpoints": ["http://10.0.0.1:80"]}\xff\xfe', "not valid UTF-8"),
        (b"\xc3\x28", "not valid UTF-8"),
        (b"[" * 100_000, "not valid JSON"),
        (b'{"endpoints": [{"address": "http://10.0.0.1:80", "zone": "a\\u0000b"}]}', "U+0000"),
        (b'{"endpoints": [{"address": "http://10.0.0.1:80", "node": "\\ud800"}]}', "surrogate"),
        (b'{"endpoints": [{"address": "http://10.0.0.1:80", "pod": "\\u001b[2J"}]}', "U+001B"),
        (b'[{"address": "http://10.0.0.1:80", "zone": "' + b"z" * 300 + b'"}]', "at most 253"),
        (b'["http://10.0.0.1:80", "http://\\udcff:80"]', "not an IP address"),
    ],
)
def test_bad_content_is_an_endpoints_file_error(tmp_path: Path, content: bytes, why: str) -> None:
    f = tmp_path / "eps.json"
    f.write_bytes(content)
    got = _load_in_thread(f, 1 << 20)
    assert isinstance(got, EndpointsFileError), got
    assert str(got).startswith(str(f)) and why in str(got)


def test_yaml_shapes_the_checks_do_not_expect_are_file_errors(tmp_path: Path) -> None:
    f = tmp_path / "eps.yaml"
    f.write_text("? [a, b]\n: 1\n")  # a mapping whose key is a list
    with pytest.raises(EndpointsFileError, match=str(f)):
        load_endpoints_file(f)
    f.write_bytes(b"endpoints: [\xff]\n")
    with pytest.raises(EndpointsFileError, match="not valid UTF-8"):
        load_endpoints_file(f)


def test_fifo_device_directory_and_huge_files_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    got = _load_in_thread(fifo, 1 << 20)
    assert isinstance(got, EndpointsFileError) and "a FIFO, not a regular file" in str(got)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    got = _load_in_thread(zero, 1 << 20)
    assert isinstance(got, EndpointsFileError) and "character device" in str(got)
    got = _load_in_thread(tmp_path, 1 << 20)
    assert isinstance(got, EndpointsFileError) and "a directory" in str(got)
    big = tmp_path / "big.json"
    big.write_text(_doc(GOOD) + " " * 5000)
    got = _load_in_thread(big, 4096)
    assert isinstance(got, EndpointsFileError)
    assert "over the limit of 4096" in str(got) and "--endpoints-file-max-bytes" in str(got)
    assert [s.address for s in _load_in_thread(big, 1 << 20)] == GOOD


def test_labels_are_validated_like_addresses() -> None:
    assert check_label("eu-central-1a") is None and check_label("") is None
    assert check_label("ü-zone") is None
    for bad in ("a\x00", "\ud800", "x\x1b[31m", "a\u2028b", "\u200e"):
        assert check_label(bad) is not None, bad
    with pytest.raises(EndpointsFileError, match=r"endpoint 0 .*'zone' has a control"):
        parse_endpoints([{"address": "http://10.0.0.1:80", "zone": "a\x00"}], "f")


def test_watcher_keeps_last_good_through_every_kind_of_bad_file(tmp_path: Path) -> None:
    f = tmp_path / "eps.json"
    f.write_text(_doc(GOOD))
    w = EndpointsFileWatcher(f, max_bytes=4096)
    assert [s.address for s in w.poll()] == GOOD
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for bad in (b"\xff", b"x" * 5000, "fifo", "/dev/zero"):
        if isinstance(bad, bytes):
            _replace(f, bad)
        else:
            _replace_with_symlink(f, str(fifo) if bad == "fifo" else bad)
        with pytest.raises(EndpointsFileError, match=str(f)):
            w.poll()
        assert [s.address for s in w.endpoints] == GOOD
    _replace(f, _doc(GOOD[:2]).encode())
    assert [s.address for s in w.poll()] == GOOD[:2] and w.error is None


def test_serve_survives_hostile_endpoints_files_and_healthz_names_the_file(
    tmp_path: Path,
) -> None:
    """Real ``cslb serve``: discovery is never restarted, routing keeps the last good set,
    /healthz is 503 naming the file while it is bad and 200 again once it is good."""
    eps = tmp_path / "endpoints.json"
    eps.write_text(_doc(GOOD))
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    env = {"CSLB_DEBOUNCE": "0.1", "CSLB_ENDPOINTS_FILE_MAX_BYTES": "4096"}
    args = ["--endpoints-file", str(eps), "--workers", "1"]
    bad_files = [
        ("invalid UTF-8", lambda: _replace(eps, b'{"endpoints": ["\xff\xfe"]}')),
        ("a NUL in a zone", lambda: _replace(eps, _doc(GOOD, "a\u0000b").encode())),
        ("a lone surrogate", lambda: _replace(eps, _doc(GOOD, "\ud800").encode())),
        ("a FIFO", lambda: _replace_with_symlink(eps, str(fifo))),
        ("/dev/zero", lambda: _replace_with_symlink(eps, "/dev/zero")),
        ("too big", lambda: _replace(eps, _doc(GOOD).encode() + b" " * 8192)),
    ]
    with serving(args, tmp_path, env=env) as server:
        server.wait_ready(workers=1, path="/healthz")
        (disc,) = server.discovery_pids()

        def routes_to(addresses: list[str]) -> bool:
            status, body = server.post_json("/route", [f"k{i}" for i in range(60)])
            return status == 200 and set(body["endpoints"]) == set(addresses)

        wait_for("routing on the good file", lambda: routes_to(GOOD), 20.0)
        good = GOOD
        for i, (what, make_bad) in enumerate(bad_files):
            make_bad()
            wait_for(
                f"endpoints_file_invalid for {what}",
                lambda n=i + 1: len(server.events("endpoints_file_invalid")) >= n,
                30.0,
            )
            line = server.events("endpoints_file_invalid")[-1]
            assert line["path"] == str(eps), line
            assert f"keeping last good endpoints ({len(good)})" in line["action"]

            def unhealthy_naming_file() -> bool:
                status, body = server.request("GET", "/healthz")
                return status == 503 and str(eps) in body.decode()

            wait_for(f"/healthz naming the file ({what})", unhealthy_naming_file, 20.0)
            assert routes_to(good), f"routing changed after {what}"
            assert server.discovery_pids() == [disc], f"discovery restarted after {what}"
            # Good again (every other time a different set): healthy, and it is routed on.
            good = GOOD[: 3 - i % 2]
            _replace(eps, _doc(good).encode())
            wait_for(
                f"/healthz ok after {what}",
                lambda: server.request("GET", "/healthz")[0] == 200,
                20.0,
            )
            wait_for(f"routing on the good file after {what}", lambda g=good: routes_to(g), 20.0)
        assert not server.events("crashed")
        result = server.stop()
    assert result["exit"] == 0 and result["left"] == [] and result["segments"] == []


def test_yaml_aliases_are_refused_so_a_billion_laughs_file_cannot_expand(tmp_path: Path) -> None:
    f = tmp_path / "eps.yaml"
    lines = ['a: &a ["http://10.0.0.1:80"]']
    for i in range(1, 30):  # 2**29 entries if expanded
        prev = chr(ord("a") + i - 1) if i < 26 else f"x{i - 1}"
        name = chr(ord("a") + i) if i < 26 else f"x{i}"
        lines.append(f"{name}: &{name} [*{prev}, *{prev}]")
    lines.append("endpoints: *x29")
    f.write_text("\n".join(lines) + "\n")
    got = _load_in_thread(f, 1 << 20)
    assert isinstance(got, EndpointsFileError), got
    assert "aliases are not allowed" in str(got) and str(f) in str(got)
    # Anchors without aliases are just names: fine.
    f.write_text('endpoints: &eps ["http://10.0.0.1:80"]\n')
    assert [s.address for s in load_endpoints_file(f)] == ["http://10.0.0.1:80"]
