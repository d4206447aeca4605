"""Flows as data, built per object by pure functions, one per pipeline stage.

Each builder takes one object of the host's config (a VTEP, a local VPC, an endpoint, a local port, a security
group) with exactly what its flows depend on, and returns those flows. `engine.FlowEngine` calls them for the
objects a change touched; `compute_flows` calls them all (the reference the engine is tested against).
A Flow's cookie names its object kind and hashes its content, so a changed flow gets a new cookie.

Security groups use conjunctive matches (as OVN's address sets do): a rule allows (local port of its group) x
(remote address, protocol, ports), expressed as one flow per local port plus one per remote address, not their
product. Clause flows with the same match in one table are merged into one flow carrying every conjunction.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tianji.southbound import Endpoint, HostConfig, PortInfo, SecurityGroupInfo, SecurityGroupRuleInfo, VpcInfo
from vswitch_agent import pipeline as P
from vswitch_agent.actions import (
    Action,
    Conjunction,
    Controller,
    Ct,
    DecTtl,
    GotoTable,
    Load,
    Move,
    Output,
    OutputReg,
    SetField,
)
from vswitch_agent.flow import Flow, flow
from vswitch_agent.flows6 import (
    ETH_IPV6,
    base_flows6,
    endpoint_dst6,
    nd_answers6,
    port_flows6,
    rule_matches6,
    vpc_flows6,
)

ETH_IP, ETH_ARP = 0x0800, 0x0806
ROUTE_PRIORITY = 1000  # + 10 x prefix length: longest prefix first, with room for a port's own default (+5)
ACL_PRIORITY = 100  # rule clauses and their conj_id flows share one priority, as conjunctions require
PROTO = {"tcp": 6, "udp": 17, "icmp": 1}
ALL32 = 0xFFFFFFFF
CT_NEW_TRK = (P.CT_NEW | P.CT_TRK, P.CT_NEW | P.CT_TRK)


def goto(t: P.Table) -> Action:
    return GotoTable(t.id)


def prefix(cidr: str) -> Any:
    net = ipaddress.IPv4Network(cidr)
    if net.prefixlen == 32:
        return str(net.network_address)
    return (str(net.network_address), str(net.netmask))


def port_masks(lo: int, hi: int) -> list[tuple[int, int]]:
    """Cover [lo, hi] with value/mask pairs (as few as the bit structure allows)."""
    out = []
    while lo <= hi:
        size = lo & -lo if lo else 1 << 16
        while size > hi - lo + 1:
            size >>= 1
        out.append((lo, 0xFFFF & ~(size - 1)))
        lo += size
    return out


def port_sets(rule: SecurityGroupRuleInfo) -> list[dict[str, Any]]:
    """A rule's destination ports as masked matches (none: one empty match)."""
    if rule.protocol in ("tcp", "udp") and rule.port_range_min is not None:
        key = f"{rule.protocol}_dst"
        return [{key: v if m == 0xFFFF else (v, m)} for v, m in port_masks(rule.port_range_min, rule.port_range_max)]
    return [{}]


def rule_matches(rule: SecurityGroupRuleInfo, remote_field: str, v6: bool = False) -> list[dict[str, Any]]:
    """Match dicts for one rule, one per (remote CIDR x port block); `v6`: an IPv6 rule (remote_field its
    ipv6_src/ipv6_dst)."""
    if v6:
        return rule_matches6(rule, remote_field, port_sets(rule))
    base: dict[str, Any] = {"eth_type": ETH_IP}
    if rule.protocol != "any":
        base["ip_proto"] = PROTO[rule.protocol]
    out = []
    for cidr in rule.remote_cidrs:
        remote = {} if cidr == "0.0.0.0/0" else {remote_field: prefix(cidr)}
        for ports in port_sets(rule):
            out.append(base | remote | ports)
    return out


