"""The ``BIN`` form's protobuf decoder; the one copy lives in :mod:`lbwire.protowire`."""

from lbwire.protowire import *  # noqa: F403
from lbwire.protowire import __all__  # noqa: F401
