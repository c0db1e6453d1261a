"""Static endpoint sources: a JSON or YAML file of endpoints, or a list given on the command line.

File format (JSON or YAML, by extension; JSON if unsure)::

    {"endpoints": [
        {"address": "http://10.2.0.1:8080", "zone": "eu-central-1a", "node": "ip-10-2-0-1"},
        "http://10.2.0.2:8080"
    ]}

A bare list of the same entries is accepted too. The object may also say how many
callers (hosts running cslb) each zone holds, for zone affinity's capacity cap
(:func:`parse_callers`): ``"callers": {"eu-central-1a": 4, "eu-central-1b": 2}``. An
entry's fields are ``address``
(required), ``zone``, ``node`` and ``pod`` (strings, for logs and ``cslb inspect``); any
other field is refused by name. There are no weights: Skipper's consistentHash ignores
endpoint weights, and so does cslb's ring. Addresses are hashed verbatim, as Skipper
hashes them, so they must be in the form its Kubernetes dataclient builds,
``scheme://host:port`` (:mod:`discovery.address`); any other spelling is refused with
the entry and the expected form.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import unicodedata
from dataclasses import dataclass
from typing import Any

from discovery.address import EXPECTED_FORM, check_address

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "ENTRY_FIELDS",
    "EndpointSpec",
    "EndpointsFileError",
    "check_label",
    "load_endpoints_document",
    "load_endpoints_file",
    "parse_callers",
    "parse_endpoints",
    "read_endpoints_text",
]

#: The fields an endpoint entry may have.
ENTRY_FIELDS = ("address", "zone", "node", "pod")

#: Largest endpoints file read when no limit is given (``--endpoints-file-max-bytes``).
DEFAULT_MAX_FILE_BYTES = 32 << 20

# Longest label: Kubernetes names (nodes, pods) and topology zone values fit in 253.
_MAX_LABEL_CHARS = 253

#: Top-level fields of an endpoints file written as an object.
TOP_FIELDS = ("endpoints", "callers")

# Most callers one zone may be said to hold (far beyond any fleet; keeps sums exact).
_MAX_CALLERS = 1_000_000

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
        problem = check_label(value or "")
        if problem is not None:
            raise EndpointsFileError(f"{where}: {name!r} {problem}")
        extra[name] = value or ""
    return EndpointSpec(item["address"], **extra)


def check_label(value: str) -> str | None:
    """Why ``value`` cannot be a zone, node or pod label; ``None`` if it can.

    Labels are written into the tables as UTF-8, printed by ``cslb inspect`` and put in
    log lines and metric labels, so they must encode (no lone surrogates), hold no
    control characters (NUL ends C strings, ESC drives terminals) and stay short.
    """
    if len(value) > _MAX_LABEL_CHARS:
        return f"is {len(value)} characters long; at most {_MAX_LABEL_CHARS} are allowed"
    for i, ch in enumerate(value):
        cat = unicodedata.category(ch)
        if cat == "Cs":
            return f"has a lone surrogate (U+{ord(ch):04X}) at character {i}: not encodable"
        if cat in ("Cc", "Cf", "Zl", "Zp"):
            return f"has a control or format character (U+{ord(ch):04X}) at character {i}"
    return None


def parse_callers(doc: Any, source: str = "endpoints") -> dict[str, int] | None:
    """The ``callers`` object of a decoded endpoints document (``None``: not given).

    Raises
    ------
    EndpointsFileError
        Naming the zone: ``callers`` is not an object of zone names to whole numbers
        from 0 to 1,000,000, or a zone name is empty or not a valid label.
    """
    if not isinstance(doc, dict) or doc.get("callers") is None:
        return None
    raw = doc["callers"]
    if not isinstance(raw, dict):
        raise EndpointsFileError(
            f"{source}: 'callers' must be an object of zone to number of callers "
            f'(e.g. {{"eu-central-1a": 4}}), got {type(raw).__name__}'
        )
    out: dict[str, int] = {}
    for zone, n in raw.items():
        where = f"{source}: callers[{str(zone)[:64]!r}]"
        if not isinstance(zone, str) or not zone:
            raise EndpointsFileError(f"{where}: a zone name must be a non-empty string")
        problem = check_label(zone)
        if problem is not None:
            raise EndpointsFileError(f"{where}: the zone name {problem}")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= _MAX_CALLERS:
            raise EndpointsFileError(
                f"{where}: must be a whole number of callers from 0 to {_MAX_CALLERS}, "
                f"got {n!r:.40}"
            )
        out[zone] = n
    return out


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
    if isinstance(doc, dict) and set(doc) - set(TOP_FIELDS):
        other = sorted(str(k) for k in doc if k not in TOP_FIELDS)
        raise EndpointsFileError(
            f"{source}: unknown top-level field {other[0][:64]!r}; the file holds an "
            "'endpoints' list and optionally 'callers' (or is a bare list)"
        )
    parse_callers(doc, source)
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


def read_endpoints_text(path: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> str:
    """The text of the endpoints file ``path``, refused unless it is a small regular file.

    The file is opened with ``O_NONBLOCK`` and checked with ``fstat`` before anything is
    read, so a FIFO (whose ``open`` would wait for a writer, deaf to SIGTERM), a device
    such as ``/dev/zero`` (endless) or a file over ``max_bytes`` is refused at once; a
    file that grows past the limit while it is read is refused too.

    Raises
    ------
    EndpointsFileError
        Naming the file and why: it cannot be opened, is not a regular file, is larger
        than ``max_bytes`` or is not valid UTF-8.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise EndpointsFileError(
            f"{path}: cannot read endpoints file: {exc.strerror or errno.errorcode.get(exc.errno)}"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _file_kind(st.st_mode)
            raise EndpointsFileError(
                f"{path}: the endpoints file is {kind}, not a regular file; refused "
                "(give a JSON or YAML file)"
            )
        if st.st_size > max_bytes:
            raise EndpointsFileError(
                f"{path}: the endpoints file is {st.st_size} bytes, over the limit of "
                f"{max_bytes} (--endpoints-file-max-bytes)"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            except OSError as exc:
                raise EndpointsFileError(
                    f"{path}: cannot read endpoints file: {exc.strerror}"
                ) from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise EndpointsFileError(
                    f"{path}: the endpoints file grew past the limit of {max_bytes} bytes "
                    "while it was read (--endpoints-file-max-bytes)"
                )
    finally:
        os.close(fd)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EndpointsFileError(
            f"{path}: the endpoints file is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _load_yaml(text: str) -> Any:
    """YAML without aliases.

    An endpoints file needs none, and a few lines of nested aliases ("billion laughs")
    would expand to more than any size limit allows.
    """
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise EndpointsFileError(
                    f"YAML alias *{event.anchor} at line {event.start_mark.line + 1}: "
                    "aliases are not allowed in an endpoints file (write the value out)"
                )
            return super().compose_node(parent, index)

    loader = NoAliases(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_endpoints_file(
    path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> list[EndpointSpec]:
    """Read and validate an endpoints file (``.yaml``/``.yml`` as YAML, anything else as JSON).

    Raises
    ------
    EndpointsFileError
        For anything wrong with the file (see :func:`read_endpoints_text` and
        :func:`parse_endpoints`), never another exception for its content.
    """
    return load_endpoints_document(path, max_bytes)[0]


def load_endpoints_document(
    path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> tuple[list[EndpointSpec], dict[str, int] | None]:
    """An endpoints file's endpoints and its ``callers`` (``None``: not given).

    Raises
    ------
    EndpointsFileError
        As :func:`load_endpoints_file`.
    """
    name = os.fspath(path)
    text = read_endpoints_text(name, max_bytes)
    kind = "YAML" if name.endswith((".yaml", ".yml")) else "JSON"
    try:
        if kind == "YAML":
            doc = _load_yaml(text)
        else:
            doc = json.loads(text)
    except EndpointsFileError as exc:
        raise EndpointsFileError(f"{name}: {exc}") from None
    except Exception as exc:
        raise EndpointsFileError(f"{name}: not valid {kind}: {str(exc)[:300]}") from None
    try:
        return parse_endpoints(doc, name), parse_callers(doc, name)
    except EndpointsFileError:
        raise
    except Exception as exc:
        # A decoder builds shapes the checks above do not expect (YAML keys that are
        # lists, recursion limits): still a bad file, not a crash.
        raise EndpointsFileError(
            f"{name}: cannot use the endpoints file: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None


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
    max_bytes
        Largest file read; a larger one (or one that is not a regular file) is refused.
    """

    def __init__(
        self, path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_FILE_BYTES
    ) -> None:
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self._signature: tuple[int, int, int, int] | None = None
        self._error: str | None = None
        self.endpoints: list[EndpointSpec] | None = None
        #: The last good file's ``callers`` (``None``: not given).
        self.callers: dict[str, int] | None = None

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

        A valid file's ``callers`` are kept in :attr:`callers`, changed or not.

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
            specs, callers = load_endpoints_document(self.path, self.max_bytes)
        except EndpointsFileError as exc:
            first = str(exc) != self._error
            self._error = str(exc)
            if first:
                raise
            return None
        self._error = None
        self.callers = callers
        if specs == self.endpoints:
            return None
        self.endpoints = specs
        return specs
