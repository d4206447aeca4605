"""Compile a service instance's sections: the service endpoints it serves, per VPC.

An endpoint is served by one live instance of role `service` (`compiler.service_home`, rendezvous hashing over the
live ones: when one dies, only its endpoints move), which is also where the vSwitches tunnel the endpoint's address
(the endpoint's port is an `Endpoint` on that instance's VTEP). A section carries each endpoint with its service's
addresses and ports, its own source address on the service network (answered ARP for there: `eips`), its ingress
security-group rules, the VPC's ports (the replies' way back) and its peers' blocks and VNIs (a peer's VMs reach
the endpoint through the peering; their replies go back in the peer's VNI, to its ports, which the peer's own
section carries)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from controller.roles.role import CompileInputs, RoleCompiler, Sections, section_of
from controller.southbound.compiler import service_home
from controller.southbound.groups import groups_fragments
from controller.southbound.placement import home
from controller.state.reads import (
    Q_GROUP_MEMBERS,
    Q_GROUP_RULES,
    Q_PROVIDER_SIDES,
    Q_SERVICE_ENDPOINTS,
    Q_SERVICE_PEERS,
)
from controller.state.service_models import may_use
from tianji.served import ServiceEndpointServed, ServicePeerServed, ServicePortServed, ServiceRuleServed
from tianji.southbound import Endpoint, ServiceSection

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


def service_sections(c: CompileInputs) -> Sections:
    """The sections of these VPCs for service instance `c.name`: the endpoints homed here that may carry traffic
    (a source allocated, the tenant still allowed), each VPC's ports (the replies' way back); for a VPC whose
    load balancer is published with endpoints homed here, its VIP, reached through one of its LB instances (the
    provider's side of those endpoints: their provider ports are the VPC's, homed here); and for a VPC peered with
    one that has endpoints, its ports alone (its VMs reach those endpoints; the replies go back in its VNI)."""
    name, vpcs, rows, live, lb_instances = c.name, c.vpcs, c.rows, c.live, c.topology.lb_instances
    peers: dict[str, list[ServicePeerServed]] = defaultdict(list)
    for r in rows["peers"]:
        peers[r.vpc_id].append(ServicePeerServed.model_construct(cidr=r.cidr, vni=r.vni))
    served = _served(name, vpcs, rows, live, peers)
    vips: dict[str, dict[str, Endpoint]] = defaultdict(dict)  # provider VPC -> VIP -> the LB instance reached
    for r in rows["sides"]:
        lb = home(f"vip:{r.vip_port_id}", lb_instances)
        if service_home(r.id, live) == name and lb is not None:
            vips[r.vpc_id][r.vip_address] = Endpoint.model_construct(
                port_id=r.vip_port_id, vpc_id=r.vpc_id, vni=vpcs[r.vpc_id].vni, ip=r.vip_address, mac=r.vip_mac,
                host=lb, vtep_ip=lb_instances[lb])
    out = {}
    # a peer: the view holds it for its peering with a VPC that has endpoints (their homes are not known here)
    for vid in served.keys() | vips.keys() | (peers.keys() & vpcs.keys()):
        mine = served.get(vid, [])
        out[vid] = section_of(ServiceSection, vid, vpcs[vid],
                              endpoints=[*c.endpoints[vid], *vips.get(vid, {}).values()],
                              eips=sorted(e.source for e in mine if not e.via_vni), services=mine)
    return out


def _served(name: str, vpcs: dict[str, Any], rows: dict[str, list], live: dict[str, str],
            peers: dict[str, list[ServicePeerServed]]) -> dict[str, list[ServiceEndpointServed]]:
    """VPC -> the endpoints homed here that may carry traffic."""
    eps: dict[str, Any] = {}
    groups_of: dict[str, list[str]] = defaultdict(list)
    for r in rows["svc"]:
        eps.setdefault(r.id, r)
        if r.group_id is not None:
            groups_of[r.id].append(r.group_id)
    groups = groups_fragments(rows["rules"], rows["members"], list(vpcs))
    served: dict[str, list[ServiceEndpointServed]] = defaultdict(list)
    for eid, r in eps.items():
        if service_home(eid, live) != name or not may_use(r.owner, r.allowed_tenants, r.tenant_id):
            continue
        published = r.load_balancer_id is not None
        source = r.provider_ip if published else r.source_address
        if source is None:
            continue
        v = vpcs[r.vpc_id]
        served[r.vpc_id].append(ServiceEndpointServed.model_construct(
            id=eid, vni=v.vni, ip=r.ip, mac=r.mac, source=source,
            addresses=[r.vip_address] if published else list(r.addresses),
            ports=[] if published else [ServicePortServed.model_construct(protocol=p["protocol"], port=p["port"])
                                        for p in r.ports],
            proxy_protocol=bool(r.proxy_protocol), rules=_rules(sorted(groups_of[eid]), groups[r.vpc_id]),
            mtu=v.mtu, via_vni=r.provider_vni if published else 0, peers=peers.get(r.vpc_id, [])))
    return served


ROLE = RoleCompiler(SERVICE_ROLE, (("svc", Q_SERVICE_ENDPOINTS), ("sides", Q_PROVIDER_SIDES), ("rules", Q_GROUP_RULES),
                                   ("members", Q_GROUP_MEMBERS), ("peers", Q_SERVICE_PEERS)), service_sections)
