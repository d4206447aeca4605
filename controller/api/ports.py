"""Ports: an address (IP + MAC) in a subnet, bound to a host where its VM runs."""

from __future__ import annotations

import ipaddress
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import BigInteger, bindparam, cast, func, insert, null, select, tuple_
from sqlalchemy.orm import Session, selectinload

from controller.api import quotas
from controller.api.common import (
    Page,
    WriteRoute,
    db_of,
    default_group_id,
    owned,
    paged,
    relabel,
    scoped,
    tenant_of,
    visible,
    with_retries,
)
from controller.api.ipam import IpamError, check_fixed_ip, next_free, random_mac
from controller.api.port_ipv6 import ipv6_addresses
from controller.api.schemas import PortBulkCreate, PortCreate, PortOut, PortUpdate
from controller.auth import Principal, may_bind, require_port_api
from controller.errors import ApiError, conflict, invalid, not_found
from controller.state import models as m
from controller.state.db import TenantsOf, WriteTxn
from controller.state.sqlset import fetch_all, in_ids

router = APIRouter(tags=["ports"], route_class=WriteRoute)


def port_out(p: m.Port) -> PortOut:
    out = PortOut.model_validate(p)
    out.security_group_ids = [g.id for g in p.groups]
    return out


def resolve_groups(s: Session, ids: list[str], vpc_id: str, p: Principal,
                   field: str = "") -> list[m.SecurityGroup]:
    groups = []
    for i, gid in enumerate(dict.fromkeys(ids)):
        sg = owned(s, m.SecurityGroup, gid, p, "security group", f"{field}security_group_ids.{i}")
        if sg.vpc_id != vpc_id:
            raise invalid(f"{field}security_group_ids.{i}", f"security group {gid} belongs to another VPC")
        groups.append(sg)
    return groups


def check_host(s: Session, host: str | None, field: str = "host") -> None:
    hosts = m.Host.__table__  # a plain existence query: no ORM object is loaded
    if host is not None and s.execute(select(hosts.c.name).where(hosts.c.name == host)).first() is None:
        raise unknown_host(field, host)


def unknown_host(field: str, host: str) -> ApiError:
    return invalid(field, f"unknown host {host!r}: a host appears once its agent has registered "
                          "(GET /v1/hosts lists them)")


# A VPC's default security group never changes: remembered per process (saves a query per port create).
_DEFAULT_GROUP: dict[str, str] = {}


def _default_groups(s: Session, vpc_id: str) -> list[str]:
    gid = _DEFAULT_GROUP.get(vpc_id)
    if gid is None:
        gid = default_group_id(s, vpc_id)
        if gid is None:
            return []
        _DEFAULT_GROUP[vpc_id] = gid
    return [gid]


# The create path's statements, built once (see compiler.py: SQLAlchemy finds their compiled form by a memoised
# cache key instead of building and hashing a statement per request).
_PORTS, _SUBNETS, _HOSTS, _PSG = m.Port.__table__, m.Subnet.__table__, m.Host.__table__, m.PortSecurityGroup.__table__
# step 1 of the lock order (controller/state/db.py) for a port create: the tenants of the subnets named
_TENANTS = m.Tenant.__table__
Q_LOCK_TENANTS_OF_SUBNETS = select(_TENANTS.c.id).where(_TENANTS.c.id.in_(
    select(_SUBNETS.c.tenant_id).where(in_ids(_SUBNETS.c.id, "subnets")))) \
    .order_by(_TENANTS.c.id).with_for_update(key_share=True)
Q_LOCK_SUBNETS = select(_SUBNETS.c.id, _SUBNETS.c.vpc_id, _SUBNETS.c.tenant_id, _SUBNETS.c.cidr, _SUBNETS.c.name,
                        _SUBNETS.c.ipv6_cidr, _SUBNETS.c.ipv6_address_mode) \
    .where(in_ids(_SUBNETS.c.id, "subnets")).order_by(_SUBNETS.c.id).with_for_update()
