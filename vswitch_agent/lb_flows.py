"""A load balancer's flows on one host: the client side (its VIP answered and steered to the instances) and the
backend side (translation to the members this host holds, and back).

Client side, for every local VPC that reaches the VIP's VPC (its own, or a peer): ARP for the VIP is answered
with its MAC; FORWARD sends a packet to the VIP in the VPC's VNI to one LB instance, chosen by a multipath hash of
the 5-tuple over the live instances (every instance holds the same Maglev tables, so any of them picks the same
member; a select group would do the same with group state the engine would have to diff and audit apart).

Backend side, when a member's port is here: the instance sends the client's packet unchanged, to the member's MAC,
in the VPC's VNI. TUNNEL_VNI sends VIP traffic to LB_DNAT, which translates VIP:listener port to the member's
address and port with conntrack in the member's own zone (committed: the reply is translated back; a zone per
member, because a client's 5-tuple that an instance moves to another member on the same host must not meet the
translation to the first one, which outlives the instance's decision), and FORWARD
delivers it through the member's own security groups. The member's replies (its address and port as source) meet
the same zone in LB_UNNAT, leave as VIP:listener port, and go straight to the client. Nothing is set up inside the
member VM. With an EIP, replies from the VIP to the internet go to the instance homing the EIP (above the VPC's
default route, below every more specific one, as for a port's own EIP).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

from tianji.southbound import HostConfig, LbBackendInfo, LbVipInfo, VpcInfo
from vswitch_agent import pipeline as P
from vswitch_agent.actions import Controller, Ct, DecTtl, GotoTable, Load, Multipath, Nat, Output, SetField
from vswitch_agent.flow import Flow, flow
from vswitch_agent.flows import ETH_IP, PROTO, ROUTE_PRIORITY, arp_answers
from vswitch_agent.health import PROBE_PORTS


def client_flows(lb: LbVipInfo, vpc: VpcInfo, reach: Sequence[tuple[str, int, str]],
                 tunnel_ofport: int | None) -> list[Flow]:
    """ARP for the VIP in every local VPC that reaches it, and the steering to the instances."""
    if not reach:
        return []
    out = arp_answers(reach, vpc.id, lb.vip, lb.mac, "lb", lb.id)
    dst = {"metadata": vpc.vni, "eth_type": ETH_IP, "ipv4_dst": lb.vip}
    if tunnel_ofport is None or not lb.instance_vteps:
        out.append(flow(P.FORWARD, 100, dst | {P.REG_FROM_TUNNEL: 0}, [], "lb", lb.id))  # no instance: drop
        return out
    out.append(flow(P.FORWARD, 100, dst | {P.REG_FROM_TUNNEL: 0},
                    [SetField("eth_dst", lb.mac), SetField("tunnel_id", vpc.vni),
                     Multipath(len(lb.instance_vteps), P.REG_LB_LINK), GotoTable(P.LB_STEER.id)], "lb", lb.id))
    for link, vtep in enumerate(lb.instance_vteps):
        out.append(flow(P.LB_STEER, 100, dst | {P.REG_LB_LINK: link},
                        [SetField("tun_ipv4_dst", vtep), Output(tunnel_ofport)], "lb", lb.id))
    return out


def backend_flows(lb: LbVipInfo, vpc: VpcInfo, local: Mapping[str, tuple[int, int]],
                  tunnel_ofport: int | None) -> list[Flow]:
    """Translation to and from the members whose ports are plugged here (`local`: port id -> (OpenFlow port, the
    member's conntrack zone))."""
    here = [(listener, b) for listener in lb.listeners for b in listener.backends if b.port_id in local]
    if not here or tunnel_ofport is None:
        return []
    out = [flow(P.TUNNEL_VNI, 110, {"tunnel_id": vpc.vni, "eth_type": ETH_IP, "ipv4_dst": lb.vip},
                [SetField("metadata", vpc.vni), Load(P.REG_FROM_TUNNEL, 0, 1, 1), GotoTable(P.LB_DNAT.id)],
                "lb", lb.id)]
    for listener, b in here:
        ofport, zone = local[b.port_id]
        if listener.monitor is not None:
            out += probe_flows(listener.monitor.type, b, ofport)
        proto = PROTO[listener.protocol]
        l4 = f"{listener.protocol}_"
        out.append(flow(P.LB_DNAT, 100, {"metadata": vpc.vni, "eth_dst": b.mac, "eth_type": ETH_IP,
                                         "ipv4_dst": lb.vip, "ip_proto": proto, l4 + "dst": listener.port},
                        [Ct(True, zone, P.FORWARD.id, (Nat(b.ip, b.port),))], "lb", lb.id))
        out.append(flow(P.LB_UNNAT, 100, {"metadata": vpc.vni, "eth_type": ETH_IP, "ipv4_src": b.ip,
                                          "ip_proto": proto, l4 + "src": b.port},
                        [Ct(False, zone, P.ROUTING.id, (Nat(),))], "lb", lb.id))
    return out


def probe_flows(kind: str, b: LbBackendInfo, ofport: int) -> list[Flow]:
    """The member's answers to the health probes (health.py) go to the agent: TCP to the probes' source ports, or
    ICMP unreachable for a UDP probe, from the member's own port to its subnet's gateway address."""
    src = {"in_port": ofport, "eth_type": ETH_IP, "ipv4_src": b.ip, "ipv4_dst": b.gateway_ip}
    match = src | ({"ip_proto": PROTO["icmp"], "icmp_type": 3} if kind == "udp-connect" else
                   {"ip_proto": PROTO["tcp"], "tcp_dst": PROBE_PORTS})
    return [flow(P.PORT_SECURITY, 115, match, [Controller()], "lb", b.member_id)]


def eip_return_flows(lb: LbVipInfo, vpc: VpcInfo, tunnel_ofport: int | None) -> list[Flow]:
    """Replies from the VIP to off-VPC addresses go to the instance homing the VIP's EIP (it SNATs them)."""
    if not lb.eip_home_vtep or tunnel_ofport is None:
        return []
    return [flow(P.ROUTING, ROUTE_PRIORITY + 5, {"metadata": vpc.vni, "eth_dst": vpc.router_mac, "eth_type": ETH_IP,
                                                 "ipv4_src": lb.vip},
                 [DecTtl(), SetField("eth_src", vpc.router_mac), SetField("tunnel_id", vpc.vni),
                  SetField("tun_ipv4_dst", lb.eip_home_vtep), Output(tunnel_ofport)], "lb", lb.id)]


def lb_flows(lb: LbVipInfo, vpc: VpcInfo, reach: Sequence[tuple[str, int, str]],
             local: Mapping[str, tuple[int, int]], tunnel_ofport: int | None) -> list[Flow]:
    """Every flow of one load balancer on this host (`local`: see members_here)."""
    out = client_flows(lb, vpc, reach, tunnel_ofport)
    if local:
        out += backend_flows(lb, vpc, local, tunnel_ofport)
        out += eip_return_flows(lb, vpc, tunnel_ofport)
    return out


def members_here(lb: LbVipInfo, ofports: Mapping[str, int], zones: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """The load balancer's members plugged here: port id -> (OpenFlow port, its conntrack zone)."""
    return {b.port_id: (ofports[b.port_id], zones[key]) for x in lb.listeners for b in x.backends
            if b.port_id in ofports and (key := lb_zone_key(b.port_id)) in zones}


def member_zone_seeds(cfg: HostConfig) -> dict[str, int]:
    """The zone map's keys of the local ports that are members (with a seed that spreads their first zones)."""
    local = {p.id for p in cfg.ports}
    return {lb_zone_key(b.port_id): zlib.crc32(b.port_id.encode()) for v in cfg.vpcs for lb in v.load_balancers
            for x in lb.listeners for b in x.backends if b.port_id in local}


def lb_zone_key(port_id: str) -> str:
    """The zone map's key for a member's translation zone (a VPC's own zone is keyed by the VPC id)."""
    return f"lb:{port_id}"
