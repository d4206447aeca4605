"""The database reads of the compiles, in one place: what a host's config is made of (Q_HOST_VPCS: its stamps and
VPCs) and what a gateway instance's is (Q_GATEWAY_VIEW), and the statements that read the fragments the cache lacks,
sent together (`Reads`). The compilers assemble configs from these rows; they send no SQL of their own."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, literal, null, select, text, union, union_all
from sqlalchemy.orm import Session

from controller.state import models as m
from controller.state.sqlset import fetch_all, in_ids

# The watch path's statements, built once on the Core tables with bound parameters: SQLAlchemy then finds each
# compiled form by a cache key memoised on the statement, instead of building the statement and hashing it (and
# its ORM entities) on every compile, which cost more than the database's answer.
_PORTS, _HOSTS, _VPCS = m.Port.__table__, m.Host.__table__, m.Vpc.__table__
_ROUTES, _SUBNETS, _PSG, _EIPS = m.Route.__table__, m.Subnet.__table__, m.PortSecurityGroup.__table__, m.Eip.__table__
_NATGWS, _NATGW_EIPS = m.NatGateway.__table__, m.NatGatewayEip.__table__
_SG, _RULES = m.SecurityGroup.__table__, m.SecurityGroupRule.__table__
_SNAT, _SNAT_EIPS, _DNAT = m.SnatRule.__table__, m.SnatRuleEip.__table__, m.DnatRule.__table__
_LBS, _LISTENERS, _POOLS = m.LoadBalancer.__table__, m.LbListener.__table__, m.LbPool.__table__
_MEMBERS, _MONITORS = m.LbMember.__table__, m.LbHealthMonitor.__table__
_LINES, _LINE_STATIC = m.PrivateLine.__table__, m.PrivateLineStaticRoute.__table__
_LINE_LEARNED = m.PrivateLineLearned.__table__
_ENDPOINTS, _SERVICES = m.ServiceEndpoint.__table__, m.Service.__table__
_REMOVED = m.RemovedHost.__table__
_MIGRATING = _HOSTS.alias("migrating_to")
_PEERINGS, _PEERV = m.Peering.__table__, m.Vpc.__table__.alias("peer_vpc")
_PEP, _PPORT, _PVPC = _ENDPOINTS.alias("provider_side"), _PORTS.alias("provider_port"), _VPCS.alias("provider_vpc")
_VIP, _MPORT, _MSUBNET = _PORTS.alias("vip_port"), _PORTS.alias("member_port"), _SUBNETS.alias("member_subnet")

# The host, and every VPC its config holds, in one statement: its own VPCs (those of its ports), once each with no
# peering, and the VPCs peered with them, once per active peering, with the own VPC they are peered with. A row of
# NULL VPC columns when there is none; no row when the host is not registered.
Q_HOST_VPCS = text("""
    WITH own AS (SELECT DISTINCT vpc_id AS id FROM ports WHERE host = :host OR migrating_to = :host),
         rel AS (SELECT id, NULL AS peering_id, NULL AS peer_of FROM own
                 UNION ALL
                 SELECT accepter_vpc_id, id, requester_vpc_id FROM peerings
                 WHERE status = 'active' AND requester_vpc_id IN (SELECT id FROM own)
                 UNION ALL
                 SELECT requester_vpc_id, id, accepter_vpc_id FROM peerings
                 WHERE status = 'active' AND accepter_vpc_id IN (SELECT id FROM own))
    SELECT h.config_revision, h.vtep_ip, (SELECT value FROM counters WHERE name = 'topology') AS topology,
           (SELECT value FROM counters WHERE name = 'vteps') AS vteps,
           v.id, v.tenant_id, v.vni, v.cidr, v.ipv6_cidr, v.router_mac, v.mtu, v.revision, v.peering_id, v.peer_of
    FROM hosts h LEFT JOIN (SELECT vpcs.id, vpcs.tenant_id, vpcs.vni, vpcs.cidr, vpcs.ipv6_cidr, vpcs.router_mac,
                                   vpcs.mtu, vpcs.revision,
                                   rel.peering_id, rel.peer_of
                            FROM rel JOIN vpcs ON vpcs.id = rel.id) v ON 1 = 1
    WHERE h.name = :host""")
Q_HOSTS = select(_HOSTS.c.name, _HOSTS.c.vtep_ip, _HOSTS.c.kind, _HOSTS.c.status, _HOSTS.c.role) \
    .order_by(_HOSTS.c.name)
# every load balancer of these VPCs with its listeners and their pools' members (a row per member; NULLs for a
# load balancer without listeners, a listener without a pool, a pool without members): the vSwitches' part and
# the instances' part alike
Q_LB_MEMBERS = select(_LBS.c.id, _LBS.c.vpc_id, _LBS.c.vip_address, _VIP.c.mac.label("vip_mac"),
                      _LBS.c.eip_id, _EIPS.c.address.label("eip"),
                      _LISTENERS.c.protocol, _LISTENERS.c.port, _LISTENERS.c.idle_timeout_s,
                      _POOLS.c.id.label("pool_id"), _POOLS.c.algorithm, _POOLS.c.table_size,
                      _POOLS.c.deregistration_delay_s, _MONITORS.c.pool_id.label("monitored"),
                      _MONITORS.c.type.label("hm_type"), _MONITORS.c.interval_s, _MONITORS.c.timeout_s,
                      _MONITORS.c.rise, _MONITORS.c.fall, _MONITORS.c.http_method, _MONITORS.c.url_path,
                      _MONITORS.c.expected_codes, _MSUBNET.c.gateway_ip.label("member_gateway"),
                      _MEMBERS.c.id.label("member_id"), _MEMBERS.c.protocol_port, _MEMBERS.c.weight,
                      _MEMBERS.c.operating_status, _MEMBERS.c.status_changed_at,
                      _MPORT.c.id.label("port_id"), _MPORT.c.ip.label("member_ip"),
                      _MPORT.c.mac.label("member_mac")) \
    .join(_VIP, _VIP.c.id == _LBS.c.vip_port_id).outerjoin(_EIPS, _EIPS.c.id == _LBS.c.eip_id) \
    .outerjoin(_LISTENERS, _LISTENERS.c.load_balancer_id == _LBS.c.id) \
    .outerjoin(_POOLS, _POOLS.c.id == _LISTENERS.c.default_pool_id) \
    .outerjoin(_MONITORS, _MONITORS.c.pool_id == _POOLS.c.id) \
    .outerjoin(_MEMBERS, _MEMBERS.c.pool_id == _POOLS.c.id) \
    .outerjoin(_MPORT, _MPORT.c.id == _MEMBERS.c.port_id) \
    .outerjoin(_MSUBNET, _MSUBNET.c.id == _MPORT.c.subnet_id) \
    .where(in_ids(_LBS.c.vpc_id, "vpcs")) \
    .order_by(_LBS.c.id, _LISTENERS.c.protocol, _LISTENERS.c.port, _MEMBERS.c.id)
Q_ROUTES = select(_ROUTES.c.vpc_id, _ROUTES.c.destination, _ROUTES.c.target_type, _ROUTES.c.target_id) \
    .where(in_ids(_ROUTES.c.vpc_id, "vpcs")).order_by(_ROUTES.c.destination)
# the names the VPCs' resolvers answer: their service endpoints'
Q_DNS = select(_ENDPOINTS.c.vpc_id, _ENDPOINTS.c.dns_name, _ENDPOINTS.c.address) \
    .where(in_ids(_ENDPOINTS.c.vpc_id, "vpcs")).order_by(_ENDPOINTS.c.dns_name)
_PLACED = m.PrivateLinePlacement.__table__


def _placed(session: int) -> Any:
    """A line's session's instance as placed (controller/roles/line/placement.py), beside the line's columns."""
    return select(_PLACED.c.instance).where(_PLACED.c.line_id == _LINES.c.id, _PLACED.c.session == session) \
        .scalar_subquery().label(f"placed{session}")


