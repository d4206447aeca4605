"""IP address management: pure functions over ipaddress objects, shared by the API and its property tests."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable, Iterable

MIN_PREFIX, MAX_PREFIX = 8, 28


class IpamError(ValueError):
    pass


class Ipam6Error(IpamError):
    """An IPv6 address or network refused (ipam6.py)."""


def parse_network(value: str, version: int, lo: int, hi: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A strict network of IP `version` (host bits zero) in its one canonical spelling, its prefix within
    [lo, hi]: `IpamError` (or `Ipam6Error`, for IPv6) says what is wrong."""
    error = IpamError if version == 4 else Ipam6Error
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        raise error(f"{value!r} is not a valid CIDR ({e})") from None
    if net.version != version:
        raise error(f"{value!r} is not IPv{version}")
    if not lo <= net.prefixlen <= hi:
        raise error(f"prefix /{net.prefixlen} is out of range: use /{lo}" + (f" to /{hi}" if hi != lo else ""))
    if str(net) != value:  # '10.0.0.0/016', '010.0.0.0/16': one spelling per network
        raise error(f"{value!r} is not written the usual way; write {net}")
    return net


def parse_cidr(value: str, *, min_prefix: int = MIN_PREFIX, max_prefix: int = MAX_PREFIX) -> ipaddress.IPv4Network:
    """A strict IPv4 network: host bits must be zero, prefix within [min_prefix, max_prefix]."""
    net = parse_network(value, 4, min_prefix, max_prefix)
    assert isinstance(net, ipaddress.IPv4Network)
    return net


PRIVATE_SPACE = tuple(ipaddress.IPv4Network(c) for c in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                          "100.64.0.0/10"))  # RFC 1918 and RFC 6598


def vpc_space_error(net: ipaddress.IPv4Network, public: list[ipaddress.IPv4Network]) -> str | None:
    """Why a VPC may not use `net` (as AWS: private space, or public ranges the operator allows), or None."""
    if any(net.subnet_of(p) for p in PRIVATE_SPACE + tuple(public)):
        return None
    kind = ("multicast" if net.is_multicast else "loopback" if net.is_loopback else
            "link-local" if net.is_link_local else "reserved" if net.is_reserved else "public")
    return (f"{net} is {kind} address space; a VPC uses RFC 1918 (10/8, 172.16/12, 192.168/16) or RFC 6598 "
            "(100.64/10) space" + (", or a public range the operator allows (TIANJI_VPC_PUBLIC_CIDRS)"
                                   if kind == "public" else ""))


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


VNI_WINDOW = 4096  # VNIs examined per lookup while looking for a free one


def next_vni(last: int, lo: int, hi: int, taken: Callable[[int, int], tuple[set[int], set[int]]]) -> int:
    """The first VNI after `last` (the last one handed out), wrapping at `hi`, that is neither in use nor in
    quarantine (`taken(a, b)`: those two sets within a..b). Allocation moves forward, so a freed VNI comes round
    again only after the whole range has (16.7 million VPCs with the default range)."""
    start = last + 1 if lo <= last < hi else lo
    waiting = 0
    for a, b in ((start, hi), (lo, start - 1)):
        for w in range(a, b + 1, VNI_WINDOW):
            z = min(b, w + VNI_WINDOW - 1)
            used, held = taken(w, z)
            waiting += len(held - used)
            for vni in range(w, z + 1):
                if vni not in used and vni not in held:
                    return vni
    raise IpamError(f"the VNI pool {lo}..{hi} is exhausted ({waiting} freed VNI(s) in quarantine)")
