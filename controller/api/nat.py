"""Elastic IPs and NAT gateways (tenant view). The gateway instances that carry them come with the gateway
runtime; here: allocation, association, rules, and routes to a NAT gateway."""

from __future__ import annotations

import ipaddress
import socket
from collections import defaultdict
from datetime import timedelta

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.api import quotas
from controller.api.common import Page, WriteRoute, db_of, owned, paged, scoped, tenant_of, with_retries
from controller.api.nat_schemas import (
    DnatRuleCreate,
    DnatRuleOut,
    EipAssociate,
    EipCreate,
    EipOut,
    NatGatewayCreate,
    NatGatewayOut,
    SnatRuleCreate,
    SnatRuleOut,
)
from controller.api.vpcs import effective_routes
from controller.auth import Principal, require_tenant_api
from controller.errors import ApiError, conflict, invalid, not_found
from controller.southbound.placement import home
from controller.state import models as m
from controller.state.models import now
from tianji.southbound import DEFAULT_GATEWAY_ROLE

router = APIRouter(tags=["nat"], route_class=WriteRoute)


# --- EIPs -----------------------------------------------------------------------------------------------------
def _allocate(s: Session, quarantine_s: float) -> tuple[m.EipPool, str]:
    """The lowest free address of the oldest pool that has one; an address released less than `quarantine_s` ago
    only when no other is free, the least recently released first (settings.eip_quarantine_s says why). Compared
    as integers: building an address object per candidate made an allocation cost milliseconds with 2,000 EIPs."""
    used = {int.from_bytes(socket.inet_aton(a), "big") for a in s.execute(select(m.Eip.address)).scalars()}
    since = now() - timedelta(seconds=quarantine_s)
    resting = {int.from_bytes(socket.inet_aton(a), "big"): at for a, at in
               s.execute(select(m.FreedEip.address, m.FreedEip.freed_at).where(m.FreedEip.freed_at > since))}
    fallback: tuple[m.EipPool, int] | None = None
    for pool in s.execute(select(m.EipPool).order_by(m.EipPool.created_at)).scalars():
        net = ipaddress.IPv4Network(pool.cidr)
        first, last = int(net.network_address), int(net.broadcast_address)
        hosts = range(first, last + 1) if net.prefixlen >= 31 else range(first + 1, last)
        for host in hosts:
            if host in used:
                continue
            if host not in resting:
                return pool, str(ipaddress.IPv4Address(host))
            if fallback is None or resting[host] < resting[fallback[1]]:
                fallback = pool, host
    if fallback is not None:
        return fallback[0], str(ipaddress.IPv4Address(fallback[1]))
    raise ApiError(409, "no public addresses left: the operator must add an EIP pool (POST /v1/eip-pools)")


def live_gateways(s: Session, role: str = "nat") -> list[str]:
    """The live gateway instances of a role (a gateway registered without one is a NAT instance)."""
    q = select(m.Host.name).where(m.Host.kind == "gateway", m.Host.status == "up",
                                  func.coalesce(m.Host.role, DEFAULT_GATEWAY_ROLE) == role)
    return list(s.execute(q).scalars())


def eip_outs(s: Session, eips: list[m.Eip]) -> list[EipOut]:
    """`home`: the gateway instance that answers ARP for each address (rendezvous hashing over the live ones of the
    role it serves: a load balancer's EIP is homed on an LB instance, any other on a NAT instance, as the gateways'
    compiles decide it); null while no instance is up. One query for which front a load balancer, one per role."""
    ids = [e.id for e in eips]
    fronts_lb = set(s.execute(select(m.LoadBalancer.eip_id).where(m.LoadBalancer.eip_id.in_(ids))).scalars()) \
        if ids else set()
    live = {role: live_gateways(s, role) for role in {"lb" if e.id in fronts_lb else "nat" for e in eips}}
    out = []
    for e in eips:
        x = EipOut.model_validate(e)
        x.home = home(f"eip:{e.id}", live["lb" if e.id in fronts_lb else "nat"])
        out.append(x)
    return out


def eip_out(s: Session, eip: m.Eip) -> EipOut:
    return eip_outs(s, [eip])[0]


