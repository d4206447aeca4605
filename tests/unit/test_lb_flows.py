"""A load balancer's flows, walked by the in-memory OpenFlow model: the client side steers a VIP's flows over the
instances, the member's host translates VIP:port to the member with conntrack and back, tenants stay apart."""

from __future__ import annotations

from tests.unit.test_flows import MAC, OF, RA, TUN, config, ip_pkt
from tianji.southbound import HostConfig, LbBackendInfo, LbListenerInfo, LbVipInfo, Vtep
from vswitch_agent.flows import compute_flows
from vswitch_agent.lb_flows import lb_zone_key
from vswitch_agent.ofmodel import Switch

VIP, VIP_MAC = "10.0.1.50", "02:00:00:00:00:fe"
INSTANCES = ["192.0.2.11", "192.0.2.12"]
ZONES = {"A": 1, "C": 2, lb_zone_key("a2"): 3}


def lb_config(instances: list[str] = INSTANCES) -> HostConfig:
    """hv1 holds client a1 and member a2 of VPC A's load balancer; member a3 is on hv2."""
    cfg = config(peered=False)
    lb = LbVipInfo(id="lb1", vip=VIP, mac=VIP_MAC, instance_vteps=instances, listeners=[
        LbListenerInfo(protocol="tcp", port=80, backends=[
            LbBackendInfo(port_id="a2", ip="10.0.2.2", mac=MAC["a2"], port=8080),
            LbBackendInfo(port_id="a3", ip="10.0.1.3", mac=MAC["a3"], port=8080)]),
        LbListenerInfo(protocol="udp", port=53, backends=[
            LbBackendInfo(port_id="a2", ip="10.0.2.2", mac=MAC["a2"], port=5353)])])
    vpcs = [v.model_copy(update={"load_balancers": [lb]}) if v.id == "A" else v for v in cfg.vpcs]
    vteps = cfg.vteps + [Vtep(host=f"lb{i}", ip=ip, kind="gateway") for i, ip in enumerate(INSTANCES)]
    return cfg.model_copy(update={"vpcs": vpcs, "vteps": vteps})


def switch(cfg: HostConfig | None = None) -> Switch:
    return Switch(compute_flows(cfg or lb_config(), OF, TUN, ZONES))


def test_a_flow_to_the_vip_is_hashed_over_the_instances_in_the_vpcs_vni() -> None:
    sw = switch()
    seen = set()
    for sport in range(40000, 40064):
        out = sw.inject(ip_pkt("a1", "10.0.1.2", VIP, VIP_MAC, sport=sport))
        assert len(out) == 1
        port, pkt = out[0]
        assert port == TUN and pkt["tunnel_id"] == 1001 and pkt["ipv4_dst"] == VIP and pkt["ipv4_src"] == "10.0.1.2"
        seen.add(pkt["tun_ipv4_dst"])
        again = sw.inject(ip_pkt("a1", "10.0.1.2", VIP, VIP_MAC, sport=sport))
        assert again[0][1]["tun_ipv4_dst"] == pkt["tun_ipv4_dst"]  # a flow keeps its instance
    assert seen == set(INSTANCES)


def test_arp_for_the_vip_is_answered_with_its_mac() -> None:
    sw = switch()
    out = sw.inject({"in_port": OF["a1"], "eth_src": MAC["a1"], "eth_dst": "ff:ff:ff:ff:ff:ff", "eth_type": 0x0806,
                     "arp_op": 1, "arp_spa": "10.0.1.2", "arp_sha": MAC["a1"], "arp_tpa": VIP})
    assert out and out[0][1]["arp_sha"] == int(VIP_MAC.replace(":", ""), 16)


def from_instance(src: str, dst_mac: str, proto: int = 6, dport: int = 80, sport: int = 41000) -> dict:
    pkt = {"in_port": TUN, "tun_ipv4_src": INSTANCES[1], "tunnel_id": 1001, "eth_src": RA, "eth_dst": dst_mac,
           "eth_type": 0x0800, "ipv4_src": src, "ipv4_dst": VIP, "ip_proto": proto, "ttl": 63}
    return pkt | ({"tcp_src": sport, "tcp_dst": dport} if proto == 6 else {"udp_src": sport, "udp_dst": dport})


