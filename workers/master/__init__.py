"""The gunicorn master side: what runs in the arbiter, before and between workers.

* :mod:`workers.master.hooks`: the hooks gunicorn calls (read through
  :mod:`workers.gunicorn_conf`, the config module's public spelling).
* :mod:`workers.master.duties`: :class:`~workers.master.duties.Master`, the master's cslb
  state and duties (counters, discovery, rows of dead processes).
* :mod:`workers.master.supervisor`: the discovery child's supervisor.
* :mod:`workers.master.logs`, :mod:`workers.master.gunicorn_logging`: cslb's log lines and
  gunicorn's logger in cslb's format.
* :mod:`workers.master.serve`: the gunicorn command ``cslb serve`` runs.

Importing this package loads nothing of ours; it caps NumPy's BLAS threads first, since
every module here runs in the gunicorn master, which imports NumPy (through shm) and
must have no thread when it forks.
"""

import os
import sys

# NumPy's bundled OpenBLAS starts a thread pool when NumPy is imported. One BLAS thread
# per process is also what a prefork server wants. An explicit setting wins.
if "numpy" not in sys.modules:
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
    del _var
