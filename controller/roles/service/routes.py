"""Services outside every VPC and their endpoints in the consumers' subnets (AWS PrivateLink's interface endpoints).

The operator registers a shared service on the service network (`POST /v1/services {name, addresses, ports}`:
the cluster's object store, a database); a tenant may publish its own load balancer to tenants it names
(`POST /v1/services {load_balancer_id, allowed_tenants}`). A tenant that may use a service creates an endpoint
in one of its subnets (`POST /v1/service-endpoints`): an address of that subnet, held by a port of its own (IPAM,
the VPC's uniqueness rules and security groups apply as to any port), and a name, `<service>.<vpc>.internal`.
One endpoint per service and VPC. Tenants see a service's name and ports, never its addresses or who else uses
it; the owner (the admin, or the publishing tenant) sees all of it."""

from __future__ import annotations

import ipaddress
import re

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.api import quotas
from controller.api.common import Page, WriteRoute, db_of, owned, paged, scoped, tenant_of, with_retries
from controller.api.ports import insert_ports
from controller.api.schemas import PortCreate
from controller.auth import Principal, require_tenant_api
from controller.errors import ApiError, conflict, invalid
from controller.roles.service.schemas import EndpointCreate, EndpointOut, ServiceCreate, ServiceOut, ServiceUpdate
from controller.settings import Settings
from controller.state import models as m
from controller.state.service_models import may_use
from controller.state.table_base import new_id

router = APIRouter(tags=["services"], route_class=WriteRoute)


def usable_by(svc: m.Service, tenant_id: str) -> bool:
    """Whether a tenant may reach the service: its own, one shared with every tenant (the operator's without a
    list), or one whose list names it."""
    return may_use(svc.tenant_id, svc.allowed_tenants, tenant_id)


def _sees_whole(p: Principal, svc: m.Service) -> bool:
    return p.is_admin or (svc.tenant_id is not None and svc.tenant_id == p.tenant_id)


def _listeners(s: Session, lb_id: str) -> list[dict]:
    return [{"protocol": "udp" if proto == "udp" else "tcp", "port": port} for proto, port in s.execute(
        select(m.LbListener.protocol, m.LbListener.port).where(m.LbListener.load_balancer_id == lb_id)
        .order_by(m.LbListener.protocol, m.LbListener.port))]


def service_out(s: Session, svc: m.Service, p: Principal) -> ServiceOut:
    lb = s.get(m.LoadBalancer, svc.load_balancer_id) if svc.load_balancer_id else None
    out = ServiceOut(id=svc.id, name=svc.name, kind="load-balancer" if lb else "shared",
                     ports=_listeners(s, lb.id) if lb else svc.ports, proxy_protocol=svc.proxy_protocol,
                     created_at=svc.created_at)
    if _sees_whole(p, svc):
        out.owner_tenant_id, out.load_balancer_id = svc.tenant_id, svc.load_balancer_id
        out.addresses = [lb.vip_address] if lb else list(svc.addresses)
        out.allowed_tenants = svc.allowed_tenants
        out.endpoints = s.execute(select(func.count()).select_from(m.ServiceEndpoint)
                                  .where(m.ServiceEndpoint.service_id == svc.id)).scalar_one()
    return out


def _check_addresses(s: Session, settings: Settings, addresses: list[str]) -> None:
    """A service's address is on the service network and nothing else's: not the underlay (a host's VTEP, the
    operator's underlay networks), not an EIP pool, not a range tenants may number VPCs from, not another
    service's address."""
    net = ipaddress.ip_network(settings.service_network) if settings.service_network else None
    pools = [ipaddress.ip_network(c) for c in s.execute(select(m.EipPool.cidr)).scalars()]
    pools += [ipaddress.ip_network(settings.eip_pool)] if settings.eip_pool else []
    underlay = [ipaddress.ip_network(c) for c in settings.underlay_cidrs]
    vteps = set(s.execute(select(m.Host.vtep_ip)).scalars())
    public = [ipaddress.ip_network(c) for c in settings.vpc_public_cidrs]
    taken = {a for row in s.execute(select(m.Service.addresses)).scalars() for a in row}
    for i, a in enumerate(addresses):
        ip, field = ipaddress.ip_address(a), f"addresses.{i}"
        if net is not None and ip not in net:
            raise invalid(field, f"{a} is not on the service network {net} (TIANJI_SERVICE_NETWORK)")
        u = next((n for n in underlay if ip in n), None)
        if a in vteps or u is not None:
            raise conflict(field, f"{a} is on the underlay ({u or 'a host VTEP'}): a service's address must not "
                                  "be reachable as an underlay address")
        if (pool := next((n for n in pools if ip in n), None)) is not None:
            raise conflict(field, f"{a} is in the EIP pool {pool}: public addresses are tenants' EIPs")
        if (pub := next((n for n in public if ip in n), None)) is not None:
            raise conflict(field, f"{a} is in {pub}, which tenants may use as VPC addresses")
        if a in taken:
            raise conflict(field, f"{a} is already another service's address")
        if settings.service_source_pool and ip in ipaddress.ip_network(settings.service_source_pool):
            raise conflict(field, f"{a} is in the endpoints' source pool {settings.service_source_pool} "
                                  "(TIANJI_SERVICE_SOURCE_POOL)")


