"""Request and response bodies of the tenant API (security groups' in sg_schemas.py, each gateway role's in its
room, controller/roles/). Requests forbid unknown fields."""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    create_model,
    field_validator,
)

from controller.api.ipam import IpamError, parse_cidr
from controller.api.ipam6 import SUBNET_PREFIX, VPC_PREFIX, Ipam6Error, address_error6, parse_cidr6, space_error6
from controller.api.label_schemas import LabelsIn, LabelsOut, LabelsPatch
from controller.settings import DEFAULT_QUOTAS
from tianji.southbound import GatewayRole

NAME = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ID = Annotated[str, StringConstraints(min_length=1, max_length=64)]  # a resource's id, as a reference


def _each_once(v: list[str]) -> list[str]:
    if dup := next((x for i, x in enumerate(v) if x in v[:i]), None):
        raise ValueError(f"{dup} is named more than once")
    return v


# references to resources, each at most once (a list as long as a quota allows, not longer)
IdList = Annotated[list[ID], Field(max_length=256), AfterValidator(_each_once)]
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def ipv4_field(v: str | None) -> str | None:
    """A validated IPv4 address (for field validators), in its canonical spelling; None stays None."""
    if v is None:
        return v
    try:
        return str(ipaddress.IPv4Address(v))
    except ValueError:
        raise ValueError(f"{v!r} is not an IPv4 address") from None


def vtep_address(v: str) -> str:
    """A host's VTEP: an IPv4 unicast address that a host can own and other hosts can send VXLAN to."""
    a = ipaddress.IPv4Address(ipv4_field(v))
    why = ("unspecified" if a.is_unspecified else "loopback" if a.is_loopback else "multicast" if a.is_multicast
           else "broadcast" if a == ipaddress.IPv4Address("255.255.255.255") else "link-local" if a.is_link_local
           else "reserved (240.0.0.0/4)" if a.is_reserved else "in 0.0.0.0/8" if int(a) >> 24 == 0 else None)
    if why:
        raise ValueError(f"{a} is {why}: a VTEP is a unicast address of the host on the underlay")
    return str(a)


def _has_nul(v: object) -> bool:
    if isinstance(v, str):
        return "\x00" in v
    if isinstance(v, dict):
        return any(_has_nul(k) or _has_nul(x) for k, x in v.items())
    if isinstance(v, list | tuple):
        return any(_has_nul(x) for x in v)
    return False


