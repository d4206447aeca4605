"""What a gateway role gives the gateway compiler: the reads its sections need and how it compiles them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Select

from controller.southbound.fragments import digest_of
from tianji.southbound import GatewaySection, GatewayVpc, SectionBase

Sections = dict[str, tuple[GatewaySection, str]]  # VPC id -> (its section, the section's digest)


class CompileInputs(NamedTuple):
    """What a role compiles one instance's sections from: the instance, the VPCs to compile (id -> (revision, VNI,
    router MAC, MTU)), the role's reads (key -> rows), each VPC's endpoints, the live instances of this role (none
    live: this one, as if it were), the topology (other roles' instances) and the cloud's BGP ASN."""

    name: str
    vpcs: dict[str, Any]
    rows: dict[str, list]
    endpoints: dict[str, tuple]
    live: dict[str, str]
    topology: Any
    asn: int


@dataclass(frozen=True)
class RoleCompiler:
    name: str  # the hosts' role (tianji.southbound.GatewayRole)
    reads: tuple[tuple[str, Select], ...]  # key -> statement, run with the stale VPCs as `vpcs`
    sections: Callable[[CompileInputs], Sections]


def section_of(cls: type[SectionBase], vid: str, v: Any, **fields: Any) -> tuple[GatewaySection, str]:
    """VPC `vid`'s section of a role (`cls`: its type) with these fields (the others empty), and its digest."""
    sec = cls.model_construct(
        vpc=GatewayVpc.model_construct(id=vid, vni=v.vni, router_mac=v.router_mac, mtu=v.mtu,
                                       snat=fields.pop("snat", [])), **fields)
    return sec, digest_of(sec.model_dump_json())
