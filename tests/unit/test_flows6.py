"""IPv6 in the flows of a dual-stack VPC, walked by the in-memory OpenFlow model: neighbour solicitations
answered in the switch, RA guard and the rest of port security, routing (hop limit), peering, forwarding and
stateful IPv6 security groups; an IPv4-only VPC's flows are what they were."""

from __future__ import annotations

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
from vswitch_agent.flows import compute_flows
from vswitch_agent.flows6 import NA_HOST, NA_ROUTER, link_local
from vswitch_agent.ofmodel import CONTROLLER, Switch

TUN = 100
RA, RP = "0a:58:00:00:03:e9", "0a:58:00:00:03:ea"
MAC = {"a1": "02:00:00:00:00:a1", "a2": "02:00:00:00:00:a2", "a3": "02:00:00:00:00:a3", "p1": "02:00:00:00:00:b1"}
IP6 = {"a1": "fd00:0:0:1::a1", "a2": "fd00:0:0:2::a2", "a3": "fd00:0:0:1::a3", "p1": "fd07:0:0:1::b1"}
OF = {"a1": 1, "a2": 2}
ZONES = {"A": 1}


def config(rules6: list[SecurityGroupRuleInfo] | None = None, dual: bool = True, peer_mtu: int = 1450) -> HostConfig:
    v6 = (lambda **kw: kw) if dual else (lambda **kw: {})
    routes6 = [RouteInfo(destination="fd00::/56", target_type="local"),
               RouteInfo(destination="fd07::/56", target_type="peering", target_id="pc1", peer_vpc_id="P")]
    vpcs = [
        VpcInfo(id="A", tenant_id="t1", vni=1001, cidr="10.0.0.0/16", router_mac=RA,
                routes=[RouteInfo(destination="10.0.0.0/16", target_type="local"),
                        RouteInfo(destination="10.7.0.0/16", target_type="peering", target_id="pc1",
                                  peer_vpc_id="P")],
                subnets=[SubnetInfo(id="s1", cidr="10.0.1.0/24", gateway_ip="10.0.1.1",
                                    **v6(ipv6_cidr="fd00:0:0:1::/64", ipv6_gateway_ip="fd00:0:0:1::1",
                                         ipv6_address_mode="slaac")),
                         SubnetInfo(id="s2", cidr="10.0.2.0/24", gateway_ip="10.0.2.1",
                                    **v6(ipv6_cidr="fd00:0:0:2::/64", ipv6_gateway_ip="fd00:0:0:2::1",
                                         ipv6_address_mode="dhcpv6-stateful"))],
                **v6(ipv6_cidr="fd00::/56", routes6=routes6)),
        VpcInfo(id="P", tenant_id="t1", vni=1002, cidr="10.7.0.0/16", router_mac=RP, **v6(ipv6_cidr="fd07::/56"),
                mtu=peer_mtu,
                subnets=[SubnetInfo(id="sP", cidr="10.7.0.0/24", gateway_ip="10.7.0.1")]),
    ]
    ep = [("a1", "A", 1001, "10.0.1.2", "hv1"), ("a2", "A", 1001, "10.0.2.2", "hv1"),
          ("a3", "A", 1001, "10.0.1.3", "hv2"), ("p1", "P", 1002, "10.7.0.2", "hv2")]
    eps = [Endpoint(port_id=p, vpc_id=v, vni=n, ip=ip, mac=MAC[p], host=h, vtep_ip="192.0.2.1" if h == "hv1"
                    else "192.0.2.2", **v6(ipv6=IP6[p])) for p, v, n, ip, h in ep]
    rules = [SecurityGroupRuleInfo(id=1, direction="egress", protocol="any", remote_cidrs=["0.0.0.0/0"]),
             SecurityGroupRuleInfo(id=2, direction="ingress", protocol="any", remote_cidrs=["10.0.0.0/16"])]
    rules6 = rules6 if rules6 is not None else [
        SecurityGroupRuleInfo(id=3, direction="egress", protocol="any", remote_cidrs=["::/0"]),
        SecurityGroupRuleInfo(id=4, direction="ingress", protocol="tcp", port_range_min=22, port_range_max=22,
                              remote_cidrs=["fd00:0:0:1::/64"])]
    return HostConfig(
        host="hv1", revision=7, vtep_ip="192.0.2.1",
        ports=[PortInfo(id=p, vpc_id="A", subnet_id=s, mac=MAC[p], ip=ip, security_group_ids=["sg"], gateway_ip=gw,
                        **v6(ipv6=IP6[p])) for p, s, ip, gw in (("a1", "s1", "10.0.1.2", "10.0.1.1"),
                                                                 ("a2", "s2", "10.0.2.2", "10.0.2.1"))],
        vpcs=vpcs, endpoints=eps,
        security_groups=[SecurityGroupInfo(id="sg", vpc_id="A", rules=rules, **v6(rules6=rules6))],
        vteps=[Vtep(host="hv1", ip="192.0.2.1"), Vtep(host="hv2", ip="192.0.2.2")])


