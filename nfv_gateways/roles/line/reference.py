"""A private line's packet semantics, in Python: the reference a native stage is held equal to.

* From a VPC (VXLAN in its VNI): a packet to a prefix the VPC reaches over one of its lines (the line's static
  routes, and what its BGP sessions on this instance learned; longest prefix first) leaves on that line's VLAN,
  to the customer's router of the session that learned it. Bigger than the handoff's MTU: fragmented, or with DF
  answered with fragmentation needed (RFC 1191) from the line's address on the cloud side.
* From the handoff (802.1Q): a packet on a line's VLAN enters that line's VPC (its VNI) if it is addressed inside
  the VPC's CIDR (a line is no transit to anything else), its TTL taken down by one (this is a router hop: time
  exceeded answered back on the VLAN), fragmented to the VPC's MTU or answered with fragmentation needed.
  Another VLAN, or none, is dropped and counted.
"""

from __future__ import annotations

import ipaddress
import struct
from collections import Counter
from dataclasses import dataclass, field

from nfv_gateways.core.packet import ICMP_TIME_EXCEEDED, ICMP_UNREACH, PROTO_ICMP, Ip4, Verdict, fragment, parse_ip4
from tianji.inet import checksum, icmp_error
from tianji.ratelimit import TokenBucket

Prefix = tuple[int, int]  # (network, length)


def prefix_of(text: str) -> Prefix:
    n = ipaddress.IPv4Network(text, strict=False)
    return int(n.network_address), n.prefixlen


