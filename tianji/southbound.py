"""The southbound wire schema: what the controller compiles for one host and the agent reconciles to.

This module is the single definition of the watch API's payload; the controller builds it and the
vSwitch agent (and later the gateways) import it. It depends on pydantic only.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, StrictInt, StringConstraints, Tag

from tianji.lb_wire import LbBackendInfo, LbListenerInfo, LbMonitorInfo, LbVipInfo  # noqa: F401 - the contract's
from tianji.memo import Memo
from tianji.served import LbServed, PrivateLineServed, ServiceEndpointServed
from tianji.wire import OVERLAY_MTU, Versioned, Wire

VXLAN_OVERHEAD = 50
GatewayRole = Literal["nat", "lb", "private-line", "service"]  # what a gateway instance serves (its host's role)
GATEWAY_ROLES: tuple[str, ...] = get_args(GatewayRole)
DEFAULT_GATEWAY_ROLE: GatewayRole = "nat"  # a gateway host registered without a role (as every one was at first)


def _none(v: object) -> bool:
    return v is None


def _empty(v: object) -> bool:
    return not v


# IPv6 (schema 1.3) comes in fields of its own, left out of the JSON when a VPC has none: an agent of 1.2 ignores
# them (a VPC's `routes` and a group's `rules` stay IPv4's, so it never meets an address it cannot match), and an
# IPv4-only cloud's configs are the bytes they were.
def V6() -> Any:
    return Field(None, exclude_if=_none)


def V6_LIST() -> Any:
    return Field(default_factory=list, exclude_if=_empty)


class SubnetInfo(Wire):
    id: str
    cidr: str
    gateway_ip: str
    ipv6_cidr: str | None = V6()  # a /64 of the VPC's /56
    ipv6_gateway_ip: str | None = V6()  # the router: the /64's ::1 (RAs come from its link-local address)
    ipv6_address_mode: Literal["slaac", "dhcpv6-stateful"] | None = V6()


class RouteInfo(Wire):
    """One effective route of a VPC. `local` routes stay in the VPC; `peering` routes switch the packet
    to the peer VPC (its VNI) and deliver it directly to the destination host."""

    destination: str
    target_type: Literal["local", "peering", "nat-gateway", "private-line", "blackhole"]
    target_id: str | None = None
    peer_vpc_id: str | None = None  # for peering targets: the VPC the packet enters
    gateway_vteps: list[str] = Field(default_factory=list)  # for gateway targets: the instances serving it
    # for gateway targets: the instance (VTEP) serving each source-address bucket, bucket = source IP & (len - 1)
    gateway_buckets: list[str] = Field(default_factory=list)
    origin: Literal["implicit", "user", "static", "bgp"] = "implicit"  # static, bgp: a private line's


class DnsRecord(Wire):
    """A name the VPC's resolver answers (a service endpoint's)."""

    name: str
    address: str


class VpcInfo(Wire):
    id: str
    tenant_id: str
    vni: int
    cidr: str
    router_mac: str
    mtu: int = OVERLAY_MTU
    ipv6_cidr: str | None = V6()
    subnets: list[SubnetInfo] = Field(default_factory=list)
    routes: list[RouteInfo] = Field(default_factory=list)  # IPv4's
    routes6: list[RouteInfo] = V6_LIST()  # IPv6's, in the same order: local, peerings, the user's, private lines'
    load_balancers: list[LbVipInfo] = Field(default_factory=list)
    dns: list[DnsRecord] = Field(default_factory=list)  # own VPCs: what the resolver at each gateway answers


class PortInfo(Wire):
    """A port bound to this host."""

    id: str
    vpc_id: str
    subnet_id: str
    mac: str
    ip: str
    ipv6: str | None = V6()
    security_group_ids: list[str] = Field(default_factory=list)
    eip_home_vtep: str | None = None  # a port with its own EIP sends off-VPC traffic to the instance homing it
    gateway_ip: str | None = None  # its subnet's gateway: its router, and the VPC's resolver it asks (DNS)


class Endpoint(Wire):
    """Any port this host's ports may reach (same VPC or a peered VPC), local or remote."""

    port_id: str
    vpc_id: str
    vni: int
    ip: str
    mac: str
    host: str
    vtep_ip: str
    ipv6: str | None = V6()
    # a live migration's destination: the port is local there too, and its traffic goes to both hosts (left out of
    # the JSON when none: every endpoint of every config would otherwise carry two nulls)
    also_host: str | None = Field(None, exclude_if=lambda v: v is None)
    also_vtep_ip: str | None = Field(None, exclude_if=lambda v: v is None)


