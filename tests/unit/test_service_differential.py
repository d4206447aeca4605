"""The service endpoint's C stage (native/dp_svc.c, memory backend) against the pure-Python instance, frame for frame.

Both are a whole gateway instance of role `service` with the same config: two tenants with identical addresses,
each with an endpoint of the operator's service (one of them asking for PROXY v2), and a third endpoint of a
published load balancer (its VIP in another VNI). One pushes each frame through the C loop (established
connections in C, the rest punted to the same Python code), the other hands every frame to Python. Hypothesis
makes sequences of VMs' packets to the endpoints and the services' answers (a few flows, so connections get
established, with every TCP flag, fragments, low TTLs, big packets, truncated and corrupted frames). Every frame
must produce the same output frames, byte for byte, and the connection tables must end up the same.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether

from nfv_gateways.core.instance import EXT, UL
from nfv_gateways.roles.service.reference import ServiceTable
from tests.support.frames import InstancePair, lab_options
from tianji.southbound import GatewayConfig

UL_MAC, EXT_MAC = "02:aa:00:00:00:01", "02:aa:00:00:00:02"
VTEP = "172.31.0.101"
HV = {"hv1": ("172.31.0.11", "02:bb:00:00:00:11"), "hv2": ("172.31.0.12", "02:bb:00:00:00:12"),
      "lb1": ("172.31.0.21", "02:bb:00:00:00:21")}
SVC, SVC_MAC = "100.100.0.10", "02:cc:00:00:00:10"
SRC1, SRC2 = "100.100.128.1", "100.100.128.2"  # the endpoints' own addresses on the service network
EP = "10.0.1.9"  # both tenants' endpoint address (identical subnets)
VIP, PROVIDER_PORT, PROVIDER_VNI = "10.7.1.100", "10.7.1.50", 1007
R = {1001: "02:00:00:00:10:01", 1002: "02:00:00:00:10:02", 1003: "02:00:00:00:10:03", 1007: "02:00:00:00:10:07"}
PEER_VNI, PEER_VM, PEER_MAC = 1003, "10.3.0.5", "02:03:00:00:00:05"  # VPC 1003 is peered with 1001
VM = {(1001, "10.0.1.5"): ("02:01:00:00:00:05", "hv1"), (1001, "10.0.1.6"): ("02:01:00:00:00:06", "hv1"),
      (1002, "10.0.1.5"): ("02:02:00:00:00:05", "hv2")}


def config() -> GatewayConfig:
    eps = [{"port_id": f"p{i}", "vpc_id": f"v{vni}", "vni": vni, "ip": ip, "mac": mac, "host": h,
            "vtep_ip": HV[h][0]} for i, ((vni, ip), (mac, h)) in enumerate(VM.items())]
    eps.append({"port_id": "peer-vm", "vpc_id": "v1003", "vni": PEER_VNI, "ip": PEER_VM, "mac": PEER_MAC,
                "host": "hv2", "vtep_ip": HV["hv2"][0]})
    eps.append({"port_id": "vip", "vpc_id": "v1007", "vni": PROVIDER_VNI, "ip": VIP, "mac": "02:07:00:00:01:00",
                "host": "lb1", "vtep_ip": HV["lb1"][0]})
    any_rule = [{"protocol": "any", "cidrs": ["0.0.0.0/0"]}]
    ports = [{"protocol": "tcp", "port": 80}, {"protocol": "udp", "port": 53}]

    def served(eid: str, vni: int, source: str, **kw: object) -> dict:
        return {"id": eid, "vni": vni, "ip": EP, "mac": "02:09:00:00:00:09", "source": source, "addresses": [SVC],
                "ports": ports, "rules": any_rule} | kw

    return GatewayConfig.model_validate({
        "name": "t", "revision": 1, "vtep_ip": VTEP, "eips": [SRC1, SRC2], "endpoints": eps,
        "vpcs": [{"id": f"v{v}", "vni": v, "router_mac": m} for v, m in R.items()],
        "services": [served("e1", 1001, SRC1, peers=[{"cidr": "10.3.0.0/16", "vni": PEER_VNI}]),
                     served("e2", 1002, SRC2, proxy_protocol=True),
                     served("e3", 1001, PROVIDER_PORT, addresses=[VIP], ports=[], via_vni=PROVIDER_VNI)
                     | {"ip": "10.0.1.10"}],
        "vteps": [{"host": h, "ip": v[0]} for h, v in HV.items()]})


class Pair(InstancePair):
    def __init__(self, tmp: Path) -> None:
        super().__init__(lab_options(tmp, VTEP, (UL_MAC, EXT_MAC)), "service")
        for i in (self.native, self.ref):
            i.apply(config())
        assert self.drain_native() == self.drain_ref()


def arp_reply(port: int, ip: str, mac: str) -> tuple[int, bytes]:
    me = UL_MAC if port == UL else EXT_MAC
    return port, bytes(Ether(src=mac, dst=me) / ARP(op=2, hwsrc=mac, psrc=ip, hwdst=me,
                                                    pdst=VTEP if port == UL else SRC1))


def vxlan(hv: str, vni: int, inner: bytes) -> bytes:
    return bytes(Ether(src=HV[hv][1], dst=UL_MAC) / IP(src=HV[hv][0], dst=VTEP) / UDP(sport=50000, dport=4789)
                 / (b"\x08\0\0\0" + vni.to_bytes(3, "big") + b"\0")) + inner


def l4(proto: str, sport: int, dport: int, flags: str, size: int) -> object:
    if proto == "tcp":
        return TCP(sport=sport, dport=dport, flags=flags, seq=1000, ack=1 if "A" in flags else 0) / (b"d" * size)
    if proto == "udp":
        return UDP(sport=sport, dport=dport) / (b"u" * (size + 1))
    return ICMP(type=8, id=sport, seq=1) / b"ping"


def mutate(b: bytes, how: tuple[str, int]) -> bytes:
    kind, k = how
    if kind == "truncate":
        return b[: max(1, len(b) - 1 - k % max(len(b) - 1, 1))]
    if kind == "flip":
        i = k % len(b)
        return b[:i] + bytes([b[i] ^ (1 + k % 255)]) + b[i + 1:]
    return b


HOW = st.sampled_from([("none", 0)] * 8 + [("truncate", 3), ("truncate", 30), ("flip", 20), ("flip", 60)])
FLAGS = st.sampled_from(["S", "A", "A", "PA", "PA", "FA", "R", "SA"])

vm_frame = st.builds(
    lambda who, ep, proto, sport, dport, flags, ttl, size, how: (UL, mutate(vxlan(
        VM[who][1], who[0], bytes(Ether(src=VM[who][0], dst="02:09:00:00:00:09")
                                  / IP(src=who[1], dst=ep, ttl=ttl) / l4(proto, sport, dport, flags, size))), how)),
    st.sampled_from(list(VM)), st.sampled_from([EP, EP, "10.0.1.10", "10.0.1.77"]),
    st.sampled_from(["tcp", "tcp", "udp", "icmp"]), st.sampled_from([40000, 40001]), st.sampled_from([80, 53, 22]),
    FLAGS, st.sampled_from([64, 64, 64, 1]), st.sampled_from([0, 0, 100, 1400]), HOW)

service_frame = st.builds(
    lambda src, dst, proto, dport, flags, ttl, size, how: (EXT, mutate(bytes(
        Ether(src=SVC_MAC, dst=EXT_MAC) / IP(src=SVC, dst=dst, ttl=ttl, flags=size[1])
        / l4(proto, 80 if proto == "tcp" else 53, dport, flags, size[0])), how)),
    st.just(SVC), st.sampled_from([SRC1, SRC2, SRC1]), st.sampled_from(["tcp", "tcp", "udp"]),
    st.sampled_from([40000, 40001, 1234]), FLAGS, st.sampled_from([64, 64, 1]),
    st.sampled_from([(0, 0), (0, 0), (1440, 0), (1440, "DF")]), HOW)

peer_frame = st.builds(  # a peered VPC's VM: its vSwitch tunnels with the endpoint VPC's VNI
    lambda proto, sport, flags, how: (UL, mutate(vxlan("hv2", 1001, bytes(
        Ether(src=PEER_MAC, dst="02:09:00:00:00:09") / IP(src=PEER_VM, dst=EP) / l4(proto, sport, 80, flags, 0))),
        how)),
    st.sampled_from(["tcp", "tcp", "icmp"]), st.sampled_from([40000, 40001]), FLAGS, HOW)

member_frame = st.builds(  # a published load balancer's member answering, from the VIP, in its VNI
    lambda dport, flags, how: (UL, mutate(vxlan("hv2", PROVIDER_VNI, bytes(
        Ether(src="02:07:00:00:00:01", dst="02:09:00:00:00:50") / IP(src=VIP, dst=PROVIDER_PORT)
        / TCP(sport=80, dport=dport, flags=flags, seq=7))), how)),
    st.sampled_from([40000, 40001]), FLAGS, HOW)

frames = st.lists(st.one_of(vm_frame, vm_frame, service_frame, member_frame, peer_frame), min_size=1, max_size=40)


def table_state(t: ServiceTable) -> dict:
    return {c.inside(): (c.svc, c.sport, c.established, c.closing, c.header_acked) for c in t.conns.conns()}


def warm(p: Pair) -> None:
    for port, f in (arp_reply(UL, *HV["hv1"]), arp_reply(UL, *HV["hv2"]), arp_reply(UL, *HV["lb1"]),
                    arp_reply(EXT, SVC, SVC_MAC)):
        n, r = p.step(port, f)
        assert n == r


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=frames)
def test_native_service_stage_matches_python(tmp_path: Path, seq: list[tuple[int, bytes]]) -> None:
    p = Pair(tmp_path)
    try:
        warm(p)
        for i, (port, frame) in enumerate(seq):
            native, ref = p.step(port, frame)
            assert native == ref, f"frame {i} on port {port}: {frame.hex()}"
        assert table_state(p.native.stage) == table_state(p.ref.stage)
    finally:
        p.close()


@pytest.fixture()
def pair(tmp_path: Path):
    p = Pair(tmp_path)
    warm(p)
    yield p
    p.close()


def test_an_established_connection_stays_in_c(pair: Pair) -> None:
    """The SYN is Python's (admission); from the ACK that establishes on, both ways go through C alone, to the
    service and into the published load balancer's VNI, the FIN too; the state C tracked is the connection's (C
    holds it)."""
    vm = VM[(1001, "10.0.1.5")]

    def from_vm(ep: str, flags: str) -> tuple[int, bytes]:
        return UL, vxlan("hv1", 1001, bytes(Ether(src=vm[0], dst="02:09:00:00:00:09") / IP(src="10.0.1.5", dst=ep)
                                            / TCP(sport=40000, dport=80, flags=flags) / b"x"))

    back = (EXT, bytes(Ether(src=SVC_MAC, dst=EXT_MAC) / IP(src=SVC, dst=SRC1)
                       / TCP(sport=80, dport=40000, flags="A") / b"y"))
    member = (UL, vxlan("hv2", PROVIDER_VNI, bytes(Ether(src="02:07:00:00:00:01", dst="02:09:00:00:00:50")
                                                   / IP(src=VIP, dst=PROVIDER_PORT)
                                                   / TCP(sport=80, dport=40000, flags="A") / b"z")))
    for ep in (EP, "10.0.1.10"):
        for flags in ("S", "A"):  # admitted (Python's), then established (C's)
            n, r = pair.step(*from_vm(ep, flags))
            assert n == r and len(n) == 1
    assert pair.dp.stats()["svc_out"] == 2 and all(c.established for c in pair.native.stage.conns.conns())
    punts = pair.dp.stats()["punt"]
    for _ in range(5):
        for frame in (from_vm(EP, "PA"), back, from_vm("10.0.1.10", "A"), member):
            n, r = pair.step(*frame)
            assert n == r and len(n) == 1
    st_ = pair.dp.stats()
    assert st_["punt"] == punts and st_["svc_out"] == 12 and st_["svc_in"] == 10
    out = Ether(pair.step(*from_vm(EP, "PA"))[0][0][1])
    assert (out[IP].src, out[IP].dst, out[TCP].sport) == (SRC1, SVC, 40000)
    n, r = pair.step(*from_vm(EP, "FA"))
    assert n == r and pair.dp.stats()["punt"] == punts
    assert table_state(pair.native.stage) == table_state(pair.ref.stage)  # closing, in both


def test_a_peered_vms_connection_stays_in_c_and_goes_back_in_its_vni(pair: Pair) -> None:
    def from_peer(flags: str) -> tuple[int, bytes]:
        return UL, vxlan("hv2", 1001, bytes(Ether(src=PEER_MAC, dst="02:09:00:00:00:09") / IP(src=PEER_VM, dst=EP)
                                            / TCP(sport=40000, dport=80, flags=flags) / b"x"))

    back = (EXT, bytes(Ether(src=SVC_MAC, dst=EXT_MAC) / IP(src=SVC, dst=SRC1)
                       / TCP(sport=80, dport=40000, flags="A") / b"y"))
    for flags in ("S", "A"):
        n, r = pair.step(*from_peer(flags))
        assert n == r and len(n) == 1
    punts = pair.dp.stats()["punt"]
    for _ in range(3):
        n, r = pair.step(*back)
        assert n == r and len(n) == 1
        reply = Ether(n[0][1])
        assert int.from_bytes(bytes(reply[UDP].payload)[4:7], "big") == PEER_VNI  # the VXLAN header's VNI
        inner = Ether(bytes(reply[UDP].payload)[8:])
        assert (inner.src, inner.dst, inner[IP].src, inner[IP].dst) == (R[PEER_VNI], PEER_MAC, EP, PEER_VM)
    assert pair.dp.stats()["punt"] == punts


def test_what_c_declines_is_decided_over_cs_own_connection(pair: Pair) -> None:
    """A connection C holds is C's alone: a packet of it that C declines (its TTL runs out here) is decided by the
    reference over the same connection, with a lookup and a write (two calls into C), and C's expiry ends it by
    the timeouts pushed down to it, in both stores alike."""
    vm = VM[(1001, "10.0.1.5")]

    def from_vm(flags: str, ttl: int = 64) -> tuple[int, bytes]:
        return UL, vxlan("hv1", 1001, bytes(Ether(src=vm[0], dst="02:09:00:00:00:09") / IP(src="10.0.1.5", dst=EP,
                                                                                        ttl=ttl)
                                            / TCP(sport=40000, dport=80, flags=flags) / b"x"))

    for flags in ("S", "A"):
        n, r = pair.step(*from_vm(flags))
        assert n == r and len(n) == 1
    calls = pair.dp.crossed["calls"]
    n, r = pair.step(*from_vm("PA", ttl=1))
    assert n == r == [] and pair.dp.crossed["calls"] - calls == 2
    assert table_state(pair.native.stage) == table_state(pair.ref.stage)
    assert len(pair.native.stage.conns) == len(pair.ref.stage.conns) == 1
    later = time.time() + 3601  # established: 3600 s idle
    assert pair.native.stage.expire(later) == pair.ref.stage.expire(later) == 1
    assert len(pair.native.stage.conns) == 0
