"""Compile one host's desired state (HostConfig) from the database: the assembly, from rows to configs. The reads
are in reads.py, the fragment cache in fragments.py, placement (EIP homes, NAT buckets) in placement.py.

The cost grows with what the host needs (its ports, their VPCs and peers, those VPCs' endpoints),
never with the whole database: every query below is keyed by the host or by those VPC ids.

A VPC's endpoints (every bound port: IP, MAC, host, VTEP) are most of a config and are shared by every host that
has a port in the VPC or in a peer. They are compiled once per VPC revision and kept in `FRAGMENTS`: every write
that changes a VPC's ports stamps the VPC with the write's revision (a host's new VTEP stamps the VPCs of its
ports), and every change of the live gateway instances stamps the topology, so a VPC's fragment compiled at (VPC
revision, topology revision) is right for every snapshot that shows those stamps, whichever controller process
made the change. A port created in one VPC recompiles that VPC's
fragment only, and the new version replaces the old.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from controller.roles.lb.sections import by_listener
from controller.southbound.fragments import FRAGMENTS, cached, store
from controller.southbound.groups import groups_fragments
from controller.southbound.placement import home
from controller.southbound.route_tables import route_tables
from controller.state.reads import (
    Q_DNS,
    Q_ENDPOINTS,
    Q_GROUP_MEMBERS,
    Q_GROUP_RULES,
    Q_HOSTS,
    Q_LB_MEMBERS,
    Q_LINE_ROUTES,
    Q_LOCAL,
    Q_NAT_GATEWAYS,
    Q_ROUTES,
    Q_SUBNETS,
    HostView,
    Reads,
    host_view,
)
from tianji.southbound import (
    DEFAULT_GATEWAY_ROLE,
    GATEWAY_ROLES,
    OVERLAY_MTU,
    DnsRecord,
    Endpoint,
    HostConfig,
    HostConfigDelta,
    LbBackendInfo,
    LbListenerInfo,
    LbMonitorInfo,
    LbVipInfo,
    PortInfo,
    SecurityGroupInfo,
    SubnetInfo,
    VpcInfo,
    Vtep,
)


class Topology(NamedTuple):
    """Every host's VTEP, and the live gateway instances of each role (name -> VTEP): versioned by the VTEP list's
    stamp and the topology's (gateways appearing, changing VTEP or role, going up or down)."""

    vteps: tuple[Vtep, ...]
    instances: dict[str, str]  # NAT
    lb_instances: dict[str, str]
    line_instances: dict[str, str]  # private line
    service_instances: dict[str, str]  # service endpoints' (the VPC gateway to the cluster's services)

    def live(self, role: str) -> dict[str, str]:
        """The live instances of a gateway role (the fields follow GATEWAY_ROLES' order)."""
        return self[1 + GATEWAY_ROLES.index(role)]


def hosts_fragment(rows: list) -> Topology:
    live = [(n, ip, role or DEFAULT_GATEWAY_ROLE) for n, ip, k, st, role in rows if k == "gateway" and st == "up"]
    return Topology(tuple(Vtep(host=n, ip=ip, kind=k) for n, ip, k, _, _ in rows),
                    *({n: ip for n, ip, role in live if role == r} for r in GATEWAY_ROLES))  # the fields' order


