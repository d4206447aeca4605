"""Elastic IPs (tenant view): allocation from the operator's pools, association with a port, release; which
gateway instance answers for each (`home`). NAT gateways, DNAT rules and load balancers take them
(`controller/roles/`)."""

from __future__ import annotations

import ipaddress
import socket
from datetime import timedelta

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.api import quotas
from controller.api.common import Page, WriteRoute, db_of, owned, paged, scoped, tenant_of, with_retries
from controller.api.eip_schemas import EipAssociate, EipCreate, EipOut
from controller.auth import Principal, require_tenant_api
from controller.errors import ApiError, conflict, invalid, not_found
from controller.southbound.placement import home
from controller.state import models as m
from controller.state.models import now
from tianji.southbound import DEFAULT_GATEWAY_ROLE

router = APIRouter(tags=["nat"], route_class=WriteRoute)


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
