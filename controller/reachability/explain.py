"""A switch's steps in words: each table a packet met (ofmodel's `hits`), the flow that matched there and the
object that flow comes from (its cookie names the kind and the object; a security group rule is the conjunction
that matched), said the way a tenant would say it: "allowed by ingress rule 12 of group web", "no route to
8.8.8.8 in VPC prod", "no ingress rule of groups [db] allows tcp/443 from 10.0.1.5".

Conntrack tables and pass-through steps say nothing a tenant needs and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tianji.southbound import SecurityGroupRuleInfo, VpcInfo
from vswitch_agent import pipeline as P
from vswitch_agent.flow import KIND_NAMES, object_hash
from vswitch_agent.model_host import ModelHost
from vswitch_agent.ofmodel import Hit

TABLES = {t.id: t for t in P.TABLES}
QUIET = {P.EGRESS_CT.id, P.INGRESS_CT.id, P.LB_UNNAT.id, P.INGRESS_ACL_LABEL.id, P.EGRESS_ACL_LABEL.id,
         P.PATH_MTU.id}  # a question has no length: the path MTU passes it
PROTO_NAMES = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmp"}


def src_of(pkt: dict) -> Any:
    return pkt.get("ipv4_src", pkt.get("ipv6_src"))


def dst_of(pkt: dict) -> Any:
    return pkt.get("ipv4_dst", pkt.get("ipv6_dst"))


@dataclass
class Step:
    table: str
    does: str
    object: dict[str, Any] | None = None  # what the step's flow comes from: {"kind": ..., "id": ...}
    tenant_id: str | None = field(default=None, repr=False)  # whose configuration decided (the API hides another's)

    @property
    def dropped(self) -> bool:
        return self.does.endswith(": dropped")


class Names:
    """A host's objects by what flows carry of them: rule ids, VNIs, object hashes."""

    def __init__(self, m: ModelHost) -> None:
        cfg = m.cfg
        self.m = m
        self.vpcs = {v.vni: v for v in cfg.vpcs}
        self.rules = {r.id: (g.id, g.vpc_id, r) for g in cfg.security_groups for r in (*g.rules, *g.rules6)}
        self.routes = {object_hash(f"{v.id}:{r.destination}"): (v, r) for v in cfg.vpcs
                       for r in (*v.routes, *v.routes6)}
        self.endpoints = {object_hash(e.port_id): e for e in cfg.endpoints}
        self.ports = {p.id: p for p in cfg.ports}
        self.hosts = {object_hash(v.host): v.host for v in cfg.vteps}

    def vpc(self, pkt: dict) -> VpcInfo | None:
        return self.vpcs.get(pkt.get("metadata", 0))

    def tenant(self, vpc_id: str) -> str | None:
        return next((v.tenant_id for v in self.vpcs.values() if v.id == vpc_id), None)

    def whose(self, pkt: dict) -> str | None:
        """The tenant whose configuration the switch applies to `pkt`: its VPC's (metadata), else its VNI's (from a
        tunnel), else its port's (from a VM)."""
        vpc = self.vpc(pkt) or self.vpcs.get(pkt.get("tunnel_id", -1))
        if vpc is not None:
            return vpc.tenant_id
        port = self.ports.get(self.m.where(pkt.get("in_port")) or "")
        return self.tenant(port.vpc_id) if port is not None else None


def explain(m: ModelHost) -> list[Step]:
    """The steps of the last packet `m`'s switch took."""
    names = Names(m)
    out = []
    for hit in m.switch.hits:
        if hit.table in QUIET and not _drop(hit):
            continue
        step = _step(names, hit)
        if step is not None:
            if step.tenant_id is None:  # every step is some tenant's: a step no builder attributed is its packet's
                step.tenant_id = names.whose(hit.pkt)
            out.append(step)
    return out


def _drop(hit: Hit) -> bool:
    f = hit.flow
    return f is None or (not f.actions and f.goto is None)


def _step(n: Names, hit: Hit) -> Step | None:
    table = TABLES[hit.table]
    if hit.flow is None:
        return Step(table.name, "no flow matched: dropped")
    kind = KIND_NAMES[hit.flow.cookie >> 56]
    obj = (hit.flow.cookie >> 32) & 0xFFFFFF
    if table in (P.EGRESS_ACL, P.INGRESS_ACL, P.EGRESS_ACL_LABEL, P.INGRESS_ACL_LABEL):
        return _acl(n, table, hit)
    if table is P.ROUTING:
        return _routing(n, hit, kind, obj)
    if table is P.FORWARD:
        return _forward(n, hit, kind, obj)
    return _plain(n, table, hit, kind, obj)


def _plain(n: Names, table: P.Table, hit: Hit, kind: str, obj: int) -> Step | None:
    pkt, drop = hit.pkt, _drop(hit)
    if table is P.CLASSIFY:
        if drop:
            return Step(table.name, "from no known port or registered VTEP: dropped")
        if kind == "vtep":
            return Step(table.name, f"VXLAN from host {n.hosts.get(obj, pkt.get('tun_ipv4_src'))}")
        return None
    if table is P.TUNNEL_VNI:
        vpc = n.vpcs.get(pkt.get("tunnel_id", 0))
        if drop or vpc is None:
            return Step(table.name, f"VNI {pkt.get('tunnel_id')} has no port on this host: dropped")
        return Step(table.name, f"VNI {vpc.vni} is VPC {vpc.id}", {"kind": "vpc", "id": vpc.id}, vpc.tenant_id)
    if table is P.PORT_SECURITY:
        port = n.m.where(pkt.get("in_port"))
        if drop:
            return Step(table.name, f"source MAC {pkt.get('eth_src')} / address {src_of(pkt)} is not port "
                                    f"{port}'s own (anti-spoofing): dropped")
        return Step(table.name, f"source MAC and address are port {port}'s", {"kind": "port", "id": port},
                    n.tenant(n.ports[port].vpc_id) if port in n.ports else None)
    if table is P.DELIVER:
        port = n.m.where(pkt.get(P.REG_DST_PORT))
        return Step(table.name, f"delivered to port {port}", {"kind": "port", "id": port})
    if drop:
        return Step(table.name, f"{table.does.rstrip('.')} (nothing matched): dropped")
    return Step(table.name, f"{kind} flow: {table.does.split('.')[0]}")