def _ports_fragments(rows: list, vpcs: list[str], instances: dict[str, str]) -> dict[str, tuple[PortInfo, ...]]:
    """A host's ports in each of these VPCs, as the wire has them. Every write that changes one of them (creating,
    binding, moving, deleting a port, changing its groups, (dis)associating its EIP) stamps the port's VPC, and a
    port's EIP is homed by the topology: cached per (host, VPC) by those two, so a write rebuilds the host's ports
    of the VPCs it stamped, not all of them."""
    by_port: dict[str, tuple] = {}  # port id -> (row, its groups): a port in n groups comes back n times
    for p in rows:
        groups = by_port.setdefault(p.id, (p, []))[1]
        if p.group_id is not None:
            groups.append(p.group_id)
    built: dict[str, list[PortInfo]] = {vid: [] for vid in vpcs}
    for p, groups in by_port.values():
        eip_home = home(f"eip:{p.eip_id}", instances) if p.eip_id else None
        built[p.vpc_id].append(PortInfo.model_construct(  # from the database's rows: nothing to validate
            id=p.id, vpc_id=p.vpc_id, subnet_id=p.subnet_id, mac=p.mac, ip=p.ip, ipv6=p.ipv6, security_group_ids=groups,
            eip_home_vtep=instances[eip_home] if eip_home else None, gateway_ip=p.gateway_ip))
    # in id order by Python's comparison, not the database collation's: a patched VPC is put back in this order
    return {vid: tuple(sorted(ports, key=lambda p: p.id)) for vid, ports in built.items()}


def service_home(endpoint_id: str, service_instances: dict[str, str]) -> str | None:
    """The live service instance that serves a service endpoint (its translations live there)."""
    return home(f"svc:{endpoint_id}", service_instances)


def endpoints_fragments(rows: list, vpcs: dict[str, Any],
                        service_instances: dict[str, str]) -> dict[str, tuple[Endpoint, ...]]:
    """Every bound port of each VPC: where it lives and how to reach it (most of a config, shared by every host of
    the VPC and of its peers). A service endpoint's port lives on the service instance homing it (the topology
    versions the fragment), and nowhere while none is live."""
    built: dict[str, list[Endpoint]] = {vid: [] for vid in vpcs}
    for e in rows:
        host, vtep = e.host, e.vtep_ip
        if e.endpoint_id is not None:
            if (host := service_home(e.endpoint_id, service_instances)) is None:
                continue
            vtep = service_instances[host]
        also = {"also_host": e.migrating_to, "also_vtep_ip": e.migrating_vtep} if e.migrating_to else {}
        built[e.vpc_id].append(Endpoint.model_construct(port_id=e.id, vpc_id=e.vpc_id, vni=vpcs[e.vpc_id].vni,
                                                        ip=e.ip, mac=e.mac, host=host, vtep_ip=vtep, ipv6=e.ipv6,
                                                        **also))
    return {vid: tuple(eps) for vid, eps in built.items()}


def _subnets_fragments(rows: list, vpcs: list[str]) -> dict[str, tuple[SubnetInfo, ...]]:
    built: dict[str, list[SubnetInfo]] = {vid: [] for vid in vpcs}
    for sid, vid, cidr, gw, cidr6, gw6, mode in rows:
        built[vid].append(SubnetInfo.model_construct(id=sid, cidr=cidr, gateway_ip=gw, ipv6_cidr=cidr6,
                                                     ipv6_gateway_ip=gw6, ipv6_address_mode=mode))
    return {vid: tuple(subs) for vid, subs in built.items()}


def compile_host(s: Session, host: str) -> HostConfig | None:
    view = host_view(s, host)
    return None if view is None else compile_hosts(s, {host: view})[host].config


