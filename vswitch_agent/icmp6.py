"""What the distributed router says in ICMPv6 in its own name, from its link-local address (fe80:: and the router MAC's
EUI-64): router advertisements (RFC 4861: the subnet's /64, the VPC's MTU, the M/O flags of its address mode),
answered to a router solicitation and sent unsolicited now and then; time exceeded (RFC 4443) for a hop limit that
ran out at the routing step; packet too big for a packet longer than a peer VPC's MTU. Pure functions on bytes: a
frame that does not parse gives None, never an exception."""

from __future__ import annotations

import ipaddress
import struct

from tianji import inet
from tianji.inet import link_local

ETH_IPV6 = 0x86DD
ICMPV6 = 58
RS, RA, NS, NA = 133, 134, 135, 136
PACKET_TOO_BIG, TIME_EXCEEDED = 2, 3
ALL_NODES = ipaddress.IPv6Address("ff02::1")
ALL_NODES_MAC = bytes.fromhex("333300000001")
ROUTER_LIFETIME_S = 1800
PREFIX_VALID_S, PREFIX_PREFERRED_S = 2592000, 604800  # RFC 4861's defaults: 30 and 7 days
MIN_MTU = 1280


def mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def checksum(src: bytes, dst: bytes, payload: bytes, proto: int = ICMPV6) -> int:
    """The ICMPv6 (or UDP over IPv6) checksum: RFC 8200's pseudo-header, then the payload."""
    return inet.checksum(src + dst + struct.pack("!IxxxB", len(payload), proto) + payload)


def frame(src_mac: bytes, dst_mac: bytes, src: ipaddress.IPv6Address, dst: ipaddress.IPv6Address, proto: int,
          payload: bytes, hop_limit: int = 255) -> bytes:
    """Ethernet + IPv6 + `payload` (its checksum, at the protocol's place, filled in here)."""
    at = 2 if proto == ICMPV6 else 6  # ICMPv6's checksum field, or UDP's
    payload = payload[:at] + b"\0\0" + payload[at + 2:]
    payload = payload[:at] + struct.pack("!H", checksum(src.packed, dst.packed, payload, proto)) + payload[at + 2:]
    ip6 = struct.pack("!IHBB", 6 << 28, len(payload), proto, hop_limit) + src.packed + dst.packed
    return dst_mac + src_mac + struct.pack("!H", ETH_IPV6) + ip6 + payload


def router_advertisement(router_mac: str, prefix: str, mtu: int, mode: str, dst_mac: bytes = ALL_NODES_MAC,
                         dst: ipaddress.IPv6Address = ALL_NODES) -> bytes:
    """An RA for the subnet `prefix` (a /64): on-link and, in a SLAAC subnet, autonomous (A); M and O set in a
    DHCPv6-stateful one (addresses and the rest by DHCPv6); the VPC's MTU; the router's link-layer address."""
    net = ipaddress.IPv6Network(prefix)
    stateful = mode == "dhcpv6-stateful"
    flags = 0xC0 if stateful else 0x00  # M, O
    ra = struct.pack("!BBHBBHII", RA, 0, 0, 64, flags, ROUTER_LIFETIME_S, 0, 0)
    pi_flags = 0x80 | (0 if stateful else 0x40)  # L, A
    ra += struct.pack("!BBBBIII", 3, 4, net.prefixlen, pi_flags, PREFIX_VALID_S, PREFIX_PREFERRED_S, 0)
    ra += net.network_address.packed
    ra += struct.pack("!BBHI", 5, 1, 0, max(mtu, MIN_MTU))  # MTU
    ra += struct.pack("!BB", 1, 1) + mac_bytes(router_mac)  # source link-layer address
    return frame(mac_bytes(router_mac), dst_mac, link_local(router_mac), dst, ICMPV6, ra)


def parse_icmp6(data: bytes) -> tuple[bytes, ipaddress.IPv6Address, ipaddress.IPv6Address, int, bytes] | None:
    """(source MAC, source, destination, ICMPv6 type, ICMPv6 message) of an Ethernet frame, or None."""
    if len(data) < 58 or struct.unpack_from("!H", data, 12)[0] != ETH_IPV6 or data[14] >> 4 != 6 or data[20] != ICMPV6:
        return None
    plen = struct.unpack_from("!H", data, 18)[0]
    msg = data[54:54 + plen]
    if len(msg) < 4 or len(msg) != plen:
        return None
    return data[6:12], ipaddress.IPv6Address(data[22:38]), ipaddress.IPv6Address(data[38:54]), msg[0], msg


def answer_rs(data: bytes, router_mac: str, prefix: str, mtu: int, mode: str) -> bytes | None:
    """The RA answering a router solicitation (to its sender, or to all nodes when it came from ::)."""
    got = parse_icmp6(data)
    if got is None or got[3] != RS or data[21] != 255:  # ND is never forwarded: hop limit 255 (RFC 4861, 6.1.1)
        return None
    src_mac, src = got[0], got[1]
    if src.is_unspecified:
        return router_advertisement(router_mac, prefix, mtu, mode)
    return router_advertisement(router_mac, prefix, mtu, mode, src_mac, src)


def time_exceeded(data: bytes, router_mac: str, router_ip: str) -> bytes | None:
    """ICMPv6 time exceeded (hop limit, code 0) answering `data`, from the router's address in the sender's
    subnet, as much of the packet as fits in the minimum MTU; None for an ICMPv6 error or a non-unicast source."""
    return _error(data, TIME_EXCEEDED, 0, router_mac, data[6:12], router_ip)


def packet_too_big(data: bytes, mtu: int, router_mac: str, vm_mac: str, router_ip: str) -> bytes | None:
    """ICMPv6 packet too big (RFC 4443 3.2) answering `data` with the path's `mtu`, to the VM that sent it (by
    then the switch had rewritten the frame's source MAC to a router's)."""
    return _error(data, PACKET_TOO_BIG, mtu, router_mac, mac_bytes(vm_mac), router_ip)


def _error(data: bytes, kind: int, word: int, router_mac: str, dst_mac: bytes, router_ip: str) -> bytes | None:
    if len(data) < 54 or struct.unpack_from("!H", data, 12)[0] != ETH_IPV6 or data[14] >> 4 != 6:
        return None
    src = ipaddress.IPv6Address(data[22:38])
    if src.is_multicast or src.is_unspecified or (data[20] == ICMPV6 and len(data) > 54 and data[54] < 128):
        return None
    invoking = data[14:14 + MIN_MTU - 48]
    msg = struct.pack("!BBHI", kind, 0, 0, word) + invoking
    return frame(mac_bytes(router_mac), dst_mac, ipaddress.IPv6Address(router_ip), src, ICMPV6, msg, 64)