# every private-line route of these VPCs: a static one (instance NULL) or one an instance learned, a row each
Q_LINE_ROUTES = union_all(
    select(_LINES.c.vpc_id, _LINES.c.id.label("line_id"), _LINE_STATIC.c.destination, literal("static").label("origin"),
           null().label("instance"), _LINES.c.secondary_local_ip, _placed(0), _placed(1))
    .join(_LINE_STATIC, _LINE_STATIC.c.line_id == _LINES.c.id).where(in_ids(_LINES.c.vpc_id, "vpcs")),
    select(_LINES.c.vpc_id, _LINES.c.id.label("line_id"), _LINE_LEARNED.c.prefix.label("destination"),
           literal("bgp").label("origin"), _LINE_LEARNED.c.instance, _LINES.c.secondary_local_ip, _placed(0),
           _placed(1))
    .join(_LINE_LEARNED, _LINE_LEARNED.c.line_id == _LINES.c.id).where(in_ids(_LINES.c.vpc_id, "vpcs")),
).order_by("line_id", "destination", "instance")
# the private lines of these VPCs, a row per static route (NULL: none)
Q_LINES = select(_LINES.c.vpc_id, _LINES.c.id, _LINES.c.vlan_id, _LINES.c.customer_asn, _LINES.c.customer_ip,
                 _LINES.c.local_ip, _LINES.c.prefixlen, _LINES.c.secondary_customer_ip, _LINES.c.secondary_local_ip,
                 _LINES.c.md5_password, _LINES.c.max_prefixes, _LINE_STATIC.c.destination,
                 _VPCS.c.cidr.label("vpc_cidr"), _placed(0), _placed(1)) \
    .join(_VPCS, _VPCS.c.id == _LINES.c.vpc_id).outerjoin(_LINE_STATIC, _LINE_STATIC.c.line_id == _LINES.c.id) \
    .where(in_ids(_LINES.c.vpc_id, "vpcs")) \
    .order_by(_LINES.c.id, _LINE_STATIC.c.destination)