Q_HIGHEST = select(_PORTS.c.subnet_id, func.max(_PORTS.c.ip_int)) \
    .where(in_ids(_PORTS.c.subnet_id, "subnets")).group_by(_PORTS.c.subnet_id)
# with the named hosts that exist, in the same round trip (their second column is NULL)
Q_HIGHEST_AND_HOSTS = Q_HIGHEST.union_all(select(_HOSTS.c.name, cast(null(), BigInteger))
                                          .where(in_ids(_HOSTS.c.name, "hosts")))
Q_SUBNET_ADDRESSES = select(_PORTS.c.ip_int).where(_PORTS.c.subnet_id == bindparam("subnet"))
# every column bound by name: these run through the driver directly at the commit (WriteTxn.defer)
INSERT_PORTS = insert(_PORTS).values({c.key: bindparam(c.key, type_=c.type) for c in _PORTS.c})  # typed: JSON tags
INSERT_MEMBERSHIPS = insert(_PSG).values({c.key: bindparam(c.key) for c in _PSG.c})


def port_locks(items: list[PortCreate]) -> TenantsOf:
    """What a port create locks before its body, in one round trip: the subnets' tenants (the lock order's
    first step), then the subnets themselves, their allocation state and the named hosts (`_lock_subnets`)."""
    sids = sorted({x.subnet_id for x in items})
    named = sorted({x.host for x in items if x.host is not None})
    return TenantsOf(Q_LOCK_TENANTS_OF_SUBNETS, {"subnets": sids}, (
        (Q_LOCK_SUBNETS, {"subnets": sids}),
        (Q_HIGHEST_AND_HOSTS, {"subnets": sids, "hosts": named}) if named else (Q_HIGHEST, {"subnets": sids})))


def insert_ports(t: WriteTxn, items: list[PortCreate], p: Principal, bulk: bool,
                 quota: dict[str, int]) -> list[PortOut]:
    """Create ports inside the caller's transaction, set-based: a handful of statements whatever the number of
    ports (lock the subnets, read their allocation state, insert the ports, insert their group memberships), so
    a bulk create costs little more per port than building its row. Core statements, not the ORM's unit of
    work: this is the hot write path. Errors name the offending item (`ports.N.field` in a bulk create)."""
    s = t.session

    def field(i: int, name: str = "") -> str:  # without a name: the item's prefix
        return f"ports.{i}.{name}" if bulk else name

    for i, x in enumerate(items):
        if x.host is not None:
            may_bind(p, field(i, "host"))
    sn, highest, known_hosts = _lock_subnets(t, items, p, field)
    for tenant, n in Counter(sn[x.subnet_id].tenant_id for x in items).items():
        quotas.check(s, quota, tenant, "ports", n)
    nets = {sid: ipaddress.IPv4Network(r.cidr) for sid, r in sn.items()}
    fixed_ips = _fixed_ips(s, items, sn, nets, field)
    _check_macs(s, items, sn, field)
    for i, x in enumerate(items):
        if x.host is not None and x.host not in known_hosts:
            raise unknown_host(field(i, "host"), x.host)
    groups = [_groups(s, x, sn[x.subnet_id].vpc_id, p, field(i)) for i, x in enumerate(items)]
    ips = _allocate(s, items, sn, nets, highest, fixed_ips, field)
    macs = [x.mac or random_mac() for x in items]  # 2^46 choices: a collision is caught by the unique constraint
    ipv6s = ipv6_addresses(s, items, sn, macs, field)
    rows, memberships, out = [], [], []
    created = m.now()
    for i, x in enumerate(items):
        r, ip, mac = sn[x.subnet_id], ips[i], macs[i]
        addr = str(ipaddress.IPv4Address(ip))
        pid = m.new_id()
        rows.append({"id": pid, "tenant_id": r.tenant_id, "vpc_id": r.vpc_id, "subnet_id": r.id, "name": x.name,
                     "ip": addr, "ip_int": ip, "ipv6": ipv6s[i], "mac": mac, "host": x.host, "migrating_to": None,
                     "status": "DOWN",
                     "status_changed_at": None,
                     "created_at": created, "description": x.description, "tags": x.tags})
        memberships += [{"port_id": pid, "group_id": g} for g in groups[i]]
        out.append(PortOut(id=pid, tenant_id=r.tenant_id, vpc_id=r.vpc_id, subnet_id=r.id, name=x.name, ip=addr,
                           ipv6=ipv6s[i], mac=mac, host=x.host, status="DOWN", security_group_ids=sorted(groups[i]),
                           description=x.description, tags=x.tags))
    t.defer(INSERT_PORTS, rows)
    if memberships:
        t.defer(INSERT_MEMBERSHIPS, memberships)
    return out


