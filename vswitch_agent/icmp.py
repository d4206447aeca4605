"""ICMP errors the distributed router sends in its own name: time exceeded (RFC 792) for a packet whose TTL ran
out at the routing step, from the gateway address of the sender's subnet, so that traceroute shows the hop.
Pure functions on bytes: a frame that does not parse gives None, never an exception."""

from __future__ import annotations

import socket
import struct
import time

from tianji.inet import icmp_error
from tianji.ratelimit import TokenBucket

ETH_IP = 0x0800
ICMP_TIME_EXCEEDED = 11


def time_exceeded(frame: bytes, router_mac: str, router_ip: str) -> bytes | None:
    """The time-exceeded frame answering `frame` (Ethernet + IPv4), sent from the router, or None if `frame` is
    not an IPv4 packet one may answer (not an ICMP error itself, not a fragment past the first)."""
    if len(frame) < 34 or struct.unpack_from("!H", frame, 12)[0] != ETH_IP:
        return None
    ip = frame[14:]
    ver_ihl = ip[0]
    ihl = (ver_ihl & 0x0F) * 4
    if ver_ihl >> 4 != 4 or ihl < 20 or len(ip) < ihl:
        return None
    if struct.unpack_from("!H", ip, 6)[0] & 0x1FFF:
        return None  # not the first fragment: only the first is answered
    proto, src = ip[9], ip[12:16]
    if proto == 1 and len(ip) >= ihl + 1 and ip[ihl] not in (0, 8, 13, 15, 17):
        return None  # never an ICMP error about an ICMP error
    if src[0] in (0, 127) or src[0] >= 224:
        return None
    answer = icmp_error(ip, ICMP_TIME_EXCEEDED, 0, struct.unpack("!I", socket.inet_aton(router_ip))[0])
    return frame[6:12] + bytes.fromhex(router_mac.replace(":", "")) + struct.pack("!H", ETH_IP) + answer


class RateLimit(TokenBucket):
    """At most `rate` a second, bursts of `burst` (routers rate-limit ICMP errors: RFC 1812, 4.3.2.8)."""

    def __init__(self, rate: float = 100.0, burst: int = 200) -> None:
        super().__init__(rate, burst, time.monotonic())

    def allow(self) -> bool:
        return self.take(time.monotonic()) == 0
