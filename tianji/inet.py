"""Internet-protocol helpers every component that answers packets in its own name shares (the agent's distributed
router, the gateways): the Internet checksum, an ICMP error's IPv4 datagram, and IPv6's EUI-64 addresses (the
API's SLAAC addresses, the router's link-local one). Pure functions."""

from __future__ import annotations

import ipaddress
import struct

PROTO_ICMP = 1
QUOTE = 8  # bytes of the offending datagram's payload quoted after its header (RFC 792)


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of `data`."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def icmp_error(about: bytes, typ: int, code: int, src: int, rest: bytes = b"\0\0\0\0", ttl: int = 64) -> bytes:
    """The IPv4 datagram carrying ICMP error `typ`/`code` about the datagram starting at `about` (its header and
    QUOTE bytes quoted, RFC 792), from `src` to `about`'s sender. `rest`: the 4 bytes after the checksum (the
    next-hop MTU of fragmentation-needed, RFC 1191). Deciding whether to answer at all is the caller's."""
    ihl = (about[0] & 0x0F) * 4
    body = struct.pack("!BBH", typ, code, 0) + rest + bytes(about[:ihl + QUOTE])
    body = body[:2] + struct.pack("!H", checksum(body)) + body[4:]
    sender = struct.unpack_from("!I", about, 12)[0]
    hdr = struct.pack("!BBHHHBBHII", 0x45, 0xC0, 20 + len(body), 0, 0, ttl, PROTO_ICMP, 0, src, sender)
    return hdr[:10] + struct.pack("!H", checksum(hdr)) + hdr[12:] + body


def eui64(net: ipaddress.IPv6Network, mac: str) -> ipaddress.IPv6Address:
    """The SLAAC address a host with `mac` forms in the /64 `net` (RFC 4291 appendix A: the U/L bit flipped,
    ff:fe in the middle)."""
    b = bytes.fromhex(mac.replace(":", ""))
    iid = bytes([b[0] ^ 0x02, *b[1:3], 0xFF, 0xFE, *b[3:]])
    return ipaddress.IPv6Address(int(net.network_address) | int.from_bytes(iid, "big"))


LINK_LOCAL = ipaddress.IPv6Network("fe80::/64")


def link_local(mac: str) -> ipaddress.IPv6Address:
    """The link-local address a MAC's interface forms (fe80::/64 and its EUI-64): the router's RA and ND source."""
    return eui64(LINK_LOCAL, mac)
