"""Every gateway role the controller compiles for, by the hosts' role name (`tianji.southbound.GATEWAY_ROLES`)."""

from __future__ import annotations

from controller.roles.lb import sections as lb
from controller.roles.line import sections as line
from controller.roles.nat import sections as nat
from controller.roles.role import RoleCompiler
from controller.roles.service import sections as service
from tianji.southbound import DEFAULT_GATEWAY_ROLE

ROLES: dict[str, RoleCompiler] = {r.name: r for r in (nat.ROLE, lb.ROLE, line.ROLE, service.ROLE)}


def compiler_of(role: str | None) -> RoleCompiler:
    """A gateway host's role compiler (a host with no role is a NAT instance, as it always was)."""
    return ROLES[role or DEFAULT_GATEWAY_ROLE]
