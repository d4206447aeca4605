"""IP address management: pure functions over ipaddress objects, shared by the API and its property tests."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable, Iterable

MIN_PREFIX, MAX_PREFIX = 8, 28


class IpamError(ValueError):
    pass


def parse_cidr(value: str, *, min_prefix: int = MIN_PREFIX, max_prefix: int = MAX_PREFIX) -> ipaddress.IPv4Network:
    """A strict IPv4 network: host bits must be zero, prefix within [min_prefix, max_prefix]."""
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        raise IpamError(f"{value!r} is not a valid CIDR ({e})") from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise IpamError(f"{value!r} is not IPv4; only IPv4 VPCs are supported")
    if not min_prefix <= net.prefixlen <= max_prefix:
        raise IpamError(f"prefix /{net.prefixlen} is out of range: use /{min_prefix} to /{max_prefix}")
    return net


def gateway_ip(net: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    return net.network_address + 1


def usable_range(net: ipaddress.IPv4Network) -> tuple[int, int]:
    """Inclusive integer bounds of the addresses that may be handed to ports:
    never the network, gateway (first usable) or broadcast address."""
    return int(net.network_address) + 2, int(net.broadcast_address) - 1


def check_fixed_ip(net: ipaddress.IPv4Network, value: str) -> ipaddress.IPv4Address:
    try:
        ip = ipaddress.IPv4Address(value)
    except ValueError:
        raise IpamError(f"{value!r} is not an IPv4 address") from None
    if ip not in net:
        raise IpamError(f"{ip} is outside subnet {net}")
    lo, hi = usable_range(net)
    if not lo <= int(ip) <= hi:
        raise IpamError(f"{ip} is reserved in {net} (network, gateway or broadcast address)")
    return ip


def next_free(
    net: ipaddress.IPv4Network, used: Callable[[], Iterable[int]], highest: int | None = None
) -> ipaddress.IPv4Address:
    """A free usable address. Above the highest allocated one when there is room (no scan needed),
    otherwise the lowest gap; `used` is only called for the scan."""
    lo, hi = usable_range(net)
    if highest is None and lo <= hi:
        return ipaddress.IPv4Address(lo)
    if highest is not None and lo <= highest + 1 <= hi:
        return ipaddress.IPv4Address(highest + 1)
    taken = set(used())
    for candidate in range(lo, hi + 1):
        if candidate not in taken:
            return ipaddress.IPv4Address(candidate)
    raise IpamError(f"subnet {net} has no free addresses left ({max(hi - lo + 1, 0)} usable, all allocated)")


def overlaps(a: str, b: str) -> bool:
    return ipaddress.ip_network(a).overlaps(ipaddress.ip_network(b))


def random_mac(rng: random.Random | None = None) -> str:
    """A locally administered unicast MAC (second-lowest bit of the first octet set, lowest clear)."""
    r = rng or random.SystemRandom()
    first = (r.randrange(256) & 0xFC) | 0x02
    return ":".join(f"{b:02x}" for b in [first, *(r.randrange(256) for _ in range(5))])


def router_mac(vni: int) -> str:
    """The VPC's distributed router MAC, derived from the VNI so every host agrees without a lookup."""
    return "0a:58:00:" + ":".join(f"{(vni >> s) & 0xFF:02x}" for s in (16, 8, 0))