@dataclass
class Compiled:
    """A host's config, per VPC, and the stamps it was compiled from. The whole config is assembled only when
    asked for: a delta takes the changed VPCs' sections alone (at 20,000 ports a host's config holds 20,000
    endpoints, a port created in one VPC changes a hundred)."""

    host: str
    revision: int
    vtep_ip: str | None
    host_stamp: int
    topology: int
    vteps_stamp: int
    vpc_revisions: dict[str, int]
    own: frozenset[str]  # VPCs with a port on the host
    peers: dict[str, list[tuple[str, str]]]  # VPC -> [(peering id, peer VPC)], for the peerings of own VPCs
    relevant: list[str]  # every VPC of the config, in its order
    entries: dict[str, VpcInfo]
    local: dict[str, list[PortInfo]]  # own VPC -> the host's ports in it
    endpoints: dict[str, list[Endpoint]]
    groups: dict[str, SecurityGroupInfo]  # id -> group, of the own VPCs
    vteps: list[Vtep]

    def _groups_of(self, vpcs: Iterable[str]) -> list[SecurityGroupInfo]:
        used = {g for vid in vpcs for p in self.local[vid] for g in p.security_group_ids}
        return [self.groups[g] for g in sorted(used)]

    @cached_property
    def config(self) -> HostConfig:
        own = sorted(self.own)
        # every part is a validated wire model already: construct without validating the ~1,000 of them again
        return HostConfig.model_construct(
            host=self.host, revision=self.revision, vtep_ip=self.vtep_ip, mtu=OVERLAY_MTU,
            ports=[p for vid in own for p in self.local[vid]], vpcs=[self.entries[vid] for vid in self.relevant],
            endpoints=[e for vid in self.relevant for e in self.endpoints[vid]],
            security_groups=self._groups_of(own), vteps=list(self.vteps))

    def delta(self, base: int, changed: set[str]) -> HostConfigDelta:
        """What delta_of(self.config, base, changed) is, from the changed VPCs' sections alone."""
        keep = [vid for vid in self.relevant if vid in changed]
        own = sorted(self.own & set(keep))
        return HostConfigDelta.model_construct(
            host=self.host, revision=self.revision, base=base, vtep_ip=self.vtep_ip, mtu=OVERLAY_MTU,
            vpc_ids=list(self.relevant), changed_vpcs=sorted(keep), vpcs=[self.entries[vid] for vid in keep],
            endpoints=[e for vid in keep for e in self.endpoints[vid]],
            security_groups=self._groups_of(own),  # a port's groups are its VPC's (the ports API insists)
            ports=[p for vid in own for p in self.local[vid]], vteps=None)


def compile_hosts(s: Session, views: dict[str, HostView]) -> dict[str, Compiled]:
    """Every host's config from one snapshot (the views' own, Q_HOST_VPCS): one more round trip at most, for every
    fragment the cache does not hold at the views' versions, read together and shared by the hosts that need it.
    Each fragment is versioned by the stamps it follows (see FRAGMENTS)."""
    if not views:
        return {}
    first = next(iter(views.values()))  # one snapshot: one topology, one VTEP list
    topology, vteps_stamp = first.topology, first.vteps
    vpcs = {vid: row for v in views.values() for vid, row in v.vpcs.items()}
    peers = {vid: p for v in views.values() for vid, p in v.peers.items()}  # a VPC's peerings: the same for all
    own_any = {vid for v in views.values() for vid in v.own}
    revs = {vid: row.revision for vid, row in vpcs.items()}
    with_topology = {vid: (rev, topology) for vid, rev in revs.items()}

    # what the cache holds at these versions, and what it does not
    hosts_frag = FRAGMENTS.get(s, ("hosts",), (topology, vteps_stamp))
    local: dict[str, dict] = {}
    stale_ports: dict[str, list[str]] = {}
    for host, v in views.items():
        local[host], stale = cached(s, f"ports:{host}", {vid: with_topology[vid] for vid in v.own})
        if stale:
            stale_ports[host] = stale
    endpoints, stale_endpoints = cached(s, "endpoints", with_topology)
    groups, stale_groups = cached(s, "sg", {vid: revs[vid] for vid in own_any})
    entries, stale_own, stale_peer = _cached_entries(s, views, with_topology)
    stale_entries = sorted({*stale_own, *stale_peer})
    subnets, stale_subnets = cached(s, "subnets", {vid: revs[vid] for vid in stale_entries})
    rows = _stale_reads(hosts_frag is None, stale_ports, stale_endpoints, stale_groups, stale_subnets,
                        stale_entries, stale_own).run(s)

    if hosts_frag is None:
        hosts_frag = hosts_fragment(rows["hosts"])
        FRAGMENTS.put(s, ("hosts",), (topology, vteps_stamp), hosts_frag)
    vteps, instances, lb_instances, line_instances, service_instances = hosts_frag
    for host, stale in stale_ports.items():
        store(s, f"ports:{host}", with_topology, _ports_fragments(rows[f"ports:{host}"], stale, instances),
              local[host])
    store(s, "endpoints", with_topology,
          endpoints_fragments(rows["endpoints"], {v: vpcs[v] for v in stale_endpoints}, service_instances), endpoints)
    store(s, "sg", revs, groups_fragments(rows["rules"], rows["members"], stale_groups,
                                          {vid for vid in stale_groups if vpcs[vid].ipv6_cidr}), groups)
    store(s, "subnets", revs, _subnets_fragments(rows["subnets"], stale_subnets), subnets)
    user_routes, gateway_eips, line_routes, dns = _route_rows(rows)
    lbs = vip_infos(rows["lbs"], lb_instances)
    for kind, stale in (("own-vpc", stale_own), ("peer-vpc", stale_peer)):
        for vid in stale:
            routes = route_tables(vpcs[vid], vpcs, peers.get(vid, ()), user_routes.get(vid, ()), gateway_eips,
                                  instances, line_routes.get(vid, ()), line_instances) \
                if kind == "own-vpc" else ([], [])
            entries[kind][vid] = _vpc_entry(vpcs[vid], subnets[vid], routes, lbs.get(vid, []), dns.get(vid, []))
            FRAGMENTS.put(s, (kind, vid), with_topology[vid], (entries[kind][vid],))
    return {host: Compiled(
        host, v.revision, v.vtep_ip, v.stamp, topology, v.vteps, {vid: revs[vid] for vid in v.vpcs}, v.own, v.peers,
        sorted(v.vpcs), {vid: entries["own-vpc" if vid in v.own else "peer-vpc"][vid] for vid in v.vpcs},
        local[host], endpoints, {gid: g for vid in v.own for gid, g in groups[vid].items()}, vteps)
        for host, v in views.items()}


