"""Compile one host's desired state (HostConfig) from the database.

The cost grows with what the host needs (its ports, their VPCs and peers, those VPCs' endpoints),
never with the whole database: every query below is keyed by the host or by those VPC ids.

A VPC's endpoints (every bound port: IP, MAC, host, VTEP) are most of a config and are shared by every host that
has a port in the VPC or in a peer. They are compiled once per VPC revision and kept in `FRAGMENTS`: every write
that changes a VPC's ports stamps the VPC with the write's revision, and every change of a host's VTEP stamps the
topology, so a VPC's fragment compiled at (VPC revision, topology revision) is right for every snapshot that shows
those stamps, whichever controller process made the change. A port created in one VPC recompiles that VPC's
fragment only, and the new version replaces the old.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy import bindparam, select, text
from sqlalchemy.orm import Session

from controller import models as m
from controller.sqlset import fetch_all, in_ids
from tianji.southbound import (
    OVERLAY_MTU,
    Endpoint,
    HostConfig,
    HostConfigDelta,
    PortInfo,
    RouteInfo,
    SecurityGroupInfo,
    SecurityGroupRuleInfo,
    SubnetInfo,
    VpcInfo,
    Vtep,
    delta_of,
)


class FragmentCache:
    """Immutable compiled fragments, one version per key: a VPC's endpoints as of its revision, a host's ports in a
    VPC as of that VPC's revision, and so on (thread-safe: the watch API compiles in a thread pool). A newer version
    replaces the older one, which no new snapshot needs again: the cache holds what the current state needs, not
    every revision it went through (keeping those made the heap, and every full garbage collection, grow with the
    write history). A bounded LRU over keys all the same."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.data: OrderedDict[tuple, tuple] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def _scoped(bind: object, key: tuple) -> tuple:
        # one cache per database: host names and revisions repeat across databases (tests run many). The engine
        # object is the scope, hashed by identity: its URL renders itself to a string on every hash, which was a
        # quarter of a compile's time on these per-VPC lookups
        return (bind, *key)

    def get(self, s: Session, key: tuple, version: tuple | int) -> tuple | None:
        return self.get_many(s, {key: version}).get(key)

    def get_many(self, s: Session, wanted: dict[tuple, tuple | int]) -> dict[tuple, tuple]:
        """The fragments held at these versions (key -> version), under one lock: those missing are absent."""
        bind, out = s.get_bind(), {}
        with self.lock:
            for key, version in wanted.items():
                v = self.data.get(scoped := self._scoped(bind, key))
                if v is not None and v[0] == version:
                    self.data.move_to_end(scoped)
                    out[key] = v[1]
            self.hits += len(out)
            self.misses += len(wanted) - len(out)
        return out

    def put(self, s: Session, key: tuple, version: tuple | int, value: tuple) -> None:
        key = self._scoped(s.get_bind(), key)
        with self.lock:
            old = self.data.get(key)
            if old is not None and _newer(old[0], version):
                return  # a snapshot older than the cached fragment's: keep the newer one
            self.data[key] = (version, value)
            self.data.move_to_end(key)
            while len(self.data) > self.size:
                self.data.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.data.clear()


def _newer(a: tuple | int, b: tuple | int) -> bool:
    """Versions are revisions (or tuples of them) that only grow."""
    return a > b if isinstance(a, int) else all(x >= y for x, y in zip(a, b, strict=True)) and a != b


FRAGMENTS = FragmentCache(50_000)  # one entry per VPC (a few kinds) and per host

# The watch path's statements, built once on the Core tables with bound parameters: SQLAlchemy then finds each
# compiled form by a cache key memoised on the statement, instead of building the statement and hashing it (and
# its ORM entities) on every compile, which cost more than the database's answer.
_PORTS, _HOSTS, _VPCS = m.Port.__table__, m.Host.__table__, m.Vpc.__table__
_ROUTES, _SUBNETS, _PSG, _EIPS = m.Route.__table__, m.Subnet.__table__, m.PortSecurityGroup.__table__, m.Eip.__table__
_NATGWS, _NATGW_EIPS = m.NatGateway.__table__, m.NatGatewayEip.__table__
_SG, _RULES = m.SecurityGroup.__table__, m.SecurityGroupRule.__table__

