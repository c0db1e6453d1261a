"""``workers.app:app``, the bundled app: re-exports :mod:`workers.surfaces.app`."""

from workers.surfaces.app import *  # noqa: F403
from workers.surfaces.app import __all__ as __all__
