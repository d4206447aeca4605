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
from dataclasses import dataclass

from sqlalchemy import bindparam, func, or_, select
from sqlalchemy.orm import Session

from controller import models as m
from controller.hostconfig import (
    OVERLAY_MTU,
    DnatInfo,
    Endpoint,
    GatewayConfig,
    GatewayVpc,
    HostConfig,
    HostConfigDelta,
    PortInfo,
    RouteInfo,
    SecurityGroupInfo,
    SecurityGroupRuleInfo,
    SnatInfo,
    StaticEip,
    SubnetInfo,
    VpcInfo,
    Vtep,
    delta_of,
)
from controller.sqlset import in_ids


class FragmentCache:
    """Immutable compiled fragments, one version per key: a VPC's endpoints as of its revision, a host's ports as of
    its stamp, and so on (thread-safe: the watch API compiles in a thread pool). A newer version replaces the older
    one, which no new snapshot needs again: the cache holds what the current state needs, not every revision it
    went through (keeping those made the heap, and every full garbage collection, grow with the write history).
    A bounded LRU over keys all the same."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.data: OrderedDict[tuple, tuple] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def _scoped(s: Session, key: tuple) -> tuple:
        # one cache per database: host names and revisions repeat across databases (tests run many). The engine
        # object is the scope, hashed by identity: its URL renders itself to a string on every hash, which was a
        # quarter of a compile's time on these per-VPC lookups
        return (s.get_bind(), *key)

    def get(self, s: Session, key: tuple, version: tuple | int) -> tuple | None:
        key = self._scoped(s, key)
        with self.lock:
            v = self.data.get(key)
            if v is None or v[0] != version:
                self.misses += 1
                return None
            self.data.move_to_end(key)
            self.hits += 1
            return v[1]

    def put(self, s: Session, key: tuple, version: tuple | int, value: tuple) -> None:
        key = self._scoped(s, key)
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
_PEERINGS, _ROUTES, _SUBNETS = m.Peering.__table__, m.Route.__table__, m.Subnet.__table__
_PSG, _EIPS, _COUNTERS, _NATGWS = (m.PortSecurityGroup.__table__, m.Eip.__table__, m.Counter.__table__,
                                   m.NatGateway.__table__)
_TOPOLOGY = select(_COUNTERS.c.value).where(_COUNTERS.c.name == "topology").scalar_subquery()
Q_HOST = select(_HOSTS.c.config_revision, _HOSTS.c.vtep_ip, _TOPOLOGY).where(_HOSTS.c.name == bindparam("host"))
Q_OWN = select(_PORTS.c.vpc_id).where(_PORTS.c.host == bindparam("host")).distinct()
Q_PEERS = select(_PEERINGS.c.id, _PEERINGS.c.requester_vpc_id, _PEERINGS.c.accepter_vpc_id).where(
    _PEERINGS.c.status == "active", or_(in_ids(_PEERINGS.c.requester_vpc_id, "vpcs"),
                                        in_ids(_PEERINGS.c.accepter_vpc_id, "vpcs")))
Q_MAX_VPC_REVISION = select(func.max(_VPCS.c.revision)).where(in_ids(_VPCS.c.id, "vpcs"))
Q_VPCS = select(_VPCS.c.id, _VPCS.c.tenant_id, _VPCS.c.vni, _VPCS.c.cidr, _VPCS.c.router_mac,
                _VPCS.c.revision).where(in_ids(_VPCS.c.id, "vpcs"))
Q_ROUTES = select(_ROUTES.c.vpc_id, _ROUTES.c.destination, _ROUTES.c.target_type, _ROUTES.c.target_id) \
    .where(in_ids(_ROUTES.c.vpc_id, "vpcs")).order_by(_ROUTES.c.destination)
Q_NAT_GATEWAYS = select(_NATGWS.c.id).where(in_ids(_NATGWS.c.vpc_id, "vpcs"))
Q_ENDPOINTS = select(_PORTS.c.id, _PORTS.c.vpc_id, _PORTS.c.ip, _PORTS.c.mac, _PORTS.c.host, _HOSTS.c.vtep_ip) \
    .join(_HOSTS, _HOSTS.c.name == _PORTS.c.host).where(in_ids(_PORTS.c.vpc_id, "vpcs")) \
    .order_by(_PORTS.c.vpc_id, _PORTS.c.ip_int)
Q_SUBNETS = select(_SUBNETS.c.id, _SUBNETS.c.vpc_id, _SUBNETS.c.cidr, _SUBNETS.c.gateway_ip) \
    .where(in_ids(_SUBNETS.c.vpc_id, "vpcs")).order_by(_SUBNETS.c.cidr)
_SG, _RULES = m.SecurityGroup.__table__, m.SecurityGroupRule.__table__
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


def vpc_endpoints(s: Session, vpcs: dict[str, tuple[int, int]], topology: int) -> dict[str, tuple[Endpoint, ...]]:
    """Endpoints of each VPC in `vpcs` (id -> (revision, vni)), from FRAGMENTS or compiled for the missing ones."""
    out, missing = _cached(s, "endpoints", {vid: (rev, topology) for vid, (rev, _vni) in vpcs.items()})
    if missing:
        built: dict[str, list[Endpoint]] = {vid: [] for vid in missing}
        for e in s.execute(Q_ENDPOINTS, {"vpcs": missing}):
            built[e.vpc_id].append(Endpoint(port_id=e.id, vpc_id=e.vpc_id, vni=vpcs[e.vpc_id][1], ip=e.ip,
                                            mac=e.mac, host=e.host, vtep_ip=e.vtep_ip))
        for vid, eps in built.items():
            out[vid] = tuple(eps)
            FRAGMENTS.put(s, ("endpoints", vid), (vpcs[vid][0], topology), (out[vid],))
    return out


def _cached(s: Session, kind: str, vpcs: dict[str, tuple | int]) -> tuple[dict, list[str]]:
    """The cached `kind` fragments of these VPCs (id -> version), and the VPCs that have none of that version."""
    out, missing = {}, []
    for vid, version in vpcs.items():
        frag = FRAGMENTS.get(s, (kind, vid), version)
        if frag is None:
            missing.append(vid)
        else:
            out[vid] = frag[0]
    return out, missing


def vpc_security_groups(s: Session, vpcs: dict[str, int]) -> dict[str, dict[str, SecurityGroupInfo]]:
    """Every security group of each VPC in `vpcs` (id -> revision), remote groups resolved to member addresses.
    Groups, rules and memberships only change with a write that stamps their VPC (remote groups are in the same
    VPC), so these fragments are cached by VPC revision too."""
    out, missing = _cached(s, "sg", vpcs)
    if not missing:
        return out
    built: dict[str, dict[str, list[SecurityGroupRuleInfo]]] = {vid: {} for vid in missing}
    rules = []
    for r in s.execute(Q_GROUP_RULES, {"vpcs": missing}):  # every group, with its rules if it has any
        built[r.vpc_id].setdefault(r.group_id, [])
        if r.id is not None:
            rules.append(r)
    members: dict[str, list[str]] = defaultdict(list)
    if any(r.remote_group_id for r in rules):
        for gid, ip in s.execute(Q_GROUP_MEMBERS, {"vpcs": missing}):
            members[gid].append(f"{ip}/32")
    for r in rules:
        remote = members.get(r.remote_group_id, []) if r.remote_group_id else [r.remote_cidr or "0.0.0.0/0"]
        built[r.vpc_id][r.group_id].append(SecurityGroupRuleInfo(
            id=r.id, direction=r.direction, protocol=r.protocol, port_range_min=r.port_range_min,
            port_range_max=r.port_range_max, remote_cidrs=remote))
    for vid, groups in built.items():
        out[vid] = {gid: SecurityGroupInfo(id=gid, vpc_id=vid, rules=rs) for gid, rs in groups.items()}
        FRAGMENTS.put(s, ("sg", vid), vpcs[vid], (out[vid],))
    return out


def vpc_subnets(s: Session, vpcs: dict[str, int]) -> dict[str, tuple[SubnetInfo, ...]]:
    """Subnets of each VPC (id -> revision), cached by VPC revision like the endpoints."""
    out, missing = _cached(s, "subnets", vpcs)
    if missing:
        built: dict[str, list[SubnetInfo]] = {vid: [] for vid in missing}
        for sid, vid, cidr, gw in s.execute(Q_SUBNETS, {"vpcs": missing}):
            built[vid].append(SubnetInfo(id=sid, cidr=cidr, gateway_ip=gw))
        for vid, subs in built.items():
            out[vid] = tuple(subs)
            FRAGMENTS.put(s, ("subnets", vid), vpcs[vid], (out[vid],))
    return out


def live_gateways(s: Session) -> dict[str, str]:
    """Live NAT gateway instances: name -> VTEP."""
    return dict(s.execute(select(m.Host.name, m.Host.vtep_ip).where(m.Host.kind == "gateway", m.Host.status == "up")
                          .order_by(m.Host.name)).all())


def home(key: str, instances: list[str] | dict[str, str]) -> str | None:
    """Rendezvous (highest random weight) hashing: every controller computes the same home, and when an instance
    dies only what it homed moves; what lives on the survivors stays where it is."""
    if not instances:
        return None
    return max(instances, key=lambda i: _weight(key, i))


def _weight(key: str, instance: str) -> bytes:
    return hashlib.blake2b(f"{key}|{instance}".encode(), digest_size=8).digest()


NAT_BUCKETS = 8  # source-address buckets (the low 3 bits of a VM's address) a NAT gateway's traffic is split into


def nat_gateway_eips(s: Session, gateway_ids: set[str] | None = None) -> dict[str, list[str]]:
    """NAT gateway id -> its EIP ids (sorted)."""
    stmt = select(m.NatGatewayEip.nat_gateway_id, m.NatGatewayEip.eip_id).order_by(m.NatGatewayEip.eip_id)
    if gateway_ids is not None:
        stmt = stmt.where(m.NatGatewayEip.nat_gateway_id.in_(gateway_ids))
    out: dict[str, list[str]] = defaultdict(list)
    for gid, eid in s.execute(stmt):
        out[gid].append(eid)
    return out


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


def _peers(s: Session, own: frozenset[str]) -> dict[str, list[tuple[str, str]]]:
    peers: dict[str, list[tuple[str, str]]] = defaultdict(list)  # vpc -> [(peering id, peer vpc)]
    if own:
        for pid, a, b in s.execute(Q_PEERS, {"vpcs": list(own)}):
            peers[a].append((pid, b))
            peers[b].append((pid, a))
    return peers


def host_revision(s: Session, host: str) -> tuple[int, set[str]] | None:
    """The revision of this host's config (the newest stamp among what it depends on), and the VPCs it
    depends on. None if the host is not registered."""
    row = s.execute(Q_HOST, {"host": host}).one_or_none()
    if row is None:
        return None
    own = host_vpcs(s, host, row[0])
    peers = _peers(s, own)
    relevant = own | {peer for v in own for _, peer in peers.get(v, ())}
    vrev = (s.execute(Q_MAX_VPC_REVISION, {"vpcs": list(relevant)}).scalar() or 0) if relevant else 0
    return max(row[0], row[2], vrev), relevant


def hosts_at(s: Session, topology: int) -> tuple[tuple[Vtep, ...], dict[str, str]]:
    """Every host's VTEP, and the live NAT gateway instances (name -> VTEP), as of a topology revision: hosts
    appearing, changing VTEP, and going up or down all stamp the topology."""
    frag = FRAGMENTS.get(s, ("hosts",), topology)
    if frag is None:
        rows = s.execute(select(m.Host.name, m.Host.vtep_ip, m.Host.kind, m.Host.status).order_by(m.Host.name)).all()
        frag = (tuple(Vtep(host=n, ip=ip, kind=k) for n, ip, k, _ in rows),
                {n: ip for n, ip, k, st in rows if k == "gateway" and st == "up"})
        FRAGMENTS.put(s, ("hosts",), topology, frag)
    return frag


def host_vpcs(s: Session, host: str, stamp: int) -> frozenset[str]:
    """The VPCs with a port on the host, as of its stamp: binding a port there, or unbinding, moving or deleting
    one, stamps the host."""
    frag = FRAGMENTS.get(s, ("own", host), stamp)
    if frag is None:
        frag = (frozenset(s.execute(Q_OWN, {"host": host}).scalars()),)
        FRAGMENTS.put(s, ("own", host), stamp, frag)
    return frag[0]


def compile_host(s: Session, host: str) -> HostConfig | None:
    out = _compile_host(s, host)
    return out.config if out else None


def compile_host_delta(s: Session, host: str, base: int) -> HostConfigDelta | None:
    """What changed in the host's config after revision `base` (see HostConfigDelta): the VPCs stamped after it,
    the ports if the host was stamped, and everything when the topology moved (VTEPs are in every section).

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
    return delta_of(out.config, base, changed)


