"""Static endpoint sources: a JSON or YAML file of endpoints, or a list given on the command line.

File format (JSON or YAML, by extension; JSON if unsure)::

    {"endpoints": [
        {"address": "http://10.2.0.1:8080", "zone": "eu-central-1a", "node": "ip-10-2-0-1"},
        "http://10.2.0.2:8080"
    ]}

A bare list of the same entries is accepted too. Addresses are used verbatim, as Skipper
hashes them: write them the way the dataclient builds them, ``scheme://ip:port``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["EndpointSpec", "EndpointsFileError", "load_endpoints_file", "parse_endpoints"]


class EndpointsFileError(ValueError):
    """An endpoints file cannot be read or does not have the expected shape."""


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """One endpoint: its address (verbatim, as Skipper hashes it), zone, node and pod name."""

    address: str
    zone: str = ""
    node: str = ""
    pod: str = ""


def parse_endpoints(doc: Any, source: str = "endpoints") -> list[EndpointSpec]:
    """Validate a decoded endpoints document and return its endpoints in order.

    Raises
    ------
    EndpointsFileError
        If the document is not a list (or ``{"endpoints": list}``) of address strings or
        objects with an ``address`` string, or if an address repeats.
    """
    items = doc.get("endpoints") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise EndpointsFileError(
            f"{source}: expected a list of endpoints or an object with an 'endpoints' list, "
            f"got {type(items).__name__}"
        )
    out: list[EndpointSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        if isinstance(item, str):
            spec = EndpointSpec(item)
        elif isinstance(item, dict) and isinstance(item.get("address"), str):
            zone, node = item.get("zone") or "", item.get("node") or ""
            if not isinstance(zone, str) or not isinstance(node, str):
                raise EndpointsFileError(f"{source}: endpoint {i}: zone and node must be strings")
            spec = EndpointSpec(item["address"], zone, node)
        else:
            raise EndpointsFileError(
                f"{source}: endpoint {i} must be an address string or an object with an "
                f"'address' string, got {item!r:.80}"
            )
        if not spec.address.strip() or spec.address != spec.address.strip():
            raise EndpointsFileError(
                f"{source}: endpoint {i} address {spec.address!r} is empty "
                "or has surrounding spaces"
            )
        if spec.address in seen:
            raise EndpointsFileError(f"{source}: endpoint {spec.address!r} is listed twice")
        seen.add(spec.address)
        out.append(spec)
    return out


def load_endpoints_file(path: str | os.PathLike[str]) -> list[EndpointSpec]:
    """Read and validate an endpoints file (``.yaml``/``.yml`` as YAML, anything else as JSON)."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise EndpointsFileError(f"{name}: cannot read endpoints file: {exc.strerror}") from None
    try:
        if name.endswith((".yaml", ".yml")):
            import yaml

            doc = yaml.safe_load(text)
        else:
            doc = json.loads(text)
    except Exception as exc:
        kind = "YAML" if name.endswith((".yaml", ".yml")) else "JSON"
        raise EndpointsFileError(f"{name}: not valid {kind}: {exc}") from None
    return parse_endpoints(doc, name)


class EndpointsFileWatcher:
    """Re-reads an endpoints file when it changes (polled; no thread, no inotify).

    A change is a different inode, size, modification or status-change time, so an
    editor's write-and-rename and a Kubernetes ConfigMap volume's symlink swap are both
    seen. A file that is missing or invalid leaves the last good endpoints in force;
    while it stays bad it is re-read on every poll (a half-written file becomes good
    without another change) but reported only once per distinct error.

    Parameters
    ----------
    path
        The endpoints file (JSON, or YAML by extension).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._signature: tuple[int, int, int, int] | None = None
        self._error: str | None = None
        self.endpoints: list[EndpointSpec] | None = None

    def _stat(self) -> tuple[int, int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def poll(self) -> list[EndpointSpec] | None:
        """The new endpoints if the file changed and is valid, else ``None``.

        Raises
        ------
        EndpointsFileError
            If the file changed (or was bad and still is) and cannot be used; raised once
            per distinct error message.
        """
        sig = self._stat()
        if sig is not None and sig == self._signature and self._error is None:
            return None
        self._signature = sig
        try:
            specs = load_endpoints_file(self.path)
        except EndpointsFileError as exc:
            first = str(exc) != self._error
            self._error = str(exc)
            if first:
                raise
            return None
        self._error = None
        if specs == self.endpoints:
            return None
        self.endpoints = specs
        return specs
