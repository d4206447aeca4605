"""Request and response bodies of the private-line API (a VLAN on the gateways' handoff, BGP to the customer).

The checks are Direct Connect's: a VLAN in 1-4094 (not reserved), a customer ASN that BGP can carry (not 0, not
AS_TRANS 23456, not the cloud's own: the settings say it, and the API refuses it there), the two ends of a /30 or
/31, TCP-MD5's 80-character key, at least one prefix."""

from __future__ import annotations

import ipaddress
from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field, field_validator, model_validator

from controller.api.schemas import ID, NAME, Req, cidr_field

RESERVED_ASNS = {0: "reserved (RFC 7607)", 23456: "AS_TRANS (RFC 6793), not a real AS",
                 65535: "reserved (RFC 7300)", 4294967295: "reserved (RFC 7300)"}
MAX_STATIC_ROUTES = 100


def _asn(v: int) -> int:
    if v in RESERVED_ASNS:
        raise ValueError(f"ASN {v} is {RESERVED_ASNS[v]}: use the customer's own AS number")
    return v


def _link_address(v: str) -> str:
    """One end of the line's link, as ADDRESS/LEN with LEN 30 or 31, neither end of a /30's range."""
    if "/" not in v:
        raise ValueError(f"{v!r}: give the address with its link's length, e.g. 169.254.10.1/30 (a /30 or /31)")
    try:
        iface = ipaddress.IPv4Interface(v)
    except ValueError:
        raise ValueError(f"{v!r} is not an IPv4 address with a prefix length") from None
    if iface.network.prefixlen not in (30, 31):
        raise ValueError(f"{v}: the link is a /30 or a /31 pair, not a /{iface.network.prefixlen}")
    if iface.network.prefixlen == 30 and iface.ip in (iface.network.network_address, iface.network.broadcast_address):
        raise ValueError(f"{v} is the {'network' if iface.ip == iface.network.network_address else 'broadcast'} "
                         f"address of {iface.network}: a /30's usable ends are .1 and .2 of it")
    a = iface.ip
    if a.is_multicast or a.is_loopback or a.is_unspecified or a.is_reserved:
        raise ValueError(f"{a} cannot be a router's address on a link")
    return str(iface)


LinkAddress = Annotated[str, Field(max_length=18), AfterValidator(_link_address)]


def _pair(local: str, customer: str, where: str) -> None:
    lo, cu = ipaddress.IPv4Interface(local), ipaddress.IPv4Interface(customer)
    if lo.network != cu.network:
        raise ValueError(f"{where}local_ip {local} and customer_ip {customer} are not the two ends of one /30 or "
                         f"/31 (their networks are {lo.network} and {cu.network})")
    if lo.ip == cu.ip:
        raise ValueError(f"{where}local_ip and customer_ip are the same address {lo.ip}")


class LinkPair(Req):
    """The other BGP session of a redundant line (ExpressRoute's secondary), on another gateway instance."""

    local_ip: LinkAddress
    customer_ip: LinkAddress

    @model_validator(mode="after")
    def _ends(self) -> LinkPair:
        _pair(self.local_ip, self.customer_ip, "secondary.")
        return self


def _routes(v: list[str]) -> list[str]:
    out = [cidr_field(x, 0, 32) for x in v]
    if dup := next((x for i, x in enumerate(out) if x in out[:i]), None):
        raise ValueError(f"{dup} is named more than once")
    return out


StaticRoutes = Annotated[list[str], Field(max_length=MAX_STATIC_ROUTES), AfterValidator(_routes)]
Password = Annotated[str, Field(min_length=1, max_length=80, pattern=r"^[\x21-\x7e]+$",
                                description="TCP-MD5 key (RFC 2385): 1-80 printable characters, no spaces")]


class PrivateLineCreate(Req):
    name: str = NAME
    vpc_id: ID
    vlan_id: int = Field(ge=1, le=4094, description="the 802.1Q VLAN of the line on the handoff (1-4094)")
    customer_asn: Annotated[int, Field(ge=1, le=4294967295), AfterValidator(_asn)]
    customer_ip: LinkAddress
    local_ip: LinkAddress
    secondary: LinkPair | None = Field(None, description="a second session (another instance): the redundant pair")
    md5_password: Password | None = None
    max_prefixes: int = Field(100, ge=1, le=10_000, description="prefixes accepted per session; more tears the "
                                                                "session down (Direct Connect's limit: 100)")
    static_routes: StaticRoutes = Field(default_factory=list, description="customer prefixes reached without BGP")

    @model_validator(mode="after")
    def _ends(self) -> PrivateLineCreate:
        _pair(self.local_ip, self.customer_ip, "")
        if self.secondary is not None:
            nets = {ipaddress.IPv4Interface(x).network for x in (self.local_ip, self.secondary.local_ip)}
            if len(nets) == 1:
                raise ValueError("secondary: its pair must be another /30 or /31 than the primary's")
        return self


class PrivateLineUpdate(Req):
    md5_password: Password | None = None
    max_prefixes: int | None = Field(None, ge=1, le=10_000)
    static_routes: StaticRoutes | None = None


class RefusedPrefix(BaseModel):
    prefix: str
    reason: str


class SessionReport(Req):
    """A session as its instance sees it (its BGP daemon's state)."""

    local_ip: str = Field(max_length=18)
    bgp_state: str = Field("Idle", max_length=16)
    bfd_state: str = Field("down", max_length=16)
    received: int = Field(0, ge=0)
    accepted: int = Field(0, ge=0)
    advertised: int = Field(0, ge=0)
    last_error: str | None = Field(None, max_length=255)
    prefixes: Annotated[list[str], Field(max_length=20_000)] = Field(default_factory=list,
                                                                      description="the prefixes it learned")

    @field_validator("prefixes")
    @classmethod
    def _p(cls, v: list[str]) -> list[str]:
        return [cidr_field(x, 0, 32) for x in v]


class LineReport(Req):
    """What an instance reports of one line (`PUT /v1/gateways/{name}/private-lines/{id}`): its sessions."""

    sessions: Annotated[list[SessionReport], Field(max_length=2)]


class SessionOut(BaseModel):
    instance: str | None  # None: no live private-line instance to place it on
    local_ip: str
    customer_ip: str
    bgp_state: str
    bfd_state: str
    received: int
    accepted: int
    advertised: int
    refused: list[RefusedPrefix]
    last_error: str | None
    updated_at: datetime | None


class LearnedRoute(BaseModel):
    prefix: str
    instances: list[str]


class PrivateLineOut(BaseModel):
    id: str
    tenant_id: str
    vpc_id: str
    name: str
    vlan_id: int
    customer_asn: int
    local_asn: int
    customer_ip: str
    local_ip: str
    secondary: LinkPair | None
    md5: bool  # whether a password is set (never shown)
    max_prefixes: int
    static_routes: list[str]
    advertised: list[str]  # what the customer is sent: the VPC's CIDR (not its peers': peering is not transitive)
    sessions: list[SessionOut]
    learned_routes: list[LearnedRoute]
    created_at: datetime