def _check_tenants(s: Session, ids: list[str] | None, p: Principal) -> None:
    """The operator's lists are checked; a tenant's are taken as given (an id of no tenant never matches), so that
    the answer does not tell it which tenant ids exist."""
    if not p.is_admin:
        return
    for i, t in enumerate(ids or []):
        if s.get(m.Tenant, t) is None:
            raise invalid(f"allowed_tenants.{i}", f"no tenant {t}")


def _label(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63] or "x"


@router.post("/services", status_code=201, response_model=ServiceOut)
def create_service(body: ServiceCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> ServiceOut:
    settings: Settings = request.app.state.settings
    if body.load_balancer_id is None and not p.is_admin:
        raise ApiError(403, "addresses: a service on the service network is registered by the operator; a tenant "
                            "publishes its own load balancer (load_balancer_id, allowed_tenants)", "addresses")
    tenants = tenant_of(p, m.LoadBalancer, body.load_balancer_id) if body.load_balancer_id else ()
    with db_of(request).write(tenants=tenants) as t:
        s = t.session
        if body.load_balancer_id is not None:
            lb = owned(s, m.LoadBalancer, body.load_balancer_id, p, "load balancer", "load_balancer_id")
            if s.execute(select(m.Service.id).where(m.Service.load_balancer_id == lb.id)).first():
                raise conflict("load_balancer_id", f"load balancer {lb.id} is already published")
            svc = m.Service(name=body.name or _label(lb.name), tenant_id=lb.tenant_id, addresses=[], ports=[],
                            proxy_protocol=body.proxy_protocol, load_balancer_id=lb.id,
                            allowed_tenants=[x for x in body.allowed_tenants or [] if x != lb.tenant_id])
        else:
            assert body.addresses is not None and body.ports is not None and body.name is not None
            _check_addresses(s, settings, body.addresses)
            svc = m.Service(name=body.name, tenant_id=None, addresses=body.addresses,
                            ports=[x.model_dump() for x in body.ports], proxy_protocol=body.proxy_protocol,
                            allowed_tenants=body.allowed_tenants)
        _check_tenants(s, body.allowed_tenants, p)
        if s.execute(select(m.Service.id).where(m.Service.name == svc.name)).first():
            raise conflict("name", f"a service named {svc.name!r} exists: the name is the endpoints' DNS name, "
                                   "pick another")
        s.add(svc)
        s.flush()
        return service_out(s, svc, p)


def _service_for(s: Session, service_id: str, tenant_id: str | None, field: str | None = None) -> m.Service:
    """The service if the tenant may use it (None: the admin, who sees every one); otherwise 404, the answer for
    one that does not exist, so its existence is not revealed."""
    svc = s.get(m.Service, service_id)
    if svc is None or not (tenant_id is None or usable_by(svc, tenant_id)):
        raise ApiError(404, f"service {service_id} not found, or not shared with this tenant", field)
    return svc


def _visible_service(s: Session, service_id: str, p: Principal) -> m.Service:
    return _service_for(s, service_id, None if p.is_admin else p.tenant_id or "")


@router.get("/services", response_model=list[ServiceOut])
def list_services(request: Request, p: Principal = Depends(require_tenant_api)) -> list[ServiceOut]:
    with db_of(request).read() as s:
        rows = s.execute(select(m.Service).order_by(m.Service.name)).scalars()
        return [service_out(s, x, p) for x in rows if p.is_admin or usable_by(x, p.tenant_id or "")]


@router.get("/services/{service_id}", response_model=ServiceOut)
def get_service(service_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> ServiceOut:
    with db_of(request).read() as s:
        return service_out(s, _visible_service(s, service_id, p), p)


def _owned_service(s: Session, service_id: str, p: Principal) -> m.Service:
    svc = _visible_service(s, service_id, p)
    if not _sees_whole(p, svc):
        raise ApiError(403, f"service {svc.name} is not yours: only its owner changes it")
    return svc


@router.patch("/services/{service_id}", response_model=ServiceOut)
def update_service(service_id: str, body: ServiceUpdate, request: Request,
                   p: Principal = Depends(require_tenant_api)) -> ServiceOut:
    """Who may use it (`allowed_tenants`; null: every tenant, for the operator's). Endpoints of tenants no longer
    allowed stay until deleted but carry nothing (the data path checks the list)."""
    with db_of(request).write(tenants=lambda s: [s.execute(select(m.Service.tenant_id)
                                                           .where(m.Service.id == service_id)).scalar()]) as t:
        s = t.session
        svc = _owned_service(s, service_id, p)
        _check_tenants(s, body.allowed_tenants, p)
        if body.allowed_tenants is None and svc.tenant_id is not None:
            raise invalid("allowed_tenants", "a published load balancer names the tenants it is shared with")
        svc.allowed_tenants = [x for x in body.allowed_tenants if x != svc.tenant_id] \
            if body.allowed_tenants is not None else None
        s.flush()
        return service_out(s, svc, p)


@router.delete("/services/{service_id}", status_code=204)
def delete_service(service_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=lambda s: [s.execute(select(m.Service.tenant_id)
                                                           .where(m.Service.id == service_id)).scalar()]) as t:
        s = t.session
        svc = _owned_service(s, service_id, p)
        n = s.execute(select(func.count()).select_from(m.ServiceEndpoint)
                      .where(m.ServiceEndpoint.service_id == svc.id)).scalar_one()
        if n:
            raise conflict(None, f"service {svc.name} has {n} endpoint(s) in tenants' VPCs: they must be deleted "
                                 "first (their owners: DELETE /v1/service-endpoints/ID)")
        s.delete(svc)


# --- endpoints ---------------------------------------------------------------------------------------------------
def endpoint_out(s: Session, ep: m.ServiceEndpoint) -> EndpointOut:
    groups = sorted(s.execute(select(m.PortSecurityGroup.group_id)
                              .where(m.PortSecurityGroup.port_id == ep.port_id)).scalars())
    return EndpointOut(id=ep.id, tenant_id=ep.tenant_id, vpc_id=ep.vpc_id, subnet_id=ep.subnet_id,
                       service_id=ep.service_id, service_name=s.get(m.Service, ep.service_id).name,
                       port_id=ep.port_id, address=ep.address, dns_name=ep.dns_name, security_group_ids=groups,
                       source_address=ep.source_address or (s.get(m.Port, ep.provider_port_id).ip
                                                            if ep.provider_port_id else None),
                       created_at=ep.created_at)


def _endpoint_port(t, body: EndpointCreate, svc: m.Service, p: Principal, settings: Settings):
    return insert_ports(t, [PortCreate(subnet_id=body.subnet_id, name=f"endpoint-{svc.name}"[:64], ip=body.ip,
                                       security_group_ids=body.security_group_ids)],
                        p, bulk=False, quota=settings.quotas)[0]


def _provider_port(t, lb: m.LoadBalancer, endpoint_id: str, settings: Settings):
    """A published load balancer's side of an endpoint: a port in the provider's VIP subnet, its connections'
    source there (the provider tells consumers apart by it, or by the PROXY header), on the provider's quota.
    Named by the endpoint's id (the PROXY header's too), never by anything of the consumer's."""
    owner = Principal(kind="tenant", tenant_id=lb.tenant_id)
    return insert_ports(t, [PortCreate(subnet_id=lb.subnet_id, name=f"consumer-{endpoint_id}")], owner,
                        bulk=False, quota=settings.quotas)[0]


def _endpoint_tenants(p: Principal, body: EndpointCreate):
    """The consumer's tenant, and a published load balancer's owner (its VPC gets the endpoint's provider port)."""
    mine = tenant_of(p, m.Vpc, body.vpc_id)
    return lambda s: [*mine(s), s.execute(select(m.Service.tenant_id).where(m.Service.id == body.service_id))
                      .scalar()]


def _source_address(s: Session, settings: Settings) -> str | None:
    """The lowest free address of the endpoints' source pool (a concurrent create that took it too loses on the
    unique constraint and runs again); None without a pool. A full pool is a 409 that says what to do."""
    if not settings.service_source_pool:
        return None
    pool = ipaddress.IPv4Network(settings.service_source_pool)
    used = {int(ipaddress.IPv4Address(a)) for a in s.execute(
        select(m.ServiceEndpoint.source_address).where(m.ServiceEndpoint.source_address.is_not(None))).scalars()}
    first, last = int(pool.network_address) + 1, int(pool.broadcast_address) - 1
    free = next((a for a in range(first, last + 1) if a not in used), None)
    if free is None:
        raise conflict("service_id", f"the endpoints' source pool {pool} is full: the operator widens "
                                     "TIANJI_SERVICE_SOURCE_POOL")
    return str(ipaddress.IPv4Address(free))


@router.post("/service-endpoints", status_code=201, response_model=EndpointOut)
def create_endpoint(body: EndpointCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> Response:
    settings: Settings = request.app.state.settings

    def txn() -> EndpointOut:  # again if a concurrent create won the address or the (VPC, service) pair
        with db_of(request).write(tenants=_endpoint_tenants(p, body)) as t:
            s = t.session
            vpc = owned(s, m.Vpc, body.vpc_id, p, "VPC", "vpc_id")
            subnet = owned(s, m.Subnet, body.subnet_id, p, "subnet", "subnet_id", tenant=vpc.tenant_id)
            if subnet.vpc_id != vpc.id:
                raise invalid("subnet_id", f"subnet {subnet.id} is not in VPC {vpc.id}")
            svc = _service_for(s, body.service_id, vpc.tenant_id, "service_id")
            if svc.load_balancer_id and (lb := s.get(m.LoadBalancer, svc.load_balancer_id)).vpc_id == vpc.id:
                raise conflict("service_id", f"the load balancer behind {svc.name} is in this VPC: use its VIP "
                                             f"{lb.vip_address}")
            if (other := s.execute(select(m.ServiceEndpoint.id).where(
                    m.ServiceEndpoint.vpc_id == vpc.id, m.ServiceEndpoint.service_id == svc.id)).scalar()):
                raise conflict("service_id", f"VPC {vpc.name} already has an endpoint of {svc.name} ({other}): one "
                                             "per service and VPC")
            quotas.check(s, settings.quotas, vpc.tenant_id, "service_endpoints")
            port = _endpoint_port(t, body, svc, p, settings)
            ep_id = new_id()
            provider = _provider_port(t, lb, ep_id, settings) if svc.load_balancer_id else None
            t.flush_deferred()  # the endpoint's port rows, which the endpoint refers to
            ep = m.ServiceEndpoint(id=ep_id, tenant_id=vpc.tenant_id, vpc_id=vpc.id, subnet_id=subnet.id,
                                   service_id=svc.id, port_id=port.id, address=port.ip,
                                   dns_name=f"{svc.name}.{_label(vpc.name)}.internal",
                                   source_address=None if provider else _source_address(s, settings),
                                   provider_port_id=provider.id if provider else None)
            s.add(ep)
            s.flush()
            return endpoint_out(s, ep)

    out = with_retries(txn, "service endpoint creation")
    return Response(out.model_dump_json(), status_code=201, media_type="application/json")


@router.get("/service-endpoints", response_model=list[EndpointOut])
def list_endpoints(request: Request, response: Response, page: Page = Depends(),
                   p: Principal = Depends(require_tenant_api)) -> list[EndpointOut]:
    with db_of(request).read() as s:
        stmt = scoped(select(m.ServiceEndpoint), m.ServiceEndpoint, p)
        return [endpoint_out(s, x) for x in paged(s, stmt, m.ServiceEndpoint, [m.ServiceEndpoint.created_at], page,
                                                  p, request, response)]


@router.get("/service-endpoints/{endpoint_id}", response_model=EndpointOut)
def get_endpoint(endpoint_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> EndpointOut:
    with db_of(request).read() as s:
        return endpoint_out(s, owned(s, m.ServiceEndpoint, endpoint_id, p, "service endpoint"))


@router.delete("/service-endpoints/{endpoint_id}", status_code=204)
def delete_endpoint(endpoint_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    """The endpoint and its port: the address goes back to the subnet."""
    mine = tenant_of(p, m.ServiceEndpoint, endpoint_id)

    def tenants(s: Session) -> list[str | None]:  # and a published load balancer's owner (the provider port)
        return [*mine(s), s.execute(select(m.Service.tenant_id).join(
            m.ServiceEndpoint, m.ServiceEndpoint.service_id == m.Service.id).where(
            m.ServiceEndpoint.id == endpoint_id)).scalar()]

    with db_of(request).write(tenants=tenants) as t:
        s = t.session
        ep = owned(s, m.ServiceEndpoint, endpoint_id, p, "service endpoint")
        ports = [s.get(m.Port, i) for i in (ep.port_id, ep.provider_port_id) if i]
        s.delete(ep)
        s.flush()
        for port in ports:
            s.delete(port)