# The host, and every VPC its config holds, in one statement: its own VPCs (those of its ports), once each with no
# peering, and the VPCs peered with them, once per active peering, with the own VPC they are peered with. A row of
# NULL VPC columns when there is none; no row when the host is not registered.
Q_HOST_VPCS = text("""
    WITH own AS (SELECT DISTINCT vpc_id AS id FROM ports WHERE host = :host),
         rel AS (SELECT id, NULL AS peering_id, NULL AS peer_of FROM own
                 UNION ALL
                 SELECT accepter_vpc_id, id, requester_vpc_id FROM peerings
                 WHERE status = 'active' AND requester_vpc_id IN (SELECT id FROM own)
                 UNION ALL
                 SELECT requester_vpc_id, id, accepter_vpc_id FROM peerings
                 WHERE status = 'active' AND accepter_vpc_id IN (SELECT id FROM own))
    SELECT h.config_revision, h.vtep_ip, (SELECT value FROM counters WHERE name = 'topology') AS topology,
           v.id, v.tenant_id, v.vni, v.cidr, v.router_mac, v.revision, v.peering_id, v.peer_of
    FROM hosts h LEFT JOIN (SELECT vpcs.id, vpcs.tenant_id, vpcs.vni, vpcs.cidr, vpcs.router_mac, vpcs.revision,
                                   rel.peering_id, rel.peer_of
                            FROM rel JOIN vpcs ON vpcs.id = rel.id) v ON 1 = 1
    WHERE h.name = :host""")
Q_HOSTS = select(_HOSTS.c.name, _HOSTS.c.vtep_ip, _HOSTS.c.kind, _HOSTS.c.status).order_by(_HOSTS.c.name)
Q_ROUTES = select(_ROUTES.c.vpc_id, _ROUTES.c.destination, _ROUTES.c.target_type, _ROUTES.c.target_id) \
    .where(in_ids(_ROUTES.c.vpc_id, "vpcs")).order_by(_ROUTES.c.destination)
Q_NAT_GATEWAYS = select(_NATGWS.c.id, _NATGW_EIPS.c.eip_id) \
    .outerjoin(_NATGW_EIPS, _NATGW_EIPS.c.nat_gateway_id == _NATGWS.c.id) \
    .where(in_ids(_NATGWS.c.vpc_id, "vpcs")).order_by(_NATGWS.c.id, _NATGW_EIPS.c.eip_id)
Q_ENDPOINTS = select(_PORTS.c.id, _PORTS.c.vpc_id, _PORTS.c.ip, _PORTS.c.mac, _PORTS.c.host, _HOSTS.c.vtep_ip) \
    .join(_HOSTS, _HOSTS.c.name == _PORTS.c.host).where(in_ids(_PORTS.c.vpc_id, "vpcs")) \
    .order_by(_PORTS.c.vpc_id, _PORTS.c.ip_int)
Q_SUBNETS = select(_SUBNETS.c.id, _SUBNETS.c.vpc_id, _SUBNETS.c.cidr, _SUBNETS.c.gateway_ip) \
    .where(in_ids(_SUBNETS.c.vpc_id, "vpcs")).order_by(_SUBNETS.c.cidr)
Q_GROUP_RULES = select(_SG.c.vpc_id, _SG.c.id.label("group_id"), _RULES.c.id, _RULES.c.direction, _RULES.c.protocol,
                       _RULES.c.port_range_min, _RULES.c.port_range_max, _RULES.c.remote_cidr,
                       _RULES.c.remote_group_id) \
    .outerjoin(_RULES, _RULES.c.group_id == _SG.c.id).where(in_ids(_SG.c.vpc_id, "vpcs")) \
    .order_by(_SG.c.id, _RULES.c.id)
Q_GROUP_MEMBERS = select(_PSG.c.group_id, _PORTS.c.ip).join(_PORTS, _PORTS.c.id == _PSG.c.port_id) \
    .where(in_ids(_PORTS.c.vpc_id, "vpcs")).order_by(_PORTS.c.ip_int)
