"""Private lines: a customer's data center into a VPC over a VLAN on the gateways' handoff, with BGP.

The tenant creates a line (`POST /v1/private-lines`); the live gateway instances of role `private-line` carry its
sessions (controller/southbound/placement.line_sessions) and report what their BGP daemons learned
(`PUT /v1/gateways/{name}/private-lines/{id}`). Accepted prefixes become routes of the VPC (origin `bgp`, target
`private-line:ID`) through the instances that learned them; a prefix inside the VPC's CIDR is refused and shown."""

from __future__ import annotations

import ipaddress

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from controller.api import quotas
from controller.api.common import Page, WriteRoute, db_of, owned, paged, scoped, tenant_of, visible
from controller.api.ops_schemas import LineReportAnswer
from controller.auth import Principal, own_host, require_admin, require_infra, require_tenant_api
from controller.errors import conflict, invalid, not_found
from controller.roles.line.placement import placed_of, settle
from controller.roles.line.schemas import (
    LearnedRoute,
    LineReport,
    LinkPair,
    PrivateLineCreate,
    PrivateLineOut,
    PrivateLineUpdate,
    RefusedPrefix,
    SessionOut,
)
from controller.roles.line.sections import LINE_ROLE, live_line_instances, pairs_of, session_instances
from controller.southbound.placement import line_sessions
from controller.state import models as m

router = APIRouter(tags=["private lines"], route_class=WriteRoute)


def refused_of(vpc_cidr: str, prefixes: list[str]) -> tuple[list[str], list[RefusedPrefix]]:
    """A learned prefix that is the VPC's own CIDR or a more specific of it would take the VPC's traffic away from
    it: refused, and reported. A covering one (a default route from the site) is kept: the VPC's local route is
    more specific and wins, as for a user's route."""
    own = ipaddress.ip_network(vpc_cidr)
    kept, refused = [], []
    for p in prefixes:
        if ipaddress.ip_network(p).subnet_of(own):
            refused.append(RefusedPrefix(prefix=p, reason=f"inside the VPC's CIDR {vpc_cidr}"))
        else:
            kept.append(p)
    return kept, refused


def line_out(s: Session, line: m.PrivateLine, asn: int, instances: dict[str, str] | None = None) -> PrivateLineOut:
    vpc = s.get(m.Vpc, line.vpc_id)
    live = live_line_instances(s) if instances is None else instances
    reports = {(r.instance, r.local_ip): r for r in s.execute(
        select(m.PrivateLineSession).where(m.PrivateLineSession.line_id == line.id)).scalars()}
    sessions = []
    where = placed_of(s, line.id)
    placed = line_sessions(line.id, pairs_of(line), live, where)
    carrying = session_instances(line.id, line.secondary_local_ip is not None, live, where)
    for inst, local, customer in placed:
        r = reports.get((inst, local.split("/")[0]))
        sessions.append(SessionOut(
            instance=inst, local_ip=local, customer_ip=customer,
            bgp_state=r.bgp_state if r else "Idle", bfd_state=r.bfd_state if r else "down",
            received=r.received if r else 0, accepted=r.accepted if r else 0, advertised=r.advertised if r else 0,
            refused=[RefusedPrefix(**x) for x in (r.refused if r else [])],
            last_error=r.last_error if r else ("no live private-line gateway instance" if inst is None
                                                else f"no report yet from instance {inst}"),
            updated_at=r.updated_at if r else None))
    learned: dict[str, list[str]] = {}
    for prefix, inst in s.execute(select(m.PrivateLineLearned.prefix, m.PrivateLineLearned.instance)
                                  .where(m.PrivateLineLearned.line_id == line.id)
                                  .order_by(m.PrivateLineLearned.prefix, m.PrivateLineLearned.instance)):
        if inst in carrying:
            learned.setdefault(prefix, []).append(inst)
    statics = sorted(s.execute(select(m.PrivateLineStaticRoute.destination)
                               .where(m.PrivateLineStaticRoute.line_id == line.id)).scalars())
    secondary = LinkPair.model_construct(local_ip=f"{line.secondary_local_ip}/{line.prefixlen}",
                                         customer_ip=f"{line.secondary_customer_ip}/{line.prefixlen}") \
        if line.secondary_local_ip else None
    return PrivateLineOut(
        id=line.id, tenant_id=line.tenant_id, vpc_id=line.vpc_id, name=line.name, vlan_id=line.vlan_id,
        customer_asn=line.customer_asn, local_asn=asn, customer_ip=f"{line.customer_ip}/{line.prefixlen}",
        local_ip=f"{line.local_ip}/{line.prefixlen}", secondary=secondary, md5=line.md5_password is not None,
        max_prefixes=line.max_prefixes, static_routes=statics, advertised=[vpc.cidr], sessions=sessions,
        learned_routes=[LearnedRoute(prefix=p, instances=i) for p, i in learned.items()], created_at=line.created_at)


def _check_static(vpc: m.Vpc, routes: list[str]) -> None:
    for i, r in enumerate(routes):
        if ipaddress.ip_network(r).overlaps(ipaddress.ip_network(vpc.cidr)):
            raise conflict(f"static_routes.{i}", f"{r} overlaps the VPC's CIDR {vpc.cidr}: the VPC's own addresses "
                                                 "are not reached over the line")


