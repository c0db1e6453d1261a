"""Namespaces and segment names: ``/cslb.<namespace>.<kind>[.<epoch>]``, listing, unlinking.

A namespace is the part of every segment name one host's discovery and workers share;
data segments carry an epoch (the number after the kind) so a grown segment can be
created beside the one readers still map.
"""

from __future__ import annotations

import os
import re

import posix_ipc

from shm.errors import NamespaceError

__all__ = [
    "SHM_DIR",
    "check_namespace",
    "current_inode",
    "epoch_segments",
    "list_segments",
    "segment_name",
    "unlink_name",
    "unlink_stale_epochs",
]

#: Where Linux keeps POSIX shared memory (used for free-space checks and listings).
SHM_DIR = "/dev/shm"

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_namespace(namespace: str) -> str:
    """Validate a namespace: 1-64 characters from ``A-Z a-z 0-9 _ -``.

    Raises
    ------
    NamespaceError
        Naming the offending namespace and the allowed characters.
    """
    if not isinstance(namespace, str):
        raise NamespaceError(f"namespace must be a string, got {type(namespace).__name__}")
    if not _NAMESPACE_RE.fullmatch(namespace):
        raise NamespaceError(
            f"namespace {namespace!r} is invalid: use 1 to 64 characters from "
            "A-Z, a-z, 0-9, '_' and '-' (it becomes part of /dev/shm file names)"
        )
    return namespace


def segment_name(namespace: str, kind: str, epoch: int | None = None) -> str:
    """POSIX name of a segment: ``/cslb.<namespace>.<kind>`` or ``...<kind>.<epoch>``."""
    base = f"/cslb.{check_namespace(namespace)}.{kind}"
    return base if epoch is None else f"{base}.{int(epoch)}"


def list_segments(namespace: str) -> list[str]:
    """Names of all existing segments of ``namespace`` (empty where /dev/shm is absent)."""
    prefix = f"cslb.{check_namespace(namespace)}."
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted("/" + e for e in entries if e.startswith(prefix))


def epoch_segments(namespace: str, kind: str) -> dict[int, str]:
    """Existing data segments ``/cslb.<namespace>.<kind>.<epoch>``, by epoch."""
    base = segment_name(namespace, kind) + "."
    out = {}
    for name in list_segments(namespace):
        tail = name[len(base) :]
        if name.startswith(base) and tail.isascii() and tail.isdigit():
            out[int(tail)] = name
    return out


def unlink_stale_epochs(namespace: str, kind: str, keep: int | None) -> list[str]:
    """Unlink every data segment of ``kind`` but epoch ``keep``; returns what it removed.

    Only for the holder of the kind's lock (the table writer; a counters grower under
    the control segment's lock): then no other process is creating or switching data
    segments, so every epoch the control segment does not name is a leftover of a
    process killed while growing (the new segment before the switch, or the old one
    after it). Readers that still map a removed segment keep their mapping.
    """
    removed = []
    for epoch, name in sorted(epoch_segments(namespace, kind).items()):
        if epoch != keep and unlink_name(name):
            removed.append(name)
    return removed


def current_inode(name: str) -> int | None:
    """Inode of the segment now named ``name`` (``None`` if there is none)."""
    try:
        return os.stat(SHM_DIR + name).st_ino
    except OSError:
        return None


def unlink_name(name: str) -> bool:
    """Remove a segment name from ``/dev/shm``; False if it did not exist."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    return True
