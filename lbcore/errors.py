"""Exception types of the routing core.

Every error names what was wrong and what was expected, so that a caller (the HTTP app,
the discovery process, an operator at the CLI) can show it as is.
"""

from __future__ import annotations


class LBCoreError(Exception):
    """Base class of every error raised by :mod:`lbcore`."""


class KeyTypeError(LBCoreError, TypeError):
    """A routing key is not a ``str``, ``bytes`` or integer."""


class KeyEncodingError(LBCoreError, ValueError):
    """A ``str`` key cannot be encoded as UTF-8 (for example a lone surrogate)."""


class KeyTooLongError(LBCoreError, ValueError):
    """A routing key is longer than the caller's limit in bytes."""


class EndpointError(LBCoreError, ValueError):
    """An endpoint list is empty, has duplicates, or holds something that is not a string."""


class LoadError(LBCoreError, ValueError):
    """A load vector has the wrong length or holds negative or non-finite values."""


class BalanceFactorError(LBCoreError, ValueError):
    """A balance factor is below 1 or not finite (Skipper rejects those too)."""


class CandidatesError(LBCoreError, ValueError):
    """A candidate set names endpoints that do not exist or has the wrong shape."""


class ArgumentError(LBCoreError, ValueError):
    """A routing parameter (``attempt``, ``max_hops``, ``hashes``, missing loads) is invalid."""


class FadeError(LBCoreError, ValueError):
    """A fade-in parameter or ring-set operation is invalid."""


class GateError(LBCoreError, ValueError):
    """A rollout-gate setting is out of range."""


class OutlierError(LBCoreError, ValueError):
    """An outlier-detection setting, count or ejection state is invalid."""


class TableDataError(LBCoreError, ValueError):
    """A ring table holds an entry out of range: damaged, or rewritten while it was read."""


class MappingFaultError(LBCoreError, OSError):
    """Shared memory faulted under a native kernel access (SIGBUS, caught).

    The object behind a mapping was shrunk by another process while the kernel read or
    wrote it: the step was cut short (a write may be partly done); nothing else is
    wrong with the process. The caller asks its segments which one shrank.
    """