def _lock_subnets(t: WriteTxn, items: list[PortCreate], p: Principal,
                  field: Callable[..., str]) -> tuple[dict[str, Any], dict[str, int], set[str]]:
    """The subnets, locked in one order (concurrent creates in a subnet queue here; batches cannot deadlock), then
    their allocation state and the named hosts, read after the locks (so it sees every allocation committed
    before ours): sent together, one round trip on PostgreSQL, with the tenants' locks when the write was opened
    with `port_locks` (else here). (subnets, highest address per subnet, hosts)"""
    locked, state = t.first or fetch_all(t.session, list(port_locks(items).then))
    sn = {r.id: r for r in locked}
    for i, x in enumerate(items):
        r = sn.get(x.subnet_id)
        if r is None or not visible(p, r.tenant_id):
            raise not_found("subnet", x.subnet_id, field(i, "subnet_id"))
    highest = {key: value for key, value in state if value is not None}
    known_hosts = {key for key, value in state if value is None}
    return sn, highest, known_hosts


def _fixed_ips(s: Session, items: list[PortCreate], sn: dict[str, Any], nets: dict[str, ipaddress.IPv4Network],
               field: Callable[..., str]) -> dict[int, int]:
    """The fixed addresses asked for (item -> address): valid in their subnet, not repeated, not in use."""
    fixed: dict[tuple[str, int], int] = {}  # (VPC, address) -> item
    for i, x in enumerate(items):
        if x.ip:
            try:
                ip = int(check_fixed_ip(nets[x.subnet_id], x.ip))
            except IpamError as e:
                raise invalid(field(i, "ip"), str(e)) from None
            key = (sn[x.subnet_id].vpc_id, ip)
            if key in fixed:
                raise conflict(field(i, "ip"), f"{x.ip} is requested twice (ports.{fixed[key]}.ip)")
            fixed[key] = i
    if fixed:
        used = set(s.execute(select(_PORTS.c.vpc_id, _PORTS.c.ip_int).where(
            tuple_(_PORTS.c.vpc_id, _PORTS.c.ip_int).in_(list(fixed)))).all())
        for key, i in sorted(fixed.items(), key=lambda kv: kv[1]):
            if key in used:
                raise conflict(field(i, "ip"), f"{items[i].ip} is already in use in subnet "
                                               f"{sn[items[i].subnet_id].name}")
    return {i: ip for (_vpc, ip), i in fixed.items()}


def _check_macs(s: Session, items: list[PortCreate], sn: dict[str, Any], field: Callable[..., str]) -> None:
    """A MAC is unique in its VPC (its L2 domain), so another tenant's MACs are neither visible nor in the way."""
    macs = {(sn[x.subnet_id].vpc_id, x.mac): i for i, x in reversed(list(enumerate(items))) if x.mac}
    if not macs:
        return
    for i, x in enumerate(items):
        if x.mac and (j := macs[(sn[x.subnet_id].vpc_id, x.mac)]) != i:
            raise conflict(field(i, "mac"), f"MAC {x.mac} is requested twice (ports.{j}.mac)")
    taken = set(s.execute(select(_PORTS.c.vpc_id, _PORTS.c.mac)
                          .where(tuple_(_PORTS.c.vpc_id, _PORTS.c.mac).in_(list(macs)))).all())
    for key in sorted(taken, key=macs.__getitem__):
        raise conflict(field(macs[key], "mac"), f"MAC {key[1]} is already in use in this VPC")


