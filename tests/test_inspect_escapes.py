"""``cslb inspect`` prints labels from shared memory with control characters escaped:
a table written by any process of the user must not drive the operator's terminal."""

from __future__ import annotations

import subprocess
import sys

import lbcore
import shm
from tests.discovery_harness import ROOT, shm_namespace
from workers.surfaces.inspect_report import shown


def test_shown_escapes_control_format_and_surrogate_characters() -> None:
    assert shown("eu-central-1a") == "eu-central-1a"
    assert shown("zürich") == "zürich"
    assert shown("\x1b[2J") == "\\x1b[2J"
    assert shown("a\x07b\x00") == "a\\x07b\\x00"
    assert shown("\u202eevil") == "\\u202eevil"  # a bidi override
    assert shown("\ud800") == "\\ud800"
    assert shown("\x85") == "\\x85"


def test_cslb_inspect_escapes_labels_written_raw_into_the_table() -> None:
    eps = ("http://10.0.0.1:80", "http://10.0.0.2:80")
    with shm_namespace() as ns:
        with shm.TableWriter(ns) as w:
            w.publish(
                lbcore.RingSet(eps, vnodes=5),
                zones=["\x1b[2J\x1b[31mzone", "z\u202e"],
                nodes=["node\x07", "\x1b]0;title\x07"],
            )
            out = subprocess.run(
                [sys.executable, "-m", "cslb", "inspect", "--shm-namespace", ns],
                cwd=ROOT,
                capture_output=True,
                timeout=60,
            )
    text = out.stdout.decode()
    assert out.returncode in (0, 3), out.stderr  # 3: the writer is gone (closed)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b[2J\\x1b[31mzone" in text and "node\\x07" in text and "z\\u202e" in text
