"""gunicorn config module: ``gunicorn -c python:workers.gunicorn_conf yourapp:app``.

gunicorn reads settings and hooks as attributes of this module; they are cslb's
master-side hooks, written in :mod:`workers.master.hooks` (what each does, and how to
add your own with :func:`compose`) over the master's duties in
:mod:`workers.master.duties`. ``from workers.gunicorn_conf import *`` in your own config
file takes the hooks and settings (``__all__``).
"""

# Settings and hooks (``__all__``), then the other public names (``compose``, the
# master's handle for tests and tools), re-exported as they are.
from workers.master.duties import MASTER as MASTER
from workers.master.duties import MIN_GUNICORN as MIN_GUNICORN
from workers.master.duties import CslbSettingsError as CslbSettingsError
from workers.master.duties import CslbStartupError as CslbStartupError
from workers.master.duties import Master as Master
from workers.master.duties import check_gunicorn as check_gunicorn
from workers.master.duties import hook_arbiter_loop as hook_arbiter_loop
from workers.master.hooks import HOOKS as HOOKS
from workers.master.hooks import (
    child_exit,
    control_socket_disable,
    logger_class,
    nworkers_changed,
    on_exit,
    on_starting,
    post_fork,
    post_worker_init,
    pre_fork,
    when_ready,
    worker_exit,
)
from workers.master.hooks import compose as compose
from workers.master.hooks import control_socket_asked as control_socket_asked

# What ``from workers.gunicorn_conf import *`` gives a user's config file.
__all__ = [
    "child_exit",
    "control_socket_disable",
    "logger_class",
    "nworkers_changed",
    "on_exit",
    "on_starting",
    "post_fork",
    "post_worker_init",
    "pre_fork",
    "when_ready",
    "worker_exit",
]