Q_NAT_GATEWAYS = select(_NATGWS.c.id, _NATGW_EIPS.c.eip_id) \
    .outerjoin(_NATGW_EIPS, _NATGW_EIPS.c.nat_gateway_id == _NATGWS.c.id) \
    .where(in_ids(_NATGWS.c.vpc_id, "vpcs")).order_by(_NATGWS.c.id, _NATGW_EIPS.c.eip_id)
# bound ports, and service endpoints' ports (homed on a service instance by the compiler: endpoint_id not NULL)
# (and an endpoint's port in a published load balancer's VPC, homed with it)
# (a migrating port: its destination host and VTEP too)
Q_ENDPOINTS = select(_PORTS.c.id, _PORTS.c.vpc_id, _PORTS.c.ip, _PORTS.c.ipv6, _PORTS.c.mac, _PORTS.c.host,
                     _HOSTS.c.vtep_ip,
                     func.coalesce(_ENDPOINTS.c.id, _PEP.c.id).label("endpoint_id"), _PORTS.c.migrating_to,
                     _MIGRATING.c.vtep_ip.label("migrating_vtep")) \
    .outerjoin(_HOSTS, _HOSTS.c.name == _PORTS.c.host).outerjoin(_ENDPOINTS, _ENDPOINTS.c.port_id == _PORTS.c.id) \
    .outerjoin(_MIGRATING, _MIGRATING.c.name == _PORTS.c.migrating_to) \
    .outerjoin(_PEP, _PEP.c.provider_port_id == _PORTS.c.id) \
    .where(in_ids(_PORTS.c.vpc_id, "vpcs"),
           _HOSTS.c.name.is_not(None) | _ENDPOINTS.c.id.is_not(None) | _PEP.c.id.is_not(None)) \
    .order_by(_PORTS.c.vpc_id, _PORTS.c.ip_int)
Q_SUBNETS = select(_SUBNETS.c.id, _SUBNETS.c.vpc_id, _SUBNETS.c.cidr, _SUBNETS.c.gateway_ip, _SUBNETS.c.ipv6_cidr,
                   _SUBNETS.c.ipv6_gateway_ip, _SUBNETS.c.ipv6_address_mode) \
    .where(in_ids(_SUBNETS.c.vpc_id, "vpcs")).order_by(_SUBNETS.c.cidr)
Q_GROUP_RULES = select(_SG.c.vpc_id, _SG.c.id.label("group_id"), _RULES.c.id, _RULES.c.direction, _RULES.c.protocol,
                       _RULES.c.ethertype,
                       _RULES.c.port_range_min, _RULES.c.port_range_max, _RULES.c.remote_cidr,
                       _RULES.c.remote_group_id) \
    .outerjoin(_RULES, _RULES.c.group_id == _SG.c.id).where(in_ids(_SG.c.vpc_id, "vpcs")) \
    .order_by(_SG.c.id, _RULES.c.id)
Q_GROUP_MEMBERS = select(_PSG.c.group_id, _PORTS.c.ip, _PORTS.c.ipv6).join(_PORTS, _PORTS.c.id == _PSG.c.port_id) \
    .where(in_ids(_PORTS.c.vpc_id, "vpcs")).order_by(_PORTS.c.ip_int)