def _mask(plen: int) -> int:
    return (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF if plen else 0


@dataclass(frozen=True)
class Session:
    local: int  # the cloud's address on the line's link
    customer: int  # the customer's router
    prefixlen: int


@dataclass(frozen=True)
class Line:
    """A line as the instance carries it: typed from the controller's PrivateLineServed (policy.line_of)."""

    id: str
    vni: int
    vlan: int
    mtu: int  # the VPC's
    vpc: Prefix
    sessions: tuple[Session, ...]
    static: tuple[Prefix, ...]  # reached through the first session's customer router


@dataclass
class LineVerdict(Verdict):
    """`out`: on VLAN `vlan` to `nexthop`; `in`: into VNI `vni` to `ip` (Verdict's)."""

    vlan: int = 0
    nexthop: int = 0
    src: int = 0  # the address an answer of ours (ICMP) comes from, for the neighbour's ARP


@dataclass
class LineTable:
    handoff_mtu: int = 1500
    counters: Counter[str] = field(default_factory=Counter)
    lines: dict[str, Line] = field(default_factory=dict)
    by_vlan: dict[int, Line] = field(default_factory=dict)
    learned: dict[tuple[str, int], frozenset[Prefix]] = field(default_factory=dict)  # (line, session) -> prefixes
    # VNI -> (network, mask, length, line, next hop, the session's local address), longest first
    routes: dict[int, list[tuple[int, int, int, Line, int, int]]] = field(default_factory=dict)
    icmp_limit: TokenBucket = field(default_factory=lambda: TokenBucket(100.0, 100, 0.0))

    # --- policy ---------------------------------------------------------------------------------------------
    def set_line(self, line: Line) -> None:
        old = self.lines.get(line.id)
        if old is not None:
            self.by_vlan.pop(old.vlan, None)
        self.lines[line.id], self.by_vlan[line.vlan] = line, line
        self.learned = {k: v for k, v in self.learned.items() if k[0] != line.id or k[1] in
                        {s.local for s in line.sessions}}
        self._route(line.vni)
        if old is not None and old.vni != line.vni:
            self._route(old.vni)

    def remove_line(self, line_id: str) -> None:
        old = self.lines.pop(line_id, None)
        if old is None:
            return
        self.by_vlan.pop(old.vlan, None)
        self.learned = {k: v for k, v in self.learned.items() if k[0] != line_id}
        self._route(old.vni)

    def set_learned(self, line_id: str, local: int, prefixes: frozenset[Prefix]) -> None:
        """What the session at `local` of the line accepted (its BGP daemon's routes)."""
        if self.learned.get((line_id, local), frozenset()) == prefixes or line_id not in self.lines:
            return
        self.learned[(line_id, local)] = prefixes
        self._route(self.lines[line_id].vni)

    def _route(self, vni: int) -> None:
        """The VNI's table: a static route through the line's first session here, a learned one through the
        session that learned it."""
        table: dict[Prefix, tuple[Line, Session]] = {}
        for line in sorted((x for x in self.lines.values() if x.vni == vni), key=lambda x: x.id):
            if not line.sessions:
                continue
            for p in line.static:
                table.setdefault(p, (line, line.sessions[0]))
            for s in line.sessions:
                for p in sorted(self.learned.get((line.id, s.local), ())):
                    if not _inside(p, line.vpc):
                        table.setdefault(p, (line, s))
        rows = [(net & _mask(plen), _mask(plen), plen, line, s.customer, s.local)
                for (net, plen), (line, s) in table.items()]
        if rows:
            self.routes[vni] = sorted(rows, key=lambda r: -r[2])
        else:
            self.routes.pop(vni, None)

    def lookup(self, vni: int, dst: int) -> tuple[Line, int, int] | None:
        """(line, next hop, the session's local address) for `dst` in VNI `vni`, longest prefix first."""
        for net, mask, _, line, hop, local in self.routes.get(vni, ()):
            if dst & mask == net:
                return line, hop, local
        return None

    # --- packets --------------------------------------------------------------------------------------------
    def outbound(self, vni: int, buf: bytearray, now: float) -> LineVerdict | None:
        """A VPC's packet (IPv4, from VXLAN): to its line, or an answer to the VM; None: drop (counted)."""
        ip = parse_ip4(buf)
        if ip is None:
            self.counters["drop_malformed"] += 1
            return None
        hit = self.lookup(vni, ip.dst)
        if hit is None:
            self.counters["drop_no_route"] += 1
            return None
        line, hop, local = hit
        if ip.total > self.handoff_mtu:
            if struct.unpack_from("!H", buf, 6)[0] & 0x4000:  # DF: the VM's path MTU discovery learns it
                if not self._answer(buf, ip, ICMP_UNREACH, 4, struct.pack("!HH", 0, self.handoff_mtu), now,
                                    "frag_needed_out", local):
                    return None
                return LineVerdict("in", vni, ip.src)
            self.counters["fragmented_out"] += 1
            return LineVerdict("out", fragments=fragment(bytes(buf[:ip.total]), self.handoff_mtu), vlan=line.vlan,
                               nexthop=hop, src=local)
        self.counters["line_out"] += 1
        return LineVerdict("out", vlan=line.vlan, nexthop=hop, src=local)

    def inbound(self, vlan: int | None, buf: bytearray, now: float) -> LineVerdict | None:
        """A packet from the handoff on VLAN `vlan` (None: untagged): into its line's VPC, or an answer back on
        the VLAN; None: drop (counted)."""
        line = self.by_vlan.get(vlan) if vlan is not None else None
        if line is None:
            self.counters["drop_untagged" if vlan is None else "drop_unknown_vlan"] += 1
            return None
        ip = parse_ip4(buf)
        if ip is None:
            self.counters["drop_malformed"] += 1
            return None
        if ip.dst & _mask(line.vpc[1]) != line.vpc[0]:
            self.counters["drop_not_in_vpc"] += 1
            return None
        local = line.sessions[0].local if line.sessions else 0
        back = LineVerdict("out", vlan=vlan, nexthop=ip.src, src=local)  # an answer to the sender, on its VLAN
        if buf[8] <= 1:
            ok = self._answer(buf, ip, ICMP_TIME_EXCEEDED, 0, b"\0\0\0\0", now, "ttl_exceeded", local)
            return back if ok else None
        if ip.total > line.mtu and struct.unpack_from("!H", buf, 6)[0] & 0x4000:
            ok = self._answer(buf, ip, ICMP_UNREACH, 4, struct.pack("!HH", 0, line.mtu), now, "frag_needed", local)
            return back if ok else None
        _dec_ttl(buf, ip)
        if ip.total > line.mtu:
            self.counters["fragmented"] += 1
            return LineVerdict("in", line.vni, ip.dst, fragment(bytes(buf[:ip.total]), line.mtu))
        self.counters["line_in"] += 1
        return LineVerdict("in", line.vni, ip.dst)

    def _answer(self, buf: bytearray, ip: Ip4, typ: int, code: int, rest: bytes, now: float, what: str,
                src: int) -> bool:
        """Replace `buf` with an ICMP error about it, from `src`; False (dropped, counted) for an error about an
        ICMP error, or beyond the rate limit (RFC 1812 4.3.2.8)."""
        if ip.proto == PROTO_ICMP and (len(buf) <= ip.l4 or buf[ip.l4] not in (0, 8)):
            self.counters[f"drop_{what}"] += 1
            return False
        if self.icmp_limit.take(now):
            self.counters[f"drop_{what}_rate"] += 1
            return False
        buf[:] = icmp_error(bytes(buf[:ip.l4 + 8]), typ, code, src, rest)
        self.counters[what] += 1
        return True

    def expire(self, now: float) -> int:
        return 0



def _inside(p: Prefix, q: Prefix) -> bool:
    """`p` is `q` or a more specific of it (the controller refuses those; a covering route is fine)."""
    return p[1] >= q[1] and p[0] & _mask(q[1]) == q[0]


def _dec_ttl(buf: bytearray, ip: Ip4) -> None:
    buf[8] -= 1
    struct.pack_into("!H", buf, 10, 0)
    struct.pack_into("!H", buf, 10, checksum(bytes(buf[:ip.ihl])))


__all__ = ["Line", "LineTable", "LineVerdict", "Prefix", "Session", "prefix_of"]
