"""Bearer-token authentication: the admin, tenants, and hosts (agents and gateways)."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fastapi import Depends, Request
from sqlalchemy import select

from controller import models as m
from controller.errors import ApiError

# A token's principal is cached this long per process: a deleted tenant's token may work this much longer.
PRINCIPAL_TTL = 5.0


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(24)}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def ensure_admin_token(state_dir: Path) -> tuple[str, bool]:
    """The admin token from `state_dir/admin.token`, created (mode 0600) on first start."""
    path = state_dir / "admin.token"
    if path.exists():
        return path.read_text().strip(), False
    state_dir.mkdir(parents=True, exist_ok=True)
    token = new_token("tja")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True


@dataclass(frozen=True)
class Principal:
    kind: Literal["admin", "tenant", "host"]
    tenant_id: str | None = None
    name: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"


def principal(request: Request) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <token>'", "Authorization")
    token = token.strip()
    state = request.app.state
    if hmac.compare_digest(token, state.admin_token):
        return Principal("admin", name="admin")
    h = token_hash(token)
    cache: dict = state.__dict__.setdefault("_principals", {})
    hit = cache.get(h)
    if hit and hit[1] > time.monotonic():
        return hit[0]
    found = _lookup(state.db, h)
    if found is None:
        raise ApiError(401, "invalid token", "Authorization")
    cache[h] = (found, time.monotonic() + PRINCIPAL_TTL)
    return found


def _lookup(db, h: str) -> Principal | None:  # noqa: ANN001
    with db.read() as s:
        if t := s.execute(select(m.Tenant).where(m.Tenant.token_hash == h)).scalar_one_or_none():
            return Principal("tenant", tenant_id=t.id, name=t.name)
        if ht := s.execute(select(m.HostToken).where(m.HostToken.token_hash == h)).scalar_one_or_none():
            return Principal("host", name=ht.name)
    return None


def require_admin(p: Principal = Depends(principal)) -> Principal:
    if not p.is_admin:
        raise ApiError(403, "this operation needs the admin token")
    return p


def require_infra(p: Principal = Depends(principal)) -> Principal:
    """Hosts (agents, gateways) and the admin."""
    if p.kind not in ("admin", "host"):
        raise ApiError(403, "this operation needs the admin token or a host token")
    return p


def require_tenant_api(p: Principal = Depends(principal)) -> Principal:
    """Tenant resources: tenants act on their own; the admin may act on any; hosts may not."""
    if p.kind == "host":
        raise ApiError(403, "host tokens cannot manage tenant resources")
    return p