def arp_reply(mac: str, ip: str) -> tuple[Action, ...]:
    """Turn an ARP request into the reply for (ip, mac) and bounce it out of the port it came in on."""
    mac_int = int(mac.replace(":", ""), 16)
    ip_int = int(ipaddress.IPv4Address(ip))
    return (
        Move("eth_src", "eth_dst", 48),
        SetField("eth_src", mac),
        SetField("arp_op", 2),
        Move("arp_sha", "arp_tha", 48),
        Load("arp_sha", 0, 48, mac_int),
        Move("arp_spa", "arp_tpa", 32),
        Load("arp_spa", 0, 32, ip_int),
        Output(P.OFPP_IN_PORT),
    )


# --- stage builders: one object each ------------------------------------------------------------------------

def base_flows() -> list[Flow]:
    """Every table ends in an explicit, counted drop; DELIVER outputs to reg7. Established/related traffic passes
    while the rules that admitted it live (rule ids with ct_mark 0 / ct_label 0: admitted by no rule here)."""
    out = [flow(t, 0, {}) for t in P.TABLES if t not in (P.DELIVER, P.LB_UNNAT, P.PATH_MTU)]
    out.append(flow(P.DELIVER, 0, {}, [OutputReg(P.REG_DST_PORT)]))
    out.append(flow(P.LB_UNNAT, 0, {}, [goto(P.ROUTING)]))  # not a member's reply: routed as it is
    out.append(flow(P.PATH_MTU, 0, {}, [goto(P.FORWARD)]))  # not too big for its route (flows6.path_mtu)
    # a VM never speaks as a DHCP server (to anyone, broadcast or unicast): only the agent answers DHCP
    out.append(flow(P.PORT_SECURITY, 120, {"eth_type": ETH_IP, "ip_proto": 17, "udp_src": 67}))
    inv = {"ct_state": (P.CT_INV | P.CT_TRK, P.CT_INV | P.CT_TRK)}
    out += [flow(P.EGRESS_ACL, 200, inv), flow(P.INGRESS_ACL, 200, inv)]
    out += base_flows6()
    for state in (P.CT_EST, P.CT_REL):
        st = {"ct_state": (state | P.CT_TRK, state | P.CT_TRK | P.CT_NEW)}
        for table, nxt in ((P.EGRESS_ACL, P.EGRESS_ACL_LABEL), (P.INGRESS_ACL, P.INGRESS_ACL_LABEL)):
            out.append(flow(table, 150, st | {"ct_mark": 0}, [goto(nxt)]))
    for table, nxt in ((P.EGRESS_ACL_LABEL, P.LB_UNNAT), (P.INGRESS_ACL_LABEL, P.DELIVER)):
        out.append(flow(table, 100, {"ct_label": (0, ALL32)}, [goto(nxt)]))
    return out


def vtep_flows(host: str, ip: str, tunnel_ofport: int | None) -> list[Flow]:
    """Tunnel traffic is accepted only from registered VTEPs."""
    if tunnel_ofport is None:
        return []
    return [flow(P.CLASSIFY, 100, {"in_port": tunnel_ofport, "tun_ipv4_src": ip}, [goto(P.TUNNEL_VNI)], "vtep", host)]