@dataclass(frozen=True)
class Compiled:
    """A host's config and the stamps it was compiled from."""

    config: HostConfig
    host_stamp: int
    topology: int
    vpc_revisions: dict[str, int]
    own: frozenset[str]  # VPCs with a port on the host
    peers: dict[str, list[tuple[str, str]]]  # VPC -> [(peering id, peer VPC)], for the peerings of own VPCs


def host_ports(s: Session, host: str, own: dict[str, int], topology: int,
               instances: dict[str, str]) -> dict[str, tuple[PortInfo, ...]]:
    """The host's ports in each of its VPCs (id -> revision), as the wire has them. Every write that changes one of
    them (creating, binding, moving, deleting a port, changing its groups, (dis)associating its EIP) stamps the
    port's VPC, and a port's EIP is homed by the topology: cached per (host, VPC) by those two, so a write
    rebuilds the host's ports of the VPCs it stamped, not all of them."""
    out, missing = _cached(s, f"ports:{host}", {vid: (rev, topology) for vid, rev in own.items()})
    if not missing:
        return out
    rows: dict[str, tuple] = {}  # port id -> (row, its groups): a port in n groups comes back n times
    for p in s.execute(Q_LOCAL, {"host": host, "vpcs": missing}):
        groups = rows.setdefault(p.id, (p, []))[1]
        if p.group_id is not None:
            groups.append(p.group_id)
    built: dict[str, list[PortInfo]] = {vid: [] for vid in missing}
    for p, groups in rows.values():
        eip_home = home(f"eip:{p.eip_id}", instances) if p.eip_id else None
        built[p.vpc_id].append(PortInfo.model_construct(  # from the database's rows: nothing to validate
            id=p.id, vpc_id=p.vpc_id, subnet_id=p.subnet_id, mac=p.mac, ip=p.ip, security_group_ids=groups,
            eip_home_vtep=instances[eip_home] if eip_home else None))
    for vid, ports in built.items():
        out[vid] = tuple(ports)
        FRAGMENTS.put(s, (f"ports:{host}", vid), (own[vid], topology), (out[vid],))
    return out


