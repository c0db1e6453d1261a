"""The gunicorn master side: what runs in the arbiter, before and between workers.

* :mod:`workers.master.hooks`: the hooks gunicorn calls (read through
  :mod:`workers.gunicorn_conf`, the config module's public spelling).
* :mod:`workers.master.duties`: :class:`~workers.master.duties.Master`, the master's cslb
  state and duties (counters, discovery, rows of dead processes).
* :mod:`workers.master.supervisor`: the discovery child's supervisor.
* :mod:`workers.master.logs`, :mod:`workers.master.gunicorn_logging`: cslb's log lines and
  gunicorn's logger in cslb's format.
* :mod:`workers.master.serve`: the gunicorn command ``cslb serve`` runs.

Importing this package loads nothing: the config module must set thread limits before
NumPy is imported.
"""
