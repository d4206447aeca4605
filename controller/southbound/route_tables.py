"""A VPC's effective route tables as its hosts take them: IPv4's (`routes`) and, for a dual-stack VPC, IPv6's
(`routes6`), each in one order: local, one route per active peering, the user's routes (a target that is gone or
not ready is a blackhole), then its private lines'."""

from __future__ import annotations

from typing import Any

from controller.roles.line.sections import line_route_infos
from controller.southbound.placement import nat_buckets
from tianji.southbound import RouteInfo


def route_tables(v: Any, vpc_rows: dict, peers, user_routes, gateway_eips: dict[str, list[str]],
                 instances: dict[str, str], line_routes=(),
                 line_instances: dict[str, str] | None = None) -> tuple[list[RouteInfo], list[RouteInfo]]:
    """An own VPC's route tables (IPv4's, IPv6's). `gateway_eips`: the VPC's NAT gateways, each with its EIPs.
    IPv6 goes over a peering when both VPCs have it."""
    v4 = [RouteInfo(destination=v.cidr, target_type="local")]
    v6 = [RouteInfo(destination=v.ipv6_cidr, target_type="local")] if v.ipv6_cidr else []
    active = {}
    for pid, peer in sorted(peers):
        active[pid] = peer
        v4.append(RouteInfo(destination=vpc_rows[peer].cidr, target_type="peering", target_id=pid,
                            peer_vpc_id=peer))
        if v6 and vpc_rows[peer].ipv6_cidr:
            v6.append(RouteInfo(destination=vpc_rows[peer].ipv6_cidr, target_type="peering", target_id=pid,
                                peer_vpc_id=peer))
    for r in user_routes:
        table = v6 if ":" in r.destination else v4
        buckets = nat_buckets(r.target_id, gateway_eips.get(r.target_id, []), instances) \
            if r.target_type == "nat-gateway" and r.target_id in gateway_eips and instances else []
        if buckets:
            table.append(RouteInfo(destination=r.destination, target_type="nat-gateway", target_id=r.target_id,
                                   origin="user", gateway_vteps=sorted({instances[b] for b in buckets}),
                                   gateway_buckets=[instances[b] for b in buckets]))
        elif r.target_type == "peering" and r.target_id in active:
            table.append(RouteInfo(destination=r.destination, target_type="peering", target_id=r.target_id,
                                   peer_vpc_id=active[r.target_id], origin="user"))
        else:
            table.append(RouteInfo(destination=r.destination, target_type="blackhole", target_id=r.target_id,
                                   origin="user"))
    if line_routes:
        v4 += line_route_infos(line_routes, line_instances or {}, {r.destination for r in v4})
    return v4, v6 if v.ipv6_cidr else []
