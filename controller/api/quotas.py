"""Per-tenant quotas: how many of each resource a tenant may hold. Defaults in the settings, overrides per tenant
by the admin (`PUT /v1/tenants/{id}/quotas`); a create that would exceed one is refused with 409 naming it.

A check runs under the tenant's lock (`Database.write(tenants=...)`, the lock order's first step), so concurrent
creates by one tenant cannot both slip under the limit; it refuses to run without it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from controller.errors import ApiError
from controller.state import models as m
from controller.state.db import check_tenant_locked

# resource -> a statement counting one tenant's rows (bound parameter: tenant)
_T = m.SecurityGroup.__table__
COUNTS: dict[str, Any] = {
    "vpcs": select(func.count()).select_from(m.Vpc).where(m.Vpc.tenant_id == bindparam("tenant")),
    "subnets": select(func.count()).select_from(m.Subnet).where(m.Subnet.tenant_id == bindparam("tenant")),
    "ports": select(func.count()).select_from(m.Port).where(m.Port.tenant_id == bindparam("tenant")),
    "security_groups": select(func.count()).select_from(m.SecurityGroup)
    .where(m.SecurityGroup.tenant_id == bindparam("tenant")),
    "security_group_rules": select(func.count()).select_from(m.SecurityGroupRule)
    .join(m.SecurityGroup, m.SecurityGroup.id == m.SecurityGroupRule.group_id)
    .where(m.SecurityGroup.tenant_id == bindparam("tenant")),
    "eips": select(func.count()).select_from(m.Eip).where(m.Eip.tenant_id == bindparam("tenant")),
    "nat_gateways": select(func.count()).select_from(m.NatGateway)
    .where(m.NatGateway.tenant_id == bindparam("tenant")),
    "load_balancers": select(func.count()).select_from(m.LoadBalancer)
    .where(m.LoadBalancer.tenant_id == bindparam("tenant")),
    "peerings": select(func.count()).select_from(m.Peering)
    .where(m.Peering.requester_tenant_id == bindparam("tenant")),
    "tokens": select(func.count()).select_from(m.TenantToken).where(m.TenantToken.tenant_id == bindparam("tenant")),
    "private_lines": select(func.count()).select_from(m.PrivateLine)
    .where(m.PrivateLine.tenant_id == bindparam("tenant")),
    "service_endpoints": select(func.count()).select_from(m.ServiceEndpoint)
    .where(m.ServiceEndpoint.tenant_id == bindparam("tenant")),
}
RESOURCES = tuple(COUNTS)


def limits(s: Session, defaults: dict[str, int], tenant_id: str) -> dict[str, int]:
    over = dict(s.execute(select(m.Quota.resource, m.Quota.limit).where(m.Quota.tenant_id == tenant_id)).all())
    return {r: over.get(r, defaults[r]) for r in RESOURCES}


def usage(s: Session, tenant_id: str) -> dict[str, int]:
    return {r: s.execute(q, {"tenant": tenant_id}).scalar() for r, q in COUNTS.items()}


# per resource, one statement (one round trip on a create's hot path): the tenant's override and its count
CHECKS = {r: select(select(m.Quota.limit).where(m.Quota.tenant_id == bindparam("tenant"), m.Quota.resource == r)
                    .scalar_subquery(), q.scalar_subquery())
          .where(m.Tenant.id == bindparam("tenant"))
          for r, q in COUNTS.items()}


def check(s: Session, defaults: dict[str, int], tenant_id: str, resource: str, adding: int = 1) -> None:
    """Refuse (409) if the tenant would hold more than its limit of `resource` after adding `adding`."""
    check_tenant_locked(s, tenant_id)
    row = s.execute(CHECKS[resource], {"tenant": tenant_id}).one_or_none()
    if row is None:
        return  # no such tenant: the caller's own lookup says so
    override, used = row
    limit = defaults[resource] if override is None else override
    if limit < 0:
        return  # unlimited
    if used + adding > limit:
        raise ApiError(409, f"quota exceeded: {resource} (limit {limit}, in use {used}, asked for {adding} more); "
                            "delete some, or ask the operator to raise the quota", resource,
                       quota=resource, limit=limit, used=used)
