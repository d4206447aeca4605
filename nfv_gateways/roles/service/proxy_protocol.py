"""PROXY protocol v2 (haproxy's proxy-protocol.txt, section 2.2) for connections through a service endpoint, put
into the VM's own TCP stream by the instance without terminating it: the header takes the stream's first bytes,
the VM's later sequence numbers move up by its length, and the service's acknowledgements down by it. A UDP
datagram carries the header in front of its own payload, every datagram (UDP has no stream to begin; the spec's
"UDP over IPv4", 0x12); the service's answers come back as they are.

The header names the VM (source address and port), the endpoint's address in the VM's subnet and the service port
(destination), and the endpoint (TLV PP2_TYPE_AWS 0xEA, subtype 0x01 VPCE id: the id that tells tenants apart,
as PrivateLink's does)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from nfv_gateways.core.packet import Ip4, set_ip_checksum, set_l4_checksum

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
PP2_TYPE_AWS, PP2_SUBTYPE_AWS_VPCE_ID = 0xEA, 0x01
TCP_OPT_END, TCP_OPT_NOP, TCP_OPT_MSS, TCP_OPT_SACK_OK = 0, 1, 2, 4


STREAM, DGRAM = 0x11, 0x12  # TCP over IPv4, UDP over IPv4


def header(src: int, sport: int, dst: int, dport: int, endpoint_id: str, transport: int = STREAM) -> bytes:
    """The v2 PROXY command for TCP (or UDP: `transport` DGRAM) over IPv4 with the endpoint's TLV."""
    value = bytes([PP2_SUBTYPE_AWS_VPCE_ID]) + endpoint_id.encode()
    tlv = struct.pack("!BH", PP2_TYPE_AWS, len(value)) + value
    body = struct.pack("!IIHH", src, dst, sport, dport) + tlv
    return SIGNATURE + struct.pack("!BBH", 0x21, transport, len(body)) + body


def prefix_datagram(buf: bytearray, ip: Ip4, head: bytes) -> None:
    """The UDP datagram in `buf` (IP header included, `ip` parsed from it) with `head` in front of its payload:
    lengths and both checksums made right again."""
    off, payload, end = ip.l4 - ip.ihl, ip.l4 + 8, ip.l4 - ip.ihl + ip.total
    buf[:] = buf[:payload] + head + buf[payload:end]
    ip.total += len(head)
    struct.pack_into("!H", buf, off + 2, ip.total)
    struct.pack_into("!H", buf, ip.l4 + 4, ip.total - ip.ihl)
    set_ip_checksum(buf, ip)
    set_l4_checksum(buf, ip)


def parse(data: bytes) -> dict | None:
    """A v2 header at the start of `data` (what a service reads): its addresses and TLVs; None if not one."""
    if len(data) < 16 or data[:12] != SIGNATURE or data[12] != 0x21 or data[13] not in (STREAM, DGRAM):
        return None
    n = struct.unpack_from("!H", data, 14)[0]
    if len(data) < 16 + n or n < 12:
        return None
    src, dst, sport, dport = struct.unpack_from("!IIHH", data, 16)
    tlvs, i = {}, 28
    while i + 3 <= 16 + n:
        t, ln = struct.unpack_from("!BH", data, i)
        tlvs[t] = data[i + 3:i + 3 + ln]
        i += 3 + ln
    return {"src": src, "sport": sport, "dst": dst, "dport": dport, "tlvs": tlvs, "length": 16 + n,
            "transport": "udp" if data[13] == DGRAM else "tcp"}


def _options(buf: bytearray, l4: int) -> Iterator[tuple[int, int, int]]:
    """The TCP header's options at `l4`: (offset, kind, length) each, NOP and END left out; stops at a malformed
    length (the caller has checked the header is whole)."""
    i, end = l4 + 20, l4 + (buf[l4 + 12] >> 4) * 4
    while i < end:
        kind = buf[i]
        if kind == TCP_OPT_END:
            return
        if kind == TCP_OPT_NOP:
            i += 1
            continue
        if i + 1 >= end or buf[i + 1] < 2:
            return
        yield i, kind, buf[i + 1]
        i += buf[i + 1]


def strip_sack_permitted(buf: bytearray, l4: int) -> bool:
    """SACK-permitted in a SYN's options made NOPs (the service's SACK blocks would name shifted sequence numbers);
    whether one was found. The caller fixes the checksum."""
    for i, kind, n in _options(buf, l4):
        if kind == TCP_OPT_SACK_OK:
            buf[i:i + n] = bytes([TCP_OPT_NOP]) * n
            return True
    return False


def clamp_mss(buf: bytearray, l4: int, most: int) -> bool:
    """The MSS option of a SYN lowered to `most` (room for the header in the VM's first segment); whether it
    changed."""
    for i, kind, n in _options(buf, l4):
        if kind == TCP_OPT_MSS and n == 4 and struct.unpack_from("!H", buf, i + 2)[0] > most:
            struct.pack_into("!H", buf, i + 2, most)
            return True
    return False


__all__ = ["SIGNATURE", "clamp_mss", "header", "parse", "strip_sack_permitted"]
