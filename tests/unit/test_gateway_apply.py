"""A gateway instance applies only what changed: the same config again (another revision) touches nothing and
announces nothing; a new EIP is announced once (and once more after the ARP locktime); NAT mappings of a VPC
whose rules did not change survive another VPC's rule change."""

from __future__ import annotations

import socket
from pathlib import Path

from scapy.layers.inet import IP, UDP

from nfv_gateways.core.instance import Instance
from nfv_gateways.core.options import GatewayOptions
from nfv_gateways.core.packet import ip2int
from nfv_gateways.roles.nat.reference import PROTO_UDP
from tianji.southbound import Endpoint, GatewayConfig, GatewayVpc, SnatInfo, Vtep


class Wire:
    """The external port: a real AF_UNIX datagram pair, so the frames the gateway sends can be read back."""

    def __init__(self) -> None:
        self.a, self.b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.b.setblocking(False)

    def send(self, frame: bytes) -> None:
        self.a.send(frame)

    def frames(self) -> list[bytes]:
        out = []
        while True:
            try:
                out.append(self.b.recv(65536))
            except BlockingIOError:
                return out


def config(revision: int, eips: list[str], snat_b: str = "10.2.0.0/16") -> GatewayConfig:
    return GatewayConfig(
        name="gw", revision=revision, vtep_ip="198.18.0.1",
        vpcs=[GatewayVpc(id="A", vni=1001, router_mac="0a:58:00:00:00:01",
                         snat=[SnatInfo(cidr="10.1.0.0/16", eips=["203.0.113.1"])]),
              GatewayVpc(id="B", vni=1002, router_mac="0a:58:00:00:00:02",
                         snat=[SnatInfo(cidr=snat_b, eips=["203.0.113.2"])])],
        endpoints=[Endpoint(port_id="p", vpc_id="A", vni=1001, ip="10.1.0.5", mac="02:00:00:00:00:05", host="hv1",
                            vtep_ip="172.31.0.1")],
        eips=eips, vteps=[Vtep(host="hv1", ip="172.31.0.1")])


def gateway(tmp_path: Path) -> tuple[Instance, Wire]:
    g = Instance(GatewayOptions(name="gw", controller="", token="", underlay_if="ul0", vtep_ip="198.18.0.1/24",
                                external_if="ext0", fastpath="python", state_dir=tmp_path,
                                macs=("02:00:00:00:01:01", "02:00:00:00:01:02")), "nat")
    w = Wire()
    g.packets.ext = w
    return g, w


def arps_for(frames: list[bytes]) -> list[str]:
    return [socket.inet_ntoa(f[28:32]) for f in frames if f[12:14] == b"\x08\x06"]


def test_same_config_again_touches_nothing(tmp_path: Path) -> None:
    g, w = gateway(tmp_path)
    g.apply(config(1, ["203.0.113.1", "203.0.113.2"]))
    assert sorted(arps_for(w.frames())) == ["203.0.113.1", "203.0.113.2"]
    before = dict(g.counters)
    g.apply(config(2, ["203.0.113.1", "203.0.113.2"]))
    assert w.frames() == []
    assert g.counters["config_nat_applies"] == before["config_nat_applies"] == 1
    assert g.counters.get("config_endpoint_applies", 0) == before.get("config_endpoint_applies", 0)
    g.apply(config(3, ["203.0.113.1", "203.0.113.2", "203.0.113.3"]))
    assert arps_for(w.frames()) == ["203.0.113.3"]  # only the newly homed one
    assert [e for _, e in g.garp_again] == [["203.0.113.1", "203.0.113.2"], ["203.0.113.3"]]


def test_a_rule_change_in_one_vpc_keeps_the_others_mappings(tmp_path: Path) -> None:
    g, _ = gateway(tmp_path)
    g.apply(config(1, ["203.0.113.1", "203.0.113.2"]))
    t = g.stage
    for vni, src in ((1001, "10.1.0.5"), (1002, "10.2.0.5")):
        pkt = bytearray(bytes(IP(src=src, dst="192.0.2.9") / UDP(sport=5000, dport=53) / b"q"))
        assert t.outbound(vni, pkt, 0.0).direction == "out"
    assert sorted(m.vni for m in t.store.mappings()) == [1001, 1002]
    a_mapping = t.store.find_in(1001, ip2int("10.1.0.5"), 5000, PROTO_UDP)
    g.apply(config(2, ["203.0.113.1", "203.0.113.2"], snat_b="10.3.0.0/16"))  # B's rule no longer covers it
    assert [m.inside for m in t.store.mappings()] == [(1001, ip2int("10.1.0.5"), 5000, PROTO_UDP)]
    assert t.store.find_in(1001, ip2int("10.1.0.5"), 5000, PROTO_UDP) == a_mapping  # A's flow untouched


