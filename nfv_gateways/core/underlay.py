"""The underlay side every gateway role shares: VXLAN encapsulation as the C data plane writes it, and the
addresses of the frames a gateway sends in its own name."""

from __future__ import annotations

import struct

from tianji.inet import checksum

ETH_P_ALL, ETH_IP, ETH_ARP = 0x0003, 0x0800, 0x0806
PACKET_OUTGOING = 4
VXLAN_PORT = 4789
BCAST = b"\xff" * 6


def mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def mix64(x: int) -> int:
    """native/include/tj_bytes.h's mix(): the 64-bit finaliser of MurmurHash3, truncated to 32 bits."""
    m = (1 << 64) - 1
    x ^= x >> 33
    x = x * 0xFF51AFD7ED558CCD & m
    x ^= x >> 33
    x = x * 0xC4CEB9FE1A85EC53 & m
    x ^= x >> 33
    return x & 0xFFFFFFFF


def vxlan_ip_udp(src: int, dst: int, inner_ip: bytes, vxlan: bytes) -> bytes:
    """Outer IPv4 + UDP for a VXLAN payload, as the C data plane writes it (source port from the inner flow)."""
    a, b = int.from_bytes(inner_ip[12:16], "big"), int.from_bytes(inner_ip[16:20], "big")
    sport = 49152 | (mix64(a ^ b ^ inner_ip[9] << 32) & 0x3FFF)
    udp = struct.pack("!HHHH", sport, VXLAN_PORT, 8 + len(vxlan), 0)
    hdr = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(vxlan), 0, 0x4000, 64, 17, 0,
                                src.to_bytes(4, "big"), dst.to_bytes(4, "big")))
    hdr[10:12] = checksum(bytes(hdr)).to_bytes(2, "big")
    return bytes(hdr) + udp + vxlan