def vpc_flows(vpc: VpcInfo, peers: Mapping[str, VpcInfo], zone: int, tunnel_ofport: int | None) -> list[Flow]:
    """A VPC with local ports: its VNI from the tunnel, conntrack zones, the gateways' ARP, and its routes.
    `peers`: the VPCs its peering routes enter."""
    vid, md = vpc.id, {"metadata": vpc.vni}
    out: list[Flow] = []
    if tunnel_ofport is not None:
        out.append(flow(P.TUNNEL_VNI, 100, {"tunnel_id": vpc.vni},
                        [SetField("metadata", vpc.vni), Load(P.REG_FROM_TUNNEL, 0, 1, 1), goto(P.FORWARD)],
                        "vpc", vid))
    out.append(flow(P.EGRESS_CT, 100, md | {"eth_type": ETH_IP}, [Ct(False, zone, P.EGRESS_ACL.id, ())],
                    "vpc", vid))
    out.append(flow(P.INGRESS_CT, 100, md | {"eth_type": ETH_IP}, [Ct(False, zone, P.INGRESS_ACL.id, ())],
                    "vpc", vid))
    for sn in vpc.subnets:
        out.append(flow(P.ARP_RESPONDER, 100, md | {"eth_type": ETH_ARP, "arp_op": 1, "arp_tpa": sn.gateway_ip},
                        arp_reply(vpc.router_mac, sn.gateway_ip), "vpc", vid))
    # Routing: longest prefix first; only frames addressed to the router MAC are routed.
    router = md | {"eth_dst": vpc.router_mac}
    out.append(flow(P.ROUTING, 1, md, [goto(P.FORWARD)], "vpc", vid))  # same-subnet (L2) traffic
    out.append(flow(P.ROUTING, 2, router, [], "vpc", vid))  # routed, but no route: drop
    for r in vpc.routes:
        plen = ipaddress.IPv4Network(r.destination).prefixlen
        match = router | {"eth_type": ETH_IP}
        if plen:
            match["ipv4_dst"] = prefix(r.destination)
        prio = ROUTE_PRIORITY + 10 * plen
        obj = f"{vid}:{r.destination}"
        if r.target_type == "local":
            out.append(flow(P.ROUTING, prio, match, [DecTtl(), SetField("eth_src", vpc.router_mac),
                                                     goto(P.FORWARD)], "route", obj))
        elif r.target_type == "peering" and r.peer_vpc_id in peers:
            peer = peers[r.peer_vpc_id]
            out.append(flow(P.ROUTING, prio, match, [DecTtl(), SetField("eth_src", peer.router_mac),
                                                     SetField("metadata", peer.vni), goto(P.FORWARD)], "route", obj))
        elif r.target_type in ("nat-gateway", "private-line") and r.gateway_vteps and tunnel_ofport is not None:
            # straight to a NAT (or private-line) instance, in the VPC's own VNI (the gateway tells tenants apart
            # by VNI). With several instances, the VM's source address picks one (its low bits: the bucket), so
            # every flow of a VM meets the same instance and keeps its EIP; a select group would scatter a VM's
            # flows.
            buckets = r.gateway_buckets or r.gateway_vteps[:1]
            if len(set(buckets)) == 1:
                splits = [(match, buckets[0])]
            else:
                mask = str(ipaddress.IPv4Address(len(buckets) - 1))
                splits = [(match | {"ipv4_src": (str(ipaddress.IPv4Address(b)), mask)}, vtep)
                          for b, vtep in enumerate(buckets)]
            for m, vtep in splits:
                out.append(flow(P.ROUTING, prio, m, [DecTtl(), SetField("eth_src", vpc.router_mac),
                                                     SetField("tunnel_id", vpc.vni), SetField("tun_ipv4_dst", vtep),
                                                     Output(tunnel_ofport)], "route", obj))
        else:
            out.append(flow(P.ROUTING, prio, match, [], "route", obj))
    return out + vpc_flows6(vpc, dict(peers), zone, tunnel_ofport)


def arp_answers(reach: Sequence[tuple[str, int, str]], vpc_id: str, ip: str, mac: str, kind: str,
                obj: str) -> list[Flow]:
    """ARP for `ip` (of VPC `vpc_id`, at `mac`) answered in each local VPC that reaches it: with `mac` in its own
    VPC, with the router MAC of a peered one (whose traffic to it is routed)."""
    return [flow(P.ARP_RESPONDER, 100, {"metadata": src_vni, "eth_type": ETH_ARP, "arp_op": 1, "arp_tpa": ip},
                 arp_reply(mac if src_vid == vpc_id else src_mac, ip), kind, f"{src_vid}:{obj}")
            for src_vid, src_vni, src_mac in reach]


