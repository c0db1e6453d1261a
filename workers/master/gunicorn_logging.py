"""gunicorn's own log lines in cslb's format, under ``CSLB_LOG_FORMAT=json``.

cslb's config module (:mod:`workers.gunicorn_conf`, which ``cslb serve`` runs) sets
gunicorn's ``logger_class`` to :class:`Logger`. It is gunicorn's logger: after gunicorn's
``Logger.setup`` made its handlers (``--error-logfile``, ``--access-logfile``; again on
each SIGHUP reload), the handlers writing a stream or a file get
:class:`lbcore.logformat.Formatter`, so ``Starting gunicorn``, ``Booting worker``, the
access log, ``Worker exiting`` become cslb's JSON lines: logger ``gunicorn.error`` (or
``gunicorn.access``), event ``log``, the message in ``message``. The uvicorn worker gives
its ``uvicorn.error`` and ``uvicorn.access`` loggers these same handler objects, so its
lines are JSON too, under their own logger names.

Why a logger class rather than ``logconfig_dict``: gunicorn applies a logging dict with
``dictConfig`` over its own defaults, which also configures the root logger and turns the
access log on whether or not it was asked for, and its handlers replace those of
``--access-logfile``; and a hook (``on_starting``) runs after the first line and not
again on a reload.

Left alone (gunicorn's format): ``CSLB_LOG_FORMAT=text``; your own logging config
(``--log-config``, ``--log-config-dict``, ``--log-config-json``: yours decides);
syslog handlers; and a ``--logger-class`` of your own, which replaces this one. With
``--statsd-host`` the logger is gunicorn's statsd logger with the same change, as
gunicorn itself switches to it when its default logger class is in use.
"""

from __future__ import annotations

import logging
from typing import Any

from gunicorn import glogging
from gunicorn.instrument.statsd import Statsd

from lbcore.knobs import LOG_FORMAT, KnobError
from lbcore.logformat import Formatter
from workers.master.logs import log_settings

__all__ = ["Logger", "StatsdLogger", "use_cslb_format"]


def use_cslb_format(logger: glogging.Logger, cfg: Any) -> bool:
    """Give gunicorn's stream and file handlers cslb's JSON format, if it applies.

    Parameters
    ----------
    logger
        gunicorn's logger, after its ``setup``.
    cfg
        gunicorn's configuration.

    Returns
    -------
    bool
        True if the handlers now write cslb's format; False if they were left as they
        are (``CSLB_LOG_FORMAT`` is not ``json`` or malformed — the config module's
        ``on_starting`` stops the server naming it — or the user has a logging config).
    """
    try:
        fmt = log_settings()[LOG_FORMAT.name]
    except KnobError:
        return False
    if fmt != "json":
        return False
    if cfg.logconfig or cfg.logconfig_dict or cfg.logconfig_json:
        return False
    for log in (logger.error_log, logger.access_log):
        for handler in log.handlers:
            # gunicorn marks the handlers it made; a SysLogHandler is not a StreamHandler
            if getattr(handler, "_gunicorn", False) and isinstance(handler, logging.StreamHandler):
                handler.setFormatter(Formatter("json"))
    return True


class _CslbLines:
    """Mixin for a gunicorn logger class: :func:`use_cslb_format` after each setup."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)  # type: ignore[misc]
        use_cslb_format(self, cfg)  # type: ignore[arg-type]


class StatsdLogger(_CslbLines, Statsd):
    """gunicorn's statsd logger with cslb's line format (chosen with ``--statsd-host``)."""


class Logger(_CslbLines, glogging.Logger):
    """gunicorn's logger with cslb's line format; with ``statsd_host`` a :class:`StatsdLogger`."""

    def __new__(cls, cfg: Any) -> Any:
        """A :class:`StatsdLogger` when ``cfg.statsd_host`` is set, else this class."""
        if cls is Logger and getattr(cfg, "statsd_host", None):
            return StatsdLogger(cfg)  # not a Logger: Python does not call __init__ again
        return super().__new__(cls)