def test_sections_applied_one_by_one_equal_the_whole_config(tmp_path: Path) -> None:
    """An instance fed deltas (one VPC's section at a time, sections going away) ends in the state a whole config
    gives: the same NAT rules, endpoints and router MACs; a section's change touches only its VPC's parts."""
    from tianji.southbound import GatewayConfigDelta, GatewayHeld, GatewaySection, NatSection, apply_gateway_delta

    def section(v: int, ports: int, cidr: str = "10.0.0.0/16") -> GatewaySection:
        vid = f"V{v}"
        return NatSection(
            vpc=GatewayVpc(id=vid, vni=2000 + v, router_mac=f"0a:58:00:00:00:{v:02x}",
                           snat=[SnatInfo(cidr=cidr, eips=[f"203.0.113.{v}"])]),
            endpoints=[Endpoint(port_id=f"p{v}.{i}", vpc_id=vid, vni=2000 + v, ip=f"10.0.0.{i + 2}",
                                mac=f"02:00:00:00:{v:02x}:{i:02x}", host="hv1", vtep_ip="172.31.0.1")
                       for i in range(ports)], eips=[f"203.0.113.{v}"])

    incremental, _ = gateway(tmp_path / "a")
    held = GatewayHeld()
    steps = [[section(1, 2), section(2, 3)], [section(2, 4)], [section(3, 1)], [section(1, 2, "10.0.1.0/24")]]
    ids: set[str] = set()
    for rev, secs in enumerate(steps, 1):
        ids |= {s.vpc.id for s in secs}
        if rev == 3:
            ids.discard("V2")  # V2's NAT gateway went
        d = GatewayConfigDelta(name="gw", revision=rev, base=rev - 1 if rev > 1 else -1, vpc_ids=sorted(ids),
                               sections=secs, vteps=[Vtep(host="hv1", ip="172.31.0.1")] if rev == 1 else None)
        out = apply_gateway_delta(held, d)
        assert out is not None
        held, changed = out
        assert changed == {s.vpc.id for s in secs} | ({"V2"} if rev == 3 else set())
        incremental.apply_sections(held, changed)
    whole, _ = gateway(tmp_path / "b")
    whole.apply(held.config())
    assert incremental.role.table.vpcs == whole.role.table.vpcs and incremental.fwd.endpoints == whole.fwd.endpoints
    assert incremental.fwd.router_mac == whole.fwd.router_mac and sorted(incremental.fwd.router_mac) == [2001, 2003]
    assert apply_gateway_delta(held, d.model_copy(update={"base": 1})) is None  # not on what is held


def test_metrics_are_prometheus_exposition_with_help_and_type(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    g, _ = gateway(tmp_path)
    g.counters["rx_ext"] += 7
    text = g.metrics().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["tianji_gateway_mappings"].type == "gauge"
    assert families["tianji_gateway_packets"].type == "counter" and families["tianji_gateway_packets"].documentation
    got = {(s.labels["counter"], s.value) for s in families["tianji_gateway_packets"].samples
           if s.name.endswith("_total")}
    assert ("rx_ext", 7.0) in got
    assert "# HELP tianji_gateway_mappings " in text and "# TYPE tianji_gateway_nat_total counter" in text


def test_an_instance_beats_as_often_as_the_controller_asks(tmp_path: Path, monkeypatch) -> None:
    """Without --beat-interval the instance beats at the pace each answer names (a fifth of the controller's
    gateway silence); with it, at its own."""
    import time as real_time
    import types

    from nfv_gateways.core import instance as instance_mod

    class Stop(Exception):
        pass

    def run(g: Instance, answers: list[float]) -> list[float]:
        slept: list[float] = []

        def sleep(s: float) -> None:
            slept.append(s)
            if len(slept) == len(answers):
                raise Stop

        beats = iter(answers)
        g.api = types.SimpleNamespace(register=lambda *a: None, beat=lambda *a, **k: {"beat_every": next(beats)})
        monkeypatch.setattr(instance_mod, "time", types.SimpleNamespace(sleep=sleep, time=real_time.time,
                                                                        monotonic=real_time.monotonic))
        try:
            g.heartbeat_loop()
        except Stop:
            pass
        return slept

    g, _ = gateway(tmp_path)
    assert run(g, [0.4, 0.4, 0.1]) == [0.4, 0.4, 0.1]
    g.o.beat_interval = 0.25
    assert run(g, [0.4, 0.1]) == [0.25, 0.25]
