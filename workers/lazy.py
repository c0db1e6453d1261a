"""Names a package imports on first use (PEP 562): its ``__getattr__`` and ``__dir__``.

So that importing a package (``workers`` in a gunicorn master, ``workers.serving`` in a
product pod) loads none of its heavy modules (NumPy tables, shared memory) until a name
of theirs is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    namespace: dict[str, Any], names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of a package's lazy names.

    Parameters
    ----------
    namespace
        The package's ``globals()``: its ``__name__``, and where a name imported once
        is kept (later lookups do not come back here).
    names
        Name -> the module (dotted path) that defines it.

    Returns
    -------
    tuple
        ``(__getattr__, __dir__)`` to assign at the package's top level.
    """

    def getattr_(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *names})

    return getattr_, dir_
