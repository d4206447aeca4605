"""The service endpoint's translation semantics, the pure-Python reference (the instance's packet stage).

A VM's packet to an endpoint (its address in the VM's subnet, VNI `vni`) on one of the service's ports leaves for
one of the service's addresses, from the endpoint's own address on the service network and a port of it (the VM's
own port when it is free there): the service tells endpoints, hence tenants, apart by source address, and its
replies come back to the one mapping that undoes both translations. Identical VM addresses in two VPCs are two
endpoints, two sources.

* Admission: only to an endpoint served here, only its service's (protocol, port)s, only what the endpoint's
  ingress security-group rules allow (a port's rules, enforced where the endpoint lives). A connection is
  admitted once; its packets then follow the mapping both ways. A VPC without an endpoint sends nothing here, and
  nothing else on the service network is reachable from a VPC. A VM of a VPC peered with the endpoint's reaches it
  too (its vSwitch tunnels with the endpoint VPC's VNI, as distributed peering does; its replies go back in its
  own VPC's VNI), when the endpoint's rules admit its address, as a port's would.
* ICMP echo to the endpoint's address is answered here (the endpoint is a host in the subnet); ICMP errors from
  the service about a connection's packet go back to its VM, quoting what the VM sent.
* A routing hop: TTL - 1 both ways, an expired packet dropped and counted.
* Sizes: what is bigger than the other side's MTU is fragmented, or with DF answered with fragmentation needed.
* PROXY protocol v2 (proxy_protocol.py) where the service asks for it: a TCP connection must begin here (its SYN),
  SACK is not offered to the service and the VM's MSS leaves room for the header; every UDP datagram to the service
  carries the header in front of its payload.
* Timeouts: TCP established 3600 s, TCP opening or closing 120 s, UDP 120 s.

The connections live in a `ConnStore` (conns.py): dicts here by default, C for those it carries on a native data
plane. This module decides; the store holds and expires.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterator

from nfv_gateways.core.packet import (
    ICMP_ECHO,
    ICMP_ECHO_REPLY,
    PROTO_ICMP,
    PROTO_TCP,
    PROTO_UDP,
    Ip4,
    Verdict,
    dec_ttl,
    fragment,
    l4_ports,
    parse_inner,
    parse_ip4,
    rewrite_addr,
    rewrite_port,
    set_ip_checksum,
    set_l4_checksum,
)
from nfv_gateways.roles.service import proxy_protocol as pp
from nfv_gateways.roles.service.conns import Conn, ConnStore, DictConns
from nfv_gateways.roles.service.policy import EndpointPolicy
from tianji.inet import checksum, icmp_error

TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x01, 0x02, 0x04, 0x10
ERRORS = (3, 11)  # ICMP destination unreachable, time exceeded: translated back to the VM
SEQ = 1 << 32
SERVICE_MTU = 1500  # the service network's
FIRST_PORT = 1024  # below it a VM's port is moved: the service may treat privileged sources apart


def carries(ep: EndpointPolicy, c: Conn) -> bool:
    """Whether endpoint `ep` (a new version of the one `c` was made through) carries `c` unchanged: the same
    addresses on both sides, the service's address and port still served, the same framing."""
    old = c.ep
    return (ep.vni, ep.ip, ep.source, ep.via_vni, ep.mtu, ep.proxy_protocol, ep.peers) == \
        (old.vni, old.ip, old.source, old.via_vni, old.mtu, old.proxy_protocol, old.peers) and \
        c.svc in ep.addresses and ep.serves(c.proto, c.port)


