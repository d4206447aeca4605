"""VPC peering: same tenant is active at once; across tenants it waits for the accepter."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from controller.api import quotas
from controller.api.common import Page, WriteRoute, db_of, owned, paged, tenant_of, visible
from controller.api.ipam import overlaps
from controller.api.schemas import PeeringCreate, PeeringOut
from controller.auth import Principal, require_tenant_api
from controller.errors import ApiError, conflict, invalid, not_found
from controller.state import models as m

router = APIRouter(tags=["peerings"], route_class=WriteRoute)


def _visible_peering(s, peering_id: str, p: Principal) -> m.Peering:
    pc = s.get(m.Peering, peering_id)
    if pc is None or not (visible(p, pc.requester_tenant_id) or visible(p, pc.accepter_tenant_id)):
        raise not_found("peering", peering_id)
    return pc


@router.post("/peerings", status_code=201, response_model=PeeringOut)
def create_peering(body: PeeringCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> m.Peering:
    if body.requester_vpc_id == body.accepter_vpc_id:
        raise invalid("accepter_vpc_id", "a VPC cannot peer with itself")
    with db_of(request).write(tenants=tenant_of(p, m.Vpc, body.requester_vpc_id)) as t:
        s = t.session
        req = owned(s, m.Vpc, body.requester_vpc_id, p, "VPC", "requester_vpc_id")
        acc = s.get(m.Vpc, body.accepter_vpc_id)  # may belong to another tenant: peering is how tenants meet
        if acc is None:
            raise not_found("VPC", body.accepter_vpc_id, "accepter_vpc_id")
        if overlaps(req.cidr, acc.cidr):  # the other VPC's CIDR is not said: it may be another tenant's
            raise conflict("accepter_vpc_id", f"the accepter VPC's CIDR overlaps {req.cidr}; peered VPCs need "
                                              "disjoint address space")
        if req.ipv6_cidr and acc.ipv6_cidr and overlaps(req.ipv6_cidr, acc.ipv6_cidr):
            raise conflict("accepter_vpc_id", f"the accepter VPC's IPv6 CIDR overlaps {req.ipv6_cidr}; peered VPCs "
                                              "need disjoint address space")
        low, high = sorted((req.id, acc.id))
        if s.execute(select(m.Peering.id).where(m.Peering.vpc_low == low, m.Peering.vpc_high == high)).first():
            raise conflict("accepter_vpc_id", "these VPCs already have a peering")
        quotas.check(s, request.app.state.settings.quotas, req.tenant_id, "peerings")
        status = "active" if req.tenant_id == acc.tenant_id else "pending-acceptance"
        pc = m.Peering(requester_vpc_id=req.id, accepter_vpc_id=acc.id, requester_tenant_id=req.tenant_id,
                       accepter_tenant_id=acc.tenant_id, vpc_low=low, vpc_high=high, status=status)
        s.add(pc)
        s.flush()
        return pc


@router.get("/peerings", response_model=list[PeeringOut])
def list_peerings(request: Request, response: Response, page: Page = Depends(),
                  p: Principal = Depends(require_tenant_api)) -> list[m.Peering]:
    with db_of(request).read() as s:
        stmt = select(m.Peering)
        if not p.is_admin:
            stmt = stmt.where(or_(m.Peering.requester_tenant_id == p.tenant_id,
                                  m.Peering.accepter_tenant_id == p.tenant_id))
        return paged(s, stmt, m.Peering, [m.Peering.created_at], page, p, request, response)


@router.get("/peerings/{peering_id}", response_model=PeeringOut)
def get_peering(peering_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> m.Peering:
    with db_of(request).read() as s:
        return _visible_peering(s, peering_id, p)


def _tenants(peering_id: str) -> Callable[[Session], list[str]]:
    """Both sides' tenants: a peering's row is both tenants' (for the lock order, controller/state/db.py)."""
    return lambda s: list(s.execute(select(m.Peering.requester_tenant_id, m.Peering.accepter_tenant_id)
                                    .where(m.Peering.id == peering_id)).one_or_none() or [])


def _decide(peering_id: str, request: Request, p: Principal, status: str) -> m.Peering:
    with db_of(request).write(tenants=_tenants(peering_id)) as t:
        pc = _visible_peering(t.session, peering_id, p)
        if not visible(p, pc.accepter_tenant_id):
            raise ApiError(403, "only the accepter VPC's tenant can accept or reject this peering")
        if pc.status != "pending-acceptance":
            raise conflict(None, f"peering {peering_id} is {pc.status}, not pending-acceptance")
        pc.status = status
        t.session.flush()
        return pc


@router.post("/peerings/{peering_id}/accept", response_model=PeeringOut)
def accept_peering(peering_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> m.Peering:
    return _decide(peering_id, request, p, "active")


@router.post("/peerings/{peering_id}/reject", response_model=PeeringOut)
def reject_peering(peering_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> m.Peering:
    return _decide(peering_id, request, p, "rejected")


@router.delete("/peerings/{peering_id}", status_code=204)
def delete_peering(peering_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=_tenants(peering_id)) as t:
        pc = _visible_peering(t.session, peering_id, p)
        t.session.delete(pc)
