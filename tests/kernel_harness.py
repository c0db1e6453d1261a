"""Running one piece of code on a chosen routing kernel, for tests that compare the two."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lbcore


def on(kernel: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` with ``kernel`` active; an exception comes back as (error, type, text)."""
    old = lbcore.use_kernel(kernel)
    try:
        return fn()
    except Exception as exc:  # compared between kernels
        return ("error", type(exc), str(exc))
    finally:
        lbcore.use_kernel(old)
