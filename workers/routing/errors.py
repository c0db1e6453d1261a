"""The router's own errors: the router, its tracker and the fan-out raise these."""

from __future__ import annotations

__all__ = ["RouterError", "RouterInputError", "RouterStateError"]


class RouterError(Exception):
    """Base class of the router's own errors."""


class RouterInputError(RouterError, ValueError):
    """An argument of a router call is malformed (indices, call numbers, settings)."""


class RouterStateError(RouterError):
    """The router cannot be used here: closed, or inherited by a forked child."""
