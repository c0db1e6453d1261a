"""Test seams: named points of the shared-memory protocols where another process may act."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["seam", "set_seam_hook"]

_seam_hook: Callable[[str], None] | None = None


def seam(point: str) -> None:
    """Mark a point of a protocol where another process may act (a test seam).

    The multi-process tests force the interleavings that matter (a reader stalled
    between two loads, a writer killed between two stores) by installing a hook in a
    child process that pauses there. Without a hook this is one global load; it sits
    only on slow paths (remapping, publishing, growing, creating), never on the
    per-batch ones.
    """
    hook = _seam_hook
    if hook is not None:
        hook(point)


def set_seam_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or with ``None`` remove) the hook :func:`seam` calls; for tests only."""
    global _seam_hook
    _seam_hook = hook
