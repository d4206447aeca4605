"""Tenants and host tokens: admin only."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy import delete, select

from controller.api import quotas
from controller.api.common import Page, WriteRoute, db_of, paged
from controller.api.ops_schemas import WhoAmI
from controller.api.schemas import (
    AuditOut,
    HostTokenCreate,
    HostTokenCreated,
    HostTokenOut,
    QuotaOut,
    QuotaUpdate,
    TenantCreate,
    TenantCreated,
    TenantOut,
    TokenCreate,
    TokenCreated,
    TokenOut,
)
from controller.auth import (
    Principal,
    forget_credentials,
    new_token,
    principal,
    require_admin,
    require_tenant_api,
    revoke_everywhere,
    token_hash,
)
from controller.errors import conflict, invalid, not_found
from controller.state import models as m

router = APIRouter(tags=["tenants"], route_class=WriteRoute)


@router.post("/tenants", status_code=201, response_model=TenantCreated)
def create_tenant(body: TenantCreate, request: Request, _: Principal = Depends(require_admin)) -> dict:
    token = new_token("tjt")
    with db_of(request).write() as t:
        if t.session.execute(select(m.Tenant).where(m.Tenant.name == body.name)).first():
            raise conflict("name", f"a tenant named {body.name!r} already exists")
        tenant = m.Tenant(name=body.name)
        t.session.add(tenant)
        t.session.flush()
        t.session.add(m.TenantToken(tenant_id=tenant.id, name="initial", token_hash=token_hash(token)))
        return {"id": tenant.id, "name": tenant.name, "token": token}


@router.get("/tenants", response_model=list[TenantOut])
def list_tenants(request: Request, response: Response, page: Page = Depends(),
                 p: Principal = Depends(principal)) -> list[m.Tenant]:
    with db_of(request).read() as s:
        stmt = select(m.Tenant)
        if not p.is_admin:
            stmt = stmt.where(m.Tenant.id == p.tenant_id)
        return paged(s, stmt, m.Tenant, [m.Tenant.name], page, p, request, response)


@router.get("/tenants/{tenant_id}", response_model=TenantOut)
def get_tenant(tenant_id: str, request: Request, p: Principal = Depends(principal)) -> m.Tenant:
    with db_of(request).read() as s:
        t = s.get(m.Tenant, tenant_id)
        if t is None or not (p.is_admin or p.tenant_id == tenant_id):
            raise not_found("tenant", tenant_id)
        return t


@router.delete("/tenants/{tenant_id}", status_code=204)
def delete_tenant(tenant_id: str, request: Request, _: Principal = Depends(require_admin)) -> None:
    with db_of(request).write(tenants=[tenant_id]) as t:
        tenant = t.session.get(m.Tenant, tenant_id)
        if tenant is None:
            raise not_found("tenant", tenant_id)
        # its tokens go with it (revoked): they are its credentials, not its resources
        held = {k: n for k, n in quotas.usage(t.session, tenant_id).items() if n and k != "tokens"}
        if held:
            what = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in held.items())
            raise conflict(None, f"tenant {tenant.name} still has {what}; delete them first")
        t.session.execute(delete(m.TenantToken).where(m.TenantToken.tenant_id == tenant_id))
        t.session.delete(tenant)
        revoke_everywhere(t.session)
    forget_credentials(request.app.state)


@router.get("/whoami", response_model=WhoAmI)
def whoami(p: Principal = Depends(principal)) -> dict:
    return {"kind": p.kind, "tenant_id": p.tenant_id, "name": p.name}


# --- audit log ---------------------------------------------------------------------------------------------------
@router.get("/audit", response_model=list[AuditOut])
def audit_log(request: Request, response: Response, tenant_id: str | None = Query(None, max_length=64),
              since: datetime | None = None, page: Page = Depends(),
              p: Principal = Depends(require_admin)) -> list:
    """Every committed write through the API, oldest first: who (credential kind and name, tenant), what (method
    and path), when, and the revision it made."""
    with db_of(request).read() as s:
        stmt = select(m.AuditEntry)
        if tenant_id:
            stmt = stmt.where(m.AuditEntry.tenant_id == tenant_id)
        if since:
            stmt = stmt.where(m.AuditEntry.at >= since)
        return paged(s, stmt, m.AuditEntry, [], page, p, request, response)


# --- quotas ----------------------------------------------------------------------------------------------------
@router.get("/tenants/{tenant_id}/quotas", response_model=dict[str, QuotaOut])
def get_quotas(tenant_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> dict:
    """Each resource's limit and how many the tenant holds (the admin, or the tenant itself)."""
    with db_of(request).read() as s:
        _tenant_for_tokens(s, tenant_id, p)
        lim = quotas.limits(s, request.app.state.settings.quotas, tenant_id)
        used = quotas.usage(s, tenant_id)
        return {r: {"limit": lim[r], "used": used[r]} for r in quotas.RESOURCES}


@router.put("/tenants/{tenant_id}/quotas", response_model=dict[str, QuotaOut])
def set_quotas(tenant_id: str, body: QuotaUpdate, request: Request, p: Principal = Depends(require_admin)) -> dict:
    """Override limits for one tenant (`null`: back to the default; -1: unlimited)."""
    with db_of(request).write(tenants=[tenant_id]) as t:
        s = t.session
        if s.get(m.Tenant, tenant_id) is None:
            raise not_found("tenant", tenant_id)
        for r, v in body.model_dump(exclude_unset=True).items():
            row = s.get(m.Quota, (tenant_id, r))
            if v is None:
                if row is not None:
                    s.delete(row)
            elif row is None:
                s.add(m.Quota(tenant_id=tenant_id, resource=r, limit=v))
            else:
                row.limit = v
    return get_quotas(tenant_id, request, p)


