"""Passive outlier ejection: how calls fail, and (below) the rules that eject endpoints.

Workers record per endpoint *how* each call failed, as one small integer per call
(:data:`FAIL_CONNECT` … :data:`FAIL_OTHER`, ``0`` for success); the counters keep a
count per kind next to the total, and the host's one table writer judges endpoints on
those counts with the pure functions of this module (counts and time in, decisions out).
"""

from __future__ import annotations

__all__ = [
    "FAILURE_KINDS",
    "FAIL_CONNECT",
    "FAIL_NONE",
    "FAIL_OTHER",
    "FAIL_STATUS",
    "FAIL_TIMEOUT",
]

#: The call succeeded.
FAIL_NONE = 0
#: The transport failed before a response: connection refused or reset, DNS.
FAIL_CONNECT = 1
#: The call timed out (connecting or waiting for the answer).
FAIL_TIMEOUT = 2
#: The endpoint answered with a failure status (a 5xx or another configured status).
FAIL_STATUS = 3
#: Any other failure (an exception the sender could not classify; ``True`` flags).
FAIL_OTHER = 4

#: Name of each failure kind: ``FAILURE_KINDS[code - 1]``.
FAILURE_KINDS = ("connect", "timeout", "status", "other")
