"""``mount()`` and ``workers.mount:app``: public spellings of :mod:`workers.surfaces.mount`."""

from typing import Any

from workers.surfaces import mount as _impl
from workers.surfaces.mount import APP, PATHS, load_app, mount, mount_asgi, user_registry

__all__ = ["APP", "PATHS", "load_app", "mount", "mount_asgi", "user_registry"]


def __getattr__(name: str) -> Any:
    # ``workers.mount:app``: the user's app, imported when gunicorn's worker asks for it.
    if name == "app":
        return _impl.app
    raise AttributeError(f"module 'workers.mount' has no attribute {name!r}")
