"""The load-report wire format, where the serving side has always imported it from.

The one copy lives in :mod:`wire.orca` (a room of its own, stdlib only, so the discovery
process can read the pods' load-only answers without importing ``workers``); this
module re-exports it unchanged.
"""

from wire.orca import *  # noqa: F403
from wire.orca import __all__  # noqa: F401
