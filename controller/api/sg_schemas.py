"""Request and response bodies of security groups and their rules (IPv4 and IPv6: a rule's `ethertype`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from controller.api.label_schemas import LabelsIn, LabelsOut
from controller.api.schemas import ID, NAME, Req, Resp, any_cidr_field

Ethertype = Literal["IPv4", "IPv6"]  # Neutron's field
ANYWHERE = {"IPv4": "0.0.0.0/0", "IPv6": "::/0"}


class RuleCreate(Req):
    direction: Literal["ingress", "egress"]
    # with IPv6, icmp is ICMPv6 (`icmpv6` and Neutron's `ipv6-icmp` say the same)
    protocol: Literal["tcp", "udp", "icmp", "icmpv6", "ipv6-icmp", "any"] = "any"
    ethertype: Ethertype | None = Field(None, description="IPv4 or IPv6; left out: remote_cidr's family, else IPv4")
    port_range_min: int | None = Field(None, ge=1, le=65535)
    port_range_max: int | None = Field(None, ge=1, le=65535)
    remote_cidr: str | None = None
    remote_group_id: ID | None = None
    description: str = Field("", max_length=255)

    @field_validator("remote_cidr")
    @classmethod
    def _rc(cls, v: str | None) -> str | None:
        return None if v is None else any_cidr_field(v)

    @model_validator(mode="after")
    def _check(self) -> RuleCreate:
        if self.remote_cidr and self.remote_group_id:
            raise ValueError("give remote_cidr or remote_group_id, not both")
        family = None if self.remote_cidr is None else "IPv6" if ":" in self.remote_cidr else "IPv4"
        if self.ethertype and family and family != self.ethertype:
            raise ValueError(f"remote_cidr {self.remote_cidr} is {family} but ethertype is {self.ethertype}")
        self.ethertype = self.ethertype or family or "IPv4"
        if self.protocol in ("icmpv6", "ipv6-icmp"):
            if self.ethertype != "IPv6":
                raise ValueError(f"protocol {self.protocol} is IPv6's: give ethertype IPv6 (or icmp for IPv4)")
            self.protocol = "icmp"
        ports = (self.port_range_min, self.port_range_max)
        if self.protocol in ("tcp", "udp"):
            if (ports[0] is None) != (ports[1] is None):
                raise ValueError("give both port_range_min and port_range_max, or neither")
            if ports[0] is not None and ports[0] > ports[1]:
                raise ValueError("port_range_min must not exceed port_range_max")
        elif ports != (None, None):
            raise ValueError(f"port ranges apply to tcp and udp only, not {self.protocol}")
        return self


class RuleOut(Resp):
    id: int
    direction: str
    ethertype: str
    protocol: str
    port_range_min: int | None
    port_range_max: int | None
    remote_cidr: str | None
    remote_group_id: str | None
    description: str


class SecurityGroupCreate(Req, LabelsIn):
    vpc_id: ID
    name: str = NAME
    # left out: all egress, as AWS and OpenStack give a new group; given, exactly those (`[]`: nothing in or out)
    rules: list[RuleCreate] = Field(default_factory=lambda: [RuleCreate(direction="egress", remote_cidr=c)
                                                             for c in ANYWHERE.values()])


class SecurityGroupOut(Resp, LabelsOut):
    id: str
    vpc_id: str
    tenant_id: str
    name: str
    is_default: bool
    rules: list[RuleOut]
