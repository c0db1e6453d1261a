"""The load-report wire format, where the serving side has always imported it from.

The one copy lives in :mod:`lbwire.orca` (a room of its own, stdlib only, so the discovery
process can read the pods' load-only answers without importing ``workers``); this
module re-exports it unchanged.
"""

from lbwire.orca import *  # noqa: F403
from lbwire.orca import __all__  # noqa: F401
