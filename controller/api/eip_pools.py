"""EIP pools (admin): the public addresses the operator lends to tenants as EIPs, kept apart from every other
address the cluster uses."""

from __future__ import annotations

import ipaddress

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.api.common import WriteRoute, db_of
from controller.api.eip_schemas import EipPoolCreate
from controller.api.ipam import overlaps
from controller.api.ops_schemas import EipPoolOut
from controller.auth import Principal, require_admin
from controller.errors import conflict, not_found
from controller.settings import Settings
from controller.state import models as m

router = APIRouter(tags=["nat"], route_class=WriteRoute)


@router.post("/eip-pools", status_code=201, response_model=EipPoolOut)
def create_pool(body: EipPoolCreate, request: Request, _: Principal = Depends(require_admin)) -> dict:
    """Public addresses are tenants' EIPs and nothing else: a pool overlaps no other pool, no host's VTEP, nor the
    underlay, the service network, the endpoints' source pool or a service's address (those refuse a pool's
    addresses in turn, whichever comes first)."""
    with db_of(request).write() as t:
        _apart(t.session, request.app.state.settings, ipaddress.IPv4Network(body.cidr))
        pool = m.EipPool(cidr=body.cidr)
        t.session.add(pool)
        t.session.flush()
        return {"id": pool.id, "cidr": pool.cidr}


def _apart(s: Session, settings: Settings, net: ipaddress.IPv4Network) -> None:
    for other in s.execute(select(m.EipPool.cidr)).scalars():
        if overlaps(other, str(net)):
            raise conflict("cidr", f"{net} overlaps the EIP pool {other}")
    named = [(settings.service_source_pool, "the endpoints' source pool {} (TIANJI_SERVICE_SOURCE_POOL)"),
             (settings.service_network, "the service network {} (TIANJI_SERVICE_NETWORK)"),
             *((c, "the underlay network {} (TIANJI_UNDERLAY_CIDRS)") for c in settings.underlay_cidrs)]
    for cidr, what in named:
        if cidr and overlaps(cidr, str(net)):
            raise conflict("cidr", f"{net} overlaps {what.format(cidr)}: public addresses are tenants' EIPs only")
    for host, vtep in s.execute(select(m.Host.name, m.Host.vtep_ip)):
        if ipaddress.IPv4Address(vtep) in net:
            raise conflict("cidr", f"{net} holds host {host}'s VTEP {vtep}: public addresses are tenants' EIPs only")
    for name, addresses in s.execute(select(m.Service.name, m.Service.addresses)):
        if (a := next((a for a in addresses if ipaddress.IPv4Address(a) in net), None)) is not None:
            raise conflict("cidr", f"{net} holds service {name}'s address {a}: public addresses are tenants' EIPs "
                                   "only")


@router.delete("/eip-pools/{eip_pool_id}", status_code=204)
def delete_pool(eip_pool_id: str, request: Request, _: Principal = Depends(require_admin)) -> Response:
    """Refused while any of its addresses is a tenant's EIP: release them first."""
    with db_of(request).write() as t:
        pool = t.session.get(m.EipPool, eip_pool_id)
        if pool is None:
            raise not_found("EIP pool", eip_pool_id)
        held = t.session.execute(select(func.count()).select_from(m.Eip).where(m.Eip.pool_id == eip_pool_id)).scalar()
        if held:
            raise conflict("eip_pool_id", f"EIP pool {pool.cidr} still has {held} allocated addresses: their "
                                          "tenants release them first (DELETE /v1/eips/{id})")
        t.session.delete(pool)
    return Response(status_code=204)



@router.get("/eip-pools", response_model=list[EipPoolOut])
def list_pools(request: Request, _: Principal = Depends(require_admin)) -> list[dict]:
    with db_of(request).read() as s:
        return [{"id": p.id, "cidr": p.cidr} for p in s.execute(select(m.EipPool)).scalars()]
