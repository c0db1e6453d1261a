"""docs/settings.md: every settings table is generated from its declarations.

Each table sits between ``<!-- name -->`` markers; ``python -m tests.test_docs_settings
--write`` rewrites them from the declarations, and the test fails when one differs, so
code, ``--help`` and the docs cannot disagree.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ROOT / "docs" / "settings.md"
SERVING = ROOT / "docs" / "serving.md"


def _tables() -> dict[str, Callable[[], str]]:
    from discovery.settings import DISCOVERY_KNOBS, OUTLIER_KNOBS, ZONE_CONTROL_KNOBS
    from lbcore.knobs import KERNEL, LOG_KNOBS, ROUTING_KNOBS, docs_table
    from lbcore.report_settings import REPORT_KNOBS
    from workers.fanout.settings import FANOUT_KNOBS

    return {
        "routing-knobs": lambda: docs_table(ROUTING_KNOBS),
        "kernel-knob": lambda: docs_table((KERNEL,)),
        "fanout-knobs": lambda: docs_table(FANOUT_KNOBS),
        # (environment only: no command takes them as flags)
        "report-knobs": lambda: docs_table(REPORT_KNOBS, flags=False),
        # (the zone controller's, in cslb discovery; CSLB_ZONE is a discovery setting)
        "zone-knobs": lambda: docs_table(ZONE_CONTROL_KNOBS),
        "discovery-knobs": lambda: docs_table(DISCOVERY_KNOBS),
        "outlier-knobs": lambda: docs_table(OUTLIER_KNOBS),
        "log-knobs": lambda: docs_table(LOG_KNOBS),
    }


def section(text: str, name: str) -> str:
    """The text between ``<!-- name -->`` and ``<!-- /name -->``, stripped."""
    m = re.search(rf"<!-- {name} -->\n(.*?)<!-- /{name} -->", text, re.S)
    assert m, f"no <!-- {name} --> section"
    return m.group(1).strip()


def render(text: str) -> str:
    """``text`` with every marked table regenerated from its declarations."""
    for name, table in _tables().items():
        section(text, name)  # present
        start = text.index(f"<!-- {name} -->\n") + len(f"<!-- {name} -->\n")
        text = text[:start] + table() + "\n" + text[text.index(f"<!-- /{name} -->") :]
    return text


@pytest.mark.parametrize("name", sorted(_tables()))
def test_each_settings_table_is_generated_from_its_declarations(name: str) -> None:
    text = SETTINGS.read_text(encoding="utf-8")
    assert section(text, name) == _tables()[name](), (
        f"docs/settings.md's {name} table differs from its declarations: "
        "run python -m tests.test_docs_settings --write"
    )


def test_every_declared_variable_is_documented_once_on_the_page() -> None:
    from discovery.settings import DISCOVERY_KNOBS, OUTLIER_KNOBS
    from lbcore.knobs import KERNEL, LOG_KNOBS, ROUTING_KNOBS
    from lbcore.report_settings import REPORT_KNOBS
    from lbcore.zone_settings import ZONE_KNOBS
    from workers.fanout.settings import FANOUT_KNOBS

    text = SETTINGS.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(CSLB_[A-Z0-9_]+)` \|", text, re.M)
    groups = (ROUTING_KNOBS, FANOUT_KNOBS, REPORT_KNOBS, ZONE_KNOBS, OUTLIER_KNOBS, LOG_KNOBS)
    declared = {k.env for g in groups for k in g}
    declared |= {k.env for k in DISCOVERY_KNOBS} | {KERNEL.env}
    assert set(rows) == declared
    # the discovery table repeats the two log settings (they are discovery flags too)
    twice = sorted(v for v in set(rows) if rows.count(v) > 1)
    assert twice == ["CSLB_LOG_FORMAT", "CSLB_LOG_LEVEL"]


def _pod_table() -> str:
    from lbcore.knobs import docs_table
    from workers.serving.settings import POD_KNOBS

    return docs_table(POD_KNOBS, flags=False)


def test_the_pod_settings_table_is_generated_from_its_declarations() -> None:
    text = SERVING.read_text(encoding="utf-8")
    assert section(text, "pod-knobs") == _pod_table(), (
        "docs/serving.md's pod-knobs table differs from its declarations: "
        "run python -m tests.test_docs_settings --write"
    )


def _render_serving(text: str) -> str:
    start = text.index("<!-- pod-knobs -->\n") + len("<!-- pod-knobs -->\n")
    return text[:start] + _pod_table() + "\n" + text[text.index("<!-- /pod-knobs -->") :]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_docs_settings --write")
    SETTINGS.write_text(render(SETTINGS.read_text(encoding="utf-8")), encoding="utf-8")
    SERVING.write_text(_render_serving(SERVING.read_text(encoding="utf-8")), encoding="utf-8")
