"""Ports: an address (IP + MAC) in a subnet, bound to a host where its VM runs."""

from __future__ import annotations

import ipaddress

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from controller import models as m
from controller.api.common import db_of, default_group_id, owned, scoped, visible, with_retries
from controller.api.schemas import PortBulkCreate, PortCreate, PortOut, PortUpdate
from controller.auth import Principal, require_tenant_api
from controller.db import WriteTxn
from controller.errors import conflict, invalid, not_found
from controller.ipam import IpamError, check_fixed_ip, next_free, random_mac

router = APIRouter(tags=["ports"])


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
    hosts = m.Host.__table__  # a plain existence query: no ORM object is loaded on the port-create path
    if host is not None and s.execute(select(hosts.c.name).where(hosts.c.name == host)).first() is None:
        raise invalid(field, f"unknown host {host!r}: a host appears once its agent has registered "
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


def _create_one(t: WriteTxn, body: PortCreate, p: Principal, field: str = "") -> PortOut:
    """One port inside the caller's transaction. Core statements, not the ORM's unit of work: this is the hot
    write path (allocation + two inserts), and the ORM's flush costs more than the SQL."""
    s = t.session
    sn = s.execute(select(m.Subnet.id, m.Subnet.vpc_id, m.Subnet.tenant_id, m.Subnet.cidr, m.Subnet.name)
                   .where(m.Subnet.id == body.subnet_id).with_for_update()).one_or_none()
    if sn is None or not visible(p, sn.tenant_id):  # the subnet row stays locked while allocating in it
        raise not_found("subnet", body.subnet_id, f"{field}subnet_id")
    net = ipaddress.IPv4Network(sn.cidr)
    ports = m.Port.__table__
    if body.ip:
        try:
            ip = check_fixed_ip(net, body.ip)
        except IpamError as e:
            raise invalid(f"{field}ip", str(e)) from None
        if s.execute(select(ports.c.id).where(ports.c.vpc_id == sn.vpc_id, ports.c.ip_int == int(ip))).first():
            raise conflict(f"{field}ip", f"{ip} is already in use in subnet {sn.name}")
    else:
        highest = s.execute(select(func.max(ports.c.ip_int)).where(ports.c.subnet_id == sn.id)).scalar()
        try:
            ip = next_free(net, lambda: s.execute(select(ports.c.ip_int).where(ports.c.subnet_id == sn.id)).scalars(),
                           highest)
        except IpamError as e:
            raise conflict(f"{field}subnet_id", str(e)) from None
    if body.mac:
        mac = body.mac
        if s.execute(select(ports.c.id).where(ports.c.mac == mac)).first():
            raise conflict(f"{field}mac", f"MAC {mac} is already in use")
    else:
        mac = random_mac()  # 2^46 choices: a collision is caught by the unique constraint and retried
    check_host(s, body.host, f"{field}host")
    if body.security_group_ids is None:
        groups = _default_groups(s, sn.vpc_id)
    else:
        groups = [g.id for g in resolve_groups(s, body.security_group_ids, sn.vpc_id, p, field)]
    pid = m.new_id()
    s.execute(insert(ports).values(id=pid, tenant_id=sn.tenant_id, vpc_id=sn.vpc_id, subnet_id=sn.id, name=body.name,
                                   ip=str(ip), ip_int=int(ip), mac=mac, host=body.host, status="DOWN",
                                   created_at=m.now()))
    if groups:
        s.execute(insert(m.PortSecurityGroup.__table__), [{"port_id": pid, "group_id": g} for g in groups])
    t.touch_vpcs(sn.vpc_id)
    t.touch_hosts(body.host)
    return PortOut(id=pid, tenant_id=sn.tenant_id, vpc_id=sn.vpc_id, subnet_id=sn.id, name=body.name, ip=str(ip),
                   mac=mac, host=body.host, status="DOWN", security_group_ids=sorted(groups))


@router.post("/ports", status_code=201, response_model=PortOut)
def create_port(body: PortCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> Response:
    def txn() -> PortOut:
        with db_of(request).write(concurrent=True) as t:
            return _create_one(t, body, p)

    out = with_retries(txn, "port creation")
    return Response(out.model_dump_json(), status_code=201, media_type="application/json")


@router.post("/ports/bulk", status_code=201, response_model=list[PortOut])
def create_ports(body: PortBulkCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> Response:
    """Several ports in one transaction (like Neutron's bulk create): all are created, or none (the error names
    the offending item, `ports.N.field`). One revision for the whole batch."""
    def txn() -> list[PortOut]:
        with db_of(request).write(concurrent=True) as t:
            # lock every subnet of the batch up front, in one order, so concurrent batches cannot deadlock
            t.session.execute(select(m.Subnet.id).where(m.Subnet.id.in_({x.subnet_id for x in body.ports}))
                              .order_by(m.Subnet.id).with_for_update()).all()
            return [_create_one(t, item, p, f"ports.{i}.") for i, item in enumerate(body.ports)]

    out = with_retries(txn, "bulk port creation")
    return Response(b"[" + b",".join(o.model_dump_json().encode() for o in out) + b"]", status_code=201,
                    media_type="application/json")


@router.get("/ports", response_model=list[PortOut])
def list_ports(request: Request, vpc_id: str | None = None, subnet_id: str | None = None, host: str | None = None,
               p: Principal = Depends(require_tenant_api)) -> list[PortOut]:
    with db_of(request).read() as s:
        stmt = scoped(select(m.Port), m.Port, p).order_by(m.Port.vpc_id, m.Port.ip_int)
        if vpc_id:
            stmt = stmt.where(m.Port.vpc_id == vpc_id)
        if subnet_id:
            stmt = stmt.where(m.Port.subnet_id == subnet_id)
        if host:
            stmt = stmt.where(m.Port.host == host)
        return [port_out(x) for x in s.execute(stmt).scalars()]


@router.get("/ports/{port_id}", response_model=PortOut)
def get_port(port_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> PortOut:
    with db_of(request).read() as s:
        return port_out(owned(s, m.Port, port_id, p, "port"))


@router.patch("/ports/{port_id}", response_model=PortOut)
def update_port(port_id: str, body: PortUpdate, request: Request,
                p: Principal = Depends(require_tenant_api)) -> PortOut:
    with db_of(request).write() as t:
        s = t.session
        port = owned(s, m.Port, port_id, p, "port")
        fields = body.model_fields_set
        if "name" in fields and body.name:
            port.name = body.name
        if "host" in fields and body.host != port.host:
            check_host(s, body.host)
            t.touch_hosts(port.host, body.host)
            port.host = body.host
            port.status = "DOWN"  # until the new host reports the VM plugged
        if "security_group_ids" in fields:
            port.groups = resolve_groups(s, body.security_group_ids or [], port.vpc_id, p)
            t.touch_hosts(port.host)  # its host compiles the port's groups (see compiler.host_local)
        t.touch_vpcs(port.vpc_id)
        s.flush()
        return port_out(port)


@router.delete("/ports/{port_id}", status_code=204)
def delete_port(port_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write() as t:
        port = owned(t.session, m.Port, port_id, p, "port")
        rules = t.session.execute(select(m.DnatRule.id).where(m.DnatRule.port_id == port_id)).scalars().all()
        if rules:
            raise conflict(None, f"port {port_id} is the target of DNAT rule(s) {', '.join(rules)}; delete them first")
        for eip in t.session.execute(select(m.Eip).where(m.Eip.port_id == port_id)).scalars():
            eip.port_id = None  # the EIP stays the tenant's, unassociated
        t.touch_vpcs(port.vpc_id)
        t.touch_hosts(port.host)
        t.session.delete(port)