Q_LOCAL = select(_PORTS.c.id, _PORTS.c.vpc_id, _PORTS.c.subnet_id, _PORTS.c.mac, _PORTS.c.ip, _PSG.c.group_id,
                 _EIPS.c.id.label("eip_id")) \
    .outerjoin(_PSG, _PSG.c.port_id == _PORTS.c.id).outerjoin(_EIPS, _EIPS.c.port_id == _PORTS.c.id) \
    .where(_PORTS.c.host == bindparam("host"), in_ids(_PORTS.c.vpc_id, "vpcs")) \
    .order_by(_PORTS.c.vpc_id, _PORTS.c.id, _PSG.c.group_id)


@dataclass(frozen=True)
class HostView:
    """A host's stamps and the VPCs its config holds (Q_HOST_VPCS): what decides whether its config changed, and
    which fragments it is made of."""

    stamp: int  # the host's own stamp (its ports bound, unbound, moved)
    vtep_ip: str | None
    topology: int
    vpcs: dict[str, Any]  # id -> row (tenant_id, vni, cidr, router_mac, revision)
    own: frozenset[str]  # VPCs with a port on the host
    peers: dict[str, list[tuple[str, str]]]  # own VPC -> [(peering id, peer VPC)]

    @property
    def revision(self) -> int:
        """The config's revision: the newest stamp among what it depends on."""
        return max([self.stamp, self.topology, *(v.revision for v in self.vpcs.values())])


def host_view(s: Session, host: str) -> HostView | None:
    rows = s.execute(Q_HOST_VPCS, {"host": host}).all()
    if not rows:
        return None
    vpcs, own, peers = {}, set(), defaultdict(list)
    for r in rows:
        if r.id is None:
            continue
        vpcs[r.id] = r
        if r.peering_id is None:
            own.add(r.id)
        else:
            peers[r.peer_of].append((r.peering_id, r.id))
    return HostView(rows[0].config_revision, rows[0].vtep_ip, rows[0].topology, vpcs, frozenset(own), dict(peers))


def host_revision(s: Session, host: str) -> tuple[int, set[str]] | None:
    """The revision of this host's config (the newest stamp among what it depends on), and the VPCs it
    depends on. None if the host is not registered. One round trip."""
    view = host_view(s, host)
    return (view.revision, set(view.vpcs)) if view else None


def _cached(s: Session, kind: str, vpcs: dict[str, tuple | int]) -> tuple[dict, list[str]]:
    """The cached `kind` fragments of these VPCs (id -> version), and the VPCs that have none of that version."""
    got = FRAGMENTS.get_many(s, {(kind, vid): version for vid, version in vpcs.items()})
    return {key[1]: frag[0] for key, frag in got.items()}, [vid for vid in vpcs if (kind, vid) not in got]


def _store(s: Session, kind: str, versions: dict[str, tuple | int], built: dict[str, Any], into: dict) -> None:
    """Fragments just built for these VPCs: into the compile's parts and into FRAGMENTS, at the versions they were
    found missing at (see _cached)."""
    for vid, frag in built.items():
        into[vid] = frag
        FRAGMENTS.put(s, (kind, vid), versions[vid], (frag,))


