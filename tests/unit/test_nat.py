"""The NAT reference semantics on real packet bytes (built and checked with scapy)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPerror, UDPerror

from nfv_gateways.roles.nat.policy import DnatRule, NatConfig, SnatRule, StaticEip, Timeouts
from nfv_gateways.roles.nat.reference import TCP_PORT_HOLD, NatTable, ip2int

VNI, VNI_B = 1001, 2002
EIP1, EIP2, EIP_STATIC, EIP_DNAT = (ip2int(f"203.0.113.{n}") for n in (1, 2, 10, 20))
REMOTE, REMOTE2 = "198.51.100.7", "198.51.100.8"


def table(**kw) -> NatTable:
    cfg = NatConfig.of(
        snat=(SnatRule(VNI, "10.0.0.0/16", (EIP1, EIP2)), SnatRule(VNI_B, "10.0.0.0/16", (EIP2,))),
        static=(StaticEip(VNI, ip2int("10.0.9.9"), EIP_STATIC),),
        dnat=(DnatRule(EIP_DNAT, 6, 8443, VNI, ip2int("10.0.1.5"), 443),), **kw)
    return NatTable(cfg)


def b(pkt) -> bytearray:
    return bytearray(bytes(pkt))


def checksums_ok(buf: bytes) -> bool:
    """scapy recomputes every checksum; the bytes must not change."""
    p = IP(bytes(buf))
    fresh = p.copy()
    del fresh[IP].chksum
    for layer in (TCP, UDP, ICMP):
        if layer in fresh:
            del fresh[layer].chksum
    return bytes(IP(bytes(fresh))) == bytes(buf)


def test_udp_endpoint_independent_mapping_and_paired_pooling() -> None:
    t = table()
    out1 = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=5000, dport=53) / b"q")
    out2 = b(IP(src="10.0.1.2", dst=REMOTE2) / UDP(sport=5000, dport=99) / b"q")
    assert t.outbound(VNI, out1, 0).direction == "out"
    assert t.outbound(VNI, out2, 1).direction == "out"
    p1, p2 = IP(bytes(out1)), IP(bytes(out2))
    assert (p1.src, p1[UDP].sport) == (p2.src, p2[UDP].sport)  # same public endpoint for both destinations
    assert p1.src in ("203.0.113.1", "203.0.113.2") and checksums_ok(out1)
    other = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=6000, dport=53))
    t.outbound(VNI, other, 2)
    assert IP(bytes(other)).src == p1.src  # paired: the same internal address keeps its EIP
    # the reply comes back to the internal endpoint
    reply = b(IP(src=REMOTE, dst=p1.src) / UDP(sport=53, dport=p1[UDP].sport) / b"a")
    v = t.inbound(reply, 3)
    assert (v.direction, v.vni, v.ip) == ("in", VNI, ip2int("10.0.1.2"))
    r = IP(bytes(reply))
    assert (r.dst, r[UDP].dport) == ("10.0.1.2", 5000) and checksums_ok(reply)


def test_filtering_is_address_and_port_dependent() -> None:
    t = table()
    out = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=5000, dport=53))
    t.outbound(VNI, out, 0)
    pub = IP(bytes(out))
    stranger = b(IP(src=REMOTE2, dst=pub.src) / UDP(sport=53, dport=pub[UDP].sport))
    assert t.inbound(stranger, 1) is None and t.counters["drop_filtered"] == 1
    wrong_port = b(IP(src=REMOTE, dst=pub.src) / UDP(sport=54, dport=pub[UDP].sport))
    assert t.inbound(wrong_port, 1) is None


def test_tenants_with_identical_ips_get_distinct_mappings() -> None:
    t = table()
    a = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=5000, dport=53))
    c = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=5000, dport=53))
    t.outbound(VNI, a, 0)
    t.outbound(VNI_B, c, 0)
    pa, pc = IP(bytes(a)), IP(bytes(c))
    assert (pa.src, pa[UDP].sport) != (pc.src, pc[UDP].sport)
    back_c = b(IP(src=REMOTE, dst=pc.src) / UDP(sport=53, dport=pc[UDP].sport))
    assert t.inbound(back_c, 1).vni == VNI_B


def test_tcp_icmp_echo_static_and_dnat() -> None:
    t = table()
    syn = b(IP(src="10.0.1.3", dst=REMOTE) / TCP(sport=40000, dport=80, flags="S"))
    t.outbound(VNI, syn, 0)
    s = IP(bytes(syn))
    assert checksums_ok(syn)
    synack = b(IP(src=REMOTE, dst=s.src) / TCP(sport=80, dport=s[TCP].sport, flags="SA"))
    assert t.inbound(synack, 0.1).ip == ip2int("10.0.1.3")
    assert IP(bytes(synack))[TCP].dport == 40000 and checksums_ok(synack)
    echo = b(IP(src="10.0.1.3", dst=REMOTE) / ICMP(type=8, id=777, seq=1))
    t.outbound(VNI, echo, 0)
    e = IP(bytes(echo))
    reply = b(IP(src=REMOTE, dst=e.src) / ICMP(type=0, id=e[ICMP].id, seq=1))
    assert t.inbound(reply, 0.2).ip == ip2int("10.0.1.3")
    assert IP(bytes(reply))[ICMP].id == 777 and checksums_ok(reply)
    # 1:1 EIP: outbound leaves with it, inbound reaches the VM from anywhere
    st_out = b(IP(src="10.0.9.9", dst=REMOTE) / TCP(sport=1234, dport=22))
    t.outbound(VNI, st_out, 0)
    assert IP(bytes(st_out)).src == "203.0.113.10" and IP(bytes(st_out))[TCP].sport == 1234
    st_in = b(IP(src=REMOTE2, dst="203.0.113.10") / TCP(sport=999, dport=22, flags="S"))
    assert t.inbound(st_in, 0).ip == ip2int("10.0.9.9")
    # DNAT: EIP:8443 -> 10.0.1.5:443, and the reply leaves from EIP:8443
    d = b(IP(src=REMOTE2, dst="203.0.113.20") / TCP(sport=5555, dport=8443, flags="S"))
    v = t.inbound(d, 0)
    assert (v.ip, IP(bytes(d))[TCP].dport) == (ip2int("10.0.1.5"), 443) and checksums_ok(d)
    r = b(IP(src="10.0.1.5", dst=REMOTE2) / TCP(sport=443, dport=5555, flags="SA"))
    t.outbound(VNI, r, 0)
    assert (IP(bytes(r)).src, IP(bytes(r))[TCP].sport) == ("203.0.113.20", 8443)


def test_hairpinning() -> None:
    t = table()
    # VM 10.0.1.2 reaches the 1:1 EIP of 10.0.9.9 from inside the same VPC
    pkt = b(IP(src="10.0.1.2", dst="203.0.113.10") / TCP(sport=4000, dport=80, flags="S"))
    v = t.outbound(VNI, pkt, 0)
    assert (v.direction, v.vni, v.ip) == ("in", VNI, ip2int("10.0.9.9"))
    p = IP(bytes(pkt))
    assert p.dst == "10.0.9.9" and p.src in ("203.0.113.1", "203.0.113.2") and checksums_ok(pkt)


def test_hairpinned_packets_are_filtered_like_external_ones() -> None:
    """RFC 4787: a hairpinned packet comes from the sender's external endpoint and meets the receiver's mapping's
    filter: B gets A's datagrams only once B has sent to A's external endpoint (hole punching through the NAT)."""
    t = table()
    out_a = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=5000, dport=3478))
    out_b = b(IP(src="10.0.1.3", dst=REMOTE) / UDP(sport=6000, dport=3478))
    t.outbound(VNI, out_a, 0)
    t.outbound(VNI, out_b, 0)
    a_pub, b_pub = IP(bytes(out_a)), IP(bytes(out_b))
    a_to_b = b(IP(src="10.0.1.2", dst=b_pub.src) / UDP(sport=5000, dport=b_pub[UDP].sport) / b"hi")
    assert t.outbound(VNI, a_to_b, 1) is None and t.counters["drop_filtered"] == 1  # B never sent to A
    # ... but A's attempt opened A's own filter to B's endpoint: B's answer arrives, and opens B's
    b_to_a = b(IP(src="10.0.1.3", dst=a_pub.src) / UDP(sport=6000, dport=a_pub[UDP].sport) / b"hi")
    v = t.outbound(VNI, b_to_a, 2)
    assert v is not None and (v.direction, v.ip) == ("in", ip2int("10.0.1.2"))
    a_to_b = b(IP(src="10.0.1.2", dst=b_pub.src) / UDP(sport=5000, dport=b_pub[UDP].sport) / b"hi")
    v = t.outbound(VNI, a_to_b, 3)  # both have sent to each other's endpoint: both ways open
    got = IP(bytes(a_to_b))
    assert v is not None and (v.direction, v.ip) == ("in", ip2int("10.0.1.3"))
    assert (got.src, got[UDP].sport, got.dst, got[UDP].dport) == (a_pub.src, a_pub[UDP].sport, "10.0.1.3", 6000)
    assert checksums_ok(a_to_b)


def test_icmp_errors_translated_back() -> None:
    t = table()
    out = b(IP(src="10.0.1.2", dst=REMOTE, ttl=2) / UDP(sport=33434, dport=33434) / b"x")  # ttl 1 ends here
    t.outbound(VNI, out, 0)
    o = IP(bytes(out))
    for icmp in (ICMP(type=3, code=3), ICMP(type=3, code=4, nexthopmtu=1400), ICMP(type=11, code=0)):
        err = b(IP(src="192.0.2.1", dst=o.src) / icmp / IPerror(bytes(out)[:28]))
        v = t.inbound(err, 1)
        assert v is not None and v.ip == ip2int("10.0.1.2")
        e = IP(bytes(err))
        assert e.dst == "10.0.1.2"
        inner = IP(bytes(err)[28:])
        assert inner.src == "10.0.1.2" and inner[UDP].sport == 33434
        assert checksums_ok(err)
    assert t.counters["in_icmp_error"] == 3


def test_a_hop_ttl_decremented_and_time_exceeded_when_it_runs_out() -> None:
    t = table()
    # forwarded: TTL - 1, checksums right, both ways and through 1:1 EIPs
    out = b(IP(src="10.0.1.2", dst=REMOTE, ttl=64) / UDP(sport=5353, dport=53) / b"q")
    assert t.outbound(VNI, out, 0).direction == "out"
    o = IP(bytes(out))
    assert o.ttl == 63 and checksums_ok(out)
    back = b(IP(src=REMOTE, dst=o.src, ttl=50) / UDP(sport=53, dport=o[UDP].sport) / b"a")
    assert t.inbound(back, 1).ip == ip2int("10.0.1.2") and IP(bytes(back)).ttl == 49 and checksums_ok(back)
    st = b(IP(src="10.0.9.9", dst=REMOTE, ttl=9) / TCP(sport=1, dport=2, flags="S"))
    t.outbound(VNI, st, 2)
    assert IP(bytes(st)).ttl == 8
    # a traceroute probe with TTL 1 from a VM: answered from the EIP the VM leaves with, back into its VPC
    probe = b(IP(src="10.0.1.2", dst=REMOTE, ttl=1) / UDP(sport=40000, dport=33434) / b"probe")
    v = t.outbound(VNI, probe, 3)
    assert (v.direction, v.vni, v.ip) == ("in", VNI, ip2int("10.0.1.2"))
    err = IP(bytes(probe))
    assert err.src in ("203.0.113.1", "203.0.113.2") and err.dst == "10.0.1.2" and err[ICMP].type == 11
    assert err[IPerror].dst == REMOTE and err[UDPerror].dport == 33434 and checksums_ok(probe)
    # from the internet to an EIP with TTL 1: answered from that EIP, out
    probe_in = b(IP(src=REMOTE, dst="203.0.113.10", ttl=1) / TCP(sport=7, dport=22, flags="S"))
    v = t.inbound(probe_in, 4)
    e = IP(bytes(probe_in))
    assert v.direction == "out" and (e.src, e.dst, e[ICMP].type) == ("203.0.113.10", REMOTE, 11)
    # never about an ICMP error, and rate-limited
    assert t.outbound(VNI, b(IP(src="10.0.1.2", dst=REMOTE, ttl=1) / ICMP(type=3) / (b"x" * 28)), 5) is None
    answered = sum(t.outbound(VNI, b(IP(src="10.0.1.2", dst=REMOTE, ttl=1) / UDP(sport=1, dport=2)), 6) is not None
                   for _ in range(500))
    assert 90 <= answered <= 101 and t.counters["drop_ttl_exceeded_rate"] >= 399


def test_datagrams_bigger_than_the_vpc_mtu_are_fragmented_or_refused() -> None:
    from scapy.layers.inet import defragment

    t = table()
    out = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=5000, dport=9000) / b"hi")
    t.outbound(VNI, out, 0)
    o = IP(bytes(out))
    payload = bytes(range(256)) * 6  # 1536 bytes: a 1564-byte datagram
    big = b(IP(src=REMOTE, dst=o.src, id=77) / UDP(sport=9000, dport=o[UDP].sport) / payload)
    v = t.inbound(big, 1)
    assert v.direction == "in" and v.ip == ip2int("10.0.1.2") and len(v.fragments) == 2
    frags = [IP(f) for f in v.fragments]
    assert all(len(f) <= 1450 for f in v.fragments) and [f.flags.MF for f in frags] == [1, 0]
    whole = defragment(frags)[0]
    assert whole.dst == "10.0.1.2" and whole[UDP].dport == 5000 and bytes(whole[UDP].payload) == payload
    assert t.counters["fragmented"] == 1
    # with DF: fragmentation needed, next-hop MTU 1450, from the EIP, quoting the datagram as it was sent
    df = b(IP(src=REMOTE, dst=o.src, flags="DF") / UDP(sport=9000, dport=o[UDP].sport) / payload)
    v = t.inbound(df, 2)
    e = IP(bytes(df))
    assert v.direction == "out" and (e.src, e.dst) == (o.src, REMOTE)
    assert (e[ICMP].type, e[ICMP].code, e[ICMP].nexthopmtu) == (3, 4, 1450) and checksums_ok(df)
    assert e[IPerror].dst == o.src and e[UDPerror].dport == o[UDP].sport and t.counters["frag_needed"] == 1
    # what fits passes whole; nothing unmapped is answered
    fits = b(IP(src=REMOTE, dst=o.src) / UDP(sport=9000, dport=o[UDP].sport) / (b"x" * 1400))
    assert t.inbound(fits, 3).fragments == ()
    stray = b(IP(src=REMOTE, dst=o.src, flags="DF") / UDP(sport=9000, dport=1) / payload)
    assert t.inbound(stray, 4) is None


def test_each_vpc_has_its_own_mtu() -> None:
    """A VPC with a 3,450-byte MTU (a larger underlay) takes a 3,000-byte datagram whole; its neighbour on the
    default 1450 gets it in fragments, or with DF is told 1450."""
    from nfv_gateways.roles.nat.policy import NatConfig

    cfg = NatConfig.of(snat=(SnatRule(VNI, "10.0.0.0/16", (EIP1,)), SnatRule(VNI_B, "10.0.0.0/16", (EIP2,))),
                    vpc_mtus=((VNI, 3450), (VNI_B, 1450)))
    t = NatTable(cfg)
    for vni in (VNI, VNI_B):
        t.outbound(vni, b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=5000, dport=9000) / b"hi"), 0)
    payload = b"y" * 3000
    jumbo = t.inbound(b(IP(src=REMOTE, dst="203.0.113.1") / UDP(sport=9000, dport=5000) / payload), 1)
    assert (jumbo.vni, jumbo.fragments) == (VNI, ())
    cut = t.inbound(b(IP(src=REMOTE, dst="203.0.113.2") / UDP(sport=9000, dport=5000) / payload), 2)
    assert cut.vni == VNI_B and len(cut.fragments) == 3 and all(len(f) <= 1450 for f in cut.fragments)
    df = b(IP(src=REMOTE, dst="203.0.113.2", flags="DF") / UDP(sport=9000, dport=5000) / payload)
    t.inbound(df, 3)
    assert IP(bytes(df))[ICMP].nexthopmtu == 1450


def test_timeouts_and_expiry() -> None:
    t = table(timeouts=Timeouts(udp=120, tcp_established=7440, tcp_transitory=240, icmp=60))
    u = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=1, dport=2))
    t.outbound(VNI, u, 0)
    assert t.expire(119) == 0 and t.expire(121) == 1
    syn = b(IP(src="10.0.1.2", dst=REMOTE) / TCP(sport=3, dport=4, flags="S"))
    t.outbound(VNI, syn, 0)
    s = IP(bytes(syn))
    t.inbound(b(IP(src=REMOTE, dst=s.src) / TCP(sport=4, dport=s[TCP].sport, flags="SA")), 1)
    assert t.expire(7000) == 0  # established: 2 h 4 min
    assert t.expire(7442) == 1


def test_port_exhaustion_never_reuses_a_live_mapping() -> None:
    t = table(port_lo=2000, port_hi=2003)
    cfg = t.settings
    t.update_config(NatConfig.of(snat=(SnatRule(VNI, "10.0.0.0/16", (EIP1,)),), port_lo=cfg.port_lo,
                              port_hi=cfg.port_hi))
    seen = set()
    for i in range(4):
        p = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=100 + i, dport=53))
        assert t.outbound(VNI, p, 0)
        seen.add(IP(bytes(p))[UDP].sport)
    assert seen == {2000, 2001, 2002, 2003}
    p = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=999, dport=53))
    assert t.outbound(VNI, p, 0) is None and t.counters["port_exhausted"] == 1


def test_a_released_tcp_port_is_held_before_another_endpoint_gets_it() -> None:
    """A TCP flow's tenant goes away (its rule with it) and the EIP goes to another tenant: the new tenant's flow
    from the same source port does not get the same public port for TCP_PORT_HOLD after the old flow's last
    packet (the server may still hold the old connection in TIME_WAIT and drop the new SYN); UDP is not held."""
    one = NatConfig.of(snat=(SnatRule(VNI, "10.0.0.0/16", (EIP1,)),))
    t = NatTable(one)

    def public_port(vni: int, src: str, l4, now: float) -> int:
        p = b(IP(src=src, dst=REMOTE) / l4)
        assert t.outbound(vni, p, now) is not None
        return IP(bytes(p))[l4.__class__].sport

    assert public_port(VNI, "10.0.1.2", TCP(sport=40000, dport=80, flags="S"), 10) == 40000
    assert public_port(VNI, "10.0.1.2", UDP(sport=40001, dport=53), 10) == 40001
    other = NatConfig.of(snat=(SnatRule(VNI_B, "10.0.0.0/16", (EIP1,)),))
    t.update_config(other)  # the first tenant's rule is gone: its mappings too
    assert not t.store.mappings()
    assert public_port(VNI_B, "10.0.1.3", TCP(sport=40000, dport=80, flags="S"), 20) != 40000
    assert public_port(VNI_B, "10.0.1.3", UDP(sport=40001, dport=53), 20) == 40001  # UDP has no TIME_WAIT
    t.expire(10 + TCP_PORT_HOLD + 1)
    assert not t.store.held
    assert public_port(VNI_B, "10.0.1.4", TCP(sport=40000, dport=80, flags="S"), 10 + TCP_PORT_HOLD + 1) == 40000


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_garbage_never_crashes(data: bytes) -> None:
    t = table()
    t.outbound(VNI, bytearray(data), 0)
    t.inbound(bytearray(data), 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.integers(1, 65535), st.integers(1, 65535), st.sampled_from(["tcp", "udp"]))
def test_truncated_and_option_packets_are_safe(cut: int, sport: int, dport: int, proto: str) -> None:
    t = table()
    l4 = TCP(sport=sport, dport=dport) if proto == "tcp" else UDP(sport=sport, dport=dport)
    full = bytes(IP(src="10.0.1.2", dst=REMOTE, options=[b"\x01\x01\x01\x00"]) / l4 / b"payload")
    buf = bytearray(full[:len(full) - cut])
    v = t.outbound(VNI, buf, 0)
    if v is not None:
        assert checksums_ok(buf)


def test_packets_out_bigger_than_the_internet_side_are_cut_or_refused() -> None:
    """From a VPC with a 3,450-byte MTU: without DF a 3,000-byte datagram leaves as fragments of at most 1,500
    bytes from the EIP; with DF the VM is told the path's MTU (fragmentation needed, 1500) by its EIP."""
    from scapy.layers.inet import defragment

    t = table(vpc_mtus=((VNI, 3450),))
    payload = bytes(range(250)) * 12
    v = t.outbound(VNI, b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=5000, dport=9000) / payload), 0)
    assert v.direction == "out" and len(v.fragments) == 3 and all(len(f) <= 1500 for f in v.fragments)
    whole = defragment([IP(f) for f in v.fragments])[0]
    assert whole.src == "203.0.113.1" and bytes(whole[UDP].payload) == payload and whole.ttl == 63
    df = b(IP(src="10.0.1.2", dst=REMOTE, flags="DF") / UDP(sport=5001, dport=9000) / payload)
    v = t.outbound(VNI, df, 1)
    e = IP(bytes(df))
    assert (v.direction, v.vni, v.ip) == ("in", VNI, ip2int("10.0.1.2"))
    assert (e.src, e.dst, e[ICMP].type, e[ICMP].code, e[ICMP].nexthopmtu) == ("203.0.113.1", "10.0.1.2", 3, 4, 1500)
    assert e[IPerror].src == "10.0.1.2" and e[UDPerror].sport == 5001 and checksums_ok(df)
    assert t.counters["fragmented_out"] == 1 and t.counters["frag_needed_out"] == 1