def switch(cfg: HostConfig | None = None) -> Switch:
    return Switch(compute_flows(cfg or config(), OF, TUN, ZONES))


def v6(port: str, src: str, dst: str, dst_mac: str, proto: int = 6, dport: int = 22, **kw) -> dict:
    pkt = {"in_port": OF[port], "eth_src": MAC[port], "eth_dst": dst_mac, "eth_type": 0x86DD, "ipv6_src": src,
           "ipv6_dst": dst, "ip_proto": proto, "ttl": 64}
    if proto == 6:
        pkt |= {"tcp_src": 40000, "tcp_dst": dport}
    return pkt | kw


def ns(port: str, target: str, src: str | None = None, sll: str | None = None, **kw) -> dict:
    return {"in_port": OF[port], "eth_src": MAC[port], "eth_dst": "33:33:ff:00:00:01", "eth_type": 0x86DD,
            "ipv6_src": src or link_local(MAC[port]), "ipv6_dst": "ff02::1:ff00:1", "ip_proto": 58,
            "icmpv6_type": 135, "ipv6_nd_target": target, "ipv6_nd_sll": sll or MAC[port], "ttl": 255} | kw


def test_solicitations_for_the_router_and_ports_are_answered_in_the_switch() -> None:
    sw = switch()
    for target, mac, flags in ((link_local(RA), RA, NA_ROUTER), ("fd00:0:0:1::1", RA, NA_ROUTER),
                               ("fd00:0:0:2::1", RA, NA_ROUTER), (IP6["a3"], MAC["a3"], NA_HOST),
                               (IP6["a2"], MAC["a2"], NA_HOST)):
        ((port, pkt),) = sw.inject(ns("a1", target))
        assert port == OF["a1"], target
        assert (pkt["icmpv6_type"], pkt["nd_reserved"], pkt["nd_options_type"]) == (136, flags, 2)
        assert (pkt["eth_src"], pkt["eth_dst"], pkt["ipv6_src"], pkt["ipv6_dst"]) == \
            (mac, MAC["a1"], target, link_local(MAC["a1"]))
        assert pkt["ipv6_nd_tll"] == mac
    assert sw.inject(ns("a1", IP6["a1"], src="::")) == []  # duplicate address detection: never answered
    assert sw.inject(ns("a1", "fd00:0:0:1::99")) == []  # nobody's
    assert sw.inject(ns("a1", IP6["p1"])) == []  # the peer's ports are reached through the router
    assert sw.inject(ns("a1", IP6["a3"], sll="02:00:00:00:00:ff")) == []  # another MAC in the option
    assert sw.inject(ns("a1", IP6["a3"], sll="00:00:00:00:00:00")) != []  # no option (a unicast probe)


def test_what_only_a_router_or_dhcp_server_sends_is_dropped_on_counted_flows() -> None:
    sw = switch()
    icmp = {"eth_type": 0x86DD, "ip_proto": 58, "ipv6_src": link_local(MAC["a1"]), "ipv6_dst": "ff02::1"}
    for t in (134, 137, 136):  # RA, redirect, NA (even for its own address)
        pkt = {"in_port": 1, "eth_src": MAC["a1"], "eth_dst": "33:33:00:00:00:01", **icmp, "icmpv6_type": t,
               "ipv6_nd_target": IP6["a1"], "ipv6_nd_tll": MAC["a1"]}
        assert sw.inject(pkt) == []
        hit = next(h for h in sw.hits if h.table == P.PORT_SECURITY.id)
        assert hit.flow.priority == 120 and dict(hit.flow.match)["icmpv6_type"] == t  # its own counter
    dhcp_server = v6("a1", IP6["a1"], "fe80::1", MAC["a2"], proto=17, udp_src=547, udp_dst=546)
    assert sw.inject(dhcp_server) == []
    rs = {"in_port": 1, "eth_src": MAC["a1"], "eth_dst": "33:33:00:00:00:02", **icmp, "ipv6_dst": "ff02::2",
          "icmpv6_type": 133}
    assert [p for p, _ in sw.inject(rs)] == [CONTROLLER]
    client = v6("a1", link_local(MAC["a1"]), "ff02::1:2", "33:33:00:01:00:02", proto=17, udp_src=546, udp_dst=547)
    assert [p for p, _ in sw.inject(client)] == [CONTROLLER]


