"""Agent URL checks: http(s) only, never link-local or cloud-metadata, optional allowlist.

The address rules themselves (IPv4 and IPv6 alike, embedded IPv4 decoded) live in the shared
outbound layer (``outbound.addresses``), which applies them again on every new outbound
connection: a name that does not resolve yet is accepted here, and a name re-pointed later at a
refused address (DNS rebinding) is refused when the gateway, a card fetch or discovery
connects.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from urllib.parse import urlsplit

from django.conf import settings

from core import threads
from outbound.addresses import METADATA_ADDRESSES, METADATA_HOSTS, refusal

__all__ = ["METADATA_ADDRESSES", "METADATA_HOSTS", "UnsafeUrl", "check_agent_url", "host_allowed"]


class UnsafeUrl(ValueError):
    """The URL may not be used as an agent endpoint."""


def _forbidden_address(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    return refusal(addr)


def _parse_allowlist(entries: list[str]) -> tuple[set[str], list]:
    hosts: set[str] = set()
    networks = []
    for entry in entries:
        entry = entry.strip().lower()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            hosts.add(entry.rstrip("."))
    return hosts, networks


def host_allowed(host: str, allowlist: list[str]) -> bool:
    """Whether ``host`` is on ``allowlist`` (host names, ``*.suffix`` wildcards, IPs, CIDRs)."""
    if not allowlist:
        return True
    host = host.lower().rstrip(".")
    hosts, networks = _parse_allowlist(allowlist)
    if host in hosts:
        return True
    if any(h.startswith("*.") and host.endswith(h[1:]) for h in hosts):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(addr in net for net in networks)


def check_agent_url(
    url: object, *, allowlist: list[str] | None = None, resolve: bool = True,
    grpc: bool = False,
) -> str:
    """Return the URL if it may be an agent endpoint, else raise :class:`UnsafeUrl`.

    ``grpc``: a gRPC address (``grpc://host:port``, ``grpcs://host:port``: the endpoint of an
    agent whose card lists only a gRPC interface) is accepted too, under the same host rules.

    Host names are resolved (when ``resolve``) so a name pointing at a metadata or link-local
    address is refused too; a name that does not resolve now is accepted (the agent may not be
    up yet): every outbound connection checks the resolved address again
    (``outbound.resolve``), so it fails later as ``unreachable``, never reaching a refused
    address.
    """
    host, literal = _checked_host(url, allowlist, grpc=grpc)
    if literal is not None:
        reason = _forbidden_address(literal)
        if reason:
            raise UnsafeUrl(reason)
    elif resolve:
        for addr in _resolved(host):
            reason = _forbidden_address(addr)
            if reason:
                raise UnsafeUrl(f"{host} resolves to a refused address: {reason}")
    return url.strip()  # type: ignore[attr-defined]  # _checked_host refused non-strings


def _checked_host(url: object, allowlist: list[str] | None, *, grpc: bool = False):
    """``url``'s host and, for an IP literal, its address: the checks that need no lookup
    (:class:`UnsafeUrl` if one fails)."""
    if not isinstance(url, str) or not url.strip():
        raise UnsafeUrl("url must be a non-empty string")
    if len(url) > 2048:
        raise UnsafeUrl("url is longer than 2048 characters")
    if _CONTROL.search(url):
        raise UnsafeUrl("url must not contain control characters")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl(f"url is not valid: {exc}") from None
    if parts.scheme not in (("http", "https", "grpc", "grpcs") if grpc else ("http", "https")):
        raise UnsafeUrl("url must be an absolute http or https URL"
                        + (" (or grpc://host:port, grpcs://host:port)" if grpc else ""))
    host = (parts.hostname or "").lower()
    if not host:
        raise UnsafeUrl("url has no host")
    if parts.username or parts.password:
        raise UnsafeUrl("url must not carry credentials")
    del port
    if host.rstrip(".") in METADATA_HOSTS:
        raise UnsafeUrl("cloud metadata hosts are refused")
    allow = settings.A2A_AGENT_URL_ALLOWLIST if allowlist is None else allowlist
    if not host_allowed(host, allow):
        raise UnsafeUrl(f"host {host} is not on the agent URL allowlist")
    if ":" not in host and not host[-1].isdigit():
        return host, None  # a name: an IP literal is dotted digits or has colons
    try:
        return host, ipaddress.ip_address(host)
    except ValueError:
        return host, None


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


#: How long a name's addresses are reused by the registration check, and how many names are
#: kept. Registrations of many agents behind one host name (a service, a load balancer) resolve
#: it once per window instead of once each; the check at every outbound connection
#: (``outbound.resolve``) still refuses a name re-pointed at a refused address since.
RESOLVE_CACHE_SECONDS = 30.0
RESOLVE_CACHE_ENTRIES = 4096
_resolve_cache: dict[str, tuple[float, tuple]] = {}

#: Name lookups run in threads of their own (``LOOKUP_THREADS``), each waited for at most
#: ``A2A_URL_CHECK_DNS_TIMEOUT_SECONDS``: a registrant whose name server answers slowly (or
#: never) costs its own registration that long, never a thread or batch of other
#: registrations. A lookup that has not answered by then counts as "does not resolve now"
#: (accepted, like any name that does not resolve yet: every outbound connection checks the
#: address again); its late answer replaces that in the cache. At most ``MAX_LOOKUPS`` names
#: are looked up at once; past that a new name counts as unresolved at once.
LOOKUP_THREADS = 4
MAX_LOOKUPS = 64
_lookups: dict[str, Future] = {}
_lookups_lock = threading.Lock()


def _remember(host: str, addresses: tuple) -> None:
    if len(_resolve_cache) >= RESOLVE_CACHE_ENTRIES:
        _resolve_cache.clear()  # bounded; refilled by the next registrations
    _resolve_cache[host] = (time.monotonic() + RESOLVE_CACHE_SECONDS, addresses)


def cached_addresses(host: str) -> tuple | None:
    """``host``'s addresses if looked up within the cache window, else None."""
    hit = _resolve_cache.get(host)
    if hit is not None and hit[0] > time.monotonic():
        return hit[1]
    return None


