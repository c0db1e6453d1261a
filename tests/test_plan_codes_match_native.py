"""The plan's choice and gate codes mean the same on both kernels.

``lbcore.views`` declares them for the NumPy reference and the plan's Python side;
``lbcore/csrc/plan.h`` declares them for the native kernel, which reads them from the
plan as plain integers. The extension does not expose its enums, so the header is read.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lbcore
from lbcore import views

HEADER = Path(lbcore.__file__).resolve().parent / "csrc" / "plan.h"


def test_choice_and_gate_codes_are_the_native_kernels() -> None:
    if not HEADER.exists():
        pytest.skip("lbcore's C sources are not in this checkout")
    native = {
        name: int(value)
        for name, value in re.findall(r"\b((?:CHOICE|GATE)_[A-Z]+)\s*=\s*(\d+)", HEADER.read_text())
    }
    declared = {n: getattr(views, n) for n in views.__all__ if n.startswith(("CHOICE_", "GATE_"))}
    assert len(declared) == 6
    assert native == declared
