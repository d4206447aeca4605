"""IPv4 packet surgery on bytes: parse the headers NAT needs and rewrite them with incremental checksums.

This is the pure-Python reference; the native fast path must produce byte-identical output for the same input.
Every parser returns None for anything it cannot handle safely (truncated, bad lengths, options it would have to
walk past, non-first fragments): the caller counts and drops it.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from tianji.inet import checksum

ETH_IP = 0x0800
PROTO_ICMP, PROTO_TCP, PROTO_UDP = 1, 6, 17
ICMP_ECHO_REPLY, ICMP_UNREACH, ICMP_ECHO, ICMP_TIME_EXCEEDED = 0, 3, 8, 11
VXLAN_PORT = 4789


def csum_update(old_sum: int, old: int, new: int) -> int:
    """RFC 1624 incremental update of a checksum for one 16-bit word changing from `old` to `new`."""
    s = (~old_sum & 0xFFFF) + (~old & 0xFFFF) + new
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def csum_update32(old_sum: int, old: int, new: int) -> int:
    return csum_update(csum_update(old_sum, old >> 16, new >> 16), old & 0xFFFF, new & 0xFFFF)


@dataclass
class Ip4:
    """Offsets into a buffer holding an IPv4 packet (no Ethernet)."""

    ihl: int
    total: int
    proto: int
    src: int
    dst: int
    frag_offset: int
    more_fragments: bool
    l4: int  # offset of the L4 header

    @property
    def is_fragment(self) -> bool:
        return self.frag_offset != 0 or self.more_fragments


def parse_ip4(buf: bytes | bytearray, off: int = 0) -> Ip4 | None:
    if len(buf) - off < 20:
        return None
    vihl = buf[off]
    if vihl >> 4 != 4:
        return None
    ihl = (vihl & 0xF) * 4
    total = struct.unpack_from("!H", buf, off + 2)[0]
    if ihl < 20 or total < ihl or off + total > len(buf):
        return None
    if checksum(bytes(buf[off:off + ihl])) != 0:
        return None
    frag = struct.unpack_from("!H", buf, off + 6)[0]
    src, dst = struct.unpack_from("!II", buf, off + 12)
    return Ip4(ihl, total, buf[off + 9], src, dst, frag & 0x1FFF, bool(frag & 0x2000), off + ihl)


def l4_ports(buf: bytes | bytearray, ip: Ip4) -> tuple[int, int] | None:
    """(source, destination) ports for TCP/UDP, (id, id) for ICMP echo; None if truncated or not NAT-able."""
    l4, end = ip.l4, ip.l4 - ip.ihl + ip.total  # l4 offset, end of the IP packet
    if ip.proto == PROTO_TCP and end - l4 >= 20:
        return struct.unpack_from("!HH", buf, l4)
    if ip.proto == PROTO_UDP and end - l4 >= 8:
        return struct.unpack_from("!HH", buf, l4)
    if ip.proto == PROTO_ICMP and end - l4 >= 8 and buf[l4] in (ICMP_ECHO, ICMP_ECHO_REPLY):
        ident = struct.unpack_from("!H", buf, l4 + 4)[0]
        return ident, ident
    return None


def l4_csum_offset(ip: Ip4) -> int | None:
    return {PROTO_TCP: ip.l4 + 16, PROTO_UDP: ip.l4 + 6, PROTO_ICMP: ip.l4 + 2}.get(ip.proto)


def rewrite_addr(buf: bytearray, ip: Ip4, *, src: int | None = None, dst: int | None = None) -> None:
    """Change the source and/or destination address, fixing the IP and (pseudo-header) L4 checksums."""
    off = ip.l4 - ip.ihl
    ck = struct.unpack_from("!H", buf, off + 10)[0]
    l4ck_off = l4_csum_offset(ip) if ip.proto in (PROTO_TCP, PROTO_UDP) else None
    l4ck = struct.unpack_from("!H", buf, l4ck_off)[0] if l4ck_off is not None else None
    for field_off, new in ((12, src), (16, dst)):
        if new is None:
            continue
        old = struct.unpack_from("!I", buf, off + field_off)[0]
        struct.pack_into("!I", buf, off + field_off, new)
        ck = csum_update32(ck, old, new)
        if l4ck is not None and not (ip.proto == PROTO_UDP and l4ck == 0):  # UDP checksum 0: none computed
            l4ck = csum_update32(l4ck, old, new)
            if ip.proto == PROTO_UDP and l4ck == 0:
                l4ck = 0xFFFF
    struct.pack_into("!H", buf, off + 10, ck)
    if l4ck is not None:
        struct.pack_into("!H", buf, l4ck_off, l4ck)
    if src is not None:
        ip.src = src
    if dst is not None:
        ip.dst = dst


def rewrite_port(buf: bytearray, ip: Ip4, *, src: int | None = None, dst: int | None = None) -> None:
    """Change the L4 source/destination port (the ICMP echo identifier for ICMP), fixing the L4 checksum."""
    ck_off = l4_csum_offset(ip)
    ck = struct.unpack_from("!H", buf, ck_off)[0]
    udp_nock = ip.proto == PROTO_UDP and ck == 0
    fields = ((4, src),) if ip.proto == PROTO_ICMP else ((0, src), (2, dst))
    for rel, new in fields:
        if new is None:
            continue
        old = struct.unpack_from("!H", buf, ip.l4 + rel)[0]
        struct.pack_into("!H", buf, ip.l4 + rel, new)
        if not udp_nock:
            ck = csum_update(ck, old, new)
    if ip.proto == PROTO_UDP and not udp_nock and ck == 0:
        ck = 0xFFFF
    struct.pack_into("!H", buf, ck_off, ck)


def dec_ttl(buf: bytearray, ip: Ip4) -> bool:
    """Decrement the TTL; False if it expired (the caller answers with ICMP time exceeded or drops)."""
    off = ip.l4 - ip.ihl
    ttl = buf[off + 8]
    if ttl <= 1:
        return False
    old = struct.unpack_from("!H", buf, off + 8)[0]
    buf[off + 8] = ttl - 1
    new = struct.unpack_from("!H", buf, off + 8)[0]
    ck = struct.unpack_from("!H", buf, off + 10)[0]
    struct.pack_into("!H", buf, off + 10, csum_update(ck, old, new))
    return True


def ip2int(ip: str) -> int:
    # inet_aton: a tenth of ipaddress's cost, which was most of a config apply with 10,000 endpoints
    return int.from_bytes(socket.inet_aton(ip), "big")


@dataclass
class Verdict:
    """Where a translated packet goes: `out` (the internet side) or `in` (into VNI `vni`, to internal `ip`)."""

    direction: str
    vni: int = 0
    ip: int = 0
    fragments: tuple[bytes, ...] = ()  # set when the packet was cut to fit the VPC's MTU: send these instead


def ip_header(head: bytes, total: int, flags_offset: int) -> bytes:
    """IPv4 header `head` (its identification and options kept) with this total length and flags/fragment offset,
    its IHL and checksum made to match."""
    hdr = bytearray(head)
    hdr[0] = 0x40 | len(hdr) // 4
    struct.pack_into("!H", hdr, 2, total)
    struct.pack_into("!H", hdr, 6, flags_offset)
    struct.pack_into("!H", hdr, 10, 0)
    struct.pack_into("!H", hdr, 10, checksum(bytes(hdr)))
    return bytes(hdr)


def set_ip_checksum(buf: bytearray, ip: Ip4) -> None:
    """The IPv4 header's checksum computed afresh (after a change of length)."""
    off = ip.l4 - ip.ihl
    struct.pack_into("!H", buf, off + 10, 0)
    struct.pack_into("!H", buf, off + 10, checksum(bytes(buf[off:off + ip.ihl])))