def test_ipv6_is_routed_forwarded_and_filtered_statefully() -> None:
    sw = switch()
    assert sw.inject(v6("a1", "fd00:0:0:1::99", IP6["a2"], RA)) == []  # a spoofed source
    ((port, pkt),) = sw.inject(v6("a1", IP6["a1"], IP6["a2"], RA))  # across subnets: routed, ssh allowed
    assert (port, pkt["eth_src"], pkt["eth_dst"], pkt["ttl"]) == (OF["a2"], RA, MAC["a2"], 63)
    assert sw.inject(v6("a1", IP6["a1"], IP6["a2"], RA, dport=80)) == []  # not allowed in
    assert sw.inject(v6("a2", IP6["a2"], IP6["a1"], RA, dport=22)) == []  # a1 lets ssh in from its own /64 only
    assert sw.inject(v6("a1", IP6["a1"], IP6["a2"], RA, ttl=1)) == []  # hop limit run out
    ((port, pkt),) = sw.inject(v6("a1", IP6["a1"], IP6["a3"], MAC["a3"]))  # on-link, the other host
    assert (port, pkt["tunnel_id"], pkt["tun_ipv4_dst"]) == (TUN, 1001, "192.0.2.2")
    ((port, pkt),) = sw.inject(v6("a1", IP6["a1"], IP6["p1"], RA))  # over the peering: the peer's VNI
    assert (port, pkt["tunnel_id"], pkt["eth_src"], pkt["eth_dst"]) == (TUN, 1002, RP, MAC["p1"])
    assert sw.inject(v6("a1", IP6["a1"], "fd99::1", RA)) == []  # no route


def test_an_ipv4_only_vpc_has_no_ipv6_flows() -> None:
    flows = compute_flows(config(dual=False), OF, TUN, ZONES)
    six = [f for f in flows if any(k.startswith("ipv6") or k == "icmpv6_type" for k, _ in f.match)
           or dict(f.match).get("eth_type") == 0x86DD]
    assert len(six) == 8 and {f.table for f in six} == {P.PORT_SECURITY.id, P.ND_ANSWER.id, P.PATH_MTU.id}


def test_an_address_with_five_colons_is_not_taken_for_a_mac() -> None:
    from vswitch_agent.ofmodel import _as_int

    assert _as_int("fd00:7469:0:400::") == int(__import__("ipaddress").IPv6Address("fd00:7469:0:400::"))
    assert _as_int("02:00:00:00:00:a1") == 0x0200000000A1


def test_a_packet_longer_than_the_peer_vpcs_mtu_goes_to_the_agent_with_that_mtu() -> None:
    sw = switch(config(peer_mtu=1280))
    ((port, pkt),) = sw.inject(v6("a1", IP6["a1"], IP6["p1"], RA, len=14 + 1400))
    assert port == CONTROLLER and pkt["reg3"] == 1280 and pkt["reg2"] & 1, pkt  # packet too big, from the agent
    ((port, pkt),) = sw.inject(v6("a1", IP6["a1"], IP6["p1"], RA, len=14 + 1280))  # fits: on to the peer
    assert (port, pkt["tunnel_id"], pkt["eth_dst"]) == (TUN, 1002, MAC["p1"])
    ((port, pkt),) = sw.inject(v6("a1", IP6["a1"], IP6["a3"], MAC["a3"], len=14 + 1450))  # in the VPC: its MTU
    assert (port, pkt["tunnel_id"]) == (TUN, 1001)
    equal = [f for f in compute_flows(config(), OF, TUN, ZONES) if f.table == P.ROUTING.id]
    assert not any(a.kind == "check_pkt_larger" for f in equal for a in f.actions)  # the same MTU: nothing checked


def test_the_engine_builds_the_same_checks_as_from_scratch() -> None:
    from vswitch_agent.engine import FlowEngine

    engine = FlowEngine()
    for mtu in (1280, 1450, 1280):  # and a peer's MTU change rebuilds the routes to it
        cfg = config(peer_mtu=mtu)
        engine.update(cfg, OF, TUN, ZONES, None)
        assert engine.desired == {f.cookie: f for f in compute_flows(cfg, OF, TUN, ZONES)}