def _stale_reads(hosts: bool, ports: dict[str, list[str]], endpoints: list[str], groups: list[str],
                 subnets: list[str], entries: list[str], own: list[str]) -> Reads:
    """The reads of the fragments found missing, to be sent together."""
    reads = Reads()
    if hosts:
        reads.add("hosts", Q_HOSTS)
    for host, stale in ports.items():
        reads.add(f"ports:{host}", Q_LOCAL, host=host, vpcs=stale)
    if endpoints:
        reads.add("endpoints", Q_ENDPOINTS, vpcs=endpoints)
    if groups:
        reads.add("rules", Q_GROUP_RULES, vpcs=groups)
        reads.add("members", Q_GROUP_MEMBERS, vpcs=groups)
    if subnets:
        reads.add("subnets", Q_SUBNETS, vpcs=subnets)
    if entries:
        reads.add("lbs", Q_LB_MEMBERS, vpcs=entries)
    if own:
        reads.add("routes", Q_ROUTES, vpcs=own)
        reads.add("gateways", Q_NAT_GATEWAYS, vpcs=own)
        reads.add("line_routes", Q_LINE_ROUTES, vpcs=own)
        reads.add("dns", Q_DNS, vpcs=own)
    return reads


def _cached_entries(s: Session, views: dict[str, HostView],
                    versions: dict[str, tuple]) -> tuple[dict[str, dict], list[str], list[str]]:
    """The VPC entries the cache holds (kind -> VPC -> entry), and the VPCs whose own and peer entries it does not.
    An entry (own VPCs with their route tables, peered ones for their VNI, router MAC and subnets) follows the
    VPC's revision (subnets, routes, peerings, NAT gateways and their EIPs all stamp it) and the topology (which
    instances serve a NAT gateway). A VPC may be one host's own and another's peer: both are needed."""
    own = {vid for v in views.values() for vid in v.own}
    peer = {vid for v in views.values() for vid in v.vpcs if vid not in v.own}
    entries: dict[str, dict] = {}
    stale: dict[str, list[str]] = {}
    for kind, ids in (("own-vpc", own), ("peer-vpc", peer)):
        entries[kind], stale[kind] = cached(s, kind, {vid: versions[vid] for vid in sorted(ids)})
    return entries, stale["own-vpc"], stale["peer-vpc"]


