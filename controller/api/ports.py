"""Ports: an address (IP + MAC) in a subnet, bound to a host where its VM runs."""

from __future__ import annotations

import ipaddress

from fastapi import APIRouter, Depends, Request
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller import models as m
from controller.api.common import db_of, owned, scoped, visible, with_retries
from controller.api.schemas import PortCreate, PortOut, PortUpdate
from controller.auth import Principal, require_tenant_api
from controller.errors import conflict, invalid, not_found
from controller.ipam import IpamError, check_fixed_ip, next_free, random_mac

router = APIRouter(tags=["ports"])


def port_out(p: m.Port) -> PortOut:
    out = PortOut.model_validate(p)
    out.security_group_ids = [g.id for g in p.groups]
    return out


def resolve_groups(s: Session, ids: list[str] | None, vpc_id: str, p: Principal) -> list[m.SecurityGroup]:
    if ids is None:
        return list(s.execute(select(m.SecurityGroup).where(m.SecurityGroup.vpc_id == vpc_id,
                                                            m.SecurityGroup.is_default.is_(True))).scalars())
    groups = []
    for i, gid in enumerate(dict.fromkeys(ids)):
        sg = owned(s, m.SecurityGroup, gid, p, "security group", f"security_group_ids.{i}")
        if sg.vpc_id != vpc_id:
            raise invalid(f"security_group_ids.{i}", f"security group {gid} belongs to another VPC")
        groups.append(sg)
    return groups


def check_host(s: Session, host: str | None) -> None:
    if host is not None and s.get(m.Host, host) is None:
        raise invalid("host", f"unknown host {host!r}: a host appears once its agent has registered "
                              "(GET /v1/hosts lists them)")


@router.post("/ports", status_code=201, response_model=PortOut)
def create_port(body: PortCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> PortOut:
    def txn() -> PortOut:
        with db_of(request).write() as t:
            s = t.session
            # the subnet, locked while allocating in it (a row lock on PostgreSQL; SQLite has one writer anyway)
            sn = s.execute(select(m.Subnet).where(m.Subnet.id == body.subnet_id).with_for_update()).scalar()
            if sn is None or not visible(p, sn.tenant_id):
                raise not_found("subnet", body.subnet_id, "subnet_id")
            net = ipaddress.IPv4Network(sn.cidr)
            if body.ip:
                try:
                    ip = check_fixed_ip(net, body.ip)
                except IpamError as e:
                    raise invalid("ip", str(e)) from None
                if s.execute(select(m.Port.id).where(m.Port.vpc_id == sn.vpc_id, m.Port.ip_int == int(ip))).first():
                    raise conflict("ip", f"{ip} is already in use in subnet {sn.name}")
            else:
                highest = s.execute(select(func.max(m.Port.ip_int)).where(m.Port.subnet_id == sn.id)).scalar()
                try:
                    ip = next_free(net, lambda: s.execute(
                        select(m.Port.ip_int).where(m.Port.subnet_id == sn.id)).scalars(), highest)
                except IpamError as e:
                    raise conflict("subnet_id", str(e)) from None
            if body.mac:
                mac = body.mac
                if s.execute(select(m.Port.id).where(m.Port.mac == mac)).first():
                    raise conflict("mac", f"MAC {mac} is already in use")
            else:
                mac = random_mac()  # 2^46 choices: a collision is caught by the unique constraint and retried
            check_host(s, body.host)
            groups = resolve_groups(s, body.security_group_ids, sn.vpc_id, p)
            port = m.Port(tenant_id=sn.tenant_id, vpc_id=sn.vpc_id, subnet_id=sn.id, name=body.name, ip=str(ip),
                          ip_int=int(ip), mac=mac, host=body.host, status="DOWN")
            port.groups = groups
            s.add(port)
            t.touch_vpcs(sn.vpc_id)
            t.touch_hosts(body.host)
            s.flush()
            return port_out(port)

    return with_retries(txn, "port creation")


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
