"""Request and response bodies of the load-balancer API, named as in Neutron LBaaS v2 / Octavia."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from controller.api.schemas import ID, NAME, Req, Resp, ipv4_field
from tianji.primes import is_prime

Protocol = Literal["tcp", "udp"]
MAX_TABLE = 1_000_003  # Maglev's M: a prime at least 100x the members (65537 by default)
CODES = re.compile(r"^[1-5][0-9]{2}(-[1-5][0-9]{2})?(,[1-5][0-9]{2}(-[1-5][0-9]{2})?)*$")


class LoadBalancerCreate(Req):
    name: str = NAME
    vpc_id: ID
    subnet_id: ID
    vip_address: str | None = Field(None, description="an IPv4 address in the subnet (default: the next free one)")
    eip_id: ID | None = Field(None, description="an EIP of yours that makes the VIP reachable from the internet")

    @field_validator("vip_address")
    @classmethod
    def _vip(cls, v: str | None) -> str | None:
        if v is not None and ":" in v:
            raise ValueError(f"{v}: load balancers are IPv4-only (docs/dual-stack.md); give an IPv4 address")
        return ipv4_field(v)


class LoadBalancerOut(Resp):
    id: str
    tenant_id: str
    name: str
    vpc_id: str
    subnet_id: str
    vip_address: str
    vip_port_id: str
    eip_id: str | None
    eip_address: str | None = None
    provisioning_status: str = "ACTIVE"
    operating_status: str = "ONLINE"
    listener_ids: list[str] = []
    pool_ids: list[str] = []


class ListenerCreate(Req):
    protocol: Protocol
    port: int = Field(ge=1, le=65535)
    default_pool_id: ID | None = None
    idle_timeout_s: int = Field(350, ge=1, le=86400, description="an idle connection is forgotten after this")


class ListenerOut(Resp):
    id: str
    load_balancer_id: str
    protocol: str
    port: int
    default_pool_id: str | None
    idle_timeout_s: int


class PoolCreate(Req):
    load_balancer_id: ID
    name: str = NAME
    protocol: Protocol
    algorithm: Literal["maglev", "source_ip"] = "maglev"
    table_size: int = Field(65537, ge=251, le=MAX_TABLE, description="Maglev's lookup table size: a prime")
    deregistration_delay_s: int = Field(30, ge=0, le=3600, description="how long a drained member keeps its "
                                                                       "established connections")

    @field_validator("table_size")
    @classmethod
    def _prime(cls, v: int) -> int:
        if not is_prime(v):
            raise ValueError(f"{v} is not a prime (Maglev needs one: 65537, 131071, 262147, 524287, 1000003)")
        return v


class PoolOut(Resp):
    id: str
    load_balancer_id: str
    name: str
    protocol: str
    algorithm: str
    table_size: int
    deregistration_delay_s: int
    operating_status: str = "ONLINE"
    member_ids: list[str] = []


class MemberCreate(Req):
    port_id: ID
    protocol_port: int = Field(ge=1, le=65535)
    weight: int = Field(1, ge=0, le=256, description="0 drains the member: no new connections")


class MemberUpdate(Req):
    weight: int = Field(ge=0, le=256, description="0 drains the member: no new connections")


class MemberOut(Resp):
    id: str
    pool_id: str
    port_id: str
    address: str = ""
    protocol_port: int
    weight: int
    operating_status: str
    status_changed_at: datetime


class HealthMonitorPut(Req):
    type: Literal["tcp", "http", "udp-connect"]
    interval_s: float = Field(gt=0, le=3600)
    timeout_s: float = Field(gt=0, le=3600)
    rise: int = Field(ge=1, le=10, description="successes in a row that bring a member back")
    fall: int = Field(ge=1, le=10, description="failures in a row that take a member out")
    http_method: Literal["GET", "HEAD", "OPTIONS"] | None = None
    url_path: str | None = Field(None, max_length=255, pattern=r"^/[!-~]*$")
    expected_codes: str | None = Field(None, max_length=64)

    @field_validator("expected_codes")
    @classmethod
    def _codes(cls, v: str | None) -> str | None:
        if v is not None and not CODES.match(v):
            raise ValueError("a status code, a range or a comma-separated list of them: 200, 200-299, 200,202")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> HealthMonitorPut:
        if self.timeout_s > self.interval_s:
            raise ValueError("timeout_s must not exceed interval_s (one probe at a time per member)")
        http = (self.http_method, self.url_path, self.expected_codes)
        if self.type == "http":
            self.http_method = self.http_method or "GET"
            self.url_path = self.url_path or "/"
            self.expected_codes = self.expected_codes or "200"
        elif any(x is not None for x in http):
            raise ValueError("http_method, url_path and expected_codes are for type http only")
        return self


class HealthMonitorOut(BaseModel):
    pool_id: str
    type: str
    interval_s: float
    timeout_s: float
    rise: int
    fall: int
    http_method: str | None
    url_path: str | None
    expected_codes: str | None
