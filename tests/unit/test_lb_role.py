"""The load-balancer instance: sections become pools, a packet to a VIP goes to the member the pool's Maglev table
names (the same on every instance, whichever stage), weights shape the shares, drains end after their delay,
replies through the VIP's EIP leave with the EIP, and what is not for a listener is dropped and counted."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from scapy.layers.inet import IP, TCP, UDP

from nfv_gateways.core.instance import Instance
from nfv_gateways.core.options import GatewayOptions
from nfv_gateways.core.packet import ip2int
from nfv_gateways.native.dataplane import NativeDataPlane
from tests.unit.test_gateway_apply import Wire, arps_for
from tianji.inet import checksum
from tianji.served import LbListenerServed, LbMemberServed, LbServed
from tianji.southbound import Endpoint, GatewayConfig, GatewayVpc, Vtep

VIP, EIP = "10.1.0.100", "203.0.113.9"


def members(weights: dict[str, int], drain_until: float | None = None) -> list[LbMemberServed]:
    return [LbMemberServed(id=f"m{i}", ip=f"10.1.0.{10 + i}", weight=w, drain_until=drain_until if w == 0 else None)
            for i, w in sorted(weights.items())]


def config(revision: int, weights: dict[str, int], drain_until: float | None = None,
           eip: str | None = None) -> GatewayConfig:
    ms = members(weights, drain_until)
    return GatewayConfig(
        name="lb", revision=revision, vtep_ip="198.18.0.9",
        vpcs=[GatewayVpc(id="A", vni=1001, router_mac="0a:58:00:00:00:01")],
        endpoints=[Endpoint(port_id=m.id, vpc_id="A", vni=1001, ip=m.ip, mac=f"02:00:00:00:00:{10 + i:02x}",
                            host="hv1", vtep_ip="172.31.0.1") for i, m in enumerate(ms)],
        vteps=[Vtep(host="hv1", ip="172.31.0.1")], eips=[eip] if eip else [],
        lbs=[LbServed(id="lb1", vni=1001, vip=VIP, eip=eip, listeners=[
            LbListenerServed(protocol="tcp", port=80, idle_timeout_s=60, table_size=4099, members=ms),
            LbListenerServed(protocol="udp", port=53, idle_timeout_s=60, table_size=4099, members=ms)])])


def instance(tmp_path: Path, stage: str) -> Instance:
    """An instance with the Python reference (`python`), or the C connection table and Maglev of the native data
    plane (`native`: its memory-backed packet I/O, so no interface is needed)."""
    dp = NativeDataPlane("mem", "lb", "ul0", "ext0", b"\x02" + bytes(5), b"\x02" + bytes(4) + b"\x01",
                         ip2int("198.18.0.9")) if stage == "native" else None
    g = Instance(GatewayOptions(name="lb", controller="", token="", underlay_if="ul0", vtep_ip="198.18.0.9/24",
                                 external_if="ext0", fastpath="python", state_dir=tmp_path,
                                 macs=("02:00:00:00:01:01", "02:00:00:00:01:02")), "lb", dataplane=dp)
    g.packets.ext = Wire()  # what it announces on the external segment
    return g


def to_vip(sport: int, proto: str = "tcp", dst: str = VIP, dport: int = 80, src: str = "10.1.0.2") -> bytearray:
    l4 = TCP(sport=sport, dport=dport, flags="S") if proto == "tcp" else UDP(sport=sport, dport=dport)
    return bytearray(bytes(IP(src=src, dst=dst) / l4))


def pick(g: Instance, sport: int, **kw) -> str | None:
    v = g.stage.outbound(1001, to_vip(sport, **kw), time.time())
    return None if v is None else f"10.1.0.{v.ip & 0xFF}"


@pytest.mark.parametrize("fastpath", ["python", "native"])
def test_weights_shape_the_shares_and_every_stage_picks_alike(tmp_path: Path, fastpath: str) -> None:
    g = instance(tmp_path, fastpath)
    g.apply(config(1, {1: 1, 2: 2, 3: 3}))
    shares = Counter(pick(g, s) for s in range(20000, 26000))
    assert set(shares) == {"10.1.0.11", "10.1.0.12", "10.1.0.13"}
    for ip, w in (("10.1.0.11", 1), ("10.1.0.12", 2), ("10.1.0.13", 3)):
        assert abs(shares[ip] / 6000 - w / 6) < 0.05, shares
    other = instance(tmp_path, "python" if fastpath == "native" else "native")  # another instance, another stage
    other.apply(config(1, {1: 1, 2: 2, 3: 3}))
    assert all(pick(other, s) == pick(g, s) for s in range(20000, 20500))


def test_established_connections_keep_their_member_and_drains_end_after_the_delay(tmp_path: Path) -> None:
    g = instance(tmp_path, "native")
    g.apply(config(1, {1: 1, 2: 1}))
    before = {s: pick(g, s) for s in range(30000, 30400)}
    g.apply(config(2, {1: 1, 2: 1, 3: 1}))  # a member joins: known connections stay
    assert all(pick(g, s) == m for s, m in before.items())
    g.apply(config(3, {1: 1, 2: 0, 3: 1}, drain_until=time.time() + 30))  # m2 drains
    assert all(pick(g, s) == m for s, m in before.items())  # ... its connections go on
    assert all(pick(g, s) != "10.1.0.12" for s in range(40000, 40400))  # ... and gets no new ones
    g.apply(config(4, {1: 1, 2: 0, 3: 1}, drain_until=time.time() - 1))  # the delay passed
    g.role.expire(time.time())
    assert all(pick(g, s) != "10.1.0.12" for s in before)


def test_udp_listener_and_what_is_not_for_a_listener(tmp_path: Path) -> None:
    g = instance(tmp_path, "native")
    g.apply(config(1, {1: 1}))
    assert pick(g, 5000, proto="udp", dport=53) == "10.1.0.11"
    assert pick(g, 5000, dport=81) is None
    assert pick(g, 5000, dst="10.1.0.101") is None
    assert g.stage.outbound(1001, bytearray(b"\x45garbage"), time.time()) is None
    assert g.stage.outbound(1002, to_vip(5000), time.time()) is None  # another VPC with the same VIP address
    c = g.stage.counters
    assert c["drop_no_listener"] == 3 and c["drop_malformed"] == 1


@pytest.mark.parametrize("stage", ["python", "native"])
def test_the_eip_brings_internet_clients_in_and_replies_leave_with_it(tmp_path: Path, stage: str) -> None:
    g = instance(tmp_path, stage)
    g.apply(config(1, {1: 1}, eip=EIP))
    buf = to_vip(7000, src="198.51.100.1", dst=EIP)
    v = g.stage.inbound(buf, time.time())
    assert v is not None and v.direction == "in" and v.ip == ip2int("10.1.0.11")
    assert IP(bytes(buf)).dst == VIP and checksum(bytes(buf[:20])) == 0
    reply = bytearray(bytes(IP(src=VIP, dst="198.51.100.1") / TCP(sport=80, dport=7000, flags="SA")))
    v = g.stage.outbound(1001, reply, time.time())
    assert v is not None and v.direction == "out" and IP(bytes(reply)).src == EIP
    assert g.eips == [EIP] and g.counters["gratuitous_arps"] == 1  # the EIP is announced
    if stage == "python":  # (the native data plane sends it on its own port)
        assert arps_for(g.packets.ext.frames()) == [EIP]


def test_metrics_show_the_connection_table(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    g = instance(tmp_path, "native")
    g.apply(config(1, {1: 1}))
    pick(g, 5000)
    families = {f.name: f for f in text_string_to_metric_families(g.metrics().decode())}
    assert [s.value for s in families["tianji_gateway_lb_connections"].samples] == [1.0]
    assert [s.value for s in families["tianji_gateway_lb_pools"].samples] == [2.0]
    got = {s.labels["counter"]: s.value for s in families["tianji_gateway_lb"].samples if s.name.endswith("_total")}
    assert got["new"] == 1.0 and got["to_member"] == 1.0
