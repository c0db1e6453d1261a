"""Life inside a prefork server (DESIGN.md, "The rooms": ``workers``).

* :class:`workers.Router` (:mod:`workers.routing.router`): the library API user code calls in a
  worker: ``Router.attach()``, ``route(keys)``, ``endpoints_of(idx)``, ``track(idx)``.

Names are imported lazily, so ``import workers`` in a gunicorn master loads neither
NumPy tables nor shared memory until something asks for them.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Router", "RouterError", "RouterInputError", "RouterStateError"]

_LAZY = {name: "workers.routing.router" for name in __all__}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
