"""Shared-memory namespaces of the tests: unique to this test process, and every segment
under them unlinked afterwards (a crashed test's leftovers too)."""

from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from collections.abc import Iterator

from shm.names import SHM_DIR, unlink_name


def segments(prefix: str) -> list[str]:
    """The segment names (``/cslb.<prefix>...``) that start with ``prefix``."""
    try:
        return sorted("/" + e for e in os.listdir(SHM_DIR) if e.startswith(f"cslb.{prefix}"))
    except OSError:
        return []


class Namespaces:
    """The namespaces of one family of tests: ``<tag><pid>x<n><random>``.

    Parameters
    ----------
    tag
        Tells the families apart (a few letters), so one family's sweep leaves the
        others' segments alone.
    """

    def __init__(self, tag: str) -> None:
        self.prefix = f"{tag}{os.getpid()}x"
        self._counter = itertools.count()

    def new(self) -> str:
        """A namespace no other test of this process uses."""
        return f"{self.prefix}{next(self._counter)}{uuid.uuid4().hex[:6]}"

    @contextlib.contextmanager
    def one(self) -> Iterator[str]:
        """A new namespace; every segment under it is unlinked afterwards."""
        ns = self.new()
        try:
            yield ns
        finally:
            for name in segments(f"{ns}."):
                unlink_name(name)

    def sweep(self) -> None:
        """Unlink every segment of this family left behind."""
        for name in segments(self.prefix):
            unlink_name(name)
