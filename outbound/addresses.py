"""Which IP addresses an outbound connection may reach: one rule set for IPv4 and IPv6.

Used twice: when an agent URL is registered (``registry.netcheck``) and on every NEW outbound
connection (:mod:`outbound.resolve`), after the name was resolved, so a name re-pointed later at
the cloud metadata address (DNS rebinding) is refused at connect time too.

The rules, the same for both families:

- allowed: loopback (127.0.0.0/8, ::1 - local agents and tests), private and unique-local
  ranges (10/8, 172.16/12, 192.168/16, fc00::/7), shared address space, public addresses;
- refused: link-local (169.254/16, fe80::/10), the clouds' metadata addresses (also outside
  link-local: 100.100.100.200, fd00:ec2::254, ...), multicast, unspecified / "this network"
  (0.0.0.0/8, ::), reserved (240/4, broadcast, IPv6 ranges the IETF reserves), deprecated
  site-local (fec0::/10);
- IPv6 addresses that embed an IPv4 address are judged by it: IPv4-mapped (::ffff:a.b.c.d),
  IPv4-compatible (::a.b.c.d), 6to4 (2002::/16), Teredo (2001::/32, the client address),
  NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48). So 2002:a9fe:a9fe::1 (6to4 of
  169.254.169.254) is refused like the address it carries.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Instance-metadata host names of the major clouds (refused by name, before any resolution).
METADATA_HOSTS = frozenset(
    {
        "metadata.google.internal",
        "metadata.goog",
        "metadata",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.com",
    }
)
#: Metadata addresses; link-local covers most, these are the ones outside it (or listed anyway).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "fd00:ec2::254",
        "100.100.100.200",
        "192.0.0.192",
    )
)

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_IPV4_COMPAT = ipaddress.ip_network("::/96")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")


def embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, 6to4, Teredo, NAT64)."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]  # the client's address (de-obfuscated by ipaddress)
    if addr in _NAT64 or addr in _NAT64_LOCAL:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr in _IPV4_COMPAT and int(addr) > 1:  # ::a.b.c.d; not :: or ::1
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def _ipv4_refusal(addr: ipaddress.IPv4Address) -> str | None:
    if addr in METADATA_ADDRESSES:
        return "cloud metadata addresses are refused"
    if addr.is_link_local:
        return "link-local addresses are refused"
    if addr.is_multicast or addr in _THIS_NETWORK or addr.is_reserved:
        return "multicast, unspecified and reserved addresses are refused"
    return None


def refusal(addr: IPAddress) -> str | None:
    """Why ``addr`` may not be connected to, or None when it may."""
    if isinstance(addr, ipaddress.IPv4Address):
        return _ipv4_refusal(addr)
    inner = embedded_ipv4(addr)
    if inner is not None:
        reason = _ipv4_refusal(inner)
        return f"{reason} (embedded in {addr})" if reason else None
    if addr in METADATA_ADDRESSES:
        return "cloud metadata addresses are refused"
    if addr.is_loopback:
        return None
    if addr.is_link_local:
        return "link-local addresses are refused"
    if addr.is_multicast or addr.is_unspecified or addr.is_reserved or addr.is_site_local:
        return "multicast, unspecified and reserved addresses are refused"
    return None


def refusal_of(text: str) -> str | None:
    """:func:`refusal` of an address given as text (a zone id ``%eth0`` is ignored); text that
    is not an IP address is refused."""
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return f"{text[:100]!r} is not an IP address"
    return refusal(addr)
