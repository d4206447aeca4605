"""The load-balancer API (Neutron LBaaS v2 / Octavia names): load balancers (a VIP in a subnet, optionally an EIP),
listeners, pools, members and health monitors.

Tenants see only their own; a reference to another tenant's object is a 404, as for one that does not exist, and a
reference to an object of another VPC is a 422 naming the field. Every write is one transaction and stamps the
load balancer's VPC, so its hosts and gateway instances get the change in their next config.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.api import quotas
from controller.api.common import Page, WriteRoute, db_of, owned, paged, scoped, tenant_of, with_retries
from controller.api.eips import eip_in_use
from controller.api.ports import insert_ports
from controller.api.schemas import PortCreate
from controller.auth import Principal, require_tenant_api
from controller.errors import ApiError, conflict, invalid, not_found
from controller.roles.lb.schemas import (
    HealthMonitorOut,
    HealthMonitorPut,
    ListenerCreate,
    ListenerOut,
    LoadBalancerCreate,
    LoadBalancerOut,
    MemberCreate,
    MemberOut,
    MemberUpdate,
    PoolCreate,
    PoolOut,
)
from controller.state import models as m

router = APIRouter(tags=["load balancers"], route_class=WriteRoute)
DOWN = ("OFFLINE",)


# --- status -------------------------------------------------------------------------------------------------
def pool_status(members: list[m.LbMember]) -> str:
    """ONLINE when every member with weight is up (or unmonitored), DEGRADED when some are down, OFFLINE when all
    are (the data plane then fails open: it keeps sending to all of them, as AWS NLB does)."""
    live = [x for x in members if x.weight > 0]
    down = [x for x in live if x.operating_status in DOWN]
    if live and len(down) == len(live):
        return "OFFLINE"
    return "DEGRADED" if down else "ONLINE"


def lb_out(s: Session, lb: m.LoadBalancer) -> LoadBalancerOut:
    out = LoadBalancerOut.model_validate(lb)
    out.listener_ids = sorted(s.execute(select(m.LbListener.id).where(m.LbListener.load_balancer_id == lb.id))
                              .scalars())
    pools = list(s.execute(select(m.LbPool).where(m.LbPool.load_balancer_id == lb.id)).scalars())
    out.pool_ids = sorted(x.id for x in pools)
    statuses = {pool_status(_members(s, x.id)) for x in pools}
    out.operating_status = ("OFFLINE" if statuses == {"OFFLINE"} else
                            "DEGRADED" if statuses & {"OFFLINE", "DEGRADED"} else "ONLINE")
    if lb.eip_id:
        out.eip_address = s.get(m.Eip, lb.eip_id).address
    return out


def _members(s: Session, pool_id: str) -> list[m.LbMember]:
    return list(s.execute(select(m.LbMember).where(m.LbMember.pool_id == pool_id)
                          .order_by(m.LbMember.id)).scalars())


def pool_out(s: Session, pool: m.LbPool) -> PoolOut:
    out = PoolOut.model_validate(pool)
    members = _members(s, pool.id)
    out.member_ids = [x.id for x in members]
    out.operating_status = pool_status(members)
    return out


def member_out(s: Session, x: m.LbMember) -> MemberOut:
    out = MemberOut.model_validate(x)
    out.address = s.get(m.Port, x.port_id).ip
    return out


# --- load balancers --------------------------------------------------------------------------------------------
@router.post("/load-balancers", status_code=201, response_model=LoadBalancerOut)
def create_lb(body: LoadBalancerCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> Response:
    settings = request.app.state.settings

    def txn() -> LoadBalancerOut:
        with db_of(request).write(tenants=tenant_of(p, m.Vpc, body.vpc_id)) as t:
            s = t.session
            vpc = owned(s, m.Vpc, body.vpc_id, p, "VPC", "vpc_id")
            subnet = owned(s, m.Subnet, body.subnet_id, p, "subnet", "subnet_id", tenant=vpc.tenant_id)
            if subnet.vpc_id != vpc.id:
                raise invalid("subnet_id", f"subnet {subnet.id} is not in VPC {vpc.id}")
            quotas.check(s, settings.quotas, vpc.tenant_id, "load_balancers")
            if s.execute(select(m.LoadBalancer.id).where(m.LoadBalancer.vpc_id == vpc.id,
                                                         m.LoadBalancer.name == body.name)).first():
                raise conflict("name", f"VPC {vpc.id} already has a load balancer named {body.name!r}")
            eip = None
            if body.eip_id:
                eip = owned(s, m.Eip, body.eip_id, p, "EIP", "eip_id", tenant=vpc.tenant_id)
                if reason := eip_in_use(s, eip):
                    raise conflict("eip_id", reason)
            try:
                vip = insert_ports(t, [PortCreate(subnet_id=subnet.id, name=f"vip-{body.name}"[:64],
                                                  ip=body.vip_address, security_group_ids=[])],
                                   p, bulk=False, quota=settings.quotas)[0]
            except ApiError as e:  # the VIP's address is the caller's vip_address
                if e.field != "ip":
                    raise
                raise ApiError(e.status, e.detail.replace("ip:", "vip_address:", 1), "vip_address") from None
            t.flush_deferred()  # the VIP's port row, which the load balancer refers to
            lb = m.LoadBalancer(tenant_id=vpc.tenant_id, vpc_id=vpc.id, subnet_id=subnet.id, name=body.name,
                                vip_port_id=vip.id, vip_address=vip.ip, eip_id=eip.id if eip else None)
            s.add(lb)
            s.flush()
            return lb_out(s, lb)

    out = with_retries(txn, "load balancer creation")
    return Response(out.model_dump_json(), status_code=201, media_type="application/json")


@router.get("/load-balancers", response_model=list[LoadBalancerOut])
def list_lbs(request: Request, response: Response, page: Page = Depends(),
             p: Principal = Depends(require_tenant_api)) -> list[LoadBalancerOut]:
    with db_of(request).read() as s:
        stmt = scoped(select(m.LoadBalancer), m.LoadBalancer, p)
        return [lb_out(s, x) for x in paged(s, stmt, m.LoadBalancer, [m.LoadBalancer.name], page, p, request,
                                            response)]


@router.get("/load-balancers/{lb_id}", response_model=LoadBalancerOut)
def get_lb(lb_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> LoadBalancerOut:
    with db_of(request).read() as s:
        return lb_out(s, owned(s, m.LoadBalancer, lb_id, p, "load balancer"))


@router.delete("/load-balancers/{lb_id}", status_code=204)
def delete_lb(lb_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    """With its listeners, pools, members and monitors; its VIP's address goes back to the subnet, its EIP stays
    the tenant's."""
    with db_of(request).write(tenants=tenant_of(p, m.LoadBalancer, lb_id)) as t:
        s = t.session
        lb = owned(s, m.LoadBalancer, lb_id, p, "load balancer")
        if (svc := s.execute(select(m.Service.id, m.Service.name).where(m.Service.load_balancer_id == lb.id))
                .first()):
            raise conflict(None, f"this load balancer is published as service {svc.name} ({svc.id}); delete the "
                                 f"service first (DELETE /v1/services/{svc.id})")
        if (eip := s.execute(select(m.Eip.id, m.Eip.address).where(m.Eip.port_id == lb.vip_port_id)).first()):
            raise conflict(None, f"EIP {eip.address} ({eip.id}) is associated 1:1 with this load balancer's VIP "
                                 f"port; disassociate it first (POST /v1/eips/{eip.id}/disassociate)")
        for listener in s.execute(select(m.LbListener).where(m.LbListener.load_balancer_id == lb.id)).scalars():
            s.delete(listener)
        s.flush()
        for pool in s.execute(select(m.LbPool).where(m.LbPool.load_balancer_id == lb.id)).scalars():
            _delete_pool(s, pool)
        vip = s.get(m.Port, lb.vip_port_id)
        s.delete(lb)
        s.flush()
        s.delete(vip)


