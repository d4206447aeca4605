"""The flow computation, walked by the in-memory OpenFlow model: every table and feature, no OVS."""

from __future__ import annotations

import pytest

from tianji.southbound import (
    Endpoint,
    HostConfig,
    PortInfo,
    RouteInfo,
    SecurityGroupInfo,
    SecurityGroupRuleInfo,
    SubnetInfo,
    VpcInfo,
    Vtep,
)
from vswitch_agent import pipeline as P
from vswitch_agent.actions import Output
from vswitch_agent.flows import compute_flows, port_masks
from vswitch_agent.ofmodel import CONTROLLER, Switch

TUN = 100
RA, RP, RC = "0a:58:00:00:03:e9", "0a:58:00:00:03:ea", "0a:58:00:00:03:eb"
MAC = {"a1": "02:00:00:00:00:a1", "a2": "02:00:00:00:00:a2", "a3": "02:00:00:00:00:a3",
       "p1": "02:00:00:00:00:b1", "c1": "02:00:00:00:00:c1", "q1": "02:00:00:00:00:d1"}
OF = {"a1": 1, "a2": 2, "c1": 3}
ZONES = {"A": 1, "C": 2}


def sg_rules(extra: list[SecurityGroupRuleInfo]) -> SecurityGroupInfo:
    return SecurityGroupInfo(id="sgA", vpc_id="A", rules=[
        SecurityGroupRuleInfo(id=1, direction="egress", protocol="any", remote_cidrs=["0.0.0.0/0"]),
        SecurityGroupRuleInfo(id=2, direction="ingress", protocol="any",
                              remote_cidrs=["10.0.1.2/32", "10.0.2.2/32", "10.0.1.3/32"]),
        *extra])


WEB_FROM_PEER = SecurityGroupRuleInfo(id=10, direction="ingress", protocol="tcp", port_range_min=80,
                                      port_range_max=80, remote_cidrs=["10.7.0.0/16"])


def config(extra_rules: list[SecurityGroupRuleInfo] | None = None, peered: bool = True) -> HostConfig:
    a_routes = [RouteInfo(destination="10.0.0.0/16", target_type="local")]
    if peered:
        a_routes.append(RouteInfo(destination="10.7.0.0/16", target_type="peering", target_id="pc1", peer_vpc_id="P"))
    vpcs = [
        VpcInfo(id="A", tenant_id="t1", vni=1001, cidr="10.0.0.0/16", router_mac=RA, routes=a_routes,
                subnets=[SubnetInfo(id="sA1", cidr="10.0.1.0/24", gateway_ip="10.0.1.1"),
                         SubnetInfo(id="sA2", cidr="10.0.2.0/24", gateway_ip="10.0.2.1")]),
        VpcInfo(id="C", tenant_id="t2", vni=1003, cidr="10.0.0.0/16", router_mac=RC,
                routes=[RouteInfo(destination="10.0.0.0/16", target_type="local")],
                subnets=[SubnetInfo(id="sC1", cidr="10.0.1.0/24", gateway_ip="10.0.1.1")]),
    ]
    if peered:
        vpcs.append(VpcInfo(id="P", tenant_id="t1", vni=1002, cidr="10.7.0.0/16", router_mac=RP,
                            subnets=[SubnetInfo(id="sP", cidr="10.7.0.0/24", gateway_ip="10.7.0.1")]))
    eps = [
        Endpoint(port_id="a1", vpc_id="A", vni=1001, ip="10.0.1.2", mac=MAC["a1"], host="hv1", vtep_ip="192.0.2.1"),
        Endpoint(port_id="a2", vpc_id="A", vni=1001, ip="10.0.2.2", mac=MAC["a2"], host="hv1", vtep_ip="192.0.2.1"),
        Endpoint(port_id="a3", vpc_id="A", vni=1001, ip="10.0.1.3", mac=MAC["a3"], host="hv2", vtep_ip="192.0.2.2"),
        Endpoint(port_id="c1", vpc_id="C", vni=1003, ip="10.0.1.2", mac=MAC["c1"], host="hv1", vtep_ip="192.0.2.1"),
    ]
    if peered:
        eps.append(Endpoint(port_id="p1", vpc_id="P", vni=1002, ip="10.7.0.2", mac=MAC["p1"], host="hv2",
                            vtep_ip="192.0.2.2"))
    return HostConfig(
        host="hv1", revision=7, vtep_ip="192.0.2.1",
        ports=[PortInfo(id="a1", vpc_id="A", subnet_id="sA1", mac=MAC["a1"], ip="10.0.1.2", security_group_ids=["sgA"],
                        gateway_ip="10.0.1.1"),
               PortInfo(id="a2", vpc_id="A", subnet_id="sA2", mac=MAC["a2"], ip="10.0.2.2", security_group_ids=["sgA"],
                        gateway_ip="10.0.2.1"),
               PortInfo(id="c1", vpc_id="C", subnet_id="sC1", mac=MAC["c1"], ip="10.0.1.2",
                        security_group_ids=["sgC"], gateway_ip="10.0.1.1")],
        vpcs=vpcs, endpoints=eps,
        security_groups=[sg_rules(extra_rules or []),
                         SecurityGroupInfo(id="sgC", vpc_id="C", rules=[
                             SecurityGroupRuleInfo(id=5, direction="egress", protocol="any",
                                                   remote_cidrs=["0.0.0.0/0"]),
                             SecurityGroupRuleInfo(id=6, direction="ingress", protocol="any",
                                                   remote_cidrs=["0.0.0.0/0"])])],
        vteps=[Vtep(host="hv1", ip="192.0.2.1"), Vtep(host="hv2", ip="192.0.2.2")])


