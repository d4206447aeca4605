"""Request and response bodies of EIP pools (the operator's) and EIPs (the tenants')."""

from __future__ import annotations

from pydantic import Field, field_validator

from controller.api.schemas import ID, Req, Resp, cidr_field


class EipPoolCreate(Req):
    cidr: str

    @field_validator("cidr")
    @classmethod
    def _c(cls, v: str) -> str:
        return cidr_field(v, 16, 30)


class EipCreate(Req):
    tenant_id: ID | None = Field(None, description="admin only")


class EipOut(Resp):
    id: str
    tenant_id: str
    address: str
    port_id: str | None
    home: str | None


class EipAssociate(Req):
    port_id: ID
