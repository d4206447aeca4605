"""The native data plane (dp_core.c, memory backend) against the pure-Python gateway, frame for frame.

Both are a whole gateway instance (`Instance` with the NAT role) with the same config: one pushes each frame
through the C loop (decapsulation, established-flow NAT, encapsulation in C; the rest punted to the same Python
code), the other hands every frame to Python with the reference NAT table. Hypothesis generates frame sequences
from the underlay and the external side (TCP, UDP, ICMP echo and errors, ARP, two tenants with the same private
addresses, hairpin, DNAT, a 1:1 EIP, unknown VTEPs and VNIs, truncated, corrupted, fragmented and option-carrying
packets). Every frame must produce the same output frames, byte for byte, and the NAT tables must end up the same.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether

from nfv_gateways.core.edge import EdgeSpec
from nfv_gateways.core.instance import EXT, UL, GatewayOptions
from nfv_gateways.roles.nat.reference import NatTable
from tests.support.frames import InstancePair, lab_options
from tianji.southbound import GatewayConfig

UL_MAC, EXT_MAC = "02:aa:00:00:00:01", "02:aa:00:00:00:02"
VTEP = "172.31.0.101"
HV = {"hv1": ("172.31.0.11", "02:bb:00:00:00:11"), "hv2": ("172.31.0.12", "02:bb:00:00:00:12")}
SERVERS = {"198.51.100.1": "02:cc:00:00:00:01", "198.51.100.2": "02:cc:00:00:00:02"}
EIP1, EIP2, EIP3 = "203.0.113.1", "203.0.113.2", "203.0.113.3"
R1, R2 = "02:00:00:00:10:01", "02:00:00:00:10:02"
VM = {(1001, "10.0.1.5"): ("02:01:00:00:00:05", "hv1"), (1001, "10.0.1.9"): ("02:01:00:00:00:09", "hv1"),
      (1002, "10.0.1.5"): ("02:02:00:00:00:05", "hv2")}


def config() -> GatewayConfig:
    eps = [{"port_id": f"p{i}", "vpc_id": f"v{vni}", "vni": vni, "ip": ip, "mac": mac, "host": h,
            "vtep_ip": HV[h][0]} for i, ((vni, ip), (mac, h)) in enumerate(VM.items())]
    return GatewayConfig.model_validate({
        "name": "t", "revision": 1, "vtep_ip": VTEP, "eips": [EIP1, EIP2, EIP3], "endpoints": eps,
        "vpcs": [{"id": "v1001", "vni": 1001, "router_mac": R1, "snat": [{"cidr": "10.0.0.0/8", "eips": [EIP1]}]},
                 {"id": "v1002", "vni": 1002, "router_mac": R2, "snat": [{"cidr": "10.0.0.0/8", "eips": [EIP2]}]}],
        "static": [{"vni": 1001, "ip": "10.0.1.9", "eip": EIP3}],
        "dnat": [{"eip": EIP1, "protocol": "tcp", "external_port": 8080, "vni": 1001, "ip": "10.0.1.5",
                  "internal_port": 80}],
        "vteps": [{"host": h, "ip": v[0]} for h, v in HV.items()]})


# with an edge router (core/edge.py) on another subnet of the external side: every server is off-link, reached
# through the router's MAC, in C and in Python alike
EDGE = EdgeSpec("192.0.2.200/24", "192.0.2.1", 64512, 64600)
EDGE_MAC = "02:cc:00:00:00:fe"


def options(tmp: Path, edge: bool = False) -> GatewayOptions:
    return dataclasses.replace(lab_options(tmp, VTEP, (UL_MAC, EXT_MAC)), edge=EDGE if edge else None)


class Pair(InstancePair):
    def __init__(self, tmp: Path, edge: bool = False) -> None:
        super().__init__(options(tmp, edge), "nat")
        cfg = config()
        self.native.apply(cfg)
        self.ref.apply(cfg)
        assert self.drain_native() == self.drain_ref()


def table_state(t: NatTable) -> dict:
    return {m.inside: (m.eip, m.eport, tuple(m.peers), m.tcp_established, m.tcp_closing)
            for m in t.store.mappings()}


# --- frames ----------------------------------------------------------------------------------------------------
def arp_reply(port: int, ip: str, mac: str) -> tuple[int, bytes]:
    me = UL_MAC if port == UL else EXT_MAC
    tpa = VTEP if port == UL else EIP1
    return port, bytes(Ether(src=mac, dst=me) / ARP(op=2, hwsrc=mac, psrc=ip, hwdst=me, pdst=tpa))


def l4(proto: str, sport: int, dport: int, flags: str) -> object:
    if proto == "tcp":
        return TCP(sport=sport, dport=dport, flags=flags, seq=1000, ack=1 if "A" in flags else 0)
    if proto == "udp":
        return UDP(sport=sport, dport=dport) / b"payload"
    return ICMP(type=8, id=sport, seq=1) / b"ping"


def mutate(b: bytes, how: tuple[str, int]) -> bytes:
    kind, k = how
    if kind == "truncate":
        return b[: max(1, len(b) - 1 - k % max(len(b) - 1, 1))]
    if kind == "flip":
        i = k % len(b)
        return b[:i] + bytes([b[i] ^ (1 + k % 255)]) + b[i + 1:]
    return b


tenant_frame = st.builds(
    lambda hv, vni, src, proto, sport, dst, dport, flags, frag, opts, how, ttl: (
        UL, mutate(bytes(
            Ether(src=HV[hv][1] if hv in HV else "02:bb:00:00:00:99", dst=UL_MAC)
            / IP(src=HV[hv][0] if hv in HV else "172.31.0.99", dst=VTEP) / UDP(sport=50000, dport=4789)
            / (b"\x08\0\0\0" + vni.to_bytes(3, "big") + b"\0")
            / Ether(src=VM.get((vni, src), ("02:01:00:00:00:66",))[0], dst=R1 if vni == 1001 else R2)
            / IP(src=src, dst=dst, flags=frag[0], frag=frag[1], options=opts, ttl=ttl)
            / l4(proto, sport, dport, flags)), how)),
    st.sampled_from(["hv1", "hv2", "hv9"]), st.sampled_from([1001, 1001, 1002, 1999]),
    st.sampled_from(["10.0.1.5", "10.0.1.9", "10.0.1.6"]), st.sampled_from(["udp", "tcp", "icmp"]),
    st.sampled_from([5000, 5001, 80]), st.sampled_from(["198.51.100.1", "198.51.100.2", EIP1, EIP3]),
    st.sampled_from([53, 443, 8080]), st.sampled_from(["S", "SA", "A", "PA", "FA", "R"]),
    st.sampled_from([(0, 0), (0, 0), (0, 0), (1, 0), (0, 5)]), st.sampled_from([[], [], [], [b"\x01\x01\x01\x00"]]),
    st.sampled_from([("none", 0)] * 6 + [("truncate", 3), ("truncate", 30), ("flip", 20), ("flip", 77),
                                         ("flip", 60)]), st.sampled_from([64, 64, 64, 2, 1]))


def icmp_error(eip: str, sport: int, server: str) -> bytes:
    embedded = bytes(IP(src=eip, dst=server) / UDP(sport=sport, dport=53) / b"payload")
    return bytes(IP(src=server, dst=eip) / ICMP(type=3, code=3) / embedded)


external_frame = st.builds(
    lambda src, dst, proto, sport, dport, flags, err, how, to_us, ttl, size: (
        EXT, mutate(bytes(Ether(src=SERVERS[src], dst=EXT_MAC if to_us else "02:cc:00:00:00:77")) + (
            icmp_error(dst, dport, src) if err else bytes(IP(src=src, dst=dst, ttl=ttl, flags=size[1])
                                                          / l4(proto, sport, dport, flags) / (b"x" * size[0]))),
            how)),
    st.sampled_from(list(SERVERS)), st.sampled_from([EIP1, EIP2, EIP3, "203.0.113.77"]),
    st.sampled_from(["udp", "tcp", "icmp"]), st.sampled_from([53, 443, 8080]),
    st.sampled_from([5000, 5001, 80, 8080]), st.sampled_from(["SA", "A", "PA", "FA", "R"]),
    st.sampled_from([False, False, False, True]),
    st.sampled_from([("none", 0)] * 6 + [("truncate", 3), ("flip", 20), ("flip", 30)]),
    st.sampled_from([True, True, True, False]), st.sampled_from([64, 64, 64, 2, 1]),
    st.sampled_from([(0, 0)] * 4 + [(1460, 0), (1460, "DF"), (1400, 0)]))

arp_frame = st.sampled_from([
    arp_reply(UL, *HV["hv2"]),
    arp_reply(EXT, "198.51.100.2", SERVERS["198.51.100.2"]),
    (UL, bytes(Ether(src=HV["hv2"][1], dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=HV["hv2"][1], psrc=HV["hv2"][0],
                                                                        pdst=VTEP))),
    (EXT, bytes(Ether(src=SERVERS["198.51.100.1"], dst="ff:ff:ff:ff:ff:ff")
                / ARP(op=1, hwsrc=SERVERS["198.51.100.1"], psrc="198.51.100.1", pdst=EIP2))),
    (EXT, b"\xff" * 6 + b"\x02\xcc\0\0\0\x01" + b"\x08\x06" + b"\0\x01"),  # truncated ARP
])

frames = st.lists(st.one_of(tenant_frame, tenant_frame, external_frame, external_frame, arp_frame), min_size=1,
                  max_size=30)


@pytest.fixture()
def pair(tmp_path: Path):
    p = Pair(tmp_path)
    # the neighbours of most tests are known (fast path); hv2 and the second server are learnt mid-sequence
    for port, f in (arp_reply(UL, *HV["hv1"]), arp_reply(EXT, "198.51.100.1", SERVERS["198.51.100.1"])):
        n, r = p.step(port, f)
        assert n == r
    yield p
    p.close()


@pytest.mark.parametrize("edge", [False, True], ids=["flat", "edge-router"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=frames)
def test_native_data_plane_matches_python_gateway(tmp_path: Path, edge: bool, seq: list[tuple[int, bytes]]) -> None:
    p = Pair(tmp_path, edge)
    try:
        first = [arp_reply(UL, *HV["hv1"]), arp_reply(EXT, "198.51.100.1", SERVERS["198.51.100.1"])]
        for port, f in first + ([arp_reply(EXT, EDGE.peer, EDGE_MAC)] if edge else []):
            p.step(port, f)
        for i, (port, frame) in enumerate(seq):
            native, ref = p.step(port, frame)
            assert native == ref, f"frame {i} on port {port}: {frame.hex()}"
        assert table_state(p.native.stage) == table_state(p.ref.stage)
    finally:
        p.close()


def test_new_flows_never_reach_python(pair: Pair) -> None:
    """A TCP handshake per new source port: the SYN's mapping is made by the C loop, the SYN-ACK, ACK and FIN go
    through C too, and nothing is punted; the gateway's reference ends up with the same table as Python's."""
    punts = pair.dp.stats()["punt"]
    for sport in range(40000, 40020):
        for port, frame in tenant_tcp(sport, "S"), server_tcp(sport, "SA"), tenant_tcp(sport, "A"), \
                tenant_tcp(sport, "FA"), server_tcp(sport, "FA"):
            n, r = pair.step(port, frame)
            assert n == r and len(n) == 1
    st_ = pair.dp.stats()
    assert st_["punt"] == punts and pair.native.stage.stats()["created"] == 20
    assert table_state(pair.native.stage) == table_state(pair.ref.stage)


def tenant_tcp(sport: int, flags: str) -> tuple[int, bytes]:
    return UL, bytes(Ether(src=HV["hv1"][1], dst=UL_MAC) / IP(src=HV["hv1"][0], dst=VTEP)
                     / UDP(sport=50000, dport=4789) / (b"\x08\0\0\0" + (1001).to_bytes(3, "big") + b"\0")
                     / Ether(src=VM[(1001, "10.0.1.5")][0], dst=R1) / IP(src="10.0.1.5", dst="198.51.100.1")
                     / TCP(sport=sport, dport=443, flags=flags))


def server_tcp(dport: int, flags: str) -> tuple[int, bytes]:
    return EXT, bytes(Ether(src=SERVERS["198.51.100.1"], dst=EXT_MAC) / IP(src="198.51.100.1", dst=EIP1)
                      / TCP(sport=443, dport=dport, flags=flags))


def test_established_flow_stays_in_c(pair: Pair) -> None:
    """After the first packet, a flow's packets both ways are translated by the C loop alone."""
    out = (UL, bytes(Ether(src=HV["hv1"][1], dst=UL_MAC) / IP(src=HV["hv1"][0], dst=VTEP)
                     / UDP(sport=50000, dport=4789) / (b"\x08\0\0\0" + (1001).to_bytes(3, "big") + b"\0")
                     / Ether(src=VM[(1001, "10.0.1.5")][0], dst=R1) / IP(src="10.0.1.5", dst="198.51.100.1")
                     / UDP(sport=5000, dport=53) / b"q"))
    back = (EXT, bytes(Ether(src=SERVERS["198.51.100.1"], dst=EXT_MAC) / IP(src="198.51.100.1", dst=EIP1)
                       / UDP(sport=53, dport=5000) / b"a"))
    n, r = pair.step(*out)
    assert n == r and len(n) == 1
    punts = pair.dp.stats()["punt"]
    for _ in range(10):
        n, r = pair.step(*out)
        assert n == r and n[0][0] == EXT
        got = IP(n[0][1][14:])
        assert got.src == EIP1 and got[UDP].sport == 5000
        n, r = pair.step(*back)
        assert n == r and n[0][0] == UL
        outer = Ether(n[0][1])
        assert outer[IP].dst == HV["hv1"][0] and struct.unpack("!I", bytes(outer[UDP].payload)[4:8])[0] >> 8 == 1001
    st_ = pair.dp.stats()
    assert st_["punt"] == punts and st_["fast_out"] >= 10 and st_["fast_in"] >= 10


