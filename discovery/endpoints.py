"""EndpointSlices to endpoint addresses, the way Skipper's Kubernetes dataclient builds them.

Skipper hashes the exact address string into its ring, so cslb must produce the same
strings from the same EndpointSlices or the rings differ. The rules, as Skipper's
``collectReadyEndpoints`` applies them (dataclients/kubernetes, v0.21+):

* a slice with ``ports: null`` contributes nothing;
* per endpoint only ``addresses[0]`` counts (kube-proxy does the same);
* an endpoint is *terminating* if ``conditions.terminating`` is true; an address that is
  terminating in any slice stays out, whatever other slices say about it (eventual
  consistency: the terminating copy is the newer truth);
* otherwise it is in if ``conditions`` is null, or ``ready`` is null/true, or ``serving``
  is null/true (a pod that is not ready has ``serving: false`` too since Kubernetes 1.22);
* addresses are de-duplicated across slices, formatted ``scheme://host:port`` with IPv6
  hosts in brackets (Go's ``net.JoinHostPort``), and sorted as strings.

The port is chosen per slice: the TCP port called ``port_name`` (or, if ``port_name`` is
all digits, the TCP port with that number: Kubernetes port names must contain a letter,
so the two cannot be confused), or, without one, the slice's only TCP port. (Skipper
takes the last slice's ports for all slices of a Service; every EndpointSlice controller
writes the same ports into all slices of one Service, so the results agree.) cslb
additionally keeps each endpoint's ``nodeName`` and pod name (``targetRef.name``) for
logs and ``cslb inspect``.

Malformed slices (missing or wrongly typed fields, addresses that are not IPs of the
slice's address type) raise :class:`SliceError` naming the slice and the field; single
bad endpoints inside an otherwise valid slice are skipped and reported as problems, so
one bad entry never hides the rest of the Service.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from discovery.address import format_address
from discovery.static import EndpointSpec, check_label

__all__ = [
    "ADDRESS_TYPES",
    "ParsedSlice",
    "SliceEndpoint",
    "SliceError",
    "format_address",
    "merge_slices",
    "parse_member_slice",
    "parse_slice",
]

#: EndpointSlice ``addressType`` values cslb understands.
ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")

# RFC 1123 DNS name (what Kubernetes validates FQDN endpoint addresses against).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")


class SliceError(ValueError):
    """An EndpointSlice does not have the shape the Kubernetes API defines."""


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    """One endpoint of a slice, before de-duplication across slices.

    ``address`` is the final ``scheme://host:port`` string; ``host`` is ``addresses[0]``.
    """

    address: str
    host: str
    zone: str
    node: str
    pod: str
    terminating: bool
    ready: bool


@dataclass(frozen=True, slots=True)
class ParsedSlice:
    """A validated EndpointSlice reduced to what routing needs.

    Attributes
    ----------
    name
        ``metadata.name``.
    resource_version
        ``metadata.resourceVersion`` (opaque string, may be empty).
    endpoints
        Every endpoint with a usable address and port, ready or not.
    problems
        Human-readable reasons for endpoints that were skipped (bad IP, no address...).
    port
        The port used, or ``None`` when the slice has none that fits (no endpoints).
    """

    name: str
    resource_version: str
    endpoints: tuple[SliceEndpoint, ...]
    problems: tuple[str, ...] = field(default=())
    port: int | None = None


def _opt_str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SliceError(f"{where}: '{key}' must be a string, got {type(value).__name__}")
    problem = check_label(value)
    if problem is not None:
        raise SliceError(f"{where}: '{key}' {problem}")
    return value


def _opt_bool(obj: Mapping[str, Any], key: str, where: str) -> bool | None:
    value = obj.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise SliceError(f"{where}: '{key}' must be true, false or null, got {value!r:.40}")


def _pick_port(ports: Any, port_name: str | None, where: str) -> tuple[int | None, str]:
    """The slice's port for ``port_name`` (or its only TCP port) and, if none, why."""
    if not isinstance(ports, list):
        raise SliceError(f"{where}: 'ports' must be a list or null, got {type(ports).__name__}")
    tcp: list[tuple[str, int]] = []
    for i, p in enumerate(ports):
        if not isinstance(p, dict):
            raise SliceError(f"{where}: ports[{i}] must be an object, got {type(p).__name__}")
        name = _opt_str(p, "name", f"{where}: ports[{i}]")
        protocol = _opt_str(p, "protocol", f"{where}: ports[{i}]") or "TCP"
        number = p.get("port")
        if number is None:
            continue  # "all ports": nothing Skipper could format
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
            raise SliceError(
                f"{where}: ports[{i}].port must be an integer 1-65535, got {number!r:.40}"
            )
        if protocol == "TCP":
            tcp.append((name, number))
    if port_name and port_name.isdigit():
        for _, number in tcp:
            if number == int(port_name):
                return number, ""
        numbers = ", ".join(str(p) for _, p in tcp) or "none"
        return None, f"no TCP port {port_name} (ports: {numbers})"
    if port_name:
        for name, number in tcp:
            if name == port_name:
                return number, ""
        names = ", ".join(repr(n) for n, _ in tcp) or "none"
        return None, f"no TCP port named {port_name!r} (ports: {names})"
    if len(tcp) == 1:
        return tcp[0][1], ""
    if not tcp:
        return None, "no TCP port"
    names = ", ".join(f"{n or '<unnamed>'}={p}" for n, p in tcp)
    return None, f"{len(tcp)} TCP ports ({names}): choose one with --port-name"


