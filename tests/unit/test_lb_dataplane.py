"""The load balancer's native data plane (dp_lb.c, memory backend) against the pure-Python instance, frame for
frame: new and established connections are decided in C (no punt), what is not for a listener, malformed or
fragmented goes to the same Python code, and every frame gives the same output bytes on both; the connection
tables end up holding the same connections."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether

from nfv_gateways.core.instance import EXT, UL, GatewayOptions, Instance
from nfv_gateways.core.packet import ip2int
from nfv_gateways.native.dataplane import NativeDataPlane
from tests.support.frames import PythonFrames, lab_options
from tianji.southbound import GatewayConfig

UL_MAC, EXT_MAC = "02:aa:00:00:00:01", "02:aa:00:00:00:02"
VTEP = "172.31.0.111"
HV = {"hv1": ("172.31.0.11", "02:bb:00:00:00:11"), "hv2": ("172.31.0.12", "02:bb:00:00:00:12")}
R1, R2 = "02:00:00:00:10:01", "02:00:00:00:10:02"
VIP, EIP = "10.0.1.100", "203.0.113.7"
INTERNET = {"198.51.100.1": "02:cc:00:00:00:01", "198.51.100.2": "02:cc:00:00:00:02"}
MEMBERS = {(1001, "10.0.1.5"): ("02:01:00:00:00:05", "hv1"), (1001, "10.0.1.6"): ("02:01:00:00:00:06", "hv2"),
           (1002, "10.0.1.5"): ("02:02:00:00:00:05", "hv2")}


def config() -> GatewayConfig:
    eps = [{"port_id": f"p{i}", "vpc_id": f"v{vni}", "vni": vni, "ip": ip, "mac": mac, "host": h,
            "vtep_ip": HV[h][0]} for i, ((vni, ip), (mac, h)) in enumerate(MEMBERS.items())]

    def members(vni: int) -> list[dict]:
        return [{"id": f"m{vni}-{ip}", "ip": ip, "weight": 1} for (v, ip) in MEMBERS if v == vni]

    def listeners(vni: int) -> list[dict]:
        return [{"protocol": "tcp", "port": 80, "idle_timeout_s": 60, "table_size": 251, "members": members(vni)},
                {"protocol": "udp", "port": 53, "idle_timeout_s": 60, "table_size": 251, "members": members(vni),
                 "algorithm": "source_ip"}]

    return GatewayConfig.model_validate({
        "name": "t", "revision": 1, "vtep_ip": VTEP, "endpoints": eps,
        "vpcs": [{"id": "v1001", "vni": 1001, "router_mac": R1}, {"id": "v1002", "vni": 1002, "router_mac": R2}],
        "lbs": [{"id": f"lb{vni}", "vni": vni, "vip": VIP, "listeners": listeners(vni),
                 "eip": EIP if vni == 1001 else None} for vni in (1001, 1002)], "eips": [EIP],
        "vteps": [{"host": h, "ip": v[0]} for h, v in HV.items()]})


def options(tmp: Path) -> GatewayOptions:
    return lab_options(tmp, VTEP, (UL_MAC, EXT_MAC))


class Pair:
    def __init__(self, tmp: Path) -> None:
        mac = lambda m: bytes.fromhex(m.replace(":", ""))  # noqa: E731
        self.dp = NativeDataPlane("mem", "t", "ul0", "ext0", mac(UL_MAC), mac(EXT_MAC), ip2int(VTEP))
        self.native = Instance(options(tmp), "lb", dataplane=self.dp)
        self.ref_dp = PythonFrames()
        self.ref = Instance(options(tmp), "lb", dataplane=self.ref_dp)
        for g in (self.native, self.ref):
            g.apply(config())
        self.drain()
        for h in HV.values():  # the hypervisors' VTEPs are resolved
            frame = bytes(Ether(src=h[1], dst=UL_MAC) / ARP(op=2, hwsrc=h[1], psrc=h[0], hwdst=UL_MAC, pdst=VTEP))
            self.step(frame)
        ip, m = next(iter(INTERNET.items()))  # one internet client is resolved, the other is learnt by ARP
        self.step(bytes(Ether(src=m, dst=EXT_MAC) / ARP(op=2, hwsrc=m, psrc=ip, hwdst=EXT_MAC, pdst=EIP)), EXT)

    def drain(self) -> tuple[list, list]:
        self.dp.poll()
        native = self.dp.mem_pop()
        ref, self.ref_dp.out = self.ref_dp.out, []
        return native, ref

    def step(self, frame: bytes, port: int = UL) -> tuple[list, list, int]:
        """(native output, reference output, frames the native loop punted)"""
        self.dp.mem_push(port, frame)
        self.dp.poll()
        punted = self.dp.punt(0)
        for p, f in punted:
            self.native.packets.handle_punt(p, f)
        self.dp.poll()  # sends what Python injected meanwhile
        native = self.dp.mem_pop()
        self.ref.packets.handle_punt(port, frame)
        ref, self.ref_dp.out = self.ref_dp.out, []
        return native, ref, len(punted)

    def close(self) -> None:
        self.dp.close()


def frame(hv: str, vni: int, src: str, dst: str, proto: str, sport: int, dport: int, frag: int = 0,
          flags: str = "S") -> bytes:
    l4 = TCP(sport=sport, dport=dport, flags=flags) if proto == "tcp" else UDP(sport=sport, dport=dport) / b"q"
    return bytes(Ether(src=HV[hv][1], dst=UL_MAC) / IP(src=HV[hv][0], dst=VTEP) / UDP(sport=50000, dport=4789)
                 / (b"\x08\0\0\0" + vni.to_bytes(3, "big") + b"\0") / Ether(src="02:01:00:00:00:77", dst=R1)
                 / IP(src=src, dst=dst, frag=frag) / l4)


@pytest.fixture()
def pair(tmp_path: Path):
    p = Pair(tmp_path)
    yield p
    p.close()


def test_new_and_established_connections_are_decided_in_c(pair: Pair) -> None:
    for sport in range(30000, 30200):
        native, ref, punted = pair.step(frame("hv1", 1001, "10.0.1.50", VIP, "tcp", sport, 80))
        assert punted == 0 and native == ref and len(native) == 1
        again, ref, punted = pair.step(frame("hv1", 1001, "10.0.1.50", VIP, "tcp", sport, 80, flags="A"))
        assert punted == 0 and again == ref and again[0][1][:64] == native[0][1][:64]  # the same member
    inner = Ether(native[0][1])[UDP].payload
    assert bytes(inner)[8:14] in (bytes.fromhex("020100000005"), bytes.fromhex("020100000006"))
    assert pair.dp.stats()["lb_to_member"] == 400 and pair.native.stage.conns.held() == 200


frames = st.builds(frame, st.sampled_from(["hv1", "hv2"]), st.sampled_from([1001, 1002, 1003]),
                   st.sampled_from(["10.0.1.50", "10.0.1.51"]), st.sampled_from([VIP, "10.0.1.101"]),
                   st.sampled_from(["tcp", "udp"]), st.integers(1024, 1100), st.sampled_from([80, 53, 81]),
                   st.sampled_from([0, 0, 0, 3]))


def external(src: str, dst: str, proto: str, sport: int, dport: int, bad: bool) -> tuple[bytes, int]:
    l4 = TCP(sport=sport, dport=dport, flags="S") if proto == "tcp" else UDP(sport=sport, dport=dport) / b"q"
    f = bytes(Ether(src=INTERNET[src], dst=EXT_MAC) / IP(src=src, dst=dst) / l4)
    return (f[:-3] if bad else f), EXT


def reply(hv: str, sport: int, dst: str, proto: str) -> tuple[bytes, int]:
    """A member's reply from VIP:sport to an internet client, routed to this instance by its vSwitch."""
    l4 = TCP(sport=sport, dport=7000, flags="SA") if proto == "tcp" else UDP(sport=sport, dport=7000) / b"r"
    return bytes(Ether(src=HV[hv][1], dst=UL_MAC) / IP(src=HV[hv][0], dst=VTEP) / UDP(sport=50000, dport=4789)
                 / (b"\x08\0\0\0" + (1001).to_bytes(3, "big") + b"\0") / Ether(src=R1, dst=R1)
                 / IP(src=VIP, dst=dst) / l4), UL