def test_hostile_frames_are_counted_not_fatal(pair: Pair) -> None:
    junk = [(UL, b""), (UL, b"\x00" * 13), (EXT, b"\x01" * 7), (UL, bytes(Ether(dst=UL_MAC) / IP(dst=VTEP))),
            (UL, bytes(Ether(dst=UL_MAC, src=HV["hv1"][1]) / IP(src="172.31.0.99", dst=VTEP)
                       / UDP(dport=4789) / (b"\x08" + b"\0" * 40))),
            (UL, bytes(Ether(dst=UL_MAC, src=HV["hv1"][1]) / IP(src=HV["hv1"][0], dst=VTEP)
                       / UDP(dport=4789) / (b"\x08\0\0\0\0\x07\xcf\0" + b"\0" * 40)))]
    for port, f in junk:
        n, r = pair.step(port, f)
        assert n == r == []
    s = pair.dp.stats()
    assert s["drop_malformed"] >= 2 and s["drop_unknown_vtep"] >= 1 and s["drop_unknown_vni"] >= 1


def test_with_an_edge_router_off_link_destinations_go_through_it(tmp_path: Path) -> None:
    """The external side's router (edge routing): a translated packet to a server off the segment leaves with the
    router's MAC, from C on the first packet once the router is known, and from Python before (it ARPs for the
    router, from the instance's own address on the segment)."""
    p = Pair(tmp_path, edge=True)
    try:
        p.step(*arp_reply(UL, *HV["hv1"]))
        native, ref = p.step(*tenant_tcp(40000, "S"))
        assert native == ref and len(native) == 1
        arp = Ether(native[0][1])
        assert arp.haslayer(ARP) and arp[ARP].pdst == EDGE.peer and arp[ARP].psrc == EDGE.local_ip
        n, r = p.step(*arp_reply(EXT, EDGE.peer, EDGE_MAC))
        assert n == r and len(n) == 1 and Ether(n[0][1]).dst == EDGE_MAC  # what waited for the router
        punts = p.dp.stats()["punt"]
        native, ref = p.step(*tenant_tcp(40001, "S"))
        assert native == ref and len(native) == 1 and Ether(native[0][1]).dst == EDGE_MAC
        assert p.dp.stats()["punt"] == punts  # decided in C
    finally:
        p.close()
