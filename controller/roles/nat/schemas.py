"""Request and response bodies of the NAT role's API: NAT gateways, SNAT and DNAT rules."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from controller.api.schemas import ID, IdList, Req, Resp, cidr_field


class NatGatewayCreate(Req):
    vpc_id: ID
    name: str = Field("nat", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    eip_ids: Annotated[IdList, Field(min_length=1)]


class NatGatewayOut(BaseModel):
    id: str
    tenant_id: str
    vpc_id: str
    name: str
    eip_ids: list[str]


class SnatRuleCreate(Req):
    subnet_id: ID | None = None
    cidr: str | None = None
    eip_ids: Annotated[IdList, Field(min_length=1)]

    @field_validator("cidr")
    @classmethod
    def _c(cls, v: str | None) -> str | None:
        return None if v is None else cidr_field(v, 0, 32)

    @model_validator(mode="after")
    def _one(self) -> SnatRuleCreate:
        if (self.subnet_id is None) == (self.cidr is None):
            raise ValueError("give exactly one of subnet_id or cidr")
        return self


class SnatRuleOut(BaseModel):
    id: str
    nat_gateway_id: str
    subnet_id: str | None
    cidr: str
    eip_ids: list[str]
    # what still stops the rule from working (the VPC's route table sends nothing to the gateway): on create only
    warnings: list[str] = []


class DnatRuleCreate(Req):
    eip_id: ID
    protocol: Literal["tcp", "udp"]
    external_port: int = Field(ge=1, le=65535)
    port_id: ID
    internal_port: int = Field(ge=1, le=65535)


class DnatRuleOut(Resp):
    id: str
    nat_gateway_id: str
    eip_id: str
    protocol: str
    external_port: int
    port_id: str
    internal_port: int
