"""VPCs and their route tables."""

from __future__ import annotations

import ipaddress
from datetime import timedelta

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from controller.api import quotas
from controller.api.common import (
    Page,
    WriteRoute,
    db_of,
    default_group_id,
    owned,
    paged,
    relabel,
    rename,
    scoped,
    tenant_of,
    with_retries,
)
from controller.api.ipam import IpamError, next_vni, router_mac, vpc_space_error
from controller.api.ipam6 import Ipam6Error, next_vpc_cidr6
from controller.api.schemas import Rename, RouteCreate, RouteOut, VpcCreate, VpcOut
from controller.api.sg_schemas import ANYWHERE
from controller.auth import Principal, require_network_read, require_tenant_api
from controller.errors import ApiError, conflict, invalid, not_found
from controller.roles.line.sections import line_route_infos, live_line_instances
from controller.state import models as m
from controller.state.models import now
from controller.state.reads import Q_LINE_ROUTES
from tianji.southbound import VXLAN_OVERHEAD

router = APIRouter(tags=["vpcs"], route_class=WriteRoute)


def vpc_out(s: Session, v: m.Vpc) -> VpcOut:
    out = VpcOut.model_validate(v)
    out.default_security_group_id = default_group_id(s, v.id)
    return out


def allocate_vni(s: Session, lo: int, hi: int, quarantine_s: float) -> int:
    """`ipam.next_vni` over the database: the VNIs of live VPCs and those freed less than `quarantine_s` ago are
    taken. The caller holds the `vni` counter's lock; its value is the last VNI handed out."""
    last = s.execute(select(m.Counter.value).where(m.Counter.name == "vni")).scalar() or 0
    since = now() - timedelta(seconds=quarantine_s)

    def taken(a: int, b: int) -> tuple[set[int], set[int]]:
        used = set(s.execute(select(m.Vpc.vni).where(m.Vpc.vni.between(a, b))).scalars())
        return used, set(s.execute(select(m.FreedVni.vni).where(m.FreedVni.vni.between(a, b),
                                                                 m.FreedVni.freed_at > since)).scalars())

    try:
        vni = next_vni(last, lo, hi, taken)
    except IpamError as e:
        raise ApiError(409, f"{e} for up to {quarantine_s:.0f} s; ask the operator to widen it "
                            "(TIANJI_VNI_RANGE)") from None
    s.execute(update(m.Counter).where(m.Counter.name == "vni").values(value=vni))
    return vni


def vpc_cidr6(s: Session, asked: str | None, pools: list[str]) -> str | None:
    """The VPC's IPv6 /56: none, the lowest free one of the operator's pools ("auto"; the caller holds the `vni`
    counter's lock, which serialises it), or the tenant's own, outside the pools (those are handed out, once)."""
    if asked is None:
        return None
    nets = [ipaddress.IPv6Network(c) for c in pools]
    if asked != "auto":
        if pool := next((p for p in nets if p.overlaps(ipaddress.IPv6Network(asked))), None):
            raise invalid("ipv6_cidr", f"{asked} is in the operator's pool {pool}: ask for \"auto\" to get a /56 of it")
        return asked
    try:
        return str(next_vpc_cidr6(nets, s.execute(select(m.Vpc.ipv6_cidr).where(m.Vpc.ipv6_cidr.is_not(None)))
                                  .scalars()))
    except Ipam6Error as e:
        raise ApiError(409, str(e)) from None