def _check_host(host: str, address_type: str) -> str | None:
    """Why ``host`` is not a valid address of ``address_type`` (``None`` if it is)."""
    if address_type == "FQDN":
        if len(host) <= 253 and _DNS_NAME.match(host):
            return None
        return f"{host!r} is not a DNS name"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"{host!r} is not an IP address"
    if ip.version != (4 if address_type == "IPv4" else 6):
        return f"{host!r} is not an {address_type} address"
    if str(ip) != host:
        # Kubernetes stores canonical text; a non-canonical form would hash differently.
        return f"{host!r} is not in canonical form ({ip})"
    return None


def _slice_head(obj: Any) -> tuple[str, str, str, list[Any], str]:
    """A slice's name, resource version, address type, raw endpoints and its log name."""
    if not isinstance(obj, dict):
        raise SliceError(f"EndpointSlice must be a JSON object, got {type(obj).__name__}")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise SliceError("EndpointSlice has no 'metadata' object")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise SliceError("EndpointSlice has no metadata.name")
    where = f"EndpointSlice {name}"
    rv = _opt_str(meta, "resourceVersion", f"{where}: metadata")
    address_type = obj.get("addressType")
    if address_type not in ADDRESS_TYPES:
        raise SliceError(
            f"{where}: addressType is {address_type!r:.40}, expected one of {ADDRESS_TYPES}"
        )
    raw_eps = obj.get("endpoints")
    if raw_eps is None:
        raw_eps = []
    if not isinstance(raw_eps, list):
        raise SliceError(
            f"{where}: 'endpoints' must be a list or null, got {type(raw_eps).__name__}"
        )
    return name, rv, address_type, raw_eps, where


def parse_slice(obj: Any, *, port_name: str | None = None, scheme: str = "http") -> ParsedSlice:
    """Validate one EndpointSlice (a decoded JSON object) and extract its endpoints.

    Parameters
    ----------
    obj
        The slice as the API returns it (``{"metadata": ..., "addressType": ..., ...}``).
    port_name
        Name of the port to use, or its number as digits (``"8080"``); ``None`` means the
        slice's only TCP port.
    scheme
        URL scheme of the endpoint addresses (Skipper: ``http`` unless the backend says
        otherwise).

    Raises
    ------
    SliceError
        If the slice itself is malformed (no name, unknown ``addressType``, fields of the
        wrong type). Bad single endpoints are reported in :attr:`ParsedSlice.problems`.
    """
    name, rv, address_type, raw_eps, where = _slice_head(obj)
    raw_ports = obj.get("ports")
    if raw_ports is None:
        # Skipper ignores slices without ports (zalando/skipper#3151).
        return ParsedSlice(name, rv, (), ("ports is null: slice ignored",) if raw_eps else ())
    port, why = _pick_port(raw_ports, port_name, where)
    problems: list[str] = []
    if port is None:
        if raw_eps:
            problems.append(f"{why}: {len(raw_eps)} endpoint(s) not used")
        return ParsedSlice(name, rv, (), tuple(problems), None)
    out = _slice_endpoints(
        raw_eps, address_type, where, lambda host: format_address(scheme, host, port), problems
    )
    return ParsedSlice(name, rv, tuple(out), tuple(problems), port)