# --- listeners -------------------------------------------------------------------------------------------------
def _check_pool_for(s: Session, pool_id: str | None, lb: m.LoadBalancer, protocol: str, p: Principal) -> None:
    if pool_id is None:
        return
    pool = owned(s, m.LbPool, pool_id, p, "pool", "default_pool_id")
    if pool.load_balancer_id != lb.id:
        raise invalid("default_pool_id", f"pool {pool.id} belongs to another load balancer")
    if pool.protocol != protocol:
        raise invalid("default_pool_id", f"pool {pool.id} is {pool.protocol}, the listener {protocol}")


@router.post("/load-balancers/{lb_id}/listeners", status_code=201, response_model=ListenerOut)
def create_listener(lb_id: str, body: ListenerCreate, request: Request,
                    p: Principal = Depends(require_tenant_api)) -> ListenerOut:
    with db_of(request).write(tenants=tenant_of(p, m.LoadBalancer, lb_id)) as t:
        s = t.session
        lb = owned(s, m.LoadBalancer, lb_id, p, "load balancer")
        _check_pool_for(s, body.default_pool_id, lb, body.protocol, p)
        if s.execute(select(m.LbListener.id).where(m.LbListener.load_balancer_id == lb.id,
                                                   m.LbListener.protocol == body.protocol,
                                                   m.LbListener.port == body.port)).first():
            raise conflict("port", f"load balancer {lb.id} already listens on {body.protocol} {body.port}")
        listener = m.LbListener(tenant_id=lb.tenant_id, load_balancer_id=lb.id, **body.model_dump())
        s.add(listener)
        s.flush()
        return ListenerOut.model_validate(listener)


