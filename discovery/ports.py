"""What the discovery loop needs from its parts: an informer and a publisher.

:class:`discovery.service.Discovery` is written against these, so tests drive it with
fakes and the Kubernetes informers and the shared-memory publisher stay swappable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from discovery.outlier import Totals
from discovery.ringstate import Transition
from lbcore.ejection import Ejections
from shm.tables.zone import ZoneCurve

__all__ = ["InformerLike", "PublisherLike"]


class InformerLike(Protocol):
    """What the loop needs from an informer (:mod:`discovery.informers`)."""

    def start(self) -> None:
        """Start its thread."""
        ...

    def signal_stop(self) -> None:
        """Ask its thread to stop (cutting a blocked request); must not wait."""
        ...

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for its thread; True once it has ended."""
        ...


class PublisherLike(Protocol):
    """What the loop needs from :class:`discovery.publisher.Publisher`."""

    recovered: Any
    generation: int

    def publish(
        self,
        t: Transition,
        knobs: Mapping[str, Any],
        now_ns: int,
        *,
        ejections: Ejections | None = None,
        outlier_panic: bool = False,
        zone: ZoneCurve | None = None,
    ) -> int:
        """Publish; returns the generation."""
        ...

    def counter_totals(self, endpoints: tuple[str, ...]) -> Totals | None:
        """Lifetime counter totals of ``endpoints`` (``None``: no counters)."""
        ...

    def heartbeat(self, now_ns: int) -> None:
        """Mark the publisher alive."""
        ...

    def set_status(self, problem: str, since_ns: int) -> None:
        """Report what is wrong with the sources (``""``: nothing)."""
        ...

    def close(self, *, unlink: bool = True) -> None:
        """Stop publishing."""
        ...
