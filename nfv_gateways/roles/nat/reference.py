"""The NAT gateway's translation semantics (RFC 4787 / RFC 5382 / RFC 5508), the pure-Python reference.

Behaviour:
* Endpoint-independent mapping: an internal (VNI, IP, port, protocol) keeps one public (EIP, port) whatever the
  destination. "Paired" pooling: an internal address always uses the same EIP of its rule.
* Filtering: address-and-port-dependent. Inbound packets reach a dynamic mapping only from a remote (IP, port)
  the internal endpoint has sent to (for ICMP echo, from the address it pinged). 1:1 EIPs and DNAT rules accept
  inbound from anywhere (security groups still apply at the VM's host).
* Hairpinning: a VM sending to an EIP served here is translated out and straight back in, and meets the
  receiver's filter as if it came from the internet (RFC 4787 REQ-9).
* Size: a datagram bigger than its VPC's MTU (in) or the internet side's (out) is cut to fit, or with DF answered
  with fragmentation needed (RFC 1191). Fragments are held until whole (RFC 4787 REQ-14; reassembly.py).
* A routing hop: TTL - 1 on everything forwarded; a TTL that runs out is answered with time exceeded (rate-limited)
  from the EIP: the one a VM leaves with, or the one the internet sent to.
* TCP, UDP and ICMP echo (identifier translated like a port). ICMP errors arriving for a mapping are translated
  back with their embedded header rewritten.
* Timeouts (configurable): UDP 300 s (RFC 4787 minimum 120 s), TCP established 7440 s, TCP transitory 240 s,
  ICMP 60 s.
* Each instance owns a disjoint slice of the port range; when it is full the packet is dropped and
  `port_exhausted` counted: a live mapping is never reused.

The mappings live in a `FlowStore` (store.py): dicts here by default, the C table the packet loop translates with
on a native data plane. This module decides; the store holds, allocates ports, and expires (its rules: store.py).
"""

from __future__ import annotations

import struct
from collections import Counter

from nfv_gateways.core.packet import (
    ICMP_ECHO,
    ICMP_ECHO_REPLY,
    ICMP_TIME_EXCEEDED,
    ICMP_UNREACH,
    PROTO_ICMP,
    PROTO_TCP,
    PROTO_UDP,
    Ip4,
    Verdict,
    dec_ttl,
    fragment,
    ip2int,
    l4_ports,
    parse_inner,
    parse_ip4,
    rewrite_addr,
    rewrite_port,
)
from nfv_gateways.core.reassembly import Reassembler
from nfv_gateways.roles.nat.answers import IcmpAnswers
from nfv_gateways.roles.nat.index import PolicyIndex
from nfv_gateways.roles.nat.policy import NatConfig, NatSettings, SnatRule, Timeouts, VpcNat, changed_vpcs
from nfv_gateways.roles.nat.store import NO_PORT, TCP_PORT_HOLD, DictStore, FlowStore, Mapping, add_peer
from tianji.inet import checksum
from tianji.ratelimit import TokenBucket

TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x01, 0x02, 0x04, 0x10
HELD = Verdict("held")  # a fragment kept until its datagram is whole: nothing to send yet
ICMP_ERROR_RATE, ICMP_ERROR_BURST = 100.0, 100  # time-exceeded answers a second, and their burst


