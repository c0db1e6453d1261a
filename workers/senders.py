"""``from workers.senders import CurlSender``: re-exports :mod:`workers.fanout.senders`."""

from workers.fanout.senders import *  # noqa: F403
from workers.fanout.senders import __all__ as __all__