@router.post("/vpcs", status_code=201, response_model=VpcOut)
def create_vpc(body: VpcCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> VpcOut:
    settings = request.app.state.settings
    if why := vpc_space_error(ipaddress.IPv4Network(body.cidr),
                              [ipaddress.IPv4Network(c) for c in settings.vpc_public_cidrs]):
        raise invalid("cidr", why)
    if body.mtu > settings.underlay_mtu - VXLAN_OVERHEAD:
        raise invalid("mtu", f"at most {settings.underlay_mtu - VXLAN_OVERHEAD}: the underlay's MTU is "
                             f"{settings.underlay_mtu} and VXLAN takes {VXLAN_OVERHEAD} bytes of it")
    if p.is_admin:
        if not body.tenant_id:
            raise invalid("tenant_id", "the admin must name the tenant that owns the VPC")
        tenant_id = body.tenant_id
    else:
        if body.tenant_id and body.tenant_id != p.tenant_id:
            raise invalid("tenant_id", "a tenant can only create VPCs for itself")
        tenant_id = p.tenant_id

    def txn() -> VpcOut:
        with db_of(request).write(tenants=[tenant_id]) as t:
            s = t.session
            if s.get(m.Tenant, tenant_id) is None:
                raise not_found("tenant", tenant_id, "tenant_id")
            quotas.check(s, settings.quotas, tenant_id, "vpcs")
            quotas.check(s, settings.quotas, tenant_id, "security_groups")  # its default group
            if s.execute(select(m.Vpc.id).where(m.Vpc.tenant_id == tenant_id, m.Vpc.name == body.name)).first():
                raise conflict("name", f"you already have a VPC named {body.name!r}")
            # serialise VNI allocation (a row lock on PostgreSQL); the unique constraint stays the guarantee
            s.execute(select(m.Counter.value).where(m.Counter.name == "vni").with_for_update())
            vni = allocate_vni(s, settings.vni_min, settings.vni_max, settings.vni_quarantine_s)
            vpc = m.Vpc(tenant_id=tenant_id, name=body.name, cidr=body.cidr, vni=vni, router_mac=router_mac(vni),
                        ipv6_cidr=vpc_cidr6(s, body.ipv6_cidr, settings.ipv6_pools), mtu=body.mtu,
                        description=body.description, tags=body.tags)
            s.add(vpc)
            s.flush()
            sg = m.SecurityGroup(vpc_id=vpc.id, tenant_id=tenant_id, name="default", is_default=True,
                                 description="default: all egress; ingress from members of this group")
            s.add(sg)
            s.flush()
            s.add_all([r for family, anywhere in ANYWHERE.items() for r in (  # both families, with or without IPv6
                m.SecurityGroupRule(group_id=sg.id, direction="egress", protocol="any", ethertype=family,
                                    remote_cidr=anywhere),
                m.SecurityGroupRule(group_id=sg.id, direction="ingress", protocol="any", ethertype=family,
                                    remote_group_id=sg.id))])
            s.flush()
            out = VpcOut.model_validate(vpc)
            out.default_security_group_id = sg.id
            return out

    return with_retries(txn, "VPC creation")


@router.get("/vpcs", response_model=list[VpcOut])
def list_vpcs(request: Request, response: Response, page: Page = Depends(),
              p: Principal = Depends(require_tenant_api)) -> list[VpcOut]:
    with db_of(request).read() as s:
        vpcs = paged(s, scoped(select(m.Vpc), m.Vpc, p), m.Vpc, [m.Vpc.created_at, m.Vpc.name], page, p, request,
                     response)
        groups = dict(s.execute(select(m.SecurityGroup.vpc_id, m.SecurityGroup.id).where(
            m.SecurityGroup.vpc_id.in_([v.id for v in vpcs]), m.SecurityGroup.is_default.is_(True))).all()) \
            if vpcs else {}
        out = []
        for v in vpcs:
            o = VpcOut.model_validate(v)
            o.default_security_group_id = groups.get(v.id)
            out.append(o)
        return out


@router.patch("/vpcs/{vpc_id}", response_model=VpcOut)
def update_vpc(vpc_id: str, body: Rename, request: Request, p: Principal = Depends(require_tenant_api)) -> VpcOut:
    """A new name, description or tags (the fields given). None of these reaches a host's config."""
    with db_of(request).write(tenants=tenant_of(p, m.Vpc, vpc_id)) as t:
        s = t.session
        vpc = owned(s, m.Vpc, vpc_id, p, "VPC")
        rename(s, vpc, body.name, m.Vpc.tenant_id, "the tenant already has a VPC")
        relabel(vpc, body)
        s.flush()
        return vpc_out(s, vpc)


@router.get("/vpcs/{vpc_id}", response_model=VpcOut)
def get_vpc(vpc_id: str, request: Request, p: Principal = Depends(require_network_read)) -> VpcOut:
    with db_of(request).read() as s:
        return vpc_out(s, owned(s, m.Vpc, vpc_id, p, "VPC"))


@router.delete("/vpcs/{vpc_id}", status_code=204)
def delete_vpc(vpc_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.Vpc, vpc_id)) as t:
        s = t.session
        vpc = owned(s, m.Vpc, vpc_id, p, "VPC")
        n_ports = s.execute(select(func.count()).select_from(m.Port).where(m.Port.vpc_id == vpc_id)).scalar()
        n_subnets = s.execute(select(func.count()).select_from(m.Subnet).where(m.Subnet.vpc_id == vpc_id)).scalar()
        if n_ports or n_subnets:
            raise conflict(None, f"VPC {vpc.name} still has {n_subnets} subnet(s) and {n_ports} port(s); "
                                 "delete them first")
        if gws := s.execute(select(m.NatGateway.id).where(m.NatGateway.vpc_id == vpc_id)).scalars().all():
            raise conflict(None, f"VPC {vpc.name} has NAT gateway(s) {', '.join(gws)}; delete them first")
        if lines := s.execute(select(m.PrivateLine.id).where(m.PrivateLine.vpc_id == vpc_id)).scalars().all():
            raise conflict(None, f"VPC {vpc.name} has private line(s) {', '.join(lines)}; delete them first")
        peerings = s.execute(select(m.Peering.id).where(
            (m.Peering.requester_vpc_id == vpc_id) | (m.Peering.accepter_vpc_id == vpc_id))).scalars().all()
        if peerings:
            raise conflict(None, f"VPC {vpc.name} is part of peering(s) {', '.join(peerings)}; delete them first")
        for r in s.execute(select(m.Route).where(m.Route.vpc_id == vpc_id)).scalars():
            s.delete(r)
        for sg in s.execute(select(m.SecurityGroup).where(m.SecurityGroup.vpc_id == vpc_id)).scalars():
            s.delete(sg)  # rules go with their group (delete-orphan cascade)
        s.flush()
        s.merge(m.FreedVni(vni=vpc.vni, freed_at=now()))  # quarantined: see allocate_vni
        s.delete(vpc)