def _slice_endpoints(
    raw_eps: list[Any],
    address_type: str,
    where: str,
    address: Callable[[str], str],
    problems: list[str],
) -> list[SliceEndpoint]:
    """A slice's endpoints with their conditions; bad ones are added to ``problems``."""
    out: list[SliceEndpoint] = []
    for i, ep in enumerate(raw_eps):
        ew = f"{where}: endpoints[{i}]"
        if not isinstance(ep, dict):
            problems.append(f"{ew} is not an object")
            continue
        addrs = ep.get("addresses")
        if not isinstance(addrs, list) or not addrs or not isinstance(addrs[0], str):
            problems.append(f"{ew} has no addresses")
            continue
        host = addrs[0]
        bad = _check_host(host, address_type)
        if bad:
            problems.append(f"{ew}: {bad}")
            continue
        try:
            cond = ep.get("conditions")
            if cond is not None and not isinstance(cond, dict):
                raise SliceError(f"{ew}: 'conditions' must be an object or null")
            if cond is None:
                terminating, ready = False, True
            else:
                terminating = bool(_opt_bool(cond, "terminating", ew))
                r = _opt_bool(cond, "ready", ew)
                s = _opt_bool(cond, "serving", ew)
                ready = not terminating and (r is None or r or s is None or s)
            zone = _opt_str(ep, "zone", ew)
            node = _opt_str(ep, "nodeName", ew)
            ref = ep.get("targetRef")
            pod = _opt_str(ref, "name", f"{ew}: targetRef") if isinstance(ref, dict) else ""
        except SliceError as exc:
            problems.append(str(exc))
            continue
        out.append(SliceEndpoint(address(host), host, zone, node, pod, terminating, ready))
    return out


def parse_member_slice(obj: Any) -> ParsedSlice:
    """A slice's pods by IP, whatever their ports: the members of a Service.

    What the caller's own Service's slices are read for (:mod:`discovery.callers`): the
    caller's own pod by its IP, and the ready pods per zone. Each endpoint's
    ``address`` is its IP (``addresses[0]``); readiness, terminating and zone follow
    the same rules as :func:`parse_slice`'s. Slices with ``ports: null`` count too (a
    Service's pods are its members whatever it exposes).

    Raises
    ------
    SliceError
        If the slice itself is malformed (as :func:`parse_slice`).
    """
    name, rv, address_type, raw_eps, where = _slice_head(obj)
    problems: list[str] = []
    out = _slice_endpoints(raw_eps, address_type, where, lambda host: host, problems)
    return ParsedSlice(name, rv, tuple(out), tuple(problems), None)


def merge_slices(slices: Iterable[ParsedSlice]) -> tuple[EndpointSpec, ...]:
    """The Service's ready endpoints: de-duplicated across slices, sorted by address.

    An address terminating in any slice is out. Among ready copies of one address the
    last slice (in ``slices`` order) gives zone, node and pod.
    """
    terminating: set[str] = set()
    ready: dict[str, SliceEndpoint] = {}
    for s in slices:
        for ep in s.endpoints:
            if ep.address in terminating:
                continue
            if ep.terminating:
                terminating.add(ep.address)
                ready.pop(ep.address, None)
            elif ep.ready:
                ready[ep.address] = ep
    return tuple(
        EndpointSpec(ep.address, ep.zone, ep.node, ep.pod)
        for ep in sorted(ready.values(), key=lambda e: e.address)
    )