class Reads:
    """The reads a compile still needs, sent together (sqlset.fetch_all: one round trip on PostgreSQL)."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, Any, dict]] = []

    def add(self, name: str, stmt: Any, **params: Any) -> None:
        self.reads.append((name, stmt, params))

    def run(self, s: Session) -> dict[str, list]:
        rows = fetch_all(s, [(stmt, params) for _, stmt, params in self.reads]) if self.reads else []
        out: dict[str, list] = defaultdict(list)  # nothing read: no rows
        out.update((name, r) for (name, _, _), r in zip(self.reads, rows, strict=True))
        return out


def _hosts_fragment(rows: list) -> tuple[tuple[Vtep, ...], dict[str, str]]:
    """Every host's VTEP, and the live NAT gateway instances (name -> VTEP): hosts appearing, changing VTEP, and
    going up or down all stamp the topology, which versions this fragment."""
    return (tuple(Vtep(host=n, ip=ip, kind=k) for n, ip, k, _ in rows),
            {n: ip for n, ip, k, st in rows if k == "gateway" and st == "up"})


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
            id=p.id, vpc_id=p.vpc_id, subnet_id=p.subnet_id, mac=p.mac, ip=p.ip, security_group_ids=groups,
            eip_home_vtep=instances[eip_home] if eip_home else None))
    return {vid: tuple(ports) for vid, ports in built.items()}


def _endpoints_fragments(rows: list, vpcs: dict[str, Any]) -> dict[str, tuple[Endpoint, ...]]:
    """Every bound port of each VPC: where it lives and how to reach it (most of a config, shared by every host of
    the VPC and of its peers)."""
    built: dict[str, list[Endpoint]] = {vid: [] for vid in vpcs}
    for e in rows:
        built[e.vpc_id].append(Endpoint.model_construct(port_id=e.id, vpc_id=e.vpc_id, vni=vpcs[e.vpc_id].vni,
                                                        ip=e.ip, mac=e.mac, host=e.host, vtep_ip=e.vtep_ip))
    return {vid: tuple(eps) for vid, eps in built.items()}


def _subnets_fragments(rows: list, vpcs: list[str]) -> dict[str, tuple[SubnetInfo, ...]]:
    built: dict[str, list[SubnetInfo]] = {vid: [] for vid in vpcs}
    for sid, vid, cidr, gw in rows:
        built[vid].append(SubnetInfo.model_construct(id=sid, cidr=cidr, gateway_ip=gw))
    return {vid: tuple(subs) for vid, subs in built.items()}


def _groups_fragments(rule_rows: list, member_rows: list, vpcs: list[str]) -> dict[str, dict[str, SecurityGroupInfo]]:
    """Every security group of each VPC, remote groups resolved to member addresses. Groups, rules and memberships
    only change with a write that stamps their VPC (remote groups are in the same VPC)."""
    members: dict[str, list[str]] = defaultdict(list)
    for gid, ip in member_rows:
        members[gid].append(f"{ip}/32")
    built: dict[str, dict[str, list[SecurityGroupRuleInfo]]] = {vid: {} for vid in vpcs}
    for r in rule_rows:  # every group, with its rules if it has any
        rules = built[r.vpc_id].setdefault(r.group_id, [])
        if r.id is not None:
            remote = members.get(r.remote_group_id, []) if r.remote_group_id else [r.remote_cidr or "0.0.0.0/0"]
            rules.append(SecurityGroupRuleInfo(
                id=r.id, direction=r.direction, protocol=r.protocol, port_range_min=r.port_range_min,
                port_range_max=r.port_range_max, remote_cidrs=remote))
    return {vid: {gid: SecurityGroupInfo(id=gid, vpc_id=vid, rules=rules) for gid, rules in groups.items()}
            for vid, groups in built.items()}


def home(key: str, instances: list[str] | dict[str, str]) -> str | None:
    """Rendezvous (highest random weight) hashing: every controller computes the same home, and when an instance
    dies only what it homed moves; what lives on the survivors stays where it is."""
    if not instances:
        return None
    return max(instances, key=lambda i: _weight(key, i))


def _weight(key: str, instance: str) -> bytes:
    return hashlib.blake2b(f"{key}|{instance}".encode(), digest_size=8).digest()


NAT_BUCKETS = 8  # source-address buckets (the low 3 bits of a VM's address) a NAT gateway's traffic is split into


def nat_buckets(gateway_id: str, eip_ids: list[str], instances: dict[str, str]) -> list[str]:
    """The instance serving each source-address bucket of a NAT gateway's traffic.

    Every EIP is homed on one live instance (rendezvous hashing, like 1:1 EIPs); the instances homing a NAT
    gateway's EIPs serve it, each translating with the EIPs it homes, and the buckets are spread over them, again
    by rendezvous hashing. A VM's address picks its bucket, so all its flows meet one instance and keep one EIP
    (paired pooling, endpoint-independent mapping); when an instance dies, only its EIPs and buckets move."""
    serving = sorted({h for e in eip_ids if (h := home(f"eip:{e}", instances))}) or \
        [h for h in [home(f"natgw:{gateway_id}", instances)] if h]
    if not serving:
        return []
    owners = [home(f"natgw:{gateway_id}:{b}", serving) for b in range(NAT_BUCKETS)]
    # Every serving instance takes a bucket, or the EIPs it homes would go unused (rendezvous hashing alone
    # leaves one of three instances without any of 8 buckets about one time in eight): an instance left without
    # takes, from an instance holding several, the bucket it weighs highest for. Only those buckets move.
    for inst in serving:
        held = Counter(owners)
        spare = [b for b in range(NAT_BUCKETS) if held[owners[b]] > 1]
        if inst not in held and spare:
            owners[max(spare, key=lambda b: _weight(f"natgw:{gateway_id}:{b}", inst))] = inst
    return owners


def _routes(v, vpc_rows: dict, peers, user_routes,
            gateway_eips: dict[str, list[str]], instances: dict[str, str]) -> list[RouteInfo]:
    """An own VPC's effective route table: local, one route per active peering, then the user's routes (a target
    that is gone or not ready is a blackhole). `gateway_eips`: the VPC's NAT gateways, each with its EIPs."""
    routes = [RouteInfo(destination=v.cidr, target_type="local")]
    active = {}
    for pid, peer in sorted(peers):
        active[pid] = peer
        routes.append(RouteInfo(destination=vpc_rows[peer].cidr, target_type="peering", target_id=pid,
                                peer_vpc_id=peer))
    for r in user_routes:
        buckets = nat_buckets(r.target_id, gateway_eips.get(r.target_id, []), instances) \
            if r.target_type == "nat-gateway" and r.target_id in gateway_eips and instances else []
        if buckets:
            routes.append(RouteInfo(destination=r.destination, target_type="nat-gateway", target_id=r.target_id,
                                    origin="user", gateway_vteps=sorted({instances[b] for b in buckets}),
                                    gateway_buckets=[instances[b] for b in buckets]))
        elif r.target_type == "peering" and r.target_id in active:
            routes.append(RouteInfo(destination=r.destination, target_type="peering", target_id=r.target_id,
                                    peer_vpc_id=active[r.target_id], origin="user"))
        else:
            routes.append(RouteInfo(destination=r.destination, target_type="blackhole", target_id=r.target_id,
                                    origin="user"))
    return routes


