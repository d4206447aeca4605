"""Tenants and host tokens: admin only."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from sqlalchemy import func, select

from controller import models as m
from controller.api.common import db_of
from controller.api.schemas import HostTokenCreate, TenantCreate, TenantCreated, TenantOut
from controller.auth import Principal, new_token, principal, require_admin, token_hash
from controller.errors import conflict, not_found

router = APIRouter(tags=["tenants"])


@router.post("/tenants", status_code=201, response_model=TenantCreated)
def create_tenant(body: TenantCreate, request: Request, _: Principal = Depends(require_admin)) -> dict:
    token = new_token("tjt")
    with db_of(request).write() as t:
        if t.session.execute(select(m.Tenant).where(m.Tenant.name == body.name)).first():
            raise conflict("name", f"a tenant named {body.name!r} already exists")
        tenant = m.Tenant(name=body.name, token_hash=token_hash(token))
        t.session.add(tenant)
        t.session.flush()
        return {"id": tenant.id, "name": tenant.name, "token": token}


@router.get("/tenants", response_model=list[TenantOut])
def list_tenants(request: Request, p: Principal = Depends(principal)) -> list[m.Tenant]:
    with db_of(request).read() as s:
        stmt = select(m.Tenant).order_by(m.Tenant.name)
        if not p.is_admin:
            stmt = stmt.where(m.Tenant.id == p.tenant_id)
        return list(s.execute(stmt).scalars())


@router.get("/tenants/{tenant_id}", response_model=TenantOut)
def get_tenant(tenant_id: str, request: Request, p: Principal = Depends(principal)) -> m.Tenant:
    with db_of(request).read() as s:
        t = s.get(m.Tenant, tenant_id)
        if t is None or not (p.is_admin or p.tenant_id == tenant_id):
            raise not_found("tenant", tenant_id)
        return t


@router.delete("/tenants/{tenant_id}", status_code=204)
def delete_tenant(tenant_id: str, request: Request, _: Principal = Depends(require_admin)) -> None:
    with db_of(request).write() as t:
        tenant = t.session.get(m.Tenant, tenant_id)
        if tenant is None:
            raise not_found("tenant", tenant_id)
        if t.session.execute(select(func.count()).select_from(m.Vpc).where(m.Vpc.tenant_id == tenant_id)).scalar():
            raise conflict(None, f"tenant {tenant.name} still has VPCs; delete them first")
        t.session.delete(tenant)
    request.app.state.__dict__.get("_principals", {}).clear()


@router.get("/whoami")
def whoami(p: Principal = Depends(principal)) -> dict:
    return {"kind": p.kind, "tenant_id": p.tenant_id, "name": p.name}


@router.post("/host-tokens", status_code=201)
def create_host_token(body: HostTokenCreate, request: Request, _: Principal = Depends(require_admin)) -> dict:
    token = new_token("tjh")
    with db_of(request).write() as t:
        if t.session.execute(select(m.HostToken).where(m.HostToken.name == body.name)).first():
            raise conflict("name", f"a host token named {body.name!r} already exists")
        ht = m.HostToken(name=body.name, token_hash=token_hash(token))
        t.session.add(ht)
        t.session.flush()
        return {"id": ht.id, "name": ht.name, "token": token}