def _routes(v, vpc_rows: dict, peers, user_routes, gateways: set[str],  # noqa: ANN001
            gateway_eips: dict[str, list[str]], instances: dict[str, str]) -> list[RouteInfo]:
    """An own VPC's effective route table: local, one route per active peering, then the user's routes (a target
    that is gone or not ready is a blackhole)."""
    routes = [RouteInfo(destination=v.cidr, target_type="local")]
    active = {}
    for pid, peer in sorted(peers):
        active[pid] = peer
        routes.append(RouteInfo(destination=vpc_rows[peer].cidr, target_type="peering", target_id=pid,
                                peer_vpc_id=peer))
    for r in user_routes:
        buckets = nat_buckets(r.target_id, gateway_eips.get(r.target_id, []), instances) \
            if r.target_type == "nat-gateway" and r.target_id in gateways and instances else []
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


def _compile_host(s: Session, host: str) -> Compiled | None:
    row = s.execute(Q_HOST, {"host": host}).one_or_none()
    if row is None:
        return None
    topology = row[2]
    vteps, instances = hosts_at(s, topology)

    own = host_vpcs(s, host, row.config_revision)
    peers = _peers(s, own)
    relevant = own | {peer for v in own for _, peer in peers.get(v, ())}
    vpc_rows = {v.id: v for v in s.execute(Q_VPCS, {"vpcs": list(relevant)})} if relevant else {}
    # the same revision host_revision() computes: the newest stamp among what this config depends on
    revision = max([row.config_revision, topology, *(v.revision for v in vpc_rows.values())])
    vtep = row.vtep_ip

    local = host_ports(s, host, {vid: vpc_rows[vid].revision for vid in own}, topology, instances)
    ports = [p for vid in sorted(own) for p in local[vid]]

    # VPCs: own ones with their route tables, peered ones for their VNI/router MAC/subnets. A VPC's entry follows
    # its revision (subnets, routes, peerings, NAT gateways and their EIPs all stamp it) and the topology (which
    # instances serve a NAT gateway): cached by those, rebuilt only for the VPCs that changed.
    vpc_infos: dict[str, VpcInfo] = {}
    missing: list[str] = []
    for kind, ids in (("own-vpc", own), ("peer-vpc", relevant - own)):  # with routes, without
        got, miss = _cached(s, kind, {vid: (vpc_rows[vid].revision, topology) for vid in ids})
        vpc_infos.update(got)
        missing += miss
    stale = {vid: vpc_rows[vid].revision for vid in missing}
    if stale:
        stale_own = [vid for vid in stale if vid in own]
        subnets = vpc_subnets(s, stale)
        user_routes: dict[str, list] = defaultdict(list)
        gateways: set[str] = set()
        if stale_own:
            for r in s.execute(Q_ROUTES, {"vpcs": stale_own}):
                user_routes[r.vpc_id].append(r)
            gateways = set(s.execute(Q_NAT_GATEWAYS, {"vpcs": stale_own}).scalars())
        gateway_eips = nat_gateway_eips(s, gateways) if gateways and instances else {}
        for vid in stale:
            v = vpc_rows[vid]
            routes = _routes(v, vpc_rows, peers.get(vid, ()), user_routes.get(vid, ()), gateways, gateway_eips,
                             instances) if vid in own else []
            vpc_infos[vid] = VpcInfo.model_construct(id=vid, tenant_id=v.tenant_id, vni=v.vni, cidr=v.cidr,
                                                     router_mac=v.router_mac, subnets=list(subnets.get(vid, ())),
                                                     routes=routes)
            FRAGMENTS.put(s, ("own-vpc" if vid in own else "peer-vpc", vid), (v.revision, topology),
                          (vpc_infos[vid],))
    vpcs = [vpc_infos[vid] for vid in sorted(relevant)]

    # Every bound port of those VPCs: where it lives and how to reach it (per-VPC fragments, see FRAGMENTS).
    frags = vpc_endpoints(s, {vid: (v.revision, v.vni) for vid, v in vpc_rows.items()}, topology)
    endpoints = [e for vid in sorted(relevant) for e in frags[vid]]

    # Security groups of local ports, remote groups resolved to member addresses (per-VPC fragments).
    group_ids = sorted({g for p in ports for g in p.security_group_ids})
    groups = []
    if group_ids:
        sgs = vpc_security_groups(s, {vid: vpc_rows[vid].revision for vid in own})
        by_id = {gid: g for frag in sgs.values() for gid, g in frag.items()}
        groups = [by_id[g] for g in group_ids]

    # every part is a validated wire model already: construct without validating the ~1,000 of them again
    cfg = HostConfig.model_construct(host=host, revision=revision, vtep_ip=vtep, mtu=OVERLAY_MTU, ports=ports,
                                     vpcs=vpcs, endpoints=endpoints, security_groups=groups, vteps=list(vteps))
    return Compiled(cfg, row.config_revision, topology, {vid: v.revision for vid, v in vpc_rows.items()}, own, peers)