def test_the_members_host_translates_to_the_member_keeping_the_clients_address_and_back() -> None:
    sw = switch()
    out = sw.inject(from_instance("10.0.1.3", MAC["a2"]))
    assert [(p, x["ipv4_src"], x["ipv4_dst"], x["tcp_dst"]) for p, x in out] == [(OF["a2"], "10.0.1.3", "10.0.2.2",
                                                                                 8080)]
    reply = ip_pkt("a2", "10.0.2.2", "10.0.1.3", RA, sport=8080, dport=41000)
    back = sw.inject(reply)
    assert [(p, x["ipv4_src"], x["tcp_src"], x["tun_ipv4_dst"]) for p, x in back] == [(TUN, VIP, 80, "192.0.2.2")]


def test_udp_listener_replies_come_from_the_vip() -> None:
    sw = switch()
    out = sw.inject(from_instance("10.0.1.3", MAC["a2"], proto=17, dport=53))
    assert [(p, x["ipv4_dst"], x["udp_dst"]) for p, x in out] == [(OF["a2"], "10.0.2.2", 5353)]
    back = sw.inject(ip_pkt("a2", "10.0.2.2", "10.0.1.3", RA, proto=17, sport=5353, dport=41000))
    assert [(x["ipv4_src"], x["udp_src"]) for _, x in back] == [(VIP, 53)]


def test_vip_traffic_for_no_member_here_or_no_listener_is_dropped() -> None:
    sw = switch()
    assert sw.inject(from_instance("10.0.1.3", MAC["a1"])) == []  # a1 is no member
    assert sw.inject(from_instance("10.0.1.3", MAC["a2"], dport=81)) == []  # no listener on 81
    assert sw.inject(from_instance("10.0.1.3", MAC["a3"])) == []  # a3 is a member, not on this host


def test_a_member_serving_directly_is_untouched() -> None:
    """A client reaching the member's own address: no translation, replies keep the member's address."""
    sw = switch()
    out = sw.inject(ip_pkt("a1", "10.0.1.2", "10.0.2.2", RA, dport=8080))
    assert [(p, x["ipv4_dst"]) for p, x in out] == [(OF["a2"], "10.0.2.2")]
    back = sw.inject(ip_pkt("a2", "10.0.2.2", "10.0.1.2", RA, sport=8080))
    assert [(p, x["ipv4_src"], x["tcp_src"]) for p, x in back] == [(OF["a1"], "10.0.2.2", 8080)]


def test_another_tenant_with_the_same_vip_address_reaches_nothing() -> None:
    sw = switch()
    assert sw.inject(ip_pkt("c1", "10.0.1.2", VIP, VIP_MAC)) == []
    bad = from_instance("10.0.1.3", MAC["a2"]) | {"tunnel_id": 1003}
    assert sw.inject(bad) == []


def test_no_instance_drops_instead_of_leaking() -> None:
    sw = switch(lb_config(instances=[]))
    assert sw.inject(ip_pkt("a1", "10.0.1.2", VIP, VIP_MAC)) == []


def test_the_incremental_engine_arrives_at_the_reference() -> None:
    from vswitch_agent.engine import FlowEngine

    eng = FlowEngine()
    eng.update(config(peered=False), OF, TUN, ZONES, None)
    for cfg in (lb_config(), lb_config(instances=INSTANCES[:1]), config(peered=False)):
        eng.update(cfg, OF, TUN, ZONES, {"A"})
        assert set(eng.desired.values()) == compute_flows(cfg, OF, TUN, ZONES)


def test_a_flow_moved_to_another_member_on_the_same_host_reaches_it() -> None:
    """Each member translates in its own zone: a 5-tuple an instance moves from a2 to a1 (both here) must not meet
    a2's translation, which outlives the instance's decision."""
    cfg = lb_config()
    both = [LbBackendInfo(port_id=p, ip=ip, mac=MAC[p], port=8080) for p, ip in (("a1", "10.0.1.2"),
                                                                                ("a2", "10.0.2.2"))]
    lb = cfg.vpcs[0].load_balancers[0]
    lb = lb.model_copy(update={"listeners": [lb.listeners[0].model_copy(update={"backends": both})]})
    cfg = cfg.model_copy(update={"vpcs": [v.model_copy(update={"load_balancers": [lb]}) if v.id == "A" else v
                                          for v in cfg.vpcs]})
    sw = Switch(compute_flows(cfg, OF, TUN, ZONES | {lb_zone_key("a1"): 4}))
    first = sw.inject(from_instance("10.0.1.3", MAC["a2"]))
    moved = sw.inject(from_instance("10.0.1.3", MAC["a1"]))
    assert [(p, x["ipv4_dst"]) for p, x in first] == [(OF["a2"], "10.0.2.2")]
    assert [(p, x["ipv4_dst"]) for p, x in moved] == [(OF["a1"], "10.0.1.2")]
