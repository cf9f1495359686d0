"""Whether an IP address is a public unicast destination: the one question of the
server-side request forgery guard (A2A push webhooks, :mod:`cantrip.protocols.a2a._push`).

``ipaddress``'s ``is_global`` alone is not that answer (issue 39.15). It follows IANA's
special-purpose registries as they were when that Python was released, so it differs
between versions, and it calls some non-public ranges global: the deprecated
site-local ``fec0::/10`` (RFC 3879: routed inside a site, never on the internet), the
6to4 relay anycast ``192.88.99.0/24`` (RFC 7526), the IPv6 documentation block
``3fff::/20`` (RFC 9637), parts of ``192.0.0.0/24``. And an IPv6 address can *carry*
an IPv4 one -- IPv4-mapped, IPv4-compatible, SIIT-translated, NAT64 (RFC 6052), 6to4
(RFC 3056) -- and reach it: ``2002:a00:1::`` is ``10.0.0.1`` through any 6to4 relay,
yet ``is_global`` says True.

So the check is explicit: an address that carries an IPv4 address in a form that
reaches it is refused when that IPv4 address is (an IPv4-mapped or NAT64 address *is*
its IPv4 address, so a public one is public: a host on an IPv6-only network reaches
IPv4 webhooks through DNS64 and NAT64); every range of :data:`NOT_PUBLIC` is
refused whatever this Python's ``is_global`` says; and what is left must still be
``is_global`` and none of loopback, link-local, multicast, reserved or unspecified.
A range nobody listed errs towards refusal: the operator can allow private webhooks
(``cantrip serve --a2a-push-private``), nobody can allow a range we call public by mistake.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

NOT_PUBLIC: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        # IPv4 (RFC 6890 and successors)
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # shared address space (carrier-grade NAT)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local (cloud metadata services live here)
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation
        "203.0.113.0/24",  # documentation
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the limited broadcast address
        # IPv6
        "::/96",  # unspecified, loopback, and IPv4-compatible (deprecated)
        "::ffff:0:0:0/96",  # SIIT IPv4-translated
        "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215): a site's own translator
        "100::/64",  # discard-only
        "2001::/32",  # Teredo: its IPv4 addresses are obfuscated, not judged
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation (RFC 9637)
        "5f00::/16",  # segment routing SIDs (RFC 9602)
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated, RFC 3879)
        "ff00::/8",  # multicast
    )
)
"""Ranges that are never a public destination, refused whatever ``is_global`` says."""

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
"""NAT64's well-known prefix: the last 32 bits are the IPv4 address reached."""


def carried_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches through mapping, NAT64 or 6to4, if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def is_public(address: str | IPAddress) -> bool:
    """Whether ``address`` (text, with or without an IPv6 zone, or an address) is a
    public unicast destination; text that is no address is not."""
    if isinstance(address, str):
        try:
            ip: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
    else:
        ip = address
    if isinstance(ip, ipaddress.IPv6Address):
        carried = carried_ipv4(ip)
        if carried is not None and not is_public(carried):
            return False
        if ip.ipv4_mapped is not None or ip in _NAT64:
            return carried is not None  # a way of writing that public IPv4 address
    if any(ip in network for network in NOT_PUBLIC if network.version == ip.version):
        return False
    return bool(
        ip.is_global
        and not (
            ip.is_loopback
            or ip.is_link_local
            or ip.is_multicast
            or ip.is_reserved
            or ip.is_unspecified
        )
    )