def test_internet_clients_through_the_eip_in_c(pair: Pair) -> None:
    for sport in range(7000, 7050):
        native, ref, punted = pair.step(*external("198.51.100.1", EIP, "tcp", sport, 80, False))
        assert punted == 0 and native == ref and len(native) == 1
        assert IP(bytes(Ether(native[0][1])[UDP].payload)[8 + 14:]).dst == VIP
    native, ref, punted = pair.step(*reply("hv1", 80, "198.51.100.1", "tcp"))
    assert punted == 0 and native == ref and native[0][0] == EXT and IP(native[0][1][14:]).src == EIP


ul_or_ext = st.one_of(
    st.builds(lambda f: (f, UL), frames),
    st.builds(external, st.sampled_from(list(INTERNET)), st.sampled_from([EIP, "203.0.113.8"]),
              st.sampled_from(["tcp", "udp"]), st.integers(7000, 7010), st.sampled_from([80, 53, 81]),
              st.sampled_from([False, False, True])),
    st.builds(reply, st.sampled_from(["hv1", "hv2"]), st.sampled_from([80, 53, 81]), st.sampled_from(list(INTERNET)),
              st.sampled_from(["tcp", "udp"])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=st.lists(ul_or_ext, min_size=1, max_size=25))
def test_every_frame_gives_the_same_output_as_the_python_instance(pair: Pair, seq: list[tuple[bytes, int]]) -> None:
    for f, port in seq:
        native, ref, _ = pair.step(f, port)
        assert native == ref, Ether(f).summary()
    assert pair.native.stage.conns.held() == len(pair.ref.stage.conns.conns)
    pair.native.stage.expire(time.time() + 3600)
    pair.ref.stage.expire(time.time() + 3600)
