"""Endpoint addresses in the one form Skipper hashes: ``scheme://host:port``.

Skipper's ring hashes the LB endpoint's address string verbatim, and its Kubernetes
dataclient builds that string as ``scheme + "://" + net.JoinHostPort(ip, port)``:
a lowercase scheme, the IP in canonical text (IPv6 in brackets), a port, nothing after
it. Any other spelling of the same pod (``10.0.0.1:8080``, ``HTTP://...``, a trailing
``/``, no port) hashes to other ring positions, so routing would silently disagree with
Skipper's. :func:`check_address` refuses such strings with the reason;
:func:`format_address` builds the form from parts.
"""

from __future__ import annotations

import ipaddress
import re

__all__ = ["EXPECTED_FORM", "check_address", "format_address"]

#: How the expected form is named in error messages.
EXPECTED_FORM = (
    "scheme://host:port as Skipper hashes it, e.g. http://10.0.0.1:8080 or "
    "http://[2001:db8::1]:8080 (lowercase scheme, canonical IP or lowercase DNS name, "
    "a port, no path)"
)

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
# RFC 1123 DNS name, as Kubernetes validates FQDN endpoint addresses.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_PORT = re.compile(r"[1-9][0-9]{0,4}")


def format_address(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, with an IPv6 host in brackets (like Go's JoinHostPort)."""
    if ":" in host:
        return f"{scheme}://[{host}]:{port}"
    return f"{scheme}://{host}:{port}"


def _ip_problem(
    text: str, family: type[ipaddress.IPv4Address | ipaddress.IPv6Address], not_ip: str
) -> str | None:
    """``not_ip`` if ``text`` is no address of ``family``; else why it is not canonical."""
    try:
        ip = family(text)
    except ValueError:
        return not_ip
    if str(ip) != text:
        return f"IPv{ip.version} address {text!r} is not in canonical form ({ip})"
    return None


def _host_problem(host: str) -> str | None:
    if host.startswith("["):
        if not host.endswith("]"):
            return f"IPv6 host {host!r} lacks its closing bracket"
        inner = host[1:-1]
        return _ip_problem(
            inner, ipaddress.IPv6Address, f"{inner!r} in brackets is not an IPv6 address"
        )
    if ":" in host:
        return f"IPv6 host {host!r} must be in brackets"
    if host and host.replace(".", "").isdigit():
        return _ip_problem(host, ipaddress.IPv4Address, f"{host!r} is not an IPv4 address")
    if len(host) > 253 or not _DNS_NAME.fullmatch(host):
        return f"host {host!r} is not an IP address or a lowercase DNS name"
    return None


def check_address(address: str) -> str | None:
    """Why ``address`` is not in Skipper's ``scheme://host:port`` form; ``None`` if it is.

    The reason names what is wrong (a missing or uppercase scheme, no port, a path or a
    trailing slash, a host that is not a canonical IP or a lowercase DNS name).
    """
    scheme, sep, rest = address.partition("://")
    if not sep:
        return "no scheme (write http://host:port)"
    if not _SCHEME.fullmatch(scheme):
        if _SCHEME.fullmatch(scheme.lower()):
            return f"scheme {scheme!r} is not lowercase"
        return f"scheme {scheme!r} is not a URL scheme"
    for ch, what in (("/", "a path or trailing slash"), ("?", "a query"), ("#", "a fragment")):
        if ch in rest:
            return f"{what} after host:port"
    if "@" in rest:
        return "user information before the host"
    host, colon, port = rest.rpartition(":")
    if not colon or host.endswith(":") or (host.startswith("[") and not host.endswith("]")):
        return "no port (write scheme://host:port)"
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        return f"port {port!r} is not a number from 1 to 65535 without leading zeros"
    return _host_problem(host)