def _allocate(s: Session, items: list[PortCreate], sn: dict[str, Any], nets: dict[str, ipaddress.IPv4Network],
              highest: dict[str, int], fixed_ips: dict[int, int], field: Callable[..., str]) -> list[int]:
    """Every item's address: its fixed one, else above its subnet's highest address while there is room, else
    the lowest gaps (the subnet's addresses in use are read once, if it comes to that)."""
    batch_ips: dict[str, set[int]] = defaultdict(set)  # what this create takes in each subnet
    for i, ip in fixed_ips.items():
        batch_ips[items[i].subnet_id].add(ip)
    tops = {sid: max([highest.get(sid) or 0, *batch_ips[sid]]) or None for sid in sn}
    scanned: dict[str, set[int]] = {}

    def in_use(sid: str) -> set[int]:
        if sid not in scanned:
            scanned[sid] = {*s.execute(Q_SUBNET_ADDRESSES, {"subnet": sid}).scalars(), *batch_ips[sid]}
        return scanned[sid]

    out = []
    for i, x in enumerate(items):
        sid = x.subnet_id
        if i in fixed_ips:
            out.append(fixed_ips[i])
            continue
        try:
            ip = int(next_free(nets[sid], lambda sid=sid: in_use(sid), tops[sid]))
        except IpamError as e:
            raise conflict(field(i, "subnet_id"), str(e)) from None
        batch_ips[sid].add(ip)
        scanned.get(sid, set()).add(ip)
        tops[sid] = max(tops[sid] or 0, ip)
        out.append(ip)
    return out


def _groups(s: Session, x: PortCreate, vpc_id: str, p: Principal, prefix: str) -> list[str]:
    if x.security_group_ids is None:
        return _default_groups(s, vpc_id)
    return [g.id for g in resolve_groups(s, x.security_group_ids, vpc_id, p, prefix)]


@router.post("/ports", status_code=201, response_model=PortOut)
def create_port(body: PortCreate, request: Request, p: Principal = Depends(require_port_api)) -> Response:
    def txn() -> PortOut:
        with db_of(request).write(tenants=port_locks([body]), concurrent=True) as t:
            return insert_ports(t, [body], p, bulk=False, quota=request.app.state.settings.quotas)[0]

    out = with_retries(txn, "port creation")
    return Response(out.model_dump_json(), status_code=201, media_type="application/json")


@router.post("/ports/bulk", status_code=201, response_model=list[PortOut])
def create_ports(body: PortBulkCreate, request: Request, p: Principal = Depends(require_port_api)) -> Response:
    """Several ports in one transaction (like Neutron's bulk create): all are created, or none (the error names
    the offending item, `ports.N.field`). One revision for the whole batch."""
    def txn() -> list[PortOut]:
        with db_of(request).write(tenants=port_locks(body.ports), concurrent=True) as t:
            return insert_ports(t, body.ports, p, bulk=True, quota=request.app.state.settings.quotas)

    out = with_retries(txn, "bulk port creation")
    return Response(b"[" + b",".join(o.model_dump_json().encode() for o in out) + b"]", status_code=201,
                    media_type="application/json")


@router.get("/ports", response_model=list[PortOut])
def list_ports(request: Request, response: Response, vpc_id: str | None = None, subnet_id: str | None = None,
               host: str | None = None, page: Page = Depends(),
               p: Principal = Depends(require_port_api)) -> list[PortOut]:
    with db_of(request).read() as s:
        stmt = scoped(select(m.Port), m.Port, p).options(selectinload(m.Port.groups))  # groups: one more query
        if vpc_id:
            stmt = stmt.where(m.Port.vpc_id == vpc_id)
        if subnet_id:
            stmt = stmt.where(m.Port.subnet_id == subnet_id)
        if host:
            stmt = stmt.where(m.Port.host == host)
        return [port_out(x) for x in paged(s, stmt, m.Port, [m.Port.vpc_id, m.Port.ip_int], page, p, request,
                                           response)]


