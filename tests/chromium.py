"""Headless Chromium for the page tests: one run, its stdout (a DOM dump, or nothing)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def run_chromium(
    args: list[str],
    profile: Path,
    *,
    size: tuple[int, int] = (1200, 900),
    timeout_s: float = 60.0,
) -> str:
    """Run headless Chromium with ``args`` (URL last) and return what it printed.

    Skips the calling test when Chromium is missing (fails under
    ``CSLB_REQUIRE_TOOLS=1``, as :func:`tests.tools.need` says); a non-zero exit fails it.
    """
    from tests.tools import need

    exe = need("chromium", "chromium-browser")
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={size[0]},{size[1]}",
        *args,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, out[-2000:]
    return out.decode()
