"""Skipper's default consistent-hash key: the client's IP address.

When a route sets no ``consistentHashKey``, Skipper hashes ``net.RemoteHost(r).String()``:
the part of ``X-Forwarded-For`` before the first comma (not trimmed), with a port
stripped by Go's ``net.SplitHostPort`` rules, parsed by ``net.ParseIP``; if that fails,
the same for ``RemoteAddr``; printed in Go's IP form (IPv4 dotted quad, also for
IPv4-mapped IPv6; other IPv6 in RFC 5952 form); ``"<nil>"`` if both fail.
"""

from __future__ import annotations

import ipaddress

__all__ = ["default_key"]


def _split_host_port(address: str) -> str | None:
    """Host part per Go's ``net.SplitHostPort``, or ``None`` where Go returns an error."""
    colon = address.rfind(":")
    if colon < 0:
        return None
    start, end_search = 0, 0
    if address.startswith("["):
        close = address.find("]")
        if close < 0 or close + 1 != colon:
            return None
        host = address[1:close]
        start, end_search = 1, close + 1
    else:
        host = address[:colon]
        if ":" in host:
            return None
    if "[" in address[start:] or "]" in address[end_search:]:
        return None
    return host


def _parse_ip(address: str) -> str | None:
    """Go's ``net.ParseIP(stripPort(address)).String()``, or ``None`` if it is not an IP."""
    if not address:
        return None
    host = _split_host_port(address)
    if host is None:
        host = address
    if "%" in host or not host or host != host.strip():
        return None  # Go's ParseIP rejects zones and surrounding spaces
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        if "." in host:
            # Go prints any 16-byte address by its groups; Python's form is the same except
            # that it may keep a dotted tail, so format from the integer instead.
            return str(ipaddress.IPv6Address(int(ip)))
    return str(ip)


def default_key(xff: str | None, remote_addr: str) -> str:
    """The key Skipper hashes when no ``consistentHashKey`` is set.

    Parameters
    ----------
    xff
        The ``X-Forwarded-For`` header value, or ``None`` when absent.
    remote_addr
        The connection's remote address, usually ``ip:port``.

    Returns
    -------
    str
        The client IP in Go's printed form, or ``"<nil>"``.
    """
    first = (xff or "").split(",", 1)[0]
    ip = _parse_ip(first)
    if ip is None:
        ip = _parse_ip(remote_addr)
    return "<nil>" if ip is None else ip