# --- route tables ----------------------------------------------------------------------------------

def parse_target(target: str) -> tuple[str, str]:
    kind, sep, ident = target.partition(":")
    if not sep or not ident:
        raise invalid("target", f"{target!r} is not a route target; use peering:<peering id>")
    if kind not in ("peering", "nat-gateway"):
        raise invalid("target", f"target type {kind!r} is not supported; supported: peering, nat-gateway")
    return kind, ident


def effective_routes(s: Session, vpc: m.Vpc) -> list[RouteOut]:
    routes = [RouteOut(id=None, destination=c, target="local", origin="implicit") for c in (vpc.cidr, vpc.ipv6_cidr)
              if c]
    peerings = s.execute(select(m.Peering).where(
        ((m.Peering.requester_vpc_id == vpc.id) | (m.Peering.accepter_vpc_id == vpc.id)),
        m.Peering.status == "active")).scalars().all()
    active = {}
    for pc in peerings:
        peer_id = pc.accepter_vpc_id if pc.requester_vpc_id == vpc.id else pc.requester_vpc_id
        peer = s.get(m.Vpc, peer_id)
        active[pc.id] = peer
        routes += [RouteOut(id=None, destination=c, target=f"peering:{pc.id}", origin="implicit")
                   for c in (peer.cidr, peer.ipv6_cidr if vpc.ipv6_cidr else None) if c]  # IPv6 when both have it
    gateways = set(s.execute(select(m.NatGateway.id).where(m.NatGateway.vpc_id == vpc.id)).scalars())
    for r in s.execute(select(m.Route).where(m.Route.vpc_id == vpc.id).order_by(m.Route.created_at)).scalars():
        state = "active" if r.target_id in active or r.target_id in gateways else "blackhole"
        routes.append(RouteOut(id=r.id, destination=r.destination, target=f"{r.target_type}:{r.target_id}",
                               origin="user", state=state))
    for r in line_route_infos(s.execute(Q_LINE_ROUTES, {"vpcs": [vpc.id]}).all(), live_line_instances(s),
                              {x.destination for x in routes}):
        routes.append(RouteOut(id=None, destination=r.destination, target=f"private-line:{r.target_id}",
                               origin=r.origin, state="blackhole" if r.target_type == "blackhole" else "active"))
    return routes


