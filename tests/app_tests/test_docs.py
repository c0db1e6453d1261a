"""docs/http.md stays in sync with the code: every setting, every metric, the examples."""

from __future__ import annotations

import json
import re
from pathlib import Path

from lbcore.knobs import docs_table
from tests.app_tests.conftest import Host
from tests.app_tests.wsgi_calls import call
from workers.surfaces.app import APP_KNOBS, MAX_ATTEMPT, MAX_KEY_BYTES, CslbApp
from workers.surfaces.collector import CslbCollector

DOC = (Path(__file__).parents[2] / "docs" / "http.md").read_text(encoding="utf-8")


def section(name: str) -> str:
    m = re.search(rf"<!-- {name} -->\n(.*?)<!-- /{name} -->", DOC, re.S)
    assert m, name
    return m.group(1).strip()


def test_settings_table_is_generated_from_the_knobs() -> None:
    assert section("app-knobs") == docs_table(APP_KNOBS)
    assert f"over {MAX_KEY_BYTES:,} bytes" in DOC
    assert f"(0 to {MAX_ATTEMPT})" in DOC


def test_metrics_table_names_every_family_with_its_type(namespace: str) -> None:
    rows = {}
    for line in section("metrics").splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1]
    want = {}
    for f in CslbCollector(namespace).describe():
        name = f"{f.name}_total" if f.type == "counter" else f.name
        want[name] = f.type
    assert rows == want


def test_the_route_examples_have_the_shapes_shown(host: Host) -> None:
    host.publish()
    app = CslbApp(host.namespace)
    try:
        examples = re.findall(
            r"curl -s '?localhost:8000/route(\?group=1)?'? --json '(.*?)'\n(.*?)\n", DOC
        )
        assert len(examples) == 2
        for query, body, shown in examples:
            r = call(
                app,
                "POST",
                "/route",
                body.encode(),
                content_type="application/json",
                query=query.lstrip("?"),
            )
            got, doc = r.json(), json.loads(shown)
            assert list(got) == list(doc)
            if "endpoints" in doc:
                assert len(got["endpoints"]) == len(doc["endpoints"])
            else:
                positions = [p for ps in got["groups"].values() for p in ps] + got["fallback"]
                assert sorted(positions) == list(range(len(json.loads(body))))
        health = call(app, "GET", "/healthz").json()
        shown = json.loads(re.search(r"curl -s localhost:8000/healthz\n(.*?)\n", DOC).group(1))
        assert list(health) == list(shown)
    finally:
        app.close()


def test_app_modules_import_only_what_the_workers_room_may() -> None:
    """DESIGN.md, "The rooms": workers uses lbcore, shm and prometheus_client (and the
    NumPy arrays they hand out), never discovery or the Kubernetes client."""
    import ast
    import sys

    allowed = {"lbcore", "shm", "prometheus_client", "numpy", "workers"}
    root = Path(__file__).parents[2] / "workers" / "surfaces"
    for path in sorted(root.glob("*.py")):
        name = path.name
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                assert top in allowed or top in sys.stdlib_module_names, (name, mod)


def test_binary_body_snippet_writes_what_pack_keys_writes(host: Host) -> None:
    from workers.surfaces.app import pack_keys

    (snippet,) = re.findall(r"```python\n(.*?)```", DOC, re.S)
    keys = [b"SKU-1", b"", b"a\nb\xff", b"x" * MAX_KEY_BYTES]
    scope: dict = {"keys": keys}
    exec(snippet, scope)
    assert scope["body"] == pack_keys(keys)
    host.publish()
    app = CslbApp(host.namespace)
    try:
        r = call(app, "POST", "/route", scope["body"], content_type="application/octet-stream")
        assert r.code == 200 and len(r.json()["endpoints"]) == len(keys)
    finally:
        app.close()
    rows = section_table("### The binary body")
    assert [r[0] for r in rows] == ["4", "2 × `n`", "sum of the lengths"]
    assert "uint32" in rows[0][1] and "uint16" in rows[1][1] and "4,096" in rows[1][1]


def section_table(heading: str) -> list[list[str]]:
    """Body rows of the first table after ``heading``."""
    lines = DOC[DOC.index(heading) :].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    rows = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip("|").split("|")])
    return rows


def test_http_docs_state_the_counters_labels_bodies_and_limits() -> None:
    """docs/http.md and the app's docstring say what the service does at its edges."""
    import workers.surfaces.app

    flat = " ".join(DOC.split())
    # lifetime totals start when the endpoint gets its slot, never inherited.
    assert "count from when discovery assigned it its counter slot" in flat
    assert "never with the totals of the pod that had the slot before" in flat
    # the fade share's stable label.
    assert "`started_ns` names the ring by when its fade started" in flat
    # which body carries which key.
    assert "The binary body carries every key." in flat
    # the group answer's own cost is quoted, not only the array's.
    assert "the `group` answer costs about" in flat
    # attempts beyond the endpoints.
    assert "answers `null` (fallback) for every key" in flat
    # the byte order mark.
    assert "A UTF-8 byte order mark at the very start of the body is dropped" in flat
    # slow clients and sync workers.
    assert "holds that worker until gunicorn's `--timeout`" in flat and "--threads N" in flat
    # no table is 200 with generation 0, not 503.
    import workers.surfaces.body

    doc = " ".join(workers.surfaces.app.__doc__.split() + workers.surfaces.body.__doc__.split())
    assert "503 no routing table" not in doc
    assert "the answer is 200 with generation 0 and every key ``null``" in doc
