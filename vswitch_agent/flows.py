"""Flows as data, computed by a pure function of the host's config.

`compute_flows(cfg, ofports, tunnel_ofport, zones)` returns the complete set of flows br-int must hold.
A Flow is hashable and carries a cookie derived from its content and the object it came from, so the
reconciler can diff desired against installed by cookie alone.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.hostconfig import HostConfig, SecurityGroupRuleInfo, VpcInfo
from vswitch_agent import pipeline as P

ETH_IP, ETH_ARP = 0x0800, 0x0806
ROUTE_PRIORITY = 1000  # + 10 x prefix length: longest prefix first, with room for a port's own default (+5)
PROTO = {"tcp": 6, "udp": 17, "icmp": 1}
ALL32 = 0xFFFFFFFF

Action = tuple[Any, ...]


@dataclass(frozen=True)
class Flow:
    table: int
    priority: int
    match: tuple[tuple[str, Any], ...]
    actions: tuple[Action, ...]  # empty: drop
    kind: str = field(default="base", compare=False)
    obj: str = field(default="", compare=False)

    @property
    def cookie(self) -> int:
        h = hashlib.blake2b(repr((self.table, self.priority, self.match, self.actions)).encode(), digest_size=4)
        o = hashlib.blake2b(self.obj.encode(), digest_size=3)
        return (P.COOKIE_KINDS[self.kind] << 56) | (int.from_bytes(o.digest()) << 32) | int.from_bytes(h.digest())

    def m(self) -> dict[str, Any]:
        return dict(self.match)

    def __str__(self) -> str:
        match = ",".join(f"{k}={v}" for k, v in self.match)
        return f"table={self.table} priority={self.priority} {match} actions={list(self.actions) or 'drop'}"


def flow(table: P.Table, priority: int, match: Mapping[str, Any], actions: Iterable[Action] = (),
         kind: str = "base", obj: str = "") -> Flow:
    return Flow(table.id, priority, tuple(sorted(match.items())), tuple(actions), kind, obj)


def goto(t: P.Table) -> Action:
    return ("goto", t.id)


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


def rule_matches(rule: SecurityGroupRuleInfo, remote_field: str) -> list[dict[str, Any]]:
    """Match dicts for one rule, one per (remote CIDR x port block)."""
    base: dict[str, Any] = {"eth_type": ETH_IP}
    if rule.protocol != "any":
        base["ip_proto"] = PROTO[rule.protocol]
    port_sets: list[dict[str, Any]] = [{}]
    if rule.protocol in ("tcp", "udp") and rule.port_range_min is not None:
        key = f"{rule.protocol}_dst"
        port_sets = [{key: v if m == 0xFFFF else (v, m)} for v, m in port_masks(rule.port_range_min,
                                                                                  rule.port_range_max)]
    out = []
    for cidr in rule.remote_cidrs:
        remote = {} if cidr == "0.0.0.0/0" else {remote_field: prefix(cidr)}
        for ports in port_sets:
            out.append(base | remote | ports)
    return out


def arp_reply(mac: str, ip: str) -> tuple[Action, ...]:
    """Turn an ARP request into the reply for (ip, mac) and bounce it out of the port it came in on."""
    mac_int = int(mac.replace(":", ""), 16)
    ip_int = int(ipaddress.IPv4Address(ip))
    return (
        ("move", "eth_src", "eth_dst", 48),
        ("set", "eth_src", mac),
        ("set", "arp_op", 2),
        ("move", "arp_sha", "arp_tha", 48),
        ("load", "arp_sha", 0, 48, mac_int),
        ("move", "arp_spa", "arp_tpa", 32),
        ("load", "arp_spa", 0, 32, ip_int),
        ("output", P.OFPP_IN_PORT),
    )


def compute_flows(cfg: HostConfig, ofports: Mapping[str, int], tunnel_ofport: int | None,
                  zones: Mapping[str, int]) -> set[Flow]:
    """Every flow br-int needs for `cfg`. `ofports` maps plugged port ids to OpenFlow ports; ports not
    plugged yet get no flows. `zones` maps VPC ids with local ports to their conntrack zone."""
    flows: set[Flow] = set()
    add = flows.add
    vpcs: dict[str, VpcInfo] = {v.id: v for v in cfg.vpcs}
    groups = {g.id: g for g in cfg.security_groups}
    local_vpcs = {p.vpc_id for p in cfg.ports}

    # Default drops: every table ends in an explicit, counted drop.
    for t in P.TABLES:
        if t is not P.DELIVER:
            add(flow(t, 0, {}))
    add(flow(P.DELIVER, 0, {}, [("output_reg", P.REG_DST_PORT)]))

    # Tunnel: accepted only from registered VTEPs (never from ourselves), only for VPCs with local ports.
    if tunnel_ofport is not None:
        for v in cfg.vteps:
            if v.ip != cfg.vtep_ip:
                add(flow(P.CLASSIFY, 100, {"in_port": tunnel_ofport, "tun_ipv4_src": v.ip}, [goto(P.TUNNEL_VNI)],
                         "vtep", v.host))
        for vid in local_vpcs:
            vni = vpcs[vid].vni
            add(flow(P.TUNNEL_VNI, 100, {"tunnel_id": vni},
                     [("set", "metadata", vni), ("load", P.REG_FROM_TUNNEL, 0, 1, 1), goto(P.FORWARD)], "vpc", vid))

    # Per VPC with local ports: conntrack zones, routing, ARP for gateways and reachable IPs.
    for vid in local_vpcs:
        vpc = vpcs[vid]
        zone = zones[vid]
        md = {"metadata": vpc.vni}
        add(flow(P.EGRESS_CT, 100, md | {"eth_type": ETH_IP},
                 [("ct", False, zone, P.EGRESS_ACL.id, ())], "vpc", vid))
        for sn in vpc.subnets:
            add(flow(P.ARP_RESPONDER, 100, md | {"eth_type": ETH_ARP, "arp_op": 1, "arp_tpa": sn.gateway_ip},
                     arp_reply(vpc.router_mac, sn.gateway_ip), "vpc", vid))
        # Routing: longest prefix first; only frames addressed to the router MAC are routed.
        router = md | {"eth_dst": vpc.router_mac}
        add(flow(P.ROUTING, 1, md, [goto(P.FORWARD)], "vpc", vid))  # same-subnet (L2) traffic
        add(flow(P.ROUTING, 2, router, [], "vpc", vid))  # routed, but no route: drop
        for r in vpc.routes:
            plen = ipaddress.IPv4Network(r.destination).prefixlen
            match = router | {"eth_type": ETH_IP}
            if plen:
                match["ipv4_dst"] = prefix(r.destination)
            prio = ROUTE_PRIORITY + 10 * plen
            obj = f"{vid}:{r.destination}"
            if r.target_type == "local":
                add(flow(P.ROUTING, prio, match, [("dec_ttl",), ("set", "eth_src", vpc.router_mac),
                                                  goto(P.FORWARD)], "route", obj))
            elif r.target_type == "peering" and r.peer_vpc_id in vpcs:
                peer = vpcs[r.peer_vpc_id]
                add(flow(P.ROUTING, prio, match, [("dec_ttl",), ("set", "eth_src", peer.router_mac),
                                                  ("set", "metadata", peer.vni), goto(P.FORWARD)], "route", obj))
            elif r.target_type == "nat-gateway" and r.gateway_vteps and tunnel_ofport is not None:
                # straight to a NAT instance, in the VPC's own VNI (the gateway tells tenants apart by VNI). With
                # several instances, the VM's source address picks one (its low bits: the bucket), so every flow
                # of a VM meets the same instance and keeps its EIP. A select group would hash per flow and
                # scatter one VM over instances holding different EIPs.
                buckets = r.gateway_buckets or r.gateway_vteps[:1]
                if len(set(buckets)) == 1:
                    splits = [(match, buckets[0])]
                else:
                    mask = str(ipaddress.IPv4Address(len(buckets) - 1))
                    splits = [(match | {"ipv4_src": (str(ipaddress.IPv4Address(b)), mask)}, vtep)
                              for b, vtep in enumerate(buckets)]
                for m, vtep in splits:
                    add(flow(P.ROUTING, prio, m, [("dec_ttl",), ("set", "eth_src", vpc.router_mac),
                                                  ("set", "tunnel_id", vpc.vni), ("set", "tun_ipv4_dst", vtep),
                                                  ("output", tunnel_ofport)], "route", obj))
            else:
                add(flow(P.ROUTING, prio, match, [], "route", obj))

    # Endpoints: ARP answers for the VPCs that can reach them, and where to deliver them.
    reach: dict[str, set[str]] = {}  # endpoint VPC -> local VPCs that reach it (itself, or peered)
    for vid in local_vpcs:
        reach.setdefault(vid, set()).add(vid)
        for r in vpcs[vid].routes:
            if r.target_type == "peering" and r.peer_vpc_id:
                reach.setdefault(r.peer_vpc_id, set()).add(vid)
    for e in cfg.endpoints:
        for src_vid in reach.get(e.vpc_id, ()):
            src = vpcs[src_vid]
            mac = e.mac if src_vid == e.vpc_id else src.router_mac
            add(flow(P.ARP_RESPONDER, 100, {"metadata": src.vni, "eth_type": ETH_ARP, "arp_op": 1,
                                             "arp_tpa": e.ip}, arp_reply(mac, e.ip), "arp", f"{src_vid}:{e.port_id}"))
        dst = {"metadata": e.vni, "eth_type": ETH_IP, "ipv4_dst": e.ip}
        if e.host == cfg.host:
            if e.port_id in ofports:
                add(flow(P.FORWARD, 100, dst, [("set", "eth_dst", e.mac),
                                               ("load", P.REG_DST_PORT, 0, 32, ofports[e.port_id]),
                                               goto(P.INGRESS_CT)], "endpoint", e.port_id))
        elif tunnel_ofport is not None and e.vpc_id in reach:
            add(flow(P.FORWARD, 100, dst | {P.REG_FROM_TUNNEL: 0},
                     [("set", "eth_dst", e.mac), ("set", "tunnel_id", e.vni), ("set", "tun_ipv4_dst", e.vtep_ip),
                      ("output", tunnel_ofport)], "endpoint", e.port_id))

    # Per local VM port: classification, port security, DHCP, security group rules.
    live_egress: set[int] = set()
    live_ingress: set[int] = set()
    for p in cfg.ports:
        of = ofports.get(p.id)
        if of is None:
            continue
        vpc = vpcs[p.vpc_id]
        zone = zones[p.vpc_id]
        add(flow(P.CLASSIFY, 100, {"in_port": of}, [("set", "metadata", vpc.vni), goto(P.PORT_SECURITY)],
                 "port", p.id))
        if p.eip_home_vtep and tunnel_ofport is not None:
            # its own EIP: off-VPC traffic goes to the instance homing that EIP (above the VPC's default route,
            # below every more specific one)
            add(flow(P.ROUTING, ROUTE_PRIORITY + 5, {"metadata": vpc.vni, "eth_dst": vpc.router_mac, "eth_type": ETH_IP,
                                                     "ipv4_src": p.ip},
                     [("dec_ttl",), ("set", "eth_src", vpc.router_mac), ("set", "tunnel_id", vpc.vni),
                      ("set", "tun_ipv4_dst", p.eip_home_vtep), ("output", tunnel_ofport)], "port", p.id))
        src = {"in_port": of, "eth_src": p.mac}
        add(flow(P.PORT_SECURITY, 100, src | {"eth_type": ETH_IP, "ipv4_src": p.ip}, [goto(P.EGRESS_CT)],
                 "port", p.id))
        add(flow(P.PORT_SECURITY, 100, src | {"eth_type": ETH_ARP, "arp_spa": p.ip, "arp_sha": p.mac},
                 [goto(P.ARP_RESPONDER)], "port", p.id))
        add(flow(P.PORT_SECURITY, 110, src | {"eth_type": ETH_IP, "ip_proto": 17, "udp_src": 68, "udp_dst": 67},
                 [("controller",)], "port", p.id))
        for gid in p.security_group_ids:
            g = groups.get(gid)
            if g is None:
                continue
            for rule in g.rules:
                if rule.direction == "egress":
                    live_egress.add(rule.id)
                    for mt in rule_matches(rule, "ipv4_dst"):
                        add(flow(P.EGRESS_ACL, 100, mt | {"in_port": of, "ct_state": (P.CT_NEW | P.CT_TRK,
                                                                                      P.CT_NEW | P.CT_TRK)},
                                 [("ct", True, zone, None, (("load", "ct_mark", 0, 32, rule.id),)),
                                  goto(P.ROUTING)], "rule", f"{p.id}:{rule.id}"))
                else:
                    live_ingress.add(rule.id)
                    for mt in rule_matches(rule, "ipv4_src"):
                        add(flow(P.INGRESS_ACL, 100, mt | {P.REG_DST_PORT: of, "ct_state": (P.CT_NEW | P.CT_TRK,
                                                                                           P.CT_NEW | P.CT_TRK)},
                                 [("ct", True, zone, None, (("load", "ct_label", 0, 32, rule.id),)),
                                  goto(P.DELIVER)], "rule", f"{p.id}:{rule.id}"))

    for vid in local_vpcs:
        vpc = vpcs[vid]
        add(flow(P.INGRESS_CT, 100, {"metadata": vpc.vni, "eth_type": ETH_IP},
                 [("ct", False, zones[vid], P.INGRESS_ACL.id, ())], "vpc", vid))

    # Established/related traffic passes while the rules that admitted it live.
    inv = {"ct_state": (P.CT_INV | P.CT_TRK, P.CT_INV | P.CT_TRK)}
    add(flow(P.EGRESS_ACL, 200, inv))
    add(flow(P.INGRESS_ACL, 200, inv))
    for state in (P.CT_EST, P.CT_REL):
        st = {"ct_state": (state | P.CT_TRK, state | P.CT_TRK | P.CT_NEW)}
        for table, nxt in ((P.EGRESS_ACL, P.EGRESS_ACL_LABEL), (P.INGRESS_ACL, P.INGRESS_ACL_LABEL)):
            add(flow(table, 150, st | {"ct_mark": 0}, [goto(nxt)]))
            for rid in live_egress:
                add(flow(table, 150, st | {"ct_mark": rid}, [goto(nxt)], "rule", str(rid)))
    for table, nxt in ((P.EGRESS_ACL_LABEL, P.ROUTING), (P.INGRESS_ACL_LABEL, P.DELIVER)):
        add(flow(table, 100, {"ct_label": (0, ALL32)}, [goto(nxt)]))
        for rid in live_ingress:
            add(flow(table, 100, {"ct_label": (rid, ALL32)}, [goto(nxt)], "rule", str(rid)))
    return flows
