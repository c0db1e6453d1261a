"""Saying, in the worker's log, that a worker routes every key to fallback for want of a table.

A worker whose namespace has no published table answers every key with the fallback
(``-1``) by design: it keeps serving while discovery starts, and a user's batch goes
through the ingress meanwhile. Silent, that looks like empty answers (a service run as
``gunicorn myapp:app`` without cslb's config module, so without a discovery process,
answered 200 with every product missing). :class:`NoTableNotice` makes it loud but not
noisy: one warning the first time a batch finds no table, one more every
:data:`REPEAT_S` while it lasts (with how many keys fell back since), and one line when
a table arrives, so the log holds the start, the duration and the end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from lbcore.logformat import Event

__all__ = ["REPEAT_S", "NoTableNotice"]

log = logging.getLogger("cslb.router")

#: While there is no table, the warning is repeated this often (seconds).
REPEAT_S = 60.0

#: What to do about it, in the warning.
FIX = (
    "run the service under cslb's config module (gunicorn -c python:workers.gunicorn_conf "
    "...: it starts the host's discovery) or start 'cslb discovery' on this host with the "
    "same CSLB_SHM_NAMESPACE"
)


class NoTableNotice:
    """The no-table warning of one router (thread-safe; nothing to do on the routed path).

    Parameters
    ----------
    namespace
        The shared-memory namespace the router reads.
    clock
        CLOCK_MONOTONIC nanoseconds.
    fallback_to
        Where ``router.fanout`` sends fallback keys: the ingress URL, or ``""`` when it
        returns them to the caller (``r.fallback``, no call made).
    """

    def __init__(
        self, namespace: str, clock: Callable[[], int], fallback_to: Callable[[], str]
    ) -> None:
        self.namespace = namespace
        self._clock = clock
        self._fallback_to = fallback_to
        self._lock = threading.Lock()
        #: When the current stretch without a table began (CLOCK_MONOTONIC ns; 0: none).
        self.since = 0
        self._next = 0  # when the next repeat is due
        self._keys = 0  # keys answered with the fallback since the last line
        self._total = 0  # ... since the stretch began

    @property
    def active(self) -> bool:
        """True while the router has found no table since it last had one."""
        return self.since != 0

    def no_table(self, keys: int, why: str | None) -> None:
        """A batch of ``keys`` keys found no table; warn when due. ``why``: the reader's reason."""
        with self._lock:
            now = self._clock()
            self._keys += keys
            self._total += keys
            first = self.since == 0
            if first:
                self.since = now
            elif now < self._next:
                return
            self._next = now + int(REPEAT_S * 1e9)
            keys_since, self._keys = self._keys, 0
            lasted_s = round((now - self.since) / 1e9, 1)
        to = self._fallback_to()
        log.warning(
            Event(
                "no_routing_table" if first else "still_no_routing_table",
                shm_namespace=self.namespace,
                lasted_s=lasted_s,
                fallback_keys=keys_since,
                reason=why or "no table in this namespace",
                fallback=(
                    f"router.fanout sends every key to CSLB_FALLBACK_URL {to}"
                    if to
                    else "every key comes back with r.fallback and no call made "
                    "(CSLB_FALLBACK_URL is not set): send them through your ingress"
                ),
                fix=FIX,
                repeated_every_s=REPEAT_S,
            )
        )

    def table(self) -> None:
        """A batch found a table: end the stretch (one line if there was one)."""
        if self.since == 0:
            return
        with self._lock:
            if self.since == 0:
                return
            lasted_s = round((self._clock() - self.since) / 1e9, 1)
            total, self.since, self._keys, self._total = self._total, 0, 0, 0
        log.info(
            Event(
                "routing_table_found",
                shm_namespace=self.namespace,
                without_table_s=lasted_s,
                fallback_keys=total,
            )
        )