@router.get("/vpcs/{vpc_id}/routes", response_model=list[RouteOut])
def list_routes(vpc_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> list[RouteOut]:
    with db_of(request).read() as s:
        return effective_routes(s, owned(s, m.Vpc, vpc_id, p, "VPC"))


@router.post("/vpcs/{vpc_id}/routes", status_code=201, response_model=RouteOut)
def create_route(vpc_id: str, body: RouteCreate, request: Request,
                 p: Principal = Depends(require_tenant_api)) -> RouteOut:
    kind, target_id = parse_target(body.target)
    with db_of(request).write(tenants=tenant_of(p, m.Vpc, vpc_id)) as t:
        s = t.session
        vpc = owned(s, m.Vpc, vpc_id, p, "VPC")
        dest = ipaddress.ip_network(body.destination)
        local = vpc.cidr if dest.version == 4 else vpc.ipv6_cidr
        if local is None:
            raise invalid("destination", f"{dest} is IPv6 and VPC {vpc.name} has no IPv6 CIDR")
        if kind == "nat-gateway" and dest.version == 6:
            raise invalid("destination", "a NAT gateway is IPv4's: IPv6 leaves through an egress-only internet "
                                         "gateway (no translation)")
        if dest.subnet_of(ipaddress.ip_network(local)):
            # a supernet (0.0.0.0/0, ::/0) is fine: the local route is more specific and wins
            raise conflict("destination", f"{body.destination} lies inside the VPC's local route {local}")
        if kind == "peering":
            pc = s.get(m.Peering, target_id)
            if pc is None or vpc_id not in (pc.requester_vpc_id, pc.accepter_vpc_id):
                raise not_found("peering", target_id, "target")
            if pc.status != "active":
                raise conflict("target", f"peering {target_id} is {pc.status}; routes need an active peering")
            peer = s.get(m.Vpc, pc.accepter_vpc_id if pc.requester_vpc_id == vpc_id else pc.requester_vpc_id)
            if dest.version == 6 and peer.ipv6_cidr is None:
                raise invalid("destination", "IPv6 goes over a peering between two dual-stack VPCs; the peer has no "
                                             "IPv6 CIDR")
        else:
            gw = s.get(m.NatGateway, target_id)
            if gw is None or gw.vpc_id != vpc_id:
                raise not_found("NAT gateway", target_id, "target")
        for existing in effective_routes(s, vpc):
            if existing.destination == body.destination:
                raise conflict("destination", f"a route to {body.destination} already exists "
                                              f"(target {existing.target})")
        r = m.Route(vpc_id=vpc_id, tenant_id=vpc.tenant_id, destination=body.destination,
                    target_type=kind, target_id=target_id)
        s.add(r)
        s.flush()
        return RouteOut(id=r.id, destination=r.destination, target=body.target, origin="user")


@router.delete("/vpcs/{vpc_id}/routes/{route_id}", status_code=204)
def delete_route(vpc_id: str, route_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.Vpc, vpc_id)) as t:
        owned(t.session, m.Vpc, vpc_id, p, "VPC")
        r = t.session.get(m.Route, route_id)
        if r is None or r.vpc_id != vpc_id:
            raise not_found("route", route_id)
        t.session.delete(r)
