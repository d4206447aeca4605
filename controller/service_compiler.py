"""Compile a service instance's sections: the service endpoints it serves, per VPC.

An endpoint is served by one live instance of role `service` (`compiler.service_home`, rendezvous hashing over the
live ones: when one dies, only its endpoints move), which is also where the vSwitches tunnel the endpoint's address
(the endpoint's port is an `Endpoint` on that instance's VTEP). A section carries each endpoint with its service's
addresses and ports, its own source address on the service network (answered ARP for there: `eips`), its ingress
security-group rules, and the VPC's ports (the replies' way back)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from controller.compiler import groups_fragments, service_home
from controller.fragments import digest_of
from tianji.served import ServiceEndpointServed, ServicePortServed, ServiceRuleServed
from tianji.southbound import GatewaySection, GatewayVpc

SERVICE_ROLE = "service"


def _rules(groups: list[str], vpc_groups: dict) -> list[ServiceRuleServed]:
    """The ingress rules of the endpoint's groups, as addresses (a remote group: its members)."""
    out = []
    for gid in groups:
        g = vpc_groups.get(gid)
        for r in g.rules if g else ():
            if r.direction == "ingress":
                out.append(ServiceRuleServed.model_construct(protocol=r.protocol, port_min=r.port_range_min,
                                                             port_max=r.port_range_max, cidrs=list(r.remote_cidrs)))
    return out


def service_sections(name: str, vpcs: dict[str, Any], rows: list, rule_rows: list, member_rows: list,
                     endpoints: dict[str, tuple], live: dict[str, str]) -> dict[str, tuple[GatewaySection, str]]:
    """The sections of these VPCs for service instance `name`: the endpoints homed here that can carry traffic (a
    source address allocated; the operator's services: a published load balancer is reached through its VIP in
    its own VPC, which this data path does not do yet)."""
    eps: dict[str, Any] = {}
    groups_of: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        eps.setdefault(r.id, r)
        if r.group_id is not None:
            groups_of[r.id].append(r.group_id)
    groups = groups_fragments(rule_rows, member_rows, list(vpcs))
    by_vpc: dict[str, list[ServiceEndpointServed]] = defaultdict(list)
    for eid, r in eps.items():
        if r.source_address is None or r.load_balancer_id is not None or service_home(eid, live) != name:
            continue
        v = vpcs[r.vpc_id]
        by_vpc[r.vpc_id].append(ServiceEndpointServed.model_construct(
            id=eid, vni=v.vni, ip=r.ip, mac=r.mac, source=r.source_address, addresses=list(r.addresses),
            ports=[ServicePortServed.model_construct(protocol=p["protocol"], port=p["port"]) for p in r.ports],
            proxy_protocol=bool(r.proxy_protocol), rules=_rules(sorted(groups_of[eid]), groups[r.vpc_id]),
            mtu=v.mtu))
    out = {}
    for vid, served in by_vpc.items():
        v = vpcs[vid]
        sec = GatewaySection.model_construct(
            vpc=GatewayVpc.model_construct(id=vid, vni=v.vni, router_mac=v.router_mac, mtu=v.mtu, snat=[]),
            static=[], dnat=[], endpoints=list(endpoints[vid]), eips=sorted(e.source for e in served), lbs=[],
            lines=[], services=served)
        out[vid] = (sec, digest_of(sec.model_dump_json()))
    return out


__all__ = ["SERVICE_ROLE", "service_sections"]
