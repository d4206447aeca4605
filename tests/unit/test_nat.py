"""The NAT reference semantics on real packet bytes (built and checked with scapy)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPerror

from nfv_gateways.nat import TCP_PORT_HOLD, NatConfig, NatTable, SnatRule, Timeouts, ip2int

VNI, VNI_B = 1001, 2002
EIP1, EIP2, EIP_STATIC, EIP_DNAT = (ip2int(f"203.0.113.{n}") for n in (1, 2, 10, 20))
REMOTE, REMOTE2 = "198.51.100.7", "198.51.100.8"


def table(**kw) -> NatTable:  # noqa: ANN003
    cfg = NatConfig(
        snat=(SnatRule(VNI, "10.0.0.0/16", (EIP1, EIP2)), SnatRule(VNI_B, "10.0.0.0/16", (EIP2,))),
        static=((VNI, ip2int("10.0.9.9"), EIP_STATIC),),
        dnat=((EIP_DNAT, 6, 8443, VNI, ip2int("10.0.1.5"), 443),), **kw)
    return NatTable(cfg)


def b(pkt) -> bytearray:  # noqa: ANN001
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


def test_icmp_errors_translated_back() -> None:
    t = table()
    out = b(IP(src="10.0.1.2", dst=REMOTE, ttl=1) / UDP(sport=33434, dport=33434) / b"x")
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
    cfg = t.config
    t.update_config(NatConfig(snat=(SnatRule(VNI, "10.0.0.0/16", (EIP1,)),), port_lo=cfg.port_lo,
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
    one = NatConfig(snat=(SnatRule(VNI, "10.0.0.0/16", (EIP1,)),))
    t = NatTable(one)

    def public_port(vni: int, src: str, l4, now: float) -> int:  # noqa: ANN001
        p = b(IP(src=src, dst=REMOTE) / l4)
        assert t.outbound(vni, p, now) is not None
        return IP(bytes(p))[l4.__class__].sport

    assert public_port(VNI, "10.0.1.2", TCP(sport=40000, dport=80, flags="S"), 10) == 40000
    assert public_port(VNI, "10.0.1.2", UDP(sport=40001, dport=53), 10) == 40001
    other = NatConfig(snat=(SnatRule(VNI_B, "10.0.0.0/16", (EIP1,)),))
    t.update_config(other)  # the first tenant's rule is gone: its mappings too
    assert not t.by_inside
    assert public_port(VNI_B, "10.0.1.3", TCP(sport=40000, dport=80, flags="S"), 20) != 40000
    assert public_port(VNI_B, "10.0.1.3", UDP(sport=40001, dport=53), 20) == 40001  # UDP has no TIME_WAIT
    t.expire(10 + TCP_PORT_HOLD + 1)
    assert not t.held
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
