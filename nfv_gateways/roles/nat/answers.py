"""The ICMP errors a NAT instance answers with itself (RFC 792, RFC 1191, RFC 1812): time exceeded, fragmentation
needed on the way out, rate-limited, each replacing the packet that caused it. A part of NatTable (reference.py)."""

from __future__ import annotations

import struct
from collections import Counter

from nfv_gateways.core.packet import (
    ICMP_ECHO,
    ICMP_ECHO_REPLY,
    ICMP_TIME_EXCEEDED,
    ICMP_UNREACH,
    PROTO_ICMP,
    Ip4,
    Verdict,
)
from nfv_gateways.roles.nat.policy import NatSettings
from tianji.inet import icmp_error
from tianji.ratelimit import TokenBucket


class IcmpAnswers:
    settings: NatSettings
    count: Counter[str]
    icmp_limit: TokenBucket
    static_in: dict[tuple[int, int], int]

    def _pick_eip(self, vni: int, ip: int) -> int | None:
        raise NotImplementedError

    def _eip_of(self, vni: int, ip: int) -> int | None:
        """The EIP an inside address leaves with (its 1:1 EIP, else its SNAT rule's): where its answers come from."""
        return self.static_in.get((vni, ip)) or self._pick_eip(vni, ip)

    def _frag_needed_out(self, vni: int, buf: bytearray, ip: Ip4, now: float) -> Verdict | None:
        """A packet from a VPC with a larger MTU than the internet side's, with DF: replace it with fragmentation
        needed (next-hop MTU: the external one) to the VM, from its EIP, so its path MTU discovery learns it."""
        eip = self._eip_of(vni, ip.src)
        if eip is None:
            self.count["drop_no_rule"] += 1
            return None
        start = ip.l4 - ip.ihl
        quoted = bytes(buf[start:ip.l4 + 8])
        mtu = struct.pack("!HH", 0, self.settings.external_mtu)
        if self._icmp_error(buf, quoted, ICMP_UNREACH, 4, mtu, now, "frag_needed_out", eip) is None:
            return None
        return Verdict("in", vni, ip.src)

    def _time_exceeded(self, buf: bytearray, ip: Ip4, now: float, src: int | None, to: Verdict) -> Verdict | None:
        """Replace `buf` with ICMP time exceeded for it, from `src`, sent as `to` says; None (dropped, counted)
        without an address to answer from."""
        if src is None:
            self.count["drop_ttl"] += 1
            return None
        start = ip.l4 - ip.ihl
        quoted = bytes(buf[start:min(start + ip.total, ip.l4 + 8)])
        if self._icmp_error(buf, quoted, ICMP_TIME_EXCEEDED, 0, b"\0\0\0\0", now, "ttl_exceeded", src) is None:
            return None
        return to

    def _icmp_error(self, buf: bytearray, about: bytes, typ: int, code: int, rest: bytes, now: float, what: str,
                    src: int | None = None) -> Verdict | None:
        """Replace `buf` with an ICMP error about the datagram whose start is `about` (RFC 792: its header and 8
        bytes quoted), to its sender, from `src` (default: the address it was sent to); Verdict("out"). None
        (dropped, counted) for an error about an ICMP error, or beyond the rate limit (RFC 1812 4.3.2.8)."""
        ihl = (about[0] & 0xF) * 4
        if about[9] == PROTO_ICMP and (len(about) <= ihl or about[ihl] not in (ICMP_ECHO, ICMP_ECHO_REPLY)):
            self.count[f"drop_{what}"] += 1
            return None
        if self.icmp_limit.take(now):
            self.count[f"drop_{what}_rate"] += 1
            return None
        buf[:] = icmp_error(about, typ, code, struct.unpack_from("!I", about, 16)[0] if src is None else src, rest)
        self.count[what] += 1
        return Verdict("out")
