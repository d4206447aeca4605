"""Request and response bodies of the services API: shared services (the operator's, on the service network, or a
tenant's load balancer published to named tenants) and their endpoints in consumers' subnets."""

from __future__ import annotations

import ipaddress
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, field_validator, model_validator

from controller.api.schemas import ID, IdList, Req

MAX_ADDRESSES = 16
MAX_PORTS = 64
MAX_ALLOWED = 1000
DNS_LABEL = Field(None, min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
                  description="a DNS label (lowercase letters, digits, hyphens): the endpoints' names start with it; "
                              "a published load balancer's name by default")


class ServicePort(Req):
    protocol: Literal["tcp", "udp"]
    port: int = Field(ge=1, le=65535)


def _service_address(v: str) -> str:
    if ":" in v:
        raise ValueError(f"{v}: services are IPv4-only (docs/dual-stack.md); give an IPv4 address")
    try:
        a = ipaddress.IPv4Address(v)
    except ValueError:
        raise ValueError(f"{v!r} is not an IPv4 address") from None
    if a.is_multicast or a.is_loopback or a.is_unspecified or a.is_link_local or a.is_reserved or \
            a == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"{a} cannot be a service's address (multicast, loopback, link-local or reserved)")
    return str(a)


ServiceAddress = Annotated[str, Field(max_length=45), AfterValidator(_service_address)]


class ServiceCreate(Req):
    """The admin's: `name`, `addresses`, `ports` (and `proxy_protocol`, `allowed_tenants`: every tenant if
    absent). A tenant's: `load_balancer_id` and `allowed_tenants` (its listeners are the ports)."""

    name: str | None = DNS_LABEL
    addresses: list[ServiceAddress] | None = Field(None, min_length=1, max_length=MAX_ADDRESSES)
    ports: list[ServicePort] | None = Field(None, min_length=1, max_length=MAX_PORTS)
    proxy_protocol: bool = False
    load_balancer_id: ID | None = None
    allowed_tenants: list[ID] | None = Field(None, max_length=MAX_ALLOWED)

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError("an address is listed twice")
        return v

    @field_validator("ports")
    @classmethod
    def _ports(cls, v: list[ServicePort] | None) -> list[ServicePort] | None:
        if v is not None and len({(p.protocol, p.port) for p in v}) != len(v):
            raise ValueError("a protocol and port is listed twice")
        return v

    @field_validator("allowed_tenants")
    @classmethod
    def _allowed(cls, v: list[str] | None) -> list[str] | None:
        return _once(v)

    @model_validator(mode="after")
    def _one_kind(self) -> ServiceCreate:
        if self.load_balancer_id is None:
            for f in ("name", "addresses", "ports"):
                if getattr(self, f) is None:
                    raise ValueError(f"{f} is required for a service on the service network (or give "
                                     "load_balancer_id to publish a load balancer)")
        else:
            for f in ("addresses", "ports"):
                if getattr(self, f) is not None:
                    raise ValueError(f"{f}: a published load balancer's are its VIP and listeners; leave it out")
        return self


def _once(v: list[str] | None) -> list[str] | None:
    if v is not None and len(set(v)) != len(v):
        raise ValueError("a tenant is listed twice")
    return v


class ServiceUpdate(Req):
    allowed_tenants: list[ID] | None = Field(None, max_length=MAX_ALLOWED)

    @field_validator("allowed_tenants")
    @classmethod
    def _allowed(cls, v: list[str] | None) -> list[str] | None:
        return _once(v)


class ServiceOut(BaseModel):
    """What a tenant sees of a service it may use is its name and ports; its owner (the admin, or the tenant that
    published it) sees everything."""

    id: str
    name: str
    kind: Literal["shared", "load-balancer"]
    ports: list[ServicePort]
    proxy_protocol: bool
    owner_tenant_id: str | None = None
    addresses: list[str] | None = None
    load_balancer_id: str | None = None
    allowed_tenants: list[str] | None = None
    endpoints: int | None = None
    created_at: datetime


class EndpointCreate(Req):
    vpc_id: ID
    subnet_id: ID
    service_id: ID
    ip: str | None = None  # an address of the subnet's; the next free one if absent (checked as a port's)
    security_group_ids: IdList | None = None  # the VPC's default group if absent, as for a port


class EndpointOut(BaseModel):
    id: str
    tenant_id: str
    vpc_id: str
    subnet_id: str
    service_id: str
    service_name: str
    port_id: str
    address: str
    dns_name: str
    security_group_ids: list[str]
    # the source the service sees this endpoint's connections come from (None: no source pool configured)
    source_address: str | None = None
    created_at: datetime