def switch(cfg: HostConfig | None = None) -> Switch:
    return Switch(compute_flows(cfg or config([WEB_FROM_PEER]), OF, TUN, ZONES))


def ip_pkt(src_port: str, src_ip: str, dst_ip: str, dst_mac: str, proto: int = 6, dport: int = 80,
           sport: int = 40000, **kw) -> dict:
    pkt = {"in_port": OF[src_port], "eth_src": MAC[src_port], "eth_dst": dst_mac, "eth_type": 0x0800,
           "ipv4_src": src_ip, "ipv4_dst": dst_ip, "ip_proto": proto, "ttl": 64}
    if proto == 6:
        pkt |= {"tcp_src": sport, "tcp_dst": dport}
    elif proto == 17:
        pkt |= {"udp_src": sport, "udp_dst": dport}
    return pkt | kw


def tunnel_pkt(vni: int, src_ip: str, dst_ip: str, dst_mac: str, vtep: str = "192.0.2.2", **kw) -> dict:
    pkt = {"in_port": TUN, "tun_ipv4_src": vtep, "tunnel_id": vni, "eth_src": RA, "eth_dst": dst_mac,
           "eth_type": 0x0800, "ipv4_src": src_ip, "ipv4_dst": dst_ip, "ip_proto": 6, "tcp_src": 40000,
           "tcp_dst": 80, "ttl": 63}
    return pkt | kw


def test_same_subnet_cross_host_is_vxlan_with_vpc_vni() -> None:
    (out,) = switch().inject(ip_pkt("a1", "10.0.1.2", "10.0.1.3", MAC["a3"]))
    port, pkt = out
    assert port == TUN
    assert (pkt["tunnel_id"], pkt["tun_ipv4_dst"], pkt["eth_dst"], pkt["ttl"]) == (1001, "192.0.2.2", MAC["a3"], 64)


def test_cross_subnet_same_host_is_routed() -> None:
    (out,) = switch().inject(ip_pkt("a1", "10.0.1.2", "10.0.2.2", RA))
    port, pkt = out
    assert port == OF["a2"]
    assert (pkt["eth_src"], pkt["eth_dst"], pkt["ttl"]) == (RA, MAC["a2"], 63)


def test_unknown_destination_and_no_route_dropped() -> None:
    sw = switch()
    assert sw.inject(ip_pkt("a1", "10.0.1.2", "10.0.9.9", RA)) == []
    assert sw.inject(ip_pkt("a1", "10.0.1.2", "8.8.8.8", RA)) == []
    assert sw.inject(ip_pkt("a1", "10.0.1.2", "10.0.1.3", "ff:ff:ff:ff:ff:ff", proto=17)) != []  # IP-unicast only
    assert sw.inject({"in_port": 1, "eth_src": MAC["a1"], "eth_dst": "ff:ff:ff:ff:ff:ff", "eth_type": 0x86DD}) == []