Q_LOCAL = select(_PORTS.c.id, _PORTS.c.vpc_id, _PORTS.c.subnet_id, _PORTS.c.mac, _PORTS.c.ip, _PORTS.c.ipv6,
                 _PSG.c.group_id,
                 _EIPS.c.id.label("eip_id"), _SUBNETS.c.gateway_ip) \
    .join(_SUBNETS, _SUBNETS.c.id == _PORTS.c.subnet_id) \
    .outerjoin(_PSG, _PSG.c.port_id == _PORTS.c.id).outerjoin(_EIPS, _EIPS.c.port_id == _PORTS.c.id) \
    .where((_PORTS.c.host == bindparam("host")) | (_PORTS.c.migrating_to == bindparam("host")),
           in_ids(_PORTS.c.vpc_id, "vpcs")) \
    .order_by(_PORTS.c.vpc_id, _PORTS.c.id, _PSG.c.group_id)


# --- a gateway instance's config ---
# The instance, the topology stamp, and every VPC an instance of its role may serve (NAT: one with a NAT gateway or
# a port with an EIP; LB: one with a load balancer; private line: one with a line), with its revision: what
# decides whether an instance's config changed. One round trip.
Q_GATEWAY_VIEW = text("""
    SELECT h.vtep_ip, (SELECT value FROM counters WHERE name = 'topology') AS topology,
           (SELECT value FROM counters WHERE name = 'revision') AS at, COALESCE(h.role, 'nat') AS role,
           (SELECT value FROM counters WHERE name = 'vteps') AS vteps, v.id, v.revision, v.vni, v.router_mac, v.mtu
    FROM hosts h LEFT JOIN (SELECT id, revision, vni, router_mac, mtu,
                                   CASE WHEN id IN (SELECT vpc_id FROM load_balancers) THEN 'lb' END AS lb,
                                   CASE WHEN id IN (SELECT vpc_id FROM private_lines) THEN 'private-line' END
                                        AS line,
                                   CASE WHEN id IN (SELECT vpc_id FROM service_endpoints)
                                          OR id IN (SELECT p.vpc_id FROM service_endpoints e
                                                    JOIN ports p ON p.id = e.provider_port_id)
                                          OR id IN (SELECT CASE WHEN x.requester_vpc_id = e.vpc_id
                                                                THEN x.accepter_vpc_id ELSE x.requester_vpc_id END
                                                    FROM peerings x JOIN service_endpoints e
                                                      ON e.vpc_id IN (x.requester_vpc_id, x.accepter_vpc_id)
                                                    WHERE x.status = 'active')
                                        THEN 'service' END AS svc,
                                   CASE WHEN id IN (SELECT vpc_id FROM nat_gateways)
                                          OR id IN (SELECT p.vpc_id FROM eips e JOIN ports p ON p.id = e.port_id)
                                        THEN 'nat' END AS nat
                            FROM vpcs) v ON COALESCE(h.role, 'nat') IN (v.lb, v.nat, v.line, v.svc)
    WHERE h.name = :name""")
Q_NAT_GATEWAYS_SERVED = select(_NATGWS.c.vpc_id, _NATGWS.c.id, _NATGW_EIPS.c.eip_id, _EIPS.c.address) \
    .outerjoin(_NATGW_EIPS, _NATGW_EIPS.c.nat_gateway_id == _NATGWS.c.id) \
    .outerjoin(_EIPS, _EIPS.c.id == _NATGW_EIPS.c.eip_id) \
    .where(in_ids(_NATGWS.c.vpc_id, "vpcs")).order_by(_NATGWS.c.id, _NATGW_EIPS.c.eip_id)
# a row per (rule, EIP), the rule's EIPs in their order
Q_SNAT = select(_NATGWS.c.vpc_id, _SNAT.c.id, _SNAT.c.nat_gateway_id, _SNAT.c.cidr, _SNAT_EIPS.c.eip_id) \
    .join(_NATGWS, _NATGWS.c.id == _SNAT.c.nat_gateway_id).join(_SNAT_EIPS, _SNAT_EIPS.c.rule_id == _SNAT.c.id) \
    .where(in_ids(_NATGWS.c.vpc_id, "vpcs")).order_by(_SNAT.c.cidr, _SNAT.c.nat_gateway_id, _SNAT_EIPS.c.position)
