"""NAT gateways (tenant view): a gateway over the VPC's EIPs, its SNAT and DNAT rules, and the routes to it that
SNAT needs. The instances that carry them compile from `sections.py`."""

from __future__ import annotations

import ipaddress
from collections import defaultdict

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.api import quotas
from controller.api.common import Page, WriteRoute, db_of, owned, paged, scoped, tenant_of
from controller.api.eips import eip_in_use
from controller.api.vpcs import effective_routes
from controller.auth import Principal, require_tenant_api
from controller.errors import conflict, invalid, not_found
from controller.roles.nat.schemas import (
    DnatRuleCreate,
    DnatRuleOut,
    NatGatewayCreate,
    NatGatewayOut,
    SnatRuleCreate,
    SnatRuleOut,
)
from controller.state import models as m

router = APIRouter(tags=["nat"], route_class=WriteRoute)


def _owned_eips(s: Session, ids: list[str], p: Principal, tenant_id: str, field: str) -> list[m.Eip]:
    out = []
    for i, eid in enumerate(dict.fromkeys(ids)):
        eip = owned(s, m.Eip, eid, p, "EIP", f"{field}.{i}")
        if eip.tenant_id != tenant_id:
            raise not_found("EIP", eid, f"{field}.{i}")
        out.append(eip)
    return out


def gw_out(s: Session, gw: m.NatGateway) -> NatGatewayOut:
    ids = list(s.execute(select(m.NatGatewayEip.eip_id).where(m.NatGatewayEip.nat_gateway_id == gw.id)).scalars())
    return NatGatewayOut(id=gw.id, tenant_id=gw.tenant_id, vpc_id=gw.vpc_id, name=gw.name, eip_ids=ids)


