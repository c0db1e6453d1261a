"""The ``BIN`` form's protobuf decoder; the one copy lives in :mod:`wire.protowire`."""

from wire.protowire import *  # noqa: F403
from wire.protowire import __all__  # noqa: F401