def compile_gateway(s: Session, name: str, revision: int) -> GatewayConfig | None:
    """A NAT gateway instance's config: the NAT gateways it serves (see nat_buckets), SNAT with the EIPs homed
    here, the 1:1 EIPs homed here, and DNAT: rules on EIPs homed here (inbound), plus the reverse translation of
    every DNAT rule of a gateway it serves (the target VM's replies may fall in this instance's buckets)."""
    host = s.get(m.Host, name)
    if host is None:
        return None
    instances = live_gateways(s) or {name: host.vtep_ip}
    all_eips = nat_gateway_eips(s)
    mine_gw = {g for g in s.execute(select(m.NatGateway.id)).scalars()
               if name in nat_buckets(g, all_eips.get(g, []), instances)}
    homed_here = {e for es in all_eips.values() for e in es if home(f"eip:{e}", instances) == name}
    eip_addr = dict(s.execute(select(m.Eip.id, m.Eip.address)).all())
    vpcs: dict[str, GatewayVpc] = {}
    vpc_rows = {}

    def vpc(vid: str) -> GatewayVpc:
        if vid not in vpcs:
            v = s.execute(select(m.Vpc.id, m.Vpc.vni, m.Vpc.router_mac).where(m.Vpc.id == vid)).one()
            vpc_rows[vid] = v
            vpcs[vid] = GatewayVpc(id=v.id, vni=v.vni, router_mac=v.router_mac)
        return vpcs[vid]

    snat: dict[str, list[SnatInfo]] = defaultdict(list)
    for gw_id, gw_vpc, cidr, ids in s.execute(
            select(m.NatGateway.id, m.NatGateway.vpc_id, m.SnatRule.cidr, m.SnatRule.eip_ids)
            .join(m.SnatRule, m.SnatRule.nat_gateway_id == m.NatGateway.id).order_by(m.SnatRule.cidr)):
        if gw_id in mine_gw:
            snat[gw_vpc].append(SnatInfo(cidr=cidr, eips=[eip_addr[i] for i in ids.split(",")
                                                          if i in eip_addr and i in homed_here]))
    for gw_id, vid in s.execute(select(m.NatGateway.id, m.NatGateway.vpc_id)):
        if gw_id in mine_gw:
            vpc(vid)
    static = []
    for eid, address, vid, ip in s.execute(select(m.Eip.id, m.Eip.address, m.Port.vpc_id, m.Port.ip)
                                           .join(m.Port, m.Port.id == m.Eip.port_id).order_by(m.Eip.address)):
        if home(f"eip:{eid}", instances) == name:
            static.append(StaticEip(vni=vpc(vid).vni, ip=ip, eip=address))
    dnat = []
    dnat_here: set[str] = set()
    for r, vid, ip in s.execute(select(m.DnatRule, m.Port.vpc_id, m.Port.ip)
                                .join(m.Port, m.Port.id == m.DnatRule.port_id)):
        if home(f"eip:{r.eip_id}", instances) == name:
            dnat_here.add(eip_addr[r.eip_id])  # inbound to this EIP arrives here
        elif r.nat_gateway_id not in mine_gw:
            continue  # neither its EIP nor the target VM's replies come here
        dnat.append(DnatInfo(eip=eip_addr[r.eip_id], protocol=r.protocol, external_port=r.external_port,
                             vni=vpc(vid).vni, ip=ip, internal_port=r.internal_port))
    out_vpcs = [v.model_copy(update={"snat": snat.get(v.id, [])}) for v in vpcs.values()]
    endpoints = []
    if vpcs:
        for e in s.execute(select(m.Port.id, m.Port.vpc_id, m.Port.ip, m.Port.mac, m.Port.host, m.Host.vtep_ip)
                           .join(m.Host, m.Host.name == m.Port.host).where(m.Port.vpc_id.in_(vpcs))
                           .order_by(m.Port.vpc_id, m.Port.ip_int)):
            endpoints.append(Endpoint(port_id=e.id, vpc_id=e.vpc_id, vni=vpcs[e.vpc_id].vni, ip=e.ip, mac=e.mac,
                                      host=e.host, vtep_ip=e.vtep_ip))
    # ARP on the external side only for what is homed here (DNAT reverse translations are everywhere)
    served = sorted({a for v in out_vpcs for r in v.snat for a in r.eips} | {x.eip for x in static} | dnat_here)
    vteps = [Vtep(host=n, ip=ip, kind=k) for n, ip, k in
             s.execute(select(m.Host.name, m.Host.vtep_ip, m.Host.kind).order_by(m.Host.name))]
    return GatewayConfig(name=name, revision=revision, vtep_ip=host.vtep_ip, vpcs=out_vpcs, static=static,
                         dnat=dnat, endpoints=endpoints, eips=served, vteps=vteps)