def test_fragments_are_reassembled_in_any_order_then_translated() -> None:
    """RFC 4787 REQ-14: a datagram arriving in fragments (out of order) is translated whole, and cut again to the
    VPC's MTU; overlapping fragments drop the datagram; unfinished ones expire; the number held is bounded."""
    from scapy.layers.inet import defragment, fragment

    from nfv_gateways.core import reassembly

    t = table()
    out = b(IP(src="10.0.1.2", dst=REMOTE) / UDP(sport=5000, dport=9000) / b"hi")
    t.outbound(VNI, out, 0)
    o = IP(bytes(out))
    payload = bytes(range(256)) * 12  # 3,072 bytes
    frags = fragment(IP(src=REMOTE, dst=o.src, id=99) / UDP(sport=9000, dport=o[UDP].sport) / payload, 1000)
    verdicts = [t.inbound(b(f), 1) for f in reversed(frags)]
    assert [v.direction for v in verdicts] == ["held"] * (len(frags) - 1) + ["in"]
    whole = defragment([IP(f) for f in verdicts[-1].fragments])[0]
    assert whole.dst == "10.0.1.2" and whole[UDP].dport == 5000 and bytes(whole[UDP].payload) == payload
    assert all(len(f) <= 1450 for f in verdicts[-1].fragments) and t.counters["reassembled"] == 1
    # from a VM too: its fragments leave as one translated datagram, cut to the internet side's 1500
    vm = fragment(IP(src="10.0.1.2", dst=REMOTE, id=7) / UDP(sport=5000, dport=9000) / payload, 800)
    v = [t.outbound(VNI, b(f), 2) for f in vm][-1]
    assert v.direction == "out" and all(len(f) <= 1500 for f in v.fragments)
    assert IP(v.fragments[0]).src == "203.0.113.1" and t.counters["reassembled"] == 2
    # overlapping fragments: the datagram is dropped
    a, c = fragment(IP(src=REMOTE, dst=o.src, id=100) / UDP(sport=9000, dport=o[UDP].sport) / payload, 1000)[:2]
    evil = IP(bytes(c))
    evil.frag -= 1
    del evil.chksum
    assert t.inbound(b(a), 3).direction == "held" and t.inbound(b(bytes(evil)), 3).direction == "held"
    assert t.counters["drop_frag_overlap"] == 1 and not t.reassembly.held
    # unfinished datagrams expire, and no more than MAX_DATAGRAMS are held
    for i in range(reassembly.MAX_DATAGRAMS + 5):
        f = fragment(IP(src=REMOTE, dst=o.src, id=1000 + i) / UDP(sport=9000, dport=1) / payload, 1000)[0]
        t.inbound(b(f), 4)
    assert len(t.reassembly.held) == reassembly.MAX_DATAGRAMS and t.counters["drop_frag_full"] == 5
    t.inbound(b(fragment(IP(src=REMOTE, dst=o.src, id=5) / UDP() / payload, 1000)[0]), 4 + reassembly.TIMEOUT + 1)
    assert len(t.reassembly.held) == 1 and t.counters["drop_frag_timeout"] == reassembly.MAX_DATAGRAMS
