"""IPv6 address management for dual-stack VPCs: pure functions over ipaddress objects (the IPv4 side is
`ipam.py`). A VPC takes a /56 (from the operator's pools, or given), a subnet a /64 of it; the /64's ::1 is its
router, and a port's address is its MAC's EUI-64 (SLAAC subnets) or handed out from ::2 up (DHCPv6-stateful)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from controller.api.ipam import Ipam6Error, parse_network
from tianji.inet import eui64, link_local  # noqa: F401 - IPAM's names for them (port_ipv6.py, the tests)

VPC_PREFIX, SUBNET_PREFIX = 56, 64  # AWS's sizes: 256 subnets a VPC, and SLAAC needs a /64
ADDRESS_MODES = ("slaac", "dhcpv6-stateful")
ULA = ipaddress.IPv6Network("fc00::/7")
GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


def parse_cidr6(value: str, lo: int = 0, hi: int = 128) -> ipaddress.IPv6Network:
    """A strict IPv6 network (host bits zero) in its one canonical spelling, its prefix within [lo, hi]."""
    net = parse_network(value, 6, lo, hi)
    assert isinstance(net, ipaddress.IPv6Network)
    return net


def space_error6(net: ipaddress.IPv6Network) -> str | None:
    """Why a VPC may not use `net`, or None: unique local (fc00::/7) or global unicast (2000::/3) space only."""
    if net.subnet_of(ULA) or net.subnet_of(GLOBAL_UNICAST):
        return None
    kind = ("link-local" if net.is_link_local else "multicast" if net.is_multicast else "loopback" if net.is_loopback
            else "site-local" if net.is_site_local else "reserved")
    return f"{net} is {kind} address space; a VPC's IPv6 CIDR is unique local (fc00::/7) or global unicast (2000::/3)"


def next_vpc_cidr6(pools: Iterable[ipaddress.IPv6Network], used: Iterable[str]) -> ipaddress.IPv6Network:
    """The lowest /56 of the first pool that has one no VPC holds."""
    taken = {ipaddress.IPv6Network(c) for c in used}
    for pool in pools:
        for net in _blocks(pool, VPC_PREFIX, taken):
            return net
    raise Ipam6Error("no IPv6 /56 left in the operator's pools: ask the operator to add one (TIANJI_IPV6_POOLS)")


def next_subnet_cidr6(vpc: ipaddress.IPv6Network, used: Iterable[str]) -> ipaddress.IPv6Network:
    """The lowest /64 of the VPC's /56 that no subnet of it holds."""
    for net in _blocks(vpc, SUBNET_PREFIX, {ipaddress.IPv6Network(c) for c in used}):
        return net
    raise Ipam6Error(f"every /64 of {vpc} is a subnet already")


def _blocks(pool: ipaddress.IPv6Network, prefix: int, taken: set[ipaddress.IPv6Network]) -> Iterable[
        ipaddress.IPv6Network]:
    """The free /`prefix` blocks of `pool`, lowest first, stepping over every taken block in one hop."""
    if pool.prefixlen > prefix:
        return
    size = 1 << (128 - prefix)
    at, end = int(pool.network_address), int(pool.broadcast_address)
    spans = sorted((int(t.network_address), int(t.broadcast_address)) for t in taken if t.overlaps(pool))
    for lo, hi in spans:
        while at + size - 1 < lo:
            yield ipaddress.IPv6Network((at, prefix))
            at += size
        at = max(at, (hi // size + 1) * size)
    while at + size - 1 <= end:
        yield ipaddress.IPv6Network((at, prefix))
        at += size


def gateway6(net: ipaddress.IPv6Network) -> ipaddress.IPv6Address:
    """The subnet's router: its ::1 (::0 is the subnet-router anycast address, RFC 4291)."""
    return net.network_address + 1


def address_error6(ip: ipaddress.IPv6Address) -> str | None:
    """Why `ip` can never be a port's address, or None."""
    kind = ("unspecified" if ip.is_unspecified else "loopback" if ip.is_loopback else "link-local"
            if ip.is_link_local else "multicast" if ip.is_multicast else None)
    return f"{ip} is {kind}: a port's address is a unicast address of its subnet" if kind else None


def check_fixed_ip6(net: ipaddress.IPv6Network, value: str) -> ipaddress.IPv6Address:
    try:
        ip = ipaddress.IPv6Address(value)
    except ValueError:
        raise Ipam6Error(f"{value!r} is not an IPv6 address") from None
    if why := address_error6(ip):
        raise Ipam6Error(why)
    if ip not in net:
        raise Ipam6Error(f"{ip} is outside the subnet's {net}")
    if int(ip) - int(net.network_address) < 2:
        raise Ipam6Error(f"{ip} is reserved in {net} (the subnet-router anycast address or the router's)")
    return ip


def next_free6(net: ipaddress.IPv6Network, used: Iterable[str]) -> ipaddress.IPv6Address:
    """A DHCPv6-stateful subnet's next address: above the highest handed out (from ::2), else the lowest gap."""
    first, last = int(net.network_address) + 2, int(net.broadcast_address)
    taken = {int(ipaddress.IPv6Address(u)) for u in used}
    high = max(taken, default=first - 1)
    if high + 1 <= last:
        return ipaddress.IPv6Address(high + 1)
    candidate = first
    while candidate in taken:
        candidate += 1
    return ipaddress.IPv6Address(candidate)
