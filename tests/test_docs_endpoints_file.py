"""docs/endpoints-file.md: its examples parse, and every error it shows is the parser's."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from discovery.static import EndpointsFileError, EndpointSpec, load_endpoints_file

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "endpoints-file.md").read_text(encoding="utf-8")
A = "http://10.2.0.1:8080"

#: (file name, content) in the order of the doc's error lines; None: a directory;
#: an int: a sparse file of that many bytes.
BAD: list[tuple[str, bytes | int | None]] = [
    ("pods.json", json.dumps([{"address": A, "weight": 2}]).encode()),
    ("pods.json", json.dumps([{"address": A, "rack": "r1"}]).encode()),
    ("pods.json", json.dumps([{"address": A, "zone": 1}]).encode()),
    ("pods.json", json.dumps([{"zone": "a"}]).encode()),
    ("pods.json", json.dumps(["10.2.0.1:8080"]).encode()),
    ("pods.json", json.dumps([A + "/"]).encode()),
    ("pods.json", json.dumps([A, A]).encode()),
    ("pods.json", json.dumps({"pods": []}).encode()),
    ("pods.json", json.dumps({"endpoints": A}).encode()),
    ("pods.json", b'{"endpoints": ['),
    ("pods.json", b"\xef\xbb\xbf" + json.dumps([A]).encode()),
    ("pods.json", b"\xff\xfe"),
    ("pods.json", 40_000_000),
    ("pods.json", b"missing"),
    ("pods", None),
    ("pods.yaml", b"a: &x [1]\nendpoints: *x\n"),
]


def _error_lines() -> list[str]:
    block = DOC[DOC.index("## Errors") :]
    return re.search(r"```\n(.*?)```", block, re.S).group(1).splitlines()


def test_every_error_shown_is_what_the_parser_says(tmp_path: Path) -> None:
    lines = _error_lines()
    assert len(lines) == len(BAD)
    for i, ((name, content), line) in enumerate(zip(BAD, lines, strict=True)):
        d = tmp_path / str(i)
        d.mkdir()
        path = d / name
        if content is None:
            path.mkdir()
        elif isinstance(content, int):
            with open(path, "wb") as f:
                f.truncate(content)  # sparse: refused by size before anything is read
        elif content != b"missing":
            path.write_bytes(content)
        with pytest.raises(EndpointsFileError) as exc:
            load_endpoints_file(path)
        assert line.startswith(f"{name}: ")
        assert str(exc.value) == f"{d}{os.sep}{line}", i


def test_the_examples_parse_to_the_same_endpoints() -> None:
    (js,) = re.findall(r"```json\n(.*?)```", DOC, re.S)
    (ym,) = re.findall(r"```yaml\n(.*?)```", DOC, re.S)
    want = [
        EndpointSpec(A, "eu-central-1a", "node-a1"),
        EndpointSpec("http://10.2.0.2:8080", "eu-central-1a", "node-a2", "catalog-7d9f-x2k4q"),
        EndpointSpec("http://10.2.0.3:8080"),
    ]
    from discovery.static import parse_endpoints

    assert parse_endpoints(json.loads(js)) == want
    assert parse_endpoints(yaml.safe_load(ym)) == want
    for name in ("endpoints.json", "pods.json"):  # the examples/ files it names
        assert load_endpoints_file(ROOT / "examples" / name)
        assert f"examples/{name}" in DOC


def test_the_fields_table_names_the_parsers_fields_and_limit() -> None:
    from discovery.settings import DISCOVERY_KNOBS
    from discovery.static import DEFAULT_MAX_FILE_BYTES, ENTRY_FIELDS

    rows = re.findall(r"^\| `(\w+)` \| (yes|no) \|", DOC, re.M)
    assert [r[0] for r in rows] == list(ENTRY_FIELDS)
    assert [r[1] for r in rows] == ["yes", "no", "no", "no"]
    assert DEFAULT_MAX_FILE_BYTES == 32 << 20 and "32 MiB" in DOC
    assert "CSLB_ENDPOINTS_FILE_MAX_BYTES" in {k.env for k in DISCOVERY_KNOBS}
    row = next(k for k in DISCOVERY_KNOBS if k.env == "CSLB_ENDPOINTS_FILE")
    assert "docs/endpoints-file.md" in row.doc