@router.post("/nat-gateways", status_code=201, response_model=NatGatewayOut)
def create_natgw(body: NatGatewayCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> NatGatewayOut:
    with db_of(request).write(tenants=tenant_of(p, m.Vpc, body.vpc_id)) as t:
        s = t.session
        vpc = owned(s, m.Vpc, body.vpc_id, p, "VPC", "vpc_id")
        eips = _owned_eips(s, body.eip_ids, p, vpc.tenant_id, "eip_ids")
        for i, eip in enumerate(eips):
            if reason := eip_in_use(s, eip):
                raise conflict(f"eip_ids.{i}", reason)
        if s.execute(select(m.NatGateway.id).where(m.NatGateway.vpc_id == vpc.id,
                                                   m.NatGateway.name == body.name)).first():
            raise conflict("name", f"VPC {vpc.name} already has a NAT gateway named {body.name!r}")
        quotas.check(s, request.app.state.settings.quotas, vpc.tenant_id, "nat_gateways")
        gw = m.NatGateway(tenant_id=vpc.tenant_id, vpc_id=vpc.id, name=body.name)
        s.add(gw)
        s.flush()
        s.add_all([m.NatGatewayEip(nat_gateway_id=gw.id, eip_id=e.id) for e in eips])
        s.flush()
        return gw_out(s, gw)


@router.get("/nat-gateways", response_model=list[NatGatewayOut])
def list_natgw(request: Request, response: Response, page: Page = Depends(),
               p: Principal = Depends(require_tenant_api)) -> list[NatGatewayOut]:
    with db_of(request).read() as s:
        gws = paged(s, scoped(select(m.NatGateway), m.NatGateway, p), m.NatGateway, [m.NatGateway.created_at], page,
                    p, request, response)
        eips: dict[str, list[str]] = {g.id: [] for g in gws}
        if gws:
            for gid, eid in s.execute(select(m.NatGatewayEip.nat_gateway_id, m.NatGatewayEip.eip_id)
                                      .where(m.NatGatewayEip.nat_gateway_id.in_(list(eips)))):
                eips[gid].append(eid)
        return [NatGatewayOut(id=g.id, tenant_id=g.tenant_id, vpc_id=g.vpc_id, name=g.name, eip_ids=eips[g.id])
                for g in gws]


@router.get("/nat-gateways/{gw_id}", response_model=NatGatewayOut)
def get_natgw(gw_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> NatGatewayOut:
    with db_of(request).read() as s:
        return gw_out(s, owned(s, m.NatGateway, gw_id, p, "NAT gateway"))


@router.delete("/nat-gateways/{gw_id}", status_code=204)
def delete_natgw(gw_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.NatGateway, gw_id)) as t:
        s = t.session
        gw = owned(s, m.NatGateway, gw_id, p, "NAT gateway")
        for model in (m.SnatRule, m.DnatRule, m.NatGatewayEip):
            for row in s.execute(select(model).where(model.nat_gateway_id == gw.id)).scalars():
                s.delete(row)
        s.flush()
        s.delete(gw)


@router.post("/nat-gateways/{gw_id}/snat-rules", status_code=201, response_model=SnatRuleOut)
def create_snat(gw_id: str, body: SnatRuleCreate, request: Request,
                p: Principal = Depends(require_tenant_api)) -> SnatRuleOut:
    with db_of(request).write(tenants=tenant_of(p, m.NatGateway, gw_id)) as t:
        s = t.session
        gw = owned(s, m.NatGateway, gw_id, p, "NAT gateway")
        vpc = s.get(m.Vpc, gw.vpc_id)
        if body.subnet_id:
            sn = owned(s, m.Subnet, body.subnet_id, p, "subnet", "subnet_id", tenant=gw.tenant_id)
            if sn.vpc_id != gw.vpc_id:
                raise invalid("subnet_id", "the subnet is not in the NAT gateway's VPC")
            cidr = sn.cidr
        else:
            cidr = body.cidr
            if not ipaddress.IPv4Network(cidr).subnet_of(ipaddress.IPv4Network(vpc.cidr)):
                raise invalid("cidr", f"{cidr} is not inside the VPC CIDR {vpc.cidr}")
        gw_eips = set(s.execute(select(m.NatGatewayEip.eip_id).where(m.NatGatewayEip.nat_gateway_id == gw.id))
                      .scalars())
        for i, eid in enumerate(body.eip_ids):
            if eid not in gw_eips:
                raise invalid(f"eip_ids.{i}", f"EIP {eid} is not one of this NAT gateway's EIPs")
        if s.execute(select(m.SnatRule.id).where(m.SnatRule.nat_gateway_id == gw.id, m.SnatRule.cidr == cidr)).first():
            raise conflict("cidr", f"an SNAT rule for {cidr} exists already")
        rule = m.SnatRule(nat_gateway_id=gw.id, subnet_id=body.subnet_id, cidr=cidr)
        s.add(rule)
        s.flush()
        s.add_all([m.SnatRuleEip(rule_id=rule.id, position=i, eip_id=eid) for i, eid in enumerate(body.eip_ids)])
        s.flush()
        return SnatRuleOut(id=rule.id, nat_gateway_id=gw.id, subnet_id=rule.subnet_id, cidr=cidr,
                           eip_ids=list(body.eip_ids), warnings=_unrouted(s, gw, vpc))


def _unrouted(s: Session, gw: m.NatGateway, vpc: m.Vpc) -> list[str]:
    """Why the VPC's packets for the internet would not reach `gw`: its route table (user and private-line routes,
    as the VPC's hosts get it) has no 0.0.0.0/0 to it."""
    default = next((r for r in effective_routes(s, vpc) if r.destination == "0.0.0.0/0"), None)
    if default is not None and default.target == f"nat-gateway:{gw.id}":
        return []
    now = f"it goes to {default.target}" if default else "there is none"
    return [f"VPC {vpc.name} has no route 0.0.0.0/0 to NAT gateway {gw.name or gw.id} ({now}): packets for the "
            f"internet are dropped before they reach it. Add it: POST /v1/vpcs/{vpc.id}/routes "
            f'{{"destination": "0.0.0.0/0", "target": "nat-gateway:{gw.id}"}} (tianji route create --vpc {vpc.name} '
            f"--destination 0.0.0.0/0 --target nat-gateway:{gw.id})"]


@router.get("/nat-gateways/{gw_id}/snat-rules", response_model=list[SnatRuleOut])
def list_snat(gw_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> list[SnatRuleOut]:
    with db_of(request).read() as s:
        gw = owned(s, m.NatGateway, gw_id, p, "NAT gateway")
        rules = list(s.execute(select(m.SnatRule).where(m.SnatRule.nat_gateway_id == gw.id)).scalars())
        eips: dict[str, list[str]] = defaultdict(list)
        for rid, eid in s.execute(select(m.SnatRuleEip.rule_id, m.SnatRuleEip.eip_id)
                                  .where(m.SnatRuleEip.rule_id.in_([r.id for r in rules]))
                                  .order_by(m.SnatRuleEip.rule_id, m.SnatRuleEip.position)):
            eips[rid].append(eid)
        return [SnatRuleOut(id=r.id, nat_gateway_id=gw.id, subnet_id=r.subnet_id, cidr=r.cidr, eip_ids=eips[r.id])
                for r in rules]


@router.delete("/nat-gateways/{gw_id}/snat-rules/{rule_id}", status_code=204)
def delete_snat(gw_id: str, rule_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.NatGateway, gw_id)) as t:
        gw = owned(t.session, m.NatGateway, gw_id, p, "NAT gateway")
        rule = t.session.get(m.SnatRule, rule_id)
        if rule is None or rule.nat_gateway_id != gw.id:
            raise not_found("SNAT rule", rule_id)
        t.session.delete(rule)


@router.post("/nat-gateways/{gw_id}/dnat-rules", status_code=201, response_model=DnatRuleOut)
def create_dnat(gw_id: str, body: DnatRuleCreate, request: Request,
                p: Principal = Depends(require_tenant_api)) -> m.DnatRule:
    with db_of(request).write(tenants=tenant_of(p, m.NatGateway, gw_id)) as t:
        s = t.session
        gw = owned(s, m.NatGateway, gw_id, p, "NAT gateway")
        eip = owned(s, m.Eip, body.eip_id, p, "EIP", "eip_id", tenant=gw.tenant_id)
        if eip.port_id:
            raise conflict("eip_id", f"EIP {eip.address} is associated 1:1 with a port")
        # a DNAT EIP is this gateway's alone: not a source EIP of any NAT gateway (SNAT would hand out its
        # forwarded ports), and not carrying another gateway's forwards (two gateways would claim its traffic)
        if (owner := s.execute(select(m.NatGatewayEip.nat_gateway_id)
                               .where(m.NatGatewayEip.eip_id == eip.id)).scalar_one_or_none()) is not None:
            which = "this NAT gateway" if owner == gw.id else "another NAT gateway"
            raise conflict("eip_id", f"EIP {eip.address} is a source (SNAT) EIP of {which}: forward on an EIP of "
                                     "its own, which SNAT does not use")
        if s.execute(select(m.DnatRule.id).where(m.DnatRule.eip_id == eip.id,
                                                 m.DnatRule.nat_gateway_id != gw.id)).first():
            raise conflict("eip_id", f"EIP {eip.address} carries another NAT gateway's DNAT rules")
        port = owned(s, m.Port, body.port_id, p, "port", "port_id", tenant=gw.tenant_id)
        if port.vpc_id != gw.vpc_id:
            raise invalid("port_id", "the port is not in the NAT gateway's VPC")
        if s.execute(select(m.DnatRule.id).where(m.DnatRule.eip_id == eip.id, m.DnatRule.protocol == body.protocol,
                                                 m.DnatRule.external_port == body.external_port)).first():
            raise conflict("external_port", f"{eip.address}:{body.external_port}/{body.protocol} is forwarded already")
        rule = m.DnatRule(nat_gateway_id=gw.id, eip_id=eip.id, protocol=body.protocol,
                          external_port=body.external_port, port_id=port.id, internal_port=body.internal_port)
        s.add(rule)
        s.flush()
        return rule


@router.get("/nat-gateways/{gw_id}/dnat-rules", response_model=list[DnatRuleOut])
def list_dnat(gw_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> list[m.DnatRule]:
    with db_of(request).read() as s:
        gw = owned(s, m.NatGateway, gw_id, p, "NAT gateway")
        return list(s.execute(select(m.DnatRule).where(m.DnatRule.nat_gateway_id == gw.id)).scalars())


@router.delete("/nat-gateways/{gw_id}/dnat-rules/{rule_id}", status_code=204)
def delete_dnat(gw_id: str, rule_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.NatGateway, gw_id)) as t:
        gw = owned(t.session, m.NatGateway, gw_id, p, "NAT gateway")
        rule = t.session.get(m.DnatRule, rule_id)
        if rule is None or rule.nat_gateway_id != gw.id:
            raise not_found("DNAT rule", rule_id)
        t.session.delete(rule)
