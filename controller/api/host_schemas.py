"""Request and response bodies of the hosts' registration and the operators' view of them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from controller.api.schemas import NAME, Req, Resp, vtep_address
from tianji.southbound import GatewayRole


class HostRegister(Req):
    name: str = NAME
    vtep_ip: str
    kind: Literal["hypervisor", "gateway"] = "hypervisor"
    role: GatewayRole | None = Field(None, description="a gateway's role (default nat): nat, lb or "
                                                     "private-line; none for hypervisors")

    @field_validator("vtep_ip")
    @classmethod
    def _ip(cls, v: str) -> str:
        return vtep_address(v)


class HostUpdate(Req):
    vtep_ip: str | None = None
    role: GatewayRole | None = Field(None, description="a gateway's role: the operator's to change")

    @field_validator("vtep_ip")
    @classmethod
    def _ip(cls, v: str | None) -> str | None:
        return None if v is None else vtep_address(v)


class HostOut(Resp):
    name: str
    vtep_ip: str
    kind: str
    role: str | None = None
    status: str
    last_seen: str
    ports: int = 0
    # what its agent last reported to this controller process (in memory: another replica may have heard later)
    revision_applied: int | None = Field(None, description="the revision its switch was last brought to")
    reported_at: float | None = Field(None, description="when its agent reported that (epoch seconds)")
    agent_errors: int | None = Field(None, description="errors its agent met since it started")
    last_error: str | None = None