def endpoint_flows(e: Endpoint, reach: Sequence[tuple[str, int, str]], host: str, ofport: int | None,
                   tunnel_ofport: int | None) -> list[Flow]:
    """A port this host's ports may reach: ARP answers in each local VPC that reaches it (`reach`: (VPC id, VNI,
    router MAC), its own VPC or a peered one) and where to deliver it."""
    out = arp_answers(reach, e.vpc_id, e.ip, e.mac, "arp", e.port_id)
    if any(vid == e.vpc_id for vid, _, _ in reach):  # its own VPC is local here: on-link to its ports
        out += nd_answers6(e)
    for dst in ({"metadata": e.vni, "eth_type": ETH_IP, "ipv4_dst": e.ip}, endpoint_dst6(e)):
        if dst is not None:
            out += _forward(e, dst, host, ofport, tunnel_ofport if reach else None)
    return out


def _forward(e: Endpoint, dst: dict[str, Any], host: str, ofport: int | None,
             tunnel_ofport: int | None) -> list[Flow]:
    """Where FORWARD sends a packet for port `e` (to `dst`: its IPv4 or IPv6 address)."""
    out: list[Flow] = []
    # the hosts holding the port: one, or two while it migrates live (its traffic then goes to both: the guest
    # answers from wherever it runs, and runs on the destination the moment QEMU switches over)
    remote = [v for h, v in ((e.host, e.vtep_ip), (e.also_host, e.also_vtep_ip)) if h and v and h != host]
    to_tunnel = [a for v in remote for a in (SetField("tun_ipv4_dst", v), Output(tunnel_ofport))] \
        if tunnel_ofport is not None else []
    if host in (e.host, e.also_host) and ofport is not None:
        deliver = [Load(P.REG_DST_PORT, 0, 32, ofport), goto(P.INGRESS_CT)]
        out.append(flow(P.FORWARD, 100, dst, [SetField("eth_dst", e.mac), *deliver], "endpoint", e.port_id))
        if to_tunnel:  # sent here by a local port: a copy to the other host too (from a tunnel: sent there)
            out.append(flow(P.FORWARD, 101, dst | {P.REG_FROM_TUNNEL: 0},
                            [SetField("eth_dst", e.mac), SetField("tunnel_id", e.vni), *to_tunnel, *deliver],
                            "endpoint", e.port_id))
    elif to_tunnel:  # elsewhere, or not plugged here (yet, or any more) while the other host has it
        out.append(flow(P.FORWARD, 100, dst | {P.REG_FROM_TUNNEL: 0},
                        [SetField("eth_dst", e.mac), SetField("tunnel_id", e.vni), *to_tunnel], "endpoint", e.port_id))
    return out


