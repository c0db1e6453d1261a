"""System tools the suite needs: a missing one skips its tests, or fails them when
``CSLB_REQUIRE_TOOLS=1`` (or ``CI``) is set, as ``.ci/run`` does.

What the README's test command says: kubectl >= 1.27 (kustomize v5), Prometheus and
promtool, Chromium, openssl.
"""

from __future__ import annotations

import os
import shutil

import pytest

#: tool -> how to get it (for the message).
TOOLS = {
    "kubectl": "kubectl >= 1.27 (kustomize v5) on PATH",
    "prometheus": "Debian package 'prometheus'; .ci/run installs it",
    "promtool": "Debian package 'prometheus'; .ci/run installs it",
    "chromium": "Debian package 'chromium'; .ci/run installs it",
    "openssl": "Debian package 'openssl'; .ci/run installs it",
}


def required() -> bool:
    """Whether a missing tool fails its tests instead of skipping them."""
    return bool(os.environ.get("CSLB_REQUIRE_TOOLS") or os.environ.get("CI"))


def find(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path is None and os.path.exists(f"/usr/bin/{name}"):
            path = f"/usr/bin/{name}"
        if path is not None:
            return path
    return None


def need(*names: str) -> str:
    """The path of the first of ``names`` installed; else skip (or fail when required)."""
    path = find(*names)
    if path is None:
        msg = f"{names[0]} is not installed ({TOOLS.get(names[0], 'needed by this test')})"
        if required():
            pytest.fail(msg)
        pytest.skip(msg)
    return path
