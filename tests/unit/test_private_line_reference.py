"""The private line's packet semantics (roles/line/reference.py) and the handoff's tags (roles/line/handoff.py),
packet by packet with scapy; hypothesis throws arbitrary bytes at both sides (nothing raises)."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st
from scapy.all import ICMP, IP, TCP, UDP, Dot1Q, Ether, raw

from nfv_gateways.core.packet import ip2int
from nfv_gateways.roles.line.bgp import SessionSpec, bgpd_conf
from nfv_gateways.roles.line.handoff import AUXDATA, PACKET_AUXDATA, SOL_PACKET, TP_STATUS_VLAN_VALID, tagged, untag
from nfv_gateways.roles.line.policy import line_of
from nfv_gateways.roles.line.reference import LineTable, prefix_of
from tianji.served import LineSessionServed, PrivateLineServed

VNI, VLAN = 1000, 100
LOCAL, CUSTOMER = ip2int("169.254.10.1"), ip2int("169.254.10.2")


def served(vni: int = VNI, vlan: int = VLAN, static: tuple[str, ...] = ("192.168.20.0/24",)) -> PrivateLineServed:
    return PrivateLineServed(id=f"line-{vlan}", vni=vni, vlan_id=vlan, local_asn=64512, customer_asn=65010,
                             vpc_cidr="10.0.0.0/16", mtu=1450, static_routes=list(static),
                             sessions=[LineSessionServed(local_ip="169.254.10.1/30", customer_ip="169.254.10.2/30",
                                                         prefixlen=30)])


def table(*lines: PrivateLineServed) -> LineTable:
    t = LineTable(handoff_mtu=1500)
    for x in lines or (served(),):
        t.set_line(line_of(x))
    return t


def pkt(src: str, dst: str, size: int = 0, df: bool = False, ttl: int = 64) -> bytearray:
    p = IP(src=src, dst=dst, ttl=ttl, flags="DF" if df else 0) / UDP(sport=1000, dport=53) / (b"x" * size)
    return bytearray(raw(p))


def test_out_static_and_learned_longest_prefix_first() -> None:
    t = table()
    v = t.outbound(VNI, pkt("10.0.1.5", "192.168.20.9"), 0)
    assert (v.direction, v.vlan, v.nexthop, v.src) == ("out", VLAN, CUSTOMER, LOCAL)
    assert t.outbound(VNI, pkt("10.0.1.5", "192.168.30.9"), 0) is None and t.counters["drop_no_route"] == 1
    t.set_learned("line-100", LOCAL, frozenset({prefix_of("192.168.0.0/16"), prefix_of("10.0.5.0/24")}))
    assert t.outbound(VNI, pkt("10.0.1.5", "192.168.30.9"), 0).vlan == VLAN
    assert t.outbound(VNI, pkt("10.0.1.5", "10.0.5.1"), 0) is None  # inside the VPC: never over the line
    assert t.outbound(VNI + 1, pkt("10.0.1.5", "192.168.20.9"), 0) is None  # another VPC has no such line
    t.set_learned("line-100", LOCAL, frozenset())
    assert t.outbound(VNI, pkt("10.0.1.5", "192.168.30.9"), 0) is None  # withdrawn


def test_in_enters_the_lines_vpc_only_ttl_down_by_one() -> None:
    t = table(served(), served(vni=2000, vlan=200))
    buf = pkt("192.168.20.9", "10.0.1.5", ttl=9)
    v = t.inbound(VLAN, buf, 0)
    assert (v.direction, v.vni, v.ip) == ("in", VNI, ip2int("10.0.1.5"))
    assert IP(bytes(buf)).ttl == 8 and IP(bytes(buf)).chksum == IP(raw(IP(bytes(buf)))).chksum
    assert t.inbound(200, pkt("192.168.20.9", "10.0.1.5"), 0).vni == 2000  # same addresses, other tenant
    assert t.inbound(300, pkt("192.168.20.9", "10.0.1.5"), 0) is None and t.counters["drop_unknown_vlan"] == 1
    assert t.inbound(None, pkt("192.168.20.9", "10.0.1.5"), 0) is None and t.counters["drop_untagged"] == 1
    assert t.inbound(VLAN, pkt("192.168.20.9", "8.8.8.8"), 0) is None and t.counters["drop_not_in_vpc"] == 1


def test_mtu_fragments_or_frag_needed_and_ttl_exceeded() -> None:
    t = table()
    big = pkt("192.168.20.9", "10.0.1.5", size=1460)  # 1488 bytes: over the VPC's 1450
    v = t.inbound(VLAN, big, 0)
    assert v.direction == "in" and len(v.fragments) == 2 and all(len(f) <= 1450 for f in v.fragments)
    df = pkt("192.168.20.9", "10.0.1.5", size=1460, df=True)
    v = t.inbound(VLAN, df, 0)
    icmp = IP(bytes(df))
    assert (v.direction, v.vlan, v.nexthop) == ("out", VLAN, ip2int("192.168.20.9"))
    assert icmp[ICMP].type == 3 and icmp[ICMP].code == 4 and icmp[ICMP].nexthopmtu == 1450
    assert icmp.src == "169.254.10.1" and icmp.dst == "192.168.20.9"
    dead = pkt("192.168.20.9", "10.0.1.5", ttl=1)
    v = t.inbound(VLAN, dead, 0)
    assert v.direction == "out" and IP(bytes(dead))[ICMP].type == 11
    t2 = LineTable(handoff_mtu=1400)
    t2.set_line(line_of(served()))
    out_df = pkt("10.0.1.5", "192.168.20.9", size=1420, df=True)
    v = t2.outbound(VNI, out_df, 0)
    assert (v.direction, v.vni, v.ip) == ("in", VNI, ip2int("10.0.1.5"))  # back to the VM: its PMTU learns 1400
    assert IP(bytes(out_df))[ICMP].nexthopmtu == 1400


def test_untag_from_auxdata_or_from_the_frame() -> None:
    frame = raw(Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02") / IP() / TCP())
    aux = AUXDATA.pack(TP_STATUS_VLAN_VALID, 0, 0, 0, 0, 100, 0x8100)
    assert untag(frame, [(SOL_PACKET, PACKET_AUXDATA, aux)]) == (100, frame)
    assert untag(frame, [(SOL_PACKET, PACKET_AUXDATA, AUXDATA.pack(0, 0, 0, 0, 0, 0, 0))]) == (None, frame)
    wire = raw(Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02") / Dot1Q(vlan=42) / IP() / TCP())
    assert untag(wire, []) == (42, frame)
    out = tagged(7, b"\x02" * 6, b"\x04" * 6, 0x0800, raw(IP()))
    assert Ether(out)[Dot1Q].vlan == 7 and Ether(out)[Dot1Q].type == 0x0800


def test_bgpd_advertises_the_vpc_only_with_the_limit_and_the_key() -> None:
    conf = bgpd_conf(SessionSpec("l", 100, "169.254.10.1/30", "169.254.10.2", 64512, 65010, "k3y", 7,
                                 "10.0.0.0/16"), "tjl-x")
    for want in ("router bgp 64512", "neighbor 169.254.10.2 remote-as 65010", "neighbor 169.254.10.2 password k3y",
                 "neighbor 169.254.10.2 bfd", "network 10.0.0.0/16", "neighbor 169.254.10.2 maximum-prefix 7 restart 1",
                 "neighbor 169.254.10.2 prefix-list tj-vpc out", "ip prefix-list tj-vpc seq 5 permit 10.0.0.0/16"):
        assert want in conf


@given(st.binary(max_size=200), st.integers(0, 4095) | st.none(), st.integers(0, 1 << 24))
def test_arbitrary_bytes_never_raise(data: bytes, vlan: int | None, vni: int) -> None:
    t = table()
    t.inbound(vlan, bytearray(data), 0)
    t.outbound(vni, bytearray(data), 0)
    untag(data, [(SOL_PACKET, PACKET_AUXDATA, data[:AUXDATA.size])])
    assert struct.calcsize("=IIIHHHH") == AUXDATA.size