class NatTable(IcmpAnswers):
    """The decisions, over the mappings in `store`, and each VPC's policy with the indexes a packet is looked up in
    across VPCs, kept per VPC: a change to one tenant's rules costs that tenant."""

    def __init__(self, config: NatConfig, store: FlowStore | None = None) -> None:
        self.settings: NatSettings = config.settings()
        self.store: FlowStore = store if store is not None else DictStore()
        self.store.configure(self.settings)
        self.vpcs: dict[int, VpcNat] = {}
        self.count: Counter[str] = Counter()  # what it decided (`counters`: with what a native table did alone)
        self.icmp_limit = TokenBucket(ICMP_ERROR_RATE, ICMP_ERROR_BURST, 0.0)  # the ICMP errors it answers with
        self.reassembly = Reassembler(self.count)
        self.index = PolicyIndex()
        self.vpcs, self.static_in, self.static_out = self.index.vpcs, self.index.static_in, self.index.static_out
        self.dnat, self.dnat_rev, self.served = self.index.dnat, self.index.dnat_rev, self.index.served
        for v in config.vpcs:
            self.update_vpc(v.vni, v)

    def mtu_of(self, vni: int) -> int:
        v = self.vpcs.get(vni)
        return v.mtu if v is not None and v.mtu else self.settings.mtu

    def update_vpc(self, vni: int, policy: VpcNat | None) -> list[Mapping]:
        """VPC `vni`'s policy, replaced (None: gone). A mapping stays only while a rule still gives its internal
        address that EIP: flows the change does not concern are untouched, and a released EIP handed to someone
        else starts clean. Only this VPC's mappings are looked at, and only if its SNAT rules changed. Returns the
        mappings removed."""
        old = self.index.replace(vni, policy)
        if (old.snat if old else ()) == (policy.snat if policy else ()):
            return []
        rules = policy.snat if policy else ()
        gone = [m for m in self.store.mappings(vni)
                if not any(r.covers(m.vni, m.ip) and m.eip in r.eips for r in rules)]
        for m in gone:
            self.store.delete(m, m.last + TCP_PORT_HOLD if m.proto == PROTO_TCP else 0.0)
        return gone

    def update_config(self, config: NatConfig) -> list[Mapping]:
        """A whole config: its settings, and the policies of the VPCs that differ (`update_vpc`)."""
        self.settings = config.settings()
        self.store.configure(self.settings)
        return [m for vni, policy in changed_vpcs(self.vpcs, config) for m in self.update_vpc(vni, policy)]

    @property
    def counters(self) -> Counter[str]:
        return self.count

    def expire(self, now: float) -> int:
        """The store's expiry (its timeouts are the settings'); how many mappings went."""
        n = self.store.expire(now)
        self.count["expired"] += n
        return n

    # --- helpers -------------------------------------------------------------------------------------------

    def _pick_eip(self, vni: int, ip: int) -> int | None:
        v = self.vpcs.get(vni)
        for r in v.snat if v is not None else ():  # the VPC's own rules, in config order
            if r.covers(vni, ip) and r.eips:
                return r.eips[(ip * 2654435761) % len(r.eips)]  # paired: a function of the internal address
        return None

    def _new_mapping(self, vni: int, ip: int, port: int, proto: int, now: float, peer: tuple[int, int],
                     closing: bool) -> Mapping | None:
        """A mapping for an internal endpoint that has none, with its first peer: its rule's EIP and a free port;
        None (counted)."""
        eip = self._pick_eip(vni, ip)
        if eip is None:
            self.count["drop_no_rule"] += 1
            return None
        got = self.store.create(Mapping(vni, ip, port, proto, eip, 0, now, [peer], False, closing), now)
        if isinstance(got, int):
            self.count["port_exhausted" if got == NO_PORT else "table_full"] += 1
            return None
        self.count["mappings_created"] += 1
        return got

    @staticmethod
    def _tcp_flags(buf: bytes | bytearray, ip: Ip4) -> int:
        return buf[ip.l4 + 13] if ip.proto == PROTO_TCP else 0

    # --- translation ---------------------------------------------------------------------------------------
    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None:
        """A packet from VPC `vni` towards the internet, translated in place; None: drop (counted)."""
        ip = parse_ip4(buf)
        if ip is None:
            self.count["drop_malformed"] += 1
            return None
        if ip.is_fragment and (ip := self._reassembled(vni, buf, ip, now)) is None:
            return HELD
        if buf[ip.l4 - ip.ihl + 8] <= 1:
            return self._time_exceeded(buf, ip, now, self._eip_of(vni, ip.src), Verdict("in", vni, ip.src))
        ports = l4_ports(buf, ip)
        if ports is None:
            self.count["drop_unsupported"] += 1
            return None
        if ip.total > self.settings.external_mtu and buf[ip.l4 - ip.ihl + 6] & 0x40 and ip.dst not in self.served:
            return self._frag_needed_out(vni, buf, ip, now)
        sport, dport = ports
        if (static := self.static_in.get((vni, ip.src))) is not None:
            rewrite_addr(buf, ip, src=static)
        elif (rev := self.dnat_rev.get((vni, ip.src, sport, ip.proto))) is not None:
            rewrite_addr(buf, ip, src=rev.eip)
            rewrite_port(buf, ip, src=rev.port)
        else:
            peer = (ip.dst, dport if ip.proto != PROTO_ICMP else 0)
            closing = bool(self._tcp_flags(buf, ip) & (TCP_FIN | TCP_RST))
            m = self.store.find_in(vni, ip.src, sport, ip.proto)
            if m is None:
                if (m := self._new_mapping(vni, ip.src, sport, ip.proto, now, peer, closing)) is None:
                    return None
            else:
                m.last = now
                if add_peer(m, peer):
                    self.count["peers_replaced"] += 1
                m.tcp_closing |= closing
                self.store.put(m)
            rewrite_addr(buf, ip, src=m.eip)
            rewrite_port(buf, ip, src=m.eport)
        self.count["out"] += 1
        if ip.dst in self.served:  # hairpin: straight back in (one hop: inbound takes the TTL down)
            self.count["hairpin"] += 1
            return self.inbound(buf, now, hairpin=True)
        dec_ttl(buf, ip)
        if ip.total > self.settings.external_mtu:  # from a VPC with a larger MTU, without DF: cut to fit
            self.count["fragmented_out"] += 1
            return Verdict("out", fragments=fragment(bytes(buf[:ip.total]), self.settings.external_mtu))
        return Verdict("out")

    def inbound(self, buf: bytearray, now: float, hairpin: bool = False) -> Verdict | None:
        """A packet from the internet to an EIP, translated in place; None: drop (counted). One bigger than the
        VPCs' MTU is fragmented to fit, or, with DF set, answered with fragmentation needed (RFC 1191)."""
        head = bytes(buf[:68])  # the header (60 at most) and 8 bytes, as received: what an ICMP error quotes
        v = self._inbound(buf, now, hairpin)
        if v is None or v.direction != "in" or len(buf) <= (mtu := self.mtu_of(v.vni)):
            return v
        ip = parse_ip4(buf)
        if ip is None or ip.total <= mtu:
            return v
        if struct.unpack_from("!H", buf, 6)[0] & 0x4000:  # DF
            return self._icmp_error(buf, head, ICMP_UNREACH, 4, struct.pack("!HH", 0, mtu), now, "frag_needed")
        self.count["fragmented"] += 1
        return Verdict("in", v.vni, v.ip, fragment(bytes(buf[:ip.total]), mtu))

    def _inbound(self, buf: bytearray, now: float, hairpin: bool) -> Verdict | None:
        ip = parse_ip4(buf)
        if ip is None:
            self.count["drop_malformed"] += 1
            return None
        if ip.dst not in self.served:
            self.count["drop_not_ours"] += 1
            return None
        if ip.is_fragment and (ip := self._reassembled(0, buf, ip, now)) is None:
            return HELD
        if not hairpin and buf[ip.l4 - ip.ihl + 8] <= 1:  # (a hairpinned packet's TTL was checked on its way out)
            return self._time_exceeded(buf, ip, now, ip.dst, Verdict("out"))
        if (st := self.static_out.get(ip.dst)) is not None:
            vni, internal = st
            rewrite_addr(buf, ip, dst=internal)
            dec_ttl(buf, ip)
            self.count["in"] += 1
            return Verdict("in", vni, internal)
        if ip.proto == PROTO_ICMP and len(buf) > ip.l4 and buf[ip.l4] in (ICMP_UNREACH, ICMP_TIME_EXCEEDED):
            v = self._icmp_error_in(buf, ip)
            if v is not None:
                dec_ttl(buf, ip)
            return v
        ports = l4_ports(buf, ip)
        if ports is None:
            self.count["drop_unsupported"] += 1
            return None
        sport, dport = ports
        if ip.proto == PROTO_ICMP and buf[ip.l4] == ICMP_ECHO and not hairpin:
            self.count["drop_unsolicited"] += 1  # pings to a shared EIP are not forwarded inside
            return None
        if (d := self.dnat.get((ip.dst, ip.proto, dport))) is not None and ip.proto != PROTO_ICMP:
            rewrite_addr(buf, ip, dst=d.ip)
            rewrite_port(buf, ip, dst=d.iport)
            dec_ttl(buf, ip)
            self.count["in"] += 1
            return Verdict("in", d.vni, d.ip)
        return self._to_mapping(buf, ip, now, sport, dport)

    def _to_mapping(self, buf: bytearray, ip: Ip4, now: float, sport: int, dport: int) -> Verdict | None:
        """An inbound packet to a dynamic mapping, through its filter."""
        m = self.store.find_out(ip.dst, dport, ip.proto)
        if m is None:
            self.count["drop_no_mapping"] += 1
            return None
        # filtering applies to hairpinned packets too (RFC 4787, REQ-9 and section 6): they arrive from the
        # sender's external endpoint, and a VM receives from its neighbour's mapping only what it would receive
        # from that endpoint on the internet, i.e. after sending to it
        peer = (ip.src, sport if ip.proto != PROTO_ICMP else 0)
        if peer not in m.peers:
            self.count["drop_filtered"] += 1
            return None
        m.last = now
        flags = self._tcp_flags(buf, ip)
        if flags & (TCP_FIN | TCP_RST):
            m.tcp_closing = True
        elif flags & TCP_ACK:
            m.tcp_established = True
        self.store.put(m)
        rewrite_addr(buf, ip, dst=m.ip)
        if ip.proto == PROTO_ICMP:
            rewrite_port(buf, ip, src=m.port)  # the echo identifier
        else:
            rewrite_port(buf, ip, dst=m.port)
        dec_ttl(buf, ip)
        self.count["in"] += 1
        return Verdict("in", m.vni, m.ip)

    def _reassembled(self, scope: int, buf: bytearray, ip: Ip4, now: float) -> Ip4 | None:
        """A fragment: held until its datagram is whole, then `buf` becomes the whole datagram (its header parsed)."""
        whole = self.reassembly.add(scope, buf, ip, now)
        if whole is None:
            return None
        buf[:] = whole
        return parse_ip4(buf)

    def _icmp_error_in(self, buf: bytearray, ip: Ip4) -> Verdict | None:
        """An ICMP error about a packet we sent out: find its mapping from the embedded header, rewrite the
        embedded source back to the internal endpoint, then the outer destination (RFC 5508)."""
        inner_off = ip.l4 + 8
        inner = parse_inner(buf, inner_off)
        if inner is None or inner.src != ip.dst:
            self.count["drop_malformed"] += 1
            return None
        if len(buf) < inner.l4 + 8:
            self.count["drop_malformed"] += 1
            return None
        if inner.proto in (PROTO_TCP, PROTO_UDP):
            sport = struct.unpack_from("!H", buf, inner.l4)[0]
        elif inner.proto == PROTO_ICMP and buf[inner.l4] == ICMP_ECHO:
            sport = struct.unpack_from("!H", buf, inner.l4 + 4)[0]
        else:
            self.count["drop_unsupported"] += 1
            return None
        m = self.store.find_out(inner.src, sport, inner.proto)
        if m is None:
            self.count["drop_no_mapping"] += 1
            return None
        # embedded header: source address and port back to the internal endpoint, its IP checksum recomputed
        struct.pack_into("!I", buf, inner.l4 - inner.ihl + 12, m.ip)
        struct.pack_into("!H", buf, inner.l4 - inner.ihl + 10, 0)
        struct.pack_into("!H", buf, inner.l4 - inner.ihl + 10, checksum(bytes(buf[inner.l4 - inner.ihl:inner.l4])))
        if inner.proto == PROTO_ICMP:
            struct.pack_into("!H", buf, inner.l4 + 4, m.port)
        else:
            struct.pack_into("!H", buf, inner.l4, m.port)
        # the whole ICMP message's checksum, then the outer destination
        end = ip.l4 - ip.ihl + ip.total
        struct.pack_into("!H", buf, ip.l4 + 2, 0)
        struct.pack_into("!H", buf, ip.l4 + 2, checksum(bytes(buf[ip.l4:end])))
        rewrite_addr(buf, ip, dst=m.ip)
        self.count["in_icmp_error"] += 1
        return Verdict("in", m.vni, m.ip)


__all__ = ["ICMP_ECHO_REPLY", "TCP_PORT_HOLD", "Mapping", "NatConfig", "NatTable", "SnatRule", "Timeouts", "Verdict",
           "ip2int"]