class Req(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    @field_validator("*")
    @classmethod
    def _no_nul(cls, v: object) -> object:
        """No NUL in any text, a dict's keys included: PostgreSQL cannot store it, and both backends must answer
        alike."""
        if _has_nul(v):
            raise ValueError("NUL characters are not allowed")
        return v


class Resp(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def any_cidr_field(v: str) -> str:
    """A validated CIDR of either family (a rule's remote, a route's destination), in its canonical spelling."""
    if ":" in v:
        try:
            return str(parse_cidr6(v))
        except Ipam6Error as e:
            raise ValueError(str(e)) from None
    return cidr_field(v, 0, 32)


def cidr6_field(v: str, prefix: int) -> str:
    """A validated IPv6 CIDR of exactly /`prefix`, unique local or global unicast space."""
    try:
        net = parse_cidr6(v, prefix, prefix)
    except Ipam6Error as e:
        raise ValueError(str(e)) from None
    if why := space_error6(net):
        raise ValueError(why)
    return str(net)


def cidr_field(v: str, lo: int = 8, hi: int = 28) -> str:
    """A validated CIDR (for field validators), its prefix length within [lo, hi]."""
    try:
        return str(parse_cidr(v, min_prefix=lo, max_prefix=hi))
    except IpamError as e:
        raise ValueError(str(e)) from None


class TenantCreate(Req):
    name: str = NAME


class TenantOut(Resp):
    id: str
    name: str


class TenantCreated(TenantOut):
    token: str


class HostTokenCreate(Req):
    host: str = NAME
    kind: Literal["hypervisor", "gateway"] = "hypervisor"
    role: GatewayRole | None = Field(None, description="a gateway credential's role: its host registers "
                                                                "with that role only (default: the role the host "
                                                                "is first registered with, and no other)")
    name: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                             description="the credential's own name (default: the host's); unique")


class HostTokenOut(Resp):
    id: str
    name: str
    host: str | None
    kind: str
    role: str | None = None
    created_at: datetime


class HostTokenCreated(HostTokenOut):
    token: str


class QuotaOut(BaseModel):
    limit: int
    used: int


# one field per quota resource (the settings' DEFAULT_QUOTAS name them all: GET lists what PUT takes)
QuotaUpdate = create_model(
    "QuotaUpdate", __base__=Req, __doc__="Limits to set; a resource left out keeps its limit.",
    **{r: (int | None, Field(None, ge=-1, le=2**31 - 1, description="the limit; -1 unlimited; null: the default"))
       for r in DEFAULT_QUOTAS})


class AuditOut(Resp):
    id: int
    at: datetime
    actor_kind: str
    actor: str
    tenant_id: str | None
    method: str
    path: str
    revision: int | None


class TokenCreate(Req):
    name: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class TokenOut(Resp):
    id: str
    name: str
    created_at: datetime


class TokenCreated(TokenOut):
    token: str


class VpcCreate(Req, LabelsIn):
    name: str = NAME
    cidr: str
    mtu: int = Field(1450, ge=1280, le=9216,
                     description="the VMs' MTU (DHCP option 26): up to the underlay's MTU less 50")
    tenant_id: ID | None = Field(None, description="admin only: the tenant that owns the VPC")
    ipv6_cidr: str | None = Field(None, description='dual-stack: "auto" (a /56 from the operator\'s pools) or a /56 '
                                                    "of your own, unique local or global, outside those pools")

    @field_validator("cidr")
    @classmethod
    def _c(cls, v: str) -> str:
        return cidr_field(v)

    @field_validator("ipv6_cidr")
    @classmethod
    def _c6(cls, v: str | None) -> str | None:
        return v if v in (None, "auto") else cidr6_field(v, VPC_PREFIX)


class VpcOut(Resp, LabelsOut):
    id: str
    name: str
    cidr: str
    vni: int
    tenant_id: str
    router_mac: str
    mtu: int
    ipv6_cidr: str | None = None
    default_security_group_id: str | None = None


class SubnetCreate(Req, LabelsIn):
    vpc_id: ID
    name: str = NAME
    cidr: str
    ipv6_cidr: str | None = Field(None, description='dual-stack: a /64 of the VPC\'s /56, or "auto" (the lowest free)')
    ipv6_address_mode: Literal["slaac", "dhcpv6-stateful"] = Field(
        "slaac", description="slaac: a port's address is its MAC's EUI-64, announced by RA (M=0, O=1); "
                             "dhcpv6-stateful: handed out by the API and DHCPv6 (M=1)")

    @field_validator("cidr")
    @classmethod
    def _c(cls, v: str) -> str:
        return cidr_field(v, 8, 29)

    @field_validator("ipv6_cidr")
    @classmethod
    def _c6(cls, v: str | None) -> str | None:
        return v if v in (None, "auto") else cidr6_field(v, SUBNET_PREFIX)


class SubnetOut(Resp, LabelsOut):
    id: str
    vpc_id: str
    tenant_id: str
    name: str
    cidr: str
    gateway_ip: str
    available_ips: int | None = None
    ipv6_cidr: str | None = None
    ipv6_gateway_ip: str | None = None
    ipv6_address_mode: str | None = None


class PortCreate(Req, LabelsIn):
    subnet_id: ID
    name: str = NAME
    ip: str | None = None
    ipv6: str | None = Field(None, description="a dhcpv6-stateful subnet's address of your choice (a SLAAC subnet's "
                                                "is the MAC's EUI-64)")
    mac: str | None = None
    host: str | None = None
    security_group_ids: IdList | None = None

    @field_validator("ip")
    @classmethod
    def _ip(cls, v: str | None) -> str | None:
        return ipv4_field(v)

    @field_validator("ipv6")
    @classmethod
    def _ip6(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            ip = ipaddress.IPv6Address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv6 address") from None
        if why := address_error6(ip):
            raise ValueError(why)
        return str(ip)

    @field_validator("mac")
    @classmethod
    def _mac(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.lower().replace("-", ":")
        if not MAC_RE.match(v):
            raise ValueError(f"{v!r} is not a MAC address (aa:bb:cc:dd:ee:ff)")
        first = int(v[:2], 16)
        if first & 1:
            raise ValueError("a port MAC must be unicast (lowest bit of the first octet clear)")
        if v == "00:00:00:00:00:00":
            raise ValueError("00:00:00:00:00:00 is not a station's address")
        return v


class PortUpdate(Req, LabelsPatch):
    name: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    host: str | None = None
    migrating_to: str | None = Field(None, description="a live migration's destination host: the port is bound "
                                     "there too until `host` is set to it (null: the migration is abandoned)")
    security_group_ids: IdList | None = None


class Rename(Req, LabelsPatch):
    """PATCH on VPCs, subnets and security groups: a new name, description or tags (given fields only)."""

    name: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class PortBulkCreate(Req):
    ports: list[PortCreate] = Field(min_length=1, max_length=1000)


class PortOut(Resp, LabelsOut):
    id: str
    tenant_id: str
    vpc_id: str
    subnet_id: str
    name: str
    ip: str
    ipv6: str | None = None
    mac: str
    host: str | None
    migrating_to: str | None = None
    status: str
    status_changed_at: datetime | None = None  # when its host last reported a change (UP: programmed)
    security_group_ids: list[str] = []


class PeeringCreate(Req):
    requester_vpc_id: ID
    accepter_vpc_id: ID


class PeeringOut(Resp):
    id: str
    requester_vpc_id: str
    accepter_vpc_id: str
    requester_tenant_id: str
    accepter_tenant_id: str
    status: str


class RouteCreate(Req):
    destination: str
    target: str = Field(description="peering:<id> (gateway targets come with the gateway features)")

    @field_validator("destination")
    @classmethod
    def _d(cls, v: str) -> str:
        return any_cidr_field(v)


class RouteOut(BaseModel):
    id: str | None
    destination: str
    target: str
    origin: Literal["implicit", "user", "static", "bgp"]  # static, bgp: over a private line
    state: Literal["active", "blackhole"] = "active"
