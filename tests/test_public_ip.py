"""The push webhook guard's address check (issue 39.15): non-public ranges are refused
whatever this Python's ``ipaddress.is_global`` says, and an IPv6 address that carries a
private IPv4 address (mapped, compatible, SIIT, NAT64, 6to4) is refused with it.

Addresses are generated across each range, not only its first one: the check is on
the whole range, and a table of hand-picked addresses would test only those."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cantrip.protocols.a2a._push import _blocked
from cantrip.protocols.middleware._public_ip import NOT_PUBLIC, is_public

PUBLIC_V4 = ("8.8.8.8", "1.1.1.1", "9.9.9.9", "193.0.14.129")
PRIVATE_V4 = [n for n in NOT_PUBLIC if n.version == 4]


def _inside(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> st.SearchStrategy[str]:
    first, last = int(network.network_address), int(network.broadcast_address)
    # The network's own address class: ``ip_address(n)`` would read an int below 2**32
    # from ``::/96`` as an IPv4 address (``::1.0.0.0`` became ``1.0.0.0``).
    kind = type(network.network_address)
    return st.integers(first, last).map(lambda n: str(kind(n)))


def _embeddings(v4: str) -> list[str]:
    """Every IPv6 form of ``v4`` that reaches it (or meant to): mapped, compatible,
    SIIT, NAT64 (well-known and local-use), 6to4."""
    n = int(ipaddress.IPv4Address(v4))
    return [
        str(ipaddress.IPv6Address((0xFFFF << 32) | n)),  # ::ffff:a.b.c.d
        str(ipaddress.IPv6Address(n)),  # ::a.b.c.d
        str(ipaddress.IPv6Address((0xFFFF << 48) | n)),  # ::ffff:0:a.b.c.d
        str(ipaddress.IPv6Address((0x64FF9B << 96) | n)),  # 64:ff9b::a.b.c.d
        str(ipaddress.IPv6Address((0x64FF9B0001 << 80) | n)),  # 64:ff9b:1::a.b.c.d
        str(ipaddress.IPv6Address((0x2002 << 112) | (n << 80) | 1)),  # 2002:AABB:CCDD::1
    ]


@pytest.mark.parametrize(
    "address",
    [
        "fec0::1",  # site-local: is_global True on every Python this runs on
        "feff:ffff::1",  # the end of site-local
        "fec0::1%eth0",
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254 (cloud metadata)
        "::ffff:0:a00:1",  # SIIT of 10.0.0.1
        "::10.0.0.1",  # IPv4-compatible
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b:1::808:808",  # local-use NAT64 prefix, whatever it carries
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo
        "3fff::1",  # documentation (RFC 9637), is_global True here
        "192.88.99.1",  # 6to4 relay anycast, is_global True here
        "192.0.0.9",  # IETF protocol assignment, is_global True here
        "5f00::1",
        "100::1",
        "ff0e::1",  # global-scope multicast: is_global True
        "255.255.255.255",
        "not an address",
        "",
    ],
)
def test_non_public_addresses_is_global_misses_are_refused(address: str) -> None:
    assert _blocked(address) and not is_public(address)


@pytest.mark.parametrize(
    "address",
    [
        *PUBLIC_V4,
        "2001:4860:4860::8888",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",  # a way of writing a public IPv4 address
        "64:ff9b::808:808",  # NAT64 of 8.8.8.8: how an IPv6-only host reaches it
        "2002:808:808::1",  # 6to4 of 8.8.8.8
    ],
)
def test_public_addresses_pass(address: str) -> None:
    assert not _blocked(address) and is_public(address)


@given(st.sampled_from(NOT_PUBLIC).flatmap(_inside))
def test_every_address_of_every_listed_range_is_refused(address: str) -> None:
    assert _blocked(address)


@given(st.sampled_from(PRIVATE_V4).flatmap(_inside))
def test_every_ipv6_form_of_a_non_public_ipv4_address_is_refused(v4: str) -> None:
    for address in _embeddings(v4):
        assert _blocked(address), (v4, address)


@given(st.integers(0, 2**32 - 1) | st.integers(0, 2**128 - 1))
def test_never_more_permissive_than_is_global(n: int) -> None:
    """Whatever the address, one ``is_global`` calls non-public is refused (the only
    exceptions are the ways of writing a public IPv4 address, whose is_global differs)."""
    ip = ipaddress.ip_address(n)
    if is_public(str(ip)):
        written = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        nat64 = isinstance(ip, ipaddress.IPv6Address) and ip in ipaddress.ip_network("64:ff9b::/96")
        assert ip.is_global or written is not None or nat64, ip


def test_the_public_forms_of_a_public_address_pass() -> None:
    for v4 in PUBLIC_V4:
        forms = _embeddings(v4)
        mapped, _, _, nat64, _, sixtofour = forms
        assert [is_public(a) for a in forms] == [True, False, False, True, False, True]
        assert all(not _blocked(a) for a in (mapped, nat64, sixtofour))