Q_STATIC = select(_PORTS.c.vpc_id, _EIPS.c.id, _EIPS.c.address, _PORTS.c.ip) \
    .join(_PORTS, _PORTS.c.id == _EIPS.c.port_id).where(in_ids(_PORTS.c.vpc_id, "vpcs")).order_by(_EIPS.c.address)
Q_DNAT = select(_NATGWS.c.vpc_id, _DNAT.c.nat_gateway_id, _DNAT.c.eip_id, _EIPS.c.address, _DNAT.c.protocol,
                _DNAT.c.external_port, _PORTS.c.ip, _DNAT.c.internal_port) \
    .join(_NATGWS, _NATGWS.c.id == _DNAT.c.nat_gateway_id).join(_EIPS, _EIPS.c.id == _DNAT.c.eip_id) \
    .join(_PORTS, _PORTS.c.id == _DNAT.c.port_id).where(in_ids(_NATGWS.c.vpc_id, "vpcs")) \
    .order_by(_EIPS.c.address, _DNAT.c.protocol, _DNAT.c.external_port)


def gateway_view(s: Session, name: str) -> list[tuple]:
    """Q_GATEWAY_VIEW's rows as plain tuples (a Row's attribute access was most of a compile); none: not registered."""
    return s.execute(Q_GATEWAY_VIEW, {"name": name}).tuples().all()


# a row per (endpoint, security group of its port); a published load balancer's: its VIP, VNI and provider port
Q_SERVICE_ENDPOINTS = select(_ENDPOINTS.c.vpc_id, _ENDPOINTS.c.id, _ENDPOINTS.c.tenant_id, _PORTS.c.ip, _PORTS.c.mac,
                             _ENDPOINTS.c.source_address, _SERVICES.c.addresses, _SERVICES.c.ports,
                             _SERVICES.c.proxy_protocol, _SERVICES.c.load_balancer_id,
                             _SERVICES.c.tenant_id.label("owner"), _SERVICES.c.allowed_tenants, _PSG.c.group_id,
                             _PPORT.c.ip.label("provider_ip"), _LBS.c.vip_address, _PVPC.c.vni.label("provider_vni")) \
    .join(_PORTS, _PORTS.c.id == _ENDPOINTS.c.port_id).join(_SERVICES, _SERVICES.c.id == _ENDPOINTS.c.service_id) \
    .outerjoin(_PSG, _PSG.c.port_id == _PORTS.c.id) \
    .outerjoin(_PPORT, _PPORT.c.id == _ENDPOINTS.c.provider_port_id) \
    .outerjoin(_LBS, _LBS.c.id == _SERVICES.c.load_balancer_id).outerjoin(_PVPC, _PVPC.c.id == _LBS.c.vpc_id) \
    .where(in_ids(_ENDPOINTS.c.vpc_id, "vpcs")).order_by(_ENDPOINTS.c.id, _PSG.c.group_id)
# the VPCs peered with these (active peerings): a peer's VMs reach the endpoints of the VPC, and the replies go back
# into the peer's VNI
Q_SERVICE_PEERS = union_all(*(
    select(_PEERINGS.c[own].label("vpc_id"), _PEERV.c.id.label("peer_id"), _PEERV.c.vni, _PEERV.c.cidr)
    .join(_PEERV, _PEERV.c.id == _PEERINGS.c[other])
    .where(_PEERINGS.c.status == "active", in_ids(_PEERINGS.c[own], "vpcs"))
    for own, other in (("requester_vpc_id", "accepter_vpc_id"), ("accepter_vpc_id", "requester_vpc_id"))))
# the endpoints of the published load balancers of these VPCs: their VIPs, which the service instances reach
Q_PROVIDER_SIDES = select(_LBS.c.vpc_id, _ENDPOINTS.c.id, _LBS.c.vip_address, _VIP.c.id.label("vip_port_id"),
                          _VIP.c.mac.label("vip_mac")) \
    .join(_SERVICES, _SERVICES.c.load_balancer_id == _LBS.c.id) \
    .join(_ENDPOINTS, _ENDPOINTS.c.service_id == _SERVICES.c.id).join(_VIP, _VIP.c.id == _LBS.c.vip_port_id) \
    .where(in_ids(_LBS.c.vpc_id, "vpcs")).order_by(_ENDPOINTS.c.id)