@router.get("/ports/{port_id}", response_model=PortOut)
def get_port(port_id: str, request: Request, p: Principal = Depends(require_port_api)) -> PortOut:
    with db_of(request).read() as s:
        return port_out(owned(s, m.Port, port_id, p, "port"))


@router.patch("/ports/{port_id}", response_model=PortOut)
def update_port(port_id: str, body: PortUpdate, request: Request,
                p: Principal = Depends(require_port_api)) -> PortOut:
    with db_of(request).write(tenants=tenant_of(p, m.Port, port_id)) as t:
        s = t.session
        port = owned(s, m.Port, port_id, p, "port")
        fields = body.model_fields_set
        if p.kind == "orchestrator" and fields - {"host", "migrating_to"}:
            raise ApiError(403, "an orchestrator token may change a port's `host` and `migrating_to` only",
                           sorted(fields - {"host", "migrating_to"})[0])
        if "name" in fields and body.name:
            port.name = body.name
        relabel(port, body)
        if "migrating_to" in fields and body.migrating_to != port.migrating_to:
            migrate(s, p, port, body.migrating_to)
        if "host" in fields and body.host != port.host:
            may_bind(p, "host")
            check_host(s, body.host)
            # the migration's end: bound where the guest now runs, its flows already there (no DOWN meanwhile)
            arrived = body.host is not None and body.host == port.migrating_to and "migrating_to" not in fields
            port.host = body.host
            port.migrating_to = None
            if not arrived:
                port.status = "DOWN"  # until the new host reports the VM plugged
        if "security_group_ids" in fields:
            port.groups = resolve_groups(s, body.security_group_ids or [], port.vpc_id, p)
        s.flush()
        return port_out(port)


def migrate(s: Session, p: Principal, port: m.Port, to: str | None) -> None:
    """A live migration's start (`to`: the destination, bound too: its switch gets the port's flows and every
    other switch sends the port's traffic to both hosts, so the guest's packets flow the moment it runs there) or
    its abandonment (None). The orchestrator ends it by setting `host` to the destination."""
    may_bind(p, "migrating_to")
    if to is not None:
        if port.host is None:
            raise ApiError(409, f"port {port.id} is not bound to a host: a migration starts from one", "migrating_to")
        if to == port.host:
            raise ApiError(422, f"migrating_to: the port is bound to {to} already", "migrating_to")
        check_host(s, to, "migrating_to")
    port.migrating_to = to


@router.delete("/ports/{port_id}", status_code=204)
def delete_port(port_id: str, request: Request, p: Principal = Depends(require_port_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.Port, port_id)) as t:
        port = owned(t.session, m.Port, port_id, p, "port")
        if (lb := t.session.execute(select(m.LoadBalancer.id).where(m.LoadBalancer.vip_port_id == port_id))
                .scalar()) is not None:
            raise conflict(None, f"port {port_id} holds the VIP of load balancer {lb}; delete the load balancer")
        if (ep := t.session.execute(select(m.ServiceEndpoint.id).where(
                (m.ServiceEndpoint.port_id == port_id) | (m.ServiceEndpoint.provider_port_id == port_id)))
                .scalar()) is not None:
            raise conflict(None, f"port {port_id} holds service endpoint {ep} (or its side in a published load "
                                 "balancer's VPC); delete the endpoint")
        pools = t.session.execute(select(m.LbMember.pool_id).where(m.LbMember.port_id == port_id)).scalars().all()
        if pools:
            raise conflict(None, f"port {port_id} is a member of pool(s) {', '.join(sorted(set(pools)))}; "
                                 f"remove it first")
        rules = t.session.execute(select(m.DnatRule.id).where(m.DnatRule.port_id == port_id)).scalars().all()
        if rules:
            raise conflict(None, f"port {port_id} is the target of DNAT rule(s) {', '.join(rules)}; delete them first")
        for eip in t.session.execute(select(m.Eip).where(m.Eip.port_id == port_id)).scalars():
            eip.port_id = None  # the EIP stays the tenant's, unassociated
        t.session.delete(port)
