"""Bearer-token authentication: the admin, tenants, and hosts (agents and gateways)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select, text
from starlette.concurrency import run_in_threadpool

from controller.errors import ApiError
from controller.state import models as m

# A token's principal is cached per process. On PostgreSQL a revocation is announced to every process
# (NOTIFY tianji_credentials, `revoke_everywhere`), and a process that hears those keeps a principal for an hour;
# one that does not (SQLite's other workers, a lost LISTEN connection) for PRINCIPAL_TTL, how long a revoked token
# may still work there.
PRINCIPAL_TTL = 5.0
PRINCIPAL_TTL_HEARD = 3600.0
REVOKED_CHANNEL = "tianji_credentials"


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(24)}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    kind: Literal["admin", "tenant", "host", "orchestrator"]
    tenant_id: str | None = None
    name: str | None = None
    host: str | None = None  # a host token's host
    host_kind: str | None = None  # and its kind: hypervisor or gateway
    host_role: str | None = None  # a gateway credential's role, if it names one (nat, lb)
    key: str = ""  # the credential's hash: rate limits are per credential

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"

    @property
    def sees_all(self) -> bool:
        """The admin, and orchestrators on the only routes they may use (ports: they place any tenant's VMs)."""
        return self.kind in ("admin", "orchestrator")


BEARER = HTTPBearer(auto_error=False, description="a tenant, host, orchestrator or the admin token")


async def principal(request: Request, _: HTTPAuthorizationCredentials | None = Depends(BEARER)) -> Principal:
    """The caller, as `controller.guards` authenticated it before the body was read. (`BEARER` declares the
    scheme in the OpenAPI document, for Swagger UI's Authorize button; the guard has checked the token.)"""
    p = getattr(request.state, "principal", None)
    if p is None:  # a route outside /v1
        p = cached_principal(request.app.state, request.headers.get("authorization", "")) or \
            await run_in_threadpool(authenticate, request.app.state, request.headers.get("authorization", ""))
    return p


def _token(header: str) -> str:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <token>'", "Authorization")
    return token.strip()


def cached_principal(state: Any, header: str) -> Principal | None:
    """The admin, or a credential looked up less than PRINCIPAL_TTL ago; None: `authenticate` must look."""
    try:
        token = _token(header)
    except ApiError:
        return None
    # the admin's hash is the cluster's (controller.replicas): every replica knows it, not every one the token
    h = token_hash(token)
    if hmac.compare_digest(h, state.admin_hash):
        return Principal("admin", name="admin")
    hit = state.__dict__.setdefault("_principals", {}).get(h)
    return hit[0] if hit and hit[1] > time.monotonic() else None


def authenticate(state: Any, header: str) -> Principal:
    """The credential's principal, from the database (401 if there is none): for what `cached_principal` did not
    know (its callers ask it first)."""
    h = token_hash(_token(header))
    found = _lookup(state.db, h)
    if found is None:
        raise ApiError(401, "invalid token", "Authorization")
    ttl = PRINCIPAL_TTL_HEARD if getattr(state, "hears_revocations", False) else PRINCIPAL_TTL
    state.__dict__.setdefault("_principals", {})[h] = (found, time.monotonic() + ttl)
    return found


def _lookup(db, h: str) -> Principal | None:
    with db.read() as s:
        if t := s.execute(select(m.Tenant.id, m.Tenant.name).join(m.TenantToken)
                          .where(m.TenantToken.token_hash == h)).first():
            return Principal("tenant", tenant_id=t.id, name=t.name, key=h)
        if ht := s.execute(select(m.HostToken).where(m.HostToken.token_hash == h)).scalar_one_or_none():
            if ht.kind == "orchestrator":
                return Principal("orchestrator", name=ht.name, key=h)
            if ht.host is None:
                raise ApiError(403, f"host token {ht.name!r} names no host (it predates host-bound tokens): "
                                    "create one per host with POST /v1/host-tokens {\"host\": ..., \"kind\": ...}")
            return Principal("host", name=ht.name, host=ht.host, host_kind=ht.kind, host_role=ht.role, key=h)
    return None


def forget_credentials(state: object) -> None:
    """Drop this process's cache of principals (after a revocation, here or announced by another process)."""
    state.__dict__.get("_principals", {}).clear()


def revoke_everywhere(session: Any) -> None:
    """In a transaction that removes credentials: tell every controller process, at its commit, to forget the
    principals it holds (PostgreSQL; SQLite's other workers forget theirs within PRINCIPAL_TTL)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SELECT pg_notify('{REVOKED_CHANNEL}', '')"))


# The require_* checks are async: no I/O, and FastAPI runs a sync dependency in a thread, a hop per request.
async def require_admin(p: Principal = Depends(principal)) -> Principal:
    if not p.is_admin:
        raise ApiError(403, "this operation needs the admin token")
    return p


async def require_infra(p: Principal = Depends(principal)) -> Principal:
    """Hosts (agents, gateways), orchestrators and the admin; each route then checks which host (`own_host`)."""
    if p.kind == "tenant":
        raise ApiError(403, "this operation needs the admin token or a host token")
    return p


def own_host(p: Principal, name: str, kind: str | None = None) -> None:
    """A host token acts for its own host only (and, where `kind` is given, only as that kind of host)."""
    if p.is_admin:
        return
    if p.kind != "host":
        raise ApiError(403, "this operation needs the admin token or this host's token")
    if p.host != name:
        raise ApiError(403, f"this token belongs to host {p.host!r}, not {name!r}")
    if kind is not None and p.host_kind != kind:
        raise ApiError(403, f"this token is for a {p.host_kind} host; this operation is for {kind} hosts")


async def require_tenant_api(p: Principal = Depends(principal)) -> Principal:
    """Tenant resources: tenants act on their own; the admin may act on any; hosts and orchestrators may not."""
    if p.kind in ("host", "orchestrator"):
        raise ApiError(403, f"{p.kind} tokens cannot manage tenant resources")
    return p


async def require_network_read(p: Principal = Depends(principal)) -> Principal:
    """Reading one VPC or subnet: tenants their own, the admin, and orchestrators, which wire a VM's or a
    container's interface with the subnet's prefix and gateway and the VPC's MTU (as Nova reads Neutron's
    networks). Hosts may not."""
    if p.kind == "host":
        raise ApiError(403, "host tokens cannot read tenant resources")
    return p


async def require_port_api(p: Principal = Depends(principal)) -> Principal:
    """Ports: tenants their own; the admin and orchestrators any tenant's (an orchestrator places VMs)."""
    if p.kind == "host":
        raise ApiError(403, "host tokens cannot manage tenant resources")
    return p


def may_bind(p: Principal, field: str) -> None:
    """Which host a port is on decides which hypervisor gets its traffic: the operator's call (Neutron keeps
    binding:host_id admin-only), made by the admin or an orchestrator token, never by a tenant."""
    if not p.sees_all:
        raise ApiError(403, "binding a port to a host needs the admin token or an orchestrator token "
                            "(POST /v1/orchestrator-tokens); create the port without `host` and let the "
                            "orchestrator bind it", field)