# every VPC with something a gateway instance serves (Q_GATEWAY_VIEW's roles): what a gateway's role or liveness
# changes in hypervisors' configs (stamps.py)
Q_SERVED_VPCS = union(select(_NATGWS.c.vpc_id), select(_PORTS.c.vpc_id).join(_EIPS, _EIPS.c.port_id == _PORTS.c.id),
                      select(_LBS.c.vpc_id), select(_LINES.c.vpc_id), select(_ENDPOINTS.c.vpc_id),
                      select(_PORTS.c.vpc_id).join(_ENDPOINTS, _ENDPOINTS.c.provider_port_id == _PORTS.c.id))
# the VTEP entries that appeared or changed, and went, after a revision: a delta's share of a VTEP list change
Q_VTEPS_AFTER = select(_HOSTS.c.name, _HOSTS.c.vtep_ip, _HOSTS.c.kind, _HOSTS.c.vtep_revision) \
    .where(_HOSTS.c.vtep_revision > bindparam("base")).order_by(_HOSTS.c.name)
Q_REMOVED_AFTER = select(_REMOVED.c.name, _REMOVED.c.revision).where(_REMOVED.c.revision > bindparam("base")) \
    .order_by(_REMOVED.c.name)
Q_HAS_NAT_GATEWAY = select(_NATGWS.c.id).where(in_ids(_NATGWS.c.vpc_id, "vpcs")).limit(1)
Q_HAS_EIP_PORT = select(_EIPS.c.id).join(_PORTS, _PORTS.c.id == _EIPS.c.port_id) \
    .where(in_ids(_PORTS.c.vpc_id, "vpcs")).limit(1)
Q_HAS_LB = select(_LBS.c.id).where(in_ids(_LBS.c.vpc_id, "vpcs")).limit(1)
Q_HAS_LINE = select(_LINES.c.id).where(in_ids(_LINES.c.vpc_id, "vpcs")).limit(1)
Q_HAS_ENDPOINT = select(_ENDPOINTS.c.id).where(in_ids(_ENDPOINTS.c.vpc_id, "vpcs")).limit(1)


def may_serve(s: Session, vpcs: set[str]) -> bool:
    """Whether any of these VPCs (written to, outside the instances' view) now has something gateways serve."""
    return any(s.execute(q, {"vpcs": sorted(vpcs)}).first() for q in (Q_HAS_NAT_GATEWAY, Q_HAS_EIP_PORT, Q_HAS_LB,
                                                                          Q_HAS_LINE, Q_HAS_ENDPOINT))


@dataclass(frozen=True)
class HostView:
    """A host's stamps and the VPCs its config holds (Q_HOST_VPCS): what decides whether its config changed, and
    which fragments it is made of."""

    stamp: int  # the host's own stamp (its ports bound, unbound, moved)
    vtep_ip: str | None
    topology: int  # versions fragments; what it changes in this host's config stamps the VPCs or the VTEP list
    vteps: int  # the VTEP list's stamp
    vpcs: dict[str, Any]  # id -> row (tenant_id, vni, cidr, router_mac, revision)
    own: frozenset[str]  # VPCs with a port on the host
    peers: dict[str, list[tuple[str, str]]]  # own VPC -> [(peering id, peer VPC)]

    @property
    def revision(self) -> int:
        """The config's revision: the newest stamp among what it depends on."""
        return max([self.stamp, self.vteps, *(v.revision for v in self.vpcs.values())])


def host_view(s: Session, host: str) -> HostView | None:
    return _view_of(s.execute(Q_HOST_VPCS, {"host": host}).all())


def host_views(s: Session, hosts: list[str]) -> dict[str, HostView | None]:
    """Each host's view, read together (one round trip on PostgreSQL): a batch of watches' compiles."""
    return {h: _view_of(rows) for h, rows in zip(hosts, fetch_all(s, [(Q_HOST_VPCS, {"host": h}) for h in hosts]),
                                                 strict=True)}


def _view_of(rows: Any) -> HostView | None:
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
    return HostView(rows[0].config_revision, rows[0].vtep_ip, rows[0].topology, rows[0].vteps, vpcs, frozenset(own),
                    dict(peers))


def host_revision(s: Session, host: str) -> tuple[int, set[str]] | None:
    """The revision of this host's config (the newest stamp among what it depends on), and the VPCs it
    depends on. None if the host is not registered. One round trip."""
    view = host_view(s, host)
    return (view.revision, set(view.vpcs)) if view else None


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