def arp(port: str, ip: str, target: str) -> dict:
    return {"in_port": OF[port], "eth_src": MAC[port], "eth_dst": "ff:ff:ff:ff:ff:ff", "eth_type": 0x0806,
            "arp_op": 1, "arp_spa": ip, "arp_sha": MAC[port], "arp_tpa": target, "arp_tha": "00:00:00:00:00:00"}


@pytest.mark.parametrize("target,mac", [("10.0.1.1", RA), ("10.0.2.1", RA), ("10.0.1.3", MAC["a3"]),
                                        ("10.0.2.2", MAC["a2"]), ("10.7.0.2", RA)])
def test_arp_answered_in_switch(target: str, mac: str) -> None:
    (out,) = switch().inject(arp("a1", "10.0.1.2", target))
    port, pkt = out
    assert port == OF["a1"]
    assert (pkt["arp_op"], pkt["eth_dst"], pkt["eth_src"]) == (2, MAC["a1"], mac)
    assert pkt["arp_sha"] == int(mac.replace(":", ""), 16) and pkt["arp_tha"] == MAC["a1"]
    assert pkt["arp_spa"] == int(__import__("ipaddress").IPv4Address(target))
    assert pkt["arp_tpa"] == "10.0.1.2"


def test_arp_for_unknown_or_other_tenant_not_answered_and_never_tunnelled() -> None:
    sw = switch()
    assert sw.inject(arp("a1", "10.0.1.2", "10.0.1.99")) == []
    # tenant C asks for A's address: not in C's VPC
    assert sw.inject(arp("c1", "10.0.1.2", "10.0.2.2")) == []
    assert all(f.actions[-1:] != (Output(TUN),) for f in sw.flows if f.table == P.ARP_RESPONDER.id)


def test_port_security_drops_spoofed_ip_mac_and_arp() -> None:
    sw = switch()
    assert sw.inject(ip_pkt("a1", "10.0.1.99", "10.0.1.3", MAC["a3"])) == []
    assert sw.inject(ip_pkt("a1", "10.0.1.2", "10.0.1.3", MAC["a3"], eth_src="02:00:00:00:00:ff")) == []
    spoof = arp("a1", "10.0.1.2", "10.0.1.1") | {"arp_spa": "10.0.1.3"}
    assert sw.inject(spoof) == []


def test_dhcp_goes_to_agent() -> None:
    pkt = ip_pkt("a1", "0.0.0.0", "255.255.255.255", "ff:ff:ff:ff:ff:ff", proto=17, sport=68, dport=67)
    (out,) = switch().inject(pkt)
    assert out[0] == CONTROLLER


def test_dns_to_the_subnet_gateway_goes_to_the_agent_and_elsewhere_follows_the_groups() -> None:
    sw = switch()
    (out,) = sw.inject(ip_pkt("a1", "10.0.1.2", "10.0.1.1", RA, proto=17, dport=53))
    assert out[0] == CONTROLLER
    # another subnet's gateway is not this port's resolver, and a spoofed source never reaches the agent
    assert CONTROLLER not in [o[0] for o in sw.inject(ip_pkt("a1", "10.0.1.2", "10.0.2.1", RA, proto=17, dport=53))]
    assert sw.inject(ip_pkt("a1", "10.0.1.9", "10.0.1.1", RA, proto=17, dport=53)) == []


def test_tenants_with_identical_ips_are_isolated() -> None:
    sw = switch()
    # c1 has A's a1 address; it cannot reach A's a2 nor a3
    assert sw.inject(ip_pkt("c1", "10.0.1.2", "10.0.2.2", RC)) == []
    assert sw.inject(ip_pkt("c1", "10.0.1.2", "10.0.1.3", MAC["a3"])) == []
    # traffic for C's VNI from the tunnel reaches only C's port
    (out,) = sw.inject(tunnel_pkt(1003, "10.0.1.7", "10.0.1.2", MAC["c1"]))
    assert out[0] == OF["c1"]
    (out,) = sw.inject(tunnel_pkt(1001, "10.0.1.3", "10.0.1.2", MAC["a1"]))
    assert out[0] == OF["a1"]


