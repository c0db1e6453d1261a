"""Stopping a child process the tests started: politely, then by force."""

from __future__ import annotations

import signal
import subprocess


def terminate(proc: subprocess.Popen, wait_s: float, kill_wait_s: float = 5.0) -> None:
    """SIGTERM ``proc`` (if it still runs) and wait up to ``wait_s`` seconds for it; if it
    is still running then, SIGKILL it and wait up to ``kill_wait_s`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(kill_wait_s)
