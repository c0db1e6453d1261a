"""gunicorn's ``-c python:workers.gunicorn_conf``: re-exports :mod:`workers.master.hooks`."""

# The hooks and settings gunicorn reads as attributes (``__all__``: what
# ``from workers.gunicorn_conf import *`` gives a user's config file), then the other
# public names: ``compose``, the master's handle for tests and tools.
import sys

try:
    from workers.master.duties import MASTER as MASTER
    from workers.master.duties import MIN_GUNICORN as MIN_GUNICORN
    from workers.master.duties import CslbStartupError as CslbStartupError
    from workers.master.duties import Master as Master
    from workers.master.duties import check_gunicorn as check_gunicorn
    from workers.master.duties import hook_arbiter_loop as hook_arbiter_loop
    from workers.master.hooks import *  # noqa: F403
    from workers.master.hooks import HOOKS as HOOKS
    from workers.master.hooks import __all__ as __all__
    from workers.master.hooks import compose as compose
    from workers.master.hooks import control_socket_asked as control_socket_asked
except Exception as exc:
    # A setting read while the modules load (CSLB_KERNEL picks the kernel at import)
    # is refused before on_starting could check it: the same status 2 as the others.
    if type(exc).__name__ != "KnobError":
        raise
    sys.stderr.write(f"Error: cslb: {exc}\n")
    raise SystemExit(2) from None
