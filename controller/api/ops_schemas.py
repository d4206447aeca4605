"""Typed answers of the operational endpoints: who am I, EIP pools, hosts' reports, health and readiness."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class WhoAmI(BaseModel):
    kind: Literal["admin", "tenant", "host", "orchestrator"]
    tenant_id: str | None = None
    name: str | None = Field(None, description="the credential's name (a tenant's, a token's)")


class EipPoolOut(BaseModel):
    id: str
    cidr: str


class HostStatusAnswer(BaseModel):
    host: str
    updated_ports: int = Field(description="ports whose UP/DOWN changed with this report")
    ignored_ports: list[str] = Field(description="reported ports not bound to this host")
    beat_every: float = Field(description="seconds: beating this often is enough (a fifth of the silence after "
                                          "which this kind of host is marked down); more often only costs the "
                                          "controller")


class HealthAnswer(BaseModel):
    changed: int = Field(description="members whose health changed")


class LineReportAnswer(BaseModel):
    accepted: int = Field(description="prefixes accepted from the customer")
    changed: bool = Field(description="whether what the line learned changed (the VPC's routes were re-stamped)")


class Healthz(BaseModel):
    status: Literal["ok"]
    revision: int | None = Field(None, description="with the admin token: the database's revision")
    database: str | None = None
    role: str | None = Field(None, description="leader or follower (replicas)")
    liveness_checks: bool | None = None
    pid: int | None = None
    settings_differ_from_other_replicas: list[str] | None = Field(
        None, description="settings this replica has that differ from the first replica's (they should not)")


class Readyz(BaseModel):
    status: Literal["ready"]
    schema_: str = Field(alias="schema", description="the database schema's migration head")
    role: str

    model_config = {"populate_by_name": True}
