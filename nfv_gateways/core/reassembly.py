"""IPv4 reassembly at the NAT (RFC 4787 REQ-14: a NAT must handle fragments, in order or not): a non-first fragment
carries no ports, so the gateway holds a datagram's fragments until it is whole, then translates it like any other
packet (and cuts it again if it is bigger than where it goes).

Bounded, since anyone on the internet can send fragments: at most MAX_DATAGRAMS datagrams and MAX_BYTES held at
once, each for at most TIMEOUT seconds; overlapping fragments drop the whole datagram (RFC 5722's stance: overlap is
how fragments are used to slip past filters). Everything dropped is counted.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field

from nfv_gateways.core.packet import Ip4, ip_header

MAX_DATAGRAMS = 256
MAX_BYTES = 4 << 20
TIMEOUT = 5.0


@dataclass
class _Held:
    first_seen: float
    header: bytes = b""  # the first fragment's header (offset 0), options included
    parts: dict[int, bytes] = field(default_factory=dict)  # byte offset -> payload
    total: int | None = None  # payload length, known once the last fragment (MF clear) arrived
    size: int = 0


class Reassembler:
    def __init__(self, counters: Counter[str]) -> None:
        self.counters = counters
        self.held: dict[tuple, _Held] = {}
        self.bytes = 0

    def add(self, scope: int, buf: bytes | bytearray, ip: Ip4, now: float) -> bytes | None:
        """Hold this fragment (of a datagram from `scope`: a VNI inside, 0 outside); the whole datagram once every
        fragment has arrived, else None."""
        self.expire(now)
        start = ip.l4 - ip.ihl
        key = (scope, ip.src, ip.dst, struct.unpack_from("!H", buf, start + 4)[0], ip.proto)
        payload = bytes(buf[ip.l4:start + ip.total])
        offset = ip.frag_offset * 8
        d = self.held.get(key)
        if d is None:
            if len(self.held) >= MAX_DATAGRAMS or self.bytes + len(payload) > MAX_BYTES:
                self.counters["drop_frag_full"] += 1
                return None
            d = self.held[key] = _Held(now)
        if any(offset < o + len(p) and o < offset + len(payload) for o, p in d.parts.items()) or \
                offset + len(payload) > 65535 - 20 or (d.total is not None and offset + len(payload) > d.total):
            self._drop(key, "drop_frag_overlap")
            return None
        d.parts[offset] = payload
        d.size += len(payload)
        self.bytes += len(payload)
        if offset == 0:
            d.header = bytes(buf[start:ip.l4])
        if not ip.more_fragments:
            d.total = offset + len(payload)
        self.counters["fragments_held"] += 1
        if d.total is None or not d.header or d.size != d.total:
            return None
        whole = b"".join(d.parts[o] for o in sorted(d.parts))
        self._forget(key)
        self.counters["reassembled"] += 1
        df = struct.unpack_from("!H", d.header, 6)[0] & 0x4000  # offset 0, MF clear
        return ip_header(d.header, len(d.header) + len(whole), df) + whole

    def expire(self, now: float) -> None:
        for key in [k for k, d in self.held.items() if now - d.first_seen > TIMEOUT]:
            self._drop(key, "drop_frag_timeout")

    def _drop(self, key: tuple, why: str) -> None:
        self.counters[why] += 1
        self._forget(key)

    def _forget(self, key: tuple) -> None:
        d = self.held.pop(key)
        self.bytes -= d.size


__all__ = ["MAX_BYTES", "MAX_DATAGRAMS", "TIMEOUT", "Reassembler"]