class SecurityGroupRuleInfo(Wire):
    id: int
    direction: Literal["ingress", "egress"]
    protocol: Literal["tcp", "udp", "icmp", "any"]
    port_range_min: int | None = None
    port_range_max: int | None = None
    # The remote side resolved to CIDRs: remote_cidr as given, or a remote group's member IPs as /32s (/128s).
    remote_cidrs: list[str] = Field(default_factory=list)


class SecurityGroupInfo(Wire):
    id: str
    vpc_id: str
    rules: list[SecurityGroupRuleInfo] = Field(default_factory=list)  # IPv4's
    rules6: list[SecurityGroupRuleInfo] = V6_LIST()  # IPv6's (ethertype IPv6), compiled for dual-stack VPCs only


class Vtep(Wire):
    host: str
    ip: str
    kind: str = "hypervisor"


class HostConfig(Versioned):
    host: str
    revision: int
    vtep_ip: str | None = None
    mtu: int = OVERLAY_MTU
    ports: list[PortInfo] = Field(default_factory=list)
    vpcs: list[VpcInfo] = Field(default_factory=list)  # the VPCs of local ports and the VPCs peered with them
    endpoints: list[Endpoint] = Field(default_factory=list)
    security_groups: list[SecurityGroupInfo] = Field(default_factory=list)
    vteps: list[Vtep] = Field(default_factory=list)  # registered VTEPs: the only tunnel sources accepted
    _by_vpc: Memo = PrivateAttr(default_factory=Memo)

    def endpoints_by_vpc(self) -> dict[str, list[Endpoint]]:
        """`endpoints` grouped by VPC, built once per config (a change in one VPC then looks at its own, not at
        the 20,000 of the host); `apply_delta` hands over the grouping it made. Read-only."""
        if self._by_vpc.value is None:
            by: dict[str, list[Endpoint]] = {}
            for e in self.endpoints:
                by.setdefault(e.vpc_id, []).append(e)
            self._by_vpc.value = by
        return self._by_vpc.value


class HostConfigDelta(Versioned):
    """The watch's incremental form (`GET /v1/hosts/{name}/config/delta?after=REV`): what changed in a host's
    config since the revision `base` the agent holds, so that a port created in one VPC sends that VPC's
    endpoints, not the host's whole config. `base` = -1: a whole config (the agent replaces what it has).

    Sections are whole per VPC: `vpcs`, `endpoints`, `ports` and `security_groups` carry every item of the VPCs
    that changed after `base` (a VPC listed in `changed_vpcs` with no endpoints has none): every write that changes
    a port stamps the port's VPC, so a port created on a host with 200 sends that VPC's few, not the 200. `vpc_ids`
    lists every VPC the config holds, so the agent drops the others. `vteps` is None when unchanged.

    With `form=objects` the VTEP list changes by entry: `vtep_updates` (appeared or changed) and `vteps_removed`,
    so a host joining costs every other host one entry. On the config stream, a VPC in `patched_vpcs` (one the
    stream sent before) has in `endpoints`, `ports` and `security_groups` only those that appeared or changed,
    and `endpoints_removed`, `ports_removed` name those that went (a group no port uses goes on its own): a port
    created in a VPC of 200 sends one each.
    `tianji.host_delta.apply_delta` is the one definition of how a delta applies."""

    host: str
    revision: int
    base: int
    vtep_ip: str | None = None
    mtu: int = OVERLAY_MTU
    vpc_ids: list[str] | None = Field(default_factory=list)  # None: the config's VPCs did not change (stream)
    changed_vpcs: list[str] = Field(default_factory=list)
    vpcs: list[VpcInfo] = Field(default_factory=list)
    endpoints: list[Endpoint] = Field(default_factory=list)
    security_groups: list[SecurityGroupInfo] = Field(default_factory=list)
    ports: list[PortInfo] = Field(default_factory=list)
    vteps: list[Vtep] | None = None
    vtep_updates: list[Vtep] = Field(default_factory=list)
    vteps_removed: list[str] = Field(default_factory=list)
    patched_vpcs: list[str] = Field(default_factory=list)
    endpoints_removed: list[str] = Field(default_factory=list)
    ports_removed: list[str] = Field(default_factory=list)


class PortStatusReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # port ids: no NUL (PostgreSQL cannot hold it, and the answer echoes the ids it ignored)
    ports: dict[Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[^\x00]*$")],
                Literal["UP", "DOWN"]] = Field(default_factory=dict, max_length=100_000)
    revision_applied: Annotated[StrictInt, Field(ge=-1, le=2**63 - 1)] | None = None  # `false` is not a revision
    errors: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] | None = None  # the agent's error count since it started
    last_error: Annotated[str, StringConstraints(max_length=500, pattern=r"^[^\x00]*$")] | None = None


class SnatInfo(Wire):
    cidr: str
    eips: list[str]


class GatewayVpc(Wire):
    id: str
    vni: int
    router_mac: str
    mtu: int = OVERLAY_MTU  # what is bigger on its way in is fragmented or refused (DF) at the gateway
    snat: list[SnatInfo] = Field(default_factory=list)


class StaticEip(Wire):
    vni: int
    ip: str
    eip: str


class DnatInfo(Wire):
    eip: str
    protocol: Literal["tcp", "udp"]
    external_port: int
    vni: int
    ip: str
    internal_port: int


class GatewayConfig(Versioned):
    """What a NAT gateway instance serves: per VNI its SNAT rules, the 1:1 EIPs, DNAT rules, and where every
    port of those VPCs lives (to send replies back in VXLAN)."""

    name: str
    revision: int
    vtep_ip: str | None = None
    vpcs: list[GatewayVpc] = Field(default_factory=list)
    static: list[StaticEip] = Field(default_factory=list)
    dnat: list[DnatInfo] = Field(default_factory=list)
    endpoints: list[Endpoint] = Field(default_factory=list)
    eips: list[str] = Field(default_factory=list)  # addresses this instance answers ARP for
    vteps: list[Vtep] = Field(default_factory=list)
    lbs: list[LbServed] = Field(default_factory=list)
    lines: list[PrivateLineServed] = Field(default_factory=list)
    services: list[ServiceEndpointServed] = Field(default_factory=list)


class SectionBase(Wire):
    """What every role's section of a VPC has: the VPC, where each of its ports lives (the replies' way back), and
    the addresses of this VPC this instance answers ARP for."""

    vpc: GatewayVpc
    endpoints: list[Endpoint] = Field(default_factory=list)
    eips: list[str] = Field(default_factory=list)


class NatSection(SectionBase):
    """A NAT instance's: the VPC with the SNAT rules it serves here (`vpc.snat`), its 1:1 EIPs and DNAT rules."""

    role: Literal["nat"] = "nat"
    static: list[StaticEip] = Field(default_factory=list)
    dnat: list[DnatInfo] = Field(default_factory=list)


class LbSection(SectionBase):
    role: Literal["lb"] = "lb"
    lbs: list[LbServed] = Field(default_factory=list)


class LineSection(SectionBase):
    role: Literal["private-line"] = "private-line"
    lines: list[PrivateLineServed] = Field(default_factory=list)


class ServiceSection(SectionBase):
    role: Literal["service"] = "service"
    services: list[ServiceEndpointServed] = Field(default_factory=list)


SECTION_TYPES: dict[str, type[SectionBase]] = {
    c.model_fields["role"].default: c for c in (NatSection, LbSection, LineSection, ServiceSection)}


def _section_role(v: Any) -> str | None:
    return v.get("role") if isinstance(v, dict) else getattr(v, "role", None)


