"""The private line's C stage (native/dp_line.c, memory backend) against its Python reference, frame for frame.

Both are a whole gateway instance with the private-line role and the same config: one pushes each frame through
the C loop (VXLAN <-> 802.1Q in C; ARP, session traffic, TTL running out, packets too big for the other side and
unknown neighbours punted to the same Python code), the other hands every frame to Python (roles/line/reference.py).
Hypothesis generates sequences from the underlay (VPC packets to static and learned prefixes, the longest first;
DF and not, too big for the handoff; unknown VTEPs and VNIs) and from the handoff (two tenants with identical
addresses on two VLANs, an unknown VLAN, untagged frames, ARP from the customers' routers, packets to the line's
own address, outside the VPC, TTL 1 and 2, too big for the VPC), truncated and corrupted. Every frame must produce
the same output frames, byte for byte, and both must end up knowing the same routers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.l2 import ARP, Dot1Q, Ether

from nfv_gateways.core.instance import EXT, UL, Instance
from nfv_gateways.core.packet import ip2int
from nfv_gateways.roles.line.reference import prefix_of
from tests.support.frames import InstancePair, lab_options
from tests.unit.test_dataplane_differential import mutate
from tianji.southbound import GatewayConfig

UL_MAC, HO_MAC = "02:aa:00:00:00:01", "02:aa:00:00:00:02"
VTEP = "172.31.0.101"
HV = {"hv1": ("172.31.0.11", "02:bb:00:00:00:11"), "hv2": ("172.31.0.12", "02:bb:00:00:00:12")}
R1, R2 = "02:00:00:00:10:01", "02:00:00:00:10:02"
VLANS = {100: 1001, 200: 1002}  # two tenants, identical addresses on both sides
CUSTOMER = {100: "02:cc:00:00:01:00", 200: "02:cc:00:00:02:00"}
LOCAL, PEER = "169.254.10.1", "169.254.10.2"
VM = {(1001, "10.0.1.5"): ("02:01:00:00:00:05", "hv1"), (1001, "10.0.1.9"): ("02:01:00:00:00:09", "hv1"),
      (1002, "10.0.1.5"): ("02:02:00:00:00:05", "hv2")}
HANDOFF_MTU = 1400
LEARNED = ("192.168.30.0/24", "192.168.30.128/25", "10.0.5.0/24", "0.0.0.0/0")  # 10.0.5.0/24: inside, never taken


def config() -> GatewayConfig:
    eps = [{"port_id": f"p{i}", "vpc_id": f"v{vni}", "vni": vni, "ip": ip, "mac": mac, "host": h,
            "vtep_ip": HV[h][0]} for i, ((vni, ip), (mac, h)) in enumerate(VM.items())]
    lines = [{"id": f"line-{vlan}", "vni": vni, "vlan_id": vlan, "local_asn": 64512, "customer_asn": 65010,
              "vpc_cidr": "10.0.0.0/16", "mtu": 1450, "static_routes": ["192.168.20.0/24"],
              "sessions": [{"local_ip": f"{LOCAL}/30", "customer_ip": f"{PEER}/30", "prefixlen": 30}]}
             for vlan, vni in VLANS.items()]
    return GatewayConfig.model_validate({
        "name": "t", "revision": 1, "vtep_ip": VTEP, "endpoints": eps, "lines": lines,
        "vpcs": [{"id": "v1001", "vni": 1001, "router_mac": R1}, {"id": "v1002", "vni": 1002, "router_mac": R2}],
        "vteps": [{"host": h, "ip": v[0]} for h, v in HV.items()]})


class Pair(InstancePair):
    def __init__(self, tmp: Path) -> None:
        super().__init__(dataclasses.replace(lab_options(tmp, VTEP, (UL_MAC, HO_MAC)), handoff_mtu=HANDOFF_MTU,
                                             external_if="ho0"), "private-line")
        for inst in (self.native, self.ref):
            inst.apply(config())
            learned = frozenset(prefix_of(p) for p in LEARNED)
            inst.role.table.set_learned("line-100", ip2int(LOCAL), learned)  # type: ignore[attr-defined]
        assert self.drain_native() == self.drain_ref()


# --- frames ----------------------------------------------------------------------------------------------------
def hv_arp(hv: str) -> tuple[int, bytes]:
    ip, m = HV[hv]
    return UL, bytes(Ether(src=m, dst=UL_MAC) / ARP(op=2, hwsrc=m, psrc=ip, hwdst=UL_MAC, pdst=VTEP))


def router_arp(vlan: int, op: int = 1, mac: str | None = None) -> tuple[int, bytes]:
    m = mac or CUSTOMER[vlan]
    return EXT, bytes(Ether(src=m, dst="ff:ff:ff:ff:ff:ff" if op == 1 else HO_MAC) / Dot1Q(vlan=vlan)
                      / ARP(op=op, hwsrc=m, psrc=PEER, pdst=LOCAL, hwdst="00:00:00:00:00:00" if op == 1 else HO_MAC))


def l4(proto: str, size: int) -> object:
    pad = b"x" * size
    if proto == "tcp":
        return TCP(sport=40000, dport=443, flags="S") / pad
    if proto == "udp":
        return UDP(sport=40000, dport=53) / pad
    return ICMP(type=8, id=7, seq=1) / pad


tenant_frame = st.builds(
    lambda hv, vni, src, dst, proto, size, ttl, how: (UL, mutate(bytes(
        Ether(src=HV[hv][1] if hv in HV else "02:bb:00:00:00:99", dst=UL_MAC)
        / IP(src=HV[hv][0] if hv in HV else "172.31.0.99", dst=VTEP) / UDP(sport=50000, dport=4789)
        / (b"\x08\0\0\0" + vni.to_bytes(3, "big") + b"\0")
        / Ether(src=VM.get((vni, src), ("02:01:00:00:00:66",))[0], dst=R1 if vni == 1001 else R2)
        / IP(src=src, dst=dst, ttl=ttl, flags=size[1]) / l4(proto, size[0])), how)),
    st.sampled_from(["hv1", "hv1", "hv2", "hv9"]), st.sampled_from([1001, 1001, 1002, 1999]),
    st.sampled_from(["10.0.1.5", "10.0.1.9"]),
    st.sampled_from(["192.168.20.7", "192.168.30.5", "192.168.30.200", "8.8.8.8", "10.0.5.1"]),
    st.sampled_from(["udp", "tcp", "icmp"]), st.sampled_from([(0, 0)] * 4 + [(1420, "DF"), (1420, 0)]),
    st.sampled_from([64, 64, 1]),
    st.sampled_from([("none", 0)] * 6 + [("truncate", 3), ("truncate", 30), ("flip", 60), ("flip", 77)]))

handoff_frame = st.builds(
    lambda vlan, to_us, dst, proto, size, ttl, how: (EXT, mutate(bytes(
        Ether(src=CUSTOMER.get(vlan, "02:cc:00:00:09:00"), dst=HO_MAC if to_us else "02:aa:00:00:00:77")
        / (Dot1Q(vlan=vlan) if vlan else b"")
        / IP(src="192.168.20.7", dst=dst, ttl=ttl, flags=size[1]) / l4(proto, size[0])), how)),
    st.sampled_from([100, 100, 200, 300, 0]), st.sampled_from([True, True, True, False]),
    st.sampled_from(["10.0.1.5", "10.0.1.5", "10.0.1.9", "10.0.1.77", "10.1.0.1", LOCAL]),
    st.sampled_from(["udp", "tcp", "icmp"]), st.sampled_from([(0, 0)] * 4 + [(1440, "DF"), (1440, 0)]),
    st.sampled_from([64, 64, 2, 1]),
    st.sampled_from([("none", 0)] * 6 + [("truncate", 3), ("truncate", 20), ("flip", 16), ("flip", 40)]))

arp_frame = st.sampled_from([router_arp(200), router_arp(100, op=2), router_arp(100, mac="02:cc:00:00:01:99"),
                             hv_arp("hv2"), (EXT, bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / Dot1Q(vlan=100))
                                             + b"\x08\x06\0\x01")])

frames = st.lists(st.one_of(tenant_frame, tenant_frame, handoff_frame, handoff_frame, arp_frame), min_size=1,
                  max_size=30)


def routers(inst: Instance) -> dict:
    return dict(inst.role.handoff.neighbours)  # type: ignore[attr-defined]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=frames)
def test_line_stage_matches_the_python_reference(tmp_path: Path, seq: list[tuple[int, bytes]]) -> None:
    p = Pair(tmp_path)
    try:
        for port, f in (hv_arp("hv1"), router_arp(100)):  # hv2 and VLAN 200's router are learnt mid-sequence
            n, r = p.step(port, f)
            assert n == r
        for i, (port, frame) in enumerate(seq):
            native, ref = p.step(port, frame)
            assert native == ref, f"frame {i} on port {port}: {frame.hex()}"
        assert routers(p.native) == routers(p.ref)
    finally:
        p.close()


@pytest.fixture()
def pair(tmp_path: Path):
    p = Pair(tmp_path)
    for port, f in (hv_arp("hv1"), hv_arp("hv2"), router_arp(100), router_arp(200)):
        n, r = p.step(port, f)
        assert n == r
    yield p
    p.close()


def test_both_ways_in_c_with_the_tag_and_the_vni(pair: Pair) -> None:
    """With the neighbours known, a VPC's packet leaves tagged in C, and the customer's comes in through C,
    TTL - 1, in the line's VNI to the VM's hypervisor; neither reaches Python."""
    out = bytes(Ether(src=HV["hv1"][1], dst=UL_MAC) / IP(src=HV["hv1"][0], dst=VTEP) / UDP(sport=50000, dport=4789)
                / (b"\x08\0\0\0" + (1001).to_bytes(3, "big") + b"\0") / Ether(src=VM[(1001, "10.0.1.5")][0], dst=R1)
                / IP(src="10.0.1.5", dst="192.168.30.200") / UDP(sport=1, dport=2))
    (port, frame), = pair.step(UL, out)[0]
    got = Ether(frame)
    assert port == EXT and got[Dot1Q].vlan == 100 and got.dst == CUSTOMER[100] and got[IP].dst == "192.168.30.200"
    back = bytes(Ether(src=CUSTOMER[200], dst=HO_MAC) / Dot1Q(vlan=200) / IP(src="192.168.20.7", dst="10.0.1.5", ttl=9)
                 / UDP(sport=2, dport=1))
    (port, frame), = pair.step(EXT, back)[0]
    vx = Ether(frame)
    assert port == UL and vx[IP].dst == HV["hv2"][0] and bytes(vx[UDP].payload)[4:7] == (1002).to_bytes(3, "big")
    inner = Ether(bytes(vx[UDP].payload)[8:])
    assert inner.dst == VM[(1002, "10.0.1.5")][0] and inner[IP].ttl == 8
    stats = pair.dp.stats()
    assert stats["line_out"] == 1 and stats["line_in"] == 1 and stats["punt"] == 4  # the four ARPs alone


def test_other_vlans_and_untagged_frames_are_dropped_and_counted(pair: Pair) -> None:
    for vlan in (300, None):
        f = Ether(src=CUSTOMER[100], dst=HO_MAC) / (Dot1Q(vlan=vlan) if vlan else b"") / IP(dst="10.0.1.5") / UDP()
        assert pair.step(EXT, bytes(f)) == ([], [])
    stats = pair.dp.stats()
    assert stats["drop_unknown_vlan"] == 1 and stats["drop_untagged"] == 1


def test_routes_cross_per_vni_and_follow_what_the_sessions_learn(pair: Pair) -> None:
    """A learned prefix withdrawn leaves the C stage's table with the reference's (the static route stays)."""
    before = dict(pair.dp.crossed)
    for inst in (pair.native, pair.ref):
        inst.role.table.set_learned("line-100", ip2int(LOCAL), frozenset())  # type: ignore[attr-defined]
    assert pair.dp.crossed["calls"] == before["calls"] + 1  # VNI 1001's routes alone
    out = bytes(Ether(src=HV["hv1"][1], dst=UL_MAC) / IP(src=HV["hv1"][0], dst=VTEP) / UDP(sport=50000, dport=4789)
                / (b"\x08\0\0\0" + (1001).to_bytes(3, "big") + b"\0") / Ether(dst=R1)
                / IP(src="10.0.1.5", dst="192.168.30.200") / UDP())
    assert pair.step(UL, out) == ([], [])
    assert pair.dp.stats()["drop_no_route"] == 1
