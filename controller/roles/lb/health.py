"""Health reports from the agents that probe load-balancer members (vswitch_agent/health.py): a member's host
reports its transitions; the member's `operating_status` and its time change, and its VPC is stamped so that the
instances' next config takes an OFFLINE member out of its pool's table (or back in)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import Field, StringConstraints
from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.api.common import WriteRoute, db_of
from controller.api.ops_schemas import HealthAnswer
from controller.api.schemas import Req
from controller.auth import Principal, own_host, require_infra
from controller.errors import ApiError
from controller.state import models as m

router = APIRouter(tags=["load balancers"], route_class=WriteRoute)


class HealthReport(Req):
    members: dict[Annotated[str, StringConstraints(max_length=64)], Literal["ONLINE", "OFFLINE"]] = Field(
        max_length=10_000, description="member id -> what its checks say")


@router.post("/hosts/{name}/lb-health", response_model=HealthAnswer)
def report_health(name: str, body: HealthReport, request: Request, p: Principal = Depends(require_infra)) -> dict:
    """Only for members whose port is on this host, whose pool is monitored and that are not draining."""
    own_host(p, name, "hypervisor")

    def tenants(s: Session) -> list[str]:  # of the members on this host (the lock order, controller/state/db.py)
        return list(s.execute(select(m.LbMember.tenant_id).distinct().join(m.Port, m.Port.id == m.LbMember.port_id)
                              .where(m.Port.host == name)).scalars())

    with db_of(request).write(tenants=tenants) as t:
        s = t.session
        rows = s.execute(select(m.LbMember, m.Port.host, m.LbPool.load_balancer_id)
                         .join(m.Port, m.Port.id == m.LbMember.port_id)
                         .join(m.LbPool, m.LbPool.id == m.LbMember.pool_id)
                         .where(m.LbMember.id.in_(sorted(body.members)))).all()
        found = {x.id: (x, host, lb) for x, host, lb in rows}
        if bad := [mid for mid in body.members if mid not in found or found[mid][1] != name]:
            raise ApiError(404, f"members: {', '.join(sorted(bad))} not found on host {name}", "members")
        changed = 0
        for mid, status in body.members.items():
            x, _, lb_id = found[mid]
            monitored = s.get(m.LbHealthMonitor, x.pool_id) is not None
            if monitored and x.weight > 0 and x.operating_status != status:
                x.operating_status, x.status_changed_at = status, m.now()
                changed += 1
        return {"changed": changed}
