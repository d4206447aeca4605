"""The reachability analyzer's API: `POST /v1/reachability` (controller/reachability)."""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field, field_validator, model_validator

from controller.api import traces
from controller.api.common import WriteRoute, db_of
from controller.api.schemas import ID, Req
from controller.auth import Principal, require_tenant_api
from controller.errors import ApiError
from controller.reachability.query import Question, answer

router = APIRouter(tags=["reachability"], route_class=WriteRoute)  # a POST: every one is (test_write_storm)


class Destination(Req):
    ip: str | None = Field(None, description="any IPv4 or IPv6 address: a port's, a VIP, a service endpoint, "
                                             "outside")
    port_id: ID | None = None
    eip: str | None = Field(None, description="an elastic IP's address")

    @field_validator("ip")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        return None if v is None else str(ipaddress.ip_address(v))

    @field_validator("eip")
    @classmethod
    def _eip(cls, v: str | None) -> str | None:
        if v is not None:
            ipaddress.IPv4Address(v)
        return v

    @model_validator(mode="after")
    def _one(self) -> Destination:
        if sum(x is not None for x in (self.ip, self.port_id, self.eip)) != 1:
            raise ValueError("give exactly one of ip, port_id, eip")
        return self


class ReachabilityQuery(Req):
    source_port_id: ID
    destination: Destination
    protocol: Literal["tcp", "udp", "icmp"] = "tcp"
    port: int | None = Field(None, ge=1, le=65535, description="the destination port (tcp, udp)")
    ip_version: Literal[4, 6] = Field(4, description="a destination port's address of this family (an ip says its "
                                                     "own)")
    live: bool = Field(False, description="admin: also ask the source host's Open vSwitch (ofproto/trace, through "
                                          "its agent) and say whether it agrees with the model")

    @model_validator(mode="after")
    def _port(self) -> ReachabilityQuery:
        if self.protocol in ("tcp", "udp") and self.port is None:
            raise ValueError(f"port: a {self.protocol} question needs the destination port")
        if self.protocol == "icmp" and self.port is not None:
            raise ValueError("port: ICMP has no port")
        return self

    model_config = {"json_schema_extra": {"examples": [
        {"source_port_id": "PORT-ID", "destination": {"ip": "10.0.2.5"}, "protocol": "tcp", "port": 443}]}}


class StepOut(BaseModel):
    table: str = Field(description="the pipeline table (or gateway stage) that decided")
    does: str
    object: dict[str, Any] | None = Field(None, description="what the deciding flow comes from: kind and id")


class HopOut(BaseModel):
    host: str
    kind: Literal["hypervisor", "gateway"]
    role: str | None = None
    vni: int | None = Field(None, description="the VXLAN VNI it arrived in (none: from the source VM)")
    steps: list[StepOut]


class LegOut(BaseModel):
    end: Literal["delivered", "left", "balanced", "answered", "dropped"]
    reason: str
    delivered_to: str | None = None
    hops: list[HopOut]


class Endpoints(BaseModel):
    port_id: str | None = None
    ip: str
    vpc_id: str | None = None
    host: str | None = None
    eip: str | None = None


class LiveOut(BaseModel):
    host: str
    agrees: bool | None = Field(description="None: the switch could not be asked (`note` says why)")
    model: str = Field(description="where the model sends the packet from the source host's switch")
    switch: str | None = Field(None, description="where Open vSwitch sends it")
    note: str | None = None
    trace: str | None = Field(None, description="what ofproto/trace printed (its end)")


class ReachabilityOut(BaseModel):
    verdict: Literal["reachable", "unreachable"]
    reason: str
    source: Endpoints
    destination: Endpoints
    protocol: str
    port: int | None
    forward: LegOut
    reply: LegOut | None = Field(None, description="the answer's way back, when the request reached a port")
    live: LiveOut | None = None


@router.post("/reachability", response_model=ReachabilityOut)
def reachability(body: ReachabilityQuery, request: Request, p: Principal = Depends(require_tenant_api)) -> dict:
    """Whether the source port's packet reaches the destination, and the path hop by hop: each switch's
    decisions (security group rules, routes, ports) and each gateway's, from the configs the hosts are given and
    the flows their agents build from them."""
    d = body.destination
    db = db_of(request)
    if body.live and not p.is_admin:
        raise ApiError(403, "live: asking a hypervisor's switch needs the admin token", "live")
    ask = (lambda host, question: traces.ask(db, host, question)) if body.live else None
    with db.read() as s:
        return answer(s, Question(body.source_port_id, d.ip, d.port_id, d.eip, body.protocol, body.port,
                                  6 if d.ip and ":" in d.ip else body.ip_version), p, ask)