def test_tunnel_only_from_registered_vteps_and_known_vnis() -> None:
    sw = switch()
    assert sw.inject(tunnel_pkt(1001, "10.0.1.3", "10.0.1.2", MAC["a1"], vtep="198.51.100.9")) == []
    assert sw.inject(tunnel_pkt(1001, "10.0.1.3", "10.0.1.2", MAC["a1"], vtep="192.0.2.1")) == []  # ourselves
    assert sw.inject(tunnel_pkt(4242, "10.0.1.3", "10.0.1.2", MAC["a1"])) == []
    # never re-tunnelled: a tunnelled packet for a remote endpoint is dropped
    assert sw.inject(tunnel_pkt(1001, "10.0.1.2", "10.0.1.3", MAC["a3"])) == []


def test_distributed_peering_uses_peer_vni_direct_to_host() -> None:
    (out,) = switch().inject(ip_pkt("a1", "10.0.1.2", "10.7.0.2", RA))
    port, pkt = out
    assert port == TUN
    assert (pkt["tunnel_id"], pkt["tun_ipv4_dst"], pkt["eth_src"], pkt["eth_dst"]) == (1002, "192.0.2.2", RP,
                                                                                         MAC["p1"])


def test_peering_removed_cuts_traffic() -> None:
    sw = switch(config([WEB_FROM_PEER], peered=False))
    assert sw.inject(ip_pkt("a1", "10.0.1.2", "10.7.0.2", RA)) == []


def test_peering_is_not_transitive() -> None:
    cfg = config([WEB_FROM_PEER])
    # P is peered with Q, but A's table only knows P; Q's endpoint is not reachable from A
    q = Endpoint(port_id="q1", vpc_id="Q", vni=1009, ip="10.9.0.2", mac=MAC["q1"], host="hv2", vtep_ip="192.0.2.2")
    cfg = cfg.model_copy(update={"endpoints": [*cfg.endpoints, q]})
    assert switch(cfg).inject(ip_pkt("a1", "10.0.1.2", "10.9.0.2", RA)) == []


def test_security_group_stateful_ingress_and_replies() -> None:
    sw = switch()
    # the peer reaches a1 on tcp/80 (rule 10) but not on tcp/22
    (out,) = sw.inject(tunnel_pkt(1001, "10.7.0.2", "10.0.1.2", MAC["a1"], tcp_dst=80, tcp_src=5555))
    assert out[0] == OF["a1"]
    assert sw.inject(tunnel_pkt(1001, "10.7.0.2", "10.0.1.2", MAC["a1"], tcp_dst=22, tcp_src=5556)) == []
    # a1's reply is established: it passes and is routed to the peer
    (out,) = sw.inject(ip_pkt("a1", "10.0.1.2", "10.7.0.2", RA, sport=80, dport=5555))
    assert out[0] == TUN


def test_removing_a_rule_cuts_its_established_connections() -> None:
    sw = switch()
    (out,) = sw.inject(tunnel_pkt(1001, "10.7.0.2", "10.0.1.2", MAC["a1"], tcp_dst=80, tcp_src=6000))
    assert out[0] == OF["a1"]
    sw.flows = compute_flows(config([]), OF, TUN, ZONES)  # rule 10 removed
    assert sw.inject(tunnel_pkt(1001, "10.7.0.2", "10.0.1.2", MAC["a1"], tcp_dst=80, tcp_src=6000)) == []
    assert sw.inject(ip_pkt("a1", "10.0.1.2", "10.7.0.2", RA, sport=80, dport=6000)) == []


def test_egress_rules_limit_new_connections_but_replies_pass() -> None:
    only_dns = SecurityGroupRuleInfo(id=20, direction="egress", protocol="udp", port_range_min=53,
                                     port_range_max=53, remote_cidrs=["10.0.0.0/16"])
    cfg = config([WEB_FROM_PEER])
    sg = cfg.security_groups[0]
    sg = sg.model_copy(update={"rules": [only_dns, *[r for r in sg.rules if r.direction == "ingress"]]})
    sw = switch(cfg.model_copy(update={"security_groups": [sg, cfg.security_groups[1]]}))
    assert sw.inject(ip_pkt("a1", "10.0.1.2", "10.0.1.3", MAC["a3"], proto=6, dport=80)) == []
    (out,) = sw.inject(ip_pkt("a1", "10.0.1.2", "10.0.1.3", MAC["a3"], proto=17, dport=53))
    assert out[0] == TUN
    # an inbound connection allowed by ingress rule 10 gets its reply out despite the egress restriction
    sw.inject(tunnel_pkt(1001, "10.7.0.2", "10.0.1.2", MAC["a1"], tcp_dst=80, tcp_src=7000))
    (out,) = sw.inject(ip_pkt("a1", "10.0.1.2", "10.7.0.2", RA, sport=80, dport=7000))
    assert out[0] == TUN