def lookup(host: str) -> Future | None:
    """The lookup of ``host`` under way (one per name, shared), started if need be; None when
    ``MAX_LOOKUPS`` are under way already. Its result: the addresses (none if the name does
    not resolve), also cached once it arrives."""
    with _lookups_lock:
        future = _lookups.get(host)
        if future is not None:
            return future
        if len(_lookups) >= MAX_LOOKUPS:
            return None
        future = _lookups[host] = threads.pool("url-check-dns", LOOKUP_THREADS).submit(
            _getaddrinfo, host
        )
    future.add_done_callback(lambda done: _looked_up(host, done))
    return future


def _looked_up(host: str, future: Future) -> None:
    with _lookups_lock:
        if _lookups.get(host) is future:
            del _lookups[host]
    if not future.cancelled() and future.exception() is None:
        _remember(host, future.result())


def unresolved_for_now(host: str) -> None:
    """Count ``host`` as not resolving for the cache window (its lookup timed out); a late
    answer of the lookup replaces this."""
    if cached_addresses(host) is None:
        _remember(host, ())


def _getaddrinfo(host: str) -> tuple:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        infos = []
    addresses = []
    for info in infos:
        try:
            addresses.append(ipaddress.ip_address(info[4][0].split("%")[0]))  # type: ignore[union-attr]  # an IP host string
        except ValueError:
            continue
    return tuple(addresses)


def _resolved(host: str) -> tuple:
    """The addresses ``host`` resolves to (none if it does not resolve now, or not within
    ``A2A_URL_CHECK_DNS_TIMEOUT_SECONDS``), cached briefly."""
    found = cached_addresses(host)
    if found is not None:
        return found
    future = lookup(host)
    if future is not None:
        try:
            return future.result(timeout=settings.A2A_URL_CHECK_DNS_TIMEOUT_SECONDS)
        except FutureTimeout:
            pass
    unresolved_for_now(host)
    return ()


def host_to_look_up(url: object) -> str | None:
    """The host name :func:`check_agent_url` would resolve for ``url`` (None for an IP
    literal, or a URL it refuses before any lookup: nothing to look up)."""
    try:
        host, literal = _checked_host(url, None)
    except UnsafeUrl:
        return None
    return host if literal is None else None
