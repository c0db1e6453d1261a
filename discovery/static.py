"""Static endpoint sources: a JSON or YAML file of endpoints, or a list given on the command line.

File format (JSON or YAML, by extension; JSON if unsure)::

    {"endpoints": [
        {"address": "http://10.2.0.1:8080", "zone": "eu-central-1a", "node": "ip-10-2-0-1"},
        "http://10.2.0.2:8080"
    ]}

A bare list of the same entries is accepted too. An entry's fields are ``address``
(required), ``zone``, ``node`` and ``pod`` (strings, for logs and ``cslb inspect``); any
other field is refused by name. There are no weights: Skipper's consistentHash ignores
endpoint weights, and so does cslb's ring. Addresses are hashed verbatim, as Skipper
hashes them, so they must be in the form its Kubernetes dataclient builds,
``scheme://host:port`` (:mod:`discovery.address`); any other spelling is refused with
the entry and the expected form.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from discovery.address import EXPECTED_FORM, check_address

__all__ = [
    "ENTRY_FIELDS",
    "EndpointSpec",
    "EndpointsFileError",
    "load_endpoints_file",
    "parse_endpoints",
]

#: The fields an endpoint entry may have.
ENTRY_FIELDS = ("address", "zone", "node", "pod")

# Fields people write that cslb does not have, and what to do instead.
_NOT_SUPPORTED = {
    "weight": "endpoint weights are not supported (Skipper's consistentHash ignores them, "
    "and so does cslb's ring): remove the field",
}


class EndpointsFileError(ValueError):
    """An endpoints file cannot be read or does not have the expected shape."""


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """One endpoint: its address (verbatim, as Skipper hashes it), zone, node and pod name."""

    address: str
    zone: str = ""
    node: str = ""
    pod: str = ""


def _entry(item: Any, i: int, source: str) -> EndpointSpec:
    if isinstance(item, str):
        return EndpointSpec(item)
    if not (isinstance(item, dict) and isinstance(item.get("address"), str)):
        raise EndpointsFileError(
            f"{source}: endpoint {i} must be an address string or an object with an "
            f"'address' string, got {item!r:.80}"
        )
    where = f"{source}: endpoint {i} ({item['address']!r:.80})"
    unknown = [k for k in item if k not in ENTRY_FIELDS]
    if unknown:
        name = str(unknown[0])
        why = _NOT_SUPPORTED.get(name, f"the fields are {', '.join(ENTRY_FIELDS)}")
        raise EndpointsFileError(f"{where}: unknown field {name[:64]!r}: {why}")
    extra = {}
    for name in ENTRY_FIELDS[1:]:
        value = item.get(name)
        if value is not None and not isinstance(value, str):
            raise EndpointsFileError(
                f"{where}: {name!r} must be a string, got {type(value).__name__}"
            )
        extra[name] = value or ""
    return EndpointSpec(item["address"], **extra)


def parse_endpoints(doc: Any, source: str = "endpoints") -> list[EndpointSpec]:
    """Validate a decoded endpoints document and return its endpoints in order.

    Raises
    ------
    EndpointsFileError
        Naming the entry: the document is not a list (or ``{"endpoints": list}``) of
        address strings or objects with an ``address`` string; an entry has a field other
        than :data:`ENTRY_FIELDS`; an address is not in Skipper's ``scheme://host:port``
        form; or an address repeats.
    """
    items = doc.get("endpoints") if isinstance(doc, dict) else doc
    if isinstance(doc, dict) and set(doc) - {"endpoints"}:
        other = sorted(str(k) for k in doc if k != "endpoints")
        raise EndpointsFileError(
            f"{source}: unknown top-level field {other[0][:64]!r}; the file holds an "
            "'endpoints' list (or is a bare list)"
        )
    if not isinstance(items, list):
        raise EndpointsFileError(
            f"{source}: expected a list of endpoints or an object with an 'endpoints' list, "
            f"got {type(items).__name__}"
        )
    out: list[EndpointSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        spec = _entry(item, i, source)
        problem = check_address(spec.address)
        if problem is not None:
            raise EndpointsFileError(
                f"{source}: endpoint {i} address {spec.address!r:.200} is not in Skipper's "
                f"form: {problem}; expected {EXPECTED_FORM}"
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

    @property
    def error(self) -> str | None:
        """Why the file's last read could not be used (``None``: it was good)."""
        return self._error

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