# One VPC's part of a gateway instance's config, of the instance's role (schema 1.2). A gateway of schema 1.1 reads
# it as its one GatewaySection that had every role's fields (it ignores `role`, and the others' fields are empty
# lists by default); a gateway of 1.2 refuses the sections of a 1.1 controller, which have no role, before it
# applies anything: the controller is upgraded first (docs/southbound.md).
GatewaySection = Annotated[
    Annotated[NatSection, Tag("nat")] | Annotated[LbSection, Tag("lb")]
    | Annotated[LineSection, Tag("private-line")] | Annotated[ServiceSection, Tag("service")],
    Discriminator(_section_role, custom_error_type="section_role",
                  custom_error_message="a gateway section without its role: the controller is older than this "
                                       "gateway (southbound schema 1.2); upgrade the controller first")]


class GatewayConfigDelta(Versioned):
    """The gateway watch's incremental form (`GET /v1/gateways/{name}/config/delta?after=REV`): the sections of the
    VPCs that changed after `base`, which the instance holds; `base` -1: every section (replace what is held).
    `vpc_ids` lists every section the config has now (the instance drops the others); `vteps` is None when
    unchanged. `apply_gateway_delta` is the one definition of how it applies."""

    name: str
    revision: int
    base: int
    vtep_ip: str | None = None
    vpc_ids: list[str] = Field(default_factory=list)
    sections: list[GatewaySection] = Field(default_factory=list)
    vteps: list[Vtep] | None = None


def gateway_config_of(name: str, revision: int, vtep_ip: str | None, sections: list[GatewaySection],
                      vteps: list[Vtep]) -> GatewayConfig:
    """The whole config made of these sections (in VPC id order)."""
    return GatewayConfig.model_construct(  # from validated parts: nothing to validate again
        name=name, revision=revision, vtep_ip=vtep_ip, vpcs=[x.vpc for x in sections],
        static=_all(sections, "static"), dnat=_all(sections, "dnat"), endpoints=_all(sections, "endpoints"),
        eips=sorted({a for x in sections for a in x.eips}), vteps=vteps, lbs=_all(sections, "lbs"),
        lines=_all(sections, "lines"), services=_all(sections, "services"))


def _all(sections: list[GatewaySection], name: str) -> list:
    """What the sections of the roles that have field `name` list in it, in order."""
    return [e for x in sections for e in getattr(x, name, ())]


@dataclass
class GatewayHeld:
    """What a gateway instance holds: its sections by VPC id, at a revision (what deltas apply to)."""

    revision: int = -1
    vtep_ip: str | None = None
    sections: dict[str, GatewaySection] = field(default_factory=dict)
    vteps: list[Vtep] = field(default_factory=list)

    def config(self) -> GatewayConfig:
        return gateway_config_of("", self.revision, self.vtep_ip, [self.sections[v] for v in sorted(self.sections)],
                                 self.vteps)


def apply_gateway_delta(held: GatewayHeld, d: GatewayConfigDelta) -> tuple[GatewayHeld, set[str]] | None:
    """The sections a delta leads to from `held`, and the VPC ids whose section changed or went. None when it does
    not apply (another base, or a section it keeps that is not held): the instance then asks for every section."""
    if d.base < 0:
        old: dict[str, GatewaySection] = {}
    elif d.base != held.revision:
        return None
    else:
        old = held.sections
    new = {x.vpc.id: x for x in d.sections}
    if any(v not in new and v not in old for v in d.vpc_ids):
        return None
    sections = {v: new[v] if v in new else old[v] for v in d.vpc_ids}
    prev = held.sections  # compared with what is held even for a whole answer: the apply touches what differs
    changed = {v for v in new if prev.get(v) != new[v]} | (prev.keys() - sections.keys())
    return GatewayHeld(d.revision, d.vtep_ip, sections, held.vteps if d.vteps is None else d.vteps), changed


def vtep_interface(text: str) -> ipaddress.IPv4Interface:
    """A host's `--vtep-ip`: an address with its prefix on the underlay (a bare address means /24)."""
    return ipaddress.IPv4Interface(text if "/" in text else f"{text}/24")
