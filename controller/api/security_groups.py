"""Security groups: stateful rule sets attached to ports, scoped to one VPC."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from controller.api import quotas
from controller.api.common import (
    MAX_INT,
    Page,
    WriteRoute,
    db_of,
    owned,
    paged,
    relabel,
    rename,
    scoped,
    tenant_of,
)
from controller.api.schemas import Rename
from controller.api.sg_schemas import ANYWHERE, RuleCreate, RuleOut, SecurityGroupCreate, SecurityGroupOut
from controller.auth import Principal, require_tenant_api
from controller.errors import conflict, invalid, not_found
from controller.state import models as m
from controller.state.db import WriteTxn

router = APIRouter(tags=["security-groups"], route_class=WriteRoute)


def add_rule(t: WriteTxn, sg: m.SecurityGroup, r: RuleCreate, p: Principal, field: str,
             quota: dict[str, int]) -> m.SecurityGroupRule:
    s = t.session
    if r.remote_group_id and r.remote_group_id != sg.id:
        remote = owned(s, m.SecurityGroup, r.remote_group_id, p, "security group", f"{field}.remote_group_id",
                       tenant=sg.tenant_id)
        if remote.vpc_id != sg.vpc_id:
            raise invalid(f"{field}.remote_group_id", "the remote group must be in the same VPC")
    rule = m.SecurityGroupRule(group_id=sg.id, direction=r.direction, protocol=r.protocol, ethertype=r.ethertype,
                               port_range_min=r.port_range_min, port_range_max=r.port_range_max,
                               remote_cidr=r.remote_cidr if r.remote_group_id else (r.remote_cidr
                                                                                    or ANYWHERE[r.ethertype]),
                               remote_group_id=r.remote_group_id, description=r.description)
    same = _what(rule)
    for other in sg.rules:
        if _what(other) == same:
            raise conflict(field if field != "body" else None,
                           f"security group {sg.name} already has this rule (id {other.id})")
    quotas.check(s, quota, sg.tenant_id, "security_group_rules")
    sg.rules.append(rule)
    return rule


def _what(r: m.SecurityGroupRule) -> tuple:
    """What a rule admits (its description aside): two rules admitting the same are one rule twice."""
    return (r.direction, r.ethertype, r.protocol, r.port_range_min, r.port_range_max, r.remote_cidr,
            r.remote_group_id)


def sg_out(sg: m.SecurityGroup) -> SecurityGroupOut:
    return SecurityGroupOut.model_validate(sg)


@router.post("/security-groups", status_code=201, response_model=SecurityGroupOut)
def create_sg(body: SecurityGroupCreate, request: Request,
              p: Principal = Depends(require_tenant_api)) -> SecurityGroupOut:
    with db_of(request).write(tenants=tenant_of(p, m.Vpc, body.vpc_id)) as t:
        s = t.session
        vpc = owned(s, m.Vpc, body.vpc_id, p, "VPC", "vpc_id")
        if s.execute(select(m.SecurityGroup.id).where(m.SecurityGroup.vpc_id == vpc.id,
                                                      m.SecurityGroup.name == body.name)).first():
            raise conflict("name", f"VPC {vpc.name} already has a security group named {body.name!r}")
        quotas.check(s, request.app.state.settings.quotas, vpc.tenant_id, "security_groups")
        sg = m.SecurityGroup(vpc_id=vpc.id, tenant_id=vpc.tenant_id, name=body.name, description=body.description,
                             tags=body.tags)
        s.add(sg)
        s.flush()
        for i, r in enumerate(body.rules):
            add_rule(t, sg, r, p, f"rules.{i}", request.app.state.settings.quotas)
        s.flush()
        s.refresh(sg)
        return sg_out(sg)


@router.get("/security-groups", response_model=list[SecurityGroupOut])
def list_sgs(request: Request, response: Response, vpc_id: str | None = None, page: Page = Depends(),
             p: Principal = Depends(require_tenant_api)) -> list[SecurityGroupOut]:
    with db_of(request).read() as s:
        stmt = scoped(select(m.SecurityGroup), m.SecurityGroup, p).options(selectinload(m.SecurityGroup.rules))
        if vpc_id:
            stmt = stmt.where(m.SecurityGroup.vpc_id == vpc_id)
        return [sg_out(x) for x in paged(s, stmt, m.SecurityGroup, [m.SecurityGroup.vpc_id, m.SecurityGroup.name],
                                         page, p, request, response)]


@router.patch("/security-groups/{sg_id}", response_model=SecurityGroupOut)
def update_sg(sg_id: str, body: Rename, request: Request,
              p: Principal = Depends(require_tenant_api)) -> SecurityGroupOut:
    """A new name, description or tags (the fields given); its rules change with POST and DELETE on /rules."""
    with db_of(request).write(tenants=tenant_of(p, m.SecurityGroup, sg_id)) as t:
        s = t.session
        sg = owned(s, m.SecurityGroup, sg_id, p, "security group")
        if body.name and body.name != sg.name and sg.is_default:
            raise conflict("name", "the VPC's default group keeps its name")
        rename(s, sg, body.name, m.SecurityGroup.vpc_id, "the VPC already has a security group")
        relabel(sg, body)
        s.flush()
        return sg_out(sg)


@router.get("/security-groups/{sg_id}", response_model=SecurityGroupOut)
def get_sg(sg_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> SecurityGroupOut:
    with db_of(request).read() as s:
        return sg_out(owned(s, m.SecurityGroup, sg_id, p, "security group"))


def _in_use(s: Session, sg: m.SecurityGroup) -> str | None:
    n = s.execute(select(func.count()).select_from(m.PortSecurityGroup)
                  .where(m.PortSecurityGroup.group_id == sg.id)).scalar()
    if n:
        return f"security group {sg.name} is used by {n} port(s); detach it first"
    refs = s.execute(select(m.SecurityGroupRule).where(m.SecurityGroupRule.remote_group_id == sg.id,
                                                       m.SecurityGroupRule.group_id != sg.id)).scalars().all()
    if refs:
        return f"security group {sg.name} is referenced by rules of other groups ({', '.join(str(r.id) for r in refs)})"
    return None


@router.delete("/security-groups/{sg_id}", status_code=204)
def delete_sg(sg_id: str, request: Request, p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.SecurityGroup, sg_id)) as t:
        s = t.session
        sg = owned(s, m.SecurityGroup, sg_id, p, "security group")
        if sg.is_default:
            raise conflict(None, "the default security group of a VPC cannot be deleted")
        if reason := _in_use(s, sg):
            raise conflict(None, reason)
        s.delete(sg)  # its rules go with it (delete-orphan cascade)


@router.post("/security-groups/{sg_id}/rules", status_code=201, response_model=RuleOut)
def create_rule(sg_id: str, body: RuleCreate, request: Request, p: Principal = Depends(require_tenant_api)) -> RuleOut:
    with db_of(request).write(tenants=tenant_of(p, m.SecurityGroup, sg_id)) as t:
        sg = owned(t.session, m.SecurityGroup, sg_id, p, "security group")
        rule = add_rule(t, sg, body, p, "body", request.app.state.settings.quotas)
        t.session.flush()
        return RuleOut.model_validate(rule)


@router.delete("/security-groups/{sg_id}/rules/{rule_id}", status_code=204)
def delete_rule(sg_id: str, rule_id: Annotated[int, Path(ge=1, le=MAX_INT)], request: Request,
                p: Principal = Depends(require_tenant_api)) -> None:
    with db_of(request).write(tenants=tenant_of(p, m.SecurityGroup, sg_id)) as t:
        sg = owned(t.session, m.SecurityGroup, sg_id, p, "security group")
        rule = t.session.get(m.SecurityGroupRule, rule_id)
        if rule is None or rule.group_id != sg.id:
            raise not_found("rule", str(rule_id))
        sg.rules.remove(rule)  # delete-orphan cascade deletes it, once