def compile_host(s: Session, host: str) -> HostConfig | None:
    out = _compile_host(s, host)
    return out.config if out else None


def compile_host_delta(s: Session, host: str, base: int) -> HostConfigDelta | None:
    """What changed in the host's config after revision `base` (see HostConfigDelta): the sections of the VPCs
    stamped after it (their endpoints, groups, and the host's ports in them), and everything when the topology
    moved (VTEPs are in every section).

    A VPC that became relevant after `base` is among the changed ones: it became the host's own by a port write
    that stamped it, or a peer by a peering write that stamped it, or the peer of a VPC that became the host's
    own, which is why a stamped host also gets the peers of its stamped VPCs."""
    out = _compile_host(s, host)
    if out is None:
        return None
    whole = base < 0 or out.topology > base
    changed = None if whole else {vid for vid, rev in out.vpc_revisions.items() if rev > base}
    if changed is not None and out.host_stamp > base:
        changed |= {peer for vid in out.own & changed for _, peer in out.peers.get(vid, ())}
    return delta_of(out.config, base, None) if changed is None else out.delta(base, changed)


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
            security_groups=[g for g in self._groups_of(self.own) if g.vpc_id in changed],
            ports=[p for vid in own for p in self.local[vid]], vteps=None)


def _compile_host(s: Session, host: str) -> Compiled | None:
    """Two round trips at most: the host's view (Q_HOST_VPCS), then every fragment the cache does not hold at the
    view's versions, read together. Each fragment is versioned by the stamps it follows (see FRAGMENTS)."""
    view = host_view(s, host)
    if view is None:
        return None
    topology, vpcs, own = view.topology, view.vpcs, view.own
    relevant = sorted(vpcs)
    revs = {vid: v.revision for vid, v in vpcs.items()}

    # what the cache holds at these versions, and what it does not
    hosts_frag = FRAGMENTS.get(s, ("hosts",), topology)
    with_topology = {vid: (rev, topology) for vid, rev in revs.items()}
    local, stale_ports = _cached(s, f"ports:{host}", {vid: with_topology[vid] for vid in own})
    endpoints, stale_endpoints = _cached(s, "endpoints", with_topology)
    groups, stale_groups = _cached(s, "sg", {vid: revs[vid] for vid in own})
    # a VPC's entry: own ones with their route tables, peered ones for their VNI, router MAC and subnets; it follows
    # the VPC's revision (subnets, routes, peerings, NAT gateways and their EIPs all stamp it) and the topology
    # (which instances serve a NAT gateway)
    entries: dict[str, VpcInfo] = {}
    stale_entries: list[str] = []
    for kind, ids in (("own-vpc", own), ("peer-vpc", vpcs.keys() - own)):
        got, miss = _cached(s, kind, {vid: with_topology[vid] for vid in ids})
        entries.update(got)
        stale_entries += miss
    subnets, stale_subnets = _cached(s, "subnets", {vid: revs[vid] for vid in stale_entries})
    stale_own = [vid for vid in stale_entries if vid in own]

    reads = Reads()
    if hosts_frag is None:
        reads.add("hosts", Q_HOSTS)
    if stale_ports:
        reads.add("ports", Q_LOCAL, host=host, vpcs=stale_ports)
    if stale_endpoints:
        reads.add("endpoints", Q_ENDPOINTS, vpcs=stale_endpoints)
    if stale_groups:
        reads.add("rules", Q_GROUP_RULES, vpcs=stale_groups)
        reads.add("members", Q_GROUP_MEMBERS, vpcs=stale_groups)
    if stale_subnets:
        reads.add("subnets", Q_SUBNETS, vpcs=stale_subnets)
    if stale_own:
        reads.add("routes", Q_ROUTES, vpcs=stale_own)
        reads.add("gateways", Q_NAT_GATEWAYS, vpcs=stale_own)
    rows = reads.run(s)

    if hosts_frag is None:
        hosts_frag = _hosts_fragment(rows["hosts"])
        FRAGMENTS.put(s, ("hosts",), topology, hosts_frag)
    vteps, instances = hosts_frag
    _store(s, f"ports:{host}", with_topology, _ports_fragments(rows["ports"], stale_ports, instances), local)
    _store(s, "endpoints", with_topology,
           _endpoints_fragments(rows["endpoints"], {v: vpcs[v] for v in stale_endpoints}), endpoints)
    _store(s, "sg", revs, _groups_fragments(rows["rules"], rows["members"], stale_groups), groups)
    _store(s, "subnets", revs, _subnets_fragments(rows["subnets"], stale_subnets), subnets)
    user_routes: dict[str, list] = defaultdict(list)
    for r in rows["routes"]:
        user_routes[r.vpc_id].append(r)
    gateway_eips: dict[str, list[str]] = defaultdict(list)
    for gid, eid in rows["gateways"]:
        gateway_eips[gid] += [eid] if eid else []
    for vid in stale_entries:
        v = vpcs[vid]
        routes = _routes(v, vpcs, view.peers.get(vid, ()), user_routes.get(vid, ()), gateway_eips,
                         instances) if vid in own else []
        entries[vid] = VpcInfo.model_construct(id=vid, tenant_id=v.tenant_id, vni=v.vni, cidr=v.cidr,
                                               router_mac=v.router_mac, subnets=list(subnets[vid]), routes=routes)
        FRAGMENTS.put(s, ("own-vpc" if vid in own else "peer-vpc", vid), with_topology[vid], (entries[vid],))

    return Compiled(host, view.revision, view.vtep_ip, view.stamp, topology, revs, own, view.peers, relevant,
                    entries, local, endpoints, {gid: g for vid in own for gid, g in groups[vid].items()}, vteps)