def rule_ids(groups: Iterable[SecurityGroupInfo]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(egress, ingress) rule ids of a port's groups: the conjunctions its port clause joins."""
    eg, ing = set(), set()
    for g in groups:
        for r in (*g.rules, *g.rules6):
            (eg if r.direction == "egress" else ing).add(r.id)
    return tuple(sorted(eg)), tuple(sorted(ing))


def port_flows(p: PortInfo, of: int, vpc: VpcInfo, rules: tuple[tuple[int, ...], tuple[int, ...]],
               tunnel_ofport: int | None) -> list[Flow]:
    """A plugged local VM port: classification, port security, DHCP and DNS, its own EIP, and its clause of every
    security group rule of its groups (`rules`: egress and ingress rule ids)."""
    out = [flow(P.CLASSIFY, 100, {"in_port": of}, [SetField("metadata", vpc.vni), goto(P.PORT_SECURITY)],
                "port", p.id)]
    if p.eip_home_vtep and tunnel_ofport is not None:
        # its own EIP: off-VPC traffic goes to the instance homing that EIP (above the VPC's default route,
        # below every more specific one)
        out.append(flow(P.ROUTING, ROUTE_PRIORITY + 5, {"metadata": vpc.vni, "eth_dst": vpc.router_mac,
                                                        "eth_type": ETH_IP, "ipv4_src": p.ip},
                        [DecTtl(), SetField("eth_src", vpc.router_mac), SetField("tunnel_id", vpc.vni),
                         SetField("tun_ipv4_dst", p.eip_home_vtep), Output(tunnel_ofport)], "port", p.id))
    src = {"in_port": of, "eth_src": p.mac}
    out.append(flow(P.PORT_SECURITY, 100, src | {"eth_type": ETH_IP, "ipv4_src": p.ip}, [goto(P.EGRESS_CT)],
                    "port", p.id))
    out.append(flow(P.PORT_SECURITY, 100, src | {"eth_type": ETH_ARP, "arp_spa": p.ip, "arp_sha": p.mac},
                    [goto(P.ARP_RESPONDER)], "port", p.id))
    out.append(flow(P.PORT_SECURITY, 110, src | {"eth_type": ETH_IP, "ip_proto": 17, "udp_src": 68, "udp_dst": 67},
                    [Controller()], "port", p.id))
    if (gateway := p.gateway_ip) is not None:  # DNS to the VPC's resolver at the gateway (dns.py), whatever its groups
        out.append(flow(P.PORT_SECURITY, 110, src | {"eth_type": ETH_IP, "ipv4_src": p.ip, "ipv4_dst": gateway,
                                                     "ip_proto": 17, "udp_dst": 53}, [Controller()], "port", p.id))
    egress, ingress = rules
    if egress:
        out.append(flow(P.EGRESS_ACL, ACL_PRIORITY, {"in_port": of, "ct_state": CT_NEW_TRK},
                        [Conjunction(rid, 1, 2) for rid in egress], "port", p.id))
    if ingress:
        out.append(flow(P.INGRESS_ACL, ACL_PRIORITY, {P.REG_DST_PORT: of, "ct_state": CT_NEW_TRK},
                        [Conjunction(rid, 1, 2) for rid in ingress], "port", p.id))
    return out + port_flows6(p, of)


def group_flows(g: SecurityGroupInfo, vni: int, zone: int) -> list[Flow]:
    """A security group's rules: the remote clause of each (address, protocol, ports), the conj_id flow that
    commits an allowed connection stamped with the rule's id, and the flows that keep the rule's established
    connections passing (ct_mark: egress rule id; ct_label: ingress rule id)."""
    out = []
    md = {"metadata": vni}
    for v6, rule in [*((False, r) for r in g.rules), *((True, r) for r in g.rules6)]:
        obj = str(rule.id)
        ip = "ipv6" if v6 else "ipv4"
        if rule.direction == "egress":
            table, remote, stamp, nxt = P.EGRESS_ACL, f"{ip}_dst", "ct_mark", P.LB_UNNAT
        else:
            table, remote, stamp, nxt = P.INGRESS_ACL, f"{ip}_src", "ct_label", P.DELIVER
        for mt in rule_matches(rule, remote, v6):
            out.append(flow(table, ACL_PRIORITY, md | mt, [Conjunction(rule.id, 2, 2)], "rule", obj))
        out.append(flow(table, ACL_PRIORITY, {"conj_id": rule.id, "eth_type": ETH_IPV6 if v6 else ETH_IP,
                                              "ct_state": CT_NEW_TRK},
                        [Ct(True, zone, None, (Load(stamp, 0, 32, rule.id),)), goto(nxt)], "rule", obj))
        if rule.direction == "egress":
            for state in (P.CT_EST, P.CT_REL):
                st = {"ct_state": (state | P.CT_TRK, state | P.CT_TRK | P.CT_NEW), "ct_mark": rule.id}
                for t, label_table in ((P.EGRESS_ACL, P.EGRESS_ACL_LABEL), (P.INGRESS_ACL, P.INGRESS_ACL_LABEL)):
                    out.append(flow(t, 150, st, [goto(label_table)], "rule", obj))
        else:
            for t, after in ((P.EGRESS_ACL_LABEL, P.LB_UNNAT), (P.INGRESS_ACL_LABEL, P.DELIVER)):
                out.append(flow(t, 100, {"ct_label": (rule.id, ALL32)}, [goto(after)], "rule", obj))
    return out


def merge_conjunctive(flows: Iterable[Flow]) -> Flow:
    """Clause flows of several objects with one (table, priority, match): one flow carrying all their
    conjunctions (OpenFlow keeps one flow per match, so they cannot be installed apart)."""
    flows = list(flows)
    if len(flows) == 1:
        return flows[0]
    first = min(flows, key=lambda f: f.cookie >> 32)
    actions = tuple(sorted({a for f in flows for a in f.actions}))
    return Flow(first.table, first.priority, first.match, actions, first.kind, first.obj_hash)


# --- the whole host, from scratch ---------------------------------------------------------------------------

def reach_of(local_vpcs: Iterable[str], vpcs: Mapping[str, VpcInfo]) -> dict[str, list]:
    """Endpoint VPC -> (VPC id, VNI, router MAC) of the local VPCs that reach it: itself, or through a peering."""
    reach: dict[str, set[str]] = {}
    for vid in local_vpcs:
        reach.setdefault(vid, set()).add(vid)
        for r in vpcs[vid].routes:
            if r.target_type == "peering" and r.peer_vpc_id:
                reach.setdefault(r.peer_vpc_id, set()).add(vid)
    return {u: [(v, vpcs[v].vni, vpcs[v].router_mac) for v in sorted(src)] for u, src in reach.items()}


def peers_of(vpc: VpcInfo, vpcs: Mapping[str, VpcInfo]) -> dict[str, VpcInfo]:
    return {r.peer_vpc_id: vpcs[r.peer_vpc_id] for r in vpc.routes
            if r.target_type == "peering" and r.peer_vpc_id in vpcs}


def compute_flows(cfg: HostConfig, ofports: Mapping[str, int], tunnel_ofport: int | None,
                  zones: Mapping[str, int]) -> set[Flow]:
    """Every flow br-int needs for `cfg`. `ofports` maps plugged port ids to OpenFlow ports; ports not
    plugged yet get no flows. `zones` maps VPC ids with local ports to their conntrack zone."""
    vpcs = {v.id: v for v in cfg.vpcs}
    groups = {g.id: g for g in cfg.security_groups}
    local_vpcs = sorted({p.vpc_id for p in cfg.ports})
    out: list[Flow] = base_flows()
    for v in cfg.vteps:
        if v.ip != cfg.vtep_ip:
            out += vtep_flows(v.host, v.ip, tunnel_ofport)
    for vid in local_vpcs:
        out += vpc_flows(vpcs[vid], peers_of(vpcs[vid], vpcs), zones[vid], tunnel_ofport)
    reach = reach_of(local_vpcs, vpcs)
    for e in cfg.endpoints:
        out += endpoint_flows(e, reach.get(e.vpc_id, []), cfg.host, ofports.get(e.port_id), tunnel_ofport)
    for p in cfg.ports:
        if (of := ofports.get(p.id)) is not None:
            out += port_flows(p, of, vpcs[p.vpc_id], rule_ids(groups[g] for g in p.security_group_ids
                                                              if g in groups), tunnel_ofport)
    for g in cfg.security_groups:
        if g.vpc_id in zones:
            out += group_flows(g, vpcs[g.vpc_id].vni, zones[g.vpc_id])
    from vswitch_agent.lb_flows import lb_flows, members_here  # it builds on this module's helpers

    for vid, vpc in vpcs.items():
        for lb in vpc.load_balancers:
            out += lb_flows(lb, vpc, reach.get(vid, []), members_here(lb, ofports, zones), tunnel_ofport)
    return merge_all(out)


def merge_all(flows: Iterable[Flow]) -> set[Flow]:
    plain: set[Flow] = set()
    clauses: dict[tuple, list[Flow]] = {}
    for f in flows:
        if f.conjunctive:
            clauses.setdefault((f.table, f.priority, f.match), []).append(f)
        else:
            plain.add(f)
    return plain | {merge_conjunctive(fs) for fs in clauses.values()}