def set_l4_checksum(buf: bytearray, ip: Ip4) -> None:
    """The TCP or UDP checksum computed afresh over the segment and its pseudo-header (a UDP sum of 0 is sent as
    0xFFFF: 0 would mean none)."""
    end = ip.l4 - ip.ihl + ip.total
    at = ip.l4 + (16 if ip.proto == PROTO_TCP else 6)
    struct.pack_into("!H", buf, at, 0)
    pseudo = struct.pack("!IIBBH", ip.src, ip.dst, 0, ip.proto, end - ip.l4)
    total = checksum(pseudo + bytes(buf[ip.l4:end]))
    struct.pack_into("!H", buf, at, (total or 0xFFFF) if ip.proto == PROTO_UDP else total)


def fragment(pkt: bytes, mtu: int) -> tuple[bytes, ...]:
    """An IPv4 packet cut into fragments of at most `mtu` bytes (RFC 791): payload in multiples of 8, MF on all
    but the last, options without the copy bit left out after the first, each header's checksum recomputed."""
    ihl = (pkt[0] & 0xF) * 4
    head, payload = pkt[:ihl], pkt[ihl:]
    opts, i, copied = head[20:], 0, b""
    while i < len(opts) and opts[i] != 0:
        n = 1 if opts[i] == 1 else max(2, opts[i + 1] if i + 1 < len(opts) else 2)
        if opts[i] & 0x80:
            copied += opts[i:i + n]
        i += n
    later = head[:20] + copied + b"\0" * (-len(copied) % 4)
    flags_off = struct.unpack_from("!H", head, 6)[0]
    base, more = flags_off & 0x1FFF, flags_off & 0x2000
    out, off = [], 0
    while off < len(payload):
        h = head if off == 0 else later
        step = (mtu - len(h)) // 8 * 8
        chunk = payload[off:off + step]
        last = off + len(chunk) >= len(payload)
        out.append(ip_header(h, len(h) + len(chunk),
                             (flags_off & 0x4000) | (more if last else 0x2000) | (base + off // 8)) + chunk)
        off += len(chunk)
    return tuple(out)


def parse_inner(buf: bytes | bytearray, off: int) -> Ip4 | None:
    """The IP header embedded in an ICMP error: often truncated, so only its header must be whole and valid."""
    if len(buf) - off < 20 or buf[off] >> 4 != 4:
        return None
    ihl = (buf[off] & 0xF) * 4
    if ihl < 20 or len(buf) - off < ihl or checksum(bytes(buf[off:off + ihl])) != 0:
        return None
    frag = struct.unpack_from("!H", buf, off + 6)[0]
    src, dst = struct.unpack_from("!II", buf, off + 12)
    total = struct.unpack_from("!H", buf, off + 2)[0]
    return Ip4(ihl, total, buf[off + 9], src, dst, frag & 0x1FFF, bool(frag & 0x2000), off + ihl)
