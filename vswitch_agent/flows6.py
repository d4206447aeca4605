"""IPv6 flows of a dual-stack VPC, beside IPv4's (`flows.py` calls these from its builders of the same objects).

Neighbour discovery is answered in the switch, as ARP is: a solicitation for the router (its link-local address
and each subnet's ::1) or for a port of the VPC becomes the advertisement in place (ND_RESPONDER rewrites it,
ND_ANSWER writes the target link-layer option, which OVS only lets a flow write on an advertisement) and goes back
out of the port it came in on. Router solicitations and DHCPv6 go to the agent (`icmp6.py`, `dhcp6.py`). From a
VM the switch drops, each on its own counted flow, what only a router or a DHCPv6 server may send (RA guard, RFC
6105: advertisements, redirects, DHCPv6 server messages) and every neighbour advertisement: the switch answers
every solicitation itself, so a VM's advertisement, honest or forged, has no one to tell. A VM's solicitations
must carry its own MAC (or none); duplicate address detection (from ::) is never answered, as no address is
handed out twice.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from tianji import inet
from tianji.southbound import Endpoint, PortInfo, RouteInfo, SecurityGroupRuleInfo, VpcInfo
from vswitch_agent import pipeline as P
from vswitch_agent.actions import (
    Action,
    CheckPktLarger,
    Controller,
    Ct,
    DecTtl,
    GotoTable,
    Load,
    Move,
    Output,
    SetField,
)
from vswitch_agent.flow import Flow, flow

ETH_IPV6 = 0x86DD
ICMPV6 = 58
RS, RA, NS, NA, REDIRECT = 133, 134, 135, 136, 137
DHCP6_CLIENT, DHCP6_SERVER = 546, 547
NA_ROUTER, NA_HOST = 0xE0000000, 0x60000000  # the advertisement's flags: Router, Solicited, Override
PROTO6 = {"tcp": 6, "udp": 17, "icmp": ICMPV6}
NO_MAC = "00:00:00:00:00:00"
ETH_HEADER = 14  # check_pkt_larger counts the frame, the MTU the IPv6 packet
ICMP6 = {"eth_type": ETH_IPV6, "ip_proto": ICMPV6}


def prefix6(cidr: str) -> Any:
    net = ipaddress.IPv6Network(cidr)
    return str(net.network_address) if net.prefixlen == 128 else (str(net.network_address), str(net.netmask))


def link_local(mac: str) -> str:
    """The router's (or a VM's) link-local address, as flows match it."""
    return str(inet.link_local(mac))


def na_reply(mac: str, target: str, flags: int) -> tuple[Action, ...]:
    """Turn a solicitation for `target` into its advertisement from `mac` (the TLL option: ND_ANSWER)."""
    return (Move("eth_src", "eth_dst", 48), SetField("eth_src", mac), Move("ipv6_src", "ipv6_dst", 128),
            SetField("ipv6_src", target), SetField("icmpv6_type", NA), SetField("nd_reserved", flags),
            SetField("nd_options_type", 2), GotoTable(P.ND_ANSWER.id))


def base_flows6() -> list[Flow]:
    """RA guard and the rest of what a VM may not send, each counted apart; DAD unanswered; the advertisement's
    link-layer option."""
    out = [flow(P.PORT_SECURITY, 120, ICMP6 | {"icmpv6_type": t}) for t in (RA, REDIRECT, NA)]
    out.append(flow(P.PORT_SECURITY, 120, {"eth_type": ETH_IPV6, "ip_proto": 17, "udp_src": DHCP6_SERVER}))
    out.append(flow(P.PORT_SECURITY, 125, ICMP6 | {"icmpv6_type": NS, "ipv6_src": "::"}))
    out.append(flow(P.ND_ANSWER, 100, ICMP6 | {"icmpv6_type": NA},
                    [Move("eth_src", "ipv6_nd_tll", 48), Output(P.OFPP_IN_PORT)]))
    out.append(flow(P.PATH_MTU, 100, {"eth_type": ETH_IPV6, P.REG_PATH: (P.PATH_TOO_BIG, P.PATH_TOO_BIG)},
                    [Controller()]))
    # a fragment was sized by its sender; and after conntrack reassembled its datagram, the userspace datapath's
    # check_pkt_larger measures the datagram, not the fragment (seen on OVS 3.1)
    out.append(flow(P.PATH_MTU, 110, {"eth_type": ETH_IPV6, "ip_frag": (1, 1)}, [GotoTable(P.FORWARD.id)]))
    return out


def path_mtu(mtu: int) -> tuple[Action, ...]:
    """The first actions of a route to a smaller MTU: a longer packet is marked (PATH_MTU sends it to the agent,
    which answers packet too big with the MTU in reg3)."""
    return (CheckPktLarger(mtu + ETH_HEADER, P.REG_PATH, 0), Load(P.REG_PATH_MTU, 0, 16, mtu))


def vpc_flows6(vpc: VpcInfo, peers: dict[str, VpcInfo], zone: int, tunnel_ofport: int | None) -> list[Flow]:
    """A dual-stack VPC with local ports: conntrack for IPv6, the router's answers to solicitations, its IPv6
    routes."""
    if not vpc.ipv6_cidr:
        return []
    vid, md = vpc.id, {"metadata": vpc.vni}
    out = [flow(t, 100, md | {"eth_type": ETH_IPV6}, [Ct(False, zone, nxt.id, ())], "vpc", vid)
           for t, nxt in ((P.EGRESS_CT, P.EGRESS_ACL), (P.INGRESS_CT, P.INGRESS_ACL))]
    for target in [link_local(vpc.router_mac), *(sn.ipv6_gateway_ip for sn in vpc.subnets if sn.ipv6_gateway_ip)]:
        out.append(flow(P.ND_RESPONDER, 100, md | ICMP6 | {"icmpv6_type": NS, "ipv6_nd_target": target},
                        na_reply(vpc.router_mac, target, NA_ROUTER), "vpc", vid))
    router = md | {"eth_dst": vpc.router_mac, "eth_type": ETH_IPV6}
    for r in vpc.routes6:
        out += _route6(vpc, r, router, peers, tunnel_ofport)
    return out


def _route6(vpc: VpcInfo, r: RouteInfo, router: dict, peers: dict[str, VpcInfo],
            tunnel_ofport: int | None) -> list[Flow]:
    """One IPv6 route: longest prefix first, the hop limit decremented (run out: the agent answers), a peer VPC's
    smaller MTU checked (too big: the agent answers)."""
    net = ipaddress.IPv6Network(r.destination)
    match = router | ({"ipv6_dst": prefix6(r.destination)} if net.prefixlen else {})
    prio, obj = 1000 + 10 * net.prefixlen, f"{vpc.id}:{r.destination}"
    if r.target_type == "local":
        return [flow(P.ROUTING, prio, match, [DecTtl(), SetField("eth_src", vpc.router_mac), GotoTable(P.FORWARD.id)],
                     "route", obj)]
    if r.target_type == "peering" and r.peer_vpc_id in peers:
        peer = peers[r.peer_vpc_id]
        to_peer = (DecTtl(), SetField("eth_src", peer.router_mac), SetField("metadata", peer.vni))
        if peer.mtu < vpc.mtu:  # its VMs take no longer packet: the sender is told, as a router would
            return [flow(P.ROUTING, prio, match, [*path_mtu(peer.mtu), *to_peer, GotoTable(P.PATH_MTU.id)],
                         "route", obj)]
        return [flow(P.ROUTING, prio, match, [*to_peer, GotoTable(P.FORWARD.id)], "route", obj)]
    if r.target_type == "private-line" and r.gateway_vteps and tunnel_ofport is not None:
        return [flow(P.ROUTING, prio, match, [DecTtl(), SetField("eth_src", vpc.router_mac),
                                              SetField("tunnel_id", vpc.vni),
                                              SetField("tun_ipv4_dst", r.gateway_vteps[0]), Output(tunnel_ofport)],
                     "route", obj)]
    return [flow(P.ROUTING, prio, match, [], "route", obj)]


def nd_answers6(e: Endpoint) -> list[Flow]:
    """A port of a dual-stack VPC: its solicitations answered in its own VPC (a peered VPC's hosts reach it
    through their router, never on-link)."""
    if not e.ipv6:
        return []
    return [flow(P.ND_RESPONDER, 100, {"metadata": e.vni, **ICMP6, "icmpv6_type": NS, "ipv6_nd_target": e.ipv6},
                 na_reply(e.mac, e.ipv6, NA_HOST), "arp", f"{e.vpc_id}:{e.port_id}")]


def endpoint_dst6(e: Endpoint) -> dict[str, Any] | None:
    """What FORWARD matches for a port's IPv6 traffic (its flows are IPv4's twins: flows.endpoint_flows)."""
    return {"metadata": e.vni, "eth_type": ETH_IPV6, "ipv6_dst": e.ipv6} if e.ipv6 else None


def port_flows6(p: PortInfo, of: int) -> list[Flow]:
    """A plugged port with an IPv6 address: its traffic from its own address, its solicitations (with its own
    MAC, or none) to the responder, router solicitations and DHCPv6 to the agent."""
    if not p.ipv6:
        return []
    src = {"in_port": of, "eth_src": p.mac}
    out = [flow(P.PORT_SECURITY, 100, src | {"eth_type": ETH_IPV6, "ipv6_src": p.ipv6}, [GotoTable(P.EGRESS_CT.id)],
                "port", p.id)]
    out += [flow(P.PORT_SECURITY, 115, src | ICMP6 | {"icmpv6_type": NS, "ipv6_nd_sll": sll},
                 [GotoTable(P.ND_RESPONDER.id)], "port", p.id) for sll in (p.mac, NO_MAC)]
    out.append(flow(P.PORT_SECURITY, 115, src | ICMP6 | {"icmpv6_type": RS}, [Controller()], "port", p.id))
    out.append(flow(P.PORT_SECURITY, 115, src | {"eth_type": ETH_IPV6, "ip_proto": 17, "udp_src": DHCP6_CLIENT,
                                                 "udp_dst": DHCP6_SERVER}, [Controller()], "port", p.id))
    return out


def rule_matches6(rule: SecurityGroupRuleInfo, remote_field: str, ports: Sequence[dict]) -> list[dict[str, Any]]:
    """Match dicts of one IPv6 rule, one per (remote CIDR x port block) (`ports`: flows.port_sets)."""
    base: dict[str, Any] = {"eth_type": ETH_IPV6}
    if rule.protocol != "any":
        base["ip_proto"] = PROTO6[rule.protocol]
    return [base | ({} if cidr == "::/0" else {remote_field: prefix6(cidr)}) | pm
            for cidr in rule.remote_cidrs for pm in ports]