def _route_rows(rows: dict[str, list]) -> tuple[dict[str, list], dict[str, list[str]], dict[str, list],
                                               dict[str, list[DnsRecord]]]:
    """The user routes read, per VPC, the EIPs of the NAT gateways read, per gateway, the private lines' routes
    read, per VPC, and the names of the VPCs' resolvers (their endpoints'), per VPC."""
    user_routes: dict[str, list] = defaultdict(list)
    for r in rows["routes"]:
        user_routes[r.vpc_id].append(r)
    gateway_eips: dict[str, list[str]] = defaultdict(list)
    for gid, eid in rows["gateways"]:
        gateway_eips[gid] += [eid] if eid else []
    line_routes: dict[str, list] = defaultdict(list)
    for r in rows["line_routes"]:
        line_routes[r.vpc_id].append(r)
    dns: dict[str, list[DnsRecord]] = defaultdict(list)
    for r in rows["dns"]:
        dns[r.vpc_id].append(DnsRecord.model_construct(name=r.dns_name, address=r.address))
    return user_routes, gateway_eips, line_routes, dns


def _vpc_entry(v: Any, subnets: Any, routes: tuple[list, list], lbs: list[LbVipInfo],
               dns: list[DnsRecord]) -> VpcInfo:
    """A VPC's entry in a host's config: VNI, router MAC, subnets, its route table and resolver's names if it has
    a local port, and its load balancers (clients in it or in a peer steer to their VIPs; hosts of members
    translate)."""
    return VpcInfo.model_construct(id=v.id, tenant_id=v.tenant_id, vni=v.vni, cidr=v.cidr, router_mac=v.router_mac,
                                   mtu=v.mtu, ipv6_cidr=v.ipv6_cidr, subnets=list(subnets), routes=routes[0],
                                   routes6=routes[1], load_balancers=lbs, dns=dns)


def vip_infos(rows: list, lb_instances: dict[str, str]) -> dict[str, list[LbVipInfo]]:
    """Q_LB_MEMBERS' rows as each VPC's load balancers, for vSwitches: every instance takes every VIP (they hold
    identical tables), and the instance homing a VIP's EIP takes its replies to the internet."""
    vteps = sorted(set(lb_instances.values()))
    out: dict[str, list[LbVipInfo]] = defaultdict(list)
    for lb, listeners in by_listener(rows).values():
        home_of = home(f"eip:{lb.eip_id}", lb_instances) if lb.eip_id else None
        out[lb.vpc_id].append(LbVipInfo.model_construct(
            id=lb.id, vip=lb.vip_address, mac=lb.vip_mac, instance_vteps=vteps,
            eip_home_vtep=lb_instances[home_of] if home_of else None,
            listeners=[_listener_info(p, n, lrows) for (p, n), lrows in listeners.items()]))
    return out


def _listener_info(protocol: str, port: int, rows: list) -> LbListenerInfo:
    """A listener as vSwitches take it: its members' translations, and its pool's monitor (the same on each row)."""
    r = rows[0]
    monitor = LbMonitorInfo.model_construct(
        type=r.hm_type, interval_s=r.interval_s, timeout_s=r.timeout_s, rise=r.rise, fall=r.fall,
        http_method=r.http_method, url_path=r.url_path, expected_codes=r.expected_codes) if r.monitored else None
    backends = [LbBackendInfo.model_construct(port_id=x.port_id, ip=x.member_ip, mac=x.member_mac,
                                              port=x.protocol_port, member_id=x.member_id,
                                              gateway_ip=x.member_gateway) for x in rows if x.member_id is not None]
    return LbListenerInfo.model_construct(protocol=protocol, port=port, backends=backends, monitor=monitor)
