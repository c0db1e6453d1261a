"""cslb's log lines in the processes cslb runs: the gunicorn master, its workers, ``cslb serve``.

Inside your own app cslb is a library: it logs to its named loggers (``cslb.router``,
``cslb.app``, ``cslb.master``, ``cslb.supervisor``, all under ``cslb``), configures
neither them nor the root logger, and your logging setup decides what becomes of its
records (an :class:`lbcore.logformat.Event` message reads ``event k=v ...``; the fields
are on the message, ``record.msg.fields``, or on ``record.cslb``).

Under cslb's gunicorn config module (``gunicorn -c python:workers.gunicorn_conf``, which
``cslb serve`` runs) the master is cslb's process: :func:`install` gives the ``cslb``
logger one handler writing cslb's line format (:mod:`lbcore.logformat`,
``CSLB_LOG_FORMAT``) to stderr from ``CSLB_LOG_LEVEL`` up, without propagation, so the
master's, the workers' (they inherit it through the fork) and discovery's lines are one
format. A ``cslb`` logger that already has a handler (say, from gunicorn's
``--log-config-dict``) is left as it is: the user's configuration wins.
gunicorn's own error and access lines: :mod:`workers.master.gunicorn_logging`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

from lbcore.knobs import LOG_FORMAT, LOG_KNOBS, LOG_LEVEL, defaults, from_mapping
from lbcore.logformat import Event, Formatter

__all__ = ["ROOT_LOGGER", "Event", "install", "log_settings"]

#: The logger every cslb logger is a child of.
ROOT_LOGGER = "cslb"

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _CslbHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`install` adds (so a second call recognizes it)."""


def log_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``log_format`` and ``log_level`` from ``CSLB_LOG_FORMAT`` / ``CSLB_LOG_LEVEL``.

    Raises
    ------
    lbcore.knobs.KnobError
        A value that is not a log format or level (the message names the variable).
    """
    env = os.environ if environ is None else environ
    values = defaults(LOG_KNOBS)
    values.update(from_mapping(env, LOG_KNOBS))
    return values


def install(
    environ: Mapping[str, str] | None = None, stream: TextIO | None = None
) -> logging.Handler | None:
    """Write the ``cslb`` logger's lines in cslb's format (in a process cslb runs).

    Idempotent: a second call updates the handler's format and level. Never touches the
    root logger.

    Parameters
    ----------
    environ
        Where ``CSLB_LOG_FORMAT`` and ``CSLB_LOG_LEVEL`` are read (default ``os.environ``).
    stream
        Where lines go (default: ``sys.stderr`` at the time of the call).

    Returns
    -------
    logging.Handler or None
        cslb's handler, or ``None`` when the ``cslb`` logger was configured by someone
        else (then nothing changes).

    Raises
    ------
    lbcore.knobs.KnobError
        ``CSLB_LOG_FORMAT`` or ``CSLB_LOG_LEVEL`` is malformed.
    """
    values = log_settings(environ)
    log = logging.getLogger(ROOT_LOGGER)
    ours = [h for h in log.handlers if isinstance(h, _CslbHandler)]
    if not ours and log.handlers:
        return None
    handler = ours[0] if ours else _CslbHandler(sys.stderr if stream is None else stream)
    if ours and stream is not None:
        handler.setStream(stream)
    handler.setFormatter(Formatter(values[LOG_FORMAT.name]))
    if not ours:
        log.addHandler(handler)
    log.setLevel(_LEVELS[values[LOG_LEVEL.name]])
    log.propagate = False  # one line per record: not again through the root's handlers
    return handler