@router.post("/eips", status_code=201, response_model=EipOut)
def create_eip(request: Request, body: EipCreate | None = None, p: Principal = Depends(require_tenant_api)) -> EipOut:
    tenant_id = p.tenant_id
    if p.is_admin:
        if not body or not body.tenant_id:
            raise invalid("tenant_id", "the admin must name the tenant the EIP is for")
        tenant_id = body.tenant_id

    def txn() -> EipOut:
        with db_of(request).write(tenants=[tenant_id]) as t:
            s = t.session
            s.execute(select(m.Counter.value).where(m.Counter.name == "vni").with_for_update())  # serialise
            if s.get(m.Tenant, tenant_id) is None:
                raise not_found("tenant", tenant_id, "tenant_id")
            quotas.check(s, request.app.state.settings.quotas, tenant_id, "eips")
            pool, address = _allocate(s, request.app.state.settings.eip_quarantine_s)
            eip = m.Eip(tenant_id=tenant_id, pool_id=pool.id, address=address)
            s.add(eip)
            s.flush()
            return eip_out(s, eip)

    return with_retries(txn, "EIP allocation")


@router.get("/eips", response_model=list[EipOut])
def list_eips(request: Request, response: Response, page: Page = Depends(),
              p: Principal = Depends(require_tenant_api)) -> list[EipOut]:
    with db_of(request).read() as s:
        return eip_outs(s, list(paged(s, scoped(select(m.Eip), m.Eip, p), m.Eip, [m.Eip.address], page, p, request,
                                      response)))


@router.get("/eips/{eip_id}", response_model=EipOut)
def get_eip(eip_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> EipOut:
    with db_of(request).read() as s:
        return eip_out(s, owned(s, m.Eip, eip_id, p, "EIP"))


def eip_in_use(s: Session, eip: m.Eip) -> str | None:
    if eip.port_id:
        return f"EIP {eip.address} is associated with port {eip.port_id}"
    if s.execute(select(m.NatGatewayEip).where(m.NatGatewayEip.eip_id == eip.id)).first():
        return f"EIP {eip.address} is used by a NAT gateway"
    if s.execute(select(m.DnatRule.id).where(m.DnatRule.eip_id == eip.id)).first():
        return f"EIP {eip.address} is used by a DNAT rule"
    if (lb := s.execute(select(m.LoadBalancer.id).where(m.LoadBalancer.eip_id == eip.id)).scalar()) is not None:
        return f"EIP {eip.address} fronts load balancer {lb}"
    return None


@router.delete("/eips/{eip_id}", status_code=204)
def delete_eip(eip_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.Eip, eip_id)) as t:
        eip = owned(t.session, m.Eip, eip_id, p, "EIP")
        if reason := eip_in_use(t.session, eip):
            raise conflict(None, reason + "; release it first")
        t.session.merge(m.FreedEip(address=eip.address, freed_at=now()))  # handed out again last: see _allocate
        t.session.delete(eip)


@router.post("/eips/{eip_id}/associate", response_model=EipOut)
def associate(eip_id: str, body: EipAssociate, request: Request, p: Principal = Depends(require_tenant_api)) -> EipOut:
    with db_of(request).write(tenants=tenant_of(p, m.Eip, eip_id)) as t:
        s = t.session
        eip = owned(s, m.Eip, eip_id, p, "EIP")
        port = owned(s, m.Port, body.port_id, p, "port", "port_id", tenant=eip.tenant_id)
        if eip.port_id == port.id:
            return eip_out(s, eip)
        if reason := eip_in_use(s, eip):
            raise conflict(None, reason)
        if s.execute(select(m.Eip.id).where(m.Eip.port_id == port.id)).first():
            raise conflict("port_id", f"port {port.id} already has an EIP")
        eip.port_id = port.id
        s.flush()
        return eip_out(s, eip)


@router.post("/eips/{eip_id}/disassociate", response_model=EipOut)
def disassociate(eip_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> EipOut:
    with db_of(request).write(tenants=tenant_of(p, m.Eip, eip_id)) as t:
        eip = owned(t.session, m.Eip, eip_id, p, "EIP")
        eip.port_id = None
        t.session.flush()
        return eip_out(t.session, eip)


# --- NAT gateways ---------------------------------------------------------------------------------------------
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