def _routing(n: Names, hit: Hit, kind: str, obj: int) -> Step:
    pkt, vpc = hit.pkt, n.vpc(hit.pkt)
    vid = vpc.id if vpc else "?"
    tenant = vpc.tenant_id if vpc else None
    if kind == "route" and obj in n.routes:
        v, r = n.routes[obj]
        target = r.target_type + (f" {r.target_id}" if r.target_id else "")
        ref = {"kind": "route", "vpc_id": v.id, "destination": r.destination, "target_type": r.target_type,
               "target_id": r.target_id}
        if _drop(hit):
            return Step("routing", f"route {r.destination} of VPC {v.id} is a {target}: dropped", ref, v.tenant_id)
        via = ""
        if r.target_type == "peering":  # the peer's VPC is named only to its own tenant (within one tenant)
            via = f" into VPC {r.peer_vpc_id}" if n.tenant(r.peer_vpc_id or "") == v.tenant_id else \
                " into the peer tenant's VPC"
        return Step("routing", f"route {r.destination} -> {target}{via}", ref, v.tenant_id)
    if kind == "port":
        return Step("routing", f"the source's own EIP: to the NAT instance homing it ({src_of(hit.pkt)})")
    if _drop(hit):
        return Step("routing", f"no route to {dst_of(pkt)} in VPC {vid}'s route table: dropped",
                    {"kind": "vpc", "id": vid}, tenant)
    return Step("routing", "same subnet: switched, not routed", {"kind": "vpc", "id": vid}, tenant)


def _forward(n: Names, hit: Hit, kind: str, obj: int) -> Step:
    pkt, vpc = hit.pkt, n.vpc(hit.pkt)
    dst = dst_of(pkt)
    if kind == "endpoint" and obj in n.endpoints:
        e = n.endpoints[obj]
        where = "here" if e.host == n.m.cfg.host else f"on host {e.host} (VTEP {e.vtep_ip}), over VXLAN VNI {e.vni}"
        return Step("forward", f"{dst} is port {e.port_id} of VPC {e.vpc_id}, {where}",
                    {"kind": "port", "id": e.port_id, "host": e.host}, n.tenant(e.vpc_id))
    if kind == "lb":
        return Step("forward", f"{dst} is a load balancer's VIP: to one of its instances")
    if _drop(hit):
        return Step("forward", f"no port has address {dst} in VPC {vpc.id if vpc else '?'}: dropped")
    return Step("forward", f"{kind} flow: to {dst}")


def _acl(n: Names, table: P.Table, hit: Hit) -> Step:
    pkt = hit.pkt
    direction = "egress" if table in (P.EGRESS_ACL, P.EGRESS_ACL_LABEL) else "ingress"
    if hit.conj_id is not None and hit.conj_id in n.rules:
        gid, vid, rule = n.rules[hit.conj_id]
        return Step(table.name, f"allowed by {direction} rule {rule.id} of security group {gid}: {describe(rule)}",
                    {"kind": "security_group_rule", "id": rule.id, "security_group_id": gid}, n.tenant(vid))
    if not _drop(hit):
        return Step(table.name, f"an established connection ({direction} rule still in place)")
    if table in (P.EGRESS_ACL_LABEL, P.INGRESS_ACL_LABEL):
        return Step(table.name, "the rule that admitted this connection was removed: dropped")
    port = n.m.where(pkt.get("in_port") if direction == "egress" else pkt.get(P.REG_DST_PORT))
    p = n.ports.get(port)
    groups = sorted(p.security_group_ids) if p else []
    what = flow_words(pkt)
    peer = f"to {dst_of(pkt)}" if direction == "egress" else f"from {src_of(pkt)}"
    if pkt.get("ct_state", 0) & P.CT_INV:
        return Step(table.name, "invalid connection state: dropped")
    return Step(table.name, f"no {direction} rule of port {port}'s security groups {groups} allows {what} {peer}: "
                            "dropped", {"kind": "port", "id": port, "security_group_ids": groups},
                n.tenant(p.vpc_id) if p else None)


def flow_words(pkt: dict) -> str:
    proto = PROTO_NAMES.get(pkt.get("ip_proto", 0), str(pkt.get("ip_proto")))
    port = pkt.get(f"{proto}_dst")
    return f"{proto}/{port}" if port is not None else proto


def describe(rule: SecurityGroupRuleInfo) -> str:
    ports = ""
    if rule.port_range_min is not None:
        hi = rule.port_range_max
        ports = f"/{rule.port_range_min}" + (f"-{hi}" if hi not in (None, rule.port_range_min) else "")
    side = "to" if rule.direction == "egress" else "from"
    remotes = ", ".join(rule.remote_cidrs) if len(rule.remote_cidrs) <= 4 else f"{len(rule.remote_cidrs)} addresses"
    return f"{rule.protocol}{ports} {side} {remotes or 'nowhere'}"

