"""The ``cslb`` command line run by the tests as a child process, from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_cslb(
    *args: str,
    stdin: str | bytes | None = None,
    env: dict[str, str] | None = None,
    without_cslb_env: bool = False,
    text: bool = True,
    timeout: float = 60,
) -> subprocess.CompletedProcess:
    """``python -m cslb ARGS`` in the checkout, run to its end, its output captured.

    ``env`` replaces the environment (``None``: this process's); ``without_cslb_env``
    drops its ``CSLB_*`` variables first, so no setting of the test run leaks in.
    ``timeout`` is in seconds; ``text=False`` gives bytes.
    """
    if without_cslb_env:
        env = {k: v for k, v in (env or os.environ).items() if not k.startswith("CSLB_")}
    return subprocess.run(
        [sys.executable, "-m", "cslb", *args],
        input=stdin,
        capture_output=True,
        text=text,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
