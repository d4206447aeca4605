"""The VPC's resolver at each subnet's gateway address (what DHCP names as the DNS server): it answers the names of
the VPC's service endpoints (`<service>.<vpc>.internal`, from the compiled config) and says NXDOMAIN for other
names under `.internal`; other names go to the operator's resolver where the agent has one (`--dns-forwarder`),
and are REFUSED where it has none. Pure functions on frames: the answer, or what to forward (dns_forward.py).
UDP only, one question per query (what stub resolvers send); anything else is ignored, never an exception."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from tianji.inet import checksum

ZONE = ".internal"
TTL = 30  # endpoints come and go: resolvers hold an answer this long
QTYPE_A, QCLASS_IN = 1, 1
RCODE_NOERROR, RCODE_FORMERR, RCODE_NXDOMAIN, RCODE_REFUSED = 0, 1, 3, 5
FLAG_QR, FLAG_AA, FLAG_RD, FLAG_RA = 0x8000, 0x0400, 0x0100, 0x0080


@dataclass(frozen=True)
class Query:
    """A VM's query as it came: its frame's addresses and ports, and the DNS message."""

    vm_mac: bytes
    vm_ip: bytes
    vm_port: int
    server_ip: bytes  # the gateway address it asked
    message: bytes
    ident: int
    name: str  # lowercase, without the trailing dot
    qtype: int
    question_end: int  # where the question ends in the message


def _name(msg: bytes, off: int) -> tuple[str, int]:
    labels = []
    while True:
        if off >= len(msg):
            raise ValueError("name runs past the message")
        n = msg[off]
        if n == 0:
            return ".".join(labels), off + 1
        if n & 0xC0:
            raise ValueError("compression in a question")  # a stub resolver never compresses its question
        labels.append(msg[off + 1:off + 1 + n].decode("ascii", "strict").lower())
        off += 1 + n
        if len(labels) > 127 or off > 255 + 12:
            raise ValueError("name too long")


def parse(frame: bytes) -> Query | None:
    """The query in an Ethernet frame (IPv4, UDP to port 53, a standard query with one question), or None."""
    try:
        if len(frame) < 14 + 20 + 8 + 12 or frame[12:14] != b"\x08\x00":
            return None
        ihl = (frame[14] & 0x0F) * 4
        if frame[14] >> 4 != 4 or ihl < 20 or frame[23] != 17 or struct.unpack_from("!H", frame, 20)[0] & 0x3FFF:
            return None  # not IPv4 UDP, or a fragment
        udp = 14 + ihl
        sport, dport, ulen = struct.unpack_from("!HHH", frame, udp)
        if dport != 53 or ulen < 8 + 12 or udp + ulen > len(frame):
            return None
        msg = frame[udp + 8:udp + ulen]
        ident, flags, qd, an, ns, _ar = struct.unpack_from("!HHHHHH", msg, 0)
        if flags & FLAG_QR or (flags >> 11) & 0xF != 0 or qd != 1 or an or ns:
            return None  # an answer, not a standard query, or not one question
        name, off = _name(msg, 12)
        if off + 4 > len(msg):
            return None
        qtype, qclass = struct.unpack_from("!HH", msg, off)
        if qclass != QCLASS_IN:
            return None
        return Query(frame[6:12], frame[26:30], sport, frame[30:34], msg, ident, name, qtype, off + 4)
    except (ValueError, UnicodeDecodeError, struct.error):
        return None


def is_ours(q: Query) -> bool:
    """Whether the VPC's resolver answers it itself (the endpoints' zone)."""
    return q.name == ZONE[1:] or q.name.endswith(ZONE)


def answer_message(q: Query, records: dict[str, str]) -> bytes:
    """The answer to a query for the endpoints' zone, from `records` (name -> IPv4 address): the address for A, no
    data for another type of a known name, NXDOMAIN for an unknown one."""
    known = q.name in records
    answers = b""
    if known and q.qtype == QTYPE_A:
        answers = b"\xc0\x0c" + struct.pack("!HHIH", QTYPE_A, QCLASS_IN, TTL, 4) + \
            ipaddress.IPv4Address(records[q.name]).packed
    rcode = RCODE_NOERROR if known else RCODE_NXDOMAIN
    return _reply(q, rcode, answers, 1 if answers else 0, FLAG_AA)


def refused(q: Query) -> bytes:
    return _reply(q, RCODE_REFUSED, b"", 0, 0)


def _reply(q: Query, rcode: int, answers: bytes, ancount: int, extra_flags: int) -> bytes:
    flags = FLAG_QR | extra_flags | (struct.unpack_from("!H", q.message, 2)[0] & FLAG_RD) | FLAG_RA | rcode
    return struct.pack("!HHHHHH", q.ident, flags, 1, ancount, 0, 0) + q.message[12:q.question_end] + answers


def frame_to_vm(q: Query, message: bytes, router_mac: str) -> bytes:
    """`message` as the resolver's UDP answer to the VM that asked (from the gateway's MAC and address)."""
    udp_len = 8 + len(message)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0x4000, 64, 17, 0, q.server_ip, q.vm_ip))
    struct.pack_into("!H", ip, 10, checksum(bytes(ip)))
    udp = struct.pack("!HHHH", 53, q.vm_port, udp_len, 0)  # no UDP checksum: optional over IPv4 (RFC 768)
    return q.vm_mac + bytes.fromhex(router_mac.replace(":", "")) + b"\x08\x00" + bytes(ip) + udp + message


__all__ = ["Query", "answer_message", "frame_to_vm", "is_ours", "parse", "refused"]
