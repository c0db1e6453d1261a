"""gunicorn's ``logger_class = "workers.gunicorn_logging.Logger"``: public spelling.

The logger lives in :mod:`workers.master.gunicorn_logging`.
"""

from workers.master.gunicorn_logging import Logger, StatsdLogger, use_cslb_format

__all__ = ["Logger", "StatsdLogger", "use_cslb_format"]