class ServiceTable:
    """The endpoints served here by (VNI, address), and the connections through them."""

    def __init__(self, store: ConnStore | None = None) -> None:
        self.endpoints: dict[tuple[int, int], EndpointPolicy] = {}
        self.sides: dict[tuple[int, int], EndpointPolicy] = {}  # (VNI, provider port's address): a published LB's
        self.by_vni: dict[int, tuple[EndpointPolicy, ...]] = {}
        self.conns: ConnStore = store if store is not None else DictConns()
        self.counters: Counter[str] = Counter()

    # --- policy ------------------------------------------------------------------------------------------------
    def update_vpc(self, vni: int, eps: tuple[EndpointPolicy, ...] | None) -> None:
        """One VPC's endpoints replaced. A connection stays while its endpoint still carries it the same way (a
        change of its groups' rules or members alone, as a new port in them makes, keeps what is established, as
        the vSwitch's conntrack does); the connections of an endpoint that went or moved end."""
        held = self.conns.conns(vni) if vni in self.by_vni else []  # with the endpoints they were made through
        for e in self.by_vni.pop(vni, ()):
            self.endpoints.pop((e.vni, e.ip), None)
            if e.via_vni:
                self.sides.pop((e.via_vni, e.source), None)
        now = {e.id: e for e in eps or ()}
        if eps:
            self.by_vni[vni] = eps
            self.endpoints.update(((e.vni, e.ip), e) for e in eps)
            self.sides.update(((e.via_vni, e.source), e) for e in eps if e.via_vni)
        for c in held:
            new = now.get(c.ep.id)
            if new is None or not carries(new, c):
                self.conns.drop(c)
            else:
                c.ep = new  # the store's own object (C's records name the endpoint by its VNI and address)

    # --- packets -----------------------------------------------------------------------------------------------
    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None:
        """A VM's packet (the IP packet of a VXLAN frame of VNI `vni`) to an endpoint."""
        ip = parse_ip4(buf)
        if ip is None or ip.is_fragment:
            self.counters["drop_malformed" if ip is None else "drop_fragment"] += 1
            return None
        ep = self.endpoints.get((vni, ip.dst))
        if ep is None:
            if (vni, ip.dst) in self.sides:  # a published load balancer's member answering, from its VPC
                return self._reply(buf, ip, now, vni)
            self.counters["drop_no_endpoint"] += 1
            return None
        if ip.proto == PROTO_ICMP:
            return self._echo(vni, buf, ip, ep)
        ports = l4_ports(buf, ip)
        if ip.proto == PROTO_TCP and not _tcp_whole(buf, ip):
            self.counters["drop_malformed"] += 1
            return None
        if ports is None or not ep.serves(ip.proto, ports[1]):
            self.counters["drop_port"] += 1
            return None
        c = self.conns.find_in((vni, ip.src, ports[0], ip.proto, ip.dst, ports[1]))
        flags = buf[ip.l4 + 13] if ip.proto == PROTO_TCP else 0
        if c is None:
            if (c := self._admit(ep, buf, ip, ports, flags, now)) is None:
                return None
        else:
            c.last = now
            self._track(c, flags, from_vm=True)
            self.conns.put(c)
        if not dec_ttl(buf, ip):
            return self._expired()
        if ip.total > SERVICE_MTU and _df(buf, ip):  # the VM learns the service network's MTU
            return self._frag_needed(buf, ep.ip, SERVICE_MTU, Verdict("in", c.back, ip.src))
        rewrite_addr(buf, ip, src=ep.source, dst=c.svc)
        rewrite_port(buf, ip, src=c.sport)
        if c.pp is not None and ip.proto == PROTO_TCP:
            self._splice_out(c, buf, ip, flags)
        elif c.pp is not None:
            pp.prefix_datagram(buf, ip, c.pp)
            self.counters["proxy_headers"] += 1
        self.counters["out"] += 1
        if ep.via_vni:  # into the provider's VPC, to its VIP
            return Verdict("in", ep.via_vni, c.svc, self._cut(buf, ip, ep.mtu))
        return Verdict("out", fragments=self._cut(buf, ip, SERVICE_MTU))

    def inbound(self, buf: bytearray, now: float) -> Verdict | None:
        """A packet from the service network: a reply of a connection through an endpoint, or nothing."""
        ip = parse_ip4(buf)
        if ip is None or ip.is_fragment:
            self.counters["drop_malformed_in" if ip is None else "drop_fragment_in"] += 1
            return None
        return self._reply(buf, ip, now)

    def _reply(self, buf: bytearray, ip: Ip4, now: float, via: int = 0) -> Verdict | None:
        """The service's answer (from the service network, or a published load balancer's VPC), back to the VM."""
        if ip.proto == PROTO_ICMP:
            return self._icmp_error(buf, ip, via)
        ports = l4_ports(buf, ip)
        if ip.proto == PROTO_TCP and not _tcp_whole(buf, ip):
            ports = None
        c = self.conns.find_out((via, ip.proto, ip.src, ports[0], ip.dst, ports[1])) if ports else None
        if c is None:
            self.counters["drop_no_connection"] += 1
            return None
        c.last = now
        flags = buf[ip.l4 + 13] if ip.proto == PROTO_TCP else 0
        self._track(c, flags, from_vm=False)
        self.conns.put(c)
        if not dec_ttl(buf, ip):
            return self._expired()
        if ip.total > c.ep.mtu and _df(buf, ip):  # the service learns the VPC's MTU
            back = Verdict("in", c.ep.via_vni, ip.src) if c.ep.via_vni else Verdict("out")
            return self._frag_needed(buf, c.ep.source, c.ep.mtu, back)
        rewrite_addr(buf, ip, src=c.ep.ip, dst=c.vm)
        rewrite_port(buf, ip, dst=c.vm_port)
        if c.pp is not None and ip.proto == PROTO_TCP:
            self._splice_in(c, buf, ip, flags)
        self.counters["in"] += 1
        return Verdict("in", c.back, c.vm, self._cut(buf, ip, c.ep.mtu))

    def _icmp_error(self, buf: bytearray, ip: Ip4, via: int) -> Verdict | None:
        """An ICMP error about a connection's packet (port unreachable, fragmentation needed, time exceeded on the
        way to the service) back to its VM, from the endpoint, with the quoted header made the VM's own again."""
        end = ip.l4 - ip.ihl + ip.total
        inner = parse_inner(buf, ip.l4 + 8) if end - ip.l4 >= 8 + 28 and buf[ip.l4] in ERRORS else None
        quoted = struct.unpack_from("!HH", buf, inner.l4) if inner is not None and inner.l4 + 4 <= end else None
        c = self.conns.find_out((via, inner.proto, inner.dst, quoted[1], inner.src, quoted[0])) \
            if inner is not None and quoted is not None else None
        if c is None or not dec_ttl(buf, ip):
            self.counters["drop_icmp_in"] += 1
            return None
        q = inner.l4 - inner.ihl  # the quoted header: from the VM's address and port, to the endpoint's
        struct.pack_into("!HII", buf, q + 10, 0, c.vm, c.ep.ip)
        struct.pack_into("!H", buf, q + 10, checksum(bytes(buf[q:q + inner.ihl])))
        struct.pack_into("!H", buf, inner.l4, c.vm_port)
        rewrite_addr(buf, ip, src=c.ep.ip, dst=c.vm)
        struct.pack_into("!H", buf, ip.l4 + 2, 0)
        struct.pack_into("!H", buf, ip.l4 + 2, checksum(bytes(buf[ip.l4:end])))
        self.counters["icmp_errors_in"] += 1
        return Verdict("in", c.back, c.vm)

    def expire(self, now: float) -> int:
        """The store's expiry (conns.py's timeouts); how many connections went."""
        return self.conns.expire(now)

    # --- parts -------------------------------------------------------------------------------------------------
    def _admit(self, ep: EndpointPolicy, buf: bytearray, ip: Ip4, ports: tuple[int, int], flags: int,
               now: float) -> Conn | None:
        vm_port, port = ports
        syn = flags & (TCP_SYN | TCP_ACK) == TCP_SYN
        if ip.proto == PROTO_TCP and ep.proxy_protocol and not syn:
            self.counters["drop_not_syn"] += 1  # the header must be the stream's first bytes
            return None
        if not ep.admits(ip.proto, ip.src, port):
            self.counters["drop_security_group"] += 1
            return None
        svc = ep.addresses[hash((ep.vni, ip.src, vm_port)) % len(ep.addresses)]
        c = Conn(ep, ip.src, vm_port, ip.proto, port, svc, 0, now, back=ep.back_vni(ip.src))
        self._track(c, flags, from_vm=True)
        if ep.proxy_protocol and ip.proto == PROTO_TCP:
            c.pp = pp.header(ip.src, vm_port, ep.ip, port, ep.id)
            c.isn = struct.unpack_from("!I", buf, ip.l4 + 4)[0]
        elif ep.proxy_protocol and ip.proto == PROTO_UDP:
            c.pp = pp.header(ip.src, vm_port, ep.ip, port, ep.id, pp.DGRAM)
        for c.sport in _ports(ip.src, vm_port, ip.proto):  # the first its outside key is free for
            if self.conns.add(c):
                self.counters["connections"] += 1
                return c
        self.counters["port_exhausted"] += 1
        return None

    @staticmethod
    def _track(c: Conn, flags: int, from_vm: bool) -> None:
        """A TCP connection's state from its flags (native/dp_svc.c's track() is the same)."""
        if flags & (TCP_FIN | TCP_RST):
            c.closing = True
        elif from_vm and flags & TCP_ACK and not flags & TCP_SYN:
            c.established = True

    def _echo(self, vni: int, buf: bytearray, ip: Ip4, ep: EndpointPolicy) -> Verdict | None:
        """The endpoint answers ping like a host of the subnet."""
        end = ip.l4 - ip.ihl + ip.total
        if end - ip.l4 < 8 or buf[ip.l4] != ICMP_ECHO or not ep.admits(PROTO_ICMP, ip.src, 0):
            self.counters["drop_icmp"] += 1
            return None
        vm = ip.src
        buf[ip.l4] = ICMP_ECHO_REPLY
        struct.pack_into("!H", buf, ip.l4 + 2, 0)
        struct.pack_into("!H", buf, ip.l4 + 2, checksum(bytes(buf[ip.l4:end])))
        rewrite_addr(buf, ip, src=ep.ip, dst=vm)
        self.counters["echo_answered"] += 1
        return Verdict("in", ep.back_vni(vm), vm)

    def _frag_needed(self, buf: bytearray, src: int, mtu: int, to: Verdict) -> Verdict:
        """Fragmentation needed, from `src`, about the packet in `buf` (replaced by the answer), sent `to`."""
        self.counters["frag_needed"] += 1
        buf[:] = icmp_error(bytes(buf), 3, 4, src, struct.pack("!HH", 0, mtu))
        return to

    def _cut(self, buf: bytearray, ip: Ip4, mtu: int) -> tuple[bytes, ...]:
        """The packet's fragments when it is bigger than `mtu` (no DF), else nothing (sent whole)."""
        if ip.total <= mtu:
            return ()
        self.counters["fragmented"] += 1
        return fragment(bytes(buf[:ip.l4 - ip.ihl + ip.total]), mtu)

    def _expired(self) -> None:
        self.counters["drop_ttl"] += 1
        return None

    # --- PROXY v2 in the VM's stream ---------------------------------------------------------------------------
    def _splice_out(self, c: Conn, buf: bytearray, ip: Ip4, flags: int) -> None:
        """The VM's segment with the header in front of its first byte, or its sequence number moved past it."""
        assert c.pp is not None
        l4, end = ip.l4, ip.l4 - ip.ihl + ip.total
        if flags & TCP_SYN:
            pp.strip_sack_permitted(buf, l4)
            set_l4_checksum(buf, ip)
            return
        seq = struct.unpack_from("!I", buf, l4 + 4)[0]
        if seq == (c.isn + 1) % SEQ and not c.header_acked:
            payload = l4 + (buf[l4 + 12] >> 4) * 4
            buf[:] = buf[:payload] + c.pp + buf[payload:end]
            ip.total += len(c.pp)
            struct.pack_into("!H", buf, ip.l4 - ip.ihl + 2, ip.total)
            self.counters["proxy_headers"] += 1
        else:
            struct.pack_into("!I", buf, l4 + 4, (seq + len(c.pp)) % SEQ)
        set_ip_checksum(buf, ip)
        set_l4_checksum(buf, ip)

    def _splice_in(self, c: Conn, buf: bytearray, ip: Ip4, flags: int) -> None:
        """The service's acknowledgement moved back below the header; its SYN's MSS lowered to leave room for it."""
        assert c.pp is not None
        l4 = ip.l4
        if flags & TCP_SYN:
            pp.clamp_mss(buf, l4, c.ep.mtu - 40 - len(c.pp))
        if flags & TCP_ACK:
            ack = struct.unpack_from("!I", buf, l4 + 8)[0]
            past = (ack - c.isn - 1) % SEQ
            if past < 1 << 31 and past >= len(c.pp):
                c.header_acked = True
                ack = (ack - len(c.pp)) % SEQ
            elif past < 1 << 31:
                ack = (c.isn + 1) % SEQ  # the header only partly acknowledged: none of the VM's bytes yet
            struct.pack_into("!I", buf, l4 + 8, ack)
        set_l4_checksum(buf, ip)


def _ports(vm: int, want: int, proto: int) -> Iterator[int]:
    """A new connection's source ports, in the order tried: the VM's own, else a sequence the connection's own
    numbers decide (any instance, a survivor after a failover or the C stage's twin in the tests, picks the same
    one for the same connection and the same table)."""
    if want >= FIRST_PORT:
        yield want
    span = 65536 - FIRST_PORT
    for i in range(64):
        yield FIRST_PORT + hash((vm, want, proto, i)) % span


def _tcp_whole(buf: bytearray, ip: Ip4) -> bool:
    """The TCP header's own length (options included) inside the packet: what the option walkers rely on."""
    end = ip.l4 - ip.ihl + ip.total
    return end - ip.l4 >= 20 and 20 <= (buf[ip.l4 + 12] >> 4) * 4 <= end - ip.l4


def _df(buf: bytearray, ip: Ip4) -> bool:
    return bool(buf[ip.l4 - ip.ihl + 6] & 0x40)


__all__ = ["Conn", "ServiceTable"]
