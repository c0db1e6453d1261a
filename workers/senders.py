"""The senders' public spelling (``from workers.senders import CurlSender``).

They live in :mod:`workers.fanout.senders`.
"""

from workers.fanout.senders import (
    CallAnswerError,
    CallConnectError,
    CallError,
    CallStatusError,
    CallTimeoutError,
    CurlGroup,
    CurlSender,
    HttpxSender,
    Urllib3Sender,
    failure_kind,
)

__all__ = [
    "CallAnswerError",
    "CallConnectError",
    "CallError",
    "CallStatusError",
    "CallTimeoutError",
    "CurlGroup",
    "CurlSender",
    "HttpxSender",
    "Urllib3Sender",
    "failure_kind",
]