@router.post("/private-lines", status_code=201, response_model=PrivateLineOut)
def create_line(body: PrivateLineCreate, request: Request, p: Principal = Depends(require_tenant_api)) \
        -> PrivateLineOut:
    settings = request.app.state.settings
    if body.customer_asn == settings.private_line_asn:
        raise invalid("customer_asn", f"{body.customer_asn} is the cloud's own ASN (the sessions are eBGP): use the "
                                      "customer's AS number")
    if body.vlan_id in settings.private_line_reserved_vlans:
        raise invalid("vlan_id", f"VLAN {body.vlan_id} is reserved on the handoff (reserved: "
                                 f"{', '.join(map(str, settings.private_line_reserved_vlans))}); pick another")
    with db_of(request).write(tenants=tenant_of(p, m.Vpc, body.vpc_id)) as t:
        s = t.session
        vpc = owned(s, m.Vpc, body.vpc_id, p, "VPC", "vpc_id")
        own = ipaddress.ip_network(vpc.cidr)
        for field, v in (("local_ip", body.local_ip), ("customer_ip", body.customer_ip),
                         *((("secondary", body.secondary.local_ip),) if body.secondary else ())):
            if ipaddress.IPv4Interface(v).network.overlaps(own):
                raise conflict(field, f"{v} lies in the VPC's CIDR {vpc.cidr}: the line's link needs addresses "
                                      "outside it (e.g. 169.254.0.0/16)")
        _check_static(vpc, body.static_routes)
        if (other := s.execute(select(m.PrivateLine.id, m.PrivateLine.tenant_id)
                               .where(m.PrivateLine.vlan_id == body.vlan_id)).first()):
            whose = f"by private line {other[0]}" if visible(p, other[1]) else "by another tenant"  # never named
            raise conflict("vlan_id", f"VLAN {body.vlan_id} is already used on the handoff ({whose}); pick another")
        if s.execute(select(m.PrivateLine.id).where(m.PrivateLine.vpc_id == vpc.id,
                                                    m.PrivateLine.name == body.name)).first():
            raise conflict("name", f"VPC {vpc.name} already has a private line named {body.name!r}")
        quotas.check(s, settings.quotas, vpc.tenant_id, "private_lines")
        local, customer = ipaddress.IPv4Interface(body.local_ip), ipaddress.IPv4Interface(body.customer_ip)
        sec = body.secondary
        line = m.PrivateLine(
            tenant_id=vpc.tenant_id, vpc_id=vpc.id, name=body.name, vlan_id=body.vlan_id,
            customer_asn=body.customer_asn, customer_ip=str(customer.ip), local_ip=str(local.ip),
            prefixlen=local.network.prefixlen, md5_password=body.md5_password, max_prefixes=body.max_prefixes,
            secondary_local_ip=str(ipaddress.IPv4Interface(sec.local_ip).ip) if sec else None,
            secondary_customer_ip=str(ipaddress.IPv4Interface(sec.customer_ip).ip) if sec else None)
        if sec is not None and ipaddress.IPv4Interface(sec.local_ip).network.prefixlen != line.prefixlen:
            raise invalid("secondary", "both pairs of a line have the same length (/30 or /31)")
        s.add(line)
        s.flush()
        s.add_all([m.PrivateLineStaticRoute(line_id=line.id, destination=d) for d in body.static_routes])
        s.flush()
        settle(s, fresh={line.id}, only={line.id})
        return line_out(s, line, settings.private_line_asn)


@router.get("/private-lines", response_model=list[PrivateLineOut])
def list_lines(request: Request, response: Response, page: Page = Depends(),
               p: Principal = Depends(require_tenant_api)) -> list[PrivateLineOut]:
    with db_of(request).read() as s:
        lines = paged(s, scoped(select(m.PrivateLine), m.PrivateLine, p), m.PrivateLine, [m.PrivateLine.created_at],
                      page, p, request, response)
        live = live_line_instances(s)
        return [line_out(s, x, request.app.state.settings.private_line_asn, live) for x in lines]