def test_same_host_connection_checks_both_sides() -> None:
    sw = switch()
    # a1 -> a2 on the same host: egress rule 1 and ingress rule 2 (member of the group)
    (out,) = sw.inject(ip_pkt("a1", "10.0.1.2", "10.0.2.2", RA, dport=9000))
    assert out[0] == OF["a2"]
    (out,) = sw.inject(ip_pkt("a2", "10.0.2.2", "10.0.1.2", RA, sport=9000, dport=40000))
    assert out[0] == OF["a1"]


def test_unplugged_port_gets_no_flows_and_cookies_name_objects() -> None:
    flows = compute_flows(config(), {"a1": 1}, TUN, ZONES)
    assert not any(("in_port", 2) in f.match for f in flows)
    cookies = [f.cookie for f in flows]
    assert len(set(cookies)) == len(cookies)
    kinds = {f.cookie >> 56 for f in flows}
    assert {P.COOKIE_KINDS[k] for k in ("base", "port", "vtep", "vpc", "endpoint", "route", "rule")} <= kinds


def test_flows_are_a_pure_function() -> None:
    assert compute_flows(config(), OF, TUN, ZONES) == compute_flows(config(), OF, TUN, ZONES)


@pytest.mark.parametrize("lo,hi", [(80, 80), (1, 65535), (1000, 1999), (22, 23), (5, 1030)])
def test_port_masks_cover_exactly(lo: int, hi: int) -> None:
    covered = {p for v, m in port_masks(lo, hi) for p in range(65536) if p & m == v} if hi - lo < 3000 else None
    if covered is not None:
        assert covered == set(range(lo, hi + 1))
    else:
        assert sum(((~m) & 0xFFFF) + 1 for _, m in port_masks(lo, hi)) == hi - lo + 1



def test_nat_gateway_route_splits_vms_by_source_bucket() -> None:
    """Two instances serving a NAT gateway: the VM's low address bits pick one, the same for all its flows; one
    instance: every VM goes there."""
    buckets = ["198.18.0.1", "198.18.0.2"] * 4
    cfg = config([WEB_FROM_PEER])
    vpcs = [v.model_copy(update={"routes": v.routes + [RouteInfo(
        destination="0.0.0.0/0", target_type="nat-gateway", target_id="ng", origin="user",
        gateway_vteps=sorted(set(buckets)), gateway_buckets=buckets)]}) if v.id == "A" else v for v in cfg.vpcs]
    sw = switch(cfg.model_copy(update={"vpcs": vpcs}))
    seen = {}
    for src_port, src_ip in (("a1", "10.0.1.2"), ("a2", "10.0.2.2")):
        for dport in (80, 443, 53):
            (out,) = sw.inject(ip_pkt(src_port, src_ip, "93.184.216.34", RA, dport=dport))
            port, pkt = out
            assert port == TUN and pkt["tunnel_id"] == 1001 and pkt["ttl"] == 63
            seen.setdefault(src_ip, set()).add(pkt["tun_ipv4_dst"])
    # .2 & 7 = bucket 2 -> buckets[2]; every flow of a VM goes to one instance
    assert seen == {"10.0.1.2": {buckets[2]}, "10.0.2.2": {buckets[2]}}
    single = [v.model_copy(update={"routes": v.routes + [RouteInfo(
        destination="0.0.0.0/0", target_type="nat-gateway", target_id="ng", origin="user",
        gateway_vteps=["198.18.0.9"], gateway_buckets=["198.18.0.9"] * 8)]}) if v.id == "A" else v
        for v in cfg.vpcs]
    sw = switch(cfg.model_copy(update={"vpcs": single}))
    (out,) = sw.inject(ip_pkt("a1", "10.0.1.2", "93.184.216.34", RA))
    assert out[1]["tun_ipv4_dst"] == "198.18.0.9"
