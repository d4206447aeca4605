"""Subnets: inside the VPC CIDR, never overlapping each other; the first usable address is the gateway. A subnet
of a dual-stack VPC may take a /64 of its /56 too (its ::1 the router)."""

from __future__ import annotations

import ipaddress

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.api import quotas
from controller.api.common import Page, WriteRoute, db_of, owned, paged, relabel, rename, scoped, tenant_of
from controller.api.ipam import gateway_ip, overlaps, usable_range
from controller.api.ipam6 import Ipam6Error, gateway6, next_subnet_cidr6
from controller.api.schemas import Rename, SubnetCreate, SubnetOut
from controller.auth import Principal, require_network_read, require_tenant_api
from controller.errors import conflict, invalid
from controller.state import models as m

router = APIRouter(tags=["subnets"], route_class=WriteRoute)


def subnet_out(s: Session, sn: m.Subnet, used: int | None = None) -> SubnetOut:
    out = SubnetOut.model_validate(sn)
    lo, hi = usable_range(ipaddress.IPv4Network(sn.cidr))
    if used is None:
        used = s.execute(select(func.count()).select_from(m.Port).where(m.Port.subnet_id == sn.id)).scalar()
    out.available_ips = max(hi - lo + 1, 0) - used
    return out


def subnet_cidr6(vpc: m.Vpc, asked: str | None, others: list[m.Subnet]) -> ipaddress.IPv6Network | None:
    """The subnet's /64: none, the lowest free one of the VPC's /56 ("auto"), or the one asked for."""
    if asked is None:
        return None
    if vpc.ipv6_cidr is None:
        raise invalid("ipv6_cidr", f"VPC {vpc.name} has no IPv6 CIDR: create it with ipv6_cidr to make it dual-stack")
    outer, used = ipaddress.IPv6Network(vpc.ipv6_cidr), [o.ipv6_cidr for o in others if o.ipv6_cidr]
    if asked == "auto":
        try:
            return next_subnet_cidr6(outer, used)
        except Ipam6Error as e:
            raise conflict("ipv6_cidr", str(e)) from None
    net = ipaddress.IPv6Network(asked)
    if not net.subnet_of(outer):
        raise invalid("ipv6_cidr", f"{net} is not inside the VPC's IPv6 CIDR {outer}")
    if other := next((o for o in others if o.ipv6_cidr == asked), None):
        raise conflict("ipv6_cidr", f"{net} is subnet {other.name}'s already")
    return net


@router.post("/subnets", status_code=201, response_model=SubnetOut)
def create_subnet(body: SubnetCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> SubnetOut:
    with db_of(request).write(tenants=tenant_of(p, m.Vpc, body.vpc_id)) as t:
        s = t.session
        vpc = owned(s, m.Vpc, body.vpc_id, p, "VPC", "vpc_id")
        net = ipaddress.IPv4Network(body.cidr)
        if net.prefixlen > 28:
            raise invalid("cidr", f"prefix /{net.prefixlen} is too small for a subnet: use /28 or larger")
        if not net.subnet_of(ipaddress.IPv4Network(vpc.cidr)):
            raise invalid("cidr", f"{net} is not inside the VPC CIDR {vpc.cidr}")
        others = list(s.execute(select(m.Subnet).where(m.Subnet.vpc_id == vpc.id)).scalars())
        cidr6 = subnet_cidr6(vpc, body.ipv6_cidr, others)
        for other in others:
            if overlaps(other.cidr, body.cidr):
                raise conflict("cidr", f"{net} overlaps subnet {other.name} ({other.cidr})")
            if other.name == body.name:
                raise conflict("name", f"VPC {vpc.name} already has a subnet named {body.name!r}")
        quotas.check(s, request.app.state.settings.quotas, vpc.tenant_id, "subnets")
        sn = m.Subnet(vpc_id=vpc.id, tenant_id=vpc.tenant_id, name=body.name, cidr=str(net),
                      gateway_ip=str(gateway_ip(net)), description=body.description, tags=body.tags)
        if cidr6:
            sn.ipv6_cidr, sn.ipv6_address_mode = str(cidr6), body.ipv6_address_mode
            sn.ipv6_gateway_ip = str(gateway6(cidr6))
        s.add(sn)
        s.flush()
        return subnet_out(s, sn)


@router.get("/subnets", response_model=list[SubnetOut])
def list_subnets(request: Request, response: Response, vpc_id: str | None = None, page: Page = Depends(),
                 p: Principal = Depends(require_tenant_api)) -> list[SubnetOut]:
    with db_of(request).read() as s:
        stmt = scoped(select(m.Subnet), m.Subnet, p)
        if vpc_id:
            stmt = stmt.where(m.Subnet.vpc_id == vpc_id)
        rows = paged(s, stmt, m.Subnet, [m.Subnet.vpc_id, m.Subnet.cidr], page, p, request, response)
        used = dict(s.execute(select(m.Port.subnet_id, func.count()).where(m.Port.subnet_id.in_([r.id for r in rows]))
                              .group_by(m.Port.subnet_id)).all()) if rows else {}
        return [subnet_out(s, sn, used.get(sn.id, 0)) for sn in rows]


@router.patch("/subnets/{subnet_id}", response_model=SubnetOut)
def update_subnet(subnet_id: str, body: Rename, request: Request,
                  p: Principal = Depends(require_tenant_api)) -> SubnetOut:
    """A new name, description or tags (the fields given)."""
    with db_of(request).write(tenants=tenant_of(p, m.Subnet, subnet_id)) as t:
        s = t.session
        sn = owned(s, m.Subnet, subnet_id, p, "subnet")
        rename(s, sn, body.name, m.Subnet.vpc_id, "the VPC already has a subnet")
        relabel(sn, body)
        s.flush()
        return subnet_out(s, sn)


@router.get("/subnets/{subnet_id}", response_model=SubnetOut)
def get_subnet(subnet_id: str, request: Request, p: Principal = Depends(require_network_read)) -> SubnetOut:
    with db_of(request).read() as s:
        return subnet_out(s, owned(s, m.Subnet, subnet_id, p, "subnet"))


@router.delete("/subnets/{subnet_id}", status_code=204)
def delete_subnet(subnet_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.Subnet, subnet_id)) as t:
        s = t.session
        sn = owned(s, m.Subnet, subnet_id, p, "subnet")
        n = s.execute(select(func.count()).select_from(m.Port).where(m.Port.subnet_id == subnet_id)).scalar()
        if n:
            raise conflict(None, f"subnet {sn.name} still has {n} port(s); delete them first")
        if rules := s.execute(select(m.SnatRule.nat_gateway_id, m.SnatRule.id)
                              .where(m.SnatRule.subnet_id == subnet_id)).all():
            raise conflict(None, f"subnet {sn.name} is named by SNAT rule(s) "
                                 f"{', '.join(f'{r.id} of NAT gateway {r.nat_gateway_id}' for r in rules)}; "
                                 "delete them first")
        s.delete(sn)