@router.get("/load-balancers/{lb_id}/listeners", response_model=list[ListenerOut])
def list_listeners(lb_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> list[ListenerOut]:
    with db_of(request).read() as s:
        lb = owned(s, m.LoadBalancer, lb_id, p, "load balancer")
        rows = s.execute(select(m.LbListener).where(m.LbListener.load_balancer_id == lb.id)
                         .order_by(m.LbListener.port)).scalars()
        return [ListenerOut.model_validate(x) for x in rows]


@router.delete("/listeners/{listener_id}", status_code=204)
def delete_listener(listener_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.LbListener, listener_id)) as t:
        listener = owned(t.session, m.LbListener, listener_id, p, "listener")
        t.session.delete(listener)


# --- pools -----------------------------------------------------------------------------------------------------
@router.post("/pools", status_code=201, response_model=PoolOut)
def create_pool(body: PoolCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> PoolOut:
    with db_of(request).write(tenants=tenant_of(p, m.LoadBalancer, body.load_balancer_id)) as t:
        s = t.session
        lb = owned(s, m.LoadBalancer, body.load_balancer_id, p, "load balancer", "load_balancer_id")
        if s.execute(select(m.LbPool.id).where(m.LbPool.load_balancer_id == lb.id,
                                               m.LbPool.name == body.name)).first():
            raise conflict("name", f"load balancer {lb.id} already has a pool named {body.name!r}")
        pool = m.LbPool(tenant_id=lb.tenant_id, **body.model_dump())
        s.add(pool)
        s.flush()
        return pool_out(s, pool)


@router.get("/pools", response_model=list[PoolOut])
def list_pools(request: Request, response: Response, page: Page = Depends(),
               p: Principal = Depends(require_tenant_api)) -> list[PoolOut]:
    with db_of(request).read() as s:
        stmt = scoped(select(m.LbPool), m.LbPool, p)
        return [pool_out(s, x) for x in paged(s, stmt, m.LbPool, [m.LbPool.name], page, p, request, response)]


@router.get("/pools/{pool_id}", response_model=PoolOut)
def get_pool(pool_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> PoolOut:
    with db_of(request).read() as s:
        return pool_out(s, owned(s, m.LbPool, pool_id, p, "pool"))


def _delete_pool(s: Session, pool: m.LbPool) -> None:
    for x in _members(s, pool.id):
        s.delete(x)
    if (hm := s.get(m.LbHealthMonitor, pool.id)) is not None:
        s.delete(hm)
    s.flush()
    s.delete(pool)
    s.flush()


@router.delete("/pools/{pool_id}", status_code=204)
def delete_pool(pool_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.LbPool, pool_id)) as t:
        s = t.session
        pool = owned(s, m.LbPool, pool_id, p, "pool")
        users = s.execute(select(m.LbListener.id).where(m.LbListener.default_pool_id == pool.id)).scalars().all()
        if users:
            raise conflict(None, f"pool {pool.id} is the default pool of listener(s) {', '.join(users)}; "
                                 f"delete them or point them elsewhere first")
        _delete_pool(s, pool)


# --- members ---------------------------------------------------------------------------------------------------
@router.post("/pools/{pool_id}/members", status_code=201, response_model=MemberOut)
def add_member(pool_id: str, body: MemberCreate, request: Request,
               p: Principal = Depends(require_tenant_api)) -> MemberOut:
    def txn() -> MemberOut:
        with db_of(request).write(tenants=tenant_of(p, m.LbPool, pool_id)) as t:
            s = t.session
            pool = owned(s, m.LbPool, pool_id, p, "pool")
            lb = s.get(m.LoadBalancer, pool.load_balancer_id)
            port = owned(s, m.Port, body.port_id, p, "port", "port_id", tenant=pool.tenant_id)
            if port.vpc_id != lb.vpc_id:
                raise invalid("port_id", f"port {port.id} is not in the load balancer's VPC {lb.vpc_id}")
            if port.id == lb.vip_port_id:
                raise invalid("port_id", "the VIP's own port cannot be a member")
            # once per pool: the vSwitch next to a member tells the pool's members apart by their port's MAC
            if s.execute(select(m.LbMember.id).where(m.LbMember.pool_id == pool.id,
                                                     m.LbMember.port_id == port.id)).first():
                raise conflict("port_id", f"port {port.id} is already a member of pool {pool.id}: a port is a "
                                          "member of a pool once (put its other service port in another pool)")
            if (len(_members(s, pool.id)) + 1) * 100 > pool.table_size:
                raise conflict("port_id", f"pool {pool.id} has table_size {pool.table_size}: Maglev keeps at least 100 "
                                          f"entries per member, so it takes {pool.table_size // 100} members; "
                                          "create a pool with a larger table_size (a prime) for more")
            monitored = s.get(m.LbHealthMonitor, pool.id) is not None
            x = m.LbMember(tenant_id=pool.tenant_id, pool_id=pool.id, port_id=port.id,
                           protocol_port=body.protocol_port, weight=body.weight,
                           operating_status=_initial_status(monitored, body.weight))
            s.add(x)
            s.flush()
            return member_out(s, x)

    return with_retries(txn, "member creation")


def _initial_status(monitored: bool, weight: int) -> str:
    """Until a health check says otherwise: unmonitored members count as healthy, monitored ones as not yet up."""
    if weight == 0:
        return "DRAINING"
    return "OFFLINE" if monitored else "NO_MONITOR"


@router.get("/pools/{pool_id}/members", response_model=list[MemberOut])
def list_members(pool_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> list[MemberOut]:
    with db_of(request).read() as s:
        pool = owned(s, m.LbPool, pool_id, p, "pool")
        return [member_out(s, x) for x in _members(s, pool.id)]


def _member(s: Session, pool_id: str, member_id: str, p: Principal) -> tuple[m.LbPool, m.LbMember]:
    pool = owned(s, m.LbPool, pool_id, p, "pool")
    x = s.get(m.LbMember, member_id)
    if x is None or x.pool_id != pool.id:
        raise not_found("member", member_id)
    return pool, x


@router.patch("/pools/{pool_id}/members/{member_id}", response_model=MemberOut)
def update_member(pool_id: str, member_id: str, body: MemberUpdate, request: Request,
                  p: Principal = Depends(require_tenant_api)) -> MemberOut:
    """The weight; 0 drains (no new connections; established ones end after the pool's deregistration delay)."""
    with db_of(request).write(tenants=tenant_of(p, m.LbPool, pool_id)) as t:
        s = t.session
        pool, x = _member(s, pool_id, member_id, p)
        if (x.weight == 0) != (body.weight == 0):
            x.operating_status = _initial_status(s.get(m.LbHealthMonitor, pool.id) is not None, body.weight)
            x.status_changed_at = m.now()
        x.weight = body.weight
        s.flush()
        return member_out(s, x)


@router.delete("/pools/{pool_id}/members/{member_id}", status_code=204)
def remove_member(pool_id: str, member_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.LbPool, pool_id)) as t:
        pool, x = _member(t.session, pool_id, member_id, p)
        t.session.delete(x)


# --- health monitors -------------------------------------------------------------------------------------------
@router.put("/pools/{pool_id}/health-monitor", response_model=HealthMonitorOut)
def put_monitor(pool_id: str, body: HealthMonitorPut, request: Request,
                p: Principal = Depends(require_tenant_api)) -> HealthMonitorOut:
    with db_of(request).write(tenants=tenant_of(p, m.LbPool, pool_id)) as t:
        s = t.session
        pool = owned(s, m.LbPool, pool_id, p, "pool")
        hm = s.get(m.LbHealthMonitor, pool.id)
        if hm is None:
            hm = m.LbHealthMonitor(pool_id=pool.id, tenant_id=pool.tenant_id, **body.model_dump())
            s.add(hm)
            for x in _members(s, pool.id):
                if x.operating_status == "NO_MONITOR":
                    x.operating_status, x.status_changed_at = "OFFLINE", m.now()  # until a check passes
        else:
            for k, v in body.model_dump().items():
                setattr(hm, k, v)
        s.flush()
        return HealthMonitorOut.model_validate(hm, from_attributes=True)


@router.get("/pools/{pool_id}/health-monitor", response_model=HealthMonitorOut)
def get_monitor(pool_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> HealthMonitorOut:
    with db_of(request).read() as s:
        pool = owned(s, m.LbPool, pool_id, p, "pool")
        if (hm := s.get(m.LbHealthMonitor, pool.id)) is None:
            raise not_found("health monitor of pool", pool.id)
        return HealthMonitorOut.model_validate(hm, from_attributes=True)


@router.delete("/pools/{pool_id}/health-monitor", status_code=204)
def delete_monitor(pool_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    """Members become NO_MONITOR: treated as healthy."""
    with db_of(request).write(tenants=tenant_of(p, m.LbPool, pool_id)) as t:
        s = t.session
        pool = owned(s, m.LbPool, pool_id, p, "pool")
        if (hm := s.get(m.LbHealthMonitor, pool.id)) is None:
            raise not_found("health monitor of pool", pool.id)
        s.delete(hm)
        for x in _members(s, pool.id):
            if x.weight > 0 and x.operating_status != "NO_MONITOR":
                x.operating_status, x.status_changed_at = "NO_MONITOR", m.now()