# --- credentials: rotated by making a new one, revoked by deleting the old -----------------------------------------
def _tenant_for_tokens(s, tenant_id: str, p: Principal) -> m.Tenant:
    """The admin manages any tenant's tokens; a tenant its own (to rotate them)."""
    tenant = s.get(m.Tenant, tenant_id)
    if tenant is None or not (p.is_admin or p.tenant_id == tenant_id):
        raise not_found("tenant", tenant_id)
    return tenant


@router.post("/tenants/{tenant_id}/tokens", status_code=201, response_model=TokenCreated)
def create_tenant_token(tenant_id: str, body: TokenCreate, request: Request,
                        p: Principal = Depends(require_tenant_api)) -> dict:
    """A further token for the tenant: give it to the clients, then revoke the old one."""
    token = new_token("tjt")
    with db_of(request).write(tenants=[tenant_id if p.sees_all else p.tenant_id]) as t:
        _tenant_for_tokens(t.session, tenant_id, p)
        quotas.check(t.session, request.app.state.settings.quotas, tenant_id, "tokens")
        row = m.TenantToken(tenant_id=tenant_id, name=body.name or "", token_hash=token_hash(token))
        t.session.add(row)
        t.session.flush()
        return {"id": row.id, "name": row.name, "token": token, "created_at": row.created_at}


@router.get("/tenants/{tenant_id}/tokens", response_model=list[TokenOut])
def list_tenant_tokens(tenant_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> list:
    with db_of(request).read() as s:
        _tenant_for_tokens(s, tenant_id, p)
        return list(s.execute(select(m.TenantToken).where(m.TenantToken.tenant_id == tenant_id)
                              .order_by(m.TenantToken.created_at)).scalars())


@router.delete("/tenants/{tenant_id}/tokens/{token_id}", status_code=204)
def revoke_tenant_token(tenant_id: str, token_id: str, request: Request,
                        p: Principal = Depends(require_tenant_api)) -> None:
    """Revoked at once in every controller process (PostgreSQL; SQLite's other workers: within PRINCIPAL_TTL)."""
    with db_of(request).write(tenants=[tenant_id if p.sees_all else p.tenant_id]) as t:
        _tenant_for_tokens(t.session, tenant_id, p)
        row = t.session.get(m.TenantToken, token_id)
        if row is None or row.tenant_id != tenant_id:
            raise not_found("token", token_id)
        t.session.delete(row)
        revoke_everywhere(t.session)
    forget_credentials(request.app.state)


@router.post("/host-tokens", status_code=201, response_model=HostTokenCreated)
def create_host_token(body: HostTokenCreate, request: Request, _: Principal = Depends(require_admin)) -> dict:
    """A credential for one host: with it, that host (of that kind) registers, beats, reports its ports and reads
    its own config, and nothing else. Make a new one for the same host to rotate, then delete the old."""
    if body.role is not None and body.kind != "gateway":
        raise invalid("role", "only a gateway credential has a role (nat or lb)")
    return _infra_token(request, body.name or body.host, body.host, body.kind, body.role)


@router.post("/orchestrator-tokens", status_code=201, response_model=HostTokenCreated)
def create_orchestrator_token(body: TokenCreate, request: Request, _: Principal = Depends(require_admin)) -> dict:
    """A credential for what places VMs (Nova, a CNI plugin, the emulated cluster): it creates, lists, binds to a
    host (`host`) and deletes any tenant's ports, lists hosts, and nothing else."""
    return _infra_token(request, body.name or "orchestrator", None, "orchestrator")


def _infra_token(request: Request, name: str, host: str | None, kind: str, role: str | None = None) -> dict:
    token = new_token("tjh" if host else "tjo")
    with db_of(request).write() as t:
        if t.session.execute(select(m.HostToken).where(m.HostToken.name == name)).first():
            raise conflict("name", f"a token named {name!r} already exists: name the new one (`name`) to rotate")
        ht = m.HostToken(name=name, host=host, kind=kind, role=role, token_hash=token_hash(token))
        t.session.add(ht)
        t.session.flush()
        return {"id": ht.id, "name": ht.name, "host": host, "kind": kind, "role": role, "token": token,
                "created_at": ht.created_at}


@router.get("/host-tokens", response_model=list[HostTokenOut])
def list_host_tokens(request: Request, _: Principal = Depends(require_admin)) -> list:
    """Host and orchestrator credentials (never the tokens themselves: only their hashes are stored)."""
    with db_of(request).read() as s:
        return list(s.execute(select(m.HostToken).order_by(m.HostToken.name)).scalars())


@router.delete("/host-tokens/{token_id}", status_code=204)
def revoke_host_token(token_id: str, request: Request, _: Principal = Depends(require_admin)) -> None:
    with db_of(request).write() as t:
        row = t.session.get(m.HostToken, token_id)
        if row is None:
            raise not_found("host token", token_id)
        t.session.delete(row)
        revoke_everywhere(t.session)
    forget_credentials(request.app.state)
