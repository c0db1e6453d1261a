"""The process settings every room shares: the shared-memory namespace and its cleanup.

Discovery publishes into it, the gunicorn master creates its counters in it, and every
worker's :class:`workers.Router` maps it, so it is declared once, here, and read the same
way everywhere: ``CSLB_SHM_NAMESPACE`` or ``--shm-namespace``, default ``default``.
"""

from __future__ import annotations

from collections.abc import Mapping

from lbcore.knobs import Knob, parse_bool
from shm.names import check_namespace

__all__ = ["SHM_NAMESPACE", "UNLINK_ON_EXIT", "shm_namespace"]


def _shm_namespace(text: str) -> str:
    return check_namespace(text.strip())


#: ``--shm-namespace`` / ``CSLB_SHM_NAMESPACE``.
SHM_NAMESPACE = Knob(
    "shm_namespace",
    "CSLB_SHM_NAMESPACE",
    "--shm-namespace",
    "default",
    _shm_namespace,
    "Namespace of the shared-memory segments (/dev/shm/cslb.<ns>.*) the host's workers read.",
    "NS",
)


#: ``--unlink-on-exit`` / ``CSLB_UNLINK_ON_EXIT``: read by whoever owns segments at exit.
UNLINK_ON_EXIT = Knob(
    "unlink_on_exit",
    "CSLB_UNLINK_ON_EXIT",
    "--unlink-on-exit",
    True,
    parse_bool,
    "Remove the namespace's shared-memory segments on a clean stop (SIGTERM/SIGINT): "
    "a discovery process its tables, the gunicorn master every segment of the "
    "namespace. 'false' keeps them for the next process to take over.",
    "BOOL",
)


def shm_namespace(environ: Mapping[str, str]) -> str:
    """The namespace ``environ`` names (``CSLB_SHM_NAMESPACE``), else the default.

    Raises
    ------
    lbcore.knobs.KnobError
        The variable is set to an invalid namespace; the message names it.
    """
    raw = environ.get(SHM_NAMESPACE.env)
    if raw is None or not raw.strip():
        return str(SHM_NAMESPACE.default)
    return str(SHM_NAMESPACE.convert(raw, "environment"))