@router.get("/private-lines/{line_id}", response_model=PrivateLineOut)
def get_line(line_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> PrivateLineOut:
    with db_of(request).read() as s:
        return line_out(s, owned(s, m.PrivateLine, line_id, p, "private line"),
                        request.app.state.settings.private_line_asn)


@router.patch("/private-lines/{line_id}", response_model=PrivateLineOut)
def update_line(line_id: str, body: PrivateLineUpdate, request: Request,
                p: Principal = Depends(require_tenant_api)) -> PrivateLineOut:
    with db_of(request).write(tenants=tenant_of(p, m.PrivateLine, line_id)) as t:
        s = t.session
        line = owned(s, m.PrivateLine, line_id, p, "private line")
        if "md5_password" in body.model_fields_set:
            line.md5_password = body.md5_password
        if body.max_prefixes is not None:
            line.max_prefixes = body.max_prefixes
        if body.static_routes is not None:
            _check_static(s.get(m.Vpc, line.vpc_id), body.static_routes)
            have = {r.destination: r for r in s.execute(select(m.PrivateLineStaticRoute)
                                                        .where(m.PrivateLineStaticRoute.line_id == line.id)).scalars()}
            for d, r in have.items():
                if d not in body.static_routes:
                    s.delete(r)
            s.add_all([m.PrivateLineStaticRoute(line_id=line.id, destination=d)
                       for d in body.static_routes if d not in have])
        s.flush()
        return line_out(s, line, request.app.state.settings.private_line_asn)


@router.post("/private-lines/{line_id}/rebalance", response_model=PrivateLineOut)
def rebalance_line(line_id: str, request: Request, _: Principal = Depends(require_admin)) -> PrivateLineOut:
    """The operator's: the line's sessions back on their homes among the live instances (the instance weighing
    highest for the line, the redundant pair on the next). Sessions otherwise stay where they run while their
    instance lives, so a returning instance takes nothing back by itself. A session that moves is down until it is
    up again on its new instance (about a second): with a redundant pair, the other session carries meanwhile."""
    with db_of(request).write(tenants=lambda s: [s.execute(select(m.PrivateLine.tenant_id)
                                                            .where(m.PrivateLine.id == line_id)).scalar()]) as t:
        line = t.session.get(m.PrivateLine, line_id)
        if line is None:
            raise not_found("private line", line_id)
        settle(t.session, fresh={line.id}, only={line.id})
        return line_out(t.session, line, request.app.state.settings.private_line_asn)


@router.delete("/private-lines/{line_id}", status_code=204)
def delete_line(line_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.PrivateLine, line_id)) as t:
        s = t.session
        line = owned(s, m.PrivateLine, line_id, p, "private line")
        for model in (m.PrivateLineStaticRoute, m.PrivateLineLearned, m.PrivateLineSession, m.PrivateLinePlacement):
            for row in s.execute(select(model).where(model.line_id == line.id)).scalars():
                s.delete(row)
        s.flush()
        s.delete(line)


@router.put("/gateways/{name}/private-lines/{line_id}", response_model=LineReportAnswer)
def report_line(name: str, line_id: str, body: LineReport, request: Request,
                p: Principal = Depends(require_infra)) -> dict:
    """An instance's sessions of a line as its BGP daemon sees them. The prefixes it accepted replace what it had
    learned for the line (the VPC is stamped only when they changed); prefixes inside the VPC's CIDR and those over
    `max_prefixes` are refused and shown in the session's status."""
    own_host(p, name, "gateway")
    def tenants(s: Session) -> list[str | None]:  # the line's tenant (a host token belongs to none), read first
        return [s.execute(select(m.PrivateLine.tenant_id).where(m.PrivateLine.id == line_id)).scalar()]

    with db_of(request).write(tenants=tenants) as t:
        s = t.session
        line = s.get(m.PrivateLine, line_id)
        if line is None:
            raise not_found("private line", line_id)
        host = s.get(m.Host, name)
        if host is None or host.kind != "gateway" or host.role != LINE_ROLE:
            raise conflict(None, f"host {name} is not a private-line gateway instance; register it with role "
                                 "private-line")
        vpc = s.get(m.Vpc, line.vpc_id)
        mine = {x[1].split("/")[0] for x in line_sessions(line.id, pairs_of(line), live_line_instances(s),
                                                          placed_of(s, line.id)) if x[0] == name}
        accepted: set[str] = set()
        s.execute(delete(m.PrivateLineSession).where(m.PrivateLineSession.line_id == line.id,
                                                     m.PrivateLineSession.instance == name))
        for i, r in enumerate(body.sessions):
            local = r.local_ip.split("/")[0]
            if local not in mine:
                raise conflict(f"sessions.{i}.local_ip", f"{r.local_ip} is not a session of line {line.id} placed "
                                                         f"on instance {name}")
            kept, refused = refused_of(vpc.cidr, r.prefixes) if r.bgp_state == "Established" else ([], [])
            taken, over = kept[:line.max_prefixes], kept[line.max_prefixes:]
            refused += [RefusedPrefix(prefix=x, reason=f"over the line's max_prefixes ({line.max_prefixes})")
                        for x in over]
            accepted.update(taken)
            s.add(m.PrivateLineSession(
                line_id=line.id, instance=name, local_ip=local, bgp_state=r.bgp_state, bfd_state=r.bfd_state,
                received=r.received, accepted=len(taken), advertised=r.advertised,
                refused=[x.model_dump() for x in refused], last_error=r.last_error, updated_at=m.now()))
        have = {x.prefix: x for x in s.execute(select(m.PrivateLineLearned).where(
            m.PrivateLineLearned.line_id == line.id, m.PrivateLineLearned.instance == name)).scalars()}
        for prefix, row in have.items():
            if prefix not in accepted:
                s.delete(row)
        s.add_all([m.PrivateLineLearned(line_id=line.id, instance=name, prefix=x)
                   for x in sorted(accepted - have.keys())])
        s.flush()
        return {"accepted": len(accepted), "changed": accepted != set(have)}
