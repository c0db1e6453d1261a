"""Every setting a host's processes read from the environment, checked before they start.

A bad value must stop the process that is starting, naming the variable and what it
accepts, instead of starting a server whose every request then fails
(``CSLB_FANOUT_THREADS=0`` used to start, then answer 500 to each request). The knobs
are the declared ones (:class:`lbcore.knobs.Knob`), checked by their own parsers and
then by the settings objects that join them (``CSLB_RETRY_TO=ingress`` needs
``CSLB_FALLBACK_URL``), so there is one rule per knob, wherever it is checked.

Who checks what:

* the gunicorn master (``on_starting`` in :mod:`workers.master.hooks`): every group
  below, and the master's own (:data:`workers.master.supervisor.SUPERVISOR_KNOBS`); it
  exits with status 2. The discovery process checks its own settings (``cslb
  discovery`` exits 2); the master started it and exits 2 when it does, before any
  worker forks (``workers`` may not import ``discovery``, so that group is checked by
  discovery's own path, not re-declared here).
* ``cslb serve``: the same groups before it execs gunicorn (argparse's status 2).
* :meth:`workers.Router.attach` outside gunicorn: the groups a router reads
  (:data:`ROUTER_GROUPS`); a library must not end its host process, so it raises
  :class:`lbcore.knobs.KnobError` for the caller to report.

The product pods' load-report middleware (:mod:`workers.serving`) runs in the pods, not
in this service's processes: its settings are checked where it is built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lbcore.knobs import LOG_KNOBS, ROUTING_KNOBS, Knob, KnobError, from_mapping
from lbcore.report_settings import REPORT_KNOBS, ReportSettings
from shm.settings import SHM_NAMESPACE
from workers.fanout.settings import FANOUT_KNOBS, FanoutSettings

__all__ = ["ALL_GROUPS", "ROUTER_GROUPS", "SettingsGroup", "check_environment", "groups"]


class SettingsGroup:
    """One part's settings: its knobs and the check that joins them.

    Parameters
    ----------
    name
        The part, as the docs name it (``"fan-out"``).
    knobs
        Its declared knobs (a callable: some live in modules that import this one).
    join
        ``join(environ)``: builds the part's settings object from the environment, so
        the rules between knobs are checked too (``None``: each knob alone).
    """

    def __init__(
        self,
        name: str,
        knobs: Callable[[], Sequence[Knob]],
        join: Callable[[Mapping[str, str]], Any] | None = None,
    ) -> None:
        self.name = name
        self._knobs = knobs
        self._join = join

    @property
    def knobs(self) -> tuple[Knob, ...]:
        """The group's knobs."""
        return tuple(self._knobs())

    def check(self, environ: Mapping[str, str]) -> None:
        """Raise :class:`KnobError` naming the variable if one is unusable."""
        from_mapping(environ, self.knobs, source="environment")
        if self._join is not None:
            try:
                self._join(environ)
            except KnobError:
                raise
            except ValueError as exc:  # rules between knobs: the message names both
                raise KnobError(f"environment: {exc}") from None


def _router_knobs() -> Sequence[Knob]:
    from workers.routing.router import ROUTER_KNOBS

    return ROUTER_KNOBS


def _app_knobs() -> Sequence[Knob]:
    from workers.surfaces.app import APP_KNOBS
    from workers.surfaces.mount import APP

    return (*APP_KNOBS, APP)


def _master_knobs() -> Sequence[Knob]:
    from workers.master.supervisor import SUPERVISOR_KNOBS

    return SUPERVISOR_KNOBS


def _master_join(environ: Mapping[str, str]) -> None:
    from workers.master.supervisor import check_settings, settings_from_env

    check_settings(settings_from_env(environ))


#: What a worker's router reads: its namespace, its own and the fan-out's settings.
ROUTER_GROUPS: tuple[SettingsGroup, ...] = (
    SettingsGroup("shared memory", lambda: (SHM_NAMESPACE,)),
    SettingsGroup("router", _router_knobs),
    SettingsGroup("fan-out", lambda: FANOUT_KNOBS, FanoutSettings.from_env),
)

#: Everything a gunicorn master under cslb's config module and its workers read
#: (discovery's own settings are checked by discovery: see the module's docstring).
ALL_GROUPS: tuple[SettingsGroup, ...] = (
    *ROUTER_GROUPS,
    SettingsGroup("logs", lambda: LOG_KNOBS),
    SettingsGroup("app", _app_knobs),
    SettingsGroup("routing", lambda: ROUTING_KNOBS),
    SettingsGroup("load reports", lambda: REPORT_KNOBS, ReportSettings.from_mapping),
    SettingsGroup("master", _master_knobs, _master_join),
)


def groups() -> dict[str, SettingsGroup]:
    """Every group of :data:`ALL_GROUPS` by name."""
    return {g.name: g for g in ALL_GROUPS}


def check_environment(
    environ: Mapping[str, str] | None = None,
    checked: Sequence[SettingsGroup] = ALL_GROUPS,
) -> None:
    """Check every setting of ``checked`` in ``environ`` (default: ``os.environ``).

    Raises
    ------
    lbcore.knobs.KnobError
        The first unusable setting: the message names the variable and what it accepts
        (``environment: invalid CSLB_FANOUT_THREADS='0': expected an integer from 1 to
        1024``), or the settings that contradict each other.
    """
    env = os.environ if environ is None else environ
    for group in checked:
        group.check(env)
